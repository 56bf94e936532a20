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
 * messages and with no TCP between ranks of one host. */
#include "coll.h"

#include <string.h>

kt_result kt__allreduce_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm, *local = c->local, *cross = c->cross;
  int L = local->size, me = local->rank, S = c->shards;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  char *out = op->recvbuf;
  if (L == 1) { /* alone on this host: only the inter-host phase (S is 1) */
    /* Out of place as given: the TCP algorithms read sendbuf while they
     * send, where a copy first would leave the link idle for its length. */
    kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = op->sendbuf, .recvbuf = out, .count = n,
                 .dtype = op->dtype, .op = op->op};
    KT_CHECK(kt__hier_phase(ex, cross, &ar, "inter-host allreduce"));
    kt__reduce_finalize(out, n, op->dtype, op->op, c->size);
    return KT_SUCCESS;
  }
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
