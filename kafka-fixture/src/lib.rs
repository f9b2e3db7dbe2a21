//! A real Apache Kafka cluster for tests, run from Maven Central jars (no Docker).
//!
//! ```no_run
//! # async fn demo() {
//! use kafka_fixture::{cluster, unique, ClusterSpec};
//! let kafka = cluster(ClusterSpec::kafka4()).await; // shared by every test in this binary
//! let topic = unique("orders"); // tests share the cluster, so names must not collide
//! println!("{} runs Kafka {} at {}", topic, kafka.version(), kafka.bootstrap());
//! # }
//! ```
//!
//! # What the fixture does
//! - **Jars.** On first use per Kafka release it writes `<cache>/kafka/<v>/pom.xml` (packaging `pom`:
//!   `org.apache.kafka:kafka_2.13:<v>` plus one SLF4J binding) and runs
//!   `mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies -DincludeScope=runtime`
//!   into a temp folder, checks the broker jar is there with exactly one SLF4J binding, and renames it to
//!   `<cache>/kafka/<v>/libs`. An `flock` on `<cache>/kafka/<v>/.lock` serialises concurrent test processes.
//!   Later runs need neither the network nor `mvn`. A missing `java` or `mvn` fails with a message naming
//!   the tool and the `apt-get` line that installs it.
//! - **Nodes.** KRaft combined `broker,controller` nodes (ids 1..=n) on ports picked by binding
//!   `127.0.0.1:0`, a static `controller.quorum.voters`, the settings of `shared/BROKER.md` (replication
//!   factors 3 / min ISR 2 with three nodes), each formatted by `kafka.tools.StorageTool format` with the
//!   spec's `--feature` flags. Logs: WARN and above plus the "Kafka Server started" line go to
//!   `server.log` in the node folder; JVM output to `stdout.log`. JVM: `-Xms512m -Xmx512m` and
//!   `-XX:+UseSerialGC -XX:TieredStopAtLevel=1`, plus an AppCDS archive recorded once per release (see the
//!   measurements below).
//! - **Ready** means: every running node logged "Kafka Server started", every running node answers a
//!   Metadata request listing every running node, and FindCoordinator for a group and for a transactional id
//!   both answer without error. It is checked by [`probe::Probe`], a blocking client of its own, never by
//!   snapfence's `net` layer (the code under test).
//! - **Faults.** [`KafkaCluster::kill`] = SIGKILL to the JVM's process group (a crash),
//!   [`KafkaCluster::pause`]/[`KafkaCluster::resume`] = SIGSTOP/SIGCONT (a frozen process whose sockets stay
//!   open), [`KafkaCluster::stop`] = SIGTERM (a controlled shutdown) with SIGKILL after 60 s,
//!   [`KafkaCluster::restart`] = start again on the same data dir and ports, then wait until ready.
//! - **Partitions between brokers.** With [`ClusterSpec::with_isolated_brokers`] every broker runs in a
//!   network namespace of its own and clients reach it through a forwarder on 127.0.0.1;
//!   [`KafkaCluster::partition_brokers`] / [`KafkaCluster::isolate_broker`] then drop the packets between
//!   brokers silently, and [`KafkaCluster::heal_brokers`] / [`KafkaCluster::heal_all`] undo it.
//! - **No JVM left behind**: every JVM gets its own process group and `PR_SET_PDEATHSIG(SIGKILL)` from one
//!   long-lived spawner thread (so it dies with the test process, even on SIGKILL); dropping a cluster kills
//!   its nodes; an `atexit` hook kills and deletes this process's clusters, and so does SIGTERM or SIGINT
//!   before it ends the process (unless the program handles that signal itself: see [`procs`]); and pid
//!   files under `<cache>/run/<pid>.<starttime>/` let the next test process kill JVMs whose owner is gone
//!   (checked by the JVM's own start time, so a recycled pid is never hit). A cluster whose start failed is
//!   moved to `<cache>/failed/` (newest five kept) for a post-mortem.
//! - **Sharing.** [`cluster`] keeps one cluster per distinct [`ClusterSpec`] per test binary, started by
//!   the first test that asks; [`dedicated`] gives a private one that is stopped on drop. Neither is tied to
//!   a tokio runtime: the start runs on a plain thread and the JVMs are `std::process` children.
//! - **PostgreSQL.** [`PostgresServer::start`] runs a private PostgreSQL server from the installed
//!   binaries (`initdb`, then `postgres` as this process's child, trust authentication on 127.0.0.1, as
//!   the `postgres` system user when the tests run as root), with [`PostgresServer::kill`] and
//!   [`PostgresServer::restart`] for crash tests; see [`postgres`].
//!
//! # Environment
//! | variable | effect |
//! |---|---|
//! | `SNAPFENCE_BOOTSTRAP` | use this external cluster for every spec; node faults then panic (tests check [`KafkaCluster::is_external`] and skip) |
//! | `SNAPFENCE_POSTGRES_URL` | use this external PostgreSQL server (`postgres://user@host:port/db`) instead of starting one; its faults then return [`FixtureError::PostgresExternal`] (tests check [`PostgresServer::is_external`] and skip) |
//! | `SNAPFENCE_PG_BINDIR` | the folder with PostgreSQL's `initdb` and `postgres` (default: the newest `/usr/lib/postgresql/*/bin`, then `pg_config --bindir`, then `PATH`) |
//! | `SNAPFENCE_KAFKA_VERSION` | the 4.x release of [`ClusterSpec::kafka4`] (default [`DEFAULT_KAFKA4`]) |
//! | `SNAPFENCE_KAFKA42_VERSION` | the 4.2 release of [`ClusterSpec::kafka42`] (default [`DEFAULT_KAFKA42`]) |
//! | `SNAPFENCE_KAFKA39_VERSION` | the 3.9 release of [`ClusterSpec::kafka39`] (default [`DEFAULT_KAFKA39`]) |
//! | `SNAPFENCE_CACHE` | the cache folder (default `~/.cache/snapfence`) |
//! | `SNAPFENCE_KAFKA_JVM_OPTS` | replaces the start-up JVM flags, e.g. `-XX:+UseG1GC` for a full-speed broker in benchmarks |
//! | `SNAPFENCE_KAFKA_CDS=0` | no class-data-sharing archive (neither recorded nor used) |
//! | `SNAPFENCE_KAFKA_LOGGERS` | extra broker loggers in `server.log`, `logger=LEVEL` comma-separated, e.g. `kafka.coordinator.transaction=TRACE` |
//! | `JAVA_HOME` | the JVM to run (default `java` on `PATH`) |
//!
//! # Broker facts proven here (checked against `shared/BROKER.md`)
//! Proven by the tests in `tests/fixture.rs` or by `cargo run -p kafka-fixture --bin kafka-fixture`:
//! - Coordinates: `kafka_2.13:4.4.0` + `log4j-slf4j-impl:2.25.3` gives 45 jars with one binding
//!   (`log4j-core`/`log4j-api` come with the binding; 4.4.0 still uses `slf4j-api` 1.7.36).
//!   `kafka_2.13:3.9.2` + `slf4j-reload4j:1.7.36` + `reload4j:1.2.25` gives 57 jars with one binding.
//!   A cold fetch of both takes about 15 s each.
//! - Main classes `kafka.tools.StorageTool` and `kafka.Kafka` exist in both releases. `format -t ID -c FILE`
//!   without `--standalone` works with a static `controller.quorum.voters`, for one node and for three
//!   formatted with one cluster id and started together. A cluster id made in Rust (16 random bytes,
//!   base64url without padding) is accepted.
//! - `--feature transaction.version=1` and `--feature group.version=0` are accepted by 4.4.0's StorageTool
//!   and show up as the finalized levels in ApiVersions.
//! - The log line is `[KafkaRaftServer nodeId=N] Kafka Server started` from logger
//!   `kafka.server.KafkaRaftServer` in both releases; 4.x reads a Log4j 2 *properties* file through
//!   `-Dlog4j2.configurationFile`, 3.9 a log4j 1 file through `-Dlog4j.configuration=file:`.
//! - Every setting listed in BROKER.md is accepted by both releases (3.9 only warns about the share
//!   coordinator ones, which it does not know, without a warning).
//! - Three nodes: after SIGKILL of one node the survivors keep answering Metadata and stop listing the dead
//!   node within about 3 s (`broker.session.timeout.ms=3000`); restarted on the same data dir without
//!   re-formatting it rejoins and is listed by all nodes again.
//! - SIGSTOP: the kernel still completes TCP handshakes to the frozen broker, but nothing answers;
//!   after SIGCONT an old connection works again. A node uses about 230 MB (4.4.0) to 290 MB (3.9.2)
//!   resident after start, less than the 0.5 GB BROKER.md estimated.
//!
//! # Broker facts corrected or added
//! - 4.4.0's default format finalizes more than `transaction.version=2` and `group.version=1`: also
//!   `share.version=2`, `streams.version=1`, `eligible.leader.replicas.version=1`, and
//!   `metadata.version=33` (4.4-IV2). Share groups and streams groups are on by default.
//! - A feature at level 0 is absent from `finalized_features` (not listed as 0): with `group.version=0`
//!   ApiVersions simply has no `group.version` entry.
//! - `group.version=0` does not hide the KIP-848 APIs: ConsumerGroupHeartbeat is still advertised
//!   (v0..v1), but a join answers UNSUPPORTED_VERSION (35). Likewise a TV1 cluster advertises exactly the
//!   same API version ranges as a TV2 one (EndTxn up to v5, TxnOffsetCommit up to v6, Produce up to v13):
//!   a client must choose the KIP-890 part 2 path from the finalized `transaction.version`, not from API
//!   versions.
//! - 3.9.2 finalizes only `metadata.version` (21 = 3.9-IV0): there is no `transaction.version` and no
//!   `group.version` entry at all (so level 0 for both). It advertises ConsumerGroupHeartbeat v0 whether or
//!   not the preview is on; `group.coordinator.rebalance.protocols=classic,consumer` is all 3.9.2 needs for
//!   a KIP-848 join to succeed (without it: 35 UNSUPPORTED_VERSION). Its first heartbeat must carry a
//!   non-empty `SubscribedTopicNames` (an empty list is INVALID_REQUEST, 42).
//! - ApiVersions v3 omits every *supported* feature whose minimum level is 0 (both releases list only
//!   `metadata.version` there); ApiVersions v4 lists them all (4.4.0: `group.version` 0..1,
//!   `transaction.version` 0..2, `kraft.version` 0..1, ...). Finalized features are complete at v3.
//!   4.4.0 advertises ApiVersions up to v5, beyond kafka-protocol 0.18 (v4).
//! - The newest log4j 2.25.x that resolves is 2.25.3 (BROKER.md said "2.25.x").
//!
//! # Start-up times
//! Measured on this 2-core machine while other builds ran (load average 5 to 14), so treat them as
//! ranges. "Ready" is from writing the configs to the readiness check passing (format included), as
//! reported by [`KafkaCluster::started_in`]; `cargo run -p kafka-fixture --bin kafka-fixture -- 4|3n|39`
//! prints it.
//!
//! | what | time |
//! |---|---|
//! | single 4.4.0 node ready | 3.5-4 s alone; 5-9 s when tests start clusters two at a time |
//! | single 3.9.2 node ready | 3-3.5 s alone; 5-7 s in the test run |
//! | three 4.4.0 nodes ready | 10.7-11.6 s alone; 13-21 s in the test run |
//! | restart of one of three nodes until all list it again | 2.8-6.3 s |
//! | cold jar fetch (empty `~/.m2` too) | 4.4.0: 18 s alone; both releases in parallel under load: 43 s |
//! | recording the class-data archive (once per release) | 10-15 s alone, 22-28 s under load |
//! | `cargo test -p protocol-tests`, cold cache and empty Maven repository | 114 s |
//! | the same, warm | 47-58 s |
//!
//! JVM flags, single 4.4.0 node, interleaved runs: default G1 + C2 10-13 s, serial GC 7-19 s, C1 only
//! (`-XX:TieredStopAtLevel=1`) 4-8.5 s, serial + C1 4-9 s. C1 is the gain; serial GC is kept because it
//! starts no GC worker threads on two cores. AppCDS on top: single node 5.9-9.0 s without → 3.5-3.9 s
//! with, three nodes 15.8-17.0 s → 10.7-11.6 s. `-Xshare:auto` is already the JDK 17 default. The readiness
//! check itself takes 0.2-1.5 s after the last "started" line: the first FindCoordinator calls answer
//! COORDINATOR_NOT_AVAILABLE (15) while `__consumer_offsets` and `__transaction_state` are created, as
//! BROKER.md said.
//!
//! # kafka-protocol features
//! This crate enables only kafka-protocol's `client` feature. Its `Request` trait is implemented only when
//! both `client` and `broker` are on, so the probe is generic over `Encodable + HeaderVersion` instead; turning
//! `broker` on here would, through Cargo feature unification, hide from `cargo test --workspace` any use of
//! `Request` in the snapfence library that a plain `cargo build -p snapfence` would reject.
//!
//! # References
//! - KIP-500/KIP-631 (KRaft), KIP-584 (versioned features), KIP-848 (consumer groups), KIP-890
//!   (transaction.version 2), KIP-511 (ApiVersions v3), KIP-1082 (client-made member ids, heartbeat v1)
#![deny(missing_docs)]

mod cluster;
mod jars;
mod netns;
pub mod postgres;
pub mod probe;
pub mod procs;
mod progress;
pub mod proxy;
mod security;

pub use postgres::PostgresServer;
pub use progress::{Observer, Progress, Step};
pub use proxy::{Fault, FaultProxy, ProxyError, ProxyStats, Requests};
pub use security::{Listener, SecuritySpec, TlsSpec};

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
/// The Kafka 4.2 release used unless `SNAPFENCE_KAFKA42_VERSION` names another: the newest line with
/// KIP-848 but without KIP-1251 (4.3+ accepts a commit at a lagging member epoch for a partition the
/// member still owns), so a consumer-protocol member's spurious-fence window is widest there.
pub const DEFAULT_KAFKA42: &str = "4.2.1";
/// The Kafka 3.9 release used unless `SNAPFENCE_KAFKA39_VERSION` names another.
pub const DEFAULT_KAFKA39: &str = "3.9.2";

/// An Apache Kafka release, "major.minor.patch".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KafkaVersion(String);

impl KafkaVersion {
    /// A release by its number. Panics unless `version` is two or three dot-separated numbers (it becomes
    /// part of a path and a Maven coordinate).
    pub fn new(version: &str) -> KafkaVersion {
        Self::parse(version)
            .unwrap_or_else(|| panic!("not a Kafka version (want e.g. 4.4.0): {version:?}"))
    }

    /// A release by its number, or None unless `version` is two or three dot-separated numbers.
    pub fn parse(version: &str) -> Option<KafkaVersion> {
        let parts: Vec<&str> = version.split('.').collect();
        let ok = (2..=3).contains(&parts.len())
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        ok.then(|| KafkaVersion(version.to_owned()))
    }

    /// The default 4.x release: `SNAPFENCE_KAFKA_VERSION` if set, else [`DEFAULT_KAFKA4`].
    pub fn kafka4() -> KafkaVersion {
        Self::from_env("SNAPFENCE_KAFKA_VERSION", DEFAULT_KAFKA4)
    }

    /// The 4.2 release: `SNAPFENCE_KAFKA42_VERSION` if set, else [`DEFAULT_KAFKA42`].
    pub fn kafka42() -> KafkaVersion {
        Self::from_env("SNAPFENCE_KAFKA42_VERSION", DEFAULT_KAFKA42)
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
    /// Extra `server.properties` lines, overriding the fixture's defaults. `{node}` in a value is replaced
    /// by each node's id (`broker.rack=rack-{node}`).
    pub broker_props: Vec<(String, String)>,
    /// Secured client listeners, users and ACL enforcement (see [`SecuritySpec`]). None = the plain
    /// fixture: one PLAINTEXT listener, no authorizer.
    pub security: Option<SecuritySpec>,
    /// Each broker in a network namespace of its own, reached by clients through a forwarder on
    /// 127.0.0.1, so the network between brokers can be cut (see
    /// [`with_isolated_brokers`](Self::with_isolated_brokers)).
    pub isolated_brokers: bool,
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
            security: None,
            isolated_brokers: false,
        }
    }

    /// One Kafka 4.x node formatted with transaction.version 1 (the pre-KIP-890-part-2 transaction path).
    pub fn kafka4_tv1() -> ClusterSpec {
        ClusterSpec {
            transaction_version: Some(1),
            ..Self::kafka4()
        }
    }

    /// One Kafka 4.2 node with its default features (transaction.version 2, group.version 1): KIP-848
    /// before KIP-1251's assignment epochs (see [`DEFAULT_KAFKA42`]).
    pub fn kafka42() -> ClusterSpec {
        ClusterSpec {
            version: KafkaVersion::kafka42(),
            ..Self::kafka4()
        }
    }

    /// One Kafka 3.9 node as the release ships: transactions without KIP-890 part 2, the classic group
    /// coordinator, no KIP-848. See [`kafka39_consumer_preview`](Self::kafka39_consumer_preview) for the
    /// preview.
    pub fn kafka39() -> ClusterSpec {
        ClusterSpec {
            version: KafkaVersion::kafka39(),
            ..Self::kafka4()
        }
    }

    /// Kafka 3.9 with the KIP-848 consumer protocol switched on as a preview
    /// (`group.coordinator.rebalance.protocols=classic,consumer`), which also runs the new group
    /// coordinator. That coordinator can lose WriteTxnMarkers answers and wedge a transactional id for
    /// good (KAFKA-17877, fixed in 4.0; see docs/reliability.md), so only tests about the preview itself
    /// use this spec.
    pub fn kafka39_consumer_preview() -> ClusterSpec {
        Self::kafka39().with_prop("group.coordinator.rebalance.protocols", "classic,consumer")
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

    /// This spec with KIP-939 two-phase commit on: `transaction.two.phase.commit.enable=true`, and
    /// `unstable.api.versions.enable=true`, without which Kafka 4.4 does not advertise InitProducerId v6
    /// (its spec marks the version unstable). 4.4.0 still refuses `KeepPreparedTxn` (KAFKA-20739).
    pub fn with_two_phase_commit(self) -> ClusterSpec {
        self.with_prop("transaction.two.phase.commit.enable", "true")
            .with_prop("unstable.api.versions.enable", "true")
    }

    /// This spec with secured listeners, users and ACL enforcement.
    pub fn with_security(self, security: SecuritySpec) -> ClusterSpec {
        ClusterSpec {
            security: Some(security),
            ..self
        }
    }

    /// This spec with every broker in a Linux network namespace of its own, so that
    /// [`KafkaCluster::partition_brokers`] and [`KafkaCluster::isolate_broker`] can cut the network
    /// between brokers while clients still reach every one of them. Needs root and `ip` (iproute2); the
    /// start fails with [`FixtureError::NetnsUnavailable`] otherwise. Not combinable with
    /// [`with_security`](Self::with_security).
    ///
    /// Per cluster: a hub namespace holding a bridge, one namespace per broker joined to it by a veth
    /// pair, and the private subnet 10.213.0.0/24 (broker N is 10.213.0.N; every cluster has its own
    /// copy, so concurrent clusters never meet). Each broker binds its client, inter-broker and controller
    /// listeners on its private address; its client listener is advertised as 127.0.0.1:P, a forwarder in
    /// the test process whose upstream sockets are made inside the hub namespace. Nothing but those
    /// 127.0.0.1 listeners is added to the root namespace. Drop deletes the namespaces (with their links);
    /// an `atexit` hook and a sweep at the next start catch what a crash left.
    pub fn with_isolated_brokers(self) -> ClusterSpec {
        ClusterSpec {
            isolated_brokers: true,
            ..self
        }
    }

    fn validate(&self) -> Result<(), FixtureError> {
        if self.nodes == 0 {
            return Err(FixtureError::BadSpec(
                "a cluster needs at least one node".into(),
            ));
        }
        if let Some(security) = &self.security {
            security.validate()?;
            if self.isolated_brokers {
                return Err(FixtureError::BadSpec(
                    "isolated brokers have plaintext listeners only (no SecuritySpec)".into(),
                ));
            }
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
    /// Isolated brokers ([`ClusterSpec::with_isolated_brokers`]) cannot be had here: not root, or no
    /// `ip` command. Tests that need them skip with this message.
    #[error("network namespaces are not available: {detail}")]
    NetnsUnavailable {
        /// Why.
        detail: String,
    },
    /// Making or changing the namespaces, links or routes of isolated brokers failed.
    #[error("network namespace setup failed: {detail}")]
    Netns {
        /// The command and its output.
        detail: String,
    },
    /// No PostgreSQL installation was found for [`PostgresServer`]; the message says how to install one.
    #[error("PostgreSQL is needed by this test: {detail}")]
    PostgresMissing {
        /// Where the fixture looked, and how to fix it.
        detail: String,
    },
    /// The tests run as root, and PostgreSQL cannot: there is no `postgres` system user to run it as, or
    /// that user cannot reach any folder the fixture could use.
    #[error("PostgreSQL cannot run as root, and {detail}")]
    PostgresUser {
        /// Why, and how to fix it.
        detail: String,
    },
    /// Preparing the data directory or running `initdb` failed.
    #[error("initialising a PostgreSQL data directory failed: {detail}")]
    PostgresInit {
        /// What failed and the end of `initdb`'s output.
        detail: String,
    },
    /// The PostgreSQL server exited on its own while starting.
    #[error("PostgreSQL server {detail}")]
    PostgresExited {
        /// The exit status and the end of the server's log.
        detail: String,
        /// The server could not bind its port (another process took it): a first start is retried on a
        /// new port.
        port_clash: bool,
    },
    /// The PostgreSQL server did not become ready in time, or the external one does not answer.
    #[error("PostgreSQL server not ready: {detail}")]
    PostgresNotReady {
        /// The last failed check and the end of the server's log.
        detail: String,
    },
    /// `SNAPFENCE_POSTGRES_URL` is not a URL the fixture understands.
    #[error("SNAPFENCE_POSTGRES_URL={url} is not a postgres:// URL with a host: {detail}")]
    PostgresUrl {
        /// The variable's value.
        url: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A server fault ([`PostgresServer::kill`], [`PostgresServer::restart`]) was asked of the external
    /// server named by `SNAPFENCE_POSTGRES_URL`. Tests check [`PostgresServer::is_external`] and skip.
    #[error(
        "{action}() needs a PostgreSQL server the fixture started, but SNAPFENCE_POSTGRES_URL={url} names \
         an external one: unset it, or skip this test when is_external() is true"
    )]
    PostgresExternal {
        /// The fault asked for.
        action: String,
        /// The external server's URL.
        url: String,
    },
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
    /// The slow steps of a first start are logged through `tracing` (see [`Progress`]).
    pub fn start(spec: &ClusterSpec) -> Result<KafkaCluster, FixtureError> {
        Self::start_observed(spec, &progress::trace)
    }

    /// [`start`](Self::start), telling `observe` each slow step (fetching the jars, recording the
    /// class-data archive, starting the nodes) as it begins and ends, on the thread doing the start.
    /// The fixture itself never writes to stdout or stderr.
    pub fn start_observed(
        spec: &ClusterSpec,
        observe: Observer<'_>,
    ) -> Result<KafkaCluster, FixtureError> {
        if let Some(external) = external()? {
            return Ok(external);
        }
        Ok(KafkaCluster {
            inner: Inner::Local(Arc::new(LocalCluster::start(spec, observe)?)),
        })
    }

    /// Comma-separated `127.0.0.1:port` of every node's client listener.
    pub fn bootstrap(&self) -> String {
        match &self.inner {
            Inner::Local(c) => c.bootstrap(),
            Inner::External { bootstrap, .. } => bootstrap.clone(),
        }
    }

    /// Comma-separated `127.0.0.1:port` of every node's `listener`. Panics when the cluster was not
    /// started with that listener (see [`SecuritySpec`]) or is external (only its bootstrap is known).
    pub fn listener_bootstrap(&self, listener: Listener) -> String {
        if listener == Listener::Plaintext {
            return self.bootstrap();
        }
        self.local_only("listener_bootstrap")
            .listener_bootstrap(listener)
            .unwrap_or_else(|| panic!("this cluster has no {} listener", listener.name()))
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

    /// The pid of the node's JVM (also its process group id) while it runs. Panics for an external cluster.
    pub fn node_pid(&self, node: i32) -> Option<u32> {
        self.local_only("node_pid").pid(node)
    }

    /// Crashes the node: SIGKILL to its JVM's process group. Its data stays for [`restart`](Self::restart).
    /// A node that is not running is left alone. Panics for an external cluster or an unknown node.
    pub fn kill(&self, node: i32) {
        self.local_only("kill").kill(node);
    }

    /// Stops the node the orderly way: SIGTERM, so the broker shuts down in a controlled way (it gives up its
    /// partition leaderships and its controller role first), then waits up to 60 s for the JVM to exit
    /// before SIGKILL. Returns true when it exited on its own. Its data stays for
    /// [`restart`](Self::restart). Blocks; panics like [`kill`](Self::kill).
    pub fn stop(&self, node: i32) -> bool {
        self.local_only("stop").stop(node, Duration::from_secs(60))
    }

    /// Freezes the node with SIGSTOP: its sockets stay open but nothing answers, as in a long GC pause.
    /// Returns once every thread of the JVM is stopped (the signal alone does not wait for that).
    /// Panics for an external cluster, an unknown node or a node that is not running, or when the node
    /// has not stopped 10 s after the signal.
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

    fn isolated(&self, what: &str) -> Result<&LocalCluster, FixtureError> {
        match &self.inner {
            Inner::Local(c) if c.isolation.is_some() => Ok(c),
            _ => Err(FixtureError::BadSpec(format!(
                "{what}() needs a cluster started with ClusterSpec::with_isolated_brokers()"
            ))),
        }
    }

    /// Cuts the network between brokers `a` and `b`, both ways, while clients still reach both: each
    /// of their namespaces gets a permanent neighbour entry for the other's address with a MAC address
    /// nobody owns, so their packets to each other are dropped *silently* (no RST, no ICMP, no error:
    /// new connections hang in SYN retransmits, established ones stall until a timeout of the broker's
    /// own). Controller traffic between the two is cut too (the nodes are combined broker+controller).
    /// Cutting a pair that is cut already does nothing. Errors for a cluster without
    /// [`ClusterSpec::with_isolated_brokers`] or an unknown node.
    pub fn partition_brokers(&self, a: i32, b: i32) -> Result<(), FixtureError> {
        self.isolated("partition_brokers")?
            .isolation_ref()
            .partition(a, b)
    }

    /// Undoes [`partition_brokers`](Self::partition_brokers): the entries are deleted, ARP finds the
    /// real addresses again and stalled connections resume with their retransmits. A pair that is not
    /// cut is left alone.
    pub fn heal_brokers(&self, a: i32, b: i32) -> Result<(), FixtureError> {
        self.isolated("heal_brokers")?.isolation_ref().heal(a, b)
    }

    /// Cuts `node` from every other broker ([`partition_brokers`](Self::partition_brokers) with each);
    /// clients still reach it through its forwarder.
    pub fn isolate_broker(&self, node: i32) -> Result<(), FixtureError> {
        let iso = self.isolated("isolate_broker")?.isolation_ref();
        for other in iso.node_ids().into_iter().filter(|&o| o != node) {
            iso.partition(node, other)?;
        }
        Ok(())
    }

    /// Heals every cut this cluster has.
    pub fn heal_all(&self) -> Result<(), FixtureError> {
        let iso = self.isolated("heal_all")?.isolation_ref();
        for (a, b) in iso.cuts() {
            iso.heal(a, b)?;
        }
        Ok(())
    }

    /// The broker pairs cut now, (lower id, higher id). Empty for a cluster without isolated brokers.
    pub fn cut_pairs(&self) -> Vec<(i32, i32)> {
        self.isolated("cut_pairs")
            .map(|c| c.isolation_ref().cuts())
            .unwrap_or_default()
    }

    /// The network namespaces (names under `/var/run/netns`) of a cluster with isolated brokers, hub
    /// first; empty otherwise. They are deleted when the cluster is dropped.
    pub fn namespaces(&self) -> Vec<String> {
        self.isolated("namespaces")
            .map(|c| c.isolation_ref().namespaces())
            .unwrap_or_default()
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

/// The folder the fixture keeps everything in: `$SNAPFENCE_CACHE`, else `$XDG_CACHE_HOME/snapfence`, else
/// `~/.cache/snapfence`. Jars live in `kafka/<version>/libs`, running clusters in `run/<pid>.<start>/`.
pub fn cache_root() -> PathBuf {
    jars::cache_root()
}

/// The jar folder for `version` (fetched from Maven Central on first use, then cached): for Java peers that
/// need `kafka-clients` without a cluster.
pub fn libs_dir(version: &KafkaVersion) -> Result<PathBuf, FixtureError> {
    jars::libs_dir(version, &progress::trace)
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

/// A private PostgreSQL server ([`PostgresServer::start`], off the async runtime), or the external one
/// `SNAPFENCE_POSTGRES_URL` names. Panics with the reason when it cannot be started.
pub async fn postgres_server() -> PostgresServer {
    off_runtime(PostgresServer::start)
        .await
        .unwrap_or_else(|e| panic!("start PostgreSQL: {e}"))
}

/// The shared cluster of `spec` and, when `with_postgres`, a PostgreSQL server beside it; the cluster
/// then has two-phase commit on, as the fenced PostgreSQL store needs
/// ([`ClusterSpec::with_two_phase_commit`]).
pub async fn cluster_and_postgres(
    spec: ClusterSpec,
    with_postgres: bool,
) -> (Arc<KafkaCluster>, Option<PostgresServer>) {
    if !with_postgres {
        return (cluster(spec).await, None);
    }
    let kafka = cluster(spec.with_two_phase_commit()).await;
    (kafka, Some(postgres_server().await))
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
        assert_eq!(KafkaVersion::parse("3.9"), Some(KafkaVersion("3.9".into())));
        for bad in ["../4.4.0", "4", "4.4.0.1", "4..0", "4.4.0-rc1", ""] {
            assert_eq!(KafkaVersion::parse(bad), None, "{bad:?}");
        }
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
        assert_eq!(KafkaVersion::new(DEFAULT_KAFKA42).minor(), 2);
        assert_ne!(ClusterSpec::kafka42(), ClusterSpec::kafka4());
        assert_ne!(ClusterSpec::kafka4(), ClusterSpec::kafka4_tv1());
    }
}
