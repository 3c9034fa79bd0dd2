#!/usr/bin/env bash
# The action's first step: builds ralph from the action's own checkout with cargo (the runner's
# Rust toolchain) into $RUNNER_TEMP/ralph and puts it on PATH for the later steps.
set -euo pipefail
src="${GITHUB_ACTION_PATH:-$(cd "$(dirname "$0")/../.." && pwd)}"
dest="${RUNNER_TEMP:-/tmp}/ralph"
if ! command -v cargo >/dev/null 2>&1; then
  echo "::error title=ralph::cargo is not on PATH; add a Rust toolchain step before this action (e.g. dtolnay/rust-toolchain@stable)"
  exit 1
fi
cargo install --locked --quiet --path "$src" --root "$dest" --bin ralph
echo "$dest/bin" >>"${GITHUB_PATH:-/dev/null}"
"$dest/bin/ralph" --version
