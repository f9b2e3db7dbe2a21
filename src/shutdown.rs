//! The signals a service is stopped with, as one future for [`Flow::run`](crate::snapshot::Flow::run).
//!
//! Kubernetes, systemd and `docker stop` stop a process with SIGTERM and wait a grace period before
//! SIGKILL; a terminal sends SIGINT on Ctrl-C. A flow stopped by either runs its close: the final
//! flush, commit and leave, so the next owner starts at once and replays nothing. Without a handler,
//! SIGTERM kills the process on the spot: nothing is lost (the fence and the replay rule see to that),
//! but the group waits out the session timeout before it moves the partitions, and the successor
//! replays everything since the last commit.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Completes when the process receives SIGTERM or SIGINT (on other platforms, Ctrl-C). Made by
/// [`shutdown_signal`].
pub struct ShutdownSignal(Pin<Box<dyn Future<Output = ()> + Send>>);

impl std::fmt::Debug for ShutdownSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShutdownSignal")
    }
}

impl Future for ShutdownSignal {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// Installs handlers for SIGTERM and SIGINT and returns a future that completes on the first of them
/// to arrive after this call. The handlers are installed here, not when the future is first polled,
/// so a signal arriving between the two is not lost (and does not kill the process). Once installed,
/// the process no longer dies of these signals: whoever holds the future decides what to do.
///
/// Fails only when the handlers cannot be installed (no Tokio runtime with I/O enabled, or the
/// operating system refused).
///
/// ```no_run
/// # async fn demo(flow: snapfence::snapshot::Flow<impl snapfence::snapshot::Fold>) -> Result<(), Box<dyn std::error::Error>> {
/// // Folds until SIGTERM (Kubernetes, systemd) or Ctrl-C, then flushes, commits and leaves the group.
/// flow.run(snapfence::shutdown_signal()?).await?;
/// # Ok(()) }
/// ```
pub fn shutdown_signal() -> std::io::Result<ShutdownSignal> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(ShutdownSignal(Box::pin(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = which, "stopping on a signal");
        })))
    }
    #[cfg(not(unix))]
    {
        Ok(ShutdownSignal(Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("stopping on Ctrl-C");
        })))
    }
}
