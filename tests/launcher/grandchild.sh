#!/bin/sh
# grandchild.sh - processes a rank leaves behind, detached with setsid or
# double-forked, and still holding the rank's stdout, are killed when the job
# ends: the launcher exits at once with the ranks' status, nothing survives.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

t0=$(now_ms)
"$KT" run -n 2 sh -c "
  setsid $SLEEPER 1000 &
  gc=\$!
  echo \"gc \$gc\"
  ( setsid $SLEEPER 1001 & ) &
  sleep 0.3
  kill -0 \$gc && echo \"alive \$gc\"
  exit 0" >"$TMP/a.out" 2>"$TMP/a.err"
rc=$?
t1=$(now_ms)
expect_rc 0 $rc "ranks exit 0"
[ "$(grep -c '^\[[01]\] alive [0-9]' "$TMP/a.out")" = 2 ] || fail "grandchildren were not running"
[ $((t1 - t0)) -lt 8000 ] || fail "launcher waited $((t1 - t0)) ms on the grandchildren"
n=$(count_marker)
[ "$n" = 0 ] || fail "$n detached grandchildren survived the launcher: $(marker_pids)"
for p in $(sed -n 's/^\[[01]\] gc \([0-9]*\)$/\1/p' "$TMP/a.out"); do
  if [ -r /proc/$p/cmdline ] && grep -qa "$(mark_pattern)" /proc/$p/cmdline; then fail "grandchild $p alive"; fi
done

# Same when a rank fails: descendants go too.
"$KT" run -n 2 --grace 1 sh -c "setsid $SLEEPER 1000 & sleep 0.2; exit 5" >"$TMP/b.out" 2>"$TMP/b.err"
expect_rc 5 $? "rank exits 5"
[ "$(count_marker)" = 0 ] || fail "grandchildren survived a failed job: $(marker_pids)"
# A descendant that writes without pause into the rank's stdout must not
# keep the launcher from finishing once the ranks are done.
cp "$(command -v yes)" "$TMP/${MARK}y"
t0=$(now_ms)
"$KT" run -n 2 sh -c "$TMP/${MARK}y & sleep 0.3; exit 0" >/dev/null 2>"$TMP/c.err"
rc=$?
t1=$(now_ms)
expect_rc 0 $rc "ranks exit 0 leaving a writer behind"
[ $((t1 - t0)) -lt 8000 ] || fail "launcher took $((t1 - t0)) ms with a writer left behind"
[ "$(count_marker)" = 0 ] || fail "the writer survived: $(marker_pids)"
echo "PASS grandchild"
