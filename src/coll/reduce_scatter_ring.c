/* reduce_scatter_ring.c - ring reduce-scatter: p-1 steps, each rank reducing
 * the block it receives with its own contribution and passing it on, so that
 * rank r ends with block r fully reduced. Streamed in chunks (ring.c).
 *
 * Any number of ranks. Works in rounds of at most KAITIAN_RING_SEGMENT_BYTES
 * per block; partial results live in scratch, never in the caller's input.
 * Cost: (p-1) alpha + (p-1)/p n beta + (p-1)/p n gamma (n = total bytes). */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__reduce_scatter_ring(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *sb = op->sendbuf;
  char *rb = op->recvbuf;
  if (p == 1 || n == 0) {
    if (sb != rb && n) memcpy(rb, sb, n * es);
    return KT_SUCCESS;
  }
  /* p + 1 blocks of scratch in all: keep them within one segment's budget. */
  size_t seg = KT_MIN(n, KT_MAX((size_t)kt__param_RING_SEGMENT_BYTES() / es / ((size_t)p + 1), (size_t)1));
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
  for (size_t base = 0; base < n; base += seg, round++) {
    size_t this_n = KT_MIN(seg, n - base);
    for (int b = 0; b < p; b++) {
      in[b] = sb + ((size_t)b * n + base) * es;
      work[b] = b == r ? rb + base * es : scr + (size_t)b * seg * es;
      len[b] = this_n * es;
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
  return res;
}
