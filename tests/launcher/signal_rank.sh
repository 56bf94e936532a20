#!/bin/sh
# signal_rank.sh - a rank killed by a signal: the launcher exits 128+9, names
# the rank, pid and signal, and leaves no process behind.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

"$KT" run -n 3 --grace 1 sh -c "
  if [ \$RANK = 2 ]; then echo \"pid \$\$\"; kill -9 \$\$; fi
  exec $SLEEPER 1000" >"$TMP/a.out" 2>"$TMP/a.err"
expect_rc 137 $? "rank 2 killed by SIGKILL"
pid=$(sed -n 's/^\[2\] pid \([0-9]*\)$/\1/p' "$TMP/a.out")
[ -n "$pid" ] || fail "rank 2 did not print its pid"
expect_grep "^kaitian run: rank 2 \\(pid $pid\\) was killed by signal 9 \\(SIGKILL\\)\$" "$TMP/a.err" "failure line"
[ "$(count_marker)" = 0 ] || fail "processes left: $(marker_pids)"

# A rank that dies of SIGSEGV: 128+11.
"$KT" run -n 1 sh -c 'ulimit -c 0; kill -SEGV $$' >"$TMP/b.out" 2>"$TMP/b.err"
expect_rc 139 $? "rank killed by SIGSEGV"
expect_grep '^kaitian run: rank 0 \(pid [0-9]+\) was killed by signal 11 \(SIGSEGV' "$TMP/b.err" "SIGSEGV line"
echo "PASS signal_rank"
