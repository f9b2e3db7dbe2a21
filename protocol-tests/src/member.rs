//! A flow-runtime member as a separate process, so a test can freeze it (SIGSTOP: its heartbeats stop with
//! it, as in a long GC pause or a stalled VM), crash it (SIGKILL) and restart it, which no in-process stall
//! can do.
//!
//! The member is the `flow-member` binary of this crate: it runs a [`snapfence::snapshot::Flow`] of
//! [`Counter`] over the input topic and reports on stdout, one line per event:
//!
//! | line | meaning |
//! |---|---|
//! | `ready` | joined (the flow started) |
//! | `held P P ...` | the partitions it holds changed to these |
//! | `persisting N` | a flush of N changed keys starts now (a transaction is about to begin) |
//! | `persisted MICROS` | that flush succeeded after MICROS microseconds |
//! | `committed KEY COUNT HASH` | that key's snapshot with this tally was committed by the flush |
//! | `stats FENCES REACQUIRED REJOINS REBALANCES` | its [`FlowStats`] changed to these |
//! | `disk RESUMED FALLBACKS READ` | its on-disk state's [`DiskStats`](snapfence::snapshot::DiskStats) changed: image reads resumed from a checkpoint, images read whole for a reason other than a missing image, records read at acquisitions, keys loaded from disk under a memory budget |
//! | `failed fenced=B producer_fenced=B ERROR` | persist, commit or poll failed; the process exits with status 2 |
//! | `stopped` | its stdin closed; it flushed, committed and exits with status 0 |
//! | `tasks N` | every 5 s: the tasks alive on its runtime (for the soak's leak check) |
//!
//! With `--routes`, every connection goes through the harness's fault proxy for this member (broker
//! address to proxy listener; an address without a route is refused, so nothing reaches a broker around
//! the proxy). It exits when its stdin closes (so it never outlives the test that started it; the parent-death
//! signal of [`crate::procs`] covers a crashed parent too).
//!
//! # References
//! - signal(7) (SIGSTOP cannot be caught: the whole process, heartbeat task included, freezes)

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use snapfence::consumer::{Assignor, GroupConfig, GroupConsumerConfig, GroupProtocol, OffsetReset};
use snapfence::net::{Client, ClientConfig, DialFuture, Dialer, TcpDialer};
use snapfence::snapshot::{
    FencePolicy, Flow, FlowConfig, FlowStats, Fold, PersistenceMode, SnapshotConfig,
};

use crate::procs;
use crate::tally::{Counter, Echo, Tally};

/// What a member runs: its group, topics, protocol, persistence mode and timings.
#[derive(Debug, Clone)]
pub struct MemberArgs {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// The consumer group.
    pub group: String,
    /// The input topic.
    pub input: String,
    /// The snapshot topic (same partition count as the input).
    pub snapshots: String,
    /// The transactional id prefix of the snapshot store.
    pub txn_prefix: String,
    /// `true`: the KIP-848 consumer protocol; `false`: classic (cooperative-sticky, or eager with
    /// [`eager`](Self::eager)).
    pub consumer_protocol: bool,
    /// Classic only: the eager range assignor (every member revokes everything at each rebalance)
    /// instead of cooperative-sticky.
    pub eager: bool,
    /// Fenced (transactional) or not.
    pub transactional: bool,
    /// Classic session timeout (the consumer protocol's comes from the broker).
    pub session_timeout: Duration,
    /// How often dirty keys are flushed.
    pub persist_every: Duration,
    /// How often the committable offset is committed.
    pub commit_every: Duration,
    /// The recovery stall deadline (transactional mode).
    pub recovery_stall_timeout: Duration,
    /// Broker address to the proxy listener to dial instead (empty: connect directly).
    pub routes: Vec<(String, String)>,
    /// [`FencePolicy::Recover`] (a spurious fence is recovered in place, the member keeps running)
    /// instead of [`FencePolicy::Stop`] (every refused commit ends the member).
    pub recover: bool,
    /// Keep the snapshots in the PostgreSQL database at this URL instead of the snapshot topic
    /// (`FlowConfig::postgres`, tables `snapfence_*`, rows keyed by `txn_prefix`). The member connects
    /// to it directly, not through the routes.
    pub postgres: Option<String>,
    /// Emit one output per input event to this topic ([`crate::tally::Echo`]), riding with the key's
    /// snapshot (exactly once in the transactional mode, at least once in the plain one).
    pub output: Option<String>,
    /// A pause between saying `persisting` and starting the flush (zero: none). A harness that freezes
    /// the member when it reads that line then always stops it before the flush's writes leave, where a
    /// store whose writes go out at once (the PostgreSQL store) would otherwise often finish first.
    pub flush_pause: Duration,
    /// Keep the state on disk under this directory (`StateConfig::Disk`, state version 1).
    pub state_dir: Option<std::path::PathBuf>,
    /// With [`MemberArgs::state_dir`]: the state's memory budget in bytes
    /// (`DiskState::memory_budget`; `None`, every key loaded at acquisition).
    pub memory_budget: Option<u64>,
}

/// Dials each broker address through its route, and refuses addresses without one.
#[derive(Debug)]
struct Routed(HashMap<String, String>);

impl Dialer for Routed {
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a> {
        match self.0.get(addr) {
            Some(local) => tcp.connect(local),
            None => {
                Box::pin(async move { Err(std::io::Error::other(format!("{addr} has no route"))) })
            }
        }
    }
}

impl MemberArgs {
    /// Defaults for everything but the names: classic, transactional, 6 s session, flush every 300 ms,
    /// commit every second, a 30 s recovery deadline.
    pub fn new(bootstrap: &str, group: &str, input: &str, snapshots: &str, prefix: &str) -> Self {
        MemberArgs {
            bootstrap: bootstrap.into(),
            group: group.into(),
            input: input.into(),
            snapshots: snapshots.into(),
            txn_prefix: prefix.into(),
            consumer_protocol: false,
            eager: false,
            transactional: true,
            session_timeout: Duration::from_secs(6),
            persist_every: Duration::from_millis(300),
            commit_every: Duration::from_secs(1),
            recovery_stall_timeout: Duration::from_secs(30),
            routes: Vec::new(),
            recover: false,
            postgres: None,
            output: None,
            flush_pause: Duration::ZERO,
            state_dir: None,
            memory_budget: None,
        }
    }

    /// The command line `flow-member` parses back with [`MemberArgs::parse`].
    pub fn to_args(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        [
            ("--bootstrap", self.bootstrap.clone()),
            ("--group", self.group.clone()),
            ("--input", self.input.clone()),
            ("--snapshots", self.snapshots.clone()),
            ("--txn-prefix", self.txn_prefix.clone()),
            (
                "--protocol",
                if self.consumer_protocol {
                    "consumer"
                } else if self.eager {
                    "eager"
                } else {
                    "classic"
                }
                .into(),
            ),
            (
                "--mode",
                if self.transactional {
                    "transactional"
                } else {
                    "plain"
                }
                .into(),
            ),
            ("--session-timeout-ms", ms(self.session_timeout)),
            ("--persist-every-ms", ms(self.persist_every)),
            ("--commit-every-ms", ms(self.commit_every)),
            ("--recovery-stall-ms", ms(self.recovery_stall_timeout)),
            ("--flush-pause-ms", ms(self.flush_pause)),
            (
                "--fence-policy",
                if self.recover { "recover" } else { "stop" }.into(),
            ),
            ("--postgres", self.postgres.clone().unwrap_or_default()),
            ("--output", self.output.clone().unwrap_or_default()),
            (
                "--state-dir",
                self.state_dir
                    .as_ref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
            ),
            (
                "--memory-budget",
                self.memory_budget
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
            ),
            (
                "--routes",
                self.routes
                    .iter()
                    .map(|(a, b)| format!("{a}={b}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }

    /// Parses what [`MemberArgs::to_args`] wrote (the program name already removed).
    pub fn parse(args: &[String]) -> Result<MemberArgs, String> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
            map.insert(k.trim_start_matches("--").to_owned(), v.clone());
        }
        let text = |k: &str| {
            map.get(k)
                .cloned()
                .ok_or_else(|| format!("--{k} is required"))
        };
        let ms = |k: &str| -> Result<Duration, String> {
            text(k)?
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|e| format!("--{k}: {e}"))
        };
        let mut a = MemberArgs::new(
            &text("bootstrap")?,
            &text("group")?,
            &text("input")?,
            &text("snapshots")?,
            &text("txn-prefix")?,
        );
        (a.consumer_protocol, a.eager) = match text("protocol")?.as_str() {
            "consumer" => (true, false),
            "classic" => (false, false),
            "eager" => (false, true),
            p => return Err(format!("--protocol {p}: want classic, eager or consumer")),
        };
        a.transactional = match text("mode")?.as_str() {
            "transactional" => true,
            "plain" => false,
            m => return Err(format!("--mode {m}: want transactional or plain")),
        };
        a.session_timeout = ms("session-timeout-ms")?;
        a.persist_every = ms("persist-every-ms")?;
        a.commit_every = ms("commit-every-ms")?;
        a.recovery_stall_timeout = ms("recovery-stall-ms")?;
        if map.contains_key("flush-pause-ms") {
            a.flush_pause = ms("flush-pause-ms")?;
        }
        a.recover = match map.get("fence-policy").map(String::as_str) {
            None | Some("stop") => false,
            Some("recover") => true,
            Some(p) => return Err(format!("--fence-policy {p}: want stop or recover")),
        };
        a.postgres = map.get("postgres").filter(|u| !u.is_empty()).cloned();
        a.output = map.get("output").filter(|t| !t.is_empty()).cloned();
        a.state_dir = map
            .get("state-dir")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from);
        a.memory_budget = match map.get("memory-budget").map(String::as_str) {
            None | Some("") => None,
            Some(b) => Some(b.parse().map_err(|e| format!("--memory-budget {b}: {e}"))?),
        };
        for route in map
            .get("routes")
            .map(String::as_str)
            .unwrap_or_default()
            .split(',')
            .filter(|r| !r.is_empty())
        {
            let (from, to) = route
                .split_once('=')
                .ok_or_else(|| format!("--routes: {route:?} is not ADDR=ADDR"))?;
            a.routes.push((from.to_owned(), to.to_owned()));
        }
        Ok(a)
    }

    /// The flow's configuration.
    pub fn flow_config(&self) -> FlowConfig {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = self.session_timeout;
        group.heartbeat_interval = (self.session_timeout / 4).max(Duration::from_millis(200));
        // Well above the session timeout, so a frozen member is evicted by its session, not by its own
        // poll timer (which a frozen process cannot run anyway).
        group.max_poll_interval = self.session_timeout * 5;
        if self.consumer_protocol {
            group.protocol = GroupProtocol::Consumer {
                server_assignor: None,
            };
        } else if self.eager {
            group.protocol = GroupProtocol::Classic {
                assignors: vec![Assignor::Range],
            };
        }
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        let mut snapshots = SnapshotConfig::new(&self.snapshots, &self.txn_prefix);
        snapshots.recovery_stall_timeout = Some(self.recovery_stall_timeout);
        let mut c = FlowConfig::new(consumer, &self.input, snapshots);
        c.mode = if self.transactional {
            PersistenceMode::Transactional
        } else {
            PersistenceMode::NonTransactional
        };
        c.persist_every = self.persist_every;
        c.commit_offsets_interval = self.commit_every;
        // The campaign's supervisor counts a fenced zombie by its exit (a refused commit stops the
        // member, as kafka-flow's does); the tolerant default is exercised by tests/storm.rs.
        // With `recover`, the tolerant default: a spurious fence must not end the member.
        c.fence_policy = if self.recover {
            FencePolicy::Recover
        } else {
            FencePolicy::Stop
        };
        c.postgres = self
            .postgres
            .as_deref()
            .map(snapfence::snapshot::postgres::PgStoreConfig::new);
        if let Some(dir) = &self.state_dir {
            let mut disk = snapfence::snapshot::DiskState::new(dir, 1);
            disk.memory_budget = self.memory_budget;
            c.state = snapfence::snapshot::StateConfig::Disk(disk);
        }
        if !self.routes.is_empty() {
            // Through the fault proxy a lost answer is resent after the request timeout: keep it short
            // enough that a round sees the resend.
            c.snapshots.producer.request_timeout = Duration::from_secs(5);
        }
        c
    }

    /// The client configuration: through the routes when there are any.
    pub fn client_config(&self) -> ClientConfig {
        let c = ClientConfig::new(&self.bootstrap);
        if self.routes.is_empty() {
            c
        } else {
            c.with_dialer(Routed(self.routes.iter().cloned().collect()))
        }
    }
}

/// The body of the `flow-member` binary; returns its exit status. Runs until stdin closes or the flow
/// fails.
pub async fn run_member(args: MemberArgs, out: &mut (dyn Write + Send)) -> i32 {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            stop.store(true, Ordering::SeqCst);
            // The final flush gets a few seconds; a member stuck on a dead cluster must still go away.
            std::thread::sleep(Duration::from_secs(10));
            std::process::exit(0);
        });
    }
    let mut say = |line: String| {
        // A closed stdout means the parent is gone; stdin closes too, so exiting is already under way.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let client = match Client::connect(args.client_config()).await {
        Ok(c) => c,
        Err(e) => {
            say(format!("failed fenced=false connect: {e}"));
            return 2;
        }
    };
    match &args.output {
        None => match Flow::start(client, args.flow_config(), Counter).await {
            Ok(flow) => drive(flow, &args, &stop, out).await,
            Err(e) => {
                say(failed(&e));
                2
            }
        },
        Some(topic) => {
            let echo = Echo {
                topic: Arc::from(topic.as_str()),
            };
            match Flow::start(client, args.flow_config(), echo).await {
                Ok(flow) => drive(flow, &args, &stop, out).await,
                Err(e) => {
                    say(failed(&e));
                    2
                }
            }
        }
    }
}

/// The `failed` line of an error.
fn failed(e: &snapfence::snapshot::FlowError) -> String {
    format!(
        "failed fenced={} producer_fenced={} {e}",
        e.is_fenced(),
        e.is_producer_fenced()
    )
}

/// The member's loop over a started flow: reports, persists, commits and polls until `stop` or a
/// failure; returns the exit status.
async fn drive<F: Fold<State = Tally>>(
    mut flow: Flow<F>,
    args: &MemberArgs,
    stop: &AtomicBool,
    out: &mut (dyn Write + Send),
) -> i32 {
    let mut say = |line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say("ready".into());
    let mut held: Vec<i32> = Vec::new();
    let mut reported: HashMap<Bytes, Tally> = HashMap::new();
    let mut last_persist = Instant::now();
    let mut last_commit = Instant::now();
    let mut stats = FlowStats::default();
    let mut disk = snapfence::snapshot::DiskStats::default();
    let mut last_tasks: Option<Instant> = None;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        // A task leak shows as a count that climbs across rebalances; the soak samples this line.
        if last_tasks.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            last_tasks = Some(Instant::now());
            let alive = tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks();
            say(format!("tasks {alive}"));
        }
        // Flush before polling: a member thawed after a freeze acts on its stale state first, as a real
        // zombie whose flush timer fired during the pause does.
        if stopping || last_persist.elapsed() >= args.persist_every {
            last_persist = Instant::now();
            let mut now: BTreeMap<Bytes, Tally> = BTreeMap::new();
            for p in flow.partitions() {
                now.extend(flow.state(p).unwrap_or_default());
            }
            let changed: Vec<(Bytes, Tally)> = now
                .into_iter()
                .filter(|(k, t)| reported.get(k) != Some(t))
                .collect();
            if !changed.is_empty() {
                say(format!("persisting {}", changed.len()));
                if !args.flush_pause.is_zero() {
                    tokio::time::sleep(args.flush_pause).await;
                }
            }
            let flush_began = Instant::now();
            if let Err(e) = flow.persist().await {
                say(failed(&e));
                return 2;
            }
            // A fence recovered in place inside this flush dropped some partition's writes unflushed
            // and returned nothing: report none of this flush as committed (what did land is reported
            // after a later flush that finds the key unchanged since).
            let absorbed = flow.stats() != stats;
            if !changed.is_empty() && !absorbed {
                say(format!("persisted {}", flush_began.elapsed().as_micros()));
            }
            let changed = if absorbed { Vec::new() } else { changed };
            for (k, t) in changed {
                say(format!(
                    "committed {} {} {}",
                    String::from_utf8_lossy(&k),
                    t.count,
                    t.hash
                ));
                reported.insert(k, t);
            }
        }
        if stopping || last_commit.elapsed() >= args.commit_every {
            last_commit = Instant::now();
            if let Err(e) = flow.commit().await {
                say(failed(&e));
                return 2;
            }
        }
        if stopping {
            say("stopped".into());
            return 0;
        }
        if let Err(e) = flow.poll_once(Duration::from_millis(100)).await {
            say(failed(&e));
            return 2;
        }
        let now_stats = flow.stats();
        if now_stats != stats {
            stats = now_stats;
            say(format!(
                "stats {} {} {} {}",
                stats.fences_recovered, stats.reacquisitions, stats.rejoins, stats.rebalance_events
            ));
        }
        let now_disk = flow.disk_stats();
        if now_disk != disk {
            disk = now_disk;
            let fallbacks: u64 = disk
                .fallbacks
                .iter()
                .filter(|(why, _)| **why != "no_checkpoint")
                .map(|(_, n)| n)
                .sum();
            say(format!(
                "disk {} {} {} {}",
                disk.resumed, fallbacks, disk.records_read, disk.keys_loaded
            ));
        }
        let now_held = flow.partitions();
        if now_held != held {
            held = now_held;
            say(format!(
                "held {}",
                held.iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
    }
}

/// Separates the member's arguments in the environment variable [`MemberProcess::spawn_command_env`]
/// passes them in.
pub const ARG_SEPARATOR: char = '\u{1f}';

/// The member arguments a harness put into the environment variable `var`, if it did.
pub fn args_from_env(var: &str) -> Option<Vec<String>> {
    let v = std::env::var(var).ok()?;
    Some(v.split(ARG_SEPARATOR).map(str::to_owned).collect())
}

/// The whole `flow-member` program: parses `args` (without the program name), runs the member on its own
/// runtime, and exits with its status (64 for bad arguments).
pub fn member_main(args: &[String]) -> ! {
    let args = match MemberArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("flow-member: {e}");
            std::process::exit(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("flow-member: no runtime: {e}");
            std::process::exit(70);
        }
    };
    let code = runtime.block_on(run_member(args, &mut std::io::stdout()));
    std::process::exit(code)
}

/// What a member process has said so far.
#[derive(Debug, Clone, Default)]
pub struct MemberLog {
    /// Said `ready`.
    pub ready: bool,
    /// The partitions it last said it holds.
    pub held: Vec<i32>,
    /// Flushes of at least one key started.
    pub flushes: u64,
    /// How long its last successful flush of at least one key took.
    pub last_flush: Option<Duration>,
    /// Every committed snapshot it reported, as (key, tally).
    pub committed: Vec<(Bytes, Tally)>,
    /// Its `failed` line, if any.
    pub failure: Option<String>,
    /// Its last `stats` line: fences recovered in place, reacquisitions, rejoins, rebalance events.
    pub stats: [u64; 4],
    /// Its last `disk` line: image reads resumed from a checkpoint, fall-backs other than a missing
    /// image, records read at acquisitions, keys loaded from disk under a memory budget.
    pub disk: [u64; 4],
    /// Said `stopped`.
    pub stopped: bool,
    /// Its stdout closed (it exited or was killed).
    pub ended: bool,
    /// The tasks alive on its runtime, from its last `tasks` line.
    pub tasks: Option<u64>,
}

impl MemberLog {
    /// Whether it exited on a fence (the group's or a newer producer's): its `failed` line says so.
    pub fn fence_exit(&self) -> bool {
        self.failure
            .as_deref()
            .is_some_and(|f| f.contains("fenced=true"))
    }

    fn take_line(&mut self, line: &str) {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("ready") => self.ready = true,
            Some("held") => self.held = words.filter_map(|w| w.parse().ok()).collect(),
            Some("persisting") => self.flushes += 1,
            Some("persisted") => {
                self.last_flush = words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .map(Duration::from_micros);
            }
            Some("committed") => {
                let w: Vec<&str> = words.collect();
                if let [k, c, h] = w[..] {
                    if let (Ok(count), Ok(hash)) = (c.parse(), h.parse()) {
                        self.committed
                            .push((Bytes::copy_from_slice(k.as_bytes()), Tally { count, hash }));
                    }
                }
            }
            Some("failed") => self.failure = Some(line.to_owned()),
            Some("stats") => {
                for (slot, w) in self.stats.iter_mut().zip(words) {
                    *slot = w.parse().unwrap_or(*slot);
                }
            }
            Some("disk") => {
                for (slot, w) in self.disk.iter_mut().zip(words) {
                    *slot = w.parse().unwrap_or(*slot);
                }
            }
            Some("stopped") => self.stopped = true,
            Some("tasks") => self.tasks = words.next().and_then(|w| w.parse().ok()),
            _ => {}
        }
    }
}

struct Shared {
    log: Mutex<MemberLog>,
    /// Set by [`MemberProcess::freeze_in_next_flush`] (microseconds; `u64::MAX`: not armed): the reader
    /// SIGSTOPs the member that long after it says a flush starts, so its transaction is frozen wherever
    /// it was.
    freeze_on_flush: AtomicU64,
    /// The reader froze it in a flush.
    frozen_in_flush: AtomicBool,
}

/// A running `flow-member` process. Dropping it kills it.
pub struct MemberProcess {
    child: Child,
    reader: Option<std::thread::JoinHandle<()>>,
    stdin: Option<ChildStdin>,
    shared: Arc<Shared>,
    paused: bool,
}

impl MemberProcess {
    /// Starts `program` (the `flow-member` binary; from a test of this crate,
    /// `env!("CARGO_BIN_EXE_flow-member")`) with `args`, in its own process group, killed if this process
    /// dies.
    pub fn spawn(program: &Path, args: &MemberArgs) -> std::io::Result<MemberProcess> {
        Self::spawn_command(program, &args.to_args())
    }

    /// Starts `program` with exactly `argv` (for a program that takes a subcommand before the member's
    /// arguments, as the campaign binary does).
    pub fn spawn_command(program: &Path, argv: &[String]) -> std::io::Result<MemberProcess> {
        Self::spawn_command_env(program, argv, None)
    }

    /// [`spawn_command`](Self::spawn_command) with the member's own arguments, `args`, either appended to
    /// `argv` or (with `env_var`) passed in that environment variable, joined by [`ARG_SEPARATOR`] (for
    /// a program whose command line something else parses: a test binary that runs as a member, read
    /// back with [`args_from_env`]).
    pub fn spawn_command_env(
        program: &Path,
        argv: &[String],
        env_var: Option<(&str, &[String])>,
    ) -> std::io::Result<MemberProcess> {
        let mut cmd = Command::new(program);
        if let Some((var, args)) = env_var {
            cmd.env(var, args.join(&ARG_SEPARATOR.to_string()));
        }
        cmd.args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = procs::spawn(cmd)?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("member stdout not piped"))?;
        let shared = Arc::new(Shared {
            log: Mutex::new(MemberLog::default()),
            freeze_on_flush: AtomicU64::new(u64::MAX),
            frozen_in_flush: AtomicBool::new(false),
        });
        let pid = child.id();
        let reader = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("member-{pid}"))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        if line.starts_with("persisting") {
                            let delay = shared.freeze_on_flush.swap(u64::MAX, Ordering::SeqCst);
                            if delay != u64::MAX {
                                std::thread::sleep(Duration::from_micros(delay));
                                procs::signal_group(pid, libc::SIGSTOP);
                                shared.frozen_in_flush.store(true, Ordering::SeqCst);
                            }
                        }
                        lock(&shared.log).take_line(&line);
                    }
                    lock(&shared.log).ended = true;
                })?
        };
        Ok(MemberProcess {
            reader: Some(reader),
            stdin: child.stdin.take(),
            child,
            shared,
            paused: false,
        })
    }

    /// The process id (also its process group).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it has said so far.
    pub fn log(&self) -> MemberLog {
        lock(&self.shared.log).clone()
    }

    /// Takes the committed snapshots it reported so far out of its log, so a harness that runs for hours
    /// checks them as they come instead of keeping every one.
    pub fn take_committed(&self) -> Vec<(Bytes, Tally)> {
        std::mem::take(&mut lock(&self.shared.log).committed)
    }

    /// The partitions it last said it holds (empty while frozen or dead is not implied: it is what it said).
    pub fn held(&self) -> Vec<i32> {
        lock(&self.shared.log).held.clone()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether it is frozen by [`MemberProcess::pause`].
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// SIGSTOP: the whole process freezes, heartbeats included.
    pub fn pause(&mut self) {
        procs::signal_group(self.pid(), libc::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        procs::signal_group(self.pid(), libc::SIGCONT);
        self.paused = false;
    }

    /// SIGKILL now, and reap.
    pub fn kill(&mut self) {
        procs::signal_group(self.pid(), libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Arms a SIGSTOP for `delay` after the member next says a flush of changed keys starts (a flush's
    /// transaction takes a few milliseconds on a local cluster: begin, produce, offsets, end), so a test
    /// can look at the frozen transaction and then kill or thaw the member.
    /// [`frozen_in_flush`](Self::frozen_in_flush) tells when it happened.
    pub fn freeze_in_next_flush(&mut self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX - 1);
        self.shared.frozen_in_flush.store(false, Ordering::SeqCst);
        self.shared.freeze_on_flush.store(micros, Ordering::SeqCst);
        self.paused = true;
    }

    /// True once the freeze armed by [`freeze_in_next_flush`](Self::freeze_in_next_flush) happened.
    pub fn frozen_in_flush(&self) -> bool {
        self.shared.frozen_in_flush.load(Ordering::SeqCst)
    }

    /// Disarms a freeze that has not happened yet, and thaws the member either way.
    pub fn disarm_and_resume(&mut self) {
        self.shared
            .freeze_on_flush
            .store(u64::MAX, Ordering::SeqCst);
        self.resume();
    }

    /// Everything it said, once it has exited: waits for its stdout to be read to the end. Kills it first
    /// if it still runs.
    pub fn final_log(&mut self) -> MemberLog {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }

    /// Closes its stdin, so it flushes, commits and exits (thawing it first if frozen), without waiting.
    pub fn request_stop(&mut self) {
        if self.paused {
            self.resume();
        }
        self.stdin = None;
    }

    /// [`request_stop`](Self::request_stop), then waits up to `grace` for the exit, then kills it.
    /// Returns everything it said; `stopped` tells whether it stopped on its own.
    pub fn close(mut self, grace: Duration) -> MemberLog {
        self.request_stop();
        let until = Instant::now() + grace;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.final_log()
    }
}

impl Drop for MemberProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's arguments survive the trip through the command line unchanged, and a missing value or
    /// option is refused with its name.
    #[test]
    fn args_round_trip_and_bad_ones_are_named() {
        let mut a = MemberArgs::new("127.0.0.1:1", "g", "in", "snap", "p");
        a.consumer_protocol = true;
        a.transactional = false;
        a.session_timeout = Duration::from_millis(3500);
        a.recover = true;
        a.routes = vec![("127.0.0.1:9092".into(), "127.0.0.1:40001".into())];
        a.state_dir = Some("/var/lib/member".into());
        a.memory_budget = Some(4096);
        let b = MemberArgs::parse(&a.to_args()).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        let mut eager = a.clone();
        (eager.consumer_protocol, eager.eager) = (false, true);
        let back = MemberArgs::parse(&eager.to_args()).unwrap();
        assert!(back.eager && !back.consumer_protocol);
        let mut bad = a.to_args();
        bad.truncate(bad.len() - 1);
        assert!(MemberArgs::parse(&bad)
            .unwrap_err()
            .contains("needs a value"));
        let missing = MemberArgs::parse(&[]).unwrap_err();
        assert!(missing.contains("--bootstrap"), "{missing}");
    }

    /// Every line kind a member process prints is read into its log, and only a fence, not a timeout,
    /// counts as a fence exit.
    #[test]
    fn the_log_reads_every_line_kind() {
        let mut log = MemberLog::default();
        for l in [
            "ready",
            "held 0 3",
            "persisting 2",
            "persisted 1500",
            "committed k1 4 99",
            "stats 2 1 1 5",
            "failed fenced=false producer_fenced=true stale",
            "stopped",
            "tasks 12",
        ] {
            log.take_line(l);
        }
        assert!(log.ready && log.stopped);
        assert_eq!(log.held, vec![0, 3]);
        assert_eq!(log.flushes, 1);
        assert_eq!(log.last_flush, Some(Duration::from_micros(1500)));
        assert_eq!(
            log.committed,
            vec![(Bytes::from_static(b"k1"), Tally { count: 4, hash: 99 })]
        );
        assert_eq!(log.stats, [2, 1, 1, 5]);
        assert_eq!(log.tasks, Some(12));
        assert!(log.fence_exit());
        log.failure = Some("failed fenced=false producer_fenced=false timeout".into());
        assert!(!log.fence_exit());
    }
}
