/* tcp_client.c - client of the KaiTian TCP store: a kt_store whose operations
 * are request/reply exchanges on one connection, serialized by a mutex so that
 * threads may share it. Every wait is bounded by a deadline enforced with poll. */
#include "store.h"

#include "proto.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* How long past a GET/WAIT timeout the client still waits for the server's
 * own TIMEOUT reply before it gives up on the connection. */
#define REPLY_GRACE_MS 2000
/* A broken connection is re-established once per request, within this. */
#define RECONNECT_MS 5000

typedef struct tcp_client {
  pthread_mutex_t mu; /* guards everything below */
  int fd;             /* -1 when broken: the next request reconnects once */
  int port;
  char host[256];
  char addr[300]; /* "host:port" for messages */
  char secret[KT_STORE_MAX_SECRET + 1];
  size_t secret_len;
} tcp_client;

static int64_t resolve_timeout(int64_t timeout_ms) {
  return timeout_ms < 0 ? kt__param_TIMEOUT() : timeout_ms;
}

static int64_t deadline_after(int64_t ms) {
  int64_t now = kt__now_ns();
  if (ms < 0) return now;
  if (ms > (INT64_MAX - now) / 1000000 - 1) return INT64_MAX;
  return now + ms * 1000000;
}

/* ---- socket I/O with deadlines ------------------------------------------ */

/* 0 when fd is ready for ev; -1 with errno = ETIMEDOUT past the deadline. */
static int wait_fd(int fd, short ev, int64_t deadline_ns) {
  for (;;) {
    int64_t now = kt__now_ns();
    if (now >= deadline_ns) {
      errno = ETIMEDOUT;
      return -1;
    }
    int64_t ms = (deadline_ns - now + 999999) / 1000000;
    struct pollfd p = {.fd = fd, .events = ev};
    int rc = poll(&p, 1, (int)KT_MIN(ms, 60000));
    if (rc > 0) return 0;
    if (rc < 0 && errno != EINTR) return -1;
  }
}

/* Send every byte of iov[0..n) (modified in place). -1 with errno on failure. */
static int send_iov(int fd, struct iovec *iov, int n, int64_t deadline_ns) {
  while (n > 0) {
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    KT_SYSCALL_RETRY(w, sendmsg(fd, &m, MSG_NOSIGNAL));
    if (w < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (wait_fd(fd, POLLOUT, deadline_ns) != 0) return -1;
      continue;
    }
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

/* Receive exactly len bytes (buf NULL: discard them). EOF gives ECONNRESET. */
static int recv_full(int fd, void *buf, size_t len, int64_t deadline_ns) {
  char scratch[65536];
  char *p = buf;
  while (len > 0) {
    size_t want = p ? len : KT_MIN(len, sizeof scratch);
    ssize_t r;
    KT_SYSCALL_RETRY(r, recv(fd, p ? p : scratch, want, 0));
    if (r < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (wait_fd(fd, POLLIN, deadline_ns) != 0) return -1;
      continue;
    }
    if (r == 0) {
      errno = ECONNRESET;
      return -1;
    }
    if (p) p += r;
    len -= (size_t)r;
  }
  return 0;
}

static void cl_close(tcp_client *cl) {
  if (cl->fd >= 0) close(cl->fd);
  cl->fd = -1;
}

/* An I/O failure: the stream is out of step, so drop the connection. */
static kt_result io_error(tcp_client *cl, const char *what, int err) {
  cl_close(cl);
  if (err == ETIMEDOUT)
    return kt__err(KT_ERR_TIMEOUT, "store at %s: %s timed out (no reply before the deadline)", cl->addr, what);
  if (err == ECONNRESET || err == EPIPE)
    return kt__err(KT_ERR_STORE, "store at %s: connection closed by the store during %s", cl->addr, what);
  return kt__err(KT_ERR_STORE, "store at %s: connection broke during %s: %s", cl->addr, what, strerror(err));
}

/* ---- frames -------------------------------------------------------------- */

/* Send one request and read the reply's header into *rh (its value is left
 * for the caller). On failure the connection is closed. */
static kt_result exchange(tcp_client *cl, const char *what, uint8_t op, const char *const *keys,
                          size_t nkeys, const void *value, size_t vlen, int64_t arg,
                          int64_t deadline_ns, kt_proto_hdr *rh) {
  size_t klen = 0;
  for (size_t i = 0; i < nkeys; i++) klen += strlen(keys[i]) + 1;
  if (nkeys > KT_PROTO_MAX_KEYS || klen > KT_PROTO_MAX_KEYBYTES)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "store at %s: %s: %zu keys of %zu bytes in all exceed the store's limits (%u keys, %u bytes)",
                   cl->addr, what, nkeys, klen, KT_PROTO_MAX_KEYS, KT_PROTO_MAX_KEYBYTES);
  kt_proto_hdr h = {KT_PROTO_MAGIC, KT_PROTO_VERSION, op, 0, (uint32_t)nkeys, (uint32_t)klen,
                    (uint32_t)vlen, arg};
  unsigned char hdr[KT_PROTO_HDR_SIZE];
  kt_proto_encode(&h, hdr);
  /* One key is sent in place (with its NUL); several are packed. */
  char *packed = NULL; /* freed below */
  struct iovec iov[3];
  int n = 0;
  iov[n++] = (struct iovec){hdr, sizeof hdr};
  if (nkeys == 1) {
    iov[n++] = (struct iovec){(void *)keys[0], klen};
  } else if (nkeys > 1) {
    packed = kt__malloc(klen);
    if (!packed) return KT_ERR_NO_MEMORY;
    char *p = packed;
    for (size_t i = 0; i < nkeys; i++) {
      size_t l = strlen(keys[i]) + 1;
      memcpy(p, keys[i], l);
      p += l;
    }
    iov[n++] = (struct iovec){packed, klen};
  }
  if (vlen) iov[n++] = (struct iovec){(void *)value, vlen};
  int rc = send_iov(cl->fd, iov, n, deadline_ns);
  int err = errno;
  free(packed);
  if (rc != 0) return io_error(cl, what, err);

  unsigned char rbuf[KT_PROTO_HDR_SIZE];
  if (recv_full(cl->fd, rbuf, sizeof rbuf, deadline_ns) != 0) return io_error(cl, what, errno);
  kt_proto_decode(rbuf, rh);
  if (rh->magic != KT_PROTO_MAGIC || rh->version != KT_PROTO_VERSION || rh->op != KT_OP_REPLY ||
      rh->nkeys != 0 || rh->klen != 0 || rh->vlen > KT_STORE_MAX_VALUE) {
    cl_close(cl);
    return kt__err(KT_ERR_STORE,
                   "store at %s: %s: malformed reply (magic 0x%08x, version %u, op %u, %u keys, value %u bytes);"
                   " is this a KaiTian store of the same version?",
                   cl->addr, what, rh->magic, rh->version, rh->op, rh->nkeys, rh->vlen);
  }
  return KT_SUCCESS;
}

/* Read a reply's short text value (a key or a message) into buf. */
static kt_result read_text(tcp_client *cl, const char *what, const kt_proto_hdr *rh, char *buf, size_t cap,
                           int64_t deadline_ns) {
  size_t n = rh->vlen;
  if (n >= cap) {
    cl_close(cl);
    return kt__err(KT_ERR_STORE, "store at %s: %s: reply text of %zu bytes is too long", cl->addr, what, n);
  }
  if (recv_full(cl->fd, buf, n, deadline_ns) != 0) return io_error(cl, what, errno);
  buf[n] = '\0';
  return KT_SUCCESS;
}

/* The reply to a request that returns no value must be OK and empty. */
static kt_result expect_ok(tcp_client *cl, const char *what, const kt_proto_hdr *rh, int64_t deadline_ns) {
  if (rh->status == KT_PST_OK && rh->vlen == 0) return KT_SUCCESS;
  if (rh->status == KT_PST_INVALID) {
    char msg[KT_PROTO_MAX_MSG + 1];
    KT_CHECK(read_text(cl, what, rh, msg, sizeof msg, deadline_ns));
    return kt__err(KT_ERR_INVALID_ARGUMENT, "store at %s refused %s: %s", cl->addr, what, msg);
  }
  cl_close(cl);
  return kt__err(KT_ERR_STORE, "store at %s: %s: unexpected reply (status %u, value %u bytes)", cl->addr, what,
                 rh->status, rh->vlen);
}

/* ---- connection ---------------------------------------------------------- */

/* One TCP connect over every address of the host; the socket is left
 * non-blocking. -1 with *why filled when none answers. */
static int connect_once(tcp_client *cl, int64_t deadline_ns, char *why, size_t whycap) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", cl->port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(cl->host, portstr, &hints, &res);
  if (gai != 0) {
    snprintf(why, whycap, "cannot resolve '%.100s': %s", cl->host, gai_strerror(gai));
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      snprintf(why, whycap, "socket: %s", strerror(errno));
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      socklen_t len = sizeof err;
      if (wait_fd(fd, POLLOUT, deadline_ns) != 0) err = errno;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err != 0) {
      snprintf(why, whycap, "connect: %s", strerror(err));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

/* Present the secret. KT_ERR_STORE with *denied set when refused (not worth
 * retrying). */
static kt_result hello(tcp_client *cl, int64_t deadline_ns, bool *denied) {
  kt_proto_hdr rh = {0};
  *denied = false;
  KT_CHECK(exchange(cl, "hello", KT_OP_HELLO, NULL, 0, cl->secret, cl->secret_len, 0, deadline_ns, &rh));
  if (rh.status == KT_PST_DENIED) {
    cl_close(cl);
    *denied = true;
    return kt__err(KT_ERR_STORE,
                   "store at %s rejected the job secret (the client presented %s; check KAITIAN_JOB_SECRET)",
                   cl->addr, cl->secret_len ? "a different one" : "none");
  }
  return expect_ok(cl, "hello", &rh, deadline_ns);
}

/* Connect and say hello, retrying with backoff until the deadline when retry
 * is set (the server may not be up yet). */
static kt_result cl_connect(tcp_client *cl, int64_t deadline_ns, bool retry, int64_t budget_ms) {
  char why[256] = "no attempt made";
  int64_t backoff_ms = 10;
  int attempts = 0;
  for (;;) {
    attempts++;
    cl->fd = connect_once(cl, deadline_ns, why, sizeof why);
    if (cl->fd >= 0) {
      bool denied;
      kt_result r = hello(cl, deadline_ns, &denied);
      if (r == KT_SUCCESS) return KT_SUCCESS;
      /* A refused secret is final; a connection that broke during hello
       * (server starting or stopping) is worth another try. */
      if (denied || (r != KT_ERR_STORE && r != KT_ERR_TIMEOUT)) return r;
      kt__error_copy(why, sizeof why);
    }
    int64_t now = kt__now_ns();
    if (!retry || now >= deadline_ns) break;
    int64_t sleep_ms = KT_MIN(backoff_ms, (deadline_ns - now) / 1000000 + 1);
    struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    backoff_ms = KT_MIN(backoff_ms * 2, 1000);
  }
  if (retry)
    return kt__err(KT_ERR_TIMEOUT, "could not connect to the store at %s within %lld ms (%d attempts); last error: %s",
                   cl->addr, (long long)budget_ms, attempts, why);
  return kt__err(KT_ERR_STORE, "store at %s: the connection broke earlier and reconnecting failed: %s", cl->addr,
                 why);
}

static kt_result ensure_connected(tcp_client *cl, int64_t deadline_ns) {
  if (cl->fd >= 0) return KT_SUCCESS;
  int64_t d = KT_MIN(deadline_ns, deadline_after(RECONNECT_MS));
  return cl_connect(cl, d, false, RECONNECT_MS);
}

/* ---- operations ---------------------------------------------------------- */

static kt_result check_key(tcp_client *cl, const char *key) {
  if (strnlen(key, KT_STORE_MAX_KEY + 1) > KT_STORE_MAX_KEY)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "store at %s: key " KT_KEYFMT " is longer than %d bytes", cl->addr,
                   KT_KEYARG(key), KT_STORE_MAX_KEY);
  return KT_SUCCESS;
}

/* "keys 'a', 'b' (+3 more)" for messages. */
static void describe_keys(char *buf, size_t cap, const char *const *keys, size_t nkeys) {
  size_t off = (size_t)snprintf(buf, cap, nkeys == 1 ? "key " : "keys ");
  for (size_t i = 0; i < nkeys && i < 3 && off < cap; i++)
    off += (size_t)snprintf(buf + off, cap - off, "%s" KT_KEYFMT, i ? ", " : "", KT_KEYARG(keys[i]));
  if (nkeys > 3 && off < cap) snprintf(buf + off, cap - off, " (+%zu more)", nkeys - 3);
}

static kt_result op_set(void *ctx, const char *key, const void *value, size_t len) {
  tcp_client *cl = ctx;
  KT_CHECK(check_key(cl, key));
  if (len > KT_STORE_MAX_VALUE)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "store at %s: value of key " KT_KEYFMT " is %zu bytes (limit %u)",
                   cl->addr, KT_KEYARG(key), len, KT_STORE_MAX_VALUE);
  char what[128];
  snprintf(what, sizeof what, "set of key " KT_KEYFMT, KT_KEYARG(key));
  int64_t deadline = deadline_after(kt__param_TIMEOUT());
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_SET, &key, 1, value, len, 0, deadline, &rh), r, out);
  r = expect_ok(cl, what, &rh, deadline);
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

/* A parked request ended: the server's TIMEOUT reply names the missing key. */
static kt_result timed_out(tcp_client *cl, const char *what, const kt_proto_hdr *rh, int64_t tmo,
                           int64_t deadline) {
  char missing[KT_STORE_MAX_KEY + 1];
  KT_CHECK(read_text(cl, what, rh, missing, sizeof missing, deadline));
  return kt__err(KT_ERR_TIMEOUT, "store at %s: timed out after %lld ms waiting for %s; still missing: " KT_KEYFMT,
                 cl->addr, (long long)tmo, what, KT_KEYARG(missing));
}

static kt_result op_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int64_t timeout_ms) {
  tcp_client *cl = ctx;
  KT_CHECK(check_key(cl, key));
  int64_t tmo = resolve_timeout(timeout_ms);
  char what[128];
  snprintf(what, sizeof what, "key " KT_KEYFMT, KT_KEYARG(key));
  int64_t deadline = deadline_after(KT_MIN(tmo, INT64_MAX - REPLY_GRACE_MS) + REPLY_GRACE_MS);
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_GET, &key, 1, NULL, 0, tmo, deadline, &rh), r, out);
  if (rh.status == KT_PST_TIMEOUT) {
    r = timed_out(cl, what, &rh, tmo, deadline);
  } else if (rh.status != KT_PST_OK) {
    r = expect_ok(cl, what, &rh, deadline);
  } else {
    *len = rh.vlen;
    bool fits = rh.vlen <= cap;
    if (recv_full(cl->fd, fits ? buf : NULL, rh.vlen, deadline) != 0) r = io_error(cl, what, errno);
    else if (!fits)
      r = kt__err(KT_ERR_TRUNCATED, "store at %s: value of key " KT_KEYFMT " is %u bytes; the buffer holds %zu",
                  cl->addr, KT_KEYARG(key), rh.vlen, cap);
    else r = KT_SUCCESS;
  }
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

static kt_result op_add(void *ctx, const char *key, int64_t delta, int64_t *result) {
  tcp_client *cl = ctx;
  KT_CHECK(check_key(cl, key));
  char what[128];
  snprintf(what, sizeof what, "add on key " KT_KEYFMT, KT_KEYARG(key));
  int64_t deadline = deadline_after(kt__param_TIMEOUT());
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_ADD, &key, 1, NULL, 0, delta, deadline, &rh), r, out);
  r = expect_ok(cl, what, &rh, deadline);
  if (r == KT_SUCCESS) *result = rh.arg;
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

static kt_result op_wait(void *ctx, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
  tcp_client *cl = ctx;
  for (size_t i = 0; i < nkeys; i++) KT_CHECK(check_key(cl, keys[i]));
  int64_t tmo = resolve_timeout(timeout_ms);
  char what[400];
  describe_keys(what, sizeof what, keys, nkeys);
  int64_t deadline = deadline_after(KT_MIN(tmo, INT64_MAX - REPLY_GRACE_MS) + REPLY_GRACE_MS);
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_WAIT, keys, nkeys, NULL, 0, tmo, deadline, &rh), r, out);
  if (rh.status == KT_PST_TIMEOUT) r = timed_out(cl, what, &rh, tmo, deadline);
  else r = expect_ok(cl, what, &rh, deadline);
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

static kt_result op_check(void *ctx, const char *const *keys, size_t nkeys, int *ready) {
  tcp_client *cl = ctx;
  for (size_t i = 0; i < nkeys; i++) KT_CHECK(check_key(cl, keys[i]));
  char what[400] = "check of ";
  describe_keys(what + strlen(what), sizeof what - strlen(what), keys, nkeys);
  int64_t deadline = deadline_after(kt__param_TIMEOUT());
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_CHECK, keys, nkeys, NULL, 0, 0, deadline, &rh), r, out);
  r = expect_ok(cl, what, &rh, deadline);
  if (r == KT_SUCCESS) *ready = rh.arg != 0;
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

static kt_result op_del(void *ctx, const char *key) {
  tcp_client *cl = ctx;
  KT_CHECK(check_key(cl, key));
  char what[128];
  snprintf(what, sizeof what, "delete of key " KT_KEYFMT, KT_KEYARG(key));
  int64_t deadline = deadline_after(kt__param_TIMEOUT());
  kt_proto_hdr rh = {0};
  kt_result r;
  pthread_mutex_lock(&cl->mu);
  KT_CHECK_GOTO(ensure_connected(cl, deadline), r, out);
  KT_CHECK_GOTO(exchange(cl, what, KT_OP_DEL, &key, 1, NULL, 0, 0, deadline, &rh), r, out);
  r = expect_ok(cl, what, &rh, deadline);
out:
  pthread_mutex_unlock(&cl->mu);
  return r;
}

static void op_destroy(void *ctx) {
  tcp_client *cl = ctx;
  cl_close(cl);
  pthread_mutex_destroy(&cl->mu);
  volatile char *p = cl->secret; /* do not leave the secret in freed memory */
  for (size_t i = 0; i < sizeof cl->secret; i++) p[i] = 0;
  free(cl);
}

static const kt_store_ops tcp_ops = {op_set, op_get, op_add, op_wait, op_check, op_del, op_destroy};

kt_result kt_store_tcp_connect(const char *host, int port, const char *secret, int64_t timeout_ms,
                               kt_store *store) {
  if (!store) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_tcp_connect: store (output) is NULL");
  if (!host || !*host) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_tcp_connect: host is NULL or empty");
  if (strlen(host) >= sizeof(((tcp_client *)0)->host))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_tcp_connect: host name '%.64s...' is too long", host);
  if (port < 1 || port > 65535)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_tcp_connect: port %d of host '%s' is not in 1..65535",
                   port, host);
  size_t slen = secret ? strnlen(secret, KT_STORE_MAX_SECRET + 1) : 0;
  if (slen > KT_STORE_MAX_SECRET)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_tcp_connect: the job secret is longer than %d bytes",
                   KT_STORE_MAX_SECRET);
  kt__log_init();
  tcp_client *cl = kt__calloc(1, sizeof *cl); /* freed by op_destroy */
  if (!cl) return KT_ERR_NO_MEMORY;
  pthread_mutex_init(&cl->mu, NULL);
  cl->fd = -1;
  cl->port = port;
  snprintf(cl->host, sizeof cl->host, "%s", host);
  snprintf(cl->addr, sizeof cl->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
  memcpy(cl->secret, secret ? secret : "", slen);
  cl->secret_len = slen;

  int64_t budget = timeout_ms < 0 ? kt__param_CONNECT_TIMEOUT() : timeout_ms;
  kt_result r = cl_connect(cl, deadline_after(budget), true, budget);
  if (r == KT_SUCCESS) r = kt_store_create(&tcp_ops, cl, store);
  if (r != KT_SUCCESS) op_destroy(cl);
  return r;
}
