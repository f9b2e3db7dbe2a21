//! Group consumer configuration.

use std::time::Duration;

use super::{Assignor, ConsumerError};

/// Which rebalance protocol the member speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupProtocol {
    /// The classic protocol (JoinGroup / SyncGroup / Heartbeat), assignment computed by the group leader
    /// with one of `assignors`, listed in order of preference. The member is cooperative only if every
    /// listed assignor is (see [`Assignor::protocol_for`]).
    Classic {
        /// Assignors in order of preference.
        assignors: Vec<Assignor>,
    },
    /// The KIP-848 consumer protocol (`group.protocol=consumer`, Kafka 4.0+): ConsumerGroupHeartbeat,
    /// assignment computed by the coordinator.
    Consumer {
        /// The server-side assignor to ask for (`uniform` or `range`), or `None` for the broker default.
        server_assignor: Option<String>,
    },
}

/// Configuration of a group member.
///
/// Build with [`GroupConfig::new`] and adjust the public fields; the struct is `#[non_exhaustive]` so
/// new settings can be added without breaking callers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupConfig {
    /// The consumer group id.
    pub group_id: String,
    /// A static member id (KIP-345): a restart within the session timeout resumes the old membership
    /// without a rebalance. Static members do not send LeaveGroup on close.
    pub group_instance_id: Option<String>,
    /// The rebalance protocol. Default: classic with the cooperative-sticky assignor.
    pub protocol: GroupProtocol,
    /// Classic only: how long the coordinator waits for a heartbeat before evicting the member. (Under
    /// the consumer protocol the broker's `group.consumer.session.timeout.ms` decides.) Default 45 s.
    pub session_timeout: Duration,
    /// Classic only: heartbeat period. (Under the consumer protocol the coordinator says.) Default 3 s.
    pub heartbeat_interval: Duration,
    /// The longest the application may go between two polls, and the rebalance timeout the coordinator
    /// grants this member to finish revoking. Past it the member leaves the group on its own and its
    /// partitions are reported lost. Default 5 min.
    pub max_poll_interval: Duration,
    /// Pause before retrying a retriable group error or rediscovering the coordinator. Default 100 ms.
    pub retry_backoff: Duration,
    /// The rack of this client (KIP-881 subscription v3, consumer protocol `RackId`).
    pub rack_id: Option<String>,
    /// Classic leader only: how often to re-read partition counts, so a topic that grows partitions
    /// triggers a rebalance. Default 5 min.
    pub metadata_max_age: Duration,
}

impl GroupConfig {
    /// Defaults for group `group_id`: classic protocol with cooperative-sticky, dynamic membership.
    pub fn new(group_id: impl Into<String>) -> Self {
        GroupConfig {
            group_id: group_id.into(),
            group_instance_id: None,
            protocol: GroupProtocol::Classic {
                assignors: vec![Assignor::CooperativeSticky],
            },
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(3),
            max_poll_interval: Duration::from_secs(300),
            retry_backoff: Duration::from_millis(100),
            rack_id: None,
            metadata_max_age: Duration::from_secs(300),
        }
    }

    /// Checks the settings that would otherwise fail only at the coordinator, or never.
    pub fn validate(&self) -> Result<(), ConsumerError> {
        let bad = |m: &str| Err(ConsumerError::InvalidConfig(m.into()));
        if self.group_id.is_empty() {
            return bad("group id is empty");
        }
        if self.group_instance_id.as_deref() == Some("") {
            return bad("group instance id is empty");
        }
        if let GroupProtocol::Classic { assignors } = &self.protocol {
            if assignors.is_empty() {
                return bad("the classic protocol needs at least one assignor");
            }
            if self.heartbeat_interval >= self.session_timeout {
                return bad("heartbeat interval must be below the session timeout");
            }
        }
        for (name, d) in [
            ("session timeout", self.session_timeout),
            ("max poll interval", self.max_poll_interval),
        ] {
            if d.as_millis() > i32::MAX as u128 || d.is_zero() {
                return Err(ConsumerError::InvalidConfig(format!(
                    "{name} must be between 1 ms and i32::MAX ms"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group config that cannot work (no group id, no assignor, a heartbeat not shorter than the
    /// session, a poll interval past the protocol's i32 milliseconds, an empty instance id) is refused
    /// before anything is sent.
    #[test]
    fn validation_refuses_unworkable_settings() {
        assert!(GroupConfig::new("g").validate().is_ok());
        assert!(GroupConfig::new("").validate().is_err());
        let mut c = GroupConfig::new("g");
        c.protocol = GroupProtocol::Classic { assignors: vec![] };
        assert!(c.validate().is_err());
        let mut c = GroupConfig::new("g");
        c.heartbeat_interval = c.session_timeout;
        assert!(c.validate().is_err());
        let mut c = GroupConfig::new("g");
        c.max_poll_interval = Duration::from_secs(u64::MAX / 4);
        assert!(c.validate().is_err());
        let mut c = GroupConfig::new("g");
        c.group_instance_id = Some(String::new());
        assert!(c.validate().is_err());
    }
}
