/* simd_avx2.h - what the AVX2 kernels of src/reduce and src/optim share: the
 * target attributes (the files build with the baseline flags; the kernels run
 * only when the CPU has AVX2, FMA and F16C) and the bfloat16 conversions.
 * Include after <immintrin.h>, in x86-64 builds only. */
#ifndef KT_SIMD_AVX2_H
#define KT_SIMD_AVX2_H

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* 8 bfloat16 -> 8 floats (exact: the bf16 bits are the float's upper half). */
AVX2_INLINE __m256 kt__bf16x8_widen(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 floats rounded to bfloat16 in place: each lane's upper 16 bits are its
 * bfloat16 (round to nearest even, NaN stays a quiet NaN); the lower 16 are
 * not cleared. */
AVX2_INLINE __m256i kt__bf16x8_round(__m256 v) {
  __m256i bits = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

/* 8 floats -> 8 bfloat16, round to nearest even, NaN stays a quiet NaN. */
AVX2_INLINE __m128i kt__bf16x8_narrow(__m256 v) {
  __m256i r = _mm256_srli_epi32(kt__bf16x8_round(v), 16);
  /* pack within 128-bit lanes, then gather qwords 0 and 2 into the low half */
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

#endif
