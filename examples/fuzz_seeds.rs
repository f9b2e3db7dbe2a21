//! Writes the fuzz seed corpora (`fuzz/seeds/<target>/`): small valid logs built with the encoder, one
//! per codec, and the Java-written logs captured from a real broker (protocol-tests/fixtures/records),
//! laid out the way each target reads its input.
//!
//! Run: `cargo run --example fuzz_seeds` (the files are committed; rerun only when the encoder changes).

use std::fs;
use std::path::Path;

use bytes::BytesMut;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, HeaderVersion};
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
        let headers: &[(&[u8], Option<&[u8]>)] = &[(b"h", Some(b"x"))];
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
    sealed_batch_seeds(&root.join("sealed_batch"));
    response_seeds(&root.join("responses"));
    println!("seeds written under {}", root.display());
}

/// sealed_batch: `[attributes, record count, last offset delta]` then a batch's records section, for the
/// first (transactional, two-record) batch of each codec's log and for both control markers.
fn sealed_batch_seeds(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let write = |name: String, batch: &[u8]| {
        let len = i32::from_be_bytes(batch[8..12].try_into().unwrap()) as usize;
        let attrs = batch[22] & 0x37;
        let (delta, count) = (batch[26], batch[60]);
        let mut input = vec![attrs, count, delta];
        input.extend_from_slice(&batch[61..12 + len]);
        fs::write(dir.join(name), input).unwrap();
    };
    for (codec, name) in CODECS {
        write(format!("log-{name}.bin"), &log(codec));
    }
    for (marker, name) in [
        (
            ControlMarker::Abort {
                coordinator_epoch: 5,
            },
            "abort",
        ),
        (
            ControlMarker::Commit {
                coordinator_epoch: 5,
            },
            "commit",
        ),
    ] {
        write(
            format!("control-{name}.bin"),
            &control_batch(0, 7, 0, marker, 2_000),
        );
    }
}

/// responses: `[api key, version - lowest client version]` then a response frame (header and a
/// default body) at the lowest and the highest version the client sends, for every decoded response.
fn response_seeds(dir: &Path) {
    fn frame<R: Encodable + HeaderVersion + Default>(version: i16) -> Vec<u8> {
        let mut buf = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(1)
            .encode(&mut buf, R::header_version(version))
            .unwrap();
        R::default().encode(&mut buf, version).unwrap();
        buf.to_vec()
    }
    macro_rules! responses {
        ($($key:literal => $resp:ident),* $(,)?) => {
            [$( ($key, frame::<$resp> as fn(i16) -> Vec<u8>) ),*]
        };
    }
    let all = responses!(
        0 => ProduceResponse, 1 => FetchResponse, 2 => ListOffsetsResponse, 3 => MetadataResponse,
        8 => OffsetCommitResponse, 9 => OffsetFetchResponse, 10 => FindCoordinatorResponse,
        11 => JoinGroupResponse, 12 => HeartbeatResponse, 13 => LeaveGroupResponse,
        14 => SyncGroupResponse, 15 => DescribeGroupsResponse, 17 => SaslHandshakeResponse,
        18 => ApiVersionsResponse,
        19 => CreateTopicsResponse, 20 => DeleteTopicsResponse, 22 => InitProducerIdResponse,
        24 => AddPartitionsToTxnResponse, 25 => AddOffsetsToTxnResponse, 26 => EndTxnResponse,
        27 => WriteTxnMarkersResponse, 28 => TxnOffsetCommitResponse, 32 => DescribeConfigsResponse,
        36 => SaslAuthenticateResponse, 61 => DescribeProducersResponse,
        65 => DescribeTransactionsResponse, 66 => ListTransactionsResponse,
        68 => ConsumerGroupHeartbeatResponse,
    );
    fs::create_dir_all(dir).unwrap();
    for (key, encode) in all {
        let range = snapfence::wire::client_versions(key).unwrap();
        for version in [range.min, range.max] {
            let mut input = vec![key as u8, (version - range.min) as u8];
            input.extend_from_slice(&encode(version));
            fs::write(dir.join(format!("{key}-v{version}.bin")), input).unwrap();
        }
    }
}
