/* api.c - the public collective entry points: check every argument (an
 * invalid call returns an error naming the rank and the problem, and has no
 * side effect), describe the op, and issue it in order. */
#include "comm.h"

#include "reduce/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The rank shown when no communicator is at hand. */
#define NO_COMM_RANK "rank ?"

static kt_result check_comm(kt_comm c, const char *fn) {
  if (!c) return kt__err(KT_ERR_INVALID_ARGUMENT, NO_COMM_RANK ": %s: comm is NULL", fn);
  return KT_SUCCESS;
}

static kt_result check_dtype(kt_comm c, const char *fn, kt_dtype dt) {
  if ((unsigned)dt >= KT_NUM_DTYPES)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: unknown dtype %d", c->g.rank, fn, (int)dt);
  return KT_SUCCESS;
}

static kt_result check_op(kt_comm c, const char *fn, kt_dtype dt, kt_op op) {
  if ((unsigned)op >= KT_NUM_OPS)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: unknown reduction op %d", c->g.rank, fn, (int)op);
  if (!kt__op_valid(dt, op))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: op %s does not apply to dtype %s", c->g.rank,
                   fn, kt_op_name(op), kt_dtype_name(dt));
  return KT_SUCCESS;
}

/* count elements (times mult) of dt must fit in size_t, and buf may be NULL
 * only when there is nothing to touch. check_buf, inline, passes the good
 * calls; bad_buf, out of line, says what is wrong. */
static bool buf_ok(const void *buf, size_t count, size_t mult, kt_dtype dt, size_t *bytes) {
  size_t n;
  return kt__mul_ok(count, mult, &n) && kt__mul_ok(n, kt_dtype_size(dt), bytes) && *bytes <= (size_t)PTRDIFF_MAX &&
         (buf || *bytes == 0);
}

static __attribute__((noinline, cold)) kt_result bad_buf(kt_comm c, const char *fn, const char *what,
                                                         size_t count, size_t mult, kt_dtype dt) {
  size_t n, bytes;
  if (!kt__mul_ok(count, mult, &n) || !kt__mul_ok(n, kt_dtype_size(dt), &bytes) ||
      bytes > (size_t)PTRDIFF_MAX)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s: count %zu x %zu of %s overflows", c->g.rank,
                   fn, what, count, mult, kt_dtype_name(dt));
  return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s is NULL but holds %zu bytes", c->g.rank, fn,
                 what, bytes);
}

static inline kt_result check_buf(kt_comm c, const char *fn, const char *what, const void *buf,
                                  size_t count, size_t mult, kt_dtype dt) {
  size_t bytes;
  return KT_LIKELY(buf_ok(buf, count, mult, dt, &bytes)) ? KT_SUCCESS : bad_buf(c, fn, what, count, mult, dt);
}

/* size x count elements of dt must be addressable (checked on every rank of
 * a rooted op, not only where the big buffer lives, so all ranks agree). */
static kt_result check_total(kt_comm c, const char *fn, size_t count, kt_dtype dt) {
  return check_buf(c, fn, "the root's buffer", "", count, (size_t)c->g.size, dt);
}

/* p + off bytes, where p may be NULL (then NULL: no arithmetic on it). */
static inline const void *at(const void *p, size_t off) { return p ? (const char *)p + off : NULL; }

/* A send and a receive buffer of one call may share bytes only in the
 * call's in-place form (in_place: the caller's test of it). Any
 * other overlap would have the op read what it has already written; the
 * algorithms read the send buffer while they write the receive buffer (a
 * broadcast's root sends from one while it copies into the other), so what
 * the peers get would depend on timing. Ranges of 0 bytes overlap nothing. */
static kt_result check_overlap(kt_comm c, const char *fn, const void *sb, size_t sbytes, const void *rb,
                               size_t rbytes, bool in_place, const char *rule) {
  uintptr_t s = (uintptr_t)sb, r = (uintptr_t)rb;
  if (in_place || !sbytes || !rbytes || !sb || !rb || s >= r + rbytes || r >= s + sbytes) return KT_SUCCESS;
  return kt__err(KT_ERR_INVALID_ARGUMENT,
                 "rank %d: %s: sendbuf (%zu bytes at %p) and recvbuf (%zu bytes at %p) overlap, and the call is "
                 "not in place (%s)",
                 c->g.rank, fn, sbytes, sb, rbytes, rb, rule);
}

static kt_result check_rank(kt_comm c, const char *fn, const char *what, int r) {
  if (r < 0 || r >= c->g.size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s %d is out of range [0, %d)", c->g.rank, fn,
                   what, r, c->g.size);
  return KT_SUCCESS;
}

static kt_result check_req(kt_comm c, const char *fn, bool nonblocking, kt_request *req) {
  if (nonblocking && !req)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: request pointer is NULL", c->g.rank, fn);
  return KT_SUCCESS;
}

static kt_result issue(kt_comm c, kt__op *op, kt_request *req) { return kt__issue(c, op, req); }

/* Every field of o set one by one (the few an op needs beyond these are set
 * after): a designated initializer zeroes the whole struct first (rep stos,
 * a fair part of a sub-microsecond call). */
static inline void op_init(kt__op *o, kt__coll coll, const void *sb, void *rb, size_t count, kt_dtype dt,
                           kt_op op, int root) {
  o->coll = coll;
  o->sendbuf = sb;
  o->recvbuf = rb;
  o->count = count;
  o->count2 = 0;
  o->dtype = dt;
  o->op = op;
  o->root = root;
  o->peer2 = 0;
  o->tag = 0;
  o->counts = o->displs = o->counts2 = o->displs2 = NULL;
  o->seq = 0;
  o->partial = false;
}

#define BEGIN(fn, nb)                              \
  kt__clear_error();                               \
  KT_CHECK(check_comm(comm, fn));                  \
  KT_CHECK(check_req(comm, fn, nb, req))

/* ---- allreduce ---------------------------------------------------------- */

static kt_result allreduce(const void *sb, void *rb, size_t count, kt_dtype dt, kt_op op, kt_comm comm,
                           kt_request *req, bool nb) {
  const char *fn = nb ? "kt_iallreduce" : "kt_allreduce";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_op(comm, fn, dt, op));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, 1, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, 1, dt));
  size_t n = count * kt_dtype_size(dt);
  KT_CHECK(check_overlap(comm, fn, sb, n, rb, n, sb == rb, "sendbuf == recvbuf"));
  kt__op o;
  op_init(&o, KT_COLL_ALLREDUCE, sb, rb, count, dt, op, 0);
  return issue(comm, &o, req);
}
kt_result kt_allreduce(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, kt_comm comm) {
  return allreduce(sb, rb, n, dt, op, comm, NULL, false);
}
kt_result kt_iallreduce(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, kt_comm comm, kt_request *req) {
  return allreduce(sb, rb, n, dt, op, comm, req, true);
}

/* ---- broadcast ---------------------------------------------------------- */

static kt_result broadcast(const void *sb, void *rb, size_t count, kt_dtype dt, int root, kt_comm comm,
                           kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ibroadcast" : "kt_broadcast";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_rank(comm, fn, "root", root));
  if (comm->g.rank == root) KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, 1, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, 1, dt));
  if (comm->g.rank == root) {
    size_t n = count * kt_dtype_size(dt);
    KT_CHECK(check_overlap(comm, fn, sb, n, rb, n, sb == rb, "sendbuf == recvbuf"));
  }
  kt__op o;
  op_init(&o, KT_COLL_BROADCAST, sb, rb, count, dt, 0, root);
  return issue(comm, &o, req);
}
kt_result kt_broadcast(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm) {
  return broadcast(sb, rb, n, dt, root, comm, NULL, false);
}
kt_result kt_ibroadcast(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm, kt_request *req) {
  return broadcast(sb, rb, n, dt, root, comm, req, true);
}

/* ---- reduce ------------------------------------------------------------- */

static kt_result reduce(const void *sb, void *rb, size_t count, kt_dtype dt, kt_op op, int root,
                        kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ireduce" : "kt_reduce";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_op(comm, fn, dt, op));
  KT_CHECK(check_rank(comm, fn, "root", root));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, 1, dt));
  if (comm->g.rank == root) {
    KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, 1, dt));
    size_t n = count * kt_dtype_size(dt);
    KT_CHECK(check_overlap(comm, fn, sb, n, rb, n, sb == rb, "sendbuf == recvbuf"));
  }
  kt__op o;
  op_init(&o, KT_COLL_REDUCE, sb, rb, count, dt, op, root);
  return issue(comm, &o, req);
}
kt_result kt_reduce(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, int root, kt_comm comm) {
  return reduce(sb, rb, n, dt, op, root, comm, NULL, false);
}
kt_result kt_ireduce(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, int root, kt_comm comm,
                     kt_request *req) {
  return reduce(sb, rb, n, dt, op, root, comm, req, true);
}

/* ---- allgather ---------------------------------------------------------- */

static kt_result allgather(const void *sb, void *rb, size_t count, kt_dtype dt, kt_comm comm,
                           kt_request *req, bool nb) {
  const char *fn = nb ? "kt_iallgather" : "kt_allgather";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, 1, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, (size_t)comm->g.size, dt));
  size_t n = count * kt_dtype_size(dt);
  KT_CHECK(check_overlap(comm, fn, sb, n, rb, n * (size_t)comm->g.size, sb == at(rb, n * (size_t)comm->g.rank),
                         "sendbuf == recvbuf + rank x count"));
  kt__op o;
  op_init(&o, KT_COLL_ALLGATHER, sb, rb, count, dt, 0, 0);
  return issue(comm, &o, req);
}
kt_result kt_allgather(const void *sb, void *rb, size_t n, kt_dtype dt, kt_comm comm) {
  return allgather(sb, rb, n, dt, comm, NULL, false);
}
kt_result kt_iallgather(const void *sb, void *rb, size_t n, kt_dtype dt, kt_comm comm, kt_request *req) {
  return allgather(sb, rb, n, dt, comm, req, true);
}

/* Copy a per-rank array; every count + displ must stay addressable. */
static kt_result copy_counts(kt_comm c, const char *fn, const char *what, const size_t *counts,
                             const size_t *displs, kt_dtype dt, const void *buf, size_t **oc,
                             size_t **od) {
  size_t p = (size_t)c->g.size, es = kt_dtype_size(dt);
  if (!counts || !displs)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s counts or displacements are NULL", c->g.rank, fn, what);
  bool any = false;
  for (size_t i = 0; i < p; i++) {
    size_t end, bytes;
    if (__builtin_add_overflow(counts[i], displs[i], &end) || !kt__mul_ok(end, es, &bytes) ||
        bytes > (size_t)PTRDIFF_MAX)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s count %zu + displacement %zu for rank %zu overflows",
                     c->g.rank, fn, what, counts[i], displs[i], i);
    any |= counts[i] > 0;
  }
  if (any && !buf)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: %s buffer is NULL but counts are not all 0", c->g.rank, fn, what);
  *oc = malloc(p * sizeof(size_t)); /* freed with the op */
  *od = malloc(p * sizeof(size_t));
  if (!*oc || !*od) {
    free(*oc);
    free(*od);
    *oc = *od = NULL;
    return kt__err(KT_ERR_NO_MEMORY, "rank %d: %s: out of memory", c->g.rank, fn);
  }
  memcpy(*oc, counts, p * sizeof(size_t));
  memcpy(*od, displs, p * sizeof(size_t));
  return KT_SUCCESS;
}

/* The bytes of buf that a v-collective's counts and displacements touch:
 * from the lowest displacement to the highest end, over the ranks with a
 * count (copy_counts has checked that these fit); *from 0 bytes when none. */
static size_t v_span(const size_t *counts, const size_t *displs, int p, size_t es, size_t *from) {
  size_t lo = SIZE_MAX, hi = 0;
  for (int i = 0; i < p; i++) {
    if (!counts[i]) continue;
    lo = KT_MIN(lo, displs[i]);
    hi = KT_MAX(hi, displs[i] + counts[i]);
  }
  if (hi == 0) {
    *from = 0;
    return 0;
  }
  *from = lo * es;
  return (hi - lo) * es;
}

static kt_result allgatherv(const void *sb, size_t sendcount, void *rb, const size_t *recvcounts,
                            const size_t *displs, kt_dtype dt, kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_iallgatherv" : "kt_allgatherv";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, sendcount, 1, dt));
  kt__op o;
  op_init(&o, KT_COLL_ALLGATHERV, sb, rb, sendcount, dt, 0, 0);
  KT_CHECK(copy_counts(comm, fn, "receive", recvcounts, displs, dt, rb, &o.counts, &o.displs));
  if (o.counts[comm->g.rank] != sendcount) {
    size_t want = o.counts[comm->g.rank];
    free(o.counts);
    free(o.displs);
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: sendcount %zu differs from recvcounts[%d] = %zu",
                   comm->g.rank, fn, sendcount, comm->g.rank, want);
  }
  size_t es = kt_dtype_size(dt), from, span = v_span(o.counts, o.displs, comm->g.size, es, &from);
  kt_result r = check_overlap(comm, fn, sb, sendcount * es, at(rb, from), span,
                              sendcount && sb == at(rb, o.displs[comm->g.rank] * es),
                              "sendbuf == recvbuf + displs[rank]");
  if (r != KT_SUCCESS) {
    free(o.counts);
    free(o.displs);
    return r;
  }
  return issue(comm, &o, req);
}
kt_result kt_allgatherv(const void *sb, size_t sc, void *rb, const size_t *rc, const size_t *d, kt_dtype dt,
                        kt_comm comm) {
  return allgatherv(sb, sc, rb, rc, d, dt, comm, NULL, false);
}
kt_result kt_iallgatherv(const void *sb, size_t sc, void *rb, const size_t *rc, const size_t *d, kt_dtype dt,
                         kt_comm comm, kt_request *req) {
  return allgatherv(sb, sc, rb, rc, d, dt, comm, req, true);
}

/* ---- reduce_scatter ----------------------------------------------------- */

static kt_result reduce_scatter(const void *sb, void *rb, size_t count, kt_dtype dt, kt_op op,
                                kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ireduce_scatter" : "kt_reduce_scatter";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_op(comm, fn, dt, op));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, (size_t)comm->g.size, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, 1, dt));
  size_t n = count * kt_dtype_size(dt);
  KT_CHECK(check_overlap(comm, fn, sb, n * (size_t)comm->g.size, rb, n, rb == at(sb, n * (size_t)comm->g.rank),
                         "recvbuf == sendbuf + rank x recvcount"));
  kt__op o;
  op_init(&o, KT_COLL_REDUCE_SCATTER, sb, rb, count, dt, op, 0);
  return issue(comm, &o, req);
}
kt_result kt_reduce_scatter(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, kt_comm comm) {
  return reduce_scatter(sb, rb, n, dt, op, comm, NULL, false);
}
kt_result kt_ireduce_scatter(const void *sb, void *rb, size_t n, kt_dtype dt, kt_op op, kt_comm comm,
                             kt_request *req) {
  return reduce_scatter(sb, rb, n, dt, op, comm, req, true);
}

/* Uneven blocks, contiguous in rank order (MPI_Reduce_scatter): rank r gets
 * the reduction of recvcounts[r] elements starting at the sum of the counts
 * before it. The algorithms take them as the op's counts and displacements
 * (the ring and shared memory ones run uneven blocks). */
static kt_result reduce_scatterv(const void *sb, void *rb, const size_t *recvcounts, kt_dtype dt, kt_op op,
                                 kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ireduce_scatterv" : "kt_reduce_scatterv";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_op(comm, fn, dt, op));
  if (!recvcounts)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: recvcounts is NULL", comm->g.rank, fn);
  size_t p = (size_t)comm->g.size, total = 0, mine = 0;
  size_t *displs = malloc(p * sizeof *displs); /* copied by copy_counts, freed here */
  if (!displs) return kt__err(KT_ERR_NO_MEMORY, "rank %d: %s: out of memory", comm->g.rank, fn);
  for (size_t i = 0; i < p; i++) {
    displs[i] = total;
    if (__builtin_add_overflow(total, recvcounts[i], &total)) {
      free(displs);
      return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: the sum of recvcounts overflows at rank %zu",
                     comm->g.rank, fn, i);
    }
  }
  mine = recvcounts[comm->g.rank];
  kt__op o;
  op_init(&o, KT_COLL_REDUCE_SCATTER, sb, rb, total, dt, op, 0);
  kt_result r = check_buf(comm, fn, "sendbuf", sb, total, 1, dt);
  if (r == KT_SUCCESS) r = check_buf(comm, fn, "recvbuf", rb, mine, 1, dt);
  if (r == KT_SUCCESS) r = copy_counts(comm, fn, "receive", recvcounts, displs, dt, sb, &o.counts, &o.displs);
  size_t es = kt_dtype_size(dt);
  if (r == KT_SUCCESS)
    r = check_overlap(comm, fn, sb, total * es, rb, mine * es, mine && rb == at(sb, displs[comm->g.rank] * es),
                      "recvbuf == sendbuf + the counts before this rank's");
  free(displs);
  if (r != KT_SUCCESS) {
    free(o.counts);
    free(o.displs);
    return r;
  }
  return issue(comm, &o, req);
}
kt_result kt_reduce_scatterv(const void *sb, void *rb, const size_t *rc, kt_dtype dt, kt_op op, kt_comm comm) {
  return reduce_scatterv(sb, rb, rc, dt, op, comm, NULL, false);
}
kt_result kt_ireduce_scatterv(const void *sb, void *rb, const size_t *rc, kt_dtype dt, kt_op op, kt_comm comm,
                              kt_request *req) {
  return reduce_scatterv(sb, rb, rc, dt, op, comm, req, true);
}

/* ---- gather / scatter --------------------------------------------------- */

static kt_result gather(const void *sb, void *rb, size_t count, kt_dtype dt, int root, kt_comm comm,
                        kt_request *req, bool nb) {
  const char *fn = nb ? "kt_igather" : "kt_gather";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_rank(comm, fn, "root", root));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, 1, dt));
  KT_CHECK(check_total(comm, fn, count, dt));
  if (comm->g.rank == root) {
    KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, (size_t)comm->g.size, dt));
    size_t n = count * kt_dtype_size(dt);
    KT_CHECK(check_overlap(comm, fn, sb, n, rb, n * (size_t)comm->g.size, sb == at(rb, n * (size_t)root),
                           "sendbuf == recvbuf + root x count on the root"));
  }
  kt__op o;
  op_init(&o, KT_COLL_GATHER, sb, rb, count, dt, 0, root);
  return issue(comm, &o, req);
}
kt_result kt_gather(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm) {
  return gather(sb, rb, n, dt, root, comm, NULL, false);
}
kt_result kt_igather(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm, kt_request *req) {
  return gather(sb, rb, n, dt, root, comm, req, true);
}

static kt_result scatter(const void *sb, void *rb, size_t count, kt_dtype dt, int root, kt_comm comm,
                         kt_request *req, bool nb) {
  const char *fn = nb ? "kt_iscatter" : "kt_scatter";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_rank(comm, fn, "root", root));
  KT_CHECK(check_total(comm, fn, count, dt));
  if (comm->g.rank == root) KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, (size_t)comm->g.size, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, 1, dt));
  if (comm->g.rank == root) {
    size_t n = count * kt_dtype_size(dt);
    KT_CHECK(check_overlap(comm, fn, sb, n * (size_t)comm->g.size, rb, n, rb == at(sb, n * (size_t)root),
                           "recvbuf == sendbuf + root x count on the root"));
  }
  kt__op o;
  op_init(&o, KT_COLL_SCATTER, sb, rb, count, dt, 0, root);
  return issue(comm, &o, req);
}
kt_result kt_scatter(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm) {
  return scatter(sb, rb, n, dt, root, comm, NULL, false);
}
kt_result kt_iscatter(const void *sb, void *rb, size_t n, kt_dtype dt, int root, kt_comm comm, kt_request *req) {
  return scatter(sb, rb, n, dt, root, comm, req, true);
}

/* ---- alltoall(v) -------------------------------------------------------- */

static kt_result alltoall(const void *sb, void *rb, size_t count, kt_dtype dt, kt_comm comm,
                          kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ialltoall" : "kt_alltoall";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, count, (size_t)comm->g.size, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, count, (size_t)comm->g.size, dt));
  size_t n = count * kt_dtype_size(dt) * (size_t)comm->g.size;
  KT_CHECK(check_overlap(comm, fn, sb, n, rb, n, sb == rb, "sendbuf == recvbuf"));
  kt__op o;
  op_init(&o, KT_COLL_ALLTOALL, sb, rb, count, dt, 0, 0);
  return issue(comm, &o, req);
}
kt_result kt_alltoall(const void *sb, void *rb, size_t n, kt_dtype dt, kt_comm comm) {
  return alltoall(sb, rb, n, dt, comm, NULL, false);
}
kt_result kt_ialltoall(const void *sb, void *rb, size_t n, kt_dtype dt, kt_comm comm, kt_request *req) {
  return alltoall(sb, rb, n, dt, comm, req, true);
}

static kt_result alltoallv(const void *sb, const size_t *sc, const size_t *sd, void *rb, const size_t *rc,
                           const size_t *rd, kt_dtype dt, kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ialltoallv" : "kt_alltoallv";
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  kt__op o;
  op_init(&o, KT_COLL_ALLTOALLV, sb, rb, 0, dt, 0, 0);
  KT_CHECK(copy_counts(comm, fn, "send", sc, sd, dt, sb, &o.counts, &o.displs));
  kt_result r = copy_counts(comm, fn, "receive", rc, rd, dt, rb, &o.counts2, &o.displs2);
  if (r == KT_SUCCESS && sb && sb == rb) {
    r = kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: in-place alltoallv is not supported (sendbuf == recvbuf)",
                comm->g.rank, fn);
  }
  if (r == KT_SUCCESS) {
    size_t es = kt_dtype_size(dt), sfrom, rfrom, sspan = v_span(o.counts, o.displs, comm->g.size, es, &sfrom),
                                      rspan = v_span(o.counts2, o.displs2, comm->g.size, es, &rfrom);
    r = check_overlap(comm, fn, at(sb, sfrom), sspan, at(rb, rfrom), rspan, false,
                      "in-place alltoallv is not supported");
  }
  if (r != KT_SUCCESS) {
    free(o.counts);
    free(o.displs);
    free(o.counts2);
    free(o.displs2);
    return r;
  }
  return issue(comm, &o, req);
}
kt_result kt_alltoallv(const void *sb, const size_t *sc, const size_t *sd, void *rb, const size_t *rc,
                       const size_t *rd, kt_dtype dt, kt_comm comm) {
  return alltoallv(sb, sc, sd, rb, rc, rd, dt, comm, NULL, false);
}
kt_result kt_ialltoallv(const void *sb, const size_t *sc, const size_t *sd, void *rb, const size_t *rc,
                        const size_t *rd, kt_dtype dt, kt_comm comm, kt_request *req) {
  return alltoallv(sb, sc, sd, rb, rc, rd, dt, comm, req, true);
}

/* ---- barrier ------------------------------------------------------------ */

static kt_result barrier(kt_comm comm, kt_request *req, bool nb) {
  const char *fn = nb ? "kt_ibarrier" : "kt_barrier";
  BEGIN(fn, nb);
  kt__op o;
  op_init(&o, KT_COLL_BARRIER, NULL, NULL, 0, KT_UINT8, 0, 0);
  return issue(comm, &o, req);
}
kt_result kt_barrier(kt_comm comm) { return barrier(comm, NULL, false); }
kt_result kt_ibarrier(kt_comm comm, kt_request *req) { return barrier(comm, req, true); }

/* ---- point to point ----------------------------------------------------- */

static kt_result p2p(kt__coll coll, const void *sbuf, void *rbuf, size_t count, kt_dtype dt, int peer,
                     int tag, kt_comm comm, kt_request *req, bool nb) {
  const char *fn = coll == KT_COLL_SEND ? (nb ? "kt_isend" : "kt_send") : (nb ? "kt_irecv" : "kt_recv");
  BEGIN(fn, nb);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_rank(comm, fn, "peer", peer));
  if (peer == comm->g.rank)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: peer is this rank (use a local copy)", comm->g.rank, fn);
  if (tag < 0) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: tag %d is negative", comm->g.rank, fn, tag);
  KT_CHECK(check_buf(comm, fn, "buf", coll == KT_COLL_SEND ? sbuf : rbuf, count, 1, dt));
  kt__op o;
  op_init(&o, coll, sbuf, rbuf, count, dt, 0, peer);
  o.tag = tag;
  return issue(comm, &o, req);
}
kt_result kt_send(const void *buf, size_t n, kt_dtype dt, int peer, int tag, kt_comm comm) {
  return p2p(KT_COLL_SEND, buf, NULL, n, dt, peer, tag, comm, NULL, false);
}
kt_result kt_isend(const void *buf, size_t n, kt_dtype dt, int peer, int tag, kt_comm comm, kt_request *req) {
  return p2p(KT_COLL_SEND, buf, NULL, n, dt, peer, tag, comm, req, true);
}
kt_result kt_recv(void *buf, size_t n, kt_dtype dt, int peer, int tag, kt_comm comm) {
  return p2p(KT_COLL_RECV, NULL, buf, n, dt, peer, tag, comm, NULL, false);
}
kt_result kt_irecv(void *buf, size_t n, kt_dtype dt, int peer, int tag, kt_comm comm, kt_request *req) {
  return p2p(KT_COLL_RECV, NULL, buf, n, dt, peer, tag, comm, req, true);
}

kt_result kt_sendrecv(const void *sb, size_t sc, int dst, void *rb, size_t rc, int src, kt_dtype dt, int tag,
                      kt_comm comm) {
  const char *fn = "kt_sendrecv";
  kt_request *req = NULL;
  BEGIN(fn, false);
  KT_CHECK(check_dtype(comm, fn, dt));
  KT_CHECK(check_rank(comm, fn, "dst", dst));
  KT_CHECK(check_rank(comm, fn, "src", src));
  if (tag < 0) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: tag %d is negative", comm->g.rank, fn, tag);
  if ((dst == comm->g.rank) != (src == comm->g.rank))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s: dst %d and src %d must both or neither be this rank",
                   comm->g.rank, fn, dst, src);
  KT_CHECK(check_buf(comm, fn, "sendbuf", sb, sc, 1, dt));
  KT_CHECK(check_buf(comm, fn, "recvbuf", rb, rc, 1, dt));
  KT_CHECK(check_overlap(comm, fn, sb, sc * kt_dtype_size(dt), rb, rc * kt_dtype_size(dt), false,
                         "sendrecv has no in-place form"));
  kt__op o;
  op_init(&o, KT_COLL_SENDRECV, sb, rb, sc, dt, 0, dst);
  o.count2 = rc;
  o.peer2 = src;
  o.tag = tag;
  return issue(comm, &o, req);
}
