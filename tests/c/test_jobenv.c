/* test_jobenv.c - the job's shape from the environment (src/core/jobenv.c,
 * hostlist.c): Slurm host lists over the forms Slurm documents and bad
 * ones, tasks-per-node lists, and kt_job_from_env over every source, with
 * half-set and inconsistent environments. Where `scontrol` is installed,
 * random host lists are also checked against `scontrol show hostnames`
 * (an independent reference; it needs a config file, written to a temporary
 * directory and removed). */
#include "jobenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures, checks;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    checks++;                                             \
    if (!(cond)) {                                        \
      failures++;                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
    }                                                     \
  } while (0)

/* Expand a list into one space-separated string. */
static kt_result expand(const char *list, char *out, size_t cap) {
  long n = 0;
  kt_result r = kt__hostlist_count(list, &n);
  if (r != KT_SUCCESS) return r;
  size_t o = 0;
  out[0] = '\0';
  for (long i = 0; i < n && o < cap; i++) {
    char h[256];
    r = kt__hostlist_nth(list, i, h, sizeof h);
    if (r != KT_SUCCESS) return r;
    o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? " " : "", h);
  }
  return KT_SUCCESS;
}

static void good(const char *list, const char *want) {
  char got[4096];
  kt_result r = expand(list, got, sizeof got);
  CHECK(r == KT_SUCCESS, "'%s': %s", list, kt_last_error());
  if (r == KT_SUCCESS) CHECK(!strcmp(got, want), "'%s' -> '%s', expected '%s'", list, got, want);
}

static void bad(const char *list, const char *why) {
  long n;
  kt_result r = kt__hostlist_count(list, &n);
  CHECK(r == KT_ERR_INVALID_ARGUMENT, "'%s' was accepted (%ld hosts)", list, n);
  if (r != KT_SUCCESS) CHECK(strstr(kt_last_error(), why), "'%s': message '%s' lacks '%s'", list, kt_last_error(), why);
}

static void test_hostlists(void) {
  good("node01", "node01");
  good("node[01-04,07],gpu-a[1-2]", "node01 node02 node03 node04 node07 gpu-a1 gpu-a2");
  good("n[8-11]", "n8 n9 n10 n11");
  good("n[008-011]", "n008 n009 n010 n011");
  good("n[001-3]", "n001 n002 n003");
  good("n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
  good("n[01-2]", "n01 n02");
  good("n[1,01]", "n1 n01");
  good("n[09-11]", "n09 n10 n11");
  good("rack[1-2]-n[01-02],x", "rack1-n01 rack1-n02 rack2-n01 rack2-n02 x");
  good("a,,b", "a b");
  good("a b", "a b");
  good("[1-3]", "1 2 3");
  good("10.0.0.[1-2]", "10.0.0.1 10.0.0.2");
  good("n[0-0]", "n0");
  good("node-[7]", "node-7");
  bad("", "empty");
  bad(",", "names no host");
  bad("n[]", "empty range");
  bad("n[3-1]", "below its start");
  bad("n[1", "without ']'");
  bad("n1]", "without '['");
  bad("n[1-2[3]]", "inside brackets");
  bad("n[a-b]", "not NUMBER or LO-HI");
  bad("n[1-]", "not NUMBER or LO-HI");
  bad("n[-1]", "not NUMBER or LO-HI");
  bad("n[1,,2]", "empty range");
  bad("n[1234567890123456789]", "not NUMBER");
  bad("n[0-99999999]", "more hosts than a job can have");
  bad("a[0-9999]b[0-9999]", "more hosts than a job can have");
  bad("n[1]\x01", "control character");
  bad("n[1 2]", "space inside brackets");
  bad("a[1][2][3][4][5][6][7][8][9]", "more than 8 bracket groups");
  /* A name longer than 255 characters is refused where it is written out. */
  char longname[400];
  memset(longname, 'h', 300);
  strcpy(longname + 300, "[1-2]");
  char h[256];
  CHECK(kt__hostlist_nth(longname, 0, h, sizeof h) == KT_ERR_INVALID_ARGUMENT, "a 301-character host was written");
  CHECK(kt__hostlist_nth("n[1-2]", 2, h, sizeof h) == KT_ERR_INVALID_ARGUMENT, "host 2 of 2 was found");
  CHECK(kt__hostlist_nth("n[1-2]", -1, h, sizeof h) == KT_ERR_INVALID_ARGUMENT, "host -1 was found");
  CHECK(kt__hostlist_count(NULL, NULL) == KT_ERR_INVALID_ARGUMENT, "NULL list accepted");
}

static void test_tasks_per_node(void) {
  static const struct {
    const char *spec;
    int node, tasks, nnodes;
    long total;
  } cases[] = {
      {"4", 0, 4, 1, 4},      {"2(x3),1", 0, 2, 4, 7}, {"2(x3),1", 2, 2, 4, 7}, {"2(x3),1", 3, 1, 4, 7},
      {"2(x3),1", 4, -1, 4, 7}, {"1,2,3", 1, 2, 3, 6},   {"3(x1)", 0, 3, 1, 3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int t = 99, n = 99;
    long total = -1;
    kt_result r = kt__tasks_per_node(cases[i].spec, cases[i].node, &t, &n, &total);
    CHECK(r == KT_SUCCESS && t == cases[i].tasks && n == cases[i].nnodes && total == cases[i].total,
          "'%s' node %d: %d tasks of %d nodes, %ld in all (r %d)", cases[i].spec, cases[i].node, t, n, total, (int)r);
  }
  static const char *const bads[] = {"", "x", "2(x)", "2(3)", "2(x3", "2(x0)", "-1", "1,", ",1", "2(x3)4", "1 ,2", "0(x2)", "1,0"};
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++)
    CHECK(kt__tasks_per_node(bads[i], 0, NULL, NULL, NULL) == KT_ERR_INVALID_ARGUMENT, "'%s' accepted", bads[i]);
}

/* ---- kt_job_from_env ---------------------------------------------------- */

static const char *const all_vars[] = {
    "KAITIAN_RANK", "KAITIAN_WORLD_SIZE", "KAITIAN_LOCAL_RANK", "KAITIAN_LOCAL_WORLD_SIZE", "KAITIAN_STORE_ADDR",
    "KAITIAN_JOB_ID", "KAITIAN_JOB_SECRET", "KAITIAN_SECRET_FILE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS", "SLURM_NNODES",
    "SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_JOBID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_KVSNAME", "PMI_PORT", NULL};

/* Clear every variable a source reads, then set "NAME=VALUE" pairs. */
static void set_env(const char *const *kv) {
  for (const char *const *v = all_vars; *v; v++) unsetenv(*v);
  for (; kv && *kv; kv++) {
    char name[128];
    const char *eq = strchr(*kv, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - *kv), *kv);
    setenv(name, eq + 1, 1);
  }
}

/* The srun task environment of rank 5 in `srun -N 3 -n 8` (3,3,2). */
static const char *const slurm_env[] = {"SLURM_PROCID=5", "SLURM_STEP_ID=0", "SLURM_JOB_ID=4711",
                                        "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=8", "SLURM_NNODES=3",
                                        "SLURM_STEP_NUM_NODES=3", "SLURM_NODEID=1", "SLURM_LOCALID=2",
                                        "SLURM_STEP_NODELIST=node[07-08],gpu-a1", "SLURM_JOB_NODELIST=node[07-08],gpu-a1",
                                        "SLURM_STEP_TASKS_PER_NODE=3(x2),2", "SLURM_TASKS_PER_NODE=3(x2),2", NULL};

static void job_ok(const char *what, const char *const *kv, kt_job *j) {
  set_env(kv);
  kt_result r = kt_job_from_env(j);
  CHECK(r == KT_SUCCESS, "%s: %s", what, kt_last_error());
}

/* The environment `base` with one variable replaced ("NAME=VALUE") or
 * removed ("NAME"), must fail naming `names`. */
static void job_bad(const char *what, const char *const *base, const char *change, const char *names) {
  const char *kv[64];
  int n = 0;
  size_t clen = strcspn(change, "=");
  for (; base && *base; base++)
    if (strncmp(*base, change, clen) != 0 || (*base)[clen] != '=') kv[n++] = *base;
  if (strchr(change, '=')) kv[n++] = change;
  kv[n] = NULL;
  set_env(kv);
  kt_job j;
  kt_result r = kt_job_from_env(&j);
  CHECK(r == KT_ERR_INVALID_ARGUMENT, "%s (%s): accepted (source %s rank %d size %d)", what, change, j.source, j.rank,
        j.size);
  if (r != KT_SUCCESS) {
    char list[256];
    snprintf(list, sizeof list, "%s", names);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","))
      CHECK(strstr(kt_last_error(), tok), "%s (%s): message '%s' does not name %s", what, change, kt_last_error(), tok);
  }
}

static void test_sources(void) {
  kt_job j;
  job_ok("empty", NULL, &j);
  CHECK(!strcmp(j.source, "none") && j.rank == 0 && j.size == 1 && j.local_size == 1 && !j.store_host[0],
        "empty: %s %d/%d", j.source, j.rank, j.size);

  /* kaitian run's ranks: torchrun's variables and KAITIAN_STORE_ADDR. */
  const char *const launcher[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                                  "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29501", "KAITIAN_STORE_ADDR=10.1.2.3:29500",
                                  "KAITIAN_JOB_ID=abc", NULL};
  job_ok("launcher", launcher, &j);
  CHECK(!strcmp(j.source, "torchrun") && j.rank == 3 && j.size == 4 && j.local_rank == 1 && j.local_size == 2 &&
            j.node_rank == 1 && !strcmp(j.store_host, "10.1.2.3") && j.store_port == 29500 && !j.serve_store &&
            !strcmp(j.job_id, "abc"),
        "launcher: %s %d/%d local %d/%d node %d store %s:%d serve %d id %s", j.source, j.rank, j.size, j.local_rank,
        j.local_size, j.node_rank, j.store_host, j.store_port, j.serve_store, j.job_id);
  /* Plain torchrun variables (no launcher store): rank 0 serves at MASTER_PORT;
   * under torchrun's agent (TORCHELASTIC_RUN_ID) at the next port. */
  const char *const plain[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29400", NULL};
  job_ok("plain torchrun", plain, &j);
  CHECK(j.serve_store && j.store_port == 29400 && !strcmp(j.store_host, "127.0.0.1"), "plain: %s:%d serve %d",
        j.store_host, j.store_port, j.serve_store);
  const char *const elastic[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29400",
                                 "TORCHELASTIC_RUN_ID=r1", NULL};
  job_ok("torchrun agent", elastic, &j);
  CHECK(j.serve_store && j.store_port == 29401 && !strcmp(j.job_id, "r1"), "elastic: port %d id %s", j.store_port,
        j.job_id);
  job_bad("half torchrun", launcher, "WORLD_SIZE", "RANK,WORLD_SIZE");
  job_bad("half torchrun", launcher, "RANK", "RANK,WORLD_SIZE");
  job_bad("torchrun rank", launcher, "RANK=4", "RANK=4,WORLD_SIZE=4");
  job_bad("torchrun rank", launcher, "RANK=-1", "RANK=-1");
  job_bad("torchrun size", launcher, "WORLD_SIZE=x", "WORLD_SIZE=x");
  job_bad("torchrun local", launcher, "LOCAL_RANK=2", "LOCAL_RANK=2,LOCAL_WORLD_SIZE=2");
  job_bad("torchrun local size", launcher, "LOCAL_WORLD_SIZE=5", "LOCAL_WORLD_SIZE=5");
  job_bad("no store", plain, "MASTER_ADDR", "MASTER_ADDR");
  job_bad("no port", plain, "MASTER_PORT", "MASTER_PORT");
  job_bad("bad store", launcher, "KAITIAN_STORE_ADDR=nohostport", "nohostport");

  /* KaiTian's own variables come first. */
  const char *const own[] = {"KAITIAN_RANK=1", "KAITIAN_WORLD_SIZE=3", "KAITIAN_STORE_ADDR=h:5", "RANK=0",
                             "WORLD_SIZE=9", NULL};
  job_ok("own", own, &j);
  CHECK(!strcmp(j.source, "kaitian") && j.rank == 1 && j.size == 3, "own: %s %d/%d", j.source, j.rank, j.size);
  job_bad("half own", own, "KAITIAN_WORLD_SIZE", "KAITIAN_RANK,KAITIAN_WORLD_SIZE");

  /* Slurm. */
  job_ok("slurm", slurm_env, &j);
  CHECK(!strcmp(j.source, "slurm") && j.rank == 5 && j.size == 8 && j.local_rank == 2 && j.local_size == 3 &&
            j.node_rank == 1 && j.nnodes == 3 && !strcmp(j.store_host, "node07") && j.serve_store &&
            j.store_port >= 20000 && j.store_port < 30000 && !strcmp(j.job_id, "slurm-4711.0"),
        "slurm: %s %d/%d local %d/%d node %d/%d store %s:%d serve %d id %s", j.source, j.rank, j.size, j.local_rank,
        j.local_size, j.node_rank, j.nnodes, j.store_host, j.store_port, j.serve_store, j.job_id);
  int port = j.store_port;
  job_bad("slurm procid", slurm_env, "SLURM_PROCID=8", "SLURM_PROCID=8,SLURM_STEP_NUM_TASKS=8");
  job_bad("slurm ntasks", slurm_env, "SLURM_STEP_NUM_TASKS=x", "SLURM_STEP_NUM_TASKS");
  job_bad("slurm nodeid", slurm_env, "SLURM_NODEID=3", "SLURM_NODEID=3,SLURM_STEP_NUM_NODES=3");
  job_bad("slurm localid", slurm_env, "SLURM_LOCALID=3", "SLURM_LOCALID=3,SLURM_STEP_TASKS_PER_NODE");
  job_bad("slurm tasks per node", slurm_env, "SLURM_STEP_TASKS_PER_NODE=3(x3),2", "SLURM_STEP_TASKS_PER_NODE");
  job_bad("slurm tasks per node", slurm_env, "SLURM_STEP_TASKS_PER_NODE=three", "SLURM_STEP_TASKS_PER_NODE");
  job_bad("slurm nodelist", slurm_env, "SLURM_STEP_NODELIST=node[07-09],gpu-a1", "SLURM_STEP_NODELIST");
  job_bad("slurm nodelist", slurm_env, "SLURM_STEP_NODELIST=node[07-", "SLURM_STEP_NODELIST");
  job_bad("slurm nnodes", slurm_env, "SLURM_STEP_NUM_NODES=9", "SLURM_STEP_NUM_NODES=9");
  {
    const char *kv[] = {"SLURM_PROCID=0", "SLURM_STEP_ID=0", "SLURM_JOB_ID=1", NULL};
    job_bad("slurm without ntasks", kv, "SLURM_LOCALID=0", "SLURM_PROCID,SLURM_NTASKS");
  }
  {
    const char *kv[] = {"SLURM_PROCID=1", "SLURM_STEP_ID=0", "SLURM_JOB_ID=1", "SLURM_NTASKS=2", NULL};
    job_bad("slurm without nodelist", kv, "SLURM_LOCALID=1", "SLURM_STEP_NODELIST,MASTER_ADDR");
  }
  job_bad("slurm step without procid", slurm_env, "SLURM_PROCID", "SLURM_STEP_ID,SLURM_PROCID");
  job_bad("slurm tasks per node sum", slurm_env, "SLURM_STEP_TASKS_PER_NODE=3,3,3", "SLURM_STEP_TASKS_PER_NODE,9 tasks");
  /* mpirun inside an allocation: its daemons were started by srun, so the
   * ranks carry a step's variables (one task per node); the MPI ones win. */
  {
    const char *kv[] = {"PMI_RANK=3", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "SLURM_PROCID=1",
                        "SLURM_STEP_ID=0", "SLURM_JOB_ID=99", "SLURM_STEP_NUM_TASKS=2", "SLURM_NTASKS=4",
                        "SLURM_STEP_NUM_NODES=2", "SLURM_NODEID=1", "SLURM_LOCALID=0", "SLURM_STEP_NODELIST=kt[1-2]",
                        "SLURM_JOB_NODELIST=kt[1-2]", "SLURM_STEP_TASKS_PER_NODE=1(x2)", NULL};
    job_ok("mpich in an allocation", kv, &j);
    CHECK(!strcmp(j.source, "pmi") && j.rank == 3 && j.size == 4 && j.local_rank == 1 && !strcmp(j.store_host, "kt1") &&
              !strcmp(j.job_id, "mpi-slurm-99.0") && j.serve_store,
          "mpich in an allocation: %s %d/%d local %d store %s:%d id %s", j.source, j.rank, j.size, j.local_rank,
          j.store_host, j.store_port, j.job_id);
  }
  {
    const char *kv[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", NULL};
    job_ok("mpich on one host, no job id", kv, &j);
    CHECK(!strcmp(j.source, "pmi") && !strncmp(j.job_id, "mpi-", 4) && !strcmp(j.store_host, "127.0.0.1"),
          "mpich one host: %s id %s store %s", j.source, j.job_id, j.store_host);
    const char *kv2[] = {"PMI_RANK=1", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "MASTER_ADDR=h0", NULL};
    job_bad("mpich on two hosts, no job id", kv2, "MASTER_ADDR=h0", "MASTER_ADDR=h0,MASTER_PORT");
    job_bad("mpich on two hosts", kv2, "MASTER_ADDR", "MPI_LOCALNRANKS=2,MASTER_ADDR");
  }
  /* MASTER_ADDR / MASTER_PORT override Slurm's store address. */
  {
    const char *kv[32];
    int n = 0;
    for (const char *const *v = slurm_env; *v; v++) kv[n++] = *v;
    kv[n++] = "MASTER_ADDR=10.9.9.9";
    kv[n] = NULL;
    job_ok("slurm+master_addr", kv, &j);
    CHECK(!strcmp(j.store_host, "10.9.9.9") && j.store_port == port, "slurm+MASTER_ADDR: %s:%d", j.store_host,
          j.store_port);
    kv[n++] = "MASTER_PORT=12345";
    kv[n] = NULL;
    job_ok("slurm+master_port", kv, &j);
    CHECK(j.store_port == 12345, "slurm+MASTER_PORT: %d", j.store_port);
  }
  /* Another step of the job: another port (not guaranteed for every pair,
   * but for these two). And a batch shell (no SLURM_STEP_ID) is not a job. */
  {
    const char *kv[32];
    int n = 0;
    for (const char *const *v = slurm_env; *v; v++)
      if (strncmp(*v, "SLURM_STEP_ID=", 14)) kv[n++] = *v;
    kv[n] = NULL;
    job_ok("batch shell", kv, &j);
    CHECK(!strcmp(j.source, "none"), "batch shell: source %s", j.source);
    kv[n++] = "SLURM_STEP_ID=1";
    kv[n] = NULL;
    job_ok("step 1", kv, &j);
    CHECK(j.store_port != port && !strcmp(j.job_id, "slurm-4711.1"), "step 1: port %d (step 0: %d), id %s",
          j.store_port, port, j.job_id);
  }
  /* torchrun's variables (set by kaitian run inside an srun task) win. */
  {
    const char *kv[32];
    int n = 0;
    for (const char *const *v = slurm_env; *v; v++) kv[n++] = *v;
    kv[n++] = "RANK=0";
    kv[n++] = "WORLD_SIZE=1";
    kv[n] = NULL;
    job_ok("launcher in srun", kv, &j);
    CHECK(!strcmp(j.source, "torchrun") && j.size == 1, "launcher in srun: %s %d", j.source, j.size);
    /* kaitian run asks the cluster managers only. */
    set_env(kv);
    CHECK(kt__job_from_env(&j, KT_JOB_SRC_SCHEDULERS) == KT_SUCCESS && !strcmp(j.source, "slurm") && j.rank == 5,
          "schedulers only: %s %d", j.source, j.rank);
  }

  /* Open MPI. */
  const char *const ompi[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                              "OMPI_COMM_WORLD_LOCAL_SIZE=3", "OMPI_MCA_ess_base_jobid=123456", NULL};
  job_ok("ompi", ompi, &j);
  CHECK(!strcmp(j.source, "openmpi") && j.rank == 2 && j.size == 3 && j.local_rank == 2 && j.local_size == 3 &&
            !strcmp(j.store_host, "127.0.0.1") && j.serve_store && j.store_port >= 20000 && j.store_port < 30000,
        "ompi: %s %d/%d local %d/%d store %s:%d", j.source, j.rank, j.size, j.local_rank, j.local_size, j.store_host,
        j.store_port);
  job_bad("ompi half", ompi, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK,OMPI_COMM_WORLD_SIZE");
  {
    const char *const ompi0[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE=3", "OMPI_MCA_ess_base_jobid=123456", NULL};
    job_bad("ompi several hosts", ompi0, "OMPI_COMM_WORLD_LOCAL_SIZE=1", "MASTER_ADDR,OMPI_COMM_WORLD_LOCAL_SIZE=1");
    job_bad("ompi several hosts", ompi0, "OMPI_COMM_WORLD_LOCAL_SIZE", "MASTER_ADDR,OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  job_bad("ompi several hosts", ompi, "OMPI_COMM_WORLD_LOCAL_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=2");
  /* PMI (MPICH's hydra). */
  const char *const pmi[] = {"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2",
                             "PMI_KVSNAME=kvs_77_0", NULL};
  job_ok("pmi", pmi, &j);
  CHECK(!strcmp(j.source, "pmi") && j.rank == 1 && j.size == 2 && j.local_size == 2 &&
            !strcmp(j.store_host, "127.0.0.1"),
        "pmi: %s %d/%d", j.source, j.rank, j.size);
  job_bad("pmi half", pmi, "PMI_RANK", "PMI_RANK,PMI_SIZE");
  job_bad("pmi rank", pmi, "PMI_RANK=2", "PMI_RANK=2,PMI_SIZE=2");
  CHECK(kt_job_from_env(NULL) == KT_ERR_INVALID_ARGUMENT, "NULL job accepted");
}

static void test_secret(void) {
  kt_job j;
  char a[300], b[300];
  set_env(slurm_env);
  kt_job_from_env(&j);
  setenv("KAITIAN_SECRET_FILE", "/nonexistent/kaitian-test-key", 1);
  CHECK(kt__job_secret(&j, a, sizeof a) == KT_ERR_INVALID_ARGUMENT && strstr(kt_last_error(), "kaitian-test-key"),
        "a missing KAITIAN_SECRET_FILE was not reported: %s", kt_last_error());
  unsetenv("KAITIAN_SECRET_FILE");
  setenv("HOME", "/nonexistent", 1);
  CHECK(kt__job_secret(&j, a, sizeof a) == KT_SUCCESS && strlen(a) == 32, "derived secret: '%s'", a);
  snprintf(j.job_id, sizeof j.job_id, "slurm-4711.1");
  CHECK(kt__job_secret(&j, b, sizeof b) == KT_SUCCESS && strcmp(a, b) != 0, "the secret does not depend on the job");
  setenv("KAITIAN_JOB_SECRET", "s3cret", 1);
  CHECK(kt__job_secret(&j, a, sizeof a) == KT_SUCCESS && !strcmp(a, "s3cret"), "KAITIAN_JOB_SECRET not used: %s", a);
  unsetenv("KAITIAN_JOB_SECRET");
  /* A key file others can read is refused, naming the fix. */
  char dir[] = "/dev/shm/kt_jobenv_XXXXXX";
  if (mkdtemp(dir)) {
    char path[128];
    snprintf(path, sizeof path, "%s/key", dir);
    FILE *f = fopen(path, "w");
    if (f) {
      fputs("0123456789abcdef", f);
      fclose(f);
      chmod(path, 0644);
      setenv("KAITIAN_SECRET_FILE", path, 1);
      CHECK(kt__job_secret(&j, a, sizeof a) == KT_ERR_INVALID_ARGUMENT && strstr(kt_last_error(), "chmod 600"),
            "a world-readable key was used: %s", kt_last_error());
      chmod(path, 0600);
      CHECK(kt__job_secret(&j, a, sizeof a) == KT_SUCCESS && strcmp(a, b) != 0, "the key does not change the secret");
      unsetenv("KAITIAN_SECRET_FILE");
      unlink(path);
    }
    rmdir(dir);
  }
}

/* Random host lists of one or two groups against scontrol. */
static void test_against_scontrol(void) {
  if (system("command -v scontrol >/dev/null 2>&1") != 0) {
    printf("note: scontrol is not installed; host lists not compared with Slurm's own expansion\n");
    return;
  }
  char dir[] = "/dev/shm/kt_hostlist_XXXXXX";
  if (!mkdtemp(dir)) return;
  char conf[128];
  snprintf(conf, sizeof conf, "%s/slurm.conf", dir);
  FILE *f = fopen(conf, "w");
  if (!f) {
    rmdir(dir);
    return;
  }
  fputs("ClusterName=kt\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n", f);
  fclose(f);
  srand(12345);
  int compared = 0;
  for (int t = 0; t < 60; t++) {
    char list[512] = "";
    size_t o = 0;
    int entries = 1 + rand() % 3;
    for (int e = 0; e < entries; e++) {
      o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", e ? "," : "", (const char *[]){"n", "gpu-a", "r"}[rand() % 3]);
      int groups = rand() % 3;
      for (int g = 0; g < groups; g++) {
        if (g) o += (size_t)snprintf(list + o, sizeof list - o, "-x");
        o += (size_t)snprintf(list + o, sizeof list - o, "[");
        int ranges = 1 + rand() % 3, base = rand() % 20;
        for (int r = 0; r < ranges; r++) {
          int lo = base + rand() % 5, w = rand() % 3 ? 1 : 3, hi = lo + rand() % 4;
          base = hi + 1 + rand() % 3;
          o += (size_t)snprintf(list + o, sizeof list - o, "%s%0*d", r ? "," : "", w, lo);
          if (hi > lo) o += (size_t)snprintf(list + o, sizeof list - o, "-%0*d", w, hi);
        }
        o += (size_t)snprintf(list + o, sizeof list - o, "]");
      }
      if (groups == 0) o += (size_t)snprintf(list + o, sizeof list - o, "%d", e);
    }
    char cmd[1024], want[8192] = "", got[8192];
    snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scontrol show hostnames '%s' 2>&1", conf, list);
    FILE *p = popen(cmd, "r");
    if (!p) break;
    size_t w = 0;
    char line[300];
    while (fgets(line, sizeof line, p)) {
      line[strcspn(line, "\n")] = '\0';
      w += (size_t)snprintf(want + w, sizeof want - w, "%s%s", w ? " " : "", line);
    }
    int rc = pclose(p);
    if (rc != 0) {
      printf("note: scontrol failed on '%s' (%s); comparison stopped\n", list, want);
      break;
    }
    kt_result r = expand(list, got, sizeof got);
    CHECK(r == KT_SUCCESS && !strcmp(got, want), "'%s': ours '%s', scontrol '%s'", list,
          r == KT_SUCCESS ? got : kt_last_error(), want);
    compared++;
  }
  unlink(conf);
  rmdir(dir);
  printf("compared %d random host lists with scontrol show hostnames\n", compared);
}

int main(void) {
  test_hostlists();
  test_tasks_per_node();
  test_sources();
  test_secret();
  test_against_scontrol();
  if (failures) {
    fprintf(stderr, "FAIL %d of %d checks\n", failures, checks);
    return 1;
  }
  printf("PASS %d checks\n", checks);
  return 0;
}
