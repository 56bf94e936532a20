/* reduce_scatter_hierarchical.c - reduce_scatter of a communicator that spans
 * hosts. The p blocks fall into S classes (S the fewest ranks any host has):
 * class k holds the blocks of the ranks whose local index j has j mod S = k.
 *   1. The ranks of each host reduce-scatter the classes through shared
 *      memory, so that local rank k holds class k summed over its host (one
 *      phase per host g and round t, in which local rank k gets block
 *      (g, k + tS) straight from the inputs);
 *   2. local rank k of every host reduce-scatters class k over TCP (all S at
 *      once, one `cross` communicator each), which leaves it the blocks of
 *      its own host's class-k ranks fully reduced: its own block, and on a
 *      host with more than S ranks those of local ranks k + S, k + 2S, ...;
 *   3. which get theirs through shared memory (alltoallv).
 * Class k lies in local rank k's scratch host by host, so the TCP phase is
 * one contiguous reduce-scatter whatever the order of the ranks; between
 * hosts of different sizes its blocks are uneven (an uneven ring).
 *
 * Any count, in place or not; a rank alone on its host skips the
 * shared-memory phases. AVG sums in every phase (they are `partial`) and each
 * block is divided once, by the communicator's size, where its reduction
 * completes.
 * Cost, H hosts, n = p x count bytes of input: an intra-host reduce-scatter
 * of n (H phases when the hosts are alike), S concurrent ring reduce-scatters
 * of about n/S among H ranks ((H-1)/H of it sent per rank), so every host's
 * link carries about (H-1)/H n, against a flat ring's TCP steps between the
 * ranks of a host too.
 * Where every host has S > 1 ranks, from 2 x KAITIAN_HIER_SEGMENT_BYTES of
 * input, in segments whose inter-host phases run on the cross communicator's
 * thread (hier.c). */
#include "coll.h"

#include <stdlib.h>
#include <string.h>

kt_result kt__reduce_scatter_hierarchical(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group, *local = c->local, *cross = c->cross;
  const kt__hosts *hs = c->hosts;
  int H = hs->n, L = local->size, me = local->rank, S = c->shards, h = hs->of[c->rank];
  size_t es = kt_dtype_size(op->dtype), m = op->count, bytes = m * es;
  const char *in = op->sendbuf;
  char *out = op->recvbuf;
#define NLOCAL(g) (hs->first[(g) + 1] - hs->first[g])
#define RANK(g, j) (hs->rank[hs->first[g] + (j)])
/* Blocks of class k on host g. */
#define NCLASS(k, g) ((k) < NLOCAL(g) ? (NLOCAL(g) - (k) + S - 1) / S : 0)

  /* The parent's scratch (its own algorithms never run during the phases):
   * zoff[g], where host g's part of my class starts in Z (in elements); the
   * phases' counts and displacements; then Z, my class (none from S on). */
  size_t arrays = (3 * (size_t)H + 6 * (size_t)L) * sizeof(size_t), at = (arrays + 63) / 64 * 64, zlen = 0;
  for (int g = 0; g < H && me < S; g++) zlen += (size_t)NCLASS(me, g) * m;
  size_t *zoff = kt__scratch(c, at + zlen * es);
  if (!zoff) return kt__err(KT_ERR_NO_MEMORY, "reduce_scatter: out of memory");
  size_t *xcounts = zoff + H, *xdispls = xcounts + H, *lcounts = xdispls + H, *ldispls = lcounts + L;
  size_t *a2a = ldispls + L; /* 4 L: send counts, send displs, receive counts, receive displs */
  char *Z = (char *)zoff + at;
  for (int g = 0, z = 0; g < H; z += me < S ? NCLASS(me, g) : 0, g++) zoff[g] = (size_t)z * m;

  /* Segments, where every host has S > 1 ranks (one block per class and
   * host, so a piece of each block is contiguous in Z and nothing is handed
   * over): each block's elements cut into K pieces; piece q of step 1 runs
   * while piece q - 1 crosses (its reduce-scatter issued to the cross
   * communicator's thread). */
  bool even = S > 1;
  for (int g = 0; g < H; g++) even = even && NLOCAL(g) == S;
  int K = even ? kt__hier_segments(c, bytes * (size_t)c->size, m) : 1;
  if (K > 1) {
    kt__xpipe xp = {0};
    kt_result r = KT_SUCCESS;
    for (int q = 0; q <= K && r == KT_SUCCESS; q++) {
      size_t lo, hi;
      kt__hier_piece(m, K, KT_MIN(q, K - 1), &lo, &hi); /* q = K: nothing to issue */
      for (int g = 0; q < K && g < H && r == KT_SUCCESS; g++) { /* 1. Piece q, block (g, k) to local rank k. */
        for (int k = 0; k < L; k++) {
          lcounts[k] = hi - lo;
          ldispls[k] = (size_t)RANK(g, k) * m + lo;
        }
        kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = in, .recvbuf = Z + (zoff[g] + lo) * es,
                     .count = (hi - lo) * (size_t)L, .dtype = op->dtype, .op = op->op, .counts = lcounts,
                     .displs = ldispls};
        r = kt__hier_phase(ex, local, &rs, "intra-host reduce-scatter");
      }
      if (q < K && r == KT_SUCCESS) { /* 2. Piece q over the hosts, issued; the op owns its arrays. */
        size_t *xc = malloc((size_t)H * sizeof *xc), *xd = malloc((size_t)H * sizeof *xd);
        if (!xc || !xd) {
          free(xc);
          free(xd);
          r = kt__err(KT_ERR_NO_MEMORY, "reduce_scatter: out of memory");
          break;
        }
        for (int i = 0; i < cross->size; i++) {
          xc[i] = hi - lo;
          xd[i] = zoff[hs->of[cross->label[i]]] + lo;
        }
        kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = Z, .recvbuf = out + lo * es,
                     .count = (hi - lo) * (size_t)H, .dtype = op->dtype, .op = op->op, .counts = xc, .displs = xd};
        r = kt__xpipe_issue(ex, &xp, &rs);
      }
      if (q == 0 || r != KT_SUCCESS) continue;
      kt__hier_piece(m, K, q - 1, &lo, &hi);
      r = kt__xpipe_wait(ex, &xp, "inter-host reduce-scatter");
      if (r == KT_SUCCESS) kt__op_finalize(op, out + lo * es, hi - lo, c->size);
    }
    return kt__xpipe_end(ex, &xp, r);
  }

  /* 1. Class me summed over the host into Z: block (g, k + tS) to local rank k. */
  for (int g = 0; g < H && L > 1; g++)
    for (int t = 0; t * S < NLOCAL(g); t++) {
      size_t total = 0;
      for (int k = 0; k < L; k++) {
        bool has = k < S && k + t * S < NLOCAL(g);
        lcounts[k] = has ? m : 0;
        ldispls[k] = has ? (size_t)RANK(g, k + t * S) * m : 0;
        total += lcounts[k];
      }
      char *mine = Z + (lcounts[me] ? zoff[g] + t * m : 0) * es;
      kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = in, .recvbuf = mine, .count = total,
                   .dtype = op->dtype, .op = op->op, .counts = lcounts, .displs = ldispls};
      KT_CHECK(kt__hier_phase(ex, local, &rs, "intra-host reduce-scatter"));
    }
  if (L == 1 && bytes) /* alone on this host: class 0 is every block, in host order */
    for (int g = 0; g < H; g++)
      for (int j = 0; j < NLOCAL(g); j++)
        memcpy(Z + (zoff[g] + (size_t)j * m) * es, in + (size_t)RANK(g, j) * bytes, bytes);
  /* 2. My class over the hosts: my host's class-me blocks, reduced; my own first. */
  char *res = Z;
  if (cross) {
    for (int i = 0; i < cross->size; i++) { /* cross rank i is on host g: its class-me blocks */
      int g = hs->of[cross->label[i]];
      xdispls[i] = zoff[g];
      xcounts[i] = (size_t)NCLASS(me, g) * m;
    }
    /* Several blocks: in place in Z, handed on in 3; only mine: into recvbuf. */
    res = NCLASS(me, h) == 1 ? out : Z + zoff[h] * es;
    kt__op rs = {.coll = KT_COLL_REDUCE_SCATTER, .sendbuf = Z, .recvbuf = res, .count = zlen, .dtype = op->dtype,
                 .op = op->op, .counts = xcounts, .displs = xdispls};
    KT_CHECK(kt__hier_phase(ex, cross, &rs, "inter-host reduce-scatter"));
    kt__op_finalize(op, res, xcounts[cross->rank], c->size);
    if (res != out && bytes) memcpy(out, res, bytes);
  }
  /* 3. On a host with more than S ranks: local rank j >= S gets its block from local rank j mod S. */
  if (L > S) {
    size_t *sc = a2a, *sd = a2a + L, *rc = a2a + 2 * L, *rd = a2a + 3 * L;
    for (int j = 0; j < L; j++) {
      bool to = me < S && j != me && j % S == me, from = me >= S && j == me % S;
      sc[j] = to ? m : 0;
      sd[j] = to ? (size_t)(j / S) * m : 0;
      rc[j] = from ? m : 0;
      rd[j] = 0;
    }
    kt__op a2 = {.coll = KT_COLL_ALLTOALLV, .sendbuf = res, .recvbuf = out, .dtype = op->dtype,
                 .counts = sc, .displs = sd, .counts2 = rc, .displs2 = rd};
    KT_CHECK(kt__hier_phase(ex, local, &a2, "intra-host hand-over"));
  }
#undef NLOCAL
#undef RANK
#undef NCLASS
  return KT_SUCCESS;
}
