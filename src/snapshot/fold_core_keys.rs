//! The keys a partition holds in memory, each with its bookkeeping: a map from key bytes to `V`.
//!
//! A `HashMap<Bytes, Entry<S>>` stores every entry in its table, and hashbrown keeps a table with
//! spare buckets: at most 7/8 full after growing, and, when keys come and go (a partition under a
//! memory budget loading and dropping them), it grows again once the buckets that held removed keys
//! use up its room while more than half of it is live, so it settles between 2 and 4.5 buckets per
//! key. With a 100-byte state held inline an entry is about 208 bytes, and a partition keeping
//! ~149 000 keys held 2^19 of them (109 MB), 158 MB while the table doubled (heaptrack of the
//! `disk-scale` fold member, issue 36).
//!
//! So the entries live in pages of [`PAGE`] slots that never move once allocated, and the table holds
//! a `u32` slot number per bucket (5 bytes with hashbrown's control byte), hashed with std's SipHash
//! under a random key ([`RandomState`]) like [`RecoveredState`](super::super::RecoveredState): keys may
//! come from users. A removed key's slot goes on a free list and is reused by the next insert, so the
//! pages hold as many slots as the most keys held at once, and growing never copies an entry (a
//! doubling vector would hold two copies while it moves, and leave the old one to the allocator).
//! [`KeyTable::heap_bytes`] reports what the table, the pages and the free list hold, capacity
//! included, so a memory budget can count them.

use std::hash::{BuildHasher, RandomState};

use bytes::Bytes;
use hashbrown::HashTable;

/// Slots per page.
const PAGE: usize = 1024;

/// A map from key bytes to `V`, its entries in stable pages (see the module documentation).
pub(crate) struct KeyTable<V> {
    table: HashTable<u32>,
    pages: Vec<Vec<Option<(Bytes, V)>>>,
    /// Empty slots below the last one used, reused first.
    free: Vec<u32>,
    /// Slots handed out so far (used or on `free`).
    used: usize,
    hasher: RandomState,
}

impl<V> Default for KeyTable<V> {
    fn default() -> Self {
        KeyTable {
            table: HashTable::new(),
            pages: Vec::new(),
            free: Vec::new(),
            used: 0,
            hasher: RandomState::new(),
        }
    }
}

impl<V> KeyTable<V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The number of keys.
    #[cfg_attr(not(feature = "disk-state"), allow(dead_code))] // the lazy partition's
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    fn slot(&self, at: u32) -> Option<&(Bytes, V)> {
        let at = at as usize;
        self.pages.get(at / PAGE)?.get(at % PAGE)?.as_ref()
    }

    fn slot_mut(&mut self, at: u32) -> Option<&mut Option<(Bytes, V)>> {
        let at = at as usize;
        self.pages.get_mut(at / PAGE)?.get_mut(at % PAGE)
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        self.find_hashed(self.hasher.hash_one(key), key)
    }

    fn find_hashed(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let pages = &self.pages;
        self.table
            .find(hash, |at| key_at(pages, *at) == Some(key))
            .copied()
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &[u8]) -> Option<&V> {
        let at = self.find(key)?;
        self.slot(at).map(|(_, v)| v)
    }

    /// The value of `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        let at = self.find(key)?;
        self.slot_mut(at)?.as_mut().map(|(_, v)| v)
    }

    /// Whether `key` is present.
    #[cfg_attr(not(feature = "disk-state"), allow(dead_code))] // the lazy partition's
    pub(crate) fn contains_key(&self, key: &[u8]) -> bool {
        self.find(key).is_some()
    }

    /// Sets `key`'s value; returns the value it replaced.
    pub(crate) fn insert(&mut self, key: Bytes, value: V) -> Option<V> {
        let hash = self.hasher.hash_one(&key[..]);
        if let Some(at) = self.find_hashed(hash, &key) {
            let slot = self.slot_mut(at)?.as_mut()?;
            return Some(std::mem::replace(&mut slot.1, value));
        }
        let at = self.take_slot((key, value));
        let KeyTable {
            table,
            pages,
            hasher,
            ..
        } = self;
        table.insert_unique(hash, at, |at| {
            hasher.hash_one(key_at(pages, *at).unwrap_or_default())
        });
        None
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<V> {
        let hash = self.hasher.hash_one(key);
        let pages = &self.pages;
        let entry = self
            .table
            .find_entry(hash, |at| key_at(pages, *at) == Some(key))
            .ok()?;
        let (at, _) = entry.remove();
        let (_, value) = self.slot_mut(at)?.take()?;
        self.free.push(at);
        Some(value)
    }

    /// Every key and its value, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Bytes, &V)> {
        self.pages
            .iter()
            .flatten()
            .filter_map(|slot| slot.as_ref().map(|(k, v)| (k, v)))
    }

    /// Every value, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Puts `entry` in a free slot, or a new one (in a new page when the last is full).
    fn take_slot(&mut self, entry: (Bytes, V)) -> u32 {
        if let Some(at) = self.free.pop() {
            if let Some(slot) = self.slot_mut(at) {
                *slot = Some(entry);
                return at;
            }
        }
        let at = self.used;
        if at % PAGE == 0 {
            self.pages.push(Vec::with_capacity(PAGE));
        }
        if let Some(page) = self.pages.last_mut() {
            page.push(Some(entry));
        }
        self.used += 1;
        // 2^32 slots would be 2^32 keys held at once, hundreds of GiB: the allocator fails first.
        u32::try_from(at).unwrap_or(u32::MAX)
    }

    /// Bytes this map holds on the heap beyond its keys' and values' own allocations: the table's
    /// buckets (capacity included), the pages and the free list.
    #[cfg_attr(not(feature = "disk-state"), allow(dead_code))] // the lazy partition's
    pub(crate) fn heap_bytes(&self) -> usize {
        // hashbrown keeps a table at most 7/8 full, in a power of two of buckets (or 4 or 8 when tiny),
        // each a u32 and a control byte.
        let capacity = self.table.capacity();
        let buckets = if capacity == 0 {
            0
        } else {
            (capacity * 8 / 7).next_power_of_two()
        };
        buckets * (size_of::<u32>() + 1)
            + self.pages.len() * PAGE * size_of::<Option<(Bytes, V)>>()
            + self.free.capacity() * size_of::<u32>()
    }
}

/// The key in slot `at`.
fn key_at<V>(pages: &[Vec<Option<(Bytes, V)>>], at: u32) -> Option<&[u8]> {
    let at = at as usize;
    pages
        .get(at / PAGE)?
        .get(at % PAGE)?
        .as_ref()
        .map(|(k, _)| &k[..])
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn key(i: u64) -> Bytes {
        Bytes::from(format!("k{i}"))
    }

    #[test]
    fn behaves_like_a_map_under_churn() {
        // A deterministic mix of inserts, overwrites and removes, checked against std's map after
        // every step: slots are reused, and no key reads another's value.
        let mut ours = KeyTable::new();
        let mut theirs = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..40_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(x % 3_000);
            match x % 5 {
                0 | 1 => assert_eq!(ours.insert(k.clone(), step), theirs.insert(k.clone(), step)),
                2 => assert_eq!(ours.remove(&k), theirs.remove(&k)),
                3 => {
                    if let Some(v) = ours.get_mut(&k) {
                        *v += 1;
                    }
                    if let Some(v) = theirs.get_mut(&k) {
                        *v += 1;
                    }
                }
                _ => assert_eq!(ours.get(&k), theirs.get(&k)),
            }
            assert_eq!(ours.len(), theirs.len());
            assert_eq!(ours.contains_key(&k), theirs.contains_key(&k));
        }
        for (k, v) in &theirs {
            assert_eq!(ours.get(k), Some(v));
        }
        let mut listed: Vec<_> = ours.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let mut expected: Vec<_> = theirs.into_iter().collect();
        listed.sort();
        expected.sort();
        assert_eq!(listed, expected);
        // Never more slots than keys held at once (at most 3 000 distinct), in whole pages.
        assert!(
            ours.used <= 3_000,
            "{} slots for at most 3 000 keys",
            ours.used
        );
        assert_eq!(ours.pages.len(), ours.used.div_ceil(PAGE));
    }

    #[test]
    fn removed_slots_are_reused_and_pages_do_not_grow() {
        let mut t = KeyTable::new();
        for i in 0..PAGE as u64 {
            t.insert(key(i), [0u8; 100]);
        }
        let full = t.heap_bytes();
        assert_eq!(t.pages.len(), 1);
        // Drop and load different keys, as eviction under a budget does, many times over.
        for round in 1..20u64 {
            for i in 0..PAGE as u64 {
                t.remove(&key((round - 1) * PAGE as u64 + i));
                t.insert(key(round * PAGE as u64 + i), [round as u8; 100]);
            }
        }
        assert_eq!(t.len(), PAGE);
        assert_eq!(
            t.pages.len(),
            1,
            "a freed slot is reused before a page is added"
        );
        assert_eq!(t.get(&key(19 * PAGE as u64)), Some(&[19u8; 100]));
        assert_eq!(t.get(&key(0)), None);
        // The table may have grown under churn (hashbrown's tombstones), but only by its 5-byte
        // buckets, not by entries.
        let churned = t.heap_bytes();
        assert!(
            churned <= full + 16 * PAGE * 5 + 4 * PAGE,
            "{churned} bytes after churn against {full}"
        );
    }

    #[test]
    fn heap_bytes_counts_the_pages_and_buckets() {
        let mut t = KeyTable::<[u8; 100]>::new();
        assert_eq!(t.heap_bytes(), 0);
        t.insert(key(1), [1; 100]);
        let one = t.heap_bytes();
        assert!(one >= PAGE * 100, "{one}");
        for i in 0..10_000 {
            t.insert(key(i), [2; 100]);
        }
        // 10 pages of 1 024 slots of 136 bytes (a 32-byte key view and the 100-byte value, aligned),
        // and 16 384 buckets of 5 bytes (10 000 keys need more than 8 192 x 7/8).
        let slot = size_of::<Option<(Bytes, [u8; 100])>>();
        assert_eq!(slot, 136);
        assert_eq!(t.heap_bytes(), 10 * PAGE * slot + 16_384 * 5);
    }
}
