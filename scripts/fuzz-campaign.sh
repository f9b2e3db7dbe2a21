#!/usr/bin/env bash
# A fuzz campaign: every cargo-fuzz target in turn, one process at a time at nice 5, each with a memory
# limit, then one line of libFuzzer's final stats per run. docs/fuzzing.md records the campaign this
# reproduces. Usage:
#
#   scripts/fuzz-campaign.sh [OUT_DIR] [target:seconds[:max_len] ...]
#
# Defaults: OUT_DIR /tmp/fuzz-campaign, and the plan below. Corpora persist in OUT_DIR/corpus, so a
# second campaign continues where the first stopped. Crashes land in OUT_DIR/artifacts/<target>/; keep
# them under fuzz/regressions/<target>/ once fixed. Builds without a sanitizer (the library forbids
# unsafe code; the memory bound is enforced by -rss_limit_mb, by the abort an impossible allocation
# causes, and in `responses` by its counting allocator), which roughly doubles the execution rate.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/fuzz-campaign}
shift || true
plan=("$@")
if [ ${#plan[@]} -eq 0 ]; then
  plan=(responses:1440:512 consumer_protocol:840:512 sealed_batch:600:2048 frame_reader:420:512
        batch_decode:180:4096 fetch_response:180:4096)
fi
mkdir -p "$out/logs"
(cd fuzz && cargo +nightly fuzz build -O -s none)
bin_dir="${CARGO_TARGET_DIR:-fuzz/target}/x86_64-unknown-linux-gnu/release"
[ -d "$bin_dir" ] || bin_dir=fuzz/target/x86_64-unknown-linux-gnu/release
for step in "${plan[@]}"; do
  IFS=: read -r target seconds max_len <<<"$step"
  mkdir -p "$out/corpus/$target" "$out/artifacts/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  log="$out/logs/$target.$(date -u +%Y%m%dT%H%M%S).log"
  echo "$(date -u +%T) $target for ${seconds}s -> $log"
  nice -n 5 "$bin_dir/$target" "$out/corpus/$target" "${seeds[@]}" \
    -max_total_time="$seconds" -max_len="${max_len:-4096}" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$target/" >"$log" 2>&1 || echo "  $target stopped early: see $log"
done
total=0
for log in "$out"/logs/*.log; do
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  [ -n "$execs" ] || continue
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "$(basename "$log" .log): $execs executions, $rate/s"
  total=$((total + execs))
done
echo "total: $total executions"
