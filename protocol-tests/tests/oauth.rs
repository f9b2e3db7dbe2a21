//! SASL/OAUTHBEARER against a real Kafka 4.4 broker whose SASL listener validates with Kafka's own
//! unsecured JWS validator (no signature check; it accepts any extension, so the extension grammar is
//! checked in the unit tests of `net/oauth.rs`): a provider's token logs in and the client produces and
//! fetches; an expired token is refused with the broker's error challenge, typed, and the provider is
//! asked again; and a flow folds through many token lifetimes, with `connections.max.reauth.ms` at 0
//! and above 0, losing nothing, its sessions renewed in place (KIP-368) on the connections it has.
//! A SCRAM session is renewed in place the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol_tests::oauth::{unsecured_jwt, unsecured_token};
use protocol_tests::tally::{fold_all, Counter, Tally};
use protocol_tests::{cluster, unique, ClusterSpec, KafkaCluster, Listener, SecuritySpec};
use snapfence::consumer::{
    GroupConfig, GroupConsumerConfig, OffsetReset, PartitionReader, ReaderConfig, StartAt,
    TopicPartition as ConsumerTp,
};
use snapfence::net::{
    AuthFailure, Client, ClientConfig, DialFuture, Dialer, NetError, OAuthBearer, OAuthBearerToken,
    SaslConfig, SaslMechanism, Target, TcpDialer, TokenError,
};
use snapfence::producer::{Producer, ProducerConfig, ProducerRecord};
use snapfence::snapshot::{Flow, FlowConfig, SnapshotConfig};

/// The principal the tokens name; a super user, so no ACLs are needed.
const SUB: &str = "admin";

fn spec(reauth_ms: Option<&str>) -> ClusterSpec {
    let spec = ClusterSpec::kafka4().with_security(SecuritySpec {
        users: vec![("admin".into(), "admin-secret".into())],
        super_users: vec![format!("User:{SUB}")],
        tls: None,
    });
    match reauth_ms {
        Some(ms) => spec.with_prop("connections.max.reauth.ms", ms),
        None => spec,
    }
}

/// A provider of tokens valid for `lifetime`, counting its calls.
fn provider(lifetime: Duration) -> (OAuthBearer, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let oauth = OAuthBearer::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(unsecured_token(SUB, lifetime).with_extension("traceId", "snapfence-test")) }
    });
    (oauth, calls)
}

fn config(kafka: &KafkaCluster, oauth: OAuthBearer) -> ClientConfig {
    ClientConfig::new(kafka.listener_bootstrap(Listener::SaslPlaintext))
        .with_sasl(SaslConfig::oauthbearer(oauth))
}

/// The default TCP dialer, counting the connections it opens.
#[derive(Debug, Default, Clone)]
struct CountingDialer(Arc<AtomicU32>);

impl Dialer for CountingDialer {
    fn dial<'a>(&'a self, addr: &'a str, tcp: &'a TcpDialer) -> DialFuture<'a> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tcp.dial(addr, tcp)
    }
}

/// A token from the provider logs in (its extension passed through); the client creates a topic,
/// produces a record and fetches it back, all over OAUTHBEARER connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_token_logs_in_produces_and_fetches() {
    let kafka = cluster(spec(None)).await;
    let (oauth, calls) = provider(Duration::from_secs(600));
    let client = Client::connect(config(&kafka, oauth)).await.unwrap();
    let topic = unique("oauth");
    snapfence::admin::create_topic(&client, &topic, 1, -1, &[])
        .await
        .unwrap();
    let producer = Producer::new(client.clone(), ProducerConfig::default())
        .await
        .unwrap();
    let meta = producer
        .send(ProducerRecord::new(topic.as_str(), Some(Bytes::from_static(b"v"))).partition(0))
        .await
        .unwrap()
        .await
        .unwrap();
    producer.close().await;
    let mut reader = PartitionReader::new(client.clone(), ReaderConfig::default());
    reader.assign(
        ConsumerTp::new(topic.as_str(), 0),
        StartAt::Offset(meta.offset.unwrap()),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got: Vec<Bytes> = reader
            .fetch()
            .await
            .unwrap()
            .into_iter()
            .flat_map(|p| p.records)
            .filter_map(|r| r.value)
            .collect();
        if !got.is_empty() {
            assert_eq!(got, [Bytes::from_static(b"v")]);
            break;
        }
        assert!(Instant::now() < deadline, "never fetched");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one token serves every connection until it is due"
    );

    // The operator tool over the same listener, its token in a file.
    let dir = std::env::temp_dir().join(unique("oauth-cli"));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(
        &token_file,
        unsecured_token(SUB, Duration::from_secs(600)).value,
    )
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut stdin = std::io::empty();
    let mut io = snapfence_cli::Io {
        out: &mut out,
        err: &mut err,
        input: &mut stdin,
        progress: false,
    };
    let bootstrap = kafka.listener_bootstrap(Listener::SaslPlaintext);
    let argv = [
        "snapfence",
        "--bootstrap",
        bootstrap.as_str(),
        "--sasl-mechanism",
        "oauthbearer",
        "--sasl-oauth-token-file",
        token_file.to_str().unwrap(),
        "inspect",
        topic.as_str(),
    ];
    let code = snapfence_cli::run(argv.map(std::ffi::OsString::from), &mut io).await;
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(topic.as_str()), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An expired token: the broker answers with its error challenge, and the login fails once, typed as
/// a refused token with the challenge's status, without a retry. The provider is asked again for the
/// next login, whose token works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused_typed_and_asked_for_again() {
    let kafka = cluster(spec(None)).await;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let oauth = OAuthBearer::new(move || {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let token = if n == 0 {
                // Expired a minute ago: the validator refuses it.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                OAuthBearerToken::new(
                    unsecured_jwt(SUB, now - 120, now - 60),
                    std::time::SystemTime::now(),
                )
            } else {
                unsecured_token(SUB, Duration::from_secs(600))
            };
            Ok::<OAuthBearerToken, TokenError>(token)
        }
    });
    let started = Instant::now();
    match Client::connect(config(&kafka, oauth.clone())).await {
        Err(NetError::Authentication {
            reason: AuthFailure::TokenRefused(refusal),
            ..
        }) => {
            assert_eq!(
                refusal.status.as_deref(),
                Some("invalid_token"),
                "{}",
                refusal.challenge
            );
        }
        other => panic!("an expired token must be refused: {:?}", other.err()),
    }
    assert!(started.elapsed() < Duration::from_secs(10), "not retried");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let client = Client::connect(config(&kafka, oauth)).await.unwrap();
    client.metadata(&[]).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the refused token was forgotten"
    );
}

/// A flow folds a steady input for several lifetimes of its 6-second tokens: nothing is lost, no poll
/// fails, and every key's state is the fold of its events. `connections.max.reauth.ms` is 0 (the
/// broker's default) here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_outlives_its_tokens() {
    flow_outlives_tokens(spec(None), "0").await;
}

/// The same with `connections.max.reauth.ms` at 4 s, shorter than a token's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_outlives_its_tokens_with_reauthentication_on() {
    flow_outlives_tokens(spec(Some("4000")), "4000").await;
}

async fn flow_outlives_tokens(spec: ClusterSpec, reauth: &str) {
    let kafka = cluster(spec).await;
    let lifetime = Duration::from_secs(6);
    let (oauth, calls) = provider(lifetime);
    let dials = CountingDialer::default();
    let client = Client::connect(config(&kafka, oauth).with_dialer(dials.clone()))
        .await
        .unwrap();
    let (input, snapshots) = protocol_tests::flow_topics(&client, "oauth-flow", 2).await;
    let mut group = GroupConfig::new(unique("oauth-group"));
    group.session_timeout = Duration::from_secs(10);
    group.heartbeat_interval = Duration::from_millis(500);
    let mut consumer = GroupConsumerConfig::new(group);
    consumer.reader.reset = OffsetReset::Earliest;
    let flow_config = FlowConfig::new(
        consumer,
        &input,
        SnapshotConfig::new(&snapshots, unique("oauth-tx")),
    );
    let mut flow = Flow::start(client.clone(), flow_config, Counter)
        .await
        .unwrap();
    // The input arrives over the plaintext listener, steadily, for three token lifetimes.
    let plain = Client::connect(ClientConfig::new(kafka.bootstrap()))
        .await
        .unwrap();
    let producer = Producer::new(plain, ProducerConfig::default())
        .await
        .unwrap();
    flow.poll_once(Duration::from_millis(100)).await.unwrap();
    // Every connection the flow uses is open now, well before the first session is due.
    let at_start = dials.0.load(Ordering::SeqCst);
    let mut events: Vec<(Bytes, Bytes)> = Vec::new();
    let until = Instant::now() + lifetime * 3;
    let mut i = 0u32;
    while Instant::now() < until {
        for _ in 0..5 {
            let key = Bytes::from(format!("k{}", i % 7));
            let value = Bytes::from(format!("v{i}"));
            producer
                .send(ProducerRecord::new(input.as_str(), Some(value.clone())).key(key.clone()))
                .await
                .unwrap()
                .await
                .unwrap();
            events.push((key, value));
            i += 1;
        }
        flow.poll_once(Duration::from_millis(100)).await.unwrap();
    }
    let mut expected: HashMap<Bytes, Vec<Bytes>> = HashMap::new();
    for (k, v) in &events {
        expected.entry(k.clone()).or_default().push(v.clone());
    }
    let expected: HashMap<Bytes, Tally> = expected
        .into_iter()
        .filter_map(|(k, vs)| Some((k, fold_all(&vs)?)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        flow.poll_once(Duration::from_millis(100)).await.unwrap();
        let mut state = HashMap::new();
        for p in 0..2 {
            state.extend(flow.state(p).unwrap_or_default());
        }
        if state == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flow never folded every event"
        );
    }
    flow.persist().await.unwrap();
    flow.commit().await.unwrap();
    flow.close().await.unwrap();
    let asked = calls.load(Ordering::SeqCst);
    let opened = dials.0.load(Ordering::SeqCst);
    eprintln!(
        "connections.max.reauth.ms={reauth}: {} events over {:?}, the provider asked {asked} times, {opened} connection(s) opened",
        events.len(),
        lifetime * 3
    );
    assert!(
        asked >= 3,
        "every login after a token's refresh point takes a new one: asked {asked} times"
    );
    // Each session was renewed on its connection with a fresh token, not replaced by a new one.
    assert_eq!(opened, at_start, "sessions renewed in place");
}

/// A SCRAM session with `connections.max.reauth.ms` at 4 s is renewed in place twice or more while a
/// client keeps sending over it: every request is answered and the client opens one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_session_is_renewed_in_place() {
    let kafka = cluster(spec(Some("4000"))).await;
    let dials = CountingDialer::default();
    let config = ClientConfig::new(kafka.listener_bootstrap(Listener::SaslPlaintext))
        .with_sasl(SaslConfig::new(
            SaslMechanism::ScramSha512,
            "admin",
            "admin-secret",
        ))
        .with_dialer(dials.clone());
    let client = Client::connect(config).await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut answered = 0;
    while Instant::now() < until {
        let metadata =
            || kafka_protocol::messages::MetadataRequest::default().with_topics(Some(vec![]));
        client.send(Target::Any, |_| metadata()).await.unwrap();
        answered += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered > 100, "{answered}");
    assert_eq!(
        dials.0.load(Ordering::SeqCst),
        1,
        "one connection throughout"
    );
}
