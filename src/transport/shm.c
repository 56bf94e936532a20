/* shm.c - the shared-memory segment of a communicator: creation and mapping,
 * step counters, futex sleeping, liveness and signature checks. See shm.h. */
#include "shm.h"

#include "memreg.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x324d48535454424bull /* "KBTTSHM2" */
#define SHM_HDR_BYTES 4096
#define SHM_SLOT_MAIN 512 /* shm_slot; then the rank's small-message lines */
#define SHM_LL_LINES KT_SHM_LL_LINES /* per small-message slot (shm.h) */
#define SHM_LL_SLOTS 64   /* small-message slots per rank: op k uses slot k mod 64 */
#define SHM_LL_AHEAD 32   /* op k is written once every peer has written op k - 32 */
/* Slots are 2560 bytes apart modulo 4096 (the lines take whole pages): at
 * 8704 (512 modulo 4096) a shm broadcast of 512 B at 2 ranks took 0.40 us
 * against 0.34-0.36 (interleaved runs); the 2 KiB of padding restore it. */
#define SHM_SLOT_PAD 2048
_Static_assert(SHM_LL_SLOTS * SHM_LL_LINES * 64 % 4096 == 0, "small-message lines in whole pages");
#define SHM_SLOT_BYTES (SHM_SLOT_MAIN + SHM_LL_SLOTS * SHM_LL_LINES * 64 + SHM_SLOT_PAD)
#define SHM_MAPS 4 /* peers' registered buffers kept mapped, per peer */
#define SHM_LIVENESS_NS 100000000 /* check pids and sockets every 100 ms asleep */
#define SHM_CYCLE_MAX 64         /* longest cycle of waiting sends looked for */
#define SHM_MIN_REGION 65536     /* defaults shrink to fit /dev/shm down to these */
#define SHM_MIN_P2P 65536
/* What every "no room in /dev/shm" error of the segment ends with. */
#define SEGMENT_HINT                                                                                     \
  "(is /dev/shm large enough? KAITIAN_SHM_CHUNK_BYTES and KAITIAN_SHM_P2P_BYTES size the segment; " \
  "KAITIAN_TRANSPORT=tcp needs none)"

typedef kt__sig sig;

typedef struct shm_hdr {
  _Atomic uint64_t magic; /* written last by the creator */
  uint32_t nlocal;
  uint32_t pad0;
  uint64_t region;           /* sizes chosen by the creator (kt__shm_setup) */
  uint64_t p2p;
  uint64_t bytes;
  _Atomic uint32_t gen;      /* futex word: bumped by a post when someone sleeps */
  _Atomic uint32_t nwaiters; /* ranks asleep (or about to be) on gen */
  _Atomic uint32_t mapped;   /* ranks that mapped the segment */
  _Atomic int32_t failed;    /* kt_result of the first failure, 0 if none */
  _Atomic int32_t failed_rank;
  char failed_msg[1024];
} shm_hdr;

/* step and both signatures share the slot's first cache line: a peer's wait
 * and its signature check cost one cache-line transfer. */
typedef struct shm_slot {
  _Atomic uint64_t step;
  sig sigs[2]; /* by iteration parity: a peer is never 2 iterations ahead */
  _Atomic uint64_t aux[2], aux2[2];
  /* While this rank waits in a send-only kt__shm_p2p on a full ring:
   * (episode << 32) | (destination + 1); the low half is 0 otherwise. The
   * episode number changes every time it starts waiting. */
  _Atomic uint64_t blocked;
  /* Written once at setup, before this rank counts itself mapped: the CPUs
   * it may run on (bit i: CPU i), when its mask fits in a cpu_set_t. */
  uint32_t cpus_known;
  uint64_t cpus[CPU_SETSIZE / 64];
  /* Single-copy allreduce, by the parity of the op's first iteration (as the
   * signatures: a peer may be one op ahead when this one's last wait is for
   * nothing): written before the op's first post (offer, buffers) and before
   * its second (ok). */
  uint32_t direct_offer[2]; /* 1: this rank's buffers are registered, in dbuf */
  uint32_t direct_ok[2];    /* 1: it mapped every peer's buffers */
  kt__membuf dbuf[2][2];    /* [parity][send, receive] */
  /* When this rank last showed activity on this communicator (CLOCK_MONOTONIC
   * ns to the kernel tick, kt__now_coarse_ns): at the start of each op, and
   * every SHM_LIVENESS_NS while it sleeps in a wait. A peer's timeout names
   * the ranks whose beat is old: the one that is stopped, hung or busy
   * elsewhere, not only the neighbour waited for. */
  _Atomic int64_t beat_ns;
} shm_slot;

_Static_assert(sizeof(shm_hdr) <= SHM_HDR_BYTES, "header fits");
_Static_assert(sizeof(shm_slot) <= SHM_SLOT_MAIN, "slot fits");

/* A line of the small-message protocol: the payload and, beside it in the
 * same cache line, the number of the op that wrote it. A reader polls the
 * line itself: one cache-line transfer brings both the flag and the data.
 * Line 0 holds the op's signature (24 bytes) and 32 bytes of payload; the
 * others 56 bytes each. */
typedef struct ll_line {
  _Atomic uint64_t flag;
  unsigned char data[56];
} ll_line;
_Static_assert(sizeof(ll_line) == 64, "one cache line");
_Static_assert(sizeof(kt__sig) == 24, "the signature fills line 0's first 24 bytes");
#define LL_FIRST 32 /* payload bytes in line 0 */
#define LL_MAX_BYTES (LL_FIRST + (SHM_LL_LINES - 1) * 56)
_Static_assert(LL_MAX_BYTES == KT_SHM_LL_MAX, "small-message payload");
_Static_assert(offsetof(shm_slot, sigs) + sizeof(sig[2]) <= 64, "step and signatures in one cache line");
/* A slot is rewritten SHM_LL_SLOTS ops later; its op's signatures are
 * compared SHM_LL_AHEAD ops later, before any peer can rewrite it. */
_Static_assert(SHM_LL_SLOTS >= 2 * SHM_LL_AHEAD && SHM_LL_AHEAD >= 1, "small-message slots");

struct kt__shm {
  void *base;
  size_t bytes;
  shm_hdr *hdr;
  int n, me;
  size_t region;
  int fd;                /* the segment's file: rings are reserved on first use */
  uint64_t step;         /* my posts so far (mirrors my slot) */
  uint64_t iter;         /* iterations begun */
  uint64_t prev_arrive;  /* step of my first post in the previous iteration */
  uint64_t all_reached;  /* every rank is known to be at least here */
  bool sig_checked;      /* this op's signatures were compared */
  sig cur;               /* signature of the op in progress */
  int par;               /* parity of the current iteration */
  bool oversubscribed;   /* more local ranks than CPUs: yield, do not spin */
  bool asym_fence;       /* kt__heavy_fence_ok(): posts leave the fence to sleepers (ll_publish) */
  int64_t spin_ns;
  struct chan *chans;    /* point-to-point ring heads, one per ordered pair */
  char *rings;           /* their rings, p2p bytes each */
  size_t p2p;            /* bytes of each ring */
  bool *ring_reserved;   /* [dst]: my ring to dst has its pages (reserve_ring) */
  uint32_t episode;      /* my send-only waits so far (slot's blocked) */
  struct peer_map *maps; /* peers' registered buffers mapped here, SHM_MAPS per rank */
  uint64_t map_clock;    /* for least-recently-used eviction */
  uint64_t ll_seq;       /* small-message ops so far (the flag of my lines) */
  int ll_cmp[SHM_LL_SLOTS]; /* whose signature of that slot's op was compared: LL_CMP_* or a rank */
  uint64_t ll_all;       /* every op up to this one was compared with every peer */
  bool direct_off;       /* mapping a peer's buffer failed once: offer no more */
  int cma;               /* process_vm_readv between every pair: 0 not probed yet, 1 works, -1 not */
};

/* A peer's registered buffer (a whole file) mapped into this process. */
struct peer_map {
  uint64_t dev, ino;
  char *base; /* NULL: unused */
  size_t len;
  uint64_t used;
};

/* Head of the ring from one rank to another (the heads are together after
 * the slots; the rings after the regions). Each counter has one writer: head
 * the sender, tail the receiver. */
typedef struct chan {
  _Atomic uint64_t head; /* bytes the sender has written, ever */
  char pad0[56];
  _Atomic uint64_t tail; /* bytes the receiver has consumed, ever */
  char pad1[56];
} chan;
#define CHAN_HDR_BYTES 128
_Static_assert(sizeof(chan) == CHAN_HDR_BYTES, "chan header size");

static shm_slot *slot_at(void *base, int r) {
  return (shm_slot *)((char *)base + SHM_HDR_BYTES + (size_t)r * SHM_SLOT_BYTES);
}

static shm_slot *slot(const kt__shm *s, int r) { return slot_at(s->base, r); }

/* Rank r's small-message line i of slot k (op k mod SHM_LL_SLOTS). The
 * slots' lines 0, which every small op writes, are adjacent: a rank that runs
 * ops ahead streams through consecutive lines. With a slot's lines back to
 * back (when it had 16), the lines 0 of 64 slots, 1 KiB apart, fell in a
 * few sets of a cache: 2 ranks' 8 B reduce took 0.64 us against 0.41 with 8
 * slots. Each
 * slot's other lines follow all the lines 0, contiguous per slot (one line
 * apart per op, they would be 4 KiB apart and share a set). */
static ll_line *ll_at(const kt__shm *s, int r, int k, int i) {
  ll_line *lines = (ll_line *)((char *)slot(s, r) + SHM_SLOT_MAIN);
  return i == 0 ? lines + k : lines + SHM_LL_SLOTS + k * (SHM_LL_LINES - 1) + (i - 1);
}

/* Layout: header, n slots, n^2 ring heads (all reserved by the creator);
 * then from data_offset the 4n regions (each rank reserves its own); then
 * the n^2 rings (each reserved by its sender when it first sends). */
static size_t chans_offset(int n) { return SHM_HDR_BYTES + (size_t)n * SHM_SLOT_BYTES; }

static size_t data_offset(int n) {
  size_t off = chans_offset(n) + (size_t)n * (size_t)n * CHAN_HDR_BYTES;
  return (off + 4095) & ~(size_t)4095;
}

static size_t rings_offset(int n, size_t region) {
  return (data_offset(n) + (size_t)n * 4 * region + 4095) & ~(size_t)4095;
}

static size_t segment_bytes(int n, size_t region, size_t p2p) {
  return rings_offset(n, region) + (size_t)n * (size_t)n * p2p;
}

static chan *chan_of(const kt__shm *s, int from, int to) { return &s->chans[(size_t)from * (size_t)s->n + (size_t)to]; }

static char *ring_of(const kt__shm *s, int from, int to) {
  return s->rings + ((size_t)from * (size_t)s->n + (size_t)to) * s->p2p;
}

size_t kt__shm_region_bytes(const kt__group *c) { return c->shm->region; }

bool kt__shm_oversubscribed(const kt__group *c) { return c->shm->oversubscribed; }

char *kt__shm_region(const kt__group *c, int r, int which, int par) {
  const kt__shm *s = c->shm;
  return (char *)s->base + data_offset(s->n) + ((size_t)r * 4 + (size_t)which * 2 + (size_t)par) * s->region;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void wake_now(kt__shm *s) {
  atomic_fetch_add(&s->hdr->gen, 1);
  futex(&s->hdr->gen, FUTEX_WAKE, INT_MAX, NULL);
}

/* After a seq_cst store a waiter may be waiting for: wake sleepers, if any. */
static void wake_sleepers(kt__shm *s) {
  if (atomic_load_explicit(&s->hdr->nwaiters, memory_order_seq_cst)) wake_now(s);
}

/* Store flag = v as the small-message protocol's last store of a post, then
 * wake sleepers. A waiter going to sleep counts itself in nwaiters and then
 * looks at what it waits for once more; a poster stores, then reads
 * nwaiters. Each side's store must be seen before its load (else both miss:
 * the waiter sleeps through a 20 ms slice). The posts, the hot side, leave
 * that to the sleepers where they can (kt__heavy_fence; decided per process:
 * the ranks of a segment share a kernel, and a rank whose seccomp forbade
 * membarrier while a peer's allowed it would cost stalls of a slice, not
 * errors). On a 2-vCPU VM a 2-rank 8 B broadcast took 0.15 us with the post
 * unfenced (a throwaway build without the sleepers' side) and 0.17 with its
 * full fence (a locked exchange, which waits for the line's transfer). */
static void ll_publish(kt__shm *s, _Atomic uint64_t *flag, uint64_t v) {
  if (s->asym_fence) {
    atomic_store_explicit(flag, v, memory_order_release);
    kt__light_fence();
    if (atomic_load_explicit(&s->hdr->nwaiters, memory_order_relaxed)) wake_now(s);
    return;
  }
  atomic_store_explicit(flag, v, memory_order_seq_cst);
  wake_sleepers(s);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- setup ---------------------------------------------------------------- */

/* My affinity mask into my slot (left unknown when it does not fit). */
static void publish_cpus(shm_slot *me) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set)) me->cpus[cpu / 64] |= 1ull << (cpu % 64);
  me->cpus_known = 1;
}

/* The CPUs the n local ranks may run on together: the union of their
 * affinity masks (so `taskset -c 0 kaitian run -n 2` counts 1), or the online
 * CPUs when a rank's mask is unknown. Every rank has published its mask. */
static int local_cpus(void *base, int n) {
  uint64_t all[CPU_SETSIZE / 64] = {0};
  for (int r = 0; r < n; r++) {
    const shm_slot *sl = slot_at(base, r);
    if (!sl->cpus_known) {
      long online = sysconf(_SC_NPROCESSORS_ONLN);
      return online > 0 ? (int)online : 0;
    }
    for (int w = 0; w < CPU_SETSIZE / 64; w++) all[w] |= sl->cpus[w];
  }
  int count = 0;
  for (int w = 0; w < CPU_SETSIZE / 64; w++) count += __builtin_popcountll(all[w]);
  return count;
}

static void segment_name(const kt__group *c, char *buf, size_t cap) {
  uint64_t h = kt__fnv1a_str(KT_FNV1A_BASIS, c->prefix);
  const char *job = kt__param_JOB_ID();
  snprintf(buf, cap, "/kaitian-%.40s-%016llx-%d", job[0] ? job : "nojob", (unsigned long long)h,
           c->peer_pid[0]);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Map pages of the segment into this process's page tables now: the
 * header, the slots and their small-message lines, then every rank's
 * regions once reserved. Left to first use, every size that reaches
 * lines not used before (each new multiple of 56 bytes, in 64 slots of
 * every rank) paid a page fault per page in the writer and in every reader:
 * 157 more minor faults in a run of 8 B-4 KiB allreduces at 2 ranks than at
 * 8 B alone, hundreds of microseconds each time the size changed (64 B
 * at 2x 32 B's and 128 B's time); each region page a larger size first
 * reached did the same. The pages exist (fallocated); this only maps them,
 * writing nothing. */
static void prefault(void *base, size_t bytes) {
  if (madvise(base, bytes, MADV_POPULATE_WRITE) == 0) return;
  long page = sysconf(_SC_PAGESIZE); /* older kernels: a read of each page maps it */
  for (size_t off = 0; off < bytes; off += (size_t)(page > 0 ? page : 4096))
    (void)*(volatile const char *)((const char *)base + off);
}

/* Map an existing or new segment of `bytes`; returns MAP_FAILED on error. */
static void *map_fd(int fd, size_t bytes) {
  return mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
}

/* Record rank's failure in the segment; the first failure's text wins
 * (writers race only on "first"). */
static void record_failure(shm_hdr *h, int rank, kt_result r, const char *msg) {
  int32_t zero = 0;
  if (atomic_compare_exchange_strong(&h->failed_rank, &zero, rank + 1)) {
    snprintf(h->failed_msg, sizeof h->failed_msg, "%s", msg);
    atomic_store_explicit(&h->failed, (int32_t)r, memory_order_release);
  }
}

/* The code of a failure a peer recorded in the segment: one that is no
 * error code (a corrupt segment) reads as KT_ERR_ABORTED, as over TCP. */
static kt_result failure_code(int32_t f) {
  return f > 0 && f <= KT_ERR_INTERNAL ? (kt_result)f : KT_ERR_ABORTED;
}

static bool peer_alive(const kt__group *c, int r) {
  return c->peer_pid[r] <= 0 || kill(c->peer_pid[r], 0) == 0 || errno != ESRCH;
}

/* A rank whose setup failed says why on its control socket before closing it
 * (kt_comm_init): ranks still waiting here stop with its reason, including
 * one that would otherwise wait for a segment the leader already removed. */
static kt_result setup_check_peers(kt__group *c) {
  kt__exec ex = {.group = c};
  return kt__net_check_peers(&ex);
}

/* Bytes of /dev/shm that this process's communicators counted for their
 * rings (each rank's n - 1 rings to its peers, reserved only when first
 * used) and have not reserved yet. Every rank publishes it when a
 * communicator is made, and the creator of the new segment leaves that room
 * free: a later communicator cannot take the pages an earlier one counted on,
 * which would make the earlier one's first send/recv fail. */
static _Atomic uint64_t owed_bytes;

uint64_t kt__shm_owed(void) { return atomic_load(&owed_bytes); }

/* Default sizes (the variables unset) shrink, by halving, until the whole
 * segment (every region and every ring, although rings are reserved only
 * when used) takes at most 3/4 of what /dev/shm has free beyond the owed
 * bytes of the ranks' other communicators: a container's small /dev/shm then
 * costs speed on large messages, not the job. Sizes a user set are kept; if
 * they do not fit, reserving fails with a clear error. Returns the free
 * bytes it found (0: not measured, sizes kept); *fits is false when even the
 * smallest sizes need more than what is free and not owed. */
static uint64_t fit_sizes(int fd, int n, uint64_t owed, size_t *region, size_t *p2p, bool *fits) {
  bool fit_region = !kt__param_set_SHM_CHUNK_BYTES(), fit_p2p = !kt__param_set_SHM_P2P_BYTES();
  struct statvfs v;
  *fits = true;
  if ((!fit_region && !fit_p2p) || fstatvfs(fd, &v) != 0) return 0;
  uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, room = avail > owed ? avail - owed : 0;
  uint64_t budget = room / 4 * 3;
  for (;;) {
    uint64_t regions = (uint64_t)n * 4 * *region, rings = (uint64_t)n * (uint64_t)(n - 1) * *p2p;
    uint64_t need = data_offset(n) + regions + rings;
    if (need <= budget) break;
    bool can_r = fit_region && *region > SHM_MIN_REGION, can_p = fit_p2p && *p2p > SHM_MIN_P2P;
    if (can_r && (regions >= rings || !can_p)) *region /= 2;
    else if (can_p) *p2p /= 2;
    else { /* as small as allowed */
      *fits = need <= room;
      break;
    }
  }
  return avail;
}

/* Once per job: a job's other communicators (torch makes three per group,
 * and more per new_group) shrink for the same reason. The warning goes out
 * once per process, from the job's rank 0 (RANK, else any process); every
 * other shrink is logged at INFO. */
static _Atomic int shrink_warned;

/* WARN the first time in the process, from the job's rank 0 (RANK, else
 * any process); INFO otherwise. */
static int once_per_job(_Atomic int *warned) {
  const char *job_rank = getenv("RANK");
  bool job_rank0 = !job_rank || !*job_rank || !strcmp(job_rank, "0");
  return job_rank0 && atomic_exchange(warned, 1) == 0 ? KT_LOG_WARN : KT_LOG_INFO;
}

static void warn_shrunk(const kt__group *c, uint64_t avail, uint64_t owed, size_t region, size_t region0,
                        size_t p2p, size_t p2p0, int n) {
  if (region == region0 && p2p == p2p0) return;
  int level = once_per_job(&shrink_warned);
  char what[256] = "";
  int k = 0;
  if (region != region0)
    k = snprintf(what, sizeof what, "regions of %zu KiB instead of %zu KiB (KAITIAN_SHM_CHUNK_BYTES)", region >> 10,
                 region0 >> 10);
  if (p2p != p2p0 && k >= 0 && (size_t)k < sizeof what)
    snprintf(what + k, sizeof what - (size_t)k, "%spoint-to-point rings of %zu KiB instead of %zu KiB "
             "(KAITIAN_SHM_P2P_BYTES)", k ? " and " : "", p2p >> 10, p2p0 >> 10);
  char owing[160] = "";
  if (owed)
    snprintf(owing, sizeof owing, " (%.1f MiB of it kept for the rings of this job's other communicators here)",
             (double)owed / (1 << 20));
  KT_LOG_AT(level,
            "rank %d: /dev/shm has %.1f MiB free, too little for the shared memory of %d ranks with the default "
            "sizes%s: %s; large messages move in smaller pieces. Give /dev/shm more room (docker run --shm-size, a "
            "Kubernetes emptyDir with medium Memory), or set the sizes with those variables",
            c->rank, (double)avail / (1 << 20), n, owing, what);
}

/* Reserve the pages I write (my regions) myself: they come from my NUMA
 * node, since `kaitian run` binds ranks to CPUs, and the readers' side of
 * every transfer is the only remote one. Reserving them now makes a /dev/shm
 * too small for the segment an error here, not a SIGBUS in the middle of an
 * operation. */
static kt_result reserve_regions(kt__group *c, int fd, shm_hdr *h, const char *name, size_t region) {
  int n = c->size;
  int fe = posix_fallocate(fd, (off_t)(data_offset(n) + (size_t)c->rank * 4 * region), (off_t)(4 * region));
  if (fe == 0) return KT_SUCCESS;
  kt_result res = kt__err(KT_ERR_SYSTEM,
                          "rank %d: cannot reserve its %zu bytes of shared memory %s (%zu bytes for all %d ranks): "
                          "%s " SEGMENT_HINT,
                          c->rank, 4 * region, name, rings_offset(n, region), n, strerror(fe));
  record_failure(h, c->rank, res, kt_last_error()); /* the others stop waiting, with my reason */
  return res;
}

/* A communicator that does not fit beside the room the job's others keep
 * runs over TCP; warned once per job like a shrink (which it follows). */
static _Atomic int no_room_warned;

static void warn_no_room(const kt__group *c, uint64_t avail, uint64_t owed, size_t bytes, int n) {
  KT_LOG_AT(once_per_job(&no_room_warned),
            "rank %d: /dev/shm has %.2f MiB free and %.2f MiB of it is kept for the rings of this job's other "
            "communicators on this host: too little for the shared memory of a communicator of %d ranks (%.2f MiB "
            "at the smallest sizes). This communicator's ranks on this host use TCP instead (slower). Give /dev/shm more "
            "room (docker run --shm-size, a Kubernetes emptyDir with medium Memory), or make the other "
            "communicators smaller (KAITIAN_SHM_CHUNK_BYTES, KAITIAN_SHM_P2P_BYTES)",
            c->rank, (double)avail / (1 << 20), (double)owed / (1 << 20), n, (double)bytes / (1 << 20));
}

/* Does the header the creator published describe a segment for n ranks of
 * exactly bytes (the file's size)? Regions and rings of 0 bytes with only
 * the header, slots and ring heads: no room in /dev/shm, TCP instead. */
static bool layout_ok(const shm_hdr *h, int n, size_t bytes) {
  if (h->region == 0 && h->p2p == 0)
    return h->nlocal == (uint32_t)n && h->bytes == bytes && segment_bytes(n, 0, 0) == bytes;
  /* Regions or rings smaller than any creator chooses (4 KiB), or so large
   * that the sum below would wrap around to the file's size, describe no
   * segment this rank can use. */
  size_t nn = (size_t)n * (size_t)n;
  if (h->region < 4096 || h->p2p < 4096 || h->region > bytes / (4 * (size_t)n) || h->p2p > bytes / nn)
    return false;
  return h->nlocal == (uint32_t)n && h->bytes == bytes && segment_bytes(n, h->region, h->p2p) == bytes;
}

kt_result kt__shm_setup(kt__group *c, uint64_t owed) {
  kt_result res = KT_SUCCESS;
  char name[128];
  segment_name(c, name, sizeof name);
  int n = c->size;
  size_t region = (size_t)KT_MAX(kt__param_SHM_CHUNK_BYTES(), 4096);
  region = (region + 63) & ~(size_t)63;
  size_t p2p = ((size_t)KT_MAX(kt__param_SHM_P2P_BYTES(), 4096) + 4095) & ~(size_t)4095;
  size_t bytes = 0;
  int64_t deadline = kt__now_ns() + kt__param_CONNECT_TIMEOUT() * 1000000;
  bool leader = c->rank == 0, none = false; /* none: no room, TCP instead */
  int fd = -1;
  void *base = MAP_FAILED;
  kt__shm *s = kt__calloc(1, sizeof *s); /* freed by kt__shm_close or below */
  if (!s) return KT_ERR_NO_MEMORY;
  s->fd = -1;
  /* Before anything is shared: a rank that fails here fails like one whose
   * TCP setup failed (its peers read its reason on their control sockets). */
  s->ring_reserved = kt__calloc((size_t)n, sizeof *s->ring_reserved);
  if (!s->ring_reserved) {
    free(s);
    return KT_ERR_NO_MEMORY;
  }

  if (leader) {
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      res = kt__err(KT_ERR_SYSTEM, "rank %d: cannot create shared memory %s: %s%s", c->rank, name,
                    strerror(errno),
                    errno == EEXIST ? " (two communicators with the same prefix in one job?)" : "");
      goto fail;
    }
    /* The sizes are the creator's, published in the header: every rank
     * uses them, whatever its own environment says. */
    size_t region0 = region, p2p0 = p2p;
    bool fits = true;
    uint64_t avail = fit_sizes(fd, n, owed, &region, &p2p, &fits);
    bytes = segment_bytes(n, region, p2p);
    if (!fits && owed) { /* only the header: it tells the others */
      warn_no_room(c, avail, owed, bytes, n);
      none = true;
      region = p2p = 0;
      bytes = segment_bytes(n, 0, 0);
    }
    /* The header, the slots and the ring heads now; each rank reserves its
     * own regions below, and each ring when it first sends through it. */
    int fe = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)data_offset(n));
    if (fe != 0 || (base = map_fd(fd, bytes)) == MAP_FAILED) {
      res = kt__err(KT_ERR_SYSTEM, "rank %d: cannot size/map %zu bytes of shared memory %s: %s " SEGMENT_HINT,
                    c->rank, bytes, name, strerror(fe ? fe : errno));
      goto fail;
    }
    if (!none) warn_shrunk(c, avail, owed, region, region0, p2p, p2p0, n);
    shm_hdr *h = base;
    h->nlocal = (uint32_t)n;
    h->region = region;
    h->p2p = p2p;
    h->bytes = bytes;
    /* Mine before the others can start on theirs: where /dev/shm has room
     * for the leader's part and not a second rank's, the leader gets it and
     * the other rank runs out alone, so every rank names the same culprit
     * (before, both could run out at once, each with only its own error). */
    if (!none && (res = reserve_regions(c, fd, h, name, region)) != KT_SUCCESS) goto fail;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
  } else {
    /* The leader may not have created it yet: retry until it has. Its one
     * ftruncate gives the file its final size at once. */
    for (;;) {
      fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
      struct stat st;
      if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= data_offset(n)) {
        bytes = (size_t)st.st_size;
        break;
      }
      if (fd >= 0) close(fd);
      fd = -1;
      /* A dead rank 0's last words first: its reason, if it gave one. */
      if ((res = setup_check_peers(c)) != KT_SUCCESS) goto fail;
      if (!peer_alive(c, 0)) {
        res = kt__err(KT_ERR_PEER_FAILED, "rank %d: rank 0 died while setting up shared memory", c->rank);
        goto fail;
      }
      if (kt__now_ns() > deadline) {
        res = kt__err(KT_ERR_TIMEOUT, "rank %d: shared memory %s was not created by rank 0 in time", c->rank, name);
        goto fail;
      }
      usleep(200);
    }
    if ((base = map_fd(fd, bytes)) == MAP_FAILED) {
      res = kt__err(KT_ERR_SYSTEM, "rank %d: cannot map shared memory %s: %s", c->rank, name, strerror(errno));
      goto fail;
    }
    while (atomic_load_explicit(&((shm_hdr *)base)->magic, memory_order_acquire) != SHM_MAGIC) {
      if ((res = setup_check_peers(c)) != KT_SUCCESS) goto fail;
      if (kt__now_ns() > deadline) {
        res = kt__err(KT_ERR_TIMEOUT, "rank %d: shared memory %s never became ready", c->rank, name);
        goto fail;
      }
      usleep(100);
    }
    const shm_hdr *h = base;
    region = h->region;
    p2p = h->p2p;
    if (!layout_ok(h, n, bytes)) {
      res = kt__err(KT_ERR_INTERNAL, "rank %d: shared memory %s has an unexpected layout (%u ranks, %zu bytes; "
                    "this rank expected %d ranks: ranks of one job run different KaiTian builds?)",
                    c->rank, name, h->nlocal, bytes, n);
      goto fail;
    }
  }
  shm_hdr *h = base;
  none = region == 0;
  prefault(base, data_offset(n));
  if (!leader && !none && (res = reserve_regions(c, fd, h, name, region)) != KT_SUCCESS) goto fail;
  publish_cpus(slot_at(base, c->rank));
  atomic_store_explicit(&slot_at(base, c->rank)->beat_ns, kt__now_ns(), memory_order_relaxed);
  atomic_fetch_add(&h->mapped, 1);
  /* Nobody starts before every rank has reserved its part. The leader then
   * unlinks the segment: from then on nothing is left behind whatever
   * happens to the processes. */
  for (unsigned k = 0; atomic_load(&h->mapped) < (uint32_t)n; k++) {
    int32_t f = atomic_load_explicit(&h->failed, memory_order_acquire);
    if (f) {
      res = kt__err(failure_code(f), "rank %d: rank %d failed while setting up shared memory: %.*s", c->rank,
                    atomic_load(&h->failed_rank) - 1, (int)sizeof h->failed_msg, h->failed_msg);
      goto fail;
    }
    if (k % 100 == 99 && (res = setup_check_peers(c)) != KT_SUCCESS) goto fail;
    for (int r = 0; r < n && k % 100 == 99; r++) /* every 10 ms: n signals each */
      if (r != c->rank && !peer_alive(c, r)) {
        res = kt__err(KT_ERR_PEER_FAILED, "rank %d: rank %d died while setting up shared memory", c->rank, r);
        goto fail;
      }
    if (kt__now_ns() > deadline) {
      res = kt__err(KT_ERR_TIMEOUT, "rank %d: not every local rank mapped the shared memory in time", c->rank);
      goto fail;
    }
    usleep(100);
  }
  if (leader) shm_unlink(name);
  if (!none) prefault((char *)base + data_offset(n), (size_t)n * 4 * region); /* every rank's regions, reserved by now */
  if (none) { /* c->shm stays NULL: TCP, as with KAITIAN_TRANSPORT=tcp */
    munmap(base, bytes);
    close(fd);
    free(s->ring_reserved);
    free(s);
    KT_INFO("rank %d: shared memory %s: no room in /dev/shm; this communicator uses TCP", c->rank, name);
    return KT_SUCCESS;
  }
  s->base = base;
  s->bytes = bytes;
  s->hdr = h;
  s->n = n;
  s->me = c->rank;
  s->region = region;
  s->fd = fd;
  s->chans = (chan *)((char *)base + chans_offset(n));
  s->rings = (char *)base + rings_offset(n, region);
  s->p2p = p2p;
  atomic_fetch_add(&owed_bytes, (uint64_t)(n - 1) * p2p); /* my rings, until reserved */
  int ncpu = local_cpus(base, n);
  s->oversubscribed = ncpu > 0 && n > ncpu;
  s->spin_ns = kt__param_SHM_SPIN_NS();
  s->asym_fence = kt__heavy_fence_ok();
  s->maps = calloc((size_t)n * SHM_MAPS, sizeof *s->maps);
  s->direct_off = !s->maps || kt__param_SHM_DIRECT_BYTES() <= 0;
  c->shm = s;
  KT_INFO("rank %d: shared memory %s: %d ranks on %d CPU(s), %zu-byte regions, %zu-byte rings, %zu bytes%s", c->rank,
          name, n, ncpu, region, p2p, bytes, s->oversubscribed ? " (oversubscribed: yielding)" : "");
  return KT_SUCCESS;
fail:
  if (base != MAP_FAILED) munmap(base, bytes);
  if (fd >= 0) close(fd);
  if (leader) shm_unlink(name);
  free(s->ring_reserved);
  free(s);
  return res;
}

void kt__shm_close(kt__group *c) {
  if (!c->shm) return;
  for (int i = 0; c->shm->maps && i < c->shm->n * SHM_MAPS; i++)
    if (c->shm->maps[i].base) munmap(c->shm->maps[i].base, c->shm->maps[i].len);
  free(c->shm->maps);
  for (int r = 0; r < c->shm->n; r++)
    if (r != c->shm->me && !c->shm->ring_reserved[r]) atomic_fetch_sub(&owed_bytes, c->shm->p2p);
  free(c->shm->ring_reserved);
  if (c->shm->fd >= 0) close(c->shm->fd);
  munmap(c->shm->base, c->shm->bytes);
  free(c->shm);
  c->shm = NULL;
}

void kt__shm_fail(kt__group *c, kt_result r, const char *msg) {
  kt__shm *s = c->shm;
  if (!s) return;
  record_failure(s->hdr, c->rank, r, msg);
  kt__shm_wake(c);
}

void kt__shm_wake(kt__group *c) {
  if (c->shm) wake_now(c->shm);
}

/* ---- iterations ----------------------------------------------------------- */

/* This rank shows activity on the communicator (see shm_slot.beat_ns). */
static void mark_alive_at(kt__shm *s, int64_t now) {
  atomic_store_explicit(&slot(s, s->me)->beat_ns, now, memory_order_relaxed);
}

static void mark_alive(kt__shm *s) { mark_alive_at(s, kt__now_coarse_ns()); }

void kt__shm_op_begin(kt__exec *ex) {
  kt__shm *s = ex->group->shm;
  mark_alive_at(s, ex->start_ns);
  kt__op_sig(ex->op, s->n, &s->cur);
  s->sig_checked = false;
}

uint64_t kt__shm_next_step(kt__exec *ex) { return ex->group->shm->step + 1; }

uint64_t kt__shm_post(kt__exec *ex) {
  kt__shm *s = ex->group->shm;
  s->step++;
  atomic_store_explicit(&slot(s, s->me)->step, s->step, memory_order_seq_cst);
  wake_sleepers(s);
  return s->step;
}

static bool reached(const kt__shm *s, int r, uint64_t target) {
  if (r >= 0) return atomic_load_explicit(&slot(s, r)->step, memory_order_acquire) >= target;
  for (int i = 0; i < s->n; i++)
    if (atomic_load_explicit(&slot(s, i)->step, memory_order_acquire) < target) return false;
  return true;
}

/* The error for peer r found in another op (its signature theirs). */
static __attribute__((noinline, cold)) kt_result mismatch_of(kt__exec *ex, const sig *mine, int r, const sig *theirs) {
  kt__shm *s = ex->group->shm;
  char a[160], b[160], who[128];
  kt__sig_describe(mine, a, sizeof a);
  kt__sig_describe(theirs, b, sizeof b);
  kt__peer_desc(ex->group, r, who, sizeof who);
  return kt__err(KT_ERR_MISMATCH, "mismatched operations: rank %d is in (%s) but %s is in (%s)",
                 kt__rank_label(ex->group, s->me), a, who, b);
}

static kt_result mismatch(kt__exec *ex, int r, const sig *theirs) {
  return mismatch_of(ex, &ex->group->shm->cur, r, theirs);
}

/* Compare my signature of this op with those of the ranks waited for. Fields
 * an op does not use were set the same way on every rank by the API layer. */
static kt_result check_sigs(kt__exec *ex, int r) {
  kt__shm *s = ex->group->shm;
  s->sig_checked = true;
  const sig *mine = &s->cur;
  for (int i = r >= 0 ? r : 0; i < (r >= 0 ? r + 1 : s->n); i++) {
    if (i == s->me) continue;
    const sig *g = &slot(s, i)->sigs[s->par];
    if (!kt__sig_equal(g, mine)) return mismatch(ex, i, g);
  }
  return KT_SUCCESS;
}

/* Why are we still waiting? Failures first, then the deadline. The common
 * answer (nothing failed, no slow checks due) is check_failures', inline. */
static kt_result failures_found(kt__exec *ex, int r, uint64_t target, bool slow_checks) {
  kt__group *c = ex->group;
  kt__shm *s = c->shm;
  int32_t f = atomic_load_explicit(&s->hdr->failed, memory_order_acquire);
  if (f) {
    int who = kt__rank_label(c, atomic_load(&s->hdr->failed_rank) - 1);
    return kt__err(failure_code(f), "rank %d failed and aborted the communicator: %.*s", who,
                   (int)sizeof s->hdr->failed_msg, s->hdr->failed_msg);
  }
  if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
    return kt__err(KT_ERR_ABORTED, "rank %d: communicator aborted (kt_comm_abort)", kt__rank_label(c, c->rank));
  if (!slow_checks) return KT_SUCCESS;
  for (int i = r >= 0 ? r : 0; i < (r >= 0 ? r + 1 : s->n); i++) {
    if (i == s->me || atomic_load(&slot(s, i)->step) >= target) continue;
    if (!peer_alive(c, i)) {
      char who[128];
      kt__peer_desc(c, i, who, sizeof who);
      return kt__err(KT_ERR_PEER_FAILED, "%s died (noticed by rank %d during op #%llu %s)", who,
                     kt__rank_label(c, c->rank),
                     (unsigned long long)ex->op->seq, kt__coll_name(ex->op->coll));
    }
  }
  KT_CHECK(kt__net_check_peers(ex)); /* notices from ranks' sockets */
  if (ex->parent) KT_CHECK(kt__net_stuck(ex->parent)); /* a phase: the parent's peers too */
  if (kt__now_ns() >= ex->deadline_ns) {
    char late[256] = "", quiet[256] = "";
    size_t off = 0, qoff = 0;
    for (int i = 0; i < s->n && off < sizeof late - 32; i++)
      if (i != s->me && (r < 0 || r == i) && atomic_load(&slot(s, i)->step) < target)
        off += (size_t)snprintf(late + off, sizeof late - off, "%s rank %d", off ? "," : "", kt__rank_label(c, i));
    /* The rank waited for may itself be waiting for another: name every rank
     * that has shown no activity here for most of the timeout. */
    int64_t now = kt__now_ns(), idle_ns = KT_MAX(c->timeout_ms * 1000000 / 2, 2 * SHM_LIVENESS_NS);
    for (int i = 0; i < s->n && qoff < sizeof quiet - 48; i++) {
      int64_t beat = atomic_load_explicit(&slot(s, i)->beat_ns, memory_order_relaxed);
      if (i != s->me && now - beat >= idle_ns)
        qoff += (size_t)snprintf(quiet + qoff, sizeof quiet - qoff, "%s rank %d (%.1f s)", qoff ? "," : "",
                                 kt__rank_label(c, i), (double)(now - beat) / 1e9);
    }
    return kt__err(KT_ERR_TIMEOUT,
                   "rank %d: op #%llu %s timed out after %lld ms (KAITIAN_TIMEOUT) waiting for%s%s%s",
                   kt__rank_label(c, c->rank), (unsigned long long)ex->op->seq, kt__coll_name(ex->op->coll),
                   (long long)c->timeout_ms, late,
                   quiet[0] ? "; no activity on this communicator (stopped, hung or busy elsewhere) from" : "",
                   quiet);
  }
  return KT_SUCCESS;
}

static inline kt_result check_failures(kt__exec *ex, int r, uint64_t target, bool slow_checks) {
  kt__group *c = ex->group;
  if (!slow_checks && !atomic_load_explicit(&c->shm->hdr->failed, memory_order_acquire) &&
      !atomic_load_explicit(&c->aborted, memory_order_relaxed))
    return KT_SUCCESS;
  return failures_found(ex, r, target, slow_checks);
}

/* Spin (or yield, when ranks outnumber CPUs), then sleep on the futex until
 * ready(s, arg). Meanwhile watch for failures: of rank r (-1: every rank)
 * while its step is below target (UINT64_MAX: always), aborts, the deadline. */
typedef bool (*ready_fn)(const kt__shm *s, const void *arg);
/* Called when a wait goes to sleep and every SHM_LIVENESS_NS asleep: an error
 * when the wait can never end. */
typedef kt_result (*stuck_fn)(kt__exec *ex, const void *arg);

static kt_result wait_ready_or_stuck(kt__exec *ex, int r, uint64_t target, ready_fn ready,
                                     const void *arg, stuck_fn stuck) {
  kt__shm *s = ex->group->shm;
  int64_t spin_until = -1; /* set at the first check: most waits end before */
  unsigned k = 0;
  while (!ready(s, arg)) {
    if ((++k & 63) == 0) {
      KT_CHECK(check_failures(ex, r, target, false));
      int64_t now = kt__now_ns();
      if (spin_until < 0) spin_until = now + s->spin_ns;
      else if (now > spin_until) break;
    }
    /* Pure spinning first (a peer on another CPU answers within a few
     * microseconds); after that yield now and then: when other work shares
     * the machine, the rank we wait for may need this CPU. */
    if (s->oversubscribed || (k > 4096 && (k & 15) == 0)) sched_yield();
    else cpu_relax();
  }
  int64_t next_slow = kt__now_ns();
  while (!ready(s, arg)) {
    bool slow = kt__now_ns() >= next_slow;
    kt_result e = check_failures(ex, r, target, slow);
    if (e != KT_SUCCESS) {
      /* A peer that wrote what this wait needs and then finished (its job
       * done, it exited) is not a failure of this op: look again now that
       * its death is seen, since its writes came before it. */
      if (!ready(s, arg)) return e;
      kt__clear_error();
      break;
    }
    if (slow && stuck) KT_CHECK(stuck(ex, arg));
    if (slow) {
      next_slow = kt__now_ns() + SHM_LIVENESS_NS;
      mark_alive(s);
    }
    atomic_fetch_add_explicit(&s->hdr->nwaiters, 1, memory_order_seq_cst);
    if (s->asym_fence) (void)kt__heavy_fence(); /* ll_publish; failing, a post may be missed for one slice */
    uint32_t g = atomic_load_explicit(&s->hdr->gen, memory_order_seq_cst);
    if (!ready(s, arg) && !atomic_load(&s->hdr->failed)) {
      struct timespec ts = {0, 20000000}; /* 20 ms slices */
      futex(&s->hdr->gen, FUTEX_WAIT, g, &ts);
    }
    atomic_fetch_sub_explicit(&s->hdr->nwaiters, 1, memory_order_seq_cst);
  }
  return KT_SUCCESS;
}

static kt_result wait_ready(kt__exec *ex, int r, uint64_t target, ready_fn ready, const void *arg) {
  return wait_ready_or_stuck(ex, r, target, ready, arg, NULL);
}

typedef struct step_goal {
  int r;
  uint64_t target;
} step_goal;

static bool steps_ready(const kt__shm *s, const void *arg) {
  const step_goal *g = arg;
  return reached(s, g->r, g->target);
}

kt_result kt__shm_wait(kt__exec *ex, int r, uint64_t target) {
  kt__shm *s = ex->group->shm;
  step_goal goal = {r, target};
  if (!reached(s, r, target)) KT_CHECK(wait_ready(ex, r, target, steps_ready, &goal));
  if (r < 0 && target > s->all_reached) s->all_reached = target;
  if (!s->sig_checked) KT_CHECK(check_sigs(ex, r));
  return check_failures(ex, r, target, false);
}

kt_result kt__shm_iter_begin(kt__exec *ex, int *par) {
  kt__shm *s = ex->group->shm;
  /* Every rank has begun the previous iteration, hence finished reading the
   * one before: buffers of this parity are free. */
  if (s->all_reached < s->prev_arrive) {
    bool checked = s->sig_checked;
    s->sig_checked = true; /* peers may already be in a later op */
    kt_result r = kt__shm_wait(ex, -1, s->prev_arrive);
    s->sig_checked = checked;
    KT_CHECK(r);
  }
  *par = s->par = (int)(s->iter & 1);
  s->iter++;
  slot(s, s->me)->sigs[s->par] = s->cur; /* published by the first post */
  s->prev_arrive = s->step + 1; /* the iteration's first post comes next */
  return KT_SUCCESS;
}

void kt__shm_set_aux(kt__exec *ex, int par, uint64_t v) {
  kt__shm *s = ex->group->shm;
  atomic_store_explicit(&slot(s, s->me)->aux[par], v, memory_order_relaxed);
}

uint64_t kt__shm_get_aux(kt__exec *ex, int r, int par) {
  return atomic_load_explicit(&slot(ex->group->shm, r)->aux[par], memory_order_relaxed);
}

void kt__shm_set_aux2(kt__exec *ex, int par, uint64_t v) {
  kt__shm *s = ex->group->shm;
  atomic_store_explicit(&slot(s, s->me)->aux2[par], v, memory_order_relaxed);
}

uint64_t kt__shm_get_aux2(kt__exec *ex, int r, int par) {
  return atomic_load_explicit(&slot(ex->group->shm, r)->aux2[par], memory_order_relaxed);
}

/* ---- point to point ------------------------------------------------------- */

#define P2P_MAGIC 0x5032504bu /* "KP2P" */
#define P2P_HDR_BYTES 32

/* One direction of a kt__shm_p2p call: the header, then the payload, through
 * the ring of one ordered pair. pos mirrors the counter this side writes. */
typedef struct stream {
  chan *ch;
  char *ring;
  uint64_t pos;
  unsigned char hdr[P2P_HDR_BYTES];
  size_t hdone;
  char *buf;
  size_t len, done;
} stream;

static bool stream_busy(const stream *st) { return st->ch && (st->hdone < P2P_HDR_BYTES || st->done < st->len); }

/* Move bytes between the message and the ring, as far as the ring allows.
 * send: into the ring up to its free space; else out of it up to what was
 * written. Returns the bytes moved and publishes the new counter. */
static size_t stream_move(kt__shm *s, stream *st, bool send) {
  uint64_t other = send ? atomic_load_explicit(&st->ch->tail, memory_order_acquire)
                        : atomic_load_explicit(&st->ch->head, memory_order_acquire);
  size_t room = send ? s->p2p - (size_t)(st->pos - other) : (size_t)(other - st->pos), moved = 0;
  while (room > 0 && stream_busy(st)) {
    bool in_hdr = st->hdone < P2P_HDR_BYTES;
    char *msg = in_hdr ? (char *)st->hdr + st->hdone : st->buf + st->done;
    size_t off = (size_t)(st->pos % s->p2p);
    size_t k = KT_MIN(KT_MIN(in_hdr ? P2P_HDR_BYTES - st->hdone : st->len - st->done, room), s->p2p - off);
    if (send) kt__copy_shared(st->ring + off, msg, k);
    else memcpy(msg, st->ring + off, k);
    if (in_hdr) st->hdone += k;
    else st->done += k;
    st->pos += k;
    room -= k;
    moved += k;
    if (!send && in_hdr && st->hdone == P2P_HDR_BYTES) break; /* the caller checks it first */
  }
  if (moved) {
    atomic_store_explicit(send ? &st->ch->head : &st->ch->tail, st->pos, memory_order_seq_cst);
    wake_sleepers(s);
  }
  return moved;
}

typedef struct p2p_state {
  const stream *snd, *rcv;
  int dst;
} p2p_state;

/* Either direction can move. */
static bool p2p_ready(const kt__shm *s, const void *arg) {
  const p2p_state *p = arg;
  if (stream_busy(p->snd) && p->snd->pos - atomic_load_explicit(&p->snd->ch->tail, memory_order_acquire) < s->p2p)
    return true;
  return stream_busy(p->rcv) && atomic_load_explicit(&p->rcv->ch->head, memory_order_acquire) != p->rcv->pos;
}

static bool ring_full(const kt__shm *s, int from, int to) {
  const chan *ch = chan_of(s, from, to);
  return atomic_load_explicit(&ch->head, memory_order_acquire) -
             atomic_load_explicit(&ch->tail, memory_order_acquire) >= s->p2p;
}

/* I wait in a send-only call on a full ring to another rank (my slot says
 * so; kt__shm_p2p passes this check only then). If the rank I
 * send to waits likewise on its full ring to another, and so on back to me,
 * nobody in that cycle receives before its send completes: they would wait
 * until the timeout. Two reads of every slot and ring on the path, the second
 * after all of the first, with the same waiting episode and a full ring each
 * time: all of them waited at once in between, so the cycle is real. */
static kt_result p2p_stuck(kt__exec *ex, const void *arg) {
  const p2p_state *p = arg;
  kt__group *c = ex->group;
  kt__shm *s = c->shm;
  uint64_t seen[SHM_CYCLE_MAX];
  int path[SHM_CYCLE_MAX], len = 0;
  for (int cur = p->dst; cur != s->me; len++) {
    if (len == SHM_CYCLE_MAX || len >= s->n) return KT_SUCCESS;
    uint64_t b = atomic_load_explicit(&slot(s, cur)->blocked, memory_order_acquire);
    if ((uint32_t)b == 0) return KT_SUCCESS;
    int next = (int)(uint32_t)b - 1;
    if (next < 0 || next >= s->n || !ring_full(s, cur, next)) return KT_SUCCESS;
    seen[len] = b;
    path[len] = cur;
    cur = next;
  }
  /* A rank writes into its ring only after clearing its slot: the same
   * episode and a ring still full mean nobody moved on that link meanwhile. */
  for (int i = 0; i < len; i++)
    if (atomic_load_explicit(&slot(s, path[i])->blocked, memory_order_acquire) != seen[i] ||
        !ring_full(s, path[i], i + 1 < len ? path[i + 1] : s->me))
      return KT_SUCCESS;
  /* My own ring last: my destination may have taken an earlier message of
   * mine just before blocking. Only I write into it, so full now means full
   * all along. */
  if (!ring_full(s, s->me, p->dst)) return KT_SUCCESS;
  char cycle[512] = "";
  size_t off = 0;
  for (int i = 0; i < len && off < sizeof cycle - 64; i++) {
    int to = i + 1 < len ? path[i + 1] : s->me;
    off += (size_t)snprintf(cycle + off, sizeof cycle - off, "%srank %d sends to rank %d",
                            i == 0 ? "" : i + 1 < len ? ", " : " and ", kt__rank_label(c, path[i]),
                            kt__rank_label(c, to));
  }
  return kt__err(KT_ERR_MISMATCH,
                 "send of %zu bytes to rank %d can never complete: %s at the same time, and no rank "
                 "in this cycle receives before its own send completes (a message larger than the "
                 "%zu-byte shared-memory ring, KAITIAN_SHM_P2P_BYTES, waits for its receiver). Let one "
                 "side receive first, or exchange with kt_sendrecv",
                 p->snd->len, kt__rank_label(c, p->dst), cycle, s->p2p);
}

/* My ring to dst gets its pages before my first message through it (the
 * receiver reads only what was written): a /dev/shm without room for it is
 * this error, not a SIGBUS. */
static kt_result reserve_ring(kt__exec *ex, int dst) {
  kt__shm *s = ex->group->shm;
  off_t at = (off_t)(ring_of(s, s->me, dst) - (char *)s->base);
  int fe = posix_fallocate(s->fd, at, (off_t)s->p2p);
  if (fe != 0)
    return kt__err(KT_ERR_SYSTEM,
                   "cannot reserve the %zu-byte shared-memory ring to rank %d: %s (is /dev/shm large enough? "
                   "KAITIAN_SHM_P2P_BYTES sizes the rings; KAITIAN_TRANSPORT=tcp needs none)",
                   s->p2p, kt__rank_label(ex->group, dst), strerror(fe));
  s->ring_reserved[dst] = true;
  atomic_fetch_sub(&owed_bytes, s->p2p);
  return KT_SUCCESS;
}

kt_result kt__shm_p2p(kt__exec *ex, int dst, const void *sbuf, size_t slen, int src, void *rbuf, size_t rlen,
                      uint32_t tag) {
  kt__shm *s = ex->group->shm;
  stream snd = {0}, rcv = {0};
  if (dst >= 0) {
    if (!s->ring_reserved[dst]) KT_CHECK(reserve_ring(ex, dst));
    snd.ch = chan_of(s, s->me, dst);
    snd.ring = ring_of(s, s->me, dst);
    snd.pos = atomic_load_explicit(&snd.ch->head, memory_order_relaxed);
    uint32_t h32[2] = {P2P_MAGIC, tag}, dtype = (uint32_t)ex->op->dtype;
    uint64_t len = slen;
    memcpy(snd.hdr, h32, sizeof h32);
    memcpy(snd.hdr + 8, &len, sizeof len);
    memcpy(snd.hdr + 16, &dtype, sizeof dtype);
    snd.buf = (char *)sbuf;
    snd.len = slen;
  }
  if (src >= 0) {
    rcv.ch = chan_of(s, src, s->me);
    rcv.ring = ring_of(s, src, s->me);
    rcv.pos = atomic_load_explicit(&rcv.ch->tail, memory_order_relaxed);
    rcv.buf = rbuf;
    rcv.len = rlen;
  }
  p2p_state st = {&snd, &rcv, dst};
  while (stream_busy(&snd) || stream_busy(&rcv)) {
    size_t moved = stream_busy(&snd) ? stream_move(s, &snd, true) : 0;
    if (stream_busy(&rcv)) {
      bool had_hdr = rcv.hdone == P2P_HDR_BYTES;
      moved += stream_move(s, &rcv, false);
      if (!had_hdr && rcv.hdone == P2P_HDR_BYTES) { /* the message's header: is it the one expected? */
        uint32_t h32[2], dtype;
        uint64_t len;
        memcpy(h32, rcv.hdr, sizeof h32);
        memcpy(&len, rcv.hdr + 8, sizeof len);
        memcpy(&dtype, rcv.hdr + 16, sizeof dtype);
        kt_dtype want = ex->op->dtype;
        if (h32[0] != P2P_MAGIC || h32[1] != tag || len != rlen || dtype != (uint32_t)want) {
          char who[128];
          kt__peer_desc(ex->group, src, who, sizeof who);
          const char *sent = dtype < KT_NUM_DTYPES ? kt_dtype_name((kt_dtype)dtype) : "an unknown type";
          return kt__err(KT_ERR_MISMATCH,
                         "expected a message of %zu bytes (%s) with tag %u from %s, which sent %llu bytes (%s) "
                         "with tag %u%s",
                         rlen, kt_dtype_name(want), tag, who, (unsigned long long)len, sent, h32[1],
                         h32[0] != P2P_MAGIC ? " (corrupt header)" : "");
        }
      }
    }
    if (!moved && (stream_busy(&snd) || stream_busy(&rcv))) {
      /* Send-only on a full ring: say so in my slot while waiting. */
      bool send_only = stream_busy(&snd) && !stream_busy(&rcv) && ring_full(s, s->me, dst);
      shm_slot *mine = slot(s, s->me);
      if (send_only)
        atomic_store_explicit(&mine->blocked, ((uint64_t)++s->episode << 32) | (uint32_t)(dst + 1),
                              memory_order_release);
      kt_result r = wait_ready_or_stuck(ex, stream_busy(&snd) ? dst : src, UINT64_MAX, p2p_ready, &st,
                                        send_only ? p2p_stuck : NULL);
      if (send_only) atomic_store_explicit(&mine->blocked, (uint64_t)s->episode << 32, memory_order_release);
      KT_CHECK(r);
    }
  }
  return KT_SUCCESS;
}

/* ---- single-copy allreduce: the peers' registered buffers ------------------ */

bool kt__shm_direct_offer(kt__exec *ex, const void *send, const void *recv, size_t bytes) {
  kt__shm *s = ex->group->shm;
  shm_slot *me = slot(s, s->me);
  kt__membuf *b = me->dbuf[s->par];
  bool offer = !s->direct_off && bytes >= (size_t)kt__param_SHM_DIRECT_BYTES() && kt__memreg_find(send, bytes, &b[0]) &&
               (send == recv ? (b[1] = b[0], true) : kt__memreg_find(recv, bytes, &b[1]));
  me->direct_offer[s->par] = offer;
  return offer;
}

bool kt__shm_direct_offered(kt__exec *ex, int r) {
  const kt__shm *s = ex->group->shm;
  return slot(s, r)->direct_offer[s->par] != 0;
}

/* Map the file of b (registered by rank r) or find it mapped; the address of
 * its byte b->off, bytes long; NULL with the reason in why. */
static char *map_peer_buf(kt__group *c, int r, const kt__membuf *b, size_t bytes, char *why, size_t cap) {
  kt__shm *s = c->shm;
  struct peer_map *m = &s->maps[(size_t)r * SHM_MAPS], *victim = m;
  for (int i = 0; i < SHM_MAPS; i++) {
    if (m[i].base && m[i].dev == b->dev && m[i].ino == b->ino && b->off <= m[i].len && bytes <= m[i].len - b->off) {
      m[i].used = ++s->map_clock;
      return m[i].base + b->off;
    }
    if (!m[i].base || (victim->base && m[i].used < victim->used)) victim = &m[i];
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", c->peer_pid[r], (int)b->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, cap, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  char *base = NULL;
  if (fstat(fd, &st) != 0) {
    snprintf(why, cap, "fstat %s: %s", path, strerror(errno));
  } else if ((uint64_t)st.st_dev != b->dev || (uint64_t)st.st_ino != b->ino) {
    snprintf(why, cap, "%s is no longer the registered file", path); /* closed meanwhile: a peer's bug */
  } else if ((uint64_t)st.st_size < b->off || bytes > (uint64_t)st.st_size - b->off) {
    snprintf(why, cap, "%s has %lld bytes, fewer than the %zu at offset %llu", path, (long long)st.st_size, bytes,
             (unsigned long long)b->off);
  } else {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) snprintf(why, cap, "mmap %s: %s", path, strerror(errno));
    else base = p;
  }
  close(fd);
  if (!base) return NULL;
  if (victim->base) munmap(victim->base, victim->len);
  *victim = (struct peer_map){b->dev, b->ino, base, (size_t)st.st_size, ++s->map_clock};
  return base + b->off;
}

bool kt__shm_direct_map(kt__exec *ex, char **send, char **recv, size_t bytes) {
  kt__group *c = ex->group;
  kt__shm *s = c->shm;
  bool ok = true;
  for (int r = 0; r < s->n && ok; r++) {
    if (r == s->me) continue;
    const kt__membuf *b = slot(s, r)->dbuf[s->par];
    char why[256] = "";
    /* In place, the second lookup finds the file the first one mapped. */
    send[r] = map_peer_buf(c, r, &b[0], bytes, why, sizeof why);
    recv[r] = send[r] ? map_peer_buf(c, r, &b[1], bytes, why, sizeof why) : NULL;
    if (!recv[r]) {
      ok = false;
      s->direct_off = true;
      KT_WARN("rank %d: cannot map rank %d's registered buffer (%s): allreduce copies through shared memory "
              "from now on",
              c->rank, r, why);
    }
  }
  slot(s, s->me)->direct_ok[s->par] = ok;
  return ok;
}

bool kt__shm_direct_ok(kt__exec *ex, int r) {
  const kt__shm *s = ex->group->shm;
  return slot(s, r)->direct_ok[s->par] != 0;
}

/* ---- small messages: flag and payload in the same cache line --------------- */

/* Each rank has SHM_LL_SLOTS slots of lines and writes op k (the k-th
 * small-message op of the communicator, the same on every rank) into slot
 * k mod SHM_LL_SLOTS, line 0 last, every line flagged k. Before it writes
 * op k it waits until every peer has written op k - SHM_LL_AHEAD: that peer
 * then finished reading op k - SHM_LL_AHEAD - 1 and every earlier one, among
 * them the op whose lines slot k held. A rank waits only for the lines it
 * reads: the root of a broadcast or scatter and the non-roots of a reduce
 * or gather wait for nobody and run up to SHM_LL_AHEAD ops ahead.
 *
 * Signatures: a rank compares its signature of op j with each peer's when
 * it waits for that peer's lines in op j, or else when it writes op
 * j + SHM_LL_AHEAD, where it reads the peer's line 0 of op j anyway (the
 * wait above). That line still holds op j then: the peer rewrites the slot
 * with op j + SHM_LL_SLOTS only after this rank has written op
 * j + SHM_LL_SLOTS - SHM_LL_AHEAD >= j + SHM_LL_AHEAD. A rank that waits
 * for every peer (allreduce, allgather, barrier) also compares the ops
 * before it that it has not compared yet. So every pair of ranks compares
 * every op; a mismatch in an op that no rank reads through surfaces at the
 * next op that waits for all, and at most SHM_LL_AHEAD small ops later. */
enum { LL_CMP_NONE = -1, LL_CMP_ALL = -2 };

static size_t ll_lines(size_t bytes) { return bytes <= LL_FIRST ? 1 : 1 + (bytes - LL_FIRST + 55) / 56; }
static int ll_slot(uint64_t k) { return (int)(k % SHM_LL_SLOTS); }

typedef struct ll_goal {
  uint64_t seq;
  int r;        /* one rank's lines (the first `lines`), or -1: every peer's line 0 */
  size_t lines;
} ll_goal;

/* Rank r's first `lines` lines hold op seq. */
static inline bool ll_written(const kt__shm *s, int r, uint64_t seq, size_t lines) {
  int k = ll_slot(seq);
  for (size_t i = 0; i < lines; i++)
    if (atomic_load_explicit(&ll_at(s, r, k, (int)i)->flag, memory_order_acquire) != seq) return false;
  return true;
}

static inline bool ll_ready(const kt__shm *s, const void *arg) {
  const ll_goal *g = arg;
  int k = ll_slot(g->seq);
  if (g->r >= 0) return ll_written(s, g->r, g->seq, g->lines);
  for (int r = 0; r < s->n; r++)
    if (r != s->me && atomic_load_explicit(&ll_at(s, r, k, 0)->flag, memory_order_acquire) != g->seq)
      return false;
  return true;
}

/* Asleep in a small-message wait: a rank waited for whose step counter moved
 * past mine is in a region op this rank has not reached, so it ran every
 * small op up to this one and wrote its line 0; if that line is not there, it
 * skipped the op (sizes that differ across the threshold). Ranks not waited
 * for may legitimately be ahead. */
static kt_result ll_stuck(kt__exec *ex, const void *arg) {
  kt__shm *s = ex->group->shm;
  const ll_goal *g = arg;
  for (int r = g->r >= 0 ? g->r : 0; r < (g->r >= 0 ? g->r + 1 : s->n); r++) {
    if (r == s->me) continue;
    shm_slot *sl = slot(s, r);
    if (atomic_load_explicit(&sl->step, memory_order_acquire) <= s->step) continue;
    if (atomic_load_explicit(&ll_at(s, r, ll_slot(g->seq), 0)->flag, memory_order_acquire) == g->seq) continue;
    return mismatch(ex, r, sl->sigs[0].seq > sl->sigs[1].seq ? &sl->sigs[0] : &sl->sigs[1]);
  }
  return KT_SUCCESS;
}

static __attribute__((noinline)) kt_result ll_wait_slow(kt__exec *ex, const ll_goal *g) {
  return wait_ready_or_stuck(ex, g->r, UINT64_MAX, ll_ready, g, ll_stuck);
}

/* Inline up to the first look at the lines, which most waits need alone. */
static inline kt_result ll_wait_goal(kt__exec *ex, const ll_goal *g) {
  if (ll_ready(ex->group->shm, g)) return KT_SUCCESS;
  KT_CHECK(ll_wait_slow(ex, g));
  return KT_SUCCESS;
}

/* Rank r's signature of op seq (its line 0 holds that op) against mine. */
static inline kt_result ll_compare_to(kt__exec *ex, int r, uint64_t seq, const sig *mine) {
  kt__shm *s = ex->group->shm;
  sig theirs;
  memcpy(&theirs, ll_at(s, r, ll_slot(seq), 0)->data, sizeof theirs);
  return KT_LIKELY(kt__sig_equal(&theirs, mine)) ? KT_SUCCESS : mismatch_of(ex, mine, r, &theirs);
}

/* The same for an earlier op: my signature is still in my own line 0 of it. */
static kt_result ll_compare(kt__exec *ex, int r, uint64_t seq) {
  kt__shm *s = ex->group->shm;
  sig mine;
  if (atomic_load_explicit(&ll_at(s, r, ll_slot(seq), 0)->flag, memory_order_acquire) != seq)
    return kt__err(KT_ERR_INTERNAL, "small-message line 0 of rank %d is not op %llu's", r, (unsigned long long)seq);
  memcpy(&mine, ll_at(s, s->me, ll_slot(seq), 0)->data, sizeof mine);
  return ll_compare_to(ex, r, seq, &mine);
}

/* Before writing op seq: every peer has written op j = seq - SHM_LL_AHEAD,
 * and its signature of j equals mine (unless op j already compared it). */
static kt_result ll_settle(kt__exec *ex, uint64_t seq) {
  kt__shm *s = ex->group->shm;
  if (seq <= SHM_LL_AHEAD) return KT_SUCCESS;
  uint64_t j = seq - SHM_LL_AHEAD;
  int done = s->ll_cmp[ll_slot(j)];
  if (done == LL_CMP_ALL) return KT_SUCCESS;
  sig mine; /* still in my own line 0 of op j */
  memcpy(&mine, ll_at(s, s->me, ll_slot(j), 0)->data, sizeof mine);
  for (int r = 0; r < s->n; r++) {
    if (r == s->me || r == done) continue;
    ll_goal g = {j, r, 1};
    KT_CHECK(ll_wait_goal(ex, &g)); /* r's line 0 holds op j */
    KT_CHECK(ll_compare_to(ex, r, j, &mine));
  }
  return KT_SUCCESS;
}

kt_result kt__shm_ll_post(kt__exec *ex, const void *payload, size_t bytes) {
  kt__shm *s = ex->group->shm;
  if (bytes > LL_MAX_BYTES)
    return kt__err(KT_ERR_INTERNAL, "small-message protocol called for %zu bytes (at most %d)", bytes,
                   LL_MAX_BYTES);
  uint64_t seq = s->ll_seq + 1;
  KT_CHECK(ll_settle(ex, seq));
  s->ll_seq = seq;
  int k = ll_slot(seq);
  s->ll_cmp[k] = LL_CMP_NONE;
  size_t nl = ll_lines(bytes);
  const unsigned char *src = payload;
  for (size_t i = nl - 1; i > 0; i--) { /* the lines after line 0, from the last */
    ll_line *l = ll_at(s, s->me, k, (int)i);
    size_t off = LL_FIRST + (i - 1) * 56;
    kt__copy(l->data, src + off, KT_MIN((size_t)56, bytes - off));
    atomic_store_explicit(&l->flag, seq, memory_order_release);
  }
  ll_line *l = ll_at(s, s->me, k, 0); /* line 0, which everyone waits for first, last */
  memcpy(l->data, &s->cur, sizeof s->cur);
  kt__copy(l->data + sizeof s->cur, src, KT_MIN((size_t)LL_FIRST, bytes));
  ll_publish(s, &l->flag, seq);
  return KT_SUCCESS;
}

/* Every peer has written op seq: compare the signatures of the ops before
 * it that were not compared with every peer yet (their lines are intact: a
 * peer rewrites op j's slot only after this rank wrote op j + SHM_LL_AHEAD),
 * so a mismatch in a one-way op surfaces at the next op that waits for all. */
static kt_result ll_settle_all(kt__exec *ex, uint64_t seq) {
  kt__shm *s = ex->group->shm;
  uint64_t from = seq > SHM_LL_AHEAD ? seq - SHM_LL_AHEAD + 1 : 1;
  /* After ll_all no op is LL_CMP_ALL: only a wait for every peer marks an
   * op so, and it then moves ll_all up to that op. */
  for (uint64_t j = KT_MAX(from, s->ll_all + 1); j < seq; j++) {
    int done = s->ll_cmp[ll_slot(j)];
    for (int r = 0; r < s->n; r++)
      if (r != s->me && r != done) KT_CHECK(ll_compare(ex, r, j));
    s->ll_cmp[ll_slot(j)] = LL_CMP_ALL;
  }
  s->ll_all = seq;
  return KT_SUCCESS;
}

kt_result kt__shm_ll_wait(kt__exec *ex, int r) {
  kt__shm *s = ex->group->shm;
  if (r == s->me) return check_failures(ex, -1, UINT64_MAX, false);
  ll_goal g = {s->ll_seq, r, 1};
  KT_CHECK(ll_wait_goal(ex, &g));
  if (r >= 0) { /* one rank: the rooted ops */
    KT_CHECK(ll_compare_to(ex, r, s->ll_seq, &s->cur));
    s->ll_cmp[ll_slot(s->ll_seq)] = r;
  } else {
    for (int i = 0; i < s->n; i++)
      if (i != s->me) KT_CHECK(ll_compare_to(ex, i, s->ll_seq, &s->cur));
    s->ll_cmp[ll_slot(s->ll_seq)] = LL_CMP_ALL;
    KT_CHECK(ll_settle_all(ex, s->ll_seq));
  }
  return check_failures(ex, -1, UINT64_MAX, false);
}

/* kt__shm_ll_read beyond line 0, or of lines not all there (an error). */
static __attribute__((noinline)) kt_result ll_read_lines(kt__shm *s, int r, size_t off, void *dst, size_t bytes) {
  int k = ll_slot(s->ll_seq);
  if (r != s->me && !ll_written(s, r, s->ll_seq, ll_lines(off + bytes)))
    return kt__err(KT_ERR_INTERNAL, "small-message lines of rank %d incomplete", r);
  unsigned char *out = dst;
  size_t end = off + bytes;
  for (size_t i = 0, at = 0; at < end; i++) { /* at: payload offset of line i */
    size_t cap = i == 0 ? (size_t)LL_FIRST : 56, lo = KT_MAX(at, off), hi = KT_MIN(at + cap, end);
    if (lo < hi) memcpy(out + (lo - off), ll_at(s, r, k, (int)i)->data + (i == 0 ? sizeof(sig) : 0) + (lo - at), hi - lo);
    at += cap;
  }
  return KT_SUCCESS;
}

/* Line 0 is written last (kt__shm_ll_post), and kt__shm_ll_wait saw r's:
 * the other lines are there (checked all the same). Polling them while they
 * are written would pull each line away from its writer once more. */
kt_result kt__shm_ll_read(kt__exec *ex, int r, size_t off, void *dst, size_t bytes) {
  kt__shm *s = ex->group->shm;
  const ll_line *l0 = ll_at(s, r, ll_slot(s->ll_seq), 0);
  if (off + bytes <= LL_FIRST && (r == s->me || atomic_load_explicit(&l0->flag, memory_order_acquire) == s->ll_seq)) {
    kt__copy(dst, l0->data + sizeof(sig) + off, bytes); /* all in line 0: most small ops */
    return KT_SUCCESS;
  }
  return ll_read_lines(s, r, off, dst, bytes);
}

/* ---- single copy by the kernel: process_vm_readv/writev ---------------------- */

#define CMA_MAGIC 0x414d43544b54424bull /* "KBTKTCMA" */

/* Every rank reads one word from every peer's address space and writes the
 * same value back (the broadcast's root writes into its readers); the
 * verdict, AND-ed over all ranks, is the same on every rank. Two iterations,
 * once per communicator, at the first op that wants it. Refused where the
 * kernel forbids reaching into another process (Yama's ptrace_scope, a
 * seccomp filter, other pid namespaces); then the callers use the region
 * algorithms. */
static kt_result cma_probe(kt__exec *ex) {
  kt__shm *s = ex->group->shm;
  /* Read and rewritten (with the same value) by the peers: static, so that
   * a peer still at it when this rank leaves the probe early (an error)
   * writes into memory that stays this word. */
  static uint64_t box = CMA_MAGIC;
  int par;
  KT_CHECK(kt__shm_iter_begin(ex, &par));
  kt__shm_set_aux(ex, par, (uint64_t)(uintptr_t)&box);
  KT_CHECK(kt__shm_wait(ex, -1, kt__shm_post(ex)));
  int why = 0, who = -1;
  const char *call = NULL; /* the one refused */
  for (int r = 0; r < s->n && !why; r++) {
    if (r == s->me) continue;
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, rem = {(void *)(uintptr_t)kt__shm_get_aux(ex, r, par), sizeof v};
    call = "process_vm_readv";
    ssize_t got = process_vm_readv(ex->group->peer_pid[r], &l, 1, &rem, 1, 0);
    if (got == (ssize_t)sizeof v && v == CMA_MAGIC) {
      call = "process_vm_writev";
      got = process_vm_writev(ex->group->peer_pid[r], &l, 1, &rem, 1, 0);
    }
    if (got != (ssize_t)sizeof v || v != CMA_MAGIC) {
      why = got < 0 ? errno : EIO;
      who = r;
    }
  }
  KT_CHECK(kt__shm_iter_begin(ex, &par));
  kt__shm_set_aux(ex, par, why ? 0 : 1);
  KT_CHECK(kt__shm_wait(ex, -1, kt__shm_post(ex)));
  bool all = true;
  for (int r = 0; r < s->n; r++) all = all && kt__shm_get_aux(ex, r, par) == 1;
  s->cma = all ? 1 : -1;
  if (why)
    KT_INFO("rank %d: cannot reach rank %d's memory (%s: %s): large shared-memory ops copy "
            "through the segment", kt__rank_label(ex->group, s->me), kt__rank_label(ex->group, who), call,
            strerror(why));
  return KT_SUCCESS;
}

kt_result kt__shm_cma_ok(kt__exec *ex, bool *ok) {
  kt__shm *s = ex->group->shm;
  if (s->cma == 0) KT_CHECK(cma_probe(ex));
  *ok = s->cma > 0;
  return KT_SUCCESS;
}

/* Copy bytes between buf here and addr in rank r's address space. */
static kt_result cma_copy(kt__exec *ex, int r, uint64_t addr, char *buf, size_t bytes, bool write) {
  kt__group *c = ex->group;
  while (bytes > 0) {
    struct iovec l = {buf, bytes}, rem = {(void *)(uintptr_t)addr, bytes};
    ssize_t got = write ? process_vm_writev(c->peer_pid[r], &l, 1, &rem, 1, 0)
                        : process_vm_readv(c->peer_pid[r], &l, 1, &rem, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int e = got < 0 ? errno : EIO;
      char who[128];
      kt__peer_desc(c, r, who, sizeof who);
      return kt__err(e == ESRCH ? KT_ERR_PEER_FAILED : KT_ERR_SYSTEM, "rank %d: %s %zu bytes of %s's buffer (%s): %s",
                     kt__rank_label(c, c->rank), write ? "writing" : "reading", bytes, who,
                     write ? "process_vm_writev" : "process_vm_readv", strerror(e));
    }
    buf += got;
    addr += (uint64_t)got;
    bytes -= (size_t)got;
  }
  return KT_SUCCESS;
}

kt_result kt__shm_cma_read(kt__exec *ex, int r, uint64_t addr, void *dst, size_t bytes) {
  return cma_copy(ex, r, addr, dst, bytes, false);
}

kt_result kt__shm_cma_write(kt__exec *ex, int r, uint64_t addr, const void *src, size_t bytes) {
  return cma_copy(ex, r, addr, (char *)(uintptr_t)src, bytes, true);
}
