/* hier.c - what the hierarchical algorithms (*_hierarchical.c) share: running
 * one phase of an op on a child communicator, the shards a message is cut
 * into, and where a host's rank sits in this rank's `cross`. */
#include "coll.h"

/* The phase's op carries the parent's operation (AVG included: it only sums,
 * `partial`), so the children's signature checks catch a mismatch in it; its
 * waits also watch the parent's control sockets and exchange the parent op's
 * status notices, which catch a rank that called another collective on the
 * parent (kt__net_stuck). On failure the parent breaks (run_op), which breaks
 * the children with the parent's message; a peer that died is named by its
 * rank in the parent when the parent's own sockets show it. */
kt_result kt__hier_phase(kt__exec *ex, struct kt_comm_s *child, kt__op *op, const char *what) {
  op->seq = ++child->issued;
  op->partial = true;
  kt_result r = kt__execute_phase(child, op, ex);
  if (r == KT_SUCCESS) return KT_SUCCESS;
  kt_result dead = kt__net_check_peers(ex); /* its error text names the parent's rank */
  if (dead != KT_SUCCESS) return dead;
  kt__error_prefix("%s phase: ", what);
  return r;
}

void kt__hier_shards(size_t n, int S, int L, size_t *counts, size_t *displs) {
  for (int r = 0; r < L; r++) {
    size_t k = (size_t)KT_MIN(r, S);
    displs[r] = n / (size_t)S * k + KT_MIN(k, n % (size_t)S);
    counts[r] = r < S ? n / (size_t)S + ((size_t)r < n % (size_t)S) : 0;
  }
}

int kt__hier_cross_rank(const struct kt_comm_s *c, int host) {
  const struct kt_comm_s *x = c->cross;
  for (int i = 0; i < x->size; i++)
    if (c->hosts->of[x->label[i]] == host) return i;
  return -1; /* not reached: cross has one rank of every host */
}
