//! A real Apache Kafka cluster for tests, run from Maven Central jars (no Docker).
//!
//! ```no_run
//! # async fn demo() {
//! use protocol_tests::{cluster, unique, ClusterSpec};
//! let kafka = cluster(ClusterSpec::kafka4()).await; // shared by every test in this binary
//! let topic = unique("orders"); // tests share the cluster, so names must not collide
//! println!("{} runs Kafka {} at {}", topic, kafka.version(), kafka.bootstrap());
//! # }
//! ```
//!
//! FACTS_PLACEHOLDER
#![deny(missing_docs)]

mod cluster;
mod jars;
pub mod probe;
mod procs;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cluster::LocalCluster;

/// The Kafka 4.x release used unless `SNAPFENCE_KAFKA_VERSION` names another: the newest 4.x that
/// resolves from Maven Central when this was written.
pub const DEFAULT_KAFKA4: &str = "4.4.0";
/// The Kafka 3.9 release used unless `SNAPFENCE_KAFKA39_VERSION` names another.
pub const DEFAULT_KAFKA39: &str = "3.9.2";

/// An Apache Kafka release, "major.minor.patch".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KafkaVersion(String);

impl KafkaVersion {
    /// A release by its number. Panics unless `version` is two or three dot-separated numbers (it becomes
    /// part of a path and a Maven coordinate).
    pub fn new(version: &str) -> KafkaVersion {
        let parts: Vec<&str> = version.split('.').collect();
        let ok = (2..=3).contains(&parts.len())
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        assert!(ok, "not a Kafka version (want e.g. 4.4.0): {version:?}");
        KafkaVersion(version.to_owned())
    }

    /// The default 4.x release: `SNAPFENCE_KAFKA_VERSION` if set, else [`DEFAULT_KAFKA4`].
    pub fn kafka4() -> KafkaVersion {
        Self::from_env("SNAPFENCE_KAFKA_VERSION", DEFAULT_KAFKA4)
    }

    /// The 3.9 release: `SNAPFENCE_KAFKA39_VERSION` if set, else [`DEFAULT_KAFKA39`].
    pub fn kafka39() -> KafkaVersion {
        Self::from_env("SNAPFENCE_KAFKA39_VERSION", DEFAULT_KAFKA39)
    }

    fn from_env(var: &str, default: &str) -> KafkaVersion {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => KafkaVersion::new(v.trim()),
            _ => KafkaVersion::new(default),
        }
    }

    /// The version string, e.g. "4.4.0".
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The major release number (3 or 4).
    pub fn major(&self) -> u32 {
        self.part(0)
    }

    /// The minor release number.
    pub fn minor(&self) -> u32 {
        self.part(1)
    }

    fn part(&self, i: usize) -> u32 {
        self.0
            .split('.')
            .nth(i)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }
}

impl fmt::Display for KafkaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What cluster a test needs. Equal specs share one cluster per test binary (see [`cluster`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// The Kafka release.
    pub version: KafkaVersion,
    /// How many combined broker+controller nodes (1 or 3; node ids are 1..=nodes). With 3 nodes the
    /// replication factors become 3 and `min.insync.replicas` 2.
    pub nodes: usize,
    /// `--feature transaction.version=N` at format time (4.x: 1 or 2). None = the release's default
    /// (2 on 4.x).
    pub transaction_version: Option<i16>,
    /// `--feature group.version=N` at format time (4.x: 0 or 1). None = the release's default (1 on 4.x).
    pub group_version: Option<i16>,
    /// Extra `server.properties` lines, overriding the fixture's defaults.
    pub broker_props: Vec<(String, String)>,
}

impl ClusterSpec {
    /// One Kafka 4.x node with its default features (transaction.version 2, group.version 1).
    pub fn kafka4() -> ClusterSpec {
        ClusterSpec {
            version: KafkaVersion::kafka4(),
            nodes: 1,
            transaction_version: None,
            group_version: None,
            broker_props: Vec::new(),
        }
    }

    /// One Kafka 4.x node formatted with transaction.version 1 (the pre-KIP-890-part-2 transaction path).
    pub fn kafka4_tv1() -> ClusterSpec {
        ClusterSpec {
            transaction_version: Some(1),
            ..Self::kafka4()
        }
    }

    /// One Kafka 3.9 node (transactions without KIP-890 part 2; the KIP-848 protocol switched on as preview).
    pub fn kafka39() -> ClusterSpec {
        ClusterSpec {
            version: KafkaVersion::kafka39(),
            ..Self::kafka4()
        }
    }

    /// Three Kafka 4.x nodes: replication factor 3, `min.insync.replicas` 2, a 3 s broker session timeout.
    pub fn three_nodes() -> ClusterSpec {
        ClusterSpec {
            nodes: 3,
            ..Self::kafka4()
        }
    }

    /// This spec with `transaction.version` set at format time.
    pub fn with_transaction_version(self, level: i16) -> ClusterSpec {
        ClusterSpec {
            transaction_version: Some(level),
            ..self
        }
    }

    /// This spec with `group.version` set at format time.
    pub fn with_group_version(self, level: i16) -> ClusterSpec {
        ClusterSpec {
            group_version: Some(level),
            ..self
        }
    }

    /// This spec with one more broker property.
    pub fn with_prop(mut self, key: &str, value: &str) -> ClusterSpec {
        self.broker_props.push((key.to_owned(), value.to_owned()));
        self
    }

    fn validate(&self) -> Result<(), FixtureError> {
        if self.nodes == 0 {
            return Err(FixtureError::BadSpec(
                "a cluster needs at least one node".into(),
            ));
        }
        Ok(())
    }
}

/// Why a cluster could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// `java` or `mvn` cannot be run; the message says how to install it.
    #[error("{tool} is needed by the Kafka test fixture: {detail}")]
    MissingTool {
        /// The program that is missing.
        tool: String,
        /// What happened and how to fix it.
        detail: String,
    },
    /// Fetching the broker jars from Maven Central failed.
    #[error("fetching the Kafka {version} jars failed: {detail}")]
    Download {
        /// The Kafka release.
        version: String,
        /// Maven's output or the check that failed.
        detail: String,
    },
    /// A file or socket operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path (or address) involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `StorageTool format` failed.
    #[error("formatting node {node} failed: {detail}")]
    Format {
        /// The node id.
        node: i32,
        /// The tool's output.
        detail: String,
    },
    /// A broker JVM exited on its own.
    #[error("Kafka node {node} {detail}")]
    NodeExited {
        /// The node id.
        node: i32,
        /// The node's log tails.
        detail: String,
        /// The JVM could not bind its port (another process took it): the start is retried on new ports.
        port_clash: bool,
    },
    /// The cluster did not become ready in time.
    #[error("Kafka cluster not ready: {detail}")]
    NotReady {
        /// The last failed check and the node log tails.
        detail: String,
    },
    /// The spec cannot be run.
    #[error("bad cluster spec: {0}")]
    BadSpec(String),
}

impl FixtureError {
    fn io(path: &Path, source: std::io::Error) -> FixtureError {
        FixtureError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// A running Kafka cluster: one the fixture started, or the external one named by `SNAPFENCE_BOOTSTRAP`.
pub struct KafkaCluster {
    inner: Inner,
}

enum Inner {
    Local(Arc<LocalCluster>),
    External {
        bootstrap: String,
        version: String,
        node_ids: Vec<i32>,
    },
}

impl fmt::Debug for KafkaCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaCluster")
            .field("bootstrap", &self.bootstrap())
            .field("version", &self.version())
            .field("external", &self.is_external())
            .finish()
    }
}

impl KafkaCluster {
    /// Starts a private cluster for `spec` and blocks until it is ready (or returns the external cluster
    /// when `SNAPFENCE_BOOTSTRAP` is set). For code outside async tests, e.g. examples; tests use
    /// [`cluster`] or [`dedicated`].
    pub fn start(spec: &ClusterSpec) -> Result<KafkaCluster, FixtureError> {
        if let Some(external) = external()? {
            return Ok(external);
        }
        Ok(KafkaCluster {
            inner: Inner::Local(Arc::new(LocalCluster::start(spec)?)),
        })
    }

    /// Comma-separated `127.0.0.1:port` of every node's client listener.
    pub fn bootstrap(&self) -> String {
        match &self.inner {
            Inner::Local(c) => c.bootstrap(),
            Inner::External { bootstrap, .. } => bootstrap.clone(),
        }
    }

    /// The node ids (1..=nodes for a fixture cluster; from a Metadata request for an external one).
    pub fn node_ids(&self) -> Vec<i32> {
        match &self.inner {
            Inner::Local(c) => c.nodes.iter().map(|n| n.id).collect(),
            Inner::External { node_ids, .. } => node_ids.clone(),
        }
    }

    /// The client address ("127.0.0.1:port") of one node.
    pub fn node_address(&self, node: i32) -> String {
        self.local_only("node_address").node(node).address()
    }

    /// The Kafka release, e.g. "4.4.0". For an external cluster: `SNAPFENCE_KAFKA_VERSION` if set, else
    /// "external".
    pub fn version(&self) -> &str {
        match &self.inner {
            Inner::Local(c) => c.spec.version.as_str(),
            Inner::External { version, .. } => version,
        }
    }

    /// The spec this cluster was started for (None for an external cluster).
    pub fn spec(&self) -> Option<&ClusterSpec> {
        match &self.inner {
            Inner::Local(c) => Some(&c.spec),
            Inner::External { .. } => None,
        }
    }

    /// True when this is the cluster named by `SNAPFENCE_BOOTSTRAP`: it may be any version and
    /// configuration, and [`kill`](Self::kill), [`pause`](Self::pause), [`resume`](Self::resume) and
    /// [`restart`](Self::restart) panic on it. Tests that need those return early when this is true.
    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External { .. })
    }

    /// How long the start took, from before formatting to ready (None for an external cluster).
    pub fn started_in(&self) -> Option<Duration> {
        match &self.inner {
            Inner::Local(c) => Some(c.started_in),
            Inner::External { .. } => None,
        }
    }

    fn local_only(&self, what: &str) -> &LocalCluster {
        match &self.inner {
            Inner::Local(c) => c,
            Inner::External { bootstrap, .. } => panic!(
                "{what}() needs a cluster the fixture started, but SNAPFENCE_BOOTSTRAP={bootstrap} names an \
                 external one: unset it, or skip this test when is_external() is true"
            ),
        }
    }

    /// Crashes the node: SIGKILL to its JVM's process group. Its data stays for [`restart`](Self::restart).
    /// A node that is not running is left alone. Panics for an external cluster or an unknown node.
    pub fn kill(&self, node: i32) {
        self.local_only("kill").kill(node);
    }

    /// Freezes the node with SIGSTOP: its sockets stay open but nothing answers, as in a long GC pause.
    /// Panics for an external cluster, an unknown node or a node that is not running.
    pub fn pause(&self, node: i32) {
        self.local_only("pause").set_paused(node, true);
    }

    /// Thaws a paused node with SIGCONT. Panics like [`pause`](Self::pause).
    pub fn resume(&self, node: i32) {
        self.local_only("resume").set_paused(node, false);
    }

    /// Kills the node if it still runs, starts it again on the same data dir and ports, and waits until
    /// every running node lists it and the coordinators answer again. Panics when it does not come back in
    /// time (with the node's log), for an external cluster, or for an unknown node.
    ///
    /// Cancel safety: not cancel-safe in effect. The restart runs on its own thread; dropping the future
    /// stops waiting for it, but the node still restarts.
    pub async fn restart(&self, node: i32) {
        self.local_only("restart");
        let Inner::Local(local) = &self.inner else {
            unreachable!("local_only panics for external")
        };
        let local = Arc::clone(local);
        let result = off_runtime(move || local.restart(node)).await;
        if let Err(e) = result {
            panic!("restarting node {node} failed: {e}");
        }
    }

    /// Blocking form of [`restart`](Self::restart), for code outside async tests.
    pub fn restart_blocking(&self, node: i32) -> Result<(), FixtureError> {
        self.local_only("restart_blocking").restart(node)
    }

    /// The folder holding the broker's jars (and so `kafka-clients`), for Java interop peers run with
    /// `java -cp "DIR/*"`. For an external cluster, the jars of [`KafkaVersion::kafka4`], fetched if needed.
    pub fn libs_dir(&self) -> PathBuf {
        match &self.inner {
            Inner::Local(c) => c.libs.clone(),
            Inner::External { .. } => libs_dir(&KafkaVersion::kafka4())
                .unwrap_or_else(|e| panic!("cannot provide Kafka jars: {e}")),
        }
    }
}

/// The jar folder for `version` (fetched from Maven Central on first use, then cached): for Java peers that
/// need `kafka-clients` without a cluster.
pub fn libs_dir(version: &KafkaVersion) -> Result<PathBuf, FixtureError> {
    jars::libs_dir(version)
}

/// The external cluster, when `SNAPFENCE_BOOTSTRAP` names one.
fn external() -> Result<Option<KafkaCluster>, FixtureError> {
    let Some(bootstrap) = std::env::var("SNAPFENCE_BOOTSTRAP")
        .ok()
        .filter(|b| !b.trim().is_empty())
    else {
        return Ok(None);
    };
    let first = bootstrap
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let not_ready = |e: probe::ProbeError| FixtureError::NotReady {
        detail: format!("SNAPFENCE_BOOTSTRAP={bootstrap}: {e}"),
    };
    let node_ids = probe::Probe::connect(&first, Duration::from_secs(10))
        .and_then(|mut p| p.broker_ids())
        .map_err(not_ready)?;
    let version = std::env::var("SNAPFENCE_KAFKA_VERSION").unwrap_or_else(|_| "external".into());
    Ok(Some(KafkaCluster {
        inner: Inner::External {
            bootstrap,
            version,
            node_ids,
        },
    }))
}

type Slot = Arc<OnceLock<Result<Arc<KafkaCluster>, String>>>;

/// The cluster for `spec`, shared by every test of this test binary: the first caller starts it (the others
/// wait for it), and it runs until the test process exits. Tests sharing it must use [`unique`] names.
/// Panics with the reason when the cluster cannot be started (every later caller for the same spec gets the
/// same panic without a second try). Returns the external cluster when `SNAPFENCE_BOOTSTRAP` is set.
///
/// Works from any `#[tokio::test]`: the start runs on its own thread, and the cluster's processes are not
/// tied to the calling runtime. Cancel safety: cancel-safe; a dropped call leaves the start running for the
/// next caller.
pub async fn cluster(spec: ClusterSpec) -> Arc<KafkaCluster> {
    let slot: Slot = {
        static CLUSTERS: OnceLock<Mutex<HashMap<ClusterSpec, Slot>>> = OnceLock::new();
        let mut map = CLUSTERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Arc::clone(map.entry(spec.clone()).or_default())
    };
    let result = off_runtime(move || {
        slot.get_or_init(|| {
            KafkaCluster::start(&spec)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
    })
    .await;
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// A cluster for the caller alone, for tests that kill, pause or restart nodes. It is stopped (SIGKILL) and
/// its data deleted when dropped. Panics when it cannot be started. With `SNAPFENCE_BOOTSTRAP` set it is the
/// external cluster, on which the node faults panic (see [`KafkaCluster::is_external`]).
///
/// Cancel safety: a dropped call stops waiting; the cluster being started is stopped when its start ends.
pub async fn dedicated(spec: ClusterSpec) -> KafkaCluster {
    off_runtime(move || KafkaCluster::start(&spec))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs blocking fixture work on a plain thread and waits for it without blocking the caller's runtime
/// (a `#[tokio::test]` runtime has one thread, and other tasks of the test may need it meanwhile).
async fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let handle = std::thread::Builder::new()
        .name("kafka-fixture".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .expect("cannot start a fixture thread");
    match rx.await {
        Ok(value) => value,
        Err(_) => match handle.join() {
            Err(payload) => std::panic::resume_unwind(payload),
            Ok(()) => unreachable!("the fixture thread ended without sending its result"),
        },
    }
}

/// A name no other test of any process uses: `prefix-<pid>-<counter>-<nanos>`. Kafka topic, group and
/// transactional-id names all accept it.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_reject_path_tricks() {
        let v = KafkaVersion::new("4.4.0");
        assert_eq!((v.major(), v.minor()), (4, 4));
        assert!(std::panic::catch_unwind(|| KafkaVersion::new("../4.4.0")).is_err());
        assert!(std::panic::catch_unwind(|| KafkaVersion::new("4")).is_err());
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique("t"), unique("t"));
        assert!(unique("t").starts_with("t-"));
    }

    #[test]
    fn presets_differ_where_they_should() {
        assert_eq!(ClusterSpec::kafka4_tv1().transaction_version, Some(1));
        assert_eq!(ClusterSpec::three_nodes().nodes, 3);
        assert_eq!(ClusterSpec::kafka39().version.major(), 3);
        assert_ne!(ClusterSpec::kafka4(), ClusterSpec::kafka4_tv1());
    }
}
