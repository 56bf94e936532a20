#!/bin/sh
# output.sh - rank output goes through the launcher line by line: "[R] "
# before every line on the same stream it was written to, no line lost or cut
# by another rank's, a partial last line flushed at exit; --no-prefix.
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

N=4
LINES=20000
# Each rank: many short lines in large writes on both streams, one 300 KB
# line, and a last line without a newline.
"$KT" run -n $N sh -c "
  seq 1 $LINES | sed \"s/^/line \$RANK /\"
  seq 1 $LINES | sed \"s/^/eline \$RANK /\" >&2
  head -c 300000 /dev/zero | tr '\\000' x; echo
  printf 'tail-%s' \$RANK" >"$TMP/a.out" 2>"$TMP/a.err"
expect_rc 0 $? "run"

check() { # FILE WORD
  awk -v n=$N -v lines=$LINES -v word="$2" '
    $0 ~ "^\\[[0-9]+\\] " word " [0-9]+ [0-9]+$" {
      r = substr($1, 2, length($1) - 2)
      if ($3 != r) { bad++; print "rank mismatch: " $0 > "/dev/stderr" }
      if ($4 != last[r] + 1) { bad++; print "out of order or lost: " $0 > "/dev/stderr" }
      last[r] = $4; cnt[r]++; next
    }
    /^\[[0-9]+\] x+$/ { if (length($0) != 300000 + length($1) + 1) bad++; long++; next }
    /^\[[0-9]+\] tail-[0-9]+$/ { r = substr($1, 2, length($1) - 2); if ($2 != "tail-" r) bad++; tail++; next }
    { bad++; print "unexpected line: " substr($0, 1, 100) > "/dev/stderr" }
    END {
      for (r = 0; r < n; r++) if (cnt[r] != lines) { bad++; print "rank " r ": " cnt[r] + 0 " lines of " lines > "/dev/stderr" }
      print bad + 0, long + 0, tail + 0
    }' "$1"
}
set -- $(check "$TMP/a.out" line)
[ "$1" = 0 ] || fail "stdout: $1 bad lines"
[ "$2" = $N ] || fail "stdout: $2 long lines, expected $N whole ones"
[ "$3" = $N ] || fail "stdout: $3 partial last lines, expected $N"
set -- $(check "$TMP/a.err" eline)
[ "$1" = 0 ] || fail "stderr: $1 bad lines"
grep -q ' line ' "$TMP/a.err" && fail "stdout lines went to stderr"

# --no-prefix: lines pass unchanged (and still whole).
"$KT" run -n 2 --no-prefix sh -c 'echo "plain $RANK"; echo "perr $RANK" >&2' >"$TMP/b.out" 2>"$TMP/b.err"
expect_rc 0 $? "run --no-prefix"
[ "$(sort "$TMP/b.out" | tr '\n' ,)" = "plain 0,plain 1," ] || fail "--no-prefix stdout: $(cat "$TMP/b.out")"
[ "$(sort "$TMP/b.err" | tr '\n' ,)" = "perr 0,perr 1," ] || fail "--no-prefix stderr: $(cat "$TMP/b.err")"
echo "PASS output"
