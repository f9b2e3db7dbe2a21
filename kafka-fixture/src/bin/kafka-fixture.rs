//! Starts a Kafka cluster through the fixture, prints what it reports, and keeps it running: for looking at
//! a broker by hand, for checking the facts in the crate docs, and for the fixture test that kills this
//! process and checks its JVMs die with it.
//!
//! `cargo run -p kafka-fixture --bin kafka-fixture -- [4|4tv1|42|39|3n] [key=value ...]`
//! - `tv=N` / `gv=N`: transaction.version / group.version at format time
//! - `hold=SECS`: keep the cluster that long after printing (default 0); Ctrl-C or SIGTERM stops it, its JVMs and deletes its run folder
//! - `apis=1`: also print every API's version range
//! - `user=NAME:PASSWORD` (repeatable): add a SASL_PLAINTEXT listener with this user (PLAIN and both
//!   SCRAMs) and the StandardAuthorizer; `super=PRINCIPAL` adds a super user (e.g. `super=User:admin`)
//! - any other `key=value`: a broker property

use std::io::Write as _;
use std::time::Duration;

/// `println!` that ignores a closed stdout (`| head -1`), so the cluster is still stopped cleanly.
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

use kafka_fixture::probe::Probe;
use kafka_fixture::{ClusterSpec, KafkaCluster, Listener, SecuritySpec};
use kafka_protocol::messages::ApiKey;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut spec = match args.next().as_deref().unwrap_or("4") {
        "4" => ClusterSpec::kafka4(),
        "4tv1" => ClusterSpec::kafka4_tv1(),
        "42" => ClusterSpec::kafka42(),
        "39" => ClusterSpec::kafka39(),
        "3n" => ClusterSpec::three_nodes(),
        other => {
            eprintln!("unknown preset {other}: want 4, 4tv1, 42, 39 or 3n");
            std::process::exit(2);
        }
    };
    let (mut hold, mut apis) = (0, false);
    let mut security: Option<SecuritySpec> = None;
    for arg in args {
        let Some((k, v)) = arg.split_once('=') else {
            eprintln!("arguments after the preset are key=value, got {arg:?}");
            std::process::exit(2);
        };
        let number = |v: &str| -> i64 {
            v.parse().unwrap_or_else(|_| {
                eprintln!("{k}= wants a number, got {v:?}");
                std::process::exit(2)
            })
        };
        match k {
            "tv" => spec = spec.with_transaction_version(number(v) as i16),
            "gv" => spec = spec.with_group_version(number(v) as i16),
            "hold" => hold = number(v) as u64,
            "apis" => apis = v == "1",
            "user" => {
                let Some((name, password)) = v.split_once(':') else {
                    eprintln!("user= wants NAME:PASSWORD, got {v:?}");
                    std::process::exit(2)
                };
                let s = security.get_or_insert_with(SecuritySpec::default);
                s.users.push((name.to_owned(), password.to_owned()));
            }
            "super" => security
                .get_or_insert_with(SecuritySpec::default)
                .super_users
                .push(v.to_owned()),
            _ => spec = spec.with_prop(k, v),
        }
    }
    if let Some(security) = security {
        spec = spec.with_security(security);
    }
    let kafka = match KafkaCluster::start(&spec) {
        Ok(kafka) => kafka,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    out!(
        "kafka {} ready in {:.2}s",
        kafka.version(),
        kafka.started_in().unwrap_or_default().as_secs_f64()
    );
    out!("bootstrap {}", kafka.bootstrap());
    if spec.security.is_some() && !kafka.is_external() {
        out!(
            "sasl_plaintext {}",
            kafka.listener_bootstrap(Listener::SaslPlaintext)
        );
    }
    if !kafka.is_external() {
        for node in kafka.node_ids() {
            let pid = kafka.node_pid(node).unwrap_or(0);
            out!("node {node} pid {pid} address {}", kafka.node_address(node));
        }
    }
    let first = kafka
        .bootstrap()
        .split(',')
        .next()
        .unwrap_or_default()
        .to_owned();
    match Probe::connect(&first, Duration::from_secs(5)).and_then(|mut p| p.api_versions()) {
        Ok(versions) => {
            for f in &versions.finalized_features {
                out!("finalized {} {}", f.name.as_str(), f.max_version_level);
            }
            for k in versions.api_keys.iter().filter(|_| apis) {
                let name = ApiKey::try_from(k.api_key)
                    .map(|a| format!("{a:?}"))
                    .unwrap_or_default();
                out!(
                    "api {:>3} {name:<32} v{}..v{}",
                    k.api_key,
                    k.min_version,
                    k.max_version
                );
            }
        }
        Err(e) => eprintln!("ApiVersions failed: {e}"),
    }
    std::thread::sleep(Duration::from_secs(hold));
}
