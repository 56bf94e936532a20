/* allreduce_hierarchical.c - allreduce of a communicator that spans hosts:
 * reduce-scatter among the ranks of each host through shared memory, then
 * every local rank allreduces its shard with the ranks holding the same shard
 * on the other hosts over TCP (all L shards at once, one TCP communicator per
 * local index), then allgather among the ranks of each host through shared
 * memory.
 *
 * Hosts may hold different numbers of ranks (the communicator's `local` and
 * `cross` children, built at init; see comm.c): the message is cut into S
 * shards, S the fewest ranks any host has, and only local ranks 0..S-1 take
 * part in the inter-host phase (a host's other ranks hold no shard). A rank
 * alone on its host skips the two intra-host phases. Any count: shards
 * differ by at most one element. AVG sums in every phase (the phases are
 * `partial`) and each rank divides its shard once, by the communicator's size.
 * Cost, H hosts of L ranks: intra-host (4 + 1/L) n bytes of memory traffic per rank, and
 * the inter-host allreduce of n/L bytes among H ranks (ring: 2 (H-1)/H n/L
 * bytes sent per rank), so each host's links carry 2 (H-1)/H n in total,
 * spread over L sockets - the same bytes as a flat ring, in fewer, larger
 * messages and with no TCP between ranks of one host.
 *
 * Pipelined: a message of at least 2 x KAITIAN_HIER_SEGMENT_BYTES is cut into
 * K segments (each rank's shard into K pieces). The inter-host allreduce of
 * a segment is issued to the cross communicator's progress thread, and the
 * caller goes on with the intra-host reduce-scatter of the next segment and
 * the allgather of the one before: every local rank runs RS 0, RS 1, AG 0,
 * RS 2, AG 1, ..., AG K-1, and the link stays busy while the shared-memory
 * phases run. While it waits for a segment the caller watches the parent's
 * peers (kt__wait_watching), as a phase's waits do; on any failure it stops
 * the cross communicator and waits for what it issued before returning. */
#include "coll.h"

#include <string.h>

/* The local phase (RS or AG) of segment j: piece j of every rank's shard. */
static kt_result local_phase(kt__exec *ex, bool rs, int K, int j, const size_t *counts, const size_t *displs,
                             size_t *cj, size_t *dj) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local;
  int L = local->size, me = local->rank;
  size_t es = kt_dtype_size(op->dtype), total = 0;
  kt__hier_narrow(counts, displs, L, K, j, cj, dj);
  for (int r = 0; r < L; r++) total += cj[r];
  char *mine = (char *)op->recvbuf + dj[me] * es;
  kt__op ph = {.dtype = op->dtype, .counts = cj, .displs = dj};
  if (rs) {
    ph.coll = KT_COLL_REDUCE_SCATTER;
    ph.sendbuf = op->sendbuf;
    ph.recvbuf = mine;
    ph.count = total;
    ph.op = op->op;
    return kt__hier_phase(ex, local, &ph, "intra-host reduce-scatter");
  }
  ph.coll = KT_COLL_ALLGATHERV;
  ph.sendbuf = mine;
  ph.recvbuf = op->recvbuf;
  ph.count = cj[me];
  return kt__hier_phase(ex, local, &ph, "intra-host allgather");
}

static kt_result segmented(kt__exec *ex, int K) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  int L = local->size, me = local->rank, S = c->shards;
  size_t es = kt_dtype_size(op->dtype);
  size_t *counts = kt__scratch(c, 4 * (size_t)L * sizeof *counts);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "allreduce: out of memory");
  size_t *displs = counts + L, *cj = displs + L, *dj = cj + L;
  kt__hier_shards(op->count, S, L, counts, displs);
  char *shard = (char *)op->recvbuf + displs[me] * es;
  kt__xpipe xp = {0};
  kt_result r = KT_SUCCESS;
  for (int j = 0; j <= K && r == KT_SUCCESS; j++) {
    if (j < K) {
      r = local_phase(ex, true, K, j, counts, displs, cj, dj);
      if (r != KT_SUCCESS) break;
      if (cross) {
        size_t lo, hi;
        kt__hier_piece(counts[me], K, j, &lo, &hi);
        kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = shard + lo * es, .recvbuf = shard + lo * es,
                     .count = hi - lo, .dtype = op->dtype, .op = op->op};
        r = kt__xpipe_issue(ex, &xp, &ar);
        if (r != KT_SUCCESS) break;
      }
    }
    if (j == 0) continue;
    if (cross) {
      r = kt__xpipe_wait(ex, &xp, "inter-host allreduce");
      if (r != KT_SUCCESS) break;
      size_t lo, hi;
      kt__hier_piece(counts[me], K, j - 1, &lo, &hi);
      kt__reduce_finalize(shard + lo * es, hi - lo, op->dtype, op->op, c->size);
    }
    r = local_phase(ex, false, K, j - 1, counts, displs, cj, dj);
  }
  return kt__xpipe_end(ex, &xp, r);
}

kt_result kt__allreduce_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  int L = local->size, me = local->rank, S = c->shards;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  char *out = op->recvbuf;
  /* Segments: the same count on every rank (S is the same everywhere), and
   * every piece of every shard has an element. */
  int K = kt__hier_segments(c, n * es, n / (size_t)S);
  if (L == 1) { /* alone on this host: only the inter-host phase (S is 1) */
    /* Out of place as given: the TCP algorithms read sendbuf while they
     * send, where a copy first would leave the link idle for its length.
     * With segments, one after the other: nothing here to overlap. */
    for (int j = 0; j < K; j++) {
      size_t lo, hi;
      kt__hier_piece(n, K, j, &lo, &hi);
      kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = (const char *)op->sendbuf + lo * es,
                   .recvbuf = out + lo * es, .count = hi - lo, .dtype = op->dtype, .op = op->op};
      KT_CHECK(kt__hier_phase(ex, cross, &ar, "inter-host allreduce"));
      kt__reduce_finalize(out + lo * es, hi - lo, op->dtype, op->op, c->size);
    }
    return KT_SUCCESS;
  }
  if (K >= 2) return segmented(ex, K);
  /* The parent's scratch: its own algorithms never run during the phases. */
  size_t *counts = kt__scratch(c, 2 * (size_t)L * sizeof *counts);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "allreduce: out of memory");
  size_t *displs = counts + L;
  kt__hier_shards(n, S, L, counts, displs); /* local ranks from S on hold none */
  char *shard = out + displs[me] * es;

  kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = op->sendbuf, .recvbuf = shard, .count = n,
               .dtype = op->dtype, .op = op->op, .counts = counts, .displs = displs};
  KT_CHECK(kt__hier_phase(ex, local, &rs, "intra-host reduce-scatter"));
  if (cross) {
    kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = shard, .recvbuf = shard, .count = counts[me],
                 .dtype = op->dtype, .op = op->op};
    KT_CHECK(kt__hier_phase(ex, cross, &ar, "inter-host allreduce"));
    kt__reduce_finalize(shard, counts[me], op->dtype, op->op, c->size);
  }
  kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = shard, .recvbuf = out, .count = counts[me],
               .dtype = op->dtype, .counts = counts, .displs = displs};
  return kt__hier_phase(ex, local, &ag, "intra-host allgather");
}
