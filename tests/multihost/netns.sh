#!/bin/sh
# netns.sh - multi-host test on one machine: three network namespaces (four in
# MODE hier)
# ("nodes", each with its own host name) joined by veth pairs to a bridge in a
# fourth namespace, one link delayed with netem where the kernel has it. In
# each node `kaitian run -n 2 --nnodes N --node-rank K --master 10.X.Y.1:PORT`
# runs, with one shared KAITIAN_JOB_SECRET.
# MODE jobs (PROGRAM: coll_test, optional):
#   1. kaitian bench -c 1 -b 8 -e 1M on 3 nodes, every collective, 0 wrong;
#   2. coll_test on 3 nodes x 2 ranks (--quick) and on 2 nodes x 2 ranks (every
#      case of allreduce, reduce_scatter, allgather(v)), where every
#      collective that has one runs its hierarchical algorithm (shared memory
#      in each node, TCP between them; mode hier tests them all); again with
#      KAITIAN_TRANSPORT=tcp (TCP only; 3 connections per pair of nodes, so
#      messages of 4 units and a few bytes stripe unevenly), and on a
#      communicator split off 3 nodes x 2 ranks without rank 5 (nodes of 2,
#      2 and 1 ranks: the hierarchy with one shard), and every case of
#      allreduce on nodes of 3 and 2 ranks (the hierarchy with two shards and
#      a rank that has none) (when built);
#   3. 2 nodes with KAITIAN_SOCKET_IFNAME set to the veth name (bench);
#   4. 2 nodes with KAITIAN_SOCKET_IFNAME naming no interface: every launcher
#      must fail, quickly, with a message naming the variable.
#   Every launcher must exit 0 in 1-3.
# MODE kill (PROGRAM: fault_prog): a rank of node 2 is killed by SIGKILL in
#   the middle of allreduces of 4 MiB (in segments; the SIGSTOP case too, the
#   whole host lost below without, so both paths are covered whatever the
#   link probe reads): every launcher must exit non-zero naming it, and
#   every survivor must report KT_ERR_PEER_FAILED naming the dead rank; a
#   rank of node 1 that is not its host's inter-host rank is stopped (SIGSTOP)
#   on 2 nodes x 2 ranks: every other rank must time out naming it; then on
#   2 nodes x 2 ranks, every rank must get an error naming another rank within
#   5 s (fault_prog mismatch) when rank 1 allreduces with AVG and the others
#   with SUM (kind=avg), and when rank 1 calls broadcast while the others call
#   the hierarchical allreduce, from root 0 (kind=bcast) and from root 1
#   (kind=bcastroot1: rank 1's broadcast may complete and it waits in its
#   next op), the broadcast hierarchical (the shared-memory phases catch it)
#   and forced flat (binomial: no message of either side ever reaches the
#   other; the ranks' status notices must catch it); and, with no mismatch,
#   every operation must succeed when the ranks are late to it in turn by
#   2.5 s (fault_prog late); and on 3 nodes x 1 rank, rank 2 killed while
#   it streams its link probe to rank 0 (node 2's way out shaped to 24
#   Mbit/s): ranks 0 and 1 must fail their communicator's creation naming
#   rank 2's link within 10 s.
# MODE hetero (PROGRAM: tests/python/test_hetero.py; needs $PYTHON with torch
#   and torch_kaitian importable): heterogeneous data parallelism across hosts,
#   nodes of 3 and 2 ranks (each node its own plan, --devices cpu:3 / cpu:2):
#   HeteroSampler + HeteroDDP with capabilities 1:2:5:1:3 and no_sync
#   accumulation end with the parameters of one process (float64, 1e-10),
#   over kaitian (hierarchical) and gloo; and test_zero.py check on 2 nodes x
#   2 ranks, where shard_group='node' shards inside each node.
# MODE hier (PROGRAM: coll_test): the hierarchical algorithms of allreduce,
#   broadcast, reduce, allgather(v), reduce_scatter and barrier against
#   coll_test's reference, on nodes of 2+2, 2+2+2, 3+2 and 2+2+1 ranks, each
#   time on a communicator whose ranks of one node are not consecutive and
#   whose cross-node groups are not in node order (coll_test --order), any
#   root (0 and size-1: a node's extra rank, or a rank alone on its node):
#   with the tuner's picks, where rank 0's INFO log must show each of them
#   run 'hierarchical' (on 3+2 also with tiny shared-memory regions, ring
#   segments and chunks; allreduce, broadcast and allgather(v) on 3+2,
#   2+2+1 and 2+2, and reduce_scatter on 2+2, also in segments of 1000
#   bytes), and with the flat TCP algorithms forced through
#   KAITIAN_ALGO, where it must show the forced ones and no hierarchical one
#   (on 2+2+2 allreduce is halving_doubling). Then on 4 nodes: 1 rank each,
#   where the tuner's flat allreduce must run both recursive_doubling and
#   halving_doubling (rank 0 logs the link speed it measured), and 2+1+1+1
#   ranks (hierarchical, a 4-host cross phase); then on 4 nodes x 1, an
#   allreduce of 32 KiB must run recursive doubling with KAITIAN_LINK_MBITS=0
#   (links not modelled) and halving-doubling with KAITIAN_LINK_MBITS=1000
#   and, KAITIAN_LINK_MBITS unset, with node 1's link shaped to 1 Gbit/s
#   (tbf, where the kernel has it), then node 3's (not on rank 0's link to
#   rank 1, the one link a single probe from rank 0 measured): the slowest
#   link measured must be 500-2500 Mbit/s and one of the shaped node's.
# After each job no process may remain in any node. Namespaces, bridge and
# veths are always removed (trap EXIT); the test checks that none is left.
# Needs root; exits 77 (skipped) only where `ip netns add` fails.
# Args: KAITIAN_CLI MODE [PROGRAM]
set -u
KT=${1:?usage: $0 KAITIAN_CLI jobs|kill|hetero|hier [PROGRAM]}
MODE=${2:?usage: $0 KAITIAN_CLI jobs|kill|hetero|hier [PROGRAM]}
PROG=${3:-}
case "$MODE" in
  jobs) COLL=$PROG ;;
  kill) FAULT=$PROG; [ -x "$FAULT" ] || { echo "FAIL: mode kill needs fault_prog, got '$FAULT'" >&2; exit 1; } ;;
  hetero) HETERO=$PROG; [ -f "$HETERO" ] || { echo "FAIL: mode hetero needs test_hetero.py, got '$HETERO'" >&2; exit 1; } ;;
  hier) COLL=$PROG; [ -x "$COLL" ] || { echo "FAIL: mode hier needs coll_test, got '$COLL'" >&2; exit 1; } ;;
  *) echo "FAIL: unknown mode '$MODE'" >&2; exit 1 ;;
esac
[ -x "$KT" ] || { echo "FAIL: $KT is not executable" >&2; exit 1; }
KT=$(cd "$(dirname "$KT")" && pwd)/$(basename "$KT")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_multihost.XXXXXX")
. "$(dirname "$0")/hosts.sh"
P=$HOSTS_P                     # prefix of every namespace of this run
NS_BR="${P}br"
NET=$HOSTS_NET
PORT=29400
JOB_LIMIT=240                  # seconds a job may take before it counts as hung

node_ns() { hosts_ns "$1"; }  # node 0,1,2 -> kt<pid>-0..2

cleanup() {
  rc=$?
  hosts_down || rc=1
  rm -rf "$TMP"
  exit $rc
}

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.out "$TMP"/*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 40 lines)" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
}

step() { echo "== $*"; }

# ---- the network ------------------------------------------------------------
# Three nodes; four for the hierarchical jobs (a cross phase among 4 hosts).
NNODES_UP=3
[ "$MODE" = hier ] && NNODES_UP=4
step "creating namespaces ${P}0..$((NNODES_UP - 1)) and $NS_BR, bridge, veths, $NET.1-$NNODES_UP/24"
hosts_up $NNODES_UP "$TMP"
case $? in
  0) ;;
  77) echo "SKIP: $HOSTS_WHY"; rm -rf "$TMP"; exit 77 ;;
  *) trap cleanup EXIT; fail "setup: $HOSTS_WHY" ;;
esac
trap cleanup EXIT
trap 'exit 130' INT TERM
# Make one link feel like a network (1 ms each way on node 2's port).
if tc -n "$NS_BR" qdisc add dev p2 root netem delay 1ms 2>"$TMP/tc.log"; then
  echo "node 2's link delayed by 1 ms (netem)"
else
  echo "note: netem is not available ($(head -n 1 "$TMP/tc.log")); links are not delayed"
fi

# ---- jobs -------------------------------------------------------------------

# start_node K NNODES OUTNAME [VAR=VALUE ...] -- PROGRAM ARGS...: start the
# launcher of node K in its namespace, with its own host name (UTS namespace),
# in the background; its pid goes to $TMP/OUTNAME.K.pid.
# Ranks of node K: the K+1-th word of $NPROCS (set for one job), else 2.
nproc_of() {
  np_i=0
  for np_w in ${NPROCS:-}; do
    [ "$np_i" = "$1" ] && { echo "$np_w"; return; }
    np_i=$((np_i + 1))
  done
  echo 2
}

start_node() {
  k=$1 nn=$2 name=$3
  shift 3
  envs=""
  while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
  shift
  # shellcheck disable=SC2086
  hosts_exec "$k" env KAITIAN_JOB_SECRET="$SECRET" $envs \
    "$KT" run -n "$(nproc_of "$k")" --nnodes "$nn" --node-rank "$k" --master "$NET.1:$PORT" "$@" \
    >"$TMP/$name.$k.out" 2>"$TMP/$name.$k.err" &
  echo $! >"$TMP/$name.$k.pid"
}

# wait_nodes NAME NNODES LIMIT_S: wait for the launchers; sets RC_0.. and fails
# when one is still running after LIMIT_S seconds.
wait_nodes() {
  name=$1 nn=$2 limit=$3
  i=0
  while :; do
    running=0
    for k in $(seq 0 $((nn - 1))); do
      pid=$(cat "$TMP/$name.$k.pid")
      st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
      [ -n "$st" ] && [ "$st" != Z ] && running=$((running + 1))
    done
    [ $running = 0 ] && break
    i=$((i + 1))
    [ $i -gt $((limit * 10)) ] && fail "$name: $running launcher(s) still running after $limit s (hang?)"
    sleep 0.1
  done
  for k in $(seq 0 $((nn - 1))); do
    wait "$(cat "$TMP/$name.$k.pid")"
    eval "RC_$k=$?"
  done
}

# Nothing of a finished job may live on in any node.
# rank_errors STEP T0_MS LIMIT_MS PATTERN WHAT RANK...: the first FAULT_ERROR
# line of each RANK in $TMP/STEP.*.err matches PATTERN (it must be WHAT) and
# came less than LIMIT_MS after T0_MS (the kill or stop); each is printed.
rank_errors() {
  re_step=$1 re_t0=$2 re_limit=$3 re_pat=$4 re_what=$5
  shift 5
  for r in "$@"; do
    line=$(cat "$TMP"/"$re_step".*.err | grep -m1 "^\[$r\] FAULT_ERROR ") ||
      fail "$re_step: rank $r printed no error"
    echo "$line" | grep -Eq "$re_pat" || fail "$re_step: rank $r's error is not $re_what: $line"
    t=$(echo "$line" | sed -n 's/.* t_ms=\([0-9]*\).*/\1/p')
    [ -n "$t" ] && [ $((t - re_t0)) -lt "$re_limit" ] ||
      fail "$re_step: rank $r's error came $((t - re_t0)) ms after it (limit $re_limit ms): $line"
    echo "  $(echo "$line" | cut -c1-200) (+$((t - re_t0)) ms)"
  done
}

check_no_procs() {
  for k in $(seq 0 $((NNODES_UP - 1))); do
    left=$(ip netns pids "$(node_ns $k)" | tr '\n' ' ')
    [ -z "$left" ] || fail "$1: processes left in node $k after its launcher exited: $left"
  done
}

# Each job gets a new secret and its own store port (PORT+1 is MASTER_PORT).
new_secret() {
  SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  PORT=$((PORT + 2))
}

# run_ok NAME NNODES [VAR=VALUE ...] -- PROGRAM ARGS...: every launcher exits 0.
run_ok() {
  name=$1 nn=$2
  shift 2
  new_secret
  t0=$(date +%s)
  for k in $(seq 0 $((nn - 1))); do start_node "$k" "$nn" "$name" "$@"; done
  wait_nodes "$name" "$nn" $JOB_LIMIT
  for k in $(seq 0 $((nn - 1))); do
    eval "rc=\$RC_$k"
    [ "$rc" = 0 ] || fail "$name: the launcher of node $k exited $rc"
  done
  check_no_procs "$name"
  echo "$name: all $nn launchers exited 0 in $(( $(date +%s) - t0 )) s"
}

if [ "$MODE" = jobs ]; then
step "1. kaitian bench, 3 nodes x 2 ranks, every collective, checked"
run_ok bench 3 -- "$KT" bench -c 1 -b 8 -e 1M -n 5 -w 1
grep -q '^\[0\] # wrong values: 0 OK' "$TMP/bench.0.out" ||
  fail "bench: rank 0 did not report '# wrong values: 0 OK'"
grep -q '#wrong\|wrong values' "$TMP/bench.0.out" || fail "bench: no result table"
for c in allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv barrier; do
  grep -qi "$c" "$TMP/bench.0.out" || fail "bench: no table for $c in rank 0's output"
done
grep -h '^\[0\] # average bus bandwidth' "$TMP/bench.0.out"

if [ -n "$COLL" ] && [ -x "$COLL" ]; then
  step "2. coll_test --quick, 3 nodes x 2 ranks"
  run_ok coll 3 KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO -- "$COLL" --quick
  grep -q '3 hosts x 2 ranks: shared memory within the host' "$TMP/coll.0.err" ||
    fail "coll: rank 0 did not log the hierarchy (3 hosts x 2 ranks)"
  step "2b. coll_test, 2 nodes x 2 ranks, every case of the reducing collectives"
  run_ok coll2 2 KAITIAN_TIMEOUT=120000 -- "$COLL" --coll allreduce,reduce_scatter,allgather,allgatherv
  step "2c. coll_test --quick, 2 nodes x 2 ranks, KAITIAN_TRANSPORT=tcp, KAITIAN_NSOCKS=3 (long messages striped over 3 connections)"
  run_ok colltcp 2 KAITIAN_TIMEOUT=120000 KAITIAN_TRANSPORT=tcp KAITIAN_NSOCKS=3 KAITIAN_DEBUG=INFO -- "$COLL" --quick
  grep -q 'striped bytes to rank [23]: [0-9]* over 3 connections' "$TMP/colltcp.0.err" ||
    fail "colltcp: rank 0 did not log striped messages over 3 connections to the other node"
  grep -h 'striped bytes' "$TMP/colltcp.0.err" | head -2
  step "2d. coll_test --quick --drop-rank 5, 3 nodes x 2 ranks: nodes of 2, 2 and 1 ranks"
  run_ok colluneven 3 KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO -- "$COLL" --quick --drop-rank 5 --coll allreduce,reduce_scatter,broadcast,alltoall
  grep -q '3 hosts with 1 to 2 ranks: shared memory within the host, TCP between hosts for the first 1 of each' \
    "$TMP/colluneven.0.err" || fail "colluneven: rank 0 did not log the uneven hierarchy of the split communicator"
  step "2e. coll_test, nodes of 3 and 2 ranks (kaitian run -n 3 / -n 2), every case of allreduce"
  NPROCS="3 2"
  run_ok collnodes 2 KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO -- "$COLL" --coll allreduce
  NPROCS=""
  grep -q '2 hosts with 2 to 3 ranks: shared memory within the host, TCP between hosts for the first 2 of each' \
    "$TMP/collnodes.0.err" || fail "collnodes: rank 0 did not log the uneven hierarchy"
else
  echo "note: coll_test not given or not built ('$COLL'); step 2 skipped"
fi

step "3. kaitian bench, 2 nodes x 2 ranks, KAITIAN_SOCKET_IFNAME=ktv0"
run_ok ifname 2 KAITIAN_SOCKET_IFNAME=ktv0 -- "$KT" bench -c 1 -b 8 -e 256K -n 3 -w 1
grep -q '^\[0\] # wrong values: 0 OK' "$TMP/ifname.0.out" ||
  fail "ifname: rank 0 did not report '# wrong values: 0 OK'"

step "4. KAITIAN_SOCKET_IFNAME=ktnosuchif: every launcher fails, naming the variable"
new_secret
t0=$(date +%s)
for k in 0 1; do
  start_node $k 2 badif KAITIAN_SOCKET_IFNAME=ktnosuchif KAITIAN_CONNECT_TIMEOUT=20000 -- \
    "$KT" bench -b 8 -e 8 -n 1 -w 0
done
wait_nodes badif 2 60
for k in 0 1; do
  eval "rc=\$RC_$k"
  [ "$rc" != 0 ] || fail "badif: the launcher of node $k exited 0 with no usable interface"
done
cat "$TMP"/badif.*.err | grep -q KAITIAN_SOCKET_IFNAME ||
  fail "badif: no message names KAITIAN_SOCKET_IFNAME"
check_no_procs badif
echo "badif: launchers exited $RC_0 and $RC_1 in $(( $(date +%s) - t0 )) s"

fi

if [ "$MODE" = kill ]; then
  # wait_started NAME N: N ranks of job NAME have printed FAULT_STARTED (120 s).
  wait_started() {
    i=0
    while [ "$(cat "$TMP"/$1.*.out 2>/dev/null | grep -c FAULT_STARTED)" -lt "$2" ]; do
      i=$((i + 1))
      [ $i -gt 1200 ] && fail "$1: the $2 ranks did not all start within 120 s"
      sleep 0.1
    done
  }
  # kill_rank NAME RANK PID: SIGKILL rank RANK of job NAME (3 nodes); every
  # launcher must then exit non-zero.
  kill_rank() {
    kill -9 "$3" || fail "$1: cannot kill rank $2 (pid $3)"
    wait_nodes "$1" 3 60
    for k in 0 1 2; do
      eval "rc=\$RC_$k"
      [ "$rc" != 0 ] || fail "$1: the launcher of node $k exited 0 although rank $2 was killed"
    done
  }
  step "SIGKILL of a rank of node 2 in the middle of allreduces"
  new_secret
  mkdir -p "$TMP/kill"
  for k in 0 1 2; do
    start_node $k 3 kill KAITIAN_TIMEOUT=60000 KAITIAN_HIER_SEGMENT_BYTES=1048576 -- "$FAULT" killloop "dir=$TMP/kill" count=1048576
  done
  wait_started kill 6
  vpid=$(cat "$TMP/kill/pid.5")
  sleep 0.3
  kill_rank kill 5 "$vpid"
  grep -q "rank 5 (pid $vpid) was killed by signal 9" "$TMP/kill.2.err" ||
    fail "kill: node 2's launcher does not name rank 5 as killed by signal 9"
  for k in 0 1; do
    grep -q "rank 5 (pid $vpid) was killed by signal 9" "$TMP/kill.$k.err" ||
      fail "kill: node $k's launcher does not repeat the failing rank's line"
  done
  for r in 0 1 2 3 4; do
    line=$(cat "$TMP"/kill.*.err | grep -m1 "^\[$r\] FAULT_ERROR ") ||
      fail "kill: rank $r printed no error after rank 5 died"
    echo "$line" | grep -Eq 'code=KT_ERR_PEER_FAILED .*rank 5([^0-9]|$)' ||
      fail "kill: rank $r's error is not a peer failure naming rank 5: $line"
    echo "  $line" | cut -c1-300
  done
  check_no_procs kill
  echo "kill: every launcher exited non-zero ($RC_0 $RC_1 $RC_2), survivors named rank 5"

  step "SIGSTOP of rank 3 (not its host's inter-host rank) in the middle of allreduces, 2 nodes x 2 ranks"
  # Rank 0 waits in the inter-host phase for rank 2, which waits in its
  # host's shared-memory phase for the stopped rank 3: rank 0's own timeout
  # must name rank 3 too (nothing heard from it), not only rank 2.
  new_secret
  mkdir -p "$TMP/stop"
  for k in 0 1; do
    start_node $k 2 stop KAITIAN_TIMEOUT=3000 KAITIAN_HIER_SEGMENT_BYTES=1048576 -- "$FAULT" killloop "dir=$TMP/stop" count=1048576 expect=timeout
  done
  wait_started stop 4
  vpid=$(cat "$TMP/stop/pid.3")
  sleep 0.3
  stop_ms=$(date +%s%3N)
  kill -STOP "$vpid" || fail "stop: cannot stop rank 3 (pid $vpid)"
  wait_nodes stop 2 60
  for k in 0 1; do
    eval "rc=\$RC_$k"
    [ "$rc" != 0 ] || fail "stop: the launcher of node $k exited 0 although rank 3 was stopped"
  done
  rank_errors stop "$stop_ms" 13000 'code=KT_ERR_TIMEOUT .*rank 3([^0-9]|$)' "a timeout naming rank 3" 0 1 2
  ! cat "$TMP"/stop.*.err | grep -q FAULT_CHECK_FAILED || fail "stop: $(cat "$TMP"/stop.*.err | grep -m1 FAULT_CHECK_FAILED)"
  check_no_procs stop
  echo "stop: every launcher exited non-zero ($RC_0 $RC_1), every survivor named rank 3"

  step "a whole host lost: every process of node 2 (launcher and ranks 4, 5) SIGKILLed mid-allreduce"
  new_secret
  mkdir -p "$TMP/host"
  for k in 0 1 2; do
    start_node $k 3 host KAITIAN_TIMEOUT=60000 KAITIAN_HIER_SEGMENT_BYTES=0 -- "$FAULT" killloop "dir=$TMP/host" count=1048576
  done
  wait_started host 6
  sleep 0.3
  kill_ms=$(date +%s%3N)
  for p in $(ip netns pids "$(node_ns 2)"); do kill -9 "$p" 2>/dev/null; done
  wait_nodes host 2 60
  done_ms=$(date +%s%3N)
  for k in 0 1; do
    eval "rc=\$RC_$k"
    [ "$rc" != 0 ] || fail "host: the launcher of node $k exited 0 although node 2 was lost"
  done
  rank_errors host "$kill_ms" 10000 'code=KT_ERR_PEER_FAILED .*rank [45]([^0-9]|$)' \
    "a peer failure naming rank 4 or 5" 0 1 2 3
  grep -q "node 2 (host ktnode2) stopped answering" "$TMP/host.0.err" ||
    grep -q "node 2 (host [^)]*) stopped answering" "$TMP/host.0.err" ||
    fail "host: node 0's launcher does not name the lost node 2"
  grep -h "stopped answering" "$TMP/host.0.err" | head -n 1
  # Node 2's processes were killed by the test: only nodes 0 and 1 are checked.
  check_no_procs host
  echo "host: launchers of nodes 0 and 1 exited $RC_0 and $RC_1 $((done_ms - kill_ms)) ms after the kill; node 0 named node 2"

  # fault_prog checks it: every rank gets an error naming another rank within 5 s.
  # The broadcasts run hierarchical (the shared-memory phases' signatures
  # catch them) and flat (binomial over TCP: no message of either side
  # reaches the other; the status notices must).
  for kind in avg bcast bcastroot1 bcast.flat bcastroot1.flat; do
    case $kind in
      avg) what="rank 1 allreduces with AVG, the others with SUM" ;;
      bcastroot1*) what="rank 1 broadcasts from root 1, the others allreduce" ;;
      bcast*) what="rank 1 broadcasts from root 0, the others allreduce" ;;
    esac
    case $kind in
      *.flat) algo=KAITIAN_ALGO=broadcast=binomial what="$what (flat broadcast)" ;;
      *) algo=KAITIAN_ALGO= ;;
    esac
    step "mismatch: $what, 2 nodes x 2 ranks (hierarchical allreduce)"
    run_ok "mismatch_$kind" 2 KAITIAN_TIMEOUT=60000 "$algo" -- "$FAULT" mismatch "kind=${kind%.flat}"
    grep -h "FAULT_ERROR" "$TMP"/mismatch_$kind.*.err | cut -c1-300
  done
  step "late: the same operations, each rank 2.5 s late to one, 2 nodes x 2 ranks"
  run_ok late 2 KAITIAN_TIMEOUT=60000 -- "$FAULT" late sleep_ms=2500

  step "SIGKILL of rank 2 while it streams the link probe to rank 0 (node 2's way out shaped to 24 Mbit/s), 3 nodes x 1 rank"
  # The other end's probe fails at once; rank 0 hands the failure to every
  # rank through the store instead of leaving them to wait for its verdict.
  if tc -n "$(node_ns 2)" qdisc add dev ktv0 root tbf rate 24mbit burst 16000 latency 5s 2>"$TMP/tc.log"; then
    NPROCS="1 1 1"
    new_secret
    for k in 0 1 2; do
      start_node $k 3 probekill KAITIAN_TIMEOUT=60000 KAITIAN_DEBUG=INFO -- "$FAULT" killloop "dir=$TMP/probekill"
    done
    i=0
    until grep -q "rank 2: measuring the link to rank 0" "$TMP/probekill.2.err" 2>/dev/null; do
      i=$((i + 1))
      [ $i -gt 1200 ] && fail "probekill: rank 2 did not start its probe to rank 0 within 120 s"
      sleep 0.1
    done
    sleep 0.5
    vpid=$(ip netns pids "$(node_ns 2)" | while read -r p; do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fault_prog ] && echo "$p"; done | head -n 1)
    [ -n "$vpid" ] || fail "probekill: no fault_prog process in node 2"
    kill_ms=$(date +%s%3N)
    kill_rank probekill 2 "$vpid"
    for r in 0 1; do
      line=$(grep -m1 "kt_comm_init_env failed" "$TMP/probekill.$r.err") ||
        fail "probekill: rank $r printed no failed communicator creation"
      echo "$line" | grep -Eq "link (from|to) rank 2" ||
        fail "probekill: rank $r's error does not name the probe of rank 2's link: $line"
      echo "  $line" | cut -c1-300
    done
    end_ms=$(stat -c %.3Y "$TMP/probekill.1.err" | tr -d .)
    [ $((end_ms - kill_ms)) -lt 10000 ] || fail "probekill: rank 1's error came more than 10 s after the kill"
    check_no_procs probekill
    tc -n "$(node_ns 2)" qdisc del dev ktv0 root
    NPROCS=""
  else
    echo "note: tbf is not available ($(head -n 1 "$TMP/tc.log")); the probe case is skipped"
  fi
fi

if [ "$MODE" = hetero ]; then
  for backend in kaitian gloo; do
    step "heterogeneous data parallelism over $backend, nodes of 3 and 2 ranks, capabilities 1:2:5:1:3"
    new_secret
    for k in 0 1; do
      np=$((3 - k))
      hosts_exec "$k" env KAITIAN_JOB_SECRET="$SECRET" KAITIAN_TIMEOUT=120000 GLOO_SOCKET_IFNAME=ktv0 \
        "$KT" run --devices "cpu:$np" --nnodes 2 --node-rank "$k" --master "$NET.1:$PORT" \
        "$HETERO" exact --caps 1,2,5,1,3 --accum 2 --backend "$backend" \
        >"$TMP/het$backend.$k.out" 2>"$TMP/het$backend.$k.err" &
      echo $! >"$TMP/het$backend.$k.pid"
    done
    wait_nodes "het$backend" 2 $JOB_LIMIT
    for k in 0 1; do
      eval "rc=\$RC_$k"
      [ "$rc" = 0 ] || fail "het$backend: the launcher of node $k exited $rc"
    done
    grep -h "PASS exact p=5" "$TMP/het$backend.0.out" || fail "het$backend: rank 0 did not pass"
    check_no_procs "het$backend"
  done
  step "ZeroOptimizer across 2 nodes x 2 ranks (shard_group='node': sharded inside each node)"
  run_ok zero 2 KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=WARN -- "$(dirname "$HETERO")/test_zero.py" check
  grep -q "shard_group='node'.*shards of 2, node-local" "$TMP/zero.0.out" ||
    fail "zero: shard_group='node' did not shard inside each node"
  grep -h "PASS zero check" "$TMP/zero.0.out" || fail "zero: rank 0 did not pass"
fi

if [ "$MODE" = hier ]; then
  HIER_COLLS="allreduce broadcast reduce allgather allgatherv reduce_scatter barrier"
  ALL_HIER=allreduce,broadcast,reduce,allgather,allgatherv,reduce_scatter,barrier,mixed
  # Rank 0 of the tested communicator is the launched rank $order's first
  # (never 0 below, so its lines "rank 0/N" cannot be the launched
  # communicator's, whose split is an allgather too).
  # passed_and_ran NAME ORDER SIZE COLL=ALGO...: that rank reported PASSED,
  # and its INFO log says that each COLL ran ALGO on the tested communicator.
  passed_and_ran() {
    name=$1 first=${2%%,*} size=$3
    shift 3
    cat "$TMP/$name".*.out | grep "^\[$first\] coll_test: "
    cat "$TMP/$name".*.out | grep -q "^\[$first\] coll_test: PASSED" ||
      fail "$name: rank 0 of the tested communicator (launched rank $first) did not report PASSED"
    for ca in "$@"; do
      cat "$TMP/$name".*.err | grep -q "^\[$first\] .* KAITIAN INFO .* rank 0/$size: ${ca%%=*} runs algorithm ${ca#*=} " ||
        fail "$name: the log of launched rank $first does not show ${ca%%=*} running ${ca#*=} on the $size ranks"
    done
  }
  # hier_job NAME NNODES ORDER SIZE COLLS [--quick]: coll_test --coll COLLS
  # (all: every collective) with the tuner's picks (and the variables in
  # $HIER_ENV); each of HIER_COLLS that COLLS names must run hierarchical.
  hier_job() {
    name=$1 nn=$2 order=$3 size=$4 colls=$5
    shift 5
    [ "$colls" = all ] || set -- --coll "$colls" "$@"
    # shellcheck disable=SC2086
    run_ok "$name" "$nn" KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO ${HIER_ENV:-} -- "$COLL" --order "$order" "$@"
    set --
    for c in $HIER_COLLS; do
      case ",$colls," in *",$c,"*|,all,) set -- "$@" "$c=hierarchical" ;; esac
    done
    passed_and_ran "$name" "$order" "$size" "$@"
  }
  # flat_job NAME NNODES ORDER SIZE KAITIAN_ALGO COLL=ALGO... -- COLL_TEST_ARGS...:
  # the forced algorithms run, and nothing hierarchical on any rank.
  flat_job() {
    name=$1 nn=$2 order=$3 size=$4 algo=$5
    shift 5
    expect=""
    while [ "$1" != "--" ]; do expect="$expect $1"; shift; done
    shift
    run_ok "$name" "$nn" KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO "KAITIAN_ALGO=$algo" -- "$COLL" --order "$order" "$@"
    # shellcheck disable=SC2086
    passed_and_ran "$name" "$order" "$size" $expect
    ! cat "$TMP/$name".*.err | grep -q "runs algorithm hierarchical" ||
      fail "$name: a hierarchical algorithm ran although KAITIAN_ALGO=$algo forces flat ones"
  }

  # Every case (blocking and not, every dtype x op x count) where the layout
  # matters most, --quick (every dtype and op) elsewhere; allreduce's every
  # case runs in mode jobs (2b, 2e).
  FULL=broadcast,allgather,allgatherv,reduce_scatter,barrier,mixed
  step "hier 1. 2+2 ranks as 2,0,1,3 (each node's ranks apart, cross groups in both orders)"
  hier_job hier22 2 2,0,1,3 4 $FULL
  hier_job hier22q 2 2,0,1,3 4 allreduce,reduce --quick
  step "hier 2. 2+2+2 ranks as 5,0,3,1,4,2 (--quick, every collective)"
  hier_job hier222 3 5,0,3,1,4,2 6 all --quick
  step "hier 3. 3+2 ranks as 3,0,4,1,2: 2 shards, root size-1 is the 3-rank node's extra rank"
  NPROCS="3 2"
  hier_job hier32 2 3,0,4,1,2 5 broadcast,allgatherv,reduce_scatter
  hier_job hier32q 2 3,0,4,1,2 5 $ALL_HIER --quick
  step "hier 3b. the same with small shared-memory regions, ring segments and chunks: every phase in many pieces"
  HIER_ENV="KAITIAN_SHM_CHUNK_BYTES=4160 KAITIAN_RING_SEGMENT_BYTES=20000 KAITIAN_CHUNK_BYTES=1001"
  hier_job hier32small 2 3,0,4,1,2 5 $ALL_HIER --quick
  step "hier 3c. in segments (KAITIAN_HIER_SEGMENT_BYTES=1000: 2-16 of them, the inter-host phases on the cross communicator's thread): allreduce, broadcast and allgather(v) on 3+2 and 2+2+1, and with reduce_scatter (segmented only where the hosts' ranks are alike) on 2+2"
  HIER_ENV="KAITIAN_HIER_SEGMENT_BYTES=1000"
  hier_job hier32seg 2 3,0,4,1,2 5 allreduce,broadcast,allgather,allgatherv --quick
  NPROCS=""
  hier_job hier221seg 3 4,0,2,1,3 5 allreduce,broadcast,allgather,allgatherv --quick
  hier_job hier22seg 2 2,0,1,3 4 reduce_scatter,allreduce,broadcast,allgather,allgatherv --quick
  NPROCS="3 2"
  HIER_ENV=""
  step "hier 4. 2+2+1 ranks as 4,0,2,1,3 (rank 5 left out): 1 shard, root 0 alone on its node"
  NPROCS=""
  hier_job hier221 3 4,0,2,1,3 5 $ALL_HIER --quick
  cat "$TMP"/hier221.*.err | grep -q '^\[4\] .*3 hosts with 1 to 2 ranks' ||
    fail "hier221: the tested communicator is not the 2+2+1 hierarchy"

  step "hier 5. flat algorithms forced (KAITIAN_ALGO), 3+2, 2+2 and 2+2+2 ranks"
  NPROCS="3 2"
  flat_job flat32 2 3,0,4,1,2 5 ring,broadcast=pipeline,reduce=binomial,barrier=dissemination \
    allreduce=ring broadcast=pipeline reduce=binomial allgather=ring allgatherv=ring reduce_scatter=ring \
    barrier=dissemination -- --coll $ALL_HIER --quick
  NPROCS=""
  FLAT=allreduce=recursive_doubling,broadcast=binomial,reduce=binomial,allgather=ring,allgatherv=ring
  FLAT=$FLAT,reduce_scatter=ring,barrier=dissemination
  flat_job flat22 2 2,0,1,3 4 "$FLAT" \
    allreduce=recursive_doubling broadcast=binomial reduce=binomial allgather=ring allgatherv=ring \
    reduce_scatter=ring barrier=dissemination -- --coll $ALL_HIER --quick
  FLAT=allreduce=halving_doubling,broadcast=binomial,reduce=binomial,allgather=ring,allgatherv=ring
  FLAT=$FLAT,reduce_scatter=ring,barrier=dissemination
  flat_job flat222 3 5,0,3,1,4,2 6 "$FLAT" \
    allreduce=halving_doubling broadcast=binomial reduce=binomial allgather=ring allgatherv=ring \
    reduce_scatter=ring barrier=dissemination -- --coll $ALL_HIER --quick

  step "hier 6. 4 nodes: 1 rank each (the tuner's flat allreduce: recursive doubling when small, halving-doubling at 256 KiB), and 2+1+1+1 ranks (hierarchical, its cross phase among 4 hosts)"
  NPROCS="1 1 1 1"
  run_ok hd1111 4 KAITIAN_TIMEOUT=120000 KAITIAN_DEBUG=INFO -- "$COLL" --order 2,0,3,1 --coll allreduce --quick
  passed_and_ran hd1111 2,0,3,1 4 allreduce=recursive_doubling allreduce=halving_doubling
  grep -q "^\[0\] .*rank 0: links between hosts measured at [0-9]* Mbit/s (rank [0-3] to rank [0-3], the slowest of the 4 between the hosts' first ranks, the fastest [0-9]* Mbit/s" "$TMP/hd1111.0.err" ||
    fail "hd1111: rank 0 did not log the slowest of the 4 links it measured"
  NPROCS="2 1 1 1"
  hier_job hier2111 4 4,1,0,2,3 5 allreduce,reduce_scatter --quick

  step "hier 7. 4 nodes x 1 rank, allreduce of 32 KiB: recursive doubling on a link taken as fast (KAITIAN_LINK_MBITS=0: not modelled), halving-doubling on one taken as 1000 Mbit/s, and on node 1's link shaped to 1 Gbit/s (tbf), measured"
  NPROCS="1 1 1 1"
  # link_job NAME ALGO VAR=VALUE...: rank 0 ran the 32 KiB allreduce with
  # ALGO, and halving-doubling only if ALGO is it (the bench's own 8-byte
  # allreduces run recursive doubling everywhere).
  link_job() {
    name=$1 algo=$2
    shift 2
    run_ok "$name" 4 KAITIAN_DEBUG=INFO "$@" -- "$KT" bench -C allreduce -b 32K -e 32K -n 3 -w 1 -c 1
    grep -q '^\[0\] # wrong values: 0 OK' "$TMP/$name.0.out" || fail "$name: rank 0 did not report '# wrong values: 0 OK'"
    grep -h '^\[0\] .*rank 0: links between hosts' "$TMP/$name.0.err"
    grep -q "^\[0\] .*rank 0/4: allreduce runs algorithm $algo " "$TMP/$name.0.err" ||
      fail "$name: rank 0's log does not show the 32 KiB allreduce running $algo"
    [ "$algo" = halving_doubling ] || ! grep -q 'allreduce runs algorithm halving_doubling' "$TMP/$name.0.err" ||
      fail "$name: halving-doubling ran although the link is not modelled as slow"
  }
  link_job linkfast recursive_doubling KAITIAN_LINK_MBITS=0
  grep -q 'links between hosts taken as 0 Mbit/s (KAITIAN_LINK_MBITS): not modelled' "$TMP/linkfast.0.err" ||
    fail "linkfast: rank 0 did not log KAITIAN_LINK_MBITS=0"
  link_job linkgiven halving_doubling KAITIAN_LINK_MBITS=1000
  # shaped_job NODE LINKS: node NODE's link shaped to 1 Gbit/s both ways;
  # rank 0 must name one of LINKS (egrep) as the slowest it measured.
  shaped_job() {
    sn=$1 links=$2
    if tc -n "$(node_ns "$sn")" qdisc add dev ktv0 root tbf rate 1gbit burst 125000 latency 50ms 2>"$TMP/tc.log" &&
       tc -n "$NS_BR" qdisc add dev "p$sn" root tbf rate 1gbit burst 125000 latency 50ms 2>>"$TMP/tc.log"; then
      link_job "linkshaped$sn" halving_doubling
      line=$(grep -h 'links between hosts measured at' "$TMP/linkshaped$sn.0.err" | head -n 1)
      mbits=$(echo "$line" | sed -n 's/.*links between hosts measured at \([0-9]*\) Mbit\/s.*/\1/p')
      [ -n "$mbits" ] && [ "$mbits" -ge 500 ] && [ "$mbits" -le 2500 ] ||
        fail "linkshaped$sn: measured '${mbits:-nothing}' Mbit/s on node $sn's link shaped to 1000 (tbf; expected 500-2500)"
      echo "$line" | grep -Eq "Mbit/s \(($links), the slowest of the 4 between the hosts' first ranks" ||
        fail "linkshaped$sn: rank 0 does not name node $sn's link ($links) as the slowest of 4: $line"
      tc -n "$(node_ns "$sn")" qdisc del dev ktv0 root
      tc -n "$NS_BR" qdisc del dev "p$sn" root
    else
      echo "note: tbf is not available ($(head -n 1 "$TMP/tc.log")); the measured case is skipped"
    fi
  }
  # Node 1 is on rank 0's link to rank 1; node 3 is not (its links are
  # ranks 2 to 3 and 3 to 0), where a single probe from rank 0 saw nothing.
  shaped_job 1 "rank 0 to rank 1|rank 1 to rank 2"
  shaped_job 3 "rank 2 to rank 3|rank 3 to rank 0"
  NPROCS=""
fi

echo "PASS multihost netns $MODE"
