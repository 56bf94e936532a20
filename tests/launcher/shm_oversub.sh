#!/bin/sh
# shm_oversub.sh - shared-memory waits yield instead of spinning exactly when
# a host's ranks outnumber the CPUs they may run on together (the union of
# their affinity masks, not the machine's online CPUs): `taskset -c X kaitian
# run -n 2` puts both ranks on one CPU, where spinning would burn the slice
# the peer needs. Checked through each rank's INFO line about the segment.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

C=$(nproc)
FIRST=$(awk '/^Cpus_allowed_list/ { split($2, a, "[,-]"); print a[1] }' /proc/self/status)

# job NAME N [launcher prefix...]: run a 2-iteration barrier bench on N ranks.
job() {
  name=$1 n=$2
  shift 2
  KAITIAN_DEBUG=INFO "$@" "$KT" run -n "$n" "$KT" bench -C barrier -n 2 -w 0 >"$TMP/$name.out" 2>&1
  expect_rc 0 $? "$name"
}
# expect NAME N CPUS yes|no: every rank's line says N ranks on CPUS CPU(s),
# yielding or not.
expect() {
  lines=$(grep -c "shared memory .*: $2 ranks on $3 CPU(s)," "$TMP/$1.out")
  [ "$lines" = "$2" ] || fail "$1: expected $2 lines '$2 ranks on $3 CPU(s)', found $lines"
  yielding=$(grep -c "(oversubscribed: yielding)" "$TMP/$1.out")
  if [ "$4" = yes ]; then want=$2; else want=0; fi
  [ "$yielding" = "$want" ] || fail "$1: $yielding ranks yield, expected $want"
}

if [ "$C" -ge 2 ]; then
  # Bound to one CPU each (the launcher's default): the ranks may spin.
  job bound 2
  expect bound 2 "$C" no
  # Both ranks confined to one CPU by taskset around the launcher.
  job one_cpu 2 taskset -c "$FIRST"
  expect one_cpu 2 1 yes
fi
if [ "$C" -le 16 ]; then
  N=$((C + 1))
  job over "$N"
  expect over "$N" "$C" yes
fi
echo "PASS"
