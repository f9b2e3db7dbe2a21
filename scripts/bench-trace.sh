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
# transaction (docs/benchmarks.md, "Reading the figures"). Last, per baseline run, the Produce requests'
# mean number in flight: near max_in_flight (5) the client is waiting on the broker.
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

# Who is waiting on whom in a burst without transactions (the baseline): per run (a child process,
# which starts with ApiVersions on correlation id 0), the Produce requests after the warm-up record,
# their mean number in flight (Little's law: the sum of round trips over the span they cover) and the
# span per request. A mean near the producer's max_in_flight (5) means the pipe is always full and
# the client waits on the broker; well below it, the broker waits on the client.
import datetime
runs, cur = [], None
for line in open(sys.argv[1], errors="replace"):
    if "round trip" not in line:
        continue
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    api, corr = int(fields.get("api_key", -1)), fields.get("correlation_id")
    if api == 18 and corr == "0":
        cur = {"produce": [], "txn": False}
        runs.append(cur)
    if cur is None:
        continue
    end = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
    if api == 26:
        cur["txn"] = True
    elif api == 0:
        cur["produce"].append((end - int(fields.get("micros", 0)) / 1e6, end))
print()
print("baseline runs (no EndTxn): Produce requests, mean in flight, span per request")
for i, r in enumerate(x for x in runs if not x["txn"] and len(x["produce"]) > 1):
    p = sorted(r["produce"])[1:]
    span = max(b for _, b in p) - min(a for a, _ in p)
    busy = sum(b - a for a, b in p)
    print(f"  run {i}: {len(p)} requests, {busy / span:.2f} in flight, {span * 1000 / len(p):.2f} ms each")
EOF
