//! The local checkpoint of a partition's on-disk state (issue 36), without I/O: what a checkpoint
//! records, its bytes, and the judgement made at each acquisition, whether the local image may be used
//! (the recovery read then starts at the checkpoint) or the partition must be read whole.
//!
//! A checkpoint says: through `offset` of the snapshot topic, the local image equals what is committed
//! there. It belongs to one partition of one topic of one cluster, written by one group's flow under one
//! transactional-id prefix, in one state encoding. A wrong local image would bring back the corruption
//! the fence exists to stop, so every doubt is a full read; each reason is named, for the log line and
//! the metric that report it.
//!
//! The judgement, in order (the first that applies wins):
//! 1. **Identity.** Any recorded field differs from this acquisition's (a directory copied from another
//!    partition or cluster, a recreated topic, a new encoding).
//! 2. **Ahead of the log.** The checkpoint is past the high watermark: the log lost records the image
//!    holds.
//! 3. **Log start passed.** Records between the checkpoint and the log start were deleted; the image
//!    cannot be brought up to date from the log.
//! 4. **Diverged (KIP-320).** The leader's OffsetForLeaderEpoch for the epoch of the last record below
//!    the checkpoint must answer that same epoch, ending at or after the checkpoint. A smaller epoch, or
//!    an end below the checkpoint, means the log was truncated below it, even if new writes have since
//!    brought the high watermark back above it (which check 2 alone would miss). An undefined answer
//!    (the broker no longer knows the epoch) is a divergence too.
//! 5. **Too old.** The checkpoint's time is at least `delete.retention.ms` ago: the cleaner may have
//!    removed a tombstone written after the checkpoint, and the deleted key would come back from the
//!    image. A tombstone is removed no sooner than `delete.retention.ms` after the broker first cleans
//!    it, which is after it was committed, which is after the checkpoint's time (taken before the read
//!    that ended at the checkpoint captured its target); so a younger checkpoint cannot have lost one.
//!    Both times are read on the member's wall clock (the broker's would be better: see
//!    docs/fencing.md); a clock that went back since the checkpoint is a doubt, so a full read.
//!
//! # References
//! - KIP-320 (OffsetForLeaderEpoch for consumers), KIP-534 (tombstone removal after
//!   `delete.retention.ms`), issue 36

// The on-disk state that reads and writes checkpoints is being built (issue 36); until it lands only
// the tests use this module.

/// What a checkpoint belongs to. Every field must equal the acquisition's for the image to be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The cluster id from Metadata.
    pub cluster_id: String,
    /// The snapshot topic's id (KIP-516): a topic deleted and recreated under its name has another.
    pub topic_id: [u8; 16],
    pub partition: i32,
    /// The snapshot topic's partition count: keys are partitioned by it.
    pub partition_count: i32,
    pub transactional_prefix: String,
    pub group: String,
    /// The fold's state-encoding version, which the application sets.
    pub state_version: u32,
}

/// A partition's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub identity: Identity,
    /// The next snapshot-topic offset to read: through `offset - 1` the image equals the committed log.
    pub offset: i64,
    /// The leader epoch of the record at `offset - 1`; -1 when `offset` is 0.
    pub leader_epoch: i32,
    /// A time, in milliseconds on the member's wall clock, before which every record at or past
    /// `offset` was still uncommitted: taken before the read that ended at `offset` captured its
    /// target.
    pub time_ms: i64,
}

/// What the acquisition learned from the cluster, to judge a checkpoint by.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub identity: Identity,
    /// ListOffsets earliest.
    pub log_start: i64,
    /// ListOffsets latest (read_uncommitted).
    pub high_watermark: i64,
    /// The leader's OffsetForLeaderEpoch answer for the checkpoint's `leader_epoch`: the largest epoch
    /// at or below it that the log has, and that epoch's end offset; `(-1, -1)` is undefined. Not asked
    /// (`None`) when the checkpoint is at offset 0.
    pub epoch_end: Option<(i32, i64)>,
    /// The member's wall clock now, milliseconds.
    pub now_ms: i64,
    /// The snapshot topic's `delete.retention.ms`, read at this acquisition.
    pub delete_retention_ms: i64,
    /// How much of the retention is kept back for clocks that stepped: the checkpoint's age plus this
    /// must stay under `delete_retention_ms` ([`DiskState::clock_allowance`](crate::snapshot::DiskState)).
    pub clock_allowance_ms: i64,
}

/// Why the local image is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// No checkpoint.
    NoCheckpoint,
    /// The store, or its checkpoint, failed a checksum or did not decode.
    Corrupt(String),
    /// A recorded field differs; names the field.
    Identity(&'static str),
    AheadOfLog {
        checkpoint: i64,
        high_watermark: i64,
    },
    LogStartPassed {
        checkpoint: i64,
        log_start: i64,
    },
    Diverged {
        checkpoint: i64,
        epoch: i32,
        answered: (i32, i64),
    },
    TooOld {
        age_ms: i64,
        delete_retention_ms: i64,
        allowance_ms: i64,
    },
}

impl Fallback {
    /// The metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Fallback::NoCheckpoint => "no_checkpoint",
            Fallback::Corrupt(_) => "corrupt",
            Fallback::Identity(_) => "identity",
            Fallback::AheadOfLog { .. } => "ahead_of_log",
            Fallback::LogStartPassed { .. } => "log_start_passed",
            Fallback::Diverged { .. } => "diverged",
            Fallback::TooOld { .. } => "too_old",
        }
    }
}

/// The judgement on a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Use the image and read the log from `from` to the high watermark.
    Resume { from: i64 },
    /// Discard the image and read the partition whole.
    FullRead(Fallback),
}

/// Judges `checkpoint` by what the acquisition observed (see the module docs for the order and the
/// argument for each check).
pub(crate) fn judge(checkpoint: Option<&Checkpoint>, seen: &Observed) -> Judgement {
    let Some(c) = checkpoint else {
        return Judgement::FullRead(Fallback::NoCheckpoint);
    };
    if let Some(field) = differing_field(&c.identity, &seen.identity) {
        return Judgement::FullRead(Fallback::Identity(field));
    }
    if c.offset > seen.high_watermark {
        return Judgement::FullRead(Fallback::AheadOfLog {
            checkpoint: c.offset,
            high_watermark: seen.high_watermark,
        });
    }
    if seen.log_start > c.offset {
        return Judgement::FullRead(Fallback::LogStartPassed {
            checkpoint: c.offset,
            log_start: seen.log_start,
        });
    }
    if c.offset > 0 {
        let answered = seen.epoch_end.unwrap_or((-1, -1));
        let (epoch, end) = answered;
        if c.leader_epoch < 0 || epoch != c.leader_epoch || end < c.offset {
            return Judgement::FullRead(Fallback::Diverged {
                checkpoint: c.offset,
                epoch: c.leader_epoch,
                answered,
            });
        }
    }
    let age_ms = seen.now_ms.saturating_sub(c.time_ms);
    if age_ms < 0 || age_ms.saturating_add(seen.clock_allowance_ms) >= seen.delete_retention_ms {
        return Judgement::FullRead(Fallback::TooOld {
            age_ms,
            delete_retention_ms: seen.delete_retention_ms,
            allowance_ms: seen.clock_allowance_ms,
        });
    }
    Judgement::Resume { from: c.offset }
}

/// The first identity field that differs, by name.
fn differing_field(recorded: &Identity, now: &Identity) -> Option<&'static str> {
    [
        ("cluster_id", recorded.cluster_id == now.cluster_id),
        ("topic_id", recorded.topic_id == now.topic_id),
        ("partition", recorded.partition == now.partition),
        (
            "partition_count",
            recorded.partition_count == now.partition_count,
        ),
        (
            "transactional_prefix",
            recorded.transactional_prefix == now.transactional_prefix,
        ),
        ("group", recorded.group == now.group),
        ("state_version", recorded.state_version == now.state_version),
    ]
    .into_iter()
    .find(|(_, same)| !same)
    .map(|(field, _)| field)
}

// ---- bytes ---------------------------------------------------------------------------------------

/// The first bytes of every checkpoint.
const MAGIC: &[u8; 4] = b"SFCK";
/// The one layout so far.
const VERSION: u8 = 1;

/// Why checkpoint bytes were refused. Every malformation is one of these, never a panic, and nothing is
/// allocated for a length the bytes do not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CheckpointError {
    #[error("checkpoint truncated: {0}")]
    Truncated(&'static str),
    #[error("not a checkpoint (bad magic)")]
    BadMagic,
    #[error("checkpoint layout {0} is not known")]
    UnknownVersion(u8),
    #[error("checkpoint checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("checkpoint field {0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("{0} bytes after the checkpoint")]
    Trailing(usize),
}

impl Checkpoint {
    /// The checkpoint's bytes: magic, layout, the fields (strings with a u16 length), then a CRC-32C of
    /// everything before it.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let id = &self.identity;
        let mut out = Vec::with_capacity(64 + id.cluster_id.len() + id.group.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        put_str(&mut out, &id.cluster_id);
        out.extend_from_slice(&id.topic_id);
        out.extend_from_slice(&id.partition.to_be_bytes());
        out.extend_from_slice(&id.partition_count.to_be_bytes());
        put_str(&mut out, &id.transactional_prefix);
        put_str(&mut out, &id.group);
        out.extend_from_slice(&id.state_version.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.leader_epoch.to_be_bytes());
        out.extend_from_slice(&self.time_ms.to_be_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Reads bytes written by [`Checkpoint::encode`]; the checksum is checked before any field is read.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        if bytes.len() < MAGIC.len() + 1 + 4 {
            return Err(CheckpointError::Truncated("header"));
        }
        if &bytes[..4] != MAGIC {
            return Err(CheckpointError::BadMagic);
        }
        if bytes[4] != VERSION {
            return Err(CheckpointError::UnknownVersion(bytes[4]));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(CheckpointError::Checksum { stored, computed });
        }
        let mut r = Reader { rest: &body[5..] };
        let identity = Identity {
            cluster_id: r.string("cluster_id")?,
            topic_id: r.array("topic_id")?,
            partition: i32::from_be_bytes(r.array("partition")?),
            partition_count: i32::from_be_bytes(r.array("partition_count")?),
            transactional_prefix: r.string("transactional_prefix")?,
            group: r.string("group")?,
            state_version: u32::from_be_bytes(r.array("state_version")?),
        };
        let checkpoint = Checkpoint {
            identity,
            offset: i64::from_be_bytes(r.array("offset")?),
            leader_epoch: i32::from_be_bytes(r.array("leader_epoch")?),
            time_ms: i64::from_be_bytes(r.array("time_ms")?),
        };
        if !r.rest.is_empty() {
            return Err(CheckpointError::Trailing(r.rest.len()));
        }
        Ok(checkpoint)
    }
}

/// A string with a u16 length. Every string here (a cluster id, a group id, a prefix) is far shorter:
/// Kafka bounds group and transactional ids by what a request can carry, and a longer one is cut at a
/// character boundary, which only makes the identity check fail safe (a full read).
fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(usize::from(u16::MAX));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], CheckpointError> {
        if self.rest.len() < n {
            return Err(CheckpointError::Truncated(field));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], CheckpointError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }

    fn string(&mut self, field: &'static str) -> Result<String, CheckpointError> {
        let len = u16::from_be_bytes(self.array(field)?);
        // Checked against the bytes left before anything is allocated.
        let bytes = self.take(usize::from(len), field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| CheckpointError::NotUtf8(field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            cluster_id: "k8Qz-cluster".into(),
            topic_id: [7; 16],
            partition: 3,
            partition_count: 12,
            transactional_prefix: "billing".into(),
            group: "billing-flow".into(),
            state_version: 2,
        }
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            identity: identity(),
            offset: 1_000,
            leader_epoch: 4,
            time_ms: 1_700_000_000_000,
        }
    }

    /// What a healthy acquisition sees: the same identity, the log spanning the checkpoint, the epoch
    /// answered as recorded and ending later, an hour after the checkpoint with a day's retention.
    fn observed() -> Observed {
        Observed {
            identity: identity(),
            log_start: 10,
            high_watermark: 1_500,
            epoch_end: Some((4, 1_200)),
            now_ms: 1_700_000_000_000 + 3_600_000,
            delete_retention_ms: 86_400_000,
            clock_allowance_ms: 0,
        }
    }

    fn full_read(seen: &Observed) -> Fallback {
        match judge(Some(&checkpoint()), seen) {
            Judgement::FullRead(why) => why,
            other => panic!("expected a full read, got {other:?}"),
        }
    }

    #[test]
    fn a_healthy_checkpoint_resumes_at_its_offset() {
        assert_eq!(
            judge(Some(&checkpoint()), &observed()),
            Judgement::Resume { from: 1_000 }
        );
        // Boundaries that still hold: the log starts at the checkpoint, the high watermark is the
        // checkpoint, the epoch ends exactly there, and one millisecond is left of the retention.
        let seen = Observed {
            log_start: 1_000,
            high_watermark: 1_000,
            epoch_end: Some((4, 1_000)),
            now_ms: 1_700_000_000_000 + 86_400_000 - 1,
            ..observed()
        };
        assert_eq!(
            judge(Some(&checkpoint()), &seen),
            Judgement::Resume { from: 1_000 }
        );
    }

    #[test]
    fn no_checkpoint_is_a_full_read() {
        assert_eq!(
            judge(None, &observed()),
            Judgement::FullRead(Fallback::NoCheckpoint)
        );
    }

    /// Each identity field on its own sends the partition to a full read, named.
    #[test]
    fn every_identity_field_is_checked() {
        type Change = fn(&mut Identity);
        let changes: [(&str, Change); 7] = [
            ("cluster_id", |i| i.cluster_id.push('x')),
            ("topic_id", |i| i.topic_id[15] ^= 1),
            ("partition", |i| i.partition += 1),
            ("partition_count", |i| i.partition_count *= 2),
            ("transactional_prefix", |i| i.transactional_prefix.clear()),
            ("group", |i| i.group = "other".into()),
            ("state_version", |i| i.state_version += 1),
        ];
        for (field, change) in changes {
            let mut seen = observed();
            change(&mut seen.identity);
            assert_eq!(full_read(&seen), Fallback::Identity(field), "{field}");
            assert_eq!(full_read(&seen).label(), "identity");
        }
    }

    #[test]
    fn a_checkpoint_past_the_high_watermark_is_a_full_read() {
        let seen = Observed {
            high_watermark: 999,
            ..observed()
        };
        assert_eq!(
            full_read(&seen),
            Fallback::AheadOfLog {
                checkpoint: 1_000,
                high_watermark: 999
            }
        );
    }

    #[test]
    fn a_log_start_past_the_checkpoint_is_a_full_read() {
        let seen = Observed {
            log_start: 1_001,
            ..observed()
        };
        assert_eq!(full_read(&seen).label(), "log_start_passed");
    }

    /// A truncation below the checkpoint followed by new writes: the high watermark is above the
    /// checkpoint again, but the epoch's end (or the epoch itself) shows the log diverged.
    #[test]
    fn a_truncation_followed_by_new_writes_is_caught_by_the_epoch() {
        for answered in [(4, 900), (3, 1_400), (-1, -1)] {
            let seen = Observed {
                epoch_end: Some(answered),
                high_watermark: 2_000,
                ..observed()
            };
            assert_eq!(
                full_read(&seen),
                Fallback::Diverged {
                    checkpoint: 1_000,
                    epoch: 4,
                    answered
                },
                "{answered:?}"
            );
        }
        // Not asked, though the checkpoint has records below it: no proof, so a full read.
        let seen = Observed {
            epoch_end: None,
            ..observed()
        };
        assert_eq!(full_read(&seen).label(), "diverged");
    }

    /// A checkpoint at offset 0 (an empty image) needs no epoch.
    #[test]
    fn an_empty_checkpoint_needs_no_epoch() {
        let empty = Checkpoint {
            offset: 0,
            leader_epoch: -1,
            ..checkpoint()
        };
        let seen = Observed {
            log_start: 0,
            epoch_end: None,
            ..observed()
        };
        assert_eq!(judge(Some(&empty), &seen), Judgement::Resume { from: 0 });
    }

    /// At `delete.retention.ms` or older a tombstone written after the checkpoint may be gone; a clock
    /// that went back since cannot say how old the checkpoint is.
    #[test]
    fn a_checkpoint_as_old_as_the_tombstone_retention_is_a_full_read() {
        let seen = Observed {
            now_ms: 1_700_000_000_000 + 86_400_000,
            ..observed()
        };
        assert_eq!(
            full_read(&seen),
            Fallback::TooOld {
                age_ms: 86_400_000,
                delete_retention_ms: 86_400_000,
                allowance_ms: 0
            }
        );
        let back = Observed {
            now_ms: 1_600_000_000_000,
            ..observed()
        };
        assert_eq!(
            full_read(&back),
            Fallback::TooOld {
                age_ms: -100_000_000_000,
                delete_retention_ms: 86_400_000,
                allowance_ms: 0
            }
        );
    }

    /// The allowance for stepped clocks comes off the retention: an age that would do without it no
    /// longer does with it.
    #[test]
    fn the_clock_allowance_shortens_the_retention_a_checkpoint_may_use() {
        let seen = Observed {
            now_ms: 1_700_000_000_000 + 86_400_000 - 10_000,
            ..observed()
        };
        assert_eq!(
            judge(Some(&checkpoint()), &seen),
            Judgement::Resume { from: 1_000 }
        );
        let allowed = Observed {
            clock_allowance_ms: 10_000,
            ..seen.clone()
        };
        assert_eq!(
            full_read(&allowed),
            Fallback::TooOld {
                age_ms: 86_400_000 - 10_000,
                delete_retention_ms: 86_400_000,
                allowance_ms: 10_000
            }
        );
        let just = Observed {
            clock_allowance_ms: 9_999,
            ..seen
        };
        assert_eq!(
            judge(Some(&checkpoint()), &just),
            Judgement::Resume { from: 1_000 }
        );
    }

    #[test]
    fn the_bytes_round_trip() {
        let c = checkpoint();
        assert_eq!(Checkpoint::decode(&c.encode()), Ok(c));
        let odd = Checkpoint {
            identity: Identity {
                cluster_id: String::new(),
                group: "gruppe-ü".into(),
                ..identity()
            },
            offset: i64::MAX,
            leader_epoch: -1,
            time_ms: i64::MIN,
        };
        assert_eq!(Checkpoint::decode(&odd.encode()), Ok(odd));
    }

    /// Every cut of the bytes and every flipped bit is a typed error, never a panic and never a
    /// checkpoint.
    #[test]
    fn every_cut_and_every_flipped_bit_is_refused() {
        let bytes = checkpoint().encode();
        for len in 0..bytes.len() {
            assert!(Checkpoint::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Checkpoint::decode(&b).is_err(), "bit {i}");
        }
        let mut longer = bytes.clone();
        longer.insert(bytes.len() - 4, 0);
        assert!(Checkpoint::decode(&longer).is_err());
    }

    /// A length field larger than the bytes left, under a valid checksum, is refused as truncated
    /// without reserving that length.
    #[test]
    fn a_length_past_the_end_is_refused_before_allocating() {
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.push(VERSION);
        body.extend_from_slice(&u16::MAX.to_be_bytes());
        body.extend_from_slice(b"short");
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(
            Checkpoint::decode(&body),
            Err(CheckpointError::Truncated("cluster_id"))
        );
        assert_eq!(
            Checkpoint::decode(b"XXXX\x01\0\0\0\0"),
            Err(CheckpointError::BadMagic)
        );
        assert_eq!(
            Checkpoint::decode(b"SFCK\x09\0\0\0\0"),
            Err(CheckpointError::UnknownVersion(9))
        );
    }
}
