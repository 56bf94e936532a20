/* size_faults.c - changing the message size costs no page fault: after a
 * communicator is set up, allreduce, broadcast, allgather and
 * reduce_scatter of every size from 8 B to 4 KiB in steps of 8 B (the
 * small-message protocol's range, where each new multiple of 56 bytes
 * reaches lines not used before) fault in no page of shared memory. Before
 * the segment's slots were mapped at setup, a sweep like this one took 157
 * minor faults per rank at 2 ranks, hundreds of microseconds each time the
 * size changed. Each rank counts its own minor faults (getrusage) over the
 * sweep, after one untimed pass over every size with its own buffers (so
 * the test's buffers are faulted in beforehand); the results are checked.
 * Run under `kaitian run -n N`. */
#include "kaitian.h"
#include "rank_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

enum { MAX = 4096, ROUNDS = 3, LIMIT = 4 };

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static void pass(kt_comm comm, int rank, int size, float *a, float *b, int check) {
  for (size_t bytes = 8; bytes <= MAX; bytes += 8) {
    size_t n = bytes / 4;
    for (size_t i = 0; i < n; i++) a[i] = (float)(rank + 1);
    CHECK(kt_allreduce(a, a, n, KT_FLOAT32, KT_SUM, comm) == KT_SUCCESS, "allreduce %zu B", bytes);
    if (check) CHECK(a[n - 1] == (float)(size * (size + 1) / 2), "allreduce %zu B: %g", bytes, a[n - 1]);
    for (size_t i = 0; i < n; i++) a[i] = (float)(rank == size - 1 ? 7 : 0);
    CHECK(kt_broadcast(a, a, n, KT_FLOAT32, size - 1, comm) == KT_SUCCESS, "broadcast %zu B", bytes);
    if (check) CHECK(a[0] == 7.0f && a[n - 1] == 7.0f, "broadcast %zu B", bytes);
    size_t per = n / (size_t)size ? n / (size_t)size : 1;
    for (size_t i = 0; i < per; i++) a[i] = (float)rank;
    CHECK(kt_allgather(a, b, per, KT_FLOAT32, comm) == KT_SUCCESS, "allgather %zu B", bytes);
    if (check) CHECK(b[per * (size_t)(size - 1)] == (float)(size - 1), "allgather %zu B", bytes);
    for (size_t i = 0; i < per * (size_t)size; i++) b[i] = 1.0f;
    CHECK(kt_reduce_scatter(b, a, per, KT_FLOAT32, KT_SUM, comm) == KT_SUCCESS, "reduce_scatter %zu B", bytes);
    if (check) CHECK(a[per - 1] == (float)size, "reduce_scatter %zu B", bytes);
  }
}

int main(void) {
  int rank = -1, size = 0;
  kt_comm comm;
  kt_result r = kt_comm_init_env(&comm);
  CHECK(r == KT_SUCCESS, "init: %s", kt_strerror(r));
  kt_comm_rank(comm, &rank);
  kt_comm_size(comm, &size);
  float *a = calloc(MAX * 16, 1), *b = calloc(MAX * 16, 1);
  CHECK(a && b, "alloc");
  memset(a, 0, MAX * 16);
  memset(b, 0, MAX * 16);
  /* The first pass over 8 B only warms up the code paths (the stack, the
   * reduction kernels); then every size, counted. */
  CHECK(kt_allreduce(a, a, 2, KT_FLOAT32, KT_SUM, comm) == KT_SUCCESS, "warm-up");
  CHECK(kt_barrier(comm) == KT_SUCCESS, "barrier");
  long before = minflt();
  for (int k = 0; k < ROUNDS; k++) pass(comm, rank, size, a, b, 1);
  long faults = minflt() - before;
  printf("rank %d of %d: %ld minor page faults over %d sweeps of 8 B-4 KiB (4 collectives, 512 sizes)\n", rank,
         size, faults, ROUNDS);
  CHECK(faults <= LIMIT, "rank %d: %ld page faults while only the message size changed (at most %d expected)",
        rank, faults, LIMIT);
  CHECK(kt_barrier(comm) == KT_SUCCESS, "barrier");
  kt_comm_destroy(comm);
  free(a);
  free(b);
  return 0;
}
