#!/usr/bin/env bash
# Builds dependent-check/ (a crate outside the workspace) twice, with snapfence as a path dependency and
# as a git dependency on the committed HEAD of this checkout, and runs each against its in-process stub
# broker under a virtual-memory limit. Fails if any hostile response is anything but a typed error, or if
# either build links crates.io's kafka-protocol into snapfence. See docs/fuzzing.md.
#
#   DEPENDENT_CHECK_VMEM_KIB   ulimit -v for the runs (default 3 GiB)
#   CARGO_TARGET_DIR           shared with the workspace by default, so unchanged dependencies are reused
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
vmem_kib=${DEPENDENT_CHECK_VMEM_KIB:-3145728}

# The dependent's tree: snapfence must decode with snapfence-kafka-protocol, wherever it comes from.
check_tree() {
  local manifest=$1 tree
  tree=$(cargo tree --manifest-path "$manifest" -e normal --prefix none -i snapfence-kafka-protocol)
  if ! printf '%s\n' "$tree" | grep -q '^snapfence v'; then
    echo "snapfence does not depend on snapfence-kafka-protocol in $manifest:" >&2
    printf '%s\n' "$tree" >&2
    exit 1
  fi
  if cargo tree --manifest-path "$manifest" -e normal --prefix none -i kafka-protocol@0.18.0 2>/dev/null \
      | grep -q '^snapfence v'; then
    echo "snapfence depends on crates.io's kafka-protocol in $manifest" >&2
    exit 1
  fi
}

run() {
  local label=$1 manifest=$2 bin
  shift 2
  echo "== dependent-check ($label) =="
  check_tree "$manifest"
  cargo build --manifest-path "$manifest" --quiet "$@"
  bin=$CARGO_TARGET_DIR/debug/snapfence-dependent-check
  # A subshell so the limit applies to the run only. An abort (an allocation failure) exits 134.
  ( ulimit -v "$vmem_kib"; timeout 300 "$bin" )
}

run path dependent-check/Cargo.toml --locked

# The git variant: the same program in a temporary crate whose snapfence comes from a file:// URL of
# this repository at HEAD (uncommitted changes are not in it, as they would not be for a user).
git_dir=$(git rev-parse --path-format=absolute --git-common-dir)
rev=$(git rev-parse HEAD)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
cp dependent-check/src/main.rs "$tmp/src/"
cp dependent-check/Cargo.lock "$tmp/"
sed -e "s|^snapfence = { path = \"..\"|snapfence = { git = \"file://$git_dir\", rev = \"$rev\"|" \
    -e "s|version = \"0.18.0\", path = \"../vendor/kafka-protocol\"|version = \"0.18.0\", git = \"file://$git_dir\", rev = \"$rev\"|" \
    dependent-check/Cargo.toml > "$tmp/Cargo.toml"
grep -q "^snapfence = { git = \"file://$git_dir\", rev = \"$rev\"" "$tmp/Cargo.toml"
if grep -q 'path = "\.\.' "$tmp/Cargo.toml"; then
  echo "the git variant still has a path dependency:" >&2
  cat "$tmp/Cargo.toml" >&2
  exit 1
fi
echo "git variant: snapfence from file://$git_dir at $rev"
# The copied lock keeps every registry version as committed; cargo swaps the two path entries for the
# git ones (so no --locked here).
run git "$tmp/Cargo.toml"
