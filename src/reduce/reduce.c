/* reduce.c - picks the reduction kernel family once per process (CPU
 * features, KAITIAN_REDUCE_IMPL), and the entry points of reduce.h that do
 * not depend on the family: validity, AVG finalize, conversions. */
#include "reduce_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <string.h>
#include <strings.h>

static const char *const family_names[KT_REDUCE_NUM_FAMILIES] = {
    [KT_REDUCE_SCALAR] = "scalar",
    [KT_REDUCE_AVX2] = "avx2",
    [KT_REDUCE_AVX512] = "avx512",
    [KT_REDUCE_NEON] = "neon",
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static kt__reduce_table tables[KT_REDUCE_NUM_FAMILIES];
static bool family_ok[KT_REDUCE_NUM_FAMILIES];
static int active_family = KT_REDUCE_SCALAR;
/* &tables[active_family] once init has run: kt__reduce_kernel's check,
 * cheaper than a call to pthread_once in every small reduction. */
static _Atomic(const kt__reduce_table *) active_table;
static char cpu_features[128];

/* ---- CPU features ------------------------------------------------------ */

static void add_feature(const char *name, bool present) {
  if (!present) return;
  size_t len = strlen(cpu_features);
  snprintf(cpu_features + len, sizeof cpu_features - len, "%s%s", len ? " " : "", name);
}

#if defined(__x86_64__)
/* F16C from CPUID leaf 1 directly: not every compiler's
 * __builtin_cpu_supports knows the name. Its state is the AVX state, which
 * __builtin_cpu_supports("avx") already checks is enabled by the OS. */
static bool cpu_has_f16c(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx");
}
#endif

static void detect_cpu(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool f16c = cpu_has_f16c();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  /* libgcc's check includes the OS (XCR0) enabling the ZMM state. */
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  add_feature("sse2", __builtin_cpu_supports("sse2"));
  add_feature("avx", __builtin_cpu_supports("avx"));
  add_feature("avx2", __builtin_cpu_supports("avx2"));
  add_feature("fma", __builtin_cpu_supports("fma"));
  add_feature("f16c", f16c);
  add_feature("avx512f", __builtin_cpu_supports("avx512f"));
  add_feature("avx512bw", __builtin_cpu_supports("avx512bw"));
  family_ok[KT_REDUCE_AVX2] = avx2;
  family_ok[KT_REDUCE_AVX512] = avx512;
#elif defined(__aarch64__)
  add_feature("neon", true); /* Advanced SIMD is mandatory on AArch64 */
  family_ok[KT_REDUCE_NEON] = true;
#endif
  family_ok[KT_REDUCE_SCALAR] = true;
}

static void build_tables(void) {
  for (int f = 0; f < KT_REDUCE_NUM_FAMILIES; f++) {
    tables[f].name = family_names[f];
    memcpy(tables[f].fn, kt__reduce_scalar_fns, sizeof tables[f].fn);
  }
  if (family_ok[KT_REDUCE_AVX2]) kt__reduce_fill_avx2(tables[KT_REDUCE_AVX2].fn);
  if (family_ok[KT_REDUCE_AVX512]) kt__reduce_fill_avx512(tables[KT_REDUCE_AVX512].fn);
  if (family_ok[KT_REDUCE_NEON]) kt__reduce_fill_neon(tables[KT_REDUCE_NEON].fn);
}

static int best_family(void) {
  static const int order[] = {KT_REDUCE_AVX512, KT_REDUCE_AVX2, KT_REDUCE_NEON};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
    if (family_ok[order[i]]) return order[i];
  return KT_REDUCE_SCALAR;
}

static void init(void) {
  kt__log_init();
  detect_cpu();
  build_tables();
  active_family = best_family();
  const char *forced = kt__param_REDUCE_IMPL();
  if (forced && *forced) {
    int f = -1;
    for (int i = 0; i < KT_REDUCE_NUM_FAMILIES; i++)
      if (strcasecmp(forced, family_names[i]) == 0) f = i;
    if (f < 0) {
      KT_WARN("KAITIAN_REDUCE_IMPL=%s is not a kernel family (expected scalar, avx2, avx512 "
              "or neon); using %s", forced, family_names[active_family]);
    } else if (!family_ok[f]) {
      KT_WARN("KAITIAN_REDUCE_IMPL=%s, but this CPU or build lacks it (CPU features: %s); "
              "using %s", forced, cpu_features[0] ? cpu_features : "none",
              family_names[active_family]);
    } else {
      active_family = f;
    }
  }
  KT_INFO("reduction kernels: %s (CPU features: %s)", family_names[active_family],
          cpu_features[0] ? cpu_features : "none");
  atomic_store_explicit(&active_table, &tables[active_family], memory_order_release);
}

const kt__reduce_table *kt__reduce_family_table(int family) {
  pthread_once(&init_once, init);
  if (family < 0 || family >= KT_REDUCE_NUM_FAMILIES || !family_ok[family]) return NULL;
  return &tables[family];
}

const char *kt__reduce_family_name(int family) {
  if (family < 0 || family >= KT_REDUCE_NUM_FAMILIES) return "?";
  return family_names[family];
}

const char *kt__cpu_features(void) {
  pthread_once(&init_once, init);
  return cpu_features;
}

const char *kt__reduce_impl_name(void) {
  pthread_once(&init_once, init);
  return family_names[active_family];
}

/* ---- kernels ----------------------------------------------------------- */

bool kt__op_valid(kt_dtype dtype, kt_op op) {
  if ((unsigned)dtype >= KT_NUM_DTYPES || (unsigned)op >= KT_NUM_OPS) return false;
  if (op == KT_BAND || op == KT_BOR || op == KT_BXOR) {
    switch (dtype) {
      case KT_FLOAT16: case KT_BFLOAT16: case KT_FLOAT32: case KT_FLOAT64: return false;
      default: return true;
    }
  }
  return true;
}

kt__reduce_fn kt__reduce_kernel(kt_dtype dtype, kt_op op) {
  if (!kt__op_valid(dtype, op)) return NULL;
  const kt__reduce_table *t = atomic_load_explicit(&active_table, memory_order_acquire);
  if (KT_UNLIKELY(!t)) {
    pthread_once(&init_once, init);
    t = atomic_load_explicit(&active_table, memory_order_acquire);
  }
  return t->fn[dtype][op];
}

/* An invalid (dtype, op) does nothing: callers check kt__op_valid() first
 * and report the error with their own context. */
void kt__reduce(void *dst, const void *a, const void *b, size_t n, kt_dtype dtype, kt_op op) {
  kt__reduce_fn fn = kt__reduce_kernel(dtype, op);
  if (fn && n) fn(dst, a, b, n);
}

/* Elements move through memcpy: buf need not be aligned. */
#define DIV_LOOP(T, buf, n, div)                                              \
  do {                                                                        \
    unsigned char *p = (buf);                                                 \
    for (size_t i = 0; i < (n); i++) {                                        \
      T v;                                                                    \
      memcpy(&v, p + i * sizeof(T), sizeof(T));                               \
      v = (T)(v / (div));                                                     \
      memcpy(p + i * sizeof(T), &v, sizeof(T));                               \
    }                                                                         \
  } while (0)

/* nranks < 2 leaves the sum as it is (also the safe answer to nonsense). */
void kt__reduce_finalize(void *buf, size_t n, kt_dtype dtype, kt_op op, int nranks) {
  if (op != KT_AVG || nranks < 2 || n == 0) return;
  switch (dtype) {
    case KT_INT8: DIV_LOOP(int8_t, buf, n, nranks); break;
    case KT_UINT8: DIV_LOOP(uint8_t, buf, n, nranks); break;
    case KT_INT32: DIV_LOOP(int32_t, buf, n, nranks); break;
    case KT_INT64: DIV_LOOP(int64_t, buf, n, (int64_t)nranks); break;
    case KT_FLOAT32: DIV_LOOP(float, buf, n, (float)nranks); break;
    case KT_FLOAT64: DIV_LOOP(double, buf, n, (double)nranks); break;
    case KT_FLOAT16: {
      unsigned char *p = buf;
      float div = (float)nranks;
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        h = kt__f2h(kt__h2f(h) / div);
        memcpy(p + 2 * i, &h, 2);
      }
      break;
    }
    case KT_BFLOAT16: {
      unsigned char *p = buf;
      float div = (float)nranks;
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        h = kt__f2b(kt__b2f(h) / div);
        memcpy(p + 2 * i, &h, 2);
      }
      break;
    }
    default: break; /* bool: the logical or stands */
  }
}

/* ---- conversions ------------------------------------------------------- */

float kt__half_to_float(uint16_t h) { return kt__h2f(h); }
uint16_t kt__float_to_half(float f) { return kt__f2h(f); }
float kt__bf16_to_float(uint16_t h) { return kt__b2f(h); }
uint16_t kt__float_to_bf16(float f) { return kt__f2b(f); }
