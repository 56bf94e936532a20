#!/bin/sh
# liveness.sh - `kaitian run` across nodes tells slow from gone (two
# launchers on 127.0.0.1 as two nodes; the heartbeat runs on a thread of its
# own, tools/kaitian/run_live.c):
#   1. KAITIAN_RUN_LOST_MS with a bad value (not a number, below 3000, above
#      a day, trailing characters): exit 2 and one line naming it;
#   2. node 1's launcher blocked writing its output (its stdout a pipe that
#      nobody reads for 8 s, KAITIAN_RUN_LOST_MS=3000): no node is declared
#      lost, both exit 0, node 0's longest heartbeat gap under the limit;
#   3. node 1's launcher blocked in a store call (its store connection goes
#      through a proxy that is stopped for 7 s): the same;
#   4. node 1's launcher stopped (SIGSTOP) for 6 s, its host answering: node 0
#      says it is slow, not gone, once, and the job ends with exit 0;
#   5. node 1's launcher killed (SIGKILL), KAITIAN_RUN_LOST_MS at its
#      default (30 s): node 0 names node 1 within 1 s and stops.
# (A link taken down: tests/multihost/linkdown.sh.)
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
export KAITIAN_JOB_SECRET="liveness-test-secret-$$"
export KAITIAN_CONNECT_TIMEOUT=20000

# 1. Bad values.
for v in abc 2999 100 86400001 5000x -1; do
  KAITIAN_RUN_LOST_MS=$v "$KT" run -n 1 --nnodes 2 --node-rank 0 --master 127.0.0.1:1 true >"$TMP/bad.out" 2>"$TMP/bad.err"
  expect_rc 2 $? "KAITIAN_RUN_LOST_MS=$v"
  [ "$(wc -l <"$TMP/bad.err")" = 1 ] || fail "KAITIAN_RUN_LOST_MS=$v: expected one line, got: $(cat "$TMP/bad.err")"
  expect_grep "^kaitian run: bad value '$v' for KAITIAN_RUN_LOST_MS \(milliseconds .*3000\.\.86400000\)$" "$TMP/bad.err" \
    "KAITIAN_RUN_LOST_MS=$v"
done
echo "bad values: $(cat "$TMP/bad.err")"

# gaps FILE: node 0's longest heartbeat gap in ms (from its summary line).
gaps() { sed -n 's/.*heartbeats of the other [0-9]* nodes: [0-9]* gaps, longest \([0-9]*\) ms.*/\1/p' "$1" | tail -n 1; }

# 2. Node 1's stdout blocked for 8 s (its rank writes 2 MB at once).
export KAITIAN_RUN_LOST_MS=3000
port=$(free_port); M="127.0.0.1:$port"
KAITIAN_DEBUG=INFO "$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" "$SLEEPER" 9 >"$TMP/o0.out" 2>"$TMP/o0.err" &
p0=$!
{ "$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" sh -c "yes hello | head -c 2000000; exec $SLEEPER 1" \
    2>"$TMP/o1.err"; echo $? >"$TMP/o1.rc"; } | { sleep 8; cat >/dev/null; } &
p1=$!
wait $p0; rc0=$?
wait $p1
expect_rc 0 $rc0 "node 0 while node 1's output was blocked"
expect_rc 0 "$(cat "$TMP/o1.rc")" "node 1 (its output blocked for 8 s)"
! grep -q 'stopped answering' "$TMP/o0.err" || fail "node 0 declared node 1 lost while its output was blocked"
g=$(gaps "$TMP/o0.err")
[ -n "$g" ] && [ "$g" -lt 3000 ] || fail "blocked output: longest heartbeat gap '$g' ms"
echo "blocked stdout: both exit 0, longest heartbeat gap $g ms"

# 3. Node 1's store calls stalled for 7 s: its store connection goes through
# a proxy that the test stops (SIGSTOP) and resumes.
port=$(free_port); M="127.0.0.1:$port"
pport=$(free_port)
cat >"$TMP/proxy.py" <<'EOF'
import socket, sys, threading
lport, dport = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", lport)); ls.listen(16)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
print("ready", flush=True)
while True:
    c, _ = ls.accept()
    u = socket.create_connection(("127.0.0.1", dport))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
EOF
setsid "$PY" "$TMP/proxy.py" "$pport" "$port" "$MARK" >"$TMP/proxy.out" 2>&1 &
pp=$!
i=0; until grep -q ready "$TMP/proxy.out" 2>/dev/null; do i=$((i + 1)); [ $i -gt 50 ] && fail "proxy did not start"; sleep 0.1; done
KAITIAN_DEBUG=INFO "$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" "$SLEEPER" 11 >"$TMP/s0.out" 2>"$TMP/s0.err" &
p0=$!
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "127.0.0.1:$pport" "$SLEEPER" 2 >"$TMP/s1.out" 2>"$TMP/s1.err" &
p1=$!
wait_marker 5 10 || fail "expected 2 launchers, 2 ranks and the proxy, have $(count_marker)"
sleep 0.5
kill -STOP $pp
sleep 7
kill -CONT $pp
wait $p1; rc1=$?
wait $p0; rc0=$?
kill $pp 2>/dev/null; wait $pp 2>/dev/null
expect_rc 0 $rc1 "node 1 (its store calls stalled for 7 s)"
expect_rc 0 $rc0 "node 0 while node 1's store calls stalled"
! grep -q 'stopped answering' "$TMP/s0.err" || fail "node 0 declared node 1 lost while its store calls stalled"
g=$(gaps "$TMP/s0.err")
[ -n "$g" ] && [ "$g" -lt 3000 ] || fail "stalled store: longest heartbeat gap '$g' ms"
echo "stalled store calls: both exit 0, longest heartbeat gap $g ms"

# 4. Node 1's launcher stopped for 6 s (slow, its host answers).
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" "$SLEEPER" 10 >"$TMP/t0.out" 2>"$TMP/t0.err" &
p0=$!
# In a session of its own: a stopped process in an orphaned process group
# (a test runner's session) would get SIGHUP from the kernel.
setsid "$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" "$SLEEPER" 4 >"$TMP/t1.out" 2>"$TMP/t1.err" &
p1=$!
wait_marker 4 10 || fail "expected 2 launchers + 2 ranks, have $(count_marker)"
kill -STOP $p1
sleep 6
kill -CONT $p1
wait $p1; rc1=$?
wait $p0; rc0=$?
expect_rc 0 $rc1 "node 1 (stopped for 6 s)"
expect_rc 0 $rc0 "node 0 while node 1's launcher was stopped"
[ "$(grep -c 'slow, not gone' "$TMP/t0.err")" = 1 ] || fail "node 0 should say once that node 1 is slow: $(cat "$TMP/t0.err")"
! grep -q 'stopped answering' "$TMP/t0.err" || fail "node 0 declared the stopped node 1 lost"
echo "stopped launcher: $(grep 'slow, not gone' "$TMP/t0.err")"

# 5. Node 1's launcher killed: named within 1 s at the default limit.
unset KAITIAN_RUN_LOST_MS
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" --grace 1 "$SLEEPER" 1000 >"$TMP/k0.out" 2>"$TMP/k0.err" &
p0=$!
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" "$SLEEPER" 1001 >"$TMP/k1.out" 2>"$TMP/k1.err" &
p1=$!
wait_marker 4 10 || fail "expected 2 launchers + 2 ranks, have $(count_marker)"
t0=$(now_ms)
kill -9 $p1
while ! grep -q 'stopped answering' "$TMP/k0.err"; do
  [ $(($(now_ms) - t0)) -lt 5000 ] || break
  sleep 0.02
done
t1=$(now_ms)
wait $p1
wait $p0; rc0=$?
[ "$rc0" != 0 ] || fail "node 0 exited 0 although node 1's launcher was killed"
expect_grep "^kaitian run: node 1 \(host [^)]*\) stopped answering: its launcher's connection to node 0 closed" \
  "$TMP/k0.err" "node 0 names node 1"
[ $((t1 - t0)) -le 1000 ] || fail "node 0 took $((t1 - t0)) ms to name node 1 (limit 1000)"
echo "killed launcher: named after $((t1 - t0)) ms: $(grep -m1 'stopped answering' "$TMP/k0.err")"
for p in $(marker_pids); do kill -9 "$p"; done # node 1's orphaned rank
wait_marker 0 5 || fail "ranks left: $(marker_pids)"
echo "PASS liveness"
