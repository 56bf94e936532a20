/* bench_data.c - input values and closed-form expectations for `kaitian bench -c`.
 *
 * Every input element is a small integer (or a bit pattern) picked by a hash of
 * (seed, rank, index), in a range chosen per dtype and op so that every partial
 * result the library may form, in whatever order it combines the ranks, is
 * exact in the dtype:
 *   sum   floats: |v| <= min(100, L/n) where L is the largest exact integer
 *         (2048 half, 256 bfloat16); int32/int64: |v| <= 1000; int8/uint8: the
 *         full range, the result wraps modulo 256 (order-independent).
 *   prod  values in {0, 1, -1, 2} with 2 only on ranks < 8 (|product| <= 256);
 *         int8 uses -3 and uint8 3 instead of -1, so that products wrap.
 *   min/max, and the data-moving collectives: any value of the dtype
 *         (integers in [-100, 100] for floats).
 *   avg   rank r holds g(j) + e or g(j) - e in pairs of ranks (a last odd rank
 *         holds g(j)), so the sum is exactly n * g(j) and the mean is g(j);
 *         the range keeps every partial sum inside the dtype (no wrap).
 *   band/bor/bxor: random bits, biased towards ones for band and zeros for bor
 *         so that results are not all zero or all ones.
 *   bool  or-like ops (sum, max, bor, avg) get a one with probability 1/(2n),
 *         and-like ops (prod, min, band) a zero with that probability.
 * The expected value is computed here with int64/double arithmetic and then
 * wrapped or rounded to the dtype, independently of the library's kernels. */
#include "bench_data.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const dtype_names[KT_NUM_DTYPES] = {
    "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"};
static const char *const op_names[KT_NUM_OPS] = {"sum", "prod", "min", "max",
                                                 "avg", "band", "bor", "bxor"};

bool kt__bench_is_float(kt_dtype dtype) {
  return dtype == KT_FLOAT16 || dtype == KT_BFLOAT16 || dtype == KT_FLOAT32 ||
         dtype == KT_FLOAT64;
}

size_t kt__bench_size(kt_dtype dtype) {
  switch (dtype) {
    case KT_INT8: case KT_UINT8: case KT_BOOL: return 1;
    case KT_FLOAT16: case KT_BFLOAT16: return 2;
    case KT_INT32: case KT_FLOAT32: return 4;
    case KT_INT64: case KT_FLOAT64: return 8;
    default: return 0;
  }
}

const char *kt__bench_dtype_name(kt_dtype dtype) {
  return (unsigned)dtype < KT_NUM_DTYPES ? dtype_names[dtype] : "unknown";
}

const char *kt__bench_op_name(int op) {
  if (op == KT_BENCH_MOVE) return "none";
  return op >= 0 && op < KT_NUM_OPS ? op_names[op] : "unknown";
}

/* ---- half and bfloat16 ------------------------------------------------ */

static uint32_t float_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float bits_float(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

/* Round mant >> shift to nearest, ties to even. */
static uint32_t round_shift(uint32_t mant, int shift) {
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1))) q++;
  return q;
}

uint16_t kt__bench_float_to_half(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;             /* NaN */
  if (a >= 0x477ff000) return sign | 0x7c00;            /* >= 65520 rounds to inf */
  if (a >= 0x38800000) {                                /* normal half */
    uint32_t h = ((a >> 23) - 112) << 10 | ((a & 0x7fffff) >> 13);
    uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry bumps the exponent */
    return (uint16_t)(sign | h);
  }
  if (a < 0x33000000) return sign;                      /* <= 2^-25 rounds to 0 */
  uint32_t e = a >> 23, mant = (a & 0x7fffff) | 0x800000;
  return (uint16_t)(sign | round_shift(mant, (int)(126 - e))); /* subnormal half */
}

float kt__bench_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    float v = (float)m / 16777216.0f; /* m * 2^-24, exact */
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000 | m << 13);
  return bits_float(sign | (e + 112) << 23 | m << 13);
}

uint16_t kt__bench_float_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float kt__bench_bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

/* ---- wrapping and rounding to the dtype -------------------------------- */

static int64_t wrap_int(kt_dtype dtype, uint64_t x) {
  switch (dtype) {
    case KT_INT8: x &= 0xff; return x >= 0x80 ? (int64_t)x - 0x100 : (int64_t)x;
    case KT_UINT8: return (int64_t)(x & 0xff);
    case KT_INT32:
      x &= 0xffffffffu;
      return x >= 0x80000000u ? (int64_t)x - 0x100000000 : (int64_t)x;
    case KT_BOOL: return x != 0;
    default: return (int64_t)x;
  }
}

static double round_float(kt_dtype dtype, double d) {
  switch (dtype) {
    case KT_FLOAT16: return kt__bench_half_to_float(kt__bench_float_to_half((float)d));
    case KT_BFLOAT16: return kt__bench_bf16_to_float(kt__bench_float_to_bf16((float)d));
    case KT_FLOAT32: return (float)d;
    default: return d;
  }
}

static kt_bench_value make_int(kt_dtype dtype, uint64_t x) {
  kt_bench_value v = {wrap_int(dtype, x), 0.0};
  return v;
}

static kt_bench_value make_float(kt_dtype dtype, double d) {
  kt_bench_value v = {0, round_float(dtype, d)};
  return v;
}

/* ---- inputs ------------------------------------------------------------ */

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

static uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) {
  return mix(mix(mix(seed + 0x9e3779b97f4a7c15ull) + a) + b);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t in_range(uint64_t h, int64_t lo, int64_t hi) {
  return lo + (int64_t)(h % (uint64_t)(hi - lo + 1));
}

/* Largest integer every partial sum of n values may reach exactly. */
static int64_t exact_limit(kt_dtype dtype) {
  switch (dtype) {
    case KT_FLOAT16: return 2048;
    case KT_BFLOAT16: return 256;
    default: return 1000000;
  }
}

/* Range of the values that average: every partial sum of n of them fits. */
static void avg_bounds(const kt_bench_gen *g, int64_t *lo, int64_t *hi) {
  int64_t n = g->nranks, a;
  switch (g->dtype) {
    case KT_INT8: a = 127 / n; *lo = -a; *hi = a; return;
    case KT_UINT8: *lo = 0; *hi = 255 / n; return;
    case KT_FLOAT16: case KT_BFLOAT16:
      a = min64(1000, exact_limit(g->dtype) / n);
      *lo = -a; *hi = a; return;
    default: *lo = -1000; *hi = 1000; return;
  }
}

static int64_t avg_input(const kt_bench_gen *g, int rank, size_t j) {
  int64_t lo, hi;
  avg_bounds(g, &lo, &hi);
  int64_t mean = in_range(hash3(g->seed, UINT64_MAX, j), lo, hi);
  if ((g->nranks & 1) && rank == g->nranks - 1) return mean;
  int64_t room = min64(mean - lo, hi - mean);
  int64_t e = in_range(hash3(g->seed, (uint64_t)(rank / 2), j), 0, room);
  return rank % 2 == 0 ? mean + e : mean - e;
}

static int64_t prod_input(const kt_bench_gen *g, int rank, uint64_t h) {
  unsigned s = (unsigned)(h % 16);
  if (s < 4) return rank < 8 ? 2 : 1;
  if (s < 8) return g->dtype == KT_INT8 ? -3 : g->dtype == KT_UINT8 ? 3 : -1;
  if (s == 15) return 0;
  return 1;
}

static kt_bench_value bool_input(const kt_bench_gen *g, uint64_t h) {
  bool rare = h % (2 * (uint64_t)g->nranks) == 0;
  switch (g->op) {
    case KT_SUM: case KT_MAX: case KT_BOR: case KT_AVG: return make_int(KT_BOOL, rare);
    case KT_PROD: case KT_MIN: case KT_BAND: return make_int(KT_BOOL, !rare);
    default: return make_int(KT_BOOL, h & 1);
  }
}

kt_bench_value kt__bench_input(const kt_bench_gen *g, int rank, size_t j) {
  uint64_t h = hash3(g->seed, (uint64_t)rank, j);
  if (g->dtype == KT_BOOL) return bool_input(g, h);
  bool fl = kt__bench_is_float(g->dtype);
  int64_t v;
  switch (g->op) {
    case KT_SUM:
      if (!fl && kt__bench_size(g->dtype) == 1)
        return make_int(g->dtype, h); /* full range: the sum wraps */
      if (!fl) { v = in_range(h, -1000, 1000); break; }
      {
        int64_t m = min64(100, exact_limit(g->dtype) / g->nranks);
        if (m < 1) m = 1;
        v = in_range(h, -m, m);
      }
      break;
    case KT_PROD: v = prod_input(g, rank, h); break;
    case KT_AVG: v = avg_input(g, rank, j); break;
    case KT_BAND: return make_int(g->dtype, h | mix(h));
    case KT_BOR: return make_int(g->dtype, h & mix(h) & mix(h + 1));
    case KT_BXOR: return make_int(g->dtype, h);
    default: /* min, max, data movement */
      if (!fl) return make_int(g->dtype, h);
      v = in_range(h, -100, 100);
      break;
  }
  return fl ? make_float(g->dtype, (double)v) : make_int(g->dtype, (uint64_t)v);
}

/* ---- expectations ------------------------------------------------------- */

static kt_bench_value reduced_bool(const kt_bench_gen *g, size_t j) {
  int64_t acc = g->op == KT_PROD || g->op == KT_MIN || g->op == KT_BAND;
  for (int r = 0; r < g->nranks; r++) {
    int64_t v = kt__bench_input(g, r, j).i;
    switch (g->op) {
      case KT_PROD: case KT_MIN: case KT_BAND: acc = acc && v; break;
      case KT_BXOR: acc ^= v; break;
      default: acc = acc || v; break;
    }
  }
  return make_int(KT_BOOL, (uint64_t)acc);
}

static kt_bench_value reduced_int(const kt_bench_gen *g, size_t j) {
  uint64_t acc = 0;
  int64_t sacc = 0;
  for (int r = 0; r < g->nranks; r++) {
    int64_t v = kt__bench_input(g, r, j).i;
    if (r == 0) { acc = (uint64_t)v; sacc = v; continue; }
    switch (g->op) {
      case KT_SUM: acc += (uint64_t)v; break;
      case KT_AVG: sacc += v; break; /* bounded: no overflow */
      case KT_PROD: acc *= (uint64_t)v; break;
      case KT_MIN: sacc = v < sacc ? v : sacc; break;
      case KT_MAX: sacc = v > sacc ? v : sacc; break;
      case KT_BAND: acc &= (uint64_t)v; break;
      case KT_BOR: acc |= (uint64_t)v; break;
      default: acc ^= (uint64_t)v; break;
    }
  }
  if (g->op == KT_AVG) return make_int(g->dtype, (uint64_t)(sacc / g->nranks));
  if (g->op == KT_MIN || g->op == KT_MAX) return make_int(g->dtype, (uint64_t)sacc);
  return make_int(g->dtype, acc);
}

static kt_bench_value reduced_float(const kt_bench_gen *g, size_t j) {
  double acc = 0.0;
  for (int r = 0; r < g->nranks; r++) {
    double v = kt__bench_input(g, r, j).f;
    if (r == 0) { acc = v; continue; }
    switch (g->op) {
      case KT_PROD: acc *= v; break;
      case KT_MIN: acc = v < acc ? v : acc; break;
      case KT_MAX: acc = v > acc ? v : acc; break;
      default: acc += v; break; /* sum, avg */
    }
  }
  if (g->op == KT_AVG) acc /= g->nranks;
  return make_float(g->dtype, acc);
}

kt_bench_value kt__bench_reduced(const kt_bench_gen *g, size_t j) {
  if (g->dtype == KT_BOOL) return reduced_bool(g, j);
  return kt__bench_is_float(g->dtype) ? reduced_float(g, j) : reduced_int(g, j);
}

/* ---- element access ------------------------------------------------------ */

static void write_elem(kt_dtype dtype, void *buf, size_t idx, kt_bench_value v) {
  unsigned char *p = (unsigned char *)buf + idx * kt__bench_size(dtype);
  switch (dtype) {
    case KT_INT8: { int8_t x = (int8_t)v.i; memcpy(p, &x, 1); break; }
    case KT_UINT8: case KT_BOOL: { uint8_t x = (uint8_t)v.i; memcpy(p, &x, 1); break; }
    case KT_INT32: { int32_t x = (int32_t)v.i; memcpy(p, &x, 4); break; }
    case KT_INT64: memcpy(p, &v.i, 8); break;
    case KT_FLOAT16: { uint16_t x = kt__bench_float_to_half((float)v.f); memcpy(p, &x, 2); break; }
    case KT_BFLOAT16: { uint16_t x = kt__bench_float_to_bf16((float)v.f); memcpy(p, &x, 2); break; }
    case KT_FLOAT32: { float x = (float)v.f; memcpy(p, &x, 4); break; }
    case KT_FLOAT64: memcpy(p, &v.f, 8); break;
    default: break;
  }
}

kt_bench_value kt__bench_read(kt_dtype dtype, const void *buf, size_t idx) {
  const unsigned char *p = (const unsigned char *)buf + idx * kt__bench_size(dtype);
  kt_bench_value v = {0, 0.0};
  switch (dtype) {
    case KT_INT8: { int8_t x; memcpy(&x, p, 1); v.i = x; break; }
    case KT_UINT8: case KT_BOOL: { uint8_t x; memcpy(&x, p, 1); v.i = x; break; }
    case KT_INT32: { int32_t x; memcpy(&x, p, 4); v.i = x; break; }
    case KT_INT64: memcpy(&v.i, p, 8); break;
    case KT_FLOAT16: { uint16_t x; memcpy(&x, p, 2); v.f = kt__bench_half_to_float(x); break; }
    case KT_BFLOAT16: { uint16_t x; memcpy(&x, p, 2); v.f = kt__bench_bf16_to_float(x); break; }
    case KT_FLOAT32: { float x; memcpy(&x, p, 4); v.f = x; break; }
    case KT_FLOAT64: memcpy(&v.f, p, 8); break;
    default: break;
  }
  return v;
}

void kt__bench_fill(const kt_bench_gen *g, int rank, void *buf, size_t first, size_t n) {
  for (size_t k = 0; k < n; k++) write_elem(g->dtype, buf, k, kt__bench_input(g, rank, first + k));
}

void kt__bench_poison(void *buf, size_t nbytes) { memset(buf, 0xa5, nbytes); }

/* Relative error a division by n may add in the dtype. The mean is an exact
 * value of the dtype and the sum is exact, so only a division done as a
 * multiplication by 1/n can be an ulp off; float16 and bfloat16 divide in
 * float32 and the rounding back to 16 bits hides that error. */
static double avg_tolerance(kt_dtype dtype) {
  switch (dtype) {
    case KT_FLOAT32: return 0x1p-22;
    case KT_FLOAT64: return 0x1p-51;
    default: return 0.0;
  }
}

bool kt__bench_equal(const kt_bench_gen *g, kt_bench_value expected, kt_bench_value got) {
  if (!kt__bench_is_float(g->dtype)) return expected.i == got.i;
  if (g->op != KT_AVG) return expected.f == got.f;
  double scale = fabs(expected.f) > 1.0 ? fabs(expected.f) : 1.0;
  return fabs(expected.f - got.f) <= avg_tolerance(g->dtype) * scale; /* false for NaN */
}

void kt__bench_corrupt(kt_dtype dtype, void *buf, size_t idx) {
  size_t es = kt__bench_size(dtype);
  unsigned char *p = (unsigned char *)buf + idx * es;
  /* Bool: the other truth value. Others: the second-highest bit of the
   * little-endian top byte, the top exponent bit of every floating type, so
   * the value moves far beyond any tolerance (or becomes inf/NaN). */
  if (dtype == KT_BOOL) p[0] ^= 1;
  else p[es - 1] ^= 0x40;
}

void kt__bench_format(kt_dtype dtype, kt_bench_value v, char *out, size_t cap) {
  if (kt__bench_is_float(dtype)) snprintf(out, cap, "%.9g", v.f);
  else if (dtype == KT_BOOL && (v.i == 0 || v.i == 1))
    snprintf(out, cap, "%s", v.i ? "true" : "false");
  else if (dtype == KT_BOOL) snprintf(out, cap, "invalid bool byte %lld", (long long)v.i);
  else snprintf(out, cap, "%lld", (long long)v.i);
}
