#!/usr/bin/env bash
# Extra CI steps, run by .ci/run when this file is executable. One section per concern, each owned by the
# helper who wrote it; add a section rather than editing another's. Every section must pass on a fresh
# machine (it installs what it needs) and stay within CI's time budget.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each section's name and start, for the table printed when the script ends (as .ci/run does for its
# steps), so the one CI step that runs this script is broken down too.
section_names=()
section_starts=()
section() {
  local now
  now=$(date +%s)
  section_names+=("$*")
  section_starts+=("$now")
  echo; echo "--- $* ($(( now - start ))s)"
}
section_table() {
  local rc=$? end i next
  end=$(date +%s)
  echo
  echo "--- section times (exit $rc)"
  for i in "${!section_names[@]}"; do
    next=${section_starts[$((i + 1))]:-$end}
    printf '    %-76s %7d\n' "${section_names[$i]}" $(( next - section_starts[i] ))
  done
}
trap section_table EXIT

# ============================================================================================
# fuzz (records): build every cargo-fuzz target, then run each briefly from its committed seeds.
# Targets live in fuzz/fuzz_targets; fuzz/ is its own workspace. The frame-reader target belongs
# to the net layer: add it to fuzz/Cargo.toml and it is picked up here by `cargo fuzz list`.
# ============================================================================================
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
section "fuzz: toolchain"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
section "fuzz: build all targets"
(cd fuzz && cargo +nightly fuzz build)
for target in $(cd fuzz && cargo +nightly fuzz list); do
  section "fuzz: run $target for ${FUZZ_SECONDS}s"
  mkdir -p "fuzz/corpus/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("seeds/$target")
  (cd fuzz && cargo +nightly fuzz run "$target" "corpus/$target" "${seeds[@]}" -- \
     -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1)
done
# ======================================== end fuzz ==========================================

# ============================================================================================
# cli (static binary): the snapfence tool must build for x86_64-unknown-linux-musl as one
# statically linked executable (no ELF interpreter, no NEEDED libraries) that runs here.
# ============================================================================================
section "cli: musl target"
rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
  || rustup target add x86_64-unknown-linux-musl
section "cli: build the static binary"
cargo build --release --locked --target x86_64-unknown-linux-musl -p snapfence-cli
cli_bin="${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-musl/release/snapfence"
section "cli: check it is static"
file "$cli_bin"
if readelf -l "$cli_bin" | grep -q 'INTERP' || readelf -d "$cli_bin" | grep -q 'NEEDED'; then
  echo "snapfence is dynamically linked:" >&2
  readelf -d "$cli_bin" | grep NEEDED >&2 || true
  exit 1
fi
"$cli_bin" --version
cli_stripped=$(mktemp)
strip -o "$cli_stripped" "$cli_bin"
echo "snapfence static binary: $(stat -c %s "$cli_bin") bytes ($(stat -c %s "$cli_stripped") stripped)"
rm -f "$cli_stripped"
# ======================================== end cli ===========================================

# ============================================================================================
# security (tls): TLS is an opt-in feature (rustls with ring builds C), so the default
# `cargo test --workspace` skips it. Lint the feature build, then run the SSL, mutual-TLS and
# SASL_SSL tests against one fixture broker (about 10 s once built).
# ============================================================================================
section "security: clippy with --features tls"
cargo clippy -p snapfence -p protocol-tests -p snapfence-cli --all-targets --features tls -- -D warnings
section "security: TLS broker tests"
cargo test -p protocol-tests --features tls --test security -- tls::
# ======================================== end security ======================================

# ============================================================================================
# benches: benchmarks never run inside CI's pass/fail; CI only checks that they build.
# ============================================================================================
section "benches: build"
cargo bench --workspace --no-run
# The runner of scripts/bench.sh (in the workspace, pure Rust). Its peers in bench/peers (rust-rdkafka
# builds C) are a separate workspace that only scripts/bench.sh builds, never CI.
section "benches: build the benchmark runner"
cargo build --locked -p snapfence-bench
# ======================================== end benches =======================================

# ============================================================================================
# dependent (dep): the decoder's guarantees must hold in a crate that depends on snapfence,
# not only inside this workspace. dependent-check/ (outside the workspace) is built with
# snapfence by path and by git and answered hostile counts by a stub broker; then the package a
# release would upload must name the bounded-decoding kafka-protocol and rely on no [patch].
# ============================================================================================
section "dependent: no workspace-only [patch] left"
if grep -n '^\[patch' Cargo.toml fuzz/Cargo.toml; then
  echo "a [patch] never reaches a dependent; depend on the package instead (docs/fuzzing.md)" >&2
  exit 1
fi
section "dependent: hostile responses through a crate outside the workspace (path and git)"
scripts/check-dependent.sh
section "dependent: what cargo package -p snapfence would ship"
listed=$(cargo package -p snapfence --list --allow-dirty)
for f in Cargo.toml LICENSE README.md CHANGELOG.md src/lib.rs; do
  printf '%s\n' "$listed" | grep -qx "$f" || { echo "the package lacks $f" >&2; exit 1; }
done
# The lock would have to resolve snapfence-kafka-protocol from the registry, where it is not yet.
cargo package -p snapfence --no-verify --exclude-lockfile --allow-dirty
packaged=$(tar -xOzf "${CARGO_TARGET_DIR:-target}/package/snapfence-0.1.0.crate" snapfence-0.1.0/Cargo.toml)
printf '%s\n' "$packaged" | grep -qx 'package = "snapfence-kafka-protocol"' \
  || { echo "the packaged manifest does not depend on snapfence-kafka-protocol" >&2; exit 1; }
# A [patch], or a path left in a dependency table (target tables have paths of their own).
if printf '%s\n' "$packaged" | grep -n '^\[patch' \
   || printf '%s\n' "$packaged" | awk '/^\[/{dep = /dependencies/} dep && /^path = /{print; bad = 1} END{exit !bad}'; then
  echo "the packaged manifest relies on something only this workspace has" >&2
  exit 1
fi
section "dependent: the vendored decoder packages on its own"
cargo package --manifest-path vendor/kafka-protocol/Cargo.toml --list --allow-dirty >/dev/null
echo "snapfence-0.1.0.crate depends on snapfence-kafka-protocol $(printf '%s\n' "$packaged" \
  | sed -n '/^\[dependencies.kafka-protocol\]/,/^$/s/^version = //p')"
# ======================================== end dependent =====================================
