//! `reset`: move a flow's consumer group to another input position and delete the snapshots that would
//! contradict it, the way Kafka Streams' application-reset tool resets a group and wipes its stores.
//!
//! # The snapshot rule
//! A snapshot's envelope carries the offset of the last input event folded into its key, and a replay
//! skips the key's events at or below it. After a move to offset `N`, a snapshot whose envelope offset
//! is `>= N` (a live state or a grave) claims events the next owner is about to read: kept, they would be
//! skipped for that key and the reset would not reach it. So every such snapshot is deleted with a
//! tombstone, and its key folds again from nothing, from `N` on. A key whose envelope offset is `< N`
//! folded only events before `N`, none of which the next owner reads, and keeps its state. A flow with
//! several inputs is reset on all of them together (`--input` names each): its envelopes carry an
//! offset per input, and a snapshot goes when it reaches the new offset of any input.
//!
//! # Order of the steps (with `--execute`)
//! 1. Refuse while the group has members (ConsumerGroupDescribe and DescribeGroups): a live member would
//!    commit over the reset and keep folding onto its state.
//! 2. InitProducerId for `<prefix>-<p>` of every chosen partition: the producer id every owner of snapshot
//!    partition `p` shares. It fences a straggling owner's producer and aborts the transaction it left open,
//!    so nothing of it lands after the tombstones and no pending offset commit of it overwrites the reset.
//! 3. The recovery read of each snapshot partition, the one a takeover runs: the latest value of every
//!    key, to which the rule is applied. (The dry run does this without step 2.)
//! 4. OffsetCommit as no member (generation -1), which the coordinator takes only from an empty group.
//! 5. Per partition, the tombstones in one transaction of its producer.
//!
//! Offsets move before snapshots go: stopped between 4 and 5, the group sits at `N` with snapshots at or
//! past `N` still there, which only makes the replay skip events (the reset did not reach those keys),
//! and never folds an event twice; running reset again finds them by the same rule. The other order
//! would leave keys deleted while the group still sits at its old offset, losing their events for good.
//!
//! # References
//! - KIP-122 (`kafka-consumer-groups.sh --reset-offsets`), KIP-79 (ListOffsets by timestamp)
//! - KIP-848 (ConsumerGroupDescribe; an offset commit with member epoch -1 from an empty group)
//! - KIP-98 (InitProducerId fences the previous producer of a transactional id and aborts its open
//!   transaction); `docs/fencing.md`, "Deletes", "Stable transactional id"

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};
use snapfence::producer::{ProducerRecord, TransactionalConfig, TransactionalProducer};
use snapfence::records::IsolationLevel;
use snapfence::snapshot::open_snapshot_value;

use crate::error::CliError;
use crate::kafka::Cluster;
use crate::recover::read_partition;
use crate::show::{ShownBytes, Table};
use crate::{Format, Io};

/// The arguments of `reset`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(
    clap::ArgGroup::new("to")
        .required(true)
        .args(["to_earliest", "to_latest", "to_datetime", "to_timestamp", "to_offset"])
))]
pub struct ResetArgs {
    /// The flow's consumer group.
    #[arg(long, short = 'g')]
    pub group: String,
    /// The flow's input topic, whose offsets the group commits. A flow with several inputs names each
    /// (repeated, or comma-separated) in the flow's order: `FlowConfig::input_topic` first, then
    /// `more_input_topics`; all of them move together.
    #[arg(
        long,
        short = 'i',
        value_name = "TOPIC",
        value_delimiter = ',',
        required = true
    )]
    pub input: Vec<String>,
    /// The flow's snapshot topic (as many partitions as the input). Required unless --postgres names
    /// the store the flow keeps its snapshots in.
    #[arg(long, short = 's', value_name = "TOPIC")]
    pub snapshots: Option<String>,
    /// The flow keeps its snapshots in PostgreSQL (`FlowConfig::postgres`): reset that store, at this
    /// connection string (`postgres://user:password@host:5432/db`, or key=value pairs), instead of a
    /// snapshot topic.
    #[cfg(feature = "postgres")]
    #[arg(long, value_name = "URL", conflicts_with = "snapshots")]
    pub postgres: Option<String>,
    /// The store's table prefix (`PgStoreConfig::table_prefix`).
    #[cfg(feature = "postgres")]
    #[arg(
        long,
        visible_alias = "postgres-prefix",
        value_name = "PREFIX",
        default_value = "snapfence"
    )]
    pub postgres_table_prefix: String,
    /// The flow's transactional id prefix (`SnapshotConfig`'s): snapshot partition P is written by
    /// `<PREFIX>-<P>`.
    #[arg(
        long = "transactional-prefix",
        visible_alias = "prefix",
        value_name = "PREFIX"
    )]
    pub prefix: String,
    /// Move to each partition's log start.
    #[arg(long)]
    pub to_earliest: bool,
    /// Move to each partition's end (the high watermark): the flow skips what is there.
    #[arg(long)]
    pub to_latest: bool,
    /// Move to the first event at or after this time, RFC 3339 with a zone (2026-12-01T00:00:00Z,
    /// 2026-12-01T01:00:00.5+01:00); a partition with nothing that late moves to its end.
    #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
    pub to_datetime: Option<i64>,
    /// As --to-datetime, in milliseconds since the Unix epoch.
    #[arg(long, value_name = "MS")]
    pub to_timestamp: Option<i64>,
    /// Move to this offset: one number for every chosen partition, or P:OFFSET[,P:OFFSET...] (which
    /// then chooses the partitions). It must lie within the partition's log.
    #[arg(long, value_name = "[P:]OFFSET", value_parser = parse_to_offset)]
    pub to_offset: Option<ToOffset>,
    /// Only these partitions (comma-separated or repeated); every partition when left out.
    #[arg(long, value_delimiter = ',', value_name = "P")]
    pub partitions: Vec<i32>,
    /// Do it. Without it the command is a dry run: it prints the plan and changes nothing.
    #[arg(long)]
    pub execute: bool,
    /// Give up on a snapshot partition's read when it has not advanced for this many seconds (0: wait
    /// forever), as `recover` does.
    #[arg(long, default_value_t = 180, value_name = "SECS")]
    pub stall_timeout: u64,
}

/// `--to-offset`'s value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToOffset {
    /// One offset for every chosen partition.
    All(i64),
    /// An offset per partition; these are the partitions reset.
    Each(BTreeMap<i32, i64>),
}

/// Where the group moves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ResetTo {
    Earliest,
    Latest,
    Timestamp(i64),
    Offset(ToOffset),
}

impl ResetTo {
    fn describe(&self) -> String {
        match self {
            ResetTo::Earliest => "the earliest offsets".into(),
            ResetTo::Latest => "the latest offsets".into(),
            ResetTo::Timestamp(ms) => {
                format!("the first events at or after {}", crate::show::utc(*ms))
            }
            ResetTo::Offset(ToOffset::All(o)) => format!("offset {o}"),
            ResetTo::Offset(ToOffset::Each(m)) => {
                let each: Vec<String> = m.iter().map(|(p, o)| format!("{p}:{o}")).collect();
                format!("offsets {}", each.join(","))
            }
        }
    }
}

impl ResetArgs {
    fn target(&self) -> Result<ResetTo, CliError> {
        let to = if self.to_earliest {
            ResetTo::Earliest
        } else if self.to_latest {
            ResetTo::Latest
        } else if let Some(ms) = self.to_datetime.or(self.to_timestamp) {
            if ms < 0 {
                return Err(usage(
                    format!("--to-timestamp {ms} is before 1970"),
                    "pass milliseconds since the Unix epoch",
                ));
            }
            ResetTo::Timestamp(ms)
        } else if let Some(o) = &self.to_offset {
            if self.input.len() > 1 {
                return Err(usage(
                    "--to-offset names offsets of one input topic, and --input names several",
                    "reset a flow with several inputs with --to-earliest, --to-latest, --to-datetime \
                     or --to-timestamp, which find each input's offset",
                ));
            }
            if matches!(o, ToOffset::Each(_)) && !self.partitions.is_empty() {
                return Err(usage(
                    "--to-offset P:OFFSET names its partitions; --partitions cannot narrow them too",
                    "leave out --partitions, or give --to-offset a single OFFSET",
                ));
            }
            ResetTo::Offset(o.clone())
        } else {
            // clap's group requires one; kept total rather than panicking.
            return Err(usage(
                "no position to reset to",
                "pass one of --to-earliest, --to-latest, --to-datetime, --to-timestamp, --to-offset",
            ));
        };
        Ok(to)
    }
}

fn usage(message: impl Into<String>, hint: impl Into<String>) -> CliError {
    CliError::Usage {
        message: message.into(),
        hint: hint.into(),
    }
}

/// Parses `--to-offset`: `OFFSET`, or `P:OFFSET[,P:OFFSET...]` with each partition once.
fn parse_to_offset(s: &str) -> Result<ToOffset, String> {
    let number = |what: &str, v: &str| -> Result<i64, String> {
        match v.trim().parse::<i64>() {
            Ok(n) if n >= 0 => Ok(n),
            _ => Err(format!("{what} {v:?} is not a number >= 0")),
        }
    };
    if !s.contains(':') {
        return number("offset", s).map(ToOffset::All);
    }
    let mut each = BTreeMap::new();
    for part in s.split(',') {
        let Some((p, o)) = part.split_once(':') else {
            return Err(format!("{part:?} is not P:OFFSET"));
        };
        let p = i32::try_from(number("partition", p)?)
            .map_err(|_| format!("partition {p:?} is too large"))?;
        if each.insert(p, number("offset", o)?).is_some() {
            return Err(format!("partition {p} is named twice"));
        }
    }
    Ok(ToOffset::Each(each))
}

/// Parses an RFC 3339 date and time with a zone (`Z` or `±HH:MM`; seconds and a fraction optional)
/// into milliseconds since the Unix epoch.
fn parse_datetime(s: &str) -> Result<i64, String> {
    let bad = || {
        format!("{s:?} is not a date and time like 2026-12-01T00:00:00Z (a zone, Z or +01:00, is required)")
    };
    let s = s.trim();
    let (date, rest) = s.split_once(['T', 't', ' ']).ok_or_else(bad)?;
    let digits = |v: &str, len: usize| -> Result<i64, String> {
        if v.len() == len && v.bytes().all(|b| b.is_ascii_digit()) {
            v.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let mut d = date.split('-');
    let (Some(y), Some(m), Some(day), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    let (y, m, day) = (digits(y, 4)?, digits(m, 2)?, digits(day, 2)?);
    let (time, zone_ms) = if let Some(t) = rest.strip_suffix(['Z', 'z']) {
        (t, 0)
    } else {
        let at = rest.rfind(['+', '-']).ok_or_else(bad)?;
        let (t, zone) = rest.split_at(at);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (zh, zm) = zone[1..].split_once(':').ok_or_else(bad)?;
        let (zh, zm) = (digits(zh, 2)?, digits(zm, 2)?);
        if zh > 23 || zm > 59 {
            return Err(bad());
        }
        (t, sign * (zh * 3_600_000 + zm * 60_000))
    };
    let mut t = time.split(':');
    let (Some(h), Some(min), sec, None) = (t.next(), t.next(), t.next(), t.next()) else {
        return Err(bad());
    };
    let (h, min) = (digits(h, 2)?, digits(min, 2)?);
    let (sec, millis) = match sec {
        None => (0, 0),
        Some(sec) => {
            let (whole, fraction) = sec.split_once('.').unwrap_or((sec, ""));
            let millis = if fraction.is_empty() {
                0
            } else {
                if !fraction.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                // Milliseconds: the first three digits, padded.
                let f: String = fraction.chars().chain("000".chars()).take(3).collect();
                f.parse::<i64>().map_err(|_| bad())?
            };
            (digits(whole, 2)?, millis)
        }
    };
    let month_days = [
        31,
        28 + i64::from(is_leap(y)),
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || day < 1 || day > month_days[(m - 1) as usize] {
        return Err(bad());
    }
    if h > 23 || min > 59 || sec > 59 {
        return Err(bad());
    }
    let days = days_from_civil(y, m, day);
    Ok(days * 86_400_000 + h * 3_600_000 + min * 60_000 + sec * 1000 + millis - zone_ms)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// A proleptic Gregorian date to days since 1970-01-01 (the era-based conversion, the inverse of
/// `show`'s `civil_from_days`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The partitions to reset, in order: `--to-offset P:OFFSET`'s, `--partitions`, or every partition.
fn chosen(
    topic: &snapfence::net::TopicMetadata,
    named: &[i32],
    to: &ResetTo,
) -> Result<Vec<i32>, CliError> {
    let mut partitions = match to {
        ResetTo::Offset(ToOffset::Each(each)) => each.keys().copied().collect(),
        _ => crate::recover::chosen_partitions(topic, named)?,
    };
    for &p in &partitions {
        crate::kafka::check_partition(topic, p)?;
    }
    partitions.sort_unstable();
    Ok(partitions)
}

/// The new offset of `partition`, whose input log spans `log_start..high_watermark`. `by_time` is
/// ListOffsets' answer for the timestamp (-1: no event that late, so the end).
fn new_offset(
    to: &ResetTo,
    topic: &str,
    partition: i32,
    log_start: i64,
    high_watermark: i64,
    by_time: Option<i64>,
) -> Result<i64, CliError> {
    let exact = |offset: i64| {
        if (log_start..=high_watermark).contains(&offset) {
            Ok(offset)
        } else {
            Err(CliError::ResetOutOfRange {
                topic: topic.to_owned(),
                partition,
                offset,
                log_start,
                high_watermark,
            })
        }
    };
    match to {
        ResetTo::Earliest => Ok(log_start),
        ResetTo::Latest => Ok(high_watermark),
        ResetTo::Timestamp(_) => Ok(match by_time {
            Some(o) if o >= 0 => o.clamp(log_start, high_watermark),
            _ => high_watermark,
        }),
        ResetTo::Offset(ToOffset::All(o)) => exact(*o),
        ResetTo::Offset(ToOffset::Each(each)) => match each.get(&partition) {
            Some(o) => exact(*o),
            None => Err(usage(
                format!("--to-offset names no offset for partition {partition}"),
                "name every partition to reset in --to-offset",
            )),
        },
    }
}

/// How the committed offset moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Nothing was committed for the partition.
    FromNothing,
    Back(i64),
    Forward(i64),
    Unchanged,
}

impl Direction {
    fn of(committed: Option<i64>, new: i64) -> Direction {
        match committed {
            None => Direction::FromNothing,
            Some(c) if new < c => Direction::Back(c - new),
            Some(c) if new > c => Direction::Forward(new - c),
            Some(_) => Direction::Unchanged,
        }
    }

    fn text(self) -> String {
        match self {
            Direction::FromNothing => "none committed".into(),
            Direction::Back(n) => format!("back {n}"),
            Direction::Forward(n) => format!("forward {n}"),
            Direction::Unchanged => "unchanged".into(),
        }
    }

    fn json(self) -> &'static str {
        match self {
            Direction::FromNothing => "none_committed",
            Direction::Back(_) => "backward",
            Direction::Forward(_) => "forward",
            Direction::Unchanged => "unchanged",
        }
    }
}

/// What the rule does to one snapshot partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Doomed {
    /// The keys to delete, in key order.
    keys: Vec<Bytes>,
    /// Of them, live states and graves.
    live: usize,
    graves: usize,
    /// Snapshots that stay (envelope offset below the new offset).
    kept: usize,
}

/// Applies the rule to a partition's recovered snapshots: every key whose envelope offset is at or past
/// the new offset (of any input: `new_offsets` holds one per input) is to be deleted. A value that is no
/// envelope stops the reset before anything changes: its offset is unknown, so neither keeping nor
/// deleting it is known to be right. So does one that accounts for another number of inputs.
fn doomed<'a>(
    topic: &str,
    partition: i32,
    snapshots: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    new_offsets: &[i64],
    max_bytes: usize,
) -> Result<Doomed, CliError> {
    let mut d = Doomed::default();
    for (key, value) in snapshots {
        let opened = open_snapshot_value(value).map_err(|source| CliError::ForeignSnapshot {
            topic: topic.to_owned(),
            partition,
            key: ShownBytes::new(key, max_bytes).text(),
            source,
        })?;
        let Some(reaches) = opened.reaches(new_offsets) else {
            return Err(CliError::InputCount {
                store: topic.to_owned(),
                partition,
                what: format!(
                    "the snapshot of key {}",
                    ShownBytes::new(key, max_bytes).text()
                ),
                inputs: opened.input_offsets().len(),
                named: new_offsets.len(),
            });
        };
        if !reaches {
            d.kept += 1;
            continue;
        }
        if opened.is_grave() {
            d.graves += 1;
        } else {
            d.live += 1;
        }
        d.keys.push(Bytes::copy_from_slice(key));
    }
    d.keys.sort();
    Ok(d)
}

/// Where the flow keeps its snapshots.
enum Store {
    /// A compacted snapshot topic.
    Topic(snapfence::net::TopicMetadata),
    /// The PostgreSQL store.
    #[cfg(feature = "postgres")]
    Postgres(snapfence::snapshot::postgres::PgStoreConfig),
}

impl Store {
    fn name(&self) -> String {
        match self {
            Store::Topic(t) => t.name.clone(),
            #[cfg(feature = "postgres")]
            Store::Postgres(c) => format!("PostgreSQL tables {}_*", c.table_prefix),
        }
    }

    /// The store's own offset of `partition` per input (the PostgreSQL fencing row's; none on a
    /// topic) and the rule applied to its snapshots. Changes nothing.
    async fn read(
        &self,
        cluster: &Cluster,
        args: &ResetArgs,
        partition: i32,
        new_offsets: &[i64],
        io: &mut Io<'_>,
    ) -> Result<(Vec<Option<i64>>, Doomed), CliError> {
        match self {
            Store::Topic(t) => {
                let (state, _) =
                    read_partition(cluster, &t.name, partition, args.stall_timeout, io).await?;
                let d = doomed(&t.name, partition, &state, new_offsets, 64)?;
                Ok((vec![None; new_offsets.len()], d))
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(config) => {
                let view = snapfence::snapshot::postgres::inspect_partition(
                    config,
                    &args.prefix,
                    partition,
                )
                .await
                .map_err(|source| CliError::Postgres {
                    what: format!("read partition {partition} of the store"),
                    source,
                })?;
                let name = self.name();
                let stored: Vec<Option<i64>> = match &view.input_offsets {
                    Some(v) if v.len() != new_offsets.len() => {
                        return Err(CliError::InputCount {
                            store: name,
                            partition,
                            what: "the fencing row".into(),
                            inputs: v.len(),
                            named: new_offsets.len(),
                        })
                    }
                    Some(v) => v.iter().copied().map(Some).collect(),
                    // One input, or only the first input's offset known (docs/fencing.md).
                    None => std::iter::once(view.committed_offset)
                        .chain(std::iter::repeat(None))
                        .take(new_offsets.len())
                        .collect(),
                };
                let d = doomed(&name, partition, &view.snapshots, new_offsets, 64)?;
                Ok((stored, d))
            }
        }
    }
}

/// One input's move within a partition's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InputPlan {
    topic: String,
    /// The group's committed offset.
    committed: Option<i64>,
    /// The PostgreSQL store's fencing row offset (`None` on a snapshot topic, or none recorded).
    store_offset: Option<i64>,
    new_offset: i64,
}

impl InputPlan {
    /// Where a takeover would start now: the group's offset, or the later of it and the store's.
    fn current(&self) -> Option<i64> {
        self.committed.max(self.store_offset)
    }

    fn direction(&self) -> Direction {
        Direction::of(self.current(), self.new_offset)
    }

    fn json(&self) -> Value {
        json!({
            "topic": self.topic,
            "committed": self.committed,
            "store_offset": self.store_offset,
            "new_offset": self.new_offset,
            "direction": self.direction().json(),
        })
    }
}

/// One partition's line of the plan: its first input's move, the other inputs' (a flow with several),
/// and what the rule does to its snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartitionPlan {
    partition: i32,
    first: InputPlan,
    more: Vec<InputPlan>,
    doomed: Doomed,
}

impl PartitionPlan {
    fn inputs(&self) -> impl Iterator<Item = &InputPlan> {
        std::iter::once(&self.first).chain(&self.more)
    }

    /// Every input's new offset, in the flow's order.
    #[cfg(any(feature = "postgres", test))]
    fn new_offsets(&self) -> Vec<i64> {
        self.inputs().map(|i| i.new_offset).collect()
    }

    /// The first input's fields at the top (as for a flow of one input), then every input's under
    /// `inputs` when there are several.
    fn json(&self) -> Value {
        let mut j = json!({
            "partition": self.partition,
            "committed": self.first.committed,
            "store_offset": self.first.store_offset,
            "new_offset": self.first.new_offset,
            "direction": self.first.direction().json(),
            "delete": self.doomed.keys.len(),
            "delete_live": self.doomed.live,
            "delete_graves": self.doomed.graves,
            "keep": self.doomed.kept,
        });
        if !self.more.is_empty() {
            j["inputs"] = json!(self.inputs().map(InputPlan::json).collect::<Vec<_>>());
        }
        j
    }
}

const RULE: &str = "a snapshot whose envelope offset (the last input event folded into its key) is at \
    or past the new offset (of any input, for a flow with several) is deleted: the next owner's replay \
    would skip the events it claims, so its key folds again from nothing; a snapshot below it only folded \
    events before the new offset and stays";

fn plan_text(
    args: &ResetArgs,
    store: &str,
    postgres: bool,
    to: &ResetTo,
    plan: &[PartitionPlan],
) -> String {
    let several = args.input.len() > 1;
    let inputs = if several {
        format!("inputs {:?}", args.input)
    } else {
        format!("input {:?}", args.input.first().map_or("", String::as_str))
    };
    let mut out = format!(
        "reset of group {:?} on {inputs} to {} (snapshots in {store}, written by {}-<partition>)\n",
        args.group,
        to.describe(),
        args.prefix
    );
    let mut header = vec!["partition"];
    if several {
        header.push("input");
    }
    header.push("committed");
    if postgres {
        header.push("store offset");
    }
    header.extend(["new", "move", "delete (live/graves)", "keep"]);
    let mut table = Table::new(&header);
    let shown = |o: Option<i64>| o.map_or_else(|| "-".into(), |c| c.to_string());
    for p in plan {
        // A flow with several inputs: a line per input, the snapshot counts on the first.
        for (i, input) in p.inputs().enumerate() {
            let mut row = vec![p.partition.to_string()];
            if several {
                row.push(input.topic.clone());
            }
            row.push(shown(input.committed));
            if postgres {
                row.push(shown(input.store_offset));
            }
            row.extend([input.new_offset.to_string(), input.direction().text()]);
            if i == 0 {
                row.extend([
                    format!(
                        "{} ({}/{})",
                        p.doomed.keys.len(),
                        p.doomed.live,
                        p.doomed.graves
                    ),
                    p.doomed.kept.to_string(),
                ]);
            } else {
                row.extend([String::new(), String::new()]);
            }
            table.row(row);
        }
    }
    out.push_str(&table.render());
    out.push_str(&format!("rule: {RULE}\n"));
    if plan
        .iter()
        .flat_map(PartitionPlan::inputs)
        .any(|i| matches!(i.direction(), Direction::Forward(_)))
    {
        out.push_str(
            "forward: a move forward keeps every key's state; by the rule only a snapshot already past \
             the new offset (a flow stopped between a persist and its commit) would go\n",
        );
    }
    out
}

/// Runs `reset`.
pub(crate) async fn run(
    cluster: &Cluster,
    args: &ResetArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let to = args.target()?;
    let mut inputs = Vec::with_capacity(args.input.len());
    for name in &args.input {
        if inputs
            .iter()
            .any(|t: &snapfence::net::TopicMetadata| &t.name == name)
        {
            return Err(usage(
                format!("--input names {name:?} twice"),
                "name each input topic of the flow once",
            ));
        }
        inputs.push(cluster.topic(name).await?);
    }
    let Some(input) = inputs.first() else {
        return Err(usage("no input topic named", "pass --input TOPIC"));
    };
    for other in &inputs[1..] {
        if other.partitions.len() != input.partitions.len() {
            return Err(CliError::InputPartitionMismatch {
                input: input.name.clone(),
                input_partitions: input.partitions.len(),
                other: other.name.clone(),
                other_partitions: other.partitions.len(),
            });
        }
    }
    let store = store(cluster, args).await?;
    match &store {
        Store::Topic(snapshots) if input.partitions.len() != snapshots.partitions.len() => {
            return Err(CliError::PartitionMismatch {
                snapshots: snapshots.name.clone(),
                snapshot_partitions: snapshots.partitions.len(),
                input: input.name.clone(),
                input_partitions: input.partitions.len(),
            });
        }
        _ => {}
    }
    let postgres = !matches!(store, Store::Topic(_));
    let partitions = chosen(input, &args.partitions, &to)?;
    refuse_members(cluster, &args.group).await?;

    let mut committed = Vec::with_capacity(inputs.len());
    for t in &inputs {
        committed.push(cluster.committed(&args.group, &t.name, &partitions).await?);
    }
    // Per partition, every input's move.
    let mut targets: Vec<(i32, Vec<InputPlan>)> = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let mut moves = Vec::with_capacity(inputs.len());
        for (t, committed) in inputs.iter().zip(&committed) {
            let at = |ts| cluster.list_offset(&t.name, p, ts, IsolationLevel::ReadUncommitted);
            let (log_start, high_watermark) = (at(-2).await?, at(-1).await?);
            let by_time = match to {
                ResetTo::Timestamp(ms) => Some(at(ms).await?),
                _ => None,
            };
            moves.push(InputPlan {
                topic: t.name.clone(),
                committed: committed.get(&p).map(|c| c.offset).filter(|o| *o >= 0),
                store_offset: None,
                new_offset: new_offset(&to, &t.name, p, log_start, high_watermark, by_time)?,
            });
        }
        targets.push((p, moves));
    }

    // Fence first: a straggler's open transaction is aborted before its partition is read, so the read
    // does not wait for it and nothing of it lands after the tombstones.
    let mut producers = BTreeMap::new();
    if args.execute {
        for &p in &partitions {
            let id = format!("{}-{p}", args.prefix);
            let mut config = TransactionalConfig::new(&id);
            // The PostgreSQL store's producer takes part in two-phase commits (KIP-939): initialised
            // the same way, without keeping, the init aborts a transaction a dead owner prepared (which
            // would otherwise hold its offset commit pending over the reset).
            config.two_phase_commit = postgres;
            let producer = TransactionalProducer::init(cluster.client.clone(), config)
                .await
                .map_err(|source| CliError::Producer {
                    what: format!("initialise the producer of {id}"),
                    source,
                })?;
            producers.insert(p, producer);
        }
    }

    let mut plan = Vec::with_capacity(targets.len());
    for (partition, mut moves) in targets {
        let new_offsets: Vec<i64> = moves.iter().map(|m| m.new_offset).collect();
        let (stored, doomed) = store
            .read(cluster, args, partition, &new_offsets, io)
            .await?;
        for (m, s) in moves.iter_mut().zip(stored) {
            m.store_offset = s;
        }
        let mut moves = moves.into_iter();
        let Some(first) = moves.next() else {
            continue;
        };
        plan.push(PartitionPlan {
            partition,
            first,
            more: moves.collect(),
            doomed,
        });
    }
    let deleted: usize = plan.iter().map(|p| p.doomed.keys.len()).sum();
    let mut doc = json!({
        "outcome": if args.execute { "reset" } else { "planned" },
        "group": args.group,
        "input": input.name,
        "inputs": args.input,
        "snapshots": store.name(),
        "transactional_prefix": args.prefix,
        "to": to.describe(),
        "partitions": plan.iter().map(PartitionPlan::json).collect::<Vec<_>>(),
        "delete": deleted,
    });
    if format == Format::Text {
        write!(
            io.out,
            "{}",
            plan_text(args, &store.name(), postgres, &to, &plan)
        )?;
    }
    if !args.execute {
        match format {
            Format::Text => writeln!(
                io.out,
                "dry run: nothing was changed; run again with --execute to do it"
            )?,
            Format::Json => writeln!(io.out, "{doc}")?,
        }
        return Ok(());
    }

    // A member may have joined while the snapshots were read; the coordinator refuses the commit then.
    // Every input's offsets go in one OffsetCommit, which the coordinator writes as one batch.
    refuse_members(cluster, &args.group).await?;
    let offsets: Vec<(String, Vec<(i32, i64)>)> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let each = plan
                .iter()
                .filter_map(|p| p.inputs().nth(i).map(|m| (p.partition, m.new_offset)))
                .collect();
            (t.name.clone(), each)
        })
        .collect();
    cluster.commit_as_no_member(&args.group, &offsets).await?;
    if format == Format::Text {
        writeln!(
            io.out,
            "committed the new offsets of group {:?} for {} partition(s)",
            args.group,
            plan.len()
        )?;
    }
    for p in &plan {
        let Some(mut producer) = producers.remove(&p.partition) else {
            continue;
        };
        let id = format!("{}-{}", args.prefix, p.partition);
        match &store {
            Store::Topic(t) => {
                if !p.doomed.keys.is_empty() {
                    tombstones(&mut producer, &t.name, p, &id).await?;
                }
            }
            #[cfg(feature = "postgres")]
            Store::Postgres(config) => {
                let done = snapfence::snapshot::postgres::reset_partition_inputs(
                    config,
                    &args.prefix,
                    p.partition,
                    &p.new_offsets(),
                )
                .await
                .map_err(|source| CliError::Postgres {
                    what: format!("reset partition {} of the store", p.partition),
                    source,
                })?;
                if format == Format::Text {
                    writeln!(
                        io.out,
                        "p{}: {} snapshot row(s) deleted, {} kept; the fencing row at offset {}, owner \
                         epoch {} (every earlier owner's flush now fails)",
                        p.partition,
                        done.deleted,
                        done.kept,
                        shown_offsets(&p.new_offsets()),
                        done.owner_epoch
                    )?;
                }
                producer.close().await;
                continue;
            }
        }
        if format == Format::Text {
            if p.doomed.keys.is_empty() {
                writeln!(
                    io.out,
                    "p{}: nothing to delete; {id} initialised, so any transaction a straggler left open is \
                     aborted",
                    p.partition
                )?;
            } else {
                writeln!(
                    io.out,
                    "p{}: {} tombstone(s) committed in one transaction of {id}",
                    p.partition,
                    p.doomed.keys.len()
                )?;
            }
        }
        producer.close().await;
    }
    match format {
        Format::Text => writeln!(
            io.out,
            "done: group {:?} reset on {} partition(s), {deleted} snapshot(s) deleted",
            args.group,
            plan.len()
        )?,
        Format::Json => {
            doc["outcome"] = json!("reset");
            writeln!(io.out, "{doc}")?;
        }
    }
    Ok(())
}

/// One offset as a number, several as `[a, b]`.
#[cfg(feature = "postgres")]
fn shown_offsets(offsets: &[i64]) -> String {
    match offsets {
        [one] => one.to_string(),
        more => format!("{more:?}"),
    }
}

/// The store `args` name: the snapshot topic, or with `--postgres` the PostgreSQL store.
async fn store(cluster: &Cluster, args: &ResetArgs) -> Result<Store, CliError> {
    #[cfg(feature = "postgres")]
    if let Some(url) = &args.postgres {
        let mut config = snapfence::snapshot::postgres::PgStoreConfig::new(url);
        config.table_prefix = args.postgres_table_prefix.clone();
        return Ok(Store::Postgres(config));
    }
    let Some(topic) = &args.snapshots else {
        return Err(usage(
            "no snapshot store named",
            if cfg!(feature = "postgres") {
                "pass --snapshots TOPIC, or --postgres URL for a flow that keeps its snapshots in PostgreSQL"
            } else {
                "pass --snapshots TOPIC"
            },
        ));
    };
    Ok(Store::Topic(cluster.topic(topic).await?))
}

/// Fails with [`CliError::GroupActive`] when the group's coordinator lists any member.
async fn refuse_members(cluster: &Cluster, group: &str) -> Result<(), CliError> {
    let members = cluster.active_members(group).await?;
    if members.is_empty() {
        return Ok(());
    }
    Err(CliError::GroupActive {
        group: group.to_owned(),
        members,
    })
}

/// Writes the tombstones of `plan`'s doomed keys in one transaction of `producer`.
async fn tombstones(
    producer: &mut TransactionalProducer,
    topic: &str,
    plan: &PartitionPlan,
    id: &str,
) -> Result<(), CliError> {
    let failed = |what: &str, source| CliError::Producer {
        what: format!("{what} the tombstones of {topic}/{} ({id})", plan.partition),
        source,
    };
    producer.begin().map_err(|e| failed("begin", e))?;
    let mut deliveries = Vec::with_capacity(plan.doomed.keys.len());
    for key in &plan.doomed.keys {
        let record = ProducerRecord::new(topic, None)
            .key(key.clone())
            .partition(plan.partition);
        match producer.send(record).await {
            Ok(d) => deliveries.push(d),
            Err(e) => {
                let _ = producer.abort().await;
                return Err(failed("write", e));
            }
        }
    }
    if let Err(e) = producer.commit().await {
        // An abortable failure left nothing; an unknown outcome must not be aborted (a rerun finds out).
        if e.is_abortable() {
            let _ = producer.abort().await;
        }
        return Err(failed("commit", e));
    }
    for d in deliveries {
        d.await.map_err(|e| failed("deliver", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(extra: &[&str]) -> Result<ResetArgs, clap::Error> {
        let argv = [
            "snapfence",
            "reset",
            "--group",
            "g",
            "--input",
            "in",
            "--snapshots",
            "snaps",
            "--prefix",
            "tx",
        ]
        .into_iter()
        .chain(extra.iter().copied());
        match crate::Cli::try_parse_from(argv)?.command {
            crate::Command::Reset(a) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    /// Exactly one position is required; each parses to its target, and a dry run is the default.
    #[test]
    fn one_position_is_required_and_a_dry_run_is_the_default() {
        assert!(parse(&[]).is_err(), "a position is required");
        assert!(parse(&["--to-earliest", "--to-latest"]).is_err());
        let a = parse(&["--to-earliest"]).unwrap();
        assert!(!a.execute);
        assert_eq!(a.target().unwrap(), ResetTo::Earliest);
        assert_eq!(
            parse(&["--to-latest", "--execute"])
                .unwrap()
                .target()
                .unwrap(),
            ResetTo::Latest
        );
        assert_eq!(
            parse(&["--to-timestamp", "1000"])
                .unwrap()
                .target()
                .unwrap(),
            ResetTo::Timestamp(1000)
        );
        assert_eq!(
            parse(&["--to-datetime", "2026-12-01T00:00:00Z"])
                .unwrap()
                .target()
                .unwrap(),
            ResetTo::Timestamp(1_796_083_200_000)
        );
        let a = parse(&["--to-offset", "1:5,0:7", "--transactional-prefix", "tx2"]);
        assert!(
            a.is_err(),
            "--prefix and --transactional-prefix are one option"
        );
        let a = parse(&["--to-offset", "1:5,0:7"]).unwrap();
        assert_eq!(
            a.target().unwrap(),
            ResetTo::Offset(ToOffset::Each([(0, 7), (1, 5)].into()))
        );
        let a = parse(&["--to-offset", "1:5", "--partitions", "1"]).unwrap();
        assert_eq!(
            a.target().unwrap_err().exit_code(),
            crate::error::EXIT_USAGE
        );
        let a = parse(&["--to-offset", "12", "--partitions", "0,2"]).unwrap();
        assert_eq!(a.target().unwrap(), ResetTo::Offset(ToOffset::All(12)));
        assert_eq!(a.partitions, [0, 2]);
    }

    /// --to-offset takes one offset or a list of P:OFFSET, each partition once, nothing negative.
    #[test]
    fn offsets_parse_or_say_what_is_wrong() {
        assert_eq!(parse_to_offset("42"), Ok(ToOffset::All(42)));
        assert_eq!(
            parse_to_offset("0:1, 3:9"),
            Ok(ToOffset::Each([(0, 1), (3, 9)].into()))
        );
        for bad in [
            "",
            "-1",
            "x",
            "0:1,0:2",
            "0:-3",
            "a:1",
            "0:",
            "1:2,3",
            "99999999999:1",
        ] {
            assert!(parse_to_offset(bad).is_err(), "{bad:?}");
        }
    }

    /// Dates convert as RFC 3339 says, zone included, and anything else is refused with an example.
    #[test]
    fn datetimes_parse_with_their_zone() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_datetime("1970-01-01T00:00:01.5Z"), Ok(1500));
        assert_eq!(parse_datetime("1970-01-01T01:00+01:00"), Ok(0));
        assert_eq!(parse_datetime("1969-12-31T19:00:00-05:00"), Ok(0));
        assert_eq!(parse_datetime("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(
            parse_datetime("2026-12-01T00:00:00.123456z"),
            Ok(1_796_083_200_123)
        );
        for bad in [
            "2026-12-01",
            "2026-12-01T00:00:00",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T00:00:00+1:00",
            "26-12-01T00:00:00Z",
            "2026-12-01T00:00:00.x1Z",
            "",
        ] {
            let e = parse_datetime(bad).unwrap_err();
            assert!(e.contains("2026-12-01T00:00:00Z"), "{bad:?}: {e}");
        }
    }

    /// Each target lands inside the log: earliest at the log start, latest and a timestamp past the end
    /// at the high watermark, an explicit offset only when the log holds it.
    #[test]
    fn new_offsets_stay_within_the_log() {
        let at = |to: &ResetTo, by_time| new_offset(to, "in", 0, 10, 50, by_time);
        assert_eq!(at(&ResetTo::Earliest, None).unwrap(), 10);
        assert_eq!(at(&ResetTo::Latest, None).unwrap(), 50);
        assert_eq!(at(&ResetTo::Timestamp(5), Some(30)).unwrap(), 30);
        assert_eq!(at(&ResetTo::Timestamp(5), Some(-1)).unwrap(), 50);
        assert_eq!(at(&ResetTo::Offset(ToOffset::All(50)), None).unwrap(), 50);
        assert_eq!(at(&ResetTo::Offset(ToOffset::All(10)), None).unwrap(), 10);
        for o in [9, 51] {
            let e = at(&ResetTo::Offset(ToOffset::All(o)), None).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_NOT_FOUND, "{e}");
            assert!(
                e.next_step().contains("between 10 and 50"),
                "{}",
                e.next_step()
            );
        }
        let each = ResetTo::Offset(ToOffset::Each([(1, 20)].into()));
        assert!(at(&each, None).is_err(), "partition 0 has no offset named");
    }

    fn envelope(offset: i64, state: &[u8]) -> Vec<u8> {
        [&[1u8][..], &offset.to_be_bytes(), state].concat()
    }

    fn grave(offset: i64) -> Vec<u8> {
        [&[2u8][..], &offset.to_be_bytes()].concat()
    }

    /// The rule: a snapshot (live or grave) whose envelope offset is at or past the new offset goes, one
    /// below it stays; a foreign value stops the plan with a typed error naming the key.
    #[test]
    fn snapshots_at_or_past_the_new_offset_are_doomed() {
        let (a, b, c, d) = (envelope(4, b"x"), envelope(5, b"y"), grave(9), grave(2));
        let snapshots: Vec<(&[u8], &[u8])> = vec![(b"c", &c), (b"a", &a), (b"b", &b), (b"d", &d)];
        let plan = doomed("s", 0, snapshots.clone(), &[5], 64).unwrap();
        assert_eq!(
            plan.keys,
            [Bytes::from_static(b"b"), Bytes::from_static(b"c")]
        );
        assert_eq!((plan.live, plan.graves, plan.kept), (1, 1, 2));
        assert_eq!(
            doomed("s", 0, snapshots.clone(), &[0], 64)
                .unwrap()
                .keys
                .len(),
            4
        );
        assert!(doomed("s", 0, snapshots, &[10], 64)
            .unwrap()
            .keys
            .is_empty());
        let e = doomed("s", 3, vec![(&b"k"[..], &b"plain"[..])], &[0], 64).unwrap_err();
        assert!(
            matches!(e, CliError::ForeignSnapshot { partition: 3, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("\"k\""), "{e}");
        // A flow with several input topics: its envelopes account for each. A snapshot goes when it
        // reaches the new offset of any input; one written before the second input counts for the
        // first only; naming another number of inputs is refused.
        let two =
            |a: i64, b: i64| [&[3u8, 2][..], &a.to_be_bytes(), &b.to_be_bytes(), b"x"].concat();
        let (p, q, r, old) = (two(4, 7), two(2, 9), two(1, 1), envelope(6, b"x"));
        let several: Vec<(&[u8], &[u8])> = vec![(b"p", &p), (b"q", &q), (b"r", &r), (b"o", &old)];
        let plan = doomed("s", 1, several.clone(), &[3, 8], 64).unwrap();
        assert_eq!(
            plan.keys,
            [
                Bytes::from_static(b"o"),
                Bytes::from_static(b"p"),
                Bytes::from_static(b"q")
            ]
        );
        assert_eq!(plan.kept, 1);
        let e = doomed("s", 1, several, &[0], 64).unwrap_err();
        assert!(
            matches!(
                e,
                CliError::InputCount {
                    partition: 1,
                    inputs: 2,
                    named: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.next_step().contains("nothing was changed"),
            "{}",
            e.next_step()
        );
    }

    /// The plan names each partition's move and counts, states the rule, and says what a forward move
    /// keeps.
    #[test]
    fn the_plan_shows_moves_counts_and_the_rule() {
        let args = parse(&["--to-earliest"]).unwrap();
        let input = |topic: &str, committed, new_offset| InputPlan {
            topic: topic.into(),
            committed,
            store_offset: None,
            new_offset,
        };
        let plan = [
            PartitionPlan {
                partition: 0,
                first: input("in", Some(12), 0),
                more: Vec::new(),
                doomed: Doomed {
                    keys: vec![Bytes::from_static(b"a")],
                    live: 1,
                    graves: 0,
                    kept: 0,
                },
            },
            PartitionPlan {
                partition: 1,
                first: input("in", None, 0),
                more: Vec::new(),
                doomed: Doomed::default(),
            },
            PartitionPlan {
                partition: 2,
                first: input("in", Some(3), 8),
                more: Vec::new(),
                doomed: Doomed::default(),
            },
        ];
        let text = plan_text(&args, "snaps", false, &ResetTo::Earliest, &plan);
        assert!(text.contains("back 12"), "{text}");
        assert!(text.contains("none committed"), "{text}");
        assert!(text.contains("forward 5"), "{text}");
        assert!(text.contains("1 (1/0)"), "{text}");
        assert!(text.contains("rule: "), "{text}");
        assert!(text.contains("forward: "), "{text}");
        let j = plan[0].json();
        assert_eq!(
            (
                j["direction"].as_str(),
                j["delete"].as_u64(),
                j["committed"].as_i64()
            ),
            (Some("backward"), Some(1), Some(12))
        );
        assert!(plan[1].json()["committed"].is_null());
        assert!(j.get("inputs").is_none(), "one input: no per-input list");

        // Several inputs: a line per input, the counts on the first, every input in the JSON.
        let args = parse(&["--to-earliest", "--input", "in,more"]).unwrap();
        assert_eq!(args.input, ["in", "in", "more"]);
        let args = ResetArgs {
            input: vec!["in".into(), "more".into()],
            ..args
        };
        let two = [PartitionPlan {
            partition: 0,
            first: input("in", Some(12), 0),
            more: vec![input("more", Some(4), 9)],
            doomed: Doomed {
                keys: vec![Bytes::from_static(b"a")],
                live: 1,
                graves: 0,
                kept: 2,
            },
        }];
        let text = plan_text(&args, "snaps", false, &ResetTo::Earliest, &two);
        assert!(text.contains("inputs [\"in\", \"more\"]"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("in ") && l.contains("back 12") && l.contains("1 (1/0)")),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("more") && l.contains("forward 5")),
            "{text}"
        );
        assert!(text.contains("forward: "), "{text}");
        let j = two[0].json();
        assert_eq!(j["inputs"][1]["topic"], "more");
        assert_eq!(j["inputs"][1]["direction"], "forward");
        assert_eq!(two[0].new_offsets(), [0, 9]);
        assert_eq!(
            args.target().unwrap(),
            ResetTo::Earliest,
            "a time or an end finds each input's offset"
        );
        let offset = ResetArgs {
            to_earliest: false,
            to_offset: Some(ToOffset::All(3)),
            ..args
        };
        assert_eq!(
            offset.target().unwrap_err().exit_code(),
            crate::error::EXIT_USAGE,
            "--to-offset names one input's offsets"
        );
    }
}
