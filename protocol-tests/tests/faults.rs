//! The short fault campaign (the long one is `cargo run --release -p protocol-tests --example
//! fault-campaign -- --rounds 200`): flow members as processes on a three-node cluster, every fault kind
//! at least once, under both group protocols and both transaction versions. Fenced, the re-fold checker
//! and the hanging-transaction finder find nothing; unfenced, the same checker catches the corruption a
//! thawed zombie causes, so it is shown not to be vacuous.

use std::sync::Arc;
use std::time::Duration;

use protocol_tests::campaign::{
    campaign_spec, run_round, two_phase, CampaignConfig, FaultKind, Finder, MemberCommand,
    RoundPlan, RoundReport,
};
use protocol_tests::member::{args_from_env, member_main};
use protocol_tests::{dedicated, PostgresServer};

/// The environment variable that carries a member's arguments into this binary.
const MEMBER_ARGS: &str = "SNAPFENCE_CAMPAIGN_MEMBER_ARGS";

/// Not a check: the entry point of the member processes the campaign starts from this very binary
/// (libtest owns `main`, so a member is this one test run alone, its arguments in [`MEMBER_ARGS`]).
/// Run without that variable, as in every ordinary test run, it does nothing.
#[test]
fn campaign_member_entry() {
    if let Some(args) = args_from_env(MEMBER_ARGS) {
        member_main(&args);
    }
}

fn config(transactional: bool) -> CampaignConfig {
    let finder: Finder = Arc::new(|bootstrap, topic| {
        Box::pin(async move {
            snapfence_cli::find_hanging(&bootstrap, &topic, 0)
                .await
                .map_err(|e| e.to_string())
        })
    });
    let mut cfg = CampaignConfig::new(
        MemberCommand {
            // This test binary itself, by its inode, runs each member (see `campaign_member_entry`):
            // `target/debug/flow-member` is replaced whenever another source tree builds into the same
            // target directory, and a campaign once ran another tree's member that way.
            program: "/proc/self/exe".into(),
            leading: [
                "campaign_member_entry",
                "--exact",
                "--nocapture",
                "--quiet",
                "--test-threads=1",
            ]
            .map(String::from)
            .to_vec(),
            args_env: Some(MEMBER_ARGS.into()),
        },
        Some(finder),
    );
    cfg.transactional = transactional;
    cfg
}

fn plan(seed: u64, consumer_protocol: bool, recover: bool, faults: &[FaultKind]) -> RoundPlan {
    RoundPlan {
        seed,
        consumer_protocol,
        eager: false,
        faults: faults.to_vec(),
        recover,
    }
}

fn show(r: &RoundReport) {
    eprintln!("{r}");
    for line in r.anomalies.iter().chain(&r.infra).chain(&r.notes) {
        eprintln!("    {line}");
    }
}

/// Every fault kind, fenced, on TV2 and TV1 under both protocols and both fence policies: no anomaly
/// (with the tolerant policy that includes no member exit on a fence), no hanging transaction, no
/// harness trouble, and the compaction fault ran on a log the cleaner had worked on; and the unfenced
/// mode under a zombie is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_campaign_fenced_is_clean_and_unfenced_is_caught() {
    use FaultKind::*;
    let fenced = config(true);
    let unfenced = config(false);
    let mut clean = Vec::new();
    let mut caught = false;

    let kafka = dedicated(campaign_spec(2)).await;
    for p in [
        plan(
            0x5eed_0001,
            true,
            false,
            &[Zombie, LeaderRestart, ForeignTxn, PartitionMember],
        ),
        plan(
            0x5eed_0002,
            false,
            true,
            &[
                KillMidTxn,
                UnknownOutcome,
                TxnCoordinatorKill,
                RestartStorm,
                Rebalance,
            ],
        ),
    ] {
        let r = run_round(&kafka, &fenced, &p).await;
        show(&r);
        clean.push(r);
    }
    // Unfenced, a thawed zombie's stale flush lands; a second try covers a zombie that happened to hold
    // nothing unflushed when it froze.
    for seed in [0x5eed_0003, 0x5eed_0004] {
        let r = run_round(&kafka, &unfenced, &plan(seed, false, false, &[Zombie])).await;
        show(&r);
        assert!(r.infra.is_empty(), "harness trouble: {:?}", r.infra);
        if !r.anomalies.is_empty() {
            caught = true;
            break;
        }
    }
    drop(kafka);

    let kafka = dedicated(campaign_spec(1)).await;
    let r = run_round(
        &kafka,
        &fenced,
        &plan(
            0x5eed_0005,
            true,
            true,
            &[GroupCoordinatorKill, Latency, Zombie, Compaction],
        ),
    )
    .await;
    show(&r);
    clean.push(r);

    let drawn: std::collections::BTreeSet<FaultKind> =
        clean.iter().flat_map(|r| r.plan.faults.clone()).collect();
    // `wide-change` runs in `disk_state_rounds_are_clean`, where the killed owner restarts on its
    // directory (one round of it costs ~10 s, and this test is CI's longest already).
    assert_eq!(
        drawn.len() + 1,
        FaultKind::ALL.len(),
        "every fault kind runs fenced: {drawn:?}"
    );
    assert!(!drawn.contains(&WideChange));
    let compacted: usize = clean.iter().map(|r| r.compacted).sum();
    assert!(
        compacted >= 1,
        "the compaction fault saw the cleaner remove records before the recoveries"
    );
    assert!(
        clean.iter().any(|r| r.plan.recover) && clean.iter().any(|r| !r.plan.recover),
        "both fence policies"
    );
    for r in &clean {
        assert!(
            r.anomalies.is_empty() && r.infra.is_empty(),
            "fenced round {r}: {:?} {:?}",
            r.anomalies,
            r.infra
        );
        assert!(
            r.events > 0 && r.snapshots_read > 0,
            "round {r} did nothing"
        );
    }
    assert!(
        caught,
        "unfenced, the checker must catch the zombie's stale snapshot"
    );
}

/// The PostgreSQL store (KIP-939 two-phase commit and the fencing row) under the faults that threaten
/// it: a zombie thawed after its partitions moved, an owner killed with its two-phase transaction open
/// (prepared or before its prepare), the transaction coordinator and the group coordinator killed. The
/// checker reads each key's row: no anomaly, no hanging transaction, no harness trouble.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_rounds_are_clean() {
    use FaultKind::*;
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let mut cfg = config(true);
    cfg.postgres = Some(pg.url());
    let kafka = dedicated(two_phase(campaign_spec(2))).await;
    let mut open_kills = 0;
    for p in [
        plan(
            0x9e5_0001,
            false,
            false,
            &[Zombie, KillMidTxn, TxnCoordinatorKill],
        ),
        plan(
            0x9e5_0002,
            true,
            true,
            &[KillMidTxn, GroupCoordinatorKill, Zombie],
        ),
    ] {
        let r = run_round(&kafka, &cfg, &p).await;
        show(&r);
        assert!(
            r.anomalies.is_empty() && r.infra.is_empty(),
            "PostgreSQL round {r}: {:?} {:?}",
            r.anomalies,
            r.infra
        );
        assert!(
            r.events > 0 && r.snapshots_read > 0,
            "round {r} did nothing"
        );
        open_kills += r.open_txn_kills;
    }
    assert!(
        open_kills >= 1,
        "an owner was killed inside a two-phase transaction"
    );

    // Unfenced on the same store, a thawed zombie's late upserts land: the row checker catches it (a
    // second try covers a zombie that held nothing unflushed when it froze). The store's upserts go out
    // at once, so a freeze on the flush's announcement alone can land after them (and then the zombie
    // has nothing late to write); the members pause a moment there, as a GC pause at that point would.
    let mut unfenced = config(false);
    unfenced.postgres = Some(pg.url());
    unfenced.flush_pause = Duration::from_millis(100);
    let mut caught = false;
    for seed in [0x9e5_0003, 0x9e5_0004] {
        let r = run_round(&kafka, &unfenced, &plan(seed, false, false, &[Zombie])).await;
        show(&r);
        assert!(r.infra.is_empty(), "harness trouble: {:?}", r.infra);
        if !r.anomalies.is_empty() {
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "unfenced, the row checker must catch the zombie's stale rows"
    );
}

/// Members keep their state on disk and restart on their data directories (a supervisor's restart, a
/// restart storm, a kill inside a transaction), under the faults that threaten a local image: unknown
/// outcomes, leader restarts, compaction that removes tombstones, zombies. Every round is checked against
/// a fold of all input like any other: no anomaly, no harness trouble, and images were resumed from.
/// The first round opens with a `wide-change`: an owner killed between the transactions of one
/// persist of 40 000 changed keys, restarted on its directory. The second round's members hold no key
/// in memory longer than they must (a one-byte memory budget): every event, timer and restart loads
/// its key from disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_state_rounds_are_clean() {
    use FaultKind::*;
    let mut cfg = config(true);
    let dirs = std::env::temp_dir().join(protocol_tests::unique("campaign-state"));
    cfg.state_dirs = Some(dirs.clone());
    let kafka = dedicated(campaign_spec(2)).await;
    let mut resumed = 0;
    for (p, budget) in [
        (
            plan(
                0xd15c_0001,
                false,
                true,
                &[
                    WideChange,
                    RestartStorm,
                    KillMidTxn,
                    Compaction,
                    UnknownOutcome,
                ],
            ),
            None,
        ),
        (
            plan(
                0xd15c_0002,
                true,
                false,
                &[Zombie, LeaderRestart, RestartStorm, Rebalance],
            ),
            Some(1),
        ),
    ] {
        cfg.memory_budget = budget;
        let r = run_round(&kafka, &cfg, &p).await;
        show(&r);
        assert!(
            r.anomalies.is_empty() && r.infra.is_empty(),
            "disk-state round {r}: {:?} {:?}",
            r.anomalies,
            r.infra
        );
        assert!(
            r.events > 0 && r.snapshots_read > 0,
            "round {r} did nothing"
        );
        assert_eq!(
            r.disk_loaded > 0,
            budget.is_some(),
            "round {r}: keys are loaded from disk exactly when there is a memory budget"
        );
        resumed += r.disk_resumed;
    }
    let _ = std::fs::remove_dir_all(&dirs);
    assert!(resumed >= 1, "no member resumed from its image");
}
