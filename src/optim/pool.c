/* pool.c - the threads an optimizer step is split across: started on first
 * need, kept for later calls, one job at a time (a second caller meanwhile
 * runs its job alone on its own thread rather than waiting). */
#include "adam_impl.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#define MAX_WORKERS 255

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* held for a whole job */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   /* guards the fields below */
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int nworkers;          /* started and alive */
static uint64_t generation;   /* bumped for every job */
static kt__optim_task_fn job_fn;
static void *job_arg;
static int job_parts;         /* parts of the current job, part 0 the caller's */
static int job_pending;       /* worker parts not finished yet */
static uint64_t start_gen[MAX_WORKERS]; /* generation when worker w started */

/* Worker w runs part w + 1 of every job that has that many parts. */
static void *worker_main(void *argp) {
  int w = (int)(intptr_t)argp;
  pthread_mutex_lock(&mu);
  uint64_t seen = start_gen[w]; /* not generation: the job it was started for may be posted */
  for (;;) {
    while (generation == seen) pthread_cond_wait(&work_cv, &mu);
    seen = generation;
    if (w + 1 >= job_parts) continue;
    kt__optim_task_fn fn = job_fn;
    void *arg = job_arg;
    int parts = job_parts;
    pthread_mutex_unlock(&mu);
    fn(arg, w + 1, parts);
    pthread_mutex_lock(&mu);
    if (--job_pending == 0) pthread_cond_signal(&done_cv);
  }
  return NULL;
}

/* fork: no job may be under way while the address space is copied, and the
 * child has none of the workers (they are started again on need). */
static void before_fork(void) {
  pthread_mutex_lock(&busy);
  pthread_mutex_lock(&mu);
}
static void after_fork_parent(void) {
  pthread_mutex_unlock(&mu);
  pthread_mutex_unlock(&busy);
}
static void after_fork_child(void) {
  nworkers = 0;
  pthread_mutex_unlock(&mu);
  pthread_mutex_unlock(&busy);
}
static void register_atfork(void) {
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Start workers until there are want (called with mu held, so a new worker
 * sees the current generation as done). Workers block every signal: signals
 * go to the application's threads. Returns how many there are. */
static int grow(int want) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  while (nworkers < want) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    start_gen[nworkers] = generation;
    int e = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)nworkers);
    pthread_attr_destroy(&attr);
    if (e != 0) {
      KT_INFO("optimizer threads: cannot start thread %d (error %d); using %d", nworkers + 1, e,
              nworkers + 1);
      break;
    }
    nworkers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return nworkers;
}

void kt__optim_parallel(kt__optim_task_fn fn, void *arg, int nparts) {
  if (nparts > MAX_WORKERS + 1) nparts = MAX_WORKERS + 1;
  if (nparts <= 1 || pthread_mutex_trylock(&busy) != 0) {
    fn(arg, 0, 1);
    return;
  }
  pthread_once(&atfork_once, register_atfork);
  pthread_mutex_lock(&mu);
  int have = grow(nparts - 1);
  if (have + 1 < nparts) nparts = have + 1;
  if (nparts > 1) {
    job_fn = fn;
    job_arg = arg;
    job_parts = nparts;
    job_pending = nparts - 1;
    generation++;
    pthread_cond_broadcast(&work_cv);
  }
  pthread_mutex_unlock(&mu);
  fn(arg, 0, nparts);
  pthread_mutex_lock(&mu);
  while (job_pending > 0) pthread_cond_wait(&done_cv, &mu);
  pthread_mutex_unlock(&mu);
  pthread_mutex_unlock(&busy);
}

int kt__optim_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}
