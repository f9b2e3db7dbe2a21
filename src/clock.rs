//! The one monotonic clock the drivers read: tokio's.
//!
//! The I/O-free machines read no clock; the async drivers that feed them read this one and pass the
//! instant in. Because it is tokio's clock, a test under `#[tokio::test(start_paused = true)]` moves
//! every deadline a machine hands out (a transaction operation's timeout, a retry backoff, a linger)
//! by advancing time, without waiting for it. `std::time::Instant::now()` in a driver would not move,
//! and a paused test would see its deadlines never arrive (or a sleep and a deadline disagree).
//!
//! The wall clock (`SystemTime`, for timestamps and the snapshot flow's timers) is a different fact
//! and is not read here.

use std::time::Instant;

/// Now on tokio's clock, as the `std::time::Instant` the machines take. Outside a paused runtime it
/// is the system's monotonic clock; converting the deadlines back with
/// `tokio::time::Instant::from_std` is exact.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
