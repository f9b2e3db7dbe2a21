//! A real PostgreSQL server for tests, started by the tests themselves from the installed PostgreSQL
//! binaries (no Docker), like [`KafkaCluster`](crate::KafkaCluster) starts brokers.
//!
//! ```no_run
//! use kafka_fixture::PostgresServer;
//! let pg = PostgresServer::start().expect("a PostgreSQL server");
//! // e.g. tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
//! println!("PostgreSQL at {}", pg.url()); // postgres://postgres@127.0.0.1:PORT/postgres
//! ```
//!
//! Every [`PostgresServer::start`] gives a private server with a fresh data directory (no sharing, so no
//! names to keep apart); the superuser is `postgres` with `trust` authentication on 127.0.0.1, and tests
//! create their own schema in the `postgres` database over their own client (the fixture has no client
//! and adds no dependency). Dropping the handle stops the server and deletes its folder.
//!
//! # What it does
//! - **Binaries**: `SNAPFENCE_PG_BINDIR` if set, else the newest `/usr/lib/postgresql/<version>/bin`
//!   (Debian's layout), else `pg_config --bindir`, else `initdb` and `postgres` on `PATH`. None of them:
//!   [`FixtureError::PostgresMissing`], whose message says `apt-get install postgresql`.
//! - **Folder**: `pg<N>` in this test process's run folder (`<cache>/run/<pid>.<start>/`, see
//!   [`procs`]), holding `data/` (the cluster), `sock/` (the Unix socket), `initdb.log` and
//!   `postgres.log` (the server's stderr; the log of each earlier run of a restarted server is kept as
//!   `postgres.log.N`).
//! - **initdb** `-D data -U postgres --auth=trust --encoding=UTF8 --locale=C --no-sync`, then `postgres`
//!   itself (not `pg_ctl`, so the postmaster is this process's child and its pid is known)
//!   `-D data -p PORT -h 127.0.0.1 -k sock` with the [settings below](#settings). The port is a free
//!   loopback port (bound to `127.0.0.1:0` and released); a server that loses it to another process before
//!   binding it ("Address already in use") is started again on a fresh one, up to three times.
//! - **Ready** means: the current run's log says "database system is ready to accept connections", a TCP
//!   connection to the port succeeds, and `pg_isready -h 127.0.0.1 -p PORT` exits 0 (skipped when the
//!   installation has no `pg_isready`). Bounded by 30 s; every failed start carries the log's end in its
//!   error.
//! - **Faults**: [`PostgresServer::kill`] = SIGKILL to the postmaster and every one of its children (a
//!   crash of the whole server; the data stays), [`PostgresServer::restart`] = start again on the same
//!   data directory and port (crash recovery runs) and wait until ready.
//! - **Stop** (drop): SIGINT, PostgreSQL's "fast" shutdown (open sessions are ended, a shutdown checkpoint
//!   is written; `pg_ctl stop`'s default), SIGKILL after 5 s, then the folder is deleted. Not SIGTERM:
//!   that is the "smart" shutdown, which waits for every client to disconnect, and a test's client usually
//!   still holds its connection when the server is dropped.
//! - **No server left behind**: the postmaster is started through [`procs::spawn`] (its own process
//!   group, `PR_SET_PDEATHSIG`) and recorded with [`procs::record_server`]. Its children are not in its
//!   process group (each calls `setsid`), so they are found by their working directory, the data
//!   directory: the pid-file sweep of a later test process and this process's `atexit` hook kill them too,
//!   and [`kill`] waits until they are gone, because a new postmaster refuses to start while an old child
//!   still holds the shared memory ("pre-existing shared memory block is still in use"). Children also
//!   exit on their own when the postmaster dies.
//!
//! [`kill`]: PostgresServer::kill
//!
//! # As root
//! `initdb` refuses to run as root ("cannot be run as root"), and `postgres` too. When the effective uid
//! is 0 (tests in a container, CI), both run as the `postgres` system user, which the Debian package
//! creates: `data/` and `sock/` are made and `chown`ed to it (mode 0700), and the child drops privileges
//! before `exec` (`setgroups(0)`, `setgid`, `setuid`, through `Command::uid`/`gid`; the parent-death signal
//! is set after that, as a credential change clears it). The logs are opened by the test process and
//! handed over as stdout/stderr, so they need no permission. That user must be able to reach the folder:
//! when it cannot (the cache is under `/root`, mode 0700), the folder is made in the temp folder instead
//! (`$TMPDIR/snapfence-<pid>.<start>-pg<N>`, mode 0755), recorded with [`procs::record_folder`] so a
//! crashed test process's folder is deleted by the next one. No `postgres` user:
//! [`FixtureError::PostgresUser`]. Not root: everything runs as the current user.
//!
//! # Settings
//! `fsync=off`, `full_page_writes=off`, `max_connections=200`, `max_prepared_transactions=20` (two-phase
//! commit is usable), and `synchronous_commit=on` (PostgreSQL's default) on purpose:
//! - `fsync=off` and `full_page_writes=off` only matter when the *machine* crashes: every write has
//!   reached the kernel's page cache, which a killed process cannot lose, so [`kill`] still behaves like a
//!   server crash with its data intact.
//! - `synchronous_commit=off` would make a commit return before its WAL leaves the server's shared memory
//!   (the WAL writer writes it up to 200 ms later), so [`kill`] would lose commits the client saw succeed.
//!   Measured here (PostgreSQL 15, `fsync=off`): inserts in a loop, each its own transaction, SIGKILL of
//!   every server process after 1.5 s: with `off` the last 26 to 78 acknowledged inserts were gone after
//!   restart in each of three runs, with `on` none were. With `fsync=off` a synchronous commit costs a
//!   `write()`, not a disk flush, so `off` buys nothing: pgbench, a one-row INSERT per transaction, 5 s,
//!   twice each: `on` 12.2k-13.5k tps with one client and 14.3k-16.5k with four, `off` 8.4k-11.3k and
//!   15.0k-15.5k.
//!
//! [`PostgresServer::start_with`] overrides any of them or adds others.
//!
//! # Environment
//! - `SNAPFENCE_POSTGRES_URL`: use this external server instead (see [`PostgresServer::is_external`]).
//! - `SNAPFENCE_PG_BINDIR`: the folder holding `initdb`, `postgres` (and `pg_isready`).
//!
//! # References
//! - PostgreSQL 15 manual: "initdb", "postgres" (`-c`, `-h`, `-k`, `-p`), "Shutting Down the Server"
//!   (SIGTERM smart, SIGINT fast, SIGQUIT immediate), "Asynchronous Commit", "WAL Configuration"
//!   (`fsync`, `full_page_writes`), "pg_isready"; src/backend/utils/init/miscinit.c (`InitPostmasterChild`
//!   calls `setsid`)

use std::ffi::CString;
use std::fmt;
use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{jars, procs, FixtureError};

/// What the postmaster logs once it accepts connections, after a first start and after crash recovery.
const READY_LINE: &str = "database system is ready to accept connections";
/// How long a start or restart may take until ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `initdb` may take (about a second alone; more while other test binaries compile or start).
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a fast shutdown may take before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long SIGKILLed server processes may take to vanish.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// The system user the server runs as when the tests run as root.
const SYSTEM_USER: &str = "postgres";
/// The database superuser `initdb -U` makes, and the database every cluster has.
const SUPERUSER: &str = "postgres";
const DATABASE: &str = "postgres";
const HOST: &str = "127.0.0.1";
/// The settings every fixture server gets (see the module docs for why each).
const SETTINGS: [(&str, &str); 5] = [
    ("fsync", "off"),
    ("full_page_writes", "off"),
    ("synchronous_commit", "on"),
    ("max_connections", "200"),
    ("max_prepared_transactions", "20"),
];
/// Unix socket paths longer than this (`sun_path` is 108 bytes with its NUL) cannot be bound.
const MAX_SOCKET_PATH: usize = 107;

/// A running PostgreSQL server: one the fixture started, or the external one named by
/// `SNAPFENCE_POSTGRES_URL`. Dropping a started one stops it and deletes its data.
pub struct PostgresServer {
    inner: Inner,
}

enum Inner {
    Local(LocalServer),
    External(Address),
}

/// Where a server is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Address {
    url: String,
    host: String,
    port: u16,
    user: String,
    database: String,
}

impl fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresServer")
            .field("url", &self.url())
            .field("external", &self.is_external())
            .field("data_dir", &self.data_dir())
            .finish()
    }
}

impl PostgresServer {
    /// Starts a private server with the fixture's [settings](self#settings) and blocks until it is ready
    /// (a few seconds: `initdb` is most of it), or returns the external server when
    /// `SNAPFENCE_POSTGRES_URL` is set (after checking that its port accepts a TCP connection).
    ///
    /// Blocking: from an async test, call it before starting work that needs the runtime, or through
    /// `tokio::task::spawn_blocking`.
    pub fn start() -> Result<PostgresServer, FixtureError> {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more `-c name=value` settings; a name the fixture sets too is
    /// replaced, e.g. `&[("synchronous_commit", "off")]`. Ignored for an external server. An unknown
    /// setting fails the start with PostgreSQL's own message.
    pub fn start_with(settings: &[(&str, &str)]) -> Result<PostgresServer, FixtureError> {
        if let Some(external) = external()? {
            return Ok(PostgresServer {
                inner: Inner::External(external),
            });
        }
        let mut all: Vec<(String, String)> = SETTINGS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in settings {
            match all.iter_mut().find(|(name, _)| name == k) {
                Some(entry) => entry.1 = v.to_string(),
                None => all.push((k.to_string(), v.to_string())),
            }
        }
        Ok(PostgresServer {
            inner: Inner::Local(LocalServer::start(all)?),
        })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (libpq's URL form, which tokio-postgres and sqlx
    /// accept), or `SNAPFENCE_POSTGRES_URL` verbatim for an external server.
    pub fn url(&self) -> String {
        match &self.inner {
            Inner::Local(s) => s.address().url,
            Inner::External(a) => a.url.clone(),
        }
    }

    /// The host to connect to: `127.0.0.1`, or the external URL's host.
    pub fn host(&self) -> &str {
        match &self.inner {
            Inner::Local(_) => HOST,
            Inner::External(a) => &a.host,
        }
    }

    /// The TCP port (the external URL's, 5432 when it names none).
    pub fn port(&self) -> u16 {
        match &self.inner {
            Inner::Local(s) => s.port,
            Inner::External(a) => a.port,
        }
    }

    /// The user to connect as: the superuser `postgres` (no password), or the external URL's user.
    pub fn user(&self) -> &str {
        match &self.inner {
            Inner::Local(_) => SUPERUSER,
            Inner::External(a) => &a.user,
        }
    }

    /// The database to connect to: `postgres`, or the external URL's database.
    pub fn database(&self) -> &str {
        match &self.inner {
            Inner::Local(_) => DATABASE,
            Inner::External(a) => &a.database,
        }
    }

    /// True when this is the server named by `SNAPFENCE_POSTGRES_URL`: it may be any version and
    /// configuration, and [`kill`](Self::kill) and [`restart`](Self::restart) return
    /// [`FixtureError::PostgresExternal`]. Tests of faults return early when this is true.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External(_))
    }

    /// The data directory of a started server (None for an external one). Deleted on drop.
    pub fn data_dir(&self) -> Option<&Path> {
        match &self.inner {
            Inner::Local(s) => Some(&s.data),
            Inner::External(_) => None,
        }
    }

    /// The postmaster's pid (also its process group id) while it runs; None for an external server.
    pub fn pid(&self) -> Option<u32> {
        match &self.inner {
            Inner::Local(s) => s.state().child.as_ref().map(Child::id),
            Inner::External(_) => None,
        }
    }

    /// How long the start took, `initdb` included (None for an external server).
    pub fn started_in(&self) -> Option<Duration> {
        match &self.inner {
            Inner::Local(s) => Some(s.started_in),
            Inner::External(_) => None,
        }
    }

    /// Crashes the server: SIGKILL to the postmaster and to each of its children, then waits until they
    /// are gone, so the port refuses connections when this returns. The data directory stays for
    /// [`restart`](Self::restart). A server that is not running is left alone.
    pub fn kill(&self) -> Result<(), FixtureError> {
        let server = self.local("kill")?;
        server.kill(&mut server.state());
        Ok(())
    }

    /// Kills the server if it still runs, starts it again on the same data directory and port (it runs
    /// crash recovery after a [`kill`](Self::kill)) and blocks until it is ready. Fails with the log's end
    /// when it does not come back within 30 s, e.g. because another process took the port meanwhile.
    pub fn restart(&self) -> Result<(), FixtureError> {
        let server = self.local("restart")?;
        {
            let mut state = server.state();
            server.kill(&mut state);
            server.spawn(&mut state)?;
        }
        server.wait_ready(Instant::now() + READY_TIMEOUT)
    }

    fn local(&self, action: &str) -> Result<&LocalServer, FixtureError> {
        match &self.inner {
            Inner::Local(s) => Ok(s),
            Inner::External(a) => Err(FixtureError::PostgresExternal {
                action: action.to_owned(),
                url: a.url.clone(),
            }),
        }
    }
}

/// The external server, when `SNAPFENCE_POSTGRES_URL` names one.
fn external() -> Result<Option<Address>, FixtureError> {
    let Some(url) = std::env::var("SNAPFENCE_POSTGRES_URL")
        .ok()
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
    else {
        return Ok(None);
    };
    let address = parse_url(&url).map_err(|detail| FixtureError::PostgresUrl {
        url: url.clone(),
        detail,
    })?;
    let host = address.host.trim_start_matches('[').trim_end_matches(']');
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&(host, address.port))
        .map_err(|e| e.to_string())
        .and_then(|mut addrs| {
            addrs
                .next()
                .ok_or_else(|| "the host resolves to no address".to_owned())
        })
        .and_then(|addr| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())
        });
    match reachable {
        Ok(_) => Ok(Some(address)),
        Err(e) => Err(FixtureError::PostgresNotReady {
            detail: format!("SNAPFENCE_POSTGRES_URL={url}: {e}"),
        }),
    }
}

/// Host, port, user and database of a `postgres://` or `postgresql://` URL:
/// `scheme://[user[:password]@]host[:port][/database][?options]`. The user defaults to `postgres`, the
/// port to 5432, the database to the user (libpq's defaults, except that the OS user name is not used).
fn parse_url(url: &str) -> Result<Address, String> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .ok_or("it does not start with postgres:// or postgresql://")?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, database) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let user = userinfo
        .map(|u| u.split(':').next().unwrap_or_default())
        .filter(|u| !u.is_empty())
        .map(percent_decode)
        .transpose()?
        .unwrap_or_else(|| SUPERUSER.to_owned());
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("an IPv6 host without its ']'")?;
        (format!("[{addr}]"), after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (hostport.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err("no host (a Unix socket URL cannot be checked by the fixture)".into());
    }
    if host.contains(',') {
        return Err("several hosts (name one)".into());
    }
    let port = match port {
        None | Some("") => 5432,
        Some(p) => p.parse().map_err(|_| format!("bad port {p:?}"))?,
    };
    let database = match database {
        "" => user.clone(),
        d => percent_decode(d)?,
    };
    Ok(Address {
        url: url.to_owned(),
        host,
        port,
        user,
        database,
    })
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in {text:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8 once decoded"))
}

/// The installed PostgreSQL programs the fixture runs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Binaries {
    initdb: PathBuf,
    postgres: PathBuf,
    pg_isready: Option<PathBuf>,
}

impl Binaries {
    /// The programs in `dir`, if it has at least `initdb` and `postgres`.
    fn in_dir(dir: &Path) -> Option<Binaries> {
        let (initdb, postgres) = (dir.join("initdb"), dir.join("postgres"));
        (is_executable(&initdb) && is_executable(&postgres)).then(|| Binaries {
            initdb,
            postgres,
            pg_isready: Some(dir.join("pg_isready")).filter(|p| is_executable(p)),
        })
    }

    /// `SNAPFENCE_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`, else `pg_config --bindir`,
    /// else `PATH`.
    fn find() -> Result<Binaries, FixtureError> {
        if let Some(dir) = std::env::var_os("SNAPFENCE_PG_BINDIR").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
            return Binaries::in_dir(&dir).ok_or_else(|| FixtureError::PostgresMissing {
                detail: format!(
                    "SNAPFENCE_PG_BINDIR={} holds no executable initdb and postgres (point it at \
                     the bin folder of a PostgreSQL installation, e.g. /usr/lib/postgresql/15/bin, or \
                     unset it; `apt-get install postgresql` installs one)",
                    dir.display()
                ),
            });
        }
        if let Some(found) = newest_bindir(Path::new("/usr/lib/postgresql")) {
            return Ok(found);
        }
        let from_pg_config = Command::new("pg_config")
            .arg("--bindir")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| Binaries::in_dir(Path::new(String::from_utf8_lossy(&o.stdout).trim())));
        if let Some(found) = from_pg_config {
            return Ok(found);
        }
        if let (Some(initdb), Some(postgres)) = (on_path("initdb"), on_path("postgres")) {
            return Ok(Binaries {
                initdb,
                postgres,
                pg_isready: on_path("pg_isready"),
            });
        }
        Err(FixtureError::PostgresMissing {
            detail: "no initdb and postgres in SNAPFENCE_PG_BINDIR, /usr/lib/postgresql/*/bin, \
                     `pg_config --bindir` or PATH; install PostgreSQL with \
                     `apt-get install postgresql` (Debian/Ubuntu), or set SNAPFENCE_PG_BINDIR to the \
                     folder holding initdb and postgres"
                .into(),
        })
    }

    /// The command name (`/proc/<pid>/comm`) of every server process: the program's file name.
    fn comm(&self) -> String {
        self.postgres
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "postgres".into())
    }
}

/// The binaries of the highest version under `root` (Debian: `/usr/lib/postgresql/<major>/bin`).
fn newest_bindir(root: &Path) -> Option<Binaries> {
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name
                .split('.')
                .map(|p| p.parse::<u32>().ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions
        .iter()
        .rev()
        .find_map(|(_, bin)| Binaries::in_dir(bin))
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The user and group the server runs as when the tests run as root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// None when not root (the server runs as the current user); the `postgres` system user when root.
fn server_user() -> Result<Option<RunAs>, FixtureError> {
    // SAFETY: geteuid has no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    lookup_user(SYSTEM_USER).map(Some).ok_or_else(|| FixtureError::PostgresUser {
        detail: format!(
            "there is no `{SYSTEM_USER}` system user to run it as (initdb refuses to run as root): \
             `apt-get install postgresql` creates it, or `useradd --system {SYSTEM_USER}`; or run the \
             tests as a user other than root"
        ),
    })
}

/// uid and primary gid of `name` from the password database.
fn lookup_user(name: &str) -> Option<RunAs> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 4096];
    loop {
        // SAFETY: a zeroed passwd is a valid out-parameter (integers and null pointers).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; the strings written into `buf` are not read.
        let rc = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        return Some(RunAs {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        });
    }
}

/// True when `user` (with only its primary group: `Command::uid` drops the supplementary groups) may
/// enter `path` and every folder above it.
fn reachable_by(path: &Path, user: RunAs) -> bool {
    let Ok(path) = fs::canonicalize(path) else {
        return false;
    };
    path.ancestors().all(|dir| {
        fs::metadata(dir).is_ok_and(|m| {
            let bit = if m.uid() == user.uid {
                0o100
            } else if m.gid() == user.gid {
                0o010
            } else {
                0o001
            };
            m.mode() & bit != 0
        })
    })
}

/// A free loopback port right now (bound to port 0, then released for the server to bind).
fn free_port() -> Result<u16, FixtureError> {
    let addr = Path::new("127.0.0.1:0");
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| FixtureError::io(addr, e))
}

/// Removes every `PG*` variable (PGDATA, PGPORT, PGHOST, PGUSER, ...) a developer's shell may set, so
/// the programs see only the fixture's arguments, and makes their messages English (the fixture reads
/// the log).
fn clean_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key.as_bytes().starts_with(b"PG") {
            cmd.env_remove(key);
        }
    }
    cmd.env("LC_ALL", "C").env("LANG", "C");
}

struct LocalServer {
    bins: Binaries,
    folder: PathBuf,
    data: PathBuf,
    /// None when the socket path would be too long: then the server listens on TCP only.
    socket_dir: Option<PathBuf>,
    /// The record that deletes a folder outside the run folder if this process dies (see
    /// [`procs::record_folder`]).
    folder_record: Option<PathBuf>,
    run_as: Option<RunAs>,
    port: u16,
    settings: Vec<(String, String)>,
    state: Mutex<State>,
    started_in: Duration,
}

#[derive(Default)]
struct State {
    child: Option<Child>,
    pid_file: Option<PathBuf>,
    /// Starts so far, to name the kept log of each earlier run.
    starts: u32,
}

impl LocalServer {
    fn start(settings: Vec<(String, String)>) -> Result<LocalServer, FixtureError> {
        let began = Instant::now();
        let bins = Binaries::find()?;
        let run_as = server_user()?;
        let (folder, folder_record) = make_folder(run_as)?;
        let socket_dir = Some(folder.join("sock"))
            .filter(|s| s.as_os_str().len() + "/.s.PGSQL.65535.lock".len() <= MAX_SOCKET_PATH);
        let mut server = LocalServer {
            bins,
            data: folder.join("data"),
            folder,
            socket_dir,
            folder_record,
            run_as,
            port: 0,
            settings,
            state: Mutex::new(State::default()),
            started_in: Duration::ZERO,
        };
        // From here on, dropping `server` on an error kills what was started and deletes the folder.
        server.initdb()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            server.port = free_port()?;
            server.spawn(&mut server.state())?;
            match server.wait_ready(Instant::now() + READY_TIMEOUT) {
                Ok(()) => break,
                Err(FixtureError::PostgresExited {
                    port_clash: true, ..
                }) if attempt < 3 => continue,
                Err(e) => return Err(e),
            }
        }
        server.started_in = began.elapsed();
        Ok(server)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock leaves consistent data (each field is set in one
        // step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn address(&self) -> Address {
        Address {
            url: format!("postgres://{SUPERUSER}@{HOST}:{}/{DATABASE}", self.port),
            host: HOST.into(),
            port: self.port,
            user: SUPERUSER.into(),
            database: DATABASE.into(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.folder.join("postgres.log")
    }

    /// A program run as the server's user, in the folder, with a clean environment.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        clean_env(&mut cmd);
        cmd.current_dir(&self.folder).stdin(Stdio::null());
        if let Some(user) = self.run_as {
            // std applies these in the child before `pre_exec` closures run (setgroups(0) first, as the
            // parent is root), so procs::spawn's PR_SET_PDEATHSIG comes after the credential change that
            // would clear it.
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    /// Makes `data/` (and `sock/`) for the server's user and runs `initdb` into it.
    fn initdb(&self) -> Result<(), FixtureError> {
        let init_failed = |detail: String| FixtureError::PostgresInit { detail };
        for dir in std::iter::once(&self.data).chain(self.socket_dir.as_ref()) {
            fs::create_dir(dir).map_err(|e| FixtureError::io(dir, e))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| FixtureError::io(dir, e))?;
            if let Some(user) = self.run_as {
                std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid)).map_err(|e| {
                    init_failed(format!(
                        "cannot hand {} to user {SYSTEM_USER}: {e}",
                        dir.display()
                    ))
                })?;
            }
        }
        let log = self.folder.join("initdb.log");
        let file = fs::File::create(&log).map_err(|e| FixtureError::io(&log, e))?;
        let err = file.try_clone().map_err(|e| FixtureError::io(&log, e))?;
        let mut cmd = self.command(&self.bins.initdb);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "--auth=trust", "--encoding=UTF8"])
            .args(["--locale=C", "--no-sync"])
            .stdout(file)
            .stderr(err);
        let mut child = procs::spawn(cmd).map_err(|e| FixtureError::io(&self.bins.initdb, e))?;
        // Its own children (the bootstrap backends) share its process group.
        let pid_file = procs::record(child.id());
        let until = Instant::now() + INITDB_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => break Err(format!("did not finish within {INITDB_TIMEOUT:?}")),
                Err(e) => break Err(e.to_string()),
            }
        };
        if status.is_err() {
            // Not reaped yet, so the pid is still this child's.
            procs::signal_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
        let _ = fs::remove_file(pid_file);
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(init_failed(
                self.describe(&format!("initdb exited with {s}"), &log),
            )),
            Err(why) => Err(init_failed(self.describe(&format!("initdb {why}"), &log))),
        }
    }

    /// `what`, the folder, and the end of `log`: the folder is deleted when the server is dropped, so an
    /// error must carry what explains it.
    fn describe(&self, what: &str, log: &Path) -> String {
        let text = fs::read_to_string(log).unwrap_or_default();
        format!(
            "{what} (as {}, in {})\n--- {} (end) ---\n{}",
            match self.run_as {
                Some(_) => SYSTEM_USER,
                None => "the current user",
            },
            self.folder.display(),
            log.file_name().unwrap_or_default().to_string_lossy(),
            jars::tail(&text, 30)
        )
    }

    /// Starts the postmaster (when it is not running), with a fresh log.
    fn spawn(&self, state: &mut State) -> Result<(), FixtureError> {
        if state.child.is_some() {
            return Ok(());
        }
        let log = self.log_path();
        if state.starts > 0 {
            // Each run gets a fresh log, so the readiness check never matches an earlier run's line.
            let _ = fs::rename(
                &log,
                self.folder.join(format!("postgres.log.{}", state.starts)),
            );
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| FixtureError::io(&log, e))?;
        let err = file.try_clone().map_err(|e| FixtureError::io(&log, e))?;
        let mut cmd = self.command(&self.bins.postgres);
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-h", HOST, "-k"])
            // An empty socket directory list means TCP only.
            .arg(self.socket_dir.as_deref().unwrap_or(Path::new("")));
        for (name, value) in &self.settings {
            cmd.arg("-c").arg(format!("{name}={value}"));
        }
        cmd.stdout(file).stderr(err);
        let child = procs::spawn(cmd).map_err(|e| FixtureError::io(&self.bins.postgres, e))?;
        state.pid_file = Some(procs::record_server(
            child.id(),
            &self.bins.comm(),
            &self.folder,
        ));
        state.child = Some(child);
        state.starts += 1;
        Ok(())
    }

    /// Ready = the log line, a TCP connection, and `pg_isready` (see the module docs). Fails at once when
    /// the postmaster exits.
    fn wait_ready(&self, deadline: Instant) -> Result<(), FixtureError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if let Some(status) = self.exited()? {
                let log = fs::read_to_string(self.log_path()).unwrap_or_default();
                return Err(FixtureError::PostgresExited {
                    port_clash: log.contains("Address already in use"),
                    detail: self.describe(
                        &format!("on port {} exited with {status}", self.port),
                        &self.log_path(),
                    ),
                });
            }
            let last = if !fs::read_to_string(self.log_path()).is_ok_and(|l| l.contains(READY_LINE))
            {
                format!("the log does not say '{READY_LINE}'")
            } else if let Err(e) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                format!("connecting to {addr}: {e}")
            } else if !self.pg_isready() {
                format!("pg_isready -h {HOST} -p {} did not exit 0", self.port)
            } else {
                return Ok(());
            };
            if Instant::now() > deadline {
                return Err(FixtureError::PostgresNotReady {
                    detail: self.describe(
                        &format!("not ready within {READY_TIMEOUT:?}; last check: {last}"),
                        &self.log_path(),
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The postmaster's exit status when it has exited (it is then reaped and its record removed).
    fn exited(&self) -> Result<Option<ExitStatus>, FixtureError> {
        let mut state = self.state();
        let Some(child) = state.child.as_mut() else {
            return Err(FixtureError::PostgresNotReady {
                detail: "the server is not running (killed meanwhile?)".into(),
            });
        };
        match child.try_wait() {
            Ok(None) => Ok(None),
            Ok(Some(status)) => {
                state.child = None;
                self.kill(&mut state); // its children, if any got started, and the pid file
                Ok(Some(status))
            }
            Err(e) => Err(FixtureError::io(&self.folder, e)),
        }
    }

    /// True when `pg_isready` says the server accepts connections, or when there is no `pg_isready`.
    fn pg_isready(&self) -> bool {
        let Some(program) = &self.bins.pg_isready else {
            return true;
        };
        let mut cmd = Command::new(program);
        clean_env(&mut cmd);
        cmd.args(["-q", "-h", HOST, "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", DATABASE, "-t", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// SIGKILL to the postmaster's group and to every server process working in the folder, until none is
    /// left (or [`KILL_WAIT`] passes); reaps the postmaster and removes its record.
    fn kill(&self, state: &mut State) {
        if let Some(mut child) = state.child.take() {
            // Only while it is not reaped: a reaped pid may already belong to another process.
            if matches!(child.try_wait(), Ok(None)) {
                procs::signal_group(child.id(), libc::SIGKILL);
            }
            let _ = child.wait();
        }
        // The postmaster cannot fork any more, so every child there will be is there now.
        procs::kill_all_by_cwd(&self.folder, &self.bins.comm(), KILL_WAIT);
        if let Some(f) = state.pid_file.take() {
            let _ = fs::remove_file(f);
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let mut state = self.state();
        if let Some(child) = state.child.as_mut() {
            // Fast shutdown: ends the sessions, writes a checkpoint, removes the shared memory.
            procs::signal_group(child.id(), libc::SIGINT);
            let until = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill(&mut state); // SIGKILL for whatever is left; reaps; removes the pid file
        drop(state);
        let _ = fs::remove_dir_all(&self.folder);
        if let Some(record) = &self.folder_record {
            let _ = fs::remove_file(record);
        }
    }
}

/// The server's folder: `pg<N>` in the run folder when the server's user can reach it, else (root, and
/// the run folder is under a home the `postgres` user cannot enter) a new folder in the temp folder,
/// recorded so that it is deleted even if this process is killed.
fn make_folder(run_as: Option<RunAs>) -> Result<(PathBuf, Option<PathBuf>), FixtureError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = format!("pg{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let owner = procs::owner_dir();
    let Some(user) = run_as.filter(|&u| !reachable_by(owner, u)) else {
        let folder = owner.join(name);
        fs::create_dir_all(&folder).map_err(|e| FixtureError::io(&folder, e))?;
        if run_as.is_some() {
            // Whatever the umask made it: the server's user works in it.
            fs::set_permissions(&folder, fs::Permissions::from_mode(0o755))
                .map_err(|e| FixtureError::io(&folder, e))?;
        }
        return Ok((folder, None));
    };
    let owner_name = owner
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| std::process::id().to_string());
    let folder = std::env::temp_dir().join(format!("snapfence-{owner_name}-{name}"));
    // create_dir, not create_dir_all: fails rather than reuse anything already there (in /tmp, anyone
    // could have made it).
    fs::create_dir(&folder).map_err(|e| FixtureError::io(&folder, e))?;
    let record = procs::record_folder(&folder);
    let ok = fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).is_ok()
        && reachable_by(&folder, user);
    if !ok {
        let _ = fs::remove_dir_all(&folder);
        let _ = fs::remove_file(record);
        return Err(FixtureError::PostgresUser {
            detail: format!(
                "its user `{SYSTEM_USER}` (uid {}) can enter neither {} nor {}: set SNAPFENCE_CACHE (or \
                 TMPDIR) to a folder it can reach",
                user.uid,
                owner.display(),
                folder.display()
            ),
        });
    }
    Ok((folder, Some(record)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_libpq_defaults() {
        let a = parse_url("postgres://app:s%40cret@db.example:6543/snap?sslmode=disable").unwrap();
        assert_eq!(
            (
                a.host.as_str(),
                a.port,
                a.user.as_str(),
                a.database.as_str()
            ),
            ("db.example", 6543, "app", "snap")
        );
        let b = parse_url("postgresql://localhost").unwrap();
        assert_eq!(
            (
                b.host.as_str(),
                b.port,
                b.user.as_str(),
                b.database.as_str()
            ),
            ("localhost", 5432, "postgres", "postgres")
        );
        let c = parse_url("postgres://u%20x@[::1]:5433/d%2F1").unwrap();
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.user.as_str(),
                c.database.as_str()
            ),
            ("[::1]", 5433, "u x", "d/1")
        );
        for bad in [
            "host=localhost port=5432",
            "mysql://x/y",
            "postgres:///db",
            "postgres://h:port/db",
            "postgres://a,b/db",
            "postgres://u%zz@h/db",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_newest_complete_installation_wins() {
        let root = std::env::temp_dir().join(format!("snapfence-pg-bins-{}", std::process::id()));
        let make = |version: &str, programs: &[&str]| {
            let bin = root.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for p in programs {
                fs::write(bin.join(p), "#!/bin/sh\n").unwrap();
                fs::set_permissions(bin.join(p), fs::Permissions::from_mode(0o755)).unwrap();
            }
            bin
        };
        let v9 = make("9.6", &["initdb", "postgres", "pg_isready"]);
        let v15 = make("15", &["initdb", "postgres"]);
        make("17", &["initdb"]); // no server: skipped
        make("common", &["initdb", "postgres"]); // not a version: skipped
        fs::write(root.join("README"), "").unwrap();
        let found = newest_bindir(&root).unwrap();
        assert_eq!(found.initdb, v15.join("initdb"));
        assert_eq!(found.pg_isready, None);
        fs::remove_dir_all(root.join("15")).unwrap();
        let found = newest_bindir(&root).unwrap();
        assert_eq!(found.postgres, v9.join("postgres"));
        assert_eq!(found.pg_isready, Some(v9.join("pg_isready")));
        assert_eq!(found.comm(), "postgres");
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(newest_bindir(&root), None);
    }

    #[test]
    fn reachability_follows_the_permission_bits_of_every_folder() {
        let me = std::process::id();
        let root = std::env::temp_dir().join(format!("snapfence-pg-reach-{me}"));
        let inner = root.join("a").join("b");
        fs::create_dir_all(&inner).unwrap();
        let meta = fs::metadata(&root).unwrap();
        let (owner, group) = (meta.uid(), meta.gid());
        // Nobody's uid and gid: only the "other" bits count.
        let stranger = RunAs {
            uid: owner.wrapping_add(12345),
            gid: group.wrapping_add(12345),
        };
        let same_group = RunAs {
            uid: stranger.uid,
            gid: group,
        };
        let mode =
            |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        mode(&root, 0o755);
        assert!(reachable_by(&inner, stranger));
        mode(&root.join("a"), 0o750);
        assert!(!reachable_by(&inner, stranger));
        assert!(reachable_by(&inner, same_group));
        mode(&root.join("a"), 0o700);
        assert!(!reachable_by(&inner, same_group));
        assert!(reachable_by(
            &inner,
            RunAs {
                uid: owner,
                gid: stranger.gid
            }
        ));
        assert!(!reachable_by(&root.join("missing"), stranger));
        mode(&root.join("a"), 0o755);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_external_server_is_used_as_named_and_refuses_faults() {
        let url = "postgres://app@db.example:6543/snap";
        let pg = PostgresServer {
            inner: Inner::External(parse_url(url).unwrap()),
        };
        assert!(pg.is_external());
        assert_eq!(pg.url(), url);
        assert_eq!(
            (pg.host(), pg.port(), pg.user(), pg.database()),
            ("db.example", 6543, "app", "snap")
        );
        assert_eq!(
            (pg.pid(), pg.data_dir(), pg.started_in()),
            (None, None, None)
        );
        for (what, result) in [("kill", pg.kill()), ("restart", pg.restart())] {
            match result {
                Err(FixtureError::PostgresExternal { action, url: u }) => {
                    assert_eq!((action.as_str(), u.as_str()), (what, url));
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    /// A server can be shared between threads (a test's tasks each hold it): checked by the compiler,
    /// so a field that is not `Send + Sync` fails the build rather than a test.
    const _: fn() = || {
        fn shareable<T: Send + Sync>() {}
        shareable::<PostgresServer>();
    };

    #[test]
    fn the_system_user_lookup_reads_the_password_database() {
        assert_eq!(lookup_user("root"), Some(RunAs { uid: 0, gid: 0 }));
        assert_eq!(lookup_user("no-such-user-snapfence"), None);
        assert_eq!(lookup_user("nul\0byte"), None);
    }
}
