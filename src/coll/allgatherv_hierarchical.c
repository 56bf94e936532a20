/* allgatherv_hierarchical.c - allgather(v) of a communicator that spans
 * hosts, every block moved straight into its place in recvbuf:
 *   1. the ranks of each host allgather their blocks (shared memory);
 *   2. local rank k of every host allgathers, with local rank k of the other
 *      hosts, the block of local rank k + tS of each host (TCP; all S at
 *      once, one `cross` communicator each; S the fewest ranks any host has;
 *      one round t for each multiple of S below the most ranks a host has);
 *   3. for each other host g and round t, the ranks of each host allgather
 *      what local ranks 0..S-1 received from g (shared memory).
 * Rounds where no host has a block of that index are skipped, so hosts of L
 * ranks each need one TCP phase and H - 1 shared-memory ones in step 3.
 *
 * Any counts (also 0) and displacements, any order of the ranks; allgather
 * (equal blocks, in place when sendbuf is its block of recvbuf) too. A rank
 * alone on its host skips the shared-memory phases.
 * Cost, H hosts, n bytes in all: over TCP, S concurrent allgathers of about
 * n/S among H ranks (ring: (H-1)/H of it received per rank), so every host's
 * link carries (H-1)/H n in and out, against a flat ring's steps between the
 * ranks of a host too; in memory, each rank copies its block in and every
 * other block of its host out (step 1), and each block from another host in
 * once (its holder) and out L - 1 times (step 3).
 * From 2 x KAITIAN_HIER_SEGMENT_BYTES in all, the blocks go in pieces whose
 * inter-host phases run on the cross communicator's thread (hier.c). */
#include "coll.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

kt_result kt__allgatherv_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  const kt__hosts *hs = c->hosts;
  int H = hs->n, L = local->size, me = local->rank, S = c->shards, h = hs->of[c->rank];
  size_t es = kt_dtype_size(op->dtype);
  bool v = op->coll == KT_COLL_ALLGATHERV;
  char *out = op->recvbuf;
#define CNT(r) (v ? op->counts[r] : op->count)
#define DSP(r) (v ? op->displs[r] : (size_t)(r) * op->count)
#define NLOCAL(g) (hs->first[(g) + 1] - hs->first[g])
#define RANK(g, j) (hs->rank[hs->first[g] + (j)])
/* Counts and displacements of a phase in which the rank with index i holds
 * the block of local rank j of host g (none when j is past g's ranks). */
#define HOLD(counts, displs, i, g, j)                             \
  do {                                                            \
    bool has_ = (j) < NLOCAL(g);                                  \
    (counts)[i] = has_ ? CNT(RANK(g, j)) : 0;                     \
    (displs)[i] = has_ ? DSP(RANK(g, j)) : 0;                     \
  } while (0)
/* Where a phase's block lies in recvbuf (recvbuf may be NULL when empty). */
#define AT(count, displ) ((count) ? out + (displ) * es : out)

  int most = 0; /* the most ranks a host has */
  for (int g = 0; g < H; g++) most = KT_MAX(most, NLOCAL(g));
  /* The parent's scratch (its own algorithms never run during the phases). */
  size_t *lcounts = kt__scratch(c, 2 * ((size_t)L + (size_t)H) * sizeof(size_t));
  if (!lcounts) return kt__err(KT_ERR_NO_MEMORY, "%s: out of memory", kt__coll_name(op->coll));
  size_t *ldispls = lcounts + L, *xcounts = ldispls + L, *xdispls = xcounts + H;

  /* Segments: each block cut into K pieces, piece q of all three steps at a
   * time, the inter-host allgathers (step 2) on the cross communicator's
   * thread: every local rank runs step 1 of piece 0, step 1 of piece 1, step
   * 3 of piece 0, step 1 of piece 2, ..., so that piece q crosses while the
   * host gathers q + 1 and hands on q - 1. */
  size_t total = 0, least = SIZE_MAX; /* elements in all, and of the smallest non-empty block */
  for (int r = 0; r < c->size; r++) {
    total += CNT(r);
    if (CNT(r)) least = KT_MIN(least, CNT(r));
  }
  int rounds = (most + S - 1) / S; /* of step 2 */
  int K = total ? kt__hier_segments(c, total * es, KT_MIN(least, (size_t)KT_HIER_MAX_SEGMENTS * 4 / (size_t)rounds)) : 1;
  if (K > 1) {
    kt__xpipe xp = {0};
    kt_result r = KT_SUCCESS;
    if (L == 1 && CNT(c->rank) && op->sendbuf != out + DSP(c->rank) * es) /* alone: step 1 is this copy */
      memcpy(out + DSP(c->rank) * es, op->sendbuf, CNT(c->rank) * es);
    for (int q = 0; q <= K && r == KT_SUCCESS; q++) {
      if (q < K && L > 1) { /* 1. Piece q of the host's blocks. */
        for (int j = 0; j < L; j++) HOLD(lcounts, ldispls, j, h, j);
        kt__hier_narrow(lcounts, ldispls, L, K, q, lcounts, ldispls);
        size_t lo, hi;
        kt__hier_piece(CNT(c->rank), K, q, &lo, &hi);
        kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = hi > lo ? (const char *)op->sendbuf + lo * es : op->sendbuf,
                     .recvbuf = out,
                     .count = hi - lo, .dtype = op->dtype, .counts = lcounts, .displs = ldispls};
        r = kt__hier_phase(ex, local, &ag, "intra-host allgather");
      }
      /* 2. Piece q of local rank me + tS of every host, issued. */
      for (int j = me; q < K && cross && j < most && r == KT_SUCCESS; j += S) {
        /* The op owns its count arrays (kt__issue): freed when it is waited for. */
        size_t *xc = malloc((size_t)cross->size * sizeof *xc), *xd = malloc((size_t)cross->size * sizeof *xd);
        if (!xc || !xd) {
          free(xc);
          free(xd);
          r = kt__err(KT_ERR_NO_MEMORY, "%s: out of memory", kt__coll_name(op->coll));
          break;
        }
        for (int i = 0; i < cross->size; i++) HOLD(xc, xd, i, hs->of[cross->label[i]], j);
        kt__hier_narrow(xc, xd, cross->size, K, q, xc, xd);
        size_t mine = xc[cross->rank];
        kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = AT(mine, xd[cross->rank]), .recvbuf = out, .count = mine,
                     .dtype = op->dtype, .counts = xc, .displs = xd};
        r = kt__xpipe_issue(ex, &xp, &ag);
      }
      if (q == 0 || r != KT_SUCCESS) continue;
      /* 3. Piece q - 1 of what local ranks 0..S-1 received, to the whole host. */
      for (int j = me; j < most && cross && r == KT_SUCCESS; j += S) r = kt__xpipe_wait(ex, &xp, "inter-host allgather");
      for (int g = 0; g < H && L > 1 && r == KT_SUCCESS; g++)
        for (int t = 0; g != h && t * S < NLOCAL(g) && r == KT_SUCCESS; t++) {
          for (int j = 0; j < L; j++) {
            if (j < S) HOLD(lcounts, ldispls, j, g, j + t * S);
            else lcounts[j] = ldispls[j] = 0;
          }
          kt__hier_narrow(lcounts, ldispls, L, K, q - 1, lcounts, ldispls);
          kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = AT(lcounts[me], ldispls[me]), .recvbuf = out,
                       .count = lcounts[me], .dtype = op->dtype, .counts = lcounts, .displs = ldispls};
          r = kt__hier_phase(ex, local, &ag, "intra-host allgather of another host's blocks");
        }
    }
    return kt__xpipe_end(ex, &xp, r);
  }
  /* 1. The host's blocks, into place on every rank of the host. */
  if (L > 1) {
    for (int j = 0; j < L; j++) HOLD(lcounts, ldispls, j, h, j);
    kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = op->sendbuf, .recvbuf = out, .count = CNT(c->rank),
                 .dtype = op->dtype, .counts = lcounts, .displs = ldispls};
    KT_CHECK(kt__hier_phase(ex, local, &ag, "intra-host allgather"));
  } else if (CNT(c->rank) && op->sendbuf != out + DSP(c->rank) * es) {
    memcpy(out + DSP(c->rank) * es, op->sendbuf, CNT(c->rank) * es);
  }
  /* 2. Local rank me + tS of every host, to local rank me of every host. */
  for (int j = me; cross && j < most; j += S) {
    for (int i = 0; i < cross->size; i++) HOLD(xcounts, xdispls, i, hs->of[cross->label[i]], j);
    size_t mine = xcounts[cross->rank];
    kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = AT(mine, xdispls[cross->rank]), .recvbuf = out,
                 .count = mine, .dtype = op->dtype, .counts = xcounts, .displs = xdispls};
    KT_CHECK(kt__hier_phase(ex, cross, &ag, "inter-host allgather"));
  }
  /* 3. What local ranks 0..S-1 received of host g, round t, to the whole host. */
  for (int g = 0; g < H && L > 1; g++)
    for (int t = 0; g != h && t * S < NLOCAL(g); t++) {
      for (int j = 0; j < L; j++) {
        if (j < S) HOLD(lcounts, ldispls, j, g, j + t * S);
        else lcounts[j] = ldispls[j] = 0;
      }
      kt__op ag = {.coll = KT_COLL_ALLGATHERV, .sendbuf = AT(lcounts[me], ldispls[me]), .recvbuf = out,
                   .count = lcounts[me], .dtype = op->dtype, .counts = lcounts, .displs = ldispls};
      KT_CHECK(kt__hier_phase(ex, local, &ag, "intra-host allgather of another host's blocks"));
    }
#undef CNT
#undef DSP
#undef NLOCAL
#undef RANK
#undef HOLD
#undef AT
  return KT_SUCCESS;
}
