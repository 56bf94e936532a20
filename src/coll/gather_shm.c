/* gather_shm.c - gather through shared memory: per chunk, every non-root
 * copies its chunk into its region and posts; the root waits for all and
 * copies each into place.
 *
 * All ranks on one host, any root. Internal callers (reduce_hierarchical.c)
 * may give uneven blocks: op->counts/op->displs in elements of the root's
 * recvbuf, op->count then being the total. */
#include "coll.h"

#include "transport/shm.h"

#include <string.h>

kt_result kt__gather_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank, root = op->root;
  size_t es = kt_dtype_size(op->dtype), chunk = kt__shm_region_bytes(c);
  char *rb = op->recvbuf;
#define LEN(r) ((op->counts ? op->counts[r] : op->count) * es)
#define BLOCK(r) (rb + (op->counts ? op->displs[r] : (size_t)(r) * op->count) * es)
  kt__shm_op_begin(ex);
  size_t most = 0;
  size_t total = 0;
  for (int r = 0; r < p; r++) most = KT_MAX(most, LEN(r)), total += LEN(r);
  bool stream = me == root && kt__stream_output_ex(ex, total); /* the root writes every block */
  if (me == root && LEN(me) > 0 && op->sendbuf != BLOCK(me)) memcpy(BLOCK(me), op->sendbuf, LEN(me));
  for (size_t off = 0; off < most; off += chunk) {
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (me != root && off < LEN(me))
      kt__copy_shared(kt__shm_region(c, me, 0, par), (const char *)op->sendbuf + off, KT_MIN(chunk, LEN(me) - off));
    uint64_t step = kt__shm_post(ex);
    if (me == root) {
      KT_CHECK(kt__shm_wait(ex, -1, step));
      for (int r = 0; r < p; r++)
        if (r != root && off < LEN(r))
          kt__copy_out(stream, BLOCK(r) + off, kt__shm_region(c, r, 0, par), KT_MIN(chunk, LEN(r) - off));
    }
  }
  if (stream) kt__stream_fence();
#undef LEN
#undef BLOCK
  return KT_SUCCESS;
}
