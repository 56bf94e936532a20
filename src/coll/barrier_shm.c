/* barrier_shm.c - barrier through shared memory: every rank posts once and
 * waits until all have. Cost: one post and one wait. */
#include "coll.h"

#include "transport/shm.h"

kt_result kt__barrier_shm(kt__exec *ex) {
  kt__shm_op_begin(ex);
  int par;
  KT_CHECK(kt__shm_iter_begin(ex, &par));
  uint64_t step = kt__shm_post(ex);
  return kt__shm_wait(ex, -1, step);
}
