#!/usr/bin/env bash
# The Python bindings' tests from a fresh clone: builds the wheel of crates/py with maturin (in
# a build venv), installs it into a fresh venv with pytest, and runs crates/py/tests there
# (with HURTLE_BIN, the debug build of the command, for the relay some tests start).
# Everything it makes is under target/python/. Needs python3 (with venv) and PyPI.
#
#   scripts/test-python.sh              # the tests, on a wheel built with the pytest profile (opt-level 1)
#   HURTLE_PY_PROFILE=release scripts/test-python.sh   # a release wheel (slow to build: LTO)
#   scripts/test-python.sh -k resume    # arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
root=target/python
profile=${HURTLE_PY_PROFILE:-pytest}
started=$(date +%s)

run() {
  printf '+ %s\n' "$*"
  "$@"
}

python3 -m venv --help >/dev/null 2>&1 || { echo "python3 with venv is required" >&2; exit 1; }

echo "== build venv with maturin ($root/build-venv)"
[ -x "$root/build-venv/bin/python" ] || run python3 -m venv "$root/build-venv"
run "$root/build-venv/bin/python" -m pip install -q --disable-pip-version-check 'maturin>=1.5,<2'

echo "== wheel (cargo profile $profile)"
rm -rf "$root/wheels"
run "$root/build-venv/bin/maturin" build --quiet -m crates/py/Cargo.toml --profile "$profile" \
  --interpreter python3 -o "$root/wheels"
wheel=$(ls "$root"/wheels/hurtle-*.whl)

echo "== the hurtle command (the tests start its relay)"
run cargo build --quiet -p hurtle --bin hurtle
export HURTLE_BIN="$PWD/${CARGO_TARGET_DIR:-target}/debug/hurtle"

echo "== a fresh venv with the wheel and pytest ($root/test-venv)"
rm -rf "$root/test-venv"
run python3 -m venv "$root/test-venv"
run "$root/test-venv/bin/python" -m pip install -q --disable-pip-version-check pytest "$wheel"

echo "== pytest crates/py/tests"
# Run from the tests' folder, so that `import hurtle` finds the installed wheel only.
(cd crates/py/tests && run "../../../$root/test-venv/bin/python" -m pytest -v -p no:cacheprovider "$@" .)
echo "== python tests done in $(( $(date +%s) - started )) s"
