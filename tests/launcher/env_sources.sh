# env_sources.sh - the job's shape from each source kt_job_from_env reads,
# with processes started by hand in the environment each cluster manager
# gives its tasks (the real srun and mpirun are in slurm.sh): torchrun-style
# variables with no launcher (rank 0 serves the store), Slurm's, Open MPI's
# and PMI's; launchers shaped by Slurm's variables; inconsistent and
# half-set environments; kaitian run --local-rank-arg.
#   sh env_sources.sh KAITIAN_CLI LAUNCH_ENV_TEST [PYTHON_TEST]
. "$(dirname "$0")/lib.sh" "$@"
PROG=${2:?usage: $0 KAITIAN_CLI LAUNCH_ENV_TEST [PYTHON_TEST]}
PYTEST=${3:-}
PY=${PYTHON:-/usr/bin/python3}
export HOME="$TMP" # no ~/.kaitian/secret of the user's
unset KAITIAN_JOB_SECRET KAITIAN_STORE_ADDR RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR \
  MASTER_PORT GROUP_RANK TORCHELASTIC_RUN_ID 2>/dev/null
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p;s/^\(OMPI_[A-Z_]*\)=.*/\1/p;s/^\(PMI_[A-Z_]*\)=.*/\1/p'); do
  unset "$v"
done
JOBID=$$

# start N NAME CMD...: N processes; CMD is eval'ed with $k set to the index.
# Waits up to 60 s; RC_NAME_k hold the exit codes.
start() {
  n=$1 name=$2
  shift 2
  k=0
  while [ $k -lt "$n" ]; do
    (eval "$@") >"$TMP/$name.$k.out" 2>"$TMP/$name.$k.err" &
    echo $! >"$TMP/$name.$k.pid"
    k=$((k + 1))
  done
  k=0
  t0=$(date +%s)
  while [ $k -lt "$n" ]; do
    pid=$(cat "$TMP/$name.$k.pid")
    while kill -0 "$pid" 2>/dev/null; do
      [ $(($(date +%s) - t0)) -gt 60 ] && { kill -9 "$pid"; fail "$name: process $k hangs"; }
      sleep 0.05
    done
    wait "$pid"
    eval "RC_${name}_$k=$?"
    k=$((k + 1))
  done
}

all_pass() {
  n=$1 name=$2
  k=0
  while [ $k -lt "$n" ]; do
    eval "rc=\$RC_${name}_$k"
    [ "$rc" = 0 ] || { cat "$TMP/$name.$k.err" >&2; fail "$name: process $k exited $rc"; }
    k=$((k + 1))
  done
  c=$(cat "$TMP"/$name.*.out | grep -c "PASS launch")
  [ "$c" = "$3" ] || fail "$name: $c PASS lines, expected $3"
  echo "$name: $3 PASS lines"
}

# all_fail N NAME PATTERN...: every process exited non-zero, each message
# matching every pattern.
all_fail() {
  n=$1 name=$2
  shift 2
  k=0
  while [ $k -lt "$n" ]; do
    eval "rc=\$RC_${name}_$k"
    [ "$rc" != 0 ] || fail "$name: process $k exited 0"
    for p in "$@"; do
      grep -q -- "$p" "$TMP/$name.$k.err" || { cat "$TMP/$name.$k.err" >&2; fail "$name: no '$p' in process $k's error"; }
    done
    k=$((k + 1))
  done
  echo "$name: every process failed: $(head -c 300 "$TMP/$name.0.err")"
}

slurm_vars() { # slurm_vars K NTASKS: task K of an srun step on this host
  echo "SLURM_PROCID=$1 SLURM_STEP_ID=0 SLURM_JOB_ID=$JOBID SLURM_NTASKS=$2 SLURM_NNODES=1 SLURM_NODEID=0" \
    "SLURM_LOCALID=$1 SLURM_STEP_NODELIST=localhost SLURM_JOB_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=$2"
}

echo "== torchrun's variables, no launcher: rank 0 serves the store at MASTER_PORT"
PORT=$((20000 + JOBID % 10000))
start 3 torchvars 'env RANK=$k WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$PROG" --expect-size 3 --expect-source torchrun'
all_pass 3 torchvars 3

echo "== Slurm's variables (srun -n 3 on one node)"
start 3 slurm 'env $(slurm_vars $k 3) "$PROG" --expect-size 3 --expect-source slurm'
all_pass 3 slurm 3
grep -q "source slurm local 2/3" "$TMP"/slurm.2.out || fail "slurm: task 2 is not local 2 of 3"

echo "== Open MPI's variables (mpirun -np 3 on one host)"
start 3 ompi 'env OMPI_COMM_WORLD_RANK=$k OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_RANK=$k OMPI_COMM_WORLD_LOCAL_SIZE=3 PMIX_NAMESPACE=ktns$JOBID "$PROG" --expect-size 3 --expect-source openmpi'
all_pass 3 ompi 3

echo "== PMI's variables (MPICH's mpirun -np 2)"
start 2 pmi 'env PMI_RANK=$k PMI_SIZE=2 MPI_LOCALRANKID=$k MPI_LOCALNRANKS=2 PMI_KVSNAME=kvs_$JOBID "$PROG" --expect-size 2 --expect-source pmi'
all_pass 2 pmi 2

echo "== inconsistent and half-set environments fail at once, naming the variables"
start 1 badslurm 'env $(slurm_vars 0 2) SLURM_PROCID=2 "$PROG"'
all_fail 1 badslurm "SLURM_PROCID=2 is not below SLURM_NTASKS=2"
start 1 badtpn 'env $(slurm_vars 1 2) SLURM_STEP_TASKS_PER_NODE=1 "$PROG"'
all_fail 1 badtpn "SLURM_LOCALID" "SLURM_STEP_TASKS_PER_NODE"
start 1 badlist 'env $(slurm_vars 0 2) SLURM_STEP_NODELIST="node[1-" "$PROG"'
all_fail 1 badlist "SLURM_STEP_NODELIST" "without"
start 1 halftorch 'env RANK=0 "$PROG"'
all_fail 1 halftorch "RANK is set but WORLD_SIZE is not"
start 1 halfompi 'env OMPI_COMM_WORLD_SIZE=2 "$PROG"'
all_fail 1 halfompi "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"
start 1 ompihosts 'env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2 "$PROG"'
all_fail 1 ompihosts "MASTER_ADDR"

echo "== two launchers shaped by Slurm's variables (srun -N 2 --ntasks-per-node 1 kaitian run -n 2)"
start 2 launchers 'env SLURM_PROCID=$k SLURM_STEP_ID=0 SLURM_JOB_ID=$JOBID SLURM_NTASKS=2 SLURM_NNODES=2 SLURM_NODEID=$k SLURM_LOCALID=0 SLURM_STEP_NODELIST=localhost,localhost SLURM_STEP_TASKS_PER_NODE="1(x2)" KAITIAN_DEBUG=INFO "$KT" run -n 2 "$PROG" --expect-size 4 --expect-source torchrun'
all_pass 2 launchers 4
grep -q "node 1 of 2 from Slurm (job slurm-$JOBID.0)" "$TMP/launchers.1.err" ||
  { cat "$TMP/launchers.1.err" >&2; fail "launchers: node 1 did not say where its shape came from"; }
start 1 launchbad 'env $(slurm_vars 0 2) SLURM_NNODES=3 "$KT" run -n 1 "$PROG"'
eval "rc=\$RC_launchbad_0"
[ "$rc" = 2 ] && grep -q "SLURM_NNODES=3" "$TMP/launchbad.0.err" ||
  { cat "$TMP/launchbad.0.err" >&2; fail "launchbad: exit $rc, expected 2 naming SLURM_NNODES=3"; }
echo "launchbad: exit 2: $(cat "$TMP/launchbad.0.err")"

echo "== kaitian run --local-rank-arg"
printf '#!/bin/sh\necho "ARGS $*"\n' >"$TMP/args.sh"
chmod +x "$TMP/args.sh"
"$KT" run -n 2 --local-rank-arg "$TMP/args.sh" a "b c" >"$TMP/lra.out" 2>&1 || fail "local-rank-arg: exit $?"
grep -qx '\[1\] ARGS --local_rank=1 a b c' "$TMP/lra.out" || { cat "$TMP/lra.out"; fail "local-rank-arg: rank 1's arguments"; }
if [ -n "$PYTEST" ] && "$PY" -c 'import torch' 2>/dev/null; then
  printf 'import sys\nprint("PYARGS", sys.argv[1:])\n' >"$TMP/args.py"
  "$KT" run -n 2 --local-rank-arg "$TMP/args.py" x >"$TMP/lrapy.out" 2>&1 || fail "local-rank-arg .py: exit $?"
  grep -qF "[0] PYARGS ['--local_rank=0', 'x']" "$TMP/lrapy.out" || { cat "$TMP/lrapy.out"; fail "local-rank-arg .py"; }
  echo "local-rank-arg: passed to a program and to a .py"

  echo "== Python: Slurm's variables, torch_kaitian.init_process_group() and a plain dist.init_process_group"
  JOBID=$((JOBID + 1))
  start 3 pyhelper 'env $(slurm_vars $k 3) "$PY" "$PYTEST" helper --expect-size 3 --expect-source slurm'
  all_pass 3 pyhelper 3
  JOBID=$((JOBID + 1))
  start 2 pyplain 'env OMPI_COMM_WORLD_RANK=$k OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=$k OMPI_COMM_WORLD_LOCAL_SIZE=2 PMIX_NAMESPACE=ktns$JOBID "$PY" "$PYTEST" plain --expect-size 2 --expect-source openmpi'
  all_pass 2 pyplain 2
  start 1 pybad 'env $(slurm_vars 0 2) SLURM_NTASKS=x SLURM_STEP_NUM_TASKS=x "$PY" "$PYTEST" helper'
  all_fail 1 pybad "SLURM_STEP_NUM_TASKS=x"
else
  echo "note: no Python test given or no torch; the Python cases are skipped"
fi
echo "PASS env_sources"
