//! `find-hanging`: transactions that hold a partition's LSO back and that no coordinator will ever end.
//!
//! The search follows KIP-664 as `kafka-transactions.sh find-hanging` implements it:
//! 1. DescribeProducers on each partition in scope (to the leader, or to the `--broker` replica):
//!    producers with an open transaction (`current_txn_start_offset >= 0`) whose last write is older than
//!    the maximum transaction timeout are candidates — a live transaction would have been aborted by its
//!    coordinator by then.
//! 2. ListTransactions on every broker, filtered to the candidates' producer ids: which transactional id
//!    each belongs to.
//! 3. DescribeTransactions at each id's coordinator.
//! 4. A candidate is hanging when no coordinator lists its producer id, when the coordinator does not
//!    know the transactional id, or when the coordinator's transaction does not include the partition
//!    (so no marker will be written there).
//!
//! One deliberate difference: with `--broker` and no `--topic`, internal topics are searched too, since a
//! transactional offset commit can leave a hanging transaction in `__consumer_offsets`.
//!
//! `--abort` writes the ABORT marker the coordinator never will (WriteTxnMarkers to the partition leader),
//! after re-checking at the leader that the same transaction is still open.
//!
//! # References
//! - KIP-664 (DescribeProducers 61, DescribeTransactions 65, ListTransactions 66, abort via
//!   WriteTxnMarkers 27), KIP-98 (markers, LSO)

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use serde_json::{json, Value};

use crate::error::CliError;
use crate::kafka::{Cluster, Listing, ProducerInfo, TxnDescription};
use crate::progress::Progress;
use crate::show::{age, now_ms, utc, Table};
use crate::{Format, Io};

/// The arguments of `find-hanging`.
#[derive(Debug, Clone, clap::Args)]
pub struct FindHangingArgs {
    /// Search this topic's partitions.
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
    /// With --topic: only this partition.
    #[arg(long, requires = "topic")]
    pub partition: Option<i32>,
    /// Search the partitions this broker holds a replica of, asking that broker (leader or follower).
    #[arg(long = "broker", value_name = "ID")]
    pub broker: Option<i32>,
    /// Transactions whose last write is older than this are candidates; use the largest
    /// transaction.timeout.ms of any producer (the broker caps it at transaction.max.timeout.ms).
    #[arg(long, default_value_t = 900_000, value_name = "MS")]
    pub max_transaction_timeout_ms: i64,
    /// Write an ABORT marker for each hanging transaction found, after confirmation.
    #[arg(long)]
    pub abort: bool,
    /// With --abort: do not ask for confirmation.
    #[arg(long, requires = "abort")]
    pub yes: bool,
}

/// A producer with an open transaction in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenTxn {
    pub topic: String,
    pub partition: i32,
    pub producer: ProducerInfo,
}

/// Why a candidate is hanging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// No coordinator lists the producer id.
    NoTransactionalId,
    /// The coordinator of the transactional id the producer id maps to does not know that id.
    UnknownToCoordinator { transactional_id: String },
    /// The coordinator's current transaction for the id does not include this partition.
    PartitionNotInTransaction {
        transactional_id: String,
        description: TxnDescription,
    },
}

impl Reason {
    fn code(&self) -> &'static str {
        match self {
            Reason::NoTransactionalId => "no-transactional-id",
            Reason::UnknownToCoordinator { .. } => "unknown-to-coordinator",
            Reason::PartitionNotInTransaction { .. } => "partition-not-in-transaction",
        }
    }

    fn text(&self) -> String {
        match self {
            Reason::NoTransactionalId => "no transaction coordinator lists this producer id".into(),
            Reason::UnknownToCoordinator { transactional_id } => {
                format!("coordinator does not know transactional id {transactional_id:?}")
            }
            Reason::PartitionNotInTransaction {
                transactional_id,
                description: d,
            } => format!(
                "transactional id {transactional_id:?} is {} (producer {} epoch {}) without this \
                 partition",
                d.state, d.producer_id, d.producer_epoch
            ),
        }
    }

    fn transactional_id(&self) -> Option<&str> {
        match self {
            Reason::NoTransactionalId => None,
            Reason::UnknownToCoordinator { transactional_id }
            | Reason::PartitionNotInTransaction {
                transactional_id, ..
            } => Some(transactional_id),
        }
    }
}

/// Step 1: the open transactions of one partition whose producer last wrote more than
/// `max_timeout_ms` before `now_ms`.
pub(crate) fn candidates(
    topic: &str,
    partition: i32,
    producers: &[ProducerInfo],
    now_ms: i64,
    max_timeout_ms: i64,
) -> Vec<OpenTxn> {
    producers
        .iter()
        .filter(|p| p.has_open_transaction())
        .filter(|p| now_ms.saturating_sub(p.last_timestamp) > max_timeout_ms)
        .map(|p| OpenTxn {
            topic: topic.to_owned(),
            partition,
            producer: *p,
        })
        .collect()
}

/// Step 4: which candidates are hanging, given what the coordinators said. `ids` maps producer ids to
/// ListTransactions entries; `descriptions` maps transactional ids to DescribeTransactions answers
/// (`None`: unknown to its coordinator; an id missing from the map counts the same).
pub(crate) fn hanging(
    candidates: &[OpenTxn],
    ids: &BTreeMap<i64, Listing>,
    descriptions: &BTreeMap<String, Option<TxnDescription>>,
) -> Vec<(OpenTxn, Reason)> {
    let mut out = Vec::new();
    for c in candidates {
        let Some(listing) = ids.get(&c.producer.producer_id) else {
            out.push((c.clone(), Reason::NoTransactionalId));
            continue;
        };
        let id = listing.transactional_id.clone();
        match descriptions.get(&id).and_then(Option::as_ref) {
            None => out.push((
                c.clone(),
                Reason::UnknownToCoordinator {
                    transactional_id: id,
                },
            )),
            Some(d) => {
                // The coordinator lists every partition of an ongoing transaction, and those still
                // waiting for markers while it prepares to commit or abort; a partition listed there
                // will get its marker.
                let listed = d
                    .partitions
                    .iter()
                    .any(|(t, p)| *t == c.topic && *p == c.partition);
                if !listed {
                    out.push((
                        c.clone(),
                        Reason::PartitionNotInTransaction {
                            transactional_id: id,
                            description: d.clone(),
                        },
                    ));
                }
            }
        }
    }
    out
}

/// Runs `find-hanging`.
pub(crate) async fn run(
    cluster: &Cluster,
    args: &FindHangingArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if args.topic.is_none() && args.broker.is_none() {
        return Err(CliError::Usage {
            message: "find-hanging needs a scope".into(),
            hint: "pass --topic TOPIC (optionally with --partition) or --broker ID".into(),
        });
    }
    if args.max_transaction_timeout_ms < 0 {
        return Err(CliError::Usage {
            message: "--max-transaction-timeout-ms cannot be negative".into(),
            hint: "pass the largest transaction.timeout.ms your producers use (default 900000)"
                .into(),
        });
    }
    let partitions = scope(cluster, args).await?;

    let mut progress = Progress::new(io.progress, "describing producers");
    let total = partitions.len() as u64;
    let mut done = 0u64;
    let err = &mut *io.err;
    let described = cluster
        .describe_producers_many(&partitions, args.broker, |n| {
            done += n as u64;
            progress.update(err, done, Some(total));
        })
        .await?;
    let now = now_ms();
    let mut open = 0usize;
    let mut found = Vec::new();
    for ((topic, partition), producers) in &described {
        open += producers
            .iter()
            .filter(|p| p.has_open_transaction())
            .count();
        found.extend(candidates(
            topic,
            *partition,
            producers,
            now,
            args.max_transaction_timeout_ms,
        ));
    }
    progress.finish(io.err);

    let producer_ids: Vec<i64> = found
        .iter()
        .map(|c| c.producer.producer_id)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let ids = cluster.list_transactions(&producer_ids).await?;
    let mut descriptions = BTreeMap::new();
    for listing in ids.values() {
        if !descriptions.contains_key(&listing.transactional_id) {
            let d = cluster
                .describe_transaction(&listing.transactional_id)
                .await?;
            descriptions.insert(listing.transactional_id.clone(), d);
        }
    }
    let hung = hanging(&found, &ids, &descriptions);

    let summary = Summary {
        partitions: partitions.len(),
        open,
        candidates: found.len(),
        max_timeout_ms: args.max_transaction_timeout_ms,
        on_broker: args.broker,
    };
    let mut aborted = Vec::new();
    match format {
        Format::Text => print_text(io.out, &summary, &hung, now)?,
        Format::Json if !args.abort => {
            writeln!(io.out, "{}", summary_json(&summary, &hung, now, None))?;
        }
        Format::Json => {}
    }
    if args.abort {
        for (txn, reason) in &hung {
            let outcome = abort_one(cluster, txn, reason, args.yes, format, io).await?;
            aborted.push((txn.clone(), outcome));
        }
        if format == Format::Json {
            writeln!(
                io.out,
                "{}",
                summary_json(&summary, &hung, now, Some(&aborted))
            )?;
        }
    }
    Ok(())
}

struct Summary {
    partitions: usize,
    open: usize,
    candidates: usize,
    max_timeout_ms: i64,
    on_broker: Option<i32>,
}

/// What `--abort` did for one hanging transaction.
#[derive(Debug, Clone)]
enum AbortOutcome {
    Declined,
    /// The leader no longer shows the same open transaction.
    Gone,
    Aborted {
        last_stable: i64,
        high_watermark: i64,
    },
}

/// The partitions to search, as `(topic, partition)`.
async fn scope(cluster: &Cluster, args: &FindHangingArgs) -> Result<Vec<(String, i32)>, CliError> {
    let topics = match &args.topic {
        Some(t) => vec![cluster.topic(t).await?],
        None => cluster.all_topics().await?,
    };
    if let Some(b) = args.broker {
        if !cluster.brokers().await?.contains(&b) {
            return Err(CliError::Usage {
                message: format!("broker {b} is not in the cluster"),
                hint: format!(
                    "the cluster's brokers are {:?}",
                    cluster.brokers().await.unwrap_or_default()
                ),
            });
        }
    }
    let mut out = Vec::new();
    for t in &topics {
        if let Some(p) = args.partition {
            crate::kafka::check_partition(t, p)?;
        }
        for (p, meta) in &t.partitions {
            let wanted = args.partition.is_none_or(|w| w == *p)
                && args.broker.is_none_or(|b| meta.replicas.contains(&b));
            if wanted {
                out.push((t.name.clone(), *p));
            }
        }
    }
    Ok(out)
}

async fn abort_one(
    cluster: &Cluster,
    txn: &OpenTxn,
    reason: &Reason,
    yes: bool,
    format: Format,
    io: &mut Io<'_>,
) -> Result<AbortOutcome, CliError> {
    let p = &txn.producer;
    let what = format!(
        "{}/{}: producer {} epoch {}, open since offset {}",
        txn.topic, txn.partition, p.producer_id, p.producer_epoch, p.txn_start_offset
    );
    if !yes {
        io.out.flush()?;
        write!(
            io.err,
            "Abort the hanging transaction on {what} ({})? [y/N] ",
            reason.text()
        )?;
        io.err.flush()?;
        let mut answer = String::new();
        io.input.read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            if format == Format::Text {
                writeln!(io.out, "not aborted: {what}")?;
            }
            return Ok(AbortOutcome::Declined);
        }
    }
    // The leader's view may have moved on since the search (the transaction ended, or the producer
    // bumped its epoch); an ABORT for a transaction that is no longer the one found must not be sent.
    let now = cluster
        .describe_producers(None, &txn.topic, txn.partition)
        .await?;
    let current = now.iter().find(|q| {
        q.producer_id == p.producer_id
            && q.producer_epoch == p.producer_epoch
            && q.txn_start_offset == p.txn_start_offset
    });
    let Some(current) = current else {
        if format == Format::Text {
            writeln!(
                io.out,
                "not aborted: {what}: the leader no longer shows this transaction open"
            )?;
        }
        return Ok(AbortOutcome::Gone);
    };
    cluster
        .write_abort_marker(&txn.topic, txn.partition, current)
        .await?;
    let offsets = cluster.offsets(&txn.topic, txn.partition).await?;
    if format == Format::Text {
        writeln!(
            io.out,
            "aborted: {what}; last stable offset now {} (high watermark {})",
            offsets.last_stable, offsets.high_watermark
        )?;
    }
    Ok(AbortOutcome::Aborted {
        last_stable: offsets.last_stable,
        high_watermark: offsets.high_watermark,
    })
}

fn print_text(
    out: &mut dyn Write,
    s: &Summary,
    hung: &[(OpenTxn, Reason)],
    now: i64,
) -> Result<(), CliError> {
    let place = match s.on_broker {
        Some(b) => format!("as seen by broker {b}"),
        None => "as seen by their leaders".into(),
    };
    writeln!(
        out,
        "searched {} partition(s) {place}: {} open transaction(s), {} last written more than {} ago",
        s.partitions,
        s.open,
        s.candidates,
        age(s.max_timeout_ms)
    )?;
    if hung.is_empty() {
        writeln!(out, "no hanging transactions")?;
        return Ok(());
    }
    writeln!(out, "{} hanging transaction(s):", hung.len())?;
    let mut table = Table::new(&[
        "TOPIC",
        "PARTITION",
        "PRODUCER",
        "EPOCH",
        "COORD-EPOCH",
        "START-OFFSET",
        "LAST-WRITE",
        "AGE",
        "WHY",
    ]);
    for (t, r) in hung {
        let p = &t.producer;
        table.row(vec![
            t.topic.clone(),
            t.partition.to_string(),
            p.producer_id.to_string(),
            p.producer_epoch.to_string(),
            p.coordinator_epoch.to_string(),
            p.txn_start_offset.to_string(),
            utc(p.last_timestamp),
            age(now - p.last_timestamp),
            r.text(),
        ]);
    }
    write!(out, "{}", table.render())?;
    Ok(())
}

fn summary_json(
    s: &Summary,
    hung: &[(OpenTxn, Reason)],
    now: i64,
    aborted: Option<&[(OpenTxn, AbortOutcome)]>,
) -> Value {
    let outcome = |t: &OpenTxn| -> Value {
        let Some(list) = aborted else {
            return Value::Null;
        };
        match list.iter().find(|(a, _)| a == t).map(|(_, o)| o) {
            Some(AbortOutcome::Declined) => json!({"result": "declined"}),
            Some(AbortOutcome::Gone) => json!({"result": "no-longer-open"}),
            Some(AbortOutcome::Aborted {
                last_stable,
                high_watermark,
            }) => json!({
                "result": "aborted",
                "last_stable_offset": last_stable,
                "high_watermark": high_watermark,
            }),
            None => Value::Null,
        }
    };
    json!({
        "searched_partitions": s.partitions,
        "open_transactions": s.open,
        "candidates": s.candidates,
        "max_transaction_timeout_ms": s.max_timeout_ms,
        "broker": s.on_broker,
        "hanging": hung.iter().map(|(t, r)| {
            let p = &t.producer;
            json!({
                "topic": t.topic,
                "partition": t.partition,
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "coordinator_epoch": p.coordinator_epoch,
                "start_offset": p.txn_start_offset,
                "last_timestamp": p.last_timestamp,
                "age_ms": now - p.last_timestamp,
                "reason": r.code(),
                "explanation": r.text(),
                "transactional_id": r.transactional_id(),
                "abort": outcome(t),
            })
        }).collect::<Vec<_>>(),
    })
}

/// The hanging transactions of `topic`, exactly as `find-hanging --topic TOPIC --format json` finds them,
/// one JSON object per transaction: for programs that check a cluster after the fact (the fault campaign
/// of protocol-tests runs it after every round), so they use this finder rather than one of their own.
///
/// Cancel-safe: it only reads.
pub async fn find_hanging(
    bootstrap: &str,
    topic: &str,
    max_transaction_timeout_ms: i64,
) -> Result<Vec<String>, CliError> {
    let cluster = Cluster::connect(bootstrap, &crate::security::SecurityArgs::default()).await?;
    let args = FindHangingArgs {
        topic: Some(topic.to_owned()),
        partition: None,
        broker: None,
        max_transaction_timeout_ms,
        abort: false,
        yes: false,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut input = std::io::empty();
    let mut io = Io {
        out: &mut out,
        err: &mut err,
        input: &mut input,
        progress: false,
    };
    run(&cluster, &args, Format::Json, &mut io).await?;
    let doc: Value = serde_json::from_slice(&out).map_err(std::io::Error::other)?;
    Ok(doc["hanging"]
        .as_array()
        .map(|a| a.iter().map(Value::to_string).collect())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn producer(id: i64, start: i64, last_ts: i64) -> ProducerInfo {
        ProducerInfo {
            producer_id: id,
            producer_epoch: 3,
            last_sequence: 0,
            last_timestamp: last_ts,
            coordinator_epoch: -1,
            txn_start_offset: start,
        }
    }

    fn listing(id: &str) -> Listing {
        Listing {
            transactional_id: id.into(),
            state: "Ongoing".into(),
            coordinator: 1,
        }
    }

    fn described(partitions: &[(&str, i32)]) -> TxnDescription {
        TxnDescription {
            state: "Ongoing".into(),
            producer_id: 7,
            producer_epoch: 3,
            timeout_ms: 60_000,
            start_time_ms: 1,
            partitions: partitions.iter().map(|(t, p)| ((*t).into(), *p)).collect(),
        }
    }

    /// Only open transactions strictly older than the timeout are candidates (the KIP-664 filter).
    #[test]
    fn candidates_are_open_and_older_than_the_timeout() {
        let now = 1_000_000;
        let producers = [
            producer(1, 5, now - 60_001), // open, old
            producer(2, 9, now - 60_000), // open, exactly at the timeout: not yet
            producer(3, -1, 0),           // idle producer, no open transaction
            producer(4, 0, now),          // open, fresh
        ];
        let c = candidates("t", 0, &producers, now, 60_000);
        assert_eq!(
            c.iter().map(|c| c.producer.producer_id).collect::<Vec<_>>(),
            vec![1]
        );
    }

    /// Each KIP-664 reason for a hanging transaction (no transactional id, unknown to its coordinator, a
    /// partition its transaction does not include) is reported, and a live transaction is not.
    #[test]
    fn each_kip664_reason_is_recognised_and_a_live_transaction_is_not_hanging() {
        let open = |id, partition| OpenTxn {
            topic: "t".into(),
            partition,
            producer: producer(id, 0, 0),
        };
        let found = [open(1, 0), open(2, 0), open(3, 0), open(4, 1)];
        let ids = BTreeMap::from([
            (2, listing("lost")),
            (3, listing("live")),
            (4, listing("live")),
        ]);
        let descriptions = BTreeMap::from([
            ("lost".to_string(), None),
            ("live".to_string(), Some(described(&[("t", 0)]))),
        ]);
        let hung = hanging(&found, &ids, &descriptions);
        let got: Vec<(i64, &str)> = hung
            .iter()
            .map(|(t, r)| (t.producer.producer_id, r.code()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, "no-transactional-id"),
                (2, "unknown-to-coordinator"),
                // Producer 4 writes to t/1, which the live transaction does not include.
                (4, "partition-not-in-transaction"),
            ]
        );
        assert_eq!(hung[1].1.transactional_id(), Some("lost"));
    }
}
