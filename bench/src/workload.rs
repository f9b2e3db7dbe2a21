//! The workloads every client runs, with one command line shared by all of them (ours, the Java program,
//! confluent-kafka and rust-rdkafka), and the one `RESULT` line each prints.
//!
//! ```text
//! plain-seq   BOOTSTRAP TOPIC N SIZE LINGER_MS        idempotent producer, each write awaited (A(a))
//! plain-burst BOOTSTRAP TOPIC N SIZE LINGER_MS [P]    idempotent producer, all writes at once (B baseline);
//!                                                      with P, record i goes to partition i % P
//! txn-seq     BOOTSTRAP TOPIC TXN_ID INPUT GROUP GENERATION MEMBER N SIZE       one write per transaction,
//!                                                      issued one at a time (A(b))
//! txn-burst   BOOTSTRAP TOPIC TXN_ID INPUT GROUP GENERATION MEMBER N SIZE CAP   N writes issued at once,
//!                                                      transactions of up to CAP writes (A(c), B caps)
//! txn-marker  BOOTSTRAP TOPIC TXN_ID INPUT GROUP GENERATION MEMBER N              (ours only) the marker
//!                                                      round: N transactions of one 1-byte record, each
//!                                                      followed until the coordinator has completed it
//! recover     BOOTSTRAP TOPIC READS                    earliest -> high watermark at read_committed, into a map,
//!                                                      READS times in one process; the last read is timed
//! takeover    BOOTSTRAP TOPIC TXN_ID_PREFIX            init PREFIX-0 (fences and aborts the crashed owner),
//!                                                      then recover
//! crash-owner BOOTSTRAP TOPIC TXN_ID N SIZE            (ours only) open a transaction, write, wait to die
//! fill        BOOTSTRAP TOPIC N SIZE                   (ours only) create TOPIC, commit N records (a recovery
//!                                                      data set by hand, for profiling `recover`)
//! ```
//!
//! Record i has the key `key-%06d` and SIZE bytes of value, all `'a' + i % 26`. Every transaction commits
//! an offset of partition 0 of INPUT for GROUP as MEMBER of GENERATION (a classic member the runner joined),
//! so the broker checks the fence every time. Producer workloads write one untimed warm-up record (or
//! transaction) first; `recover` and `takeover` time everything from before the client is built.

use std::fmt;

use bytes::Bytes;

/// The arguments of a transactional workload.
#[derive(Debug, Clone)]
pub struct TxnArgs {
    pub bootstrap: String,
    pub topic: String,
    pub txn_id: String,
    pub input: String,
    pub group: String,
    pub generation: i32,
    pub member: String,
}

/// One workload, parsed from the shared command line.
#[derive(Debug, Clone)]
pub enum Work {
    PlainSeq {
        bootstrap: String,
        topic: String,
        n: usize,
        size: usize,
        linger_ms: u64,
    },
    PlainBurst {
        bootstrap: String,
        topic: String,
        n: usize,
        size: usize,
        linger_ms: u64,
        /// Record i goes to partition `i % partitions`.
        partitions: usize,
    },
    TxnSeq {
        txn: TxnArgs,
        n: usize,
        size: usize,
    },
    TxnBurst {
        txn: TxnArgs,
        n: usize,
        size: usize,
        cap: usize,
    },
    TxnMarker {
        txn: TxnArgs,
        n: usize,
    },
    Recover {
        bootstrap: String,
        topic: String,
        reads: usize,
    },
    Takeover {
        bootstrap: String,
        topic: String,
        txn_prefix: String,
    },
    CrashOwner {
        bootstrap: String,
        topic: String,
        txn_id: String,
        n: usize,
        size: usize,
    },
    Fill {
        bootstrap: String,
        topic: String,
        n: usize,
        size: usize,
    },
}

impl Work {
    /// Parses `NAME ARGS...`.
    pub fn parse(args: &[String]) -> Result<Work, String> {
        let usage = || format!("bad workload arguments: {args:?} (see bench/src/workload.rs)");
        let num = |i: usize| -> Result<usize, String> {
            args.get(i).and_then(|a| a.parse().ok()).ok_or_else(usage)
        };
        let s = |i: usize| -> Result<String, String> { args.get(i).cloned().ok_or_else(usage) };
        let txn = || -> Result<TxnArgs, String> {
            Ok(TxnArgs {
                bootstrap: s(1)?,
                topic: s(2)?,
                txn_id: s(3)?,
                input: s(4)?,
                group: s(5)?,
                generation: s(6)?.parse().map_err(|_| usage())?,
                member: s(7)?,
            })
        };
        let name = args.first().map(String::as_str).unwrap_or("");
        let expected = match name {
            "plain-seq" | "plain-burst" => 6,
            "txn-seq" => 10,
            "txn-burst" => 11,
            "txn-marker" => 9,
            "recover" => 4,
            "takeover" => 4,
            "crash-owner" => 6,
            "fill" => 5,
            _ => return Err(usage()),
        };
        // plain-burst may name the number of partitions to spread over.
        let optional = usize::from(name == "plain-burst");
        if args.len() < expected || args.len() > expected + optional {
            return Err(usage());
        }
        Ok(match name {
            "plain-seq" => Work::PlainSeq {
                bootstrap: s(1)?,
                topic: s(2)?,
                n: num(3)?,
                size: num(4)?,
                linger_ms: num(5)? as u64,
            },
            "plain-burst" => Work::PlainBurst {
                bootstrap: s(1)?,
                topic: s(2)?,
                n: num(3)?,
                size: num(4)?,
                linger_ms: num(5)? as u64,
                partitions: if args.len() > 6 { num(6)?.max(1) } else { 1 },
            },
            "txn-seq" => Work::TxnSeq {
                txn: txn()?,
                n: num(8)?,
                size: num(9)?,
            },
            "txn-burst" => Work::TxnBurst {
                txn: txn()?,
                n: num(8)?,
                size: num(9)?,
                cap: num(10)?,
            },
            "txn-marker" => Work::TxnMarker {
                txn: txn()?,
                n: num(8)?,
            },
            "recover" => Work::Recover {
                bootstrap: s(1)?,
                topic: s(2)?,
                reads: num(3)?.max(1),
            },
            "takeover" => Work::Takeover {
                bootstrap: s(1)?,
                topic: s(2)?,
                txn_prefix: s(3)?,
            },
            "fill" => Work::Fill {
                bootstrap: s(1)?,
                topic: s(2)?,
                n: num(3)?,
                size: num(4)?,
            },
            _ => Work::CrashOwner {
                bootstrap: s(1)?,
                topic: s(2)?,
                txn_id: s(3)?,
                n: num(4)?,
                size: num(5)?,
            },
        })
    }
}

/// What one workload run measured: `RESULT ms=.. [txns=..] records=.. [bytes=..] [rss_kib=..]
/// [acquire_ms=..]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The timed part, in milliseconds.
    pub ms: f64,
    /// Transactions the timed part ran (transactional workloads).
    pub txns: Option<u64>,
    /// Records written, or keys in the recovered map.
    pub records: u64,
    /// Key and value bytes in the recovered map.
    pub bytes: u64,
    /// The process's peak resident set (VmHWM) at the end, KiB.
    pub peak_rss_kib: Option<u64>,
    /// Takeover: the producer init's share of `ms`.
    pub acquire_ms: Option<f64>,
    /// When the runner took the median of several runs: the fastest and slowest `ms` (never printed by a
    /// client).
    pub range: Option<(f64, f64)>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RESULT ms={:.3} records={}", self.ms, self.records)?;
        if let Some(t) = self.txns {
            write!(f, " txns={t}")?;
        }
        if self.bytes > 0 {
            write!(f, " bytes={}", self.bytes)?;
        }
        if let Some(r) = self.peak_rss_kib {
            write!(f, " rss_kib={r}")?;
        }
        if let Some(a) = self.acquire_ms {
            write!(f, " acquire_ms={a:.3}")?;
        }
        Ok(())
    }
}

impl Outcome {
    /// Finds and parses the `RESULT` line in a child's output.
    pub fn find(output: &str) -> Option<Outcome> {
        let line = output
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("RESULT "))?;
        let mut o = Outcome::default();
        let mut has_ms = false;
        for field in line.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            match k {
                "ms" => {
                    o.ms = v.parse().ok()?;
                    has_ms = true;
                }
                "txns" => o.txns = Some(v.parse().ok()?),
                "records" => o.records = v.parse().ok()?,
                "bytes" => o.bytes = v.parse().ok()?,
                "rss_kib" => o.peak_rss_kib = Some(v.parse().ok()?),
                "acquire_ms" => o.acquire_ms = Some(v.parse().ok()?),
                _ => {}
            }
        }
        has_ms.then_some(o)
    }
}

/// Record i's key.
pub fn key(i: usize) -> Bytes {
    Bytes::from(format!("key-{i:06}"))
}

/// Record i's value: `size` bytes of `'a' + i % 26`.
pub fn value(size: usize, i: usize) -> Bytes {
    Bytes::from(vec![b'a' + (i % 26) as u8; size])
}

/// This process's peak resident set size (`VmHWM` in `/proc/self/status`), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    status_kib("VmHWM:")
}

/// A KiB figure of `/proc/self/status`, by its label (`VmHWM:`, `VmRSS:`).
pub fn status_kib(label: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_round_trip() {
        let o = Outcome {
            ms: 12.5,
            txns: Some(8),
            records: 2000,
            bytes: 20_480_000,
            peak_rss_kib: Some(40_000),
            acquire_ms: Some(3.25),
            range: None,
        };
        let out = format!("noise\n{o}\n");
        assert_eq!(Outcome::find(&out), Some(o));
        assert_eq!(Outcome::find("RESULT records=3"), None, "ms is required");
    }

    #[test]
    fn workloads_parse_and_reject_wrong_arity() {
        let args: Vec<String> = "txn-burst b t id in g 3 m 2000 10240 256"
            .split(' ')
            .map(String::from)
            .collect();
        match Work::parse(&args).unwrap() {
            Work::TxnBurst { txn, n, size, cap } => {
                assert_eq!((txn.generation, n, size, cap), (3, 2000, 10240, 256));
            }
            other => panic!("{other:?}"),
        }
        assert!(Work::parse(&args[..10]).is_err());
        assert!(Work::parse(&["recover".into()]).is_err());
    }

    #[test]
    fn peak_rss_is_read_from_proc() {
        assert!(peak_rss_kib().is_some_and(|k| k > 0));
    }
}
