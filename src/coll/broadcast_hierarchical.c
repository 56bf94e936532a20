/* broadcast_hierarchical.c - broadcast of a communicator that spans hosts:
 * the root broadcasts to the ranks of its own host through shared memory;
 * then the message, cut into S shards (S the fewest ranks any host has),
 * crosses to the other hosts over TCP, shard k broadcast by the root host's
 * local rank k to local rank k of every host (all S at once, one `cross`
 * communicator each); last, the ranks of every other host allgather the
 * shards through shared memory.
 *
 * Any root (also one of a host's ranks from S on, which holds no shard), any
 * count (shards differ by at most one element; some are empty when count <
 * S), hosts of any sizes; a rank alone on its host skips the shared-memory
 * phases.
 * Cost, H hosts, n bytes: about n bytes of shared-memory copies per rank (2n
 * on the root's host), and S concurrent broadcasts of n/S among H ranks over
 * TCP (the cross communicator's tuner picks binomial or pipeline), so every
 * host's link carries about n, against a flat broadcast's TCP steps between
 * ranks of one host too.
 * From 2 x KAITIAN_HIER_SEGMENT_BYTES, in segments whose inter-host phases run
 * on the cross communicator's thread (segmented(); hier.c). */
#include "coll.h"

#include <string.h>

/* In K segments (each at least S elements): the root's host broadcasts
 * segment j inside the host and issues its inter-host broadcast to the cross
 * thread, then goes on with segment j + 1; the other hosts issue every
 * segment's inter-host broadcast at once and allgather segment j inside the
 * host while j + 1 crosses. */
static kt_result segmented(kt__exec *ex, int K) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  const kt__hosts *hs = c->hosts;
  int L = local->size, me = local->rank, S = c->shards;
  int root_host = hs->of[op->root];
  bool on_root_host = hs->of[c->rank] == root_host, alone_root = c->rank == op->root && L == 1;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  char *out = op->recvbuf;
  size_t *counts = kt__scratch(c, 2 * (size_t)L * sizeof *counts);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "broadcast: out of memory");
  size_t *displs = counts + L;
  kt__xpipe xp = {0};
  kt_result r = KT_SUCCESS;
  for (int j = 0; j < K && r == KT_SUCCESS; j++) {
    size_t lo, hi;
    kt__hier_piece(n, K, j, &lo, &hi);
    if (on_root_host && L > 1) {
      kt__op bc = {.coll = KT_COLL_BROADCAST,
                   .sendbuf = c->rank == op->root ? (const char *)op->sendbuf + lo * es : out + lo * es,
                   .recvbuf = out + lo * es, .count = hi - lo, .dtype = op->dtype, .root = hs->idx[op->root]};
      r = kt__hier_phase(ex, local, &bc, "intra-host broadcast");
      if (r != KT_SUCCESS) break;
    }
    if (cross) {
      kt__hier_shards(hi - lo, S, L, counts, displs);
      size_t at = (lo + displs[me]) * es;
      kt__op bc = {.coll = KT_COLL_BROADCAST, .sendbuf = alone_root ? (const char *)op->sendbuf + at : out + at,
                   .recvbuf = out + at, .count = counts[me], .dtype = op->dtype,
                   .root = kt__hier_cross_rank(c, root_host)};
      r = kt__xpipe_issue(ex, &xp, &bc);
    }
  }
  for (int j = 0; j < K && r == KT_SUCCESS; j++) {
    if (cross) r = kt__xpipe_wait(ex, &xp, "inter-host broadcast");
    if (r != KT_SUCCESS || on_root_host || L == 1) continue;
    size_t lo, hi;
    kt__hier_piece(n, K, j, &lo, &hi);
    kt__hier_shards(hi - lo, S, L, counts, displs);
    kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = out + (lo + displs[me]) * es, .recvbuf = out + lo * es,
                 .count = counts[me], .dtype = op->dtype, .counts = counts, .displs = displs};
    r = kt__hier_phase(ex, local, &ag, "intra-host allgather");
  }
  return kt__xpipe_end(ex, &xp, r);
}

kt_result kt__broadcast_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  const kt__hosts *hs = c->hosts;
  int L = local->size, me = local->rank, S = c->shards;
  int root_host = hs->of[op->root];
  bool on_root_host = hs->of[c->rank] == root_host;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  char *out = op->recvbuf;
  int K = kt__hier_segments(c, n * es, n / (size_t)S);
  if (K > 1) return segmented(ex, K);

  if (on_root_host) {
    if (L > 1) {
      kt__op bc = {.coll = KT_COLL_BROADCAST, .sendbuf = c->rank == op->root ? op->sendbuf : out, .recvbuf = out,
                   .count = n, .dtype = op->dtype, .root = hs->idx[op->root]};
      KT_CHECK(kt__hier_phase(ex, local, &bc, "intra-host broadcast"));
    }
  }
  /* The parent's scratch: its own algorithms never run during the phases. */
  size_t *counts = kt__scratch(c, 2 * (size_t)L * sizeof *counts);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "broadcast: out of memory");
  size_t *displs = counts + L;
  kt__hier_shards(n, S, L, counts, displs);
  char *shard = n ? out + displs[me] * es : out; /* out may be NULL when n is 0 */
  if (cross) {
    /* The root alone on its host (one shard: S is 1) sends from sendbuf; the
     * TCP algorithms copy it to recvbuf while they send, or (the binomial
     * tree on a fast link) first. */
    bool alone_root = c->rank == op->root && L == 1;
    kt__op bc = {.coll = KT_COLL_BROADCAST, .sendbuf = alone_root ? op->sendbuf : shard, .recvbuf = shard,
                 .count = counts[me], .dtype = op->dtype, .root = kt__hier_cross_rank(c, root_host)};
    KT_CHECK(kt__hier_phase(ex, cross, &bc, "inter-host broadcast"));
  }
  if (on_root_host || L == 1) return KT_SUCCESS;
  kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = shard, .recvbuf = out, .count = counts[me],
               .dtype = op->dtype, .counts = counts, .displs = displs};
  return kt__hier_phase(ex, local, &ag, "intra-host allgather");
}
