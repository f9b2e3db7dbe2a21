//! Property tests: the visibility engine and LogState against a reference model of interleaved
//! transactions, encoder/decoder round trips for every codec, and no panic on mutated bytes.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    /// A data batch; `producer` None is a plain producer, otherwise a transactional one.
    Data {
        producer: Option<u8>,
        records: u8,
        codec: u8,
    },
    /// The coordinator's marker for `producer` (possibly with no transaction open: a duplicate, or a
    /// transaction that wrote nothing to this partition).
    End { producer: u8, commit: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (proptest::option::weighted(0.8, 0u8..4), 1u8..4, 0u8..5)
            .prop_map(|(producer, records, codec)| Op::Data { producer, records, codec }),
        1 => (0u8..4, any::<bool>()).prop_map(|(producer, commit)| Op::End { producer, commit }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Open,
    Committed,
    Aborted,
}

/// The log as the reference model sees it: every data record with the transaction it belongs to.
struct Model {
    log: Log,
    /// offset -> (value, transaction index or None for non-transactional)
    records: BTreeMap<i64, (String, Option<usize>)>,
    fates: Vec<Fate>,
    /// The broker's aborted-transaction index: (producer id, first offset, marker offset).
    aborted_index: Vec<(i64, i64, i64)>,
    /// producer id -> (transaction index, first offset) while open.
    open: BTreeMap<i64, (usize, i64)>,
}

fn pid(p: u8) -> i64 {
    1000 + i64::from(p)
}

impl Model {
    fn build(ops: &[Op]) -> Model {
        let mut m = Model {
            log: Log::new(),
            records: BTreeMap::new(),
            fates: vec![],
            aborted_index: vec![],
            open: BTreeMap::new(),
        };
        for op in ops {
            match *op {
                Op::Data {
                    producer,
                    records,
                    codec,
                } => {
                    let base = m.log.end;
                    let values: Vec<String> = (0..records)
                        .map(|i| format!("v{}", base + i64::from(i)))
                        .collect();
                    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
                    let codec = ALL_CODECS[codec as usize];
                    let txn = producer.map(|p| {
                        let next = m.fates.len();
                        let (t, _) = *m.open.entry(pid(p)).or_insert((next, base));
                        if t == next {
                            m.fates.push(Fate::Open);
                        }
                        t
                    });
                    m.log.data(producer.map(|p| (pid(p), true)), codec, &refs);
                    for (i, v) in values.into_iter().enumerate() {
                        m.records.insert(base + i as i64, (v, txn));
                    }
                }
                Op::End { producer, commit } => {
                    let at = m.log.marker(pid(producer), commit);
                    if let Some((t, first)) = m.open.remove(&pid(producer)) {
                        m.fates[t] = if commit {
                            Fate::Committed
                        } else {
                            m.aborted_index.push((pid(producer), first, at));
                            Fate::Aborted
                        };
                    }
                }
            }
        }
        m
    }

    fn high_watermark(&self) -> i64 {
        self.log.end
    }

    fn lso(&self) -> i64 {
        self.open
            .values()
            .map(|&(_, first)| first)
            .min()
            .unwrap_or(self.high_watermark())
    }

    /// What the broker returns for a fetch at `fetch_offset`: the whole batches overlapping
    /// `fetch_offset..bound`, and the aborted transactions overlapping that range.
    fn fetch(&self, fetch_offset: i64, bound: i64) -> (Vec<RecordBatch>, Vec<AbortedTransaction>) {
        if fetch_offset >= bound {
            return (vec![], vec![]);
        }
        let batches = self
            .log
            .batches()
            .into_iter()
            .filter(|b| b.last_offset() >= fetch_offset && b.base_offset() < bound)
            .collect();
        let aborted = self
            .aborted_index
            .iter()
            .filter(|&&(_, first, last)| last >= fetch_offset && first < bound)
            .map(|&(producer_id, first_offset, _)| AbortedTransaction {
                producer_id,
                first_offset,
            })
            .collect();
        (batches, aborted)
    }

    fn expected(&self, fetch_offset: i64, bound: i64, committed_only: bool) -> Vec<(i64, String)> {
        self.records
            .range(fetch_offset..bound.max(fetch_offset))
            .filter(|(_, (_, txn))| {
                !committed_only || txn.is_none_or(|t| self.fates[t] == Fate::Committed)
            })
            .map(|(&o, (v, _))| (o, v.clone()))
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The engine delivers exactly the reference model's records at both isolation levels, from any fetch
    /// offset, with the broker's aborted list in any order; LogState finds the model's open transactions
    /// and LSO.
    #[test]
    fn engine_matches_the_reference_model(
        ops in proptest::collection::vec(op(), 0..30),
        fetch_pick in any::<u16>(),
        rotate in any::<u8>(),
    ) {
        let m = Model::build(&ops);
        let hw = m.high_watermark();
        let lso = m.lso();
        let fetch_offset = i64::from(fetch_pick) % (hw + 1);

        let state = LogState::scan(&m.log.batches()).unwrap();
        prop_assert_eq!(state.last_stable_offset(hw), lso);
        let mut open: Vec<OpenTransaction> = m
            .open
            .iter()
            .map(|(&producer_id, &(_, first_offset))| OpenTransaction { first_offset, producer_id })
            .collect();
        open.sort();
        prop_assert_eq!(state.open_transactions(), open);

        let (batches, _) = m.fetch(fetch_offset, hw);
        let v = visible(&batches, &[], IsolationLevel::ReadUncommitted, fetch_offset).unwrap();
        prop_assert_eq!(offsets_values(&v), m.expected(fetch_offset, hw, false));
        prop_assert_eq!(v.next_offset, hw.max(fetch_offset));
        // The streaming entry point agrees with the slice one (a fetch may begin below the fetch offset).
        let streamed =
            visible_in(m.log.bytes(), &[], IsolationLevel::ReadUncommitted, fetch_offset).unwrap();
        prop_assert_eq!(offsets_values(&streamed), m.expected(fetch_offset, hw, false));

        let (batches, mut aborted) = m.fetch(fetch_offset, lso);
        if !aborted.is_empty() {
            let k = rotate as usize % aborted.len();
            aborted.rotate_left(k);
            if rotate % 2 == 1 {
                aborted.reverse();
            }
        }
        let v = visible(&batches, &aborted, IsolationLevel::ReadCommitted, fetch_offset).unwrap();
        prop_assert_eq!(offsets_values(&v), m.expected(fetch_offset, lso, true));
        prop_assert_eq!(v.next_offset, lso.max(fetch_offset));
    }
}

#[derive(Debug, Clone)]
struct GenRecord {
    timestamp: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

fn gen_record() -> impl Strategy<Value = GenRecord> {
    let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300));
    (
        -(1i64 << 40)..(1i64 << 40),
        bytes(),
        bytes(),
        proptest::collection::vec(("[a-z]{0,8}", bytes()), 0..3),
    )
        .prop_map(|(timestamp, key, value, headers)| GenRecord {
            timestamp,
            key,
            value,
            headers,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Whatever the builder accepts, the decoder gives back unchanged, for every codec and stamp.
    #[test]
    fn encoder_decoder_round_trip(
        records in proptest::collection::vec(gen_record(), 1..20),
        codec in 0usize..5,
        producer_id in -1i64..1 << 40,
        producer_epoch in -1i16..100,
        base_sequence in -1i32..i32::MAX,
        transactional in any::<bool>(),
        base_offset in 0i64..1 << 50,
    ) {
        let codec = ALL_CODECS[codec];
        let mut b = BatchBuilder::new(codec, usize::MAX);
        for r in &records {
            let headers: Vec<(&[u8], Option<&[u8]>)> =
                r.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
            let rec = NewRecord {
                timestamp: r.timestamp,
                key: r.key.as_deref(),
                value: r.value.as_deref(),
                headers: &headers,
            };
            let before = b.size();
            let size = b.record_size(&rec).unwrap();
            prop_assert!(b.try_append(&rec).unwrap());
            prop_assert_eq!(b.size() - before, size);
        }
        let stamp = ProducerStamp { producer_id, producer_epoch, base_sequence, transactional };
        let sealed = b.seal(stamp).unwrap();
        let mut it = decode_batches(sealed.at_offset(base_offset));
        let batch = it.next().unwrap().unwrap();
        prop_assert!(it.next().is_none());
        prop_assert_eq!(batch.compression(), codec);
        prop_assert_eq!(batch.producer_id(), producer_id);
        prop_assert_eq!(batch.producer_epoch(), producer_epoch);
        prop_assert_eq!(batch.base_sequence(), base_sequence);
        prop_assert_eq!(batch.is_transactional(), transactional);
        prop_assert_eq!(batch.base_timestamp(), records[0].timestamp);
        prop_assert_eq!(batch.max_timestamp(), records.iter().map(|r| r.timestamp).max().unwrap());
        prop_assert_eq!(batch.last_offset(), base_offset + records.len() as i64 - 1);
        let got: Vec<Record> = batch.records().unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(got.len(), records.len());
        for (i, (g, r)) in got.iter().zip(&records).enumerate() {
            prop_assert_eq!(g.offset, base_offset + i as i64);
            prop_assert_eq!(g.timestamp, r.timestamp);
            prop_assert_eq!(g.key.as_deref(), r.key.as_deref());
            prop_assert_eq!(g.value.as_deref(), r.value.as_deref());
            let headers: Vec<(Vec<u8>, Option<Vec<u8>>)> = g
                .headers
                .iter()
                .map(|h| (h.key.to_vec(), h.value.as_ref().map(|v| v.to_vec())))
                .collect();
            let want: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                r.headers.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.clone())).collect();
            prop_assert_eq!(headers, want);
        }
    }

    /// Arbitrary damage to valid batches gives a typed error or a result, never a panic.
    #[test]
    fn mutated_batches_never_panic(
        codec in 0usize..5,
        edits in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8),
        cut in any::<u16>(),
        fix in any::<bool>(),
    ) {
        let mut log = Log::new();
        log.data(Some((3, true)), ALL_CODECS[codec], &["alpha", "beta", "gamma"]);
        log.marker(3, false);
        log.plain(&["delta"]);
        let mut raw = log.bytes().to_vec();
        for (at, byte) in edits {
            let i = at as usize % raw.len();
            raw[i] = byte;
        }
        if fix {
            // Re-seal the first batch's CRC so the damage reaches the record and codec decoders.
            let len = i32::from_be_bytes(raw[8..12].try_into().unwrap());
            if let Ok(len) = usize::try_from(len) {
                if (49..=raw.len() - 12).contains(&len) {
                    let crc = crc32c::crc32c(&raw[21..12 + len]);
                    raw[17..21].copy_from_slice(&crc.to_be_bytes());
                }
            }
        }
        raw.truncate(cut as usize % (raw.len() + 1));
        let bytes = bytes::Bytes::from(raw);
        let aborted = [AbortedTransaction { producer_id: 3, first_offset: 0 }];
        for isolation in [IsolationLevel::ReadCommitted, IsolationLevel::ReadUncommitted] {
            let _ = visible_in(bytes.clone(), &aborted, isolation, 1);
        }
        let batches: Vec<RecordBatch> = decode_batches(bytes).filter_map(Result::ok).collect();
        let _ = LogState::scan(&batches);
        for b in &batches {
            let _ = b.control();
            if let Ok(records) = b.records() {
                for r in records {
                    let _ = r;
                }
            }
        }
    }
}

/// A record whose timestamp delta does not fit is a typed encode error, never a wrapped delta, and the
/// failed append leaves the builder unchanged.
#[test]
fn timestamp_delta_overflow_is_an_encode_error() {
    let mut b = BatchBuilder::new(Compression::None, usize::MAX);
    let first = NewRecord {
        timestamp: i64::MAX,
        ..NewRecord::default()
    };
    assert!(b.try_append(&first).unwrap());
    let second = NewRecord {
        timestamp: i64::MIN,
        ..NewRecord::default()
    };
    assert!(matches!(
        b.try_append(&second),
        Err(EncodeError::TimestampOutOfRange { .. })
    ));
    assert_eq!(
        b.record_count(),
        1,
        "a failed append leaves the builder unchanged"
    );
}
