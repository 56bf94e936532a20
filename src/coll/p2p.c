/* p2p.c - send, recv and sendrecv: one message each way, matched in issue
 * order between the two ranks; the header's tag and length must agree. */
#include "coll.h"

#include <string.h>

kt_result kt__p2p_self(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t es = kt_dtype_size(op->dtype);
  if (op->count != op->count2)
    return kt__err(KT_ERR_MISMATCH, "rank %d: sendrecv with itself sends %zu but receives %zu elements",
                   ex->comm->rank, op->count, op->count2);
  if (op->count && op->recvbuf != op->sendbuf) memmove(op->recvbuf, op->sendbuf, op->count * es);
  return KT_SUCCESS;
}

kt_result kt__p2p(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t es = kt_dtype_size(op->dtype);
  uint32_t tag = (uint32_t)op->tag;
  switch (op->coll) {
    case KT_COLL_SEND: {
      kt__xfer x;
      kt__xfer_send(&x, op->root, op->sendbuf, op->count * es, tag);
      KT_CHECK(kt__net_post(ex, &x));
      return kt__net_wait(ex, &x);
    }
    case KT_COLL_RECV: {
      kt__xfer x;
      kt__xfer_recv(&x, op->root, op->recvbuf, op->count * es, tag);
      KT_CHECK(kt__net_post(ex, &x));
      return kt__net_wait(ex, &x);
    }
    case KT_COLL_SENDRECV:
      if (op->root == ex->comm->rank) return kt__p2p_self(ex);
      return kt__net_sendrecv(ex, op->root, op->sendbuf, op->count * es, op->peer2, op->recvbuf,
                              op->count2 * es, tag);
    default:
      return kt__err(KT_ERR_INTERNAL, "kt__p2p called for %s", kt__coll_name(op->coll));
  }
}
