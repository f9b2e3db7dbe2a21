//! The classic consumer protocol's embedded blobs (JoinGroup subscription metadata, SyncGroup
//! assignment), which reach this client from other members through the coordinator: arbitrary bytes
//! give a typed error or a value that round-trips. Body and input layout:
//! `snapfence::fuzz_harness::consumer_protocol`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| snapfence::fuzz_harness::consumer_protocol(data));
