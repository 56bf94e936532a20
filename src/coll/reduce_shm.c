/* reduce_shm.c - reduce through shared memory: the reduce-scatter half of
 * allreduce_shm_rsag (every rank reduces a 1/p share of each chunk across
 * all ranks), after which only the root copies the shares out.
 *
 * All ranks on one host, any root. Non-root ranks never touch recvbuf. */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

#include <string.h>

void kt__shm_reduce_share(kt__exec *ex, kt__reduce_fn reduce, int par, size_t lo, size_t cnt,
                          const char *own, char *out, bool stream, char *res) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype);
  _Alignas(64) char blk[KT_SHM_BLOCK];
  for (size_t b0 = 0; b0 < cnt; b0 += KT_SHM_BLOCK / es) {
    size_t bn = KT_MIN(KT_SHM_BLOCK / es, cnt - b0), at = (lo + b0) * es;
    const char *mine = own + b0 * es;
    reduce(blk, me == 0 ? mine : kt__shm_region(c, 0, 0, par) + at, me == 1 ? mine : kt__shm_region(c, 1, 0, par) + at,
           bn);
    for (int r = 2; r < p; r++) reduce(blk, blk, r == me ? mine : kt__shm_region(c, r, 0, par) + at, bn);
    kt__op_finalize(op, blk, bn, p);
    if (out) kt__copy_out(stream, out + b0 * es, blk, bn * es);
    kt__copy_shared(res + b0 * es, blk, bn * es);
  }
}

kt_result kt__reduce_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *in = op->sendbuf;
  kt__shm_op_begin(ex);
  if (n == 0) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  size_t share_max = kt__shm_region_bytes(c) / es / (size_t)p;
  if (share_max == 0) share_max = 1;
  bool stream = me == op->root && kt__stream_output_ex(ex, n * es); /* only the root writes results */
  for (size_t base = 0; base < n; base += share_max * (size_t)p) {
    size_t len = KT_MIN(share_max * (size_t)p, n - base);
    size_t share = (len + (size_t)p - 1) / (size_t)p;
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    char *mine = kt__shm_region(c, me, 0, par);
    for (int r = 0; r < p; r++) {
      size_t lo = KT_MIN((size_t)r * share, len), hi = KT_MIN(lo + share, len);
      if (r != me && hi > lo) kt__copy_shared(mine + lo * es, in + (base + lo) * es, (hi - lo) * es);
    }
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    size_t lo = KT_MIN((size_t)me * share, len), hi = KT_MIN(lo + share, len);
    kt__shm_reduce_share(ex, reduce, par, lo, hi - lo, in + (base + lo) * es, NULL, false,
                         kt__shm_region(c, me, 1, par) + lo * es);
    step = kt__shm_post(ex);
    if (me == op->root) {
      KT_CHECK(kt__shm_wait(ex, -1, step));
      for (int r = 0; r < p; r++) {
        size_t rlo = KT_MIN((size_t)r * share, len), rhi = KT_MIN(rlo + share, len);
        if (rhi > rlo)
          kt__copy_out(stream, (char *)op->recvbuf + (base + rlo) * es, kt__shm_region(c, r, 1, par) + rlo * es,
                       (rhi - rlo) * es);
      }
    }
  }
  if (stream) kt__stream_fence();
  return KT_SUCCESS;
}
