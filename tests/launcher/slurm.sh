#!/bin/sh
# slurm.sh - jobs under a real Slurm and under real mpirun (Open MPI, MPICH).
# The test brings up its own Slurm cluster on this host, one node unless
# KT_SLURM_NODES says more (munged, slurmctld and slurmd, with their key,
# socket, pid files, logs and state under a private mktemp -d directory, on
# free TCP ports, SLURM_CONF pointing srun/sinfo/salloc at it), only when a
# case needs it, and tears it down on EXIT/INT/TERM: no process, no file in
# /tmp, no new kaitian segment in /dev/shm is left behind.
#
# Cases (each a function; all of them unless named on the command line):
#   srun_c        srun -n 4 C_PROG: 4 lines "PASS ...", exit 0;
#   srun_py       srun -n 3 $PYTHON PY_PROG: exit 0, "PASS" (rank 0);
#   srun_launcher srun -N 1 -n 1 KAITIAN_CLI run -n 3 PY_PROG (the launcher
#                 once per node, the job's shape from Slurm): exit 0, "PASS";
#   srun_bad      an inconsistent Slurm environment (SLURM_NTASKS=5 in a
#                 2-task step; SLURM_PROCID unset; SLURM_PROCID=9 of 2): every
#                 job exits non-zero within seconds, stderr naming the variable;
#   ompi_c        mpirun.openmpi -np 3 C_PROG;      ompi_py  -np 2 $PYTHON PY_PROG;
#   mpich_c       mpirun.mpich -np 3 C_PROG;        mpich_py -np 2 $PYTHON PY_PROG;
#                 (exit 0 and PASS; each MPI flavour skips where its mpirun is
#                 missing; these need no Slurm);
#   alloc_ompi    salloc -n 2 mpirun.openmpi -np 2 C_PROG   } MPI inside an
#   alloc_mpich   salloc -n 2 mpirun.mpich -np 2 C_PROG     } allocation (-N 2
#   batch_mpi     sbatch -n 2 with mpirun.openmpi, mpirun.mpich, } -n 4, -np 4
#                 and `kaitian run -n 2` in the batch script     } on 2 nodes):
#                 one job of NP ranks, not NP jobs of one rank (the mpiruns
#                 start their daemons with srun, so the ranks also carry a
#                 Slurm step environment of their own);
#   srun_nodes    (by default only with KT_SLURM_NODES >= 2) srun -N 2
#                 --ntasks-per-node=2, -N 2 -n 3 (2 + 1 tasks), -N 2 -n 3
#                 -m cyclic, and -N 2 --ntasks-per-node=1 kaitian run -n 2,
#                 all of C_PROG;
# PASS checks: NP lines (C_PROG), at least one (PY_PROG); where the lines say
# "rank R of N" (or rank=R ... size=N), every N must be the job's size and
# no rank may appear twice.
# and, never run by default:
#   envdump       print the environment that srun, salloc, sbatch, srun in an
#                 allocation, mpirun.openmpi and mpirun.mpich give a process;
#   hold          bring the cluster up, print its SLURM_CONF and wait
#                 ($KT_SLURM_HOLD seconds, default 600; kill -TERM the script
#                 to end it early and tear everything down).
# A case that fails does not stop the others; the script exits 1 if any
# failed, 77 if all were skipped (no Slurm here, not root, ...), else 0.
#
# Args: KAITIAN_CLI C_PROG PY_PROG [CASE...]   (C_PROG or PY_PROG "-": skip
#   the cases that need it). Environment: PYTHON (default /usr/bin/python3),
#   KAITIAN_LIBRARY (default <dir of KAITIAN_CLI>/libkaitian.so), PYTHONPATH
#   (default <repo>/python) are exported to every job; KT_SLURM_REQUIRED=1
#   makes "Slurm cannot start here" a failure instead of a skip;
#   KT_SLURM_CPUS (default 8): CPUs each node declares (Slurm allocates one
#   task per CPU, so this many tasks fit on a node whatever nproc says);
#   KT_SLURM_NODES (default 1): nodes of the cluster. One is named as this
#   host (as `slurmd -C` names it). Several are kt1..ktN, one slurmd each on
#   this host, each (where root may) in its own UTS and mount namespace: the
#   node's name is its tasks' host name and resolves to 127.0.0.1 there.
#   JOB_LIMIT (default 120): seconds a job may run.
#
# Functions (usable by other scripts that source this one with
# KT_SLURM_LIB=1, after lib.sh or with KT, TMP, MARK and now_ms set;
# PYTHONPATH then is theirs to set):
#   slurm_up             start munged, slurmctld, slurmd(s); wait (30 s at
#                        most) for the node(s) to be idle; 0 on success, 77 where
#                        Slurm cannot run here, 1 on failure (logs printed);
#   slurm_down           cancel the jobs, stop the daemons, kill every process
#                        they or the jobs left, remove the cluster's files;
#   srun_job NAME ARGS   srun ARGS (timeout $JOB_LIMIT s) -> $TMP/NAME.out/.err,
#                        returns srun's exit status (124: timed out);
#   ompi_job NAME NP ARGS   mpirun.openmpi -np NP ARGS (as root, loopback);
#   mpich_job NAME NP ARGS  mpirun.mpich -np NP ARGS (fork launcher, loopback);
#   salloc_job NAME ARGS    salloc ARGS (e.g. -n 2 mpirun.mpich -np 2 prog);
#   sbatch_job NAME SBATCH_ARGS -- LINES   sbatch -W of a script of LINES,
#                        its output in $TMP/NAME.out/.err.
if [ "${KT_SLURM_LIB:-0}" != 1 ]; then
  . "$(dirname "$0")/lib.sh" "$@"
  C_PROG=${2:-}
  PY_PROG=${3:-}
  if [ $# -ge 3 ]; then shift 3; else shift $#; fi
  CASES=$*
fi

JOB_LIMIT=${JOB_LIMIT:-120}  # seconds a job may take before it counts as hung
KT_DIR=$(cd "$(dirname "$KT")" && pwd)
KT=$KT_DIR/$(basename "$KT")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHON="${PYTHON:-/usr/bin/python3}"
export KAITIAN_LIBRARY="${KAITIAN_LIBRARY:-$KT_DIR/libkaitian.so}"
[ -d "$REPO/python" ] && export PYTHONPATH="${PYTHONPATH:-$REPO/python}"

# A job must not see the launcher environment of whatever runs this test
# (a Slurm job, an MPI job): srun would join that job, mpirun would launch
# through it.
for v in $(env | sed -n 's/^\(\(SLURM\|SLURMD\|OMPI\|PMIX\|PMI\|HYDRA\|MPI_LOCAL\)[A-Za-z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done

SLURM_DIR=""      # the cluster's directory ($TMP/slurm) while it is up
SLURM_PIDS=""     # munged, slurmctld, slurmd (started in the foreground, in the background)
SLURM_NODE=""     # the node's name (KT_SLURM_NODES=1), else the first of kt1..ktN
SLURM_NODES=""    # all of them

# Marker in the environment of every daemon and job process we start (not of
# this shell): slurm_down kills whatever still carries it.
SMARK="KT_SLURM_MARK=$MARK"
smark_pids() {
  for f in $(grep -lsa -- "$SMARK" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$p" = $$ ] || echo "$p"
  done
}

slurm_log_tail() {
  for f in "$SLURM_DIR"/munged.log "$SLURM_DIR"/slurmctld.log "$SLURM_DIR"/slurmd*.log \
           "$SLURM_DIR"/*.stderr; do
    [ -s "$f" ] || continue
    echo "---- $(basename "$f") (last 30 lines)" >&2
    tail -n 30 "$f" >&2
  done
}

# slurm_skip MESSAGE: Slurm cannot run here: 77, or 1 under KT_SLURM_REQUIRED=1.
slurm_skip() {
  if [ "${KT_SLURM_REQUIRED:-0}" = 1 ]; then
    echo "FAIL: Slurm is required (KT_SLURM_REQUIRED=1) but $*" >&2
    slurm_log_tail
    return 1
  fi
  echo "SKIP: $*"
  return 77
}

# Free TCP port base: COUNT consecutive ports, none of them in use in any
# state, below the kernel's ephemeral range (so no outgoing connection takes
# one between this check and the daemons' bind).
free_port_base() {
  count=$1
  lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
  top=$(( ${lo:-32768} - count - 1 ))
  [ "$top" -gt 12000 ] || top=30000
  used=$(ss -Htan 2>/dev/null | awk '{n = split($4, a, ":"); print a[n]}' | sort -un)
  try=0
  while [ $try -lt 64 ]; do
    base=$(( 10000 + ( ($$ * 131 + try * 997 + $(date +%N | sed 's/^0*//;s/^$/0/') % 1000) % (top - 10000) ) ))
    hit=$(echo "$used" | awk -v b="$base" -v e="$((base + count - 1))" '$1 >= b && $1 <= e' | head -n 1)
    [ -z "$hit" ] && { echo "$base"; return 0; }
    try=$((try + 1))
  done
  return 1
}

# wait_for SECONDS COMMAND...: poll COMMAND every 0.1 s until it succeeds.
wait_for() {
  wf_n=$(( $1 * 10 ))
  shift
  while ! "$@" >/dev/null 2>&1; do
    wf_n=$((wf_n - 1))
    [ $wf_n -le 0 ] && return 1
    sleep 0.1
  done
  return 0
}

pid_alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# Every node idle.
nodes_idle() {
  st=$(sinfo -h -N -o '%t' 2>/dev/null)
  [ -n "$st" ] && [ "$(echo "$st" | grep -cx idle)" = "$(echo "$SLURM_NODES" | wc -w)" ]
}

slurm_up() {
  [ "$(id -u)" = 0 ] || { slurm_skip "Slurm test needs root (slurmd runs jobs, SlurmUser=root)"; return; }
  for c in munged slurmctld slurmd srun sinfo scontrol squeue scancel ss; do
    command -v "$c" >/dev/null 2>&1 || { slurm_skip "no '$c' here (packages slurm-wlm, munge, iproute2)"; return; }
  done
  SLURM_DIR=$TMP/slurm
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool" || return 1
  # munged wants every directory above its socket searchable by all.
  chmod 711 "$TMP" "$SLURM_DIR"

  # munge: its own key, socket, pid, seed, log.
  key=$SLURM_DIR/munge.key
  if command -v mungekey >/dev/null 2>&1; then
    mungekey -c -b 1024 -k "$key" 2>"$SLURM_DIR/mungekey.stderr"
  else
    dd if=/dev/urandom of="$key" bs=128 count=1 2>/dev/null
  fi
  chmod 400 "$key" 2>/dev/null
  [ -s "$key" ] || { slurm_skip "cannot create a munge key: $(cat "$SLURM_DIR/mungekey.stderr" 2>/dev/null)"; return; }
  MUNGE_SOCK=$SLURM_DIR/munge.sock
  env "$SMARK" munged -F --socket="$MUNGE_SOCK" --key-file="$key" --pid-file="$SLURM_DIR/munged.pid" \
    --log-file="$SLURM_DIR/munged.log" --seed-file="$SLURM_DIR/munged.seed" \
    >"$SLURM_DIR/munged.stderr" 2>&1 &
  SLURM_PIDS="$!"
  if ! wait_for 10 test -S "$MUNGE_SOCK"; then
    slurm_skip "munged did not start (socket $MUNGE_SOCK missing after 10 s)"
    return
  fi

  # Ports: slurmctld, slurmd, and a range for srun.
  # Ports: slurmctld, slurmd (of the one node), 32 for srun, one per
  # further slurmd.
  nnodes=${KT_SLURM_NODES:-1}
  base=$(free_port_base $((34 + nnodes))) || { echo "FAIL: no $((34 + nnodes)) free consecutive TCP ports" >&2; return 1; }
  host=$(slurmd -C 2>/dev/null | sed -n 's/^NodeName=\([^ ]*\).*/\1/p')
  real_cpus=$(slurmd -C 2>/dev/null | sed -n 's/^NodeName=.* CPUs=\([0-9]*\).*/\1/p')
  [ -n "$host" ] || { slurm_skip "'slurmd -C' names no node"; return; }
  cpus=${KT_SLURM_CPUS:-8}
  [ "${real_cpus:-0}" -gt "$cpus" ] && cpus=$real_cpus
  # One node: named as the host. Several: kt1..ktN, one slurmd each (slurmd
  # -N), all on this host, each on its own port.
  node_lines=""
  if [ "$nnodes" = 1 ]; then
    SLURM_NODES=$host
    node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
    part_nodes=$host
  else
    SLURM_NODES=""
    i=1
    while [ $i -le "$nnodes" ]; do
      SLURM_NODES="$SLURM_NODES kt$i"
      node_lines="${node_lines}NodeName=kt$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 33 + i)) CPUs=$cpus State=UNKNOWN
"
      i=$((i + 1))
    done
    SLURM_NODES=${SLURM_NODES# }
    part_nodes="kt[1-$nnodes]"
  fi
  SLURM_NODE=${SLURM_NODES%% *}
  for n in $SLURM_NODES; do mkdir -p "$SLURM_DIR/spool/$n"; done
  : >"$SLURM_DIR/plugstack.conf"   # no SPANK plugins of the host's /etc/slurm
  SLURM_CONF=$SLURM_DIR/slurm.conf
  cat >"$SLURM_CONF" <<EOF
# one-node test cluster of tests/launcher/slurm.sh
ClusterName=kt$$
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 2))-$((base + 33))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$SLURM_DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node declares KT_SLURM_CPUS CPUs whatever it has: tasks > real CPUs.
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=2
$node_lines
PartitionName=kt Nodes=$part_nodes Default=YES MaxTime=30 State=UP
EOF
  export SLURM_CONF
  env "$SMARK" slurmctld -D -i -f "$SLURM_CONF" >"$SLURM_DIR/slurmctld.stderr" 2>&1 &
  SLURM_PIDS="$SLURM_PIDS $!"
  ctld=$!
  wait_for 10 scontrol ping || {
    if pid_alive "$ctld"; then
      echo "FAIL: slurmctld (pid $ctld) does not answer 'scontrol ping' after 10 s" >&2
      slurm_log_tail
      return 1
    fi
    slurm_skip "slurmctld could not start: $(tail -n 1 "$SLURM_DIR/slurmctld.log" 2>/dev/null)"
    return
  }
  # Several nodes: each slurmd (so each of its tasks) in its own UTS and
  # mount namespace, with the node's name as host name and an /etc/hosts
  # where kt1..ktN are 127.0.0.1, as on separate hosts (where that works).
  SLURM_NS=""
  if [ "$nnodes" != 1 ]; then
    { cat /etc/hosts; echo "127.0.0.1 $SLURM_NODES"; } >"$SLURM_DIR/hosts"
    if unshare --mount --uts sh -c 'mount --bind "$1" /etc/hosts && hostname kt0' sh "$SLURM_DIR/hosts" 2>/dev/null; then
      SLURM_NS=yes
    else
      echo "note: no mount/UTS namespaces here: the nodes share this host's name, and kt1..ktN do not resolve"
    fi
  fi
  sds=""
  for n in $SLURM_NODES; do
    if [ "$nnodes" = 1 ]; then
      env "$SMARK" slurmd -D -f "$SLURM_CONF" >"$SLURM_DIR/slurmd.$n.stderr" 2>&1 &
    elif [ -n "$SLURM_NS" ]; then
      env "$SMARK" unshare --mount --uts sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -D -N "$2" -f "$3"' \
        sh "$SLURM_DIR/hosts" "$n" "$SLURM_CONF" >"$SLURM_DIR/slurmd.$n.stderr" 2>&1 &
    else
      env "$SMARK" slurmd -D -N "$n" -f "$SLURM_CONF" >"$SLURM_DIR/slurmd.$n.stderr" 2>&1 &
    fi
    SLURM_PIDS="$SLURM_PIDS $!"
    sds="$sds $!"
  done
  if ! wait_for 30 nodes_idle; then
    for sd in $sds; do
      pid_alive "$sd" && continue
      slurm_skip "slurmd could not start: $(tail -n 1 "$SLURM_DIR/slurmd.$SLURM_NODE.log" 2>/dev/null)"
      return
    done
    echo "FAIL: node(s) $SLURM_NODES not idle after 30 s (sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1 | tr '\n' ';'))" >&2
    slurm_log_tail
    return 1
  fi
  return 0
}

slurm_down() {
  if [ -n "$SLURM_DIR" ] && [ -n "${SLURM_CONF:-}" ] && [ -n "$SLURM_PIDS" ]; then
    # Jobs first, so that slurmd can still end their steps.
    if [ -n "$(timeout 5 squeue -h -o %A 2>/dev/null)" ]; then
      timeout 5 scancel --full -u "$(id -un)" >/dev/null 2>&1
      wait_for 5 sh -c '[ -z "$(squeue -h -o %A 2>/dev/null)" ]'
    fi
  fi
  for p in $SLURM_PIDS; do kill -TERM "$p" 2>/dev/null; done
  for p in $SLURM_PIDS; do
    n=50
    while pid_alive "$p" && [ $n -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  # Whatever is left: slurmstepd, tasks, mpirun's daemons and ranks.
  for p in $(smark_pids); do kill -KILL "$p" 2>/dev/null; done
  n=30
  while [ -n "$(smark_pids)" ] && [ $n -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
  SLURM_PIDS=""
  [ -n "$SLURM_DIR" ] && rm -rf "$SLURM_DIR"
  SLURM_DIR=""
  unset SLURM_CONF
}

# capture NAME VAR=VALUE... -- COMMAND ARGS...: COMMAND under $JOB_LIMIT,
# with the marker and the variables in its environment, stdout/stderr in
# $TMP/NAME.out/.err (a note there when it timed out); its exit status.
capture() {
  cp_name=$1
  shift
  cp_env=""
  while [ "$1" != "--" ]; do cp_env="$cp_env $1"; shift; done
  shift
  # shellcheck disable=SC2086
  env "$SMARK" $cp_env timeout -k 5 "$JOB_LIMIT" "$@" >"$TMP/$cp_name.out" 2>"$TMP/$cp_name.err" </dev/null
  cp_rc=$?
  [ $cp_rc = 124 ] && echo "note: $* timed out after $JOB_LIMIT s" >>"$TMP/$cp_name.err"
  return $cp_rc
}

# srun_job NAME ARGS...: srun ARGS.
srun_job() {
  sj_name=$1
  shift
  capture "$sj_name" -- srun "$@"
}

# ompi_job NAME NP ARGS...: Open MPI's mpirun, as root, oversubscribed, on
# loopback; its session directory under $TMP, not /tmp.
ompi_job() {
  oj_name=$1 oj_np=$2
  shift 2
  mkdir -p "$TMP/mpitmp"
  capture "$oj_name" TMPDIR="$TMP/mpitmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 -- \
    mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np "$oj_np" "$@"
}

# mpich_job NAME NP ARGS...: MPICH's mpirun (hydra), forking the ranks here
# (never through srun or ssh), on loopback.
mpich_job() {
  mj_name=$1 mj_np=$2
  shift 2
  mkdir -p "$TMP/mpitmp"
  capture "$mj_name" TMPDIR="$TMP/mpitmp" -- mpirun.mpich -launcher fork -iface lo -np "$mj_np" "$@"
}

[ "${KT_SLURM_LIB:-0}" = 1 ] && return 0

# ---- the test ---------------------------------------------------------------

CASE=""
# fail: as lib.sh's, but only the current case's files, and only the case ends.
fail() {
  echo "FAIL: [$CASE] $*" >&2
  for f in "$TMP/$CASE".out "$TMP/$CASE".err "$TMP/$CASE".*.out "$TMP/$CASE".*.err; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 40 lines)" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
}
skip() { echo "SKIP: [$CASE] $*"; exit 77; }

need_c() {
  case $C_PROG in ''|-) skip "no C_PROG given" ;; esac
  [ -x "$C_PROG" ] || fail "C_PROG '$C_PROG' is not an executable"
}
need_py() {
  case $PY_PROG in ''|-) skip "no PY_PROG given" ;; esac
  [ -f "$PY_PROG" ] || fail "PY_PROG '$PY_PROG' does not exist"
  [ "$PY_TORCH" = yes ] || skip "$PYTHON cannot import torch"
}
need_slurm() { [ -n "$SLURM_DIR" ] || skip "no Slurm cluster (see above)"; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || skip "no '$1' here"; }

# count_pass FILE: lines holding "PASS" at the start or after a [rank] prefix.
PASS_RE='^(\[[0-9]+\] )?PASS'
count_pass() { grep -Ec "$PASS_RE" "$1"; }

# check_pass FILE N MIN: at least MIN lines "PASS ..." (MIN = N: one per
# rank). Where they say "rank R of N" or "rank=R ... size=N", every one must
# say size N and no rank may appear twice (ranks that each believe they are a
# job of their own also pass their checks).
check_pass() {
  cp_n=$(count_pass "$1")
  [ "$cp_n" -ge "$3" ] || fail "expected $3 PASS line(s), found $cp_n"
  grep -E "$PASS_RE" "$1" >"$1.pass"
  sizes=$(sed -n -E -e 's/.*[^a-z_]rank[= ]?[0-9]+ of ([0-9]+).*/\1/p;t' -e 's/.*[^a-z_]size=([0-9]+).*/\1/p' "$1.pass" | sort -u | tr '\n' ' ')
  [ -z "$sizes" ] || [ "$sizes" = "$2 " ] || fail "PASS lines give job size(s) $sizes- expected $2"
  dup=$(sed -n -E 's/.*[^a-z_]rank[= ]?([0-9]+).*/\1/p' "$1.pass" | sort -n | uniq -d | tr '\n' ' ')
  [ -z "$dup" ] || fail "rank(s) $dup- PASS more than once: several jobs instead of one"
  rm -f "$1.pass"
}

# New kaitian segments in /dev/shm since the case began.
shm_list() { ls /dev/shm 2>/dev/null | grep '^kaitian-' | sort; }

nnodes_up() { echo "$SLURM_NODES" | wc -w; }

case_srun_c() {
  need_slurm; need_c
  srun_job "$CASE" -n 4 "$C_PROG"
  expect_rc 0 $? "srun -n 4 C_PROG"
  check_pass "$TMP/$CASE.out" 4 4
}

case_srun_py() {
  need_slurm; need_py
  srun_job "$CASE" -n 3 "$PYTHON" "$PY_PROG"
  expect_rc 0 $? "srun -n 3 \$PYTHON PY_PROG"
  check_pass "$TMP/$CASE.out" 3 1
}

case_srun_launcher() {
  need_slurm; need_py
  srun_job "$CASE" -N 1 -n 1 "$KT" run -n 3 "$PY_PROG"
  expect_rc 0 $? "srun -N 1 -n 1 kaitian run -n 3 PY_PROG"
  check_pass "$TMP/$CASE.out" 3 1
}

# Several nodes (KT_SLURM_NODES >= 2, all on this host): 2 x 2 tasks, 3
# tasks as 2 + 1, and 3 tasks placed cyclically (ranks 0 and 2 on the first
# node), and the launcher once per node, 2 ranks each.
# srun_run NP SRUN_ARGS...: the job must exit 0, NP PASS lines.
srun_run() {
  sr_np=$1
  shift
  srun_job "$CASE" "$@"
  expect_rc 0 $? "srun $*"
  check_pass "$TMP/$CASE.out" "$sr_np" "$sr_np"
}

case_srun_nodes() {
  need_slurm; need_c
  [ "$(nnodes_up)" -ge 2 ] || skip "needs KT_SLURM_NODES=2 (or more)"
  sub 2x2 srun_run 4 -N 2 --ntasks-per-node=2 "$C_PROG"
  sub 2plus1 srun_run 3 -N 2 -n 3 "$C_PROG"
  sub cyclic srun_run 3 -N 2 -n 3 -m cyclic "$C_PROG"
  sub launcher srun_run 4 -N 2 --ntasks-per-node=1 "$KT" run -n 2 "$C_PROG"
  subs_done
}

# sub NAME FUNCTION ARGS...: one part of a case, as case CASE.NAME (its own
# files, its own FAIL line); a failed part does not stop the others. The
# case fails at its end (subs_done) if any part failed.
SUB_FAILED=0
sub() {
  sb_sub=$1
  shift
  ( CASE="$CASE.$sb_sub"; "$@" ) || SUB_FAILED=1
}
subs_done() { [ "$SUB_FAILED" = 0 ] || exit 1; }

# bad_env VAR SRUN_ARGS...: the job must fail within seconds, naming VAR.
bad_env() {
  be_var=$1
  shift
  t0=$(now_ms)
  JOB_LIMIT=30 srun_job "$CASE" "$@"
  rc=$?
  el=$(( $(now_ms) - t0 ))
  [ "$rc" = 0 ] && fail "exit 0 with an inconsistent Slurm environment (srun $*)"
  [ "$rc" = 124 ] && fail "still running after 30 s (must fail at once; srun $*)"
  [ "$el" -le 15000 ] || fail "took $el ms to fail (must fail at once)"
  grep -v '^srun: ' "$TMP/$CASE.err" | grep -q -- "$be_var" ||
    fail "stderr does not name $be_var"
  echo "  $CASE: exit $rc after $el ms: $(grep -v '^srun: ' "$TMP/$CASE.err" | grep -m 1 -- "$be_var")"
}

# A Slurm step environment that contradicts itself: the job must not run.
case_srun_bad() {
  need_slurm; need_c
  # 5 tasks by count, 2 by the tasks-per-node list (and 2 started).
  sub ntasks bad_env SLURM_ -n 2 env SLURM_NTASKS=5 SLURM_STEP_NUM_TASKS=5 "$C_PROG"
  # A step's task without its rank.
  sub noprocid bad_env SLURM_PROCID -n 2 env -u SLURM_PROCID "$C_PROG"
  sub procid bad_env SLURM_PROCID -n 2 env SLURM_PROCID=9 "$C_PROG"
  sub localid bad_env SLURM_LOCALID -n 2 env SLURM_LOCALID=7 "$C_PROG"
  subs_done
}

# MPI started inside a Slurm allocation, as users do: salloc runs mpirun
# here; in an allocation both mpiruns start their per-node daemons with srun
# (MPICH's hydra even on one node), so each rank inherits a Slurm step
# environment of its own (SLURM_PROCID = the node's index,
# SLURM_STEP_NUM_TASKS = the nodes) besides the MPI variables. One job of N
# ranks must come out, not N jobs of one rank. Two nodes where the cluster
# has them; MPI does not tell a rank where rank 0 runs, so there the jobs get
# MASTER_ADDR (the first node, where mpirun puts rank 0), as users must.
alloc_shape() {
  if [ "$(nnodes_up)" -ge 2 ]; then
    AL_ARGS="-N 2 -n 4" AL_NP=4
    MASTER_ADDR=$SLURM_NODE
    export MASTER_ADDR
  else
    AL_ARGS="-n 2" AL_NP=2
  fi
}

# salloc_job NAME SALLOC_ARGS... COMMAND...: salloc, as srun_job.
salloc_job() {
  sa_name=$1
  shift
  capture "$sa_name" TMPDIR="$TMP/mpitmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 -- salloc "$@"
}

# sbatch_job NAME SBATCH_ARGS... -- SCRIPT LINES...: a batch job (sbatch -W)
# whose script is the lines; its output in $TMP/NAME.out/.err.
sbatch_job() {
  sb_name=$1
  shift
  sb_args=""
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sb_args="$sb_args $1"; shift; done
  shift
  { echo '#!/bin/sh'; for l in "$@"; do echo "$l"; done; } >"$TMP/$sb_name.sh"
  # shellcheck disable=SC2086
  env "$SMARK" TMPDIR="$TMP/mpitmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 5 "$JOB_LIMIT" sbatch -W -Q $sb_args -o "$TMP/$sb_name.out" -e "$TMP/$sb_name.err" \
    "$TMP/$sb_name.sh" >"$TMP/$sb_name.sbatch" 2>&1 </dev/null
}

OMPI_OPTS="--allow-run-as-root --oversubscribe --bind-to none --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"

case_alloc_ompi() {
  need_slurm; need_cmd mpirun.openmpi; need_c
  alloc_shape
  mkdir -p "$TMP/mpitmp"
  # shellcheck disable=SC2086
  salloc_job "$CASE" $AL_ARGS mpirun.openmpi $OMPI_OPTS -np "$AL_NP" "$C_PROG"
  expect_rc 0 $? "salloc $AL_ARGS mpirun.openmpi -np $AL_NP C_PROG"
  check_pass "$TMP/$CASE.out" "$AL_NP" "$AL_NP"
}

case_alloc_mpich() {
  need_slurm; need_cmd mpirun.mpich; need_c
  alloc_shape
  mkdir -p "$TMP/mpitmp"
  # shellcheck disable=SC2086
  salloc_job "$CASE" $AL_ARGS mpirun.mpich -iface lo -np "$AL_NP" "$C_PROG"
  expect_rc 0 $? "salloc $AL_ARGS mpirun.mpich -np $AL_NP C_PROG"
  check_pass "$TMP/$CASE.out" "$AL_NP" "$AL_NP"
}

# The batch script's shell has SLURM_PROCID=0 and SLURM_NTASKS=N but no
# SLURM_STEP_ID: mpirun's ranks and the launcher's inherit that.
# batch_run NP SBATCH_ARGS... -- LINE: the batch job must exit 0, NP PASS.
batch_run() {
  br_np=$1
  shift
  sbatch_job "$CASE" "$@"
  expect_rc 0 $? "sbatch $*"
  check_pass "$TMP/$CASE.out" "$br_np" "$br_np"
}

case_batch_mpi() {
  need_slurm; need_c
  alloc_shape
  mkdir -p "$TMP/mpitmp"
  # shellcheck disable=SC2086
  if command -v mpirun.openmpi >/dev/null 2>&1; then
    sub ompi batch_run "$AL_NP" $AL_ARGS -- "exec mpirun.openmpi $OMPI_OPTS -np $AL_NP '$C_PROG'"
  fi
  # shellcheck disable=SC2086
  if command -v mpirun.mpich >/dev/null 2>&1; then
    sub mpich batch_run "$AL_NP" $AL_ARGS -- "exec mpirun.mpich -iface lo -np $AL_NP '$C_PROG'"
  fi
  # The launcher in the batch script: not a step, so its own shape.
  sub launcher batch_run 2 -n 2 -- "exec '$KT' run -n 2 '$C_PROG'"
  subs_done
}

case_ompi_c() {
  need_cmd mpirun.openmpi; need_c
  ompi_job "$CASE" 3 "$C_PROG"
  expect_rc 0 $? "mpirun.openmpi -np 3 C_PROG"
  check_pass "$TMP/$CASE.out" 3 3
}

case_ompi_py() {
  need_cmd mpirun.openmpi; need_py
  ompi_job "$CASE" 2 "$PYTHON" "$PY_PROG"
  expect_rc 0 $? "mpirun.openmpi -np 2 \$PYTHON PY_PROG"
  check_pass "$TMP/$CASE.out" 2 1
}

case_mpich_c() {
  need_cmd mpirun.mpich; need_c
  mpich_job "$CASE" 3 "$C_PROG"
  expect_rc 0 $? "mpirun.mpich -np 3 C_PROG"
  check_pass "$TMP/$CASE.out" 3 3
}

case_mpich_py() {
  need_cmd mpirun.mpich; need_py
  mpich_job "$CASE" 2 "$PYTHON" "$PY_PROG"
  expect_rc 0 $? "mpirun.mpich -np 2 \$PYTHON PY_PROG"
  check_pass "$TMP/$CASE.out" 2 1
}

# The launcher-related variables of each process, "== WHERE" before each set.
ENV_PAT='^(SLURM|SLURMD|OMPI|PMIX|PMI|HYDRA|MPI_|MPIR_)'
show_env() { env | grep -E "$ENV_PAT" | grep -Ev '^(SLURM_CONF|OMPI_ALLOW_RUN_AS_ROOT|OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)=' | sort | sed "s/^/$1: /"; }

case_envdump() {
  # The script exports show_env to the jobs through a helper file.
  h=$TMP/show_env.sh
  {
    echo "ENV_PAT='$ENV_PAT'"
    echo "r=\${1:-?}; [ \"\$r\" = rank ] && r=\${SLURM_PROCID:-\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-?}}}"
    echo "env | grep -E \"\$ENV_PAT\" | grep -Ev '^(SLURM_CONF|OMPI_ALLOW_RUN_AS_ROOT|OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)=' | sort | sed \"s/^/\$r: /\""
    echo "echo \"\$r: (host name \$(hostname))\""
  } >"$h"
  if [ -n "$SLURM_DIR" ]; then
    echo "== srun -n 4 (each task)"
    srun_job "$CASE.srun" -n 4 sh "$h" rank; sort -s -t: -k1,1n "$TMP/$CASE.srun.out"
    if [ "$(echo "$SLURM_NODES" | wc -w)" -ge 2 ]; then
      for a in "-N 2 -n 3" "-N 2 -n 4 -m cyclic" "-N 2 --ntasks-per-node=2"; do
        echo "== srun $a (each task)"
        # shellcheck disable=SC2086
        srun_job "$CASE.nodes" $a sh "$h" rank; sort -s -t: -k1,1n "$TMP/$CASE.nodes.out"
      done
    fi
    echo "== salloc -n 2: the allocation's shell (alloc), srun in it (step), srun -N 1 -n 1 in it (one)"
    env "$SMARK" timeout 60 salloc -n 2 sh -c "sh $h alloc; srun sh $h rank; srun -N 1 -n 1 sh $h one" \
      >"$TMP/$CASE.salloc.out" 2>"$TMP/$CASE.salloc.err" </dev/null
    cat "$TMP/$CASE.salloc.out"
    echo "== sbatch -n 2: the batch script (batch), srun in it (step)"
    printf '#!/bin/sh\nsh %s batch\nsrun sh %s rank\n' "$h" "$h" >"$TMP/$CASE.job.sh"
    env "$SMARK" timeout 60 sbatch -W -n 2 -o "$TMP/$CASE.sbatch.out" "$TMP/$CASE.job.sh" >/dev/null </dev/null
    cat "$TMP/$CASE.sbatch.out"
  fi
  if command -v mpirun.openmpi >/dev/null 2>&1; then
    echo "== mpirun.openmpi -np 2"
    ompi_job "$CASE.ompi" 2 sh "$h" rank; sort -s -t: -k1,1n "$TMP/$CASE.ompi.out"
  fi
  if command -v mpirun.mpich >/dev/null 2>&1; then
    echo "== mpirun.mpich -np 2"
    mpich_job "$CASE.mpich" 2 sh "$h" rank; sort -s -t: -k1,1n "$TMP/$CASE.mpich.out"
  fi
}

case_hold() {
  need_slurm
  echo "cluster up: export SLURM_CONF=$SLURM_CONF   (nodes $SLURM_NODES; kill -TERM $$ to end)"
  env "$SMARK" sleep "${KT_SLURM_HOLD:-600}"
}

ALL="srun_c srun_py srun_launcher srun_bad alloc_ompi alloc_mpich batch_mpi ompi_c ompi_py mpich_c mpich_py"
if [ -z "$CASES" ]; then
  CASES=$ALL
  [ "${KT_SLURM_NODES:-1}" -ge 2 ] && CASES="$CASES srun_nodes"
fi
for c in $CASES; do
  case " $ALL srun_nodes envdump hold " in *" $c "*) ;; *) echo "FAIL: unknown case '$c' (cases: $ALL srun_nodes envdump hold)" >&2; exit 1 ;; esac
done

CASE_PID=""
on_exit() {
  rc=$?
  [ -n "$CASE_PID" ] && kill -TERM "$CASE_PID" 2>/dev/null
  slurm_down
  cleanup
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE

SHM_BEFORE=$(shm_list)
# Whether $PYTHON has torch, once (the import takes seconds).
PY_TORCH=no
case " $CASES " in
  *_py\ *|*\ srun_launcher\ *) "$PYTHON" -c 'import torch' 2>/dev/null && PY_TORCH=yes ;;
esac
# Bring Slurm up only when a case needs it.
want_slurm=0
for c in $CASES; do case $c in srun_*|alloc_*|batch_*|envdump|hold) want_slurm=1 ;; esac; done
if [ $want_slurm = 1 ]; then
  t0=$(now_ms)
  slurm_up
  up_rc=$?
  if [ $up_rc = 0 ]; then
    echo "slurm up in $(( $(now_ms) - t0 )) ms (nodes $SLURM_NODES, SLURM_CONF=$SLURM_CONF)"
  else
    [ $up_rc = 77 ] || exit 1
    slurm_down     # what did start, stops; the srun cases skip
  fi
fi

passed=0 failed=0 skipped=0 failures=""
for c in $CASES; do
  CASE=$c
  t0=$(now_ms)
  # In the background, so that a signal to this shell ends the run at once.
  ( "case_$c" ) &
  CASE_PID=$!
  wait $CASE_PID
  rc=$?
  CASE_PID=""
  left=$(printf '%s\n' "$(shm_list)" | grep -vxF -- "$SHM_BEFORE" | grep . || true)
  if [ -n "$left" ] && [ "$rc" != 77 ]; then
    echo "FAIL: [$c] left in /dev/shm: $(echo "$left" | tr '\n' ' ')" >&2
    for s in $left; do rm -f "/dev/shm/$s"; done
    rc=1
  fi
  el=$(( $(now_ms) - t0 ))
  case $rc in
    0) passed=$((passed + 1)); echo "ok   $c ($el ms)" ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)); failures="$failures $c"; echo "FAIL $c ($el ms)" ;;
  esac
done

if [ -n "$SLURM_DIR" ]; then
  t0=$(now_ms)
  slurm_down
  echo "slurm down in $(( $(now_ms) - t0 )) ms"
fi
left=$(smark_pids)
[ -z "$left" ] || { echo "FAIL: processes left behind: $left" >&2; failed=$((failed + 1)); }

echo "slurm.sh: $passed passed, $failed failed, $skipped skipped"
[ $failed = 0 ] || { echo "FAIL slurm:$failures" >&2; exit 1; }
[ $passed = 0 ] && [ $skipped -gt 0 ] && exit 77
echo "PASS slurm"
exit 0
