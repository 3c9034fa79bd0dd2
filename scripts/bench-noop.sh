#!/usr/bin/env bash
# A no-op iteration's cost: `ralph run` with an exec agent that does nothing (`true`), N
# iterations in a fresh tiny repository, for each ralph binary given, best of 3, side by side.
#   ./scripts/bench-noop.sh [-n N] BIN [BIN...]     e.g. target/release/ralph /tmp/old/ralph
# Prints ms per iteration for each binary and the ratio to the first one.
set -euo pipefail
n=100
if [[ "${1:-}" == "-n" ]]; then n="$2"; shift 2; fi
[[ $# -ge 1 ]] || { echo "usage: $0 [-n N] RALPH_BIN [RALPH_BIN...]" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
one_run() {
  local bin="$1" dir="$work/repo"
  rm -rf "$dir"; mkdir -p "$dir"
  cat > "$dir/prd.json" <<'JSON'
{"project": "bench", "branchName": "ralph/bench", "userStories": [
 {"id": "US-001", "title": "never passes", "description": "", "acceptanceCriteria": ["x"], "priority": 1, "passes": false}]}
JSON
  ( cd "$dir" && git init -q -b main && git add -A \
      && git -c user.name=b -c user.email=b@b commit -qm init )
  local start end
  start=$(date +%s%N)
  ( cd "$dir" && GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b \
      "$bin" run --quiet --agent exec --agent-cmd true --max-iter "$n" --max-attempts 100000 \
      --max-failures 100000 --max-no-progress 100000 >/dev/null 2>&1 ) || true
  end=$(date +%s%N)
  echo $(( (end - start) / n ))
}
base=""
for bin in "$@"; do
  best=""
  for _ in 1 2 3; do
    ns=$(one_run "$bin")
    if [[ -z "$best" || "$ns" -lt "$best" ]]; then best="$ns"; fi
  done
  ms=$(awk "BEGIN{printf \"%.2f\", $best/1e6}")
  if [[ -z "$base" ]]; then base="$best"; ratio="1.00"; else ratio=$(awk "BEGIN{printf \"%.2f\", $best/$base}"); fi
  printf '%-40s %8s ms/iteration  %sx\n' "$bin" "$ms" "$ratio"
done
