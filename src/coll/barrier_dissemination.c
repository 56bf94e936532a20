/* barrier_dissemination.c - dissemination barrier: in round k each rank
 * signals rank + 2^k and waits for rank - 2^k; after ceil(log2 p) rounds
 * everyone has heard, directly or not, from everyone.
 *
 * Any number of ranks. Messages carry no payload.
 * Cost: ceil(log2 p) alpha. */
#include "coll.h"

kt_result kt__barrier_dissemination(kt__exec *ex) {
  kt__group *c = ex->group;
  int p = c->size, r = c->rank;
  uint32_t round = 0;
  for (int d = 1; d < p; d <<= 1, round++)
    KT_CHECK(kt__net_sendrecv(ex, (r + d) % p, NULL, 0, kt__mod(r - d, p), NULL, 0, round));
  return KT_SUCCESS;
}
