#!/usr/bin/env bash
# One ralph run as a scheduler's job: clone the repository, `ralph run --push`, map the exit code.
# The container's entrypoint (deploy/docker/Dockerfile) and the Slurm array script
# (deploy/slurm/ralph-array.sbatch) both call it. docs/scale-out.md explains the contract.
#
# Which PRD (one of these):
#   RALPH_REPO, RALPH_PRD        the repository URL and prd.json's path inside it (default prd.json)
#   RALPH_PRD_LIST, index        a file with one "<repository URL> <prd path>" line per task; the
#                                task's line is RALPH_INDEX, else JOB_COMPLETION_INDEX (Kubernetes
#                                Indexed Job), else SLURM_ARRAY_TASK_ID (0-based)
# Optional:
#   RALPH_CLONE_REF              the branch to clone (default: the remote's default branch)
#   RALPH_WORKDIR                where the clone goes (default $TMPDIR or /tmp); a new directory
#                                per attempt, so a retried task always starts from the remote
#   RALPH_REMOTE                 the remote's name in the clone (default origin)
#   RALPH_TERMINATION_LOG        where a one-line result goes (default /dev/termination-log when it
#                                is writable: Kubernetes shows it as the pod's termination message)
#   RALPH_BIN                    the ralph program (default ralph on PATH)
#   RALPH_RESULT_FILE            where "rc=", "resume_at=" and "clone=" lines go at the end
#   RALPH_* (RALPH_AGENT, RALPH_MAX_ITER, RALPH_MAX_DURATION, RALPH_MAX_COST, ...) reach ralph itself;
#   extra arguments to this script are passed to `ralph run`.
#   Credentials: git's own (a mounted SSH key or credential helper), or RALPH_GIT_TOKEN for HTTPS
#   (the scopes it needs: docs/scale-out.md, "Credentials"; GitHub: Contents read and write).
#   Schedules set RALPH_RESUME_ONLY=1: a PRD whose last run is done or needs a human exits 0.
#
# Exit codes: ralph's own (README, "Exit codes"), so a scheduler can act on them:
#   0 complete · 1 needs a human · 2 usage · 3 --max-iter reached · 4 another limit · 5 another
#   worker holds the branch · 75 resumable later (resume_at in the termination message) · 130
#   interrupted (SIGTERM: its work is pushed, a retry resumes) · 1 also when the clone's
#   settings are wrong, 75 when the remote cannot be reached to clone.
set -uo pipefail

log() { echo "ralph-job: $*" >&2; }
ralph_bin="${RALPH_BIN:-ralph}"

index="${RALPH_INDEX:-${JOB_COMPLETION_INDEX:-${SLURM_ARRAY_TASK_ID:-}}}"
repo="${RALPH_REPO:-}"
prd="${RALPH_PRD:-prd.json}"
if [[ -n "${RALPH_PRD_LIST:-}" ]]; then
  if [[ -z "$index" ]]; then
    log "RALPH_PRD_LIST is set but no task index is (RALPH_INDEX, JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID)"
    exit 1
  fi
  if [[ ! -r "$RALPH_PRD_LIST" ]]; then
    log "cannot read RALPH_PRD_LIST=$RALPH_PRD_LIST"
    exit 1
  fi
  line="$(grep -v '^[[:space:]]*\(#\|$\)' "$RALPH_PRD_LIST" | sed -n "$((index + 1))p")"
  if [[ -z "$line" ]]; then
    log "$RALPH_PRD_LIST has no line for task $index (one '<repository URL> <prd path>' per task, 0-based)"
    exit 1
  fi
  read -r repo prd _ <<<"$line"
  prd="${prd:-prd.json}"
fi
if [[ -z "$repo" ]]; then
  log "no repository: set RALPH_REPO (and RALPH_PRD), or RALPH_PRD_LIST with a task index"
  exit 1
fi
export RALPH_PRD="$prd"

base="${RALPH_WORKDIR:-${TMPDIR:-/tmp}}"
mkdir -p "$base" || { log "cannot create RALPH_WORKDIR $base"; exit 1; }
dir="$(mktemp -d "$base/ralph-${index:-job}-XXXXXX")"
clone_args=(clone --quiet --no-tags --origin "${RALPH_REMOTE:-origin}")
if [[ -n "${RALPH_CLONE_REF:-}" ]]; then clone_args+=(--branch "$RALPH_CLONE_REF"); fi
token_helper=()
if [[ -n "${RALPH_GIT_TOKEN:-}" ]]; then
  # The token stays in the environment; git asks this helper for it (never on a command line).
  # shellcheck disable=SC2016 # expanded by the helper's shell, not here
  token_helper=(-c credential.helper= -c 'credential.helper=!f() { test "$1" = get && echo "username=${RALPH_GIT_USER:-x-access-token}" && echo "password=$RALPH_GIT_TOKEN"; }; f')
fi
if ! GIT_TERMINAL_PROMPT=0 git "${token_helper[@]}" "${clone_args[@]}" "$repo" "$dir" 2>"$dir.clone-err"; then
  log "cannot clone the repository: $(sed 's#://[^/@]*@#://<redacted>@#g' "$dir.clone-err" | tr '\n' ' ')"
  rm -rf "$dir" "$dir.clone-err"
  exit 75
fi
rm -f "$dir.clone-err"
cd "$dir" || exit 1
log "task ${index:-0}: $repo $prd in $dir"

# ralph gets the signals the scheduler sends this script (Kubernetes and Slurm signal the
# container's first process / the batch shell), and this script waits for it to finish its
# shutdown. ralph runs in a process group of its own (job control), so a signal sent to this
# script's whole group (a terminal's Ctrl-C) reaches it once, through the traps, not twice.
set -m
"$ralph_bin" run --push "${RALPH_REMOTE:-origin}" "$@" &
child=$!
trap 'kill -s TERM "$child" 2>/dev/null' TERM
trap 'kill -s INT "$child" 2>/dev/null' INT
trap 'kill -s HUP "$child" 2>/dev/null' HUP
rc=0
while true; do
  wait "$child"; rc=$?
  # A trap interrupts `wait` with 128+signal while ralph still runs: wait again.
  if ! kill -0 "$child" 2>/dev/null; then break; fi
done

# The PRD's books: .ralph/ for the repository's own prd.json, .ralph/books/<path>/ for any other.
case "$prd" in
  prd.json | ./prd.json) state="$dir/.ralph/state.json" ;;
  *) state="$dir/.ralph/books/${prd#./}/state.json" ;;
esac
resume_at=""
if [[ -f "$state" ]]; then
  resume_at="$(sed -n 's/.*"resume_at": *"\([^"]*\)".*/\1/p' "$state" | head -1)"
fi
case "$rc" in
  0) result="complete" ;;
  1) result="needs a human (see the log)" ;;
  2) result="usage error" ;;
  3) result="--max-iter reached with stories open" ;;
  4) result="stopped by a limit" ;;
  5) result="another worker holds the branch" ;;
  75) result="resumable later${resume_at:+ at $resume_at}" ;;
  130) result="interrupted; the work is pushed, a retry resumes" ;;
  *) result="ended with $rc" ;;
esac
termlog="${RALPH_TERMINATION_LOG:-/dev/termination-log}"
if [[ -n "$termlog" ]] && { [[ -w "$termlog" ]] || [[ -w "$(dirname "$termlog")" && ! -e "$termlog" ]]; }; then
  printf 'ralph exit %s: %s\n' "$rc" "$result" >"$termlog" 2>/dev/null || true
fi
if [[ -n "${RALPH_RESULT_FILE:-}" ]]; then
  printf 'rc=%s\nresume_at=%s\nclone=%s\n' "$rc" "$resume_at" "$dir" >"$RALPH_RESULT_FILE" 2>/dev/null || true
fi
log "exit $rc: $result"
exit "$rc"
