//! `snapfence`: the operator tool. All logic lives in the `snapfence_cli` library so tests can drive it.

use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // No lock on stdout, stderr or stdin is held across the run: other threads of this process (the
    // broker fixture's start on a blocking thread, tracing, a panic message) may write too, and a lock held
    // here for the whole run would make them wait forever. Each write takes the lock for itself.
    let mut out = BufWriter::new(std::io::stdout());
    let mut err = std::io::stderr();
    // Progress is for a person watching; piped or captured stderr stays free of carriage returns.
    let progress = err.is_terminal();
    let mut input = BufReader::new(std::io::stdin());
    let mut io = snapfence_cli::Io {
        out: &mut out,
        err: &mut err,
        input: &mut input,
        progress,
    };
    let code = runtime.block_on(snapfence_cli::run(std::env::args_os(), &mut io));
    let _ = out.flush();
    // Don't wait for background connection tasks to notice the end.
    runtime.shutdown_background();
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
