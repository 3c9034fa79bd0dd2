#!/bin/sh
# P3: the agent appends "<parent's command name> <parent's VmRSS in KiB>" to $1, then reads the
# prompt to its end and exits 0, having changed nothing. ralph spawns the agent itself (no shell
# in between), so the parent is ralph; under the shell loop it is the loop's command-substitution
# subshell (a fork of the loop's bash). Shell builtins only, so nothing else is started.
read -r comm < "/proc/$PPID/comm"
rss=""
while read -r key value _; do
  if [ "$key" = "VmRSS:" ]; then rss="$value"; fi
done < "/proc/$PPID/status"
echo "$comm $rss" >> "$1"
exec cat >/dev/null
