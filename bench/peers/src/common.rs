//! What both Rust peers share: the workload command line of bench/src/workload.rs (read there what each
//! workload does), record contents and the RESULT line.

use std::time::Instant;

/// The positional arguments after the workload name.
pub struct Args(pub Vec<String>);

impl Args {
    pub fn from_env() -> Args {
        Args(std::env::args().skip(1).collect())
    }
    pub fn name(&self) -> &str {
        self.0.first().map(String::as_str).unwrap_or("")
    }
    pub fn s(&self, i: usize) -> &str {
        self.0.get(i).map(String::as_str).unwrap_or_else(|| usage())
    }
    /// Argument `i` as a number, `default` if the command line stops before it.
    pub fn n_or(&self, i: usize, default: usize) -> usize {
        if self.0.len() > i {
            self.n(i)
        } else {
            default
        }
    }

    pub fn n(&self, i: usize) -> usize {
        self.s(i).parse().unwrap_or_else(|_| usage())
    }
}

fn usage() -> ! {
    eprintln!("bad workload arguments (see bench/src/workload.rs)");
    std::process::exit(2)
}

pub fn key(i: usize) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

pub fn value(size: usize, i: usize) -> Vec<u8> {
    vec![b'a' + (i % 26) as u8; size]
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Prints the RESULT line for a run timed from `began`.
pub fn result(began: Instant, records: usize, bytes: usize, extra: &str) {
    let ms = began.elapsed().as_secs_f64() * 1e3;
    let mut line = format!("RESULT ms={ms:.3} records={records}");
    if bytes > 0 {
        line.push_str(&format!(" bytes={bytes}"));
    }
    if let Some(rss) = peak_rss_kib() {
        line.push_str(&format!(" rss_kib={rss}"));
    }
    println!("{line}{extra}");
}
