#!/usr/bin/env bash
# Installs the pinned Claude Code CLI into .tools/claude (git-ignored) for the
# end-to-end tests. Idempotent: does nothing when the pinned version is present.
set -euo pipefail
VERSION="2.1.332"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/claude"
bin="$dest/node_modules/.bin/claude"
if [ -x "$bin" ] && grep -q "\"version\": \"$VERSION\"" "$dest/node_modules/@anthropic-ai/claude-code/package.json" 2>/dev/null; then
  echo "claude $VERSION already installed at $bin"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not on PATH; it is needed to install @anthropic-ai/claude-code@$VERSION" >&2
  echo "hint: install Node.js and npm (Debian: apt-get install -y nodejs npm), then re-run $0" >&2
  exit 1
fi
mkdir -p "$dest"
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$VERSION"
"$bin" --version
