//! Owner A as a process of its own, so that pausing it is a real pause.
//!
//! A stale owner's danger comes from a pause that freezes everything at once: the poll loop, the
//! heartbeat thread, the open connections. The demo gets that by running A as a child `snapfence`
//! process (the hidden subcommand `__demo-owner`) and stopping it with SIGSTOP: A's heartbeats stop, the
//! group coordinator evicts its member once the session timeout passes, and on SIGCONT A carries on
//! from the instruction it was frozen at, with the state and the group metadata it held.
//!
//! The parent steers A over its stdin and reads one JSON object per line back:
//!
//! | command | A does | A answers |
//! |---|---|---|
//! | `catch-up <end>` | polls until it holds partition 0 and has folded up to input offset `end` | generation, member id, the accounts it holds |
//! | `rejoin <end> <old member>` | as `catch-up`, and also until it is a member again under a new member id | the same |
//! | `persist` | writes every account changed since its last snapshot | `ok`, or the refusal: which fence, the broker's code |
//! | `commit` | commits the input offset its snapshots cover | the same |
//! | `flush-holding <keys>` | outputs story: arms the [gate](super::gate) for the comma-separated API keys, then persists and commits | `held` and the request it holds, once the gate holds one; then waits for `release` and answers the outcomes of the persist and the commit (also answered at once if the flush ends without reaching a held request) |
//! | `metrics` | reads its snapshot-transaction counters from its metrics recorder | commits, failures by class, fences by kind |
//! | `quit`, or end of input | exits at once, without leaving the group (a stale owner that stops) | nothing |
//!
//! A never outlives the demo: the parent kills it when its handle drops (every error path included); A
//! exits when its stdin closes, which is how it learns that a parent that died without cleaning up is
//! gone; and A runs in a process group of its own, so if the parent dies while A is stopped, the kernel
//! sends the orphaned, stopped group SIGHUP (which ends A) and SIGCONT.
//!
//! # References
//! - KIP-447 (the generation check on TxnOffsetCommit), KIP-98 (producer epochs); `docs/fencing.md`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use snapfence::consumer::ConsumerError;
use snapfence::net::{Client, ClientConfig};

use crate::security::SecurityArgs;
use snapfence::snapshot::{Flow, FlowError, SnapshotError};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::gate::{api_name, Gate};
use super::tally::TxnTally;
use super::{catch_up, failed, flow_config, Account, Ledger, Names, STEP_LIMIT};
use crate::error::CliError;
use crate::Io;

/// The first line A prints, so the parent knows the program it started speaks this protocol.
const HELLO: &str = "snapfence demo owner";

/// The arguments of the hidden `__demo-owner` subcommand (the bootstrap comes from `--bootstrap`).
#[derive(Debug, Clone, clap::Args)]
pub struct OwnerArgs {
    /// The input topic.
    #[arg(long)]
    input: String,
    /// The snapshot topic.
    #[arg(long)]
    snapshots: String,
    /// The consumer group.
    #[arg(long)]
    group: String,
    /// The transactional id prefix.
    #[arg(long)]
    txn_prefix: String,
    /// Plain idempotent snapshot writes instead of fenced transactions.
    #[arg(long)]
    unfenced: bool,
    /// The group session timeout, in milliseconds.
    #[arg(long)]
    session_timeout_ms: u64,
    /// The outputs story: confirm each deposit on this topic, and connect through the gate.
    #[arg(long)]
    confirmations: Option<String>,
}

/// Which mechanism refused a snapshot write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// The group coordinator refused the offset commit inside the transaction: the writer's generation
    /// or member id is no longer the group's (KIP-447).
    Generation,
    /// The transaction coordinator or the partition leader refused the writer's producer epoch: a newer
    /// producer initialised the same transactional id.
    ProducerEpoch,
    /// Something else made the transaction fail.
    Other,
}

impl Fence {
    fn as_str(self) -> &'static str {
        match self {
            Fence::Generation => "generation",
            Fence::ProducerEpoch => "producer-epoch",
            Fence::Other => "other",
        }
    }

    fn parse(s: &str) -> Fence {
        match s {
            "generation" => Fence::Generation,
            "producer-epoch" => Fence::ProducerEpoch,
            _ => Fence::Other,
        }
    }

    /// Which fence refused `e`, and the broker's error code when there is one.
    fn of(e: &FlowError) -> (Fence, Option<&'static str>) {
        if let FlowError::Snapshot(SnapshotError::Transaction { failure, .. }) = e {
            let code = failure.fence_code().map(|c| c.name());
            if e.is_fenced() {
                return (Fence::Generation, code);
            }
            if e.is_producer_fenced() {
                return (Fence::ProducerEpoch, code);
            }
        }
        if let FlowError::Consumer(ConsumerError::CommitFenced { code, .. }) = e {
            return (Fence::Generation, Some(code.name()));
        }
        if e.is_fenced() {
            return (Fence::Generation, None);
        }
        if e.is_producer_fenced() {
            return (Fence::ProducerEpoch, None);
        }
        (Fence::Other, None)
    }
}

/// A write A was asked to make, refused.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub fence: Fence,
    /// The broker's error code, e.g. `UNKNOWN_MEMBER_ID`.
    pub code: Option<String>,
    /// The error as A's library reported it.
    pub error: String,
}

/// What A holds after a catch-up.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub generation: i32,
    pub member: String,
    pub accounts: BTreeMap<String, Account>,
    /// The deposits A's fold confirmed so far (outputs story), in folding order.
    pub confirmed: Vec<u64>,
}

/// How a `flush-holding` went, as far as the parent has heard.
#[derive(Debug, Clone)]
pub(crate) enum Flush {
    /// The gate holds this request; A waits for `release`.
    Held(&'static str),
    /// The flush ended: `None` for a step that succeeded, the refusal of one that did not.
    Done {
        persist: Option<Refusal>,
        commit: Option<Refusal>,
    },
}

// ---- A's side --------------------------------------------------------------------------------------

fn say(io: &mut Io<'_>, v: Value) -> Result<(), CliError> {
    writeln!(io.out, "{v}")?;
    io.out.flush()?;
    Ok(())
}

fn outcome(r: Result<(), FlowError>) -> Value {
    match r {
        Ok(()) => json!({ "ok": true }),
        Err(e) => {
            let (fence, code) = Fence::of(&e);
            json!({ "ok": false, "fence": fence.as_str(), "code": code, "error": e.to_string() })
        }
    }
}

/// Runs owner A: joins the group as the parent's arguments say, then serves commands until `quit` or
/// the end of its input.
pub(crate) async fn serve(
    bootstrap: Option<&str>,
    security: &SecurityArgs,
    args: &OwnerArgs,
    io: &mut Io<'_>,
) -> Result<(), CliError> {
    let bootstrap = bootstrap.ok_or_else(|| CliError::Usage {
        message: "__demo-owner needs --bootstrap".into(),
        hint: "this subcommand is started by `snapfence demo`; run that instead".into(),
    })?;
    say(
        io,
        json!({ "ok": true, "hello": HELLO, "pid": std::process::id() }),
    )?;
    // Before connecting, so everything A does is counted; the parent reads it back for its summary.
    let registry = crate::exporter::install().ok();
    let gate = Gate::default();
    let mut config = security.client_config(ClientConfig {
        client_id: "snapfence-demo-owner-a".into(),
        ..ClientConfig::new(bootstrap)
    })?;
    if args.confirmations.is_some() {
        // The outputs story catches this owner at exact requests (the parent refuses TLS for it).
        config = config.with_dialer(gate.clone());
    }
    let client = Client::connect(config)
        .await
        .map_err(|e| CliError::from_net("connect", bootstrap, e))?;
    let names = Names {
        input: args.input.clone(),
        snapshots: args.snapshots.clone(),
        group: args.group.clone(),
        txn_prefix: args.txn_prefix.clone(),
        confirmations: args.confirmations.clone(),
    };
    let ledger = match &args.confirmations {
        Some(topic) => Ledger::confirming(topic),
        None => Ledger::default(),
    };
    let mode = if args.unfenced {
        snapfence::snapshot::PersistenceMode::NonTransactional
    } else {
        snapfence::snapshot::PersistenceMode::Transactional
    };
    let session = Duration::from_millis(args.session_timeout_ms);
    let mut flow = Flow::start(client, flow_config(&names, mode, session), ledger.clone())
        .await
        .map_err(|e| failed("start owner A", e))?;
    loop {
        let mut line = String::new();
        // A blocking read on the thread that drives this future: while A waits for a command nothing
        // of its own is in flight, and the consumer's heartbeats run on the runtime's workers.
        if io.input.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["catch-up", end] => match end.parse::<i64>() {
                Ok(end) => match catch_up(&mut flow, end, "owner A catching up").await {
                    Ok(()) => held(&flow, &ledger).await,
                    Err(e) => json!({ "ok": false, "error": e.to_string() }),
                },
                Err(_) => json!({ "ok": false, "error": format!("not an offset: {end}") }),
            },
            ["rejoin", end, old] => match end.parse::<i64>() {
                Ok(end) => match rejoin(&mut flow, end, old).await {
                    Ok(()) => held(&flow, &ledger).await,
                    Err(e) => json!({ "ok": false, "error": e.to_string() }),
                },
                Err(_) => json!({ "ok": false, "error": format!("not an offset: {end}") }),
            },
            ["persist"] => outcome(flow.persist().await),
            ["commit"] => outcome(flow.commit().await),
            ["flush-holding", keys] => {
                let parsed: Result<Vec<i16>, _> = keys.split(',').map(str::parse::<i16>).collect();
                match parsed {
                    Ok(keys) => match flush_holding(&flow, &gate, &keys, io).await? {
                        Some(reply) => reply,
                        // The parent went away while A held a request.
                        None => return Ok(()),
                    },
                    Err(_) => json!({ "ok": false, "error": format!("not API keys: {keys}") }),
                }
            }
            ["metrics"] => match &registry {
                Some(r) => json!({ "ok": true, "metrics": TxnTally::read(r).to_json() }),
                None => json!({ "ok": false, "error": "owner A has no metrics recorder" }),
            },
            ["quit"] => return Ok(()),
            _ => json!({ "ok": false, "error": format!("unknown command: {}", line.trim()) }),
        };
        say(io, reply)?;
    }
}

/// Polls until A is a member again under a member id other than `old` (the one its eviction ended), and
/// holds partition 0 caught up to `end`: the new membership's handlers dropped the old partition state and
/// recovered it from the snapshots.
async fn rejoin(flow: &mut Flow<Ledger>, end: i64, old: &str) -> Result<(), CliError> {
    let began = std::time::Instant::now();
    loop {
        catch_up(flow, end, "owner A rejoining").await?;
        if flow
            .group_metadata()
            .current()
            .is_some_and(|m| m.member_id() != old)
        {
            return Ok(());
        }
        if began.elapsed() > STEP_LIMIT {
            return Err(CliError::DemoFailed {
                detail: format!(
                    "owner A rejoining: still the evicted member {old} after {} s",
                    STEP_LIMIT.as_secs()
                ),
            });
        }
    }
}

/// Arms the gate for `keys`, then persists and commits. Once the gate holds a request, says which and
/// waits (a blocking read, as the command loop's) for `release`; then lets the request go and answers
/// the outcomes. `None`: the parent closed A's input (or sent something else) while a request was held.
async fn flush_holding(
    flow: &Flow<Ledger>,
    gate: &Gate,
    keys: &[i16],
    io: &mut Io<'_>,
) -> Result<Option<Value>, CliError> {
    gate.arm(keys);
    let flush = async {
        let persisted = flow.persist().await;
        // A refused persist stops the flow (FencePolicy::Stop): nothing is left to commit.
        let committed = match &persisted {
            Ok(()) => flow.commit().await,
            Err(_) => Ok(()),
        };
        (persisted, committed)
    };
    tokio::pin!(flush);
    let held = tokio::select! {
        (persisted, committed) = &mut flush => {
            gate.release();
            return Ok(Some(flushed(None, persisted, committed)));
        }
        key = gate.held() => key,
    };
    say(io, json!({ "ok": true, "held": api_name(held) }))?;
    let mut line = String::new();
    if io.input.read_line(&mut line)? == 0 || line.trim() != "release" {
        return Ok(None);
    }
    gate.release();
    Ok(Some(match tokio::time::timeout(STEP_LIMIT, flush).await {
        Ok((persisted, committed)) => flushed(Some(held), persisted, committed),
        Err(_) => json!({
            "ok": false,
            "error": format!("the flush did not end within {} s of the release", STEP_LIMIT.as_secs())
        }),
    }))
}

/// The answer to `flush-holding` once the flush ended: what was held, and each step's outcome.
fn flushed(
    held: Option<i16>,
    persisted: Result<(), FlowError>,
    committed: Result<(), FlowError>,
) -> Value {
    json!({
        "ok": true,
        "held": held.map(api_name),
        "done": true,
        "persist": outcome(persisted),
        "commit": outcome(committed),
    })
}

/// A's answer to `catch-up` and `rejoin`: its membership, the accounts it holds, the deposits it confirmed.
async fn held(flow: &Flow<Ledger>, ledger: &Ledger) -> Value {
    let meta = flow.group_metadata().current();
    let accounts: serde_json::Map<String, Value> = flow
        .state(0)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, a)| {
            (
                String::from_utf8_lossy(&k).into_owned(),
                json!([a.deposits, a.balance, a.last]),
            )
        })
        .collect();
    json!({
        "ok": true,
        "generation": meta.as_ref().map_or(-1, |m| m.generation_id()),
        "member": meta.as_ref().map_or("", |m| m.member_id()),
        "accounts": accounts,
        "confirmed": ledger.confirmed(),
    })
}

// ---- the parent's side -----------------------------------------------------------------------------

/// The `snapfence` executable to start A from: this one. A test harness or any other program that
/// drives the library in-process is not `snapfence` (its name does not start so), and starting it with
/// A's arguments would run something else, so that is refused.
pub(crate) fn own_executable() -> Result<PathBuf, CliError> {
    let exe = std::env::current_exe().map_err(|e| failed("find the snapfence executable", e))?;
    let is_snapfence = exe
        .file_stem()
        .and_then(|s| s.to_str())
        .is_some_and(|s| s.starts_with("snapfence"));
    if !is_snapfence {
        return Err(CliError::DemoFailed {
            detail: format!(
                "the demo runs owner A as a child snapfence process, but this program is {}; run the demo \
                 through the snapfence binary",
                exe.display()
            ),
        });
    }
    Ok(exe)
}

/// Owner A, running as a child process. Dropping the handle kills the process.
///
/// Not cancel-safe: a request dropped before its answer leaves that answer in the pipe for the next
/// request to misread. The demo awaits every request to the end (each is bounded by [`STEP_LIMIT`]).
pub(crate) struct OwnerProcess {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    pid: u32,
}

impl OwnerProcess {
    /// Starts A and waits for its greeting.
    pub async fn start(
        exe: &Path,
        bootstrap: &str,
        names: &Names,
        unfenced: bool,
        session: Duration,
        security: &SecurityArgs,
    ) -> Result<OwnerProcess, CliError> {
        let mut command = tokio::process::Command::new(exe);
        command
            .args(["--bootstrap", bootstrap])
            .args(security.child_args())
            .arg("__demo-owner")
            .args(["--input", &names.input, "--snapshots", &names.snapshots])
            .args(["--group", &names.group, "--txn-prefix", &names.txn_prefix])
            .args(["--session-timeout-ms", &session.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if unfenced {
            command.arg("--unfenced");
        }
        if let Some(topic) = &names.confirmations {
            command.args(["--confirmations", topic]);
        }
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| failed(&format!("start owner A ({})", exe.display()), e))?;
        let (Some(stdin), Some(stdout), Some(pid)) =
            (child.stdin.take(), child.stdout.take(), child.id())
        else {
            return Err(CliError::DemoFailed {
                detail: "owner A's process started without its pipes".into(),
            });
        };
        let mut a = OwnerProcess {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            pid,
        };
        let hello = a.read("start owner A").await?;
        if hello["hello"] != HELLO {
            return Err(CliError::DemoFailed {
                detail: format!("owner A's process did not greet as expected: {hello}"),
            });
        }
        Ok(a)
    }

    /// The process id, for the story.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    async fn read(&mut self, step: &str) -> Result<Value, CliError> {
        let line = tokio::time::timeout(STEP_LIMIT, self.lines.next_line())
            .await
            .map_err(|_| CliError::DemoFailed {
                detail: format!(
                    "{step}: owner A did not answer within {} s",
                    STEP_LIMIT.as_secs()
                ),
            })?
            .map_err(|e| failed(step, e))?;
        let Some(line) = line else {
            let status = self.child.try_wait().ok().flatten();
            return Err(CliError::DemoFailed {
                detail: format!(
                    "{step}: owner A's process ended{} (its error, if any, is on stderr above)",
                    status.map(|s| format!(" with {s}")).unwrap_or_default()
                ),
            });
        };
        serde_json::from_str(&line)
            .map_err(|e| failed(&format!("{step}: owner A said {line:?}"), e))
    }

    async fn ask(&mut self, command: &str, step: &str) -> Result<Value, CliError> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| failed(step, e))?;
        self.stdin.flush().await.map_err(|e| failed(step, e))?;
        self.read(step).await
    }

    /// Has A poll until it holds partition 0 and has folded up to `end`.
    pub async fn catch_up(&mut self, end: i64, step: &str) -> Result<Held, CliError> {
        let v = self.ask(&format!("catch-up {end}"), step).await?;
        held_of(v, step)
    }

    /// Has A rejoin the group after the eviction of `old`, and catch up to `end`.
    pub async fn rejoin(&mut self, end: i64, old: &str, step: &str) -> Result<Held, CliError> {
        let v = self.ask(&format!("rejoin {end} {old}"), step).await?;
        held_of(v, step)
    }

    /// Has A persist (`persist`) or commit (`commit`); `Err` only when A could not be asked.
    pub async fn write(&mut self, command: &str, step: &str) -> Result<Option<Refusal>, CliError> {
        let v = self.ask(command, step).await?;
        if v["ok"] == true {
            return Ok(None);
        }
        Ok(Some(Refusal {
            fence: Fence::parse(v["fence"].as_str().unwrap_or_default()),
            code: v["code"].as_str().map(str::to_owned),
            error: v["error"].as_str().unwrap_or_default().to_owned(),
        }))
    }

    /// Has A flush with the gate armed for the API `keys`: answers once the gate holds one (A then waits
    /// for [`release`](Self::release)), or once the flush ended without reaching one.
    pub async fn flush_holding(&mut self, keys: &[i16], step: &str) -> Result<Flush, CliError> {
        let keys: Vec<String> = keys.iter().map(i16::to_string).collect();
        let v = self
            .ask(&format!("flush-holding {}", keys.join(",")), step)
            .await?;
        flush_of(v, step)
    }

    /// Lets the request A's gate holds go (A reads it as soon as it runs: send it before a SIGCONT).
    pub async fn release(&mut self, step: &str) -> Result<(), CliError> {
        self.stdin
            .write_all(b"release\n")
            .await
            .map_err(|e| failed(step, e))?;
        self.stdin.flush().await.map_err(|e| failed(step, e))
    }

    /// The outcome of a flush whose held request was released.
    pub async fn flushed(&mut self, step: &str) -> Result<Flush, CliError> {
        let v = self.read(step).await?;
        flush_of(v, step)
    }

    /// SIGKILL: A ends at once, as in a crash; whatever it had in flight stays as it was.
    pub async fn kill(mut self) -> Result<(), CliError> {
        self.child
            .kill()
            .await
            .map_err(|e| failed("kill owner A", e))
    }

    /// What A's metrics counted of its snapshot transactions; `None` when it could not say (the summary
    /// then says so; the story does not depend on it).
    pub async fn metrics(&mut self) -> Option<TxnTally> {
        let v = self.ask("metrics", "owner A's metrics").await.ok()?;
        TxnTally::from_json(&v["metrics"])
    }

    /// SIGSTOP: A freezes whole, its heartbeats included.
    pub async fn stop(&self) -> Result<(), CliError> {
        self.signal("STOP").await
    }

    /// SIGCONT: A carries on from where it was frozen.
    pub async fn resume(&self) -> Result<(), CliError> {
        self.signal("CONT").await
    }

    async fn signal(&self, name: &str) -> Result<(), CliError> {
        // Through the shell's built-in `kill`: present wherever there is a /bin/sh, and it keeps
        // the binary free of C and of unsafe code.
        let status = tokio::process::Command::new("sh")
            .args(["-c", "kill -s \"$1\" \"$2\"", "sh", name])
            .arg(self.pid.to_string())
            .status()
            .await
            .map_err(|e| failed(&format!("send SIG{name} to owner A"), e))?;
        if !status.success() {
            return Err(CliError::DemoFailed {
                detail: format!("send SIG{name} to owner A (pid {}): {status}", self.pid),
            });
        }
        Ok(())
    }

    /// Ends A the way a stale owner ends after its fence: at once, without leaving the group.
    pub async fn quit(mut self) {
        let asked =
            self.stdin.write_all(b"quit\n").await.is_ok() && self.stdin.flush().await.is_ok();
        let exited = asked
            && tokio::time::timeout(Duration::from_secs(5), self.child.wait())
                .await
                .is_ok_and(|r| r.is_ok());
        if !exited {
            let _ = self.child.kill().await;
        }
    }
}

/// Reads A's answer to `flush-holding` (or to the release after it).
fn flush_of(v: Value, step: &str) -> Result<Flush, CliError> {
    if v["ok"] != true {
        return Err(failed(step, &v["error"]));
    }
    if v["done"] != true {
        let held = match v["held"].as_str() {
            Some("EndTxn") => "EndTxn",
            Some("OffsetCommit") => "OffsetCommit",
            Some("Produce") => "Produce",
            Some("AddPartitionsToTxn") => "AddPartitionsToTxn",
            Some("AddOffsetsToTxn") => "AddOffsetsToTxn",
            Some("TxnOffsetCommit") => "TxnOffsetCommit",
            _ => "a request",
        };
        return Ok(Flush::Held(held));
    }
    let refusal = |o: &Value| {
        (o["ok"] != true).then(|| Refusal {
            fence: Fence::parse(o["fence"].as_str().unwrap_or_default()),
            code: o["code"].as_str().map(str::to_owned),
            error: o["error"].as_str().unwrap_or_default().to_owned(),
        })
    };
    Ok(Flush::Done {
        persist: refusal(&v["persist"]),
        commit: refusal(&v["commit"]),
    })
}

/// Reads A's answer to `catch-up` or `rejoin`.
fn held_of(v: Value, step: &str) -> Result<Held, CliError> {
    if v["ok"] != true {
        return Err(failed(step, &v["error"]));
    }
    let accounts = v["accounts"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, a)| {
                    let n = |i: usize| a.get(i).and_then(Value::as_i64);
                    Some((
                        k.clone(),
                        Account {
                            deposits: u64::try_from(n(0)?).ok()?,
                            balance: n(1)?,
                            last: u64::try_from(n(2)?).ok()?,
                        },
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Held {
        generation: v["generation"]
            .as_i64()
            .and_then(|g| i32::try_from(g).ok())
            .unwrap_or(-1),
        member: v["member"].as_str().unwrap_or_default().to_owned(),
        accounts,
        confirmed: v["confirmed"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
    })
}

/// The account of `key` in a held state.
pub(crate) fn account(held: &Held, key: &str) -> Option<Account> {
    held.accounts.get(key).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of the pipe must agree on A's answers, or a refusal could be read as the wrong fence.
    #[test]
    fn answers_read_back_as_sent() {
        for fence in [Fence::Generation, Fence::ProducerEpoch, Fence::Other] {
            assert_eq!(Fence::parse(fence.as_str()), fence);
        }
        let held = held_of(
            json!({ "ok": true, "generation": 3, "member": "m-1", "accounts": { "alice": [10, 800, 15] } }),
            "step",
        )
        .unwrap();
        assert_eq!((held.generation, held.member.as_str()), (3, "m-1"));
        assert_eq!(
            account(&held, "alice"),
            Some(Account {
                deposits: 10,
                balance: 800,
                last: 15
            })
        );
        let e = held_of(json!({ "ok": false, "error": "boom" }), "step").unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
