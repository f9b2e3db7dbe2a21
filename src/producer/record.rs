//! What a caller hands the producer and what it gets back.

use std::sync::Arc;

use bytes::Bytes;

pub use crate::net::TopicPartition;
// The header a consumer reads back is the one a producer writes: one type, owned by the records layer
// that encodes and decodes it.
pub use crate::records::Header;
use crate::records::{encoded_record_size, NewRecord};

/// A record to produce.
///
/// Built with [`ProducerRecord::new`] and refined with the builder methods:
/// ```
/// use snapfence::producer::ProducerRecord;
/// let r = ProducerRecord::new("snapshots", Some("state".into()))
///     .key("user-42")
///     .partition(3)
///     .header("schema", Some("v2".into()));
/// assert_eq!(r.partition, Some(3));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRecord {
    /// The topic to write to.
    pub topic: Arc<str>,
    /// The partition; `None` lets the producer choose (by key hash, or spread when there is no key).
    pub partition: Option<i32>,
    /// The key, `None` for a null key.
    pub key: Option<Bytes>,
    /// The value, `None` for a null value (a tombstone on a compacted topic).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<Header>,
    /// The create time in milliseconds since the Unix epoch; `None` stamps the time of the send.
    pub timestamp: Option<i64>,
}

impl ProducerRecord {
    /// A record with a value (or a tombstone) and no key.
    pub fn new(topic: impl Into<Arc<str>>, value: Option<Bytes>) -> Self {
        ProducerRecord {
            topic: topic.into(),
            partition: None,
            key: None,
            value,
            headers: Vec::new(),
            timestamp: None,
        }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Pins the partition.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Appends a header. Kafka allows repeated keys and a null value. The key is taken as a string
    /// because other clients read header keys as UTF-8.
    pub fn header(mut self, key: impl Into<String>, value: Option<Bytes>) -> Self {
        self.headers.push(Header {
            key: Bytes::from(key.into()),
            value,
        });
        self
    }

    /// Sets the create time (milliseconds since the Unix epoch).
    pub fn timestamp(mut self, millis: i64) -> Self {
        self.timestamp = Some(millis);
        self
    }

    /// The bytes this record takes as record `offset_delta` of a v2 batch whose first record has the
    /// timestamp `base_timestamp`, exactly as the records layer will encode it (a missing timestamp is
    /// encoded as 0). Falls back to [`Self::encoded_size_bound`] when the records layer cannot encode it
    /// there (the encoder then says why).
    pub(crate) fn encoded_size(&self, offset_delta: usize, base_timestamp: i64) -> usize {
        self.as_new_record(|record| {
            i32::try_from(offset_delta)
                .ok()
                .and_then(|delta| encoded_record_size(record, delta, base_timestamp).ok())
        })
        .unwrap_or_else(|| self.encoded_size_bound())
    }

    /// Calls `f` with this record as the records layer encodes it (a missing timestamp as 0).
    pub(crate) fn as_new_record<R>(&self, f: impl FnOnce(&NewRecord<'_>) -> R) -> R {
        let headers: Vec<(&[u8], Option<&[u8]>)> = self
            .headers
            .iter()
            .map(|h| (&h.key[..], h.value.as_deref()))
            .collect();
        f(&NewRecord {
            timestamp: self.timestamp.unwrap_or(0),
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: &headers,
        })
    }

    /// An upper bound on the bytes this record takes inside a v2 record batch.
    ///
    /// Every varint is counted at its widest, so the bound holds whatever the offset and timestamp
    /// deltas turn out to be: what [`Self::encoded_size`] counts when the records layer refuses the
    /// record, so that the accumulator never undercounts.
    pub(crate) fn encoded_size_bound(&self) -> usize {
        // length (varint ≤5) + attributes (1) + timestamp delta (varlong ≤10) + offset delta (varint ≤5)
        // + key length (≤5) + value length (≤5) + header count (≤5)
        const FIXED: usize = 5 + 1 + 10 + 5 + 5 + 5 + 5;
        let key = self.key.as_ref().map_or(0, Bytes::len);
        let value = self.value.as_ref().map_or(0, Bytes::len);
        let headers: usize = self
            .headers
            .iter()
            .map(|h| 5 + h.key.len() + 5 + h.value.as_ref().map_or(0, Bytes::len))
            .sum();
        FIXED + key + value + headers
    }
}

/// Where a record landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    /// The topic and partition written.
    pub topic_partition: TopicPartition,
    /// The record's offset, or `None` when the broker reported the batch as an already-written duplicate
    /// without saying where it was written.
    pub offset: Option<i64>,
    /// The record's timestamp: its create time, or the broker's append time on a log-append-time topic.
    pub timestamp: i64,
}

/// An offset to commit inside a transaction: the next offset to read, not the last one processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetAndMetadata {
    /// The next offset the group should read.
    pub offset: i64,
    /// The leader epoch of the last consumed record, if known (lets a later reader detect truncation).
    pub leader_epoch: Option<i32>,
    /// Free-form metadata stored with the offset.
    pub metadata: Option<String>,
}

impl From<i64> for OffsetAndMetadata {
    fn from(offset: i64) -> Self {
        OffsetAndMetadata {
            offset,
            leader_epoch: None,
            metadata: None,
        }
    }
}

/// Kafka's default partitioner hash (murmur2, seed `0x9747b28c`), so that keyed records land on the same
/// partition a Java producer would choose for them.
pub(crate) fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a keyed record goes to among `partitions`, as Kafka's default partitioner computes it.
pub(crate) fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    debug_assert!(partitions > 0);
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keyed records must land where the Java client puts them, or a mixed fleet splits a key's history.
    /// Expected values are the Java client's `Utils.murmur2` outputs for these inputs.
    #[test]
    fn murmur2_matches_kafka_reference_values() {
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58_897_971
        );
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }

    /// A key always maps to the same partition for a given partition count, and that partition is in
    /// range.
    #[test]
    fn partition_for_key_is_stable_and_in_range() {
        for n in 1..20 {
            let p = partition_for_key(b"user-42", n);
            assert!((0..n).contains(&p));
            assert_eq!(p, partition_for_key(b"user-42", n));
        }
    }

    /// A record's encoded size bound is never below the bytes of its key, value and headers, and is
    /// positive even for a tombstone, so the buffer never under-reserves.
    #[test]
    fn size_bound_never_undercounts_payload() {
        let r = ProducerRecord::new("t", Some(Bytes::from(vec![0u8; 100])))
            .key("k")
            .header("h", Some(Bytes::from_static(b"vv")));
        assert!(r.encoded_size_bound() >= 100 + 1 + 1 + 2 + 2);
        let tomb = ProducerRecord::new("t", None);
        assert!(tomb.encoded_size_bound() > 0);
    }
}
