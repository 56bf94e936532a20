/* broadcast_binomial.c - binomial-tree broadcast: a rank receives the whole
 * message from its parent, then sends it to its children, farthest subtree
 * first (the children's sends proceed concurrently).
 *
 * Any number of ranks, any root.
 * Cost: ceil(log2 p) (alpha + n beta): for small messages. */
#include "coll.h"

#include <string.h>

kt_result kt__broadcast_binomial(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  char *buf = op->recvbuf;
  /* An out-of-place root sends from sendbuf and copies it to recvbuf while
   * the sockets drain (where the link is the bound, below), not before,
   * when its children would wait on the copy. */
  bool copy = r == root && op->sendbuf != buf && bytes;
  if (p == 1 || bytes == 0) {
    if (copy) memcpy(buf, op->sendbuf, bytes);
    return KT_SUCCESS;
  }
  int vr = kt__mod(r - root, p);
  int mask = 1;
  while (mask < p) {
    if (vr & mask) {
      kt__xfer x;
      kt__xfer_recv(&x, kt__mod(vr - mask + root, p), buf, bytes, 0);
      KT_CHECK(kt__net_post(ex, &x));
      KT_CHECK(kt__net_wait(ex, &x));
      break;
    }
    mask <<= 1;
  }
  kt__xfer xs[32];
  int n = 0;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < p) {
      kt__xfer_send(&xs[n], kt__mod(vr + mask + root, p), copy ? op->sendbuf : buf, bytes, 0);
      KT_CHECK(kt__net_post(ex, &xs[n]));
      n++;
    }
  }
  /* In one go where the links are fast: the CPUs and memory bound the
   * root there, which sends the whole message to each child, and pieces
   * would only leave its sockets idle between them. */
  size_t piece = c->link_bpus >= KT_FAST_LINK_BPUS ? 0 : kt__chunk_bytes(op->dtype);
  if (copy) KT_CHECK(kt__net_copy_while_sending(ex, buf, op->sendbuf, bytes, piece));
  return kt__net_waitall(ex, xs, n);
}
