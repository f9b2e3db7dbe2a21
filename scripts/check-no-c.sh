#!/usr/bin/env bash
# Fails when the default (normal + build) dependency tree of the shipped crates contains a crate that
# compiles or links C: *-sys crates, cc, cmake, bindgen, pkg-config. protocol-tests is a test-only member.
# The opt-in features that promise the same are checked too: `postgres` (tokio-postgres: no libpq, no
# OpenSSL), `aws-msk-iam` (signs with the RustCrypto crates already in the tree) and `disk-state`
# (fjall, a pure-Rust LSM tree).
set -euo pipefail
cd "$(dirname "$0")/.."

# check NAME CARGO-TREE-ARGS...: the tree those arguments select must build no C.
check() {
  local name=$1
  shift
  local tree bad
  tree=$(cargo tree -e normal,build --prefix none "$@")
  # linux-raw-sys is the exception to the -sys rule: Linux's syscall numbers and structs as generated
  # Rust, with no build script and nothing to link (rustix's backend, under fjall's tempfile).
  bad=$(printf '%s\n' "$tree" | grep -E '^([A-Za-z0-9_-]+-sys|cc|cmake|bindgen|pkg-config) v' \
    | grep -vE '^linux-raw-sys v' | sort -u || true)
  if [ -n "$bad" ]; then
    echo "C-building crates in $name:" >&2
    printf '  %s\n' $bad >&2
    exit 1
  fi
  echo "no-C check, $name: $(printf '%s\n' "$tree" | sort -u | wc -l) crates, none build C"
}

check "the default dependency tree" -p snapfence -p snapfence-cli
check "--features postgres" -p snapfence --features postgres
check "--features aws-msk-iam" -p snapfence --features aws-msk-iam
check "--features disk-state" -p snapfence --features disk-state
