/* cma_permit.c - ranks that disagree on the algorithm of a single-copy op
 * that writes into a peer's buffer: rank 1 runs the region broadcast
 * (KAITIAN_ALGO set here, before the library reads it) while rank 0, the
 * root, runs the single-copy one in place, which writes a share of the
 * bytes into every reader's buffer. Rank 1 offered no buffer for writing, so
 * the root must refuse with KT_ERR_MISMATCH naming rank 1 instead of writing
 * at whatever address rank 1 published last (here NULL, from the gather;
 * without the check the root fails with EFAULT instead, and with an older
 * valid address it would write into rank 1's memory there). A gather that
 * both run single copy comes
 * first, so that the ranks' probe of process_vm_readv/writev has passed.
 * 2 ranks under kaitian run; exits 0 when all of that holds. */
#include <kaitian.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT (1u << 18) /* 1 MiB of float32: the root's share is 512 KiB */

int main(void) {
  const char *rank_env = getenv("RANK");
  int me_env = rank_env ? atoi(rank_env) : -1;
  setenv("KAITIAN_ALGO", me_env == 1 ? "gather=shm_cma,broadcast=shm" : "gather=shm_cma,broadcast=shm_cma", 1);
  kt_comm comm;
  if (kt_comm_init_env(&comm) != KT_SUCCESS) {
    fprintf(stderr, "cma_permit: init: %s\n", kt_last_error());
    return 2;
  }
  int me, n;
  kt_comm_rank(comm, &me);
  kt_comm_size(comm, &n);
  if (n != 2) {
    fprintf(stderr, "cma_permit: needs 2 ranks, has %d\n", n);
    return 2;
  }
  float *a = malloc(COUNT * sizeof(float)), *g = malloc(2 * COUNT * sizeof(float));
  for (unsigned i = 0; i < COUNT; i++) a[i] = (float)(me + 1);
  if (kt_gather(a, g, COUNT, KT_FLOAT32, 0, comm) != KT_SUCCESS) {
    fprintf(stderr, "cma_permit: rank %d: gather: %s\n", me, kt_last_error());
    return 1;
  }
  if (me == 0 && (g[0] != 1.0f || g[COUNT] != 2.0f)) {
    fprintf(stderr, "cma_permit: gather wrong: %g %g\n", g[0], g[COUNT]);
    return 1;
  }
  for (unsigned i = 0; i < COUNT; i++) a[i] = me == 0 ? 7.0f : -1.0f;
  kt_result r = kt_broadcast(a, a, COUNT, KT_FLOAT32, 0, comm);
  int status = 0;
  if (me == 0) {
    if (r != KT_ERR_MISMATCH || !strstr(kt_last_error(), "rank 1 does not run the single-copy broadcast")) {
      fprintf(stderr, "FAIL: root: broadcast returned %s (%s), not the refusal\n", kt_strerror(r),
              r == KT_SUCCESS ? "" : kt_last_error());
      status = 1;
    } else {
      printf("root refused: %s\n", kt_last_error());
    }
  } else {
    /* Rank 1's region broadcast has nothing right to read (the root is in
     * another algorithm), so what it returns is not checked here. */
    printf("rank 1: broadcast returned %s\n", kt_strerror(r));
  }
  kt_comm_abort(comm);
  kt_comm_destroy(comm);
  free(a);
  free(g);
  if (!status) printf("PASS rank %d\n", me);
  return status;
}
