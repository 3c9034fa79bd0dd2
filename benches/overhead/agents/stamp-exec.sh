#!/bin/bash
# Start-up row: writes the time now ($EPOCHREALTIME, microseconds) to $1, then becomes the
# command in the remaining arguments (exec: the same process, no fork), so the time written is
# the time just before ralph, or the shell loop, was exec'd.
echo "$EPOCHREALTIME" > "$1"
shift
exec "$@"
