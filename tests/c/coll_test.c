/* coll_test.c - multi-process correctness suite of every collective and of
 * point-to-point: every dtype x every valid op x counts {0, 1, odd, large} x
 * in-place / out-of-place x blocking / non-blocking x roots {0, size-1}.
 * Run under the launcher: `kaitian run -n N coll_test [--quick] [--coll a,b]
 * [--seed S] [--count N] [--verbose] [--selftest] [--drop-rank R | --order
 * LIST] [--algo SPEC] [--no-inplace LIST]`. Each rank checks its own outputs
 * against a reference computed independently (coll_ref.c), plus guard bytes
 * around and between output blocks and unchanged inputs; with --algo (the
 * run's KAITIAN_ALGO), that each collective ran the algorithm forced on it
 * and no other. Exit status 0 only when every rank saw every result right. */
#include "coll/coll.h"   /* kt__algos_run */
#include "core/comm.h"   /* the communicator's group, for kt__algos_run */
#include "coll_ref.h"
#include "core/memreg.h" /* kt__memreg_direct_runs */
#include "kaitian.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
  C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_ALLGATHERV, C_REDUCE_SCATTER, C_GATHER,
  C_SCATTER, C_ALLTOALL, C_ALLTOALLV, C_BARRIER, C_P2P, C_SENDRECV, C_MIXED, C_REDUCE_SCATTERV, C_NCOLL
};

/* inplace: the header defines an in-place form; nb: a kt_i* variant exists. */
static const struct {
  const char *name;
  bool reduces, rooted, inplace, nb;
} colls[C_NCOLL] = {
    [C_ALLREDUCE] = {"allreduce", true, false, true, true},
    [C_BROADCAST] = {"broadcast", false, true, true, true},
    [C_REDUCE] = {"reduce", true, true, true, true},
    [C_ALLGATHER] = {"allgather", false, false, true, true},
    [C_ALLGATHERV] = {"allgatherv", false, false, false, true},
    [C_REDUCE_SCATTER] = {"reduce_scatter", true, false, true, true},
    [C_GATHER] = {"gather", false, true, false, true},
    [C_SCATTER] = {"scatter", false, true, false, true},
    [C_ALLTOALL] = {"alltoall", false, false, true, true},
    [C_ALLTOALLV] = {"alltoallv", false, false, false, true},
    [C_BARRIER] = {"barrier", false, false, false, true},
    [C_P2P] = {"p2p", false, false, false, true}, /* kt_send/kt_recv ring */
    [C_SENDRECV] = {"sendrecv", false, false, false, false},
    [C_MIXED] = {"mixed", false, false, false, true}, /* batches of different kinds */
    [C_REDUCE_SCATTERV] = {"reduce_scatterv", true, false, true, true},
};

enum { M_BLOCK, M_NB_WAIT, M_NB_TEST };
static const char *const mode_names[] = {"blocking", "nb-wait", "nb-test"};

static struct {
  kt_comm comm;
  int rank, size;
  uint64_t seed;
  bool quick, verbose, selftest;
  bool quiet; /* selftest: checks of deliberately corrupted buffers print nothing */
  bool want[C_NCOLL];
  long only_count; /* --count N: run that count instead of the usual ones (-1: the usual) */
  long cases;    /* cases run on this rank */
  long failures; /* cases with at least one wrong element/byte on this rank */
  long corrupted; /* selftest: corruptions made (each must be noticed) */
  int registered; /* --registered: 0 none, 1 every rank's buffers, 2 rank 0's only, 3 half of
                     rank 0's (at random), none elsewhere */
  const char *algo_spec;     /* --algo: the text of the run's KAITIAN_ALGO */
  char algo[C_NCOLL][32];    /* the algorithm each collective must run ("": any) */
  bool algo_failed[C_NCOLL]; /* reported once per collective */
  bool no_inplace[C_NCOLL];  /* --no-inplace: skip the in-place forms */
} T;

#define ODD_COUNT 1531
#define NB_BATCH 4
#define GUARD 64
#define MAX_PRINT 5
/* Report a wrong result (silenced while the selftest corrupts buffers). */
#define REPORT(...)                                                             \
  do {                                                                          \
    if (!T.quiet) fprintf(stderr, __VA_ARGS__);                                 \
  } while (0)

/* Large count per dtype: about 256 KiB per rank, so above the tuner's
 * small-message threshold while the 8-rank suite fits on 2 cores. */
static size_t large_count(kt_dtype dt) {
  switch (ref_dtype_size(dt)) {
  case 1: return 262147;
  case 2: return 131075;
  case 4: return 65539;
  default: return 32771;
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^
               (c + 0x85ebca77c2b2ae63ull) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  z *= 0xd6e8feb86659fd93ull;
  return z ^ (z >> 32);
}

/* A failed call breaks the communicator (header contract), so stop here;
 * aborting lets the peers fail fast instead of waiting for their timeout. */
static void fatal_call(const char *what, const char *call, kt_result rc) {
  fprintf(stderr, "FAIL %s: %s returned %s: %s\n", what, call, kt_strerror(rc), kt_last_error());
  kt_comm_abort(T.comm);
  exit(1);
}

/* ---- guarded buffers ------------------------------------------------------ */

typedef struct gbuf {
  uint8_t *base; /* GUARD bytes, body, GUARD bytes; NULL when unused */
  size_t bytes;
  bool registered; /* from kt_mem_alloc */
} gbuf;

static uint8_t guard_byte(size_t i) { return (uint8_t)(0xa5u ^ (i * 7u)); }
static uint8_t garbage_byte(size_t i) { return (uint8_t)(0x5bu + i * 13u); }
static uint8_t *gb_ptr(const gbuf *b) { return b->base ? b->base + GUARD : NULL; }

/* Body filled with the garbage pattern (so an unwritten output is noticed). */
static void gb_alloc(gbuf *b, size_t bytes) {
  b->bytes = bytes;
  b->registered = T.registered == 1 || (T.registered == 2 && T.rank == 0) ||
                  (T.registered == 3 && T.rank == 0 && (hash3(T.seed, bytes, (uint64_t)T.cases) & 1));
  if (b->registered) {
    void *p = NULL;
    kt_result rc = kt_mem_alloc(bytes + 2 * GUARD, &p);
    if (rc != KT_SUCCESS) {
      fprintf(stderr, "FAIL rank %d: kt_mem_alloc(%zu): %s: %s\n", T.rank, bytes + 2 * GUARD, kt_strerror(rc),
              kt_last_error());
      exit(1);
    }
    b->base = p;
  } else {
    b->base = malloc(bytes + 2 * GUARD);
  }
  if (!b->base) {
    fprintf(stderr, "FAIL rank %d: cannot allocate %zu bytes for a test buffer\n", T.rank, bytes);
    exit(1);
  }
  for (size_t i = 0; i < GUARD; i++) {
    b->base[i] = guard_byte(i);
    b->base[GUARD + bytes + i] = guard_byte(GUARD + i);
  }
  for (size_t i = 0; i < bytes; i++) b->base[GUARD + i] = garbage_byte(i);
}

static void gb_free(gbuf *b) {
  if (b->registered) {
    kt_result rc = kt_mem_free(b->base);
    if (rc != KT_SUCCESS) fprintf(stderr, "FAIL rank %d: kt_mem_free: %s\n", T.rank, kt_last_error()), T.failures++;
  } else {
    free(b->base);
  }
  b->base = NULL;
}

/* Number of guard bytes (before and after the body) that changed. */
static size_t gb_check_guards(const gbuf *b, const char *what, const char *name) {
  size_t bad = 0;
  if (!b->base) return 0;
  for (size_t i = 0; i < GUARD; i++) {
    if (b->base[i] != guard_byte(i)) {
      if (bad++ == 0)
        REPORT("FAIL %s: %s guard byte %zd before the buffer was overwritten\n", what,
                name, (ssize_t)i - GUARD);
    }
    if (b->base[GUARD + b->bytes + i] != guard_byte(GUARD + i)) {
      if (bad++ == 0)
        REPORT("FAIL %s: %s guard byte %zu past the end (%zu bytes) was overwritten\n",
                what, name, i, b->bytes);
    }
  }
  return bad;
}

/* Body bytes outside the [off[k], off[k] + len[k]) ranges must still hold
 * the garbage pattern (gaps between v-collective blocks, unused buffers). */
static size_t gb_check_untouched(const gbuf *b, int nr, const size_t *off, const size_t *len,
                                 const char *what, const char *name) {
  if (!b->base || b->bytes == 0) return 0;
  uint8_t *mask = calloc(b->bytes, 1);
  if (!mask) {
    fprintf(stderr, "FAIL %s: out of memory for the untouched-bytes mask\n", what);
    return 1;
  }
  for (int k = 0; k < nr; k++) memset(mask + off[k], 1, len[k]);
  size_t bad = 0;
  const uint8_t *p = gb_ptr(b);
  for (size_t i = 0; i < b->bytes; i++) {
    if (!mask[i] && p[i] != garbage_byte(i) && bad++ == 0)
      REPORT("FAIL %s: %s byte %zu is outside every output block but was written\n",
              what, name, i);
  }
  free(mask);
  return bad;
}

/* ---- test cases ------------------------------------------------------------ */

typedef struct tcase {
  int coll, mode, root, shift;
  kt_dtype dt;
  kt_op op; /* REF_RAW for data movement */
  size_t count;
  bool inplace;
  uint64_t salt;
  /* filled by prepare */
  gbuf sb, rb;
  uint8_t *sb_copy; /* sb's body before the call, when the input must not change */
  const void *sendp;
  void *recvp;
  size_t c1[64], d1[64], c2[64], d2[64]; /* counts/displs of v-collectives */
  size_t scount, rcount;                 /* p2p / allgatherv */
  int to, from, tag;
  kt_request req[2];
  int nreq;
  char what[200];
} tcase;

static size_t es_of(const tcase *c) { return ref_dtype_size(c->dt); }
static kt_op gen_op(const tcase *c) { return colls[c->coll].reduces ? c->op : REF_RAW; }

/* Counts of allgatherv (some ranks contribute nothing) and alltoallv. */
static size_t vcount(size_t c, int s) { return c == 0 ? 0 : (s % 3 == 1 ? 0 : c + (size_t)(s % 4)); }
static size_t a2a_count(size_t c, int a, int b) {
  return c == 0 ? 0 : ((a + 2 * b) % 4 == 1 ? 0 : c + (size_t)((a * 3 + b) % 5));
}
static size_t a2a_stride(size_t c) { return c + 8; }
static size_t p2p_count(size_t c, int s) { return c == 0 ? 0 : c + (size_t)(s % 3); }

static void describe(tcase *c) {
  char extra[64] = "";
  if (colls[c->coll].rooted) snprintf(extra, sizeof extra, " root=%d", c->root);
  if (c->coll == C_SENDRECV) snprintf(extra, sizeof extra, " shift=%d", c->shift);
  snprintf(c->what, sizeof c->what, "rank %d %s dtype=%s op=%s count=%zu %s %s%s", T.rank,
           colls[c->coll].name, ref_dtype_name(c->dt), ref_op_name(c->op), c->count,
           c->inplace ? "in-place" : "out-of-place", mode_names[c->mode], extra);
}

static void fill(void *p, size_t n, const tcase *c, int rank, size_t idx0) {
  ref_fill(p, n, c->dt, gen_op(c), c->salt, rank, idx0);
}

/* Allocate and fill the buffers of one case; sets sendp/recvp. */
static void prepare(tcase *c) {
  int n = T.size, r = T.rank;
  size_t es = es_of(c), cnt = c->count;
  bool root = r == c->root, blocking = c->mode == M_BLOCK;
  memset(&c->sb, 0, sizeof c->sb);
  memset(&c->rb, 0, sizeof c->rb);
  c->sb_copy = NULL;
  c->sendp = c->recvp = NULL;
  c->nreq = 0;
  describe(c);
  switch (c->coll) {
  case C_ALLREDUCE:
    gb_alloc(&c->rb, cnt * es);
    if (c->inplace) {
      fill(gb_ptr(&c->rb), cnt, c, r, 0);
      c->sendp = c->recvp = gb_ptr(&c->rb);
    } else {
      gb_alloc(&c->sb, cnt * es);
      fill(gb_ptr(&c->sb), cnt, c, r, 0);
    }
    break;
  case C_BROADCAST:
    gb_alloc(&c->rb, cnt * es);
    if (c->inplace) {
      if (root) fill(gb_ptr(&c->rb), cnt, c, r, 0);
      c->sendp = c->recvp = gb_ptr(&c->rb);
    } else { /* non-roots pass garbage that must be ignored and left alone */
      gb_alloc(&c->sb, cnt * es);
      if (root) fill(gb_ptr(&c->sb), cnt, c, r, 0);
    }
    break;
  case C_REDUCE:
    if (c->inplace) {
      gb_alloc(&c->rb, cnt * es);
      fill(gb_ptr(&c->rb), cnt, c, r, 0);
      c->sendp = c->recvp = gb_ptr(&c->rb);
    } else {
      gb_alloc(&c->sb, cnt * es);
      fill(gb_ptr(&c->sb), cnt, c, r, 0);
      if (root || !blocking) gb_alloc(&c->rb, cnt * es); /* NULL elsewhere when blocking */
    }
    break;
  case C_ALLGATHER:
    gb_alloc(&c->rb, (size_t)n * cnt * es);
    if (c->inplace) {
      fill(gb_ptr(&c->rb) + (size_t)r * cnt * es, cnt, c, r, 0);
      c->sendp = gb_ptr(&c->rb) + (size_t)r * cnt * es;
      c->recvp = gb_ptr(&c->rb);
    } else {
      gb_alloc(&c->sb, cnt * es);
      fill(gb_ptr(&c->sb), cnt, c, r, 0);
    }
    break;
  case C_ALLGATHERV: { /* blocks in reverse rank order with gaps */
    size_t off = 0;
    for (int s = n - 1; s >= 0; s--) {
      c->c1[s] = vcount(cnt, s);
      c->d1[s] = off + 1 + (size_t)(s % 2);
      off = c->d1[s] + c->c1[s];
    }
    c->scount = c->c1[r];
    gb_alloc(&c->sb, c->scount * es);
    fill(gb_ptr(&c->sb), c->scount, c, r, 0);
    gb_alloc(&c->rb, (off + 1) * es);
    break;
  }
  case C_REDUCE_SCATTER:
    gb_alloc(&c->sb, (size_t)n * cnt * es);
    fill(gb_ptr(&c->sb), (size_t)n * cnt, c, r, 0);
    if (c->inplace) {
      c->sendp = gb_ptr(&c->sb);
      c->recvp = gb_ptr(&c->sb) + (size_t)r * cnt * es;
    } else {
      gb_alloc(&c->rb, cnt * es);
    }
    break;
  case C_REDUCE_SCATTERV: { /* blocks of uneven counts, some empty */
    size_t off = 0;
    for (int s = 0; s < n; s++) {
      c->c1[s] = vcount(cnt, s);
      c->d1[s] = off;
      off += c->c1[s];
    }
    gb_alloc(&c->sb, off * es);
    fill(gb_ptr(&c->sb), off, c, r, 0);
    if (c->inplace) {
      c->sendp = gb_ptr(&c->sb);
      c->recvp = gb_ptr(&c->sb) + c->d1[r] * es;
    } else {
      gb_alloc(&c->rb, c->c1[r] * es);
    }
    break;
  }
  case C_GATHER:
    gb_alloc(&c->sb, cnt * es);
    fill(gb_ptr(&c->sb), cnt, c, r, 0);
    if (root || !blocking) gb_alloc(&c->rb, (size_t)n * cnt * es);
    break;
  case C_SCATTER:
    if (root || !blocking) gb_alloc(&c->sb, (size_t)n * cnt * es);
    if (root) fill(gb_ptr(&c->sb), (size_t)n * cnt, c, r, 0);
    gb_alloc(&c->rb, cnt * es);
    break;
  case C_ALLTOALL:
    gb_alloc(&c->rb, (size_t)n * cnt * es);
    if (c->inplace) {
      fill(gb_ptr(&c->rb), (size_t)n * cnt, c, r, 0);
      c->sendp = c->recvp = gb_ptr(&c->rb);
    } else {
      gb_alloc(&c->sb, (size_t)n * cnt * es);
      fill(gb_ptr(&c->sb), (size_t)n * cnt, c, r, 0);
    }
    break;
  case C_ALLTOALLV: { /* send blocks forward, receive blocks backward, with gaps */
    size_t soff = 0, roff = 0, stride = a2a_stride(cnt);
    for (int b = 0; b < n; b++) {
      c->c1[b] = a2a_count(cnt, r, b);
      c->d1[b] = soff + (size_t)(b % 2);
      soff = c->d1[b] + c->c1[b];
    }
    for (int s = n - 1; s >= 0; s--) {
      c->c2[s] = a2a_count(cnt, s, r);
      c->d2[s] = roff + 1 + (size_t)(s % 2);
      roff = c->d2[s] + c->c2[s];
    }
    gb_alloc(&c->sb, (soff + 1) * es);
    for (int b = 0; b < n; b++)
      fill(gb_ptr(&c->sb) + c->d1[b] * es, c->c1[b], c, r, (size_t)b * stride);
    gb_alloc(&c->rb, roff * es);
    break;
  }
  case C_P2P:
  case C_SENDRECV: {
    int k = c->coll == C_P2P ? 1 : c->shift;
    c->to = (r + k) % n;
    c->from = (r - k % n + n) % n;
    c->scount = p2p_count(cnt, r);
    c->rcount = p2p_count(cnt, c->from);
    c->tag = (int)(c->salt % 30000u);
    gb_alloc(&c->sb, c->scount * es);
    fill(gb_ptr(&c->sb), c->scount, c, r, 0);
    gb_alloc(&c->rb, c->rcount * es);
    break;
  }
  default:
    break;
  }
  if (!c->sendp) c->sendp = gb_ptr(&c->sb);
  if (!c->recvp) c->recvp = gb_ptr(&c->rb);
  /* Inputs that must come back unchanged: everything in sb, unless the call
   * is in place (then sb is the output). */
  bool sb_is_output = (c->coll == C_REDUCE_SCATTER || c->coll == C_REDUCE_SCATTERV) && c->inplace;
  if (c->sb.base && !sb_is_output) {
    c->sb_copy = malloc(c->sb.bytes ? c->sb.bytes : 1);
    if (!c->sb_copy) {
      fprintf(stderr, "FAIL %s: out of memory\n", c->what);
      exit(1);
    }
    memcpy(c->sb_copy, gb_ptr(&c->sb), c->sb.bytes);
  }
}

static void release(tcase *c) {
  gb_free(&c->sb);
  gb_free(&c->rb);
  free(c->sb_copy);
  c->sb_copy = NULL;
}

/* Issue the call(s) of one case, blocking (reqs NULL) or not. */
static void issue(tcase *c, bool nb) {
  kt_comm m = T.comm;
  kt_dtype dt = c->dt;
  size_t n = c->count;
  kt_request *q = nb ? &c->req[0] : NULL;
  kt_result rc = KT_SUCCESS;
  const char *call = colls[c->coll].name;
  c->nreq = nb ? 1 : 0;
  switch (c->coll) {
  case C_ALLREDUCE:
    rc = nb ? kt_iallreduce(c->sendp, c->recvp, n, dt, c->op, m, q)
            : kt_allreduce(c->sendp, c->recvp, n, dt, c->op, m);
    break;
  case C_BROADCAST:
    rc = nb ? kt_ibroadcast(c->sendp, c->recvp, n, dt, c->root, m, q)
            : kt_broadcast(c->sendp, c->recvp, n, dt, c->root, m);
    break;
  case C_REDUCE:
    rc = nb ? kt_ireduce(c->sendp, c->recvp, n, dt, c->op, c->root, m, q)
            : kt_reduce(c->sendp, c->recvp, n, dt, c->op, c->root, m);
    break;
  case C_ALLGATHER:
    rc = nb ? kt_iallgather(c->sendp, c->recvp, n, dt, m, q)
            : kt_allgather(c->sendp, c->recvp, n, dt, m);
    break;
  case C_ALLGATHERV: {
    /* count arrays are copied at issue time: pass scratch copies and
     * scribble over them afterwards to prove it */
    size_t cs[64], ds[64];
    memcpy(cs, c->c1, sizeof cs);
    memcpy(ds, c->d1, sizeof ds);
    rc = nb ? kt_iallgatherv(c->sendp, c->scount, c->recvp, cs, ds, dt, m, q)
            : kt_allgatherv(c->sendp, c->scount, c->recvp, cs, ds, dt, m);
    memset(cs, 0xff, sizeof cs);
    memset(ds, 0xff, sizeof ds);
    break;
  }
  case C_REDUCE_SCATTER:
    rc = nb ? kt_ireduce_scatter(c->sendp, c->recvp, n, dt, c->op, m, q)
            : kt_reduce_scatter(c->sendp, c->recvp, n, dt, c->op, m);
    break;
  case C_REDUCE_SCATTERV: {
    size_t cs[64];
    memcpy(cs, c->c1, sizeof cs);
    rc = nb ? kt_ireduce_scatterv(c->sendp, c->recvp, cs, dt, c->op, m, q)
            : kt_reduce_scatterv(c->sendp, c->recvp, cs, dt, c->op, m);
    memset(cs, 0xff, sizeof cs);
    break;
  }
  case C_GATHER:
    rc = nb ? kt_igather(c->sendp, c->recvp, n, dt, c->root, m, q)
            : kt_gather(c->sendp, c->recvp, n, dt, c->root, m);
    break;
  case C_SCATTER:
    rc = nb ? kt_iscatter(c->sendp, c->recvp, n, dt, c->root, m, q)
            : kt_scatter(c->sendp, c->recvp, n, dt, c->root, m);
    break;
  case C_ALLTOALL:
    rc = nb ? kt_ialltoall(c->sendp, c->recvp, n, dt, m, q)
            : kt_alltoall(c->sendp, c->recvp, n, dt, m);
    break;
  case C_ALLTOALLV: {
    size_t a[64], b[64], d[64], e[64];
    memcpy(a, c->c1, sizeof a), memcpy(b, c->d1, sizeof b);
    memcpy(d, c->c2, sizeof d), memcpy(e, c->d2, sizeof e);
    rc = nb ? kt_ialltoallv(c->sendp, a, b, c->recvp, d, e, dt, m, q)
            : kt_alltoallv(c->sendp, a, b, c->recvp, d, e, dt, m);
    memset(a, 0xff, sizeof a), memset(b, 0xff, sizeof b);
    memset(d, 0xff, sizeof d), memset(e, 0xff, sizeof e);
    break;
  }
  case C_P2P: { /* even ranks send first, odd ones receive first: no cycle */
    bool send_first = T.rank % 2 == 0;
    for (int k = 0; k < 2; k++) {
      bool do_send = (k == 0) == send_first;
      kt_request *qq = nb ? &c->req[k] : NULL;
      if (do_send) {
        call = nb ? "kt_isend" : "kt_send";
        rc = nb ? kt_isend(c->sendp, c->scount, dt, c->to, c->tag, m, qq)
                : kt_send(c->sendp, c->scount, dt, c->to, c->tag, m);
      } else {
        call = nb ? "kt_irecv" : "kt_recv";
        rc = nb ? kt_irecv(c->recvp, c->rcount, dt, c->from, c->tag, m, qq)
                : kt_recv(c->recvp, c->rcount, dt, c->from, c->tag, m);
      }
      if (rc != KT_SUCCESS) break;
      c->nreq = nb ? k + 1 : 0;
    }
    break;
  }
  case C_SENDRECV:
    rc = kt_sendrecv(c->sendp, c->scount, c->to, c->recvp, c->rcount, c->from, dt, c->tag, m);
    break;
  default:
    break;
  }
  if (rc != KT_SUCCESS) fatal_call(c->what, call, rc);
}

/* Check one completed case; returns the number of problems found. */
static size_t verify(tcase *c) {
  int n = T.size, r = T.rank;
  size_t es = es_of(c), cnt = c->count, bad = 0;
  bool root = r == c->root;
  ref_ctx ctx = {c->what, T.quiet ? 0 : MAX_PRINT};
  kt_op op = gen_op(c);
  const uint8_t *rp = gb_ptr(&c->rb);
  switch (c->coll) {
  case C_ALLREDUCE:
    bad += ref_check_reduce(rp, cnt, c->dt, c->op, c->salt, n, 0, 0, &ctx);
    break;
  case C_BROADCAST:
    bad += ref_check_copy(rp, cnt, c->dt, op, c->salt, c->root, 0, 0, &ctx);
    break;
  case C_REDUCE:
    if (root)
      bad += ref_check_reduce(rp, cnt, c->dt, c->op, c->salt, n, 0, 0, &ctx);
    else if (c->inplace) /* recvbuf is written on root only */
      bad += ref_check_copy(rp, cnt, c->dt, op, c->salt, r, 0, 0, &ctx);
    else
      bad += gb_check_untouched(&c->rb, 0, NULL, NULL, c->what, "non-root recvbuf");
    break;
  case C_ALLGATHER:
  case C_GATHER:
    if (c->coll == C_GATHER && !root) {
      bad += gb_check_untouched(&c->rb, 0, NULL, NULL, c->what, "non-root recvbuf");
      break;
    }
    for (int s = 0; s < n; s++)
      bad += ref_check_copy(rp + (size_t)s * cnt * es, cnt, c->dt, op, c->salt, s, 0,
                            (size_t)s * cnt, &ctx);
    break;
  case C_ALLGATHERV:
  case C_ALLTOALLV: {
    bool v = c->coll == C_ALLGATHERV;
    size_t off[64], len[64];
    for (int s = 0; s < n; s++) {
      size_t d = v ? c->d1[s] : c->d2[s], k = v ? c->c1[s] : c->c2[s];
      size_t idx0 = v ? 0 : (size_t)r * a2a_stride(cnt);
      bad += ref_check_copy(rp + d * es, k, c->dt, op, c->salt, s, idx0, d, &ctx);
      off[s] = d * es;
      len[s] = k * es;
    }
    bad += gb_check_untouched(&c->rb, n, off, len, c->what, "recvbuf gap");
    break;
  }
  case C_REDUCE_SCATTER:
    if (c->inplace)
      bad += ref_check_reduce(gb_ptr(&c->sb) + (size_t)r * cnt * es, cnt, c->dt, c->op, c->salt,
                              n, (size_t)r * cnt, (size_t)r * cnt, &ctx);
    else
      bad += ref_check_reduce(rp, cnt, c->dt, c->op, c->salt, n, (size_t)r * cnt, 0, &ctx);
    break;
  case C_REDUCE_SCATTERV:
    if (c->inplace)
      bad += ref_check_reduce(gb_ptr(&c->sb) + c->d1[r] * es, c->c1[r], c->dt, c->op, c->salt, n, c->d1[r],
                              c->d1[r], &ctx);
    else
      bad += ref_check_reduce(rp, c->c1[r], c->dt, c->op, c->salt, n, c->d1[r], 0, &ctx);
    break;
  case C_SCATTER:
    bad += ref_check_copy(rp, cnt, c->dt, op, c->salt, c->root, (size_t)r * cnt, 0, &ctx);
    break;
  case C_ALLTOALL:
    for (int s = 0; s < n; s++)
      bad += ref_check_copy(rp + (size_t)s * cnt * es, cnt, c->dt, op, c->salt, s,
                            (size_t)r * cnt, (size_t)s * cnt, &ctx);
    break;
  case C_P2P:
  case C_SENDRECV:
    bad += ref_check_copy(rp, c->rcount, c->dt, op, c->salt, c->from, 0, 0, &ctx);
    break;
  default:
    break;
  }
  if (bad > (size_t)MAX_PRINT)
    REPORT("FAIL %s: %zu wrong elements in all\n", c->what, bad);
  bad += gb_check_guards(&c->sb, c->what, "sendbuf");
  bad += gb_check_guards(&c->rb, c->what, "recvbuf");
  if (c->sb_copy) {
    const uint8_t *sp = gb_ptr(&c->sb);
    for (size_t i = 0; i < c->sb.bytes; i++) {
      if (sp[i] != c->sb_copy[i]) {
        REPORT("FAIL %s: input buffer changed at byte %zu (element %zu)\n", c->what, i,
                i / es);
        bad++;
        break;
      }
    }
  }
  return bad;
}

/* ---- selftest: the checks must catch corrupted results ---------------------- */

/* First element of this rank's output, NULL when it has none. */
static uint8_t *first_output(tcase *c) {
  size_t es = es_of(c);
  switch (c->coll) {
  case C_ALLGATHERV:
  case C_ALLTOALLV:
    for (int s = 0; s < T.size; s++) {
      size_t k = c->coll == C_ALLGATHERV ? c->c1[s] : c->c2[s];
      size_t d = c->coll == C_ALLGATHERV ? c->d1[s] : c->d2[s];
      if (k) return gb_ptr(&c->rb) + d * es;
    }
    return NULL;
  case C_REDUCE:
  case C_GATHER:
    if (T.rank != c->root) return NULL;
    break;
  case C_P2P:
  case C_SENDRECV:
    return c->rcount ? gb_ptr(&c->rb) : NULL;
  case C_REDUCE_SCATTERV:
    return c->c1[T.rank] ? (uint8_t *)c->recvp : NULL;
  default:
    break;
  }
  return c->count ? (uint8_t *)c->recvp : NULL;
}

/* Corrupt one thing of kind k (0 output element, 1 guard byte, 2 input,
 * 3 gap between v-blocks); returns the byte changed (NULL: nothing to do)
 * and its old value in *old. */
static uint8_t *corrupt(tcase *c, int k, uint8_t *old) {
  uint8_t *p = NULL, mask = 0x40;
  gbuf *g = c->rb.base ? &c->rb : &c->sb;
  if (k == 0 && (p = first_output(c)) != NULL) {
    if (c->dt == KT_BOOL) mask = 1;
    else p += es_of(c) - 1; /* top byte: sign/exponent of floats */
  } else if (k == 1 && g->base) {
    p = g->base + GUARD + g->bytes + 3;
  } else if (k == 2 && c->sb_copy && c->sb.bytes) {
    p = gb_ptr(&c->sb) + c->sb.bytes / 2;
    mask = 1;
  } else if (k == 3 && (c->coll == C_ALLGATHERV || c->coll == C_ALLTOALLV) && c->rb.bytes) {
    p = gb_ptr(&c->rb); /* element 0 is always a gap in these layouts */
  }
  if (p) {
    *old = *p;
    *p ^= mask;
  }
  return p;
}

/* Verify the real result, then corrupt it in each way and require the
 * checks to notice. Returns the number of problems. */
static size_t selftest_case(tcase *c) {
  size_t bad = verify(c);
  for (int k = 0; k < 4; k++) {
    uint8_t old;
    uint8_t *p = corrupt(c, k, &old);
    if (!p) continue;
    T.corrupted++;
    T.quiet = true;
    size_t found = verify(c);
    T.quiet = false;
    *p = old;
    if (!found) {
      fprintf(stderr, "FAIL selftest %s: corruption of kind %d went unnoticed\n", c->what, k);
      bad++;
    }
  }
  return bad;
}

/* ---- driver --------------------------------------------------------------- */

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void wait_req(tcase *c, int k) {
  kt_result rc = kt_wait(c->req[k]);
  c->req[k] = NULL;
  if (rc != KT_SUCCESS) fatal_call(c->what, "kt_wait", rc);
}

/* Issue every case, calling kt_test on the pending ones after each issue,
 * then poll until all are done; kt_wait must then return at once. */
static void run_nb_test(tcase *cs, int k) {
  int done[NB_BATCH][2] = {{0}};
  for (int i = 0; i < k; i++) {
    issue(&cs[i], true);
    for (int j = 0; j <= i; j++)
      for (int q = 0; q < cs[j].nreq; q++) {
        if (done[j][q]) continue;
        kt_result rc = kt_test(cs[j].req[q], &done[j][q]);
        if (rc != KT_SUCCESS) fatal_call(cs[j].what, "kt_test", rc);
      }
  }
  double deadline = now_s() + 120;
  for (;;) {
    int pending = 0;
    for (int j = 0; j < k; j++)
      for (int q = 0; q < cs[j].nreq; q++) {
        if (done[j][q]) continue;
        kt_result rc = kt_test(cs[j].req[q], &done[j][q]);
        if (rc != KT_SUCCESS) fatal_call(cs[j].what, "kt_test", rc);
        pending += !done[j][q];
      }
    if (!pending) break;
    if (now_s() > deadline) {
      fprintf(stderr, "FAIL %s: kt_test still reports not done after 120 s\n", cs[0].what);
      kt_comm_abort(T.comm);
      exit(1);
    }
    sleep_us(20);
  }
  for (int j = 0; j < k; j++)
    for (int q = 0; q < cs[j].nreq; q++) {
      double t0 = now_s();
      wait_req(&cs[j], q);
      if (now_s() - t0 > 1.0)
        fprintf(stderr, "WARN %s: kt_wait took %.2f s after kt_test said done\n", cs[j].what,
                now_s() - t0);
    }
}

/* --algo: the algorithms this collective's ops have run on the communicator
 * (kt__algos_run) must be the forced one alone (the tuner runs its own pick
 * where the forced one cannot run a call: that call tested something else),
 * and by the end (final) it must have run. Reported once per collective,
 * after the case (or batch) where another algorithm first showed up. */
static void check_algo(int coll, const char *what, bool final) {
  if (!T.algo[coll][0] || T.algo_failed[coll]) return;
  char ran[256];
  kt__algos_run(&T.comm->g, coll == C_REDUCE_SCATTERV ? "reduce_scatter" : colls[coll].name, ran, sizeof ran);
  if (!strcmp(ran, T.algo[coll]) || (!final && !ran[0])) return;
  fprintf(stderr,
          "FAIL %s: --algo '%s' forces %s=%s, but the %s ops of this communicator ran %s (KAITIAN_DEBUG=INFO "
          "names the call the forced algorithm could not run)\n",
          what, T.algo_spec, colls[coll].name, T.algo[coll], colls[coll].name, ran[0] ? ran : "no algorithm");
  T.algo_failed[coll] = true;
  T.failures++;
}

/* Run up to NB_BATCH cases in one mode; failures are counted, not fatal. */
static void run_batch(tcase *cs, int k, int mode) {
  for (int i = 0; i < k; i++) {
    cs[i].mode = mode;
    prepare(&cs[i]);
    if (T.verbose && T.rank == 0) fprintf(stderr, "case %s\n", cs[i].what);
  }
  if (mode == M_BLOCK) {
    for (int i = 0; i < k; i++) issue(&cs[i], false);
  } else if (mode == M_NB_WAIT) {
    /* the last of a full batch is blocking, issued behind pending ones:
     * operations run in issue order, blocking or not */
    for (int i = 0; i < k; i++) issue(&cs[i], !(k == NB_BATCH && i == k - 1));
    for (int i = 0; i < k; i++)
      for (int q = 0; q < cs[i].nreq; q++) wait_req(&cs[i], q);
  } else {
    run_nb_test(cs, k);
  }
  for (int i = 0; i < k; i++) {
    T.cases++;
    if ((T.selftest ? selftest_case(&cs[i]) : verify(&cs[i])) != 0) T.failures++;
    release(&cs[i]);
  }
  char what[sizeof cs->what + 64];
  snprintf(what, sizeof what, "%s%s", cs[k - 1].what, k > 1 ? " (or an op before it in its batch)" : "");
  for (int i = 0; i < k; i++) check_algo(cs[i].coll, what, false);
}

/* Which (dtype, op, count, in-place) combinations run under --quick: every
 * dtype and op with the small counts, the large count with the first op
 * only and half of the dtypes. */
static bool quick_skip(kt_dtype dt, kt_op op, size_t count, bool inplace) {
  if (!T.quick || count <= ODD_COUNT) return false;
  if (op != KT_SUM && op != REF_RAW) return true;
  return ((int)dt + (int)inplace) % 2 != 0;
}

/* Collectives whose buffers hold one block per rank take the large count
 * divided by the number of ranks (kept odd), so bytes per rank stay flat. */
static size_t large_for(int coll, kt_dtype dt) {
  size_t c = large_count(dt);
  bool per_rank = coll == C_ALLGATHER || coll == C_ALLGATHERV || coll == C_REDUCE_SCATTER || coll == C_REDUCE_SCATTERV ||
                  coll == C_GATHER || coll == C_SCATTER || coll == C_ALLTOALL || coll == C_ALLTOALLV;
  if (per_rank && T.size > 1) c = (c / (size_t)T.size) | 1;
  return c;
}

static int enumerate(int coll, tcase *out, int cap) {
  int n = 0, size = T.size;
  int roots[2] = {0, size - 1}, nroots = colls[coll].rooted && size > 1 ? 2 : 1;
  int shifts[2] = {1, size - 1}, nshifts = coll == C_SENDRECV && size > 2 ? 2 : 1;
  if (coll == C_P2P && size == 1) return 0; /* a ring of one: nothing to send */
  if (coll == C_SENDRECV && size == 1) shifts[0] = 0; /* exchange with itself */
  for (int d = 0; d < KT_NUM_DTYPES; d++) {
    kt_dtype dt = (kt_dtype)d;
    size_t counts[4] = {0, 1, ODD_COUNT, large_for(coll, dt)};
    int ncounts = 4;
    if (T.only_count >= 0) { /* --count N: that count alone */
      counts[0] = (size_t)T.only_count;
      ncounts = 1;
    }
    int nops = colls[coll].reduces ? KT_NUM_OPS : 1;
    for (int o = 0; o < nops; o++) {
      kt_op op = colls[coll].reduces ? (kt_op)o : REF_RAW;
      if (colls[coll].reduces && !ref_op_valid(dt, op)) continue;
      for (int ci = 0; ci < ncounts; ci++)
        for (int ip = 0; ip < (colls[coll].inplace && !T.no_inplace[coll] ? 2 : 1); ip++)
          for (int ri = 0; ri < nroots; ri++)
            for (int si = 0; si < nshifts; si++) {
              if (quick_skip(dt, op, counts[ci], ip)) continue;
              if (n == cap) return n;
              tcase *c = &out[n++];
              memset(c, 0, sizeof *c);
              c->coll = coll;
              c->dt = dt;
              c->op = op;
              c->count = counts[ci];
              c->inplace = ip;
              c->root = roots[ri];
              c->shift = shifts[si];
            }
    }
  }
  return n;
}

/* Every case once blocking and once non-blocking (in batches that alternate
 * wait-in-order and kt_test polling); --quick runs each case in one mode. */
static void run_coll(int coll) {
  enum { CAP = 4096 };
  static tcase cs[CAP];
  int n = enumerate(coll, cs, CAP);
  int passes = T.quick || !colls[coll].nb ? 1 : 2;
  for (int pass = 0; pass < passes; pass++) {
    tcase batch[NB_BATCH];
    int k = 0, nbatch = 0;
    for (int i = 0; i < n; i++) {
      bool nb = colls[coll].nb && (T.quick ? (i % 2 == 1) : pass == 1);
      tcase c = cs[i];
      c.salt = hash3(T.seed, (uint64_t)coll * 1000003u + (uint64_t)i, (uint64_t)pass);
      if (!nb) {
        run_batch(&c, 1, M_BLOCK);
        continue;
      }
      batch[k++] = c;
      if (k == NB_BATCH) {
        run_batch(batch, k, nbatch++ % 2 ? M_NB_TEST : M_NB_WAIT);
        k = 0;
      }
    }
    if (k) run_batch(batch, k, nbatch++ % 2 ? M_NB_TEST : M_NB_WAIT);
  }
}

/* Non-blocking batches whose members are different collectives (and p2p),
 * cycling through dtypes, ops, counts, roots and in-place forms. */
static void run_mixed(void) {
  static const int kinds[] = {C_ALLREDUCE, C_BROADCAST, C_REDUCE,   C_ALLGATHER, C_P2P,
                              C_ALLGATHERV, C_REDUCE_SCATTER, C_GATHER, C_SCATTER,
                              C_ALLTOALL,  C_ALLTOALLV};
  const int nkinds = (int)(sizeof kinds / sizeof kinds[0]);
  int total = T.quick ? 48 : 144, nbatch = 0, k = 0;
  tcase batch[NB_BATCH];
  for (int i = 0; i < total; i++) {
    tcase *c = &batch[k];
    memset(c, 0, sizeof *c);
    c->coll = kinds[(i * 7) % nkinds]; /* 7 is prime to 11: every kind in every slot */
    if (c->coll == C_P2P && T.size == 1) c->coll = C_ALLREDUCE;
    c->dt = (kt_dtype)(i % KT_NUM_DTYPES);
    c->op = REF_RAW;
    if (colls[c->coll].reduces) /* the first valid op from a rotating start (sum always is) */
      for (int j = 0; j < KT_NUM_OPS; j++) {
        c->op = (kt_op)((i / KT_NUM_DTYPES + j) % KT_NUM_OPS);
        if (ref_op_valid(c->dt, c->op)) break;
      }
    size_t counts[4] = {ODD_COUNT, 1, 0, large_for(c->coll, c->dt)};
    c->count = counts[(i / 3) % 4];
    c->inplace = colls[c->coll].inplace && !T.no_inplace[c->coll] && (i / 2) % 2;
    c->root = colls[c->coll].rooted ? (i / 5) % T.size : 0;
    c->shift = 1;
    c->salt = hash3(T.seed, (uint64_t)C_MIXED * 1000003u + (uint64_t)i, 7);
    if (++k == NB_BATCH || i == total - 1) {
      run_batch(batch, k, nbatch++ % 2 ? M_NB_TEST : M_NB_WAIT);
      k = 0;
    }
  }
}

/* ---- barrier ---------------------------------------------------------------- */

/* Each round one rank arrives late; after the barrier every rank must see
 * the marker file every other rank created before entering it. */
static void run_barrier(void) {
  int n = T.size, r = T.rank, rounds = T.quick ? 8 : 24;
  char dir[64] = "";
  if (r == 0) {
    snprintf(dir, sizeof dir, "/tmp/kt_barrier_XXXXXX");
    if (!mkdtemp(dir)) {
      fprintf(stderr, "FAIL rank 0 barrier: mkdtemp: %s\n", strerror(errno));
      dir[0] = '\0';
    }
  }
  kt_result rc = kt_broadcast(dir, dir, sizeof dir, KT_INT8, 0, T.comm);
  if (rc != KT_SUCCESS) fatal_call("barrier setup", "kt_broadcast", rc);
  if (!dir[0]) exit(1);
  char path[128];
  for (int k = 0; k < rounds; k++) {
    char what[64];
    snprintf(what, sizeof what, "rank %d barrier round %d", r, k);
    if (r == k % n) sleep_us(20000); /* the late one */
    snprintf(path, sizeof path, "%s/%d.%d", dir, k, r);
    FILE *f = fopen(path, "w");
    if (!f || fclose(f) != 0) {
      fprintf(stderr, "FAIL %s: cannot create %s: %s\n", what, path, strerror(errno));
      exit(1);
    }
    int mode = k % 3;
    if (mode == 0) {
      rc = kt_barrier(T.comm);
      if (rc != KT_SUCCESS) fatal_call(what, "kt_barrier", rc);
    } else {
      kt_request q;
      rc = kt_ibarrier(T.comm, &q);
      if (rc != KT_SUCCESS) fatal_call(what, "kt_ibarrier", rc);
      if (mode == 2) {
        int done = 0;
        while (!done) {
          rc = kt_test(q, &done);
          if (rc != KT_SUCCESS) fatal_call(what, "kt_test", rc);
          if (!done) sleep_us(50);
        }
      }
      rc = kt_wait(q);
      if (rc != KT_SUCCESS) fatal_call(what, "kt_wait", rc);
    }
    T.cases++;
    int missing = 0;
    for (int s = 0; s < n; s++) {
      snprintf(path, sizeof path, "%s/%d.%d", dir, k, s);
      if (access(path, F_OK) != 0) {
        fprintf(stderr, "FAIL %s: left the barrier before rank %d entered it\n", what, s);
        missing++;
      }
    }
    if (missing) T.failures++;
  }
  /* several barriers in flight at once */
  kt_request qs[5];
  for (int i = 0; i < 5; i++)
    if ((rc = kt_ibarrier(T.comm, &qs[i])) != KT_SUCCESS) fatal_call("barrier batch", "kt_ibarrier", rc);
  for (int i = 0; i < 5; i++)
    if ((rc = kt_wait(qs[i])) != KT_SUCCESS) fatal_call("barrier batch", "kt_wait", rc);
  for (int k = 0; k < rounds; k++) {
    snprintf(path, sizeof path, "%s/%d.%d", dir, k, r);
    unlink(path);
  }
  if ((rc = kt_barrier(T.comm)) != KT_SUCCESS) fatal_call("barrier cleanup", "kt_barrier", rc);
  if (r == 0) rmdir(dir);
}

/* ---- main ------------------------------------------------------------------- */

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: kaitian run -n N %s [--quick] [--coll name[,name...]] [--seed N] [--verbose]\n"
          "       [--count N: that count instead of 0, 1, 1531 and a dtype's large count]\n"
          "       [--selftest: also corrupt each result and require the checks to notice]\n"
          "       [--drop-rank R: split rank R off and test on the other ranks' communicator]\n"
          "       [--order r,r,...: test on a communicator split off with the launched ranks in this order\n"
          "        (rank i of it is the i-th listed; ranks not listed are left out), e.g. 0,2,3,1 puts the\n"
          "        ranks of one host of 2 x 2 at ranks 0 and 3]\n"
          "       [--registered all|rank0|flip: buffers from kt_mem_alloc on every rank (allreduce must\n"
          "        then run single-copy at least once), on rank 0 only, or half of rank 0's at random\n"
          "        (then it must never)]\n"
          "       [--algo SPEC: the run's KAITIAN_ALGO; each tested collective it forces (coll=name, or a\n"
          "        bare name: every tested one) must run that algorithm and no other]\n"
          "       [--no-inplace coll[,coll...]: skip the in-place forms of these collectives]\n"
          "collectives:",
          argv0);
  for (int i = 0; i < C_NCOLL; i++) fprintf(stderr, " %s", colls[i].name);
  fprintf(stderr, "\n");
  exit(2);
}

static void parse_colls(const char *list, const char *argv0) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int i = 0; i < C_NCOLL; i++)
      if (strcmp(t, colls[i].name) == 0) {
        T.want[i] = true;
        found = 1;
      }
    if (!found) {
      fprintf(stderr, "coll_test: unknown collective '%s'\n", t);
      usage(argv0);
    }
  }
}

/* Index into colls of a collective name, -1 if none. */
static int coll_index(const char *name) {
  for (int i = 0; i < C_NCOLL; i++)
    if (strcmp(name, colls[i].name) == 0) return i;
  return -1;
}

static void parse_no_inplace(const char *list, const char *argv0) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int i = coll_index(t);
    if (i < 0) {
      fprintf(stderr, "coll_test: --no-inplace: unknown collective '%s'\n", t);
      usage(argv0);
    }
    T.no_inplace[i] = true;
  }
}

/* --algo, read as the tuner reads KAITIAN_ALGO: "coll=name" forces one
 * collective, a bare name every tested one (a collective without that
 * algorithm then fails the check: the run would not test what it says);
 * a collective's own entry wins over a bare name. mixed and p2p (send and
 * recv underneath) are not checked. */
static void parse_algo(const char *argv0) {
  for (int pass = 0; pass < 2; pass++) { /* bare names first, then coll=name over them */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", T.algo_spec);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
      char *eq = strchr(t, '=');
      if (!eq && pass == 0) {
        for (int i = 0; i < C_NCOLL; i++)
          if (T.want[i] && i != C_MIXED && i != C_P2P) snprintf(T.algo[i], sizeof T.algo[i], "%s", t);
      } else if (eq && pass == 1) {
        *eq = '\0';
        int i = coll_index(t);
        if (i < 0 || i == C_MIXED || i == C_P2P) {
          fprintf(stderr, "coll_test: --algo: '%s' is not a collective it can check\n", t);
          usage(argv0);
        }
        snprintf(T.algo[i], sizeof T.algo[i], "%s", eq + 1);
      }
    }
  }
}

int main(int argc, char **argv) {
  bool any = false;
  int drop = -1;
  const char *order = NULL;
  kt_comm world = NULL; /* the launched communicator, when the test runs on a split */
  T.seed = 1;
  T.only_count = -1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) T.quick = true;
    else if (strcmp(argv[i], "--selftest") == 0) T.selftest = true;
    else if (strcmp(argv[i], "--verbose") == 0) T.verbose = true;
    else if (strcmp(argv[i], "--coll") == 0 && i + 1 < argc) parse_colls(argv[++i], argv[0]), any = true;
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) T.seed = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) T.only_count = atol(argv[++i]);
    else if (strcmp(argv[i], "--drop-rank") == 0 && i + 1 < argc) drop = atoi(argv[++i]);
    else if (strcmp(argv[i], "--order") == 0 && i + 1 < argc) order = argv[++i];
    else if (strcmp(argv[i], "--algo") == 0 && i + 1 < argc) T.algo_spec = argv[++i];
    else if (strcmp(argv[i], "--no-inplace") == 0 && i + 1 < argc) parse_no_inplace(argv[++i], argv[0]);
    else if (strcmp(argv[i], "--registered") == 0 && i + 1 < argc && strcmp(argv[i + 1], "all") == 0)
      T.registered = 1, i++;
    else if (strcmp(argv[i], "--registered") == 0 && i + 1 < argc && strcmp(argv[i + 1], "rank0") == 0)
      T.registered = 2, i++;
    else if (strcmp(argv[i], "--registered") == 0 && i + 1 < argc && strcmp(argv[i + 1], "flip") == 0)
      T.registered = 3, i++;
    else usage(argv[0]);
  }
  if (!any)
    for (int i = 0; i < C_NCOLL; i++) T.want[i] = true;
  if (T.algo_spec) {
    if (strlen(T.algo_spec) >= 512) {
      fprintf(stderr, "coll_test: --algo: too long\n");
      return 2;
    }
    parse_algo(argv[0]);
  }

  kt_result rc = kt_comm_init_env(&T.comm);
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL kt_comm_init_env: %s: %s\n", kt_strerror(rc), kt_last_error());
    return 1;
  }
  if (drop >= 0 || order) { /* a communicator from kt_comm_split: without rank `drop`, or in `order` */
    world = T.comm;
    int wrank = -1;
    kt_comm_rank(world, &wrank);
    int key = wrank;
    bool out = wrank == drop;
    if (order) {
      out = true;
      int i = 0;
      for (const char *q = order; *q; i++) {
        char *end;
        long r = strtol(q, &end, 10);
        if (end == q || (*end && *end != ',')) {
          fprintf(stderr, "coll_test: bad --order '%s'\n", order);
          return 2;
        }
        if (r == wrank) out = false, key = i;
        q = *end ? end + 1 : end;
      }
    }
    rc = kt_comm_split(world, out ? KT_SPLIT_NOCOLOR : 0, key, &T.comm);
    if (rc != KT_SUCCESS) {
      fprintf(stderr, "FAIL rank %d: kt_comm_split: %s: %s\n", wrank, kt_strerror(rc), kt_last_error());
      return 1;
    }
    if (out) {
      printf("coll_test: rank %d left out of the tested communicator\n", wrank);
      return kt_comm_destroy(world) == KT_SUCCESS ? 0 : 1;
    }
    /* world stays open until the end: its peers may still be splitting. */
  }
  if ((rc = kt_comm_rank(T.comm, &T.rank)) != KT_SUCCESS ||
      (rc = kt_comm_size(T.comm, &T.size)) != KT_SUCCESS) {
    fprintf(stderr, "FAIL kt_comm_rank/size: %s: %s\n", kt_strerror(rc), kt_last_error());
    return 1;
  }
  if (T.size > 64) {
    fprintf(stderr, "coll_test supports at most 64 ranks (got %d)\n", T.size);
    return 2;
  }
  ref_set_nranks(T.size);
  if (T.rank == 0)
    printf("coll_test: %d ranks, seed %" PRIu64 "%s\n", T.size, T.seed, T.quick ? ", quick" : "");

  for (int coll = 0; coll < C_NCOLL; coll++) {
    if (!T.want[coll]) continue;
    double t0 = now_s();
    long c0 = T.cases, f0 = T.failures;
    if (coll == C_BARRIER) run_barrier();
    else if (coll == C_MIXED) run_mixed();
    else run_coll(coll);
    check_algo(coll, colls[coll].name, true);
    char ran[256] = "";
    if (coll != C_MIXED && coll != C_P2P) kt__algos_run(&T.comm->g, coll == C_REDUCE_SCATTERV ? "reduce_scatter" : colls[coll].name, ran, sizeof ran);
    if (T.rank == 0)
      printf("coll_test: %-14s %5ld cases, %ld failed on rank 0, %.2f s%s%s\n", colls[coll].name,
             T.cases - c0, T.failures - f0, now_s() - t0, ran[0] ? ", ran " : "", ran);
    fflush(stdout);
  }

  if (T.registered) { /* the single-copy path ran where it should, and only there */
    unsigned long long runs = (unsigned long long)kt__memreg_direct_runs;
    bool want = T.registered == 1 && T.want[C_ALLREDUCE] && T.size > 1;
    if (want != (runs > 0)) {
      fprintf(stderr, "FAIL rank %d: %llu allreduce(s) ran single-copy; expected %s\n", T.rank, runs,
              want ? "some" : "none");
      T.failures++;
    } else if (T.rank == 0) {
      printf("coll_test: %llu allreduce(s) ran single-copy on rank 0\n", runs);
    }
  }
  /* every rank learns the total, so all exit with the same status */
  int64_t fails = T.failures, total = 0;
  rc = kt_allreduce(&fails, &total, 1, KT_INT64, KT_SUM, T.comm);
  if (rc != KT_SUCCESS) fatal_call("final tally", "kt_allreduce", rc);
  if (T.failures) fprintf(stderr, "rank %d: %ld of %ld cases failed\n", T.rank, T.failures, T.cases);
  if (T.selftest && T.rank == 0)
    printf("coll_test: selftest: %ld corruptions made on rank 0, each one checked for\n",
           T.corrupted);
  if (T.rank == 0)
    printf("coll_test: %s (%" PRId64 " failed cases over all ranks)\n", total ? "FAILED" : "PASSED",
           total);
  rc = kt_comm_destroy(T.comm);
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: kt_comm_destroy: %s: %s\n", T.rank, kt_strerror(rc), kt_last_error());
    return 1;
  }
  if (world && (rc = kt_comm_destroy(world)) != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: kt_comm_destroy(world): %s: %s\n", T.rank, kt_strerror(rc),
            kt_last_error());
    return 1;
  }
  return total ? 1 : 0;
}
