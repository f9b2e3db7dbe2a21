//! `snapfence-bench`: snapfence against the clients a user would pick instead, on the same broker, in the
//! same run. See docs/benchmarks.md; `scripts/bench.sh` builds the peers and runs this.
//!
//! ```text
//! snapfence-bench run [--nodes 1,3] [--rounds 2|2,1] [--peers DIR] [--note TEXT]... [--out FILE]
//!                     [--workloads LIST] [--clients LIST] [--repeat N] [--child-timeout SECS]
//!                     [--broker KEY=VALUE]... [--transaction-version 1|2]
//!                     [--connections LIST] [--ceiling] [--before PATH]
//! snapfence-bench scale [--partitions LIST] [--keys LIST] [--out FILE] [--svg FILE]   (see scale.rs)
//!                       [--series R [--connections LIST]]
//! snapfence-bench stores [--keys LIST] [--waves N] [--out FILE]              (see stores.rs)
//! snapfence-bench job [--events N] [--keys K] [--partitions P] [--runs R] [--output] [--takeover] [--out FILE]
//!                     the whole job against Kafka Streams 4.4 (see job.rs)
//! snapfence-bench peer WORKLOAD ARGS...     snapfence's side of one workload (a child of `run`)
//! snapfence-bench job-child ARGS...         snapfence's member of `job` (see job_child.rs)
//! ```
//!
//! `--workloads` picks rows by key (`marker,a-a,a-b,a-base,a-c,b-base,b-spread,b-1,b-16,b-256,b-2000,recovery,takeover`; default
//! all), `--clients` picks clients (`snapfence,java,confluent,rdkafka`), for profiling one case by hand.
//! `--repeat N` (default 5) runs the short rows (A(a), A(c) and its baseline, B's baseline, caps 256 and 2000: ~0.1 s each for
//! us) N times per client, interleaved, and reports the median with the range: one 100 ms sample on a
//! shared 2-core machine moves by 2x between runs. `--broker` sets a broker property and
//! `--transaction-version` the cluster's finalised transaction.version (default 2), to show what a
//! broker-side wait costs.
//!
//! Issue 35's rows: `--connections 2,4,16` runs snapfence again as one client per
//! `connections_per_broker` setting (`snapfence 2 conns`, ...; 16 is a connection per partition of
//! B'); `--ceiling` adds Kafka's `kafka-producer-perf-test` as the client `perf-test ceiling` (B and
//! B' only, see ceiling.rs); `--before PATH` runs another build of this runner as `snapfence before`,
//! to compare two commits in one run.
//!
//! `run` starts each cluster with the protocol-tests fixture, and per round runs every workload once per
//! client, each client in its own process with the same arguments (bench/src/workload.rs), rotating which
//! client goes first. Times are taken inside each process, so JVM start-up and process spawn are not
//! counted. It writes the markdown tables to `--out` (default stdout).
//!
//! # References
//! - Seed 000 (experiments A and B), KIP-447 (fenced TxnOffsetCommit), KIP-98 (transactions)

mod ceiling;
mod disk;
mod disk_scale;
mod job;
mod job_child;
mod ours;
mod report;
mod scale;
mod stores;
mod streams;
mod workload;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use protocol_tests::{dedicated, join_classic, unique, ClusterSpec, KafkaCluster};
use snapfence::net::{Client, ClientConfig};

use report::{Cell, Report, Row, Section};
use workload::{Outcome, Work};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Seed experiment A: 500 keys, small snapshots.
const A_KEYS: usize = 500;
const A_SIZE: usize = 100;
/// Seed experiment B: 2000 keys, 10 KiB snapshots.
const B_KEYS: usize = 2000;
const B_SIZE: usize = 10 * 1024;
const B_CAPS: [usize; 4] = [1, 16, 256, 2000];
/// Experiment B' (issue 17): B's 2 000 records per partition, 1 KiB each, over this many partitions at
/// once: one request per broker carrying every partition is what it measures.
const SPREAD_PARTITIONS: usize = 16;
/// Recovery data sets: (keys, value bytes).
const RECOVERY: [(usize, usize); 2] = [(2000, 10 * 1024), (200_000, 100)];
/// Takeover: committed state, then the crashed owner's open transaction.
const TAKEOVER_STATE: usize = 500;
const TAKEOVER_OPEN: usize = 100;
/// The group member every fenced offset commit names never heartbeats; this keeps it in the group.
const SESSION_MS: i32 = 600_000;
/// A child that takes longer is killed and its cell reads "failed" (`--child-timeout`; three nodes get
/// three times as long: every produce there waits for a second replica).
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);
/// Transactions of the marker round's run.
const MARKER_TRANSACTIONS: usize = 40;
/// The workload keys `--workloads` takes.
const WORKLOADS: [&str; 13] = [
    "marker", "a-a", "a-b", "a-base", "a-c", "b-base", "b-spread", "b-1", "b-16", "b-256",
    "b-2000", "recovery", "takeover",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("peer") => peer(&args[1..]),
        Some("ceiling") => ceiling::main(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("scale") => {
            init_tracing();
            scale::main(&args[1..])
        }
        Some("scale-hold") => scale::hold_main(&args[1..]),
        Some("disk") => {
            init_tracing();
            disk::main(&args[1..])
        }
        Some("disk-scale") => {
            init_tracing();
            disk_scale::main(&args[1..])
        }
        Some("disk-member") => {
            init_tracing();
            disk_scale::member_main(&args[1..])
        }
        Some("stores") => {
            init_tracing();
            stores::main(&args[1..])
        }
        Some("job") => {
            init_tracing();
            job::main(&args[1..])
        }
        Some("job-child") => {
            init_tracing();
            job_child::main(&args[1..])
        }
        _ => {
            eprintln!("usage: snapfence-bench run [--nodes 1,3] [--rounds N|N,M] [--peers DIR] [--note TEXT] [--out FILE]\n                           [--workloads LIST] [--clients LIST] [--repeat N] [--child-timeout SECS] [--broker K=V]... [--transaction-version 1|2]\n                           [--connections LIST] [--ceiling] [--before PATH]\n       snapfence-bench scale [--nodes 1|3] [--partitions 1,8,64,1024] [--keys 10000,100000,1000000] [--out FILE] [--svg FILE] [--series R] [--connections LIST]
       snapfence-bench stores [--keys 1,100,1000,10000] [--waves N] [--out FILE]
       snapfence-bench disk [--keys 100000,1000000] [--changed 0.01] [--repeat R] [--out FILE]
       snapfence-bench disk-scale [--keys 10000000] [--budget-mib 64] [--hot 100000] [--hot-events 1000000] [--changed 0.01] [--out FILE] [--svg FILE]
       snapfence-bench job [--events N] [--keys K] [--partitions P] [--runs R] [--output] [--takeover] [--out FILE]
       snapfence-bench peer WORKLOAD ARGS...");
            2
        }
    };
    std::process::exit(code);
}

/// With `RUST_LOG` set (e.g. `snapfence::net=trace`, every request's round trip), snapfence's side of each
/// workload logs to the file `SNAPFENCE_BENCH_TRACE` names (appending, so every child of a `run` adds to
/// it), or to stderr. docs/benchmarks.md reads such a trace to find where a transaction's time goes.
fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::from_default_env();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    match std::env::var_os("SNAPFENCE_BENCH_TRACE") {
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(file) => builder.with_writer(std::sync::Mutex::new(file)).init(),
            Err(e) => eprintln!("cannot open {}: {e}", PathBuf::from(path).display()),
        },
        None => builder.with_writer(std::io::stderr).init(),
    }
}

/// snapfence's side of one workload, in this process.
fn peer(args: &[String]) -> i32 {
    init_tracing();
    let work = match Work::parse(args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The workload runs in a task, as application code does (a flow's flush, a request handler), not on
    // block_on's thread: tasks a worker spawns start when it yields, while those spawned from outside the
    // workers start at once on an idle one (the group commit's drain among them).
    let outcome = runtime.block_on(async {
        tokio::spawn(ours::run(work))
            .await
            .unwrap_or_else(|e| Err(format!("the workload task failed: {e}").into()))
    });
    match outcome {
        Ok(outcome) => {
            println!("{outcome}");
            0
        }
        Err(e) => {
            eprintln!("ERROR {e}");
            1
        }
    }
}

struct Options {
    nodes: Vec<usize>,
    /// Rounds per cluster, in `nodes` order; one number serves every cluster.
    rounds: Vec<usize>,
    peers: Option<PathBuf>,
    notes: Vec<String>,
    out: Option<PathBuf>,
    workloads: Option<Vec<String>>,
    clients: Option<Vec<String>>,
    repeat: usize,
    child_timeout: Duration,
    broker: Vec<(String, String)>,
    transaction_version: Option<i16>,
    /// `--connections`: snapfence again with each of these `connections_per_broker`, as clients of
    /// their own (`snapfence 2 conns`, ...).
    connections: Vec<usize>,
    /// `--ceiling`: Kafka's `kafka-producer-perf-test` as a client of B' (plain-burst only).
    ceiling: bool,
    /// `--before PATH`: another build of this runner (an earlier commit's), whose `peer` runs as the
    /// client `snapfence before`, for a before/after comparison in one run.
    before: Option<PathBuf>,
}

impl Options {
    fn wants(&self, workload: &str) -> bool {
        self.workloads
            .as_ref()
            .is_none_or(|w| w.iter().any(|k| k == workload))
    }
}

fn list(value: String) -> Vec<String> {
    value.split(',').map(|s| s.trim().to_owned()).collect()
}

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        nodes: vec![1, 3],
        rounds: vec![2],
        peers: None,
        notes: Vec::new(),
        out: None,
        workloads: None,
        clients: None,
        repeat: 5,
        child_timeout: CHILD_TIMEOUT,
        broker: Vec::new(),
        transaction_version: None,
        connections: Vec::new(),
        ceiling: false,
        before: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => {
                o.nodes = value()?
                    .split(',')
                    .map(|n| n.parse().map_err(|_| format!("bad --nodes {n}")))
                    .collect::<Result<_, _>>()?
            }
            "--rounds" => {
                o.rounds = value()?
                    .split(',')
                    .map(|n| n.parse().map_err(|_| format!("bad --rounds {n}")))
                    .collect::<Result<_, _>>()?
            }
            "--peers" => o.peers = Some(PathBuf::from(value()?)),
            "--note" => o.notes.push(value()?),
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--workloads" => {
                let w = list(value()?);
                if let Some(bad) = w.iter().find(|k| !WORKLOADS.contains(&k.as_str())) {
                    return Err(format!(
                        "unknown workload {bad}: want some of {WORKLOADS:?}"
                    ));
                }
                o.workloads = Some(w);
            }
            "--clients" => o.clients = Some(list(value()?)),
            "--connections" => {
                o.connections = value()?
                    .split(',')
                    .map(|n| {
                        n.trim()
                            .parse()
                            .ok()
                            .filter(|&n| n > 0)
                            .ok_or(format!("bad --connections {n}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--ceiling" => o.ceiling = true,
            "--before" => o.before = Some(PathBuf::from(value()?)),
            "--repeat" => {
                o.repeat = value()?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("bad --repeat (want 1 or more)")?
            }
            "--child-timeout" => {
                o.child_timeout = Duration::from_secs(
                    value()?
                        .parse()
                        .map_err(|_| "bad --child-timeout (seconds)")?,
                )
            }
            "--transaction-version" => {
                o.transaction_version = Some(
                    value()?
                        .parse()
                        .ok()
                        .filter(|v| (1..=2).contains(v))
                        .ok_or("bad --transaction-version (1 or 2)")?,
                )
            }
            "--broker" => {
                let v = value()?;
                let (k, v) = v
                    .split_once('=')
                    .ok_or(format!("--broker wants KEY=VALUE, got {v}"))?;
                o.broker.push((k.to_owned(), v.to_owned()));
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    // The ceiling client runs plain bursts only; every other row would make its setup (topics, a
    // crashed owner) for nothing.
    let bursts_only = o
        .workloads
        .as_ref()
        .is_some_and(|w| w.iter().all(|k| k == "b-spread" || k == "b-base"));
    if o.ceiling && !bursts_only {
        return Err("--ceiling wants --workloads b-spread (or b-base)".into());
    }
    Ok(o)
}

fn run(args: &[String]) -> i32 {
    let options = match options(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    block_on_and_write(
        async { Ok(run_all(&options).await?.markdown()) },
        options.out.as_deref(),
        "benchmark",
    )
}

/// Runs `work` on a two-worker runtime and writes the markdown it returns to `out` (stdout when
/// `None`); the exit status: 0, or 1 when the runtime, the work or the write failed.
fn block_on_and_write(
    work: impl std::future::Future<Output = Result<String, Error>>,
    out: Option<&Path>,
    what: &str,
) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return 1;
        }
    };
    let text = match runtime.block_on(work) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{what} failed: {e}");
            return 1;
        }
    };
    match out {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &text) {
                eprintln!("cannot write {}: {e}", path.display());
                return 1;
            }
            eprintln!("wrote {}", path.display());
        }
        None => print!("{text}"),
    }
    0
}

/// A client under test: how to start its process for one workload.
#[derive(Clone)]
struct Contender {
    name: &'static str,
    program: PathBuf,
    prefix: Vec<String>,
    /// Environment the process gets on top of the runner's.
    env: Vec<(String, String)>,
    /// The one workload (its first argument) this client runs; `None`: every workload.
    only: Option<&'static str>,
}

impl Contender {
    fn command(&self, work: &[String]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.prefix).args(work);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    fn runs(&self, work: &[String]) -> bool {
        self.only
            .is_none_or(|only| work.first().is_some_and(|w| w == only))
    }
}

/// The clients that can run here; the missing ones are named in the report's notes.
fn contenders(
    options: &Options,
    kafka: &KafkaCluster,
    notes: &mut Vec<String>,
) -> Result<Vec<Contender>, Error> {
    let mut list = vec![Contender {
        name: report::OURS,
        program: std::env::current_exe()?,
        prefix: vec!["peer".into()],
        env: Vec::new(),
        only: None,
    }];
    for &n in &options.connections {
        let name: &'static str = Box::leak(
            format!("snapfence {n} conn{}", if n == 1 { "" } else { "s" }).into_boxed_str(),
        );
        list.push(Contender {
            name,
            program: std::env::current_exe()?,
            prefix: vec!["peer".into()],
            env: vec![(ours::CONNECTIONS_ENV.into(), n.to_string())],
            only: None,
        });
    }
    if let Some(before) = &options.before {
        list.push(Contender {
            name: report::BEFORE,
            program: before.clone(),
            prefix: vec!["peer".into()],
            env: Vec::new(),
            only: None,
        });
    }
    if options.ceiling {
        match ceiling::classpath(&kafka.libs_dir()) {
            Ok(classpath) => list.push(Contender {
                name: report::CEILING,
                program: std::env::current_exe()?,
                prefix: vec!["ceiling".into(), classpath],
                env: Vec::new(),
                only: Some("plain-burst"),
            }),
            Err(e) => notes.push(format!("{}: not run: {e}", report::CEILING)),
        }
    }
    // The Java program is compiled once against the broker's own kafka-clients jar.
    let java_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/BenchPeer.java");
    let classes = std::env::temp_dir().join(unique("snapfence-bench-java"));
    std::fs::create_dir_all(&classes)?;
    let classpath = format!("{}/*", kafka.libs_dir().display());
    let java_home = std::env::var_os("JAVA_HOME").map(PathBuf::from);
    let tool = |name: &str| match &java_home {
        Some(h) => h.join("bin").join(name),
        None => PathBuf::from(name),
    };
    let javac = Command::new(tool("javac"))
        .args(["-cp", &classpath, "-d"])
        .arg(&classes)
        .arg(&java_src)
        .output();
    match javac {
        Ok(out) if out.status.success() => list.push(Contender {
            name: report::JAVA,
            program: tool("java"),
            prefix: vec![
                "-cp".into(),
                format!("{classpath}:{}", classes.display()),
                "BenchPeer".into(),
            ],
            env: Vec::new(),
            only: None,
        }),
        Ok(out) => notes.push(format!(
            "Java: BenchPeer.java did not compile: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => notes.push(format!("Java: javac did not start: {e}")),
    }
    for (name, bin) in [
        (report::CONFLUENT, "confluent-peer"),
        (report::RDKAFKA, "rdkafka-peer"),
    ] {
        match options.peers.as_ref().map(|d| d.join(bin)) {
            Some(path) if path.is_file() => list.push(Contender {
                name,
                program: path,
                prefix: Vec::new(),
                env: Vec::new(),
                only: None,
            }),
            Some(path) => notes.push(format!("{name}: not built ({} missing)", path.display())),
            None => notes.push(format!(
                "{name}: not run (no --peers; scripts/bench.sh builds it)"
            )),
        }
    }
    if let Some(keep) = &options.clients {
        list.retain(|c| {
            let name = c.name.to_ascii_lowercase();
            keep.iter().any(|k| name.contains(&k.to_ascii_lowercase()))
        });
    }
    Ok(list)
}

async fn run_all(options: &Options) -> Result<Report, Error> {
    let mut report = Report::new(options.notes.clone());
    for (i, &nodes) in options.nodes.iter().enumerate() {
        let rounds = options
            .rounds
            .get(i)
            .or(options.rounds.last())
            .copied()
            .unwrap_or(1);
        let mut spec = if nodes == 3 {
            ClusterSpec::three_nodes()
        } else {
            ClusterSpec::kafka4()
        };
        if let Some(tv) = options.transaction_version {
            spec = spec.with_transaction_version(tv);
            report.note(format!("Cluster formatted with transaction.version={tv}."));
        }
        for (k, v) in &options.broker {
            spec = spec.with_prop(k, v);
            report.note(format!("Broker property set for this run: `{k}={v}`."));
        }
        eprintln!("== starting {nodes} node(s)");
        let kafka = dedicated(spec).await;
        let client = Client::connect(ClientConfig::new(kafka.bootstrap())).await?;
        let mut notes = Vec::new();
        let contenders = contenders(options, &kafka, &mut notes)?;
        for note in notes {
            report.note(note);
        }
        let input = unique("bench-input");
        snapfence::admin::create_topic(&client, &input, 1, -1, &[]).await?;
        let recovery_topics = if options.wants("recovery") {
            fill_recovery_sets(&client).await?
        } else {
            Vec::new()
        };
        for round in 1..=rounds {
            let bench = Bench {
                kafka: &kafka,
                client: &client,
                input: &input,
                contenders: &contenders,
                options,
                child_timeout: options.child_timeout * if nodes == 3 { 3 } else { 1 },
            };
            let section = bench.round(nodes, round, &recovery_topics).await?;
            report.push(section);
            // Written after every round, so a run cut short still leaves what it measured.
            if let Some(path) = &options.out {
                std::fs::write(path, report.markdown())?;
            }
        }
    }
    Ok(report)
}

/// The recovery data sets, written once per cluster, read by every client.
async fn fill_recovery_sets(client: &Client) -> Result<Vec<(String, usize, usize)>, Error> {
    let mut topics = Vec::new();
    for (keys, size) in RECOVERY {
        let topic = unique("bench-recovery");
        snapfence::admin::create_topic(client, &topic, 1, -1, &[("cleanup.policy", "compact")])
            .await?;
        eprintln!("   filling {topic}: {keys} x {size} B");
        ours::fill(client, &topic, keys, size).await?;
        topics.push((topic, keys, size));
    }
    Ok(topics)
}

struct Bench<'a> {
    kafka: &'a KafkaCluster,
    client: &'a Client,
    input: &'a str,
    contenders: &'a [Contender],
    options: &'a Options,
    child_timeout: Duration,
}

impl Bench<'_> {
    async fn round(
        &self,
        nodes: usize,
        round: usize,
        recovery: &[(String, usize, usize)],
    ) -> Result<Section, Error> {
        let started = Instant::now();
        let mut section = Section::new(
            format!(
                "Kafka {}, {nodes} node{}, round {round}",
                self.kafka.version(),
                if nodes == 1 { "" } else { "s" }
            ),
            self.contenders.iter().map(|c| c.name).collect(),
        );
        let mut turn = round;
        let mut next_turn = || {
            turn += 1;
            turn
        };
        let bootstrap = self.kafka.bootstrap();

        let wants = |w: &str| self.options.wants(w);
        let short = self.options.repeat;
        // The label of a row that ran `reps` times per client.
        let label = |text: String, reps: usize| {
            if reps > 1 {
                format!("{text} (median of {reps})")
            } else {
                text
            }
        };
        use report::{Plain, Target};

        // The broker's wait per transaction, every transactional row's floor (ours only: it is the
        // broker's figure, measured through our client's round trips).
        if wants("marker") {
            let cells = self
                .ours_only(|| self.marker_args(MARKER_TRANSACTIONS))
                .await?;
            section.push(Row::time(
                format!("marker round: EndTxn answered to transaction complete ({MARKER_TRANSACTIONS} transactions of 1 B, median)"),
                cells,
                Target::Marker,
            ));
        }

        // Experiment A.
        if wants("a-a") {
            let text =
                format!("A(a) plain idempotent producer, {A_KEYS} x {A_SIZE} B one at a time");
            // Half a second per client: repeated like the short rows, so a slow spell of the machine
            // does not decide the row.
            let row = self
                .each(next_turn(), short, |_| {
                    self.plain_args("plain-seq", A_KEYS, A_SIZE, 0)
                })
                .await?;
            section.push(Row::time(
                label(text, short),
                row,
                Target::Baseline(Plain::ASeq),
            ));
        }
        if wants("a-b") {
            let text = format!("A(b) group-committed transactions, {A_KEYS} one at a time");
            let row = self
                .each(next_turn(), 1, |_| {
                    self.txn_args("txn-seq", A_KEYS, A_SIZE, None)
                })
                .await?;
            section.push(Row::time(
                label(text, 1),
                row,
                Target::Transactional(Plain::ASeq),
            ));
        }
        if wants("a-base") {
            let text = format!(
                "A plain idempotent producer, {A_KEYS} x {A_SIZE} B all at once (A(c)'s baseline)"
            );
            let row = self
                .each(next_turn(), short, |_| {
                    self.plain_args("plain-burst", A_KEYS, A_SIZE, 5)
                })
                .await?;
            section.push(Row::time(
                label(text, short),
                row,
                Target::Baseline(Plain::ABurst),
            ));
        }
        if wants("a-c") {
            let text = format!("A(c) group-committed transactions, {A_KEYS} all at once (cap 256)");
            let row = self
                .each(next_turn(), short, |_| {
                    self.txn_args("txn-burst", A_KEYS, A_SIZE, Some(256))
                })
                .await?;
            section.push(Row::time(
                label(text, short),
                row,
                Target::Transactional(Plain::ABurst),
            ));
        }

        // Experiment B.
        if wants("b-base") {
            let text =
                format!("B plain idempotent producer, {B_KEYS} x 10 KiB all at once (baseline)");
            let row = self
                .each(next_turn(), short, |_| {
                    self.plain_args("plain-burst", B_KEYS, B_SIZE, 5)
                })
                .await?;
            section.push(Row::time(
                label(text, short),
                row,
                Target::Baseline(Plain::BBurst),
            ));
        }
        if wants("b-spread") {
            let text = format!(
                "B' plain idempotent producer, {SPREAD_PARTITIONS} partitions x {B_KEYS} x 1 KiB all at once"
            );
            let row = self
                .each(next_turn(), short, |_| {
                    self.spread_args(B_KEYS * SPREAD_PARTITIONS, 1024, 5, SPREAD_PARTITIONS)
                })
                .await?;
            section.push(Row::time(label(text, short), row, Target::Spread));
        }
        for cap in B_CAPS {
            if !wants(&format!("b-{cap}")) {
                continue;
            }
            // Caps 1 and 16 run for seconds to minutes: one sample is enough there.
            let reps = if cap >= 256 { short } else { 1 };
            let row = self
                .each(next_turn(), reps, |_| {
                    self.txn_args("txn-burst", B_KEYS, B_SIZE, Some(cap))
                })
                .await?;
            let text = format!("B group commit, cap {cap}");
            section.push(Row::time(
                label(text, reps),
                row,
                Target::Transactional(Plain::BBurst),
            ));
        }

        // Recovery.
        for (topic, keys, size) in recovery {
            let label = if *size >= 1024 {
                format!("{keys} x {} KiB", size / 1024)
            } else {
                format!("{keys} x {size} B")
            };
            // A fresh process (what a restarted owner pays, JVM warm-up included), then a second read in
            // the same process (a long-running one taking over a partition).
            let mut cold = Vec::new();
            for reads in ["1", "2"] {
                let row = self
                    .each(next_turn(), 1, |_| async {
                        Ok(vec![
                            "recover".into(),
                            bootstrap.clone(),
                            topic.clone(),
                            reads.into(),
                        ])
                    })
                    .await?;
                let when = if reads == "1" {
                    "fresh process"
                } else {
                    "second read in the process"
                };
                section.push(Row::time(
                    format!("recovery read, {label}, read_committed into a map, {when}"),
                    row.clone(),
                    report::Target::Recovery,
                ));
                if reads == "1" {
                    cold = row;
                }
            }
            section.push(Row::memory(
                format!("recovery peak RSS, {label}, fresh process"),
                cold,
            ));
        }

        // Takeover.
        if wants("takeover") {
            let row = self
                .each(next_turn(), 1, |_| async {
                    let topic = self.topic().await?;
                    ours::fill(self.client, &topic, TAKEOVER_STATE, A_SIZE).await?;
                    let prefix = unique("bench-takeover");
                    self.crash_owner(&topic, &format!("{prefix}-0")).await?;
                    Ok(vec!["takeover".into(), bootstrap.clone(), topic, prefix])
                })
                .await?;
            section.push(Row::time(
                format!(
                    "takeover: acquire after a crash with {TAKEOVER_OPEN} writes open, then recover {TAKEOVER_STATE} keys"
                ),
                row,
                report::Target::Takeover,
            ));
        }
        section.set_elapsed(started.elapsed());
        Ok(section)
    }

    /// A fresh compacted snapshot topic of one partition.
    /// A plain idempotent-producer workload's arguments: `n` writes of `size` bytes, `linger_ms`.
    async fn plain_args(
        &self,
        name: &str,
        n: usize,
        size: usize,
        linger_ms: u64,
    ) -> Result<Vec<String>, Error> {
        let topic = self.topic().await?;
        Ok(vec![
            name.to_owned(),
            self.kafka.bootstrap(),
            topic,
            n.to_string(),
            size.to_string(),
            linger_ms.to_string(),
        ])
    }

    /// plain-burst spread over a fresh topic of `partitions` partitions (record i to partition
    /// i % partitions).
    async fn spread_args(
        &self,
        n: usize,
        size: usize,
        linger_ms: u64,
        partitions: usize,
    ) -> Result<Vec<String>, Error> {
        let topic = self.topic_of(partitions as i32).await?;
        Ok(vec![
            "plain-burst".to_owned(),
            self.kafka.bootstrap(),
            topic,
            n.to_string(),
            size.to_string(),
            linger_ms.to_string(),
            partitions.to_string(),
        ])
    }

    async fn topic(&self) -> Result<String, Error> {
        self.topic_of(1).await
    }

    async fn topic_of(&self, partitions: i32) -> Result<String, Error> {
        let topic = unique("bench");
        snapfence::admin::create_topic(
            self.client,
            &topic,
            partitions,
            -1,
            &[("cleanup.policy", "compact")],
        )
        .await?;
        // A client's clock must not include the broker bringing a new topic's logs online (each client
        // would wait it out through its own metadata retries), so every partition answers first.
        scale::ready(self.client, &topic, partitions).await?;
        Ok(topic)
    }

    /// `txn-marker`'s arguments: like [`Self::txn_args`] without the size and cap.
    async fn marker_args(&self, n: usize) -> Result<Vec<String>, Error> {
        let mut args = self.txn_args("txn-marker", n, 0, None).await?;
        args.pop(); // the size
        Ok(args)
    }

    /// Runs a workload once for snapfence alone; the other clients' cells stay empty.
    async fn ours_only<F, Fut>(&self, setup: F) -> Result<Vec<Cell>, Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<String>, Error>>,
    {
        let mut cells = vec![Cell::Missing; self.contenders.len()];
        let Some(i) = self.contenders.iter().position(|c| c.name == report::OURS) else {
            return Ok(cells);
        };
        let args = setup().await?;
        eprintln!("   {:<16} {}", report::OURS, args.join(" "));
        let cmd = self.contenders[i].command(&args);
        let timeout = self.child_timeout;
        let cell = tokio::task::spawn_blocking(move || run_child(cmd, timeout)).await?;
        match &cell {
            Cell::Done(o) => eprintln!("   {:<16} {o}", ""),
            Cell::Failed(why) => eprintln!("   {} failed: {why}", report::OURS),
            Cell::Missing => {}
        }
        cells[i] = cell;
        Ok(cells)
    }

    /// A transactional workload's arguments: a fresh topic, transactional id and group member.
    async fn txn_args(
        &self,
        name: &str,
        n: usize,
        size: usize,
        cap: Option<usize>,
    ) -> Result<Vec<String>, Error> {
        let topic = self.topic().await?;
        let group = join_classic(self.client, &unique("bench-group"), "", SESSION_MS).await?;
        let mut args = vec![
            name.to_owned(),
            self.kafka.bootstrap(),
            topic,
            unique("bench-txn"),
            self.input.to_owned(),
            group.group_id().to_owned(),
            group.generation_id().to_string(),
            group.member_id().to_owned(),
            n.to_string(),
            size.to_string(),
        ];
        args.extend(cap.map(|c| c.to_string()));
        Ok(args)
    }

    /// Runs a workload `reps` times per client, the clients in a rotating order within each repetition (so
    /// a slow spell of the machine is shared out rather than landing on one client); `setup` prepares each
    /// run's arguments. A client's cell is its median run, with the range of all its runs.
    async fn each<F, Fut>(&self, turn: usize, reps: usize, setup: F) -> Result<Vec<Cell>, Error>
    where
        F: Fn(&Contender) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<String>, Error>>,
    {
        let n = self.contenders.len();
        let mut runs: Vec<Vec<Cell>> = vec![Vec::new(); n];
        for rep in 0..reps {
            for k in 0..n {
                let i = (turn + rep + k) % n;
                let contender = &self.contenders[i];
                // A client that failed once is not run again: its cell reads failed.
                if runs[i].iter().any(|c| matches!(c, Cell::Failed(_))) {
                    continue;
                }
                let args = setup(contender).await?;
                if !contender.runs(&args) {
                    runs[i].push(Cell::Missing);
                    continue;
                }
                eprintln!("   {:<16} {}", contender.name, args.join(" "));
                let cmd = contender.command(&args);
                let timeout = self.child_timeout;
                let cell = tokio::task::spawn_blocking(move || run_child(cmd, timeout)).await?;
                match &cell {
                    Cell::Done(o) => eprintln!("   {:<16} {o}", ""),
                    Cell::Failed(why) => eprintln!("   {} failed: {why}", contender.name),
                    Cell::Missing => {}
                }
                runs[i].push(cell);
            }
        }
        Ok(runs.into_iter().map(report::median).collect())
    }

    /// Leaves a transaction of `txn_id` open on `topic` in a process that is then killed.
    async fn crash_owner(&self, topic: &str, txn_id: &str) -> Result<(), Error> {
        let exe = std::env::current_exe()?;
        let args = [
            "peer",
            "crash-owner",
            &self.kafka.bootstrap(),
            topic,
            txn_id,
            &TAKEOVER_OPEN.to_string(),
            &A_SIZE.to_string(),
        ]
        .map(String::from);
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            let mut child = Command::new(exe)
                .args(args)
                .stdout(Stdio::piped())
                .spawn()?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let open = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .any(|l| l == "OPEN");
            // SIGKILL: a crash, nothing runs that could end the transaction.
            let _ = child.kill();
            let _ = child.wait();
            if open {
                Ok(())
            } else {
                Err("the crashing owner never opened its transaction".into())
            }
        })
        .await?
    }
}

/// Runs one client process to completion (or kills it after `timeout`) and reads its result.
fn run_child(mut cmd: Command, timeout: Duration) -> Cell {
    let mut child = match cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn() {
        Ok(c) => c,
        Err(e) => return Cell::Failed(format!("did not start: {e}")),
    };
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = std::io::Read::read_to_string(o, &mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = std::io::Read::read_to_string(e, &mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match (status, Outcome::find(&stdout)) {
        (Some(s), Some(o)) if s.success() => Cell::Done(o),
        (None, _) => Cell::Failed(format!("timed out after {timeout:?}")),
        _ => {
            let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
            let start = tail.len().saturating_sub(3);
            Cell::Failed(tail[start..].join(" | "))
        }
    }
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
    fn options_pick_rounds_per_cluster_workloads_and_repeats() {
        let o = parse("--nodes 1,3 --rounds 2,1 --workloads b-base,b-256 --repeat 7 --transaction-version 1 --broker a.b=1").unwrap();
        assert_eq!(
            (&o.nodes, &o.rounds, o.repeat),
            (&vec![1, 3], &vec![2, 1], 7)
        );
        assert!(o.wants("b-256") && !o.wants("a-b"));
        assert_eq!(o.transaction_version, Some(1));
        assert_eq!(o.broker, vec![("a.b".to_string(), "1".to_string())]);
        let all = parse("").unwrap();
        assert!(WORKLOADS.iter().all(|w| all.wants(w)));
        assert_eq!((all.rounds, all.repeat), (vec![2], 5));
        for bad in [
            "--workloads b-3",
            "--repeat 0",
            "--rounds x",
            "--transaction-version 3",
            "--broker novalue",
            "--nodes",
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }

    /// Issue 35's options: connection counts, the ceiling (plain bursts only, since its setup would
    /// be wasted on any other row) and a build to compare against.
    #[test]
    fn options_add_connection_counts_the_ceiling_and_a_before_build() {
        let o =
            parse("--workloads b-spread --connections 2,16 --ceiling --before /x/bench").unwrap();
        assert_eq!(o.connections, vec![2, 16]);
        assert!(o.ceiling);
        assert_eq!(o.before, Some(PathBuf::from("/x/bench")));
        assert!(parse("").unwrap().connections.is_empty());
        for bad in [
            "--ceiling",
            "--workloads b-spread,a-a --ceiling",
            "--connections 0",
            "--connections 2,x",
        ] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
