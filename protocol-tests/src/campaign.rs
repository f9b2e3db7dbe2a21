//! The fault campaign: flow members as processes on a three-node cluster, an input producer that records
//! every event it wrote, faults drawn per round from a printed seed, and a checker that re-folds the input
//! from scratch and compares it with what the snapshot topic holds.
//!
//! One round: fresh input and snapshot topics and a fresh group; members join; events flow while the
//! round's faults run one after the other; the faults heal (nodes restarted, members thawed, at least two
//! members running); the input stops; the members drain (every input partition's committed offset reaches
//! its end) and stop; then
//! - the hanging-transaction finder (supplied by the caller, see [`Finder`]) must report nothing on the
//!   snapshot topic and `__consumer_offsets`;
//! - every snapshot read at read_committed must be a fold of its key's first N events (nothing folded
//!   twice, skipped or reordered), never a key of an aborted foreign transaction, and per key the counts
//!   never go back (a stale owner's late write would);
//! - every snapshot a member reported committed must be in the log (no committed snapshot lost);
//! - each key's last snapshot must equal the fold of all its input events;
//! - every input event's output (members run the [`Echo`](crate::tally::Echo) fold: one output per
//!   event; not on the unfenced PostgreSQL store, which has no producer for outputs) must be in the
//!   output topic at read_committed exactly once: a lost or a duplicated output is an anomaly.
//!
//! Each violation is an anomaly. Trouble of the harness itself (a node that does not come back) is kept
//! apart as an infrastructure note, so it is never mistaken for a finding or for a clean round.
//!
//! # References
//! - KIP-98 (transactions), KIP-447 (fencing by generation), KIP-664 (hanging transactions), KIP-848
//!   (consumer protocol), KIP-890 (transaction.version 2)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use snapfence::consumer::{
    committed_offsets, list_offsets, OffsetSpec, PartitionReader, ReaderConfig, StartAt,
    TopicPartition,
};
use snapfence::net::{Client, ClientConfig, CoordinatorKind};
use snapfence::producer::{
    Producer, ProducerConfig, ProducerRecord, TransactionalConfig, TransactionalProducer,
};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{read_to_target, PartitionLog, RecoveryConfig};

use crate::member::{MemberArgs, MemberLog, MemberProcess};
use crate::tally::{fold_all, is_delete, Tally};
use crate::{unique, ClusterSpec, Fault, FaultProxy, KafkaCluster, Requests};

/// A fault the campaign injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGSTOP an owner as a flush starts, past its session timeout and until another member took over
    /// and flushed, then SIGCONT it (its flush goes on, late).
    Zombie,
    /// SIGKILL an owner frozen inside a flush whose transaction is open on its snapshot partition, then
    /// restart it.
    KillMidTxn,
    /// SIGKILL the leader node of an input or snapshot partition, then restart it.
    LeaderRestart,
    /// SIGKILL the node coordinating a snapshot partition's transactional id, then restart it.
    TxnCoordinatorKill,
    /// SIGKILL the group coordinator's node, then restart it.
    GroupCoordinatorKill,
    /// Hold a foreign transaction open on a snapshot partition across a rebalance, then abort it.
    ForeignTxn,
    /// Add a member, then remove one (two rebalances).
    Rebalance,
    /// Blackhole an owner's proxy to every broker, or to one (the group coordinator's node or a random
    /// one), past its session timeout while the member keeps running; heal once another member took one
    /// of its partitions over (or after a bound). Held requests are delivered on the heal, late.
    PartitionMember,
    /// Drop the answers to Produce, EndTxn or TxnOffsetCommit (a drawn subset) on an owner's proxy
    /// while the requests land, for a few seconds: the outcome of its flushes is unknown to it.
    UnknownOutcome,
    /// 200-2000 ms added to every frame both ways on every member's proxy for a while: transactions and
    /// heartbeats race their timeouts.
    Latency,
    /// Every member restarted one after another (stopped or killed), two or three times over, events
    /// flowing: writes race each rebalance. Runs with the tolerant fence policy.
    RestartStorm,
    /// The snapshot topic is compacted aggressively (small `segment.ms`, tiny dirty ratio, small
    /// `delete.retention.ms`); once the cleaner has removed records from it, every member is killed in
    /// turn so each partition's next owner recovers from a log the cleaner already worked on.
    Compaction,
    /// An owner is frozen while [`WIDE_KEYS`] new keys of one of its partitions are written, so that
    /// its next persist takes more keys than one transaction may carry (the flow's cap, [`WIDE_WAVE`])
    /// and writes them in several; it is killed once the first has committed, before the last has.
    /// The commit of the input offset waits for every transaction of a persist, so the next owner
    /// folds the keys the later transactions missed again, and must skip those the first one holds.
    WideChange,
}

/// Keys a `wide-change` fault writes to one partition.
pub const WIDE_KEYS: usize = 40_000;

/// The most keys one snapshot transaction of a flow carries (snapfence's wave cap): a `wide-change`
/// kills the owner once this many of its records have committed.
pub const WIDE_WAVE: usize = 16_384;

/// The memory budget members of a `wide-change` round get at least, when the campaign sets one: a
/// smaller one persists at every 1 024 changed keys, so no persist would need a second transaction.
const WIDE_BUDGET: u64 = 32 << 20;

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 13] = [
        FaultKind::Zombie,
        FaultKind::KillMidTxn,
        FaultKind::LeaderRestart,
        FaultKind::TxnCoordinatorKill,
        FaultKind::GroupCoordinatorKill,
        FaultKind::ForeignTxn,
        FaultKind::Rebalance,
        FaultKind::PartitionMember,
        FaultKind::UnknownOutcome,
        FaultKind::Latency,
        FaultKind::RestartStorm,
        FaultKind::Compaction,
        FaultKind::WideChange,
    ];

    /// The kind named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<FaultKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A short stable name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Zombie => "zombie",
            FaultKind::KillMidTxn => "kill-mid-txn",
            FaultKind::LeaderRestart => "leader-restart",
            FaultKind::TxnCoordinatorKill => "txn-coordinator-kill",
            FaultKind::GroupCoordinatorKill => "group-coordinator-kill",
            FaultKind::ForeignTxn => "foreign-txn",
            FaultKind::Rebalance => "rebalance",
            FaultKind::PartitionMember => "partition-member",
            FaultKind::UnknownOutcome => "unknown-outcome",
            FaultKind::Latency => "latency",
            FaultKind::RestartStorm => "restart-storm",
            FaultKind::Compaction => "compaction",
            FaultKind::WideChange => "wide-change",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The hanging-transaction finder: given a bootstrap and a topic, the hanging transactions it finds there
/// (one line each), or why it could not search. The campaign does not carry its own: the caller passes the
/// operator tool's KIP-664 finder, so the campaign checks the finder users run. The future need not be
/// `Send` (the tool's writer-based output is not), so a round runs on the caller's task.
pub type Finder = Arc<
    dyn Fn(String, String) -> Pin<Box<dyn Future<Output = Result<Vec<String>, String>> + Send>>
        + Send
        + Sync,
>;

/// How members are started: a program and the arguments before the member's own.
#[derive(Debug, Clone)]
pub struct MemberCommand {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before [`MemberArgs::to_args`] (e.g. a subcommand that selects member mode).
    pub leading: Vec<String>,
    /// Pass the member's arguments in this environment variable instead of after `leading` (see
    /// [`MemberProcess::spawn_command_env`]).
    pub args_env: Option<String>,
}

/// What a campaign runs.
#[derive(Clone)]
pub struct CampaignConfig {
    /// How to start a member.
    pub member: MemberCommand,
    /// Fenced (transactional) members, or the unfenced mode whose corruption the checker must catch.
    pub transactional: bool,
    /// Members at the start of a round.
    pub members: usize,
    /// Input (and snapshot) partitions.
    pub partitions: i32,
    /// Distinct keys.
    pub keys: usize,
    /// The session timeout (classic; the cluster's `group.consumer.session.timeout.ms` should match).
    pub session_timeout: Duration,
    /// The finder run after every round; `None` skips that check (and says so in the report).
    pub finder: Option<Finder>,
    /// Members keep their snapshots in the PostgreSQL database at this URL (the cluster must have
    /// two-phase commit on: [`two_phase`]). The checker then reads each key's row instead of the
    /// snapshot topic's history, and an open transaction is a transaction coordinator's `Ongoing`.
    pub postgres: Option<String>,
    /// Members pause this long between announcing a flush and starting it
    /// ([`MemberArgs::flush_pause`]), so a zombie frozen on the announcement is frozen before its
    /// writes leave even where they would leave at once.
    pub flush_pause: Duration,
    /// Members keep their state on disk (`StateConfig::Disk`) in a directory of their own under this
    /// one; a member the supervisor restarts, or a restart fault replaces, takes its predecessor's
    /// directory, as a pod restarted on its volume does. `None`: state in memory.
    pub state_dirs: Option<std::path::PathBuf>,
    /// With [`CampaignConfig::state_dirs`]: each member's memory budget in bytes
    /// ([`MemberArgs::memory_budget`]); a small one keeps most keys on disk, loaded as they are needed.
    pub memory_budget: Option<u64>,
}

impl CampaignConfig {
    /// Three transactional members over four partitions and sixteen keys, a 3 s session.
    pub fn new(member: MemberCommand, finder: Option<Finder>) -> CampaignConfig {
        CampaignConfig {
            member,
            transactional: true,
            members: 3,
            partitions: 4,
            keys: 16,
            session_timeout: Duration::from_secs(3),
            finder,
            postgres: None,
            flush_pause: Duration::ZERO,
            state_dirs: None,
            memory_budget: None,
        }
    }
}

/// `spec` with KIP-939 two-phase commit on, for [`CampaignConfig::postgres`] rounds
/// ([`ClusterSpec::with_two_phase_commit`]).
pub fn two_phase(spec: ClusterSpec) -> ClusterSpec {
    spec.with_two_phase_commit()
}

/// The cluster a campaign runs on: three nodes (replication 3, `min.insync.replicas` 2) at
/// `transaction.version` `tv`, with the KIP-848 session timeout at the broker's minimum of 3 s so a
/// frozen member is evicted quickly under both protocols.
pub fn campaign_spec(tv: i16) -> ClusterSpec {
    campaign_props(ClusterSpec::three_nodes().with_transaction_version(tv))
}

/// A cluster the campaign can run its rounds on: a Kafka release and its transaction version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leg {
    /// Kafka 4.4, transaction.version 2.
    Kafka44Tv2,
    /// Kafka 4.4, transaction.version 1.
    Kafka44Tv1,
    /// Kafka 4.2 (transaction.version 2; KIP-848 before KIP-1251's assignment epochs).
    Kafka42,
    /// Kafka 3.9 as it ships: no KIP-890 part 2, the classic group coordinator, no KIP-848.
    Kafka39,
}

impl Leg {
    /// Every leg, in a fixed order.
    pub const ALL: [Leg; 4] = [Leg::Kafka44Tv2, Leg::Kafka44Tv1, Leg::Kafka42, Leg::Kafka39];

    /// A short stable name (`4.4-tv2`, `4.4-tv1`, `4.2`, `3.9`).
    pub fn name(self) -> &'static str {
        match self {
            Leg::Kafka44Tv2 => "4.4-tv2",
            Leg::Kafka44Tv1 => "4.4-tv1",
            Leg::Kafka42 => "4.2",
            Leg::Kafka39 => "3.9",
        }
    }

    /// The leg named `name`.
    pub fn from_name(name: &str) -> Option<Leg> {
        Self::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether the leg's brokers serve the KIP-848 consumer protocol.
    pub fn has_consumer_protocol(self) -> bool {
        self != Leg::Kafka39
    }

    /// Its three-node cluster, with the campaign's broker settings.
    pub fn spec(self) -> ClusterSpec {
        let three = |base: ClusterSpec| ClusterSpec { nodes: 3, ..base };
        match self {
            Leg::Kafka44Tv2 => campaign_spec(2),
            Leg::Kafka44Tv1 => campaign_spec(1),
            Leg::Kafka42 => campaign_props(three(ClusterSpec::kafka42())),
            // No consumer-protocol settings: 3.9 as it ships has no KIP-848 to set them for.
            Leg::Kafka39 => cleaner_props(three(ClusterSpec::kafka39())),
        }
    }
}

fn campaign_props(spec: ClusterSpec) -> ClusterSpec {
    cleaner_props(spec.with_prop("group.consumer.session.timeout.ms", "3000"))
}

fn cleaner_props(spec: ClusterSpec) -> ClusterSpec {
    // The cleaner looks for work every half second instead of every 15 s, so a `compaction`
    // round's snapshot topic is cleaned within the round. Other topics never roll a segment in a
    // round, so this changes nothing for them.
    spec.with_prop("log.cleaner.backoff.ms", "500")
}

/// A small deterministic generator (SplitMix64), so a round replays from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// One round's draw: its seed, the group protocol and the faults in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundPlan {
    /// Replays the round (with the same plan) exactly as far as the campaign decides.
    pub seed: u64,
    /// KIP-848 consumer protocol, else classic.
    pub consumer_protocol: bool,
    /// Classic rounds only: the eager range assignor instead of cooperative-sticky.
    pub eager: bool,
    /// The faults, run one after another.
    pub faults: Vec<FaultKind>,
    /// Members run [`FencePolicy::Recover`](snapfence::snapshot::FencePolicy::Recover) (a spurious fence
    /// recovered in place; a member exit on a fence is then an anomaly) instead of `Stop`. Always with
    /// `restart-storm`, else drawn.
    pub recover: bool,
}

impl RoundPlan {
    /// The plan of round `round` of the campaign seeded `campaign_seed`.
    pub fn draw(campaign_seed: u64, round: u64) -> RoundPlan {
        Self::draw_among(campaign_seed, round, &FaultKind::ALL)
    }

    /// [`draw`](Self::draw) with the faults taken only from `kinds` (all kinds when empty).
    pub fn draw_among(campaign_seed: u64, round: u64, kinds: &[FaultKind]) -> RoundPlan {
        let seed = Rng::new(campaign_seed ^ round.wrapping_mul(0xa24b_aed4_963e_e407)).next_u64();
        Self::from_seed_among(seed, kinds)
    }

    /// The plan a round seed stands for: one or two faults (more per round made rounds long without
    /// finding more; every kind still meets every other across a campaign).
    pub fn from_seed(seed: u64) -> RoundPlan {
        Self::from_seed_among(seed, &FaultKind::ALL)
    }

    /// [`from_seed`](Self::from_seed) with the faults taken only from `kinds` (all kinds when empty).
    pub fn from_seed_among(seed: u64, kinds: &[FaultKind]) -> RoundPlan {
        let kinds = if kinds.is_empty() {
            &FaultKind::ALL[..]
        } else {
            kinds
        };
        let mut rng = Rng::new(seed);
        let consumer_protocol = rng.below(2) == 1;
        let n = (1 + rng.below(2)).min(kinds.len());
        let mut faults = Vec::new();
        while faults.len() < n {
            let k = kinds[rng.below(kinds.len())];
            if !faults.contains(&k) {
                faults.push(k);
            }
        }
        // Drawn after the faults, so a seed draws the same faults as before this field existed.
        let recover = faults.contains(&FaultKind::RestartStorm) || rng.below(2) == 1;
        // Drawn last for the same reason: a third of the classic rounds run eager.
        let eager = rng.below(3) == 0 && !consumer_protocol;
        RoundPlan {
            seed,
            consumer_protocol,
            eager,
            faults,
            recover,
        }
    }

    /// This plan on a cluster without the KIP-848 consumer protocol (3.9 as it ships): classic instead.
    pub fn classic_only(mut self) -> RoundPlan {
        self.consumer_protocol = false;
        self
    }
}

/// What a round found.
#[derive(Debug, Clone)]
pub struct RoundReport {
    /// What was drawn.
    pub plan: RoundPlan,
    /// The broker release the round ran on.
    pub broker: String,
    /// The cluster's `transaction.version` (1 on releases before 4.0, which have no KIP-890 part 2).
    pub transaction_version: i16,
    /// Fenced or not.
    pub transactional: bool,
    /// Input events written.
    pub events: usize,
    /// Snapshots read back at read_committed.
    pub snapshots_read: usize,
    /// Outputs read back at read_committed (0 on the unfenced PostgreSQL store, which has none).
    pub outputs_read: usize,
    /// Input events whose output is missing.
    pub outputs_lost: usize,
    /// Input events with more than one committed output.
    pub outputs_duplicated: usize,
    /// Committed snapshots the members reported.
    pub snapshots_reported: usize,
    /// Member processes started after the first ones (supervisor restarts and added members).
    pub restarts: usize,
    /// Kill-mid-transaction faults after which a snapshot partition of the killed member had an open
    /// transaction (the crash landed inside one).
    pub open_txn_kills: usize,
    /// Member processes that exited on their own (not stopped or killed by the harness).
    pub member_exits: usize,
    /// Of those, exits on a fence (the group's or a newer producer's). With `recover` each is an
    /// anomaly: a spurious fence must be recovered in place.
    pub fence_exits: usize,
    /// Rebalance events the members' flows ran (assignments, revocations, losses), summed.
    pub rebalances: u64,
    /// Partitions the members recovered in place after a spurious fence or unknown outcome, summed.
    pub fences_recovered: u64,
    /// Times a member rejoined as a new one (evicted, or its producer fenced), summed.
    pub rejoins: u64,
    /// Reads of an on-disk image that resumed from its checkpoint ([`CampaignConfig::state_dirs`]; at
    /// acquisitions and at releases), summed over the members.
    pub disk_resumed: u64,
    /// Reads that discarded an existing image and read the partition whole, summed.
    pub disk_fallbacks: u64,
    /// Keys loaded from disk by members under a memory budget ([`CampaignConfig::memory_budget`]),
    /// summed.
    pub disk_loaded: u64,
    /// Compaction faults that saw the cleaner remove records from the snapshot topic before the kills.
    pub compacted: usize,
    /// Wide-change faults that killed the owner with some but not all of its persist's transactions
    /// committed.
    pub split_persist_kills: usize,
    /// Invariant violations.
    pub anomalies: Vec<String>,
    /// Harness trouble (not a finding about the library).
    pub infra: Vec<String>,
    /// What happened, fault by fault.
    pub notes: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
}

impl fmt::Display for RoundReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<&str> = self.plan.faults.iter().map(|k| k.name()).collect();
        write!(
            f,
            "seed={:#018x} kafka={} tv={} {} {} {} faults=[{}] events={} snapshots={} outputs={} \
             outputs-lost={} outputs-duplicated={} reported={} restarts={} \
             exits={} fence-exits={} rebalances={} recovered-in-place={} rejoins={} disk-resumed={} \
             disk-fallbacks={} disk-loaded={} anomalies={} infra={} {:.1}s",
            self.plan.seed,
            self.broker,
            self.transaction_version,
            if self.plan.consumer_protocol {
                "consumer"
            } else if self.plan.eager {
                "eager"
            } else {
                "classic"
            },
            if self.transactional {
                "fenced"
            } else {
                "unfenced"
            },
            if self.plan.recover { "recover" } else { "stop" },
            faults.join(","),
            self.events,
            self.snapshots_read,
            self.outputs_read,
            self.outputs_lost,
            self.outputs_duplicated,
            self.snapshots_reported,
            self.restarts,
            self.member_exits,
            self.fence_exits,
            self.rebalances,
            self.fences_recovered,
            self.rejoins,
            self.disk_resumed,
            self.disk_fallbacks,
            self.disk_loaded,
            self.anomalies.len(),
            self.infra.len(),
            self.elapsed.as_secs_f64()
        )
    }
}

/// A campaign's totals: rounds, faults by kind, anomalies and the seeds that found them.
pub fn summary(reports: &[RoundReport]) -> String {
    let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
    for r in reports {
        for k in &r.plan.faults {
            *by_kind.entry(*k).or_default() += 1;
        }
    }
    let anomalies: usize = reports.iter().map(|r| r.anomalies.len()).sum();
    let infra: usize = reports.iter().map(|r| r.infra.len()).sum();
    let events: usize = reports.iter().map(|r| r.events).sum();
    let outputs: usize = reports.iter().map(|r| r.outputs_read).sum();
    let lost: usize = reports.iter().map(|r| r.outputs_lost).sum();
    let duplicated: usize = reports.iter().map(|r| r.outputs_duplicated).sum();
    let mut out = format!(
        "rounds: {} ({} classic, {} of them eager, {} consumer protocol; tv2 {}, tv1 {})\nevents: {events}\n\
         outputs: {outputs} ({lost} lost, {duplicated} duplicated)\nfaults by kind:\n",
        reports.len(),
        reports.iter().filter(|r| !r.plan.consumer_protocol).count(),
        reports
            .iter()
            .filter(|r| !r.plan.consumer_protocol && r.plan.eager)
            .count(),
        reports.iter().filter(|r| r.plan.consumer_protocol).count(),
        reports.iter().filter(|r| r.transaction_version == 2).count(),
        reports.iter().filter(|r| r.transaction_version == 1).count(),
    );
    for k in FaultKind::ALL {
        out.push_str(&format!(
            "  {:<24} {}\n",
            k.name(),
            by_kind.get(&k).copied().unwrap_or(0)
        ));
    }
    let kills = by_kind.get(&FaultKind::KillMidTxn).copied().unwrap_or(0);
    let open: usize = reports.iter().map(|r| r.open_txn_kills).sum();
    let compactions = by_kind.get(&FaultKind::Compaction).copied().unwrap_or(0);
    let compacted: usize = reports.iter().map(|r| r.compacted).sum();
    let wides = by_kind.get(&FaultKind::WideChange).copied().unwrap_or(0);
    let split: usize = reports.iter().map(|r| r.split_persist_kills).sum();
    let sum = |f: fn(&RoundReport) -> u64| reports.iter().map(f).sum::<u64>();
    out.push_str(&format!(
        "kill-mid-txn faults that left a transaction open: {open} of {kills}\n\
         compaction faults that saw the cleaner remove records first: {compacted} of {compactions}\n\
         wide-change faults that killed an owner between the transactions of one persist: {split} of {wides}\n\
         rounds with the tolerant fence policy: {}\n\
         member exits: {} (on a fence: {}, of them in tolerant rounds: {})\n\
         rebalance events: {}, partitions recovered in place: {}, rejoins: {}\n\
         anomalies: {anomalies}\ninfrastructure notes: {infra}\n",
        reports.iter().filter(|r| r.plan.recover).count(),
        sum(|r| r.member_exits as u64),
        sum(|r| r.fence_exits as u64),
        sum(|r| if r.plan.recover { r.fence_exits as u64 } else { 0 }),
        sum(|r| r.rebalances),
        sum(|r| r.fences_recovered),
        sum(|r| r.rejoins),
    ));
    for r in reports
        .iter()
        .filter(|r| !r.anomalies.is_empty() || !r.infra.is_empty())
    {
        out.push_str(&format!(
            "  replay: --round-seed {:#018x} (tv={}{})\n",
            r.plan.seed,
            r.transaction_version,
            if r.transactional { "" } else { ", unfenced" }
        ));
        for a in r.anomalies.iter().take(5) {
            out.push_str(&format!("    anomaly: {a}\n"));
        }
        for a in r.infra.iter().take(3) {
            out.push_str(&format!("    infra: {a}\n"));
        }
    }
    out
}

/// Runs one round of `plan` on `kafka` (a cluster from [`campaign_spec`]). Never panics on what it
/// observes: every problem ends up in the report.
///
/// Cancel safety: not cancel-safe; a dropped round leaves its topics behind (its members are killed when
/// their handles drop).
pub async fn run_round(
    kafka: &KafkaCluster,
    cfg: &CampaignConfig,
    plan: &RoundPlan,
) -> RoundReport {
    let began = Instant::now();
    let major: u32 = kafka
        .version()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(4);
    let tv = kafka
        .spec()
        .and_then(|s| s.transaction_version)
        .unwrap_or(if major >= 4 { 2 } else { 1 });
    let mut report = RoundReport {
        plan: plan.clone(),
        broker: kafka.version().to_string(),
        transaction_version: tv,
        transactional: cfg.transactional,
        events: 0,
        snapshots_read: 0,
        outputs_read: 0,
        outputs_lost: 0,
        outputs_duplicated: 0,
        snapshots_reported: 0,
        restarts: 0,
        open_txn_kills: 0,
        member_exits: 0,
        fence_exits: 0,
        rebalances: 0,
        fences_recovered: 0,
        rejoins: 0,
        disk_resumed: 0,
        disk_fallbacks: 0,
        disk_loaded: 0,
        compacted: 0,
        split_persist_kills: 0,
        anomalies: Vec::new(),
        infra: Vec::new(),
        notes: Vec::new(),
        elapsed: Duration::ZERO,
    };
    if let Some(url) = &cfg.postgres {
        if let Err(e) = postgres_history(url).await {
            report
                .infra
                .push(format!("installing the PostgreSQL history: {e}"));
            return report;
        }
    }
    match Round::new(kafka, cfg, plan).await {
        Ok(mut round) => {
            round.run(&mut report).await;
            round.cleanup().await;
        }
        Err(e) => report.infra.push(format!("round setup: {e}")),
    }
    report.elapsed = began.elapsed();
    report
}

struct Round<'a> {
    kafka: &'a KafkaCluster,
    cfg: &'a CampaignConfig,
    plan: &'a RoundPlan,
    rng: Rng,
    client: Client,
    args: MemberArgs,
    members: Vec<MemberProcess>,
    /// Logs of member processes that are gone.
    gone: Vec<MemberLog>,
    spawned: usize,
    down: Option<i32>,
    foreign_keys: Vec<Bytes>,
    /// Events the faults wrote themselves (`wide-change`), beside the round's producer's.
    fault_events: HashMap<Bytes, Vec<Bytes>>,
    began: Instant,
    /// The node addresses a member's proxy stands in front of (empty on an external cluster: members
    /// then connect directly and the network faults are skipped).
    brokers: Vec<String>,
    /// Each member's fault proxy, by pid. A member the supervisor restarts keeps its predecessor's
    /// proxy, fault included (a partitioned host stays partitioned across a restart).
    proxies: HashMap<u32, Arc<FaultProxy>>,
    /// Members the harness killed on purpose (their exit is not theirs).
    killed: HashSet<u32>,
    /// Members that exited on their own, and those that exited on a fence.
    exits: usize,
    fence_exits: Vec<String>,
    /// Each member's data directory, by pid ([`CampaignConfig::state_dirs`]).
    dirs: HashMap<u32, std::path::PathBuf>,
    /// This round's directory under [`CampaignConfig::state_dirs`].
    round_dir: Option<std::path::PathBuf>,
}

impl<'a> Round<'a> {
    async fn new(
        kafka: &'a KafkaCluster,
        cfg: &'a CampaignConfig,
        plan: &'a RoundPlan,
    ) -> Result<Round<'a>, String> {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .map_err(|e| e.to_string())?;
        let input = unique("fc-input");
        let snapshots = unique("fc-snap");
        snapfence::admin::create_topic(&client, &input, cfg.partitions, -1, &[])
            .await
            .map_err(|e| format!("create {input}: {e}"))?;
        let mut snapshot_configs = vec![("cleanup.policy", "compact")];
        if plan.faults.contains(&FaultKind::Compaction) {
            // A segment rolls every 300 ms of writes, the cleaner takes any log with 1% dirty, and
            // tombstones and markers are dropped 100 ms after a cleaning pass saw them.
            snapshot_configs.extend([
                ("segment.ms", "300"),
                ("min.cleanable.dirty.ratio", "0.01"),
                ("delete.retention.ms", "100"),
                ("min.compaction.lag.ms", "0"),
            ]);
        }
        snapfence::admin::create_topic(&client, &snapshots, cfg.partitions, -1, &snapshot_configs)
            .await
            .map_err(|e| format!("create {snapshots}: {e}"))?;
        let mut args = MemberArgs::new(
            &kafka.bootstrap(),
            &unique("fc-group"),
            &input,
            &snapshots,
            &unique("fc-txn"),
        );
        args.consumer_protocol = plan.consumer_protocol;
        args.eager = plan.eager;
        args.transactional = cfg.transactional;
        args.session_timeout = cfg.session_timeout;
        args.recover = plan.recover;
        args.postgres = cfg.postgres.clone();
        args.flush_pause = cfg.flush_pause;
        args.memory_budget = match cfg.memory_budget {
            Some(b) if plan.faults.contains(&FaultKind::WideChange) => Some(b.max(WIDE_BUDGET)),
            b => b,
        };
        // The unfenced PostgreSQL store has no producer for outputs; every other store carries them.
        if cfg.postgres.is_none() || cfg.transactional {
            let output = unique("fc-out");
            snapfence::admin::create_topic(&client, &output, cfg.partitions, -1, &[])
                .await
                .map_err(|e| format!("create {output}: {e}"))?;
            args.output = Some(output);
        }
        let brokers = if kafka.is_external() {
            Vec::new()
        } else {
            kafka
                .node_ids()
                .into_iter()
                .map(|n| kafka.node_address(n))
                .collect()
        };
        Ok(Round {
            kafka,
            cfg,
            plan,
            rng: Rng::new(plan.seed ^ 0x5eed),
            client,
            args,
            members: Vec::new(),
            gone: Vec::new(),
            spawned: 0,
            down: None,
            foreign_keys: Vec::new(),
            fault_events: HashMap::new(),
            began: Instant::now(),
            brokers,
            proxies: HashMap::new(),
            killed: HashSet::new(),
            exits: 0,
            fence_exits: Vec::new(),
            dirs: HashMap::new(),
            round_dir: cfg.state_dirs.as_ref().map(|d| d.join(unique("round"))),
        })
    }

    /// Starts a member with a fault proxy of its own in front of every broker.
    async fn spawn_member(&mut self) -> Result<(), String> {
        self.spawn_member_via(None, None).await
    }

    /// Starts a member through `proxy` (a new one when `None`).
    /// On `dir` (a gone member's) when given, else on a new directory when the round keeps state on
    /// disk.
    async fn spawn_member_via(
        &mut self,
        proxy: Option<Arc<FaultProxy>>,
        dir: Option<std::path::PathBuf>,
    ) -> Result<(), String> {
        let mut args = self.args.clone();
        let dir = match (&self.round_dir, dir) {
            (Some(_), Some(dir)) => Some(dir),
            (Some(round), None) => Some(round.join(format!("m{}", self.spawned))),
            (None, _) => None,
        };
        args.state_dir = dir.clone();
        let proxy = match proxy {
            Some(p) => Some(p),
            None if self.brokers.is_empty() => None,
            None => Some(Arc::new(
                FaultProxy::start(self.brokers.clone(), self.rng.next_u64())
                    .await
                    .map_err(|e| format!("member proxy: {e}"))?,
            )),
        };
        if let Some(p) = &proxy {
            args.routes = p
                .routes()
                .into_iter()
                .map(|(up, local)| (up, local.to_string()))
                .collect();
        }
        let own = args.to_args();
        let mut full = self.cfg.member.leading.clone();
        let env = match &self.cfg.member.args_env {
            Some(var) => Some((var.as_str(), own.as_slice())),
            None => {
                full.extend(own.iter().cloned());
                None
            }
        };
        let m = MemberProcess::spawn_command_env(&self.cfg.member.program, &full, env)
            .map_err(|e| format!("start member: {e}"))?;
        if let Some(p) = proxy {
            self.proxies.insert(m.pid(), p);
        }
        if let Some(dir) = dir {
            self.dirs.insert(m.pid(), dir);
        }
        self.members.push(m);
        self.spawned += 1;
        Ok(())
    }

    /// Replaces every member that exited (a fenced zombie stops; a crashed one is restarted), as a
    /// supervisor would, through the same proxy. Frozen members are left frozen. An exit the harness did
    /// not cause is counted, and an exit on a fence noted (an anomaly under the tolerant policy).
    async fn supervise(&mut self, notes: &mut Vec<String>) {
        let mut i = 0;
        while i < self.members.len() {
            let m = &mut self.members[i];
            if !m.is_paused() && !m.is_running() {
                let pid = m.pid();
                let log = m.final_log();
                if !self.killed.contains(&pid) {
                    self.exits += 1;
                    if log.fence_exit() {
                        self.fence_exits.push(format!(
                            "member {pid} exited on a fence: {}",
                            log.failure.as_deref().unwrap_or_default()
                        ));
                    }
                }
                if let Some(f) = &log.failure {
                    notes.push(self.stamp(format_args!("member {pid} exited: {f}")));
                }
                self.gone.push(log);
                self.members.swap_remove(i);
                let proxy = self.proxies.get(&pid).cloned();
                let dir = self.dirs.remove(&pid);
                if let Err(e) = self.spawn_member_via(proxy, dir).await {
                    notes.push(e);
                }
                continue;
            }
            i += 1;
        }
    }

    /// Waits `d`, supervising every 100 ms.
    async fn hold(&mut self, d: Duration, notes: &mut Vec<String>) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.supervise(notes).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills member `i` on purpose (the supervisor restarts it; the exit is not counted as its own).
    fn kill_member(&mut self, i: usize) {
        self.killed.insert(self.members[i].pid());
        self.members[i].kill();
    }

    /// The proxy of the member with `pid` (`None` on an external cluster).
    fn proxy_of(&self, pid: u32) -> Option<Arc<FaultProxy>> {
        self.proxies.get(&pid).cloned()
    }

    /// Heals every member's proxy.
    fn heal_network(&self) {
        for p in self.proxies.values() {
            p.heal();
        }
    }

    /// Waits (up to `bound`) until a member other than `pid` holds one of `held` and has flushed twice
    /// since it was first seen holding it (a new owner's first flush may only re-state what it
    /// recovered). True if that happened.
    async fn await_takeover(
        &mut self,
        pid: u32,
        held: &[i32],
        bound: Duration,
        notes: &mut Vec<String>,
    ) -> bool {
        let until = Instant::now() + bound;
        let mut seen: Option<(u32, u64)> = None;
        loop {
            let taker = self
                .members
                .iter()
                .find(|m| m.pid() != pid && m.held().iter().any(|p| held.contains(p)))
                .map(|m| (m.pid(), m.log().flushes));
            match (seen, taker) {
                (Some((a, f)), Some((b, g))) if a == b && g >= f + 2 => {
                    notes.push(format!("member {b} took over and flushed"));
                    return true;
                }
                (Some((a, _)), Some((b, _))) if a == b => {}
                (_, t) => seen = t,
            }
            if Instant::now() >= until {
                return false;
            }
            self.hold(Duration::from_millis(100), notes).await;
        }
    }

    /// A running member that holds a partition (waits up to 10 s for one).
    async fn owner(&mut self, notes: &mut Vec<String>) -> Option<usize> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let owners: Vec<usize> = (0..self.members.len())
                .filter(|&i| !self.members[i].is_paused() && !self.members[i].held().is_empty())
                .collect();
            if !owners.is_empty() {
                return Some(owners[self.rng.below(owners.len())]);
            }
            if Instant::now() >= until {
                return None;
            }
            self.hold(Duration::from_millis(200), notes).await;
        }
    }

    async fn kill_node(&mut self, node: i32, why: &str, report: &mut RoundReport) {
        if self.down.is_some() {
            // One node down at a time: with min.insync.replicas 2 a second one would stop all writes.
            self.heal_node(report).await;
        }
        self.kafka.kill(node);
        self.down = Some(node);
        report.notes.push(format!("killed node {node} ({why})"));
    }

    async fn heal_node(&mut self, report: &mut RoundReport) {
        if let Some(node) = self.down.take() {
            match restart_node(self.kafka, node).await {
                Ok(()) => report.notes.push(format!("restarted node {node}")),
                Err(e) => report.infra.push(format!("node {node} restart: {e}")),
            }
        }
    }

    /// A note stamped with the time since the round began, so a report shows where a round's time went.
    fn stamp(&self, what: impl fmt::Display) -> String {
        format!("[{:5.1}s] {what}", self.began.elapsed().as_secs_f64())
    }

    async fn fault(&mut self, kind: FaultKind, report: &mut RoundReport) {
        let mut notes = vec![self.stamp(format_args!("fault {kind}"))];
        match kind {
            FaultKind::Zombie => {
                let Some(i) = self.owner(&mut notes).await else {
                    notes.push("zombie: no owner to freeze".into());
                    return report.notes.append(&mut notes);
                };
                // Freeze it as a flush starts, before its writes leave the producer (they linger a few
                // milliseconds): a GC pause in the middle of a write. Thawed, its writes go out late,
                // after the new owner's (unfenced they land; fenced the transaction must be refused
                // and never read). A freeze later in the flush may find the writes already acknowledged,
                // and then there is no late write to test. A member that does not flush within 3 s is
                // frozen wherever it is.
                self.members[i].freeze_in_next_flush(Duration::ZERO);
                let until = Instant::now() + Duration::from_secs(3);
                while !self.members[i].frozen_in_flush() && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let in_flush = self.members[i].frozen_in_flush();
                if !in_flush {
                    self.members[i].disarm_and_resume();
                    self.members[i].pause();
                }
                let held = self.members[i].held();
                let frozen = self.cfg.session_timeout + Duration::from_secs(2);
                notes.push(format!(
                    "froze member {} holding {held:?} {} for at least {:.1}s",
                    self.members[i].pid(),
                    if in_flush {
                        "inside a flush"
                    } else {
                        "between flushes"
                    },
                    frozen.as_secs_f64()
                ));
                let pid = self.members[i].pid();
                self.hold(frozen, &mut notes).await;
                // Thaw it only once another member holds one of its partitions and has flushed twice since
                // (a new owner's first flush may only re-state what it recovered): then the zombie's
                // first flush is really later than the new owner's.
                if !self
                    .await_takeover(pid, &held, Duration::from_secs(20), &mut notes)
                    .await
                {
                    notes.push("no takeover with a flush seen before the thaw".into());
                }
                if let Some(m) = self.members.iter_mut().find(|m| m.pid() == pid) {
                    m.resume();
                }
                self.hold(Duration::from_millis(500), &mut notes).await;
            }
            FaultKind::KillMidTxn => {
                let Some(i) = self.owner(&mut notes).await else {
                    notes.push("kill-mid-txn: no owner".into());
                    return report.notes.append(&mut notes);
                };
                let pid = self.members[i].pid();
                // Freeze it somewhere in a flush; if a snapshot partition it holds then has an open
                // transaction (last stable offset below the high watermark) the crash lands inside one:
                // kill it. Otherwise thaw it and try the next flush, a few times.
                let mut inside = false;
                for _ in 0..8 {
                    let typical = self.members[i]
                        .log()
                        .last_flush
                        .unwrap_or(Duration::from_millis(20));
                    let delay = typical * (10 + self.rng.below(81) as u32) / 100;
                    self.members[i].freeze_in_next_flush(delay);
                    let until = Instant::now() + Duration::from_secs(3);
                    while !self.members[i].frozen_in_flush() && Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    if !self.members[i].frozen_in_flush() {
                        self.members[i].disarm_and_resume();
                        continue;
                    }
                    // The brokers keep running: give the followers a moment to replicate what the
                    // frozen transaction produced, so the high watermark covers it and the last stable
                    // offset shows it as open.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let held = self.members[i].held();
                    let open = self.open_transactions(&held).await;
                    if !open.is_empty() {
                        notes.push(format!(
                            "froze member {pid} {:.1}ms into a flush with transactions open on {open:?}",
                            delay.as_secs_f64() * 1000.0
                        ));
                        inside = true;
                        break;
                    }
                    self.members[i].disarm_and_resume();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                self.kill_member(i);
                if inside {
                    report.open_txn_kills += 1;
                    notes.push(format!("killed member {pid} inside its transaction"));
                } else {
                    notes.push(format!(
                        "killed member {pid}; no flush was caught with its transaction open"
                    ));
                }
                // The supervisor restarts it.
                self.hold(Duration::from_millis(1500), &mut notes).await;
            }
            FaultKind::LeaderRestart => {
                let topic = if self.rng.below(2) == 0 {
                    self.args.input.clone()
                } else {
                    self.args.snapshots.clone()
                };
                let p = self.rng.below(self.cfg.partitions as usize) as i32;
                self.client.invalidate_leader(&topic, p);
                match self.client.leader(&topic, p).await {
                    Ok(l) => {
                        self.kill_node(l.node, &format!("leader of {topic}/{p}"), report)
                            .await;
                        self.hold(Duration::from_secs(2), &mut notes).await;
                        self.heal_node(report).await;
                    }
                    Err(e) => notes.push(format!("leader of {topic}/{p}: {e}")),
                }
            }
            FaultKind::TxnCoordinatorKill | FaultKind::GroupCoordinatorKill => {
                let (ck, key) = if kind == FaultKind::TxnCoordinatorKill {
                    let p = self.rng.below(self.cfg.partitions as usize);
                    (
                        CoordinatorKind::Transaction,
                        format!("{}-{p}", self.args.txn_prefix),
                    )
                } else {
                    (CoordinatorKind::Group, self.args.group.clone())
                };
                self.client.invalidate_coordinator(ck, &key);
                match self.client.coordinator(ck, &key).await {
                    Ok(node) => {
                        self.kill_node(node, &format!("coordinator of {key}"), report)
                            .await;
                        self.hold(Duration::from_secs(2), &mut notes).await;
                        self.heal_node(report).await;
                    }
                    Err(e) => notes.push(format!("coordinator of {key}: {e}")),
                }
            }
            FaultKind::ForeignTxn => {
                let p = self.rng.below(self.cfg.partitions as usize) as i32;
                let key = Bytes::from(format!("foreign-{}", self.rng.below(1000)));
                match self.open_foreign(p, key.clone()).await {
                    Ok(mut txn) => {
                        self.foreign_keys.push(key);
                        notes.push(format!(
                            "foreign transaction open on snapshot partition {p}"
                        ));
                        // A rebalance while it is open: whoever gets the partition recovers past it.
                        if let Err(e) = self.spawn_member().await {
                            notes.push(e);
                        }
                        self.hold(Duration::from_secs(4), &mut notes).await;
                        if let Err(e) = txn.abort().await {
                            report
                                .infra
                                .push(format!("aborting the foreign transaction: {e}"));
                        }
                        txn.close().await;
                    }
                    Err(e) => report.infra.push(format!("foreign transaction: {e}")),
                }
            }
            FaultKind::Rebalance => {
                if let Err(e) = self.spawn_member().await {
                    notes.push(e);
                }
                self.hold(Duration::from_secs(2), &mut notes).await;
                let i = self.rng.below(self.members.len());
                let m = self.members.swap_remove(i);
                notes.push(format!("removed member {}", m.pid()));
                self.gone.push(close_member(m));
                self.hold(Duration::from_secs(1), &mut notes).await;
            }
            FaultKind::PartitionMember => self.partition_member(&mut notes).await,
            FaultKind::UnknownOutcome => self.unknown_outcome(&mut notes).await,
            FaultKind::Latency => self.latency(&mut notes).await,
            FaultKind::RestartStorm => self.restart_storm(&mut notes).await,
            FaultKind::Compaction => self.compaction(report, &mut notes).await,
            FaultKind::WideChange => self.wide_change(report, &mut notes).await,
        }
        report.notes.append(&mut notes);
    }

    /// `partition-member`: an owner cut off from every broker or from one, past its session timeout,
    /// while it keeps running; healed once another member took one of its partitions over and flushed
    /// (or after a bound: a cut from one node that is not the group coordinator's may evict nobody).
    async fn partition_member(&mut self, notes: &mut Vec<String>) {
        let Some(i) = self.owner(notes).await else {
            return notes.push("partition-member: no owner".into());
        };
        let pid = self.members[i].pid();
        let held = self.members[i].held();
        let Some(proxy) = self.proxy_of(pid) else {
            return notes.push("partition-member: no proxy (external cluster)".into());
        };
        let targets: Vec<String> = match self.rng.below(3) {
            0 => self.brokers.clone(),
            1 => {
                self.client
                    .invalidate_coordinator(CoordinatorKind::Group, &self.args.group);
                match self
                    .client
                    .coordinator(CoordinatorKind::Group, &self.args.group)
                    .await
                {
                    Ok(node) => vec![self.kafka.node_address(node)],
                    Err(e) => {
                        notes.push(format!("group coordinator: {e}; cutting every broker"));
                        self.brokers.clone()
                    }
                }
            }
            _ => vec![self.brokers[self.rng.below(self.brokers.len())].clone()],
        };
        for t in &targets {
            if let Err(e) = proxy.set(t, Fault::Blackhole) {
                notes.push(format!("partition-member: {e}"));
            }
        }
        notes.push(format!(
            "cut member {pid} holding {held:?} off from {}",
            if targets.len() == self.brokers.len() {
                "every broker".to_owned()
            } else {
                format!("{targets:?}")
            }
        ));
        self.hold(self.cfg.session_timeout + Duration::from_secs(2), notes)
            .await;
        if !self
            .await_takeover(pid, &held, Duration::from_secs(12), notes)
            .await
        {
            notes.push("no takeover with a flush seen before the heal".into());
        }
        proxy.heal();
        let held_back: u64 = targets
            .iter()
            .filter_map(|t| proxy.stats(t).ok())
            .map(|s| s.held)
            .sum();
        notes.push(self.stamp(format_args!(
            "healed member {pid}'s links; {held_back} frames had been held"
        )));
        self.hold(Duration::from_secs(1), notes).await;
    }

    /// `unknown-outcome`: an owner's proxy drops the answers to Produce, EndTxn and/or TxnOffsetCommit
    /// (the requests land) for a few seconds.
    async fn unknown_outcome(&mut self, notes: &mut Vec<String>) {
        const KEYS: [(i16, &str); 3] = [(0, "Produce"), (26, "EndTxn"), (28, "TxnOffsetCommit")];
        let Some(i) = self.owner(notes).await else {
            return notes.push("unknown-outcome: no owner".into());
        };
        let pid = self.members[i].pid();
        let Some(proxy) = self.proxy_of(pid) else {
            return notes.push("unknown-outcome: no proxy (external cluster)".into());
        };
        let mask = 1 + self.rng.below(7);
        let chosen: Vec<(i16, &str)> = KEYS
            .iter()
            .enumerate()
            .filter(|(b, _)| mask & (1 << b) != 0)
            .map(|(_, k)| *k)
            .collect();
        proxy.set_all(Fault::DropResponses(Requests::ApiKeys(
            chosen.iter().map(|(k, _)| *k).collect(),
        )));
        let d = Duration::from_millis(1500 + self.rng.below(2500) as u64);
        notes.push(format!(
            "member {pid}: answers to {:?} dropped for {:.1}s",
            chosen.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            d.as_secs_f64()
        ));
        self.hold(d, notes).await;
        proxy.heal();
        let dropped: u64 = self
            .brokers
            .iter()
            .filter_map(|b| proxy.stats(b).ok())
            .map(|s| s.dropped_responses)
            .sum();
        notes.push(self.stamp(format_args!(
            "healed member {pid}; {dropped} answers dropped so far on its links"
        )));
        self.hold(Duration::from_secs(1), notes).await;
    }

    /// `latency`: every member's links get 200-2000 ms per frame, each way, for 5-8 s.
    async fn latency(&mut self, notes: &mut Vec<String>) {
        if self.proxies.is_empty() {
            return notes.push("latency: no proxy (external cluster)".into());
        }
        let pids: Vec<u32> = self.members.iter().map(|m| m.pid()).collect();
        for pid in pids {
            let base = Duration::from_millis(200 + self.rng.below(600) as u64);
            let jitter = Duration::from_millis(self.rng.below(1201) as u64);
            if let Some(p) = self.proxy_of(pid) {
                p.set_all(Fault::Latency { base, jitter });
                notes.push(format!(
                    "member {pid}: {}-{} ms per frame each way",
                    base.as_millis(),
                    (base + jitter).as_millis()
                ));
            }
        }
        let d = Duration::from_millis(5000 + self.rng.below(3000) as u64);
        self.hold(d, notes).await;
        self.heal_network();
        notes.push(self.stamp("latency healed"));
        self.hold(Duration::from_secs(1), notes).await;
    }

    /// `restart-storm`: every member restarted one after another, two or three passes, each restart a
    /// graceful stop or (one in three) a SIGKILL, with 0.3-1.5 s between them while events flow.
    async fn restart_storm(&mut self, notes: &mut Vec<String>) {
        let passes = 2 + self.rng.below(2);
        let mut restarted = 0;
        for _ in 0..passes {
            let pids: Vec<u32> = self.members.iter().map(|m| m.pid()).collect();
            for pid in pids {
                let Some(i) = self.members.iter().position(|m| m.pid() == pid) else {
                    continue;
                };
                if self.members[i].is_paused() {
                    continue;
                }
                if self.rng.below(3) == 0 {
                    // The supervisor restarts it through the same proxy.
                    self.kill_member(i);
                } else {
                    let m = self.members.swap_remove(i);
                    let proxy = self.proxy_of(pid);
                    self.gone.push(close_member(m));
                    let dir = self.dirs.remove(&pid);
                    if let Err(e) = self.spawn_member_via(proxy, dir).await {
                        notes.push(e);
                    }
                }
                restarted += 1;
                let gap = Duration::from_millis(300 + self.rng.below(1200) as u64);
                self.hold(gap, notes).await;
            }
        }
        notes.push(self.stamp(format_args!(
            "restart storm: {restarted} restarts in {passes} passes"
        )));
        self.hold(Duration::from_secs(1), notes).await;
    }

    /// `compaction`: waits (up to 20 s) until the cleaner has removed records from a snapshot
    /// partition, then kills every member in turn, so each partition is recovered by a new owner from
    /// a log the cleaner already worked on.
    async fn compaction(&mut self, report: &mut RoundReport, notes: &mut Vec<String>) {
        let until = Instant::now() + Duration::from_secs(20);
        let mut cleaned = Vec::new();
        while cleaned.is_empty() && Instant::now() < until {
            for p in 0..self.cfg.partitions {
                match removed_records(&self.client, &self.args.snapshots, p).await {
                    Ok((removed, span)) if removed > 0 => cleaned.push((p, removed, span)),
                    Ok(_) => {}
                    Err(e) => notes.push(format!("compaction: reading partition {p}: {e}")),
                }
            }
            if cleaned.is_empty() {
                self.hold(Duration::from_millis(500), notes).await;
            }
        }
        if cleaned.is_empty() {
            notes.push(self.stamp("compaction: the cleaner removed nothing within 20 s"));
        } else {
            report.compacted += 1;
            notes.push(self.stamp(format_args!(
                "compaction: (partition, records removed, offsets spanned) {cleaned:?}"
            )));
        }
        let pids: Vec<u32> = self.members.iter().map(|m| m.pid()).collect();
        for pid in pids {
            if let Some(i) = self.members.iter().position(|m| m.pid() == pid) {
                self.kill_member(i);
                notes.push(format!("killed member {pid} to force recoveries"));
                self.hold(Duration::from_millis(1500), notes).await;
            }
        }
    }

    /// The snapshot partitions among `partitions` whose last stable offset is below the high watermark.
    async fn open_transactions(&self, partitions: &[i32]) -> Vec<i32> {
        if self.cfg.postgres.is_some() {
            // The PostgreSQL store's Kafka transactions carry only the offset commit: open is what
            // the transaction coordinator says (prepared, or still before its prepare).
            let mut open = Vec::new();
            for p in partitions {
                let id = format!("{}-{p}", self.args.txn_prefix);
                if let Ok(Some(d)) = snapfence::admin::describe_transaction(&self.client, &id).await
                {
                    if d.state == "Ongoing" {
                        open.push(*p);
                    }
                }
            }
            return open;
        }
        let tps: Vec<TopicPartition> = partitions
            .iter()
            .map(|p| TopicPartition::new(self.args.snapshots.as_str(), *p))
            .collect();
        let at = |level| list_offsets(&self.client, &tps, OffsetSpec::Latest, level);
        match (
            at(IsolationLevel::ReadCommitted).await,
            at(IsolationLevel::ReadUncommitted).await,
        ) {
            (Ok(lso), Ok(hw)) => tps
                .iter()
                .filter(|tp| lso.get(*tp) < hw.get(*tp))
                .map(|tp| tp.partition)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `wide-change`: see [`FaultKind::WideChange`].
    async fn wide_change(&mut self, report: &mut RoundReport, notes: &mut Vec<String>) {
        let Some(i) = self.owner(notes).await else {
            return notes.push("wide-change: no owner".into());
        };
        let pid = self.members[i].pid();
        let held = self.members[i].held();
        let p = held[self.rng.below(held.len())];
        let base = match self.committed_end(p).await {
            Ok(end) => end,
            Err(e) => return report.infra.push(format!("wide-change: {e}")),
        };
        // Frozen while the keys are written, the owner folds them all between two persists; thawed
        // after 1.5 s at the latest, half its session, should the writing take longer (a debug build).
        self.members[i].pause();
        let began = Instant::now();
        let mut producing = tokio::spawn(produce_wide(
            self.client.clone(),
            self.args.input.clone(),
            p,
            self.plan.seed,
        ));
        let early = tokio::time::timeout(Duration::from_millis(1500), &mut producing).await;
        let frozen_for = began.elapsed();
        self.members[i].resume();
        let written = match early {
            Ok(done) => done,
            Err(_) => producing.await,
        };
        match written {
            Ok(Ok(w)) => self.fault_events.extend(w),
            Ok(Err(e)) => return report.infra.push(format!("wide-change: {e}")),
            Err(e) => return report.infra.push(format!("wide-change task: {e}")),
        }
        // Kill it once its first transaction committed (the partition's read_committed end moved by
        // a whole wave), unless the persist already ended.
        let until = Instant::now() + Duration::from_secs(20);
        let mut seen = base;
        while Instant::now() < until {
            match self.committed_end(p).await {
                Ok(end) => seen = end,
                Err(e) => notes.push(format!("wide-change: {e}")),
            }
            if seen - base >= WIDE_WAVE as i64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if seen - base < WIDE_WAVE as i64 {
            notes.push(format!(
                "wide-change: partition {p} committed only {} records in 20 s",
                seen - base
            ));
            return;
        }
        // `i` still names it: nothing changed the members since `owner`.
        self.kill_member(i);
        // A commit already on its way completes on the broker without the member.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = self.committed_end(p).await.unwrap_or(seen);
        let split = after - base < WIDE_KEYS as i64;
        if split {
            report.split_persist_kills += 1;
        }
        notes.push(format!(
            "wide-change: wrote {WIDE_KEYS} keys to partition {p} while member {pid} was frozen \
             ({:.1}s); killed it with {} records committed since ({} after), {}",
            frozen_for.as_secs_f64(),
            seen - base,
            after - base,
            if split {
                "between the transactions of one persist"
            } else {
                "after its persist ended"
            }
        ));
        // The supervisor restarts it, on its directory when the round keeps state on disk.
        self.hold(Duration::from_millis(1500), notes).await;
    }

    /// The read_committed end of snapshot partition `p`.
    async fn committed_end(&self, p: i32) -> Result<i64, String> {
        let tp = TopicPartition::new(self.args.snapshots.as_str(), p);
        let ends = list_offsets(
            &self.client,
            std::slice::from_ref(&tp),
            OffsetSpec::Latest,
            IsolationLevel::ReadCommitted,
        )
        .await
        .map_err(|e| format!("the end of snapshot partition {p}: {e}"))?;
        ends.get(&tp)
            .copied()
            .ok_or_else(|| format!("no end for snapshot partition {p}"))
    }

    async fn open_foreign(&self, p: i32, key: Bytes) -> Result<TransactionalProducer, String> {
        let mut txn = TransactionalProducer::init(
            self.client.clone(),
            TransactionalConfig::new(unique("fc-foreign")),
        )
        .await
        .map_err(|e| e.to_string())?;
        txn.begin().map_err(|e| e.to_string())?;
        let record = ProducerRecord::new(
            self.args.snapshots.as_str(),
            Some(Bytes::from_static(b"not a snapshot")),
        )
        .key(key)
        .partition(p);
        let delivery = txn.send(record).await.map_err(|e| e.to_string())?;
        delivery.await.map_err(|e| e.to_string())?;
        Ok(txn)
    }

    async fn run(&mut self, report: &mut RoundReport) {
        for _ in 0..self.cfg.members {
            if let Err(e) = self.spawn_member().await {
                return report.infra.push(e);
            }
        }
        let initial = self.spawned;
        let stop = Arc::new(AtomicBool::new(false));
        let producer = tokio::spawn(produce(
            self.client.clone(),
            self.args.input.clone(),
            self.cfg.partitions,
            self.cfg.keys,
            self.plan.seed,
            self.plan.faults.contains(&FaultKind::Compaction),
            Arc::clone(&stop),
        ));
        let mut notes = Vec::new();
        // Let the group form and events flow before the first fault.
        self.hold(Duration::from_secs(2), &mut notes).await;
        for kind in self.plan.faults.clone() {
            self.fault(kind, report).await;
        }
        // Heal: every node up, every link clean, nobody frozen, at least two members.
        self.heal_node(report).await;
        self.heal_network();
        for m in self.members.iter_mut().filter(|m| m.is_paused()) {
            m.resume();
        }
        while self.members.len() < 2 {
            if let Err(e) = self.spawn_member().await {
                report.infra.push(e);
                break;
            }
        }
        self.hold(Duration::from_secs(1), &mut notes).await;
        notes.push(self.stamp("healed; input stops"));
        stop.store(true, Ordering::SeqCst);
        let written = match producer.await {
            Ok(Ok(mut w)) => {
                // A fault's keys are its own: no event of the producer's shares one.
                w.extend(std::mem::take(&mut self.fault_events));
                w
            }
            Ok(Err(e)) => {
                report.anomalies.push(format!("input producer: {e}"));
                return;
            }
            Err(e) => {
                report.infra.push(format!("input producer task: {e}"));
                return;
            }
        };
        report.events = written.values().map(Vec::len).sum();
        self.drain(report, &mut notes).await;
        notes.push(self.stamp("drained"));
        // Stop them all at once (each flushes and commits), then collect what each said.
        let mut members = std::mem::take(&mut self.members);
        for m in members.iter_mut() {
            m.request_stop();
        }
        for m in members {
            self.gone.push(close_member(m));
        }
        notes.push(self.stamp("members stopped"));
        report.restarts = self.spawned - initial;
        report.member_exits = self.exits;
        report.fence_exits = self.fence_exits.len();
        if self.plan.recover {
            // The tolerant policy recovers every spurious fence in place: an exit on one is a finding.
            report.anomalies.extend(self.fence_exits.iter().cloned());
        } else {
            notes.extend(self.fence_exits.iter().cloned());
        }
        for log in &self.gone {
            report.fences_recovered += log.stats[0];
            report.rejoins += log.stats[2];
            report.rebalances += log.stats[3];
            report.disk_resumed += log.disk[0];
            report.disk_fallbacks += log.disk[1];
            report.disk_loaded += log.disk[3];
        }
        for (pid, p) in &self.proxies {
            if let Err(e) = p.check() {
                report.infra.push(format!("proxy of member {pid}: {e}"));
            }
        }
        self.find_hanging(report).await;
        notes.push(self.stamp("finder done"));
        self.check(&written, report).await;
        notes.push(self.stamp("checked"));
        report.notes.append(&mut notes);
    }

    /// Waits until every input partition's committed offset reaches its end: every event folded and
    /// persisted. A round that never drains is an anomaly (the flows stopped making progress).
    async fn drain(&mut self, report: &mut RoundReport, notes: &mut Vec<String>) {
        let tps: Vec<TopicPartition> = (0..self.cfg.partitions)
            .map(|p| TopicPartition::new(self.args.input.as_str(), p))
            .collect();
        let ends = match list_offsets(
            &self.client,
            &tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        {
            Ok(e) => e,
            Err(e) => return report.infra.push(format!("input ends: {e}")),
        };
        let until = Instant::now() + Duration::from_secs(90);
        let mut last = BTreeMap::new();
        while Instant::now() < until {
            match committed_offsets(&self.client, &self.args.group, &tps).await {
                Ok(c) => {
                    let behind: Vec<_> = tps
                        .iter()
                        .filter(|tp| c.get(*tp).copied().flatten() < ends.get(*tp).copied())
                        .collect();
                    if behind.is_empty() {
                        return;
                    }
                    last = c;
                }
                Err(e) => notes.push(format!("committed offsets: {e}")),
            }
            self.hold(Duration::from_millis(300), notes).await;
        }
        report.anomalies.push(format!(
            "the flows never drained: committed {last:?}, input ends {ends:?}"
        ));
    }

    async fn find_hanging(&self, report: &mut RoundReport) {
        let Some(finder) = &self.cfg.finder else {
            report
                .notes
                .push("no hanging-transaction finder configured".into());
            return;
        };
        let output = self.args.output.as_deref();
        for topic in [
            Some(self.args.snapshots.as_str()),
            Some("__consumer_offsets"),
            output,
        ]
        .into_iter()
        .flatten()
        {
            match finder(self.kafka.bootstrap(), topic.to_owned()).await {
                Ok(found) => report.anomalies.extend(
                    found
                        .into_iter()
                        .map(|h| format!("hanging in {topic}: {h}")),
                ),
                Err(e) => report.infra.push(format!("finder on {topic}: {e}")),
            }
        }
    }

    /// The re-fold checker (see the module docs).
    async fn check(&self, written: &HashMap<Bytes, Vec<Bytes>>, report: &mut RoundReport) {
        if let Some(output) = &self.args.output {
            match count_outputs(&self.client, &self.args.input, output, self.cfg.partitions).await {
                Ok(c) => {
                    report.outputs_read = c.outputs;
                    report.outputs_lost = c.lost.len();
                    report.outputs_duplicated = c.duplicated.len();
                    for (key, offset) in c.lost.iter().take(5) {
                        report.anomalies.push(format!(
                            "{key:?}: the output of input offset {offset} was never committed (lost)"
                        ));
                    }
                    for ((key, offset), n) in c.duplicated.iter().take(5) {
                        report.anomalies.push(format!(
                            "{key:?}: the output of input offset {offset} was committed {n} times"
                        ));
                    }
                    let more =
                        (c.lost.len().saturating_sub(5)) + (c.duplicated.len().saturating_sub(5));
                    if more > 0 {
                        report
                            .anomalies
                            .push(format!("{more} more lost or duplicated outputs"));
                    }
                }
                Err(e) => report.anomalies.push(format!("reading the outputs: {e}")),
            }
        }
        if let Some(url) = &self.cfg.postgres {
            return self.check_postgres(url, written, report).await;
        }
        let mut read: HashMap<Bytes, Vec<Seen>> = HashMap::new();
        for p in 0..self.cfg.partitions {
            let mut log = PartitionLog::new(self.client.clone(), &self.args.snapshots, p);
            let config = RecoveryConfig {
                stall_timeout: Some(Duration::from_secs(60)),
                ..RecoveryConfig::default()
            };
            let mut records = Vec::new();
            // The fold lends slices of the fetch buffer; copies keep only the records, not the buffers.
            let keep = |k: &[u8], v: Option<&[u8]>| {
                records.push((Bytes::copy_from_slice(k), v.map(Bytes::copy_from_slice)))
            };
            if let Err(e) = read_to_target(&mut log, p, &config, keep).await {
                report
                    .anomalies
                    .push(format!("reading snapshot partition {p}: {e}"));
                continue;
            }
            for (key, value) in records {
                report.snapshots_read += 1;
                if self.foreign_keys.contains(&key) {
                    report.anomalies.push(format!(
                        "partition {p}: the aborted foreign write of {key:?} was read"
                    ));
                    continue;
                }
                let seen = match value.as_deref() {
                    None => Seen::Deleted,
                    Some(v) if is_grave(v) => Seen::Deleted,
                    Some(v) => match tally_of_snapshot(v) {
                        Some(t) => Seen::Snapshot(t),
                        None => {
                            report.anomalies.push(format!(
                                "partition {p}: key {key:?} has a value that is not a snapshot: \
                                 {value:?}"
                            ));
                            continue;
                        }
                    },
                };
                read.entry(key).or_default().push(seen);
            }
        }
        let mut last_position: HashMap<&Bytes, usize> = HashMap::new();
        for (key, seen) in &read {
            let events = written.get(key).map(Vec::as_slice).unwrap_or_default();
            let (problems, at) = check_key(events, seen);
            report
                .anomalies
                .extend(problems.into_iter().map(|p| format!("{key:?}: {p}")));
            last_position.insert(key, at);
        }
        for (key, events) in written {
            let want = fold_all(events);
            let got = read.get(key).and_then(|s| s.last()).and_then(|s| match s {
                Seen::Snapshot(t) => Some(*t),
                Seen::Deleted => None,
            });
            if got != want {
                report.anomalies.push(format!(
                    "{key:?}: recovered {got:?}, but the fold of all {} events is {want:?}",
                    events.len()
                ));
            }
        }
        let mut reported: HashSet<(Bytes, Tally)> = HashSet::new();
        for log in &self.gone {
            reported.extend(log.committed.iter().cloned());
        }
        report.snapshots_reported = reported.len();
        let compacting = self.plan.faults.contains(&FaultKind::Compaction);
        for (key, t) in &reported {
            let in_log = read
                .get(key)
                .is_some_and(|s| s.contains(&Seen::Snapshot(*t)));
            // The cleaner removes a snapshot once a later one of its key exists: there, a reported
            // snapshot must be a fold of the input no later than what the log holds now.
            let superseded = compacting && {
                let events = written.get(key).map(Vec::as_slice).unwrap_or_default();
                // A key whose last record is a delete, or that the log no longer holds at all (its
                // tombstone cleaned away), stands at the end of its events: the recovered-state check
                // above holds that to the fold of all of them (a delete can match any of the key's
                // deletes, so its position from `check_key` may be an earlier one).
                let end = match read.get(key).and_then(|s| s.last()) {
                    Some(Seen::Snapshot(_)) => last_position.get(key).copied().unwrap_or(0),
                    Some(Seen::Deleted) | None => events.len(),
                };
                positions(events, t).iter().any(|p| *p <= end)
            };
            if !in_log && !superseded {
                report.anomalies.push(format!(
                    "{key:?}: committed snapshot {t:?} reported by a member is not in the log (lost)"
                ));
            }
        }
    }

    /// The checker on the PostgreSQL store. The store keeps each key's last snapshot; the harness's
    /// trigger keeps every write in commit order (`postgres_history`), so the same checks as on the
    /// snapshot topic's log apply: every write a fold of its key's first N events with the counts never
    /// going back (a stale owner's late rows would), no write of a key no input wrote, each key's row
    /// equal to the fold of all its events, and every snapshot a member reported committed among the
    /// writes.
    async fn check_postgres(
        &self,
        url: &str,
        written: &HashMap<Bytes, Vec<Bytes>>,
        report: &mut RoundReport,
    ) {
        let (history, now) = match postgres_rows(url, &self.args.txn_prefix).await {
            Ok(rows) => rows,
            Err(e) => return report.infra.push(format!("reading PostgreSQL: {e}")),
        };
        let seen_of = |partition: i32,
                       key: &Bytes,
                       value: &Option<Vec<u8>>,
                       report: &mut RoundReport|
         -> Option<Seen> {
            match value.as_deref() {
                None => Some(Seen::Deleted),
                Some(v) if is_grave(v) => Some(Seen::Deleted),
                Some(v) => match tally_of_snapshot(v) {
                    Some(t) => Some(Seen::Snapshot(t)),
                    None => {
                        report.anomalies.push(format!(
                            "partition {partition}: key {key:?} has a value that is not a snapshot: {v:?}"
                        ));
                        None
                    }
                },
            }
        };
        let mut read: HashMap<Bytes, Vec<Seen>> = HashMap::new();
        for (partition, key, value) in &history {
            report.snapshots_read += 1;
            if !written.contains_key(key) {
                report.anomalies.push(format!(
                    "partition {partition}: a row for {key:?}, which no input wrote"
                ));
            }
            if let Some(seen) = seen_of(*partition, key, value, report) {
                read.entry(key.clone()).or_default().push(seen);
            }
        }
        for (key, seen) in &read {
            let events = written.get(key).map(Vec::as_slice).unwrap_or_default();
            let (problems, _) = check_key(events, seen);
            report
                .anomalies
                .extend(problems.into_iter().map(|p| format!("{key:?}: {p}")));
        }
        let mut state: HashMap<Bytes, Seen> = HashMap::new();
        for (partition, key, value) in &now {
            if let Some(seen) = seen_of(*partition, key, value, report) {
                state.insert(key.clone(), seen);
            }
        }
        for (key, events) in written {
            let want = fold_all(events);
            let got = match state.get(key) {
                Some(Seen::Snapshot(t)) => Some(*t),
                _ => None,
            };
            if got != want {
                report.anomalies.push(format!(
                    "{key:?}: recovered {got:?}, but the fold of all {} events is {want:?}",
                    events.len()
                ));
            }
        }
        let mut reported: HashSet<(Bytes, Tally)> = HashSet::new();
        for log in &self.gone {
            reported.extend(log.committed.iter().cloned());
        }
        report.snapshots_reported = reported.len();
        for (key, t) in &reported {
            if !read
                .get(key)
                .is_some_and(|s| s.contains(&Seen::Snapshot(*t)))
            {
                report.anomalies.push(format!(
                    "{key:?}: committed snapshot {t:?} reported by a member was never written (lost)"
                ));
            }
        }
    }

    async fn cleanup(&mut self) {
        for m in self.members.drain(..) {
            drop(m);
        }
        if let Some(node) = self.down.take() {
            let _ = restart_node(self.kafka, node).await;
        }
        for t in [&self.args.input, &self.args.snapshots] {
            let _ = snapfence::admin::delete_topic(&self.client, t).await;
        }
        if let Some(dir) = &self.round_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The campaign's history of the PostgreSQL store: the store keeps each key's last snapshot only, so a
/// stale owner's write that a newer one overwrote later would leave no trace to check. A trigger (the
/// harness's, not the store's) appends every write and delete of the snapshot table, in commit order
/// of the row locks, to `snapfence_history`, which the checker reads like the snapshot topic's log.
/// Creates the store's tables first (the store's own schema, `PgStoreConfig::schema_sql`).
async fn postgres_history(url: &str) -> Result<(), String> {
    let schema = snapfence::snapshot::postgres::PgStoreConfig::new(url)
        .schema_sql()
        .ok_or("the default table prefix is not an identifier")?;
    let history = "
        CREATE TABLE IF NOT EXISTS snapfence_history (
          id bigserial PRIMARY KEY, prefix text NOT NULL, partition integer NOT NULL,
          key bytea NOT NULL, value bytea);
        CREATE OR REPLACE FUNCTION snapfence_history_append() RETURNS trigger AS $$
        BEGIN
          IF TG_OP = 'DELETE' THEN
            INSERT INTO snapfence_history (prefix, partition, key, value)
              VALUES (OLD.prefix, OLD.partition, OLD.key, NULL);
            RETURN OLD;
          END IF;
          INSERT INTO snapfence_history (prefix, partition, key, value)
            VALUES (NEW.prefix, NEW.partition, NEW.key, NEW.value);
          RETURN NEW;
        END $$ LANGUAGE plpgsql;
        DROP TRIGGER IF EXISTS snapfence_history_trigger ON snapfence_snapshots;
        CREATE TRIGGER snapfence_history_trigger AFTER INSERT OR UPDATE OR DELETE
          ON snapfence_snapshots FOR EACH ROW EXECUTE FUNCTION snapfence_history_append();";
    let (pg, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let task = tokio::spawn(connection);
    let result = async {
        pg.batch_execute(&schema).await?;
        pg.batch_execute(history).await
    }
    .await
    .map_err(|e| e.to_string());
    drop(pg);
    let _ = task.await;
    result
}

/// The PostgreSQL store's writes for the flow `prefix`, in the order they committed (the history
/// table), and its rows now: each as (partition, key, value; `None` for a delete).
type PgWrite = (i32, Bytes, Option<Vec<u8>>);

async fn postgres_rows(url: &str, prefix: &str) -> Result<(Vec<PgWrite>, Vec<PgWrite>), String> {
    let (pg, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let task = tokio::spawn(connection);
    let read = |sql: &'static str| {
        let pg = &pg;
        async move {
            pg.query(sql, &[&prefix]).await.map(|rows| {
                rows.into_iter()
                    .map(|r| {
                        let key: Vec<u8> = r.get(1);
                        (r.get::<_, i32>(0), Bytes::from(key), r.get(2))
                    })
                    .collect::<Vec<PgWrite>>()
            })
        }
    };
    let history =
        read("SELECT partition, key, value FROM snapfence_history WHERE prefix = $1 ORDER BY id")
            .await;
    let now = read("SELECT partition, key, value FROM snapfence_snapshots WHERE prefix = $1").await;
    drop(pg);
    let _ = task.await;
    Ok((
        history.map_err(|e| e.to_string())?,
        now.map_err(|e| e.to_string())?,
    ))
}

/// Stops a member (it flushes and commits) with a 10 s grace. The wait blocks, so it runs with
/// `block_in_place`: the member's proxy runs on this runtime and must keep forwarding its last flush.
fn close_member(m: MemberProcess) -> MemberLog {
    tokio::task::block_in_place(|| m.close(Duration::from_secs(10)))
}

/// How many records the cleaner removed from partition `p` of `topic`: the offsets from the first
/// batch to the high watermark, minus the records the batches still hold (without cleaning every
/// offset holds a record, data or transaction marker). Returns (removed, offsets spanned).
pub async fn removed_records(client: &Client, topic: &str, p: i32) -> Result<(i64, i64), String> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use snapfence::net::{CallOptions, Target, Verdict};
    let mut offset = 0i64;
    let mut first: Option<i64> = None;
    let mut held = 0i64;
    loop {
        let build = |_v: i16| {
            FetchRequest::default()
                .with_replica_id((-1).into())
                .with_max_wait_ms(10)
                .with_min_bytes(1)
                .with_max_bytes(8 << 20)
                .with_isolation_level(0)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(p)
                        .with_fetch_offset(offset)
                        .with_log_start_offset(-1)
                        .with_current_leader_epoch(-1)
                        .with_partition_max_bytes(4 << 20)])])
        };
        let options = CallOptions {
            max_version: Some(12),
            ..CallOptions::default()
        };
        let resp = client
            .call(Target::leader(topic, p), &options, build, |r, _| {
                Verdict::Done(r)
            })
            .await
            .map_err(|e| e.to_string())?;
        let part = resp
            .responses
            .first()
            .and_then(|t| t.partitions.first())
            .ok_or("an empty fetch answer")?;
        if part.error_code != 0 {
            return Err(format!("fetch error {}", part.error_code));
        }
        let hw = part.high_watermark;
        let mut next = offset;
        for b in snapfence::records::decode_batches(part.records.clone().unwrap_or_default()) {
            let b = b.map_err(|e| e.to_string())?;
            first.get_or_insert(b.base_offset());
            held += i64::from(b.record_count());
            next = b.next_offset();
        }
        if next <= offset || next >= hw {
            let span = hw - first.unwrap_or(hw);
            return Ok(((span - held).max(0), span));
        }
        offset = next;
    }
}

/// One record of a key in the snapshot log, as the checker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A snapshot with this tally.
    Snapshot(Tally),
    /// A grave or a tombstone: the key was deleted.
    Deleted,
}

/// A grave: the flow's envelope for a deleted key (tag 2, then the delete's offset).
fn is_grave(value: &[u8]) -> bool {
    value.len() == 9 && value[0] == 2
}

/// The first index of every stretch of `events` between deletes (0, and one past each delete).
fn segment_starts(events: &[Bytes]) -> Vec<usize> {
    std::iter::once(0)
        .chain(
            events
                .iter()
                .enumerate()
                .filter(|(_, v)| is_delete(v))
                .map(|(i, _)| i + 1),
        )
        .collect()
}

/// Where in `events` the tally `t` can stand: every `end` such that the events from a segment start
/// to `end` (no delete among them) fold to `t`.
fn positions(events: &[Bytes], t: &Tally) -> Vec<usize> {
    let n = usize::try_from(t.count).unwrap_or(usize::MAX);
    segment_starts(events)
        .into_iter()
        .filter_map(|s| {
            let end = s.checked_add(n)?;
            let stretch = events.get(s..end)?;
            (!stretch.iter().any(|v| is_delete(v)) && fold_all(stretch) == Some(*t)).then_some(end)
        })
        .collect()
}

/// Checks one key's records in log order against its events: each snapshot must be the fold of the
/// events from a segment start (the first event, or the one after a delete) up to some point, each
/// delete must stand for a delete event, and those points must never go back (a stale write would
/// move them back). Returns the problems and the last point reached.
fn check_key(events: &[Bytes], seen: &[Seen]) -> (Vec<String>, usize) {
    let deletes: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, v)| is_delete(v))
        .map(|(i, _)| i + 1)
        .collect();
    let mut problems = Vec::new();
    let mut at = 0usize;
    for s in seen {
        let candidates = match s {
            Seen::Snapshot(t) => {
                let c = positions(events, t);
                if c.is_empty() {
                    problems.push(format!(
                        "snapshot {t:?} is not the fold of a run of its {} events",
                        events.len()
                    ));
                    continue;
                }
                c
            }
            Seen::Deleted => {
                if deletes.is_empty() {
                    problems.push("deleted, but none of its events is a delete".into());
                    continue;
                }
                deletes.clone()
            }
        };
        match candidates.iter().find(|p| **p >= at) {
            Some(p) => at = *p,
            None => problems.push(format!(
                "snapshots went back from {at} to {} events (a stale write landed)",
                candidates.iter().max().copied().unwrap_or(0)
            )),
        }
    }
    (problems, at)
}

/// The tally inside a snapshot value: the flow's envelope (version byte, last folded offset) followed by
/// the [`crate::tally::Counter`] encoding, which is the last 16 bytes.
pub fn tally_of_snapshot(value: &[u8]) -> Option<Tally> {
    use snapfence::snapshot::Fold as _;
    let body = value.len().checked_sub(16).map(|at| &value[at..])?;
    (value.len() == 9 + 16)
        .then(|| crate::tally::Counter.decode(body).ok())
        .flatten()
}

async fn restart_node(kafka: &KafkaCluster, node: i32) -> Result<(), String> {
    // The fixture's restart blocks until the cluster is ready again; block_in_place lets the runtime's
    // other tasks (the input producer) run meanwhile. Needs a multi-threaded runtime.
    tokio::task::block_in_place(|| kafka.restart_blocking(node)).map_err(|e| e.to_string())
}

/// The input producer: bursts of events to random keys (a key always goes to partition `key % partitions`)
/// until `stop`; returns every event it wrote per key, in the order written. With `deletes`, one event in
/// eight deletes its key ([`is_delete`]), so the snapshot log gets graves and tombstones for the cleaner.
/// Each input event's committed outputs, as [`count_outputs`] finds them.
#[derive(Debug, Default)]
pub struct OutputCount {
    /// Input events read.
    pub events: usize,
    /// Outputs read at read_committed.
    pub outputs: usize,
    /// Input events (key, offset) with no output.
    pub lost: Vec<(Bytes, i64)>,
    /// Input events with more than one output, and how many.
    pub duplicated: Vec<((Bytes, i64), usize)>,
}

/// Reads every partition of `topic` from the start to the end `isolation` reports (the LSO at
/// read_committed), as (key, value, offset); fails when a partition makes no progress for 60 s.
pub async fn read_topic(
    client: &Client,
    topic: &str,
    partitions: i32,
    isolation: IsolationLevel,
) -> Result<Vec<(Option<Bytes>, Option<Bytes>, i64)>, String> {
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    let ends = list_offsets(client, &tps, OffsetSpec::Latest, isolation)
        .await
        .map_err(|e| format!("{topic} ends: {e}"))?;
    let mut config = ReaderConfig::default();
    config.isolation = isolation;
    let mut out = Vec::new();
    for tp in tps {
        let end = ends.get(&tp).copied().unwrap_or(0);
        let mut reader = PartitionReader::new(client.clone(), config.clone());
        reader.assign(tp.clone(), StartAt::Earliest);
        let deadline = Instant::now() + Duration::from_secs(60);
        while end > 0 && reader.position(&tp).is_none_or(|p| p < end) {
            let fetched = reader.fetch().await.map_err(|e| format!("{tp:?}: {e}"))?;
            for part in fetched {
                out.extend(part.records.into_iter().map(|r| (r.key, r.value, r.offset)));
            }
            if Instant::now() > deadline {
                return Err(format!("{tp:?}: never read to {end}"));
            }
        }
    }
    Ok(out)
}

/// Waits until no transaction is open on any partition of `topic` (its LSO equals its high watermark):
/// a commit returns once the coordinator has it, and the markers that make its records visible follow
/// a moment later. Fails after 30 s with the gaps still open (a hanging transaction).
pub async fn settled(client: &Client, topic: &str, partitions: i32) -> Result<(), String> {
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let stable = list_offsets(
            client,
            &tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadCommitted,
        )
        .await
        .map_err(|e| format!("{topic} LSO: {e}"))?;
        let high = list_offsets(
            client,
            &tps,
            OffsetSpec::Latest,
            IsolationLevel::ReadUncommitted,
        )
        .await
        .map_err(|e| format!("{topic} high watermark: {e}"))?;
        let open: Vec<_> = tps
            .iter()
            .filter(|tp| stable.get(*tp) != high.get(*tp))
            .map(|tp| (tp.partition, stable.get(tp), high.get(tp)))
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!(
                "{topic}: transactions still open after 30 s (partition, LSO, HW): {open:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Counts, for every event of `input` (keyed, not transactional), the outputs in `output` an
/// [`Echo`](crate::tally::Echo) fold emitted for it (same key, value the input offset), as a
/// read_committed consumer sees them once no transaction is open on `output`.
pub async fn count_outputs(
    client: &Client,
    input: &str,
    output: &str,
    partitions: i32,
) -> Result<OutputCount, String> {
    let events = read_topic(client, input, partitions, IsolationLevel::ReadUncommitted).await?;
    settled(client, output, partitions).await?;
    let outputs = read_topic(client, output, partitions, IsolationLevel::ReadCommitted).await?;
    let mut counts: BTreeMap<(Bytes, i64), usize> = BTreeMap::new();
    for (key, value, _) in &outputs {
        let offset = value
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| format!("an output that is not an input offset: {value:?}"))?;
        *counts
            .entry((key.clone().unwrap_or_default(), offset))
            .or_default() += 1;
    }
    let keyed: Vec<(Bytes, i64)> = events
        .into_iter()
        .filter_map(|(k, _, offset)| Some((k?, offset)))
        .collect();
    Ok(OutputCount {
        events: keyed.len(),
        outputs: outputs.len(),
        lost: keyed
            .iter()
            .filter(|e| !counts.contains_key(*e))
            .cloned()
            .collect(),
        duplicated: counts.into_iter().filter(|(_, n)| *n > 1).collect(),
    })
}

/// Any delivery failure is returned as an error, because the oracle would not know whether the event
/// exists.
async fn produce(
    client: Client,
    input: String,
    partitions: i32,
    keys: usize,
    seed: u64,
    deletes: bool,
    stop: Arc<AtomicBool>,
) -> Result<HashMap<Bytes, Vec<Bytes>>, String> {
    let producer = Producer::new(client, ProducerConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut rng = Rng::new(seed ^ 0x1ae0);
    let mut written: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut burst = Vec::new();
        for _ in 0..5 {
            seq += 1;
            let k = rng.below(keys.max(1));
            let key = Bytes::from(format!("k{k:02}"));
            let value = if deletes && rng.below(8) == 0 {
                Bytes::from(format!("{seed:x}-{seq}-del"))
            } else {
                Bytes::from(format!("{seed:x}-{seq}"))
            };
            let record = ProducerRecord::new(input.as_str(), Some(value.clone()))
                .key(key.clone())
                .partition(k as i32 % partitions.max(1));
            let d = producer.send(record).await.map_err(|e| e.to_string())?;
            burst.push((key, value, d));
        }
        for (key, value, d) in burst {
            d.await.map_err(|e| format!("event {value:?}: {e}"))?;
            written.entry(key).or_default().push(value);
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    producer.close().await;
    Ok(written)
}

/// Writes [`WIDE_KEYS`] events to input partition `p`, each to a key of its own that no other event
/// has (`w<p>-<n>`), as fast as the producer takes them. Returns them as the checker counts events.
async fn produce_wide(
    client: Client,
    input: String,
    p: i32,
    seed: u64,
) -> Result<HashMap<Bytes, Vec<Bytes>>, String> {
    let producer = Producer::new(client, ProducerConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut written = HashMap::with_capacity(WIDE_KEYS);
    let mut pending = Vec::with_capacity(WIDE_KEYS);
    for n in 0..WIDE_KEYS {
        let key = Bytes::from(format!("w{p}-{n:05}"));
        let value = Bytes::from(format!("{seed:x}-w{n}"));
        let record = ProducerRecord::new(input.as_str(), Some(value.clone()))
            .key(key.clone())
            .partition(p);
        pending.push(producer.send(record).await.map_err(|e| e.to_string())?);
        written.insert(key, vec![value]);
    }
    for d in pending {
        d.await.map_err(|e| format!("wide-change event: {e}"))?;
    }
    producer.close().await;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round's plan is a function of its seed, so a failing round replays exactly, while across rounds
    /// every fault kind and every group protocol gets drawn.
    #[test]
    fn plans_replay_from_their_seed_and_vary() {
        let a = RoundPlan::draw(7, 3);
        assert_eq!(a, RoundPlan::draw(7, 3));
        assert_eq!(a, RoundPlan::from_seed(a.seed));
        assert!((1..=2).contains(&a.faults.len()));
        let kinds: HashSet<FaultKind> = (0..200)
            .flat_map(|r| RoundPlan::draw(1, r).faults)
            .collect();
        assert_eq!(kinds.len(), FaultKind::ALL.len(), "every kind gets drawn");
        let protocols: HashSet<bool> = (0..50)
            .map(|r| RoundPlan::draw(1, r).consumer_protocol)
            .collect();
        assert_eq!(protocols.len(), 2);
        let plans: Vec<RoundPlan> = (0..60).map(|r| RoundPlan::draw(1, r)).collect();
        assert!(
            plans.iter().any(|p| p.eager),
            "some classic rounds run eager"
        );
        assert!(plans.iter().any(|p| !p.eager && !p.consumer_protocol));
        assert!(plans.iter().all(|p| !(p.eager && p.consumer_protocol)));
        let classic = plans.iter().find(|p| p.consumer_protocol).unwrap().clone();
        assert!(!classic.classic_only().consumer_protocol);
        let only = RoundPlan::draw_among(1, 5, &[FaultKind::Zombie]);
        assert_eq!(only.faults, vec![FaultKind::Zombie]);
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::from_name(k.name()), Some(k));
        }
    }

    /// The per-key check accepts snapshots that move forward through deletes and flags one that goes
    /// back, spans a delete, or folds none of the key's events.
    #[test]
    fn the_key_check_follows_deletes_and_catches_a_stale_write() {
        let ev: Vec<Bytes> = ["a", "b", "c-del", "d", "e"]
            .iter()
            .map(|v| Bytes::from(v.to_string()))
            .collect();
        let t = |vs: &[Bytes]| Seen::Snapshot(fold_all(vs).unwrap());
        let good = [
            t(&ev[..1]),
            t(&ev[..2]),
            Seen::Deleted,
            t(&ev[3..4]),
            t(&ev[3..5]),
        ];
        assert_eq!(check_key(&ev, &good), (vec![], 5));
        // A stale snapshot after a newer one, and after the delete.
        let (p, _) = check_key(&ev, &[t(&ev[..2]), t(&ev[..1])]);
        assert!(p[0].contains("went back"), "{p:?}");
        let (p, _) = check_key(&ev, &[t(&ev[3..4]), t(&ev[..2])]);
        assert!(p[0].contains("went back"), "{p:?}");
        // A tally that spans a delete is no fold of a run.
        let spanning = Seen::Snapshot(fold_all([&ev[0], &ev[1], &ev[3]]).unwrap());
        assert!(check_key(&ev, &[spanning]).0[0].contains("not the fold"));
        assert!(check_key(&ev[..2], &[Seen::Deleted]).0[0].contains("none of its events"));
        assert!(is_grave(&[2, 0, 0, 0, 0, 0, 0, 0, 7]));
        assert!(!is_grave(&[1, 0, 0, 0, 0, 0, 0, 0, 7]));
    }

    /// A snapshot value yields the tally it carries, and bytes that are not a snapshot yield none rather
    /// than a false reading.
    #[test]
    fn a_snapshot_value_yields_its_tally_and_garbage_does_not() {
        use snapfence::snapshot::Fold as _;
        let t = Tally { count: 3, hash: 9 };
        let mut v = vec![1u8, 0, 0, 0, 0, 0, 0, 0, 5];
        v.extend_from_slice(&crate::tally::Counter.encode(&t));
        assert_eq!(tally_of_snapshot(&v), Some(t));
        assert_eq!(tally_of_snapshot(b"not a snapshot"), None);
        assert_eq!(tally_of_snapshot(&v[1..]), None);
    }

    /// The campaign summary counts each fault kind and names the seed to replay for every round with an
    /// anomaly, and only for those.
    #[test]
    fn the_summary_counts_faults_and_names_replay_seeds() {
        let plan = RoundPlan {
            seed: 0xabc,
            consumer_protocol: false,
            eager: false,
            faults: vec![FaultKind::Zombie, FaultKind::ForeignTxn],
            recover: false,
        };
        let mut r = RoundReport {
            plan,
            broker: "4.4.0".into(),
            transaction_version: 2,
            transactional: true,
            events: 10,
            snapshots_read: 1,
            outputs_read: 0,
            outputs_lost: 0,
            outputs_duplicated: 0,
            snapshots_reported: 1,
            restarts: 0,
            open_txn_kills: 0,
            member_exits: 0,
            fence_exits: 0,
            rebalances: 0,
            fences_recovered: 0,
            rejoins: 0,
            disk_resumed: 0,
            disk_fallbacks: 0,
            disk_loaded: 0,
            compacted: 0,
            split_persist_kills: 0,
            anomalies: vec![],
            infra: vec![],
            notes: vec![],
            elapsed: Duration::from_secs(1),
        };
        let clean = summary(std::slice::from_ref(&r));
        assert!(clean.contains("anomalies: 0"), "{clean}");
        assert!(!clean.contains("replay"), "{clean}");
        r.anomalies.push("k: went back".into());
        let bad = summary(&[r]);
        assert!(bad.contains("zombie                   1"), "{bad}");
        assert!(bad.contains("--round-seed 0x0000000000000abc"), "{bad}");
    }
}
