#!/bin/sh
# shm_small.sh - a /dev/shm too small for the communicator's segment (a private
# 2 MiB tmpfs in a mount namespace, as in a container with a small /dev/shm)
# is an error at init naming /dev/shm and the variables that size the segment,
# not a SIGBUS in the middle of an operation; with KAITIAN_TRANSPORT=tcp the
# same job runs. Skipped (77) where a mount namespace cannot be made (needs root).
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

need_mount_ns
small() { with_shm 2m "$@"; } # run "$@" with a 2 MiB /dev/shm
small "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" != 0 ] || fail "a job whose segment does not fit /dev/shm exited 0"
grep -q "SIGBUS\|signal 7" "$TMP/err" && fail "a rank died of SIGBUS instead of reporting the error"
expect_grep 'No space left on device \(is /dev/shm large enough\? KAITIAN_SHM_CHUNK_BYTES' "$TMP/err" \
  "rank 0 names /dev/shm and the variables"
# Room for one rank's part of the segment (about 4.5 MiB each with these
# sizes) but not for both: the rank that runs out reports it, the other stops
# at once with that rank's reason instead of waiting for it.
smallish() { with_shm 6m "$@"; } # run "$@" with a 6 MiB /dev/shm
t0=$(now_ms)
smallish env KAITIAN_SHM_CHUNK_BYTES=1048576 KAITIAN_SHM_P2P_BYTES=262144 \
  "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
t1=$(now_ms)
[ "$rc" != 0 ] || fail "a job whose segment fits /dev/shm for one rank only exited 0"
grep -q "SIGBUS\|signal 7" "$TMP/err" && fail "a rank died of SIGBUS instead of reporting the error"
expect_grep '^\[[01]\] .*rank ([01]): cannot reserve its [0-9]+ bytes of shared memory .*No space left on device' \
  "$TMP/err" "the rank that ran out says so"
expect_grep '^\[[01]\] .*rank [01]: rank [01] failed while setting up shared memory: rank [01]: cannot reserve its' \
  "$TMP/err" "the other rank names it and its reason"
[ $((t1 - t0)) -lt 20000 ] || fail "the failure took $((t1 - t0)) ms to stop the job"
small env KAITIAN_TRANSPORT=tcp "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the same job over TCP"
rm -rf "$TMP"
echo "PASS shm_small"
