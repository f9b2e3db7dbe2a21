//! `demo --story outputs`: exactly-once output (issue 33), told on screen against a real broker, once
//! with the fence and once without it.
//!
//! The fold confirms every deposit it folds with one record on a confirmations topic (keyed by account,
//! carrying the deposit's input offset). Owner A, a process of its own, folds and flushes; its next
//! flush is caught at its last step, with the wave's records in the log and the step that would make
//! them count not yet sent (the EndTxn fenced, the OffsetCommit unfenced; [`super::gate`] holds it), and
//! A is killed there. Owner B, another process, takes over, recovers and replays: what it folds again it
//! confirms again. Then B is made a zombie: frozen with a flush just begun (its first request held)
//! past its session timeout, while owner C (in this process) takes over, folds and confirms B's
//! deposits; B is thawed and its stale flush goes out. At the end a read_committed reader of the
//! confirmations topic counts the confirmations of each deposit. Fenced: each exactly once (A's open
//! transaction is aborted by B's takeover, B's stale flush is refused). Unfenced: the kill does not
//! duplicate (B's replay skips what A's landed snapshot covers), but the zombie's stale flush lands beside
//! C's, and those deposits are confirmed twice.
//!
//! The same guarantee without narration is `protocol-tests/tests/outputs.rs` (many keys, four
//! partitions, timed freezes); this one is written for a reader, as the handover story is.
//!
//! # References
//! - KIP-98 (transactions, read_committed, the LSO), KIP-447 (generation-fenced TxnOffsetCommit);
//!   `docs/fencing.md`, "Outputs"

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use bytes::Bytes;
use snapfence::consumer::{
    list_offsets, OffsetSpec, PartitionReader, ReaderConfig, StartAt, TopicPartition,
};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::{Flow, PersistenceMode};

use super::gate::{
    ADD_OFFSETS_TO_TXN, ADD_PARTITIONS_TO_TXN, END_TXN, OFFSET_COMMIT, PRODUCE, TXN_OFFSET_COMMIT,
};
use super::owner::{Flush, OwnerProcess, Refusal};
use super::{
    both, catch_up, delete_topics, evicted, failed, flow_config, generation, numbers, say,
    show_offset, stamp, wrap, Confirmation, DemoArgs, Ledger, Names, Setting, OTHERS_SESSION,
    STEP_LIMIT, WIDTH,
};
use crate::error::CliError;
use crate::security::SecurityArgs;

/// What a read_committed reader of the confirmations topic saw, per deposit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Count {
    /// Deposits written.
    pub deposits: usize,
    /// Confirmations a read_committed reader sees.
    pub confirmations: usize,
    /// Deposits with no confirmation.
    pub lost: Vec<u64>,
    /// Deposits confirmed more than once, and how often.
    pub duplicated: Vec<(u64, usize)>,
}

impl Count {
    /// Every deposit confirmed once, nothing else.
    pub(crate) fn exactly_once(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.confirmations == self.deposits
    }

    /// "#16-#20 twice" or "#3 three times, #4 twice".
    fn duplicates(&self) -> String {
        let mut by_times: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for (n, times) in &self.duplicated {
            by_times.entry(*times).or_default().push(*n);
        }
        by_times
            .iter()
            .map(|(times, ns)| {
                let times = match times {
                    2 => "twice".to_owned(),
                    3 => "three times".to_owned(),
                    t => format!("{t} times"),
                };
                format!("{} {times}", numbers(ns))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A count taken mid-story, when the latest deposits may not be confirmed yet: how many
    /// confirmations, and which deposits have none so far.
    fn so_far(&self) -> String {
        let mut s = format!("{} confirmations", self.confirmations);
        if !self.lost.is_empty() {
            s.push_str(&format!(" (none yet for {})", numbers(&self.lost)));
        }
        if !self.duplicated.is_empty() {
            s.push_str(&format!(", deposits {}", self.duplicates()));
        }
        s
    }

    /// The count in a sentence.
    fn sentence(&self) -> String {
        let mut s = format!(
            "{} deposits, {} confirmations",
            self.deposits, self.confirmations
        );
        if self.exactly_once() {
            s.push_str(": every deposit confirmed exactly once");
        }
        if !self.duplicated.is_empty() {
            s.push_str(&format!(": DUPLICATED, deposits {}", self.duplicates()));
        }
        if !self.lost.is_empty() {
            s.push_str(&format!(
                "{} LOST, deposits {} never confirmed",
                if self.duplicated.is_empty() { ":" } else { ";" },
                numbers(&self.lost)
            ));
        }
        s
    }
}

/// How one run ended.
#[derive(Debug, Clone)]
pub(crate) struct Ending {
    /// The request A's gate held when A was killed.
    pub kill_held: &'static str,
    /// A's confirmations were in the log but not visible to read_committed readers when A was killed.
    pub open_at_kill: bool,
    /// The deposits B folded and confirmed again after A's kill.
    pub refolded: Vec<u64>,
    /// B's stale flush after its thaw: the refusal, or `None` when it landed.
    pub zombie: Option<Refusal>,
    /// The final count.
    pub count: Count,
}

/// Both runs, and the cleanup of a user's cluster.
pub(crate) async fn tell(
    bootstrap: &str,
    security: &SecurityArgs,
    exe: &std::path::Path,
    args: &DemoArgs,
    users_cluster: bool,
    out: &mut dyn Write,
) -> Result<(Ending, Ending), CliError> {
    let setting = Setting::connect(bootstrap, security, exe, None, out).await?;
    writeln!(
        out,
        "{}\n",
        wrap(
            "The setup: deposits to two accounts, alice and bob, arrive on a one-partition input topic. The \
             owner of the partition folds them into a balance per account, persists each account as a \
             snapshot in a compacted topic, commits the input offset its snapshots cover, and confirms \
             every deposit it folds with one record on a confirmations topic (keyed by account, carrying \
             the deposit's input offset). A confirmation is an output: a downstream reader acts on it, so \
             it must be seen once per deposit, neither lost nor twice. The story runs twice: first with \
             snapfence's fence (outputs produced in the same Kafka transaction as the snapshot of the \
             state that made them and the generation-fenced offset commit), then without it (plain writes, \
             at least once). Owners A and B run as separate snapfence processes, so that killing or \
             pausing one stops all of it; their connections pass a gate that can hold one request, so \
             each is caught at an exact step of a flush.",
            WIDTH
        )
        .join("\n")
    )?;
    let mut topics = Vec::new();
    let fenced = Run::new(&setting, PersistenceMode::Transactional, out, &mut topics)
        .await?
        .tell(1)
        .await;
    let unfenced = match &fenced {
        Ok(_) => Some(
            Run::new(
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

/// The verdict line (the last line) and the exit status: PASS only when the fenced run confirmed every
/// deposit exactly once with B's stale flush refused, and the unfenced run shows duplicates.
pub(crate) fn verdict(
    fenced: &Ending,
    unfenced: &Ending,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let fenced_ok = fenced.count.exactly_once() && fenced.zombie.is_some();
    let duplicated = !unfenced.count.duplicated.is_empty();
    if let (true, true, Some(refusal)) = (fenced_ok, duplicated, &fenced.zombie) {
        writeln!(
            out,
            "verdict: PASS: fenced, a read_committed reader saw each of the {} deposits confirmed exactly \
             once, through A's kill at its {}{} and B's stale flush (refused by {}); unfenced, it saw \
             deposits {} (at least once)",
            fenced.count.deposits,
            fenced.kill_held,
            match (fenced.open_at_kill, fenced.refolded.is_empty()) {
                (true, false) => format!(
                    " with its transaction open (B re-folded and re-confirmed {})",
                    numbers(&fenced.refolded)
                ),
                _ => String::new(),
            },
            refusal.named(),
            unfenced.count.duplicates()
        )?;
        return Ok(());
    }
    let mut detail = Vec::new();
    if !fenced.count.exactly_once() {
        detail.push(format!(
            "fenced, the read_committed count is not exactly once ({})",
            fenced.count.sentence()
        ));
    }
    if fenced.zombie.is_none() {
        detail.push("fenced, B's stale flush was not refused".to_owned());
    }
    if !duplicated {
        detail.push(format!(
            "unfenced, no deposit was confirmed twice, so the duplicates did not show ({})",
            unfenced.count.sentence()
        ));
    }
    let detail = detail.join("; ");
    writeln!(out, "verdict: FAIL: {detail}")?;
    Err(CliError::DemoFailed { detail })
}

/// One deposit written to the input.
#[derive(Debug, Clone)]
struct Deposit {
    account: &'static str,
    number: u64,
    offset: i64,
}

/// One run of the story.
struct Run<'a> {
    setting: &'a Setting,
    mode: PersistenceMode,
    out: &'a mut dyn Write,
    began: Instant,
    names: Names,
    producer: Producer,
    /// Every deposit written, in order. The oracle of the count.
    written: Vec<Deposit>,
}

impl<'a> Run<'a> {
    /// Creates the run's topics (input, compacted snapshots, confirmations) and its input producer.
    async fn new(
        setting: &'a Setting,
        mode: PersistenceMode,
        out: &'a mut dyn Write,
        topics: &mut Vec<String>,
    ) -> Result<Run<'a>, CliError> {
        let tag = match mode {
            PersistenceMode::Transactional => "fenced",
            _ => "unfenced",
        };
        let stamp = stamp();
        let producer = Producer::new(setting.client.clone(), ProducerConfig::default())
            .await
            .map_err(|e| failed("start the input producer", e))?;
        let run = Run {
            setting,
            mode,
            out,
            began: Instant::now(),
            names: Names {
                input: format!("snapfence-demo-outputs-{tag}-input-{stamp}"),
                snapshots: format!("snapfence-demo-outputs-{tag}-snapshots-{stamp}"),
                group: format!("snapfence-demo-outputs-{tag}-{stamp}"),
                txn_prefix: format!("snapfence-demo-outputs-{tag}-{stamp}"),
                confirmations: Some(format!(
                    "snapfence-demo-outputs-{tag}-confirmations-{stamp}"
                )),
            },
            producer,
            written: Vec::new(),
        };
        for (topic, configs) in [
            (&run.names.input, &[][..]),
            (&run.names.snapshots, &[("cleanup.policy", "compact")][..]),
            (run.confirmations(), &[][..]),
        ] {
            snapfence::admin::create_topic(&run.setting.client, topic, 1, -1, configs)
                .await
                .map_err(|e| failed(&format!("create topic {topic}"), e))?;
            topics.push(topic.clone());
        }
        Ok(run)
    }

    /// The confirmations topic.
    fn confirmations(&self) -> &String {
        // Always set by `Run::new`; the input topic's name is a harmless stand-in otherwise.
        self.names
            .confirmations
            .as_ref()
            .unwrap_or(&self.names.input)
    }

    fn fenced(&self) -> bool {
        self.mode == PersistenceMode::Transactional
    }

    /// One line of the story.
    fn say(&mut self, text: &str) -> Result<(), CliError> {
        say(&mut *self.out, self.began, text)
    }

    /// Writes `n` deposits for `account`, waits until the broker has them all, and names them.
    async fn deposit(&mut self, account: &'static str, n: usize) -> Result<String, CliError> {
        let mut deliveries = Vec::with_capacity(n);
        let first = self.written.len() as u64 + 1;
        for i in 0..n as u64 {
            let number = first + i;
            let amount = 10 * number as i64;
            let record = ProducerRecord::new(
                self.names.input.as_str(),
                Some(Bytes::from(format!("{number}:{amount}"))),
            )
            .key(Bytes::from_static(account.as_bytes()))
            .partition(0);
            let delivery = self
                .producer
                .send(record)
                .await
                .map_err(|e| failed("write a deposit", e))?;
            deliveries.push((number, delivery));
        }
        for (number, d) in deliveries {
            let written = d.await.map_err(|e| failed("write a deposit", e))?;
            let offset = written.offset.ok_or_else(|| CliError::DemoFailed {
                detail: format!("the broker did not say where deposit #{number} was written"),
            })?;
            self.written.push(Deposit {
                account,
                number,
                offset,
            });
        }
        Ok(format!("#{first}-#{}", self.written.len()))
    }

    /// The input offset every owner must have folded up to.
    fn input_end(&self) -> i64 {
        self.written.last().map_or(0, |d| d.offset + 1)
    }

    /// The group's committed input offset.
    async fn committed(&self) -> Result<Option<i64>, CliError> {
        let tp = TopicPartition::new(self.names.input.as_str(), 0);
        Ok(snapfence::consumer::committed_offsets(
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

    /// The confirmations partition's log end (read_uncommitted) and last stable offset (read_committed).
    async fn confirmation_ends(&self) -> Result<(i64, i64), CliError> {
        let tp = TopicPartition::new(self.confirmations().as_str(), 0);
        let mut ends = [0; 2];
        for (end, isolation) in ends.iter_mut().zip([
            IsolationLevel::ReadUncommitted,
            IsolationLevel::ReadCommitted,
        ]) {
            *end = list_offsets(
                &self.setting.client,
                std::slice::from_ref(&tp),
                OffsetSpec::Latest,
                isolation,
            )
            .await
            .map_err(|e| failed("read the confirmations partition's ends", e))?
            .get(&tp)
            .copied()
            .ok_or_else(|| CliError::DemoFailed {
                detail: "the broker did not answer the confirmations partition's ends".into(),
            })?;
        }
        Ok((ends[0], ends[1]))
    }

    /// Reads the confirmations topic as a read_committed consumer does, from the start to its last
    /// stable offset, and counts the confirmations of each deposit written.
    async fn count(&self) -> Result<Count, CliError> {
        let tp = TopicPartition::new(self.confirmations().as_str(), 0);
        let (_, end) = self.confirmation_ends().await?;
        let mut config = ReaderConfig::default();
        config.isolation = IsolationLevel::ReadCommitted;
        let mut reader = PartitionReader::new(self.setting.client.clone(), config);
        reader.assign(tp.clone(), StartAt::Earliest);
        let began = Instant::now();
        let mut per_offset: BTreeMap<i64, usize> = BTreeMap::new();
        let mut confirmations = 0;
        while end > 0 && reader.position(&tp).is_none_or(|p| p < end) {
            let fetched = reader
                .fetch()
                .await
                .map_err(|e| failed("read the confirmations", e))?;
            for part in fetched {
                for r in part.records {
                    confirmations += 1;
                    let confirmation = r.value.as_deref().and_then(Confirmation::decode);
                    let key_matches = |c: &Confirmation| {
                        self.written.iter().any(|d| {
                            d.offset == c.offset && r.key.as_deref() == Some(d.account.as_bytes())
                        })
                    };
                    if let Some(c) = confirmation.filter(key_matches) {
                        *per_offset.entry(c.offset).or_default() += 1;
                    }
                }
            }
            if began.elapsed() > STEP_LIMIT {
                return Err(CliError::DemoFailed {
                    detail: format!(
                        "the confirmations were not read up to their last stable offset {end} within {} s",
                        STEP_LIMIT.as_secs()
                    ),
                });
            }
        }
        Ok(Count {
            deposits: self.written.len(),
            confirmations,
            lost: self
                .written
                .iter()
                .filter(|d| !per_offset.contains_key(&d.offset))
                .map(|d| d.number)
                .collect(),
            duplicated: self
                .written
                .iter()
                .filter_map(|d| {
                    let n = per_offset.get(&d.offset).copied().unwrap_or(0);
                    (n > 1).then_some((d.number, n))
                })
                .collect(),
        })
    }

    /// Starts owner `name` as a process of its own, with this run's names and A's session timeout.
    async fn process(&self) -> Result<OwnerProcess, CliError> {
        OwnerProcess::start(
            &self.setting.exe,
            &self.setting.cluster.bootstrap,
            &self.names,
            !self.fenced(),
            self.setting.session,
            &self.setting.security,
        )
        .await
    }

    /// Has `owner` persist and commit; either refused is a failure of the step.
    async fn persist_and_commit(
        &self,
        owner: &mut OwnerProcess,
        who: &str,
    ) -> Result<(), CliError> {
        for command in ["persist", "commit"] {
            let step = format!("owner {who}'s {command}");
            if let Some(r) = owner.write(command, &step).await? {
                return Err(failed(&step, r.error));
            }
        }
        Ok(())
    }

    /// The run, told.
    async fn tell(mut self, number: usize) -> Result<Ending, CliError> {
        let title = if self.fenced() {
            "fenced: outputs in the transaction of the snapshot and the generation-fenced offset commit"
        } else {
            "unfenced: outputs and snapshots as plain writes, offsets committed by the consumer"
        };
        writeln!(self.out, "== Run {number} of 2, {title} ==")?;
        let confirmations = self.confirmations().clone();
        self.say(&format!(
            "Topics: input {}, snapshots {} (compacted), confirmations {}, one partition each.",
            self.names.input, self.names.snapshots, confirmations
        ))?;

        // 1. A folds, confirms, persists, commits.
        let alice = self.deposit("alice", 5).await?;
        let bob = self.deposit("bob", 5).await?;
        let mut a = self.process().await?;
        let held = a
            .catch_up(self.input_end(), "owner A joining and folding")
            .await?;
        self.persist_and_commit(&mut a, "A").await?;
        let committed = self.committed().await?;
        let seen = self.count().await?;
        self.say(&format!(
            "{} deposits written: {alice} for alice, {bob} for bob. Owner A, a snapfence process of its own \
             (pid {}), joins the group (generation {}), folds them and confirms each one, then persists and \
             commits: the {} confirmations go out {}, and the committed input offset is {}. A \
             read_committed reader of the confirmations topic sees {}.",
            self.written.len(),
            a.pid(),
            held.generation,
            held.confirmed.len(),
            if self.fenced() {
                "in one transaction with the snapshots of alice and bob and the offset commit"
            } else {
                "as plain writes beside the snapshots"
            },
            show_offset(committed),
            seen.sentence()
        ))?;

        // 2. A folds more; its flush is caught at its last step and A is killed.
        let confirmed_before = held.confirmed.len();
        let more = self.deposit("alice", 5).await?;
        let held = a.catch_up(self.input_end(), "owner A folding more").await?;
        self.say(&format!(
            "5 more deposits for alice ({more}). A folds them: {} confirmations wait in A's memory with \
             alice's state, for A's next flush.",
            held.confirmed.len().saturating_sub(confirmed_before)
        ))?;
        // Read before the flush: while a transaction holds an offset commit, the coordinator answers
        // UNSTABLE_OFFSET_COMMIT to a stable read of the group's offsets.
        let committed = self.committed().await?;
        let last_step = if self.fenced() {
            END_TXN
        } else {
            OFFSET_COMMIT
        };
        let kill_held = match a
            .flush_holding(&[last_step], "owner A's flush, held at its last step")
            .await?
        {
            Flush::Held(request) => request,
            Flush::Done { .. } => {
                return Err(CliError::DemoFailed {
                    detail: "owner A's flush ended without its last step reaching the gate".into(),
                })
            }
        };
        let (log_end, stable) = self.confirmation_ends().await?;
        let seen = self.count().await?;
        let open_at_kill = stable < log_end;
        if self.fenced() {
            self.say(&format!(
                "A flushes: alice's snapshot, her 5 confirmations and the offset commit go out in one \
                 transaction, and A is caught at its last step: the gate on A's connections holds the \
                 {kill_held} that would commit it. On the broker, the confirmations partition's log end is \
                 {log_end} and its last stable offset {stable}: {} A read_committed reader sees {}.",
                if open_at_kill {
                    "A's 5 new confirmations are in the log, inside A's open transaction, which holds the \
                     last stable offset back."
                } else {
                    "nothing of A's transaction holds it back."
                },
                seen.so_far()
            ))?;
        } else {
            self.say(&format!(
                "A flushes: alice's snapshot and her 5 confirmations are written as plain records, then A \
                 commits the input offset, and A is caught at that step: the gate on A's connections holds \
                 the {kill_held}. On the broker, A's confirmations are already visible (log end {log_end}, \
                 last stable offset {stable}; a read_committed reader sees {}), and the committed input \
                 offset is still {}.",
                seen.so_far(),
                show_offset(committed)
            ))?;
        }
        let member = held.member.clone();
        let pid = a.pid();
        a.kill().await?;
        let killed = Instant::now();
        let after = evicted(
            &self.setting.cluster,
            &self.names.group,
            &member,
            killed,
            self.setting.session,
        )
        .await?;
        self.say(&format!(
            "A is killed there (SIGKILL, pid {pid}), as in a crash{}. {:.1} s later the group coordinator \
             drops A's member: its session timeout ({:.1} s) passed without a heartbeat.",
            if self.fenced() && open_at_kill {
                ", its transaction left open"
            } else {
                ""
            },
            after.as_secs_f64(),
            self.setting.session.as_secs_f64()
        ))?;

        // 3. B takes over and replays.
        let mut b = self.process().await?;
        let held = b.catch_up(self.input_end(), "owner B taking over").await?;
        let refolded = held.confirmed.clone();
        self.persist_and_commit(&mut b, "B").await?;
        let committed_now = self.committed().await?;
        let seen = self.count().await?;
        let replay = if refolded.is_empty() {
            format!(
                "B's replay skips A's deposits: the snapshot of alice it recovered already covers them \
                 (A's plain write landed before the kill), so B confirms nothing again. B commits input \
                 offset {}.",
                show_offset(committed_now)
            )
        } else {
            format!(
                "Its replay folds {} again, since no snapshot of them committed, and confirms them again. \
                 B persists and commits input offset {}.",
                numbers(&refolded),
                show_offset(committed_now)
            )
        };
        self.say(&format!(
            "Owner B, another snapfence process (pid {}), joins and owns partition 0 (generation {}){}. \
             It recovers the snapshots and replays the input from the committed offset {}. {replay} A \
             read_committed reader sees {}.",
            b.pid(),
            held.generation,
            if self.fenced() {
                "; taking it, B initialised the partition's transactional producer, which aborted A's open \
                 transaction, A's confirmations with it"
            } else {
                ""
            },
            show_offset(committed),
            seen.sentence()
        ))?;

        // 4. B folds more, freezes in a flush, and C takes over.
        let bobs = self.deposit("bob", 5).await?;
        let held = b.catch_up(self.input_end(), "owner B folding more").await?;
        let first_write = match b
            .flush_holding(
                &[
                    PRODUCE,
                    ADD_PARTITIONS_TO_TXN,
                    ADD_OFFSETS_TO_TXN,
                    TXN_OFFSET_COMMIT,
                ],
                "owner B's flush, held at its first request",
            )
            .await?
        {
            Flush::Held(request) => request,
            Flush::Done { .. } => {
                return Err(CliError::DemoFailed {
                    detail: "owner B's flush ended without its first request reaching the gate"
                        .into(),
                })
            }
        };
        b.stop().await?;
        let stopped = Instant::now();
        let after = evicted(
            &self.setting.cluster,
            &self.names.group,
            &held.member,
            stopped,
            self.setting.session,
        )
        .await?;
        // Clearly past the session timeout, whatever the granularity of the coordinator's timer.
        if let Some(rest) = (self.setting.session * 3 / 2).checked_sub(stopped.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        self.say(&format!(
            "5 deposits for bob ({bobs}). B folds them and begins a flush of bob's snapshot and his 5 \
             confirmations; the gate holds the flush's first request ({first_write}), so nothing of it is \
             sent, and B is stopped there with SIGSTOP (pid {}): the whole process freezes, heartbeats \
             too, as in a long GC pause. {:.1} s after the stop the group coordinator no longer lists B's \
             member: B was evicted.",
            b.pid(),
            after.as_secs_f64()
        ))?;
        let ledger = Ledger::confirming(&confirmations);
        let session = self.setting.session.max(OTHERS_SESSION);
        let mut c = Flow::start(
            self.setting.client.clone(),
            flow_config(&self.names, self.mode, session),
            ledger.clone(),
        )
        .await
        .map_err(|e| failed("start owner C", e))?;
        let committed = self.committed().await?;
        catch_up(&mut c, self.input_end(), "owner C taking over").await?;
        c.persist()
            .await
            .map_err(|e| failed("owner C's persist", e))?;
        c.commit()
            .await
            .map_err(|e| failed("owner C's commit", e))?;
        let committed_now = self.committed().await?;
        let seen = self.count().await?;
        self.say(&format!(
            "Owner C (in this process) joins and owns partition 0 ({}), recovers the snapshots, replays \
             from the committed offset {}, folds {} and confirms {}, and persists and commits input offset \
             {}. A read_committed reader sees {}.",
            generation(&c),
            show_offset(committed),
            numbers(&ledger.confirmed()),
            if ledger.confirmed().len() == 1 {
                "it"
            } else {
                "them"
            },
            show_offset(committed_now),
            seen.sentence()
        ))?;

        // 5. B thaws and finishes its stale flush.
        b.release("let owner B's held request go").await?;
        let stopped_for = stopped.elapsed();
        b.resume().await?;
        let zombie = match b.flushed("owner B's stale flush").await? {
            Flush::Done { persist, commit } => {
                match &persist {
                    Some(r) => self.say(&format!(
                        "B has been stopped for {:.1} s. It resumes (SIGCONT), unaware, and its flush carries \
                         on from the held request: bob's stale snapshot and the 5 confirmations of {bobs} go \
                         out. REFUSED by {}: {}\n{}",
                        stopped_for.as_secs_f64(),
                        r.named(),
                        r.error,
                        "The transaction carrying them never commits, confirmations included: \
                         read_committed readers never see them. C's takeover initialised the \
                         partition's transactional id, which bumped its producer epoch past B's."
                    ))?,
                    None => self.say(&format!(
                        "B has been stopped for {:.1} s. It resumes (SIGCONT), unaware, and its flush carries \
                         on from the held request: bob's stale snapshot and the 5 confirmations of {bobs} go \
                         out. They LANDED: plain writes, nothing checks that B still owns the partition{}.",
                        stopped_for.as_secs_f64(),
                        match &commit {
                            Some(r) => format!(
                                " (only B's offset commit afterwards was refused, by {})",
                                r.named()
                            ),
                            None => String::new(),
                        }
                    ))?,
                }
                persist
            }
            Flush::Held(_) => {
                return Err(CliError::DemoFailed {
                    detail: "owner B's flush was still held after its release".into(),
                })
            }
        };
        b.quit().await;

        // 6. C leaves; the count.
        c.run(std::future::ready(()))
            .await
            .map_err(|e| failed("owner C leaving the group", e))?;
        let count = self.count().await?;
        let mut table = format!(
            "B's process ends, and C leaves the group cleanly. A read_committed reader of {confirmations} \
             reads it from the start and counts the confirmations of each deposit: {}.\n",
            count.sentence()
        );
        table.push_str(&format!(
            "  {:<10} {:<8} {:>12}  {}\n",
            "deposits", "account", "input offsets", "confirmations seen"
        ));
        for chunk in self.written.chunks(5) {
            let ns: Vec<u64> = chunk.iter().map(|d| d.number).collect();
            let times: Vec<String> = chunk
                .iter()
                .map(|d| {
                    let n = count
                        .duplicated
                        .iter()
                        .find(|(k, _)| *k == d.number)
                        .map_or(usize::from(!count.lost.contains(&d.number)), |(_, n)| *n);
                    n.to_string()
                })
                .collect();
            let offsets = match (chunk.first(), chunk.last()) {
                (Some(f), Some(l)) => format!("{}-{}", f.offset, l.offset),
                _ => String::new(),
            };
            table.push_str(&format!(
                "  {:<10} {:<8} {:>12}  {}\n",
                numbers(&ns),
                chunk.first().map_or("", |d| d.account),
                offsets,
                times.join(" ")
            ));
        }
        table.push_str(if count.exactly_once() {
            "Exactly once: what did not commit was re-folded and confirmed by the next owner, what committed \
             was not, and nothing a stale owner wrote became visible."
        } else if !count.duplicated.is_empty() {
            "At least once: a reader acting on every confirmation acts twice on the duplicated deposits."
        } else {
            "Not exactly once."
        });
        self.say(&table)?;
        writeln!(self.out)?;
        Ok(Ending {
            kill_held,
            open_at_kill,
            refolded,
            zombie,
            count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::owner::Fence;

    fn count(deposits: usize, lost: Vec<u64>, duplicated: Vec<(u64, usize)>) -> Count {
        let confirmations =
            deposits - lost.len() + duplicated.iter().map(|(_, n)| n - 1).sum::<usize>();
        Count {
            deposits,
            confirmations,
            lost,
            duplicated,
        }
    }

    fn ending(count: Count, zombie: Option<Refusal>) -> Ending {
        Ending {
            kill_held: "EndTxn",
            open_at_kill: true,
            refolded: vec![11, 12, 13, 14, 15],
            zombie,
            count,
        }
    }

    fn refused() -> Option<Refusal> {
        Some(Refusal {
            fence: Fence::ProducerEpoch,
            code: Some("INVALID_PRODUCER_EPOCH".into()),
            error: String::new(),
        })
    }

    /// The exit status rule: PASS needs the fenced count exactly once with B's stale flush refused, and
    /// duplicates in the unfenced count; a lost or duplicated confirmation fenced, a zombie that landed
    /// fenced, or an unfenced run without duplicates is a FAIL.
    #[test]
    fn the_verdict_needs_exactly_once_fenced_and_duplicates_unfenced() {
        let good = ending(count(20, vec![], vec![]), refused());
        let dup = ending(count(20, vec![], (16..=20).map(|n| (n, 2)).collect()), None);
        let mut out = Vec::new();
        assert!(verdict(&good, &dup, &mut out).is_ok());
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("verdict: PASS"), "{text}");
        assert!(text.contains("#16-#20 twice"), "{text}");
        for (fenced, unfenced) in [
            (ending(count(20, vec![], vec![(12, 2)]), refused()), &dup),
            (ending(count(20, vec![12], vec![]), refused()), &dup),
            (ending(count(20, vec![], vec![]), None), &dup),
            (good.clone(), &ending(count(20, vec![], vec![]), None)),
        ] {
            let mut out = Vec::new();
            assert!(verdict(&fenced, unfenced, &mut out).is_err());
            let text = String::from_utf8_lossy(&out);
            assert!(text.starts_with("verdict: FAIL"), "{text}");
        }
    }

    /// A confirmation reads back as written, and anything else is not one.
    #[test]
    fn confirmations_round_trip() {
        let c = Confirmation {
            offset: 14,
            deposit: 15,
            balance: 650,
        };
        assert_eq!(Confirmation::decode(c.encode().as_bytes()), Some(c));
        assert_eq!(Confirmation::decode(b"15:150"), None);
    }

    /// The count names duplicates by how often, and says lost deposits.
    #[test]
    fn counts_are_told_plainly() {
        let c = count(20, vec![3], vec![(16, 2), (17, 2), (4, 3)]);
        assert_eq!(c.duplicates(), "#16-#17 twice, #4 three times");
        assert!(!c.exactly_once());
        assert!(
            c.sentence().contains("LOST, deposits #3"),
            "{}",
            c.sentence()
        );
        assert!(count(20, vec![], vec![])
            .sentence()
            .ends_with("exactly once"));
    }
}
