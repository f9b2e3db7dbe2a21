//! Byte fixtures captured from a real broker (Kafka 4.4.0), written by the Java client with every codec:
//! committed, aborted (spanning two batches, with another producer's commit and plain records inside it)
//! and still-open transactions. Our decoder and engine must deliver exactly what the Java consumer
//! delivered from the same partition, at both isolation levels, and find the broker's LSO on their own.
//!
//! Captured by `SNAPFENCE_RECORD_FIXTURES=1 cargo test -p protocol-tests --test records`, which runs the
//! same comparison against a live broker (protocol-tests/java/RecordsFixture.java is the Java side).

use bytes::Bytes;

use super::*;

#[path = "java_lines.rs"]
mod java_lines;
use java_lines::render;

struct Fixture {
    codec: Compression,
    read_uncommitted: &'static [u8],
    read_committed: &'static [u8],
    aborted: &'static str,
    fetch: &'static str,
    java_read_committed: &'static str,
    java_read_uncommitted: &'static str,
}

macro_rules! fixture {
    ($codec:expr, $dir:literal) => {
        Fixture {
            codec: $codec,
            read_uncommitted: include_bytes!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/read_uncommitted.bin"
            )),
            read_committed: include_bytes!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/read_committed.bin"
            )),
            aborted: include_str!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/read_committed.aborted"
            )),
            fetch: include_str!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/fetch.txt"
            )),
            java_read_committed: include_str!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/java_read_committed.txt"
            )),
            java_read_uncommitted: include_str!(concat!(
                "../../../protocol-tests/fixtures/records/",
                $dir,
                "/java_read_uncommitted.txt"
            )),
        }
    };
}

fn fixtures() -> [Fixture; 5] {
    [
        fixture!(Compression::None, "none"),
        fixture!(Compression::Gzip, "gzip"),
        fixture!(Compression::Snappy, "snappy"),
        fixture!(Compression::Lz4, "lz4"),
        fixture!(Compression::Zstd, "zstd"),
    ]
}

/// `(end offset, delivered lines)` of a Java consumer dump.
fn java(dump: &str) -> (i64, Vec<String>) {
    let mut lines = dump.lines();
    let end = lines
        .next()
        .and_then(|l| l.strip_prefix("# end "))
        .and_then(|n| n.parse().ok())
        .expect("end offset line");
    (end, lines.map(str::to_owned).collect())
}

fn field(fetch: &str, name: &str) -> i64 {
    fetch
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in fetch.txt"))
}

fn aborted(list: &str) -> Vec<AbortedTransaction> {
    list.lines()
        .map(|l| {
            let (p, f) = l.split_once(' ').unwrap();
            AbortedTransaction {
                producer_id: p.parse().unwrap(),
                first_offset: f.parse().unwrap(),
            }
        })
        .collect()
}

/// The captured Java-written fixtures really use the codec each claims, with snappy-java framing and
/// standard LZ4 frames, and contain transactional data and an abort marker.
#[test]
fn java_written_batches_use_the_codec_asked_for() {
    for f in fixtures() {
        let batches: Vec<RecordBatch> = decode_batches(Bytes::from_static(f.read_uncommitted))
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(batches
            .iter()
            .filter(|b| !b.is_control())
            .all(|b| b.compression() == f.codec));
        assert!(batches.iter().any(|b| b.is_transactional()));
        if f.codec == Compression::Snappy {
            // The Java client frames snappy the snappy-java (xerial) way.
            assert!(batches
                .iter()
                .filter(|b| !b.is_control())
                .all(|b| b.raw_records().starts_with(b"\x82SNAPPY\0")));
        }
        if f.codec == Compression::Lz4 {
            // A standard LZ4 frame (magic 0x184D2204), header checksum and all.
            assert!(batches
                .iter()
                .filter(|b| !b.is_control())
                .all(|b| b.raw_records().starts_with(&[0x04, 0x22, 0x4d, 0x18])));
        }
        assert!(batches
            .iter()
            .any(|b| matches!(b.control(), Ok(Some(ControlMarker::Abort { .. })))));
    }
}

/// On Java-written fetches, read_uncommitted delivers exactly what the Java consumer delivered and ends
/// at the high watermark.
#[test]
fn read_uncommitted_matches_the_java_consumer() {
    for f in fixtures() {
        let v = visible_in(
            Bytes::from_static(f.read_uncommitted),
            &[],
            IsolationLevel::ReadUncommitted,
            0,
        )
        .unwrap();
        let (end, lines) = java(f.java_read_uncommitted);
        assert_eq!(render(&v), lines, "{:?}", f.codec);
        assert_eq!(v.next_offset, end, "{:?}", f.codec);
        assert_eq!(end, field(f.fetch, "high_watermark"));
    }
}

/// On Java-written fetches, read_committed with the broker's aborted list delivers exactly what the Java
/// consumer delivered, and the list is what hides the aborted records.
#[test]
fn read_committed_matches_the_java_consumer() {
    for f in fixtures() {
        let list = aborted(f.aborted);
        assert!(!list.is_empty());
        let v = visible_in(
            Bytes::from_static(f.read_committed),
            &list,
            IsolationLevel::ReadCommitted,
            0,
        )
        .unwrap();
        let (end, lines) = java(f.java_read_committed);
        assert_eq!(render(&v), lines, "{:?}", f.codec);
        assert_eq!(v.next_offset, end, "{:?}", f.codec);
        // Without the broker's aborted list the aborted records would show: the list is doing the work.
        let unfiltered = visible_in(
            Bytes::from_static(f.read_committed),
            &[],
            IsolationLevel::ReadCommitted,
            0,
        )
        .unwrap();
        assert!(unfiltered.len() > v.len());
    }
}

/// LogState computes the broker's last stable offset from the fetched bytes alone, with one open
/// transaction.
#[test]
fn log_state_finds_the_brokers_lso_from_the_bytes_alone() {
    for f in fixtures() {
        let batches: Vec<RecordBatch> = decode_batches(Bytes::from_static(f.read_uncommitted))
            .collect::<Result<_, _>>()
            .unwrap();
        let state = LogState::scan(&batches).unwrap();
        let hw = field(f.fetch, "high_watermark");
        let lso = field(f.fetch, "last_stable_offset");
        assert_eq!(state.last_stable_offset(hw), lso, "{:?}", f.codec);
        assert_eq!(state.open_transactions().len(), 1);
        assert_eq!(java(f.java_read_committed).0, lso);
    }
}
