/* reduce_impl.h - private to src/reduce, src/optim and their tests: kernel
 * families as tables, and the scalar element conversions every family
 * shares. */
#ifndef KT_REDUCE_IMPL_H
#define KT_REDUCE_IMPL_H

#include "reduce.h"

#include <string.h>

/* Kernel families, in increasing order of preference. */
enum {
  KT_REDUCE_SCALAR = 0,
  KT_REDUCE_AVX2 = 1,
  KT_REDUCE_AVX512 = 2,
  KT_REDUCE_NEON = 3,
  KT_REDUCE_NUM_FAMILIES
};

/* One family: a kernel for every (dtype, op); NULL exactly where
 * kt__op_valid() is false. Pairs a family does not accelerate hold the scalar
 * kernel, so every table is complete. */
typedef struct kt__reduce_table {
  const char *name;
  kt__reduce_fn fn[KT_NUM_DTYPES][KT_NUM_OPS];
} kt__reduce_table;

/* The table of a family, or NULL when this build or this CPU lacks it.
 * Never fails otherwise; thread-safe. */
KT_INTERNAL const kt__reduce_table *kt__reduce_family_table(int family);
/* "scalar", "avx2", "avx512", "neon"; "?" for an unknown family. */
KT_INTERNAL const char *kt__reduce_family_name(int family);

/* The portable kernels (reduce_scalar.c), complete and valid at any time. */
KT_INTERNAL extern const kt__reduce_fn kt__reduce_scalar_fns[KT_NUM_DTYPES][KT_NUM_OPS];

/* Each family overrides the entries it accelerates in fns (which starts as a
 * copy of the scalar table). Only called when the CPU has the family. */
KT_INTERNAL void kt__reduce_fill_avx2(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]);
KT_INTERNAL void kt__reduce_fill_avx512(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]);
KT_INTERNAL void kt__reduce_fill_neon(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]);

/* ---- element conversions (inline so scalar loops can vectorize) -------- */

static inline uint32_t kt__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float kt__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* IEEE binary16 -> binary32, exact. NaN payloads are kept (shifted up). */
static inline float kt__h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu; /* exponent and mantissa */
  uint32_t bits;
  if (em >= 0x7c00u) {
    bits = 0x7f800000u | ((em & 0x3ffu) << 13); /* inf, NaN */
  } else if (em >= 0x0400u) {
    bits = (em << 13) + ((127u - 15u) << 23); /* normal: rebias the exponent */
  } else {
    /* zero or subnormal: em * 2^-24 is exact in float */
    bits = kt__f32_bits((float)em * 0x1p-24f);
  }
  return kt__f32_from_bits(bits | sign);
}

/* binary32 -> binary16, round to nearest even, in integer arithmetic so the
 * result does not depend on the FPU's rounding mode or flush-to-zero.
 * Overflow gives inf; NaN gives a quiet NaN keeping the top payload bits (as
 * the F16C instruction does). */
static inline uint16_t kt__f2h(float f) {
  uint32_t x = kt__f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  uint32_t h;
  if (ax > 0x7f800000u) {
    h = 0x7e00u | ((ax >> 13) & 0x3ffu);
  } else if (ax >= 0x47800000u) {
    h = 0x7c00u; /* >= 2^16, or inf: beyond anything that rounds to finite */
  } else if (ax >= 0x38800000u) {
    /* normal half (>= 2^-14): rebias, then round away the 13 low bits; a
     * carry out of the mantissa correctly bumps the exponent (up to inf). */
    uint32_t v = ax - ((127u - 15u) << 23);
    h = (v + 0x0fffu + ((v >> 13) & 1u)) >> 13;
  } else {
    /* subnormal half: units of 2^-24. value = m * 2^(e - 150), so the count
     * of units is m >> (126 - e), rounded to nearest even. */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* >= 14 because e <= 112 */
    if (shift > 24u) {
      h = 0; /* below half of the smallest subnormal (2^-25): rounds to 0 */
    } else {
      uint32_t r = m >> shift;
      uint32_t rem = m & ((1u << shift) - 1u);
      uint32_t halfway = 1u << (shift - 1u);
      r += (rem > halfway || (rem == halfway && (r & 1u))) ? 1u : 0u;
      h = r; /* r == 0x400 is the smallest normal, encoded the same way */
    }
  }
  return (uint16_t)(h | sign);
}

static inline float kt__b2f(uint16_t b) { return kt__f32_from_bits((uint32_t)b << 16); }

/* binary32 -> bfloat16, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t kt__f2b(float f) {
  uint32_t x = kt__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif /* KT_REDUCE_IMPL_H */
