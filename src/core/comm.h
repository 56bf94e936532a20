/* comm.h - the communicator and requests (internal). The operation
 * descriptors and their names are in op.h, the base. */
#ifndef KT_COMM_H
#define KT_COMM_H

#include "common.h"
#include "op.h"

#include <pthread.h>
#include <stdatomic.h>

struct kt__tcp;
struct kt__shm;

/* Where the ranks of a communicator with a hierarchy are (comm.c), the same
 * on every rank: hosts numbered in order of their lowest rank. */
typedef struct kt__hosts {
  int n;      /* hosts */
  int *of;    /* rank -> its host */
  int *idx;   /* rank -> its index among its host's ranks (its rank in `local`) */
  int *first; /* n + 1 entries: host h's ranks are rank[first[h] .. first[h + 1]) */
  int *rank;  /* the ranks grouped by host, ascending within each */
} kt__hosts;

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
  int rank, size;
  int64_t timeout_ms;
  char prefix[256];             /* store key namespace of this communicator */
  uint64_t split_seq;           /* splits issued, names child namespaces */

  /* Peers' identities, for messages: host name and pid per rank. */
  char (*peer_host)[64];
  int *peer_pid;

  struct kt__tcp *tcp;          /* TCP transport state */
  struct kt__shm *shm;          /* shared memory, when every rank is on this host */
  bool all_local;               /* every rank is on this host */
  /* Ranks on several hosts, at least one of them with two or more (comm.c):
   * children for the hierarchical algorithms, used only by the thread
   * executing this communicator's op. local: the ranks of this host (shared
   * memory when there are several); cross: the rank with my local index on
   * every host (TCP), for the first `shards` local indices (the fewest ranks
   * any host has), NULL for the others. */
  struct kt_comm_s *local, *cross;
  int shards;
  kt__hosts *hosts;             /* every rank's host; set last, when local and cross are
                                   complete: the hierarchical algorithms need it */
  int *label;                   /* children: each rank's rank in the parent, for messages */

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
  atomic_int aborted;
  int abort_fd;                 /* eventfd written by kt_comm_abort to wake polls */

  /* Scratch memory for algorithms, grown on demand, freed at destroy. Only
   * the executing op uses it. */
  void *scratch;
  size_t scratch_cap;
  /* Algorithms (tuner.c's table, bit i) that have run an op issued on this
   * communicator, each logged at INFO the first time; kt__algos_run reads
   * it from any thread. Only the executing op writes it. */
  _Atomic uint64_t algos_run;
  /* The tuner's small-message pick, worked out at this communicator's first
   * op (tuner.c): a collective of at most ll_cut[coll] bytes per rank, with
   * even blocks, runs shm_ll (-1: never without the full model). Only the
   * executing op touches it. */
  bool ll_cut_set;
  int64_t ll_cut[KT_COLL_COUNT];
  /* Speed of the links between hosts, bytes per microsecond, for the
   * tuner's TCP model and the hierarchy's segments: rank 0's
   * KAITIAN_LINK_MBITS, else measured when the communicator was created
   * (comm.c, link_probe), and the same on every rank; a split takes its
   * parent's, and a hierarchy's cross child its parent's once known. 0:
   * not known (one host; a hierarchy's local child; KAITIAN_LINK_MBITS=0). */
  double link_bpus;
};

/* Links at least this fast (c->link_bpus; 15000 Mbit/s): the CPUs and
 * memory, not the link, bound a transfer (measured on netns hosts; not on
 * NICs that fast), so the hierarchy does not cut its messages into segments
 * there, nor the binomial broadcast its root's copy into pieces
 * (docs/algorithms.md, "Segments" and "A broadcast root's copy"). */
#define KT_FAST_LINK_BPUS 1875.0

/* Rank r as messages name it: a hierarchy child names the parent's rank. */
static inline int kt__rank_label(const struct kt_comm_s *c, int r) {
  return c->label && r >= 0 && r < c->size ? c->label[r] : r;
}

/* Execution context of the op that is running. */
typedef struct kt__exec {
  struct kt_comm_s *comm;
  const kt__op *op;
  int64_t start_ns;    /* when it began (kt__now_coarse_ns) */
  int64_t deadline_ns;
  /* A phase of a parent communicator's op (the hierarchy): the parent's
   * context, whose sockets the phase's waits also watch (kt__net_stuck). */
  struct kt__exec *parent;
  /* What core lends the hierarchical algorithms to run their phases
   * (execute.c); NULL outside an executed op. */
  const struct kt__phases *phases;
} kt__exec;

/* How a hierarchical algorithm (coll) runs the phases of its op on child
 * communicators without calling up into core: run one now on this thread
 * (a phase, with the parent's deadline), or issue one to a child's progress
 * thread, wait for it (watching the parent's peers: kt__wait_watching) or
 * for its end after stopping the child (a failure). */
typedef struct kt__phases {
  kt_result (*run)(struct kt_comm_s *child, const kt__op *op, kt__exec *parent);
  kt_result (*issue)(struct kt_comm_s *c, kt__op *op, kt_request *req_out);
  kt_result (*wait_watching)(kt_request req, kt__exec *ex, const char *what, bool *consumed);
  kt_result (*wait)(kt_request req);
  void (*stop)(struct kt_comm_s *c, kt_result r);
} kt__phases;

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

/* Describe peer r for messages: "rank 3 (host pid 1234)" (names.c formats
 * it from the communicator's tables). */
static inline const char *kt__peer_desc(const struct kt_comm_s *c, int r, char *buf, size_t cap) {
  bool known = r >= 0 && r < c->size && c->peer_host && c->peer_pid[r] > 0;
  return kt__peer_describe(kt__rank_label(c, r), known ? c->peer_host[r] : NULL, known ? c->peer_pid[r] : 0,
                           buf, cap);
}

#endif /* KT_COMM_H */
