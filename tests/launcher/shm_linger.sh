#!/bin/sh
# shm_linger.sh - ranks still waiting for the shared-memory segment when a
# rank fails its setup stop at once with that rank's reason, even while the
# failed rank's process lives on. Python (ctypes, no torch) plays the ranks,
# so this test runs outside the sanitizer builds. Skipped (77) where a mount
# namespace cannot be made (needs root) or there is no python3.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3) || { echo "SKIP: no python3"; rm -rf "$TMP"; exit 77; }
need_mount_ns
small() { with_shm 2m "$@"; } # run "$@" with a 2 MiB /dev/shm

# Rank 0 runs out of a 2 MiB /dev/shm (the chunk size set, so that the sizes
# do not shrink to fit) and removes the segment while other
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
small env KAITIAN_CONNECT_TIMEOUT=30000 KAITIAN_SHM_CHUNK_BYTES=1048576 PYTHON="$PY" "$KT" run -n 4 "$TMP/linger.py" "$(dirname "$KT")/libkaitian.so" \
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
rm -rf "$TMP"
echo "PASS shm_linger"
