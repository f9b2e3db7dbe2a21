//! How much one pass of the producer's send loop may let out to each connection (a broker's only one,
//! or one of its `connections_per_broker`; "broker" below). No I/O and no clock: the driver builds a
//! budget from what its senders have queued and on the wire, then asks it about every batch the core
//! offers.
//!
//! A broker gets no more requests than it has room for under `max_in_flight` unanswered ones. A
//! request carries one batch per partition and at most `max_request_size` bytes, so a pass gives a
//! partition at most `room` batches and a broker at most `room` requests' worth of bytes. What is not
//! let out stays in the accumulator and goes on filling: the next request then carries full batches
//! instead of a stream of small ones (a broker takes a connection's requests one at a time), and every
//! request of a pass but a broker's last is full rather than topped up by a lone batch that did not
//! fit.

use std::collections::HashMap;
use std::hash::Hash;

use super::TopicPartition;

/// One pass's budget per connection `C` (see the module docs).
#[derive(Debug)]
pub(crate) struct SendBudget<C> {
    /// `max_in_flight`: the room of a broker that has no sender yet.
    cap: usize,
    /// `max_request_size`: the bytes one request's worth of room stands for.
    max_request_bytes: usize,
    /// Requests each broker with a sender can still take: `cap` less what it has queued or on the wire.
    room: HashMap<C, usize>,
    /// Batches let out this pass, by partition.
    given: HashMap<TopicPartition, usize>,
    /// Bytes let out this pass, by broker.
    bytes_given: HashMap<C, usize>,
    /// Whether a batch was held back for want of room.
    held: bool,
}

impl<C: Copy + Eq + Hash> SendBudget<C> {
    /// A pass's budget: `busy` gives, for each broker with a sender, how many requests it has queued or
    /// unanswered.
    pub(crate) fn new(
        max_in_flight: usize,
        max_request_bytes: usize,
        busy: impl IntoIterator<Item = (C, usize)>,
    ) -> Self {
        SendBudget {
            cap: max_in_flight,
            max_request_bytes,
            room: busy
                .into_iter()
                .map(|(node, busy)| (node, max_in_flight.saturating_sub(busy)))
                .collect(),
            given: HashMap::new(),
            bytes_given: HashMap::new(),
            held: false,
        }
    }

    /// Whether a batch of `bytes` of `tp`, which goes on connection `conn`, may go now; if so, it is
    /// counted.
    pub(crate) fn allow(&mut self, tp: &TopicPartition, conn: C, bytes: usize) -> bool {
        let room = self.room.get(&conn).copied().unwrap_or(self.cap);
        let given = self.given.entry(tp.clone()).or_insert(0);
        let bytes_given = self.bytes_given.entry(conn).or_insert(0);
        if *given >= room || *bytes_given + bytes > room * self.max_request_bytes {
            self.held = true;
            return false;
        }
        *given += 1;
        *bytes_given += bytes;
        true
    }

    /// Whether some batch was held back for want of room: the driver looks again shortly, since the
    /// busy broker's next answer makes room.
    pub(crate) fn held(&self) -> bool {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// A broker with room for one more request gets at most one batch per partition and one request's
    /// worth of bytes in a pass; the batch that would pass either bound is held, and says so.
    #[test]
    fn a_broker_gets_at_most_its_room_in_batches_and_bytes() {
        let mut budget = SendBudget::new(5, 100, [(1, 4)]);
        assert!(budget.allow(&tp(0), 1, 60));
        assert!(!budget.held());
        assert!(
            !budget.allow(&tp(0), 1, 10),
            "a second batch of the partition"
        );
        assert!(budget.held());
        assert!(
            budget.allow(&tp(1), 1, 40),
            "up to a request's worth of bytes"
        );
        assert!(
            !budget.allow(&tp(2), 1, 1),
            "past a request's worth of bytes"
        );
    }

    /// A broker with no sender yet has the whole `max_in_flight` of room, and brokers are counted apart.
    #[test]
    fn a_broker_without_a_sender_has_all_the_room_and_brokers_count_apart() {
        let mut budget = SendBudget::new(2, 100, [(1, 2)]);
        assert!(!budget.allow(&tp(0), 1, 1), "broker 1 is full");
        assert!(budget.allow(&tp(1), 2, 100));
        assert!(
            budget.allow(&tp(1), 2, 100),
            "two requests' room: a second batch"
        );
        assert!(!budget.allow(&tp(1), 2, 1), "and no third");
        assert!(
            budget.allow(&tp(2), 2, 0),
            "an empty batch fits whatever the bytes"
        );
    }

    /// A broker with more requests out than `max_in_flight` (the limit was lowered) has no room, not a
    /// negative one.
    #[test]
    fn an_overfull_broker_has_no_room() {
        let mut budget = SendBudget::new(1, 100, [(1, 3)]);
        assert!(!budget.allow(&tp(0), 1, 0));
    }
}
