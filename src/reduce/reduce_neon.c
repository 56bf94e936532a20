/* reduce_neon.c - AArch64 Advanced SIMD reduction kernels for the common
 * float and integer cases; everything else keeps the scalar kernels (which
 * gcc vectorizes for NEON at -O3). Tails go to the scalar kernels. */
#include "reduce_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>

/* W elements of T per step; VOP combines two vectors. */
#define KERNEL(name, T, W, DT, OP, LOAD, STORE, VOP)                         \
  static void name(void *dst, const void *a, const void *b, size_t n) {      \
    unsigned char *d = dst; /* bytes: buffers need not be aligned */         \
    const unsigned char *pa = a, *pb = b;                                    \
    const size_t es = sizeof(T);                                             \
    size_t i = 0;                                                            \
    for (; i + (W) <= n; i += (W))                                           \
      STORE((T *)(void *)(d + i * es),                                       \
            VOP(LOAD((const T *)(const void *)(pa + i * es)),                \
                LOAD((const T *)(const void *)(pb + i * es))));              \
    if (i < n) kt__reduce_scalar_fns[DT][OP](d + i * es, pa + i * es, pb + i * es, n - i); \
  }

/* FMIN/FMAX return NaN when either operand is NaN, as required. */
KERNEL(sum_f32, float, 4, KT_FLOAT32, KT_SUM, vld1q_f32, vst1q_f32, vaddq_f32)
KERNEL(prod_f32, float, 4, KT_FLOAT32, KT_PROD, vld1q_f32, vst1q_f32, vmulq_f32)
KERNEL(min_f32, float, 4, KT_FLOAT32, KT_MIN, vld1q_f32, vst1q_f32, vminq_f32)
KERNEL(max_f32, float, 4, KT_FLOAT32, KT_MAX, vld1q_f32, vst1q_f32, vmaxq_f32)
KERNEL(sum_f64, double, 2, KT_FLOAT64, KT_SUM, vld1q_f64, vst1q_f64, vaddq_f64)
KERNEL(prod_f64, double, 2, KT_FLOAT64, KT_PROD, vld1q_f64, vst1q_f64, vmulq_f64)
KERNEL(min_f64, double, 2, KT_FLOAT64, KT_MIN, vld1q_f64, vst1q_f64, vminq_f64)
KERNEL(max_f64, double, 2, KT_FLOAT64, KT_MAX, vld1q_f64, vst1q_f64, vmaxq_f64)
KERNEL(sum_i32, int32_t, 4, KT_INT32, KT_SUM, vld1q_s32, vst1q_s32, vaddq_s32)
KERNEL(prod_i32, int32_t, 4, KT_INT32, KT_PROD, vld1q_s32, vst1q_s32, vmulq_s32)
KERNEL(min_i32, int32_t, 4, KT_INT32, KT_MIN, vld1q_s32, vst1q_s32, vminq_s32)
KERNEL(max_i32, int32_t, 4, KT_INT32, KT_MAX, vld1q_s32, vst1q_s32, vmaxq_s32)
KERNEL(sum_i64, int64_t, 2, KT_INT64, KT_SUM, vld1q_s64, vst1q_s64, vaddq_s64)

void kt__reduce_fill_neon(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]) {
  fns[KT_FLOAT32][KT_SUM] = fns[KT_FLOAT32][KT_AVG] = sum_f32;
  fns[KT_FLOAT32][KT_PROD] = prod_f32;
  fns[KT_FLOAT32][KT_MIN] = min_f32;
  fns[KT_FLOAT32][KT_MAX] = max_f32;
  fns[KT_FLOAT64][KT_SUM] = fns[KT_FLOAT64][KT_AVG] = sum_f64;
  fns[KT_FLOAT64][KT_PROD] = prod_f64;
  fns[KT_FLOAT64][KT_MIN] = min_f64;
  fns[KT_FLOAT64][KT_MAX] = max_f64;
  fns[KT_INT32][KT_SUM] = fns[KT_INT32][KT_AVG] = sum_i32;
  fns[KT_INT32][KT_PROD] = prod_i32;
  fns[KT_INT32][KT_MIN] = min_i32;
  fns[KT_INT32][KT_MAX] = max_i32;
  fns[KT_INT64][KT_SUM] = fns[KT_INT64][KT_AVG] = sum_i64;
}

#else /* not AArch64: the family is never selected */

void kt__reduce_fill_neon(kt__reduce_fn fns[KT_NUM_DTYPES][KT_NUM_OPS]) { (void)fns; }

#endif
