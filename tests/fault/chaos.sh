#!/bin/sh
# chaos.sh - failure trials at volume (make chaos TRIALS=N; a few in make test).
# Each trial starts a new job of NP ranks on this host (`kaitian run`,
# fault_prog chaos: a random mix of collectives and sizes from a random seed),
# waits until every rank has run its first operation, then after a random
# 0-1.5 s picks a random rank and either
#   kill: SIGKILL, or
#   stop: SIGSTOP (the rank stays alive but silent past KAITIAN_TIMEOUT, 3 s),
# and checks:
#   * every other rank returns an error naming the lost rank, within 10 s of
#     the kill (stop: within the timeout + 10 s);
#   * the launcher exits non-zero (kill: naming the rank as killed by signal 9);
#   * no process of the job remains and nothing is left in /dev/shm;
#   * nothing hangs: a hard watchdog of 60 s per trial.
# TRIALS trials of each kind (default 100); prints a tally per kind and exits
# non-zero when any trial failed (each failure is described as it happens).
# Args: KAITIAN_CLI FAULT_PROG [TRIALS [NP]]
. "$(dirname "$0")/lib.sh" "$@"
TRIALS=${3:-100}
NP=${4:-4}
TIMEOUT_MS=3000
WATCHDOG_S=60

rand() { od -An -N4 -tu4 /dev/urandom | tr -d ' '; }

# trial KIND N: one trial; prints "ok DETECT_MS" or "fail REASON" on stdout.
trial() {
  kind=$1 n=$2
  rm -f "$TMP"/pid.* "$TMP"/job.*
  shm_snapshot
  seed=$(( $(rand) % 1000000 ))
  victim=$(( $(rand) % NP ))
  delay_ms=$(( $(rand) % 1500 ))
  KAITIAN_TIMEOUT=$TIMEOUT_MS "$KT" run -n "$NP" --grace 2 "$PROG" chaos "dir=$TMP" "seed=$seed" "mark=$MARK" \
    >"$TMP/job.out" 2>"$TMP/job.err" &
  LPID=$!
  what="$kind trial $n (seed $seed, rank $victim after $delay_ms ms)"
  i=0
  while [ "$(grep -c 'FAULT_STARTED' "$TMP/job.out" 2>/dev/null)" -lt "$NP" ]; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 "$LPID" 2>/dev/null; then
      echo "fail $what: the ranks did not all start within 30 s"
      return
    fi
    sleep 0.1
  done
  vpid=$(cat "$TMP/pid.$victim" 2>/dev/null)
  [ -n "$vpid" ] || { echo "fail $what: rank $victim wrote no pid"; return; }
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill_ms=$(now_ms)
  if [ "$kind" = kill ]; then kill -9 "$vpid"; else kill -STOP "$vpid"; fi
  # Watchdog: the launcher must be done within WATCHDOG_S.
  i=0
  while kill -0 "$LPID" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$LPID/stat" 2>/dev/null)" != Z ]; do
    i=$((i + 1))
    if [ $i -gt $((WATCHDOG_S * 10)) ]; then
      kill -9 "$LPID" 2>/dev/null
      for p in $(leftovers); do kill -9 "$p" 2>/dev/null; done
      wait "$LPID" 2>/dev/null
      LPID=""
      echo "fail $what: HANG, the launcher was still running after $WATCHDOG_S s"
      return
    fi
    sleep 0.1
  done
  wait "$LPID"
  rc=$?
  LPID=""
  [ "$rc" -ne 0 ] || { echo "fail $what: the launcher exited 0"; return; }
  if [ "$kind" = kill ] && ! grep -Eq "rank $victim \(pid $vpid\) was killed by signal 9" "$TMP/job.err"; then
    echo "fail $what: the launcher does not name rank $victim as killed by signal 9"
    return
  fi
  limit=10000
  [ "$kind" = stop ] && limit=$((TIMEOUT_MS + 10000))
  worst=0
  for r in $(seq 0 $((NP - 1))); do
    [ "$r" = "$victim" ] && continue
    line=$(grep -m1 "^\[$r\] FAULT_ERROR " "$TMP/job.err") || {
      echo "fail $what: rank $r printed no error"
      return
    }
    t=$(echo "$line" | sed -n 's/.* t_ms=\([0-9]*\) .*/\1/p')
    msg=${line#* msg=}
    echo "$msg" | grep -Eq "rank $victim([^0-9]|\$)" || {
      echo "fail $what: rank $r's error does not name rank $victim: $msg"
      return
    }
    dt=$((t - kill_ms))
    [ "$dt" -le "$limit" ] || { echo "fail $what: rank $r reported after $dt ms (limit $limit): $msg"; return; }
    [ "$dt" -gt "$worst" ] && worst=$dt
  done
  if grep -q "FAULT_CHECK_FAILED" "$TMP/job.err"; then
    echo "fail $what: $(grep -m1 FAULT_CHECK_FAILED "$TMP/job.err")"
    return
  fi
  left=$(leftovers)
  [ -z "$left" ] || { echo "fail $what: processes left: $left"; return; }
  shm_list >"$TMP/shm.after"
  new=$(comm -13 "$TMP/shm.before" "$TMP/shm.after" | tr '\n' ' ')
  [ -z "$new" ] || { echo "fail $what: left in /dev/shm: $new"; return; }
  echo "ok $worst"
}

failed=0
printf '%-5s %7s %7s %7s %7s %13s %13s\n' kind trials passed failed hung "median_ms" "max_ms" >"$TMP/tally"
for kind in kill stop; do
  : >"$TMP/times"
  pass=0 bad=0 hung=0
  for n in $(seq 1 "$TRIALS"); do
    res=$(trial "$kind" "$n")
    case "$res" in
      ok*) pass=$((pass + 1)); echo "${res#ok }" >>"$TMP/times" ;;
      *)
        bad=$((bad + 1))
        case "$res" in *HANG*) hung=$((hung + 1)) ;; esac
        echo "FAIL: ${res#fail }" >&2
        for f in "$TMP/job.err" "$TMP/job.out"; do
          [ -f "$f" ] && { echo "---- $(basename "$f") (last 20 lines)" >&2; tail -n 20 "$f" >&2; }
        done
        ;;
    esac
  done
  med=$(sort -n "$TMP/times" | awk '{a[NR]=$1} END {print NR ? a[int((NR+1)/2)] : "-"}')
  max=$(sort -n "$TMP/times" | tail -n 1)
  printf '%-5s %7d %7d %7d %7d %13s %13s\n' "$kind" "$TRIALS" "$pass" "$bad" "$hung" "$med" "${max:--}" >>"$TMP/tally"
  failed=$((failed + bad))
done
echo "chaos: $NP ranks on one host, KAITIAN_TIMEOUT=$TIMEOUT_MS ms (stop); time = last survivor's error after the kill/stop"
cat "$TMP/tally"
[ "$failed" = 0 ] || { echo "FAIL: $failed trial(s) failed" >&2; exit 1; }
echo PASSED
