#!/bin/bash
# Parallel rows: an agent that takes a fixed time per story. Reads its prompt, finds its story
# (`Story ID: US-…`), sleeps $1 seconds (the agent's work), writes `story-<id>.txt`, marks the
# story passing in ./prd.json and commits. Used by `ralph run --parallel N`: each worker runs it
# in the story's own worktree.
set -e
prompt=$(cat)
story=$(printf '%s\n' "$prompt" | sed -n 's/^Story ID: //p' | head -n 1)
[ -n "$story" ] || { echo "no Story ID in the prompt" >&2; exit 1; }
sleep "${1:-0}"
echo "$story" > "story-$story.txt"
python3 - "$story" <<'PY'
import json, sys
with open("prd.json") as f:
    prd = json.load(f)
for s in prd["userStories"]:
    if s["id"] == sys.argv[1]:
        s["passes"] = True
with open("prd.json", "w") as f:
    json.dump(prd, f, indent=2)
    f.write("\n")
PY
git add -A >/dev/null
git commit -qm "feat: $story"
echo "$story done"
