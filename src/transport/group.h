/* group.h - the ranks an op runs among and the means to reach them: what the
 * transports and the algorithms read of a communicator, and the context of
 * the op that is running (the transport interface; docs/layers.md).
 *
 * Core's communicator (core/comm.h, struct kt_comm_s) holds its group as its
 * first member `g` and owns everything else (the queue of ops, the progress
 * thread, the error text): transports and algorithms see only the group,
 * and a hierarchical algorithm runs its phases on the groups of the child
 * communicators through what core lends it (kt__exec's `phases`, coll.h). */
#ifndef KT_GROUP_H
#define KT_GROUP_H

#include "common.h"
#include "op.h"

#include <stdatomic.h>

struct kt__tcp;
struct kt__shm;
struct kt__phases;

/* Where the ranks of a communicator with a hierarchy are (comm.c), the same
 * on every rank: hosts numbered in order of their lowest rank. */
typedef struct kt__hosts {
  int n;      /* hosts */
  int *of;    /* rank -> its host */
  int *idx;   /* rank -> its index among its host's ranks (its rank in `local`) */
  int *first; /* n + 1 entries: host h's ranks are rank[first[h] .. first[h + 1]) */
  int *rank;  /* the ranks grouped by host, ascending within each */
} kt__hosts;

typedef struct kt__group {
  int rank, size;
  int64_t timeout_ms;
  char prefix[256]; /* store key namespace of the communicator (names its segment) */

  /* Peers' identities, for messages: host name and pid per rank (filled
   * by the TCP mesh). */
  char (*peer_host)[64];
  int *peer_pid;
  int *label; /* a hierarchy's child: each rank's rank in the parent, for messages */

  struct kt__tcp *tcp; /* TCP transport state */
  struct kt__shm *shm; /* shared memory, when every rank is on this host */
  bool all_local;      /* every rank is on this host */
  /* Ranks on several hosts, at least one of them with two or more (comm.c):
   * the groups of the child communicators the hierarchical algorithms run
   * their phases on, used only by the thread executing this group's op.
   * local: the ranks of this host (shared memory when there are several);
   * cross: the rank with my local index on every host (TCP), for the first
   * `shards` local indices (the fewest ranks any host has), NULL for the
   * others. */
  struct kt__group *local, *cross;
  int shards;
  kt__hosts *hosts; /* every rank's host; set last, when local and cross are
                       complete: the hierarchical algorithms need it */

  /* kt_comm_abort was called (any thread); abort_fd, an eventfd it writes,
   * wakes the transports' polls. */
  atomic_int aborted;
  int abort_fd;

  /* The algorithms' own state (coll), touched only by the executing op
   * unless said otherwise. Scratch memory, grown on demand (scratch.c),
   * freed with the communicator. */
  void *scratch;
  size_t scratch_cap;
  /* Algorithms (tuner.c's table, bit i) that have run an op issued on this
   * communicator, each logged at INFO the first time; kt__algos_run reads
   * it from any thread. */
  _Atomic uint64_t algos_run;
  /* The tuner's small-message pick, worked out at the first op (tuner.c): a
   * collective of at most ll_cut[coll] bytes per rank, with even blocks,
   * runs shm_ll (-1: never without the full model). */
  bool ll_cut_set;
  int64_t ll_cut[KT_COLL_COUNT];
  /* Speed of the links between hosts, bytes per microsecond, for the
   * tuner's TCP model and the hierarchy's segments: rank 0's
   * KAITIAN_LINK_MBITS, else measured when the communicator was created
   * (comm.c, link_probe), and the same on every rank; a split takes its
   * parent's, and a hierarchy's cross child its parent's once known. 0:
   * not known (one host; a hierarchy's local child; KAITIAN_LINK_MBITS=0). */
  double link_bpus;
} kt__group;

/* Links at least this fast (g->link_bpus; 15000 Mbit/s): the CPUs and
 * memory, not the link, bound a transfer (measured on netns hosts; not on
 * NICs that fast), so the hierarchy does not cut its messages into segments
 * there, nor the binomial broadcast its root's copy into pieces
 * (docs/algorithms.md, "Segments" and "A broadcast root's copy"). */
#define KT_FAST_LINK_BPUS 1875.0

/* Rank r as messages name it: a hierarchy child names the parent's rank. */
static inline int kt__rank_label(const kt__group *g, int r) {
  return g->label && r >= 0 && r < g->size ? g->label[r] : r;
}

/* Describe peer r for messages: "rank 3 (host pid 1234)" (names.c formats
 * it from the group's tables). */
static inline const char *kt__peer_desc(const kt__group *g, int r, char *buf, size_t cap) {
  bool known = r >= 0 && r < g->size && g->peer_host && g->peer_pid[r] > 0;
  return kt__peer_describe(kt__rank_label(g, r), known ? g->peer_host[r] : NULL, known ? g->peer_pid[r] : 0,
                           buf, cap);
}

/* Execution context of the op that is running (made by core, execute.c). */
typedef struct kt__exec {
  kt__group *group;
  const kt__op *op;
  int64_t start_ns; /* when it began (kt__now_coarse_ns) */
  int64_t deadline_ns;
  /* A phase of a parent communicator's op (the hierarchy): the parent's
   * context, whose sockets the phase's waits also watch (kt__net_stuck). */
  struct kt__exec *parent;
  /* What core lends the hierarchical algorithms to run their phases
   * (coll.h); NULL outside an executed op. */
  const struct kt__phases *phases;
} kt__exec;

#endif /* KT_GROUP_H */
