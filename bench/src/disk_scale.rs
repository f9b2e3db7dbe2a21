//! `snapfence-bench disk-scale`: the on-disk state under a memory budget at scale (issue 36's targets),
//! against the in-memory state, in one run on one Kafka node.
//!
//! ```text
//! snapfence-bench disk-scale [--keys 10000000] [--budget-mib 64] [--hot 100000] [--hot-events 1000000]
//!                            [--changed 0.01] [--restarts 1] [--out FILE] [--svg FILE] [--disk-only]
//! ```
//!
//! One partition of N keys whose states are 100 bytes ([`Padded`]). Every member is a process of its
//! own (`snapfence-bench disk-member`), so its peak anonymous memory (`RssAnon`, sampled every 10 ms)
//! and peak resident set (`VmHWM`) are its alone; each times its takeover from `Flow::start` to holding
//! the partition, and its fold of what was pending from there until it reached the input's end. In
//! order:
//! 1. **fold N new keys, on disk, under the budget** (member A, an empty directory);
//! 2. **full read in memory**, then fold `--changed` of the keys once each (member B);
//! 3. **restart on its directory** (A's directory, under the budget): reads what B wrote, then folds
//!    one event per key of `--hot` keys spread over the key space (the warm-up: each is loaded from
//!    disk), then `--hot-events` events over them (timed: the hot working set's throughput);
//! 4. **full read in memory** again, then the same warm-up and hot events;
//! 5. **full read into an empty directory**, under the budget.
//!
//! `--restarts R` repeats steps 2 and 3 R times in all (each repeat changes another `--changed` of the
//! keys), for the spread of the restart's ratio to the full read: each pair is a sample.
//!
//! `--disk-only` skips the members in memory (for profiling the others' memory; no ratios then, and
//! the restart also folds what member 2 would have). `--svg` draws each member's RssAnon over its life (the highest sample of every 250 ms), its takeover
//! marked, against the 128 MiB target and the budget. Ratios come from this one run: the restart against the full read in memory, the full read into a
//! directory against the one in memory (per key), and the hot fold's throughput on disk against in
//! memory.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{dedicated, unique, ClusterSpec};
use snapfence::consumer::{GroupConfig, GroupConsumerConfig, OffsetReset};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::Record;
use snapfence::snapshot::{
    BoxError, Change, DiskState, Flow, FlowConfig, Fold, Outputs, SnapshotConfig, StateConfig,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of a [`Padded`] state.
const STATE_BYTES: usize = 100;

/// A fold whose state is 100 bytes: the event count, then the last event's value, padded.
pub struct Padded;

impl Fold for Padded {
    type State = [u8; STATE_BYTES];
    fn fold(
        &self,
        _key: &Bytes,
        state: &mut Option<Self::State>,
        event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        let s = state.get_or_insert([0; STATE_BYTES]);
        let count = u64::from_be_bytes(s[..8].try_into().unwrap_or_default()) + 1;
        s[..8].copy_from_slice(&count.to_be_bytes());
        let value = event.value.as_deref().unwrap_or_default();
        let n = value.len().min(STATE_BYTES - 8);
        s[8..8 + n].copy_from_slice(&value[..n]);
        Change::Update
    }
    fn encode(&self, s: &Self::State) -> Bytes {
        Bytes::copy_from_slice(s)
    }
    fn decode(&self, b: &[u8]) -> Result<Self::State, BoxError> {
        Ok(b.try_into()?)
    }
}

struct Options {
    keys: usize,
    budget_mib: u64,
    hot: usize,
    hot_events: usize,
    changed: f64,
    restarts: usize,
    out: Option<PathBuf>,
    svg: Option<PathBuf>,
    disk_only: bool,
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        keys: 10_000_000,
        budget_mib: 64,
        hot: 100_000,
        hot_events: 1_000_000,
        changed: 0.01,
        restarts: 1,
        out: None,
        svg: None,
        disk_only: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--keys" => o.keys = number(value()?)?,
            "--budget-mib" => o.budget_mib = number(value()?)? as u64,
            "--hot" => o.hot = number(value()?)?,
            "--hot-events" => o.hot_events = number(value()?)?,
            "--changed" => o.changed = value()?.parse().map_err(|e| format!("--changed: {e}"))?,
            "--restarts" => o.restarts = number(value()?)?.max(1),
            "--out" => o.out = Some(value()?.into()),
            "--svg" => o.svg = Some(value()?.into()),
            "--disk-only" => o.disk_only = true,
            other => {
                return Err(format!(
                    "unknown option {other}\nusage: snapfence-bench disk-scale [--keys N] \
                     [--budget-mib M] [--hot K] [--hot-events E] [--changed F] [--restarts R] [--out FILE] [--svg FILE] [--disk-only]"
                ))
            }
        }
    }
    if !(0.0..=1.0).contains(&o.changed) || o.keys == 0 || o.hot == 0 || o.hot > o.keys {
        return Err(
            "--changed is a fraction; --keys and --hot at least one, --hot at most --keys".into(),
        );
    }
    Ok(o)
}

pub fn main(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    crate::block_on_and_write(
        run(&options),
        options.out.as_deref(),
        "disk-scale benchmark",
    )
}

/// What one member process reported.
#[derive(Debug, Clone, Default)]
struct Member {
    takeover_ms: f64,
    read: u64,
    warm_ms: f64,
    fold_ms: f64,
    folded: u64,
    rss_anon_peak_kib: u64,
    hwm_kib: u64,
    loaded: u64,
    evicted: u64,
    /// RssAnon over the member's life: (seconds since it started, MiB), one point per 250 ms.
    timeline: Vec<(f64, f64)>,
}

impl Member {
    fn parse(stdout: &str) -> Option<Member> {
        let line = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("MEMBER "))?;
        let field = |name: &str| -> Option<f64> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(Member {
            takeover_ms: field("takeover_ms")?,
            read: field("read")? as u64,
            warm_ms: field("warm_ms")?,
            fold_ms: field("fold_ms")?,
            folded: field("folded")? as u64,
            rss_anon_peak_kib: field("rss_anon_peak_kib")? as u64,
            hwm_kib: field("hwm_kib")? as u64,
            loaded: field("loaded")? as u64,
            evicted: field("evicted")? as u64,
            timeline: stdout
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("TIMELINE "))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| {
                    let (ms, kib) = p.split_once(':')?;
                    Some((
                        ms.parse::<f64>().ok()? / 1000.0,
                        kib.parse::<f64>().ok()? / 1024.0,
                    ))
                })
                .collect(),
        })
    }

    fn events_per_s(&self) -> f64 {
        self.folded as f64 / (self.fold_ms / 1000.0).max(1e-9)
    }
}

struct World {
    bootstrap: String,
    client: Client,
    input: String,
    snapshots: String,
    group: String,
    prefix: String,
    /// Events written to the input so far.
    end: i64,
}

impl World {
    async fn emit(&mut self, keys: impl Iterator<Item = usize>, tag: &str) -> Result<(), Error> {
        let producer = Producer::new(self.client.clone(), ProducerConfig::default()).await?;
        let mut pending = Vec::new();
        for k in keys {
            let r =
                ProducerRecord::new(self.input.as_str(), Some(Bytes::from(format!("{tag}-{k}"))))
                    .key(Bytes::from(format!("key-{k:09}")))
                    .partition(0);
            pending.push(producer.send(r).await?);
            self.end += 1;
            if pending.len() >= 20_000 {
                for d in pending.drain(..) {
                    d.await?;
                }
            }
        }
        for d in pending {
            d.await?;
        }
        producer.close().await;
        Ok(())
    }

    /// Runs a member process on `state` (`memory`, or a directory) with `budget` bytes (0: none) until
    /// it folded the input's end.
    fn member(&self, what: &str, state: &str, budget: u64, warm: i64) -> Result<Member, Error> {
        eprintln!("== {what}");
        // SNAPFENCE_BENCH_MEMBER_WRAP runs each member under a tool (say `heaptrack -o /tmp/ht`),
        // the way its memory was profiled.
        let wrap = std::env::var("SNAPFENCE_BENCH_MEMBER_WRAP").unwrap_or_default();
        let mut wrap = wrap.split_whitespace();
        let exe = std::env::current_exe()?;
        let mut command = match wrap.next() {
            Some(tool) => {
                let mut c = Command::new(tool);
                c.args(wrap).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let output = command
            .args([
                "disk-member",
                &self.bootstrap,
                &self.input,
                &self.snapshots,
                &self.group,
                &self.prefix,
                state,
                &budget.to_string(),
                &warm.to_string(),
                &self.end.to_string(),
            ])
            // The child's log lines go where the runner's go.
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let member = Member::parse(&stdout).ok_or_else(|| {
            format!(
                "the disk-member child ({what}) printed no result ({}); its log is above",
                output.status
            )
        })?;
        let shown = Member {
            timeline: Vec::new(),
            ..member.clone()
        };
        eprintln!("   {shown:?} ({} RssAnon samples)", member.timeline.len());
        Ok(member)
    }
}

async fn run(options: &Options) -> Result<String, Error> {
    eprintln!("== starting one node");
    let kafka = dedicated(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
    let scratch = std::env::temp_dir().join(unique("bench-disk-scale"));
    let mut w = World {
        bootstrap: kafka.bootstrap(),
        client: client.clone(),
        input: unique("ds-input"),
        snapshots: unique("ds-snap"),
        group: unique("ds-group"),
        prefix: unique("ds-txn"),
        end: 0,
    };
    snapfence::admin::create_topic(&client, &w.input, 1, -1, &[]).await?;
    snapfence::admin::create_topic(
        &client,
        &w.snapshots,
        1,
        -1,
        &[("cleanup.policy", "compact")],
    )
    .await?;
    let n = options.keys;
    let budget = options.budget_mib << 20;
    let dir_a = scratch.join("a");
    let dir_e = scratch.join("empty");
    let a_dir = dir_a.to_string_lossy().into_owned();

    eprintln!("== writing {n} events, one per key");
    w.emit(0..n, "a").await?;
    let seed = w.member("fold N new keys on disk", &a_dir, budget, 0)?;

    let changed = ((n as f64) * options.changed).round() as usize;
    w.emit(0..changed, "b").await?;
    let in_memory = |w: &World, what: &str, warm: i64| match options.disk_only {
        true => Ok(Member::default()),
        false => w.member(what, "memory", 0, warm),
    };
    let memory_read = in_memory(&w, "full read in memory, fold the changed keys", 0)?;

    // The hot set: keys spread over the key space, each event a key drawn from it in turn.
    let hot: Vec<usize> = (0..options.hot).map(|i| i * (n / options.hot)).collect();
    // Each hot fold: one event per hot key first (the warm-up: each key's first load), then
    // `--hot-events` events over the set, timed.
    let warm = w.end + hot.len() as i64;
    w.emit(hot.iter().copied(), "c").await?;
    w.emit((0..options.hot_events).map(|i| hot[i % hot.len()]), "d")
        .await?;
    let restart = w.member(
        "restart on its directory, fold the hot set",
        &a_dir,
        budget,
        warm,
    )?;
    // Each sample: (restart's takeover, its records read, the full read's takeover before it).
    let mut samples = vec![(restart.takeover_ms, restart.read, memory_read.takeover_ms)];
    for round in 1..options.restarts {
        w.emit(0..changed, &format!("b{round}")).await?;
        let read = in_memory(&w, &format!("full read in memory ({})", round + 1), 0)?;
        let warm = w.end + hot.len() as i64;
        w.emit(hot.iter().copied(), &format!("c{round}")).await?;
        w.emit(
            (0..options.hot_events).map(|i| hot[i % hot.len()]),
            &format!("d{round}"),
        )
        .await?;
        let again = w.member(
            &format!("restart on its directory ({})", round + 1),
            &a_dir,
            budget,
            warm,
        )?;
        samples.push((again.takeover_ms, again.read, read.takeover_ms));
    }
    let warm = w.end + hot.len() as i64;
    w.emit(hot.iter().copied(), "e").await?;
    w.emit((0..options.hot_events).map(|i| hot[i % hot.len()]), "f")
        .await?;
    let memory_hot = in_memory(&w, "full read in memory, fold the hot set", warm)?;
    let empty = w.member(
        "full read into an empty directory",
        &dir_e.to_string_lossy(),
        budget,
        0,
    )?;

    let mut s = format!(
        "Kafka {}, one node. `snapfence-bench disk-scale --keys {n} --budget-mib {} --hot {} \
         --hot-events {} --changed {}`: one partition of {n} keys with 100-byte states; each member a \
         process of its own. Takeover: from `Flow::start` to holding the partition. Warm-up: from \
         then until one event per hot key is folded (the hot members). Fold: from then until every \
         pending event is folded. RssAnon: peak of samples every 10 ms.\n\n\
         | member | state | takeover | records read | warm-up | fold | events/s | peak RssAnon | VmHWM | keys loaded / dropped |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        kafka.version(),
        options.budget_mib,
        options.hot,
        options.hot_events,
        options.changed
    );
    let budget_label = format!("disk, budget {} MiB", options.budget_mib);
    let rows = [
        ("fold N new keys", budget_label.as_str(), &seed),
        ("full read, fold 1% changed", "memory", &memory_read),
        (
            "restart on its directory, hot fold",
            budget_label.as_str(),
            &restart,
        ),
        ("full read, hot fold", "memory", &memory_hot),
        (
            "full read into an empty directory",
            budget_label.as_str(),
            &empty,
        ),
    ];
    if let Some(path) = &options.svg {
        std::fs::write(path, svg(&rows, options.budget_mib as f64))?;
    }
    for (what, state, m) in rows {
        if options.disk_only && state == "memory" {
            continue;
        }
        let _ = writeln!(
            s,
            "| {what} | {state} | {:.0} ms | {} | {:.0} ms | {:.0} ms ({} events) | {:.0} | {} MiB | {} MiB | {} / {} |",
            m.takeover_ms,
            m.read,
            m.warm_ms,
            m.fold_ms,
            m.folded,
            m.events_per_s(),
            m.rss_anon_peak_kib / 1024,
            m.hwm_kib / 1024,
            m.loaded,
            m.evicted
        );
    }
    if options.disk_only {
        let _ = writeln!(
            s,
            "\nWith --disk-only: no member in memory, so no ratios. Peak RssAnon of the restart on disk: \
             {} MiB, of the full read into a directory: {} MiB (target ≤ 128 MiB).",
            restart.rss_anon_peak_kib / 1024,
            empty.rss_anon_peak_kib / 1024,
        );
    } else {
        let _ = writeln!(
        s,
        "\nRestart / full read in memory: {:.3}x (target ≤ 0.05x). Full read into a directory / in \
         memory, per record read: {:.2}x (target ≤ 1x). Hot fold on disk / in memory: {} (target ≥ 0.8x). Peak RssAnon \
         of the restart on disk: {} MiB, of the full read into a directory: {} MiB (target ≤ 128 MiB).",
        restart.takeover_ms / memory_read.takeover_ms,
        (empty.takeover_ms / empty.read.max(1) as f64)
            / (memory_read.takeover_ms / memory_read.read.max(1) as f64),
        if restart.folded > 0 && memory_hot.folded > 0 {
            format!("{:.2}x", restart.events_per_s() / memory_hot.events_per_s())
        } else {
            // Too few events: the poll that took the partition over folded them all.
            "not measured (every event was folded during the takeover: raise --hot-events)".into()
        },
        restart.rss_anon_peak_kib / 1024,
        empty.rss_anon_peak_kib / 1024,
    );
    }
    if samples.len() > 1 {
        let _ = writeln!(
            s,
            "\n{} restarts, each after another {} of the keys changed (restart takeover / records \
             read / full read in memory before it / ratio):",
            samples.len(),
            options.changed
        );
        let mut ratios = Vec::new();
        for (restart, read, full) in &samples {
            let ratio = restart / full.max(1e-9);
            ratios.push(ratio);
            let _ = writeln!(s, "- {restart:.0} ms / {read} / {full:.0} ms / {ratio:.3}x");
        }
        ratios.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "Ratio min {:.3}x, median {:.3}x, max {:.3}x (target ≤ 0.05x).",
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1]
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    for t in [&w.input, &w.snapshots] {
        let _ = snapfence::admin::delete_topic(&client, t).await;
    }
    Ok(s)
}

/// What the C library's allocator holds, where it says (glibc): bytes in use, free bytes it keeps in
/// its arenas, and bytes in blocks mapped on their own.
fn malloc_figures() -> String {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        format!(
            "malloc in use {} MiB, free in arenas {} MiB, mapped blocks {} MiB",
            m.uordblks >> 20,
            m.fordblks >> 20,
            m.hblkhd >> 20
        )
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    String::from("malloc figures: not on glibc")
}

/// The colours of the plot's lines, one per member.
const COLOURS: [&str; 5] = ["#1f6fb4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"];

/// RssAnon over each member's life on a log scale, its takeover marked, with the 128 MiB target and
/// the budget drawn across.
fn svg(rows: &[(&str, &str, &Member)], budget_mib: f64) -> String {
    let (left, top, w, h) = (70.0, 40.0, 600.0, 300.0);
    let points = || rows.iter().flat_map(|(_, _, m)| m.timeline.iter());
    let t_max = points().map(|p| p.0).fold(1.0, f64::max);
    let (y_lo, y_hi) = (
        8f64.log2(),
        points().map(|p| p.1).fold(256.0, f64::max).log2().ceil(),
    );
    let x = |t: f64| left + t / t_max * w;
    let y = |mib: f64| top + h - (mib.max(8.0).log2() - y_lo) / (y_hi - y_lo) * h;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="400" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="1000" height="400" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" text-anchor="middle" font-weight="bold">RssAnon of each member over its life (log scale; dot: partition taken over)</text>"#,
        left + w / 2.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>"##
    );
    // Powers of two on the y axis, seconds on the x axis.
    let mut mib = 2f64.powf(y_lo);
    while mib.log2() <= y_hi {
        let (right, at, label_x) = (left + w, y(mib), left - 6.0);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{right}" y1="{at:.1}" y2="{at:.1}" stroke="#eee"/><text x="{label_x}" y="{:.1}" text-anchor="end">{mib} MiB</text>"##,
            at + 4.0
        );
        mib *= 4.0;
    }
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0]
        .into_iter()
        .find(|s| t_max / s <= 10.0)
        .unwrap_or(1200.0);
    let mut t = 0.0;
    while t <= t_max {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t} s</text>"#,
            x(t),
            top + h + 16.0
        );
        t += step;
    }
    let budget_label = format!("budget {budget_mib} MiB");
    for (label, mib, dash) in [
        ("target 128 MiB", 128.0, "6,3"),
        (budget_label.as_str(), budget_mib, "2,3"),
    ] {
        let (right, at, label_x) = (left + w, y(mib), left + w - 90.0);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{right}" y1="{at:.1}" y2="{at:.1}" stroke="#444" stroke-dasharray="{dash}"/><text x="{label_x}" y="{:.1}" fill="#444">{label}</text>"##,
            at - 4.0
        );
    }
    // Members not run (`--disk-only`) have no samples.
    let drawn = rows.iter().filter(|(_, _, m)| !m.timeline.is_empty());
    for (i, (what, state, m)) in drawn.enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = m
            .timeline
            .iter()
            .map(|&(t, mib)| format!("{:.1},{:.1}", x(t), y(mib)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            path.join(" ")
        );
        // The takeover: the sample nearest it.
        let taken = m.takeover_ms / 1000.0;
        if let Some(&(t, mib)) = m
            .timeline
            .iter()
            .min_by(|a, b| (a.0 - taken).abs().total_cmp(&(b.0 - taken).abs()))
        {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{colour}"/>"#,
                x(t),
                y(mib)
            );
        }
        let ly = top + 14.0 + i as f64 * 34.0;
        let _ = writeln!(
            s,
            r##"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{2}" y="{3}">{what}</text><text x="{2}" y="{4}" fill="#555">{state}: peak {5} MiB</text>""##,
            left + w + 20.0,
            left + w + 40.0,
            left + w + 46.0,
            ly + 4.0,
            ly + 18.0,
            m.rss_anon_peak_kib / 1024
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// `snapfence-bench disk-member BOOTSTRAP INPUT SNAPSHOTS GROUP PREFIX STATE BUDGET END`: one member,
/// `STATE` `memory` or a directory, `BUDGET` bytes (0: none). Takes the partition over, folds to `END`
/// (persisting and committing every half second), persists, commits, closes, and prints `MEMBER ...`.
pub fn member_main(args: &[String]) -> i32 {
    let [bootstrap, input, snapshots, group, prefix, state, budget, warm, end] = args else {
        eprintln!(
            "usage: snapfence-bench disk-member BOOTSTRAP INPUT SNAPSHOTS GROUP PREFIX STATE BUDGET WARM END"
        );
        return 2;
    };
    let (Ok(budget), Ok(warm), Ok(end)) = (
        budget.parse::<u64>(),
        warm.parse::<i64>(),
        end.parse::<i64>(),
    ) else {
        eprintln!("BUDGET, WARM and END are numbers");
        return 2;
    };
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // The highest sample of each 250 ms, for the plot.
    let timeline: Arc<Mutex<Vec<(u128, u64)>>> = Arc::default();
    let sampler = {
        let (peak, stop, timeline) = (Arc::clone(&peak), Arc::clone(&stop), Arc::clone(&timeline));
        std::thread::spawn(move || {
            let began = Instant::now();
            let mut window = (Instant::now(), 0);
            let mut at_peak = String::new();
            let verbose = std::env::var_os("SNAPFENCE_BENCH_VERBOSE").is_some();
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = crate::workload::status_kib("RssAnon:") {
                    if kib > peak.fetch_max(kib, Ordering::Relaxed) && verbose {
                        at_peak = malloc_figures();
                    }
                    window.1 = window.1.max(kib);
                }
                if window.0.elapsed() >= Duration::from_millis(250) {
                    if let Ok(mut t) = timeline.lock() {
                        t.push((began.elapsed().as_millis(), window.1));
                    }
                    window = (Instant::now(), 0);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if verbose {
                eprintln!("   at the peak RssAnon: {at_peak}");
            }
        })
    };
    let work = async move {
        let mut g = GroupConfig::new(group);
        g.session_timeout = Duration::from_secs(30);
        g.max_poll_interval = Duration::from_secs(600);
        let mut consumer = GroupConsumerConfig::new(g);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut s = SnapshotConfig::new(snapshots, prefix);
        s.recovery_stall_timeout = Some(Duration::from_secs(600));
        let mut c = FlowConfig::new(consumer, input, s);
        c.persist_every = Duration::from_secs(3600);
        c.commit_offsets_interval = Duration::from_secs(3600);
        if state != "memory" {
            let mut disk = DiskState::new(state, 1);
            disk.memory_budget = (budget > 0).then_some(budget);
            c.state = StateConfig::Disk(disk);
        }
        let client = Client::connect(ClientConfig::new(bootstrap)).await?;
        let began = Instant::now();
        let mut flow = Flow::start(client, c, Padded).await?;
        while flow.partitions().is_empty() {
            if began.elapsed() > Duration::from_secs(1800) {
                return Err::<String, Error>("the takeover never completed".into());
            }
            flow.poll_once(Duration::from_millis(20)).await?;
        }
        let takeover = began.elapsed();
        let stats_start = flow.position(0).unwrap_or(0);
        // Events below WARM warm the member up (each hot key's first load); the fold is timed from
        // there, or from the takeover when it starts past WARM.
        let mut from = flow.position(0).unwrap_or(0);
        let mut folding = Instant::now();
        let mut warm_ms = 0.0;
        let mut warming = from < warm;
        let mut persisted = Instant::now();
        while flow.position(0).is_none_or(|p| p < end) {
            if folding.elapsed() > Duration::from_secs(3600) {
                return Err("the member never folded the input".into());
            }
            flow.poll_once(Duration::from_millis(50)).await?;
            if warming && flow.position(0).is_some_and(|p| p >= warm) {
                warming = false;
                warm_ms = folding.elapsed().as_secs_f64() * 1000.0;
                from = flow.position(0).unwrap_or(warm);
                folding = Instant::now();
            }
            if persisted.elapsed() > Duration::from_millis(500) {
                flow.persist().await?;
                flow.commit().await?;
                persisted = Instant::now();
                if std::env::var_os("SNAPFENCE_BENCH_VERBOSE").is_some() {
                    let stats = flow.disk_stats();
                    eprintln!(
                        "   at {:?}: RssAnon {:?} KiB, {} keys in memory, {} loaded, {} dropped",
                        flow.position(0),
                        crate::workload::status_kib("RssAnon:"),
                        stats.keys_in_memory,
                        stats.keys_loaded,
                        stats.keys_evicted
                    );
                }
            }
        }
        let fold = folding.elapsed();
        flow.persist().await?;
        flow.commit().await?;
        let stats = flow.disk_stats();
        flow.close().await?;
        let read = if state == "memory" {
            u64::try_from(stats_start).unwrap_or(0)
        } else {
            stats.records_read
        };
        Ok(format!(
            "MEMBER takeover_ms={:.1} read={read} warm_ms={warm_ms:.1} fold_ms={:.1} folded={} \
             rss_anon_peak_kib={{peak}} hwm_kib={{hwm}} loaded={} evicted={}\n",
            takeover.as_secs_f64() * 1000.0,
            fold.as_secs_f64() * 1000.0,
            end - from,
            stats.keys_loaded,
            stats.keys_evicted,
        ))
    };
    let work = async move {
        let result = work.await;
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        let hwm = crate::workload::peak_rss_kib().unwrap_or(0);
        let timeline: Vec<String> = timeline
            .lock()
            .map(|t| t.iter().map(|(ms, kib)| format!("{ms}:{kib}")).collect())
            .unwrap_or_default();
        result.map(|line| {
            format!(
                "TIMELINE {}\n{}",
                timeline.join(" "),
                line.replace("{peak}", &peak.load(Ordering::Relaxed).to_string())
                    .replace("{hwm}", &hwm.to_string())
            )
        })
    };
    crate::block_on_and_write(work, None, "disk-member")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_line_parses_and_options_refuse_nonsense() {
        let m = Member::parse(
            "noise\nMEMBER takeover_ms=12.5 read=7 warm_ms=3 fold_ms=1000 folded=500 \
             rss_anon_peak_kib=2048 hwm_kib=4096 loaded=3 evicted=2\n",
        )
        .unwrap();
        assert_eq!((m.read, m.folded, m.loaded, m.evicted), (7, 500, 3, 2));
        assert_eq!(m.events_per_s(), 500.0);
        assert!(Member::parse("MEMBER takeover_ms=1").is_none());
        assert!(options(&["--hot".into(), "0".into()]).is_err());
        assert!(options(&["--keys".into(), "10".into(), "--hot".into(), "11".into()]).is_err());
        assert_eq!(options(&[]).unwrap().keys, 10_000_000);
    }

    #[test]
    fn the_timeline_parses_and_every_member_is_drawn() {
        let m = Member::parse(
            "TIMELINE 250:1024 500:204800\nMEMBER takeover_ms=300 read=7 warm_ms=3 fold_ms=1000 \
             folded=500 rss_anon_peak_kib=204800 hwm_kib=4096 loaded=3 evicted=2\n",
        )
        .unwrap();
        assert_eq!(m.timeline, vec![(0.25, 1.0), (0.5, 200.0)]);
        let not_run = Member::default();
        let drawn = svg(
            &[
                ("a", "memory", &m),
                ("b", "disk", &m),
                ("c", "memory", &not_run),
            ],
            64.0,
        );
        assert_eq!(drawn.matches("<polyline").count(), 2);
        assert_eq!(drawn.matches("<circle").count(), 2);
        assert!(drawn.contains("peak 200 MiB") && drawn.contains("target 128 MiB"));
        assert!(drawn.contains("budget 64 MiB") && !drawn.contains(">c<"));
    }
}
