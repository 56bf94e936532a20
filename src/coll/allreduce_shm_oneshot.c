/* allreduce_shm_oneshot.c - one-shot allreduce through shared memory: every
 * rank copies its input into its region, posts once, waits for all, then
 * reduces all inputs itself in rank order (so every rank computes
 * bit-identical results). One synchronisation per op and no second phase.
 *
 * All ranks on one host; count * size <= the region (KAITIAN_SHM_CHUNK_BYTES).
 * Cost: one post + wait (~sub-microsecond when spinning); memory traffic
 * 2n (copy-in) + p n (reads) + n (write). For small messages. Single-copy
 * instead when every rank's buffers are registered (allreduce_shm_direct.c). */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

#include <string.h>

static void copy_in(kt__exec *ex, void *par) {
  const kt__op *op = ex->op;
  kt__copy_shared(kt__shm_region(ex->group, ex->group->rank, 0, *(int *)par), op->sendbuf,
                  op->count * kt_dtype_size(op->dtype));
}

kt_result kt__allreduce_shm_oneshot(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  if (bytes > kt__shm_region_bytes(c))
    return kt__err(KT_ERR_INTERNAL, "shm_oneshot called for %zu bytes (region %zu)", bytes, kt__shm_region_bytes(c));
  kt__shm_op_begin(ex);
  int par;
  KT_CHECK(kt__shm_iter_begin(ex, &par));
  bool offered = bytes && kt__shm_direct_offer(ex, op->sendbuf, op->recvbuf, bytes);
  if (bytes && !offered) copy_in(ex, &par);
  uint64_t step = kt__shm_post(ex);
  KT_CHECK(kt__shm_wait(ex, -1, step));
  if (!bytes) return KT_SUCCESS;
  if (bytes >= (size_t)kt__param_SHM_DIRECT_BYTES()) {
    bool done;
    KT_CHECK(kt__allreduce_shm_direct(ex, offered, copy_in, &par, &done));
    if (done) return KT_SUCCESS;
  }
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  char *dst = op->recvbuf;
  reduce(dst, kt__shm_region(c, 0, 0, par), kt__shm_region(c, 1, 0, par), n);
  for (int r = 2; r < p; r++) reduce(dst, dst, kt__shm_region(c, r, 0, par), n);
  kt__op_finalize(op, dst, n, p);
  return KT_SUCCESS;
}
