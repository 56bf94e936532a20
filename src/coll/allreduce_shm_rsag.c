/* allreduce_shm_rsag.c - chunked reduce-scatter + allgather through shared
 * memory. Per chunk: every rank copies the parts of its input other ranks
 * will reduce into its region and posts; each rank reduces its 1/p share of
 * the chunk across all ranks (its own part read straight from its input), a
 * block at a time, copies each block to its output and into its out region,
 * and posts; every rank copies the other ranks' shares out. Regions are
 * double-buffered by iteration, so one rank's copy-in of chunk k+1 overlaps
 * the others' reduction of chunk k.
 *
 * All ranks on one host; any count. Memory traffic per rank, counted (reads
 * plus writes): (5 - 2/p) n bytes, 4n for p = 2. Copy-in moves (p-1)/p n
 * (2(p-1)/p n of traffic), the reduction reads n and writes its share twice
 * (2n/p), copy-out moves (p-1)/p n again. For large messages.
 *
 * When every rank's buffers are registered, the op runs single-copy
 * instead (allreduce_shm_direct.c). */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

#include <string.h>

/* Copy the parts of elements [base, base + len) of my input that the other
 * ranks reduce (shares of share elements) into my in region of parity par. */
static void copy_in(kt__exec *ex, int par, size_t base, size_t len, size_t share) {
  kt__group *c = ex->group;
  size_t es = kt_dtype_size(ex->op->dtype);
  const char *in = ex->op->sendbuf;
  char *mine = kt__shm_region(c, c->rank, 0, par);
  for (int r = 0; r < c->size; r++) {
    size_t lo = KT_MIN((size_t)r * share, len), hi = KT_MIN(lo + share, len);
    if (r != c->rank && hi > lo) kt__copy_shared(mine + lo * es, in + (base + lo) * es, (hi - lo) * es);
  }
}

struct first_chunk {
  int par;
  size_t len, share;
};

static void copy_first(kt__exec *ex, void *arg) {
  const struct first_chunk *f = arg;
  copy_in(ex, f->par, 0, f->len, f->share);
}

kt_result kt__allreduce_shm_rsag(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  const char *in = op->sendbuf;
  char *out = op->recvbuf;
  kt__shm_op_begin(ex);
  if (n == 0) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  bool offered = false;
  bool stream = kt__stream_output_ex(ex, n * es * (size_t)p);
  /* Elements per chunk, a multiple of p shares of whole cache lines where
   * possible. */
  size_t chunk = kt__shm_region_bytes(c) / es;
  size_t align = 64 / es ? 64 / es : 1;
  size_t share_max = chunk / (size_t)p / align * align;
  if (share_max == 0) share_max = chunk / (size_t)p ? chunk / (size_t)p : 1;
  for (size_t base = 0; base < n; base += share_max * (size_t)p) {
    size_t len = KT_MIN(share_max * (size_t)p, n - base);
    size_t share = (len + (size_t)p - 1) / (size_t)p;
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (base == 0) offered = kt__shm_direct_offer(ex, in, out, n * es);
    if (!offered || base > 0) copy_in(ex, par, base, len, share);
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    if (base == 0 && n * es >= (size_t)kt__param_SHM_DIRECT_BYTES()) {
      struct first_chunk f = {par, len, share};
      bool done;
      KT_CHECK(kt__allreduce_shm_direct(ex, offered, copy_first, &f, &done));
      if (done) return KT_SUCCESS;
    }
    size_t lo = KT_MIN((size_t)me * share, len), hi = KT_MIN(lo + share, len), cnt = hi - lo;
    char *res = kt__shm_region(c, me, 1, par) + lo * es;
    /* My share into my output too: it needs no copy-out from shm. */
    kt__shm_reduce_share(ex, reduce, par, lo, cnt, in + (base + lo) * es, out + (base + lo) * es, stream, res);
    step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    for (int r = 0; r < p; r++) {
      size_t rlo = KT_MIN((size_t)r * share, len), rhi = KT_MIN(rlo + share, len);
      if (r != me && rhi > rlo)
        kt__copy_out(stream, out + (base + rlo) * es, kt__shm_region(c, r, 1, par) + rlo * es, (rhi - rlo) * es);
    }
  }
  if (stream) kt__stream_fence();
  return KT_SUCCESS;
}
