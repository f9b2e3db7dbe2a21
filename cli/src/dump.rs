//! `dump`: a partition's batches as the broker serves them, read over the wire with Fetch.
//!
//! Without `--partition` every partition of the topic is dumped in turn, in partition order (as kcat
//! does), each line naming its partition and each partition closed by its own summary, then a line for the
//! whole topic.
//!
//! Every batch is shown with its header (offsets, producer id and epoch, base sequence, attributes,
//! codec, timestamps) and its records; transaction markers appear as COMMIT or ABORT lines. At
//! read_committed the batches go through the same visibility engine every snapfence reader uses
//! (`records::visible`), and each data batch says whether a read_committed consumer gets it or skips it
//! as aborted, so an operator sees what the consumer sees and why. At read_uncommitted, `LogState`
//! follows the transactions begun and ended inside the dump and the summary names those still open.
//!
//! # References
//! - Kafka protocol guide, "Record Batch" (magic 2); Fetch (key 1) `aborted_transactions` (KIP-98)

use std::collections::BTreeSet;
use std::io::Write;

use serde_json::{json, Value};
use snapfence::records::{
    decode_batches, visible, Compression, ControlMarker, IsolationLevel, LogState, RecordBatch,
    TimestampType,
};

use crate::error::CliError;
use crate::kafka::Cluster;
use crate::progress::Progress;
use crate::show::{opt_json, opt_text, utc, ShownBytes};
use crate::{Format, Io};

/// The isolation level of the dump's fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    /// Everything up to the high watermark, open and aborted transactions included.
    #[value(name = "read_uncommitted")]
    ReadUncommitted,
    /// What a read_committed consumer gets: up to the last stable offset, aborted data marked.
    #[value(name = "read_committed")]
    ReadCommitted,
}

/// The arguments of `dump`.
#[derive(Debug, Clone, clap::Args)]
pub struct DumpArgs {
    /// The topic.
    pub topic: String,
    /// The partition (default: every partition, one after the other).
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    /// First offset to show (default: the log start). A batch that contains it is shown whole. Needs
    /// --partition: offsets are per partition.
    #[arg(long, short = 'o', requires = "partition")]
    pub offset: Option<i64>,
    /// Stop after this many batches (markers count as batches); without --partition, this many from
    /// each partition.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Stop at the end of the log as it is when the dump starts: the high watermark, or the last stable
    /// offset at read_committed. The default when --count is not given.
    #[arg(long)]
    pub until_hw: bool,
    /// The isolation level of the fetches.
    #[arg(long, value_enum, default_value_t = Isolation::ReadUncommitted)]
    pub isolation: Isolation,
    /// Show at most this many bytes of each key, value and header value.
    #[arg(long, default_value_t = 64, value_name = "BYTES")]
    pub max_bytes: usize,
    /// Bytes asked for per fetch (grows by itself when one batch is larger).
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES")]
    pub fetch_bytes: i32,
}

/// Largest fetch the dump grows to when a single batch does not fit.
const MAX_FETCH_BYTES: i32 = 256 << 20;

/// How a batch fares at read_committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// read_uncommitted: no judgement.
    Unjudged,
    /// A read_committed consumer gets these records.
    Delivered,
    /// A read_committed consumer skips this batch: its transaction was aborted.
    Aborted,
    /// A control batch: never delivered.
    Marker,
}

impl Fate {
    fn name(self) -> Option<&'static str> {
        match self {
            Fate::Unjudged => None,
            Fate::Delivered => Some("delivered"),
            Fate::Aborted => Some("aborted"),
            Fate::Marker => Some("marker"),
        }
    }
}

#[derive(Default)]
struct Tally {
    batches: u64,
    records: u64,
    commits: u64,
    aborts: u64,
    aborted_batches: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.batches += other.batches;
        self.records += other.records;
        self.commits += other.commits;
        self.aborts += other.aborts;
        self.aborted_batches += other.aborted_batches;
    }
}

/// Which partition a line is from, when the dump covers more than one. With `--partition` the operator
/// named it, and the lines stay as they always were; in JSON every line carries it either way.
#[derive(Debug, Clone, Copy)]
struct Lines {
    partition: i32,
    tagged: bool,
}

impl Lines {
    /// What starts a text line: `p3  ` when tagged, nothing otherwise.
    fn tag(self) -> String {
        if self.tagged {
            format!("p{}  ", self.partition)
        } else {
            String::new()
        }
    }
}

/// Runs `dump`.
pub(crate) async fn run(
    cluster: &Cluster,
    args: &DumpArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if args.fetch_bytes <= 0 {
        return Err(CliError::Usage {
            message: "--fetch-bytes must be positive".into(),
            hint: "leave it out for 1 MiB per fetch".into(),
        });
    }
    if let Some(p) = args.partition {
        let topic = cluster.topic_with_partition(&args.topic, p).await?;
        let lines = Lines {
            partition: p,
            tagged: false,
        };
        dump_partition(cluster, &topic, lines, args, format, io).await?;
        return Ok(());
    }
    let topic = cluster.topic(&args.topic).await?;
    let mut total = Tally::default();
    // BTreeMap keys: partition order.
    for &p in topic.partitions.keys() {
        let lines = Lines {
            partition: p,
            tagged: true,
        };
        total.add(&dump_partition(cluster, &topic, lines, args, format, io).await?);
    }
    topic_summary(io.out, format, &topic.name, topic.partitions.len(), &total)
}

/// Dumps one partition and its summary; returns what it counted.
async fn dump_partition(
    cluster: &Cluster,
    topic: &snapfence::net::TopicMetadata,
    lines: Lines,
    args: &DumpArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<Tally, CliError> {
    let p = lines.partition;
    let offsets = cluster.offsets(&topic.name, p).await?;
    let start = args.offset.unwrap_or(offsets.log_start);
    if start < offsets.log_start || start > offsets.high_watermark {
        return Err(CliError::OffsetOutOfRange {
            topic: topic.name.clone(),
            partition: p,
            offset: start,
            log_start: offsets.log_start,
            high_watermark: offsets.high_watermark,
        });
    }
    let isolation = match args.isolation {
        Isolation::ReadUncommitted => IsolationLevel::ReadUncommitted,
        Isolation::ReadCommitted => IsolationLevel::ReadCommitted,
    };
    let log_end = match isolation {
        IsolationLevel::ReadCommitted => offsets.last_stable,
        IsolationLevel::ReadUncommitted => offsets.high_watermark,
    };
    let end = (args.until_hw || args.count.is_none()).then_some(log_end);

    let mut progress = Progress::new(io.progress, format!("dumping {}/{p}", topic.name));
    let mut tally = Tally::default();
    let mut state = LogState::new();
    let mut offset = start;
    let mut fetch_bytes = args.fetch_bytes;
    let mut last_seen = offsets;
    let stop = 'fetching: loop {
        if end.is_some_and(|e| offset >= e) {
            break "end";
        }
        if args.count.is_some_and(|c| tally.batches >= c) {
            break "count";
        }
        if let Some(e) = end {
            progress.update(
                io.err,
                (offset - start) as u64,
                Some((e - start).max(0) as u64),
            );
        } else {
            progress.update(io.err, tally.batches, args.count);
        }
        let fetched = cluster
            .fetch(topic, p, offset, isolation, fetch_bytes)
            .await?;
        last_seen.high_watermark = fetched.high_watermark;
        last_seen.last_stable = fetched.last_stable;
        last_seen.log_start = fetched.log_start;
        if fetched.records.is_empty() {
            // Nothing past `offset` is readable at this isolation level: the end of the log (or the LSO).
            break "end";
        }
        let fetch_offset = offset;
        let decode_error = |source| CliError::Decode {
            topic: topic.name.clone(),
            partition: p,
            offset: fetch_offset,
            source,
        };
        let mut iter = decode_batches(fetched.records.clone());
        let mut batches = Vec::new();
        for b in iter.by_ref() {
            batches.push(b.map_err(decode_error)?);
        }
        if batches.is_empty() {
            // One batch larger than the fetch size: ask for more (the broker returns at least one whole
            // batch to a fetch that starts at it on current versions, but not on every path).
            if iter.remaining() > 0 && fetch_bytes < MAX_FETCH_BYTES {
                fetch_bytes = fetch_bytes.saturating_mul(2).min(MAX_FETCH_BYTES);
                continue;
            }
            return Err(CliError::Protocol {
                what: format!("fetch {}/{p} from offset {offset}", topic.name),
                detail: format!(
                    "no complete batch in {} bytes (fetch size {fetch_bytes})",
                    fetched.records.len()
                ),
            });
        }
        let delivered: BTreeSet<i64> = match isolation {
            IsolationLevel::ReadCommitted => visible(&batches, &fetched.aborted, isolation, offset)
                .map_err(decode_error)?
                .iter()
                .map(|r| r.offset())
                .collect(),
            IsolationLevel::ReadUncommitted => BTreeSet::new(),
        };
        for batch in &batches {
            if batch.last_offset() < offset {
                continue;
            }
            if end.is_some_and(|e| batch.base_offset() >= e) {
                break 'fetching "end";
            }
            state.observe(batch).map_err(decode_error)?;
            let fate = match isolation {
                IsolationLevel::ReadUncommitted => Fate::Unjudged,
                _ if batch.is_control() => Fate::Marker,
                _ if delivered
                    .range(batch.base_offset()..=batch.last_offset())
                    .next()
                    .is_some() =>
                {
                    Fate::Delivered
                }
                _ if batch.is_transactional() => Fate::Aborted,
                // A non-transactional batch with no record past the fetch offset.
                _ => Fate::Delivered,
            };
            show_batch(
                io.out,
                batch,
                fate,
                lines,
                args.max_bytes,
                format,
                &mut tally,
            )
            .map_err(|e| match e {
                Shown::Io(e) => CliError::Io(e),
                Shown::Decode(source) => CliError::Decode {
                    topic: topic.name.clone(),
                    partition: p,
                    offset: batch.base_offset(),
                    source,
                },
            })?;
            offset = batch.next_offset();
            if args.count.is_some_and(|c| tally.batches >= c) {
                break 'fetching "count";
            }
        }
        let next = offset.max(iter.next_offset().unwrap_or(offset));
        if next == fetch_offset {
            // Complete batches that all end below the fetch offset: asking again would loop forever.
            return Err(CliError::Protocol {
                what: format!("fetch {}/{p} from offset {fetch_offset}", topic.name),
                detail: "the broker answered only with batches before the fetch offset".into(),
            });
        }
        offset = next;
    };
    progress.finish(io.err);
    let range = Range {
        start,
        next: offset,
        end,
        stop,
    };
    summary(
        io.out, format, args, lines, &range, &tally, &state, last_seen,
    )?;
    Ok(tally)
}

/// Where one partition's dump started and stopped.
struct Range {
    start: i64,
    /// The next offset the dump would have shown.
    next: i64,
    /// Where it was to stop, when bounded by the log end.
    end: Option<i64>,
    /// `"end"` or `"count"`.
    stop: &'static str,
}

enum Shown {
    Io(std::io::Error),
    Decode(snapfence::records::DecodeError),
}

impl From<std::io::Error> for Shown {
    fn from(e: std::io::Error) -> Self {
        Shown::Io(e)
    }
}

impl From<snapfence::records::DecodeError> for Shown {
    fn from(e: snapfence::records::DecodeError) -> Self {
        Shown::Decode(e)
    }
}

fn codec_name(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Gzip => "gzip",
        Compression::Snappy => "snappy",
        Compression::Lz4 => "lz4",
        Compression::Zstd => "zstd",
    }
}

fn show_batch(
    out: &mut dyn Write,
    batch: &RecordBatch,
    fate: Fate,
    lines: Lines,
    max_bytes: usize,
    format: Format,
    tally: &mut Tally,
) -> Result<(), Shown> {
    tally.batches += 1;
    if let Some(marker) = batch.control()? {
        let (name, coordinator_epoch) = match marker {
            ControlMarker::Commit { coordinator_epoch } => {
                tally.commits += 1;
                ("COMMIT".to_owned(), Some(coordinator_epoch))
            }
            ControlMarker::Abort { coordinator_epoch } => {
                tally.aborts += 1;
                ("ABORT".to_owned(), Some(coordinator_epoch))
            }
            ControlMarker::Other { kind } => (format!("CONTROL(type {kind})"), None),
            // ControlMarker is non_exhaustive: show what a newer snapfence might add rather than fail.
            #[allow(unreachable_patterns)]
            other => (format!("{other:?}"), None),
        };
        match format {
            Format::Text => writeln!(
                out,
                "{}{name} marker  offset {}  producer {} epoch {}{}  at {}  leader-epoch {}",
                lines.tag(),
                batch.base_offset(),
                batch.producer_id(),
                batch.producer_epoch(),
                coordinator_epoch.map_or(String::new(), |e| format!("  coordinator-epoch {e}")),
                utc(batch.max_timestamp()),
                batch.partition_leader_epoch(),
            )?,
            Format::Json => writeln!(
                out,
                "{}",
                json!({
                    "type": "marker",
                    "partition": lines.partition,
                    "marker": name,
                    "offset": batch.base_offset(),
                    "producer_id": batch.producer_id(),
                    "producer_epoch": batch.producer_epoch(),
                    "coordinator_epoch": coordinator_epoch,
                    "timestamp": batch.max_timestamp(),
                    "partition_leader_epoch": batch.partition_leader_epoch(),
                })
            )?,
        }
        return Ok(());
    }
    if fate == Fate::Aborted {
        tally.aborted_batches += 1;
    }
    let attrs = batch.attributes();
    let mut flags = Vec::new();
    if batch.is_transactional() {
        flags.push("transactional");
    }
    if attrs.timestamp_type() == TimestampType::LogAppendTime {
        flags.push("log-append-time");
    }
    if attrs.has_delete_horizon() {
        flags.push("delete-horizon");
    }
    let records: Vec<_> = batch.records()?.collect::<Result<_, _>>()?;
    tally.records += records.len() as u64;
    match format {
        Format::Text => {
            let verdict = match fate {
                Fate::Delivered => "  [read_committed: delivered]",
                Fate::Aborted => "  [read_committed: ABORTED, skipped]",
                Fate::Unjudged | Fate::Marker => "",
            };
            let tag = lines.tag();
            writeln!(
                out,
                "{tag}batch {}..{}  {} record(s)  producer {} epoch {} seq {}  {}  codec {}  created {}  \
                 leader-epoch {}  crc {:#010x}  {} bytes{verdict}",
                batch.base_offset(),
                batch.last_offset(),
                batch.record_count(),
                batch.producer_id(),
                batch.producer_epoch(),
                batch.base_sequence(),
                if flags.is_empty() {
                    "plain".to_owned()
                } else {
                    flags.join(",")
                },
                codec_name(batch.compression()),
                utc(batch.base_timestamp()),
                batch.partition_leader_epoch(),
                batch.crc(),
                batch.batch_length() as i64 + 12,
            )?;
            for r in &records {
                let mut line = format!(
                    "{tag}  {:>8}  key {}  value {}",
                    r.offset,
                    opt_text(r.key.as_deref(), max_bytes),
                    opt_text(r.value.as_deref(), max_bytes)
                );
                for h in &r.headers {
                    line.push_str(&format!(
                        "  {}={}",
                        ShownBytes::new(&h.key, max_bytes).text(),
                        opt_text(h.value.as_deref(), max_bytes)
                    ));
                }
                writeln!(out, "{line}")?;
            }
        }
        Format::Json => {
            let records: Vec<Value> = records
                .iter()
                .map(|r| {
                    json!({
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": opt_json(r.key.as_deref(), max_bytes),
                        "value": opt_json(r.value.as_deref(), max_bytes),
                        "headers": r.headers.iter().map(|h| json!({
                            "key": ShownBytes::new(&h.key, max_bytes).json(),
                            "value": opt_json(h.value.as_deref(), max_bytes),
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            writeln!(
                out,
                "{}",
                json!({
                    "type": "batch",
                    "partition": lines.partition,
                    "base_offset": batch.base_offset(),
                    "last_offset": batch.last_offset(),
                    "record_count": batch.record_count(),
                    "producer_id": batch.producer_id(),
                    "producer_epoch": batch.producer_epoch(),
                    "base_sequence": batch.base_sequence(),
                    "attributes": attrs.0,
                    "transactional": batch.is_transactional(),
                    "compression": codec_name(batch.compression()),
                    "timestamp_type": match attrs.timestamp_type() {
                        TimestampType::CreateTime => "create",
                        TimestampType::LogAppendTime => "log-append",
                    },
                    "base_timestamp": batch.base_timestamp(),
                    "max_timestamp": batch.max_timestamp(),
                    "partition_leader_epoch": batch.partition_leader_epoch(),
                    "crc": batch.crc(),
                    "size": batch.batch_length() as i64 + 12,
                    "read_committed": fate.name(),
                    "records": records,
                })
            )?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn summary(
    out: &mut dyn Write,
    format: Format,
    args: &DumpArgs,
    lines: Lines,
    range: &Range,
    tally: &Tally,
    state: &LogState,
    offsets: crate::kafka::Offsets,
) -> Result<(), CliError> {
    let Range {
        start,
        next,
        end,
        stop,
    } = *range;
    // Each partition's summary lines say whose they are when several follow one another.
    let lead = if lines.tagged {
        format!("-- p{}: ", lines.partition)
    } else {
        "-- ".to_owned()
    };
    let read_committed = args.isolation == Isolation::ReadCommitted;
    // LogState only knows transactions that began inside the dump; from the log start it is exact.
    let open = (!read_committed).then(|| state.open_transactions());
    let held_back = offsets.high_watermark - offsets.last_stable;
    match format {
        Format::Json => {
            writeln!(
                out,
                "{}",
                json!({
                    "type": "summary",
                    "partition": lines.partition,
                    "start_offset": start,
                    "next_offset": next,
                    "stopped_at": stop,
                    "end_offset": end,
                    "batches": tally.batches,
                    "records": tally.records,
                    "commit_markers": tally.commits,
                    "abort_markers": tally.aborts,
                    "aborted_batches": read_committed.then_some(tally.aborted_batches),
                    "log_start_offset": offsets.log_start,
                    "high_watermark": offsets.high_watermark,
                    "last_stable_offset": offsets.last_stable,
                    "open_in_dump": open.as_ref().map(|o| o.iter().map(|t| json!({
                        "producer_id": t.producer_id,
                        "first_offset": t.first_offset,
                    })).collect::<Vec<_>>()),
                    "open_in_dump_exact": start <= offsets.log_start,
                })
            )?;
        }
        Format::Text => {
            let why = match stop {
                "count" => "after --count batches".to_owned(),
                _ if read_committed => "at the last stable offset".to_owned(),
                _ => "at the high watermark".to_owned(),
            };
            writeln!(
                out,
                "{lead}{} batch(es), {} record(s), {} COMMIT and {} ABORT marker(s) from offset {start}; \
                 stopped {why}, next offset {next}",
                tally.batches, tally.records, tally.commits, tally.aborts
            )?;
            writeln!(
                out,
                "{lead}log start {}, high watermark {}, last stable offset {} (HW-LSO {held_back})",
                offsets.log_start, offsets.high_watermark, offsets.last_stable
            )?;
            if read_committed {
                writeln!(
                    out,
                    "{lead}read_committed: {} aborted batch(es) skipped",
                    tally.aborted_batches
                )?;
                if held_back > 0 {
                    writeln!(
                        out,
                        "{lead}{held_back} offset(s) past the LSO are held back by open transaction(s); \
                         see `snapfence inspect {}`",
                        args.topic
                    )?;
                }
            }
            if let Some(open) = open {
                let exact = if start <= offsets.log_start {
                    ""
                } else {
                    " (begun inside this dump; dump from the log start for all of them)"
                };
                if open.is_empty() {
                    writeln!(out, "{lead}no transaction left open in this range{exact}")?;
                } else {
                    let list: Vec<String> = open
                        .iter()
                        .map(|t| {
                            format!("producer {} from offset {}", t.producer_id, t.first_offset)
                        })
                        .collect();
                    writeln!(
                        out,
                        "{lead}open at the end of this range{exact}: {}",
                        list.join(", ")
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// The last line of a dump of every partition: the whole topic's counts.
fn topic_summary(
    out: &mut dyn Write,
    format: Format,
    topic: &str,
    partitions: usize,
    total: &Tally,
) -> Result<(), CliError> {
    match format {
        Format::Json => writeln!(
            out,
            "{}",
            json!({
                "type": "topic_summary",
                "topic": topic,
                "partitions": partitions,
                "batches": total.batches,
                "records": total.records,
                "commit_markers": total.commits,
                "abort_markers": total.aborts,
            })
        )?,
        Format::Text => writeln!(
            out,
            "-- {topic}: {partitions} partition(s), {} batch(es), {} record(s), {} COMMIT and {} ABORT \
             marker(s)",
            total.batches, total.records, total.commits, total.aborts
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use snapfence::records::{BatchBuilder, NewRecord, ProducerStamp};

    fn one_batch() -> RecordBatch {
        let mut builder = BatchBuilder::new(Compression::None, 1 << 20);
        let appended = builder
            .try_append(&NewRecord {
                timestamp: 0,
                key: Some(b"k0"),
                value: Some(b"v0"),
                headers: &[],
            })
            .expect("append");
        assert!(appended);
        let sealed = builder.seal(ProducerStamp::NONE).expect("seal");
        let bytes: Bytes = sealed.bytes().clone();
        decode_batches(bytes)
            .next()
            .expect("one batch")
            .expect("decodes")
    }

    fn shown(lines: Lines, format: Format) -> String {
        let mut out = Vec::new();
        let mut tally = Tally::default();
        show_batch(
            &mut out,
            &one_batch(),
            Fate::Unjudged,
            lines,
            64,
            format,
            &mut tally,
        )
        .map_err(|_| "show_batch failed")
        .unwrap();
        assert_eq!((tally.batches, tally.records), (1, 1));
        String::from_utf8(out).unwrap()
    }

    /// A dump of every partition interleaves nothing, but its lines must still say which partition each
    /// batch and record is from; a dump of the one partition asked for stays as it always was.
    #[test]
    fn lines_name_their_partition_when_the_dump_covers_several() {
        let one = Lines {
            partition: 3,
            tagged: false,
        };
        let text = shown(one, Format::Text);
        let rows: Vec<&str> = text.lines().collect();
        assert!(rows[0].starts_with("batch 0..0  1 record(s)"), "{text}");
        assert_eq!(rows[1], "         0  key \"k0\"  value \"v0\"");

        let all = Lines {
            partition: 3,
            tagged: true,
        };
        let text = shown(all, Format::Text);
        let rows: Vec<&str> = text.lines().collect();
        assert!(rows[0].starts_with("p3  batch 0..0"), "{text}");
        assert_eq!(rows[1], "p3           0  key \"k0\"  value \"v0\"");

        // JSON lines carry the partition either way, so a script reads one shape.
        for lines in [one, all] {
            let doc: Value = serde_json::from_str(shown(lines, Format::Json).trim()).unwrap();
            assert_eq!(doc["partition"], 3, "{doc}");
            assert_eq!(doc["records"][0]["value"]["data"], "v0", "{doc}");
        }
    }

    /// A topic's summary is the sum of its partitions' tallies, in text and in JSON.
    #[test]
    fn the_topic_summary_adds_up_the_partitions() {
        let mut total = Tally::default();
        for n in 1..=2 {
            total.add(&Tally {
                batches: n,
                records: 10 * n,
                commits: 1,
                aborts: 0,
                aborted_batches: 0,
            });
        }
        let mut out = Vec::new();
        topic_summary(&mut out, Format::Text, "t", 2, &total).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "-- t: 2 partition(s), 3 batch(es), 30 record(s), 2 COMMIT and 0 ABORT marker(s)\n"
        );
        let mut out = Vec::new();
        topic_summary(&mut out, Format::Json, "t", 2, &total).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (doc["type"].as_str(), doc["records"].as_u64()),
            (Some("topic_summary"), Some(30))
        );
    }
}
