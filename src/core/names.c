/* names.c - the names of operations and their signatures, as the messages
 * of every layer print them (base layer: op.h). */
#include "op.h"

#include <stdio.h>

static const char *const coll_names[KT_COLL_COUNT] = {
#define KT_X(name, str) str,
    KT_COLL_LIST(KT_X)
#undef KT_X
};

const char *kt__coll_name(kt__coll c) { return (unsigned)c < KT_COLL_COUNT ? coll_names[c] : "unknown"; }

void kt__op_sig(const kt__op *op, int nranks, kt__sig *g) {
  *g = (kt__sig){.seq = op->seq, .count = op->count, .coll = (uint16_t)op->coll, .dtype = (uint8_t)op->dtype,
                 .op = (uint8_t)op->op, .root = op->root};
  if (op->coll == KT_COLL_ALLGATHERV) { /* sendcounts differ; the total does not */
    g->count = 0;
    for (int r = 0; r < nranks; r++) g->count += op->counts[r];
  }
}

void kt__sig_describe(const kt__sig *g, char *buf, size_t cap) {
  snprintf(buf, cap, "op #%llu %s, count %llu, %s, %s, root %d", (unsigned long long)g->seq,
           g->coll < KT_COLL_COUNT ? kt__coll_name((kt__coll)g->coll) : "?", (unsigned long long)g->count,
           g->dtype < KT_NUM_DTYPES ? kt_dtype_name((kt_dtype)g->dtype) : "?",
           g->op < KT_NUM_OPS ? kt_op_name((kt_op)g->op) : "?", g->root);
}

const char *kt__peer_describe(int shown, const char *host, int pid, char *buf, size_t cap) {
  if (host)
    snprintf(buf, cap, "rank %d (%s pid %d)", shown, host, pid);
  else
    snprintf(buf, cap, "rank %d", shown);
  return buf;
}
