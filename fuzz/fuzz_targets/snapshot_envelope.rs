//! A snapshot topic's stored values, which reach a recovering flow from whoever could write the
//! topic: arbitrary bytes open with a typed error or as an envelope that writes back unchanged. Body:
//! `snapfence::fuzz_harness::snapshot_envelope`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| snapfence::fuzz_harness::snapshot_envelope(data));
