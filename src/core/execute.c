/* execute.c - running one op: coll chooses the algorithm (kt__algo_pick),
 * core runs it with the op's context (kt__exec: deadline, parent) and lends
 * the hierarchical algorithms what they need to run their phases on child
 * communicators (kt__phases), so that coll calls nothing above it. */
#include "comm.h"

#include "coll/coll.h"
#include "transport/transport.h"

static kt_result execute(struct kt_comm_s *c, const kt__op *op, kt__exec *parent);

/* A phase run now on this thread takes the child's next op number. */
static kt_result run_phase(kt__group *child, kt__op *op, kt__exec *parent) {
  struct kt_comm_s *c = kt__comm_of(child);
  op->seq = ++c->issued;
  return execute(c, op, parent);
}
static kt_result issue_phase(kt__group *child, kt__op *op, kt_request *req_out) {
  return kt__issue(kt__comm_of(child), op, req_out);
}
static void stop_child(kt__group *child, kt_result r) { kt__comm_stop(kt__comm_of(child), r); }

static const kt__phases phases = {.run = run_phase,
                                  .issue = issue_phase,
                                  .wait_watching = kt__wait_watching,
                                  .wait = kt__wait_request,
                                  .stop = stop_child};

/* Out of execute's way (its registers): a failed op's error names it. */
static __attribute__((noinline, cold)) kt_result op_failed(struct kt_comm_s *c, const kt__op *op, const char *name,
                                                           kt_result r) {
  kt__stream_fence(); /* an algorithm that failed may have streamed */
  kt__error_prefix("rank %d: %s #%llu (%s, count %zu, %s): ", kt__rank_label(&c->g, c->g.rank), kt__coll_name(op->coll),
                   (unsigned long long)op->seq, name, op->count, kt_dtype_name(op->dtype));
  return r;
}

/* A phase (parent set) keeps its parent's deadline; an op of its own gets
 * the communicator's timeout from now. A phase issued to a child's progress
 * thread (`partial`, no parent: the segments of hier.c) is a phase for the
 * tuner too: KAITIAN_ALGO applies to the calls a program makes. */
static kt_result execute(struct kt_comm_s *c, const kt__op *op, kt__exec *parent) {
  bool phase = parent != NULL || op->partial;
  const kt__algo *a = kt__algo_pick(&c->g, op, phase);
  if (!a) return kt__err(KT_ERR_INTERNAL, "no algorithm for %s", kt__coll_name(op->coll));
  KT_TRACE("rank %d: op #%llu %s count %zu %s -> %s", c->rank, (unsigned long long)op->seq,
           kt__coll_name(op->coll), op->count, kt_dtype_name(op->dtype), a->name);
  /* One clock read per op: the deadline (unless a parent's) and the
   * liveness beat both come from it. */
  int64_t now = kt__now_coarse_ns();
  int64_t deadline_ns = parent ? parent->deadline_ns : now + c->g.timeout_ms * 1000000;
  kt__exec ex = {.group = &c->g, .op = op, .start_ns = now, .deadline_ns = deadline_ns, .parent = parent,
                 .phases = &phases};
  kt__net_op_begin(&ex);
  /* Over shared memory a peer's failure is a flag in the segment, checked
   * by every wait; over TCP look at the peers' sockets (one poll). */
  kt_result r = c->g.shm ? KT_SUCCESS : kt__net_check_peers(&ex);
  if (r == KT_SUCCESS) r = a->fn(&ex);
  return KT_LIKELY(r == KT_SUCCESS) ? r : op_failed(c, op, a->name, r);
}

kt_result kt__execute(struct kt_comm_s *c, const kt__op *op) { return execute(c, op, NULL); }
