/* adam_avx512.c - the Adam kernel for AVX-512 (F + BW), 16 elements a step,
 * compiled through target attributes so the file builds with the baseline
 * flags; used only when the CPU and OS have AVX512F and AVX512BW. The tail
 * runs the same step with masked loads and stores, so no element outside
 * the range is touched and the bits are those of the body. */
#include "adam_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "reduce/simd_avx512.h"

/* 16 gradient elements of gtype at g[i] (lanes outside mask: 0), widened to
 * float (exact). 16-bit elements load through a 512-bit masked load of
 * words, of which the low half is used: AVX512BW without VL. */
AVX512_INLINE __m512 load_grad(const void *g, size_t i, int gtype, __mmask16 mask) {
  if (gtype == KT_ADAM_F32) return _mm512_maskz_loadu_ps(mask, (const float *)g + i);
  __m256i h = _mm512_castsi512_si256(
      _mm512_maskz_loadu_epi16((__mmask32)mask, (const uint16_t *)g + i));
  if (gtype == KT_ADAM_F16) return _mm512_cvtph_ps(h);
  return kt__bf16x16_widen(h);
}

AVX512_INLINE void store_copy(void *c, size_t i, int ctype, __m512 p, __mmask16 mask) {
  if (ctype == KT_ADAM_F32) {
    _mm512_mask_storeu_ps((float *)c + i, mask, p);
  } else if (ctype != KT_ADAM_COPY_NONE) {
    __m256i h = ctype == KT_ADAM_F16 ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT) : kt__bf16x16_narrow(p);
    _mm512_mask_storeu_epi16((uint16_t *)c + i, (__mmask32)mask, _mm512_castsi256_si512(h));
  }
}

/* The constants, broadcast once per call. */
typedef struct {
  __m512 decay, wd, b1, omb1, b2, omb2, bc2s, eps, nss;
} vconsts;

AVX512_INLINE vconsts broadcast(const kt__adam_consts *k) {
  vconsts v = {_mm512_set1_ps(k->decay), _mm512_set1_ps(k->wd), _mm512_set1_ps(k->beta1),
               _mm512_set1_ps(k->one_minus_beta1), _mm512_set1_ps(k->beta2),
               _mm512_set1_ps(k->one_minus_beta2), _mm512_set1_ps(k->bc2_sqrt),
               _mm512_set1_ps(k->eps), _mm512_set1_ps(k->neg_step_size)};
  return v;
}

/* Elements [i, i + 16) in mask: adam_impl.h's formula, op for op. Lanes
 * outside the mask compute on zeros and are not stored. */
AVX512_INLINE void step16(const vconsts *k, const kt__adam_bufs *b, size_t i, __mmask16 mask,
                          int gtype, int ctype, bool l2) {
  __m512 vp = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b->param + i), k->decay);
  __m512 vg = load_grad(b->grad, i, gtype, mask);
  if (l2) vg = _mm512_fmadd_ps(vp, k->wd, vg);
  __m512 vm = _mm512_fmadd_ps(vg, k->omb1,
                              _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b->exp_avg + i), k->b1));
  __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(k->omb2, vg), vg,
                              _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b->exp_avg_sq + i), k->b2));
  __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), k->bc2s), k->eps);
  vp = _mm512_add_ps(vp, _mm512_div_ps(_mm512_mul_ps(k->nss, vm), d));
  _mm512_mask_storeu_ps(b->param + i, mask, vp);
  _mm512_mask_storeu_ps(b->exp_avg + i, mask, vm);
  _mm512_mask_storeu_ps(b->exp_avg_sq + i, mask, vv);
  store_copy(b->copy, i, ctype, vp, mask);
}

AVX512_INLINE void run(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin, size_t end,
                       int gtype, int ctype, bool l2) {
  vconsts k = broadcast(c);
  size_t i = begin;
  for (; i + 16 <= end; i += 16) step16(&k, b, i, (__mmask16)0xffff, gtype, ctype, l2);
  if (i < end) step16(&k, b, i, (__mmask16)((1u << (end - i)) - 1u), gtype, ctype, l2);
}

KT_ADAM_ENTRY(kt__adam_avx512, AVX512_FN)

#else /* not x86-64: the family is never selected */

void kt__adam_avx512(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin,
                     size_t end) {
  (void)c;
  (void)b;
  (void)begin;
  (void)end;
}

#endif
