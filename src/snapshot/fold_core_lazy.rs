//! Keys loaded when they are needed, under a memory budget (the on-disk state, issue 36).
//!
//! A lazily loaded partition starts with no key in memory but its graves. A key comes in when an event
//! for it arrives, when its timer falls due, or when a lookup asks (without staying); it is read from
//! the partition's image, through the overlay of this owner's landed writes
//! ([`PartitionImage::lookup`]), and restored exactly as an eager recovery would have restored it.
//! When the keys in memory cost more than the budget, clean ones are dropped, oldest in first; their
//! last landed write is in the overlay, so they come back as they were.
//!
//! A key stays in memory while anything about it lives only there: a change not yet in a landed write
//! (held, dirty or in flight), outputs waiting to ride with it, a grave waiting for its tombstone, a
//! recovered envelope the replay has not passed on some input, or a timer already due (waiting for the
//! replay to pass the key). Timers of keys not in memory come from two indexes on disk: the image's,
//! for keys never loaded, and the one this owner writes as it drops keys with a timer set. Every
//! deadline in them up to the last time timers were fired (the cursor) has been loaded and handled,
//! so a key loaded later has a deadline at or before the cursor dropped, as a key kept in memory would
//! have had it fired or dropped already. A key's deadline is always re-derived from its state when it
//! is loaded; the indexes only say when to load it.
//!
//! A read that fails (a block failing its checksum, an I/O error) or a snapshot that does not decode
//! stops the partition: it is marked for a replay, so nothing more is folded, written or committed, and
//! the failure is handed to the driver ([`PartitionCore::take_load_failure`]). A corrupt image is
//! condemned on disk first, so the next acquisition reads the partition whole.

use std::collections::VecDeque;

use bytes::Bytes;

use super::{entry_size, PartitionCore, WaveWrite, NO_TIME};
use crate::snapshot::disk::{PartitionImage, StateError};
use crate::snapshot::fold::Fold;

/// How many keys the eviction before a load looks at, at most: keys that must stay are put back at the
/// end, so loads while most keys must stay (a large wave in flight) do not rescan them at every load.
/// A landing looks at every key once.
const LOOKS_BEFORE_LOAD: usize = 64;

/// Changed keys a partition over its budget must have before it persists early (fewer would make
/// a transaction for too little room).
const PERSIST_AT_DIRTY: usize = 1024;

/// Why a lazily loaded key could not be used.
#[derive(Debug)]
pub(crate) enum LoadFailure {
    /// The image could not be read.
    State(StateError),
    /// The key's snapshot does not decode.
    BadSnapshot { key: Bytes, reason: String },
}

/// A lazily loaded partition's image and bookkeeping.
pub(crate) struct Lazy {
    image: PartitionImage,
    /// Bytes the keys in memory may cost: [`entry_size`] of each, and the key table's
    /// [`heap_bytes`](super::KeyTable::heap_bytes).
    budget: usize,
    /// What the keys in memory cost now, beside the key table.
    resident: usize,
    /// Keys in memory in the order they came in; dropped from the front.
    order: VecDeque<Bytes>,
    /// The image's deadlines up to here were loaded and handled.
    cursor: i64,
    /// Keys with a deadline at or before this stay in memory: their timers are due (firing now, or
    /// waiting for the replay to pass the key). At or past the cursor.
    due_upto: i64,
    /// The first image deadline past the cursor (the image does not change while it is held).
    next_due: Option<i64>,
    /// The first deadline past the cursor of a key dropped from memory.
    next_evicted_due: Option<i64>,
    /// The keys and values of the wave in flight, in its write order.
    in_flight: Vec<(Bytes, Option<Bytes>)>,
    failure: Option<LoadFailure>,
    stats: LazyStats,
}

/// What a lazily loaded partition did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LazyStats {
    /// Keys read from the image (or the overlay) into memory.
    pub(crate) loaded: u64,
    /// Keys dropped from memory under the budget.
    pub(crate) evicted: u64,
    /// Keys in memory now.
    pub(crate) in_memory: u64,
}

impl<S> PartitionCore<S> {
    /// Makes the partition load its keys from `image` as they are needed, keeping them in memory up to
    /// about `budget` bytes. Restores the image's graves at once (their tombstones are owed).
    pub(crate) fn load_lazily<F>(
        mut self,
        fold: &F,
        image: PartitionImage,
        budget: usize,
    ) -> Result<Self, LoadFailure>
    where
        F: Fold<State = S>,
    {
        let graves = image.graves().map_err(LoadFailure::State)?;
        let next_due = image.next_due_after(NO_TIME).map_err(LoadFailure::State)?;
        self.lazy = Some(Box::new(Lazy {
            image,
            budget,
            resident: 0,
            order: VecDeque::new(),
            cursor: NO_TIME,
            due_upto: NO_TIME,
            next_due,
            next_evicted_due: None,
            in_flight: Vec::new(),
            failure: None,
            stats: LazyStats::default(),
        }));
        for key in graves {
            if !self.ensure_loaded(fold, &key) {
                break;
            }
        }
        match self.take_load_failure() {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }

    /// Whether keys are loaded lazily.
    pub(super) fn is_lazy(&self) -> bool {
        self.lazy.is_some()
    }

    /// The failure that stopped a lazily loaded partition, once.
    pub(crate) fn take_load_failure(&mut self) -> Option<LoadFailure> {
        self.lazy.as_mut().and_then(|l| l.failure.take())
    }

    /// What lazy loading did in this partition (`None`: every key is in memory).
    pub(crate) fn lazy_stats(&self) -> Option<LazyStats> {
        self.lazy.as_ref().map(|l| LazyStats {
            in_memory: self.keys.len() as u64,
            ..l.stats
        })
    }

    /// Brings `key` into memory if it is not there and the image has it. `false` when that failed (the
    /// partition is now stopped).
    pub(super) fn ensure_loaded<F>(&mut self, fold: &F, key: &Bytes) -> bool
    where
        F: Fold<State = S>,
    {
        if self.lazy.is_none() || self.keys.contains_key(key) {
            return true;
        }
        let found = match self.lazy.as_ref().map(|l| l.image.lookup(key)) {
            Some(Ok(found)) => found,
            Some(Err(e)) => return self.load_failed(LoadFailure::State(e)),
            None => return true,
        };
        let Some(value) = found else {
            return true;
        };
        // Room first: the key coming in must not be the one dropped.
        self.evict_some(LOOKS_BEFORE_LOAD);
        if let Err(reason) = self.restore_envelope(fold, key.clone(), &value) {
            return self.load_failed(LoadFailure::BadSnapshot {
                key: key.clone(),
                reason,
            });
        }
        let cursor = self.lazy.as_ref().map_or(NO_TIME, |l| l.cursor);
        if let Some(e) = self.keys.get_mut(key) {
            if let Some(d) = e.deadline.filter(|d| *d <= cursor) {
                // Fired (or dropped) already while the key was out of memory: see the module's note.
                e.deadline = None;
                self.timers.remove(&(d, key.clone()));
            }
            let size = entry_size(key, Some(&value));
            e.size = size;
            self.resized(0, size);
        }
        if let Some(lazy) = self.lazy.as_mut() {
            lazy.stats.loaded += 1;
            lazy.order.push_back(key.clone());
        }
        true
    }

    /// Loads every key whose image deadline lies past the cursor and at or before `now`, then moves
    /// the cursor to `now`. `false` when a load failed.
    pub(super) fn load_due<F>(&mut self, fold: &F, now: i64) -> bool
    where
        F: Fold<State = S>,
    {
        let Some(lazy) = self.lazy.as_mut() else {
            return true;
        };
        if now <= lazy.cursor {
            return true;
        }
        // What this pass loads fires right after it: none of it may be dropped meanwhile.
        lazy.due_upto = lazy.due_upto.max(now);
        let due_by = |next: Option<i64>| next.is_some_and(|d| d <= now);
        if !due_by(lazy.next_due) && !due_by(lazy.next_evicted_due) {
            lazy.cursor = now;
            return true;
        }
        let (image, cursor) = (&lazy.image, lazy.cursor);
        let due = image
            .due_between(cursor, now, usize::MAX)
            .and_then(|mut due| {
                due.extend(image.evicted_due_between(cursor, now, usize::MAX)?);
                Ok(due)
            });
        let mut due = match due {
            Ok(due) => due,
            Err(e) => return self.load_failed(LoadFailure::State(e)),
        };
        due.sort();
        for (_, key) in due {
            if !self.ensure_loaded(fold, &key) {
                return false;
            }
        }
        let Some(lazy) = self.lazy.as_mut() else {
            return true;
        };
        lazy.cursor = now;
        let next = lazy.image.next_due_after(now).and_then(|image| {
            let evicted = lazy.image.evicted_due_between(now, i64::MAX, 1)?;
            Ok((image, evicted.first().map(|(d, _)| *d)))
        });
        match next {
            Ok((image, evicted)) => {
                lazy.next_due = image;
                lazy.next_evicted_due = evicted;
                true
            }
            Err(e) => self.load_failed(LoadFailure::State(e)),
        }
    }

    /// Whether the keys in memory exceed the budget with enough changed keys among them that a wave
    /// would make room: the driver then persists the partition before folding on. Also while a wave
    /// is in flight (a periodic persist): the driver's persist then waits for it, and the fold waits
    /// with it, instead of changing more keys than the budget holds until it lands (a fold of new keys
    /// reached 190 000 keys in memory under a budget that holds 106 000).
    pub(crate) fn wants_persist(&self) -> bool {
        self.lazy.as_ref().is_some_and(|l| {
            self.dirty.len() >= PERSIST_AT_DIRTY && l.resident + self.keys.heap_bytes() > l.budget
        })
    }

    /// The earliest deadline of a key not in memory (or a deadline a key in memory has moved from:
    /// a tick that finds nothing to fire).
    pub(super) fn unloaded_deadline(&self) -> Option<i64> {
        let lazy = self.lazy.as_ref()?;
        match (lazy.next_due, lazy.next_evicted_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A key new to the partition came into memory (its size counts its key until its first write).
    pub(super) fn came_in(&mut self, key: &Bytes) {
        let Some(lazy) = self.lazy.as_mut() else {
            return;
        };
        lazy.order.push_back(key.clone());
        if let Some(e) = self.keys.get_mut(key) {
            e.size = entry_size(key, None);
            lazy.resident += e.size as usize;
        }
    }

    /// A key in memory now costs `new` instead of `old`.
    pub(super) fn resized(&mut self, old: u32, new: u32) {
        if let Some(lazy) = self.lazy.as_mut() {
            lazy.resident = lazy.resident.saturating_sub(old as usize) + new as usize;
        }
    }

    /// Drops clean keys, oldest in first, until the keys in memory fit the budget or every key was
    /// looked at once.
    pub(super) fn evict(&mut self) {
        self.evict_some(usize::MAX);
    }

    /// [`evict`](Self::evict), looking at `looks` keys at most.
    fn evict_some(&mut self, looks: usize) {
        let Some(lazy) = self.lazy.as_mut() else {
            return;
        };
        let mut looks = lazy.order.len().min(looks);
        let mut timers = Vec::new();
        // The table keeps its room when keys leave (their slots are reused), so this holds through.
        let table = self.keys.heap_bytes();
        while lazy.resident + table > lazy.budget && looks > 0 {
            looks -= 1;
            let Some(key) = lazy.order.pop_front() else {
                break;
            };
            let Some(e) = self.keys.get(&key) else {
                // Gone already (its tombstone landed).
                continue;
            };
            let restored = self
                .inputs
                .as_ref()
                .is_some_and(|i| i.restored.contains_key(&key));
            let stays = e.held.is_some()
                || e.in_wave.is_some()
                || e.deadline.is_some_and(|d| d <= lazy.due_upto)
                || e.state.is_none()
                || restored
                || self.dirty.contains(&key)
                || self.held_outputs.contains_key(&key);
            if stays {
                lazy.order.push_back(key);
                continue;
            }
            if let Some(gone) = self.keys.remove(&key) {
                lazy.resident = lazy.resident.saturating_sub(gone.size as usize);
                lazy.stats.evicted += 1;
                if let Some(d) = gone.deadline {
                    self.timers.remove(&(d, key.clone()));
                    lazy.next_evicted_due = Some(lazy.next_evicted_due.map_or(d, |n| n.min(d)));
                    timers.push((d, key));
                }
            }
        }
        if timers.is_empty() {
            return;
        }
        if let Err(e) = lazy.image.put_evicted_deadlines(timers) {
            self.load_failed(LoadFailure::State(e));
        }
    }

    /// A wave was handed out: its keys and values, for the overlay once they land.
    pub(super) fn wave_written(&mut self, writes: &[WaveWrite]) {
        if let Some(lazy) = self.lazy.as_mut() {
            lazy.in_flight = writes
                .iter()
                .map(|w| (w.key.clone(), w.value.clone()))
                .collect();
        }
    }

    /// The writes of the wave in flight for which `landed(i)` holds committed: they go to the overlay,
    /// so a key dropped from memory loads as it is now.
    pub(super) fn wave_landed(&mut self, landed: &impl Fn(usize) -> bool) {
        let Some(lazy) = self.lazy.as_mut() else {
            return;
        };
        let writes = std::mem::take(&mut lazy.in_flight);
        let kept = writes
            .into_iter()
            .enumerate()
            .filter(|(i, _)| landed(*i))
            .map(|(_, w)| w);
        if let Err(e) = lazy.image.put_landed(kept) {
            self.load_failed(LoadFailure::State(e));
        }
    }

    /// Stops the partition on a failure of its image (condemning a corrupt one on disk, so the next
    /// acquisition reads whole). Returns `false`, for the callers to pass on.
    fn load_failed(&mut self, failure: LoadFailure) -> bool {
        self.replay = true;
        if let Some(lazy) = self.lazy.as_mut() {
            if let LoadFailure::State(e) = &failure {
                if e.is_corrupt() {
                    if let Err(again) = lazy.image.condemn(&e.to_string()) {
                        tracing::warn!(error = %again, "a corrupt on-disk state could not be marked as such");
                    }
                }
            }
            lazy.failure.get_or_insert(failure);
        }
        false
    }

    /// The state of `key` if it is live: from memory, or else read from the image without keeping it.
    pub(crate) fn lookup<F>(&self, fold: &F, key: &[u8]) -> Result<Option<S>, LoadFailure>
    where
        F: Fold<State = S>,
        S: Clone,
    {
        if let Some(e) = self.keys.get(key) {
            return Ok(e.state.clone());
        }
        let Some(lazy) = self.lazy.as_ref() else {
            return Ok(None);
        };
        let Some(value) = lazy.image.lookup(key).map_err(LoadFailure::State)? else {
            return Ok(None);
        };
        decode_state(fold, key, &value)
    }

    /// Every live key's state: those in memory, and the image's (under the overlay) for the rest. A
    /// full read of the image.
    pub(crate) fn all_states<F>(
        &self,
        fold: &F,
    ) -> Result<std::collections::HashMap<Bytes, S>, LoadFailure>
    where
        F: Fold<State = S>,
        S: Clone,
    {
        let mut out: std::collections::HashMap<Bytes, S> =
            self.states().map(|(k, s)| (k.clone(), s.clone())).collect();
        let Some(lazy) = self.lazy.as_ref() else {
            return Ok(out);
        };
        for (key, value) in lazy.image.scan_current().map_err(LoadFailure::State)? {
            if self.keys.contains_key(&key) {
                continue;
            }
            if let Some(state) = decode_state(fold, &key, &value)? {
                out.insert(key, state);
            }
        }
        Ok(out)
    }
}

/// The state a snapshot value holds (`None` for a grave).
fn decode_state<F: Fold>(
    fold: &F,
    key: &[u8],
    value: &[u8],
) -> Result<Option<F::State>, LoadFailure> {
    let bad = |reason: String| LoadFailure::BadSnapshot {
        key: Bytes::copy_from_slice(key),
        reason,
    };
    let payload = match super::open_envelope(value).map_err(bad)? {
        super::Opened::Live(_, p) | super::Opened::LiveInputs(_, p) => p,
        super::Opened::Grave(_) | super::Opened::GraveInputs(_) => return Ok(None),
    };
    fold.decode(payload)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}
