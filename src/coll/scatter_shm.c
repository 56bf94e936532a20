/* scatter_shm.c - scatter through shared memory: per window, the root copies
 * the window of every rank's block into its region and posts; the others wait
 * for the root and copy their window out.
 *
 * All ranks on one host, any root. */
#include "coll.h"

#include "transport/shm.h"

#include <string.h>

kt_result kt__scatter_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  size_t win = kt__shm_region_bytes(c) / (size_t)p / 64 * 64;
  const char *sb = op->sendbuf;
  bool stream = me != root && kt__stream_output_ex(ex, bytes * (size_t)p);
  kt__shm_op_begin(ex);
  if (me == root && bytes && op->recvbuf != sb + (size_t)me * bytes)
    memcpy(op->recvbuf, sb + (size_t)me * bytes, bytes);
  if (win == 0) win = kt__shm_region_bytes(c) / (size_t)p;
  for (size_t off = 0; off < bytes; off += win) {
    size_t len = KT_MIN(win, bytes - off);
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (me == root)
      for (int r = 0; r < p; r++)
        if (r != root) kt__copy_shared(kt__shm_region(c, root, 0, par) + (size_t)r * win, sb + (size_t)r * bytes + off, len);
    uint64_t step = kt__shm_post(ex);
    if (me != root) {
      KT_CHECK(kt__shm_wait(ex, root, step));
      kt__copy_out(stream, (char *)op->recvbuf + off, kt__shm_region(c, root, 0, par) + (size_t)me * win, len);
    }
  }
  if (stream) kt__stream_fence();
  return KT_SUCCESS;
}
