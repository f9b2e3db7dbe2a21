//! Timers on stream time on a real broker: a day of timestamped input folded live (events arriving while
//! the flow runs) and the same day folded again as a backfill through a crash fire the same timers at
//! the same points, and a new owner resumes the stream time from the committed offset's metadata (on the
//! snapshot topic and on the PostgreSQL store, whose fencing row records it too).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::campaign::read_topic;
use protocol_tests::{cluster_and_postgres, unique, ClusterSpec};
use snapfence::consumer::{
    committed_offsets_and_metadata, GroupConfig, GroupConsumerConfig, OffsetReset,
};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::records::{IsolationLevel, Record};
use snapfence::snapshot::postgres::PgStoreConfig;
use snapfence::snapshot::{
    BoxError, Change, Flow, FlowConfig, Fold, Outputs, SnapshotConfig, TimerClock,
};

/// An hour of stream time.
const HOUR: i64 = 3_600_000;
/// Midnight, 2026-12-01, UTC.
const DAY: i64 = 1_796_083_200_000;

/// Counts a key's events; a key idle for an hour of stream time expires, and its expiry is an output:
/// `key count now` on the output topic.
struct Sessions {
    output: String,
}

impl Fold for Sessions {
    type State = (u64, i64);
    fn fold(
        &self,
        _key: &Bytes,
        s: &mut Option<(u64, i64)>,
        e: &Record,
        _out: &mut Outputs,
    ) -> Change {
        let (count, seen) = s.get_or_insert((0, 0));
        *count += 1;
        *seen = (*seen).max(e.timestamp);
        Change::Update
    }
    fn encode(&self, s: &(u64, i64)) -> Bytes {
        format!("{} {}", s.0, s.1).into()
    }
    fn decode(&self, b: &[u8]) -> Result<(u64, i64), BoxError> {
        let text = std::str::from_utf8(b)?;
        let (c, s) = text.split_once(' ').ok_or("two numbers")?;
        Ok((c.parse()?, s.parse()?))
    }
    fn deadline(&self, _key: &Bytes, s: &(u64, i64)) -> Option<i64> {
        Some(s.1 + HOUR)
    }
    fn on_deadline(&self, key: &Bytes, s: &mut (u64, i64), now: i64, out: &mut Outputs) -> Change {
        let line = format!("{} {} {now}", String::from_utf8_lossy(key), s.0);
        out.send(
            ProducerRecord::new(self.output.as_str(), Some(Bytes::from(line))).key(key.clone()),
        );
        Change::Delete
    }
    fn timer_clock(&self) -> TimerClock {
        TimerClock::Stream
    }
}

/// A day of events on one partition: 20 keys, each active in bursts with idle gaps of up to three hours,
/// timestamps mostly forward with a few late ones; the same day every run (a fixed generator).
fn day() -> Vec<(String, i64)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15) % n
    };
    let mut t = DAY;
    let mut events = Vec::new();
    while t < DAY + 24 * HOUR {
        let key = format!("user-{}", next(20));
        // Late by up to 20 minutes now and then.
        let ts = if next(10) == 0 {
            t - next(20 * 60_000) as i64
        } else {
            t
        };
        events.push((key, ts));
        // Quiet stretches of up to 90 minutes make the hour-long timers fire.
        t += if next(50) == 0 {
            next(90 * 60_000) as i64
        } else {
            next(120_000) as i64
        };
    }
    events
}

struct Run {
    client: Client,
    input: String,
    snapshots: String,
    output: String,
    group: String,
    prefix: String,
    postgres: Option<PgStoreConfig>,
}

impl Run {
    async fn new(client: &Client, postgres: Option<PgStoreConfig>) -> Run {
        let run = Run {
            postgres,
            client: client.clone(),
            input: unique("day"),
            snapshots: unique("day-snap"),
            output: unique("expired"),
            group: unique("day-group"),
            prefix: unique("day-txn"),
        };
        snapfence::admin::create_topic(client, &run.input, 1, -1, &[])
            .await
            .unwrap();
        snapfence::admin::create_topic(
            client,
            &run.snapshots,
            1,
            -1,
            &[("cleanup.policy", "compact")],
        )
        .await
        .unwrap();
        snapfence::admin::create_topic(client, &run.output, 1, -1, &[])
            .await
            .unwrap();
        run
    }

    /// Produces `events` in batches of 20 (each acknowledged before the next is sent), so a small fetch
    /// returns part of the day: a fetch hands out whole batches, however large.
    async fn produce(&self, producer: &Producer, events: &[(String, i64)]) {
        for chunk in events.chunks(20) {
            let mut deliveries = Vec::new();
            for (key, ts) in chunk {
                let r = ProducerRecord::new(self.input.as_str(), Some(Bytes::from("e")))
                    .key(key.clone())
                    .timestamp(*ts);
                deliveries.push(producer.send(r).await.unwrap());
            }
            for d in deliveries {
                d.await.unwrap();
            }
        }
    }

    async fn flow(&self) -> Flow<Sessions> {
        let mut group = GroupConfig::new(&self.group);
        group.session_timeout = Duration::from_secs(6);
        group.heartbeat_interval = Duration::from_millis(500);
        group.max_poll_interval = Duration::from_secs(60);
        let mut consumer = GroupConsumerConfig::new(group);
        consumer.reader.reset = OffsetReset::Earliest;
        // Small fetches: the day is folded over many polls, so commits land in the middle of it.
        consumer.reader.partition_max_bytes = 8 * 1024;
        consumer.reader.max_bytes = 8 * 1024;
        let mut config = FlowConfig::new(
            consumer,
            &self.input,
            SnapshotConfig::new(&self.snapshots, &self.prefix),
        );
        config.postgres = self.postgres.clone();
        let fold = Sessions {
            output: self.output.clone(),
        };
        Flow::start(self.client.clone(), config, fold)
            .await
            .unwrap()
    }

    /// Polls until the flow's position reaches `end`.
    async fn fold_to(&self, flow: &mut Flow<Sessions>, end: i64) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while flow.position(0).is_none_or(|p| p < end) {
            flow.poll_once(Duration::from_millis(100)).await.unwrap();
            assert!(
                Instant::now() < deadline,
                "never reached {end}: {:?}",
                flow.position(0)
            );
        }
    }

    /// The expiries committed to the output topic, as lines.
    async fn expiries(&self) -> BTreeSet<String> {
        let records = read_topic(&self.client, &self.output, 1, IsolationLevel::ReadCommitted)
            .await
            .unwrap();
        let lines: Vec<String> = records
            .iter()
            .map(|(_, v, _)| String::from_utf8_lossy(v.as_deref().unwrap_or_default()).into_owned())
            .collect();
        let set: BTreeSet<String> = lines.iter().cloned().collect();
        assert_eq!(set.len(), lines.len(), "every expiry once: {lines:?}");
        set
    }

    /// The group's committed offset and the stream time its metadata carries.
    async fn committed(&self) -> (i64, Option<i64>) {
        let tp = TopicPartition::new(self.input.as_str(), 0);
        let committed =
            committed_offsets_and_metadata(&self.client, &self.group, std::slice::from_ref(&tp))
                .await
                .unwrap();
        let (offset, metadata) = committed[&tp].clone().expect("committed");
        // `snapfence st=<ms>` on the topic store, `snapfence-flush <id> st=<ms>` on PostgreSQL.
        let st = metadata.and_then(|m| {
            m.split_whitespace()
                .find_map(|w| w.strip_prefix("st="))?
                .parse()
                .ok()
        });
        (offset, st)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_replayed_through_a_crash_fires_the_timers_the_live_run_fired() {
    a_day_replayed(false).await;
}

/// The same on the PostgreSQL store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_replayed_through_a_crash_on_postgres_fires_the_timers_the_live_run_fired() {
    a_day_replayed(true).await;
}

async fn a_day_replayed(on_pg: bool) {
    let (kafka, pg) = cluster_and_postgres(ClusterSpec::kafka4(), on_pg).await;
    let store = pg.as_ref().map(|pg| {
        let mut c = PgStoreConfig::new(pg.url());
        c.table_prefix = "sf_stream_time".into();
        c
    });
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let events = day();
    let n = events.len() as i64;
    eprintln!("a day of {n} events");

    // Live: the day arrives in 12 slices while the flow folds, persists and commits between them.
    let live = Run::new(&client, store.clone()).await;
    let mut flow = live.flow().await;
    for (i, slice) in events.chunks(events.len().div_ceil(12)).enumerate() {
        live.produce(&producer, slice).await;
        let end = events
            .chunks(events.len().div_ceil(12))
            .take(i + 1)
            .map(<[_]>::len)
            .sum::<usize>();
        live.fold_to(&mut flow, end as i64).await;
        flow.persist().await.unwrap();
        flow.commit().await.unwrap();
    }
    let live_st = flow
        .handle()
        .stream_time(0)
        .expect("the day has timestamps");
    flow.close().await.unwrap();
    let expected = live.expiries().await;
    assert!(
        expected.len() > 10,
        "the day's quiet stretches expire keys: {expected:?}"
    );
    assert_eq!(
        live.committed().await,
        (n, Some(live_st)),
        "the last commit carries the stream time"
    );
    if let Some(pg) = &pg {
        // The fencing row records it too: a takeover after a flush whose Kafka side was aborted
        // starts from the row's offset with the row's stream time.
        let (db, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let row = db
            .query_one(
                "SELECT committed_offset, stream_time FROM sf_stream_time_owners \
                 WHERE prefix = $1 AND partition = 0",
                &[&live.prefix],
            )
            .await
            .unwrap();
        let recorded: (Option<i64>, Option<i64>) = (row.get(0), row.get(1));
        assert_eq!(recorded, (Some(n), Some(live_st)), "the fencing row");
    }

    // Backfill: the whole day at once; the first owner folds a third, commits, folds on to two thirds
    // without committing, and crashes (dropped: nothing closed, its open work lost).
    let backfill = Run::new(&client, store.clone()).await;
    backfill.produce(&producer, &events).await;
    let mut first = backfill.flow().await;
    backfill.fold_to(&mut first, n / 3).await;
    first.persist().await.unwrap();
    first.commit().await.unwrap();
    backfill.fold_to(&mut first, 2 * n / 3).await;
    first.persist().await.unwrap();
    // The commit carries the stream time just before its offset: the latest timestamp before it.
    let (offset, resumed) = backfill.committed().await;
    let before = events[..offset as usize].iter().map(|(_, ts)| *ts).max();
    assert!(
        offset > 0 && offset < n,
        "a commit in the middle of the day: {offset}"
    );
    assert_eq!(
        resumed, before,
        "the stream time just before offset {offset}"
    );
    assert!(resumed < Some(live_st));
    let at_crash = first.position(0).unwrap();
    assert!(
        at_crash < n,
        "the first owner crashed before the end of the day: {at_crash}"
    );
    drop(first);

    // The next owner resumes from the committed offset and its stream time, and folds the rest.
    let mut second = backfill.flow().await;
    backfill.fold_to(&mut second, n).await;
    second.persist().await.unwrap();
    second.commit().await.unwrap();
    assert_eq!(second.handle().stream_time(0), Some(live_st));
    second.close().await.unwrap();
    let got = backfill.expiries().await;
    let missing: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the backfill fired other timers than the live run: missing {missing:?}, extra {extra:?}"
    );
    eprintln!("{} expiries, the same in both runs", got.len());
}
