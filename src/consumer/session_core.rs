//! One broker's fetch session (KIP-227) as a sans-IO machine: which partitions the next Fetch must
//! carry, which it must forget, and what the broker's answer does to the session.
//!
//! The broker caches, per session, what the client last sent for each partition (fetch offset, leader
//! epochs, topic id). An incremental Fetch then carries only the partitions whose entry differs from
//! that cache (added, or moved: a position advanced by records the last answer returned, a seek, a
//! new leader epoch) and lists the partitions to drop from it; the broker answers only for partitions
//! with something new (records, a moved watermark, an error). A member that owns many quiet
//! partitions so pays for the partitions that change, not for all of them, both ways.
//!
//! The broker does not advance its cached fetch offset by what it returned: a partition whose answer
//! carried records is sent again with its new position on the next request, which is what the
//! comparison against the cache does by itself.
//!
//! The session's partitions are exactly the partitions the driver fetches in a round. A partition the
//! driver does not fetch this round (paused, backing off, waiting for a reset) is forgotten, so the
//! broker never answers for a partition nobody asked about; it is added again when it is fetched.
//!
//! No I/O and no clock: the driver calls [`FetchSession::poll_request`] before a Fetch to this broker and
//! reports the outcome with [`FetchSession::handle_response`] or [`FetchSession::handle_failure`].
//! A request whose outcome was never reported (its future was dropped, its task died) leaves the
//! session in an unknown epoch; the next `poll_request` notices and starts over with a full fetch.
//!
//! # Method kinds and call order
//! `poll_request` (output: what the next Fetch carries), then exactly one of `handle_response` or
//! `handle_failure` (input) for it; `open` and `close` are the driver's commands.
//!
//! # References
//! - KIP-227 (fetch sessions: session id and epoch, full and incremental requests, forgotten topics,
//!   FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)
//! - KIP-516 (topic ids: Fetch v13+, FETCH_SESSION_TOPIC_ID_ERROR when a session's use of ids changes)

use std::collections::BTreeMap;

use super::fetch_core::FetchPartition;
use super::{TopicId, TopicPartition};
use crate::wire::ErrorCode;

/// Session id 0: no session.
const NO_SESSION: i32 = 0;
/// Epoch 0: a full request that creates a session (closing the one named, if any).
const INITIAL_EPOCH: i32 = 0;
/// Epoch -1: a full request outside any session, or the close of the one named.
const FINAL_EPOCH: i32 = -1;

/// The epoch after `epoch`: incremental epochs run from 1 and wrap back to 1, never to 0 or -1.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// What the broker holds for one partition of the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cached {
    topic_id: TopicId,
    fetch_offset: i64,
    current_leader_epoch: i32,
    last_fetched_epoch: i32,
}

impl Cached {
    fn of(p: &FetchPartition) -> Self {
        Cached {
            topic_id: p.topic_id,
            fetch_offset: p.fetch_offset,
            current_leader_epoch: p.current_leader_epoch,
            last_fetched_epoch: p.last_fetched_epoch,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Sessions are off for this reader: every request is full and sessionless (id 0, epoch -1).
    Sessionless,
    /// No session; the next request is full and asks for one. `replace` names a session the broker
    /// may still hold, closed by the same request.
    Idle { replace: Option<i32> },
    /// A session whose cache matches `cached` as of the last answer; the next request is sent at
    /// `epoch`.
    Open {
        id: i32,
        epoch: i32,
        uses_ids: bool,
        cached: BTreeMap<TopicPartition, Cached>,
    },
    /// A request is out. If it is answered without error, the broker's cache is `next`.
    Pending {
        /// The session the request was sent in (0 for a full request that asks for a new one).
        id: i32,
        /// The session a full request closed, to close again if the answer is lost.
        replaced: Option<i32>,
        epoch: i32,
        uses_ids: bool,
        next: BTreeMap<TopicPartition, Cached>,
    },
}

/// The session fields and partitions of the next Fetch to one broker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRequest {
    pub session_id: i32,
    pub epoch: i32,
    /// Full: `send` is every partition fetched; incremental: only those whose cached entry changed.
    pub full: bool,
    /// Whether topics go by id (Fetch v13+); the request must be sent at such a version.
    pub uses_ids: bool,
    pub send: Vec<FetchPartition>,
    /// Partitions to drop from the session (empty for a full request).
    pub forget: Vec<(TopicPartition, TopicId)>,
}

/// What the driver does with a Fetch answer, after the session read its top-level fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionVerdict {
    /// Use the partitions of the answer. `incremental`: a partition of the request missing from the
    /// answer had nothing new; otherwise every partition should be there.
    Use { incremental: bool },
    /// The broker did not recognise the session or its epoch (or its use of topic ids): nothing in the
    /// answer applies, positions did not move, and the next request is full. Fetch again at once.
    Reset(ErrorCode),
    /// Another top-level error: the whole request failed; back off.
    Failed(ErrorCode),
}

/// The fetch session with one broker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FetchSession {
    state: State,
}

impl FetchSession {
    /// A session machine; `enabled: false` sends every request full and outside any session.
    pub(crate) fn new(enabled: bool) -> Self {
        FetchSession {
            state: if enabled {
                State::Idle { replace: None }
            } else {
                State::Sessionless
            },
        }
    }

    /// The established session's id and the epoch its next request carries, if there is one.
    pub(crate) fn open(&self) -> Option<(i32, i32)> {
        match &self.state {
            State::Open { id, epoch, .. } => Some((*id, *epoch)),
            _ => None,
        }
    }

    /// The Fetch to send now for `wanted` (every partition to fetch from this broker this round);
    /// `uses_ids` says whether the request will go at Fetch v13+ (topics by id).
    pub(crate) fn poll_request(
        &mut self,
        wanted: &[FetchPartition],
        uses_ids: bool,
    ) -> SessionRequest {
        let next: BTreeMap<TopicPartition, Cached> = wanted
            .iter()
            .map(|p| (p.tp.clone(), Cached::of(p)))
            .collect();
        let state = std::mem::replace(&mut self.state, State::Sessionless);
        let (replace, open) = match state {
            State::Sessionless => {
                return SessionRequest {
                    session_id: NO_SESSION,
                    epoch: FINAL_EPOCH,
                    full: true,
                    uses_ids,
                    send: wanted.to_vec(),
                    forget: Vec::new(),
                };
            }
            State::Idle { replace } => (replace, None),
            // The last request's outcome was never reported: the broker may or may not have moved to
            // the next epoch, so no incremental request can be trusted. Close it and start again.
            State::Pending { id, replaced, .. } => {
                tracing::debug!(
                    session = id,
                    "fetch session outcome lost; starting a new session"
                );
                (if id != NO_SESSION { Some(id) } else { replaced }, None)
            }
            // A session created with names cannot continue with ids, nor the other way round.
            State::Open {
                id, uses_ids: was, ..
            } if was != uses_ids => (Some(id), None),
            State::Open {
                id, epoch, cached, ..
            } => (None, Some((id, epoch, cached))),
        };
        match open {
            Some((id, epoch, cached)) => {
                let send = wanted
                    .iter()
                    .filter(|p| cached.get(&p.tp) != Some(&Cached::of(p)))
                    .cloned()
                    .collect();
                // A partition whose topic id changed (the topic was recreated under its name, and
                // metadata now has the new id) is a different partition to the broker: the entry under
                // the old id is forgotten as well as the new one sent.
                let forget = cached
                    .iter()
                    .filter(|(tp, c)| next.get(*tp).is_none_or(|n| n.topic_id != c.topic_id))
                    .map(|(tp, c)| (tp.clone(), c.topic_id))
                    .collect();
                self.state = State::Pending {
                    id,
                    replaced: None,
                    epoch,
                    uses_ids,
                    next,
                };
                SessionRequest {
                    session_id: id,
                    epoch,
                    full: false,
                    uses_ids,
                    send,
                    forget,
                }
            }
            None => {
                self.state = State::Pending {
                    id: NO_SESSION,
                    replaced: replace,
                    epoch: INITIAL_EPOCH,
                    uses_ids,
                    next,
                };
                SessionRequest {
                    session_id: replace.unwrap_or(NO_SESSION),
                    epoch: INITIAL_EPOCH,
                    full: true,
                    uses_ids,
                    send: wanted.to_vec(),
                    forget: Vec::new(),
                }
            }
        }
    }

    /// The answer to the request `build` made: its top-level error code and session id.
    pub(crate) fn handle_response(&mut self, error: ErrorCode, session_id: i32) -> SessionVerdict {
        let state = std::mem::replace(&mut self.state, State::Sessionless);
        let State::Pending {
            id,
            replaced,
            epoch,
            uses_ids,
            next,
        } = state
        else {
            // Sessionless, or an answer nobody is waiting for (the machine never hands out two
            // requests at once): nothing to track.
            let sessionless = matches!(state, State::Sessionless);
            self.state = state;
            return match error {
                ErrorCode::None => SessionVerdict::Use { incremental: false },
                e if sessionless => SessionVerdict::Failed(e),
                e => SessionVerdict::Reset(e),
            };
        };
        let known = (id != NO_SESSION).then_some(id).or(replaced);
        match error {
            ErrorCode::None if epoch == INITIAL_EPOCH => {
                self.state = if session_id == NO_SESSION {
                    // The broker served the full request without a session (its cache is full, or
                    // sessions are off there); ask again next time.
                    State::Idle { replace: None }
                } else {
                    State::Open {
                        id: session_id,
                        epoch: next_epoch(INITIAL_EPOCH),
                        uses_ids,
                        cached: next,
                    }
                };
                SessionVerdict::Use { incremental: false }
            }
            ErrorCode::None if session_id != id => {
                // An incremental answer for another session: nothing in it can be placed.
                tracing::warn!(
                    sent = id,
                    answered = session_id,
                    "fetch answer names another session"
                );
                self.state = State::Idle { replace: Some(id) };
                SessionVerdict::Reset(ErrorCode::InvalidFetchSessionEpoch)
            }
            ErrorCode::None => {
                self.state = State::Open {
                    id,
                    epoch: next_epoch(epoch),
                    uses_ids,
                    cached: next,
                };
                SessionVerdict::Use { incremental: true }
            }
            // The broker no longer has it (evicted, restarted): nothing to close.
            ErrorCode::FetchSessionIdNotFound => {
                self.state = State::Idle { replace: None };
                SessionVerdict::Reset(error)
            }
            ErrorCode::InvalidFetchSessionEpoch | ErrorCode::FetchSessionTopicIdError => {
                self.state = State::Idle { replace: known };
                SessionVerdict::Reset(error)
            }
            e => {
                self.state = State::Idle { replace: known };
                SessionVerdict::Failed(e)
            }
        }
    }

    /// The request `build` made failed without an answer (transport, timeout): the broker may or may
    /// not have applied it, so the next request is full and replaces the session.
    pub(crate) fn handle_failure(&mut self) {
        self.state = match std::mem::replace(&mut self.state, State::Sessionless) {
            State::Sessionless => State::Sessionless,
            State::Idle { replace } => State::Idle { replace },
            State::Open { id, .. } => State::Idle { replace: Some(id) },
            State::Pending { id, replaced, .. } => State::Idle {
                replace: (id != NO_SESSION).then_some(id).or(replaced),
            },
        };
    }

    /// The session to close (its id; the close goes at epoch -1 with no partitions), if the broker may
    /// hold one. Afterwards the machine is idle: a later `build` asks for a new session.
    pub(crate) fn close(&mut self) -> Option<(i32, i32)> {
        let id = match std::mem::replace(&mut self.state, State::Sessionless) {
            State::Sessionless => return None,
            State::Idle { replace } => replace,
            State::Open { id, .. } => Some(id),
            State::Pending { id, replaced, .. } => (id != NO_SESSION).then_some(id).or(replaced),
        };
        self.state = State::Idle { replace: None };
        id.map(|id| (id, FINAL_EPOCH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: TopicId = TopicId([7; 16]);

    fn part(p: i32, offset: i64) -> FetchPartition {
        FetchPartition {
            tp: TopicPartition::new("t", p),
            topic_id: ID,
            fetch_offset: offset,
            current_leader_epoch: 1,
            last_fetched_epoch: -1,
            log_start_offset: -1,
        }
    }

    fn parts(offsets: &[i64]) -> Vec<FetchPartition> {
        offsets
            .iter()
            .enumerate()
            .map(|(i, o)| part(i as i32, *o))
            .collect()
    }

    fn sent(r: &SessionRequest) -> Vec<i32> {
        r.send.iter().map(|p| p.tp.partition).collect()
    }

    fn forgotten(r: &SessionRequest) -> Vec<i32> {
        r.forget.iter().map(|(tp, _)| tp.partition).collect()
    }

    /// An open session with partitions at `offsets`, id 42, the next request at epoch 1.
    fn opened(offsets: &[i64]) -> FetchSession {
        let mut s = FetchSession::new(true);
        let r = s.poll_request(&parts(offsets), true);
        assert_eq!((r.session_id, r.epoch, r.full), (0, 0, true));
        assert_eq!(
            s.handle_response(ErrorCode::None, 42),
            SessionVerdict::Use { incremental: false }
        );
        assert_eq!(s.open(), Some((42, 1)));
        s
    }

    /// The first request is full at epoch 0 and creates the session the broker names; the next one
    /// goes in that session at epoch 1 and carries no partition that did not change.
    #[test]
    fn full_fetch_creates_then_unchanged_partitions_are_omitted() {
        let mut s = opened(&[0, 5, 9]);
        let r = s.poll_request(&parts(&[0, 5, 9]), true);
        assert_eq!((r.session_id, r.epoch, r.full), (42, 1, false));
        assert!(r.send.is_empty() && r.forget.is_empty(), "{r:?}");
        assert_eq!(
            s.handle_response(ErrorCode::None, 42),
            SessionVerdict::Use { incremental: true }
        );
        assert_eq!(s.open(), Some((42, 2)));
    }

    /// A position that moved (records returned, a seek) or a new leader epoch is sent again; the rest
    /// is not.
    #[test]
    fn moved_partitions_are_sent_again() {
        let mut s = opened(&[0, 5, 9]);
        let mut next = parts(&[3, 5, 9]);
        next[2].current_leader_epoch = 2;
        let r = s.poll_request(&next, true);
        assert_eq!(sent(&r), vec![0, 2]);
        assert_eq!(r.send[0].fetch_offset, 3);
        s.handle_response(ErrorCode::None, 42);
        let r = s.poll_request(&next, true);
        assert!(r.send.is_empty(), "now cached: {r:?}");
    }

    /// Added partitions go in the incremental request; removed ones are forgotten, and only once.
    #[test]
    fn added_and_removed_partitions() {
        let mut s = opened(&[0, 5]);
        let mut next = vec![part(0, 0), part(2, 7)];
        let r = s.poll_request(&next, true);
        assert_eq!((sent(&r), forgotten(&r)), (vec![2], vec![1]));
        assert_eq!(r.forget[0].1, ID, "forgotten by id at v13+");
        s.handle_response(ErrorCode::None, 42);
        next.push(part(1, 5));
        let r = s.poll_request(&next, true);
        assert_eq!((sent(&r), forgotten(&r)), (vec![1], vec![]));
        s.handle_response(ErrorCode::None, 42);
        let r = s.poll_request(&[], true);
        assert_eq!(forgotten(&r), vec![0, 1, 2]);
    }

    /// A partition whose topic id changed is sent under the new id and forgotten under the old one.
    #[test]
    fn a_new_topic_id_forgets_the_old_one() {
        let mut s = opened(&[0, 5]);
        let mut next = parts(&[0, 5]);
        next[1].topic_id = TopicId([9; 16]);
        let r = s.poll_request(&next, true);
        assert_eq!((sent(&r), forgotten(&r)), (vec![1], vec![1]));
        assert_eq!((r.send[0].topic_id, r.forget[0].1), (TopicId([9; 16]), ID));
        s.handle_response(ErrorCode::None, 42);
        assert!(s.poll_request(&next, true).forget.is_empty());
    }

    /// FETCH_SESSION_ID_NOT_FOUND (evicted, broker restarted) makes the next request full with no
    /// session to close; INVALID_FETCH_SESSION_EPOCH and FETCH_SESSION_TOPIC_ID_ERROR close the old one
    /// in the same full request.
    #[test]
    fn session_errors_reset_to_a_full_fetch() {
        for (code, replace) in [
            (ErrorCode::FetchSessionIdNotFound, 0),
            (ErrorCode::InvalidFetchSessionEpoch, 42),
            (ErrorCode::FetchSessionTopicIdError, 42),
        ] {
            let mut s = opened(&[0, 5]);
            s.poll_request(&parts(&[0, 5]), true);
            assert_eq!(s.handle_response(code, 0), SessionVerdict::Reset(code));
            assert_eq!(s.open(), None);
            let r = s.poll_request(&parts(&[0, 5]), true);
            assert_eq!(
                (r.session_id, r.epoch, r.full),
                (replace, 0, true),
                "{code:?}"
            );
            assert_eq!(
                sent(&r),
                vec![0, 1],
                "a full request carries every partition"
            );
            s.handle_response(ErrorCode::None, 43);
            assert_eq!(s.open(), Some((43, 1)));
        }
    }

    /// Any other top-level error fails the request and the next one starts over.
    #[test]
    fn other_top_level_errors_fail_the_request() {
        let mut s = opened(&[0]);
        s.poll_request(&parts(&[0]), true);
        assert_eq!(
            s.handle_response(ErrorCode::UnknownServerError, 42),
            SessionVerdict::Failed(ErrorCode::UnknownServerError)
        );
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!((r.session_id, r.epoch, r.full), (42, 0, true));
    }

    /// A lost answer (transport failure, or a request whose outcome was never reported because its
    /// future was dropped) leaves the epoch unknown: the next request is full and replaces the session.
    #[test]
    fn lost_outcomes_start_over() {
        let mut s = opened(&[0]);
        s.poll_request(&parts(&[0]), true);
        s.handle_failure();
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!((r.session_id, r.epoch, r.full), (42, 0, true));
        // Never reported: built twice in a row.
        s.handle_response(ErrorCode::None, 50);
        s.poll_request(&parts(&[0]), true);
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!((r.session_id, r.epoch, r.full), (50, 0, true));
        // A full request lost before any session existed still closes the one it replaced.
        s.handle_failure();
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!((r.session_id, r.epoch), (50, 0));
    }

    /// Epochs run 1, 2, ... and wrap from i32::MAX back to 1, never to 0 (create) or -1 (close).
    #[test]
    fn epoch_wraps_to_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(i32::MAX - 1), i32::MAX);
        assert_eq!(next_epoch(i32::MAX), 1);
        let mut s = opened(&[0]);
        if let State::Open { epoch, .. } = &mut s.state {
            *epoch = i32::MAX;
        }
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!(r.epoch, i32::MAX);
        s.handle_response(ErrorCode::None, 42);
        assert_eq!(s.open(), Some((42, 1)));
    }

    /// A broker that serves the full request without a session (id 0) is asked again next time.
    #[test]
    fn broker_without_a_session_slot() {
        let mut s = FetchSession::new(true);
        s.poll_request(&parts(&[0]), true);
        assert_eq!(
            s.handle_response(ErrorCode::None, 0),
            SessionVerdict::Use { incremental: false }
        );
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!((r.session_id, r.epoch, r.full), (0, 0, true));
    }

    /// A session created with names is replaced, not continued, once topics go by id.
    #[test]
    fn switching_to_topic_ids_replaces_the_session() {
        let mut s = FetchSession::new(true);
        s.poll_request(&parts(&[0]), false);
        s.handle_response(ErrorCode::None, 42);
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!(
            (r.session_id, r.epoch, r.full, r.uses_ids),
            (42, 0, true, true)
        );
    }

    /// An incremental answer naming another session is not used.
    #[test]
    fn answer_for_another_session_resets() {
        let mut s = opened(&[0]);
        s.poll_request(&parts(&[0]), true);
        assert!(matches!(
            s.handle_response(ErrorCode::None, 7),
            SessionVerdict::Reset(_)
        ));
        assert_eq!(s.poll_request(&parts(&[0]), true).session_id, 42);
    }

    /// Close goes at epoch -1 for the session the broker may hold, once; a sessionless reader never
    /// has one, and its requests are full at (0, -1).
    #[test]
    fn close_and_sessionless() {
        let mut s = opened(&[0]);
        assert_eq!(s.close(), Some((42, -1)));
        assert_eq!(s.close(), None);
        let r = s.poll_request(&parts(&[0]), true);
        assert_eq!(
            (r.session_id, r.epoch),
            (0, 0),
            "a new session after a close"
        );

        let mut s = FetchSession::new(false);
        let r = s.poll_request(&parts(&[0, 1]), true);
        assert_eq!(
            (r.session_id, r.epoch, r.full, sent(&r)),
            (0, -1, true, vec![0, 1])
        );
        assert_eq!(
            s.handle_response(ErrorCode::None, 0),
            SessionVerdict::Use { incremental: false }
        );
        assert_eq!(s.close(), None);
    }
}
