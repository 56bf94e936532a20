/* reduce_scalar.c - portable reduction kernels for every (dtype, op), written
 * as simple element loops that gcc -O3 vectorizes for the baseline ISA. They
 * are the reference family, and the tails of the SIMD families. */
#include "reduce_impl.h"

/* Element operations. Integer SUM/PROD go through the unsigned type of the
 * same width (for 8-bit types, unsigned int, which cannot overflow on a
 * product of two bytes) so that wrap-around is defined. */
#define ADD_WRAP(T, UT, x, y) ((T)(UT)((UT)(x) + (UT)(y)))
#define MUL_WRAP(T, UT, x, y) ((T)(UT)((UT)(x) * (UT)(y)))
#define EMIN(x, y) ((x) < (y) ? (x) : (y))
#define EMAX(x, y) ((x) > (y) ? (x) : (y))
/* Float min/max: NaN in either operand gives NaN. On equal values (including
 * -0 vs +0) the second operand is returned, as x86 MINPS/MAXPS do. */
#define FMIN_NAN(x, y) (((x) < (y) || (x) != (x)) ? (x) : (y))
#define FMAX_NAN(x, y) (((x) > (y) || (x) != (x)) ? (x) : (y))

/* A kernel: T elements, r = EXPR(x, y). Elements move through memcpy so
 * that unaligned buffers are defined behaviour (gcc still vectorizes it). No
 * restrict: dst may alias a or b exactly, and each element's operands are
 * read before its result is stored. */
#define KERNEL(name, T, EXPR)                                                \
  static void name(void *dst, const void *a, const void *b, size_t n) {      \
    unsigned char *d = dst;                                                  \
    const unsigned char *pa = a;                                             \
    const unsigned char *pb = b;                                             \
    for (size_t i = 0; i < n; i++) {                                         \
      T x, y, r;                                                             \
      memcpy(&x, pa + i * sizeof(T), sizeof(T));                             \
      memcpy(&y, pb + i * sizeof(T), sizeof(T));                             \
      r = EXPR;                                                              \
      memcpy(d + i * sizeof(T), &r, sizeof(T));                              \
    }                                                                        \
  }

/* Integer types: sum, prod, min, max, band, bor, bxor. */
#define INT_KERNELS(sfx, T, UT)                                              \
  KERNEL(sum_##sfx, T, ADD_WRAP(T, UT, x, y))                                \
  KERNEL(prod_##sfx, T, MUL_WRAP(T, UT, x, y))                               \
  KERNEL(min_##sfx, T, EMIN(x, y))                                           \
  KERNEL(max_##sfx, T, EMAX(x, y))                                           \
  KERNEL(band_##sfx, T, (T)(x & y))                                          \
  KERNEL(bor_##sfx, T, (T)(x | y))                                           \
  KERNEL(bxor_##sfx, T, (T)(x ^ y))

INT_KERNELS(i8, int8_t, unsigned)
INT_KERNELS(u8, uint8_t, unsigned)
INT_KERNELS(i32, int32_t, uint32_t)
INT_KERNELS(i64, int64_t, uint64_t)

/* Native floats. */
#define FLOAT_KERNELS(sfx, T)                                                \
  KERNEL(sum_##sfx, T, x + y)                                                \
  KERNEL(prod_##sfx, T, x * y)                                               \
  KERNEL(min_##sfx, T, FMIN_NAN(x, y))                                       \
  KERNEL(max_##sfx, T, FMAX_NAN(x, y))

FLOAT_KERNELS(f32, float)
FLOAT_KERNELS(f64, double)

/* 16-bit floats: widen to float, operate, round to nearest even. */
static inline float fmin_nan(float x, float y) { return FMIN_NAN(x, y); }
static inline float fmax_nan(float x, float y) { return FMAX_NAN(x, y); }

#define HALF_KERNELS(sfx, TO_F, FROM_F)                                      \
  KERNEL(sum_##sfx, uint16_t, FROM_F(TO_F(x) + TO_F(y)))                     \
  KERNEL(prod_##sfx, uint16_t, FROM_F(TO_F(x) * TO_F(y)))                    \
  KERNEL(min_##sfx, uint16_t, FROM_F(fmin_nan(TO_F(x), TO_F(y))))            \
  KERNEL(max_##sfx, uint16_t, FROM_F(fmax_nan(TO_F(x), TO_F(y))))

HALF_KERNELS(f16, kt__h2f, kt__f2h)
HALF_KERNELS(bf16, kt__b2f, kt__f2b)

/* Bool bytes: any nonzero byte is true; results are always 0 or 1. */
KERNEL(or_bool, uint8_t, (uint8_t)((x != 0) | (y != 0)))
KERNEL(and_bool, uint8_t, (uint8_t)((x != 0) & (y != 0)))
KERNEL(xor_bool, uint8_t, (uint8_t)((x != 0) ^ (y != 0)))

#define INT_ROW(sfx)                                                         \
  {[KT_SUM] = sum_##sfx, [KT_PROD] = prod_##sfx, [KT_MIN] = min_##sfx,       \
   [KT_MAX] = max_##sfx, [KT_AVG] = sum_##sfx, [KT_BAND] = band_##sfx,       \
   [KT_BOR] = bor_##sfx, [KT_BXOR] = bxor_##sfx}
#define FLOAT_ROW(sfx)                                                       \
  {[KT_SUM] = sum_##sfx, [KT_PROD] = prod_##sfx, [KT_MIN] = min_##sfx,       \
   [KT_MAX] = max_##sfx, [KT_AVG] = sum_##sfx}

const kt__reduce_fn kt__reduce_scalar_fns[KT_NUM_DTYPES][KT_NUM_OPS] = {
    [KT_INT8] = INT_ROW(i8),
    [KT_UINT8] = INT_ROW(u8),
    [KT_INT32] = INT_ROW(i32),
    [KT_INT64] = INT_ROW(i64),
    [KT_FLOAT16] = FLOAT_ROW(f16),
    [KT_BFLOAT16] = FLOAT_ROW(bf16),
    [KT_FLOAT32] = FLOAT_ROW(f32),
    [KT_FLOAT64] = FLOAT_ROW(f64),
    [KT_BOOL] = {[KT_SUM] = or_bool, [KT_PROD] = and_bool, [KT_MIN] = and_bool,
                 [KT_MAX] = or_bool, [KT_AVG] = or_bool, [KT_BAND] = and_bool,
                 [KT_BOR] = or_bool, [KT_BXOR] = xor_bool},
};
