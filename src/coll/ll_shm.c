/* ll_shm.c - small collectives through shared memory with the small-message
 * protocol (shm.h: kt__shm_ll_*): each rank writes its payload and the op's
 * number into its own cache lines, flag beside data, and reads the lines it
 * needs when their flags show the op. One write and one read of a line per
 * peer, where the region algorithms move a step counter and a region line
 * each way. A rank waits only for the ranks it reads: the root of a
 * broadcast or scatter and the non-roots of a reduce or gather return once
 * their lines are written.
 *
 * All ranks on one host; payload per rank up to KT_SHM_LL_MAX bytes
 * (4456; scatter, reduce_scatter and alltoall: every block of the send
 * buffer but the poster's own), chosen by the tuner up to
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
  int me = ex->group->rank;
  _Alignas(64) unsigned char tmp[KT_SHM_LL_MAX], own[KT_SHM_LL_MAX];
  if (mine == op->recvbuf && me != 0) { /* in place: recvbuf takes rank 0's first */
    kt__copy(own, mine, bytes);
    mine = own;
  }
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  if (me != 0) KT_CHECK(kt__shm_ll_read(ex, 0, 0, op->recvbuf, bytes));
  else if (mine != op->recvbuf) kt__copy(op->recvbuf, mine, bytes);
  for (int r = 1; r < ex->group->size; r++) {
    if (r != me) KT_CHECK(kt__shm_ll_read(ex, r, 0, tmp, bytes));
    reduce(op->recvbuf, op->recvbuf, r == me ? mine : tmp, n);
  }
  kt__op_finalize(op, op->recvbuf, n, ex->group->size);
  return KT_SUCCESS;
}

/* Post blocks [0, skip) and (skip, size) of in, copied together (in its
 * own frame: the 4 KiB buffer would cost every small op's frame a page). */
static __attribute__((noinline)) kt_result post_gathered(kt__exec *ex, const char *in, size_t before,
                                                         size_t bytes, size_t after) {
  _Alignas(64) unsigned char tmp[KT_SHM_LL_MAX];
  memcpy(tmp, in, before);
  memcpy(tmp + before, in + before + bytes, after);
  return kt__shm_ll_post(ex, tmp, before + after);
}

/* Post every block of in (size blocks of bytes) but block skip, in rank
 * order (a reader r != skip finds its own at other_at(r, skip)), gathered
 * where they are not contiguous. */
static kt_result post_others(kt__exec *ex, const char *in, size_t bytes, int skip) {
  int p = ex->group->size;
  size_t before = (size_t)skip * bytes, after = (size_t)(p - 1 - skip) * bytes;
  if (before + after > KT_SHM_LL_MAX)
    return kt__err(KT_ERR_INTERNAL, "%s of %zu bytes per rank does not fit the small-message lines",
                   kt__coll_name(ex->op->coll), bytes);
  if (!bytes) return kt__shm_ll_post(ex, NULL, 0);
  if (skip == 0) return kt__shm_ll_post(ex, in + bytes, after);
  if (after == 0) return kt__shm_ll_post(ex, in, before);
  return post_gathered(ex, in, before, bytes, after);
}

/* Where rank r's block is among the blocks rank skip posted. */
static size_t other_at(int r, int skip, size_t bytes) { return (size_t)(r < skip ? r : r - 1) * bytes; }

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
  kt__group *c = ex->group;
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
  kt__group *c = ex->group;
  int me = c->rank;
  size_t n = op->count, bytes = n * kt_dtype_size(op->dtype);
  const char *in = op->sendbuf;
  _Alignas(64) unsigned char own[KT_SHM_LL_MAX], tmp[KT_SHM_LL_MAX];
  kt__shm_op_begin(ex);
  KT_CHECK(post_others(ex, in, bytes, me)); /* checks the size too */
  if (bytes) kt__copy(own, in + (size_t)me * bytes, bytes); /* in place, recvbuf is block me of the input */
  KT_CHECK(kt__shm_ll_wait(ex, -1));
  if (!bytes) return KT_SUCCESS;
  kt__reduce_fn reduce = kt__reduce_kernel(op->dtype, op->op);
  /* Rank r's copy of block me: its input's, or where r posted it. */
  for (int r = 0; r < c->size; r++) {
    char *dst = r == 0 ? op->recvbuf : (char *)tmp;
    if (r == me) kt__copy(dst, own, bytes);
    else KT_CHECK(kt__shm_ll_read(ex, r, other_at(me, r, bytes), dst, bytes));
    if (r > 0) reduce(op->recvbuf, op->recvbuf, tmp, n);
  }
  kt__op_finalize(op, op->recvbuf, n, c->size);
  return KT_SUCCESS;
}

kt_result kt__broadcast_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool is_root = c->rank == op->root;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, is_root ? op->sendbuf : NULL, is_root ? bytes : 0));
  if (is_root && bytes && op->sendbuf != op->recvbuf) kt__copy(op->recvbuf, op->sendbuf, bytes);
  KT_CHECK(kt__shm_ll_wait(ex, op->root));
  if (!is_root && bytes) KT_CHECK(kt__shm_ll_read(ex, op->root, 0, op->recvbuf, bytes));
  return KT_SUCCESS;
}

/* Every rank's block (bytes each) into out, in rank order: this rank's
 * from mine, the others' from their lines. */
static kt_result read_blocks(kt__exec *ex, const void *mine, char *out, size_t bytes) {
  for (int r = 0; r < ex->group->size && bytes; r++) {
    char *dst = out + (size_t)r * bytes;
    if (r != ex->group->rank) KT_CHECK(kt__shm_ll_read(ex, r, 0, dst, bytes));
    else if (mine != dst) kt__copy(dst, mine, bytes);
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
  kt__group *c = ex->group;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool is_root = c->rank == op->root;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, is_root ? NULL : op->sendbuf, is_root ? 0 : bytes)); /* nobody reads the root's */
  KT_CHECK(kt__shm_ll_wait(ex, is_root ? -1 : c->rank));
  return is_root ? read_blocks(ex, op->sendbuf, op->recvbuf, bytes) : KT_SUCCESS;
}

/* The root posts every block but its own (as reduce_scatter's ranks do),
 * which it copies itself. */
kt_result kt__scatter_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  int root = op->root;
  bool is_root = c->rank == root;
  kt__shm_op_begin(ex);
  KT_CHECK(is_root ? post_others(ex, op->sendbuf, bytes, root) : kt__shm_ll_post(ex, NULL, 0));
  if (is_root && bytes) {
    const char *mine = (const char *)op->sendbuf + (size_t)root * bytes;
    if (op->recvbuf != mine) kt__copy(op->recvbuf, mine, bytes);
  }
  KT_CHECK(kt__shm_ll_wait(ex, root));
  if (!is_root && bytes) KT_CHECK(kt__shm_ll_read(ex, root, other_at(c->rank, root, bytes), op->recvbuf, bytes));
  return KT_SUCCESS;
}

/* Every rank posts the blocks of its input the others take (all but its
 * own) and takes its block from each. */
kt_result kt__alltoall_shm_ll(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int me = c->rank;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  const char *in = op->sendbuf;
  char *out = op->recvbuf;
  kt__shm_op_begin(ex);
  KT_CHECK(post_others(ex, in, bytes, me)); /* before out is written: in place, they share */
  if (bytes && out != in) kt__copy(out + (size_t)me * bytes, in + (size_t)me * bytes, bytes);
  KT_CHECK(kt__shm_ll_wait(ex, -1));
  for (int r = 0; r < c->size && bytes; r++)
    if (r != me) KT_CHECK(kt__shm_ll_read(ex, r, other_at(me, r, bytes), out + (size_t)r * bytes, bytes));
  return KT_SUCCESS;
}

kt_result kt__barrier_shm_ll(kt__exec *ex) {
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_ll_post(ex, NULL, 0));
  return kt__shm_ll_wait(ex, -1);
}
