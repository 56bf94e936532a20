/* barrier_hierarchical.c - barrier of a communicator that spans hosts: a
 * barrier among the ranks of each host (shared memory), one among local rank
 * 0 of every host (TCP), and another on each host. No rank leaves before its
 * host's local rank 0 has left the TCP barrier, which no rank 0 does before
 * every host's ranks have all arrived.
 *
 * Hosts of any sizes; a rank alone on its host runs only the TCP barrier.
 * Cost: two shared-memory barriers (a post and a wait each) and a
 * dissemination barrier among H ranks, ceil(log2 H) alpha, against
 * ceil(log2 p) alpha over TCP for a flat one. */
#include "coll.h"

kt_result kt__barrier_hierarchical(kt__exec *ex) {
  kt__group *c = ex->group, *local = c->local;
  kt__op b = {.coll = KT_COLL_BARRIER, .dtype = KT_UINT8};
  if (local->size > 1) KT_CHECK(kt__hier_phase(ex, local, &b, "intra-host barrier (arrival)"));
  if (local->rank == 0) {
    b = (kt__op){.coll = KT_COLL_BARRIER, .dtype = KT_UINT8};
    KT_CHECK(kt__hier_phase(ex, c->cross, &b, "inter-host barrier"));
  }
  if (local->size == 1) return KT_SUCCESS;
  b = (kt__op){.coll = KT_COLL_BARRIER, .dtype = KT_UINT8};
  return kt__hier_phase(ex, local, &b, "intra-host barrier (departure)");
}
