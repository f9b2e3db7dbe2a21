//! Small value types the consumer's public API speaks in.

use std::fmt;
use std::sync::Arc;

/// One partition of one topic.
///
/// The topic name is an `Arc<str>` so that the many copies a consumer keeps (assignment, positions,
/// fetch sessions, handler arguments) share one allocation per topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic name.
    pub topic: Arc<str>,
    /// The partition index.
    pub partition: i32,
}

impl TopicPartition {
    /// A partition of `topic`.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A topic's identity under KIP-516: the consumer protocol (KIP-848) names assigned partitions by topic
/// id, not by name, so a member must resolve ids to names through Metadata before it can use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub [u8; 16]);

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}
