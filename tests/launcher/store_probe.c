/* store_probe.c - rank program of the launcher tests: prints the environment
 * contract it got from `kaitian run` and meets every other rank in the
 * launcher's rendezvous store (each sets its job id; all must agree). */
#include "common.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v ? v : "(unset)";
}

int main(void) {
  const char *addr = kt__param_STORE_ADDR(), *secret = kt__param_JOB_SECRET();
  const char *job = kt__param_JOB_ID();
  int rank = atoi(env("RANK")), world = atoi(env("WORLD_SIZE"));
  char host[256], key[64], got[64];
  int port = 0, met = 0;
  kt_store st = NULL;
  if (kt__parse_hostport(addr, host, sizeof host, &port) != KT_SUCCESS ||
      kt_store_tcp_connect(host, port, secret, 20000, &st) != KT_SUCCESS) {
    fprintf(stderr, "probe rank %d: cannot use the store at '%s': %s\n", rank, addr, kt_last_error());
    return 1;
  }
  snprintf(key, sizeof key, "probe/%d", rank);
  if (kt_store_set(st, key, job, strlen(job)) != KT_SUCCESS) goto fail;
  for (int r = 0; r < world; r++) {
    size_t len = 0;
    snprintf(key, sizeof key, "probe/%d", r);
    if (kt_store_get(st, key, got, sizeof got - 1, &len, 20000) != KT_SUCCESS) goto fail;
    got[len] = '\0';
    if (strcmp(got, job) != 0) {
      fprintf(stderr, "probe rank %d: rank %d has job id %s, I have %s\n", rank, r, got, job);
      return 1;
    }
    met++;
  }
  printf("PROBE rank=%s local=%s world=%s lws=%s group=%s gws=%s role=%s rws=%s maddr=%s mport=%s "
         "store=%s secret=%s job=%s omp=%s unbuffered=%s met=%d\n",
         env("RANK"), env("LOCAL_RANK"), env("WORLD_SIZE"), env("LOCAL_WORLD_SIZE"),
         env("GROUP_RANK"), env("GROUP_WORLD_SIZE"), env("ROLE_RANK"), env("ROLE_WORLD_SIZE"),
         env("MASTER_ADDR"), env("MASTER_PORT"), addr, secret, job, env("OMP_NUM_THREADS"),
         env("PYTHONUNBUFFERED"), met);
  fflush(stdout);
  /* No need to wait for the others: the store lives until every rank of
   * the job is done (node 0's launcher waits for all nodes). */
  kt_store_free(st);
  return 0;
fail:
  fprintf(stderr, "probe rank %d: store error: %s\n", rank, kt_last_error());
  return 1;
}
