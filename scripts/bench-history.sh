#!/usr/bin/env bash
# The readers of history on a long night: `ralph log` over a 10,000-record ledger (10 runs of
# 1,000 iterations) next to `git log -n 10000 --format=%H` on the same 10,000-commit repository,
# and `ralph report` of the latest 1,000-iteration run (diffs embedded for its newest 300).
#   ./scripts/bench-history.sh [RALPH_BIN]      (default: target/release/ralph, built if missing)
# Goals (issue 12): log within 2x of that git log; report under 1 s. Prints best-of-N wall times.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/release/ralph}"
if [[ ! -x "$bin" ]]; then (cd "$root" && cargo build --release --bin ralph); fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"   # it is run from the repository below
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
repo="$work/repo"
# The shared generator (benches/overhead/gen_history.py, also used by scripts/bench.sh): 10 runs of
# 1,000 ralph commits in one pack and the matching ledger; prd.json written, not committed.
python3 "$root/benches/overhead/gen_history.py" "$repo"
cd "$repo"
best() { # best wall time in ms of N runs of the command
  local n="$1"; shift; local b=""
  for _ in $(seq "$n"); do
    local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N)
    local ms=$(( (e - s) / 1000000 )); if [[ -z "$b" || "$ms" -lt "$b" ]]; then b="$ms"; fi
  done; echo "$b"; }
gitlog=$(best 5 git log -n 10000 --format=%H)
log=$(best 5 "$bin" log --no-pager)
report=$(best 3 "$bin" report)
lines=$("$bin" log --no-pager | wc -l)
size=$(stat -c %s .ralph/report.html)
printf '%-44s %8s ms\n' "git log -n 10000 --format=%H" "$gitlog"
printf '%-44s %8s ms   %sx git log (goal <= 2x), %s lines\n' "ralph log (10,000 records)" "$log" "$(awk "BEGIN{printf \"%.2f\", $log/($gitlog>0?$gitlog:1)}")" "$lines"
printf '%-44s %8s ms   (goal < 1000 ms), %s KiB\n' "ralph report (latest run, 1,000 iterations)" "$report" "$(( size / 1024 ))"
