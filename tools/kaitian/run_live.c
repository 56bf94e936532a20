/* run_live.c - `kaitian run` across nodes: is each node alive? On threads of
 * their own, which nothing else blocks (no store call, no output, no lock
 * the launcher's main thread holds while it waits): every node other than
 * node 0 keeps one TCP connection to node 0's launcher and writes a
 * heartbeat byte on it every KT_RUN_BEAT_MS; node 0's watcher thread reads
 * them. A node is gone when its heartbeat stopped and a second signal says
 * so: its connection closed (its launcher died: the kernel closes it at
 * once), or, after KAITIAN_RUN_LOST_MS without a heartbeat, its host does not
 * answer TCP keep-alive probes either (host or network lost). A node whose
 * heartbeat stopped but whose host answers is slow, not gone: said once,
 * never declared lost. The main thread only reads what the watcher saw
 * (under a mutex held for a few loads and stores). */
#include "tool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define LIVE_MAGIC 0x4b544c56u /* "KTLV" */
#define BEAT 'B'
#define DONE 'D'
#define HELLO_BYTES (4 + 4 + KT_RUN_LIVE_TOKEN)
#define PENDING_MAX 16       /* connections that have not said hello yet */
#define HELLO_WAIT_MS 2000   /* a connection gets this long to say hello */
#define TICK_MS 100          /* the watcher's poll slice */
#define GAP_BUCKET_MS 10     /* gap histogram: buckets of 10 ms ... */
#define GAP_BUCKETS 6000     /* ... up to 60 s, the last one open-ended */

typedef struct live_node {
  int fd;              /* its connection; -1 before its hello and after it ended */
  bool seen;           /* said hello */
  bool done;           /* said it is done: its end is no loss */
  bool closed;         /* its connection ended (EOF, reset) without DONE */
  bool unanswered;     /* keep-alive probes failed: its host does not answer */
  bool reported;       /* kt__run_live_event reported it lost */
  bool slow_said;      /* ... or slow, for this silence */
  int64_t last_ms;     /* its last heartbeat (or hello) */
  char err[64];        /* how the connection ended */
} live_node;

typedef struct pending {
  int fd;
  int64_t since_ms;
  size_t got;
  unsigned char buf[HELLO_BYTES];
  char addr[64];
} pending;

struct kt_run_live {
  bool watcher;        /* node 0; else a beating node */
  int fd;              /* watcher: listening socket; beater: its connection */
  int wake;            /* eventfd: stop (or send DONE) now */
  pthread_t thread;
  bool started;
  atomic_bool stop;
  atomic_bool want_done;
  pthread_mutex_t mu;  /* guards node[], the gap figures and refused */
  int nnodes;
  int64_t lost_ms;
  int64_t start_ms;
  uint8_t token[KT_RUN_LIVE_TOKEN];
  live_node *node;
  pending pend[PENDING_MAX];
  uint64_t *hist;      /* gaps between heartbeats, all nodes */
  uint64_t ngaps;
  int64_t gap_max;
  int gap_max_node;
  int refused;         /* connections closed for a bad hello */
  char refused_addr[128];
  int node_rank;       /* beater */
};

static void set_keepalive(int fd, int64_t lost_ms) {
  /* Probes start after 1 s without data and fail after cnt unanswered, so a
   * silent host is known not to answer within KAITIAN_RUN_LOST_MS. */
  int one = 1, idle = 1, intvl = 1;
  int cnt = (int)KT_MAX((int64_t)1, KT_MIN(lost_ms / 1000 - 2, (int64_t)127));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* ---- the watcher (node 0) ------------------------------------------------ */

static void record_gap(kt_run_live *l, int node, int64_t gap) {
  size_t b = (size_t)KT_MIN(gap / GAP_BUCKET_MS, (int64_t)GAP_BUCKETS - 1);
  l->hist[b]++;
  l->ngaps++;
  if (gap > l->gap_max) {
    l->gap_max = gap;
    l->gap_max_node = node;
  }
}

/* A whole hello in p->buf: adopt the connection for its node, or refuse it. */
static void hello_done(kt_run_live *l, pending *p, int64_t now) {
  uint32_t magic = get_u32(p->buf), node = get_u32(p->buf + 4);
  const char *why = NULL;
  if (magic != LIVE_MAGIC) why = "not a heartbeat hello";
  else if (!kt__equal_ct(p->buf + 8, l->token, KT_RUN_LIVE_TOKEN)) why = "wrong token";
  else if (node == 0 || node >= (uint32_t)l->nnodes) why = "node rank out of range";
  else if (l->node[node].seen) why = "that node is connected already";
  pthread_mutex_lock(&l->mu);
  if (why) {
    l->refused++;
    snprintf(l->refused_addr, sizeof l->refused_addr, "%s (%s)", p->addr, why);
    close(p->fd);
  } else {
    live_node *n = &l->node[node];
    n->fd = p->fd;
    n->seen = true;
    n->last_ms = now;
    set_keepalive(p->fd, l->lost_ms);
  }
  pthread_mutex_unlock(&l->mu);
  p->fd = -1;
}

static void read_pending(kt_run_live *l, pending *p, int64_t now) {
  ssize_t r;
  KT_SYSCALL_RETRY(r, recv(p->fd, p->buf + p->got, sizeof p->buf - p->got, MSG_DONTWAIT));
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (r <= 0) {
    close(p->fd);
    p->fd = -1;
    return;
  }
  p->got += (size_t)r;
  if (p->got == sizeof p->buf) hello_done(l, p, now);
}

static void read_node(kt_run_live *l, int j, int64_t now) {
  live_node *n = &l->node[j];
  unsigned char buf[256];
  ssize_t r;
  KT_SYSCALL_RETRY(r, recv(n->fd, buf, sizeof buf, MSG_DONTWAIT));
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  pthread_mutex_lock(&l->mu);
  if (r > 0) {
    for (ssize_t i = 0; i < r; i++) {
      if (buf[i] == DONE) n->done = true;
      if (!n->done) record_gap(l, j, now - n->last_ms);
      n->last_ms = now;
    }
  } else {
    /* EOF or reset: its launcher is gone (the kernel closed its socket), or
     * it said DONE first. ETIMEDOUT: keep-alive probes went unanswered. */
    int e = r == 0 ? 0 : errno;
    if (e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH) n->unanswered = true;
    else n->closed = true;
    snprintf(n->err, sizeof n->err, "%s", e ? strerror(e) : "end of file");
    close(n->fd);
    n->fd = -1;
  }
  pthread_mutex_unlock(&l->mu);
}

static void accept_one(kt_run_live *l, int64_t now) {
  struct sockaddr_storage from;
  socklen_t fl = sizeof from;
  memset(&from, 0, sizeof from);
  int fd;
  KT_SYSCALL_RETRY(fd, accept4(l->fd, (struct sockaddr *)&from, &fl, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (fd < 0) return;
  pending *p = NULL;
  for (int i = 0; i < PENDING_MAX && !p; i++)
    if (l->pend[i].fd < 0) p = &l->pend[i];
  if (!p) { /* a flood of strangers: the oldest waits its turn no longer */
    p = &l->pend[0];
    for (int i = 1; i < PENDING_MAX; i++)
      if (l->pend[i].since_ms < p->since_ms) p = &l->pend[i];
    close(p->fd);
  }
  p->fd = fd;
  p->since_ms = now;
  p->got = 0;
  kt__format_sockaddr(&from, p->addr, sizeof p->addr);
}

static void *watch_main(void *arg) {
  kt_run_live *l = arg;
  size_t cap = 2 + PENDING_MAX + (size_t)l->nnodes;
  struct pollfd *pfd = calloc(cap, sizeof *pfd);
  int *who = calloc(cap, sizeof *who); /* >= 0: node; -1 - i: pending i */
  if (!pfd || !who) {
    free(pfd);
    free(who);
    return NULL; /* no watching: no node is declared lost */
  }
  while (!atomic_load(&l->stop)) {
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = l->wake, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
    for (int i = 0; i < PENDING_MAX; i++)
      if (l->pend[i].fd >= 0) {
        who[n] = -1 - i;
        pfd[n++] = (struct pollfd){.fd = l->pend[i].fd, .events = POLLIN};
      }
    for (int j = 1; j < l->nnodes; j++)
      if (l->node[j].fd >= 0) {
        who[n] = j;
        pfd[n++] = (struct pollfd){.fd = l->node[j].fd, .events = POLLIN};
      }
    int rc = poll(pfd, n, TICK_MS);
    int64_t now = kt__now_ms();
    if (rc < 0 && errno != EINTR) break;
    for (size_t i = 2; rc > 0 && i < n; i++) {
      if (!pfd[i].revents) continue;
      if (who[i] >= 0) read_node(l, who[i], now);
      else read_pending(l, &l->pend[-1 - who[i]], now);
    }
    if (rc > 0 && pfd[1].revents) accept_one(l, now);
    for (int i = 0; i < PENDING_MAX; i++) {
      pending *p = &l->pend[i];
      if (p->fd >= 0 && now - p->since_ms >= HELLO_WAIT_MS) {
        pthread_mutex_lock(&l->mu);
        l->refused++;
        snprintf(l->refused_addr, sizeof l->refused_addr, "%s (no hello within %d ms)", p->addr, HELLO_WAIT_MS);
        pthread_mutex_unlock(&l->mu);
        close(p->fd);
        p->fd = -1;
      }
    }
  }
  free(pfd);
  free(who);
  return NULL;
}

static kt_run_live *live_alloc(int nnodes, int64_t lost_ms) {
  kt_run_live *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->fd = -1;
  l->wake = -1;
  l->nnodes = nnodes;
  l->lost_ms = lost_ms;
  l->start_ms = kt__now_ms();
  pthread_mutex_init(&l->mu, NULL);
  for (int i = 0; i < PENDING_MAX; i++) l->pend[i].fd = -1;
  return l;
}

kt_result kt__run_live_watch(const char *bind_host, int nnodes, int64_t lost_ms, kt_run_live **out, int *port,
                             char token_hex[2 * KT_RUN_LIVE_TOKEN + 1]) {
  kt_result res = KT_SUCCESS;
  *out = NULL;
  kt_run_live *l = live_alloc(nnodes, lost_ms);
  if (!l) return kt__err(KT_ERR_NO_MEMORY, "out of memory for the heartbeat watcher");
  l->watcher = true;
  l->node = calloc((size_t)nnodes, sizeof *l->node);
  l->hist = calloc(GAP_BUCKETS, sizeof *l->hist);
  if (!l->node || !l->hist) {
    res = kt__err(KT_ERR_NO_MEMORY, "out of memory for the heartbeat watcher");
    goto fail;
  }
  for (int j = 0; j < nnodes; j++) {
    l->node[j].fd = -1;
    l->node[j].last_ms = l->start_ms;
  }
  if (getrandom(l->token, sizeof l->token, 0) != (ssize_t)sizeof l->token) {
    res = kt__err(KT_ERR_SYSTEM, "getrandom for the heartbeat token: %s", strerror(errno));
    goto fail;
  }
  /* Listen where the store listens (every address of its family, or the
   * loopback name given). */
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
  int gai = getaddrinfo(bind_host, "0", &hints, &ai);
  if (gai != 0 || !ai) {
    res = kt__err(KT_ERR_SYSTEM, "heartbeat port: cannot resolve %s: %s", bind_host, gai_strerror(gai));
    goto fail;
  }
  l->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (l->fd >= 0 && ai->ai_family == AF_INET6) {
    int zero = 0;
    setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  if (l->fd < 0 || bind(l->fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(l->fd, 64) != 0 ||
      getsockname(l->fd, (struct sockaddr *)&sa, &sl) != 0) {
    res = kt__err(KT_ERR_SYSTEM, "heartbeat port on %s: %s", bind_host, strerror(errno));
    freeaddrinfo(ai);
    goto fail;
  }
  freeaddrinfo(ai);
  *port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                         : ((struct sockaddr_in *)&sa)->sin_port);
  l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake < 0) {
    res = kt__err(KT_ERR_SYSTEM, "eventfd: %s", strerror(errno));
    goto fail;
  }
  if (pthread_create(&l->thread, NULL, watch_main, l) != 0) {
    res = kt__err(KT_ERR_SYSTEM, "cannot start the heartbeat watcher thread");
    goto fail;
  }
  l->started = true;
  for (size_t i = 0; i < sizeof l->token; i++) sprintf(token_hex + 2 * i, "%02x", l->token[i]);
  *out = l;
  return KT_SUCCESS;
fail:
  kt__run_live_stop(l);
  return res;
}

int kt__run_live_event(kt_run_live *l, int *node, char *why, size_t cap) {
  if (!l || !l->watcher) return 0;
  int64_t now = kt__now_ms();
  int ev = 0;
  pthread_mutex_lock(&l->mu);
  for (int j = 1; j < l->nnodes && !ev; j++) {
    live_node *n = &l->node[j];
    if (n->reported || n->done) continue;
    int64_t silent = now - n->last_ms;
    if (n->closed) {
      ev = 1;
      snprintf(why, cap, "its launcher's connection to node 0 closed (%s) and it is not done: its launcher "
                         "was killed or died", n->err);
    } else if (silent >= l->lost_ms && (n->unanswered || !n->seen)) {
      ev = 1;
      snprintf(why, cap, "it sent no heartbeat for %.1f s (KAITIAN_RUN_LOST_MS=%lld) and %s: its host or "
                         "network is lost", silent / 1000.0, (long long)l->lost_ms,
               n->seen ? "its host does not answer either" : "it never connected to node 0's heartbeat port");
    } else if (silent >= l->lost_ms && !n->slow_said) {
      ev = 2;
      n->slow_said = true;
      snprintf(why, cap, "it has sent no heartbeat for %.1f s (KAITIAN_RUN_LOST_MS=%lld) but its host still "
                         "answers: slow, not gone; waiting", silent / 1000.0, (long long)l->lost_ms);
    } else if (silent < l->lost_ms) {
      n->slow_said = false;
    }
    if (ev) *node = j;
    if (ev == 1) n->reported = true;
  }
  pthread_mutex_unlock(&l->mu);
  return ev;
}

void kt__run_live_gaps(kt_run_live *l, uint64_t *n, int64_t *max_ms, int64_t *p99_ms, int *max_node,
                       int *refused) {
  *n = 0;
  *max_ms = *p99_ms = 0;
  *max_node = -1;
  *refused = 0;
  if (!l || !l->watcher || !l->hist) return;
  pthread_mutex_lock(&l->mu);
  *n = l->ngaps;
  *max_ms = l->gap_max;
  *max_node = l->gap_max_node;
  *refused = l->refused;
  uint64_t want = l->ngaps - l->ngaps / 100, seen = 0; /* the 99th percentile: the bucket's upper end */
  for (size_t b = 0; b < GAP_BUCKETS && l->ngaps; b++) {
    seen += l->hist[b];
    if (seen >= want) {
      *p99_ms = KT_MIN((int64_t)(b + 1) * GAP_BUCKET_MS, l->gap_max);
      break;
    }
  }
  pthread_mutex_unlock(&l->mu);
}

/* ---- the beater (nodes 1..) ---------------------------------------------- */

static void *beat_main(void *arg) {
  kt_run_live *l = arg;
  bool alive = true; /* the connection still works */
  while (!atomic_load(&l->stop)) {
    if (atomic_load(&l->want_done)) {
      if (alive) {
        /* DONE must arrive: wait for room up to a second (node 0 may be
         * slow); the close that follows is then no loss. */
        char d = DONE;
        struct pollfd p = {.fd = l->fd, .events = POLLOUT};
        if (poll(&p, 1, 1000) > 0) {
          ssize_t w = send(l->fd, &d, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
          (void)w;
        }
      }
      break;
    }
    if (alive) {
      char b = BEAT;
      ssize_t w;
      KT_SYSCALL_RETRY(w, send(l->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT));
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) alive = false; /* node 0 gone: the store says so */
    }
    struct pollfd p = {.fd = l->wake, .events = POLLIN};
    int rc = poll(&p, 1, KT_RUN_BEAT_MS);
    if (rc > 0) {
      uint64_t v;
      ssize_t r = read(l->wake, &v, sizeof v);
      (void)r;
    }
  }
  return NULL;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

kt_result kt__run_live_parse(const char *value, int *port, uint8_t token[KT_RUN_LIVE_TOKEN]) {
  /* Exactly "PORT TOKEN": 1-5 decimal digits, one space, 32 hex digits. */
  const char *sp = strchr(value, ' ');
  long p = 0;
  bool ok = sp && sp > value && sp - value <= 5 && strlen(sp + 1) == 2 * KT_RUN_LIVE_TOKEN;
  for (const char *c = value; ok && c < sp; c++) {
    ok = *c >= '0' && *c <= '9';
    p = p * 10 + (*c - '0');
  }
  ok = ok && p >= 1 && p <= 65535;
  for (int i = 0; ok && i < 2 * KT_RUN_LIVE_TOKEN; i++) ok = hexval(sp[1 + i]) >= 0;
  if (!ok)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "node 0 published a heartbeat address that is not 'PORT TOKEN' "
                                            "(PORT 1-65535, one space, TOKEN %d hex digits)", 2 * KT_RUN_LIVE_TOKEN);
  for (int i = 0; i < KT_RUN_LIVE_TOKEN; i++) token[i] = (uint8_t)(hexval(sp[1 + 2 * i]) << 4 | hexval(sp[2 + 2 * i]));
  *port = (int)p;
  return KT_SUCCESS;
}

kt_result kt__run_live_beat(const char *host, const char *value, int node_rank, int64_t timeout_ms,
                            kt_run_live **out) {
  kt_result res = KT_SUCCESS;
  *out = NULL;
  int port = 0;
  kt_run_live *l = live_alloc(0, 0);
  if (!l) return kt__err(KT_ERR_NO_MEMORY, "out of memory for the heartbeat");
  l->node_rank = node_rank;
  KT_CHECK_GOTO(kt__run_live_parse(value, &port, l->token), res, fail);
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  int gai = getaddrinfo(host, ps, &hints, &ai);
  if (gai != 0 || !ai) {
    res = kt__err(KT_ERR_SYSTEM, "cannot resolve %s for node 0's heartbeat port: %s", host, gai_strerror(gai));
    goto fail;
  }
  /* A blocking connect with a deadline: the node cannot join without it. */
  int64_t deadline = kt__now_ms() + timeout_ms;
  int err = 0;
  for (;;) {
    l->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l->fd < 0) break;
    int rc = connect(l->fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd p = {.fd = l->fd, .events = POLLOUT};
      int64_t left = deadline - kt__now_ms();
      if (left > 0 && poll(&p, 1, (int)KT_MIN(left, (int64_t)1000)) > 0) {
        socklen_t el = sizeof err;
        getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        rc = err ? -1 : 0;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) break;
    err = errno;
    close(l->fd);
    l->fd = -1;
    if (kt__now_ms() >= deadline) break;
    usleep(100 * 1000);
  }
  freeaddrinfo(ai);
  if (l->fd < 0) {
    res = kt__err(KT_ERR_TIMEOUT, "node %d cannot connect to node 0's heartbeat port %s:%d within %lld ms: %s",
                  node_rank, host, port, (long long)timeout_ms, strerror(err ? err : ETIMEDOUT));
    goto fail;
  }
  unsigned char hello[HELLO_BYTES];
  put_u32(hello, LIVE_MAGIC);
  put_u32(hello + 4, (uint32_t)node_rank);
  memcpy(hello + 8, l->token, sizeof l->token);
  if (send(l->fd, hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof hello) {
    res = kt__err(KT_ERR_SYSTEM, "node %d: heartbeat hello to node 0: %s", node_rank, strerror(errno));
    goto fail;
  }
  int one = 1;
  setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->wake < 0) {
    res = kt__err(KT_ERR_SYSTEM, "eventfd: %s", strerror(errno));
    goto fail;
  }
  if (pthread_create(&l->thread, NULL, beat_main, l) != 0) {
    res = kt__err(KT_ERR_SYSTEM, "cannot start the heartbeat thread");
    goto fail;
  }
  l->started = true;
  *out = l;
  return KT_SUCCESS;
fail:
  kt__run_live_stop(l);
  return res;
}

void kt__run_live_done(kt_run_live *l) {
  if (!l || l->watcher || !l->started) return;
  atomic_store(&l->want_done, true);
  uint64_t one = 1;
  ssize_t w = write(l->wake, &one, sizeof one);
  (void)w;
  pthread_join(l->thread, NULL);
  l->started = false;
}

void kt__run_live_stop(kt_run_live *l) {
  if (!l) return;
  if (l->started) {
    atomic_store(&l->stop, true);
    uint64_t one = 1;
    ssize_t w = write(l->wake, &one, sizeof one);
    (void)w;
    pthread_join(l->thread, NULL);
  }
  if (l->fd >= 0) close(l->fd);
  if (l->wake >= 0) close(l->wake);
  for (int i = 0; i < PENDING_MAX; i++)
    if (l->pend[i].fd >= 0) close(l->pend[i].fd);
  if (l->node)
    for (int j = 0; j < l->nnodes; j++)
      if (l->node[j].fd >= 0) close(l->node[j].fd);
  pthread_mutex_destroy(&l->mu);
  free(l->node);
  free(l->hist);
  free(l);
}
