#!/bin/sh
# A stand-in for the `claude` CLI (P2): answers `--version` the way claude 2.1.332 does (ralph
# probes it before the run), otherwise reads the prompt on stdin to its end, as claude does, and
# prints the pre-generated stream-json file named by $FAKE_CLAUDE_STREAM (see ../gen_stream.py).
# Arguments other than --version are ignored (ralph passes `-p --output-format stream-json
# --verbose --dangerously-skip-permissions`; the shell loop passes `--dangerously-skip-permissions
# --print`, as the original does).
case "${1:-}" in
  --version) echo "2.1.332 (Claude Code)"; exit 0 ;;
esac
cat >/dev/null
exec cat "${FAKE_CLAUDE_STREAM:?FAKE_CLAUDE_STREAM names the stream-json file to print}"
