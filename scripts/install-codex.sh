#!/usr/bin/env bash
# Installs the pinned OpenAI Codex CLI into .tools/codex (git-ignored) for the end-to-end tests.
# Idempotent: does nothing when the pinned version is present.
#
# The npm package is a small node launcher (bin/codex.js); the native binary comes from the
# platform package in its optionalDependencies (e.g. @openai/codex-linux-x64, an npm alias of
# @openai/codex@<version>-linux-x64), an ordinary registry package. No postinstall step.
set -euo pipefail
VERSION="0.171.0"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/codex"
bin="$dest/node_modules/.bin/codex"
if [ -x "$bin" ] && grep -q "\"version\": \"$VERSION\"" "$dest/node_modules/@openai/codex/package.json" 2>/dev/null \
  && "$bin" --version >/dev/null 2>&1; then
  echo "codex $VERSION already installed at $bin"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not on PATH; it is needed to install @openai/codex@$VERSION" >&2
  echo "hint: install Node.js and npm (Debian: apt-get install -y nodejs npm), then re-run $0" >&2
  exit 1
fi
mkdir -p "$dest"
# --include=optional: the native binary lives in an optional platform package, which an
# npm configured with omit=optional would otherwise skip.
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error --include=optional "@openai/codex@$VERSION"
"$bin" --version
