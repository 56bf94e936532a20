/* cq.c - completion queues: a FIFO of 64-bit tags one thread can block on
 * while requests on any communicator complete. */
#include "comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct kt_cq_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t *tags; /* ring buffer of cap entries */
  size_t cap, head, count;
};

kt_result kt_cq_create(kt_cq *out) {
  if (!out) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_cq_create: cq is NULL");
  struct kt_cq_s *q = kt__calloc(1, sizeof *q);
  if (!q) return KT_ERR_NO_MEMORY;
  q->cap = 64;
  q->tags = kt__calloc(q->cap, sizeof *q->tags);
  if (!q->tags) {
    free(q);
    return KT_ERR_NO_MEMORY;
  }
  pthread_mutex_init(&q->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&q->cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = q;
  return KT_SUCCESS;
}

void kt_cq_destroy(kt_cq q) {
  if (!q) return;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  free(q->tags);
  free(q);
}

/* Never fails: a full ring doubles. If even that small allocation fails the
 * process aborts, since a lost completion would hang its waiter. */
void kt__cq_push(struct kt_cq_s *q, uint64_t tag) {
  pthread_mutex_lock(&q->mu);
  if (q->count == q->cap) {
    uint64_t *n = malloc(2 * q->cap * sizeof *n);
    if (!n) abort();
    for (size_t i = 0; i < q->count; i++) n[i] = q->tags[(q->head + i) % q->cap];
    free(q->tags);
    q->tags = n;
    q->head = 0;
    q->cap *= 2;
  }
  q->tags[(q->head + q->count) % q->cap] = tag;
  q->count++;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

kt_result kt_cq_post(kt_cq q, uint64_t tag) {
  if (!q) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_cq_post: cq is NULL");
  kt__cq_push(q, tag);
  return KT_SUCCESS;
}

kt_result kt_cq_wait(kt_cq q, uint64_t *tag, int64_t timeout_ms) {
  if (!q || !tag) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_cq_wait: cq or tag is NULL");
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (timeout_ms >= 0) {
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
  }
  pthread_mutex_lock(&q->mu);
  while (q->count == 0) {
    if (timeout_ms < 0) {
      pthread_cond_wait(&q->cv, &q->mu);
    } else if (pthread_cond_timedwait(&q->cv, &q->mu, &until) != 0 && q->count == 0) {
      pthread_mutex_unlock(&q->mu);
      return kt__err(KT_ERR_TIMEOUT, "kt_cq_wait: no completion within %lld ms", (long long)timeout_ms);
    }
  }
  *tag = q->tags[q->head];
  q->head = (q->head + 1) % q->cap;
  q->count--;
  pthread_mutex_unlock(&q->mu);
  return KT_SUCCESS;
}
