# hosts.sh - "hosts" made of network namespaces on one machine (sourced by
# tests/multihost/netns.sh, tests/fault/chaos.sh --hosts, tests/soak/soak.sh
# --hosts). Each node K is a namespace ${HOSTS_P}K with a veth (ktv0,
# $HOSTS_NET.(K+1)/24) whose other end (pK) is a port of a bridge in the
# namespace ${HOSTS_P}br. Processes started with hosts_exec get their own
# host name (a UTS namespace), as separate hosts have, so the library sees
# one host per node.
#   hosts_up NNODES TMPDIR  create them; returns 77 (nothing made) where
#                           `ip netns add` fails, 1 when a later step fails
#   hosts_ns K              node K's namespace
#   hosts_exec K CMD...     run CMD in node K's namespace as host ktnodeK
#   hosts_link K up|down    node K's cable: its bridge port up or down
#   hosts_pids K            pids of every process in node K
#   hosts_kill_all          SIGKILL every process of every node
#   hosts_down              kill every process, delete every namespace;
#                           returns 1 (and says so) when one is left
#   hosts_start WHAT NP H TMPDIR  for a script of NP ranks on H hosts: checks
#                           that they divide, makes the hosts, and on failure
#                           exits (77, "SKIP: WHAT ...", where nothing could be
#                           made; else 1); sets KT and PROG to absolute paths
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN).
HOSTS_P="kt$$-"  # the dash: kt12-... never matches kt123-...
HOSTS_X=$(( ($$ / 250) % 250 + 1 ))  # 10.X.Y.0/24 from the pid: unique per run
HOSTS_Y=$(( $$ % 250 + 1 ))
HOSTS_NET="10.$HOSTS_X.$HOSTS_Y"
HOSTS_N=0
HOSTS_UTS=""

hosts_ns() { echo "${HOSTS_P}$1"; }

hosts_up() {
  hosts_nn=$1 hosts_tmp=$2
  command -v ip >/dev/null 2>&1 || { HOSTS_WHY="no 'ip' command (iproute2)"; return 77; }
  if ! HOSTS_WHY=$(ip netns add "${HOSTS_P}br" 2>&1); then
    HOSTS_WHY="cannot create a network namespace ('ip netns add' failed: $HOSTS_WHY); this needs root"
    return 77
  fi
  HOSTS_N=$hosts_nn
  ip -n "${HOSTS_P}br" link add br0 type bridge &&
    ip -n "${HOSTS_P}br" link set lo up &&
    ip -n "${HOSTS_P}br" link set br0 up || { HOSTS_WHY="cannot make the bridge"; return 1; }
  hosts_k=0
  while [ "$hosts_k" -lt "$hosts_nn" ]; do
    hosts_n=$(hosts_ns "$hosts_k")
    ip netns add "$hosts_n" &&
      ip -n "${HOSTS_P}br" link add "p$hosts_k" type veth peer name ktv0 netns "$hosts_n" &&
      ip -n "${HOSTS_P}br" link set "p$hosts_k" master br0 &&
      ip -n "${HOSTS_P}br" link set "p$hosts_k" up &&
      ip -n "$hosts_n" link set lo up &&
      ip -n "$hosts_n" addr add "$HOSTS_NET.$((hosts_k + 1))/24" dev ktv0 &&
      ip -n "$hosts_n" link set ktv0 up || { HOSTS_WHY="cannot make node $hosts_k"; return 1; }
    hosts_k=$((hosts_k + 1))
  done
  if unshare --uts true 2>/dev/null; then
    HOSTS_UTS="unshare --uts"
  else
    HOSTS_UTS=""
    echo "note: 'unshare --uts' does not work here; the nodes share the host name"
  fi
  return 0
}

hosts_exec() {
  hosts_k=$1
  shift
  # shellcheck disable=SC2086
  UTS="$HOSTS_UTS" ip netns exec "$(hosts_ns "$hosts_k")" $HOSTS_UTS \
    sh -c '[ -z "$UTS" ] || hostname "$0" && exec "$@"' "ktnode$hosts_k" "$@"
}

# The bridge's end: the node's own interface stays configured, so its
# sockets see a silent network (no reset, no error), as with a pulled cable.
hosts_link() { ip -n "${HOSTS_P}br" link set "p$1" "$2"; }

hosts_pids() { ip netns pids "$(hosts_ns "$1")" 2>/dev/null | tr '\n' ' '; }

hosts_kill_all() {
  for hosts_n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$HOSTS_P"); do
    for hosts_pid in $(ip netns pids "$hosts_n" 2>/dev/null); do kill -9 "$hosts_pid" 2>/dev/null; done
  done
}

hosts_down() {
  hosts_kill_all
  sleep 0.2
  for hosts_n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$HOSTS_P"); do
    ip netns del "$hosts_n" 2>/dev/null || echo "warning: cannot delete namespace $hosts_n" >&2
  done
  hosts_left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$HOSTS_P" | tr '\n' ' ')
  [ -z "$hosts_left" ] && return 0
  echo "FAIL: namespaces left behind: $hosts_left" >&2
  return 1
}

hosts_start() {
  hs_what=$1 hs_np=$2 hs_n=$3
  [ $((hs_np % hs_n)) = 0 ] || { echo "FAIL: $hs_np ranks do not divide over $hs_n hosts" >&2; exit 1; }
  KT=$(cd "$(dirname "$KT")" && pwd)/$(basename "$KT")
  PROG=$(cd "$(dirname "$PROG")" && pwd)/$(basename "$PROG")
  hosts_up "$hs_n" "$4"
  case $? in
    0) ;;
    77) echo "SKIP: $hs_what on $hs_n hosts: $HOSTS_WHY"; exit 77 ;;
    *) hosts_down; echo "FAIL: making the hosts: $HOSTS_WHY" >&2; exit 1 ;;
  esac
}
