/* reduce_shm_oneshot.c - one-shot reduce through shared memory: every
 * non-root copies its input into its region and posts; the root posts at
 * once, waits for all, and reduces its own input with every region into
 * recvbuf. A non-root waits only for the root's post (which compares the
 * ops' signatures), not for the reduction. One synchronisation per op where
 * the region algorithm (reduce_shm.c: reduce-scatter, then the root gathers
 * the shares) has two.
 *
 * All ranks on one host; messages larger than a region (KAITIAN_SHM_CHUNK_BYTES)
 * go a region at a time, double-buffered, so a non-root copies chunk k + 1
 * in while the root reduces chunk k. Memory traffic: 2n per non-root
 * (copy-in), p n reads and n writes at the root, all of the reduction on the
 * root.
 * The root's own input comes first, then the others in rank order; non-roots
 * never touch recvbuf. */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

kt_result kt__reduce_shm_oneshot(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank, root = op->root;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  size_t chunk = kt__shm_region_bytes(c) / es; /* elements per iteration */
  if (chunk == 0) chunk = 1;
  kt__shm_op_begin(ex);
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  size_t base = 0;
  do { /* at least one iteration: an empty op still meets (signatures) */
    size_t len = KT_MIN(chunk, n - base), off = base * es;
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (me != root && len) kt__copy_shared(kt__shm_region(c, me, 0, par), (const char *)op->sendbuf + off, len * es);
    uint64_t step = kt__shm_post(ex);
    if (me != root) {
      KT_CHECK(kt__shm_wait(ex, root, step));
    } else {
      KT_CHECK(kt__shm_wait(ex, -1, step));
      char *dst = (char *)op->recvbuf + off;
      const char *acc = (const char *)op->sendbuf + off; /* the root's input, then dst (in place: the same) */
      for (int r = 0; r < p && len; r++) {
        if (r == root) continue;
        reduce(dst, acc, kt__shm_region(c, r, 0, par), len);
        acc = dst;
      }
      if (len) kt__op_finalize(op, dst, len, p);
    }
    base += len;
  } while (base < n);
  return KT_SUCCESS;
}
