#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ (cargo-fuzz, libFuzzer) for a short time each, starting from
# its kept corpus in fuzz/corpus/<target>/ (read only: what a run finds goes to a scratch
# directory that is removed afterwards). Fails on the first target that crashes, hangs or runs
# out of memory, and prints the reproducer (the input's path, its bytes in hex and the command
# that replays it).
#
# Build: with the nightly toolchain and cargo-fuzz where both are there or can be installed
# (`rustup toolchain install nightly`, `cargo install cargo-fuzz --locked`): coverage-guided,
# with AddressSanitizer. Where they cannot be had, the same libFuzzer binaries are built with
# the stable toolchain and the same coverage instrumentation (`-Cpasses=sancov-module`, stable
# flags), without AddressSanitizer (a sanitizer needs nightly's `-Zsanitizer`); the script
# says which it used.
#
# Environment: FUZZ_SECONDS (per target, default 20), FUZZ_JOBS (targets at once, default 2),
# FUZZ_TARGETS (space-separated subset, default all), FUZZ_MODE (`nightly`, `stable`, or
# unset: nightly when it can be had), FUZZ_SEED (libFuzzer's seed; default a new one per run,
# printed with a failure).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
mode=${FUZZ_MODE:-}
started=$(date +%s)

say() { printf '== fuzz: %s\n' "$*"; }

# Every [[bin]] of the fuzz crate is a target.
all_targets=$(awk '/^\[\[bin\]\]/{bin=1; next} bin && /^name *=/{gsub(/[" ]/,"",$0); sub(/name=/,"",$0); print; bin=0}' fuzz/Cargo.toml)
targets=${FUZZ_TARGETS:-$all_targets}

have_nightly() {
  cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal >/dev/null 2>&1
}
have_cargo_fuzz() {
  cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked >/dev/null 2>&1
}

if [ -z "$mode" ]; then
  if have_nightly && have_cargo_fuzz; then
    mode=nightly
  else
    mode=stable
    echo "WARNING: nightly or cargo-fuzz could not be had: fuzzing without AddressSanitizer (stable build)" >&2
  fi
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
case "$mode" in
  nightly)
    say "building the targets (cargo +nightly fuzz build, AddressSanitizer)"
    cargo +nightly fuzz build -O --fuzz-dir fuzz
    bindir=fuzz/target/$triple/release
    replay="cargo +nightly fuzz run -O"
    ;;
  stable)
    say "building the targets (stable toolchain, coverage instrumentation, no sanitizer)"
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
      cargo build --release --manifest-path fuzz/Cargo.toml --target "$triple" \
      --target-dir fuzz/target/stable --bins
    bindir=fuzz/target/stable/$triple/release
    replay="FUZZ_MODE=stable: $bindir/<target>"
    ;;
  *)
    echo "FUZZ_MODE must be nightly or stable, not $mode" >&2
    exit 2
    ;;
esac

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p fuzz/artifacts

# One target: its kept corpus, a scratch corpus, artifacts under fuzz/artifacts/<target>/.
run_one() {
  local t=$1
  local work=$scratch/$t
  mkdir -p "$work/corpus" "fuzz/artifacts/$t" "fuzz/corpus/$t"
  local extra=()
  # The mux's threads (pumps, answers) outlive each input by design; LeakSanitizer then counts
  # a thread's own bookkeeping, caught mid-exit, as a leak (seen: std's thread handle and
  # glibc's thread-exit list). Its leak check is off; every other check stays.
  [ "$t" = sshmux ] && extra+=(-detect_leaks=0)
  if "$bindir/$t" "$work/corpus" "fuzz/corpus/$t" "${extra[@]}" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 ${FUZZ_SEED:+-seed=$FUZZ_SEED} \
      -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1 >"$work/log" 2>&1; then
    printf '%-10s ok   %s\n' "$t" "$(grep -E '^stat::number_of_executed_units' "$work/log" | awk '{print $2 " runs"}')"
  else
    printf '%-10s FAIL\n' "$t"
    echo "--- $t: the end of libFuzzer's output ($(grep -m1 -oE 'Seed: [0-9]+' "$work/log"))"
    tail -n 40 "$work/log"
    local crash
    for crash in $(grep -oE "fuzz/artifacts/$t/[a-z-]+-[0-9a-f]+" "$work/log" | sort -u); do
      echo "--- reproducer: $crash ($(wc -c <"$crash") bytes), in hex:"
      od -An -tx1 -v "$crash" | head -n 32
      echo "--- replay it: $replay $t $crash"
    done
    return 1
  fi
}
export -f run_one
export scratch seconds bindir replay

say "running $(echo "$targets" | wc -w) targets, ${seconds} s each, $jobs at a time ($mode)"
if ! printf '%s\n' $targets | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}; then
  say "FAILED (the reproducers above are kept in fuzz/artifacts/)"
  exit 1
fi
say "all targets ran clean in $(($(date +%s) - started)) s"
