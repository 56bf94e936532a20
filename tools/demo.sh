#!/usr/bin/env bash
# make demo-bench: a 4-rank job of `kaitian bench -c 1` on this host (shared
# memory between the ranks), with an explanation of the table it prints.
set -euo pipefail
KT=${1:-build/kaitian}
cat <<'TXT'
== KaiTian demo ==========================================================
Starting 4 ranks on this host with `kaitian run -n 4`; each rank runs
`kaitian bench -c 1`, which times every collective over a range of sizes and
checks the results of one iteration against exactly predictable values.
Only rank 0 prints (lines prefixed "[0]").
==========================================================================
TXT
"$KT" run -n 4 "$KT" bench -b 8 -e 4M -f 4 -c 1
cat <<'TXT'

How to read the tables
  size     bytes of the operation. allreduce, broadcast, reduce, sendrecv: one
           rank's buffer. allgather, reduce_scatter, alltoall, gather, scatter:
           the whole buffer of every rank's block (allgather's output, gather's
           at the root), so one rank's block is size / 4 here
  count    elements of one rank's buffer or block: size / 4 bytes (float32),
           and / 4 ranks again for the second kind (allgather 2097152 B: 131072);
           a size whose block rounds to 0 elements is skipped (8 B for those)
  type, redop, root  the data type, the reduction ("none": nothing is reduced)
           and the root (-1: the collective has none)
  time     microseconds per operation: average over the iterations, slowest rank
  algbw    size / time, in GB/s
  busbw    algbw times the collective's bus factor (allreduce 2(n-1)/n, ...):
           comparable with the link bandwidth and across rank counts, as in
           nccl-tests
  #wrong   elements that differed from the expected value in the checked
           iteration (must be 0)
See docs/bench.md for more, and `kaitian bench -h` for the flags.
TXT
