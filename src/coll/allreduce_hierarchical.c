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

/* Run one phase on a child communicator, within the parent's deadline. The
 * phase's op carries the parent's operation (AVG included: it only sums,
 * `partial`), so the children's signature checks catch a mismatch in it; its
 * waits also watch the parent's control sockets and exchange the parent op's
 * status notices, which catch a rank that called another collective on the
 * parent (kt__net_stuck). On
 * failure the parent breaks (run_op), which breaks the children with the
 * parent's message; a peer that died is named by its rank in the parent when
 * the parent's own sockets show it. */
static kt_result phase(kt__exec *ex, struct kt_comm_s *child, kt__op *op, const char *what) {
  op->seq = ++child->issued;
  op->partial = true;
  kt_result r = kt__execute_phase(child, op, ex);
  if (r == KT_SUCCESS) return KT_SUCCESS;
  kt_result dead = kt__net_check_peers(ex); /* its error text names the parent's rank */
  if (dead != KT_SUCCESS) return dead;
  kt__error_prefix("%s phase: ", what);
  return r;
}

kt_result kt__allreduce_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm, *local = c->local, *cross = c->cross;
  int L = local->size, me = local->rank, S = c->shards;
  size_t es = kt_dtype_size(op->dtype), n = op->count;
  char *out = op->recvbuf;
  if (L == 1) { /* alone on this host: only the inter-host phase (S is 1) */
    if (op->sendbuf != out && n) memmove(out, op->sendbuf, n * es);
    kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = out, .recvbuf = out, .count = n, .dtype = op->dtype,
                 .op = op->op};
    KT_CHECK(phase(ex, cross, &ar, "inter-host allreduce"));
    kt__reduce_finalize(out, n, op->dtype, op->op, c->size);
    return KT_SUCCESS;
  }
  /* The parent's scratch: its own algorithms never run during the phases. */
  size_t *counts = kt__scratch(c, 2 * (size_t)L * sizeof *counts);
  if (!counts) return kt__err(KT_ERR_NO_MEMORY, "allreduce: out of memory");
  size_t *displs = counts + L;
  for (int r = 0; r < L; r++) { /* S shards; local ranks from S on hold none */
    size_t k = (size_t)KT_MIN(r, S);
    displs[r] = n / (size_t)S * k + KT_MIN(k, n % (size_t)S);
    counts[r] = r < S ? n / (size_t)S + ((size_t)r < n % (size_t)S) : 0;
  }
  char *shard = out + displs[me] * es;

  kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = op->sendbuf, .recvbuf = shard, .count = n,
               .dtype = op->dtype, .op = op->op, .counts = counts, .displs = displs};
  KT_CHECK(phase(ex, local, &rs, "intra-host reduce-scatter"));
  if (cross) {
    kt__op ar = {.coll = KT_COLL_ALLREDUCE, .sendbuf = shard, .recvbuf = shard, .count = counts[me],
                 .dtype = op->dtype, .op = op->op};
    KT_CHECK(phase(ex, cross, &ar, "inter-host allreduce"));
    kt__reduce_finalize(shard, counts[me], op->dtype, op->op, c->size);
  }
  kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = shard, .recvbuf = out, .count = counts[me],
               .dtype = op->dtype, .counts = counts, .displs = displs};
  return phase(ex, local, &ag, "intra-host allgather");
}
