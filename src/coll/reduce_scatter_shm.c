/* reduce_scatter_shm.c - reduce-scatter through shared memory: per window,
 * every rank copies the window of every other rank's block into its region
 * and posts; after waiting for all, each rank reduces its own block's window
 * across all ranks (its own part read from its input) straight into recvbuf.
 *
 * All ranks on one host. Traffic per rank about 2 x input + the reduction's
 * reads of p windows. Internal callers (allreduce_hierarchical.c) may give
 * uneven blocks: op->counts/op->displs in elements of sendbuf, op->count then
 * being the total. */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

#include <string.h>

kt_result kt__reduce_scatter_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *in = op->sendbuf;
  char *out = op->recvbuf;
#define BCOUNT(b) (op->counts ? op->counts[b] : n)
#define BSTART(b) (op->counts ? op->displs[b] : (size_t)(b) * n)
  kt__shm_op_begin(ex);
  size_t most = 0; /* elements of the largest block */
  for (int b = 0; b < p; b++) most = KT_MAX(most, BCOUNT(b));
  if (most == 0) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  size_t win = kt__shm_region_bytes(c) / es / (size_t)p; /* elements per block per iteration */
  if (win == 0) win = 1;
  for (size_t off = 0; off < most; off += win) {
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    char *mine = kt__shm_region(c, me, 0, par);
    for (int b = 0; b < p; b++)
      if (b != me && off < BCOUNT(b))
        kt__copy_shared(mine + (size_t)b * win * es, in + (BSTART(b) + off) * es, KT_MIN(win, BCOUNT(b) - off) * es);
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    if (off >= BCOUNT(me)) continue;
    size_t len = KT_MIN(win, BCOUNT(me) - off);
    const char *own = in + (BSTART(me) + off) * es;
#define PART(r) ((r) == me ? own : kt__shm_region(c, r, 0, par) + (size_t)me * win * es)
    char *dst = out + off * es;
    /* Own part first: in place dst is own, read before it is written. */
    int first = me == 0 ? 1 : 0;
    reduce(dst, own, PART(first), len);
    for (int r = 0; r < p; r++)
      if (r != me && r != first) reduce(dst, dst, PART(r), len);
#undef PART
    kt__op_finalize(op, dst, len, p);
  }
#undef BCOUNT
#undef BSTART
  return KT_SUCCESS;
}
