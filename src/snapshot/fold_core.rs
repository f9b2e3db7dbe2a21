//! The per-partition fold core: everything a partition of a [`Flow`](super::Flow) remembers between
//! events, with no I/O, no clock and no tasks.
//!
//! The core takes events, `now` and the outcomes of writes and commits in, and hands out what to write
//! (a [`Wave`] of snapshots, graves and tombstones) and what may be committed
//! ([`committable`](PartitionCore::committable)). The async driver in `flow/` owns the store and the
//! timers; the rules live here, where scripted tests can drive every ordering.
//!
//! # Method kinds and call order
//! - **`handle_*`**, input: `handle_event` (one input event, in offset order), `handle_read_to` (the
//!   input was read up to an offset), `handle_timeout` (fire the deadlines at or before `now`),
//!   `handle_wave_outcome` (how a wave's write ended), `handle_commit_landed`, `handle_fenced`;
//!   `restore` feeds the recovered state in before any of them;
//! - **`poll_*`**, output: `poll_wave` (the next write, at most one in flight), `poll_commit` (an
//!   offset to commit, once it moved), `poll_timeout` (the earliest deadline);
//! - **queries**: `committable`, `position`, `states`, `tombstones_due`, `is_fenced`.
//!
//! # The rules
//!
//! - **Replay skip.** Each key remembers the offset of the last event folded into it (persisted in the
//!   snapshot's envelope). A replayed event at or below it is skipped, so replaying from the committed
//!   offset never folds an event twice.
//! - **Held offsets.** A key holds the first offset whose effect exists only in memory: set by the
//!   first change after its last landed write, cleared when a write carrying that change lands. A write
//!   in flight does not clear it; a change folded while the write flies is held again when it lands.
//! - **Committable offset.** The minimum held offset over the partition's keys, or the position (the
//!   next offset to fold) when none holds. A commit never carries an offset past a change whose write
//!   has not landed.
//! - **Deletes.** A deleted key first becomes a *grave*: an envelope with the delete's offset and no
//!   state, written like any snapshot. Recovery reads a grave as an absent key that still skips replayed
//!   events at or below its offset. Once a commit has landed past that offset, no replay can reach those
//!   events any more, and the next wave writes the real tombstone (a null value); when it lands the key
//!   is forgotten. A tombstone is written at once when the committed offset is already past the delete.
//!   Why not a tombstone straight away: it carries no offset, so if it landed while the committed offset
//!   was still at or below the delete, a restart would replay the key's earlier events onto an absent
//!   state and could bring the key back with a state no owner ever had.
//! - **Timers.** A key's deadline is derived from its state ([`Fold::deadline`](super::Fold::deadline)),
//!   so it is persisted with the state and a new owner recovers it. [`handle_timeout`](PartitionCore::handle_timeout) fires
//!   every deadline at or before `now`; the effect is a change like an event's, holding the committable
//!   offset at the position the timer fired at until its write lands.
//! - **Fence outcomes.** A wave that lands clears what it covered; a failed wave leaves every key it
//!   carried held and dirty (rewritten by the next wave); a fenced wave does the same and stops the
//!   partition: nothing more is handed out.

use std::collections::{BTreeSet, HashMap, HashSet};

use bytes::{BufMut, Bytes, BytesMut};

use super::fold::{output_size, Change, Fold, Outputs};
use crate::producer::ProducerRecord;
use crate::records::Record;
use keys::KeyTable;

const ENVELOPE_V1: u8 = 1;
const ENVELOPE_GRAVE: u8 = 2;
const ENVELOPE_INPUTS: u8 = 3;
const ENVELOPE_GRAVE_INPUTS: u8 = 4;

/// The most input topics one flow folds: the several-input envelope counts them in one byte.
pub(crate) const MAX_INPUTS: usize = u8::MAX as usize;

/// `[1][last folded offset i64 BE][user bytes]`: a live state.
pub(crate) fn envelope(offset: i64, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(9 + payload.len());
    b.put_u8(ENVELOPE_V1);
    b.put_i64(offset);
    b.put_slice(payload);
    b.freeze()
}

/// `[2][delete offset i64 BE]`: a deleted key whose tombstone must wait for the committed offset.
pub(crate) fn grave(offset: i64) -> Bytes {
    let mut b = BytesMut::with_capacity(9);
    b.put_u8(ENVELOPE_GRAVE);
    b.put_i64(offset);
    b.freeze()
}

/// `[3][n u8][n last offsets i64 BE, in the flow's input order][user bytes]`: a live state of a flow
/// with `n` (two or more) inputs.
pub(crate) fn envelope_inputs(offsets: &[i64], payload: &[u8]) -> Bytes {
    inputs_value(ENVELOPE_INPUTS, offsets, payload)
}

/// `[4][n u8][n offsets i64 BE]`: a grave of a flow with `n` (two or more) inputs.
pub(crate) fn grave_inputs(offsets: &[i64]) -> Bytes {
    inputs_value(ENVELOPE_GRAVE_INPUTS, offsets, &[])
}

fn inputs_value(version: u8, offsets: &[i64], payload: &[u8]) -> Bytes {
    debug_assert!((2..=MAX_INPUTS).contains(&offsets.len()));
    let mut b = BytesMut::with_capacity(2 + 8 * offsets.len() + payload.len());
    b.put_u8(version);
    b.put_u8(u8::try_from(offsets.len()).unwrap_or(u8::MAX));
    for o in offsets {
        b.put_i64(*o);
    }
    b.put_slice(payload);
    b.freeze()
}

/// The per-input offsets of a several-input envelope, borrowed from the stored value: one big-endian
/// `i64` per input topic, in the order the flow's configuration lists them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InputOffsets<'a>(&'a [u8]);

impl<'a> InputOffsets<'a> {
    /// How many inputs the envelope accounts for.
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }

    /// Never true for a value the library wrote (a several-input envelope has two or more).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The offset for input `i` (in the flow's input order), if there is one.
    pub fn get(&self, i: usize) -> Option<i64> {
        let b = self
            .0
            .get(i.checked_mul(8)?..i.checked_mul(8)?.checked_add(8)?)?;
        let mut o = [0u8; 8];
        o.copy_from_slice(b);
        Some(i64::from_be_bytes(o))
    }

    /// The offsets in input order.
    pub fn iter(&self) -> impl Iterator<Item = i64> + 'a {
        self.0.chunks_exact(8).map(|c| {
            let mut o = [0u8; 8];
            o.copy_from_slice(c);
            i64::from_be_bytes(o)
        })
    }
}

impl std::fmt::Debug for InputOffsets<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A snapshot value with its envelope opened: what a [`Flow`](super::Flow) stored for one key.
///
/// Every value a flow writes to its snapshot topic (or the PostgreSQL store) starts with an envelope.
/// A flow with one input writes a 9-byte one: a version byte, then the offset of the last input event
/// folded into the key (big-endian `i64`). A flow with several input topics writes a version byte, the
/// number of inputs, and one offset per input (docs/fencing.md, "Several inputs"). A live state follows
/// the envelope with the bytes [`Fold::encode`](super::Fold::encode) returned; a *grave* (a deleted key
/// whose tombstone waits for the committed offset, `docs/fencing.md`, "Deletes") has nothing after it.
/// A replay skips a key's events at or below the envelope's offset for their input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotValue<'a> {
    /// A state folded up to and including the input event at `last_offset`.
    Live {
        /// The offset of the last input event folded into the state.
        last_offset: i64,
        /// The application's bytes, as `Fold::encode` returned them.
        state: &'a [u8],
    },
    /// A key deleted by the input event at `offset`; recovery reads it as absent.
    Grave {
        /// The offset of the event that deleted the key.
        offset: i64,
    },
    /// A state of a flow with several inputs, accounting for each input up to and including its offset
    /// in `last_offsets`.
    LiveInputs {
        /// Per input, the last offset the state accounts for.
        last_offsets: InputOffsets<'a>,
        /// The application's bytes, as `Fold::encode` returned them.
        state: &'a [u8],
    },
    /// A key of a flow with several inputs, deleted; its events up to `offsets` are accounted for.
    GraveInputs {
        /// Per input, the last offset the grave accounts for.
        offsets: InputOffsets<'a>,
    },
}

impl SnapshotValue<'_> {
    /// The envelope's offset: the last input event this key's snapshot accounts for (folded into a live
    /// state, or the delete of a grave). For a flow with several inputs, the first input's; see
    /// [`input_offsets`](Self::input_offsets).
    pub fn offset(&self) -> i64 {
        match *self {
            SnapshotValue::Live { last_offset, .. } => last_offset,
            SnapshotValue::Grave { offset } => offset,
            SnapshotValue::LiveInputs {
                last_offsets: o, ..
            }
            | SnapshotValue::GraveInputs { offsets: o } => o.get(0).unwrap_or(-1),
        }
    }

    /// The offset per input, in the flow's input order (one for a flow with one input).
    pub fn input_offsets(&self) -> Vec<i64> {
        match *self {
            SnapshotValue::Live { last_offset, .. } => vec![last_offset],
            SnapshotValue::Grave { offset } => vec![offset],
            SnapshotValue::LiveInputs {
                last_offsets: o, ..
            }
            | SnapshotValue::GraveInputs { offsets: o } => o.iter().collect(),
        }
    }

    /// Whether this is a grave (a deleted key), of either kind.
    pub fn is_grave(&self) -> bool {
        matches!(
            self,
            SnapshotValue::Grave { .. } | SnapshotValue::GraveInputs { .. }
        )
    }

    /// Whether moving the flow's inputs to `offsets` (one per input, in the flow's order) contradicts
    /// this snapshot: it accounts for an event at or past the new offset of some input, which the next
    /// owner's replay would then skip for its key (the rule `snapfence reset` applies; docs/cli.md,
    /// "reset"). An envelope of one offset, written before the flow took more inputs, accounts for the
    /// first input only. `None` when the envelope accounts for another number of inputs than
    /// `offsets` holds.
    pub fn reaches(&self, offsets: &[i64]) -> Option<bool> {
        let own = self.input_offsets();
        if own.len() != offsets.len() && own.len() != 1 {
            return None;
        }
        Some(own.iter().zip(offsets).any(|(mine, new)| mine >= new))
    }

    /// The application's bytes of a live state; `None` for a grave.
    pub fn state(&self) -> Option<&[u8]> {
        match self {
            SnapshotValue::Live { state, .. } | SnapshotValue::LiveInputs { state, .. } => {
                Some(state)
            }
            SnapshotValue::Grave { .. } | SnapshotValue::GraveInputs { .. } => None,
        }
    }
}

/// A value that is not a snapshot envelope a flow wrote (another writer's record on the snapshot topic,
/// or a corrupt one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForeignSnapshotValue {
    /// The first byte is no envelope version this library writes.
    #[error("unknown snapshot envelope version {version}")]
    UnknownVersion {
        /// The first byte of the value.
        version: u8,
    },
    /// The value ends inside its envelope.
    #[error("a {len}-byte value is shorter than its snapshot envelope")]
    Truncated {
        /// The value's length.
        len: usize,
    },
    /// A grave is exactly its envelope; this one has bytes after it.
    #[error("a grave is only its envelope, this one has {len} bytes")]
    GraveWithState {
        /// The value's length.
        len: usize,
    },
    /// A several-input envelope counts fewer than two inputs.
    #[error("a several-input envelope counts {inputs} inputs")]
    TooFewInputs {
        /// The count it carries.
        inputs: u8,
    },
}

/// Opens the envelope of a snapshot value read from a flow's snapshot topic (a record's value; a null
/// value is a tombstone and has no envelope). The state of a [`SnapshotValue::Live`] borrows from
/// `bytes`. Never panics and never allocates: a value the library did not write is a
/// [`ForeignSnapshotValue`].
///
/// ```
/// use snapfence::snapshot::{open_snapshot_value, SnapshotValue};
/// let stored = [&[1u8][..], &41i64.to_be_bytes(), b"3"].concat();
/// assert_eq!(
///     open_snapshot_value(&stored),
///     Ok(SnapshotValue::Live { last_offset: 41, state: b"3" })
/// );
/// assert!(open_snapshot_value(b"3").is_err());
/// ```
pub fn open_snapshot_value(bytes: &[u8]) -> Result<SnapshotValue<'_>, ForeignSnapshotValue> {
    let offset = |rest: &[u8]| {
        let mut o = [0u8; 8];
        o.copy_from_slice(&rest[..8]);
        i64::from_be_bytes(o)
    };
    let truncated = ForeignSnapshotValue::Truncated { len: bytes.len() };
    match bytes {
        [ENVELOPE_V1, rest @ ..] if rest.len() >= 8 => Ok(SnapshotValue::Live {
            last_offset: offset(rest),
            state: &rest[8..],
        }),
        [ENVELOPE_GRAVE, rest @ ..] if rest.len() == 8 => Ok(SnapshotValue::Grave {
            offset: offset(rest),
        }),
        [ENVELOPE_GRAVE, rest @ ..] if rest.len() > 8 => {
            Err(ForeignSnapshotValue::GraveWithState { len: bytes.len() })
        }
        [v @ (ENVELOPE_INPUTS | ENVELOPE_GRAVE_INPUTS), n, rest @ ..] => {
            if *n < 2 {
                return Err(ForeignSnapshotValue::TooFewInputs { inputs: *n });
            }
            let width = 8 * usize::from(*n);
            if rest.len() < width {
                return Err(truncated);
            }
            let (offsets, state) = rest.split_at(width);
            let offsets = InputOffsets(offsets);
            match *v {
                ENVELOPE_INPUTS => Ok(SnapshotValue::LiveInputs {
                    last_offsets: offsets,
                    state,
                }),
                _ if state.is_empty() => Ok(SnapshotValue::GraveInputs { offsets }),
                _ => Err(ForeignSnapshotValue::GraveWithState { len: bytes.len() }),
            }
        }
        [v, ..] if !matches!(*v, ENVELOPE_V1..=ENVELOPE_GRAVE_INPUTS) => {
            Err(ForeignSnapshotValue::UnknownVersion { version: *v })
        }
        _ => Err(truncated),
    }
}

/// What a snapshot value says (the runtime's view of [`SnapshotValue`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Opened<'a> {
    /// A state folded up to the offset.
    Live(i64, &'a [u8]),
    /// A key deleted at the offset.
    Grave(i64),
    /// A state of a several-input flow, accounting for each input up to its offset.
    LiveInputs(InputOffsets<'a>, &'a [u8]),
    /// A grave of a several-input flow.
    GraveInputs(InputOffsets<'a>),
}

pub(crate) fn open_envelope(bytes: &[u8]) -> Result<Opened<'_>, String> {
    match open_snapshot_value(bytes) {
        Ok(SnapshotValue::Live { last_offset, state }) => Ok(Opened::Live(last_offset, state)),
        Ok(SnapshotValue::Grave { offset }) => Ok(Opened::Grave(offset)),
        Ok(SnapshotValue::LiveInputs {
            last_offsets,
            state,
        }) => Ok(Opened::LiveInputs(last_offsets, state)),
        Ok(SnapshotValue::GraveInputs { offsets }) => Ok(Opened::GraveInputs(offsets)),
        Err(e) => Err(e.to_string()),
    }
}

/// What the snapshot write of one key in a wave was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Snapshot,
    Grave,
    Tombstone,
}

struct Entry<S> {
    /// `None`: deleted (a grave in memory), kept until its tombstone lands.
    state: Option<S>,
    /// The offset of the last event folded in; replayed events at or below it are skipped.
    last_offset: i64,
    /// The first change not yet in a landed write.
    held: Option<i64>,
    /// While a write of this key is in flight: the first change folded since that write was encoded.
    in_wave: Option<Option<i64>>,
    deadline: Option<i64>,
    /// What the key costs in memory, estimated from its snapshot's size when it was last loaded or
    /// written (only a lazily loaded partition counts it).
    size: u32,
}

/// The writes of one persist wave: hand them to the store, then report with
/// [`PartitionCore::handle_wave_outcome`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wave {
    pub(crate) id: u64,
    /// One write per key, in no particular order.
    pub(crate) writes: Vec<WaveWrite>,
}

/// One key's write in a wave: its snapshot (or grave, or tombstone) and the outputs it emitted since
/// its last write. The two are one indivisible entry: they commit in the same transaction or not at
/// all (docs/fencing.md, "Outputs").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaveWrite {
    pub(crate) key: Bytes,
    /// The envelope, or `None` for a tombstone.
    pub(crate) value: Option<Bytes>,
    pub(crate) outputs: Vec<ProducerRecord>,
}

/// How a wave ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landing {
    /// Every write committed.
    Landed,
    /// Some write failed or its outcome is unknown: assume nothing landed, keep everything held.
    Failed,
    /// The fence refused it (a stale owner): nothing landed, and the partition stops.
    Fenced,
}

/// What folding one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Folded {
    /// The event had no key.
    NullKey,
    /// Replay: the key's state already covers it.
    Skipped,
    /// Folded, and the fold said nothing changed (and emitted nothing).
    Kept,
    /// Folded into a change (update or delete).
    Changed,
}

/// One partition's fold bookkeeping.
pub(crate) struct PartitionCore<S> {
    keys: KeyTable<Entry<S>>,
    /// Keys changed since their last write was encoded. hashbrown's set (under std's SipHash) for its
    /// `extract_if`: a capped wave takes its keys out without a lookup each (std's is newer than the
    /// crate's minimum Rust).
    dirty: hashbrown::HashSet<Bytes, std::hash::RandomState>,
    /// Deleted keys whose grave landed: a tombstone is due once a commit passes their offset.
    graves: HashSet<Bytes>,
    timers: BTreeSet<(i64, Bytes)>,
    /// The next input offset to fold.
    position: i64,
    /// The highest offset a landed commit carried.
    committed: i64,
    next_wave: u64,
    /// The wave in flight: each key it carried, what was written for it, and whether outputs rode.
    in_flight: Option<(u64, Vec<Carried>)>,
    fenced: bool,
    /// A write that carried outputs did not land for sure: the partition must be acquired again and
    /// its input replayed (outputs may already have committed, so they are neither resent nor dropped
    /// here). Nothing more is folded, written or committed.
    replay: bool,
    /// Outputs emitted since their key's last write was encoded, by key: they ride with its next
    /// write. Beside the keys rather than in them, so a fold that emits nothing pays no memory per key.
    held_outputs: HashMap<Bytes, Vec<ProducerRecord>>,
    /// Bytes of `held_outputs`, as [`Outputs::bytes`] counts them.
    held_output_bytes: usize,
    /// Reused for every fold call, so a fold that emits nothing allocates nothing.
    scratch: Outputs,
    /// The unfenced mode: outputs are handed to the driver at once ([`take_immediate`]) instead of
    /// riding with their key's write.
    ///
    /// [`take_immediate`]: PartitionCore::take_immediate
    at_once: bool,
    immediate: Vec<ProducerRecord>,
    /// Timers on stream time ([`TimerClock::Stream`](super::fold::TimerClock::Stream)) instead of the
    /// wall clock.
    stream: bool,
    /// The highest event timestamp seen (stream mode), `NO_TIME` before any.
    stream_time: i64,
    /// Stream mode: the stream time just before each offset a key's held change starts at, so a commit
    /// of that offset can carry the stream time its replay must start from. Entries below the last
    /// landed commit are dropped.
    marks: std::collections::BTreeMap<i64, i64>,
    /// Several inputs (`None` with one): where each input stands, and what only they need.
    inputs: Option<Box<Inputs>>,
    /// Keys loaded when an event (or a timer) needs them, from the on-disk image, under a memory
    /// budget (`None`: every key is in memory).
    #[cfg(feature = "disk-state")]
    lazy: Option<Box<lazy::Lazy>>,
}

/// A partition's bookkeeping for a flow with several co-partitioned inputs (docs/fencing.md, "Several
/// inputs"). The inputs are merged into one sequence; the core's scalar offsets are *coordinates* on
/// it: the sum of the inputs' positions, which grows by at least one with every merged event, so every
/// rule that compares offsets holds unchanged along the merge. What crosses an owner (the committed
/// offsets, an envelope) is a vector of per-input offsets.
struct Inputs {
    /// Per input, the next offset to merge. Their sum is the core's `position`.
    positions: Vec<i64>,
    /// The vector each held change starts at, by its coordinate: what a commit of that coordinate
    /// carries. Entries below the last landed commit are dropped.
    points: std::collections::BTreeMap<i64, Box<[i64]>>,
    /// Per input, the offsets the last landed commit carried.
    committed: Vec<i64>,
    /// The event being folded (input, offset), while `handle_event_from` runs: where a hold that starts
    /// now starts. `None` between events (a wall-clock timer holds at the positions).
    at: Option<(usize, i64)>,
    /// Recovered keys whose envelope accounts for events at or past the assigned offsets: per input,
    /// the last offset the state covers. Their replayed events are skipped input by input; the entry
    /// goes once every input has moved past it.
    restored: HashMap<Bytes, Box<[i64]>>,
}

impl Inputs {
    /// The per-input offsets of the point a hold starting now starts at.
    fn hold_point(&self) -> Box<[i64]> {
        let mut v = self.positions.clone();
        if let Some((i, offset)) = self.at {
            if let Some(p) = v.get_mut(i) {
                *p = offset;
            }
        }
        v.into()
    }

    /// Whether every input's position has moved past `last`.
    fn passed(&self, last: &[i64]) -> bool {
        self.positions.iter().zip(last).all(|(p, l)| p > l)
    }
}

/// No stream time yet.
const NO_TIME: i64 = i64::MIN;

/// What a key costs in memory beside its slot in the key table (which
/// [`KeyTable::heap_bytes`] counts, spare room included), estimated: its key and snapshot (standing
/// for the decoded state's own allocations), and a fixed share for the bookkeeping beside it (the
/// key's own allocation and its place in the eviction order) and the allocator.
fn entry_size(key: &[u8], value: Option<&Bytes>) -> u32 {
    let bytes = key.len() + value.map_or(0, |v| v.len()) + ENTRY_OVERHEAD;
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Keys one wave takes at most. Until a wave lands each of its keys is in memory several times
/// over (its envelope, the wave's, the core's and the writer's lists, the transactions' record
/// batches, under a budget the overlay's copy), about 400 bytes a key beside the key and its state:
/// a fold that changed 10^5 keys between two persists held 40 MB of waves. The rest go in the next
/// waves of the same persist, which costs nothing in throughput: a wave's transactions run one after
/// another anyway (`SnapshotConfig::max_writes_per_transaction`, 256 writes by default).
pub(crate) const WAVE_LIMIT: usize = 16 * 1024;

/// The fixed share of [`entry_size`].
const ENTRY_OVERHEAD: usize = 128;

/// A key a wave carried.
struct Carried {
    key: Bytes,
    written: Written,
    with_outputs: bool,
}

impl<S> PartitionCore<S> {
    /// A partition assigned at `offset` (which the group has committed, or is about to).
    pub(crate) fn new(offset: i64) -> Self {
        PartitionCore {
            keys: KeyTable::new(),
            dirty: hashbrown::HashSet::default(),
            graves: HashSet::new(),
            timers: BTreeSet::new(),
            position: offset,
            committed: offset,
            next_wave: 0,
            in_flight: None,
            fenced: false,
            replay: false,
            held_outputs: HashMap::new(),
            held_output_bytes: 0,
            scratch: Outputs::default(),
            at_once: false,
            immediate: Vec::new(),
            stream: false,
            stream_time: NO_TIME,
            marks: std::collections::BTreeMap::new(),
            inputs: None,
            #[cfg(feature = "disk-state")]
            lazy: None,
        }
    }

    /// A partition of a flow with several inputs, assigned at `offsets` (one per input, in the flow's
    /// input order). With one offset it is [`new`](Self::new).
    pub(crate) fn new_inputs(offsets: &[i64]) -> Self {
        if offsets.len() < 2 {
            return Self::new(offsets.first().copied().unwrap_or(0));
        }
        let mut core = Self::new(offsets.iter().sum());
        core.inputs = Some(Box::new(Inputs {
            positions: offsets.to_vec(),
            points: Default::default(),
            committed: offsets.to_vec(),
            at: None,
            restored: HashMap::new(),
        }));
        core
    }

    /// How many inputs the partition merges.
    pub(crate) fn input_count(&self) -> usize {
        self.inputs.as_ref().map_or(1, |i| i.positions.len())
    }

    /// Per input, the next offset to fold.
    pub(crate) fn positions(&self) -> Vec<i64> {
        match &self.inputs {
            Some(i) => i.positions.clone(),
            None => vec![self.position],
        }
    }

    /// The per-input offsets a commit of `offset` (a value [`poll_commit`](Self::poll_commit) or
    /// [`committable`](Self::committable) returned) carries, in input order.
    ///
    /// A commit of the position records the positions as the point of that coordinate, so the commit's
    /// landing ([`handle_commit_landed`](Self::handle_commit_landed)) knows what it carried even after
    /// more events were folded meanwhile.
    pub(crate) fn commit_offsets(&mut self, offset: i64) -> Vec<i64> {
        let position = self.position;
        let Some(inputs) = &mut self.inputs else {
            return vec![offset];
        };
        if offset >= position {
            let now = inputs.positions.clone();
            inputs
                .points
                .entry(position)
                .or_insert_with(|| now.clone().into());
            return now;
        }
        // Every committable coordinate below the position is a held change's start, recorded when the
        // hold started (`changed`) and kept until a landed commit passes it: the lookup is exact. Should
        // it ever miss, the last landed commit's offsets go again, which moves nothing.
        debug_assert!(
            inputs.points.contains_key(&offset) || offset == self.committed,
            "no point recorded for committable coordinate {offset}"
        );
        match inputs.points.get(&offset) {
            Some(v) => v.to_vec(),
            None => inputs.committed.clone(),
        }
    }

    /// Timers on stream time, resuming from `restored` (the stream time just before the assigned
    /// offset, from the committed offset's metadata; `None` when it was never committed with one).
    pub(crate) fn stream_timers(mut self, restored: Option<i64>) -> Self {
        self.stream = true;
        self.stream_time = restored.unwrap_or(NO_TIME);
        self
    }

    /// The stream time reached (stream mode), if any event has shown one.
    pub(crate) fn stream_time(&self) -> Option<i64> {
        (self.stream && self.stream_time != NO_TIME).then_some(self.stream_time)
    }

    /// The stream time just before input offset `offset`, for a commit of it: what a replay from there
    /// must start from. `None` outside stream mode or before any timestamp.
    pub(crate) fn stream_time_at(&self, offset: i64) -> Option<i64> {
        if !self.stream {
            return None;
        }
        let at = if offset >= self.position {
            self.stream_time
        } else {
            // Every committable offset below the position is some key's held change, marked when it
            // was folded; the nearest mark below is a lower bound should one be missing.
            self.marks
                .range(..=offset)
                .next_back()
                .map_or(NO_TIME, |(_, st)| *st)
        };
        (at != NO_TIME).then_some(at)
    }

    /// For the unfenced mode: outputs are not held with their keys but handed out at once by
    /// [`take_immediate`](Self::take_immediate), to be produced right away (at least once). A key that
    /// emitted still holds the event's offset until its next write lands, and the driver confirms the
    /// outputs' deliveries before that write and before any commit, so nothing passes an output that
    /// was not acknowledged.
    pub(crate) fn emit_at_once(mut self) -> Self {
        self.at_once = true;
        self
    }

    /// The outputs emitted since the last call (the unfenced mode only; empty otherwise).
    pub(crate) fn take_immediate(&mut self) -> Vec<ProducerRecord> {
        std::mem::take(&mut self.immediate)
    }

    /// Outputs handed out at once were not all acknowledged: they are gone from memory, and only a
    /// replay from the committed offset emits them again. The partition stops, as after a failed write
    /// with outputs ([`needs_replay`](Self::needs_replay)).
    pub(crate) fn handle_outputs_lost(&mut self) {
        self.replay = true;
    }

    /// Restores one recovered snapshot value (an envelope) of `key`: decoded and restored as its
    /// envelope says (one input, or several). Returns whether it was a grave. `Err` says why the
    /// snapshot cannot be read (what the flow reports as a bad snapshot).
    pub(crate) fn restore_envelope<F>(
        &mut self,
        fold: &F,
        key: Bytes,
        value: &[u8],
    ) -> Result<bool, String>
    where
        F: Fold<State = S>,
    {
        let inputs = self.input_count();
        let (last, payload) = match open_envelope(value)? {
            Opened::Live(last_offset, payload) => (vec![last_offset], Some(payload)),
            Opened::Grave(last_offset) => (vec![last_offset], None),
            Opened::LiveInputs(offsets, payload) => (offsets.iter().collect(), Some(payload)),
            Opened::GraveInputs(offsets) => (offsets.iter().collect(), None),
        };
        let last = match last.len() {
            n if n == inputs => last,
            // Written before the flow took more inputs: it accounts for the first input only.
            1 => {
                let mut v = vec![-1; inputs];
                v[0] = last[0];
                v
            }
            n => {
                return Err(format!(
                    "the snapshot accounts for {n} inputs, and this flow has {inputs}: the \
                     inputs' order or number changed"
                ))
            }
        };
        let state = match payload {
            Some(p) => Some(fold.decode(p).map_err(|e| e.to_string())?),
            None => None,
        };
        let grave = state.is_none();
        if inputs == 1 {
            self.restore(fold, key, state, last[0]);
        } else {
            self.restore_inputs(fold, key, state, &last);
        }
        Ok(grave)
    }

    /// Restores one recovered snapshot (its decoded state, or `None` for a grave) folded up to
    /// `last_offset`.
    pub(crate) fn restore<F>(&mut self, fold: &F, key: Bytes, state: Option<S>, last_offset: i64)
    where
        F: Fold<State = S>,
    {
        let deadline = state.as_ref().and_then(|s| fold.deadline(&key, s));
        if let Some(d) = deadline {
            self.timers.insert((d, key.clone()));
        }
        if state.is_none() {
            self.graves.insert(key.clone());
        }
        self.keys.insert(
            key,
            Entry {
                state,
                last_offset,
                held: None,
                in_wave: None,
                deadline,
                size: 0,
            },
        );
    }

    /// Restores one recovered snapshot of a several-input flow: its state (`None` for a grave) and,
    /// per input, the last offset it accounts for.
    pub(crate) fn restore_inputs<F>(&mut self, fold: &F, key: Bytes, state: Option<S>, last: &[i64])
    where
        F: Fold<State = S>,
    {
        let Some(inputs) = self.inputs.as_mut() else {
            return self.restore(fold, key, state, last.first().copied().unwrap_or(-1));
        };
        if !inputs.passed(last) {
            inputs.restored.insert(key.clone(), last.into());
        }
        // On this owner's merge the key's events all lie at or past the assigned coordinate, the ones
        // it already accounts for skipped by `restored`.
        let before_start = self.position - 1;
        self.restore(fold, key, state, before_start);
    }

    /// Folds one event (events of the partition arrive in offset order).
    pub(crate) fn handle_event<F>(&mut self, fold: &F, event: &Record) -> Folded
    where
        F: Fold<State = S>,
    {
        self.handle_event_from(fold, 0, event)
    }

    /// Folds one event of input `input` (in the flow's input order). Events of each input arrive in
    /// offset order, and the inputs' events in the order the merge chose.
    pub(crate) fn handle_event_from<F>(&mut self, fold: &F, input: usize, event: &Record) -> Folded
    where
        F: Fold<State = S>,
    {
        let folded = self.fold_event(fold, input, event);
        if let Some(inputs) = &mut self.inputs {
            inputs.at = None;
        }
        folded
    }

    fn fold_event<F>(&mut self, fold: &F, input: usize, event: &Record) -> Folded
    where
        F: Fold<State = S>,
    {
        if self.replay {
            // Waiting to be acquired again: whatever is folded now would be folded again anyway.
            return Folded::Skipped;
        }
        // Where the event lies: its offset with one input; with several, its coordinate on the merge.
        let at = match &self.inputs {
            None => event.offset,
            Some(inputs) => {
                let Some(p) = inputs.positions.get(input) else {
                    return Folded::Skipped;
                };
                if event.offset < *p {
                    // Merged already: a coordinate computed now would lie past where it was folded.
                    return Folded::Skipped;
                }
                event.offset + (self.position - *p)
            }
        };
        // The stream time before this event: what a replay starting at it resumes from.
        let before = self.stream_time;
        if let Some(inputs) = &mut self.inputs {
            // A hold that starts at this event starts at this vector: the event's input at the event
            // (a replay from there folds it), every other input where it stands.
            inputs.at = Some((input, event.offset));
        }
        if self.stream && event.timestamp >= 0 && event.timestamp > self.stream_time {
            self.stream_time = event.timestamp;
            // Timers due at the new stream time fire before the event that moved it is folded; their
            // changes hold at this event, so a replay from here fires them again at the same point.
            self.fire_due(fold, event.timestamp, at, before);
        }
        let Some(key) = &event.key else {
            self.advance(input, event.offset + 1);
            return Folded::NullKey;
        };
        // An event's key is a view of the fetch it came in: a key kept long (a partition under a
        // memory budget keeps few, for long) holds its own copy, not the whole fetch.
        let owned;
        let key = if self.is_lazy() {
            owned = Bytes::copy_from_slice(key);
            &owned
        } else {
            key
        };
        if !self.ensure_loaded(fold, key) {
            // The key could not be loaded: the partition stopped (see `needs_replay`).
            return Folded::Skipped;
        }
        if let Some(inputs) = &mut self.inputs {
            if let Some(last) = inputs.restored.get(key) {
                if last.get(input).is_some_and(|l| event.offset <= *l) {
                    self.advance(input, event.offset + 1);
                    return Folded::Skipped;
                }
                if inputs.passed(last) {
                    inputs.restored.remove(key);
                }
            }
        }
        self.advance(input, event.offset + 1);
        let change = match self.keys.get_mut(key) {
            Some(e) if at <= e.last_offset => return Folded::Skipped,
            Some(e) => {
                let change = emitting(
                    fold.fold(key, &mut e.state, event, &mut self.scratch),
                    &self.scratch,
                );
                if change != Change::Keep {
                    e.last_offset = at;
                }
                change
            }
            None => {
                let mut state = None;
                let change = emitting(
                    fold.fold(key, &mut state, event, &mut self.scratch),
                    &self.scratch,
                );
                if change == Change::Keep || (state.is_none() && self.scratch.is_empty()) {
                    // Nothing to remember: a key that does not exist and still does not, and said
                    // nothing. (One that emitted is remembered as a grave: its outputs need an
                    // envelope to ride with, and the replay needs its offset to skip the event.)
                    return Folded::Kept;
                }
                self.keys.insert(
                    key.clone(),
                    Entry {
                        state,
                        last_offset: at,
                        held: None,
                        in_wave: None,
                        deadline: None,
                        size: 0,
                    },
                );
                self.came_in(key);
                change
            }
        };
        if change == Change::Keep {
            return Folded::Kept;
        }
        self.changed(fold, key, change, at, before);
        Folded::Changed
    }

    /// Moves input `input`'s position to `next` if that is further.
    fn advance(&mut self, input: usize, next: i64) {
        match &mut self.inputs {
            None => self.position = self.position.max(next),
            Some(inputs) => {
                if let Some(p) = inputs.positions.get_mut(input) {
                    if next > *p {
                        self.position += next - *p;
                        *p = next;
                    }
                }
            }
        }
    }

    /// Moves the position past offsets a fetch skipped (aborted batches, markers, compacted gaps).
    pub(crate) fn handle_read_to(&mut self, next_offset: i64) {
        self.advance(0, next_offset);
    }

    /// [`handle_read_to`](Self::handle_read_to) for input `input`. The merge calls it only once every
    /// event of the input below `next_offset` has been handed to the core.
    pub(crate) fn handle_read_to_from(&mut self, input: usize, next_offset: i64) {
        self.advance(input, next_offset);
    }

    /// Fires every wall-clock timer due at `now`. Returns how many fired. Timers on stream time fire
    /// only as events move it (see [`handle_event`](Self::handle_event)): nothing here.
    pub(crate) fn handle_timeout<F>(&mut self, fold: &F, now: i64) -> usize
    where
        F: Fold<State = S>,
    {
        if self.replay || self.stream {
            // Replay: waiting to be acquired again; the next owner's takeover fires what is due.
            return 0;
        }
        // A timer's effect is not tied to an input offset: it holds the committable offset where the
        // partition stood when it fired.
        let (at, before) = (self.position, self.stream_time);
        self.fire_due(fold, now, at, before)
    }

    /// Fires every timer due at `now`, its changes held at input offset `at` (with `before` the stream
    /// time just before it). Returns how many fired.
    fn fire_due<F>(&mut self, fold: &F, now: i64, at: i64, before: i64) -> usize
    where
        F: Fold<State = S>,
    {
        if !self.load_due(fold, now) {
            return 0;
        }
        let mut fired = 0;
        let mut deferred = Vec::new();
        while let Some((deadline, _)) = self.timers.first() {
            if *deadline > now {
                break;
            }
            let Some((deadline, key)) = self.timers.pop_first() else {
                break;
            };
            let Some(e) = self.keys.get_mut(&key) else {
                continue;
            };
            let behind = self
                .inputs
                .as_ref()
                .and_then(|i| i.restored.get(&key).map(|last| !i.passed(last)))
                .unwrap_or(false);
            if e.last_offset >= at || behind {
                // A replay that has not reached the key's last folded event yet: its recovered state
                // (and deadline) is from further on in the input, where the live run met this timer.
                // It waits until the replay has passed that event.
                deferred.push((deadline, key));
                continue;
            }
            e.deadline = None;
            let Some(state) = e.state.as_mut() else {
                continue;
            };
            fired += 1;
            let change = emitting(
                fold.on_deadline(&key, state, now, &mut self.scratch),
                &self.scratch,
            );
            if change == Change::Keep {
                // The schedule is the state's: re-derive it. A deadline still at or before `now` is
                // dropped until the next change, or it would fire at every tick.
                if let Some(d) = fold.deadline(&key, state).filter(|d| *d > now) {
                    e.deadline = Some(d);
                    self.timers.insert((d, key));
                }
                continue;
            }
            self.changed(fold, &key, change, at, before);
        }
        self.timers.extend(deferred);
        self.evict();
        fired
    }

    /// The earliest wall-clock deadline of any key (when the driver should call
    /// [`handle_timeout`](Self::handle_timeout) next); `None` on stream time, where events fire timers.
    pub(crate) fn poll_timeout(&self) -> Option<i64> {
        if self.stream {
            return None;
        }
        let first = self.timers.first().map(|(d, _)| *d);
        match (first, self.unloaded_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Records `key`'s change, held at input offset `hold_at`, where the stream time just before it was
    /// `before`.
    fn changed<F>(&mut self, fold: &F, key: &Bytes, change: Change, hold_at: i64, before: i64)
    where
        F: Fold<State = S>,
    {
        let Some(e) = self.keys.get_mut(key) else {
            // Every caller found the key first; outputs of a key that is gone have nowhere to ride.
            self.scratch.take();
            return;
        };
        if change == Change::Delete {
            e.state = None;
        }
        if !self.scratch.is_empty() {
            let (mut records, bytes) = self.scratch.take();
            if self.at_once {
                self.immediate.append(&mut records);
            } else {
                self.held_outputs
                    .entry(key.clone())
                    .or_default()
                    .append(&mut records);
                self.held_output_bytes += bytes;
            }
        }
        // A hold that starts here may become the committable offset: mark the stream time before it
        // (only where a hold starts, so the marks stay as few as the held keys).
        let starts = e.held.is_none() || matches!(e.in_wave, Some(None));
        if self.stream && starts {
            self.marks.entry(hold_at).or_insert(before);
        }
        if let Some(inputs) = self.inputs.as_mut().filter(|_| starts) {
            if !inputs.points.contains_key(&hold_at) {
                let point = inputs.hold_point();
                inputs.points.insert(hold_at, point);
            }
        }
        e.held.get_or_insert(hold_at);
        if let Some(next) = &mut e.in_wave {
            next.get_or_insert(hold_at);
        }
        if let Some(d) = e.deadline.take() {
            self.timers.remove(&(d, key.clone()));
        }
        e.deadline = e.state.as_ref().and_then(|s| fold.deadline(key, s));
        if let Some(d) = e.deadline {
            self.timers.insert((d, key.clone()));
        }
        self.graves.remove(key);
        self.dirty.insert(key.clone());
    }

    /// The next wave to write: every dirty key's snapshot or grave, and every tombstone now due, at
    /// most [`WAVE_LIMIT`] of them (the rest go in the next waves: [`waves_owed`](Self::waves_owed)).
    /// `None` when there is nothing to write, a wave is in flight, or the partition was fenced.
    pub(crate) fn poll_wave<F>(&mut self, fold: &F) -> Option<Wave>
    where
        F: Fold<State = S>,
    {
        if self.fenced || self.replay || self.in_flight.is_some() {
            return None;
        }
        let limit = WAVE_LIMIT;
        let mut writes = Vec::with_capacity(self.dirty.len().min(limit));
        let mut carried = Vec::with_capacity(self.dirty.len().min(limit));
        // With several inputs an envelope says where every input stands now: the state accounts for
        // each input's events up to there (those since the key's last change left it as it is).
        let through: Option<Vec<i64>> = self
            .inputs
            .as_ref()
            .map(|i| i.positions.iter().map(|p| p - 1).collect());
        let dirty: Vec<Bytes> = if self.dirty.len() <= limit {
            // Empties the table outright (no tombstones left behind in its control bytes).
            self.dirty.drain().collect()
        } else {
            // Dropping the iterator after `limit` keys leaves the rest in the set.
            self.dirty.extract_if(|_| true).take(limit).collect()
        };
        for key in dirty {
            let due = self.grave_due(&key);
            let Some(e) = self.keys.get_mut(&key) else {
                continue;
            };
            let (value, written) = match (&e.state, &through) {
                (Some(s), None) => (
                    Some(envelope(e.last_offset, &fold.encode(s))),
                    Written::Snapshot,
                ),
                (Some(s), Some(v)) => {
                    (Some(envelope_inputs(v, &fold.encode(s))), Written::Snapshot)
                }
                (None, _) if due => (None, Written::Tombstone),
                (None, None) => (Some(grave(e.last_offset)), Written::Grave),
                (None, Some(v)) => (Some(grave_inputs(v)), Written::Grave),
            };
            e.in_wave = Some(None);
            let size = entry_size(&key, value.as_ref());
            let old = std::mem::replace(&mut e.size, size);
            self.resized(old, size);
            let outputs = self.held_outputs.remove(&key).unwrap_or_default();
            let bytes: usize = outputs.iter().map(output_size).sum();
            self.held_output_bytes = self.held_output_bytes.saturating_sub(bytes);
            carried.push(Carried {
                key: key.clone(),
                written,
                with_outputs: !outputs.is_empty(),
            });
            writes.push(WaveWrite {
                key,
                value,
                outputs,
            });
        }
        let due: Vec<Bytes> = self
            .graves
            .iter()
            .filter(|k| self.grave_due(k))
            .take(limit.saturating_sub(writes.len()))
            .cloned()
            .collect();
        for key in due {
            self.graves.remove(&key);
            if let Some(e) = self.keys.get_mut(&key) {
                e.in_wave = Some(None);
            }
            carried.push(Carried {
                key: key.clone(),
                written: Written::Tombstone,
                with_outputs: false,
            });
            writes.push(WaveWrite {
                key,
                value: None,
                outputs: Vec::new(),
            });
        }
        if writes.is_empty() {
            return None;
        }
        let id = self.next_wave;
        self.next_wave += 1;
        self.in_flight = Some((id, carried));
        self.wave_written(&writes);
        Some(Wave { id, writes })
    }

    /// How many waves writing everything changed now takes (at least one; more when more than
    /// [`WAVE_LIMIT`] keys changed).
    pub(crate) fn waves_owed(&self) -> usize {
        (self.dirty.len() + self.graves.len())
            .div_ceil(WAVE_LIMIT)
            .max(1)
    }

    /// Applies a wave's outcome when every write of it ended the same way (one transaction, or none
    /// ran). An unknown or stale `id` is ignored.
    pub(crate) fn handle_wave_outcome(&mut self, id: u64, landing: Landing) {
        self.handle_wave_landings(id, landing, |_| landing == Landing::Landed);
    }

    /// Applies a wave's outcome write by write: `landed(i)` says whether the `i`-th write of the wave
    /// (in [`Wave::writes`] order) committed for sure, and `landing` is how the wave as a whole ended
    /// (its worst transaction). A write that did not land for sure is written again by the next wave,
    /// unless it carried outputs: those may have committed (an unknown outcome) or not, and neither
    /// sending them again nor dropping them is right, so the partition stops and waits to be acquired
    /// again ([`needs_replay`](Self::needs_replay)); the replay from the committed offset decides. An
    /// unknown or stale `id` is ignored.
    pub(crate) fn handle_wave_landings(
        &mut self,
        id: u64,
        landing: Landing,
        landed: impl Fn(usize) -> bool,
    ) {
        let carried = match self.in_flight.take() {
            Some((current, carried)) if current == id => carried,
            other => {
                self.in_flight = other;
                return;
            }
        };
        if landing == Landing::Fenced {
            self.fenced = true;
        }
        self.wave_landed(&landed);
        for (i, c) in carried.into_iter().enumerate() {
            let Some(e) = self.keys.get_mut(&c.key) else {
                continue;
            };
            let since = e.in_wave.take().flatten();
            if !landed(i) {
                // This write may not have landed: the key stays held (`held` is at or below anything
                // folded since) and is written again, or, with outputs, the partition is replayed.
                if c.with_outputs {
                    self.replay = true;
                }
                self.dirty.insert(c.key);
                continue;
            }
            e.held = since;
            if since.is_some() {
                // Changed again while the write flew: already dirty.
                continue;
            }
            match c.written {
                Written::Snapshot => {}
                Written::Grave => {
                    self.graves.insert(c.key);
                }
                Written::Tombstone => {
                    if let Some(gone) = self.keys.remove(&c.key) {
                        self.resized(gone.size, 0);
                    }
                }
            }
        }
        self.evict();
    }

    /// Whether a write carrying outputs failed or ended unknown: the partition must be dropped and
    /// acquired again (docs/fencing.md, "Outputs"). Nothing more is folded, written or committed.
    pub(crate) fn needs_replay(&self) -> bool {
        self.replay
    }

    /// Bytes of outputs emitted and not yet handed to a wave: when they reach the flow's budget the
    /// partition is persisted early.
    pub(crate) fn held_output_bytes(&self) -> usize {
        self.held_output_bytes
    }

    /// The offset a commit may carry now.
    pub(crate) fn committable(&self) -> i64 {
        self.keys
            .values()
            .filter_map(|e| e.held)
            .fold(self.position, i64::min)
    }

    /// The committable offset when it is past the last landed commit: what a periodic commit has to
    /// send. `None` when the group already has it, so an idle partition commits nothing (each commit
    /// is a transaction with a marker on the snapshot partition and on `__consumer_offsets`).
    pub(crate) fn poll_commit(&self) -> Option<i64> {
        if self.replay {
            return None;
        }
        let offset = self.committable();
        (offset > self.committed).then_some(offset)
    }

    /// A commit of `offset` landed. Graves behind it get their tombstones in the next wave.
    pub(crate) fn handle_commit_landed(&mut self, offset: i64) {
        if let Some(inputs) = &mut self.inputs {
            if offset > self.committed {
                match inputs.points.get(&offset) {
                    Some(v) => inputs.committed = v.to_vec(),
                    // What went out was the last landed commit's offsets again (see
                    // `commit_offsets`): nothing moved.
                    None => return,
                }
            }
        }
        self.committed = self.committed.max(offset);
        if !self.marks.is_empty() {
            self.marks = self.marks.split_off(&self.committed);
        }
        if let Some(inputs) = &mut self.inputs {
            if !inputs.points.is_empty() {
                inputs.points = inputs.points.split_off(&self.committed);
            }
        }
    }

    /// Whether a landed commit is the only thing a due tombstone waits for (the driver then writes once
    /// more at a flush so the tombstones land before the partition is handed on).
    pub(crate) fn tombstones_due(&self) -> bool {
        self.graves.iter().any(|k| self.grave_due(k))
    }

    /// Whether the deleted `key`'s tombstone may be written: the committed offset is past everything
    /// its grave accounts for, on every input (no replay can reach the events it skips any more).
    fn grave_due(&self, key: &Bytes) -> bool {
        let Some(e) = self.keys.get(key) else {
            return false;
        };
        // A recovered grave also waits until every input is committed past what its envelope says.
        let restored = self.inputs.as_ref().and_then(|i| {
            i.restored
                .get(key)
                .map(|last| i.committed.iter().zip(last.iter()).all(|(c, l)| c > l))
        });
        self.committed > e.last_offset && restored.unwrap_or(true)
    }

    /// A fence refused a commit: the partition stops.
    pub(crate) fn handle_fenced(&mut self) {
        self.fenced = true;
    }

    /// Whether a fence stopped the partition.
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The next input offset to fold.
    pub(crate) fn position(&self) -> i64 {
        self.position
    }

    /// The live keys and their states (graves are absent).
    pub(crate) fn states(&self) -> impl Iterator<Item = (&Bytes, &S)> {
        self.keys
            .iter()
            .filter_map(|(k, e)| e.state.as_ref().map(|s| (k, s)))
    }

    /// The state of `key`, if it is live (in memory).
    #[cfg_attr(all(feature = "disk-state", not(test)), allow(dead_code))]
    pub(crate) fn state_of(&self, key: &[u8]) -> Option<&S> {
        self.keys.get(key).and_then(|e| e.state.as_ref())
    }

    /// How many keys (live and graves) the partition remembers.
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        self.keys.len()
    }
}

/// A fold's answer, as the runtime takes it: a `Keep` that emitted is an update, so the key's envelope
/// moves past the event (a replay then skips it, and its outputs) and its offset is held until the
/// outputs commit with the snapshot.
fn emitting(change: Change, out: &Outputs) -> Change {
    if change == Change::Keep && !out.is_empty() {
        Change::Update
    } else {
        change
    }
}

/// Without the on-disk state every key is in memory: nothing to load, evict or overlay.
#[cfg(not(feature = "disk-state"))]
impl<S> PartitionCore<S> {
    #[inline]
    fn ensure_loaded<F: Fold<State = S>>(&mut self, _fold: &F, _key: &Bytes) -> bool {
        true
    }

    #[inline]
    fn is_lazy(&self) -> bool {
        false
    }

    #[inline]
    fn load_due<F: Fold<State = S>>(&mut self, _fold: &F, _now: i64) -> bool {
        true
    }

    #[inline]
    fn unloaded_deadline(&self) -> Option<i64> {
        None
    }

    #[inline]
    fn came_in(&mut self, _key: &Bytes) {}

    #[inline]
    fn resized(&mut self, _old: u32, _new: u32) {}

    #[inline]
    fn evict(&mut self) {}

    /// Whether the partition's changed keys outgrew its memory budget (never, without one).
    #[inline]
    pub(crate) fn wants_persist(&self) -> bool {
        false
    }

    #[inline]
    fn wave_written(&mut self, _writes: &[WaveWrite]) {}

    #[inline]
    fn wave_landed(&mut self, _landed: &impl Fn(usize) -> bool) {}
}

#[path = "fold_core_keys.rs"]
mod keys;
#[cfg(feature = "disk-state")]
#[path = "fold_core_lazy.rs"]
pub(crate) mod lazy;

#[cfg(test)]
#[path = "fold_core_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
mod envelope_tests {
    use super::*;

    /// What `envelope` and `grave` write, `open_snapshot_value` reads back; anything else is a typed
    /// error, never a panic, whatever its length.
    #[test]
    fn the_public_decoder_reads_what_the_runtime_writes_and_refuses_the_rest() {
        let live = envelope(42, b"state");
        assert_eq!(
            open_snapshot_value(&live),
            Ok(SnapshotValue::Live {
                last_offset: 42,
                state: b"state"
            })
        );
        assert_eq!(open_snapshot_value(&live).unwrap().offset(), 42);
        assert_eq!(
            open_snapshot_value(&envelope(-1, b"")),
            Ok(SnapshotValue::Live {
                last_offset: -1,
                state: b""
            })
        );
        assert_eq!(
            open_snapshot_value(&grave(7)),
            Ok(SnapshotValue::Grave { offset: 7 })
        );
        assert_eq!(
            open_snapshot_value(b""),
            Err(ForeignSnapshotValue::Truncated { len: 0 })
        );
        assert_eq!(
            open_snapshot_value(&[1, 0, 0]),
            Err(ForeignSnapshotValue::Truncated { len: 3 })
        );
        assert_eq!(
            open_snapshot_value(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            Err(ForeignSnapshotValue::GraveWithState { len: 10 })
        );
        assert_eq!(
            open_snapshot_value(b"3"),
            Err(ForeignSnapshotValue::UnknownVersion { version: b'3' })
        );
        // Several inputs: an offset per input.
        let several = envelope_inputs(&[4, -1, 9], b"s");
        let opened = open_snapshot_value(&several).unwrap();
        assert!(matches!(
            opened,
            SnapshotValue::LiveInputs { state: b"s", .. }
        ));
        assert_eq!(opened.input_offsets(), [4, -1, 9]);
        assert_eq!((opened.offset(), opened.state()), (4, Some(&b"s"[..])));
        let stored = grave_inputs(&[2, 3]);
        let gone = open_snapshot_value(&stored).unwrap();
        assert!(gone.is_grave() && gone.state().is_none());
        assert_eq!(gone.input_offsets(), [2, 3]);
        assert_eq!(
            open_snapshot_value(&several[..several.len() - 2]),
            Err(ForeignSnapshotValue::Truncated {
                len: several.len() - 2
            })
        );
        assert_eq!(
            open_snapshot_value(&[3, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(ForeignSnapshotValue::TooFewInputs { inputs: 1 })
        );
        let mut with_state = grave_inputs(&[2, 3]).to_vec();
        with_state.push(0);
        assert_eq!(
            open_snapshot_value(&with_state),
            Err(ForeignSnapshotValue::GraveWithState { len: 19 })
        );
        for len in 0..20 {
            for first in [0u8, 1, 2, 3, 4, 5, 255] {
                let mut v = vec![0u8; len];
                if let Some(b) = v.first_mut() {
                    *b = first;
                }
                let _ = open_snapshot_value(&v);
            }
        }
    }
}
