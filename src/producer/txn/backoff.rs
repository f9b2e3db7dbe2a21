//! The retry delays of the transaction machine.

use std::time::Duration;

use super::machine::{CONCURRENT_FLAT_ATTEMPTS, CONCURRENT_RETRY};
use crate::wire::ErrorCode;

/// Exponential backoff without jitter (the machine reads no randomness either).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The delay after CONCURRENT_TRANSACTIONS: [`CONCURRENT_RETRY`] for the first
    /// [`CONCURRENT_FLAT_ATTEMPTS`] retries, then doubling from there (never above the ordinary delay). The coordinator gives that answer while a state change of this very
    /// transactional id is in progress: the previous transaction's markers being written (a first
    /// enrolment sent right after a commit often races them), or the log append of an enrolment sent
    /// alongside.
    /// Both finish within milliseconds on a healthy cluster, so the ordinary delay (100 ms by default)
    /// would be most of a small transaction's time. The flat start follows the marker round closely
    /// (measured at 10-25 ms on a loaded one-node broker, docs/benchmarks.md): doubling from the first
    /// retry would overshoot its end by up to its own length (2+4+8 ms, then 16 more). The doubling
    /// after it still backs off from a coordinator whose markers are stuck.
    pub(crate) fn concurrent_delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(CONCURRENT_FLAT_ATTEMPTS - 1).min(16);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        CONCURRENT_RETRY
            .saturating_mul(factor)
            .min(self.delay(attempt))
    }

    /// The delay before resending a request answered `code`.
    pub(super) fn after(&self, code: ErrorCode, attempt: u32) -> Duration {
        if code == ErrorCode::ConcurrentTransactions {
            self.concurrent_delay(attempt)
        } else {
            self.delay(attempt)
        }
    }
}
