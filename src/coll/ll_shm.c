/* ll_shm.c - small collectives through shared memory with the small-message
 * protocol (shm.h: kt__shm_ll_*): each rank writes its payload and the op's
 * number into its own cache lines, flag beside data, and reads the lines it
 * needs when their flags show the op. One write and one read of a line per
 * peer, where the region algorithms move a step counter and a region line
 * each way. A rank waits only for the ranks it reads: the root of a
 * broadcast or scatter and the non-roots of a reduce or gather return once
 * their lines are written.
 *
 * All ranks on one host; payload per rank up to kt__shm_ll_max() bytes
 * (4456; scatter and reduce_scatter: the whole send buffer, of which
 * reduce_scatter posts all blocks but its own), chosen by the tuner up to
 * KAITIAN_SHM_LL_BYTES per rank. Reductions run in rank order on every rank,
 * so every rank gets bit-identical results. */
#include "coll.h"

#include "reduce/reduce.h"
#include "transport/shm.h"

#include <string.h>

/* Every rank's payload (n elements, bytes), reduced in rank order into
 * recvbuf: this rank's from mine, the others' from their lines. */
static kt_result reduce_all(kt__exec *ex, size_t n, size_t bytes, const void *mine) {
  const kt__op *op = ex->op;
  int me = ex->comm->rank;
  _Alignas(64) unsigned char tmp[KT_SHM_LL_MAX], own[KT_SHM_LL_MAX];
  if (mine == op->recvbuf && me != 0) { /* in place: recvbuf takes rank 0's first */
    memcpy(own, mine, bytes);
    mine = own;
  }
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  if (me != 0) KT_CHECK(kt__shm_ll_read(ex, 0, 0, op->recvbuf, bytes));
  else if (mine != op->recvbuf) memcpy(op->recvbuf, mine, bytes);
  for (int r = 1; r < ex->comm->size; r++) {
    if (r != me) KT_CHECK(kt__shm_ll_read(ex, r, 0, tmp, bytes));
    reduce(op->recvbuf, op->recvbuf, r == me ? mine : tmp, n);
  }
  kt__op_finalize(op, op->recvbuf, n, ex->comm->size);
  return KT_SUCCESS;
}

kt_result kt__allreduce_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, op->sendbuf, bytes));
  KT_CHECK(kt__shm_ll_wait(ex, -1));
  return bytes ? reduce_all(ex, n, bytes, op->sendbuf) : KT_SUCCESS;
}

kt_result kt__reduce_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  bool is_root = c->rank == op->root;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, is_root ? NULL : op->sendbuf, is_root ? 0 : bytes)); /* nobody reads the root's */
  KT_CHECK(kt__shm_ll_wait(ex, is_root ? -1 : c->rank));
  return bytes && is_root ? reduce_all(ex, n, bytes, op->sendbuf) : KT_SUCCESS;
}

/* Every rank posts the blocks of its input that the others reduce (all but
 * its own, in rank order; the tuner keeps them within the lines) and
 * reduces its own block, in rank order. */
kt_result kt__reduce_scatter_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  int me = c->rank;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  const char *in = op->sendbuf;
  _Alignas(64) unsigned char others[KT_SHM_LL_MAX], own[KT_SHM_LL_MAX], tmp[KT_SHM_LL_MAX];
  if (bytes * (size_t)(c->size - 1) > sizeof others)
    return kt__err(KT_ERR_INTERNAL, "reduce_scatter of %zu bytes per rank does not fit the small-message lines", bytes);
  kt__shm_op_begin(ex);
  if (bytes) { /* (in place, recvbuf is block me of the input) */
    memcpy(own, in + (size_t)me * bytes, bytes);
    memcpy(others, in, (size_t)me * bytes);
    memcpy(others + (size_t)me * bytes, in + (size_t)(me + 1) * bytes, (size_t)(c->size - 1 - me) * bytes);
  }
  KT_CHECK(kt__shm_ll_post(ex, others, bytes * (size_t)(c->size - 1)));
  KT_CHECK(kt__shm_ll_wait(ex, -1));
  if (!bytes) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  /* Rank r's copy of block me: its input's, or where r posted it. */
  for (int r = 0; r < c->size; r++) {
    char *dst = r == 0 ? op->recvbuf : (char *)tmp;
    if (r == me) memcpy(dst, own, bytes);
    else KT_CHECK(kt__shm_ll_read(ex, r, (size_t)(me < r ? me : me - 1) * bytes, dst, bytes));
    if (r > 0) reduce(op->recvbuf, op->recvbuf, tmp, n);
  }
  kt__op_finalize(op, op->recvbuf, n, c->size);
  return KT_SUCCESS;
}

kt_result kt__broadcast_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool is_root = c->rank == op->root;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, is_root ? op->sendbuf : NULL, is_root ? bytes : 0));
  if (is_root && bytes && op->sendbuf != op->recvbuf) memcpy(op->recvbuf, op->sendbuf, bytes);
  KT_CHECK(kt__shm_ll_wait(ex, op->root));
  if (!is_root && bytes) KT_CHECK(kt__shm_ll_read(ex, op->root, 0, op->recvbuf, bytes));
  return KT_SUCCESS;
}

/* Every rank's block (bytes each) into out, in rank order: this rank's
 * from mine (NULL: from its own lines), the others' from their lines. */
static kt_result read_blocks(kt__exec *ex, const void *mine, char *out, size_t bytes) {
  for (int r = 0; r < ex->comm->size && bytes; r++) {
    if (r == ex->comm->rank && mine) {
      if (mine != out + (size_t)r * bytes) memcpy(out + (size_t)r * bytes, mine, bytes);
    } else {
      KT_CHECK(kt__shm_ll_read(ex, r, 0, out + (size_t)r * bytes, bytes));
    }
  }
  return KT_SUCCESS;
}

kt_result kt__allgather_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, op->sendbuf, bytes));
  KT_CHECK(kt__shm_ll_wait(ex, -1));
  return read_blocks(ex, op->sendbuf, op->recvbuf, bytes);
}

/* Even blocks only (the tuner leaves the hierarchy's uneven ones to shm). */
kt_result kt__gather_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool is_root = c->rank == op->root;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, is_root ? NULL : op->sendbuf, is_root ? 0 : bytes)); /* nobody reads the root's */
  KT_CHECK(kt__shm_ll_wait(ex, is_root ? -1 : c->rank));
  return is_root ? read_blocks(ex, op->sendbuf, op->recvbuf, bytes) : KT_SUCCESS;
}

/* The root posts every block but its own (in rank order, as
 * reduce_scatter's ranks do), which it copies itself. */
kt_result kt__scatter_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  struct kt_comm_s *c = ex->comm;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  int root = op->root;
  bool is_root = c->rank == root;
  const char *in = op->sendbuf;
  _Alignas(64) unsigned char others[KT_SHM_LL_MAX];
  const void *post = NULL;
  size_t before = (size_t)root * bytes, after = (size_t)(c->size - 1 - root) * bytes;
  if (is_root && before + after > sizeof others)
    return kt__err(KT_ERR_INTERNAL, "scatter of %zu bytes per rank does not fit the small-message lines", bytes);
  kt__shm_op_begin(ex);
  if (is_root && bytes) {
    if (root == 0) {
      post = in + bytes;
    } else if (after == 0) {
      post = in;
    } else {
      memcpy(others, in, before);
      memcpy(others + before, in + before + bytes, after);
      post = others;
    }
  }
  KT_CHECK(kt__shm_ll_post(ex, post, is_root ? before + after : 0));
  if (is_root && bytes && op->recvbuf != in + before) memcpy(op->recvbuf, in + before, bytes);
  KT_CHECK(kt__shm_ll_wait(ex, root));
  if (!is_root && bytes)
    KT_CHECK(kt__shm_ll_read(ex, root, (size_t)(c->rank < root ? c->rank : c->rank - 1) * bytes, op->recvbuf, bytes));
  return KT_SUCCESS;
}

kt_result kt__barrier_shm_ll(kt__exec *ex) {
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, NULL, 0));
  return kt__shm_ll_wait(ex, -1);
}
