/* alltoallv_pairwise.c - pairwise exchange all-to-all(v): in step i rank r
 * sends to r+i and receives from r-i; all steps are posted at once and the
 * transport moves them concurrently, in step order per peer. Serves alltoall
 * (equal blocks; in place through a scratch copy) and alltoallv.
 *
 * Any number of ranks.
 * Cost: (p-1) alpha + (p-1)/p n beta. */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__alltoallv_pairwise(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype);
  bool v = op->coll == KT_COLL_ALLTOALLV;
#define SCOUNT(i) (v ? op->counts[i] : op->count)
#define SDISPL(i) (v ? op->displs[i] : (size_t)(i) * op->count)
#define RCOUNT(i) (v ? op->counts2[i] : op->count)
#define RDISPL(i) (v ? op->displs2[i] : (size_t)(i) * op->count)
  const char *sb = op->sendbuf;
  char *rb = op->recvbuf;
  if (!v && sb == rb) { /* in place: send from a copy */
    size_t total = (size_t)p * op->count * es;
    if (total == 0) return KT_SUCCESS;
    char *copy = kt__scratch(c, total);
    if (!copy) return KT_ERR_NO_MEMORY;
    memcpy(copy, sb, total);
    sb = copy;
  }
  if (SCOUNT(r) != RCOUNT(r))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: alltoallv: sends %zu elements to itself but expects %zu",
                   r, SCOUNT(r), RCOUNT(r));
  if (RCOUNT(r)) memmove(rb + RDISPL(r) * es, sb + SDISPL(r) * es, RCOUNT(r) * es);
  if (p == 1) return KT_SUCCESS;
  kt__xfer *xs = malloc(2 * (size_t)p * sizeof *xs); /* freed below */
  if (!xs) return kt__err(KT_ERR_NO_MEMORY, "rank %d: alltoall: out of memory", r);
  kt_result res = KT_SUCCESS;
  int n = 0;
  for (int i = 1; i < p; i++) {
    int dst = (r + i) % p, src = kt__mod(r - i, p);
    kt__xfer_send(&xs[n], dst, sb + SDISPL(dst) * es, SCOUNT(dst) * es, 0);
    KT_CHECK_GOTO(kt__net_post(ex, &xs[n]), res, exit);
    n++;
    kt__xfer_recv(&xs[n], src, rb + RDISPL(src) * es, RCOUNT(src) * es, 0);
    KT_CHECK_GOTO(kt__net_post(ex, &xs[n]), res, exit);
    n++;
  }
  res = kt__net_waitall(ex, xs, n);
exit:
  free(xs);
  return res;
#undef SCOUNT
#undef SDISPL
#undef RCOUNT
#undef RDISPL
}
