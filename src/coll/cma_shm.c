/* cma_shm.c - single-copy collectives on one host: each rank publishes the
 * address of its buffer and the readers copy straight out of the owner's
 * address space with process_vm_readv (the kernel's cross-memory attach),
 * one copy per byte where the region algorithms copy into the segment and
 * out again. The owner stays in the op until its readers have posted that
 * they are done.
 *
 * All ranks on one host, even blocks (the hierarchy's uneven phases stay
 * with the region algorithms). Needs every rank to be allowed to read every
 * other's memory: kt__shm_cma_ok probes that once per communicator and, where
 * it is refused, every rank runs the region algorithm instead. Chosen by the
 * tuner from KAITIAN_SHM_CMA_BYTES per rank. alltoall only out of place (in
 * place, a rank would overwrite what the others still read). */
#include "coll.h"

#include "transport/shm.h"

#include <stdint.h>
#include <string.h>

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

/* Publish this rank's buffer (NULL: none) and post; returns the post's step. */
static kt_result publish(kt__exec *ex, const void *buf, int *par, uint64_t *step) {
  KT_CHECK(kt__shm_iter_begin(ex, par));
  kt__shm_set_aux(ex, *par, addr_of(buf));
  *step = kt__shm_post(ex);
  return KT_SUCCESS;
}

kt_result kt__broadcast_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  if (!ok) return kt__broadcast_shm(ex);
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, me == root ? op->sendbuf : NULL, &par, &step));
  if (me == root) {
    if (bytes && op->recvbuf != op->sendbuf) memcpy(op->recvbuf, op->sendbuf, bytes);
    return kt__shm_wait(ex, -1, kt__shm_post(ex)); /* every reader done */
  }
  KT_CHECK(kt__shm_wait(ex, root, step));
  KT_CHECK(kt__shm_cma_read(ex, root, kt__shm_get_aux(ex, root, par), op->recvbuf, bytes));
  kt__shm_post(ex);
  return KT_SUCCESS;
}

kt_result kt__scatter_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  if (!ok) return kt__scatter_shm(ex);
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, me == root ? op->sendbuf : NULL, &par, &step));
  if (me == root) {
    const char *mine = (const char *)op->sendbuf + (size_t)me * bytes;
    if (bytes && op->recvbuf != mine) memcpy(op->recvbuf, mine, bytes);
    return kt__shm_wait(ex, -1, kt__shm_post(ex));
  }
  KT_CHECK(kt__shm_wait(ex, root, step));
  KT_CHECK(kt__shm_cma_read(ex, root, kt__shm_get_aux(ex, root, par) + (uint64_t)me * bytes, op->recvbuf, bytes));
  kt__shm_post(ex);
  return KT_SUCCESS;
}

kt_result kt__gather_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  if (!ok) return kt__gather_shm(ex);
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, me == root ? NULL : op->sendbuf, &par, &step));
  if (me != root) { /* stay until the root has read this rank's block */
    uint64_t done = kt__shm_post(ex);
    return kt__shm_wait(ex, root, done);
  }
  KT_CHECK(kt__shm_wait(ex, -1, step));
  char *out = op->recvbuf;
  for (int r = 0; r < p; r++) {
    char *dst = out + (size_t)r * bytes;
    if (r != me) KT_CHECK(kt__shm_cma_read(ex, r, kt__shm_get_aux(ex, r, par), dst, bytes));
    else if (bytes && dst != (const char *)op->sendbuf) memcpy(dst, op->sendbuf, bytes);
  }
  kt__shm_post(ex);
  return KT_SUCCESS;
}

kt_result kt__allgather_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, me = c->rank;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  char *out = op->recvbuf;
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  if (!ok) return kt__allgatherv_shm(ex);
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, op->sendbuf, &par, &step));
  KT_CHECK(kt__shm_wait(ex, -1, step));
  for (int r = 0; r < p; r++) {
    char *dst = out + (size_t)r * bytes;
    if (r != me) KT_CHECK(kt__shm_cma_read(ex, r, kt__shm_get_aux(ex, r, par), dst, bytes));
    else if (bytes && dst != (const char *)op->sendbuf) memcpy(dst, op->sendbuf, bytes);
  }
  return kt__shm_wait(ex, -1, kt__shm_post(ex)); /* nobody still reads this rank's block */
}

kt_result kt__alltoall_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int p = c->size, me = c->rank;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  char *out = op->recvbuf;
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  if (!ok) return kt__alltoallv_shm(ex);
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, op->sendbuf, &par, &step));
  KT_CHECK(kt__shm_wait(ex, -1, step));
  for (int r = 0; r < p; r++) {
    char *dst = out + (size_t)r * bytes;
    if (r != me)
      KT_CHECK(kt__shm_cma_read(ex, r, kt__shm_get_aux(ex, r, par) + (uint64_t)me * bytes, dst, bytes));
    else if (bytes) memcpy(dst, (const char *)op->sendbuf + (size_t)me * bytes, bytes);
  }
  return kt__shm_wait(ex, -1, kt__shm_post(ex));
}
