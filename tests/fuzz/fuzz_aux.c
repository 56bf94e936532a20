/* fuzz_aux.c - libFuzzer harness for the per-collective words peers post in
 * their slots of the segment (aux, aux2: kt__shm_set_aux / kt__shm_get_aux
 * in src/transport/shm.c, included here to reach the slots), as the
 * collectives that read them consume them, each run whole against forged
 * peers: alltoallv's largest block (src/coll/alltoallv_shm.c), the
 * single-copy ops' buffer addresses, write permits and broadcast tail
 * (src/coll/cma_shm.c: broadcast, scatter, gather, allgather, alltoall) and
 * the single-copy probe's address and verdict (cma_probe, shm.c).
 *
 * The segment is ordinary memory laid out for N ranks; this process is rank
 * 0, ranks 1 and 2 are forged: their slots hold the input's step (how far
 * this rank's waits get: the deadline is already past, so a wait that is not
 * satisfied ends at once with a timeout), this op's signatures, and the
 * input's aux and aux2 words for both parities. A peer's step and words do
 * not change during the op (a real peer's would between iterations). Each
 * peer's pid is a child of this process (forked once, it sleeps, and dies
 * with it), whose memory the peer's forged address points into: as a real
 * peer's, the single-copy reads and writes reach it and not this process.
 * A child holds, at the addresses this process has them, a 1 MiB read-only
 * buffer of known bytes and a 1 MiB writable one (the probe's magic word at
 * its start), each between inaccessible pages.
 *
 * Input (zeros past its end): byte 0 the collective; 1 flags (single copy:
 * probed, on or off; the root: this rank or a peer; in place; the dtype);
 * 2-3 the count; 4-9 alltoallv's counts to and from each rank; 10-11 the
 * peers' steps (255: 2^62, far ahead of any op); then for each peer, for aux[0], aux[1], aux2[0], aux2[1]: a
 * mode byte (a raw word, an offset into the read-only or the writable
 * buffer, a write permit for a step) and 8 bytes.
 * Checks besides crashes and sanitizer reports: every error is a known
 * result code with a message; what no honest peer can post (a largest block
 * no buffer holds, a broadcast tail other than the root's) is rejected by
 * an error naming that rank, not taken nor left to time out; a collective
 * that succeeds read exactly the bytes at the addresses posted (or the
 * peers' regions, for alltoallv, in as many windows as the largest block
 * posted needs), wrote its block where the peer offered it, and turned
 * single copy on only where every rank posted that it works; and every op
 * ends (libFuzzer's -timeout), also where no wait ever has to wait. */
#include "../../src/transport/shm.c"

#include "coll/coll.h"

#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define N 3
#define REGION 4096
#define P2P 4096
#define PEER_BYTES (1 << 20) /* each of a child's buffers */
#define CMA_PERMIT 0x4b5457524954454dull /* cma_shm.c's */
#define BCAST_SHARE_ALIGN 4096           /* cma_shm.c's */

#define FUZZ_NAME "fuzz_aux"
#define FUZZ_OWN_INIT
#include "fuzz_common.h"
#include "fuzz_segment.h"

/* ---- the fake communicator --------------------------------------------- */

/* The group the transports and algorithms see (rank 0 of N over the
 * segment in memory), and the op's context: made here and only here. */
static kt__group group;
static kt__shm shm;
static int32_t pids[N];
static void *base;
static size_t seg_bytes;

static kt__exec fake_comm(const kt__op *op) {
  free(group.scratch);
  memset(&group, 0, sizeof group);
  group.rank = 0;
  group.size = N;
  group.timeout_ms = 1000;
  group.peer_pid = pids;
  group.shm = &shm;
  group.abort_fd = -1;
  return (kt__exec){.group = &group, .op = op, .start_ns = kt__now_coarse_ns(), .deadline_ns = kt__now_ns() - 1};
}

/* ---- the peers' memory: a child process each ------------------------- */

static pid_t child[N]; /* [r]: peer r's process */
static char *ro, *rw; /* PEER_BYTES each, inaccessible pages either side */

static unsigned char ro_byte(uint64_t k) { return (unsigned char)(k * 7 + (k >> 9) + 3); }

static char *guarded(void) {
  char *p = mmap(NULL, PEER_BYTES + 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || mprotect(p + 4096, PEER_BYTES, PROT_READ | PROT_WRITE) != 0) abort();
  return p + 4096;
}

static void kill_children(void) {
  for (int r = 1; r < N; r++)
    if (child[r] > 0) {
      kill(child[r], SIGKILL);
      waitpid(child[r], NULL, 0);
      child[r] = 0;
    }
}

/* Peer r's child sleeps until killed, and dies with this process. */
static void spawn_child(int r) {
  pid_t parent = getpid();
  child[r] = fork();
  if (child[r] < 0) abort();
  if (child[r] == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    for (;;) pause();
  }
  pids[r] = (int32_t)child[r];
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("KAITIAN_DEBUG", "NONE", 1); /* quiet logs */
  kt__log_init();
  ro = guarded();
  rw = guarded();
  for (size_t k = 0; k < PEER_BYTES; k++) ro[k] = (char)ro_byte(k);
  if (mprotect(ro, PEER_BYTES, PROT_READ) != 0) abort();
  seg_bytes = segment_bytes(N, REGION, P2P);
  base = aligned_alloc(4096, seg_bytes); /* kept to the end */
  if (!base) abort();
  pids[0] = (int32_t)getpid();
  for (int r = 1; r < N; r++) spawn_child(r);
  atexit(kill_children);
  return 0;
}

/* A child that died (a forged write into its stack) is replaced; its
 * writable buffer starts with the probe's magic word again. */
static void ready_children(void) {
  for (int r = 1; r < N; r++) {
    if (waitpid(child[r], NULL, WNOHANG) != 0) spawn_child(r);
    uint64_t magic = CMA_MAGIC;
    struct iovec l = {&magic, sizeof magic}, rem = {rw, sizeof magic};
    if (process_vm_writev(child[r], &l, 1, &rem, 1, 0) != (ssize_t)sizeof magic) abort();
  }
}

/* len bytes at addr in peer r's child, into out; false where unreadable. */
static bool child_read(int r, uint64_t addr, void *out, size_t len) {
  struct iovec l = {out, len}, rem = {(void *)(uintptr_t)addr, len};
  return len == 0 || process_vm_readv(child[r], &l, 1, &rem, 1, 0) == (ssize_t)len;
}

/* ---- the segment and the forged slots ---------------------------------- */

static unsigned char region_byte(int r, int par, size_t k) {
  return (unsigned char)(r * 67 + par * 29 + k * 5 + (k >> 8));
}

static void setup_segment(const kt__op *op, const uint64_t steps[N]) {
  fuzz_segment(&shm, base, seg_bytes, N, REGION, P2P);
  sig g;
  kt__op_sig(op, N, &g);
  for (int r = 1; r < N; r++) {
    shm_slot *sl = slot_at(base, r);
    atomic_store(&sl->step, steps[r]);
    sl->sigs[0] = sl->sigs[1] = g;
    atomic_store(&sl->beat_ns, kt__now_coarse_ns());
    for (int par = 0; par < 2; par++) {
      unsigned char *reg = (unsigned char *)base + data_offset(N) + ((size_t)r * 4 + (size_t)par) * REGION;
      for (size_t k = 0; k < REGION; k++) reg[k] = region_byte(r, par, k);
    }
  }
}

/* A peer's word: mode, then 8 bytes. */
typedef struct word {
  int mode; /* 0 raw, 1 into ro, 2 into rw, 3 a permit */
  int64_t off;
  uint64_t v;
} word;

static word read_word(const uint8_t *q) {
  word w = {.mode = q[0] % 4};
  uint64_t x = get_le(q + 1, 8);
  switch (w.mode) {
    case 0: w.v = x; break;
    case 1:
    case 2:
      w.off = (int64_t)(int32_t)((uint32_t)x << 8) >> 8; /* +-8 MiB: inside, before or past */
      w.v = (uint64_t)(uintptr_t)(w.mode == 1 ? ro : rw) + (uint64_t)w.off;
      break;
    default: w.v = CMA_PERMIT ^ (x & 0xff);
  }
  return w;
}

/* ---- checks ------------------------------------------------------------ */

static void known_error(kt_result r) {
  check(r > KT_SUCCESS && r <= KT_ERR_INTERNAL, "a known result code");
  check(kt_last_error()[0] != '\0', "an error has a message");
}

/* msg names rank r ("rank 1", not "rank 12"). */
static bool names_rank(const char *msg, int r) {
  char need[32];
  int n = snprintf(need, sizeof need, "rank %d", r);
  for (const char *p = strstr(msg, need); p; p = strstr(p + 1, need))
    if (p[n] < '0' || p[n] > '9') return true;
  return false;
}

/* An impossible value of rank r was rejected at once, naming r. */
static void rejected(kt_result res, int r, const char *what) {
  if (res == KT_SUCCESS || res == KT_ERR_TIMEOUT || !names_rank(kt_last_error(), r)) {
    fprintf(stderr, FUZZ_NAME ": %s: result %d\n", what, (int)res);
    check(false, what);
  }
}

/* len bytes at p are the read-only buffer's at w's offset + from (where
 * that lies inside it). */
static void ro_at(const word *w, uint64_t from, const unsigned char *p, size_t len) {
  if (w->mode != 1 || w->off < 0 || (uint64_t)w->off + from + len > PEER_BYTES) return;
  for (size_t k = 0; k < len; k++)
    if (p[k] != ro_byte((uint64_t)w->off + from + k)) {
      fprintf(stderr, FUZZ_NAME ": byte %zu is %u, the peer's buffer has %u\n", k, p[k],
              ro_byte((uint64_t)w->off + from + k));
      check(false, "the bytes read are the peer's at the address it posted");
    }
}

/* Peer r's writable buffer at w's offset + from holds len bytes of src. */
static void rw_holds(int r, const word *w, uint64_t from, const void *src, size_t len) {
  if (w->mode != 2 || w->off < 0 || (uint64_t)w->off + from + len > PEER_BYTES) return;
  unsigned char *got = malloc(len ? len : 1);
  if (!got) abort();
  check(child_read(r, w->v + from, got, len), "the block written is in the peer's buffer");
  check(memcmp(got, src, len) == 0, "the block written is where the peer offered it");
  free(got);
}

/* ---- the collectives --------------------------------------------------- */

typedef struct input {
  int coll, cma, root, in_place;
  kt_dtype dtype;
  size_t count;
  uint8_t vc[2][N]; /* alltoallv: elements to, from each rank */
  uint64_t steps[N];
  word aux[N][2], aux2[N][2];
} input;

static void fill(void *p, size_t n, unsigned seed) {
  for (size_t k = 0; k < n; k++) ((unsigned char *)p)[k] = (unsigned char)(seed + k * 11 + (k >> 8));
}

static void *alloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) abort();
  return p;
}

/* alltoall(v) through the regions (kt__alltoallv_shm, also single copy's
 * fallback, after extra posts of the probe); res its result. */
static void check_alltoall(const kt__op *op, kt_result res, const input *in, uint64_t extra) {
  bool v = op->coll == KT_COLL_ALLTOALLV;
  size_t es = kt_dtype_size(op->dtype);
  size_t slen[N], rlen[N], roff[N], soff[N], maxlen = 0;
  for (int i = 0; i < N; i++) {
    slen[i] = (v ? op->counts[i] : op->count) * es;
    rlen[i] = (v ? op->counts2[i] : op->count) * es;
    soff[i] = (v ? op->displs[i] : (size_t)i * op->count) * es;
    roff[i] = (v ? op->displs2[i] : (size_t)i * op->count) * es;
    maxlen = KT_MAX(maxlen, KT_MAX(slen[i], rlen[i]));
  }
  if (slen[0] != rlen[0]) {
    check(res == KT_ERR_INVALID_ARGUMENT, "a block to itself of another size is refused");
    return;
  }
  bool agreed = !v || (in->steps[1] >= 1 && in->steps[2] >= 1); /* the first wait is passed */
  uint64_t posted = 0;
  int culprit = -1;
  for (int r = 1; r < N && v; r++) {
    uint64_t m = in->aux[r][0].v;
    if (m > (uint64_t)PTRDIFF_MAX && culprit < 0) culprit = r;
    posted = KT_MAX(posted, m);
  }
  if (agreed && culprit >= 0) {
    rejected(res, culprit, "a largest block no buffer holds is rejected, naming the rank");
    return;
  }
  if (res != KT_SUCCESS) return;
  check(culprit < 0, "no largest block beyond PTRDIFF_MAX taken");
  maxlen = KT_MAX(maxlen, (size_t)posted);
  size_t win = REGION / N / 64 * 64;
  uint64_t windows = (maxlen + win - 1) / win;
  check(shm.step == extra + (v ? 1 : 0) + windows, "one post per window of the largest block");
  const unsigned char *rb = op->recvbuf;
  check(memcmp(rb + roff[0], (const char *)op->sendbuf + soff[0], rlen[0]) == 0, "this rank's own block copied");
  for (int s = 1; s < N; s++)
    for (size_t off = 0, w = 0; off < rlen[s]; off += win, w++) {
      int par = (int)((w + (v ? 1 : 0)) & 1);
      for (size_t k = 0; k < KT_MIN(win, rlen[s] - off); k++)
        check(rb[roff[s] + off + k] == region_byte(s, par, k), "the block from a peer is its region's");
    }
}

static void run(const input *in) {
  size_t es = kt_dtype_size(in->dtype), bytes = in->count * es, pb = (size_t)N * bytes;
  kt__op op = {.coll = KT_COLL_BROADCAST, .count = in->count, .dtype = in->dtype, .op = KT_SUM, .seq = 1};
  size_t counts[4][N] = {{0}};
  char *sb = NULL, *rb = NULL;
  bool me_root = in->root == 0;
  switch (in->coll) {
    case 0: { /* alltoallv */
      op.coll = KT_COLL_ALLTOALLV;
      op.count = 0;
      size_t st = 0, rt = 0;
      for (int i = 0; i < N; i++) {
        counts[0][i] = in->vc[0][i];
        counts[1][i] = st;
        counts[2][i] = in->vc[1][i];
        counts[3][i] = rt;
        st += in->vc[0][i];
        rt += in->vc[1][i];
      }
      op.counts = counts[0];
      op.displs = counts[1];
      op.counts2 = counts[2];
      op.displs2 = counts[3];
      sb = alloc(st * es);
      rb = alloc(rt * es);
      fill(sb, st * es, 1);
      break;
    }
    case 1: /* broadcast */
      rb = alloc(bytes);
      sb = me_root && in->in_place ? rb : me_root ? alloc(bytes) : NULL;
      if (me_root) fill(sb, bytes, 2);
      break;
    case 2: /* scatter */
      op.coll = KT_COLL_SCATTER;
      if (me_root) {
        sb = alloc(pb);
        fill(sb, pb, 3);
      }
      rb = me_root && in->in_place ? sb : alloc(bytes);
      break;
    case 3: /* gather */
      op.coll = KT_COLL_GATHER;
      if (me_root) rb = alloc(pb);
      sb = me_root && in->in_place ? rb : alloc(bytes);
      fill(sb, bytes, 4);
      break;
    case 4: /* allgather */
      op.coll = KT_COLL_ALLGATHER;
      rb = alloc(pb);
      sb = in->in_place ? rb : alloc(bytes);
      fill(sb, bytes, 5);
      break;
    default: /* alltoall */
      op.coll = KT_COLL_ALLTOALL;
      sb = alloc(pb);
      rb = alloc(pb);
      fill(sb, pb, 6);
  }
  op.root = in->root;
  op.sendbuf = sb;
  op.recvbuf = rb;
  setup_segment(&op, in->steps);
  for (int r = 1; r < N; r++)
    for (int par = 0; par < 2; par++) {
      atomic_store(&slot_at(base, r)->aux[par], in->aux[r][par].v);
      atomic_store(&slot_at(base, r)->aux2[par], in->aux2[r][par].v);
    }
  shm.cma = in->cma == 0 ? 0 : in->cma == 1 ? 1 : -1;
  kt__exec ex = fake_comm(&op);
  kt__clear_error();
  kt_result res;
  switch (in->coll) {
    case 0: res = kt__alltoallv_shm(&ex); break;
    case 1: res = kt__broadcast_shm_cma(&ex); break;
    case 2: res = kt__scatter_shm_cma(&ex); break;
    case 3: res = kt__gather_shm_cma(&ex); break;
    case 4: res = kt__allgather_shm_cma(&ex); break;
    default: res = kt__alltoall_shm_cma(&ex);
  }
  static int trace = -1; /* FUZZ_AUX_TRACE=1: each input's outcome on stderr */
  if (trace < 0) trace = getenv("FUZZ_AUX_TRACE") != NULL;
  if (trace)
    fprintf(stderr, FUZZ_NAME ": %s, %zu bytes, root %d: result %d, single copy %d, %llu posts: %s\n",
            kt__coll_name(op.coll), bytes, in->root, (int)res, shm.cma, (unsigned long long)shm.step,
            res ? kt_last_error() : "");
  if (res != KT_SUCCESS) known_error(res);
  check(strlen(kt_last_error()) < 1024, "the message within its buffer");

  /* The probe: single copy on only where every rank posted that it works
   * (its second iteration, parity 1). */
  if (in->coll != 0 && in->cma == 0 && shm.cma == 1)
    check(in->aux[1][1].v == 1 && in->aux[2][1].v == 1, "single copy on only where every rank says it works");
  bool cma = in->coll != 0 && shm.cma == 1;
  uint64_t pub = (in->cma == 0 ? 2 : 0) + 1; /* the step of the post publishing the buffers (parity 0) */
  int R = in->root;
  if (in->coll == 0 || (in->coll == 5 && !cma)) {
    check_alltoall(&op, res, in, in->coll == 5 && in->cma == 0 ? 2 : 0);
  } else if (cma && in->coll == 1 && !me_root) {
    uint64_t tail = in->aux2[R][0].v, share = bytes / N / BCAST_SHARE_ALIGN * BCAST_SHARE_ALIGN;
    bool waited = in->steps[R] >= pub;
    if (waited && tail != 0 && tail != share)
      rejected(res, R, "a broadcast tail other than the root's is rejected, naming the root");
    else if (res == KT_SUCCESS)
      ro_at(&in->aux[R][0], 0, (unsigned char *)rb, bytes - tail);
  } else if (cma && in->coll == 1 && res == KT_SUCCESS) { /* the root, in place: its share into each reader's */
    size_t tail = in->in_place ? bytes / N / BCAST_SHARE_ALIGN * BCAST_SHARE_ALIGN : 0;
    for (int r = 1; r < N && tail; r++) {
      check(in->aux2[r][0].v == (CMA_PERMIT ^ pub), "written only where permitted");
      rw_holds(r, &in->aux[r][0], bytes - tail, sb + (bytes - tail), tail);
    }
  } else if (cma && in->coll == 2 && !me_root && res == KT_SUCCESS) {
    ro_at(&in->aux[R][0], 0, (unsigned char *)rb, bytes);
  } else if (cma && in->coll == 3 && !me_root && res == KT_SUCCESS) {
    check(in->aux2[R][0].v == (CMA_PERMIT ^ pub), "written only where permitted");
    rw_holds(R, &in->aux[R][0], 0, sb, bytes);
  } else if (cma && (in->coll == 4 || in->coll == 5) && res == KT_SUCCESS) {
    for (int r = 1; r < N; r++) ro_at(&in->aux[r][0], 0, (unsigned char *)rb + (size_t)r * bytes, bytes);
  }
  /* This rank's own block (rank 0: the first), or the root's data. */
  if (res == KT_SUCCESS && in->coll != 0 && (me_root || in->coll >= 4))
    check(memcmp(rb, sb, bytes) == 0, "this rank's own block copied");
  if (sb != rb) free(sb);
  free(rb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  uint8_t b[12 + (N - 1) * 4 * 9] = {0};
  memcpy(b, data, KT_MIN(size, sizeof b));
  ready_children();
  input in;
  memset(&in, 0, sizeof in);
  in.coll = b[0] % 6;
  in.cma = b[1] & 3;
  if (in.cma == 3) in.cma = 2;
  in.root = b[1] & 4 ? 0 : b[1] & 8 ? 2 : 1;
  in.in_place = (b[1] >> 4) & 1;
  static const kt_dtype dts[8] = {KT_INT8,    KT_UINT8,    KT_INT32,   KT_INT64,
                                  KT_FLOAT16, KT_BFLOAT16, KT_FLOAT32, KT_FLOAT64};
  in.dtype = dts[b[1] >> 5];
  in.count = get_le(b + 2, 2);
  for (int i = 0; i < N; i++) {
    in.vc[0][i] = b[4 + i];
    in.vc[1][i] = b[4 + N + i];
  }
  in.vc[1][0] = b[4 + N] & 0x80 ? b[4 + N] & 0x7f : in.vc[0][0]; /* mostly a block to itself of one size */
  in.steps[0] = 0;
  for (int r = 1; r < N; r++) /* 255: a step far ahead (a corrupt slot), so no wait ever has to wait */
    in.steps[r] = b[10 + r - 1] == 255 ? (uint64_t)1 << 62 : b[10 + r - 1];
  const uint8_t *q = b + 12;
  for (int r = 1; r < N; r++)
    for (int k = 0; k < 4; k++, q += 9) {
      word w = read_word(q);
      if (k < 2) in.aux[r][k] = w;
      else in.aux2[r][k - 2] = w;
    }
  run(&in);
  return 0;
}
