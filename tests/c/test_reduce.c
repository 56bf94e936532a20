/* test_reduce.c - checks every reduction kernel of every kernel family this
 * CPU has against an element-by-element reference (double / 128-bit integer
 * arithmetic), the half and bfloat16 conversions against brute force, AVG
 * finalize, and the choice of family (KAITIAN_REDUCE_IMPL).
 *
 * Usage: test_reduce [--select]   (--select: only the family-choice checks)
 * KT_TEST_SEED=<n> changes the random data; the seed is printed. */
#include "reduce/reduce_impl.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the reference truncates integers by taking low bytes: little-endian only"
#endif

static int failures;

#define FAIL(...)                                                            \
  do {                                                                       \
    failures++;                                                              \
    fprintf(stderr, "FAIL: " __VA_ARGS__);                                   \
    fputc('\n', stderr);                                                     \
  } while (0)

/* ---- random numbers (xorshift64*) ------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545f4914f6cdd1dull;
}
static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }

static const char *dtype_names[KT_NUM_DTYPES] = {"int8", "uint8", "int32", "int64", "float16",
                                                 "bfloat16", "float32", "float64", "bool"};
static const char *op_names[KT_NUM_OPS] = {"sum", "prod", "min", "max",
                                           "avg", "band", "bor", "bxor"};
static const size_t dtype_sizes[KT_NUM_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8, 1};

/* ---- conversions ------------------------------------------------------- */

/* Value of a binary16 code, decoded from the IEEE definition in double. */
static double half_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}

/* Value of a bfloat16 code (8-bit exponent, 7-bit mantissa). */
static double bf16_value(uint16_t h) {
  int e = (h >> 7) & 255, m = h & 127;
  double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
  return (h & 0x8000) ? -v : v;
}

static bool same_double(double x, double y) {
  if (isnan(x) || isnan(y)) return isnan(x) && isnan(y);
  return x == y && signbit(x) == signbit(y);
}

typedef struct {
  const char *name;
  double (*value)(uint16_t);
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
  uint16_t exp_mask, quiet_bit, max_finite;
  double beyond_max; /* where inf sits as the next value after max_finite */
} fmt16;

static const fmt16 fmt_half = {"float16", half_value, kt__half_to_float, kt__float_to_half,
                               0x7c00, 0x0200, 0x7bff, 65536.0};
static const fmt16 fmt_bf16 = {"bfloat16", bf16_value, kt__bf16_to_float, kt__float_to_bf16,
                               0x7f80, 0x0040, 0x7f7f, 0x1p128};

static bool is_nan16(const fmt16 *fm, uint16_t h) {
  return (h & fm->exp_mask) == fm->exp_mask && (h & ~(fm->exp_mask | 0x8000)) != 0;
}

/* Every code: decodes to its IEEE value, and goes back to itself (NaN stays
 * NaN with its sign; a quiet NaN comes back bit for bit). */
static void test_all_codes(const fmt16 *fm) {
  int bad = 0;
  for (uint32_t c = 0; c < 65536 && bad < 5; c++) {
    uint16_t h = (uint16_t)c;
    float f = fm->to_float(h);
    double want = fm->value(h);
    if (!same_double(f, want)) {
      FAIL("%s_to_float(0x%04x) = %.9g, want %.9g", fm->name, h, f, want);
      bad++;
      continue;
    }
    uint16_t back = fm->from_float(f);
    if (is_nan16(fm, h)) {
      bool ok = is_nan16(fm, back) && (back & 0x8000) == (h & 0x8000) &&
                (!(h & fm->quiet_bit) || back == h);
      if (!ok) {
        FAIL("%s NaN 0x%04x -> float -> 0x%04x: not the same NaN", fm->name, h, back);
        bad++;
      }
    } else if (back != h) {
      FAIL("%s 0x%04x -> %.9g -> 0x%04x, not a round trip", fm->name, h, f, back);
      bad++;
    }
  }
}

/* The nearest code to f by scanning every finite code of f's sign (inf
 * stands as the value after the largest finite one); ties go to the even
 * code. Independent of the conversion's bit tricks. */
static uint16_t brute_round(const fmt16 *fm, float f) {
  static double values[2][0x8000]; /* positive codes of each format, decoded once */
  static bool decoded[2];
  int k = fm == &fmt_half ? 0 : 1;
  if (!decoded[k]) {
    for (uint32_t c = 0; c < 0x8000; c++)
      values[k][c] = c == (uint32_t)fm->max_finite + 1 ? fm->beyond_max : fm->value((uint16_t)c);
    decoded[k] = true;
  }
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isnan(f)) return 0xffff; /* caller checks NaN separately */
  double af = fabs((double)f);
  uint16_t best = 0;
  double best_d = INFINITY;
  for (uint32_t c = 0; c <= (uint32_t)fm->max_finite + 1; c++) {
    double v = values[k][c];
    double d = fabs(v - af);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = (uint16_t)c;
    }
  }
  return (uint16_t)(best | sign);
}

static void check_round(const fmt16 *fm, float f, uint16_t want, const char *why) {
  uint16_t got = fm->from_float(f);
  if (got != want)
    FAIL("float_to_%s(%a = %.9g) = 0x%04x, want 0x%04x (%s)", fm->name, f, f, got, want, why);
}

static void test_rounding(const fmt16 *fm) {
  /* Exhaustive ties: the midpoint between each code and the next rounds to
   * the even one; a float just above goes up, just below goes down. */
  for (uint32_t c = 0; c <= fm->max_finite; c++) {
    double lo = fm->value((uint16_t)c);
    double hi = c == fm->max_finite ? fm->beyond_max : fm->value((uint16_t)(c + 1));
    float mid = (float)((lo + hi) / 2); /* exact: one bit more than the format */
    if ((double)mid != (lo + hi) / 2) {
      FAIL("%s: midpoint above 0x%04x not exact in float (test bug)", fm->name, c);
      return;
    }
    uint16_t even = (c & 1) ? (uint16_t)(c + 1) : (uint16_t)c;
    check_round(fm, mid, even, "tie");
    check_round(fm, -mid, (uint16_t)(even | 0x8000), "negative tie");
    check_round(fm, nextafterf(mid, INFINITY), (uint16_t)(c + 1), "just above a tie");
    check_round(fm, nextafterf(mid, 0.0f), (uint16_t)c, "just below a tie");
    if (failures > 20) return;
  }
  /* Chosen values, checked against brute force. */
  const float chosen[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.1f, -2.5f, 1.0f / 3, 65504.0f, 65505.0f,
                          65519.0f, 65520.0f, 65536.0f, 1e10f, FLT_MAX, -FLT_MAX, FLT_MIN,
                          FLT_TRUE_MIN, -FLT_TRUE_MIN, 0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                          0x1p-26f, 0x1.ffep-15f, 0x1.ff8p-15f, 3e-5f, 6.1e-5f, 5.9604645e-8f,
                          0x1.fep127f, 0x1.ff8p127f, 0x1p-126f, 0x1p-133f, 0x1p-134f, 0x1.8p-133f,
                          0x1.0101p0f, 0x1.0081p0f, 0x1.008p0f, 0x1.018p0f};
  for (size_t i = 0; i < sizeof chosen / sizeof chosen[0]; i++)
    check_round(fm, chosen[i], brute_round(fm, chosen[i]), "chosen value");
  /* Random floats over the format's range and a little beyond. */
  int lo_exp = fm == &fmt_half ? -27 : -136, hi_exp = fm == &fmt_half ? 17 : 128;
  for (int i = 0; i < 1500; i++) {
    float f = ldexpf((float)(1.0 + rnd_unit()), lo_exp + (int)(rnd() % (uint64_t)(hi_exp - lo_exp)));
    if (rnd() & 1) f = -f;
    check_round(fm, f, brute_round(fm, f), "random value");
    if (failures > 20) return;
  }
  /* Infinities and NaN. */
  uint16_t inf = fm->exp_mask;
  check_round(fm, INFINITY, inf, "inf");
  check_round(fm, -INFINITY, (uint16_t)(inf | 0x8000), "-inf");
  float snan_like, small_payload;
  uint32_t bits = 0x7f800001u; /* NaN whose payload is below the 16-bit mantissa */
  memcpy(&small_payload, &bits, sizeof bits);
  bits = 0xffa00000u;
  memcpy(&snan_like, &bits, sizeof bits);
  float all_nans[] = {NAN, -NAN, small_payload, snan_like};
  for (size_t i = 0; i < 4; i++) {
    uint16_t h = fm->from_float(all_nans[i]);
    if (!is_nan16(fm, h) || ((h & 0x8000) != 0) != (signbit(all_nans[i]) != 0))
      FAIL("float_to_%s(NaN #%zu) = 0x%04x, not a NaN of the same sign", fm->name, i, h);
  }
}

/* ---- reference kernels -------------------------------------------------- */

static int64_t load_int(kt_dtype dt, const unsigned char *p) {
  switch (dt) {
    case KT_INT8: return (int8_t)p[0];
    case KT_UINT8: case KT_BOOL: return p[0];
    case KT_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

static double load_float(kt_dtype dt, const unsigned char *p) {
  uint16_t h;
  switch (dt) {
    case KT_FLOAT16: memcpy(&h, p, 2); return kt__half_to_float(h);
    case KT_BFLOAT16: memcpy(&h, p, 2); return kt__bf16_to_float(h);
    case KT_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    default: { double v; memcpy(&v, p, 8); return v; }
  }
}

static bool is_float_dtype(kt_dtype dt) {
  return dt == KT_FLOAT16 || dt == KT_BFLOAT16 || dt == KT_FLOAT32 || dt == KT_FLOAT64;
}

/* out = a OP b for one element, computed in int64/__int128 or double. */
static void ref_elem(kt_dtype dt, kt_op op, const unsigned char *pa, const unsigned char *pb,
                     unsigned char *out) {
  size_t sz = dtype_sizes[dt];
  if (dt == KT_BOOL) {
    bool x = pa[0] != 0, y = pb[0] != 0, r;
    switch (op) {
      case KT_SUM: case KT_MAX: case KT_AVG: case KT_BOR: r = x || y; break;
      case KT_BXOR: r = x != y; break;
      default: r = x && y; break;
    }
    out[0] = r;
    return;
  }
  if (!is_float_dtype(dt)) {
    __int128 x = load_int(dt, pa), y = load_int(dt, pb), r;
    switch (op) {
      case KT_SUM: case KT_AVG: r = x + y; break;
      case KT_PROD: r = x * y; break;
      case KT_MIN: r = x < y ? x : y; break;
      case KT_MAX: r = x > y ? x : y; break;
      case KT_BAND: r = x & y; break;
      case KT_BOR: r = x | y; break;
      default: r = x ^ y; break;
    }
    uint64_t low = (uint64_t)r; /* wrap-around = the low bytes */
    memcpy(out, &low, sz);
    return;
  }
  double x = load_float(dt, pa), y = load_float(dt, pb), r;
  switch (op) {
    case KT_SUM: case KT_AVG: r = x + y; break;
    case KT_PROD: r = x * y; break;
    case KT_MIN: r = (isnan(x) || isnan(y)) ? NAN : (x < y ? x : y); break;
    default: r = (isnan(x) || isnan(y)) ? NAN : (x > y ? x : y); break;
  }
  /* For float32 and the 16-bit types, double then float rounding equals one
   * float32 rounding (53 >= 2*24+2), which is what the kernels must do. */
  float rf = (float)r;
  uint16_t h;
  switch (dt) {
    case KT_FLOAT16: h = kt__float_to_half(rf); memcpy(out, &h, 2); break;
    case KT_BFLOAT16: h = kt__float_to_bf16(rf); memcpy(out, &h, 2); break;
    case KT_FLOAT32: memcpy(out, &rf, 4); break;
    default: memcpy(out, &r, 8); break;
  }
}

/* Bitwise equal, except that any NaN matches any NaN, and for min/max a
 * zero of either sign matches (which of -0/+0 is "smaller" is unspecified). */
static bool elem_equal(kt_dtype dt, kt_op op, const unsigned char *e, const unsigned char *g) {
  size_t sz = dtype_sizes[dt];
  if (memcmp(e, g, sz) == 0) return true;
  if (!is_float_dtype(dt)) return false;
  double de = load_float(dt, e), dg = load_float(dt, g);
  if (isnan(de) && isnan(dg)) return true;
  return (op == KT_MIN || op == KT_MAX) && de == 0 && dg == 0;
}

static void format_elem(kt_dtype dt, const unsigned char *p, char *buf, size_t cap) {
  if (!is_float_dtype(dt)) {
    snprintf(buf, cap, "%" PRId64, load_int(dt, p));
  } else {
    uint64_t bits = 0;
    memcpy(&bits, p, dtype_sizes[dt]);
    snprintf(buf, cap, "%.9g (0x%0*" PRIx64 ")", load_float(dt, p), (int)dtype_sizes[dt] * 2, bits);
  }
}

/* ---- random inputs ------------------------------------------------------ */

static double moderate(void) {
  double v = ldexp(1.0 + rnd_unit(), (int)(rnd() % 21) - 10);
  return (rnd() & 1) ? -v : v;
}

static double special(void) {
  static const double s[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN, 1.0, -1.0,
                             65504.0, 1e-7, -3e-6, 1e30, -1e-40, 3.0e38};
  return s[rnd() % (sizeof s / sizeof s[0])];
}

static void fill_random(kt_dtype dt, unsigned char *p, size_t n) {
  size_t sz = dtype_sizes[dt];
  for (size_t i = 0; i < n; i++, p += sz) {
    uint64_t r = rnd(), kind = rnd() % 10;
    if (dt == KT_BOOL) {
      p[0] = kind < 5 ? 0 : kind < 8 ? 1 : (uint8_t)r; /* other nonzero bytes too */
    } else if (!is_float_dtype(dt)) {
      static const int64_t edge[] = {0, -1, 1, INT64_MIN, INT64_MAX, INT32_MIN, INT32_MAX, -128, 127, 255};
      int64_t v = kind == 0 ? edge[r % 10] : (int64_t)r;
      memcpy(p, &v, sz);
    } else {
      double v = kind < 7 ? moderate() : kind == 7 ? special() : 0;
      uint16_t h;
      float f = (float)v;
      if (kind >= 8) { /* raw random bits: every code, NaN and subnormal included */
        memcpy(p, &r, sz);
        continue;
      }
      switch (dt) {
        case KT_FLOAT16: h = kt__float_to_half(f); memcpy(p, &h, 2); break;
        case KT_BFLOAT16: h = kt__float_to_bf16(f); memcpy(p, &h, 2); break;
        case KT_FLOAT32: memcpy(p, &f, 4); break;
        default: memcpy(p, &v, 8); break;
      }
    }
  }
}

/* ---- kernel matrix ------------------------------------------------------ */

enum { OUT_OF_PLACE, IN_PLACE_A, IN_PLACE_B, NUM_MODES };
static const char *mode_names[] = {"out-of-place", "dst==a", "dst==b"};
#define GUARD 64
#define GUARD_BYTE 0xa5

/* One kernel on n elements; a, b and dst at byte offsets off_a, off_b, off_d
 * from 64-byte aligned storage. Returns false (after printing) on a mismatch. */
static bool run_case(const char *family, kt__reduce_fn fn, kt_dtype dt, kt_op op, size_t n,
                     size_t off, int mode) {
  size_t sz = dtype_sizes[dt], bytes = n * sz, cap = (bytes + 2 * GUARD + 63) & ~(size_t)63;
  size_t off_a = off, off_b = (off + 1) % 4, off_d = (off + 2) % 4;
  unsigned char *ba = aligned_alloc(64, cap), *bb = aligned_alloc(64, cap),
                *bd = aligned_alloc(64, cap), *ea = malloc(bytes + 1), *eb = malloc(bytes + 1),
                *want = malloc(bytes + 1);
  bool ok = true;
  if (!ba || !bb || !bd || !ea || !eb || !want) {
    FAIL("out of memory");
    ok = false;
    goto out;
  }
  memset(ba, GUARD_BYTE, cap);
  memset(bb, GUARD_BYTE, cap);
  memset(bd, GUARD_BYTE, cap);
  unsigned char *a = ba + GUARD + off_a, *b = bb + GUARD + off_b, *d = bd + GUARD + off_d;
  fill_random(dt, ea, n);
  fill_random(dt, eb, n);
  memcpy(a, ea, bytes);
  memcpy(b, eb, bytes);
  for (size_t i = 0; i < n; i++) ref_elem(dt, op, ea + i * sz, eb + i * sz, want + i * sz);

  unsigned char *dst = mode == IN_PLACE_A ? a : mode == IN_PLACE_B ? b : d;
  unsigned char *dbase = mode == IN_PLACE_A ? ba : mode == IN_PLACE_B ? bb : bd;
  size_t doff = mode == IN_PLACE_A ? off_a : mode == IN_PLACE_B ? off_b : off_d;
  fn(dst, a, b, n);

  for (size_t i = 0; i < n; i++) {
    if (!elem_equal(dt, op, want + i * sz, dst + i * sz)) {
      char sa[64], sb[64], se[64], sg[64];
      format_elem(dt, ea + i * sz, sa, sizeof sa);
      format_elem(dt, eb + i * sz, sb, sizeof sb);
      format_elem(dt, want + i * sz, se, sizeof se);
      format_elem(dt, dst + i * sz, sg, sizeof sg);
      FAIL("%s %s family=%s n=%zu offset=%zu %s: element %zu: a=%s b=%s expected %s got %s",
           dtype_names[dt], op_names[op], family, n, off, mode_names[mode], i, sa, sb, se, sg);
      ok = false;
      goto out;
    }
  }
  /* Nothing outside [dst, dst + bytes) written; inputs that are not dst
   * left alone. */
  for (size_t i = 0; i < cap; i++) {
    if (i >= GUARD + doff && i < GUARD + doff + bytes) continue;
    if (dbase[i] != GUARD_BYTE) {
      FAIL("%s %s family=%s n=%zu offset=%zu %s: byte %td outside dst was written",
           dtype_names[dt], op_names[op], family, n, off, mode_names[mode],
           (ptrdiff_t)i - (ptrdiff_t)(GUARD + doff));
      ok = false;
      goto out;
    }
  }
  if ((mode != IN_PLACE_A && memcmp(a, ea, bytes) != 0) ||
      (mode != IN_PLACE_B && memcmp(b, eb, bytes) != 0)) {
    FAIL("%s %s family=%s n=%zu %s: an input that is not dst was modified", dtype_names[dt],
         op_names[op], family, n, mode_names[mode]);
    ok = false;
  }
out:
  free(ba);
  free(bb);
  free(bd);
  free(ea);
  free(eb);
  free(want);
  return ok;
}

static void test_family(int family) {
  static const size_t lengths[] = {0, 1, 7, 31, 33, 1000, 4097};
  const kt__reduce_table *t = kt__reduce_family_table(family);
  const char *name = kt__reduce_family_name(family);
  if (!t) {
    printf("family %-6s: not available on this CPU/build, skipped\n", name);
    return;
  }
  int cases = 0, before = failures;
  for (int dt = 0; dt < KT_NUM_DTYPES; dt++) {
    for (int op = 0; op < KT_NUM_OPS; op++) {
      kt__reduce_fn fn = t->fn[dt][op];
      if (!kt__op_valid((kt_dtype)dt, (kt_op)op)) {
        if (fn) FAIL("family %s has a kernel for invalid %s %s", name, dtype_names[dt], op_names[op]);
        continue;
      }
      if (!fn) {
        FAIL("family %s has no kernel for %s %s", name, dtype_names[dt], op_names[op]);
        continue;
      }
      bool ok = true;
      for (size_t li = 0; ok && li < sizeof lengths / sizeof lengths[0]; li++)
        for (size_t off = 0; ok && off < 4; off++)
          for (int mode = 0; ok && mode < NUM_MODES; mode++, cases++)
            ok = run_case(name, fn, (kt_dtype)dt, (kt_op)op, lengths[li], off, mode);
    }
  }
  printf("family %-6s: %d cases, %s\n", name, cases, failures == before ? "ok" : "FAILED");
}

/* ---- AVG finalize -------------------------------------------------------- */

static void test_finalize(void) {
  enum { N = 997 };
  static const int nranks_list[] = {1, 2, 3, 7};
  unsigned char orig[N * 8], buf[N * 8], want[8];
  for (int dt = 0; dt < KT_NUM_DTYPES; dt++) {
    size_t sz = dtype_sizes[dt];
    for (size_t ni = 0; ni < sizeof nranks_list / sizeof nranks_list[0]; ni++) {
      int nr = nranks_list[ni];
      fill_random((kt_dtype)dt, orig, N);
      /* a non-AVG op leaves the buffer alone */
      memcpy(buf, orig, N * sz);
      kt__reduce_finalize(buf, N, (kt_dtype)dt, KT_SUM, nr);
      if (memcmp(buf, orig, N * sz) != 0) FAIL("finalize %s SUM changed the buffer", dtype_names[dt]);
      memcpy(buf, orig, N * sz);
      kt__reduce_finalize(buf, N, (kt_dtype)dt, KT_AVG, nr);
      for (size_t i = 0; i < N; i++) {
        const unsigned char *x = orig + i * sz;
        if (dt == KT_BOOL || nr == 1) {
          memcpy(want, x, sz);
        } else if (!is_float_dtype((kt_dtype)dt)) {
          /* truncation toward zero, from the magnitude */
          int64_t v = load_int((kt_dtype)dt, x);
          uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
          uint64_t q = mag / (uint64_t)nr;
          uint64_t r = v < 0 ? 0 - q : q;
          memcpy(want, &r, sz);
        } else {
          double q = load_float((kt_dtype)dt, x) / nr;
          float qf = (float)q;
          uint16_t h;
          if (dt == KT_FLOAT16) { h = kt__float_to_half(qf); memcpy(want, &h, 2); }
          else if (dt == KT_BFLOAT16) { h = kt__float_to_bf16(qf); memcpy(want, &h, 2); }
          else if (dt == KT_FLOAT32) memcpy(want, &qf, 4);
          else memcpy(want, &q, 8);
        }
        if (!elem_equal((kt_dtype)dt, KT_AVG, want, buf + i * sz)) {
          char sx[64], se[64], sg[64];
          format_elem((kt_dtype)dt, x, sx, sizeof sx);
          format_elem((kt_dtype)dt, want, se, sizeof se);
          format_elem((kt_dtype)dt, buf + i * sz, sg, sizeof sg);
          FAIL("finalize %s AVG nranks=%d element %zu: sum=%s expected %s got %s",
               dtype_names[dt], nr, i, sx, se, sg);
          break;
        }
      }
    }
  }
}

/* ---- dispatch ------------------------------------------------------------ */

static int best_family(void) {
  static const int order[] = {KT_REDUCE_AVX512, KT_REDUCE_AVX2, KT_REDUCE_NEON};
  for (size_t i = 0; i < 3; i++)
    if (kt__reduce_family_table(order[i])) return order[i];
  return KT_REDUCE_SCALAR;
}

static bool has_word(const char *list, const char *word) {
  size_t len = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += len)
    if ((p == list || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0')) return true;
  return false;
}

static void test_selection(void) {
  const char *impl = kt__reduce_impl_name();
  const char *features = kt__cpu_features();
  const char *forced = kt__param_REDUCE_IMPL();
  printf("cpu features: %s\nkernel family: %s (KAITIAN_REDUCE_IMPL=%s)\n", features, impl,
         forced ? forced : "");

  int want = best_family();
  for (int f = 0; f < KT_REDUCE_NUM_FAMILIES; f++)
    if (forced && strcasecmp(forced, kt__reduce_family_name(f)) == 0 && kt__reduce_family_table(f))
      want = f;
  if (strcmp(impl, kt__reduce_family_name(want)) != 0)
    FAIL("kernel family is %s, expected %s (KAITIAN_REDUCE_IMPL=%s, features: %s)", impl,
         kt__reduce_family_name(want), forced ? forced : "", features);

  if (!kt__reduce_family_table(KT_REDUCE_SCALAR)) FAIL("the scalar family is missing");
  if (kt__reduce_family_table(KT_REDUCE_AVX2) &&
      !(has_word(features, "avx2") && has_word(features, "fma") && has_word(features, "f16c")))
    FAIL("avx2 family enabled but features are '%s'", features);
  if (kt__reduce_family_table(KT_REDUCE_AVX512) &&
      !(has_word(features, "avx512f") && has_word(features, "avx512bw")))
    FAIL("avx512 family enabled but features are '%s'", features);
  if (kt__reduce_family_table(-1) || kt__reduce_family_table(KT_REDUCE_NUM_FAMILIES))
    FAIL("out-of-range family has a table");

  /* kt__reduce_kernel hands out the chosen family's kernels, NULL for
   * invalid or out-of-range pairs. */
  const kt__reduce_table *t = kt__reduce_family_table(want);
  for (int dt = 0; dt <= KT_NUM_DTYPES; dt++) {
    for (int op = 0; op <= KT_NUM_OPS; op++) {
      kt__reduce_fn fn = kt__reduce_kernel((kt_dtype)dt, (kt_op)op);
      bool valid = kt__op_valid((kt_dtype)dt, (kt_op)op);
      bool in_range = dt < KT_NUM_DTYPES && op < KT_NUM_OPS;
      bool bitwise = op == KT_BAND || op == KT_BOR || op == KT_BXOR;
      bool should = in_range && !(bitwise && is_float_dtype((kt_dtype)dt));
      if (valid != should)
        FAIL("kt__op_valid(%d, %d) = %d, expected %d", dt, op, valid, should);
      if (!valid && fn) FAIL("kt__reduce_kernel(%d, %d) is not NULL for an invalid pair", dt, op);
      if (valid && t && fn != t->fn[dt][op])
        FAIL("kt__reduce_kernel(%s, %s) is not the %s kernel", dtype_names[dt], op_names[op], impl);
    }
  }
  if (kt__op_valid((kt_dtype)-1, KT_SUM) || kt__op_valid(KT_INT8, (kt_op)-1))
    FAIL("kt__op_valid accepts a negative dtype or op");

  /* the convenience wrapper */
  int32_t a[5] = {1, -2, 3, INT32_MAX, 5}, b[5] = {10, 20, -30, 1, 50}, d[5];
  int32_t want_sum[5] = {11, 18, -27, INT32_MIN, 55};
  kt__reduce(d, a, b, 5, KT_INT32, KT_SUM);
  if (memcmp(d, want_sum, sizeof d) != 0) FAIL("kt__reduce int32 sum wrong");
  kt__reduce(d, a, b, 0, KT_FLOAT32, KT_BAND); /* invalid: must do nothing */
}

/* ---- speed ------------------------------------------------------------- */

static void speed(void) {
  enum { BYTES = 1 << 20 };
  static const kt_dtype dts[] = {KT_FLOAT32, KT_FLOAT16, KT_BFLOAT16};
  unsigned char *a = calloc(1, BYTES), *b = calloc(1, BYTES), *d = calloc(1, BYTES);
  if (!a || !b || !d) goto out;
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    kt_dtype dt = dts[k];
    size_t n = BYTES / dtype_sizes[dt];
    for (size_t i = 0; i < n; i++) { /* i and 1, exact in every format up to 256 */
      if (dt == KT_FLOAT32) {
        float x = (float)(i % 256), one = 1.0f;
        memcpy(a + 4 * i, &x, 4), memcpy(b + 4 * i, &one, 4);
      } else {
        uint16_t x = dt == KT_FLOAT16 ? kt__float_to_half((float)(i % 256)) : kt__float_to_bf16((float)(i % 256));
        uint16_t one = dt == KT_FLOAT16 ? kt__float_to_half(1.0f) : kt__float_to_bf16(1.0f);
        memcpy(a + 2 * i, &x, 2), memcpy(b + 2 * i, &one, 2);
      }
    }
    for (int f = 0; f < KT_REDUCE_NUM_FAMILIES; f++) {
      const kt__reduce_table *t = kt__reduce_family_table(f);
      if (!t) continue;
      kt__reduce_fn fn = t->fn[dt][KT_SUM];
      fn(d, a, b, n);
      int iters = 200;
      int64_t t0 = kt__now_ns();
      for (int i = 0; i < iters; i++) fn(d, a, b, n);
      double s = (double)(kt__now_ns() - t0) * 1e-9;
      printf("speed %-6s %-8s sum 1 MiB: %.1f GB/s (2 reads + 1 write per element)\n", t->name, dtype_names[dt],
             3.0 * BYTES * iters / s * 1e-9);
    }
  }
out:
  free(a);
  free(b);
  free(d);
}

int main(int argc, char **argv) {
  bool select_only = argc > 1 && strcmp(argv[1], "--select") == 0;
  const char *seed = getenv("KT_TEST_SEED");
  if (seed && *seed) rng = strtoull(seed, NULL, 0) | 1;
  printf("seed 0x%" PRIx64 "\n", rng);

  test_selection();
  if (!select_only) {
    int before = failures;
    test_all_codes(&fmt_half);
    test_all_codes(&fmt_bf16);
    test_rounding(&fmt_half);
    test_rounding(&fmt_bf16);
    printf("conversions: %s\n", failures == before ? "ok" : "FAILED");
    for (int f = 0; f < KT_REDUCE_NUM_FAMILIES; f++) test_family(f);
    test_finalize();
    speed();
  }
  if (failures) {
    fprintf(stderr, "test_reduce: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_reduce: all passed\n");
  return 0;
}
