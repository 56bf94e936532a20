/* cq_test.c - completion queues: requests on a communicator post their tags
 * when done, in completion order; kt_wait then returns at once with the
 * result; kt_cq_post and the timeout work. Run under `kaitian run -n N`. */
#include "kaitian.h"
#include "rank_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NREQ = 16, N = 100003 };

int main(void) {
  int rank = -1, size = 0;
  kt_comm comm;
  kt_result r = kt_comm_init_env(&comm);
  CHECK(r == KT_SUCCESS, "init: %s", kt_strerror(r));
  kt_comm_rank(comm, &rank);
  kt_comm_size(comm, &size);

  kt_cq cq;
  CHECK(kt_cq_create(&cq) == KT_SUCCESS, "cq_create");
  uint64_t tag;
  r = kt_cq_wait(cq, &tag, 50);
  CHECK(r == KT_ERR_TIMEOUT, "empty queue must time out, got %s", kt_strerror(r));
  CHECK(kt_cq_post(cq, 777) == KT_SUCCESS, "post");
  CHECK(kt_cq_wait(cq, &tag, 1000) == KT_SUCCESS && tag == 777, "posted tag, got %llu", (unsigned long long)tag);

  static float buf[NREQ][N];
  kt_request req[NREQ];
  for (int i = 0; i < NREQ; i++) {
    for (int j = 0; j < N; j++) buf[i][j] = (float)(rank + i + j % 7);
    CHECK(kt_iallreduce(buf[i], buf[i], N, KT_FLOAT32, KT_SUM, comm, &req[i]) == KT_SUCCESS, "iallreduce %d", i);
    CHECK(kt_request_notify(req[i], cq, 1000 + (uint64_t)i) == KT_SUCCESS, "notify %d", i);
  }
  CHECK(kt_request_notify(req[0], cq, 1) == KT_ERR_INVALID_ARGUMENT, "second notify must be refused");
  int seen[NREQ] = {0};
  for (int k = 0; k < NREQ; k++) {
    CHECK(kt_cq_wait(cq, &tag, 60000) == KT_SUCCESS, "wait %d", k);
    CHECK(tag >= 1000 && tag < 1000 + NREQ && !seen[tag - 1000], "unexpected tag %llu", (unsigned long long)tag);
    int i = (int)(tag - 1000);
    /* Ops run in issue order, so completions come in issue order too. */
    CHECK(i == k, "completion %d was request %d", k, i);
    seen[i] = 1;
    int done = 0;
    CHECK(kt_test(req[i], &done) == KT_SUCCESS && done, "request %d not done after its tag", i);
    CHECK(kt_wait(req[i]) == KT_SUCCESS, "wait req %d", i);
    for (int j = 0; j < N; j += 997) {
      float want = (float)(size * (size - 1) / 2 + size * (i + j % 7));
      CHECK(buf[i][j] == want, "req %d elem %d: want %g got %g", i, j, want, buf[i][j]);
    }
  }
  /* A request that completed before it was registered posts at once. */
  kt_request late;
  CHECK(kt_ibarrier(comm, &late) == KT_SUCCESS, "ibarrier");
  int done = 0;
  while (!done) kt_test(late, &done);
  CHECK(kt_request_notify(late, cq, 42) == KT_SUCCESS, "late notify");
  CHECK(kt_cq_wait(cq, &tag, 1000) == KT_SUCCESS && tag == 42, "late tag, got %llu", (unsigned long long)tag);
  CHECK(kt_wait(late) == KT_SUCCESS, "late wait");
  kt_cq_destroy(cq);
  kt_comm_destroy(comm);
  if (rank == 0) printf("cq_test: OK on %d ranks\n", size);
  return 0;
}
