#!/bin/sh
# devices.sh - `kaitian run --devices`, the device plan: the environment each
# rank sees (KAITIAN_DEVICE, LOCAL_WORLD_SIZE, its CPUs, OMP_NUM_THREADS);
# every plan error is one line and exit 2 (malformed SPEC, -n disagreeing,
# unknown type, more ranks than devices, a type switched off, a bad switch,
# discovery failing); auto asks torch only for a .py program, once, and
# puts no CPU rank beside accelerators (-n beyond them is an error naming
# auto+cpu), auto+cpu fills up with CPU ranks; the USE_<TYPE> /
# KAITIAN_USE_<TYPE> switches; KAITIAN_DEVICES as the default;
# the plan at INFO; a plan per node. Accelerators are played by a fake
# $PYTHON that answers the discovery with FAKE_DEVICES, so the CUDA paths are
# checked on a host without a GPU. Args: KAITIAN_CLI
. "$(dirname "$0")/lib.sh" "$@"
unset OMP_NUM_THREADS KAITIAN_DEVICES KAITIAN_DEBUG USE_CPU USE_CUDA USE_XPU KAITIAN_USE_CPU \
  KAITIAN_USE_CUDA KAITIAN_USE_XPU

# The fake interpreter: `-c SCRIPT` (the discovery) prints FAKE_DEVICES (or
# fails with FAKE_ERR, or sleeps with FAKE_SLEEP) and counts itself in
# disc.log; anything else is a rank running train.py: it prints its plan.
cat >"$TMP/fakepy" <<EOF
#!/bin/sh
if [ "\$1" = -c ]; then
  case "\$2" in *device_count*)
    echo x >>"$TMP/disc.log"
    [ -n "\${FAKE_SLEEP:-}" ] && exec "$SLEEPER" "\$FAKE_SLEEP"
    if [ -n "\${FAKE_ERR:-}" ]; then printf 'Traceback (most recent call last):\n%s\n' "\$FAKE_ERR" >&2; exit 1; fi
    printf '%b' "\${FAKE_DEVICES:-}"
    exit 0;;
  esac
fi
echo "dev=\$KAITIAN_DEVICE lws=\$LOCAL_WORLD_SIZE omp=\$OMP_NUM_THREADS cpus=\$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)"
EOF
chmod +x "$TMP/fakepy"
FAKE="$TMP/fakepy"
echo 'print("never run by fakepy")' >"$TMP/train.py"
PROBE='echo "dev=$KAITIAN_DEVICE lws=$LOCAL_WORLD_SIZE omp=$OMP_NUM_THREADS cpus=$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'

# The CPUs of a list: "0-2,5" -> "0 1 2 5 ".
expand() {
  echo "$1" | awk '{ n = split($1, a, ",");
    for (i = 1; i <= n; i++) { m = split(a[i], b, "-"); hi = m > 1 ? b[2] : b[1];
      for (c = b[1] + 0; c <= hi + 0; c++) printf "%d ", c } }'
}
# The words FROM..TO-1 (0-based) of a list.
slice() { echo "$3" | awk -v lo="$1" -v hi="$2" '{ for (i = lo + 1; i <= hi; i++) printf "%s ", $i }'; }
ALL=$(expand "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)")
C=$(echo "$ALL" | wc -w)
[ "$C" -ge 1 ] || fail "cannot read this process's CPUs"

# check OUT RANK DEV LWS CPU_FROM CPU_TO OMP: rank RANK of OUT runs on DEV in a
# job of LWS local ranks, bound to the launcher's CPUs FROM..TO-1 (FROM "all":
# not bound) with that OMP_NUM_THREADS.
check() {
  line=$(sed -n "s/^\[$2\] //p" "$TMP/$1.out")
  [ -n "$line" ] || fail "$1: no output from rank $2"
  case "$line" in "dev=$3 lws=$4 omp=$7 cpus="*) ;; *)
    fail "$1: rank $2: expected dev=$3 lws=$4 omp=$7 in: $line" ;; esac
  if [ "$5" = all ]; then want=$ALL; else want=$(slice "$5" "$6" "$ALL"); fi
  got=$(expand "${line##*cpus=}")
  [ "$got" = "$want" ] || fail "$1: rank $2 bound to '$got', expected '$want' (of '$ALL')"
}
nranks() { grep -c '^\[[0-9]*\] dev=' "$TMP/$1.out"; }
# one_error NAME RC PATTERN: exit RC, exactly one line on stderr, matching.
one_error() {
  expect_rc "$2" "$RC" "$1"
  [ "$(wc -l <"$TMP/$1.err")" = 1 ] || fail "$1: expected one line on stderr"
  expect_grep "$3" "$TMP/$1.err" "$1"
  [ -s "$TMP/$1.out" ] && fail "$1: ranks ran"
  return 0
}
# run NAME [VAR=VALUE...] ARGS...: `kaitian run ARGS` with those variables
# (in a subshell: assignments before a function call may outlive it), its
# output in NAME.out and NAME.err, its status in RC.
run() {
  name=$1
  shift
  (
    while [ $# -gt 0 ]; do
      case $1 in [A-Z]*=*) export "$1"; shift ;; *) break ;; esac
    done
    exec "$KT" run "$@"
  ) >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
}
discoveries() { if [ -f "$TMP/disc.log" ]; then wc -l <"$TMP/disc.log" | tr -d ' '; else echo 0; fi; }
omp_unbound() { o=$((C / $1)); [ $o -lt 1 ] && o=1; echo $o; }

# 1. An explicit CPU plan: 3 ranks, KAITIAN_DEVICE=cpu (an inherited value is
# replaced), LOCAL_WORLD_SIZE 3, blocks as with -n 3; torch is never asked.
export PYTHON="$FAKE"
run cpu3 KAITIAN_DEVICE=stale --devices cpu:3 sh -c "$PROBE"
expect_rc 0 $RC "--devices cpu:3"
[ "$(nranks cpu3)" = 3 ] || fail "--devices cpu:3 started $(nranks cpu3) ranks"
for r in 0 1 2; do
  if [ "$C" -ge 3 ]; then
    check cpu3 $r cpu 3 $((r * C / 3)) $(((r + 1) * C / 3)) $(((r + 1) * C / 3 - r * C / 3))
  else
    check cpu3 $r cpu 3 all - "$(omp_unbound 3)"
  fi
done
run cpu3n -n3 --devices=cpu:3 "$TMP/train.py"
expect_rc 0 $RC "-n3 --devices=cpu:3 train.py"
[ "$(nranks cpu3n)" = 3 ] || fail "-n 3 --devices cpu:3: $(nranks cpu3n) ranks"
[ "$(discoveries)" = 0 ] || fail "a CPU-only plan asked torch for devices"

# 2. Errors of the SPEC itself and of -n: one line, exit 2, nothing runs.
run nbad -n 2 --devices cpu:3 true
one_error nbad 2 '^kaitian run: -n 2 disagrees with --devices cpu:3 \(3 ranks\)$'
run s_zero --devices cpu:0 true
one_error s_zero 2 "cpu:0.*COUNT must be at least 1"
run s_x --devices cpu:x true
one_error s_x 2 "COUNT 'x' in 'cpu:x' is not a number of ranks"
run s_dup --devices cpu,cpu true
one_error s_dup 2 "cpu,cpu: cpu is listed twice"
run s_empty --devices "" true
one_error s_empty 2 "--devices '' is empty"
run s_item --devices cpu:1,,cpu:2 true
one_error s_item 2 "empty item"
run s_type --devices CUDA:1 true
one_error s_type 2 "bad device type 'CUDA'"
run s_auto --devices auto,cpu:1 true
one_error s_auto 2 "auto stands alone"
run s_autocpu --devices auto+cpu,cpu:1 true
one_error s_autocpu 2 "^kaitian run: --devices auto\\+cpu,cpu:1: auto\\+cpu stands alone, it cannot be combined with other items\$"
run s_autocpu2 --devices cuda:1,auto+cpu true
one_error s_autocpu2 2 "auto\\+cpu stands alone"
run s_autocpu3 KAITIAN_DEVICES=cpu,auto+cpu true
one_error s_autocpu3 2 "^kaitian run: KAITIAN_DEVICES=cpu,auto\\+cpu: auto\\+cpu stands alone"
run s_autogpu --devices auto+gpu true
one_error s_autogpu 2 "bad device type 'auto\\+gpu'"
run s_cpa --cpus-per-accel 0 --devices cpu:1 true
one_error s_cpa 2 "bad value '0' for --cpus-per-accel"
[ "$(discoveries)" = 0 ] || fail "a malformed SPEC asked torch for devices"

# 3. Switches: off needs a plan without the type; a bad value is an error.
run sw_off --devices cpu:2 true
expect_rc 0 $RC "--devices cpu:2"
run sw_off USE_CPU=0 --devices cpu:2 true
one_error sw_off 2 '^kaitian run: --devices cpu:2 needs CPU, switched off by USE_CPU=0$'
run sw_off2 KAITIAN_USE_CPU=off -n 2 true
one_error sw_off2 2 "no device left for the ranks: the CPU is switched off by KAITIAN_USE_CPU=off"
run sw_win KAITIAN_USE_CPU=1 USE_CPU=0 --devices cpu:1 sh -c "$PROBE"
expect_rc 0 $RC "KAITIAN_USE_CPU=1 wins over USE_CPU=0"
run sw_bad USE_CPU=maybe --devices cpu:2 true
one_error sw_bad 2 "^kaitian run: USE_CPU=maybe is not a switch"

# 4. KAITIAN_DEVICES is the default; --devices wins; its errors name it.
run kd KAITIAN_DEVICES=cpu:2 sh -c "$PROBE"
expect_rc 0 $RC "KAITIAN_DEVICES=cpu:2"
[ "$(nranks kd)" = 2 ] && grep -q '^\[1\] dev=cpu lws=2 ' "$TMP/kd.out" || fail "KAITIAN_DEVICES=cpu:2 not followed"
run kd1 KAITIAN_DEVICES=cpu:2 --devices cpu:1 sh -c "$PROBE"
[ "$(nranks kd1)" = 1 ] || fail "--devices cpu:1 did not win over KAITIAN_DEVICES=cpu:2"
run kdn KAITIAN_DEVICES=cpu:2 -n 3 true
one_error kdn 2 '^kaitian run: -n 3 disagrees with KAITIAN_DEVICES=cpu:2 \(2 ranks\)$'
run kd0 KAITIAN_DEVICES=cpu:0 true
one_error kd0 2 "KAITIAN_DEVICES=cpu:0"

# 5. auto with a program that is not .py: no discovery at all, -n CPU ranks,
# even where no Python exists.
run noc PYTHON="$TMP/no-such-python" -n 2 sh -c "$PROBE"
expect_rc 0 $RC "auto, C program, PYTHON missing"
[ "$(nranks noc)" = 2 ] && grep -q '^\[0\] dev=cpu lws=2 ' "$TMP/noc.out" || fail "auto C program: not 2 CPU ranks"
[ -s "$TMP/noc.err" ] && fail "auto C program: the launcher said something"

# 6. The plan at INFO, one line per rank; nothing at the default level.
run info KAITIAN_DEBUG=INFO --devices cpu:2 true
expect_rc 0 $RC "KAITIAN_DEBUG=INFO"
for r in 0 1; do
  if [ "$C" -ge 2 ]; then cpus="CPUs [0-9,-]+"; else cpus="not bound"; fi
  expect_grep "^kaitian run: plan: rank $r -> cpu \\($cpus\\)\$" "$TMP/info.err" "INFO plan line of rank $r"
done
grep -q 'plan:' "$TMP/cpu3.err" && fail "plan printed at the default level"

# 7. Accelerators (fake: 2 CUDA devices). cuda:2,cpu:1: devices in plan
# order, one CPU for each cuda rank first, the rest for the cpu rank; all
# unbound when the CPUs do not suffice (fewer than 3).
export FAKE_DEVICES='cuda 2\n'
run acc --devices cuda:2,cpu:1 sh -c "$PROBE"
expect_rc 0 $RC "--devices cuda:2,cpu:1"
[ "$(discoveries)" = 1 ] || fail "--devices cuda:2,cpu:1 asked torch $(discoveries) times, expected once"
if [ "$C" -ge 3 ]; then
  check acc 0 cuda:0 3 0 1 1; check acc 1 cuda:1 3 1 2 1; check acc 2 cpu 3 2 "$C" $((C - 2))
else
  o=$(omp_unbound 3)
  check acc 0 cuda:0 3 all - "$o"; check acc 1 cuda:1 3 all - "$o"; check acc 2 cpu 3 all - "$o"
fi
if [ "$C" -ge 2 ]; then
  run acc2 --devices cpu:1,cuda:1 sh -c "$PROBE"  # the accelerator's CPU comes first
  check acc2 0 cpu 2 1 "$C" $((C - 1)); check acc2 1 cuda:0 2 0 1 1
  run acc3 --devices cuda:1 --cpus-per-accel 2 sh -c "$PROBE"
  check acc3 0 cuda:0 1 0 2 2
  run acc4 --devices cuda:1,cpu:1 --cpus-per-accel 2 sh -c "$PROBE"
  if [ "$C" -ge 3 ]; then check acc4 0 cuda:0 2 0 2 2; check acc4 1 cpu 2 2 "$C" $((C - 2))
  else check acc4 0 cuda:0 2 all - "$(omp_unbound 2)"; check acc4 1 cpu 2 all - "$(omp_unbound 2)"; fi
fi
run acc_many --devices cuda:3 true
one_error acc_many 2 '^kaitian run: --devices cuda:3: this host has 2 CUDA devices$'
run acc_tpu --devices tpu:1 true
one_error acc_tpu 2 "^kaitian run: --devices: unknown device type 'tpu' \\(this host's torch knows: cuda \\(2 devices\\), cpu\\)\$"
run acc_off USE_CUDA=0 --devices cuda:1 true
one_error acc_off 2 '^kaitian run: --devices cuda:1 needs CUDA, switched off by USE_CUDA=0$'

# 8. auto with a .py program: one rank per accelerator, or the first -n of
# them; -n beyond them is an error (no CPU rank beside accelerators unless
# asked for: auto+cpu or an explicit plan); auto+cpu fills up with CPU ranks;
# with no accelerator both give -n CPU ranks; torch is asked once per launch.
rm -f "$TMP/disc.log"
run auto "$TMP/train.py"
expect_rc 0 $RC "auto train.py"
[ "$(nranks auto)" = 2 ] || fail "auto with 2 CUDA devices: $(nranks auto) ranks"
grep -q '^\[0\] dev=cuda:0 lws=2 ' "$TMP/auto.out" && grep -q '^\[1\] dev=cuda:1 lws=2 ' "$TMP/auto.out" \
  || fail "auto: not cuda:0 and cuda:1"
[ "$(discoveries)" = 1 ] || fail "auto asked torch $(discoveries) times"
run auto3 -n 3 "$TMP/train.py"
one_error auto3 2 "^kaitian run: -n 3 asks for more ranks than this host's 2 accelerators \\(cuda:2\\); --devices auto puts no rank on the CPU beside accelerators: give --devices auto\\+cpu to fill up with CPU ranks, or an explicit plan such as --devices cuda:2,cpu:1\$"
run auto1gpu FAKE_DEVICES='cuda 1\n' -n 2 "$TMP/train.py"
one_error auto1gpu 2 "^kaitian run: -n 2 asks for more ranks than this host's 1 accelerator \\(cuda:1\\);.* --devices auto\\+cpu .* --devices cuda:1,cpu:1\$"
run auto_kd KAITIAN_DEVICES=auto -n 3 "$TMP/train.py"
one_error auto_kd 2 "^kaitian run: -n 3 asks for more ranks than this host's 2 accelerators"
rm -f "$TMP/disc.log"
run acpu3 --devices auto+cpu -n 3 "$TMP/train.py"
expect_rc 0 $RC "--devices auto+cpu -n 3 train.py"
[ "$(nranks acpu3)" = 3 ] || fail "auto+cpu -n 3: $(nranks acpu3) ranks"
[ "$(discoveries)" = 1 ] || fail "auto+cpu asked torch $(discoveries) times"
# the environment of each rank, as for --devices cuda:2,cpu:1 in 7.
if [ "$C" -ge 3 ]; then
  check acpu3 0 cuda:0 3 0 1 1; check acpu3 1 cuda:1 3 1 2 1; check acpu3 2 cpu 3 2 "$C" $((C - 2))
else
  o=$(omp_unbound 3)
  check acpu3 0 cuda:0 3 all - "$o"; check acpu3 1 cuda:1 3 all - "$o"; check acpu3 2 cpu 3 all - "$o"
fi
run acpu_kd KAITIAN_DEVICES=auto+cpu -n 3 "$TMP/train.py"
expect_rc 0 $RC "KAITIAN_DEVICES=auto+cpu -n 3 train.py"
[ "$(nranks acpu_kd)" = 3 ] && grep -q '^\[1\] dev=cuda:1 lws=3 ' "$TMP/acpu_kd.out" \
  && grep -q '^\[2\] dev=cpu lws=3 ' "$TMP/acpu_kd.out" || fail "KAITIAN_DEVICES=auto+cpu -n 3: expected cuda:0, cuda:1, cpu"
run acpu_win KAITIAN_DEVICES=auto+cpu --devices auto -n 3 "$TMP/train.py"
one_error acpu_win 2 "asks for more ranks than this host's 2 accelerators"
run acpu1gpu FAKE_DEVICES='cuda 1\n' --devices auto+cpu -n 2 "$TMP/train.py"
expect_rc 0 $RC "auto+cpu -n 2 on a 1-GPU host"
[ "$(nranks acpu1gpu)" = 2 ] && grep -q '^\[0\] dev=cuda:0 lws=2 ' "$TMP/acpu1gpu.out" \
  && grep -q '^\[1\] dev=cpu lws=2 ' "$TMP/acpu1gpu.out" || fail "auto+cpu -n 2, 1 GPU: expected cuda:0, cpu"
run acpu_all --devices auto+cpu "$TMP/train.py"
[ "$(nranks acpu_all)" = 2 ] && grep -q '^\[1\] dev=cuda:1 lws=2 ' "$TMP/acpu_all.out" \
  || fail "auto+cpu without -n: expected cuda:0 and cuda:1 only"
for spec in auto auto+cpu; do
  run none FAKE_DEVICES='cuda 0\n' --devices $spec -n 2 "$TMP/train.py"
  expect_rc 0 $RC "--devices $spec -n 2, no accelerator"
  [ "$(nranks none)" = 2 ] && grep -q '^\[0\] dev=cpu lws=2 ' "$TMP/none.out" \
    && grep -q '^\[1\] dev=cpu lws=2 ' "$TMP/none.out" || fail "--devices $spec -n 2, no accelerator: not 2 CPU ranks"
  [ -s "$TMP/none.err" ] && fail "--devices $spec -n 2, no accelerator: the launcher said something"
  run none1 FAKE_DEVICES='' --devices $spec "$TMP/train.py"
  [ "$(nranks none1)" = 1 ] && grep -q '^\[0\] dev=cpu lws=1 ' "$TMP/none1.out" \
    || fail "--devices $spec, torch knows no accelerator: not 1 CPU rank"
done
run acpu_c --devices auto+cpu -n 2 sh -c "$PROBE"
[ "$(nranks acpu_c)" = 2 ] && grep -q '^\[1\] dev=cpu lws=2 ' "$TMP/acpu_c.out" \
  || fail "auto+cpu -n 2 with a C program: not 2 CPU ranks"
run auto1 -n 1 "$TMP/train.py"
[ "$(nranks auto1)" = 1 ] && grep -q '^\[0\] dev=cuda:0 lws=1 ' "$TMP/auto1.out" || fail "auto -n 1: expected cuda:0 only"
run acpu1 --devices auto+cpu -n 1 "$TMP/train.py"
[ "$(nranks acpu1)" = 1 ] && grep -q '^\[0\] dev=cuda:0 lws=1 ' "$TMP/acpu1.out" || fail "auto+cpu -n 1: expected cuda:0 only"
run auto_off USE_CUDA=0 "$TMP/train.py"
[ "$(nranks auto_off)" = 1 ] && grep -q '^\[0\] dev=cpu lws=1 ' "$TMP/auto_off.out" || fail "USE_CUDA=0: cuda not dropped"
run auto_off4 USE_CUDA=0 -n 4 "$TMP/train.py"
[ "$(nranks auto_off4)" = 4 ] && grep -q '^\[3\] dev=cpu lws=4 ' "$TMP/auto_off4.out" || fail "USE_CUDA=0 -n 4: not 4 CPU ranks"
run auto_on KAITIAN_USE_CUDA=1 USE_CUDA=0 "$TMP/train.py"
[ "$(nranks auto_on)" = 2 ] || fail "KAITIAN_USE_CUDA=1 did not win over USE_CUDA=0"
run auto_nocpu KAITIAN_USE_CPU=0 --devices auto+cpu -n 3 "$TMP/train.py"
one_error auto_nocpu 2 "^kaitian run: -n 3 needs 1 CPU rank besides the 2 accelerator ranks, but the CPU is switched off by KAITIAN_USE_CPU=0\$"
run auto_nocpu2 KAITIAN_USE_CPU=0 -n 3 "$TMP/train.py"
one_error auto_nocpu2 2 "^kaitian run: -n 3 asks for more ranks than this host's 2 accelerators"
run auto_gpu KAITIAN_USE_CPU=0 "$TMP/train.py"
expect_rc 0 $RC "KAITIAN_USE_CPU=0 with accelerators for every rank"
run auto_x FAKE_DEVICES='cuda 1\nxpu 2\n' "$TMP/train.py"
grep -q '^\[0\] dev=cuda:0 lws=3 ' "$TMP/auto_x.out" && grep -q '^\[2\] dev=xpu:1 lws=3 ' "$TMP/auto_x.out" \
  || fail "auto with cuda 1, xpu 2: expected cuda:0, xpu:0, xpu:1"
run auto_nox FAKE_DEVICES='cuda 1\nxpu 2\n' KAITIAN_USE_XPU=no "$TMP/train.py"
[ "$(nranks auto_nox)" = 1 ] || fail "KAITIAN_USE_XPU=no did not drop xpu"
run auto_nox2 FAKE_DEVICES='cuda 1\nxpu 2\n' KAITIAN_USE_XPU=no -n 3 "$TMP/train.py"
one_error auto_nox2 2 "^kaitian run: -n 3 asks for more ranks than this host's 1 accelerator switched on \\(cuda:1\\);.* --devices cuda:1,cpu:2\$"
run auto_x4 FAKE_DEVICES='cuda 1\nxpu 2\n' -n 4 "$TMP/train.py"
one_error auto_x4 2 "this host's 3 accelerators \\(cuda:1,xpu:2\\);.* --devices cuda:1,xpu:2,cpu:1\$"
run auto_badsw FAKE_DEVICES='cuda 1\nxpu 2\n' USE_XPU=perhaps "$TMP/train.py"
one_error auto_badsw 2 "USE_XPU=perhaps is not a switch"

# 9. Discovery failing: an explicit plan that needs it is an error carrying
# the helper's last stderr line; auto falls back to CPU ranks (INFO only);
# output that is not the discovery's (an interpreter that is something else)
# counts as failing.
run d_err FAKE_ERR="RuntimeError: no driver here" --devices cuda:1 true
one_error d_err 2 "^kaitian run: --devices cuda:1: cannot ask torch which devices this host has: .*exited with code 1: RuntimeError: no driver here\$"
for spec in auto auto+cpu; do
  run d_auto FAKE_ERR="RuntimeError: no driver here" --devices $spec -n 2 "$TMP/train.py"
  expect_rc 0 $RC "$spec, discovery failing"
  [ "$(nranks d_auto)" = 2 ] && grep -q '^\[1\] dev=cpu lws=2 ' "$TMP/d_auto.out" || fail "$spec, discovery failing: not 2 CPU ranks"
  [ -s "$TMP/d_auto.err" ] && fail "$spec, discovery failing: a warning at the default level"
done
run d_info FAKE_ERR="RuntimeError: no driver here" KAITIAN_DEBUG=INFO "$TMP/train.py"
expect_grep "cannot ask torch .*RuntimeError: no driver here.*planning CPU ranks" "$TMP/d_info.err" "INFO line of a failed discovery"
run d_junk FAKE_DEVICES='Python 3.11.2\n' --devices cuda:1 true
one_error d_junk 2 "unexpected output from .* 'Python 3.11.2'"
run d_none PYTHON="$TMP/no-such-python" --devices cuda:1 true
one_error d_none 2 "cannot ask torch.*no-such-python"

# 10. A stop signal while torch is asked: the helper is killed and reaped,
# the launcher exits 128+15 at once.
FAKE_SLEEP=30 "$KT" run --devices cuda:1 true >"$TMP/sig.out" 2>"$TMP/sig.err" &
lp=$!
wait_marker 1 10 || fail "the discovery helper did not start"
t0=$(now_ms)
kill -TERM $lp
wait $lp; RC=$?
expect_rc 143 $RC "SIGTERM during discovery"
[ $(($(now_ms) - t0)) -lt 3000 ] || fail "SIGTERM during discovery took $(($(now_ms) - t0)) ms"
expect_grep "interrupted by SIGTERM while asking" "$TMP/sig.err" "SIGTERM during discovery"
wait_marker 0 5 || fail "the discovery helper survived the launcher"

# 11. Several nodes: each node plans its own ranks; the world is their sum.
export KAITIAN_JOB_SECRET="devices-test-$$" KAITIAN_CONNECT_TIMEOUT=20000
port=$(free_port)
[ -n "$port" ] || fail "no free port"
NP='echo "rank=$RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE dev=$KAITIAN_DEVICE"'
"$KT" run --devices cpu:2 --nnodes 2 --node-rank 0 --master "127.0.0.1:$port" sh -c "$NP" \
  >"$TMP/mn0.out" 2>"$TMP/mn0.err" &
p0=$!
"$KT" run --devices cuda:1 --nnodes 2 --node-rank 1 --master "127.0.0.1:$port" sh -c "$NP" \
  >"$TMP/mn1.out" 2>"$TMP/mn1.err" &
p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
expect_rc 0 $rc0 "node 0 (--devices cpu:2)"
expect_rc 0 $rc1 "node 1 (--devices cuda:1)"
expect_grep '^\[1\] rank=1 world=3 lws=2 dev=cpu$' "$TMP/mn0.out" "node 0's plan"
expect_grep '^\[2\] rank=2 world=3 lws=1 dev=cuda:0$' "$TMP/mn1.out" "node 1's plan"

# 12. This host's real torch, where /usr/bin/python3 is there: auto gives CPU
# ranks when it sees no CUDA (on a 1-GPU host -n 2 is an error, auto+cpu
# gives cuda:0 and cpu); cuda:1 then says how many there are (0), or that
# torch cannot be asked.
unset PYTHON FAKE_DEVICES
if [ -x /usr/bin/python3 ]; then
  ncuda=$(/usr/bin/python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)
  printf 'import os\nprint("dev=%%s lws=%%s" %% (os.environ["KAITIAN_DEVICE"], os.environ["LOCAL_WORLD_SIZE"]))\n' >"$TMP/who.py"
  run real -n 2 "$TMP/who.py"
  if [ "${ncuda:-0}" = 1 ]; then
    one_error real 2 "^kaitian run: -n 2 asks for more ranks than this host's 1 accelerator .*auto\\+cpu"
    run real --devices auto+cpu -n 2 "$TMP/who.py"
    expect_rc 0 $RC "auto+cpu who.py under /usr/bin/python3, 1 CUDA device"
    grep -q '^\[0\] dev=cuda:0 lws=2$' "$TMP/real.out" && grep -q '^\[1\] dev=cpu lws=2$' "$TMP/real.out" \
      || fail "auto+cpu -n 2 on a 1-GPU host: not cuda:0 and cpu"
  fi
  expect_rc 0 $RC "auto who.py under /usr/bin/python3"
  if [ "${ncuda:-0}" = 0 ]; then
    grep -q '^\[1\] dev=cpu lws=2$' "$TMP/real.out" || fail "auto on a host without CUDA: not CPU ranks"
    run real_cuda --devices cuda:1 true
    one_error real_cuda 2 "^kaitian run: --devices cuda:1: (this host has 0 CUDA devices|cannot ask torch)"
  fi
  run real_tpu --devices tpu:1 true
  one_error real_tpu 2 "unknown device type 'tpu'|cannot ask torch"
fi
echo "PASS devices ($C CPUs: $ALL)"
