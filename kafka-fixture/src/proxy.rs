//! A TCP proxy in front of brokers that breaks the network on command, for tests of how a client
//! behaves when packets stop, answers get lost or connections die mid-response.
//!
//! [`FaultProxy::start`] opens one loopback listener per upstream broker address; a client reaches the
//! brokers through it by dialing [`FaultProxy::listen_addr`] instead of the broker (snapfence: a
//! `Dialer` that rewrites each broker address, see `protocol-tests/tests/dialer.rs`). Each upstream has
//! its own [`Fault`], changed at any time with [`FaultProxy::set`]; it applies to the connections
//! already open as well as to new ones.
//!
//! The proxy reads Kafka's framing (a 4-byte size, then the frame) so that a fault starts and ends at a
//! frame boundary: a dropped response is a whole response, never half of one the client would read as
//! garbage. It pairs responses with requests by correlation id, so a fault can be limited to the
//! responses of some APIs (the Produce responses, say, while Metadata still answers). Frames are copied
//! in chunks: nothing is allocated from a length read off the wire. That framing is also why the proxy
//! serves plaintext listeners only (over TLS it would see records, not Kafka frames).
//!
//! Every task (one accept loop per upstream, one per proxied connection) is aborted when the
//! [`FaultProxy`] is dropped. A task that panics or an accept loop that fails is recorded, and [`FaultProxy::check`] reports the first such failure as a
//! [`ProxyError`]; a connection that one side closes or resets is normal and ends quietly.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Which responses a response fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requests {
    /// Every response.
    All,
    /// Only responses to requests with one of these API keys (0 = Produce, 26 = EndTxn,
    /// 28 = TxnOffsetCommit, …).
    ApiKeys(Vec<i16>),
}

impl Requests {
    fn matches(&self, api_key: Option<i16>) -> bool {
        match self {
            Requests::All => true,
            Requests::ApiKeys(keys) => api_key.is_some_and(|k| keys.contains(&k)),
        }
    }
}

/// What the proxy does to one upstream's traffic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fault {
    /// Bytes flow both ways unchanged.
    #[default]
    PassThrough,
    /// A partition: connections are still accepted, but nothing is forwarded either way and nothing is
    /// closed or reset. Bytes already in flight wait in the proxy (and the kernel's buffers), so on
    /// healing they are delivered, as TCP would after a partition ends.
    Blackhole,
    /// Requests reach the broker; the matching responses are read from the broker and thrown away, so
    /// the client cannot know whether its request was acted on.
    DropResponses(Requests),
    /// The next matching response on each connection is cut: its size and about half of its bytes are
    /// forwarded, then the client's side is reset (RST) and the broker's side closed.
    ResetMidResponse(Requests),
    /// Every frame, both ways, waits `base` plus a random part of `jitter` before it is forwarded.
    /// Frames in one direction keep their order.
    Latency {
        /// The delay every frame gets.
        base: Duration,
        /// The most a frame gets on top of `base`, drawn uniformly per frame.
        jitter: Duration,
    },
}

/// Why the proxy could not start, could not be controlled, or stopped working.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// An upstream is not a loopback `ip:port`: the proxy never forwards anywhere else.
    #[error("upstream {0:?} is not a loopback ip:port")]
    NotLoopback(String),
    /// A loopback listener could not be opened.
    #[error("cannot listen for upstream {upstream}: {source}")]
    Bind {
        /// The upstream the listener was for.
        upstream: String,
        /// What binding failed with.
        #[source]
        source: io::Error,
    },
    /// The address is not one of this proxy's upstreams.
    #[error("{0} is not an upstream of this proxy")]
    UnknownUpstream(String),
    /// An accept loop failed.
    #[error("proxy for {upstream}: {message}")]
    Io {
        /// The upstream concerned.
        upstream: String,
        /// What failed.
        message: String,
    },
    /// A proxy task panicked.
    #[error("proxy task {task} panicked: {message}")]
    TaskFailed {
        /// Which task (the accept loop or a connection of an upstream).
        task: String,
        /// The panic's message.
        message: String,
    },
}

/// What happened on one upstream so far; for tests to prove their fault was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Request frames forwarded to the broker.
    pub requests: u64,
    /// Response frames forwarded to the client.
    pub responses: u64,
    /// Response frames read from the broker and thrown away ([`Fault::DropResponses`]).
    pub dropped_responses: u64,
    /// Connections reset part-way through a response ([`Fault::ResetMidResponse`]).
    pub resets: u64,
    /// Frames that had to wait at a [`Fault::Blackhole`] (counted when they start waiting).
    pub held: u64,
    /// Client connections reset at once because the broker refused the proxy's connection (a killed
    /// broker, say): the client sees what it would see without the proxy.
    pub upstream_refused: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    requests: AtomicU64,
    responses: AtomicU64,
    dropped_responses: AtomicU64,
    resets: AtomicU64,
    held: AtomicU64,
    upstream_refused: AtomicU64,
}

struct Route {
    upstream: SocketAddr,
    local: SocketAddr,
    fault: watch::Sender<Fault>,
    counters: Counters,
}

struct Shared {
    failures: Mutex<Vec<ProxyError>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Seeds each connection's jitter, so a run's delays follow from its seed.
    seed: u64,
    next_conn: AtomicU64,
    /// Test builds only: the next connection's task panics, to prove the supervision reports it.
    #[cfg(test)]
    panic_next: std::sync::atomic::AtomicBool,
}

/// A running fault-injecting proxy; dropping it stops every listener and connection.
pub struct FaultProxy {
    routes: HashMap<String, Arc<Route>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.routes.iter().map(|(k, r)| (k, r.local)))
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind (a list), still fine to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultProxy {
    /// Opens one loopback listener per upstream (`"127.0.0.1:port"`), all passing traffic through.
    /// `seed` drives the latency jitter. Must be called inside a tokio runtime (with I/O and time).
    pub async fn start<I, S>(upstreams: I, seed: u64) -> Result<FaultProxy, ProxyError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let shared = Arc::new(Shared {
            failures: Mutex::new(Vec::new()),
            tasks: Mutex::new(Vec::new()),
            seed,
            next_conn: AtomicU64::new(0),
            #[cfg(test)]
            panic_next: Default::default(),
        });
        let mut routes = HashMap::new();
        for upstream in upstreams {
            let name: String = upstream.into();
            let addr: SocketAddr = match name.parse::<SocketAddr>() {
                Ok(a) if a.ip().is_loopback() => a,
                _ => return Err(ProxyError::NotLoopback(name)),
            };
            if routes.contains_key(&name) {
                continue;
            }
            let listener =
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(|source| ProxyError::Bind {
                        upstream: name.clone(),
                        source,
                    })?;
            let local = listener.local_addr().map_err(|source| ProxyError::Bind {
                upstream: name.clone(),
                source,
            })?;
            let route = Arc::new(Route {
                upstream: addr,
                local,
                fault: watch::channel(Fault::PassThrough).0,
                counters: Counters::default(),
            });
            spawn_supervised(
                &shared,
                format!("accept loop for {name}"),
                accept_loop(listener, route.clone(), shared.clone()),
            );
            routes.insert(name, route);
        }
        Ok(FaultProxy { routes, shared })
    }

    /// The listener that stands for `upstream`.
    pub fn listen_addr(&self, upstream: &str) -> Option<SocketAddr> {
        self.routes.get(upstream).map(|r| r.local)
    }

    /// Every upstream with the address of its listener.
    pub fn routes(&self) -> HashMap<String, SocketAddr> {
        self.routes
            .iter()
            .map(|(k, r)| (k.clone(), r.local))
            .collect()
    }

    /// Applies `fault` to `upstream`'s traffic, on open connections and new ones alike.
    pub fn set(&self, upstream: &str, fault: Fault) -> Result<(), ProxyError> {
        let route = self
            .routes
            .get(upstream)
            .ok_or_else(|| ProxyError::UnknownUpstream(upstream.to_owned()))?;
        route.fault.send_replace(fault);
        Ok(())
    }

    /// Applies `fault` to every upstream.
    pub fn set_all(&self, fault: Fault) {
        for route in self.routes.values() {
            route.fault.send_replace(fault.clone());
        }
    }

    /// Back to [`Fault::PassThrough`] everywhere.
    pub fn heal(&self) {
        self.set_all(Fault::PassThrough);
    }

    /// What `upstream` has seen so far.
    pub fn stats(&self, upstream: &str) -> Result<ProxyStats, ProxyError> {
        let c = &self
            .routes
            .get(upstream)
            .ok_or_else(|| ProxyError::UnknownUpstream(upstream.to_owned()))?
            .counters;
        Ok(ProxyStats {
            connections: c.connections.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            responses: c.responses.load(Ordering::Relaxed),
            dropped_responses: c.dropped_responses.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
            upstream_refused: c.upstream_refused.load(Ordering::Relaxed),
        })
    }

    /// The first failure of a proxy task so far (a panic, a failed accept loop), taken out of the
    /// record; `Ok` when nothing failed.
    pub fn check(&self) -> Result<(), ProxyError> {
        let mut failures = lock(&self.shared.failures);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.remove(0))
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for task in lock(&self.shared.tasks).drain(..) {
            task.abort();
        }
    }
}

/// Spawns `task` and a watcher that records its panic; the task's abort handle is kept so dropping
/// the proxy stops it (an abort is not a failure).
fn spawn_supervised<F>(shared: &Arc<Shared>, name: String, task: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let handle = tokio::spawn(task);
    {
        let mut tasks = lock(&shared.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle.abort_handle());
    }
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        if let Err(e) = handle.await {
            if let (Ok(payload), Some(shared)) = (e.try_into_panic(), shared.upgrade()) {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                lock(&shared.failures).push(ProxyError::TaskFailed {
                    task: name,
                    message,
                });
            }
        }
    });
}

async fn accept_loop(listener: TcpListener, route: Arc<Route>, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            // The client gave up between SYN and accept: nothing to serve, nothing wrong here.
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) => {
                lock(&shared.failures).push(ProxyError::Io {
                    upstream: route.upstream.to_string(),
                    message: format!("accept failed, listener stopped: {e}"),
                });
                return;
            }
        };
        route.counters.connections.fetch_add(1, Ordering::Relaxed);
        let n = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let rng = Rng::new(shared.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let name = format!("connection {n} to {}", route.upstream);
        #[cfg(test)]
        let panic_here = shared.panic_next.swap(false, Ordering::SeqCst);
        let route = route.clone();
        spawn_supervised(&shared, name, async move {
            #[cfg(test)]
            if panic_here {
                panic!("armed by the test");
            }
            serve(client, route, rng).await
        });
    }
}

/// How one direction of a connection ended.
enum End {
    /// A side closed or failed: close the other quietly.
    Closed,
    /// A [`Fault::ResetMidResponse`] fired: reset the client.
    Reset,
}

async fn serve(client: TcpStream, route: Arc<Route>, rng: Rng) {
    let Ok(broker) = TcpStream::connect(route.upstream).await else {
        // A broker that is down is part of a test, not a proxy failure. The client sees what it would
        // see from the broker: a refused (reset) connection.
        route
            .counters
            .upstream_refused
            .fetch_add(1, Ordering::Relaxed);
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = broker.set_nodelay(true);
    // Both directions share each socket by reference (no split halves): an owned write half would
    // send a FIN when dropped, before a reset could be set up.
    // Correlation id -> API key of requests awaiting their response (acks=0 produce never gets one;
    // those entries die with the connection).
    let pending = Mutex::new(HashMap::new());
    let end = tokio::select! {
        end = requests(&client, &broker, &route, &pending, rng.clone()) => end,
        end = responses(&broker, &client, &route, &pending, rng.fork()) => end,
    };
    if let End::Reset = end {
        route.counters.resets.fetch_add(1, Ordering::Relaxed);
        let _ = client.set_zero_linger();
    }
}

/// Waits out the current fault before a frame (or a chunk of one) is forwarded: blackholed, it waits
/// until healed; with latency, it sleeps once per frame.
async fn gate(
    fault: &mut watch::Receiver<Fault>,
    held: &AtomicU64,
    rng: &mut Rng,
    frame_start: bool,
) -> bool {
    if *fault.borrow_and_update() == Fault::Blackhole {
        held.fetch_add(1, Ordering::Relaxed);
    }
    let current = match fault.wait_for(|f| *f != Fault::Blackhole).await {
        Ok(f) => f.clone(),
        // The proxy is gone.
        Err(_) => return false,
    };
    if let (Fault::Latency { base, jitter }, true) = (current, frame_start) {
        tokio::time::sleep(base + rng.up_to(jitter)).await;
    }
    true
}

const CHUNK: usize = 16 * 1024;

/// Reads one frame's size prefix and up to `want` header bytes. `None` at a clean end of stream or on
/// anything that is not a Kafka frame (a negative size).
async fn frame_head(read: &TcpStream, want: usize) -> Option<(usize, Vec<u8>)> {
    let mut size = [0u8; 4];
    read_exact(read, &mut size).await.ok()?;
    let size = usize::try_from(i32::from_be_bytes(size)).ok()?;
    let mut head = vec![0u8; want.min(size)];
    read_exact(read, &mut head).await.ok()?;
    Some((size, head))
}

/// Reads some bytes through the socket's readiness; `Ok(0)` at the end of the stream.
async fn read_some(read: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        read.readable().await?;
        match read.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}

async fn read_exact(read: &TcpStream, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match read_some(read, buf).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => buf = &mut buf[n..],
        }
    }
    Ok(())
}

/// Copies `remaining` bytes from `read` to `write` (or to nowhere), in chunks, each behind the gate.
async fn copy_body(
    read: &TcpStream,
    write: Option<&TcpStream>,
    mut remaining: usize,
    fault: &mut watch::Receiver<Fault>,
    held: &AtomicU64,
    rng: &mut Rng,
) -> bool {
    let mut buf = [0u8; CHUNK];
    while remaining > 0 {
        let n = match read_some(read, &mut buf[..remaining.min(CHUNK)]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        remaining -= n;
        if let Some(w) = write {
            if !gate(fault, held, rng, false).await || write_all(w, &buf[..n]).await.is_err() {
                return false;
            }
        }
    }
    true
}

async fn write_all(write: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        write.writable().await?;
        match write.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Client to broker: forwards whole request frames, noting each one's correlation id and API key.
async fn requests(
    read: &TcpStream,
    write: &TcpStream,
    route: &Route,
    pending: &Mutex<HashMap<i32, i16>>,
    mut rng: Rng,
) -> End {
    let mut fault = route.fault.subscribe();
    // The request header starts with api key (2), api version (2), correlation id (4).
    while let Some((size, head)) = frame_head(read, 8).await {
        if head.len() == 8 {
            let key = i16::from_be_bytes([head[0], head[1]]);
            let id = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            lock(pending).insert(id, key);
        }
        if !gate(&mut fault, &route.counters.held, &mut rng, true).await {
            break;
        }
        let mut start = (size as u32).to_be_bytes().to_vec();
        start.extend_from_slice(&head);
        if write_all(write, &start).await.is_err()
            || !copy_body(
                read,
                Some(write),
                size - head.len(),
                &mut fault,
                &route.counters.held,
                &mut rng,
            )
            .await
        {
            break;
        }
        route.counters.requests.fetch_add(1, Ordering::Relaxed);
    }
    // The client is done sending (or a side failed): the connection ends and both sockets close.
    End::Closed
}

/// Broker to client: forwards, drops or cuts whole response frames as the fault says.
async fn responses(
    read: &TcpStream,
    write: &TcpStream,
    route: &Route,
    pending: &Mutex<HashMap<i32, i16>>,
    mut rng: Rng,
) -> End {
    let mut fault = route.fault.subscribe();
    // The response header starts with the correlation id.
    while let Some((size, head)) = frame_head(read, 4).await {
        let api_key = (head.len() == 4)
            .then(|| i32::from_be_bytes([head[0], head[1], head[2], head[3]]))
            .and_then(|id| lock(pending).remove(&id));
        let rest = size - head.len();
        let now = fault.borrow_and_update().clone();
        match now {
            Fault::DropResponses(which) if which.matches(api_key) => {
                if !copy_body(read, None, rest, &mut fault, &route.counters.held, &mut rng).await {
                    return End::Closed;
                }
                route
                    .counters
                    .dropped_responses
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Fault::ResetMidResponse(which) if which.matches(api_key) => {
                let mut start = (size as u32).to_be_bytes().to_vec();
                start.extend_from_slice(&head);
                if write_all(write, &start).await.is_err() {
                    return End::Closed;
                }
                // Half of the body (at least one byte when there is one), so the client is left inside
                // the frame, then the reset.
                let half = rest.div_ceil(2);
                let _ = copy_body(
                    read,
                    Some(write),
                    half,
                    &mut fault,
                    &route.counters.held,
                    &mut rng,
                )
                .await;
                return End::Reset;
            }
            _ => {}
        }
        if !gate(&mut fault, &route.counters.held, &mut rng, true).await {
            return End::Closed;
        }
        let mut start = (size as u32).to_be_bytes().to_vec();
        start.extend_from_slice(&head);
        if write_all(write, &start).await.is_err()
            || !copy_body(
                read,
                Some(write),
                rest,
                &mut fault,
                &route.counters.held,
                &mut rng,
            )
            .await
        {
            return End::Closed;
        }
        route.counters.responses.fetch_add(1, Ordering::Relaxed);
    }
    End::Closed
}

/// xorshift64*: enough randomness for jitter, and reproducible from the proxy's seed.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A second stream for the other direction of the same connection.
    fn fork(&self) -> Rng {
        Rng::new(self.0.rotate_left(17) ^ 0xA5A5_A5A5_A5A5_A5A5)
    }

    fn up_to(&mut self, max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        match nanos.checked_add(1) {
            Some(bound) => Duration::from_nanos(self.next() % bound),
            None => Duration::from_nanos(self.next()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The proxy against a loopback echo server that speaks Kafka's framing: each request frame
    //! (size, api key, version, correlation id, payload) comes back as a response frame (size,
    //! correlation id, payload). No broker: these test the proxy, not Kafka.

    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Echo {
        addr: SocketAddr,
        /// Request frames the echo server received, over all connections.
        received: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn echo() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let count = received.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    loop {
                        let mut size = [0u8; 4];
                        if s.read_exact(&mut size).await.is_err() {
                            return;
                        }
                        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
                        if s.read_exact(&mut frame).await.is_err() {
                            return;
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = &frame[4..];
                        let mut out = (body.len() as i32).to_be_bytes().to_vec();
                        out.extend_from_slice(body);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Echo {
            addr,
            received,
            task,
        }
    }

    fn request(api_key: i16, id: i32, payload: &[u8]) -> Vec<u8> {
        let mut frame = api_key.to_be_bytes().to_vec();
        frame.extend_from_slice(&0i16.to_be_bytes());
        frame.extend_from_slice(&id.to_be_bytes());
        frame.extend_from_slice(payload);
        let mut out = (frame.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&frame);
        out
    }

    /// Reads one response frame: (correlation id, payload).
    async fn response(s: &mut TcpStream) -> io::Result<(i32, Vec<u8>)> {
        let mut size = [0u8; 4];
        s.read_exact(&mut size).await?;
        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
        s.read_exact(&mut frame).await?;
        let id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        Ok((id, frame[4..].to_vec()))
    }

    async fn until(mut done: impl FnMut() -> bool) {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn passes_frames_through_both_ways() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        let big = vec![7u8; 100_000];
        for id in 0..3 {
            s.write_all(&request(3, id, &big)).await.unwrap();
            assert_eq!(response(&mut s).await.unwrap(), (id, big.clone()));
        }
        let stats = proxy.stats(&up).unwrap();
        assert_eq!(
            (stats.connections, stats.requests, stats.responses),
            (1, 3, 3)
        );
        proxy.check().unwrap();
    }

    /// A blackholed upstream holds the request without closing anything; healed, the same connection
    /// delivers it and gets its answer.
    #[tokio::test]
    async fn blackhole_holds_traffic_until_healed() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        proxy.set(&up, Fault::Blackhole).unwrap();
        s.write_all(&request(3, 1, b"held")).await.unwrap();
        until(|| proxy.stats(&up).unwrap().held > 0).await;
        // The frame is waiting at the gate, before anything was written upstream.
        assert_eq!(echo.received.load(Ordering::SeqCst), 0);
        assert_eq!(proxy.stats(&up).unwrap().requests, 0);
        proxy.heal();
        assert_eq!(response(&mut s).await.unwrap(), (1, b"held".to_vec()));
        assert_eq!(echo.received.load(Ordering::SeqCst), 1);
    }

    /// Dropped responses: the request lands, its answer never comes, and the connection keeps working
    /// for other APIs (the next frame the client reads answers the second request).
    #[tokio::test]
    async fn drop_responses_discards_only_the_matching_answers() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        proxy
            .set(&up, Fault::DropResponses(Requests::ApiKeys(vec![0])))
            .unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        s.write_all(&request(0, 10, b"produce")).await.unwrap();
        s.write_all(&request(3, 11, b"metadata")).await.unwrap();
        assert_eq!(response(&mut s).await.unwrap(), (11, b"metadata".to_vec()));
        assert_eq!(
            echo.received.load(Ordering::SeqCst),
            2,
            "both requests landed"
        );
        let stats = proxy.stats(&up).unwrap();
        assert_eq!((stats.dropped_responses, stats.responses), (1, 1));
    }

    /// A cut response leaves the client inside a frame and then resets the connection.
    #[tokio::test]
    async fn reset_mid_response_cuts_a_frame_with_a_reset() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        s.write_all(&request(3, 1, b"whole")).await.unwrap();
        assert_eq!(response(&mut s).await.unwrap().0, 1);
        proxy
            .set(&up, Fault::ResetMidResponse(Requests::All))
            .unwrap();
        s.write_all(&request(3, 2, &[1u8; 4000])).await.unwrap();
        let err = response(&mut s).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        until(|| proxy.stats(&up).unwrap().resets == 1).await;
    }

    /// Each frame waits at least the added latency, in each direction.
    #[tokio::test]
    async fn latency_delays_both_directions() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let base = Duration::from_millis(40);
        proxy
            .set(
                &up,
                Fault::Latency {
                    base,
                    jitter: Duration::from_millis(10),
                },
            )
            .unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        s.write_all(&request(3, 1, b"slow")).await.unwrap();
        assert_eq!(response(&mut s).await.unwrap().0, 1);
        assert!(started.elapsed() >= base * 2, "{:?}", started.elapsed());
    }

    #[test]
    fn jitter_stays_in_bounds_and_follows_the_seed() {
        let max = Duration::from_millis(5);
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let drawn: Vec<_> = (0..1000).map(|_| a.up_to(max)).collect();
        assert!(drawn.iter().all(|d| *d <= max));
        assert!(drawn.iter().any(|d| *d != drawn[0]), "not constant");
        assert_eq!(drawn, (0..1000).map(|_| b.up_to(max)).collect::<Vec<_>>());
        assert_eq!(Rng::new(1).up_to(Duration::ZERO), Duration::ZERO);
    }

    /// A fault set on one upstream leaves the others alone.
    #[tokio::test]
    async fn faults_are_per_upstream() {
        let (one, two) = (echo().await, echo().await);
        let (a, b) = (one.addr.to_string(), two.addr.to_string());
        let proxy = FaultProxy::start([a.clone(), b.clone()], 1).await.unwrap();
        proxy.set(&a, Fault::Blackhole).unwrap();
        let mut cut = TcpStream::connect(proxy.listen_addr(&a).unwrap())
            .await
            .unwrap();
        let mut open = TcpStream::connect(proxy.listen_addr(&b).unwrap())
            .await
            .unwrap();
        cut.write_all(&request(3, 1, b"x")).await.unwrap();
        open.write_all(&request(3, 2, b"y")).await.unwrap();
        assert_eq!(response(&mut open).await.unwrap(), (2, b"y".to_vec()));
        until(|| proxy.stats(&a).unwrap().held > 0).await;
        assert_eq!(one.received.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn bad_control_input_is_a_typed_error() {
        assert!(matches!(
            FaultProxy::start(["10.0.0.1:9092"], 1).await,
            Err(ProxyError::NotLoopback(_))
        ));
        assert!(matches!(
            FaultProxy::start(["broker:9092"], 1).await,
            Err(ProxyError::NotLoopback(_))
        ));
        let proxy = FaultProxy::start(["127.0.0.1:9"], 1).await.unwrap();
        assert!(matches!(
            proxy.set("127.0.0.1:10", Fault::Blackhole),
            Err(ProxyError::UnknownUpstream(_))
        ));
        assert!(proxy.stats("nope").is_err());
    }

    /// A broker that is down looks down through the proxy (the connection is reset), and is not a
    /// failure of the proxy.
    #[tokio::test]
    async fn a_refusing_upstream_resets_the_client() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let up = format!("127.0.0.1:{port}");
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        let mut buf = [0u8; 1];
        let read = s.read(&mut buf).await;
        assert!(
            matches!(&read, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "{read:?}"
        );
        assert_eq!(proxy.stats(&up).unwrap().upstream_refused, 1);
        proxy.check().unwrap();
    }

    /// A proxy task that panics is not lost: `check` reports it, typed, and the proxy goes on serving.
    #[tokio::test]
    async fn a_panicking_task_is_reported_by_check() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        proxy.check().unwrap();
        proxy.shared.panic_next.store(true, Ordering::SeqCst);
        let _doomed = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        until(|| !lock(&proxy.shared.failures).is_empty()).await;
        match proxy.check() {
            Err(ProxyError::TaskFailed { task, message }) => {
                assert!(task.starts_with("connection 0 to "), "{task}");
                assert_eq!(message, "armed by the test");
            }
            other => panic!("expected the panic, got {other:?}"),
        }
        proxy.check().unwrap();
        let mut s = TcpStream::connect(proxy.listen_addr(&up).unwrap())
            .await
            .unwrap();
        s.write_all(&request(3, 1, b"still")).await.unwrap();
        assert_eq!(response(&mut s).await.unwrap(), (1, b"still".to_vec()));
    }

    /// Dropping the handle stops the listeners and the open connections.
    #[tokio::test]
    async fn dropping_the_proxy_stops_everything() {
        let echo = echo().await;
        let up = echo.addr.to_string();
        let proxy = FaultProxy::start([up.clone()], 1).await.unwrap();
        let listen = proxy.listen_addr(&up).unwrap();
        let mut s = TcpStream::connect(listen).await.unwrap();
        s.write_all(&request(3, 1, b"x")).await.unwrap();
        response(&mut s).await.unwrap();
        drop(proxy);
        // The connection's task is aborted, so its sockets close: the client reads the end of stream.
        let mut buf = [0u8; 1];
        assert!(matches!(s.read(&mut buf).await, Ok(0) | Err(_)));
        // The listener closes when its aborted task is dropped, which the runtime does on its own time.
        while TcpStream::connect(listen).await.is_ok() {
            tokio::task::yield_now().await;
        }
    }
}
