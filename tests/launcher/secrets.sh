#!/bin/sh
# secrets.sh - what a job keeps private (docs/failures.md, "What a job keeps
# private"):
#  * the job secret is on no process's command line while the job runs
#    (every /proc/PID/cmdline on the machine is searched for it), and in no
#    line the launcher or its ranks print at KAITIAN_DEBUG=TRACE;
#  * every shared-memory file a rank maps is already unlinked (its
#    /proc/PID/maps line says "(deleted)") and has mode 0600.
# 1. one node: `kaitian run -n 3` makes up the secret; each rank writes the
#    one it was given to a file (to know what to search for), then runs
#    `kaitian bench` (a communicator over shared memory and TCP).
# 2. two launchers (--nnodes 2 on loopback) with KAITIAN_JOB_SECRET set,
#    2 ranks each.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"
# The ranks' command lines carry no marker (they exec kaitian bench): on a
# failure, stop the launchers, which stop and reap their ranks.
LPIDS=""
stop_launchers() {
  for p in $LPIDS; do kill -TERM "$p" 2>/dev/null; done
  for p in $LPIDS; do wait "$p" 2>/dev/null; done
  cleanup
}
trap stop_launchers EXIT

# rank program: record pid and secret, then a communicator that lives about
# a second or more ($0: file prefix, $1: kaitian; 400 iterations ended in
# 0.09 s on the development VM, before the checks below had looked once).
RANK_SH='echo $$ >"$0.pid.$RANK"; printf %s "$KAITIAN_JOB_SECRET" >"$0.secret.$RANK";
exec "$1" bench -C allreduce,sendrecv -b 1M -e 1M -n 6000 -w 1'

# check_job NAME NRANKS: while the job's launchers run, check the ranks'
# command lines and mappings; after, their output.
check_job() {
  name=$1 nr=$2
  i=0
  while [ "$(ls "$TMP/$name".pid.* 2>/dev/null | wc -l)" -lt "$nr" ] ||
    [ "$(ls "$TMP/$name".secret.* 2>/dev/null | wc -l)" -lt "$nr" ]; do
    i=$((i + 1))
    [ $i -gt 200 ] && fail "$name: the ranks did not start within 20 s"
    sleep 0.1
  done
  secret=$(cat "$TMP/$name.secret.0")
  [ ${#secret} -ge 16 ] || fail "$name: rank 0 got a secret of ${#secret} characters"
  for f in "$TMP/$name".secret.*; do
    [ "$(cat "$f")" = "$secret" ] || fail "$name: $(basename "$f") differs from rank 0's secret"
  done
  # The ranks map their segment once their communicator is up: look a few
  # times while the bench runs.
  seen=0
  for round in 1 2 3 4 5 6 7 8 9 10; do
    # The pattern's last character in brackets: grep's own command line
    # holds the pattern, not the secret.
    leaks=$(grep -la -- "${secret%?}[${secret#"${secret%?}"}]" /proc/[0-9]*/cmdline 2>/dev/null | tr '\n' ' ')
    [ -z "$leaks" ] || fail "$name: the job secret is on the command line of: $leaks"
    for pf in "$TMP/$name".pid.*; do
      pid=$(cat "$pf")
      [ -r "/proc/$pid/maps" ] || continue
      grep '/dev/shm/' "/proc/$pid/maps" >"$TMP/maps" 2>/dev/null || continue
      while read -r range _ _ _ _ path rest; do
        seen=$((seen + 1))
        case "$rest" in
          *"(deleted)"*) ;;
          *) fail "$name: rank pid $pid maps $path, which is still linked in /dev/shm" ;;
        esac
        mode=$(stat -L -c %a "/proc/$pid/map_files/$range" 2>/dev/null) || continue
        [ "$mode" = 600 ] || fail "$name: rank pid $pid maps $path with mode $mode, not 600"
      done <"$TMP/maps"
    done
    [ $seen -gt 0 ] && [ $round -ge 3 ] && break
    sleep 0.2
  done
  [ $seen -gt 0 ] || fail "$name: no rank was seen mapping a shared-memory segment"
}

check_logs() {
  name=$1
  for f in "$TMP/$name".*.out "$TMP/$name".*.err "$TMP/$name".out "$TMP/$name".err; do
    [ -f "$f" ] || continue
    ! grep -qF -- "$secret" "$f" || fail "$name: the job secret appears in $(basename "$f") at KAITIAN_DEBUG=TRACE"
  done
  grep -q 'TRACE\|INFO' "$TMP/$name".*err 2>/dev/null || grep -q 'TRACE\|INFO' "$TMP/$name".err 2>/dev/null ||
    fail "$name: no INFO/TRACE line was logged (is KAITIAN_DEBUG=TRACE honoured?)"
}

# 1. one node.
KAITIAN_DEBUG=TRACE "$KT" run -n 3 sh -c "$RANK_SH" "$TMP/one" "$KT" >"$TMP/one.out" 2>"$TMP/one.err" &
lp=$!
LPIDS=$lp
check_job one 3
wait $lp
expect_rc 0 $? "one node"
LPIDS=""
check_logs one
echo "one node: secret on no command line, in no log line; shared memory unlinked and 0600"

# 2. two launchers, the secret from the environment.
port=$(free_port)
[ -n "$port" ] || fail "no free port"
SECRET2="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
for k in 1 0; do
  KAITIAN_DEBUG=TRACE KAITIAN_JOB_SECRET=$SECRET2 "$KT" run -n 2 --nnodes 2 --node-rank $k \
    --master "127.0.0.1:$port" sh -c "$RANK_SH" "$TMP/two" "$KT" >"$TMP/two.$k.out" 2>"$TMP/two.$k.err" &
  eval "lp$k=\$!"
  LPIDS="$LPIDS $!"
done
check_job two 4
[ "$secret" = "$SECRET2" ] || fail "two: the ranks got another secret than KAITIAN_JOB_SECRET"
wait $lp0
expect_rc 0 $? "two nodes: node 0"
wait $lp1
expect_rc 0 $? "two nodes: node 1"
LPIDS=""
check_logs two
echo "two nodes: secret on no command line, in no log line; shared memory unlinked and 0600"
echo PASSED
