/* gather_linear.c - linear gather: every rank sends its block to the root,
 * which receives from all of them at once.
 *
 * Any number of ranks, any root. In place on the root when sendbuf ==
 * recvbuf + root * count.
 * Cost: (p-1) alpha + (p-1)/p n beta at the root's link. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__gather_linear(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  if (bytes == 0) return KT_SUCCESS;
  if (r != root) {
    kt__xfer x;
    kt__xfer_send(&x, root, op->sendbuf, bytes, 0);
    KT_CHECK(kt__net_post(ex, &x));
    return kt__net_wait(ex, &x);
  }
  char *rb = op->recvbuf;
  if (op->sendbuf != rb + (size_t)r * bytes) memcpy(rb + (size_t)r * bytes, op->sendbuf, bytes);
  if (p == 1) return KT_SUCCESS;
  kt__xfer *xs = malloc((size_t)p * sizeof *xs); /* freed below */
  if (!xs) return kt__err(KT_ERR_NO_MEMORY, "rank %d: gather: out of memory", r);
  kt_result res = KT_SUCCESS;
  int n = 0;
  for (int i = 0; i < p; i++) {
    if (i == r) continue;
    kt__xfer_recv(&xs[n], i, rb + (size_t)i * bytes, bytes, 0);
    KT_CHECK_GOTO(kt__net_post(ex, &xs[n]), res, exit);
    n++;
  }
  res = kt__net_waitall(ex, xs, n);
exit:
  free(xs);
  return res;
}
