#!/bin/sh
# shm_small.sh - a small /dev/shm (a private tmpfs in a mount namespace, as in
# a container; Docker and Kubernetes give 64 MB):
#  - with the default sizes the segment shrinks to fit, with one warning, and
#    the job runs and checks its results (collectives and send/recv);
#  - where even the smallest sizes do not fit, or sizes the user set do not,
#    init fails naming /dev/shm and the variables, never a SIGBUS later;
#  - a point-to-point ring is reserved when first used: no room for it is an
#    error of that op, naming the ring, and the peer stops at once;
#  - with KAITIAN_TRANSPORT=tcp the job needs no /dev/shm at all;
#  - a job's later communicators leave the room its earlier ones counted for
#    their rings (they shrink, or fail at creation naming it), so no
#    send/recv of an earlier one fails later for want of it (with FAULT_PROG).
# Skipped (77) where a mount namespace cannot be made (needs root).
# Args: KAITIAN_CLI [FAULT_PROG]
. "$(dirname "$0")/lib.sh" "$@"

need_mount_ns
no_sigbus() { grep -q "SIGBUS\|signal 7" "$TMP/err" && fail "$1: a rank died of SIGBUS instead of reporting the error"; }

# 1. Defaults in 2 MiB: 1 MiB regions would need 8 MiB; they shrink (and the
# rings with them) and the job runs, every result checked.
with_shm 2m "$KT" run -n 2 "$KT" bench -C allreduce,broadcast,allgather,sendrecv -b 8 -e 4M -f 16 -n 2 -w 0 -c 1 \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the job with default sizes in a 2 MiB /dev/shm"
no_sigbus "defaults in 2 MiB"
expect_grep 'rank 0: /dev/shm has [0-9.]+ MiB free, too little for the shared memory of 2 ranks with the default sizes: regions of [0-9]+ KiB instead of 1024 KiB' \
  "$TMP/err" "rank 0 says the sizes shrank and why"
[ "$(grep -c '/dev/shm has' "$TMP/err")" = 1 ] || fail "the shrink warning is printed once per host: $(cat "$TMP/err")"
grep -q '# wrong values: 0 OK' "$TMP/out" || fail "results not checked OK: $(tail -5 "$TMP/out")"

# 1b. Docker's and Kubernetes' default, 64 MB, and 16 ranks: 1 MiB regions and
# 256 KiB rings would need 128 MiB (init failed here before the sizes shrank).
with_shm 64m "$KT" run -n 16 "$KT" bench -C allreduce,sendrecv -b 8 -e 1M -f 64 -n 2 -w 0 -c 1 \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "16 ranks with default sizes in a 64 MiB /dev/shm"
expect_grep 'rank 0: /dev/shm has [0-9.]+ MiB free, too little for the shared memory of 16 ranks' "$TMP/err" \
  "rank 0 says the sizes shrank (16 ranks)"
grep -q '# wrong values: 0 OK' "$TMP/out" || fail "results not checked OK (16 ranks): $(tail -5 "$TMP/out")"

# 2. Defaults, but /dev/shm too small even for the smallest sizes (64 KiB
# regions: 512 KiB for 2 ranks): an error at init naming /dev/shm.
with_shm 256k "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" != 0 ] || fail "a job whose segment cannot fit /dev/shm at any size exited 0"
no_sigbus "256 KiB"
expect_grep 'No space left on device \(is /dev/shm large enough\? KAITIAN_SHM_CHUNK_BYTES' "$TMP/err" \
  "the error names /dev/shm and the variables"

# 3. Sizes the user set are kept: room for one rank's part of the segment
# (4 MiB each) but not for both. The rank that runs out reports it, the other
# stops at once with that rank's reason instead of waiting for it. (Rank 0
# reserves its part before the others start on theirs: before, both could run
# out at once, each naming only itself.)
t0=$(now_ms)
with_shm 6m env KAITIAN_SHM_CHUNK_BYTES=1048576 KAITIAN_SHM_P2P_BYTES=262144 \
  "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
t1=$(now_ms)
[ "$rc" != 0 ] || fail "a job whose segment fits /dev/shm for one rank only exited 0"
no_sigbus "6 MiB, sizes set"
expect_grep '^\[[01]\] .*rank ([01]): cannot reserve its [0-9]+ bytes of shared memory .*No space left on device' \
  "$TMP/err" "the rank that ran out says so"
expect_grep '^\[[01]\] .*rank [01]: rank [01] failed while setting up shared memory: rank [01]: cannot reserve its' \
  "$TMP/err" "the other rank names it and its reason"
[ $((t1 - t0)) -lt 20000 ] || fail "the failure took $((t1 - t0)) ms to stop the job"
grep -q '/dev/shm has' "$TMP/err" && fail "sizes the user set were changed: $(cat "$TMP/err")"

# 4. Rings are reserved when first used: 2 x 1 MiB rings do not fit beside
# 512 KiB of regions in 2 MiB. Collectives run; the send/recv that needs the
# second ring fails naming it, and the peer stops with that reason.
t0=$(now_ms)
with_shm 2m env KAITIAN_SHM_CHUNK_BYTES=65536 KAITIAN_SHM_P2P_BYTES=1048576 \
  "$KT" run -n 2 "$KT" bench -C allreduce,sendrecv -b 1K -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
t1=$(now_ms)
[ "$rc" != 0 ] || fail "a job whose second ring does not fit /dev/shm exited 0"
no_sigbus "rings"
grep -q '^\[0\] *1024 .*allreduce\|^\[0\] *1024 .*sum' "$TMP/out" || fail "the allreduce before the send/recv did not run: $(cat "$TMP/out")"
expect_grep 'cannot reserve the 1048576-byte shared-memory ring to rank [01]: No space left on device \(is /dev/shm large enough\? KAITIAN_SHM_P2P_BYTES' \
  "$TMP/err" "the rank without room for its ring says so"
# Both ranks reserve at once: either only one runs out (the other gets its
# abort notice) or both do (each reports its own); both name the ring.
[ "$(grep -c 'cannot reserve the 1048576-byte shared-memory ring' "$TMP/err")" -ge 2 ] ||
  fail "not both ranks named the ring: $(cat "$TMP/err")"
[ $((t1 - t0)) -lt 20000 ] || fail "the ring failure took $((t1 - t0)) ms to stop the job"

# 5. TCP needs no /dev/shm.
with_shm 2m env KAITIAN_TRANSPORT=tcp "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the same job over TCP"
# 6. Three communicators made first (the job's and two split off it), then a
# send/recv on each, newest first: the first one's rings are reserved last.
# In 8 MiB the second and third used to take the room the first had counted
# for its rings, and its send/recv failed ("cannot reserve the 262144-byte
# shared-memory ring"); now each leaves the others' room and shrinks.
FAULT=${2:-}
if [ -n "$FAULT" ]; then
  with_shm 8m env KAITIAN_DEBUG=INFO "$KT" run -n 2 "$FAULT" comms count=3 bytes=65536 "mark=$MARK" \
    >"$TMP/out" 2>"$TMP/err"
  expect_rc 0 $? "three communicators in 8 MiB, their rings used newest first"
  no_sigbus "three communicators"
  [ "$(grep -c 'FAULT_OK rank=[01] comms count=3' "$TMP/out")" = 2 ] ||
    fail "not both ranks checked all three communicators: $(cat "$TMP/out" "$TMP/err")"
  expect_grep 'MiB of it kept for the rings of this job.s other communicators here' "$TMP/err" \
    "a later communicator says (at INFO) it left room for the earlier ones' rings"
  # 7. A fourth and a fifth do not fit beside the room the first three keep:
  # they run over TCP, with a warning that says why, and every send/recv of
  # all five works.
  with_shm 8m "$KT" run -n 2 "$FAULT" comms count=5 bytes=65536 "mark=$MARK" >"$TMP/out" 2>"$TMP/err"
  expect_rc 0 $? "five communicators in 8 MiB, the last two over TCP"
  no_sigbus "five communicators"
  [ "$(grep -c 'FAULT_OK rank=[01] comms count=5' "$TMP/out")" = 2 ] ||
    fail "not both ranks checked all five communicators: $(cat "$TMP/out" "$TMP/err")"
  expect_grep 'rank 0: /dev/shm has [0-9.]+ MiB free and [0-9.]+ MiB of it is kept for the rings of this job.s other communicators on this host: too little for the shared memory of a communicator of 2 ranks .* use TCP instead' \
    "$TMP/err" "the creator says why a communicator runs over TCP"
  [ "$(grep -c 'use TCP instead' "$TMP/err")" = 1 ] || fail "the TCP warning is not printed once per job: $(cat "$TMP/err")"
  grep -q 'cannot reserve the .*ring' "$TMP/err" && fail "a ring could not be reserved: $(cat "$TMP/err")"
fi
rm -rf "$TMP"
echo "PASS shm_small"
