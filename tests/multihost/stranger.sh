#!/bin/sh
# stranger.sh - strangers stay out of the data mesh. Three network-namespace
# hosts (tests/multihost/hosts.sh): a job of 2 nodes x 1 rank runs
# `kaitian bench -c 1` (results checked) on nodes 0 and 1; a process on node
# 2, outside the job, connects to rank 0's data port while rank 0 waits for
# rank 1 (node 1's rank starts 3 s late) and sends a well-formed hello as rank 1
# twice: once with the token of old versions (FNV-1a of the store prefix "kt",
# which anyone could compute) and once with a random one. Each must be closed
# by rank 0 with exactly one WARN line naming the stranger's address and
# port; the job must end with exit 0 on both nodes and its results exact.
# Once the mesh is made the port is closed: a third try while the job runs
# collectives must be refused (or closed unanswered). A stranger at node 0's
# launcher's heartbeat port is closed too, and counted in its summary.
# Needs root; exits 77 (skipped) only where `ip netns add` fails.
# Args: KAITIAN_CLI
set -u
KT=${1:?usage: $0 KAITIAN_CLI}
[ -x "$KT" ] || { echo "FAIL: $KT is not executable" >&2; exit 1; }
KT=$(cd "$(dirname "$KT")" && pwd)/$(basename "$KT")
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_stranger.XXXXXX")
. "$(dirname "$0")/hosts.sh"
PORT=29400

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.out "$TMP"/*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 30 lines)" >&2
    tail -n 30 "$f" >&2
  done
  exit 1
}

hosts_up 3 "$TMP"
case $? in
  0) ;;
  77) echo "SKIP: $HOSTS_WHY"; rm -rf "$TMP"; exit 77 ;;
  *) trap 'hosts_down; rm -rf "$TMP"' EXIT; fail "setup: $HOSTS_WHY" ;;
esac
trap 'rc=$?; hosts_down || rc=1; rm -rf "$TMP"; exit $rc' EXIT
trap 'exit 130' INT TERM

# The stranger: connects to HOST:PORT, sends a hello as rank 1 (magic, kind
# data, rank 1, lane 0, a 16-byte token) and reports how it ended:
# "closed LOCALADDR:LOCALPORT" when rank 0 closed it (EOF or reset, without
# one byte back), "refused" when nothing listens, "open" when it stayed open
# for 20 s (a failure), "answered" when bytes came back (a failure).
cat >"$TMP/stranger.py" <<'EOF'
import os, socket, struct, sys
host, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "old":
    h = 1469598103934665603
    for ch in b"kt":
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    token = struct.pack("<Q", h) + bytes(8)
else:
    token = os.urandom(16)
hello = struct.pack("<IIiI", 0x4B544845, 1, 1, 0) + token
s = socket.socket()
s.settimeout(20)
try:
    s.connect((host, port))
except ConnectionRefusedError:
    print("refused"); sys.exit(0)
me = "%s:%d" % s.getsockname()
s.sendall(hello)
try:
    got = s.recv(1)
    print(("closed " + me) if not got else "answered")
except ConnectionResetError:
    print("closed " + me)
except socket.timeout:
    print("open")
EOF

N0=$(hosts_ns 0)
BENCH="$KT bench -C allreduce,allgather,broadcast -b 8 -e 1M -f 4 -n 200 -w 1 -c 1"
export KAITIAN_JOB_SECRET
KAITIAN_JOB_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
hosts_exec 0 "$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$HOSTS_NET.1:$PORT" $BENCH \
  >"$TMP/n0.out" 2>"$TMP/n0.err" &
p0=$!
hosts_exec 1 "$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$HOSTS_NET.1:$PORT" \
  sh -c "sleep 3; exec $BENCH" >"$TMP/n1.out" 2>"$TMP/n1.err" &
p1=$!

# Rank 0's data port: the socket node 0's rank (a process whose command line
# begins "kaitian bench"; the launcher's are the store's and its heartbeat
# port) listens on.
# listen_port WORD: the first port node 0's process WORD ("bench": the rank,
# "run": the launcher) listens on, other than the store's.
listen_port() {
  ip netns exec "$N0" ss -Hltnp 2>/dev/null | while read -r _ _ _ local _ users; do
    pid=$(echo "$users" | sed -n 's/.*pid=\([0-9]*\).*/\1/p')
    [ -n "$pid" ] && [ "${local##*:}" != "$PORT" ] || continue
    [ "$(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | awk '{print $2}')" = "$1" ] && echo "${local##*:}"
  done | head -n 1
}
rank_port() { listen_port bench; }
rport=""
i=0
while [ $i -lt 100 ] && [ -z "$rport" ]; do
  rport=$(rank_port)
  [ -n "$rport" ] || sleep 0.05
  i=$((i + 1))
done
[ -n "$rport" ] || fail "rank 0's data port never appeared on node 0"
echo "rank 0 listens on $HOSTS_NET.1:$rport"
# The launcher's heartbeat port takes strangers no better (counted at the end).
hport=$(listen_port run)
[ -n "$hport" ] || fail "node 0's launcher has no heartbeat port"
r_hb=$(hosts_exec 2 "$PY" "$TMP/stranger.py" "$HOSTS_NET.1" "$hport" random)
case "$r_hb" in "closed "*) ;; *) fail "stranger at the heartbeat port $hport: $r_hb" ;; esac
# Both at once: rank 0 reads hellos only once it has every address, after
# rank 1 started; both wait in its listen queue until then.
hosts_exec 2 "$PY" "$TMP/stranger.py" "$HOSTS_NET.1" "$rport" old >"$TMP/old.res" 2>&1 &
s1=$!
hosts_exec 2 "$PY" "$TMP/stranger.py" "$HOSTS_NET.1" "$rport" random >"$TMP/rnd.res" 2>&1 &
s2=$!
wait $s1 $s2
r_old=$(cat "$TMP/old.res")
r_rnd=$(cat "$TMP/rnd.res")
echo "stranger, old token: $r_old; random token: $r_rnd"
case "$r_old" in "closed $HOSTS_NET.3:"*) ;; *) fail "stranger with the old token: $r_old" ;; esac
case "$r_rnd" in "closed $HOSTS_NET.3:"*) ;; *) fail "stranger with a random token: $r_rnd" ;; esac
# While the collectives run (the mesh is made).
r_late=$(hosts_exec 2 "$PY" "$TMP/stranger.py" "$HOSTS_NET.1" "$rport" random)
running=no; kill -0 $p0 2>/dev/null && running=yes
echo "stranger, after the mesh was made: $r_late (job still running: $running)"
case "$r_late" in refused | "closed "*) ;; *) fail "stranger after the mesh was made: $r_late" ;; esac

wait $p0; rc0=$?
wait $p1; rc1=$?
[ $rc0 = 0 ] || fail "node 0 exited $rc0"
[ $rc1 = 0 ] || fail "node 1 exited $rc1"
grep -q '^\[0\] # wrong values: 0 OK' "$TMP/n0.out" || fail "bench results not checked OK"
for r in "$r_old" "$r_rnd"; do
  addr=${r#closed }
  n=$(grep -c "WARN.*closed a connection from $addr to communicator .*: wrong token; the job goes on" "$TMP/n0.err")
  [ "$n" = 1 ] || fail "expected one WARN line naming $addr on node 0, found $n"
  grep "closed a connection from $addr " "$TMP/n0.err"
done
grep -q "heartbeats of the other 1 nodes: .*; 1 connections refused" "$TMP/n0.err" ||
  fail "node 0's launcher does not count the stranger at its heartbeat port"
grep "heartbeats of the other" "$TMP/n0.err"
left="$(hosts_pids 0)$(hosts_pids 1)$(hosts_pids 2)"
[ -z "$left" ] || fail "processes left: $left"
echo "PASS stranger"
