#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the pinned Claude Code CLI (needed by the
# end-to-end test), then builds and runs the whole suite in debug mode.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
./scripts/install-claude.sh
export RALPH_CLAUDE_BIN="$root/.tools/claude/node_modules/.bin/claude"
cargo test --features test-fakes "$@"
