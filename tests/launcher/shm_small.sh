#!/bin/sh
# shm_small.sh - a /dev/shm too small for the communicator's segment (a private
# 2 MiB tmpfs in a mount namespace, as in a container with a small /dev/shm)
# is an error at init naming /dev/shm and the variables that size the segment,
# not a SIGBUS in the middle of an operation; with KAITIAN_TRANSPORT=tcp the
# same job runs; ranks still waiting for the segment when a rank fails stop at
# once with its reason. Skipped (77) where a mount namespace cannot be made (needs root).
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

if ! unshare --mount sh -c 'mount -t tmpfs -o size=2m tmpfs /dev/shm' 2>"$TMP/unshare"; then
  echo "SKIP: cannot mount a small /dev/shm in a mount namespace: $(cat "$TMP/unshare")"
  rm -rf "$TMP"
  exit 77
fi
small() { # run "$@" with a 2 MiB /dev/shm
  unshare --mount sh -c 'mount -t tmpfs -o size=2m tmpfs /dev/shm && exec "$@"' sh "$@"
}
small "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" != 0 ] || fail "a job whose segment does not fit /dev/shm exited 0"
grep -q "SIGBUS\|signal 7" "$TMP/err" && fail "a rank died of SIGBUS instead of reporting the error"
expect_grep 'No space left on device \(is /dev/shm large enough\? KAITIAN_SHM_CHUNK_BYTES' "$TMP/err" \
  "rank 0 names /dev/shm and the variables"
# Room for one rank's part of the segment (about 4.5 MiB each with these
# sizes) but not for both: the rank that runs out reports it, the other stops
# at once with that rank's reason instead of waiting for it.
smallish() { # run "$@" with a 6 MiB /dev/shm
  unshare --mount sh -c 'mount -t tmpfs -o size=6m tmpfs /dev/shm && exec "$@"' sh "$@"
}
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
# Rank 0 runs out of a 2 MiB /dev/shm and removes the segment while other
# ranks may still be waiting for it to appear, then stays alive (as a Python
# program catching the error would): they stop within moments with its
# reason, from its notice on their control sockets, instead of waiting for
# KAITIAN_CONNECT_TIMEOUT for a segment that will never come back.
cat >"$TMP/linger.py" <<'PY'
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.kt_last_error.restype = ctypes.c_char_p
comm = ctypes.c_void_p()
t0 = time.monotonic()
rc = lib.kt_comm_init_env(ctypes.byref(comm))
ms = int((time.monotonic() - t0) * 1000)
print(f"init rc={rc} after {ms} ms: {lib.kt_last_error().decode()}", flush=True)
if rc != 0 and os.environ["RANK"] == "0":
    time.sleep(8)
PY
small env KAITIAN_CONNECT_TIMEOUT=30000 "$KT" run -n 4 "$TMP/linger.py" "$(dirname "$KT")/libkaitian.so" \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the lingering job"
for r in 1 2 3; do
  line=$(grep "^\[$r\] init rc=" "$TMP/out") || fail "rank $r printed no result"
  ms=$(echo "$line" | sed -n 's/.* after \([0-9]*\) ms:.*/\1/p')
  case "$line" in *"rc=0 "*) fail "rank $r: init succeeded: $line" ;; esac
  [ "$ms" -lt 4000 ] || fail "rank $r waited $ms ms for rank 0 (alive, failed): $line"
  # Rank 0's reason, or its own when it got as far as reserving its part.
  echo "$line" | grep -Eq "rank [0$r]: cannot reserve its [0-9]+ bytes of shared memory" ||
    fail "rank $r gives neither rank 0's reason nor its own: $line"
done
small env KAITIAN_TRANSPORT=tcp "$KT" run -n 2 "$KT" bench -C allreduce -b 8 -e 1K -n 2 -w 0 -c 1 \
  >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the same job over TCP"
rm -rf "$TMP"
echo "PASS shm_small"
