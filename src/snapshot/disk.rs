//! One partition's on-disk image (the `disk-state` feature, issue 36): the committed snapshot of every
//! key, a persisted index of the keys' deadlines, and the checkpoint that says through which
//! snapshot-topic offset the image equals the committed log.
//!
//! # The store
//! Each partition is a fjall database of its own, in its own directory, with four keyspaces:
//! - `snap`: key → the deadline the fold gave the key's state (8 bytes, see [`NO_DEADLINE`]; a grave
//!   stores [`GRAVE`]) followed by the snapshot value exactly as committed in the topic;
//! - `due`: the deadline (8 bytes, ordered) followed by the key → nothing, so the keys due by a time are
//!   one range scan, and a restart need not read every key to find them (nor the graves);
//! - `meta`: the checkpoint's bytes ([`Checkpoint::encode`]);
//! - `work`: the overlay of this owner's landed writes, cleared at every opening (below).
//!
//! fjall checks a checksum on every block it reads from disk (XXH3-128, before decompressing), and only
//! the blocks a read touches: a bad block is found when it is read, not by scanning the store at open.
//! Any such failure is [`StateError::Corrupt`], and the partition is read whole again.
//!
//! # What the image holds
//! Only snapshots read back, read_committed, from the topic, and every change is one atomic batch: the
//! keys, their deadlines and the new checkpoint go together, then the journal is synced. A crash
//! between a batch and its sync leaves the previous batch's image and checkpoint, which agree with each
//! other.
//!
//! The working state is apart from it. While an owner loads keys lazily under a memory budget, a key
//! it evicts may have changed since the image was read; its last landed write (committed, but past the
//! checkpoint) goes to the `work` overlay, which a lookup reads before the image. The overlay is never
//! the image: it is cleared whenever the store is opened, and what it held is read again from the log,
//! from the checkpoint, where the log (not this member's memory of it) says what committed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use fjall::config::PartitioningPolicy;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use super::checkpoint::Checkpoint;
use super::state::RecoveredState;

/// The deadline stored for a key whose state has none.
pub(crate) const NO_DEADLINE: i64 = i64::MIN;

/// The deadline stored for a grave (a deleted key whose tombstone is not written yet): indexed like a
/// deadline, below every real one, so an owner that loads keys lazily finds the graves it must write
/// tombstones for without reading every key ([`PartitionImage::graves`]).
pub(crate) const GRAVE: i64 = i64::MIN + 1;

/// Deadlines of timers lie above this (a wall clock or an event time in milliseconds).
const FIRST_DEADLINE: i64 = GRAVE + 1;

/// Why the on-disk state failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A block or record of the store failed its checksum or does not decode: the image cannot be
    /// trusted, and the partition is read whole into a fresh store.
    #[error("the on-disk state in {dir} is corrupt: {detail}")]
    Corrupt {
        /// The partition's directory.
        dir: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The store is held by another holder: another process on the same directory, or (for a few
    /// moments) this member's previous holder of the partition, still closing. Never read as
    /// corruption: the image is not discarded.
    #[error("the on-disk state in {dir} is locked by another holder")]
    Locked {
        /// The partition's directory.
        dir: PathBuf,
    },
    /// Reading or writing the store failed (a full disk, permissions).
    #[error("the on-disk state in {dir}: {detail}")]
    Io {
        /// The partition's directory.
        dir: PathBuf,
        /// What failed.
        detail: String,
    },
}

impl StateError {
    /// `true` when the store's content is bad, as opposed to the disk or the process failing.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StateError::Corrupt { .. })
    }
}

/// One change to the image: a key's committed snapshot (with the deadline of its state), or its
/// removal (a tombstone). Key and value are built once, in the store's own slices, and move into its
/// memtable as they are: a key of up to 20 bytes is held inline, a value takes one allocation. (A full
/// read puts millions of them; a copy made here and freed after the write interleaves short-lived
/// blocks with the memtable's, which the allocator then cannot give back.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Put {
    Value {
        key: fjall::Slice,
        /// The deadline (8 bytes), then the snapshot value.
        stored: fjall::Slice,
    },
    Remove {
        key: fjall::Slice,
    },
}

impl Put {
    /// `key`'s committed snapshot `value`, whose state's deadline is `deadline` ([`NO_DEADLINE`]: none).
    pub(crate) fn value(key: &[u8], value: &[u8], deadline: i64) -> Put {
        Put::Value {
            key: fjall::Slice::from(key),
            stored: byteview::ByteView::fused(&deadline.to_be_bytes(), value).into(),
        }
    }

    /// `key`'s removal.
    pub(crate) fn remove(key: &[u8]) -> Put {
        Put::Remove {
            key: fjall::Slice::from(key),
        }
    }
}

/// A keyspace the image writes in bulk, with the bytes it put into the keyspace's active memtable
/// since it last sealed it ([`PartitionImage::seal_full`]).
struct Bounded {
    keyspace: Keyspace,
    /// The memtable's nominal size.
    max: u64,
    filled: AtomicU64,
}

impl std::ops::Deref for Bounded {
    type Target = Keyspace;
    fn deref(&self) -> &Keyspace {
        &self.keyspace
    }
}

/// A partition's image, open.
pub(crate) struct PartitionImage {
    dir: PathBuf,
    db: Database,
    snap: Bounded,
    due: Bounded,
    meta: Keyspace,
    /// This owner's writes that landed since the image was opened, by key (an empty entry: removed).
    /// They are committed, but the image's checkpoint does not cover them, so they are not the image:
    /// the overlay a lazily loaded key is read through first, cleared whenever the store is opened.
    work: Bounded,
    /// The deadlines of keys the owner dropped from memory with a timer set, as `due` holds them (not
    /// checked against any value: the loader re-derives a key's deadline from its state). Cleared with
    /// the overlay.
    work_due: Bounded,
}

impl std::fmt::Debug for PartitionImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionImage")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

const CHECKPOINT_KEY: &[u8] = b"checkpoint";
/// Set when a read found the image corrupt while it was in use: the next opening reads whole.
const CONDEMNED_KEY: &[u8] = b"condemned";

impl PartitionImage {
    /// Opens (or creates) the image in `dir`, with a block cache of `cache_bytes`.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StateError> {
        let failed = |e: fjall::Error| classify(dir, e);
        std::fs::create_dir_all(dir).map_err(|e| StateError::Io {
            dir: dir.to_path_buf(),
            detail: format!("creating the directory: {e}"),
        })?;
        let began = std::time::Instant::now();
        // One background worker per partition: flushes and compactions of a partition are small and
        // a member may hold hundreds of partitions on a few cores.
        let db = Database::builder(dir)
            .cache_size(cache_bytes)
            .worker_threads(1)
            .max_cached_files(Some(64))
            // An opening replays the journals into memtables, and fjall keeps up to 512 MiB of them
            // by default: the smallest it allows bounds what a restart after a crash loads (a member
            // that had folded 10^7 keys peaked at 240 MiB reopening its image).
            .max_journaling_size(64 << 20)
            .open()
            .map_err(failed)?;
        // Memtables are anonymous memory until flushed, and fjall holds up to five per keyspace (the
        // active one and four sealed, after which writes wait for flushes): about 1.3 times their
        // nominal size each in real allocations. Sized so a partition's stay well below a memory
        // budget's scale (fjall's default is 64 MiB each; at 16 MiB, a full read of 10^7 keys held
        // ~105 MB of memtables for `snap` alone, docs/benchmarks.md).
        //
        // Block indexes and filters are partitioned at every level (fjall's default partitions them
        // only from L3, and pins the whole index of every L0 and L1 table in memory): only each
        // table's top-level index is pinned, and a point read takes the one index partition it needs
        // through the block cache. With whole indexes pinned, the memory in use grew ~4.7 bytes per
        // key written (a fold of 10^7 new keys: 50 MiB in use at 3x10^6 keys, 83 MiB at 10^7); with
        // nothing pinned and nothing partitioned it stayed flat, but each cold load read a whole
        // index through the cache (10^5 loads: 3.9 s instead of 0.52). Partitioned, flat and 0.53 s.
        // Fixed when a keyspace is created: an image made before keeps its policies.
        let keyspace = |name: &str, memtable: u64| {
            db.keyspace(name, || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(memtable)
                    .index_block_partitioning_policy(PartitioningPolicy::all(true))
                    .filter_block_partitioning_policy(PartitioningPolicy::all(true))
            })
            .map_err(failed)
        };
        let bounded = |name: &str, max: u64| {
            keyspace(name, max).map(|keyspace| Bounded {
                keyspace,
                max,
                filled: AtomicU64::new(0),
            })
        };
        let (snap, due, meta) = (
            bounded("snap", 4 << 20)?,
            bounded("due", 1 << 20)?,
            keyspace("meta", 1 << 20)?,
        );
        let (work, work_due) = (bounded("work", 2 << 20)?, bounded("work_due", 1 << 20)?);
        let opened = began.elapsed();
        // Whatever a previous owner's overlay held is not the image: the image is what its checkpoint
        // covers, and the read from there brings it up to date.
        work.clear().map_err(failed)?;
        work_due.clear().map_err(failed)?;
        tracing::debug!(
            dir = %dir.display(),
            ?opened,
            cleared = ?(began.elapsed() - opened),
            "image opened"
        );
        Ok(PartitionImage {
            dir: dir.to_path_buf(),
            db,
            snap,
            due,
            meta,
            work,
            work_due,
        })
    }

    /// [`open`](Self::open), waiting up to `wait` while the store is [locked](StateError::Locked): the
    /// previous holder of a partition acquired again in place may still be letting go of it.
    pub(crate) async fn open_when_free(
        dir: &Path,
        cache_bytes: u64,
        wait: std::time::Duration,
    ) -> Result<Self, StateError> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            match Self::open(dir, cache_bytes) {
                Err(StateError::Locked { .. }) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    /// Why the image was condemned while in use ([`condemn`](Self::condemn)), if it was.
    pub(crate) fn condemned(&self) -> Result<Option<String>, StateError> {
        let found = self.meta.get(CONDEMNED_KEY).map_err(|e| self.failed(e))?;
        Ok(found.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Marks the image as not to be trusted (a read failed its checksum while the partition was held),
    /// durably, so that the next opening reads the partition whole instead of resuming.
    pub(crate) fn condemn(&self, why: &str) -> Result<(), StateError> {
        self.meta
            .insert(CONDEMNED_KEY, why.as_bytes())
            .map_err(|e| self.failed(e))?;
        self.db
            .persist(PersistMode::SyncData)
            .map_err(|e| self.failed(e))
    }

    /// Keeps `writes` (key, then its snapshot value or `None` for a tombstone), which committed in this
    /// owner's transactions, in the overlay that [`lookup`](Self::lookup) reads first. Not synced: the
    /// overlay is cleared at the next opening anyway, so nothing needs a wave's writes to land in it
    /// together, and they go in batches of at most a memtable's size: a batch holds its own copy of
    /// every record until it commits, and its memtable is sealed only after it.
    pub(crate) fn put_landed(
        &self,
        writes: impl IntoIterator<Item = (Bytes, Option<Bytes>)>,
    ) -> Result<(), StateError> {
        let mut batch = self.db.batch();
        let mut bytes = 0;
        for (key, value) in writes {
            let value = value.as_deref().unwrap_or_default();
            bytes += key.len() + value.len();
            batch.insert(&self.work, &key[..], value);
            if bytes as u64 >= self.work.max {
                batch.commit().map_err(|e| self.failed(e))?;
                self.seal_full(&self.work, std::mem::take(&mut bytes))?;
                batch = self.db.batch();
            }
        }
        batch.commit().map_err(|e| self.failed(e))?;
        self.seal_full(&self.work, bytes)
    }

    /// Notes the deadlines of keys dropped from memory with a timer set, for
    /// [`evicted_due_between`](Self::evicted_due_between).
    pub(crate) fn put_evicted_deadlines(
        &self,
        timers: impl IntoIterator<Item = (i64, Bytes)>,
    ) -> Result<(), StateError> {
        let mut batch = self.db.batch();
        let mut bytes = 0;
        for (deadline, key) in timers {
            bytes += 8 + key.len();
            batch.insert(&self.work_due, due_key(deadline, &key), b"");
        }
        batch.commit().map_err(|e| self.failed(e))?;
        self.seal_full(&self.work_due, bytes)
    }

    /// Seals `keyspace`'s active memtable once what this image put into it since it last did reaches
    /// the memtable's size. fjall seals it too, but by a message to the store's one worker, which a
    /// compaction keeps busy for seconds at a time while the active memtable grows without a bound:
    /// a full read of 10^7 keys had ~300 MB in use that way (docs/benchmarks.md). Sealed memtables
    /// are bounded: fjall's writes wait while four of a keyspace's are queued for flushing.
    fn seal_full(&self, keyspace: &Bounded, added: usize) -> Result<(), StateError> {
        let added = added as u64;
        if keyspace.filled.fetch_add(added, Ordering::Relaxed) + added < keyspace.max {
            return Ok(());
        }
        keyspace.filled.store(0, Ordering::Relaxed);
        keyspace
            .rotate_memtable()
            .map(drop)
            .map_err(|e| self.failed(e))
    }

    /// The keys dropped from memory with a deadline after `after` and at or before `upto`, at most
    /// `limit`, earliest first (a key may be named more than once, and by deadlines it no longer has).
    pub(crate) fn evicted_due_between(
        &self,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Bytes)>, StateError> {
        let from = after.saturating_add(1).max(FIRST_DEADLINE);
        if from > upto {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for guard in deadlines(&self.work_due, from, upto).take(limit) {
            let entry = guard.key().map_err(|e| self.failed(e))?;
            let Some((deadline, key)) = split_due_key(&entry) else {
                return Err(self.corrupt("an evicted deadline entry shorter than its deadline"));
            };
            out.push((deadline, Bytes::copy_from_slice(key)));
        }
        Ok(out)
    }

    /// A key's snapshot value as it stands now: this owner's landed write when there is one, else the
    /// image's. `None` when the key does not exist.
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        match self.work.get(key).map_err(|e| self.failed(e))? {
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Ok(Some(Bytes::copy_from_slice(&v))),
            None => self.get(key),
        }
    }

    /// Every key with its snapshot value as it stands now (the image under the overlay): a full scan.
    pub(crate) fn scan_current(&self) -> Result<Vec<(Bytes, Bytes)>, StateError> {
        let mut over = std::collections::HashMap::new();
        for guard in self.work.iter() {
            let (key, value) = guard.into_inner().map_err(|e| self.failed(e))?;
            over.insert(Bytes::copy_from_slice(&key), value);
        }
        let mut out = Vec::new();
        for guard in self.snap.iter() {
            let (key, stored) = guard.into_inner().map_err(|e| self.failed(e))?;
            if over.contains_key(&key[..]) {
                continue;
            }
            let (_, value) = self.split(&key, &stored)?;
            out.push((Bytes::copy_from_slice(&key), Bytes::copy_from_slice(value)));
        }
        for (key, value) in over {
            if !value.is_empty() {
                out.push((key, Bytes::copy_from_slice(&value)));
            }
        }
        Ok(out)
    }

    /// The keys the image holds a grave for (their tombstones are due once a commit passes them).
    pub(crate) fn graves(&self) -> Result<Vec<Bytes>, StateError> {
        Ok(self
            .indexed(GRAVE, GRAVE, usize::MAX)?
            .into_iter()
            .map(|(_, k)| k)
            .collect())
    }

    /// The checkpoint, `None` when there is none. One that does not decode is corruption.
    pub(crate) fn checkpoint(&self) -> Result<Option<Checkpoint>, StateError> {
        let Some(bytes) = self.meta.get(CHECKPOINT_KEY).map_err(|e| self.failed(e))? else {
            return Ok(None);
        };
        Checkpoint::decode(&bytes)
            .map(Some)
            .map_err(|e| StateError::Corrupt {
                dir: self.dir.clone(),
                detail: format!("the checkpoint record: {e}"),
            })
    }

    /// A key's committed snapshot value in the image, `None` when the image has no such key.
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StateError> {
        let Some(stored) = self.snap.get(key).map_err(|e| self.failed(e))? else {
            return Ok(None);
        };
        let (_, value) = self.split(key, &stored)?;
        Ok(Some(Bytes::copy_from_slice(value)))
    }

    /// Applies `puts` in order and, when given, moves the checkpoint, as one atomic batch; with `sync`,
    /// then syncs the journal. A key put twice ends as its last put, as in the log.
    ///
    /// Writes only, no reads: a key's old entry in the deadline index is not looked up and removed
    /// here (a point read per record would cost more than the read from the broker). An index entry
    /// counts only while the key's stored deadline still equals it; [`due_between`](Self::due_between) and
    /// [`graves`](Self::graves) skip the others and remove them as they pass.
    pub(crate) fn apply(
        &self,
        puts: Vec<Put>,
        checkpoint: Option<&Checkpoint>,
        sync: bool,
    ) -> Result<(), StateError> {
        let mut batch = self.db.batch();
        let (mut snap_bytes, mut due_bytes) = (0, 0);
        for put in puts {
            match put {
                Put::Value { key, stored } => {
                    let deadline = self.split(&key, &stored)?.0;
                    if deadline != NO_DEADLINE {
                        due_bytes += 8 + key.len();
                        batch.insert(&self.due, due_key(deadline, &key), b"");
                    }
                    snap_bytes += key.len() + stored.len();
                    batch.insert(&self.snap, key, stored);
                }
                Put::Remove { key } => {
                    snap_bytes += key.len();
                    batch.remove(&self.snap, key);
                }
            }
        }
        if let Some(c) = checkpoint {
            batch.insert(&self.meta, CHECKPOINT_KEY, c.encode());
        }
        batch.commit().map_err(|e| self.failed(e))?;
        self.seal_full(&self.snap, snap_bytes)?;
        self.seal_full(&self.due, due_bytes)?;
        if !sync {
            return Ok(());
        }
        self.db
            .persist(PersistMode::SyncData)
            .map_err(|e| self.failed(e))
    }

    /// The keys whose deadline lies after `after` and at or before `upto`, earliest first, at most
    /// `limit` of them, with their deadlines. Index entries a later put superseded are skipped and
    /// removed. Graves are not timers: they are never among them.
    pub(crate) fn due_between(
        &self,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Bytes)>, StateError> {
        let from = after.saturating_add(1).max(FIRST_DEADLINE);
        if from > upto {
            return Ok(Vec::new());
        }
        self.indexed(from, upto, limit)
    }

    /// The earliest deadline after `after` in the index. Index entries a later put superseded are
    /// skipped and removed.
    pub(crate) fn next_due_after(&self, after: i64) -> Result<Option<i64>, StateError> {
        Ok(self
            .due_between(after, i64::MAX, 1)?
            .first()
            .map(|(d, _)| *d))
    }

    /// The index entries from `from` through `upto` that are current, at most `limit`; stale ones met
    /// on the way are removed.
    fn indexed(&self, from: i64, upto: i64, limit: usize) -> Result<Vec<(i64, Bytes)>, StateError> {
        let mut out = Vec::new();
        let mut stale = self.db.batch();
        for guard in deadlines(&self.due, from, upto) {
            if out.len() == limit {
                break;
            }
            let entry = guard.key().map_err(|e| self.failed(e))?;
            match self.current(&entry)? {
                Some((deadline, key)) => out.push((deadline, key)),
                None => stale.remove(&self.due, entry),
            }
        }
        stale.commit().map_err(|e| self.failed(e))?;
        Ok(out)
    }

    /// A deadline index entry's deadline and key, when the key's stored deadline still equals it.
    fn current(&self, entry: &[u8]) -> Result<Option<(i64, Bytes)>, StateError> {
        let Some((deadline, key)) = split_due_key(entry) else {
            return Err(self.corrupt("a deadline index entry shorter than its deadline"));
        };
        let stored = self.snap.get(key).map_err(|e| self.failed(e))?;
        match stored {
            Some(stored) if self.split(key, &stored)?.0 == deadline => {
                Ok(Some((deadline, Bytes::copy_from_slice(key))))
            }
            _ => Ok(None),
        }
    }

    /// Every keyspace of the image: the image's, the checkpoint's and the overlay's.
    fn keyspaces(&self) -> [&Keyspace; 5] {
        [
            &self.snap,
            &self.due,
            &self.meta,
            &self.work,
            &self.work_due,
        ]
    }

    /// Seals every keyspace's memtable for the background worker to write into table files, without
    /// waiting ([`flush`](Self::flush) waits). A memtable written since the last seal would otherwise
    /// keep its journals until enough else is written to fill it.
    pub(crate) fn seal_all(&self) -> Result<(), StateError> {
        for keyspace in self.keyspaces() {
            keyspace.rotate_memtable().map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    /// Writes what the journal holds into table files and waits for it, so a reopen reads tables
    /// (whose blocks carry checksums) instead of replaying the journal. The overlay's keyspaces too:
    /// an unflushed memtable of any keyspace keeps every journal since its first write, and a reopen
    /// replays them all into memory.
    pub(crate) fn flush(&self) -> Result<(), StateError> {
        for keyspace in self.keyspaces() {
            keyspace
                .rotate_memtable_and_wait()
                .map_err(|e| self.failed(e))?;
        }
        Ok(())
    }

    /// Every key with its snapshot value (a full scan), copied once, into the recovered state's arena.
    pub(crate) fn load_all(&self) -> Result<RecoveredState, StateError> {
        let mut out = RecoveredState::new();
        for guard in self.snap.iter() {
            let (key, stored) = guard.into_inner().map_err(|e| self.failed(e))?;
            let (_, value) = self.split(&key, &stored)?;
            out.insert(&key[..], value);
        }
        Ok(out)
    }

    fn split<'a>(&self, key: &[u8], stored: &'a [u8]) -> Result<(i64, &'a [u8]), StateError> {
        match stored.split_first_chunk::<8>() {
            Some((deadline, value)) => Ok((i64::from_be_bytes(*deadline), value)),
            None => Err(self.corrupt(&format!(
                "the entry of key {:?} is {} bytes, shorter than its deadline",
                Bytes::copy_from_slice(key),
                stored.len()
            ))),
        }
    }

    fn failed(&self, e: fjall::Error) -> StateError {
        classify(&self.dir, e)
    }

    fn corrupt(&self, detail: &str) -> StateError {
        StateError::Corrupt {
            dir: self.dir.clone(),
            detail: detail.to_string(),
        }
    }
}

/// Removes a partition's image directory (after it was found corrupt or foreign, before a full read
/// builds a fresh one). The image must be closed (dropped) first.
pub(crate) fn remove_image(dir: &Path) -> Result<(), StateError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StateError::Io {
            dir: dir.to_path_buf(),
            detail: format!("removing the old image: {e}"),
        }),
    }
}

/// The entries of a deadline index (`due`, `work_due`) from deadline `from` through `upto`, in order.
fn deadlines(index: &Keyspace, from: i64, upto: i64) -> fjall::Iter {
    let start = order(from).to_be_bytes().to_vec();
    match order(upto).checked_add(1) {
        Some(end) => index.range(start..end.to_be_bytes().to_vec()),
        None => index.range(start..),
    }
}

/// Sorts deadlines as unsigned big-endian bytes sort: the sign bit flipped.
fn order(deadline: i64) -> u64 {
    (deadline as u64) ^ (1 << 63)
}

fn due_key(deadline: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&order(deadline).to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn split_due_key(stored: &[u8]) -> Option<(i64, &[u8])> {
    let (deadline, key) = stored.split_first_chunk::<8>()?;
    Some(((u64::from_be_bytes(*deadline) ^ (1 << 63)) as i64, key))
}

/// A store error: a checksum or decoding failure is corruption, the rest is I/O.
fn classify(dir: &Path, e: fjall::Error) -> StateError {
    use fjall::Error as F;
    use lsm_tree_error as L;
    let corrupt = match &e {
        F::Storage(inner) => !matches!(inner, L::Io(_)),
        F::Locked => {
            return StateError::Locked {
                dir: dir.to_path_buf(),
            }
        }
        F::Io(_) | F::Poisoned | F::KeyspaceDeleted => false,
        _ => true,
    };
    let dir = dir.to_path_buf();
    let detail = e.to_string();
    if corrupt {
        StateError::Corrupt { dir, detail }
    } else {
        StateError::Io { dir, detail }
    }
}

/// fjall's storage error, under the name its `Error::Storage` variant carries.
use fjall::LsmError as lsm_tree_error;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::checkpoint::Identity;

    fn checkpoint(offset: i64) -> Checkpoint {
        Checkpoint {
            identity: Identity {
                cluster_id: "c".into(),
                topic_id: [7; 16],
                partition: 3,
                partition_count: 8,
                transactional_prefix: "t".into(),
                group: "g".into(),
                state_version: 1,
            },
            offset,
            leader_epoch: 0,
            time_ms: 1_000,
        }
    }

    fn value(key: &str, v: &str, deadline: i64) -> Put {
        Put::value(key.as_bytes(), v.as_bytes(), deadline)
    }

    fn remove(key: &str) -> Put {
        Put::remove(key.as_bytes())
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("snapfence-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn puts_removals_and_the_checkpoint_survive_a_reopen() {
        let dir = scratch("reopen");
        {
            let image = PartitionImage::open(&dir, 1 << 20).unwrap();
            assert_eq!(image.checkpoint().unwrap(), None);
            image
                .apply(
                    vec![
                        value("a", "1", NO_DEADLINE),
                        value("b", "2", 50),
                        remove("a"),
                    ],
                    Some(&checkpoint(10)),
                    true,
                )
                .unwrap();
            image
                .apply(
                    vec![value("c", "3", 20), value("a", "4", NO_DEADLINE)],
                    None,
                    true,
                )
                .unwrap();
        }
        let image = PartitionImage::open(&dir, 1 << 20).unwrap();
        assert_eq!(image.checkpoint().unwrap(), Some(checkpoint(10)));
        assert_eq!(image.get(b"a").unwrap().as_deref(), Some(&b"4"[..]));
        assert_eq!(image.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(image.get(b"zz").unwrap(), None);
        let all = image.load_all().unwrap();
        let mut keys: Vec<&[u8]> = all.iter().map(|(k, _)| k).collect();
        keys.sort();
        assert_eq!(keys, [&b"a"[..], b"b", b"c"]);
        drop(image);
        remove_image(&dir).unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn the_deadline_index_follows_every_change_of_a_key() {
        let dir = scratch("deadlines");
        let image = PartitionImage::open(&dir, 1 << 20).unwrap();
        // Negative deadlines sort before positive ones; a key's deadline moves twice in one batch.
        image
            .apply(
                vec![
                    value("late", "x", 900),
                    value("early", "x", -5),
                    value("moved", "x", 10),
                    value("moved", "y", 700),
                    value("gone", "x", 1),
                ],
                None,
                true,
            )
            .unwrap();
        image
            .apply(
                vec![remove("gone"), value("late", "z", NO_DEADLINE)],
                None,
                true,
            )
            .unwrap();
        let due = |now, limit| -> Vec<(i64, String)> {
            image
                .due_between(i64::MIN, now, limit)
                .unwrap()
                .into_iter()
                .map(|(d, k)| (d, String::from_utf8(k.to_vec()).unwrap()))
                .collect()
        };
        assert_eq!(
            due(i64::MAX, 10),
            [(-5, "early".into()), (700, "moved".into())]
        );
        assert_eq!(due(699, 10), [(-5, "early".to_string())]);
        assert_eq!(due(700, 1), [(-5, "early".to_string())]);
        assert_eq!(image.next_due_after(i64::MIN).unwrap(), Some(-5));
        assert_eq!(image.next_due_after(-5).unwrap(), Some(700));
        assert_eq!(
            image
                .due_between(-5, 700, 10)
                .unwrap()
                .into_iter()
                .map(|(d, _)| d)
                .collect::<Vec<_>>(),
            [700],
            "after is exclusive, upto inclusive"
        );
        image
            .apply(vec![remove("early"), remove("moved")], None, true)
            .unwrap();
        assert_eq!(image.next_due_after(i64::MIN).unwrap(), None);
        drop(image);
        remove_image(&dir).unwrap();
    }

    /// Graves are found through the index without being timers; the overlay of landed writes is read
    /// before the image and is gone after a reopen; a condemned image says so after a reopen.
    #[test]
    fn graves_the_overlay_and_condemnation() {
        let dir = scratch("overlay");
        {
            let image = PartitionImage::open(&dir, 1 << 20).unwrap();
            image
                .apply(
                    vec![
                        value("dead", "grave", GRAVE),
                        value("alive", "v1", 50),
                        value("revived", "grave", GRAVE),
                        value("revived", "v", NO_DEADLINE),
                    ],
                    None,
                    true,
                )
                .unwrap();
            assert_eq!(image.graves().unwrap(), [Bytes::from_static(b"dead")]);
            assert_eq!(image.next_due_after(i64::MIN).unwrap(), Some(50));
            assert!(image.due_between(i64::MIN, 49, 10).unwrap().is_empty());
            image
                .put_landed([
                    (
                        Bytes::from_static(b"alive"),
                        Some(Bytes::from_static(b"v2")),
                    ),
                    (Bytes::from_static(b"revived"), None),
                    (Bytes::from_static(b"new"), Some(Bytes::from_static(b"n"))),
                ])
                .unwrap();
            let get = |k: &str| image.lookup(k.as_bytes()).unwrap();
            assert_eq!(get("alive"), Some(Bytes::from_static(b"v2")));
            assert_eq!(get("revived"), None, "removed by a landed tombstone");
            assert_eq!(get("new"), Some(Bytes::from_static(b"n")));
            assert_eq!(get("dead"), Some(Bytes::from_static(b"grave")));
            let mut all = image.scan_current().unwrap();
            all.sort();
            let keys: Vec<&[u8]> = all.iter().map(|(k, _)| &k[..]).collect();
            assert_eq!(keys, [&b"alive"[..], b"dead", b"new"]);
            assert_eq!(image.condemned().unwrap(), None);
            image.condemn("a bad block").unwrap();
        }
        let image = PartitionImage::open(&dir, 1 << 20).unwrap();
        assert_eq!(
            image.lookup(b"alive").unwrap(),
            Some(Bytes::from_static(b"v1")),
            "the overlay is cleared at opening"
        );
        assert_eq!(image.lookup(b"new").unwrap(), None);
        assert_eq!(image.condemned().unwrap().as_deref(), Some("a bad block"));
        drop(image);
        remove_image(&dir).unwrap();
    }

    /// A flipped byte in a table file is found when its block is read, as a typed error: never a
    /// panic, never a wrong value.
    #[test]
    fn a_flipped_byte_on_disk_is_corruption_when_read() {
        let dir = scratch("flip");
        let keys = 20_000;
        {
            let image = PartitionImage::open(&dir, 1 << 20).unwrap();
            let puts: Vec<Put> = (0..keys)
                .map(|i| {
                    value(
                        &format!("key-{i:06}"),
                        &format!("value-{i:06}-{}", "v".repeat(64)),
                        NO_DEADLINE,
                    )
                })
                .collect();
            image.apply(puts, Some(&checkpoint(keys)), true).unwrap();
            image.snap.rotate_memtable_and_wait().unwrap();
        }
        let tables = table_files(&dir);
        assert!(!tables.is_empty(), "no table file was written");
        let biggest = tables
            .iter()
            .max_by_key(|p| std::fs::metadata(p).unwrap().len())
            .unwrap();
        let mut bytes = std::fs::read(biggest).unwrap();
        // Inside the data blocks: the first third of the file.
        let at = bytes.len() / 6;
        bytes[at] ^= 0x40;
        std::fs::write(biggest, &bytes).unwrap();

        let reads = match PartitionImage::open(&dir, 1 << 20) {
            Err(e) => vec![Err(e)],
            Ok(image) => (0..keys)
                .map(|i| image.get(format!("key-{i:06}").as_bytes()))
                .collect::<Vec<_>>(),
        };
        let mut corrupt = 0;
        for (i, read) in reads.iter().enumerate() {
            match read {
                Err(e) => {
                    assert!(e.is_corrupt(), "{e}");
                    corrupt += 1;
                }
                Ok(v) => {
                    let want = format!("value-{i:06}-{}", "v".repeat(64));
                    assert_eq!(v.as_deref(), Some(want.as_bytes()), "key {i} read wrong");
                }
            }
        }
        assert!(corrupt > 0, "the flipped byte was never noticed");
        remove_image(&dir).unwrap();
    }

    fn table_files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    // Table files of keyspace `snap` live under a `tables` folder.
                    stack.push(path);
                } else if path.parent().is_some_and(|p| p.ends_with("tables")) {
                    out.push(path);
                }
            }
        }
        out
    }
}
