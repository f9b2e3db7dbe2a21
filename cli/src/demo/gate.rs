//! A gate on owner A's connections that holds one kind of request at the wire, so the demo can catch A
//! at an exact step of a flush instead of at a moment guessed with a timer.
//!
//! The outputs story needs two such steps. To kill A "mid-wave" it must be killed after its wave's
//! records are in the log and before they count: with the fence that is just before the EndTxn that
//! would commit its transaction; without it, just before the OffsetCommit that would move the group past
//! them. To make A a zombie, it must be frozen with a flush begun and nothing of it sent yet: just before
//! the flush's first request (Produce, or a transaction's AddPartitionsToTxn, AddOffsetsToTxn or
//! TxnOffsetCommit, whichever goes first). A timed SIGSTOP lands a few milliseconds after A
//! says a flush begins, and a local flush takes about as long, so a timer catches A at a different step on
//! each run; the gate catches it at the same one every time.
//!
//! The gate is a [`Dialer`]: every connection A opens is a TCP stream wrapped in [`Gated`], which reads
//! the Kafka request frames A writes (a 4-byte size, then the request header, whose first two bytes are
//! the API key). When the gate is [armed](Gate::arm) for an API key, the first frame of that key is not
//! written: the write stays pending, the gate says which request it [holds](Gate::held), and it stays
//! held until [`Gate::release`] (or for good: the demo kills A). Everything else passes untouched, reads
//! included. The gate sees plaintext only, so the outputs story refuses TLS; SASL's handshake frames are
//! Kafka frames like any other.
//!
//! # References
//! - The Kafka protocol guide (request framing and the request header); the API keys of Produce (0),
//!   OffsetCommit (8), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26), TxnOffsetCommit (28)

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use snapfence::net::{DialFuture, DialedStream, Dialer, TcpDialer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Produce.
pub(crate) const PRODUCE: i16 = 0;
/// OffsetCommit: the plain consumer's commit (the unfenced mode).
pub(crate) const OFFSET_COMMIT: i16 = 8;
/// AddPartitionsToTxn: a transaction's first request for a new partition under transaction version 1.
pub(crate) const ADD_PARTITIONS_TO_TXN: i16 = 24;
/// AddOffsetsToTxn: adds the group's offsets to a transaction.
pub(crate) const ADD_OFFSETS_TO_TXN: i16 = 25;
/// EndTxn: the commit (or abort) of a transaction.
pub(crate) const END_TXN: i16 = 26;
/// TxnOffsetCommit: the offset commit inside a transaction, checked against the group generation.
pub(crate) const TXN_OFFSET_COMMIT: i16 = 28;

/// The name of an API key the gate holds, for the story.
pub(crate) fn api_name(key: i16) -> &'static str {
    match key {
        PRODUCE => "Produce",
        OFFSET_COMMIT => "OffsetCommit",
        ADD_PARTITIONS_TO_TXN => "AddPartitionsToTxn",
        ADD_OFFSETS_TO_TXN => "AddOffsetsToTxn",
        END_TXN => "EndTxn",
        TXN_OFFSET_COMMIT => "TxnOffsetCommit",
        _ => "a request",
    }
}

/// What the gate is told and what it did.
#[derive(Debug, Default)]
struct State {
    /// The API keys to hold the first frame of; empty when disarmed.
    armed: Vec<i16>,
    /// The API key of the frame held, once one is.
    held: Option<i16>,
    /// The held frame may go.
    released: bool,
    /// Writers waiting on the held frame, woken by the release.
    waiting: Vec<Waker>,
    /// Woken when a frame is first held.
    watchers: Vec<Waker>,
}

/// The gate all of one process's connections share. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gate {
    state: Arc<Mutex<State>>,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the next frame whose API key is one of `keys` (and every frame written after it on the same
    /// connection, and every later frame of those keys on any) until [`release`](Self::release).
    pub(crate) fn arm(&self, keys: &[i16]) {
        let mut s = self.lock();
        s.armed = keys.to_vec();
        s.held = None;
        s.released = false;
    }

    /// Lets the held frame go, and disarms.
    pub(crate) fn release(&self) {
        let waiting = {
            let mut s = self.lock();
            s.armed.clear();
            s.released = true;
            std::mem::take(&mut s.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }

    /// Completes with the API key of the frame held, once one is.
    pub(crate) async fn held(&self) -> i16 {
        std::future::poll_fn(|cx| {
            let mut s = self.lock();
            match s.held {
                Some(key) => Poll::Ready(key),
                None => {
                    s.watchers.push(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Whether a writer at the start of a frame of `key` must wait; registers `cx` when it must. Once
    /// one frame is held, every frame of an armed key waits with it, on any connection, until the release.
    fn must_wait(&self, key: i16, cx: &mut Context<'_>) -> bool {
        let mut s = self.lock();
        if s.released || !s.armed.contains(&key) {
            return false;
        }
        if s.held.is_none() {
            s.held = Some(key);
            std::mem::take(&mut s.watchers)
                .into_iter()
                .for_each(Waker::wake);
        }
        s.waiting.push(cx.waker().clone());
        true
    }
}

impl Dialer for Gate {
    fn dial<'a>(&'a self, addr: &'a str, _tcp: &'a TcpDialer) -> DialFuture<'a> {
        Box::pin(async move {
            // The default dialer's stream cannot be wrapped (a DialedStream is opaque), so this connects
            // itself; the demo sets no socket options but the one the client always sets.
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(DialedStream::new(Gated::new(stream, self.clone())))
        })
    }
}

/// Where the writer is in the stream of request frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Collecting the next frame's first six bytes (size and API key), `n` so far, none forwarded yet.
    Head(usize),
    /// The head is decided and must be forwarded; `n` of its six bytes are.
    Forwarding(usize),
    /// Inside a frame: this many bytes of it are still to come.
    Body(usize),
}

/// A connection behind the [`Gate`].
pub(crate) struct Gated<S> {
    inner: S,
    gate: Gate,
    framing: Framing,
    head: [u8; 6],
}

impl<S> Gated<S> {
    fn new(inner: S, gate: Gate) -> Gated<S> {
        Gated {
            inner,
            gate,
            framing: Framing::Head(0),
            head: [0; 6],
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Gated<S> {
    /// Forwards the decided head; `Ready(Ok)` once all six bytes are written.
    fn forward_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Framing::Forwarding(n) = self.framing {
            if n == self.head.len() {
                let size =
                    i32::from_be_bytes([self.head[0], self.head[1], self.head[2], self.head[3]]);
                // The size counts the bytes after itself; two of them (the API key) are written.
                self.framing = Framing::Body(usize::try_from(size).unwrap_or(0).saturating_sub(2));
                break;
            }
            let head = self.head;
            match Pin::new(&mut self.inner).poll_write(cx, &head[n..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(k)) => self.framing = Framing::Forwarding(n + k),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        loop {
            match this.framing {
                Framing::Head(n) if n < this.head.len() => {
                    // Taken into the head without forwarding: a frame is only let out once its key is known.
                    let k = (this.head.len() - n).min(buf.len());
                    if k == 0 {
                        return Poll::Ready(Ok(0));
                    }
                    this.head[n..n + k].copy_from_slice(&buf[..k]);
                    this.framing = Framing::Head(n + k);
                    if n + k < this.head.len() {
                        return Poll::Ready(Ok(k));
                    }
                    let key = i16::from_be_bytes([this.head[4], this.head[5]]);
                    if this.gate.must_wait(key, cx) {
                        // The six bytes are taken; the writer's next call waits at `Head(6)` below.
                        return Poll::Ready(Ok(k));
                    }
                    this.framing = Framing::Forwarding(0);
                    // Report the bytes taken once the head is out (or keep them and say so next time).
                    return match this.forward_head(cx) {
                        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                        _ => Poll::Ready(Ok(k)),
                    };
                }
                Framing::Head(_) => {
                    let key = i16::from_be_bytes([this.head[4], this.head[5]]);
                    if this.gate.must_wait(key, cx) {
                        return Poll::Pending;
                    }
                    this.framing = Framing::Forwarding(0);
                }
                Framing::Forwarding(_) => match this.forward_head(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
                Framing::Body(0) => this.framing = Framing::Head(0),
                Framing::Body(left) => {
                    let k = left.min(buf.len());
                    if k == 0 {
                        return Poll::Ready(Ok(0));
                    }
                    return match Pin::new(&mut this.inner).poll_write(cx, &buf[..k]) {
                        Poll::Ready(Ok(w)) => {
                            this.framing = Framing::Body(left - w);
                            Poll::Ready(Ok(w))
                        }
                        other => other,
                    };
                }
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A frame's head taken but not yet out goes first (a held one stays held).
        if matches!(this.framing, Framing::Head(6)) {
            let key = i16::from_be_bytes([this.head[4], this.head[5]]);
            if this.gate.must_wait(key, cx) {
                return Poll::Pending;
            }
            this.framing = Framing::Forwarding(0);
        }
        match this.forward_head(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A request frame: size, API key, and `body` (standing in for the rest of the header and the body).
    fn frame(key: i16, body: &[u8]) -> Vec<u8> {
        let mut f = ((body.len() + 2) as i32).to_be_bytes().to_vec();
        f.extend_from_slice(&key.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    /// Unarmed, every byte passes in order whatever the write sizes; armed for EndTxn, the frames before
    /// it pass, the EndTxn frame is held (and the gate says so) until the release, then it and the rest
    /// pass whole.
    #[tokio::test]
    async fn holds_the_first_frame_of_the_armed_key_until_released() {
        let gate = Gate::default();
        let (near, mut far) = tokio::io::duplex(1 << 16);
        let mut gated = Gated::new(near, gate.clone());
        let mut want = Vec::new();
        // Unarmed, written a byte at a time: a frame is split anywhere.
        for f in [frame(PRODUCE, b"abc"), frame(END_TXN, b"")] {
            for b in &f {
                gated.write_all(std::slice::from_ref(b)).await.unwrap();
            }
            want.extend(f);
        }
        gated.flush().await.unwrap();
        let mut got = vec![0; want.len()];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, want);

        gate.arm(&[END_TXN]);
        let before = frame(PRODUCE, b"records");
        let held = frame(END_TXN, b"commit");
        let after = frame(PRODUCE, b"later");
        let all = [before.clone(), held.clone(), after.clone()].concat();
        let writer = tokio::spawn(async move {
            gated.write_all(&all).await.unwrap();
            gated.flush().await.unwrap();
            gated
        });
        assert_eq!(gate.held().await, END_TXN);
        let mut got = vec![0; before.len()];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, before);
        // Nothing of the held frame is out.
        let mut one = [0u8; 1];
        assert!(tokio::time::timeout(
            std::time::Duration::from_millis(100),
            far.read_exact(&mut one)
        )
        .await
        .is_err());
        gate.release();
        let _gated = writer.await.unwrap();
        let rest = [held, after].concat();
        let mut got = vec![0; rest.len()];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, rest);
    }
}
