/* bench.c - `kaitian bench`: nccl-tests-style timing (and, with -c, checking)
 * of every collective, run inside each rank started by `kaitian run`. */
#include "tool.h"

#include "bench_data.h"
#include "coll/coll.h" /* kt__algo_for: --thresholds */
#include "comm.h"      /* the communicator's group, for kt__algo_for */

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- collectives --------------------------------------------------------- */

enum coll_id {
  C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCE_SCATTER,
  C_ALLTOALL, C_GATHER, C_SCATTER, C_SENDRECV, C_BARRIER, C_MEMCPY, C_NUM
};
/* What -C all (and no -C) runs: every collective; memcpy is the memory
 * reference, named on its own. */
#define C_ALL_MASK ((1u << C_MEMCPY) - 1)

/* Bus-bandwidth factor, as nccl-tests defines it (doc in docs/bench.md). */
enum bus_kind { BUS_ONE, BUS_RING, BUS_ALLREDUCE, BUS_NONE };

typedef struct coll_info {
  const char *name;
  bool reduces;       /* takes -o */
  bool rooted;        /* takes -r */
  bool total;         /* size counts all n blocks: count = size / (n * elemsize) */
  enum bus_kind bus;
  const char *bus_text;
} coll_info;

static const coll_info colls[C_NUM] = {
    [C_ALLREDUCE] = {"allreduce", true, false, false, BUS_ALLREDUCE, "2(n-1)/n"},
    [C_BROADCAST] = {"broadcast", false, true, false, BUS_ONE, "1"},
    [C_REDUCE] = {"reduce", true, true, false, BUS_ONE, "1"},
    [C_ALLGATHER] = {"allgather", false, false, true, BUS_RING, "(n-1)/n"},
    [C_REDUCE_SCATTER] = {"reduce_scatter", true, false, true, BUS_RING, "(n-1)/n"},
    [C_ALLTOALL] = {"alltoall", false, false, true, BUS_RING, "(n-1)/n"},
    [C_GATHER] = {"gather", false, true, true, BUS_RING, "(n-1)/n"},
    [C_SCATTER] = {"scatter", false, true, true, BUS_RING, "(n-1)/n"},
    [C_SENDRECV] = {"sendrecv", false, false, false, BUS_ONE, "1"},
    [C_BARRIER] = {"barrier", false, false, false, BUS_NONE, "-"},
    [C_MEMCPY] = {"memcpy", false, false, false, BUS_ONE, "1"},
};

static double bus_factor(enum bus_kind k, int n) {
  switch (k) {
    case BUS_RING: return (double)(n - 1) / n;
    case BUS_ALLREDUCE: return 2.0 * (n - 1) / n;
    case BUS_ONE: return 1.0;
    default: return 0.0;
  }
}

/* ---- options ------------------------------------------------------------- */

typedef struct options {
  uint64_t minbytes, maxbytes, factor;
  uint64_t stepbytes;                 /* -s: add this each step instead of multiplying (0: off) */
  uint64_t iters_bytes, warmup_bytes; /* --iters-bytes, --warmup-bytes (0: off) */
  int iters, warmup, check, root;
  kt_dtype dtype;
  kt_op op;
  unsigned colls; /* bit per enum coll_id */
  bool inplace, csv, inject, registered, thresholds;
} options;

#define MAX_RECORDS 10

/* The size after `size`: -s adds, -f multiplies (0 steps to 1). */
static uint64_t next_size(const options *o, uint64_t size) {
  if (o->stepbytes) return size + o->stepbytes;
  return size ? size * o->factor : 1;
}

typedef struct bench {
  options o;
  kt_comm comm;
  int rank, nranks;
  size_t esize;
  unsigned char *sbuf, *rbuf; /* o.maxbytes each; freed at the end of kt_tool_bench */
  size_t cap;
  int64_t wrong_local;        /* wrong elements seen on this rank, all rows */
  int64_t wrong_total;        /* summed over ranks, all rows */
  int nrecords;
  char records[MAX_RECORDS][320];
  double busbw_sum;
  int busbw_rows;
} bench;

static void print_help(FILE *f) {
  fprintf(f,
      "usage: kaitian run -n N kaitian bench [options]\n"
      "\n"
      "Times every collective over a range of sizes, like nccl-tests. Each rank\n"
      "runs it; rank 0 prints one table per collective with the columns\n"
      "  size count type redop root time algbw busbw #wrong\n"
      "(size in bytes, time in microseconds: the average of the -n iterations on\n"
      "the slowest rank; algbw = size / time and busbw = algbw x the collective's\n"
      "bus factor, in GB/s). Comment lines start with '#'. See docs/bench.md.\n"
      "\n"
      "options:\n"
      "  -b, --minbytes SIZE     smallest size in bytes (default 8)\n"
      "  -e, --maxbytes SIZE     largest size in bytes (default 32M)\n"
      "  -f, --stepfactor N      multiply the size by N each step (default 2, >= 2)\n"
      "  -s, --stepbytes SIZE    add SIZE each step instead (every size in a range: -b 8 -e 4K -s 8)\n"
      "  --thresholds            print where the tuner's algorithm changes between -b and -e for each\n"
      "                          collective of -C on these ranks (one '# threshold' line each), run nothing\n"
      "  -n, --iters N           timed iterations per size (default 20)\n"
      "  -w, --warmup_iters N    untimed warm-up iterations per size (default 5)\n"
      "      --iters-bytes SIZE  at least SIZE bytes' worth of timed iterations per\n"
      "                          size (more than -n where SIZE / size is more): on a\n"
      "                          link shaped by a token bucket, timed traffic well\n"
      "                          beyond its burst measures the rate, not the bucket\n"
      "      --warmup-bytes SIZE the same for the warm-up (which then drains the bucket)\n"
      "  -d, --datatype TYPE     int8 uint8 int32 int64 half|float16 bfloat16\n"
      "                          float|float32 double|float64 bool (default float)\n"
      "  -o, --op OP             sum prod min max avg band bor bxor (default sum);\n"
      "                          band/bor/bxor need an integer or bool type\n"
      "  -r, --root R            root of broadcast, reduce, gather, scatter (default 0)\n"
      "  -c, --check N           after timing, run N more iterations per size with\n"
      "                          inputs whose result is known exactly and count the\n"
      "                          wrong output elements on every rank (column #wrong;\n"
      "                          default 0: not checked, #wrong shows N/A). Any wrong\n"
      "                          value prints the first ones and exits non-zero.\n"
      "  -C, --coll LIST         comma-separated collectives (default all): allreduce\n"
      "                          broadcast reduce allgather reduce_scatter alltoall\n"
      "                          gather scatter sendrecv barrier; also memcpy (not\n"
      "                          in all): every rank copies size bytes between its\n"
      "                          own buffers at once, the memory bound to compare with\n"
      "  -I, --inplace           in-place operation (send buffer inside the receive\n"
      "                          buffer, as NCCL defines it; sendrecv stays out of place)\n"
      "  -M, --registered        buffers from kt_mem_alloc (registered: an allreduce on\n"
      "                          one host runs single-copy in the peers' buffers)\n"
      "      --csv               data lines as CSV:\n"
      "                          collective,size,count,type,redop,root,time,algbw,busbw,#wrong\n"
      "      --inject-error      self-test of the checker (needs -c): corrupt one\n"
      "                          output element on one rank per size after the first\n"
      "                          checked iteration; the run must then report it and\n"
      "                          exit non-zero\n"
      "  -h, --help              this text\n"
      "\n"
      "SIZE takes a K, M or G suffix (powers of 1024). A size that is not a multiple\n"
      "of the element size (times the number of ranks, for the collectives whose\n"
      "size counts every rank's block) is rounded down; sizes that round to zero\n"
      "elements are skipped. sendrecv sends to rank+1 and receives from rank-1.\n"
      "Exit status: 0 success, 1 a library error or a wrong value, 2 bad usage.\n");
}

/* Parse an unsigned number with an optional K/M/G suffix (powers of 1024)
 * when suffix is set. Returns false (and prints why) on anything else. */
static bool parse_num(const char *opt, const char *s, bool suffix, uint64_t max, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  if (!s || !*s || *s == '-' || *s == '+') goto bad;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) goto bad;
  uint64_t mult = 1;
  if (suffix && *end) {
    switch (*end) {
      case 'k': case 'K': mult = 1ull << 10; break;
      case 'm': case 'M': mult = 1ull << 20; break;
      case 'g': case 'G': mult = 1ull << 30; break;
      default: goto bad;
    }
    end++;
  }
  if (*end) goto bad;
  if (v > max / mult) {
    fprintf(stderr, "kaitian bench: %s %s is too large (at most %llu)\n", opt, s,
            (unsigned long long)max);
    return false;
  }
  *out = v * mult;
  return true;
bad:
  fprintf(stderr, "kaitian bench: %s expects %s, got '%s'\n", opt,
          suffix ? "a size in bytes (optionally with K, M or G)" : "a non-negative integer",
          s ? s : "");
  return false;
}

static bool parse_dtype(const char *s, kt_dtype *out) {
  static const struct { const char *name; kt_dtype t; } names[] = {
      {"int8", KT_INT8}, {"uint8", KT_UINT8}, {"int32", KT_INT32}, {"int64", KT_INT64},
      {"half", KT_FLOAT16}, {"float16", KT_FLOAT16}, {"bfloat16", KT_BFLOAT16},
      {"float", KT_FLOAT32}, {"float32", KT_FLOAT32}, {"double", KT_FLOAT64},
      {"float64", KT_FLOAT64}, {"bool", KT_BOOL}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) { *out = names[i].t; return true; }
  fprintf(stderr, "kaitian bench: unknown datatype '%s' (int8 uint8 int32 int64 half float16 "
          "bfloat16 float float32 double float64 bool)\n", s);
  return false;
}

static bool parse_op(const char *s, kt_op *out) {
  for (int op = 0; op < KT_NUM_OPS; op++)
    if (strcmp(s, kt__bench_op_name(op)) == 0) { *out = (kt_op)op; return true; }
  fprintf(stderr, "kaitian bench: unknown op '%s' (sum prod min max avg band bor bxor)\n", s);
  return false;
}

static bool parse_colls(const char *s, unsigned *out) {
  unsigned mask = 0;
  char buf[256];
  if (strlen(s) >= sizeof buf) {
    fprintf(stderr, "kaitian bench: -C list too long\n");
    return false;
  }
  strcpy(buf, s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int c;
    if (strcmp(tok, "all") == 0) { mask |= C_ALL_MASK; continue; }
    for (c = 0; c < C_NUM && strcmp(tok, colls[c].name) != 0; c++) {}
    if (c == C_NUM) {
      fprintf(stderr, "kaitian bench: unknown collective '%s' in -C (allreduce broadcast reduce "
              "allgather reduce_scatter alltoall gather scatter sendrecv barrier memcpy all)\n", tok);
      return false;
    }
    mask |= 1u << c;
  }
  if (!mask) { fprintf(stderr, "kaitian bench: -C names no collective\n"); return false; }
  *out = mask;
  return true;
}

enum { OPT_B, OPT_E, OPT_F, OPT_S, OPT_N, OPT_W, OPT_NB, OPT_WB, OPT_D, OPT_O, OPT_R, OPT_C, OPT_COLL, OPT_I, OPT_M, OPT_CSV,
       OPT_INJECT, OPT_THRESH, OPT_HELP };
static const struct { char shortname; const char *longname; bool arg; } optdefs[] = {
    [OPT_B] = {'b', "minbytes", true},   [OPT_E] = {'e', "maxbytes", true},
    [OPT_F] = {'f', "stepfactor", true}, [OPT_S] = {'s', "stepbytes", true},
    [OPT_N] = {'n', "iters", true},
    [OPT_W] = {'w', "warmup_iters", true}, [OPT_NB] = {0, "iters-bytes", true},
    [OPT_WB] = {0, "warmup-bytes", true}, [OPT_D] = {'d', "datatype", true},
    [OPT_O] = {'o', "op", true},         [OPT_R] = {'r', "root", true},
    [OPT_C] = {'c', "check", true},      [OPT_COLL] = {'C', "coll", true},
    [OPT_I] = {'I', "inplace", false},   [OPT_M] = {'M', "registered", false},
    [OPT_CSV] = {0, "csv", false},
    [OPT_INJECT] = {0, "inject-error", false}, [OPT_THRESH] = {0, "thresholds", false},
    [OPT_HELP] = {'h', "help", false}};
#define NUM_OPTS ((int)(sizeof optdefs / sizeof optdefs[0]))

/* Find the option an argument names; *val gets its inline value (or NULL). */
static int find_opt(const char *arg, const char **val) {
  *val = NULL;
  if (arg[0] != '-' || arg[1] == '\0') return -1;
  if (arg[1] == '-') {
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    for (int i = 0; i < NUM_OPTS; i++)
      if (strlen(optdefs[i].longname) == len && strncmp(optdefs[i].longname, name, len) == 0) {
        *val = eq ? eq + 1 : NULL;
        return i;
      }
    return -1;
  }
  for (int i = 0; i < NUM_OPTS; i++)
    if (optdefs[i].shortname == arg[1]) {
      *val = arg[2] ? arg + 2 : NULL;
      return i;
    }
  return -1;
}

static bool set_opt(options *o, int id, const char *name, const char *v) {
  uint64_t x = 0;
  switch (id) {
    case OPT_B: return parse_num(name, v, true, UINT64_MAX / 2, &o->minbytes);
    case OPT_E: return parse_num(name, v, true, UINT64_MAX / 2, &o->maxbytes);
    case OPT_F: return parse_num(name, v, false, 1u << 20, &o->factor);
    case OPT_S: return parse_num(name, v, true, UINT64_MAX / 4, &o->stepbytes);
    case OPT_NB: return parse_num(name, v, true, UINT64_MAX / 2, &o->iters_bytes);
    case OPT_WB: return parse_num(name, v, true, UINT64_MAX / 2, &o->warmup_bytes);
    case OPT_D: return parse_dtype(v, &o->dtype);
    case OPT_O: return parse_op(v, &o->op);
    case OPT_COLL: return parse_colls(v, &o->colls);
    default: break;
  }
  if (!parse_num(name, v, false, INT32_MAX, &x)) return false;
  if (id == OPT_N) o->iters = (int)x;
  else if (id == OPT_W) o->warmup = (int)x;
  else if (id == OPT_R) o->root = (int)x;
  else o->check = (int)x;
  return true;
}

static bool check_options(const options *o) {
  if (o->iters < 1) { fprintf(stderr, "kaitian bench: -n must be at least 1\n"); return false; }
  if (o->factor < 2) { fprintf(stderr, "kaitian bench: -f must be at least 2\n"); return false; }
  if (o->minbytes > o->maxbytes) {
    fprintf(stderr, "kaitian bench: -b %llu is larger than -e %llu\n",
            (unsigned long long)o->minbytes, (unsigned long long)o->maxbytes);
    return false;
  }
  if (o->op >= KT_BAND && (kt__bench_is_float(o->dtype))) {
    fprintf(stderr, "kaitian bench: op %s needs an integer or bool datatype, not %s\n",
            kt__bench_op_name(o->op), kt__bench_dtype_name(o->dtype));
    return false;
  }
  if (o->inject && o->check < 1) {
    fprintf(stderr, "kaitian bench: --inject-error tests the checker: it needs -c 1 or more\n");
    return false;
  }
  return true;
}

/* Returns 0 to run, 1 for -h, 2 on a usage error (already printed). */
static int parse_args(options *o, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *val;
    int id = find_opt(argv[i], &val);
    if (id < 0) {
      fprintf(stderr, "kaitian bench: unknown argument '%s' (see kaitian bench -h)\n", argv[i]);
      return 2;
    }
    if (id == OPT_HELP) return 1;
    if (!optdefs[id].arg) {
      if (val) {
        fprintf(stderr, "kaitian bench: %s takes no value\n", argv[i]);
        return 2;
      }
      if (id == OPT_I) o->inplace = true;
      else if (id == OPT_M) o->registered = true;
      else if (id == OPT_CSV) o->csv = true;
      else if (id == OPT_THRESH) o->thresholds = true;
      else o->inject = true;
      continue;
    }
    const char *name = argv[i];
    if (!val) {
      if (i + 1 >= argc) {
        fprintf(stderr, "kaitian bench: %s needs a value\n", name);
        return 2;
      }
      val = argv[++i];
    }
    if (!set_opt(o, id, name, val)) return 2;
  }
  return check_options(o) ? 0 : 2;
}

/* ---- buffers for one (collective, count) ---------------------------------- */

typedef struct layout {
  void *send, *recv;
  size_t in_count;  /* input elements at send */
  size_t out_count; /* output elements at recv this rank checks (0: none) */
} layout;

static layout make_layout(const bench *b, int c, size_t count) {
  size_t n = (size_t)b->nranks, block = count * b->esize, off = (size_t)b->rank * block;
  unsigned char *s = b->sbuf, *d = b->rbuf;
  bool ip = b->o.inplace, is_root = b->rank == b->o.root;
  layout L = {s, d, count, count};
  switch (c) {
    case C_ALLREDUCE: case C_BROADCAST: if (ip) L.send = d; break;
    case C_REDUCE: if (ip) L.send = d; L.out_count = is_root ? count : 0; break;
    case C_ALLGATHER: L.out_count = n * count; if (ip) L.send = d + off; break;
    case C_REDUCE_SCATTER: L.in_count = n * count; if (ip) L.recv = s + off; break;
    case C_ALLTOALL: L.in_count = L.out_count = n * count; if (ip) L.send = d; break;
    case C_GATHER: L.out_count = is_root ? n * count : 0; if (ip) L.send = d + off; break;
    case C_SCATTER: L.in_count = n * count; if (ip) L.recv = s + off; break;
    default: break; /* sendrecv, memcpy: out of place always; barrier: no data */
  }
  return L;
}

static kt_result run_once(const bench *b, int c, const layout *L, size_t count) {
  kt_dtype t = b->o.dtype;
  kt_op op = b->o.op;
  int root = b->o.root, n = b->nranks;
  switch (c) {
    case C_ALLREDUCE: return kt_allreduce(L->send, L->recv, count, t, op, b->comm);
    case C_BROADCAST: return kt_broadcast(L->send, L->recv, count, t, root, b->comm);
    case C_REDUCE: return kt_reduce(L->send, L->recv, count, t, op, root, b->comm);
    case C_ALLGATHER: return kt_allgather(L->send, L->recv, count, t, b->comm);
    case C_REDUCE_SCATTER: return kt_reduce_scatter(L->send, L->recv, count, t, op, b->comm);
    case C_ALLTOALL: return kt_alltoall(L->send, L->recv, count, t, b->comm);
    case C_GATHER: return kt_gather(L->send, L->recv, count, t, root, b->comm);
    case C_SCATTER: return kt_scatter(L->send, L->recv, count, t, root, b->comm);
    case C_SENDRECV:
      return kt_sendrecv(L->send, count, (b->rank + 1) % n, L->recv, count,
                         (b->rank + n - 1) % n, t, 0, b->comm);
    case C_MEMCPY: /* every rank at once, no communication: the memory's own speed */
      memcpy(L->recv, L->send, count * b->esize);
      return KT_SUCCESS;
    default: return kt_barrier(b->comm);
  }
}

/* Print a library failure with the rank and what was being done; returns -1. */
static int lib_fail(const bench *b, int c, size_t count, const char *what, kt_result r) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", kt_last_error()); /* before any other library call */
  fprintf(stderr, "kaitian bench: rank %d: %s failed in %s (count %zu, %s, op %s, root %d%s): "
          "%s: %s\n", b->rank, what, colls[c].name, count, kt__bench_dtype_name(b->o.dtype),
          colls[c].reduces ? kt__bench_op_name(b->o.op) : "none", colls[c].rooted ? b->o.root : -1,
          b->o.inplace ? ", in place" : "", kt_strerror(r), msg[0] ? msg : "(no details)");
  return -1;
}

/* ---- checking ------------------------------------------------------------ */

static kt_bench_value expected_at(const bench *b, int c, const kt_bench_gen *g, size_t count,
                                  size_t k) {
  size_t r = (size_t)b->rank;
  switch (c) {
    case C_ALLREDUCE: case C_REDUCE: return kt__bench_reduced(g, k);
    case C_REDUCE_SCATTER: return kt__bench_reduced(g, r * count + k);
    case C_BROADCAST: return kt__bench_input(g, b->o.root, k);
    case C_ALLGATHER: case C_GATHER: return kt__bench_input(g, (int)(k / count), k % count);
    case C_ALLTOALL: return kt__bench_input(g, (int)(k / count), r * count + k % count);
    case C_SCATTER: return kt__bench_input(g, b->o.root, r * count + k);
    case C_MEMCPY: return kt__bench_input(g, b->rank, k);
    default: return kt__bench_input(g, (b->rank + b->nranks - 1) % b->nranks, k); /* sendrecv */
  }
}

static void record_wrong(bench *b, int c, const kt_bench_gen *g, size_t count, int iter, size_t k,
                         kt_bench_value exp, kt_bench_value got) {
  char es[64], gs[64], where[96] = "";
  if (b->nrecords >= MAX_RECORDS) return;
  kt__bench_format(g->dtype, exp, es, sizeof es);
  kt__bench_format(g->dtype, got, gs, sizeof gs);
  if (c == C_ALLGATHER || c == C_GATHER || c == C_ALLTOALL)
    snprintf(where, sizeof where, " (block of rank %zu, element %zu)", k / count, k % count);
  snprintf(b->records[b->nrecords++], sizeof b->records[0],
           "rank %d: %s count %zu %s op %s root %d%s, checked iteration %d: index %zu%s: "
           "expected %s, got %s", b->rank, colls[c].name, count, kt__bench_dtype_name(g->dtype),
           kt__bench_op_name(g->op), colls[c].rooted ? b->o.root : -1,
           b->o.inplace ? " in place" : "",
           iter, k, where, es, gs);
}

/* The rank whose output --inject-error corrupts: one that has an output. */
static int inject_rank(const bench *b, int c) {
  return colls[c].rooted && (c == C_REDUCE || c == C_GATHER) ? b->o.root : b->nranks - 1;
}

/* Run -c checked iterations; adds the wrong elements of this rank to *wrong.
 * Returns 0, or -1 after printing a library failure. */
static int check_size(bench *b, int c, size_t count, int64_t *wrong) {
  layout L = make_layout(b, c, count);
  for (int it = 0; it < b->o.check; it++) {
    kt_bench_gen g = {b->o.dtype, colls[c].reduces ? (int)b->o.op : KT_BENCH_MOVE, b->nranks,
                (uint64_t)c * 1000003u + (uint64_t)it * 7919u + count};
    kt__bench_poison(L.recv, L.out_count * b->esize);
    /* Broadcast and scatter read the root's input only; elsewhere an in-place
     * input would overwrite the poison in the output. */
    if (!(c == C_BROADCAST || c == C_SCATTER) || b->rank == b->o.root)
      kt__bench_fill(&g, b->rank, L.send, 0, L.in_count);
    kt_result r = run_once(b, c, &L, count);
    if (r != KT_SUCCESS) return lib_fail(b, c, count, "checked iteration", r);
    if (b->o.inject && it == 0 && b->rank == inject_rank(b, c) && L.out_count)
      kt__bench_corrupt(g.dtype, L.recv, L.out_count / 2);
    for (size_t k = 0; k < L.out_count; k++) {
      kt_bench_value exp = expected_at(b, c, &g, count, k);
      kt_bench_value got = kt__bench_read(g.dtype, L.recv, k);
      if (kt__bench_equal(&g, exp, got)) continue;
      (*wrong)++;
      record_wrong(b, c, &g, count, it, k, exp, got);
    }
  }
  return 0;
}

/* ---- timing and tables ------------------------------------------------------ */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* n, or more iterations where that many of size bytes fall short of want
 * bytes (--iters-bytes, --warmup-bytes; every rank computes the same). */
static int at_least(int n, uint64_t want, uint64_t size) {
  if (!want || !size) return n;
  uint64_t k = (want + size - 1) / size;
  return k > (uint64_t)n ? (int)(k < INT32_MAX ? k : INT32_MAX) : n;
}

/* *us = average time of one iteration on the slowest rank, in microseconds.
 * Returns 0, or -1 after printing a library failure. */
static int time_size(const bench *b, int c, size_t count, uint64_t bytes, double *us) {
  layout L = make_layout(b, c, count);
  kt_result r;
  int warmup = at_least(b->o.warmup, b->o.warmup_bytes, bytes), iters = at_least(b->o.iters, b->o.iters_bytes, bytes);
  if (b->rank == 0 && (iters != b->o.iters || warmup != b->o.warmup))
    printf("# %s %llu: %d timed iterations after %d warm-up (--iters-bytes, --warmup-bytes)\n", colls[c].name,
           (unsigned long long)bytes, iters, warmup);
  for (int i = 0; i < warmup; i++)
    if ((r = run_once(b, c, &L, count)) != KT_SUCCESS) return lib_fail(b, c, count, "warm-up", r);
  if ((r = kt_barrier(b->comm)) != KT_SUCCESS)
    return lib_fail(b, c, count, "barrier before timing", r);
  double t0 = now_us();
  for (int i = 0; i < iters; i++)
    if ((r = run_once(b, c, &L, count)) != KT_SUCCESS)
      return lib_fail(b, c, count, "timed iteration", r);
  double local = (now_us() - t0) / iters;
  r = kt_allreduce(&local, us, 1, KT_FLOAT64, KT_MAX, b->comm);
  if (r != KT_SUCCESS) return lib_fail(b, c, count, "allreduce (max) of the times", r);
  return 0;
}

static void print_row(const bench *b, int c, size_t bytes, size_t count, double us,
                      double algbw, double busbw, bool checked, long long wrong) {
  char wrongs[32];
  const coll_info *ci = &colls[c];
  const char *type = c == C_BARRIER ? "none" : kt__bench_dtype_name(b->o.dtype);
  const char *redop = ci->reduces ? kt__bench_op_name(b->o.op) : "none";
  int root = ci->rooted ? b->o.root : -1;
  if (checked) snprintf(wrongs, sizeof wrongs, "%lld", wrong);
  else snprintf(wrongs, sizeof wrongs, "N/A");
  if (b->o.csv)
    printf("%s,%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%s\n", ci->name, bytes, count, type, redop, root,
           us, algbw, busbw, wrongs);
  else
    printf("%12zu %12zu %9s %6s %5d %11.2f %7.2f %7.2f %7s\n", bytes, count, type, redop, root,
           us, algbw, busbw, wrongs);
  fflush(stdout);
}

static void print_table_head(const bench *b, int c) {
  if (b->rank != 0 || b->o.csv) return;
  if (c == C_BARRIER)
    printf("#\n# barrier (no data: only the time means something)\n");
  else
    printf("#\n# %s%s, busbw = algbw x %s = %.3f\n", colls[c].name,
           c == C_SENDRECV ? " (send to rank+1, receive from rank-1)" : "", colls[c].bus_text,
           bus_factor(colls[c].bus, b->nranks));
  if (c == C_SENDRECV && b->o.inplace) printf("# sendrecv runs out of place (-I ignored)\n");
  if (c == C_MEMCPY)
    printf("# memcpy: every rank copies size bytes between its own two buffers at the same time, "
           "no communication (the memory reference)%s\n", b->o.inplace ? "; out of place (-I ignored)" : "");
  printf("#%11s %12s %9s %6s %5s %11s %7s %7s %7s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong");
  printf("#%11s %12s %9s %6s %5s %11s %7s %7s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

/* Time the barrier; one row. Returns 0, or -1 after printing a library failure. */
static int bench_barrier(bench *b) {
  double us;
  print_table_head(b, C_BARRIER);
  if (time_size(b, C_BARRIER, 0, 0, &us)) return -1;
  if (b->rank == 0) print_row(b, C_BARRIER, 0, 0, us, 0.0, 0.0, false, 0);
  return 0;
}

/* Time (and with -c check) collective c at every size; one row per size.
 * Returns 0, or -1 after printing a library failure. */
static int bench_coll(bench *b, int c) {
  size_t n = (size_t)b->nranks, unit = b->esize * (colls[c].total ? n : 1);
  print_table_head(b, c);
  for (uint64_t size = b->o.minbytes; size <= b->o.maxbytes; size = next_size(&b->o, size)) {
    size_t count = (size_t)(size / unit), bytes = count * unit;
    double us = 0;
    int64_t wrong = 0, wrong_all = 0;
    if (count > 0) {
      if (time_size(b, c, count, bytes, &us)) return -1;
      if (b->o.check) {
        if (check_size(b, c, count, &wrong)) return -1;
        kt_result r = kt_allreduce(&wrong, &wrong_all, 1, KT_INT64, KT_SUM, b->comm);
        if (r != KT_SUCCESS) return lib_fail(b, c, count, "allreduce (sum) of #wrong", r);
        b->wrong_local += wrong;
        b->wrong_total += wrong_all;
      }
      double algbw = (double)bytes / us / 1e3, busbw = algbw * bus_factor(colls[c].bus, b->nranks);
      if (c != C_MEMCPY) { /* the reference is not one of the collectives */
        b->busbw_sum += busbw;
        b->busbw_rows++;
      }
      if (b->rank == 0) print_row(b, c, bytes, count, us, algbw, busbw, b->o.check > 0, wrong_all);
    }
    if (size > UINT64_MAX / b->o.factor || size > UINT64_MAX - b->o.stepbytes) break;
  }
  return 0;
}

/* ---- --thresholds ------------------------------------------------------------ */

static const kt__coll kcoll[C_NUM] = {
    [C_ALLREDUCE] = KT_COLL_ALLREDUCE, [C_BROADCAST] = KT_COLL_BROADCAST, [C_REDUCE] = KT_COLL_REDUCE,
    [C_ALLGATHER] = KT_COLL_ALLGATHER, [C_REDUCE_SCATTER] = KT_COLL_REDUCE_SCATTER,
    [C_ALLTOALL] = KT_COLL_ALLTOALL,   [C_GATHER] = KT_COLL_GATHER,     [C_SCATTER] = KT_COLL_SCATTER,
    [C_SENDRECV] = KT_COLL_SENDRECV,   [C_BARRIER] = KT_COLL_BARRIER,   [C_MEMCPY] = KT_COLL_BARRIER};

static const char *algo_at(const bench *b, int c, size_t count) {
  layout L = make_layout(b, c, count);
  return kt__algo_for(&b->comm->g, kcoll[c], L.send, L.recv, count, b->o.dtype, b->o.op, b->o.root);
}

/* Each size in [-b, -e] where the algorithm the tuner picks for collective
 * c changes, on rank 0: the largest size of the old one and the first of
 * the new, to the element (bisected between steps of 2x, each of which
 * holds at most one change as the tuner's thresholds are spaced). */
static void print_thresholds(const bench *b, int c) {
  size_t unit = b->esize * (colls[c].total ? (size_t)b->nranks : 1);
  size_t lo = KT_MAX((size_t)(b->o.minbytes / unit), (size_t)1), top = (size_t)(b->o.maxbytes / unit);
  if (b->rank != 0 || c == C_BARRIER || c == C_MEMCPY || c == C_SENDRECV || top < lo) return;
  const char *cur = algo_at(b, c, lo);
  printf("# algorithm %s from %zu bytes: %s\n", colls[c].name, lo * unit, cur);
  for (size_t a = lo; a < top;) {
    size_t z = a * 2 > top ? top : a * 2;
    const char *at_z = algo_at(b, c, z);
    if (strcmp(at_z, cur) != 0) {
      size_t l = a, h = z; /* algo(l) == cur, algo(h) != cur */
      while (h - l > 1) {
        size_t m = l + (h - l) / 2;
        if (strcmp(algo_at(b, c, m), cur) == 0) l = m;
        else h = m;
      }
      const char *next = algo_at(b, c, h);
      printf("# threshold %s %zu %s %zu %s\n", colls[c].name, l * unit, cur, h * unit, next);
      cur = next;
      a = h;
      continue;
    }
    a = z;
  }
  fflush(stdout);
}

/* ---- driver ---------------------------------------------------------------- */

/* The largest size the steps from -b by -f reach without passing -e (what
 * the last row of a table is, when that size does not round to zero). */
static uint64_t largest_size(const options *o) {
  uint64_t size = o->minbytes, last = size;
  while (size <= o->maxbytes) {
    last = size;
    if (size > UINT64_MAX / o->factor || size > UINT64_MAX - o->stepbytes) break;
    size = next_size(o, size);
  }
  return last;
}

static void print_preamble(const bench *b) {
  if (b->rank != 0) return;
  const options *o = &b->o;
  printf("# kaitian bench, kaitian %s (%s)\n", kt_version_string(), kt_build_info());
  printf("# ranks %d  datatype %s  op %s  root %d  in-place %s  registered %s  check %d  warm-up %d  "
         "iters %d\n", b->nranks, kt__bench_dtype_name(o->dtype), kt__bench_op_name(o->op), o->root,
         o->inplace ? "yes" : "no", o->registered ? "yes" : "no", o->check, o->warmup, o->iters);
  uint64_t last = largest_size(o);
  if (o->stepbytes)
    printf("# sizes %llu .. %llu bytes, step %llu", (unsigned long long)o->minbytes, (unsigned long long)last,
           (unsigned long long)o->stepbytes);
  else
    printf("# sizes %llu .. %llu bytes, factor %llu", (unsigned long long)o->minbytes,
           (unsigned long long)last, (unsigned long long)o->factor);
  if (last != o->maxbytes) printf(" (the next step would pass -e %llu)", (unsigned long long)o->maxbytes);
  printf("; time = average over the iterations of the slowest rank\n");
  if (o->iters_bytes || o->warmup_bytes)
    printf("# more iterations at small sizes: at least %llu bytes timed and %llu warmed up per size\n",
           (unsigned long long)o->iters_bytes, (unsigned long long)o->warmup_bytes);
  if (o->inject)
    printf("# --inject-error: one output element per checked size is corrupted on purpose "
           "(self-test of the checker); this run must fail\n");
  if (o->csv) printf("# collective,size,count,type,redop,root,time,algbw,busbw,#wrong\n");
  fflush(stdout);
}

/* Prints the wrong values this rank saw, and rank 0's summary. */
static void print_summary(const bench *b) {
  for (int i = 0; i < b->nrecords; i++)
    fprintf(stderr, "kaitian bench: wrong value: %s\n", b->records[i]);
  if (b->wrong_local > b->nrecords)
    fprintf(stderr, "kaitian bench: rank %d: %lld wrong values in all (first %d shown)\n",
            b->rank, (long long)b->wrong_local, b->nrecords);
  if (b->rank != 0) return;
  printf("#\n");
  if (b->o.check)
    printf("# wrong values: %lld %s\n", (long long)b->wrong_total,
           b->wrong_total || b->wrong_local ? "FAILED" : "OK");
  else
    printf("# wrong values: not checked (use -c N)\n");
  if (b->busbw_rows)
    printf("# average bus bandwidth: %.3f GB/s\n", b->busbw_sum / b->busbw_rows);
  fflush(stdout);
}

/* A buffer of b->cap bytes (at least 1), page-aligned: kt_mem_alloc with -M. */
static bool alloc_buf(const bench *b, void **p) {
  if (b->o.registered) return kt_mem_alloc(b->cap ? b->cap : 1, p) == KT_SUCCESS;
  return posix_memalign(p, 4096, b->cap ? b->cap : 1) == 0;
}

static void free_buf(const bench *b, void *p) {
  if (b->o.registered && p) kt_mem_free(p);
  else free(p);
}

/* Communicator, buffers, initial data. Returns 0; 1 after printing a library
 * or allocation failure; 2 for a root out of range. What it made is freed by
 * kt_tool_bench's exit path. */
static int setup(bench *b) {
  kt_result r = kt_comm_init_env(&b->comm);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "kaitian bench: creating the communicator from the environment failed: "
            "%s: %s\n",
            kt_strerror(r), kt_last_error());
    b->comm = NULL;
    return 1;
  }
  if ((r = kt_comm_rank(b->comm, &b->rank)) != KT_SUCCESS ||
      (r = kt_comm_size(b->comm, &b->nranks)) != KT_SUCCESS) {
    fprintf(stderr, "kaitian bench: rank/size query failed: %s: %s\n", kt_strerror(r),
            kt_last_error());
    return 1;
  }
  if (b->o.root >= b->nranks) {
    if (b->rank == 0)
      fprintf(stderr, "kaitian bench: root %d out of range: there are %d ranks\n", b->o.root,
              b->nranks);
    return 2;
  }
  b->esize = kt__bench_size(b->o.dtype);
  b->cap = (size_t)b->o.maxbytes;
  if ((uint64_t)b->cap != b->o.maxbytes || !alloc_buf(b, (void **)&b->sbuf) || !alloc_buf(b, (void **)&b->rbuf)) {
    fprintf(stderr, "kaitian bench: rank %d: cannot allocate 2 buffers of %llu bytes (-e)%s%s\n",
            b->rank, (unsigned long long)b->o.maxbytes, b->o.registered ? ": " : "",
            b->o.registered ? kt_last_error() : "");
    return 1;
  }
  /* Realistic data for the timed iterations (checked ones refill). */
  kt_bench_gen g = {b->o.dtype, KT_BENCH_MOVE, b->nranks, 0};
  kt__bench_fill(&g, b->rank, b->sbuf, 0, b->cap / b->esize);
  kt__bench_fill(&g, b->rank, b->rbuf, 0, b->cap / b->esize);
  return 0;
}

/* Also what each rank's process returns: 0 success, 1 library error or wrong
 * value, 2 usage error. */
int kt_tool_bench(int argc, char **argv) {
  bench *b = calloc(1, sizeof *b); /* freed below */
  if (!b) {
    fprintf(stderr, "kaitian bench: out of memory\n");
    return 1;
  }
  b->o = (options){.minbytes = 8, .maxbytes = 32u << 20, .factor = 2, .iters = 20, .warmup = 5,
                   .dtype = KT_FLOAT32, .op = KT_SUM, .colls = C_ALL_MASK};
  int rc = parse_args(&b->o, argc, argv);
  if (rc == 1) {
    print_help(stdout);
    rc = 0;
    goto exit;
  }
  if (rc) goto exit;
  rc = setup(b);
  if (rc) goto exit;
  if (b->o.thresholds) { /* what the tuner would pick; nothing runs */
    if (b->rank == 0)
      printf("# kaitian bench --thresholds, %d ranks, %s: '# threshold COLL LAST_BYTES OLD FIRST_BYTES NEW'\n",
             b->nranks, kt__bench_dtype_name(b->o.dtype));
    for (int c = 0; c < C_NUM; c++)
      if (b->o.colls & (1u << c)) print_thresholds(b, c);
    goto exit;
  }
  print_preamble(b);
  for (int c = 0; c < C_NUM && rc == 0; c++)
    if (b->o.colls & (1u << c)) rc = (c == C_BARRIER ? bench_barrier(b) : bench_coll(b, c)) ? 1 : 0;
  if (rc) {
    kt_comm_abort(b->comm); /* peers stop waiting for us */
    goto exit;
  }
  print_summary(b);
  if (b->wrong_total || b->wrong_local) rc = 1;
exit:
  free_buf(b, b->sbuf);
  free_buf(b, b->rbuf);
  if (b->comm) {
    kt_result r = kt_comm_destroy(b->comm);
    if (r != KT_SUCCESS && rc == 0) {
      fprintf(stderr, "kaitian bench: rank %d: kt_comm_destroy failed: %s: %s\n", b->rank,
              kt_strerror(r), kt_last_error());
      rc = 1;
    }
  }
  free(b);
  return rc;
}
