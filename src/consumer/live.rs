//! The live group metadata: the value the consumer publishes on its poll path, and the cloneable
//! reader the snapshot layer binds into every transactional commit.
//!
//! Why a live reader and not a value captured at assignment: a rebalance can advance the generation
//! (classic) or member epoch (KIP-848) without changing this member's partitions, and such a bump fires
//! no callback under the consumer protocol and only an empty one under the cooperative assignor. A
//! token captured once goes stale and every later commit of a partition this member still owns is
//! fenced. The reader sees every bump after the next poll.
//!
//! Two rules the publisher keeps:
//! - nothing is published before the first join completes, and a placeholder (negative generation,
//!   empty member id) is never published: [`GroupMetadata`] cannot hold one;
//! - once published, the token is never withdrawn. After an eviction the last token stays; the
//!   coordinator rejects a commit carrying it (`ILLEGAL_GENERATION` / `UNKNOWN_MEMBER_ID`), which is
//!   the safe direction. Reverting to "absent" would gain nothing and lose the error's precision.
//!
//! # References
//! - KIP-447 (the group metadata a transactional offset commit carries)

use tokio::sync::watch;

use super::ConsumerError;
use crate::{GroupMetadata, NotJoined};

/// A reader of the group metadata the consumer publishes after every poll.
///
/// Cheap to clone; every clone sees the same latest value. Reading never blocks the consumer.
#[derive(Debug, Clone)]
pub struct GroupMetadataHandle {
    group_id: String,
    rx: watch::Receiver<Option<GroupMetadata>>,
}

impl GroupMetadataHandle {
    /// The latest published metadata, or `None` before the first join has completed.
    pub fn current(&self) -> Option<GroupMetadata> {
        self.rx.borrow().clone()
    }

    /// The latest published metadata, or [`ConsumerError::NotJoined`] before the first join: a
    /// commit must fail loudly rather than go out unfenced.
    pub fn require(&self) -> Result<GroupMetadata, ConsumerError> {
        self.current().ok_or_else(|| {
            ConsumerError::NotJoined(NotJoined {
                group_id: self.group_id.clone(),
                generation_id: -1,
                member_id: String::new(),
            })
        })
    }

    /// Waits until a value newer than the last one this handle saw is published.
    ///
    /// Cancel-safe: dropping the future loses nothing; the next call still sees the change.
    /// Fails with [`ConsumerError::Closed`] once the consumer is gone.
    pub async fn changed(&mut self) -> Result<GroupMetadata, ConsumerError> {
        loop {
            self.rx.changed().await.map_err(|_| ConsumerError::Closed)?;
            if let Some(m) = self.rx.borrow_and_update().clone() {
                return Ok(m);
            }
        }
    }
}

/// The writing side, owned by the consumer's poll path.
#[derive(Debug)]
pub(crate) struct GroupMetadataPublisher {
    tx: watch::Sender<Option<GroupMetadata>>,
}

impl GroupMetadataPublisher {
    pub(crate) fn new(group_id: impl Into<String>) -> (Self, GroupMetadataHandle) {
        let (tx, rx) = watch::channel(None);
        (
            GroupMetadataPublisher { tx },
            GroupMetadataHandle {
                group_id: group_id.into(),
                rx,
            },
        )
    }

    /// Publishes `latest` when it is a token different from the published one. `None` (not a member
    /// right now) never replaces a published token. Returns whether readers see a new value.
    pub(crate) fn publish(&self, latest: Option<GroupMetadata>) -> bool {
        let Some(latest) = latest else {
            return false;
        };
        self.tx.send_if_modified(|current| {
            if current.as_ref() == Some(&latest) {
                false
            } else {
                let before = current.as_ref().map(GroupMetadata::generation_id);
                if before != Some(latest.generation_id()) {
                    crate::telemetry::generation_changed(latest.group_id());
                }
                *current = Some(latest);
                true
            }
        })
    }

    /// A new reader.
    pub(crate) fn handle(&self, group_id: &str) -> GroupMetadataHandle {
        GroupMetadataHandle {
            group_id: group_id.to_string(),
            rx: self.tx.subscribe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gm(generation: i32, member: &str) -> GroupMetadata {
        GroupMetadata::new("g", generation, member, None).unwrap()
    }

    /// Before the first join the reader has nothing, and `require` fails instead of inventing a token.
    #[test]
    fn absent_until_first_publish() {
        let (p, h) = GroupMetadataPublisher::new("g");
        assert_eq!(h.current(), None);
        assert!(matches!(h.require(), Err(ConsumerError::NotJoined(n)) if n.generation_id == -1));
        assert!(!p.publish(None));
        assert_eq!(h.current(), None);
        assert!(p.publish(Some(gm(1, "m"))));
        assert_eq!(h.require().unwrap(), gm(1, "m"));
    }

    /// A published token is never withdrawn: "not a member right now" keeps the stale token, which
    /// the coordinator will refuse.
    #[test]
    fn never_withdrawn() {
        let (p, h) = GroupMetadataPublisher::new("g");
        p.publish(Some(gm(3, "m")));
        assert!(!p.publish(None));
        assert_eq!(h.current(), Some(gm(3, "m")));
    }

    /// Every clone and every later subscriber sees a generation bump, and `changed` wakes for it only.
    #[tokio::test]
    async fn bump_is_seen_by_all_readers() {
        let (p, mut h) = GroupMetadataPublisher::new("g");
        let h2 = h.clone();
        let h3 = p.handle("g");
        p.publish(Some(gm(1, "m")));
        assert_eq!(h.changed().await.unwrap(), gm(1, "m"));
        assert!(!p.publish(Some(gm(1, "m"))), "same value is no change");
        p.publish(Some(gm(2, "m")));
        assert_eq!(h.changed().await.unwrap(), gm(2, "m"));
        assert_eq!(h2.current(), Some(gm(2, "m")));
        assert_eq!(h3.current(), Some(gm(2, "m")));
        drop(p);
        assert!(matches!(h.changed().await, Err(ConsumerError::Closed)));
    }
}
