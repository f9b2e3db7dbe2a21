//! The deterministic fold every broker flow test and the fault campaign check against: per key, how many
//! events and a running hash of their values in order. Any lost, repeated or reordered event changes it,
//! so a state recovered from snapshots can be compared with a fold of the oracle's events from scratch.

use std::sync::Arc;

use bytes::Bytes;
use snapfence::producer::ProducerRecord;
use snapfence::records::Record;
use snapfence::snapshot::{BoxError, Change, Fold, Outputs};

/// One key's folded state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tally {
    /// Events folded.
    pub count: u64,
    /// A running hash of their values, in order.
    pub hash: u64,
}

/// Folds one event value into `t` (`None` before the key's first event).
pub fn step(t: Option<Tally>, value: &[u8]) -> Tally {
    let t = t.unwrap_or(Tally { count: 0, hash: 17 });
    let mut h = t.hash;
    for b in value {
        h = h
            .wrapping_mul(1_099_511_628_211)
            .wrapping_add(u64::from(*b));
    }
    Tally {
        count: t.count + 1,
        hash: h.rotate_left(5),
    }
}

/// Whether an event deletes its key: its value ends with `-del`. The key's state goes away (the flow
/// writes a grave, then a tombstone) and its next event starts a fresh tally.
pub fn is_delete(value: &[u8]) -> bool {
    value.ends_with(b"-del")
}

/// The fold of `values` from scratch, `None` for no events (or when the last one deleted the key).
pub fn fold_all<'a>(values: impl IntoIterator<Item = &'a Bytes>) -> Option<Tally> {
    values.into_iter().fold(
        None,
        |t, v| {
            if is_delete(v) {
                None
            } else {
                Some(step(t, v))
            }
        },
    )
}

/// The [`Fold`] over [`Tally`]: 16 bytes, count then hash, big-endian.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counter;

impl Fold for Counter {
    type State = Tally;
    fn fold(
        &self,
        _key: &Bytes,
        state: &mut Option<Tally>,
        event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        let value = event.value.as_deref().unwrap_or_default();
        if is_delete(value) {
            *state = None;
            return Change::Delete;
        }
        *state = Some(step(*state, value));
        Change::Update
    }
    fn encode(&self, s: &Tally) -> Bytes {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&s.count.to_be_bytes());
        v.extend_from_slice(&s.hash.to_be_bytes());
        Bytes::from(v)
    }
    fn decode(&self, b: &[u8]) -> Result<Tally, BoxError> {
        let b: [u8; 16] = b.try_into().map_err(|_| "a tally is 16 bytes")?;
        let (c, h) = b.split_at(8);
        Ok(Tally {
            count: u64::from_be_bytes(c.try_into()?),
            hash: u64::from_be_bytes(h.try_into()?),
        })
    }
}

/// [`Counter`] that also emits one output per input event to `topic`: keyed by the event's key, its
/// value the event's offset in ASCII. A key lives on one input partition, so (key, offset) names an
/// input event, and a reader of the output topic can count each event's outputs.
#[derive(Debug, Clone)]
pub struct Echo {
    /// The output topic.
    pub topic: Arc<str>,
}

impl Fold for Echo {
    type State = Tally;
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<Tally>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        out.send(
            ProducerRecord::new(
                Arc::clone(&self.topic),
                Some(Bytes::from(event.offset.to_string())),
            )
            .key(key.clone()),
        );
        Counter.fold(key, state, event, out)
    }
    fn encode(&self, s: &Tally) -> Bytes {
        Counter.encode(s)
    }
    fn decode(&self, b: &[u8]) -> Result<Tally, BoxError> {
        Counter.decode(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tally tells apart folds that differ in order or repeats, a delete restarts it, and its 16-byte
    /// encoding round-trips while shorter input is refused.
    #[test]
    fn order_and_repeats_change_the_tally_and_encoding_round_trips() {
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        let ab = fold_all([&a, &b]).unwrap();
        assert_ne!(ab, fold_all([&b, &a]).unwrap());
        assert_ne!(ab, fold_all([&a, &b, &b]).unwrap());
        assert_eq!(ab.count, 2);
        assert_eq!(Counter.decode(&Counter.encode(&ab)).unwrap(), ab);
        assert!(Counter.decode(b"short").is_err());
        assert_eq!(fold_all([]), None);
        let del = Bytes::from_static(b"x-del");
        assert_eq!(fold_all([&a, &del]), None);
        assert_eq!(fold_all([&a, &del, &b]), fold_all([&b]));
    }
}
