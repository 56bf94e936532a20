/* progress.c - issue order and the progress thread.
 *
 * Operations on a communicator execute one at a time, in the order they were
 * issued. A blocking call runs on the caller's thread when nothing is queued or
 * running (no thread hop on the fast path); otherwise, and for every
 * non-blocking call, the op goes to the communicator's FIFO, which one progress
 * thread (started on first use) drains. */
#include "comm.h"

#include "transport/transport.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void op_free_arrays(kt__op *op) {
  if (!op->counts && !op->displs && !op->counts2 && !op->displs2) return; /* most ops: four calls saved */
  free(op->counts);
  free(op->displs);
  free(op->counts2);
  free(op->displs2);
  op->counts = op->displs = op->counts2 = op->displs2 = NULL;
}

/* Run one op on the executing thread; on failure the communicator breaks. */
static kt_result run_op(struct kt_comm_s *c, const kt__op *op) {
  kt_result broken = (kt_result)atomic_load(&c->broken);
  if (broken != KT_SUCCESS) {
    pthread_mutex_lock(&c->mu);
    kt__err(broken, "rank %d: %s not run: the communicator failed earlier: %s", c->g.rank,
            kt__coll_name(op->coll), c->broken_msg);
    pthread_mutex_unlock(&c->mu);
    return broken;
  }
  kt_result r = kt__execute(c, op);
  if (r != KT_SUCCESS) {
    kt__tcp_reset_queues(&c->g);
    kt__comm_fail(c, r);
  }
  return r;
}

/* pthread_cond_wait on c->cv (c->mu held), counted so that the blocking
 * fast path of kt__issue signals only when someone waits. */
static void cv_wait(struct kt_comm_s *c) {
  c->cv_waiters++;
  pthread_cond_wait(&c->cv, &c->mu);
  c->cv_waiters--;
}

static void *progress_main(void *arg) {
  struct kt_comm_s *c = arg;
  kt__log_set_rank(kt__rank_label(&c->g, c->g.rank)); /* a hierarchy child's: the parent's rank */
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while ((!c->qhead || c->busy) && !(c->stopping && !c->qhead)) cv_wait(c);
    if (!c->qhead) break; /* stopping and drained */
    struct kt_request_s *req = c->qhead;
    c->qhead = req->next;
    if (!c->qhead) c->qtail = NULL;
    c->busy = true;
    pthread_mutex_unlock(&c->mu);

    kt__clear_error();
    kt_result r = run_op(c, &req->op);
    if (r != KT_SUCCESS) kt__error_copy(req->errmsg, sizeof req->errmsg);

    pthread_mutex_lock(&c->mu);
    c->busy = false;
    req->result = r;
    /* Setting done is the last touch of req (kt_wait may free it at once);
     * the tag is posted after, so that its receiver finds the request done. */
    struct kt_cq_s *cq = req->cq;
    uint64_t cq_tag = req->cq_tag;
    atomic_store_explicit(&req->done, 1, memory_order_release);
    if (cq) kt__cq_push(cq, cq_tag);
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* The owner's path. A blocking call that finds nothing queued and nothing
 * running runs on its caller's thread, but deciding that under mu costs
 * four locked instructions per op, and each waits for the op's last store
 * to shared memory to reach the peer's cache first (2 ranks, 8 B broadcast:
 * 8-13% of the call). So while only one thread has ever issued on a
 * communicator and only blocking calls, that thread (the owner) checks a
 * flag instead: it marks itself entering (fast_state), orders that before
 * reading fast_ok in the compiler only, and runs the op if fast_ok still
 * holds. Whoever else comes turns the owner's path off for good under mu
 * (fast_disable): it clears fast_ok and calls kt__heavy_fence, after which
 * either it sees the owner entering, running or leaving, or the owner sees
 * fast_ok cleared. An op the owner is running then counts as busy
 * (fast_proxy) until the owner, seeing fast_ok cleared after its op, hands
 * back under mu; an owner leaving is waited for (it may need mu), so that
 * kt_comm_destroy never frees what it still touches. */
enum { FAST_OUT, FAST_ENTERING, FAST_RUNNING, FAST_LEAVING };

static void fast_disable(struct kt_comm_s *c) {
  if (!atomic_load_explicit(&c->fast_ok, memory_order_relaxed)) return;
  atomic_store(&c->fast_ok, 0);
  /* The handshake needs the fence itself, not a lost wake-up's worth: a
   * failure (ENOMEM where the kernel allocates its CPU mask) is retried. */
  while (!kt__heavy_fence()) sched_yield();
  for (;;) {
    int st = atomic_load_explicit(&c->fast_state, memory_order_acquire);
    if (st == FAST_ENTERING) { /* a few instructions */
      sched_yield();
    } else if (st == FAST_LEAVING) { /* it hands back under mu */
      pthread_mutex_unlock(&c->mu);
      sched_yield();
      pthread_mutex_lock(&c->mu);
    } else {
      if (st == FAST_RUNNING) {
        c->busy = true;
        c->fast_proxy = true;
      }
      return;
    }
  }
}

void kt__fast_reset(struct kt_comm_s *c) {
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->fast_ok, 0);
  atomic_store(&c->fast_state, FAST_OUT);
  c->fast_owner_set = false;
  c->fast_proxy = false;
  memset(&c->fast_owner, 0, sizeof c->fast_owner);
  pthread_mutex_unlock(&c->mu);
}

static bool p2p_coll(kt__coll coll) {
  return coll == KT_COLL_SEND || coll == KT_COLL_RECV || coll == KT_COLL_SENDRECV;
}

/* The owner's blocking call; false: not taken (the caller goes through mu). */
static bool fast_issue(struct kt_comm_s *c, kt__op *op, kt_result *res) {
  if (!atomic_load_explicit(&c->fast_ok, memory_order_acquire) || !pthread_equal(c->fast_owner, pthread_self()))
    return false;
  atomic_store_explicit(&c->fast_state, FAST_ENTERING, memory_order_relaxed);
  kt__light_fence();
  if (!atomic_load_explicit(&c->fast_ok, memory_order_relaxed)) {
    atomic_store_explicit(&c->fast_state, FAST_OUT, memory_order_release);
    return false;
  }
  op->seq = p2p_coll(op->coll) ? 0 : ++c->issued;
  atomic_store_explicit(&c->fast_state, FAST_RUNNING, memory_order_release);
  *res = run_op(c, op);
  op_free_arrays(op);
  atomic_store_explicit(&c->fast_state, FAST_LEAVING, memory_order_release);
  kt__light_fence();
  if (atomic_load_explicit(&c->fast_ok, memory_order_relaxed)) {
    atomic_store_explicit(&c->fast_state, FAST_OUT, memory_order_release); /* the last touch of c */
    return true;
  }
  /* Somebody came: hand back. */
  pthread_mutex_lock(&c->mu);
  if (c->fast_proxy) {
    c->fast_proxy = false;
    c->busy = false;
  }
  atomic_store_explicit(&c->fast_state, FAST_OUT, memory_order_release);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return true;
}

/* A blocking op of the library's own on c (the communicator's bootstrap: the
 * link probe's messages, the launcher's creation barrier, split's exchange):
 * issued as the public calls issue theirs, without their checks of the
 * caller's arguments, so that nothing inside the library calls the public
 * API. peer: send/recv's peer, a rooted op's root. */
kt_result kt__run(struct kt_comm_s *c, kt__coll coll, const void *sendbuf, void *recvbuf, size_t count,
                  kt_dtype dtype, int peer) {
  kt__clear_error();
  kt__op o = {.coll = coll, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dtype = dtype, .root = peer};
  return kt__issue(c, &o, NULL);
}

/* Hand op to the communicator. req_out NULL: blocking (returns the op's
 * result); otherwise a request is returned. Takes ownership of op's arrays. */
kt_result kt__issue(struct kt_comm_s *c, kt__op *op, kt_request *req_out) {
  kt_result fr;
  if (!req_out && fast_issue(c, op, &fr)) return fr;
  pthread_mutex_lock(&c->mu);
  /* Anybody but the owner's blocking calls ends the owner's path. */
  if (req_out || !pthread_equal(c->fast_owner, pthread_self())) fast_disable(c);
  if (c->stopping) {
    pthread_mutex_unlock(&c->mu);
    op_free_arrays(op);
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: %s issued on a communicator being destroyed",
                   c->g.rank, kt__coll_name(op->coll));
  }
  /* Collectives are numbered so that every rank can check it is in the same
   * one; point-to-point ops are not (ranks issue different numbers of them). */
  op->seq = p2p_coll(op->coll) ? 0 : ++c->issued;
  if (!req_out && !c->qhead && !c->busy) {
    c->busy = true;
    pthread_mutex_unlock(&c->mu);
    kt_result r = run_op(c, op);
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    if (c->cv_waiters) pthread_cond_broadcast(&c->cv);
    /* The first blocking call, with nothing else ever issued: its thread
     * becomes the owner (where the heavy fence exists). */
    if (!c->fast_owner_set && !c->thread_started && !c->qhead && !c->stopping && kt__heavy_fence_ok()) {
      c->fast_owner_set = true;
      c->fast_owner = pthread_self();
      atomic_store_explicit(&c->fast_ok, 1, memory_order_release);
    }
    pthread_mutex_unlock(&c->mu);
    op_free_arrays(op);
    return r;
  }
  struct kt_request_s *req = calloc(1, sizeof *req);
  if (!req) {
    pthread_mutex_unlock(&c->mu);
    op_free_arrays(op);
    return kt__err(KT_ERR_NO_MEMORY, "rank %d: cannot allocate a request", c->g.rank);
  }
  req->op = *op;
  req->comm = c;
  if (c->qtail) c->qtail->next = req; else c->qhead = req;
  c->qtail = req;
  if (!c->thread_started) {
    int e = pthread_create(&c->thread, NULL, progress_main, c);
    if (e != 0) {
      /* Undo: nothing was issued. */
      c->qhead = c->qtail = NULL; /* only possible when the queue was empty */
      pthread_mutex_unlock(&c->mu);
      op_free_arrays(&req->op);
      free(req);
      return kt__err(KT_ERR_SYSTEM, "rank %d: cannot start the progress thread: %s", c->g.rank,
                     strerror(e));
    }
    c->thread_started = true;
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (!req_out) return kt__wait_request(req);
  *req_out = req;
  return KT_SUCCESS;
}

kt_result kt_wait(kt_request req) {
  if (!req) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_wait: request is NULL");
  return kt__wait_request(req);
}

kt_result kt__wait_request(kt_request req) {
  struct kt_comm_s *c = req->comm;
  if (!atomic_load_explicit(&req->done, memory_order_acquire)) {
    pthread_mutex_lock(&c->mu);
    while (!atomic_load_explicit(&req->done, memory_order_acquire)) cv_wait(c);
    pthread_mutex_unlock(&c->mu);
  }
  kt_result r = req->result;
  if (r != KT_SUCCESS) kt__error_set_text(req->errmsg);
  else kt__clear_error();
  op_free_arrays(&req->op);
  free(req);
  return r;
}

#define WATCH_SLICE_NS 5000000 /* a watching wait looks at the parent's peers this often */

kt_result kt__wait_watching(kt_request req, kt__exec *ex, const char *what, bool *consumed) {
  struct kt_comm_s *c = req->comm;
  *consumed = false;
  pthread_mutex_lock(&c->mu);
  while (!atomic_load_explicit(&req->done, memory_order_acquire)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WATCH_SLICE_NS;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    c->cv_waiters++;
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    c->cv_waiters--;
    if (atomic_load_explicit(&req->done, memory_order_acquire)) break;
    pthread_mutex_unlock(&c->mu);
    kt_result r = kt__net_check_peers(ex);
    if (r == KT_SUCCESS) r = kt__net_stuck(ex);
    /* The child's op has a deadline of its own, from its later start. */
    if (r == KT_SUCCESS && kt__now_ns() >= ex->deadline_ns) r = kt__net_timeout(ex, what, NULL);
    if (r != KT_SUCCESS) return r;
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  *consumed = true;
  return kt_wait(req);
}

kt_result kt_test(kt_request req, int *done) {
  if (!req) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank ?: kt_test: request is NULL");
  if (!done) return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_test: done is NULL", req->comm->g.rank);
  *done = atomic_load_explicit(&req->done, memory_order_acquire);
  return KT_SUCCESS;
}

void kt__progress_stop(struct kt_comm_s *c) {
  pthread_mutex_lock(&c->mu);
  fast_disable(c);
  c->stopping = true;
  pthread_cond_broadcast(&c->cv);
  while (c->qhead || c->busy) cv_wait(c);
  bool started = c->thread_started;
  pthread_mutex_unlock(&c->mu);
  if (started) pthread_join(c->thread, NULL);
}

kt_result kt_request_notify(kt_request req, kt_cq cq, uint64_t tag) {
  if (!req || !cq) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_request_notify: request or queue is NULL");
  struct kt_comm_s *c = req->comm;
  pthread_mutex_lock(&c->mu);
  if (req->cq) {
    pthread_mutex_unlock(&c->mu);
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: kt_request_notify: request already has a queue", c->g.rank);
  }
  req->cq = cq;
  req->cq_tag = tag;
  if (atomic_load_explicit(&req->done, memory_order_acquire)) kt__cq_push(cq, tag);
  pthread_mutex_unlock(&c->mu);
  return KT_SUCCESS;
}
