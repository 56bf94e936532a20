/* allreduce_shm_direct.c - single-copy allreduce among the ranks of one host,
 * in buffers every rank registered (kt_mem_register, kt_mem_alloc).
 *
 * The shm allreduce algorithms start the same way whether a rank's buffers
 * are registered or not: a rank whose are offers them (its slot names their
 * files) instead of copying its input in, and posts. After the wait, every
 * rank sees who offered. If all did, each maps the others' buffers (a cache
 * per peer keeps them mapped) and posts whether that worked; if it worked
 * everywhere, each rank reduces its 1/p share of the whole message, in rank
 * order, straight from every rank's input, and writes it into every rank's
 * output; a last post and wait, and the op is done. Memory traffic per rank:
 * n read, n written (the copying algorithms move 4n for p = 2), no chunks,
 * three synchronisations. In any other case the ranks that offered copy in
 * after all, everyone posts once more, and the algorithm goes on.
 *
 * Shares are disjoint and every rank writes only its own share, so in-place
 * buffers are safe: a share's inputs are read into a block on the stack
 * before any output of that share is written. The result is the same on
 * every rank and the same as the copying algorithms'. */
#include "coll.h"

#include "memreg.h"
#include "reduce/reduce.h"
#include "transport/shm.h"

#include <stdatomic.h>

/* Single-copy: my share of the message, from every rank's input (src) into
 * every rank's output (dst), reduced in rank order a block at a time. */
static void direct_share(kt__exec *ex, kt__reduce_fn reduce, char *const *src, char *const *dst) {
  const kt__op *op = ex->op;
  int p = ex->group->size, me = ex->group->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  size_t align = 64 / es ? 64 / es : 1;
  size_t share = ((n + (size_t)p - 1) / (size_t)p + align - 1) / align * align;
  size_t lo = KT_MIN((size_t)me * share, n), hi = KT_MIN(lo + share, n);
  _Alignas(64) char blk[KT_SHM_BLOCK];
  bool stream = kt__stream_output_ex(ex, n * es * (size_t)p);
  for (size_t b0 = lo; b0 < hi; b0 += KT_SHM_BLOCK / es) {
    size_t bn = KT_MIN(KT_SHM_BLOCK / es, hi - b0), at = b0 * es;
    reduce(blk, src[0] + at, src[1] + at, bn);
    for (int r = 2; r < p; r++) reduce(blk, blk, src[r] + at, bn);
    kt__op_finalize(op, blk, bn, p);
    for (int r = 0; r < p; r++) {
      if (stream) kt__copy_stream(dst[r] + at, blk, bn * es);
      else kt__copy_shared(dst[r] + at, blk, bn * es);
    }
  }
  if (stream) kt__stream_fence();
}

kt_result kt__allreduce_shm_direct(kt__exec *ex, bool offered, void (*copy_in)(kt__exec *, void *), void *arg,
                                   bool *done) {
  const kt__op *op = ex->op;
  int p = ex->group->size, me = ex->group->rank;
  int offers = 0;
  for (int r = 0; r < p; r++) offers += kt__shm_direct_offered(ex, r);
  *done = false;
  if (offers == 0) return KT_SUCCESS;
  if (offers == p) {
    char *src[p], *dst[p];
    kt__shm_direct_map(ex, src, dst, op->count * kt_dtype_size(op->dtype));
    src[me] = (char *)op->sendbuf;
    dst[me] = op->recvbuf;
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    bool all = true;
    for (int r = 0; r < p; r++) all = all && kt__shm_direct_ok(ex, r);
    if (all) {
      direct_share(ex, kt__reduce_kernel(op->dtype, op->op), src, dst);
      step = kt__shm_post(ex);
      KT_CHECK(kt__shm_wait(ex, -1, step)); /* every share is in my output */
      *done = true;
      atomic_fetch_add_explicit(&kt__memreg_direct_runs, 1, memory_order_relaxed);
      return KT_SUCCESS;
    }
  }
  if (offered) copy_in(ex, arg);
  uint64_t step = kt__shm_post(ex);
  return kt__shm_wait(ex, -1, step);
}
