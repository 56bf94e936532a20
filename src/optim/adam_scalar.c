/* adam_scalar.c - the portable Adam kernel: the reference family, and what
 * runs where no SIMD family applies. Its fused multiply-add is correctly
 * rounded (the hardware one where the target has it, else an exact
 * emulation in double), so it gives the same bits as the SIMD families. */
#include "adam_impl.h"

#include "reduce/reduce_impl.h" /* kt__h2f, kt__b2f, kt__f2h, kt__f2b */

#include <math.h>
#include <string.h>

/* a * b + c rounded once. Without hardware FMA: a * b is exact in double
 * (24 + 24 bits); s = a*b + c rounded to double, and err, the exact rest
 * (TwoSum), tell the exact sum. Rounding s to odd (toward zero, last bit
 * set when inexact) keeps the information that a second rounding, to float,
 * needs: 53 bits >= 24 + 2, so the float is the correctly rounded one. */
static inline float fma_f(float a, float b, float c) {
#if defined(__FP_FAST_FMAF)
  return __builtin_fmaf(a, b, c);
#else
  double p = (double)a * (double)b;
  double s = p + (double)c;
  double z = s - p;
  double err = (p - (s - z)) + ((double)c - z);
  if (err < 0.0 || err > 0.0) { /* inexact (never for inf or NaN: err is NaN) */
    uint64_t u;
    memcpy(&u, &s, sizeof u);
    if ((err > 0.0) != (s > 0.0)) u -= 1; /* |s| > |exact|: one step toward zero */
    u |= 1;
    memcpy(&s, &u, sizeof s);
  }
  return (float)s;
#endif
}

static inline float load_grad(const void *g, size_t i, int gtype) {
  const unsigned char *p = g;
  if (gtype == KT_ADAM_F32) {
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p + 2 * i, 2);
  return gtype == KT_ADAM_F16 ? kt__h2f(h) : kt__b2f(h);
}

static inline void store_copy(void *c, size_t i, int ctype, float f) {
  unsigned char *p = c;
  if (ctype == KT_ADAM_F32) {
    memcpy(p + 4 * i, &f, 4);
  } else if (ctype != KT_ADAM_COPY_NONE) {
    uint16_t h = ctype == KT_ADAM_F16 ? kt__f2h(f) : kt__f2b(f);
    memcpy(p + 2 * i, &h, 2);
  }
}

/* The element loop; inlined once per (gtype, ctype, l2) so that each is a
 * loop without branches on them. Elements move through memcpy: the float
 * buffers need not be aligned. */
static inline __attribute__((always_inline)) void run(const kt__adam_consts *k,
                                                      const kt__adam_bufs *b, size_t begin,
                                                      size_t end, int gtype, int ctype, bool l2) {
  unsigned char *pp = (unsigned char *)b->param, *pm = (unsigned char *)b->exp_avg;
  unsigned char *pv = (unsigned char *)b->exp_avg_sq;
  for (size_t i = begin; i < end; i++) {
    float p, m, v, g = load_grad(b->grad, i, gtype);
    memcpy(&p, pp + 4 * i, 4);
    memcpy(&m, pm + 4 * i, 4);
    memcpy(&v, pv + 4 * i, 4);
    p = p * k->decay;
    if (l2) g = fma_f(p, k->wd, g);
    m = fma_f(g, k->one_minus_beta1, m * k->beta1);
    v = fma_f(k->one_minus_beta2 * g, g, v * k->beta2);
    float d = sqrtf(v) / k->bc2_sqrt + k->eps;
    p = p + (k->neg_step_size * m) / d;
    memcpy(pp + 4 * i, &p, 4);
    memcpy(pm + 4 * i, &m, 4);
    memcpy(pv + 4 * i, &v, 4);
    store_copy(b->copy, i, ctype, p);
  }
}

KT_ADAM_ENTRY(kt__adam_scalar, )
