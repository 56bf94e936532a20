/* allreduce_recursive_doubling.c - recursive doubling allreduce: in round i
 * each rank exchanges its whole partial result with the rank 2^i away and
 * reduces, so after log2(p) rounds everyone holds the total.
 *
 * Non-powers of two: the first 2r ranks (r = p - 2^floor(log2 p)) pair up,
 * the even one hands its data to the odd one and sits out, and gets the result
 * back at the end (two extra steps). Operands are always combined lower rank
 * first, so every rank computes bit-identical results.
 * Cost: ceil(log2 p) (alpha + n beta + n gamma) (+2 (alpha + n beta) when p is
 * not a power of two): latency-optimal, for small messages. */
#include "coll.h"

#include "reduce/reduce.h"

#include <string.h>

int kt__fold_pof2(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

kt_result kt__fold_in(kt__exec *ex, const char *in, char *buf, char *tmp, int *newrank) {
  const kt__op *op = ex->op;
  int p = ex->group->size, r = ex->group->rank;
  int rem = p - kt__fold_pof2(p);
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  if (r >= 2 * rem) {
    *newrank = r - rem;
    return KT_SUCCESS;
  }
  kt__xfer x;
  if (r % 2 == 0) {
    kt__xfer_send(&x, r + 1, in, bytes, 0);
    *newrank = -1;
  } else {
    kt__xfer_recv(&x, r - 1, tmp, bytes, 0);
    *newrank = r / 2;
  }
  KT_CHECK(kt__net_post(ex, &x));
  KT_CHECK(kt__net_wait(ex, &x));
  if (r % 2) kt__reduce_kernel(op->dtype, op->op)(buf, tmp, in, op->count); /* lower rank's data first */
  return KT_SUCCESS;
}

kt_result kt__fold_out(kt__exec *ex, char *buf) {
  const kt__op *op = ex->op;
  int p = ex->group->size, r = ex->group->rank;
  if (r >= 2 * (p - kt__fold_pof2(p))) return KT_SUCCESS;
  kt__xfer x;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  if (r % 2) kt__xfer_send(&x, r - 1, buf, bytes, 1000);
  else kt__xfer_recv(&x, r + 1, buf, bytes, 1000);
  KT_CHECK(kt__net_post(ex, &x));
  return kt__net_wait(ex, &x);
}

kt_result kt__allreduce_recursive_doubling(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype), bytes = op->count * es;
  char *buf = op->recvbuf;
  if (op->sendbuf != buf && bytes) memcpy(buf, op->sendbuf, bytes);
  if (p == 1 || bytes == 0) return KT_SUCCESS;
  char *tmp = kt__scratch(c, bytes);
  if (!tmp) return KT_ERR_NO_MEMORY;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);

  int pof2 = kt__fold_pof2(p), rem = p - pof2;
  int newrank;
  KT_CHECK(kt__fold_in(ex, buf, buf, tmp, &newrank));
  uint32_t tag = 1;
  if (newrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1, tag++) {
      int nr = newrank ^ mask;
      int peer = nr < rem ? nr * 2 + 1 : nr + rem;
      KT_CHECK(kt__net_sendrecv(ex, peer, buf, bytes, peer, tmp, bytes, tag));
      if (peer < r) reduce(buf, tmp, buf, op->count);
      else reduce(buf, buf, tmp, op->count);
    }
    kt__op_finalize(op, buf, op->count, p);
  }
  return kt__fold_out(ex, buf);
}
