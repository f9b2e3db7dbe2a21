//! `snapfence`: the operator tool. All logic lives in the `snapfence_cli` library so tests can drive it.

use std::io::{BufWriter, IsTerminal, Write};
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
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let stderr = std::io::stderr();
    // Progress is for a person watching; piped or captured stderr stays free of carriage returns.
    let progress = stderr.is_terminal();
    let mut err = stderr.lock();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
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
