/* ring.c - the pipelined ring step engine shared by the ring algorithms
 * (allreduce = reduce-scatter + allgather, reduce_scatter, allgather(v)).
 * See kt__ring in coll.h for the contract. */
#include "coll.h"

#include "reduce/reduce.h"

#include <string.h>

size_t kt__chunk_bytes(kt_dtype dt) {
  size_t es = kt_dtype_size(dt);
  size_t chunk = (size_t)KT_MAX(kt__param_CHUNK_BYTES(), 1);
  chunk -= chunk % es;
  return chunk ? chunk : es;
}

kt_result kt__ring_run(kt__exec *ex, const kt__ring *rg) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  int next = (r + 1) % p, prev = (r - 1 + p) % p;
  int steps = rg->rs_steps + rg->ag_steps;
  if (steps == 0) {
    if (rg->copy_len) memcpy(rg->copy_to, rg->copy_from, rg->copy_len);
    return KT_SUCCESS;
  }
  size_t es = kt_dtype_size(op->dtype), chunk = kt__chunk_bytes(op->dtype);
  kt__reduce_fn reduce = rg->rs_steps ? kt__reduce_kernel(op->dtype, op->op) : NULL;

  size_t copied = 0;
  kt__xfer sx[2], rx;
  bool posted[2] = {false, false};
  int sb = kt__mod(rg->start, p);
  kt__xfer_send(&sx[0], next, rg->in[sb], rg->len[sb], rg->tag_base);
  KT_CHECK(kt__net_post(ex, &sx[0]));
  posted[0] = true;

  for (int k = 0; k < steps; k++) {
    int rb = kt__mod(rg->start - k - 1, p);
    bool rs = k < rg->rs_steps;
    bool last_rs = rs && k == rg->rs_steps - 1;
    char *dst = rg->work[rb];
    size_t len = rg->len[rb];
    kt__xfer_recv(&rx, prev, rs ? rg->tmp : dst, len, rg->tag_base + (uint32_t)k);
    KT_CHECK(kt__net_post(ex, &rx));
    /* The block arriving now is sent on at step k + 1 as it becomes ready. */
    kt__xfer *nx = NULL;
    if (k + 1 < steps) {
      nx = &sx[(k + 1) % 2];
      if (posted[(k + 1) % 2]) KT_CHECK(kt__net_wait(ex, nx)); /* slot reuse: send k-1 */
      kt__xfer_send(nx, next, dst, len, rg->tag_base + (uint32_t)k + 1);
      nx->avail = 0;
      KT_CHECK(kt__net_post(ex, nx));
      posted[(k + 1) % 2] = true;
    }
    size_t processed = 0;
    for (;;) {
      size_t ready = rx.complete ? len : rx.done;
      if (processed < len && (ready - processed >= chunk || ready == len)) {
        size_t n = KT_MIN(chunk, ready - processed);
        if (rs) {
          reduce(dst + processed, rg->in[rb] + processed, rg->tmp + processed, n / es);
          if (last_rs) kt__op_finalize(op, dst + processed, n / es, p);
        }
        processed += n;
        if (nx) nx->avail = processed;
        /* Keep the sockets moving between chunks, so that neither neighbour
         * sits idle while this rank reduces a backlog. */
        if (processed < len) KT_CHECK(kt__net_progress(ex, false));
        continue;
      }
      if (processed == len && rx.complete) break;
      if (copied < rg->copy_len) { /* idle: copy a chunk instead of sleeping */
        size_t n = KT_MIN(chunk, rg->copy_len - copied);
        memcpy(rg->copy_to + copied, rg->copy_from + copied, n);
        copied += n;
        KT_CHECK(kt__net_progress(ex, false));
        continue;
      }
      KT_CHECK(kt__net_progress(ex, true));
    }
  }
  if (copied < rg->copy_len) memcpy(rg->copy_to + copied, rg->copy_from + copied, rg->copy_len - copied);
  for (int i = 0; i < 2; i++)
    if (posted[i]) KT_CHECK(kt__net_wait(ex, &sx[i]));
  return KT_SUCCESS;
}
