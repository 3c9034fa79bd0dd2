#!/usr/bin/env bash
# The action's run step: `ralph run` with the action's inputs (INPUT_* variables), SIGINT and
# SIGTERM passed on to ralph (a cancelled job: SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after
# that; ralph's shutdown timeout is 9 s under GitHub Actions). ralph itself writes the step's
# outputs ($GITHUB_OUTPUT) and summary ($GITHUB_STEP_SUMMARY); this script adds exit_code when
# ralph ended before it could, and artifact_name.
#
# The step fails with ralph's exit code, except 75 (resumable later: a usage limit, or work not
# pushed), which succeeds with a notice unless INPUT_FAIL_ON_RESUMABLE is true: the scheduled
# workflow resumes it.
set -uo pipefail
cd "${INPUT_WORKING_DIRECTORY:-.}" || exit 1
args=(run)
opt() { if [[ -n "${2:-}" ]]; then args+=("$1" "$2"); fi; }
opt --prd "${INPUT_PRD:-}"
opt --agent "${INPUT_AGENT:-}"
opt --max-iter "${INPUT_MAX_ITER:-}"
opt --max-duration "${INPUT_MAX_DURATION:-}"
opt --max-cost "${INPUT_MAX_COST:-}"
opt --shutdown-timeout "${INPUT_SHUTDOWN_TIMEOUT:-}"
case "${INPUT_PUSH:-}" in
  ""|false) ;;
  true) args+=(--push) ;;
  *) args+=(--push "$INPUT_PUSH") ;;
esac
if [[ "${INPUT_NO_WAIT:-false}" == true ]]; then args+=(--no-wait); fi
if [[ "${INPUT_RESUME_ONLY:-false}" == true ]]; then args+=(--resume-only); fi
if [[ -n "${INPUT_ARGS:-}" ]]; then
  # Split as a shell would (quotes and backslashes; no expansion, nothing is run): xargs does.
  if ! xargs -r printf '%s\0' <<<"$INPUT_ARGS" >/dev/null 2>&1; then
    echo "::error title=ralph::cannot split args as a shell would: $INPUT_ARGS (unbalanced quotes?)"
    exit 2
  fi
  extra=()
  mapfile -d '' -t extra < <(xargs -r printf '%s\0' <<<"$INPUT_ARGS")
  args+=("${extra[@]}")
fi
out="${GITHUB_OUTPUT:-/dev/null}"
before=0
if [[ -f "$out" ]]; then before="$(wc -l <"$out")"; fi

# Its own process group: the runner's signal reaches ralph once, through these traps.
set -m
"${RALPH_BIN:-ralph}" "${args[@]}" &
child=$!
trap 'kill -INT "$child" 2>/dev/null' INT
trap 'kill -TERM "$child" 2>/dev/null' TERM
rc=0
while true; do
  wait "$child"; rc=$?
  if ! kill -0 "$child" 2>/dev/null; then break; fi
done

if [[ "$out" != /dev/null ]] && ! tail -n "+$((before + 1))" "$out" 2>/dev/null | grep -q '^exit_code='; then
  echo "exit_code=$rc" >>"$out"
fi
prd="${INPUT_PRD:-prd.json}"
# ralph-<the PRD's folder, or its name without .json>-<attempt>; plain ralph-<attempt> for the
# repository's own prd.json.
case "$prd" in
  prd.json | ./prd.json) stem="" ;;
  */prd.json) stem="${prd%/prd.json}" ;;
  *) stem="${prd%.json}" ;;
esac
stem="${stem#./}"
name="ralph-${stem:+$(printf '%s' "$stem" | tr -c 'A-Za-z0-9._-' '-')-}${GITHUB_RUN_ATTEMPT:-1}"
echo "artifact_name=$name" >>"$out"
if [[ "$rc" == 75 && "${INPUT_FAIL_ON_RESUMABLE:-false}" != true ]]; then
  echo "::notice title=ralph::resumable later (exit 75): a usage limit or unpushed work; the next scheduled run resumes it"
  exit 0
fi
exit "$rc"
