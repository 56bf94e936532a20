/* jobenv.h - the job's shape (rank, size, node, store) from the environment
 * that a launcher or cluster manager set: one place for kt_comm_init_env,
 * `kaitian run` and the Python package (through kt_job_from_env). */
#ifndef KT_JOBENV_H
#define KT_JOBENV_H

#include "common.h"

/* Most hosts a host list or tasks-per-node list may expand to. */
#define KT_HOSTLIST_MAX (1L << 24)

/* Slurm host lists ("node[01-04,07],gpu-a[1-2]"): the number of hosts, and
 * host idx (0-based) written into out (at most cap bytes with the NUL). */
KT_INTERNAL kt_result kt__hostlist_count(const char *list, long *count);
KT_INTERNAL kt_result kt__hostlist_nth(const char *list, long idx, char *out, size_t cap);
/* SLURM_TASKS_PER_NODE ("2(x3),1"): tasks on node `node` (-1 when the list
 * has fewer nodes), the number of nodes it lists and the tasks in all. Any
 * output may be NULL. */
KT_INTERNAL kt_result kt__tasks_per_node(const char *spec, int node, int *tasks, int *nnodes, long *total);

/* Sources kt__job_from_env may take the shape from (a mask). */
enum {
  KT_JOB_SRC_KAITIAN = 1,
  KT_JOB_SRC_TORCHRUN = 2,
  KT_JOB_SRC_SLURM = 4,
  KT_JOB_SRC_OPENMPI = 8,
  KT_JOB_SRC_PMI = 16,
  KT_JOB_SRC_SCHEDULERS = KT_JOB_SRC_SLURM | KT_JOB_SRC_OPENMPI | KT_JOB_SRC_PMI,
  KT_JOB_SRC_ALL = 31,
};

/* kt_job_from_env over the sources in `mask` only (`kaitian run` asks the
 * cluster managers alone: RANK and friends are what it sets, not reads). */
KT_INTERNAL kt_result kt__job_from_env(kt_job *job, unsigned mask);

/* The secret a job's store requires: KAITIAN_JOB_SECRET; else, for a job
 * shaped by a cluster manager, one derived from the job's id, the user and
 * (when it exists) the key in $KAITIAN_SECRET_FILE or ~/.kaitian/secret;
 * else "". Never logged. */
KT_INTERNAL kt_result kt__job_secret(const kt_job *job, char *out, size_t cap);

#endif /* KT_JOBENV_H */
