//! Real-server tests of the PostgreSQL fixture: that the server it hands out speaks the PostgreSQL protocol
//! with the settings it claims, that `kill` and `restart` are a crash and a recovery (committed data
//! survives), and that servers are private and cleaned up. The protocol is spoken by hand over a
//! `std::net::TcpStream` (startup, simple query, terminate), so the fixture's tests need no client crate.
//!
//! Every test returns early when `SNAPFENCE_POSTGRES_URL` names an external server: these tests are about
//! the servers the fixture starts. Start-up times are printed (run with `--nocapture` to see them).

use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use kafka_fixture::PostgresServer;

const TIMEOUT: Duration = Duration::from_secs(10);

/// True (after saying so) when the tests must not run: they start, kill and compare servers of their own.
fn skip_external() -> bool {
    if std::env::var("SNAPFENCE_POSTGRES_URL").is_ok_and(|u| !u.trim().is_empty()) {
        eprintln!("skipped: SNAPFENCE_POSTGRES_URL names an external server");
        return true;
    }
    false
}

fn start(what: &str) -> PostgresServer {
    let pg = PostgresServer::start().unwrap_or_else(|e| panic!("{what}: {e}"));
    eprintln!(
        "fixture: {what}: {} ready in {:.1}s",
        pg.url(),
        pg.started_in().unwrap_or_default().as_secs_f64()
    );
    pg
}

/// One backend message: its type byte and body.
struct Message {
    tag: u8,
    body: Vec<u8>,
}

/// A session spoken by hand: protocol 3.0, trust authentication, simple queries.
struct Session {
    stream: TcpStream,
    /// ParameterStatus values from the startup (server_version, client_encoding, ...).
    parameters: Vec<(String, String)>,
}

impl Session {
    /// StartupMessage, then expects AuthenticationOk ('R' with code 0: trust asks for no password) and
    /// reads until ReadyForQuery ('Z').
    fn open(pg: &PostgresServer) -> Result<Session, String> {
        let stream = TcpStream::connect((pg.host(), pg.port())).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut session = Session {
            stream,
            parameters: Vec::new(),
        };
        let mut body = 196_608i32.to_be_bytes().to_vec(); // protocol 3.0
        for (key, value) in [("user", pg.user()), ("database", pg.database())] {
            for s in [key, value] {
                body.extend_from_slice(s.as_bytes());
                body.push(0);
            }
        }
        body.push(0);
        let mut startup = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        startup.extend_from_slice(&body);
        session
            .stream
            .write_all(&startup)
            .map_err(|e| e.to_string())?;

        let first = session.read()?;
        match first.tag {
            b'R' if first.body == 0i32.to_be_bytes() => {}
            b'R' => return Err(format!("asked for authentication {:?}", first.body)),
            b'E' => return Err(format!("startup refused: {}", error_text(&first.body))),
            t => return Err(format!("unexpected first message {:?}", t as char)),
        }
        loop {
            let m = session.read()?;
            match m.tag {
                b'S' => {
                    let mut parts = m.body.split(|&b| b == 0).map(String::from_utf8_lossy);
                    let name = parts.next().unwrap_or_default().into_owned();
                    let value = parts.next().unwrap_or_default().into_owned();
                    session.parameters.push((name, value));
                }
                b'K' | b'N' => {}
                b'Z' => return Ok(session),
                b'E' => return Err(format!("startup failed: {}", error_text(&m.body))),
                t => return Err(format!("unexpected startup message {:?}", t as char)),
            }
        }
    }

    fn read(&mut self) -> Result<Message, String> {
        let mut header = [0u8; 5];
        self.stream
            .read_exact(&mut header)
            .map_err(|e| format!("reading a message header: {e}"))?;
        let len = i32::from_be_bytes(header[1..5].try_into().unwrap());
        if !(4..=(1 << 24)).contains(&len) {
            return Err(format!("bad message length {len}"));
        }
        let mut body = vec![0u8; len as usize - 4];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| format!("reading a message body: {e}"))?;
        Ok(Message {
            tag: header[0],
            body,
        })
    }

    /// A simple query ('Q'); returns the rows of its statements as text (None for NULL), or the server's
    /// error.
    fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
        msg.extend_from_slice(sql.as_bytes());
        msg.push(0);
        self.stream.write_all(&msg).map_err(|e| e.to_string())?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let m = self.read()?;
            match m.tag {
                b'D' => rows.push(data_row(&m.body)),
                b'E' => error = Some(error_text(&m.body)),
                b'Z' => return error.map_or(Ok(rows), Err),
                _ => {} // RowDescription, CommandComplete, NoticeResponse, EmptyQueryResponse
            }
        }
    }

    /// The first column of the only row of `sql`.
    fn value(&mut self, sql: &str) -> String {
        let rows = self.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
        rows[0][0].clone().unwrap_or_else(|| panic!("{sql}: NULL"))
    }

    fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Terminate ('X'), then the server closes the connection.
    fn close(mut self) {
        let _ = self.stream.write_all(&[b'X', 0, 0, 0, 4]);
        let _ = self.stream.read(&mut [0u8; 1]);
    }
}

/// DataRow: Int16 column count, then per column Int32 length (-1 = NULL) and the bytes.
fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let count = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    (0..count)
        .map(|_| {
            let len = i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
            at += 4;
            (len >= 0).then(|| {
                let value = String::from_utf8_lossy(&body[at..at + len as usize]).into_owned();
                at += len as usize;
                value
            })
        })
        .collect()
}

/// ErrorResponse fields: severity ('S'), SQLSTATE ('C') and message ('M').
fn error_text(body: &[u8]) -> String {
    let mut fields = Vec::new();
    for field in body.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        if matches!(field[0], b'S' | b'C' | b'M') {
            fields.push(String::from_utf8_lossy(&field[1..]).into_owned());
        }
    }
    fields.join(" ")
}

fn refused(pg: &PostgresServer) -> bool {
    matches!(
        TcpStream::connect((pg.host(), pg.port())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused
    )
}

/// Pids of processes working in `dir` (every PostgreSQL process works in its data directory).
fn processes_in(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
            continue; // gone, a zombie, or another user's (when not root)
        };
        // A working directory deleted under a process reads as "<path> (deleted)".
        let cwd = cwd.to_string_lossy().into_owned();
        if Path::new(cwd.strip_suffix(" (deleted)").unwrap_or(&cwd)).starts_with(dir) {
            pids.push(pid);
        }
    }
    pids
}

/// The real uid of a process, from `/proc/<pid>/status`.
fn uid_of(pid: &str) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_started_server_speaks_the_protocol_with_the_fixture_settings() {
    if skip_external() {
        return;
    }
    let pg = start("one server");
    assert!(!pg.is_external());
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );
    assert_eq!(
        (pg.host(), pg.user(), pg.database()),
        ("127.0.0.1", "postgres", "postgres")
    );

    let mut s = Session::open(&pg).unwrap_or_else(|e| panic!("startup: {e}"));
    let version = s.parameter("server_version").unwrap_or("?").to_owned();
    eprintln!("fixture: server_version {version}");
    assert_eq!(s.parameter("server_encoding"), Some("UTF8"));
    assert_eq!(s.value("SELECT current_user"), "postgres");
    assert_eq!(s.value("SHOW lc_collate"), "C");
    for (setting, expected) in [
        ("fsync", "off"),
        ("full_page_writes", "off"),
        ("synchronous_commit", "on"),
        ("max_connections", "200"),
        ("max_prepared_transactions", "20"),
        ("listen_addresses", "127.0.0.1"),
    ] {
        assert_eq!(s.value(&format!("SHOW {setting}")), expected, "{setting}");
    }
    // Prepared transactions work (max_prepared_transactions > 0), and an error is a clean error.
    s.query("CREATE TABLE t (k text PRIMARY KEY)").unwrap();
    s.query("BEGIN; INSERT INTO t VALUES ('a'); PREPARE TRANSACTION 'p1'")
        .unwrap();
    assert_eq!(s.value("SELECT count(*) FROM pg_prepared_xacts"), "1");
    s.query("COMMIT PREPARED 'p1'").unwrap();
    assert_eq!(s.value("SELECT count(*) FROM t"), "1");
    let err = s.query("INSERT INTO t VALUES ('a')").unwrap_err();
    assert!(err.contains("23505"), "{err}");
    s.close();

    // As root the server runs as another user (initdb refuses root); otherwise as this one.
    let pid = pg.pid().expect("running").to_string();
    let me = uid_of("self");
    if me == 0 {
        assert_ne!(uid_of(&pid), 0, "the postmaster runs as root");
    } else {
        assert_eq!(uid_of(&pid), me);
    }
}

#[test]
fn kill_is_a_crash_that_keeps_committed_data_and_restart_recovers() {
    if skip_external() {
        return;
    }
    let pg = start("kill and restart");
    let data = pg.data_dir().unwrap().to_owned();
    let mut s = Session::open(&pg).unwrap();
    s.query("CREATE TABLE t (n int)").unwrap();
    for n in 0..100 {
        s.query(&format!("INSERT INTO t VALUES ({n})")).unwrap();
    }
    let old_pid = pg.pid().unwrap();
    assert!(processes_in(&data).len() > 1, "the postmaster has children");

    // Right after the last acknowledged commit, no grace: a crash.
    pg.kill().unwrap();
    assert_eq!(pg.pid(), None);
    assert!(refused(&pg), "port {} still accepts connections", pg.port());
    assert_eq!(
        processes_in(&data),
        Vec::<u32>::new(),
        "server processes left"
    );
    assert!(s.query("SELECT 1").is_err(), "the old session still works");
    assert!(Session::open(&pg).is_err());
    pg.kill().unwrap(); // a dead server is left alone

    pg.restart().unwrap();
    let new_pid = pg.pid().unwrap();
    assert_ne!(new_pid, old_pid);
    let mut s = Session::open(&pg).unwrap();
    assert_eq!(s.value("SELECT count(*) FROM t"), "100");
    assert_eq!(s.value("SELECT max(n) FROM t"), "99");
    s.close();

    // Restart of a running server: killed first, same port.
    let port = pg.port();
    pg.restart().unwrap();
    assert_eq!(pg.port(), port);
    let mut s = Session::open(&pg).unwrap();
    assert_eq!(s.value("SELECT count(*) FROM t"), "100");
}

#[test]
fn two_servers_run_side_by_side_and_each_is_gone_when_dropped() {
    if skip_external() {
        return;
    }
    let (a, b) = std::thread::scope(|scope| {
        let a = scope.spawn(|| start("server a"));
        let b = scope.spawn(|| start("server b"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());
    let mut sa = Session::open(&a).unwrap();
    let mut sb = Session::open(&b).unwrap();
    sa.query("CREATE TABLE only_in_a (x int)").unwrap();
    assert_eq!(
        sb.value("SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'"),
        "0"
    );
    sb.close();

    // Dropped with a session still open: the fast shutdown ends it.
    let (port, data) = (a.port(), a.data_dir().unwrap().to_owned());
    let folder = data.parent().unwrap().to_owned();
    drop(a);
    assert!(sa.query("SELECT 1").is_err());
    let after = TcpStream::connect(("127.0.0.1", port));
    assert!(
        matches!(&after, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused),
        "port {port} after drop: {after:?}"
    );
    assert!(!folder.exists(), "{} was not deleted", folder.display());
    assert_eq!(processes_in(&data), Vec::<u32>::new());

    let mut sb = Session::open(&b).unwrap();
    assert_eq!(sb.value("SELECT 1"), "1");
}

#[test]
fn a_failed_start_carries_the_servers_log_and_leaves_nothing_behind() {
    if skip_external() {
        return;
    }
    let err = PostgresServer::start_with(&[("no_such_setting", "1")]).unwrap_err();
    let text = err.to_string();
    eprintln!("fixture: expected failure: {text}");
    assert!(
        matches!(
            err,
            kafka_fixture::FixtureError::PostgresExited {
                port_clash: false,
                ..
            }
        ),
        "{err:?}"
    );
    // PostgreSQL's own words, from the log's end.
    assert!(text.contains("no_such_setting"), "{text}");
    // The message names the folder ("(as USER, in FOLDER)"), which is deleted by now.
    let folder = text
        .split(", in ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no folder in {text}"));
    assert!(!Path::new(folder).exists(), "{folder} is left");
}
