//! What an application writes to use a [`Flow`](super::Flow): its [`Fold`] (how an event or a timer
//! changes a key's state, and the state's snapshot bytes), what a fold answers ([`Change`]), and the
//! [`Clock`] its timers read. Nothing here runs anything: the runtime that calls these lives in
//! `flow/`, and the per-partition bookkeeping around them in `fold_core.rs`.

use bytes::Bytes;

use crate::producer::ProducerRecord;
use crate::records::Record;

/// A boxed error from user code (decoding a snapshot).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a fold did to a key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing changed: the runtime writes nothing and holds no offset for it. A fold that mutated the
    /// state anyway may lose that mutation at the next restart.
    Keep,
    /// The state changed and is persisted with the next snapshot wave. An `Update` that leaves the state
    /// `None` is a delete.
    Update,
    /// The key goes away: the runtime clears the state and writes a tombstone, fenced like a snapshot
    /// (see docs/fencing.md, "Deletes", for why a short-lived grave precedes it).
    Delete,
}

/// The application's fold: per-key state changed in place by events and timers, and the state's
/// snapshot encoding.
///
/// The flow calls [`fold`](Fold::fold) once per input event, in offset order within a partition, with
/// the key's current state (`None` before its first event or after a delete), which the fold changes in
/// place: no state is copied per event. It persists [`encode`](Fold::encode)d states as snapshots
/// (inside an envelope that also records the key's last folded offset) and [`decode`](Fold::decode)s
/// them when a partition is recovered; a snapshot that does not decode stops the flow with
/// [`FlowError::BadSnapshot`](super::FlowError::BadSnapshot), so keep `decode` able to read every encoding you ever wrote.
///
/// **Timers.** A key's [`deadline`](Fold::deadline) is derived from its state, so it is persisted with
/// the state and a new owner recovers the schedule with it. When the fold's time reaches it,
/// [`on_deadline`](Fold::on_deadline) runs and may update or delete the key; that change is persisted
/// and fenced like an event's. Both default to "no timer". Which time is the fold's choice,
/// [`timer_clock`](Fold::timer_clock):
/// - [`TimerClock::Wall`] (the default): the flow's clock ([`FlowConfig::clock`](super::FlowConfig::clock)),
///   checked every [`FlowConfig::timer_every`](super::FlowConfig::timer_every) and at takeover. A
///   backfill or a replay fires timers where the wall clock happens to be, not where the input is.
/// - [`TimerClock::Stream`]: the partition's *stream time*, the highest record timestamp its input has
///   shown (see [`TimerClock::Stream`]). Timers fire at the same points of the input whenever it is
///   folded: live, in a backfill, or replayed after a crash.
///
/// Events with a null key are not folded: state is per key, and a null key names none. They are skipped
/// (their offsets still advance the partition, so they are not re-read) and counted in
/// [`Flow::null_key_events`](super::Flow::null_key_events); the first one is logged at warn level.
///
/// `fold` must be deterministic: an event may be folded again after a crash (into the state recovered
/// from before it), and must produce the same state. A timer may fire again after a crash too.
///
/// ```
/// use snapfence::records::Record;
/// use snapfence::snapshot::{BoxError, Change, Fold, Outputs};
/// use snapfence::Bytes;
///
/// /// Account balances: each event's value is a signed amount in ASCII ("+25", "-10"); an account
/// /// that reaches zero is closed (deleted).
/// struct Balances;
///
/// impl Fold for Balances {
///     type State = i64;
///
///     fn fold(
///         &self,
///         _account: &Bytes,
///         balance: &mut Option<i64>,
///         event: &Record,
///         _out: &mut Outputs,
///     ) -> Change {
///         let amount = event
///             .value
///             .as_ref()
///             .and_then(|v| std::str::from_utf8(v).ok())
///             .and_then(|v| v.parse::<i64>().ok());
///         let Some(amount) = amount else { return Change::Keep }; // malformed: nothing changes
///         let balance = balance.get_or_insert(0);
///         *balance += amount;
///         if *balance == 0 { Change::Delete } else { Change::Update }
///     }
///
///     fn encode(&self, balance: &i64) -> Bytes {
///         Bytes::copy_from_slice(&balance.to_be_bytes())
///     }
///
///     fn decode(&self, bytes: &[u8]) -> Result<i64, BoxError> {
///         Ok(i64::from_be_bytes(bytes.try_into()?))
///     }
/// }
/// # let _ = Balances;
/// ```
pub trait Fold: Send + Sync + 'static {
    /// The per-key state.
    type State: Clone + Send + Sync + 'static;
    /// Folds one input event into the key's state, in place (`None` before the key's first event and
    /// after a delete), and says what changed. Records sent to `out` are the event's outputs: in the
    /// transactional mode they are produced in the transaction that persists the key's snapshot, so
    /// they commit exactly once with it (see [`Outputs`]). A fold that emits nothing ignores `out`.
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<Self::State>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change;
    /// Encodes a state as snapshot bytes.
    fn encode(&self, state: &Self::State) -> Bytes;
    /// Decodes snapshot bytes written by [`Fold::encode`].
    fn decode(&self, bytes: &[u8]) -> Result<Self::State, BoxError>;
    /// When the key's timer fires, in milliseconds since the Unix epoch on the fold's
    /// [`timer_clock`](Fold::timer_clock), or `None` for no timer. Asked after every change and at
    /// recovery; derive it from the state only.
    fn deadline(&self, _key: &Bytes, _state: &Self::State) -> Option<i64> {
        None
    }
    /// The key's deadline passed (`now` is the clock's reading): change the state in place, delete it,
    /// or keep it (then the deadline is asked again; one still at or before `now` is dropped until
    /// the next change). Records sent to `out` commit with the key's next snapshot, like an event's.
    ///
    /// A timer that emits must move its deadline (change the state so that
    /// [`deadline`](Fold::deadline) answers later, or delete the key): a timer whose state still has the
    /// old deadline fires again on the next owner after a crash, and emits again. The runtime persists
    /// the key whenever a timer emits, even on [`Change::Keep`], so the outputs ride with a snapshot.
    fn on_deadline(
        &self,
        _key: &Bytes,
        _state: &mut Self::State,
        _now: i64,
        _out: &mut Outputs,
    ) -> Change {
        Change::Keep
    }
    /// Which time [`deadline`](Fold::deadline) and `now` in [`on_deadline`](Fold::on_deadline) are
    /// on. Fixed for a fold: the flow asks once per partition it acquires.
    fn timer_clock(&self) -> TimerClock {
        TimerClock::Wall
    }
}

/// The time a fold's timers are on (see [`Fold::timer_clock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TimerClock {
    /// The flow's wall clock ([`FlowConfig::clock`](super::FlowConfig::clock)), read every
    /// [`FlowConfig::timer_every`](super::FlowConfig::timer_every) and at takeover.
    #[default]
    Wall,
    /// The partition's stream time: the highest record timestamp seen on the input partition, as Kafka
    /// Streams' `STREAM_TIME` punctuation reads it.
    ///
    /// - Every event with a timestamp advances it, whatever the fold makes of it: folded, kept, skipped
    ///   by a replay, or without a key. A timestamp below 0 (-1: none) leaves it where it is, and so
    ///   does an event older than it.
    /// - When an event moves it forward, every timer due at the new stream time fires (in deadline
    ///   order) *before* that event is folded: the event happened after the deadline. A deadline set
    ///   already at or behind stream time fires when stream time next moves.
    /// - It stands still while the partition gets no input: an idle partition's timers wait for its
    ///   next event, however much wall time passes. The flow's clock and `timer_every` play no part.
    /// - It is persisted with the partition: the committed offset's metadata carries the stream time
    ///   the input had reached just before that offset (`snapfence st=<ms>`), and a new owner resumes
    ///   from it, so the replay from the committed offset fires each timer at the same event as the
    ///   live run did. A partition never committed with it starts with none, and its first event
    ///   with a timestamp sets it.
    ///
    /// Not available on the PostgreSQL store yet: [`Flow::start`](super::Flow::start) refuses it there.
    Stream,
}

/// The flow's source of time for timers: milliseconds since the Unix epoch. Inject your own to drive
/// timers in tests.
pub trait Clock: std::fmt::Debug + Send + Sync + 'static {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// The records a fold or a timer emits for one key, collected by the runtime.
///
/// In [`PersistenceMode::Transactional`](super::PersistenceMode::Transactional), what is sent here while
/// folding key `k` is held with `k` until `k`'s next snapshot is written, and produced **in the same
/// transaction** as that snapshot and the generation-fenced offset commit: the outputs commit exactly
/// when the state that produced them does, a stale owner's outputs die with its snapshot, and a
/// `read_committed` consumer of the output topic sees each output once (docs/fencing.md, "Outputs").
/// They become visible at the persist interval ([`FlowConfig::persist_every`](super::FlowConfig::persist_every)),
/// or earlier when a partition's held outputs reach
/// [`FlowConfig::max_output_bytes_per_partition`](super::FlowConfig::max_output_bytes_per_partition).
/// In [`PersistenceMode::NonTransactional`](super::PersistenceMode::NonTransactional) they are produced
/// at once, right after the batch that emitted them, without a transaction: at least once (the flow
/// confirms their delivery before the key's next snapshot or offset commit can pass them).
///
/// A record without a partition lands where Kafka's default partitioner puts its key (murmur2, as the
/// Java client does), or spread when it has no key. Values are [`Bytes`]: passing a slice of the input
/// event's value on copies nothing.
///
/// ```
/// use snapfence::producer::ProducerRecord;
/// use snapfence::snapshot::Outputs;
///
/// let mut out = Outputs::default();
/// out.send(ProducerRecord::new("totals", Some("42".into())).key("account-7"));
/// assert_eq!(out.len(), 1);
/// ```
#[derive(Debug, Default)]
pub struct Outputs {
    records: Vec<ProducerRecord>,
    bytes: usize,
}

impl Outputs {
    /// Emits `record`.
    pub fn send(&mut self, record: ProducerRecord) {
        self.bytes += output_size(&record);
        self.records.push(record);
    }

    /// How many records were emitted and not yet taken by the runtime.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing was emitted.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Roughly the bytes the emitted records take on the wire (keys, values, headers, topic names).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes what was emitted, leaving this empty (and keeping nothing allocated when nothing was).
    pub(crate) fn take(&mut self) -> (Vec<ProducerRecord>, usize) {
        let bytes = std::mem::take(&mut self.bytes);
        (std::mem::take(&mut self.records), bytes)
    }
}

/// What a record counts toward the byte budgets: its key, value and headers, its topic name, and a
/// fixed overhead for the record's framing.
pub(crate) fn output_size(record: &ProducerRecord) -> usize {
    const FRAMING: usize = 24;
    let headers: usize = record
        .headers
        .iter()
        .map(|h| h.key.len() + h.value.as_ref().map_or(0, |v| v.len()))
        .sum();
    FRAMING
        + record.topic.len()
        + record.key.as_ref().map_or(0, |k| k.len())
        + record.value.as_ref().map_or(0, |v| v.len())
        + headers
}
