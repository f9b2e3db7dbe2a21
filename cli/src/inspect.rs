//! `inspect`: the transactional state of a topic, partition by partition.
//!
//! For each partition: log start, high watermark and last stable offset (ListOffsets, the LSO being the
//! read_committed end), the gap HW − LSO that a read_committed consumer cannot cross yet, and the open
//! transactions the leader holds (DescribeProducers). Each open transaction is then looked up at the
//! coordinators (ListTransactions, DescribeTransactions) so the operator sees whose it is and how long
//! it has run. With `--group`, the group's committed offsets (OffsetFetch) and whether a transactional
//! offset commit is still pending.
//!
//! With `--watch` the same report is taken again every `--interval` seconds, like `top`: redrawn in
//! place on a terminal, appended as one timestamped block per tick anywhere else (a pipe, a file, a
//! log), until Ctrl-C, which ends it with status 0.
//!
//! # References
//! - KIP-98 (LSO), KIP-447 (`require_stable`), KIP-664 (DescribeProducers, ListTransactions,
//!   DescribeTransactions)

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::CliError;
use crate::kafka::{Cluster, Committed, Listing, Offsets, ProducerInfo, Tp, TxnDescription};
use crate::progress::Progress;
use crate::show::{age, now_ms, utc, Table};
use crate::{Format, Io};

/// The arguments of `inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    /// The topic to inspect.
    pub topic: String,
    /// Also show this consumer group's committed offsets for the topic.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Take the report again every --interval seconds until Ctrl-C: redrawn in place on a terminal,
    /// one timestamped block per tick into a pipe or file.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between two reports of --watch.
    #[arg(long, default_value_t = 1.0, value_name = "SECS", requires = "watch",
          value_parser = positive_seconds)]
    pub interval: f64,
    /// While watching, serve this process's metrics in the Prometheus text format at
    /// http://HOST:PORT/metrics (port 0 picks a free one; the address is printed on stderr).
    #[arg(long, value_name = "HOST:PORT", requires = "watch")]
    pub metrics_addr: Option<String>,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.01 => Ok(v),
        Ok(_) => Err("must be at least 0.01".into()),
        Err(e) => Err(e.to_string()),
    }
}

struct PartitionState {
    partition: i32,
    leader: i32,
    offsets: Offsets,
    open: Vec<ProducerInfo>,
    committed: Option<Committed>,
}

/// Who owns an open transaction, as far as the coordinators say.
struct Owner {
    listing: Listing,
    description: Option<TxnDescription>,
}

/// One report: what `inspect` prints once, or once per tick of `--watch`.
struct Report {
    topic: String,
    states: Vec<PartitionState>,
    owners: BTreeMap<i64, Owner>,
    /// Why the owners are missing, when they are.
    owner_error: Option<CliError>,
}

/// Runs `inspect`, once or (with `--watch`) until Ctrl-C. `metrics_at` is where `--metrics-addr`
/// serves, for the redrawn screen's header (the line on stderr that says so is cleared by the redraw).
pub(crate) async fn run(
    cluster: &Cluster,
    args: &InspectArgs,
    format: Format,
    metrics_at: Option<std::net::SocketAddr>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    if args.watch {
        return watch(cluster, args, format, metrics_at, io).await;
    }
    let report = gather(cluster, args, io.progress, io.err).await?;
    show(&report, args, format, now_ms(), io.out, io.err)
}

/// `--watch`: a report per tick until Ctrl-C.
///
/// Redrawn in place (ANSI clear screen and cursor home) only when the process's stdout is a terminal
/// and `io.progress` says a person is watching (the rule clap's colour follows, so in-process callers
/// that capture the output get plain blocks). A cluster that cannot be reached for a tick is reported
/// in that tick's block and tried again on the next; any other failure ends the watch.
async fn watch(
    cluster: &Cluster,
    args: &InspectArgs,
    format: Format,
    metrics_at: Option<std::net::SocketAddr>,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let redraw = io.progress && std::io::stdout().is_terminal();
    // Registered before the first request, so a Ctrl-C at any point ends the watch cleanly.
    let mut stop = std::pin::pin!(interrupted()?);
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(args.interval));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = &mut stop => return Ok(()),
        }
        // Progress would flicker under the redraw and clutter a log; each tick is quick anyway.
        let mut quiet = std::io::sink();
        let gathered = tokio::select! {
            r = gather(cluster, args, false, &mut quiet) => r,
            _ = &mut stop => return Ok(()),
        };
        let now = now_ms();
        let mut block = Vec::new();
        match gathered {
            Ok(report) => {
                // The note about missing owners belongs to this tick's block, after its tables; in
                // JSON lines it goes to stderr, as without --watch.
                let mut note = Vec::new();
                show(&report, args, format, now, &mut block, &mut note)?;
                match format {
                    Format::Text => block.extend_from_slice(&note),
                    Format::Json => io.err.write_all(&note)?,
                }
            }
            Err(e) if e.exit_code() == crate::error::EXIT_UNREACHABLE => writeln!(
                block,
                "error: {}\n  (trying again in {}s)",
                crate::error::render(&e),
                args.interval
            )?,
            Err(e) => return Err(e),
        }
        if redraw {
            write!(io.out, "\x1b[H\x1b[2J")?;
            write!(
                io.out,
                "snapfence inspect {} every {}s at {} (Ctrl-C to stop)",
                args.topic,
                args.interval,
                utc(now)
            )?;
            match metrics_at {
                Some(addr) => writeln!(io.out, "; metrics at http://{addr}/metrics\n")?,
                None => writeln!(io.out, "\n")?,
            }
        } else if format == Format::Text {
            writeln!(io.out, "--- {} ---", utc(now))?;
        }
        io.out.write_all(&block)?;
        if !redraw && format == Format::Text {
            writeln!(io.out)?;
        }
        io.out.flush()?;
    }
}

/// Resolves on the first Ctrl-C (SIGINT). The handler is installed when this is called, not when the
/// future is first polled, so no interrupt between the two kills the process instead.
fn interrupted() -> Result<impl std::future::Future<Output = ()>, CliError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigint = signal(SignalKind::interrupt())?;
        Ok(async move {
            sigint.recv().await;
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Prints one report: the text tables or the JSON document, then the note about missing owners.
fn show(
    report: &Report,
    args: &InspectArgs,
    format: Format,
    now: i64,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let Report {
        topic,
        states,
        owners,
        owner_error,
    } = report;
    match format {
        Format::Text => print_text(out, topic, args, states, owners, now)?,
        Format::Json => writeln!(out, "{}", to_json(topic, args, states, owners, now))?,
    }
    if let Some(e) = owner_error {
        writeln!(
            err,
            "note: could not ask the coordinators who owns the open transactions: {e}\n  next step: {}",
            e.next_step()
        )?;
    }
    Ok(())
}

/// Reads the topic's offsets, open transactions, their owners and the group's commits once.
async fn gather(
    cluster: &Cluster,
    args: &InspectArgs,
    progress: bool,
    err: &mut dyn Write,
) -> Result<Report, CliError> {
    let topic = cluster.topic(&args.topic).await?;
    let partitions: Vec<i32> = topic.partitions.keys().copied().collect();
    let mut progress = Progress::new(progress, format!("inspecting {}", topic.name));
    // Two passes over the partitions (producers, then offsets): progress counts both.
    let total = 2 * partitions.len() as u64;
    let mut done = 0u64;
    // Read order makes one consistent picture out of separate requests. The log only grows and markers
    // only close transactions, so reading the producers first, then the LSO, then the high watermark
    // guarantees HW >= LSO, and a transaction reported closed has its marker below the offsets shown.
    let keys: Vec<Tp> = partitions
        .iter()
        .map(|p| (topic.name.clone(), *p))
        .collect();
    let mut producers = cluster
        .describe_producers_many(&keys, None, |n| {
            done += n as u64;
            progress.update(err, done, Some(total));
        })
        .await?;
    let mut offsets = cluster
        .offsets_many(&topic.name, &partitions, |n| {
            done += n as u64;
            progress.update(err, done, Some(total));
        })
        .await?;
    let mut states = Vec::with_capacity(partitions.len());
    for &partition in &partitions {
        let (Some(offsets), Some(producers)) = (
            offsets.remove(&partition),
            producers.remove(&(topic.name.clone(), partition)),
        ) else {
            return Err(CliError::Protocol {
                what: format!("inspect {}", topic.name),
                detail: format!("no answer for partition {partition}"),
            });
        };
        states.push(PartitionState {
            partition,
            leader: topic.partitions[&partition].leader,
            offsets,
            open: producers
                .into_iter()
                .filter(ProducerInfo::has_open_transaction)
                .collect(),
            committed: None,
        });
    }
    progress.finish(err);

    if let Some(group) = &args.group {
        let mut committed = cluster.committed(group, &topic.name, &partitions).await?;
        for s in &mut states {
            s.committed = committed.remove(&s.partition);
        }
    }

    // Owners are context, not the point: a principal without DESCRIBE on transactional ids still gets
    // the offsets and the open transactions, with a note instead of the owners.
    let (owners, owner_error) = match owners(cluster, &states).await {
        Ok(o) => (o, None),
        Err(e) => (BTreeMap::new(), Some(e)),
    };
    Ok(Report {
        topic: topic.name.clone(),
        states,
        owners,
        owner_error,
    })
}

async fn owners(
    cluster: &Cluster,
    states: &[PartitionState],
) -> Result<BTreeMap<i64, Owner>, CliError> {
    let ids: BTreeSet<i64> = states
        .iter()
        .flat_map(|s| s.open.iter().map(|p| p.producer_id))
        .collect();
    let ids: Vec<i64> = ids.into_iter().collect();
    let listings = cluster.list_transactions(&ids).await?;
    let mut out = BTreeMap::new();
    for (producer_id, listing) in listings {
        let description = cluster
            .describe_transaction(&listing.transactional_id)
            .await?;
        out.insert(
            producer_id,
            Owner {
                listing,
                description,
            },
        );
    }
    Ok(out)
}

fn lag(s: &PartitionState) -> Option<i64> {
    s.committed
        .as_ref()
        .filter(|c| c.offset >= 0)
        .map(|c| s.offsets.last_stable - c.offset)
}

fn print_text(
    out: &mut dyn Write,
    topic: &str,
    args: &InspectArgs,
    states: &[PartitionState],
    owners: &BTreeMap<i64, Owner>,
    now: i64,
) -> Result<(), CliError> {
    writeln!(out, "topic {topic}: {} partition(s)", states.len())?;
    let mut table = Table::new(&[
        "PARTITION",
        "LEADER",
        "LOG-START",
        "HIGH-WATERMARK",
        "LAST-STABLE",
        "HW-LSO",
        "OPEN-TXNS",
    ]);
    for s in states {
        table.row(vec![
            s.partition.to_string(),
            s.leader.to_string(),
            s.offsets.log_start.to_string(),
            s.offsets.high_watermark.to_string(),
            s.offsets.last_stable.to_string(),
            (s.offsets.high_watermark - s.offsets.last_stable).to_string(),
            s.open.len().to_string(),
        ]);
    }
    write!(out, "{}", table.render())?;

    let open: Vec<(&PartitionState, &ProducerInfo)> = states
        .iter()
        .flat_map(|s| s.open.iter().map(move |p| (s, p)))
        .collect();
    if open.is_empty() {
        writeln!(out, "\nno open transactions")?;
    } else {
        writeln!(out, "\nopen transactions:")?;
        let mut table = Table::new(&[
            "PARTITION",
            "PRODUCER",
            "EPOCH",
            "START-OFFSET",
            "HOLDS-BACK",
            "LAST-WRITE",
            "TRANSACTIONAL-ID",
            "COORDINATOR-STATE",
            "RUNNING-FOR",
            "TIMEOUT",
        ]);
        for (s, p) in open {
            let owner = owners.get(&p.producer_id);
            let d = owner.and_then(|o| o.description.as_ref());
            table.row(vec![
                s.partition.to_string(),
                p.producer_id.to_string(),
                p.producer_epoch.to_string(),
                p.txn_start_offset.to_string(),
                format!("{} offsets", s.offsets.high_watermark - p.txn_start_offset),
                format!("{} ago", age(now - p.last_timestamp)),
                owner.map_or("-".into(), |o| o.listing.transactional_id.clone()),
                match (owner, d) {
                    (_, Some(d)) => d.state.clone(),
                    (Some(_), None) => "unknown to coordinator".into(),
                    (None, None) => "no coordinator lists it".into(),
                },
                d.filter(|d| d.start_time_ms >= 0)
                    .map_or("-".into(), |d| age(now - d.start_time_ms)),
                d.map_or("-".into(), |d| age(i64::from(d.timeout_ms))),
            ]);
        }
        write!(out, "{}", table.render())?;
    }

    if let Some(group) = &args.group {
        writeln!(out, "\ngroup {group}:")?;
        let mut table = Table::new(&[
            "PARTITION",
            "COMMITTED",
            "LAG-TO-LSO",
            "PENDING-TXN-COMMIT",
            "METADATA",
        ]);
        for s in states {
            let c = s.committed.as_ref();
            table.row(vec![
                s.partition.to_string(),
                c.filter(|c| c.offset >= 0)
                    .map_or("-".into(), |c| c.offset.to_string()),
                lag(s).map_or("-".into(), |l| l.to_string()),
                if c.is_some_and(|c| c.pending_transaction) {
                    "yes".into()
                } else {
                    "no".into()
                },
                c.and_then(|c| c.metadata.clone())
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
        write!(out, "{}", table.render())?;
    }
    Ok(())
}

fn to_json(
    topic: &str,
    args: &InspectArgs,
    states: &[PartitionState],
    owners: &BTreeMap<i64, Owner>,
    now: i64,
) -> Value {
    let partitions: Vec<Value> = states
        .iter()
        .map(|s| {
            let open: Vec<Value> = s
                .open
                .iter()
                .map(|p| {
                    let owner = owners.get(&p.producer_id);
                    let d = owner.and_then(|o| o.description.as_ref());
                    json!({
                        "producer_id": p.producer_id,
                        "producer_epoch": p.producer_epoch,
                        "coordinator_epoch": p.coordinator_epoch,
                        "start_offset": p.txn_start_offset,
                        "last_timestamp": p.last_timestamp,
                        "last_write_age_ms": now - p.last_timestamp,
                        "transactional_id": owner.map(|o| o.listing.transactional_id.clone()),
                        "coordinator": owner.map(|o| o.listing.coordinator),
                        "coordinator_state": d.map(|d| d.state.clone()),
                        "transaction_start_time_ms": d.map(|d| d.start_time_ms),
                        "transaction_timeout_ms": d.map(|d| d.timeout_ms),
                    })
                })
                .collect();
            let mut v = json!({
                "partition": s.partition,
                "leader": s.leader,
                "log_start_offset": s.offsets.log_start,
                "high_watermark": s.offsets.high_watermark,
                "last_stable_offset": s.offsets.last_stable,
                "hw_minus_lso": s.offsets.high_watermark - s.offsets.last_stable,
                "open_transactions": open,
            });
            if args.group.is_some() {
                v["committed"] = match &s.committed {
                    Some(c) => json!({
                        "offset": c.offset,
                        "metadata": c.metadata,
                        "pending_transaction": c.pending_transaction,
                        "lag_to_lso": lag(s),
                    }),
                    None => Value::Null,
                };
            }
            v
        })
        .collect();
    json!({
        "topic": topic,
        "group": args.group,
        "partitions": partitions,
    })
}
