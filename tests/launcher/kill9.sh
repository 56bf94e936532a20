#!/bin/sh
# kill9.sh - a launcher killed with SIGKILL takes its ranks with it
# (PR_SET_PDEATHSIG in every rank).
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

"$KT" run -n 3 "$SLEEPER" 1000 >"$TMP/a.out" 2>"$TMP/a.err" &
lpid=$!
wait_marker 4 10 || fail "expected 3 ranks + launcher, have $(count_marker)"
kill -9 $lpid
wait $lpid
expect_rc 137 $? "launcher killed"
wait_marker 0 5 || fail "ranks survived the launcher's SIGKILL: $(marker_pids)"
echo "PASS kill9"
