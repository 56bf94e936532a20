/* comm.c - communicator life cycle: init (from a store or the launcher's
 * environment), split, destroy, abort, and the error state. */
#include "comm.h"
#include "jobenv.h"

#include "store/store.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Break c (first failure wins) and its hierarchy children with msg. */
static void comm_fail_msg(struct kt_comm_s *c, kt_result r, const char *msg) {
  pthread_mutex_lock(&c->mu);
  bool first = atomic_load(&c->broken) == 0;
  if (first) {
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
    atomic_store(&c->broken, (int)r);
  }
  pthread_mutex_unlock(&c->mu);
  if (first) {
    if (!c->g.label) KT_WARN("communicator of rank %d/%d failed: %s: %s", c->g.rank, c->g.size, kt_strerror(r), msg);
    kt__shm_fail(&c->g, r, msg);
    kt__tcp_broadcast_abort(&c->g, r, msg); /* msg starts with "rank N:" */
  }
  /* Peers waiting in a phase of a hierarchical op wait on the children. */
  if (c->g.local) comm_fail_msg(kt__comm_of(c->g.local), r, msg);
  if (c->g.cross) comm_fail_msg(kt__comm_of(c->g.cross), r, msg);
}

void kt__comm_fail(struct kt_comm_s *c, kt_result r) {
  char msg[sizeof c->broken_msg];
  kt__error_copy(msg, sizeof msg);
  comm_fail_msg(c, r, msg);
}

/* Allocate a communicator shell: everything but the transport. */
static kt_result comm_alloc(int rank, int size, int64_t timeout_ms, const char *prefix,
                            struct kt_comm_s **out) {
  struct kt_comm_s *c = kt__calloc(1, sizeof *c);
  if (!c) return KT_ERR_NO_MEMORY;
  c->g.rank = rank;
  c->g.size = size;
  c->g.timeout_ms = timeout_ms > 0 ? timeout_ms : kt__param_TIMEOUT();
  snprintf(c->g.prefix, sizeof c->g.prefix, "%s", prefix);
  c->g.abort_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  c->g.peer_host = kt__calloc((size_t)size, sizeof *c->g.peer_host);
  c->g.peer_pid = kt__calloc((size_t)size, sizeof *c->g.peer_pid);
  if (c->g.abort_fd < 0 || !c->g.peer_host || !c->g.peer_pid) {
    kt_result r = c->g.abort_fd < 0 ? kt__err(KT_ERR_SYSTEM, "eventfd: %s", strerror(errno))
                                  : KT_ERR_NO_MEMORY;
    if (c->g.abort_fd >= 0) close(c->g.abort_fd);
    free(c->g.peer_host);
    free(c->g.peer_pid);
    free(c);
    return r;
  }
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  gethostname(c->g.peer_host[rank], sizeof c->g.peer_host[rank]);
  c->g.peer_host[rank][sizeof c->g.peer_host[rank] - 1] = '\0';
  c->g.peer_pid[rank] = (int)getpid();
  *out = c;
  return KT_SUCCESS;
}

static void comm_free(struct kt_comm_s *c) {
  if (c->g.local) kt_comm_destroy(kt__comm_of(c->g.local));
  if (c->g.cross) kt_comm_destroy(kt__comm_of(c->g.cross));
  free(c->g.label);
  free(c->g.hosts);
  kt__shm_close(&c->g);
  kt__tcp_close(&c->g, false);
  if (c->g.abort_fd >= 0) close(c->g.abort_fd);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->g.peer_host);
  free(c->g.peer_pid);
  free(c->g.scratch);
  free(c);
}

static kt_result connect_through_store(struct kt_comm_s *c, kt_store store);
static kt_result comm_split(kt_comm comm, int color, int key, int share, kt_comm *newcomm);

/* c->hosts from each rank's host (hostof, numbered by lowest rank), for the
 * hierarchical algorithms. One allocation, freed with c. */
static kt_result hosts_build(struct kt_comm_s *c, const int *hostof, int nhosts) {
  size_t n = (size_t)c->g.size;
  kt__hosts *t = kt__calloc(1, sizeof *t + (3 * n + (size_t)nhosts + 1) * sizeof(int));
  if (!t) return KT_ERR_NO_MEMORY;
  t->n = nhosts;
  t->of = (int *)(t + 1);
  t->idx = t->of + n;
  t->rank = t->idx + n;
  t->first = t->rank + n;
  int *seen = t->rank; /* per host, ranks met so far (rank[] is filled last) */
  for (size_t j = 0; j < n; j++) {
    t->of[j] = hostof[j];
    t->idx[j] = seen[hostof[j]]++;
  }
  for (int h = 0; h < nhosts; h++) t->first[h + 1] = t->first[h] + seen[h];
  for (size_t j = 0; j < n; j++) t->rank[t->first[hostof[j]] + t->idx[j]] = (int)j;
  c->g.hosts = t;
  return KT_SUCCESS;
}

/* Hosts numbered in order of their lowest rank: hostof[j] for each of the n
 * ranks; returns how many hosts. */
static int number_hosts(const kt__tcp_addr *all, int n, int *hostof) {
  int nhosts = 0;
  for (int j = 0; j < n; j++) {
    int h = 0;
    while (h < j && strcmp(all[h].hostid, all[j].hostid) != 0) h++;
    hostof[j] = h == j ? nhosts++ : hostof[h];
  }
  return nhosts;
}

/* Split c into the children of one level of hierarchy (see comm.h); every
 * rank computes the same layout from the addresses, so every rank splits. */
static kt_result setup_hierarchy(struct kt_comm_s *c, const kt__tcp_addr *all) {
  kt_result res = KT_SUCCESS;
  int n = c->g.size, nhosts = 0, host = -1, lrank = -1, L = -1;
  int *hostof = kt__calloc((size_t)n, sizeof *hostof); /* freed at exit */
  int *count = kt__calloc((size_t)n, sizeof *count);
  if (!hostof || !count) {
    res = KT_ERR_NO_MEMORY;
    goto exit;
  }
  nhosts = number_hosts(all, n, hostof);
  for (int j = 0; j < n; j++) {
    if (j == c->g.rank) {
      host = hostof[j];
      lrank = count[host];
    }
    count[hostof[j]]++;
  }
  /* Shards: the fewest ranks any host has. Hosts with more run their extra
   * ranks' part of an op within the host only (their cross is NULL). */
  int S = count[0], most = count[0];
  for (int h = 1; h < nhosts; h++) {
    S = KT_MIN(S, count[h]);
    most = KT_MAX(most, count[h]);
  }
  if (most < 2) goto exit; /* one rank per host: TCP only */
  L = count[host];
  struct kt_comm_s *child = NULL;
  KT_CHECK_GOTO(kt_comm_split(c, host, c->g.rank, &child), res, exit);
  c->g.local = &child->g;
  /* The S cross communicators run at once between the same hosts: they share
   * KAITIAN_NSOCKS connections per pair of hosts (S parallel streams already
   * keep a link busy; more compete for it). */
  child = NULL;
  KT_CHECK_GOTO(comm_split(c, lrank < S ? lrank : KT_SPLIT_NOCOLOR, c->g.rank, S, &child), res, exit);
  c->g.cross = child ? &child->g : NULL;
  c->g.shards = S;
  c->g.local->label = kt__calloc((size_t)L, sizeof *c->g.local->label);
  if (!c->g.local->label || (c->g.cross && !(c->g.cross->label = kt__calloc((size_t)nhosts, sizeof *c->g.cross->label)))) {
    res = KT_ERR_NO_MEMORY;
    goto exit;
  }
  /* Children order their ranks as the parent does (split key = parent rank):
   * the ranks of my host, and the ranks with my local index on their host. */
  for (int h = 0; h < nhosts; h++) count[h] = 0;
  for (int j = 0, nl = 0, nc = 0; j < n; j++) {
    if (hostof[j] == host) c->g.local->label[nl++] = j;
    if (count[hostof[j]]++ == lrank && c->g.cross) c->g.cross->label[nc++] = j;
  }
  /* Last: the hierarchical algorithms run once c->hosts is set (the splits
   * above run allgathers on c before the children are complete). */
  KT_CHECK_GOTO(hosts_build(c, hostof, nhosts), res, exit);
  if (S == most)
    KT_INFO("rank %d: %d hosts x %d ranks: shared memory within the host, TCP between hosts", c->g.rank, nhosts, L);
  else
    KT_INFO("rank %d: %d hosts with %d to %d ranks: shared memory within the host, TCP between hosts for the "
            "first %d of each", c->g.rank, nhosts, S, most, S);
exit:
  free(hostof);
  free(count);
  return res;
}

/* Shared memory when every rank is on this host; the hierarchy when ranks
 * span hosts (KAITIAN_TRANSPORT=auto). */
static kt_result setup_transports(struct kt_comm_s *c, const kt__tcp_addr *all) {
  if (c->g.size < 2 || strcmp(kt__param_TRANSPORT(), "tcp") == 0) return KT_SUCCESS;
  if (!c->g.all_local) return setup_hierarchy(c, all);
  uint64_t owed = 0; /* room the ranks' other communicators counted and have not taken yet */
  for (int r = 0; r < c->g.size; r++) owed += all[r].shm_owed;
  return kt__shm_setup(&c->g, owed);
}

/* kt_store_get of exactly size bytes under key, waiting up to
 * KAITIAN_CONNECT_TIMEOUT. */
static kt_result store_get_exact(kt_store store, const char *key, void *buf, size_t size) {
  size_t len = 0;
  KT_CHECK(kt_store_get(store, key, buf, size, &len, kt__param_CONNECT_TIMEOUT()));
  if (len != size)
    return kt__err(KT_ERR_STORE, "store key %s holds %zu bytes, expected %zu (another job or version using the same prefix?)",
                   key, len, size);
  return KT_SUCCESS;
}

/* c->link_bpus for the tuner (comm.h), decided by rank 0 and handed to every
 * rank through the store, so that every rank models the same link: rank 0's
 * KAITIAN_LINK_MBITS, else the slowest link measured between the hosts'
 * first ranks ("leaders", in rank order), one probe per link of their ring
 * (with 2 hosts, one: leader 0 to leader 1). A job is as fast as its
 * slowest link, and a link that rank 0 does not use can be the slow one.
 * Rank 0 first puts its request under <prefix>/linkreq (-1: measure), which
 * every leader reads. Links are measured in rounds, each leader in one
 * probe at a time (as sender of link i, from leader i to leader i + 1, and
 * receiver of link i - 1): even links, then odd ones, then with an odd
 * number of hosts the one back to leader 0. The sender streams PROBE_MSGS
 * messages of PROBE_BYTES (striped over the pair's connections, as large
 * messages go) with no pause between them; the receiver takes the median of
 * the gaps between the arrivals of the last PROBE_TIMED ones, or their mean
 * where that is longer, sends the rate back and puts it under
 * <prefix>/link/<i> (-1: that probe failed, put by either end). The
 * messages before are not timed: they carry TCP's slow start and drain a
 * token bucket's burst (a shaper, or a virtual machine's or a switch's
 * burst allowance), through which the first bytes pass faster than the
 * link's steady rate (docs/algorithms.md, "The link's speed"). Rank 0 takes
 * the slowest and puts it under <prefix>/link (bytes per microsecond; 0:
 * not modelled; -1: a probe failed, with the link's ranks). Not a
 * collective: the ranks a collective releases first would run into their
 * next operations, whose failure could abort a slower rank still in it.
 * The communicator is not the caller's yet, so no other traffic meets the
 * probes'; its owner's path (progress.c) is left unclaimed for the
 * caller. */
#define PROBE_BYTES ((size_t)512 << 10)
#define PROBE_MSGS 16
#define PROBE_TIMED 8
_Static_assert(PROBE_TIMED >= 2 && PROBE_TIMED % 2 == 0 && PROBE_TIMED < PROBE_MSGS,
               "the probe times an even number of gaps after at least one message");

/* What rank 0 puts under <prefix>/link: the rate and the link it came
 * from (the slowest, or the one whose probe failed). */
typedef struct {
  double rate;
  int32_t from, to;
} link_verdict;

/* One end of the probe of the link to (send) or from (!send) rank other:
 * *rate in bytes per microsecond (the receiver's measurement, on both
 * sides). */
static kt_result probe_pair(struct kt_comm_s *c, int other, bool send, double *rate) {
  char *buf = kt__calloc(1, PROBE_BYTES);
  if (!buf) return KT_ERR_NO_MEMORY;
  kt_result r = KT_SUCCESS;
  /* The stream starts when the receiver is in its receives: started
   * before, it would wait in the kernel's buffers (megabytes), and the
   * receiver find it there at the speed of a copy. */
  if (send) {
    r = kt__run(c, KT_COLL_RECV, NULL, buf, 1, KT_UINT8, other);
    for (int i = 0; i < PROBE_MSGS && r == KT_SUCCESS; i++) r = kt__run(c, KT_COLL_SEND, buf, NULL, PROBE_BYTES, KT_UINT8, other);
    double got = -1;
    if (r == KT_SUCCESS) r = kt__run(c, KT_COLL_RECV, NULL, &got, 1, KT_FLOAT64, other);
    if (r == KT_SUCCESS && !(got > 0 && got < 1e12))
      r = kt__err(KT_ERR_PEER_FAILED, "rank %d: rank %d measured the link at %g bytes/us, which is no rate", c->g.rank,
                  other, got);
    if (r == KT_SUCCESS) *rate = got;
  } else {
    int64_t at[PROBE_MSGS], gap[PROBE_TIMED];
    r = kt__run(c, KT_COLL_SEND, buf, NULL, 1, KT_UINT8, other);
    for (int i = 0; i < PROBE_MSGS && r == KT_SUCCESS; i++) {
      r = kt__run(c, KT_COLL_RECV, NULL, buf, PROBE_BYTES, KT_UINT8, other);
      at[i] = kt__now_ns();
    }
    if (r == KT_SUCCESS) {
      /* The median gap between the timed messages' arrivals: a stall of
       * this rank (a receive then finds bytes the kernel queued meanwhile)
       * makes one gap long and the next ones short. */
      for (int k = 0; k < PROBE_TIMED; k++) {
        int64_t g = at[PROBE_MSGS - PROBE_TIMED + k] - at[PROBE_MSGS - PROBE_TIMED + k - 1];
        int j = k;
        for (; j > 0 && gap[j - 1] > g; j--) gap[j] = gap[j - 1];
        gap[j] = g;
      }
      double mid = (double)(gap[PROBE_TIMED / 2 - 1] + gap[PROBE_TIMED / 2]) / 2.0;
      /* A stall before the window leaves queued bytes that make the median
       * gap short but the window as long as the link needs: the slower. */
      double whole = (double)(at[PROBE_MSGS - 1] - at[PROBE_MSGS - PROBE_TIMED - 1]) / PROBE_TIMED;
      *rate = (double)PROBE_BYTES * 1000.0 / KT_MAX(KT_MAX(mid, whole), 1.0);
      r = kt__run(c, KT_COLL_SEND, rate, NULL, 1, KT_FLOAT64, other);
    }
  }
  free(buf);
  kt__fast_reset(c);
  if (r != KT_SUCCESS) {
    kt__error_prefix("measuring the link %s rank %d: ", send ? "to" : "from", other);
    return r;
  }
  return KT_SUCCESS;
}

/* The store key of link i's rate: <prefix>/link/<i>. */
static void link_key(const struct kt_comm_s *c, int i, char *key, size_t cap) {
  snprintf(key, cap, "%s/link/%d", c->g.prefix, i);
}

/* The round of link i of n hosts' ring (above). */
static int link_round(int i, int n) { return n % 2 == 1 && i == n - 1 ? 2 : i % 2; }

/* This leader's (h of n) probes in round order: the link it sends (h) and
 * the one it receives (h - 1), of the nlinks measured. */
static kt_result probe_links(struct kt_comm_s *c, kt_store store, const int *lead, int n, int nlinks, int h,
                             int *failed) {
  int mine[2] = {h, (h + n - 1) % n};
  if (link_round(mine[1], n) < link_round(mine[0], n)) mine[0] = mine[1], mine[1] = h;
  for (int k = 0; k < 2; k++) {
    int i = mine[k];
    if (i >= nlinks) continue;
    bool send = i == h;
    int other = send ? lead[(i + 1) % n] : lead[i];
    double rate = -1;
    KT_INFO("rank %d: measuring the link %s rank %d (%d messages of %zu KiB)", c->g.rank, send ? "to" : "from", other,
            PROBE_MSGS, PROBE_BYTES >> 10);
    kt_result r = probe_pair(c, other, send, &rate);
    if (!send || r != KT_SUCCESS) {
      char key[320];
      link_key(c, i, key, sizeof key);
      if (r != KT_SUCCESS) rate = -1;
      kt_result w = kt_store_set(store, key, &rate, sizeof rate);
      if (r == KT_SUCCESS) r = w;
    }
    if (r != KT_SUCCESS) {
      *failed = i;
      return r;
    }
  }
  return KT_SUCCESS;
}

/* Rank 0: the slowest of the nlinks measured, or the first whose probe
 * failed (then at once: the ends of the others may be gone too). */
static kt_result collect_links(struct kt_comm_s *c, kt_store store, const int *lead, int n, int nlinks,
                               link_verdict *v, double *fastest) {
  for (int i = 0; i < nlinks; i++) {
    char key[320];
    double rate = -1;
    link_key(c, i, key, sizeof key);
    kt_result r = store_get_exact(store, key, &rate, sizeof rate);
    if (r != KT_SUCCESS || !(rate >= 0)) rate = -1;
    if (i == 0 || rate < v->rate) *v = (link_verdict){rate, lead[i], lead[(i + 1) % n]};
    if (rate > *fastest) *fastest = rate;
    if (r != KT_SUCCESS) return r;
    if (rate < 0) return kt__err(KT_ERR_PEER_FAILED, "rank 0: the probe of the link from rank %d to rank %d failed "
                                 "(their logs say why)", lead[i], lead[(i + 1) % n]);
  }
  return KT_SUCCESS;
}

/* Rank 0, whose own probe of link mine failed: a failed probe elsewhere
 * aborts the others' (the failing rank's abort reaches every peer), so the
 * first link away from rank 0 whose failure is already in the store is
 * named instead, if there is one (without waiting). */
static int first_failed_link(struct kt_comm_s *c, kt_store store, int nlinks, int mine) {
  for (int i = 1; i < nlinks - 1; i++) { /* links 0 and nlinks - 1 are rank 0's */
    char key[320];
    const char *keys[1] = {key};
    int ready = 0;
    double rate = 0;
    size_t len = 0;
    link_key(c, i, key, sizeof key);
    if (kt_store_check(store, keys, 1, &ready) == KT_SUCCESS && ready &&
        kt_store_get(store, key, &rate, sizeof rate, &len, 1000) == KT_SUCCESS && len == sizeof rate && rate < 0)
      return i;
  }
  return mine;
}

static kt_result link_probe(struct kt_comm_s *c, kt_store store, const kt__tcp_addr *all) {
  int *lead = kt__calloc(2 * (size_t)c->g.size, sizeof *lead), *hostof = lead + c->g.size;
  if (!lead) return KT_ERR_NO_MEMORY;
  int n = number_hosts(all, c->g.size, hostof);
  for (int j = c->g.size - 1; j >= 0; j--) lead[hostof[j]] = j; /* each host's lowest rank */
  int h = lead[hostof[c->g.rank]] == c->g.rank ? hostof[c->g.rank] : -1;
  kt_result r = KT_SUCCESS;
  if (n < 2) goto done; /* one host: no link */
  int nlinks = n == 2 ? 1 : n; /* two hosts: one link, measured one way */
  char key[320], req_key[320];
  snprintf(key, sizeof key, "%s/link", c->g.prefix);
  snprintf(req_key, sizeof req_key, "%s/linkreq", c->g.prefix);
  int64_t mbits = KT_MAX(kt__param_LINK_MBITS(), (int64_t)-1);
  link_verdict v = {-1, 0, lead[1]};
  double fastest = -1;
  if (c->g.rank == 0) KT_CHECK_GOTO(kt_store_set(store, req_key, &mbits, sizeof mbits), r, done);
  else if (h >= 0) KT_CHECK_GOTO(store_get_exact(store, req_key, &mbits, sizeof mbits), r, done);
  int64_t t0 = kt__now_ns();
  if (mbits >= 0) v.rate = (double)mbits / 8.0; /* 1 Mbit/s: 0.125 bytes per microsecond */
  else if (h >= 0) {
    int failed = 0;
    r = probe_links(c, store, lead, n, nlinks, h, &failed);
    if (r != KT_SUCCESS && c->g.rank == 0) failed = first_failed_link(c, store, nlinks, failed);
    v.from = lead[failed], v.to = lead[(failed + 1) % n];
  }
  if (c->g.rank == 0) {
    if (mbits < 0 && r == KT_SUCCESS) r = collect_links(c, store, lead, n, nlinks, &v, &fastest);
    if (r != KT_SUCCESS) v.rate = -1; /* the others learn it at once instead of waiting */
    kt_result w = kt_store_set(store, key, &v, sizeof v);
    if (r == KT_SUCCESS) r = w;
  }
  if (r != KT_SUCCESS) goto done;
  KT_CHECK_GOTO(store_get_exact(store, key, &v, sizeof v), r, done);
  if (!(v.rate >= 0)) {
    r = kt__err(KT_ERR_PEER_FAILED, "rank 0 could not measure the links between hosts (the link from rank %d to rank %d: "
                "their logs say why)", (int)v.from, (int)v.to);
    goto done;
  }
  c->g.link_bpus = v.rate;
  if (c->g.cross) c->g.cross->link_bpus = v.rate;
  c->g.algos_run = 0; /* the caller's first ops still log their algorithms */
  if (c->g.rank == 0 && mbits >= 0)
    KT_INFO("rank 0: links between hosts taken as %lld Mbit/s (KAITIAN_LINK_MBITS)%s", (long long)mbits,
            mbits ? "" : ": not modelled");
  else if (c->g.rank == 0) {
    char among[128] = "";
    if (nlinks > 1)
      snprintf(among, sizeof among, ", the slowest of the %d between the hosts' first ranks, the fastest %.0f Mbit/s",
               nlinks, fastest * 8.0);
    KT_INFO("rank 0: links between hosts measured at %.0f Mbit/s (rank %d to rank %d%s; the last %d of %d messages of "
            "%zu KiB; %.0f ms)", v.rate * 8.0, (int)v.from, (int)v.to, among, PROBE_TIMED, PROBE_MSGS,
            PROBE_BYTES >> 10, (double)(kt__now_ns() - t0) / 1e6);
  }
done:
  free(lead);
  return r;
}

kt_result kt_comm_init(kt_comm *comm, int rank, int size, kt_store store, const kt_config *config) {
  kt__log_init();
  kt__clear_error();
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_init: comm is NULL", rank);
  if (size < 1 || rank < 0 || rank >= size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_init: rank must be in [0, size) and size >= 1 (size %d)",
                   rank, size);
  if (!store && size > 1)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_init: store is NULL", rank);
  if (config && config->struct_size != sizeof(kt_config))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_init: config->struct_size is %zu, expected %zu (use KT_CONFIG_INIT)",
                   rank, config->struct_size, sizeof(kt_config));
  const char *prefix = config && config->prefix && config->prefix[0] ? config->prefix : "kt";
  if (strlen(prefix) > 128)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_init: prefix longer than 128 characters", rank);

  struct kt_comm_s *c = NULL;
  KT_CHECK(comm_alloc(rank, size, config ? config->timeout_ms : 0, prefix, &c));
  kt__log_set_rank(rank);
  kt_result res = connect_through_store(c, store);
  if (res != KT_SUCCESS) {
    kt__error_prefix("rank %d: kt_comm_init: ", rank);
    /* Peers still setting up (waiting for a segment this rank will never
     * map, say) learn why at once, on their control sockets. */
    char msg[sizeof c->broken_msg];
    kt__error_copy(msg, sizeof msg);
    atomic_store(&c->broken, (int)res);
    kt__tcp_broadcast_abort(&c->g, res, msg);
    comm_free(c);
    return res;
  }
  KT_INFO("rank %d/%d: communicator '%s' ready (tcp, timeout %lld ms)", rank, size, c->g.prefix,
          (long long)c->g.timeout_ms);
  *comm = c;
  return KT_SUCCESS;
}

/* Listen, publish our address under <prefix>/tcp/<rank>, read everyone's,
 * connect the mesh. */
static kt_result connect_through_store(struct kt_comm_s *c, kt_store store) {
  kt_result res = KT_SUCCESS;
  kt__tcp_addr me, *all = NULL;
  int lfd = -1;
  char key[320];
  KT_CHECK(kt__tcp_listen(c->g.rank, c->g.size, 1, &me, &lfd));
  me.shm_owed = kt__shm_owed();
  KT_CHECK(kt__tcp_create(&c->g, lfd)); /* owns lfd from here */
  all = kt__calloc((size_t)c->g.size, sizeof *all); /* freed at exit */
  if (!all) return KT_ERR_NO_MEMORY;
  all[c->g.rank] = me;
  if (c->g.size > 1) {
    snprintf(key, sizeof key, "%s/tcp/%d", c->g.prefix, c->g.rank);
    KT_CHECK_GOTO(kt_store_set(store, key, &me, sizeof me), res, exit);
    for (int j = 0; j < c->g.size; j++) {
      if (j == c->g.rank) continue;
      snprintf(key, sizeof key, "%s/tcp/%d", c->g.prefix, j);
      KT_CHECK_GOTO(store_get_exact(store, key, &all[j], sizeof all[j]), res, exit);
    }
  }
  KT_CHECK_GOTO(kt__tcp_mesh(&c->g, all), res, exit);
  KT_CHECK_GOTO(setup_transports(c, all), res, exit);
  if (c->g.size > 1 && !c->g.all_local) KT_CHECK_GOTO(link_probe(c, store, all), res, exit);
exit:
  free(all);
  return res;
}

/* The job from the environment. Where no launcher serves the store (srun,
 * mpirun), rank 0 serves it until every rank has its communicator: the
 * barrier at the end, after which nobody reads the store again. */
kt_result kt_comm_init_env(kt_comm *comm) {
  kt__log_init();
  kt__clear_error();
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_comm_init_env: comm is NULL");
  *comm = NULL;
  kt_job job;
  kt_result r = kt__job_from_env(&job, KT_JOB_SRC_ALL);
  if (r != KT_SUCCESS) {
    kt__error_prefix("kt_comm_init_env: ");
    return r;
  }
  kt_store store = NULL;
  kt_store_server server = NULL;
  if (job.size > 1) {
    char secret[KT_STORE_MAX_SECRET + 1];
    KT_CHECK(kt__job_secret(&job, secret, sizeof secret));
    const char *host = job.store_host;
    if (job.serve_store && job.rank == 0) {
      r = kt_store_server_start(kt__store_listen_host(host), job.store_port, secret, &server);
      if (r != KT_SUCCESS) {
        kt__error_prefix("rank 0: cannot serve the rendezvous store at %s:%d (from %s; set MASTER_PORT to a free "
                         "port): ", host, job.store_port, job.source);
        goto exit;
      }
      host = kt__store_self_host(host); /* our own store */
    }
    KT_INFO("rank %d: job of %d ranks from %s%s%s, store at %s:%d%s", job.rank, job.size, job.source,
            job.job_id[0] ? " " : "", job.job_id, job.store_host, job.store_port,
            job.serve_store ? (job.rank == 0 ? " (served by this rank)" : " (served by rank 0)") : "");
    r = kt_store_tcp_connect(host, job.store_port, secret, kt__param_CONNECT_TIMEOUT(), &store);
    volatile char *p = secret; /* do not leave the secret on the stack */
    for (size_t i = 0; i < sizeof secret; i++) p[i] = 0;
    if (r != KT_SUCCESS) {
      kt__error_prefix("rank %d: ", job.rank);
      goto exit;
    }
  }
  r = kt_comm_init(comm, job.rank, job.size, store, NULL);
  if (store) kt_store_free(store);
  store = NULL;
  if (r == KT_SUCCESS && job.serve_store && job.size > 1) {
    r = kt__run(*comm, KT_COLL_BARRIER, NULL, NULL, 0, KT_UINT8, 0);
    if (r != KT_SUCCESS) {
      kt_comm_destroy(*comm);
      *comm = NULL;
    }
  }
exit:
  if (store) kt_store_free(store);
  if (server) kt_store_server_stop(server);
  return r;
}

static int cmp_split(const void *a, const void *b) {
  const kt__split_rec *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

kt_result kt__split_members(kt__split_rec *recs, int size, int me, int color, int *n_out, int *newrank_out) {
  /* Every rank's record sits at its rank (an allgather); one that claims
   * another rank, or a color no rank can pass, is not a rank's own. */
  for (int i = 0; i < size; i++) {
    if (recs[i].rank != i)
      return kt__err(KT_ERR_MISMATCH, "the split record of rank %d claims rank %d", i, (int)recs[i].rank);
    if (recs[i].color < 0 && recs[i].color != KT_SPLIT_NOCOLOR)
      return kt__err(KT_ERR_MISMATCH, "the split record of rank %d has color %d (negative, not KT_SPLIT_NOCOLOR)", i,
                     (int)recs[i].color);
  }
  int n = 0;
  for (int i = 0; i < size; i++)
    if (recs[i].color == color) recs[n++] = recs[i];
  qsort(recs, (size_t)n, sizeof *recs, cmp_split);
  int newrank = -1;
  for (int i = 0; i < n; i++)
    if (recs[i].rank == me) newrank = i;
  if (newrank < 0) /* not reached: this rank's own record is at `me` */
    return kt__err(KT_ERR_INTERNAL, "rank %d is not among the split records of its color %d", me, color);
  *n_out = n;
  *newrank_out = newrank;
  return KT_SUCCESS;
}

kt_result kt_comm_split(kt_comm comm, int color, int key, kt_comm *newcomm) {
  return comm_split(comm, color, key, 1, newcomm);
}

/* kt_comm_split; the new communicator's connections between hosts are
 * KAITIAN_NSOCKS / share (at least one). */
static kt_result comm_split(kt_comm comm, int color, int key, int share, kt_comm *newcomm) {
  kt__clear_error();
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_split: comm is NULL");
  if (!newcomm)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_split: newcomm is NULL", comm->g.rank);
  if (color < 0 && color != KT_SPLIT_NOCOLOR)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_split: color %d is negative (use KT_SPLIT_NOCOLOR)",
                   comm->g.rank, color);
  *newcomm = NULL;
  kt_result res = KT_SUCCESS;
  kt__split_rec *recs = kt__calloc((size_t)comm->g.size, sizeof *recs); /* freed at exit */
  if (!recs) return KT_ERR_NO_MEMORY;
  kt__split_rec mine;
  memset(&mine, 0, sizeof mine);
  mine.color = color;
  mine.key = key;
  mine.rank = comm->g.rank;
  int lfd = -1;
  struct kt_comm_s *c = NULL;
  if (color != KT_SPLIT_NOCOLOR) {
    KT_CHECK_GOTO(kt__tcp_listen(comm->g.rank, comm->g.size, share, &mine.addr, &lfd), res, exit);
    mine.addr.shm_owed = kt__shm_owed();
  }
  /* Everyone takes part in the exchange, including ranks without a color. */
  KT_CHECK_GOTO(kt__run(comm, KT_COLL_ALLGATHER, &mine, recs, sizeof mine, KT_UINT8, 0), res, exit);
  uint64_t seq = ++comm->split_seq;
  if (color == KT_SPLIT_NOCOLOR) goto exit;
  int n = 0, newrank = 0;
  KT_CHECK_GOTO(kt__split_members(recs, comm->g.size, comm->g.rank, color, &n, &newrank), res, exit);
  char prefix[sizeof comm->g.prefix];
  snprintf(prefix, sizeof prefix, "%.200s/s%llu.%d", comm->g.prefix, (unsigned long long)seq, color);
  KT_CHECK_GOTO(comm_alloc(newrank, n, comm->g.timeout_ms, prefix, &c), res, exit);
  c->g.link_bpus = comm->g.link_bpus;
  res = kt__tcp_create(&c->g, lfd);
  lfd = -1; /* owned by c->tcp now, or closed */
  if (res != KT_SUCCESS) goto exit;
  kt__tcp_addr *addrs = (kt__tcp_addr *)recs; /* compact in place: addr fits in a rec */
  for (int i = 0; i < n; i++) memmove(&addrs[i], &recs[i].addr, sizeof addrs[i]);
  KT_CHECK_GOTO(kt__tcp_mesh(&c->g, addrs), res, exit);
  KT_CHECK_GOTO(setup_transports(c, addrs), res, exit);
  *newcomm = c;
  c = NULL;
exit:
  if (lfd >= 0) close(lfd);
  if (res != KT_SUCCESS) kt__error_prefix("rank %d: kt_comm_split: ", comm->g.rank);
  if (c) {
    /* As in kt_comm_init: peers still setting up learn why at once. */
    char msg[sizeof c->broken_msg];
    kt__error_copy(msg, sizeof msg);
    atomic_store(&c->broken, (int)res);
    kt__tcp_broadcast_abort(&c->g, res, msg);
    comm_free(c);
  }
  free(recs);
  return res;
}

kt_result kt_comm_abort(kt_comm comm) {
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_abort: comm is NULL");
  atomic_store(&comm->g.aborted, 1);
  uint64_t one = 1;
  ssize_t w = write(comm->g.abort_fd, &one, sizeof one);
  (void)w;
  pthread_mutex_lock(&comm->mu);
  if (atomic_load(&comm->broken) == 0) {
    snprintf(comm->broken_msg, sizeof comm->broken_msg, "rank %d: communicator aborted (kt_comm_abort)",
             kt__rank_label(&comm->g, comm->g.rank));
    atomic_store(&comm->broken, (int)KT_ERR_ABORTED);
  }
  char msg[sizeof comm->broken_msg];
  snprintf(msg, sizeof msg, "%s", comm->broken_msg);
  kt_result why = (kt_result)atomic_load(&comm->broken);
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  /* Local peers learn it from the segment at their next wait (remote ones
   * from the abort notice sent when the op fails or at destroy). */
  kt__shm_fail(&comm->g, why, msg);
  if (comm->g.local) kt_comm_abort(kt__comm_of(comm->g.local)); /* wakes a phase of a hierarchical op */
  if (comm->g.cross) kt_comm_abort(kt__comm_of(comm->g.cross));
  return KT_SUCCESS;
}

void kt__comm_stop(struct kt_comm_s *c, kt_result r) {
  /* kt_comm_abort, with this thread's error as the reason: it touches only
   * state and the eventfd (c's sockets belong to the thread running its op,
   * which fails at once); c's peers hear from the parent's abort notice. */
  pthread_mutex_lock(&c->mu);
  if (atomic_load(&c->broken) == 0) {
    kt__error_copy(c->broken_msg, sizeof c->broken_msg);
    atomic_store(&c->broken, (int)r);
  }
  pthread_mutex_unlock(&c->mu);
  kt_comm_abort(c);
}

KT_INTERNAL void kt__progress_stop(struct kt_comm_s *c);

kt_result kt_comm_destroy(kt_comm comm) {
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_destroy: comm is NULL");
  kt__progress_stop(comm); /* waits for issued operations to finish */
  kt_result broken = (kt_result)atomic_load(&comm->broken);
  if (broken != KT_SUCCESS) {
    char why[1100];
    snprintf(why, sizeof why, "%s", comm->broken_msg);
    kt__shm_fail(&comm->g, broken, why);
    kt__tcp_broadcast_abort(&comm->g, broken, why);
  }
  kt__tcp_close(&comm->g, broken == KT_SUCCESS);
  comm_free(comm);
  return KT_SUCCESS;
}

kt_result kt_comm_rank(kt_comm comm, int *rank) {
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_rank: comm is NULL");
  if (!rank) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_rank: rank is NULL", comm->g.rank);
  *rank = comm->g.rank;
  return KT_SUCCESS;
}

kt_result kt_comm_size(kt_comm comm, int *size) {
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_size: comm is NULL");
  if (!size) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_comm_size: size is NULL", comm->g.rank);
  *size = comm->g.size;
  return KT_SUCCESS;
}

kt_result kt_comm_get_error(kt_comm comm) {
  if (!comm) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_comm_get_error: comm is NULL");
  kt_result r = (kt_result)atomic_load(&comm->broken);
  if (r != KT_SUCCESS) {
    pthread_mutex_lock(&comm->mu);
    kt__error_set_text(comm->broken_msg);
    pthread_mutex_unlock(&comm->mu);
  }
  return r;
}
