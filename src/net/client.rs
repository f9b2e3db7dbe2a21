//! The client: a pool of broker connections, the metadata and coordinator caches, and the routing loop
//! that sends each request to the right broker and retries when the cluster moves under it.
//!
//! # References
//! - Metadata (key 3), FindCoordinator (key 10; batched form from v4, KIP-699)
//! - KIP-590: in KRaft mode any broker forwards admin requests to the active controller

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{FindCoordinatorRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::broker::{self, BrokerConn};
use super::metadata::{BrokerInfo, ClusterMetadata, LeaderInfo};
use super::retry::{Backoff, Verdict};
use super::{ClientConfig, NetError};
use crate::telemetry::{self, REAUTHENTICATIONS, RECONNECTS, REQUEST_RETRIES};
use crate::wire::{client_versions_of, ApiRequest, BrokerApiVersions, ErrorCode, Features};

/// Which coordinator a key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CoordinatorKind {
    /// The group coordinator of a consumer group id.
    Group,
    /// The transaction coordinator of a transactional id.
    Transaction,
}

impl CoordinatorKind {
    /// The FindCoordinator `key_type` value (a wire detail, so not public).
    pub(crate) fn key_type(self) -> i8 {
        match self {
            CoordinatorKind::Group => 0,
            CoordinatorKind::Transaction => 1,
        }
    }
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Any reachable broker (metadata, FindCoordinator, admin requests).
    Any,
    /// One broker by node id.
    Broker(i32),
    /// The current leader of a partition.
    Leader {
        /// The topic.
        topic: Arc<str>,
        /// The partition index.
        partition: i32,
    },
    /// The coordinator of a group or transactional id.
    Coordinator {
        /// Group or transaction coordinator.
        kind: CoordinatorKind,
        /// The group id or transactional id.
        key: Arc<str>,
    },
}

impl Target {
    /// The leader of `topic`/`partition`.
    pub fn leader(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Target::Leader {
            topic: topic.into(),
            partition,
        }
    }

    /// The group coordinator of `group_id`.
    pub fn group(group_id: impl Into<Arc<str>>) -> Self {
        Target::Coordinator {
            kind: CoordinatorKind::Group,
            key: group_id.into(),
        }
    }

    /// The transaction coordinator of `transactional_id`.
    pub fn transaction(transactional_id: impl Into<Arc<str>>) -> Self {
        Target::Coordinator {
            kind: CoordinatorKind::Transaction,
            key: transactional_id.into(),
        }
    }
}

/// Per-call adjustments to [`Client::call`].
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Replaces [`ClientConfig::request_timeout`] for this call (e.g. a JoinGroup that may legitimately
    /// wait for a whole rebalance).
    pub timeout: Option<Duration>,
    /// Fail with [`NetError::UnsupportedVersion`] rather than use a version below this.
    pub min_version: Option<i16>,
    /// Never use a version above this.
    pub max_version: Option<i16>,
    /// Replaces [`ClientConfig::max_retries`] for this call; `Some(0)` sends exactly once.
    pub max_retries: Option<u32>,
    /// Which of the broker's [`ClientConfig::connections_per_broker`] connections carries the call
    /// (taken modulo their number). `None` lets the target choose: a partition's leader by
    /// [`connection_of_partition`], a coordinator by [`connection_of_key`] of its group or
    /// transactional id, any other target the first connection.
    pub connection: Option<usize>,
}

/// The connection of a broker that carries `topic`/`partition`'s requests when a broker has `lanes`
/// connections: the same one for as long as the client lives, so a partition's requests stay in the
/// order they were sent, and consecutive partitions of one topic on different connections.
pub fn connection_of_partition(topic: &str, partition: i32, lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    let spread = u64::from(fnv1a(topic.as_bytes())) + u64::from(partition.unsigned_abs());
    (spread % lanes as u64) as usize
}

/// The connection of a coordinator that carries the requests of group or transactional id `key` when
/// a broker has `lanes` connections: always the same one, so that id's requests stay in order.
pub fn connection_of_key(key: &str, lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    (fnv1a(key.as_bytes()) as u64 % lanes as u64) as usize
}

/// 32-bit FNV-1a: a fixed hash (not `std`'s seeded one), so a key's connection is the same in every
/// process and every run, which keeps benchmarks and traces comparable.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// A connection to a Kafka cluster. Cheap to clone; clones share connections and caches.
///
/// Every producer, consumer and flow takes a `Client`; give them clones of one.
///
/// ```no_run
/// # async fn demo() -> Result<(), snapfence::net::NetError> {
/// use snapfence::net::{Client, ClientConfig};
///
/// let client = Client::connect(ClientConfig::new("localhost:9092,localhost:9093")).await?;
/// snapfence::admin::create_topic(&client, "events", 3, -1, &[]).await?; // -1: the broker's default replication
/// let metadata = client.metadata(&["events"]).await?;
/// for broker in metadata.brokers.values() {
///     println!("broker {} at {}", broker.node_id, broker.addr());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// The connection pool, the routing state and the caches that every clone of a [`Client`] shares.
///
/// Which lock guards what. The pool: `slots` guards only the map from (node id, lane) to slot, held just long
/// enough to find or add one; each slot's own async lock guards that node's connection and is held
/// across a connect, so that callers arriving meanwhile wait for that attempt instead of opening a
/// connection each; `bootstrap` does the same for a bootstrap connection no node id matched. Routing
/// and caches have one std lock each: `metadata` (brokers, topics and leaders: the route of a
/// `Target::Leader` and the address of every connect), `coordinators` (the route of a
/// `Target::Coordinator`), `features` (the newest finalized features seen) and `versions` (each
/// node's last ApiVersions table). A std lock is held for one short read or update: never held
/// across an await, never while taking another std lock. The one nesting is an async lock (a slot or
/// `bootstrap`) held while taking a std lock or `try_lock`ing a slot, which cannot wait in a circle.
struct Inner {
    config: ClientConfig,
    /// One slot per connection, keyed by node id and lane (`0..connections_per_broker`); the async
    /// lock makes concurrent callers of a connection share one connect attempt.
    slots: Mutex<HashMap<(i32, usize), Slot>>,
    /// The connection made to a bootstrap address whose node id could not be matched; used only when
    /// no known broker is reachable.
    bootstrap: tokio::sync::Mutex<Option<BrokerConn>>,
    /// The ApiVersions table each node last reported, bootstrap connections under -1. Not a copy of
    /// the slots: an entry outlives its connection (a failed reconnect leaves the slot empty, the
    /// table stays), and it is read without waiting on a slot that is mid-connect, which the plain fn
    /// `api_version` could not do. Reading the slots instead would change what `api_version` and
    /// `broker_versions` answer in exactly those cases.
    versions: Mutex<HashMap<i32, Arc<BrokerApiVersions>>>,
    /// The newest finalized features any connection reported (highest feature epoch).
    features: Mutex<Features>,
    /// Brokers, topics and partition leaders; replaced whole, so readers keep a consistent snapshot.
    metadata: Mutex<Arc<ClusterMetadata>>,
    /// The coordinator node of each group or transactional id, until a response says it moved.
    coordinators: Mutex<HashMap<(CoordinatorKind, String), i32>>,
    /// Rotates the starting broker for [`Target::Any`] so that load and failures spread.
    next_any: AtomicUsize,
    /// Brokers on which a re-authentication in place failed once: their sessions are renewed by a new
    /// connection from then on.
    renew_by_reconnect: Mutex<std::collections::HashSet<i32>>,
}

/// One connection of the pool: empty until first used, and after a failed reconnect.
type Slot = Arc<tokio::sync::Mutex<Option<BrokerConn>>>;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("bootstrap", &self.inner.config.bootstrap)
            .field("client_id", &self.inner.config.client_id)
            .field("brokers", &self.cached_metadata().brokers.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a plain read or replace of a cache entry; a panic inside one
    // cannot leave a half-written value, so a poisoned lock is used as is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Connects to the first reachable bootstrap address, runs the ApiVersions handshake and reads the
    /// broker list.
    ///
    /// Cancel-safe: dropping the future drops whatever connection was being opened.
    pub async fn connect(config: ClientConfig) -> Result<Client, NetError> {
        if config.bootstrap.is_empty() {
            return Err(NetError::Config("no bootstrap address".into()));
        }
        if config.connections_per_broker == 0 {
            return Err(NetError::Config(
                "connections_per_broker must be at least 1".into(),
            ));
        }
        let client = Client {
            inner: Arc::new(Inner {
                config,
                slots: Mutex::default(),
                bootstrap: tokio::sync::Mutex::new(None),
                versions: Mutex::default(),
                features: Mutex::default(),
                metadata: Mutex::default(),
                coordinators: Mutex::default(),
                next_any: AtomicUsize::new(0),
                renew_by_reconnect: Mutex::default(),
            }),
        };
        client.bootstrap_connection().await?;
        Ok(client)
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// A fresh [`Backoff`] with this client's retry settings, for callers' own retry loops.
    pub fn backoff(&self) -> Backoff {
        self.inner.config.backoff()
    }

    unstable_pub! {
        /// Sends a request to `target` and returns the decoded response with the version it was sent at.
        ///
        /// The version is the highest that both this client and the chosen broker support; `build` is
        /// called with it (once per attempt) to make the request. Transport failures (connection refused or
        /// lost, timeout) reset the connection, forget the route, and retry with back-off. Errors inside the
        /// response body are the caller's to read: see [`Client::call`] to have them retried too.
        ///
        /// Cancel-safe: dropping the future never leaves a partial frame on a connection, but a request
        /// already written may still be processed by the broker.
        pub async fn send<R: ApiRequest>(
            &self,
            target: Target,
            build: impl FnMut(i16) -> R,
        ) -> Result<(R::Response, i16), NetError> {
            self.call(target, &CallOptions::default(), build, |r, v| {
                Verdict::Done((r, v))
            })
            .await
        }
    }

    unstable_pub! {
        /// As [`Client::send`] but a single attempt: no retry on any error.
        ///
        /// Cancel-safe in the same sense as [`Client::send`].
        pub async fn send_once<R: ApiRequest>(
            &self,
            target: Target,
            build: impl FnMut(i16) -> R,
        ) -> Result<(R::Response, i16), NetError> {
            let options = CallOptions {
                max_retries: Some(0),
                ..CallOptions::default()
            };
            self.call(target, &options, build, |r, v| Verdict::Done((r, v)))
                .await
        }
    }

    unstable_pub! {
        /// The routing loop every layer shares: resolve `target`, send, let `handle` read the response.
        ///
        /// `handle` returns [`Verdict::Done`] to finish, [`Verdict::Reroute`] when the response says the
        /// target moved (the cached leader or coordinator is forgotten before the retry), or
        /// [`Verdict::Retry`] to back off and resend to the same target. Transport failures and routing
        /// failures (no leader yet, coordinator not available) are retried the same way. After the last
        /// retry the error is [`NetError::RetriesExhausted`], which says whether any attempt's outcome is
        /// unknown.
        ///
        /// Every request must be answered: a Produce with `acks = 0` (which the broker never answers) would
        /// time out and reset the connection, so this client does not send one.
        ///
        /// Cancel-safe in the same sense as [`Client::send`].
        pub async fn call<R: ApiRequest, T>(
            &self,
            target: Target,
            options: &CallOptions,
            mut build: impl FnMut(i16) -> R,
            mut handle: impl FnMut(R::Response, i16) -> Verdict<T>,
        ) -> Result<T, NetError> {
            let mut backoff = match options.max_retries {
                Some(n) => Backoff::new(
                    self.inner.config.retry_backoff,
                    self.inner.config.retry_backoff_max,
                    n,
                ),
                None => self.backoff(),
            };
            let mut outcome_unknown = false;
            loop {
                let attempt = self.attempt(&target, options, &mut build).await;
                // `rerouted`: the route was forgotten because the target moved (the retry's reason).
                let (err, retriable, rerouted) = match attempt {
                    Ok((response, version)) => match handle(response, version) {
                        Verdict::Done(value) => return Ok(value),
                        Verdict::Reroute(code) => {
                            self.forget_route(&target);
                            (NetError::broker(code, None, describe(&target)), true, true)
                        }
                        Verdict::Retry(code) => {
                            (NetError::broker(code, None, describe(&target)), true, false)
                        }
                    },
                    Err(err) => {
                        if matches!(err, NetError::UnknownBroker(_)) {
                            // The route names a broker newer than our broker list; a failure here
                            // surfaces again on the next attempt, so its result can be ignored.
                            let _ = self.fetch_metadata(Some(&[])).await;
                        }
                        let rerouted = err.error_code().is_some_and(|c| {
                            super::retry::retry_action(c) == Some(super::RetryAction::Reroute)
                        });
                        if rerouted
                            || err.is_transport()
                            || matches!(err, NetError::UnknownBroker(_))
                        {
                            self.forget_route(&target);
                        }
                        let retriable = err.is_retriable();
                        (err, retriable, rerouted)
                    }
                };
                outcome_unknown |= err.outcome_unknown();
                if !retriable {
                    return Err(err);
                }
                match backoff.next_delay() {
                    Some(delay) => {
                        tracing::debug!(target = %describe(&target), error = %err, ?delay, "retrying");
                        telemetry::count(&REQUEST_RETRIES, Some(retry_reason(&err, rerouted)));
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        return Err(NetError::RetriesExhausted {
                            attempts: backoff.retries() + 1,
                            outcome_unknown,
                            last: Box::new(err),
                        })
                    }
                }
            }
        }
    }

    /// One attempt: route, pick the version, build, send, decode.
    async fn attempt<R: ApiRequest>(
        &self,
        target: &Target,
        options: &CallOptions,
        build: &mut impl FnMut(i16) -> R,
    ) -> Result<(R::Response, i16), NetError> {
        let broker = self.resolve(target, options.connection).await?;
        let version = pick_version::<R>(&broker, options)?;
        let request = build(version);
        let timeout = options.timeout.unwrap_or(self.inner.config.request_timeout);
        let response = broker.conn.request(&request, version, timeout).await?;
        Ok((response, version))
    }

    async fn resolve(&self, target: &Target, lane: Option<usize>) -> Result<BrokerConn, NetError> {
        let lanes = self.inner.config.connections_per_broker;
        match target {
            Target::Any => self.any_broker().await,
            Target::Broker(node) => self.broker(*node, lane.unwrap_or(0) % lanes).await,
            Target::Leader { topic, partition } => {
                let leader = self.leader_once(topic, *partition).await?;
                let lane =
                    lane.unwrap_or_else(|| connection_of_partition(topic, *partition, lanes));
                self.broker(leader.node, lane % lanes).await
            }
            Target::Coordinator { kind, key } => {
                let node = self.coordinator_once(*kind, key).await?;
                let lane = lane.unwrap_or_else(|| connection_of_key(key, lanes));
                self.broker(node, lane % lanes).await
            }
        }
    }

    /// How many connections this client keeps to each broker (at least 1).
    pub fn connections_per_broker(&self) -> usize {
        self.inner.config.connections_per_broker
    }

    fn forget_route(&self, target: &Target) {
        match target {
            Target::Leader { topic, partition } => self.invalidate_leader(topic, *partition),
            Target::Coordinator { kind, key } => self.invalidate_coordinator(*kind, key),
            Target::Any | Target::Broker(_) => {}
        }
    }

    // ---- connections -------------------------------------------------------------------------------

    fn slot(&self, node: i32, lane: usize) -> Slot {
        lock(&self.inner.slots)
            .entry((node, lane))
            .or_default()
            .clone()
    }

    /// Connection `lane` to broker `node`, opened (or reopened after a failure) on demand. Each of a
    /// broker's connections logs in, renews its session and reconnects on its own.
    async fn broker(&self, node: i32, lane: usize) -> Result<BrokerConn, NetError> {
        let slot = self.slot(node, lane);
        let mut held = slot.lock().await;
        if let Some(existing) = held.as_ref() {
            if existing.usable() {
                return Ok(existing.clone());
            }
            if existing.renewable() && !lock(&self.inner.renew_by_reconnect).contains(&node) {
                // The slot's lock is held throughout: callers of this broker wait for the renewal.
                match broker::reauthenticate(existing, &self.inner.config).await {
                    Ok(renewed) => {
                        telemetry::count(&REAUTHENTICATIONS, Some("in_place"));
                        tracing::debug!(node, "SASL session renewed in place");
                        *held = Some(renewed.clone());
                        return Ok(renewed);
                    }
                    Err(broker::Renewal::Busy) => {
                        tracing::debug!(
                            node,
                            "requests in flight outlasted the session's renewal window; reconnecting"
                        );
                    }
                    Err(broker::Renewal::Failed(e)) => {
                        tracing::info!(
                            node,
                            error = %e,
                            "re-authentication in place failed; this broker's sessions are renewed by reconnecting from now on"
                        );
                        lock(&self.inner.renew_by_reconnect).insert(node);
                    }
                }
            }
            if existing
                .retire_at
                .is_some_and(|at| tokio::time::Instant::now() >= at)
            {
                telemetry::count(&REAUTHENTICATIONS, Some("reconnect"));
            }
        }
        let replacing = held.take().is_some();
        let addr = lock(&self.inner.metadata)
            .brokers
            .get(&node)
            .map(BrokerInfo::addr)
            .ok_or(NetError::UnknownBroker(node))?;
        let opened = broker::open(&addr, node, &self.inner.config).await?;
        if replacing {
            telemetry::count(&RECONNECTS, None);
        }
        self.record_handshake(&opened);
        *held = Some(opened.clone());
        Ok(opened)
    }

    /// A connection to any broker: an open one if there is one, else the known brokers in turn, else
    /// the bootstrap addresses.
    async fn any_broker(&self) -> Result<BrokerConn, NetError> {
        let slots: Vec<_> = lock(&self.inner.slots).values().cloned().collect();
        for slot in &slots {
            if let Ok(held) = slot.try_lock() {
                if let Some(c) = held.as_ref().filter(|c| c.usable()) {
                    return Ok(c.clone());
                }
            }
        }
        let nodes: Vec<i32> = lock(&self.inner.metadata).brokers.keys().copied().collect();
        let mut last = None;
        if !nodes.is_empty() {
            let start = self.inner.next_any.fetch_add(1, Ordering::Relaxed) % nodes.len();
            for i in 0..nodes.len() {
                match self.broker(nodes[(start + i) % nodes.len()], 0).await {
                    Ok(c) => return Ok(c),
                    // Every broker checks the same credentials and certificates: trying the next
                    // one would only repeat the refusal.
                    Err(e) if e.is_fatal_connect() => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
        }
        match self.bootstrap_connection().await {
            Ok(c) => Ok(c),
            Err(e) => Err(last.unwrap_or(e)),
        }
    }

    /// Connects to the bootstrap addresses in order until one answers, reads the broker list through
    /// it, and files the connection under its node id when its address matches an advertised one.
    async fn bootstrap_connection(&self) -> Result<BrokerConn, NetError> {
        let mut held = self.inner.bootstrap.lock().await;
        if let Some(c) = held.as_ref().filter(|c| c.usable()) {
            return Ok(c.clone());
        }
        let replacing = held.take().is_some();
        // Each address's failure, typed: with one address it is returned as it is (a protocol error stays
        // a protocol error); with several they are summed up in one Connect error.
        let mut failures: Vec<(&String, NetError)> = Vec::new();
        for addr in &self.inner.config.bootstrap {
            let opened = match broker::open(addr, -1, &self.inner.config).await {
                Ok(c) => {
                    if replacing {
                        telemetry::count(&RECONNECTS, None);
                    }
                    c
                }
                Err(e) if e.is_fatal_connect() => return Err(e),
                Err(e) => {
                    failures.push((addr, e));
                    continue;
                }
            };
            self.record_handshake(&opened);
            let metadata = match self.fetch_metadata_on(&opened, Some(&[])).await {
                Ok(m) => m,
                Err(e) => {
                    failures.push((addr, e));
                    continue;
                }
            };
            let matched = metadata
                .brokers
                .values()
                .find(|b| b.addr() == *addr)
                .map(|b| b.node_id);
            if let Some(node) = matched {
                let filed = BrokerConn {
                    node,
                    ..opened.clone()
                };
                self.record_handshake(&filed);
                let slot = self.slot(node, 0);
                if let Ok(mut s) = slot.try_lock() {
                    if !s.as_ref().is_some_and(|c| c.usable()) {
                        *s = Some(filed.clone());
                    }
                }
                return Ok(filed);
            }
            *held = Some(opened.clone());
            return Ok(opened);
        }
        if failures.len() == 1 {
            if let Some((_, only)) = failures.pop() {
                return Err(only);
            }
        }
        // The list's message names each address once: an address's own Connect error already starts
        // with "cannot connect to <addr>", so only its reason is taken.
        let message = failures
            .iter()
            .map(|(addr, e)| match e {
                NetError::Connect { message, .. } => format!("{addr}: {message}"),
                other => format!("{addr}: {other}"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(NetError::Connect {
            addr: self.inner.config.bootstrap.join(","),
            message,
        })
    }

    fn record_handshake(&self, c: &BrokerConn) {
        lock(&self.inner.versions).insert(c.node, c.versions.clone());
        let mut features = lock(&self.inner.features);
        // Brokers may briefly disagree while a feature upgrade propagates; the newest epoch wins.
        if c.features.epoch >= features.epoch {
            *features = c.features.clone();
        }
    }

    // ---- versions and features ---------------------------------------------------------------------

    unstable_pub! {
        /// The highest version of `api_key` that this client and broker `broker` both support, if the
        /// client has talked to that broker (see [`Client::broker_versions`] to connect first).
        pub fn api_version(&self, broker: i32, api_key: i16) -> Option<i16> {
            lock(&self.inner.versions).get(&broker)?.usable(api_key)
        }
    }

    unstable_pub! {
        /// Whether broker `broker` can be sent `api_key` at `version` or newer, connecting to it if needed.
        /// This is how upper layers gate protocol paths (e.g. EndTxn v5 for transaction version 2).
        ///
        /// Cancel-safe.
        pub async fn supports(
            &self,
            broker: i32,
            api_key: i16,
            version: i16,
        ) -> Result<bool, NetError> {
            Ok(self
                .broker_versions(broker)
                .await?
                .usable_at_least(api_key, version)
                .is_some())
        }
    }

    unstable_pub! {
        /// Broker `broker`'s ApiVersions table, connecting to it if needed.
        ///
        /// Cancel-safe.
        pub async fn broker_versions(&self, broker: i32) -> Result<Arc<BrokerApiVersions>, NetError> {
            if let Some(v) = lock(&self.inner.versions).get(&broker) {
                return Ok(v.clone());
            }
            Ok(self.broker(broker, 0).await?.versions)
        }
    }

    /// The cluster's finalized features as last reported by a broker (newest feature epoch seen).
    pub fn features(&self) -> Features {
        lock(&self.inner.features).clone()
    }

    // ---- metadata ----------------------------------------------------------------------------------

    /// What the client currently knows, without asking the cluster.
    pub fn cached_metadata(&self) -> Arc<ClusterMetadata> {
        lock(&self.inner.metadata).clone()
    }

    /// Refreshes the broker list and the metadata of `topics` (an empty slice refreshes brokers only)
    /// and returns the updated snapshot. Topics that do not exist appear with their error code.
    ///
    /// Cancel-safe.
    pub async fn metadata(&self, topics: &[&str]) -> Result<Arc<ClusterMetadata>, NetError> {
        self.retrying(|| self.fetch_metadata(Some(topics))).await
    }

    /// Refreshes the metadata of every topic in the cluster.
    ///
    /// Cancel-safe.
    pub async fn metadata_all(&self) -> Result<Arc<ClusterMetadata>, NetError> {
        self.retrying(|| self.fetch_metadata(None)).await
    }

    /// One Metadata request to any broker, without the retry loop of [`Client::metadata`].
    pub(crate) async fn fetch_metadata(
        &self,
        topics: Option<&[&str]>,
    ) -> Result<Arc<ClusterMetadata>, NetError> {
        let broker = self.any_broker().await?;
        self.fetch_metadata_on(&broker, topics).await
    }

    async fn fetch_metadata_on(
        &self,
        broker: &BrokerConn,
        topics: Option<&[&str]>,
    ) -> Result<Arc<ClusterMetadata>, NetError> {
        // v0 reads an empty topic list as "all topics"; v1+ has null for that, which is what we need.
        let options = CallOptions {
            min_version: Some(crate::wire::METADATA_MIN),
            ..CallOptions::default()
        };
        let version = pick_version::<MetadataRequest>(broker, &options)?;
        let request = metadata_request(topics, version);
        let response = broker
            .conn
            .request(&request, version, self.inner.config.request_timeout)
            .await?;
        let code = ErrorCode::from_code(response.error_code);
        if !code.is_ok() {
            return Err(NetError::broker(code, None, "metadata"));
        }
        let mut current = lock(&self.inner.metadata);
        let next = Arc::new(current.merged(&response));
        *current = next.clone();
        Ok(next)
    }

    /// The leader of `topic`/`partition` and its epoch, from the cache or (if unknown) from a refresh.
    ///
    /// Cancel-safe.
    pub async fn leader(&self, topic: &str, partition: i32) -> Result<LeaderInfo, NetError> {
        self.retrying(|| self.leader_once(topic, partition)).await
    }

    async fn leader_once(&self, topic: &str, partition: i32) -> Result<LeaderInfo, NetError> {
        if let Some(l) = self.cached_metadata().leader(topic, partition) {
            return Ok(l);
        }
        let metadata = self.fetch_metadata(Some(&[topic])).await?;
        let context = || format!("leader of {topic}/{partition}");
        let t = metadata
            .topics
            .get(topic)
            .ok_or_else(|| NetError::broker(ErrorCode::UnknownTopicOrPartition, None, context()))?;
        if !t.error.is_ok() {
            return Err(NetError::broker(t.error, None, context()));
        }
        let p = t
            .partitions
            .get(&partition)
            .ok_or_else(|| NetError::broker(ErrorCode::UnknownTopicOrPartition, None, context()))?;
        match metadata.leader(topic, partition) {
            Some(leader) => Ok(leader),
            None if !p.error.is_ok() => Err(NetError::broker(p.error, None, context())),
            None => Err(NetError::broker(
                ErrorCode::LeaderNotAvailable,
                None,
                context(),
            )),
        }
    }

    unstable_pub! {
        /// Forgets the cached leader of `topic`/`partition` (in practice the whole topic's metadata), so the
        /// next request routed to it refreshes first. Call this on NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH
        /// and the like found inside a response body.
        pub fn invalidate_leader(&self, topic: &str, partition: i32) {
            let _ = partition;
            let mut current = lock(&self.inner.metadata);
            if let Some(next) = current.without_topic(topic) {
                *current = Arc::new(next);
            }
        }
    }

    /// Drops `topic` from the metadata cache (after a deletion, or when its leaders moved).
    pub(crate) fn forget_topic(&self, topic: &str) {
        let mut current = lock(&self.inner.metadata);
        if let Some(next) = current.without_topic(topic) {
            *current = Arc::new(next);
        }
    }

    // ---- coordinators ------------------------------------------------------------------------------

    /// The node id of the coordinator for `key`, from the cache or from FindCoordinator.
    ///
    /// Cancel-safe.
    pub async fn coordinator(&self, kind: CoordinatorKind, key: &str) -> Result<i32, NetError> {
        self.retrying(|| self.coordinator_once(kind, key)).await
    }

    async fn coordinator_once(&self, kind: CoordinatorKind, key: &str) -> Result<i32, NetError> {
        if let Some(node) = lock(&self.inner.coordinators).get(&(kind, key.to_owned())) {
            return Ok(*node);
        }
        let mut found = self.find_coordinators(kind, &[key]).await?;
        found.remove(key).unwrap_or_else(|| {
            Err(NetError::broker(
                ErrorCode::CoordinatorNotAvailable,
                None,
                key,
            ))
        })
    }

    /// The coordinators of several keys at once: one FindCoordinator request when every broker asked
    /// speaks the batched form (v4+), one per key otherwise. Keys whose lookup fails with a retriable
    /// error are retried with back-off.
    ///
    /// Cancel-safe.
    pub async fn coordinators(
        &self,
        kind: CoordinatorKind,
        keys: &[&str],
    ) -> Result<BTreeMap<String, i32>, NetError> {
        let mut done = BTreeMap::new();
        let mut backoff = self.backoff();
        loop {
            let mut todo = Vec::new();
            for key in keys {
                if done.contains_key(*key) {
                    continue;
                }
                match lock(&self.inner.coordinators).get(&(kind, (*key).to_owned())) {
                    Some(node) => {
                        done.insert((*key).to_owned(), *node);
                    }
                    None => todo.push(*key),
                }
            }
            if todo.is_empty() {
                return Ok(done);
            }
            let err = match self.find_coordinators(kind, &todo).await {
                Ok(found) => {
                    // A key the answer leaves out counts as not available yet, so it is retried with
                    // back-off rather than asked for again at once.
                    let mut first_err = todo
                        .iter()
                        .find(|k| !found.contains_key(**k))
                        .map(|k| NetError::broker(ErrorCode::CoordinatorNotAvailable, None, *k));
                    for (key, result) in found {
                        match result {
                            Ok(node) => {
                                done.insert(key, node);
                            }
                            Err(e) if !e.is_retriable() => return Err(e),
                            Err(e) => first_err = first_err.or(Some(e)),
                        }
                    }
                    match first_err {
                        Some(e) => e,
                        None => continue,
                    }
                }
                Err(e) if e.is_retriable() => e,
                Err(e) => return Err(e),
            };
            match backoff.next_delay() {
                Some(d) => {
                    telemetry::count(&REQUEST_RETRIES, Some(retry_reason(&err, false)));
                    tokio::time::sleep(d).await
                }
                None => {
                    return Err(NetError::RetriesExhausted {
                        attempts: backoff.retries() + 1,
                        outcome_unknown: false,
                        last: Box::new(err),
                    })
                }
            }
        }
    }

    /// One round of FindCoordinator for `keys`, caching what it finds.
    async fn find_coordinators(
        &self,
        kind: CoordinatorKind,
        keys: &[&str],
    ) -> Result<BTreeMap<String, Result<i32, NetError>>, NetError> {
        let broker = self.any_broker().await?;
        let options = CallOptions {
            // v0 has no key type: it can only look up groups.
            min_version: (kind == CoordinatorKind::Transaction).then_some(1),
            ..CallOptions::default()
        };
        let version = pick_version::<FindCoordinatorRequest>(&broker, &options)?;
        let timeout = self.inner.config.request_timeout;
        let mut answers = Vec::new();
        if version >= 4 {
            let request = FindCoordinatorRequest::default()
                .with_key_type(kind.key_type())
                .with_coordinator_keys(
                    keys.iter()
                        .map(|k| StrBytes::from_string((*k).to_owned()))
                        .collect(),
                );
            let response = broker.conn.request(&request, version, timeout).await?;
            for c in response.coordinators {
                answers.push((
                    c.key.to_string(),
                    c.error_code,
                    c.error_message.map(|m| m.to_string()),
                    c.node_id.0,
                    c.host.to_string(),
                    c.port,
                ));
            }
        } else {
            for key in keys {
                let request = FindCoordinatorRequest::default()
                    .with_key(StrBytes::from_string((*key).to_owned()))
                    .with_key_type(if version >= 1 { kind.key_type() } else { 0 });
                let r = broker.conn.request(&request, version, timeout).await?;
                answers.push((
                    (*key).to_owned(),
                    r.error_code,
                    r.error_message.map(|m| m.to_string()),
                    r.node_id.0,
                    r.host.to_string(),
                    r.port,
                ));
            }
        }
        let mut out = BTreeMap::new();
        for (key, code, message, node, host, port) in answers {
            let code = ErrorCode::from_code(code);
            let result = if code.is_ok() && node >= 0 {
                self.learn_broker(node, host, port);
                lock(&self.inner.coordinators).insert((kind, key.clone()), node);
                Ok(node)
            } else {
                let code = if code.is_ok() {
                    ErrorCode::CoordinatorNotAvailable
                } else {
                    code
                };
                let context = format!("{kind:?} coordinator of {key}");
                Err(NetError::broker(code, message.as_deref(), context))
            };
            out.insert(key, result);
        }
        Ok(out)
    }

    /// Makes sure a broker named in a FindCoordinator answer can be connected to, even if the last
    /// metadata refresh predates it.
    fn learn_broker(&self, node: i32, host: String, port: i32) {
        let mut current = lock(&self.inner.metadata);
        if !current.brokers.contains_key(&node) {
            let mut next = (**current).clone();
            next.brokers.insert(
                node,
                BrokerInfo {
                    node_id: node,
                    host,
                    port,
                    rack: None,
                },
            );
            *current = Arc::new(next);
        }
    }

    unstable_pub! {
        /// Forgets the cached coordinator of `key`. Call this on NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE
        /// found inside a response.
        pub fn invalidate_coordinator(&self, kind: CoordinatorKind, key: &str) {
            lock(&self.inner.coordinators).remove(&(kind, key.to_owned()));
        }
    }

    // ---- helpers -----------------------------------------------------------------------------------

    /// Repeats `op` with back-off while it fails with a retriable error.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T, NetError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, NetError>>,
    {
        let mut backoff = self.backoff();
        let mut outcome_unknown = false;
        loop {
            let err = match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retriable() => e,
                Err(e) => return Err(e),
            };
            outcome_unknown |= err.outcome_unknown();
            match backoff.next_delay() {
                Some(d) => {
                    telemetry::count(&REQUEST_RETRIES, Some(retry_reason(&err, false)));
                    tokio::time::sleep(d).await
                }
                None => {
                    return Err(NetError::RetriesExhausted {
                        attempts: backoff.retries() + 1,
                        outcome_unknown,
                        last: Box::new(err),
                    })
                }
            }
        }
    }
}

/// The version to send `R` at over `broker`: the highest both sides support within the caller's bounds.
fn pick_version<R: ApiRequest>(
    broker: &BrokerConn,
    options: &CallOptions,
) -> Result<i16, NetError> {
    let ours = client_versions_of::<R>();
    let max = options.max_version.map_or(ours.max, |m| m.min(ours.max));
    let min = options.min_version.map_or(ours.min, |m| m.max(ours.min));
    let theirs = broker.versions.broker_range(R::KEY);
    let unsupported = || NetError::UnsupportedVersion {
        broker: broker.node,
        api_key: R::KEY,
        min,
        max,
        broker_range: theirs,
    };
    let (their_min, their_max) = theirs.ok_or_else(unsupported)?;
    let version = max.min(their_max);
    if version < min || version < their_min {
        return Err(unsupported());
    }
    Ok(version)
}

/// The `reason` label of a retry (see `docs/metrics.md`): the route moved (`reroute`), the socket failed
/// (`transport`), the route named a broker the client did not know yet (`unknown_broker`), or the broker
/// answered with a retriable error (`retriable`).
fn retry_reason(err: &NetError, rerouted: bool) -> &'static str {
    let rerouted = rerouted
        || err
            .error_code()
            .is_some_and(|c| super::retry::retry_action(c) == Some(super::RetryAction::Reroute));
    if rerouted {
        "reroute"
    } else if err.is_transport() {
        "transport"
    } else if matches!(err, NetError::UnknownBroker(_)) {
        "unknown_broker"
    } else {
        "retriable"
    }
}

fn describe(target: &Target) -> String {
    match target {
        Target::Any => "any broker".into(),
        Target::Broker(n) => format!("broker {n}"),
        Target::Leader { topic, partition } => format!("leader of {topic}/{partition}"),
        Target::Coordinator { kind, key } => format!("{kind:?} coordinator of {key}"),
    }
}

/// A Metadata request for `topics` (`None`: every topic) at `version` (1 or later).
fn metadata_request(topics: Option<&[&str]>, version: i16) -> MetadataRequest {
    let mut request = MetadataRequest::default().with_topics(topics.map(|names| {
        names
            .iter()
            .map(|n| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string((*n).to_owned()))))
            })
            .collect()
    }));
    // The field exists from v4 on; before it the broker alone decides, and the encoder refuses a
    // non-default value at a version without the field.
    if version >= 4 {
        request.allow_auto_topic_creation = false;
    }
    request
}

#[cfg(test)]
mod tests {
    /// Every Metadata version the client may pick encodes (v1-v3 used to fail: the auto-creation flag
    /// was set at versions that lack it).
    #[test]
    fn metadata_requests_encode_at_every_version() {
        use kafka_protocol::protocol::{Encodable as _, Message as _};
        for version in 1..=MetadataRequest::VERSIONS.max {
            for topics in [None, Some(&["t"][..])] {
                let mut buf = bytes::BytesMut::new();
                metadata_request(topics, version)
                    .encode(&mut buf, version)
                    .unwrap_or_else(|e| panic!("v{version} {topics:?}: {e}"));
            }
        }
    }

    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// Every public future can be spawned on a multi-threaded runtime.
    #[allow(dead_code, unused_must_use)]
    fn public_futures_are_send(c: &Client) {
        assert_send(&Client::connect(ClientConfig::default()));
        assert_send(&c.send(Target::Any, |_| MetadataRequest::default()));
        assert_send(&c.send_once(Target::Any, |_| MetadataRequest::default()));
        assert_send(&c.call(
            Target::Any,
            &CallOptions::default(),
            |_| MetadataRequest::default(),
            |r, _| Verdict::Done(r),
        ));
        assert_send(&c.metadata(&["t"]));
        assert_send(&c.metadata_all());
        assert_send(&c.leader("t", 0));
        assert_send(&c.coordinator(CoordinatorKind::Group, "g"));
        assert_send(&c.coordinators(CoordinatorKind::Group, &["g"]));
        assert_send(&c.supports(1, 0, 3));
        assert_send(&c.broker_versions(1));
    }

    fn broker_with(ranges: &[(i16, i16, i16)]) -> BrokerConn {
        use kafka_protocol::messages::api_versions_response::ApiVersion;
        use kafka_protocol::messages::ApiVersionsResponse;
        let response = ApiVersionsResponse::default().with_api_keys(
            ranges
                .iter()
                .map(|&(k, min, max)| {
                    ApiVersion::default()
                        .with_api_key(k)
                        .with_min_version(min)
                        .with_max_version(max)
                })
                .collect(),
        );
        let (conn, _peer) = crate::net::testing::pair(64, crate::net::testing::options());
        BrokerConn {
            conn,
            node: 7,
            versions: Arc::new(BrokerApiVersions::from_response(&response)),
            features: Features::default(),
            retire_at: None,
            session_end: None,
        }
    }

    /// A connection past its SASL session lifetime (KIP-368) is not handed out again, so the next request
    /// opens, and logs in on, a fresh one instead of being dropped by the broker.
    #[tokio::test]
    async fn a_connection_past_its_session_lifetime_is_not_used() {
        let mut b = broker_with(&[(3, 0, 11)]);
        assert!(b.usable());
        b.retire_at = Some(tokio::time::Instant::now() + Duration::from_secs(60));
        assert!(b.usable());
        b.retire_at = Some(tokio::time::Instant::now() - Duration::from_millis(1));
        assert!(!b.usable());
    }

    /// A request goes out at the highest version both the broker and the caller accept, and is refused
    /// with the broker's range when the two do not meet or the broker lacks the API.
    #[tokio::test]
    async fn version_is_the_highest_both_sides_and_the_caller_accept() {
        let b = broker_with(&[(3, 0, 11), (26, 0, 4)]);
        let any = CallOptions::default();
        assert_eq!(pick_version::<MetadataRequest>(&b, &any).unwrap(), 11);
        let capped = CallOptions {
            max_version: Some(9),
            ..CallOptions::default()
        };
        assert_eq!(pick_version::<MetadataRequest>(&b, &capped).unwrap(), 9);
        // The producer's "EndTxn v5 or nothing" check for transaction version 2.
        let tv2 = CallOptions {
            min_version: Some(5),
            ..CallOptions::default()
        };
        match pick_version::<kafka_protocol::messages::EndTxnRequest>(&b, &tv2) {
            Err(NetError::UnsupportedVersion {
                broker: 7,
                api_key: 26,
                min: 5,
                broker_range: Some((0, 4)),
                ..
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
        // An API the broker does not list at all.
        assert!(matches!(
            pick_version::<FindCoordinatorRequest>(&b, &any),
            Err(NetError::UnsupportedVersion {
                broker_range: None,
                ..
            })
        ));
    }
}
