/* allgatherv_ring.c - ring allgather(v): p-1 steps, each rank forwarding the
 * block it just received, streamed in chunks as it arrives (ring.c). Serves
 * allgather (equal blocks) and allgatherv (any counts and displacements).
 *
 * Any number of ranks; blocks may be empty. Data lands directly in recvbuf.
 * Cost: (p-1) alpha + (p-1)/p n beta (n = total bytes). */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__allgatherv_ring(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  size_t es = kt_dtype_size(op->dtype);
  bool v = op->coll == KT_COLL_ALLGATHERV;
  char *rb = op->recvbuf;
  kt_result res = KT_SUCCESS;
  char **work = malloc((size_t)p * sizeof *work); /* freed at exit */
  const char **in = malloc((size_t)p * sizeof *in);
  size_t *len = malloc((size_t)p * sizeof *len);
  if (!work || !in || !len) {
    res = kt__err(KT_ERR_NO_MEMORY, "rank %d: allgather: out of memory", c->rank);
    goto exit;
  }
  bool any = false;
  for (int b = 0; b < p; b++) {
    size_t cnt = v ? op->counts[b] : op->count, off = v ? op->displs[b] : (size_t)b * op->count;
    work[b] = rb ? rb + off * es : NULL;
    in[b] = work[b];
    len[b] = cnt * es;
    any |= cnt > 0;
  }
  if (!any) goto exit;
  /* Step 0 sends this rank's block from sendbuf; its copy into recvbuf is
   * made while the ring waits on its sockets. */
  bool copy = len[r] && op->sendbuf != work[r];
  in[r] = copy ? op->sendbuf : work[r];
  kt__ring rg = {.start = r, .rs_steps = 0, .ag_steps = p - 1, .in = in, .work = work, .len = len,
                 .tmp = NULL, .tag_base = 0, .copy_from = copy ? op->sendbuf : NULL,
                 .copy_to = copy ? work[r] : NULL, .copy_len = copy ? len[r] : 0};
  KT_CHECK_GOTO(kt__ring_run(ex, &rg), res, exit);
exit:
  free(work);
  free(in);
  free(len);
  return res;
}
