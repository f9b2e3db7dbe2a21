//! Scripted tests of the fold core: events, waves, commits and fences in chosen orders, no I/O.

use super::*;
use crate::producer::ProducerRecord;
use crate::records::TimestampType;

/// Per key: how many events, and the timestamp of the last. Value `del` deletes, `keep` keeps; an idle
/// key (no event for `ttl` ms of event time) expires by timer when `ttl` is set.
struct Script {
    ttl: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct St {
    count: u64,
    seen: i64,
}

impl Fold for Script {
    type State = St;
    fn fold(
        &self,
        _key: &Bytes,
        state: &mut Option<St>,
        event: &Record,
        _out: &mut Outputs,
    ) -> Change {
        match event.value.as_deref() {
            Some(b"del") => Change::Delete,
            Some(b"keep") => Change::Keep,
            _ => {
                let s = state.get_or_insert(St { count: 0, seen: 0 });
                s.count += 1;
                s.seen = event.timestamp;
                Change::Update
            }
        }
    }
    fn encode(&self, s: &St) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u64(s.count);
        b.put_i64(s.seen);
        b.freeze()
    }
    fn decode(&self, b: &[u8]) -> Result<St, crate::snapshot::BoxError> {
        let b: [u8; 16] = b.try_into()?;
        Ok(St {
            count: u64::from_be_bytes(b[..8].try_into()?),
            seen: i64::from_be_bytes(b[8..].try_into()?),
        })
    }
    fn deadline(&self, _key: &Bytes, s: &St) -> Option<i64> {
        self.ttl.map(|t| s.seen + t)
    }
    fn on_deadline(&self, _key: &Bytes, _s: &mut St, _now: i64, _out: &mut Outputs) -> Change {
        Change::Delete
    }
}

const NO_TTL: Script = Script { ttl: None };

fn ev(offset: i64, key: &str, value: &str) -> Record {
    Record {
        offset,
        timestamp: offset * 1000,
        timestamp_type: TimestampType::CreateTime,
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        value: Some(Bytes::copy_from_slice(value.as_bytes())),
        headers: Vec::new(),
    }
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A wave's (key, value) pairs, sorted by key.
fn keys_of(w: &Wave) -> Vec<(Bytes, Option<Bytes>)> {
    let mut v = pairs(w);
    v.sort();
    v
}

/// A wave's (key, value) pairs, in the wave's order.
fn pairs(w: &Wave) -> Vec<(Bytes, Option<Bytes>)> {
    w.writes
        .iter()
        .map(|w| (w.key.clone(), w.value.clone()))
        .collect()
}

/// Replay never folds an event twice: events at or below a recovered key's offset are skipped.
#[test]
fn replay_skips_what_the_snapshot_already_folded() {
    let mut c = PartitionCore::new(0);
    c.restore(&NO_TTL, b("a"), Some(St { count: 3, seen: 0 }), 4);
    assert_eq!(c.handle_event(&NO_TTL, &ev(3, "a", "x")), Folded::Skipped);
    assert_eq!(c.handle_event(&NO_TTL, &ev(4, "a", "x")), Folded::Skipped);
    assert_eq!(c.handle_event(&NO_TTL, &ev(5, "a", "x")), Folded::Changed);
    assert_eq!(c.states().next().unwrap().1.count, 4);
    assert_eq!(
        c.committable(),
        5,
        "the unpersisted change holds its offset"
    );
}

/// The committable offset never passes a change whose write has not landed, whatever lands when.
#[test]
fn a_write_in_flight_holds_and_a_change_during_it_holds_again() {
    let mut c = PartitionCore::new(10);
    c.handle_event(&NO_TTL, &ev(10, "a", "x"));
    c.handle_event(&NO_TTL, &ev(11, "b", "x"));
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(w.writes.len(), 2);
    assert!(c.poll_wave(&NO_TTL).is_none(), "one wave at a time");
    // Folded while the wave flies: a's next change.
    c.handle_event(&NO_TTL, &ev(12, "a", "x"));
    assert_eq!(c.committable(), 10, "in flight is not landed");
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 12, "a's later change holds again");
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(keys_of(&w).len(), 1);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 13);
}

/// Every ordering of one wave, one commit and a fence: the commit never carries an offset past a write
/// that did not land, and a fenced partition hands nothing more out.
#[test]
fn every_ordering_of_write_commit_and_fence_keeps_the_commit_behind_unlanded_writes() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Begin,
        Commit,
        Outcome,
    }
    for outcome in [Landing::Landed, Landing::Failed, Landing::Fenced] {
        let orders = [
            [Step::Begin, Step::Commit, Step::Outcome],
            [Step::Begin, Step::Outcome, Step::Commit],
            [Step::Commit, Step::Begin, Step::Outcome],
        ];
        for order in orders {
            let mut c = PartitionCore::new(0);
            c.handle_event(&NO_TTL, &ev(0, "a", "x"));
            c.handle_event(&NO_TTL, &ev(1, "b", "x"));
            let mut wave = None;
            let mut committed = Vec::new();
            let mut landed = false;
            for step in order {
                match step {
                    Step::Begin => wave = c.poll_wave(&NO_TTL),
                    Step::Commit => {
                        if !c.is_fenced() {
                            committed.push(c.committable());
                        }
                    }
                    Step::Outcome => {
                        let w = wave.take().expect("begun");
                        c.handle_wave_outcome(w.id, outcome);
                        landed = outcome == Landing::Landed;
                    }
                }
            }
            for offset in committed {
                // Offset 0 and 1 are covered only by the wave: passing them needs it landed.
                assert!(
                    offset == 0 || landed,
                    "{order:?} {outcome:?}: committed {offset} ahead of an unlanded write"
                );
            }
            match outcome {
                Landing::Landed => assert_eq!(c.committable(), 2),
                _ => assert_eq!(c.committable(), 0, "{order:?} {outcome:?}"),
            }
            if outcome == Landing::Fenced {
                c.handle_event(&NO_TTL, &ev(2, "a", "x"));
                assert!(
                    c.poll_wave(&NO_TTL).is_none(),
                    "a fenced partition writes nothing"
                );
            }
            if outcome == Landing::Failed {
                let again = c
                    .poll_wave(&NO_TTL)
                    .expect("a failed wave is written again");
                assert_eq!(again.writes.len(), 2);
            }
        }
    }
}

/// A wave whose future was dropped, or an outcome for a wave that is not the current one, changes nothing
/// it should not.
#[test]
fn a_stale_outcome_is_ignored() {
    let mut c = PartitionCore::new(0);
    c.handle_event(&NO_TTL, &ev(0, "a", "x"));
    let w = c.poll_wave(&NO_TTL).unwrap();
    c.handle_wave_outcome(w.id + 7, Landing::Landed);
    assert_eq!(c.committable(), 0);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 1);
}

/// A delete first writes a grave (the delete's offset, which keeps gating replay); only once a commit has
/// landed past that offset is the tombstone written, and then the key is forgotten.
#[test]
fn a_delete_is_a_grave_until_the_commit_passes_it_then_a_tombstone() {
    let mut c = PartitionCore::new(0);
    c.handle_event(&NO_TTL, &ev(0, "a", "x"));
    c.handle_event(&NO_TTL, &ev(1, "b", "x"));
    let w = c.poll_wave(&NO_TTL).unwrap();
    c.handle_wave_outcome(w.id, Landing::Landed);
    c.handle_event(&NO_TTL, &ev(2, "a", "del"));
    assert_eq!(c.states().count(), 1, "a deleted key is not a state");
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), Some(grave(2)))]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    // Replay of the deleted key's own events is still skipped.
    assert_eq!(c.handle_event(&NO_TTL, &ev(2, "a", "x")), Folded::Skipped);
    assert!(
        c.poll_wave(&NO_TTL).is_none(),
        "no tombstone before the commit"
    );
    assert!(!c.tombstones_due());
    let offset = c.committable();
    assert_eq!(offset, 3);
    c.handle_commit_landed(offset);
    assert!(c.tombstones_due());
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), None)]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.remembered(), 1, "the deleted key is forgotten");
}

/// A failed tombstone is written again, and a key re-created while its tombstone flies survives it.
#[test]
fn a_failed_tombstone_is_retried_and_a_recreated_key_outlives_its_tombstone() {
    let mut c = PartitionCore::new(0);
    c.handle_event(&NO_TTL, &ev(0, "a", "x"));
    c.handle_event(&NO_TTL, &ev(1, "a", "del"));
    c.handle_commit_landed(5); // a commit already past the delete: no grave needed
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), None)]);
    c.handle_wave_outcome(w.id, Landing::Failed);
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), None)], "retried");
    c.handle_event(&NO_TTL, &ev(6, "a", "x"));
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.states().count(), 1, "re-created after the delete");
    assert_eq!(c.committable(), 6);
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert!(matches!(&pairs(&w)[..], [(k, Some(_))] if k == "a"));
}

/// A recovered grave gates replay like the delete did, and gets its tombstone once the committed offset
/// (here: the assigned one) is past it.
#[test]
fn a_recovered_grave_gates_replay_and_is_tombstoned_when_committed_past() {
    let mut c: PartitionCore<St> = PartitionCore::new(5);
    c.restore(&NO_TTL, b("a"), None, 3);
    c.restore(&NO_TTL, b("z"), None, 9);
    assert_eq!(c.states().count(), 0);
    assert_eq!(c.handle_event(&NO_TTL, &ev(9, "z", "x")), Folded::Skipped);
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(
        pairs(&w),
        vec![(b("a"), None)],
        "only a's delete is behind the commit"
    );
}

/// A key that is created and deleted between two waves still leaves a grave, so a replay from an older
/// committed offset cannot bring it back; a kept event writes nothing and holds nothing.
#[test]
fn a_short_lived_key_leaves_a_grave_and_keep_holds_nothing() {
    let mut c = PartitionCore::new(0);
    c.handle_event(&NO_TTL, &ev(0, "a", "x"));
    c.handle_event(&NO_TTL, &ev(1, "a", "del"));
    assert_eq!(c.handle_event(&NO_TTL, &ev(2, "b", "keep")), Folded::Kept);
    assert_eq!(c.committable(), 0);
    let w = c.poll_wave(&NO_TTL).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), Some(grave(1)))]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 3);
}

/// Timers fire at their deadline and not before; the effect holds the committable offset where the
/// partition stood until its write lands; a recovered state brings its deadline back.
#[test]
fn timers_fire_on_scripted_time_hold_the_offset_and_survive_recovery() {
    let ttl = Script { ttl: Some(10_000) };
    let mut c = PartitionCore::new(0);
    c.handle_event(&ttl, &ev(0, "a", "x")); // seen 0 → due 10 000
    c.handle_event(&ttl, &ev(5, "b", "x")); // seen 5 000 → due 15 000
    let w = c.poll_wave(&ttl).unwrap();
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.poll_timeout(), Some(10_000));
    assert_eq!(c.handle_timeout(&ttl, 9_999), 0);
    assert_eq!(c.handle_timeout(&ttl, 10_000), 1);
    assert_eq!(c.states().count(), 1);
    assert_eq!(
        c.committable(),
        6,
        "the expiry holds where the partition stood"
    );
    let w = c.poll_wave(&ttl).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), Some(grave(0)))]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.poll_timeout(), Some(15_000));

    // A new owner recovers b's state, and with it the schedule.
    let mut next: PartitionCore<St> = PartitionCore::new(6);
    next.restore(
        &ttl,
        b("b"),
        Some(St {
            count: 1,
            seen: 5_000,
        }),
        5,
    );
    assert_eq!(next.poll_timeout(), Some(15_000));
    assert_eq!(
        next.handle_timeout(&ttl, 20_000),
        1,
        "overdue at takeover: fires at once"
    );
    let w = next.poll_wave(&ttl).unwrap();
    assert_eq!(
        pairs(&w),
        vec![(b("b"), None)],
        "committed past b's last event: straight to a tombstone"
    );
}

/// An event resets a key's deadline (the schedule is derived from the state), and a timer that fired on a
/// deleted key does nothing.
#[test]
fn an_event_moves_the_deadline() {
    let ttl = Script { ttl: Some(10_000) };
    let mut c = PartitionCore::new(0);
    c.handle_event(&ttl, &ev(0, "a", "x"));
    c.handle_event(&ttl, &ev(8, "a", "x")); // seen 8 000 → due 18 000
    assert_eq!(c.handle_timeout(&ttl, 12_000), 0);
    assert_eq!(c.poll_timeout(), Some(18_000));
    c.handle_event(&ttl, &ev(9, "a", "del"));
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.handle_timeout(&ttl, 100_000), 0);
}

/// Like [`Script`], but `del` deletes only a key with at least two events: whether a delete happens
/// depends on the state, so replaying a key's events onto the wrong state shows.
struct Picky;

impl Fold for Picky {
    type State = St;
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<St>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        if event.value.as_deref() == Some(b"del") && state.as_ref().is_some_and(|s| s.count >= 2) {
            return Change::Delete;
        }
        let plain = Record {
            value: Some(Bytes::from_static(b"x")),
            ..event.clone()
        };
        NO_TTL.fold(key, state, &plain, out)
    }
    fn encode(&self, s: &St) -> Bytes {
        NO_TTL.encode(s)
    }
    fn decode(&self, b: &[u8]) -> Result<St, crate::snapshot::BoxError> {
        NO_TTL.decode(b)
    }
}

/// A compacted snapshot log and committed offset as the broker keeps them (the model the simulation
/// recovers from).
#[derive(Default, Clone)]
struct Durable {
    log: HashMap<Bytes, Bytes>,
    committed: i64,
}

impl Durable {
    fn apply(&mut self, wave: &Wave) {
        for (k, v) in &pairs(wave) {
            match v {
                Some(v) => self.log.insert(k.clone(), v.clone()),
                None => self.log.remove(k),
            };
        }
    }

    fn recover(&self) -> PartitionCore<St> {
        let mut core = PartitionCore::new(self.committed);
        for (k, v) in &self.log {
            match open_envelope(v).unwrap() {
                Opened::Live(offset, payload) => core.restore(
                    &Picky,
                    k.clone(),
                    Some(Picky.decode(payload).unwrap()),
                    offset,
                ),
                Opened::Grave(offset) => core.restore(&Picky, k.clone(), None, offset),
                other => panic!("a one-input core wrote {other:?}"),
            }
        }
        core
    }
}

/// Each live key's event count in `core`, sorted by key.
fn counts(core: &PartitionCore<St>) -> Vec<(Bytes, u64)> {
    let mut got: Vec<(Bytes, u64)> = core.states().map(|(k, s)| (k.clone(), s.count)).collect();
    got.sort();
    got
}

/// The oracle: each key's event count after folding all of `input` with `fold` from nothing, deleted
/// keys absent, sorted by key.
fn fold_from_scratch<F: Fold<State = St>>(fold: &F, input: &[Record]) -> Vec<(Bytes, u64)> {
    let mut oracle: HashMap<Bytes, Option<St>> = HashMap::new();
    for e in input {
        let k = e.key.clone().unwrap();
        let state = oracle.entry(k.clone()).or_default();
        if fold.fold(&k, state, e, &mut Outputs::default()) == Change::Delete {
            *state = None;
        }
    }
    let mut expected: Vec<_> = oracle
        .into_iter()
        .filter_map(|(k, s)| Some((k, s?.count)))
        .collect();
    expected.sort();
    expected
}

/// xorshift64*: a seeded, dependency-free source of choices (the flow's merge simulation uses it too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Whatever the interleaving of folds, waves (landed, failed, failed-but-landed as an unknown outcome
/// would be, fenced), commits and crashes, an owner that recovers from the log and replays from the
/// committed offset ends with the fold of all input: no event folded twice, none lost, and no deleted key
/// brought back (the fold's delete depends on the state, so a replay onto the wrong state would show).
#[test]
fn simulated_crashes_always_recover_the_fold_of_all_input() {
    for seed in 1..=400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let input: Vec<Record> = (0..40)
            .map(|o| {
                let key = ["a", "b", "c", "d"][rng.below(4) as usize];
                let value = if rng.below(4) == 0 { "del" } else { "x" };
                ev(o, key, value)
            })
            .collect();
        let mut durable = Durable::default();
        let mut core = durable.recover();
        let mut wave: Option<Wave> = None;
        let mut trace = Vec::new();
        for _ in 0..200 {
            match rng.below(6) {
                0 | 1 => {
                    let p = core.position() as usize;
                    if p < input.len() {
                        core.handle_event(&Picky, &input[p]);
                        trace.push(format!("fold {p}"));
                    }
                }
                2 => {
                    if wave.is_none() {
                        wave = core.poll_wave(&Picky);
                        trace.push(format!("begin {:?}", wave.as_ref().map(|w| w.writes.len())));
                    }
                }
                3 => {
                    if let Some(w) = wave.take() {
                        let (landed, told) = match rng.below(4) {
                            0 => (false, Landing::Failed),
                            1 => (true, Landing::Failed), // outcome unknown, but it committed
                            _ => (true, Landing::Landed),
                        };
                        if landed {
                            durable.apply(&w);
                        }
                        core.handle_wave_outcome(w.id, told);
                        trace.push(format!("wave landed={landed} told={told:?}"));
                    }
                }
                4 => {
                    // A commit can land before a wave still in flight: it rides in its own transaction.
                    let offset = core.committable();
                    durable.committed = durable.committed.max(offset);
                    core.handle_commit_landed(offset);
                    trace.push(format!("commit {offset}"));
                }
                _ => {
                    // Crash: a wave in flight may or may not have landed.
                    if let Some(w) = wave.take() {
                        if rng.below(2) == 0 {
                            durable.apply(&w);
                        }
                    }
                    core = durable.recover();
                    trace.push(format!("crash, resume at {}", durable.committed));
                }
            }
        }
        // Finish: fold the rest, persist, commit, write the tombstones, then a last restart.
        if let Some(w) = wave.take() {
            core.handle_wave_outcome(w.id, Landing::Failed);
        }
        while (core.position() as usize) < input.len() {
            let p = core.position() as usize;
            core.handle_event(&Picky, &input[p]);
        }
        for _ in 0..2 {
            if let Some(w) = core.poll_wave(&Picky) {
                durable.apply(&w);
                core.handle_wave_outcome(w.id, Landing::Landed);
            }
            let offset = core.committable();
            durable.committed = offset;
            core.handle_commit_landed(offset);
        }
        assert_eq!(durable.committed, input.len() as i64, "seed {seed}");
        assert_eq!(
            counts(&durable.recover()),
            fold_from_scratch(&Picky, &input),
            "seed {seed}: {trace:#?}"
        );
        assert!(
            durable
                .log
                .values()
                .all(|v| matches!(open_envelope(v), Ok(Opened::Live(..)))),
            "seed {seed}: a clean finish leaves no graves"
        );
    }
}

/// [`Picky`] that emits one output per event, carrying the event's offset, and (with a ttl) one per
/// timer, carrying the deadline. Value `quiet` on a key without state emits without creating state;
/// `same` keeps the state and emits.
struct Emitting {
    ttl: Option<i64>,
}

fn output(topic: &str, key: &Bytes, n: i64) -> ProducerRecord {
    ProducerRecord::new(topic, Some(Bytes::from(n.to_string()))).key(key.clone())
}

impl Fold for Emitting {
    type State = St;
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<St>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        out.send(output("out", key, event.offset));
        match event.value.as_deref() {
            Some(b"quiet") if state.is_none() => Change::Keep,
            Some(b"same") => Change::Keep,
            _ => Picky.fold(key, state, event, out),
        }
    }
    fn encode(&self, s: &St) -> Bytes {
        NO_TTL.encode(s)
    }
    fn decode(&self, b: &[u8]) -> Result<St, crate::snapshot::BoxError> {
        NO_TTL.decode(b)
    }
    fn deadline(&self, _key: &Bytes, s: &St) -> Option<i64> {
        self.ttl.map(|t| s.seen + t)
    }
    /// Emits and moves the deadline (as a timer that emits must).
    fn on_deadline(&self, key: &Bytes, s: &mut St, now: i64, out: &mut Outputs) -> Change {
        if let Some(d) = self.deadline(key, s) {
            out.send(output("timer", key, d));
        }
        s.seen = now;
        Change::Keep
    }
}

/// The outputs of a wave, as (topic, value) strings.
fn outputs_of(w: &Wave) -> Vec<(String, String)> {
    w.writes
        .iter()
        .flat_map(|w| &w.outputs)
        .map(|o| {
            let v = o.value.as_deref().unwrap_or_default();
            (o.topic.to_string(), String::from_utf8_lossy(v).into_owned())
        })
        .collect()
}

/// A `Keep` that emits is an update: the envelope moves past the event (so a replay skips it) and the
/// event's offset is held until the snapshot and its output land together.
#[test]
fn a_keep_that_emits_moves_the_envelope_and_holds_the_offset() {
    let mut c = PartitionCore::new(0);
    c.restore(&NO_TTL, b("a"), Some(St { count: 1, seen: 0 }), 0);
    assert_eq!(
        c.handle_event(&Emitting { ttl: None }, &ev(5, "a", "same")),
        Folded::Changed
    );
    assert_eq!(c.committable(), 5);
    let w = c.poll_wave(&Emitting { ttl: None }).unwrap();
    assert_eq!(
        pairs(&w),
        vec![(
            b("a"),
            Some(envelope(5, &NO_TTL.encode(&St { count: 1, seen: 0 })))
        )]
    );
    assert_eq!(outputs_of(&w), vec![("out".into(), "5".into())]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 6);
    // Replayed after a restart from before it: skipped, so its output is not emitted twice.
    let mut again = PartitionCore::new(5);
    again.restore(&NO_TTL, b("a"), Some(St { count: 1, seen: 0 }), 5);
    assert_eq!(
        again.handle_event(&Emitting { ttl: None }, &ev(5, "a", "same")),
        Folded::Skipped
    );
    assert!(again.poll_wave(&Emitting { ttl: None }).is_none());
}

/// A key without state that emits is remembered as a grave carrying the event's offset; its outputs
/// ride with that grave, and once a commit passes it the tombstone follows and the key is forgotten.
#[test]
fn an_emit_on_an_absent_key_rides_a_grave_until_committed_past() {
    let f = Emitting { ttl: None };
    let mut c = PartitionCore::new(0);
    assert_eq!(c.handle_event(&f, &ev(3, "x", "quiet")), Folded::Changed);
    assert_eq!(c.committable(), 3);
    let w = c.poll_wave(&f).unwrap();
    assert_eq!(pairs(&w), vec![(b("x"), Some(grave(3)))]);
    assert_eq!(outputs_of(&w), vec![("out".into(), "3".into())]);
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 4);
    assert!(
        c.poll_wave(&f).is_none(),
        "no tombstone before the commit passes it"
    );
    c.handle_commit_landed(4);
    let w = c.poll_wave(&f).unwrap();
    assert_eq!(pairs(&w), vec![(b("x"), None)]);
    assert!(outputs_of(&w).is_empty());
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.remembered(), 0);
}

/// A delete that emits writes its grave with the outputs; a timer that emits persists the key even
/// on `Keep`, and its output rides with the snapshot whose state has the moved deadline.
#[test]
fn a_delete_and_a_timer_that_emit_ride_with_their_writes() {
    let f = Emitting { ttl: Some(10_000) };
    let mut c = PartitionCore::new(0);
    c.handle_event(&f, &ev(0, "a", "x"));
    c.handle_event(&f, &ev(1, "a", "x"));
    c.handle_event(&f, &ev(2, "a", "del")); // two events before it: a real delete
    let w = c.poll_wave(&f).unwrap();
    assert_eq!(pairs(&w), vec![(b("a"), Some(grave(2)))]);
    assert_eq!(
        outputs_of(&w),
        vec![
            ("out".into(), "0".into()),
            ("out".into(), "1".into()),
            ("out".into(), "2".into())
        ]
    );
    c.handle_wave_outcome(w.id, Landing::Landed);

    c.handle_event(&f, &ev(3, "b", "x")); // seen 3 000: due 13 000
    let w = c.poll_wave(&f).unwrap();
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.handle_timeout(&f, 13_000), 1);
    let w = c.poll_wave(&f).unwrap();
    assert_eq!(outputs_of(&w), vec![("timer".into(), "13000".into())]);
    let (_, value) = &pairs(&w)[0];
    let Ok(Opened::Live(_, payload)) = open_envelope(value.as_deref().unwrap()) else {
        panic!("a live snapshot");
    };
    assert_eq!(
        f.deadline(&b("b"), &f.decode(payload).unwrap()),
        Some(23_000),
        "the deadline moved"
    );
    assert_eq!(c.poll_timeout(), Some(23_000));
}

/// A wave whose writes land in part (a wave larger than the cap runs as several transactions, and the
/// middle one failed or ended unknown): the keys that landed are cleared, a failed write without
/// outputs is written again in place, and a failed write with outputs stops the partition for a
/// replay: nothing more is folded, written or committed.
#[test]
fn a_partly_landed_wave_rewrites_plain_writes_and_replays_for_outputs() {
    let f = Emitting { ttl: None };
    // Without outputs: keys 0..6, the middle two writes fail.
    let mut c = PartitionCore::new(0);
    for o in 0..6 {
        c.handle_event(&NO_TTL, &ev(o, &format!("k{o}"), "x"));
    }
    let w = c.poll_wave(&NO_TTL).unwrap();
    let failed: Vec<Bytes> = w.writes[2..4].iter().map(|w| w.key.clone()).collect();
    c.handle_wave_landings(w.id, Landing::Failed, |i| !(2..4).contains(&i));
    assert!(!c.needs_replay());
    let again = c.poll_wave(&NO_TTL).unwrap();
    let mut rewritten: Vec<Bytes> = again.writes.iter().map(|w| w.key.clone()).collect();
    rewritten.sort();
    let mut failed_sorted = failed.clone();
    failed_sorted.sort();
    assert_eq!(rewritten, failed_sorted, "only the failed writes go again");

    // With outputs: the same shape stops the partition.
    let mut c = PartitionCore::new(0);
    for o in 0..6 {
        c.handle_event(&f, &ev(o, &format!("k{o}"), "x"));
    }
    let w = c.poll_wave(&f).unwrap();
    c.handle_wave_landings(w.id, Landing::Failed, |i| !(2..4).contains(&i));
    assert!(c.needs_replay());
    assert!(c.poll_wave(&f).is_none());
    assert_eq!(c.poll_commit(), None);
    assert_eq!(c.handle_event(&f, &ev(6, "k6", "x")), Folded::Skipped);
}

/// A compacted snapshot log, a committed offset and a read_committed output topic, as the broker keeps
/// them: a write's snapshot and outputs land together or not at all.
#[derive(Default, Clone)]
struct DurableOut {
    state: Durable,
    outputs: Vec<(String, String)>,
}

impl DurableOut {
    fn apply(&mut self, wave: &Wave, landed: &[bool]) {
        for (w, _) in wave.writes.iter().zip(landed).filter(|(_, l)| **l) {
            match &w.value {
                Some(v) => self.state.log.insert(w.key.clone(), v.clone()),
                None => self.state.log.remove(&w.key),
            };
            for o in &w.outputs {
                let v = o.value.as_deref().unwrap_or_default();
                self.outputs
                    .push((o.topic.to_string(), String::from_utf8_lossy(v).into_owned()));
            }
        }
    }

    fn recover(&self) -> PartitionCore<St> {
        let mut core = PartitionCore::new(self.state.committed);
        for (k, v) in &self.state.log {
            match open_envelope(v).unwrap() {
                Opened::Live(offset, payload) => core.restore(
                    &Emitting { ttl: None },
                    k.clone(),
                    Some(NO_TTL.decode(payload).unwrap()),
                    offset,
                ),
                Opened::LiveInputs(..) | Opened::GraveInputs(..) => {
                    panic!("a one-input core wrote several inputs' envelope")
                }
                Opened::Grave(offset) => {
                    core.restore(&Emitting { ttl: None }, k.clone(), None, offset)
                }
            }
        }
        core
    }
}

/// Whatever the interleaving of folds, waves landing whole, in part or with unknown outcomes, commits,
/// crashes and the replays they force, every input event's output is committed exactly once, and the
/// state is the fold of all input.
#[test]
fn simulated_crashes_commit_every_output_exactly_once() {
    let f = Emitting { ttl: None };
    for seed in 1..=400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let input: Vec<Record> = (0..40)
            .map(|o| {
                let key = ["a", "b", "c", "d", "e"][rng.below(5) as usize];
                let value = ["x", "x", "del", "quiet", "same"][rng.below(5) as usize];
                ev(o, key, value)
            })
            .collect();
        let mut durable = DurableOut::default();
        let mut core = durable.recover();
        let mut wave: Option<Wave> = None;
        let mut trace = Vec::new();
        for _ in 0..200 {
            if core.needs_replay() {
                // The driver drops the lane and acquires it again: recovery from what is durable.
                core = durable.recover();
                trace.push(format!("replay from {}", durable.state.committed));
            }
            match rng.below(6) {
                0 | 1 => {
                    let p = core.position() as usize;
                    if p < input.len() {
                        core.handle_event(&f, &input[p]);
                        trace.push(format!("fold {p}"));
                    }
                }
                2 => {
                    if wave.is_none() {
                        wave = core.poll_wave(&f);
                    }
                }
                3 => {
                    if let Some(w) = wave.take() {
                        // Per write: landed and told so, failed, or landed with an unknown outcome.
                        let fates: Vec<u64> = w.writes.iter().map(|_| rng.below(4)).collect();
                        let landed: Vec<bool> = fates.iter().map(|f| *f != 0).collect();
                        let told: Vec<bool> = fates.iter().map(|f| *f >= 2).collect();
                        durable.apply(&w, &landed);
                        let overall = if told.iter().all(|t| *t) {
                            Landing::Landed
                        } else {
                            Landing::Failed
                        };
                        core.handle_wave_landings(w.id, overall, |i| told[i]);
                        trace.push(format!("wave landed={landed:?} told={told:?}"));
                    }
                }
                4 => {
                    if let Some(offset) = core.poll_commit() {
                        durable.state.committed = durable.state.committed.max(offset);
                        core.handle_commit_landed(offset);
                        trace.push(format!("commit {offset}"));
                    }
                }
                _ => {
                    if let Some(w) = wave.take() {
                        let landed = vec![rng.below(2) == 0; w.writes.len()];
                        durable.apply(&w, &landed);
                    }
                    core = durable.recover();
                    trace.push(format!("crash, resume at {}", durable.state.committed));
                }
            }
        }
        if let Some(w) = wave.take() {
            core.handle_wave_outcome(w.id, Landing::Failed);
        }
        if core.needs_replay() {
            core = durable.recover();
        }
        while (core.position() as usize) < input.len() {
            let p = core.position() as usize;
            core.handle_event(&f, &input[p]);
        }
        for _ in 0..2 {
            if let Some(w) = core.poll_wave(&f) {
                durable.apply(&w, &vec![true; w.writes.len()]);
                core.handle_wave_outcome(w.id, Landing::Landed);
            }
            let offset = core.committable();
            durable.state.committed = offset;
            core.handle_commit_landed(offset);
        }
        let mut seen: Vec<i64> = durable
            .outputs
            .iter()
            .map(|(_, v)| v.parse().unwrap())
            .collect();
        seen.sort();
        let expected: Vec<i64> = (0..input.len() as i64).collect();
        assert_eq!(seen, expected, "seed {seed}: every output once: {trace:#?}");
        assert_eq!(
            counts(&durable.recover()),
            fold_from_scratch(&f, &input),
            "seed {seed}: {trace:#?}"
        );
    }
}

/// Unfenced, outputs are handed out at once rather than held with their key, the key still holds the
/// event's offset until its write lands, and a lost delivery stops the partition for a replay.
#[test]
fn at_once_outputs_are_handed_out_and_a_lost_one_forces_a_replay() {
    let f = Emitting { ttl: None };
    let mut c = PartitionCore::new(0).emit_at_once();
    c.handle_event(&f, &ev(0, "a", "x"));
    c.handle_event(&f, &ev(1, "b", "quiet"));
    let now: Vec<_> = c.take_immediate().iter().map(|o| o.value.clone()).collect();
    assert_eq!(now, vec![Some(b("0")), Some(b("1"))]);
    assert!(c.take_immediate().is_empty());
    assert_eq!(c.held_output_bytes(), 0, "nothing is held with the keys");
    assert_eq!(
        c.committable(),
        0,
        "the keys hold their offsets until their writes land"
    );
    let w = c.poll_wave(&f).unwrap();
    assert!(outputs_of(&w).is_empty());
    c.handle_wave_outcome(w.id, Landing::Landed);
    assert_eq!(c.committable(), 2);
    c.handle_event(&f, &ev(2, "a", "x"));
    c.handle_outputs_lost();
    assert!(c.needs_replay());
    assert!(c.poll_wave(&f).is_none());
    assert_eq!(c.poll_commit(), None);
}

/// Counts events per key on stream time: each event emits its offset, and a key idle for `ttl` ms of
/// stream time expires, emitting how many events it had.
struct OnStreamTime {
    ttl: i64,
}

impl Fold for OnStreamTime {
    type State = St;
    fn fold(
        &self,
        key: &Bytes,
        state: &mut Option<St>,
        event: &Record,
        out: &mut Outputs,
    ) -> Change {
        out.send(output("event", key, event.offset));
        let s = state.get_or_insert(St { count: 0, seen: 0 });
        s.count += 1;
        s.seen = s.seen.max(event.timestamp);
        Change::Update
    }
    fn encode(&self, s: &St) -> Bytes {
        NO_TTL.encode(s)
    }
    fn decode(&self, b: &[u8]) -> Result<St, crate::snapshot::BoxError> {
        NO_TTL.decode(b)
    }
    fn deadline(&self, _key: &Bytes, s: &St) -> Option<i64> {
        Some(s.seen + self.ttl)
    }
    fn on_deadline(&self, key: &Bytes, s: &mut St, now: i64, out: &mut Outputs) -> Change {
        let value = format!("{} events, at {now}", s.count);
        out.send(ProducerRecord::new("expired", Some(Bytes::from(value))).key(key.clone()));
        Change::Delete
    }
    fn timer_clock(&self) -> crate::snapshot::TimerClock {
        crate::snapshot::TimerClock::Stream
    }
}

/// A wave's outputs as (key, topic, value) strings.
fn keyed_outputs_of(w: &Wave) -> Vec<(String, String, String)> {
    w.writes
        .iter()
        .flat_map(|w| &w.outputs)
        .map(|o| {
            let text =
                |b: Option<&Bytes>| String::from_utf8_lossy(b.map_or(&[][..], |b| b)).into_owned();
            (
                text(o.key.as_ref()),
                o.topic.to_string(),
                text(o.value.as_ref()),
            )
        })
        .collect()
}

/// An event at `offset` with timestamp `ts` (-1: none) for `key` (`None`: a null key).
fn timed(offset: i64, key: Option<&str>, ts: i64) -> Record {
    Record {
        offset,
        timestamp: ts,
        timestamp_type: TimestampType::CreateTime,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: Some(b("v")),
        headers: Vec::new(),
    }
}

/// Stream time moves with the highest timestamp (not with -1, not backwards, also on null keys); a
/// timer fires before the event that moved stream time past it, never by the wall clock, and a commit
/// carries the stream time just before its offset.
#[test]
fn stream_time_fires_timers_before_the_event_that_passes_them() {
    let f = OnStreamTime { ttl: 1_000 };
    let mut c = PartitionCore::new(0).stream_timers(None);
    assert_eq!(c.stream_time(), None);
    c.handle_event(&f, &timed(0, Some("a"), 5_000));
    assert_eq!(c.stream_time(), Some(5_000));
    c.handle_event(&f, &timed(1, Some("b"), -1));
    c.handle_event(&f, &timed(2, Some("b"), 4_000));
    assert_eq!(c.stream_time(), Some(5_000), "-1 and older events leave it");
    assert_eq!(
        c.handle_timeout(&f, i64::MAX),
        0,
        "the wall clock fires nothing"
    );
    assert_eq!(c.poll_timeout(), None);
    // b's deadline (4 000 + 1 000) is at stream time already: it waits for stream time to move.
    assert_eq!(c.state_of(b"b").map(|s| s.count), Some(2));
    c.handle_event(&f, &timed(3, None, 5_500));
    assert_eq!(c.stream_time(), Some(5_500), "a null-key event moves it");
    assert_eq!(
        c.state_of(b"b"),
        None,
        "b expired when stream time moved past 5 000"
    );
    assert!(c.state_of(b"a").is_some(), "a's deadline is 6 000");
    // The event at 6 500 is a's own: a expires first (it was idle past 6 000), then starts again.
    c.handle_event(&f, &timed(4, Some("a"), 6_500));
    assert_eq!(c.state_of(b"a").map(|s| s.count), Some(1));
    let w = c.poll_wave(&f).unwrap();
    let mut outs = outputs_of(&w);
    outs.sort();
    assert_eq!(
        outs,
        [
            ("event".into(), "0".into()),
            ("event".into(), "1".into()),
            ("event".into(), "2".into()),
            ("event".into(), "4".into()),
            ("expired".into(), "1 events, at 6500".into()),
            ("expired".into(), "2 events, at 5500".into()),
        ]
    );
    // Held at 0 (a's first event): a commit of 0 carries no stream time (none before offset 0); of
    // 3 (b's expiry, before the null-key event) the 5 000 reached before it; of the position, 6 500.
    assert_eq!(c.stream_time_at(0), None);
    assert_eq!(c.stream_time_at(3), Some(5_000));
    assert_eq!(c.stream_time_at(5), Some(6_500));
}

/// Whatever the interleaving of folds, waves, commits and crashes, an owner that resumes from the
/// committed offset with the stream time its commit carried fires every stream-time timer at the same
/// point of the input as one uninterrupted run: the committed outputs (each event's, and each expiry
/// with the count the key had) and the final state equal the uninterrupted run's.
#[test]
fn replays_fire_stream_time_timers_where_the_live_run_did() {
    let f = OnStreamTime { ttl: 3_000 };
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let input: Vec<Record> = (0..60)
            .map(|o| {
                let key = [Some("a"), Some("b"), Some("c"), None][rng.below(4) as usize];
                // Mostly forward in time, with stragglers and events without a timestamp.
                let ts = match rng.below(8) {
                    0 => -1,
                    1 => (o * 1_000 - 4_000).max(0),
                    _ => o * 1_000 + rng.below(2_000) as i64,
                };
                timed(o, key, ts)
            })
            .collect();

        // The uninterrupted run.
        let mut live = PartitionCore::new(0).stream_timers(None);
        let mut expected = Vec::new();
        for e in &input {
            live.handle_event(&f, e);
        }
        let w = live.poll_wave(&f).unwrap();
        expected.extend(keyed_outputs_of(&w));
        expected.sort();
        let final_live = counts(&live);

        // The same input through crashes: what is durable is the log, the committed offset and the
        // stream time its metadata carried.
        let mut log: HashMap<Bytes, Bytes> = HashMap::new();
        let (mut committed, mut committed_st) = (0i64, None);
        let mut outputs = Vec::new();
        let recover = |log: &HashMap<Bytes, Bytes>, committed: i64, st: Option<i64>| {
            let mut core = PartitionCore::new(committed).stream_timers(st);
            for (k, v) in log {
                match open_envelope(v).unwrap() {
                    Opened::Live(offset, payload) => {
                        core.restore(&f, k.clone(), Some(f.decode(payload).unwrap()), offset)
                    }
                    Opened::Grave(offset) => core.restore(&f, k.clone(), None, offset),
                    other => panic!("a one-input core wrote {other:?}"),
                }
            }
            core
        };
        let mut core = recover(&log, committed, committed_st);
        let mut trace = Vec::new();
        for _ in 0..300 {
            if core.needs_replay() {
                // A failed write carried outputs: the lane is acquired again from what is durable.
                core = recover(&log, committed, committed_st);
                trace.push(format!("replay from {committed} st={committed_st:?}"));
            }
            match rng.below(5) {
                0 | 1 => {
                    let p = core.position() as usize;
                    if p < input.len() {
                        core.handle_event(&f, &input[p]);
                        trace.push(format!("fold {p}"));
                    }
                }
                2 => {
                    if let Some(w) = core.poll_wave(&f) {
                        if rng.below(3) == 0 {
                            core.handle_wave_outcome(w.id, Landing::Failed);
                            trace.push("wave failed".to_string());
                        } else {
                            for ww in &w.writes {
                                match &ww.value {
                                    Some(v) => log.insert(ww.key.clone(), v.clone()),
                                    None => log.remove(&ww.key),
                                };
                            }
                            outputs.extend(keyed_outputs_of(&w));
                            core.handle_wave_outcome(w.id, Landing::Landed);
                            trace.push("wave landed".to_string());
                        }
                    }
                }
                3 => {
                    if let Some(offset) = core.poll_commit() {
                        committed = offset;
                        committed_st = core.stream_time_at(offset);
                        core.handle_commit_landed(offset);
                        trace.push(format!("commit {offset} st={committed_st:?}"));
                    }
                }
                _ => {
                    core = recover(&log, committed, committed_st);
                    trace.push(format!("crash, resume at {committed} st={committed_st:?}"));
                }
            }
        }
        if core.needs_replay() {
            core = recover(&log, committed, committed_st);
        }
        while (core.position() as usize) < input.len() {
            let p = core.position() as usize;
            core.handle_event(&f, &input[p]);
        }
        if let Some(w) = core.poll_wave(&f) {
            outputs.extend(keyed_outputs_of(&w));
            core.handle_wave_outcome(w.id, Landing::Landed);
        }
        outputs.sort();
        assert_eq!(outputs, expected, "seed {seed}: {trace:#?}");
        assert_eq!(counts(&core), final_live, "seed {seed}: {trace:#?}");
    }
}

/// The reset rule on every envelope version: a snapshot is contradicted by new offsets when it
/// accounts for an event at or past the new offset of any input; a one-offset envelope read by a
/// several-input reset counts for the first input only; another number of inputs has no answer.
#[test]
fn a_reset_contradicts_a_snapshot_that_reaches_any_new_offset() {
    let reaches = |stored: &Bytes, to: &[i64]| open_snapshot_value(stored).unwrap().reaches(to);
    let live = envelope(9, b"s");
    assert_eq!(reaches(&live, &[10]), Some(false));
    assert_eq!(reaches(&live, &[9]), Some(true));
    assert_eq!(reaches(&grave(4), &[4]), Some(true));
    // Written before the flow took a second input: the first input alone decides.
    assert_eq!(reaches(&live, &[10, 0]), Some(false));
    assert_eq!(reaches(&live, &[9, 100]), Some(true));
    let both = envelope_inputs(&[9, 3], b"s");
    assert_eq!(reaches(&both, &[10, 4]), Some(false));
    assert_eq!(
        reaches(&both, &[10, 3]),
        Some(true),
        "the second input reaches"
    );
    assert_eq!(
        reaches(&both, &[9, 4]),
        Some(true),
        "the first input reaches"
    );
    assert_eq!(reaches(&grave_inputs(&[-1, 5]), &[0, 6]), Some(false));
    assert_eq!(reaches(&grave_inputs(&[-1, 5]), &[0, 5]), Some(true));
    assert_eq!(reaches(&both, &[10]), None, "two inputs, one named");
    assert_eq!(reaches(&both, &[10, 4, 1]), None);
}

/// Lazy loading under a budget that evicts every clean key changes nothing a partition does: over
/// random events, timers (a TTL that deletes), deletes, waves that land or fail and commits, a core
/// that loads its keys from the image a previous owner left (with its overlay of landed writes) writes
/// exactly the waves, and ends with exactly the states, of a core that recovered every key eagerly.
#[cfg(feature = "disk-state")]
#[test]
fn lazy_loading_under_a_tiny_budget_writes_what_an_eager_core_writes() {
    use crate::snapshot::disk::{remove_image, PartitionImage, Put, GRAVE, NO_DEADLINE};
    /// Script with a TTL whose timer deletes a key with an even count and keeps one with an odd count
    /// (its deadline, already past, is then dropped until the key changes again).
    struct Mixed(Script);
    impl Fold for Mixed {
        type State = St;
        fn fold(&self, k: &Bytes, s: &mut Option<St>, e: &Record, o: &mut Outputs) -> Change {
            self.0.fold(k, s, e, o)
        }
        fn encode(&self, s: &St) -> Bytes {
            self.0.encode(s)
        }
        fn decode(&self, b: &[u8]) -> Result<St, crate::snapshot::BoxError> {
            self.0.decode(b)
        }
        fn deadline(&self, k: &Bytes, s: &St) -> Option<i64> {
            self.0.deadline(k, s)
        }
        fn on_deadline(&self, _k: &Bytes, s: &mut St, _now: i64, _o: &mut Outputs) -> Change {
            if s.count % 2 == 1 {
                Change::Keep
            } else {
                Change::Delete
            }
        }
    }
    let fold = Mixed(Script { ttl: Some(4_000) });
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let input: Vec<Record> = (0..120)
            .map(|o| {
                let key = keys[rng.below(keys.len() as u64) as usize];
                let value = match rng.below(8) {
                    0 => "del",
                    1 => "keep",
                    _ => "x",
                };
                ev(o, key, value)
            })
            .collect();
        // A previous owner folds the first part, every wave landing, and commits.
        let split = 30 + rng.below(40) as usize;
        let mut first = PartitionCore::new(0);
        let mut log: Vec<(Bytes, Option<Bytes>)> = Vec::new();
        for e in &input[..split] {
            first.handle_event(&fold, e);
            first.handle_timeout(&fold, e.timestamp);
            if rng.below(3) == 0 {
                if let Some(w) = first.poll_wave(&fold) {
                    log.extend(pairs(&w));
                    first.handle_wave_outcome(w.id, Landing::Landed);
                    let c = first.committable();
                    first.handle_commit_landed(c);
                }
            }
        }
        let committed = first.committed;
        // Its compacted log, as the image and as an eager recovery read it.
        let mut last: HashMap<Bytes, Option<Bytes>> = HashMap::new();
        for (k, v) in log {
            last.insert(k, v);
        }
        let dir =
            std::env::temp_dir().join(format!("snapfence-lazy-core-{seed}-{}", std::process::id()));
        let _ = remove_image(&dir);
        let image = PartitionImage::open(&dir, 1 << 20).unwrap();
        let puts: Vec<Put> = last
            .iter()
            .map(|(k, v)| match v {
                None => Put::remove(k),
                Some(v) => {
                    let deadline = match open_envelope(v).unwrap() {
                        Opened::Live(_, p) => fold
                            .deadline(k, &fold.decode(p).unwrap())
                            .unwrap_or(NO_DEADLINE),
                        _ => GRAVE,
                    };
                    Put::value(k, v, deadline)
                }
            })
            .collect();
        image.apply(puts, None, true).unwrap();
        let mut eager = PartitionCore::new(committed);
        for (k, v) in &last {
            if let Some(v) = v {
                eager.restore_envelope(&fold, k.clone(), v).unwrap();
            }
        }
        let mut lazy = PartitionCore::new(committed)
            .load_lazily(&fold, image, 1)
            .unwrap();
        // The new owner replays from the committed offset; both cores see the same calls.
        let mut waves = 0;
        for e in &input[committed as usize..] {
            let now = e.timestamp;
            // The image's index may name a deadline a key in memory has moved since: a tick that
            // finds nothing. Never a later one, which would let a timer wait.
            let never = |t: Option<i64>| t.unwrap_or(i64::MAX);
            assert!(
                never(lazy.poll_timeout()) <= never(eager.poll_timeout()),
                "seed {seed}: the next deadline at {}",
                e.offset
            );
            assert_eq!(
                eager.handle_timeout(&fold, now),
                lazy.handle_timeout(&fold, now),
                "seed {seed}: timers fired at {now}"
            );
            assert_eq!(
                eager.handle_event(&fold, e),
                lazy.handle_event(&fold, e),
                "seed {seed}: event {}",
                e.offset
            );
            if rng.below(3) == 0 {
                let (we, wl) = (eager.poll_wave(&fold), lazy.poll_wave(&fold));
                assert_eq!(
                    we.as_ref().map(keys_of),
                    wl.as_ref().map(keys_of),
                    "seed {seed}: the wave after event {}",
                    e.offset
                );
                if let (Some(we), Some(wl)) = (we, wl) {
                    waves += 1;
                    let outcome = if rng.below(5) == 0 {
                        Landing::Failed
                    } else {
                        Landing::Landed
                    };
                    eager.handle_wave_outcome(we.id, outcome);
                    lazy.handle_wave_outcome(wl.id, outcome);
                    if outcome == Landing::Landed {
                        let c = eager.committable();
                        assert_eq!(c, lazy.committable(), "seed {seed}");
                        eager.handle_commit_landed(c);
                        lazy.handle_commit_landed(c);
                    }
                }
            }
            assert!(lazy.take_load_failure().is_none(), "seed {seed}");
        }
        let mut want: Vec<(Bytes, St)> = eager
            .states()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        let mut got: Vec<(Bytes, St)> = lazy.all_states(&fold).unwrap().into_iter().collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want, "seed {seed}");
        let stats = lazy.lazy_stats().unwrap();
        assert!(
            waves == 0 || stats.evicted > 0,
            "seed {seed}: a budget of one byte evicts every clean key ({stats:?})"
        );
        drop(lazy);
        remove_image(&dir).unwrap();
    }
}

/// The key table's own memory (its pages of slots, its index) counts against the budget beside the
/// keys' estimates: a budget that the keys alone fit but the table does not keeps no clean key, and
/// one that fits both keeps them all.
#[cfg(feature = "disk-state")]
#[test]
fn the_key_tables_room_counts_against_the_budget() {
    use crate::snapshot::disk::{remove_image, PartitionImage};
    let fold = Script { ttl: None };
    // Five keys' estimates (key, snapshot, fixed share) take well under 2 KiB; one page of the table
    // takes over 64 KiB.
    for (budget, kept) in [(4 << 10, 0), (4 << 20, 5)] {
        let dir = std::env::temp_dir().join(format!(
            "snapfence-lazy-table-{budget}-{}",
            std::process::id()
        ));
        let _ = remove_image(&dir);
        let image = PartitionImage::open(&dir, 1 << 20).unwrap();
        let mut core = PartitionCore::new(0)
            .load_lazily(&fold, image, budget)
            .unwrap();
        for (o, k) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            core.handle_event(&fold, &ev(o as i64, k, "x"));
        }
        let wave = core.poll_wave(&fold).unwrap();
        core.handle_wave_outcome(wave.id, Landing::Landed);
        let c = core.committable();
        core.handle_commit_landed(c);
        let stats = core.lazy_stats().unwrap();
        assert_eq!(stats.in_memory, kept, "budget {budget}: {stats:?}");
        assert_eq!(stats.evicted, 5 - kept, "budget {budget}: {stats:?}");
        drop(core);
        remove_image(&dir).unwrap();
    }
}

/// A wave takes at most `WAVE_LIMIT` keys, with a memory budget or without; the rest wait for the next
/// waves of the same persist (`waves_owed`), and the committable offset stays below every key not yet
/// landed.
#[cfg(feature = "disk-state")]
#[test]
fn waves_under_a_budget_are_capped_and_the_commit_waits_for_the_rest() {
    use crate::snapshot::disk::{remove_image, PartitionImage};
    use crate::snapshot::fold_core::WAVE_LIMIT;
    let fold = Script { ttl: None };
    let dir = std::env::temp_dir().join(format!("snapfence-lazy-waves-{}", std::process::id()));
    let _ = remove_image(&dir);
    let image = PartitionImage::open(&dir, 1 << 20).unwrap();
    let mut core = PartitionCore::new(0)
        .load_lazily(&fold, image, 1 << 30)
        .unwrap();
    let n = WAVE_LIMIT + 100;
    for o in 0..n {
        core.handle_event(&fold, &ev(o as i64, &format!("k{o}"), "x"));
    }
    assert_eq!(core.waves_owed(), 2);
    let first = core.poll_wave(&fold).unwrap();
    assert_eq!(first.writes.len(), WAVE_LIMIT);
    core.handle_wave_outcome(first.id, Landing::Landed);
    let c = core.committable();
    assert!(c < n as i64, "committable {c} passes keys not written");
    assert_eq!(core.waves_owed(), 1);
    let second = core.poll_wave(&fold).unwrap();
    assert_eq!(second.writes.len(), 100);
    let mut keys: Vec<Bytes> = first
        .writes
        .iter()
        .chain(&second.writes)
        .map(|w| w.key.clone())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "every key written once");
    core.handle_wave_outcome(second.id, Landing::Landed);
    assert_eq!(core.committable(), n as i64);
    assert!(core.poll_wave(&fold).is_none());
    drop(core);
    remove_image(&dir).unwrap();
}

/// Without a budget, the same cap: the second wave of a persist takes the keys the first left.
#[test]
fn waves_in_memory_are_capped_too() {
    use crate::snapshot::fold_core::WAVE_LIMIT;
    let fold = Script { ttl: None };
    let mut core = PartitionCore::new(0);
    let n = 2 * WAVE_LIMIT + 1;
    for o in 0..n {
        core.handle_event(&fold, &ev(o as i64, &format!("k{o}"), "x"));
    }
    assert_eq!(core.waves_owed(), 3);
    let mut written = 0;
    while let Some(w) = core.poll_wave(&fold) {
        assert!(w.writes.len() <= WAVE_LIMIT);
        written += w.writes.len();
        core.handle_wave_outcome(w.id, Landing::Landed);
    }
    assert_eq!(written, n);
    assert_eq!(core.committable(), n as i64);
}
