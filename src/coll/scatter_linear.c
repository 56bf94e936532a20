/* scatter_linear.c - linear scatter: the root sends block i to rank i, to all
 * of them at once.
 *
 * Any number of ranks, any root. In place on the root when recvbuf ==
 * sendbuf + root * count.
 * Cost: (p-1) alpha + (p-1)/p n beta at the root's link. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__scatter_linear(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  if (bytes == 0) return KT_SUCCESS;
  if (r != root) {
    kt__xfer x;
    kt__xfer_recv(&x, root, op->recvbuf, bytes, 0);
    KT_CHECK(kt__net_post(ex, &x));
    return kt__net_wait(ex, &x);
  }
  const char *sb = op->sendbuf;
  if (op->recvbuf != sb + (size_t)r * bytes) memcpy(op->recvbuf, sb + (size_t)r * bytes, bytes);
  if (p == 1) return KT_SUCCESS;
  kt__xfer *xs = malloc((size_t)p * sizeof *xs); /* freed below */
  if (!xs) return kt__err(KT_ERR_NO_MEMORY, "rank %d: scatter: out of memory", r);
  kt_result res = KT_SUCCESS;
  int n = 0;
  for (int i = 0; i < p; i++) {
    if (i == r) continue;
    kt__xfer_send(&xs[n], i, sb + (size_t)i * bytes, bytes, 0);
    KT_CHECK_GOTO(kt__net_post(ex, &xs[n]), res, exit);
    n++;
  }
  res = kt__net_waitall(ex, xs, n);
exit:
  free(xs);
  return res;
}
