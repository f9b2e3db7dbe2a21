//! `recover`: the snapshot recovery read of one partition, run by an operator who does not own it.
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
    recover, LogChunk, LogError, PartitionLog, RecoveredState, RecoveryConfig, RecoveryStats,
    SnapshotError, SnapshotLog, StallDiagnosis,
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
    /// The partition (a snapshot partition holds the state of the input partition with the same number).
    #[arg(long, short = 'p')]
    pub partition: i32,
    /// Give up when the read has not advanced for this many seconds, and say why (0: wait forever).
    /// The runtime's default is 180.
    #[arg(long, default_value_t = 180, value_name = "SECS")]
    pub stall_timeout: u64,
    /// Also list every recovered key with the size of its latest snapshot.
    #[arg(long)]
    pub keys: bool,
    /// List every recovered key with its latest snapshot's value too, shown as `dump` shows values
    /// (text when it is printable UTF-8, hex otherwise, cut at --max-bytes). Implies --keys.
    #[arg(long)]
    pub values: bool,
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

/// Runs `recover`.
pub(crate) async fn run(
    cluster: &Cluster,
    args: &RecoverArgs,
    format: Format,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let topic = cluster
        .topic_with_partition(&args.topic, args.partition)
        .await?;
    let config = RecoveryConfig {
        stall_timeout: (args.stall_timeout > 0).then(|| Duration::from_secs(args.stall_timeout)),
        ..RecoveryConfig::default()
    };
    let seen = Arc::new(Seen {
        start: AtomicI64::new(-1),
        target: AtomicI64::new(-1),
        position: AtomicI64::new(-1),
    });
    let mut log = Watched {
        inner: PartitionLog::new(cluster.client.clone(), &topic.name, args.partition),
        seen: Arc::clone(&seen),
    };
    let read = recover(&mut log, args.partition, &config);
    let result = if io.progress {
        with_progress(read, &seen, &topic.name, args.partition, io).await
    } else {
        read.await
    };
    match result {
        Ok((state, stats)) => match format {
            Format::Text => print_text(io.out, &topic.name, args, &state, &stats),
            Format::Json => print_json(io.out, &topic.name, args, &state, &stats),
        },
        Err(e) => {
            let e = stalled_or_failed(&topic.name, args.partition, e);
            if let (Format::Json, CliError::RecoveryStalled { .. }) = (format, &e) {
                // A script gets the stall as data on stdout too; the error and next step go to stderr.
                writeln!(io.out, "{}", stall_json(&e))?;
            }
            Err(e)
        }
    }
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

/// Every live (key, value), by key.
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

/// One line of the key list: the key, its snapshot's size and, with --values, the value by dump's rules.
fn key_line(key: &[u8], value: &[u8], args: &RecoverArgs) -> String {
    let mut line = format!(
        "  {}  {} bytes",
        ShownBytes::new(key, args.max_bytes).text(),
        value.len()
    );
    if args.values {
        line.push_str("  value ");
        line.push_str(&opt_text(Some(value), args.max_bytes));
    }
    line
}

/// One entry of the JSON key list.
fn key_json(key: &[u8], value: &[u8], args: &RecoverArgs) -> Value {
    let mut entry = json!({
        "key": ShownBytes::new(key, args.max_bytes).json(),
        "snapshot_size": value.len(),
    });
    if args.values {
        entry["value"] = opt_json(Some(value), args.max_bytes);
    }
    entry
}

fn print_text(
    out: &mut dyn Write,
    topic: &str,
    args: &RecoverArgs,
    state: &RecoveredState,
    stats: &RecoveryStats,
) -> Result<(), CliError> {
    let live_bytes = state.live_bytes();
    writeln!(
        out,
        "recovered {topic}/{}: {} live key(s), {live_bytes} bytes of keys and snapshots",
        args.partition,
        state.len()
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
    args: &RecoverArgs,
    state: &RecoveredState,
    stats: &RecoveryStats,
) -> Result<(), CliError> {
    let mut doc = json!({
        "outcome": "recovered",
        "topic": topic,
        "partition": args.partition,
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

    /// --values shows each snapshot by dump's rules: printable text as text, anything that could move
    /// the cursor as hex, cut at --max-bytes with the full size; without it, only the size.
    #[test]
    fn values_are_shown_as_dump_shows_them() {
        let plain = args(&["--keys"]);
        assert!(plain.lists_keys());
        assert_eq!(key_line(b"a", b"3", &plain), "  \"a\"  1 bytes");
        assert!(key_json(b"a", b"3", &plain).get("value").is_none());

        let values = args(&["--values", "--max-bytes", "4"]);
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
