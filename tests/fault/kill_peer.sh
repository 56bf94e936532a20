#!/bin/sh
# kill_peer.sh - SIGKILL one rank in the middle of a large allreduce. Every
# survivor must get KT_ERR_PEER_FAILED naming the dead rank within 10 s of the
# kill, then find its communicator broken (further operations fail at once,
# kt_comm_destroy returns); the launcher must exit non-zero naming the rank as
# killed by signal 9; no process of the job and nothing in /dev/shm may remain.
# The whole check runs REPEAT times (each with a new job), since which rank
# notices first differs from run to run.
# Args: KAITIAN_CLI FAULT_PROG NRANKS VICTIM [COUNT [REPEAT [EXTRA]]]; EXTRA
# (e.g. registered=1) goes to fault_prog's killloop.
. "$(dirname "$0")/lib.sh" "$@"
NP=${3:?ranks}
VICTIM=${4:?victim rank}
COUNT=${5:-16777216}
REPEAT=${6:-1}
EXTRA=${7:-}
LIMIT_MS=10000

run_once() {
rm -f "$TMP"/pid.* "$TMP"/job.*
shm_snapshot
# Detection must come from the dead peer's closed connection, not a timeout.
KAITIAN_TIMEOUT=60000 "$KT" run -n "$NP" "$PROG" killloop "dir=$TMP" "count=$COUNT" "mark=$MARK" $EXTRA \
  >"$TMP/job.out" 2>"$TMP/job.err" &
LPID=$!

# Wait until every rank has finished one checked allreduce (and so is in the loop).
i=0
while [ "$(cat "$TMP/job.out" 2>/dev/null | grep -c 'FAULT_STARTED')" -lt "$NP" ]; do
  i=$((i + 1))
  [ $i -gt 1200 ] && fail "the ranks did not all start their allreduce loop within 120 s"
  kill -0 "$LPID" 2>/dev/null || fail "the job ended before the kill"
  sleep 0.1
done
for r in $(seq 0 $((NP - 1))); do
  [ -s "$TMP/pid.$r" ] || fail "rank $r wrote no pid file"
done
vpid=$(cat "$TMP/pid.$VICTIM")
sleep 0.3 # well inside an allreduce now
kill_ms=$(now_ms)
kill -9 "$vpid" || fail "cannot kill rank $VICTIM (pid $vpid)"
echo "killed rank $VICTIM (pid $vpid) at $kill_ms"

wait_launcher 60
cat "$TMP/job.err" "$TMP/job.out" >"$TMP/all.log"

# The launcher: non-zero (the killed rank's 128+9), naming the rank and the signal.
[ "$LRC" -ne 0 ] || fail "the launcher exited 0 although rank $VICTIM was killed"
[ "$LRC" -eq 137 ] || fail "the launcher exited $LRC; the first failing rank (rank $VICTIM, SIGKILL) gives 137"
grep -Eq "rank $VICTIM \(pid $vpid\) was killed by signal 9" "$TMP/job.err" ||
  fail "the launcher's output does not name rank $VICTIM (pid $vpid) as killed by signal 9"

# Every survivor: the error, its timing, and the broken-communicator checks.
for r in $(seq 0 $((NP - 1))); do
  [ "$r" = "$VICTIM" ] && continue
  line=$(grep -m1 "^\[$r\] FAULT_ERROR " "$TMP/job.err") || fail "rank $r printed no error after rank $VICTIM died"
  code=$(echo "$line" | sed -n 's/.* code=\([A-Z_]*\) .*/\1/p')
  t=$(echo "$line" | sed -n 's/.* t_ms=\([0-9]*\) .*/\1/p')
  msg=${line#* msg=}
  [ "$code" = KT_ERR_PEER_FAILED ] || fail "rank $r got $code, expected KT_ERR_PEER_FAILED: $msg"
  echo "$msg" | grep -Eq "rank $VICTIM([^0-9]|\$)" || fail "rank $r's error does not name rank $VICTIM: $msg"
  dt=$((t - kill_ms))
  [ "$dt" -le "$LIMIT_MS" ] || fail "rank $r reported the death $dt ms after the kill (limit $LIMIT_MS)"
  echo "rank $r: $code after $dt ms: $msg"
  grep -q "^\[$r\] FAULT_OK " "$TMP/job.out" || fail "rank $r: checks after the failure did not pass"
done
grep -q "FAULT_CHECK_FAILED" "$TMP/job.err" && fail "a rank reported a failed check"
grep -q "^\[$VICTIM\] FAULT_ERROR" "$TMP/job.err" && fail "the killed rank printed an error (was it killed mid-operation?)"

leftover_check "after the launcher exited"
shm_check "after the job"
}

for attempt in $(seq 1 "$REPEAT"); do
  echo "== attempt $attempt of $REPEAT"
  run_once
done
echo "PASS kill_peer np=$NP victim=$VICTIM ($REPEAT runs)"
