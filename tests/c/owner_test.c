/* owner_test.c - the owner's path (src/core/progress.c): the one thread that
 * has issued only blocking calls on a communicator runs them without the
 * lock; a second thread, or a non-blocking call, turns that off for good,
 * also while the owner is inside an op. Every op here has the same signature
 * and inputs (rank + 1), so whichever op of another rank an op meets, its
 * sum is known: a wrong sum, a mismatch, an error or a hang (two ops at once
 * on one communicator) fails; so does destroying the communicator from
 * another thread while the owner is inside an op (it must wait for the op).
 * Run under `kaitian run -n N`. */
#include "kaitian.h"
#include "rank_check.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { COUNT = 5 };

static int rank = -1, size = 0;
static kt_comm comm;

static void pause_us(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* One allreduce (blocking, or non-blocking and waited for) checked. */
static void one(int i, int nonblocking) {
  float buf[COUNT];
  for (int j = 0; j < COUNT; j++) buf[j] = (float)(rank + 1);
  kt_result r;
  if (nonblocking) {
    kt_request req;
    r = kt_iallreduce(buf, buf, COUNT, KT_FLOAT32, KT_SUM, comm, &req);
    if (r == KT_SUCCESS) r = kt_wait(req);
  } else {
    r = kt_allreduce(buf, buf, COUNT, KT_FLOAT32, KT_SUM, comm);
  }
  CHECK(r == KT_SUCCESS, "op %d (%s): %s", i, nonblocking ? "non-blocking" : "blocking", kt_strerror(r));
  float want = (float)(size * (size + 1) / 2);
  for (int j = 0; j < COUNT; j++) CHECK(buf[j] == want, "op %d elem %d: want %g got %g", i, j, want, buf[j]);
}

typedef struct {
  int n, nonblocking_every;
} job;

static void *second(void *arg) {
  const job *jb = arg;
  for (int i = 0; i < jb->n; i++) one(i, jb->nonblocking_every && i % jb->nonblocking_every == 0);
  return NULL;
}

static void *destroyer(void *arg) {
  pause_us(5000);
  kt_result r = kt_comm_destroy((kt_comm)arg);
  CHECK(r == KT_SUCCESS, "destroy from another thread: %s", kt_strerror(r));
  return NULL;
}

int main(void) {
  kt_result r = kt_comm_init_env(&comm);
  CHECK(r == KT_SUCCESS, "init: %s", kt_strerror(r));
  kt_comm_rank(comm, &rank);
  kt_comm_size(comm, &size);

  /* 1. The owner alone: blocking calls only. */
  for (int i = 0; i < 3000; i++) one(i, 0);

  /* 2. A second thread comes while the owner is inside an op: rank 0
   * enters late, so the other ranks' owners wait in op k when their second
   * thread issues op k + 1. */
  job jb = {200, 3};
  pthread_t t;
  if (rank == 0) pause_us(20000);
  else {
    CHECK(pthread_create(&t, NULL, second, &jb) == 0, "pthread_create");
  }
  for (int i = 0; i < 200; i++) {
    if (rank == 0 && i == 1) CHECK(pthread_create(&t, NULL, second, &jb) == 0, "pthread_create");
    if (rank == 0 && i % 50 == 0) pause_us(2000);
    one(i, 0);
  }
  CHECK(pthread_join(t, NULL) == 0, "pthread_join");

  /* 3. After: the former owner's blocking calls go through the lock. */
  for (int i = 0; i < 500; i++) one(i, i % 7 == 0);

  /* 4. A new communicator: its owner turns its own path off with a
   * non-blocking call made while nothing runs. */
  kt_comm parent = comm, child;
  r = kt_comm_split(parent, 0, rank, &child);
  CHECK(r == KT_SUCCESS, "split: %s", kt_strerror(r));
  comm = child;
  for (int i = 0; i < 100; i++) one(i, 0);
  one(100, 1);
  for (int i = 101; i < 300; i++) one(i, 0);
  CHECK(kt_comm_destroy(child) == KT_SUCCESS, "destroy the split");

  /* 5. Destroy from another thread while the owner waits inside an op
   * (rank 0 enters late): it waits for the op, which completes. */
  r = kt_comm_split(parent, 0, rank, &child);
  CHECK(r == KT_SUCCESS, "split: %s", kt_strerror(r));
  comm = child;
  for (int i = 0; i < 100; i++) one(i, 0);
  if (rank == 0) {
    pause_us(20000);
    one(100, 0);
    CHECK(kt_comm_destroy(child) == KT_SUCCESS, "destroy the second split");
  } else {
    CHECK(pthread_create(&t, NULL, destroyer, child) == 0, "pthread_create");
    one(100, 0);
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
  }
  CHECK(kt_comm_destroy(parent) == KT_SUCCESS, "destroy");
  /* Without membarrier the owner's path stays off: only the locked path ran. */
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (rank == 0)
    printf("owner_test: %d ranks passed%s\n", size,
           cmds >= 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ? "" : " (no membarrier: the owner's path was off)");
  return 0;
}
