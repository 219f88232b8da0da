#!/bin/bash
# The relay's own CPU per GiB of datagrams it forwards, apart from any path emulation: relay,
# receiver and sender in one private network namespace on its loopback (nothing leaves it), the
# sender kept off the direct path by an nft rule (it runs as `nobody`; everything it sends to
# another address than the relay's is dropped: no punched path either), so every data datagram
# goes through the relay's UDP port (`relay_udp_share` in the output: the sender's share of bytes
# sent there). The sender paces at RATE (`--rate`; `none` for unpaced), so the relay sees datagrams arrive as
# they do on a WAN path at that rate. Prints per run: goodput, the path, the relay's user and
# system CPU seconds per GiB (its /proc counters), and the namespace's UDP drop counters
# (nstat: where datagrams were lost, if any), and whether the file arrived intact.
#
#   sudo bash bench/relaycpu.sh [RUNS] [SIZE] [RATE...]   # defaults: 3 runs, 1G, 440M none
#   sudo HURTLE_BIN=/path/to/hurtle bash bench/relaycpu.sh
#
# Needs root, iproute2, nftables, nstat, and `cargo build --release -p hurtle` first.
set -eu
RUNS=${1:-3}
SIZE=${2:-1G}
shift 2 2>/dev/null || shift $#
RATES=("$@")
[ ${#RATES[@]} -gt 0 ] || RATES=(440M none)
REPO=$(cd "$(dirname "$0")/.." && pwd)
B=${HURTLE_BIN:-$REPO/target/release/hurtle}
NS=hrelaycpu$$
WORK=$(mktemp -d /dev/shm/hurtle-relaycpu.XXXXXX)
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
ip netns exec "$NS" nft -f - <<'NFT'
table inet hrc {
  chain out {
    type filter hook output priority 0;
    meta skuid 65534 ip daddr != 127.0.0.3 drop;
    meta skuid 65534 meta nfproto ipv6 drop;
  }
}
NFT
GIB=$(awk -v b="$(stat -c %s "$WORK/src.bin")" 'BEGIN { print b / 1073741824 }')
HZ=$(getconf CLK_TCK)

run() { # RATE
  local rate=$1 extra=()
  [ "$rate" != none ] && extra=(--rate "$rate")
  rm -rf "$WORK/out"
  ip netns exec "$NS" nstat -n >/dev/null
  ip netns exec "$NS" timeout 300 "$B" relay --listen 127.0.0.3:7432 --rate-per-address off 2>/dev/null & local relay=$!
  sleep 0.3
  ip netns exec "$NS" timeout 250 "$B" receive --relay 127.0.0.3:7432 --listen 127.0.0.2:0 \
    --out "$WORK/out" -q 2>"$WORK/rcv.err" & local recv=$!
  for _ in $(seq 1 50); do grep -q "code:" "$WORK/rcv.err" && break; sleep 0.1; done
  local code
  code=$(grep -o "code: [^ ]*" "$WORK/rcv.err" | cut -d' ' -f2)
  (cd "$WORK" && ip netns exec "$NS" timeout 200 runuser -u nobody -- "$B" send src.bin \
    --code "$code" --relay 127.0.0.3:7432 --json "${extra[@]}" 2>"$WORK/snd.err") \
    | python3 -c "import json,sys; d=json.load(sys.stdin); b=d['bytes_by_path']; print('rate=$rate', 'goodput_mbps=%.0f' % (d['goodput_bps']/1e6), 'path=%s' % d.get('path'), 'relay_udp_share=%.3f' % (b['relay_udp']/max(1,sum(b.values()))), 'resent=%.4f' % d['resent_share'], end=' ')" \
    || echo "rate=$rate failed: $(tail -1 "$WORK/snd.err")"
  wait "$recv" || true
  # The relay's CPU (user and system clock ticks of the hurtle process under `timeout`).
  local rpid
  rpid=$(pgrep -P "$relay" -f "relay --listen 127.0.0.3:7432" | head -1)
  awk -v hz="$HZ" -v g="$GIB" '{ printf "relay_user_s_per_gib=%.3f relay_sys_s_per_gib=%.3f relay_cpu_s_per_gib=%.3f ", $14 / hz / g, $15 / hz / g, ($14 + $15) / hz / g }' "/proc/$rpid/stat" 2>/dev/null || true
  kill "$relay" 2>/dev/null; wait "$relay" 2>/dev/null || true
  ip netns exec "$NS" nstat -z 2>/dev/null | awk '/Udp(InErrors|RcvbufErrors|SndbufErrors)/ { printf "%s=%s ", $1, $2 }'
  cmp -s "$WORK/src.bin" "$WORK/out/src.bin" && echo intact || echo "NOT INTACT"
}
for _ in $(seq 1 "$RUNS"); do for r in "${RATES[@]}"; do run "$r"; done; done
