/* adam_avx2.c - the Adam kernel for AVX2 + FMA + F16C, 8 elements a step,
 * compiled through target attributes so the file builds with the baseline
 * flags; used only when the CPU has all three. The tail (under 8 elements)
 * goes through the same vector step on a copy in local buffers, so it gives
 * the same bits as the body. */
#include "adam_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "reduce/simd_avx2.h"

/* 8 gradient elements of gtype at g[i], widened to float (exact). */
AVX2_INLINE __m256 load_grad(const void *g, size_t i, int gtype) {
  if (gtype == KT_ADAM_F32) return _mm256_loadu_ps((const float *)g + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
  if (gtype == KT_ADAM_F16) return _mm256_cvtph_ps(h);
  return kt__bf16x8_widen(h);
}

AVX2_INLINE void store_copy(void *c, size_t i, int ctype, __m256 p) {
  if (ctype == KT_ADAM_F32) {
    _mm256_storeu_ps((float *)c + i, p);
  } else if (ctype != KT_ADAM_COPY_NONE) {
    __m128i h = ctype == KT_ADAM_F16 ? _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT) : kt__bf16x8_narrow(p);
    _mm_storeu_si128((__m128i *)((uint16_t *)c + i), h);
  }
}

/* The constants, broadcast once per call. */
typedef struct {
  __m256 decay, wd, b1, omb1, b2, omb2, bc2s, eps, nss;
} vconsts;

AVX2_INLINE vconsts broadcast(const kt__adam_consts *k) {
  vconsts v = {_mm256_set1_ps(k->decay), _mm256_set1_ps(k->wd), _mm256_set1_ps(k->beta1),
               _mm256_set1_ps(k->one_minus_beta1), _mm256_set1_ps(k->beta2),
               _mm256_set1_ps(k->one_minus_beta2), _mm256_set1_ps(k->bc2_sqrt),
               _mm256_set1_ps(k->eps), _mm256_set1_ps(k->neg_step_size)};
  return v;
}

/* Elements [i, i + 8) of the buffers: adam_impl.h's formula, op for op. */
AVX2_INLINE void step8(const vconsts *k, float *p, const void *g, float *m, float *v, void *c,
                       size_t i, int gtype, int ctype, bool l2) {
  __m256 vp = _mm256_mul_ps(_mm256_loadu_ps(p + i), k->decay);
  __m256 vg = load_grad(g, i, gtype);
  if (l2) vg = _mm256_fmadd_ps(vp, k->wd, vg);
  __m256 vm = _mm256_fmadd_ps(vg, k->omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), k->b1));
  __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(k->omb2, vg), vg,
                              _mm256_mul_ps(_mm256_loadu_ps(v + i), k->b2));
  __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), k->bc2s), k->eps);
  vp = _mm256_add_ps(vp, _mm256_div_ps(_mm256_mul_ps(k->nss, vm), d));
  _mm256_storeu_ps(p + i, vp);
  _mm256_storeu_ps(m + i, vm);
  _mm256_storeu_ps(v + i, vv);
  store_copy(c, i, ctype, vp);
}

static size_t esize(int type) { return type == KT_ADAM_F32 ? 4 : 2; }

/* The last r < 8 elements from i on: copied into zeroed local vectors,
 * stepped, copied back (only r elements of each buffer are touched). */
AVX2_INLINE void tail(const vconsts *k, const kt__adam_bufs *b, size_t i, size_t r, int gtype,
                      int ctype, bool l2) {
  float p[8] = {0}, m[8] = {0}, v[8] = {0}, g[8] = {0}, c[8] = {0};
  size_t gs = esize(gtype), cs = esize(ctype);
  memcpy(p, b->param + i, 4 * r);
  memcpy(m, b->exp_avg + i, 4 * r);
  memcpy(v, b->exp_avg_sq + i, 4 * r);
  memcpy(g, (const unsigned char *)b->grad + gs * i, gs * r);
  step8(k, p, g, m, v, c, 0, gtype, ctype, l2);
  memcpy(b->param + i, p, 4 * r);
  memcpy(b->exp_avg + i, m, 4 * r);
  memcpy(b->exp_avg_sq + i, v, 4 * r);
  if (ctype != KT_ADAM_COPY_NONE) memcpy((unsigned char *)b->copy + cs * i, c, cs * r);
}

AVX2_INLINE void run(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin, size_t end,
                     int gtype, int ctype, bool l2) {
  vconsts k = broadcast(c);
  size_t i = begin;
  for (; i + 8 <= end; i += 8)
    step8(&k, b->param, b->grad, b->exp_avg, b->exp_avg_sq, b->copy, i, gtype, ctype, l2);
  if (i < end) tail(&k, b, i, end - i, gtype, ctype, l2);
}

KT_ADAM_ENTRY(kt__adam_avx2, AVX2_FN)

#else /* not x86-64: the family is never selected */

void kt__adam_avx2(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin, size_t end) {
  (void)c;
  (void)b;
  (void)begin;
  (void)end;
}

#endif
