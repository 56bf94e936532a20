/* broadcast_shm.c - broadcast through shared memory: per chunk, the root
 * copies the chunk into its region and every rank posts; the others wait for
 * the root and copy it out. Double-buffered, so the root's copy of chunk k+1
 * overlaps the others' copy-out of chunk k.
 *
 * All ranks on one host, any root. Traffic: root 2n, others 2n. */
#include "coll.h"

#include "transport/shm.h"

#include <string.h>

kt_result kt__broadcast_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype), chunk = kt__shm_region_bytes(c);
  bool is_root = c->rank == root;
  bool stream = !is_root && kt__stream_output_ex(ex, bytes * (size_t)c->size);
  kt__shm_op_begin(ex);
  if (is_root && op->sendbuf != op->recvbuf && bytes) memcpy(op->recvbuf, op->sendbuf, bytes);
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = KT_MIN(chunk, bytes - off);
    int par;
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    if (is_root) kt__copy_shared(kt__shm_region(c, root, 0, par), (const char *)op->sendbuf + off, len);
    uint64_t step = kt__shm_post(ex);
    if (!is_root) {
      KT_CHECK(kt__shm_wait(ex, root, step));
      kt__copy_out(stream, (char *)op->recvbuf + off, kt__shm_region(c, root, 0, par), len);
    }
  }
  if (stream) kt__stream_fence();
  return KT_SUCCESS;
}
