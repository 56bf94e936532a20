# coll.cmake - correctness matrix of the collectives: coll_test at world sizes
# {1,2,3,4,5,8}, once with the tuner's choices and once per forced algorithm
# (KAITIAN_ALGO), plus badargs_test. See tests/README.md.
kt_add_test_exe(coll_test ${KT_TEST_DIR}/c/coll_test.c ${KT_TEST_DIR}/c/coll_ref.c)
kt_add_test_exe(badargs_test ${KT_TEST_DIR}/c/badargs_test.c)
# The reference computation is most of coll_test's own time: optimise it even
# in Debug builds.
target_compile_options(coll_test PRIVATE -O2)

# A hang becomes a KaiTian timeout error (named rank and op) well before the
# CTest TIMEOUT kills the run.
set(KT_COLL_ENV "KAITIAN_TIMEOUT=60000")

# Forced algorithms: "<test suffix>|<KAITIAN_ALGO>|<collectives it affects>|
# <fewest ranks>[|<more coll_test args>]". Each forced run exercises only the
# collectives that have the algorithm, and only the calls it can run: the
# shared-memory ones need 2 ranks (one rank has no segment), and shm_cma's
# alltoall runs out of place only (docs/algorithms.md).
set(KT_COLL_FORCED
  "ring|ring|allreduce,allgather,allgatherv,reduce_scatter,reduce_scatterv|1"
  "recursive_doubling|allreduce=recursive_doubling|allreduce|1"
  "halving_doubling|allreduce=halving_doubling|allreduce|1"
  "bcast_binomial|broadcast=binomial|broadcast|1"
  "bcast_pipeline|broadcast=pipeline|broadcast|1"
  "reduce_binomial|reduce=binomial|reduce|1"
  "linear|gather=linear,scatter=linear|gather,scatter|1"
  "pairwise|alltoall=pairwise,alltoallv=pairwise|alltoall,alltoallv|1"
  "dissemination|barrier=dissemination|barrier|1"
  "shm_oneshot|allreduce=shm_oneshot|allreduce|2"
  "shm_rsag|allreduce=shm_rsag|allreduce|2"
  "reduce_shm_oneshot|reduce=shm_oneshot|reduce|2"
  "shm_cma|broadcast=shm_cma,scatter=shm_cma,gather=shm_cma,allgather=shm_cma,alltoall=shm_cma|broadcast,scatter,gather,allgather,alltoall|2|--no-inplace alltoall"
  "shm|shm|broadcast,reduce,allgather,allgatherv,reduce_scatter,reduce_scatterv,gather,scatter,alltoall,alltoallv,barrier|2")

# kt_coll_test(<name> <ranks> <timeout s> <extra env> <coll_test args...>)
# A run that forces algorithms (KAITIAN_ALGO in <extra env>) passes the same
# text to coll_test as --algo: it fails unless each collective it tests ran
# the algorithm forced on it and no other (the tuner would otherwise fall
# back to its own pick, silently but for an INFO line, wherever the forced
# one cannot run a call). The expectation travels on the command line, so a
# KAITIAN_ALGO that never reached the ranks, or names nothing, fails too.
function(kt_coll_test name np timeout env)
  set(algo_args)
  foreach(e IN LISTS env)
    if(e MATCHES "^KAITIAN_ALGO=(.+)$")
      set(algo_args --algo "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  add_test(NAME ${name} COMMAND ${KT_CLI} run -n ${np} $<TARGET_FILE:coll_test> ${ARGN} ${algo_args})
  set(procs ${np})
  if(procs GREATER 4)
    set(procs 4)
  endif()
  set(envs ${KT_COLL_ENV})
  if(env)
    list(APPEND envs "${env}")
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout} LABELS "coll" PROCESSORS ${procs}
    ENVIRONMENT "${envs}")
endfunction()

# Full runs (every case blocking and non-blocking) up to this many ranks,
# --quick above: keeps the matrix near 2.5 min here. Under ASan (about 4x
# slower) the full runs stop at 2 ranks: 3 ranks run --quick there, which the
# release build's full run at 3 ranks covers for results.
set(KT_COLL_FULL_MAX_NP 3)
if(KT_SANITIZE_ADDRESS)
  set(KT_COLL_FULL_MAX_NP 2)
endif()

foreach(np 1 2 3 4 5 8)
  # The tuner's run covers every collective.
  if(np LESS_EQUAL KT_COLL_FULL_MAX_NP)
    kt_coll_test(coll.np${np}.tuner ${np} 600 "")
  else()
    kt_coll_test(coll.np${np}.tuner ${np} 600 "" --quick)
  endif()
  foreach(spec ${KT_COLL_FORCED})
    string(REPLACE "|" ";" parts "${spec}")
    list(GET parts 0 suffix)
    list(GET parts 1 algo)
    list(GET parts 2 which)
    list(GET parts 3 fewest)
    set(more)
    list(LENGTH parts nparts)
    if(nparts GREATER 4)
      list(GET parts 4 more)
      separate_arguments(more UNIX_COMMAND "${more}")
    endif()
    if(np LESS fewest)
      continue()
    endif()
    if(np GREATER KT_COLL_FULL_MAX_NP)
      list(APPEND more --quick)
    endif()
    kt_coll_test(coll.np${np}.${suffix} ${np} 300 "KAITIAN_ALGO=${algo}" --coll ${which} ${more})
  endforeach()
endforeach()

# Stress variants of documented settings: ring pipelining and segmentation
# with chunks that are not a multiple of every element size and many
# segments per call; tiny socket buffers, so every large transfer meets
# back-pressure (ordering, partial writes, deadlock avoidance).
foreach(np 2 3 5)
  kt_coll_test(coll.np${np}.ring_small_chunks ${np} 300
    "KAITIAN_ALGO=ring;KAITIAN_CHUNK_BYTES=1001;KAITIAN_RING_SEGMENT_BYTES=20000"
    --coll allreduce,allgather,allgatherv,reduce_scatter --quick)
endforeach()
foreach(np 2 3)
  kt_coll_test(coll.np${np}.small_socket_buffers ${np} 300
    "KAITIAN_TRANSPORT=tcp;KAITIAN_SOCKET_BUFFER_BYTES=4096" --quick)
endforeach()

# On one host the tuner picks shared memory; these runs give the TCP tuner
# (what ranks on different hosts use) the whole matrix too.
foreach(np 2 3 4 5)
  kt_coll_test(coll.np${np}.tcp_tuner ${np} 600 "KAITIAN_TRANSPORT=tcp" --quick)
endforeach()

# The small-message protocol forced, at a count that spans several of its
# lines (11 elements: up to 88 bytes per rank, 704 in allgather's output and
# reduce_scatter's input at 8 ranks), every dtype and op. (The tuner's runs
# use it too, wherever a count's bytes fit.)
foreach(np 2 3 5 8)
  kt_coll_test(coll.np${np}.shm_ll ${np} 300 "KAITIAN_ALGO=shm_ll"
    --coll allreduce,broadcast,reduce,allgather,reduce_scatter,gather,scatter,alltoall,barrier --count 11)
endforeach()
# Payloads within line 0 of every length the dtypes make of 3 and 7
# elements (3 to 56 bytes): the inline copy's every branch (kt__copy).
foreach(count 3 7)
  kt_coll_test(coll.np2.shm_ll_count${count} 2 300 "KAITIAN_ALGO=shm_ll"
    --coll allreduce,broadcast,reduce,allgather,reduce_scatter,gather,scatter,alltoall --count ${count})
endforeach()
# Many lines of a slot: 185 elements (1480 bytes of float64 per rank).
foreach(np 2 3)
  kt_coll_test(coll.np${np}.shm_ll_lines ${np} 300 "KAITIAN_ALGO=shm_ll"
    --coll allreduce,broadcast,reduce,allgather,reduce_scatter,gather,scatter,alltoall --count 185)
endforeach()
# ... and every line, near the protocol's 4456 bytes: 556 elements (4448
# bytes of float64) per rank, at 2 ranks also scatter's, reduce_scatter's
# and alltoall's (a rank posts every block but its own), at 3 ranks theirs
# with 278 (two blocks of 2224).
kt_coll_test(coll.np2.shm_ll_full 2 300 "KAITIAN_ALGO=shm_ll"
  --coll allreduce,broadcast,reduce,allgather,gather,scatter,reduce_scatter,alltoall --count 556)
kt_coll_test(coll.np3.shm_ll_full 3 300 "KAITIAN_ALGO=shm_ll" --coll scatter,reduce_scatter,alltoall --count 278)

# Results written with non-temporal stores (KAITIAN_SHM_STREAM_BYTES=1: every
# size, so odd lengths and addresses reach the copy's unaligned head and
# tail): the region algorithms that stream their copy-out, and the
# single-copy allreduce in registered buffers.
foreach(np 2 3 5)
  kt_coll_test(coll.np${np}.shm_stream ${np} 300 "KAITIAN_ALGO=shm,allreduce=shm_rsag;KAITIAN_SHM_STREAM_BYTES=1;KAITIAN_SHM_CMA_BYTES=0"
    --coll allreduce,broadcast,reduce,allgather,allgatherv,gather,scatter,alltoall,alltoallv --quick)
  kt_coll_test(coll.np${np}.shm_direct_stream ${np} 300 "KAITIAN_SHM_DIRECT_BYTES=1;KAITIAN_SHM_STREAM_BYTES=1"
    --coll allreduce,mixed --registered all --quick)
endforeach()

# The tuner's single-copy picks (docs/algorithms.md): scatter and gather run
# shm_cma from KAITIAN_SHM_CMA_BYTES (16 KiB per rank: 2 MiB and 64 KiB
# here), broadcast and allgather never unless forced (the region algorithms
# won at every size, 2026-11-29): shm at 2 MiB, 64 KiB and 12 KiB; below 16
# KiB per rank scatter and gather the region algorithm, and 4 KiB per rank
# of scatter and gather the small-message protocol (every line of it unless
# KAITIAN_SHM_LL_BYTES is set; a root posts every block but its own); with
# the host's ranks outnumbering its CPUs (the same 2 ranks confined to one
# CPU with taskset: the tuner counts the CPUs the ranks may run on) the
# same; scatter's and gather's picks do not depend on that. Skipped (77)
# where fewer than 2 CPUs are allowed.
add_test(NAME coll.tuner_cma_picks COMMAND sh -c [=[
kt=$1; fail() { echo "TEST FAILED: $*"; exit 1; }
[ "$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc)" -ge 2 ] || { echo "SKIP: fewer than 2 CPUs allowed"; exit 77; }
command -v taskset >/dev/null || { echo "SKIP: no taskset"; exit 77; }
picks() { KAITIAN_DEBUG=INFO $1 "$kt" run -n 2 "$kt" bench -C broadcast,allgather,scatter,gather -b "$2" -e "$2" -n 1 -w 0 2>&1; }
for size in 2M 64K; do
  out=$(picks "" $size) || fail "2 ranks: $out"
  for c in scatter gather; do
    printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm_cma " || fail "2 ranks, $size: $c did not pick shm_cma: $(printf '%s\n' "$out" | grep 'runs algorithm')"
  done
  for c in broadcast allgather; do
    printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm " || fail "2 ranks, $size: $c did not pick shm: $(printf '%s\n' "$out" | grep 'runs algorithm')"
  done
done
out=$(picks "" 12K) || fail "2 ranks: $out"
for c in broadcast allgather scatter gather; do
  printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm " || fail "2 ranks, 12 KiB: $c did not pick shm: $(printf '%s\n' "$out" | grep 'runs algorithm')"
done
out=$(picks "" 8K) || fail "2 ranks: $out"
for c in scatter gather; do
  printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm_ll " || fail "2 ranks, 8 KiB: $c did not pick shm_ll: $(printf '%s\n' "$out" | grep 'runs algorithm')"
done
out=$(picks "taskset -c 0" 2M) || fail "2 ranks on one CPU: $out"
for c in broadcast allgather; do
  printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm " || fail "2 ranks on one CPU: $c did not pick shm: $(printf '%s\n' "$out" | grep 'runs algorithm')"
done
for c in scatter gather; do
  printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm shm_cma " || fail "2 ranks on one CPU: $c did not pick shm_cma"
done
echo PASS]=] sh ${KT_CLI})
set_tests_properties(coll.tuner_cma_picks PROPERTIES TIMEOUT 300 LABELS "coll" PROCESSORS 2 SKIP_RETURN_CODE 77
  ENVIRONMENT "KAITIAN_TIMEOUT=60000")

# Ranks that disagree on the algorithm (tests/c/cma_permit.c): the
# single-copy broadcast's root, in place, would write into rank 1's buffer,
# which rank 1 (running the region broadcast) did not offer; the root
# refuses, naming rank 1, instead of writing at a stale address.
kt_add_test_exe(cma_permit ${KT_TEST_DIR}/c/cma_permit.c)
add_test(NAME coll.np2.shm_cma_permit COMMAND ${KT_CLI} run -n 2 $<TARGET_FILE:cma_permit>)
set_tests_properties(coll.np2.shm_cma_permit PROPERTIES TIMEOUT 120 LABELS "coll" PROCESSORS 2
  ENVIRONMENT "KAITIAN_TIMEOUT=5000")

# Single copy refused by the kernel on one rank (a seccomp filter makes its
# process_vm_readv, or its process_vm_writev, fail with EPERM): the probe's
# verdict sends every rank to the region algorithms, results stay right, and
# the rank says why at INFO.
kt_add_test_exe(no_cma ${KT_TEST_DIR}/c/no_cma.c)
foreach(call readv writev)
  add_test(NAME coll.np3.shm_cma_refused_${call}
    COMMAND sh -c "out=$(\"$0\" run -n 3 \"$1\" \"$2\" --coll broadcast,scatter,gather,allgather,alltoall --quick --no-inplace alltoall --algo \"$KAITIAN_ALGO\" 2>&1); rc=$?; printf '%s\\n' \"$out\"; [ $rc -eq 0 ] || exit 1; printf '%s\\n' \"$out\" | grep -q 'rank 1: cannot reach rank 0.s memory (process_vm_'\"$3\"': Operation not permitted)' || { echo 'FAIL: no line saying why rank 1 cannot use single copy'; exit 1; }; printf '%s\\n' \"$out\" | grep -q 'runs algorithm shm_cma' || { echo 'FAIL: shm_cma did not run'; exit 1; }"
      ${KT_CLI} $<TARGET_FILE:no_cma> $<TARGET_FILE:coll_test> ${call})
  set_tests_properties(coll.np3.shm_cma_refused_${call} PROPERTIES TIMEOUT 300 LABELS "coll" PROCESSORS 2
    ENVIRONMENT "KT_NO_CMA_RANK=1;KT_NO_CMA_CALL=${call};KAITIAN_DEBUG=INFO;KAITIAN_TIMEOUT=60000;KAITIAN_ALGO=broadcast=shm_cma,scatter=shm_cma,gather=shm_cma,allgather=shm_cma,alltoall=shm_cma")
endforeach()

# The forced runs' own check must be able to fail: alltoall forced to
# shm_cma with its in-place cases left in. Those run the tuner's pick (the
# INFO line names it), every result must still be right, and coll_test must
# fail on the algorithm alone, naming what ran.
add_test(NAME coll.np2.algo_check COMMAND sh -c [=[
kt=$1 prog=$2; fail() { echo "TEST FAILED: $*"; exit 1; }
out=$(KAITIAN_DEBUG=INFO KAITIAN_ALGO=alltoall=shm_cma "$kt" run -n 2 "$prog" --coll alltoall --quick --algo alltoall=shm_cma 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E 'FAIL|coll_test:|cannot run' | head -n 12
[ $rc -ne 0 ] || fail "coll_test passed although in-place alltoalls ran another algorithm than the forced shm_cma"
printf '%s\n' "$out" | grep -Eq "^\[0\] FAIL rank 0 alltoall .*: --algo 'alltoall=shm_cma' forces alltoall=shm_cma, but the alltoall ops of this communicator ran [a-z_,]+ \(" ||
  fail "no FAIL line naming the forced shm_cma and what ran instead"
printf '%s\n' "$out" | grep -q "KAITIAN_ALGO forces alltoall=shm_cma, which cannot run op #[0-9]* (count [0-9]*, [a-z0-9]*, in place); the tuner's pick, shm[_a-z]*, runs it" ||
  fail "no INFO line naming the in-place call and the algorithm that ran it"
printf '%s\n' "$out" | grep -q "^\[0\] coll_test: FAILED (2 failed cases over all ranks)" ||
  fail "another failure than the algorithm's (expected one per rank): $(printf '%s\n' "$out" | grep FAIL | head -n 3)"
echo PASS]=] sh ${KT_CLI} $<TARGET_FILE:coll_test>)
set_tests_properties(coll.np2.algo_check PROPERTIES TIMEOUT 120 LABELS "coll" PROCESSORS 2
  ENVIRONMENT "KAITIAN_TIMEOUT=60000")

# Halving-doubling where the forced runs above do not reach: 6 and 7 ranks
# (two and three pairs fold in and out), and chunks of 1001 bytes with tiny
# socket buffers, so each step's reduction is streamed in pieces that split
# elements.
foreach(np 6 7)
  kt_coll_test(coll.np${np}.halving_doubling ${np} 300 "KAITIAN_ALGO=allreduce=halving_doubling"
    --coll allreduce --quick)
endforeach()
foreach(np 3 4)
  kt_coll_test(coll.np${np}.halving_doubling_small_chunks ${np} 300
    "KAITIAN_ALGO=allreduce=halving_doubling;KAITIAN_CHUNK_BYTES=1001;KAITIAN_SOCKET_BUFFER_BYTES=4096"
    --coll allreduce --quick)
endforeach()

# Shared memory with tiny regions: every op runs many double-buffered
# iterations, with windows that split elements of every size unevenly.
foreach(np 2 3 4)
  kt_coll_test(coll.np${np}.shm_small_chunks ${np} 300 "KAITIAN_SHM_CHUNK_BYTES=4160;KAITIAN_SHM_ONESHOT_BYTES=0" --quick)
endforeach()

# The small-message protocol at its largest payload: 109 elements, 872
# bytes per rank for 8-byte types (every line), 109-436 for the others.
foreach(np 3 5)
  kt_coll_test(coll.np${np}.shm_ll_max ${np} 300 "KAITIAN_SHM_LL_BYTES=872"
    --coll allreduce,broadcast,reduce,allgather,gather,barrier --count 109)
endforeach()

# The tuner's small-message picks at 2 ranks with a CPU each, on both sides
# of each limit (docs/algorithms.md, "Where the tuner switches"): allreduce
# up to 384 bytes (one-shot from 388), broadcast and reduce up to 1536
# (then the region algorithm and one-shot), allgather and reduce_scatter up
# to 256 bytes per rank (512 in all; the region algorithm from 520), gather,
# scatter and alltoall at 8 KiB (4 KiB blocks: every line, a rank posts
# every block but its own); with the 2 ranks on one CPU, allreduce (4 KiB
# per rank) and reduce_scatter (2 KiB blocks) keep the region algorithms
# (the bench's own 8-byte allreduces run shm_ll there too). Skipped (77)
# where fewer than 2 CPUs are allowed.
add_test(NAME coll.tuner_ll_picks COMMAND sh -c [=[
kt=$1; fail() { echo "TEST FAILED: $*"; exit 1; }
[ "$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc)" -ge 2 ] || { echo "SKIP: fewer than 2 CPUs allowed"; exit 77; }
command -v taskset >/dev/null || { echo "SKIP: no taskset"; exit 77; }
picks() { KAITIAN_DEBUG=INFO $1 "$kt" run -n 2 "$kt" bench -C "$2" -b "$3" -e "$3" -n 1 -w 0 -c 1 2>&1; }
expect() { # OUT ALGO COLL...
  out=$1 algo=$2; shift 2
  for c in "$@"; do
    printf '%s\n' "$out" | grep -q "rank 0/2: $c runs algorithm $algo " ||
      fail "$c did not pick $algo: $(printf '%s\n' "$out" | grep "$c runs algorithm")"
  done
}
out=$(picks "" broadcast,reduce 1536) || fail "2 ranks: $out"
expect "$out" shm_ll broadcast reduce
out=$(picks "" broadcast,reduce 1540) || fail "2 ranks: $out"
expect "$out" shm broadcast
expect "$out" shm_oneshot reduce
out=$(picks "" allreduce 384) || fail "2 ranks: $out"
expect "$out" shm_ll allreduce
out=$(picks "" allreduce 388) || fail "2 ranks: $out"
expect "$out" shm_oneshot allreduce
out=$(picks "" allgather,reduce_scatter 512) || fail "2 ranks: $out"
expect "$out" shm_ll allgather reduce_scatter
out=$(picks "" allgather,reduce_scatter 520) || fail "2 ranks: $out"
expect "$out" shm allgather reduce_scatter
out=$(picks "" gather,scatter,alltoall 8K) || fail "2 ranks: $out"
expect "$out" shm_ll gather scatter alltoall
out=$(picks "taskset -c 0" allreduce,reduce_scatter 4K) || fail "2 ranks on one CPU: $out"
expect "$out" shm_oneshot allreduce
expect "$out" shm reduce_scatter
echo PASS]=] sh ${KT_CLI})
set_tests_properties(coll.tuner_ll_picks PROPERTIES TIMEOUT 300 LABELS "coll" PROCESSORS 2 SKIP_RETURN_CODE 77
  ENVIRONMENT "KAITIAN_TIMEOUT=60000")

# The one-shot reduce's range: at 2 ranks every size unless
# KAITIAN_SHM_REDUCE_ONESHOT_BYTES is set (above its 64 MiB default here),
# with more ranks up to that size; a value set is honoured at 2 ranks too.
add_test(NAME coll.tuner_reduce_picks COMMAND sh -c [=[
kt=$1; fail() { echo "TEST FAILED: $*"; exit 1; }
picks() { KAITIAN_DEBUG=INFO "$kt" run -n $1 "$kt" bench -C reduce -b "$2" -e "$2" -n 1 -w 0 -c 1 2>&1; }
expect() { # OUT RANKS ALGO WHAT
  printf '%s\n' "$1" | grep -q "rank 0/$2: reduce runs algorithm $3 " ||
    fail "$4: reduce did not pick $3: $(printf '%s\n' "$1" | grep 'reduce runs algorithm')"
}
out=$(picks 2 65M) || fail "2 ranks: $out"
expect "$out" 2 shm_oneshot "2 ranks, 65 MiB"
out=$(picks 3 65M) || fail "3 ranks: $out"
expect "$out" 3 shm "3 ranks, 65 MiB"
out=$(KAITIAN_SHM_REDUCE_ONESHOT_BYTES=8192 picks 2 16K) || fail "2 ranks, set: $out"
expect "$out" 2 shm "2 ranks, 16 KiB over KAITIAN_SHM_REDUCE_ONESHOT_BYTES=8192"
out=$(KAITIAN_SHM_REDUCE_ONESHOT_BYTES=8192 picks 2 8K) || fail "2 ranks, set: $out"
expect "$out" 2 shm_oneshot "2 ranks, 8 KiB under KAITIAN_SHM_REDUCE_ONESHOT_BYTES=8192"
echo PASS]=] sh ${KT_CLI})
set_tests_properties(coll.tuner_reduce_picks PROPERTIES TIMEOUT 300 LABELS "coll" PROCESSORS 2
  ENVIRONMENT "KAITIAN_TIMEOUT=60000")

# Single-copy allreduce: buffers from kt_mem_alloc and single-copy from 1
# byte up (through shm_oneshot up to 64 KiB, shm_rsag above); then buffers
# registered on rank 0 only, with small regions, so the ranks disagree and
# must copy, in many chunks, and get the same results.
foreach(np 2 3 4)
  kt_coll_test(coll.np${np}.shm_direct ${np} 300 "KAITIAN_SHM_DIRECT_BYTES=1" --coll allreduce,mixed --registered all)
endforeach()
kt_coll_test(coll.np3.shm_direct_mixed 3 300 "KAITIAN_SHM_DIRECT_BYTES=1;KAITIAN_SHM_CHUNK_BYTES=4160"
  --coll allreduce,mixed --registered rank0 --quick)
# Rank 0 offers its buffers on some ops and not on others, one op after the
# other: a rank that finishes an op early and offers in the next must not be
# read as offering in the op a slower peer is still deciding.
kt_coll_test(coll.np3.shm_direct_flip 3 300 "KAITIAN_SHM_DIRECT_BYTES=1" --coll allreduce,mixed --registered flip)

# The checks themselves must be able to fail: corrupt every result in several
# ways (output element, guard byte, input, gap) and require each to be caught.
kt_coll_test(coll.np3.selftest 3 600 "" --quick --selftest)

add_test(NAME badargs.np2 COMMAND ${KT_CLI} run -n 2 $<TARGET_FILE:badargs_test>)
set_tests_properties(badargs.np2 PROPERTIES TIMEOUT 180 LABELS "coll" PROCESSORS 2
  ENVIRONMENT "${KT_COLL_ENV}")
add_test(NAME badargs.np3 COMMAND ${KT_CLI} run -n 3 $<TARGET_FILE:badargs_test>)
set_tests_properties(badargs.np3 PROPERTIES TIMEOUT 180 LABELS "coll" PROCESSORS 3
  ENVIRONMENT "${KT_COLL_ENV}")
