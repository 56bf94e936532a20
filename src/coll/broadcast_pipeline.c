/* broadcast_pipeline.c - pipelined chain broadcast: ranks form a chain from
 * the root; each forwards every chunk to the next rank as soon as it arrives,
 * so all links carry data at once.
 *
 * Any number of ranks, any root.
 * Cost: (p - 2 + n/chunk) (alpha + chunk beta) ~ n beta for large n: for
 * large messages. */
#include "coll.h"

#include <string.h>

kt_result kt__broadcast_pipeline(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  char *buf = op->recvbuf;
  /* An out-of-place root sends from sendbuf and copies it to recvbuf while
   * the sockets drain, not before, when its peers would wait on the copy.
   * Whatever the link: the chain's next rank, which receives and forwards,
   * is slower than the root, which only sends. */
  bool copy = r == root && op->sendbuf != buf && bytes;
  if (p == 1 || bytes == 0) {
    if (copy) memcpy(buf, op->sendbuf, bytes);
    return KT_SUCCESS;
  }
  int vr = kt__mod(r - root, p);
  size_t chunk = kt__chunk_bytes(op->dtype);
  int next = vr + 1 < p ? kt__mod(r + 1, p) : -1;
  kt__xfer rx, sx;
  if (next >= 0) {
    kt__xfer_send(&sx, next, copy ? op->sendbuf : buf, bytes, 0);
    if (vr > 0) sx.avail = 0;
    KT_CHECK(kt__net_post(ex, &sx));
  }
  if (copy) KT_CHECK(kt__net_copy_while_sending(ex, buf, op->sendbuf, bytes, chunk));
  if (vr > 0) {
    kt__xfer_recv(&rx, kt__mod(r - 1, p), buf, bytes, 0);
    KT_CHECK(kt__net_post(ex, &rx));
    while (!rx.complete) {
      KT_CHECK(kt__net_progress(ex, true));
      if (next >= 0) {
        size_t ready = rx.complete ? bytes : rx.done - rx.done % chunk;
        if (ready > sx.avail) sx.avail = ready;
      }
    }
    if (next >= 0) sx.avail = bytes;
  }
  if (next >= 0) KT_CHECK(kt__net_wait(ex, &sx));
  return KT_SUCCESS;
}
