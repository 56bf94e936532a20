/* alltoallv_shm.c - all-to-all(v) through shared memory: per window, every
 * rank copies the window of each block it sends into its region (one slot
 * per destination) and posts; after waiting for all, each rank copies its
 * slot out of every other rank's region. alltoallv first agrees on the
 * largest block (one extra iteration), since each rank only knows its own
 * counts.
 *
 * All ranks on one host. In place (alltoall) through a scratch copy. */
#include "coll.h"

#include "transport/shm.h"

#include <stdint.h>
#include <string.h>

kt_result kt__alltoallv_shm(kt__exec *ex) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  int p = c->size, me = c->rank;
  size_t es = kt_dtype_size(op->dtype);
  bool v = op->coll == KT_COLL_ALLTOALLV;
#define SLEN(i) ((v ? op->counts[i] : op->count) * es)
#define SOFF(i) ((v ? op->displs[i] : (size_t)(i) * op->count) * es)
#define RLEN(i) ((v ? op->counts2[i] : op->count) * es)
#define ROFF(i) ((v ? op->displs2[i] : (size_t)(i) * op->count) * es)
  const char *sb = op->sendbuf;
  char *rb = op->recvbuf;
  kt__shm_op_begin(ex);
  if (SLEN(me) != RLEN(me))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: alltoallv: sends %zu bytes to itself but expects %zu", me,
                   SLEN(me), RLEN(me));
  size_t maxlen = 0;
  for (int i = 0; i < p; i++) maxlen = KT_MAX(maxlen, KT_MAX(SLEN(i), RLEN(i)));
  int par;
  if (v) { /* agree on the largest block over all pairs */
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    kt__shm_set_aux(ex, par, maxlen);
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    for (int r = 0; r < p; r++) {
      uint64_t m = kt__shm_get_aux(ex, r, par);
      if (m > (uint64_t)PTRDIFF_MAX) /* more than any buffer (api.c): a corrupt segment */
        return kt__err(KT_ERR_INTERNAL, "rank %d: alltoallv: rank %d posted %llu bytes as its largest block, more "
                       "than any buffer holds", kt__rank_label(c, me), kt__rank_label(c, r), (unsigned long long)m);
      maxlen = KT_MAX(maxlen, (size_t)m);
    }
  }
  if (maxlen == 0) return KT_SUCCESS;
  if (!v && sb == rb) { /* in place: send from a copy */
    char *copy = kt__scratch(c, (size_t)p * op->count * es);
    if (!copy) return KT_ERR_NO_MEMORY;
    memcpy(copy, sb, (size_t)p * op->count * es);
    sb = copy;
  }
  if (RLEN(me) > 0) memmove(rb + ROFF(me), sb + SOFF(me), RLEN(me));
  size_t mine_out = 0; /* this rank's results; about a p-th of the op's */
  for (int s = 0; s < p; s++) mine_out += RLEN(s);
  bool stream = kt__stream_output_ex(ex, mine_out * (size_t)p);
  size_t win = kt__shm_region_bytes(c) / (size_t)p / 64 * 64;
  if (win == 0) win = kt__shm_region_bytes(c) / (size_t)p;
  size_t n_win = 0;
  for (size_t off = 0; off < maxlen; off += win) {
    /* A wait that finds its peers there does not look at the clock: every
     * 1024 windows this does, so that the op still ends at its deadline when
     * no wait ever has to (a largest block posted that no peer's buffers
     * hold, in a corrupt segment whose steps run ahead). */
    if (++n_win % 1024 == 0 && kt__now_coarse_ns() > ex->deadline_ns)
      return kt__err(KT_ERR_TIMEOUT,
                     "rank %d: op #%llu alltoallv timed out after %lld ms (KAITIAN_TIMEOUT) at byte %zu of the "
                     "largest block's %zu", kt__rank_label(c, me), (unsigned long long)op->seq,
                     (long long)c->timeout_ms, off, maxlen);
    KT_CHECK(kt__shm_iter_begin(ex, &par));
    char *mine = kt__shm_region(c, me, 0, par);
    for (int d = 0; d < p; d++)
      if (d != me && off < SLEN(d)) kt__copy_shared(mine + (size_t)d * win, sb + SOFF(d) + off, KT_MIN(win, SLEN(d) - off));
    uint64_t step = kt__shm_post(ex);
    KT_CHECK(kt__shm_wait(ex, -1, step));
    for (int s = 0; s < p; s++)
      if (s != me && off < RLEN(s))
        kt__copy_out(stream, rb + ROFF(s) + off, kt__shm_region(c, s, 0, par) + (size_t)me * win,
                     KT_MIN(win, RLEN(s) - off));
  }
  if (stream) kt__stream_fence();
#undef SLEN
#undef SOFF
#undef RLEN
#undef ROFF
  return KT_SUCCESS;
}
