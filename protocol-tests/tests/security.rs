//! SASL logins and ACLs against real brokers (Kafka 4.x and 3.9): PLAIN and both SCRAMs produce and fetch,
//! a principal holding the right ACLs runs the snapshot store end to end, one without the transactional-id
//! ACL fails fast and fatally, and wrong credentials fail once, quickly, without a retry storm. With the
//! `tls` feature: the SSL, mutual-TLS and SASL_SSL listeners, with certificates made in the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    AlterUserScramCredentialsRequest, ScramCredentialDeletion,
};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::MetadataRequest;
use kafka_protocol::protocol::StrBytes;
use protocol_tests::acl::{
    allow, create_acls, DESCRIBE, GROUP, LITERAL, PREFIXED, READ, TOPIC, TRANSACTIONAL_ID, WRITE,
};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster, Listener, SecuritySpec};
use snapfence::consumer::{
    GroupConfig, GroupConsumer, GroupConsumerConfig, OffsetReset, PartitionReader, ReaderConfig,
    StartAt, TopicPartition as ConsumerTp,
};
use snapfence::net::{
    AuthFailure, Client, ClientConfig, NetError, SaslConfig, SaslMechanism, Target,
};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord, TopicPartition};
use snapfence::snapshot::{
    recover, Assignment, PartitionLog, RecoveryConfig, SnapshotConfig, SnapshotStore,
};
use snapfence::ErrorCode;

const ADMIN: (&str, &str) = ("admin", "admin-secret");
const ALICE: (&str, &str) = ("alice", "alice-secret");
const BOB: (&str, &str) = ("bob", "bob-secret");
/// Revoked during a test; no other test uses it.
const DAVE: (&str, &str) = ("dave", "dave-secret");
const MECHANISMS: [SaslMechanism; 3] = [
    SaslMechanism::Plain,
    SaslMechanism::ScramSha256,
    SaslMechanism::ScramSha512,
];

fn users() -> SecuritySpec {
    SecuritySpec {
        users: [ADMIN, ALICE, BOB, DAVE]
            .iter()
            .map(|(u, p)| (u.to_string(), p.to_string()))
            .collect(),
        super_users: vec!["User:admin".into()],
        tls: None,
    }
}

/// The SASL cluster. Sessions last 4 s (KIP-368 `connections.max.reauth.ms`), so every test here also
/// runs across connections retired and re-opened (and re-authenticated) underneath it.
fn sasl_spec(base: ClusterSpec) -> ClusterSpec {
    base.with_security(users())
        .with_prop("connections.max.reauth.ms", "4000")
}

fn specs() -> [ClusterSpec; 2] {
    [
        sasl_spec(ClusterSpec::kafka4()),
        sasl_spec(ClusterSpec::kafka39()),
    ]
}

fn sasl_config(bootstrap: &str, mechanism: SaslMechanism, who: (&str, &str)) -> ClientConfig {
    ClientConfig::new(bootstrap).with_sasl(SaslConfig::new(mechanism, who.0, who.1))
}

async fn login(kafka: &KafkaCluster, mechanism: SaslMechanism, who: (&str, &str)) -> Client {
    let bootstrap = kafka.listener_bootstrap(Listener::SaslPlaintext);
    Client::connect(sasl_config(&bootstrap, mechanism, who))
        .await
        .unwrap_or_else(|e| panic!("{} login as {}: {e}", mechanism, who.0))
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Produces one record to partition 0 and reads it back, through `client` alone.
async fn produce_and_fetch(client: &Client, topic: &str, value: &str) {
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .expect("producer");
    let delivery = producer
        .send(ProducerRecord::new(topic, Some(b(value))).partition(0))
        .await
        .expect("queue");
    let meta = delivery.await.expect("delivered");
    producer.close().await;
    let mut reader = PartitionReader::new(client.clone(), ReaderConfig::default());
    let tp = ConsumerTp::new(topic, 0);
    reader.assign(
        tp.clone(),
        StartAt::Offset(meta.offset.expect("acks=all gives the offset")),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got: Vec<Bytes> = reader
            .fetch()
            .await
            .expect("fetch")
            .into_iter()
            .flat_map(|p| p.records)
            .filter_map(|r| r.value)
            .collect();
        if !got.is_empty() {
            assert_eq!(got[0], b(value));
            return;
        }
        assert!(Instant::now() < deadline, "record never fetched");
    }
}

// ---- ACLs ---------------------------------------------------------------------------------------

/// What a snapshot flow's principal needs, except (when `txn` is false) the transactional-id prefix.
fn flow_acls(
    who: &str,
    input: &str,
    snapshots: &str,
    group: &str,
    txn_prefix: Option<&str>,
) -> Vec<AclCreation> {
    let p = format!("User:{who}");
    let mut acls = vec![
        allow(&p, TOPIC, input, LITERAL, READ),
        allow(&p, TOPIC, input, LITERAL, DESCRIBE),
        allow(&p, TOPIC, snapshots, LITERAL, READ),
        allow(&p, TOPIC, snapshots, LITERAL, WRITE),
        allow(&p, TOPIC, snapshots, LITERAL, DESCRIBE),
        allow(&p, GROUP, group, LITERAL, READ),
        allow(&p, GROUP, group, LITERAL, DESCRIBE),
    ];
    if let Some(prefix) = txn_prefix {
        acls.push(allow(&p, TRANSACTIONAL_ID, prefix, PREFIXED, WRITE));
        acls.push(allow(&p, TRANSACTIONAL_ID, prefix, PREFIXED, DESCRIBE));
    }
    acls
}

/// ACLs reach the broker's authorizer through the metadata log, a moment after CreateAcls returns: waits
/// until `client` may describe `topic`.
async fn wait_until_visible(client: &Client, topic: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let code = match client.metadata(&[topic]).await {
            Ok(meta) => meta.topics.get(topic).map(|t| t.error),
            Err(e) => e.error_code(),
        };
        if code == Some(ErrorCode::None) {
            return;
        }
        assert!(Instant::now() < deadline, "ACL never took effect: {code:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Flow {
    input: String,
    snapshots: String,
    group: String,
    txn_prefix: String,
}

async fn flow_topics(admin: &Client) -> Flow {
    let f = Flow {
        input: unique("sec-input"),
        snapshots: unique("sec-snapshots"),
        group: unique("sec-group"),
        txn_prefix: unique("sec-txn"),
    };
    snapfence::admin::create_topic(admin, &f.input, 1, -1, &[])
        .await
        .unwrap();
    snapfence::admin::create_topic(admin, &f.snapshots, 1, -1, &[("cleanup.policy", "compact")])
        .await
        .unwrap();
    f
}

/// Joins `group` as a member subscribed to `input` and polls until the join completed.
async fn member(client: &Client, group: &str, input: &str) -> GroupConsumer {
    let mut cfg = GroupConsumerConfig::new(GroupConfig::new(group));
    cfg.reader.reset = OffsetReset::Earliest;
    let mut m = GroupConsumer::subscribe(client.clone(), cfg, [input.to_owned()], ())
        .await
        .expect("subscribe");
    let handle = m.group_metadata();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handle.current().is_none() {
        assert!(Instant::now() < deadline, "the member never joined");
        m.poll(Duration::from_millis(200)).await.expect("poll");
    }
    m
}

// ---- tests --------------------------------------------------------------------------------------

/// Each mechanism logs in and the logged-in client produces and fetches; the second round runs after the
/// broker's session lifetime has passed, so it proves a re-opened connection authenticates again (the
/// broker drops any request on an expired session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mechanism_logs_in_produces_and_fetches() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let admin = login(&kafka, SaslMechanism::ScramSha512, ADMIN).await;
        let topic = unique("sec-mech");
        snapfence::admin::create_topic(&admin, &topic, 1, -1, &[])
            .await
            .unwrap();
        let mut clients = Vec::new();
        for m in MECHANISMS {
            let c = login(&kafka, m, ADMIN).await;
            produce_and_fetch(&c, &topic, &format!("{m} first")).await;
            clients.push((m, c));
        }
        tokio::time::sleep(Duration::from_millis(4500)).await;
        for (m, c) in &clients {
            // One attempt only: a request on a connection whose session expired would fail here.
            let (meta, _) = c
                .send_once(Target::Any, |_| {
                    MetadataRequest::default().with_topics(Some(vec![]))
                })
                .await
                .unwrap_or_else(|e| {
                    panic!("{} {m} after the session lifetime: {e}", kafka.version())
                });
            assert!(!meta.brokers.is_empty());
            produce_and_fetch(c, &topic, &format!("{m} second")).await;
        }
    }
}

/// A principal allowed on the transactional-id prefix, the snapshot topic, the input topic and the group
/// acquires a snapshot partition, writes through a group-fenced transaction and recovers what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_with_the_acls_runs_the_snapshot_store() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let admin = login(&kafka, SaslMechanism::ScramSha512, ADMIN).await;
        let f = flow_topics(&admin).await;
        create_acls(
            &admin,
            flow_acls(
                ALICE.0,
                &f.input,
                &f.snapshots,
                &f.group,
                Some(&f.txn_prefix),
            ),
        )
        .await;
        let alice = login(&kafka, SaslMechanism::ScramSha256, ALICE).await;
        wait_until_visible(&alice, &f.snapshots).await;
        let m = member(&alice, &f.group, &f.input).await;
        let store = SnapshotStore::acquire(
            alice.clone(),
            SnapshotConfig::new(&f.snapshots, &f.txn_prefix),
            Assignment {
                input: TopicPartition::new(f.input.as_str(), 0),
                assigned_offset: 0,
                metadata: Arc::new(m.group_metadata()),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{}: acquire as alice: {e}", kafka.version()));
        store.write(b("k1"), Some(b("v1"))).await.unwrap();
        store.write(b("k2"), Some(b("v2"))).await.unwrap();
        store.close().await;
        let mut log = PartitionLog::new(alice.clone(), &f.snapshots, 0);
        let cfg = RecoveryConfig {
            stall_timeout: Some(Duration::from_secs(30)),
            ..RecoveryConfig::default()
        };
        let state = recover(&mut log, 0, &cfg).await.unwrap().0;
        assert_eq!(state.len(), 2, "{}", kafka.version());
        assert_eq!(state.get(b("k1")), Some(&*b("v1")));
        assert_eq!(state.get(b("k2")), Some(&*b("v2")));
    }
}

/// Without the transactional-id ACL the store fails at acquisition, fatally, within seconds, with an
/// error that names the refusal and the transactional id, instead of retrying until a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_transactional_id_acl_fails_fast_and_names_the_resource() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let admin = login(&kafka, SaslMechanism::ScramSha512, ADMIN).await;
        let f = flow_topics(&admin).await;
        create_acls(
            &admin,
            flow_acls(BOB.0, &f.input, &f.snapshots, &f.group, None),
        )
        .await;
        let bob = login(&kafka, SaslMechanism::ScramSha512, BOB).await;
        wait_until_visible(&bob, &f.snapshots).await;
        let m = member(&bob, &f.group, &f.input).await;
        let config = SnapshotConfig::new(&f.snapshots, &f.txn_prefix);
        let txn_id = config.transactional_id(0);
        let began = Instant::now();
        let err = SnapshotStore::acquire(
            bob.clone(),
            config,
            Assignment {
                input: TopicPartition::new(f.input.as_str(), 0),
                assigned_offset: 0,
                metadata: Arc::new(m.group_metadata()),
            },
        )
        .await
        .expect_err("acquire without the transactional-id ACL must fail");
        let took = began.elapsed();
        let text = err.to_string();
        assert!(
            took < Duration::from_secs(5),
            "{}: took {took:?} to fail: {text}",
            kafka.version()
        );
        assert!(
            text.contains("TRANSACTIONAL_ID_AUTHORIZATION_FAILED") && text.contains(&txn_id),
            "{}: {text}",
            kafka.version()
        );
    }
}

/// A TCP relay in front of one broker that counts the connections made through it.
async fn counting_relay(target: String) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, count)
}

/// A wrong password fails with an authentication error that names the mechanism and carries the broker's
/// message, within a second or two, after exactly one connection: no retry storm against the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_once_and_fast() {
    for spec in specs() {
        let kafka = cluster(spec).await;
        let broker = kafka.listener_bootstrap(Listener::SaslPlaintext);
        for m in MECHANISMS {
            let (relay, connections) = counting_relay(broker.clone()).await;
            let began = Instant::now();
            let err = Client::connect(sasl_config(&relay, m, (ALICE.0, "not-the-password")))
                .await
                .expect_err("a wrong password must not log in");
            let took = began.elapsed();
            assert!(
                took < Duration::from_secs(3),
                "{} {m}: took {took:?}",
                kafka.version()
            );
            assert_eq!(
                connections.load(Ordering::SeqCst),
                1,
                "{} {m}: one connection attempt, no retries",
                kafka.version()
            );
            match &err {
                NetError::Authentication {
                    mechanism,
                    reason: AuthFailure::Rejected { code, message },
                    ..
                } => {
                    assert_eq!(*mechanism, m);
                    assert_eq!(*code, ErrorCode::SaslAuthenticationFailed);
                    assert!(!message.is_empty(), "the broker's message is kept");
                }
                other => panic!(
                    "{} {m}: expected an authentication error, got {other}",
                    kafka.version()
                ),
            }
            assert!(!err.is_retriable() && err.is_authentication());
            assert!(err.to_string().contains(m.name()), "{err}");
        }
        // An unknown user fails the same way.
        let err = Client::connect(sasl_config(
            &broker,
            SaslMechanism::ScramSha256,
            ("mallory", "x"),
        ))
        .await
        .expect_err("unknown user");
        assert!(err.is_authentication(), "{err}");
    }
}

/// Credentials revoked while a client is connected: once its session lifetime ends, the pool re-opens the
/// connection, the new login is refused, and the request fails at once with the authentication error
/// instead of going round the routing loop's retries (about 15 s with the default back-off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_refused_on_reconnect_is_not_retried() {
    let kafka = cluster(specs()[0].clone()).await;
    let admin = login(&kafka, SaslMechanism::ScramSha512, ADMIN).await;
    let dave = login(&kafka, SaslMechanism::ScramSha256, DAVE).await;
    let metadata = || MetadataRequest::default().with_topics(Some(vec![]));
    dave.send(Target::Any, |_| metadata())
        .await
        .expect("dave is logged in");
    let (answer, _) = admin
        .send(Target::Any, |_| {
            AlterUserScramCredentialsRequest::default().with_deletions(vec![
                ScramCredentialDeletion::default()
                    .with_name(StrBytes::from_static_str(DAVE.0))
                    .with_mechanism(1), // SCRAM-SHA-256
            ])
        })
        .await
        .expect("AlterUserScramCredentials");
    assert_eq!(
        answer.results[0].error_code, 0,
        "{:?}",
        answer.results[0].error_message
    );
    // Past the 4 s session lifetime, so every connection dave had is retired.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let began = Instant::now();
    let err = dave
        .send(Target::Any, |_| metadata())
        .await
        .expect_err("dave's credentials are gone");
    let took = began.elapsed();
    assert!(
        matches!(err, NetError::Authentication { .. }),
        "expected the login failure itself, not retries: {err}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}: {err}");
}

// ---- TLS (feature `tls`) --------------------------------------------------------------------------

#[cfg(feature = "tls")]
mod tls {
    use std::sync::OnceLock;

    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use snapfence::net::TlsConfig;

    use super::*;

    /// The client certificate's subject; as a principal `User:CN=snapfence-client`.
    const CLIENT_CN: &str = "snapfence-client";

    /// Certificates made for this test process: a CA, a broker certificate for 127.0.0.1 and a client
    /// certificate signed by it, and an unrelated CA no broker certificate chains to.
    struct Pki {
        ca_pem: String,
        server_chain_pem: String,
        server_key_pem: String,
        client_cert_pem: String,
        client_key_pem: String,
        stranger_ca_pem: String,
    }

    fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        (pem, Issuer::new(params, key))
    }

    fn pki() -> &'static Pki {
        static PKI: OnceLock<Pki> = OnceLock::new();
        PKI.get_or_init(|| {
            let (ca_pem, issuer) = ca("snapfence test CA");
            let (stranger_ca_pem, _) = ca("someone else's CA");

            let server_key = KeyPair::generate().unwrap();
            let mut server =
                CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
            server.distinguished_name = DistinguishedName::new();
            server.distinguished_name.push(DnType::CommonName, "kafka");
            server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            let server_cert = server.signed_by(&server_key, &issuer).unwrap();

            let client_key = KeyPair::generate().unwrap();
            let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
            client.distinguished_name = DistinguishedName::new();
            client
                .distinguished_name
                .push(DnType::CommonName, CLIENT_CN);
            client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            let client_cert = client.signed_by(&client_key, &issuer).unwrap();

            Pki {
                server_chain_pem: format!("{}{}", server_cert.pem(), ca_pem),
                ca_pem,
                server_key_pem: server_key.serialize_pem(),
                client_cert_pem: client_cert.pem(),
                client_key_pem: client_key.serialize_pem(),
                stranger_ca_pem,
            }
        })
    }

    fn tls_spec() -> ClusterSpec {
        let pki = pki();
        let mut security = users();
        // The client certificate's principal is deliberately not a super user: the mTLS test grants it
        // one topic and checks it gets exactly that, which tells its principal from User:ANONYMOUS.
        security.tls = Some(protocol_tests::TlsSpec {
            server_cert_chain_pem: pki.server_chain_pem.clone(),
            server_key_pem: pki.server_key_pem.clone(),
            client_ca_pem: pki.ca_pem.clone(),
        });
        ClusterSpec::kafka4().with_security(security)
    }

    fn server_auth() -> TlsConfig {
        TlsConfig::new(pki().ca_pem.clone())
    }

    fn mutual() -> TlsConfig {
        server_auth().with_client_cert(pki().client_cert_pem.clone(), pki().client_key_pem.clone())
    }

    async fn connect(config: ClientConfig) -> Result<Client, NetError> {
        Client::connect(config).await
    }

    async fn topic(client: &Client) -> String {
        let t = unique("sec-tls");
        snapfence::admin::create_topic(client, &t, 1, -1, &[])
            .await
            .unwrap();
        t
    }

    /// Server-authenticated TLS: the client checks the broker's certificate against the test CA and then
    /// produces and fetches inside the TLS session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_produces_and_fetches() {
        let kafka = cluster(tls_spec()).await;
        let bootstrap = kafka.listener_bootstrap(Listener::Ssl);
        let client = connect(ClientConfig::new(&bootstrap).with_tls(server_auth()))
            .await
            .expect("TLS connect");
        let t = topic(&client).await;
        produce_and_fetch(&client, &t, "over tls").await;
    }

    /// A broker whose certificate does not chain to the configured CA is refused with a TLS error, once
    /// and at once (no retries, no fallback to plaintext).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_broker_certificate_is_refused() {
        let kafka = cluster(tls_spec()).await;
        let bootstrap = kafka.listener_bootstrap(Listener::Ssl);
        let began = Instant::now();
        let err = connect(
            ClientConfig::new(&bootstrap).with_tls(TlsConfig::new(pki().stranger_ca_pem.clone())),
        )
        .await
        .expect_err("a broker signed by another CA must be refused");
        assert!(matches!(err, NetError::Tls { .. }), "{err}");
        assert!(err.is_fatal_connect() && !err.is_retriable(), "{err}");
        assert!(began.elapsed() < Duration::from_secs(5));
        // Asking for another name than the certificate carries fails the same way.
        let mut wrong_name = server_auth();
        wrong_name.server_name = Some("not-the-broker.example".into());
        let err = connect(ClientConfig::new(&bootstrap).with_tls(wrong_name))
            .await
            .expect_err("the certificate does not name not-the-broker.example");
        assert!(matches!(err, NetError::Tls { .. }), "{err}");
    }

    /// Mutual TLS: with the client certificate the client works, as the principal named by the
    /// certificate's subject (it reaches the one topic granted to `User:CN=snapfence-client` and is refused
    /// another, which `User:ANONYMOUS`, a super user, would not be); without a certificate the broker
    /// refuses the session.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mutual_tls_needs_the_client_certificate() {
        let kafka = cluster(tls_spec()).await;
        let bootstrap = kafka.listener_bootstrap(Listener::Mtls);
        let admin = connect(ClientConfig::new(kafka.bootstrap())).await.unwrap();
        let (granted, other) = (topic(&admin).await, topic(&admin).await);
        let principal = format!("User:CN={CLIENT_CN}");
        create_acls(
            &admin,
            [READ, WRITE, DESCRIBE]
                .into_iter()
                .map(|op| allow(&principal, TOPIC, &granted, LITERAL, op))
                .collect(),
        )
        .await;
        let client = connect(ClientConfig::new(&bootstrap).with_tls(mutual()))
            .await
            .expect("mTLS connect");
        wait_until_visible(&client, &granted).await;
        produce_and_fetch(&client, &granted, "over mtls").await;
        let code = match client.metadata(&[&other]).await {
            Ok(meta) => meta.topics.get(other.as_str()).map(|t| t.error),
            Err(e) => e.error_code(),
        };
        assert_eq!(code, Some(ErrorCode::TopicAuthorizationFailed));

        let mut config = ClientConfig::new(&bootstrap).with_tls(server_auth());
        config.connect_timeout = Duration::from_secs(5);
        let err = connect(config)
            .await
            .expect_err("the MTLS listener requires a client certificate");
        // Under TLS 1.3 the broker checks the client certificate after the client's side of the
        // handshake is done, so the refusal arrives as an alert on the first read.
        let text = err.to_string().to_lowercase();
        assert!(
            text.contains("certificate") || text.contains("alert") || text.contains("closed"),
            "{err}"
        );
    }

    /// SASL_SSL: SCRAM inside TLS, and the login is still checked (a wrong password is refused).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sasl_ssl_logs_in_inside_tls() {
        let kafka = cluster(tls_spec()).await;
        let bootstrap = kafka.listener_bootstrap(Listener::SaslSsl);
        let config =
            sasl_config(&bootstrap, SaslMechanism::ScramSha512, ADMIN).with_tls(server_auth());
        let client = connect(config).await.expect("SASL_SSL connect");
        let t = topic(&client).await;
        produce_and_fetch(&client, &t, "over sasl_ssl").await;

        let bad = sasl_config(&bootstrap, SaslMechanism::ScramSha512, (ADMIN.0, "wrong"))
            .with_tls(server_auth());
        let err = connect(bad).await.expect_err("wrong password");
        assert!(err.is_authentication(), "{err}");
    }
}
