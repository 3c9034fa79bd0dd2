#!/usr/bin/env bash
# The action's second step: installs the agent CLI that INPUT_AGENT names, at INPUT_AGENT_VERSION
# (default: the version ralph's tests pin, scripts/install-<agent>.sh), into
# $RUNNER_TEMP/agents, and puts it on PATH. Agents without a CLI (exec, native, local) need
# nothing here.
set -euo pipefail
agent="${INPUT_AGENT:-claude}"
version="${INPUT_AGENT_VERSION:-}"
case "$agent" in
  claude) pkg="@anthropic-ai/claude-code"; pinned="2.1.332" ;;
  codex) pkg="@openai/codex"; pinned="0.171.0" ;;
  gemini) pkg="@google/gemini-cli"; pinned="0.61.0" ;;
  opencode) pkg="opencode-ai"; pinned="1.18.33" ;;
  exec|native|local)
    echo "agent $agent: no CLI to install"
    exit 0
    ;;
  *)
    echo "::warning title=ralph::no installer for agent '$agent'; put its CLI on PATH before this action"
    exit 0
    ;;
esac
dest="${RUNNER_TEMP:-/tmp}/agents"
mkdir -p "$dest"
npm install --prefix "$dest" --no-audit --no-fund --loglevel=error "$pkg@${version:-$pinned}"
echo "$dest/node_modules/.bin" >>"${GITHUB_PATH:-/dev/null}"
echo "installed $pkg@${version:-$pinned}"
