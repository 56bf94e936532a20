/* launch_env_test.c - a C program started by srun, mpirun or kaitian run with
 * no code of its own for the job's shape: kt_comm_init_env, then checked
 * allreduce (int64 and float64, sum and max), allgather and a sendrecv ring
 * against values every rank computes by itself. Prints one line per rank:
 * "PASS launch rank R of N source S local L/LS" (exit 0), or FAIL lines
 * (exit 1). `--expect-size N` / `--expect-source S` also check the shape. */
#include <kaitian.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT 1001 /* odd, over several cache lines */

static int fails;
#define FAIL(...)                    \
  do {                               \
    fails++;                         \
    fprintf(stderr, "FAIL " __VA_ARGS__); \
    fprintf(stderr, "\n");           \
  } while (0)

int main(int argc, char **argv) {
  int expect_size = 0;
  const char *expect_source = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--expect-size")) expect_size = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--expect-source")) expect_source = argv[i + 1];
  }
  kt_job job;
  if (kt_job_from_env(&job) != KT_SUCCESS) {
    fprintf(stderr, "FAIL kt_job_from_env: %s\n", kt_last_error());
    return 1;
  }
  kt_comm comm;
  kt_result r = kt_comm_init_env(&comm);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "FAIL kt_comm_init_env: %s: %s\n", kt_strerror(r), kt_last_error());
    return 1;
  }
  int rank, size;
  kt_comm_rank(comm, &rank);
  kt_comm_size(comm, &size);
  if (rank != job.rank || size != job.size) FAIL("rank %d/%d, the job says %d/%d", rank, size, job.rank, job.size);
  if (expect_size && size != expect_size) FAIL("rank %d: size %d, expected %d", rank, size, expect_size);
  if (expect_source && strcmp(job.source, expect_source))
    FAIL("rank %d: source %s, expected %s", rank, job.source, expect_source);

  int64_t *iv = malloc(COUNT * sizeof *iv);
  double *dv = malloc(COUNT * sizeof *dv), *dm = malloc(COUNT * sizeof *dm);
  int32_t *all = malloc((size_t)size * 3 * sizeof *all);
  if (!iv || !dv || !dm || !all) return 1;
  for (int i = 0; i < COUNT; i++) {
    iv[i] = (int64_t)(rank + 1) * (i + 1);
    dv[i] = (rank + 1) * 0.5 + i;
    dm[i] = (double)((rank * 7 + i) % (size + 3));
  }
  r = kt_allreduce(iv, iv, COUNT, KT_INT64, KT_SUM, comm);
  if (r == KT_SUCCESS) r = kt_allreduce(dv, dv, COUNT, KT_FLOAT64, KT_SUM, comm);
  if (r == KT_SUCCESS) r = kt_allreduce(dm, dm, COUNT, KT_FLOAT64, KT_MAX, comm);
  int32_t mine[3] = {rank, size, job.local_rank};
  if (r == KT_SUCCESS) r = kt_allgather(mine, all, 3, KT_INT32, comm);
  int64_t token = 1000 + rank, got = -1;
  if (r == KT_SUCCESS)
    r = kt_sendrecv(&token, 1, (rank + 1) % size, &got, 1, (rank + size - 1) % size, KT_INT64, 0, comm);
  if (r != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: %s: %s\n", rank, kt_strerror(r), kt_last_error());
    return 1;
  }
  int64_t tri = (int64_t)size * (size + 1) / 2;
  for (int i = 0; i < COUNT; i++) {
    double want_d = 0.5 * (double)tri + (double)size * i, want_m = 0;
    for (int k = 0; k < size; k++) want_m = (double)((k * 7 + i) % (size + 3)) > want_m ? (k * 7 + i) % (size + 3) : want_m;
    if (iv[i] != tri * (i + 1)) FAIL("rank %d: int64 sum [%d] = %lld, expected %lld", rank, i, (long long)iv[i],
                                     (long long)(tri * (i + 1)));
    if (dv[i] != want_d) FAIL("rank %d: float64 sum [%d] = %g, expected %g", rank, i, dv[i], want_d);
    if (dm[i] != want_m) FAIL("rank %d: float64 max [%d] = %g, expected %g", rank, i, dm[i], want_m);
    if (fails > 5) break;
  }
  for (int k = 0; k < size; k++)
    if (all[3 * k] != k || all[3 * k + 1] != size) FAIL("rank %d: allgather block %d = %d,%d", rank, k, all[3 * k],
                                                      all[3 * k + 1]);
  if (got != 1000 + (rank + size - 1) % size) FAIL("rank %d: sendrecv got %lld", rank, (long long)got);
  r = kt_comm_destroy(comm);
  if (r != KT_SUCCESS) FAIL("rank %d: kt_comm_destroy: %s", rank, kt_last_error());
  free(iv);
  free(dv);
  free(dm);
  free(all);
  if (fails) return 1;
  printf("PASS launch rank %d of %d source %s local %d/%d\n", rank, size, job.source, job.local_rank, job.local_size);
  return 0;
}
