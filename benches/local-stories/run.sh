#!/usr/bin/env bash
# Measures `ralph run --agent local` on twelve small one-file stories of the size a new user
# writes first (benches/local-stories/prd.json, on the tiny project in fixture/): per story,
# whether it passed (its `verify` is the judge), how many iterations it took and their wall time.
#
# Usage: benches/local-stories/run.sh [default|small] [DIR] [STORY_ID...]
#   default|small  the built-in model (--local-model); default: default
#   DIR            where to create the repository (must not exist or be empty); default: a new
#                  temporary directory. The table is also written to DIR/results.md.
#   STORY_ID...    only these stories (the others are marked passing before the run)
# Each story gets up to 3 iterations (--max-attempts 3); the run never stops early for failures.
# Run the two models one after the other, never at the same time: they share 2 CPU cores.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
model="${1:-default}"
case "$model" in default | small) ;; *) echo "usage: $0 [default|small] [DIR] [STORY_ID...]" >&2; exit 2 ;; esac
shift || true
repo="${1:-}"
shift || true

(cd "$root" && ./scripts/setup-local-model.sh "$model" >/dev/null && cargo build -q)
built="${CARGO_TARGET_DIR:-$root/target}/debug/ralph"

if [ -n "$repo" ] && [ -e "$repo" ] && [ -n "$(ls -A "$repo")" ]; then
  echo "error: $repo exists and is not empty" >&2
  exit 1
fi
[ -n "$repo" ] || repo="$(mktemp -d "${TMPDIR:-/tmp}/ralph-local-stories.XXXXXX")/tinyproj"
mkdir -p "$repo"
repo="$(cd "$repo" && pwd)"
# A copy of the binary (each iteration starts it again as `ralph __native-agent`), so a rebuild
# during a long measurement cannot change the code under test.
ralph="$repo.ralph"
cp "$built" "$ralph"
cp -R "$here/fixture/." "$repo/"
python3 - "$here/prd.json" "$repo/prd.json" "$@" <<'PY'
import json, sys
prd = json.load(open(sys.argv[1]))
only = set(sys.argv[3:])
for story in prd["userStories"]:
    if only and story["id"] not in only:
        story["passes"] = True
json.dump(prd, open(sys.argv[2], "w"), indent=2)
PY
git -C "$repo" init -q -b main
git -C "$repo" -c user.name=bench -c user.email=bench@example.invalid add -A
git -C "$repo" -c user.name=bench -c user.email=bench@example.invalid commit -qm "tinyproj"

echo "model: $model   repository: $repo   load: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$(date +%s)
set +e
(cd "$repo" && "$ralph" run --agent local --local-model "$model" --max-iter 40 --max-attempts 3 \
  --max-failures 40 --max-no-progress 40 --quiet)
code=$?
set -e
elapsed=$(($(date +%s) - started))

python3 - "$repo" "$model" "$code" "$elapsed" "$@" <<'PY' | tee "$repo/results.md"
import json, sys
repo, model, code, elapsed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
only = set(sys.argv[5:])
prd = json.load(open(f"{repo}/prd.json"))
ledger = [json.loads(l) for l in open(f"{repo}/.ralph/ledger.jsonl") if l.strip()]
print(f"| story | title | model | passed | iterations | wall time (s) | outcomes |")
print(f"|---|---|---|---|---|---|---|")
passed = total_iters = 0
counted = 0
for story in prd["userStories"]:
    if only and story["id"] not in only:
        continue
    counted += 1
    recs = [r for r in ledger if r.get("story_id") == story["id"]]
    wall = sum(r.get("duration_s") or 0 for r in recs)
    ok = story["passes"]
    passed += ok
    total_iters += len(recs)
    outcomes = ", ".join(r.get("outcome", "?") for r in recs)
    print(f"| {story['id']} | {story['title']} | {model} | {'yes' if ok else 'no'} | {len(recs)} | {wall:.0f} | {outcomes} |")
print()
print(f"{model}: {passed}/{counted} stories passed in {total_iters} iterations; run wall time {elapsed} s "
      f"(ralph exit code {code})")
PY
