//! `snapfence-bench job`: the whole job, a per-key count over an input topic with exactly-once state,
//! snapfence's [`Flow`](snapfence::snapshot::Flow) against Kafka Streams 4.4 (issue 33, "Benchmarks").
//!
//! ```text
//! snapfence-bench job [--events 1000000] [--keys 20000] [--partitions 4] [--runs 3] [--output] [--takeover]
//!                     [--no-job] [--clients snapfence,streams] [--xmx 1g] [--session-ms 10000]
//!                     [--heartbeat-ms 1000] [--interval-ms 1000]
//!                     [--rate 20000] [--output-seconds 15] [--timeout SECS] [--out FILE]
//! ```
//!
//! One broker (the protocol-tests fixture, as `scale` starts it). Each client runs as a child process, so
//! the CPU time and peak resident set the runner reads from `/proc/<pid>` are the job's alone:
//! snapfence as `snapfence-bench job-child` (job_child.rs: a count `Flow`, fenced mode, persist and commit
//! every second), Kafka Streams as `bench/java/StreamsJob.java` on a JVM with a stated heap
//! (exactly_once_v2, `commit.interval.ms` 1000, `groupByKey().count()` on the default RocksDB store; jars
//! fetched by streams.rs). Both create their state topic themselves (snapfence's compacted snapshot
//! topic, Streams' changelog) inside the measured time.
//!
//! Rows:
//! - **job**: the input (`--events` over `--keys` keys, `--partitions` partitions) is produced once and
//!   read by every run with a fresh group (and state topic). Measured per run: wall time from spawning the
//!   child to the group's committed offsets reaching the end of every input partition (the runner polls
//!   OffsetFetch every 50 ms; process and JVM start-up are counted), the child's CPU time (utime + stime
//!   of every thread, `/proc/<pid>/stat`) and peak resident set (`VmHWM`), both read just before the
//!   child is killed. `--runs` runs per client, the clients alternating which goes first; the median.
//! - **output** (`--output`): one output record per input event into a second topic, value = the input's
//!   timestamp. The child starts on an empty input and, once it holds every partition, the runner
//!   produces `--rate` events a second for `--output-seconds` with each record's CreateTime set at its
//!   send, while a read_committed reader in the runner reads the output: latency = the time the reader
//!   sees an output record minus its input's CreateTime. A fixed rate (well below either client's
//!   throughput) keeps the figure a latency, not a queue length. snapfence's outputs ride in its snapshot
//!   transactions ([`Outputs`](snapfence::snapshot::Outputs)).
//! - **takeover** (`--takeover`): two members of one group on an empty input, both holding partitions
//!   (they print `HOLD` lines), then the input is produced as fast as the runner can and one member is
//!   SIGKILLed; measured: from the kill until the group's committed offsets reach the end. Both clients
//!   get the same classic-protocol session timeout (`--session-ms`, default 10 s), which the survivor
//!   waits out before the dead member's partitions move, and the same heartbeat interval
//!   (`--heartbeat-ms`, default 1 s rather than both clients' own 3 s): the session expires 10 s after the
//!   dead member's last heartbeat, up to one interval before the kill, and the survivor hears of the
//!   rebalance at its next heartbeat, so a short interval keeps that chance small.
//!
//! # References
//! - Issue 33 (targets: CPU per event <= 0.05x Streams, peak RSS <= 0.1x); KIP-447, KIP-129 (Streams
//!   exactly-once), KIP-732 (exactly_once_v2)

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{dedicated, unique, ClusterSpec};
use snapfence::consumer::{
    committed_offsets, list_offsets, OffsetSpec, PartitionReader, ReaderConfig, StartAt,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::IsolationLevel;

use crate::streams::{self, StreamsJar};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How often the runner asks for the group's committed offsets.
const PROGRESS_POLL: Duration = Duration::from_millis(50);
/// How long members may take to hold their partitions before a row fails.
const HOLD_DEADLINE: Duration = Duration::from_secs(180);
/// Lines of a child's output kept for an error message.
const LOG_TAIL: usize = 30;

/// The clients compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Snapfence,
    Streams,
}

impl Kind {
    /// The client's name in the report.
    fn name(self) -> &'static str {
        match self {
            Kind::Snapfence => "snapfence",
            Kind::Streams => "Kafka Streams",
        }
    }
}

/// The command line.
#[derive(Debug, Clone)]
struct Options {
    events: usize,
    keys: usize,
    partitions: i32,
    runs: usize,
    job: bool,
    output: bool,
    takeover: bool,
    clients: Vec<Kind>,
    /// Streams' JVM heap (`-Xmx`).
    xmx: String,
    session_ms: u64,
    heartbeat_ms: u64,
    /// Both clients' commit interval (snapfence's persist and commit, Streams' `commit.interval.ms`).
    interval_ms: u64,
    rate: usize,
    output_seconds: usize,
    timeout: Duration,
    out: Option<PathBuf>,
}

/// Parses the options of `snapfence-bench job`.
fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        events: 1_000_000,
        keys: 20_000,
        partitions: 4,
        runs: 3,
        job: true,
        output: false,
        takeover: false,
        clients: vec![Kind::Snapfence, Kind::Streams],
        xmx: "1g".into(),
        session_ms: 10_000,
        heartbeat_ms: 1_000,
        interval_ms: 1_000,
        rate: 20_000,
        output_seconds: 15,
        timeout: Duration::from_secs(600),
        out: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        /// `v` as a positive number, or an error naming `flag`.
        fn num<T: std::str::FromStr + PartialOrd + Default>(
            flag: &str,
            v: String,
        ) -> Result<T, String> {
            v.parse::<T>()
                .ok()
                .filter(|n| *n > T::default())
                .ok_or(format!("{flag} wants a positive number, not {v}"))
        }
        match flag.as_str() {
            "--events" => o.events = num(flag, value()?)?,
            "--keys" => o.keys = num(flag, value()?)?,
            "--partitions" => o.partitions = num(flag, value()?)?,
            "--runs" => o.runs = num(flag, value()?)?,
            "--session-ms" => o.session_ms = num(flag, value()?)?,
            "--heartbeat-ms" => o.heartbeat_ms = num(flag, value()?)?,
            "--interval-ms" => o.interval_ms = num::<u64>(flag, value()?)?.max(1),
            "--rate" => o.rate = num(flag, value()?)?,
            "--output-seconds" => o.output_seconds = num(flag, value()?)?,
            "--timeout" => o.timeout = Duration::from_secs(num(flag, value()?)?),
            "--xmx" => o.xmx = value()?,
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--output" => o.output = true,
            "--takeover" => o.takeover = true,
            "--no-job" => o.job = false,
            "--clients" => {
                o.clients = value()?
                    .split(',')
                    .map(|c| match c.trim() {
                        "snapfence" => Ok(Kind::Snapfence),
                        "streams" => Ok(Kind::Streams),
                        other => Err(format!("unknown client {other}: snapfence or streams")),
                    })
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// Runs the rows; exit status 0 when every row ran.
pub fn main(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    crate::block_on_and_write(run(&options), options.out.as_deref(), "job benchmark")
}

/// Everything a member process needs to be started.
struct Setup {
    bootstrap: String,
    exe: PathBuf,
    streams: Option<StreamsJar>,
    xmx: String,
    session_ms: u64,
    heartbeat_ms: u64,
    interval_ms: u64,
    timeout: Duration,
}

impl Setup {
    /// Starts one member of `group` of client `kind` over `input` (and `output` for the output
    /// variant).
    fn spawn(
        &self,
        kind: Kind,
        input: &str,
        group: &str,
        output: Option<&str>,
    ) -> Result<Member, Error> {
        let output = output.unwrap_or("-");
        let session = self.session_ms.to_string();
        let heartbeat = self.heartbeat_ms.to_string();
        let interval = self.interval_ms.to_string();
        match kind {
            Kind::Snapfence => {
                let mut cmd = Command::new(&self.exe);
                cmd.args(["job-child", &self.bootstrap, input, group])
                    .arg(format!("{group}-snapshots"))
                    .args([group, &session, &heartbeat, &interval, output]);
                Member::spawn(cmd, None)
            }
            Kind::Streams => {
                let jar = self
                    .streams
                    .as_ref()
                    .ok_or("Kafka Streams is not prepared")?;
                let state = std::env::temp_dir().join(unique("snapfence-bench-streams-state"));
                std::fs::create_dir_all(&state)?;
                let mut cmd = Command::new(streams::tool("java"));
                cmd.arg(format!("-Xmx{}", self.xmx))
                    .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
                    .args([
                        "-cp",
                        &jar.classpath,
                        "StreamsJob",
                        &self.bootstrap,
                        input,
                        group,
                    ])
                    .arg(&state)
                    .args([&session, &heartbeat, &interval, output]);
                Member::spawn(cmd, Some(state))
            }
        }
    }
}

/// A running member process. Dropping it kills it (SIGKILL), reaps it and removes its state folder, so
/// no error path leaves a child running.
struct Member {
    child: Child,
    /// When it was spawned.
    started: Instant,
    /// The partitions of its last `HOLD` line.
    held: Arc<Mutex<Option<Vec<i32>>>>,
    /// Its last lines of output.
    log: Arc<Mutex<VecDeque<String>>>,
    state_dir: Option<PathBuf>,
}

/// CPU time and peak resident set of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Usage {
    cpu_s: f64,
    peak_rss_kib: u64,
}

impl Member {
    /// Spawns `cmd` with its output read by two threads.
    fn spawn(mut cmd: Command, state_dir: Option<PathBuf>) -> Result<Member, Error> {
        let started = Instant::now();
        // stdin is a pipe the runner never writes and holds until the member is dropped: the member
        // exits on its EOF, so a runner that dies (even SIGKILLed) leaves no member running.
        let spawned = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                if let Some(dir) = &state_dir {
                    let _ = std::fs::remove_dir_all(dir);
                }
                return Err(format!("cannot start {:?}: {e}", cmd.get_program()).into());
            }
        };
        let held = Arc::new(Mutex::new(None));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            let (held, log) = (Arc::clone(&held), Arc::clone(&log));
            std::thread::spawn(move || read_lines(out, Some(held), log));
        }
        if let Some(err) = child.stderr.take() {
            let log = Arc::clone(&log);
            std::thread::spawn(move || read_lines(err, None, log));
        }
        Ok(Member {
            child,
            started,
            held,
            log,
            state_dir,
        })
    }

    /// The partitions it last said it holds (`None` before its first `HOLD`).
    fn held(&self) -> Option<Vec<i32>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err` with its exit status and last lines if it has exited.
    fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => {
                // Give the reader threads a moment to take in the last lines.
                std::thread::sleep(Duration::from_millis(100));
                let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
                let tail: Vec<&str> = log.iter().map(String::as_str).collect();
                Err(format!("the member exited ({status}): {}", tail.join(" | ")).into())
            }
        }
    }

    /// Its CPU time so far and its peak resident set, from `/proc`.
    fn usage(&self) -> Result<Usage, Error> {
        proc_usage(self.child.id())
    }

    /// SIGKILL: a crash, nothing of its shutdown runs.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.state_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Reads `from` line by line: `HOLD` lines into `held` (when given), the rest into the `log` tail.
fn read_lines(
    from: impl std::io::Read,
    held: Option<Arc<Mutex<Option<Vec<i32>>>>>,
    log: Arc<Mutex<VecDeque<String>>>,
) {
    for line in BufReader::new(from).lines().map_while(Result::ok) {
        if let (Some(held), Some(list)) = (&held, line.strip_prefix("HOLD")) {
            let parts = list
                .split(',')
                .filter_map(|p| p.trim().parse().ok())
                .collect();
            *held.lock().unwrap_or_else(|p| p.into_inner()) = Some(parts);
            continue;
        }
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == LOG_TAIL {
            log.pop_front();
        }
        log.push_back(line);
    }
}

/// A process's CPU time (utime + stime, every thread's, live and exited) and its `VmHWM`.
fn proc_usage(pid: u32) -> Result<Usage, Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_usage(&stat, &status, clock_ticks())
}

/// Clock ticks per second, the unit of `/proc/<pid>/stat`'s times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// [`proc_usage`] from the files' text.
fn parse_usage(stat: &str, status: &str, ticks: f64) -> Result<Usage, Error> {
    // The command name (field 2) is in parentheses and may hold spaces; fields count on after it.
    let rest = stat.rsplit_once(')').ok_or("no ')' in /proc/<pid>/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let tick = |i: usize| -> Result<f64, Error> {
        Ok(fields
            .get(i)
            .ok_or("short /proc/<pid>/stat")?
            .parse::<u64>()? as f64)
    };
    let cpu_s = (tick(11)? + tick(12)?) / ticks;
    let peak_rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmHWM in /proc/<pid>/status")?;
    Ok(Usage {
        cpu_s,
        peak_rss_kib,
    })
}

/// One run of the job row.
#[derive(Debug, Clone, Copy)]
struct JobSample {
    wall_s: f64,
    usage: Usage,
}

/// One run of the takeover row.
#[derive(Debug, Clone, Copy)]
struct TakeoverSample {
    /// From the kill to the committed end.
    after_kill_s: f64,
    /// Input events not yet committed when the member was killed.
    uncommitted: i64,
}

/// One run of the output row.
#[derive(Debug, Clone)]
struct OutputSample {
    events: usize,
    /// Append-to-visible latencies, ms, sorted.
    latencies_ms: Vec<f64>,
    usage: Usage,
}

/// What each client's rows gathered.
#[derive(Debug, Default)]
struct Results {
    job: Vec<(Kind, Result<Vec<JobSample>, String>)>,
    output: Vec<(Kind, Result<Vec<OutputSample>, String>)>,
    takeover: Vec<(Kind, Result<Vec<TakeoverSample>, String>)>,
}

/// Starts the broker, prepares Kafka Streams, runs the rows asked for and returns the report.
async fn run(options: &Options) -> Result<String, Error> {
    let java = java_version();
    let load_before = load_average();
    eprintln!("== starting 1 node");
    let kafka = dedicated(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
    let classes = std::env::temp_dir().join(unique("snapfence-bench-streams-classes"));
    let streams = if options.clients.contains(&Kind::Streams) {
        let c = classes.clone();
        Some(tokio::task::spawn_blocking(move || streams::prepare(&c)).await??)
    } else {
        None
    };
    let setup = Setup {
        bootstrap: kafka.bootstrap(),
        exe: std::env::current_exe()?,
        streams,
        xmx: options.xmx.clone(),
        session_ms: options.session_ms,
        heartbeat_ms: options.heartbeat_ms,
        interval_ms: options.interval_ms,
        timeout: options.timeout,
    };
    let mut results = Results::default();
    if options.job {
        eprintln!(
            "== job: {} events over {} keys on {} partitions",
            options.events, options.keys, options.partitions
        );
        let input = unique("job-input");
        create(&client, &input, options.partitions).await?;
        let ends = produce(
            &client,
            &input,
            options.partitions,
            options.events,
            options.keys,
        )
        .await?;
        results.job = alternating(
            &options.clients,
            options.runs,
            |kind| job_run(&setup, &client, kind, &input, &ends),
            |s: &JobSample| {
                format!(
                    "{:.2} s, CPU {:.2} s, peak RSS {} MiB",
                    s.wall_s,
                    s.usage.cpu_s,
                    s.usage.peak_rss_kib / 1024
                )
            },
        )
        .await;
    }
    if options.output {
        eprintln!(
            "== output: {} events/s for {} s",
            options.rate, options.output_seconds
        );
        results.output = alternating(
            &options.clients,
            options.runs,
            |kind| output_run(&setup, &client, kind, options),
            |s: &OutputSample| {
                format!(
                    "p50 {:.0} ms, p99 {:.0} ms",
                    percentile(&s.latencies_ms, 0.5),
                    percentile(&s.latencies_ms, 0.99)
                )
            },
        )
        .await;
    }
    if options.takeover {
        eprintln!(
            "== takeover: {} events, session timeout {} ms, heartbeat {} ms",
            options.events, options.session_ms, options.heartbeat_ms
        );
        results.takeover = alternating(
            &options.clients,
            options.runs,
            |kind| takeover_run(&setup, &client, kind, options),
            |s: &TakeoverSample| {
                format!(
                    "{:.2} s after the kill ({} events uncommitted at it)",
                    s.after_kill_s, s.uncommitted
                )
            },
        )
        .await;
    }
    let _ = std::fs::remove_dir_all(&classes);
    let rocksdb = setup
        .streams
        .as_ref()
        .map(StreamsJar::rocksdb)
        .unwrap_or_default();
    let mut text = markdown(options, kafka.version(), &java, &rocksdb, &results);
    let _ = writeln!(
        text,
        "\nLoad average (1, 5, 15 min) before the run {load_before}, after it {}.",
        load_average()
    );
    Ok(text)
}

/// Runs `run` `runs` times for every client, the clients alternating which goes first, and keeps each
/// client's samples (printing each with `describe`); a client whose run fails keeps that error and runs
/// no more.
async fn alternating<T, Fut>(
    clients: &[Kind],
    runs: usize,
    mut run: impl FnMut(Kind) -> Fut,
    describe: impl Fn(&T) -> String,
) -> Vec<(Kind, Result<Vec<T>, String>)>
where
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut samples: Vec<(Kind, Result<Vec<T>, String>)> =
        clients.iter().map(|&k| (k, Ok(Vec::new()))).collect();
    for round in 0..runs {
        for i in 0..samples.len() {
            // Alternate which client goes first.
            let i = if round % 2 == 0 {
                i
            } else {
                samples.len() - 1 - i
            };
            let kind = samples[i].0;
            if samples[i].1.is_err() {
                continue;
            }
            match run(kind).await {
                Ok(s) => {
                    eprintln!("   {:<14} run {}: {}", kind.name(), round + 1, describe(&s));
                    if let Ok(list) = &mut samples[i].1 {
                        list.push(s);
                    }
                }
                Err(e) => {
                    eprintln!("   {} failed: {e}", kind.name());
                    samples[i].1 = Err(e.to_string());
                }
            }
        }
    }
    samples
}

/// Creates `topic` with `partitions` partitions and waits until every one answers.
async fn create(client: &Client, topic: &str, partitions: i32) -> Result<(), Error> {
    snapfence::admin::create_topic(client, topic, partitions, -1, &[]).await?;
    crate::scale::ready(client, topic, partitions).await
}

/// The partitions of `topic`.
fn partitions_of(topic: &str, partitions: usize) -> Vec<TopicPartition> {
    (0..partitions as i32)
        .map(|p| TopicPartition::new(topic, p))
        .collect()
}

/// Produces `events` events, event i with key i mod `keys` and its index as value, through the idempotent
/// producer as fast as it goes; returns every partition's end offset.
async fn produce(
    client: &Client,
    topic: &str,
    partitions: i32,
    events: usize,
    keys: usize,
) -> Result<Vec<i64>, Error> {
    let began = Instant::now();
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let mut pending = Vec::with_capacity(10_000);
    for i in 0..events {
        let record = ProducerRecord::new(
            topic,
            Some(Bytes::copy_from_slice(&(i as u64).to_be_bytes())),
        )
        .key(crate::workload::key(i % keys));
        pending.push(producer.send(record).await?);
        if pending.len() == 10_000 {
            for d in pending.drain(..) {
                d.await?;
            }
        }
    }
    for d in pending {
        d.await?;
    }
    producer.close().await;
    let ends = end_offsets(client, topic, partitions).await?;
    eprintln!(
        "   produced {events} events in {:.1} s; ends {ends:?}",
        began.elapsed().as_secs_f64()
    );
    Ok(ends)
}

/// Every partition's high watermark (the input is written without transactions, so that is its end).
async fn end_offsets(client: &Client, topic: &str, partitions: i32) -> Result<Vec<i64>, Error> {
    let tps = partitions_of(topic, partitions as usize);
    let ends = list_offsets(
        client,
        &tps,
        OffsetSpec::Latest,
        IsolationLevel::ReadUncommitted,
    )
    .await?;
    Ok(tps
        .iter()
        .map(|tp| ends.get(tp).copied().unwrap_or(0))
        .collect())
}

/// The group's committed offset per partition (0 where none).
async fn committed(client: &Client, group: &str, topic: &str, n: usize) -> Result<Vec<i64>, Error> {
    let tps = partitions_of(topic, n);
    let got = committed_offsets(client, group, &tps).await?;
    Ok(tps
        .iter()
        .map(|tp| got.get(tp).copied().flatten().unwrap_or(0).max(0))
        .collect())
}

/// Polls the group's committed offsets every [`PROGRESS_POLL`] until each reaches `ends`; fails when a
/// member exits or after `timeout`. A failed OffsetFetch (the group's coordinator still loading) is
/// retried.
async fn wait_committed(
    client: &Client,
    group: &str,
    topic: &str,
    ends: &[i64],
    members: &mut [&mut Member],
    timeout: Duration,
) -> Result<(), Error> {
    let began = Instant::now();
    let mut last;
    loop {
        match committed(client, group, topic, ends.len()).await {
            Ok(c) if c.iter().zip(ends).all(|(c, e)| c >= e) => return Ok(()),
            Ok(c) => last = format!("committed {c:?} of {ends:?}"),
            Err(e) => last = format!("OffsetFetch failed: {e}"),
        }
        for m in members.iter_mut() {
            m.check_alive()?;
        }
        if began.elapsed() > timeout {
            return Err(format!("not done after {timeout:?}: {last}").into());
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    }
}

/// Waits until `members` together hold all `n` partitions, each of them some.
async fn wait_held(members: &mut [&mut Member], n: usize) -> Result<(), Error> {
    let began = Instant::now();
    loop {
        let mut all: Vec<i32> = Vec::new();
        let mut each = true;
        for m in members.iter_mut() {
            m.check_alive()?;
            match m.held() {
                Some(h) if !h.is_empty() => all.extend(h),
                _ => each = false,
            }
        }
        all.sort_unstable();
        all.dedup();
        if each && all.len() == n {
            return Ok(());
        }
        if began.elapsed() > HOLD_DEADLINE {
            return Err(format!("members hold {all:?} after {HOLD_DEADLINE:?}").into());
        }
        tokio::time::sleep(PROGRESS_POLL).await;
    }
}

/// One run of the job row: a fresh group over the shared input.
async fn job_run(
    setup: &Setup,
    client: &Client,
    kind: Kind,
    input: &str,
    ends: &[i64],
) -> Result<JobSample, Error> {
    let group = unique("job-group");
    let mut member = setup.spawn(kind, input, &group, None)?;
    wait_committed(
        client,
        &group,
        input,
        ends,
        &mut [&mut member],
        setup.timeout,
    )
    .await?;
    let wall_s = member.started.elapsed().as_secs_f64();
    let usage = member.usage()?;
    drop(member);
    Ok(JobSample { wall_s, usage })
}

/// One run of the takeover row.
async fn takeover_run(
    setup: &Setup,
    client: &Client,
    kind: Kind,
    options: &Options,
) -> Result<TakeoverSample, Error> {
    let input = unique("job-takeover-input");
    create(client, &input, options.partitions).await?;
    let group = unique("job-takeover-group");
    let mut a = setup.spawn(kind, &input, &group, None)?;
    let mut b = setup.spawn(kind, &input, &group, None)?;
    wait_held(&mut [&mut a, &mut b], options.partitions as usize).await?;
    let ends = produce(
        client,
        &input,
        options.partitions,
        options.events,
        options.keys,
    )
    .await?;
    let before = committed(client, &group, &input, ends.len()).await?;
    let uncommitted: i64 = ends.iter().zip(&before).map(|(e, c)| e - c).sum();
    if uncommitted == 0 {
        return Err("the job finished before the kill: use more --events".into());
    }
    a.kill();
    let killed = Instant::now();
    wait_committed(client, &group, &input, &ends, &mut [&mut b], setup.timeout).await?;
    Ok(TakeoverSample {
        after_kill_s: killed.elapsed().as_secs_f64(),
        uncommitted,
    })
}

/// One run of the output row: a fixed input rate, output latency at read_committed.
async fn output_run(
    setup: &Setup,
    client: &Client,
    kind: Kind,
    options: &Options,
) -> Result<OutputSample, Error> {
    let input = unique("job-output-input");
    let output = unique("job-output-output");
    create(client, &input, options.partitions).await?;
    create(client, &output, options.partitions).await?;
    let group = unique("job-output-group");
    let mut member = setup.spawn(kind, &input, &group, Some(&output))?;
    wait_held(&mut [&mut member], options.partitions as usize).await?;
    let events = options.rate * options.output_seconds;

    let mut config = ReaderConfig::default();
    config.isolation = IsolationLevel::ReadCommitted;
    config.max_wait = Duration::from_millis(100);
    let mut reader = PartitionReader::new(client.clone(), config);
    for tp in partitions_of(&output, options.partitions as usize) {
        reader.assign(tp, StartAt::Earliest);
    }
    let deadline = Duration::from_secs(options.output_seconds as u64) + setup.timeout;
    let mut read = AbortOnDrop(tokio::spawn(async move {
        let began = Instant::now();
        let mut latencies = Vec::with_capacity(events);
        while latencies.len() < events {
            if began.elapsed() > deadline {
                return Err(format!("read {} of {events} outputs", latencies.len()));
            }
            let batches = reader.fetch().await.map_err(|e| e.to_string())?;
            let now = now_ms();
            for r in batches.iter().flat_map(|b| &b.records) {
                let ts = r
                    .value
                    .as_ref()
                    .and_then(|v| v.get(..8))
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(i64::from_be_bytes)
                    .ok_or("an output value without the input's timestamp")?;
                latencies.push((now - ts) as f64);
            }
        }
        reader.close().await;
        Ok(latencies)
    }));

    // The fixed rate: every 10 ms the records due by then, each stamped with the time of its send.
    let producer = Producer::new(client.clone(), ProducerConfig::default()).await?;
    let began = Instant::now();
    let mut sent = 0;
    let mut pending = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while sent < events {
        tick.tick().await;
        let due = ((began.elapsed().as_secs_f64() * options.rate as f64) as usize).min(events);
        while sent < due {
            let value = Bytes::copy_from_slice(&(sent as u64).to_be_bytes());
            let record = ProducerRecord::new(input.as_str(), Some(value))
                .key(crate::workload::key(sent % options.keys))
                .timestamp(now_ms());
            pending.push(producer.send(record).await?);
            sent += 1;
        }
        member.check_alive()?;
    }
    for d in pending {
        d.await?;
    }
    producer.close().await;
    let mut latencies_ms = loop {
        if read.0.is_finished() {
            break (&mut read.0).await?.map_err(Error::from)?;
        }
        member.check_alive()?;
        tokio::time::sleep(PROGRESS_POLL).await;
    };
    let usage = member.usage()?;
    drop(member);
    latencies_ms.sort_by(f64::total_cmp);
    Ok(OutputSample {
        events,
        latencies_ms,
        usage,
    })
}

/// A task aborted when this is dropped, so an error on the way out does not leave it reading.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Wall-clock milliseconds since the Unix epoch (the clock CreateTime is read against).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The `q` quantile of sorted `values` (nearest rank).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of `values` and their range.
fn median(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let n = values.len();
    let mid = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (mid, values[0], values[n - 1])
}

/// `median [min-max]` with `digits` decimals.
fn cell(values: Vec<f64>, digits: usize, unit: &str) -> String {
    let n = values.len();
    let (m, lo, hi) = median(values);
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    if n == 1 {
        format!("{m:.digits$}{unit}")
    } else {
        format!("{m:.digits$}{unit} [{lo:.digits$}-{hi:.digits$}]")
    }
}

/// The machine's load averages (`/proc/loadavg`'s first three fields): the runs share the machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|| "unknown".into())
}

/// What `java -version` says (its first line).
fn java_version() -> String {
    Command::new(streams::tool("java"))
        .arg("-version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "java: unknown version".into())
}

/// The report: setup, then a table per row kind, with the ratios issue 33 targets.
fn markdown(options: &Options, kafka: &str, java: &str, rocksdb: &str, r: &Results) -> String {
    let mut s = String::new();
    let streams = if options.clients.contains(&Kind::Streams) {
        format!(
            "Kafka Streams {}: exactly_once_v2, commit.interval.ms {}, RocksDB ({rocksdb}), one stream \
             thread, JVM `-Xmx{}` ({java}, default collector)",
            streams::VERSION,
            options.interval_ms,
            options.xmx
        )
    } else {
        "Kafka Streams: not run".to_string()
    };
    let _ = writeln!(
        s,
        "Kafka {kafka}, 1 node. snapfence: count `Flow`, fenced mode, persist and commit every {} ms. \
         {streams}. {} run(s) per client, alternating; median [range].\n",
        options.interval_ms,
        options.runs
    );
    if !r.job.is_empty() {
        let n = options.events as f64;
        let _ = writeln!(
            s,
            "Job: {} events over {} keys on {} partitions, read from the start by a fresh group.\n",
            options.events, options.keys, options.partitions
        );
        let _ = writeln!(
            s,
            "| client | wall to committed end | events/s | CPU | CPU per event | peak RSS |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        let mut medians = Vec::new();
        for (kind, samples) in &r.job {
            match samples {
                Ok(list) if !list.is_empty() => {
                    let wall: Vec<f64> = list.iter().map(|x| x.wall_s).collect();
                    let cpu: Vec<f64> = list.iter().map(|x| x.usage.cpu_s).collect();
                    let per: Vec<f64> = cpu.iter().map(|c| c / n * 1e6).collect();
                    let rss: Vec<f64> = list
                        .iter()
                        .map(|x| x.usage.peak_rss_kib as f64 / 1024.0)
                        .collect();
                    let rate = n / median(wall.clone()).0;
                    medians.push((
                        *kind,
                        median(wall.clone()).0,
                        median(per.clone()).0,
                        median(rss.clone()).0,
                    ));
                    let _ = writeln!(
                        s,
                        "| {} | {} | {rate:.0} | {} | {} | {} |",
                        kind.name(),
                        cell(wall, 2, "s"),
                        cell(cpu, 2, "s"),
                        cell(per, 2, "µs"),
                        cell(rss, 0, "MiB"),
                    );
                }
                Ok(_) => {
                    let _ = writeln!(s, "| {} | - | - | - | - | - |", kind.name());
                }
                Err(e) => {
                    let _ = writeln!(s, "| {} | failed: {e} | | | | |", kind.name());
                }
            }
        }
        let of = |k: Kind| medians.iter().find(|m| m.0 == k);
        if let (Some(a), Some(b)) = (of(Kind::Snapfence), of(Kind::Streams)) {
            let _ = writeln!(
                s,
                "| **snapfence / Streams** | {:.2}x | | | **{:.3}x** (target <= 0.05x) | **{:.3}x** (target <= 0.1x) |",
                a.1 / b.1,
                a.2 / b.2,
                a.3 / b.3
            );
        }
        let _ = writeln!(s);
    }
    if !r.output.is_empty() {
        let _ = writeln!(
            s,
            "Output: one output record per event; {} events/s for {} s, keys as above; latency = a \
             read_committed reader in the runner sees the output minus the input's CreateTime.\n",
            options.rate, options.output_seconds
        );
        let _ = writeln!(
            s,
            "| client | events | p50 | p99 | max | CPU per event | peak RSS |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        for (kind, samples) in &r.output {
            match samples {
                Ok(list) if !list.is_empty() => {
                    let q = |p: f64| {
                        list.iter()
                            .map(|x| percentile(&x.latencies_ms, p))
                            .collect()
                    };
                    let per = list
                        .iter()
                        .map(|x| x.usage.cpu_s / x.events as f64 * 1e6)
                        .collect();
                    let rss = list
                        .iter()
                        .map(|x| x.usage.peak_rss_kib as f64 / 1024.0)
                        .collect();
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        kind.name(),
                        list[0].events,
                        cell(q(0.5), 0, "ms"),
                        cell(q(0.99), 0, "ms"),
                        cell(q(1.0), 0, "ms"),
                        cell(per, 2, "µs"),
                        cell(rss, 0, "MiB"),
                    );
                }
                Ok(_) => {
                    let _ = writeln!(s, "| {} | - | - | - | - | - | - |", kind.name());
                }
                Err(e) => {
                    let _ = writeln!(s, "| {} | {e} | | | | | |", kind.name());
                }
            }
        }
        let _ = writeln!(s);
    }
    if !r.takeover.is_empty() {
        let _ = writeln!(
            s,
            "Takeover: two members, {} events produced once both hold partitions, then one member \
             SIGKILLed; classic protocol, session timeout {} ms and heartbeat interval {} ms for both.\n",
            options.events, options.session_ms, options.heartbeat_ms
        );
        let _ = writeln!(
            s,
            "| client | kill to committed end | events uncommitted at the kill |"
        );
        let _ = writeln!(s, "|---|---:|---:|");
        for (kind, samples) in &r.takeover {
            match samples {
                Ok(list) if !list.is_empty() => {
                    let after = list.iter().map(|x| x.after_kill_s).collect();
                    let left = list.iter().map(|x| x.uncommitted as f64).collect();
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} |",
                        kind.name(),
                        cell(after, 2, "s"),
                        cell(left, 0, "")
                    );
                }
                Ok(_) => {
                    let _ = writeln!(s, "| {} | - | - |", kind.name());
                }
                Err(e) => {
                    let _ = writeln!(s, "| {} | failed: {e} | |", kind.name());
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, String> {
        options(
            &line
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn options_default_to_the_issues_job_and_reject_nonsense() {
        let o = parse("").unwrap();
        assert_eq!(
            (o.events, o.keys, o.partitions, o.runs),
            (1_000_000, 20_000, 4, 3)
        );
        assert!(o.job && !o.output && !o.takeover);
        let o = parse("--events 10 --output --takeover --no-job --clients streams").unwrap();
        assert_eq!(o.events, 10);
        assert!(!o.job && o.output && o.takeover);
        assert_eq!(o.clients, vec![Kind::Streams]);
        for bad in [
            "--events 0",
            "--runs x",
            "--clients flink",
            "--bogus",
            "--keys",
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn usage_reads_utime_stime_and_vmhwm() {
        // A command name with a space and a parenthesis, as /proc allows.
        let stat = "42 (java (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 30 0 1000 \
                    123456 789 18446744073709551615";
        let status = "Name:\tjava\nVmPeak:\t 9000 kB\nVmHWM:\t  51200 kB\nVmRSS:\t 40000 kB\n";
        let u = parse_usage(stat, status, 100.0).unwrap();
        assert_eq!(u.peak_rss_kib, 51_200);
        assert!((u.cpu_s - 3.0).abs() < 1e-9);
        assert!(parse_usage("42 (x) S", status, 100.0).is_err());
    }

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(cell(vec![1.0], 1, "s"), "1.0 s");
        assert_eq!(cell(vec![1.0, 3.0, 2.0], 0, ""), "2 [1-3]");
    }
}
