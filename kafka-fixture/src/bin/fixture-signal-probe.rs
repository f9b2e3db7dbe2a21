//! A stand-in test process for the fixture's signal tests (kafka-fixture/tests/signals.rs): it takes its
//! folder under `<cache>/run` (set `SNAPFENCE_CACHE` to keep it private), starts and records a `sleep 600`
//! the way the fixture starts a JVM, prints what a test needs, then waits to be signalled.
//!
//! `fixture-signal-probe [MODE]`, one MODE:
//! - `plain` (default): nothing else; SIGTERM and SIGINT get the fixture's cleanup.
//! - `ignore-term`: SIGTERM is set to `SIG_IGN` before the fixture starts, which must leave it so.
//! - `tokio-int`: after the fixture starts, a `tokio::signal` stream takes SIGINT over (it chains to the
//!   fixture's handler); each SIGINT prints `caught SIGINT` and must neither end the process nor clean up.
//!
//! Output, one item a line: `dir <folder>`, `sleep <pid>`, `sigterm <how>` and `sigint <how>` (`default`,
//! `ignored` or `handler`: the dispositions once the fixture is set up), then `ready`.

use std::io::Write as _;
use std::process::Command;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "plain".into());
    if !matches!(mode.as_str(), "plain" | "ignore-term" | "tokio-int") {
        eprintln!("unknown mode {mode:?}: want plain, ignore-term or tokio-int");
        std::process::exit(2);
    }
    if mode == "ignore-term" {
        // SAFETY: SIG_IGN is not a function; no handler runs.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    let dir = kafka_fixture::procs::owner_dir();
    let mut sleep = Command::new("sleep");
    sleep.arg("600");
    let mut child = kafka_fixture::procs::spawn(sleep).expect("spawn sleep");
    let pid = child.id();
    kafka_fixture::procs::record(pid);
    // Reaps the sleep once the fixture's cleanup has killed it, as a test's fixture reaps its JVMs.
    std::thread::spawn(move || child.wait());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "dir {}", dir.display());
    let _ = writeln!(out, "sleep {pid}");
    let runtime = (mode == "tokio-int").then(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("tokio runtime")
    });
    let sigint = runtime.as_ref().map(|rt| {
        let _guard = rt.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .expect("tokio SIGINT stream")
    });
    let _ = writeln!(out, "sigterm {}", how(libc::SIGTERM));
    let _ = writeln!(out, "sigint {}", how(libc::SIGINT));
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    match (runtime, sigint) {
        (Some(rt), Some(mut sigint)) => rt.block_on(async {
            while sigint.recv().await.is_some() {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "caught SIGINT");
                let _ = out.flush();
            }
        }),
        _ => loop {
            std::thread::sleep(std::time::Duration::from_secs(600));
        },
    }
}

/// How `sig` is handled right now.
fn how(sig: libc::c_int) -> &'static str {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null `act` only reads.
    let handler = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old);
        old.sa_sigaction
    };
    match handler {
        libc::SIG_DFL => "default",
        libc::SIG_IGN => "ignored",
        _ => "handler",
    }
}
