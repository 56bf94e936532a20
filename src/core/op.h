/* op.h - an operation as issued (kt__op), its kind (kt__coll) and name, and
 * the signature every rank compares (kt__sig): plain data of the base layer
 * (docs/layers.md), used by every layer above it; names.c. */
#ifndef KT_OP_H
#define KT_OP_H

#include "common.h"

/* Collective kinds; X(name, printable). */
#define KT_COLL_LIST(X)                 \
  X(ALLREDUCE, "allreduce")             \
  X(BROADCAST, "broadcast")             \
  X(REDUCE, "reduce")                   \
  X(ALLGATHER, "allgather")             \
  X(ALLGATHERV, "allgatherv")           \
  X(REDUCE_SCATTER, "reduce_scatter")   \
  X(GATHER, "gather")                   \
  X(SCATTER, "scatter")                 \
  X(ALLTOALL, "alltoall")               \
  X(ALLTOALLV, "alltoallv")             \
  X(BARRIER, "barrier")                 \
  X(SEND, "send")                       \
  X(RECV, "recv")                       \
  X(SENDRECV, "sendrecv")               \
  X(SPLIT, "split")

typedef enum kt__coll {
#define KT_X(name, str) KT_COLL_##name,
  KT_COLL_LIST(KT_X)
#undef KT_X
  KT_COLL_COUNT
} kt__coll;

KT_INTERNAL const char *kt__coll_name(kt__coll c);

/* One operation as issued: everything the algorithms need. Count arrays are
 * owned copies (freed with the op). */
typedef struct kt__op {
  kt__coll coll;
  const void *sendbuf;
  void *recvbuf;
  size_t count;     /* per-coll meaning, as in kaitian.h; sendrecv: send count */
  size_t count2;    /* sendrecv: receive count */
  kt_dtype dtype;
  kt_op op;
  int root;         /* rooted ops; send/recv: peer; sendrecv: destination */
  int peer2;        /* sendrecv: source */
  int tag;          /* send/recv */
  size_t *counts;   /* allgatherv recvcounts / alltoallv sendcounts */
  size_t *displs;   /* allgatherv displs / alltoallv sdispls */
  size_t *counts2;  /* alltoallv recvcounts */
  size_t *displs2;  /* alltoallv rdispls */
  uint64_t seq;     /* position in the communicator's issue order, from 1 */
  bool partial;     /* a phase of a parent communicator's op: AVG only sums (the
                       parent divides), but the signature still says AVG */
} kt__op;

/* What every rank must agree on for a collective: compared across ranks (shm
 * slots, TCP status notices) to catch ranks that called different ones. */
typedef struct kt__sig {
  uint64_t seq;
  uint64_t count;   /* allgatherv: the total (ranks' own counts differ) */
  uint16_t coll;
  uint8_t dtype, op;
  int32_t root;
} kt__sig;

/* op's signature in a communicator of nranks. Fields an op does not use
 * were set the same way on every rank by the API layer. */
KT_INTERNAL void kt__op_sig(const kt__op *op, int nranks, kt__sig *g);
/* Inline: the small-message ops compare one or two per call. */
static inline bool kt__sig_equal(const kt__sig *a, const kt__sig *b) {
  return a->seq == b->seq && a->coll == b->coll && a->count == b->count && a->dtype == b->dtype &&
         a->op == b->op && a->root == b->root;
}
/* "op #N name, count C, dtype, op, root R" */
KT_INTERNAL void kt__sig_describe(const kt__sig *g, char *buf, size_t cap);

/* "rank R (host pid P)", or "rank R" without a host: a peer as messages
 * name it (R as the user knows it: kt__rank_label). Returns buf. */
KT_INTERNAL const char *kt__peer_describe(int shown, const char *host, int pid, char *buf, size_t cap);

#endif
