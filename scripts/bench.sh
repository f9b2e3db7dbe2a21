#!/usr/bin/env bash
# The whole benchmark set in one command: builds the peers on demand (bench/peers, its own workspace, so the
# C in rust-rdkafka never reaches the library), builds the runner, runs every workload for every client on
# one broker and then on three nodes (two rounds each), then scale, stores and the whole job against Kafka
# Streams, then the CPU-only decode figures, and writes the markdown that docs/benchmarks.md quotes.
#
#   bash scripts/bench.sh [OUT]          (default OUT: $CARGO_TARGET_DIR/bench-results.md)
#
# Environment: BENCH_NODES (default "1,3"), BENCH_ROUNDS (default "2,1": two rounds on one node, one on
# three, whose round takes ~40 min), BENCH_REPEAT (default 5: runs per client of the ~100 ms rows, the
# median is reported), BENCH_ARGS (more runner options, e.g. "--clients snapfence,java"), BENCH_SCALE_ARGS (options of `snapfence-bench scale`, e.g. "--partitions 1,8,64"), BENCH_STORES_ARGS (options of
# `snapfence-bench stores`, e.g. "--keys 100 --waves 10"), BENCH_POOL (default 1; 0 skips the connections-per-broker
# rows of issue 35, ~5 min), BENCH_JOB (default 1; 0 skips the whole job against
# Kafka Streams, whose jars Maven fetches on first use), BENCH_JOB_ARGS (options of `snapfence-bench job`,
# default "--output --takeover"), BENCH_DISK (default 1; 0 skips the on-disk state at 10^7 keys, ~15 min and
# ~10 GB of disk), BENCH_DISK_ARGS (options of `snapfence-bench disk-scale`, e.g. "--keys 1000000"),
# DECODE_RUNS (default 15),
# BENCH_PEERS_TARGET (the peers' cargo target dir, default $CARGO_TARGET_DIR/bench-peers),
# SNAPFENCE_KAFKA_JVM_OPTS (broker JVM flags; default here "-XX:+UseG1GC", a full-speed JIT and collector,
# instead of the test fixture's fast-start flags).
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
out=$(realpath -m "${1:-$target/bench-results.md}")
peers_target=$(realpath -m "${BENCH_PEERS_TARGET:-$target/bench-peers}")
mkdir -p "$target" "$peers_target"
notes=()

echo "== peers: confluent-kafka (pure Rust) and rust-rdkafka (librdkafka, C, cmake-build)"
# librdkafka 2.12.1's cmake build includes curl/curl.h even with curl off (an #ifdef on a macro defined 0);
# only the header is needed, nothing links curl.
if [ ! -e /usr/include/curl/curl.h ] && [ ! -e /usr/include/x86_64-linux-gnu/curl/curl.h ] \
   && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq libcurl4-openssl-dev >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libcurl4-openssl-dev >/dev/null 2>&1; } || true
fi
lock_version() { grep -A1 "name = \"$1\"" bench/peers/Cargo.lock | sed -n 's/version = "\(.*\)"/\1/p'; }
build_peers() {
  (cd bench/peers && CARGO_TARGET_DIR="$peers_target" cargo build --release --locked --features "$1" \
     >"$peers_target/build-${1//,/-}.log" 2>&1)
}
confluent_note="confluent-kafka $(lock_version confluent-kafka): built from crates.io (default features off: gzip, snappy, lz4; plaintext)."
rdkafka_note="rust-rdkafka $(lock_version rdkafka) with librdkafka $(lock_version rdkafka-sys | sed 's/.*+//') (cmake-build, static; no zlib, zstd, SSL or SASL)."
if build_peers confluent,rdkafka; then
  notes+=("$confluent_note" "$rdkafka_note")
else
  rm -f "$peers_target/release/rdkafka-peer"
  notes+=("rust-rdkafka: did not build here (log: $peers_target/build-confluent-rdkafka.log).")
  if build_peers confluent; then
    notes+=("$confluent_note")
  else
    notes+=("confluent-kafka: did not build here (log: $peers_target/build-confluent.log).")
  fi
fi

echo "== runner"
cargo build --release --locked -p snapfence-bench
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
broker_runs=$(mktemp)
SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
  "$target/release/snapfence-bench" run --nodes "${BENCH_NODES:-1,3}" --rounds "${BENCH_ROUNDS:-2,1}" \
  --repeat "${BENCH_REPEAT:-5}" --peers "$peers_target/release" "${note_args[@]}" ${BENCH_ARGS:-} \
  --out "$broker_runs"

echo "== connections per broker (issue 35: B and B' against kafka-producer-perf-test and a connection per partition; 64 takeovers on three nodes)"
pool_runs=$(mktemp)
pool_scale=$(mktemp)
if [ "${BENCH_POOL:-1}" != 0 ]; then
  SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
    "$target/release/snapfence-bench" run --nodes 1,3 --rounds 1 --workloads b-base,b-spread --repeat 7 \
    --clients snapfence,java,confluent,rdkafka,perf-test --connections 2,4,16 --ceiling \
    --peers "$peers_target/release" --out "$pool_runs"
  SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
    "$target/release/snapfence-bench" scale --nodes 3 --partitions 64 --series 7 --connections 1,2,4 \
    --out "$pool_scale"
fi

echo "== scale (snapfence only: takeover of 1-1024 partitions, recovery of 10^4-10^6 keys)"
scale_runs=$(mktemp)
SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
  "$target/release/snapfence-bench" scale ${BENCH_SCALE_ARGS:-} --out "$scale_runs" --svg docs/scaling.svg

echo "== stores (a persist wave on the PostgreSQL store against the topic store)"
stores_runs=$(mktemp)
SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
  "$target/release/snapfence-bench" stores ${BENCH_STORES_ARGS:-} --out "$stores_runs"

disk_runs=$(mktemp)
if [ "${BENCH_DISK:-1}" != 0 ]; then
  echo "== disk-scale (issue 36: the on-disk state under a memory budget at 10^7 keys, against the in-memory state)"
  SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
    "$target/release/snapfence-bench" disk-scale ${BENCH_DISK_ARGS:-} --out "$disk_runs" --svg docs/disk-scale.svg
fi

job_runs=$(mktemp)
if [ "${BENCH_JOB:-1}" != 0 ]; then
  echo "== job (the whole count job against Kafka Streams 4.4: CPU, memory, output latency, takeover)"
  SNAPFENCE_KAFKA_JVM_OPTS=${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC} \
    "$target/release/snapfence-bench" job ${BENCH_JOB_ARGS:---output --takeover} --out "$job_runs"
fi

echo "== decode (CPU only)"
decode_runs=$(mktemp)
cargo bench --bench decode -- "${DECODE_RUNS:-15}" >"$decode_runs"

{
  echo "<!-- written by scripts/bench.sh on $(date -u '+%Y-%m-%d %H:%M UTC') -->"
  echo
  echo "Toolchain: $(rustc --version); $(java -version 2>&1 | head -1); broker JVM flags:" \
       "\`${SNAPFENCE_KAFKA_JVM_OPTS:--XX:+UseG1GC}\`."
  echo
  cat "$broker_runs"
  echo
  if [ -s "$pool_runs" ]; then
    echo "### Connections per broker (\`snapfence-bench run --connections 2,4,16 --ceiling\`, \`scale --series 7\`)"
    echo
    cat "$pool_runs"
    echo
    cat "$pool_scale"
    echo
  fi
  echo "### Scale (\`snapfence-bench scale\`; plot: docs/scaling.svg)"
  echo
  cat "$scale_runs"
  echo
  echo "### Stores (\`snapfence-bench stores\`)"
  echo
  cat "$stores_runs"
  echo
  if [ -s "$disk_runs" ]; then
    echo "### On-disk state (\`snapfence-bench disk-scale ${BENCH_DISK_ARGS:-}\`; plot: docs/disk-scale.svg)"
    echo
    cat "$disk_runs"
    echo
  fi
  if [ -s "$job_runs" ]; then
    echo "### The whole job against Kafka Streams (\`snapfence-bench job ${BENCH_JOB_ARGS:---output --takeover}\`)"
    echo
    cat "$job_runs"
    echo
  fi
  echo "### Decode (CPU only, \`cargo bench --bench decode -- ${DECODE_RUNS:-15}\`)"
  echo
  echo '```text'
  cat "$decode_runs"
  echo '```'
} >"$out"
rm -f "$broker_runs" "$pool_runs" "$pool_scale" "$scale_runs" "$stores_runs" "$disk_runs" "$job_runs" \
  "$decode_runs"
echo "wrote $out"
