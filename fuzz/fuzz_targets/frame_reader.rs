//! The frame reader and the response-header decoder on arbitrary byte streams cut into arbitrary read
//! sizes: they yield frames, wait, or return a typed error, never panic, and never reserve more than the
//! frame limit allows. Body and input layout: `snapfence::fuzz_harness::frame_reader`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| snapfence::fuzz_harness::frame_reader(data));
