#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the HTML report's browser test (tests/it/
# report_browser.rs), unless a chromium is already on PATH (or RALPH_CHROMIUM names one).
# Needs root (or passwordless sudo) and the Debian package mirror.
set -euo pipefail
if [[ -n "${RALPH_CHROMIUM:-}" && -x "${RALPH_CHROMIUM}" ]] || command -v chromium >/dev/null 2>&1; then
  "${RALPH_CHROMIUM:-chromium}" --version 2>/dev/null || true
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then sudo="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
chromium --version
