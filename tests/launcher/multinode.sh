#!/bin/sh
# multinode.sh - two launchers on 127.0.0.1 as two nodes of one job: the
# environment contract across nodes (ranks of both meet in node 0's store), a
# failure on node 1 stops node 0 (non-zero, naming the rank), a missing
# KAITIAN_JOB_SECRET and mismatched --nnodes are clear errors, nodes may run
# different numbers of ranks, and the death of
# node 0's launcher stops node 1.
# Args: KAITIAN_CLI STORE_PROBE
. "$(dirname "$0")/lib.sh" "$@"
PROBE=${2:?store probe program}

unset KAITIAN_JOB_SECRET
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master 127.0.0.1:29400 true >"$TMP/s.out" 2>"$TMP/s.err"
expect_rc 2 $? "multi-node without KAITIAN_JOB_SECRET"
expect_grep 'export the same KAITIAN_JOB_SECRET on every node' "$TMP/s.err" "secret message"

export KAITIAN_JOB_SECRET="launcher-test-secret-$$"
export KAITIAN_CONNECT_TIMEOUT=20000
port=$(free_port)
[ -n "$port" ] || fail "no free port"
M="127.0.0.1:$port"

# 1. Environment across nodes. Node 1 starts first: it must wait for node 0.
"$KT" run -n 2 --nnodes 2 --node-rank 1 --master "$M" "$PROBE" >"$TMP/n1.out" 2>"$TMP/n1.err" &
p1=$!
sleep 0.3
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master "$M" "$PROBE" >"$TMP/n0.out" 2>"$TMP/n0.err" &
p0=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
expect_rc 0 $rc0 "node 0"
expect_rc 0 $rc1 "node 1"
cat "$TMP/n0.out" "$TMP/n1.out" >"$TMP/all.out"
for r in 0 1 2 3; do
  node=$((r / 2)); loc=$((r % 2))
  f="$TMP/n$node.out"
  line=$(grep "^\[$r\] PROBE " "$f") || fail "no PROBE line of rank $r on node $node"
  for kv in "rank=$r" "local=$loc" "world=4" "lws=2" "group=$node" "gws=2" "role=$r" "rws=4" \
            "maddr=127.0.0.1" "mport=$((port + 1))" "store=$M" "secret=$KAITIAN_JOB_SECRET" "met=4"; do
    echo "$line" | grep -q " $kv\( \|$\)" || fail "rank $r: expected $kv in: $line"
  done
done
[ "$(sed -n 's/.* job=\([^ ]*\).*/\1/p' "$TMP/all.out" | sort -u | wc -l)" = 1 ] || fail "job ids differ across nodes"
grep -Eq ' job=[0-9a-f]{16} ' "$TMP/all.out" || fail "bad job id"

# 2. Rank 3 (node 1) fails: node 1 exits 3 naming it, node 0 stops its ranks
# and exits non-zero naming rank 3 too.
port=$(free_port); M="127.0.0.1:$port"
cmd="if [ \$RANK = 3 ]; then sleep 0.5; exit 3; fi; exec $SLEEPER 1000"
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master "$M" --grace 1 sh -c "$cmd" >"$TMP/f0.out" 2>"$TMP/f0.err" &
p0=$!
"$KT" run -n 2 --nnodes 2 --node-rank 1 --master "$M" --grace 1 sh -c "$cmd" >"$TMP/f1.out" 2>"$TMP/f1.err" &
p1=$!
t0=$(now_ms)
wait $p1; rc1=$?
wait $p0; rc0=$?
t1=$(now_ms)
expect_rc 3 $rc1 "node 1 (rank 3 exits 3)"
expect_grep '^kaitian run: rank 3 \(pid [0-9]+\) exited with code 3$' "$TMP/f1.err" "node 1 names rank 3"
[ "$rc0" != 0 ] || fail "node 0 exited 0 although rank 3 failed"
expect_rc 3 $rc0 "node 0 (rank 3 failed on node 1)"
expect_grep 'rank 3 \(pid [0-9]+\) exited with code 3' "$TMP/f0.err" "node 0 names rank 3"
expect_grep 'node 1 failed' "$TMP/f0.err" "node 0 names node 1"
[ $((t1 - t0)) -lt 15000 ] || fail "nodes took $((t1 - t0)) ms to stop"
[ "$(count_marker)" = 0 ] || fail "ranks left: $(marker_pids)"

# 3. Mismatched --nnodes: node 1 refuses with a clear error; node 0, waiting
# for it to join, stops with that reason instead of waiting for the timeout.
port=$(free_port); M="127.0.0.1:$port"
t0=$(now_ms)
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master "$M" true >"$TMP/m0.out" 2>"$TMP/m0.err" &
p0=$!
"$KT" run -n 2 --nnodes 3 --node-rank 1 --master "$M" true >"$TMP/m1.out" 2>"$TMP/m1.err"
rc1=$?
wait $p0; rc0=$?
t1=$(now_ms)
expect_rc 1 $rc1 "node 1 with another --nnodes"
expect_grep 'node 0 runs with --nnodes 2 but node 1 with --nnodes 3' "$TMP/m1.err" "mismatch message"
[ "$rc0" != 0 ] || fail "node 0 exited 0 although node 1 could not join"
expect_grep 'node 0: the job failed before every node joined: node 1 .* could not join the job: node 0 runs with --nnodes 2' \
  "$TMP/m0.err" "node 0 gives node 1's reason"
[ $((t1 - t0)) -lt 10000 ] || fail "node 0 took $((t1 - t0)) ms to give up on node 1"

# 3a. Three nodes, node 2 with another --nnodes: nodes 0 and 1 both stop with
# node 2's reason (node 0 keeps the store up until node 1 has read it).
for attempt in 1 2 3; do
  port=$(free_port); M="127.0.0.1:$port"
  "$KT" run -n 1 --nnodes 3 --node-rank 0 --master "$M" true >"$TMP/t0.out" 2>"$TMP/t0.err" &
  p0=$!
  sleep 0.25 # node 1 polls half a slice after node 0: node 0 sees the failure first
  "$KT" run -n 1 --nnodes 3 --node-rank 1 --master "$M" true >"$TMP/t1.out" 2>"$TMP/t1.err" &
  p1=$!
  sleep 0.5
  "$KT" run -n 1 --nnodes 4 --node-rank 2 --master "$M" true >"$TMP/t2.out" 2>"$TMP/t2.err"
  rc2=$?
  wait $p0; rc0=$?
  wait $p1; rc1=$?
  expect_rc 1 $rc2 "node 2 with another --nnodes (attempt $attempt)"
  for k in 0 1; do
    eval "rc=\$rc$k"
    [ "$rc" != 0 ] || fail "node $k exited 0 although node 2 could not join"
    expect_grep "node $k: the job failed before every node joined: node 2 .* could not join the job: node 0 runs with --nnodes 3" \
      "$TMP/t$k.err" "node $k gives node 2's reason (attempt $attempt)"
  done
done

# 3b. Different -n per node: 2 ranks on node 0, 1 on node 1 (started first).
# Ranks are numbered node by node; the probe meets all 3 in the store, and a
# checked allreduce/allgather/sendrecv runs across both launchers.
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" "$PROBE" >"$TMP/u1.out" 2>"$TMP/u1.err" &
p1=$!
sleep 0.3
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master "$M" "$PROBE" >"$TMP/u0.out" 2>"$TMP/u0.err"
rc0=$?
wait $p1; rc1=$?
expect_rc 0 $rc0 "node 0 (-n 2)"
expect_rc 0 $rc1 "node 1 (-n 1)"
for spec in "0 0 0 2" "1 0 1 2" "2 1 0 1"; do
  set -- $spec
  line=$(grep "^\[$1\] PROBE " "$TMP/u$2.out") || fail "no PROBE line of rank $1 on node $2"
  for kv in "rank=$1" "local=$3" "world=3" "lws=$4" "group=$2" "gws=2" "rws=3" "met=3"; do
    echo "$line" | grep -q " $kv\( \|$\)" || fail "uneven nodes, rank $1: expected $kv in: $line"
  done
done
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" "$KT" bench -C allreduce,allgather,sendrecv -b 8 -e 1M -f 32 \
  -n 2 -w 0 -c 1 >"$TMP/b1.out" 2>"$TMP/b1.err" &
p1=$!
"$KT" run -n 2 --nnodes 2 --node-rank 0 --master "$M" "$KT" bench -C allreduce,allgather,sendrecv -b 8 -e 1M -f 32 \
  -n 2 -w 0 -c 1 >"$TMP/b0.out" 2>"$TMP/b0.err"
rc0=$?
wait $p1; rc1=$?
expect_rc 0 $rc0 "bench on node 0 (-n 2): $(tail -3 "$TMP/b0.err")"
expect_rc 0 $rc1 "bench on node 1 (-n 1): $(tail -3 "$TMP/b1.err")"
expect_grep '^\[0\] # ranks 3 ' "$TMP/b0.out" "the bench ran on 3 ranks"
grep -q '# wrong values: 0 OK' "$TMP/b0.out" || fail "uneven nodes: results not checked OK: $(tail -3 "$TMP/b0.out")"

# 4. Node 0's launcher dies: node 1 notices the store is gone and stops.
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" "$SLEEPER" 1000 >"$TMP/k0.out" 2>"$TMP/k0.err" &
p0=$!
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" --grace 1 "$SLEEPER" 1001 >"$TMP/k1.out" 2>"$TMP/k1.err" &
p1=$!
wait_marker 4 10 || fail "expected 2 launchers + 2 ranks, have $(count_marker)"
kill -9 $p0
wait $p0
wait $p1
expect_rc 1 $? "node 1 after node 0 died"
expect_grep 'node 1 lost the rendezvous store' "$TMP/k1.err" "store lost message"
wait_marker 0 5 || fail "ranks left after node 0 died: $(marker_pids)"
# 5. Node 1's launcher killed while its rank runs on (as when its host is cut
# off: its ranks' peers may not notice before KAITIAN_TIMEOUT): node 0 names
# node 1 at once, from its heartbeat connection closed (tests/launcher/
# liveness.sh times it, and the cases where node 0 must not name it).
port=$(free_port); M="127.0.0.1:$port"
"$KT" run -n 1 --nnodes 2 --node-rank 0 --master "$M" --grace 1 "$SLEEPER" 1000 >"$TMP/h0.out" 2>"$TMP/h0.err" &
p0=$!
"$KT" run -n 1 --nnodes 2 --node-rank 1 --master "$M" "$SLEEPER" 1001 >"$TMP/h1.out" 2>"$TMP/h1.err" &
p1=$!
wait_marker 4 10 || fail "expected 2 launchers + 2 ranks, have $(count_marker)"
t0=$(now_ms)
kill -9 $p1
wait $p1
wait $p0
rc0=$?
t1=$(now_ms)
[ "$rc0" != 0 ] || fail "node 0 exited 0 although node 1's launcher was killed"
expect_grep "node 1 \(host [^)]*\) stopped answering: its launcher's connection to node 0 closed" "$TMP/h0.err" \
  "node 0 names node 1"
[ $((t1 - t0)) -lt 10000 ] || fail "node 0 took $((t1 - t0)) ms to name node 1"
echo "lost node: node 0 exited $rc0 after $((t1 - t0)) ms: $(grep -m1 'stopped answering' "$TMP/h0.err")"
for p in $(marker_pids); do kill -9 "$p"; done # node 1's orphaned rank
wait_marker 0 5 || fail "ranks left: $(marker_pids)"
echo "PASS multinode"
