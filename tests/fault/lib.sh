# lib.sh - helpers of the failure-behaviour tests (sourced by each script).
# Usage: . "$(dirname "$0")/lib.sh" KAITIAN_CLI FAULT_PROG [...]
set -u
KT=${1:?usage: $0 KAITIAN_CLI FAULT_PROG ...}
PROG=${2:?usage: $0 KAITIAN_CLI FAULT_PROG ...}
[ -x "$KT" ] || { echo "FAIL: $KT is not executable" >&2; exit 1; }
[ -x "$PROG" ] || { echo "FAIL: $PROG is not executable" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_fault.XXXXXX")
# A unique argument of every rank of the job, to find leftovers by command line.
MARK="ktfault$$x$(date +%s%N | tail -c 7)"
LPID=""

# The pattern with its last character in brackets, so pgrep never matches itself.
mark_pattern() { printf '%s[%s]' "${MARK%?}" "${MARK#"${MARK%?}"}"; }
leftovers() { pgrep -f -- "$(mark_pattern)" 2>/dev/null | tr '\n' ' '; }

cleanup() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  for p in $(leftovers); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.out "$TMP"/*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 60 lines)" >&2
    tail -n 60 "$f" >&2
  done
  exit 1
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# /dev/shm entries whose name mentions kaitian, one per line, sorted.
shm_list() { ls -1 /dev/shm 2>/dev/null | grep -i kaitian | sort; }
shm_snapshot() { shm_list >"$TMP/shm.before"; }
# Entries that appeared since shm_snapshot (a crash must leave none behind).
shm_check() {
  shm_list >"$TMP/shm.after"
  new=$(comm -13 "$TMP/shm.before" "$TMP/shm.after" | tr '\n' ' ')
  [ -z "$new" ] || fail "$1: left behind in /dev/shm: $new"
}

# No process of the job may survive its launcher.
leftover_check() {
  left=$(leftovers)
  [ -z "$left" ] || fail "$1: processes of the job survived the launcher: $left ($(ps -o pid,stat,args -p "$(echo $left | tr ' ' ',')" 2>/dev/null | tail -n +2))"
}

# wait_launcher SECONDS: wait for the launcher started in the background
# (pid LPID); sets LRC. Fails when it is still running after SECONDS.
wait_launcher() {
  i=0
  while kill -0 "$LPID" 2>/dev/null; do
    # A zombie child of ours counts as done.
    st=$(awk '{print $3}' "/proc/$LPID/stat" 2>/dev/null)
    [ "$st" = Z ] && break
    i=$((i + 1))
    if [ $i -gt $(($1 * 10)) ]; then
      kill -9 "$LPID" 2>/dev/null
      fail "the launcher did not exit within $1 s (hang?)"
    fi
    sleep 0.1
  done
  wait "$LPID"
  LRC=$?
  LPID=""
}
