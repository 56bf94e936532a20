/* badargs_test.c - every public collective, communicator and kt_mem_* function given
 * bad input returns the right code with a message naming the rank and the
 * problem, has no side effect and leaves the ranks in step; NULL buffers with
 * count 0 are accepted. Run as `kaitian run -n 2 badargs_test`. Every rank
 * makes the same bad calls, so an argument check that talks to peers before
 * failing shows up as a hang (turned into an error by KAITIAN_TIMEOUT). */
#include "kaitian.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int rank_, size_, fails, checks;
static kt_comm comm;

#define E_INVAL KT_ERR_INVALID_ARGUMENT
#define BADDT ((kt_dtype)99)
#define BADOP ((kt_op)99)

/* Case-insensitive: does msg contain one of the '|'-separated words? */
static bool contains_any(const char *msg, const char *words) {
  char w[64];
  while (*words) {
    size_t n = strcspn(words, "|");
    snprintf(w, sizeof w, "%.*s", (int)n, words);
    for (const char *p = msg; *p; p++) {
      size_t i = 0;
      while (w[i] && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)w[i])) i++;
      if (!w[i]) return true;
    }
    words += n + (words[n] == '|');
  }
  return false;
}

/* got must equal want, with a message that names the rank (unless
 * need_rank is false: nothing knows the rank of a NULL communicator) and
 * contains one of the words of kw. */
static void expect(const char *expr, int line, kt_result got, kt_result want, bool need_rank,
                   const char *kw) {
  const char *msg = kt_last_error();
  checks++;
  if (got != want) {
    fprintf(stderr, "FAIL rank %d line %d: %s returned %s, expected %s (last error: \"%s\")\n",
            rank_, line, expr, kt_strerror(got), kt_strerror(want), msg ? msg : "(null)");
    fails++;
    return;
  }
  if (want == KT_SUCCESS) return;
  if (!msg || !*msg) {
    fprintf(stderr, "FAIL rank %d line %d: %s: kt_last_error() is empty\n", rank_, line, expr);
    fails++;
  } else if (need_rank && !contains_any(msg, "rank")) {
    fprintf(stderr, "FAIL rank %d line %d: %s: message does not name the rank: \"%s\"\n", rank_,
            line, expr, msg);
    fails++;
  } else if (kw && !contains_any(msg, kw)) {
    fprintf(stderr, "FAIL rank %d line %d: %s: message does not name the problem (%s): \"%s\"\n",
            rank_, line, expr, kw, msg);
    fails++;
  }
}

#define BAD(kw, call) expect(#call, __LINE__, (call), E_INVAL, true, kw)
#define BAD_NOCOMM(call) expect(#call, __LINE__, (call), E_INVAL, false, "comm")
#define OK(call) expect(#call, __LINE__, (call), KT_SUCCESS, false, NULL)

#define KW_BUF "buf|null"
#define KW_SIZE "overflow|too large|too big|count|size|bytes"
#define KW_DTYPE "dtype|type"
#define KW_OP "op"
#define KW_ROOT "root"
#define KW_PEER "peer|dst|src|dest|source"
#define KW_TAG "tag"
#define KW_REQ "req"
#define KW_COUNTS "count|displ|null"

/* A real allreduce checked element by element: proves that no bad call left
 * a peer out of step or corrupted. */
static void sync_check(const char *after) {
  enum { N = 1031 };
  static int32_t in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (rank_ + 1) * (i + 1), out[i] = -7;
  kt_result rc = kt_allreduce(in, out, N, KT_INT32, KT_SUM, comm);
  checks++;
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: allreduce after %s returned %s: %s\n", rank_, after,
            kt_strerror(rc), kt_last_error());
    exit(1);
  }
  int32_t ranksum = size_ * (size_ + 1) / 2;
  for (int i = 0; i < N; i++) {
    if (out[i] != ranksum * (i + 1)) {
      fprintf(stderr, "FAIL rank %d: allreduce after %s: index %d expected %d got %d\n", rank_,
              after, i, ranksum * (i + 1), out[i]);
      fails++;
      break;
    }
  }
  rc = kt_comm_get_error(comm);
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: communicator broken after %s: %s: %s\n", rank_, after,
            kt_strerror(rc), kt_last_error());
    fails++;
  }
}

static void test_strerror(void) {
  static const kt_result codes[] = {
#define KT_X_CODE(name, value, msg) name,
      KT_RESULT_LIST(KT_X_CODE)
#undef KT_X_CODE
  };
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    const char *s = kt_strerror(codes[i]);
    checks++;
    if (!s || !*s) {
      fprintf(stderr, "FAIL kt_strerror(%d) is empty\n", (int)codes[i]);
      fails++;
      continue;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(s, kt_strerror(codes[j])) == 0) {
        fprintf(stderr, "FAIL kt_strerror(%d) == kt_strerror(%d): \"%s\"\n", (int)codes[i],
                (int)codes[j], s);
        fails++;
      }
  }
  const char *u = kt_strerror((kt_result)1234), *v = kt_strerror((kt_result)-1);
  checks++;
  if (!u || !v) {
    fprintf(stderr, "FAIL kt_strerror of an unknown code returned NULL\n");
    fails++;
  }
  checks++;
  if (kt_dtype_size(BADDT) != 0 || !kt_dtype_name(BADDT) || !kt_op_name(BADOP)) {
    fprintf(stderr, "FAIL unknown dtype/op: kt_dtype_size must be 0 and the names non-NULL\n");
    fails++;
  }
}

/* A store whose every operation fails: kt_comm_init must reject bad
 * arguments before it touches the store. */
static kt_result dead_set(void *c, const char *k, const void *v, size_t l) {
  (void)c, (void)k, (void)v, (void)l;
  return KT_ERR_STORE;
}
static kt_result dead_get(void *c, const char *k, void *b, size_t cap, size_t *l, int64_t t) {
  (void)c, (void)k, (void)b, (void)cap, (void)l, (void)t;
  return KT_ERR_STORE;
}
static kt_result dead_add(void *c, const char *k, int64_t d, int64_t *r) {
  (void)c, (void)k, (void)d, (void)r;
  return KT_ERR_STORE;
}
static kt_result dead_wait(void *c, const char *const *k, size_t n, int64_t t) {
  (void)c, (void)k, (void)n, (void)t;
  return KT_ERR_STORE;
}
static kt_result dead_check(void *c, const char *const *k, size_t n, int *r) {
  (void)c, (void)k, (void)n, (void)r;
  return KT_ERR_STORE;
}
static kt_result dead_del(void *c, const char *k) {
  (void)c, (void)k;
  return KT_ERR_STORE;
}

static void test_null_comm(void *sb, void *rb) {
  kt_request q = NULL;
  kt_comm out = NULL;
  int x = 0, done = 0;
  size_t cnt[64] = {0}, dsp[64] = {0};
  cnt[0] = 4;
  BAD_NOCOMM(kt_allreduce(sb, rb, 4, KT_INT32, KT_SUM, NULL));
  BAD_NOCOMM(kt_iallreduce(sb, rb, 4, KT_INT32, KT_SUM, NULL, &q));
  BAD_NOCOMM(kt_broadcast(sb, rb, 4, KT_INT32, 0, NULL));
  BAD_NOCOMM(kt_ibroadcast(sb, rb, 4, KT_INT32, 0, NULL, &q));
  BAD_NOCOMM(kt_reduce(sb, rb, 4, KT_INT32, KT_SUM, 0, NULL));
  BAD_NOCOMM(kt_ireduce(sb, rb, 4, KT_INT32, KT_SUM, 0, NULL, &q));
  BAD_NOCOMM(kt_allgather(sb, rb, 4, KT_INT32, NULL));
  BAD_NOCOMM(kt_iallgather(sb, rb, 4, KT_INT32, NULL, &q));
  BAD_NOCOMM(kt_allgatherv(sb, 4, rb, cnt, dsp, KT_INT32, NULL));
  BAD_NOCOMM(kt_iallgatherv(sb, 4, rb, cnt, dsp, KT_INT32, NULL, &q));
  BAD_NOCOMM(kt_reduce_scatter(sb, rb, 4, KT_INT32, KT_SUM, NULL));
  BAD_NOCOMM(kt_ireduce_scatter(sb, rb, 4, KT_INT32, KT_SUM, NULL, &q));
  BAD_NOCOMM(kt_reduce_scatterv(sb, rb, cnt, KT_INT32, KT_SUM, NULL));
  BAD_NOCOMM(kt_ireduce_scatterv(sb, rb, cnt, KT_INT32, KT_SUM, NULL, &q));
  BAD_NOCOMM(kt_gather(sb, rb, 4, KT_INT32, 0, NULL));
  BAD_NOCOMM(kt_igather(sb, rb, 4, KT_INT32, 0, NULL, &q));
  BAD_NOCOMM(kt_scatter(sb, rb, 4, KT_INT32, 0, NULL));
  BAD_NOCOMM(kt_iscatter(sb, rb, 4, KT_INT32, 0, NULL, &q));
  BAD_NOCOMM(kt_alltoall(sb, rb, 4, KT_INT32, NULL));
  BAD_NOCOMM(kt_ialltoall(sb, rb, 4, KT_INT32, NULL, &q));
  BAD_NOCOMM(kt_alltoallv(sb, cnt, dsp, rb, cnt, dsp, KT_INT32, NULL));
  BAD_NOCOMM(kt_ialltoallv(sb, cnt, dsp, rb, cnt, dsp, KT_INT32, NULL, &q));
  BAD_NOCOMM(kt_barrier(NULL));
  BAD_NOCOMM(kt_ibarrier(NULL, &q));
  BAD_NOCOMM(kt_send(sb, 4, KT_INT32, 0, 0, NULL));
  BAD_NOCOMM(kt_isend(sb, 4, KT_INT32, 0, 0, NULL, &q));
  BAD_NOCOMM(kt_recv(rb, 4, KT_INT32, 0, 0, NULL));
  BAD_NOCOMM(kt_irecv(rb, 4, KT_INT32, 0, 0, NULL, &q));
  BAD_NOCOMM(kt_sendrecv(sb, 4, 0, rb, 4, 0, KT_INT32, 0, NULL));
  BAD_NOCOMM(kt_comm_split(NULL, 0, 0, &out));
  BAD_NOCOMM(kt_comm_rank(NULL, &x));
  BAD_NOCOMM(kt_comm_size(NULL, &x));
  BAD_NOCOMM(kt_comm_abort(NULL));
  BAD_NOCOMM(kt_comm_get_error(NULL));
  BAD_NOCOMM(kt_comm_init_env(NULL));
  expect("kt_wait(NULL)", __LINE__, kt_wait(NULL), E_INVAL, false, KW_REQ);
  expect("kt_test(NULL, &done)", __LINE__, kt_test(NULL, &done), E_INVAL, false, KW_REQ);
  kt_result rc = kt_comm_destroy(NULL); /* like free(NULL) or an error: either is fine */
  checks++;
  if (rc != KT_SUCCESS && rc != E_INVAL) {
    fprintf(stderr, "FAIL rank %d: kt_comm_destroy(NULL) returned %s\n", rank_, kt_strerror(rc));
    fails++;
  }

  /* kt_comm_init: arguments checked before the store is used */
  kt_store dead = NULL;
  kt_store_ops ops = {dead_set, dead_get, dead_add, dead_wait, dead_check, dead_del, NULL};
  if (kt_store_create(&ops, NULL, &dead) != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: kt_store_create: %s\n", rank_, kt_last_error());
    fails++;
    return;
  }
  expect("kt_comm_init(NULL, ...)", __LINE__, kt_comm_init(NULL, 0, 2, dead, NULL), E_INVAL,
         false, "comm|null");
  expect("kt_comm_init(rank -1)", __LINE__, kt_comm_init(&out, -1, 2, dead, NULL), E_INVAL, true,
         "rank");
  expect("kt_comm_init(rank == size)", __LINE__, kt_comm_init(&out, 2, 2, dead, NULL), E_INVAL,
         true, "rank");
  expect("kt_comm_init(size 0)", __LINE__, kt_comm_init(&out, 0, 0, dead, NULL), E_INVAL, false,
         "size");
  expect("kt_comm_init(store NULL)", __LINE__, kt_comm_init(&out, 0, 2, NULL, NULL), E_INVAL,
         false, "store");
  kt_store_free(dead);
}

static void test_null_buffers(void *sb, void *rb, int peer) {
  kt_request q = NULL;
  size_t cnt[64], dsp[64];
  for (int i = 0; i < 64; i++) cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  BAD(KW_BUF, kt_allreduce(NULL, rb, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_allreduce(sb, NULL, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_iallreduce(NULL, rb, 4, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_BUF, kt_broadcast(sb, NULL, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_ibroadcast(sb, NULL, 4, KT_INT32, 0, comm, &q));
  BAD(KW_BUF, kt_reduce(NULL, rb, 4, KT_INT32, KT_SUM, 0, comm));
  BAD(KW_BUF, kt_ireduce(NULL, rb, 4, KT_INT32, KT_SUM, 0, comm, &q));
  BAD(KW_BUF, kt_allgather(NULL, rb, 4, KT_INT32, comm));
  BAD(KW_BUF, kt_allgather(sb, NULL, 4, KT_INT32, comm));
  BAD(KW_BUF, kt_iallgather(sb, NULL, 4, KT_INT32, comm, &q));
  BAD(KW_BUF, kt_allgatherv(NULL, 4, rb, cnt, dsp, KT_INT32, comm));
  BAD(KW_BUF, kt_allgatherv(sb, 4, NULL, cnt, dsp, KT_INT32, comm));
  BAD(KW_BUF, kt_iallgatherv(sb, 4, NULL, cnt, dsp, KT_INT32, comm, &q));
  BAD(KW_BUF, kt_reduce_scatter(NULL, rb, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_reduce_scatter(sb, NULL, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_ireduce_scatter(NULL, rb, 4, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_BUF, kt_reduce_scatterv(NULL, rb, cnt, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_reduce_scatterv(sb, NULL, cnt, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_ireduce_scatterv(NULL, rb, cnt, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_COUNTS, kt_reduce_scatterv(sb, rb, NULL, KT_INT32, KT_SUM, comm));
  BAD(KW_BUF, kt_gather(NULL, rb, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_igather(NULL, rb, 4, KT_INT32, 0, comm, &q));
  BAD(KW_BUF, kt_scatter(sb, NULL, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_iscatter(sb, NULL, 4, KT_INT32, 0, comm, &q));
  BAD(KW_BUF, kt_alltoall(NULL, rb, 4, KT_INT32, comm));
  BAD(KW_BUF, kt_alltoall(sb, NULL, 4, KT_INT32, comm));
  BAD(KW_BUF, kt_ialltoall(NULL, rb, 4, KT_INT32, comm, &q));
  BAD(KW_BUF, kt_alltoallv(NULL, cnt, dsp, rb, cnt, dsp, KT_INT32, comm));
  BAD(KW_BUF, kt_alltoallv(sb, cnt, dsp, NULL, cnt, dsp, KT_INT32, comm));
  BAD(KW_BUF, kt_ialltoallv(NULL, cnt, dsp, rb, cnt, dsp, KT_INT32, comm, &q));
  BAD(KW_BUF, kt_send(NULL, 4, KT_INT32, peer, 0, comm));
  BAD(KW_BUF, kt_isend(NULL, 4, KT_INT32, peer, 0, comm, &q));
  BAD(KW_BUF, kt_recv(NULL, 4, KT_INT32, peer, 0, comm));
  BAD(KW_BUF, kt_irecv(NULL, 4, KT_INT32, peer, 0, comm, &q));
  BAD(KW_BUF, kt_sendrecv(NULL, 4, peer, rb, 4, peer, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_sendrecv(sb, 4, peer, NULL, 4, peer, KT_INT32, 0, comm));
}

/* Root-only buffers: on a one-rank communicator every rank is the root, so
 * the check cannot leave a non-root waiting. */
static void test_root_buffers(void *sb, void *rb) {
  kt_comm solo = NULL;
  kt_result rc = kt_comm_split(comm, rank_, 0, &solo);
  checks++;
  if (rc != KT_SUCCESS || !solo) {
    fprintf(stderr, "FAIL rank %d: kt_comm_split(color=rank) returned %s: %s\n", rank_,
            kt_strerror(rc), kt_last_error());
    fails++;
    return;
  }
  kt_request q = NULL;
  kt_comm save = comm;
  comm = solo;
  BAD(KW_BUF, kt_broadcast(NULL, rb, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_ibroadcast(NULL, rb, 4, KT_INT32, 0, comm, &q));
  BAD(KW_BUF, kt_reduce(sb, NULL, 4, KT_INT32, KT_SUM, 0, comm));
  BAD(KW_BUF, kt_ireduce(sb, NULL, 4, KT_INT32, KT_SUM, 0, comm, &q));
  BAD(KW_BUF, kt_gather(sb, NULL, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_igather(sb, NULL, 4, KT_INT32, 0, comm, &q));
  BAD(KW_BUF, kt_scatter(NULL, rb, 4, KT_INT32, 0, comm));
  BAD(KW_BUF, kt_iscatter(NULL, rb, 4, KT_INT32, 0, comm, &q));
  /* the solo communicator still works */
  int32_t a = 5, b = 0;
  OK(kt_allreduce(&a, &b, 1, KT_INT32, KT_SUM, comm));
  checks++;
  if (b != 5) {
    fprintf(stderr, "FAIL rank %d: allreduce on a one-rank split: expected 5 got %d\n", rank_, b);
    fails++;
  }
  comm = save;
  OK(kt_comm_destroy(solo));
  kt_comm none = (kt_comm)&a; /* must be overwritten with NULL */
  OK(kt_comm_split(comm, KT_SPLIT_NOCOLOR, 0, &none));
  checks++;
  if (none != NULL) {
    fprintf(stderr, "FAIL rank %d: kt_comm_split(KT_SPLIT_NOCOLOR) did not set NULL\n", rank_);
    fails++;
  }
}

static void test_sizes(void *sb, void *rb, int peer) {
  kt_request q = NULL;
  size_t big[64], cnt[64], dsp[64], zero[64] = {0};
  for (int i = 0; i < 64; i++) big[i] = SIZE_MAX, cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  size_t half = SIZE_MAX / 2; /* * 4 bytes overflows */
  BAD(KW_SIZE, kt_allreduce(sb, rb, SIZE_MAX, KT_INT32, KT_SUM, comm));
  BAD(KW_SIZE, kt_allreduce(sb, rb, half, KT_INT64, KT_SUM, comm));
  BAD(KW_SIZE, kt_iallreduce(sb, rb, SIZE_MAX, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_SIZE, kt_broadcast(sb, rb, SIZE_MAX, KT_INT32, 0, comm));
  BAD(KW_SIZE, kt_reduce(sb, rb, half, KT_FLOAT32, KT_SUM, 0, comm));
  BAD(KW_SIZE, kt_allgather(sb, rb, SIZE_MAX, KT_INT32, comm));
  BAD(KW_SIZE, kt_reduce_scatter(sb, rb, half, KT_INT32, KT_SUM, comm));
  BAD(KW_SIZE, kt_gather(sb, rb, SIZE_MAX, KT_INT32, 0, comm));
  BAD(KW_SIZE, kt_scatter(sb, rb, SIZE_MAX, KT_INT32, 0, comm));
  BAD(KW_SIZE, kt_alltoall(sb, rb, half, KT_INT32, comm));
  BAD(KW_SIZE, kt_ialltoall(sb, rb, half, KT_INT32, comm, &q));
  BAD(KW_SIZE, kt_send(sb, SIZE_MAX, KT_INT32, peer, 0, comm));
  BAD(KW_SIZE, kt_recv(rb, SIZE_MAX, KT_INT32, peer, 0, comm));
  BAD(KW_SIZE, kt_sendrecv(sb, SIZE_MAX, peer, rb, 4, peer, KT_INT32, 0, comm));
  BAD(KW_SIZE, kt_sendrecv(sb, 4, peer, rb, SIZE_MAX, peer, KT_INT32, 0, comm));
  if (size_ >= 2) { /* count * size overflows though count * elemsize does not */
    size_t c = SIZE_MAX / (size_t)size_ + 1;
    BAD(KW_SIZE, kt_allgather(sb, rb, c, KT_INT8, comm));
    BAD(KW_SIZE, kt_reduce_scatter(sb, rb, c, KT_INT8, KT_SUM, comm));
    BAD(KW_SIZE, kt_alltoall(sb, rb, c, KT_UINT8, comm));
    BAD(KW_SIZE, kt_gather(sb, rb, c, KT_BOOL, 0, comm));
    BAD(KW_SIZE, kt_scatter(sb, rb, c, KT_BOOL, 0, comm));
  }
  /* v-collectives: a count, or a displacement + count, past SIZE_MAX bytes */
  BAD(KW_SIZE, kt_allgatherv(sb, SIZE_MAX, rb, big, dsp, KT_INT32, comm));
  size_t far[64];
  for (int i = 0; i < 64; i++) far[i] = SIZE_MAX - 1;
  BAD(KW_SIZE, kt_allgatherv(sb, 4, rb, cnt, far, KT_INT32, comm));
  BAD(KW_SIZE, kt_alltoallv(sb, big, dsp, rb, big, dsp, KT_INT32, comm));
  BAD(KW_SIZE, kt_alltoallv(sb, cnt, far, rb, cnt, dsp, KT_INT32, comm));
  BAD(KW_SIZE, kt_ialltoallv(sb, cnt, dsp, rb, cnt, far, KT_INT32, comm, &q));
  BAD(KW_SIZE, kt_reduce_scatterv(sb, rb, big, KT_INT32, KT_SUM, comm));
  BAD(KW_SIZE, kt_ireduce_scatterv(sb, rb, big, KT_INT32, KT_SUM, comm, &q));
  (void)zero;
}

static void test_dtype_op(void *sb, void *rb, int peer) {
  kt_request q = NULL;
  size_t cnt[64], dsp[64];
  for (int i = 0; i < 64; i++) cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  const kt_dtype bad_dts[] = {BADDT, KT_NUM_DTYPES, (kt_dtype)-1};
  for (size_t i = 0; i < sizeof bad_dts / sizeof bad_dts[0]; i++) {
    kt_dtype d = bad_dts[i];
    BAD(KW_DTYPE, kt_allreduce(sb, rb, 4, d, KT_SUM, comm));
    BAD(KW_DTYPE, kt_iallreduce(sb, rb, 4, d, KT_SUM, comm, &q));
    BAD(KW_DTYPE, kt_broadcast(sb, rb, 4, d, 0, comm));
    BAD(KW_DTYPE, kt_reduce(sb, rb, 4, d, KT_SUM, 0, comm));
    BAD(KW_DTYPE, kt_allgather(sb, rb, 4, d, comm));
    BAD(KW_DTYPE, kt_allgatherv(sb, 4, rb, cnt, dsp, d, comm));
    BAD(KW_DTYPE, kt_reduce_scatter(sb, rb, 4, d, KT_SUM, comm));
    BAD(KW_DTYPE, kt_reduce_scatterv(sb, rb, cnt, d, KT_SUM, comm));
    BAD(KW_DTYPE, kt_gather(sb, rb, 4, d, 0, comm));
    BAD(KW_DTYPE, kt_scatter(sb, rb, 4, d, 0, comm));
    BAD(KW_DTYPE, kt_alltoall(sb, rb, 4, d, comm));
    BAD(KW_DTYPE, kt_alltoallv(sb, cnt, dsp, rb, cnt, dsp, d, comm));
    BAD(KW_DTYPE, kt_send(sb, 4, d, peer, 0, comm));
    BAD(KW_DTYPE, kt_irecv(rb, 4, d, peer, 0, comm, &q));
    BAD(KW_DTYPE, kt_sendrecv(sb, 4, peer, rb, 4, peer, d, 0, comm));
  }
  const kt_op bad_ops[] = {BADOP, KT_NUM_OPS, (kt_op)-1};
  for (size_t i = 0; i < sizeof bad_ops / sizeof bad_ops[0]; i++) {
    kt_op o = bad_ops[i];
    BAD(KW_OP, kt_allreduce(sb, rb, 4, KT_INT32, o, comm));
    BAD(KW_OP, kt_iallreduce(sb, rb, 4, KT_FLOAT32, o, comm, &q));
    BAD(KW_OP, kt_reduce(sb, rb, 4, KT_INT64, o, 0, comm));
    BAD(KW_OP, kt_ireduce(sb, rb, 4, KT_UINT8, o, 0, comm, &q));
    BAD(KW_OP, kt_reduce_scatter(sb, rb, 4, KT_BOOL, o, comm));
    BAD(KW_OP, kt_ireduce_scatter(sb, rb, 4, KT_INT8, o, comm, &q));
    BAD(KW_OP, kt_reduce_scatterv(sb, rb, cnt, KT_INT32, o, comm));
  }
  /* bitwise ops take integers and bool only */
  const kt_dtype floats[] = {KT_FLOAT16, KT_BFLOAT16, KT_FLOAT32, KT_FLOAT64};
  const kt_op bitwise[] = {KT_BAND, KT_BOR, KT_BXOR};
  for (int f = 0; f < 4; f++)
    for (int b = 0; b < 3; b++) {
      BAD(KW_OP, kt_allreduce(sb, rb, 4, floats[f], bitwise[b], comm));
      if ((f + b) % 3 == 0) {
        BAD(KW_OP, kt_ireduce(sb, rb, 4, floats[f], bitwise[b], 0, comm, &q));
        BAD(KW_OP, kt_reduce_scatter(sb, rb, 4, floats[f], bitwise[b], comm));
      }
    }
}

static void test_root_peer_tag(void *sb, void *rb, int peer) {
  kt_request q = NULL;
  const int roots[] = {-1, size_, 1 << 30};
  for (int i = 0; i < 3; i++) {
    int rt = roots[i];
    BAD(KW_ROOT, kt_broadcast(sb, rb, 4, KT_INT32, rt, comm));
    BAD(KW_ROOT, kt_ibroadcast(sb, rb, 4, KT_INT32, rt, comm, &q));
    BAD(KW_ROOT, kt_reduce(sb, rb, 4, KT_INT32, KT_SUM, rt, comm));
    BAD(KW_ROOT, kt_ireduce(sb, rb, 4, KT_INT32, KT_SUM, rt, comm, &q));
    BAD(KW_ROOT, kt_gather(sb, rb, 4, KT_INT32, rt, comm));
    BAD(KW_ROOT, kt_igather(sb, rb, 4, KT_INT32, rt, comm, &q));
    BAD(KW_ROOT, kt_scatter(sb, rb, 4, KT_INT32, rt, comm));
    BAD(KW_ROOT, kt_iscatter(sb, rb, 4, KT_INT32, rt, comm, &q));
  }
  const int peers[] = {-1, size_};
  for (int i = 0; i < 2; i++) {
    int p = peers[i];
    BAD(KW_PEER, kt_send(sb, 4, KT_INT32, p, 0, comm));
    BAD(KW_PEER, kt_isend(sb, 4, KT_INT32, p, 0, comm, &q));
    BAD(KW_PEER, kt_recv(rb, 4, KT_INT32, p, 0, comm));
    BAD(KW_PEER, kt_irecv(rb, 4, KT_INT32, p, 0, comm, &q));
    BAD(KW_PEER, kt_sendrecv(sb, 4, p, rb, 4, peer, KT_INT32, 0, comm));
    BAD(KW_PEER, kt_sendrecv(sb, 4, peer, rb, 4, p, KT_INT32, 0, comm));
  }
  BAD(KW_TAG, kt_send(sb, 4, KT_INT32, peer, -1, comm));
  BAD(KW_TAG, kt_isend(sb, 4, KT_INT32, peer, -5, comm, &q));
  BAD(KW_TAG, kt_recv(rb, 4, KT_INT32, peer, -1, comm));
  BAD(KW_TAG, kt_irecv(rb, 4, KT_INT32, peer, -1, comm, &q));
  BAD(KW_TAG, kt_sendrecv(sb, 4, peer, rb, 4, peer, KT_INT32, -1, comm));
}

static void test_requests_and_out_pointers(void *sb, void *rb, int peer) {
  size_t cnt[64], dsp[64];
  for (int i = 0; i < 64; i++) cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  BAD(KW_REQ, kt_iallreduce(sb, rb, 4, KT_INT32, KT_SUM, comm, NULL));
  BAD(KW_REQ, kt_ibroadcast(sb, rb, 4, KT_INT32, 0, comm, NULL));
  BAD(KW_REQ, kt_ireduce(sb, rb, 4, KT_INT32, KT_SUM, 0, comm, NULL));
  BAD(KW_REQ, kt_iallgather(sb, rb, 4, KT_INT32, comm, NULL));
  BAD(KW_REQ, kt_iallgatherv(sb, 4, rb, cnt, dsp, KT_INT32, comm, NULL));
  BAD(KW_REQ, kt_ireduce_scatter(sb, rb, 4, KT_INT32, KT_SUM, comm, NULL));
  BAD(KW_REQ, kt_igather(sb, rb, 4, KT_INT32, 0, comm, NULL));
  BAD(KW_REQ, kt_iscatter(sb, rb, 4, KT_INT32, 0, comm, NULL));
  BAD(KW_REQ, kt_ialltoall(sb, rb, 4, KT_INT32, comm, NULL));
  BAD(KW_REQ, kt_ialltoallv(sb, cnt, dsp, rb, cnt, dsp, KT_INT32, comm, NULL));
  BAD(KW_REQ, kt_ibarrier(comm, NULL));
  BAD(KW_REQ, kt_isend(sb, 4, KT_INT32, peer, 0, comm, NULL));
  BAD(KW_REQ, kt_irecv(rb, 4, KT_INT32, peer, 0, comm, NULL));
  BAD("newcomm|null|out", kt_comm_split(comm, 0, 0, NULL));
  BAD("null|out|rank", kt_comm_rank(comm, NULL));
  BAD("null|out|size", kt_comm_size(comm, NULL));
  /* kt_test with a NULL flag on a live request, which is then completed */
  kt_request q = NULL;
  kt_result rc = kt_ibarrier(comm, &q);
  checks++;
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: kt_ibarrier: %s: %s\n", rank_, kt_strerror(rc), kt_last_error());
    exit(1);
  }
  BAD("done|null|flag", kt_test(q, NULL));
  OK(kt_wait(q));
}

static void test_counts(void *sb, void *rb) {
  kt_request q = NULL;
  size_t cnt[64], dsp[64];
  for (int i = 0; i < 64; i++) cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  BAD("sendcount|recvcount|count", kt_allgatherv(sb, 5, rb, cnt, dsp, KT_INT32, comm));
  BAD("sendcount|recvcount|count", kt_iallgatherv(sb, 3, rb, cnt, dsp, KT_INT32, comm, &q));
  BAD(KW_COUNTS, kt_allgatherv(sb, 4, rb, NULL, dsp, KT_INT32, comm));
  BAD(KW_COUNTS, kt_allgatherv(sb, 4, rb, cnt, NULL, KT_INT32, comm));
  BAD(KW_COUNTS, kt_iallgatherv(sb, 4, rb, NULL, dsp, KT_INT32, comm, &q));
  BAD(KW_COUNTS, kt_alltoallv(sb, NULL, dsp, rb, cnt, dsp, KT_INT32, comm));
  BAD(KW_COUNTS, kt_alltoallv(sb, cnt, NULL, rb, cnt, dsp, KT_INT32, comm));
  BAD(KW_COUNTS, kt_alltoallv(sb, cnt, dsp, rb, NULL, dsp, KT_INT32, comm));
  BAD(KW_COUNTS, kt_alltoallv(sb, cnt, dsp, rb, cnt, NULL, KT_INT32, comm));
  BAD(KW_COUNTS, kt_ialltoallv(sb, NULL, dsp, rb, NULL, dsp, KT_INT32, comm, &q));
}

/* Count 0 with NULL buffers is a valid (empty) operation. */
static void test_empty(void) {
  kt_request q = NULL;
  size_t zero[64] = {0};
  int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
  OK(kt_allreduce(NULL, NULL, 0, KT_FLOAT32, KT_SUM, comm));
  OK(kt_iallreduce(NULL, NULL, 0, KT_INT8, KT_MAX, comm, &q));
  OK(kt_wait(q));
  OK(kt_broadcast(NULL, NULL, 0, KT_INT32, 0, comm));
  OK(kt_broadcast(NULL, NULL, 0, KT_INT32, size_ - 1, comm));
  OK(kt_reduce(NULL, NULL, 0, KT_FLOAT64, KT_PROD, size_ - 1, comm));
  OK(kt_ireduce(NULL, NULL, 0, KT_BOOL, KT_BXOR, 0, comm, &q));
  OK(kt_wait(q));
  OK(kt_allgather(NULL, NULL, 0, KT_BFLOAT16, comm));
  OK(kt_allgatherv(NULL, 0, NULL, zero, zero, KT_FLOAT16, comm));
  OK(kt_iallgatherv(NULL, 0, NULL, zero, zero, KT_UINT8, comm, &q));
  OK(kt_wait(q));
  OK(kt_reduce_scatter(NULL, NULL, 0, KT_INT64, KT_MIN, comm));
  OK(kt_gather(NULL, NULL, 0, KT_INT32, 0, comm));
  OK(kt_scatter(NULL, NULL, 0, KT_INT32, size_ - 1, comm));
  OK(kt_alltoall(NULL, NULL, 0, KT_FLOAT32, comm));
  OK(kt_alltoallv(NULL, zero, zero, NULL, zero, zero, KT_INT32, comm));
  OK(kt_ialltoallv(NULL, zero, zero, NULL, zero, zero, KT_INT8, comm, &q));
  OK(kt_wait(q));
  OK(kt_sendrecv(NULL, 0, next, NULL, 0, prev, KT_INT32, 3, comm));
  if (size_ > 1) { /* ring, even ranks sending first */
    if (rank_ % 2 == 0) {
      OK(kt_send(NULL, 0, KT_INT32, next, 1, comm));
      OK(kt_recv(NULL, 0, KT_INT32, prev, 1, comm));
    } else {
      OK(kt_recv(NULL, 0, KT_INT32, prev, 1, comm));
      OK(kt_send(NULL, 0, KT_INT32, next, 1, comm));
    }
  }
}

/* kt_mem_*: refused arguments (no rank: registration belongs to the
 * process), then a valid round trip. */
#define BAD_MEM(kw, call) expect(#call, __LINE__, (call), E_INVAL, false, kw)
static void test_mem(void) {
  void *p = NULL;
  BAD_MEM("ptr|null", kt_mem_alloc(64, NULL));
  BAD_MEM("bytes", kt_mem_alloc(0, &p));
  char local[64];
  BAD_MEM("kt_mem_alloc", kt_mem_free(local));
  BAD_MEM("buf|null", kt_mem_register(NULL, 64, 0, 0));
  BAD_MEM("bytes", kt_mem_register(local, 0, 0, 0));
  BAD_MEM("fd", kt_mem_register(local, 64, -1, (uint64_t)(uintptr_t)local % 4096));
  BAD_MEM("no registration", kt_mem_deregister(local));
  OK(kt_mem_alloc(10000, &p));
  if (!p) return;
  memset(p, 1, 10000);
  BAD_MEM("kt_mem_free", kt_mem_deregister(p));
  int fd = memfd_create("badargs", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 8192) != 0) {
    fprintf(stderr, "FAIL rank %d: memfd for the kt_mem_register checks\n", rank_);
    fails++;
  } else {
    BAD_MEM("kt_mem_alloc", kt_mem_register((char *)p + 4096, 64, fd, 4096));
    BAD_MEM("page", kt_mem_register((char *)p + 4096, 64, fd, 100));
    void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      BAD_MEM("past the end", kt_mem_register(m, 8192, fd, 4096));
      OK(kt_mem_register(m, 8192, fd, 0));
      OK(kt_mem_register((char *)m + 4096, 100, fd, 4096)); /* replaces the overlapping one */
      BAD_MEM("no registration", kt_mem_deregister(m));
      OK(kt_mem_deregister((char *)m + 4096));
      munmap(m, 8192);
    }
    close(fd);
  }
  OK(kt_mem_free(p));
  OK(kt_mem_free(NULL));
}

#define KW_OVERLAP "overlap"

/* Send and receive buffers that share bytes outside the call's in-place
 * form are refused on the rank that passes them; touching buffers, and the
 * in-place forms, are not. Root-only checks run on a one-rank split (a
 * non-root would not see the root's buffers and would wait in the op). */
static void test_overlap(int peer) {
  static int32_t b[1024];
  int32_t *g = b + 4 * (size_t)rank_; /* this rank's block of a size x 4 buffer */
  kt_request q = NULL;
  size_t cnt[64], dsp[64];
  for (int i = 0; i < 64; i++) cnt[i] = 4, dsp[i] = 4 * (size_t)i;
  BAD(KW_OVERLAP, kt_allreduce(b, b + 1, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_OVERLAP, kt_iallreduce(b + 3, b, 4, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_OVERLAP, kt_allgather(g + 1, b, 4, KT_INT32, comm));
  BAD(KW_OVERLAP, kt_iallgather(b + 4 * (size_t)size_ - 1, b, 4, KT_INT32, comm, &q));
  BAD(KW_OVERLAP, kt_allgatherv(g + 2, 4, b, cnt, dsp, KT_INT32, comm));
  BAD(KW_OVERLAP, kt_reduce_scatter(b, g + 1, 4, KT_INT32, KT_SUM, comm));
  BAD(KW_OVERLAP, kt_ireduce_scatter(b + 1, b, 4, KT_INT32, KT_SUM, comm, &q));
  BAD(KW_OVERLAP, kt_alltoall(b, b + 4, 4, KT_INT32, comm));
  BAD(KW_OVERLAP, kt_alltoallv(b, cnt, dsp, b + 4 * (size_t)size_ - 1, cnt, dsp, KT_INT32, comm));
  BAD(KW_OVERLAP, kt_ialltoallv(b + 2, cnt, dsp, b, cnt, dsp, KT_INT32, comm, &q));
  BAD(KW_OVERLAP, kt_sendrecv(b, 4, peer, b + 3, 4, peer, KT_INT32, 0, comm));
  BAD(KW_OVERLAP, kt_sendrecv(b, 4, peer, b, 4, peer, KT_INT32, 0, comm));
  BAD(KW_OVERLAP, kt_ialltoall(b + 4, b, 4, KT_INT32, comm, &q));
  /* a send buffer in the gap between two receive blocks: inside the span */
  size_t gap[64];
  for (int i = 0; i < 64; i++) gap[i] = 8 * (size_t)i;
  BAD(KW_OVERLAP, kt_allgatherv(b + 4, 4, b, cnt, gap, KT_INT32, comm));
  /* touching is not overlapping; the in-place forms are taken */
  OK(kt_allreduce(b, b + 4, 4, KT_INT32, KT_SUM, comm));
  OK(kt_allreduce(b + 4, b, 4, KT_INT32, KT_SUM, comm));
  OK(kt_allreduce(b, b, 4, KT_INT32, KT_SUM, comm));
  OK(kt_allgather(g, b, 4, KT_INT32, comm));
  OK(kt_allgatherv(g, 4, b, cnt, dsp, KT_INT32, comm));
  OK(kt_reduce_scatter(b, g, 4, KT_INT32, KT_SUM, comm));
  OK(kt_alltoall(b, b, 4, KT_INT32, comm));
  OK(kt_alltoallv(b, cnt, dsp, b + 4 * (size_t)size_, cnt, dsp, KT_INT32, comm));
  OK(kt_sendrecv(b, 4, peer, b + 4, 4, (rank_ + size_ - 1) % size_, KT_INT32, 0, comm));
  /* root-only buffers: the root's in-place forms at its offset, and buffers a
   * non-root passes that overlap but are not used are not checked there */
  int R = size_ - 1;
  bool root = rank_ == R;
  int32_t *rblk = b + 4 * (size_t)R;
  OK(kt_gather(root ? rblk : b + 1, b, 4, KT_INT32, R, comm));
  OK(kt_scatter(b, root ? rblk : b + 1, 4, KT_INT32, R, comm));
  OK(kt_broadcast(root ? b : b + 1, b, 4, KT_INT32, R, comm));
  OK(kt_reduce(b + 4, root ? b : b + 2, 4, KT_INT32, KT_SUM, R, comm));

  kt_comm solo = NULL, save = comm;
  kt_result rc = kt_comm_split(comm, rank_, 0, &solo);
  checks++;
  if (rc != KT_SUCCESS || !solo) {
    fprintf(stderr, "FAIL rank %d: kt_comm_split(color=rank) returned %s: %s\n", rank_, kt_strerror(rc),
            kt_last_error());
    fails++;
    return;
  }
  comm = solo;
  BAD(KW_OVERLAP, kt_broadcast(b, b + 1, 4, KT_INT32, 0, comm));
  BAD(KW_OVERLAP, kt_ibroadcast(b + 1, b, 4, KT_INT32, 0, comm, &q));
  BAD(KW_OVERLAP, kt_reduce(b, b + 2, 4, KT_INT32, KT_SUM, 0, comm));
  BAD(KW_OVERLAP, kt_ireduce(b + 3, b, 4, KT_INT32, KT_SUM, 0, comm, &q));
  BAD(KW_OVERLAP, kt_igather(b, b + 2, 4, KT_INT32, 0, comm, &q));
  BAD(KW_OVERLAP, kt_gather(b + 1, b, 4, KT_INT32, 0, comm));
  BAD(KW_OVERLAP, kt_scatter(b, b + 1, 4, KT_INT32, 0, comm));
  BAD(KW_OVERLAP, kt_iscatter(b + 1, b, 4, KT_INT32, 0, comm, &q));
  OK(kt_broadcast(b, b, 4, KT_INT32, 0, comm));
  OK(kt_reduce(b, b, 4, KT_INT32, KT_SUM, 0, comm));
  OK(kt_gather(b, b, 4, KT_INT32, 0, comm));
  OK(kt_scatter(b, b, 4, KT_INT32, 0, comm));
  OK(kt_scatter(b, b + 4, 4, KT_INT32, 0, comm));
  comm = save;
  OK(kt_comm_destroy(solo));
}

int main(void) {
  kt_result rc = kt_comm_init_env(&comm);
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL kt_comm_init_env: %s: %s\n", kt_strerror(rc), kt_last_error());
    return 1;
  }
  if (kt_comm_rank(comm, &rank_) != KT_SUCCESS || kt_comm_size(comm, &size_) != KT_SUCCESS ||
      size_ > 64) {
    fprintf(stderr, "FAIL kt_comm_rank/size: %s\n", kt_last_error());
    return 1;
  }
  int peer = (rank_ + 1) % size_;
  /* room for 64 ranks x 4 elements of 8 bytes, and then some */
  void *sb = calloc(4096, 1), *rb = calloc(4096, 1);
  if (!sb || !rb) return 1;

  test_strerror();
  test_null_comm(sb, rb);
  sync_check("NULL-communicator calls");
  test_null_buffers(sb, rb, peer);
  sync_check("NULL-buffer calls");
  test_root_buffers(sb, rb);
  sync_check("root-only NULL buffers on a split");
  test_sizes(sb, rb, peer);
  sync_check("overflowing counts");
  test_dtype_op(sb, rb, peer);
  sync_check("unknown dtypes and ops");
  test_root_peer_tag(sb, rb, peer);
  sync_check("bad roots, peers and tags");
  test_requests_and_out_pointers(sb, rb, peer);
  sync_check("NULL request and out pointers");
  test_counts(sb, rb);
  sync_check("bad count arrays");
  test_empty();
  sync_check("empty operations with NULL buffers");
  test_mem();
  sync_check("registered buffers");
  test_overlap(peer);
  sync_check("overlapping buffers");

  rc = kt_comm_destroy(comm);
  checks++;
  if (rc != KT_SUCCESS) {
    fprintf(stderr, "FAIL rank %d: kt_comm_destroy: %s: %s\n", rank_, kt_strerror(rc), kt_last_error());
    fails++;
  }
  free(sb);
  free(rb);
  printf("badargs_test rank %d: %d checks, %d failed\n", rank_, checks, fails);
  return fails ? 1 : 0;
}
