/* adam_impl.h - private to src/optim and its tests: the Adam kernel families
 * (scalar, AVX2, AVX-512), the per-call constants they share, and the pool of
 * threads a step is split across. */
#ifndef KT_ADAM_IMPL_H
#define KT_ADAM_IMPL_H

#include "common.h"

/* Kernel families, in increasing order of preference. */
enum { KT_ADAM_SCALAR = 0, KT_ADAM_AVX2 = 1, KT_ADAM_AVX512 = 2, KT_ADAM_NUM_FAMILIES };

/* Element types of the gradient and of the optional copy, as the kernels
 * see them (KT_ADAM_COPY_NONE: no copy). */
enum { KT_ADAM_F32 = 0, KT_ADAM_F16 = 1, KT_ADAM_BF16 = 2, KT_ADAM_COPY_NONE = 3 };

/* The scalars of one step, computed in double and rounded to float once,
 * as torch rounds the Python floats it passes to its tensor ops. */
typedef struct kt__adam_consts {
  float decay;         /* AdamW: 1 - lr * wd; Adam: 1 (p * 1 == p) */
  float wd;            /* Adam's L2 term (used when l2) */
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bc2_sqrt;      /* sqrt(1 - beta2^step), or 1 */
  float eps;
  float neg_step_size; /* -lr / (1 - beta1^step), or -lr */
  bool l2;             /* Adam with weight_decay != 0: g = fma(p, wd, g) */
} kt__adam_consts;

/* The buffers of one call; grad and copy hold elements of gtype / ctype. */
typedef struct kt__adam_bufs {
  float *param;
  const void *grad;
  float *exp_avg;
  float *exp_avg_sq;
  void *copy;
  int gtype; /* KT_ADAM_F32, F16 or BF16 */
  int ctype; /* KT_ADAM_F32, F16, BF16 or COPY_NONE */
} kt__adam_bufs;

/* A family's kernel: elements [begin, end) of b. No element outside that
 * range is read or written. */
typedef void (*kt__adam_fn)(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin,
                            size_t end);

KT_INTERNAL void kt__adam_scalar(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin,
                                 size_t end);
/* Only called when the CPU has the family (kt__adam_family_fn checks). */
KT_INTERNAL void kt__adam_avx2(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin,
                               size_t end);
KT_INTERNAL void kt__adam_avx512(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin,
                                 size_t end);

/* Defines `void NAME(c, b, begin, end)`, a family's entry point, over the
 * family's `run(c, b, begin, end, gtype, ctype, l2)`: every combination of
 * gradient type, copy type and L2 term is a call with constant arguments, so
 * the inlined run() has no branch on them in its loop. ATTR: the target
 * attribute of the family (empty for scalar). */
#define KT_ADAM_COPY_CASES(g, l2)                                          \
  switch (b->ctype) {                                                      \
    case KT_ADAM_F32: run(c, b, begin, end, g, KT_ADAM_F32, l2); break;    \
    case KT_ADAM_F16: run(c, b, begin, end, g, KT_ADAM_F16, l2); break;    \
    case KT_ADAM_BF16: run(c, b, begin, end, g, KT_ADAM_BF16, l2); break;  \
    default: run(c, b, begin, end, g, KT_ADAM_COPY_NONE, l2); break;       \
  }
#define KT_ADAM_GRAD_CASES(l2)                                             \
  switch (b->gtype) {                                                      \
    case KT_ADAM_F16: KT_ADAM_COPY_CASES(KT_ADAM_F16, l2); break;          \
    case KT_ADAM_BF16: KT_ADAM_COPY_CASES(KT_ADAM_BF16, l2); break;        \
    default: KT_ADAM_COPY_CASES(KT_ADAM_F32, l2); break;                   \
  }
#define KT_ADAM_ENTRY(NAME, ATTR)                                                           \
  static ATTR void NAME##_l2(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin, \
                             size_t end) {                                                  \
    KT_ADAM_GRAD_CASES(true)                                                                \
  }                                                                                         \
  static ATTR void NAME##_plain(const kt__adam_consts *c, const kt__adam_bufs *b,           \
                                size_t begin, size_t end) {                                 \
    KT_ADAM_GRAD_CASES(false)                                                               \
  }                                                                                         \
  void NAME(const kt__adam_consts *c, const kt__adam_bufs *b, size_t begin, size_t end) {   \
    if (c->l2)                                                                              \
      NAME##_l2(c, b, begin, end);                                                          \
    else                                                                                    \
      NAME##_plain(c, b, begin, end);                                                       \
  }

/* The kernel of a family, NULL when this build or CPU lacks it. */
KT_INTERNAL kt__adam_fn kt__adam_family_fn(int family);
/* "scalar", "avx2", "avx512"; "?" for an unknown family. */
KT_INTERNAL const char *kt__adam_family_name(int family);
/* The family kt_adam_step uses (KAITIAN_OPTIM_IMPL or the best the CPU has);
 * KT_ERR_* with the reason in kt_last_error() when the forced one is
 * unknown or unavailable. */
KT_INTERNAL kt_result kt__adam_active_family(int *family);
/* kt_adam_step with the family given (tests compare the families). */
KT_INTERNAL kt_result kt__adam_step_family(int family, const kt_adam_config *cfg, float *param,
                                           const void *grad, kt_dtype grad_dtype, float *exp_avg,
                                           float *exp_avg_sq, void *param_copy,
                                           kt_dtype copy_dtype, size_t n);

/* ---- the pool (pool.c) ------------------------------------------------- */

/* Part `part` of `nparts` of a job. */
typedef void (*kt__optim_task_fn)(void *arg, int part, int nparts);

/* Run fn(arg, i, p) for every i < p, where p <= nparts is the number of
 * threads the pool could give (1 when another call holds the pool, or no
 * thread could be started): part 0 on the calling thread, the others on
 * the pool's workers (started on first need, kept for later calls; a fork
 * child starts afresh). Returns when every part has returned. */
KT_INTERNAL void kt__optim_parallel(kt__optim_task_fn fn, void *arg, int nparts);

/* CPUs in the calling thread's affinity mask (at least 1). */
KT_INTERNAL int kt__optim_cpus(void);

#endif /* KT_ADAM_IMPL_H */
