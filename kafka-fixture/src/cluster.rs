//! Fixture-started KRaft clusters: configuration, formatting, the JVMs, readiness, and node faults.
//!
//! # References
//! - KIP-500/KIP-631 (KRaft, combined `broker,controller` nodes, static `controller.quorum.voters`)
//! - KIP-584 (feature levels set at format time: `--feature transaction.version=N`, `group.version=N`)
//! - KIP-848 (consumer group protocol: preview in 3.9, `group.coordinator.rebalance.protocols`)
//! - KIP-890 (transaction.version 2)

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::netns::{self, Isolation};
use crate::probe::Probe;
use crate::progress::{Observer, Progress, Step};
use crate::security::Listener;
use crate::{jars, procs, ClusterSpec, FixtureError};

/// The log line (logger `kafka.server.KafkaRaftServer`, level INFO) a KRaft node prints once every
/// component is up, in 3.9 and 4.x alike.
const STARTED_LINE: &str = "Kafka Server started";
/// How long a cluster start or a node restart may take before the fixture gives up. Generous because several
/// test binaries' clusters may start together on two cores.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Per-request timeout of the readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Partitions of `__consumer_offsets` and of `__transaction_state` on every fixture cluster. Readiness
/// checks each of them is loaded, so the count lives here once.
const INTERNAL_PARTITIONS: i32 = 4;
/// JVM flags that cut start-up time on a small machine (measurements in the crate docs): C1-only JIT
/// compiles the start-up path sooner and is most of the gain; serial GC has the least to set up and no
/// GC threads competing for two cores. Override with `SNAPFENCE_KAFKA_JVM_OPTS` (benchmarks that want the
/// broker at full speed set e.g. `-XX:+UseG1GC`, which re-enables C2).
const FAST_START_FLAGS: &str = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1";

pub(crate) struct LocalCluster {
    pub(crate) spec: ClusterSpec,
    pub(crate) libs: PathBuf,
    jvm: JvmSetup,
    dir: PathBuf,
    pub(crate) nodes: Vec<Node>,
    pub(crate) started_in: Duration,
    /// The namespaces and forwarders of a cluster with isolated brokers. Dropped after the JVMs are
    /// killed ([`Drop`] of this struct runs before its fields are dropped).
    pub(crate) isolation: Option<Isolation>,
}

pub(crate) struct Node {
    pub(crate) id: i32,
    pub(crate) broker_port: u16,
    controller_port: u16,
    /// The secured client listeners of a [`SecuritySpec`](crate::SecuritySpec) cluster and their ports.
    secured: Vec<(Listener, u16)>,
    dir: PathBuf,
    state: Mutex<NodeState>,
}

#[derive(Default)]
struct NodeState {
    child: Option<Child>,
    pid_file: Option<PathBuf>,
    paused: bool,
    /// Starts so far, to name the rotated log of each earlier run.
    starts: u32,
}

impl Node {
    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        // A test that panicked while holding the lock leaves consistent data (every field is set in one step).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.broker_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }
}

impl LocalCluster {
    /// Starts a cluster for `spec` and waits until it is ready. Retries with fresh ports when another
    /// process took a port between the fixture picking it and the broker binding it.
    /// Each slow step is told to `observe` as it begins and ends.
    pub(crate) fn start(
        spec: &ClusterSpec,
        observe: Observer<'_>,
    ) -> Result<LocalCluster, FixtureError> {
        spec.validate()?;
        let java_version = jars::require_java()?;
        let libs = jars::libs_dir(&spec.version, observe)?;
        let jvm = JvmSetup::new(&spec.version, &libs, &java_version, observe);
        observe(Progress::Began {
            step: Step::StartNodes,
            version: spec.version.to_string(),
            into: None,
        });
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(spec, &libs, &jvm, observe) {
                Err(FixtureError::NodeExited {
                    port_clash: true, ..
                }) if attempt < 3 => continue,
                Ok(cluster) => {
                    observe(Progress::Done {
                        step: Step::StartNodes,
                        took: cluster.started_in,
                    });
                    return Ok(cluster);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn try_start(
        spec: &ClusterSpec,
        libs: &Path,
        jvm: &JvmSetup,
        observe: Observer<'_>,
    ) -> Result<LocalCluster, FixtureError> {
        let began = Instant::now();
        let cluster = Self::unstarted(spec, libs, jvm.clone())?;
        // From here on, dropping `cluster` on an error kills whatever was started.
        if let Err(e) = cluster.boot() {
            cluster.keep_for_post_mortem(&e, observe);
            return Err(e);
        }
        let mut cluster = cluster;
        cluster.started_in = began.elapsed();
        Ok(cluster)
    }

    /// Folders and ports for `spec`, nothing started yet.
    fn unstarted(
        spec: &ClusterSpec,
        libs: &Path,
        jvm: JvmSetup,
    ) -> Result<LocalCluster, FixtureError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = procs::owner_dir().join(format!(
            "c{seq}-kafka{}-{}n",
            spec.version.as_str(),
            spec.nodes
        ));
        fs::create_dir_all(&dir).map_err(|e| FixtureError::io(&dir, e))?;
        let secured = spec
            .security
            .as_ref()
            .map(|s| s.listeners())
            .unwrap_or_default();
        let per_node = 2 + secured.len();
        let ids: Vec<i32> = (1..=spec.nodes as i32).collect();
        // Isolated: each node's listeners are on fixed ports in its own namespace; only the forwarders
        // take 127.0.0.1 ports, and they hold them, so no port can clash.
        let (ports, isolation) = if spec.isolated_brokers {
            let iso = Isolation::create(&ids)?;
            let mut ports = Vec::new();
            for &id in &ids {
                let fwd = iso.forwarder_port(id).ok_or_else(|| FixtureError::Netns {
                    detail: format!("no forwarder for node {id}"),
                })?;
                ports.extend([fwd, netns::CONTROLLER_PORT]);
            }
            (ports, Some(iso))
        } else {
            (free_ports(spec.nodes * per_node)?, None)
        };
        let nodes: Vec<Node> = (0..spec.nodes)
            .map(|i| Node {
                id: ids[i],
                broker_port: ports[per_node * i],
                controller_port: ports[per_node * i + 1],
                secured: secured
                    .iter()
                    .enumerate()
                    .map(|(j, l)| (*l, ports[per_node * i + 2 + j]))
                    .collect(),
                dir: dir.join(format!("node-{}", i + 1)),
                state: Mutex::new(NodeState::default()),
            })
            .collect();
        Ok(LocalCluster {
            spec: spec.clone(),
            libs: libs.to_owned(),
            jvm,
            dir,
            nodes,
            started_in: Duration::ZERO,
            isolation,
        })
    }

    fn boot(&self) -> Result<(), FixtureError> {
        self.format_all()?;
        for node in &self.nodes {
            self.spawn_node(node)?;
        }
        self.wait_ready(Instant::now() + READY_TIMEOUT)
    }

    /// The namespaces of an isolated cluster. Panics otherwise (callers check first).
    pub(crate) fn isolation_ref(&self) -> &Isolation {
        self.isolation
            .as_ref()
            .expect("checked by the caller: a cluster with isolated brokers")
    }

    /// The address node `id`'s listeners bind: its private address when isolated, else 127.0.0.1.
    fn bind_host(&self, id: i32) -> String {
        match self.isolation {
            Some(_) => netns::node_ip(id),
            None => "127.0.0.1".into(),
        }
    }

    fn voters(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}@{}:{}", n.id, self.bind_host(n.id), n.controller_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `server.properties` of one node: the settings gathered in BROKER.md, sized to the node count, then
    /// the spec's own `broker_props` overriding any of them.
    fn server_properties(&self, node: &Node) -> String {
        let n = self.nodes.len();
        let rf = n.min(3).to_string();
        let min_isr = if n >= 3 { "2" } else { "1" };
        let mut props: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| match props.iter_mut().find(|(pk, _)| pk == k) {
            Some(p) => p.1 = v.to_owned(),
            None => props.push((k.to_owned(), v.to_owned())),
        };
        set("process.roles", "broker,controller");
        set("node.id", &node.id.to_string());
        set("controller.quorum.voters", &self.voters());
        set("controller.listener.names", "CONTROLLER");
        let (secured_endpoints, secured_props, secured_map) = match &self.spec.security {
            Some(sec) => {
                let (endpoints, props) = sec.properties(&node.secured, &node.dir);
                (endpoints, props, sec.protocol_map())
            }
            None => Default::default(),
        };
        if self.isolation.is_some() {
            // Clients: the private address, advertised as the node's forwarder in the root namespace.
            // Brokers and controllers: the private addresses, so a cut between namespaces cuts them.
            let ip = netns::node_ip(node.id);
            let (client, internal, controller) = (
                netns::CLIENT_PORT,
                netns::INTERNAL_PORT,
                netns::CONTROLLER_PORT,
            );
            set(
                "listeners",
                &format!(
                    "PLAINTEXT://{ip}:{client},INTERNAL://{ip}:{internal},CONTROLLER://{ip}:{controller}"
                ),
            );
            set(
                "advertised.listeners",
                &format!(
                    "PLAINTEXT://127.0.0.1:{},INTERNAL://{ip}:{internal}",
                    node.broker_port
                ),
            );
            set(
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            );
            set("inter.broker.listener.name", "INTERNAL");
        } else {
            set(
                "listeners",
                &format!(
                    "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}{secured_endpoints}",
                    node.broker_port, node.controller_port
                ),
            );
            set(
                "advertised.listeners",
                &format!(
                    "PLAINTEXT://127.0.0.1:{}{secured_endpoints}",
                    node.broker_port
                ),
            );
            set(
                "listener.security.protocol.map",
                &format!("PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{secured_map}"),
            );
            for (k, v) in &secured_props {
                set(k, v);
            }
            set("inter.broker.listener.name", "PLAINTEXT");
        }
        set("log.dirs", &node.dir.join("data").display().to_string());
        set("num.partitions", "1");
        set("auto.create.topics.enable", "false");
        set("default.replication.factor", &rf);
        set("min.insync.replicas", min_isr);
        set("offsets.topic.replication.factor", &rf);
        set(
            "offsets.topic.num.partitions",
            &INTERNAL_PARTITIONS.to_string(),
        );
        set("transaction.state.log.replication.factor", &rf);
        set("transaction.state.log.min.isr", min_isr);
        set(
            "transaction.state.log.num.partitions",
            &INTERNAL_PARTITIONS.to_string(),
        );
        set("share.coordinator.state.topic.replication.factor", &rf);
        set("share.coordinator.state.topic.min.isr", min_isr);
        set("group.initial.rebalance.delay.ms", "0");
        set(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "1000",
        );
        set("log.cleaner.dedupe.buffer.size", "33554432");
        // Every new segment preallocates its offset and time index as sparse files the broker maps and
        // writes through page faults. With the default 10 MiB and a disk whose read-ahead is large (8 MiB
        // on the CI machine's virtio disk), each fault zero-fills megabytes of holes: after a few hundred
        // new partitions the request handlers spent a core in the kernel's memset and every produce got
        // 3-4x slower, whichever client sent it (docs/benchmarks.md). 1 MiB still holds an entry per 4 KiB
        // of log for 341 MiB (the time index's 12-byte entries fill first); a segment rolls there at the
        // latest instead of at 1 GiB, which no test or benchmark partition reaches.
        set("log.index.size.max.bytes", "1048576");
        set("num.network.threads", "2");
        set("num.io.threads", "4");
        set("group.min.session.timeout.ms", "1000");
        set("group.consumer.min.heartbeat.interval.ms", "500");
        set("group.consumer.heartbeat.interval.ms", "500");
        set("group.consumer.min.session.timeout.ms", "3000");
        set("group.consumer.session.timeout.ms", "6000");
        if n > 1 {
            // A crashed or paused node is fenced after 3 s instead of 9 s, so fault tests stay short.
            set("broker.heartbeat.interval.ms", "500");
            set("broker.session.timeout.ms", "3000");
        }
        for (k, v) in &self.spec.broker_props {
            // `{node}` in a value is the node's id: per-node settings such as `broker.rack`.
            set(k, &v.replace("{node}", &node.id.to_string()));
        }
        let mut out = String::from("# written by the snapfence kafka-fixture\n");
        for (k, v) in props {
            out.push_str(&format!("{k}={v}\n"));
        }
        out
    }

    /// A logging config that keeps WARN and above in `server.log` of the node folder, plus the one INFO line
    /// the readiness check waits for, plus the loggers `SNAPFENCE_KAFKA_LOGGERS` raises (see
    /// [`extra_loggers`]). 3.9 reads log4j 1 properties, 4.x Log4j 2 properties.
    fn log_config(&self, node: &Node) -> (PathBuf, String, String) {
        let log = node.log_path().display().to_string();
        if self.spec.version.major() < 4 {
            let path = node.dir.join("log4j.properties");
            let text = format!(
                "log4j.rootLogger=WARN, F\n\
                 log4j.appender.F=org.apache.log4j.FileAppender\n\
                 log4j.appender.F.File={log}\n\
                 log4j.appender.F.layout=org.apache.log4j.PatternLayout\n\
                 log4j.appender.F.layout.ConversionPattern=[%d] %p %m (%c)%n\n\
                 log4j.logger.kafka.server.KafkaRaftServer=INFO\n"
            );
            let mut text = text;
            for (logger, level) in extra_loggers() {
                text.push_str(&format!("log4j.logger.{logger}={level}\n"));
            }
            let flag = format!("-Dlog4j.configuration=file:{}", path.display());
            (path, text, flag)
        } else {
            let path = node.dir.join("log4j2.properties");
            let text = format!(
                "status = error\n\
                 appender.file.type = File\n\
                 appender.file.name = FILE\n\
                 appender.file.fileName = {log}\n\
                 appender.file.layout.type = PatternLayout\n\
                 appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
                 rootLogger.level = WARN\n\
                 rootLogger.appenderRef.file.ref = FILE\n\
                 logger.started.name = kafka.server.KafkaRaftServer\n\
                 logger.started.level = INFO\n"
            );
            let mut text = text;
            for (i, (logger, level)) in extra_loggers().into_iter().enumerate() {
                text.push_str(&format!(
                    "logger.extra{i}.name = {logger}\nlogger.extra{i}.level = {level}\n"
                ));
            }
            let flag = format!("-Dlog4j2.configurationFile={}", path.display());
            (path, text, flag)
        }
    }

    /// `java <heap> <flags> <log config> -cp libs/* <main>`; the rest of the arguments are the caller's.
    fn java(&self, node: &Node, heap: &str, main: &str) -> Command {
        let (_, _, log_flag) = self.log_config(node);
        // An isolated broker runs in its namespace: `ip netns exec` execs java in place (same pid).
        let ns = self
            .isolation
            .as_ref()
            .filter(|_| main == "kafka.Kafka")
            .and_then(|iso| iso.namespace_of(node.id));
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(jars::java_binary());
                c
            }
            None => Command::new(jars::java_binary()),
        };
        cmd.arg(format!("-Xms{heap}")).arg(format!("-Xmx{heap}"));
        cmd.args(&self.jvm.flags);
        if let Some(archive) = &self.jvm.archive {
            cmd.arg(format!("-XX:SharedArchiveFile={}", archive.display()));
        }
        // Only the broker of a training run dumps: it loads the classes every later JVM will need.
        if let (Some(dump), "kafka.Kafka") = (&self.jvm.dump_to, main) {
            cmd.arg(format!("-XX:ArchiveClassesAtExit={}", dump.display()));
        }
        cmd.arg("-XX:-UsePerfData") // no hsperfdata files in /tmp
            .arg("-Djava.awt.headless=true")
            .arg(log_flag)
            .arg("-cp")
            .arg(format!("{}/*", self.libs.display())) // the JVM expands the wildcard, not a shell
            .arg(main)
            .current_dir(&node.dir)
            .stdin(Stdio::null());
        cmd
    }

    /// Writes every node's configs and formats every node's log dir, all in parallel (each format is a JVM
    /// start, about a second on its own).
    fn format_all(&self) -> Result<(), FixtureError> {
        let cluster_id = random_cluster_id()?;
        let mut running = Vec::new();
        for node in &self.nodes {
            fs::create_dir_all(&node.dir).map_err(|e| FixtureError::io(&node.dir, e))?;
            let props = node.dir.join("server.properties");
            fs::write(&props, self.server_properties(node))
                .map_err(|e| FixtureError::io(&props, e))?;
            let (log_path, log_text, _) = self.log_config(node);
            fs::write(&log_path, log_text).map_err(|e| FixtureError::io(&log_path, e))?;

            let mut cmd = self.java(node, "256m", "kafka.tools.StorageTool");
            cmd.arg("format")
                .arg("-t")
                .arg(&cluster_id)
                .arg("-c")
                .arg(&props);
            if let Some(tv) = self.spec.transaction_version {
                cmd.arg("--feature")
                    .arg(format!("transaction.version={tv}"));
            }
            if let Some(gv) = self.spec.group_version {
                cmd.arg("--feature").arg(format!("group.version={gv}"));
            }
            if let Some(security) = &self.spec.security {
                cmd.args(security.format_args());
                security.write_files(&node.dir)?;
            }
            let out = node.dir.join("format.out");
            let file = fs::File::create(&out).map_err(|e| FixtureError::io(&out, e))?;
            let err = file.try_clone().map_err(|e| FixtureError::io(&out, e))?;
            cmd.stdout(file).stderr(err);
            let child = procs::spawn(cmd).map_err(|e| FixtureError::io(&node.dir, e))?;
            running.push((node, child, out));
        }
        let mut failure = None;
        for (node, mut child, out) in running {
            let status = child.wait().map_err(|e| FixtureError::io(&node.dir, e))?;
            if !status.success() && failure.is_none() {
                let text = fs::read_to_string(&out).unwrap_or_default();
                failure = Some(FixtureError::Format {
                    node: node.id,
                    detail: format!(
                        "StorageTool format exited with {status}:\n{}",
                        jars::tail(&text, 30)
                    ),
                });
            }
        }
        failure.map_or(Ok(()), Err)
    }

    fn spawn_node(&self, node: &Node) -> Result<(), FixtureError> {
        let mut state = node.state();
        if state.child.is_some() {
            return Ok(());
        }
        if state.starts > 0 {
            // Each run gets a fresh server.log, so the readiness check never matches an earlier run's line.
            let _ = fs::rename(
                node.log_path(),
                node.dir.join(format!("server.log.{}", state.starts)),
            );
        }
        let stdout = node.dir.join("stdout.log");
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stdout)
            .map_err(|e| FixtureError::io(&stdout, e))?;
        let err = file.try_clone().map_err(|e| FixtureError::io(&stdout, e))?;
        let mut cmd = self.java(node, "512m", "kafka.Kafka");
        cmd.arg(node.dir.join("server.properties"))
            .stdout(file)
            .stderr(err);
        let child = procs::spawn(cmd).map_err(|e| FixtureError::io(&node.dir, e))?;
        state.pid_file = Some(procs::record(child.id()));
        state.child = Some(child);
        state.paused = false;
        state.starts += 1;
        Ok(())
    }

    /// Fails when a node's JVM has exited on its own; explains why from its logs.
    fn check_alive(&self, node: &Node) -> Result<bool, FixtureError> {
        let mut state = node.state();
        let Some(child) = state.child.as_mut() else {
            return Ok(false);
        };
        match child.try_wait() {
            Ok(None) => Ok(!state.paused),
            Ok(Some(status)) => {
                state.child = None;
                if let Some(f) = state.pid_file.take() {
                    let _ = fs::remove_file(f);
                }
                let log = fs::read_to_string(node.log_path()).unwrap_or_default();
                let stdout = fs::read_to_string(node.dir.join("stdout.log")).unwrap_or_default();
                let port_clash = [&log, &stdout]
                    .iter()
                    .any(|t| t.contains("Address already in use") || t.contains("BindException"));
                Err(FixtureError::NodeExited {
                    node: node.id,
                    port_clash,
                    detail: format!(
                        "exited with {status}; server.log:\n{}stdout:\n{}",
                        jars::tail(&log, 30),
                        jars::tail(&stdout, 30)
                    ),
                })
            }
            Err(e) => Err(FixtureError::io(&node.dir, e)),
        }
    }

    /// Ready = every running node logged [`STARTED_LINE`], each of them lists every running node in a
    /// Metadata response, and FindCoordinator for a group and for a transactional id both succeed (the
    /// first calls answer COORDINATOR_NOT_AVAILABLE while `__consumer_offsets` and `__transaction_state` are
    /// being created, so those are retried until the deadline).
    pub(crate) fn wait_ready(&self, deadline: Instant) -> Result<(), FixtureError> {
        let not_ready = |detail: String| FixtureError::NotReady {
            detail: self.with_logs(detail),
        };
        for node in &self.nodes {
            loop {
                if !self.check_alive(node)? {
                    break; // killed or paused on purpose: not expected to log anything
                }
                if fs::read_to_string(node.log_path()).is_ok_and(|l| l.contains(STARTED_LINE)) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(not_ready(format!(
                        "node {} never logged '{STARTED_LINE}'",
                        node.id
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        loop {
            let last = match self.probe_ready() {
                Ok(()) => return Ok(()),
                Err(ProbeOutcome::Fatal(e)) => return Err(e),
                Err(ProbeOutcome::NotYet(why)) => why,
            };
            if Instant::now() > deadline {
                return Err(not_ready(format!("timed out; last check: {last}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn probe_ready(&self) -> Result<(), ProbeOutcome> {
        let mut live = Vec::new();
        for node in &self.nodes {
            if self.check_alive(node).map_err(ProbeOutcome::Fatal)? {
                live.push(node);
            }
        }
        let expected: Vec<i32> = live.iter().map(|n| n.id).collect();
        let not_yet = |what: String| ProbeOutcome::NotYet(what);
        for node in &live {
            let mut probe = Probe::connect(&node.address(), PROBE_TIMEOUT)
                .map_err(|e| not_yet(format!("node {}: {e}", node.id)))?;
            let listed = probe
                .broker_ids()
                .map_err(|e| not_yet(format!("node {}: {e}", node.id)))?;
            // Superset, not equality: a node killed a moment ago stays listed until its session times out.
            if let Some(missing) = expected.iter().find(|id| !listed.contains(id)) {
                return Err(not_yet(format!(
                    "node {} lists brokers {listed:?}, missing {missing}",
                    node.id
                )));
            }
        }
        let first = live
            .first()
            .ok_or_else(|| not_yet("no node is running".into()))?;
        let mut probe = Probe::connect(&first.address(), PROBE_TIMEOUT)
            .map_err(|e| not_yet(format!("node {}: {e}", first.id)))?;
        // Every partition of both internal topics, not one: a coordinator that answers FindCoordinator
        // may still be loading the partition a test's group or id hashes to, and answers 14
        // COORDINATOR_LOAD_IN_PROGRESS to the group or transaction call itself (seen on 3.9 with the
        // KIP-848 preview). Groups: one key per `__consumer_offsets` partition, found by the brokers'
        // own hash, described at its coordinator.
        for partition in 0..INTERNAL_PARTITIONS {
            let key = key_for_partition("snapfence-fixture-ready", partition);
            let (error, coordinator) = probe
                .find_coordinator(0, &key)
                .map_err(|e| not_yet(format!("FindCoordinator(group {key}): {e}")))?;
            if error != 0 || coordinator < 0 {
                // Usually 15 COORDINATOR_NOT_AVAILABLE while the internal topic is created.
                return Err(not_yet(format!(
                    "FindCoordinator(group {key}) answered error code {error}"
                )));
            }
            let node = live.iter().find(|n| n.id == coordinator).ok_or_else(|| {
                not_yet(format!(
                    "group {key}: coordinator {coordinator} is not running"
                ))
            })?;
            let error = Probe::connect(&node.address(), PROBE_TIMEOUT)
                .and_then(|mut p| p.describe_error(0, &key))
                .map_err(|e| not_yet(format!("describing group {key}: {e}")))?;
            if matches!(error, 14..=16) {
                return Err(not_yet(format!(
                    "group {key} (partition {partition}): node {coordinator} answered error code {error}"
                )));
            }
        }
        // Transactions: FindCoordinator for an id (the topic exists), then an idempotent InitProducerId
        // at every node, which answers 14 until the node's producer-id manager holds a block of ids
        // from the controller (every transactional init answered 14 for a second or two after
        // `__transaction_state` was ready, without this).
        let (error, coordinator) = probe
            .find_coordinator(1, "snapfence-fixture-ready")
            .map_err(|e| not_yet(format!("FindCoordinator(transactional id): {e}")))?;
        if error != 0 || coordinator < 0 {
            return Err(not_yet(format!(
                "FindCoordinator(transactional id) answered error code {error}"
            )));
        }
        for node in &live {
            let error = Probe::connect(&node.address(), PROBE_TIMEOUT)
                .and_then(|mut p| p.init_producer_id_error())
                .map_err(|e| not_yet(format!("InitProducerId at node {}: {e}", node.id)))?;
            if error != 0 {
                return Err(not_yet(format!(
                    "InitProducerId at node {} answered error code {error}",
                    node.id
                )));
            }
        }
        Ok(())
    }

    /// Stops the nodes and moves the cluster folder to `<cache>/failed/` (keeping the newest few), so a
    /// failed start in CI can be read afterwards; the process's own folder is deleted at exit.
    fn keep_for_post_mortem(&self, error: &FixtureError, observe: Observer<'_>) {
        const KEEP: usize = 5;
        for node in &self.nodes {
            self.kill(node.id);
        }
        let failed = jars::cache_root().join("failed");
        if fs::create_dir_all(&failed).is_err() {
            return;
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let target = failed.join(format!("{stamp}-{}-{name}", std::process::id()));
        if fs::rename(&self.dir, &target).is_ok() {
            let _ = fs::write(target.join("error.txt"), error.to_string());
            observe(Progress::KeptFailedStart { path: target });
        }
        let mut old: Vec<PathBuf> = fs::read_dir(&failed)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        old.sort(); // names start with a millisecond stamp
        let excess = old.len().saturating_sub(KEEP);
        for dir in &old[..excess] {
            let _ = fs::remove_dir_all(dir);
        }
    }

    /// `detail` followed by the end of every node's server.log: the folder is deleted when the cluster is
    /// dropped, so an error must carry what explains it.
    fn with_logs(&self, mut detail: String) -> String {
        for node in &self.nodes {
            let log = fs::read_to_string(node.log_path()).unwrap_or_default();
            detail.push_str(&format!(
                "\n--- node {} server.log (end) ---\n{}",
                node.id,
                jars::tail(&log, 15)
            ));
        }
        detail
    }

    pub(crate) fn node(&self, id: i32) -> &Node {
        self.nodes.iter().find(|n| n.id == id).unwrap_or_else(|| {
            panic!(
                "node {id} is not in this cluster (nodes {:?})",
                self.nodes.iter().map(|n| n.id).collect::<Vec<_>>()
            )
        })
    }

    /// SIGTERM (a controlled shutdown: the broker hands off its leaderships and the JVM runs its exit
    /// hooks), then waits up to `grace` for the JVM to exit; SIGKILL after that. True when it exited in
    /// time. A paused node is resumed first, or it could never act on the signal.
    pub(crate) fn stop(&self, id: i32, grace: Duration) -> bool {
        let node = self.node(id);
        let mut state = node.state();
        let Some(child) = state.child.as_mut() else {
            return true;
        };
        procs::signal_group(child.id(), libc::SIGTERM);
        procs::signal_group(child.id(), libc::SIGCONT);
        let until = Instant::now() + grace;
        let exited = loop {
            match child.try_wait() {
                Ok(Some(_)) => break true,
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
                _ => break false,
            }
        };
        drop(state);
        self.kill(id); // reaps, removes the pid file; a no-op signal when it already exited
        exited
    }

    /// SIGKILL to the node's process group, then reap it. A node that is not running is left alone.
    pub(crate) fn kill(&self, id: i32) {
        let node = self.node(id);
        let mut state = node.state();
        if let Some(mut child) = state.child.take() {
            procs::signal_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
        if let Some(f) = state.pid_file.take() {
            let _ = fs::remove_file(f);
        }
        state.paused = false;
    }

    /// The pid (and process group id) of the node's JVM, when it runs.
    pub(crate) fn pid(&self, id: i32) -> Option<u32> {
        self.node(id).state().child.as_ref().map(Child::id)
    }

    /// SIGSTOP (`pause = true`) or SIGCONT to the node's process group.
    pub(crate) fn set_paused(&self, id: i32, pause: bool) {
        let node = self.node(id);
        let mut state = node.state();
        let pid = state.child.as_ref().map(Child::id).unwrap_or_else(|| {
            panic!("node {id} is not running (killed?), so it cannot be paused or resumed")
        });
        procs::signal_group(pid, if pause { libc::SIGSTOP } else { libc::SIGCONT });
        // Return only once the node is frozen, so a test's next request meets a silent broker.
        if pause && !procs::wait_stopped(pid, Duration::from_secs(10)) {
            panic!("node {id} (pid {pid}) still runs 10 s after SIGSTOP");
        }
        state.paused = pause;
    }

    /// Kills the node if it runs, starts it again on the same data dir and ports, and waits until the whole
    /// cluster is ready again.
    pub(crate) fn restart(&self, id: i32) -> Result<(), FixtureError> {
        self.kill(id);
        self.spawn_node(self.node(id))?;
        self.wait_ready(Instant::now() + READY_TIMEOUT)
    }

    /// Every node's address on a secured listener, if the cluster has it.
    pub(crate) fn listener_bootstrap(&self, listener: Listener) -> Option<String> {
        self.nodes
            .iter()
            .map(|n| {
                n.secured
                    .iter()
                    .find(|(l, _)| *l == listener)
                    .map(|(_, port)| format!("127.0.0.1:{port}"))
            })
            .collect::<Option<Vec<_>>>()
            .map(|v| v.join(","))
    }

    pub(crate) fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(Node::address)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            let mut state = node.state();
            if let Some(mut child) = state.child.take() {
                procs::signal_group(child.id(), libc::SIGKILL);
                let _ = child.wait();
            }
            if let Some(f) = state.pid_file.take() {
                let _ = fs::remove_file(f);
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The loggers `SNAPFENCE_KAFKA_LOGGERS` asks for, as `(logger, level)`: a comma-separated list of
/// `logger=LEVEL`, e.g. `kafka.coordinator.transaction=TRACE`, for reading what a broker component did in a
/// post-mortem (they go to the node's `server.log`, which is deleted with the cluster: copy it while the
/// test runs). An entry that is not a dotted Java name and one of the log4j levels is skipped with a
/// warning on stderr: it would otherwise end up verbatim in a properties file.
fn extra_loggers() -> Vec<(String, String)> {
    let Ok(spec) = std::env::var("SNAPFENCE_KAFKA_LOGGERS") else {
        return Vec::new();
    };
    parse_loggers(&spec)
}

fn parse_loggers(spec: &str) -> Vec<(String, String)> {
    const LEVELS: [&str; 6] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "OFF"];
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(logger, level)| {
            let (logger, level) = (logger.trim(), level.trim().to_ascii_uppercase());
            let name_ok = !logger.is_empty()
                && logger
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'$'));
            (name_ok && LEVELS.contains(&level.as_str())).then(|| (logger.to_owned(), level))
        });
        match parsed {
            Some(p) => out.push(p),
            None => eprintln!("SNAPFENCE_KAFKA_LOGGERS: skipping {entry:?} (want logger=LEVEL)"),
        }
    }
    out
}

/// The JVM flags of every fixture JVM, and the class-data-sharing archive they map, if there is one.
///
/// # Why an AppCDS archive
/// Most of a broker's start-up on two cores is loading and verifying ~10k classes. A dynamic CDS archive
/// (JDK 13+, `-XX:ArchiveClassesAtExit`) recorded once from a broker that started and served a few
/// requests lets every later JVM (format tool and broker) map those classes instead: measured here,
/// StorageTool `format` drops from ~1.5 s to ~1.1 s and a broker's time to "Kafka Server started" by
/// roughly a third. The archive is recorded once per Kafka release, JVM flag set and `java` build (all in
/// its file name), under the same lock as the jar download; a JVM that finds it unusable (another JDK
/// build) ignores it with a warning in `stdout.log` and starts as if it were absent. `SNAPFENCE_KAFKA_CDS=0`
/// turns it off.
#[derive(Clone, Debug)]
struct JvmSetup {
    flags: Vec<String>,
    archive: Option<PathBuf>,
    /// Set only for the training run: where its broker writes the archive at exit.
    dump_to: Option<PathBuf>,
}

impl JvmSetup {
    fn new(
        version: &crate::KafkaVersion,
        libs: &Path,
        java_version: &str,
        observe: Observer<'_>,
    ) -> JvmSetup {
        let flags_text = std::env::var("SNAPFENCE_KAFKA_JVM_OPTS")
            .unwrap_or_else(|_| FAST_START_FLAGS.to_owned());
        let flags: Vec<String> = flags_text.split_whitespace().map(str::to_owned).collect();
        let mut setup = JvmSetup {
            flags,
            archive: None,
            dump_to: None,
        };
        if std::env::var("SNAPFENCE_KAFKA_CDS").is_ok_and(|v| v == "0") {
            return setup;
        }
        let key = fnv1a(&format!("{flags_text}\n{java_version}"));
        let root = libs.parent().unwrap_or(libs);
        let archive = root.join(format!("classes-{key:016x}.jsa"));
        if archive.is_file() {
            setup.archive = Some(archive);
            return setup;
        }
        match train(version, libs, &setup, &archive, observe) {
            Ok(()) => setup.archive = Some(archive),
            // Only a speed-up: a failed recording is reported and the fixture carries on without it.
            Err(e) => observe(Progress::Skipped {
                step: Step::RecordArchive,
                reason: e.to_string(),
            }),
        }
        setup
    }
}

/// Records the archive: a throwaway single node that starts, gets ready (so the request, coordinator and
/// topic-creation paths are loaded), and is then stopped with SIGTERM, because the JVM writes the archive
/// only on an orderly exit.
fn train(
    version: &crate::KafkaVersion,
    libs: &Path,
    setup: &JvmSetup,
    archive: &Path,
    observe: Observer<'_>,
) -> Result<(), FixtureError> {
    let root = archive.parent().unwrap_or(libs);
    let _lock = jars::FileLock::exclusive(&root.join(".lock"))?;
    if archive.is_file() {
        return Ok(()); // another process recorded it while this one waited
    }
    observe(Progress::Began {
        step: Step::RecordArchive,
        version: version.to_string(),
        into: Some(archive.to_owned()),
    });
    let began = Instant::now();
    let tmp = root.join(format!("classes.tmp-{}.jsa", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let spec = ClusterSpec {
        version: version.clone(),
        nodes: 1,
        ..ClusterSpec::kafka4()
    };
    let jvm = JvmSetup {
        dump_to: Some(tmp.clone()),
        ..setup.clone()
    };
    let cluster = LocalCluster::unstarted(&spec, libs, jvm)?;
    cluster.boot()?;
    let node = &cluster.nodes[0];
    let exited = cluster.stop(node.id, Duration::from_secs(60));
    drop(cluster); // deletes its folder
    match exited {
        true if fs::metadata(&tmp).is_ok_and(|m| m.len() > 0) => {
            fs::rename(&tmp, archive).map_err(|e| FixtureError::io(archive, e))?;
            observe(Progress::Done {
                step: Step::RecordArchive,
                took: began.elapsed(),
            });
            Ok(())
        }
        _ => {
            let _ = fs::remove_file(&tmp);
            Err(FixtureError::NotReady {
                detail: "the training broker did not exit cleanly with an archive".into(),
            })
        }
    }
}

/// FNV-1a, 64 bit: a stable file-name key (std's hasher is randomly seeded per process).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `prefix-N` for the smallest N whose key the brokers place on internal partition `partition`: Java's
/// `String.hashCode`, made non-negative by Kafka's `Utils.abs` (`Math.abs`, with `i32::MIN` mapped to 0),
/// modulo the partition count, as both the group and the transaction coordinator place keys.
fn key_for_partition(prefix: &str, partition: i32) -> String {
    (0u32..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|key| internal_partition(key, INTERNAL_PARTITIONS) == partition)
        .expect("some suffix lands on every partition")
}

fn internal_partition(key: &str, partitions: i32) -> i32 {
    let hash = key
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    hash.checked_abs().unwrap_or(0) % partitions
}

enum ProbeOutcome {
    /// Keep polling until the deadline.
    NotYet(String),
    /// A node died: polling longer cannot help.
    Fatal(FixtureError),
}

/// `count` distinct loopback ports the kernel considers free right now. All listeners are held until every
/// port is chosen, so the kernel cannot hand the same port out twice.
fn free_ports(count: usize) -> Result<Vec<u16>, FixtureError> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FixtureError::io(Path::new("127.0.0.1:0"), e))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FixtureError::io(Path::new("127.0.0.1:0"), e))
}

/// A KRaft cluster id: 16 random bytes, base64url without padding (what `kafka-storage random-uuid`
/// prints), made without starting a JVM.
fn random_cluster_id() -> Result<String, FixtureError> {
    let mut bytes = [0u8; 16];
    let path = Path::new("/dev/urandom");
    std::io::Read::read_exact(
        &mut fs::File::open(path).map_err(|e| FixtureError::io(path, e))?,
        &mut bytes,
    )
    .map_err(|e| FixtureError::io(path, e))?;
    Ok(cluster_id_from(bytes))
}

/// An id that starts with `-` (first six bits all but one set, one draw in 64) is read by the storage
/// tool's argument parser as an option, and the format fails. Kafka's own `Uuid.randomUuid` redraws in
/// that case; clearing the top bit keeps the first character in `A`..`f` instead.
fn cluster_id_from(mut bytes: [u8; 16]) -> String {
    bytes[0] &= 0x7f;
    base64url(&bytes)
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_land_on_the_partitions_java_places_them() {
        // "hello".hashCode() = 99162322; "polygenelubricants".hashCode() = i32::MIN, which Utils.abs maps
        // to 0; "Aa".hashCode() = 2112 (the classic collision with "BB"); a negative hash is made positive
        // by Math.abs, not by clearing the sign bit: "snapfence-group".hashCode() = -279937063, on
        // partition 3 of 4 (clearing the bit would say 1).
        assert_eq!(internal_partition("hello", 1000), 322);
        assert_eq!(internal_partition("snapfence-group", 4), 3);
        assert_eq!(internal_partition("polygenelubricants", 7), 0);
        assert_eq!(internal_partition("Aa", 50), 2112 % 50);
        assert_eq!(internal_partition("BB", 50), 2112 % 50);
        for p in 0..INTERNAL_PARTITIONS {
            assert_eq!(
                internal_partition(&key_for_partition("k", p), INTERNAL_PARTITIONS),
                p
            );
        }
    }

    /// Only well-formed `logger=LEVEL` entries reach the properties file: anything else could inject
    /// arbitrary log4j settings.
    #[test]
    fn extra_loggers_keep_only_well_formed_entries() {
        assert_eq!(
            parse_loggers(" kafka.coordinator.transaction=trace, ,kafka.log.LogCleaner=DEBUG"),
            vec![
                (
                    "kafka.coordinator.transaction".to_owned(),
                    "TRACE".to_owned()
                ),
                ("kafka.log.LogCleaner".to_owned(), "DEBUG".to_owned()),
            ]
        );
        assert!(
            parse_loggers("kafka=LOUD,=INFO,a b=INFO,x=INFO\nlog4j.rootLogger=ALL,noequals")
                .is_empty()
        );
    }

    /// A cluster id never starts with `-`, which the storage tool would take for an option (seen in CI:
    /// `argument --cluster-id/-t: expected one argument`).
    #[test]
    fn cluster_id_never_looks_like_an_option() {
        for first in 0..=255u8 {
            let mut bytes = [0xffu8; 16];
            bytes[0] = first;
            let id = cluster_id_from(bytes);
            assert!(
                !id.starts_with('-') && !id.starts_with('_'),
                "{first:#x} gave {id}"
            );
            assert_eq!(id.len(), 22);
        }
    }

    #[test]
    fn base64url_matches_known_vectors() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64url(&[0u8; 16]).len(), 22);
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(6).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6);
    }
}
