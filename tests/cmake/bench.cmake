# bench.cmake - tests of `kaitian bench`: its checker passes on correct results
# across collectives, dtypes, ops, roots and in-place mode, it fails (exit 1,
# rows counting the wrong element, a report naming rank and index) when one
# output element is corrupted on purpose (--inject-error), its bus-bandwidth
# arithmetic matches nccl-tests' factors, and its help and usage errors.
# bench/compare_gloo is a benchmark and is deliberately not registered here.

# A hang becomes a KaiTian timeout error well before the CTest TIMEOUT.
set(KT_BENCH_ENV "KAITIAN_TIMEOUT=60000")

# kt_bench_test(<name> <timeout s> <ranks for PROCESSORS> <shell script>)
# The script runs under /bin/sh with $1 = the kaitian command.
function(kt_bench_test name timeout np script)
  add_test(NAME ${name} COMMAND /bin/sh -c "${script}" kt_bench_test ${KT_CLI})
  if(np GREATER 4)
    set(np 4)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} LABELS "bench" PROCESSORS ${np}
    ENVIRONMENT "${KT_BENCH_ENV}")
endfunction()

# The checker can fail: one corrupted element per size on rank 1 must give
# exit status 1, #wrong = 1 on each of the 8 rows (8 B .. 1 KiB) and a
# report with rank, collective, index, expected and got.
kt_bench_test(bench.inject_error.np2 180 2 [=[
out=$("$1" run --no-prefix -n 2 "$1" bench -C allreduce -b 8 -e 1K -c 1 --inject-error --csv 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "TEST FAILED: $*"; exit 1; }
[ "$rc" -eq 1 ] || fail "expected exit status 1 after an injected wrong value, got $rc"
rows=$(printf '%s\n' "$out" | grep -c '^allreduce,.*,1$')
[ "$rows" -eq 8 ] || fail "expected 8 allreduce rows with #wrong = 1, got $rows"
printf '%s\n' "$out" | grep -q '^kaitian bench: wrong value: rank 1: allreduce count [0-9]* float32 op sum.*index [0-9]*: expected .*, got ' \
  || fail "no wrong-value report naming rank 1, the collective, index, expected and got"
printf '%s\n' "$out" | grep -q '^# wrong values: 8 FAILED' || fail "no '# wrong values: 8 FAILED' summary"
exit 0
]=])

# Passing runs with -c: every collective table must appear and every row count
# 0 wrong elements. Arguments after the script: ranks, then bench options.
set(KT_BENCH_PASS [=[
kt=$1
np=$2
shift 2
out=$("$kt" run --no-prefix -n "$np" "$kt" bench --csv -n 2 -w 1 -c 2 "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "TEST FAILED: $*"; exit 1; }
[ "$rc" -eq 0 ] || fail "kaitian bench exited with $rc"
printf '%s\n' "$out" | grep -q '^# wrong values: 0 OK' || fail "no '# wrong values: 0 OK' summary"
bad=$(printf '%s\n' "$out" | grep -E '^[a-z_]+,[0-9]+,' | grep -Evc ',0$|^barrier,.*,N/A$')
[ "$bad" -eq 0 ] || fail "$bad data rows with a non-zero or missing #wrong"
for c in $COLLS; do
  printf '%s\n' "$out" | grep -q "^$c," || fail "no data row for $c"
done
exit 0
]=])
set(KT_BENCH_ALL "allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv barrier")

# kt_bench_pass(<name> <ranks> <collectives expected> <bench options...>)
function(kt_bench_pass name np colls)
  add_test(NAME ${name} COMMAND /bin/sh -c "${KT_BENCH_PASS}" kt_bench_pass ${KT_CLI} ${np} ${ARGN})
  set(procs ${np})
  if(procs GREATER 4)
    set(procs 4)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS "bench" PROCESSORS ${procs}
    ENVIRONMENT "${KT_BENCH_ENV};COLLS=${colls}")
endfunction()

kt_bench_pass(bench.check_all.np3 3 "${KT_BENCH_ALL}" -b 1 -e 64K -f 4)
kt_bench_pass(bench.check_inplace_int8_prod.np3 3 "${KT_BENCH_ALL}" -I -d int8 -o prod -r 2 -b 1 -e 16K -f 8)
kt_bench_pass(bench.check_bf16_avg.np4 4 "allreduce reduce reduce_scatter"
  -d bfloat16 -o avg -r 3 -C allreduce,reduce,reduce_scatter -b 2 -e 32K -f 4)
kt_bench_pass(bench.check_half_max_inplace.np2 2 "allreduce reduce reduce_scatter"
  -I -d half -o max -r 1 -C allreduce,reduce,reduce_scatter -b 2 -e 32K -f 4)
kt_bench_pass(bench.check_bool_prod.np3 3 "allreduce reduce_scatter" -d bool -o prod -C allreduce,reduce_scatter -b 1 -e 4K -f 4)
kt_bench_pass(bench.check_int64_bxor.np2 2 "allreduce reduce" -d int64 -o bxor -C allreduce,reduce -r 1 -b 8 -e 64K -f 4)
# The memory reference (-C memcpy, not part of all) is checked like a
# collective: each rank's output is its own input. Beside allreduce in
# registered buffers (-M), as bench/membound runs them.
kt_bench_pass(bench.check_memcpy_registered.np3 3 "memcpy allreduce" -M -C memcpy,allreduce -b 1 -e 1M -f 16)
kt_bench_pass(bench.check_uint8_sum.np5 5 "allreduce alltoall sendrecv" -d uint8 -o sum -C allreduce,alltoall,sendrecv -b 1 -e 4K -f 4)

# algbw = size / time and busbw = algbw x nccl-tests' factor, checked from the
# CSV columns against this independent table (3 ranks).
kt_bench_test(bench.busbw_factors.np3 300 3 [=[
out=$("$1" run --no-prefix -n 3 "$1" bench --csv -b 768K -e 768K -n 3 -w 1 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "TEST FAILED: kaitian bench exited with $rc"; exit 1; }
printf '%s\n' "$out" | awk -F, '
  BEGIN { f["allreduce"] = 4/3; f["broadcast"] = 1; f["reduce"] = 1; f["allgather"] = 2/3
          f["reduce_scatter"] = 2/3; f["alltoall"] = 2/3; f["gather"] = 2/3; f["scatter"] = 2/3
          f["sendrecv"] = 1 }
  /^#/ || !/,/ { next }
  $1 == "barrier" { next }
  {
    rows++
    if (!($1 in f)) { print "TEST FAILED: unknown collective " $1; bad = 1; next }
    if ($2 != 786432) { print "TEST FAILED: " $1 " size " $2 ", expected 786432 (divisible by 3 x 4)"; bad = 1 }
    alg = $2 / $7 / 1e3
    if (alg - $8 > 1e-4 + alg * 1e-3 || $8 - alg > 1e-4 + alg * 1e-3) { print "TEST FAILED: " $1 " algbw " $8 ", expected " alg; bad = 1 }
    bus = $8 * f[$1]
    if (bus - $9 > 2e-4 || $9 - bus > 2e-4) { print "TEST FAILED: " $1 " busbw " $9 ", expected " bus; bad = 1 }
  }
  END { if (rows != 9) { print "TEST FAILED: expected 9 data rows, got " rows; bad = 1 } exit bad }'
]=])

# --iters-bytes and --warmup-bytes raise the iterations of small sizes to
# that many bytes' worth (rounded up), never below -n and -w; rank 0 says
# so per row where they did.
kt_bench_test(bench.iters_bytes.np2 120 2 [=[
out=$("$1" run --no-prefix -n 2 "$1" bench --csv -C sendrecv -b 1K -e 4K -n 3 -w 1 --iters-bytes 8K --warmup-bytes 2K 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "TEST FAILED: kaitian bench exited with $rc"; exit 1; }
want='# sendrecv 1024: 8 timed iterations after 2 warm-up (--iters-bytes, --warmup-bytes)
# sendrecv 2048: 4 timed iterations after 1 warm-up (--iters-bytes, --warmup-bytes)'
got=$(printf '%s\n' "$out" | grep '^# sendrecv ')
[ "$got" = "$want" ] || { echo "TEST FAILED: iteration lines differ from:"; echo "$want"; exit 1; }
[ "$(printf '%s\n' "$out" | grep -c '^sendrecv,')" = 3 ] || { echo "TEST FAILED: expected 3 data rows"; exit 1; }
err=$("$1" bench --iters-bytes -5 2>&1)
[ $? -eq 2 ] || { echo "TEST FAILED: --iters-bytes -5 accepted"; exit 1; }
exit 0
]=])

# -h documents every flag; a bad flag is a usage error (exit 2) that names it.
kt_bench_test(bench.help 30 1 [=[
out=$("$1" bench -h)
rc=$?
[ "$rc" -eq 0 ] || { echo "TEST FAILED: kaitian bench -h exited with $rc"; exit 1; }
for f in ' -b,' ' -e,' ' -f,' ' -n,' ' -w,' '--iters-bytes' '--warmup-bytes' ' -d,' ' -o,' ' -r,' ' -c,' ' -C,' ' -I,' '--csv' '--inject-error' ' -h,' \
         'size count type redop root time algbw busbw #wrong'; do
  printf '%s\n' "$out" | grep -q -e "$f" || { echo "TEST FAILED: -h does not document '$f'"; exit 1; }
done
err=$("$1" bench -d float128 2>&1)
rc=$?
[ "$rc" -eq 2 ] || { echo "TEST FAILED: bad -d exited with $rc, expected 2"; exit 1; }
printf '%s\n' "$err" | grep -q "unknown datatype 'float128'" || { echo "TEST FAILED: message: $err"; exit 1; }
err=$("$1" bench -o band -d float 2>&1)
[ $? -eq 2 ] || { echo "TEST FAILED: band on float accepted"; exit 1; }
err=$("$1" bench --inject-error 2>&1)
[ $? -eq 2 ] || { echo "TEST FAILED: --inject-error without -c accepted"; exit 1; }
exit 0
]=])

# The preamble names the sizes the tables hold (issue 41: `-b 8 -e 4M -f 4`
# said "8 .. 4194304" where the last row is 2097152), and the size and count
# columns of a collective whose size is the whole buffer are what
# tools/demo.sh explains: 4 ranks of allgather, float32, 8 B skipped (a block
# of 0 elements), 32 B = 2 elements per block, 2097152 B = 131072.
kt_bench_test(bench.sizes.np4 120 4 [=[
fail() { printf '%s\n' "$out"; echo "TEST FAILED: $*"; exit 1; }
out=$("$1" run --no-prefix -n 4 "$1" bench -C allgather -b 8 -e 4M -f 4 -n 2 -w 1 2>&1) || fail "exit status $?"
printf '%s\n' "$out" | grep -q '^# sizes 8 \.\. 2097152 bytes, factor 4 (the next step would pass -e 4194304); ' \
  || fail "the preamble does not name 2097152 as the largest size"
rows=$(printf '%s\n' "$out" | grep -v '^#' | awk '{print $1 ":" $2}' | tr '\n' ' ')
[ "$rows" = "32:2 128:8 512:32 2048:128 8192:512 32768:2048 131072:8192 524288:32768 2097152:131072 " ] \
  || fail "allgather rows (size:count) are '$rows'"
out=$("$1" run --no-prefix -n 4 "$1" bench -C barrier -b 8 -e 8K -f 4 2>&1) || fail "exit status $?"
printf '%s\n' "$out" | grep -q '^# sizes 8 \.\. 8192 bytes, factor 4; ' || fail "preamble with -e on a step"
exit 0
]=])

# -s (additive steps) and --thresholds (where the tuner's algorithm changes),
# and bench/sweep_peers' options and report on a few sizes, without peers
# (its timings are a campaign of their own: make sweep).
kt_bench_test(bench.stepbytes.np2 60 2 [=[
out=$("$1" run --no-prefix -n 2 "$1" bench --csv -C allreduce -b 8 -e 80 -s 24 -n 5 -c 1 2>&1)
printf '%s\n' "$out"
sizes=$(printf '%s\n' "$out" | grep '^allreduce,' | cut -d, -f2 | tr '\n' ' ')
[ "$sizes" = "8 32 56 80 " ] || { echo "TEST FAILED: sizes '$sizes', expected 8 32 56 80"; exit 1; }
printf '%s\n' "$out" | grep -q '^# sizes 8 .. 80 bytes, step 24' || { echo "TEST FAILED: no step in the preamble"; exit 1; }
out=$("$1" run --no-prefix -n 2 "$1" bench --thresholds -C allreduce,broadcast -b 8 -e 1M 2>&1)
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -Eq '^# threshold allreduce ([0-9]+) shm_ll ([0-9]+) shm_oneshot$' || { echo "TEST FAILED: no allreduce threshold"; exit 1; }
printf '%s\n' "$out" | grep -q '^# algorithm broadcast from 8 bytes: shm_ll$' || { echo "TEST FAILED: no broadcast start"; exit 1; }
printf '%s\n' "$out" | grep -q '^allreduce,' && { echo "TEST FAILED: --thresholds ran the collective"; exit 1; }
exit 0
]=])
add_test(NAME bench.sweep_peers_smoke COMMAND /bin/sh -c [=[
d=$(mktemp -d) || exit 1
trap 'rm -rf "$d"' EXIT
"$2" "$3"/bench/sweep_peers --kaitian "$1" --ranks 2 -C allreduce,allgather --sizes 8,64 --repeat 1 --iters 20 \
  --no-ompi --no-mpich --report-only --out "$d" > "$d/out" 2>&1 || { cat "$d/out"; echo "TEST FAILED: exit $?"; exit 1; }
cat "$d/out"
f=$(ls "$d"/sweep_peers-*.txt) || exit 1
grep -q '^# ranks 2 allreduce: threshold ' "$f" || { echo "TEST FAILED: no threshold line"; exit 1; }
grep -q '^# ranks 2 allgather per-size: ' "$f" || { echo "TEST FAILED: no per-size section"; exit 1; }
rows=$(grep -c '^    2 allreduce *sequence ' "$f")
[ "$rows" -ge 2 ] || { echo "TEST FAILED: $rows allreduce rows"; exit 1; }
"$2" "$3"/bench/sweep_peers --kaitian "$1" --ranks 1 > "$d/bad" 2>&1 && { echo "TEST FAILED: --ranks 1 accepted"; exit 1; }
grep -q 'ranks >= 2' "$d/bad" || { cat "$d/bad"; echo "TEST FAILED: no message for --ranks 1"; exit 1; }
exit 0
]=] kt_bench_test ${KT_CLI} /usr/bin/python3 ${PROJECT_SOURCE_DIR})
set_tests_properties(bench.sweep_peers_smoke PROPERTIES TIMEOUT 120 LABELS "bench" PROCESSORS 2
  ENVIRONMENT "${KT_BENCH_ENV}")
