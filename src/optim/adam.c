/* adam.c - kt_adam_step: checks the arguments, computes the step's scalars
 * as torch does, picks the kernel family (CPU features, KAITIAN_OPTIM_IMPL)
 * and splits the elements across the pool's threads. */
#include "adam_impl.h"

#include "reduce/reduce_impl.h" /* the CPU's SIMD families */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Fewest elements worth a thread of their own (~1.8 MB of traffic): below
 * it, waking a worker costs more than the work it takes over. */
#define GRAIN 65536
/* Part boundaries fall on multiples of this many elements, so that parts
 * share no cache line of any buffer (64 bytes of fp32 or fp16 elements). */
#define ALIGN_ELEMS 64

static const char *const family_names[KT_ADAM_NUM_FAMILIES] = {"scalar", "avx2", "avx512"};

const char *kt__adam_family_name(int family) {
  if (family < 0 || family >= KT_ADAM_NUM_FAMILIES) return "?";
  return family_names[family];
}

/* The SIMD families need what src/reduce's do (AVX2 + FMA + F16C; AVX-512
 * F + BW), so its CPU detection decides. */
kt__adam_fn kt__adam_family_fn(int family) {
  switch (family) {
    case KT_ADAM_SCALAR: return kt__adam_scalar;
    case KT_ADAM_AVX2: return kt__reduce_family_table(KT_REDUCE_AVX2) ? kt__adam_avx2 : NULL;
    case KT_ADAM_AVX512: return kt__reduce_family_table(KT_REDUCE_AVX512) ? kt__adam_avx512 : NULL;
    default: return NULL;
  }
}

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;
static int chosen = KT_ADAM_SCALAR;
static kt_result chosen_result = KT_SUCCESS;
static char chosen_error[256];

static void choose(void) {
  kt__log_init();
  for (int f = KT_ADAM_NUM_FAMILIES - 1; f >= 0; f--) {
    if (kt__adam_family_fn(f)) {
      chosen = f;
      break;
    }
  }
  const char *forced = kt__param_OPTIM_IMPL();
  if (forced && *forced) {
    int f = -1;
    for (int i = 0; i < KT_ADAM_NUM_FAMILIES; i++)
      if (strcasecmp(forced, family_names[i]) == 0) f = i;
    if (f < 0) {
      chosen_result = KT_ERR_INVALID_ARGUMENT;
      snprintf(chosen_error, sizeof chosen_error,
               "KAITIAN_OPTIM_IMPL=%s is not a kernel family (expected scalar, avx2 or avx512)",
               forced);
    } else if (!kt__adam_family_fn(f)) {
      chosen_result = KT_ERR_UNSUPPORTED;
      snprintf(chosen_error, sizeof chosen_error,
               "KAITIAN_OPTIM_IMPL=%s, but this CPU or build lacks it (CPU features: %s)",
               forced, *kt__cpu_features() ? kt__cpu_features() : "none");
    } else {
      chosen = f;
    }
  }
  if (chosen_result == KT_SUCCESS) KT_INFO("optimizer kernels: %s", family_names[chosen]);
}

kt_result kt__adam_active_family(int *family) {
  pthread_once(&choose_once, choose);
  *family = chosen;
  if (chosen_result != KT_SUCCESS) return kt__err(chosen_result, "kt_adam_step: %s", chosen_error);
  return KT_SUCCESS;
}

/* ---- arguments ---------------------------------------------------------- */

/* x finite and >= 0 (lr, eps, weight_decay). */
static kt_result check_nonneg(const char *what, double x) {
  if (isfinite(x) && x >= 0.0) return KT_SUCCESS;
  return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: %s = %g must be finite and >= 0", what, x);
}

/* x in [0, 1) (the betas; NaN fails both comparisons). */
static kt_result check_beta(const char *what, double x) {
  if (x >= 0.0 && x < 1.0) return KT_SUCCESS;
  return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: %s = %g is outside [0, 1)", what, x);
}

static kt_result check_config(const kt_adam_config *cfg) {
  if (!cfg) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: cfg is NULL");
  if (cfg->struct_size != sizeof(kt_adam_config))
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_adam_step: cfg->struct_size is %zu, expected %zu (use KT_ADAM_CONFIG_INIT)",
                   cfg->struct_size, sizeof(kt_adam_config));
  KT_CHECK(check_nonneg("lr", cfg->lr));
  KT_CHECK(check_beta("beta1", cfg->beta1));
  KT_CHECK(check_beta("beta2", cfg->beta2));
  KT_CHECK(check_nonneg("eps", cfg->eps));
  KT_CHECK(check_nonneg("weight_decay", cfg->weight_decay));
  if (cfg->step < 1)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_adam_step: step = %lld, expected >= 1 (the first step is 1)",
                   (long long)cfg->step);
  if (cfg->threads < 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_adam_step: threads = %d, expected >= 0 (0: automatic)", cfg->threads);
  return KT_SUCCESS;
}

/* fp32, fp16 and bf16 only: *type gets the kernels' name for it. */
static kt_result check_dtype(const char *what, kt_dtype dt, int *type) {
  switch (dt) {
    case KT_FLOAT32: *type = KT_ADAM_F32; return KT_SUCCESS;
    case KT_FLOAT16: *type = KT_ADAM_F16; return KT_SUCCESS;
    case KT_BFLOAT16: *type = KT_ADAM_BF16; return KT_SUCCESS;
    default: break;
  }
  return kt__err(KT_ERR_INVALID_ARGUMENT,
                 "kt_adam_step: %s dtype %s (%d) is not supported (float32, float16 or bfloat16)",
                 what, kt_dtype_name(dt), (int)dt);
}

typedef struct {
  const char *name;
  const void *ptr;
  size_t bytes;
} span;

/* Every buffer present (n > 0), and no two overlapping. */
static kt_result check_buffers(const span *s, int count) {
  for (int i = 0; i < count; i++) {
    if (!s[i].ptr)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: %s is NULL but n > 0", s[i].name);
    uintptr_t a0 = (uintptr_t)s[i].ptr, a1 = a0 + s[i].bytes;
    if (a1 < a0)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: %s: %zu bytes past %p wrap around",
                     s[i].name, s[i].bytes, s[i].ptr);
    for (int j = 0; j < i; j++) {
      uintptr_t b0 = (uintptr_t)s[j].ptr, b1 = b0 + s[j].bytes;
      if (a0 < b1 && b0 < a1)
        return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: %s and %s overlap", s[j].name,
                       s[i].name);
    }
  }
  return KT_SUCCESS;
}

static kt_result check_args(const kt_adam_config *cfg, kt__adam_bufs *b, kt_dtype grad_dtype,
                            kt_dtype copy_dtype, size_t n) {
  KT_CHECK(check_config(cfg));
  KT_CHECK(check_dtype("grad", grad_dtype, &b->gtype));
  b->ctype = KT_ADAM_COPY_NONE;
  if (b->copy) KT_CHECK(check_dtype("param_copy", copy_dtype, &b->ctype));
  if (n > (size_t)PTRDIFF_MAX / sizeof(float))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_adam_step: n = %zu elements overflows", n);
  if (n == 0) return KT_SUCCESS;
  size_t gs = b->gtype == KT_ADAM_F32 ? 4 : 2, cs = b->ctype == KT_ADAM_F32 ? 4 : 2;
  span s[5] = {{"param", b->param, 4 * n}, {"grad", b->grad, gs * n},
               {"exp_avg", b->exp_avg, 4 * n}, {"exp_avg_sq", b->exp_avg_sq, 4 * n},
               {"param_copy", b->copy, cs * n}};
  return check_buffers(s, b->copy ? 5 : 4);
}

/* ---- the step ----------------------------------------------------------- */

/* The scalars, each computed in double (torch's Python floats) and rounded
 * to float once (as the tensor op that takes it does). */
static void make_consts(const kt_adam_config *cfg, kt__adam_consts *k) {
  double bc1 = 1.0, bc2 = 1.0;
  if (cfg->bias_correction) {
    bc1 = 1.0 - pow(cfg->beta1, (double)cfg->step);
    bc2 = 1.0 - pow(cfg->beta2, (double)cfg->step);
  }
  k->decay = cfg->adamw ? (float)(1.0 - cfg->lr * cfg->weight_decay) : 1.0f;
  k->l2 = !cfg->adamw && cfg->weight_decay != 0.0;
  k->wd = (float)cfg->weight_decay;
  k->beta1 = (float)cfg->beta1;
  k->one_minus_beta1 = (float)(1.0 - cfg->beta1);
  k->beta2 = (float)cfg->beta2;
  k->one_minus_beta2 = (float)(1.0 - cfg->beta2);
  k->bc2_sqrt = (float)sqrt(bc2);
  k->eps = (float)cfg->eps;
  k->neg_step_size = (float)(-(cfg->lr / bc1));
}

typedef struct {
  kt__adam_fn fn;
  const kt__adam_consts *k;
  const kt__adam_bufs *b;
  size_t n;
} job;

/* Part i of p: [n*i/p, n*(i+1)/p), boundaries rounded down to ALIGN_ELEMS. */
static size_t part_start(size_t n, int i, int p) {
  if (i >= p) return n;
  size_t q = n / (size_t)p, r = n % (size_t)p; /* n*i/p without overflow */
  size_t at = q * (size_t)i + r * (size_t)i / (size_t)p;
  return at - at % ALIGN_ELEMS;
}

static void run_part(void *arg, int part, int nparts) {
  const job *j = arg;
  size_t begin = part_start(j->n, part, nparts), end = part_start(j->n, part + 1, nparts);
  if (begin < end) j->fn(j->k, j->b, begin, end);
}

/* Threads for n elements: cfg->threads, else KAITIAN_OPTIM_THREADS, else
 * the CPUs we may run on; never more than GRAIN elements each allow. */
static int thread_count(const kt_adam_config *cfg, size_t n) {
  size_t most = n / GRAIN;
  if (most < 2) return 1;
  int64_t t = cfg->threads;
  if (t <= 0) t = kt__param_OPTIM_THREADS();
  if (t <= 0) t = kt__optim_cpus();
  return (int)((size_t)t < most ? (size_t)t : most);
}

kt_result kt__adam_step_family(int family, const kt_adam_config *cfg, float *param,
                               const void *grad, kt_dtype grad_dtype, float *exp_avg,
                               float *exp_avg_sq, void *param_copy, kt_dtype copy_dtype,
                               size_t n) {
  kt__adam_bufs b = {param, grad, exp_avg, exp_avg_sq, param_copy, 0, 0};
  KT_CHECK(check_args(cfg, &b, grad_dtype, copy_dtype, n));
  kt__adam_fn fn = kt__adam_family_fn(family);
  if (!fn)
    return kt__err(KT_ERR_UNSUPPORTED, "kt_adam_step: kernel family %s: this CPU or build lacks it",
                   kt__adam_family_name(family));
  if (n == 0) return KT_SUCCESS;
  kt__adam_consts k;
  make_consts(cfg, &k);
  job j = {fn, &k, &b, n};
  kt__optim_parallel(run_part, &j, thread_count(cfg, n));
  return KT_SUCCESS;
}

kt_result kt_adam_step(const kt_adam_config *cfg, float *param, const void *grad,
                       kt_dtype grad_dtype, float *exp_avg, float *exp_avg_sq, void *param_copy,
                       kt_dtype copy_dtype, size_t n) {
  kt__clear_error();
  int family;
  KT_CHECK(kt__adam_active_family(&family));
  return kt__adam_step_family(family, cfg, param, grad, grad_dtype, exp_avg, exp_avg_sq,
                              param_copy, copy_dtype, n);
}
