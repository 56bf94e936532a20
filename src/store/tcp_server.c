/* tcp_server.c - the KaiTian TCP store server: one background thread running a
 * poll() loop over non-blocking sockets. Keys live in a hash table owned by
 * that thread; a GET or WAIT that cannot be answered yet is parked and
 * answered when its keys appear or its deadline passes. */
#include "store.h"

#include "proto.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- key-value table ---------------------------------------------------- */

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  char *value; /* vlen bytes plus a NUL; owned by the entry */
  size_t vlen;
  char key[];
} entry;

typedef struct table {
  entry **buckets;
  size_t nbuckets; /* a power of two */
  size_t count;
} table;

static uint64_t hash_key(const char *k) { return kt__fnv1a_str(KT_FNV1A_BASIS, k); }

static entry **table_slot(table *t, const char *key, uint64_t h) {
  entry **p = &t->buckets[h & (t->nbuckets - 1)];
  while (*p && ((*p)->hash != h || strcmp((*p)->key, key) != 0)) p = &(*p)->next;
  return p;
}

static entry *table_find(table *t, const char *key) {
  return *table_slot(t, key, hash_key(key));
}

static void table_grow(table *t) {
  size_t n = t->nbuckets * 2;
  entry **b = calloc(n, sizeof *b);
  if (!b) return; /* keep the longer chains; still correct */
  for (size_t i = 0; i < t->nbuckets; i++) {
    for (entry *e = t->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  free(t->buckets);
  t->buckets = b;
  t->nbuckets = n;
}

/* Store a copy of value under key. Returns false when out of memory; then
 * the table is unchanged. */
static bool table_set(table *t, const char *key, const void *value, size_t vlen) {
  char *v = malloc(vlen + 1);
  if (!v) return false;
  memcpy(v, value, vlen);
  v[vlen] = '\0';
  uint64_t h = hash_key(key);
  entry **p = table_slot(t, key, h);
  if (*p) {
    free((*p)->value);
    (*p)->value = v;
    (*p)->vlen = vlen;
    return true;
  }
  size_t klen = strlen(key);
  entry *e = malloc(sizeof *e + klen + 1);
  if (!e) {
    free(v);
    return false;
  }
  memcpy(e->key, key, klen + 1);
  e->hash = h;
  e->value = v;
  e->vlen = vlen;
  e->next = NULL;
  *p = e;
  if (++t->count > t->nbuckets) table_grow(t);
  return true;
}

static void table_del(table *t, const char *key) {
  entry **p = table_slot(t, key, hash_key(key));
  entry *e = *p;
  if (!e) return;
  *p = e->next;
  free(e->value);
  free(e);
  t->count--;
}

static void table_free(table *t) {
  for (size_t i = 0; t->buckets && i < t->nbuckets; i++) {
    for (entry *e = t->buckets[i], *next; e; e = next) {
      next = e->next;
      free(e->value);
      free(e);
    }
  }
  free(t->buckets);
  t->buckets = NULL;
}

/* ---- connections -------------------------------------------------------- */

/* A connection handles one request at a time: it reads a frame, then either
 * writes the reply or parks until it can, then reads the next frame. */
enum conn_state { ST_READ, ST_PARKED, ST_WRITE, ST_DEAD };

typedef struct conn {
  int fd;
  enum conn_state state;
  bool authed;
  bool close_after_write; /* after a DENIED reply */
  char addr[INET6_ADDRSTRLEN + 16];
  int64_t hello_deadline_ns; /* an unauthenticated connection is dropped after it */
  /* The frame being read, or the parked request. */
  unsigned char hdrbuf[KT_PROTO_HDR_SIZE];
  size_t hdr_got;
  kt_proto_hdr hdr;
  char *payload; /* klen + vlen bytes; freed by frame_reset */
  size_t payload_len, payload_got;
  const char **keys; /* nkeys pointers into payload; freed by frame_reset */
  uint32_t cursor;   /* parked: keys[0..cursor) were seen present */
  bool has_deadline;
  int64_t deadline_ns;
  /* The reply being written. */
  unsigned char *out;
  size_t out_len, out_off;
} conn;

struct kt_store_server_s {
  pthread_t thread;
  int listen_fd;
  int wake_fd;
  int port;
  unsigned char secret[KT_STORE_MAX_SECRET]; /* zero-padded */
  size_t secret_len;
  table tab;
  conn **conns;
  size_t nconns, conns_cap;
  struct pollfd *pfds;
  size_t pfds_cap;
  int64_t accept_paused_until_ns; /* after EMFILE, so the loop does not spin */
  int64_t hello_timeout_ns;       /* KAITIAN_CONNECT_TIMEOUT */
};

static void frame_reset(conn *c) {
  free(c->payload);
  free(c->keys);
  c->payload = NULL;
  c->keys = NULL;
  c->payload_len = c->payload_got = 0;
  c->hdr_got = 0;
  c->cursor = 0;
  c->has_deadline = false;
}

/* Mark c dead (its fd is closed by sweep_dead, so the number is not reused
 * while this poll round still refers to it). */
static void conn_drop(conn *c) {
  c->state = ST_DEAD;
  frame_reset(c);
  free(c->out);
  c->out = NULL;
}

#define DROP_WARN(c, ...)                                                                   \
  do {                                                                                      \
    char why_[512];                                                                         \
    snprintf(why_, sizeof why_, __VA_ARGS__);                                               \
    KT_WARN("store server: dropping the connection from %s: %s", (c)->addr, why_);         \
    conn_drop(c);                                                                           \
  } while (0)

/* Send what is pending; on completion go back to reading (or close). */
static void conn_flush(conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n;
    KT_SYSCALL_RETRY(n, send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      KT_INFO("store server: client %s went away while being answered: %s", c->addr,
              strerror(errno));
      conn_drop(c);
      return;
    }
    c->out_off += (size_t)n;
  }
  free(c->out);
  c->out = NULL;
  c->out_len = c->out_off = 0;
  if (c->close_after_write) conn_drop(c);
  else c->state = ST_READ;
}

/* Answer the current request and release it. */
static void conn_reply(conn *c, uint16_t status, int64_t arg, const void *value, size_t vlen) {
  kt_proto_hdr h = {KT_PROTO_MAGIC, KT_PROTO_VERSION, KT_OP_REPLY, status, 0, 0, (uint32_t)vlen, arg};
  unsigned char *out = malloc(KT_PROTO_HDR_SIZE + vlen); /* freed by conn_flush / conn_drop */
  if (!out) {
    DROP_WARN(c, "out of memory for a reply of %zu bytes", vlen);
    return;
  }
  kt_proto_encode(&h, out);
  if (vlen) memcpy(out + KT_PROTO_HDR_SIZE, value, vlen);
  frame_reset(c);
  c->out = out;
  c->out_len = KT_PROTO_HDR_SIZE + vlen;
  c->out_off = 0;
  c->state = ST_WRITE;
  conn_flush(c);
}

static void conn_reply_msg(conn *c, uint16_t status, const char *fmt, ...) KT_PRINTF(3, 4);
static void conn_reply_msg(conn *c, uint16_t status, const char *fmt, ...) {
  char msg[KT_PROTO_MAX_MSG];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  conn_reply(c, status, 0, msg, n < 0 ? 0 : KT_MIN((size_t)n, sizeof msg - 1));
}

/* ---- requests ----------------------------------------------------------- */

/* A parked GET or WAIT: answer it if its keys are all present now. */
static bool try_answer(struct kt_store_server_s *s, conn *c) {
  if (c->hdr.op == KT_OP_GET) {
    entry *e = table_find(&s->tab, c->keys[0]);
    if (!e) return false;
    conn_reply(c, KT_PST_OK, 0, e->value, e->vlen);
    return true;
  }
  while (c->cursor < c->hdr.nkeys && table_find(&s->tab, c->keys[c->cursor])) c->cursor++;
  if (c->cursor < c->hdr.nkeys) return false;
  conn_reply(c, KT_PST_OK, 0, NULL, 0);
  return true;
}

static void park(conn *c) {
  c->state = ST_PARKED;
  c->has_deadline = c->hdr.arg >= 0;
  if (c->has_deadline) {
    int64_t ms = KT_MIN(c->hdr.arg, (int64_t)1 << 40); /* no overflow below */
    c->deadline_ns = kt__now_ns() + ms * 1000000;
  }
}

/* key appeared or changed: answer the parked requests that were waiting on it. */
static void wake_waiters(struct kt_store_server_s *s, const char *key) {
  for (size_t i = 0; i < s->nconns; i++) {
    conn *w = s->conns[i];
    if (w->state == ST_PARKED && strcmp(w->keys[w->cursor], key) == 0) try_answer(s, w);
  }
}

static bool secret_matches(const struct kt_store_server_s *s, const char *given, size_t glen) {
  unsigned char padded[KT_STORE_MAX_SECRET] = {0};
  memcpy(padded, given, glen); /* glen <= KT_STORE_MAX_SECRET, checked with the header */
  unsigned diff = (unsigned)(glen ^ s->secret_len);
  for (size_t i = 0; i < KT_STORE_MAX_SECRET; i++) diff |= (unsigned)(padded[i] ^ s->secret[i]);
  return diff == 0;
}

static void do_add(struct kt_store_server_s *s, conn *c) {
  const char *key = c->keys[0];
  int64_t cur = 0, delta = c->hdr.arg, sum;
  entry *e = table_find(&s->tab, key);
  if (e) {
    char *end = NULL;
    errno = 0;
    long long v = e->vlen > 0 && e->vlen <= 21 ? strtoll(e->value, &end, 10) : 0;
    if (!end || end != e->value + e->vlen || errno != 0) {
      conn_reply_msg(c, KT_PST_INVALID, "add on key " KT_KEYFMT ": its value (%zu bytes) is not a decimal integer",
                     KT_KEYARG(key), e->vlen);
      return;
    }
    cur = v;
  }
  if (__builtin_add_overflow(cur, delta, &sum)) {
    conn_reply_msg(c, KT_PST_INVALID, "add on key " KT_KEYFMT ": %lld + %lld overflows int64",
                   KT_KEYARG(key), (long long)cur, (long long)delta);
    return;
  }
  char text[32];
  int n = snprintf(text, sizeof text, "%lld", (long long)sum);
  if (!table_set(&s->tab, key, text, (size_t)n)) {
    DROP_WARN(c, "out of memory storing key " KT_KEYFMT, KT_KEYARG(key));
    return;
  }
  wake_waiters(s, key); /* before conn_reply, which releases key */
  conn_reply(c, KT_PST_OK, sum, NULL, 0);
}

/* Split the key section into c->keys. False (with why) when malformed. */
static bool parse_keys(conn *c, char *why, size_t whycap) {
  uint32_t nkeys = c->hdr.nkeys;
  if (nkeys == 0) return true;
  c->keys = malloc(nkeys * sizeof *c->keys); /* freed by frame_reset */
  if (!c->keys) {
    snprintf(why, whycap, "out of memory for %u keys", nkeys);
    return false;
  }
  const char *p = c->payload, *end = c->payload + c->hdr.klen;
  for (uint32_t i = 0; i < nkeys; i++) {
    const char *nul = p < end ? memchr(p, '\0', (size_t)(end - p)) : NULL;
    if (!nul) {
      snprintf(why, whycap, "%s frame: key section holds fewer than the %u keys announced",
               kt_proto_op_name(c->hdr.op), nkeys);
      return false;
    }
    if (nul - p > KT_STORE_MAX_KEY) {
      snprintf(why, whycap, "%s frame: key %u is %zu bytes (limit %d)", kt_proto_op_name(c->hdr.op), i,
               (size_t)(nul - p), KT_STORE_MAX_KEY);
      return false;
    }
    c->keys[i] = p;
    p = nul + 1;
  }
  if (p != end) {
    snprintf(why, whycap, "%s frame: %zu stray bytes after the %u keys", kt_proto_op_name(c->hdr.op),
             (size_t)(end - p), nkeys);
    return false;
  }
  return true;
}

static void process_frame(struct kt_store_server_s *s, conn *c) {
  char why[256];
  if (!parse_keys(c, why, sizeof why)) {
    DROP_WARN(c, "%s", why);
    return;
  }
  const char *value = c->payload + c->hdr.klen;
  switch (c->hdr.op) {
    case KT_OP_HELLO:
      if (!secret_matches(s, value, c->hdr.vlen)) {
        KT_WARN("store server: client %s presented a wrong job secret; closing its connection", c->addr);
        c->authed = false;
        c->close_after_write = true;
        conn_reply(c, KT_PST_DENIED, 0, NULL, 0);
        return;
      }
      c->authed = true;
      conn_reply(c, KT_PST_OK, 0, NULL, 0);
      return;
    case KT_OP_SET:
      if (!table_set(&s->tab, c->keys[0], value, c->hdr.vlen)) {
        DROP_WARN(c, "out of memory storing %u bytes under key " KT_KEYFMT, c->hdr.vlen,
                  KT_KEYARG(c->keys[0]));
        return;
      }
      /* Waiters first: conn_reply releases c->keys. */
      wake_waiters(s, c->keys[0]);
      conn_reply(c, KT_PST_OK, 0, NULL, 0);
      return;
    case KT_OP_GET:
    case KT_OP_WAIT:
      if (!try_answer(s, c)) {
        if (c->hdr.arg == 0) conn_reply(c, KT_PST_TIMEOUT, 0, c->keys[c->cursor], strlen(c->keys[c->cursor]));
        else park(c);
      }
      return;
    case KT_OP_ADD:
      do_add(s, c);
      return;
    case KT_OP_CHECK: {
      int64_t ready = 1;
      for (uint32_t i = 0; i < c->hdr.nkeys && ready; i++) ready = table_find(&s->tab, c->keys[i]) != NULL;
      conn_reply(c, KT_PST_OK, ready, NULL, 0);
      return;
    }
    case KT_OP_DEL:
      table_del(&s->tab, c->keys[0]);
      conn_reply(c, KT_PST_OK, 0, NULL, 0);
      return;
    default:
      DROP_WARN(c, "unknown opcode %u", c->hdr.op); /* check_header lets none through */
      return;
  }
}

/* Validate a header before anything of the payload is read or allocated. */
static bool check_header(const conn *c, char *why, size_t cap) {
  const kt_proto_hdr *h = &c->hdr;
  const char *name = kt_proto_op_name(h->op);
  if (h->magic != KT_PROTO_MAGIC) {
    snprintf(why, cap, "bad magic 0x%08x (expected 0x%08x): not a KaiTian store client?", h->magic,
             KT_PROTO_MAGIC);
    return false;
  }
  if (h->version != KT_PROTO_VERSION) {
    snprintf(why, cap, "protocol version %u (this server speaks %u)", h->version, KT_PROTO_VERSION);
    return false;
  }
  if (h->op < KT_OP_HELLO || h->op > KT_OP_DEL) {
    snprintf(why, cap, "unknown opcode %u", h->op);
    return false;
  }
  if (!c->authed && h->op != KT_OP_HELLO) {
    snprintf(why, cap, "%s request before HELLO (no job secret presented)", name);
    return false;
  }
  bool one_key = h->op != KT_OP_HELLO && h->op != KT_OP_WAIT && h->op != KT_OP_CHECK;
  uint32_t max_vlen = h->op == KT_OP_HELLO ? KT_STORE_MAX_SECRET : h->op == KT_OP_SET ? KT_STORE_MAX_VALUE : 0;
  if (h->vlen > max_vlen) {
    snprintf(why, cap, "%s frame carries a %u-byte value (limit %u)", name, h->vlen, max_vlen);
    return false;
  }
  if (h->op == KT_OP_HELLO ? (h->nkeys != 0 || h->klen != 0)
                           : one_key ? h->nkeys != 1 : h->nkeys > KT_PROTO_MAX_KEYS) {
    snprintf(why, cap, "%s frame with %u keys", name, h->nkeys);
    return false;
  }
  uint64_t max_klen = KT_MIN((uint64_t)h->nkeys * (KT_STORE_MAX_KEY + 1), (uint64_t)KT_PROTO_MAX_KEYBYTES);
  if (h->klen < h->nkeys || h->klen > max_klen) {
    snprintf(why, cap, "%s frame: key section of %u bytes for %u keys (allowed %u..%llu)", name, h->klen,
             h->nkeys, h->nkeys, (unsigned long long)max_klen);
    return false;
  }
  return true;
}

/* Read what is available; process complete frames. */
static void conn_on_readable(struct kt_store_server_s *s, conn *c) {
  for (int frames = 0; c->state == ST_READ && frames < 16;) {
    bool in_hdr = c->hdr_got < KT_PROTO_HDR_SIZE;
    void *dst = in_hdr ? (void *)(c->hdrbuf + c->hdr_got) : (void *)(c->payload + c->payload_got);
    size_t want = in_hdr ? KT_PROTO_HDR_SIZE - c->hdr_got : c->payload_len - c->payload_got;
    ssize_t n;
    KT_SYSCALL_RETRY(n, recv(c->fd, dst, want, 0));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      KT_INFO("store server: connection from %s failed: %s", c->addr, strerror(errno));
      conn_drop(c);
      return;
    }
    if (n == 0) {
      if (c->hdr_got == 0) {
        KT_INFO("store server: client %s disconnected", c->addr);
        conn_drop(c);
      } else if (in_hdr) {
        DROP_WARN(c, "truncated frame: connection closed after %zu of %d header bytes", c->hdr_got,
                  KT_PROTO_HDR_SIZE);
      } else {
        DROP_WARN(c, "truncated %s frame: connection closed after %zu of %zu payload bytes",
                  kt_proto_op_name(c->hdr.op), c->payload_got, c->payload_len);
      }
      return;
    }
    if (in_hdr) {
      size_t before = c->hdr_got;
      c->hdr_got += (size_t)n;
      /* Reject a stranger (an HTTP probe, a port scanner) as soon as its
       * first bytes show it, without waiting for a whole header. */
      if (before < 4 && c->hdr_got >= 4) {
        uint32_t m;
        memcpy(&m, c->hdrbuf, 4);
        if (be32toh(m) != KT_PROTO_MAGIC) {
          DROP_WARN(c, "bad magic 0x%08x (expected 0x%08x): not a KaiTian store client?", be32toh(m),
                    KT_PROTO_MAGIC);
          return;
        }
      }
      if (c->hdr_got < KT_PROTO_HDR_SIZE) continue;
      kt_proto_decode(c->hdrbuf, &c->hdr);
      char why[256];
      if (!check_header(c, why, sizeof why)) {
        DROP_WARN(c, "%s", why);
        return;
      }
      c->payload_len = (size_t)c->hdr.klen + c->hdr.vlen;
      c->payload = malloc(c->payload_len + 1); /* freed by frame_reset */
      if (!c->payload) {
        DROP_WARN(c, "out of memory for a %s frame of %zu bytes", kt_proto_op_name(c->hdr.op), c->payload_len);
        return;
      }
    } else {
      c->payload_got += (size_t)n;
    }
    if (c->payload_got == c->payload_len) {
      frames++;
      process_frame(s, c);
    }
  }
}

/* ---- the loop ----------------------------------------------------------- */

static void accept_all(struct kt_store_server_s *s) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    int fd;
    KT_SYSCALL_RETRY(fd, accept4(s->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return;
      KT_WARN("store server on port %d: accept failed: %s; pausing accepts for 100 ms", s->port,
              strerror(errno));
      s->accept_paused_until_ns = kt__now_ns() + 100000000;
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = calloc(1, sizeof *c); /* freed by sweep_dead or server_free */
    if (c && s->nconns == s->conns_cap) {
      size_t ncap = s->conns_cap ? s->conns_cap * 2 : 16;
      conn **nc = realloc(s->conns, ncap * sizeof *nc);
      if (nc) {
        s->conns = nc;
        s->conns_cap = ncap;
      }
    }
    if (!c || s->nconns == s->conns_cap) {
      KT_WARN("store server on port %d: out of memory; refusing a connection", s->port);
      free(c);
      close(fd);
      return;
    }
    c->fd = fd;
    c->state = ST_READ;
    c->hello_deadline_ns = kt__now_ns() + s->hello_timeout_ns;
    char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?";
    getnameinfo((struct sockaddr *)&sa, salen, host, sizeof host, serv, sizeof serv,
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->addr, sizeof c->addr, sa.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
    s->conns[s->nconns++] = c;
    KT_INFO("store server on port %d: connection from %s", s->port, c->addr);
  }
}

/* Answer parked requests whose deadline passed; drop connections that never
 * said HELLO in time (so idle strangers cannot pile up). */
static void expire(struct kt_store_server_s *s, int64_t now) {
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (!c->authed && c->state != ST_DEAD && !c->close_after_write && now >= c->hello_deadline_ns) {
      DROP_WARN(c, "no HELLO within %lld ms of connecting", (long long)(s->hello_timeout_ns / 1000000));
      continue;
    }
    if (c->state == ST_PARKED && c->has_deadline && now >= c->deadline_ns) {
      const char *missing = c->keys[c->cursor];
      conn_reply(c, KT_PST_TIMEOUT, 0, missing, strlen(missing));
    }
  }
}

/* poll() timeout: until the nearest parked deadline, -1 if none. */
static int next_timeout_ms(struct kt_store_server_s *s, int64_t now) {
  int64_t best = -1;
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    int64_t d;
    if (c->state == ST_PARKED && c->has_deadline) d = c->deadline_ns;
    else if (!c->authed) d = c->hello_deadline_ns;
    else continue;
    int64_t ms = d <= now ? 0 : (d - now + 999999) / 1000000;
    if (best < 0 || ms < best) best = ms;
  }
  if (s->accept_paused_until_ns > now) {
    int64_t ms = (s->accept_paused_until_ns - now + 999999) / 1000000;
    if (best < 0 || ms < best) best = ms;
  }
  return best < 0 ? -1 : (int)KT_MIN(best, 3600000);
}

static void conn_free(conn *c) {
  if (c->fd >= 0) close(c->fd);
  frame_reset(c);
  free(c->out);
  free(c);
}

static void sweep_dead(struct kt_store_server_s *s) {
  size_t j = 0;
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i]->state == ST_DEAD) conn_free(s->conns[i]);
    else s->conns[j++] = s->conns[i];
  }
  s->nconns = j;
}

static void *server_main(void *arg) {
  struct kt_store_server_s *s = arg;
  for (;;) {
    size_t npoll = s->nconns;
    if (s->pfds_cap < npoll + 2) {
      struct pollfd *p = realloc(s->pfds, (npoll + 2) * 2 * sizeof *p);
      if (!p) {
        KT_WARN("store server on port %d: out of memory for the poll set; retrying", s->port);
        usleep(10000);
        continue;
      }
      s->pfds = p;
      s->pfds_cap = (npoll + 2) * 2;
    }
    int64_t now = kt__now_ns();
    s->pfds[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    s->pfds[1] = (struct pollfd){.fd = s->accept_paused_until_ns > now ? -1 : s->listen_fd, .events = POLLIN};
    for (size_t i = 0; i < npoll; i++) {
      conn *c = s->conns[i];
      short ev = c->state == ST_READ ? POLLIN : c->state == ST_WRITE ? POLLOUT : POLLRDHUP;
      s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int rc = poll(s->pfds, npoll + 2, next_timeout_ms(s, now));
    if (rc < 0 && errno != EINTR) {
      KT_WARN("store server on port %d: poll failed: %s", s->port, strerror(errno));
      usleep(10000);
      continue;
    }
    if (rc > 0 && s->pfds[0].revents) break; /* kt_store_server_stop */
    if (rc > 0 && (s->pfds[1].revents & POLLIN)) accept_all(s);
    for (size_t i = 0; rc > 0 && i < npoll; i++) {
      conn *c = s->conns[i];
      short re = s->pfds[i + 2].revents;
      if (!re || c->state == ST_DEAD) continue;
      if (re & POLLNVAL) {
        conn_drop(c);
      } else if (c->state == ST_READ && (re & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
        conn_on_readable(s, c);
      } else if (c->state == ST_WRITE && (re & (POLLOUT | POLLHUP | POLLERR))) {
        conn_flush(c);
        if (c->state == ST_READ) conn_on_readable(s, c);
      } else if (c->state == ST_PARKED && (re & (POLLRDHUP | POLLHUP | POLLERR))) {
        KT_INFO("store server: client %s disconnected while waiting for key " KT_KEYFMT, c->addr,
                KT_KEYARG(c->keys[c->cursor]));
        conn_drop(c);
      }
    }
    expire(s, kt__now_ns());
    sweep_dead(s);
  }
  return NULL;
}

/* ---- start / stop ------------------------------------------------------- */

static void server_free(struct kt_store_server_s *s) {
  for (size_t i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
  free(s->conns);
  free(s->pfds);
  table_free(&s->tab);
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->wake_fd >= 0) close(s->wake_fd);
  volatile unsigned char *p = s->secret; /* do not leave the secret in freed memory */
  for (size_t i = 0; i < sizeof s->secret; i++) p[i] = 0;
  free(s);
}

/* Bind and listen; on failure the error names the address. */
static kt_result open_listener(struct kt_store_server_s *s, const char *bind_host, int port) {
  const char *host = (bind_host && *bind_host) ? bind_host : "0.0.0.0";
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int gai = getaddrinfo(host, portstr, &hints, &res);
  if (gai != 0)
    return kt__err(KT_ERR_SYSTEM, "store server: cannot resolve bind address '%s': %s", host,
                   gai_strerror(gai));
  int err = 0;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      s->listen_fd = fd;
      break;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(res);
  if (s->listen_fd < 0)
    return kt__err(KT_ERR_SYSTEM, "store server: cannot listen on %s port %d: %s", host, port, strerror(err));
  struct sockaddr_storage sa;
  socklen_t salen = sizeof sa;
  if (getsockname(s->listen_fd, (struct sockaddr *)&sa, &salen) != 0)
    return kt__err(KT_ERR_SYSTEM, "store server: getsockname: %s", strerror(errno));
  s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                           : ((struct sockaddr_in *)&sa)->sin_port);
  return KT_SUCCESS;
}

kt_result kt_store_server_start(const char *bind_host, int port, const char *secret,
                                kt_store_server *server) {
  if (!server) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_server_start: server (output) is NULL");
  if (port < 0 || port > 65535)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_server_start: port %d is not in 0..65535", port);
  size_t slen = secret ? strnlen(secret, KT_STORE_MAX_SECRET + 1) : 0;
  if (slen > KT_STORE_MAX_SECRET)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_server_start: the job secret is longer than %d bytes",
                   KT_STORE_MAX_SECRET);
  kt__log_init();
  kt_result r = KT_SUCCESS;
  struct kt_store_server_s *s = kt__calloc(1, sizeof *s); /* freed by kt_store_server_stop */
  if (!s) return KT_ERR_NO_MEMORY;
  s->listen_fd = s->wake_fd = -1;
  s->hello_timeout_ns = KT_MIN(KT_MAX(kt__param_CONNECT_TIMEOUT(), 1000), (int64_t)1 << 40) * 1000000;
  memcpy(s->secret, secret ? secret : "", slen);
  s->secret_len = slen;
  s->tab.nbuckets = 64;
  s->tab.buckets = calloc(s->tab.nbuckets, sizeof *s->tab.buckets);
  if (!s->tab.buckets) {
    r = kt__err(KT_ERR_NO_MEMORY, "store server: out of memory");
    goto fail;
  }
  KT_CHECK_GOTO(open_listener(s, bind_host, port), r, fail);
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd < 0) {
    r = kt__err(KT_ERR_SYSTEM, "store server: eventfd: %s", strerror(errno));
    goto fail;
  }
  int e = pthread_create(&s->thread, NULL, server_main, s);
  if (e != 0) {
    r = kt__err(KT_ERR_SYSTEM, "store server: cannot start its thread: %s", strerror(e));
    goto fail;
  }
  KT_INFO("store server listening on %s port %d%s", (bind_host && *bind_host) ? bind_host : "0.0.0.0",
          s->port, slen ? " (job secret required)" : "");
  *server = s;
  return KT_SUCCESS;
fail:
  server_free(s);
  return r;
}

int kt_store_server_port(kt_store_server server) { return server ? server->port : -1; }

void kt_store_server_stop(kt_store_server server) {
  if (!server) return;
  uint64_t one = 1;
  ssize_t w;
  KT_SYSCALL_RETRY(w, write(server->wake_fd, &one, sizeof one));
  (void)w; /* an eventfd write of 1 cannot fail short of a full counter */
  pthread_join(server->thread, NULL);
  server_free(server);
}
