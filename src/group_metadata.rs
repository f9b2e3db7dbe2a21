//! A group member's metadata: the fencing token a transactional offset commit carries (KIP-447).
//!
//! It sits at the crate root, beside the layers rather than in one of them, because two layers that
//! never call each other both need it: the consumer makes it when a join completes, and the
//! transactional producer sends it in TxnOffsetCommit. Neither imports the other for it.
//!
//! # References
//! - KIP-447 (producer scalability for exactly-once: TxnOffsetCommit v3 carries generation and member id)
//! - KIP-848 (the consumer rebalance protocol: the member epoch plays the generation's role)

/// What the group coordinator checks when a transaction commits offsets for a group: the committer must
/// still be the member it claims to be, at the generation (classic protocol) or member epoch (KIP-848
/// consumer protocol) it claims.
///
/// A value of this type is only ever built from a completed join, so its generation is never negative:
/// a commit carrying the unknown generation (-1) would skip the coordinator's generation check on an
/// empty group and land unfenced, which is exactly what snapfence exists to prevent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupMetadata {
    group_id: String,
    generation_id: i32,
    member_id: String,
    group_instance_id: Option<String>,
}

/// Refused: group metadata with a negative generation or an empty member id is not a fencing token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("group metadata for group {group_id:?} is not from a completed join (generation {generation_id}, member id {member_id:?})")]
pub struct NotJoined {
    /// The group the metadata was for.
    pub group_id: String,
    /// The generation offered.
    pub generation_id: i32,
    /// The member id offered.
    pub member_id: String,
}

impl GroupMetadata {
    /// Builds the metadata of a member that has completed a join. Fails on a negative generation or an
    /// empty member id: those are the pre-join placeholders, and they must never reach a commit.
    pub fn new(
        group_id: impl Into<String>,
        generation_id: i32,
        member_id: impl Into<String>,
        group_instance_id: Option<String>,
    ) -> Result<Self, NotJoined> {
        let group_id = group_id.into();
        let member_id = member_id.into();
        if generation_id < 0 || member_id.is_empty() {
            return Err(NotJoined {
                group_id,
                generation_id,
                member_id,
            });
        }
        Ok(GroupMetadata {
            group_id,
            generation_id,
            member_id,
            group_instance_id,
        })
    }

    /// The group id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The generation (classic protocol) or member epoch (consumer protocol). Never negative.
    pub fn generation_id(&self) -> i32 {
        self.generation_id
    }

    /// The member id the coordinator assigned.
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The static member id (KIP-345), if the member was configured with one.
    pub fn group_instance_id(&self) -> Option<&str> {
        self.group_instance_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pre-join placeholders (generation -1, empty member id) must never become a fencing token.
    #[test]
    fn refuses_pre_join_placeholders() {
        assert!(GroupMetadata::new("g", -1, "m", None).is_err());
        assert!(GroupMetadata::new("g", 3, "", None).is_err());
        let ok = GroupMetadata::new("g", 0, "m-1", Some("i".into())).unwrap();
        assert_eq!(ok.generation_id(), 0);
        assert_eq!(ok.group_instance_id(), Some("i"));
    }
}
