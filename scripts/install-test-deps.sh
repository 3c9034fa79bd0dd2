#!/usr/bin/env bash
# Installs the system programs the test suite runs, each only when it is missing (Debian
# packages, a few seconds): `man` for the man page test (man-db), `unshare`/`setsid` and `script`
# for the network namespace of the real-CLI tests, the process-tree tests and the pty of `ralph
# plan`'s questions (util-linux, bsdutils), `ip` to bring the namespace's loopback up (iproute2),
# git, python3 with venv (the local model's setup and the example projects' checks), and tmux
# (the real-terminal test of `ralph watch`).
# Needs root (or passwordless sudo) and the Debian package mirror when something is missing.
set -euo pipefail
# program → package
needs=(
  "man:man-db"
  "unshare:util-linux"
  "setsid:util-linux"
  "script:bsdutils"
  "ip:iproute2"
  "git:git"
  "python3:python3"
  "bash:bash"
  "bwrap:bubblewrap"
  "tmux:tmux"
)
missing=()
for pair in "${needs[@]}"; do
  program="${pair%%:*}"
  package="${pair#*:}"
  if ! command -v "$program" >/dev/null 2>&1 && [[ ! -x "/sbin/$program" && ! -x "/usr/sbin/$program" ]]; then
    missing+=("$package")
  fi
done
# The venv module is a package of its own on Debian.
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=("python3-venv")
fi
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "test dependencies: all present"
  exit 0
fi
# One package may cover several programs.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "test dependencies: installing ${missing[*]}"
sudo=""
if [[ "$(id -u)" != 0 ]]; then sudo="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for pair in "${needs[@]}"; do
  program="${pair%%:*}"
  if ! command -v "$program" >/dev/null 2>&1 && [[ ! -x "/sbin/$program" && ! -x "/usr/sbin/$program" ]]; then
    echo "test dependencies: \`$program\` is still missing after installing ${pair#*:}" >&2
    exit 1
  fi
done
