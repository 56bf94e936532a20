/* test_optim.c - checks kt_adam_step: every kernel family this CPU has,
 * bit for bit against a float32 reference written op for op with libm's
 * fmaf/sqrtf, and within rounding of a float64 evaluation of the formula;
 * odd lengths and unaligned buffers with canaries around them; every grad
 * and copy dtype, Adam and AdamW, weight decay and bias correction on and
 * off; thread counts, concurrent callers and a fork; every argument error
 * and its message.
 *
 * Usage: test_optim            every family through the internal entry,
 *                              threads, concurrency, fork, bad arguments
 *        test_optim --env      the public entry under KAITIAN_OPTIM_IMPL (set
 *                              or not): the forced family runs the whole
 *                              matrix, or fails as documented when the CPU
 *                              lacks it or the name is unknown
 * KT_TEST_SEED=<n> changes the random data; the seed is printed. */
#include "optim/adam_impl.h"
#include "reduce/reduce.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

static _Atomic int failures;

#define FAIL(...)                                                            \
  do {                                                                       \
    failures++;                                                              \
    fprintf(stderr, "FAIL: " __VA_ARGS__);                                   \
    fputc('\n', stderr);                                                     \
  } while (0)

/* ---- random numbers (xorshift64*) ------------------------------------- */

static _Thread_local uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545f4914f6cdd1dull;
}
static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double rnd_sym(void) { return 2.0 * rnd_unit() - 1.0; }

static const kt_dtype dtypes[3] = {KT_FLOAT32, KT_FLOAT16, KT_BFLOAT16};
static size_t dsize(kt_dtype dt) { return dt == KT_FLOAT32 ? 4 : 2; }

static float to_float(kt_dtype dt, const unsigned char *p) {
  float f;
  uint16_t h;
  if (dt == KT_FLOAT32) {
    memcpy(&f, p, 4);
    return f;
  }
  memcpy(&h, p, 2);
  return dt == KT_FLOAT16 ? kt__half_to_float(h) : kt__bf16_to_float(h);
}

static void from_float(kt_dtype dt, unsigned char *p, float f) {
  if (dt == KT_FLOAT32) {
    memcpy(p, &f, 4);
    return;
  }
  uint16_t h = dt == KT_FLOAT16 ? kt__float_to_half(f) : kt__float_to_bf16(f);
  memcpy(p, &h, 2);
}

/* ---- references --------------------------------------------------------- */

/* The step's scalars as kaitian.h defines them: computed in double, rounded
 * to float once. Both references use them, so that they differ from the
 * kernel only by the rounding of its element operations. */
typedef struct {
  float decay, wd, b1, omb1, b2, omb2, bc2s, eps, nss;
  bool l2;
} consts;

static consts make_consts(const kt_adam_config *c) {
  double bc1 = c->bias_correction ? 1.0 - pow(c->beta1, (double)c->step) : 1.0;
  double bc2 = c->bias_correction ? 1.0 - pow(c->beta2, (double)c->step) : 1.0;
  consts k = {c->adamw ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f, (float)c->weight_decay,
              (float)c->beta1, (float)(1.0 - c->beta1), (float)c->beta2, (float)(1.0 - c->beta2),
              (float)sqrt(bc2), (float)c->eps, (float)(-(c->lr / bc1)),
              !c->adamw && c->weight_decay != 0.0};
  return k;
}

/* kaitian.h's formula in float32, op for op (fmaf and sqrtf from libm). */
static void ref32(const consts *k, float *p, float g, float *m, float *v) {
  float pp = *p * k->decay;
  if (k->l2) g = fmaf(pp, k->wd, g);
  *m = fmaf(g, k->omb1, *m * k->b1);
  *v = fmaf(k->omb2 * g, g, *v * k->b2);
  float d = sqrtf(*v) / k->bc2s + k->eps;
  *p = pp + (k->nss * *m) / d;
}

/* The same formula in double (no rounding but the constants'). The kernel's
 * float results must lie within the error its roundings can make: a few
 * units of 2^-24 of each operation's magnitude, carried forward (the
 * moments' errors into the update, through the division and the root). */
static bool near64(const consts *k, const float in[4], float p, float m, float v) {
  const double u = 0x1p-24, slack = 4.0;
  double P = (double)in[0] * k->decay, G = in[1], m0 = in[2], v0 = in[3];
  double dP0 = u * fabs(P), dG = 0.0;
  if (k->l2) {
    G += (double)k->wd * P;
    dG = u * fabs(G) + k->wd * dP0;
  }
  double M = k->b1 * m0 + k->omb1 * G;
  double V = k->b2 * v0 + k->omb2 * G * G;
  double dM = 2 * u * (fabs(k->b1 * m0) + fabs(k->omb1 * G)) + k->omb1 * dG;
  double dV = 3 * u * (k->b2 * v0 + k->omb2 * G * G) + 2 * k->omb2 * fabs(G) * dG;
  double D = sqrt(V) / k->bc2s + k->eps;
  double dD = (V > 0 ? dV / (2 * sqrt(V)) : sqrt(dV)) / k->bc2s + 3 * u * D;
  double U = k->nss * M / D;
  double dU = fabs(k->nss) * (dM / D + fabs(M) * dD / (D * D)) + 3 * u * fabs(U);
  double dP = dP0 + dU + u * fabs(P + U);
  return fabs(m - M) <= slack * dM + 1e-40 && fabs(v - V) <= slack * dV + 1e-40 &&
         fabs(p - (P + U)) <= slack * dP + 1e-40;
}

static bool same_bits(float a, float b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- one case ----------------------------------------------------------- */

#define CANARY 24 /* elements of fill before and after each buffer */

typedef struct {
  unsigned char *base; /* whole allocation */
  unsigned char *data; /* the n elements the call sees */
  size_t es, n, off;
} buf;

static void buf_init(buf *b, size_t es, size_t n, size_t off) {
  b->es = es;
  b->n = n;
  b->off = off;
  b->base = malloc(es * (n + off + 2 * CANARY));
  if (!b->base) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  memset(b->base, 0xa5, es * (n + off + 2 * CANARY));
  b->data = b->base + es * (CANARY + off);
}

/* The bytes outside the n elements are still the fill. */
static bool buf_canary_ok(const buf *b) {
  size_t total = b->es * (b->n + b->off + 2 * CANARY);
  size_t lo = (size_t)(b->data - b->base), hi = lo + b->es * b->n;
  for (size_t i = 0; i < total; i++)
    if ((i < lo || i >= hi) && b->base[i] != 0xa5) return false;
  return true;
}

typedef struct {
  size_t n, off;
  kt_dtype gdt, cdt;
  bool copy;
  int adamw, bc, threads;
  double wd;
  int64_t step;
} tcase;

static void describe(const tcase *t, char *out, size_t cap) {
  snprintf(out, cap, "n=%zu off=%zu grad=%s copy=%s %s wd=%g bias_correction=%d step=%" PRId64
           " threads=%d", t->n, t->off, kt_dtype_name(t->gdt),
           t->copy ? kt_dtype_name(t->cdt) : "none", t->adamw ? "adamw" : "adam", t->wd, t->bc,
           t->step, t->threads);
}

/* Random state: params of either sign, grads over a few magnitudes (some
 * zero, some tiny enough for subnormal squares), moments as after some
 * steps (zero at step 1). */
static void fill(const tcase *t, buf *p, buf *g, buf *m, buf *v) {
  for (size_t i = 0; i < t->n; i++) {
    float pf = (float)(2.0 * rnd_sym()), gf;
    uint64_t r = rnd() % 16;
    static const double scale[5] = {1, 0.1, 0.01, 1e-3, 1e-4};
    gf = r == 0 ? 0.0f : r == 1 ? (float)(rnd_sym() * 1e-21) : (float)(rnd_sym() * scale[r % 5]);
    from_float(t->gdt, g->data + g->es * i, gf);
    float mf = t->step == 1 ? 0.0f : (float)(rnd_sym() * 0.1);
    float vf = t->step == 1 ? 0.0f : (float)(rnd_unit() * 0.01);
    memcpy(p->data + 4 * i, &pf, 4);
    memcpy(m->data + 4 * i, &mf, 4);
    memcpy(v->data + 4 * i, &vf, 4);
  }
}

/* Element i against both references; false (after reporting) on a mismatch. */
static bool check_elem(const tcase *t, const consts *k, const char *fam, size_t i,
                       const float in[4], const buf *p, const buf *m, const buf *v, const buf *cp) {
  float rp = in[0], rm = in[2], rv = in[3];
  ref32(k, &rp, in[1], &rm, &rv);
  float gp, gm, gv;
  memcpy(&gp, p->data + 4 * i, 4);
  memcpy(&gm, m->data + 4 * i, 4);
  memcpy(&gv, v->data + 4 * i, 4);
  char what[256];
  if (!same_bits(gp, rp) || !same_bits(gm, rm) || !same_bits(gv, rv)) {
    describe(t, what, sizeof what);
    FAIL("%s %s: element %zu: param/exp_avg/exp_avg_sq = %a/%a/%a, float32 reference %a/%a/%a",
         fam, what, i, gp, gm, gv, rp, rm, rv);
    return false;
  }
  if (!near64(k, in, gp, gm, gv)) {
    describe(t, what, sizeof what);
    FAIL("%s %s: element %zu: %.9g/%.9g/%.9g is not within rounding of the float64 formula "
         "(inputs p=%a g=%a m=%a v=%a)", fam, what, i, gp, gm, gv, in[0], in[1], in[2], in[3]);
    return false;
  }
  if (t->copy) {
    unsigned char want[4];
    from_float(t->cdt, want, gp);
    if (memcmp(cp->data + cp->es * i, want, cp->es) != 0) {
      describe(t, what, sizeof what);
      FAIL("%s %s: element %zu: param_copy is not param %a as %s", fam, what, i, gp,
           kt_dtype_name(t->cdt));
      return false;
    }
  }
  return true;
}

/* Run one case through family (or the public entry when family < 0) and
 * check every element, and that nothing outside the buffers changed. */
static void run_case(int family, const tcase *t) {
  buf p, g, m, v, cp;
  buf_init(&p, 4, t->n, t->off);
  buf_init(&g, dsize(t->gdt), t->n, t->off);
  buf_init(&m, 4, t->n, t->off);
  buf_init(&v, 4, t->n, t->off);
  buf_init(&cp, dsize(t->cdt), t->n, t->off);
  fill(t, &p, &g, &m, &v);
  float *in = malloc(sizeof(float) * 4 * (t->n ? t->n : 1));
  for (size_t i = 0; i < t->n; i++) {
    memcpy(&in[4 * i], p.data + 4 * i, 4);
    in[4 * i + 1] = to_float(t->gdt, g.data + g.es * i);
    memcpy(&in[4 * i + 2], m.data + 4 * i, 4);
    memcpy(&in[4 * i + 3], v.data + 4 * i, 4);
  }
  kt_adam_config c = KT_ADAM_CONFIG_INIT;
  c.lr = 1e-2;
  c.weight_decay = t->wd;
  c.adamw = t->adamw;
  c.bias_correction = t->bc;
  c.step = t->step;
  c.threads = t->threads;
  float *pp = (float *)(void *)p.data, *pm = (float *)(void *)m.data, *pv = (float *)(void *)v.data;
  void *copy = t->copy ? cp.data : NULL;
  kt_result r = family < 0 ? kt_adam_step(&c, pp, g.data, t->gdt, pm, pv, copy, t->cdt, t->n)
                           : kt__adam_step_family(family, &c, pp, g.data, t->gdt, pm, pv, copy,
                                                  t->cdt, t->n);
  const char *fam = family < 0 ? "kt_adam_step" : kt__adam_family_name(family);
  char what[256];
  describe(t, what, sizeof what);
  if (r != KT_SUCCESS) {
    FAIL("%s %s: %s: %s", fam, what, kt_strerror(r), kt_last_error());
  } else {
    consts k = make_consts(&c);
    for (size_t i = 0; i < t->n; i++)
      if (!check_elem(t, &k, fam, i, &in[4 * i], &p, &m, &v, &cp)) break;
    const buf *all[5] = {&p, &g, &m, &v, &cp};
    const char *names[5] = {"param", "grad", "exp_avg", "exp_avg_sq", "param_copy"};
    for (int b = 0; b < 5; b++)
      if (!buf_canary_ok(all[b])) FAIL("%s %s: bytes around %s changed", fam, what, names[b]);
  }
  free(in);
  free(p.base);
  free(g.base);
  free(m.base);
  free(v.base);
  free(cp.base);
}

/* The matrix: every length, alignment, dtype pair, variant. The long
 * length takes four dtype pairs (every grad and every copy dtype once) with
 * one variant each, so the run stays short under the sanitizers. */
static void test_matrix(int family) {
  static const size_t lengths[] = {0, 1, 7, 15, 17, 33, 1000003};
  int before = failures;
  for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
    bool big = lengths[li] > 1000;
    for (int gi = 0; gi < 3; gi++) {
      for (int ci = 0; ci < 4; ci++) {
        if (big && ci != (gi + 1) % 4 && (gi | ci) != 0) continue;
        /* var's bits: offset, adamw, weight decay, no bias correction, step 7 */
        for (int var = 0; var < 32; var++) {
          if (big && var != ((gi * 4 + ci) * 11 + 5) % 32) continue;
          tcase t = {lengths[li], (size_t)(var & 1), dtypes[gi], dtypes[ci % 3], ci < 3,
                     (var >> 1) & 1, (var >> 3) & 1 ? 0 : 1, 0, (var >> 2) & 1 ? 0.01 : 0.0,
                     (var >> 4) & 1 ? 7 : 1};
          run_case(family, &t);
          if (failures > before + 10) return;
        }
      }
    }
  }
  printf("%s: %s\n", family < 0 ? "kt_adam_step" : kt__adam_family_name(family),
         failures == before ? "ok" : "FAILED");
}

/* Results do not depend on how many threads split the work (parts end on
 * 64-element boundaries; the lengths here leave ragged last parts). */
static void test_threads(int family) {
  static const int counts[] = {1, 2, 3, 5};
  static const size_t lengths[] = {131075, 1000003};
  int before = failures;
  for (size_t li = 0; li < 2; li++) {
    for (size_t ti = 0; ti < 4; ti++) {
      tcase t = {lengths[li], li & 1, dtypes[(li + ti) % 3], dtypes[ti % 3], ti != 0, (int)(ti & 1),
                 1, counts[ti], 0.01, 3};
      run_case(family, &t);
    }
  }
  printf("threads (%s): %s\n", kt__adam_family_name(family), failures == before ? "ok" : "FAILED");
}

/* Two application threads stepping their own buffers at once: one gets
 * the pool, the other runs alone; both must be right. */
static void *concurrent_main(void *arg) {
  int family = *(int *)arg;
  for (int i = 0; i < 3; i++) {
    tcase t = {200003, (size_t)(i & 1), KT_BFLOAT16, KT_BFLOAT16, true, 1, 1, 2, 0.01, 2};
    run_case(family, &t);
  }
  return NULL;
}

static void test_concurrent(int family) {
  int before = failures;
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, concurrent_main, &family);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  printf("concurrent callers: %s\n", failures == before ? "ok" : "FAILED");
}

/* A fork child of a process whose pool has workers starts its own (the
 * parent's are not in the child); then the parent's pool still works.
 * Not under TSan, which cannot start threads after a multi-threaded fork. */
static void test_fork(int family) {
#if defined(__SANITIZE_THREAD__)
  (void)family;
  printf("fork: skipped under ThreadSanitizer\n");
#else
  int before = failures;
  tcase t = {300001, 1, KT_FLOAT32, KT_FLOAT16, true, 1, 1, 3, 0.01, 4};
  run_case(family, &t); /* the pool has its workers now */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    run_case(family, &t);
    _exit(failures == before ? 0 : 1);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
    FAIL("fork: the child's threaded step failed (status 0x%x)", status);
  run_case(family, &t);
  printf("fork: %s\n", failures == before ? "ok" : "FAILED");
#endif
}

/* ---- argument errors ---------------------------------------------------- */

/* The call fails with want, its message holds every fragment, and no
 * buffer changed (p, m and v, when not NULL, hold at least 8 floats). */
static void expect_error(const char *label, kt_result want, const char *frag1, const char *frag2,
                         const kt_adam_config *c, float *p, const void *g, kt_dtype gdt, float *m,
                         float *v, void *cp, kt_dtype cdt, size_t n) {
  float before[4 * 8];
  for (int i = 0; i < 8; i++) {
    before[i] = p ? p[i] : 0;
    before[8 + i] = m ? m[i] : 0;
    before[16 + i] = v ? v[i] : 0;
  }
  kt_result r = kt_adam_step(c, p, g, gdt, m, v, cp, cdt, n);
  const char *msg = kt_last_error();
  if (r != want) {
    FAIL("%s: got %s (%s), want %s", label, kt_strerror(r), msg, kt_strerror(want));
    return;
  }
  if ((frag1 && !strstr(msg, frag1)) || (frag2 && !strstr(msg, frag2)))
    FAIL("%s: message \"%s\" lacks \"%s\"%s%s", label, msg, frag1 ? frag1 : "",
         frag2 ? " or " : "", frag2 ? frag2 : "");
  for (int i = 0; i < 8; i++) {
    bool same = (!p || same_bits(p[i], before[i])) && (!m || same_bits(m[i], before[8 + i])) &&
                (!v || same_bits(v[i], before[16 + i]));
    if (!same) {
      FAIL("%s: the failed call changed the buffers", label);
      break;
    }
  }
  printf("  %-28s %s\n", label, msg);
}

typedef struct {
  const char *label, *frag1, *frag2;
  void (*edit)(kt_adam_config *);
} cfg_error;

static void e_null_size(kt_adam_config *c) { c->struct_size = 8; }
static void e_lr_neg(kt_adam_config *c) { c->lr = -1e-3; }
static void e_lr_nan(kt_adam_config *c) { c->lr = NAN; }
static void e_lr_inf(kt_adam_config *c) { c->lr = INFINITY; }
static void e_beta1_one(kt_adam_config *c) { c->beta1 = 1.0; }
static void e_beta2_neg(kt_adam_config *c) { c->beta2 = -0.5; }
static void e_eps_neg(kt_adam_config *c) { c->eps = -1e-8; }
static void e_wd_neg(kt_adam_config *c) { c->weight_decay = -0.1; }
static void e_step0(kt_adam_config *c) { c->step = 0; }
static void e_threads(kt_adam_config *c) { c->threads = -2; }

static void test_bad_config(float *p, float *g, float *m, float *v) {
  static const cfg_error cfgs[] = {
      {"struct_size", "struct_size is 8", "KT_ADAM_CONFIG_INIT", e_null_size},
      {"negative lr", "lr = -0.001", ">= 0", e_lr_neg},
      {"NaN lr", "lr = nan", "finite", e_lr_nan},
      {"infinite lr", "lr = inf", "finite", e_lr_inf},
      {"beta1 = 1", "beta1 = 1 is outside [0, 1)", NULL, e_beta1_one},
      {"negative beta2", "beta2 = -0.5 is outside [0, 1)", NULL, e_beta2_neg},
      {"negative eps", "eps = -1e-08", ">= 0", e_eps_neg},
      {"negative weight_decay", "weight_decay = -0.1", ">= 0", e_wd_neg},
      {"step 0", "step = 0", ">= 1", e_step0},
      {"negative threads", "threads = -2", NULL, e_threads},
  };
  expect_error("NULL config", KT_ERR_INVALID_ARGUMENT, "cfg is NULL", NULL, NULL, p, g,
               KT_FLOAT32, m, v, NULL, KT_FLOAT32, 8);
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    kt_adam_config bad = KT_ADAM_CONFIG_INIT;
    cfgs[i].edit(&bad);
    expect_error(cfgs[i].label, KT_ERR_INVALID_ARGUMENT, cfgs[i].frag1, cfgs[i].frag2, &bad, p, g,
                 KT_FLOAT32, m, v, NULL, KT_FLOAT32, 8);
  }
}

#define EXPECT_INVALID(label, frag1, frag2, ...) \
  expect_error(label, KT_ERR_INVALID_ARGUMENT, frag1, frag2, __VA_ARGS__)

static void test_bad_buffers(float *p, float *g, float *m, float *v) {
  kt_adam_config c = KT_ADAM_CONFIG_INIT;
  uint16_t c16[8];
  EXPECT_INVALID("float64 grad", "grad dtype float64", "float32, float16 or bfloat16", &c, p, g,
                 KT_FLOAT64, m, v, NULL, KT_FLOAT32, 8);
  EXPECT_INVALID("unknown grad dtype", "grad dtype unknown (99)", NULL, &c, p, g, (kt_dtype)99, m,
                 v, NULL, KT_FLOAT32, 8);
  EXPECT_INVALID("int32 copy", "param_copy dtype int32", NULL, &c, p, g, KT_FLOAT32, m, v, c16,
                 KT_INT32, 8);
  EXPECT_INVALID("NULL param", "param is NULL", NULL, &c, NULL, g, KT_FLOAT32, m, v, NULL,
                 KT_FLOAT32, 8);
  EXPECT_INVALID("NULL grad", "grad is NULL", NULL, &c, p, NULL, KT_FLOAT32, m, v, NULL,
                 KT_FLOAT32, 8);
  EXPECT_INVALID("NULL exp_avg_sq", "exp_avg_sq is NULL", NULL, &c, p, g, KT_FLOAT32, m, NULL,
                 NULL, KT_FLOAT32, 8);
  EXPECT_INVALID("n overflows", "overflows", NULL, &c, p, g, KT_FLOAT32, m, v, NULL, KT_FLOAT32,
                 SIZE_MAX / 2);
  EXPECT_INVALID("exp_avg is exp_avg_sq", "exp_avg and exp_avg_sq overlap", NULL, &c, p, g,
                 KT_FLOAT32, m, m, NULL, KT_FLOAT32, 8);
  EXPECT_INVALID("copy overlaps param", "param and param_copy overlap", NULL, &c, p, g, KT_FLOAT32,
                 m, v, (unsigned char *)p + 6, KT_BFLOAT16, 8);
  EXPECT_INVALID("grad overlaps param", "param and grad overlap", NULL, &c, p, p + 7, KT_FLOAT32, m,
                 v, NULL, KT_FLOAT32, 8);
  /* Not errors: n = 0 with NULL buffers; a bad copy dtype without a copy. */
  kt_result r = kt_adam_step(&c, NULL, NULL, KT_FLOAT32, NULL, NULL, NULL, KT_FLOAT32, 0);
  if (r != KT_SUCCESS) FAIL("n = 0 with NULL buffers: %s (%s)", kt_strerror(r), kt_last_error());
  r = kt_adam_step(&c, p, g, KT_FLOAT32, m, v, NULL, (kt_dtype)99, 8);
  if (r != KT_SUCCESS) FAIL("copy dtype without a copy: %s (%s)", kt_strerror(r), kt_last_error());
}

static void test_bad_args(void) {
  int before = failures;
  float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  float m[8] = {0}, v[8] = {0};
  printf("argument errors:\n");
  test_bad_config(p, g, m, v);
  test_bad_buffers(p, g, m, v);
  printf("argument errors: %s\n", failures == before ? "ok" : "FAILED");
}

/* ---- the family under KAITIAN_OPTIM_IMPL -------------------------------- */

static int family_by_name(const char *name) {
  for (int f = 0; f < KT_ADAM_NUM_FAMILIES; f++)
    if (strcasecmp(name, kt__adam_family_name(f)) == 0) return f;
  return -1;
}

/* Unset: the best family the CPU has. Known and present: that one, and the
 * whole matrix through kt_adam_step. Known but absent: every call fails
 * with KT_ERR_UNSUPPORTED naming it. Unknown: KT_ERR_INVALID_ARGUMENT. */
static void test_env(void) {
  const char *forced = getenv("KAITIAN_OPTIM_IMPL");
  int want = -1;
  for (int f = KT_ADAM_NUM_FAMILIES - 1; f >= 0 && want < 0; f--)
    if (kt__adam_family_fn(f)) want = f;
  int named = forced && *forced ? family_by_name(forced) : want;
  float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, m[8] = {0}, v[8] = {0};
  kt_adam_config c = KT_ADAM_CONFIG_INIT;
  char frag[64];
  snprintf(frag, sizeof frag, "KAITIAN_OPTIM_IMPL=%s", forced ? forced : "");
  printf("KAITIAN_OPTIM_IMPL=%s (CPU features: %s)\n", forced ? forced : "(unset)",
         kt__cpu_features());
  if (named < 0) {
    expect_error("unknown family", KT_ERR_INVALID_ARGUMENT, frag, "not a kernel family", &c, p, g,
                 KT_FLOAT32, m, v, NULL, KT_FLOAT32, 4);
    return;
  }
  if (!kt__adam_family_fn(named)) {
    expect_error("family the CPU lacks", KT_ERR_UNSUPPORTED, frag, "lacks it", &c, p, g, KT_FLOAT32,
                 m, v, NULL, KT_FLOAT32, 4);
    printf("%s: not on this CPU; the error is right, the kernels are not run\n", forced);
    return;
  }
  int active = -1;
  kt_result r = kt__adam_active_family(&active);
  if (r != KT_SUCCESS || active != named)
    FAIL("active family %s (%s), want %s", kt__adam_family_name(active), kt_last_error(),
         kt__adam_family_name(named));
  test_matrix(-1);
}

int main(int argc, char **argv) {
  bool env_mode = argc > 1 && strcmp(argv[1], "--env") == 0;
  const char *seed = getenv("KT_TEST_SEED");
  if (seed && *seed) rng = strtoull(seed, NULL, 0) | 1;
  printf("seed 0x%" PRIx64 "\n", rng);
  if (env_mode) {
    test_env();
  } else {
    unsetenv("KAITIAN_OPTIM_IMPL"); /* the public entry below must take the best family */
    int ran = 0;
    for (int f = 0; f < KT_ADAM_NUM_FAMILIES; f++) {
      if (!kt__adam_family_fn(f)) {
        printf("%s: not on this CPU (features: %s), skipped\n", kt__adam_family_name(f),
               kt__cpu_features());
        continue;
      }
      test_matrix(f);
      ran = f;
    }
    test_threads(ran);
    test_concurrent(ran);
    test_fork(ran);
    test_bad_args();
  }
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", (int)failures);
    return 1;
  }
  printf("all passed\n");
  return 0;
}
