//! Decode throughput on the same bytes: a CRC-32C-only pass (the floor any checked decoder pays), our
//! decoder, our decoder plus the read_committed filter, and kafka-protocol 0.18's `RecordBatchDecoder`.
//!
//! Run: `cargo bench --bench decode` (optionally `-- <runs>`). Method: docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use snapfence::records::{
    control_batch, decode_batches, visible_in, AbortedTransaction, BatchBuilder, Compression,
    ControlMarker, IsolationLevel, NewRecord, ProducerStamp, Record, Visible,
};

const LOG_BYTES: usize = 64 << 20;
/// The Java producer's default `batch.size`.
const BATCH_BYTES: usize = 16 * 1024;
const PRODUCERS: i64 = 4;
const BATCHES_PER_TXN: usize = 4;
/// One transaction in this many is aborted.
const ABORT_EVERY: usize = 20;

struct Fixture {
    bytes: Bytes,
    aborted: Vec<AbortedTransaction>,
    /// The ABORT marker offset of each entry of `aborted`.
    aborted_ends: Vec<i64>,
    records: usize,
    committed_records: usize,
}

/// 64 MiB of a partition log: producers take turns writing transactions of a few full batches each,
/// ended by the coordinator's marker; one transaction in twenty is aborted.
fn fixture(value_len: usize) -> Fixture {
    let value: Vec<u8> = (0..value_len).map(|i| (i * 31 % 251) as u8).collect();
    let mut out = BytesMut::with_capacity(LOG_BYTES + BATCH_BYTES);
    let mut offset = 0i64;
    let mut aborted = vec![];
    let mut aborted_ends = vec![];
    let (mut records, mut committed_records) = (0, 0);
    let mut txn = 0usize;
    while out.len() < LOG_BYTES {
        let producer_id = 1000 + (txn as i64 % PRODUCERS);
        let abort = txn % ABORT_EVERY == ABORT_EVERY - 1;
        let first = offset;
        let mut in_txn = 0;
        for _ in 0..BATCHES_PER_TXN {
            let mut b = BatchBuilder::new(Compression::None, BATCH_BYTES);
            loop {
                let key = format!("key-{:012}", offset + b.record_count() as i64);
                let rec = NewRecord {
                    timestamp: 1_700_000_000_000 + offset,
                    key: Some(key.as_bytes()),
                    value: Some(&value),
                    headers: &[],
                };
                if !b.try_append(&rec).unwrap() {
                    break;
                }
            }
            let n = b.record_count();
            let sealed = b
                .seal(ProducerStamp {
                    producer_id,
                    producer_epoch: 0,
                    base_sequence: 0,
                    transactional: true,
                })
                .unwrap();
            out.extend_from_slice(&sealed.at_offset(offset));
            offset += n as i64;
            in_txn += n;
        }
        let marker = if abort {
            aborted.push(AbortedTransaction {
                producer_id,
                first_offset: first,
            });
            aborted_ends.push(offset);
            ControlMarker::Abort {
                coordinator_epoch: 0,
            }
        } else {
            committed_records += in_txn;
            ControlMarker::Commit {
                coordinator_epoch: 0,
            }
        };
        out.extend_from_slice(&control_batch(offset, producer_id, 0, marker, 0));
        offset += 1;
        records += in_txn;
        txn += 1;
    }
    Fixture {
        bytes: out.freeze(),
        aborted,
        aborted_ends,
        records,
        committed_records,
    }
}

/// Walks the batches and checks each CRC: what every checked decoder must at least do.
fn crc_only(bytes: &[u8]) -> usize {
    let mut at = 0;
    let mut ok = 0;
    while at + 12 <= bytes.len() {
        let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let batch = &bytes[at..at + 12 + len];
        let stored = u32::from_be_bytes(batch[17..21].try_into().unwrap());
        ok += usize::from(crc32c::crc32c(&batch[21..]) == stored);
        at += 12 + len;
    }
    ok
}

/// Our decoder alone: every data record of every batch (read_uncommitted only drops the markers).
fn ours_decode(f: &Fixture) -> Visible {
    visible_in(f.bytes.clone(), &[], IsolationLevel::ReadUncommitted, 0).unwrap()
}

fn ours_read_committed(f: &Fixture) -> Visible {
    visible_in(
        f.bytes.clone(),
        &f.aborted,
        IsolationLevel::ReadCommitted,
        0,
    )
    .unwrap()
}

/// What a consumer does next: look at every key and value.
fn ours_read_committed_and_read(f: &Fixture) -> usize {
    let v = ours_read_committed(f);
    v.iter()
        .map(|r| r.key().map_or(0, <[u8]>::len) + r.value().map_or(0, <[u8]>::len))
        .sum()
}

/// The same, taking owned records (zero-copy `Bytes` slices) as kafka-protocol hands out.
fn ours_read_committed_owned(f: &Fixture) -> Vec<Record> {
    ours_read_committed(f).into_records()
}

fn peer_decode(bytes: &Bytes) -> usize {
    let mut buf = bytes.clone();
    let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut buf).unwrap();
    sets.iter().map(|s| s.records.len()).sum()
}

/// One fetch's worth of the log: what the broker returns for a fetch at `offset`.
struct Fetch {
    bytes: Bytes,
    offset: i64,
    aborted: Vec<AbortedTransaction>,
}

/// Splits the log at batch boundaries into fetches of at most `max` bytes (the consumer's
/// `max.partition.fetch.bytes`), each with the aborted transactions the broker would list for it.
fn fetches(f: &Fixture, max: usize) -> Vec<Fetch> {
    let mut out = vec![];
    let mut start = 0;
    let mut at = 0;
    let mut first_offset = 0;
    let mut next_offset = 0;
    let b = &f.bytes;
    let mut flush = |start: usize, end: usize, first: i64, next: i64| {
        let aborted = f
            .aborted
            .iter()
            .zip(&f.aborted_ends)
            .filter(|(t, &end)| end >= first && t.first_offset < next)
            .map(|(t, _)| *t)
            .collect();
        out.push(Fetch {
            bytes: b.slice(start..end),
            offset: first,
            aborted,
        });
    };
    while at < b.len() {
        let len = 12 + i32::from_be_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
        if at + len - start > max && at > start {
            flush(start, at, first_offset, next_offset);
            start = at;
            first_offset = next_offset;
        }
        let base = i64::from_be_bytes(b[at..at + 8].try_into().unwrap());
        let delta = i32::from_be_bytes(b[at + 23..at + 27].try_into().unwrap());
        next_offset = base + i64::from(delta) + 1;
        at += len;
    }
    flush(start, at, first_offset, next_offset);
    out
}

type Pass<'a> = (&'static str, Box<dyn FnMut() -> usize + 'a>);

/// Runs every pass once to warm up, then `runs` rounds of all passes in turn, so load from elsewhere on
/// the machine hits every pass alike. Returns (min, median) thread CPU time per pass; each run includes
/// dropping its output.
fn measure(runs: usize, passes: &mut [Pass<'_>]) -> Vec<(Duration, Duration)> {
    for (_, f) in passes.iter_mut() {
        black_box(f());
    }
    let mut times = vec![Vec::with_capacity(runs); passes.len()];
    for _ in 0..runs {
        for (i, (_, f)) in passes.iter_mut().enumerate() {
            let start = cpu_time();
            black_box(f());
            times[i].push(cpu_time() - start);
        }
    }
    times
        .into_iter()
        .map(|mut t| {
            t.sort();
            (t[0], t[t.len() / 2])
        })
        .collect()
}

/// The calling thread's CPU time: unlike wall time, it does not count the time the thread spends
/// descheduled, which on a shared machine is most of the noise.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn report(title: &str, n: usize, names: &[&str], results: &[(Duration, Duration)]) {
    println!("\n{title}");
    println!(
        "| {:<36} | {:>8} | {:>8} | {:>7} | {:>7} | {:>10} |",
        "pass", "min ms", "MB/s", "vs CRC", "vs peer", "median ms"
    );
    println!(
        "|{:-<38}|{:-<10}|{:-<10}|{:-<9}|{:-<9}|{:-<12}|",
        "", "", "", "", "", ""
    );
    let crc = results[0].0.as_secs_f64();
    let peer = results[results.len() - 1].0.as_secs_f64();
    for (name, (min, med)) in names.iter().zip(results) {
        let t = min.as_secs_f64();
        println!(
            "| {:<36} | {:>8.2} | {:>8.0} | {:>6.2}x | {:>6.2}x | {:>10.2} |",
            name,
            t * 1e3,
            mbps(n, *min),
            crc / t,
            peer / t,
            med.as_secs_f64() * 1e3
        );
    }
}

fn main() {
    let runs = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(15);
    println!(
        "decode benchmark: {} MiB per case, {runs} interleaved runs after one warm-up, thread CPU time; MB/s = 1e6 bytes/s of input",
        LOG_BYTES >> 20
    );
    let names = [
        "CRC-32C only",
        "snapfence decode",
        "snapfence decode + read_committed",
        "  ... + read every key and value",
        "  ... + into owned Records",
        "kafka-protocol 0.18 decode_all",
    ];
    for value_len in [1024, 100] {
        let f = fixture(value_len);
        let n = f.bytes.len();
        assert_eq!(ours_decode(&f).len(), f.records);
        assert_eq!(ours_read_committed(&f).len(), f.committed_records);
        assert_eq!(peer_decode(&f.bytes), f.records + txn_markers(&f));
        println!(
            "\n== {value_len} B values: {} records, {} batches of <= {} KiB, {:.0}% in aborted transactions",
            f.records,
            decode_batches(f.bytes.clone()).count(),
            BATCH_BYTES >> 10,
            100.0 * (f.records - f.committed_records) as f64 / f.records as f64
        );
        let mut passes: Vec<Pass<'_>> = vec![
            ("crc", Box::new(|| crc_only(&f.bytes))),
            ("dec", Box::new(|| ours_decode(&f).len())),
            ("rc", Box::new(|| ours_read_committed(&f).len())),
            ("read", Box::new(|| ours_read_committed_and_read(&f))),
            ("owned", Box::new(|| ours_read_committed_owned(&f).len())),
            ("peer", Box::new(|| peer_decode(&f.bytes))),
        ];
        let r = measure(runs, &mut passes);
        report("one call over the whole 64 MiB:", n, &names, &r);

        let fs = fetches(&f, 1 << 20);
        let total: usize = fs
            .iter()
            .map(|x| {
                visible_in(
                    x.bytes.clone(),
                    &x.aborted,
                    IsolationLevel::ReadCommitted,
                    x.offset,
                )
                .unwrap()
                .len()
            })
            .sum();
        assert_eq!(
            total, f.committed_records,
            "per-fetch aborted lists are right"
        );
        let rc_fetch = |x: &Fetch| {
            visible_in(
                x.bytes.clone(),
                &x.aborted,
                IsolationLevel::ReadCommitted,
                x.offset,
            )
            .unwrap()
        };
        let mut passes: Vec<Pass<'_>> = vec![
            (
                "crc",
                Box::new(|| fs.iter().map(|x| crc_only(&x.bytes)).sum()),
            ),
            (
                "dec",
                Box::new(|| {
                    fs.iter()
                        .map(|x| {
                            visible_in(
                                x.bytes.clone(),
                                &[],
                                IsolationLevel::ReadUncommitted,
                                x.offset,
                            )
                            .unwrap()
                            .len()
                        })
                        .sum()
                }),
            ),
            (
                "rc",
                Box::new(|| fs.iter().map(|x| rc_fetch(x).len()).sum()),
            ),
            (
                "read",
                Box::new(|| {
                    fs.iter()
                        .map(|x| {
                            rc_fetch(x)
                                .iter()
                                .map(|r| {
                                    r.key().map_or(0, <[u8]>::len)
                                        + r.value().map_or(0, <[u8]>::len)
                                })
                                .sum::<usize>()
                        })
                        .sum()
                }),
            ),
            (
                "owned",
                Box::new(|| fs.iter().map(|x| rc_fetch(x).into_records().len()).sum()),
            ),
            (
                "peer",
                Box::new(|| fs.iter().map(|x| peer_decode(&x.bytes)).sum()),
            ),
        ];
        // `BENCH_PROFILE=<value length>:<pass>` loops one per-fetch pass, for perf.
        if let Ok(p) = std::env::var("BENCH_PROFILE") {
            if let Some((len, name)) = p.split_once(':') {
                if len.parse() == Ok(value_len) {
                    let (_, f) = passes.iter_mut().find(|(n, _)| *n == name).unwrap();
                    for _ in 0..200 {
                        black_box(f());
                    }
                    return;
                }
            }
            continue;
        }
        let r = measure(runs, &mut passes);
        report(
            &format!(
                "{} fetches of <= 1 MiB (max.partition.fetch.bytes), one call each:",
                fs.len()
            ),
            n,
            &names,
            &r,
        );
    }
}

/// Control batches in the fixture: one marker per transaction; kafka-protocol returns them as records.
fn txn_markers(f: &Fixture) -> usize {
    decode_batches(f.bytes.clone())
        .filter(|b| b.as_ref().unwrap().is_control())
        .count()
}
