/* p2p_shm.c - send, recv and sendrecv between ranks of one host: each message
 * (a header with tag and length, then the payload) streams through the ring
 * of its ordered pair in the communicator's segment (shm.c), the sender
 * filling while the receiver drains; sendrecv moves both directions at once.
 * Matched in issue order per pair, as over TCP. One copy in, one copy out. */
#include "coll.h"

#include "transport/shm.h"

kt_result kt__p2p_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t es = kt_dtype_size(op->dtype);
  uint32_t tag = (uint32_t)op->tag;
  switch (op->coll) {
    case KT_COLL_SEND:
      return kt__shm_p2p(ex, op->root, op->sendbuf, op->count * es, -1, NULL, 0, tag);
    case KT_COLL_RECV:
      return kt__shm_p2p(ex, -1, NULL, 0, op->root, op->recvbuf, op->count * es, tag);
    case KT_COLL_SENDRECV:
      if (op->root == ex->comm->rank) return kt__p2p_self(ex);
      return kt__shm_p2p(ex, op->root, op->sendbuf, op->count * es, op->peer2, op->recvbuf, op->count2 * es,
                         tag);
    default:
      return kt__err(KT_ERR_INTERNAL, "kt__p2p_shm called for %s", kt__coll_name(op->coll));
  }
}
