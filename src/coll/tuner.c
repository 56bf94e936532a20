/* tuner.c - which algorithm runs a collective.
 *
 * A small cost model in the alpha-beta style (latency per message + bytes /
 * bandwidth) picks among the algorithms a collective has; KAITIAN_ALGO forces
 * one ("ring", "allreduce=recursive_doubling,broadcast=pipeline"). A forced
 * name the collective does not have is reported once and ignored. Forcing
 * applies to the operations the user issues: the phases of a hierarchical
 * one, on its child communicators, run the tuner's picks. */
#include "coll.h"

#include "transport/shm.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Where an algorithm can run. */
enum { ANY = 0, SHM = 1, SHM_SMALL = 2, HIER = 3, SHM_LL = 4, SHM_CMA = 5 };

/* kt__algo (coll.h); needs: ANY; SHM: every rank on this host with a
 * segment; SHM_SMALL: and fits one region; SHM_LL: and each rank's payload
 * fits the small-message lines; SHM_CMA: and even blocks (alltoall: out of
 * place); HIER: ranks on several hosts (c->local, c->hosts; c->cross on the
 * first c->shards local ranks). */
typedef kt__algo algo;

static const algo algos[] = {
    {KT_COLL_ALLREDUCE, "ring", kt__allreduce_ring, ANY},
    {KT_COLL_ALLREDUCE, "recursive_doubling", kt__allreduce_recursive_doubling, ANY},
    {KT_COLL_ALLREDUCE, "halving_doubling", kt__allreduce_halving_doubling, ANY},
    {KT_COLL_ALLREDUCE, "shm_ll", kt__allreduce_shm_ll, SHM_LL},
    {KT_COLL_ALLREDUCE, "shm_oneshot", kt__allreduce_shm_oneshot, SHM_SMALL},
    {KT_COLL_ALLREDUCE, "shm_rsag", kt__allreduce_shm_rsag, SHM},
    {KT_COLL_ALLREDUCE, "hierarchical", kt__allreduce_hierarchical, HIER},
    {KT_COLL_BROADCAST, "binomial", kt__broadcast_binomial, ANY},
    {KT_COLL_BROADCAST, "pipeline", kt__broadcast_pipeline, ANY},
    {KT_COLL_BROADCAST, "shm_ll", kt__broadcast_shm_ll, SHM_LL},
    {KT_COLL_BROADCAST, "shm_cma", kt__broadcast_shm_cma, SHM_CMA},
    {KT_COLL_BROADCAST, "shm", kt__broadcast_shm, SHM},
    {KT_COLL_BROADCAST, "hierarchical", kt__broadcast_hierarchical, HIER},
    {KT_COLL_REDUCE, "binomial", kt__reduce_binomial, ANY},
    {KT_COLL_REDUCE, "shm_ll", kt__reduce_shm_ll, SHM_LL},
    {KT_COLL_REDUCE, "shm_oneshot", kt__reduce_shm_oneshot, SHM},
    {KT_COLL_REDUCE, "shm", kt__reduce_shm, SHM},
    {KT_COLL_REDUCE, "hierarchical", kt__reduce_hierarchical, HIER},
    {KT_COLL_ALLGATHER, "ring", kt__allgatherv_ring, ANY},
    {KT_COLL_ALLGATHER, "shm_ll", kt__allgather_shm_ll, SHM_LL},
    {KT_COLL_ALLGATHER, "shm_cma", kt__allgather_shm_cma, SHM_CMA},
    {KT_COLL_ALLGATHER, "shm", kt__allgatherv_shm, SHM},
    {KT_COLL_ALLGATHER, "hierarchical", kt__allgatherv_hierarchical, HIER},
    {KT_COLL_ALLGATHERV, "ring", kt__allgatherv_ring, ANY},
    {KT_COLL_ALLGATHERV, "shm", kt__allgatherv_shm, SHM},
    {KT_COLL_ALLGATHERV, "hierarchical", kt__allgatherv_hierarchical, HIER},
    {KT_COLL_REDUCE_SCATTER, "ring", kt__reduce_scatter_ring, ANY},
    {KT_COLL_REDUCE_SCATTER, "shm_ll", kt__reduce_scatter_shm_ll, SHM_LL},
    {KT_COLL_REDUCE_SCATTER, "shm", kt__reduce_scatter_shm, SHM},
    {KT_COLL_REDUCE_SCATTER, "hierarchical", kt__reduce_scatter_hierarchical, HIER},
    {KT_COLL_GATHER, "linear", kt__gather_linear, ANY},
    {KT_COLL_GATHER, "shm_ll", kt__gather_shm_ll, SHM_LL},
    {KT_COLL_GATHER, "shm_cma", kt__gather_shm_cma, SHM_CMA},
    {KT_COLL_GATHER, "shm", kt__gather_shm, SHM},
    {KT_COLL_SCATTER, "linear", kt__scatter_linear, ANY},
    {KT_COLL_SCATTER, "shm_ll", kt__scatter_shm_ll, SHM_LL},
    {KT_COLL_SCATTER, "shm_cma", kt__scatter_shm_cma, SHM_CMA},
    {KT_COLL_SCATTER, "shm", kt__scatter_shm, SHM},
    {KT_COLL_ALLTOALL, "pairwise", kt__alltoallv_pairwise, ANY},
    {KT_COLL_ALLTOALL, "shm_ll", kt__alltoall_shm_ll, SHM_LL},
    {KT_COLL_ALLTOALL, "shm_cma", kt__alltoall_shm_cma, SHM_CMA},
    {KT_COLL_ALLTOALL, "shm", kt__alltoallv_shm, SHM},
    {KT_COLL_ALLTOALLV, "pairwise", kt__alltoallv_pairwise, ANY},
    {KT_COLL_ALLTOALLV, "shm", kt__alltoallv_shm, SHM},
    {KT_COLL_BARRIER, "dissemination", kt__barrier_dissemination, ANY},
    {KT_COLL_BARRIER, "shm_ll", kt__barrier_shm_ll, SHM_LL},
    {KT_COLL_BARRIER, "shm", kt__barrier_shm, SHM},
    {KT_COLL_BARRIER, "hierarchical", kt__barrier_hierarchical, HIER},
    {KT_COLL_SEND, "direct", kt__p2p, ANY},
    {KT_COLL_SEND, "shm", kt__p2p_shm, SHM},
    {KT_COLL_RECV, "direct", kt__p2p, ANY},
    {KT_COLL_RECV, "shm", kt__p2p_shm, SHM},
    {KT_COLL_SENDRECV, "direct", kt__p2p, ANY},
    {KT_COLL_SENDRECV, "shm", kt__p2p_shm, SHM},
};
#define NALGOS (sizeof algos / sizeof algos[0])

/* Forced algorithm per collective (index into algos, -1 = tuner). */
static int forced[KT_COLL_COUNT];
static pthread_once_t tuner_once = PTHREAD_ONCE_INIT;

static int find_algo(kt__coll coll, const char *name) {
  for (size_t i = 0; i < NALGOS; i++)
    if (algos[i].coll == coll && strcmp(algos[i].name, name) == 0) return (int)i;
  return -1;
}

/* KAITIAN_ALGO's text into forced (an index into algos per collective, -1: the
 * tuner's pick). Names no collective has are reported and ignored.
 * (tests/fuzz/fuzz_algo.c calls it on any text.) */
static void parse_algo_spec(const char *text, int forced[KT_COLL_COUNT]) {
  for (int i = 0; i < KT_COLL_COUNT; i++) forced[i] = -1;
  char spec[512];
  snprintf(spec, sizeof spec, "%s", text);
  char *save = NULL;
  for (char *tok = strtok_r(spec, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    char *eq = strchr(tok, '=');
    bool used = false;
    for (int cl = 0; cl < KT_COLL_COUNT; cl++) {
      const char *name = tok;
      if (eq) {
        *eq = '\0';
        bool match = strcmp(tok, kt__coll_name((kt__coll)cl)) == 0;
        *eq = '=';
        if (!match) continue;
        name = eq + 1;
      }
      int a = find_algo((kt__coll)cl, name);
      if (a >= 0) {
        forced[cl] = a;
        used = true;
      }
    }
    if (!used) KT_WARN("KAITIAN_ALGO: '%s' names no algorithm of any collective; ignored", tok);
  }
  /* Point to point: one transport for send, recv and sendrecv alike, or
   * messages would not meet. */
  static const kt__coll p2p[] = {KT_COLL_SEND, KT_COLL_RECV, KT_COLL_SENDRECV};
  for (int i = 0; i < 3; i++)
    if (forced[p2p[i]] >= 0) {
      for (int j = 0; j < 3; j++) forced[p2p[j]] = find_algo(p2p[j], algos[forced[p2p[i]]].name);
      break;
    }
}

static void parse_forced(void) { parse_algo_spec(kt__param_ALGO(), forced); }

/* Model constants for TCP: per-message latency and per-byte time. */
#define ALPHA_US 20.0
#define BETA_US_PER_BYTE (1.0 / 2000.0) /* ~2 GB/s */
/* Recursive doubling reduces what it received only once all of it is there
 * (the ring reduces chunks as they arrive): its reduction is exposed, and its
 * one exchange of the whole message kept shaped links below their rate.
 * Fitted to netns hosts x 1 rank on 1, 2, 10 Gbit/s and unshaped links: with
 * 2 the ring was as fast or faster from 512 KiB on every link and recursive
 * doubling faster only up to 256 KiB at 10 Gbit/s; with 4, halving-doubling
 * from 128 KiB (docs/algorithms.md). This puts the change near 370 KiB at 2
 * ranks and 110 KiB at 4. */
#define GAMMA_US_PER_BYTE (1.0 / 16000.0)
/* Links slower than this (bytes per microsecond: 4000 Mbit/s) are modelled
 * with their own per-byte time, and the latency-bound algorithms lose their
 * KAITIAN_SMALL_BYTES floor: on netns hosts x 1 rank shaped to 1 Gbit/s, the
 * ring took 0.61-0.81x recursive doubling's time at 16-64 KiB with 3 hosts,
 * halving-doubling or the ring 0.69-0.75x with 4, where unshaped recursive
 * doubling was fastest (docs/algorithms.md). Faster links keep the fitted
 * BETA (the CPUs bound them here). */
#define SLOW_LINK_BPUS 500.0

static int ceil_log2(int p) {
  int l = 0;
  while ((1 << l) < p) l++;
  return l;
}

/* ll_room: the most bytes per rank (count x element size) whose payload
 * fits the small-message lines (allgather and gather: its block; scatter:
 * the root's every block but its own; reduce_scatter and alltoall: every
 * block of each rank's input but its own). ll_fits: the op's does (barrier:
 * none); the hierarchy's uneven gathers and reduce-scatters stay with shm. */
static size_t ll_room(const kt__group *c, kt__coll coll) {
  bool whole = coll == KT_COLL_SCATTER || coll == KT_COLL_REDUCE_SCATTER || coll == KT_COLL_ALLTOALL;
  return KT_SHM_LL_MAX / (whole && c->size > 1 ? (size_t)c->size - 1 : 1);
}

static bool ll_fits(const kt__group *c, const kt__op *op) {
  if (op->coll == KT_COLL_BARRIER) return true;
  return !op->counts && op->count * kt_dtype_size(op->dtype) <= ll_room(c, op->coll);
}

/* The single-copy algorithms: even blocks; alltoall with send and receive
 * buffers apart (the others read a rank's send buffer while it writes). */
static bool cma_fits(const kt__group *c, const kt__op *op) {
  if (op->counts) return false;
  if (op->coll != KT_COLL_ALLTOALL) return true;
  size_t all = op->count * kt_dtype_size(op->dtype) * (size_t)c->size;
  uintptr_t s = (uintptr_t)op->sendbuf, r = (uintptr_t)op->recvbuf;
  return s + all <= r || r + all <= s;
}

static bool can_run(kt__group *c, const kt__op *op, const algo *a) {
  /* Uneven blocks of reduce_scatter and gather (internal: phases of the
   * hierarchical algorithms): shm, and the ring for reduce_scatter. */
  if ((op->coll == KT_COLL_REDUCE_SCATTER || op->coll == KT_COLL_GATHER) && op->counts && a->needs != SHM &&
      a->fn != kt__reduce_scatter_ring)
    return false;
  if (a->needs == ANY) return true;
  if (a->needs == HIER) return c->hosts != NULL; /* every rank of the communicator alike */
  if (!c->shm) return false;
  if (a->needs == SHM_SMALL)
    return op->count * kt_dtype_size(op->dtype) <= kt__shm_region_bytes(c);
  if (a->needs == SHM_LL) return ll_fits(c, op);
  if (a->needs == SHM_CMA) return cma_fits(c, op);
  return true;
}

/* The tuner's picks, by name; their index in algos per collective is looked
 * up once (pick_idx), not by string per op. */
enum { PICK_NONE = -1, PICK_SHM_LL, PICK_SHM_ONESHOT, PICK_SHM_RSAG, PICK_SHM, PICK_HIER, PICK_RD, PICK_HD,
       PICK_RING, PICK_BINOMIAL, PICK_PIPELINE, PICK_SHM_CMA, NPICKS };
static const char *const pick_names[NPICKS] = {"shm_ll",           "shm_oneshot",      "shm_rsag", "shm",
                                               "hierarchical",     "recursive_doubling", "halving_doubling",
                                               "ring",             "binomial",         "pipeline",
                                               "shm_cma"};
static int pick_idx[KT_COLL_COUNT][NPICKS]; /* -1: the collective has none of that name */

/* Once per process, before the first pick: KAITIAN_ALGO and pick_idx. */
static int64_t ll_bytes[KT_COLL_COUNT]; /* KAITIAN_SHM_LL_BYTES, or the default per collective */
static bool ll_set;
static int64_t cma_bytes, reduce_oneshot_bytes; /* KAITIAN_SHM_CMA_BYTES, KAITIAN_SHM_REDUCE_ONESHOT_BYTES */
static bool reduce_oneshot_set;

/* Unset, KAITIAN_SHM_LL_BYTES depends on the collective and the ranks
 * (docs/algorithms.md): every line where some ranks only send (broadcast,
 * scatter, reduce, gather) and, for the collectives where every rank waits
 * for every other (allreduce, allgather, reduce_scatter), at 2 ranks with a
 * CPU each; otherwise 872 bytes, and 64 for allreduce and reduce_scatter
 * where the host's ranks outnumber its CPUs (with ranks descheduled the
 * region algorithm's one post per rank did better). */
#define LL_ALL_TO_ALL 872
#define LL_OVERSUBSCRIBED 64

static void init_ll_bytes(void) {
  int64_t v = kt__param_SHM_LL_BYTES();
  ll_set = kt__param_set_SHM_LL_BYTES();
  for (int cl = 0; cl < KT_COLL_COUNT; cl++) ll_bytes[cl] = ll_set ? v : LL_ALL_TO_ALL;
  if (ll_set) return;
  ll_bytes[KT_COLL_BROADCAST] = ll_bytes[KT_COLL_SCATTER] = ll_bytes[KT_COLL_REDUCE] = ll_bytes[KT_COLL_GATHER] =
      KT_SHM_LL_MAX;
}

/* Two ranks, each with a CPU of its own: where the next algorithm (one-shot
 * allreduce and reduce, the region algorithms of broadcast, allgather and
 * reduce_scatter) overtakes the lines, per rank. Measured 2026-11-29 on the
 * Xeon VM (tests run alternately with each algorithm forced, medians of 3
 * launches of 3000 calls; docs/algorithms.md): beyond these the lines lost
 * by up to 1.6x (allreduce 4 KiB 0.53-0.57 us against one-shot's
 * 0.19-0.21 before the segment was mapped at setup, 0.21 after), which
 * bench/sweep_peers showed as inversions at the old 4456-byte limit.
 * 0: the default of the collective. */
static const int64_t ll_two_ranks[KT_COLL_COUNT] = {
    [KT_COLL_ALLREDUCE] = 384, [KT_COLL_REDUCE] = 1536, [KT_COLL_BROADCAST] = 1536,
    [KT_COLL_ALLGATHER] = 256, [KT_COLL_REDUCE_SCATTER] = 256};

static int64_t ll_limit(kt__group *c, kt__coll coll) {
  if (ll_set) return ll_bytes[coll];
  if (c->size == 2 && ll_two_ranks[coll] > 0 && !kt__shm_oversubscribed(c)) return ll_two_ranks[coll];
  bool all_wait = coll == KT_COLL_ALLREDUCE || coll == KT_COLL_ALLGATHER || coll == KT_COLL_REDUCE_SCATTER ||
                  coll == KT_COLL_ALLTOALL;
  if (!all_wait) return ll_bytes[coll];
  if (kt__shm_oversubscribed(c))
    return coll == KT_COLL_ALLREDUCE || coll == KT_COLL_REDUCE_SCATTER ? LL_OVERSUBSCRIBED : ll_bytes[coll];
  /* Two ranks, each with a CPU: a rank reads one peer's payload, as a
   * broadcast's reader does. */
  return c->size == 2 ? KT_SHM_LL_MAX : ll_bytes[coll];
}

static void init_tuner(void) {
  parse_forced();
  init_ll_bytes();
  cma_bytes = kt__param_SHM_CMA_BYTES();
  reduce_oneshot_bytes = kt__param_SHM_REDUCE_ONESHOT_BYTES();
  reduce_oneshot_set = kt__param_set_SHM_REDUCE_ONESHOT_BYTES();
  for (int cl = 0; cl < KT_COLL_COUNT; cl++)
    for (int k = 0; k < NPICKS; k++) pick_idx[cl][k] = find_algo((kt__coll)cl, pick_names[k]);
}

static int model_pick(kt__group *c, const kt__op *op) {
  double n = (double)op->count * (double)kt_dtype_size(op->dtype);
  if (c->shm) { /* one host: shared memory for every collective */
    int64_t ll = ll_limit(c, op->coll);
    if (ll > 0 && pick_idx[op->coll][PICK_SHM_LL] >= 0 && ll_fits(c, op) &&
        (op->coll == KT_COLL_BARRIER || n <= (double)ll))
      return PICK_SHM_LL;
    if (op->coll == KT_COLL_ALLREDUCE) {
      /* Unset, 24 KiB at 2 ranks with a CPU each: reduce-scatter + allgather
       * won from there on 2026-11-29 (32 KiB 3.65 against 3.99 us, 64 KiB
       * 5.85 against 6.76; even from 16 to 28 KiB), one-shot below it. */
      size_t oneshot = (size_t)kt__param_SHM_ONESHOT_BYTES();
      if (!kt__param_set_SHM_ONESHOT_BYTES() && c->size == 2 && !kt__shm_oversubscribed(c)) oneshot = 24576;
      return n <= (double)KT_MIN(oneshot, kt__shm_region_bytes(c)) ? PICK_SHM_ONESHOT : PICK_SHM_RSAG;
    }
    /* Single copy through process_vm_readv/writev (docs/algorithms.md):
     * alltoall, scatter and gather from KAITIAN_SHM_CMA_BYTES per rank;
     * broadcast and allgather from that size too, where every rank has a
     * CPU of its own (oversubscribed, the region algorithms won at 16 MiB). */
    bool cma = cma_bytes > 0 && cma_fits(c, op);
    if (cma && n >= (double)cma_bytes &&
        (op->coll == KT_COLL_ALLTOALL || op->coll == KT_COLL_SCATTER || op->coll == KT_COLL_GATHER))
      return PICK_SHM_CMA;
    /* Broadcast and allgather: the region algorithms, at every size. Single
     * copy lost to them at 2 ranks from 16 KiB to 64 MiB on 2026-11-29
     * (broadcast in place 16 KiB 1.83 against 0.35 us, 1 MiB 33.8 against
     * 18.8, 64 MiB 4.45 against 2.90 ms; allgather 32 KiB 3.3 against 1.8
     * us, 2 MiB 93 against 60, 64 MiB 6.2 against 4.8 ms) since the region
     * broadcast became single-pass (2026-11-28); KAITIAN_ALGO still forces it. */
    /* One-shot reduce up to KAITIAN_SHM_REDUCE_ONESHOT_BYTES; unset, at 2
     * ranks at every size: the root reduces one input besides its own, and
     * the region algorithm's second phase cost more (docs/algorithms.md). */
    if (op->coll == KT_COLL_REDUCE &&
        (n <= (double)reduce_oneshot_bytes || (c->size == 2 && !reduce_oneshot_set)))
      return PICK_SHM_ONESHOT;
    return PICK_SHM;
  }
  /* Several hosts with shared memory inside each: TCP only between hosts,
   * for every collective that has a hierarchical algorithm. */
  if (c->hosts && pick_idx[op->coll][PICK_HIER] >= 0) return PICK_HIER;
  double p = c->size, lg = ceil_log2(c->size);
  bool slow = c->link_bpus > 0 && c->link_bpus < SLOW_LINK_BPUS;
  double beta = slow ? 1.0 / c->link_bpus : BETA_US_PER_BYTE;
  switch (op->coll) {
    case KT_COLL_ALLREDUCE: {
      double chunk = (double)kt__chunk_bytes(op->dtype);
      double ring = 2 * (p - 1) * ALPHA_US * (1 + n / p / chunk / 8) + 2 * (p - 1) / p * n * beta;
      bool pof2 = (c->size & (c->size - 1)) == 0;
      double rd = (lg + (pof2 ? 0 : 2)) * (ALPHA_US + n * (beta + GAMMA_US_PER_BYTE));
      if ((double)op->count < p || (!slow && n <= (double)kt__param_SMALL_BYTES())) return PICK_RD;
      /* Halving-doubling: the ring's bytes in 2 log2 q steps (q: the
       * largest power of two <= p; the others fold in and out first). */
      int lq = pof2 ? (int)lg : (int)lg - 1;
      double q = (double)(1 << lq);
      double hd = q < 4 ? rd + ring
                        : 2 * lq * ALPHA_US + 2 * (q - 1) / q * n * beta + (pof2 ? 0 : 2 * (ALPHA_US + n * beta));
      if (rd <= ring && rd <= hd) return PICK_RD;
      return hd < ring ? PICK_HD : PICK_RING;
    }
    case KT_COLL_BROADCAST: {
      double chunk = (double)kt__chunk_bytes(op->dtype);
      double binom = lg * (ALPHA_US + n * beta);
      double pipe = (p - 2 + n / chunk) * (ALPHA_US / 4 + chunk * beta) + ALPHA_US;
      return binom <= pipe ? PICK_BINOMIAL : PICK_PIPELINE;
    }
    default:
      return PICK_NONE; /* one algorithm */
  }
}

/* c->ll_cut: what model_pick and can_run decide for a small op of even
 * blocks, per collective, where nothing forces another algorithm. Over a
 * segment's life nothing they read changes (KAITIAN_* once per process, the
 * segment's oversubscription at its creation). */
static void init_ll_cut(kt__group *c) {
  for (int cl = 0; cl < KT_COLL_COUNT; cl++) {
    c->ll_cut[cl] = -1;
    if (!c->shm || forced[cl] >= 0 || pick_idx[cl][PICK_SHM_LL] < 0) continue;
    int64_t ll = ll_limit(c, (kt__coll)cl);
    if (ll <= 0) continue;
    c->ll_cut[cl] = cl == KT_COLL_BARRIER ? 0 : KT_MIN(ll, (int64_t)ll_room(c, (kt__coll)cl));
  }
  c->ll_cut_set = true;
}

/* The small ops' pick without the model (its cost is a fair part of a
 * sub-microsecond op), inlined into kt__algo_pick, which asks pick() only when
 * this declines (-1). Returns an index into algos. */
static inline int ll_pick(const kt__group *c, const kt__op *op) {
  if (!c->ll_cut_set || op->counts || (int64_t)(op->count * kt_dtype_size(op->dtype)) > c->ll_cut[op->coll])
    return -1;
  return pick_idx[op->coll][PICK_SHM_LL];
}

/* The algorithm for op, an index into algos (-1: none can run it): the one
 * KAITIAN_ALGO forces (not for a phase), else the model's pick. A forced
 * one that cannot run the call is reported at INFO with what runs instead. */
static int pick(kt__group *c, const kt__op *op, bool phase) {
  pthread_once(&tuner_once, init_tuner);
  if (!c->ll_cut_set) init_ll_cut(c);
  int f = phase ? -1 : forced[op->coll];
  if (f >= 0 && can_run(c, op, &algos[f])) return f;
  int a = -1, m = model_pick(c, op);
  if (m != PICK_NONE) {
    int i = pick_idx[op->coll][m];
    if (i >= 0 && can_run(c, op, &algos[i])) a = i;
  }
  /* One algorithm, or the model's cannot run this call (uneven blocks of
   * kt_reduce_scatterv across hosts: the ring): the first that can. */
  for (size_t i = 0; i < NALGOS && a < 0; i++)
    if (algos[i].coll == op->coll && can_run(c, op, &algos[i])) a = (int)i;
  if (f >= 0)
    KT_INFO("rank %d: KAITIAN_ALGO forces %s=%s, which cannot run op #%llu (count %zu, %s%s); the tuner's pick, "
            "%s, runs it", c->rank, kt__coll_name(op->coll), algos[f].name, (unsigned long long)op->seq, op->count,
            kt_dtype_name(op->dtype), op->sendbuf == op->recvbuf ? ", in place" : "", a >= 0 ? algos[a].name : "none");
  return a;
}

/* An op issued on c (not a phase of a hierarchical one) runs algorithm a:
 * add it to c->algos_run, which kt__algos_run reports (coll_test --algo
 * checks that a forced run ran the algorithm it names and no other), and
 * at INFO say so the first time: which algorithms a job uses, at no cost
 * per op (the multi-host tests read these lines). */
static inline void note_run(kt__group *c, const kt__op *op, int a) {
  _Static_assert(NALGOS <= 64, "one bit of algos_run per algorithm");
  uint64_t bit = (uint64_t)1 << a, run = atomic_load_explicit(&c->algos_run, memory_order_relaxed);
  if (KT_LIKELY(run & bit)) return;
  atomic_store_explicit(&c->algos_run, run | bit, memory_order_relaxed); /* one writer: the executing op */
  KT_INFO("rank %d/%d: %s runs algorithm %s (first time on this communicator)", c->rank, c->size,
          kt__coll_name(op->coll), algos[a].name);
}

const char *kt__algos_run(kt__group *c, const char *coll, char *buf, size_t cap) {
  uint64_t run = atomic_load_explicit(&c->algos_run, memory_order_relaxed);
  size_t n = 0;
  if (cap == 0) return buf;
  buf[0] = '\0';
  for (size_t i = 0; i < NALGOS; i++) {
    if (!(run & ((uint64_t)1 << i)) || strcmp(kt__coll_name(algos[i].coll), coll) != 0) continue;
    int w = snprintf(buf + n, cap - n, "%s%s", n ? "," : "", algos[i].name);
    if (w < 0 || (size_t)w >= cap - n) break; /* cut short */
    n += (size_t)w;
  }
  return buf;
}

const char *kt__algo_for(kt__group *c, kt__coll coll, const void *sendbuf, void *recvbuf, size_t count,
                         kt_dtype dtype, kt_op op, int root) {
  kt__op o = {.coll = coll, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dtype = dtype, .op = op,
              .root = root};
  int a = ll_pick(c, &o);
  if (a < 0) a = pick(c, &o, false);
  return a < 0 ? "none" : algos[a].name;
}

/* The algorithm that runs op on c: the small ops' pick without the model,
 * else KAITIAN_ALGO's or the model's (pick); counted as run (note_run)
 * unless a phase. NULL when none can run it. Core executes it (execute.c). */
const kt__algo *kt__algo_pick(kt__group *c, const kt__op *op, bool phase) {
  int a = ll_pick(c, op);
  if (a < 0) a = pick(c, op, phase);
  if (a < 0) return NULL;
  if (!phase) note_run(c, op, a);
  return &algos[a];
}
