#!/bin/bash
# Relayed against direct: one 1 GiB file, interleaved rounds, inside a private network namespace
# (its own loopback; nothing leaves it). For the relayed runs an nft rule in the namespace drops
# everything the sender sends to the receiver's address (the sender runs as `nobody`), so the
# session goes through the relay: its datagrams through the relay's UDP port (`relayed`), or
# parallel TCP through its splice (`relayed-tcp`, `--transport tcp`). Prints goodput per run, the
# relay's CPU seconds per GiB, and whether the file arrived intact.
#
#   sudo bash bench/relaybench.sh [PAIRS] [SIZE]      # defaults: 3 pairs, 1G
#   sudo HURTLE_BIN=/path/to/hurtle bash bench/relaybench.sh   # another build
#
# Needs root, iproute2, nftables, and `cargo build --release -p hurtle` first.
set -eu
PAIRS=${1:-3}
SIZE=${2:-1G}
REPO=$(cd "$(dirname "$0")/.." && pwd)
B=${HURTLE_BIN:-$REPO/target/release/hurtle}
NS=hrelaybench$$
WORK=$(mktemp -d /dev/shm/hurtle-relaybench.XXXXXX)
cleanup() {
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -x "$B" ] || { echo "build first: cargo build --release -p hurtle" >&2; exit 1; }
head -c "$SIZE" /dev/urandom > "$WORK/src.bin"
chmod 755 "$WORK"; chmod 644 "$WORK/src.bin"
ip netns add "$NS"
ip netns exec "$NS" ip link set lo up

run() { # direct|relayed|relayed-tcp
  local mode=$1 extra=()
  [ "$mode" = relayed-tcp ] && extra=(--transport tcp)
  if [ "$mode" != direct ]; then
    ip netns exec "$NS" nft -f - <<'NFT'
table inet hrb {
  chain out {
    type filter hook output priority 0;
    meta skuid 65534 ip daddr 127.0.0.2 drop;
  }
}
NFT
  fi
  rm -rf "$WORK/out"
  ip netns exec "$NS" timeout 300 "$B" relay --listen 127.0.0.3:7431 --rate-per-address off 2>/dev/null & local relay=$!
  sleep 0.3
  ip netns exec "$NS" timeout 250 "$B" receive --relay 127.0.0.3:7431 --listen 127.0.0.2:0 \
    --out "$WORK/out" -q 2>"$WORK/rcv.err" & local recv=$!
  for _ in $(seq 1 50); do grep -q "code:" "$WORK/rcv.err" && break; sleep 0.1; done
  local code
  code=$(grep -o "code: [^ ]*" "$WORK/rcv.err" | cut -d' ' -f2)
  (cd "$WORK" && ip netns exec "$NS" timeout 200 runuser -u nobody -- "$B" send src.bin \
    --code "$code" --relay 127.0.0.3:7431 --json "${extra[@]}" 2>"$WORK/snd.err") \
    | python3 -c "import json,sys; d=json.load(sys.stdin); print('$mode', 'goodput_mbps=%.0f' % (d['goodput_bps']/1e6), 'path=%s' % d.get('path'), 'transport=%s' % d['transport'], 'channels=%d' % d['channels'], end=' ')" \
    || echo "$mode failed: $(tail -1 "$WORK/snd.err")"
  wait "$recv" || true
  # The relay's CPU (user + system clock ticks of the hurtle process under `timeout`).
  local rpid ticks
  rpid=$(pgrep -P "$relay" -f "relay --listen 127.0.0.3:7431" | head -1)
  ticks=$(awk '{print $14 + $15}' "/proc/$rpid/stat" 2>/dev/null || echo 0)
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v g="$GIB" 'BEGIN { printf "relay_cpu_s_per_gib=%.2f ", t / hz / g }'
  kill "$relay" 2>/dev/null; wait "$relay" 2>/dev/null || true
  cmp -s "$WORK/src.bin" "$WORK/out/src.bin" && echo intact || echo "NOT INTACT"
  if [ "$mode" != direct ]; then ip netns exec "$NS" nft delete table inet hrb; fi
}
GIB=$(awk -v b="$(stat -c %s "$WORK/src.bin")" 'BEGIN { print b / 1073741824 }')
for _ in $(seq 1 "$PAIRS"); do run direct; run relayed; run relayed-tcp; done
