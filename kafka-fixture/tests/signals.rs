//! The fixture cleans up when its process is stopped with SIGTERM or SIGINT (layer 4 of the `procs` module
//! docs), and leaves a signal alone that the program handles itself. Each test runs the
//! `fixture-signal-probe` binary as the test process, with a cache folder of its own so no other test
//! process's sweep can remove the probe's folder or kill its `sleep` and make a test pass for the wrong
//! reason. No broker and no JVM: the probe records a `sleep` the way the fixture records a JVM.

use std::io::BufRead as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kafka_fixture::procs::start_time;

/// How long a probe may take to start or to end, and the recorded `sleep` to die.
const LIMIT: Duration = Duration::from_secs(10);
/// How long a probe must stay up after a signal the fixture must not act on.
const STAYS_UP: Duration = Duration::from_millis(1500);

/// A running probe. Dropping it SIGKILLs the probe and its `sleep` and deletes the cache folder, so a failed
/// test leaves nothing behind.
struct Probe {
    child: Child,
    lines: mpsc::Receiver<String>,
    cache: PathBuf,
    /// Whether dropping this probe deletes `cache` (not when another probe is to use it after this one).
    owns_cache: bool,
    dir: PathBuf,
    sleep: u32,
    sleep_started: u64,
    sigterm: String,
    sigint: String,
}

impl Probe {
    fn start(mode: &str) -> Probe {
        let cache =
            std::env::temp_dir().join(kafka_fixture::unique(&format!("snapfence-signal-{mode}")));
        Probe::start_in(mode, cache, true)
    }

    fn start_in(mode: &str, cache: PathBuf, owns_cache: bool) -> Probe {
        std::fs::create_dir_all(&cache).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fixture-signal-probe"))
            .arg(mode)
            .env("SNAPFENCE_CACHE", &cache)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fixture-signal-probe");
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut probe = Probe {
            child,
            lines,
            cache,
            owns_cache,
            dir: PathBuf::new(),
            sleep: 0,
            sleep_started: 0,
            sigterm: String::new(),
            sigint: String::new(),
        };
        loop {
            let line = probe.next_line("`ready`");
            let (key, value) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            match key {
                "dir" => probe.dir = PathBuf::from(value),
                "sleep" => probe.sleep = value.parse().expect("sleep pid"),
                "sigterm" => probe.sigterm = value.to_owned(),
                "sigint" => probe.sigint = value.to_owned(),
                "ready" => break,
                _ => panic!("unexpected probe output {line:?}"),
            }
        }
        assert!(
            probe.dir.starts_with(probe.cache.join("run")),
            "probe folder {} outside its cache {}",
            probe.dir.display(),
            probe.cache.display()
        );
        assert!(
            probe.dir.is_dir(),
            "{} was not created",
            probe.dir.display()
        );
        assert!(probe.sleep > 0, "the probe printed no sleep pid");
        probe.sleep_started = start_time(probe.sleep).expect("the recorded sleep runs");
        probe
    }

    /// The next stdout line, within [`LIMIT`].
    fn next_line(&self, waiting_for: &str) -> String {
        self.lines.recv_timeout(LIMIT).unwrap_or_else(|e| {
            panic!("probe printed no line within {LIMIT:?} ({e}) while waiting for {waiting_for}")
        })
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory effects.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }

    /// Waits (bounded) for the probe to end.
    fn wait(&mut self) -> ExitStatus {
        let until = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < until,
                "the probe still runs {LIMIT:?} after the signal; its folder {} {}",
                self.dir.display(),
                if self.dir.exists() {
                    "is still there"
                } else {
                    "is gone"
                }
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts the probe is still running [`STAYS_UP`] from now.
    fn assert_stays_up(&mut self, after: &str) {
        let until = Instant::now() + STAYS_UP;
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the probe ended ({status}) after {after}; its folder {} {}",
                    self.dir.display(),
                    if self.dir.exists() {
                        "is still there"
                    } else {
                        "is gone"
                    }
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the recorded `sleep` still runs (a zombie waiting for its dead parent to be reaped by init
    /// counts as gone).
    fn sleep_runs(&self) -> bool {
        if start_time(self.sleep) != Some(self.sleep_started) {
            return false;
        }
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.sleep)).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        !matches!(state, None | Some("Z" | "X"))
    }

    /// Asserts (bounded) that the recorded `sleep` is gone.
    fn assert_sleep_gone(&self) {
        let until = Instant::now() + LIMIT;
        while self.sleep_runs() {
            assert!(
                Instant::now() < until,
                "the recorded sleep {} still runs {LIMIT:?} after its owner ended",
                self.sleep
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Signals the probe with `sig` and checks the fixture's cleanup: the probe ends killed by `sig`, its
    /// folder is gone and its recorded process too.
    fn assert_cleaned_up_by(mut self, sig: libc::c_int) {
        self.signal(sig);
        let status = self.wait();
        assert_eq!(
            status.signal(),
            Some(sig),
            "the probe should end killed by signal {sig}, not {status}"
        );
        let left: Vec<_> = std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            !self.dir.exists(),
            "signal {sig} left the probe's folder {} behind, holding {left:?}",
            self.dir.display()
        );
        self.assert_sleep_gone();
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.sleep_runs() {
            // SAFETY: kill has no memory effects; the start time was checked just above.
            unsafe {
                libc::kill(self.sleep as libc::pid_t, libc::SIGKILL);
            }
        }
        if self.owns_cache {
            let _ = std::fs::remove_dir_all(&self.cache);
        }
    }
}

#[test]
fn sigterm_kills_the_recorded_processes_and_deletes_the_folder() {
    let probe = Probe::start("plain");
    assert_eq!(
        (probe.sigterm.as_str(), probe.sigint.as_str()),
        ("handler", "handler"),
        "the fixture takes both signals when nobody has them"
    );
    probe.assert_cleaned_up_by(libc::SIGTERM);
}

#[test]
fn sigint_kills_the_recorded_processes_and_deletes_the_folder() {
    Probe::start("plain").assert_cleaned_up_by(libc::SIGINT);
}

/// A program that ignores SIGTERM before the fixture starts keeps ignoring it; SIGINT, which it left at
/// its default, still cleans up.
#[test]
fn an_ignored_sigterm_stays_ignored() {
    let mut probe = Probe::start("ignore-term");
    assert_eq!(probe.sigterm, "ignored", "the fixture replaced SIG_IGN");
    assert_eq!(probe.sigint, "handler");
    probe.signal(libc::SIGTERM);
    probe.assert_stays_up("an ignored SIGTERM");
    assert!(
        probe.dir.is_dir(),
        "an ignored SIGTERM deleted the probe's folder {}",
        probe.dir.display()
    );
    assert!(
        probe.sleep_runs(),
        "an ignored SIGTERM killed the recorded sleep"
    );
    probe.assert_cleaned_up_by(libc::SIGINT);
}

/// tokio::signal takes SIGINT over after the fixture; signal-hook-registry still calls the fixture's
/// handler on every SIGINT (it chains to the handler it replaced), and the fixture must then leave the
/// signal to tokio: no cleanup, no kill. SIGTERM, which nobody took over, still cleans up.
#[test]
fn a_sigint_taken_over_by_tokio_later_is_left_to_tokio() {
    let mut probe = Probe::start("tokio-int");
    assert_eq!(probe.sigint, "handler");
    for round in 1..=2 {
        probe.signal(libc::SIGINT);
        let line = probe.next_line("`caught SIGINT`");
        assert_eq!(line, "caught SIGINT", "round {round}");
        probe.assert_stays_up("a SIGINT that tokio handles");
        assert!(
            probe.dir.is_dir(),
            "a SIGINT handled by tokio deleted the probe's folder {}",
            probe.dir.display()
        );
        assert!(
            probe.sleep_runs(),
            "a SIGINT handled by tokio killed the recorded sleep"
        );
    }
    probe.assert_cleaned_up_by(libc::SIGTERM);
}

/// SIGKILL cannot be handled: the folder stays (the recorded process dies by its parent-death signal), and
/// the next process that uses the same cache sweeps it.
#[test]
fn a_sigkilled_runs_folder_is_swept_by_the_next_run() {
    let cache = std::env::temp_dir().join(kafka_fixture::unique("snapfence-signal-sigkill"));
    let mut first = Probe::start_in("plain", cache.clone(), false);
    first.signal(libc::SIGKILL);
    let status = first.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    assert!(
        first.dir.is_dir(),
        "nothing can clean up after SIGKILL, yet {} is gone: the test proves nothing",
        first.dir.display()
    );
    first.assert_sleep_gone();
    let left = first.dir.clone();
    drop(first);

    let second = Probe::start_in("plain", cache, true);
    assert_ne!(second.dir, left);
    assert!(
        !left.exists(),
        "the next run did not sweep the SIGKILLed run's folder {}",
        left.display()
    );
    second.assert_cleaned_up_by(libc::SIGTERM);
}
