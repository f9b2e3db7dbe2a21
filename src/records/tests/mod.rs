//! Tests of the records layer. `Log` assembles partition logs from the public encoder, the way a broker
//! lays batches out (consecutive offsets, markers written by the coordinator).

mod broker;
mod codec;
mod decode;
mod interop;
pub(crate) mod malformed;
mod model;
mod visibility;

use bytes::{Bytes, BytesMut};

use super::*;

/// A partition log under construction.
pub(crate) struct Log {
    bytes: BytesMut,
    pub(crate) end: i64,
}

impl Log {
    pub(crate) fn new() -> Log {
        Log {
            bytes: BytesMut::new(),
            end: 0,
        }
    }

    /// Appends a data batch of `values` (keys "k0", "k1", ...); `producer` is `(id, transactional)`.
    /// Returns its base offset.
    pub(crate) fn data(
        &mut self,
        producer: Option<(i64, bool)>,
        codec: Compression,
        values: &[&str],
    ) -> i64 {
        let mut b = BatchBuilder::new(codec, usize::MAX);
        for (i, v) in values.iter().enumerate() {
            let key = format!("k{i}");
            let rec = NewRecord {
                timestamp: 1_000 + i as i64,
                key: Some(key.as_bytes()),
                value: Some(v.as_bytes()),
                headers: &[],
            };
            assert!(b.try_append(&rec).unwrap());
        }
        let stamp = match producer {
            None => ProducerStamp::NONE,
            Some((id, transactional)) => ProducerStamp {
                producer_id: id,
                producer_epoch: 0,
                base_sequence: 0,
                transactional,
            },
        };
        let sealed = b.seal(stamp).unwrap();
        let base = self.end;
        self.bytes.extend_from_slice(&sealed.at_offset(base));
        self.end += values.len() as i64;
        base
    }

    /// A transactional data batch of `producer` holding one record per value.
    pub(crate) fn txn(&mut self, producer: i64, values: &[&str]) -> i64 {
        self.data(Some((producer, true)), Compression::None, values)
    }

    /// A non-transactional batch from a plain producer.
    pub(crate) fn plain(&mut self, values: &[&str]) -> i64 {
        self.data(None, Compression::None, values)
    }

    /// A COMMIT (or ABORT) marker of `producer`. Returns its offset.
    pub(crate) fn marker(&mut self, producer: i64, commit: bool) -> i64 {
        let marker = if commit {
            ControlMarker::Commit {
                coordinator_epoch: 3,
            }
        } else {
            ControlMarker::Abort {
                coordinator_epoch: 3,
            }
        };
        self.control(producer, marker)
    }

    pub(crate) fn control(&mut self, producer: i64, marker: ControlMarker) -> i64 {
        let at = self.end;
        self.bytes
            .extend_from_slice(&control_batch(at, producer, 0, marker, 5_000));
        self.end += 1;
        at
    }

    pub(crate) fn bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.bytes)
    }

    pub(crate) fn batches(&self) -> Vec<RecordBatch> {
        decode_batches(self.bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }
}

/// `(offset, value)` of delivered records, for compact assertions.
pub(crate) fn offsets_values(v: &Visible) -> Vec<(i64, String)> {
    v.iter()
        .map(|r| {
            (
                r.offset(),
                String::from_utf8(r.value().unwrap().to_vec()).unwrap(),
            )
        })
        .collect()
}

pub(crate) const ALL_CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];
