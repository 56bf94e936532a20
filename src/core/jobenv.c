/* jobenv.c - the job's shape from the environment (kt_job_from_env).
 *
 * Sources, first complete one wins: KaiTian's own variables, torchrun's,
 * Open MPI's, PMI's (MPICH's hydra, srun --mpi=pmi2), then Slurm's. The MPI
 * launchers come before Slurm because mpirun inside an allocation starts its
 * daemons with srun: its ranks carry a Slurm step's variables that describe
 * the daemons (one task per node), not the ranks. Within a source every value is
 * checked against the others (rank below size, local rank below local size,
 * node list against node count), and a source that is half set is an error
 * naming what is there and what is missing, since a guess would hang.
 *
 * The store: KAITIAN_STORE_ADDR when set (a launcher serves it); else
 * MASTER_ADDR / MASTER_PORT; else the source's own default (Slurm: the first
 * node of the step; MPI on one host: loopback), at a port derived from the
 * job's id so that every rank computes the same one. In the last two cases
 * nobody serves the store yet: serve_store tells rank 0 to. */
#include "jobenv.h"

#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Derived store ports fall in [PORT_BASE, PORT_BASE + PORT_SPAN), below
 * Linux's ephemeral range (32768-60999) so that no outgoing connection holds
 * one; kaitian run uses PORT and PORT+1. */
#define PORT_BASE 20000
#define PORT_SPAN 10000

/* A variable that is set and not empty. */
static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* The first of several names that is set (its name in *which). */
static const char *env_first(const char *const *names, const char **which) {
  for (; *names; names++) {
    const char *v = env(*names);
    if (v) {
      if (which) *which = *names;
      return v;
    }
  }
  return NULL;
}

/* An integer variable in lo..hi; absent leaves *out and returns success. */
static kt_result get_int(const char *src, const char *name, const char *val, long lo, long hi, int *out) {
  if (!val) return KT_SUCCESS;
  char *end;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || end == val || *end || v < lo || v > hi)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%.64s is not a number in %ld..%ld", src, name, val, lo, hi);
  *out = (int)v;
  return KT_SUCCESS;
}

static int derived_port(const char *job_id) {
  uint64_t h = kt__fnv1a_str(kt__fnv1a_str(KT_FNV1A_BASIS, "kaitian-port:"), job_id);
  return PORT_BASE + (int)(h % PORT_SPAN);
}

/* Where the store is. default_host: the source's own idea (NULL: none);
 * derive: the port may be derived from job->job_id. `agent_port`: the
 * launcher's agent holds MASTER_PORT itself (torchrun), so ours is the next. */
static kt_result find_store(kt_job *j, const char *src, const char *default_host, bool derive, bool agent_port,
                            const char *no_host_hint) {
  if (j->size == 1) return KT_SUCCESS; /* nobody to meet */
  const char *addr = env("KAITIAN_STORE_ADDR");
  if (addr) {
    KT_CHECK(kt__parse_hostport(addr, j->store_host, sizeof j->store_host, &j->store_port));
    return KT_SUCCESS;
  }
  const char *ma = env("MASTER_ADDR"), *mp = env("MASTER_PORT");
  const char *host = ma ? ma : default_host;
  if (!host)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: rank %d of %d, but no rendezvous address: %s", src, j->rank, j->size,
                   no_host_hint);
  if (strlen(host) >= sizeof j->store_host)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: the store host '%.64s...' is too long", src, host);
  snprintf(j->store_host, sizeof j->store_host, "%s", host);
  if (mp) {
    int port = 0;
    KT_CHECK(get_int(src, "MASTER_PORT", mp, 1, agent_port ? 65534 : 65535, &port));
    j->store_port = port + (agent_port ? 1 : 0);
  } else if (derive && j->job_id[0]) {
    j->store_port = derived_port(j->job_id);
  } else if (ma) {
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: MASTER_ADDR=%.64s is set but MASTER_PORT is not", src, host);
  } else {
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: nothing in it identifies the job, to derive the store's port from; "
                   "set MASTER_PORT (the same on every rank)", src);
  }
  j->serve_store = 1;
  return KT_SUCCESS;
}

/* The first source's rank and size pair: both or neither. */
static kt_result pair(const char *src, const char *rname, const char *sname, int *rank, int *size, bool *present) {
  const char *r = env(rname), *s = env(sname);
  *present = r || s;
  if (!*present) return KT_SUCCESS;
  if (!r || !s)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s is set but %s is not (a half-set environment: set both, or neither)",
                   src, r ? rname : sname, r ? sname : rname);
  KT_CHECK(get_int(src, sname, s, 1, 1 << 30, size));
  KT_CHECK(get_int(src, rname, r, 0, 1 << 30, rank));
  if (*rank >= *size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%d is not below %s=%d", src, rname, *rank, sname, *size);
  return KT_SUCCESS;
}

/* An optional local rank / local size pair, checked against each other and
 * against the job's size. */
static kt_result local_pair(kt_job *j, const char *src, const char *rname, const char *sname) {
  KT_CHECK(get_int(src, rname, env(rname), 0, 1 << 30, &j->local_rank));
  KT_CHECK(get_int(src, sname, env(sname), 1, 1 << 30, &j->local_size));
  if (j->local_size > j->size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%d is above the job's size %d", src, sname, j->local_size, j->size);
  if (j->local_rank >= 0 && j->local_size > 0 && j->local_rank >= j->local_size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%d is not below %s=%d", src, rname, j->local_rank, sname,
                   j->local_size);
  return KT_SUCCESS;
}

static kt_result from_kaitian(kt_job *j, bool *found) {
  const char *src = "KaiTian's environment";
  KT_CHECK(pair(src, "KAITIAN_RANK", "KAITIAN_WORLD_SIZE", &j->rank, &j->size, found));
  if (!*found) return KT_SUCCESS;
  KT_CHECK(local_pair(j, src, "KAITIAN_LOCAL_RANK", "KAITIAN_LOCAL_WORLD_SIZE"));
  const char *id = env("KAITIAN_JOB_ID");
  if (id) snprintf(j->job_id, sizeof j->job_id, "%s", id);
  return find_store(j, src, NULL, false, false,
                    "set KAITIAN_STORE_ADDR (a running store) or MASTER_ADDR and MASTER_PORT (rank 0 serves one)");
}

static kt_result from_torchrun(kt_job *j, bool *found) {
  const char *src = "torchrun's environment";
  KT_CHECK(pair(src, "RANK", "WORLD_SIZE", &j->rank, &j->size, found));
  if (!*found) return KT_SUCCESS;
  KT_CHECK(local_pair(j, src, "LOCAL_RANK", "LOCAL_WORLD_SIZE"));
  KT_CHECK(get_int(src, "GROUP_RANK", env("GROUP_RANK"), 0, 1 << 30, &j->node_rank));
  KT_CHECK(get_int(src, "GROUP_WORLD_SIZE", env("GROUP_WORLD_SIZE"), 1, 1 << 30, &j->nnodes));
  if (j->node_rank >= 0 && j->nnodes > 0 && j->node_rank >= j->nnodes)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d", src, j->node_rank,
                   j->nnodes);
  const char *id = env("KAITIAN_JOB_ID");
  if (!id) id = env("TORCHELASTIC_RUN_ID");
  if (id) snprintf(j->job_id, sizeof j->job_id, "%s", id);
  /* Under torchrun itself (TORCHELASTIC_RUN_ID), its agent serves torch's
   * store at MASTER_PORT: ours goes on the next port. */
  return find_store(j, src, NULL, false, env("TORCHELASTIC_RUN_ID") != NULL,
                    "set MASTER_ADDR and MASTER_PORT (rank 0 serves the store there), or KAITIAN_STORE_ADDR, "
                    "or start the program with `kaitian run`");
}

static kt_result from_slurm(kt_job *j, bool *found) {
  const char *src = "the Slurm environment";
  /* An srun task has SLURM_STEP_ID and SLURM_PROCID; a batch script has
   * SLURM_PROCID (0) without a step, and is one process, not the job. */
  const char *procid = env("SLURM_PROCID"), *step = env("SLURM_STEP_ID");
  if (!step) step = env("SLURM_STEPID");
  *found = step != NULL;
  if (!*found) return KT_SUCCESS;
  if (!procid)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "%s: SLURM_STEP_ID=%.32s is set but SLURM_PROCID is not (a half-set environment: srun sets both)",
                   src, step);
  static const char *const ntasks_names[] = {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", NULL};
  static const char *const nnodes_names[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", NULL};
  static const char *const list_names[] = {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST", NULL};
  static const char *const tpn_names[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
  const char *ntasks_name = NULL, *nnodes_name = NULL, *list_name = NULL, *tpn_name = NULL;
  const char *ntasks = env_first(ntasks_names, &ntasks_name), *nnodes = env_first(nnodes_names, &nnodes_name);
  const char *list = env_first(list_names, &list_name), *tpn = env_first(tpn_names, &tpn_name);
  if (!ntasks)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "%s: SLURM_PROCID=%.32s is set but SLURM_STEP_NUM_TASKS / SLURM_NTASKS is not (start the tasks "
                   "with srun, which sets both)",
                   src, procid);
  KT_CHECK(get_int(src, ntasks_name, ntasks, 1, 1 << 30, &j->size));
  KT_CHECK(get_int(src, "SLURM_PROCID", procid, 0, 1 << 30, &j->rank));
  if (j->rank >= j->size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: SLURM_PROCID=%d is not below %s=%d", src, j->rank, ntasks_name,
                   j->size);
  KT_CHECK(get_int(src, "SLURM_NODEID", env("SLURM_NODEID"), 0, 1 << 30, &j->node_rank));
  KT_CHECK(get_int(src, nnodes_name ? nnodes_name : "", nnodes, 1, 1 << 30, &j->nnodes));
  if (j->nnodes > j->size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%d nodes for %s=%d tasks", src, nnodes_name, j->nnodes,
                   ntasks_name, j->size);
  if (j->node_rank >= 0 && j->nnodes > 0 && j->node_rank >= j->nnodes)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: SLURM_NODEID=%d is not below %s=%d", src, j->node_rank, nnodes_name,
                   j->nnodes);
  KT_CHECK(get_int(src, "SLURM_LOCALID", env("SLURM_LOCALID"), 0, 1 << 30, &j->local_rank));
  if (tpn) {
    int listed = 0, here = -1;
    long total = 0;
    if (kt__tasks_per_node(tpn, j->node_rank >= 0 ? j->node_rank : 0, &here, &listed, &total) != KT_SUCCESS)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%.64s is not a tasks-per-node list such as 2(x3),1", src,
                     tpn_name, tpn);
    if (j->nnodes > 0 && listed != j->nnodes)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%.64s lists %d nodes, %s=%d", src, tpn_name, tpn, listed,
                     nnodes_name, j->nnodes);
    /* Step lists go with the step's task count (the job's with the job's). */
    bool same_level = !strncmp(tpn_name, "SLURM_STEP_", 11) == !strncmp(ntasks_name, "SLURM_STEP_", 11);
    if (same_level && total != j->size)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%.64s gives %ld tasks, %s=%d", src, tpn_name, tpn, total,
                     ntasks_name, j->size);
    if (j->node_rank >= 0) j->local_size = here;
  }
  if (j->local_rank >= 0 && j->local_size > 0 && j->local_rank >= j->local_size)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: SLURM_LOCALID=%d is not below the %d tasks %s gives node %d", src,
                   j->local_rank, j->local_size, tpn_name, j->node_rank);
  char first[256] = "";
  if (list) {
    long nhosts = 0;
    if (kt__hostlist_count(list, &nhosts) != KT_SUCCESS) {
      char why[400]; /* the message is rewritten below */
      snprintf(why, sizeof why, "%s", kt_last_error());
      return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s: %s", src, list_name, why);
    }
    if (j->nnodes > 0 && nhosts != j->nnodes && strcmp(list_name, "SLURM_JOB_NODELIST") != 0)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: %s=%.100s names %ld hosts, %s=%d", src, list_name, list, nhosts,
                     nnodes_name, j->nnodes);
    KT_CHECK(kt__hostlist_nth(list, 0, first, sizeof first));
  }
  const char *jid = env("SLURM_JOB_ID");
  if (!jid) jid = env("SLURM_JOBID");
  snprintf(j->job_id, sizeof j->job_id, "slurm-%.40s.%.40s", jid ? jid : "?", step);
  return find_store(j, src, list ? first : NULL, true, false,
                    "SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set; set MASTER_ADDR to the host of task 0");
}

/* Several MPI launchers put every rank on one host when local size is size. */
static kt_result from_mpi(kt_job *j, bool *found, const char *src, const char *rname, const char *sname,
                          const char *lrname, const char *lsname, const char *const *id_names) {
  KT_CHECK(pair(src, rname, sname, &j->rank, &j->size, found));
  if (!*found) return KT_SUCCESS;
  KT_CHECK(local_pair(j, src, lrname, lsname));
  const char *id = env_first(id_names, NULL);
  const char *sjob = env("SLURM_JOB_ID"), *sstep = env("SLURM_STEP_ID");
  if (id) {
    snprintf(j->job_id, sizeof j->job_id, "%.95s", id);
  } else if (sjob) { /* inside a Slurm allocation: its job (and the step of srun-started daemons) */
    snprintf(j->job_id, sizeof j->job_id, "mpi-slurm-%.40s.%.40s", sjob, sstep ? sstep : "batch");
  } else if (j->local_size == j->size) {
    /* One host, no id (MPICH's hydra sets none): the ranks' common parent,
     * the launcher's proxy. */
    snprintf(j->job_id, sizeof j->job_id, "mpi-%ld-%ld", (long)getppid(), (long)geteuid());
  }
  bool one_host = j->local_size == j->size;
  /* Several hosts inside a Slurm allocation: rank 0 runs on its first node. */
  static const char *const list_names[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
  const char *list = one_host ? NULL : env_first(list_names, NULL);
  char first[256] = "";
  if (list && kt__hostlist_nth(list, 0, first, sizeof first) != KT_SUCCESS) first[0] = '\0';
  char hint[300];
  snprintf(hint, sizeof hint,
           "%s=%d of %s=%d ranks are on this host, so the others cannot find rank 0 by themselves; set MASTER_ADDR "
           "to rank 0's host (e.g. mpirun -x MASTER_ADDR=node01)",
           lsname, j->local_size, sname, j->size);
  if (j->local_size < 0)
    snprintf(hint, sizeof hint, "%s is not set, so the ranks' hosts are unknown; set MASTER_ADDR to rank 0's host",
             lsname);
  return find_store(j, src, one_host ? "127.0.0.1" : first[0] ? first : NULL, true, false, hint);
}

static kt_result from_openmpi(kt_job *j, bool *found) {
  static const char *const ids[] = {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", NULL};
  return from_mpi(j, found, "the Open MPI environment", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", ids);
}

static kt_result from_pmi(kt_job *j, bool *found) {
  static const char *const ids[] = {"PMI_KVSNAME", "PMI_JOBID", "PMIX_NAMESPACE", NULL};
  return from_mpi(j, found, "the PMI environment", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", ids);
}

kt_result kt__job_from_env(kt_job *job, unsigned mask) {
  if (!job) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_job_from_env: job is NULL");
  static const struct {
    unsigned bit;
    const char *name;
    kt_result (*fn)(kt_job *, bool *);
  } sources[] = {
      {KT_JOB_SRC_KAITIAN, "kaitian", from_kaitian}, {KT_JOB_SRC_TORCHRUN, "torchrun", from_torchrun},
      {KT_JOB_SRC_OPENMPI, "openmpi", from_openmpi}, {KT_JOB_SRC_PMI, "pmi", from_pmi},
      {KT_JOB_SRC_SLURM, "slurm", from_slurm},
  };
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    if (!(mask & sources[i].bit)) continue;
    memset(job, 0, sizeof *job);
    job->local_rank = job->local_size = job->node_rank = job->nnodes = -1;
    bool found = false;
    kt_result r = sources[i].fn(job, &found);
    if (r != KT_SUCCESS) {
      memset(job, 0, sizeof *job);
      return r;
    }
    if (!found) continue;
    snprintf(job->source, sizeof job->source, "%s", sources[i].name);
    if (job->size == 1) {
      job->local_rank = job->node_rank = 0;
      job->local_size = job->nnodes = 1;
    }
    return KT_SUCCESS;
  }
  memset(job, 0, sizeof *job);
  job->size = job->local_size = job->nnodes = 1;
  snprintf(job->source, sizeof job->source, "none");
  return KT_SUCCESS;
}

kt_result kt_job_from_env(kt_job *job) {
  kt__clear_error();
  return kt__job_from_env(job, KT_JOB_SRC_ALL);
}

/* The per-user key: $KAITIAN_SECRET_FILE, else ~/.kaitian/secret. Absent is
 * fine (len 0); present, it must be a regular file of this user that nobody
 * else can read, else the error says how to fix it. */
static kt_result read_key(unsigned char *key, size_t cap, size_t *len) {
  *len = 0;
  char path[4096];
  const char *f = env("KAITIAN_SECRET_FILE"), *home = env("HOME");
  if (f) snprintf(path, sizeof path, "%s", f);
  else if (home) snprintf(path, sizeof path, "%s/.kaitian/secret", home);
  else return KT_SUCCESS;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT && !f) return KT_SUCCESS;
    return kt__err(KT_ERR_INVALID_ARGUMENT, "cannot open the key file %s: %s", path, strerror(errno));
  }
  struct stat st;
  kt_result r = KT_SUCCESS;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    r = kt__err(KT_ERR_INVALID_ARGUMENT, "the key file %s is not a regular file", path);
  } else if (st.st_uid != geteuid() || (st.st_mode & 077)) {
    r = kt__err(KT_ERR_INVALID_ARGUMENT,
                "the key file %s can be read by other users (mode %03o) or is not yours; chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
  } else {
    ssize_t n = read(fd, key, cap);
    if (n < 0) r = kt__err(KT_ERR_SYSTEM, "cannot read the key file %s: %s", path, strerror(errno));
    else *len = (size_t)n;
  }
  close(fd);
  return r;
}

kt_result kt__job_secret(const kt_job *job, char *out, size_t cap) {
  const char *s = env("KAITIAN_JOB_SECRET");
  if (cap < 33) return kt__err(KT_ERR_INVALID_ARGUMENT, "job secret buffer too small");
  out[0] = '\0';
  if (s) {
    if (strlen(s) >= cap || strlen(s) > KT_STORE_MAX_SECRET)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "KAITIAN_JOB_SECRET is %zu bytes long; at most %d are allowed",
                     strlen(s), KT_STORE_MAX_SECRET);
    snprintf(out, cap, "%s", s);
    return KT_SUCCESS;
  }
  if (!job->job_id[0]) return KT_SUCCESS;
  unsigned char key[512];
  size_t klen;
  KT_CHECK(read_key(key, sizeof key, &klen));
  unsigned uid = (unsigned)geteuid();
  uint64_t h[2] = {KT_FNV1A_BASIS, 0x9e3779b97f4a7c15ULL};
  for (int k = 0; k < 2; k++) {
    h[k] = kt__fnv1a_str(h[k], "kaitian-secret:");
    h[k] = kt__fnv1a(h[k], &k, sizeof k);
    h[k] = kt__fnv1a(h[k], key, klen);
    h[k] = kt__fnv1a(h[k], &uid, sizeof uid);
    h[k] = kt__fnv1a_str(h[k], job->job_id);
  }
  volatile unsigned char *p = key; /* do not leave the key on the stack */
  for (size_t i = 0; i < sizeof key; i++) p[i] = 0;
  snprintf(out, cap, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
  return KT_SUCCESS;
}
