#!/bin/sh
# sigterm.sh - SIGTERM/SIGHUP to the launcher go to every rank's process
# group; the launcher exits 128+signal and no rank (nor a rank's child in its
# group) is left; ranks that ignore the signal are killed after --grace.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

# Ranks are shells waiting on a marked sleep: both must go.
"$KT" run -n 3 sh -c "$SLEEPER 1000; echo unreachable" >"$TMP/a.out" 2>"$TMP/a.err" &
lpid=$!
wait_marker 7 10 || fail "expected 3 shells + 3 sleeps + launcher, have $(count_marker)"
kill -TERM $lpid
wait $lpid
expect_rc 143 $? "launcher got SIGTERM"
[ "$(count_marker)" = 0 ] || fail "processes left after SIGTERM: $(marker_pids)"
expect_grep 'received SIGTERM' "$TMP/a.err" "launcher message"
grep -q '^kaitian run: rank' "$TMP/a.err" && fail "ranks stopped by the launcher reported as failures"

# Ranks that ignore SIGTERM: SIGKILL after the 1 s grace.
"$KT" run -n 2 --grace 1 sh -c "trap '' TERM; $SLEEPER 1000" >"$TMP/b.out" 2>"$TMP/b.err" &
lpid=$!
wait_marker 5 10 || fail "expected 2 shells + 2 sleeps + launcher, have $(count_marker)"
t0=$(now_ms)
kill -TERM $lpid
wait $lpid
rc=$?
t1=$(now_ms)
expect_rc 143 $rc "launcher got SIGTERM (ranks ignore it)"
[ $((t1 - t0)) -ge 900 ] || fail "ranks killed after $((t1 - t0)) ms, before the grace"
[ $((t1 - t0)) -lt 8000 ] || fail "took $((t1 - t0)) ms to kill ranks that ignore SIGTERM"
[ "$(count_marker)" = 0 ] || fail "processes left after the grace: $(marker_pids)"

# SIGHUP is forwarded too: 128+1.
"$KT" run -n 2 "$SLEEPER" 1000 >"$TMP/c.out" 2>"$TMP/c.err" &
lpid=$!
wait_marker 3 10 || fail "expected 2 sleeps + launcher, have $(count_marker)"
kill -HUP $lpid
wait $lpid
expect_rc 129 $? "launcher got SIGHUP"
[ "$(count_marker)" = 0 ] || fail "processes left after SIGHUP: $(marker_pids)"
echo "PASS sigterm"
