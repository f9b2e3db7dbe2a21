//! The long fault campaign, one command:
//!
//! `cargo run --release -p protocol-tests --example fault-campaign -- --rounds 200 [--seed N] [--tv 2|1|both]
//! [--legs 4.4-tv2,4.4-tv1,4.2,3.9] [--parallel N] [--unfenced] [--round-seed X] [--faults KIND,KIND]
//! [--postgres] [--disk-state [--memory-budget BYTES]] [--verbose]`
//!
//! Starts a three-node cluster per transaction version (`--tv both`, the default, alternates rounds between
//! a TV2 and a TV1 cluster of Kafka 4.4) or per leg named by `--legs` (Kafka 4.4 at either transaction
//! version, 4.2, 3.9; rounds go round the legs in that order, and on 3.9, which has no KIP-848, a round
//! drawn for the consumer protocol runs classic), runs the rounds drawn from the seed (printed first, so a run can be repeated),
//! prints one line per round, a running total every ten rounds and, at the end, the rounds, faults by kind,
//! anomalies and the seeds to replay. `--round-seed X` replays one round (with the same `--faults`, if
//! any); `--faults` draws only from those kinds; `--verbose` prints every round's notes. `--parallel N`
//! (default 1) runs up to N rounds at once, never two on the same cluster: round r always runs on leg
//! r mod legs and is drawn from (seed, r) alone, so a round replays the same whatever N was. Exit status 1
//! when any anomaly was found, 2 when a round's task died.
//! `--postgres` runs the members on the PostgreSQL snapshot store (KIP-939 two-phase commit): it starts a
//! PostgreSQL server, turns two-phase commit on in the clusters, allows only the 4.4-tv2 leg (2PC needs
//! InitProducerId v6 and transaction version 2), and by default draws every fault kind but the two that
//! act on the snapshot topic (foreign-txn, compaction).
//! `--disk-state` runs the members with their state on disk (`StateConfig::Disk`), each in a directory
//! of its own under the temporary directory, taken over by whoever restarts in its place.
//! `--memory-budget BYTES` gives those members a memory budget (`DiskState::memory_budget`): keys stay on
//! disk and are loaded as events, timers and lookups need them (a few KiB keeps most of them there).
//! Members are this same executable run as `fault-campaign member ...` (examples have no sibling binaries).

use std::io::Write as _;
use std::sync::Arc;

use protocol_tests::campaign::{
    run_round, summary, CampaignConfig, FaultKind, Finder, Leg, MemberCommand, RoundPlan,
};
use protocol_tests::member::member_main;
use protocol_tests::KafkaCluster;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("member") {
        member_main(&argv[1..]);
    }
    let mut rounds = 200u64;
    let mut seed = None;
    let mut round_seed = None;
    let mut legs = vec![Leg::Kafka44Tv2, Leg::Kafka44Tv1];
    let mut transactional = true;
    let mut verbose = false;
    let mut parallel = 1u64;
    let mut kinds = Vec::new();
    let mut postgres = false;
    let mut disk_state = false;
    let mut memory_budget = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--rounds" => rounds = number(&value()),
            "--seed" => seed = Some(number(&value())),
            "--round-seed" => round_seed = Some(number(&value())),
            "--tv" => {
                legs = match value().as_str() {
                    "2" => vec![Leg::Kafka44Tv2],
                    "1" => vec![Leg::Kafka44Tv1],
                    "both" => vec![Leg::Kafka44Tv2, Leg::Kafka44Tv1],
                    v => usage(&format!("--tv {v}: want 2, 1 or both")),
                }
            }
            "--legs" => {
                legs = value()
                    .split(',')
                    .map(|name| {
                        Leg::from_name(name).unwrap_or_else(|| {
                            usage(&format!("no leg {name:?} (4.4-tv2, 4.4-tv1, 4.2, 3.9)"))
                        })
                    })
                    .collect();
            }
            "--parallel" => parallel = number(&value()).max(1),
            "--unfenced" => transactional = false,
            "--verbose" => verbose = true,
            "--postgres" => postgres = true,
            "--disk-state" => disk_state = true,
            "--memory-budget" => memory_budget = Some(number(&value())),
            "--faults" => {
                for name in value().split(',') {
                    kinds.push(
                        FaultKind::from_name(name)
                            .unwrap_or_else(|| usage(&format!("no fault kind {name:?}"))),
                    );
                }
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    // Kept alive until the campaign ends: the members' database.
    let mut pg_server = None;
    if postgres {
        if legs.iter().any(|l| *l != Leg::Kafka44Tv2) {
            legs = vec![Leg::Kafka44Tv2];
            println!("--postgres: the 4.4-tv2 leg only (two-phase commit needs InitProducerId v6 and TV2)");
        }
        if kinds.is_empty() {
            kinds = FaultKind::ALL
                .into_iter()
                .filter(|k| !matches!(k, FaultKind::ForeignTxn | FaultKind::Compaction))
                .collect();
        }
        match protocol_tests::PostgresServer::start() {
            Ok(server) => {
                println!("PostgreSQL at {}", server.url());
                pg_server = Some(server);
            }
            Err(e) => usage(&format!("PostgreSQL: {e}")),
        }
    }
    if round_seed.is_some() {
        rounds = legs.len() as u64;
    }
    println!(
        "fault campaign: seed={seed} rounds={rounds} legs={:?} {}",
        legs.iter().map(|l| l.name()).collect::<Vec<_>>(),
        if transactional { "fenced" } else { "unfenced" }
    );
    let finder: Finder = Arc::new(|bootstrap, topic| {
        Box::pin(async move {
            snapfence_cli::find_hanging(&bootstrap, &topic, 0)
                .await
                .map_err(|e| e.to_string())
        })
    });
    // This very executable, by its inode: the path cargo gave it is replaced when another tree builds
    // into the same target directory during a long run.
    let program = std::path::PathBuf::from("/proc/self/exe");
    let mut cfg = CampaignConfig::new(
        MemberCommand {
            program,
            leading: vec!["member".into()],
            args_env: None,
        },
        Some(finder),
    );
    cfg.transactional = transactional;
    cfg.postgres = pg_server.as_ref().map(|s| s.url());
    let state_dirs =
        disk_state.then(|| std::env::temp_dir().join(protocol_tests::unique("campaign-state")));
    cfg.state_dirs = state_dirs.clone();
    if memory_budget.is_some() && !disk_state {
        usage("--memory-budget needs --disk-state");
    }
    cfg.memory_budget = memory_budget;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| usage(&format!("no runtime: {e}")));
    let began = std::time::Instant::now();
    // Every cluster up front and rounds going round them, so a run cut short still covers every leg.
    let clusters: Vec<(Leg, KafkaCluster)> = legs
        .iter()
        .map(|leg| {
            let spec = if postgres {
                protocol_tests::campaign::two_phase(leg.spec())
            } else {
                leg.spec()
            };
            (leg, spec)
        })
        .map(|(leg, spec)| match KafkaCluster::start(&spec) {
            Ok(k) => {
                println!("{}: three nodes at {}", leg.name(), k.bootstrap());
                (*leg, k)
            }
            Err(e) => usage(&format!("cluster for {}: {e}", leg.name())),
        })
        .collect();
    let parallel = parallel.min(clusters.len() as u64) as usize;
    let legs_n = clusters.len() as u64;
    let cfg = Arc::new(cfg);
    let kinds = Arc::new(kinds);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut reports = Vec::new();
    let mut lost = Vec::new();
    runtime.block_on(async {
        // Fair (FIFO) permits: with one permit the rounds run in index order, as they always have.
        let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (leg, kafka)) in clusters.into_iter().enumerate() {
            let (permits, cfg, kinds, done_tx) =
                (permits.clone(), cfg.clone(), kinds.clone(), done_tx.clone());
            tasks.spawn(async move {
                let mut r = i as u64;
                while r < rounds {
                    let mut plan = match round_seed {
                        Some(s) => RoundPlan::from_seed_among(s, &kinds),
                        None => RoundPlan::draw_among(seed, r, &kinds),
                    };
                    if !leg.has_consumer_protocol() {
                        plan = plan.classic_only();
                    }
                    let Ok(_permit) = permits.acquire().await else {
                        return;
                    };
                    let report = run_round(&kafka, &cfg, &plan).await;
                    if done_tx.send((r, report)).is_err() {
                        return;
                    }
                    r += legs_n;
                }
                drop(kafka);
            });
        }
        drop(done_tx);
        // Every round's line as it ends; the channel closes when every leg's task has ended, by
        // finishing or by dying (a death is reported below, with the rounds it never ran).
        while let Some((r, report)) = done_rx.recv().await {
            println!("round {r}: {report}");
            for a in report.anomalies.iter().chain(&report.infra) {
                println!("    {a}");
            }
            // The notes say where the time went: shown for every finding and every slow round.
            if verbose
                || !report.anomalies.is_empty()
                || report.elapsed > std::time::Duration::from_secs(40)
            {
                for n in &report.notes {
                    println!("    note: {n}");
                }
            }
            reports.push(report);
            if reports.len() % 10 == 0 && (reports.len() as u64) < rounds {
                // A running total, so a run stopped early still ends with one in its log.
                println!(
                    "--- after {} rounds, {:.0}s ---\n{}",
                    reports.len(),
                    began.elapsed().as_secs_f64(),
                    summary(&reports)
                );
            }
            let _ = std::io::stdout().flush();
        }
        while let Some(ended) = tasks.join_next().await {
            if let Err(e) = ended {
                lost.push(e.to_string());
            }
        }
    });
    if let Some(dir) = &state_dirs {
        let _ = std::fs::remove_dir_all(dir);
        let resumed: u64 = reports.iter().map(|r| r.disk_resumed).sum();
        let fell_back: u64 = reports.iter().map(|r| r.disk_fallbacks).sum();
        let loaded: u64 = reports.iter().map(|r| r.disk_loaded).sum();
        println!(
            "disk state: {resumed} image reads resumed from a checkpoint, {fell_back} read whole, \
             {loaded} keys loaded from disk under the memory budget"
        );
    }
    println!(
        "\ncampaign seed={seed} done in {:.0}s\n{}",
        began.elapsed().as_secs_f64(),
        summary(&reports)
    );
    if !lost.is_empty() || (reports.len() as u64) < rounds {
        println!(
            "rounds run: {} of {rounds}; leg tasks that died: {lost:?}",
            reports.len()
        );
        std::process::exit(2);
    }
    let anomalies = reports.iter().any(|r| !r.anomalies.is_empty());
    drop(pg_server);
    std::process::exit(i32::from(anomalies));
}

fn number(text: &str) -> u64 {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| usage(&format!("{text}: {e}")))
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "fault-campaign: {problem}\nusage: fault-campaign [--rounds N] [--seed N] [--tv 2|1|both] [--legs LIST] \
         [--parallel N] [--unfenced] [--round-seed X] [--faults KIND,...] [--postgres] [--disk-state [--memory-budget BYTES]] [--verbose]"
    );
    std::process::exit(2)
}
