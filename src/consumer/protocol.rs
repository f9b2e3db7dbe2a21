//! The classic "consumer" embedded protocol: the subscription each member puts into JoinGroup and the
//! assignment the leader hands out through SyncGroup.
//!
//! Both are opaque bytes to the broker; only members read them, so a Java member and a snapfence member
//! in one group must agree on them byte for byte. Each blob is a big-endian `int16` version followed by
//! the struct at that version (non-flexible encoding: `int16` string lengths, `int32` byte and array
//! lengths, `-1` for null).
//!
//! A reader meeting a version newer than it knows decodes it as the newest it knows: every version so far
//! only appended fields, and Java's consumer reads that way too, so a newer peer does not break an older
//! leader.
//!
//! kafka-protocol 0.18 has these structs, but its decoder preallocates arrays from the unchecked count
//! field; these bytes come from other group members, so they are decoded here with every length checked
//! against what remains before anything is allocated. The tests cross-check both directions against
//! kafka-protocol's encoder and decoder.
//!
//! # References
//! - `ConsumerProtocolSubscription.json` versions 0-3 (v1 owned partitions, KIP-429; v2 generation id,
//!   KIP-792; v3 rack id, KIP-881)
//! - `ConsumerProtocolAssignment.json` versions 0-3 (v1-v3 same layout as v0)

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::ConsumerError;

/// The newest subscription and assignment version this crate reads and writes.
pub(crate) const HIGHEST_VERSION: i16 = 3;

/// The protocol type classic consumer groups register under.
pub(crate) const PROTOCOL_TYPE: &str = "consumer";

/// Partitions of one topic, as the embedded protocol lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicPartitions {
    pub topic: String,
    pub partitions: Vec<i32>,
}

/// A member's subscription metadata (JoinGroup `protocols[].metadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Subscription {
    pub topics: Vec<String>,
    pub user_data: Option<Bytes>,
    /// v1+: the partitions the member owns, so a cooperative leader can keep them where they are.
    pub owned_partitions: Vec<TopicPartitions>,
    /// v2+: the generation at which the member owned them; `-1` when absent. Resolves two members
    /// claiming the same partition (the higher generation is the real owner).
    pub generation_id: i32,
    /// v3+.
    pub rack_id: Option<String>,
}

impl Default for Subscription {
    fn default() -> Self {
        Subscription {
            topics: Vec::new(),
            user_data: None,
            owned_partitions: Vec::new(),
            generation_id: -1,
            rack_id: None,
        }
    }
}

/// The leader's assignment for one member (SyncGroup `assignments[].assignment`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Assignment {
    pub assigned_partitions: Vec<TopicPartitions>,
    pub user_data: Option<Bytes>,
}

impl Subscription {
    /// The blob at `version` (0..=3), version header included.
    pub(crate) fn encode(&self, version: i16) -> Bytes {
        debug_assert!((0..=HIGHEST_VERSION).contains(&version));
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        put_array(&mut buf, &self.topics, |b, t| put_string(b, t));
        put_nullable_bytes(&mut buf, self.user_data.as_ref());
        if version >= 1 {
            put_array(&mut buf, &self.owned_partitions, put_topic_partitions);
        }
        if version >= 2 {
            buf.put_i32(self.generation_id);
        }
        if version >= 3 {
            put_nullable_string(&mut buf, self.rack_id.as_deref());
        }
        buf.freeze()
    }

    /// Decodes a blob written by any member at any version.
    pub(crate) fn decode(mut buf: Bytes) -> Result<Self, ConsumerError> {
        let r = &mut Reader {
            buf: &mut buf,
            what: "consumer protocol subscription",
        };
        let version = r.version()?;
        let topics = r.array(2, |r| r.string())?;
        let user_data = r.nullable_bytes()?;
        let owned_partitions = if version >= 1 {
            r.array(6, Reader::topic_partitions)?
        } else {
            Vec::new()
        };
        let generation_id = if version >= 2 { r.i32()? } else { -1 };
        let rack_id = if version >= 3 {
            r.nullable_string()?
        } else {
            None
        };
        Ok(Subscription {
            topics,
            user_data,
            owned_partitions,
            generation_id,
            rack_id,
        })
    }
}

impl Assignment {
    /// The blob at `version` (0..=3), version header included.
    pub(crate) fn encode(&self, version: i16) -> Bytes {
        debug_assert!((0..=HIGHEST_VERSION).contains(&version));
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        put_array(&mut buf, &self.assigned_partitions, put_topic_partitions);
        put_nullable_bytes(&mut buf, self.user_data.as_ref());
        buf.freeze()
    }

    /// Decodes a blob written by any leader at any version. An empty blob is the empty assignment: the
    /// coordinator hands that to every member when the leader's SyncGroup left it out.
    pub(crate) fn decode(mut buf: Bytes) -> Result<Self, ConsumerError> {
        if buf.is_empty() {
            return Ok(Assignment::default());
        }
        let r = &mut Reader {
            buf: &mut buf,
            what: "consumer protocol assignment",
        };
        r.version()?;
        let assigned_partitions = r.array(6, Reader::topic_partitions)?;
        let user_data = r.nullable_bytes()?;
        Ok(Assignment {
            assigned_partitions,
            user_data,
        })
    }
}

fn put_string(buf: &mut BytesMut, s: &str) {
    // Topic names are at most 249 bytes and the encoder is only fed names this process validated, so
    // the i16 length cannot overflow in practice; clamp rather than wrap if it ever did.
    let len = s.len().min(i16::MAX as usize);
    buf.put_i16(len as i16);
    buf.put_slice(&s.as_bytes()[..len]);
}

fn put_nullable_string(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_string(buf, s),
        None => buf.put_i16(-1),
    }
}

fn put_nullable_bytes(buf: &mut BytesMut, b: Option<&Bytes>) {
    match b {
        Some(b) => {
            buf.put_i32(b.len() as i32);
            buf.put_slice(b);
        }
        None => buf.put_i32(-1),
    }
}

fn put_array<T>(buf: &mut BytesMut, items: &[T], mut put: impl FnMut(&mut BytesMut, &T)) {
    buf.put_i32(items.len() as i32);
    for item in items {
        put(buf, item);
    }
}

fn put_topic_partitions(buf: &mut BytesMut, tp: &TopicPartitions) {
    put_string(buf, &tp.topic);
    put_array(buf, &tp.partitions, |b, p| b.put_i32(*p));
}

/// A cursor that checks what remains before every read and before every allocation.
struct Reader<'a> {
    buf: &'a mut Bytes,
    what: &'static str,
}

impl Reader<'_> {
    fn err(&self, detail: impl Into<String>) -> ConsumerError {
        ConsumerError::Malformed {
            what: self.what,
            detail: detail.into(),
        }
    }

    fn need(&self, n: usize) -> Result<(), ConsumerError> {
        if self.buf.remaining() < n {
            Err(self.err(format!(
                "needs {n} more bytes, {} remain",
                self.buf.remaining()
            )))
        } else {
            Ok(())
        }
    }

    fn version(&mut self) -> Result<i16, ConsumerError> {
        self.need(2)?;
        let v = self.buf.get_i16();
        if v < 0 {
            return Err(self.err(format!("negative version {v}")));
        }
        Ok(v.min(HIGHEST_VERSION))
    }

    fn i32(&mut self) -> Result<i32, ConsumerError> {
        self.need(4)?;
        Ok(self.buf.get_i32())
    }

    fn nullable_string(&mut self) -> Result<Option<String>, ConsumerError> {
        self.need(2)?;
        let len = self.buf.get_i16();
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        self.need(len)?;
        let raw = self.buf.split_to(len);
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| self.err("string is not UTF-8"))
    }

    fn string(&mut self) -> Result<String, ConsumerError> {
        self.nullable_string()?
            .ok_or_else(|| self.err("null where a string is required"))
    }

    fn nullable_bytes(&mut self) -> Result<Option<Bytes>, ConsumerError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        self.need(len)?;
        Ok(Some(self.buf.split_to(len)))
    }

    /// An array whose elements take at least `min_elem` bytes each: a count that could not fit in what
    /// remains is refused before the vector is sized from it.
    fn array<T>(
        &mut self,
        min_elem: usize,
        mut elem: impl FnMut(&mut Self) -> Result<T, ConsumerError>,
    ) -> Result<Vec<T>, ConsumerError> {
        let count = self.i32()?;
        if count < 0 {
            return Err(self.err(format!("array count {count}")));
        }
        let count = count as usize;
        if count.saturating_mul(min_elem) > self.buf.remaining() {
            return Err(self.err(format!(
                "array of {count} cannot fit in {} bytes",
                self.buf.remaining()
            )));
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(elem(self)?);
        }
        Ok(out)
    }

    fn topic_partitions(&mut self) -> Result<TopicPartitions, ConsumerError> {
        let topic = self.string()?;
        let partitions = self.array(4, |r| r.i32())?;
        Ok(TopicPartitions { topic, partitions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment as kpa;
    use kafka_protocol::messages::consumer_protocol_subscription as kps;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9._-]{1,20}"
    }

    fn topic_partitions() -> impl Strategy<Value = TopicPartitions> {
        (name(), prop::collection::vec(0i32..1000, 0..6))
            .prop_map(|(topic, partitions)| TopicPartitions { topic, partitions })
    }

    fn user_data() -> impl Strategy<Value = Option<Bytes>> {
        prop::option::of(prop::collection::vec(any::<u8>(), 0..16).prop_map(Bytes::from))
    }

    fn subscription() -> impl Strategy<Value = Subscription> {
        (
            prop::collection::vec(name(), 0..5),
            user_data(),
            prop::collection::vec(topic_partitions(), 0..4),
            -1i32..100,
            prop::option::of(name()),
        )
            .prop_map(
                |(topics, user_data, owned_partitions, generation_id, rack_id)| Subscription {
                    topics,
                    user_data,
                    owned_partitions,
                    generation_id,
                    rack_id,
                },
            )
    }

    fn assignment() -> impl Strategy<Value = Assignment> {
        (prop::collection::vec(topic_partitions(), 0..4), user_data()).prop_map(
            |(assigned_partitions, user_data)| Assignment {
                assigned_partitions,
                user_data,
            },
        )
    }

    /// What a reader at `version` can see of `s`: fields newer than the version read as their defaults.
    fn truncate(s: &Subscription, version: i16) -> Subscription {
        let mut t = s.clone();
        if version < 1 {
            t.owned_partitions.clear();
        }
        if version < 2 {
            t.generation_id = -1;
        }
        if version < 3 {
            t.rack_id = None;
        }
        t
    }

    fn kp_subscription(bytes: &Bytes) -> ConsumerProtocolSubscription {
        let mut b = bytes.clone();
        let version = b.get_i16();
        ConsumerProtocolSubscription::decode(&mut b, version).unwrap()
    }

    proptest! {
        /// Every subscription survives its own encoder and decoder at every version.
        #[test]
        fn subscription_round_trips(s in subscription(), version in 0i16..=3) {
            let decoded = Subscription::decode(s.encode(version)).unwrap();
            prop_assert_eq!(decoded, truncate(&s, version));
        }

        /// Every assignment survives its own encoder and decoder at every version.
        #[test]
        fn assignment_round_trips(a in assignment(), version in 0i16..=3) {
            prop_assert_eq!(Assignment::decode(a.encode(version)).unwrap(), a);
        }

        /// Our subscription bytes are what kafka-protocol (a faithful port of Java's generated code)
        /// reads, and the other way round: a Java member and a snapfence member understand each other.
        #[test]
        fn subscription_matches_kafka_protocol(s in subscription(), version in 0i16..=3) {
            let ours = s.encode(version);
            let theirs_view = kp_subscription(&ours);
            let t = truncate(&s, version);
            prop_assert_eq!(theirs_view.topics.iter().map(|x| x.to_string()).collect::<Vec<_>>(), t.topics.clone());
            prop_assert_eq!(theirs_view.generation_id, t.generation_id);
            prop_assert_eq!(theirs_view.user_data.clone(), t.user_data.clone());
            prop_assert_eq!(theirs_view.rack_id.as_ref().map(|x| x.to_string()), t.rack_id.clone());
            // Encoding kafka-protocol's struct at the same version gives the same bytes.
            let mut theirs = BytesMut::new();
            theirs.put_i16(version);
            theirs_view.encode(&mut theirs, version).unwrap();
            prop_assert_eq!(theirs.freeze(), ours);
        }

        /// The same cross-check for assignments.
        #[test]
        fn assignment_matches_kafka_protocol(a in assignment(), version in 0i16..=3) {
            let kp = ConsumerProtocolAssignment::default()
                .with_assigned_partitions(a.assigned_partitions.iter().map(|tp| {
                    kpa::TopicPartition::default()
                        .with_topic(StrBytes::from_string(tp.topic.clone()).into())
                        .with_partitions(tp.partitions.clone())
                }).collect())
                .with_user_data(a.user_data.clone());
            let mut theirs = BytesMut::new();
            theirs.put_i16(version);
            kp.encode(&mut theirs, version).unwrap();
            prop_assert_eq!(theirs.freeze(), a.encode(version));
        }

        /// Arbitrary bytes from a peer never panic the decoder; they decode or give a typed error.
        #[test]
        fn garbage_never_panics(raw in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Subscription::decode(Bytes::from(raw.clone()));
            let _ = Assignment::decode(Bytes::from(raw));
        }
    }

    /// A huge array count must be refused from the bytes that remain, not trusted to size an allocation.
    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut b = BytesMut::new();
        b.put_i16(3);
        b.put_i32(i32::MAX);
        let err = Subscription::decode(b.freeze()).unwrap_err();
        assert!(matches!(err, ConsumerError::Malformed { .. }), "{err:?}");

        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(1);
        b.put_i16(1);
        b.put_u8(b't');
        b.put_i32(0x4000_0000);
        assert!(Assignment::decode(b.freeze()).is_err());
    }

    /// A blob from a newer member (version 9, with a field appended after rack id) reads as version 3.
    #[test]
    fn newer_versions_read_as_the_newest_known() {
        let s = Subscription {
            topics: vec!["a".into()],
            generation_id: 7,
            rack_id: Some("r1".into()),
            ..Default::default()
        };
        let mut raw = BytesMut::from(&s.encode(3)[..]);
        raw[0..2].copy_from_slice(&9i16.to_be_bytes());
        raw.put_i32(12345);
        assert_eq!(Subscription::decode(raw.freeze()).unwrap(), s);
    }

    /// Java's ConsumerProtocolSubscription v1 with an owned partition, built by kafka-protocol, decodes.
    #[test]
    fn decodes_kafka_protocol_owned_partitions() {
        let kp = ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("t")])
            .with_owned_partitions(vec![kps::TopicPartition::default()
                .with_topic(StrBytes::from_static_str("t").into())
                .with_partitions(vec![0, 2])]);
        let mut raw = BytesMut::new();
        raw.put_i16(1);
        kp.encode(&mut raw, 1).unwrap();
        let s = Subscription::decode(raw.freeze()).unwrap();
        assert_eq!(
            s.owned_partitions,
            vec![TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 2]
            }]
        );
        assert_eq!(s.generation_id, -1);
    }

    /// An empty assignment blob, which the coordinator sends a member given nothing, decodes as the
    /// empty assignment rather than an error.
    #[test]
    fn empty_assignment_blob_is_the_empty_assignment() {
        assert_eq!(
            Assignment::decode(Bytes::new()).unwrap(),
            Assignment::default()
        );
    }
}
