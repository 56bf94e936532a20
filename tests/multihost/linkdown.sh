#!/bin/sh
# linkdown.sh - a node whose link is taken down is named within
# KAITIAN_RUN_LOST_MS: two network-namespace hosts (tests/multihost/hosts.sh),
# one `kaitian run --nnodes 2` each, one sleeping rank each,
# KAITIAN_RUN_LOST_MS=5000. Node 1's cable is pulled (its bridge port down:
# its sockets see silence, no reset). Node 0's launcher must name node 1 with
# both signals (no heartbeat for the limit, and its host does not answer
# keep-alive probes), not before the limit and at most 1 s after it, and
# exit non-zero; nothing may remain in either namespace.
# Needs root; exits 77 (skipped) only where `ip netns add` fails.
# Args: KAITIAN_CLI
set -u
KT=${1:?usage: $0 KAITIAN_CLI}
[ -x "$KT" ] || { echo "FAIL: $KT is not executable" >&2; exit 1; }
KT=$(cd "$(dirname "$KT")" && pwd)/$(basename "$KT")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_linkdown.XXXXXX")
. "$(dirname "$0")/hosts.sh"
PORT=29400
LOST=5000

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}

hosts_up 2 "$TMP"
case $? in
  0) ;;
  77) echo "SKIP: $HOSTS_WHY"; rm -rf "$TMP"; exit 77 ;;
  *) trap 'hosts_down; rm -rf "$TMP"' EXIT; fail "setup: $HOSTS_WHY" ;;
esac
trap 'rc=$?; hosts_down || rc=1; rm -rf "$TMP"; exit $rc' EXIT
trap 'exit 130' INT TERM

secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
for k in 0 1; do
  hosts_exec $k env KAITIAN_JOB_SECRET="$secret" KAITIAN_RUN_LOST_MS=$LOST \
    "$KT" run -n 1 --nnodes 2 --node-rank $k --master "$HOSTS_NET.1:$PORT" --grace 1 sleep 60 \
    >"$TMP/n$k.out" 2>"$TMP/n$k.err" &
  eval "p$k=\$!"
done
# Both ranks running (a sleep in each namespace besides the launcher).
i=0
until [ "$(ip netns pids "$(hosts_ns 0)" | wc -l)" -ge 2 ] && [ "$(ip netns pids "$(hosts_ns 1)" | wc -l)" -ge 2 ]; do
  i=$((i + 1)); [ $i -gt 100 ] && fail "the job did not start"; sleep 0.1
done
sleep 1
t0=$(date +%s%3N)
hosts_link 1 down
while ! grep -q 'stopped answering' "$TMP/n0.err"; do
  [ $(($(date +%s%3N) - t0)) -lt $((LOST + 10000)) ] || break
  sleep 0.05
done
t1=$(date +%s%3N)
wait $p0; rc0=$?
line=$(grep -m1 'stopped answering' "$TMP/n0.err")
[ -n "$line" ] || fail "node 0 did not name node 1 within $((LOST + 10000)) ms"
echo "node 0 after $((t1 - t0)) ms: $line"
echo "$line" | grep -Eq "^kaitian run: node 1 \(host [^)]*\) stopped answering: it sent no heartbeat for [0-9.]+ s \(KAITIAN_RUN_LOST_MS=$LOST\) and its host does not answer either" ||
  fail "node 0's line does not give both signals"
[ $((t1 - t0)) -ge $((LOST - 300)) ] || fail "named after $((t1 - t0)) ms, before the limit ($LOST ms)"
[ $((t1 - t0)) -le $((LOST + 1000)) ] || fail "named after $((t1 - t0)) ms, more than 1 s past the limit ($LOST ms)"
[ "$rc0" != 0 ] || fail "node 0 exited 0"
# Node 1, cut off, ends too (it loses the store); then nothing may remain.
hosts_link 1 up
wait $p1
echo "node 1 exited $?: $(grep -m1 '^kaitian run' "$TMP/n1.err")"
left="$(hosts_pids 0)$(hosts_pids 1)"
[ -z "$left" ] || fail "processes left: $left"
echo "PASS linkdown"
