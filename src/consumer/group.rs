//! The group consumer: a subscription, a background task keeping the membership alive, and a poll
//! path that runs rebalance handlers, publishes the group metadata and fetches.
//!
//! ```text
//!   application task                      background task (one per consumer)
//!   ----------------                      ----------------------------------
//!   poll()                                loop:
//!     PollPath::drive  ── ack ──────────▶   machine.poll_transmit → send (net)
//!       (handlers, awaited)  ◀── events ──   responses → machine.handle_response
//!     sync reader with assignment             timers    → machine.handle_timeout
//!     fetch (PartitionReader)
//!     publish group metadata
//! ```
//!
//! The machine sits behind a mutex held only for short, non-async sections. Heartbeats never wait for
//! the application; the group only moves on when the application acknowledges (see
//! [`RebalanceListener`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::exec::execute;
use super::live::GroupMetadataHandle;
use super::membership::classic::ClassicMember;
use super::membership::kip848::ConsumerMember;
use super::membership::RequestId;
use super::offsets::{commit_offsets, committed_offsets};
use super::rebalance::{now, Member, PollPath, Shared};
use super::{
    ConsumerError, GroupConfig, GroupProtocol, LostReason, OffsetReset, PartitionReader,
    PartitionRecords, ReaderConfig, RebalanceListener, StartAt, TopicPartition,
};
use crate::net::Client;

/// Settings of a [`GroupConsumer`] beyond the group and the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupConsumerConfig {
    /// Membership settings.
    pub group: GroupConfig,
    /// Fetch settings. Its `reset` policy also decides where a partition with no committed offset
    /// starts: `Earliest`, `Latest`, or `Fail` (the poll fails with
    /// [`ConsumerError::NoCommittedOffset`]).
    pub reader: ReaderConfig,
    /// Commit the positions of owned partitions at this interval (on poll), before every revocation,
    /// and on close. `None` (the default): the application commits explicitly.
    pub auto_commit_interval: Option<Duration>,
}

impl GroupConsumerConfig {
    /// Defaults for `group`: explicit commits, the reader's defaults.
    pub fn new(group: GroupConfig) -> Self {
        GroupConsumerConfig {
            group,
            reader: ReaderConfig::default(),
            auto_commit_interval: None,
        }
    }
}

/// A consumer group member that reads its assigned partitions.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use std::time::Duration;
/// use snapfence::consumer::{GroupConfig, GroupConsumer, GroupConsumerConfig, OffsetReset};
/// use snapfence::net::{Client, ClientConfig};
/// use snapfence::records::IsolationLevel;
///
/// let client = Client::connect(ClientConfig::new("localhost:9092")).await?;
/// let mut config = GroupConsumerConfig::new(GroupConfig::new("my-group"));
/// config.reader.reset = OffsetReset::Earliest; // a partition the group never committed starts here
/// config.reader.isolation = IsolationLevel::ReadCommitted; // skip aborted transactions
/// let mut consumer = GroupConsumer::subscribe(client, config, ["events"], ()).await?;
/// // The fencing token for transactional commits (TransactionalProducer::send_offsets), live: it
/// // follows every generation bump, read it right before each commit.
/// let token = consumer.group_metadata();
/// for _ in 0..100 {
///     for batch in consumer.poll(Duration::from_secs(1)).await? {
///         for record in &batch.records {
///             println!("{} @ {}: {:?}", batch.partition, record.offset, record.value);
///         }
///     }
///     consumer.commit_positions().await?; // or commit through a transaction with `token`
/// }
/// # let _ = token;
/// consumer.close(Duration::from_secs(10)).await?; // leave the group instead of timing out of it
/// # Ok(()) }
/// ```
///
/// A rebalance listener (the last argument of [`subscribe`](Self::subscribe), `()` for none) is awaited
/// on assignment and revocation; `examples/transform.rs` pairs this consumer with a transactional
/// producer.
#[derive(Debug)]
pub struct GroupConsumer<L: RebalanceListener = ()> {
    client: Client,
    config: GroupConsumerConfig,
    shared: Arc<Shared>,
    poll_path: PollPath,
    listener: L,
    reader: PartitionReader,
    task: Option<JoinHandle<()>>,
    last_auto_commit: tokio::time::Instant,
}

impl<L: RebalanceListener> GroupConsumer<L> {
    /// Joins `config.group.group_id` subscribed to `topics`. Returns once a dedicated connection for
    /// the group requests is open; the first join completes in the background and shows in the first
    /// polls (assignment, group metadata). `client` serves the fetches and offset requests.
    ///
    /// Cancel-safe: nothing has started until it returns.
    pub async fn subscribe<T: Into<String>>(
        client: Client,
        config: GroupConsumerConfig,
        topics: impl IntoIterator<Item = T>,
        listener: L,
    ) -> Result<Self, ConsumerError> {
        let topics: Vec<String> = topics.into_iter().map(Into::into).collect();
        let member = match &config.group.protocol {
            GroupProtocol::Classic { .. } => {
                Member::Classic(ClassicMember::new(&config.group, topics, now())?)
            }
            GroupProtocol::Consumer { .. } => Member::Consumer(ConsumerMember::new(
                &config.group,
                topics,
                random_member_id(),
                now(),
            )?),
        };
        // Group requests get their own connections, as Java's consumer does: the coordinator holds a
        // JoinGroup until the whole round has joined, and a broker serves one connection's requests in
        // order, so on a shared connection that JoinGroup would stall this member's fetches, and
        // another member of the same group sharing the client would deadlock the round.
        let membership_client = Client::connect(client.config().clone()).await?;
        let shared = Arc::new(Shared::new(member));
        let (poll_path, _) = PollPath::new(&config.group.group_id);
        // Supervised: if the driver panics (or is cancelled by anything but this consumer), the next
        // poll fails with a typed error instead of waiting for heartbeats that no longer happen.
        let supervisor = Arc::downgrade(&shared);
        let task = crate::supervise::spawn(
            run_membership(
                membership_client,
                config.group.group_id.clone(),
                shared.clone(),
            ),
            move |failure| {
                if let Some(shared) = supervisor.upgrade() {
                    shared.driver_failed(failure);
                }
            },
        );
        Ok(GroupConsumer {
            reader: PartitionReader::new(client.clone(), config.reader.clone()),
            client,
            config,
            shared,
            poll_path,
            listener,
            task: Some(task),
            last_auto_commit: tokio::time::Instant::now(),
        })
    }

    /// A live reader of this member's group metadata (the fencing token), refreshed on every poll.
    pub fn group_metadata(&self) -> GroupMetadataHandle {
        self.poll_path.handle()
    }

    /// The partitions this member holds, as the listener has been told: assigned (its assign handler
    /// ran) and not yet revoked or lost (their handler has not returned). Changes only inside `poll`.
    pub fn assignment(&self) -> BTreeSet<TopicPartition> {
        self.poll_path.held().clone()
    }

    /// The listener.
    pub fn listener(&self) -> &L {
        &self.listener
    }

    /// The listener, mutably.
    pub fn listener_mut(&mut self) -> &mut L {
        &mut self.listener
    }

    /// Replaces the subscription; the change triggers a rebalance (classic) or is carried by the next
    /// heartbeat (consumer protocol).
    pub fn set_subscription<T: Into<String>>(&mut self, topics: impl IntoIterator<Item = T>) {
        self.shared
            .lock()
            .subscribe(topics.into_iter().map(Into::into));
        self.shared.wake.notify_one();
    }

    /// Gives this membership up and joins the group again as a new member: every partition held is
    /// handed to the listener as lost ([`LostReason::Rejoined`]) on the next poll, never revoked (nothing
    /// may be written from the old membership), the published group metadata is withdrawn at once so no
    /// commit carries the old generation or epoch, and the join goes out once the loss is handled. A
    /// dynamic member leaves under its old id first (classic: a LeaveGroup it does not wait for; the
    /// consumer protocol: the leave heartbeat), so the group need not wait out the old session.
    ///
    /// For a runtime that learnt from a refused commit that the coordinator no longer knows this member
    /// (UNKNOWN_MEMBER_ID) or that a newer owner fenced its producer. Does nothing on a closing consumer.
    pub(crate) fn rejoin(&mut self, reason: &str) {
        self.shared.lock().rejoin_as_new(now(), reason);
        self.poll_path.withdraw();
        self.shared.wake.notify_one();
    }

    /// The next offset to be delivered for an owned partition.
    pub fn position(&self, partition: &TopicPartition) -> Option<i64> {
        self.reader.position(partition)
    }

    /// Moves the position of an owned partition.
    pub fn seek(&mut self, partition: &TopicPartition, start: StartAt) -> bool {
        self.reader.seek(partition, start)
    }

    /// Runs pending rebalance handlers, then fetches records of the owned partitions, waiting up to
    /// `timeout` for some to arrive. Returns early with an empty list when a rebalance event needs
    /// handling. Must be called at least every `max_poll_interval`, or the member leaves the group
    /// (and reports its partitions lost on the next poll).
    ///
    /// Not cancel-safe in one documented way: if dropped while a rebalance handler runs, the handler
    /// runs again on the next poll (see [`RebalanceListener`]). Records are never lost: a fetch
    /// dropped mid-way is repeated from the same positions.
    pub async fn poll(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<PartitionRecords>, ConsumerError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.shared.driver_error() {
                return Err(e);
            }
            self.maybe_auto_commit().await?;
            self.run_handlers().await?;
            self.sync_assignment().await?;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let out = if self.reader.assignment().is_empty() {
                // Nothing to fetch: wait for the background to report progress (a join completing).
                // The driver's supervisor notifies this too, so a dead driver ends the wait.
                let _ = tokio::time::timeout(remaining, self.shared.app_wake.notified()).await;
                Vec::new()
            } else {
                let wait = remaining.min(self.config.reader.max_wait);
                self.reader.fetch_for(wait).await?
            };
            self.poll_path.publish(&self.shared);
            if !out.is_empty() || tokio::time::Instant::now() >= deadline || self.events_pending() {
                return Ok(out);
            }
        }
    }

    /// The membership machine and its wake-ups, for tests that count the driver's work.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    fn events_pending(&self) -> bool {
        self.shared.lock().has_events()
    }

    async fn run_handlers(&mut self) -> Result<(), ConsumerError> {
        let auto = self.config.auto_commit_interval.is_some();
        let positions: BTreeMap<TopicPartition, i64> = if auto {
            self.reader
                .assignment()
                .into_iter()
                .filter_map(|tp| self.reader.position(&tp).map(|p| (tp, p)))
                .collect()
        } else {
            BTreeMap::new()
        };
        let mut adapter = AutoCommitting {
            inner: &mut self.listener,
            client: &self.client,
            token: self.poll_path.handle(),
            positions,
        };
        self.poll_path.drive(&self.shared, &mut adapter).await
    }

    /// Brings the reader in line with what the application holds: drops what is no longer held,
    /// starts newly held partitions at their committed offset (or per the reset policy).
    async fn sync_assignment(&mut self) -> Result<(), ConsumerError> {
        let owned = self.assignment();
        for tp in self.reader.assignment() {
            if !owned.contains(&tp) {
                self.reader.unassign(&tp);
            }
        }
        let current: BTreeSet<TopicPartition> = self.reader.assignment().into_iter().collect();
        let new: Vec<TopicPartition> = owned.difference(&current).cloned().collect();
        if new.is_empty() {
            return Ok(());
        }
        let committed = committed_offsets(&self.client, &self.config.group.group_id, &new).await?;
        for (tp, offset) in committed {
            let start = match (offset, self.config.reader.reset) {
                (Some(o), _) => StartAt::Offset(o),
                (None, OffsetReset::Earliest) => StartAt::Earliest,
                (None, OffsetReset::Latest) => StartAt::Latest,
                (None, _) => return Err(ConsumerError::NoCommittedOffset { partition: tp }),
            };
            self.reader.assign(tp, start);
        }
        Ok(())
    }

    async fn maybe_auto_commit(&mut self) -> Result<(), ConsumerError> {
        let Some(interval) = self.config.auto_commit_interval else {
            return Ok(());
        };
        if self.last_auto_commit.elapsed() < interval {
            return Ok(());
        }
        self.last_auto_commit = tokio::time::Instant::now();
        self.commit_positions().await
    }

    /// Commits the current positions of every owned partition.
    ///
    /// Not cancel-safe in outcome: if dropped, the commit may or may not have happened.
    pub async fn commit_positions(&self) -> Result<(), ConsumerError> {
        let offsets: BTreeMap<TopicPartition, i64> = self
            .reader
            .assignment()
            .into_iter()
            .filter_map(|tp| self.reader.position(&tp).map(|p| (tp, p)))
            .collect();
        self.commit_offsets(&offsets).await
    }

    /// Commits `offsets` (the next offset to read) with the group metadata published by the latest
    /// poll. Fails with [`ConsumerError::NotJoined`] before the first join and with
    /// [`ConsumerError::CommitFenced`] if the coordinator no longer accepts this member.
    ///
    /// Not cancel-safe in outcome: if dropped, the commit may or may not have happened.
    pub async fn commit_offsets(
        &self,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<(), ConsumerError> {
        let token = self.poll_path.handle().require()?;
        commit_offsets(&self.client, &token, offsets).await
    }

    /// The group's committed offsets for `partitions`.
    ///
    /// Cancel-safe: it only reads.
    pub async fn committed(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, Option<i64>>, ConsumerError> {
        committed_offsets(&self.client, &self.config.group.group_id, partitions).await
    }

    /// Leaves the group: revokes every partition through the listener (auto-committing first if
    /// enabled), sends the leave request, and stops the background task. Waits at most `timeout` for
    /// the coordinator.
    ///
    /// Not cancel-safe: if dropped, the background task is stopped and the member's session expires on
    /// the coordinator instead.
    pub async fn close(mut self, timeout: Duration) -> Result<(), ConsumerError> {
        self.shared.lock().leave();
        self.shared.wake.notify_one();
        let result = self.run_handlers().await;
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(timeout, task).await.is_err() {
                abort.abort();
            }
        }
        // Release the fetch sessions on their brokers (one slot each, 1 000 by default per broker)
        // instead of leaving them to be evicted; bounded, since a broker may be unreachable.
        let _ = tokio::time::timeout(timeout, self.reader.close()).await;
        match result {
            Err(ConsumerError::GroupFatal { .. }) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl<L: RebalanceListener> Drop for GroupConsumer<L> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Wraps the application's listener: with auto-commit on, commits the positions of partitions being
/// revoked before the application's handler runs (while the commit is still accepted).
struct AutoCommitting<'a, L> {
    inner: &'a mut L,
    client: &'a Client,
    token: GroupMetadataHandle,
    positions: BTreeMap<TopicPartition, i64>,
}

impl<L: RebalanceListener> RebalanceListener for AutoCommitting<'_, L> {
    async fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        if !self.positions.is_empty() {
            let offsets: BTreeMap<TopicPartition, i64> = partitions
                .iter()
                .filter_map(|tp| self.positions.get(tp).map(|o| (tp.clone(), *o)))
                .collect();
            if let Ok(token) = self.token.require() {
                if let Err(e) = commit_offsets(self.client, &token, &offsets).await {
                    tracing::warn!(error = %e, "auto-commit before revocation failed");
                }
            }
        }
        self.inner.on_partitions_revoked(partitions).await
    }

    async fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        self.inner.on_partitions_assigned(partitions).await
    }

    async fn on_partitions_lost(&mut self, partitions: &[TopicPartition], reason: LostReason) {
        self.inner.on_partitions_lost(partitions, reason).await
    }
}

/// Drives the membership machine's I/O until it is closed.
///
/// Each request runs as a task of its own. The machine must hear back about every request it handed
/// out, or it waits for that answer for ever (it has no timer of its own for an answer). A task's output
/// carries the request id, but a panicked or cancelled task has no output, so the id is also kept here,
/// keyed by the tokio task id that [`JoinError`](tokio::task::JoinError) still reports: a dead request
/// task becomes `handle_failure` for its request, exactly like a transport error.
async fn run_membership(client: Client, group_id: String, shared: Arc<Shared>) {
    let mut inflight = tokio::task::JoinSet::new();
    let mut requests: HashMap<tokio::task::Id, (RequestId, &'static str)> = HashMap::new();
    loop {
        #[cfg(test)]
        shared.faults.hit("membership driver");
        let (deadline, closed, for_app) = {
            let mut m = shared.lock();
            let t = now();
            m.handle_timeout(t);
            while let Some(transmit) = m.poll_transmit(t) {
                let id = transmit.id;
                let name = transmit.request.name();
                let client = client.clone();
                let group_id = group_id.clone();
                #[cfg(test)]
                let faults = shared.clone();
                let task = inflight.spawn(async move {
                    #[cfg(test)]
                    faults.faults.hit("group request");
                    execute(&client, &group_id, transmit).await
                });
                requests.insert(task.id(), (id, name));
            }
            (m.poll_timeout(), m.is_closed(), m.has_events())
        };
        #[cfg(test)]
        shared
            .driver_passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if for_app || closed {
            shared.app_wake.notify_one();
        }
        if closed && inflight.is_empty() {
            return;
        }
        let sleep = deadline.map(tokio::time::Instant::from_std);
        tokio::select! {
            Some(joined) = inflight.join_next_with_id(), if !inflight.is_empty() => {
                let task = match &joined {
                    Ok((task, _)) => *task,
                    Err(e) => e.id(),
                };
                // Every spawned task was entered in the map; a miss would be a bug here, and the only
                // safe reading of it is that no request of the machine's is affected.
                let Some((id, name)) = requests.remove(&task) else {
                    tracing::error!(group = %group_id, "a group request task finished unrecorded");
                    continue;
                };
                match joined {
                    Ok((_, Ok(response))) => shared.lock().handle_response(now(), id, response),
                    Ok((_, Err(e))) => {
                        tracing::debug!(group = %group_id, request = name, error = %e, "group request failed");
                        shared.lock().handle_failure(now(), id);
                    }
                    Err(e) => {
                        tracing::error!(group = %group_id, request = name, error = %e, "group request task died; treated as a failed request");
                        shared.lock().handle_failure(now(), id);
                    }
                }
            }
            _ = sleep_until(sleep) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A member id for the consumer protocol (KIP-1082: the client makes it, unique for the life of the
/// process): 16 random bytes, base64url without padding, the shape Java uses. The randomness is the
/// per-process random keys of std's hasher, so no extra dependency is needed.
pub(crate) fn random_member_id() -> String {
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Member ids are Java-shaped (22 base64url characters) and distinct.
    #[test]
    fn member_ids_are_unique_and_java_shaped() {
        let ids: BTreeSet<String> = (0..100).map(|_| random_member_id()).collect();
        assert_eq!(ids.len(), 100);
        for id in &ids {
            assert_eq!(id.len(), 22);
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
    }
}
