#!/usr/bin/env bash
# An exec agent for ralph: the prompt arrives on stdin, the working directory is the repository.
# Edit files, print what you did, exit non-zero on failure; ralph commits what is left.
set -euo pipefail
prompt="$(mktemp)"
trap 'rm -f "$prompt"' EXIT
cat >"$prompt"
aider --yes-always --no-auto-commits --message-file "$prompt"
