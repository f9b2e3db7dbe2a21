//! What snapfence's metrics and spans say about real transactions on a real broker: a fenced write is
//! counted under the fence of its kind and the abort of its class, a committed one as a commit, a
//! recovery read under its keys and bytes, a member's first join as one assignment and one generation,
//! and each transaction's span names its producer.
//!
//! The test runs on a current-thread runtime with a recorder installed for its thread only
//! (`metrics::with_local_recorder`), so every task it spawns records into that recorder and no other
//! test of this binary, running in parallel, can move its numbers.
//!
//! # References
//! - `docs/metrics.md` (the names and their label values)

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use protocol_tests::{cluster, unique, ClusterSpec};
use snapfence::consumer::{GroupConfig, GroupConsumer, GroupConsumerConfig, OffsetReset};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::TopicPartition;
use snapfence::snapshot::{
    recover, Assignment, MetadataSource, PartitionLog, RecoveryConfig, SnapshotConfig,
    SnapshotError, SnapshotStore,
};
use snapfence::GroupMetadata;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

// ---- a recorder that keeps what it is told ------------------------------------------------------

#[derive(Default)]
struct Cell {
    counter: AtomicU64,
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
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, _: f64) {}
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        self.samples.lock().unwrap().push(value);
    }
}

#[derive(Default)]
struct Recording {
    cells: Mutex<HashMap<Key, Arc<Cell>>>,
}

impl Recording {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap();
        cells.entry(key.clone()).or_default().clone()
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

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.find(name, labels)
            .map_or(0, |c| c.counter.load(Ordering::Relaxed))
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.find(name, labels)
            .map_or(0, |c| c.samples.lock().unwrap().len())
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

// ---- a layer that keeps the fields of every snapshot_transaction span ---------------------------

type Fields = BTreeMap<String, String>;

#[derive(Default)]
struct Visitor(Fields);

impl tracing::field::Visit for Visitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Each transaction span's fields as they stood when it closed.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Fields>>>);

struct Pending(Fields);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        if attrs.metadata().name() != "snapshot_transaction" {
            return;
        }
        let mut v = Visitor::default();
        attrs.record(&mut v);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Pending(v.0));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(p) = ext.get_mut::<Pending>() {
            let mut v = Visitor(std::mem::take(&mut p.0));
            values.record(&mut v);
            p.0 = v.0;
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let pending = span.extensions_mut().remove::<Pending>();
        if let Some(p) = pending {
            self.0.lock().unwrap().push(p.0);
        }
    }
}

// ---- the test -----------------------------------------------------------------------------------

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn fixed(metadata: GroupMetadata) -> Arc<dyn MetadataSource> {
    Arc::new(move || Some(metadata.clone()))
}

fn kind(e: &SnapshotError) -> String {
    match e {
        SnapshotError::Transaction { failure, .. } => format!("{:?}", failure.kind),
        other => format!("not a transaction failure: {other}"),
    }
}

/// A stale generation, an unknown member and a newer producer on the transactional id each fence a
/// write, and each is counted under its own fence kind and its abort class; the live write is counted
/// as a commit, the recovery read that finds it as one key of its bytes, and every transaction ran in a
/// span naming its transactional id, producer id and epoch, generation and partition.
#[test]
fn fences_aborts_commits_and_recovery_are_counted() {
    let rec = Recording::default();
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let prefix = unique("txn");
    let group = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&rec, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(scenario(&prefix))
        })
    });

    let p = [("partition", "0")];
    let fence = |k| {
        rec.counter(
            "snapfence_transaction_fences_total",
            &[("partition", "0"), ("kind", k)],
        )
    };
    let aborted = |c| {
        rec.counter(
            "snapfence_transactions_aborted_total",
            &[("partition", "0"), ("class", c)],
        )
    };
    assert_eq!(fence("generation"), 1, "the stale generation");
    assert_eq!(fence("member"), 1, "the unknown member");
    assert_eq!(
        fence("producer_epoch"),
        1,
        "the owner a newer producer replaced"
    );
    assert_eq!(aborted("abortable"), 2, "the two group fences are aborted");
    assert_eq!(aborted("fatal"), 1, "a fenced producer closes its store");
    assert_eq!(aborted("outcome_unknown"), 0);
    assert_eq!(rec.counter("snapfence_transactions_committed_total", &p), 1);
    assert_eq!(rec.samples("snapfence_transaction_duration_seconds", &p), 4);
    assert_eq!(rec.counter("snapfence_recovery_read_keys_total", &p), 1);
    assert_eq!(
        rec.counter("snapfence_recovery_read_bytes_total", &p),
        (b"k".len() + b"live".len()) as u64
    );
    assert_eq!(rec.samples("snapfence_recovery_duration_seconds", &p), 1);

    // The member that joined once: one assignment handed to its (empty) listener, one generation.
    let event = |e| {
        rec.counter(
            "snapfence_consumer_rebalance_events_total",
            &[("group", group.as_str()), ("event", e)],
        )
    };
    assert_eq!((event("assign"), event("revoke"), event("lost")), (1, 0, 0));
    assert_eq!(
        rec.counter(
            "snapfence_consumer_generation_changes_total",
            &[("group", group.as_str())]
        ),
        1
    );

    let spans = spans.0.lock().unwrap();
    assert_eq!(spans.len(), 4, "one span per transaction: {spans:?}");
    for s in spans.iter() {
        assert_eq!(s.get("partition").map(String::as_str), Some("0"), "{s:?}");
        assert_eq!(
            s.get("transactional_id").map(String::as_str),
            Some(format!("{prefix}-0").as_str()),
            "{s:?}"
        );
        for field in ["producer_id", "producer_epoch", "generation"] {
            let value = s
                .get(field)
                .unwrap_or_else(|| panic!("{field} missing: {s:?}"));
            assert!(value.parse::<i64>().is_ok_and(|v| v >= 0), "{field}: {s:?}");
        }
    }
}

/// Runs the story; returns the consumer group's name.
async fn scenario(prefix: &str) -> String {
    let kafka = cluster(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .expect("connect");
    let input = unique("input");
    let snapshots = unique("snapshots");
    snapfence::admin::create_topic(&client, &input, 1, -1, &[])
        .await
        .unwrap();
    snapfence::admin::create_topic(&client, &snapshots, 1, -1, &[("cleanup.policy", "compact")])
        .await
        .unwrap();
    let group = unique("group");
    let mut consumer_config = GroupConsumerConfig::new(GroupConfig::new(&group));
    consumer_config.reader.reset = OffsetReset::Earliest;
    let mut member = GroupConsumer::subscribe(client.clone(), consumer_config, [input.clone()], ())
        .await
        .unwrap();
    let handle = member.group_metadata();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.current().is_none() {
        assert!(Instant::now() < deadline, "the member never joined");
        member.poll(Duration::from_millis(200)).await.unwrap();
    }
    let live = handle.current().unwrap();
    let mut config = SnapshotConfig::new(&snapshots, prefix);
    config.recovery_stall_timeout = Some(Duration::from_secs(30));
    let assignment = |metadata: Arc<dyn MetadataSource>| Assignment {
        input: TopicPartition::new(input.as_str(), 0),
        assigned_offset: 0,
        metadata,
    };
    let acquire = |metadata: Arc<dyn MetadataSource>| {
        SnapshotStore::acquire(client.clone(), config.clone(), assignment(metadata))
    };

    // A stale generation: the group coordinator refuses the offset commit.
    let stale =
        GroupMetadata::new(&group, live.generation_id() + 7, live.member_id(), None).unwrap();
    let store = acquire(fixed(stale)).await.unwrap();
    let e = store.write(b("k"), Some(b("stale"))).await.unwrap_err();
    assert_eq!(kind(&e), "Fenced", "{e}");
    store.close().await;

    // A member the coordinator does not know.
    let unknown = GroupMetadata::new(&group, live.generation_id(), "not-a-member", None).unwrap();
    let store = acquire(fixed(unknown)).await.unwrap();
    let e = store.write(b("k"), Some(b("unknown"))).await.unwrap_err();
    assert_eq!(kind(&e), "Evicted", "{e}");
    store.close().await;

    // The live member writes; then a newer owner's producer fences this one.
    let store = acquire(Arc::new(handle.clone())).await.unwrap();
    store.write(b("k"), Some(b("live"))).await.unwrap();
    let newer = acquire(Arc::new(handle.clone())).await.unwrap();
    let e = store
        .write(b("k"), Some(b("superseded")))
        .await
        .unwrap_err();
    assert_eq!(kind(&e), "ProducerFenced", "{e}");
    store.close().await;
    newer.close().await;

    let mut log = PartitionLog::new(client.clone(), &snapshots, 0);
    let cfg = RecoveryConfig {
        stall_timeout: Some(Duration::from_secs(30)),
        ..RecoveryConfig::default()
    };
    let (state, _) = recover(&mut log, 0, &cfg).await.unwrap();
    assert_eq!(state.get(b("k")), Some(&*b("live")));
    drop(member);
    group
}
