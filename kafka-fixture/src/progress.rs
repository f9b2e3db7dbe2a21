//! What a cluster start is doing, told to whoever started it.
//!
//! A first start on a fresh machine fetches the broker jars and records a class-data archive: half a
//! minute to a minute and a half of silence without this. The fixture never prints: it hands each step to
//! the caller's observer ([`KafkaCluster::start_observed`](crate::KafkaCluster::start_observed)), on the
//! thread that does the work, and the caller decides where the line goes. A CLI sends it over a channel to
//! the task that owns its output; the shared test clusters log it through `tracing` (target
//! `kafka_fixture`), which a test binary sees only if it installs a subscriber.
//!
//! Why not `eprintln!`: the start runs on a thread of its own (`spawn_blocking`, or the shared clusters'
//! starter), and a caller that holds `std::io::stderr().lock()` while it waits for the start would never
//! let that thread's write through: the start blocks on the lock, the caller blocks on the start.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A step of a cluster start that takes long enough to be worth telling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Fetching the broker jars from Maven Central (first start of a release on this machine).
    FetchJars,
    /// Recording the JVM's class-data archive with a throwaway broker (first start of a release).
    RecordArchive,
    /// Formatting and starting the nodes, then waiting until they are ready (every start).
    StartNodes,
}

impl Step {
    /// How long the step usually takes here (2 cores; the low end alone, the high end under load), as
    /// measured for the fixture's start-up table in the crate docs.
    pub fn typical(self) -> &'static str {
        match self {
            Step::FetchJars => "15-45 s",
            Step::RecordArchive => "10-30 s",
            Step::StartNodes => "4-20 s",
        }
    }
}

/// One thing a start did or is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// A step began.
    Began {
        /// Which step.
        step: Step,
        /// The Kafka release it is for.
        version: String,
        /// Where its result goes (the jar folder, the archive), if anywhere.
        into: Option<PathBuf>,
    },
    /// A step finished.
    Done {
        /// Which step.
        step: Step,
        /// How long it took.
        took: Duration,
    },
    /// A step that is only a speed-up failed; the start goes on without it.
    Skipped {
        /// Which step.
        step: Step,
        /// Why.
        reason: String,
    },
    /// A start failed and its folder (configs and logs) was kept for a post-mortem.
    KeptFailedStart {
        /// The folder.
        path: PathBuf,
    },
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Began {
                step,
                version,
                into,
            } => {
                let what = match step {
                    Step::FetchJars => {
                        format!("fetching the Kafka {version} jars from Maven Central (first run only)")
                    }
                    Step::RecordArchive => format!(
                        "recording a class-data archive for Kafka {version} so later starts are faster \
                         (first run only)"
                    ),
                    Step::StartNodes => format!("starting Kafka {version}"),
                };
                write!(f, "{what}, usually {}", step.typical())?;
                if let Some(into) = into {
                    write!(f, "; into {}", into.display())?;
                }
                Ok(())
            }
            Progress::Done { step, took } => {
                let what = match step {
                    Step::FetchJars => "fetched the jars",
                    Step::RecordArchive => "recorded the archive",
                    Step::StartNodes => "the broker is ready",
                };
                write!(f, "{what} in {:.1} s", took.as_secs_f64())
            }
            Progress::Skipped { step, reason } => match step {
                Step::RecordArchive => write!(
                    f,
                    "no class-data archive ({reason}); starting without it, a few seconds slower"
                ),
                _ => write!(f, "skipped {step:?}: {reason}"),
            },
            Progress::KeptFailedStart { path } => {
                write!(
                    f,
                    "the failed start's configs and logs are kept in {}",
                    path.display()
                )
            }
        }
    }
}

/// An observer of a start's steps. Called on the thread doing the start, so it must not block on
/// anything that thread's caller holds; sending into a channel is the usual body.
pub type Observer<'a> = &'a (dyn Fn(Progress) + Sync);

/// The observer of the shared test clusters: a `tracing` event per step.
pub(crate) fn trace(progress: Progress) {
    tracing::info!(target: "kafka_fixture", "{progress}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_runs_steps_read_as_sentences_with_how_long() {
        let began = Progress::Began {
            step: Step::FetchJars,
            version: "4.4.0".into(),
            into: Some(PathBuf::from("/c/kafka/4.4.0/libs")),
        };
        let text = began.to_string();
        assert!(text.contains("Kafka 4.4.0 jars"), "{text}");
        assert!(text.contains("15-45 s"), "{text}");
        assert!(text.ends_with("into /c/kafka/4.4.0/libs"), "{text}");
        let done = Progress::Done {
            step: Step::RecordArchive,
            took: Duration::from_millis(12_340),
        };
        assert_eq!(done.to_string(), "recorded the archive in 12.3 s");
    }
}
