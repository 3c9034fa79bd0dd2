#!/usr/bin/env bash
# Fuzzes ralph's parsers of untrusted input: every agent CLI's output stream (claude, codex,
# opencode, gemini, amp, cursor, exec) and the prd.json loader. Not part of the test suite or CI.
#
#   scripts/fuzz.sh [SECONDS=60] [TARGET...]
#
# Runs each target (default: all of `cargo fuzz list`) for SECONDS with libFuzzer and
# AddressSanitizer, starting from the seed corpus in fuzz/seeds/<target>; what it learns goes to
# fuzz/corpus/<target> and crashing inputs to fuzz/artifacts/<target>/ (both git-ignored).
# Replay one with `cd fuzz && cargo +nightly fuzz run <target> artifacts/<target>/<file>`.
#
# Needs cargo-fuzz (installed here with `cargo install cargo-fuzz --locked` if missing) and a
# nightly toolchain for its `-Z` flags. Without nightly (and when `rustup toolchain install
# nightly` cannot fetch it), the stable toolchain is used with RUSTC_BOOTSTRAP=1, which lets
# stable rustc accept those flags.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
    echo "usage: scripts/fuzz.sh [SECONDS=60] [TARGET...]" >&2
    exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
elif rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    echo "fuzz.sh: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
fi

cd "$root/fuzz"
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo ${toolchain[@]+"${toolchain[@]}"} fuzz list)
fi
cargo ${toolchain[@]+"${toolchain[@]}"} fuzz build

failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    echo "fuzz.sh: $target for ${seconds}s" >&2
    log="$(mktemp)"
    # -max_len: agent lines are long JSON; 64 KiB lets the fuzzer reach cut (oversize) lines.
    if cargo ${toolchain[@]+"${toolchain[@]}"} fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=ok
    else
        status=CRASH
        failed+=("$target")
        tail -n 60 "$log" >&2
    fi
    execs="$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')"
    echo "fuzz.sh: $target: $status, ${execs:-?} executions" >&2
    rm -f "$log"
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz.sh: no crash in ${#targets[@]} targets" >&2
