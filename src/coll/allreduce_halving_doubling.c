/* allreduce_halving_doubling.c - reduce-scatter by recursive halving, then
 * allgather by recursive doubling (Rabenseifner's allreduce).
 *
 * The data is cut into q blocks, q the largest power of two <= p. In the
 * reduce-scatter step with distance m (m = q/2, q/4, ..., 1) each rank
 * exchanges half of the blocks it still reduces with the rank m away, keeps
 * the half its own bit selects and reduces the partner's half into it, the
 * reduction streamed chunk by chunk as the bytes arrive. After log2 q steps
 * rank k holds the finished block k; the allgather runs the steps backwards,
 * doubling what each rank holds. Every element is reduced on one rank only,
 * so every rank ends with the same bits.
 *
 * Non-powers of two: the first 2r ranks (r = p - q) pair up as in
 * recursive_doubling: the even one hands its data to the odd one, sits out,
 * and gets the result back at the end (two extra steps of n bytes).
 * Cost: 2 log2(q) alpha + 2 (q-1)/q n beta + (q-1)/q n gamma (+2 (alpha + n beta)
 * when p is not a power of two): the ring's bytes in 2 log2 q steps instead
 * of 2 (p-1). Measured on 4 netns hosts x 1 rank (docs/algorithms.md):
 * 0.98-1.09x the ring's time from 64 KiB to 64 MiB on a 1 Gbit/s link,
 * 0.40-0.98x where the CPUs are the bound. */
#include "coll.h"

#include "reduce/reduce.h"

#include <string.h>

/* Every message on one TCP connection of the pair, not striped: a step's
 * half of the message striped over two connections waited for the slower of
 * the two flows sharing the link (4 netns hosts x 1 rank at 1 Gbit/s, 2 MiB:
 * 38.1 ms striped against 26.4 ms on one, the link's time). */
#define HD_LANES 1

/* Element offset of block b of n elements cut into q blocks that differ by
 * at most one element (the larger ones first). */
static size_t block_start(size_t n, int q, int b) {
  size_t base = n / (size_t)q, extra = n % (size_t)q;
  return (size_t)b * base + KT_MIN((size_t)b, extra);
}

kt_result kt__allreduce_halving_doubling(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype), n = op->count, bytes = n * es;
  char *buf = op->recvbuf;
  const char *in = op->sendbuf; /* where this rank's partial result is: the input until first written */
  if (p == 1 || bytes == 0) {
    if (in != buf && bytes) memcpy(buf, in, bytes);
    return KT_SUCCESS;
  }
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  size_t chunk = kt__chunk_bytes(op->dtype);

  int q = kt__fold_pof2(p), rem = p - q;
  int nr; /* rank among the q that reduce; -1: sits out */
  if (r < 2 * rem) {
    char *tmp = NULL; /* the even one of a pair only sends */
    if (r % 2 && !(tmp = kt__scratch(c, bytes))) return KT_ERR_NO_MEMORY;
    KT_CHECK(kt__fold_in(ex, in, buf, tmp, &nr));
    if (nr >= 0) in = buf;
  } else {
    nr = r - rem;
  }
  uint32_t tag = 1;

  if (nr >= 0) {
    /* The rank in the communicator of reducing rank k. */
#define HD_RANK(k) ((k) < rem ? (k) * 2 + 1 : (k) + rem)
    char *tmp = kt__scratch(c, (block_start(n, q, q / 2) + 1) * es); /* the largest half */
    if (!tmp) return KT_ERR_NO_MEMORY;
    int lo = 0; /* this rank reduces blocks [lo, lo + 2m) */
    for (int m = q / 2; m >= 1; m /= 2, tag++) {
      int peer = HD_RANK(nr ^ m);
      bool upper = (nr & m) != 0;
      int keep = upper ? lo + m : lo, give = upper ? lo : lo + m;
      size_t k0 = block_start(n, q, keep), kn = block_start(n, q, keep + m) - k0;
      size_t g0 = block_start(n, q, give), gn = block_start(n, q, give + m) - g0;
      kt__xfer sx, rx;
      kt__xfer_send(&sx, peer, in + g0 * es, gn * es, tag);
      kt__xfer_recv(&rx, peer, tmp, kn * es, tag);
      sx.lanes = rx.lanes = HD_LANES;
      KT_CHECK(kt__net_post(ex, &sx));
      KT_CHECK(kt__net_post(ex, &rx));
      char *dst = buf + k0 * es;
      const char *mine = in + k0 * es;
      size_t len = kn * es, done = 0;
      bool last = m == 1;
      while (done < len || !rx.complete) {
        size_t ready = rx.complete ? len : rx.done;
        if (done < len && (ready - done >= chunk || ready == len)) {
          size_t k = KT_MIN(chunk, ready - done);
          /* The lower half of the pair first. Each element is reduced on one
           * rank only, so every rank ends with the same bits. */
          if (upper) reduce(dst + done, tmp + done, mine + done, k / es);
          else reduce(dst + done, mine + done, tmp + done, k / es);
          if (last) kt__op_finalize(op, dst + done, k / es, p);
          done += k;
          if (done < len) KT_CHECK(kt__net_progress(ex, false));
          continue;
        }
        KT_CHECK(kt__net_progress(ex, true));
      }
      KT_CHECK(kt__net_wait(ex, &sx));
      in = buf;
      lo = keep;
    }
    /* Allgather: this rank holds blocks [lo, lo + m); its partner m away
     * holds the next or previous m. */
    for (int m = 1; m < q; m *= 2, tag++) {
      int peer = HD_RANK(nr ^ m);
      int plo = lo ^ m;
      size_t h0 = block_start(n, q, lo), hn = block_start(n, q, lo + m) - h0;
      size_t p0 = block_start(n, q, plo), pn = block_start(n, q, plo + m) - p0;
      kt__xfer x[2];
      kt__xfer_send(&x[0], peer, buf + h0 * es, hn * es, tag);
      kt__xfer_recv(&x[1], peer, buf + p0 * es, pn * es, tag);
      x[0].lanes = x[1].lanes = HD_LANES;
      KT_CHECK(kt__net_post(ex, &x[0]));
      KT_CHECK(kt__net_post(ex, &x[1]));
      KT_CHECK(kt__net_waitall(ex, x, 2));
      lo = KT_MIN(lo, plo);
    }
#undef HD_RANK
  }
  return kt__fold_out(ex, buf);
}
