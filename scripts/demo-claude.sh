#!/usr/bin/env bash
# Runs ralph's main job on the example project, offline and without an API key:
# `ralph run --agent claude --max-iter 6` over a fresh git copy of examples/textkit, with the
# real (pinned) Claude Code CLI talking to ralph-scripted-model, a local stand-in for the
# Anthropic API that follows examples/textkit/scenario.json.
#
# Usage: scripts/demo-claude.sh [DIR]
#   DIR  where to create the demo repository (must not exist or be empty);
#        default: a new temporary directory.
# Exits with ralph's exit code (0: every story passes; see README "Exit codes").
#
# The model server and ralph (and so claude) run in one process tree: the server's run mode
# (`ralph-scripted-model … -- ralph run …`) serves while ralph runs and stops when it ends.
# When `unshare -n` works, that tree gets its own network namespace with only a loopback
# interface, so nothing can leave the machine. See testing/README-model.md.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

./scripts/install-claude.sh
cargo build --features test-fakes --bins

target="${CARGO_TARGET_DIR:-$root/target}"
ralph="$target/debug/ralph"
model="$target/debug/ralph-scripted-model"
claude="$root/.tools/claude/node_modules/.bin/claude"
example="$root/examples/textkit"

if [ $# -ge 1 ] && [ -e "$1" ] && [ -n "$(ls -A "$1")" ]; then
  echo "error: $1 exists and is not empty; give a new or empty directory" >&2
  exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/ralph-demo.XXXXXX")"
if [ $# -ge 1 ]; then
  repo="$1"
  mkdir -p "$repo"
  repo="$(cd "$repo" && pwd)"
else
  repo="$work/textkit"
  mkdir -p "$repo"
fi
# claude's HOME and TMPDIR, and the model's request log: outside the repository, since the
# scripted agent commits with `git add -A`.
sandbox="$work/sandbox"
mkdir -p "$sandbox/home" "$sandbox/tmp"
model_log="$sandbox/model-log.jsonl"

# The example without the model's script, as a new repository with one commit.
cp -R "$example/." "$repo/"
rm -f "$repo/scenario.json"
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
git -C "$repo" init -q -b main
git -C "$repo" config user.name "ralph demo"
git -C "$repo" config user.email "ralph-demo@example.invalid"
git -C "$repo" add -A
git -C "$repo" commit -q -m "Initial commit: textkit example"

# A developer's own Claude or Anthropic settings must not reach this run.
while IFS= read -r name; do
  case "$name" in ANTHROPIC_* | CLAUDE*) unset "$name" ;; esac
done < <(compgen -e)
export HOME="$sandbox/home" TMPDIR="$sandbox/tmp"
export ANTHROPIC_API_KEY=dummy IS_SANDBOX=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_MAX_RETRIES=1 \
  PYTHONDONTWRITEBYTECODE=1
export RALPH_AGENT_PROGRAM="$claude"

cmd=("$model" --scenario "$example/scenario.json" --log "$model_log" --
  "$ralph" run --agent claude --max-iter 6 --keep-api-key)
netns=""
for flags in -n -rn; do
  if unshare "$flags" sh -c 'ip link set lo up' >/dev/null 2>&1; then
    netns="$flags"
    break
  fi
done
if [ -n "$netns" ]; then
  cmd=(unshare "$netns" sh -c 'ip link set lo up && exec "$@"' sh "${cmd[@]}")
else
  echo "note: unshare is not available; running without network isolation" >&2
fi

echo "==> ralph run in $repo"
set +e
(cd "$repo" && "${cmd[@]}")
code=$?
set -e

echo
echo "==> ralph status"
(cd "$repo" && "$ralph" status) || true
echo
echo "==> git log --oneline"
git -C "$repo" log --oneline
echo
echo "repository:        $repo"
echo "model request log: $model_log"
echo "ralph exit code:   $code"
exit "$code"
