#!/bin/bash
# Measures plain send / MSG_ZEROCOPY / vmsplice+splice over TCP in three setups:
#   lo   : 127.0.0.1 in the current namespace
#   veth : netns zcA<pid> (10.213.7.1) <-> netns zcB<pid> (10.213.7.2), unshaped
#   tbf  : the same veth pair with tc tbf 2gbit on both ends
# for chunks of 64 KiB, 256 KiB and 1 MiB, each configuration REPS times.
#
# Usage: bench/zerocopy/run.sh [setups] [reps] [total_bytes]     (as root)
#   default: bench/zerocopy/run.sh "lo veth tbf" 3 4294967296
#
# Leaves nothing in the source tree: zc is built, and the raw per-run lines and
# the receiver's output are kept, in a mktemp -d directory removed on exit.
# The median tables (summarize.py) are printed and written to
# ../results/zerocopy-YYYY-MM-DD-HHMMSS.md (bench/results/).
set -u
cd "$(dirname "$0")" || exit 1
SETUPS=${1:-"lo veth tbf"}
REPS=${2:-3}
TOTAL=${3:-4294967296}
CHUNKS="65536 262144 1048576"
MODES="plain zc splice"
# Unique per run, so that concurrent runs do not clash: namespace names carry
# the shell's pid, and so does the port (below the ephemeral range; on lo it is
# shared with the rest of the machine, in the namespaces it is private).
NSA=zcA$$ NSB=zcB$$
PORT=$((20000 + $$ % 10000))

for setup in $SETUPS; do
  case $setup in
    lo|veth|tbf) ;;
    *) echo "bad setup '$setup' (lo, veth, tbf)" >&2; exit 2 ;;
  esac
done
case $REPS in ''|*[!0-9]*|0) echo "bad reps '$REPS'" >&2; exit 2 ;; esac
case $TOTAL in ''|*[!0-9]*|0) echo "bad total_bytes '$TOTAL'" >&2; exit 2 ;; esac
if [ "$(id -u)" != 0 ]; then
  echo "run.sh needs root (network namespaces, veth, tc)" >&2; exit 2
fi

TMP=$(mktemp -d -t zerocopy.XXXXXX) || exit 1
RPID=
cleanup() {
  [ -n "$RPID" ] && kill "$RPID" 2>/dev/null && wait "$RPID" 2>/dev/null
  ip netns del "$NSA" 2>/dev/null
  ip netns del "$NSB" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

RAW=$TMP/raw.txt
ZC=$TMP/zc
RECV_OUT=$TMP/recv.out
gcc -std=c11 -O2 -Wall -Wextra -o "$ZC" zc.c || exit 1

make_veth() { # veth|tbf
  ip netns add "$NSA" && ip netns add "$NSB" || exit 1
  ip link add zcva netns "$NSA" type veth peer name zcvb netns "$NSB" || exit 1
  ip -n "$NSA" addr add 10.213.7.1/24 dev zcva || exit 1
  ip -n "$NSB" addr add 10.213.7.2/24 dev zcvb || exit 1
  for n in "$NSA" "$NSB"; do ip -n "$n" link set lo up || exit 1; done
  ip -n "$NSA" link set zcva up && ip -n "$NSB" link set zcvb up || exit 1
  if [ "$1" = tbf ]; then
    ip netns exec "$NSA" tc qdisc add dev zcva root tbf rate 2gbit burst 256kb latency 50ms || exit 1
    ip netns exec "$NSB" tc qdisc add dev zcvb root tbf rate 2gbit burst 256kb latency 50ms || exit 1
  fi
}
del_veth() { ip netns del "$NSA"; ip netns del "$NSB"; }

# CPU seconds (utime+stime) of all ksoftirqd threads, and machine-wide busy
# seconds from /proc/stat (all CPUs, everything but idle+iowait).
HZ=$(getconf CLK_TCK)
ksoft() {
  local t=0 p s f
  for p in $(pgrep -x 'ksoftirqd/[0-9]+'); do
    s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    read -r -a f <<< "${s##*) }"   # f[0] is field 3 (state): utime, stime are f[11], f[12]
    t=$((t + f[11] + f[12]))
  done
  echo "$t"
}
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
softirq() { awk '/^cpu /{print $8}' /proc/stat; }   # tick-sampled, any context
secs() { awk -v a="$1" -v b="$2" -v hz="$HZ" 'BEGIN{print (b-a)/hz}'; }

run_one() { # setup chunk mode rep
  local setup=$1 chunk=$2 mode=$3 rep=$4 k0 b0 q0 k1 b1 q1 s r
  local -a rx tx
  if [ "$setup" = lo ]; then
    rx=("$ZC" recv 127.0.0.1 "$PORT"); tx=("$ZC" send 127.0.0.1 "$PORT")
  else
    rx=(ip netns exec "$NSB" "$ZC" recv 10.213.7.2 "$PORT")
    tx=(ip netns exec "$NSA" "$ZC" send 10.213.7.2 "$PORT")
  fi
  "${rx[@]}" > "$RECV_OUT" & RPID=$!
  k0=$(ksoft); b0=$(busy); q0=$(softirq)
  s=$("${tx[@]}" "$mode" "$chunk" "$TOTAL") || { echo "sender failed: $setup $mode $chunk" >&2; exit 1; }
  wait "$RPID" || { RPID=; echo "receiver failed: $setup $mode $chunk" >&2; exit 1; }
  RPID=
  k1=$(ksoft); b1=$(busy); q1=$(softirq)
  r=$(cat "$RECV_OUT")
  echo "setup=$setup rep=$rep $s | $r | ksoftirqd_s=$(secs "$k0" "$k1") machine_busy_s=$(secs "$b0" "$b1") softirq_s=$(secs "$q0" "$q1")" | tee -a "$RAW"
}

STAMP=$(date +%Y-%m-%d-%H%M%S)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "# $(date -Is) kernel=$(uname -r) total=$TOTAL" | tee -a "$RAW"
for setup in $SETUPS; do
  if [ "$setup" != lo ]; then make_veth "$setup"; fi
  for rep in $(seq 1 "$REPS"); do
    for chunk in $CHUNKS; do
      for mode in $MODES; do
        run_one "$setup" "$chunk" "$mode" "$rep"
      done
    done
  done
  if [ "$setup" != lo ]; then del_veth; fi
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

SUMMARY=$TMP/summary.md
{
  echo "# zerocopy: plain send vs MSG_ZEROCOPY vs vmsplice+splice, $STAMP"
  echo
  echo "- command: \`bench/zerocopy/run.sh \"$SETUPS\" $REPS $TOTAL\`"
  echo "- host: $(uname -n), kernel $(uname -r), $(nproc) CPUs ($(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)), CLK_TCK=$HZ"
  if REV=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- . 2>/dev/null || REV="$REV, bench/zerocopy modified"
    echo "- commit: $REV"
  fi
  echo "- load average: $LOAD0 at the start, $LOAD1 at the end"
  echo "- CPU = getrusage(RUSAGE_SELF) user+sys of each side over the transfer, per GiB; medians of $REPS (sender: median (min-max)); $TOTAL bytes per run"
  python3 summarize.py "$RAW" || exit 1
} > "$SUMMARY" || exit 1
mkdir -p ../results || exit 1
OUT=$(cd ../results && pwd)/zerocopy-$STAMP.md
cp "$SUMMARY" "$OUT" || exit 1
echo
cat "$OUT"
echo
echo "written: $OUT"
