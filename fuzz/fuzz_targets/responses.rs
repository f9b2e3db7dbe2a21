//! Every response the client decodes, from arbitrary bytes: header and body through the same decode
//! path the connection uses, at every version the client may send.
//!
//! Body and input layout: `snapfence::fuzz_harness::responses` (API key, version pick, then the
//! response frame without its size prefix, as the frame reader hands it over).
//!
//! Besides "no panic", the target measures the peak heap growth during the decode with a counting
//! allocator and asserts it stays within a constant times the frame length: this is the property the
//! patched kafka-protocol (vendor/kafka-protocol) restores, where 0.18.0 allocated from unchecked counts.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use libfuzzer_sys::fuzz_target;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            let live = LIVE.fetch_add(new_size, Relaxed) + new_size;
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap a decode may use per frame byte, plus a fixed allowance. Decoded structs are larger than their
/// wire form (a one-byte compact-array element becomes a struct of a hundred-odd bytes, and vectors grow
/// by doubling), so the factor is generous; what it rules out is allocation from an unchecked count,
/// which is unrelated to the frame length (gigabytes from eight bytes).
const BYTES_PER_FRAME_BYTE: usize = 1024;
const FIXED_ALLOWANCE: usize = 256 * 1024;

fuzz_target!(|data: &[u8]| {
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let Some((len, decoded)) = snapfence::fuzz_harness::responses(data) else {
        return;
    };
    let grew = PEAK.load(Relaxed).saturating_sub(before);
    assert!(
        grew <= BYTES_PER_FRAME_BYTE * len + FIXED_ALLOWANCE,
        "{grew} heap bytes for a {len}-byte frame (decoded: {decoded}); input {:02x?}",
        &data[..data.len().min(2)]
    );
});
