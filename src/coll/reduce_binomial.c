/* reduce_binomial.c - binomial-tree reduce: each rank receives the partial
 * results of its children, reduces them into its own, and sends the sum to
 * its parent; the root ends with the total.
 *
 * Any number of ranks, any root. Non-root ranks never write recvbuf.
 * Cost: ceil(log2 p) (alpha + n beta + n gamma): for small messages. */
#include "coll.h"

#include "reduce/reduce.h"

#include <string.h>

kt_result kt__reduce_binomial(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  if (bytes == 0) return KT_SUCCESS;
  int vr = kt__mod(r - root, p);
  bool has_child = vr + 1 < p && (vr == 0 || (vr & 1) == 0);
  /* acc: root works in recvbuf; an inner rank in scratch; a leaf sends its
   * input as is. tmp receives a child's partial result. */
  char *scr = kt__scratch(c, 2 * bytes);
  if (!scr) return KT_ERR_NO_MEMORY;
  char *tmp = scr + bytes;
  const char *acc_in = op->sendbuf;
  char *acc = NULL;
  if (r == root) acc = op->recvbuf;
  else if (has_child) acc = scr;
  if (acc && acc != acc_in) memcpy(acc, acc_in, bytes);
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  for (int mask = 1; mask < p; mask <<= 1) {
    if (vr & mask) {
      kt__xfer x;
      kt__xfer_send(&x, kt__mod(vr - mask + root, p), acc ? acc : acc_in, bytes, (uint32_t)mask);
      KT_CHECK(kt__net_post(ex, &x));
      return kt__net_wait(ex, &x);
    }
    if (vr + mask < p) {
      kt__xfer x;
      kt__xfer_recv(&x, kt__mod(vr + mask + root, p), tmp, bytes, (uint32_t)mask);
      KT_CHECK(kt__net_post(ex, &x));
      KT_CHECK(kt__net_wait(ex, &x));
      reduce(acc, acc, tmp, op->count);
    }
  }
  kt__op_finalize(op, acc, op->count, p); /* root only gets here */
  return KT_SUCCESS;
}
