/* reduce.h - element-wise reduction and conversion kernels. */
#ifndef KT_REDUCE_H
#define KT_REDUCE_H

#include "common.h"

/* dst[i] = a[i] OP b[i] for i < n. dst may equal a or b (exactly, not a
 * partial overlap). AVG reduces as SUM; kt__reduce_finalize divides. */
typedef void (*kt__reduce_fn)(void *dst, const void *a, const void *b, size_t n);

/* Kernel for (dtype, op), NULL when the pair is invalid (e.g. BAND on float).
 * Chosen once per process from the CPU's features. */
KT_INTERNAL kt__reduce_fn kt__reduce_kernel(kt_dtype dtype, kt_op op);
/* True when op applies to dtype. */
KT_INTERNAL bool kt__op_valid(kt_dtype dtype, kt_op op);
/* Convenience: look up and run. */
KT_INTERNAL void kt__reduce(void *dst, const void *a, const void *b, size_t n, kt_dtype dtype,
                            kt_op op);
/* After a SUM for AVG: divide n elements in place by nranks (integers truncate
 * toward zero; bool: unchanged). No-op for other ops. */
KT_INTERNAL void kt__reduce_finalize(void *buf, size_t n, kt_dtype dtype, kt_op op, int nranks);

/* IEEE half and bfloat16 <-> float, round to nearest even, NaN preserved. */
KT_INTERNAL float kt__half_to_float(uint16_t h);
KT_INTERNAL uint16_t kt__float_to_half(float f);
KT_INTERNAL float kt__bf16_to_float(uint16_t h);
KT_INTERNAL uint16_t kt__float_to_bf16(float f);

/* Space-separated CPU features the kernels can use ("sse2 avx2 f16c ..."),
 * and the kernel family in use ("scalar", "avx2", "avx512"). */
KT_INTERNAL const char *kt__cpu_features(void);
KT_INTERNAL const char *kt__reduce_impl_name(void);

#endif /* KT_REDUCE_H */
