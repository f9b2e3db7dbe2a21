//! The record-batch codec and read_committed visibility on plain bytes: builds a small partition log
//! (a committed transaction, an aborted one, a compressed plain batch), decodes it, and shows what a
//! read_uncommitted and a read_committed reader each get from the same bytes.
//!
//! Run: `cargo run --example codec -- --bootstrap host:port`. It needs no broker: `--bootstrap` is
//! accepted so every example takes the same arguments, and ignored. Nothing is created anywhere.

use bytes::{Bytes, BytesMut};
use snapfence::records::{
    control_batch, decode_batches, visible, AbortedTransaction, BatchBuilder, Compression,
    ControlMarker, IsolationLevel, NewRecord, ProducerStamp, RecordBatch,
};

/// Seals `values` (as `key=value` records) into one batch stored at `offset`.
fn batch(codec: Compression, stamp: ProducerStamp, offset: i64, values: &[&str]) -> Bytes {
    let mut builder = BatchBuilder::new(codec, 1 << 16);
    for (i, kv) in values.iter().enumerate() {
        let (key, value) = kv.split_once('=').expect("key=value");
        let record = NewRecord {
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
            headers: &[],
        };
        assert!(builder.try_append(&record).expect("encodable"));
    }
    builder.seal(stamp).expect("sealable").at_offset(offset)
}

fn txn(producer_id: i64) -> ProducerStamp {
    ProducerStamp {
        producer_id,
        producer_epoch: 0,
        base_sequence: 0,
        transactional: true,
    }
}

fn show(
    label: &str,
    batches: &[RecordBatch],
    aborted: &[AbortedTransaction],
    level: IsolationLevel,
) {
    let seen = visible(batches, aborted, level, 0).expect("decodable");
    let records: Vec<String> = seen
        .iter()
        .map(|r| {
            let text =
                |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
            format!("{}={}", text(r.key()), text(r.value()))
        })
        .collect();
    println!(
        "{label}: {} (next fetch at {})",
        records.join(" "),
        seen.next_offset
    );
}

fn main() {
    let commit = ControlMarker::Commit {
        coordinator_epoch: 0,
    };
    let abort = ControlMarker::Abort {
        coordinator_epoch: 0,
    };
    // Offsets 0-1: producer 7's transaction, committed by the marker at 2. Offsets 3-4: producer 8's
    // transaction, aborted by the marker at 5. Offsets 6-7: a plain (non-transactional) gzip batch.
    let mut log = BytesMut::new();
    log.extend_from_slice(&batch(
        Compression::None,
        txn(7),
        0,
        &["alice=+100", "bob=+50"],
    ));
    log.extend_from_slice(&control_batch(2, 7, 0, commit, 1_700_000_000_100));
    log.extend_from_slice(&batch(
        Compression::None,
        txn(8),
        3,
        &["alice=+999", "mallory=+1"],
    ));
    log.extend_from_slice(&control_batch(5, 8, 0, abort, 1_700_000_000_200));
    log.extend_from_slice(&batch(
        Compression::Gzip,
        ProducerStamp::NONE,
        6,
        &["carol=+20", "bob=-10"],
    ));
    let log = log.freeze();
    println!("log: {} bytes", log.len());

    let batches: Vec<RecordBatch> = decode_batches(log.clone())
        .collect::<Result<_, _>>()
        .expect("every batch decodes and its CRC-32C matches");
    for b in &batches {
        let kind = match b.control().expect("decodable marker") {
            Some(marker) => format!("marker {marker:?}"),
            None => format!("{} record(s), {:?}", b.record_count(), b.compression()),
        };
        let who = if b.is_transactional() {
            "transactional"
        } else {
            "plain"
        };
        println!(
            "batch {}..={}: producer {} {who}, {kind}",
            b.base_offset(),
            b.last_offset(),
            b.producer_id()
        );
    }

    // A read_committed fetch response lists the aborted transactions that overlap it; here, producer
    // 8's, which began at offset 3. The same bytes, filtered by the one visibility function.
    let aborted = [AbortedTransaction {
        producer_id: 8,
        first_offset: 3,
    }];
    show(
        "read_uncommitted",
        &batches,
        &aborted,
        IsolationLevel::ReadUncommitted,
    );
    show(
        "read_committed",
        &batches,
        &aborted,
        IsolationLevel::ReadCommitted,
    );

    // A fetch whose byte budget ends mid-batch is normal: decoding stops cleanly before the partial
    // batch and says where the next fetch starts.
    let mut cut = decode_batches(log.slice(..log.len() - 10));
    let complete = cut.by_ref().filter(Result::is_ok).count();
    println!(
        "cut 10 bytes short: {complete} complete batches, next fetch at {}, {} bytes of a partial batch",
        cut.next_offset().unwrap_or(0),
        cut.remaining()
    );
}
