//! Retry policy shared by every layer: a bounded exponential back-off and one reading of which error
//! codes mean "the target moved" versus "try the same place again".
//!
//! The producer, the consumer and the snapshot layer all meet the same errors (a leader moved, a
//! coordinator is loading); they hand their reading of a response to [`Client::call`](super::Client::call)
//! as a [`Verdict`] instead of each writing its own loop.
//!
//! # References
//! - Kafka's `retry.backoff.ms` / `retry.backoff.max.ms` (KIP-580: exponential back-off with jitter)

use std::time::Duration;

use crate::wire::ErrorCode;

/// A bounded exponential back-off. Sans-IO: it hands out delays and never sleeps or reads a clock.
///
/// Delay `n` (from 0) is `base * 2^n`, capped at `max`, then spread by ±20% jitter so that clients that
/// failed together do not retry together; after `max_retries` delays it returns `None`.
///
/// This is the crate's one back-off. The retry loops of `net` count with it ([`Backoff::next_delay`]);
/// the producer's I/O-free cores count attempts themselves and ask for the nominal delay of an attempt
/// without jitter (`delay`), so their tests stay deterministic.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    max_retries: u32,
    retries: u32,
    rng: u64,
}

impl Backoff {
    /// A back-off starting at `base`, capped at `max`, allowing `max_retries` retries.
    pub fn new(base: Duration, max: Duration, max_retries: u32) -> Self {
        Self::with_seed(base, max, max_retries, random_seed())
    }

    /// As [`Backoff::new`] with a fixed jitter seed, for reproducible tests.
    pub fn with_seed(base: Duration, max: Duration, max_retries: u32, seed: u64) -> Self {
        Backoff {
            base,
            max: max.max(base),
            max_retries,
            retries: 0,
            rng: seed,
        }
    }

    /// A back-off for a core that counts its own attempts and reads only [`Backoff::delay`]: no retry
    /// limit of its own and no random seed (the jitter of `next_delay` is not used there).
    pub(crate) fn exponential(base: Duration, max: Duration) -> Self {
        Self::with_seed(base, max, u32::MAX, 0)
    }

    /// The nominal delay before retry `attempt` (from 0): `base * 2^attempt`, capped at `max`, without
    /// jitter. Reads no state, so a caller may keep the attempt count where the retry lives.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << attempt.min(31))
            .min(self.max)
    }

    /// The delay before the next retry, or `None` when retries are used up.
    pub fn next_delay(&mut self) -> Option<Duration> {
        if self.retries >= self.max_retries {
            return None;
        }
        let raw = self.delay(self.retries);
        self.retries += 1;
        // Jitter factor in [0.8, 1.2).
        let unit = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        let jittered = raw.mul_f64(0.8 + 0.4 * unit);
        Some(jittered.min(self.max))
    }

    /// Retries handed out so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Starts over, e.g. after a success in a long-running loop.
    pub fn reset(&mut self) {
        self.retries = 0;
    }

    /// splitmix64: small, good enough for jitter, no dependency.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS once per process and perturbed per instance.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// What to do about a retriable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAction {
    /// The target moved (leader or coordinator changed, or is not known yet): forget the cached route,
    /// back off, resend to wherever fresh metadata says.
    Reroute,
    /// The target is right but busy (coordinator loading, concurrent transactions, a broker-side
    /// timeout): back off and resend to the same place.
    Backoff,
}

/// How `code` is retried, or `None` if it is success or not retriable.
pub fn retry_action(code: ErrorCode) -> Option<RetryAction> {
    match code {
        ErrorCode::NotLeaderOrFollower
        | ErrorCode::FencedLeaderEpoch
        | ErrorCode::UnknownLeaderEpoch
        | ErrorCode::UnknownTopicOrPartition
        | ErrorCode::LeaderNotAvailable
        | ErrorCode::NotCoordinator
        | ErrorCode::CoordinatorNotAvailable
        | ErrorCode::NotController
        | ErrorCode::KafkaStorageError => Some(RetryAction::Reroute),
        c if c.is_retriable() => Some(RetryAction::Backoff),
        _ => None,
    }
}

/// The caller's reading of one decoded response, handed back to [`Client::call`](super::Client::call).
#[derive(Debug)]
pub enum Verdict<T> {
    /// Finished; `call` returns this value.
    Done(T),
    /// The target moved: `call` forgets the route (leader or coordinator), backs off and resends.
    Reroute(ErrorCode),
    /// Transient: `call` backs off and resends to the same target.
    Retry(ErrorCode),
}

impl<T> Verdict<T> {
    /// The usual reading of a response's top-level error code: retriable codes become
    /// [`Verdict::Reroute`] or [`Verdict::Retry`] per [`retry_action`]; anything else (success
    /// included) is [`Verdict::Done`] with `value`, for the caller to inspect.
    pub fn from_code(code: i16, value: T) -> Self {
        let code = ErrorCode::from_code(code);
        match retry_action(code) {
            Some(RetryAction::Reroute) => Verdict::Reroute(code),
            Some(RetryAction::Backoff) => Verdict::Retry(code),
            None => Verdict::Done(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Jittered backoff delays double from the base, stay within 20% of nominal and under the cap, stop
    /// after the retry budget, and start over after a reset.
    #[test]
    fn delays_double_then_cap_and_stop() {
        let mut b = Backoff::with_seed(ms(100), ms(1000), 6, 42);
        let delays: Vec<_> = std::iter::from_fn(|| b.next_delay()).collect();
        assert_eq!(delays.len(), 6);
        let nominal = [100u64, 200, 400, 800, 1000, 1000];
        for (d, n) in delays.iter().zip(nominal) {
            let lo = ms(n).mul_f64(0.8);
            let hi = ms(n).mul_f64(1.2).min(ms(1000));
            assert!(*d >= lo && *d <= hi, "{d:?} not within {lo:?}..={hi:?}");
        }
        assert_eq!(b.next_delay(), None);
        assert_eq!(b.retries(), 6);
        b.reset();
        assert!(b.next_delay().is_some());
    }

    /// Jitter spreads clients' first delays apart, so they do not retry in lockstep.
    #[test]
    fn jitter_spreads_delays() {
        let firsts: std::collections::BTreeSet<_> = (0..20)
            .map(|seed| {
                Backoff::with_seed(ms(100), ms(1000), 1, seed)
                    .next_delay()
                    .unwrap()
            })
            .collect();
        assert!(firsts.len() > 10, "{firsts:?}");
    }

    /// A budget of zero retries yields no delay at all: the first failure is final.
    #[test]
    fn zero_retries_means_no_delay() {
        assert_eq!(Backoff::new(ms(1), ms(1), 0).next_delay(), None);
    }

    /// However many attempts have passed, a delay never exceeds the cap: doubling does not overflow.
    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        let mut b = Backoff::with_seed(Duration::from_secs(1), Duration::from_secs(5), 100, 1);
        for _ in 0..100 {
            assert!(b.next_delay().unwrap() <= Duration::from_secs(5));
        }
    }

    /// The nominal delay the producer's cores wait is deterministic: it doubles, caps at `max`, and
    /// does not overflow at any attempt count.
    #[test]
    fn nominal_delay_doubles_and_caps_without_jitter() {
        let b = Backoff::exponential(ms(100), ms(1000));
        let delays: Vec<_> = (0..6).map(|a| b.delay(a)).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000].map(ms));
        assert_eq!(b.delay(u32::MAX), ms(1000));
        assert_eq!(b.clone().delay(3), b.delay(3), "no state is consumed");
        // A maximum below the base is raised to it, as ClientConfig does.
        assert_eq!(Backoff::exponential(ms(50), ms(10)).delay(4), ms(50));
    }

    /// Codes that mean "ask someone else" reroute, codes that mean "busy, ask again" back off, and
    /// success or a non-retriable code is final.
    #[test]
    fn routing_codes_reroute_and_busy_codes_back_off() {
        assert_eq!(
            retry_action(ErrorCode::NotLeaderOrFollower),
            Some(RetryAction::Reroute)
        );
        assert_eq!(
            retry_action(ErrorCode::FencedLeaderEpoch),
            Some(RetryAction::Reroute)
        );
        assert_eq!(
            retry_action(ErrorCode::NotCoordinator),
            Some(RetryAction::Reroute)
        );
        assert_eq!(
            retry_action(ErrorCode::CoordinatorLoadInProgress),
            Some(RetryAction::Backoff)
        );
        assert_eq!(
            retry_action(ErrorCode::ConcurrentTransactions),
            Some(RetryAction::Backoff)
        );
        assert_eq!(retry_action(ErrorCode::None), None);
        assert_eq!(retry_action(ErrorCode::TopicAuthorizationFailed), None);
        assert!(matches!(
            Verdict::from_code(ErrorCode::NotCoordinator.code(), ()),
            Verdict::Reroute(ErrorCode::NotCoordinator)
        ));
        assert!(matches!(Verdict::from_code(0, 7), Verdict::Done(7)));
    }
}
