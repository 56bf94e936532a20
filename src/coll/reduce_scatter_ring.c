/* reduce_scatter_ring.c - ring reduce-scatter: p-1 steps, each rank reducing
 * the block it receives with its own contribution and passing it on, so that
 * rank r ends with block r fully reduced. Streamed in chunks (ring.c).
 *
 * Any number of ranks. Works in rounds of at most KAITIAN_RING_SEGMENT_BYTES
 * per block; partial results live in scratch, never in the caller's input.
 * Internal callers (reduce_scatter_hierarchical.c) may give uneven blocks:
 * op->counts/op->displs in elements of sendbuf, op->count then being the
 * total; in place then means recvbuf == sendbuf + displs[rank].
 * Cost: (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma (n = total bytes). */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__reduce_scatter_ring(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *sb = op->sendbuf;
  char *rb = op->recvbuf;
#define BCOUNT(b) (op->counts ? op->counts[b] : n)
#define BSTART(b) (op->counts ? op->displs[b] : (size_t)(b) * n)
  size_t most = 0; /* elements of the largest block */
  for (int b = 0; b < p; b++) most = KT_MAX(most, BCOUNT(b));
  if (p == 1 || most == 0) {
    if (BCOUNT(r) && sb + BSTART(r) * es != rb) memcpy(rb, sb + BSTART(r) * es, BCOUNT(r) * es);
    return KT_SUCCESS;
  }
  /* p + 1 blocks of scratch in all: keep them within one segment's budget. */
  size_t seg = KT_MIN(most, KT_MAX((size_t)kt__param_RING_SEGMENT_BYTES() / es / ((size_t)p + 1), (size_t)1));
  /* scratch: p blocks of partial sums + one receive buffer */
  char *scr = kt__scratch(c, ((size_t)p + 1) * seg * es);
  if (!scr) return KT_ERR_NO_MEMORY;
  char *tmp = scr + (size_t)p * seg * es;

  kt_result res = KT_SUCCESS;
  const char **in = malloc((size_t)p * sizeof *in); /* freed at exit */
  char **work = malloc((size_t)p * sizeof *work);
  size_t *len = malloc((size_t)p * sizeof *len);
  if (!in || !work || !len) {
    res = kt__err(KT_ERR_NO_MEMORY, "rank %d: reduce_scatter: out of memory", c->rank);
    goto exit;
  }
  uint32_t round = 0;
  for (size_t base = 0; base < most; base += seg, round++) {
    for (int b = 0; b < p; b++) {
      size_t lo = KT_MIN(base, BCOUNT(b)); /* a short block is empty in its last rounds */
      in[b] = sb + (BSTART(b) + lo) * es;
      work[b] = b == r ? rb + lo * es : scr + (size_t)b * seg * es;
      len[b] = KT_MIN(seg, BCOUNT(b) - lo) * es;
    }
    /* In place (recvbuf inside sendbuf): block r of the input is read at the
     * last step only, when it is reduced into recvbuf itself. */
    kt__ring rg = {.start = r - 1, .rs_steps = p - 1, .ag_steps = 0, .in = in, .work = work,
                   .len = len, .tmp = tmp, .tag_base = round << 16};
    KT_CHECK_GOTO(kt__ring_run(ex, &rg), res, exit);
  }
exit:
  free(in);
  free(work);
  free(len);
#undef BCOUNT
#undef BSTART
  return res;
}
