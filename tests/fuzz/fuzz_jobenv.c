/* fuzz_jobenv.c - libFuzzer harness for the parsers of the job's shape
 * (src/core/hostlist.c, jobenv.c): Slurm host lists, tasks-per-node lists,
 * and kt_job_from_env over environments built from the input.
 *
 * Input: NUL-separated fields. The first byte picks the target:
 *   0: a host list (count, then every host by index, checked to stay within
 *      the buffer and to agree with the count);
 *   1: a tasks-per-node list, with a node index from the second byte;
 *   2: "NAME=VALUE" fields set as the environment (names limited to the
 *      variables kt_job_from_env reads), then kt_job_from_env, whose result
 *      must be consistent (rank < size, local rank < local size).
 * Crashes, sanitizer reports and failed checks (abort) are findings. */
#include "jobenv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {
    "KAITIAN_RANK", "KAITIAN_WORLD_SIZE", "KAITIAN_LOCAL_RANK", "KAITIAN_LOCAL_WORLD_SIZE", "KAITIAN_STORE_ADDR",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
    "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_KVSNAME"};
#define NNAMES (sizeof names / sizeof names[0])

static void check(int cond, const char *what) {
  if (!cond) {
    fprintf(stderr, "fuzz_jobenv: check failed: %s\n", what);
    abort();
  }
}

static void hostlist(const char *s) {
  long n = 0;
  if (kt__hostlist_count(s, &n) != KT_SUCCESS) return;
  check(n >= 1 && n <= KT_HOSTLIST_MAX, "host count in range");
  char host[256];
  long step = n > 64 ? n / 64 : 1;
  for (long i = 0; i < n; i += step) {
    memset(host, 0x55, sizeof host);
    if (kt__hostlist_nth(s, i, host, sizeof host) == KT_SUCCESS)
      check(memchr(host, 0, sizeof host) != NULL, "host name terminated within the buffer");
  }
  check(kt__hostlist_nth(s, n, host, sizeof host) != KT_SUCCESS, "no host past the count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 4096) return 0;
  char *buf = malloc(size + 1);
  if (!buf) return 0;
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  switch (data[0] % 3) {
    case 0:
      hostlist(buf);
      break;
    case 1: {
      int tasks = 0, nnodes = 0;
      long total = 0;
      if (kt__tasks_per_node(buf + (size > 2), buf[0] & 0x3f, &tasks, &nnodes, &total) == KT_SUCCESS)
        check(nnodes >= 1 && total >= 0, "tasks-per-node totals");
      break;
    }
    default: {
      for (size_t i = 0; i < NNAMES; i++) unsetenv(names[i]);
      for (char *p = buf; p < buf + size - 1; p += strlen(p) + 1) {
        char *eq = strchr(p, '=');
        if (!eq) continue;
        *eq = '\0';
        for (size_t i = 0; i < NNAMES; i++)
          if (!strcmp(p, names[i])) setenv(names[i], eq + 1, 1);
        *eq = '=';
      }
      kt_job job;
      if (kt_job_from_env(&job) == KT_SUCCESS) {
        check(job.size >= 1 && job.rank >= 0 && job.rank < job.size, "rank below size");
        check(job.local_size < 0 || job.local_rank < 0 || job.local_rank < job.local_size, "local rank below local size");
        check(memchr(job.store_host, 0, sizeof job.store_host) != NULL, "store host terminated");
        check(job.size == 1 || (job.store_port > 0 && job.store_port <= 65535), "store port in range");
      }
    }
  }
  free(buf);
  return 0;
}
