//! One connection to one broker: many requests in flight, responses matched by correlation id.
//!
//! Two tasks own the socket. The writer task owns the write half and takes whole frames from a bounded
//! queue, so a frame handed to it is always written completely, whatever happens to the request future
//! that queued it; that is what makes dropping a request future safe. The reader task owns the read half,
//! cuts frames with the pure [`FrameDecoder`] and hands each to the waiter registered under its
//! correlation id.
//!
//! Anything that breaks the pairing of requests and responses (an unreadable length prefix, a response
//! for a correlation id nobody is waiting for, the peer closing mid-frame, a request that timed out whose
//! late answer could otherwise be taken for another's) *poisons* the connection: every waiter fails with
//! the same [`ConnectionFailure`], both tasks stop, the socket is closed, and the pool opens a new one.
//!
//! # References
//! - Kafka protocol guide, "Network": requests on one connection are answered in order, but nothing
//!   here relies on that; responses are matched by correlation id only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use super::error::{ConnectionFailure, NetError};
use crate::telemetry::{self, ConnMetrics, InFlight, CONNECTIONS_POISONED};
use crate::wire::{self, ApiRequest, FrameDecoder, WireError};

/// Settings of one connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnOptions {
    /// The peer's address, for error messages.
    pub addr: String,
    /// Sent in every request header.
    pub client_id: Arc<str>,
    /// Largest frame accepted from the peer or sent to it.
    pub max_frame_size: usize,
    /// Requests sent or waiting for an answer at once; also the writer queue's length.
    pub max_in_flight: usize,
    /// How often the reader looks for abandoned requests whose answer is overdue.
    pub sweep_interval: Duration,
}

/// A handle to a live (or poisoned) connection. Cheap to clone; the socket closes when the last
/// handle is dropped.
#[derive(Clone)]
pub(crate) struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    writer: mpsc::Sender<Bytes>,
    in_flight: Arc<Semaphore>,
    /// The semaphore's permits: all of them make the connection [`Exclusive`].
    slots: u32,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.fail(ConnectionFailure::Shutdown);
    }
}

struct Shared {
    opts: ConnOptions,
    state: Mutex<State>,
    closed: watch::Sender<bool>,
    /// Registered once here, so recording per request allocates nothing.
    metrics: ConnMetrics,
    /// Points inside the reader and writer that a test can make panic.
    #[cfg(test)]
    faults: crate::supervise::Faults,
}

#[derive(Default)]
struct State {
    pending: HashMap<i32, Pending>,
    next_correlation_id: i32,
    failure: Option<ConnectionFailure>,
}

/// A correlation id that has been handed out and not yet answered.
enum Pending {
    /// Someone is waiting for the answer.
    Waiting {
        answer: oneshot::Sender<Result<Bytes, ConnectionFailure>>,
        deadline: Instant,
        timeout: Duration,
        _slot: Slot,
    },
    /// The waiter went away after its frame was queued. The frame is (or will be) on the wire, so an
    /// answer will come; it is discarded when it does. The entry keeps its in-flight slot and deadline so
    /// that abandoned requests stay counted and a peer that never answers them is still noticed.
    Abandoned {
        deadline: Instant,
        timeout: Duration,
        _slot: Slot,
    },
}

/// An in-flight slot, counted in the in-flight gauge for exactly as long as it is held. A request of an
/// [`Exclusive`] holder takes no permit of its own: the holder has them all.
struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    _counted: InFlight,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map half-updated in a way that matters more
        // than losing the connection, so a poisoned mutex is simply used as is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Poisons the connection: records why, fails every waiter, and tells both tasks to stop. Only the
    /// first failure is kept; later ones are consequences of it.
    fn fail(&self, failure: ConnectionFailure) {
        let drained = {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            state.failure = Some(failure.clone());
            std::mem::take(&mut state.pending)
        };
        if let Some(reason) = telemetry::poison_reason(&failure) {
            tracing::debug!(addr = %self.opts.addr, %failure, waiting = drained.len(), "connection poisoned");
            telemetry::count(&CONNECTIONS_POISONED, Some(reason));
        }
        for (_, pending) in drained {
            if let Pending::Waiting { answer, .. } = pending {
                let _ = answer.send(Err(failure.clone()));
            }
        }
        let _ = self.closed.send(true);
    }

    fn failure(&self) -> Option<ConnectionFailure> {
        self.lock().failure.clone()
    }

    /// Hands a response frame to its waiter.
    fn dispatch(&self, frame: Bytes) -> Result<(), ConnectionFailure> {
        // The size prefix the decoder cut off counts too: these are the bytes the socket carried.
        self.metrics.received(4 + frame.len());
        let correlation_id =
            wire::response_correlation_id(&frame).map_err(ConnectionFailure::Frame)?;
        let mut state = self.lock();
        match state.pending.remove(&correlation_id) {
            Some(Pending::Waiting { answer, .. }) => {
                // The waiter may be dropping at this very moment; its guard will find no entry, which
                // is fine either way.
                let _ = answer.send(Ok(frame));
                Ok(())
            }
            Some(Pending::Abandoned { .. }) => Ok(()),
            None => Err(ConnectionFailure::UnexpectedCorrelationId(correlation_id)),
        }
    }

    /// The timeout of an abandoned request whose deadline has passed, if there is one.
    fn overdue_abandoned(&self, now: Instant) -> Option<Duration> {
        self.lock().pending.values().find_map(|p| match p {
            Pending::Abandoned {
                deadline, timeout, ..
            } if *deadline <= now => Some(*timeout),
            _ => None,
        })
    }
}

/// The connection with every in-flight slot held ([`Connection::exclusive`]): only its holder sends,
/// one request at a time, until it is dropped. What a SASL re-authentication (KIP-368) needs: no other
/// request between its handshake and its last authenticate.
pub(crate) struct Exclusive {
    conn: Connection,
    _all: OwnedSemaphorePermit,
}

impl Exclusive {
    /// [`Connection::request`], sent while every other request waits.
    pub(crate) async fn request<R: ApiRequest>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, NetError> {
        self.conn.request_in(request, version, timeout, true).await
    }

    /// The peer's address.
    pub(crate) fn addr(&self) -> &str {
        self.conn.addr()
    }
}

/// Removes (or marks abandoned) the correlation entry of a request whose future ends early.
struct PendingGuard {
    shared: Arc<Shared>,
    correlation_id: i32,
    queued: bool,
    finished: bool,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut state = self.shared.lock();
        if let Some(Pending::Waiting {
            deadline,
            timeout,
            _slot,
            ..
        }) = state.pending.remove(&self.correlation_id)
        {
            if self.queued {
                let abandoned = Pending::Abandoned {
                    deadline,
                    timeout,
                    _slot,
                };
                state.pending.insert(self.correlation_id, abandoned);
            }
        }
    }
}

impl Connection {
    /// Starts the reader and writer tasks over an already connected byte stream.
    pub(crate) fn spawn<Rd, Wr>(read: Rd, write: Wr, opts: ConnOptions) -> Connection
    where
        Rd: AsyncRead + Send + Unpin + 'static,
        Wr: AsyncWrite + Send + Unpin + 'static,
    {
        let max_in_flight = opts
            .max_in_flight
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        let (writer, queue) = mpsc::channel(max_in_flight);
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            opts,
            state: Mutex::new(State::default()),
            closed,
            metrics: ConnMetrics::new(),
            #[cfg(test)]
            faults: crate::supervise::Faults::default(),
        });
        // Supervised: a reader that died would leave every waiter to its own deadline (a JoinGroup's
        // can be minutes) while the pool kept handing the connection out as usable; a dead writer would
        // leave queued frames unwritten the same way. Either poisons the connection instead.
        let poison = |task: &'static str| {
            let shared = Arc::downgrade(&shared);
            move |failure: crate::supervise::Failure| {
                if let Some(shared) = shared.upgrade() {
                    shared.fail(ConnectionFailure::TaskFailed {
                        task,
                        failure: failure.to_string(),
                    });
                }
            }
        };
        crate::supervise::spawn(write_loop(write, queue, shared.clone()), poison("writer"));
        crate::supervise::spawn(read_loop(read, shared.clone()), poison("reader"));
        Connection {
            inner: Arc::new(Inner {
                shared,
                writer,
                in_flight: Arc::new(Semaphore::new(max_in_flight)),
                slots: u32::try_from(max_in_flight).unwrap_or(u32::MAX),
            }),
        }
    }

    /// Takes every in-flight slot: waits until each request in flight is answered (or abandoned and
    /// answered), and holds back every later request until the returned holder is dropped. Requests
    /// queued before this call go first (the semaphore is fair). `None` when that did not happen by
    /// `deadline` (nothing is then held).
    ///
    /// Cancel-safe: dropped while waiting, it holds nothing.
    pub(crate) async fn exclusive(&self, deadline: Instant) -> Option<Exclusive> {
        let all = self
            .inner
            .in_flight
            .clone()
            .acquire_many_owned(self.inner.slots);
        match timeout_at(deadline, all).await {
            Ok(Ok(permits)) => Some(Exclusive {
                conn: self.clone(),
                _all: permits,
            }),
            _ => None,
        }
    }

    /// The peer's address.
    pub(crate) fn addr(&self) -> &str {
        &self.inner.shared.opts.addr
    }

    /// Whether the connection can still carry requests.
    pub(crate) fn is_usable(&self) -> bool {
        self.inner.shared.failure().is_none()
    }

    /// Sends `request` at `version` and decodes its response.
    ///
    /// Cancel-safe in the sense that matters on a shared connection: if the future is dropped, either
    /// no byte of the request was queued, or the whole frame is written by the writer task and its
    /// answer is discarded on arrival. The broker may still act on a request whose future was dropped.
    pub(crate) async fn request<R: ApiRequest>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, NetError> {
        self.request_in(request, version, timeout, false).await
    }

    /// [`request`](Self::request); `exclusive`: sent by the [`Exclusive`] holder, without a slot.
    async fn request_in<R: ApiRequest>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
        exclusive: bool,
    ) -> Result<R::Response, NetError> {
        let opts = &self.inner.shared.opts;
        let frame = self
            .round_trip_in(timeout, exclusive, |correlation_id| {
                wire::encode_request(
                    request,
                    version,
                    correlation_id,
                    &opts.client_id,
                    opts.max_frame_size,
                )
            })
            .await?;
        let (_, response) =
            wire::decode_response::<R>(frame, version).map_err(|e| self.protocol(e))?;
        Ok(response)
    }

    /// Registers a correlation id, queues the frame `encode` builds for it, and waits for the answer
    /// frame. Cancel-safe as described on [`Connection::request`].
    pub(crate) async fn round_trip(
        &self,
        timeout: Duration,
        encode: impl FnOnce(i32) -> Result<Bytes, WireError>,
    ) -> Result<Bytes, NetError> {
        self.round_trip_in(timeout, false, encode).await
    }

    async fn round_trip_in(
        &self,
        timeout: Duration,
        exclusive: bool,
        encode: impl FnOnce(i32) -> Result<Bytes, WireError>,
    ) -> Result<Bytes, NetError> {
        let shared = &self.inner.shared;
        let deadline = Instant::now() + timeout;
        let permit = if exclusive {
            Ok(Ok(None))
        } else {
            timeout_at(deadline, self.inner.in_flight.clone().acquire_owned())
                .await
                .map(|p| p.map(Some))
        };
        let slot = match permit {
            Ok(Ok(permit)) => Slot {
                _permit: permit,
                _counted: shared.metrics.in_flight(),
            },
            // The semaphore is never closed; treat it like a dead connection all the same.
            Ok(Err(_)) => return Err(self.dead(false)),
            // Every slot stayed busy for a whole timeout. Nothing was sent, and other requests may
            // legitimately be waiting long (a JoinGroup spans a rebalance), so the connection stays;
            // requests that overrun their own deadlines reset it themselves.
            Err(_) => return Err(self.timed_out(timeout, false)),
        };
        let (answer, mut answered) = oneshot::channel();
        let correlation_id = {
            let mut state = shared.lock();
            if let Some(failure) = &state.failure {
                return Err(NetError::Connection {
                    addr: self.addr().to_owned(),
                    failure: failure.clone(),
                    outcome_unknown: false,
                });
            }
            let id = next_free_id(&mut state);
            state.pending.insert(
                id,
                Pending::Waiting {
                    answer,
                    deadline,
                    timeout,
                    _slot: slot,
                },
            );
            id
        };
        let mut guard = PendingGuard {
            shared: shared.clone(),
            correlation_id,
            queued: false,
            finished: false,
        };
        let frame = encode(correlation_id).map_err(|e| self.protocol(e))?;
        let (api_key, sent_bytes, started) = (
            wire::request_api(&frame).map_or(-1, |(key, _)| key),
            frame.len(),
            Instant::now(),
        );
        match timeout_at(deadline, self.inner.writer.reserve()).await {
            Ok(Ok(permit)) => {
                // No await between taking the queue slot and recording that the frame is queued, so a
                // drop can never see one without the other.
                permit.send(frame);
                guard.queued = true;
                shared.metrics.sent(sent_bytes);
            }
            Ok(Err(_)) => return Err(self.dead(false)),
            Err(_) => {
                shared.fail(ConnectionFailure::RequestTimedOut(timeout));
                return Err(self.timed_out(timeout, false));
            }
        }
        match timeout_at(deadline, &mut answered).await {
            Ok(Ok(Ok(frame))) => {
                guard.finished = true;
                let elapsed = started.elapsed();
                shared.metrics.answered(api_key, elapsed);
                // Where a workload's time goes, request by request (docs/benchmarks.md reads these to
                // tell the client's round trips from the broker's waits).
                tracing::trace!(
                    addr = self.addr(),
                    api_key,
                    correlation_id,
                    sent_bytes,
                    received_bytes = frame.len(),
                    micros = elapsed.as_micros() as u64,
                    "round trip"
                );
                Ok(frame)
            }
            Ok(Ok(Err(failure))) => Err(NetError::Connection {
                addr: self.addr().to_owned(),
                failure,
                outcome_unknown: true,
            }),
            Ok(Err(_)) => Err(self.dead(true)),
            Err(_) => {
                // The answer may still come; after a reset it cannot be mistaken for anything else.
                shared.fail(ConnectionFailure::RequestTimedOut(timeout));
                Err(self.timed_out(timeout, true))
            }
        }
    }

    fn dead(&self, outcome_unknown: bool) -> NetError {
        NetError::Connection {
            addr: self.addr().to_owned(),
            failure: self
                .inner
                .shared
                .failure()
                .unwrap_or(ConnectionFailure::Closed),
            outcome_unknown,
        }
    }

    fn timed_out(&self, after: Duration, outcome_unknown: bool) -> NetError {
        NetError::Timeout {
            addr: self.addr().to_owned(),
            after,
            outcome_unknown,
        }
    }

    fn protocol(&self, source: WireError) -> NetError {
        NetError::Protocol {
            addr: self.addr().to_owned(),
            source,
        }
    }

    /// The reader's and writer's fault points.
    #[cfg(test)]
    pub(crate) fn faults(&self) -> &crate::supervise::Faults {
        &self.inner.shared.faults
    }

    #[cfg(test)]
    pub(crate) fn pending_len(&self) -> usize {
        self.inner.shared.lock().pending.len()
    }

    #[cfg(test)]
    pub(crate) fn failure(&self) -> Option<ConnectionFailure> {
        self.inner.shared.failure()
    }
}

/// The next correlation id not currently in use. Ids wrap around within the non-negative range; one
/// still pending (a very slow answer after 2^31 requests) is skipped rather than reused.
fn next_free_id(state: &mut State) -> i32 {
    loop {
        let id = state.next_correlation_id;
        state.next_correlation_id = if id == i32::MAX { 0 } else { id + 1 };
        if !state.pending.contains_key(&id) {
            return id;
        }
    }
}

async fn write_loop<Wr: AsyncWrite + Unpin>(
    mut write: Wr,
    mut queue: mpsc::Receiver<Bytes>,
    shared: Arc<Shared>,
) {
    let mut closed = shared.closed.subscribe();
    loop {
        let frame = tokio::select! {
            frame = queue.recv() => frame,
            _ = closed.wait_for(|c| *c) => return,
        };
        let Some(frame) = frame else {
            // Every handle is gone.
            let _ = write.shutdown().await;
            return;
        };
        #[cfg(test)]
        shared.faults.hit("writer");
        // Once a frame is taken off the queue it is written to the end: stopping part-way would leave
        // the broker reading the next frame's bytes as the rest of this one. The only way out mid-frame
        // is the connection being poisoned, after which the socket is closed anyway.
        let written = tokio::select! {
            r = write_batch(&mut write, frame, &mut queue) => r,
            _ = closed.wait_for(|c| *c) => return,
        };
        if let Err(e) = written {
            shared.fail(ConnectionFailure::Io(e.to_string()));
            return;
        }
    }
}

/// Writes `first` and whatever else is already queued, then flushes once.
async fn write_batch<Wr: AsyncWrite + Unpin>(
    write: &mut Wr,
    first: Bytes,
    queue: &mut mpsc::Receiver<Bytes>,
) -> std::io::Result<()> {
    write.write_all(&first).await?;
    while let Ok(next) = queue.try_recv() {
        write.write_all(&next).await?;
    }
    write.flush().await
}

/// Initial receive buffer; it grows as large frames arrive.
const READ_BUFFER: usize = 16 * 1024;

async fn read_loop<Rd: AsyncRead + Unpin>(mut read: Rd, shared: Arc<Shared>) {
    let decoder = FrameDecoder::new(shared.opts.max_frame_size);
    let mut closed = shared.closed.subscribe();
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    let mut sweep = tokio::time::interval(shared.opts.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    #[cfg(test)]
                    shared.faults.hit("reader");
                    if let Err(failure) = shared.dispatch(frame) {
                        shared.fail(failure);
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.fail(ConnectionFailure::Frame(e));
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(READ_BUFFER);
        }
        tokio::select! {
            read = read.read_buf(&mut buf) => match read {
                Ok(0) => {
                    shared.fail(if buf.is_empty() {
                        ConnectionFailure::Closed
                    } else {
                        ConnectionFailure::ClosedMidFrame
                    });
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    shared.fail(ConnectionFailure::Io(e.to_string()));
                    return;
                }
            },
            _ = sweep.tick() => {
                if let Some(timeout) = shared.overdue_abandoned(Instant::now()) {
                    // A request whose caller gave up was never answered: the peer is stuck.
                    shared.fail(ConnectionFailure::RequestTimedOut(timeout));
                    return;
                }
            }
            _ = closed.wait_for(|c| *c) => return,
        }
    }
}
