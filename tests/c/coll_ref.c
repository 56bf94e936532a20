/* coll_ref.c - deterministic per-(rank, index, seed) inputs and reference
 * reductions computed in float64 or exact integer arithmetic, for coll_test.
 * Uses nothing of the library but the public enum values. */
#include "coll_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ref_nranks = 1;

void ref_set_nranks(int nranks) { ref_nranks = nranks > 0 ? nranks : 1; }

/* ---- float16 / bfloat16 ------------------------------------------------ */

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t ref_float_to_half(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) /* inf, or NaN made quiet with its top payload bits */
    return (uint16_t)(a > 0x7f800000u ? (sign | 0x7e00u | ((a >> 13) & 0x3ffu)) : (sign | 0x7c00u));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a < 0x33000000u) return (uint16_t)sign;              /* < 2^-25 rounds to 0 */
  uint32_t q, rem, halfway;
  if (a < 0x38800000u) { /* half subnormal: units of 2^-24 */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    q = m >> shift;
    rem = m & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {
    q = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
    rem = a & 0x1fffu;
    halfway = 0x1000u;
  }
  if (rem > halfway || (rem == halfway && (q & 1u))) q++; /* a carry rolls into the exponent */
  return (uint16_t)(sign | q);
}

float ref_half_to_float(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
  return u2f(sign | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t ref_float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float ref_bf16_to_float(uint16_t h) { return u2f((uint32_t)h << 16); }

/* ---- tables ------------------------------------------------------------ */

size_t ref_dtype_size(kt_dtype dt) {
  switch (dt) {
  case KT_INT8: case KT_UINT8: case KT_BOOL: return 1;
  case KT_FLOAT16: case KT_BFLOAT16: return 2;
  case KT_INT32: case KT_FLOAT32: return 4;
  case KT_INT64: case KT_FLOAT64: return 8;
  default: return 0;
  }
}

const char *ref_dtype_name(kt_dtype dt) {
  static const char *const names[] = {"int8",     "uint8",   "int32",   "int64", "float16",
                                      "bfloat16", "float32", "float64", "bool"};
  return (unsigned)dt < KT_NUM_DTYPES ? names[dt] : "?";
}

const char *ref_op_name(kt_op op) {
  static const char *const names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "-"};
  return (unsigned)op <= KT_NUM_OPS ? names[op] : "?";
}

bool ref_is_float(kt_dtype dt) {
  return dt == KT_FLOAT16 || dt == KT_BFLOAT16 || dt == KT_FLOAT32 || dt == KT_FLOAT64;
}

bool ref_op_valid(kt_dtype dt, kt_op op) {
  if ((unsigned)dt >= KT_NUM_DTYPES || (unsigned)op >= KT_NUM_OPS) return false;
  if (op == KT_BAND || op == KT_BOR || op == KT_BXOR) return !ref_is_float(dt);
  return true;
}

/* ---- inputs ------------------------------------------------------------ */

static inline uint64_t mix64(uint64_t z) { /* splitmix64 finaliser */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ref_key(uint64_t salt, int rank) { return mix64(salt ^ mix64((uint64_t)rank + 0x5bd1e995ull)); }

static void store_float(kt_dtype dt, double x, void *dst) {
  if (dt == KT_FLOAT16) {
    uint16_t h = ref_float_to_half((float)x);
    memcpy(dst, &h, 2);
  } else if (dt == KT_BFLOAT16) {
    uint16_t h = ref_float_to_bf16((float)x);
    memcpy(dst, &h, 2);
  } else if (dt == KT_FLOAT32) {
    float f = (float)x;
    memcpy(dst, &f, 4);
  } else {
    memcpy(dst, &x, 8);
  }
}

/* AVG inputs on integers: |v| <= max / nranks so the sum never wraps (the
 * header leaves open whether AVG's sum wraps before the division). */
static uint64_t avg_int(kt_dtype dt, uint64_t h) {
  uint64_t n = (uint64_t)ref_nranks;
  uint64_t m; /* value in [-m, m], computed modulo 2^64 (no signed overflow) */
  switch (dt) {
  case KT_UINT8: return h % (255u / n + 1);
  case KT_INT8: m = 127u / n; break;
  case KT_INT32: m = 2147483647u / n; break;
  default: m = (uint64_t)INT64_MAX / n; break;
  }
  return h % (2 * m + 1) - m;
}

void ref_elem(kt_dtype dt, kt_op op, uint64_t key, size_t idx, void *dst) {
  uint64_t h = mix64(key ^ ((uint64_t)idx * 0xd1b54a32d192ed03ull));
  size_t es = ref_dtype_size(dt);
  if (dt == KT_BOOL) { /* odd indices mostly 1 (for and), even mostly 0 (for or) */
    *(uint8_t *)dst = (idx & 1) ? ((h & 7) != 0) : ((h & 7) == 0);
    return;
  }
  if (op == REF_RAW) { /* any bit pattern, NaNs included: data movement only */
    memcpy(dst, &h, es); /* little endian: the low bytes */
    return;
  }
  if (ref_is_float(dt)) {
    double u = (double)(h >> 11) * 0x1p-53;
    double x;
    if (op == KT_PROD) /* +-[0.5, 2]: a product of 8 stays well inside float16 */
      x = ((h & 1) ? -1.0 : 1.0) * exp2(2.0 * u - 1.0);
    else if (op == KT_MIN || op == KT_MAX)
      x = 200.0 * u - 100.0;
    else /* sum, avg: [-2, 2] */
      x = 4.0 * u - 2.0;
    store_float(dt, x, dst);
    return;
  }
  uint64_t v = h;
  if (op == KT_PROD && (h >> 62) != 0) v |= 1; /* mostly odd, so products are not all 0 */
  if (op == KT_AVG) v = avg_int(dt, h);
  memcpy(dst, &v, es);
}

void ref_fill(void *buf, size_t n, kt_dtype dt, kt_op op, uint64_t salt, int rank, size_t idx0) {
  uint64_t key = ref_key(salt, rank);
  size_t es = ref_dtype_size(dt);
  for (size_t i = 0; i < n; i++) ref_elem(dt, op, key, idx0 + i, (uint8_t *)buf + i * es);
}

/* ---- decoding and printing --------------------------------------------- */

static double get_double(kt_dtype dt, const void *p) {
  uint16_t h;
  float f;
  double d;
  switch (dt) {
  case KT_FLOAT16: memcpy(&h, p, 2); return ref_half_to_float(h);
  case KT_BFLOAT16: memcpy(&h, p, 2); return ref_bf16_to_float(h);
  case KT_FLOAT32: memcpy(&f, p, 4); return f;
  default: memcpy(&d, p, 8); return d;
  }
}

/* Integer element as int64 (sign-extended for signed types). */
static int64_t get_int(kt_dtype dt, const void *p) {
  int8_t a;
  int32_t b;
  int64_t c;
  switch (dt) {
  case KT_INT8: memcpy(&a, p, 1); return a;
  case KT_UINT8: case KT_BOOL: return *(const uint8_t *)p;
  case KT_INT32: memcpy(&b, p, 4); return b;
  default: memcpy(&c, p, 8); return c;
  }
}

static void fmt_elem(char *s, size_t cap, kt_dtype dt, const void *p) {
  if (ref_is_float(dt)) {
    if (ref_dtype_size(dt) == 2) {
      uint16_t h;
      memcpy(&h, p, 2);
      snprintf(s, cap, "%.9g (0x%04x)", get_double(dt, p), h);
    } else {
      snprintf(s, cap, "%.17g", get_double(dt, p));
    }
  } else {
    snprintf(s, cap, "%lld", (long long)get_int(dt, p));
  }
}

static void report(ref_ctx *ctx, size_t index, kt_dtype dt, const void *want, const void *got,
                   double tol) {
  if (ctx->max_print <= 0) return;
  ctx->max_print--;
  char ws[64], gs[64];
  fmt_elem(ws, sizeof ws, dt, want);
  fmt_elem(gs, sizeof gs, dt, got);
  if (tol > 0)
    fprintf(stderr, "FAIL %s index %zu: expected %s (tolerance %.3g) got %s\n", ctx->what, index,
            ws, tol, gs);
  else
    fprintf(stderr, "FAIL %s index %zu: expected %s got %s\n", ctx->what, index, ws, gs);
}

/* ---- reference reductions ---------------------------------------------- */

/* Unit roundoff of each float type. */
static double unit_roundoff(kt_dtype dt) {
  switch (dt) {
  case KT_FLOAT16: return 0x1p-11;
  case KT_BFLOAT16: return 0x1p-8;
  case KT_FLOAT32: return 0x1p-24;
  default: return 0x1p-53;
  }
}

/* Smallest positive subnormal of each float type (absolute slack). */
static double tiny(kt_dtype dt) {
  switch (dt) {
  case KT_FLOAT16: return 0x1p-24;
  case KT_BFLOAT16: return 0x1p-133;
  case KT_FLOAT32: return 0x1p-149;
  default: return 0x1p-1074;
  }
}

/* Exact integer reduction with the dtype's wraparound; returns the bits. */
static uint64_t reduce_int(kt_dtype dt, kt_op op, const int64_t *v, int n) {
  if (dt == KT_BOOL) {
    uint64_t acc = (uint64_t)v[0];
    for (int r = 1; r < n; r++) {
      if (op == KT_PROD || op == KT_MIN || op == KT_BAND) acc &= (uint64_t)v[r];
      else if (op == KT_BXOR) acc ^= (uint64_t)v[r];
      else acc |= (uint64_t)v[r]; /* sum, max, avg, bor */
    }
    return acc;
  }
  if (op == KT_AVG) { /* inputs are scaled so this sum does not overflow */
    int64_t s = 0;
    for (int r = 0; r < n; r++) s += v[r];
    return (uint64_t)(s / n); /* C division truncates toward zero */
  }
  uint64_t acc = (uint64_t)v[0];
  for (int r = 1; r < n; r++) {
    uint64_t x = (uint64_t)v[r];
    switch (op) {
    case KT_SUM: acc += x; break;
    case KT_PROD: acc *= x; break;
    case KT_MIN: if (v[r] < (int64_t)acc) acc = x; break; /* get_int keeps uint8 >= 0 */
    case KT_MAX: if (v[r] > (int64_t)acc) acc = x; break;
    case KT_BAND: acc &= x; break;
    case KT_BOR: acc |= x; break;
    default: acc ^= x; break;
    }
  }
  return acc;
}

/* Float reduction in float64 with the tolerance of the dtype: the library may
 * round to the dtype after each of up to n steps, so sums get
 * (2n + 2) * u * sum|x| and products (2n + 2) * u * |product|. */
static double reduce_float(kt_dtype dt, kt_op op, const double *x, int n, double *tol) {
  double u = unit_roundoff(dt), acc = x[0], mag = fabs(x[0]);
  for (int r = 1; r < n; r++) {
    if (op == KT_SUM || op == KT_AVG) acc += x[r];
    else if (op == KT_PROD) acc *= x[r];
    else if (op == KT_MIN) acc = x[r] < acc ? x[r] : acc;
    else acc = x[r] > acc ? x[r] : acc;
    mag += fabs(x[r]);
  }
  switch (op) {
  case KT_SUM: *tol = (2.0 * n + 2.0) * u * mag + tiny(dt); break;
  case KT_AVG:
    acc /= n;
    *tol = (2.0 * n + 2.0) * u * mag / n + u * fabs(acc) + tiny(dt);
    break;
  case KT_PROD: *tol = (2.0 * n + 2.0) * u * fabs(acc) + tiny(dt); break;
  default: *tol = 0; break; /* min, max: exact */
  }
  return acc;
}

size_t ref_check_reduce(const void *got, size_t n, kt_dtype dt, kt_op op, uint64_t salt,
                        int nranks, size_t idx0, size_t out0, ref_ctx *ctx) {
  size_t es = ref_dtype_size(dt), bad = 0;
  uint64_t *keys = malloc(sizeof *keys * (size_t)nranks);
  int64_t *iv = malloc(sizeof *iv * (size_t)nranks);
  double *fv = malloc(sizeof *fv * (size_t)nranks);
  if (!keys || !iv || !fv) {
    fprintf(stderr, "FAIL %s: out of memory in the reference\n", ctx->what);
    free(keys), free(iv), free(fv);
    return n ? n : 1;
  }
  for (int r = 0; r < nranks; r++) keys[r] = ref_key(salt, r);
  bool isf = ref_is_float(dt);
  for (size_t i = 0; i < n; i++) {
    const uint8_t *g = (const uint8_t *)got + i * es;
    uint8_t e[8], want[8];
    if (isf) {
      for (int r = 0; r < nranks; r++) {
        ref_elem(dt, op, keys[r], idx0 + i, e);
        fv[r] = get_double(dt, e);
      }
      double tol, w = reduce_float(dt, op, fv, nranks, &tol), gv = get_double(dt, g);
      bool ok = tol > 0 ? fabs(gv - w) <= tol : gv == w;
      if (!ok) {
        store_float(dt, w, want);
        report(ctx, out0 + i, dt, want, g, tol);
        bad++;
      }
    } else {
      for (int r = 0; r < nranks; r++) {
        ref_elem(dt, op, keys[r], idx0 + i, e);
        iv[r] = get_int(dt, e);
      }
      uint64_t w = reduce_int(dt, op, iv, nranks);
      memcpy(want, &w, es);
      if (memcmp(want, g, es) != 0) {
        report(ctx, out0 + i, dt, want, g, 0);
        bad++;
      }
    }
  }
  free(keys), free(iv), free(fv);
  return bad;
}

size_t ref_check_copy(const void *got, size_t n, kt_dtype dt, kt_op op, uint64_t salt, int src,
                      size_t idx0, size_t out0, ref_ctx *ctx) {
  size_t es = ref_dtype_size(dt), bad = 0;
  uint64_t key = ref_key(salt, src);
  for (size_t i = 0; i < n; i++) {
    const uint8_t *g = (const uint8_t *)got + i * es;
    uint8_t want[8];
    ref_elem(dt, op, key, idx0 + i, want);
    if (memcmp(want, g, es) != 0) {
      report(ctx, out0 + i, dt, want, g, 0);
      bad++;
    }
  }
  return bad;
}
