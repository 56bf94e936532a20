/* reduce_shm_oneshot.c - one-shot reduce through shared memory: every
 * non-root copies its input into its region and posts; the root posts at
 * once, waits for all, and reduces its own input with every region into
 * recvbuf. A non-root waits only for the root's post (which compares the
 * ops' signatures), not for the reduction. One synchronisation per op where
 * the region algorithm (reduce_shm.c: reduce-scatter, then the root gathers
 * the shares) has two.
 *
 * All ranks on one host; count * size <= the region (KAITIAN_SHM_CHUNK_BYTES).
 * Memory traffic: 2n per non-root (copy-in), p n reads and n writes at the
 * root, all of the reduction on the root; for small and mid-sized messages.
 * The root's own input comes first, then the others in rank order; non-roots
 * never touch recvbuf. */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

kt_result kt__reduce_shm_oneshot(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, me = c->rank, root = op->root;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  if (bytes > kt__shm_region_bytes(c))
    return kt__err(KT_ERR_INTERNAL, "reduce shm_oneshot called for %zu bytes (region %zu)", bytes,
                   kt__shm_region_bytes(c));
  kt__shm_op_begin(ex);
  int par;
  KT_CHECK(kt__shm_iter_begin(ex, &par));
  if (me != root && bytes) kt__copy_shared(kt__shm_region(c, me, 0, par), op->sendbuf, bytes);
  uint64_t step = kt__shm_post(ex);
  if (me != root) return kt__shm_wait(ex, root, step);
  KT_CHECK(kt__shm_wait(ex, -1, step));
  if (!bytes) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  const void *acc = op->sendbuf; /* the root's input, then recvbuf (in place: the same) */
  for (int r = 0; r < p; r++) {
    if (r == root) continue;
    reduce(op->recvbuf, acc, kt__shm_region(c, r, 0, par), n);
    acc = op->recvbuf;
  }
  kt__op_finalize(op, op->recvbuf, n, p);
  return KT_SUCCESS;
}
