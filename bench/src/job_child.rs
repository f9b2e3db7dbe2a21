//! `snapfence-bench job-child`: snapfence's side of `snapfence-bench job` (job.rs), one group member in a
//! process of its own so that the runner reads this process's CPU time and peak resident set alone.
//!
//! ```text
//! snapfence-bench job-child BOOTSTRAP INPUT GROUP SNAPSHOTS PREFIX SESSION_MS HEARTBEAT_MS OUTPUT|-
//! ```
//!
//! A per-key count ([`Count`], state a `u64`) in a [`Flow`] in the fenced mode
//! ([`PersistenceMode::Transactional`], the default): every snapshot wave is a transaction per partition
//! with the group's offset commit in it. Persist and commit every second, as Kafka Streams'
//! `commit.interval.ms` 1000 in StreamsJob.java. The loop is [`Flow::run`]'s (persist and commit between
//! polls when due), written out so that it can print `HOLD p,p,...` whenever the set of held partitions
//! changes, which the runner waits for before it kills a member in the takeover row. It runs until it is
//! killed, or until its stdin closes: the runner holds it open, so a runner that dies takes it along.
//!
//! With an OUTPUT topic (the `--output` variant) the fold also emits one record per event to it
//! ([`Outputs`]): in the fenced mode each key's outputs are produced in the transaction that persists its
//! snapshot, so they become visible to a read_committed reader at the persist interval, exactly once.

use std::time::Duration;

use bytes::Bytes;
use snapfence::consumer::{GroupConfig, GroupConsumerConfig};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::ProducerRecord;
use snapfence::records::Record;
use snapfence::snapshot::{
    BoxError, Change, Flow, FlowConfig, Fold, MissingSnapshotTopic, Outputs, PersistenceMode,
    SnapshotConfig,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the child was asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    bootstrap: String,
    input: String,
    group: String,
    snapshots: String,
    prefix: String,
    session: Duration,
    heartbeat: Duration,
    /// Persist and commit interval, both: Streams' `commit.interval.ms` in this benchmark.
    interval: Duration,
    /// The output topic of the `--output` variant.
    output: Option<String>,
}

/// Parses `BOOTSTRAP INPUT GROUP SNAPSHOTS PREFIX SESSION_MS HEARTBEAT_MS INTERVAL_MS OUTPUT|-`.
fn parse(args: &[String]) -> Result<Args, String> {
    let [bootstrap, input, group, snapshots, prefix, session_ms, heartbeat_ms, interval_ms, output] =
        args
    else {
        return Err(
            "usage: snapfence-bench job-child BOOTSTRAP INPUT GROUP SNAPSHOTS PREFIX SESSION_MS HEARTBEAT_MS INTERVAL_MS OUTPUT|-"
                .into(),
        );
    };
    let interval_ms: u64 = interval_ms
        .parse()
        .map_err(|_| format!("INTERVAL_MS is not a number: {interval_ms}"))?;
    let session_ms: u64 = session_ms
        .parse()
        .map_err(|_| format!("SESSION_MS is not a number: {session_ms}"))?;
    let heartbeat_ms: u64 = heartbeat_ms
        .parse()
        .map_err(|_| format!("HEARTBEAT_MS is not a number: {heartbeat_ms}"))?;
    Ok(Args {
        bootstrap: bootstrap.clone(),
        input: input.clone(),
        group: group.clone(),
        snapshots: snapshots.clone(),
        prefix: prefix.clone(),
        session: Duration::from_millis(session_ms),
        heartbeat: Duration::from_millis(heartbeat_ms),
        interval: Duration::from_millis(interval_ms),
        output: (output != "-").then(|| output.clone()),
    })
}

/// The per-key count: one `u64` per key, 8 bytes big-endian in its snapshot.
#[derive(Debug, Clone, Default)]
pub struct Count {
    /// The `--output` variant's topic: one record per event, value [`output_value`].
    pub output: Option<String>,
}

impl Fold for Count {
    type State = u64;

    fn fold(
        &self,
        key: &Bytes,
        count: &mut Option<u64>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        let count = count.get_or_insert(0);
        *count += 1;
        if let Some(topic) = &self.output {
            let value = output_value(event, *count);
            out.send(ProducerRecord::new(topic.as_str(), Some(value)).key(key.clone()));
        }
        Change::Update
    }

    fn encode(&self, count: &u64) -> Bytes {
        Bytes::copy_from_slice(&count.to_be_bytes())
    }

    fn decode(&self, bytes: &[u8]) -> Result<u64, BoxError> {
        Ok(u64::from_be_bytes(
            bytes.try_into().map_err(|_| "a count is 8 bytes")?,
        ))
    }
}

/// The output record's value for `event` after it made its key's count `count`: the event's timestamp,
/// its offset and the count, 8 bytes big-endian each, as StreamsJob.java writes it (the runner reads the
/// first 8 for the latency).
pub fn output_value(event: &Record, count: u64) -> Bytes {
    let mut v = Vec::with_capacity(24);
    v.extend_from_slice(&event.timestamp.to_be_bytes());
    v.extend_from_slice(&event.offset.to_be_bytes());
    v.extend_from_slice(&count.to_be_bytes());
    Bytes::from(v)
}

/// Runs the member until it fails or is killed (or its stdin closes); the exit status: 1 on an error, 2
/// on bad arguments.
pub fn main(args: &[String]) -> i32 {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    std::thread::spawn(|| {
        // EOF (or an error) on stdin: the runner is gone.
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return 1;
        }
    };
    // In a task, as an application runs its flow (see `peer` in main.rs for why that matters).
    let result = runtime.block_on(async {
        tokio::spawn(member(args))
            .await
            .unwrap_or_else(|e| Err(format!("the member task failed: {e}").into()))
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ERROR {e}");
            1
        }
    }
}

/// The flow's settings: `args.session` and `args.heartbeat` as the classic session timeout and heartbeat
/// interval, the snapshot topic created on
/// start (as Streams creates its changelog), persist and commit every `args.interval`.
fn config(args: &Args) -> FlowConfig {
    let mut group = GroupConfig::new(args.group.as_str());
    group.session_timeout = args.session;
    group.heartbeat_interval = args.heartbeat;
    let consumer = GroupConsumerConfig::new(group);
    let snapshots = SnapshotConfig::new(args.snapshots.as_str(), args.prefix.as_str());
    let mut c = FlowConfig::new(consumer, args.input.as_str(), snapshots);
    c.mode = PersistenceMode::Transactional;
    c.missing_snapshot_topic = MissingSnapshotTopic::Create {
        replication_factor: None,
    };
    c.persist_every = args.interval;
    c.commit_offsets_interval = args.interval;
    c
}

/// One member: [`Flow::run`]'s loop with a `HOLD` line per change of the held partitions.
async fn member(args: Args) -> Result<(), Error> {
    let client = Client::connect(ClientConfig::new(args.bootstrap.as_str())).await?;
    let mut flow = Flow::start(
        client,
        config(&args),
        Count {
            output: args.output.clone(),
        },
    )
    .await?;
    let mut held: Option<Vec<i32>> = None;
    let mut next_commit = tokio::time::Instant::now() + args.interval;
    loop {
        let partitions = flow.partitions();
        if held.as_ref() != Some(&partitions) {
            let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
            println!("HOLD {}", list.join(","));
            held = Some(partitions);
        }
        let now = tokio::time::Instant::now();
        if now >= next_commit {
            next_commit = now + args.interval;
            flow.persist().await?;
            flow.commit().await?;
        }
        let wait = next_commit
            .saturating_duration_since(tokio::time::Instant::now())
            .clamp(Duration::from_millis(1), Duration::from_millis(200));
        flow.poll_once(wait).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse_and_the_count_round_trips() {
        let a: Vec<String> = "b:9092 in g snaps pre 10000 1000 250 -"
            .split(' ')
            .map(String::from)
            .collect();
        let args = parse(&a).unwrap();
        assert_eq!(args.session, Duration::from_secs(10));
        assert_eq!(args.heartbeat, Duration::from_secs(1));
        assert_eq!(args.interval, Duration::from_millis(250));
        assert_eq!(args.output, None);
        assert!(parse(&a[..8]).is_err());
        let c = Count::default();
        let mut state = None;
        let event = Record {
            offset: 7,
            timestamp: 1_000,
            timestamp_type: snapfence::records::TimestampType::CreateTime,
            key: None,
            value: None,
            headers: Vec::new(),
        };
        let mut out = Outputs::default();
        assert_eq!(
            c.fold(&Bytes::new(), &mut state, &event, &mut out),
            Change::Update
        );
        assert_eq!(
            c.fold(&Bytes::new(), &mut state, &event, &mut out),
            Change::Update
        );
        assert_eq!(state, Some(2));
        assert_eq!(out.len(), 0, "no output topic, no outputs");
        let c = Count {
            output: Some("out".into()),
        };
        c.fold(&Bytes::new(), &mut state, &event, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(c.decode(&c.encode(&2)).unwrap(), 2);
        let v = output_value(&event, 2);
        assert_eq!(&v[..8], &1_000i64.to_be_bytes());
        assert_eq!(v.len(), 24);
    }
}
