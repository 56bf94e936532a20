/* mpi_bench.c - the MPI side of bench/compare, bench/compare_peers and
 * bench/compare_hosts: times
 * MPI_Allreduce, MPI_Bcast, MPI_Reduce, MPI_Allgather,
 * MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Gather, MPI_Scatter and
 * MPI_Barrier the way `kaitian bench` times KaiTian and prints the same CSV
 * lines. Built by those scripts with Open MPI's mpicc and MPICH's mpicc.mpich.
 *
 *   mpirun -np 2 ./mpi_bench -C allreduce -d float -b 8 -e 64M -n 20 -w 5 -I --csv
 *
 * Time per size: each rank runs -w untimed iterations, an MPI_Barrier, then -n
 * timed ones under CLOCK_MONOTONIC; its average per iteration is reduced with
 * MAX over ranks (the slowest rank), in microseconds. Sizes follow kaitian
 * bench: for allreduce and broadcast one rank's buffer, for allgather and
 * reduce_scatter the whole n x count buffer, rounded down to whole elements.
 * After timing, every size is run once more on inputs whose result is known in
 * closed form and every output element of every rank is compared (column
 * #wrong); any wrong value makes the exit status 1.
 *
 * Open MPI has no bfloat16 type: -d bfloat16 runs on MPI_UINT16_T with a
 * user-defined, commutative MPI_Op that adds two bfloat16 values in float32 and
 * rounds to nearest even, so it is a real bfloat16 sum. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum coll_id {
  C_ALLREDUCE,
  C_BROADCAST,
  C_REDUCE,
  C_ALLGATHER,
  C_REDUCE_SCATTER,
  C_ALLTOALL,
  C_GATHER,
  C_SCATTER,
  C_BARRIER,
  C_NUM
};

typedef struct coll_info {
  const char *name;
  bool reduces; /* takes the op */
  bool rooted;  /* takes the root */
  bool total;   /* size counts all n blocks */
} coll_info;

static const coll_info colls[C_NUM] = {
    [C_ALLREDUCE] = {"allreduce", true, false, false},
    [C_BROADCAST] = {"broadcast", false, true, false},
    [C_REDUCE] = {"reduce", true, true, false},
    [C_ALLGATHER] = {"allgather", false, false, true},
    [C_REDUCE_SCATTER] = {"reduce_scatter", true, false, true},
    [C_ALLTOALL] = {"alltoall", false, false, true},
    [C_GATHER] = {"gather", false, true, true},
    [C_SCATTER] = {"scatter", false, true, true},
    [C_BARRIER] = {"barrier", false, false, false},
};

/* Bus-bandwidth factor, the same as kaitian bench's (docs/bench.md). */
static double bus_factor(int c, int n) {
  switch (c) {
    case C_ALLREDUCE: return 2.0 * (n - 1) / n;
    case C_BROADCAST: case C_REDUCE: return 1.0;
    case C_BARRIER: return 0.0;
    default: return (double)(n - 1) / n;
  }
}

typedef enum { T_FLOAT32, T_BFLOAT16 } dtype;

typedef struct options {
  uint64_t minbytes, maxbytes, factor, stepbytes; /* stepbytes: -s adds it each step (0: -f multiplies) */
  uint64_t iters_bytes, warmup_bytes; /* --iters-bytes, --warmup-bytes (0: off) */
  int iters, warmup, root;
  unsigned colls; /* bit per coll_id */
  dtype type;
  bool inplace;
} options;

typedef struct bench {
  options o;
  int rank, nranks;
  size_t esize;
  MPI_Datatype mtype;
  MPI_Op mop;
  unsigned char *sbuf, *rbuf; /* maxbytes each, freed in main */
} bench;

/* ---- bfloat16 ------------------------------------------------------------- */

static float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; a NaN stays a (quiet) NaN. */
static uint16_t float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t nan = (uint16_t)((u >> 16) | 0x40);
  uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

/* MPI_User_function: inout[i] = bf16(float(in[i]) + float(inout[i])). */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  int n = *len;
  for (int i = 0; i < n; i++) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

/* ---- data ----------------------------------------------------------------- */

/* Input element j of rank q: small integers, exact in bfloat16 for any sum of
 * up to 8 ranks (at most 8 x 8 x 3 = 192 < 256). */
static double input_value(int q, size_t j) { return (double)((q % 8 + 1) * (int)(1 + j % 3)); }

static void store(const bench *b, void *buf, size_t k, double v) {
  if (b->o.type == T_FLOAT32) ((float *)buf)[k] = (float)v;
  else ((uint16_t *)buf)[k] = float_to_bf16((float)v);
}

static double load(const bench *b, const void *buf, size_t k) {
  if (b->o.type == T_FLOAT32) return ((const float *)buf)[k];
  return bf16_to_float(((const uint16_t *)buf)[k]);
}

/* Where one call reads and writes, as kaitian bench lays out its buffers (in
 * place: allgather's and gather's input is this rank's block of the output;
 * reduce_scatter reads the whole buffer and, as MPI_IN_PLACE defines it,
 * leaves this rank's block at its start; scatter's root keeps its own block
 * where it lies in its input). */
typedef struct layout {
  void *send, *recv;  /* the call's arguments: MPI_IN_PLACE where in place */
  void *in;           /* where this rank's input lies */
  void *out;          /* where this rank's output lies */
  size_t in_count;    /* input elements at in */
  size_t in_first;    /* index of the first input element in the rank's whole input */
  size_t out_count;   /* output elements at out (0: none on this rank) */
} layout;

static layout make_layout(const bench *b, int c, size_t count) {
  size_t n = (size_t)b->nranks, off = (size_t)b->rank * count * b->esize;
  bool ip = b->o.inplace, is_root = b->rank == b->o.root;
  layout L = {b->sbuf, b->rbuf, b->sbuf, b->rbuf, count, 0, count};
  switch (c) {
    case C_ALLREDUCE:
      if (ip) L.send = MPI_IN_PLACE, L.in = b->rbuf;
      break;
    case C_BROADCAST:
      L.send = L.in = b->rbuf; /* one buffer: the root's input, everyone's output */
      break;
    case C_ALLGATHER:
      L.out_count = n * count;
      L.in_first = (size_t)b->rank * count;
      if (ip) L.send = MPI_IN_PLACE, L.in = b->rbuf + off;
      break;
    case C_REDUCE_SCATTER:
      L.in_count = n * count;
      if (ip) L.send = MPI_IN_PLACE, L.in = b->rbuf;
      break;
    case C_REDUCE: /* MPI_IN_PLACE is the root's only; the others send from recvbuf
                    * and pass the other buffer as their (unused) recvbuf */
      L.out_count = is_root ? count : 0;
      if (ip) L.in = b->rbuf, L.send = is_root ? MPI_IN_PLACE : b->rbuf, L.recv = is_root ? b->rbuf : b->sbuf;
      break;
    case C_ALLTOALL:
      L.in_count = L.out_count = n * count;
      if (ip) L.send = MPI_IN_PLACE, L.in = b->rbuf;
      break;
    case C_GATHER:
      L.in_first = (size_t)b->rank * count;
      L.out_count = is_root ? n * count : 0;
      if (ip) L.in = b->rbuf + off, L.send = is_root ? MPI_IN_PLACE : b->rbuf + off;
      break;
    case C_SCATTER:
      L.in_count = n * count;
      if (ip && is_root) L.recv = MPI_IN_PLACE, L.out = b->sbuf + off;
      break;
    case C_BARRIER:
      L.in_count = L.out_count = 0;
      break;
  }
  return L;
}

static int run_once(const bench *b, int c, const layout *L, size_t count) {
  int cnt = (int)count;
  switch (c) {
    case C_ALLREDUCE:
      return MPI_Allreduce(L->send, L->recv, cnt, b->mtype, b->mop, MPI_COMM_WORLD);
    case C_BROADCAST:
      return MPI_Bcast(L->recv, cnt, b->mtype, b->o.root, MPI_COMM_WORLD);
    case C_ALLGATHER:
      if (L->send == MPI_IN_PLACE)
        return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, L->recv, cnt, b->mtype,
                             MPI_COMM_WORLD);
      return MPI_Allgather(L->send, cnt, b->mtype, L->recv, cnt, b->mtype, MPI_COMM_WORLD);
    case C_REDUCE:
      return MPI_Reduce(L->send, L->recv, cnt, b->mtype, b->mop, b->o.root, MPI_COMM_WORLD);
    case C_REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(L->send, L->recv, cnt, b->mtype, b->mop, MPI_COMM_WORLD);
    case C_ALLTOALL:
      if (L->send == MPI_IN_PLACE)
        return MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, L->recv, cnt, b->mtype,
                            MPI_COMM_WORLD);
      return MPI_Alltoall(L->send, cnt, b->mtype, L->recv, cnt, b->mtype, MPI_COMM_WORLD);
    case C_GATHER:
      if (L->send == MPI_IN_PLACE)
        return MPI_Gather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, L->recv, cnt, b->mtype, b->o.root,
                          MPI_COMM_WORLD);
      return MPI_Gather(L->send, cnt, b->mtype, L->recv, cnt, b->mtype, b->o.root, MPI_COMM_WORLD);
    case C_SCATTER:
      if (L->recv == MPI_IN_PLACE)
        return MPI_Scatter(L->send, cnt, b->mtype, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b->o.root,
                           MPI_COMM_WORLD);
      return MPI_Scatter(L->send, cnt, b->mtype, L->recv, cnt, b->mtype, b->o.root, MPI_COMM_WORLD);
    default:
      return MPI_Barrier(MPI_COMM_WORLD);
  }
}

/* Prints a failed MPI call with the rank and what was being done, then aborts
 * the job (MPI's default handler would abort too, without the context). */
static void mpi_fail(const bench *b, int c, size_t count, const char *what, int err) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", err);
  fprintf(stderr, "mpi_bench: rank %d: %s failed in %s (count %zu, %s%s): %s\n", b->rank, what,
          colls[c].name, count, b->o.type == T_FLOAT32 ? "float32" : "bfloat16",
          b->o.inplace ? ", in place" : "", text);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* n, or more iterations where that many of size bytes fall short of want
 * bytes (--iters-bytes, --warmup-bytes), as `kaitian bench` counts them. */
static int at_least(int n, uint64_t want, uint64_t size) {
  if (!want || !size) return n;
  uint64_t k = (want + size - 1) / size;
  return k > (uint64_t)n ? (int)(k < INT32_MAX ? k : INT32_MAX) : n;
}

/* Average time of one call on the slowest rank, microseconds. Aborts the job
 * on an MPI failure. */
static double time_size(const bench *b, int c, size_t count, uint64_t bytes) {
  layout L = make_layout(b, c, count);
  int err;
  int warmup = at_least(b->o.warmup, b->o.warmup_bytes, bytes), iters = at_least(b->o.iters, b->o.iters_bytes, bytes);
  for (int i = 0; i < warmup; i++)
    if ((err = run_once(b, c, &L, count)) != MPI_SUCCESS) mpi_fail(b, c, count, "warm-up", err);
  if ((err = MPI_Barrier(MPI_COMM_WORLD)) != MPI_SUCCESS)
    mpi_fail(b, c, count, "barrier before timing", err);
  double t0 = now_us();
  for (int i = 0; i < iters; i++)
    if ((err = run_once(b, c, &L, count)) != MPI_SUCCESS)
      mpi_fail(b, c, count, "timed iteration", err);
  double local = (now_us() - t0) / iters, slowest = 0;
  err = MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (err != MPI_SUCCESS) mpi_fail(b, c, count, "allreduce (max) of the times", err);
  return slowest;
}

/* Expected output element k of this rank, computed from input_value alone. */
static double expected_at(const bench *b, int c, size_t count, size_t k) {
  double sum = 0;
  switch (c) {
    case C_ALLREDUCE: case C_REDUCE:
      for (int q = 0; q < b->nranks; q++) sum += input_value(q, k);
      return sum;
    case C_ALLTOALL: /* block j came from rank j's block for this rank */
      return input_value((int)(k / count), (size_t)b->rank * count + k % count);
    case C_SCATTER: return input_value(b->o.root, (size_t)b->rank * count + k);
    case C_REDUCE_SCATTER:
      for (int q = 0; q < b->nranks; q++) sum += input_value(q, (size_t)b->rank * count + k);
      return sum;
    case C_BROADCAST: return input_value(b->o.root, k);
    default: return input_value((int)(k / count), k); /* allgather, gather: block k / count */
  }
}

/* One checked call on fresh inputs; returns this rank's wrong output elements
 * (the first is printed). Aborts the job on an MPI failure. */
static long long check_size(const bench *b, int c, size_t count) {
  layout L = make_layout(b, c, count);
  size_t out_bytes = L.out_count * b->esize;
  memset(b->rbuf, 0xa5, out_bytes > L.in_count * b->esize ? out_bytes : L.in_count * b->esize);
  if ((c != C_BROADCAST && c != C_SCATTER) || b->rank == b->o.root)
    for (size_t k = 0; k < L.in_count; k++)
      store(b, L.in, k, input_value(b->rank, L.in_first + k));
  int err = run_once(b, c, &L, count);
  if (err != MPI_SUCCESS) mpi_fail(b, c, count, "checked iteration", err);
  long long wrong = 0;
  for (size_t k = 0; k < L.out_count; k++) {
    double want = expected_at(b, c, count, k), got = load(b, L.out, k);
    if (got == want) continue;
    if (wrong++ == 0)
      fprintf(stderr, "mpi_bench: rank %d: %s count %zu %s%s: index %zu: expected %g, got %g\n",
              b->rank, colls[c].name, count, b->o.type == T_FLOAT32 ? "float32" : "bfloat16",
              b->o.inplace ? " in place" : "", k, want, got);
  }
  return wrong;
}

/* Time and check collective c at every size, one CSV line per size on rank 0.
 * Returns the wrong elements over all ranks and sizes. */
static long long bench_coll(bench *b, int c) {
  size_t unit = b->esize * (colls[c].total ? (size_t)b->nranks : 1);
  long long wrong_total = 0;
  if (c == C_BARRIER) { /* one row, no data */
    double us = time_size(b, c, 0, 0);
    if (b->rank == 0) {
      printf("barrier,0,0,%s,none,-1,%.3f,0.0000,0.0000,0\n", b->o.type == T_FLOAT32 ? "float32" : "bfloat16",
             us);
      fflush(stdout);
    }
    return 0;
  }
  for (uint64_t size = b->o.minbytes; size <= b->o.maxbytes;
       size = b->o.stepbytes ? size + b->o.stepbytes : size ? size * b->o.factor : 1) {
    size_t count = (size_t)(size / unit), bytes = count * unit;
    if (count > 0) {
      double us = time_size(b, c, count, bytes);
      long long wrong = check_size(b, c, count), wrong_all = 0;
      int err = MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (err != MPI_SUCCESS) mpi_fail(b, c, count, "allreduce (sum) of #wrong", err);
      wrong_total += wrong_all;
      double algbw = (double)bytes / us / 1e3, busbw = algbw * bus_factor(c, b->nranks);
      if (b->rank == 0) {
        printf("%s,%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%lld\n", colls[c].name, bytes, count,
               b->o.type == T_FLOAT32 ? "float32" : "bfloat16", colls[c].reduces ? "sum" : "none",
               colls[c].rooted ? b->o.root : -1, us, algbw, busbw, wrong_all);
        fflush(stdout);
      }
    }
    if (size > UINT64_MAX / b->o.factor || size > UINT64_MAX - b->o.stepbytes) break;
  }
  return wrong_total;
}

/* ---- options -------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
      "usage: mpirun -np N mpi_bench [options]\n\n"
      "Times MPI collectives like `kaitian bench` and prints its CSV lines\n"
      "  collective,size,count,type,redop,root,time,algbw,busbw,#wrong\n"
      "(time: microseconds, the average of -n iterations on the slowest rank).\n"
      "Each size is also checked once (column #wrong).\n\n"
      "  -b, --minbytes SIZE     smallest size in bytes (default 8)\n"
      "  -e, --maxbytes SIZE     largest size in bytes (default 32M)\n"
      "  -f, --stepfactor N      size step factor (default 2, >= 2)\n"
      "  -s, --stepbytes SIZE    add SIZE each step instead of multiplying\n"
      "  -n, --iters N           timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N    warm-up iterations per size (default 5)\n"
      "      --iters-bytes SIZE  at least SIZE bytes' worth of timed iterations per size\n"
      "      --warmup-bytes SIZE the same for the warm-up (as kaitian bench)\n"
      "  -d, --datatype TYPE     float|float32 or bfloat16 (user-defined MPI_Op on\n"
      "                          MPI_UINT16_T, sums in float32; default float)\n"
      "  -o, --op OP             sum only\n"
      "  -r, --root R            root of broadcast, reduce, gather, scatter (default 0)\n"
      "  -C, --coll LIST         comma-separated: allreduce broadcast reduce allgather\n"
      "                          reduce_scatter alltoall gather scatter barrier\n"
      "                          (default allreduce)\n"
      "  -I, --inplace           MPI_IN_PLACE where the call takes it\n"
      "      --csv               accepted for kaitian bench's command line; the\n"
      "                          output is always CSV\n"
      "  -h, --help              this text\n"
      "SIZE takes a K, M or G suffix (powers of 1024).\n"
      "Exit status: 0 success, 1 a wrong value (MPI failures abort), 2 bad usage.\n");
}

static bool parse_u64(const char *name, const char *text, bool suffix, uint64_t *out) {
  char *end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  uint64_t mult = 1;
  if (end != text && suffix && *end) {
    switch (*end) {
      case 'k': case 'K': mult = 1ull << 10; end++; break;
      case 'm': case 'M': mult = 1ull << 20; end++; break;
      case 'g': case 'G': mult = 1ull << 30; end++; break;
      default: break;
    }
  }
  if (end == text || *end || text[0] == '-' || v > UINT64_MAX / mult) {
    fprintf(stderr, "mpi_bench: %s: expected a non-negative number%s, got '%s'\n", name,
            suffix ? " with an optional K, M or G suffix" : "", text);
    return false;
  }
  *out = v * mult;
  return true;
}

static bool parse_int(const char *name, const char *text, int lo, int *out) {
  uint64_t v;
  if (!parse_u64(name, text, false, &v)) return false;
  if (v < (uint64_t)lo || v > 1000000000u) {
    fprintf(stderr, "mpi_bench: %s must be in %d..1000000000, got %s\n", name, lo, text);
    return false;
  }
  *out = (int)v;
  return true;
}

static bool parse_colls(const char *text, unsigned *out) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text);
  *out = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int c = 0;
    while (c < C_NUM && strcmp(tok, colls[c].name) != 0) c++;
    if (c == C_NUM) {
      fprintf(stderr, "mpi_bench: -C: unknown collective '%s' (known: allreduce broadcast reduce "
              "allgather reduce_scatter alltoall gather scatter barrier)\n", tok);
      return false;
    }
    *out |= 1u << c;
  }
  if (!*out) fprintf(stderr, "mpi_bench: -C: empty list\n");
  return *out != 0;
}

/* 0: run; 1: help printed; 2: usage error printed. */
static int parse_args(options *o, int argc, char **argv) {
  static const struct option longs[] = {
      {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'}, {"iters", required_argument, NULL, 'n'},
      {"stepbytes", required_argument, NULL, 's'},
      {"warmup_iters", required_argument, NULL, 'w'}, {"datatype", required_argument, NULL, 'd'},
      {"op", required_argument, NULL, 'o'}, {"root", required_argument, NULL, 'r'},
      {"coll", required_argument, NULL, 'C'}, {"inplace", no_argument, NULL, 'I'},
      {"csv", no_argument, NULL, 'S'}, {"help", no_argument, NULL, 'h'},
      {"iters-bytes", required_argument, NULL, 'N'}, {"warmup-bytes", required_argument, NULL, 'W'},
      {NULL, 0, NULL, 0}};
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, ":b:e:f:s:n:w:d:o:r:C:Ih", longs, NULL)) != -1) {
    bool ok = true;
    switch (ch) {
      case 'b': ok = parse_u64("-b", optarg, true, &o->minbytes); break;
      case 'e': ok = parse_u64("-e", optarg, true, &o->maxbytes); break;
      case 'f': ok = parse_u64("-f", optarg, false, &o->factor); break;
      case 's': ok = parse_u64("-s", optarg, true, &o->stepbytes); break;
      case 'n': ok = parse_int("-n", optarg, 1, &o->iters); break;
      case 'w': ok = parse_int("-w", optarg, 0, &o->warmup); break;
      case 'N':
      case 'W': {
        uint64_t *v = ch == 'N' ? &o->iters_bytes : &o->warmup_bytes;
        ok = parse_u64(ch == 'N' ? "--iters-bytes" : "--warmup-bytes", optarg, true, v);
        if (ok && *v > UINT64_MAX / 2) {
          fprintf(stderr, "mpi_bench: %s: at most %llu\n", ch == 'N' ? "--iters-bytes" : "--warmup-bytes",
                  (unsigned long long)(UINT64_MAX / 2));
          ok = false;
        }
        break;
      }
      case 'r': ok = parse_int("-r", optarg, 0, &o->root); break;
      case 'C': ok = parse_colls(optarg, &o->colls); break;
      case 'I': o->inplace = true; break;
      case 'S': break;
      case 'h': return 1;
      case 'd':
        if (!strcmp(optarg, "float") || !strcmp(optarg, "float32")) o->type = T_FLOAT32;
        else if (!strcmp(optarg, "bfloat16")) o->type = T_BFLOAT16;
        else {
          fprintf(stderr, "mpi_bench: -d: unsupported datatype '%s' (float, float32, bfloat16)\n",
                  optarg);
          ok = false;
        }
        break;
      case 'o':
        if (strcmp(optarg, "sum") != 0) {
          fprintf(stderr, "mpi_bench: -o: only sum is supported, got '%s'\n", optarg);
          ok = false;
        }
        break;
      case ':':
        fprintf(stderr, "mpi_bench: option '%s' needs a value\n", argv[optind - 1]);
        ok = false;
        break;
      default:
        fprintf(stderr, "mpi_bench: unknown option '%s' (see --help)\n", argv[optind - 1]);
        ok = false;
        break;
    }
    if (!ok) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "mpi_bench: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
  }
  if (o->factor < 2) {
    fprintf(stderr, "mpi_bench: -f must be at least 2, got %llu\n", (unsigned long long)o->factor);
    return 2;
  }
  if (o->minbytes > o->maxbytes) {
    fprintf(stderr, "mpi_bench: -b %llu is above -e %llu\n", (unsigned long long)o->minbytes,
            (unsigned long long)o->maxbytes);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  bench b = {.o = {.minbytes = 8, .maxbytes = 32u << 20, .factor = 2, .iters = 20, .warmup = 5,
                   .colls = 1u << C_ALLREDUCE, .type = T_FLOAT32}};
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
  int rc = parse_args(&b.o, argc, argv);
  if (rc == 1 && b.rank == 0) usage(stdout);
  if (rc) {
    MPI_Finalize();
    return rc == 1 ? 0 : 2;
  }
  if (b.o.root >= b.nranks) {
    if (b.rank == 0)
      fprintf(stderr, "mpi_bench: root %d out of range: there are %d ranks\n", b.o.root, b.nranks);
    MPI_Finalize();
    return 2;
  }
  /* Every count handed to MPI must fit an int. */
  if (b.o.maxbytes / 2 > (uint64_t)0x7fffffff) {
    if (b.rank == 0)
      fprintf(stderr, "mpi_bench: -e %llu is too large: MPI counts are ints\n",
              (unsigned long long)b.o.maxbytes);
    MPI_Finalize();
    return 2;
  }
  b.esize = b.o.type == T_FLOAT32 ? 4 : 2;
  b.mtype = b.o.type == T_FLOAT32 ? MPI_FLOAT : MPI_UINT16_T;
  if (b.o.type == T_FLOAT32) b.mop = MPI_SUM;
  else MPI_Op_create(bf16_sum, 1, &b.mop);
  size_t cap = (size_t)b.o.maxbytes ? (size_t)b.o.maxbytes : 1;
  if (posix_memalign((void **)&b.sbuf, 4096, cap) != 0 ||
      posix_memalign((void **)&b.rbuf, 4096, cap) != 0) {
    fprintf(stderr, "mpi_bench: rank %d: cannot allocate 2 buffers of %zu bytes (-e)\n", b.rank,
            cap);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Realistic data for the timed iterations (touches every page, too). */
  for (size_t k = 0; k < cap / b.esize; k++) {
    store(&b, b.sbuf, k, input_value(b.rank, k));
    store(&b, b.rbuf, k, input_value(b.rank, k));
  }
  if (b.rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, "\n,")] = '\0';
    printf("# mpi_bench, %s\n", version);
    printf("# ranks %d  datatype %s  op sum  root %d  in-place %s  warm-up %d  iters %d\n",
           b.nranks, b.o.type == T_FLOAT32 ? "float32" : "bfloat16 (MPI_UINT16_T, user op)",
           b.o.root, b.o.inplace ? "yes" : "no", b.o.warmup, b.o.iters);
    printf("# sizes %llu .. %llu bytes, factor %llu; time = average over the iterations of the "
           "slowest rank\n", (unsigned long long)b.o.minbytes, (unsigned long long)b.o.maxbytes,
           (unsigned long long)b.o.factor);
    printf("# collective,size,count,type,redop,root,time,algbw,busbw,#wrong\n");
    fflush(stdout);
  }
  long long wrong = 0;
  for (int c = 0; c < C_NUM; c++)
    if (b.o.colls & (1u << c)) wrong += bench_coll(&b, c);
  if (b.rank == 0) {
    printf("# wrong values: %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    fflush(stdout);
  }
  if (b.o.type == T_BFLOAT16) MPI_Op_free(&b.mop);
  free(b.sbuf);
  free(b.rbuf);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
