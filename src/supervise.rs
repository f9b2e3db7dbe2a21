//! Spawning background tasks whose failure someone hears about.
//!
//! The rule of the house: every spawned task's failure reaches its waiters as a typed error, and nothing
//! waits forever on a dead task. A bare `tokio::spawn` breaks it twice over: a panic is kept in a
//! `JoinHandle` nobody awaits, and whatever the task was going to release (a partition's sending lane,
//! an in-flight flag, a request the membership machine expects an answer to) stays taken.
//!
//! [`spawn`] runs the future and, if it panics or is dropped before finishing (aborted, or its runtime
//! shut down), calls a report closure exactly once with a [`Failure`] saying which. The closure is where
//! the owner puts the failure into its state machine, so the waiters learn of it the way they learn of
//! any other outcome. The panic is caught inside the task (rather than read from the `JoinHandle`) so
//! that the report names the panic's message and runs even when no one holds the handle.
//!
//! In test builds, [`Faults`] lets a test arm a named point inside a task so that the task panics there:
//! the only honest way to prove a supervisor works is to kill what it supervises, and a panic provoked by
//! crafted input would be a decoder bug, not a test.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// How a supervised task ended without finishing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The task panicked; the panic's message, when it had one.
    Panicked(String),
    /// The task was dropped before it finished (aborted, or its runtime shut down).
    Cancelled,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Panicked(message) => write!(f, "panicked: {message}"),
            Failure::Cancelled => f.write_str("was cancelled before it finished"),
        }
    }
}

impl Failure {
    /// How a task awaited through its `JoinHandle` (or a `JoinSet`) ended, for owners that await their
    /// tasks instead of spawning them through [`spawn`].
    pub(crate) fn of(e: tokio::task::JoinError) -> Failure {
        match e.try_into_panic() {
            Ok(payload) => Failure::Panicked(panic_message(payload.as_ref())),
            Err(_) => Failure::Cancelled,
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Spawns `task` on the current runtime; `report` runs once if it panics or is dropped unfinished.
///
/// `report` must not block: it runs inside the task (on a panic) or wherever the task is dropped.
pub(crate) fn spawn<F, R>(task: F, report: R) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
    R: FnOnce(Failure) + Send + 'static,
{
    tokio::spawn(Supervised {
        task: Box::pin(task),
        report: Some(report),
    })
}

struct Supervised<F, R: FnOnce(Failure)> {
    task: Pin<Box<F>>,
    /// `Some` until the task finished or its failure was reported.
    report: Option<R>,
}

// Nothing is pinned through the wrapper: the task is boxed and the report closure is only ever moved
// out and called.
impl<F, R: FnOnce(Failure)> Unpin for Supervised<F, R> {}

impl<F: Future<Output = ()>, R: FnOnce(Failure)> Future for Supervised<F, R> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.report.is_none() {
            return Poll::Ready(());
        }
        // Unwind safety: the task is never polled again after a panic (`report` is taken below), and
        // the state it shares with others is behind locks whose owners take poisoned locks over
        // deliberately, then learn of the failure through `report`.
        match catch_unwind(AssertUnwindSafe(|| this.task.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => {
                this.report = None;
                Poll::Ready(())
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                if let Some(report) = this.report.take() {
                    report(Failure::Panicked(message));
                }
                Poll::Ready(())
            }
        }
    }
}

impl<F, R: FnOnce(Failure)> Drop for Supervised<F, R> {
    fn drop(&mut self) {
        if let Some(report) = self.report.take() {
            report(Failure::Cancelled);
        }
    }
}

/// Test-only fault injection: named points inside tasks that panic once when armed.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Faults {
    armed: std::sync::Mutex<std::collections::HashMap<&'static str, u32>>,
}

#[cfg(test)]
impl Faults {
    /// The next `times` passes through `point` panic.
    pub(crate) fn arm(&self, point: &'static str, times: u32) {
        self.armed.lock().unwrap().insert(point, times);
    }

    /// How many armed passes through `point` are left: 0 once the fault has fired.
    pub(crate) fn pending(&self, point: &'static str) -> u32 {
        self.armed.lock().unwrap().get(point).copied().unwrap_or(0)
    }

    /// Panics if `point` is armed (and counts one use of it).
    pub(crate) fn hit(&self, point: &'static str) {
        let fire = {
            let mut armed = self.armed.lock().unwrap();
            match armed.get_mut(point) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        if fire {
            panic!("injected fault at {point}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn recorder() -> (
        Arc<Mutex<Vec<Failure>>>,
        impl FnOnce(Failure) + Send + 'static,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        (seen, move |f| s.lock().unwrap().push(f))
    }

    /// A supervised task that panics reports its panic message, once.
    #[tokio::test]
    async fn a_panic_is_reported_with_its_message() {
        let (seen, report) = recorder();
        let faults = Arc::new(Faults::default());
        faults.arm("here", 1);
        let f = faults.clone();
        spawn(async move { f.hit("here") }, report).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Failure::Panicked("injected fault at here".into())]
        );
    }

    /// A supervised task that finishes reports nothing; one aborted mid-way reports its cancellation.
    #[tokio::test]
    async fn completion_is_silent_and_abort_is_reported() {
        let (seen, report) = recorder();
        spawn(async {}, report).await.unwrap();
        assert!(seen.lock().unwrap().is_empty());
        let (seen, report) = recorder();
        let handle = spawn(std::future::pending(), report);
        tokio::task::yield_now().await;
        handle.abort();
        let _ = handle.await;
        assert_eq!(*seen.lock().unwrap(), vec![Failure::Cancelled]);
    }
}
