/* reduce_avx2.c - AVX2 reduction kernels (with FMA/F16C), compiled through
 * target attributes so the file builds with the baseline flags; used only
 * when the CPU has AVX2, FMA and F16C. Tails go to the scalar kernels. */
#include "reduce_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_avx2.h"

/* A kernel: W elements of T per vector step. LOAD/STORE move one vector,
 * VOP combines two. The tail (n % W elements) runs the scalar kernel. */
#define KERNEL(name, T, W, DT, OP, VT, LOAD, STORE, VOP)                     \
  static AVX2_FN void name(void *dst, const void *a, const void *b, size_t n) { \
    unsigned char *d = dst; /* bytes: buffers need not be aligned */         \
    const unsigned char *pa = a, *pb = b;                                    \
    const size_t es = sizeof(T), vs = (W) * sizeof(T);                       \
    size_t i = 0;                                                            \
    for (; i + 2 * (W) <= n; i += 2 * (W)) {                                 \
      VT x0 = LOAD(pa + i * es), y0 = LOAD(pb + i * es);                     \
      VT x1 = LOAD(pa + i * es + vs), y1 = LOAD(pb + i * es + vs);           \
      STORE(d + i * es, VOP(x0, y0));                                        \
      STORE(d + i * es + vs, VOP(x1, y1));                                   \
    }                                                                        \
    for (; i + (W) <= n; i += (W))                                           \
      STORE(d + i * es, VOP(LOAD(pa + i * es), LOAD(pb + i * es)));          \
    if (i < n) kt__reduce_scalar_fns[DT][OP](d + i * es, pa + i * es, pb + i * es, n - i); \
  }

/* ---- loads and stores -------------------------------------------------- */

AVX2_INLINE __m256i ld_i(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
AVX2_INLINE void st_i(void *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
AVX2_INLINE __m256 ld_ps(const void *p) { return _mm256_loadu_ps((const float *)p); }
AVX2_INLINE void st_ps(void *p, __m256 v) { _mm256_storeu_ps((float *)p, v); }
AVX2_INLINE __m256d ld_pd(const void *p) { return _mm256_loadu_pd((const double *)p); }
AVX2_INLINE void st_pd(void *p, __m256d v) { _mm256_storeu_pd((double *)p, v); }

/* 8 half floats <-> 8 floats. */
AVX2_INLINE __m256 ld_f16(const void *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
AVX2_INLINE void st_f16(void *p, __m256 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* ---- element operations ----------------------------------------------- */

/* NaN in either operand gives NaN (a + b carries it); otherwise MINPS. */
AVX2_INLINE __m256 min_ps(__m256 a, __m256 b) {
  __m256 u = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_add_ps(a, b), u);
}
AVX2_INLINE __m256 max_ps(__m256 a, __m256 b) {
  __m256 u = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_add_ps(a, b), u);
}
AVX2_INLINE __m256d min_pd(__m256d a, __m256d b) {
  __m256d u = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_pd(_mm256_min_pd(a, b), _mm256_add_pd(a, b), u);
}
AVX2_INLINE __m256d max_pd(__m256d a, __m256d b) {
  __m256d u = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_pd(_mm256_max_pd(a, b), _mm256_add_pd(a, b), u);
}

/* Byte product mod 256: 16-bit multiplies of the even and the odd bytes (the
 * low byte of a 16-bit product depends only on the operands' low bytes). */
AVX2_INLINE __m256i mul_epi8(__m256i a, __m256i b) {
  __m256i even = _mm256_mullo_epi16(a, b);
  __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
  return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0x00ff)),
                         _mm256_slli_epi16(odd, 8));
}

/* 64-bit product mod 2^64 from 32x32->64 multiplies:
 * lo(a)lo(b) + ((lo(a)hi(b) + hi(a)lo(b)) << 32). */
AVX2_INLINE __m256i mul_epi64(__m256i a, __m256i b) {
  __m256i lolo = _mm256_mul_epu32(a, b);
  __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                   _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(lolo, _mm256_slli_epi64(cross, 32));
}
AVX2_INLINE __m256i min_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}
AVX2_INLINE __m256i max_epi64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
}

/* Bool bytes: compare with zero, combine, turn the masks into 0/1. */
AVX2_INLINE __m256i is_zero(__m256i v) { return _mm256_cmpeq_epi8(v, _mm256_setzero_si256()); }
AVX2_INLINE __m256i or_bool(__m256i a, __m256i b) {
  return _mm256_andnot_si256(is_zero(_mm256_or_si256(a, b)), _mm256_set1_epi8(1));
}
AVX2_INLINE __m256i and_bool(__m256i a, __m256i b) {
  return _mm256_andnot_si256(_mm256_or_si256(is_zero(a), is_zero(b)), _mm256_set1_epi8(1));
}
AVX2_INLINE __m256i xor_bool(__m256i a, __m256i b) {
  return _mm256_and_si256(_mm256_xor_si256(is_zero(a), is_zero(b)), _mm256_set1_epi8(1));
}

/* ---- kernels ----------------------------------------------------------- */

#define KI(name, T, DT, OP, VOP) KERNEL(name, T, 32 / sizeof(T), DT, OP, __m256i, ld_i, st_i, VOP)

KI(sum_i8, int8_t, KT_INT8, KT_SUM, _mm256_add_epi8)
KI(prod_i8, int8_t, KT_INT8, KT_PROD, mul_epi8)
KI(min_i8, int8_t, KT_INT8, KT_MIN, _mm256_min_epi8)
KI(max_i8, int8_t, KT_INT8, KT_MAX, _mm256_max_epi8)
KI(sum_u8, uint8_t, KT_UINT8, KT_SUM, _mm256_add_epi8)
KI(prod_u8, uint8_t, KT_UINT8, KT_PROD, mul_epi8)
KI(min_u8, uint8_t, KT_UINT8, KT_MIN, _mm256_min_epu8)
KI(max_u8, uint8_t, KT_UINT8, KT_MAX, _mm256_max_epu8)
KI(sum_i32, int32_t, KT_INT32, KT_SUM, _mm256_add_epi32)
KI(prod_i32, int32_t, KT_INT32, KT_PROD, _mm256_mullo_epi32)
KI(min_i32, int32_t, KT_INT32, KT_MIN, _mm256_min_epi32)
KI(max_i32, int32_t, KT_INT32, KT_MAX, _mm256_max_epi32)
KI(sum_i64, int64_t, KT_INT64, KT_SUM, _mm256_add_epi64)
KI(prod_i64, int64_t, KT_INT64, KT_PROD, mul_epi64)
KI(min_i64, int64_t, KT_INT64, KT_MIN, min_epi64)
KI(max_i64, int64_t, KT_INT64, KT_MAX, max_epi64)

/* Bitwise ops do not care about the element size, only about the tail's
 * scalar kernel; one per integer dtype. */
#define BITWISE(sfx, T, DT)                                                  \
  KI(band_##sfx, T, DT, KT_BAND, _mm256_and_si256)                           \
  KI(bor_##sfx, T, DT, KT_BOR, _mm256_or_si256)                              \
  KI(bxor_##sfx, T, DT, KT_BXOR, _mm256_xor_si256)
BITWISE(i8, int8_t, KT_INT8)
BITWISE(u8, uint8_t, KT_UINT8)
BITWISE(i32, int32_t, KT_INT32)
BITWISE(i64, int64_t, KT_INT64)

KI(or_bool_k, uint8_t, KT_BOOL, KT_BOR, or_bool)
KI(and_bool_k, uint8_t, KT_BOOL, KT_BAND, and_bool)
KI(xor_bool_k, uint8_t, KT_BOOL, KT_BXOR, xor_bool)

KERNEL(sum_f32, float, 8, KT_FLOAT32, KT_SUM, __m256, ld_ps, st_ps, _mm256_add_ps)
KERNEL(prod_f32, float, 8, KT_FLOAT32, KT_PROD, __m256, ld_ps, st_ps, _mm256_mul_ps)
KERNEL(min_f32, float, 8, KT_FLOAT32, KT_MIN, __m256, ld_ps, st_ps, min_ps)
KERNEL(max_f32, float, 8, KT_FLOAT32, KT_MAX, __m256, ld_ps, st_ps, max_ps)
KERNEL(sum_f64, double, 4, KT_FLOAT64, KT_SUM, __m256d, ld_pd, st_pd, _mm256_add_pd)
KERNEL(prod_f64, double, 4, KT_FLOAT64, KT_PROD, __m256d, ld_pd, st_pd, _mm256_mul_pd)
KERNEL(min_f64, double, 4, KT_FLOAT64, KT_MIN, __m256d, ld_pd, st_pd, min_pd)
KERNEL(max_f64, double, 4, KT_FLOAT64, KT_MAX, __m256d, ld_pd, st_pd, max_pd)

#define HALF(sfx, DT, LD, ST)                                                \
  KERNEL(sum_##sfx, uint16_t, 8, DT, KT_SUM, __m256, LD, ST, _mm256_add_ps)  \
  KERNEL(prod_##sfx, uint16_t, 8, DT, KT_PROD, __m256, LD, ST, _mm256_mul_ps) \
  KERNEL(min_##sfx, uint16_t, 8, DT, KT_MIN, __m256, LD, ST, min_ps)         \
  KERNEL(max_##sfx, uint16_t, 8, DT, KT_MAX, __m256, LD, ST, max_ps)
HALF(f16, KT_FLOAT16, ld_f16, st_f16)

/* bfloat16, 16 per vector, without moving elements across lanes: a 32-bit
 * lane holds two, the even one in its low half and the odd one in its high
 * half. As floats, the odd one is the lane with its low half cleared and the
 * even one the lane shifted up by 16; each is operated on, rounded, and put
 * back in its half, with no cross-lane shuffle (widening 8 to 8 floats and
 * packing them back took several: a sum of 32 KiB in cache went from 9.9
 * to 13.1 GB/s with this family on an AVX-512 Xeon). */
#define BF16_OP(name, FOP)                                                   \
  AVX2_INLINE __m256i name(__m256i a, __m256i b) {                           \
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);                  \
    __m256 even = FOP(_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)),         \
                      _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)));        \
    __m256 odd = FOP(_mm256_castsi256_ps(_mm256_and_si256(a, hi)),           \
                     _mm256_castsi256_ps(_mm256_and_si256(b, hi)));          \
    return _mm256_blend_epi16(_mm256_srli_epi32(kt__bf16x8_round(even), 16), \
                              kt__bf16x8_round(odd), 0xaa);                  \
  }
BF16_OP(sum_bf16v, _mm256_add_ps)
BF16_OP(prod_bf16v, _mm256_mul_ps)
BF16_OP(min_bf16v, min_ps)
BF16_OP(max_bf16v, max_ps)
KI(sum_bf16, uint16_t, KT_BFLOAT16, KT_SUM, sum_bf16v)
KI(prod_bf16, uint16_t, KT_BFLOAT16, KT_PROD, prod_bf16v)
KI(min_bf16, uint16_t, KT_BFLOAT16, KT_MIN, min_bf16v)
KI(max_bf16, uint16_t, KT_BFLOAT16, KT_MAX, max_bf16v)

#define SET_ARITH(fns, DT, sfx)                                              \
  do {                                                                       \
    fns[DT][KT_SUM] = sum_##sfx;                                             \
    fns[DT][KT_AVG] = sum_##sfx;                                             \
    fns[DT][KT_PROD] = prod_##sfx;                                           \
    fns[DT][KT_MIN] = min_##sfx;                                             \
    fns[DT][KT_MAX] = max_##sfx;                                             \
  } while (0)
#define SET_BITWISE(fns, DT, sfx)                                            \
  do {                                                                       \
    fns[DT][KT_BAND] = band_##sfx;                                           \
    fns[DT][KT_BOR] = bor_##sfx;                                             \
    fns[DT][KT_BXOR] = bxor_##sfx;                                           \
  } while (0)

void kt__reduce_fill_avx2(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]) {
  SET_ARITH(fns, KT_INT8, i8);
  SET_ARITH(fns, KT_UINT8, u8);
  SET_ARITH(fns, KT_INT32, i32);
  SET_ARITH(fns, KT_INT64, i64);
  SET_ARITH(fns, KT_FLOAT16, f16);
  SET_ARITH(fns, KT_BFLOAT16, bf16);
  SET_ARITH(fns, KT_FLOAT32, f32);
  SET_ARITH(fns, KT_FLOAT64, f64);
  SET_BITWISE(fns, KT_INT8, i8);
  SET_BITWISE(fns, KT_UINT8, u8);
  SET_BITWISE(fns, KT_INT32, i32);
  SET_BITWISE(fns, KT_INT64, i64);
  fns[KT_BOOL][KT_SUM] = fns[KT_BOOL][KT_MAX] = fns[KT_BOOL][KT_AVG] = or_bool_k;
  fns[KT_BOOL][KT_BOR] = or_bool_k;
  fns[KT_BOOL][KT_PROD] = fns[KT_BOOL][KT_MIN] = fns[KT_BOOL][KT_BAND] = and_bool_k;
  fns[KT_BOOL][KT_BXOR] = xor_bool_k;
}

#else /* not x86-64: the family is never selected */

void kt__reduce_fill_avx2(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]) { (void)fns; }

#endif
