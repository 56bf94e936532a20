/* simd_avx512.h - what the AVX-512 kernels of src/reduce and src/optim share:
 * the target attributes (the files build with the baseline flags; the
 * kernels run only when the CPU and OS have AVX512F and AVX512BW) and the
 * bfloat16 conversions. Include after <immintrin.h>, in x86-64 builds only. */
#ifndef KT_SIMD_AVX512_H
#define KT_SIMD_AVX512_H

#define AVX512_TARGET "avx512f,avx512bw,avx2,fma,f16c"
#define AVX512_FN __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

/* 16 bfloat16 -> 16 floats (exact). */
AVX512_INLINE __m512 kt__bf16x16_widen(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* 16 floats rounded to bfloat16 in place: each lane's upper 16 bits are
 * its bfloat16 (round to nearest even, NaN stays a quiet NaN); the lower
 * 16 are not cleared. */
AVX512_INLINE __m512i kt__bf16x16_round(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, bits, _mm512_set1_epi32(0x00400000));
}

/* 16 floats -> 16 bfloat16, round to nearest even, NaN stays a quiet NaN. */
AVX512_INLINE __m256i kt__bf16x16_narrow(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(kt__bf16x16_round(v), 16));
}

#endif
