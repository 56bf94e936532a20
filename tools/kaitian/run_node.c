/* run_node.c - `kaitian run` across nodes: the launchers of one job meet in
 * the rendezvous store to check their arguments agree, to spread the first
 * failure to every node, and to let node 0 keep the store up until all are done. */
#include "tool.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The launcher checks between slices of long waits so that Ctrl-C works
 * while it waits for the other nodes (or for the device discovery). */
int kt__run_pending_stop_signal(void) {
  sigset_t set;
  if (sigpending(&set) != 0) return 0;
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    if (sigismember(&set, sigs[i]) == 1) return sigs[i];
  return 0;
}

/* Wait slices: a timeout is retried until the total deadline passes. */
#define SLICE_MS 500

static kt_result interrupted(kt_run_node *n, const char *what) {
  char tmp[16];
  n->interrupted_by = kt__run_pending_stop_signal();
  return kt__err(KT_ERR_ABORTED, "interrupted by %s while %s",
                 kt__run_signame(n->interrupted_by, tmp, sizeof tmp), what);
}

/* While waiting for the others to join: a node that could not join (or
 * failed otherwise) posted its failure line; stop with it. */
static bool another_failed(kt_run_node *n, kt_result *res) {
  char line[1400], host[256];
  int status = 0, node = -1;
  if (kt__run_node_poll_failure(n, line, sizeof line, &status, &node, host, sizeof host) != 1) return false;
  const char *text = strncmp(line, "kaitian run: ", 13) == 0 ? line + 13 : line;
  *res = kt__err(KT_ERR_ABORTED, "node %d: the job failed before every node joined: %s", n->node_rank, text);
  return true;
}

/* Wait (in slices, until deadline) for key and read it into buf as a
 * string. Ends early on SIGINT/SIGTERM/SIGHUP and when another node posted
 * a failure (it may be the one that will never write key). */
static kt_result wait_key(kt_run_node *n, const char *key, char *buf, size_t cap, int64_t deadline,
                          const char *what) {
  size_t len = 0;
  kt_result res;
  for (;;) {
    res = kt_store_get(n->store, key, buf, cap - 1, &len, SLICE_MS);
    if (res != KT_ERR_TIMEOUT || kt__now_ms() >= deadline) break;
    if (kt__run_pending_stop_signal()) return interrupted(n, what);
    if (another_failed(n, &res)) return res;
  }
  if (res == KT_SUCCESS) buf[len] = '\0';
  return res;
}

kt_result kt__run_node_join(kt_run_node *n, const char *host, int port, const char *secret) {
  kt_result res;
  char key[64], val[32];
  int64_t count = 0;
  if (gethostname(n->host, sizeof n->host) != 0) snprintf(n->host, sizeof n->host, "?");
  n->host[sizeof n->host - 1] = '\0';
  int64_t timeout = kt__param_CONNECT_TIMEOUT();
  int64_t deadline = kt__now_ms() + timeout;
  for (;;) {
    res = kt_store_tcp_connect(host, port, secret, SLICE_MS, &n->store);
    if (res != KT_ERR_TIMEOUT || kt__now_ms() >= deadline) break;
    if (kt__run_pending_stop_signal()) return interrupted(n, "connecting to the rendezvous store");
  }
  if (res != KT_SUCCESS) {
    kt__error_prefix("node %d cannot reach the rendezvous store of node 0 at %s:%d within "
                     "%lld ms (KAITIAN_CONNECT_TIMEOUT; is node 0's launcher running with "
                     "the same --master and KAITIAN_JOB_SECRET?): ",
                     n->node_rank, host, port, (long long)timeout);
    n->store = NULL;
    return res;
  }
  snprintf(key, sizeof key, KT_RUN_KEY_NODE "%d", n->node_rank);
  KT_CHECK_GOTO(kt_store_add(n->store, key, 1, &count), res, fail);
  if (count != 1) {
    res = kt__err(KT_ERR_INVALID_ARGUMENT,
                  "another launcher already joined this job as --node-rank %d; every node "
                  "needs its own node rank in 0..%d",
                  n->node_rank, n->nnodes - 1);
    goto fail;
  }
  snprintf(key, sizeof key, KT_RUN_KEY_HOST "%d", n->node_rank);
  KT_CHECK_GOTO(kt_store_set(n->store, key, n->host, strlen(n->host)), res, fail);
  /* Liveness: node 0 watches, before any node can count on it (it
   * publishes its heartbeat port before --nnodes, which every node waits
   * for); the others connect to it before they say they joined. */
  if (n->node_rank == 0 && n->nnodes > 1) {
    int lport = 0;
    char token[2 * KT_RUN_LIVE_TOKEN + 1], live[64];
    KT_CHECK_GOTO(kt__run_live_watch(n->live_bind ? n->live_bind : host, n->nnodes, n->lost_ms, &n->live, &lport,
                                     token), res, fail);
    snprintf(live, sizeof live, "%d %s", lport, token);
    KT_CHECK_GOTO(kt_store_set(n->store, KT_RUN_KEY_LIVE, live, strlen(live)), res, fail);
  }
  /* Node 0 says how many nodes there are; every node says how many ranks it
   * runs (-n may differ between nodes) and, once all have, numbers its
   * ranks after those of the nodes before it. */
  snprintf(val, sizeof val, "%d", n->nnodes);
  if (n->node_rank == 0) {
    KT_CHECK_GOTO(kt_store_set(n->store, KT_RUN_KEY_NNODES, val, strlen(val)), res, fail);
  } else {
    char got[32];
    res = wait_key(n, KT_RUN_KEY_NNODES, got, sizeof got, deadline, "waiting for node 0 to join");
    if (res == KT_ERR_TIMEOUT)
      kt__error_prefix("node %d: node 0 did not join within %lld ms: ", n->node_rank, (long long)timeout);
    if (res != KT_SUCCESS) goto fail;
    if (strcmp(got, val) != 0) {
      res = kt__err(KT_ERR_INVALID_ARGUMENT,
                    "node 0 runs with --nnodes %s but node %d with --nnodes %d; every node must use the "
                    "same value",
                    got, n->node_rank, n->nnodes);
      goto fail;
    }
    char live[96];
    KT_CHECK_GOTO(wait_key(n, KT_RUN_KEY_LIVE, live, sizeof live, deadline, "waiting for node 0's heartbeat port"),
                  res, fail);
    int64_t left = KT_MAX(deadline - kt__now_ms(), (int64_t)1000);
    KT_CHECK_GOTO(kt__run_live_beat(host, live, n->node_rank, left, &n->live), res, fail);
  }
  snprintf(key, sizeof key, KT_RUN_KEY_NPROC "%d", n->node_rank);
  snprintf(val, sizeof val, "%d", n->nproc);
  KT_CHECK_GOTO(kt_store_set(n->store, key, val, strlen(val)), res, fail);
  n->rank_base = 0;
  n->world = 0;
  for (int j = 0; j < n->nnodes; j++) {
    char got[32];
    snprintf(key, sizeof key, KT_RUN_KEY_NPROC "%d", j);
    res = wait_key(n, key, got, sizeof got, deadline, "waiting for the other nodes to join");
    if (res == KT_ERR_TIMEOUT)
      kt__error_prefix("node %d: node %d did not join within %lld ms (KAITIAN_CONNECT_TIMEOUT; is its "
                       "launcher running, with --node-rank %d?): ",
                       n->node_rank, j, (long long)timeout, j);
    if (res != KT_SUCCESS) goto fail;
    int np = 0;
    if (!kt__run_parse_nproc(got, n->world, &np)) {
      res = kt__err(KT_ERR_INVALID_ARGUMENT, "node %d published -n %s: not a rank count this job can use",
                    j, got);
      goto fail;
    }
    if (j < n->node_rank) n->rank_base += np;
    n->world += np;
  }
  return KT_SUCCESS;
fail:
  /* Tell the nodes already running, so node 0 does not wait for us. */
  {
    char msg[1024], line[1400];
    kt__error_copy(msg, sizeof msg);
    snprintf(line, sizeof line, "kaitian run: node %d (%s) could not join the job: %s",
             n->node_rank, n->host, msg);
    kt__run_node_post_failure(n, line, n->interrupted_by ? 128 + n->interrupted_by : 1);
    kt__run_node_done(n); /* this node will run nothing: node 0 need not wait for it */
    /* Node 0's store carries the reason to the nodes still waiting (with 3
     * or more nodes, some may not have looked yet): keep it up until every
     * node has counted itself done, or a few of their polling slices. */
    if (n->node_rank == 0 && !n->interrupted_by) {
      int64_t until = kt__now_ms() + 6 * SLICE_MS;
      while (kt__now_ms() < until && !kt__run_pending_stop_signal()) {
        int64_t done = kt__run_node_done_count(n);
        if (done < 0 || done >= n->nnodes) break;
        usleep(50 * 1000);
      }
    }
    kt__error_set_text(msg);
  }
  kt_store_free(n->store);
  n->store = NULL;
  kt__run_live_stop(n->live);
  n->live = NULL;
  return res;
}

void kt__run_node_post_failure(kt_run_node *n, const char *line, int status) {
  kt__run_node_post_failure_of(n, n->node_rank, n->host, line, status);
}

void kt__run_node_post_failure_of(kt_run_node *n, int node, const char *host, const char *line, int status) {
  if (!n->store) return;
  int64_t count = 0;
  char info[320];
  if (kt_store_add(n->store, KT_RUN_KEY_FAILURES, 1, &count) != KT_SUCCESS) goto warn;
  if (count != 1) return; /* another node's failure came first and is posted */
  snprintf(info, sizeof info, "%d %d %s", node, status, host);
  /* info first: whoever sees the line key finds the info key in place. */
  if (kt_store_set(n->store, KT_RUN_KEY_FAILED_INFO, info, strlen(info)) != KT_SUCCESS ||
      kt_store_set(n->store, KT_RUN_KEY_FAILED, line, strlen(line)) != KT_SUCCESS)
    goto warn;
  n->posted = true;
  return;
warn:
  kt__run_say(2, "kaitian run: warning: could not tell the other nodes about the failure: %s",
              kt_last_error());
}

int kt__run_node_poll_failure(kt_run_node *n, char *line, size_t cap, int *status, int *node,
                              char *host, size_t hostcap) {
  if (!n->store || n->posted) return 0;
  const char *keys[] = {KT_RUN_KEY_FAILED};
  int ready = 0;
  if (kt_store_check(n->store, keys, 1, &ready) != KT_SUCCESS) return -1;
  if (!ready) return 0;
  size_t len = 0;
  char info[320];
  if (kt_store_get(n->store, KT_RUN_KEY_FAILED, line, cap - 1, &len, 5000) != KT_SUCCESS)
    return -1;
  line[len] = '\0';
  *status = 1;
  *node = -1;
  snprintf(host, hostcap, "?");
  if (kt_store_get(n->store, KT_RUN_KEY_FAILED_INFO, info, sizeof info - 1, &len, 5000) ==
      KT_SUCCESS) {
    info[len] = '\0';
    kt__run_parse_failed_info(info, node, status, host, hostcap);
  }
  return 1;
}

bool kt__run_parse_nproc(const char *text, int world, int *np) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < 1 || v > KT_RUN_MAX_NPROC || (int64_t)world + v > (1 << 30)) return false;
  *np = (int)v;
  return true;
}

void kt__run_parse_failed_info(const char *info, int *node, int *status, char *host, size_t hostcap) {
  int off = 0, nd = -1, st = 1;
  if (sscanf(info, "%d %d %n", &nd, &st, &off) == 2 && off > 0) {
    snprintf(host, hostcap, "%s", info + off);
    *node = nd >= 0 ? nd : -1;
    *status = st;
  }
  if (*status <= 0 || *status > 255) *status = 1;
}

int kt__run_node_find_lost(kt_run_node *n, int *node, char *host, size_t hostcap, char *why, size_t whycap) {
  if (!n->store || !n->live) return 0;
  int j = -1, ev;
  while ((ev = kt__run_live_event(n->live, &j, why, whycap)) != 0) {
    char key[64];
    size_t len = 0;
    snprintf(key, sizeof key, KT_RUN_KEY_HOST "%d", j);
    if (kt_store_get(n->store, key, host, hostcap - 1, &len, 100) == KT_SUCCESS) host[len] = '\0';
    else snprintf(host, hostcap, "?");
    if (ev == 2) {
      kt__run_say(2, "kaitian run: node %d (host %s): %s", j, host, why);
      continue;
    }
    /* Done in the store (it said so there, its DONE was lost): no loss. */
    int64_t done = 0;
    snprintf(key, sizeof key, KT_RUN_KEY_NODE_DONE "%d", j);
    if (kt_store_add(n->store, key, 0, &done) == KT_SUCCESS && done) continue;
    *node = j;
    return 1;
  }
  return 0;
}

void kt__run_node_done(kt_run_node *n) {
  if (!n->store) return;
  int64_t count;
  char key[64];
  snprintf(key, sizeof key, KT_RUN_KEY_NODE_DONE "%d", n->node_rank);
  kt_store_add(n->store, key, 1, &count); /* before the total: node 0 waits for that */
  kt__run_live_done(n->live);             /* its connection closing is no loss now */
  if (kt_store_add(n->store, KT_RUN_KEY_DONE, 1, &count) != KT_SUCCESS && n->node_rank != 0)
    kt__run_say(2, "kaitian run: warning: node %d could not report to the store that it is "
                   "done (node 0 gone?): %s", n->node_rank, kt_last_error());
}

int64_t kt__run_node_done_count(kt_run_node *n) {
  int64_t count = -1;
  if (!n->store || kt_store_add(n->store, KT_RUN_KEY_DONE, 0, &count) != KT_SUCCESS) return -1;
  return count;
}

void kt__run_node_leave(kt_run_node *n) {
  if (n->live && n->node_rank == 0) {
    /* What the heartbeats looked like: at INFO, or whenever one came late
     * by a quarter of the limit or a stranger knocked. */
    uint64_t gaps;
    int64_t max, p99;
    int max_node, refused;
    kt__run_live_gaps(n->live, &gaps, &max, &p99, &max_node, &refused);
    if (kt__run_info_on() || max >= n->lost_ms / 4 || refused)
      kt__run_say(2, "kaitian run: heartbeats of the other %d nodes: %llu gaps, longest %lld ms (node %d), 99th "
                     "percentile %lld ms (KAITIAN_RUN_LOST_MS=%lld); %d connections refused",
                  n->nnodes - 1, (unsigned long long)gaps, (long long)max, max_node, (long long)p99,
                  (long long)n->lost_ms, refused);
  }
  kt__run_live_stop(n->live);
  n->live = NULL;
  if (n->store) kt_store_free(n->store);
  n->store = NULL;
}
