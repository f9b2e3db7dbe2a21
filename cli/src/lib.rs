//! The `snapfence` operator tool: a Kafka cluster's transactional state, seen over the wire.
//!
//! The binary is a thin `main` around [`run`], which takes the arguments and an [`Io`] (output, error
//! output, confirmation input), so tests drive every subcommand in-process and read what it printed;
//! all but `demo`, whose owner A is the `snapfence` binary started again (tests run the binary for it).
//!
//! | subcommand | what it shows |
//! |---|---|
//! | `inspect` | per partition: log start, HW, LSO, HW−LSO, open transactions and their owners; a group's committed offsets; `--watch` redraws it every second |
//! | `dump` | a topic's batches and markers (every partition in order, or one from an offset), at either isolation level, text or JSON lines |
//! | `find-hanging` | KIP-664's hanging transactions for a topic or a broker; `--abort` ends them |
//! | `recover` | a snapshot topic's recovery read (every partition, or those named), run without owning it; envelopes opened; a stall with its diagnosis |
//! | `reset` | a stopped flow's group moved to another input position, the snapshots at or past it deleted in fencing transactions; a dry run unless `--execute` |
//! | `demo` | the stale-owner story, fenced and unfenced, on a broker it starts itself (or `--bootstrap`); `--story outputs`: each output exactly once through a kill and a zombie |
//!
//! Exit status: 0 success, 1 failure, 2 bad command line, 3 cluster unreachable, 4 topic/partition/offset
//! not found, 5 not authorized, 6 recovery stalled, 7 authentication or TLS failed, 8 the group has members
//! (`reset`) (see [`error`]). Errors name the cause and the next step on stderr.
//!
//! # References
//! - KIP-98 (transactions, LSO), KIP-447 (stable offsets), KIP-664 (hanging transactions)
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;

mod demo;
mod dump;
mod exporter;
mod hanging;
mod inspect;
mod kafka;
mod progress;
mod recover;
mod reset;
pub mod security;
mod show;

use std::ffi::OsString;
use std::io::{BufRead, Write};

use clap::{Parser, Subcommand};

pub use demo::{DemoArgs, DemoStory};
pub use dump::{DumpArgs, Isolation};
pub use error::CliError;
pub use hanging::{find_hanging, FindHangingArgs};
pub use inspect::InspectArgs;
pub use recover::RecoverArgs;
pub use reset::{ResetArgs, ToOffset};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned tables and plain sentences.
    #[default]
    Text,
    /// JSON: one document (inspect, find-hanging) or one object per line (dump).
    Json,
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "snapfence",
    version,
    about = "See and repair Kafka transactional state over the wire",
    long_about = "See and repair Kafka transactional state over the wire: last stable offsets, open and \
                  hanging transactions, and the batches and markers behind them."
)]
pub struct Cli {
    /// Brokers to start from, as host:port[,host:port...].
    #[arg(
        long,
        short = 'b',
        env = "SNAPFENCE_BOOTSTRAP",
        global = true,
        value_name = "HOST:PORT"
    )]
    pub bootstrap: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    pub format: Format,
    /// SASL and TLS settings.
    #[command(flatten)]
    pub security: security::SecurityArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per partition: offsets, the LSO gap, open transactions, and a group's committed offsets.
    Inspect(InspectArgs),
    /// Decode batches and transaction markers over the wire: every partition in turn, or one with -p.
    Dump(DumpArgs),
    /// Find transactions no coordinator will end (KIP-664), and optionally abort them.
    FindHanging(FindHangingArgs),
    /// Run a snapshot topic's recovery read (every partition, or those named) without owning it; on a
    /// stall, say why.
    Recover(RecoverArgs),
    /// Move a stopped flow's consumer group to another input position and delete the snapshots at or
    /// past it. A dry run unless --execute.
    Reset(ResetArgs),
    /// Show a stale owner's late snapshot write refused by the fence, and the damage without it. Starts
    /// a local Kafka broker unless --bootstrap (or SNAPFENCE_BOOTSTRAP) names one.
    Demo(DemoArgs),
    /// Not for people: owner A of `demo`, a process of its own so the demo can pause it whole, steered by
    /// the demo over stdin and stdout.
    #[command(name = "__demo-owner", hide = true)]
    DemoOwner(demo::OwnerArgs),
}

/// Where a run reads and writes. Each is `Send`, so a run's future is too: a program may spawn it on a
/// multi-threaded runtime.
pub struct Io<'a> {
    /// Results.
    pub out: &'a mut (dyn Write + Send),
    /// Errors, notes, prompts and the progress indicator.
    pub err: &'a mut (dyn Write + Send),
    /// Answers to confirmation prompts.
    pub input: &'a mut (dyn BufRead + Send),
    /// Whether stderr is a terminal (the binary sets it so): progress is drawn, and errors and help are
    /// coloured, only then.
    pub progress: bool,
}

/// Parses `args` (the first is the program name), runs the command and returns the exit status.
/// Failures are reported on `io.err` with their cause and next step.
///
/// Not cancel-safe in effect: dropping the future mid-way leaves whatever was already done (an abort
/// marker written by `find-hanging --abort` stays written).
pub async fn run<I, T>(args: I, io: &mut Io<'_>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let text = if colour_parse_output(io.progress, e.use_stderr()) {
                e.render().ansi().to_string()
            } else {
                // StyledStr's Display drops the styling: plain text for a pipe, a file or a test.
                e.render().to_string()
            };
            let to = if e.use_stderr() {
                &mut *io.err
            } else {
                &mut *io.out
            };
            // Nothing better to do if even this write fails.
            let _ = write!(to, "{text}");
            return e.exit_code();
        }
    };
    match execute(&cli, io).await {
        Ok(()) => match io.out.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => report(io, &CliError::Io(e)),
            _ => error::EXIT_OK,
        },
        Err(e) if e.is_broken_pipe() => error::EXIT_OK,
        Err(e) => report(io, &e),
    }
}

/// Whether clap's message (an error on stderr, or help and version on stdout) may carry ANSI colour.
///
/// `Io` only says whether stderr is a terminal. For help and version, which go to stdout, the binary's
/// `io.out` is the process's stdout, so its terminal-ness is asked directly; `progress` must be set too, so
/// that an in-process caller (the tests) that captures stderr never gets colour, whatever the process's
/// own stdout is. A person at a terminal with both streams on it gets colour; `--help | less` and
/// `2>&1 | cat` get plain text.
fn colour_parse_output(stderr_is_terminal: bool, to_stderr: bool) -> bool {
    use std::io::IsTerminal;
    stderr_is_terminal && (to_stderr || std::io::stdout().is_terminal())
}

fn report(io: &mut Io<'_>, e: &CliError) -> i32 {
    let _ = io.out.flush();
    let _ = writeln!(
        io.err,
        "error: {}\n  next step: {}",
        error::render(e),
        e.next_step()
    );
    e.exit_code()
}

/// Runs a parsed command line.
///
/// Cancel safety: as [`run`].
pub async fn execute(cli: &Cli, io: &mut Io<'_>) -> Result<(), CliError> {
    let bootstrap = cli
        .bootstrap
        .as_deref()
        .map(str::trim)
        .filter(|b| !b.is_empty());
    match &cli.command {
        Command::Demo(args) => {
            return demo::run(bootstrap, &cli.security, args, cli.format, io).await
        }
        Command::DemoOwner(args) => {
            return demo::serve_owner(bootstrap, &cli.security, args, io).await
        }
        _ => {}
    }
    let bootstrap = bootstrap.ok_or_else(|| CliError::Usage {
        message: "no bootstrap address".into(),
        hint: "pass --bootstrap host:port or set SNAPFENCE_BOOTSTRAP".into(),
    })?;
    let metrics_addr = match &cli.command {
        Command::Inspect(args) => args.metrics_addr.as_deref(),
        Command::Recover(args) => args.metrics_addr.as_deref(),
        _ => None,
    };
    // Before connecting: a connection registers its metric handles with the recorder in force when it
    // opens. Held to the end of the command; dropping it stops the listener.
    let served = match metrics_addr {
        Some(addr) => {
            let served = exporter::serve(addr, exporter::install()?).await?;
            writeln!(io.err, "serving metrics at http://{}/metrics", served.addr)?;
            io.err.flush()?;
            Some(served)
        }
        None => None,
    };
    let cluster = kafka::Cluster::connect(bootstrap, &cli.security).await?;
    match &cli.command {
        Command::Inspect(args) => {
            let metrics_at = served.as_ref().map(|s| s.addr);
            inspect::run(&cluster, args, cli.format, metrics_at, io).await
        }
        Command::Dump(args) => dump::run(&cluster, args, cli.format, io).await,
        Command::FindHanging(args) => hanging::run(&cluster, args, cli.format, io).await,
        Command::Recover(args) => recover::run(&cluster, args, cli.format, io).await,
        Command::Reset(args) => reset::run(&cluster, args, cli.format, io).await,
        // Handled above without a connection; kept total rather than panicking.
        Command::Demo(args) => {
            demo::run(Some(bootstrap), &cli.security, args, cli.format, io).await
        }
        Command::DemoOwner(args) => {
            demo::serve_owner(Some(bootstrap), &cli.security, args, io).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run_captured(args: &[&str]) -> (i32, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut input = std::io::empty();
        let mut io = Io {
            out: &mut out,
            err: &mut err,
            input: &mut input,
            progress: false,
        };
        let code = run(args.iter().copied(), &mut io).await;
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    /// The clap definition of the command line is internally consistent (no clashing names or broken
    /// argument relations), so a bad definition fails here and not in a user's hands.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// The demo's owner subcommand is machinery, not something to offer a person.
    #[test]
    fn the_demo_owner_stays_out_of_help() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("demo"), "{help}");
        assert!(!help.contains("__demo-owner"), "{help}");
    }

    /// A missing bootstrap, or options that only make sense with another (an offset without a partition,
    /// a partition without a topic), is a usage error naming what is missing, before any broker is
    /// reached.
    #[tokio::test]
    async fn a_missing_scope_or_bootstrap_is_a_usage_error() {
        let (code, _, err) = run_captured(&["snapfence", "inspect", "t"]).await;
        // The environment may name a cluster; only check when it does not.
        if std::env::var_os("SNAPFENCE_BOOTSTRAP").is_none() {
            assert_eq!(code, error::EXIT_USAGE, "{err}");
            assert!(err.contains("SNAPFENCE_BOOTSTRAP"), "{err}");
        }
        // Without --partition every partition is read, but an offset only means something in one.
        let (code, _, err) =
            run_captured(&["snapfence", "-b", "x:1", "dump", "t", "-o", "5"]).await;
        assert_eq!(code, 2, "--offset needs --partition: {err}");
        assert!(err.contains("--partition"), "{err}");
        let (code, _, err) =
            run_captured(&["snapfence", "find-hanging", "--partition", "1", "-b", "x:1"]).await;
        assert_eq!(code, 2, "--partition needs --topic: {err}");
        let (code, _, err) =
            run_captured(&["snapfence", "-b", "x:1", "recover", "t", "-p", "x"]).await;
        assert_eq!(code, 2, "a partition is a number: {err}");
        // Refused before any broker is started or reached.
        let (code, _, err) = run_captured(&["snapfence", "--format", "json", "demo"]).await;
        assert_eq!(code, error::EXIT_USAGE, "{err}");
        assert!(err.contains("no JSON output"), "{err}");
    }

    /// An unreachable broker exits with the unreachable status, names the address once, and says what to
    /// check next.
    #[tokio::test]
    async fn an_unreachable_broker_says_so_and_what_to_check() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let (code, _, err) =
            run_captured(&["snapfence", "-b", "127.0.0.1:1", "inspect", "t"]).await;
        assert_eq!(code, error::EXIT_UNREACHABLE, "{err}");
        assert!(
            err.contains("cannot reach the Kafka cluster at 127.0.0.1:1"),
            "{err}"
        );
        assert!(err.contains("next step"), "{err}");
        // Each fact once: the address is named by the first clause and not again by the causes under it.
        let first = err.lines().next().unwrap_or_default();
        assert_eq!(first.matches("127.0.0.1:1").count(), 1, "{err}");
        assert!(!first.contains("cannot connect to"), "{err}");
    }

    /// Help and parse errors written anywhere but a terminal (here a buffer, as a pipe would be) carry no
    /// ANSI escape codes.
    #[tokio::test]
    async fn parse_errors_and_help_into_a_pipe_are_plain_text() {
        let (code, out, err) = run_captured(&["snapfence", "dump"]).await;
        assert_eq!(code, error::EXIT_USAGE, "{err}");
        assert!(err.contains("<TOPIC>"), "{err}");
        assert!(!err.contains('\x1b'), "{err:?}");
        assert!(out.is_empty(), "{out}");
        let (code, out, _) = run_captured(&["snapfence", "--help"]).await;
        assert_eq!(code, 0);
        assert!(out.contains("Usage:") && !out.contains('\x1b'), "{out:?}");
        assert!(!colour_parse_output(false, true));
        assert!(!colour_parse_output(false, false));
        assert!(colour_parse_output(true, true));
    }
}
