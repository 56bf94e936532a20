#!/bin/sh
# shm_cleanup.sh - shared-memory segments of a job (named kaitian-<job id>-...)
# that a rank left behind are removed when the launcher exits, whatever the
# outcome; other jobs' segments are not touched.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

other="/dev/shm/kaitian-otherjob-$$"
: >"$other"
# Each rank leaves a segment named after its job, as a rank killed between
# creating and unlinking one would; rank 1 then fails.
"$KT" run -n 2 sh -c ': >/dev/shm/kaitian-$KAITIAN_JOB_ID-test-$RANK; echo $KAITIAN_JOB_ID >'"$TMP"'/job; [ $RANK = 0 ]' \
  >"$TMP/out" 2>"$TMP/err"
rc=$?
job=$(cat "$TMP/job")
[ -n "$job" ] || fail "ranks saw no KAITIAN_JOB_ID"
expect_rc 1 $rc "rank 1 exits 1"
left=$(ls /dev/shm | grep "^kaitian-$job-" || true)
[ -z "$left" ] || fail "segments of the job left behind: $left"
expect_grep 'removed leftover shared memory /kaitian-' "$TMP/err" "the launcher says what it removed"
[ -e "$other" ] || fail "another job's segment was removed"
rm -f "$other"
echo "PASS shm_cleanup"
