#!/usr/bin/env bash
# Where a group-committed transaction's time goes, from a trace of every round trip.
#
#   bash scripts/bench-trace.sh [RUNNER OPTIONS...]      e.g. --broker add.partitions.to.txn.retry.backoff.ms=1
#
# Runs experiment B's plain baseline and cap 256 for snapfence alone on a broker the runner starts, with
# `RUST_LOG=snapfence::net=trace` (one event per request: api key, bytes, microseconds), then sums up the
# Produce round trips: the first one after each EndTxn against all the others. Under transaction.version 2
# that first Produce enrols the partition in the next transaction, and the broker holds it until the
# previous transaction's markers are written (retrying every add.partitions.to.txn.retry.backoff.ms); a
# Produce that waits for nothing takes a few milliseconds. The difference is the broker's share of each
# transaction (docs/benchmarks.md, "Reading the figures").
#
# Environment: REPEAT (default 5), CARGO_TARGET_DIR, SNAPFENCE_KAFKA_JVM_OPTS (default -XX:+UseG1GC).
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
cargo build --release --locked -p snapfence-bench >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
RUST_LOG=snapfence::net=trace SNAPFENCE_BENCH_TRACE="$work/trace.log" \
  SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
  "$target/release/snapfence-bench" run --nodes 1 --rounds 1 --clients snapfence \
  --workloads b-base,b-256 --repeat "${REPEAT:-5}" "$@" --out "$work/table.md" 2>"$work/runner.log" \
  || { cat "$work/runner.log" >&2; exit 1; }
grep '^|' "$work/table.md"
echo
python3 - "$work/trace.log" <<'EOF'
import re, statistics, sys

first, other, ends = [], [], 0
after_end = False
for line in open(sys.argv[1], errors="replace"):
    if "round trip" not in line:
        continue
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    api, ms = int(fields.get("api_key", -1)), int(fields.get("micros", 0)) / 1000
    if api == 26:  # EndTxn
        ends += 1
        after_end = True
    elif api == 0:  # Produce
        (first if after_end else other).append(ms)
        after_end = False

def summary(xs):
    if not xs:
        return "none"
    xs = sorted(xs)
    return f"n={len(xs)} median {statistics.median(xs):.1f} ms, p90 {xs[int(0.9 * (len(xs) - 1))]:.1f} ms"

print(f"EndTxn round trips: {ends}")
print(f"first Produce after an EndTxn: {summary(first)}")
print(f"every other Produce:           {summary(other)}")
if first and other:
    print(f"broker wait per transaction (median difference): {statistics.median(first) - statistics.median(other):.1f} ms")
EOF
