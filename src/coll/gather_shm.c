/* gather_shm.c - gather through shared memory: per chunk, every non-root
 * copies its chunk into its region and posts; the root waits for all and
 * copies each into place.
 *
 * All ranks on one host, any root. */
#include "coll.h"

#include "transport/shm.h"

#include <string.h>

kt_result kt__gather_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype), chunk = kt__shm_region_bytes(c);
  char *rb = op->recvbuf;
  kt__shm_op_begin(ex);
  if (me == root && bytes && op->sendbuf != rb + (size_t)me * bytes)
    memcpy(rb + (size_t)me * bytes, op->sendbuf, bytes);
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = KT_MIN(chunk, bytes - off);
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (me != root) kt__copy_shared(kt__shm_region(c, me, 0, par), (const char *)op->sendbuf + off, len);
    uint64_t step = kt__shm_post(ex);
    if (me == root) {
      KT_CHECK(kt__shm_wait(ex, -1, step));
      for (int r = 0; r < p; r++)
        if (r != root) memcpy(rb + (size_t)r * bytes + off, kt__shm_region(c, r, 0, par), len);
    }
  }
  return KT_SUCCESS;
}
