#!/usr/bin/env bash
# Installs the pinned OpenCode CLI into .tools/opencode (git-ignored) for the end-to-end tests.
# Idempotent: does nothing when the pinned version is present. The wrapper's postinstall only
# hard-links the platform binary (an ordinary registry package) over bin/opencode.exe.
set -euo pipefail
VERSION="1.18.33"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/opencode"
bin="$dest/node_modules/.bin/opencode"
if [ -x "$bin" ] && grep -q "\"version\": \"$VERSION\"" "$dest/node_modules/opencode-ai/package.json" 2>/dev/null; then
  echo "opencode $VERSION already installed at $bin"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not on PATH; it is needed to install opencode-ai@$VERSION" >&2
  echo "hint: install Node.js and npm (Debian: apt-get install -y nodejs npm), then re-run $0" >&2
  exit 1
fi
mkdir -p "$dest"
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "opencode-ai@$VERSION"
"$bin" --version
