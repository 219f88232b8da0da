#!/usr/bin/env bash
# Builds a static hurtle binary for x86-64 Linux (the musl target), checks that it is static and
# runs, and prints its path: copy that one file to any x86-64 Linux host (scp, rsync, a package).
#
#   bash scripts/release.sh            # -> target/x86_64-unknown-linux-musl/release/hurtle
#
# Needs rustup (to add the musl target once) and musl's C compiler (Debian: musl-tools), for the
# parts of `ring` (the AEAD) written in C and assembly.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-musl
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  rustup target add "$target" >&2
fi
if ! command -v x86_64-linux-musl-gcc >/dev/null 2>&1 && ! command -v musl-gcc >/dev/null 2>&1; then
  echo "release.sh: musl's C compiler is missing (Debian/Ubuntu: apt-get install musl-tools)" >&2
  exit 1
fi
cargo build --release --locked --target "$target" -p hurtle >&2
bin="target/$target/release/hurtle"
# A static binary has no interpreter (no INTERP program header).
if readelf -l "$bin" 2>/dev/null | grep -q INTERP; then
  echo "release.sh: $bin is dynamically linked" >&2
  exit 1
fi
"$bin" --version >&2
echo "$PWD/$bin"
