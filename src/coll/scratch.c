/* scratch.c - the communicator's scratch buffer for the algorithms: grown
 * on demand, kept for the next op (freed with the communicator). */
#include "coll.h"

#include <stdlib.h>

void *kt__scratch(kt__group *c, size_t n) {
  if (n == 0) n = 1; /* always a valid pointer, even for empty work */
  if (n <= c->scratch_cap) return c->scratch;
  void *p = realloc(c->scratch, n);
  if (!p) {
    kt__err(KT_ERR_NO_MEMORY, "rank %d: cannot allocate %zu bytes of scratch", c->rank, n);
    return NULL;
  }
  c->scratch = p;
  c->scratch_cap = n;
  return p;
}
