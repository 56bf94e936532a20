/* hier.c - what the hierarchical algorithms (*_hierarchical.c) share: running
 * one phase of an op on a child communicator, the shards a message is cut
 * into, where a host's rank sits in this rank's `cross`, and the segments
 * whose inter-host phases run on the cross communicator's thread. */
#include "coll.h"

#include <stdio.h>
#include <stdlib.h>

/* The phase's op carries the parent's operation (AVG included: it only sums,
 * `partial`), so the children's signature checks catch a mismatch in it; its
 * waits also watch the parent's control sockets and exchange the parent op's
 * status notices, which catch a rank that called another collective on the
 * parent (kt__net_stuck). On failure the parent breaks (run_op), which breaks
 * the children with the parent's message; a peer that died is named by its
 * rank in the parent when the parent's own sockets show it. */
kt_result kt__hier_phase(kt__exec *ex, kt__group *child, kt__op *op, const char *what) {
  op->partial = true;
  kt_result r = ex->phases->run(child, op, ex);
  if (r == KT_SUCCESS) return KT_SUCCESS;
  kt_result dead = kt__net_check_peers(ex); /* its error text names the parent's rank */
  if (dead != KT_SUCCESS) return dead;
  kt__error_prefix("%s phase: ", what);
  return r;
}

void kt__hier_shards(size_t n, int S, int L, size_t *counts, size_t *displs) {
  for (int r = 0; r < L; r++) {
    size_t lo = n, hi = n; /* ranks from S on hold nothing */
    if (r < S) kt__hier_piece(n, S, r, &lo, &hi);
    displs[r] = lo;
    counts[r] = hi - lo;
  }
}

void kt__hier_narrow(const size_t *counts, const size_t *displs, int n, int k, int j, size_t *cj, size_t *dj) {
  for (int i = 0; i < n; i++) {
    size_t lo, hi;
    kt__hier_piece(counts[i], k, j, &lo, &hi);
    cj[i] = hi - lo;
    dj[i] = displs[i] + lo;
  }
}

int kt__hier_cross_rank(const kt__group *c, int host) {
  const kt__group *x = c->cross;
  for (int i = 0; i < x->size; i++)
    if (c->hosts->of[x->label[i]] == host) return i;
  return -1; /* not reached: cross has one rank of every host */
}

int kt__hier_segments(const kt__group *c, size_t bytes, size_t most_pieces) {
  size_t seg = (size_t)KT_MAX(kt__param_HIER_SEGMENT_BYTES(), 0);
  if (seg == 0) return 1;
  /* Segments overlap the links' time with the hosts' shared-memory phases,
   * on a thread of their own; where a link moves bytes about as fast as the
   * CPUs copy them (on this VM every "host" shares the same 2 CPUs: the
   * probe reads 36-54 Gbit/s unshaped with 2 ranks per host), nothing is
   * left to overlap and the thread competes with the ranks
   * (docs/algorithms.md, "Segments"). */
  if (!kt__param_set_HIER_SEGMENT_BYTES() && c->link_bpus >= KT_FAST_LINK_BPUS) return 1;
  size_t k = KT_MIN(KT_MIN(bytes / seg, (size_t)KT_HIER_MAX_SEGMENTS), most_pieces);
  return k >= 2 ? (int)k : 1;
}

kt_result kt__xpipe_issue(kt__exec *ex, kt__xpipe *xp, kt__op *op) {
  if (xp->issued == (int)(sizeof xp->req / sizeof xp->req[0])) {
    free(op->counts); /* owned by the op, as kt__issue would */
    free(op->displs);
    return kt__err(KT_ERR_INTERNAL, "too many inter-host phases in flight");
  }
  op->partial = true;
  kt_result r = ex->phases->issue(ex->group->cross, op, &xp->req[xp->issued]);
  if (r == KT_SUCCESS) xp->issued++;
  return r;
}

kt_result kt__xpipe_wait(kt__exec *ex, kt__xpipe *xp, const char *what) {
  if (xp->waited >= xp->issued) return kt__err(KT_ERR_INTERNAL, "no inter-host phase to wait for");
  bool consumed;
  char waiting[160];
  snprintf(waiting, sizeof waiting, "the %s of a segment", what);
  kt_result r = ex->phases->wait_watching(xp->req[xp->waited], ex, waiting, &consumed);
  if (consumed) xp->waited++;
  if (r == KT_SUCCESS) return KT_SUCCESS;
  /* As kt__hier_phase reports a failed phase: a dead peer by its rank in
   * this communicator when its sockets show it. */
  kt_result dead = consumed ? kt__net_check_peers(ex) : KT_SUCCESS;
  if (dead != KT_SUCCESS) return dead;
  if (consumed && r == KT_ERR_TIMEOUT && kt__now_ns() >= ex->deadline_ns) {
    /* The segment started after this op, with the same timeout: this op's
     * deadline has passed too, and its view names the ranks it has not
     * heard from (the segment's names only its own peers, which may wait
     * for a stopped rank of their host). */
    char child[1024];
    kt__error_copy(child, sizeof child);
    return kt__net_timeout(ex, waiting, child);
  }
  kt__error_prefix("%s phase: ", what);
  return r;
}

kt_result kt__xpipe_end(kt__exec *ex, kt__xpipe *xp, kt_result r) {
  if (xp->waited == xp->issued) return r;
  /* Only after a failure: stop the cross communicator (its peers hear why
   * from the parent's abort notice) and wait until none of its ops touches
   * the buffers. */
  char msg[1024];
  kt__error_copy(msg, sizeof msg);
  ex->phases->stop(ex->group->cross, r != KT_SUCCESS ? r : KT_ERR_INTERNAL);
  for (; xp->waited < xp->issued; xp->waited++) (void)ex->phases->wait(xp->req[xp->waited]);
  kt__error_set_text(msg);
  return r != KT_SUCCESS ? r : kt__err(KT_ERR_INTERNAL, "inter-host phases left unwaited");
}
