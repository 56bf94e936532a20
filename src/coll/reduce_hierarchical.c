/* reduce_hierarchical.c - reduce of a communicator that spans hosts: the
 * ranks of every host reduce-scatter the message through shared memory into
 * S shards (S the fewest ranks any host has); each shard is reduced over TCP
 * to the root's host, shard k by local rank k of every host to local rank k
 * of the root's host (all S at once, one `cross` communicator each); there
 * the root gathers the shards through shared memory.
 *
 * Any root (also one of a host's ranks from S on, which holds no shard), any
 * count (shards differ by at most one element), hosts of any sizes; a rank
 * alone on its host skips the shared-memory phases. Non-root ranks never
 * write recvbuf (a shard lives in scratch). AVG sums in every phase (they are
 * `partial`) and the root's host divides each shard once, by the
 * communicator's size.
 * Cost, H hosts, n bytes: an intra-host reduce-scatter (shared memory), S
 * concurrent reduces of n/S among H ranks over TCP (binomial: ceil(log2 H)
 * steps of n/S each), and a gather of n on the root's host. */
#include "coll.h"

#include <string.h>

kt_result kt__reduce_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  const kt__hosts *hs = c->hosts;
  int L = local->size, me = local->rank, S = c->shards;
  int root_host = hs->of[op->root];
  bool on_root_host = hs->of[c->rank] == root_host, is_root = c->rank == op->root;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  if (L == 1) { /* alone on this host: only the inter-host phase, on the whole message (S is 1) */
    kt__op rd = {.coll = KT_COLL_REDUCE, .sendbuf = op->sendbuf, .recvbuf = is_root ? op->recvbuf : NULL,
                 .count = n, .dtype = op->dtype, .op = op->op, .root = kt__hier_cross_rank(c, root_host)};
    KT_CHECK(kt__hier_phase(ex, cross, &rd, "inter-host reduce"));
    if (is_root) kt__op_finalize(op, op->recvbuf, n, c->size);
    return KT_SUCCESS;
  }
  /* The parent's scratch (its own algorithms never run during the phases):
   * the shards' layout, then this rank's shard unless it is the root's, which
   * lands where the root's output wants it. */
  size_t arrays = 2 * (size_t)L * sizeof(size_t), at = (arrays + 63) / 64 * 64;
  size_t *counts = kt__scratch(c, at + (n / (size_t)S + 1) * es);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "reduce: out of memory");
  size_t *displs = counts + L;
  kt__hier_shards(n, S, L, counts, displs);
  char *shard = is_root && n ? (char *)op->recvbuf + displs[me] * es : (char *)counts + at;

  kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = op->sendbuf, .recvbuf = shard, .count = n,
               .dtype = op->dtype, .op = op->op, .counts = counts, .displs = displs};
  KT_CHECK(kt__hier_phase(ex, local, &rs, "intra-host reduce-scatter"));
  if (cross) {
    kt__op rd = {.coll = KT_COLL_REDUCE, .sendbuf = shard, .recvbuf = on_root_host ? shard : NULL,
                 .count = counts[me], .dtype = op->dtype, .op = op->op,
                 .root = kt__hier_cross_rank(c, root_host)};
    KT_CHECK(kt__hier_phase(ex, cross, &rd, "inter-host reduce"));
    if (on_root_host) kt__op_finalize(op, shard, counts[me], c->size);
  }
  if (!on_root_host) return KT_SUCCESS;
  kt__op ga = {.coll = KT_COLL_GATHER, .sendbuf = shard, .recvbuf = is_root ? op->recvbuf : NULL, .count = n,
               .dtype = op->dtype, .root = hs->idx[op->root], .counts = counts, .displs = displs};
  return kt__hier_phase(ex, local, &ga, "intra-host gather");
}
