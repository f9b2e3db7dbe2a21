#!/usr/bin/env bash
# Fails when the default (normal + build) dependency tree of the shipped crates contains a crate that
# compiles or links C: *-sys crates, cc, cmake, bindgen, pkg-config. protocol-tests is a test-only member.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree -e normal,build --prefix none -p snapfence -p snapfence-cli)
bad=$(printf '%s\n' "$tree" | grep -E '^([A-Za-z0-9_-]+-sys|cc|cmake|bindgen|pkg-config) v' | sort -u || true)
if [ -n "$bad" ]; then
  echo "C-building crates in the default dependency tree:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
echo "no-C check: $(printf '%s\n' "$tree" | sort -u | wc -l) crates, none build C"
# The `postgres` feature promises the same (tokio-postgres: no libpq, no OpenSSL).
pg_tree=$(cargo tree -e normal,build --prefix none -p snapfence --features postgres)
bad=$(printf '%s\n' "$pg_tree" | grep -E '^([A-Za-z0-9_-]+-sys|cc|cmake|bindgen|pkg-config) v' | sort -u || true)
if [ -n "$bad" ]; then
  echo "C-building crates under the postgres feature:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
echo "no-C check, --features postgres: $(printf '%s\n' "$pg_tree" | sort -u | wc -l) crates, none build C"
# And `aws-msk-iam`, which signs with the RustCrypto crates already in the tree.
iam_tree=$(cargo tree -e normal,build --prefix none -p snapfence --features aws-msk-iam)
bad=$(printf '%s\n' "$iam_tree" | grep -E '^([A-Za-z0-9_-]+-sys|cc|cmake|bindgen|pkg-config) v' | sort -u || true)
if [ -n "$bad" ]; then
  echo "C-building crates under the aws-msk-iam feature:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
echo "no-C check, --features aws-msk-iam: $(printf '%s\n' "$iam_tree" | sort -u | wc -l) crates, none build C"
