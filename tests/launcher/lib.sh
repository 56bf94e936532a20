# lib.sh - helpers shared by the launcher tests (sourced by each test script).
# Usage in a test: . "$(dirname "$0")/lib.sh" "$@"   (first argument: the kaitian command)
set -u
KT=${1:?usage: $0 KAITIAN_CLI [...]}
[ -x "$KT" ] || { echo "FAIL: $KT is not executable" >&2; exit 1; }
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_launcher.XXXXXX")
# A marker in the command line of every process a test starts, so that
# leftovers can be found in /proc (zombies have an empty cmdline and do not count).
MARK="ktmark$$x$(basename "$0" .sh | tr -c 'a-z0-9\n' 'x')"
# A copy of sleep whose file name carries the marker.
SLEEPER="$TMP/$MARK"
cp "$(command -v sleep)" "$SLEEPER"

# The pattern's last character in brackets, so grep never matches itself.
mark_pattern() { printf '%s[%s]' "${MARK%?}" "${MARK#"${MARK%?}"}"; }

# Pids of live processes whose command line holds the marker.
marker_pids() {
  pat=$(mark_pattern)
  for f in $(grep -la -- "$pat" /proc/[0-9]*/cmdline 2>/dev/null); do
    p=${f#/proc/}
    echo "${p%/cmdline}"
  done
}
count_marker() { marker_pids | wc -l | tr -d ' '; }

# wait_marker COUNT SECONDS: wait until exactly COUNT marker processes exist.
wait_marker() {
  i=0
  while [ "$(count_marker)" != "$1" ]; do
    i=$((i + 1))
    [ $i -gt $(($2 * 10)) ] && return 1
    sleep 0.1
  done
  return 0
}

cleanup() {
  for p in $(marker_pids); do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/*.out "$TMP"/*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (first 40 lines)" >&2
    head -n 40 "$f" >&2
  done
  exit 1
}

# expect_rc WANT GOT WHAT
expect_rc() { [ "$2" = "$1" ] || fail "$3: exit status $2, expected $1"; }
# expect_grep PATTERN FILE WHAT (extended regex)
expect_grep() { grep -Eq -- "$1" "$2" || fail "$3: no line matching '$1' in $(basename "$2")"; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# A TCP port, and the next one, that nobody uses now: random in 10000-19999,
# outside Linux's ephemeral range (32768-60999), so that no outgoing
# connection of a concurrent test can be handed it between now and the bind.
free_port() {
  while :; do
    p=$((10000 + $(od -An -N2 -tu2 /dev/urandom) % 10000))
    a=$(printf ':%04X ' "$p") b=$(printf ':%04X ' $((p + 1)))
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q -e "$a" -e "$b" || { echo "$p"; return; }
  done
}

# with_shm SIZE CMD...: run CMD with a private tmpfs of SIZE (e.g. 2m) on
# /dev/shm, in a mount namespace (as in a container with a small /dev/shm).
with_shm() {
  size=$1
  shift
  unshare --mount sh -c "mount -t tmpfs -o size=$size tmpfs /dev/shm && exec \"\$@\"" sh "$@"
}
# need_mount_ns: skip the test (exit 77) where with_shm cannot work (needs root).
need_mount_ns() {
  if ! unshare --mount sh -c 'mount -t tmpfs -o size=2m tmpfs /dev/shm' 2>"$TMP/unshare"; then
    echo "SKIP: cannot mount a small /dev/shm in a mount namespace: $(cat "$TMP/unshare")"
    rm -rf "$TMP"
    exit 77
  fi
}
