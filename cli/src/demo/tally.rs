//! The demo's closing summary: what snapfence's own metrics counted of the snapshot transactions, in
//! this process (owners B and C) and in owner A's (asked over its command protocol before it quits).
//!
//! Read from the process's recorder ([`crate::exporter`]'s registry), so the summary shows what an
//! operator's dashboard would have shown for the same run, not the demo's own bookkeeping.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::exporter::Registry;

const COMMITTED: &str = "snapfence_transactions_committed_total";
const ABORTED: &str = "snapfence_transactions_aborted_total";
const FENCES: &str = "snapfence_transaction_fences_total";

/// Snapshot-transaction counts of one process, summed over its partitions: commits, failures by
/// class, fences by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TxnTally {
    pub committed: u64,
    pub aborted: BTreeMap<String, u64>,
    pub fences: BTreeMap<String, u64>,
}

impl TxnTally {
    /// What `registry` has counted so far.
    pub(crate) fn read(registry: &Registry) -> TxnTally {
        let by = |name: &str, label: &str| {
            let mut out = BTreeMap::new();
            for (labels, n) in registry.counter_values(name) {
                if let Some((_, v)) = labels.iter().find(|(k, _)| k == label) {
                    *out.entry(v.clone()).or_insert(0) += n;
                }
            }
            out
        };
        TxnTally {
            committed: registry
                .counter_values(COMMITTED)
                .iter()
                .map(|(_, n)| n)
                .sum(),
            aborted: by(ABORTED, "class"),
            fences: by(FENCES, "kind"),
        }
    }

    /// What was counted after `earlier` was read (counters only grow).
    pub(crate) fn since(&self, earlier: &TxnTally) -> TxnTally {
        let minus = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            now.iter()
                .map(|(k, n)| (k.clone(), n.saturating_sub(*then.get(k).unwrap_or(&0))))
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        TxnTally {
            committed: self.committed.saturating_sub(earlier.committed),
            aborted: minus(&self.aborted, &earlier.aborted),
            fences: minus(&self.fences, &earlier.fences),
        }
    }

    fn failed(&self) -> u64 {
        self.aborted.values().sum()
    }

    /// As owner A sends it to the parent.
    pub(crate) fn to_json(&self) -> Value {
        json!({ "committed": self.committed, "aborted": self.aborted, "fences": self.fences })
    }

    /// Read back from A's answer; `None` for anything else.
    pub(crate) fn from_json(v: &Value) -> Option<TxnTally> {
        let map = |v: &Value| -> Option<BTreeMap<String, u64>> {
            v.as_object()?
                .iter()
                .map(|(k, n)| Some((k.clone(), n.as_u64()?)))
                .collect()
        };
        Some(TxnTally {
            committed: v["committed"].as_u64()?,
            aborted: map(&v["aborted"])?,
            fences: map(&v["fences"])?,
        })
    }

    /// One line: `3 committed, 2 failed (1 abortable, 1 fatal), fenced by 1 generation, 1 producer_epoch`.
    pub(crate) fn line(&self) -> String {
        if self.committed == 0 && self.failed() == 0 {
            return "no snapshot transactions".into();
        }
        let list = |m: &BTreeMap<String, u64>| {
            m.iter()
                .filter(|(_, n)| **n > 0)
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut line = format!("{} committed, {} failed", self.committed, self.failed());
        if self.failed() > 0 {
            line.push_str(&format!(" ({})", list(&self.aborted)));
        }
        if self.fences.values().any(|n| *n > 0) {
            line.push_str(&format!("; fences: {}", list(&self.fences)));
        }
        line
    }
}

/// What one run's metrics counted: in this process, and in owner A's (when it answered).
#[derive(Debug, Clone, Default)]
pub(crate) struct RunTally {
    pub here: Option<TxnTally>,
    pub owner_a: Option<TxnTally>,
}

/// The summary block for both runs, ending with a blank line.
pub(crate) fn summary(runs: &[(&str, &RunTally)]) -> String {
    let mut out = String::from(
        "What snapfence's metrics counted (snapfence_transactions_committed_total, \
         snapfence_transactions_aborted_total by class, snapfence_transaction_fences_total by kind):\n",
    );
    let unknown = || "not recorded".to_owned();
    for (name, run) in runs {
        out.push_str(&format!("  {name}:\n"));
        out.push_str(&format!(
            "    owner A:        {}\n",
            run.owner_a.as_ref().map_or_else(unknown, TxnTally::line)
        ));
        out.push_str(&format!(
            "    owners B and C: {}\n",
            run.here.as_ref().map_or_else(unknown, TxnTally::line)
        ));
    }
    out.push_str(
        "  (fence kinds: generation and member are the group coordinator's check of the writer's group \
         metadata, KIP-447; producer_epoch is a newer producer on the transactional id)\n\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(committed: u64, aborted: &[(&str, u64)], fences: &[(&str, u64)]) -> TxnTally {
        let map = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        TxnTally {
            committed,
            aborted: map(aborted),
            fences: map(fences),
        }
    }

    /// Owner A's counts survive the trip over its command protocol unchanged.
    #[test]
    fn a_tally_reads_back_as_sent() {
        let t = tally(3, &[("abortable", 1), ("fatal", 1)], &[("generation", 1)]);
        assert_eq!(TxnTally::from_json(&t.to_json()), Some(t));
        assert_eq!(TxnTally::from_json(&json!({ "ok": true })), None);
    }

    /// A run's counts are the difference of two readings, and the line names only what happened.
    #[test]
    fn differences_and_lines() {
        let before = tally(2, &[("abortable", 1)], &[("generation", 1)]);
        let after = tally(
            5,
            &[("abortable", 1), ("fatal", 1)],
            &[("generation", 1), ("producer_epoch", 1)],
        );
        let run = after.since(&before);
        assert_eq!(run, tally(3, &[("fatal", 1)], &[("producer_epoch", 1)]));
        assert_eq!(
            run.line(),
            "3 committed, 1 failed (1 fatal); fences: 1 producer_epoch"
        );
        assert_eq!(TxnTally::default().line(), "no snapshot transactions");
        assert_eq!(tally(4, &[], &[]).line(), "4 committed, 0 failed");
    }

    /// The summary is plain text: nothing a pipe or a log file would show as escape codes.
    #[test]
    fn the_summary_is_plain_text() {
        let run = RunTally {
            here: Some(tally(2, &[], &[])),
            owner_a: None,
        };
        let text = summary(&[("run 1, fenced", &run)]);
        assert!(text.is_ascii() && !text.contains('\x1b'), "{text}");
        assert!(text.contains("owner A:        not recorded"), "{text}");
        assert!(
            text.contains("owners B and C: 2 committed, 0 failed"),
            "{text}"
        );
    }
}
