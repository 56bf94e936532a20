/* fault_prog.c - rank program of the failure-behaviour tests: one scenario per
 * run (dead peer, timeout, mismatch, abort, use after failure, graceful exit),
 * started by `kaitian run` from the scripts in tests/fault/.
 *
 * Usage: fault_prog SCENARIO [key=value ...]
 *   killloop   dir=D [count=N] [expect=peer_failed|timeout]
 *                                      loop allreduces until a peer is killed
 *                                      (expect=timeout: stopped, so the error
 *                                      expected is KT_ERR_TIMEOUT)
 *   deadpeer   victim=V mode=kill|exit   V dies after a barrier
 *   timeout    sleeper=S sleep_ms=T expect_ms=E [strict=0|1]
 *   mismatch   kind=bcast|bcastroot1|count|countlarge|countsmall|dtype|op|avg|smallsendonly|
 *                   smallstream|p2ptag|p2pcount|p2pdtype|sendfirst|sendcycle|sendfirstbig|sendcyclebig
 *   abort      mode=blocking|nonblocking [wait_ms=T] [strict=0|1]
 *   graceful   kind=late_destroy|p2p
 *   late       [sleep_ms=T]              ranks late by T ms to the same operations
 *   chaos      dir=D seed=S               a random mix of collectives and sizes (the
 *                                         same on every rank) until a peer is lost
 *   comms      [count=N] [bytes=B]        N communicators (the job's and N-1 split
 *                                         off it) made first, then a checked ring
 *                                         of sendrecvs of B bytes on each, newest
 *                                         first: the first use of each one's rings
 * Unknown keys (the scripts pass mark=<unique marker>, to find leftover
 * processes by their command line) are ignored.
 *
 * Output, one line each, parsed by the scripts (the launcher adds "[R] "):
 *   stdout  FAULT_STARTED rank=R            killloop, chaos: first operation checked
 *   stdout  FAULT_OK rank=R <what>          every check of this rank passed
 *   stderr  FAULT_ERROR rank=R t_ms=T elapsed_ms=E code=NAME msg=TEXT
 *   stderr  FAULT_MISMATCH rank=R code=NAME detected=0|1 names=R,R...
 *                                       mismatch: what this rank's error says
 *                                       (scenario.sh checks them across ranks)
 *   stderr  FAULT_CHECK_FAILED rank=R: reason
 * Exit status: 0 when every check passed (killloop and chaos survivors: 3,
 * since they lost a peer), 1 when a check failed, 2 on a usage or setup error. */
#include "kaitian.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1, g_size = 0;
static int g_failed; /* checks that failed on this rank */
static int g_argc;
static char **g_argv;

/* ---- helpers ------------------------------------------------------------ */

static int64_t realtime_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* "KT_ERR_TIMEOUT" out of kt_strerror's "KT_ERR_TIMEOUT: operation timed out". */
static const char *code_name(kt_result r, char *buf, size_t cap) {
  const char *s = kt_strerror(r);
  size_t n = strcspn(s, ":");
  snprintf(buf, cap, "%.*s", (int)n, s);
  return buf;
}

static void check_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void check_failed(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAULT_CHECK_FAILED rank=%d: %s\n", g_rank, msg);
  fflush(stderr);
  g_failed++;
}

/* Print the error a call returned, with the wall-clock time (compared by the
 * scripts with the time they killed a peer). */
static void report_error(const char *what, kt_result r, const char *msg, int64_t elapsed) {
  char name[64];
  fprintf(stderr, "FAULT_ERROR rank=%d t_ms=%lld elapsed_ms=%lld code=%s op=%s msg=%s\n", g_rank,
          (long long)realtime_ms(), (long long)elapsed, code_name(r, name, sizeof name), what, msg);
  fflush(stderr);
}

/* Does msg name "rank R" (R not followed by another digit)? */
static bool names_rank(const char *msg, int r) {
  char pat[32];
  int n = snprintf(pat, sizeof pat, "rank %d", r);
  for (const char *p = strstr(msg, pat); p; p = strstr(p + 1, pat))
    if (p[n] < '0' || p[n] > '9') return true;
  return false;
}

/* Does msg name some rank other than self? */
static bool names_other_rank(const char *msg, int self) {
  for (int r = 0; r < g_size; r++)
    if (r != self && names_rank(msg, r)) return true;
  return false;
}

static const char *arg(const char *key, const char *def) {
  size_t n = strlen(key);
  for (int i = 2; i < g_argc; i++)
    if (!strncmp(g_argv[i], key, n) && g_argv[i][n] == '=') return g_argv[i] + n + 1;
  return def;
}

static long arg_int(const char *key, long def) {
  const char *v = arg(key, NULL);
  if (!v) return def;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end || end == v) {
    fprintf(stderr, "fault_prog: bad value %s=%s\n", key, v);
    exit(2);
  }
  return x;
}

/* n floats equal to value, from malloc or (registered) kt_mem_alloc. */
static float *alloc_floats_from(size_t n, float value, bool registered) {
  void *v = NULL;
  if (registered ? kt_mem_alloc(n * sizeof(float), &v) != KT_SUCCESS : !(v = malloc(n * sizeof(float)))) {
    fprintf(stderr, "fault_prog rank %d: cannot allocate %zu floats%s%s\n", g_rank, n,
            registered ? ": " : "", registered ? kt_last_error() : "");
    exit(2);
  }
  float *p = v;
  for (size_t i = 0; i < n; i++) p[i] = value;
  return p;
}

static float *alloc_floats(size_t n, float value) { return alloc_floats_from(n, value, false); }

/* Every element equals want; reports the first wrong one. */
static bool check_floats(const char *what, const float *p, size_t n, float want) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != want) {
      check_failed("%s: element %zu is %g, expected %g", what, i, (double)p[i], (double)want);
      return false;
    }
  }
  return true;
}

/* ---- after a failure: the communicator is broken ------------------------ */

/* Once comm failed with code, every further operation must return the same
 * code at once (the header: "every later operation returns the same error"),
 * kt_comm_get_error must report it, and kt_comm_destroy must return. peer is a
 * rank to address point-to-point operations to (a live one, so that only the
 * broken state can make them fail). */
static void use_after_failure(kt_comm comm, kt_result code, int peer) {
  enum { N = 64 };
  float a[N * 64], b[N * 64];
  char want[64], got[64];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  for (int step = 0; step < 12; step++) {
    const char *what = "?";
    kt_request req = NULL;
    kt_comm sub = NULL;
    int64_t t0 = mono_ms();
    kt_result r = KT_SUCCESS;
    switch (step) {
      case 0: what = "allreduce"; r = kt_allreduce(a, b, N, KT_FLOAT32, KT_SUM, comm); break;
      case 1: what = "broadcast"; r = kt_broadcast(a, b, N, KT_FLOAT32, 0, comm); break;
      case 2: what = "reduce"; r = kt_reduce(a, b, N, KT_FLOAT32, KT_SUM, 0, comm); break;
      case 3: what = "allgather"; r = kt_allgather(a, b, N, KT_FLOAT32, comm); break;
      case 4: what = "barrier"; r = kt_barrier(comm); break;
      case 5: what = "alltoall"; r = kt_alltoall(a, b, 1, KT_FLOAT32, comm); break;
      case 6: what = "send"; r = kt_send(a, 4, KT_FLOAT32, peer, 1, comm); break;
      case 7: what = "recv"; r = kt_recv(b, 4, KT_FLOAT32, peer, 1, comm); break;
      case 8:
        what = "iallreduce+wait";
        r = kt_iallreduce(a, b, N, KT_FLOAT32, KT_SUM, comm, &req);
        if (r == KT_SUCCESS) r = kt_wait(req);
        break;
      case 9:
        what = "ibarrier+wait";
        r = kt_ibarrier(comm, &req);
        if (r == KT_SUCCESS) r = kt_wait(req);
        break;
      case 10:
        what = "comm_split";
        r = kt_comm_split(comm, 0, g_rank, &sub);
        if (sub) kt_comm_destroy(sub);
        break;
      case 11:
        what = "reduce_scatter";
        r = kt_reduce_scatter(a, b, 1, KT_FLOAT32, KT_SUM, comm);
        break;
    }
    int64_t dt = mono_ms() - t0;
    const char *msg = kt_last_error();
    if (r != code)
      check_failed("after the failure, %s returned %s, expected the communicator's error %s (%s)",
                   what, code_name(r, got, sizeof got), code_name(code, want, sizeof want), msg);
    else if (!msg[0])
      check_failed("after the failure, %s returned %s with an empty kt_last_error()", what,
                   code_name(r, got, sizeof got));
    if (dt > 500)
      check_failed("after the failure, %s took %lld ms to return its error (expected at once)",
                   what, (long long)dt);
  }
  kt_result ge = kt_comm_get_error(comm);
  if (ge != code)
    check_failed("kt_comm_get_error returned %s, expected %s", code_name(ge, got, sizeof got),
                 code_name(code, want, sizeof want));
  else if (!kt_last_error()[0])
    check_failed("kt_comm_get_error returned %s but left kt_last_error() empty",
                 code_name(ge, got, sizeof got));
}

/* Destroy must return (and succeed) even on a broken communicator. */
static void destroy_checked(kt_comm comm) {
  int64_t t0 = mono_ms();
  kt_result r = kt_comm_destroy(comm);
  int64_t dt = mono_ms() - t0;
  char name[64];
  if (r != KT_SUCCESS)
    check_failed("kt_comm_destroy returned %s: %s", code_name(r, name, sizeof name), kt_last_error());
  if (dt > 3000) check_failed("kt_comm_destroy took %lld ms", (long long)dt);
}

static int finish(const char *what, int ok_status) {
  if (g_failed) return 1;
  printf("FAULT_OK rank=%d %s\n", g_rank, what);
  fflush(stdout);
  return ok_status;
}

/* A rank that comes late to a collective its peers already gave up on
 * (timeout, abort) must fail it: they sent it their abort notice. With
 * strict=0 a success is only reported (FAULT_NOTE), so that the other checks
 * of the scenario stay visible on their own; strict=1 (default) fails. */
static void late_success(const char *what) {
  if (arg_int("strict", 1)) {
    check_failed("%s", what);
  } else {
    fprintf(stderr, "FAULT_NOTE rank=%d: %s (not checked here: strict=0)\n", g_rank, what);
    fflush(stderr);
  }
}

/* A survivor's first error: it must be a peer failure naming victim. */
static void expect_peer_failed(kt_result r, const char *msg, int victim) {
  char name[64];
  if (r == KT_SUCCESS) {
    check_failed("the operation succeeded although rank %d is dead", victim);
    return;
  }
  if (r != KT_ERR_PEER_FAILED)
    check_failed("expected KT_ERR_PEER_FAILED for the death of rank %d, got %s: %s", victim,
                 code_name(r, name, sizeof name), msg);
  if (!names_rank(msg, victim))
    check_failed("the error does not name the dead rank (\"rank %d\"): %s", victim, msg);
}

/* ---- scenarios ---------------------------------------------------------- */

/* After the error r (msg) that a lost peer caused: the broken-communicator
 * checks (addressing point-to-point calls to a rank msg does not name, so a
 * live one), destroy, and the survivor's exit status 3. */
static int after_peer_loss(kt_comm comm, kt_result r, const char *msg, const char *what) {
  int peer = -1;
  for (int q = 0; q < g_size && peer < 0; q++)
    if (q != g_rank && !names_rank(msg, q)) peer = q;
  use_after_failure(comm, r, peer >= 0 ? peer : (g_rank + 1) % g_size);
  destroy_checked(comm);
  int st = finish(what, 3);
  sleep_ms(300); /* let the launcher reap the lost rank first: its status is the job's */
  return st;
}

/* dir/pid.<rank>: this rank's pid, for the script to kill or stop it. */
static bool write_pid(const char *dir) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/pid.%d", dir, g_rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "fault_prog rank %d: cannot write %s: %s\n", g_rank, path, strerror(errno));
    return false;
  }
  return true;
}

/* Test 1: loop large allreduces until the script kills a rank. */
static int scenario_killloop(kt_comm comm) {
  const char *dir = arg("dir", NULL);
  size_t count = (size_t)arg_int("count", 16L << 20);
  if (!dir) {
    fprintf(stderr, "fault_prog killloop: dir= is required\n");
    return 2;
  }
  if (!write_pid(dir)) return 2;
  /* registered=1: buffers from kt_mem_alloc, so the allreduce runs single-copy
   * in the peers' memory when it is killed. */
  bool registered = arg_int("registered", 0) != 0;
  float *in = alloc_floats_from(count, (float)(g_rank + 1), registered);
  float *out = alloc_floats_from(count, 0.0f, registered);
  float want = (float)g_size * (float)(g_size + 1) / 2.0f;
  int64_t start = mono_ms();
  for (long it = 0;; it++) {
    int64_t t0 = mono_ms();
    kt_result r = kt_allreduce(in, out, count, KT_FLOAT32, KT_SUM, comm);
    if (r != KT_SUCCESS) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", kt_last_error());
      report_error("allreduce", r, msg, mono_ms() - t0);
      /* Which rank died is the script's knowledge; it checks the name. */
      kt_result want_code = strcmp(arg("expect", "peer_failed"), "timeout") ? KT_ERR_PEER_FAILED : KT_ERR_TIMEOUT;
      if (r != want_code) {
        char name[64], wname[64];
        check_failed("expected %s after a peer was lost, got %s: %s", code_name(want_code, wname, sizeof wname),
                     code_name(r, name, sizeof name), msg);
      }
      return after_peer_loss(comm, r, msg, "killloop: peer failure reported, broken communicator behaved");
    }
    if (it == 0) {
      if (!check_floats("first allreduce", out, count, want)) return 1;
      printf("FAULT_STARTED rank=%d\n", g_rank);
      fflush(stdout);
    }
    if (mono_ms() - start > 120000) {
      check_failed("no error after 120 s of allreduces: was no rank killed?");
      return 1;
    }
  }
}

/* Chaos trials (tests/fault/chaos.sh): every rank draws the same sequence of
 * operations from seed S (allreduce checked, iallreduce, broadcast and reduce
 * from a random root, allgather, reduce_scatter, alltoall, barrier, a
 * sendrecv around the ring) with counts from 1 to 256 Ki floats, and runs it
 * until the script kills or stops a rank. The first error is reported
 * (the script checks that it names the lost rank, and when), then the
 * broken-communicator checks as in killloop. */
static int scenario_chaos(kt_comm comm) {
  const char *dir = arg("dir", NULL);
  uint64_t x = (uint64_t)arg_int("seed", 1) * 0x9E3779B97F4A7C15ull + 1;
  if (!dir) {
    fprintf(stderr, "fault_prog chaos: dir= is required\n");
    return 2;
  }
  if (!write_pid(dir)) return 2;
  enum { MAXN = 1 << 18 };
  float *a = alloc_floats((size_t)MAXN * (size_t)g_size, (float)(g_rank + 1));
  float *b = alloc_floats((size_t)MAXN * (size_t)g_size, 0.0f);
  static const char *names[] = {"allreduce", "iallreduce+wait", "broadcast", "reduce", "allgather",
                                "reduce_scatter", "alltoall", "barrier", "sendrecv"};
  float want = (float)g_size * (float)(g_size + 1) / 2.0f;
  int64_t start = mono_ms();
  for (long it = 0;; it++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64: the same draws on every rank */
    int k = (int)(x % 9);
    size_t n = ((size_t)1 << ((x >> 8) % 19)) + (x >> 32) % 7;
    if (n > MAXN) n = MAXN;
    int root = (int)((x >> 40) % (uint64_t)g_size);
    kt_request req = NULL;
    int64_t t0 = mono_ms();
    kt_result r = KT_SUCCESS;
    switch (k) {
      case 0: r = kt_allreduce(a, b, n, KT_FLOAT32, KT_SUM, comm); break;
      case 1:
        r = kt_iallreduce(a, b, n, KT_FLOAT32, KT_SUM, comm, &req);
        if (r == KT_SUCCESS) r = kt_wait(req);
        break;
      case 2: r = kt_broadcast(a, b, n, KT_FLOAT32, root, comm); break;
      case 3: r = kt_reduce(a, b, n, KT_FLOAT32, KT_SUM, root, comm); break;
      case 4: r = kt_allgather(a, b, n, KT_FLOAT32, comm); break;
      case 5: r = kt_reduce_scatter(a, b, n, KT_FLOAT32, KT_SUM, comm); break;
      case 6: r = kt_alltoall(a, b, n, KT_FLOAT32, comm); break;
      case 7: r = kt_barrier(comm); break;
      default:
        r = kt_sendrecv(a, n, (g_rank + 1) % g_size, b, n, (g_rank + g_size - 1) % g_size, KT_FLOAT32, 7,
                        comm);
        break;
    }
    if (r != KT_SUCCESS) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", kt_last_error());
      report_error(names[k], r, msg, mono_ms() - t0);
      return after_peer_loss(comm, r, msg, "chaos: peer loss reported, broken communicator behaved");
    }
    if (k <= 1 && !check_floats(names[k], b, n, want)) return 1;
    if (it == 0) {
      printf("FAULT_STARTED rank=%d\n", g_rank);
      fflush(stdout);
    }
    if (mono_ms() - start > 120000) {
      check_failed("no error after 120 s of operations: was no rank killed?");
      return 1;
    }
  }
}

/* Test 5: a peer dies right after a barrier; the survivors' communicator
 * breaks, and stays broken. */
static int scenario_deadpeer(kt_comm comm) {
  int victim = (int)arg_int("victim", g_size - 1);
  const char *mode = arg("mode", "kill");
  kt_result r = kt_barrier(comm);
  if (r != KT_SUCCESS) {
    check_failed("barrier before the failure failed: %s", kt_last_error());
    return 1;
  }
  if (g_rank == victim) {
    /* Die only once the others are surely past the barrier: a death noticed
     * while they still wait in it would (rightly) fail the barrier. */
    sleep_ms(500);
    fflush(stdout);
    fflush(stderr);
    if (!strcmp(mode, "kill")) raise(SIGKILL);
    _exit(0); /* mode=exit: leave without kt_comm_destroy (no goodbye) */
  }
  enum { N = 1 << 16 };
  float *in = alloc_floats(N, 1.0f), *out = alloc_floats(N, 0.0f);
  int64_t t0 = mono_ms();
  r = kt_allreduce(in, out, N, KT_FLOAT32, KT_SUM, comm);
  int64_t dt = mono_ms() - t0;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", kt_last_error());
  if (r != KT_SUCCESS) report_error("allreduce", r, msg, dt);
  expect_peer_failed(r, msg, victim);
  if (dt > 10000) check_failed("the dead peer was noticed after %lld ms (limit 10000)", (long long)dt);
  if (r != KT_SUCCESS) {
    int peer = (g_rank + 1) % g_size;
    if (peer == victim) peer = (peer + 1) % g_size;
    use_after_failure(comm, r, peer);
  }
  destroy_checked(comm);
  free(in);
  free(out);
  return finish("deadpeer: error naming the dead rank, then a broken communicator", 0);
}

/* Test 2: one rank never calls the collective; the others time out. */
static int scenario_timeout(kt_comm comm) {
  int sleeper = (int)arg_int("sleeper", 1);
  int64_t sleep_for = arg_int("sleep_ms", 4000);
  int64_t expect = arg_int("expect_ms", 2000);
  enum { N = 1024 };
  float *in = alloc_floats(N, 1.0f), *out = alloc_floats(N, 0.0f);
  char msg[1024], name[64];
  if (g_rank == sleeper) {
    sleep_ms(sleep_for);
    int64_t t0 = mono_ms();
    kt_result r = kt_allreduce(in, out, N, KT_FLOAT32, KT_SUM, comm);
    int64_t dt = mono_ms() - t0;
    snprintf(msg, sizeof msg, "%s", kt_last_error());
    if (r == KT_SUCCESS) {
      late_success("the late rank's allreduce succeeded although the others gave up");
    } else {
      report_error("allreduce (late)", r, msg, dt);
      if (dt > 1500)
        check_failed("the late rank took %lld ms to learn that the others failed (expected at "
                     "once, from their abort notices)", (long long)dt);
      if (!names_other_rank(msg, g_rank))
        check_failed("the late rank's error names no other rank: %s", msg);
    }
    destroy_checked(comm);
    free(in);
    free(out);
    return finish("timeout: late rank got an error at once", 0);
  }
  int64_t t0 = mono_ms();
  kt_result r = kt_allreduce(in, out, N, KT_FLOAT32, KT_SUM, comm);
  int64_t dt = mono_ms() - t0;
  snprintf(msg, sizeof msg, "%s", kt_last_error());
  if (r == KT_SUCCESS) {
    check_failed("allreduce succeeded although rank %d never called it", sleeper);
  } else {
    report_error("allreduce", r, msg, dt);
    if (r != KT_ERR_TIMEOUT)
      check_failed("expected KT_ERR_TIMEOUT, got %s: %s", code_name(r, name, sizeof name), msg);
    if (dt < expect * 3 / 4 || dt > expect + 3000)
      check_failed("timed out after %lld ms; KAITIAN_TIMEOUT is %lld ms (accepted %lld..%lld)",
                   (long long)dt, (long long)expect, (long long)(expect * 3 / 4),
                   (long long)(expect + 3000));
    if (!strstr(msg, "KAITIAN_TIMEOUT"))
      check_failed("the timeout message does not name the variable KAITIAN_TIMEOUT: %s", msg);
    if (!names_other_rank(msg, g_rank))
      check_failed("the timeout message does not name the rank it waited for: %s", msg);
    if (g_size == 2 && !names_rank(msg, sleeper))
      check_failed("the timeout message does not name rank %d, the only peer: %s", sleeper, msg);
    use_after_failure(comm, r, sleeper);
  }
  destroy_checked(comm);
  free(in);
  free(out);
  return finish("timeout: KT_ERR_TIMEOUT naming the rank and KAITIAN_TIMEOUT", 0);
}

/* What the two sides of each mismatch kind differ in, as the message of the
 * rank that sees it names them: one pair per form the text takes (the
 * collectives' signatures "(op #1 allreduce, count 100, float32, sum, root
 * 0)", point to point's "400 bytes (float32) with tag 5" or "(op #0 recv,
 * 400 bytes, tag 5, float32)", the send cycles' "send of N bytes to rank 1
 * can never complete: rank 1 sends to rank 0 ..."). */
static const struct {
  const char *kind, *a, *b;
} mismatch_sides[] = {
    {"bcast", "allreduce", "broadcast"},
    {"bcastroot1", "allreduce", "broadcast"},
    {"count", "count 100,", "count 200,"},
    {"count", "400 bytes", "800 bytes"},
    {"countsmall", "count 4,", "count 256,"},
    {"countsmall", "16 bytes", "1024 bytes"},
    {"countlarge", "count 1048576,", "count 1048640,"},
    {"countlarge", "4194304 bytes", "4194560 bytes"},
    {"dtype", "float32", "int32"},
    {"op", ", sum", ", max"},
    {"avg", ", sum", ", avg"},
    {"smallsendonly", "reduce", "broadcast"},
    {"smallstream", "reduce", "broadcast"},
    {"p2ptag", "tag 0", "tag 5"},
    {"p2pcount", "400 bytes", "404 bytes"},
    {"p2pdtype", "float32", "int32"},
    {"sendfirst", "send of ", " sends "},
    {"sendcycle", "send of ", " sends "},
    {"sendfirstbig", "send of ", " sends "},
    {"sendcyclebig", "send of ", " sends "},
};

/* The text of an error past the prefixes the library puts before it: the
 * reporting rank's op ("rank 1: barrier #2 (shm_ll, count 0, uint8): ") and
 * an abort notice it relays ("rank 0 failed and aborted the communicator: "),
 * as often as they come; *relayed tells whether there was a notice. */
static const char *error_detail(const char *msg, bool *relayed) {
  static const char notice[] = " failed and aborted the communicator: ";
  const char *m = msg;
  *relayed = false;
  for (;;) {
    if (strncmp(m, "rank ", 5) != 0) return m;
    const char *p = m + 5;
    while (*p >= '0' && *p <= '9') p++;
    const char *close = strstr(p, "): ");
    if (!strncmp(p, notice, sizeof notice - 1)) {
      *relayed = true;
      m = p + sizeof notice - 1;
    } else if (!strncmp(p, ": ", 2) && strchr(p, '#') && close && strchr(p, '#') < close) {
      m = close + 3; /* "<op> #<seq> (<algorithm>, count <n>, <dtype>): " */
    } else {
      return m;
    }
  }
}

/* The mismatch scenario's report, which scenario.sh reads from every rank.
 * detected=1: this rank saw the mismatch itself (not through a peer's abort
 * notice) and reports KT_ERR_MISMATCH naming both sides' operations; names:
 * the other ranks its message names (a rank that did not see it must point
 * at one that did). */
static void report_mismatch(const char *kind, kt_result r, const char *msg) {
  bool relayed;
  const char *detail = error_detail(msg, &relayed);
  bool both = false;
  for (size_t i = 0; i < sizeof mismatch_sides / sizeof mismatch_sides[0]; i++)
    if (!strcmp(mismatch_sides[i].kind, kind) && strstr(detail, mismatch_sides[i].a) &&
        strstr(detail, mismatch_sides[i].b))
      both = true;
  char names[512] = "", name[64];
  size_t n = 0;
  for (int q = 0; q < g_size && n + 16 < sizeof names; q++)
    if (q != g_rank && names_rank(msg, q))
      n += (size_t)snprintf(names + n, sizeof names - n, "%s%d", n ? "," : "", q);
  fprintf(stderr, "FAULT_MISMATCH rank=%d code=%s detected=%d names=%s\n", g_rank, code_name(r, name, sizeof name),
          r == KT_ERR_MISMATCH && both && !relayed, names[0] ? names : "-");
  fflush(stderr);
}

/* Test 3: ranks issue different operations; every rank must get an error.
 * p2ptag/p2pcount/p2pdtype: rank 0 sends to rank 1, which expects another
 * tag, count or type (same bytes); the others join a barrier.
 * sendfirst: ranks 0 and 1 both send 1 MiB to each other before receiving
 * (the others join a barrier); sendcycle: every rank sends 1 MiB to the next
 * before receiving from the previous. Over shared memory (ring of 256 KiB)
 * neither can complete: an error, not a wait until the timeout.
 * sendfirstbig, sendcyclebig: sendfirst and sendcycle with 64 MiB, more than
 * the socket buffers hold, for the same error over TCP. */
static int scenario_mismatch(kt_comm comm) {
  const char *kind = arg("kind", "bcast");
  size_t count = 100, count1 = 100;
  bool bcast = false, p2p = false, cycle = false;
  kt_dtype dtype1 = KT_FLOAT32; /* rank 1's dtype and op */
  kt_op op1 = KT_SUM;
  int root = 0;
  if (!strcmp(kind, "bcast")) {
    bcast = true;
  } else if (!strcmp(kind, "bcastroot1")) {
    bcast = true;
    root = 1;
    count = count1 = 64; /* 256 bytes: the small-message protocol for both calls at 2 ranks */
  } else if (!strcmp(kind, "count")) {
    count1 = 200;
  } else if (!strcmp(kind, "smallsendonly") || !strcmp(kind, "smallstream")) {
    /* the small-message protocol; both sides send only */
    bcast = true;
    root = 1;
    count = count1 = 4;
  } else if (!strcmp(kind, "countsmall")) { /* 16 bytes against 1 KiB: across the small-message protocol's 872 */
    count = 4;
    count1 = 256;
  } else if (!strcmp(kind, "countlarge")) {
    count = 1 << 20;
    count1 = (1 << 20) + 64;
  } else if (!strcmp(kind, "dtype")) { /* same bytes, other type */
    dtype1 = KT_INT32;
  } else if (!strcmp(kind, "op")) {
    op1 = KT_MAX;
  } else if (!strcmp(kind, "avg")) { /* sums alike: only the signature differs */
    op1 = KT_AVG;
  } else if (!strcmp(kind, "p2ptag") || !strcmp(kind, "p2pcount") || !strcmp(kind, "p2pdtype")) {
    p2p = true;
    count1 = !strcmp(kind, "p2pcount") ? 101 : 100;
    if (!strcmp(kind, "p2pdtype")) dtype1 = KT_INT32;
  } else if (!strcmp(kind, "sendfirst") || !strcmp(kind, "sendcycle") || !strcmp(kind, "sendfirstbig") ||
             !strcmp(kind, "sendcyclebig")) {
    cycle = true;
    count = count1 = (size_t)1 << (strstr(kind, "big") ? 24 : 18); /* 64 MiB, 1 MiB of float32 */
  } else {
    fprintf(stderr, "fault_prog mismatch: unknown kind=%s\n", kind);
    return 2;
  }
  size_t n = count > count1 ? count : count1;
  float *in = alloc_floats(n, 1.0f), *out = alloc_floats(n, 0.0f);
  const char *what;
  int64_t t0 = mono_ms();
  kt_result r;
  bool small = !strcmp(kind, "smallsendonly") || !strcmp(kind, "smallstream");
  bool pair = !strcmp(kind, "sendfirst") || !strcmp(kind, "sendfirstbig");
  if (cycle && (!pair || g_rank < 2)) {
    int to = pair ? 1 - g_rank : (g_rank + 1) % g_size;
    int from = pair ? 1 - g_rank : (g_rank + g_size - 1) % g_size;
    what = "send";
    r = kt_send(in, count, KT_FLOAT32, to, 0, comm);
    if (r == KT_SUCCESS) {
      what = "recv (after the send)";
      r = kt_recv(out, count, KT_FLOAT32, from, 0, comm);
    }
  } else if (cycle) {
    what = "barrier";
    r = kt_barrier(comm);
  } else if (p2p && g_rank == 0) {
    what = "send";
    r = kt_send(in, count, KT_FLOAT32, 1, 0, comm);
  } else if (p2p && g_rank == 1) {
    what = "recv";
    r = kt_recv(out, count1, dtype1, 0, !strcmp(kind, "p2ptag") ? 5 : 0, comm);
  } else if (p2p) {
    what = "barrier";
    r = kt_barrier(comm);
  } else if (g_rank == 1 && bcast) {
    what = "broadcast";
    r = kt_broadcast(in, out, count, KT_FLOAT32, root, comm);
  } else if (small) {
    what = "reduce";
    r = kt_reduce(in, out, count, KT_FLOAT32, KT_SUM, root, comm);
  } else {
    what = "allreduce";
    r = kt_allreduce(in, out, g_rank == 1 ? count1 : count, g_rank == 1 ? dtype1 : KT_FLOAT32,
                     g_rank == 1 ? op1 : KT_SUM, comm);
  }
  int64_t dt = mono_ms() - t0;
  char msg[1024], name[64];
  snprintf(msg, sizeof msg, "%s", kt_last_error());
  /* The root of a broadcast only sends: its call may complete before anyone
   * looks at the data. The mismatch must then surface in its next call that
   * waits for every rank. smallsendonly: the non-roots of the small reduce
   * send only too. smallstream: what follows is small broadcasts from rank 1
   * (no rank waits for every other), where the small-message protocol
   * compares each op's signatures within 32 ops (docs/algorithms.md). */
  bool send_only = (bcast && g_rank == root && g_rank == 1) || (p2p && g_rank == 0) || (small && g_rank != root);
  if (r == KT_SUCCESS && send_only && !strcmp(kind, "smallstream")) {
    printf("rank %d: %s completed (send-only); the mismatch must fail one of the next 32 broadcasts\n",
           g_rank, what);
    what = "broadcast (after the send-only call)";
    t0 = mono_ms();
    for (int i = 0; i < 32 && r == KT_SUCCESS; i++) r = kt_broadcast(in, out, count, KT_FLOAT32, 1, comm);
    dt = mono_ms() - t0;
    snprintf(msg, sizeof msg, "%s", kt_last_error());
  } else if (r == KT_SUCCESS && send_only) {
    printf("rank %d: %s completed (send-only root); the mismatch must fail the next call\n",
           g_rank, what);
    what = "barrier (after the send-only call)";
    t0 = mono_ms();
    r = kt_barrier(comm);
    dt = mono_ms() - t0;
    snprintf(msg, sizeof msg, "%s", kt_last_error());
  }
  if (r == KT_SUCCESS) {
    check_failed("%s succeeded although rank 1 issued a different operation (%s)", what, kind);
  } else {
    report_error(what, r, msg, dt);
    report_mismatch(kind, r, msg);
    bool ok = r == KT_ERR_MISMATCH || r == KT_ERR_PEER_FAILED || r == KT_ERR_ABORTED;
    if (!ok)
      check_failed("expected KT_ERR_MISMATCH (or the abort notice of the rank that saw it), got "
                   "%s: %s", code_name(r, name, sizeof name), msg);
    if (!names_other_rank(msg, g_rank))
      check_failed("the mismatch error names no other rank: %s", msg);
    if (dt > 5000) check_failed("the mismatch took %lld ms to be reported", (long long)dt);
  }
  destroy_checked(comm);
  free(in);
  free(out);
  return finish("mismatch: error on every rank", 0);
}

/* Ranks that are late but call the same operations must not be taken for
 * mismatched ones: over TCP the ranks that wait send status notices after 1 s
 * (docs/failures.md), which the late rank reads when it arrives. Before each
 * of an allreduce, an allgatherv with a different count per rank, a broadcast
 * from the last rank and a barrier, one rank (another each time) sleeps
 * sleep_ms; every result is checked. */
static int scenario_late(kt_comm comm) {
  int64_t pause = arg_int("sleep_ms", 2500);
  int p = g_size, me = g_rank;
  enum { N = 1000 };
  float *in = alloc_floats(N, 0.0f), *out = alloc_floats((size_t)N * (size_t)p, 0.0f);
  size_t *counts = calloc((size_t)p, sizeof *counts), *displs = calloc((size_t)p, sizeof *displs);
  if (!counts || !displs) {
    fprintf(stderr, "fault_prog late: out of memory\n");
    return 2;
  }
  size_t total = 0;
  for (int r = 0; r < p; r++) {
    counts[r] = 3 + 2 * (size_t)r;
    displs[r] = total;
    total += counts[r];
  }
  char msg[1024], name[64];
  const char *what[4] = {"allreduce", "allgatherv", "broadcast", "barrier"};
  for (int k = 0; k < 4; k++) {
    if (me == (k + 1) % p) sleep_ms(pause);
    kt_result r = KT_SUCCESS;
    int64_t t0 = mono_ms();
    if (k == 0) {
      for (int i = 0; i < N; i++) in[i] = (float)(me + 1 + i % 7);
      r = kt_allreduce(in, out, N, KT_FLOAT32, KT_SUM, comm);
      for (int i = 0; r == KT_SUCCESS && i < N; i++)
        if (out[i] != (float)(p * (p + 1) / 2 + p * (i % 7))) {
          check_failed("allreduce: element %d is %g, expected %d", i, out[i], p * (p + 1) / 2 + p * (i % 7));
          break;
        }
    } else if (k == 1) {
      for (size_t j = 0; j < counts[me]; j++) in[j] = (float)(100 * me + (int)j);
      r = kt_allgatherv(in, counts[me], out, counts, displs, KT_FLOAT32, comm);
      for (int q = 0; r == KT_SUCCESS && q < p; q++)
        for (size_t j = 0; j < counts[q]; j++)
          if (out[displs[q] + j] != (float)(100 * q + (int)j)) {
            check_failed("allgatherv: element %zu of rank %d is %g", j, q, out[displs[q] + j]);
            q = p;
            break;
          }
    } else if (k == 2) {
      for (int i = 0; i < N; i++) in[i] = me == p - 1 ? (float)(i * 3) : -1.0f;
      r = kt_broadcast(in, in, N, KT_FLOAT32, p - 1, comm);
      for (int i = 0; r == KT_SUCCESS && i < N; i++)
        if (in[i] != (float)(i * 3)) {
          check_failed("broadcast: element %d is %g", i, in[i]);
          break;
        }
    } else {
      r = kt_barrier(comm);
    }
    if (r != KT_SUCCESS) {
      snprintf(msg, sizeof msg, "%s", kt_last_error());
      report_error(what[k], r, msg, mono_ms() - t0);
      check_failed("%s failed (%s) although every rank called it, rank %d only %lld ms late: %s", what[k],
                   code_name(r, name, sizeof name), (k + 1) % p, (long long)pause, msg);
      break;
    }
  }
  destroy_checked(comm);
  free(in);
  free(out);
  free(counts);
  free(displs);
  return finish("late: every operation succeeded", 0);
}

/* Test 4: kt_comm_abort from another thread. */
typedef struct abort_ctx {
  kt_comm comm;
  bool queue_one;       /* issue a request behind the blocked operation first */
  float *a, *b;
  int64_t t_abort;      /* mono ms when kt_comm_abort was called */
  kt_result queued_r, abort_r;
  int64_t queued_dt;    /* ms from abort to the queued request's completion */
  char queued_msg[1024];
} abort_ctx;

static void *abort_thread(void *arg) {
  abort_ctx *x = arg;
  kt_request req = NULL;
  sleep_ms(300); /* the main thread is blocked in its collective by now */
  kt_result ir = KT_SUCCESS;
  if (x->queue_one) ir = kt_iallreduce(x->a, x->b, 64, KT_FLOAT32, KT_SUM, x->comm, &req);
  sleep_ms(500);
  x->t_abort = mono_ms();
  x->abort_r = kt_comm_abort(x->comm);
  if (x->queue_one) {
    if (ir != KT_SUCCESS) {
      x->queued_r = ir;
      snprintf(x->queued_msg, sizeof x->queued_msg, "kt_iallreduce failed to issue: %s",
               kt_last_error());
      return NULL;
    }
    x->queued_r = kt_wait(req);
    x->queued_dt = mono_ms() - x->t_abort;
    snprintf(x->queued_msg, sizeof x->queued_msg, "%s", kt_last_error());
  }
  return NULL;
}

static int scenario_abort(kt_comm comm) {
  const char *mode = arg("mode", "blocking");
  int64_t wait_for = arg_int("wait_ms", 3000);
  bool blocking = !strcmp(mode, "blocking");
  enum { N = 64 };
  float a[N], b[N], c[N], d[N];
  for (int i = 0; i < N; i++) a[i] = c[i] = 1.0f;
  char name[64], msg[1024];
  if (g_rank != 0) {
    /* Not participating: rank 0 aborts meanwhile; our next collective must
     * fail (abort notice or closed connection), not hang. */
    sleep_ms(wait_for);
    int64_t t0 = mono_ms();
    kt_result r = kt_allreduce(a, b, N, KT_FLOAT32, KT_SUM, comm);
    int64_t dt = mono_ms() - t0;
    snprintf(msg, sizeof msg, "%s", kt_last_error());
    if (r == KT_SUCCESS) {
      late_success("allreduce succeeded although rank 0 aborted its communicator");
    } else {
      report_error("allreduce (after peer's abort)", r, msg, dt);
      if (r == KT_ERR_TIMEOUT)
        check_failed("the peer's abort was not noticed: timed out instead: %s", msg);
      if (dt > 1500)
        check_failed("took %lld ms to notice rank 0's abort (expected at once)", (long long)dt);
      if (!names_rank(msg, 0)) check_failed("the error does not name rank 0: %s", msg);
    }
    destroy_checked(comm);
    return finish("abort: the aborting peer was noticed", 0);
  }
  abort_ctx x = {.comm = comm, .queue_one = blocking, .a = c, .b = d};
  pthread_t th;
  kt_request first = NULL, second = NULL;
  kt_result r2 = KT_SUCCESS;
  if (!blocking) {
    /* Both requests run on the progress thread; the first blocks. */
    if (kt_iallreduce(a, b, N, KT_FLOAT32, KT_SUM, comm, &first) != KT_SUCCESS ||
        kt_iallreduce(c, d, N, KT_FLOAT32, KT_SUM, comm, &second) != KT_SUCCESS) {
      check_failed("cannot issue the non-blocking allreduces: %s", kt_last_error());
      return 1;
    }
  }
  if (pthread_create(&th, NULL, abort_thread, &x) != 0) {
    fprintf(stderr, "fault_prog: pthread_create failed\n");
    return 2;
  }
  int64_t t0 = mono_ms();
  kt_result r = blocking ? kt_allreduce(a, b, N, KT_FLOAT32, KT_SUM, comm) : kt_wait(first);
  int64_t t_ret = mono_ms();
  snprintf(msg, sizeof msg, "%s", kt_last_error());
  if (!blocking) {
    r2 = kt_wait(second);
    int64_t t2 = mono_ms();
    snprintf(x.queued_msg, sizeof x.queued_msg, "%s", kt_last_error());
    pthread_join(th, NULL);
    x.queued_r = r2;
    x.queued_dt = t2 - x.t_abort;
  } else {
    pthread_join(th, NULL);
  }
  if (x.abort_r != KT_SUCCESS) check_failed("kt_comm_abort returned %s", code_name(x.abort_r, name, sizeof name));
  const char *waiter = blocking ? "blocked kt_allreduce" : "kt_wait on the blocked kt_iallreduce";
  if (r != KT_SUCCESS) report_error(waiter, r, msg, t_ret - t0);
  if (r != KT_ERR_ABORTED)
    check_failed("%s returned %s, expected KT_ERR_ABORTED: %s", waiter, code_name(r, name, sizeof name), msg);
  if (t_ret < x.t_abort)
    check_failed("%s returned before kt_comm_abort was called: %s", waiter, msg);
  else if (t_ret - x.t_abort > 1000)
    check_failed("%s returned %lld ms after kt_comm_abort (expected promptly)", waiter,
                 (long long)(t_ret - x.t_abort));
  if (x.queued_r == KT_SUCCESS)
    check_failed("the request queued behind the blocked one succeeded after kt_comm_abort");
  else
    report_error("kt_wait (queued request)", x.queued_r, x.queued_msg, x.queued_dt);
  if (x.queued_dt > 1500)
    check_failed("the queued request completed %lld ms after kt_comm_abort", (long long)x.queued_dt);
  /* Later operations fail at once with the abort. */
  use_after_failure(comm, KT_ERR_ABORTED, 1);
  destroy_checked(comm);
  return finish(blocking ? "abort: blocked waiter and queued request released"
                         : "abort: waiting requests released", 0);
}

/* Test 6: ranks that finish at different times are not failures. */
static int scenario_graceful(kt_comm comm) {
  const char *kind = arg("kind", "late_destroy");
  char name[64];
  if (!strcmp(kind, "late_destroy")) {
    size_t n = 1 << 20;
    float *in = alloc_floats(n, (float)(g_rank + 1)), *out = alloc_floats(n, 0.0f);
    kt_result r = kt_allreduce(in, out, n, KT_FLOAT32, KT_SUM, comm);
    if (r != KT_SUCCESS)
      check_failed("allreduce failed: %s: %s", code_name(r, name, sizeof name), kt_last_error());
    else
      check_floats("allreduce", out, n, (float)g_size * (float)(g_size + 1) / 2.0f);
    if (g_rank == 0) {
      sleep_ms(2000); /* the others have destroyed theirs and exited meanwhile */
      kt_result e = kt_comm_get_error(comm);
      if (e != KT_SUCCESS)
        check_failed("the communicator broke while the other ranks exited normally: %s: %s",
                     code_name(e, name, sizeof name), kt_last_error());
    }
    destroy_checked(comm);
    free(in);
    free(out);
    return finish("graceful: late destroy", 0);
  }
  if (strcmp(kind, "p2p") != 0) {
    fprintf(stderr, "fault_prog graceful: unknown kind=%s\n", kind);
    return 2;
  }
  if (g_size < 3) {
    fprintf(stderr, "fault_prog graceful kind=p2p needs 3 ranks\n");
    return 2;
  }
  size_t n = 1 << 20;
  if (g_rank >= 2) { /* leaves at once, normally */
    destroy_checked(comm);
    return finish("graceful: left early", 0);
  }
  float *buf = alloc_floats(n, 0.0f);
  kt_result r;
  if (g_rank == 1) {
    sleep_ms(2000);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 1000);
    r = kt_send(buf, n, KT_FLOAT32, 0, 7, comm);
    if (r != KT_SUCCESS)
      check_failed("send to rank 0 failed: %s: %s", code_name(r, name, sizeof name), kt_last_error());
    r = kt_recv(buf, n, KT_FLOAT32, 0, 8, comm);
    if (r != KT_SUCCESS) {
      check_failed("recv from rank 0 failed: %s: %s", code_name(r, name, sizeof name), kt_last_error());
    } else {
      for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(2 * (i % 1000))) {
          check_failed("reply element %zu is %g, expected %g", i, (double)buf[i], (double)(2 * (i % 1000)));
          break;
        }
    }
  } else {
    int64_t t0 = mono_ms();
    r = kt_recv(buf, n, KT_FLOAT32, 1, 7, comm);
    int64_t dt = mono_ms() - t0;
    if (r != KT_SUCCESS) {
      check_failed("recv from rank 1 (alive, sending after 2 s) failed while rank 2 exited "
                   "normally: %s: %s", code_name(r, name, sizeof name), kt_last_error());
    } else {
      for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(i % 1000)) {
          check_failed("received element %zu is %g, expected %g", i, (double)buf[i], (double)(i % 1000));
          break;
        }
      if (dt < 1000) check_failed("recv returned after %lld ms, before rank 1 sent (test broken?)", (long long)dt);
      for (size_t i = 0; i < n; i++) buf[i] *= 2.0f;
      r = kt_send(buf, n, KT_FLOAT32, 1, 8, comm);
      if (r != KT_SUCCESS)
        check_failed("reply to rank 1 failed: %s: %s", code_name(r, name, sizeof name), kt_last_error());
    }
    kt_result e = kt_comm_get_error(comm);
    if (e != KT_SUCCESS)
      check_failed("communicator broken after rank 2's normal exit: %s", kt_last_error());
  }
  destroy_checked(comm);
  free(buf);
  return finish("graceful: p2p survived a third rank's exit", 0);
}

/* Every communicator made before any of them sends: the point-to-point
 * rings of the first are reserved last, after the others took their room. */
static int scenario_comms(kt_comm comm) {
  int count = (int)arg_int("count", 3);
  size_t bytes = (size_t)arg_int("bytes", 65536);
  if (count < 1 || count > 64 || bytes < 1) {
    fprintf(stderr, "fault_prog comms: count must be 1-64 and bytes positive\n");
    return 2;
  }
  kt_comm comms[64] = {comm};
  unsigned char *sb = malloc(bytes), *rb = malloc(bytes);
  if (!sb || !rb) return 2;
  int made = 1, status = 0;
  kt_result r = KT_SUCCESS;
  char name[64];
  for (; made < count && r == KT_SUCCESS; made++) {
    r = kt_comm_split(comm, 0, g_rank, &comms[made]);
    if (r != KT_SUCCESS) {
      fprintf(stderr, "FAULT_ERROR rank=%d t_ms=%lld elapsed_ms=0 code=%s msg=communicator %d: %s\n", g_rank,
              (long long)realtime_ms(), code_name(r, name, sizeof name), made, kt_last_error());
      status = 1;
    }
  }
  if (r != KT_SUCCESS) made--;
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  for (int i = made - 1; i >= 0 && status == 0; i--) {
    for (size_t k = 0; k < bytes; k++) sb[k] = (unsigned char)(g_rank * 31 + i * 7 + k);
    memset(rb, 0, bytes);
    r = kt_sendrecv(sb, bytes, next, rb, bytes, prev, KT_UINT8, 5, comms[i]);
    if (r != KT_SUCCESS) {
      fprintf(stderr, "FAULT_ERROR rank=%d t_ms=%lld elapsed_ms=0 code=%s msg=communicator %d of %d: %s\n", g_rank,
              (long long)realtime_ms(), code_name(r, name, sizeof name), i, made, kt_last_error());
      status = 1;
      break;
    }
    for (size_t k = 0; k < bytes; k++)
      if (rb[k] != (unsigned char)(prev * 31 + i * 7 + k)) {
        check_failed("communicator %d: byte %zu from rank %d is %u, expected %u", i, k, prev, rb[k],
                     (unsigned char)(prev * 31 + i * 7 + k));
        break;
      }
  }
  for (int i = made - 1; i >= 1; i--) kt_comm_destroy(comms[i]);
  kt_comm_destroy(comm);
  free(sb);
  free(rb);
  if (status) return status;
  char what[64];
  snprintf(what, sizeof what, "comms count=%d", made);
  return finish(what, 0);
}

int main(int argc, char **argv) {
  g_argc = argc;
  g_argv = argv;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: fault_prog SCENARIO [key=value ...] (see the file's head)\n");
    return 2;
  }
  kt_comm comm = NULL;
  kt_result r = kt_comm_init_env(&comm);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "fault_prog: kt_comm_init_env failed: %s: %s\n", kt_strerror(r), kt_last_error());
    return 2;
  }
  kt_comm_rank(comm, &g_rank);
  kt_comm_size(comm, &g_size);
  const char *s = argv[1];
  if (!strcmp(s, "killloop")) return scenario_killloop(comm);
  if (!strcmp(s, "deadpeer")) return scenario_deadpeer(comm);
  if (!strcmp(s, "timeout")) return scenario_timeout(comm);
  if (!strcmp(s, "mismatch")) return scenario_mismatch(comm);
  if (!strcmp(s, "abort")) return scenario_abort(comm);
  if (!strcmp(s, "graceful")) return scenario_graceful(comm);
  if (!strcmp(s, "late")) return scenario_late(comm);
  if (!strcmp(s, "chaos")) return scenario_chaos(comm);
  if (!strcmp(s, "comms")) return scenario_comms(comm);
  fprintf(stderr, "fault_prog: unknown scenario '%s'\n", s);
  kt_comm_destroy(comm);
  return 2;
}
