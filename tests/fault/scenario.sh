#!/bin/sh
# scenario.sh - run one scenario of fault_prog under `kaitian run` and check
# the outcome: the launcher's exit status, the ranks that reported FAULT_OK
# (every rank checks its own expectations and prints why when one fails), the
# launcher's wall time, lines that must or must not appear, no leftover
# process, nothing left in /dev/shm; for the mismatch scenario, the ranks'
# reports taken together (below).
# Args: KAITIAN_CLI FAULT_PROG [options] -- SCENARIO [key=value ...]
#   --np N          ranks (default 2)
#   --rc R          expected launcher exit status (default 0)
#   --ok LIST       ranks that must print FAULT_OK (default: all)
#   --max-s S       the launcher must be done within S seconds (default 60)
#   --grep RE       a line of the output must match RE (extended; repeatable)
#   --nogrep RE     no line may match RE (repeatable)
#   --grace S       passed to kaitian run --grace
#   --env K=V       set in the job's environment (repeatable)
. "$(dirname "$0")/lib.sh" "$@"
shift 2
NP=2 RC=0 OK="" MAX_S=60 GRACE=""
: >"$TMP/greps"
: >"$TMP/nogreps"
while [ $# -gt 0 ]; do
  case "$1" in
    --np) NP=$2; shift 2 ;;
    --rc) RC=$2; shift 2 ;;
    --ok) OK=$2; shift 2 ;;
    --max-s) MAX_S=$2; shift 2 ;;
    --grep) printf '%s\n' "$2" >>"$TMP/greps"; shift 2 ;;
    --nogrep) printf '%s\n' "$2" >>"$TMP/nogreps"; shift 2 ;;
    --grace) GRACE="--grace $2"; shift 2 ;;
    --env) export "$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "scenario.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "scenario.sh: no scenario" >&2; exit 2; }
[ -n "$OK" ] || OK=$(seq -s, 0 $((NP - 1)))
what="$*"

shm_snapshot
t0=$(now_ms)
# shellcheck disable=SC2086
"$KT" run -n "$NP" $GRACE "$PROG" "$@" "mark=$MARK" >"$TMP/job.out" 2>"$TMP/job.err" &
LPID=$!
wait_launcher $((MAX_S + 30))
t1=$(now_ms)
cat "$TMP/job.err" "$TMP/job.out" >"$TMP/all.log"
echo "scenario '$what' on $NP ranks: launcher exit $LRC after $((t1 - t0)) ms"
grep -h 'FAULT_ERROR\|FAULT_OK\|FAULT_NOTE\|FAULT_CHECK_FAILED\|FAULT_MISMATCH' "$TMP/all.log"

if grep -q FAULT_CHECK_FAILED "$TMP/job.err"; then
  fail "'$what': a rank's check failed (FAULT_CHECK_FAILED above)"
fi
[ "$LRC" = "$RC" ] || fail "'$what': the launcher exited $LRC, expected $RC"
for r in $(echo "$OK" | tr ',' ' '); do
  grep -q "^\[$r\] FAULT_OK " "$TMP/job.out" || fail "'$what': rank $r did not report FAULT_OK"
done
[ $((t1 - t0)) -le $((MAX_S * 1000)) ] || fail "'$what': took $((t1 - t0)) ms, limit $MAX_S s"
while IFS= read -r re; do
  grep -Eq -- "$re" "$TMP/all.log" || fail "'$what': no line of the output matches '$re'"
done <"$TMP/greps"
while IFS= read -r re; do
  ! grep -Eq -- "$re" "$TMP/all.log" || fail "'$what': a line matches '$re': $(grep -E -m1 -- "$re" "$TMP/all.log")"
done <"$TMP/nogreps"
# Mismatched operations: each rank can only check its own error (a peer's
# abort notice, a peer failure or the mismatch itself). Taken together, at
# least one rank must have seen the mismatch itself and reported
# KT_ERR_MISMATCH naming both sides' operations (fault_prog's FAULT_MISMATCH
# detected=1), and every other rank KT_ERR_MISMATCH too, or a peer failure or
# abort naming a rank that saw it.
if [ "$1" = mismatch ]; then
  verdict=$(grep -h 'FAULT_MISMATCH rank=' "$TMP/all.log" | awk -v np="$NP" '
    {
      r = ""; code = ""; det = 0; names = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^rank=/) r = substr($i, 6)
        else if ($i ~ /^code=/) code = substr($i, 6)
        else if ($i ~ /^detected=/) det = substr($i, 10) + 0
        else if ($i ~ /^names=/) names = substr($i, 7)
      }
      seen[r] = 1; codes[r] = code; named[r] = names
      if (det) { saw[r] = 1; list = list (list == "" ? "" : ",") r }
    }
    END {
      if (list == "") {
        print "no rank reported KT_ERR_MISMATCH naming both operations from seeing the mismatch itself"
        exit
      }
      for (r = 0; r < np; r++) {
        if (!(r in seen)) { printf "rank %d reported no error\n", r; continue }
        if ((r in saw) || codes[r] == "KT_ERR_MISMATCH") continue
        ok = 0
        if (codes[r] == "KT_ERR_PEER_FAILED" || codes[r] == "KT_ERR_ABORTED") {
          n = split(named[r], a, ",")
          for (i = 1; i <= n; i++) if (a[i] in saw) ok = 1
        }
        if (!ok) printf "rank %d reported %s naming rank(s) %s, not one that saw the mismatch (%s)\n", r, codes[r], named[r], list
      }
    }')
  [ -z "$verdict" ] || fail "'$what': $verdict"
fi
leftover_check "'$what'"
shm_check "'$what'"
echo "PASS scenario '$what' np=$NP"
