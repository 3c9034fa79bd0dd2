#!/usr/bin/env bash
# The action's first step: puts ralph on PATH for the later steps. A ralph already on PATH (the
# example workflow builds it once per workflow run) or already in $RUNNER_TEMP/ralph (restored
# by the action's cache step, keyed on ralph's sources) is used as it is; otherwise ralph is built
# from the action's own checkout with cargo (the runner's Rust toolchain) into $RUNNER_TEMP/ralph.
set -euo pipefail
src="${GITHUB_ACTION_PATH:-$(cd "$(dirname "$0")/../.." && pwd)}"
dest="${RUNNER_TEMP:-/tmp}/ralph"
if command -v ralph >/dev/null 2>&1; then
  echo "using $(command -v ralph): $(ralph --version)"
  exit 0
fi
if [[ -x "$dest/bin/ralph" ]]; then
  echo "$dest/bin" >>"${GITHUB_PATH:-/dev/null}"
  echo "using the cached $("$dest/bin/ralph" --version)"
  exit 0
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "::error title=ralph::cargo is not on PATH; add a Rust toolchain step before this action (e.g. dtolnay/rust-toolchain@stable), or put a built ralph on PATH"
  exit 1
fi
cargo install --locked --quiet --path "$src" --root "$dest" --bin ralph
echo "$dest/bin" >>"${GITHUB_PATH:-/dev/null}"
"$dest/bin/ralph" --version
