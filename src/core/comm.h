/* comm.h - the communicator and requests (internal). The operation
 * descriptors and their names are in op.h, the base. */
#ifndef KT_COMM_H
#define KT_COMM_H

#include "common.h"
#include "op.h"
#include "transport/group.h"
#include "transport/tcp.h"

#include <pthread.h>
#include <stdatomic.h>

/* A non-blocking operation in flight. */
struct kt_request_s {
  kt__op op;
  struct kt_comm_s *comm;
  struct kt_request_s *next;    /* progress queue link */
  atomic_int done;
  struct kt_cq_s *cq;           /* notified on completion (guarded by comm->mu) */
  uint64_t cq_tag;
  kt_result result;
  char errmsg[1024];
};

struct kt_comm_s {
  /* Rank, size, peers, transports, hierarchy and the algorithms' state:
   * what the layers below read (transport/group.h). Its first member. */
  kt__group g;
  uint64_t split_seq;           /* splits issued, names child namespaces */

  /* Ordering: operations execute one at a time in issue order. */
  pthread_mutex_t mu;
  pthread_cond_t cv;            /* queue non-empty / request done / idle */
  struct kt_request_s *qhead, *qtail;
  bool busy;                    /* an op is executing (inline or on the thread) */
  int cv_waiters;               /* threads in pthread_cond_wait on cv */
  bool thread_started, stopping;
  pthread_t thread;
  uint64_t issued;              /* collectives issued: the last op->seq */
  /* The owner's path (progress.c): blocking calls of the one thread that
   * has issued on this communicator run without mu. fast_ok: 1 while that
   * holds (0 for good once another thread, a non-blocking call or destroy
   * comes); fast_state: the owner's FAST_* (progress.c): outside, entering,
   * running an op, leaving;
   * fast_proxy (mu): busy was set on behalf of the owner's running op. */
  atomic_int fast_ok, fast_state;
  bool fast_owner_set, fast_proxy;
  pthread_t fast_owner;

  /* Error state: once broken, every op fails with this. */
  atomic_int broken;            /* kt_result, 0 while healthy */
  char broken_msg[1024];        /* guarded by mu */
};

/* The communicator whose group g is (g is its first member). */
static inline struct kt_comm_s *kt__comm_of(kt__group *g) {
  return (struct kt_comm_s *)(void *)((char *)g - offsetof(struct kt_comm_s, g));
}

/* What each rank contributes to kt_comm_split's exchange over the parent
 * (an allgather: rank i's record at i): its color, key and rank, and where
 * it listens for the new communicator's mesh (unset without a color). */
typedef struct kt__split_rec {
  int32_t color, key, rank, pad;
  kt__tcp_addr addr;
} kt__split_rec;

/* Of the size records of a split's exchange, those of color, in the new
 * communicator's order (key, then rank in the parent), moved to the front of
 * recs: *n_out of them, this rank (me) at *newrank_out. A record not at its
 * own rank's place or with a color no rank can pass is KT_ERR_MISMATCH
 * naming the rank whose record it is. */
KT_INTERNAL kt_result kt__split_members(kt__split_rec *recs, int size, int me, int color, int *n_out,
                                        int *newrank_out);

/* Mark the communicator broken with r and this thread's error text (first
 * error wins); tells peers (best effort) so they fail fast too. */
KT_INTERNAL void kt__comm_fail(struct kt_comm_s *c, kt_result r);

/* Leave the owner's path (progress.c) unclaimed again, as at creation: for
 * ops run while the communicator is being set up, before any caller has it
 * (no other thread may use c meanwhile). */
KT_INTERNAL void kt__fast_reset(struct kt_comm_s *c);
/* Hand op to the communicator's ordered execution (src/core/progress.c).
 * req_out NULL: blocking. Takes ownership of op's count arrays. */
KT_INTERNAL kt_result kt__issue(struct kt_comm_s *c, kt__op *op, kt_request *req_out);
KT_INTERNAL kt_result kt__run(struct kt_comm_s *c, kt__coll coll, const void *sendbuf, void *recvbuf, size_t count,
                              kt_dtype dtype, int peer);
/* kt_wait without its check of the argument (req is the library's own). */
KT_INTERNAL kt_result kt__wait_request(kt_request req);

/* Wait for req, an op of child communicator req->comm running on its
 * progress thread, while watching the peers of the parent op ex (dead or
 * failed peers, status notices: kt__net_check_peers, kt__net_stuck) and its
 * deadline (a timeout says it waited for what).
 * *consumed: req completed and was freed (its result returned, as kt_wait);
 * else the watch failed while req is still pending: the caller stops the
 * child (kt__comm_stop) and then kt_waits it. */
KT_INTERNAL kt_result kt__wait_watching(kt_request req, kt__exec *ex, const char *what, bool *consumed);
/* Break c with r and this thread's error text (first failure wins) and wake
 * an op running on c's progress thread (it fails with KT_ERR_ABORTED). No
 * message to c's peers from this thread: they hear from the parent's. */
KT_INTERNAL void kt__comm_stop(struct kt_comm_s *c, kt_result r);

/* Post a completion tag (src/core/cq.c). */
KT_INTERNAL void kt__cq_push(struct kt_cq_s *cq, uint64_t tag);

/* Execute one op now on the calling thread (execute.c: the algorithm
 * coll's tuner picks, in the op's context). A phase of a hierarchical op
 * runs through its parent's kt__exec: ex->phases->run. */
KT_INTERNAL kt_result kt__execute(struct kt_comm_s *c, const kt__op *op);

#endif /* KT_COMM_H */
