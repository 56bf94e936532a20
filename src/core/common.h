/* common.h - internal helpers shared by every module: error propagation,
 * logging, time, parameters. Not installed. */
#ifndef KT_COMMON_H
#define KT_COMMON_H

#include "kaitian.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KT_INTERNAL __attribute__((visibility("hidden")))
#define KT_LIKELY(x) __builtin_expect(!!(x), 1)
#define KT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KT_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- errors ------------------------------------------------------------ */

/* Set this thread's last-error text (printf format) and return r, so that
 * `return kt__err(KT_ERR_..., "...")` reads naturally. Also logged at INFO
 * with file:line so that a chain of failures reads like a stack trace. */
#define kt__err(r, ...) kt__set_error(r, __FILE__, __LINE__, __VA_ARGS__)
KT_INTERNAL kt_result kt__set_error(kt_result r, const char *file, int line, const char *fmt, ...)
    KT_PRINTF(4, 5);
/* Prefix the current last-error text with more context ("allreduce: ..."). */
KT_INTERNAL void kt__error_prefix(const char *fmt, ...) KT_PRINTF(1, 2);
KT_INTERNAL void kt__clear_error(void);
/* Copy the last-error text of this thread. */
KT_INTERNAL void kt__error_copy(char *dst, size_t cap);
/* Replace the last-error text verbatim. */
KT_INTERNAL void kt__error_set_text(const char *text);

/* Propagate a failure: return it (KT_CHECK) or jump to the cleanup label
 * (KT_CHECK_GOTO, storing the result in res). Each hop logs file:line at TRACE. */
#define KT_CHECK(call)                                                          \
  do {                                                                          \
    kt_result kt__r = (call);                                                   \
    if (KT_UNLIKELY(kt__r != KT_SUCCESS)) {                                     \
      KT_TRACE("%s:%d -> %s", __FILE__, __LINE__, kt_strerror(kt__r));          \
      return kt__r;                                                             \
    }                                                                           \
  } while (0)
#define KT_CHECK_GOTO(call, res, label)                                         \
  do {                                                                          \
    (res) = (call);                                                             \
    if (KT_UNLIKELY((res) != KT_SUCCESS)) {                                     \
      KT_TRACE("%s:%d -> %s", __FILE__, __LINE__, kt_strerror(res));            \
      goto label;                                                               \
    }                                                                           \
  } while (0)

/* Retry a system call on EINTR. */
#define KT_SYSCALL_RETRY(ret, call)                                             \
  do {                                                                          \
    (ret) = (call);                                                             \
  } while ((ret) == -1 && errno == EINTR)

/* ---- logging ----------------------------------------------------------- */

enum { KT_LOG_NONE = 0, KT_LOG_WARN = 1, KT_LOG_INFO = 2, KT_LOG_TRACE = 3 };
extern KT_INTERNAL int kt__log_level; /* set once by kt__log_init() */
KT_INTERNAL void kt__log_init(void);
KT_INTERNAL void kt__log(int level, const char *file, int line, const char *fmt, ...)
    KT_PRINTF(4, 5);
/* Rank shown in log lines of this process (last communicator created). */
KT_INTERNAL void kt__log_set_rank(int rank);

#define KT_LOG_AT(lvl, ...)                                                     \
  do {                                                                          \
    if (KT_UNLIKELY(kt__log_level >= (lvl))) kt__log((lvl), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define KT_WARN(...) KT_LOG_AT(KT_LOG_WARN, __VA_ARGS__)
#define KT_INFO(...) KT_LOG_AT(KT_LOG_INFO, __VA_ARGS__)
#ifdef KT_ENABLE_TRACE
#define KT_TRACE(...) KT_LOG_AT(KT_LOG_TRACE, __VA_ARGS__)
#else
#define KT_TRACE(...) do { } while (0)
#endif

/* ---- parameters (src/core/params.def) ---------------------------------- */

#define KT_PARAM_TYPE_INT int64_t
#define KT_PARAM_TYPE_STR const char *
#define KT_PARAM_TYPE_BOOL bool
/* kt__param_X(): the value (the default when unset or empty);
 * kt__param_set_X(): whether the environment set it (not empty). */
#define KT_PARAM(name, type, def, help)                           \
  KT_INTERNAL KT_PARAM_TYPE_##type kt__param_##name(void);        \
  KT_INTERNAL bool kt__param_set_##name(void);
#include "params.def"
#undef KT_PARAM

/* Describe every parameter: calls fn once per entry with the current value. */
typedef void (*kt__param_visit_fn)(const char *name, const char *type, const char *def,
                                   const char *value, const char *help, void *arg);
KT_INTERNAL void kt__param_visit(kt__param_visit_fn fn, void *arg);

/* ---- time -------------------------------------------------------------- */

/* kt_dtype_size inline, for the hot paths (the public one is a call). */
KT_INTERNAL extern const size_t kt__dtype_sizes[KT_NUM_DTYPES];
static inline size_t kt__dtype_size(kt_dtype d) { return (unsigned)d < KT_NUM_DTYPES ? kt__dtype_sizes[d] : 0; }
#define kt_dtype_size(d) kt__dtype_size(d)

/* memcpy for the small-message paths: up to 32 bytes as two overlapping
 * copies of the largest power of two that fits, inline (a variable-length
 * memcpy is a libc call, a fair part of an 8-byte op); more through memcpy. */
static inline void kt__copy(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *p = src;
  if (n > 32) {
    memcpy(d, p, n);
  } else if (n >= 16) {
    memcpy(d, p, 16);
    memcpy(d + n - 16, p + n - 16, 16);
  } else if (n >= 8) {
    memcpy(d, p, 8);
    memcpy(d + n - 8, p + n - 8, 8);
  } else if (n >= 4) {
    memcpy(d, p, 4);
    memcpy(d + n - 4, p + n - 4, 4);
  } else {
    for (size_t i = 0; i < n; i++) d[i] = p[i];
  }
}

KT_INTERNAL int64_t kt__now_ns(void);

/* ---- asymmetric fences -------------------------------------------------------
 * Where one side of a store-then-load handshake runs per op and the other
 * rarely (a sleeper, a second thread), the hot side orders its store and
 * load in the compiler only (kt__light_fence) and the rare side calls
 * kt__heavy_fence, membarrier(GLOBAL_EXPEDITED): every running thread of a
 * process that registered passes a full barrier, so either the hot side's
 * store is visible to the rare side's load or the hot side's load sees the
 * rare side's store. kt__heavy_fence_ok: this process registered (once; the
 * kernel has it); otherwise the hot side must fence itself. */
KT_INTERNAL bool kt__heavy_fence_ok(void);
KT_INTERNAL bool kt__heavy_fence(void); /* false: it failed (ENOMEM), no barrier */
#define kt__light_fence() atomic_signal_fence(memory_order_seq_cst)

/* CLOCK_MONOTONIC to the kernel tick, rounded up (never behind kt__now_ns,
 * up to a tick ahead), at a fraction of kt__now_ns's cost: for deadlines and
 * liveness beats, read on every op; never for spin limits. */
KT_INTERNAL int64_t kt__now_coarse_ns(void);
/* memcpy for a destination other processes read (shared memory): on x86-64
 * with ERMS, rep movsb, whose full-line stores need no read for ownership;
 * vector stores to lines a peer's cache holds can run 5x slower. */
KT_INTERNAL void kt__copy_shared(void *dst, const void *src, size_t n);
/* Copy with non-temporal stores (x86-64; memcpy elsewhere): the lines written
 * bypass the cache and are not read first. For outputs far larger than the
 * cache that nobody reads soon. kt__stream_fence() before telling anyone the
 * data is there. */
KT_INTERNAL void kt__copy_stream(void *dst, const void *src, size_t n);
KT_INTERNAL void kt__stream_fence(void);
/* KAITIAN_SHM_STREAM_BYTES resolved (-1: 3/4 of the last-level cache); 0: never. */
KT_INTERNAL size_t kt__stream_min_bytes(void);
static inline int64_t kt__now_ms(void) { return kt__now_ns() / 1000000; }

/* a == b over n bytes, in time that does not depend on where they differ
 * (secret tokens: the data mesh's hello, the launcher's heartbeat). */
KT_INTERNAL bool kt__equal_ct(const void *a, const void *b, size_t n);
/* "10.0.0.2:41234" for a peer's address ("?:0" for an unknown family), for
 * messages naming who connected. */
struct sockaddr_storage;
KT_INTERNAL void kt__format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t cap);

/* FNV-1a 64: fold len bytes into h (start from KT_FNV1A_BASIS). For names
 * and ids, not for secrets' protection. */
#define KT_FNV1A_BASIS 1469598103934665603ULL
static inline uint64_t kt__fnv1a(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}
static inline uint64_t kt__fnv1a_str(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

/* ---- misc -------------------------------------------------------------- */

/* n * size without overflow; false on overflow. */
static inline bool kt__mul_ok(size_t n, size_t size, size_t *out) {
  return !__builtin_mul_overflow(n, size, out);
}
KT_INTERNAL void *kt__malloc(size_t n);          /* NULL on failure, sets error */
KT_INTERNAL void *kt__calloc(size_t n, size_t s); /* NULL on failure, sets error */
/* Full write/read of a blocking fd, retrying EINTR and short transfers. */
KT_INTERNAL int kt__write_full(int fd, const void *buf, size_t len);
KT_INTERNAL int kt__read_full(int fd, void *buf, size_t len);

#endif /* KT_COMMON_H */
