//! The markdown the runner writes: per cluster and round, one table of times, ratios (snapfence / peer,
//! same run: below 1 means snapfence is faster), transaction counts and the issue's targets.

use std::fmt::Write as _;
use std::time::Duration;

use crate::workload::Outcome;

pub const OURS: &str = "snapfence";
pub const JAVA: &str = "Java";
pub const CONFLUENT: &str = "confluent-kafka";
pub const RDKAFKA: &str = "rust-rdkafka";
/// snapfence as built by another commit (`--before`).
pub const BEFORE: &str = "snapfence before";
/// Kafka's own `kafka-producer-perf-test` at its steady rate: the broker's ceiling for B'.
pub const CEILING: &str = "perf-test ceiling";

/// One client's result for one workload.
#[derive(Debug, Clone)]
pub enum Cell {
    Done(Outcome),
    Failed(String),
    Missing,
}

impl Cell {
    fn outcome(&self) -> Option<&Outcome> {
        match self {
            Cell::Done(o) => Some(o),
            _ => None,
        }
    }
}

/// One client's runs of one workload reduced to its median run (by time), carrying the range of all of
/// them. The first failure wins: a client that failed once has no figure.
pub fn median(runs: Vec<Cell>) -> Cell {
    if let Some(failed) = runs.iter().find(|c| matches!(c, Cell::Failed(_))) {
        return failed.clone();
    }
    let mut done: Vec<Outcome> = runs
        .into_iter()
        .filter_map(|c| match c {
            Cell::Done(o) => Some(o),
            _ => None,
        })
        .collect();
    if done.is_empty() {
        return Cell::Missing;
    }
    done.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    let range = (done.len() > 1).then(|| (done[0].ms, done[done.len() - 1].ms));
    let mut mid = done.swap_remove(done.len() / 2);
    mid.range = range;
    Cell::Done(mid)
}

/// The plain (idempotent, no transaction) row a transactional row's floor starts from: the same records
/// written the same way, in one stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plain {
    /// A(a): A's records, each write awaited before the next (A(b)'s floor).
    ASeq,
    /// A's records, all at once (A(c)'s floor).
    ABurst,
    /// B's baseline (the B caps' floor).
    BBurst,
}

/// What a row is held to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// A plain row whose time the floor of [`Target::Transactional`] rows starts from.
    Baseline(Plain),
    /// At most 0.8x the Java client, no slower than confluent-kafka, and at most 1.10x the broker's
    /// floor: the plain row's time plus one marker round (the [`Target::Marker`] row) per transaction.
    Transactional(Plain),
    /// The marker round: the broker's work per transaction after EndTxn is answered (`txn-marker`).
    Marker,
    /// At most 0.8x both the Java client and confluent-kafka (experiment B', issue 17).
    Spread,
    /// At most 0.7x the Java consumer.
    Recovery,
    /// Peak RSS at most the recovered bytes plus 32 MiB.
    Memory,
    /// Under one second.
    Takeover,
}

/// How far above the broker's floor a transactional row may be (issue 17: the client adds at most 10%).
const FLOOR_SLACK: f64 = 1.10;

#[derive(Debug, Clone)]
pub struct Row {
    label: String,
    cells: Vec<Cell>,
    target: Target,
}

impl Row {
    pub fn time(label: String, cells: Vec<Cell>, target: Target) -> Row {
        Row {
            label,
            cells,
            target,
        }
    }

    pub fn memory(label: String, cells: Vec<Cell>) -> Row {
        Row {
            label,
            cells,
            target: Target::Memory,
        }
    }

    fn value(&self, i: usize) -> Option<f64> {
        let o = self.cells.get(i)?.outcome()?;
        match self.target {
            Target::Memory => o.peak_rss_kib.map(|k| k as f64 / 1024.0),
            _ => Some(o.ms),
        }
    }
}

/// One cluster, one round.
#[derive(Debug, Clone)]
pub struct Section {
    title: String,
    clients: Vec<&'static str>,
    rows: Vec<Row>,
    elapsed: Duration,
}

impl Section {
    pub fn new(title: String, clients: Vec<&'static str>) -> Section {
        Section {
            title,
            clients,
            rows: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    pub fn set_elapsed(&mut self, d: Duration) {
        self.elapsed = d;
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.clients.iter().position(|c| *c == name)
    }

    /// A transactional row against the broker's floor: the plain row's time (ours, this round) plus our
    /// median run's transactions times this round's marker round. None when any of them is missing.
    fn floor(&self, row: &Row, plain: Plain) -> Option<String> {
        let i = self.index(OURS)?;
        let o = row.cells.get(i)?.outcome()?;
        let txns = o.txns?;
        let ours_in = |target: Target| {
            self.rows
                .iter()
                .find(|r| r.target == target)
                .and_then(|r| r.value(i))
        };
        let (base, marker) = (ours_in(Target::Baseline(plain))?, ours_in(Target::Marker)?);
        let floor = base + txns as f64 * marker;
        let r = o.ms / floor;
        let mark = if r <= FLOOR_SLACK {
            "met"
        } else {
            "**missed**"
        };
        Some(format!(
            "{r:.2}x the floor {floor:.0} ms = {base:.0} + {txns} x {marker:.1} ms (<={FLOOR_SLACK:.2}): {mark}"
        ))
    }

    /// The verdict on a row's target, as table text.
    fn verdict(&self, row: &Row) -> String {
        let ours = self.index(OURS).and_then(|i| row.value(i));
        let vs = |peer: &str| -> Option<f64> {
            let p = self.index(peer).and_then(|i| row.value(i))?;
            Some(ours? / p)
        };
        let mark = |ok: bool| if ok { "met" } else { "**missed**" };
        match row.target {
            Target::Baseline(_) | Target::Marker => String::new(),
            Target::Transactional(plain) => {
                let mut parts = Vec::new();
                if let Some(floor) = self.floor(row, plain) {
                    parts.push(floor);
                }
                if let Some(r) = vs(JAVA) {
                    parts.push(format!("<=0.8x Java: {}", mark(r <= 0.8)));
                }
                if let Some(r) = vs(CONFLUENT) {
                    parts.push(format!("<=1x confluent: {}", mark(r <= 1.0)));
                }
                parts.join("; ")
            }
            Target::Spread => {
                let mut parts = Vec::new();
                for (peer, name) in [(JAVA, "Java"), (CONFLUENT, "confluent")] {
                    if let Some(r) = vs(peer) {
                        parts.push(format!("<=0.8x {name}: {}", mark(r <= 0.8)));
                    }
                }
                // Issue 35: within 10% of the broker's ceiling, and faster than every peer.
                if let Some(r) = vs(CEILING) {
                    parts.push(format!("<=1.10x ceiling: {}", mark(r <= 1.10)));
                }
                let peers: Vec<f64> = [JAVA, CONFLUENT, RDKAFKA]
                    .iter()
                    .filter_map(|p| vs(p))
                    .collect();
                if self.index(CEILING).is_some() && !peers.is_empty() {
                    let below = peers.iter().all(|r| *r < 1.0);
                    parts.push(format!("below every peer: {}", mark(below)));
                }
                parts.join("; ")
            }
            Target::Recovery => match vs(JAVA) {
                Some(r) => format!("<=0.7x Java: {}", mark(r <= 0.7)),
                None => String::new(),
            },
            Target::Memory => {
                let o = self
                    .index(OURS)
                    .and_then(|i| row.cells[i].outcome())
                    .cloned();
                match (o, ours) {
                    (Some(o), Some(peak)) => {
                        let limit = o.bytes as f64 / (1024.0 * 1024.0) + 32.0;
                        format!("<= data + 32 MiB = {limit:.1} MiB: {}", mark(peak <= limit))
                    }
                    _ => String::new(),
                }
            }
            Target::Takeover => match ours {
                Some(ms) => format!("< 1 s: {}", mark(ms < 1000.0)),
                None => String::new(),
            },
        }
    }

    fn markdown(&self, out: &mut String, footnotes: &mut Vec<String>) {
        let _ = writeln!(out, "### {}\n", self.title);
        let peers: Vec<&str> = self
            .clients
            .iter()
            .copied()
            .filter(|c| *c != OURS)
            .collect();
        let mut header = String::from("| workload |");
        let mut rule = String::from("|---|");
        for c in &self.clients {
            let _ = write!(header, " {c} |");
            rule.push_str("---:|");
        }
        for p in &peers {
            let _ = write!(header, " vs {p} |");
            rule.push_str("---:|");
        }
        header.push_str(" transactions | target |");
        rule.push_str("---|---|");
        let _ = writeln!(out, "{header}\n{rule}");
        for row in &self.rows {
            let mut line = format!("| {} |", row.label);
            for (i, cell) in row.cells.iter().enumerate() {
                let text = match (cell, row.value(i)) {
                    (Cell::Done(o), Some(v)) => match (row.target, o.acquire_ms) {
                        (Target::Memory, _) => format!("{v:.1} MiB"),
                        (_, Some(a)) => format!("{v:.1} ms (init {a:.1})"),
                        _ => match o.range {
                            Some((lo, hi)) => format!("{v:.1} ms [{lo:.0}-{hi:.0}]"),
                            None => format!("{v:.1} ms"),
                        },
                    },
                    (Cell::Failed(why), _) => {
                        footnotes.push(format!("{} / {}: {why}", self.title, row.label));
                        format!("failed [{}]", footnotes.len())
                    }
                    _ => "-".into(),
                };
                let _ = write!(line, " {text} |");
            }
            let ours = self.index(OURS).and_then(|i| row.value(i));
            for p in &peers {
                let ratio = self
                    .index(p)
                    .and_then(|i| row.value(i))
                    .zip(ours)
                    .map(|(p, o)| format!("{:.2}x", o / p))
                    .unwrap_or_else(|| "-".into());
                let _ = write!(line, " {ratio} |");
            }
            let txns: Vec<String> = row
                .cells
                .iter()
                .map(|c| {
                    c.outcome()
                        .and_then(|o| o.txns)
                        .map_or("-".into(), |t| t.to_string())
                })
                .collect();
            let txns = if txns.iter().all(|t| t == "-") {
                String::new()
            } else {
                txns.join(" / ")
            };
            let _ = writeln!(line, " {txns} | {} |", self.verdict(row));
            out.push_str(&line);
        }
        let _ = writeln!(
            out,
            "\nRound time {:.0} s. Transactions are listed in the column order ({}).\n",
            self.elapsed.as_secs_f64(),
            self.clients.join(" / ")
        );
    }
}

/// Everything one `run` measured.
pub struct Report {
    notes: Vec<String>,
    sections: Vec<Section>,
    load_before: String,
}

impl Report {
    pub fn new(notes: Vec<String>) -> Report {
        Report {
            notes,
            sections: Vec::new(),
            load_before: load_average(),
        }
    }

    pub fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    pub fn push(&mut self, s: Section) {
        self.sections.push(s);
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "Machine: {}.", machine());
        let _ = writeln!(
            out,
            "Load average (1, 5, 15 min) before: {}; after: {}.\n",
            self.load_before,
            load_average()
        );
        for note in &self.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        let mut footnotes = Vec::new();
        for s in &self.sections {
            s.markdown(&mut out, &mut footnotes);
        }
        if !footnotes.is_empty() {
            let _ = writeln!(out, "Failures:\n");
            for (i, f) in footnotes.iter().enumerate() {
                let _ = writeln!(out, "{}. {}", i + 1, f.replace('\n', " "));
            }
        }
        out
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(String::new(), |k| {
            format!(", {:.0} GiB", k as f64 / 1048576.0)
        });
    format!("{cpu}, {cores} CPUs{mem}, Linux {}", kernel.trim())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(ms: f64, txns: Option<u64>) -> Cell {
        Cell::Done(Outcome {
            ms,
            txns,
            ..Outcome::default()
        })
    }

    fn txn(ms: f64, txns: u64) -> Cell {
        done(ms, Some(txns))
    }

    #[test]
    fn ratios_and_verdicts_use_the_same_run() {
        let mut s = Section::new("t".into(), vec![OURS, JAVA, CONFLUENT]);
        s.push(Row::time(
            "base".into(),
            vec![done(100.0, None), done(150.0, None), done(90.0, None)],
            Target::Baseline(Plain::BBurst),
        ));
        s.push(Row::time(
            "marker".into(),
            vec![done(1.0, Some(30)), Cell::Missing, Cell::Missing],
            Target::Marker,
        ));
        // Floor: 100 + 8 x 1.0 = 108 ms; 110 ms is 1.02x of it.
        let cap = Row::time(
            "cap".into(),
            vec![txn(110.0, 8), done(200.0, Some(8)), done(120.0, Some(8))],
            Target::Transactional(Plain::BBurst),
        );
        s.push(cap.clone());
        let verdict = s.verdict(&cap);
        assert!(
            verdict.contains("1.02x the floor 108 ms = 100 + 8 x 1.0 ms (<=1.10): met"),
            "{verdict}"
        );
        assert!(verdict.contains("<=0.8x Java: met"), "{verdict}");
        assert!(verdict.contains("<=1x confluent: met"), "{verdict}");
        // 130 ms is 1.20x a floor of 108.
        let slow = Row::time(
            "slow".into(),
            vec![txn(130.0, 8), Cell::Missing, Cell::Missing],
            Target::Transactional(Plain::BBurst),
        );
        assert!(
            s.verdict(&slow).contains("1.20x the floor 108 ms")
                && s.verdict(&slow).contains("**missed**"),
            "{}",
            s.verdict(&slow)
        );
        // No baseline of its kind in the round: no floor verdict, the peer ratios only.
        let other = Row::time(
            "a".into(),
            vec![txn(10.0, 2), done(20.0, Some(2)), Cell::Missing],
            Target::Transactional(Plain::ABurst),
        );
        assert_eq!(s.verdict(&other), "<=0.8x Java: met");
        let mut text = String::new();
        s.markdown(&mut text, &mut Vec::new());
        assert!(
            text.contains("| cap | 110.0 ms | 200.0 ms | 120.0 ms | 0.55x | 0.92x | 8 / 8 / 8 |"),
            "{text}"
        );
    }

    #[test]
    fn no_marker_row_no_floor() {
        let mut s = Section::new("t".into(), vec![OURS]);
        s.push(Row::time(
            "a(a)".into(),
            vec![done(200.0, None)],
            Target::Baseline(Plain::ASeq),
        ));
        let row = Row::time(
            "a(b)".into(),
            vec![txn(2600.0, 500)],
            Target::Transactional(Plain::ASeq),
        );
        assert_eq!(s.verdict(&row), "");
        s.push(Row::time("m".into(), vec![done(4.0, None)], Target::Marker));
        assert!(
            s.verdict(&row)
                .contains("1.18x the floor 2200 ms = 200 + 500 x 4.0 ms (<=1.10): **missed**"),
            "{}",
            s.verdict(&row)
        );
    }

    #[test]
    fn repeated_runs_report_the_median_run_and_the_range() {
        // The median is a whole run (its transaction count stays with its time), not a mix of runs.
        let cell = median(vec![
            done(300.0, Some(9)),
            done(100.0, Some(8)),
            done(200.0, Some(10)),
        ]);
        let Cell::Done(o) = &cell else {
            panic!("{cell:?}")
        };
        assert_eq!(
            (o.ms, o.txns, o.range),
            (200.0, Some(10), Some((100.0, 300.0)))
        );
        let mut s = Section::new("t".into(), vec![OURS]);
        s.push(Row::time(
            "r".into(),
            vec![cell],
            Target::Baseline(Plain::ASeq),
        ));
        let mut text = String::new();
        s.markdown(&mut text, &mut Vec::new());
        assert!(text.contains("| r | 200.0 ms [100-300] |"), "{text}");
        // One failed run fails the cell; no runs leave it missing.
        let failed = median(vec![done(1.0, None), Cell::Failed("x".into())]);
        assert!(
            matches!(failed, Cell::Failed(ref w) if w == "x"),
            "{failed:?}"
        );
        assert!(matches!(median(Vec::new()), Cell::Missing));
    }

    #[test]
    fn failures_become_numbered_footnotes() {
        let mut s = Section::new("t".into(), vec![OURS, JAVA]);
        s.push(Row::time(
            "x".into(),
            vec![done(1.0, None), Cell::Failed("boom".into())],
            Target::Transactional(Plain::BBurst),
        ));
        let mut text = String::new();
        let mut notes = Vec::new();
        s.markdown(&mut text, &mut notes);
        assert!(text.contains("failed [1]"), "{text}");
        assert_eq!(notes, vec!["t / x: boom".to_string()]);
    }
}
