//! Writes the fuzz seed corpora (`fuzz/seeds/<target>/`): small valid logs built with the encoder, one
//! per codec, and the Java-written logs captured from a real broker (protocol-tests/fixtures/records),
//! laid out the way each target reads its input.
//!
//! Run: `cargo run --example fuzz_seeds` (the files are committed; rerun only when the encoder changes).

use std::fs;
use std::path::Path;

use bytes::BytesMut;
use snapfence::records::{
    control_batch, BatchBuilder, Compression, ControlMarker, NewRecord, ProducerStamp,
};

const CODECS: [(Compression, &str); 5] = [
    (Compression::None, "none"),
    (Compression::Gzip, "gzip"),
    (Compression::Snappy, "snappy"),
    (Compression::Lz4, "lz4"),
    (Compression::Zstd, "zstd"),
];

/// A log of: producer 1's transaction (2 records, `codec`), its ABORT, a plain batch, producer 2's
/// transaction and its COMMIT, then producer 3's open transaction.
fn log(codec: Compression) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut offset = 0i64;
    let data = |out: &mut BytesMut, offset: &mut i64, pid: i64, values: &[&str]| {
        let mut b = BatchBuilder::new(codec, 1 << 16);
        let headers: &[(&str, Option<&[u8]>)] = &[("h", Some(b"x"))];
        for (i, v) in values.iter().enumerate() {
            let rec = NewRecord {
                timestamp: 1_000 + i as i64,
                key: Some(b"key"),
                value: Some(v.as_bytes()),
                headers: if i == 0 { headers } else { &[] },
            };
            assert!(b.try_append(&rec).unwrap());
        }
        let stamp = if pid < 0 {
            ProducerStamp::NONE
        } else {
            ProducerStamp {
                producer_id: pid,
                producer_epoch: 0,
                base_sequence: 0,
                transactional: true,
            }
        };
        out.extend_from_slice(&b.seal(stamp).unwrap().at_offset(*offset));
        *offset += values.len() as i64;
    };
    data(&mut out, &mut offset, 1, &["a", "b"]);
    let abort = ControlMarker::Abort {
        coordinator_epoch: 0,
    };
    out.extend_from_slice(&control_batch(offset, 1, 0, abort, 2_000));
    offset += 1;
    data(&mut out, &mut offset, -1, &["plain"]);
    data(&mut out, &mut offset, 2, &["c"]);
    let commit = ControlMarker::Commit {
        coordinator_epoch: 0,
    };
    out.extend_from_slice(&control_batch(offset, 2, 0, commit, 2_000));
    offset += 1;
    data(&mut out, &mut offset, 3, &["open"]);
    out.to_vec()
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let batch_dir = root.join("batch_decode");
    let fetch_dir = root.join("fetch_response");
    fs::create_dir_all(&batch_dir).unwrap();
    fs::create_dir_all(&fetch_dir).unwrap();
    for (codec, name) in CODECS {
        let log = log(codec);
        // batch_decode: mode (fetch offset 0), two aborted entries (producer 1 at 0, twice), the log.
        let mut input = vec![0u8];
        input.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        input.extend_from_slice(&log);
        fs::write(batch_dir.join(format!("log-{name}.bin")), &input).unwrap();
        // batch_decode codec mode: a compressed record section.
        let mut input = vec![0xf0 | codec.id()];
        input.extend_from_slice(b"a record section, a record section, a record section");
        fs::write(batch_dir.join(format!("codec-{name}.bin")), &input).unwrap();
        // fetch_response: version pick 4 (v13), one partition; aborted descriptor "producer 1 at 0".
        let mut input = vec![4u8];
        input.extend_from_slice(&[1, 1, 1, 1]);
        input.extend_from_slice(&log);
        fs::write(fetch_dir.join(format!("log-{name}.bin")), &input).unwrap();
    }
    // Batches the Java client wrote, captured from a real broker (protocol-tests/tests/records.rs).
    let captured = Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol-tests/fixtures/records");
    for (_, name) in CODECS {
        let Ok(log) = fs::read(captured.join(name).join("read_uncommitted.bin")) else {
            continue;
        };
        let mut input = vec![0u8];
        input.extend_from_slice(&[0; 16]);
        input.extend_from_slice(&log);
        fs::write(batch_dir.join(format!("broker-{name}.bin")), &input).unwrap();
        let mut input = vec![4u8, 1, 1, 1, 1];
        input.extend_from_slice(&log);
        fs::write(fetch_dir.join(format!("broker-{name}.bin")), &input).unwrap();
    }
    println!("seeds written under {}", root.display());
}
