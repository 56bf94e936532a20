/* test_store.c - tests of the rendezvous store: argument checks of the
 * wrappers, the TCP server and client in-process and across real client
 * processes (this program re-executed in a child role), the job secret, and
 * malformed frames forged on raw sockets. Exits non-zero on any failure. */
#include "store/proto.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;
static const char *self_argv0;

#define FAIL(...)                                            \
  do {                                                       \
    failures++;                                              \
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);     \
    fprintf(stderr, __VA_ARGS__);                            \
    fprintf(stderr, "\n");                                   \
  } while (0)
#define EXPECT(cond, ...)          \
  do {                             \
    if (!(cond)) FAIL(__VA_ARGS__); \
  } while (0)
#define EXPECT_RC(call, want)                                                                       \
  do {                                                                                              \
    kt_result got_ = (call);                                                                        \
    if (got_ != (want))                                                                             \
      FAIL("%s: expected %s, got %s (%s)", #call, kt_strerror(want), kt_strerror(got_), kt_last_error()); \
  } while (0)
#define EXPECT_MSG_HAS(needle)                                                                      \
  EXPECT(strstr(kt_last_error(), (needle)) != NULL, "error text should mention '%s'; got: %s", (needle), \
         kt_last_error())

static const char *SECRET = "s3cret-job-42";

static int64_t now_ms(void) { return kt__now_ns() / 1000000; }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static kt_store connect_or_die(int port, const char *secret) {
  kt_store s = NULL;
  kt_result r = kt_store_tcp_connect("127.0.0.1", port, secret, 5000, &s);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "FATAL: connect to 127.0.0.1:%d: %s (%s)\n", port, kt_strerror(r), kt_last_error());
    exit(2);
  }
  return s;
}

/* ---- child roles (this program re-executed) -------------------------- */

/* adder PORT SECRET KEY N: add 1 to KEY N times; each result must grow. */
static int child_adder(char **a) {
  kt_store s = connect_or_die(atoi(a[0]), a[1]);
  int n = atoi(a[3]);
  int64_t prev = 0;
  for (int i = 0; i < n; i++) {
    int64_t v;
    kt_result r = kt_store_add(s, a[2], 1, &v);
    if (r != KT_SUCCESS || v <= prev) {
      fprintf(stderr, "child adder: add #%d: %s, value %lld after %lld (%s)\n", i, kt_strerror(r),
              (long long)v, (long long)prev, kt_last_error());
      return 1;
    }
    prev = v;
  }
  kt_store_free(s);
  return 0;
}

/* waiter PORT SECRET TIMEOUT_MS MIN_ELAPSED_MS EXPECTED KEY...: wait for the
 * keys, then the first must hold EXPECTED. */
static int child_waiter(char **a, int n) {
  kt_store s = connect_or_die(atoi(a[0]), a[1]);
  int64_t tmo = atoll(a[2]), min_elapsed = atoll(a[3]);
  const char *expected = a[4];
  const char *const *keys = (const char *const *)&a[5];
  size_t nkeys = (size_t)(n - 5);
  int64_t t0 = now_ms();
  kt_result r = kt_store_wait(s, keys, nkeys, tmo);
  int64_t el = now_ms() - t0;
  if (r != KT_SUCCESS) {
    fprintf(stderr, "child waiter: wait: expected success, got %s (%s)\n", kt_strerror(r), kt_last_error());
    return 1;
  }
  if (el < min_elapsed) {
    fprintf(stderr, "child waiter: wait returned after %lld ms, expected >= %lld (keys existed too early?)\n",
            (long long)el, (long long)min_elapsed);
    return 1;
  }
  char buf[256];
  size_t len = 0;
  r = kt_store_get(s, keys[0], buf, sizeof buf, &len, 1000);
  if (r != KT_SUCCESS || len != strlen(expected) || memcmp(buf, expected, len) != 0) {
    fprintf(stderr, "child waiter: get %s: expected '%s', got %s '%.*s'\n", keys[0], expected, kt_strerror(r),
            (int)len, buf);
    return 1;
  }
  kt_store_free(s);
  return 0;
}

/* getter PORT SECRET KEY EXPECTED TIMEOUT_MS: a GET parked until the key appears. */
static int child_getter(char **a) {
  kt_store s = connect_or_die(atoi(a[0]), a[1]);
  char buf[256];
  size_t len = 0;
  kt_result r = kt_store_get(s, a[2], buf, sizeof buf, &len, atoll(a[4]));
  if (r != KT_SUCCESS || len != strlen(a[3]) || memcmp(buf, a[3], len) != 0) {
    fprintf(stderr, "child getter: get %s: expected '%s', got %s len %zu (%s)\n", a[2], a[3], kt_strerror(r), len,
            kt_last_error());
    return 1;
  }
  kt_store_free(s);
  return 0;
}

/* setter PORT SECRET KEY VALUE */
static int child_setter(char **a) {
  kt_store s = connect_or_die(atoi(a[0]), a[1]);
  kt_result r = kt_store_set(s, a[2], a[3], strlen(a[3]));
  if (r != KT_SUCCESS) {
    fprintf(stderr, "child setter: set %s: %s (%s)\n", a[2], kt_strerror(r), kt_last_error());
    return 1;
  }
  kt_store_free(s);
  return 0;
}

static pid_t spawn(const char *role, const char *const *args, int nargs) {
  const char *argv[32];
  int n = 0;
  argv[n++] = self_argv0;
  argv[n++] = "child";
  argv[n++] = role;
  for (int i = 0; i < nargs && n < 31; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(stderr);
  pid_t p = fork();
  if (p == 0) {
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
  }
  if (p < 0) FAIL("fork: %s", strerror(errno));
  return p;
}

/* Exit status of child p, killing it after timeout_ms; -1 when killed. */
static int reap(pid_t p, int timeout_ms) {
  int64_t end = now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t w = waitpid(p, &st, WNOHANG);
    if (w == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (now_ms() > end) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
      return -1;
    }
    sleep_ms(5);
  }
}

/* ---- raw sockets ------------------------------------------------------- */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    FAIL("raw connect to port %d: %s", port, strerror(errno));
    close(fd);
    return -1;
  }
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void raw_send(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      FAIL("raw send of %zu bytes: %s", len, strerror(errno));
      return;
    }
    p += w;
    len -= (size_t)w;
  }
}

static void raw_frame(int fd, uint32_t magic, uint8_t op, uint32_t nkeys, uint32_t klen, uint32_t vlen,
                      const void *payload, size_t plen) {
  kt_proto_hdr h = {magic, KT_PROTO_VERSION, op, 0, nkeys, klen, vlen, 0};
  unsigned char b[KT_PROTO_HDR_SIZE];
  kt_proto_encode(&h, b);
  raw_send(fd, b, sizeof b);
  if (plen) raw_send(fd, payload, plen);
}

/* True when the server closed fd (EOF or reset) within 3 s. */
static bool raw_closed(int fd) {
  char b[256];
  for (;;) {
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r < 0) return false; /* EAGAIN: the 3 s receive timeout */
  }
}

/* Read one reply header from a raw socket; false when none came. */
static bool raw_reply(int fd, kt_proto_hdr *h) {
  unsigned char b[KT_PROTO_HDR_SIZE];
  if (kt__read_full(fd, b, sizeof b) != 0) return false;
  kt_proto_decode(b, h);
  return true;
}

static void raw_hello(int fd, const char *secret) {
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_HELLO, 0, 0, (uint32_t)strlen(secret), secret, strlen(secret));
}

/* ---- tests -------------------------------------------------------------- */

static void test_parse_hostport(void) {
  char host[64];
  int port = 0;
  EXPECT_RC(kt__parse_hostport("node1:29500", host, sizeof host, &port), KT_SUCCESS);
  EXPECT(!strcmp(host, "node1") && port == 29500, "node1:29500 -> expected node1/29500, got %s/%d", host, port);
  EXPECT_RC(kt__parse_hostport("10.0.0.7:1", host, sizeof host, &port), KT_SUCCESS);
  EXPECT(!strcmp(host, "10.0.0.7") && port == 1, "expected 10.0.0.7/1, got %s/%d", host, port);
  EXPECT_RC(kt__parse_hostport("[::1]:65535", host, sizeof host, &port), KT_SUCCESS);
  EXPECT(!strcmp(host, "::1") && port == 65535, "[::1]:65535 -> expected ::1/65535, got %s/%d", host, port);
  const char *bad[] = {"node1", "node1:", ":80", "node1:0", "node1:65536", "node1:12x", "::1:80", "[::1]80",
                       "[::1", "node1:-5", "[]:80"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    kt_result r = kt__parse_hostport(bad[i], host, sizeof host, &port);
    EXPECT(r == KT_ERR_INVALID_ARGUMENT, "parse '%s': expected KT_ERR_INVALID_ARGUMENT, got %s", bad[i],
           kt_strerror(r));
  }
  EXPECT_RC(kt__parse_hostport("averyveryverylonghostname:80", host, 8, &port), KT_ERR_INVALID_ARGUMENT);
}

/* An in-memory ops table that counts calls, to see what the wrappers let
 * through. */
static int fake_calls;
static kt_result fake_set(void *ctx, const char *key, const void *v, size_t len) {
  (void)ctx, (void)key, (void)v, (void)len;
  fake_calls++;
  return KT_SUCCESS;
}
static kt_result fake_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int64_t t) {
  (void)ctx, (void)key, (void)t;
  fake_calls++;
  static const char v[] = "0123456789abcdefghij"; /* 20 bytes */
  *len = 20;
  if (cap < 20) return KT_ERR_TRUNCATED;
  memcpy(buf, v, 20);
  return KT_SUCCESS;
}
static int fake_destroyed;
static void fake_destroy(void *ctx) {
  (void)ctx;
  fake_destroyed++;
}

static void test_wrappers(void) {
  kt_store_ops ops = {0};
  ops.set = fake_set;
  ops.get = fake_get;
  ops.destroy = fake_destroy;
  kt_store s = NULL;
  EXPECT_RC(kt_store_create(NULL, NULL, &s), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_create(&ops, NULL, NULL), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_create(&ops, NULL, &s), KT_SUCCESS);
  ops.set = NULL; /* copied: the store keeps its own */
  fake_calls = 0;
  EXPECT_RC(kt_store_set(s, "k", "v", 1), KT_SUCCESS);
  EXPECT(fake_calls == 1, "set through the table: expected 1 call, got %d", fake_calls);

  char longkey[KT_STORE_MAX_KEY + 2];
  memset(longkey, 'k', sizeof longkey - 1);
  longkey[sizeof longkey - 1] = '\0';
  static char dummy[16];
  fake_calls = 0;
  EXPECT_RC(kt_store_set(NULL, "k", "v", 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_set(s, NULL, "v", 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_set(s, longkey, "v", 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_MSG_HAS("longer than");
  EXPECT_RC(kt_store_set(s, "k", NULL, 3), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_set(s, "k", dummy, (size_t)KT_STORE_MAX_VALUE + 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_MSG_HAS("limit");
  size_t len;
  EXPECT_RC(kt_store_get(s, "k", NULL, 5, &len, 10), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_get(s, "k", dummy, sizeof dummy, NULL, 10), KT_ERR_INVALID_ARGUMENT);
  EXPECT(fake_calls == 0, "invalid calls must not reach the ops table; got %d calls", fake_calls);

  /* NULL slots are reported, not called. */
  int64_t v;
  int ready;
  const char *keys[] = {"a", "b"};
  EXPECT_RC(kt_store_add(s, "k", 1, &v), KT_ERR_UNSUPPORTED);
  EXPECT_MSG_HAS("'add'");
  EXPECT_RC(kt_store_wait(s, keys, 2, 10), KT_ERR_UNSUPPORTED);
  EXPECT_RC(kt_store_check(s, keys, 2, &ready), KT_ERR_UNSUPPORTED);
  EXPECT_RC(kt_store_delete(s, "k"), KT_ERR_UNSUPPORTED);

  /* get_alloc: the 20-byte value fits the first try; the result is exact. */
  void *val = NULL;
  EXPECT_RC(kt__store_get_alloc(s, "k", &val, &len, 10), KT_SUCCESS);
  EXPECT(val && len == 20 && !memcmp(val, "0123456789abcdefghij", 20), "get_alloc: expected 20 bytes, got %zu",
         len);
  free(val);
  /* Truncation is reported with the needed length, nothing copied. */
  char small[8] = "xxxxxxx";
  EXPECT_RC(kt_store_get(s, "k", small, 4, &len, 10), KT_ERR_TRUNCATED);
  EXPECT(len == 20, "truncated get: expected len 20, got %zu", len);

  fake_destroyed = 0;
  kt_store_free(s);
  EXPECT(fake_destroyed == 1, "kt_store_free: expected destroy called once, got %d", fake_destroyed);
  kt_store_free(NULL);
}

static void test_basic(int port) {
  kt_store s = connect_or_die(port, SECRET);
  char buf[64];
  size_t len = 0;
  EXPECT_RC(kt_store_set(s, "a", "hello", 5), KT_SUCCESS);
  EXPECT_RC(kt_store_get(s, "a", buf, sizeof buf, &len, 1000), KT_SUCCESS);
  EXPECT(len == 5 && !memcmp(buf, "hello", 5), "get a: expected 'hello', got '%.*s' (len %zu)", (int)len, buf, len);
  EXPECT_RC(kt_store_set(s, "a", "bye", 3), KT_SUCCESS); /* overwrite */
  EXPECT_RC(kt_store_get(s, "a", buf, sizeof buf, &len, 1000), KT_SUCCESS);
  EXPECT(len == 3 && !memcmp(buf, "bye", 3), "get a after overwrite: expected 'bye', got '%.*s'", (int)len, buf);

  memcpy(buf, "untouched", 10);
  EXPECT_RC(kt_store_get(s, "a", buf, 2, &len, 1000), KT_ERR_TRUNCATED);
  EXPECT(len == 3, "truncated get: expected len 3, got %zu", len);
  EXPECT(!memcmp(buf, "untouched", 10), "truncated get must copy nothing; buffer now '%.9s'", buf);
  /* The connection is still in step after a truncated get. */
  EXPECT_RC(kt_store_get(s, "a", buf, sizeof buf, &len, 1000), KT_SUCCESS);

  EXPECT_RC(kt_store_set(s, "empty", NULL, 0), KT_SUCCESS);
  len = 99;
  EXPECT_RC(kt_store_get(s, "empty", buf, sizeof buf, &len, 1000), KT_SUCCESS);
  EXPECT(len == 0, "empty value: expected len 0, got %zu", len);

  int ready = -1;
  const char *k1[] = {"a", "empty"};
  const char *k2[] = {"a", "nope"};
  EXPECT_RC(kt_store_check(s, k1, 2, &ready), KT_SUCCESS);
  EXPECT(ready == 1, "check a,empty: expected 1, got %d", ready);
  EXPECT_RC(kt_store_check(s, k2, 2, &ready), KT_SUCCESS);
  EXPECT(ready == 0, "check a,nope: expected 0, got %d", ready);

  int64_t v = 0;
  EXPECT_RC(kt_store_add(s, "ctr", 5, &v), KT_SUCCESS);
  EXPECT(v == 5, "add ctr +5: expected 5, got %lld", (long long)v);
  EXPECT_RC(kt_store_add(s, "ctr", -7, &v), KT_SUCCESS);
  EXPECT(v == -2, "add ctr -7: expected -2, got %lld", (long long)v);
  EXPECT_RC(kt_store_get(s, "ctr", buf, sizeof buf, &len, 1000), KT_SUCCESS);
  EXPECT(len == 2 && !memcmp(buf, "-2", 2), "get ctr: expected '-2', got '%.*s'", (int)len, buf);
  EXPECT_RC(kt_store_add(s, "a", 1, &v), KT_ERR_INVALID_ARGUMENT); /* "bye" is not an integer */
  EXPECT_MSG_HAS("not a decimal integer");
  EXPECT_RC(kt_store_set(s, "big", "9223372036854775807", 19), KT_SUCCESS);
  EXPECT_RC(kt_store_add(s, "big", 1, &v), KT_ERR_INVALID_ARGUMENT);
  EXPECT_MSG_HAS("overflow");

  EXPECT_RC(kt_store_delete(s, "a"), KT_SUCCESS);
  EXPECT_RC(kt_store_check(s, k1, 1, &ready), KT_SUCCESS);
  EXPECT(ready == 0, "check a after delete: expected 0, got %d", ready);
  EXPECT_RC(kt_store_delete(s, "a"), KT_SUCCESS); /* missing: fine */
  EXPECT_RC(kt_store_delete(s, "never-existed"), KT_SUCCESS);

  /* A key of exactly the limit works; one byte more is refused client side. */
  char key[KT_STORE_MAX_KEY + 2];
  memset(key, 'q', KT_STORE_MAX_KEY);
  key[KT_STORE_MAX_KEY] = '\0';
  EXPECT_RC(kt_store_set(s, key, "max", 3), KT_SUCCESS);
  EXPECT_RC(kt_store_get(s, key, buf, sizeof buf, &len, 1000), KT_SUCCESS);
  EXPECT(len == 3 && !memcmp(buf, "max", 3), "get of a %d-byte key: expected 'max', got '%.*s'", KT_STORE_MAX_KEY,
         (int)len, buf);
  key[KT_STORE_MAX_KEY] = 'q';
  key[KT_STORE_MAX_KEY + 1] = '\0';
  EXPECT_RC(kt_store_set(s, key, "x", 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_get(s, key, buf, sizeof buf, &len, 10), KT_ERR_INVALID_ARGUMENT);
  const char *wk[] = {"ok", key};
  EXPECT_RC(kt_store_wait(s, wk, 2, 10), KT_ERR_INVALID_ARGUMENT);
  EXPECT_MSG_HAS("keys[1]");
  static char dummy[8];
  EXPECT_RC(kt_store_set(s, "huge", dummy, (size_t)KT_STORE_MAX_VALUE + 1), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_get(s, "ctr", buf, sizeof buf, &len, 1000), KT_SUCCESS); /* still usable */
  kt_store_free(s);
}

typedef struct {
  kt_store s;
  const char **keys;
  size_t nkeys;
  kt_result r;
} wait_arg;

static void *thread_wait(void *p) {
  wait_arg *a = p;
  a->r = kt_store_wait(a->s, a->keys, a->nkeys, 10000);
  return NULL;
}

/* A WAIT on many keys, set from another connection in reverse order, and a
 * negative timeout meaning the default. */
static void test_wait_many(int port) {
  enum { N = 100 };
  static char names[N][16];
  const char *keys[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "many/%d", i);
    keys[i] = names[i];
  }
  kt_store waiter = connect_or_die(port, SECRET), setter = connect_or_die(port, SECRET);
  wait_arg wa = {waiter, keys, N, KT_ERR_INTERNAL};
  pthread_t th;
  pthread_create(&th, NULL, thread_wait, &wa);
  sleep_ms(100);
  for (int i = N - 1; i >= 1; i--) EXPECT_RC(kt_store_set(setter, keys[i], "x", 1), KT_SUCCESS);
  int ready = -1;
  EXPECT_RC(kt_store_check(setter, keys, N, &ready), KT_SUCCESS);
  EXPECT(ready == 0, "check of %d keys with many/0 unset: expected 0, got %d", N, ready);
  sleep_ms(100);
  EXPECT(wa.r == KT_ERR_INTERNAL, "wait for %d keys returned %s before the last key was set", N,
         kt_strerror(wa.r));
  EXPECT_RC(kt_store_set(setter, keys[0], "x", 1), KT_SUCCESS);
  pthread_join(th, NULL);
  EXPECT(wa.r == KT_SUCCESS, "wait for %d keys set in reverse order: expected success, got %s", N,
         kt_strerror(wa.r));
  EXPECT_RC(kt_store_check(setter, keys, N, &ready), KT_SUCCESS);
  EXPECT(ready == 1, "check of %d keys after all were set: expected 1, got %d", N, ready);

  char buf[8];
  size_t len;
  EXPECT_RC(kt_store_get(setter, keys[5], buf, sizeof buf, &len, -1), KT_SUCCESS);
  EXPECT_RC(kt_store_wait(setter, keys, N, -1), KT_SUCCESS);
  kt_store_free(waiter);
  kt_store_free(setter);
}

static void test_big_value(int port) {
  kt_store s = connect_or_die(port, SECRET);
  size_t n = 1u << 20;
  unsigned char *v = malloc(n), *got = malloc(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    v[i] = (unsigned char)(x >> 24);
  }
  EXPECT_RC(kt_store_set(s, "mib", v, n), KT_SUCCESS);
  size_t len = 0;
  memset(got, 0, n);
  EXPECT_RC(kt_store_get(s, "mib", got, n, &len, 5000), KT_SUCCESS);
  EXPECT(len == n, "1 MiB get: expected len %zu, got %zu", n, len);
  for (size_t i = 0; i < n; i++) {
    if (got[i] != v[i]) {
      FAIL("1 MiB get: first difference at byte %zu: expected 0x%02x, got 0x%02x", i, v[i], got[i]);
      break;
    }
  }
  void *a = NULL;
  EXPECT_RC(kt__store_get_alloc(s, "mib", &a, &len, 5000), KT_SUCCESS);
  EXPECT(a && len == n && !memcmp(a, v, n), "get_alloc of 1 MiB: expected exact bytes (len %zu)", len);
  free(a);
  free(v);
  free(got);
  kt_store_free(s);
}

static void test_timeouts(int port) {
  kt_store s = connect_or_die(port, SECRET);
  char buf[16];
  size_t len;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);

  int64_t t0 = now_ms();
  EXPECT_RC(kt_store_get(s, "absent-key", buf, sizeof buf, &len, 300), KT_ERR_TIMEOUT);
  int64_t el = now_ms() - t0;
  EXPECT(el >= 290 && el <= 1500, "get timeout of 300 ms: returned after %lld ms", (long long)el);
  EXPECT_MSG_HAS("absent-key");
  EXPECT_MSG_HAS(addr);

  t0 = now_ms();
  EXPECT_RC(kt_store_get(s, "absent-key", buf, sizeof buf, &len, 0), KT_ERR_TIMEOUT);
  el = now_ms() - t0;
  EXPECT(el <= 500, "get with timeout 0: returned after %lld ms, expected at once", (long long)el);

  EXPECT_RC(kt_store_set(s, "present", "1", 1), KT_SUCCESS);
  const char *keys[] = {"present", "missing-one"};
  t0 = now_ms();
  EXPECT_RC(kt_store_wait(s, keys, 2, 200), KT_ERR_TIMEOUT);
  el = now_ms() - t0;
  EXPECT(el >= 190 && el <= 1500, "wait timeout of 200 ms: returned after %lld ms", (long long)el);
  EXPECT_MSG_HAS("still missing: 'missing-one'");
  EXPECT_MSG_HAS(addr);
  /* The connection stays usable after timeouts. */
  EXPECT_RC(kt_store_wait(s, keys, 1, 200), KT_SUCCESS);
  kt_store_free(s);
}

typedef struct {
  kt_store s;
  int n;
  kt_result r;
} adder_arg;

static void *thread_adder(void *p) {
  adder_arg *a = p;
  a->r = KT_SUCCESS;
  for (int i = 0; i < a->n && a->r == KT_SUCCESS; i++) {
    int64_t v;
    a->r = kt_store_add(a->s, "sum", 1, &v);
  }
  return NULL;
}

static void test_concurrent_add(int port) {
  enum { NPROC = 6, PER_PROC = 200, NTHREAD = 3, PER_THREAD = 150 };
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  char nstr[16];
  snprintf(nstr, sizeof nstr, "%d", PER_PROC);
  const char *args[] = {portstr, SECRET, "sum", nstr};
  pid_t kids[NPROC];
  for (int i = 0; i < NPROC; i++) kids[i] = spawn("adder", args, 4);

  /* Meanwhile, threads of this process share one client. */
  kt_store s = connect_or_die(port, SECRET);
  pthread_t th[NTHREAD];
  adder_arg aa[NTHREAD];
  for (int i = 0; i < NTHREAD; i++) {
    aa[i] = (adder_arg){s, PER_THREAD, KT_SUCCESS};
    pthread_create(&th[i], NULL, thread_adder, &aa[i]);
  }
  for (int i = 0; i < NTHREAD; i++) {
    pthread_join(th[i], NULL);
    EXPECT(aa[i].r == KT_SUCCESS, "thread adder %d: %s", i, kt_strerror(aa[i].r));
  }
  for (int i = 0; i < NPROC; i++) {
    int st = reap(kids[i], 60000);
    EXPECT(st == 0, "adder process %d: exit status %d", i, st);
  }
  int64_t v = -1;
  EXPECT_RC(kt_store_add(s, "sum", 0, &v), KT_SUCCESS);
  int64_t want = (int64_t)NPROC * PER_PROC + (int64_t)NTHREAD * PER_THREAD;
  EXPECT(v == want, "concurrent adds: expected sum %lld, got %lld", (long long)want, (long long)v);
  kt_store_free(s);
}

static void test_wait_across_processes(int port) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  /* A WAIT on two keys and a GET, both parked until others set the keys. */
  const char *wargs[] = {portstr, SECRET, "10000", "250", "value-one", "late1", "late2"};
  pid_t waiter = spawn("waiter", wargs, 7);
  const char *gargs[] = {portstr, SECRET, "late3", "value-three", "10000"};
  pid_t getter = spawn("getter", gargs, 5);
  sleep_ms(400);
  kt_store s = connect_or_die(port, SECRET);
  int ready = -1;
  const char *lk[] = {"late1", "late2", "late3"};
  EXPECT_RC(kt_store_check(s, lk, 3, &ready), KT_SUCCESS);
  EXPECT(ready == 0, "check late keys before anyone set them: expected 0, got %d", ready);
  EXPECT_RC(kt_store_set(s, "late1", "value-one", 9), KT_SUCCESS);
  sleep_ms(50);
  const char *s2[] = {portstr, SECRET, "late2", "value-two"};
  pid_t setter = spawn("setter", s2, 4);
  const char *s3[] = {portstr, SECRET, "late3", "value-three"};
  pid_t setter3 = spawn("setter", s3, 4);
  EXPECT(reap(setter, 20000) == 0, "setter process of late2 failed");
  EXPECT(reap(setter3, 20000) == 0, "setter process of late3 failed");
  int st = reap(waiter, 20000);
  EXPECT(st == 0, "waiter process: expected exit 0 (woken by the later sets), got %d", st);
  st = reap(getter, 20000);
  EXPECT(st == 0, "getter process: expected exit 0 (woken by the later set), got %d", st);
  kt_store_free(s);
}

static void test_secret(int port) {
  kt_store s = NULL;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  int64_t t0 = now_ms();
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", port, "wrong-secret", 5000, &s), KT_ERR_STORE);
  EXPECT_MSG_HAS("rejected the job secret");
  EXPECT_MSG_HAS(addr);
  EXPECT(s == NULL, "a refused connect must not hand out a store");
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", port, NULL, 5000, &s), KT_ERR_STORE);
  EXPECT_MSG_HAS("rejected the job secret");
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", port, "", 5000, &s), KT_ERR_STORE);
  char prefix[64]; /* a prefix of the right secret is still wrong */
  snprintf(prefix, sizeof prefix, "%.5s", SECRET);
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", port, prefix, 5000, &s), KT_ERR_STORE);
  int64_t el = now_ms() - t0;
  EXPECT(el < 3000, "refusals must be final, not retried until the timeout: took %lld ms", (long long)el);
  /* The server keeps serving the right secret. */
  s = connect_or_die(port, SECRET);
  EXPECT_RC(kt_store_set(s, "after-refusals", "ok", 2), KT_SUCCESS);
  kt_store_free(s);
}

static void check_good_client(kt_store good, const char *after) {
  char buf[16];
  size_t len = 0;
  kt_result r = kt_store_get(good, "good-key", buf, sizeof buf, &len, 2000);
  EXPECT(r == KT_SUCCESS && len == 4 && !memcmp(buf, "good", 4),
         "after %s: a good client should still work; got %s (%s)", after, kt_strerror(r), kt_last_error());
}

static void test_malformed(int port) {
  kt_store good = connect_or_die(port, SECRET);
  EXPECT_RC(kt_store_set(good, "good-key", "good", 4), KT_SUCCESS);
  int fd;

  /* The forged frames are right when well formed: HELLO then SET then GET. */
  fd = raw_connect(port);
  kt_proto_hdr h;
  raw_hello(fd, SECRET);
  EXPECT(raw_reply(fd, &h) && h.op == KT_OP_REPLY && h.status == KT_PST_OK, "raw HELLO: expected OK reply");
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_SET, 1, 4, 2, "raw\0hi", 6);
  EXPECT(raw_reply(fd, &h) && h.status == KT_PST_OK, "raw SET: expected OK reply");
  close(fd);

  /* Bad magic. */
  fd = raw_connect(port);
  raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  EXPECT(raw_closed(fd), "garbage (HTTP request): expected the server to close the connection");
  close(fd);
  check_good_client(good, "bad magic");

  /* A silent stranger is dropped once KAITIAN_CONNECT_TIMEOUT (set to 1 s in
   * main) passes without a HELLO. */
  fd = raw_connect(port);
  int64_t t0 = now_ms();
  EXPECT(raw_closed(fd), "no HELLO at all: expected the connection closed after the hello deadline");
  int64_t el = now_ms() - t0;
  EXPECT(el >= 900 && el < 3000, "no HELLO: closed after %lld ms, expected about 1000", (long long)el);
  close(fd);
  check_good_client(good, "a silent stranger");

  /* A HELLO announcing a 4 GiB secret. */
  fd = raw_connect(port);
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_HELLO, 0, 0, 0xfffffff0u, NULL, 0);
  EXPECT(raw_closed(fd), "HELLO with a huge length: expected the connection closed");
  close(fd);
  check_good_client(good, "huge length");

  /* Truncated: the header promises 10 bytes, 3 come, then close. */
  fd = raw_connect(port);
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_HELLO, 0, 0, 10, "abc", 3);
  close(fd);
  sleep_ms(50);
  check_good_client(good, "truncated frame");

  /* A SET without HELLO is refused and sets nothing. */
  fd = raw_connect(port);
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_SET, 1, 8, 1, "nohello\0x", 9);
  EXPECT(raw_closed(fd), "SET before HELLO: expected the connection closed");
  close(fd);
  int ready = -1;
  const char *nk[] = {"nohello"};
  EXPECT_RC(kt_store_check(good, nk, 1, &ready), KT_SUCCESS);
  EXPECT(ready == 0, "SET before HELLO: key must not be set; check gave %d", ready);

  /* After a good HELLO: unknown opcode, oversized value, key section lies. */
  struct {
    const char *name;
    uint8_t op;
    uint32_t nkeys, klen, vlen;
    const char *payload;
    size_t plen;
  } bad[] = {
      {"unknown opcode", 99, 0, 0, 0, NULL, 0},
      {"REPLY opcode from a client", KT_OP_REPLY, 0, 0, 0, NULL, 0},
      {"SET of a value over the limit", KT_OP_SET, 1, 2, KT_STORE_MAX_VALUE + 1, "k", 2},
      {"GET of two keys", KT_OP_GET, 2, 4, 0, "a\0b", 4},
      {"key not NUL-terminated", KT_OP_GET, 1, 3, 0, "abc", 3},
      {"WAIT with fewer keys than announced", KT_OP_WAIT, 3, 4, 0, "a\0bc", 4},
      {"key section over the key limit", KT_OP_GET, 1, KT_STORE_MAX_KEY + 2, 0, NULL, 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fd = raw_connect(port);
    raw_hello(fd, SECRET);
    EXPECT(raw_reply(fd, &h) && h.status == KT_PST_OK, "%s: HELLO should be accepted", bad[i].name);
    raw_frame(fd, KT_PROTO_MAGIC, bad[i].op, bad[i].nkeys, bad[i].klen, bad[i].vlen, bad[i].payload, bad[i].plen);
    EXPECT(raw_closed(fd), "%s: expected the connection closed", bad[i].name);
    close(fd);
    check_good_client(good, bad[i].name);
  }

  /* A wrong protocol version. */
  fd = raw_connect(port);
  {
    kt_proto_hdr hv = {KT_PROTO_MAGIC, KT_PROTO_VERSION + 1, KT_OP_HELLO, 0, 0, 0, 0, 0};
    unsigned char b[KT_PROTO_HDR_SIZE];
    kt_proto_encode(&hv, b);
    raw_send(fd, b, sizeof b);
  }
  EXPECT(raw_closed(fd), "wrong protocol version: expected the connection closed");
  close(fd);

  /* A wrong secret gets DENIED, then the close. */
  fd = raw_connect(port);
  raw_hello(fd, "guess");
  EXPECT(raw_reply(fd, &h) && h.status == KT_PST_DENIED, "raw HELLO with a wrong secret: expected DENIED");
  EXPECT(raw_closed(fd), "wrong secret: expected the connection closed after DENIED");
  close(fd);

  /* A client that vanishes while parked does not disturb the others. */
  fd = raw_connect(port);
  raw_hello(fd, SECRET);
  EXPECT(raw_reply(fd, &h) && h.status == KT_PST_OK, "parked raw client: HELLO should be accepted");
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_GET, 1, 8, 0, "vanish!", 8);
  sleep_ms(50);
  close(fd);
  sleep_ms(50);
  EXPECT_RC(kt_store_set(good, "vanish!", "x", 1), KT_SUCCESS);
  check_good_client(good, "a parked client vanished");

  /* A raw GET is answered when the key appears. */
  fd = raw_connect(port);
  raw_hello(fd, SECRET);
  EXPECT(raw_reply(fd, &h) && h.status == KT_PST_OK, "raw GET: HELLO should be accepted");
  raw_frame(fd, KT_PROTO_MAGIC, KT_OP_GET, 1, 4, 0, "raw", 4);
  char v[3] = {0};
  EXPECT(raw_reply(fd, &h) && h.status == KT_PST_OK && h.vlen == 2 && kt__read_full(fd, v, 2) == 0 &&
             !memcmp(v, "hi", 2),
         "raw GET of 'raw': expected 'hi'");
  close(fd);
  kt_store_free(good);
}

typedef struct {
  kt_store s;
  kt_result r;
  int64_t elapsed_ms;
  char msg[512];
} waiter_arg;

static void *thread_getter(void *p) {
  waiter_arg *a = p;
  char buf[8];
  size_t len;
  int64_t t0 = now_ms();
  a->r = kt_store_get(a->s, "never", buf, sizeof buf, &len, 20000);
  a->elapsed_ms = now_ms() - t0;
  snprintf(a->msg, sizeof a->msg, "%s", kt_last_error());
  return NULL;
}

typedef struct {
  int port;
  kt_store s;
  kt_result r;
} connect_arg;

static void *thread_connect(void *p) {
  connect_arg *a = p;
  a->r = kt_store_tcp_connect("localhost", a->port, NULL, 10000, &a->s);
  return NULL;
}

static void test_server_lifecycle(void) {
  /* A client that starts before its server connects once the server is up. */
  kt_store_server srv = NULL;
  EXPECT_RC(kt_store_server_start("127.0.0.1", 0, NULL, &srv), KT_SUCCESS);
  if (!srv) return;
  int port = kt_store_server_port(srv);
  kt_store_server_stop(srv);
  kt_store s = NULL;
  int64_t t0 = now_ms();
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", port, NULL, 300, &s), KT_ERR_TIMEOUT);
  int64_t el = now_ms() - t0;
  EXPECT(el >= 280 && el < 2000, "connect with nobody listening, 300 ms: returned after %lld ms", (long long)el);
  connect_arg ca = {port, NULL, KT_ERR_INTERNAL};
  pthread_t th;
  pthread_create(&th, NULL, thread_connect, &ca);
  sleep_ms(300);
  srv = NULL;
  EXPECT_RC(kt_store_server_start(NULL, port, NULL, &srv), KT_SUCCESS); /* all interfaces, same port */
  pthread_join(th, NULL);
  EXPECT(ca.r == KT_SUCCESS, "connect before the server starts: expected success after retries, got %s",
         kt_strerror(ca.r));
  if (ca.r == KT_SUCCESS) {
    EXPECT_RC(kt_store_set(ca.s, "k", "v", 1), KT_SUCCESS);
    kt_store_free(ca.s);
  }
  if (!srv) return;

  /* Stopping the server while a client waits: the client gets an error. */
  waiter_arg wa = {connect_or_die(port, NULL), KT_SUCCESS, 0, ""};
  pthread_create(&th, NULL, thread_getter, &wa);
  sleep_ms(300);
  kt_store_server_stop(srv);
  pthread_join(th, NULL);
  EXPECT(wa.r == KT_ERR_STORE, "get while the server stops: expected KT_ERR_STORE, got %s (%s)",
         kt_strerror(wa.r), wa.msg);
  EXPECT(wa.elapsed_ms < 5000, "get while the server stops: took %lld ms", (long long)wa.elapsed_ms);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  EXPECT(strstr(wa.msg, addr) != NULL, "error should name the store %s; got: %s", addr, wa.msg);
  /* Later requests fail fast too (the reconnect finds nobody). */
  t0 = now_ms();
  EXPECT_RC(kt_store_set(wa.s, "k", "v", 1), KT_ERR_STORE);
  EXPECT((now_ms() - t0) < 6000, "set after the server stopped: took %lld ms", (long long)(now_ms() - t0));
  kt_store_free(wa.s);

  EXPECT_RC(kt_store_server_start(NULL, 70000, NULL, &srv), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_server_start(NULL, 0, NULL, NULL), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_tcp_connect("127.0.0.1", 0, NULL, 10, &s), KT_ERR_INVALID_ARGUMENT);
  EXPECT_RC(kt_store_tcp_connect(NULL, 80, NULL, 10, &s), KT_ERR_INVALID_ARGUMENT);
  kt_store_server_stop(NULL);
  EXPECT(kt_store_server_port(NULL) == -1, "kt_store_server_port(NULL): expected -1");
}

int main(int argc, char **argv) {
  self_argv0 = argv[0];
  if (argc >= 3 && !strcmp(argv[1], "child")) {
    const char *role = argv[2];
    char **a = argv + 3;
    int n = argc - 3;
    if (!strcmp(role, "adder") && n == 4) return child_adder(a);
    if (!strcmp(role, "waiter") && n >= 6) return child_waiter(a, n);
    if (!strcmp(role, "getter") && n == 5) return child_getter(a);
    if (!strcmp(role, "setter") && n == 4) return child_setter(a);
    fprintf(stderr, "unknown child role '%s' with %d arguments\n", role, n);
    return 2;
  }
  /* SIGPIPE is left at its default: the library must never raise it. */
  setenv("KAITIAN_CONNECT_TIMEOUT", "1000", 1); /* the server's HELLO deadline */
  test_parse_hostport();
  test_wrappers();

  kt_store_server srv = NULL;
  kt_result r = kt_store_server_start("127.0.0.1", 0, SECRET, &srv);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "FATAL: kt_store_server_start: %s (%s)\n", kt_strerror(r), kt_last_error());
    return 1;
  }
  int port = kt_store_server_port(srv);
  EXPECT(port > 0 && port < 65536, "server port: expected 1..65535, got %d", port);
  test_basic(port);
  test_big_value(port);
  test_wait_many(port);
  test_timeouts(port);
  test_secret(port);
  test_malformed(port);
  test_concurrent_add(port);
  test_wait_across_processes(port);
  kt_store_server_stop(srv);

  test_server_lifecycle();

  if (failures) {
    fprintf(stderr, "test_store: %d check(s) FAILED\n", failures);
    return 1;
  }
  printf("test_store: all checks passed\n");
  return 0;
}
