#!/bin/sh
# Checks one story of the hello-files example: ./check.sh US-001 | US-002 | US-003 | all
# Exits 0 when the story's file has exactly the expected single line (a trailing newline is
# optional), 1 when it does not, 2 on bad usage.
set -u
cd "$(dirname "$0")" || exit 2

# expect FILE LINE: FILE holds exactly one line, LINE.
expect() {
  if [ ! -f "$1" ]; then
    echo "FAIL: $1 does not exist" >&2
    return 1
  fi
  # $(...) drops trailing newlines, so "hello world" and "hello world\n" both match.
  actual=$(cat "$1")
  if [ "$actual" != "$2" ]; then
    echo "FAIL: $1 should contain exactly the line '$2' but contains:" >&2
    cat "$1" >&2
    return 1
  fi
  echo "ok: $1"
}

story() {
  case "$1" in
    US-001) expect greeting.txt "hello world" ;;
    US-002) expect docs/author.txt "made by ralph" ;;
    US-003) expect status.txt "status: done" ;;
    all) story US-001 && story US-002 && story US-003 ;;
    *)
      echo "usage: $0 US-001|US-002|US-003|all" >&2
      exit 2
      ;;
  esac
}

story "${1:-}"
