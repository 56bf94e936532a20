/* coll.h - collective algorithms and their selection.
 *
 * Every algorithm has the same signature: it runs ex->op on ex->group and
 * returns a kt_result. Each lives in its own file, opened by a comment giving
 * the algorithm, its restrictions and its cost. tuner.c decides which runs. */
#ifndef KT_COLL_H
#define KT_COLL_H

#include "reduce/reduce.h"
#include "transport/transport.h"

#include <string.h>

typedef kt_result (*kt__algo_fn)(kt__exec *ex);

/* How a hierarchical algorithm runs the phases of its op on the groups of
 * child communicators without calling up into core, which lends these
 * through the op's context (ex->phases, core/execute.c): run one now on this
 * thread (a phase, with the parent's deadline; it takes the child's next op
 * number), or issue one to a child's progress thread, wait for it (watching
 * the parent's peers: kt__wait_watching) or for its end after stopping the
 * child (a failure). */
typedef struct kt__phases {
  kt_result (*run)(kt__group *child, kt__op *op, kt__exec *parent);
  kt_result (*issue)(kt__group *child, kt__op *op, kt_request *req_out);
  kt_result (*wait_watching)(kt_request req, kt__exec *ex, const char *what, bool *consumed);
  kt_result (*wait)(kt_request req);
  void (*stop)(kt__group *child, kt_result r);
} kt__phases;

/* Algorithms (src/coll/<coll>_<name>.c). */
KT_INTERNAL kt_result kt__allreduce_ring(kt__exec *ex);
KT_INTERNAL kt_result kt__allreduce_recursive_doubling(kt__exec *ex);
KT_INTERNAL kt_result kt__allreduce_halving_doubling(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_binomial(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_pipeline(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_binomial(kt__exec *ex);
/* An algorithm of the table (tuner.c): the collective it runs, its name,
 * its function, where it can run (tuner.c's enum). */
typedef struct kt__algo {
  kt__coll coll;
  const char *name;
  kt__algo_fn fn;
  int needs;
} kt__algo;
/* The algorithm that runs op on c (the tuner's choice, KAITIAN_ALGO
 * included; a phase of a hierarchical op takes the tuner's own pick and is
 * not counted in kt__algos_run); NULL when none can run it. */
KT_INTERNAL const kt__algo *kt__algo_pick(kt__group *c, const kt__op *op, bool phase);

/* The communicator's scratch buffer of at least n bytes (scratch.c): grown
 * on demand, valid until the next call; NULL (error set) when out of memory. */
KT_INTERNAL void *kt__scratch(kt__group *c, size_t n);

KT_INTERNAL kt_result kt__allgatherv_ring(kt__exec *ex);   /* allgather too */
KT_INTERNAL kt_result kt__reduce_scatter_ring(kt__exec *ex);
KT_INTERNAL kt_result kt__gather_linear(kt__exec *ex);
KT_INTERNAL kt_result kt__scatter_linear(kt__exec *ex);
KT_INTERNAL kt_result kt__alltoallv_pairwise(kt__exec *ex); /* alltoall too */
KT_INTERNAL kt_result kt__barrier_dissemination(kt__exec *ex);
KT_INTERNAL kt_result kt__p2p(kt__exec *ex);                /* send, recv, sendrecv */
/* Point to point on any transport: move sends slen bytes to dst and/or
 * receives rlen bytes from src (-1: that direction unused). */
typedef kt_result (*kt__p2p_move_fn)(kt__exec *ex, int dst, const void *sbuf, size_t slen, int src,
                                     void *rbuf, size_t rlen, uint32_t tag);
KT_INTERNAL kt_result kt__p2p_run(kt__exec *ex, kt__p2p_move_fn move);
/* Shared memory (every rank on this host). */
KT_INTERNAL kt_result kt__allreduce_shm_oneshot(kt__exec *ex);
/* Small messages through shared memory, flag beside payload (ll_shm.c). */
KT_INTERNAL kt_result kt__allreduce_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__allgather_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__gather_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__scatter_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_scatter_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_shm_cma(kt__exec *ex);
KT_INTERNAL kt_result kt__scatter_shm_cma(kt__exec *ex);
KT_INTERNAL kt_result kt__gather_shm_cma(kt__exec *ex);
KT_INTERNAL kt_result kt__allgather_shm_cma(kt__exec *ex);
KT_INTERNAL kt_result kt__alltoall_shm_cma(kt__exec *ex);
KT_INTERNAL kt_result kt__alltoall_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__barrier_shm_ll(kt__exec *ex);
KT_INTERNAL kt_result kt__allreduce_shm_rsag(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_shm_oneshot(kt__exec *ex);
KT_INTERNAL kt_result kt__allgatherv_shm(kt__exec *ex);     /* allgather too */
KT_INTERNAL kt_result kt__reduce_scatter_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__gather_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__scatter_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__alltoallv_shm(kt__exec *ex);      /* alltoall too */
KT_INTERNAL kt_result kt__barrier_shm(kt__exec *ex);
KT_INTERNAL kt_result kt__p2p_shm(kt__exec *ex);            /* send, recv, sendrecv */
/* Several hosts, shared memory within each (c->local; c->cross only on local ranks below c->shards). */
KT_INTERNAL kt_result kt__allreduce_hierarchical(kt__exec *ex);
KT_INTERNAL kt_result kt__broadcast_hierarchical(kt__exec *ex);
KT_INTERNAL kt_result kt__reduce_hierarchical(kt__exec *ex);
KT_INTERNAL kt_result kt__allgatherv_hierarchical(kt__exec *ex); /* allgather too */
KT_INTERNAL kt_result kt__reduce_scatter_hierarchical(kt__exec *ex);
KT_INTERNAL kt_result kt__barrier_hierarchical(kt__exec *ex);

/* What the hierarchical algorithms share (hier.c). */
/* Run op as a phase of ex's op on child (c->local or c->cross), within the
 * parent's deadline; `partial` is set (AVG only sums) and the error text says
 * which phase failed, or names a dead peer by its rank in the parent. */
KT_INTERNAL kt_result kt__hier_phase(kt__exec *ex, kt__group *child, kt__op *op, const char *what);
/* n elements cut into S shards for the L ranks of a host (S <= L): local
 * rank r < S holds counts[r] elements at displs[r] (they differ by at most
 * one), the others none (at the end). */
KT_INTERNAL void kt__hier_shards(size_t n, int S, int L, size_t *counts, size_t *displs);
/* The rank in c->cross of its member on host (c->hosts numbering). */
KT_INTERNAL int kt__hier_cross_rank(const kt__group *c, int host);

/* Segments (docs/algorithms.md, "Segments"): how many a hierarchical op of
 * bytes on c cuts its message into (KAITIAN_HIER_SEGMENT_BYTES; at most
 * KT_HIER_MAX_SEGMENTS and at most most_pieces, so that every piece has an
 * element; none, unless KAITIAN_HIER_SEGMENT_BYTES is set, where c's links
 * were measured at KT_FAST_LINK_BPUS or more); 1: none. The same on
 * every rank for the same op (c->link_bpus is agreed). */
#define KT_HIER_MAX_SEGMENTS 16
KT_INTERNAL int kt__hier_segments(const kt__group *c, size_t bytes, size_t most_pieces);
/* Piece j of k of count elements: [*lo, *hi). */
static inline void kt__hier_piece(size_t count, int k, int j, size_t *lo, size_t *hi) {
  *lo = count / (size_t)k * (size_t)j + KT_MIN((size_t)j, count % (size_t)k);
  *hi = count / (size_t)k * (size_t)(j + 1) + KT_MIN((size_t)(j + 1), count % (size_t)k);
}
/* Piece j of k of each of n blocks (counts[i] elements at displs[i]) into
 * cj, dj (which may be counts, displs). */
KT_INTERNAL void kt__hier_narrow(const size_t *counts, const size_t *displs, int n, int k, int j, size_t *cj,
                                 size_t *dj);
/* Inter-host phases issued to the cross communicator's progress thread, in
 * order, while the caller runs the shared-memory ones: issue, then wait for
 * the oldest (watching the parent's peers and deadline meanwhile); end()
 * before returning, with the op's result: on failure it stops the cross
 * communicator and waits for what is still issued, so that nothing touches
 * the buffers after the op. */
typedef struct kt__xpipe {
  kt_request req[KT_HIER_MAX_SEGMENTS * 4];
  int issued, waited;
} kt__xpipe;
KT_INTERNAL kt_result kt__xpipe_issue(kt__exec *ex, kt__xpipe *xp, kt__op *op);
KT_INTERNAL kt_result kt__xpipe_wait(kt__exec *ex, kt__xpipe *xp, const char *what);
KT_INTERNAL kt_result kt__xpipe_end(kt__exec *ex, kt__xpipe *xp, kt_result r);

/* Non-powers of two in recursive doubling and halving-doubling
 * (allreduce_recursive_doubling.c): of p ranks, the first 2r (r = p - q, q
 * the largest power of two <= p, kt__fold_pof2) pair up. kt__fold_in: the
 * even one of a pair sends its input `in` to the odd one and sets *newrank to
 * -1 (it sits out); the odd one reduces it with its own into buf (lower
 * rank's data first; tmp holds the message) and gets *newrank = r / 2; the
 * others r - rem. buf may equal in. kt__fold_out, after the power-of-two
 * part: the odd one hands the result in buf back. Tags 0 and 1000. */
KT_INTERNAL int kt__fold_pof2(int p);
KT_INTERNAL kt_result kt__fold_in(kt__exec *ex, const char *in, char *buf, char *tmp, int *newrank);
KT_INTERNAL kt_result kt__fold_out(kt__exec *ex, char *buf);

/* Which algorithms ops of collective `coll` (its name: "allreduce", ...)
 * issued on c have run, not counting the phases of hierarchical ones
 * (tuner.c): their names, comma-separated in the tuner's table order, into
 * buf (cut short at cap); "" when none or coll is unknown. Returns buf. For
 * tests: coll_test --algo checks that a forced run (KAITIAN_ALGO) ran the
 * algorithm it names and no other, since the tuner falls back to its own
 * pick when the forced one cannot run a call. */
KT_INTERNAL const char *kt__algos_run(kt__group *c, const char *coll, char *buf, size_t cap);
/* The algorithm the tuner would run for this call on c (KAITIAN_ALGO
 * included), without running it: kaitian bench --thresholds. */
KT_INTERNAL const char *kt__algo_for(kt__group *c, kt__coll coll, const void *sendbuf, void *recvbuf,
                                     size_t count, kt_dtype dtype, kt_op op, int root);

/* Ring steps shared by allreduce, reduce_scatter and allgather (ring.c).
 * Block b of the data is len[b] bytes; at step k this rank sends block
 * (start - k) mod p to the next rank and receives block (start - k - 1) mod p
 * from the previous one. The first rs_steps steps reduce what arrives into
 * work[b] = in[b] OP received (through tmp); the rest copy it into work[b].
 * What step k receives is what step k + 1 sends, streamed chunk by chunk as it
 * is reduced, so network and reduction overlap. Step 0 sends from in[start].
 * tmp holds the largest block (may be NULL when rs_steps is 0). */
typedef struct kt__ring {
  int start;
  int rs_steps, ag_steps;
  const char *const *in;
  char *const *work;
  const size_t *len;
  char *tmp;
  uint32_t tag_base;
  /* Optional: copy_len bytes from copy_from to copy_to, done a chunk at a
   * time while the ring would otherwise wait on its sockets (allgather's own
   * block, sent from the caller's buffer meanwhile). */
  const char *copy_from;
  char *copy_to;
  size_t copy_len;
} kt__ring;
KT_INTERNAL kt_result kt__ring_run(kt__exec *ex, const kt__ring *rg);

/* Bytes per pipelining chunk for dtype (a multiple of the element size). */
KT_INTERNAL size_t kt__chunk_bytes(kt_dtype dt);

static inline int kt__mod(int a, int p) { return ((a % p) + p) % p; }

/* Bytes a shm algorithm reduces at a time before putting the result into
 * shared memory with kt__copy_shared: small enough to stay in L1. Reduction
 * kernels store with vector stores, which into lines a peer has read (the
 * shm regions, every chunk) wait for the peer's copy to be invalidated line
 * by line; measured on a 2-vCPU AMD EPYC VM, such stores ran at 7 GB/s
 * against 37 GB/s for rep movsb. */
#define KT_SHM_BLOCK 8192

/* Whether an op that writes this many bytes of results, all ranks' together,
 * writes them with non-temporal stores (kt__copy_stream, then
 * kt__stream_fence before the op completes): KAITIAN_SHM_STREAM_BYTES. */
static inline bool kt__stream_output(size_t total_bytes) {
  size_t sb = kt__stream_min_bytes();
  return sb > 0 && total_bytes >= sb;
}
/* Bytes of results one rank writes in op (its recvbuf), for the collectives
 * that have hierarchical algorithms. */
static inline size_t kt__op_result_bytes(const kt__op *op, int p) {
  size_t n = op->count;
  if (op->coll == KT_COLL_ALLGATHERV && op->counts) {
    n = 0;
    for (int r = 0; r < p; r++) n += op->counts[r];
  } else if (op->coll == KT_COLL_ALLGATHER) {
    n *= (size_t)p;
  } else if (op->coll == KT_COLL_BARRIER) {
    n = 0;
  }
  return n * kt_dtype_size(op->dtype);
}
/* kt__stream_output for op ex, which writes total_bytes; a phase of a
 * hierarchical op also streams when the parent op's results on this host
 * (this child's ranks x one rank's) would: the phases of a segmented op are
 * small, but what they write together does not stay cached either. */
static inline bool kt__stream_output_ex(const kt__exec *ex, size_t total_bytes) {
  if (kt__stream_output(total_bytes)) return true;
  const kt__exec *top = ex->parent;
  if (!top) return false;
  size_t writers = top->op->coll == KT_COLL_REDUCE ? 1 : (size_t)ex->group->size; /* a reduce: the root */
  return kt__stream_output(kt__op_result_bytes(top->op, top->group->size) * writers);
}
/* memcpy, or kt__copy_stream when stream. */
static inline void kt__copy_out(bool stream, void *dst, const void *src, size_t n) {
  if (stream) kt__copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}

/* The reduce-scatter step of the shm reductions (reduce_shm.c): reduce
 * elements [lo, lo + cnt) of the current chunk across all ranks, in rank
 * order, rank r's part read from its region 0 of parity par and this rank's
 * from own, a block of KT_SHM_BLOCK bytes at a time on the stack. Each block
 * is finalized, copied to out (when not NULL; with non-temporal stores when
 * stream, the caller fences) and put into res with kt__copy_shared. own may
 * equal out (in place). */
KT_INTERNAL void kt__shm_reduce_share(kt__exec *ex, kt__reduce_fn reduce, int par, size_t lo, size_t cnt,
                                      const char *own, char *out, bool stream, char *res);

/* Single-copy allreduce (allreduce_shm_direct.c), for the shm allreduce
 * algorithms. Between its first kt__shm_iter_begin and its first post an
 * algorithm calls kt__shm_direct_offer and, when it offered, skips copying its
 * input in. After that post's wait,
 * when the message has at least KAITIAN_SHM_DIRECT_BYTES (the same on every
 * rank, as every tuning parameter), it calls this: if every rank offered and
 * every rank could map the others' buffers, the whole op runs single-copy and
 * *done is set; otherwise a rank that offered runs copy_in(ex, arg) after all,
 * every rank posts once more and waits, and the algorithm goes on as if it
 * had copied in at first. */
KT_INTERNAL kt_result kt__allreduce_shm_direct(kt__exec *ex, bool offered, void (*copy_in)(kt__exec *, void *),
                                               void *arg, bool *done);

/* The last step of a reduction of p ranks: AVG divides by p, unless the op
 * is a phase of a parent's op (the parent divides once, by its own size). */
static inline void kt__op_finalize(const kt__op *op, void *buf, size_t n, int p) {
  if (!op->partial) kt__reduce_finalize(buf, n, op->dtype, op->op, p);
}

#endif /* KT_COLL_H */
