#!/usr/bin/env bash
# ralph's overhead at the floor (issue 13), every row side by side with its baseline in the same
# run; prints one table (measure | ralph | baseline | ratio | goal | met?) and notes.
#   ./scripts/bench.sh [--quick] [--rows ROW,...] [--json FILE] [--dry-run] [RALPH_BIN]
# Without RALPH_BIN it builds target/release/ralph (cargo build --release --bin ralph).
# --quick (or RALPH_BENCH_QUICK=1): fewer iterations and 400 MB in place of 2 GB, a few minutes.
# --rows: P1, P2, P3, P4, P5, startup, scale (the issues' groups) or single rows p1, p1-big,
# p1-stale, p2, p2-2g, p3, p4, p5, startup, scale-status, scale-iter, scale-stop (100,000 stories, issue 18);
# case-insensitive. --dry-run: print what would run, exit.
# The driver is benches/overhead/bench.py; the baseline is
# benches/overhead/shell-loop.sh. Everything it makes (repositories, the 2 GB stream) lives in one
# mktemp directory, removed on exit. See README.md, "Benchmarks".
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d -t ralph-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
python3 "$root/benches/overhead/bench.py" --tmp "$work" "$@"
