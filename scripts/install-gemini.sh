#!/usr/bin/env bash
# Installs the pinned Gemini CLI into .tools/gemini (git-ignored) for the end-to-end tests.
# Idempotent: does nothing when the pinned version is present. The CLI is a node bundle
# (engines: node >= 20); npm skips the install scripts of its optional native helpers
# (node-pty, keytar), which headless runs do not need.
set -euo pipefail
VERSION="0.61.0"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/gemini"
bin="$dest/node_modules/.bin/gemini"
if [ -x "$bin" ] && grep -q "\"version\": \"$VERSION\"" "$dest/node_modules/@google/gemini-cli/package.json" 2>/dev/null; then
  echo "gemini $VERSION already installed at $bin"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not on PATH; it is needed to install @google/gemini-cli@$VERSION" >&2
  echo "hint: install Node.js (>= 20) and npm (Debian: apt-get install -y nodejs npm), then re-run $0" >&2
  exit 1
fi
mkdir -p "$dest"
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "@google/gemini-cli@$VERSION"
"$bin" --version
