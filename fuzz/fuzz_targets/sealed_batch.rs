//! One record batch with a correct CRC around a fuzzer-chosen header and records section, so mutations
//! reach the record decoder, control records and the decompressors instead of stopping at the CRC check
//! (which `batch_decode`'s arbitrary bytes almost never pass). Body and input layout:
//! `snapfence::fuzz_harness::sealed_batch`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| snapfence::fuzz_harness::sealed_batch(data));
