#!/bin/sh
# exit_code.sh - the launcher exits with the first failing rank's code and
# names it; survivors get --grace to exit (their messages are printed), then
# are stopped; several failures give a summary; all zero gives 0.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

"$KT" run -n 3 sh -c 'exit 0' >"$TMP/ok.out" 2>"$TMP/ok.err"
expect_rc 0 $? "all ranks exit 0"
[ -s "$TMP/ok.err" ] && fail "unexpected launcher messages on success"

# Rank 1 exits 3; the others would sleep forever.
t0=$(now_ms)
"$KT" run -n 3 --grace 1 sh -c "if [ \$RANK = 1 ]; then exit 3; fi; exec $SLEEPER 1000" \
  >"$TMP/a.out" 2>"$TMP/a.err"
rc=$?
t1=$(now_ms)
expect_rc 3 $rc "rank 1 exits 3"
expect_grep '^kaitian run: rank 1 \(pid [0-9]+\) exited with code 3$' "$TMP/a.err" "failure line"
[ "$(grep -c '^kaitian run: rank' "$TMP/a.err")" = 1 ] || fail "stopped ranks reported as failures"
[ $((t1 - t0)) -ge 900 ] || fail "survivors stopped after $((t1 - t0)) ms, before the 1 s grace"
[ $((t1 - t0)) -lt 8000 ] || fail "stopping took $((t1 - t0)) ms"
[ "$(count_marker)" = 0 ] || fail "ranks left running: $(marker_pids)"

# A survivor that fails by itself within the grace period is heard, and
# two failures give a summary; the exit code is still the first one's.
"$KT" run -n 3 --grace 3 sh -c "
  case \$RANK in
    0) sleep 1; echo 'survivor: peer 2 is gone' >&2; exit 1;;
    2) exit 4;;
    *) exec $SLEEPER 1000;;
  esac" >"$TMP/b.out" 2>"$TMP/b.err"
expect_rc 4 $? "rank 2 exits 4 first"
expect_grep '^\[0\] survivor: peer 2 is gone$' "$TMP/b.err" "survivor's message"
expect_grep '^kaitian run: rank 2 \(pid [0-9]+\) exited with code 4$' "$TMP/b.err" "first failure"
expect_grep '^kaitian run: rank 0 \(pid [0-9]+\) exited with code 1$' "$TMP/b.err" "second failure"
expect_grep '^kaitian run: 2 ranks failed: rank 2 exited with code 4 \(first\); rank 0 exited with code 1$' \
  "$TMP/b.err" "summary"
[ "$(count_marker)" = 0 ] || fail "ranks left running: $(marker_pids)"
echo "PASS exit_code"
