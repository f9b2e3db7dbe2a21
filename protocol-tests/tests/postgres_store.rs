//! The PostgreSQL snapshot store (KIP-939 two-phase commit) on a real Kafka 4.4 broker and a real
//! PostgreSQL the test starts: flushes and recovery, the race the fencing row closes (a stale owner
//! frozen between its Kafka prepare and its PostgreSQL commit, stopped deterministically by holding the
//! flush between its steps), a stale owner that holds the row's lock, and the refusals at acquisition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{cluster, join_classic, unique, ClusterSpec, KafkaCluster, PostgresServer};
use snapfence::consumer::{committed_offsets, TopicPartition as ConsumerTp};
use snapfence::net::{Client, ClientConfig};
use snapfence::producer::{TopicPartition, TwoPhaseCommitRefusal};
use snapfence::snapshot::postgres::{PgError, PgSnapshotStore, PgStoreConfig};
use snapfence::snapshot::{FailureKind, MetadataSource, SnapshotConfig, SnapshotError};
use snapfence::GroupMetadata;

fn two_phase() -> ClusterSpec {
    ClusterSpec::kafka4().with_two_phase_commit()
}

async fn postgres() -> PostgresServer {
    tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL")
}

struct World {
    client: Client,
    input: String,
    prefix: String,
    pg: PgStoreConfig,
}

impl World {
    async fn new(kafka: &KafkaCluster, pg: &PostgresServer) -> World {
        let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
            .await
            .unwrap();
        let input = unique("pg-in");
        snapfence::admin::create_topic(&client, &input, 1, -1, &[])
            .await
            .unwrap();
        let mut cfg = PgStoreConfig::new(pg.url());
        cfg.table_prefix = "sf_test".into();
        World {
            client,
            input,
            prefix: unique("pg"),
            pg: cfg,
        }
    }

    /// A member of a fresh classic group: the generation every flush's offset commit carries.
    async fn member(&self) -> GroupMetadata {
        join_classic(&self.client, &unique("pg-group"), "", 60_000)
            .await
            .unwrap()
    }

    /// Takes the partition over as a member of `group`, starting from the group's committed offset
    /// (read after the takeover, as the flow does).
    async fn acquire(&self, group: &GroupMetadata) -> Result<PgSnapshotStore, SnapshotError> {
        let g = group.clone();
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(g.clone()));
        PgSnapshotStore::acquire(
            self.client.clone(),
            &SnapshotConfig::new("unused", &self.prefix),
            &self.pg,
            TopicPartition::new(self.input.as_str(), 0),
            metadata,
            async { Ok(self.committed(group).await.unwrap_or(0)) },
        )
        .await
    }

    async fn committed(&self, group: &GroupMetadata) -> Option<i64> {
        let tp = ConsumerTp::new(self.input.as_str(), 0);
        committed_offsets(&self.client, group.group_id(), std::slice::from_ref(&tp))
            .await
            .unwrap()[&tp]
    }
}

fn kv(k: &str, v: &str) -> (Bytes, Option<Bytes>) {
    (
        Bytes::copy_from_slice(k.as_bytes()),
        Some(Bytes::copy_from_slice(v.as_bytes())),
    )
}

/// The rows of a store, sorted, as `key=value` text.
async fn rows(store: &PgSnapshotStore) -> Vec<String> {
    let state = store.read_state().await.unwrap();
    let mut out: Vec<String> = state
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            )
        })
        .collect();
    out.sort();
    out
}

/// Flushes land in PostgreSQL and the group's committed offset moves with them; deletes remove rows;
/// a new owner recovers exactly what the last flush left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_land_with_their_offset_and_a_new_owner_recovers_them() {
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let a = w.acquire(&group).await.unwrap();
    assert_eq!(a.owner_epoch(), 1);
    a.write_all(vec![kv("x", "1"), kv("y", "1"), kv("x", "2")])
        .await
        .unwrap();
    a.commit_offset(7).await.unwrap();
    assert_eq!(w.committed(&group).await, Some(7));
    a.write_all(vec![(Bytes::from_static(b"y"), None), kv("z", "3")])
        .await
        .unwrap();
    assert_eq!(
        rows(&a).await,
        vec!["x=2", "z=3"],
        "the last write of a key wins"
    );
    assert_eq!(a.committed_offset(), 7);
    a.close().await;

    let b = w.acquire(&group).await.unwrap();
    assert_eq!(b.owner_epoch(), 2, "every takeover bumps the fencing row");
    assert_eq!(rows(&b).await, vec!["x=2", "z=3"]);
    assert_eq!(b.committed_offset(), 7);
    assert!(!b.kafka_behind());
    b.close().await;
}

/// The race, made deterministic: the stale owner A passes its fenced offset commit and its
/// Kafka prepare, then stops (it holds the flush between steps). B takes over: its init aborts A's Kafka
/// transaction (Kafka 4.4.0 cannot keep it), its bump moves the fencing row on, PostgreSQL records
/// nothing of A's flush, and B writes newer rows. A wakes and tries its PostgreSQL commit: the
/// compare-and-set on the fencing row refuses it, and nothing of A lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_frozen_between_prepare_and_commit_lands_nothing() {
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let a = w.acquire(&group).await.unwrap();
    a.write_all(vec![kv("k", "a-1")]).await.unwrap();
    a.commit_offset(10).await.unwrap();

    let frozen = a
        .begin_flush(vec![kv("k", "a-stale"), kv("only-a", "x")], 20)
        .await
        .unwrap();

    let b = w.acquire(&group).await.unwrap();
    assert_eq!(
        b.committed_offset(),
        10,
        "A's frozen flush recorded nothing"
    );
    assert_eq!(rows(&b).await, vec!["k=a-1"]);
    b.write_all(vec![kv("k", "b-1")]).await.unwrap();
    b.commit_offset(15).await.unwrap();

    let refused = frozen
        .write_rows()
        .await
        .err()
        .expect("A's commit is refused");
    assert_eq!(
        refused.failure_kind(),
        Some(FailureKind::ProducerFenced),
        "{refused}"
    );
    match &refused {
        SnapshotError::Store { source, .. } => assert!(
            matches!(
                **source,
                PgError::Fenced {
                    ours: 1,
                    current: Some(2),
                    ..
                }
            ),
            "{source}"
        ),
        other => panic!("{other}"),
    }
    assert_eq!(rows(&b).await, vec!["k=b-1"], "nothing of A landed");
    assert_eq!(w.committed(&group).await, Some(15));
    // The store is closed after the fence: nothing more of A is tried.
    assert!(matches!(
        a.write_all(vec![kv("k", "a-again")]).await,
        Err(SnapshotError::Closed { .. })
    ));
    b.close().await;
}

/// The other interleaving: A is stopped after its compare-and-set, holding the fencing row's lock. B's
/// takeover waits for that lock (its Kafka init already fenced A's producer). A's PostgreSQL commit then
/// lands, legitimately: it passed the fence before B took over. B starts after it, from the offset A's
/// rows cover, although A's Kafka side could not commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_a_flush_that_holds_the_fencing_row_then_starts_after_it() {
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let a = w.acquire(&group).await.unwrap();
    a.commit_offset(10).await.unwrap();
    let holding = a
        .begin_flush(vec![kv("k", "a-2")], 20)
        .await
        .unwrap()
        .write_rows()
        .await
        .unwrap();

    let (client, world_pg, prefix, input) = (
        w.client.clone(),
        w.pg.clone(),
        w.prefix.clone(),
        w.input.clone(),
    );
    let g = group.clone();
    let takeover = tokio::spawn(async move {
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(g.clone()));
        PgSnapshotStore::acquire(
            client,
            &SnapshotConfig::new("unused", &prefix),
            &world_pg,
            TopicPartition::new(input.as_str(), 0),
            metadata,
            async { Ok(0) },
        )
        .await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!takeover.is_finished(), "B must wait for the row A holds");

    let committed = holding.commit_rows().await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(30), takeover)
        .await
        .expect("B goes on once A's transaction ends")
        .unwrap()
        .unwrap();
    let e = committed.commit_kafka().await.unwrap_err();
    assert!(
        e.is_producer_fenced() || e.failure_kind() == Some(FailureKind::Fatal),
        "A's Kafka side was fenced by B's init: {e}"
    );
    assert_eq!(rows(&b).await, vec!["k=a-2"], "A's rows landed before B");
    assert_eq!(b.committed_offset(), 20, "B starts after A's rows");
    assert!(
        b.kafka_behind(),
        "the group's offset in Kafka was left at 10"
    );
    assert_eq!(w.committed(&group).await, Some(10));
    // B's first flush moves Kafka's offset up to where PostgreSQL stands.
    b.commit_offset(b.committed_offset()).await.unwrap();
    assert_eq!(w.committed(&group).await, Some(20));
    b.close().await;
}

/// A stale generation is refused by the group coordinator at the first step: nothing is written in
/// either store, and the error is the group fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_generation_is_refused_before_postgres_is_touched() {
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let stale = GroupMetadata::new(
        group.group_id(),
        group.generation_id() - 1,
        group.member_id(),
        None,
    )
    .unwrap();
    let a = w.acquire(&stale).await.unwrap();
    let e = a.write_all(vec![kv("k", "stale")]).await.unwrap_err();
    assert!(e.is_fenced(), "{e}");
    assert_eq!(rows(&a).await, Vec::<String>::new());
    a.close().await;
}

/// Without two-phase commit on the broker, or without the TWO_PHASE_COMMIT ACL (tests/two_phase.rs
/// proves the ACL case at the producer), acquisition fails at once, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_fails_at_once_when_the_broker_has_two_phase_commit_off() {
    let kafka =
        cluster(ClusterSpec::kafka4().with_prop("unstable.api.versions.enable", "true")).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let began = Instant::now();
    let e = w.acquire(&group).await.unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(5), "{e}");
    match &e {
        SnapshotError::Acquire { source, .. } => assert_eq!(
            source.two_phase_refusal(),
            Some(TwoPhaseCommitRefusal::DisabledOnBroker),
            "{e}"
        ),
        other => panic!("{other}"),
    }
    assert!(
        e.to_string()
            .contains("transaction.two.phase.commit.enable"),
        "{e}"
    );
}

/// A cluster at transaction version 1: a flush could not name its Kafka transaction (the ids repeat from
/// one transaction to the next), so the takeover is refused at once rather than every flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_fails_at_once_under_transaction_version_1() {
    let kafka = cluster(ClusterSpec::kafka4_tv1().with_two_phase_commit()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let group = w.member().await;
    let e = w.acquire(&group).await.unwrap_err();
    match &e {
        SnapshotError::Acquire { source, .. } => assert_eq!(
            source.two_phase_refusal(),
            Some(TwoPhaseCommitRefusal::NeedsTransactionVersion2),
            "{e}"
        ),
        other => panic!("{other}"),
    }
}

/// A principal with WRITE on the transactional ids but not the TWO_PHASE_COMMIT operation: the takeover
/// is refused at once and, since the principal may read the broker's configuration, says it is the ACL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_without_the_two_phase_commit_acl_says_so() {
    use protocol_tests::acl::{
        allow, create_acls, CLUSTER, DESCRIBE, DESCRIBE_CONFIGS, LITERAL, PREFIXED,
        TRANSACTIONAL_ID, WRITE,
    };
    use protocol_tests::{Listener, SecuritySpec};
    use snapfence::net::{SaslConfig, SaslMechanism};
    const ADMIN: (&str, &str) = ("admin", "admin-secret");
    const ERIN: (&str, &str) = ("erin", "erin-secret");
    let spec = two_phase().with_security(SecuritySpec {
        users: [ADMIN, ERIN]
            .iter()
            .map(|(u, p)| (u.to_string(), p.to_string()))
            .collect(),
        super_users: vec!["User:admin".into()],
        tls: None,
    });
    let kafka = cluster(spec).await;
    let pg = postgres().await;
    let bootstrap = kafka.listener_bootstrap(Listener::SaslPlaintext);
    let login = |who: (&str, &str)| {
        Client::connect(ClientConfig::new(&bootstrap).with_sasl(SaslConfig::new(
            SaslMechanism::ScramSha512,
            who.0,
            who.1,
        )))
    };
    let admin = login(ADMIN).await.unwrap();
    let prefix = unique("pg-acl");
    // WRITE and DESCRIBE on the transactional ids (prefixed), DESCRIBE_CONFIGS on the cluster.
    let erin_p = "User:erin";
    create_acls(
        &admin,
        vec![
            allow(erin_p, TRANSACTIONAL_ID, &prefix, PREFIXED, WRITE),
            allow(erin_p, TRANSACTIONAL_ID, &prefix, PREFIXED, DESCRIBE),
            allow(erin_p, CLUSTER, "kafka-cluster", LITERAL, DESCRIBE_CONFIGS),
        ],
    )
    .await;
    let erin = login(ERIN).await.unwrap();
    let input = unique("pg-acl-in");
    snapfence::admin::create_topic(&admin, &input, 1, -1, &[])
        .await
        .unwrap();
    let member = join_classic(&admin, &unique("pg-acl-group"), "", 60_000)
        .await
        .unwrap();
    let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(member.clone()));
    // ACLs reach the authorizer a moment after CreateAcls: until WRITE is in, the refusal is the
    // ordinary missing-ACL one.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        let began = Instant::now();
        let e = PgSnapshotStore::acquire(
            erin.clone(),
            &SnapshotConfig::new("unused", &prefix),
            &PgStoreConfig::new(pg.url()),
            TopicPartition::new(input.as_str(), 0),
            metadata.clone(),
            async { Ok(0) },
        )
        .await
        .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(5), "{e}");
        let SnapshotError::Acquire { source, .. } = &e else {
            panic!("{e}")
        };
        match source.two_phase_refusal() {
            Some(r) if r != TwoPhaseCommitRefusal::NotAuthorizedOrDisabled => break (r, e),
            _ => {}
        }
        assert!(Instant::now() < deadline, "never refused for the ACL: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        refusal.0,
        TwoPhaseCommitRefusal::NotAuthorized,
        "{}",
        refusal.1
    );
    assert!(
        refusal.1.to_string().contains("TWO_PHASE_COMMIT"),
        "{}",
        refusal.1
    );
}

/// Outputs ride in the flush's prepared Kafka transaction and are kept in PostgreSQL with the rows.
/// A's second flush commits its rows and then dies before its Kafka commit: B's init aborts the
/// prepared transaction (Kafka 4.4.0 cannot keep it), so its output is not visible; B sees in the
/// group's offset metadata that the flush PostgreSQL recorded never committed in Kafka and sends its
/// outputs again in its first flush. A read_committed reader then sees each output exactly once, and a
/// third owner, whose takeover finds the last flush committed in Kafka, sends nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_of_a_flush_whose_kafka_side_aborted_are_sent_again_once() {
    use snapfence::producer::ProducerRecord;
    use snapfence::records::IsolationLevel;
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let w = World::new(&kafka, &pg).await;
    let output = unique("pg-out");
    snapfence::admin::create_topic(&w.client, &output, 1, -1, &[])
        .await
        .unwrap();
    let out = |v: &str| {
        ProducerRecord::new(output.as_str(), Some(Bytes::copy_from_slice(v.as_bytes()))).key("k")
    };
    // What a read_committed reader sees once the transaction markers are written (a commit returns
    // when the coordinator has it; the markers follow), waiting up to 10 s for `n` outputs.
    let visible = |n: usize| {
        let (client, output) = (w.client.clone(), output.clone());
        async move {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let records = protocol_tests::campaign::read_topic(
                    &client,
                    &output,
                    1,
                    IsolationLevel::ReadCommitted,
                )
                .await
                .unwrap();
                let seen: Vec<String> = records
                    .into_iter()
                    .map(|(_, v, _)| String::from_utf8(v.unwrap().to_vec()).unwrap())
                    .collect();
                if seen.len() >= n || Instant::now() > until {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let group = w.member().await;
    let a = w.acquire(&group).await.unwrap();
    assert!(!a.kafka_behind());
    a.write_with_outputs(vec![kv("k", "a-1")], vec![out("o1")])
        .await
        .unwrap();
    assert_eq!(visible(1).await, vec!["o1"]);
    let rows_landed = a
        .begin_flush_with_outputs(vec![kv("k", "a-2")], vec![out("o2"), out("o3")], 20)
        .await
        .unwrap()
        .write_rows()
        .await
        .unwrap()
        .commit_rows()
        .await
        .unwrap();
    // A dies here: its rows and outputs are in PostgreSQL, its Kafka transaction is prepared.
    drop(rows_landed);

    let b = w.acquire(&group).await.unwrap();
    assert_eq!(rows(&b).await, vec!["k=a-2"]);
    assert!(
        b.kafka_behind(),
        "the aborted flush's outputs wait to go out again"
    );
    assert_eq!(
        visible(2).await,
        vec!["o1"],
        "B's init aborted A's prepared transaction"
    );
    b.commit_offset(b.committed_offset()).await.unwrap();
    assert_eq!(visible(3).await, vec!["o1", "o2", "o3"]);
    assert_eq!(w.committed(&group).await, Some(20));
    b.close().await;

    let c = w.acquire(&group).await.unwrap();
    assert!(
        !c.kafka_behind(),
        "the last flush committed in Kafka: nothing goes out again"
    );
    c.commit_offset(c.committed_offset()).await.unwrap();
    assert_eq!(visible(4).await, vec!["o1", "o2", "o3"]);
    c.close().await;
    drop(a);
}

/// A store of two co-partitioned inputs: every flush commits both inputs' offsets in its one fenced
/// TxnOffsetCommit and records both on the fencing row. A flush whose rows committed and whose Kafka
/// side did not leaves the row ahead of the group on both inputs: the next takeover starts each at
/// the row's offset and calls the group behind. A one-input flush later moves only the first input
/// on, leaving the row's vector stale: a takeover of both then knows the first input's offset from the
/// row and the second's from the group. A reset refuses the partition while its row records both and the reset names one.
/// On a table made before the `input_offsets` column existed, a store of several inputs adds it, or
/// says how to when it may not create tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_inputs_commit_together_and_resume_input_by_input() {
    use snapfence::snapshot::postgres::{inspect_partition, reset_partition};
    let kafka = cluster(two_phase()).await;
    let pg = postgres().await;
    let mut w = World::new(&kafka, &pg).await;
    w.pg.table_prefix = "sf_inputs".into();
    let second = unique("pg-in-b");
    snapfence::admin::create_topic(&w.client, &second, 1, -1, &[])
        .await
        .unwrap();
    let tps = [
        ConsumerTp::new(w.input.as_str(), 0),
        ConsumerTp::new(second.as_str(), 0),
    ];
    let group = w.member().await;
    let (client, prefix, input) = (w.client.clone(), w.prefix.clone(), w.input.clone());
    let committed = || {
        let (client, tps, id) = (client.clone(), tps.clone(), group.group_id().to_owned());
        async move {
            let got = committed_offsets(&client, &id, &tps).await.unwrap();
            tps.iter()
                .map(|tp| got[tp].unwrap_or(-1))
                .collect::<Vec<i64>>()
        }
    };
    let acquire = |pg: PgStoreConfig| {
        let g = group.clone();
        let metadata: Arc<dyn MetadataSource> = Arc::new(move || Some(g.clone()));
        let (client, prefix, input, second) = (
            client.clone(),
            prefix.clone(),
            input.clone(),
            second.clone(),
        );
        let assigned = committed();
        async move {
            PgSnapshotStore::acquire_inputs(
                client,
                &SnapshotConfig::new("unused", &prefix),
                &pg,
                vec![
                    TopicPartition::new(input.as_str(), 0),
                    TopicPartition::new(second.as_str(), 0),
                ],
                metadata,
                async move { Ok(assigned.await.into_iter().map(|o| o.max(0)).collect()) },
            )
            .await
        }
    };

    let a = acquire(w.pg.clone()).await.unwrap();
    assert_eq!(a.committed_offsets(), vec![0, 0]);
    a.write_all(vec![kv("k", "1")]).await.unwrap();
    a.commit_offsets(vec![7, 3]).await.unwrap();
    assert_eq!(
        committed().await,
        vec![7, 3],
        "one commit moved both inputs"
    );
    assert_eq!(
        (a.committed_offsets(), a.committed_offset()),
        (vec![7, 3], 10)
    );
    match a.commit_offset(9).await {
        Err(SnapshotError::Config(why)) => assert!(why.contains("1 offsets for 2 inputs"), "{why}"),
        other => panic!("one offset for two inputs must be refused: {other:?}"),
    }
    // A dies after its rows committed, before its Kafka commit.
    let landed = a
        .begin_flush_inputs(vec![kv("k", "2")], Vec::new(), vec![9, 5])
        .await
        .unwrap()
        .write_rows()
        .await
        .unwrap()
        .commit_rows()
        .await
        .unwrap();
    drop(landed);

    let b = acquire(w.pg.clone()).await.unwrap();
    assert_eq!(rows(&b).await.len(), 1);
    assert_eq!(
        b.committed_offsets(),
        vec![9, 5],
        "the row's offsets, input by input"
    );
    assert!(b.kafka_behind());
    assert_eq!(
        committed().await,
        vec![7, 3],
        "B's init aborted A's Kafka side"
    );
    b.commit_offsets(b.committed_offsets()).await.unwrap();
    assert_eq!(committed().await, vec![9, 5]);
    b.close().await;

    let view = inspect_partition(&w.pg, &w.prefix, 0).await.unwrap();
    assert_eq!(view.input_offsets, Some(vec![9, 5]));
    match reset_partition(&w.pg, &w.prefix, 0, 0).await {
        Err(PgError::InputCount {
            partition: 0,
            recorded: 2,
            named: 1,
            ..
        }) => {}
        other => panic!("a one-input reset of a two-input row must be refused: {other:?}"),
    }
    assert_eq!(
        inspect_partition(&w.pg, &w.prefix, 0)
            .await
            .unwrap()
            .committed_offset,
        Some(9),
        "the refused reset changed nothing"
    );

    // A flow of the first input alone moves it on; the row's vector is stale from then on.
    let one = w.acquire(&group).await.unwrap();
    assert_eq!(one.committed_offset(), 9);
    one.commit_offset(12).await.unwrap();
    one.close().await;
    let c = acquire(w.pg.clone()).await.unwrap();
    assert_eq!(c.committed_offsets(), vec![12, 5]);
    assert!(!c.kafka_behind());
    c.close().await;

    // A table from before the column: one input works on it as it is; two inputs add the column, or,
    // not allowed to create tables, say what to run.
    let (old, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // Tables of their own (an external server may be shared between runs).
    let t = format!(
        "sf_old_{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    old.batch_execute(&format!(
        "CREATE TABLE {t}_snapshots (prefix text NOT NULL, partition integer NOT NULL, \
           key bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY (prefix, partition, key)); \
         CREATE TABLE {t}_owners (prefix text NOT NULL, partition integer NOT NULL, \
           owner_epoch bigint NOT NULL, committed_offset bigint, prepared_txn text, \
           PRIMARY KEY (prefix, partition)); \
         CREATE TABLE {t}_outputs (prefix text NOT NULL, partition integer NOT NULL, \
           seq integer NOT NULL, flush_id text NOT NULL, topic text NOT NULL, target integer NOT NULL, \
           key bytea, value bytea, headers bytea, ts bigint NOT NULL, \
           PRIMARY KEY (prefix, partition, seq));"
    ))
    .await
    .unwrap();
    w.pg.table_prefix = t;
    w.pg.create_tables = false;
    let one = w.acquire(&group).await.unwrap();
    one.commit_offset(12).await.unwrap();
    one.close().await;
    match acquire(w.pg.clone()).await {
        Err(SnapshotError::Store { source, .. }) => {
            let why = source.to_string();
            assert!(
                why.contains("ADD COLUMN IF NOT EXISTS input_offsets"),
                "{why}"
            );
        }
        other => panic!("a table without the column must be refused: {other:?}"),
    }
    w.pg.create_tables = true;
    let d = acquire(w.pg.clone()).await.unwrap();
    assert_eq!(d.committed_offsets(), vec![12, 5]);
    d.commit_offsets(vec![13, 6]).await.unwrap();
    d.close().await;
    assert_eq!(
        inspect_partition(&w.pg, &w.prefix, 0)
            .await
            .unwrap()
            .input_offsets,
        Some(vec![13, 6])
    );
}
