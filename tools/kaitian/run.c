/* run.c - `kaitian run`, the launcher: options, the job's identity and store,
 * the ranks' environment, and the event loop that forwards output and
 * signals and stops the job on the first failure. */
#include "tool.h"
#include "store/store.h"
#include "jobenv.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* After SIGTERM, ranks get this long before SIGKILL (on a failure stop). */
#define TERM_TO_KILL_MS 3000
/* Multi-node: how often the store is asked whether another node failed. */
#define NODE_POLL_MS 200
#define MAX_NPROC KT_RUN_MAX_NPROC

typedef struct run_opts {
  int nproc, nnodes, node_rank;
  bool nproc_given;     /* -n was given (else 1, or the device plan's sum) */
  const char *devices;  /* --devices as given, or NULL */
  kt_run_devspec devspec; /* --devices, else KAITIAN_DEVICES, else auto */
  int cpus_per_accel;   /* --cpus-per-accel: CPUs bound to each accelerator rank */
  const char *master;   /* "HOST:PORT" as given, or NULL */
  char master_host[256];
  int master_port;
  int64_t grace_ms;
  int64_t lost_ms;      /* KAITIAN_RUN_LOST_MS */
  bool prefix;
  bool bind;            /* --bind auto (default): one block of CPUs per local rank */
  char **prog;          /* program and its arguments, NULL-terminated */
  bool local_rank_arg;  /* --local-rank-arg: pass --local_rank=N to each rank */
  bool shape_given;     /* --nnodes, --node-rank or --master was given */
  const char *shape_from; /* "slurm", "openmpi", "pmi": nodes from a cluster manager */
  char job_id[96];      /* that manager's job id */
  char secret[KT_STORE_MAX_SECRET + 1]; /* KAITIAN_JOB_SECRET, or derived from the job */
  char master_buf[300]; /* "HOST:PORT" from the cluster manager */
} run_opts;

enum phase {
  PHASE_RUN,    /* all well */
  PHASE_GRACE,  /* a rank failed: the others may exit by themselves */
  PHASE_TERM,   /* SIGTERM (or the forwarded signal) sent; SIGKILL at the deadline */
  PHASE_KILL    /* SIGKILL sent */
};

typedef struct run_state {
  run_opts o;
  kt_run_rank *ranks;   /* o.nproc local ranks */
  int running;          /* ranks started and not reaped */
  int sigfd;
  enum phase phase;
  int64_t deadline_ms;  /* when the current phase ends; -1: never */
  bool have_first;      /* the job failed: first_status is the exit code */
  int first_status;
  int nfailed;          /* local ranks that failed on their own */
  int *fail_order;      /* their indexes, in the order they failed */
  int got_signal;       /* first SIGINT/SIGTERM/SIGHUP received, 0 if none */
  bool multi;           /* --nnodes > 1 */
  kt_run_node node;
  bool store_lost;
  int64_t next_poll_ms;
  char store_addr[300];
} run_state;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kaitian run [options] [--] PROGRAM [ARGS...]\n"
          "\n"
          "Start N ranks of PROGRAM on this node (a .py file runs under $PYTHON, else\n"
          "/usr/bin/python3) with the torchrun environment (RANK, WORLD_SIZE, ...) and\n"
          "KaiTian's own (KAITIAN_STORE_ADDR, KAITIAN_DEVICE, ...). See docs/launcher.md.\n"
          "\n"
          "options:\n"
          "  -n, --nproc-per-node N   ranks on this node (default 1, or the --devices plan's\n"
          "                           sum, which N must equal when both are given)\n"
          "  --devices SPEC           the device of each local rank: TYPE[:COUNT],... in rank\n"
          "                           order, e.g. cuda:2,cpu:2 (ranks 0-1 on cuda:0 and cuda:1,\n"
          "                           2-3 on the CPU); or auto (default, or $KAITIAN_DEVICES):\n"
          "                           for a .py PROGRAM every accelerator torch sees, one rank\n"
          "                           each (the first N; N larger than their number is an\n"
          "                           error: no CPU rank beside accelerators), N CPU ranks\n"
          "                           where there is none or for another PROGRAM; or auto+cpu:\n"
          "                           as auto, then CPU ranks up to N.\n"
          "                           USE_<TYPE>=0 or KAITIAN_USE_<TYPE>=0 switches a type off\n"
          "  --cpus-per-accel K       CPUs bound to each accelerator rank (default 1); the CPU\n"
          "                           ranks share the rest\n"
          "  --nnodes M               number of nodes (default 1)\n"
          "  --node-rank K            this node's rank, 0..M-1 (default 0)\n"
          "  --master HOST:PORT       node 0's address; node 0 serves the rendezvous store\n"
          "                           there, torch's MASTER_PORT is PORT+1. Required when\n"
          "                           M > 1 (then export the same KAITIAN_JOB_SECRET on\n"
          "                           every node)\n"
          "                           Under srun or mpirun (one launcher per node) all three\n"
          "                           come from the cluster manager when none is given\n"
          "  --local-rank-arg         pass --local_rank=N to each rank after the program, as\n"
          "                           python -m torch.distributed.launch did\n"
          "  --grace SEC              how long ranks get to exit after a failure or a\n"
          "                           forwarded signal before they are killed (default 5)\n"
          "  --no-prefix              do not prefix output lines with \"[RANK] \"\n"
          "  --bind auto|none         auto (default): bind each local rank to its own block\n"
          "                           of the CPUs the launcher may use, when there are\n"
          "                           enough; none: leave placement to the kernel\n"
          "  -h, --help               this help\n"
          "\n"
          "exit status: 0 when every rank exits 0; else the first failing rank's exit\n"
          "code (128+N when killed by signal N); 128+N when the launcher got signal N;\n"
          "127 when PROGRAM cannot be executed; 2 on a usage error or a device plan that\n"
          "cannot be made; 1 on a setup error.\n");
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

/* --devices, else KAITIAN_DEVICES (default auto): its syntax, and -n
 * against an explicit plan. False with the message printed. */
static bool parse_devices(run_opts *o) {
  const char *text = o->devices ? o->devices : kt__param_DEVICES();
  if (!kt__run_parse_devices(text, o->devices ? "--devices" : "KAITIAN_DEVICES", &o->devspec))
    return false;
  const kt_run_devspec *d = &o->devspec;
  if (!d->is_auto && o->nproc_given && o->nproc != d->total) {
    fprintf(stderr, "kaitian run: -n %d disagrees with %s%s%s (%d rank%s)\n", o->nproc,
            d->source, o->devices ? " " : "=", d->text, d->total, d->total == 1 ? "" : "s");
    return false;
  }
  return true;
}

/* Under srun or mpirun, with no --nnodes / --node-rank / --master: each
 * launcher the cluster manager started is one node of the job (the same
 * kt_job_from_env as the library, cluster managers only: RANK and friends
 * are what the launcher sets). Node 0 serves the store on the first host at
 * the port derived from the job (torch's MASTER_PORT is the next one); the
 * secret is KAITIAN_JOB_SECRET or derived from the job. Returns -1 to go on,
 * else the exit status. */
static int shape_from_manager(run_opts *o) {
  kt_job job;
  const char *secret = kt__param_JOB_SECRET();
  if (!o->shape_given) {
    if (kt__job_from_env(&job, KT_JOB_SRC_SCHEDULERS) != KT_SUCCESS) {
      fprintf(stderr, "kaitian run: %s\n", kt_last_error());
      return 2;
    }
    if (job.size > 1) {
      if (job.local_size > 1)
        fprintf(stderr, "kaitian run: warning: %s started %d launchers on this node, each starting %d rank%s "
                        "(one launcher per node is meant, e.g. srun --ntasks-per-node=1)\n",
                job.source, job.local_size, o->nproc, o->nproc == 1 ? "" : "s");
      if (job.store_port > 65534) {
        fprintf(stderr, "kaitian run: the store port %d from %s leaves no room for torch's MASTER_PORT "
                        "(PORT+1); set MASTER_PORT lower\n", job.store_port, job.source);
        return 2;
      }
      o->nnodes = job.size;
      o->node_rank = job.rank;
      o->shape_from = job.source[0] == 's' ? "Slurm" : job.source[0] == 'o' ? "Open MPI" : "PMI";
      snprintf(o->master_host, sizeof o->master_host, "%s", job.store_host);
      o->master_port = job.store_port;
      snprintf(o->master_buf, sizeof o->master_buf, "%s:%d", job.store_host, job.store_port);
      o->master = o->master_buf;
      snprintf(o->job_id, sizeof o->job_id, "%s", job.job_id);
      if ((!secret || !*secret) && kt__job_secret(&job, o->secret, sizeof o->secret) != KT_SUCCESS) {
        fprintf(stderr, "kaitian run: %s\n", kt_last_error());
        return 2;
      }
    }
  }
  if (!o->secret[0] && secret && *secret && o->nnodes > 1) {
    if (strlen(secret) > KT_STORE_MAX_SECRET) {
      fprintf(stderr, "kaitian run: KAITIAN_JOB_SECRET is %zu bytes long; at most %d are allowed\n",
              strlen(secret), KT_STORE_MAX_SECRET);
      return 2;
    }
    snprintf(o->secret, sizeof o->secret, "%s", secret);
  }
  return -1;
}

/* Parse the options. Returns -1 to go on, else the exit status (0 for help). */
static int parse_opts(int argc, char **argv, run_opts *o) {
  o->nproc = 1;
  o->nnodes = 1;
  o->grace_ms = 5000;
  o->prefix = true;
  o->bind = true;
  o->cpus_per_accel = 1;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-' || a[1] == '\0') break; /* the program */
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--no-prefix")) {
      o->prefix = false;
      continue;
    }
    if (!strcmp(a, "--local-rank-arg")) {
      o->local_rank_arg = true;
      continue;
    }
    /* Options with a value: "-n 4", "-n4", "--nnodes 2", "--nnodes=2". */
    static const char *const names[] = {"-n", "--nproc-per-node", "--nnodes", "--node-rank",
                                        "--master", "--grace", "--bind", "--devices",
                                        "--cpus-per-accel"};
    const char *name = NULL, *val = NULL;
    for (size_t k = 0; k < sizeof names / sizeof names[0] && !name; k++) {
      size_t len = strlen(names[k]);
      if (strncmp(a, names[k], len) != 0) continue;
      if (a[len] == '\0') {
        if (i + 1 >= argc) {
          fprintf(stderr, "kaitian run: option %s needs a value\n", a);
          return 2;
        }
        name = names[k];
        val = argv[++i];
      } else if (a[len] == '=' || (k == 0 && a[len] != '-')) {
        name = names[k];
        val = a + len + (a[len] == '=');
      }
    }
    if (!name) {
      fprintf(stderr, "kaitian run: unknown option '%s' (see kaitian run --help)\n", a);
      return 2;
    }
    bool ok = true;
    const char *want = ""; /* what a good value is, for the message */
    char nwant[48];
    if (!strcmp(name, "-n") || !strcmp(name, "--nproc-per-node")) {
      snprintf(nwant, sizeof nwant, "a number of ranks, 1..%d", MAX_NPROC);
      want = nwant;
      ok = parse_int(val, 1, MAX_NPROC, &o->nproc);
      o->nproc_given = true;
    } else if (!strcmp(name, "--devices")) {
      o->devices = val;
    } else if (!strcmp(name, "--cpus-per-accel")) {
      want = "CPUs per accelerator rank, 1..65536";
      ok = parse_int(val, 1, 65536, &o->cpus_per_accel);
    } else if (!strcmp(name, "--nnodes")) {
      want = "a number of nodes, 1..65536";
      ok = parse_int(val, 1, 65536, &o->nnodes);
      o->shape_given = true;
    } else if (!strcmp(name, "--node-rank")) {
      want = "0..65535, below --nnodes";
      ok = parse_int(val, 0, 65535, &o->node_rank);
      o->shape_given = true;
    } else if (!strcmp(name, "--master")) {
      o->master = val;
      o->shape_given = true;
    } else if (!strcmp(name, "--bind")) {
      want = "auto or none";
      ok = !strcmp(val, "auto") || !strcmp(val, "none");
      o->bind = !strcmp(val, "auto");
    } else { /* --grace */
      want = "seconds, 0..86400";
      char *end;
      double sec = strtod(val, &end);
      ok = end != val && *end == '\0' && sec >= 0 && sec <= 86400;
      if (ok) o->grace_ms = (int64_t)(sec * 1000.0 + 0.5);
    }
    if (!ok) {
      fprintf(stderr, "kaitian run: bad value '%s' for %s (%s)\n", val, name, want);
      return 2;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "kaitian run: no program given\n");
    usage(stderr);
    return 2;
  }
  o->prog = argv + i;
  if (!parse_devices(o)) return 2;
  {
    const char *v = kt__param_RUN_LOST_MS();
    char *end = NULL;
    errno = 0;
    long long ms = strtoll(v, &end, 10);
    if (errno || end == v || *end || ms < KT_RUN_LOST_MS_MIN || ms > KT_RUN_LOST_MS_MAX) {
      fprintf(stderr, "kaitian run: bad value '%s' for KAITIAN_RUN_LOST_MS (milliseconds without a heartbeat "
                      "before a node whose host does not answer is lost, %d..%d)\n",
              v, KT_RUN_LOST_MS_MIN, KT_RUN_LOST_MS_MAX);
      return 2;
    }
    o->lost_ms = ms;
  }
  int rc = shape_from_manager(o);
  if (rc >= 0) return rc;
  if (o->node_rank >= o->nnodes) {
    fprintf(stderr, "kaitian run: --node-rank %d is out of range for --nnodes %d (0..%d)\n",
            o->node_rank, o->nnodes, o->nnodes - 1);
    return 2;
  }
  if (o->nnodes > 1 && !o->master) {
    fprintf(stderr, "kaitian run: --nnodes %d needs --master HOST:PORT (the address of node 0, "
                    "reachable from every node)\n", o->nnodes);
    return 2;
  }
  if ((long)o->nproc * o->nnodes > 1L << 30) {
    fprintf(stderr, "kaitian run: %d ranks per node x %d nodes is too many\n", o->nproc,
            o->nnodes);
    return 2;
  }
  if (o->master && !o->shape_from) {
    if (kt__parse_hostport(o->master, o->master_host, sizeof o->master_host,
                           &o->master_port) != KT_SUCCESS) {
      fprintf(stderr, "kaitian run: bad --master '%s': %s\n", o->master, kt_last_error());
      return 2;
    }
    if (o->master_port < 1 || o->master_port > 65534) {
      fprintf(stderr, "kaitian run: --master port %d must be in 1..65534 (PORT+1 is torch's "
                      "MASTER_PORT)\n", o->master_port);
      return 2;
    }
  }
  return -1;
}

/* ---- the job's identity ------------------------------------------------- */

static kt_result random_hex(char *out, size_t nbytes) {
  unsigned char raw[64];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || nbytes > sizeof raw || kt__read_full(fd, raw, nbytes) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return kt__err(KT_ERR_SYSTEM, "cannot read /dev/urandom for the job secret: %s", strerror(e));
  }
  close(fd);
  for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", raw[i]);
  return KT_SUCCESS;
}

/* The multi-node job id: every node derives the same one from the shared
 * secret (FNV-1a 64 of a domain tag and the secret; not reversible in
 * practice for a random secret, and never the secret itself). */
static void job_id_from_secret(const char *secret, char out[17]) {
  uint64_t h = kt__fnv1a_str(kt__fnv1a_str(KT_FNV1A_BASIS, "kaitian-job-id:"), secret);
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* Whether PORT can be bound as torch's store binds it: every address ([::]
 * dual-stack, else 0.0.0.0) with SO_REUSEADDR. A port held on any one
 * address (an outgoing connection from the host's own address, say) fails
 * here as it would fail there. */
static int port_bindable(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0, ok;
  if (fd >= 0) {
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_ANY_INIT};
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ok = bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0;
  } else {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  }
  close(fd);
  return ok;
}

/* A TCP port for torch's own store, which rank 0 binds only later: free now
 * and outside the kernel's ephemeral range (ip_local_port_range), so no
 * outgoing connection of this host can be handed it in between (one picked
 * by bind(0) came from that range, and a CI run lost it to one). Random in
 * 10000..low-1 (above high where the range starts below 10100), the first of
 * 200 tries that binds; failing that, any port the kernel hands out. */
static kt_result free_port(int *port) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768;
    fclose(f);
  }
  unsigned short rnd[200];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  int have = fd >= 0 && kt__read_full(fd, rnd, sizeof rnd) == 0;
  if (fd >= 0) close(fd);
  /* Below the ephemeral range, else above it. */
  int from = 10000, span = lo - 10000;
  if (span < 100) from = hi + 1, span = 65535 - hi;
  if (have && span >= 100) {
    for (size_t i = 0; i < sizeof rnd / sizeof *rnd; i++) {
      int p = from + rnd[i] % span;
      if (port_bindable(p)) {
        *port = p;
        return KT_SUCCESS;
      }
    }
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return kt__err(KT_ERR_SYSTEM, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    int e = errno;
    close(fd);
    return kt__err(KT_ERR_SYSTEM, "cannot find a free port for MASTER_PORT: %s", strerror(e));
  }
  *port = ntohs(a.sin_port);
  close(fd);
  return KT_SUCCESS;
}

/* ---- environment -------------------------------------------------------- */

/* Variables the launcher sets for each rank, replacing inherited values. */
static const char *const owned_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "KAITIAN_STORE_ADDR",
    "KAITIAN_JOB_SECRET", "KAITIAN_JOB_ID", "KAITIAN_DEVICE"};

static bool is_owned(const char *entry) {
  for (size_t i = 0; i < sizeof owned_vars / sizeof owned_vars[0]; i++) {
    size_t len = strlen(owned_vars[i]);
    if (!strncmp(entry, owned_vars[i], len) && entry[len] == '=') return true;
  }
  return false;
}

typedef struct job_env {
  char master_addr[256];
  int master_port;
  char secret[KT_STORE_MAX_SECRET + 1];
  char job_id[40];
  int omp_threads;      /* of an unbound rank (a bound one: its CPUs); 0: the user
                           set OMP_NUM_THREADS */
  bool set_unbuffered;  /* PYTHONUNBUFFERED is unset: set it to 1 */
} job_env;

static char *xasprintf(const char *fmt, ...) KT_PRINTF(1, 2);
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

/* The whole environment of one rank (malloc'ed array of malloc'ed strings
 * for our variables; inherited entries point into environ). NULL when out of
 * memory. Freed with free_env. */
#define N_EXTRA 20
static char **build_env(const run_state *s, const job_env *je, const kt_run_rank *r,
                        char ***extra_out) {
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + N_EXTRA + 1, sizeof *env);
  char **extra = calloc(N_EXTRA + 1, sizeof *extra);
  if (!env || !extra) goto fail;
  size_t k = 0, x = 0;
  for (size_t i = 0; i < n; i++)
    if (!is_owned(environ[i])) env[k++] = environ[i];
  int world = s->multi ? s->node.world : s->o.nproc;
#define ADD(...)                                          \
  do {                                                    \
    if (!(extra[x] = xasprintf(__VA_ARGS__))) goto fail;  \
    env[k++] = extra[x++];                                \
  } while (0)
  ADD("RANK=%d", r->rank);
  ADD("LOCAL_RANK=%d", r->local_rank);
  ADD("WORLD_SIZE=%d", world);
  ADD("LOCAL_WORLD_SIZE=%d", s->o.nproc);
  ADD("GROUP_RANK=%d", s->o.node_rank);
  ADD("GROUP_WORLD_SIZE=%d", s->o.nnodes);
  ADD("ROLE_RANK=%d", r->rank);
  ADD("ROLE_WORLD_SIZE=%d", world);
  ADD("MASTER_ADDR=%s", je->master_addr);
  ADD("MASTER_PORT=%d", je->master_port);
  ADD("KAITIAN_STORE_ADDR=%s", s->store_addr);
  ADD("KAITIAN_JOB_SECRET=%s", je->secret);
  ADD("KAITIAN_JOB_ID=%s", je->job_id);
  ADD("KAITIAN_DEVICE=%s", r->device);
  if (je->omp_threads > 0)
    ADD("OMP_NUM_THREADS=%d", r->cpus ? CPU_COUNT_S(r->cpus_bytes, r->cpus) : je->omp_threads);
  if (je->set_unbuffered) ADD("PYTHONUNBUFFERED=1");
#undef ADD
  *extra_out = extra;
  return env;
fail:
  if (extra)
    for (size_t i = 0; extra[i]; i++) free(extra[i]);
  free(extra);
  free(env);
  return NULL;
}

static void free_env(char **env, char **extra) {
  if (extra)
    for (size_t i = 0; extra[i]; i++) free(extra[i]);
  free(extra);
  free(env);
}

/* ---- the program -------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* The interpreter of .py programs and of the device discovery. */
static const char *python_interp(void) {
  const char *interp = getenv("PYTHON");
  return interp && *interp ? interp : "/usr/bin/python3";
}

/* Resolve what each rank executes. Returns false with the message printed. */
static bool resolve_program(char **prog, kt_run_exec *ex, char **path_out, char ***argv_out) {
  size_t argc = 0;
  while (prog[argc]) argc++;
  bool py = ends_with(prog[0], ".py");
  char **argv = calloc(argc + 2, sizeof *argv);
  if (!argv) {
    kt__run_say(2, "kaitian run: out of memory");
    return false;
  }
  const char *interp = NULL;
  if (py) {
    interp = python_interp();
    if (access(prog[0], R_OK) != 0) {
      kt__run_say(2, "kaitian run: cannot run '%s': %s", prog[0], strerror(errno));
      free(argv);
      return false;
    }
    argv[0] = (char *)interp;
    for (size_t i = 0; i < argc; i++) argv[i + 1] = prog[i];
  } else {
    for (size_t i = 0; i < argc; i++) argv[i] = prog[i];
  }
  char *path = kt__run_find_program(argv[0]);
  if (!path) {
    if (py)
      kt__run_say(2, "kaitian run: cannot run '%s': no Python interpreter: %s (set PYTHON to "
                     "the python that has torch)", prog[0], kt_last_error());
    else
      kt__run_say(2, "kaitian run: %s", kt_last_error());
    free(argv);
    return false;
  }
  ex->path = path;
  ex->argv = argv;
  ex->name = prog[0];
  *path_out = path;
  *argv_out = argv;
  return true;
}

/* ---- stopping ----------------------------------------------------------- */

static void signal_all(run_state *s, int sig) {
  for (int i = 0; i < s->o.nproc; i++) kt__run_signal_rank(&s->ranks[i], sig);
}

static void enter_phase(run_state *s, enum phase ph) {
  int64_t now = kt__now_ms();
  s->phase = ph;
  switch (ph) {
    case PHASE_RUN:
      s->deadline_ms = -1;
      break;
    case PHASE_GRACE:
      s->deadline_ms = now + s->o.grace_ms;
      break;
    case PHASE_TERM:
      signal_all(s, SIGTERM);
      s->deadline_ms = now + TERM_TO_KILL_MS;
      break;
    case PHASE_KILL:
      signal_all(s, SIGKILL);
      s->deadline_ms = -1;
      break;
  }
}

static void record_failure(run_state *s, const char *line, int status, bool post) {
  if (s->have_first) return;
  s->have_first = true;
  s->first_status = status;
  if (post && s->multi) kt__run_node_post_failure(&s->node, line, status);
  if (s->phase == PHASE_RUN) enter_phase(s, PHASE_GRACE);
}

static void on_rank_exit(run_state *s, kt_run_rank *r, int wstatus) {
  r->running = false;
  r->wstatus = wstatus;
  s->running--;
  /* What the rank wrote before dying comes before our line about it. */
  kt__run_stream_drain(&r->out);
  kt__run_stream_drain(&r->err);
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return;
  if (r->stopped) return; /* we asked it to stop: not a failure of its own */
  r->failed = true;
  s->fail_order[s->nfailed++] = (int)(r - s->ranks);
  char desc[96], line[200];
  int code = kt__run_describe_status(wstatus, desc, sizeof desc);
  snprintf(line, sizeof line, "kaitian run: rank %d (pid %d) %s", r->rank, (int)r->pid, desc);
  kt__run_say(2, "%s", line);
  record_failure(s, line, code, true);
}

static void on_reap(pid_t pid, int wstatus, void *arg) {
  run_state *s = arg;
  for (int i = 0; i < s->o.nproc; i++) {
    if (s->ranks[i].running && s->ranks[i].pid == pid) {
      on_rank_exit(s, &s->ranks[i], wstatus);
      return;
    }
  }
  /* Otherwise an orphaned descendant that we inherited: nothing to report. */
}

static void reap_children(run_state *s) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
    if (pid <= 0) break;
    on_reap(pid, st, s);
  }
}

static void on_signal(run_state *s, int sig) {
  char tmp[16];
  const char *name = kt__run_signame(sig, tmp, sizeof tmp);
  if (s->got_signal && s->phase == PHASE_TERM) {
    kt__run_say(2, "kaitian run: received %s again; killing the ranks now", name);
    enter_phase(s, PHASE_KILL);
    return;
  }
  if (!s->got_signal) s->got_signal = sig;
  if (s->phase == PHASE_KILL) return;
  kt__run_say(2, "kaitian run: received %s; forwarding it to the ranks (SIGKILL in %.1f s)", name,
              (double)s->o.grace_ms / 1000.0);
  if (s->multi && !s->have_first) {
    char line[400];
    snprintf(line, sizeof line, "kaitian run: the launcher of node %d (pid %d on %s) received %s",
             s->o.node_rank, (int)getpid(), s->node.host, name);
    kt__run_node_post_failure(&s->node, line, 128 + sig);
  }
  signal_all(s, sig);
  s->phase = PHASE_TERM;
  s->deadline_ms = kt__now_ms() + s->o.grace_ms;
}

static void drain_signals(run_state *s) {
  struct signalfd_siginfo si;
  for (;;) {
    ssize_t n = read(s->sigfd, &si, sizeof si);
    if (n != (ssize_t)sizeof si) break;
    if (si.ssi_signo == SIGCHLD) reap_children(s);
    else on_signal(s, (int)si.ssi_signo);
  }
}

/* One line about another node's failure; line is that node's own failure
 * line ("kaitian run: rank 3 (pid 99) exited with code 3"). */
static void say_remote_failure(const char *line, int node, const char *host, const char *then) {
  const char *what = line;
  if (!strncmp(what, "kaitian run: ", 13)) what += 13;
  kt__run_say(2, "kaitian run: node %d failed (host %s): %s; %s", node, host, what, then);
}

/* The line for a lost node (see run_live.c: its heartbeat stopped, and its
 * connection closed or its host does not answer). */
static void lost_line(char *line, size_t cap, int node, const char *host, const char *why) {
  snprintf(line, cap, "kaitian run: node %d (host %s) stopped answering: %s", node, host, why);
}

/* Every poll on node 0: a node that is gone (a launcher killed, a host or
 * its network lost, which its ranks' peers may only notice at
 * KAITIAN_TIMEOUT) fails the job naming it. The heartbeats themselves run on
 * threads of their own (run_live.c). */
static void watch_nodes(run_state *s) {
  if (s->o.node_rank != 0) return;
  char line[1200], host[256], why[600];
  int node = -1;
  if (kt__run_node_find_lost(&s->node, &node, host, sizeof host, why, sizeof why) != 1) return;
  lost_line(line, sizeof line, node, host, why);
  kt__run_say(2, "%s; stopping the ranks of this node", line);
  kt__run_node_post_failure_of(&s->node, node, host, line, 1);
  record_failure(s, line, 1, false);
}

static void poll_remote(run_state *s) {
  int64_t now = kt__now_ms();
  if (!s->multi || s->store_lost || s->have_first || s->phase != PHASE_RUN) return;
  if (now < s->next_poll_ms) return;
  s->next_poll_ms = now + NODE_POLL_MS;
  char line[1024], host[256];
  int status = 1, node = -1;
  int rc = kt__run_node_poll_failure(&s->node, line, sizeof line, &status, &node, host,
                                     sizeof host);
  if (rc == 0) {
    watch_nodes(s);
    return;
  }
  if (rc < 0) {
    s->store_lost = true;
    kt__run_say(2, "kaitian run: node %d lost the rendezvous store at %s (did node 0's launcher "
                   "exit?): %s; stopping the local ranks", s->o.node_rank, s->store_addr,
                kt_last_error());
    kt__run_node_leave(&s->node); /* nothing more to tell a store that is gone */
    record_failure(s, "", 1, false);
    return;
  }
  say_remote_failure(line, node, host, "stopping the ranks of this node");
  record_failure(s, line, status, false);
}

/* The event loop: until every local rank is reaped. */
static void event_loop(run_state *s) {
  size_t cap = 1 + 2 * (size_t)s->o.nproc;
  struct pollfd *pfd = calloc(cap, sizeof *pfd);
  kt_run_stream **who = calloc(cap, sizeof *who);
  if (!pfd || !who) {
    kt__run_say(2, "kaitian run: out of memory; killing the ranks");
    enter_phase(s, PHASE_KILL);
  }
  while (s->running > 0) {
    int64_t now = kt__now_ms();
    if (s->deadline_ms >= 0 && now >= s->deadline_ms) {
      if (s->phase == PHASE_GRACE) enter_phase(s, PHASE_TERM);
      else if (s->phase == PHASE_TERM) enter_phase(s, PHASE_KILL);
      continue;
    }
    poll_remote(s);
    int64_t timeout = -1;
    if (s->deadline_ms >= 0) timeout = s->deadline_ms - now;
    if (s->multi && !s->store_lost && !s->have_first && s->phase == PHASE_RUN)
      timeout = timeout < 0 ? NODE_POLL_MS : KT_MIN(timeout, NODE_POLL_MS);
    if (!pfd || !who) { /* degraded: just wait for children */
      int st;
      pid_t pid = waitpid(-1, &st, __WALL);
      if (pid > 0) on_reap(pid, st, s);
      continue;
    }
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = s->sigfd, .events = POLLIN};
    for (int i = 0; i < s->o.nproc; i++) {
      kt_run_stream *st[2] = {&s->ranks[i].out, &s->ranks[i].err};
      for (int j = 0; j < 2; j++) {
        if (st[j]->fd < 0) continue;
        who[n] = st[j];
        pfd[n++] = (struct pollfd){.fd = st[j]->fd, .events = POLLIN};
      }
    }
    int rc = poll(pfd, n, (int)KT_MIN(timeout, (int64_t)1 << 30));
    if (rc < 0 && errno != EINTR) {
      kt__run_say(2, "kaitian run: poll failed: %s; killing the ranks", strerror(errno));
      enter_phase(s, PHASE_KILL);
      free(pfd);
      free(who);
      pfd = NULL;
      who = NULL;
      continue;
    }
    for (size_t i = 1; rc > 0 && i < n; i++)
      if (pfd[i].revents) kt__run_stream_pump(who[i]);
    if (rc > 0 && pfd[0].revents) drain_signals(s);
  }
  free(pfd);
  free(who);
}

/* Node 0 of a multi-node job keeps the store up until every node is done. */
static void linger(run_state *s, int *status) {
  bool failed = s->have_first || s->node.posted;
  int64_t start = kt__now_ms();
  int64_t limit = start + (failed ? s->o.grace_ms + TERM_TO_KILL_MS + 2000 : kt__param_TIMEOUT());
  bool announced = false;
  for (;;) {
    /* Failure first: a node that fails posts it before counting itself done. */
    int64_t now = kt__now_ms();
    if (!failed) {
      char line[1024], host[256];
      int st = 1, node = -1;
      if (kt__run_node_poll_failure(&s->node, line, sizeof line, &st, &node, host,
                                    sizeof host) == 1) {
        say_remote_failure(line, node, host, "the job failed");
        failed = true;
        if (*status == 0) *status = st;
        limit = now + s->o.grace_ms + TERM_TO_KILL_MS + 2000;
      }
    }
    int64_t done = kt__run_node_done_count(&s->node);
    if (done < 0 || done >= s->o.nnodes) return;
    char lline[1200], lhost[256], lwhy[600];
    int lnode = -1;
    if (kt__run_node_find_lost(&s->node, &lnode, lhost, sizeof lhost, lwhy, sizeof lwhy) == 1) {
      lost_line(lline, sizeof lline, lnode, lhost, lwhy);
      kt__run_say(2, "%s", lline);
      if (*status == 0) *status = 1;
      return;
    }
    if (now >= limit) {
      kt__run_say(2, "kaitian run: gave up waiting for the other nodes: %lld of %d done",
                  (long long)done, s->o.nnodes);
      return;
    }
    if (!announced && now - start >= 10000) {
      announced = true;
      kt__run_say(2, "kaitian run: node 0 is done; keeping the rendezvous store up until all %d "
                     "nodes are (%lld done)", s->o.nnodes, (long long)done);
    }
    struct pollfd p = {.fd = s->sigfd, .events = POLLIN};
    int rc;
    KT_SYSCALL_RETRY(rc, poll(&p, 1, NODE_POLL_MS));
    struct signalfd_siginfo si;
    while (rc > 0 && read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
      if (si.ssi_signo == SIGCHLD) continue;
      if (*status == 0) *status = 128 + (int)si.ssi_signo;
      return;
    }
  }
}

static void print_summary(run_state *s) {
  if (s->nfailed < 2) return;
  char buf[1900]; /* within kt__run_say's limit */
  size_t len = 0;
  len += (size_t)snprintf(buf + len, sizeof buf - len, "kaitian run: %d ranks failed:",
                          s->nfailed);
  for (int i = 0; i < s->nfailed; i++) {
    if (len >= sizeof buf - 200) {
      snprintf(buf + len, sizeof buf - len, "; and %d more", s->nfailed - i);
      break;
    }
    kt_run_rank *r = &s->ranks[s->fail_order[i]];
    char desc[96];
    kt__run_describe_status(r->wstatus, desc, sizeof desc);
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s rank %d %s%s", i ? ";" : "",
                            r->rank, desc, i == 0 ? " (first)" : "");
  }
  kt__run_say(2, "%s", buf);
}

/* Make sure fds 0-2 exist, so our pipes never land on them. */
static void ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) < 0) {
      int n = open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) close(n);
    }
  }
}

/* Start the store (node 0), connect across nodes, and fill the job's
 * environment. Returns 0, or the launcher's exit status after printing why. */
static int setup_job(run_state *s, job_env *je, kt_store_server *srv) {
  const run_opts *o = &s->o;
  if (s->multi) {
    const char *secret = o->secret;
    if (!*secret) {
      kt__run_say(2, "kaitian run: --nnodes %d needs a job secret that every node shares: "
                     "export the same KAITIAN_JOB_SECRET on every node before starting the "
                     "launchers, e.g. KAITIAN_JOB_SECRET=$(od -An -N16 -tx1 /dev/urandom | "
                     "tr -d ' \\n')", o->nnodes);
      return 2;
    }
    if (strlen(secret) > KT_STORE_MAX_SECRET) {
      kt__run_say(2, "kaitian run: KAITIAN_JOB_SECRET is %zu bytes long; at most %d are allowed",
                  strlen(secret), KT_STORE_MAX_SECRET);
      return 2;
    }
    snprintf(je->secret, sizeof je->secret, "%s", secret);
    job_id_from_secret(je->secret, je->job_id);
  } else {
    if (random_hex(je->secret, 16) != KT_SUCCESS || random_hex(je->job_id, 8) != KT_SUCCESS) {
      kt__run_say(2, "kaitian run: %s", kt_last_error());
      return 1;
    }
  }
  const char *bind_host = "127.0.0.1";
  int port = 0;
  if (o->master) {
    bind_host = kt__store_listen_host(o->master_host);
    port = o->master_port;
    snprintf(je->master_addr, sizeof je->master_addr, "%s", o->master_host);
    je->master_port = o->master_port + 1;
  } else {
    snprintf(je->master_addr, sizeof je->master_addr, "127.0.0.1");
  }
  if (o->node_rank == 0) {
    if (kt_store_server_start(bind_host, port, je->secret, srv) != KT_SUCCESS) {
      kt__run_say(2, "kaitian run: cannot start the rendezvous store on %s port %d: %s",
                  bind_host, port, kt_last_error());
      return 1;
    }
  }
  if (o->master) snprintf(s->store_addr, sizeof s->store_addr, "%s", o->master);
  else snprintf(s->store_addr, sizeof s->store_addr, "127.0.0.1:%d", kt_store_server_port(*srv));
  if (!o->master && free_port(&je->master_port) != KT_SUCCESS) {
    kt__run_say(2, "kaitian run: %s", kt_last_error());
    return 1;
  }
  if (s->multi) {
    s->node.node_rank = o->node_rank;
    s->node.nnodes = o->nnodes;
    s->node.nproc = o->nproc;
    s->node.live_bind = bind_host;
    s->node.lost_ms = o->lost_ms;
    /* Node 0 reaches its own store over loopback (HOST may be an address
     * that is not routable from the host itself, e.g. behind NAT). */
    const char *connect_host = o->node_rank == 0 ? kt__store_self_host(o->master_host) : o->master_host;
    if (kt__run_node_join(&s->node, connect_host, o->master_port, je->secret) != KT_SUCCESS) {
      kt__run_say(2, "kaitian run: %s", kt_last_error());
      return s->node.interrupted_by ? 128 + s->node.interrupted_by : 1;
    }
  }
  je->set_unbuffered = getenv("PYTHONUNBUFFERED") == NULL;
  return 0;
}

/* Start every local rank. A rank that cannot exec stops the job (127). */
static void start_ranks(run_state *s, const job_env *je, const kt_run_exec *ex) {
  for (int i = 0; i < s->o.nproc; i++) {
    kt_run_rank *r = &s->ranks[i];
    char **extra = NULL;
    char **env = build_env(s, je, r, &extra);
    /* --local-rank-arg: "--local_rank=N" right after the program, where
     * torch.distributed.launch put it. */
    kt_run_exec mine = *ex;
    char **argv = NULL, arg[40];
    if (s->o.local_rank_arg && env) {
      size_t n = 0, at = ends_with(s->o.prog[0], ".py") ? 2 : 1;
      while (ex->argv[n]) n++;
      argv = calloc(n + 2, sizeof *argv);
      if (argv) {
        snprintf(arg, sizeof arg, "--local_rank=%d", i);
        for (size_t k = 0, o = 0; k <= n; k++) {
          if (k == at) argv[o++] = arg;
          if (k < n) argv[o++] = ex->argv[k];
        }
        mine.argv = argv;
      }
    }
    kt_result res = !env ? kt__err(KT_ERR_NO_MEMORY, "out of memory building rank %d's environment", r->rank)
                    : s->o.local_rank_arg && !argv ? kt__err(KT_ERR_NO_MEMORY, "out of memory")
                    : kt__run_spawn(r, &mine, env, s->o.prefix);
    free(argv);
    free_env(env, extra);
    if (r->running) s->running++;
    if (res != KT_SUCCESS) {
      if (r->running) r->stopped = true; /* its exit 127 is reported here, not again */
      kt__run_say(2, "kaitian run: %s", kt_last_error());
      char line[600];
      snprintf(line, sizeof line, "kaitian run: %s", kt_last_error());
      int status = res == KT_ERR_SYSTEM && r->running ? 127 : 1;
      s->have_first = true;
      s->first_status = status;
      if (s->multi) kt__run_node_post_failure(&s->node, line, status);
      enter_phase(s, PHASE_KILL);
      return;
    }
  }
}

/* Shared-memory segments are unlinked as soon as every rank of a
 * communicator has mapped them; a rank killed in that short window leaves
 * one behind. Its name carries the job id: remove what this job left. */
static void remove_shm_leftovers(const char *job_id) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "kaitian-%s-", job_id);
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) kt__run_say(2, "kaitian run: removed leftover shared memory %s", name);
  }
  closedir(d);
}

/* The plan at INFO: one line per local rank, and why nothing is bound. */
static void say_plan(const run_state *s, int cpus) {
  char node[32] = "";
  if (s->multi) snprintf(node, sizeof node, "node %d ", s->o.node_rank);
  if (s->o.bind && !s->ranks[0].cpus) {
    int nacc = 0;
    for (int i = 0; i < s->o.nproc; i++) nacc += s->ranks[i].accel;
    char acc[96] = "";
    if (nacc > 0)
      snprintf(acc, sizeof acc, " and %d accelerator rank%s x %d (--cpus-per-accel)", nacc,
               nacc == 1 ? "" : "s", s->o.cpus_per_accel);
    kt__run_say(2, "kaitian run: %splan: no CPU binding: %d CPU rank%s%s need more CPUs than "
                   "the %d the launcher may use", node, s->o.nproc - nacc,
                s->o.nproc - nacc == 1 ? "" : "s", acc, cpus);
  }
  for (int i = 0; i < s->o.nproc; i++) {
    const kt_run_rank *r = &s->ranks[i];
    char list[512] = "not bound";
    if (r->cpus) {
      memcpy(list, "CPUs ", 5);
      kt__run_format_cpus(r->cpus, r->cpus_bytes, list + 5, sizeof list - 5);
    }
    char local[32] = "";
    if (s->multi) snprintf(local, sizeof local, " (local %d)", i);
    kt__run_say(2, "kaitian run: %splan: rank %d%s -> %s (%s)", node, r->rank, local, r->device,
                list);
  }
}

/* Number the local ranks and give them their devices and CPUs. Returns the
 * CPUs the launcher may run on. */
static int place_ranks(run_state *s, const kt_run_device *plan) {
  for (int i = 0; i < s->o.nproc; i++) {
    kt_run_rank *r = &s->ranks[i];
    r->local_rank = i;
    r->rank = (s->multi ? s->node.rank_base : 0) + i;
    snprintf(r->device, sizeof r->device, "%s", plan[i].name);
    r->accel = plan[i].accel;
    kt__run_stream_init(&r->out, -1, 1, i, false);
    kt__run_stream_init(&r->err, -1, 2, i, false);
  }
  int cpus = kt__run_plan_cpus(s->ranks, s->o.nproc, s->o.bind, s->o.cpus_per_accel);
  if (kt__run_info_on()) say_plan(s, cpus);
  if (s->o.shape_from && kt__run_info_on())
    kt__run_say(2, "kaitian run: node %d of %d from %s (job %s); node 0 serves the store at %s",
                s->o.node_rank, s->o.nnodes, s->o.shape_from, s->o.job_id, s->o.master);
  return cpus;
}

int kt_tool_run(int argc, char **argv) {
  run_state st;
  memset(&st, 0, sizeof st);
  run_state *s = &st;
  s->sigfd = -1;
  s->deadline_ms = -1;
  int rc = parse_opts(argc, argv, &s->o);
  if (rc >= 0) return rc;
  s->multi = s->o.nnodes > 1;
  ensure_std_fds();

  /* Block the signals we wait for before any thread exists (the store server
   * runs one), so they reach the signalfd and nothing else. */
  /* An inherited SIG_IGN for SIGCHLD would make the kernel reap our ranks
   * before we can see how they ended. */
  signal(SIGCHLD, SIG_DFL);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the launcher */
  s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (s->sigfd < 0) {
    kt__run_say(2, "kaitian run: signalfd failed: %s", strerror(errno));
    return 1;
  }
  /* Orphans of our ranks come to us, so the end can kill and reap them. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    kt__run_say(2, "kaitian run: warning: cannot become a child subreaper (%s); detached "
                   "grandchildren of ranks may survive", strerror(errno));

  kt_run_exec ex = {0};
  char *path = NULL, **exargv = NULL;
  if (!resolve_program(s->o.prog, &ex, &path, &exargv)) {
    close(s->sigfd);
    return 127;
  }
  /* Before any thread exists: the discovery forks a helper. */
  kt_run_device *plan = NULL;
  int nplan = 0;
  rc = kt__run_plan_devices(&s->o.devspec, s->o.nproc, s->o.nproc_given,
                            ends_with(s->o.prog[0], ".py"), python_interp(), &plan, &nplan);
  if (rc >= 0) {
    free(path);
    free(exargv);
    close(s->sigfd);
    return rc;
  }
  s->o.nproc = nplan;

  job_env je;
  memset(&je, 0, sizeof je);
  kt_store_server srv = NULL;
  int status = setup_job(s, &je, &srv);
  s->ranks = calloc((size_t)s->o.nproc, sizeof *s->ranks);
  s->fail_order = calloc((size_t)s->o.nproc, sizeof *s->fail_order);
  if (status == 0 && (!s->ranks || !s->fail_order)) {
    kt__run_say(2, "kaitian run: out of memory for %d ranks", s->o.nproc);
    status = 1;
  }
  if (status != 0) goto out;
  int cpus = place_ranks(s, plan);
  je.omp_threads = getenv("OMP_NUM_THREADS") ? 0 : KT_MAX(1, cpus / s->o.nproc);

  start_ranks(s, &je, &ex);
  event_loop(s);

  /* Every rank is reaped: kill what they left behind, then flush output
   * (nothing can write to the pipes any more). */
  kt__run_kill_descendants(NULL, NULL);
  remove_shm_leftovers(je.job_id);
  for (int i = 0; i < s->o.nproc; i++) {
    kt__run_stream_finish(&s->ranks[i].out);
    kt__run_stream_finish(&s->ranks[i].err);
  }
  print_summary(s);
  if (s->have_first) status = s->first_status;
  else if (s->got_signal) status = 128 + s->got_signal;
  else status = 0;
  if (s->multi) {
    kt__run_node_done(&s->node);
    if (s->o.node_rank == 0) linger(s, &status);
  }

out:
  if (s->ranks) kt__run_free_cpus(s->ranks, s->o.nproc);
  kt__run_node_leave(&s->node);
  if (srv) kt_store_server_stop(srv);
  free(s->ranks);
  free(s->fail_order);
  free(plan);
  free(path);
  free(exargv);
  if (s->sigfd >= 0) close(s->sigfd);
  return status;
}
