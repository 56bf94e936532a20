/* allgatherv_shm.c - allgather(v) through shared memory: per chunk window,
 * every rank copies its block's window into its region and posts, waits for
 * all, and copies every rank's window into place.
 *
 * All ranks on one host; any counts and displacements (allgather too).
 * Traffic per rank: 2 x its block + 2 x the whole output. */
#include "coll.h"

#include "transport/shm.h"

#include <string.h>

kt_result kt__allgatherv_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype), chunk = kt__shm_region_bytes(c);
  bool v = op->coll == KT_COLL_ALLGATHERV;
  char *out = op->recvbuf;
  kt__shm_op_begin(ex);
  size_t maxlen = 0;
  size_t total = 0;
  for (int r = 0; r < p; r++) {
    maxlen = KT_MAX(maxlen, (v ? op->counts[r] : op->count) * es);
    total += (v ? op->counts[r] : op->count) * es;
  }
  bool stream = kt__stream_output_ex(ex, total * (size_t)p);
#define BLOCK(r) (out + (v ? op->displs[r] : (size_t)(r) * op->count) * es)
#define LEN(r) ((v ? op->counts[r] : op->count) * es)
  if (LEN(me) > 0 && op->sendbuf != BLOCK(me)) memcpy(BLOCK(me), op->sendbuf, LEN(me));
  for (size_t off = 0; off < maxlen; off += chunk) {
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (off < LEN(me)) kt__copy_shared(kt__shm_region(c, me, 0, par), BLOCK(me) + off, KT_MIN(chunk, LEN(me) - off));
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    for (int r = 0; r < p; r++)
      if (r != me && off < LEN(r))
        kt__copy_out(stream, BLOCK(r) + off, kt__shm_region(c, r, 0, par), KT_MIN(chunk, LEN(r) - off));
  }
  if (stream) kt__stream_fence();
#undef BLOCK
#undef LEN
  return KT_SUCCESS;
}
