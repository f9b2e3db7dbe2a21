//! Splitting a byte stream into size-prefixed frames.
//!
//! Every Kafka request and response is a big-endian `int32` length followed by that many bytes. The reader
//! here is pure (bytes in, frames out, no I/O) so it can be tested and fuzzed on its own; the connection
//! task only moves bytes from the socket into its buffer.
//!
//! # References
//! - Kafka protocol guide, "Common Request and Response Structure":
//!   <https://kafka.apache.org/protocol.html#protocol_common>

use bytes::{Buf, Bytes, BytesMut};

use super::WireError;

/// Length of the size prefix in front of every frame.
pub const SIZE_PREFIX: usize = 4;

/// How much buffer to reserve ahead of one read while a large frame is arriving. Reserving the whole
/// announced length at once would let a peer that announces a big frame and then stalls pin that much
/// memory; growing in steps keeps the reservation proportional to what actually arrived.
const MAX_RESERVE_STEP: usize = 1 << 20;

/// Cuts whole frames off the front of a receive buffer.
///
/// Crate-internal; exported only under the `fuzzing` feature for the fuzz targets.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max_frame_size: usize,
}

impl FrameDecoder {
    /// A decoder that refuses frames whose announced length exceeds `max_frame_size` bytes.
    pub fn new(max_frame_size: usize) -> Self {
        FrameDecoder { max_frame_size }
    }

    /// Returns the next complete frame (without its size prefix) and removes it from `buf`, or `None` if
    /// `buf` does not hold a whole frame yet.
    ///
    /// The announced length is checked against the maximum before any memory is reserved for it, and a
    /// frame that does not fit is an error rather than a reason to wait for more bytes: the stream cannot
    /// be resynchronised after a bad length, so the caller must drop the connection.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        let Some(len) = self.announced_len(buf)? else {
            return Ok(None);
        };
        let total = SIZE_PREFIX + len;
        if buf.len() < total {
            let missing = total - buf.len();
            buf.reserve(missing.min(MAX_RESERVE_STEP));
            return Ok(None);
        }
        buf.advance(SIZE_PREFIX);
        Ok(Some(buf.split_to(len).freeze()))
    }

    /// The checked length of the frame at the front of `buf`, once its prefix is there.
    fn announced_len(&self, buf: &[u8]) -> Result<Option<usize>, WireError> {
        let Some(prefix) = buf.get(..SIZE_PREFIX) else {
            return Ok(None);
        };
        let raw = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let len = usize::try_from(raw).map_err(|_| WireError::NegativeFrameLength(raw))?;
        if len > self.max_frame_size {
            return Err(WireError::FrameTooLarge {
                len,
                max: self.max_frame_size,
            });
        }
        Ok(Some(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            out.extend_from_slice(&(p.len() as i32).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    /// A frame is yielded only once its whole length prefix and body have arrived, and consumes exactly
    /// those bytes.
    #[test]
    fn waits_for_a_whole_prefix_and_body() {
        let d = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&[0u8, 0, 0][..]);
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[3, b'a', b'b']);
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"c");
        assert_eq!(d.decode(&mut buf).unwrap().as_deref(), Some(&b"abc"[..]));
        assert!(buf.is_empty());
    }

    /// An oversized length is refused before the buffer grows: a 2 GiB announcement must not reserve 2 GiB.
    #[test]
    fn oversized_length_is_refused_before_allocation() {
        let d = FrameDecoder::new(1024);
        let mut buf = BytesMut::with_capacity(8);
        buf.extend_from_slice(&i32::MAX.to_be_bytes());
        let cap_before = buf.capacity();
        assert_eq!(
            d.decode(&mut buf),
            Err(WireError::FrameTooLarge {
                len: i32::MAX as usize,
                max: 1024
            })
        );
        assert_eq!(buf.capacity(), cap_before);
    }

    /// A length just within the limit is accepted, but the buffer grows in bounded steps while waiting.
    #[test]
    fn reservation_while_waiting_is_bounded() {
        let d = FrameDecoder::new(64 << 20);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&(64i32 << 20).to_be_bytes());
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        assert!(
            buf.capacity() <= 2 * MAX_RESERVE_STEP + SIZE_PREFIX,
            "{}",
            buf.capacity()
        );
    }

    /// A negative frame length is a typed error, never read as a huge unsigned length.
    #[test]
    fn negative_length_is_an_error() {
        let d = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&(-5i32).to_be_bytes()[..]);
        assert_eq!(d.decode(&mut buf), Err(WireError::NegativeFrameLength(-5)));
    }

    /// A zero-length frame is a frame of its own and does not swallow the next one.
    #[test]
    fn empty_frame_is_a_frame() {
        let d = FrameDecoder::new(1024);
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0, 0, 0, 0, 1, 9][..]);
        assert_eq!(d.decode(&mut buf).unwrap().as_deref(), Some(&[][..]));
        assert_eq!(d.decode(&mut buf).unwrap().as_deref(), Some(&[9u8][..]));
        assert_eq!(d.decode(&mut buf).unwrap(), None);
    }

    proptest! {
        /// However the stream is cut into reads, the decoder yields exactly the frames that were written.
        #[test]
        fn any_chunking_yields_the_same_frames(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(1usize..64, 0..40),
        ) {
            let stream = framed(&payloads);
            let d = FrameDecoder::new(300);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut cuts = cuts.into_iter();
            while pos < stream.len() {
                let step = cuts.next().unwrap_or(stream.len());
                let end = (pos + step).min(stream.len());
                buf.extend_from_slice(&stream[pos..end]);
                pos = end;
                while let Some(frame) = d.decode(&mut buf).unwrap() {
                    got.push(frame.to_vec());
                }
            }
            prop_assert_eq!(got, payloads);
            prop_assert!(buf.is_empty());
        }

        /// Arbitrary bytes never panic: they give frames, a wait, or a typed error.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let d = FrameDecoder::new(16);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(f)) = d.decode(&mut buf) {
                prop_assert!(f.len() <= 16);
            }
        }
    }
}
