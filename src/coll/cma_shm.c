/* cma_shm.c - single-copy collectives on one host: each rank publishes the
 * address of its buffer and the others copy straight between the address
 * spaces with process_vm_readv / process_vm_writev (the kernel's
 * cross-memory attach), one copy per byte where the region algorithms copy
 * into the segment and out again. Readers read what they receive (scatter,
 * allgather, alltoall, broadcast); gather's ranks write their blocks into
 * the root's buffer, and broadcast's root, in place, writes a share into
 * each reader's. A rank whose buffer others still use stays in the op until
 * they have posted that they are done.
 *
 * All ranks on one host, even blocks (the hierarchy's uneven phases stay
 * with the region algorithms). Needs every rank to be allowed to reach every
 * other's memory: kt__shm_cma_ok probes that once per communicator and,
 * where it is refused, every rank runs the region algorithm instead. Chosen
 * by the tuner from KAITIAN_SHM_CMA_BYTES per rank. alltoall only out of
 * place (in place, a rank would overwrite what the others still read). */
#include "coll.h"

#include "transport/shm.h"

#include <stdint.h>
#include <string.h>

static uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

/* Start the op; where single copy is refused, run the region algorithm
 * instead (every rank alike) and set *done. */
static kt_result begin(kt__exec *ex, kt__algo_fn region, bool *done) {
  bool ok;
  kt__shm_op_begin(ex);
  KT_CHECK(kt__shm_cma_ok(ex, &ok));
  *done = !ok;
  return ok ? KT_SUCCESS : region(ex);
}

/* Publish this rank's buffer (NULL: none) and a second word (aux2) and
 * post; returns the post's step. */
static kt_result publish(kt__exec *ex, const void *buf, uint64_t aux2, int *par, uint64_t *step) {
  KT_CHECK(kt__shm_iter_begin(ex, par));
  kt__shm_set_aux(ex, *par, addr_of(buf));
  kt__shm_set_aux2(ex, *par, aux2);
  *step = kt__shm_post(ex);
  return KT_SUCCESS;
}

/* A buffer that peers will write is offered with a permit tied to the post
 * that publishes it; a writer checks it first. A rank that runs another
 * algorithm for the same op (KAITIAN_ALGO or KAITIAN_SHM_CMA_BYTES set
 * differently on some ranks: the ops' signatures still match) offers none,
 * and its memory is left alone. */
#define CMA_PERMIT 0x4b5457524954454dull
static uint64_t permit(uint64_t step) { return CMA_PERMIT ^ step; }

static kt_result publish_writable(kt__exec *ex, void *buf, int *par, uint64_t *step) {
  return publish(ex, buf, permit(kt__shm_next_step(ex)), par, step);
}

static kt_result check_permit(kt__exec *ex, int r, int par, uint64_t step) {
  kt__group *c = ex->group;
  if (kt__shm_get_aux2(ex, r, par) == permit(step)) return KT_SUCCESS;
  return kt__err(KT_ERR_MISMATCH,
                 "rank %d: rank %d does not run the single-copy %s with it (its buffer was not offered for "
                 "writing): do KAITIAN_ALGO or KAITIAN_SHM_CMA_BYTES differ between the ranks?",
                 kt__rank_label(c, c->rank), kt__rank_label(c, r), kt__coll_name(ex->op->coll));
}

/* Block r of out (bytes each) from byte `from` of rank r's published buffer;
 * this rank's own from own. */
static kt_result read_blocks(kt__exec *ex, int par, uint64_t from, const char *own, size_t bytes) {
  kt__group *c = ex->group;
  char *out = ex->op->recvbuf;
  for (int r = 0; r < c->size; r++) {
    char *dst = out + (size_t)r * bytes;
    if (r != c->rank) KT_CHECK(kt__shm_cma_read(ex, r, kt__shm_get_aux(ex, r, par) + from, dst, bytes));
    else if (bytes && dst != own) memcpy(dst, own, bytes);
  }
  return KT_SUCCESS;
}

/* Broadcast: every reader reads the head of the root's buffer, and a root
 * that broadcasts in place (no copy of its own to make) writes the tail,
 * 1/p of the bytes, into each reader's buffer meanwhile, so it copies
 * (p-1)/p of them like each reader instead of sitting idle. */
#define BCAST_SHARE_ALIGN 4096

kt_result kt__broadcast_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int me = c->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool done;
  kt_result res = begin(ex, kt__broadcast_shm, &done);
  if (res != KT_SUCCESS || done) return res;
  /* The tail the root writes: decided by the root, published with its
   * buffer (the readers cannot tell whether its op is in place). */
  int par;
  uint64_t step;
  if (me == root) {
    bool in_place = op->recvbuf == op->sendbuf;
    size_t tail = in_place ? bytes / (size_t)c->size / BCAST_SHARE_ALIGN * BCAST_SHARE_ALIGN : 0;
    KT_CHECK(publish(ex, op->sendbuf, tail, &par, &step));
    if (!in_place && bytes) memcpy(op->recvbuf, op->sendbuf, bytes);
    if (tail) {
      KT_CHECK(kt__shm_wait(ex, -1, step)); /* every reader's buffer published */
      for (int r = 0; r < c->size; r++) {
        if (r == me) continue;
        KT_CHECK(check_permit(ex, r, par, step));
        KT_CHECK(kt__shm_cma_write(ex, r, kt__shm_get_aux(ex, r, par) + (bytes - tail),
                                   (const char *)op->sendbuf + (bytes - tail), tail));
      }
    }
    return kt__shm_wait(ex, -1, kt__shm_post(ex)); /* every reader done, and they wait for this post */
  }
  KT_CHECK(publish_writable(ex, op->recvbuf, &par, &step));
  KT_CHECK(kt__shm_wait(ex, root, step));
  uint64_t tail = kt__shm_get_aux2(ex, root, par);
  size_t share = bytes / (size_t)c->size / BCAST_SHARE_ALIGN * BCAST_SHARE_ALIGN; /* the root's, in place */
  if (tail != 0 && tail != share) /* a corrupt segment */
    return kt__err(KT_ERR_INTERNAL, "rank %d: broadcast: the root, rank %d, posted %llu of the %zu bytes as its "
                   "share to write, not 0 or %zu", kt__rank_label(c, me), kt__rank_label(c, root),
                   (unsigned long long)tail, bytes, share);
  KT_CHECK(kt__shm_cma_read(ex, root, kt__shm_get_aux(ex, root, par), op->recvbuf, bytes - tail));
  uint64_t fin = kt__shm_post(ex);
  return tail ? kt__shm_wait(ex, root, fin) : KT_SUCCESS; /* the root's writes into this buffer done */
}

kt_result kt__scatter_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  int me = ex->group->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool done;
  kt_result res = begin(ex, kt__scatter_shm, &done);
  if (res != KT_SUCCESS || done) return res;
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, me == root ? op->sendbuf : NULL, 0, &par, &step));
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

/* Gather: every rank writes its own block into the root's buffer, all at
 * once, where a root that read them would copy them all itself. */
kt_result kt__gather_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  int me = ex->group->rank, root = op->root;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool done;
  kt_result res = begin(ex, kt__gather_shm, &done);
  if (res != KT_SUCCESS || done) return res;
  int par;
  uint64_t step;
  if (me != root) {
    KT_CHECK(publish(ex, NULL, 0, &par, &step));
    KT_CHECK(kt__shm_wait(ex, root, step)); /* its buffer published */
    KT_CHECK(check_permit(ex, root, par, step));
    KT_CHECK(kt__shm_cma_write(ex, root, kt__shm_get_aux(ex, root, par) + (uint64_t)me * bytes, op->sendbuf, bytes));
    kt__shm_post(ex);
    return KT_SUCCESS;
  }
  KT_CHECK(publish_writable(ex, op->recvbuf, &par, &step));
  char *mine = (char *)op->recvbuf + (size_t)me * bytes;
  if (bytes && op->sendbuf != mine) memcpy(mine, op->sendbuf, bytes);
  return kt__shm_wait(ex, -1, kt__shm_post(ex)); /* every block written */
}

kt_result kt__allgather_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool done;
  kt_result res = begin(ex, kt__allgatherv_shm, &done);
  if (res != KT_SUCCESS || done) return res;
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, op->sendbuf, 0, &par, &step));
  KT_CHECK(kt__shm_wait(ex, -1, step));
  KT_CHECK(read_blocks(ex, par, 0, op->sendbuf, bytes));
  return kt__shm_wait(ex, -1, kt__shm_post(ex)); /* nobody still reads this rank's block */
}

kt_result kt__alltoall_shm_cma(kt__exec *ex) {
  const kt__op *op = ex->op;
  int me = ex->group->rank;
  size_t bytes = op->count * kt_dtype_size(op->dtype);
  bool done;
  kt_result res = begin(ex, kt__alltoallv_shm, &done);
  if (res != KT_SUCCESS || done) return res;
  int par;
  uint64_t step;
  KT_CHECK(publish(ex, op->sendbuf, 0, &par, &step));
  KT_CHECK(kt__shm_wait(ex, -1, step));
  KT_CHECK(read_blocks(ex, par, (uint64_t)me * bytes, (const char *)op->sendbuf + (size_t)me * bytes, bytes));
  return kt__shm_wait(ex, -1, kt__shm_post(ex));
}
