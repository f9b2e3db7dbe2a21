//! The produce path's batch encoder over the records layer's [`BatchBuilder`].

use bytes::Bytes;

use super::produce_core::BatchEncoder;
use super::{ProducerIdEpoch, ProducerRecord};
use crate::records::{BatchBuilder, Compression, ProducerStamp};

/// Encodes one batch per call with the configured codec.
pub(crate) struct RecordsEncoder {
    pub(crate) compression: Compression,
}

impl BatchEncoder for RecordsEncoder {
    fn encode(
        &mut self,
        records: &[&ProducerRecord],
        ids: ProducerIdEpoch,
        base_sequence: i32,
        transactional: bool,
    ) -> Result<Bytes, String> {
        // The accumulator already bounded the batch; the builder must take every record handed to it.
        let mut builder = BatchBuilder::new(self.compression, usize::MAX);
        for r in records {
            match r.as_new_record(|record| builder.try_append(record)) {
                Ok(true) => {}
                Ok(false) => return Err("record batch refused a record within its bound".into()),
                Err(e) => return Err(e.to_string()),
            }
        }
        let sealed = builder
            .seal(ProducerStamp {
                producer_id: ids.id,
                producer_epoch: ids.epoch,
                base_sequence,
                transactional,
            })
            .map_err(|e| e.to_string())?;
        Ok(sealed.bytes().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::decode_batches;

    /// What the producer writes decodes back with its identity, sequence and records intact.
    #[test]
    fn encoded_batches_decode_with_their_stamp() {
        let recs = [
            ProducerRecord::new("t", Some(Bytes::from_static(b"v1")))
                .key("k1")
                .timestamp(1_000)
                .header("h", None),
            ProducerRecord::new("t", None).key("k2").timestamp(1_005),
        ];
        let refs: Vec<&ProducerRecord> = recs.iter().collect();
        for compression in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut enc = RecordsEncoder { compression };
            let ids = ProducerIdEpoch { id: 99, epoch: 7 };
            let bytes = enc.encode(&refs, ids, 40, true).unwrap();
            let batch = decode_batches(bytes)
                .next()
                .expect("one batch")
                .expect("decodes");
            assert_eq!(batch.producer_id(), 99);
            assert_eq!(batch.producer_epoch(), 7);
            assert_eq!(batch.base_sequence(), 40);
            assert!(batch.attributes().is_transactional());
            let records: Vec<_> = batch.records().unwrap().collect::<Result<_, _>>().unwrap();
            assert_eq!(records.len(), 2);
            assert_eq!(records[0].key.as_deref(), Some(&b"k1"[..]));
            assert_eq!(records[1].value, None);
            assert_eq!(records[1].timestamp, 1_005);
        }
    }
}
