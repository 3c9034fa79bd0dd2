#!/bin/bash
# The baseline ralph's overhead is measured against (issue 13): a shell loop with the shape of the
# original Ralph script (snarktank/ralph `ralph.sh`, main @ 6c53cb0; described in
# /work/shared/notes/original-ralph.md §2). Written for this project, not copied. Per run it does
# what the original does before its loop (archive check on a branchName change, .last-branch,
# progress.txt header), and per iteration what the original does:
#   - spawn the agent with the prompt file on stdin;
#   - capture stdout+stderr whole in a shell variable, echoing it live:
#       OUTPUT=$(agent < prompt 2>&1 | tee /dev/stderr) || true
#   - grep the captured output for <promise>COMPLETE</promise>; exit 0 when found;
#   - sleep between iterations (2 s in the original; SHELL_LOOP_SLEEP; the bench sets 0, which
#     skips the sleep process too: the pause is policy, not overhead).
# Exit 1 after MAX_ITERATIONS without the marker. Like the original, no git, no prd.json check.
#
#   shell-loop.sh [MAX_ITERATIONS] -- AGENT [ARGS...]
#
# Files are in the current directory (the original keeps them next to the script): prd.json,
# progress.txt, .last-branch, archive/, and the prompt, $SHELL_LOOP_PROMPT (default prompt.md).
# The bench runs it with stderr to /dev/null, so `tee /dev/stderr` costs what it costs on a
# terminal minus the terminal.
set -e

MAX_ITERATIONS=10
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; break ;;
    *) if [[ "$1" =~ ^[0-9]+$ ]]; then MAX_ITERATIONS="$1"; fi; shift ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [MAX_ITERATIONS] -- AGENT [ARGS...]" >&2; exit 1; }

DIR="$(pwd)"
PRD_FILE="$DIR/prd.json"
PROGRESS_FILE="$DIR/progress.txt"
ARCHIVE_DIR="$DIR/archive"
LAST_BRANCH_FILE="$DIR/.last-branch"
PROMPT_FILE="${SHELL_LOOP_PROMPT:-$DIR/prompt.md}"
SLEEP="${SHELL_LOOP_SLEEP:-2}"
# The one check the original lacks (its issue #92): without it a missing prompt would make every
# iteration a failed redirect, and the loop would look fast for doing nothing.
[ -f "$PROMPT_FILE" ] || { echo "Error: no prompt file $PROMPT_FILE" >&2; exit 2; }

# Archive the previous run when prd.json's branchName changed (as the original: jq, errors ignored).
if [ -f "$PRD_FILE" ] && [ -f "$LAST_BRANCH_FILE" ]; then
  CURRENT_BRANCH=$(jq -r '.branchName // empty' "$PRD_FILE" 2>/dev/null || echo "")
  LAST_BRANCH=$(cat "$LAST_BRANCH_FILE" 2>/dev/null || echo "")
  if [ -n "$CURRENT_BRANCH" ] && [ -n "$LAST_BRANCH" ] && [ "$CURRENT_BRANCH" != "$LAST_BRANCH" ]; then
    ARCHIVE_FOLDER="$ARCHIVE_DIR/$(date +%Y-%m-%d)-${LAST_BRANCH#ralph/}"
    echo "Archiving previous run: $LAST_BRANCH"
    mkdir -p "$ARCHIVE_FOLDER"
    cp "$PRD_FILE" "$ARCHIVE_FOLDER/"
    [ -f "$PROGRESS_FILE" ] && cp "$PROGRESS_FILE" "$ARCHIVE_FOLDER/"
    printf '# Ralph Progress Log\nStarted: %s\n---\n' "$(date)" > "$PROGRESS_FILE"
  fi
fi

# Remember the branch for the next start.
if [ -f "$PRD_FILE" ]; then
  CURRENT_BRANCH=$(jq -r '.branchName // empty' "$PRD_FILE" 2>/dev/null || echo "")
  if [ -n "$CURRENT_BRANCH" ]; then echo "$CURRENT_BRANCH" > "$LAST_BRANCH_FILE"; fi
fi

if [ ! -f "$PROGRESS_FILE" ]; then
  printf '# Ralph Progress Log\nStarted: %s\n---\n' "$(date)" > "$PROGRESS_FILE"
fi

echo "Starting Ralph - Tool: $1 - Max iterations: $MAX_ITERATIONS"

for i in $(seq 1 "$MAX_ITERATIONS"); do
  echo ""
  echo "Ralph Iteration $i of $MAX_ITERATIONS ($1)"

  OUTPUT=$("$@" < "$PROMPT_FILE" 2>&1 | tee /dev/stderr) || true

  if echo "$OUTPUT" | grep -q "<promise>COMPLETE</promise>"; then
    echo ""
    echo "Ralph completed all tasks!"
    echo "Completed at iteration $i of $MAX_ITERATIONS"
    exit 0
  fi

  echo "Iteration $i complete. Continuing..."
  if [ "$SLEEP" != 0 ]; then sleep "$SLEEP"; fi
done

echo ""
echo "Ralph reached max iterations ($MAX_ITERATIONS) without completing all tasks."
echo "Check $PROGRESS_FILE for status."
exit 1
