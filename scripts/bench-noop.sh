#!/usr/bin/env bash
# A no-op iteration's cost: `ralph run` with an exec agent that does nothing (`true`), N
# iterations in a fresh tiny repository, for each ralph binary given, best of 3, side by side.
#   ./scripts/bench-noop.sh [-n N] [-s "off fs strict"] BIN [BIN...]
#     e.g. target/release/ralph /tmp/old/ralph
# `-s` runs each binary once per `--sandbox` mode (default: off only), a row each: the
# sandbox's cost per iteration is the difference to the `off` row.
# Prints, per binary, wall ms and CPU ms (user + system, ralph and its children) per iteration,
# best of 3, and each one's ratio to the first binary. CPU time is the steadier figure on a
# loaded machine.
set -euo pipefail
n=100
modes=(off)
while [[ "${1:-}" == -* ]]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    -s) read -ra modes <<< "$2"; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [-n N] RALPH_BIN [RALPH_BIN...]" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
one_run() {
  local bin mode="$2" dir="$work/repo"
  bin="$(realpath "$1")"  # the run starts in the repository
  local sandbox=()
  if [[ "$mode" != off ]]; then sandbox=(--sandbox "$mode"); fi
  rm -rf "$dir"; mkdir -p "$dir"
  cat > "$dir/prd.json" <<'JSON'
{"project": "bench", "branchName": "ralph/bench", "userStories": [
 {"id": "US-001", "title": "never passes", "description": "", "acceptanceCriteria": ["x"], "priority": 1, "passes": false}]}
JSON
  ( cd "$dir" && git init -q -b main && git add -A \
      && git -c user.name=b -c user.email=b@b commit -qm init )
  local start end cpu
  start=$(date +%s%N)
  cpu=$( cd "$dir" && GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b \
      /usr/bin/time -f '%U %S' "$bin" run --quiet --agent exec --agent-cmd true --max-iter "$n" "${sandbox[@]}" \
      --max-attempts 100000 --max-failures 100000 --max-no-progress 100000 2>&1 >/dev/null | tail -1 ) || true
  end=$(date +%s%N)
  echo "$(( (end - start) / n )) $(awk -v c="$cpu" -v n="$n" 'BEGIN{split(c,a," "); printf "%d", (a[1]+a[2])*1e9/n}')"
}
base_wall=""; base_cpu=""
printf '%-40s %12s %8s %12s %8s\n' binary "wall ms/it" ratio "cpu ms/it" ratio
for bin in "$@"; do
 for mode in "${modes[@]}"; do
  best_wall=""; best_cpu=""
  for _ in 1 2 3; do
    read -r wall cpu < <(one_run "$bin" "$mode")
    if [[ -z "$best_wall" || "$wall" -lt "$best_wall" ]]; then best_wall="$wall"; fi
    if [[ -z "$best_cpu" || "$cpu" -lt "$best_cpu" ]]; then best_cpu="$cpu"; fi
  done
  [[ -n "$base_wall" ]] || { base_wall="$best_wall"; base_cpu="$best_cpu"; }
  label="$bin"
  if [[ ${#modes[@]} -gt 1 || "${modes[0]}" != off ]]; then label="$bin [$mode]"; fi
  printf '%-40s %12.2f %7.2fx %12.2f %7.2fx\n' "$label" \
    "$(awk "BEGIN{print $best_wall/1e6}")" "$(awk "BEGIN{print $best_wall/$base_wall}")" \
    "$(awk "BEGIN{print $best_cpu/1e6}")" "$(awk "BEGIN{print $best_cpu/$base_cpu}")"
done
 done
