#!/bin/sh
# chaos.sh - failure trials at volume (make chaos TRIALS=N; a few in make test).
# Each trial starts a new job of NP ranks (`kaitian run`, fault_prog chaos: a
# random mix of collectives and sizes from a random seed), waits until every
# rank has run its first operation, then after a random 0-1.5 s picks a
# random rank (linkdown: a random host) and
#   kill:     SIGKILLs it,
#   stop:     SIGSTOPs it (it stays alive but silent past KAITIAN_TIMEOUT, 3 s),
#   linkdown: (--hosts only) takes its host's link down: the host's cable is
#             pulled (its bridge port set down), so every socket between the
#             two sides goes silent, with no reset and no error,
# and checks:
#   * every rank that was not lost returns an error naming a lost rank (kill,
#     stop: the victim; linkdown: a rank of the other side), within 10 s of
#     the kill (stop, linkdown: within the timeout + 10 s); with linkdown the
#     ranks of both sides count as survivors (each side has lost the other):
#     the cut-off host's ranks must end too, with such an error, not hang;
#   * every launcher exits non-zero (kill: the victim's launcher naming the
#     rank as killed by signal 9; linkdown: node 0's launcher naming the node
#     that stopped answering, the others saying they lost node 0's store);
#   * no process of the job remains (--hosts: none in any namespace) and
#     nothing of it is left in /dev/shm (its segments end with a rank's pid;
#     other jobs on the machine may make their own meanwhile);
#   * nothing hangs: a hard watchdog of 60 s per trial (linkdown: 90 s).
# One host (default): NP ranks of one `kaitian run`. --hosts H: H "hosts"
# made of network namespaces (tests/multihost/hosts.sh), NP/H ranks each,
# one `kaitian run --nnodes H` per host; the link comes back up after each
# linkdown trial; the namespaces are removed at the end (skipped, exit 77,
# where `ip netns add` fails).
# TRIALS trials of each kind (default 100; kinds: kill stop, and linkdown with
# --hosts, or those listed in --kinds); prints a tally per kind and exits
# non-zero when any trial failed (each failure is described as it happens).
# CHAOS_VERBOSE=1: one line per trial on stderr.
# Args: [--hosts H] [--kinds K1,K2] KAITIAN_CLI FAULT_PROG [TRIALS [NP]]
HOSTS=0
KINDS=""
while :; do
  case "${1:-}" in
    --hosts) HOSTS=$2; shift 2 ;;
    --kinds) KINDS=$(echo "$2" | tr ',' ' '); shift 2 ;;
    *) break ;;
  esac
done
. "$(dirname "$0")/lib.sh" "$@"
TRIALS=${3:-100}
NP=${4:-4}
TIMEOUT_MS=3000
WATCHDOG_S=60
if [ -z "$KINDS" ]; then
  KINDS="kill stop"
  [ "$HOSTS" -gt 0 ] && KINDS="kill stop linkdown"
fi
if [ "$HOSTS" -gt 0 ]; then
  . "$(dirname "$0")/../multihost/hosts.sh"
  hosts_start chaos "$NP" "$HOSTS" "$TMP"
  # lib.sh's cleanup, and the namespaces removed (a failure if one is left).
  trap 'rc=$?; hosts_down || rc=1; cleanup; exit $rc' EXIT
  PORT=29400
fi

rand() { od -An -N4 -tu4 /dev/urandom | tr -d ' '; }

# Entries of /dev/shm new since shm_snapshot that this trial's job made: a
# segment's name ends with the pid of its communicator's rank 0, one of the
# ranks in $TMP/pid.* (other jobs on the machine may come and go meanwhile).
shm_new_of_job() {
  shm_list >"$TMP/shm.after"
  for e in $(comm -13 "$TMP/shm.before" "$TMP/shm.after"); do
    for f in "$TMP"/pid.*; do
      [ -f "$f" ] && [ "${e##*-}" = "$(cat "$f")" ] && { echo "$e"; break; }
    done
  done | tr '\n' ' '
}

# abandon: a trial failed before its end: kill its job (the next trial must
# not find it).
abandon() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  for p in $(leftovers); do kill -9 "$p" 2>/dev/null; done
  [ -n "$LPID" ] && wait "$LPID" 2>/dev/null
  LPID=""
}

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
  # (cat: job.out may not exist yet, and grep -c of no file prints nothing)
  while [ "$(cat "$TMP/job.out" 2>/dev/null | grep -c 'FAULT_STARTED')" -lt "$NP" ]; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 "$LPID" 2>/dev/null; then
      abandon
      echo "fail $what: the ranks did not all start within 30 s"
      return
    fi
    sleep 0.1
  done
  vpid=$(cat "$TMP/pid.$victim" 2>/dev/null)
  [ -n "$vpid" ] || { abandon; echo "fail $what: rank $victim wrote no pid"; return; }
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
  new=$(shm_new_of_job)
  [ -z "$new" ] || { echo "fail $what: left in /dev/shm: $new"; return; }
  echo "ok $worst"
}

# ---- on several hosts --------------------------------------------------------

# ranks_of_host K: the ranks that run on host K (from their FAULT_STARTED lines).
ranks_of_host() { sed -n 's/^\[\([0-9]*\)\] FAULT_STARTED.*/\1/p' "$TMP/job.$1.out" | sort -n | tr '\n' ' '; }

# names_one_of MSG RANKS...: MSG names one of RANKS.
names_one_of() {
  nm_msg=$1
  shift
  for nm_r in "$@"; do
    echo "$nm_msg" | grep -Eq "rank $nm_r([^0-9]|\$)" && return 0
  done
  return 1
}

launchers_running() {
  lr=0
  for k in $(seq 0 $((HOSTS - 1))); do
    st=$(awk '{print $3}' "/proc/$(cat "$TMP/lpid.$k")/stat" 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && lr=$((lr + 1))
  done
  echo $lr
}

# trial_hosts KIND N: one trial on HOSTS hosts; prints "ok DETECT_MS" or
# "fail REASON" on stdout.
trial_hosts() {
  kind=$1 n=$2
  rm -f "$TMP"/pid.* "$TMP"/job.* "$TMP"/lpid.*
  shm_snapshot
  seed=$(( $(rand) % 1000000 ))
  victim=$(( $(rand) % NP ))
  delay_ms=$(( $(rand) % 1500 ))
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  per=$((NP / HOSTS))
  for k in $(seq 0 $((HOSTS - 1))); do
    # KAITIAN_RUN_LOST_MS=5000: a link down is named within the trial (the
    # default, 30 s, is for loaded hosts; tests/multihost/linkdown.sh).
    hosts_exec "$k" env KAITIAN_JOB_SECRET="$secret" KAITIAN_TIMEOUT=$TIMEOUT_MS KAITIAN_RUN_LOST_MS=5000 \
      "$KT" run -n "$per" --nnodes "$HOSTS" --node-rank "$k" --master "$HOSTS_NET.1:$PORT" --grace 2 \
      "$PROG" chaos "dir=$TMP" "seed=$seed" "mark=$MARK" >"$TMP/job.$k.out" 2>"$TMP/job.$k.err" &
    echo $! >"$TMP/lpid.$k"
  done
  what="$kind trial $n on $HOSTS hosts (seed $seed, rank $victim after $delay_ms ms)"
  i=0
  while [ "$(cat "$TMP"/job.*.out 2>/dev/null | grep -c 'FAULT_STARTED')" -lt "$NP" ]; do
    i=$((i + 1))
    if [ $i -gt 600 ] || [ "$(launchers_running)" -lt "$HOSTS" ]; then
      hosts_kill_all
      echo "fail $what: the ranks did not all start within 60 s"
      return
    fi
    sleep 0.1
  done
  vpid=$(cat "$TMP/pid.$victim" 2>/dev/null)
  [ -n "$vpid" ] || { hosts_kill_all; echo "fail $what: rank $victim wrote no pid"; return; }
  vhost=""
  for k in $(seq 0 $((HOSTS - 1))); do
    case " $(ranks_of_host "$k")" in *" $victim "*) vhost=$k ;; esac
  done
  [ -n "$vhost" ] || { hosts_kill_all; echo "fail $what: rank $victim is on no host"; return; }
  lost=$victim
  if [ "$kind" = linkdown ]; then
    lost=$(ranks_of_host "$vhost")
    what="$kind trial $n on $HOSTS hosts (seed $seed, host $vhost with ranks ${lost% } after $delay_ms ms)"
  fi
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill_ms=$(now_ms)
  case $kind in
    kill) kill -9 "$vpid" ;;
    stop) kill -STOP "$vpid" ;;
    linkdown) hosts_link "$vhost" down ;;
  esac
  # Watchdog: every launcher must be done within WATCHDOG_S (linkdown: 90 s).
  limit_s=$WATCHDOG_S
  [ "$kind" = linkdown ] && limit_s=90
  i=0
  while [ "$(launchers_running)" -gt 0 ]; do
    i=$((i + 1))
    if [ $i -gt $((limit_s * 10)) ]; then
      procs=$(for k in $(seq 0 $((HOSTS - 1))); do
        for p in $(hosts_pids "$k"); do echo "host $k: $(ps -o pid=,stat=,args= -p "$p" | cut -c1-100)"; done
      done | tr '\n' ';')
      hosts_kill_all
      for k in $(seq 0 $((HOSTS - 1))); do wait "$(cat "$TMP/lpid.$k")" 2>/dev/null; done
      [ "$kind" = linkdown ] && hosts_link "$vhost" up
      echo "fail $what: HANG, launcher(s) still running after $limit_s s; processes: $procs"
      return
    fi
    sleep 0.1
  done
  [ "$kind" = linkdown ] && hosts_link "$vhost" up
  for k in $(seq 0 $((HOSTS - 1))); do
    wait "$(cat "$TMP/lpid.$k")"
    rc=$?
    [ "$rc" -ne 0 ] || { echo "fail $what: the launcher of host $k exited 0"; return; }
  done
  # A link down: node 0's launcher names the node it lost; every other
  # launcher says it lost node 0 (the store), or relays node 0's line.
  if [ "$kind" = linkdown ]; then
    grep -Eq "^kaitian run: node [1-9][0-9]* \(host [^)]*\) stopped answering" "$TMP/job.0.err" || {
      echo "fail $what: node 0's launcher does not name the node it lost: $(grep '^kaitian run' "$TMP/job.0.err" | tail -n 3)"
      return
    }
    for k in $(seq 1 $((HOSTS - 1))); do
      grep -Eq "^kaitian run: (node $k lost the rendezvous store|node [0-9]+ \(host [^)]*\) stopped answering)" \
        "$TMP/job.$k.err" || {
        echo "fail $what: node $k's launcher does not say it lost node 0: $(grep '^kaitian run' "$TMP/job.$k.err" | tail -n 3)"
        return
      }
    done
  fi
  if [ "$kind" = kill ] && ! grep -Eq "rank $victim \(pid $vpid\) was killed by signal 9" "$TMP/job.$vhost.err"; then
    echo "fail $what: host $vhost's launcher does not name rank $victim as killed by signal 9"
    return
  fi
  limit=10000
  [ "$kind" = kill ] || limit=$((TIMEOUT_MS + 10000))
  worst=0
  for r in $(seq 0 $((NP - 1))); do
    case " $lost " in
      *" $r "*) [ "$kind" = linkdown ] || continue; expect=$(for k in $(seq 0 $((HOSTS - 1))); do [ "$k" = "$vhost" ] || ranks_of_host "$k"; done) ;;
      *) expect=$lost ;;
    esac
    # shellcheck disable=SC2086
    line=$(cat "$TMP"/job.*.err | grep -m1 "^\[$r\] FAULT_ERROR ") || {
      echo "fail $what: rank $r printed no error"
      return
    }
    t=$(echo "$line" | sed -n 's/.* t_ms=\([0-9]*\) .*/\1/p')
    msg=${line#* msg=}
    # shellcheck disable=SC2086
    names_one_of "$msg" $expect || {
      echo "fail $what: rank $r's error names none of the ranks it lost ($(echo $expect)): $msg"
      return
    }
    dt=$((t - kill_ms))
    [ "$dt" -le "$limit" ] || { echo "fail $what: rank $r reported after $dt ms (limit $limit): $msg"; return; }
    [ "$dt" -gt "$worst" ] && worst=$dt
  done
  if cat "$TMP"/job.*.err | grep -q "FAULT_CHECK_FAILED"; then
    echo "fail $what: $(cat "$TMP"/job.*.err | grep -m1 FAULT_CHECK_FAILED)"
    return
  fi
  for k in $(seq 0 $((HOSTS - 1))); do
    left=$(hosts_pids "$k")
    [ -z "$left" ] || { echo "fail $what: processes left on host $k: $left"; hosts_kill_all; return; }
  done
  left=$(leftovers)
  [ -z "$left" ] || { echo "fail $what: processes left: $left"; return; }
  new=$(shm_new_of_job)
  [ -z "$new" ] || { echo "fail $what: left in /dev/shm: $new"; return; }
  echo "ok $worst"
}

failed=0
printf '%-8s %7s %7s %7s %7s %13s %13s\n' kind trials passed failed hung "median_ms" "max_ms" >"$TMP/tally"
for kind in $KINDS; do
  : >"$TMP/times"
  pass=0 bad=0 hung=0
  for n in $(seq 1 "$TRIALS"); do
    if [ "$HOSTS" -gt 0 ]; then
      PORT=$((PORT + 2)) # each job its own store port (PORT+1 is MASTER_PORT)
      res=$(trial_hosts "$kind" "$n")
    else
      res=$(trial "$kind" "$n")
    fi
    [ "${CHAOS_VERBOSE:-0}" = 1 ] && echo "$(date +%T) $kind $n: $res" >&2
    case "$res" in
      ok*) pass=$((pass + 1)); echo "${res#ok }" >>"$TMP/times" ;;
      *)
        bad=$((bad + 1))
        case "$res" in *HANG*) hung=$((hung + 1)) ;; esac
        echo "FAIL: ${res#fail }" >&2
        for f in "$TMP"/job.*err "$TMP"/job.*out; do
          [ -f "$f" ] && { echo "---- $(basename "$f") (last 20 lines)" >&2; tail -n 20 "$f" >&2; }
        done
        ;;
    esac
  done
  med=$(sort -n "$TMP/times" | awk '{a[NR]=$1} END {print NR ? a[int((NR+1)/2)] : "-"}')
  max=$(sort -n "$TMP/times" | tail -n 1)
  printf '%-8s %7d %7d %7d %7d %13s %13s\n' "$kind" "$TRIALS" "$pass" "$bad" "$hung" "$med" "${max:--}" >>"$TMP/tally"
  failed=$((failed + bad))
done
if [ "$HOSTS" -gt 0 ]; then
  echo "chaos: $NP ranks on $HOSTS hosts (network namespaces), KAITIAN_TIMEOUT=$TIMEOUT_MS ms (stop, linkdown); time = last survivor's error after the kill/stop/link down"
else
  echo "chaos: $NP ranks on one host, KAITIAN_TIMEOUT=$TIMEOUT_MS ms (stop); time = last survivor's error after the kill/stop"
fi
cat "$TMP/tally"
[ "$failed" = 0 ] || { echo "FAIL: $failed trial(s) failed" >&2; exit 1; }
echo PASSED
