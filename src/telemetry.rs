//! The metrics snapfence records: every name, its kind, labels and meaning, in one table.
//!
//! Metrics go through the [`metrics`] facade. The library never installs a recorder: the application
//! installs the exporter it wants (Prometheus, OpenTelemetry, statsd, ...) before it connects a
//! [`Client`](crate::Client), and with none installed every record is a call into the facade's no-op
//! recorder. `docs/metrics.md` lists the same table for people; a test keeps the two in agreement.
//!
//! Cost on hot paths: a metric recorded per request is a handle registered once per connection
//! ([`ConnMetrics`]), so recording is an atomic add on the recorder's side and nothing is allocated.
//! Rare events (a retry, a reconnect, a poisoned connection, a failed login) use the facade's macros,
//! whose label list is built on each call; that happens at most once per back-off sleep or socket.
//!
//! Handles are bound to the recorder in force when they are registered, so install the recorder before
//! connecting: connections opened earlier keep recording into the no-op recorder.
//!
//! # References
//! - Prometheus naming: <https://prometheus.io/docs/practices/naming/> (base units, `_total` counters)

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit};

use crate::net::ConnectionFailure;
use crate::snapshot::FailureKind;

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// As the docs table spells it.
    #[cfg(test)]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric: the single place its name, kind, labels and meaning are written down.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metric {
    /// `snapfence_` prefix, base unit in the name (`_seconds`, `_bytes`), `_total` on counters.
    pub name: &'static str,
    pub kind: Kind,
    /// Label keys, in the order the docs list them.
    pub labels: &'static [&'static str],
    /// One line, as the docs table and an exporter's `# HELP` show it.
    pub help: &'static str,
}

impl Metric {
    /// The unit the name ends in, for `describe_*`.
    fn unit(&self) -> Option<Unit> {
        if self.name.ends_with("_seconds") {
            Some(Unit::Seconds)
        } else if self.name.ends_with("_bytes_total") || self.name.ends_with("_bytes") {
            Some(Unit::Bytes)
        } else if self.kind == Kind::Counter || self.name.ends_with("_writes") {
            Some(Unit::Count)
        } else {
            None
        }
    }
}

// ---- the net layer ------------------------------------------------------------------------------

pub(crate) const REQUEST_DURATION: Metric = Metric {
    name: "snapfence_request_duration_seconds",
    kind: Kind::Histogram,
    labels: &["api"],
    help: "Time from queuing a request to receiving its response, per Kafka API (answered requests only)",
};

pub(crate) const REQUESTS_IN_FLIGHT: Metric = Metric {
    name: "snapfence_requests_in_flight",
    kind: Kind::Gauge,
    labels: &[],
    help: "Requests holding an in-flight slot on some connection, abandoned ones awaiting their answer included",
};

pub(crate) const REQUEST_RETRIES: Metric = Metric {
    name: "snapfence_request_retries_total",
    kind: Kind::Counter,
    labels: &["reason"],
    help: "Attempts followed by a retry after back-off; reason: transport, reroute, retriable, unknown_broker",
};

pub(crate) const CONNECTIONS_OPENED: Metric = Metric {
    name: "snapfence_connections_opened_total",
    kind: Kind::Counter,
    labels: &[],
    help: "Broker connections opened and handshaken (TCP, TLS, ApiVersions, SASL login)",
};

pub(crate) const RECONNECTS: Metric = Metric {
    name: "snapfence_reconnects_total",
    kind: Kind::Counter,
    labels: &[],
    help: "Connections opened to replace one that was poisoned, closed or past its SASL session lifetime",
};

pub(crate) const CONNECTIONS_POISONED: Metric = Metric {
    name: "snapfence_connections_poisoned_total",
    kind: Kind::Counter,
    labels: &["reason"],
    help: "Connections that failed and were closed, every request waiting on them failed with them; reason: timeout, io, closed, closed_mid_frame, frame, unexpected_correlation_id, task_failed",
};

pub(crate) const SENT_BYTES: Metric = Metric {
    name: "snapfence_network_sent_bytes_total",
    kind: Kind::Counter,
    labels: &[],
    help: "Request bytes queued for brokers, size prefixes included",
};

pub(crate) const RECEIVED_BYTES: Metric = Metric {
    name: "snapfence_network_received_bytes_total",
    kind: Kind::Counter,
    labels: &[],
    help: "Response bytes read from brokers, size prefixes included",
};

pub(crate) const REAUTHENTICATIONS: Metric = Metric {
    name: "snapfence_sasl_session_renewals_total",
    kind: Kind::Counter,
    labels: &["how"],
    help: "SASL sessions renewed before the broker's session lifetime (KIP-368) ran out; how: in_place (re-authenticated on the same connection), reconnect (a new connection logged in)",
};

pub(crate) const AUTHENTICATION_FAILURES: Metric = Metric {
    name: "snapfence_authentication_failures_total",
    kind: Kind::Counter,
    labels: &["mechanism"],
    help: "SASL logins refused by the broker or failed by the client, per mechanism",
};

// ---- the transactional producer -----------------------------------------------------------------

pub(crate) const CONCURRENT_TRANSACTIONS_RETRIES: Metric = Metric {
    name: "snapfence_concurrent_transactions_retries_total",
    kind: Kind::Counter,
    labels: &["api"],
    help: "Transaction requests answered CONCURRENT_TRANSACTIONS (the coordinator still busy with the transactional id) and retried, per Kafka API",
};

// ---- snapshot transactions (the group commit) ---------------------------------------------------

pub(crate) const TRANSACTION_DURATION: Metric = Metric {
    name: "snapfence_transaction_duration_seconds",
    kind: Kind::Histogram,
    labels: &["partition"],
    help:
        "Snapshot transactions from begin to outcome, committed or failed, per snapshot partition",
};

pub(crate) const TRANSACTION_WRITES: Metric = Metric {
    name: "snapfence_transaction_writes",
    kind: Kind::Histogram,
    labels: &["partition"],
    help: "Snapshot writes each begun transaction carried (0 for an offset-only transaction)",
};

pub(crate) const TRANSACTIONS_COMMITTED: Metric = Metric {
    name: "snapfence_transactions_committed_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Snapshot transactions committed, their input offset commit included",
};

pub(crate) const TRANSACTIONS_ABORTED: Metric = Metric {
    name: "snapfence_transactions_aborted_total",
    kind: Kind::Counter,
    labels: &["partition", "class"],
    help: "Snapshot transactions that failed after they began; class: abortable (aborted, the store goes on), fatal (the store closes), outcome_unknown (a commit went unanswered: it may have landed)",
};

pub(crate) const TRANSACTION_FENCES: Metric = Metric {
    name: "snapfence_transaction_fences_total",
    kind: Kind::Counter,
    labels: &["partition", "kind"],
    help: "Snapshot transactions refused by a fence; kind: generation (stale generation or member epoch), member (unknown or replaced member), producer_epoch (a newer producer owns the transactional id)",
};

pub(crate) const GROUP_COMMIT_QUEUED: Metric = Metric {
    name: "snapfence_group_commit_queued_writes",
    kind: Kind::Gauge,
    labels: &["partition"],
    help: "Snapshot writes queued and not yet taken into a transaction",
};

pub(crate) const GROUP_COMMIT_WAIT: Metric = Metric {
    name: "snapfence_group_commit_queue_wait_seconds",
    kind: Kind::Histogram,
    labels: &["partition"],
    help: "Time a snapshot write waited in the queue before a transaction took it",
};

// ---- the recovery read --------------------------------------------------------------------------

pub(crate) const RECOVERY_DURATION: Metric = Metric {
    name: "snapfence_recovery_duration_seconds",
    kind: Kind::Histogram,
    labels: &["partition"],
    help: "Completed recovery reads, from capturing the target to reaching it",
};

pub(crate) const RECOVERY_BYTES: Metric = Metric {
    name: "snapfence_recovery_read_bytes_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Key and value bytes of the records recovery reads folded",
};

pub(crate) const RECOVERY_KEYS: Metric = Metric {
    name: "snapfence_recovery_read_keys_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Keyed records (snapshots and tombstones) recovery reads folded",
};

pub(crate) const RECOVERY_WAITED: Metric = Metric {
    name: "snapfence_recovery_waited_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Recovery reads that began with the last stable offset below their target, so they waited for open transactions",
};

pub(crate) const RECOVERY_LSO_GAP: Metric = Metric {
    name: "snapfence_recovery_start_lso_gap",
    kind: Kind::Gauge,
    labels: &["partition"],
    help: "High watermark minus last stable offset when the latest recovery read of the partition began",
};

pub(crate) const RECOVERY_STALLS: Metric = Metric {
    name: "snapfence_recovery_stalls_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Times a recovery read made no progress for its progress interval (5 s by default), counted once per stall",
};

pub(crate) const STATE_FALLBACKS: Metric = Metric {
    name: "snapfence_state_fallbacks_total",
    kind: Kind::Counter,
    labels: &["partition", "reason"],
    help: "Acquisitions that did not use a partition's on-disk state and read the snapshot partition whole, by reason (no_checkpoint, corrupt, identity, ahead_of_log, log_start_passed, diverged, too_old)",
};

/// Counts an acquisition that read the partition whole instead of using its on-disk state.
#[cfg(feature = "disk-state")]
pub(crate) fn state_fallback(partition: i32, reason: &'static str) {
    metrics::counter!(STATE_FALLBACKS.name, "partition" => partition.to_string(), "reason" => reason)
        .increment(1);
}

pub(crate) const OUTPUTS_RESENT: Metric = Metric {
    name: "snapfence_outputs_resent_total",
    kind: Kind::Counter,
    labels: &["partition"],
    help: "Outputs a PostgreSQL store's takeover found committed in PostgreSQL but not in Kafka (the previous owner's prepared transaction was aborted) and sent again",
};

/// Counts outputs a takeover sends again (see [`OUTPUTS_RESENT`]).
#[cfg(feature = "postgres")]
pub(crate) fn outputs_resent(partition: i32, n: usize) {
    metrics::counter!(OUTPUTS_RESENT.name, "partition" => partition.to_string())
        .increment(u64::try_from(n).unwrap_or(u64::MAX));
}

// ---- the consumer -------------------------------------------------------------------------------

pub(crate) const CONSUMER_LAG: Metric = Metric {
    name: "snapfence_consumer_lag",
    kind: Kind::Gauge,
    labels: &["topic", "partition"],
    help: "Offsets between a partition reader's position and the end it may read to (the last stable offset at read_committed, the high watermark otherwise), as of its latest fetch",
};

pub(crate) const REBALANCES: Metric = Metric {
    name: "snapfence_consumer_rebalance_events_total",
    kind: Kind::Counter,
    labels: &["group", "event"],
    help: "Rebalance events handed to the listener; event: assign, revoke, lost",
};

pub(crate) const GENERATION_CHANGES: Metric = Metric {
    name: "snapfence_consumer_generation_changes_total",
    kind: Kind::Counter,
    labels: &["group"],
    help: "Times the published group metadata moved to a new generation (classic) or member epoch (KIP-848), the first join included",
};

pub(crate) const ASSIGNED_PARTITIONS: Metric = Metric {
    name: "snapfence_consumer_assigned_partitions",
    kind: Kind::Gauge,
    labels: &["group"],
    help: "Partitions the application holds: assigned, and not yet revoked or lost",
};

pub(crate) const FLOW_READY: Metric = Metric {
    name: "snapfence_flow_ready",
    kind: Kind::Gauge,
    labels: &["group"],
    help: "1 while the flow is ready: joined, and every assigned input partition recovered and caught up with the input's end as seen at its acquisition; else 0",
};

pub(crate) const FLOW_READY_PARTITIONS: Metric = Metric {
    name: "snapfence_flow_ready_partitions",
    kind: Kind::Gauge,
    labels: &["group"],
    help: "Assigned input partitions that are recovered and caught up with the input's end as seen at their acquisition",
};

pub(crate) const UNASSIGNED: Metric = Metric {
    name: "snapfence_consumer_unassigned_seconds",
    kind: Kind::Histogram,
    labels: &["group"],
    help: "Periods a member held no partition, from subscribing or losing its last one to its next assignment",
};

/// Every metric snapfence records. A metric recorded anywhere is listed here and in `docs/metrics.md`.
pub(crate) const ALL: &[Metric] = &[
    REQUEST_DURATION,
    REQUESTS_IN_FLIGHT,
    REQUEST_RETRIES,
    CONNECTIONS_OPENED,
    RECONNECTS,
    CONNECTIONS_POISONED,
    SENT_BYTES,
    RECEIVED_BYTES,
    REAUTHENTICATIONS,
    AUTHENTICATION_FAILURES,
    CONCURRENT_TRANSACTIONS_RETRIES,
    TRANSACTION_DURATION,
    TRANSACTION_WRITES,
    TRANSACTIONS_COMMITTED,
    TRANSACTIONS_ABORTED,
    TRANSACTION_FENCES,
    GROUP_COMMIT_QUEUED,
    GROUP_COMMIT_WAIT,
    RECOVERY_DURATION,
    RECOVERY_BYTES,
    RECOVERY_KEYS,
    RECOVERY_WAITED,
    RECOVERY_LSO_GAP,
    RECOVERY_STALLS,
    STATE_FALLBACKS,
    OUTPUTS_RESENT,
    CONSUMER_LAG,
    REBALANCES,
    GENERATION_CHANGES,
    ASSIGNED_PARTITIONS,
    FLOW_READY,
    FLOW_READY_PARTITIONS,
    UNASSIGNED,
];

/// Tells the installed recorder the unit and description of every metric snapfence records, so an
/// exporter can print them (Prometheus `# HELP`). Call it once, after installing the recorder.
///
/// Recording works without it; only the descriptions are missing then.
///
/// ```
/// // With no recorder installed this does nothing, like every metric snapfence records.
/// snapfence::describe_metrics();
/// ```
pub fn describe_metrics() {
    metrics::with_recorder(|recorder| {
        for m in ALL {
            let key = metrics::KeyName::from_const_str(m.name);
            let help = metrics::SharedString::const_str(m.help);
            match m.kind {
                Kind::Counter => recorder.describe_counter(key, m.unit(), help),
                Kind::Gauge => recorder.describe_gauge(key, m.unit(), help),
                Kind::Histogram => recorder.describe_histogram(key, m.unit(), help),
            }
        }
    });
}

/// The `reason` label of [`CONNECTIONS_POISONED`]; `None` for the client's own shutdown, which is not
/// a poisoning.
pub(crate) fn poison_reason(failure: &ConnectionFailure) -> Option<&'static str> {
    Some(match failure {
        ConnectionFailure::Closed => "closed",
        ConnectionFailure::ClosedMidFrame => "closed_mid_frame",
        ConnectionFailure::Io(_) => "io",
        ConnectionFailure::Frame(_) => "frame",
        ConnectionFailure::UnexpectedCorrelationId(_) => "unexpected_correlation_id",
        ConnectionFailure::RequestTimedOut(_) => "timeout",
        ConnectionFailure::TaskFailed { .. } => "task_failed",
        ConnectionFailure::Shutdown => return None,
    })
}

/// Counts one event of a label-less counter, or of a counter with one label.
pub(crate) fn count(metric: &Metric, label: Option<&'static str>) {
    debug_assert_eq!(metric.kind, Kind::Counter);
    debug_assert_eq!(metric.labels.len(), usize::from(label.is_some()));
    match (metric.labels.first(), label) {
        (Some(&key), Some(value)) => metrics::counter!(metric.name, key => value).increment(1),
        _ => metrics::counter!(metric.name).increment(1),
    }
}

/// The `class` label of [`TRANSACTIONS_ABORTED`] for a failed snapshot transaction: read off the
/// snapshot layer's own classification ([`FailureKind::aborts`], [`FailureKind::OutcomeUnknown`]), not
/// a second one. `None` is a transaction aborted for want of group metadata at its seal, which the
/// producer never saw fail.
pub(crate) fn abort_class(kind: Option<FailureKind>) -> &'static str {
    match kind {
        None => "abortable",
        Some(k) if k.aborts() => "abortable",
        Some(FailureKind::OutcomeUnknown) => "outcome_unknown",
        Some(_) => "fatal",
    }
}

/// The `kind` label of [`TRANSACTION_FENCES`], or `None` for a failure that is not a fence. Every
/// [`FailureKind`] is named, so a new one must be placed here to compile.
pub(crate) fn fence_kind(kind: FailureKind) -> Option<&'static str> {
    match kind {
        FailureKind::Fenced => Some("generation"),
        FailureKind::Evicted | FailureKind::InstanceFenced => Some("member"),
        FailureKind::ProducerFenced => Some("producer_epoch"),
        FailureKind::Fatal | FailureKind::Aborted | FailureKind::OutcomeUnknown => None,
    }
}

/// The handles one snapshot partition's group commit records into, registered when the group commit
/// is built: a transaction ends, and writes are queued and taken, many times a second.
pub(crate) struct TxnMetrics {
    partition: String,
    duration: Histogram,
    writes: Histogram,
    committed: Counter,
    queued: Gauge,
    wait: Histogram,
}

impl TxnMetrics {
    pub(crate) fn new(partition: i32) -> TxnMetrics {
        let p = partition.to_string();
        TxnMetrics {
            duration: metrics::histogram!(TRANSACTION_DURATION.name, "partition" => p.clone()),
            writes: metrics::histogram!(TRANSACTION_WRITES.name, "partition" => p.clone()),
            committed: metrics::counter!(TRANSACTIONS_COMMITTED.name, "partition" => p.clone()),
            queued: metrics::gauge!(GROUP_COMMIT_QUEUED.name, "partition" => p.clone()),
            wait: metrics::histogram!(GROUP_COMMIT_WAIT.name, "partition" => p.clone()),
            partition: p,
        }
    }

    /// A begun transaction ended after `elapsed`, carrying `writes`: committed (`Ok`), or failed with
    /// the producer's failure (`Err(Some)`) or for want of group metadata at the seal (`Err(None)`).
    pub(crate) fn ended(
        &self,
        elapsed: Duration,
        writes: usize,
        outcome: Result<(), Option<FailureKind>>,
    ) {
        self.duration.record(elapsed.as_secs_f64());
        self.writes.record(writes as f64);
        let kind = match outcome {
            Ok(()) => return self.committed.increment(1),
            Err(kind) => kind,
        };
        let p = self.partition.clone();
        metrics::counter!(TRANSACTIONS_ABORTED.name, "partition" => p, "class" => abort_class(kind))
            .increment(1);
        if let Some(fence) = kind.and_then(fence_kind) {
            let p = self.partition.clone();
            metrics::counter!(TRANSACTION_FENCES.name, "partition" => p, "kind" => fence)
                .increment(1);
        }
    }

    /// The queue now holds `depth` writes not yet in a transaction.
    pub(crate) fn queue_depth(&self, depth: usize) {
        self.queued.set(depth as f64);
    }

    /// A write waited `waited` before a transaction took it.
    pub(crate) fn waited(&self, waited: Duration) {
        self.wait.record(waited.as_secs_f64());
    }
}

/// What one recovery read of a snapshot partition saw, recorded when it starts, stalls and ends.
pub(crate) struct RecoveryMetrics {
    partition: String,
}

impl RecoveryMetrics {
    pub(crate) fn new(partition: i32) -> RecoveryMetrics {
        RecoveryMetrics {
            partition: partition.to_string(),
        }
    }

    /// The read begins towards `target` with the last stable offset at `lso` (if it could be read).
    pub(crate) fn started(&self, target: i64, lso: Option<i64>) {
        let Some(lso) = lso else { return };
        let gap = (target - lso).max(0);
        metrics::gauge!(RECOVERY_LSO_GAP.name, "partition" => self.partition.clone())
            .set(gap as f64);
        if gap > 0 {
            metrics::counter!(RECOVERY_WAITED.name, "partition" => self.partition.clone())
                .increment(1);
        }
    }

    /// The read has made no progress for a whole progress interval (once per stall).
    pub(crate) fn stalled(&self) {
        metrics::counter!(RECOVERY_STALLS.name, "partition" => self.partition.clone()).increment(1);
    }

    /// The read reached its target after `elapsed`, having folded `keys` keyed records of `bytes`.
    pub(crate) fn completed(&self, elapsed: Duration, keys: u64, bytes: u64) {
        let p = || self.partition.clone();
        metrics::histogram!(RECOVERY_DURATION.name, "partition" => p())
            .record(elapsed.as_secs_f64());
        metrics::counter!(RECOVERY_KEYS.name, "partition" => p()).increment(keys);
        metrics::counter!(RECOVERY_BYTES.name, "partition" => p()).increment(bytes);
    }
}

/// A rebalance event (`assign`, `revoke`, `lost`) of `group` was handed to the listener; the member
/// now holds `held` partitions.
pub(crate) fn rebalance_event(group: &str, event: &'static str, held: usize) {
    metrics::counter!(REBALANCES.name, "group" => group.to_owned(), "event" => event).increment(1);
    metrics::gauge!(ASSIGNED_PARTITIONS.name, "group" => group.to_owned()).set(held as f64);
}

/// A flow of `group` is now `ready` (or not), with `partitions` of its assigned partitions ready.
pub(crate) fn flow_readiness(group: &str, ready: bool, partitions: usize) {
    metrics::gauge!(FLOW_READY.name, "group" => group.to_owned()).set(if ready {
        1.0
    } else {
        0.0
    });
    metrics::gauge!(FLOW_READY_PARTITIONS.name, "group" => group.to_owned()).set(partitions as f64);
}

/// A member of `group` got partitions again after holding none for `unassigned`.
pub(crate) fn assigned_after(group: &str, unassigned: Duration) {
    metrics::histogram!(UNASSIGNED.name, "group" => group.to_owned())
        .record(unassigned.as_secs_f64());
}

/// The group metadata of `group` was published with a new generation or member epoch.
pub(crate) fn generation_changed(group: &str) {
    metrics::counter!(GENERATION_CHANGES.name, "group" => group.to_owned()).increment(1);
}

/// The lag gauges of the partitions one reader fetches, each registered on its partition's first fetch
/// answer (a reader answers many fetches a second; the labels are built once).
#[derive(Default)]
pub(crate) struct LagGauges(std::collections::HashMap<crate::net::TopicPartition, Gauge>);

impl std::fmt::Debug for LagGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl LagGauges {
    /// `tp` is `lag` offsets behind the end its reader may read to.
    pub(crate) fn set(&mut self, tp: &crate::net::TopicPartition, lag: i64) {
        self.0
            .entry(tp.clone())
            .or_insert_with(|| {
                metrics::gauge!(
                    CONSUMER_LAG.name,
                    "topic" => tp.topic.to_string(),
                    "partition" => tp.partition.to_string()
                )
            })
            .set(lag.max(0) as f64);
    }

    /// The reader stopped reading `tp`: its handle goes (the exporter keeps the last value).
    pub(crate) fn forget(&mut self, tp: &crate::net::TopicPartition) {
        self.0.remove(tp);
    }
}

/// API keys below this get a latency handle of their own; anything else shares `unknown`.
const API_KEYS: usize = 128;

/// The handles one connection records into on every request, registered when the connection starts.
pub(crate) struct ConnMetrics {
    sent: Counter,
    received: Counter,
    in_flight: Gauge,
    /// Per API key, registered on the key's first request, so an exporter lists only APIs in use.
    latency: Box<[OnceLock<Histogram>]>,
}

impl ConnMetrics {
    pub(crate) fn new() -> ConnMetrics {
        ConnMetrics {
            sent: metrics::counter!(SENT_BYTES.name),
            received: metrics::counter!(RECEIVED_BYTES.name),
            in_flight: metrics::gauge!(REQUESTS_IN_FLIGHT.name),
            latency: (0..=API_KEYS).map(|_| OnceLock::new()).collect(),
        }
    }

    pub(crate) fn sent(&self, bytes: usize) {
        self.sent.increment(bytes as u64);
    }

    pub(crate) fn received(&self, bytes: usize) {
        self.received.increment(bytes as u64);
    }

    /// Counts a request into the in-flight gauge until the returned guard drops.
    pub(crate) fn in_flight(&self) -> InFlight {
        self.in_flight.increment(1.0);
        InFlight(self.in_flight.clone())
    }

    /// Records an answered request of `api_key` that took `elapsed`.
    pub(crate) fn answered(&self, api_key: i16, elapsed: Duration) {
        let index = usize::try_from(api_key).map_or(API_KEYS, |k| k.min(API_KEYS));
        let api = if index < API_KEYS {
            crate::wire::api_name(api_key).unwrap_or("unknown")
        } else {
            "unknown"
        };
        self.latency[index]
            .get_or_init(|| metrics::histogram!(REQUEST_DURATION.name, "api" => api))
            .record(elapsed.as_secs_f64());
    }
}

/// One request counted in [`REQUESTS_IN_FLIGHT`]; dropping it takes the request out again.
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A recorder that keeps what it is told, for tests that check a metric moved.
#[cfg(test)]
pub(crate) mod recording {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };

    #[derive(Default)]
    struct Cell {
        counter: AtomicU64,
        gauge: Mutex<f64>,
        samples: Mutex<Vec<f64>>,
    }

    impl CounterFn for Cell {
        fn increment(&self, value: u64) {
            self.counter.fetch_add(value, Ordering::Relaxed);
        }
        fn absolute(&self, value: u64) {
            self.counter.fetch_max(value, Ordering::Relaxed);
        }
    }

    impl GaugeFn for Cell {
        fn increment(&self, value: f64) {
            *self.gauge.lock().unwrap() += value;
        }
        fn decrement(&self, value: f64) {
            *self.gauge.lock().unwrap() -= value;
        }
        fn set(&self, value: f64) {
            *self.gauge.lock().unwrap() = value;
        }
    }

    impl HistogramFn for Cell {
        fn record(&self, value: f64) {
            self.samples.lock().unwrap().push(value);
        }
    }

    /// Install it for one test with [`Recording::run`].
    #[derive(Default)]
    pub(crate) struct Recording {
        cells: Mutex<HashMap<Key, Arc<Cell>>>,
    }

    impl Recording {
        fn cell(&self, key: &Key) -> Arc<Cell> {
            self.cells
                .lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .clone()
        }

        fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<Arc<Cell>> {
            let cells = self.cells.lock().unwrap();
            cells
                .iter()
                .find(|(key, _)| {
                    key.name() == name
                        && key.labels().count() == labels.len()
                        && key.labels().all(|l| labels.contains(&(l.key(), l.value())))
                })
                .map(|(_, c)| c.clone())
        }

        /// Runs `test` on a current-thread runtime with this recorder installed for the thread, so every
        /// task the test spawns (connection readers and writers too) records here and nowhere else.
        pub(crate) fn run<F: std::future::Future>(&self, test: F) -> F::Output {
            metrics::with_local_recorder(self, || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(test)
            })
        }

        pub(crate) fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
            self.find(name, labels)
                .map_or(0, |c| c.counter.load(Ordering::Relaxed))
        }

        pub(crate) fn gauge(&self, name: &str) -> f64 {
            self.gauge_at(name, &[])
        }

        pub(crate) fn gauge_at(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
            self.find(name, labels)
                .map_or(0.0, |c| *c.gauge.lock().unwrap())
        }

        pub(crate) fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
            self.find(name, labels)
                .map_or_else(Vec::new, |c| c.samples.lock().unwrap().clone())
        }
    }

    impl Recorder for Recording {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(self.cell(key))
        }

        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(self.cell(key))
        }

        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(self.cell(key))
        }
    }
}

/// A tracing layer that keeps every event with the fields of the spans it happened in, for tests that
/// check a log line is printed (and in which span).
///
/// It is installed once as the test binary's global subscriber and keeps what happens on a thread only
/// while a [`capture`] runs there. Why not a scoped subscriber per test (`with_default`): tracing caches
/// per call site whether anyone listens, and a call site first reached on another test's thread while no
/// scoped subscriber exists yet can be cached as "nobody" just as a capture starts, and then a line the
/// capture expects is never emitted (seen with two capturing tests running in parallel). With a global
/// subscriber every call site is always listened to.
#[cfg(test)]
pub(crate) mod capture {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, Once};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    /// Field name to its value as `Debug` prints it (strings without quotes).
    pub(crate) type Fields = BTreeMap<String, String>;

    #[derive(Default)]
    struct Visitor(Fields);

    impl Visit for Visitor {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }

    /// One captured event.
    #[derive(Debug, Clone)]
    pub(crate) struct Line {
        pub level: Level,
        /// The event's own fields; the text is under `message`.
        pub fields: Fields,
        /// The spans it happened in, innermost first: name and fields as last recorded.
        pub spans: Vec<(&'static str, Fields)>,
    }

    impl Line {
        pub(crate) fn message(&self) -> &str {
            self.fields.get("message").map_or("", String::as_str)
        }

        pub(crate) fn field(&self, name: &str) -> Option<&str> {
            self.fields.get(name).map(String::as_str)
        }

        /// The fields of the innermost span called `name` around the event.
        pub(crate) fn span(&self, name: &str) -> Option<&Fields> {
            self.spans.iter().find(|s| s.0 == name).map(|s| &s.1)
        }
    }

    /// What a test captured.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<Line>>>);

    impl Captured {
        pub(crate) fn lines(&self) -> Vec<Line> {
            self.0.lock().unwrap().clone()
        }

        /// The lines whose message contains `text`.
        pub(crate) fn containing(&self, text: &str) -> Vec<Line> {
            self.lines()
                .into_iter()
                .filter(|l| l.message().contains(text))
                .collect()
        }
    }

    struct SpanFields(Fields);

    thread_local! {
        /// Where this thread's events go while a capture runs on it.
        static ACTIVE: RefCell<Option<Captured>> = const { RefCell::new(None) };
    }

    struct Capture;

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut v = Visitor::default();
            attrs.record(&mut v);
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(SpanFields(v.0));
            }
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            let Some(span) = ctx.span(id) else { return };
            let mut ext = span.extensions_mut();
            if let Some(fields) = ext.get_mut::<SpanFields>() {
                let mut v = Visitor(std::mem::take(&mut fields.0));
                values.record(&mut v);
                fields.0 = v.0;
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let Some(captured) = ACTIVE.with(|a| a.borrow().clone()) else {
                return;
            };
            let mut v = Visitor::default();
            event.record(&mut v);
            let spans = ctx
                .event_scope(event)
                .map(|scope| {
                    scope
                        .map(|span| {
                            let fields = span
                                .extensions()
                                .get::<SpanFields>()
                                .map(|f| f.0.clone())
                                .unwrap_or_default();
                            (span.name(), fields)
                        })
                        .collect()
                })
                .unwrap_or_default();
            captured.0.lock().unwrap().push(Line {
                level: *event.metadata().level(),
                fields: v.0,
                spans,
            });
        }
    }

    /// Runs `f` with every event of this thread captured (all levels), and returns what it printed.
    /// Tasks `f` runs on a current-thread runtime are on this thread too.
    pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Captured) {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::registry().with(Capture);
            tracing::subscriber::set_global_default(subscriber)
                .expect("nothing else in the test binary installs a global subscriber");
        });
        let captured = Captured::default();
        struct Reset;
        impl Drop for Reset {
            fn drop(&mut self) {
                ACTIVE.with(|a| *a.borrow_mut() = None);
            }
        }
        ACTIVE.with(|a| *a.borrow_mut() = Some(captured.clone()));
        let _reset = Reset;
        (f(), captured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The docs table and the code's list of metrics say the same thing, both ways: a metric added in
    /// code without a docs row (or a row left behind for a removed metric) fails here.
    #[test]
    fn docs_table_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
        let text = std::fs::read_to_string(path).expect("docs/metrics.md");
        let mut rows = Vec::new();
        for line in text.lines().filter(|l| l.trim_start().starts_with('|')) {
            let cells: Vec<&str> = line
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            let Some(name) = cells.first().and_then(|c| c.strip_prefix("`snapfence_")) else {
                continue;
            };
            assert_eq!(cells.len(), 4, "name | kind | labels | meaning: {line}");
            let name = format!("snapfence_{}", name.trim_end_matches('`'));
            let labels: Vec<String> = cells[2]
                .split(',')
                .map(|l| l.trim().trim_matches('`').to_owned())
                .filter(|l| !l.is_empty() && l != "-")
                .collect();
            rows.push((name, cells[1].to_owned(), labels, cells[3].to_owned()));
        }
        for m in ALL {
            let row = rows
                .iter()
                .find(|r| r.0 == m.name)
                .unwrap_or_else(|| panic!("{} is recorded but not in docs/metrics.md", m.name));
            assert_eq!(row.1, m.kind.name(), "{}: kind", m.name);
            assert_eq!(row.2, m.labels, "{}: labels", m.name);
            assert_eq!(row.3, m.help, "{}: meaning", m.name);
        }
        for row in &rows {
            assert!(
                ALL.iter().any(|m| m.name == row.0),
                "docs/metrics.md lists {}, which the code does not record",
                row.0
            );
        }
        assert_eq!(rows.len(), ALL.len(), "a metric listed twice");
    }

    /// Names follow one convention, so a dashboard author can guess them.
    #[test]
    fn names_carry_the_prefix_and_their_unit() {
        for m in ALL {
            assert!(m.name.starts_with("snapfence_"), "{}", m.name);
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                m.name
            );
            if m.kind == Kind::Histogram {
                // A histogram of a count names what it counts (`_writes`), as a unit.
                assert!(
                    m.name.ends_with("_seconds")
                        || m.name.ends_with("_bytes")
                        || m.name.ends_with("_writes"),
                    "{}",
                    m.name
                );
            }
        }
    }

    /// API names come from the protocol's own spelling and cost no allocation.
    #[test]
    fn api_names_are_the_protocol_names() {
        assert_eq!(crate::wire::api_name(0), Some("Produce"));
        assert_eq!(crate::wire::api_name(26), Some("EndTxn"));
        assert_eq!(crate::wire::api_name(18), Some("ApiVersions"));
        assert_eq!(crate::wire::api_name(-1), None);
    }
}
