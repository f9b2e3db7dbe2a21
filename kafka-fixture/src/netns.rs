//! Brokers in network namespaces of their own, so the network between two brokers can be cut while
//! clients still reach every broker (see [`ClusterSpec::with_isolated_brokers`](crate::ClusterSpec)).
//!
//! # Layout (one per cluster, nothing in the root namespace but 127.0.0.1 listeners)
//! ```text
//!   root ns:  client -> 127.0.0.1:<port N>  (forwarder N, a listener in the root namespace)
//!                             |  upstream socket created inside the hub namespace
//!   hub ns:   br0 10.213.0.254/24 -- vN (veth) ---+
//!   node ns N:                              eth0 10.213.0.N/24   broker N: CLIENT :9092,
//!                                                                INTERNAL :9091, CONTROLLER :9093
//! ```
//! Each cluster has its own hub namespace and so its own copy of the 10.213.0.0/24 subnet: addresses of
//! concurrent clusters never meet, and the fixed in-namespace ports cannot clash with anything. Namespace
//! names are `snapfence-<pid>.<starttime>-<seq>-hub` and `...-n<node>`; interface names (`br0`, `vN`,
//! `eth0`) only exist inside those namespaces.
//!
//! The forwarders' upstream sockets are made by one thread per cluster that moved itself into the hub
//! namespace with `setns(2)` (a socket stays in the namespace it was created in, whichever thread uses it
//! later). Brokers are started with `ip netns exec <ns> java ...` (`ip` execs, so the JVM keeps the pid,
//! process group and parent-death signal the spawner gave it).
//!
//! # A cut
//! [`Isolation::partition`] puts a permanent neighbour (ARP) entry for the other broker's address with a
//! MAC address nobody owns into each of the two namespaces. Their frames to each other are then flooded by
//! the bridge and dropped by every port: a *silent* drop both ways. Neither broker gets an error: new
//! connections hang in SYN retransmits, established ones stall until the broker's own request or session
//! timeouts give up. Traffic with the hub (clients, through the forwarders) and with the other brokers is
//! untouched. [`Isolation::heal`] deletes the entries; ARP resolves the real address again and stalled
//! TCP connections resume with their retransmits. (A `blackhole` route would answer `connect` with EINVAL
//! at once, an error rather than a partition; this machine has no iptables, nft or tc filters.)
//!
//! # Cleanup
//! Drop of the cluster kills the JVMs first, then stops the forwarders and deletes the namespaces (which
//! takes the veths and the bridge with them). Namespace names are also deleted by an `atexit` hook, and
//! the first isolated cluster of a process deletes the namespaces of owners that are gone (checked by the
//! owner's start time, as the pid files in [`procs`](crate::procs) are), so a SIGKILLed run leaks nothing
//! past the next run.
//!
//! # References
//! - ip-netns(8), ip-neighbour(8), setns(2), veth(4)

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{procs, FixtureError};

/// Where `ip netns` keeps its named namespaces (bind mounts of `/proc/<pid>/ns/net`).
const NETNS_DIR: &str = "/var/run/netns";
/// Every namespace this fixture makes starts with this.
const PREFIX: &str = "snapfence-";
/// The first three octets of every cluster's private subnet (one copy per hub namespace).
const SUBNET: &str = "10.213.0";
/// The hub's address on the bridge: the forwarders' upstream sockets come from it.
const HUB_HOST: u8 = 254;
/// A locally administered unicast MAC no interface has: frames to it are dropped by everyone.
const NOWHERE_MAC: &str = "02:5f:00:00:00:01";
/// The in-namespace ports of each broker: client, inter-broker and controller listeners.
pub(crate) const CLIENT_PORT: u16 = 9092;
pub(crate) const INTERNAL_PORT: u16 = 9091;
pub(crate) const CONTROLLER_PORT: u16 = 9093;
/// How long a forwarder waits for its upstream connection.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The private address of `node` inside its namespace.
pub(crate) fn node_ip(node: i32) -> String {
    format!("{SUBNET}.{node}")
}

/// The network of one isolated cluster: namespaces, forwarders, and the cuts in force.
pub(crate) struct Isolation {
    /// (node id, namespace name), in creation order; each is deleted on drop.
    nodes: Vec<(i32, String)>,
    /// Namespaces created so far (hub first), all deleted on drop.
    created: Vec<String>,
    forwarders: Vec<Forwarder>,
    dialer: Option<Dialer>,
    /// Cut pairs, (lower id, higher id).
    cuts: Mutex<BTreeSet<(i32, i32)>>,
}

impl Isolation {
    /// Fails with [`FixtureError::NetnsUnavailable`] unless this process can make network namespaces
    /// (root and `ip` on PATH).
    pub(crate) fn check_available() -> Result<(), FixtureError> {
        // SAFETY: geteuid has no preconditions and no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            return Err(FixtureError::NetnsUnavailable {
                detail: "isolated brokers need root (network namespaces, veth pairs, a bridge)"
                    .into(),
            });
        }
        match Command::new("ip").arg("-V").output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(FixtureError::NetnsUnavailable {
                detail: format!("`ip -V` exited with {}", out.status),
            }),
            Err(e) => Err(FixtureError::NetnsUnavailable {
                detail: format!("cannot run `ip` (apt-get install iproute2): {e}"),
            }),
        }
    }

    /// Makes the namespaces, the bridge and the veths for `nodes`, and one forwarder per node on a free
    /// 127.0.0.1 port. On an error everything made so far is removed again (by drop).
    pub(crate) fn create(nodes: &[i32]) -> Result<Isolation, FixtureError> {
        Self::check_available()?;
        if let Some(bad) = nodes.iter().find(|n| !(1..HUB_HOST as i32).contains(n)) {
            return Err(FixtureError::BadSpec(format!(
                "isolated brokers need node ids 1..{HUB_HOST}, not {bad}"
            )));
        }
        sweep_once();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = format!(
            "{PREFIX}{}-{}",
            owner_tag(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let hub = format!("{base}-hub");
        let mut iso = Isolation {
            nodes: Vec::new(),
            created: Vec::new(),
            forwarders: Vec::new(),
            dialer: None,
            cuts: Mutex::new(BTreeSet::new()),
        };
        iso.add_namespace(&hub)?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        let hub_addr = format!("{SUBNET}.{HUB_HOST}/24");
        ip(&["-n", &hub, "addr", "add", &hub_addr, "dev", "br0"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for &node in nodes {
            let ns = format!("{base}-n{node}");
            iso.add_namespace(&ns)?;
            iso.nodes.push((node, ns.clone()));
            let veth = format!("v{node}");
            ip(&[
                "-n", &hub, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &veth, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &veth, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let addr = format!("{}/24", node_ip(node));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        let dialer = Dialer::start(&hub)?;
        for &node in nodes {
            let upstream: SocketAddr =
                format!("{}:{CLIENT_PORT}", node_ip(node))
                    .parse()
                    .map_err(|e| FixtureError::Netns {
                        detail: format!("bad upstream address: {e}"),
                    })?;
            iso.forwarders
                .push(Forwarder::start(upstream, dialer.handle())?);
        }
        iso.dialer = Some(dialer);
        Ok(iso)
    }

    fn add_namespace(&mut self, name: &str) -> Result<(), FixtureError> {
        add_namespace(name)?;
        self.created.push(name.to_owned());
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.to_owned());
        Ok(())
    }

    /// The namespace of `node`.
    pub(crate) fn namespace_of(&self, node: i32) -> Option<&str> {
        self.nodes
            .iter()
            .find(|(id, _)| *id == node)
            .map(|(_, ns)| ns.as_str())
    }

    /// Every namespace of this cluster, hub first.
    pub(crate) fn namespaces(&self) -> Vec<String> {
        self.created.clone()
    }

    /// The 127.0.0.1 port of `node`'s forwarder (its advertised client address).
    pub(crate) fn forwarder_port(&self, node: i32) -> Option<u16> {
        let i = self.nodes.iter().position(|(id, _)| *id == node)?;
        self.forwarders.get(i).map(|f| f.port)
    }

    fn ns(&self, node: i32) -> Result<&str, FixtureError> {
        self.namespace_of(node)
            .ok_or_else(|| FixtureError::BadSpec(format!("node {node} is not in this cluster")))
    }

    /// Silently drops every packet between brokers `a` and `b`, both ways (see the module docs).
    /// Cutting a pair that is already cut does nothing.
    pub(crate) fn partition(&self, a: i32, b: i32) -> Result<(), FixtureError> {
        if a == b {
            return Err(FixtureError::BadSpec(format!(
                "cannot cut node {a} from itself"
            )));
        }
        let (ns_a, ns_b) = (self.ns(a)?, self.ns(b)?);
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        if cuts.contains(&(a.min(b), a.max(b))) {
            return Ok(());
        }
        for (ns, other) in [(ns_a, b), (ns_b, a)] {
            ip(&[
                "-n",
                ns,
                "neigh",
                "replace",
                &node_ip(other),
                "lladdr",
                NOWHERE_MAC,
                "nud",
                "permanent",
                "dev",
                "eth0",
            ])?;
        }
        cuts.insert((a.min(b), a.max(b)));
        Ok(())
    }

    /// Undoes [`partition`](Self::partition) of `a` and `b`; a pair that is not cut is left alone.
    pub(crate) fn heal(&self, a: i32, b: i32) -> Result<(), FixtureError> {
        let (ns_a, ns_b) = (self.ns(a)?, self.ns(b)?);
        let mut cuts = self.cuts.lock().unwrap_or_else(|p| p.into_inner());
        if !cuts.remove(&(a.min(b), a.max(b))) {
            return Ok(());
        }
        for (ns, other) in [(ns_a, b), (ns_b, a)] {
            ip(&["-n", ns, "neigh", "del", &node_ip(other), "dev", "eth0"])?;
        }
        Ok(())
    }

    /// The pairs cut now, (lower id, higher id).
    pub(crate) fn cuts(&self) -> Vec<(i32, i32)> {
        self.cuts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }

    /// The node ids, in order.
    pub(crate) fn node_ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|(id, _)| *id).collect()
    }
}

impl Drop for Isolation {
    fn drop(&mut self) {
        for f in &mut self.forwarders {
            f.stop();
        }
        // Ends the dialer thread, so the hub namespace has no member left.
        if let Some(d) = self.dialer.take() {
            d.stop();
        }
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        for ns in self.created.iter().rev() {
            let _ = delete_namespace(ns);
            reg.retain(|n| n != ns);
        }
    }
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), FixtureError> {
    let out =
        Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| FixtureError::NetnsUnavailable {
                detail: format!("cannot run `ip`: {e}"),
            })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(FixtureError::Netns {
            detail: format!(
                "`ip {}` exited with {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// `ip netns add NAME`, one at a time per process: the first `ip netns add` on a machine also sets up
/// the `/var/run/netns` mount, and two racing ones can fail there.
fn add_namespace(name: &str) -> Result<(), FixtureError> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    ip(&["netns", "add", name])
}

/// `<pid>.<starttime>` of this process: an owner tag no later process can have.
fn owner_tag() -> String {
    let me = std::process::id();
    format!("{me}.{}", procs::start_time(me).unwrap_or(0))
}

/// What `ip netns del` does, without a child process (so it also works from an `atexit` hook): detach
/// the bind mount that keeps the namespace alive, then remove its file. The namespace itself goes away
/// with its last process or socket.
fn delete_namespace(name: &str) -> io::Result<()> {
    let path = Path::new(NETNS_DIR).join(name);
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: c_path is a valid NUL-terminated string that outlives the call.
    unsafe {
        libc::umount2(c_path.as_ptr(), libc::MNT_DETACH);
    }
    fs::remove_file(&path)
}

/// This process's live namespaces, for the `atexit` hook.
fn registry() -> &'static Mutex<Vec<String>> {
    static LIVE: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LIVE.get_or_init(|| {
        extern "C" fn at_exit() {
            // try_lock: a thread may hold it at exit; then that cluster's own drop is mid-cleanup anyway.
            if let Ok(names) = registry().try_lock() {
                for name in names.iter() {
                    let _ = delete_namespace(name);
                }
            }
        }
        // SAFETY: registers a plain extern "C" fn with no captured state.
        unsafe {
            libc::atexit(at_exit);
        }
        Mutex::new(Vec::new())
    })
}

fn sweep_once() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        sweep(Path::new(NETNS_DIR));
    });
}

/// Deletes the namespaces in `dir` whose owner process is gone; returns their names.
pub(crate) fn sweep(dir: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return removed;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = stale_owner(&name) else {
            continue;
        };
        if !owner {
            continue;
        }
        if delete_namespace(&name).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// For a fixture namespace name: Some(true) when its owner is gone, Some(false) when it still runs;
/// None for any other name.
fn stale_owner(name: &str) -> Option<bool> {
    let rest = name.strip_prefix(PREFIX)?;
    let (tag, _) = rest.split_once('-')?;
    let (pid, started) = tag.split_once('.')?;
    let (pid, started) = (pid.parse::<u32>().ok()?, started.parse::<u64>().ok()?);
    Some(procs::start_time(pid) != Some(started))
}

// ------------------------------------------------------------------------------------------------
// forwarders

type DialRequest = (SocketAddr, mpsc::Sender<io::Result<TcpStream>>);

/// A thread living in the hub namespace that makes TCP connections there for the forwarders.
struct Dialer {
    tx: mpsc::Sender<DialRequest>,
    thread: JoinHandle<()>,
}

impl Dialer {
    fn start(hub: &str) -> Result<Dialer, FixtureError> {
        let path: PathBuf = Path::new(NETNS_DIR).join(hub);
        let ns_file = fs::File::open(&path).map_err(|e| FixtureError::io(&path, e))?;
        let (tx, rx) = mpsc::channel::<DialRequest>();
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let thread = std::thread::Builder::new()
            .name("kafka-fixture-netns-dialer".into())
            .spawn(move || {
                // SAFETY: a valid open namespace fd; setns changes only this thread's network namespace.
                let rc = unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) };
                drop(ns_file);
                if rc != 0 {
                    let _ = ready_tx.send(Err(io::Error::last_os_error()));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                while let Ok((addr, reply)) = rx.recv() {
                    let _ = reply.send(TcpStream::connect_timeout(&addr, DIAL_TIMEOUT));
                }
            })
            .map_err(|e| FixtureError::io(&path, e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Dialer { tx, thread }),
            Ok(Err(e)) => Err(FixtureError::Netns {
                detail: format!("setns into {hub}: {e}"),
            }),
            Err(_) => Err(FixtureError::Netns {
                detail: "the dialer thread ended at start".into(),
            }),
        }
    }

    fn handle(&self) -> mpsc::Sender<DialRequest> {
        self.tx.clone()
    }

    fn stop(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// One broker's client address in the root namespace: accepts on 127.0.0.1 and pipes each connection to
/// the broker's client listener through a socket made in the hub namespace.
struct Forwarder {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Live connections (both ends), shut down on stop so their pump threads end.
    conns: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(
        upstream: SocketAddr,
        dial: mpsc::Sender<DialRequest>,
    ) -> Result<Forwarder, FixtureError> {
        let bind_err = |e| FixtureError::io(Path::new("127.0.0.1:0"), e);
        let listener = TcpListener::bind("127.0.0.1:0").map_err(bind_err)?;
        let port = listener.local_addr().map_err(bind_err)?.port();
        listener.set_nonblocking(true).map_err(bind_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>> = Arc::default();
        let acceptor = {
            let (stop, conns) = (Arc::clone(&stop), Arc::clone(&conns));
            std::thread::Builder::new()
                .name(format!("kafka-fixture-fwd-{port}"))
                .spawn(move || accept_loop(listener, upstream, dial, stop, conns))
                .map_err(bind_err)?
        };
        Ok(Forwarder {
            port,
            stop,
            conns,
            acceptor: Some(acceptor),
        })
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        for [a, b] in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    dial: mpsc::Sender<DialRequest>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>,
) {
    let mut next_id = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let (tx, rx) = mpsc::channel();
        if dial.send((upstream, tx)).is_err() {
            return;
        }
        // A failed dial (broker down) closes the client's connection, as a refused connect would.
        let Ok(Ok(server)) = rx.recv() else {
            continue;
        };
        let _ = client.set_nonblocking(false);
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let clones = (client.try_clone(), server.try_clone());
        let (Ok(client2), Ok(server2)) = clones else {
            continue;
        };
        if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
            conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, [c, s]);
        }
        let conns = Arc::clone(&conns);
        let _ = std::thread::Builder::new()
            .name("kafka-fixture-fwd-conn".into())
            .spawn(move || {
                let up = std::thread::spawn(move || pump(client, server2));
                pump(server, client2);
                let _ = up.join();
                conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            });
    }
}

/// Copies `from` to `to` until EOF or an error, then passes the end on (FIN, or a reset both ways).
fn pump(mut from: TcpStream, mut to: TcpStream) {
    match io::copy(&mut from, &mut to) {
        Ok(_) => {
            let _ = to.shutdown(Shutdown::Write);
        }
        Err(_) => {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_owner_reads_only_fixture_names() {
        assert_eq!(stale_owner("other-ns"), None);
        assert_eq!(stale_owner("snapfence-x.1-0-hub"), None);
        let me = owner_tag();
        assert_eq!(stale_owner(&format!("{PREFIX}{me}-3-hub")), Some(false));
        let pid = std::process::id();
        assert_eq!(stale_owner(&format!("{PREFIX}{pid}.1-3-n2")), Some(true));
    }

    /// The tests of this module make and sweep namespaces: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn root() -> bool {
        match Isolation::check_available() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipped: {e}");
                false
            }
        }
    }

    /// A namespace named for a dead owner is deleted by the sweep; this process's own are kept.
    #[test]
    fn sweep_deletes_namespaces_of_gone_owners_only() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        if !root() {
            return;
        }
        sweep_once(); // so no concurrent first sweep of this process takes `dead` away from this test
        let pid = std::process::id();
        let dead = format!("{PREFIX}{pid}.1-999-hub");
        let live = format!("{PREFIX}{}-998-hub", owner_tag());
        add_namespace(&dead).unwrap();
        add_namespace(&live).unwrap();
        let removed = sweep(Path::new(NETNS_DIR));
        let left = Path::new(NETNS_DIR).join(&live).exists();
        let _ = delete_namespace(&live);
        let _ = delete_namespace(&dead);
        assert!(removed.contains(&dead), "removed {removed:?}");
        assert!(
            !removed.contains(&live) && left,
            "the live owner's namespace was swept"
        );
        assert!(!Path::new(NETNS_DIR).join(&dead).exists());
    }

    /// Through a forwarder a root-namespace client reaches a listener inside a node namespace; a cut
    /// between two nodes silently drops their traffic while the forwarder path keeps working, and a heal
    /// restores it; drop removes every namespace.
    #[test]
    fn forwarder_reaches_a_node_and_cuts_are_silent_and_heal() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        if !root() {
            return;
        }
        let iso = Isolation::create(&[1, 2]).unwrap();
        let names = iso.namespaces();
        assert_eq!(names.len(), 3);
        // An echo server in node 1's namespace on the client port, and a connect probe from node 2's.
        let ns1 = iso.namespace_of(1).unwrap().to_owned();
        let ns2 = iso.namespace_of(2).unwrap().to_owned();
        let mut echo = Command::new("ip")
            .args(["netns", "exec", &ns1, "python3", "-c"])
            .arg(format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('{}',{CLIENT_PORT}))\ns.listen()\nwhile True:\n c,_=s.accept()\n c.sendall(c.recv(100))\n c.close()",
                node_ip(1)
            ))
            .spawn()
            .unwrap();
        let connect_from_2 = || {
            Command::new("ip")
                .args(["netns", "exec", &ns2, "python3", "-c"])
                .arg(format!(
                    "import socket\nsocket.create_connection(('{}',{CLIENT_PORT}),timeout=1.5).close()",
                    node_ip(1)
                ))
                .output()
                .unwrap()
        };
        let through_forwarder = || -> io::Result<Vec<u8>> {
            use std::io::{Read as _, Write as _};
            let port = iso.forwarder_port(1).unwrap();
            let mut s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            s.write_all(b"ping")?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf)?;
            Ok(buf)
        };
        let mut ok = false;
        for _ in 0..50 {
            if through_forwarder().is_ok_and(|b| b == b"ping") {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let before = connect_from_2();
        iso.partition(1, 2).unwrap();
        let during = connect_from_2();
        let forwarded_during = through_forwarder().ok();
        iso.heal(1, 2).unwrap();
        let after = connect_from_2();
        let _ = echo.kill();
        let _ = echo.wait();
        drop(iso);
        assert!(ok, "the forwarder never reached the echo server");
        assert!(before.status.success(), "{before:?}");
        let stderr = String::from_utf8_lossy(&during.stderr);
        assert!(
            !during.status.success() && stderr.contains("timed out"),
            "a cut connect must time out silently: {during:?}"
        );
        assert_eq!(forwarded_during.as_deref(), Some(&b"ping"[..]));
        assert!(after.status.success(), "{after:?}");
        for n in &names {
            assert!(!Path::new(NETNS_DIR).join(n).exists(), "{n} left behind");
        }
    }
}
