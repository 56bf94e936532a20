/* shm.h - shared-memory transport between the ranks of a communicator that
 * share a host.
 *
 * One POSIX shared-memory segment per communicator holds a header, one slot
 * per local rank (a step counter, the rank's pid, its op signatures) and four
 * data regions per rank: in[2] and out[2], double-buffered by iteration
 * parity. Algorithms run in iterations; in each, every rank posts (raises its
 * step counter) the same number of times, so counters agree across ranks and
 * "peer r has reached step s" means the same on every rank. A rank waits for
 * peers' counters by spinning briefly, then sleeping on a futex; while it
 * waits it watches for failures (a dead pid, a peer's failure notice, an
 * abort, the deadline). Mismatched operations are caught by comparing the
 * signatures every rank writes before its first post of an op.
 *
 * Point-to-point messages use a separate byte ring per ordered pair of ranks
 * (single producer, single consumer): a 32-byte header (tag, length) then the
 * payload, streamed through the ring in issue order. */
#ifndef KT_SHM_H
#define KT_SHM_H

#include "transport.h"

typedef struct kt__shm kt__shm;

/* Set up the segment among the ranks of c (all on this host; c->size >= 2)
 * after the TCP mesh exists; owed: the sum of kt__shm_owed() over its ranks
 * (room the new segment must leave free). On failure nothing is left in
 * /dev/shm. */
KT_INTERNAL kt_result kt__shm_setup(kt__group *c, uint64_t owed);
/* Bytes of /dev/shm this process's communicators counted for their
 * point-to-point rings and have not reserved yet. */
KT_INTERNAL uint64_t kt__shm_owed(void);
KT_INTERNAL void kt__shm_close(kt__group *c);
/* Record a failure in the segment so local peers fail at once too. */
KT_INTERNAL void kt__shm_fail(kt__group *c, kt_result r, const char *msg);
/* Wake local waiters (abort). Safe from any thread. */
KT_INTERNAL void kt__shm_wake(kt__group *c);

/* ---- for algorithms ---------------------------------------------------- */

/* More ranks share this host than they have CPUs (the same on every rank). */
KT_INTERNAL bool kt__shm_oversubscribed(const kt__group *c);
/* Bytes of each data region. */
KT_INTERNAL size_t kt__shm_region_bytes(const kt__group *c);
/* Region of local rank r: which 0 = in, 1 = out; par = iteration parity. */
KT_INTERNAL char *kt__shm_region(const kt__group *c, int r, int which, int par);

/* Start an op: publish this rank's signature of ex->op. */
KT_INTERNAL void kt__shm_op_begin(kt__exec *ex);
/* Start an iteration: waits until every peer has finished reading the
 * buffers of parity *par from two iterations ago. */
KT_INTERNAL kt_result kt__shm_iter_begin(kt__exec *ex, int *par);
/* Post: raise this rank's step counter (and wake sleepers). Returns the new
 * step value. */
KT_INTERNAL uint64_t kt__shm_post(kt__exec *ex);
/* Wait until peer r's step (r = -1: every rank's) is at least target. On the
 * first wait of an op, the signatures of the ranks waited for are checked. */
KT_INTERNAL kt_result kt__shm_wait(kt__exec *ex, int r, uint64_t target);
/* Send slen bytes to dst and/or receive rlen bytes from src (-1: none) with
 * tag, both at once. A message with another tag or length is a
 * KT_ERR_MISMATCH naming both sides. */
KT_INTERNAL kt_result kt__shm_p2p(kt__exec *ex, int dst, const void *sbuf, size_t slen, int src, void *rbuf,
                                  size_t rlen, uint32_t tag);
/* The small-message protocol (up to KT_SHM_LL_MAX bytes per rank): each
 * op, every rank posts its payload (NULL, 0: none) with kt__shm_ll_post;
 * kt__shm_ll_wait(r) waits until rank r has posted this op (-1: every rank;
 * r == this rank: nobody) and compares the signatures of those waited for;
 * kt__shm_ll_read then copies bytes from offset off of rank r's payload (r
 * may be this rank). Flag and data share cache lines; no step counter
 * moves. A rank waits only for what it reads and may run a few small ops
 * ahead of the others (shm.c says how far, and when the other signatures
 * are compared). */
#define KT_SHM_LL_LINES 80 /* lines per small-message slot */
#define KT_SHM_LL_MAX (32 + (KT_SHM_LL_LINES - 1) * 56) /* payload bytes: line 0 holds 32, the others 56 */
KT_INTERNAL kt_result kt__shm_ll_post(kt__exec *ex, const void *payload, size_t bytes);
KT_INTERNAL kt_result kt__shm_ll_wait(kt__exec *ex, int r);
KT_INTERNAL kt_result kt__shm_ll_read(kt__exec *ex, int r, size_t off, void *dst, size_t bytes);
/* Small per-iteration value published with the next post (alltoallv). */
KT_INTERNAL void kt__shm_set_aux(kt__exec *ex, int par, uint64_t v);
KT_INTERNAL uint64_t kt__shm_get_aux(kt__exec *ex, int r, int par);
/* A second such value (the single-copy algorithms: the broadcast's share,
 * a permit to write). kt__shm_next_step: the step the next post publishes. */
KT_INTERNAL uint64_t kt__shm_next_step(kt__exec *ex);
KT_INTERNAL void kt__shm_set_aux2(kt__exec *ex, int par, uint64_t v);
KT_INTERNAL uint64_t kt__shm_get_aux2(kt__exec *ex, int r, int par);

/* Single copy by the kernel (process_vm_readv/writev), cma_shm.c.
 * kt__shm_cma_ok tells whether every rank can read and write every other's
 * memory; the first call on a communicator runs a probe of two iterations,
 * so every rank must call it at the same point of the same op.
 * kt__shm_cma_read copies bytes at addr in rank r's address space (published
 * with kt__shm_set_aux) into dst; kt__shm_cma_write copies src there. */
KT_INTERNAL kt_result kt__shm_cma_ok(kt__exec *ex, bool *ok);
KT_INTERNAL kt_result kt__shm_cma_read(kt__exec *ex, int r, uint64_t addr, void *dst, size_t bytes);
KT_INTERNAL kt_result kt__shm_cma_write(kt__exec *ex, int r, uint64_t addr, const void *src, size_t bytes);

/* Single-copy allreduce (allreduce_shm_direct.c). After the op's first
 * kt__shm_iter_begin and before its first post: offer this rank's buffers
 * when both are registered (kt_mem_register), the message has at least
 * KAITIAN_SHM_DIRECT_BYTES and no earlier mapping failed; returns whether it
 * offered. After the first wait, kt__shm_direct_offered tells whether rank r
 * did. When all did: kt__shm_direct_map maps every peer's buffers (send[r],
 * recv[r]; bytes each) and publishes whether that worked with the next post
 * (a failure is logged and stops later offers); after that post's wait,
 * kt__shm_direct_ok(r) is rank r's verdict. All by the parity of the
 * iteration begun last. */
KT_INTERNAL bool kt__shm_direct_offer(kt__exec *ex, const void *send, const void *recv, size_t bytes);
KT_INTERNAL bool kt__shm_direct_offered(kt__exec *ex, int r);
KT_INTERNAL bool kt__shm_direct_map(kt__exec *ex, char **send, char **recv, size_t bytes);
KT_INTERNAL bool kt__shm_direct_ok(kt__exec *ex, int r);

#endif /* KT_SHM_H */
