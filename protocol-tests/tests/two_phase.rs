//! KIP-939 two-phase commit on a real Kafka 4.4 broker: a prepared transaction committed or aborted by
//! the outside decision, a new owner's init against a prepared transaction (4.4.0 refuses
//! `KeepPreparedTxn`, KAFKA-20739, so it aborts instead), and the refusals: a broker that does not speak
//! InitProducerId v6, 2PC switched off on the broker, and a principal without the TWO_PHASE_COMMIT ACL.

use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::{
    cluster, join_classic, unique, ClusterSpec, KafkaCluster, Listener, SecuritySpec,
};
use snapfence::consumer::{committed_offsets, TopicPartition as ConsumerTp};
use snapfence::net::{Client, ClientConfig, SaslConfig, SaslMechanism};
use snapfence::producer::{
    Completion, ProducerError, ProducerRecord, TopicPartition, TransactionState,
    TransactionalConfig, TransactionalProducer, TwoPhaseCommitRefusal,
};
use snapfence::snapshot::{recover, PartitionLog, RecoveryConfig};
use snapfence::GroupMetadata;

fn two_phase() -> ClusterSpec {
    ClusterSpec::kafka4().with_two_phase_commit()
}

fn config(id: &str) -> TransactionalConfig {
    let mut c = TransactionalConfig::new(id);
    c.two_phase_commit = true;
    c
}

struct World {
    client: Client,
    topic: String,
    input: String,
    group: GroupMetadata,
}

async fn world(kafka: &KafkaCluster) -> World {
    let client = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let topic = unique("2pc-out");
    let input = unique("2pc-in");
    for t in [&topic, &input] {
        snapfence::admin::create_topic(&client, t, 1, -1, &[])
            .await
            .unwrap();
    }
    let group = join_classic(&client, &unique("2pc-group"), "", 60_000)
        .await
        .unwrap();
    World {
        client,
        topic,
        input,
        group,
    }
}

impl World {
    /// Opens a transaction writing `keys` and committing `offset` for the input, and prepares it.
    async fn prepared(&self, producer: &mut TransactionalProducer, keys: &[&str], offset: i64) {
        producer.begin().unwrap();
        for k in keys {
            let r = ProducerRecord::new(self.topic.as_str(), Some(Bytes::from_static(b"v")))
                .key(Bytes::copy_from_slice(k.as_bytes()))
                .partition(0);
            let _delivery = producer.send(r).await.unwrap();
        }
        producer
            .send_offsets(
                [(TopicPartition::new(self.input.as_str(), 0), offset.into())],
                &self.group,
            )
            .await
            .unwrap();
        let prepared = producer.prepare().await.unwrap();
        assert_eq!(producer.state(), TransactionState::Prepared);
        let ids = producer.producer_id_and_epoch().unwrap();
        assert_eq!(
            (prepared.producer_id, prepared.producer_epoch),
            (ids.id, ids.epoch),
            "a prepared transaction is named by the ids it runs under"
        );
    }

    /// The keys a read_committed reader sees.
    async fn visible(&self) -> Vec<Vec<u8>> {
        let mut log = PartitionLog::new(self.client.clone(), &self.topic, 0);
        let cfg = RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(30)),
            ..RecoveryConfig::default()
        };
        let state = recover(&mut log, 0, &cfg).await.unwrap().0;
        let mut keys: Vec<Vec<u8>> = state.iter().map(|(k, _)| k.to_vec()).collect();
        keys.sort();
        keys
    }

    async fn committed(&self) -> Option<i64> {
        let tp = ConsumerTp::new(self.input.as_str(), 0);
        committed_offsets(
            &self.client,
            self.group.group_id(),
            std::slice::from_ref(&tp),
        )
        .await
        .unwrap()[&tp]
    }
}

/// The outside decision ends a prepared transaction: the same name commits it (records visible, the
/// offset committed), any other aborts it (neither).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_ends_as_the_other_store_decided() {
    let kafka = cluster(two_phase()).await;
    let w = world(&kafka).await;
    let mut p = TransactionalProducer::init(w.client.clone(), config(&unique("2pc")))
        .await
        .unwrap();
    w.prepared(&mut p, &["a", "b"], 10).await;
    let name = p.prepared().unwrap();
    assert_eq!(p.complete(Some(name)).await.unwrap(), Completion::Committed);
    assert_eq!(p.state(), TransactionState::Ready);
    assert_eq!(w.visible().await, vec![b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(w.committed().await, Some(10));

    // The other store committed an earlier transaction (the name it holds is the last one's): abort.
    w.prepared(&mut p, &["c"], 20).await;
    assert_eq!(p.complete(Some(name)).await.unwrap(), Completion::Aborted);
    w.prepared(&mut p, &["d"], 30).await;
    assert_eq!(p.complete(None).await.unwrap(), Completion::Aborted);
    assert_eq!(w.visible().await, vec![b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(w.committed().await, Some(10));
    // Nothing to complete any more.
    assert!(matches!(
        p.complete(Some(name)).await,
        Err(ProducerError::IllegalState { .. })
    ));
    p.close().await;
}

/// A new owner of the transactional id finds its predecessor's transaction prepared. Kafka 4.4.0 refuses
/// to keep it (UNSUPPORTED_VERSION to `KeepPreparedTxn`, changing nothing), so the fallback, an ordinary
/// 2PC init, aborts it and fences the predecessor. While it waited, the coordinator did not time it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_finds_the_prepared_transaction_and_4_4_0_aborts_it() {
    let kafka = cluster(two_phase()).await;
    let w = world(&kafka).await;
    let id = unique("2pc-owner");
    let mut old = TransactionalProducer::init(w.client.clone(), config(&id))
        .await
        .unwrap();
    w.prepared(&mut old, &["x"], 5).await;
    let described = snapfence::admin::describe_transaction(&w.client, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        described.state, "Ongoing",
        "a prepared transaction is open on the broker"
    );
    assert!(
        described.timeout_ms > 60_000,
        "a 2PC transaction never times out: {described:?}"
    );

    match TransactionalProducer::init_keeping_prepared(w.client.clone(), config(&id)).await {
        Err(e) => assert_eq!(
            e.two_phase_refusal(),
            Some(TwoPhaseCommitRefusal::KeepPreparedUnsupported),
            "{e}"
        ),
        Ok((mut new, kept)) => {
            // A broker that keeps it names the predecessor's transaction; this one is not that.
            assert!(kafka.version() != "4.4.0", "4.4.0 refuses KeepPreparedTxn");
            let kept = kept.expect("the prepared transaction is kept");
            assert_eq!(new.complete(None).await.unwrap(), Completion::Aborted);
            let _ = kept;
            new.close().await;
        }
    }
    // Refused without effect: the transaction is still there, still prepared.
    let still = snapfence::admin::describe_transaction(&w.client, &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(still.state, "Ongoing");

    let new = TransactionalProducer::init(w.client.clone(), config(&id))
        .await
        .unwrap();
    assert_eq!(w.visible().await, Vec::<Vec<u8>>::new(), "aborted");
    assert_eq!(w.committed().await, None);
    let e = old.commit().await.unwrap_err();
    assert!(e.is_fatal(), "the predecessor is fenced: {e}");
    new.close().await;
}

/// A broker that does not speak InitProducerId v6 (4.4 without the unstable versions), and one with
/// two-phase commit switched off: refused at once, with which in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_by_the_broker_say_which() {
    let plain = cluster(ClusterSpec::kafka4()).await;
    let client = Client::connect(ClientConfig::new(plain.bootstrap()))
        .await
        .unwrap();
    let began = Instant::now();
    let e = TransactionalProducer::init(client, config(&unique("2pc-v5")))
        .await
        .unwrap_err();
    assert_eq!(
        e.two_phase_refusal(),
        Some(TwoPhaseCommitRefusal::NotSpoken),
        "{e}"
    );
    assert!(began.elapsed() < Duration::from_secs(5));

    let off =
        cluster(ClusterSpec::kafka4().with_prop("unstable.api.versions.enable", "true")).await;
    let client = Client::connect(ClientConfig::new(off.bootstrap()))
        .await
        .unwrap();
    let id = unique("2pc-off");
    let began = Instant::now();
    let e = TransactionalProducer::init(client.clone(), config(&id))
        .await
        .unwrap_err();
    assert_eq!(
        e.two_phase_refusal(),
        Some(TwoPhaseCommitRefusal::NotAuthorizedOrDisabled),
        "{e}"
    );
    assert!(e.is_fatal());
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(
        snapfence::admin::two_phase_commit_enabled(&client, &id)
            .await
            .unwrap(),
        Some(false),
        "the broker's setting tells the two refusals apart"
    );
    // A transaction timeout with 2PC is refused before anything is sent.
    let mut c = config(&id);
    c.transaction_timeout = Duration::from_secs(10);
    let e = TransactionalProducer::init(client, c).await.unwrap_err();
    assert_eq!(
        e.two_phase_refusal(),
        Some(TwoPhaseCommitRefusal::TimeoutSet)
    );
}

const ADMIN: (&str, &str) = ("admin", "admin-secret");
const CAROL: (&str, &str) = ("carol", "carol-secret");

/// WRITE on the transactional id is not enough for a 2PC init: without the TWO_PHASE_COMMIT operation
/// the init is refused at once; the broker's setting (on) says it is the ACL; granted, the init works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_two_phase_commit_acl_the_init_is_refused() {
    use protocol_tests::acl::{
        allow, create_acls, DESCRIBE, LITERAL, TRANSACTIONAL_ID, TWO_PHASE_COMMIT, WRITE,
    };
    let spec = two_phase().with_security(SecuritySpec {
        users: [ADMIN, CAROL]
            .iter()
            .map(|(u, p)| (u.to_string(), p.to_string()))
            .collect(),
        super_users: vec!["User:admin".into()],
        tls: None,
    });
    let kafka = cluster(spec).await;
    let bootstrap = kafka.listener_bootstrap(Listener::SaslPlaintext);
    let login = |who: (&str, &str)| {
        Client::connect(ClientConfig::new(&bootstrap).with_sasl(SaslConfig::new(
            SaslMechanism::ScramSha512,
            who.0,
            who.1,
        )))
    };
    let admin = login(ADMIN).await.unwrap();
    let id = unique("2pc-acl");
    let carol_p = format!("User:{}", CAROL.0);
    create_acls(
        &admin,
        vec![
            allow(&carol_p, TRANSACTIONAL_ID, &id, LITERAL, WRITE),
            allow(&carol_p, TRANSACTIONAL_ID, &id, LITERAL, DESCRIBE),
        ],
    )
    .await;
    let carol = login(CAROL).await.unwrap();
    // ACLs reach the authorizer a moment after CreateAcls returns: a plain init proves WRITE is in.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TransactionalProducer::init(carol.clone(), TransactionalConfig::new(&id)).await {
            Ok(p) => {
                p.close().await;
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "WRITE never took effect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let began = Instant::now();
    let e = TransactionalProducer::init(carol.clone(), config(&id))
        .await
        .unwrap_err();
    assert_eq!(
        e.two_phase_refusal(),
        Some(TwoPhaseCommitRefusal::NotAuthorizedOrDisabled),
        "{e}"
    );
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(
        snapfence::admin::two_phase_commit_enabled(&admin, &id)
            .await
            .unwrap(),
        Some(true),
        "2PC is on, so the refusal is the missing ACL"
    );

    create_acls(
        &admin,
        vec![allow(
            &carol_p,
            TRANSACTIONAL_ID,
            &id,
            LITERAL,
            TWO_PHASE_COMMIT,
        )],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TransactionalProducer::init(carol.clone(), config(&id)).await {
            Ok(p) => {
                p.close().await;
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "TWO_PHASE_COMMIT never took effect: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
