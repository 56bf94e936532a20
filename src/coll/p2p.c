/* p2p.c - send, recv and sendrecv: one message each way, matched in issue
 * order between the two ranks; the header's tag and length must agree. The
 * op is decoded here once for every transport (kt__p2p_run); over TCP a
 * message is one transfer (kt__p2p), over shared memory see p2p_shm.c. */
#include "coll.h"

#include <string.h>

/* sendrecv with itself: a copy. */
static kt_result p2p_self(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t es = kt_dtype_size(op->dtype);
  if (op->count != op->count2)
    return kt__err(KT_ERR_MISMATCH, "rank %d: sendrecv with itself sends %zu but receives %zu elements",
                   ex->group->rank, op->count, op->count2);
  if (op->count && op->recvbuf != op->sendbuf) memmove(op->recvbuf, op->sendbuf, op->count * es);
  return KT_SUCCESS;
}

kt_result kt__p2p_run(kt__exec *ex, kt__p2p_move_fn move) {
  const kt__op *op = ex->op;
  size_t es = kt_dtype_size(op->dtype);
  uint32_t tag = (uint32_t)op->tag;
  switch (op->coll) {
    case KT_COLL_SEND: return move(ex, op->root, op->sendbuf, op->count * es, -1, NULL, 0, tag);
    case KT_COLL_RECV: return move(ex, -1, NULL, 0, op->root, op->recvbuf, op->count * es, tag);
    case KT_COLL_SENDRECV:
      if (op->root == ex->group->rank) return p2p_self(ex);
      return move(ex, op->root, op->sendbuf, op->count * es, op->peer2, op->recvbuf, op->count2 * es, tag);
    default: return kt__err(KT_ERR_INTERNAL, "point to point called for %s", kt__coll_name(op->coll));
  }
}

/* Over TCP: one transfer each way. */
static kt_result net_move(kt__exec *ex, int dst, const void *sbuf, size_t slen, int src, void *rbuf,
                          size_t rlen, uint32_t tag) {
  if (dst >= 0 && src >= 0) return kt__net_sendrecv(ex, dst, sbuf, slen, src, rbuf, rlen, tag);
  kt__xfer x;
  if (dst >= 0) kt__xfer_send(&x, dst, sbuf, slen, tag);
  else kt__xfer_recv(&x, src, rbuf, rlen, tag);
  KT_CHECK(kt__net_post(ex, &x));
  return kt__net_wait(ex, &x);
}

kt_result kt__p2p(kt__exec *ex) { return kt__p2p_run(ex, net_move); }
