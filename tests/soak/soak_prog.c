/* soak_prog.c - rank program of the soak (tests/soak/soak.sh, make soak): long
 * runs whose memory and descriptors must stay flat.
 *
 * Usage (under kaitian run): soak_prog [small=N] [large=N] [large_bytes=B]
 *                                      [mix=N] [churn=N] [rss_slack_kb=K]
 *   small   allreduces of 8 float32 (default 1000000)
 *   large   allreduces of large_bytes (default 1000 of 64 MiB)
 *   mix     rounds of every collective at sizes from 4 B to 1 MiB (default 2000)
 *   churn   kt_comm_split + an allreduce and a barrier on it + kt_comm_destroy
 *           (default 1000)
 * Every result of the small and large allreduces and of the mix is checked
 * against its closed form. The rank samples its resident set (VmRSS) and open
 * descriptors (/proc/self/fd) at each phase's start, after its first
 * operation, about every 0.5 s and at its end, then prints
 *   SOAK rank=R phase=P samples=K rss_kb first=A warm=W last=B max=C slope_kb_per_min=S anon_kb warm=X last=Y
 *        fds first=D last=E max=F
 * per phase (slope: least squares over the samples after the warm-up) and a
 * total line. Memory may grow during a phase's first operation (scratch
 * buffers, pages of a segment first touched); flat means: from the sample
 * after it to the phase's last, the heap (RssAnon) grew by at most
 * rss_slack_kb (default 4096) and the descriptors ended where the first phase
 * began. The whole resident set is reported, not judged: it also counts the
 * pages of the shared segments, which are first touched over a long time
 * (sizes and peers used for the first time) but never beyond their size. Exit status 0 when flat and every check passed, 1 otherwise. */
#include "kaitian.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_rank, g_size, g_failed;
static bool g_err; /* a call failed: the communicator is broken, stop (every rank does) */
static int g_argc;
static char **g_argv;

static long arg_long(const char *key, long def) {
  size_t n = strlen(key);
  for (int i = 1; i < g_argc; i++)
    if (!strncmp(g_argv[i], key, n) && g_argv[i][n] == '=') return strtol(g_argv[i] + n + 1, NULL, 10);
  return def;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident KiB: the whole set, and its anonymous part (the heap). */
static void rss_kb(long *all, long *anon) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  *all = *anon = -1;
  while (f && fgets(line, sizeof line, f)) {
    if (!strncmp(line, "VmRSS:", 6)) *all = strtol(line + 6, NULL, 10);
    if (!strncmp(line, "RssAnon:", 8)) *anon = strtol(line + 8, NULL, 10);
  }
  if (f) fclose(f);
}

static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  long n = 0;
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n - 3; /* ".", "..", and the descriptor of the listing itself */
}

/* ---- sampling ------------------------------------------------------------- */

enum { MAX_SAMPLES = 100000 };
typedef struct {
  double t;
  long rss, anon, fds;
} sample;
static sample g_s[MAX_SAMPLES];
static int g_n;
static double g_next;

static void take(bool force) {
  double t = now_s();
  if (!force && t < g_next) return;
  g_next = t + 0.5;
  if (g_n < MAX_SAMPLES) {
    sample *x = &g_s[g_n++];
    x->t = t;
    rss_kb(&x->rss, &x->anon);
    x->fds = open_fds();
  }
}

static long g_fds0 = -1;

/* Report samples [a, g_n) of one phase and judge them flat from sample w on
 * (taken once the phase's first operation, its warm-up, was done). */
static void judge(const char *phase, int a, int w, long slack_kb) {
  int n = g_n - a;
  if (n < 2) return;
  if (w < a || w >= g_n) w = g_n - 1; /* too short to pass its warm-up: nothing to judge */
  long rmax = 0, fmax = 0;
  for (int i = a; i < g_n; i++) {
    if (g_s[i].rss > rmax) rmax = g_s[i].rss;
    if (g_s[i].fds > fmax) fmax = g_s[i].fds;
  }
  /* Least-squares slope of RSS over time, after the warm-up. */
  double st = 0, sr = 0, stt = 0, str = 0;
  int m = g_n - w;
  for (int i = w; i < g_n; i++) {
    double t = g_s[i].t - g_s[w].t, r = (double)g_s[i].rss;
    st += t, sr += r, stt += t * t, str += t * r;
  }
  double den = m * stt - st * st, slope = den > 0 ? (m * str - st * sr) / den * 60.0 : 0.0;
  /* Judged on the heap: the resident set also grows as pages of the shared
   * segments are first touched (by sizes and peers not used before), up to
   * the segments' size, which is no leak. */
  long grew = g_s[g_n - 1].anon - g_s[w].anon;
  printf("SOAK rank=%d phase=%s samples=%d rss_kb first=%ld warm=%ld last=%ld max=%ld slope_kb_per_min=%.1f "
         "anon_kb warm=%ld last=%ld fds first=%ld last=%ld max=%ld\n",
         g_rank, phase, n, g_s[a].rss, g_s[w].rss, g_s[g_n - 1].rss, rmax, slope, g_s[w].anon, g_s[g_n - 1].anon,
         g_s[a].fds, g_s[g_n - 1].fds, fmax);
  if (grew > slack_kb) {
    fprintf(stderr, "SOAK_FAILED rank=%d phase=%s: the heap (RssAnon) grew by %ld KiB after the warm-up (slack %ld KiB)\n",
            g_rank, phase, grew, slack_kb);
    g_failed++;
  }
  if (g_s[g_n - 1].fds != g_fds0) {
    fprintf(stderr, "SOAK_FAILED rank=%d phase=%s: %ld descriptors open at the end, %ld at the start\n",
            g_rank, phase, g_s[g_n - 1].fds, g_fds0);
    g_failed++;
  }
}

static bool check(const char *what, kt_result r, const float *got, size_t n, float want) {
  if (r != KT_SUCCESS) {
    fprintf(stderr, "SOAK_FAILED rank=%d: %s: %s: %s\n", g_rank, what, kt_strerror(r), kt_last_error());
    g_failed++;
    g_err = true;
    return false;
  }
  for (size_t i = 0; got && i < n; i++)
    if (got[i] != want) {
      fprintf(stderr, "SOAK_FAILED rank=%d: %s: element %zu is %g, expected %g\n", g_rank, what, i,
              (double)got[i], (double)want);
      g_failed++;
      return false;
    }
  return true;
}

static float *floats(size_t n, float v) {
  float *p = malloc(n * sizeof *p);
  if (!p) {
    fprintf(stderr, "soak_prog: out of memory (%zu floats)\n", n);
    exit(2);
  }
  for (size_t i = 0; i < n; i++) p[i] = v;
  return p;
}

int main(int argc, char **argv) {
  g_argc = argc;
  g_argv = argv;
  setvbuf(stdout, NULL, _IOLBF, 0);
  long small = arg_long("small", 1000000), large = arg_long("large", 1000);
  long large_bytes = arg_long("large_bytes", 64L << 20), mix = arg_long("mix", 2000);
  long churn = arg_long("churn", 1000), slack = arg_long("rss_slack_kb", 4096);
  kt_comm comm;
  kt_result r = kt_comm_init_env(&comm);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "soak_prog: kt_comm_init_env: %s: %s\n", kt_strerror(r), kt_last_error());
    return 2;
  }
  kt_comm_rank(comm, &g_rank);
  kt_comm_size(comm, &g_size);
  int p = g_size;
  float sum = (float)p * (float)(p + 1) / 2.0f; /* rank r contributes r + 1 */
  double t0 = now_s();
  g_fds0 = open_fds();
  int a = 0, w = 0;

  /* 1. small allreduces. */
  float in8[8], out8[8];
  for (int i = 0; i < 8; i++) in8[i] = (float)(g_rank + 1);
  w = -1;
  take(true);
  for (long i = 0; i < small && !g_err; i++) {
    r = kt_allreduce(in8, out8, 8, KT_FLOAT32, KT_SUM, comm);
    if (r != KT_SUCCESS || (i % 997) == 0) check("small allreduce", r, out8, 8, sum);
    if (i == 0) w = g_n, take(true);
    if ((i & 1023) == 0) take(false);
  }
  take(true);
  judge("small", a, w, slack);
  a = g_n;

  /* 2. large allreduces. */
  size_t ln = (size_t)large_bytes / sizeof(float);
  float *lin = floats(ln, (float)(g_rank + 1)), *lout = floats(ln, 0.0f);
  w = -1;
  take(true);
  for (long i = 0; i < large && !g_err; i++) {
    r = kt_allreduce(lin, lout, ln, KT_FLOAT32, KT_SUM, comm);
    if (r != KT_SUCCESS || i == 0 || i == large - 1) check("large allreduce", r, lout, ln, sum);
    if (i == 0) w = g_n, take(true);
    take(false);
  }
  take(true);
  judge("large", a, w, slack);
  a = g_n;
  free(lin);
  free(lout);

  /* 3. every collective. Rank r sends r + 1 everywhere. */
  enum { MAXN = 1 << 18 };
  float *x = floats((size_t)MAXN * (size_t)p, (float)(g_rank + 1)), *y = floats((size_t)MAXN * (size_t)p, 0.0f);
  w = -1;
  take(true);
  for (long i = 0; i < mix && !g_err; i++) {
    size_t n = ((size_t)1 << (i % 19)) + (size_t)(i % 3);
    if (n > MAXN) n = MAXN;
    int root = (int)(i % p);
    check("broadcast", kt_broadcast(x, y, n, KT_FLOAT32, root, comm), y, n, (float)(root + 1));
    r = kt_reduce(x, y, n, KT_FLOAT32, KT_SUM, root, comm);
    check("reduce", r, g_rank == root ? y : NULL, n, sum);
    r = kt_allgather(x, y, n, KT_FLOAT32, comm);
    for (int q = 0; q < (r == KT_SUCCESS ? p : 1); q++) check("allgather", r, y + (size_t)q * n, n, (float)(q + 1));
    check("reduce_scatter", kt_reduce_scatter(x, y, n, KT_FLOAT32, KT_SUM, comm), y, n, sum);
    r = kt_alltoall(x, y, n, KT_FLOAT32, comm);
    for (int q = 0; q < (r == KT_SUCCESS ? p : 1); q++) check("alltoall", r, y + (size_t)q * n, n, (float)(q + 1));
    r = kt_gather(x, y, n, KT_FLOAT32, root, comm);
    for (int q = 0; q < (r == KT_SUCCESS ? (g_rank == root ? p : 0) : 1); q++)
      check("gather", r, y + (size_t)q * n, n, (float)(q + 1));
    check("scatter", kt_scatter(x, y, n, KT_FLOAT32, root, comm), y, n, (float)(root + 1));
    r = kt_sendrecv(x, n, (g_rank + 1) % p, y, n, (g_rank + p - 1) % p, KT_FLOAT32, 3, comm);
    check("sendrecv", r, y, n, (float)((g_rank + p - 1) % p + 1));
    check("barrier", kt_barrier(comm), NULL, 0, 0);
    /* Sizes grow over the first 19 rounds: the warm-up is the first cycle. */
    if (i == 19) w = g_n, take(true);
    take(false);
  }
  take(true);
  judge("mix", a, w, slack);
  a = g_n;
  free(x);
  free(y);

  /* 4. communicators made and destroyed. */
  w = -1;
  take(true);
  for (long i = 0; i < churn && !g_err; i++) {
    kt_comm sub = NULL;
    r = kt_comm_split(comm, (int)((g_rank + i) % 2), g_rank, &sub);
    if (!check("comm_split", r, NULL, 0, 0)) break;
    int sr, ss;
    kt_comm_rank(sub, &sr);
    kt_comm_size(sub, &ss);
    float one = 1.0f, got = 0.0f;
    check("allreduce on a split", kt_allreduce(&one, &got, 1, KT_FLOAT32, KT_SUM, sub), &got, 1, (float)ss);
    check("barrier on a split", kt_barrier(sub), NULL, 0, 0);
    check("comm_destroy", kt_comm_destroy(sub), NULL, 0, 0);
    if (i == 0) w = g_n, take(true);
    take(false);
  }
  take(true);
  judge("churn", a, w, slack);
  printf("SOAK rank=%d total: %.1f s, %d samples, rss_kb first=%ld last=%ld, anon_kb first=%ld last=%ld, "
         "fds first=%ld last=%ld\n", g_rank, now_s() - t0, g_n, g_s[0].rss, g_s[g_n - 1].rss, g_s[0].anon,
         g_s[g_n - 1].anon, g_s[0].fds, g_s[g_n - 1].fds);
  r = kt_comm_destroy(comm);
  if (r != KT_SUCCESS) check("comm_destroy", r, NULL, 0, 0);
  if (g_failed) return 1;
  printf("SOAK_OK rank=%d\n", g_rank);
  return 0;
}
