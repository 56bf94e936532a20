#!/bin/sh
# bind.sh - `kaitian run --bind`: with auto (the default) local rank i runs on
# block i of the launcher's CPUs (contiguous in CPU order, sizes differing by
# at most 1, together all of them); with none, or with more ranks than CPUs,
# every rank may run on all of the launcher's CPUs; taskset around the
# launcher is honoured; OMP_NUM_THREADS is the size of the rank's block
# (unbound: the launcher's CPUs / N, at least 1).
# Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"

# The CPUs in a Cpus_allowed_list line, expanded: "0-2,5" -> "0 1 2 5".
expand() {
  awk '/^Cpus_allowed_list/ { n = split($2, a, ",");
         for (i = 1; i <= n; i++) { m = split(a[i], b, "-"); hi = m > 1 ? b[2] : b[1];
           for (c = b[1] + 0; c <= hi + 0; c++) printf "%d ", c } }'
}
# The CPUs of local rank R in a job's output (lines "[R] Cpus_allowed_list: ...").
rank_cpus() { sed -n "s/^\[$1\] //p" "$2" | expand; }
# The words FROM..TO-1 (0-based) of a list.
slice() { echo "$3" | awk -v lo="$1" -v hi="$2" '{ for (i = lo + 1; i <= hi; i++) printf "%s ", $i }'; }
PROBE='grep Cpus_allowed_list /proc/self/status; echo "omp=$OMP_NUM_THREADS"'

unset OMP_NUM_THREADS
ALL=$(expand </proc/self/status)
C=$(echo "$ALL" | wc -w)
[ "$C" -ge 1 ] || fail "cannot read this process's CPUs"

# auto with N <= C: block i = CPUs [i*C/N, (i+1)*C/N) of the launcher's, in order.
for N in 1 2 3 "$C"; do
  [ "$N" -le "$C" ] || continue
  "$KT" run -n "$N" sh -c "$PROBE" >"$TMP/auto$N.out" 2>"$TMP/auto$N.err"
  expect_rc 0 $? "run -n $N (bind auto)"
  r=0
  while [ $r -lt "$N" ]; do
    omp=$(((r + 1) * C / N - r * C / N))  # the size of its block
    want=$(slice $((r * C / N)) $(((r + 1) * C / N)) "$ALL")
    got=$(rank_cpus $r "$TMP/auto$N.out")
    [ "$got" = "$want" ] || fail "-n $N: rank $r bound to '$got', expected '$want' (of '$ALL')"
    grep -q "^\[$r\] omp=$omp$" "$TMP/auto$N.out" || fail "-n $N: rank $r: expected OMP_NUM_THREADS=$omp"
    r=$((r + 1))
  done
done

# none, and more ranks than CPUs: not bound.
"$KT" run --bind none -n 2 sh -c "$PROBE" >"$TMP/none.out" 2>"$TMP/none.err"
expect_rc 0 $? "run --bind none -n 2"
for r in 0 1; do
  [ "$(rank_cpus $r "$TMP/none.out")" = "$ALL" ] || fail "--bind none: rank $r is bound"
done
if [ "$C" -le 16 ]; then
  N=$((C + 1))
  "$KT" run --bind=auto -n $N sh -c "$PROBE" >"$TMP/over.out" 2>"$TMP/over.err"
  expect_rc 0 $? "run -n $N on $C CPUs"
  r=0
  while [ $r -lt $N ]; do
    [ "$(rank_cpus $r "$TMP/over.out")" = "$ALL" ] || fail "-n $N on $C CPUs: rank $r is bound"
    grep -q "^\[$r\] omp=1$" "$TMP/over.out" || fail "-n $N on $C CPUs: OMP_NUM_THREADS is not 1"
    r=$((r + 1))
  done
fi

# The launcher's own mask is what gets split (taskset, cpusets).
if command -v taskset >/dev/null 2>&1; then
  last=$(echo "$ALL" | awk '{ print $NF }')
  taskset -c "$last" "$KT" run -n 1 sh -c "$PROBE" >"$TMP/ts1.out" 2>"$TMP/ts1.err"
  expect_rc 0 $? "taskset -c $last run -n 1"
  [ "$(rank_cpus 0 "$TMP/ts1.out")" = "$last " ] || fail "under taskset -c $last: rank 0 not on CPU $last"
  grep -q "^\[0\] omp=1$" "$TMP/ts1.out" || fail "under taskset -c $last: OMP_NUM_THREADS is not 1"
  taskset -c "$last" "$KT" run -n 2 sh -c "$PROBE" >"$TMP/ts2.out" 2>"$TMP/ts2.err"
  expect_rc 0 $? "taskset -c $last run -n 2"
  for r in 0 1; do
    [ "$(rank_cpus $r "$TMP/ts2.out")" = "$last " ] || fail "2 ranks on 1 CPU: rank $r not on CPU $last"
  done
fi

# A user's OMP_NUM_THREADS is kept when bound.
OMP_NUM_THREADS=5 "$KT" run -n 1 sh -c "$PROBE" >"$TMP/omp.out" 2>"$TMP/omp.err"
grep -q "^\[0\] omp=5$" "$TMP/omp.out" || fail "user's OMP_NUM_THREADS=5 not kept"

# A bad mode is a usage error that names the option.
"$KT" run --bind core -n 1 true >"$TMP/bad.out" 2>"$TMP/bad.err"
expect_rc 2 $? "--bind core"
expect_grep "bad value 'core' for --bind" "$TMP/bad.err" "--bind core"
echo "PASS: bind ($C CPUs: $ALL)"
