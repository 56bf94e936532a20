/* util.c - small helpers: clock, checked allocation, full reads and writes,
 * the names of dtypes and ops, version and build information. */
#include "common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/membarrier.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/syscall.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <cpuid.h>

/* 1: the CPU has ERMS (fast rep movsb), 0: not, -1: not asked yet. */
static _Atomic int erms = -1;

static int have_erms(void) {
  int e = atomic_load_explicit(&erms, memory_order_relaxed);
  if (e < 0) {
    unsigned a, b, c, d;
    e = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 9)) ? 1 : 0;
    atomic_store_explicit(&erms, e, memory_order_relaxed);
  }
  return e;
}
#endif

void kt__copy_shared(void *dst, const void *src, size_t n) {
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  /* (The sanitizers do not see inside asm: their builds keep memcpy.) */
  if (n >= 256 && have_erms()) {
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
    return;
  }
#endif
  memcpy(dst, src, n);
}

void kt__copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__) && defined(__SSE2__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  char *d = dst;
  const char *s = src;
  size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* each group of 4 stores fills one line */
  if (n >= head + 64) {
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
      __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
      __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
      _mm_stream_si128((__m128i *)d, a);
      _mm_stream_si128((__m128i *)(d + 16), b);
      _mm_stream_si128((__m128i *)(d + 32), c);
      _mm_stream_si128((__m128i *)(d + 48), e);
    }
  }
  memcpy(d, s, n);
#else
  memcpy(dst, src, n);
#endif
}

void kt__stream_fence(void) {
#if defined(__x86_64__) && defined(__SSE2__)
  _mm_sfence();
#endif
}

static _Atomic int64_t stream_min = -2; /* -2: not resolved yet */

size_t kt__stream_min_bytes(void) {
  int64_t v = atomic_load_explicit(&stream_min, memory_order_relaxed);
  if (v == -2) {
    v = kt__param_SHM_STREAM_BYTES();
    if (v < 0) {
      long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
      llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
      if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
      v = llc > 0 ? (int64_t)llc / 4 * 3 : (int64_t)8 << 20;
    }
    atomic_store_explicit(&stream_min, v, memory_order_relaxed);
  }
  return (size_t)v;
}

static bool heavy_ok;
static pthread_once_t heavy_once = PTHREAD_ONCE_INIT;

static void heavy_init(void) {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  long need = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
  heavy_ok = cmds >= 0 && (cmds & need) == need &&
             syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  if (!heavy_ok) KT_INFO("membarrier(GLOBAL_EXPEDITED) unavailable: the per-op handshakes fence themselves");
}

bool kt__heavy_fence_ok(void) {
  pthread_once(&heavy_once, heavy_init);
  return heavy_ok;
}

bool kt__heavy_fence(void) {
  /* Registered, it can still fail where the kernel allocates a CPU mask
   * (ENOMEM): the caller decides what that costs. */
  return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

static _Atomic int64_t coarse_res = -1; /* CLOCK_MONOTONIC_COARSE's resolution, ns */

int64_t kt__now_coarse_ns(void) {
  int64_t res = atomic_load_explicit(&coarse_res, memory_order_relaxed);
  if (res < 0) {
    struct timespec r;
    res = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0 ? (int64_t)r.tv_sec * 1000000000 + r.tv_nsec : 0;
    atomic_store_explicit(&coarse_res, res, memory_order_relaxed);
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  /* The coarse clock lags the fine one by up to a tick: rounded up, a
   * deadline made from it never comes early by kt__now_ns. */
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + res;
}

int64_t kt__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void *kt__malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) kt__err(KT_ERR_NO_MEMORY, "cannot allocate %zu bytes", n);
  return p;
}

void *kt__calloc(size_t n, size_t s) {
  void *p = calloc(n ? n : 1, s ? s : 1);
  if (!p) kt__err(KT_ERR_NO_MEMORY, "cannot allocate %zu x %zu bytes", n, s);
  return p;
}

int kt__write_full(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w;
    KT_SYSCALL_RETRY(w, write(fd, p, len));
    if (w < 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

int kt__read_full(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len > 0) {
    ssize_t r;
    KT_SYSCALL_RETRY(r, read(fd, p, len));
    if (r < 0) return -1;
    if (r == 0) {
      errno = ECONNRESET;
      return -1;
    }
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

const size_t kt__dtype_sizes[KT_NUM_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8, 1};
static const char *const dtype_names[KT_NUM_DTYPES] = {
    "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"};
static const char *const op_names[KT_NUM_OPS] = {"sum", "prod", "min", "max",
                                                 "avg", "band", "bor", "bxor"};

#undef kt_dtype_size
size_t kt_dtype_size(kt_dtype d) { return kt__dtype_size(d); }
const char *kt_dtype_name(kt_dtype d) { return (unsigned)d < KT_NUM_DTYPES ? dtype_names[d] : "unknown"; }
const char *kt_op_name(kt_op o) { return (unsigned)o < KT_NUM_OPS ? op_names[o] : "unknown"; }

#define KT_STR2(x) #x
#define KT_STR(x) KT_STR2(x)
const char *kt_version_string(void) {
  return KT_STR(KT_VERSION_MAJOR) "." KT_STR(KT_VERSION_MINOR) "." KT_STR(KT_VERSION_PATCH);
}

void kt_version(int *major, int *minor, int *patch) {
  if (major) *major = KT_VERSION_MAJOR;
  if (minor) *minor = KT_VERSION_MINOR;
  if (patch) *patch = KT_VERSION_PATCH;
}

#ifndef KT_BUILD_INFO
#define KT_BUILD_INFO "unknown build"
#endif
const char *kt_build_info(void) { return KT_BUILD_INFO; }

bool kt__equal_ct(const void *a, const void *b, size_t n) {
  const uint8_t *x = a, *y = b;
  volatile uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= (uint8_t)(x[i] ^ y[i]);
  return d == 0;
}

void kt__format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    port = ntohs(a->sin_port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    port = ntohs(a->sin6_port);
  }
  snprintf(buf, cap, "%s:%d", ip, port);
}
