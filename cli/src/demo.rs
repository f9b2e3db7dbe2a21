//! `demo`: the handover story of snapfence's issue #732, told on screen against a real broker, once with the
//! fence and once without it.
//!
//! Owner A folds an input partition and persists per-key snapshots. A runs as a process of its own (see
//! [`owner`]) and is paused with SIGSTOP: its heartbeats stop with everything else, so the group
//! coordinator evicts it once its session timeout passes. Fenced, the story pauses A twice. First A
//! resumes before anyone else took the partition and writes: the group coordinator refuses the offset
//! commit in A's transaction (the generation fence, KIP-447). Then A rejoins, is paused again, owner B
//! takes over, recovers, folds and commits, and A resumes and flushes the state it still holds, now stale:
//! B's InitProducerId already bumped the partition's producer epoch, so that fence fires first. A fresh
//! owner C recovers and its state is compared with a fold of all input from scratch. Unfenced, A is
//! paused once the same way, its late write lands after B's on the last-write-wins snapshot topic, and C
//! folds onto stale state, for good: the committed offset is already past the events B folded.
//!
//! The same story is the library-level test `protocol-tests/tests/flow.rs` (three broker versions, no
//! narration). This one is written for a reader: every step says what it models and what the broker
//! answered, and the run ends with a verdict and an exit status (0 only when the fenced run is correct and
//! the unfenced one shows the damage).
//!
//! Without `--bootstrap`, the demo starts one Kafka 4.x node itself through the kafka-fixture crate and
//! kills it at the end.
//!
//! # References
//! - KIP-447 (generation-fenced TxnOffsetCommit), KIP-98 (transactions, producer epochs, read_committed);
//!   `docs/fencing.md`

mod gate;
mod outputs;
mod owner;
mod tally;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use snapfence::consumer::{
    committed_offsets, list_offsets, GroupConfig, GroupConsumerConfig, OffsetReset, OffsetSpec,
    TopicPartition,
};
use snapfence::net::{Client, ClientConfig};

use crate::security::SecurityArgs;
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::{IsolationLevel, Record};
use snapfence::snapshot::{
    BoxError, Change, Flow, FlowConfig, Fold, Outputs, PersistenceMode, SnapshotConfig,
};

use crate::error::CliError;
use crate::kafka::Cluster;
use crate::{Format, Io};

pub(crate) use owner::serve as serve_owner;
pub use owner::OwnerArgs;
use owner::{account, Fence, OwnerProcess, Refusal};

/// The arguments of `demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// On a cluster named with --bootstrap, leave the demo's topics behind (they are deleted by default).
    #[arg(long)]
    pub keep_topics: bool,
    /// Which story to tell: `handover` (a stale owner's late snapshot write) or `outputs` (an owner
    /// killed mid-wave and a zombie, and how often a read_committed reader sees each output).
    #[arg(long, value_enum, default_value_t = DemoStory::Handover)]
    pub story: DemoStory,
}

/// The demo's stories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DemoStory {
    /// A stale owner's late snapshot write, refused by the fence and damaging without it (issue #732).
    #[default]
    Handover,
    /// Exactly-once output: an owner killed mid-wave, a zombie's stale flush, and a read_committed count
    /// of each deposit's confirmations (issue 33).
    Outputs,
}

/// The group's `max.poll.interval`: long, because the eviction shown is the session timeout's (a paused
/// process sends no heartbeats), not a live member's that stopped polling.
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// The lowest session timeout the demo uses even where the broker allows less: a busy machine can delay
/// a healthy member's heartbeats by a second, and a spurious eviction would tell another story.
const SESSION_FLOOR: Duration = Duration::from_secs(2);
/// The session timeout of owners B and C, which are never paused.
const OTHERS_SESSION: Duration = Duration::from_secs(10);
/// Kafka's default `group.min.session.timeout.ms`, used when the broker does not say.
const SESSION_DEFAULT_MIN: Duration = Duration::from_secs(6);
/// The width prose is wrapped to.
const WIDTH: usize = 100;
/// How long any one step may take before the demo gives up on it.
const STEP_LIMIT: Duration = Duration::from_secs(60);

// ---- the fold ------------------------------------------------------------------------------------

/// One account: how many deposits, their sum, and the number of the last one folded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Account {
    deposits: u64,
    balance: i64,
    last: u64,
}

impl Account {
    /// Folds one deposit, written as `"<number>:<amount>"`. Anything else leaves the account as it was.
    fn apply(self, value: &[u8]) -> Account {
        let parsed = std::str::from_utf8(value).ok().and_then(|s| {
            let (n, amount) = s.split_once(':')?;
            Some((n.parse::<u64>().ok()?, amount.parse::<i64>().ok()?))
        });
        match parsed {
            Some((n, amount)) => Account {
                deposits: self.deposits + 1,
                balance: self.balance + amount,
                last: n,
            },
            None => self,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{:>2} deposits, balance {:>5}, last #{}",
            self.deposits, self.balance, self.last
        )
    }
}

/// The output the outputs story's fold emits for one deposit: which input event it confirms (the
/// deposit's offset on the input partition, what a reader counts outputs by), the deposit's number, and
/// the balance after it. Written as `"<offset> confirms #<deposit>, balance <balance>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Confirmation {
    offset: i64,
    deposit: u64,
    balance: i64,
}

impl Confirmation {
    /// The record value.
    fn encode(&self) -> String {
        format!(
            "{} confirms #{}, balance {}",
            self.offset, self.deposit, self.balance
        )
    }

    /// Reads a value written by [`Confirmation::encode`]; `None` for anything else.
    fn decode(value: &[u8]) -> Option<Confirmation> {
        let text = std::str::from_utf8(value).ok()?;
        let (offset, rest) = text.split_once(" confirms #")?;
        let (deposit, balance) = rest.split_once(", balance ")?;
        Some(Confirmation {
            offset: offset.parse().ok()?,
            deposit: deposit.parse().ok()?,
            balance: balance.parse().ok()?,
        })
    }
}

/// The demo's fold: deposits per account. In the outputs story it also confirms each deposit it folds
/// with one record on the confirmations topic (see [`Confirmation`]).
#[derive(Debug, Clone, Default)]
struct Ledger {
    /// Where each deposit's confirmation goes; `None`: the fold emits nothing (the handover story).
    confirmations: Option<Arc<str>>,
    /// The numbers of the deposits this fold confirmed, in the order it folded them: which events an
    /// owner folded itself, and which its replay skipped because a recovered snapshot covered them.
    confirmed: Arc<Mutex<Vec<u64>>>,
}

impl Ledger {
    /// The fold of the outputs story: it confirms every deposit on `topic`.
    fn confirming(topic: &str) -> Ledger {
        Ledger {
            confirmations: Some(Arc::from(topic)),
            confirmed: Arc::default(),
        }
    }

    /// The numbers of the deposits confirmed so far.
    fn confirmed(&self) -> Vec<u64> {
        self.confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Fold for Ledger {
    type State = Account;

    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<Account>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        let before = state.take().unwrap_or_default();
        let after = before.apply(event.value.as_deref().unwrap_or_default());
        *state = Some(after);
        if let (Some(topic), true) = (&self.confirmations, after != before) {
            let confirmation = Confirmation {
                offset: event.offset,
                deposit: after.last,
                balance: after.balance,
            };
            out.send(
                ProducerRecord::new(Arc::clone(topic), Some(Bytes::from(confirmation.encode())))
                    .key(key.clone()),
            );
            self.confirmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(after.last);
        }
        Change::Update
    }

    fn encode(&self, a: &Account) -> Bytes {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&a.deposits.to_be_bytes());
        v.extend_from_slice(&a.balance.to_be_bytes());
        v.extend_from_slice(&a.last.to_be_bytes());
        Bytes::from(v)
    }

    fn decode(&self, b: &[u8]) -> Result<Account, BoxError> {
        let b: &[u8; 24] = b
            .try_into()
            .map_err(|_| "an account snapshot is 24 bytes")?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            w
        };
        Ok(Account {
            deposits: u64::from_be_bytes(word(0)),
            balance: i64::from_be_bytes(word(1)),
            last: u64::from_be_bytes(word(2)),
        })
    }
}

// ---- running it ----------------------------------------------------------------------------------

/// Runs `demo`: on the cluster at `bootstrap`, or on a broker it starts itself.
pub(crate) async fn run(
    bootstrap: Option<&str>,
    security: &SecurityArgs,
    args: &DemoArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if format == Format::Json {
        return Err(CliError::Usage {
            message: "the demo tells a story in text; it has no JSON output".into(),
            hint: "leave out --format json; the last line is the verdict and the exit status says the same"
                .into(),
        });
    }
    if bootstrap.is_none() && security.is_set() {
        return Err(CliError::Usage {
            message: "SASL and TLS options apply to a cluster named with --bootstrap".into(),
            hint:
                "the broker the demo starts itself takes plain connections; name your cluster with \
                   --bootstrap, or leave the security options out"
                    .into(),
        });
    }
    // Before any broker starts: owner A is this executable, started again.
    let exe = owner::own_executable()?;
    // Before connecting: the closing summary reads what snapfence's metrics counted. Without a recorder
    // (another one is installed) the summary says so and the story is the same.
    let registry = crate::exporter::install().ok();
    let out = &mut *io.out;
    let title = match args.story {
        DemoStory::Handover => "a stale owner's late snapshot write, with and without the fence",
        DemoStory::Outputs => "each output exactly once, through a kill mid-wave and a zombie, with and without the fence",
    };
    if args.story == DemoStory::Outputs && security.uses_tls() {
        return Err(CliError::Usage {
            message: "the outputs story reads owner A's requests at the wire, which TLS hides"
                .into(),
            hint: "run it on a plaintext or SASL_PLAINTEXT listener, or run the handover story"
                .into(),
        });
    }
    writeln!(out, "snapfence demo: {title}\n")?;
    let (local, bootstrap) = match bootstrap {
        Some(b) => {
            writeln!(
                out,
                "Kafka: the cluster at {b} (from --bootstrap or SNAPFENCE_BOOTSTRAP)\n"
            )?;
            (None, b.to_owned())
        }
        None => {
            let spec = kafka_fixture::ClusterSpec::kafka4();
            writeln!(
                out,
                "Kafka: starting a single-node Kafka {} broker on this machine with the kafka-fixture crate",
                spec.version
            )?;
            out.flush()?;
            let kafka = start_broker(spec, out).await?;
            let bootstrap = kafka.bootstrap();
            writeln!(
                out,
                "       ready at {bootstrap}{}\n",
                kafka
                    .started_in()
                    .map(|d| format!(" after {:.1} s", d.as_secs_f64()))
                    .unwrap_or_default()
            )?;
            (Some(kafka), bootstrap)
        }
    };
    if args.story == DemoStory::Outputs {
        let told = outputs::tell(&bootstrap, security, &exe, args, local.is_none(), out).await;
        if let Some(kafka) = local {
            // Dropping the cluster kills the JVM and deletes its data; both block.
            let _ = tokio::task::spawn_blocking(move || drop(kafka)).await;
            writeln!(out, "(the local broker is stopped and its data deleted)\n")?;
        }
        let (fenced, unfenced) = told?;
        // The verdict stays the last line, as the handover story's.
        return outputs::verdict(&fenced, &unfenced, out);
    }
    let told = tell(
        &bootstrap,
        security,
        &exe,
        args,
        local.is_none(),
        registry,
        out,
    )
    .await;
    if let Some(kafka) = local {
        // Dropping the cluster kills the JVM and deletes its data; both block.
        let _ = tokio::task::spawn_blocking(move || drop(kafka)).await;
        writeln!(out, "(the local broker is stopped and its data deleted)\n")?;
    }
    let (fenced, unfenced) = told?;
    // The verdict stays the last line (CI and scripts read it there).
    write!(
        out,
        "{}",
        tally::summary(&[
            ("run 1, fenced", &fenced.tally),
            ("run 2, unfenced", &unfenced.tally)
        ])
    )?;
    verdict(&fenced, &unfenced, out)
}

/// Starts the demo's own broker on a blocking thread and prints each slow step of the start (a first run
/// fetches the jars and records a class-data archive: up to a minute and a half) as it begins and ends.
///
/// The fixture reports through a channel to this task, which owns `out`: nothing on the starting thread
/// writes to the terminal, so no lock taken here or elsewhere can hold the start up.
async fn start_broker(
    spec: kafka_fixture::ClusterSpec,
    out: &mut dyn Write,
) -> Result<kafka_fixture::KafkaCluster, CliError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut start = tokio::task::spawn_blocking(move || {
        // Unbounded, but a start sends at most a handful of steps.
        let observe = move |p: kafka_fixture::Progress| {
            let _ = tx.send(p);
        };
        kafka_fixture::KafkaCluster::start_observed(&spec, &observe)
    });
    let fixture_error = |detail: String| CliError::Fixture { detail };
    let started = loop {
        tokio::select! {
            // Steps first, so every step sent before the start ended is printed before its outcome.
            biased;
            Some(step) = rx.recv() => {
                // "the broker is ready" is said below with its address.
                if !matches!(step, kafka_fixture::Progress::Done { step: kafka_fixture::Step::StartNodes, .. }) {
                    writeln!(out, "       {step}")?;
                    out.flush()?;
                }
            }
            joined = &mut start => break joined,
        }
    };
    while let Ok(step) = rx.try_recv() {
        if let kafka_fixture::Progress::KeptFailedStart { .. } = step {
            writeln!(out, "       {step}")?;
        }
    }
    started
        .map_err(|e| fixture_error(e.to_string()))?
        .map_err(|e| fixture_error(e.to_string()))
}

/// Both runs, and the cleanup of a user's cluster.
async fn tell(
    bootstrap: &str,
    security: &SecurityArgs,
    exe: &std::path::Path,
    args: &DemoArgs,
    users_cluster: bool,
    registry: Option<std::sync::Arc<crate::exporter::Registry>>,
    out: &mut dyn Write,
) -> Result<(Ending, Ending), CliError> {
    let setting = Setting::connect(bootstrap, security, exe, registry, out).await?;
    writeln!(
        out,
        "{}\n",
        wrap(
            "The setup: deposits to two accounts, alice and bob, arrive on a one-partition input topic. The \
             consumer group member that owns the partition folds them into a balance per account, persists \
             each account as a snapshot in a compacted topic (the last write of a key wins), and commits \
             the input offset its snapshots cover. A new owner recovers the snapshots and resumes at that \
             offset. The story runs twice: first with snapfence's fence (each snapshot write goes out in a \
             Kafka transaction together with an offset commit that the group coordinator checks against \
             the writer's group generation), then without it (plain idempotent writes, offsets committed \
             by the consumer). Owner A runs as a separate snapfence process, so that pausing it freezes \
             all of it, heartbeats included.",
            WIDTH
        )
        .join("\n")
    )?;
    let mut topics = Vec::new();
    let fenced = Story::new(&setting, PersistenceMode::Transactional, out, &mut topics)
        .await?
        .tell(1)
        .await;
    let unfenced = match &fenced {
        Ok(_) => Some(
            Story::new(
                &setting,
                PersistenceMode::NonTransactional,
                out,
                &mut topics,
            )
            .await?
            .tell(2)
            .await,
        ),
        Err(_) => None,
    };
    if users_cluster && !args.keep_topics {
        delete_topics(&setting, &topics, out).await?;
    }
    both(fenced, unfenced)
}

/// Deletes the demo's topics from a user's cluster (its consumer groups expire on their own).
async fn delete_topics(
    setting: &Setting,
    topics: &[String],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    for t in topics {
        if let Err(e) = snapfence::admin::delete_topic(&setting.client, t).await {
            writeln!(out, "(could not delete the demo topic {t}: {e})")?;
        }
    }
    if !topics.is_empty() {
        writeln!(
            out,
            "(the demo's topics are deleted; its consumer groups expire with offsets.retention.minutes)\n"
        )?;
    }
    Ok(())
}

/// The two runs' endings, or the first run's error (the unfenced run runs only after a fenced run
/// that ended).
fn both<E>(
    fenced: Result<E, CliError>,
    unfenced: Option<Result<E, CliError>>,
) -> Result<(E, E), CliError> {
    match (fenced, unfenced) {
        (Ok(fenced), Some(Ok(unfenced))) => Ok((fenced, unfenced)),
        (Err(e), _) | (_, Some(Err(e))) => Err(e),
        // Not reached: the unfenced run is skipped only after a fenced run that failed.
        (Ok(_), None) => Err(CliError::DemoFailed {
            detail: "the unfenced run did not run".into(),
        }),
    }
}

/// The session timeout the owners ask for: the broker's minimum, but not below [`SESSION_FLOOR`].
async fn session_timeout(cluster: &Cluster, out: &mut dyn Write) -> Result<Duration, CliError> {
    const NAME: &str = "group.min.session.timeout.ms";
    let broker = cluster.brokers().await?.into_iter().next();
    let min = match broker {
        Some(b) => cluster.broker_config(b, NAME).await.ok().flatten(),
        None => None,
    }
    .and_then(|v| v.parse::<u64>().ok())
    .map(Duration::from_millis);
    let session = min.unwrap_or(SESSION_DEFAULT_MIN).max(SESSION_FLOOR);
    let source = match min {
        Some(m) => format!("the broker's {NAME} is {} ms", m.as_millis()),
        None => format!(
            "the broker did not say its {NAME}; Kafka's default is {} ms",
            SESSION_DEFAULT_MIN.as_millis()
        ),
    };
    let line = format!(
        "Owner A's session timeout: {:.1} s ({source}; the demo uses no less than {} s, so a busy \
         machine does not evict A while it runs; owners B and C, never paused, use {} s)",
        session.as_secs_f64(),
        SESSION_FLOOR.as_secs(),
        session.max(OTHERS_SESSION).as_secs()
    );
    writeln!(out, "{}\n", wrap(&line, WIDTH).join("\n"))?;
    Ok(session)
}

/// What every run shares: the connection, the executable owner A runs from, the session timeout.
struct Setting {
    client: Client,
    cluster: Cluster,
    exe: PathBuf,
    session: Duration,
    /// How owner A's process must connect: as the demo itself does.
    security: SecurityArgs,
    /// This process's metrics, for the closing summary (`None` if no recorder could be installed).
    registry: Option<std::sync::Arc<crate::exporter::Registry>>,
}

impl Setting {
    /// Connects to `bootstrap` as the demo does and reads the session timeout the owners will use.
    async fn connect(
        bootstrap: &str,
        security: &SecurityArgs,
        exe: &std::path::Path,
        registry: Option<std::sync::Arc<crate::exporter::Registry>>,
        out: &mut dyn Write,
    ) -> Result<Setting, CliError> {
        let client = Client::connect(security.client_config(ClientConfig {
            client_id: "snapfence-demo".into(),
            ..ClientConfig::new(bootstrap)
        })?)
        .await
        .map_err(|e| CliError::from_net("connect", bootstrap, e))?;
        let cluster = Cluster {
            client: client.clone(),
            bootstrap: bootstrap.to_owned(),
        };
        let session = session_timeout(&cluster, out).await?;
        Ok(Setting {
            client,
            cluster,
            exe: exe.to_owned(),
            session,
            security: security.clone(),
            registry,
        })
    }
}

/// The names one run uses, apart from every other run on the cluster.
#[derive(Debug, Clone)]
struct Names {
    input: String,
    snapshots: String,
    group: String,
    txn_prefix: String,
    /// The outputs story's confirmations topic; `None` in the handover story.
    confirmations: Option<String>,
}

/// The settings of every owner of one run; owner A's process builds the same from its arguments.
fn flow_config(names: &Names, mode: PersistenceMode, session: Duration) -> FlowConfig {
    let mut group = GroupConfig::new(&names.group);
    group.session_timeout = session;
    group.heartbeat_interval = session / 4;
    group.max_poll_interval = MAX_POLL_INTERVAL;
    let mut consumer = GroupConsumerConfig::new(group);
    consumer.reader.reset = OffsetReset::Earliest;
    let mut snapshots = SnapshotConfig::new(&names.snapshots, &names.txn_prefix);
    snapshots.recovery_stall_timeout = Some(Duration::from_secs(30));
    let mut config = FlowConfig::new(consumer, &names.input, snapshots);
    config.mode = mode;
    // The demo shows each refused write to the user, so its owners report a refusal and stop (the
    // kafka-flow behaviour) instead of recovering from it in place.
    config.fence_policy = snapfence::snapshot::FencePolicy::Stop;
    config
}

fn verdict(fenced: &Ending, unfenced: &Ending, out: &mut dyn Write) -> Result<(), CliError> {
    let evicted_refused = fenced
        .evicted_write
        .as_ref()
        .and_then(LateWrite::refusal)
        .filter(|r| r.fence == Fence::Generation);
    let late_refused = fenced.late_write.refusal();
    let fenced_ok = evicted_refused.is_some() && late_refused.is_some() && fenced.correct();
    let damaged = unfenced.late_write.refusal().is_none() && !unfenced.correct();
    let damage = unfenced
        .rows
        .iter()
        .filter(|r| r.got != Some(r.want))
        .map(|r| format!("{} {}", r.key, r.damage()))
        .collect::<Vec<_>>()
        .join("; ");
    if let (true, true, Some(first), Some(late)) =
        (fenced_ok, damaged, evicted_refused, late_refused)
    {
        writeln!(
            out,
            "verdict: PASS: fenced, A's write after its eviction was refused by {} and its late write after \
             B's takeover by {}, and the recovered state equals a fold of all input; unfenced, A's late \
             write landed and the recovered state is wrong ({damage})",
            first.named(),
            late.named()
        )?;
        return Ok(());
    }
    let mut detail = String::new();
    match fenced.evicted_write.as_ref().map(LateWrite::refusal) {
        Some(Some(r)) if r.fence != Fence::Generation => detail.push_str(&format!(
            "fenced, A's write after its eviction was refused by {}, not by the generation fence; ",
            r.named()
        )),
        Some(None) => detail.push_str("fenced, A's write after its eviction was not refused; "),
        _ => {}
    }
    if late_refused.is_none() {
        detail.push_str("fenced, A's late write was not refused; ");
    }
    if !fenced.correct() {
        detail.push_str("fenced, the recovered state differs from a fold of all input; ");
    }
    if unfenced.late_write.refusal().is_some() {
        detail.push_str("unfenced, A's late write failed, so the damage could not be shown; ");
    }
    if unfenced.late_write.refusal().is_none() && unfenced.correct() {
        detail.push_str("unfenced, the recovered state came out right: the damage did not show; ");
    }
    let detail = detail.trim_end_matches("; ").to_owned();
    writeln!(out, "verdict: FAIL: {detail}")?;
    Err(CliError::DemoFailed { detail })
}

// ---- one run of the story ------------------------------------------------------------------------

/// What happened to a write of A's after its eviction.
enum LateWrite {
    Refused(Refusal),
    Landed {
        log_end_before: i64,
        log_end_after: i64,
    },
}

impl LateWrite {
    fn refusal(&self) -> Option<&Refusal> {
        match self {
            LateWrite::Refused(r) => Some(r),
            LateWrite::Landed { .. } => None,
        }
    }
}

impl Refusal {
    /// "the generation fence (UNKNOWN_MEMBER_ID)".
    fn named(&self) -> String {
        let fence = match self.fence {
            Fence::Generation => "the generation fence",
            Fence::ProducerEpoch => "the producer-epoch fence",
            Fence::Other => "a failed transaction",
        };
        match &self.code {
            Some(code) => format!("{fence} ({code})"),
            None => fence.to_owned(),
        }
    }
}

/// One key: what the fresh owner ended with, and what a fold of all input gives.
struct Row {
    key: String,
    got: Option<Account>,
    want: Account,
    /// The deposits of this key written after the one the fresh owner's state ends at.
    after_got: Vec<u64>,
}

impl Row {
    fn damage(&self) -> String {
        match self.got {
            None => "is missing".into(),
            Some(g) if g == self.want => "is right".into(),
            Some(g) if g.deposits < self.want.deposits && !self.after_got.is_empty() => format!(
                "lost {} deposit(s): {}",
                self.want.deposits - g.deposits,
                numbers(&self.after_got)
            ),
            Some(_) => "differs".into(),
        }
    }
}

/// How one run ended.
struct Ending {
    /// Fenced runs only: A's write after its eviction, before anyone else took the partition.
    evicted_write: Option<LateWrite>,
    /// A's write after B's takeover.
    late_write: LateWrite,
    rows: Vec<Row>,
    /// What snapfence's metrics counted during the run.
    tally: tally::RunTally,
}

impl Ending {
    fn correct(&self) -> bool {
        self.rows.iter().all(|r| r.got == Some(r.want))
    }
}

struct Story<'a> {
    setting: &'a Setting,
    mode: PersistenceMode,
    out: &'a mut dyn Write,
    began: Instant,
    names: Names,
    producer: Producer,
    /// Every deposit written, in order: (account, number, amount). The oracle.
    written: Vec<(&'static str, u64, i64)>,
}

impl<'a> Story<'a> {
    async fn new(
        setting: &'a Setting,
        mode: PersistenceMode,
        out: &'a mut dyn Write,
        topics: &mut Vec<String>,
    ) -> Result<Story<'a>, CliError> {
        let tag = match mode {
            PersistenceMode::Transactional => "fenced",
            _ => "unfenced",
        };
        let stamp = stamp();
        let producer = Producer::new(setting.client.clone(), ProducerConfig::default())
            .await
            .map_err(|e| failed("start the input producer", e))?;
        let story = Story {
            setting,
            mode,
            out,
            began: Instant::now(),
            names: Names {
                input: format!("snapfence-demo-{tag}-input-{stamp}"),
                snapshots: format!("snapfence-demo-{tag}-snapshots-{stamp}"),
                group: format!("snapfence-demo-{tag}-{stamp}"),
                txn_prefix: format!("snapfence-demo-{tag}-{stamp}"),
                confirmations: None,
            },
            producer,
            written: Vec::new(),
        };
        for (topic, configs) in [
            (&story.names.input, &[][..]),
            (&story.names.snapshots, &[("cleanup.policy", "compact")][..]),
        ] {
            snapfence::admin::create_topic(&story.setting.client, topic, 1, -1, configs)
                .await
                .map_err(|e| failed(&format!("create topic {topic}"), e))?;
            topics.push(topic.clone());
        }
        Ok(story)
    }

    fn fenced(&self) -> bool {
        self.mode == PersistenceMode::Transactional
    }

    /// One line of the story, stamped with the time since the run began, shown at once.
    /// Prose is wrapped to the screen width; lines that start with two spaces (tables) are kept as they are.
    fn say(&mut self, text: &str) -> Result<(), CliError> {
        say(&mut *self.out, self.began, text)
    }

    /// Owner B or C, in this process. Only A's session timeout is part of the story; theirs is longer, so
    /// a busy machine cannot evict them by accident.
    async fn owner(&self, name: &str) -> Result<Flow<Ledger>, CliError> {
        let session = self.setting.session.max(OTHERS_SESSION);
        Flow::start(
            self.setting.client.clone(),
            flow_config(&self.names, self.mode, session),
            Ledger::default(),
        )
        .await
        .map_err(|e| failed(&format!("start owner {name}"), e))
    }

    /// Writes `n` deposits for `account` and waits until the broker has them all.
    async fn deposit(&mut self, account: &'static str, n: usize) -> Result<String, CliError> {
        let mut deliveries = Vec::with_capacity(n);
        let first = self.written.len() as u64 + 1;
        for _ in 0..n {
            let number = self.written.len() as u64 + 1;
            let amount = 10 * number as i64;
            self.written.push((account, number, amount));
            let record = ProducerRecord::new(
                self.names.input.as_str(),
                Some(Bytes::from(format!("{number}:{amount}"))),
            )
            .key(Bytes::from_static(account.as_bytes()))
            .partition(0);
            deliveries.push(
                self.producer
                    .send(record)
                    .await
                    .map_err(|e| failed("write a deposit", e))?,
            );
        }
        for d in deliveries {
            d.await.map_err(|e| failed("write a deposit", e))?;
        }
        Ok(format!("#{first}-#{}", self.written.len()))
    }

    fn input_end(&self) -> i64 {
        self.written.len() as i64
    }

    fn expected(&self) -> BTreeMap<&'static str, Account> {
        let mut m: BTreeMap<&'static str, Account> = BTreeMap::new();
        for (account, number, amount) in &self.written {
            let a = m.entry(account).or_default();
            *a = a.apply(format!("{number}:{amount}").as_bytes());
        }
        m
    }

    async fn snapshot_log_end(&self) -> Result<i64, CliError> {
        let tp = TopicPartition::new(self.names.snapshots.as_str(), 0);
        list_offsets(
            &self.setting.client,
            std::slice::from_ref(&tp),
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .map_err(|e| failed("read the snapshot partition's log end", e))?
        .get(&tp)
        .copied()
        .ok_or_else(|| CliError::DemoFailed {
            detail: "the broker did not answer the snapshot partition's log end".into(),
        })
    }

    async fn committed(&self) -> Result<Option<i64>, CliError> {
        let tp = TopicPartition::new(self.names.input.as_str(), 0);
        Ok(committed_offsets(
            &self.setting.client,
            &self.names.group,
            std::slice::from_ref(&tp),
        )
        .await
        .map_err(|e| failed("read the group's committed offset", e))?
        .get(&tp)
        .copied()
        .flatten())
    }

    /// Whether the group coordinator lists `member` in the group.
    async fn lists(&self, member: &str) -> Result<bool, CliError> {
        let members = self
            .setting
            .cluster
            .group_members(&self.names.group)
            .await?;
        Ok(members.iter().any(|m| m == member))
    }

    /// Stops A and keeps it stopped until the coordinator has dropped A's member and the session timeout
    /// has passed since the stop. Returns when A was stopped.
    async fn pause(&mut self, a: &OwnerProcess, member: &str) -> Result<Instant, CliError> {
        let session = self.setting.session;
        // The eviction is shown as the member leaving the coordinator's list, so it must be on it first.
        let listed = Instant::now();
        while !self.lists(member).await? {
            if listed.elapsed() > STEP_LIMIT {
                return Err(CliError::DemoFailed {
                    detail: format!(
                        "the group coordinator does not list owner A's member {member}"
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        a.stop().await?;
        let stopped = Instant::now();
        let evicted_after = loop {
            if !self.lists(member).await? {
                break stopped.elapsed();
            }
            if stopped.elapsed() > session + STEP_LIMIT {
                return Err(CliError::DemoFailed {
                    detail: format!(
                        "owner A was stopped for {:.1} s and the group coordinator still lists its member",
                        stopped.elapsed().as_secs_f64()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Clearly past the session timeout, whatever the granularity of the coordinator's timer.
        if let Some(rest) = (session * 3 / 2).checked_sub(stopped.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        self.say(&format!(
            "A is stopped with SIGSTOP (pid {}): the whole process freezes, its heartbeat thread too, as \
             in a long GC pause or a stalled VM. {:.1} s after the stop the group coordinator no longer \
             lists A's member: its session timeout ({:.1} s) passed without a heartbeat, so A was evicted.",
            a.pid(),
            evicted_after.as_secs_f64(),
            session.as_secs_f64()
        ))?;
        Ok(stopped)
    }

    /// Resumes A, which flushes what it holds. `after` says what happened meanwhile.
    async fn resume_and_flush(
        &mut self,
        a: &mut OwnerProcess,
        stopped: Instant,
        holds: Option<Account>,
        after: &str,
    ) -> Result<LateWrite, CliError> {
        let log_end_before = self.snapshot_log_end().await?;
        let stopped_for = stopped.elapsed();
        a.resume().await?;
        self.say(&format!(
            "A has been stopped for {:.1} s, past its {:.1} s session timeout. {after} A resumes (SIGCONT), \
             unaware of all this, and flushes what it holds: alice at {}.",
            stopped_for.as_secs_f64(),
            self.setting.session.as_secs_f64(),
            short(holds)
        ))?;
        Ok(
            match a.write("persist", "owner A's write after resuming").await? {
                Some(r) => LateWrite::Refused(r),
                None => LateWrite::Landed {
                    log_end_before,
                    log_end_after: self.snapshot_log_end().await?,
                },
            },
        )
    }

    async fn tell(mut self, number: usize) -> Result<Ending, CliError> {
        let title = if self.fenced() {
            "fenced: snapshots written in transactions checked against the group generation"
        } else {
            "unfenced: plain idempotent snapshot writes, offsets committed by the consumer"
        };
        writeln!(self.out, "== Run {number} of 2, {title} ==")?;
        let counted_before = self.setting.registry.as_deref().map(tally::TxnTally::read);
        self.say(&format!(
            "Topics: input {} and snapshots {} (compacted), one partition each.",
            self.names.input, self.names.snapshots
        ))?;

        // 1. A owns the partition, folds, persists, commits.
        let alice = self.deposit("alice", 5).await?;
        let bob = self.deposit("bob", 5).await?;
        self.say(&format!(
            "{} deposits written to the input: {alice} for alice, {bob} for bob.",
            self.written.len()
        ))?;
        let mut a = OwnerProcess::start(
            &self.setting.exe,
            &self.setting.cluster.bootstrap,
            &self.names,
            !self.fenced(),
            self.setting.session,
            &self.setting.security,
        )
        .await?;
        let held = a
            .catch_up(self.input_end(), "owner A joining and folding")
            .await?;
        for (command, step) in [
            ("persist", "owner A's first persist"),
            ("commit", "owner A's first commit"),
        ] {
            if let Some(r) = a.write(command, step).await? {
                return Err(failed(step, r.error));
            }
        }
        let committed = self.committed().await?;
        self.say(&format!(
            "Owner A, a snapfence process of its own (pid {}), joins the group (generation {}) and owns \
             partition 0. It folds all {} deposits, persists snapshots of alice and bob, and commits input \
             offset {}.",
            a.pid(),
            held.generation,
            self.written.len(),
            show_offset(committed)
        ))?;

        // 2. More input; A folds it in memory.
        let more = self.deposit("alice", 5).await?;
        let mut held = a.catch_up(self.input_end(), "owner A folding more").await?;
        self.say(&format!(
            "5 more deposits for alice ({more}). A folds them: in A's memory alice now has {}. Not persisted \
             yet.",
            short(account(&held, "alice"))
        ))?;

        // 3. Fenced only: A is evicted and writes before anyone else has taken the partition.
        let evicted_write = if self.fenced() {
            let stopped = self.pause(&a, &held.member).await?;
            let write = self
                .resume_and_flush(
                    &mut a,
                    stopped,
                    account(&held, "alice"),
                    "No other member has joined, so no one has taken partition 0 or its producer.",
                )
                .await?;
            match &write {
                LateWrite::Refused(r) => self.say(&format!(
                    "A's write is REFUSED by {}: {}\n{}",
                    r.named(),
                    r.error,
                    why(r, false)
                ))?,
                LateWrite::Landed { .. } => self
                    .say("A's write LANDED although A had been evicted: the fence did not hold.")?,
            }
            let committed = self.committed().await?;
            held = a
                .rejoin(self.input_end(), &held.member, "owner A rejoining")
                .await?;
            self.say(&format!(
                "A does what a fenced member does: it rejoins the group as a new member (generation {}), \
                 recovers the snapshots, replays the input from the committed offset {}, and holds alice \
                 at {} again, not persisted.",
                held.generation,
                show_offset(committed),
                short(account(&held, "alice"))
            ))?;
            Some(write)
        } else {
            None
        };
        let stale = account(&held, "alice");

        // 4. A is paused; B takes over while A is stopped.
        let stopped = self.pause(&a, &held.member).await?;
        let mut b = self.owner("B").await?;
        let newer = self.deposit("alice", 5).await?;
        self.say(&format!(
            "Owner B joins the group. 5 more deposits for alice arrive ({newer})."
        ))?;
        catch_up(&mut b, self.input_end(), "owner B taking over").await?;
        b.persist()
            .await
            .map_err(|e| failed("owner B's persist", e))?;
        b.commit()
            .await
            .map_err(|e| failed("owner B's commit", e))?;
        let committed = self.committed().await?;
        let b_alice = alice_of(&b).await;
        self.say(&format!(
            "B owns partition 0 ({}){}. It recovers the snapshots A persisted, replays the input from the \
             committed offset, and holds alice at {}. B persists its snapshots and commits input offset {}.",
            generation(&b),
            if self.fenced() {
                ", and on taking it initialised the partition's transactional producer"
            } else {
                ""
            },
            short(b_alice),
            show_offset(committed)
        ))?;

        // 5. A resumes and flushes its stale state.
        let late_write = self
            .resume_and_flush(
                &mut a,
                stopped,
                stale,
                "B has taken over, and B's snapshot of alice is newer than what A holds.",
            )
            .await?;
        let owner_a = a.metrics().await;
        // A's process ends here, as a stale owner's does after its fence.
        a.quit().await;
        match &late_write {
            LateWrite::Refused(r) => {
                self.say(&format!(
                    "A's late write is REFUSED by {}: {}\n{}",
                    r.named(),
                    r.error,
                    why(r, true)
                ))?;
            }
            LateWrite::Landed {
                log_end_before,
                log_end_after,
            } => {
                self.say(&format!(
                    "A's late write LANDED: it was accepted without an error, and the snapshot partition's \
                     log end moved from {log_end_before} to {log_end_after}. A's stale alice is now the \
                     newest record of that key: on the compacted topic it shadows B's."
                ))?;
            }
        }

        // 6. A fresh owner recovers; compare with a fold of everything from scratch.
        b.run(std::future::ready(()))
            .await
            .map_err(|e| failed("owner B leaving the group", e))?;
        let committed = self.committed().await?;
        self.say(&format!(
            "B leaves the group cleanly. A fresh owner C joins, recovers the snapshots and folds whatever \
             input lies past the committed offset ({}).",
            show_offset(committed)
        ))?;
        let mut c = self.owner("C").await?;
        catch_up(&mut c, self.input_end(), "owner C recovering").await?;
        let got = c.state(0).unwrap_or_default();
        c.run(std::future::ready(()))
            .await
            .map_err(|e| failed("owner C leaving the group", e))?;
        let rows: Vec<Row> = self
            .expected()
            .into_iter()
            .map(|(key, want)| {
                let got = got.get(&Bytes::from_static(key.as_bytes())).copied();
                let after_got = self
                    .written
                    .iter()
                    .filter(|(k, n, _)| *k == key && got.is_some_and(|g| *n > g.last))
                    .map(|(_, n, _)| *n)
                    .collect();
                Row {
                    key: key.to_owned(),
                    got,
                    want,
                    after_got,
                }
            })
            .collect();
        let mut table = format!(
            "C's state, compared with a fold of all {} deposits from scratch:\n",
            self.written.len()
        );
        let _ = writeln!(
            table,
            "  {:<8} {:<38} all input folded from scratch",
            "account", "C recovered and folded"
        );
        for r in &rows {
            let _ = writeln!(
                table,
                "  {:<8} {:<38} {:<38} {}",
                r.key,
                r.got.map_or("-".into(), |g| g.describe()),
                r.want.describe(),
                if r.got == Some(r.want) {
                    "same".to_owned()
                } else {
                    format!("WRONG: {}", r.damage())
                }
            );
        }
        let here = self
            .setting
            .registry
            .as_deref()
            .map(tally::TxnTally::read)
            .zip(counted_before)
            .map(|(now, before)| now.since(&before));
        let ending = Ending {
            evicted_write,
            late_write,
            rows,
            tally: tally::RunTally { here, owner_a },
        };
        if ending.correct() {
            table.push_str("Correct: the recovered state equals a fold of all input.");
        } else {
            table.push_str(
                "Damaged: C recovered A's stale snapshot, and the committed offset is already past the \
                 deposits B had folded into its newer one, so no owner will ever fold them again.",
            );
        }
        self.say(&table)?;
        writeln!(self.out)?;
        Ok(ending)
    }
}

async fn alice_of(flow: &Flow<Ledger>) -> Option<Account> {
    flow.state(0)
        .and_then(|s| s.get(&Bytes::from_static(b"alice")).copied())
}

/// An account in a sentence.
fn short(a: Option<Account>) -> String {
    a.map_or("nothing".into(), |a| {
        format!(
            "{} deposits (balance {}, up to #{})",
            a.deposits, a.balance, a.last
        )
    })
}

/// Polls `flow` until it holds partition 0 and its position has reached `end`.
async fn catch_up(flow: &mut Flow<Ledger>, end: i64, step: &str) -> Result<(), CliError> {
    let began = Instant::now();
    loop {
        flow.poll_once(Duration::from_millis(100))
            .await
            .map_err(|e| failed(step, e))?;
        if flow.position(0).is_some_and(|p| p >= end) {
            return Ok(());
        }
        if began.elapsed() > STEP_LIMIT {
            return Err(CliError::DemoFailed {
                detail: format!(
                    "{step}: partition 0 was not held and caught up to offset {end} within {} s",
                    STEP_LIMIT.as_secs()
                ),
            });
        }
    }
}

fn generation(flow: &Flow<Ledger>) -> String {
    flow.group_metadata()
        .current()
        .map_or("no generation yet".into(), |m| {
            format!("generation {}", m.generation_id())
        })
}

fn show_offset(o: Option<i64>) -> String {
    o.map_or("none".into(), |o| o.to_string())
}

/// Why the fence that refused A's write fired, in plain words. `taken_over`: B had taken the partition.
fn why(r: &Refusal, taken_over: bool) -> &'static str {
    match (r.fence, taken_over) {
        (Fence::Generation, false) => {
            "The group coordinator checked the offset commit inside A's transaction against the group: A's              member had been evicted, so it refused, and the whole transaction was aborted, snapshot              included; read_committed readers never see it. No other owner had initialised the partition's              producer yet, so this generation check is the only one that could stop A here."
        }
        (Fence::Generation, true) => {
            "The group coordinator checked the offset commit inside A's transaction against the group,              found A's generation stale, and aborted the whole transaction, snapshot included:              read_committed readers never see it."
        }
        (Fence::ProducerEpoch, _) => {
            "B's takeover initialised the partition's stable transactional id, which bumped              its producer epoch; A's transaction still carries the old epoch, so the broker refused it and              it never commits: read_committed readers never see it. This fence fires first because B              initialised before A resumed, and it is a correct defence; had A written before B's              initialisation, the generation check would have refused it, as in the act above."
        }
        (Fence::Other, _) => {
            "The transaction carrying it did not commit, so read_committed readers never see it."
        }
    }
}

fn failed(step: &str, e: impl std::fmt::Display) -> CliError {
    CliError::DemoFailed {
        detail: format!("{step}: {e}"),
    }
}

/// One line of a story, stamped with the time since its run `began`, shown at once. Prose is wrapped to
/// the screen width; lines that start with two spaces (tables) are kept as they are.
fn say(out: &mut dyn Write, began: Instant, text: &str) -> Result<(), CliError> {
    let stamp = format!("[{:>5.1} s] ", began.elapsed().as_secs_f64());
    let indent = " ".repeat(stamp.len());
    let mut lead = stamp.as_str();
    for paragraph in text.lines() {
        let lines = if paragraph.starts_with("  ") {
            vec![paragraph.to_owned()]
        } else {
            wrap(paragraph, WIDTH - indent.len())
        };
        for line in lines {
            writeln!(out, "{lead}{line}")?;
            lead = &indent;
        }
    }
    out.flush()?;
    Ok(())
}

/// Whether the group coordinator lists `member` in `group`.
async fn lists(cluster: &Cluster, group: &str, member: &str) -> Result<bool, CliError> {
    let members = cluster.group_members(group).await?;
    Ok(members.iter().any(|m| m == member))
}

/// Waits until the group coordinator no longer lists `member` (an owner stopped or killed since
/// `since`); returns how long after `since` it was dropped. Gives up `session` + [`STEP_LIMIT`] after.
async fn evicted(
    cluster: &Cluster,
    group: &str,
    member: &str,
    since: Instant,
    session: Duration,
) -> Result<Duration, CliError> {
    loop {
        if !lists(cluster, group, member).await? {
            return Ok(since.elapsed());
        }
        if since.elapsed() > session + STEP_LIMIT {
            return Err(CliError::DemoFailed {
                detail: format!(
                    "{:.1} s after owner {member} stopped, the group coordinator still lists it",
                    since.elapsed().as_secs_f64()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Breaks `text` into lines of at most `width` characters at spaces (a longer word gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// `#16-#20` for a run of numbers, else a list.
fn numbers(ns: &[u64]) -> String {
    match ns {
        [] => String::new(),
        [one] => format!("#{one}"),
        [first, .., last] if (last - first) as usize + 1 == ns.len() => format!("#{first}-#{last}"),
        _ => ns
            .iter()
            .map(|n| format!("#{n}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Names the demo's topics, groups and transactional ids apart from earlier runs on the same cluster.
fn stamp() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{:x}", std::process::id(), nanos % (1 << 40))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle and the runtime must agree on what a deposit does, and a snapshot must round-trip, or
    /// the comparison would report damage that is not there.
    #[test]
    fn accounts_fold_and_round_trip() {
        let a = Account::default().apply(b"1:10").apply(b"4:40");
        assert_eq!(
            a,
            Account {
                deposits: 2,
                balance: 50,
                last: 4
            }
        );
        assert_eq!(a.apply(b"garbage"), a);
        let ledger = Ledger::default();
        assert_eq!(ledger.decode(&ledger.encode(&a)).unwrap(), a);
        assert!(ledger.decode(b"short").is_err());
    }

    /// The exit status rule: fenced, A's write after its eviction must be refused by the generation fence
    /// and its late write refused too, with a correct state; unfenced, the late write must land and
    /// damage the state. Anything less is a FAIL.
    #[test]
    fn the_verdict_needs_the_generation_fence_and_the_damage() {
        let account = |deposits| Account {
            deposits,
            balance: 0,
            last: deposits,
        };
        let refused = |fence| {
            LateWrite::Refused(Refusal {
                fence,
                code: Some("CODE".into()),
                error: String::new(),
            })
        };
        let landed = || LateWrite::Landed {
            log_end_before: 3,
            log_end_after: 4,
        };
        let rows = |got| {
            vec![Row {
                key: "alice".into(),
                got: Some(account(got)),
                want: account(15),
                after_got: (got + 1..=15).collect(),
            }]
        };
        let unfenced = Ending {
            evicted_write: None,
            late_write: landed(),
            rows: rows(10),
            tally: Default::default(),
        };
        let fenced = |evicted, late| Ending {
            evicted_write: Some(evicted),
            late_write: late,
            rows: rows(15),
            tally: Default::default(),
        };
        let mut out = Vec::new();
        let good = fenced(refused(Fence::Generation), refused(Fence::ProducerEpoch));
        assert!(verdict(&good, &unfenced, &mut out).is_ok());
        assert!(String::from_utf8_lossy(&out).starts_with("verdict: PASS"));
        for bad in [
            fenced(refused(Fence::ProducerEpoch), refused(Fence::ProducerEpoch)),
            fenced(landed(), refused(Fence::ProducerEpoch)),
            fenced(refused(Fence::Generation), landed()),
        ] {
            let mut out = Vec::new();
            assert!(verdict(&bad, &unfenced, &mut out).is_err());
            assert!(String::from_utf8_lossy(&out).starts_with("verdict: FAIL"));
        }
        let undamaged = Ending {
            evicted_write: None,
            late_write: landed(),
            rows: rows(15),
            tally: Default::default(),
        };
        assert!(verdict(&good, &undamaged, &mut Vec::new()).is_err());
    }

    /// The demo names the damage it finds by the deposits lost, runs of numbers collapsed into ranges.
    #[test]
    fn lost_deposits_are_named() {
        assert_eq!(numbers(&[16, 17, 18, 19, 20]), "#16-#20");
        assert_eq!(numbers(&[3, 7]), "#3, #7");
        let row = Row {
            key: "alice".into(),
            got: Some(Account {
                deposits: 10,
                balance: 0,
                last: 15,
            }),
            want: Account {
                deposits: 15,
                balance: 0,
                last: 20,
            },
            after_got: vec![16, 17, 18, 19, 20],
        };
        assert_eq!(row.damage(), "lost 5 deposit(s): #16-#20");
    }
}
