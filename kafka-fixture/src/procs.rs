//! Child JVMs that never outlive the test process.
//!
//! Four layers, because each one alone has a hole:
//! 1. Every JVM runs in its own process group (its pgid is its pid), so a signal to `-pid` also reaches
//!    anything the JVM forks, and a terminal's Ctrl-C does not hit the broker before the test process.
//! 2. `PR_SET_PDEATHSIG(SIGKILL)`: the kernel kills the JVM when the thread that forked it exits. That is the
//!    forking *thread*, not the process, so every child is forked by one dedicated spawner thread that lives
//!    as long as the process (a test thread would kill its brokers when the test that started them ended).
//!    This covers a panic, `process::exit` at the end of the test binary, and a SIGKILL of the test process.
//! 3. Pid files. Each test process owns `<cache>/run/<pid>.<starttime>/`, and every JVM it starts is recorded
//!    there as `jvm-<pid>.pid` holding the JVM's own start time. At start-up the fixture sweeps the folders of
//!    owners that are gone and kills only recorded JVMs whose start time still matches, so a recycled pid is
//!    never touched. This catches what (2) cannot: a JVM forked in the instant its parent died. A normal
//!    exit does not wait for the next run: an `atexit` hook kills the recorded JVMs and deletes the folder.
//! 4. SIGTERM and SIGINT (`timeout`, a CI job's cancel, Ctrl-C). Their default action ends the process
//!    without `exit`, so the `atexit` hook never runs and the folder (over 100 MB with a broker's data)
//!    stays until a later run sweeps it. When [`owner_dir`] is first used, for each of the two signals
//!    whose disposition is still `SIG_DFL`, the fixture installs a handler that only writes the signal
//!    number to a self-pipe (async-signal-safe: no allocation, no lock). A dedicated thread reads it,
//!    runs the `atexit` hook's cleanup, restores `SIG_DFL` and sends the signal to the process again,
//!    so it still ends "killed by SIGTERM/SIGINT" as whoever sent it expects. The cleanup runs once:
//!    whichever of the hook and the thread comes second waits for the first, then does nothing.
//!
//!    A signal the program already handles or ignores when the fixture starts is left alone: the
//!    program keeps its behaviour. A program may also take a signal over *after* the fixture did:
//!    signal-hook-registry (behind `tokio::signal`) saves the handler it replaces and calls it first on
//!    every delivery, before its own actions, so the fixture's handler still runs on each Ctrl-C. That
//!    is why the thread looks up the signal's disposition again before it acts: when it is no longer
//!    the fixture's handler, someone took the signal over, and the thread does nothing (no cleanup, no
//!    kill); what the signal means is then that program's business, and the `atexit` hook or the next
//!    run's sweep cleans up. A signal that arrives in the instant between a takeover and that check is
//!    treated as the newcomer's.
//!
//! A server whose children leave its process group (PostgreSQL's postmaster makes every child a session
//! leader with `setsid`, so a signal to the postmaster's group reaches only the postmaster) is recorded with
//! [`record_server`] instead: its pid file also names its command and the folder it runs in, and the sweep
//! then also kills every process of that command whose working directory is inside the folder (every
//! PostgreSQL process works in its data directory). A server folder outside this process's own folder (see
//! [`record_folder`]) is deleted by the sweep after its processes are gone.
//!
//! # References
//! - prctl(2) `PR_SET_PDEATHSIG`; proc(5) `/proc/<pid>/stat` field 22 (`starttime`), `/proc/<pid>/cwd`,
//!   `/proc/<pid>/comm`
//! - sigaction(2) (a null `act` only reads the disposition); signal-safety(7), the functions a handler
//!   may call; pipe(2) `O_CLOEXEC`, `O_NONBLOCK`
//! - signal-hook-registry 1.4: the docs of `register`, and `Slot::new` and `handler` in its lib.rs (the
//!   handler it replaces is kept and called on each delivery before the registered actions)

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` in its own process group from the long-lived spawner thread, with SIGKILL as its parent-death
/// signal.
pub fn spawn(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("kafka-fixture-spawner".into())
                .spawn(move || {
                    // The sender lives in a static, so `recv` never fails and this thread never returns:
                    // its exit would SIGKILL every broker it ever started.
                    while let Ok((mut cmd, reply)) = rx.recv() {
                        let _ = reply.send(spawn_here(&mut cmd));
                    }
                })
                .expect("cannot start the fixture's spawner thread");
            Mutex::new(tx)
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.send((cmd, reply_tx))
        .map_err(|_| io::Error::other("fixture spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("fixture spawner thread dropped the request"))?
}

fn spawn_here(cmd: &mut Command) -> io::Result<Child> {
    // SAFETY: getpid is async-signal-safe and is read before the fork.
    let parent = unsafe { libc::getpid() };
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and only calls prctl and getppid, which are
    // async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then no signal will ever come.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent died during spawn"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to the process group led by `pid`. Errors (the group is gone) are ignored: every caller
/// wants the group dead, stopped or running, and a missing group already is the first.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
}

/// Waits until every thread of `pid` is in the stopped state, or `timeout` passes; returns whether it got
/// there. SIGSTOP is asynchronous: `kill` returns once the signal is queued, and a thread that is running or
/// waiting for a CPU goes on until it next enters the kernel, so on a busy machine a "paused" broker can
/// still read and answer a request for a few milliseconds. A gone process counts as stopped.
pub fn wait_stopped(pid: u32, timeout: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + timeout;
    loop {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        let running = tasks.filter_map(|t| t.ok()).any(|t| {
            fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                // 'T' is stopped by a signal, 't' by a tracer; 'Z' and 'X' are gone.
                let state = stat_fields(&stat).and_then(|mut f| f.next());
                !matches!(state, Some("T" | "t" | "Z" | "X"))
            })
        });
        if !running {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The fields of a `/proc/<pid>/stat` (or task stat) line from field 3 (state) on. The command name
/// (field 2) may hold spaces and parentheses; the fields after the last ')' are plain.
fn stat_fields(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// Kernel start time of `pid` (clock ticks since boot), the pid's identity across recycling.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // starttime is field 22, the 20th from the state.
    stat_fields(&stat)?.nth(19)?.parse().ok()
}

/// This process's folder under `<cache>/run`, created on first use (and the first use sweeps stale ones).
pub fn owner_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let run = crate::jars::cache_root().join("run");
        let _ = fs::create_dir_all(&run);
        sweep(&run);
        let me = std::process::id();
        let dir = run.join(format!("{me}.{}", start_time(me).unwrap_or(0)));
        let _ = fs::create_dir_all(&dir);
        register_exit_cleanup();
        install_signal_cleanup(&dir);
        dir
    })
}

/// Records a started JVM; returns the pid file to remove when the JVM is reaped.
pub fn record(pid: u32) -> PathBuf {
    let file = owner_dir().join(format!("jvm-{pid}.pid"));
    let _ = fs::write(&file, format!("{pid} {}\n", start_time(pid).unwrap_or(0)));
    file
}

/// Records a started server whose children leave its process group: besides the server itself (killed by
/// its process group, like a JVM), a sweep kills every process named `comm` (as in `/proc/<pid>/comm`)
/// whose working directory is `folder` or inside it. Returns the pid file to remove when the server and its
/// children are gone.
pub fn record_server(pid: u32, comm: &str, folder: &Path) -> PathBuf {
    let file = owner_dir().join(format!("server-{pid}.pid"));
    let _ = fs::write(&file, server_record(pid, comm, folder));
    file
}

/// The text of a server pid file: `pid starttime`, the command name and the folder, one a line.
fn server_record(pid: u32, comm: &str, folder: &Path) -> Vec<u8> {
    let folder = fs::canonicalize(folder).unwrap_or_else(|_| folder.to_owned());
    let mut text = format!("{pid} {}\n{comm}\n", start_time(pid).unwrap_or(0)).into_bytes();
    text.extend_from_slice(folder.as_os_str().as_bytes());
    text.push(b'\n');
    text
}

/// Records a folder outside this process's own folder (which is deleted with it anyway), to be deleted when
/// this process is gone, after the recorded processes are killed. Returns the record to remove once the
/// folder is deleted.
pub fn record_folder(folder: &Path) -> PathBuf {
    let name = folder
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = owner_dir().join(format!("dir-{name}.path"));
    let _ = fs::write(&file, folder.as_os_str().as_bytes());
    file
}

/// [`kill_by_cwd`] again and again until none is left or `timeout` passes: a process may fork another in
/// the moment of one pass, and a killed one takes a moment to go.
pub fn kill_all_by_cwd(folder: &Path, comm: &str, timeout: std::time::Duration) {
    let until = std::time::Instant::now() + timeout;
    while kill_by_cwd(folder, comm) > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SIGKILLs every process named `comm` whose working directory is `folder` or inside it, other than this
/// process; returns how many were signalled. A process that already exited (a zombie has no working
/// directory) is not counted, so callers can poll this until it returns 0.
pub fn kill_by_cwd(folder: &Path, comm: &str) -> usize {
    let folder = fs::canonicalize(folder).unwrap_or_else(|_| folder.to_owned());
    // The kernel keeps at most 15 bytes of the command name.
    let comm = &comm.as_bytes()[..comm.len().min(15)];
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id();
    let mut signalled = 0;
    for entry in entries.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid <= 1 || pid == me {
            continue;
        }
        let named = fs::read(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.strip_suffix(b"\n").unwrap_or(&c) == comm);
        if !named {
            continue;
        }
        // Unreadable for another user's process unless root; a folder deleted under a process reads as
        // "<path> (deleted)".
        let Ok(cwd) = fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        let bytes = cwd.as_os_str().as_bytes();
        let cwd = Path::new(OsStr::from_bytes(
            bytes.strip_suffix(b" (deleted)").unwrap_or(bytes),
        ));
        if cwd.starts_with(&folder) {
            // SAFETY: kill has no memory effects.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            signalled += 1;
        }
    }
    signalled
}

/// Kills every recorded JVM and server in `dir` that is still the process it was recorded as, and the
/// children of recorded servers; then deletes the recorded folders.
fn kill_recorded(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut folders = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("dir-") && name.ends_with(".path") {
            folders.push(entry.path()); // after every process that may work in it is killed
            continue;
        }
        let server = name.starts_with("server-");
        if !((server || name.starts_with("jvm-")) && name.ends_with(".pid")) {
            continue;
        }
        let Ok(text) = fs::read(entry.path()) else {
            continue;
        };
        let mut lines = text.split(|&b| b == b'\n');
        let first = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
        let mut fields = first.split_whitespace().map(|f| f.parse::<u64>().ok());
        let (Some(Some(pid)), Some(Some(started))) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(pid) = u32::try_from(pid) else {
            continue;
        };
        if pid > 1 && start_time(pid) == Some(started) {
            signal_group(pid, libc::SIGKILL);
        }
        if server {
            // Whether or not the server itself still ran: its children outlive it for a moment.
            if let (Some(comm), Some(folder)) = (lines.next(), lines.next()) {
                if !comm.is_empty() && !folder.is_empty() {
                    let comm = String::from_utf8_lossy(comm);
                    let folder = Path::new(OsStr::from_bytes(folder));
                    kill_all_by_cwd(folder, &comm, std::time::Duration::from_secs(5));
                }
            }
        }
        let _ = fs::remove_file(entry.path());
    }
    for record in folders {
        if let Ok(path) = fs::read(&record) {
            if !path.is_empty() {
                let _ = fs::remove_dir_all(Path::new(OsStr::from_bytes(&path)));
            }
        }
        let _ = fs::remove_file(record);
    }
}

/// Removes the folders of test processes that are gone, killing their recorded JVMs first.
fn sweep(run: &Path) {
    let Ok(entries) = fs::read_dir(run) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, started)) = name.split_once('.') else {
            continue;
        };
        let (Ok(pid), Ok(started)) = (pid.parse::<u32>(), started.parse::<u64>()) else {
            continue;
        };
        if start_time(pid) == Some(started) {
            continue; // owner still running (another test binary right now)
        }
        kill_recorded(&entry.path());
        let _ = fs::remove_dir_all(entry.path());
    }
}

/// At a normal exit (libtest calls `exit` after the last test) kill this process's JVMs and delete their
/// data. PR_SET_PDEATHSIG would kill them a moment later anyway; this also frees the disk.
fn register_exit_cleanup() {
    extern "C" fn at_exit() {
        // Registered from inside owner_dir's initialiser, so the folder is known by now.
        clean_up(owner_dir());
    }
    // SAFETY: registers a plain extern "C" fn with no captured state.
    unsafe {
        libc::atexit(at_exit);
    }
}

/// Kills the recorded processes of this process's folder `dir` and deletes it, once per process: the exit
/// hook and the signal thread may both get here (a signal during `exit`), and the second one waits until
/// the first has finished, so the process never ends half way through a deletion it could have finished.
fn clean_up(dir: &Path) {
    static CLEANED: Once = Once::new();
    CLEANED.call_once(|| {
        kill_recorded(dir);
        let _ = fs::remove_dir_all(dir);
    });
}

/// The write end of the self-pipe that [`on_signal`] writes to, -1 before it exists. An atomic, because
/// the handler may read nothing else.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
/// The pid of the process that installed [`on_signal`]; a child between `fork` and `exec` inherits the
/// handler and must not pass its own signals to this process's cleanup thread.
static SIGNAL_OWNER: AtomicI32 = AtomicI32::new(0);

/// The handler for SIGTERM and SIGINT (layer 4 in the module docs). Only async-signal-safe calls: `getpid`,
/// `write` to a non-blocking pipe (a full pipe drops the byte: a signal is pending there already), and
/// in a forked child `sigaction` and `raise`; `errno` is left as the interrupted code had it.
extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: every call here is on signal-safety(7)'s list, the byte lives on this stack frame, and
    // errno is this thread's own.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        if libc::getpid() == SIGNAL_OWNER.load(Ordering::Relaxed) {
            let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
            let byte = sig as u8;
            libc::write(fd, (&raw const byte).cast(), 1);
        } else {
            // A child of the spawner that has not reached `exec` yet: it gets the default action, as it
            // would have without the fixture.
            set_default(sig);
            libc::raise(sig);
        }
        *errno = saved;
    }
}

/// The handler currently installed for `sig` (`SIG_DFL`, `SIG_IGN` or a function's address).
fn disposition(sig: libc::c_int) -> Option<libc::sighandler_t> {
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null `act` only reads the disposition.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, std::ptr::null(), &mut old) == 0).then_some(old.sa_sigaction)
    }
}

/// Puts back the default action for `sig`. Async-signal-safe (sigaction only).
fn set_default(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction with `SIG_DFL` is the default action with an empty mask and no flags.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

/// Layer 4 of the module docs: for SIGTERM and SIGINT, where nobody has claimed them yet, a handler that
/// wakes a thread which cleans `dir` up and then lets the signal end the process after all. Called once,
/// from [`owner_dir`]'s initialiser.
fn install_signal_cleanup(dir: &Path) {
    let ours = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    let unclaimed: Vec<libc::c_int> = [libc::SIGTERM, libc::SIGINT]
        .into_iter()
        .filter(|&sig| disposition(sig) == Some(libc::SIG_DFL))
        .collect();
    if unclaimed.is_empty() {
        return;
    }
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array; fcntl only changes the write end's flags.
    let (read, write) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            tracing::warn!(
                "kafka-fixture: no self-pipe ({}): SIGTERM and SIGINT will not clean up {}",
                io::Error::last_os_error(),
                dir.display()
            );
            return;
        }
        let flags = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK);
        (fds[0], fds[1])
    };
    let owned = dir.to_owned();
    let started = std::thread::Builder::new()
        .name("kafka-fixture-signals".into())
        .spawn(move || clean_up_on_signals(read, &owned, ours));
    if let Err(e) = started {
        tracing::warn!(
            "kafka-fixture: no signal thread ({e}): SIGTERM and SIGINT will not clean up {}",
            dir.display()
        );
        // SAFETY: both descriptors are ours and nothing else has seen them.
        unsafe {
            libc::close(read);
            libc::close(write);
        }
        return;
    }
    // SAFETY: getpid has no memory effects.
    SIGNAL_OWNER.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    SIGNAL_PIPE.store(write, Ordering::Release);
    for sig in unclaimed {
        // SAFETY: a zeroed sigaction is an empty mask; `on_signal` has the one-argument handler signature
        // that a handler without SA_SIGINFO is called with. SA_RESTART: the program's blocking calls go
        // on after the handler instead of failing with EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ours;
            action.sa_flags = libc::SA_RESTART;
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &action, &mut old) == 0 && old.sa_sigaction != libc::SIG_DFL {
                // Another thread claimed the signal between the look-up and now: it stays theirs.
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
    }
}

/// The signal thread: blocks on the self-pipe, and for each signal that is still `ours` when it gets
/// here, cleans `dir` up and ends the process with that signal's default action. A signal whose
/// disposition changed since is ignored here: whoever installed the new handler (signal-hook-registry
/// calls the one it replaced before its own, see the module docs) decides what it means.
fn clean_up_on_signals(read: libc::c_int, dir: &Path, ours: libc::sighandler_t) {
    loop {
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into a local.
        let n = unsafe { libc::read(read, (&raw mut byte).cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n != 1 {
            return; // the write end is in a static and never closed: not expected
        }
        let sig = libc::c_int::from(byte);
        if disposition(sig) != Some(ours) {
            tracing::debug!(
                "kafka-fixture: signal {sig} now has another handler; leaving it to that one"
            );
            continue;
        }
        clean_up(dir);
        set_default(sig);
        // SAFETY: a sigset_t filled by sigemptyset/sigaddset; unblocking it here lets the signal reach
        // at least this thread even if every other one blocks it; kill has no memory effects.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_identifies_this_process() {
        let me = std::process::id();
        let a = start_time(me).expect("own /proc entry");
        assert_eq!(start_time(me), Some(a));
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn wait_stopped_returns_once_sigstop_has_frozen_every_thread() {
        let mut child = Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let short = std::time::Duration::from_millis(100);
        assert!(
            !wait_stopped(child.id(), short),
            "a sleeping process is not stopped"
        );
        signal_group(child.id(), libc::SIGSTOP);
        assert!(wait_stopped(child.id(), std::time::Duration::from_secs(10)));
        let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        assert_eq!(
            stat_fields(&stat).and_then(|mut f| f.next()),
            Some("T"),
            "{stat}"
        );
        signal_group(child.id(), libc::SIGCONT);
        assert!(!wait_stopped(child.id(), short), "SIGCONT thawed it");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            wait_stopped(child.id(), short),
            "a reaped process counts as stopped"
        );
    }

    #[test]
    fn sweep_spares_live_owners_and_removes_dead_ones() {
        let run = std::env::temp_dir().join(format!("snapfence-sweep-test-{}", std::process::id()));
        let me = std::process::id();
        let live = run.join(format!("{me}.{}", start_time(me).unwrap()));
        // Start time 1 tick after boot: no test process can have it, so the owner counts as gone.
        let dead = run.join(format!("{me}.1"));
        fs::create_dir_all(&live).unwrap();
        fs::create_dir_all(&dead).unwrap();
        // A pid file naming this very process with a wrong start time must not get it killed.
        fs::write(dead.join(format!("jvm-{me}.pid")), format!("{me} 1\n")).unwrap();
        sweep(&run);
        assert!(live.exists());
        assert!(!dead.exists());
        fs::remove_dir_all(&run).unwrap();
    }

    #[test]
    fn sweep_kills_the_recorded_process_group_of_a_dead_owner() {
        // Stands in for a JVM whose parent-death signal never came: own process group, no PDEATHSIG.
        let mut orphan = Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = orphan.id();
        let run = std::env::temp_dir().join(format!("snapfence-sweep-kill-{}", std::process::id()));
        let dead_owner = run.join(format!("{}.1", std::process::id()));
        fs::create_dir_all(&dead_owner).unwrap();
        let started = start_time(pid).unwrap();
        fs::write(
            dead_owner.join(format!("jvm-{pid}.pid")),
            format!("{pid} {started}\n"),
        )
        .unwrap();

        sweep(&run);

        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(status) = orphan.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < until,
                "sweep left the recorded process running"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(!dead_owner.exists());
        fs::remove_dir_all(&run).unwrap();
    }
    /// A server's children in sessions of their own (as PostgreSQL's are) are found by their working
    /// directory, and a recorded folder outside the owner's is deleted after them.
    #[test]
    fn sweep_kills_a_dead_servers_children_by_folder_and_deletes_its_folder() {
        let me = std::process::id();
        let run = std::env::temp_dir().join(format!("snapfence-sweep-server-{me}"));
        let dead_owner = run.join(format!("{me}.1"));
        let folder = std::env::temp_dir().join(format!("snapfence-sweep-server-folder-{me}"));
        let work = folder.join("data");
        fs::create_dir_all(&dead_owner).unwrap();
        fs::create_dir_all(&work).unwrap();
        // A child that left the server's group (setsid) and works in the server's folder, and a process
        // of the same name elsewhere that must survive.
        let spawn_sleep = |dir: &Path| {
            Command::new("sleep")
                .arg("60")
                .current_dir(dir)
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let mut child = spawn_sleep(&work);
        let mut bystander = spawn_sleep(&std::env::temp_dir());
        // `spawn` returns once the exec has released the parent, which is before the kernel renames the
        // child: until then it still carries this test thread's name and no sweep would know it.
        for pid in [child.id(), bystander.id()] {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .as_deref()
                != Some("sleep\n")
            {
                assert!(
                    std::time::Instant::now() < until,
                    "{pid} never became `sleep`"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        // The server itself is gone: no process has pid u32::MAX.
        let record = server_record(u32::MAX, "sleep", &folder);
        fs::write(dead_owner.join("server-4294967295.pid"), record).unwrap();
        fs::write(
            dead_owner.join("dir-folder.path"),
            folder.as_os_str().as_bytes(),
        )
        .unwrap();

        sweep(&run);

        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < until,
                "sweep left the server's child running"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(
            bystander.try_wait().unwrap().is_none(),
            "a bystander was killed"
        );
        bystander.kill().unwrap();
        bystander.wait().unwrap();
        assert!(!folder.exists(), "the recorded folder was not deleted");
        assert!(!dead_owner.exists());
        fs::remove_dir_all(&run).unwrap();
    }
}
