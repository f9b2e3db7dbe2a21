//! `recover`: the snapshot recovery read of a snapshot topic's partitions (one, some, or every one in
//! turn), run by an operator who does not own them.
//!
//! It is the read a new owner runs on takeover (`snapfence::snapshot::recover` over a group-less
//! [`PartitionLog`]): the target is the high watermark captured once at read_uncommitted, and the read
//! drains the partition at read_committed until its position reaches that target, waiting (never stopping)
//! at the last stable offset. So an operator sees what the next owner will see, and how long it will take,
//! without joining the group or touching a producer: nothing is written, nothing is fenced.
//!
//! When the position stops moving for longer than `--stall-timeout`, the read fails the way the runtime's
//! does, with the diagnosis from a fresh read of the log end (truncation below the target, or an open
//! transaction pinning the last stable offset), and the tool turns it into a next step.
//!
//! # References
//! - KIP-98 (read_committed, LSO), KIP-664 (hanging transactions); `docs/fencing.md`, "Recovery read"

use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use snapfence::snapshot::{
    open_snapshot_value, recover, LogChunk, LogError, PartitionLog, RecoveredState, RecoveryConfig,
    RecoveryStats, SnapshotError, SnapshotLog, SnapshotValue, StallDiagnosis,
};

use crate::error::CliError;
use crate::kafka::Cluster;
use crate::progress::Progress;
use crate::show::{opt_json, opt_text, ShownBytes};
use crate::{Format, Io};

/// The arguments of `recover`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecoverArgs {
    /// The snapshot topic.
    pub topic: String,
    /// The partitions to read, repeated or comma-separated (a snapshot partition holds the state of the
    /// input partition with the same number). Without it every partition is read, in partition order.
    #[arg(
        long = "partition",
        short = 'p',
        value_delimiter = ',',
        value_name = "P"
    )]
    pub partitions: Vec<i32>,
    /// Give up when the read has not advanced for this many seconds, and say why (0: wait forever).
    /// The runtime's default is 180.
    #[arg(long, default_value_t = 180, value_name = "SECS")]
    pub stall_timeout: u64,
    /// Also list every recovered key with the size of its latest snapshot and the envelope's offset (the
    /// last input event folded into it), or that it is a grave (a deleted key).
    #[arg(long)]
    pub keys: bool,
    /// List every recovered key with its latest snapshot's state too: the application's bytes, without
    /// the envelope, shown as `dump` shows values (text when it is printable UTF-8, hex otherwise, cut at
    /// --max-bytes). Implies --keys.
    #[arg(long)]
    pub values: bool,
    /// Do not open the snapshot envelope: show each value's stored bytes as they are, version byte and
    /// offset included (for a topic written by something other than a snapfence flow).
    #[arg(long)]
    pub raw: bool,
    /// Show at most this many bytes of each key and value.
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub max_bytes: usize,
    /// While the read runs, serve this process's metrics in the Prometheus text format at
    /// http://HOST:PORT/metrics (port 0 picks a free one; the address is printed on stderr).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
}

/// Positions the read reports as it goes, for the progress line. Plain atomics: the read runs in the same
/// task as the drawing, they only need to be shared with the log wrapper the read owns.
#[derive(Debug)]
struct Seen {
    start: AtomicI64,
    target: AtomicI64,
    position: AtomicI64,
}

/// The partition log, reporting what the read asked of it into [`Seen`].
struct Watched<L> {
    inner: L,
    seen: Arc<Seen>,
}

impl<L: SnapshotLog> SnapshotLog for Watched<L> {
    async fn high_watermark(&mut self) -> Result<i64, LogError> {
        let hw = self.inner.high_watermark().await?;
        // The first read is the target; a later one is the stall diagnosis re-reading the log end.
        let _ = self
            .seen
            .target
            .compare_exchange(-1, hw, Ordering::Relaxed, Ordering::Relaxed);
        Ok(hw)
    }

    async fn last_stable_offset(&mut self) -> Result<i64, LogError> {
        self.inner.last_stable_offset().await
    }

    async fn log_start(&mut self) -> Result<i64, LogError> {
        let start = self.inner.log_start().await?;
        self.seen.start.store(start, Ordering::Relaxed);
        self.seen.position.store(start, Ordering::Relaxed);
        Ok(start)
    }

    async fn fetch(&mut self, offset: i64, max_wait: Duration) -> Result<LogChunk, LogError> {
        let chunk = self.inner.fetch(offset, max_wait).await?;
        self.seen
            .position
            .fetch_max(chunk.next_offset, Ordering::Relaxed);
        Ok(chunk)
    }
}

/// How long the progress line waits without an advance before it says the read is waiting.
const SAY_WAITING_AFTER: Duration = Duration::from_secs(1);

/// Runs `recover`: each chosen partition in turn (every partition when none is named), then, when more
/// than one was asked for, the totals. The first partition that fails ends the run with its error (a
/// stall keeps its diagnosis and exit status).
pub(crate) async fn run(
    cluster: &Cluster,
    args: &RecoverArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let topic = cluster.topic(&args.topic).await?;
    let partitions = chosen_partitions(&topic, &args.partitions)?;
    let mut totals = Totals::default();
    for &partition in &partitions {
        let (state, stats) =
            match read_partition(cluster, &topic.name, partition, args.stall_timeout, io).await {
                Ok(read) => read,
                Err(e) => {
                    if let (Format::Json, CliError::RecoveryStalled { .. }) = (format, &e) {
                        // A script gets the stall as data on stdout too; the error and next step go
                        // to stderr.
                        writeln!(io.out, "{}", stall_json(&e))?;
                    }
                    return Err(e);
                }
            };
        let counts = Counts::of(&state, args.raw);
        match format {
            Format::Text => print_text(
                io.out,
                &topic.name,
                partition,
                args,
                &state,
                &stats,
                &counts,
            )?,
            Format::Json => print_json(
                io.out,
                &topic.name,
                partition,
                args,
                &state,
                &stats,
                &counts,
            )?,
        }
        totals.add(&state, &stats, &counts);
    }
    if args.partitions.len() != 1 {
        match format {
            Format::Text => writeln!(io.out, "{}", totals.text(&topic.name, args.raw))?,
            Format::Json => writeln!(io.out, "{}", totals.json(&topic.name, args.raw))?,
        }
    }
    Ok(())
}

/// The partitions to read: those named (each checked, in the order given, repeats dropped), or every
/// partition of the topic in order.
pub(crate) fn chosen_partitions(
    topic: &snapfence::net::TopicMetadata,
    named: &[i32],
) -> Result<Vec<i32>, CliError> {
    if named.is_empty() {
        return Ok(topic.partitions.keys().copied().collect());
    }
    let mut out: Vec<i32> = Vec::with_capacity(named.len());
    for &p in named {
        crate::kafka::check_partition(topic, p)?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// The takeover's recovery read of one snapshot partition, with the progress line when stderr is a
/// terminal; a stall keeps its diagnosis. Shared by `recover` and `reset`.
pub(crate) async fn read_partition(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    stall_timeout_secs: u64,
    io: &mut Io<'_>,
) -> Result<(RecoveredState, RecoveryStats), CliError> {
    let config = RecoveryConfig {
        stall_timeout: (stall_timeout_secs > 0).then(|| Duration::from_secs(stall_timeout_secs)),
        ..RecoveryConfig::default()
    };
    let seen = Arc::new(Seen {
        start: AtomicI64::new(-1),
        target: AtomicI64::new(-1),
        position: AtomicI64::new(-1),
    });
    let mut log = Watched {
        inner: PartitionLog::new(cluster.client.clone(), topic, partition),
        seen: Arc::clone(&seen),
    };
    let read = recover(&mut log, partition, &config);
    let result = if io.progress {
        with_progress(read, &seen, topic, partition, io).await
    } else {
        read.await
    };
    result.map_err(|e| stalled_or_failed(topic, partition, e))
}

/// Awaits `read` while redrawing the progress line from what the log wrapper saw.
async fn with_progress<F>(
    read: F,
    seen: &Seen,
    topic: &str,
    partition: i32,
    io: &mut Io<'_>,
) -> F::Output
where
    F: std::future::Future,
{
    let label = format!("recovering {topic}/{partition}");
    let mut progress = Progress::new(true, label.clone());
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(read);
    let (mut last, mut since) = (-1, tokio::time::Instant::now());
    let output = loop {
        tokio::select! {
            out = &mut read => break out,
            _ = tick.tick() => {
                let (start, target, position) = (
                    seen.start.load(Ordering::Relaxed),
                    seen.target.load(Ordering::Relaxed),
                    seen.position.load(Ordering::Relaxed),
                );
                if start < 0 || target < 0 {
                    continue;
                }
                if position != last {
                    (last, since) = (position, tokio::time::Instant::now());
                    progress.set_label(label.clone());
                } else if since.elapsed() >= SAY_WAITING_AFTER {
                    // The only reasons a read_committed read below the target stops moving: an open
                    // transaction pins the LSO, or the log lost records. The stall deadline tells which.
                    progress.set_label(format!(
                        "{label}: waiting at offset {position} for {}s (open transaction or lost records)",
                        since.elapsed().as_secs()
                    ));
                }
                progress.update(io.err, (position - start).max(0) as u64, Some((target - start).max(0) as u64));
            }
        }
    };
    progress.finish(io.err);
    output
}

/// Maps the snapshot layer's error: a stall keeps its diagnosis, a transport failure is "unreachable".
fn stalled_or_failed(topic: &str, partition: i32, e: SnapshotError) -> CliError {
    match e {
        SnapshotError::RecoveryStalled {
            position,
            target,
            stalled_for,
            diagnosis,
            ..
        } => CliError::RecoveryStalled {
            topic: topic.to_owned(),
            partition,
            position,
            target,
            stalled_for,
            diagnosis,
        },
        other => CliError::Recovery {
            topic: topic.to_owned(),
            partition,
            source: other,
        },
    }
}

/// Every (key, value) the read recovered, by key.
fn keys_sorted(state: &RecoveredState) -> Vec<(&[u8], &[u8])> {
    let mut keys: Vec<_> = state.iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    keys
}

impl RecoverArgs {
    fn lists_keys(&self) -> bool {
        self.keys || self.values
    }
}

/// What a partition's recovered values are, envelopes opened (all zero with --raw, which opens none).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    live: usize,
    graves: usize,
    foreign: usize,
}

impl Counts {
    fn of(state: &RecoveredState, raw: bool) -> Counts {
        let mut c = Counts::default();
        if raw {
            return c;
        }
        for (_, value) in state.iter() {
            match open_snapshot_value(value) {
                Ok(v) if v.is_grave() => c.graves += 1,
                Ok(_) => c.live += 1,
                Err(_) => c.foreign += 1,
            }
        }
        c
    }

    /// "2 live key(s), 1 grave(s)" (and the foreign values, when there are any).
    fn text(&self) -> String {
        let mut t = format!("{} live key(s), {} grave(s)", self.live, self.graves);
        if self.foreign > 0 {
            t.push_str(&format!(
                ", {} value(s) that are not snapfence snapshots",
                self.foreign
            ));
        }
        t
    }
}

/// What the read of every chosen partition added up to.
#[derive(Debug, Default)]
struct Totals {
    partitions: usize,
    keys: usize,
    counts: Counts,
    live_bytes: u64,
    records: u64,
    bytes: u64,
    elapsed: Duration,
}

impl Totals {
    fn add(&mut self, state: &RecoveredState, stats: &RecoveryStats, counts: &Counts) {
        self.partitions += 1;
        self.keys += state.len();
        self.counts.live += counts.live;
        self.counts.graves += counts.graves;
        self.counts.foreign += counts.foreign;
        self.live_bytes += state.live_bytes() as u64;
        self.records += stats.records;
        self.bytes += stats.bytes;
        self.elapsed += stats.elapsed;
    }

    fn text(&self, topic: &str, raw: bool) -> String {
        let keys = if raw {
            format!("{} key(s) with a snapshot", self.keys)
        } else {
            self.counts.text()
        };
        format!(
            "-- {topic}: {} partition(s), {keys}, {} bytes of keys and snapshots; read {} record(s), {} \
             bytes in {}",
            self.partitions,
            self.live_bytes,
            self.records,
            self.bytes,
            millis(self.elapsed)
        )
    }

    fn json(&self, topic: &str, raw: bool) -> Value {
        let mut doc = json!({
            "type": "topic_summary",
            "topic": topic,
            "partitions": self.partitions,
            "keys": self.keys,
            "live_bytes": self.live_bytes,
            "records": self.records,
            "bytes": self.bytes,
            "elapsed_ms": self.elapsed.as_millis() as u64,
        });
        if !raw {
            doc["live"] = json!(self.counts.live);
            doc["graves"] = json!(self.counts.graves);
            doc["foreign"] = json!(self.counts.foreign);
        }
        doc
    }
}

/// One line of the key list: the key and its snapshot's size; unless --raw, the envelope's offset (or
/// that the key is a grave, or that the value is no envelope); with --values, the state (the stored
/// bytes with --raw or for a foreign value), by dump's rules.
fn key_line(key: &[u8], value: &[u8], args: &RecoverArgs) -> String {
    let mut line = format!(
        "  {}  {} bytes",
        ShownBytes::new(key, args.max_bytes).text(),
        value.len()
    );
    let shown = |bytes: &[u8]| opt_text(Some(bytes), args.max_bytes);
    if args.raw {
        if args.values {
            line.push_str(&format!("  value {}", shown(value)));
        }
        return line;
    }
    match open_snapshot_value(value) {
        Ok(SnapshotValue::Grave { offset }) => {
            line.push_str(&format!(
                "  grave: deleted by the input event at offset {offset}"
            ));
        }
        Ok(SnapshotValue::Live { last_offset, state }) => {
            line.push_str(&format!("  last offset {last_offset}"));
            if args.values {
                line.push_str(&format!("  value {}", shown(state)));
            }
        }
        Ok(SnapshotValue::GraveInputs { offsets }) => {
            line.push_str(&format!(
                "  grave: deleted; accounts for the inputs up to offsets {offsets:?}"
            ));
        }
        Ok(SnapshotValue::LiveInputs {
            last_offsets,
            state,
        }) => {
            line.push_str(&format!("  last offsets {last_offsets:?}"));
            if args.values {
                line.push_str(&format!("  value {}", shown(state)));
            }
        }
        // Not one of ours; an unknown variant of a newer library reads the same way.
        Ok(_) => line.push_str("  an envelope this tool does not know"),
        Err(e) => {
            line.push_str(&format!("  not a snapfence snapshot ({e})"));
            if args.values {
                line.push_str(&format!("  stored {}", shown(value)));
            }
        }
    }
    line
}

/// One entry of the JSON key list.
fn key_json(key: &[u8], value: &[u8], args: &RecoverArgs) -> Value {
    let mut entry = json!({
        "key": ShownBytes::new(key, args.max_bytes).json(),
        "snapshot_size": value.len(),
    });
    let shown = |bytes: &[u8]| opt_json(Some(bytes), args.max_bytes);
    if args.raw {
        if args.values {
            entry["value"] = shown(value);
        }
        return entry;
    }
    match open_snapshot_value(value) {
        Ok(SnapshotValue::Grave { offset }) => {
            entry["kind"] = json!("grave");
            entry["deleted_at"] = json!(offset);
        }
        Ok(SnapshotValue::Live { last_offset, state }) => {
            entry["kind"] = json!("live");
            entry["last_offset"] = json!(last_offset);
            if args.values {
                entry["value"] = shown(state);
            }
        }
        Ok(SnapshotValue::GraveInputs { offsets }) => {
            entry["kind"] = json!("grave");
            entry["input_offsets"] = json!(offsets.iter().collect::<Vec<_>>());
        }
        Ok(SnapshotValue::LiveInputs {
            last_offsets,
            state,
        }) => {
            entry["kind"] = json!("live");
            entry["input_offsets"] = json!(last_offsets.iter().collect::<Vec<_>>());
            if args.values {
                entry["value"] = shown(state);
            }
        }
        Ok(_) => entry["kind"] = json!("unknown"),
        Err(e) => {
            entry["kind"] = json!("foreign");
            entry["error"] = json!(e.to_string());
            if args.values {
                entry["stored"] = shown(value);
            }
        }
    }
    entry
}

fn print_text(
    out: &mut dyn Write,
    topic: &str,
    partition: i32,
    args: &RecoverArgs,
    state: &RecoveredState,
    stats: &RecoveryStats,
    counts: &Counts,
) -> Result<(), CliError> {
    let live_bytes = state.live_bytes();
    let keys = if args.raw {
        format!("{} key(s) with a snapshot", state.len())
    } else {
        counts.text()
    };
    writeln!(
        out,
        "recovered {topic}/{partition}: {keys}, {live_bytes} bytes of keys and snapshots"
    )?;
    writeln!(
        out,
        "  read {} record(s), {} bytes, from offset {} to the target {} (the high watermark captured at the \
         start; the read ended at {}) in {}",
        stats.records,
        stats.bytes,
        stats.start,
        stats.target,
        stats.end,
        millis(stats.elapsed)
    )?;
    if stats.waited_for_open_transactions {
        writeln!(
            out,
            "  waited for open transactions: the last stable offset was below the target at the start"
        )?;
    } else {
        writeln!(
            out,
            "  no open transaction held the read back (last stable offset = target at the start)"
        )?;
    }
    if args.lists_keys() {
        for (key, value) in keys_sorted(state) {
            writeln!(out, "{}", key_line(key, value, args))?;
        }
    }
    Ok(())
}

fn print_json(
    out: &mut dyn Write,
    topic: &str,
    partition: i32,
    args: &RecoverArgs,
    state: &RecoveredState,
    stats: &RecoveryStats,
    counts: &Counts,
) -> Result<(), CliError> {
    let mut doc = json!({
        "outcome": "recovered",
        "topic": topic,
        "partition": partition,
        "keys": state.len(),
        "live_bytes": state.live_bytes(),
        "records": stats.records,
        "bytes": stats.bytes,
        "start": stats.start,
        "target": stats.target,
        "end": stats.end,
        "elapsed_ms": stats.elapsed.as_millis() as u64,
        "waited_for_open_transactions": stats.waited_for_open_transactions,
    });
    if !args.raw {
        doc["live"] = json!(counts.live);
        doc["graves"] = json!(counts.graves);
        doc["foreign"] = json!(counts.foreign);
    }
    if args.lists_keys() {
        doc["key_list"] = keys_sorted(state)
            .into_iter()
            .map(|(k, v)| key_json(k, v, args))
            .collect();
    }
    writeln!(out, "{doc}")?;
    Ok(())
}

fn stall_json(e: &CliError) -> Value {
    let CliError::RecoveryStalled {
        topic,
        partition,
        position,
        target,
        stalled_for,
        diagnosis,
    } = e
    else {
        return Value::Null;
    };
    let diagnosis = match diagnosis {
        StallDiagnosis::Truncated { log_end } => json!({"kind": "truncated", "log_end": log_end}),
        StallDiagnosis::OpenTransaction {
            log_end,
            last_stable_offset,
        } => json!({
            "kind": "open_transaction",
            "log_end": log_end,
            "last_stable_offset": last_stable_offset,
        }),
        StallDiagnosis::Undetermined { reason } => {
            json!({"kind": "undetermined", "reason": reason})
        }
        // The library may learn new causes; show them by their words.
        other => json!({"kind": "other", "reason": other.to_string()}),
    };
    json!({
        "outcome": "stalled",
        "topic": topic,
        "partition": partition,
        "position": position,
        "target": target,
        "stalled_for_ms": stalled_for.as_millis() as u64,
        "diagnosis": diagnosis,
    })
}

fn millis(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> RecoverArgs {
        let argv = ["snapfence", "recover", "snaps", "-p", "0"]
            .into_iter()
            .chain(extra.iter().copied());
        match crate::Cli::parse_from(argv).command {
            crate::Command::Recover(a) => a,
            other => panic!("{other:?}"),
        }
    }

    fn envelope(offset: i64, state: &[u8]) -> Vec<u8> {
        [&[1u8][..], &offset.to_be_bytes(), state].concat()
    }

    fn grave(offset: i64) -> Vec<u8> {
        [&[2u8][..], &offset.to_be_bytes()].concat()
    }

    /// With --raw, --values shows each stored value by dump's rules: printable text as text, anything
    /// that could move the cursor as hex, cut at --max-bytes with the full size; without --values, only
    /// the size.
    #[test]
    fn raw_values_are_shown_as_dump_shows_them() {
        let plain = args(&["--keys", "--raw"]);
        assert!(plain.lists_keys());
        assert_eq!(key_line(b"a", b"3", &plain), "  \"a\"  1 bytes");
        assert!(key_json(b"a", b"3", &plain).get("value").is_none());

        let values = args(&["--values", "--raw", "--max-bytes", "4"]);
        assert!(values.lists_keys(), "--values implies --keys");
        assert_eq!(
            key_line(b"a", b"balance=10", &values),
            "  \"a\"  10 bytes  value \"bala\"\u{2026}(10 bytes)"
        );
        assert_eq!(
            key_line(b"b", b"\x1b[2J", &values),
            "  \"b\"  4 bytes  value 0x1b5b324a"
        );
        let entry = key_json(b"b", b"\x1b[2J", &values);
        assert_eq!(entry["value"], opt_json(Some(b"\x1b[2J"), 4), "{entry}");
        assert_eq!(entry["value"]["encoding"], "hex", "{entry}");
        assert_eq!(entry["snapshot_size"], 4, "{entry}");
        assert!(entry.get("kind").is_none(), "--raw opens nothing: {entry}");
    }

    /// By default the envelope is opened: a live snapshot shows its last folded offset as a field of its
    /// own and the application's bytes without the 9-byte envelope; a grave says it is one; a value that
    /// is no envelope says so per key and shows its stored bytes, and nothing panics.
    #[test]
    fn values_are_shown_with_the_envelope_opened() {
        let keys = args(&["--keys"]);
        let values = args(&["--values"]);
        let live = envelope(41, b"3");
        assert_eq!(
            key_line(b"a", &live, &keys),
            "  \"a\"  10 bytes  last offset 41"
        );
        assert_eq!(
            key_line(b"a", &live, &values),
            "  \"a\"  10 bytes  last offset 41  value \"3\""
        );
        let entry = key_json(b"a", &live, &values);
        assert_eq!(entry["kind"], "live", "{entry}");
        assert_eq!(entry["last_offset"], 41, "{entry}");
        assert_eq!(entry["value"]["data"], "3", "{entry}");
        assert_eq!(entry["snapshot_size"], 10, "{entry}");

        assert_eq!(
            key_line(b"b", &grave(17), &values),
            "  \"b\"  9 bytes  grave: deleted by the input event at offset 17"
        );
        let entry = key_json(b"b", &grave(17), &values);
        assert_eq!(
            (entry["kind"].as_str(), entry["deleted_at"].as_i64()),
            (Some("grave"), Some(17)),
            "{entry}"
        );
        assert!(entry.get("value").is_none(), "{entry}");

        let line = key_line(b"c", b"3", &values);
        assert!(
            line.starts_with("  \"c\"  1 bytes  not a snapfence snapshot (")
                && line.ends_with("stored \"3\""),
            "{line}"
        );
        let entry = key_json(b"c", b"3", &values);
        assert_eq!(entry["kind"], "foreign", "{entry}");
        assert_eq!(entry["stored"]["data"], "3", "{entry}");
        for bad in [&b""[..], &[1, 0], &[2, 0, 0, 0, 0, 0, 0, 0, 0, 9], &[7; 12]] {
            assert!(key_line(b"d", bad, &values).contains("not a snapfence snapshot"));
        }
    }

    /// `-p` repeats and takes a list; without it every partition is read.
    #[test]
    fn partitions_repeat_or_come_as_a_list() {
        let argv = ["snapfence", "recover", "snaps", "-p", "2,0", "-p", "1"];
        let crate::Command::Recover(a) = crate::Cli::parse_from(argv).command else {
            panic!("not recover")
        };
        assert_eq!(a.partitions, [2, 0, 1]);
        let crate::Command::Recover(a) =
            crate::Cli::parse_from(["snapfence", "recover", "snaps"]).command
        else {
            panic!("not recover")
        };
        assert!(a.partitions.is_empty());
    }

    fn stall(diagnosis: StallDiagnosis) -> CliError {
        stalled_or_failed(
            "snaps",
            3,
            SnapshotError::RecoveryStalled {
                partition: 3,
                position: 10,
                target: 20,
                stalled_for: Duration::from_secs(5),
                diagnosis,
            },
        )
    }

    /// Each diagnosis leads the operator to its own remedy: truncation to an operator decision, an open
    /// transaction to find-hanging on that topic, an unknown cause to a retry.
    #[test]
    fn each_stall_diagnosis_names_its_next_step() {
        let truncated = stall(StallDiagnosis::Truncated { log_end: 12 });
        assert_eq!(truncated.exit_code(), crate::error::EXIT_STALLED);
        assert!(truncated.to_string().contains("truncated"), "{truncated}");
        assert!(
            truncated
                .next_step()
                .contains("restoring the snapshot topic"),
            "{}",
            truncated.next_step()
        );
        assert_eq!(stall_json(&truncated)["diagnosis"]["kind"], "truncated");

        let open = stall(StallDiagnosis::OpenTransaction {
            log_end: 20,
            last_stable_offset: Some(10),
        });
        assert!(
            open.next_step()
                .contains("snapfence find-hanging --topic snaps"),
            "{}",
            open.next_step()
        );
        let j = stall_json(&open);
        assert_eq!(j["diagnosis"]["kind"], "open_transaction");
        assert_eq!(j["diagnosis"]["last_stable_offset"], 10);
        assert_eq!(
            (j["position"].as_i64(), j["target"].as_i64()),
            (Some(10), Some(20))
        );

        let unknown = stall(StallDiagnosis::Undetermined {
            reason: "down".into(),
        });
        assert!(
            unknown.next_step().contains("again"),
            "{}",
            unknown.next_step()
        );
        assert_eq!(stall_json(&unknown)["diagnosis"]["kind"], "undetermined");
    }
}
