/* allreduce_ring.c - ring allreduce: reduce-scatter then allgather around the
 * ring, each step streamed in chunks so sending, receiving and reducing
 * overlap (see ring.c).
 *
 * Any number of ranks and any count. Data is processed in rounds whose blocks
 * are at most KAITIAN_RING_SEGMENT_BYTES, which bounds scratch memory to one
 * block.
 * Cost: 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma: bandwidth-optimal,
 * for large messages. Every rank ends with bit-identical results. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__allreduce_ring(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *sb = op->sendbuf;
  char *rb = op->recvbuf;
  if (p == 1 || n == 0) {
    if (sb != rb && n) memcpy(rb, sb, n * es);
    return KT_SUCCESS;
  }
  size_t seg_max = (size_t)KT_MAX(kt__param_RING_SEGMENT_BYTES(), 1) / es;
  if (seg_max == 0) seg_max = 1;
  size_t per = (n + (size_t)p - 1) / (size_t)p;
  size_t seg = KT_MIN(per, seg_max);
  char *tmp = kt__scratch(c, seg * es);
  if (!tmp) return KT_ERR_NO_MEMORY;

  kt_result res = KT_SUCCESS;
  const char **in = malloc((size_t)p * sizeof *in); /* freed at exit */
  char **work = malloc((size_t)p * sizeof *work);
  size_t *len = malloc((size_t)p * sizeof *len);
  if (!in || !work || !len) {
    res = kt__err(KT_ERR_NO_MEMORY, "rank %d: allreduce: out of memory", c->rank);
    goto exit;
  }
  uint32_t round = 0;
  for (size_t base = 0; base < n; base += seg * (size_t)p, round++) {
    size_t this_n = KT_MIN(seg * (size_t)p, n - base);
    size_t bper = (this_n + (size_t)p - 1) / (size_t)p;
    for (int b = 0; b < p; b++) {
      size_t lo = KT_MIN((size_t)b * bper, this_n), hi = KT_MIN(lo + bper, this_n);
      in[b] = sb + (base + lo) * es;
      work[b] = rb + (base + lo) * es;
      len[b] = (hi - lo) * es;
    }
    kt__ring rg = {.start = c->rank, .rs_steps = p - 1, .ag_steps = p - 1, .in = in, .work = work,
                   .len = len, .tmp = tmp, .tag_base = round << 16};
    KT_CHECK_GOTO(kt__ring_run(ex, &rg), res, exit);
  }
exit:
  free(in);
  free(work);
  free(len);
  return res;
}
