//! The idempotent producer: exactly-once writes per partition within a producer session, no transactions.

use std::sync::Arc;

use super::driver::{init_idempotent_id, Delivery, Inner};
use super::{ProducerConfig, ProducerError, ProducerIdEpoch, ProducerRecord};
use crate::net::Client;

/// An idempotent producer (acks = all, per-partition sequence numbers, retries that keep their sequence).
///
/// Cheap to clone: clones share one buffer and one background task. The task stops when the last clone
/// is dropped or [`close`](Self::close) is called.
///
/// ```no_run
/// # use snapfence::producer::*;
/// # async fn demo(client: snapfence::net::Client) -> Result<(), ProducerError> {
/// let producer = Producer::new(client, ProducerConfig::default()).await?;
/// let delivery = producer.send(ProducerRecord::new("events", Some("hello".into()))).await?;
/// let written = delivery.await?;
/// println!("at offset {:?}", written.offset);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    handle: Arc<Handle>,
}

struct Handle {
    inner: Arc<Inner>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.close();
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("ids", &self.producer_id_and_epoch())
            .finish()
    }
}

impl Producer {
    /// Fetches a producer id (InitProducerId without a transactional id) and starts the background task.
    ///
    /// Cancel-safe.
    pub async fn new(client: Client, config: ProducerConfig) -> Result<Self, ProducerError> {
        let ids = init_idempotent_id(&client, &config).await?;
        let inner = Inner::idempotent(client, config);
        inner.lock().core.set_ids(ids);
        inner.spawn();
        Ok(Producer {
            handle: Arc::new(Handle { inner }),
        })
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// Buffers a record, waiting for buffer space (and the topic's metadata) up to `max_block`. The
    /// [`Delivery`] resolves when the broker has written it, or with an error whose class says whether
    /// it was not written (abortable) or may have been (outcome unknown).
    ///
    /// Cancel-safe: if the future is dropped before it returns, the record was not buffered.
    pub async fn send(&self, record: ProducerRecord) -> Result<Delivery, ProducerError> {
        self.inner().append(record).await
    }

    /// As [`send`](Self::send) but fails at once with [`ProducerError::BufferFull`] (retriable) when the
    /// buffer is full, or [`ProducerError::UnknownPartition`] when the topic's metadata is not cached.
    pub fn try_send(&self, record: ProducerRecord) -> Result<Delivery, ProducerError> {
        self.inner().try_append(record).map_err(|(e, _)| e)
    }

    /// Ends the linger of every record buffered now (see
    /// [`TransactionalProducer::send_buffered`](super::TransactionalProducer::send_buffered)); waits for
    /// nothing.
    pub fn send_buffered(&self) {
        self.inner().send_buffered();
    }

    /// Sends everything buffered now and waits until each of those records has its outcome.
    ///
    /// Cancel-safe: dropping it stops the wait, not the records.
    pub async fn flush(&self) {
        self.inner().flush().await;
    }

    /// The producer id and epoch batches are written under now.
    pub fn producer_id_and_epoch(&self) -> Option<ProducerIdEpoch> {
        self.inner().lock().core.ids()
    }

    /// Flushes, then stops. Records buffered after the flush began fail with [`ProducerError::Closed`].
    ///
    /// Cancel-safe: dropping it mid-flush stops the wait; the producer closes when the last clone drops.
    pub async fn close(self) {
        self.flush().await;
        self.inner().close();
    }
}
