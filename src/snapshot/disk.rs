//! One partition's on-disk image (the `disk-state` feature, issue 36): the committed snapshot of every
//! key, a persisted index of the keys' deadlines, and the checkpoint that says through which
//! snapshot-topic offset the image equals the committed log.
//!
//! # The store
//! Each partition is a fjall database of its own, in its own directory, with three keyspaces:
//! - `snap`: key → the deadline the fold gave the key's state (8 bytes, see [`NO_DEADLINE`]) followed
//!   by the snapshot value exactly as committed in the topic;
//! - `due`: the deadline (8 bytes, ordered) followed by the key → nothing, so the keys due by a time are
//!   one range scan, and a restart need not read every key to find them;
//! - `meta`: the checkpoint's bytes ([`Checkpoint::encode`]).
//!
//! fjall checks a checksum on every block it reads from disk (XXH3-128, before decompressing), and only
//! the blocks a read touches: a bad block is found when it is read, not by scanning the store at open.
//! Any such failure is [`StateError::Corrupt`], and the partition is read whole again.
//!
//! # What the image holds
//! Only committed snapshots, and every change is one atomic batch: the keys, their deadlines and the
//! new checkpoint go together, then the journal is synced. There is no working state on disk: what a
//! fold changed lives in memory until its transaction commits, so opening a store has nothing to
//! discard, and a crash between a batch and its sync leaves the previous batch's image and checkpoint,
//! which agree with each other.

// The flow's on-disk state is being built on this (issue 36); until it is wired in, the tests use it.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use super::checkpoint::Checkpoint;
use super::state::RecoveredState;

/// The deadline stored for a key whose state has none.
pub(crate) const NO_DEADLINE: i64 = i64::MIN;

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
    /// Reading or writing the store failed (a full disk, permissions, a store locked by another
    /// process).
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
/// removal (a tombstone). A value is kept as it is stored ([`Put::value`]), so applying it copies
/// nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Put {
    Value {
        key: Bytes,
        /// The deadline (8 bytes), then the snapshot value.
        stored: Vec<u8>,
    },
    Remove {
        key: Bytes,
    },
}

impl Put {
    /// `key`'s committed snapshot `value`, whose state's deadline is `deadline` ([`NO_DEADLINE`]: none).
    pub(crate) fn value(key: Bytes, value: &[u8], deadline: i64) -> Put {
        let mut stored = Vec::with_capacity(8 + value.len());
        stored.extend_from_slice(&deadline.to_be_bytes());
        stored.extend_from_slice(value);
        Put::Value { key, stored }
    }
}

/// A partition's image, open.
pub(crate) struct PartitionImage {
    dir: PathBuf,
    db: Database,
    snap: Keyspace,
    due: Keyspace,
    meta: Keyspace,
}

impl std::fmt::Debug for PartitionImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionImage")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

const CHECKPOINT_KEY: &[u8] = b"checkpoint";

impl PartitionImage {
    /// Opens (or creates) the image in `dir`, with a block cache of `cache_bytes`.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Self, StateError> {
        let failed = |e: fjall::Error| classify(dir, e);
        std::fs::create_dir_all(dir).map_err(|e| StateError::Io {
            dir: dir.to_path_buf(),
            detail: format!("creating the directory: {e}"),
        })?;
        // One background worker per partition: flushes and compactions of a partition are small and
        // a member may hold hundreds of partitions on a few cores.
        let db = Database::builder(dir)
            .cache_size(cache_bytes)
            .worker_threads(1)
            .max_cached_files(Some(64))
            .open()
            .map_err(failed)?;
        let keyspace = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(failed)
        };
        let (snap, due, meta) = (keyspace("snap")?, keyspace("due")?, keyspace("meta")?);
        Ok(PartitionImage {
            dir: dir.to_path_buf(),
            db,
            snap,
            due,
            meta,
        })
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

    // Lazy loading and the timers of keys not in memory read these (issue 36, next step).
    #[cfg_attr(not(test), allow(dead_code))]
    /// A key's committed snapshot value, `None` when the image has no such key.
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
    /// counts only while the key's stored deadline still equals it; [`due_by`](Self::due_by) and
    /// [`next_deadline`](Self::next_deadline) skip the others and remove them as they pass.
    pub(crate) fn apply(
        &self,
        puts: Vec<Put>,
        checkpoint: Option<&Checkpoint>,
        sync: bool,
    ) -> Result<(), StateError> {
        let mut batch = self.db.batch();
        for put in puts {
            match put {
                Put::Value { key, stored } => {
                    let deadline = self.split(&key, &stored)?.0;
                    if deadline != NO_DEADLINE {
                        batch.insert(&self.due, due_key(deadline, &key), b"");
                    }
                    batch.insert(&self.snap, &key[..], stored);
                }
                Put::Remove { key } => batch.remove(&self.snap, &key[..]),
            }
        }
        if let Some(c) = checkpoint {
            batch.insert(&self.meta, CHECKPOINT_KEY, c.encode());
        }
        batch.commit().map_err(|e| self.failed(e))?;
        if !sync {
            return Ok(());
        }
        self.db
            .persist(PersistMode::SyncData)
            .map_err(|e| self.failed(e))
    }

    // Lazy loading and the timers of keys not in memory read these (issue 36, next step).
    #[cfg_attr(not(test), allow(dead_code))]
    /// The keys whose deadline is at or before `now`, earliest first, at most `limit` of them, with
    /// their deadlines. Index entries a later put superseded are skipped and removed.
    pub(crate) fn due_by(&self, now: i64, limit: usize) -> Result<Vec<(i64, Bytes)>, StateError> {
        let mut out = Vec::new();
        let end = order(now).checked_add(1);
        let range = match end {
            Some(end) => self.due.range(..end.to_be_bytes().to_vec()),
            None => self.due.iter(),
        };
        let mut stale = self.db.batch();
        for guard in range {
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

    // Lazy loading and the timers of keys not in memory read these (issue 36, next step).
    #[cfg_attr(not(test), allow(dead_code))]
    /// The earliest deadline in the index. Index entries a later put superseded are skipped and
    /// removed.
    pub(crate) fn next_deadline(&self) -> Result<Option<i64>, StateError> {
        let mut stale = self.db.batch();
        let mut found = None;
        for guard in self.due.iter() {
            let entry = guard.key().map_err(|e| self.failed(e))?;
            match self.current(&entry)? {
                Some((deadline, _)) => {
                    found = Some(deadline);
                    break;
                }
                None => stale.remove(&self.due, entry),
            }
        }
        stale.commit().map_err(|e| self.failed(e))?;
        Ok(found)
    }

    /// A deadline index entry's deadline and key, when the key's stored deadline still equals it.
    #[cfg_attr(not(test), allow(dead_code))]
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

    /// Writes what the journal holds into table files and waits for it, so a reopen reads tables
    /// (whose blocks carry checksums) instead of replaying the journal.
    pub(crate) fn flush(&self) -> Result<(), StateError> {
        for keyspace in [&self.snap, &self.due, &self.meta] {
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

#[cfg_attr(not(test), allow(dead_code))]
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
        F::Io(_) | F::Poisoned => false,
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
        Put::value(
            Bytes::copy_from_slice(key.as_bytes()),
            v.as_bytes(),
            deadline,
        )
    }

    fn remove(key: &str) -> Put {
        Put::Remove {
            key: Bytes::copy_from_slice(key.as_bytes()),
        }
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
                .due_by(now, limit)
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
        assert_eq!(image.next_deadline().unwrap(), Some(-5));
        image
            .apply(vec![remove("early"), remove("moved")], None, true)
            .unwrap();
        assert_eq!(image.next_deadline().unwrap(), None);
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
