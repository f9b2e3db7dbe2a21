//! Producer settings.

use std::time::Duration;

use super::accumulator::AccumulatorConfig;
use super::sequence_core::MAX_IN_FLIGHT;
use crate::net::Backoff;
use crate::records::Compression;

/// Settings shared by the idempotent and the transactional producer. Acks are always `all`: idempotence
/// needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// How long a batch waits for more records before it is sent. Default 5 ms.
    pub linger: Duration,
    /// A batch holds at most this many bytes, header included (a larger record gets a batch of its
    /// own), and is sent once another record like its last would not fit, or at its linger. Default
    /// 256 KiB.
    pub batch_size: usize,
    /// Everything the producer holds (batched and in flight) stays under this many bytes; `send` waits
    /// and `try_send` fails when it is full. Default 32 MiB.
    pub buffer_memory: usize,
    /// The largest request the producer builds; a larger record is refused. Default 1 MiB (the broker's
    /// default `message.max.bytes` is a little above).
    pub max_request_size: usize,
    /// Batches in flight per partition, at most 5 (what the broker's duplicate detection covers), and
    /// Produce requests in flight per connection (the Java client's
    /// `max.in.flight.requests.per.connection`; a broker has
    /// [`connections_per_broker`](crate::net::ClientConfig::connections_per_broker) of them): batches
    /// for a connection with that many requests unanswered wait in the buffer and go on filling.
    pub max_in_flight: usize,
    /// How long a record may take from `send` to its final answer, retries included. Default 120 s.
    pub delivery_timeout: Duration,
    /// How long the broker may wait for replicas before answering a Produce. Default 30 s.
    pub request_timeout: Duration,
    /// First retry delay; doubles per attempt up to `retry_backoff_max`. Default 100 ms.
    pub retry_backoff: Duration,
    /// Largest retry delay. Default 1 s.
    pub retry_backoff_max: Duration,
    /// How batches are compressed. Default none.
    pub compression: Compression,
    /// How long `send` waits for buffer space (and for the topic's metadata) before it gives up.
    /// Default 60 s.
    pub max_block: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::from_millis(5),
            batch_size: 256 * 1024,
            buffer_memory: 32 * 1024 * 1024,
            max_request_size: 1024 * 1024,
            max_in_flight: MAX_IN_FLIGHT,
            delivery_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            compression: Compression::None,
            max_block: Duration::from_secs(60),
        }
    }
}

impl ProducerConfig {
    pub(crate) fn accumulator(&self) -> AccumulatorConfig {
        AccumulatorConfig {
            batch_size: self.batch_size.max(1),
            linger: self.linger,
            buffer_memory: self.buffer_memory,
            max_request_size: self.max_request_size,
        }
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::exponential(self.retry_backoff, self.retry_backoff_max)
    }
}

/// Settings of a transactional producer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransactionalConfig {
    /// The transactional id: stable across restarts of the same logical writer. Initialising with it
    /// fences every earlier producer that used it and aborts what they left open.
    pub transactional_id: String,
    /// How long the coordinator lets a transaction stay open before aborting it. Default 60 s. A
    /// two-phase-commit producer's transactions never expire, and `init` refuses a value other than the
    /// default with it.
    pub transaction_timeout: Duration,
    /// How long `init`, `send_offsets`, `commit` and `abort` keep retrying before they give up.
    /// Default 60 s.
    pub operation_timeout: Duration,
    /// Take part in a two-phase commit another system coordinates (KIP-939): `init` asks the
    /// coordinator for transactions that wait for an outside decision instead of timing out, and
    /// `prepare`, `complete` and `init_keeping_prepared` become available (see the `two_phase` module
    /// docs of [`TransactionalProducer::prepare`](super::TransactionalProducer::prepare)). Needs Kafka
    /// 4.4+ with `transaction.two.phase.commit.enable=true` and `unstable.api.versions.enable=true`,
    /// transaction version 2, and the TWO_PHASE_COMMIT ACL on the transactional id. Default `false`.
    pub two_phase_commit: bool,
    /// Batching, memory and retry settings.
    pub producer: ProducerConfig,
}

/// The default [`TransactionalConfig::transaction_timeout`].
pub(crate) const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

impl TransactionalConfig {
    /// Defaults with the given transactional id.
    pub fn new(transactional_id: impl Into<String>) -> Self {
        TransactionalConfig {
            transactional_id: transactional_id.into(),
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
            operation_timeout: Duration::from_secs(60),
            two_phase_commit: false,
            producer: ProducerConfig::default(),
        }
    }
}
