/* kaitian.h - the public C API of KaiTian, a collective-communication library.
 *
 * This is the only public header. Every symbol it declares starts with kt_ (or
 * KT_ for macros and enum values); nothing else is exported from libkaitian.
 *
 * Conventions
 *  - Every function returns a kt_result. On an error the function has no side
 *    effect, kt_strerror() names the code and kt_last_error() (thread-local)
 *    holds a message with the details: which rank, which op, what was wrong.
 *  - Counts are element counts, never bytes.
 *  - A collective is in place when the send and receive buffers are the same
 *    pointer (for allgather: sendbuf == recvbuf + rank * count; for
 *    reduce_scatter: recvbuf == sendbuf + rank * recvcount), as in NCCL.
 *    Overlap of the two other than an in-place form (docs/api.md lists
 *    each collective's) is refused with KT_ERR_INVALID_ARGUMENT.
 *  - Non-blocking calls (kt_i*) return a kt_request that kt_wait() completes and
 *    frees. Buffers and count arrays must stay valid until then (count arrays
 *    are copied at issue time, so those may be reused at once). Operations on a
 *    communicator run in the order they were issued, blocking or not.
 *  - Once an operation fails with a timeout, a dead peer, a mismatch or an
 *    abort, the communicator is broken: every later operation returns the same
 *    error. Destroy it and build a new one.
 */
#ifndef KAITIAN_H
#define KAITIAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KT_API __attribute__((visibility("default")))
#else
#define KT_API
#endif

#define KT_VERSION_MAJOR 0
#define KT_VERSION_MINOR 1
#define KT_VERSION_PATCH 0

/* Result codes: X(name, value, message). The enum, kt_strerror() and the
 * Python binding's exception table are all generated from this one list. */
#define KT_RESULT_LIST(X)                                                        \
  X(KT_SUCCESS, 0, "success")                                                    \
  X(KT_ERR_INVALID_ARGUMENT, 1, "invalid argument")                              \
  X(KT_ERR_NO_MEMORY, 2, "out of memory")                                        \
  X(KT_ERR_SYSTEM, 3, "system call failed")                                      \
  X(KT_ERR_TIMEOUT, 4, "operation timed out")                                    \
  X(KT_ERR_PEER_FAILED, 5, "a peer rank failed or disconnected")                 \
  X(KT_ERR_MISMATCH, 6, "ranks issued mismatched operations")                    \
  X(KT_ERR_ABORTED, 7, "communicator aborted")                                   \
  X(KT_ERR_STORE, 8, "rendezvous store error")                                   \
  X(KT_ERR_UNSUPPORTED, 9, "operation not supported")                            \
  X(KT_ERR_IN_PROGRESS, 10, "operation still in progress")                       \
  X(KT_ERR_TRUNCATED, 11, "buffer too small")                                    \
  X(KT_ERR_INTERNAL, 12, "internal error")

typedef enum kt_result {
#define KT_X_ENUM(name, value, msg) name = value,
  KT_RESULT_LIST(KT_X_ENUM)
#undef KT_X_ENUM
} kt_result;

/* Name and fixed message of a result code ("KT_ERR_TIMEOUT: operation timed out"). */
KT_API const char *kt_strerror(kt_result r);
/* Details of the last error on the calling thread; "" when none. The text is
 * valid until the next KaiTian call on this thread. */
KT_API const char *kt_last_error(void);

/* Element types. KT_BOOL is one byte, 0 or 1. float16 and bfloat16 reduce in
 * float32 and round to nearest even on store. */
typedef enum kt_dtype {
  KT_INT8 = 0,
  KT_UINT8 = 1,
  KT_INT32 = 2,
  KT_INT64 = 3,
  KT_FLOAT16 = 4,
  KT_BFLOAT16 = 5,
  KT_FLOAT32 = 6,
  KT_FLOAT64 = 7,
  KT_BOOL = 8,
  KT_NUM_DTYPES
} kt_dtype;

/* Reduction operators. On KT_BOOL, SUM and MAX are logical or, PROD and MIN
 * logical and (as torch does). AVG divides the sum by the number of ranks
 * (integer types truncate towards zero). The bitwise ops take integer types
 * and bool only. */
typedef enum kt_op {
  KT_SUM = 0,
  KT_PROD = 1,
  KT_MIN = 2,
  KT_MAX = 3,
  KT_AVG = 4,
  KT_BAND = 5,
  KT_BOR = 6,
  KT_BXOR = 7,
  KT_NUM_OPS
} kt_op;

/* Size in bytes of one element, 0 for an unknown dtype. */
KT_API size_t kt_dtype_size(kt_dtype dtype);
KT_API const char *kt_dtype_name(kt_dtype dtype);
KT_API const char *kt_op_name(kt_op op);

/* ------------------------------------------------------------------------ */
/* Rendezvous store                                                          */
/* ------------------------------------------------------------------------ */

/* A key-value store used to bootstrap communicators. Its operations are a table
 * of function pointers so that any store can be bridged in (KaiTian's TCP store,
 * or torch's c10d store from Python). Every function returns a kt_result and,
 * on failure, leaves a message in kt_last_error(). Timeouts are in
 * milliseconds; a negative timeout means "the store's default". */
typedef struct kt_store_ops {
  /* Set key to the value (overwrites). */
  kt_result (*set)(void *ctx, const char *key, const void *value, size_t len);
  /* Wait until key exists, then copy its value into buf. *len receives the
   * value's length; KT_ERR_TRUNCATED when it exceeds cap (nothing copied). */
  kt_result (*get)(void *ctx, const char *key, void *buf, size_t cap, size_t *len,
                   int64_t timeout_ms);
  /* Atomically add delta to the integer stored at key (missing = 0) and
   * return the new value in *result. */
  kt_result (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
  /* Wait until every key exists. */
  kt_result (*wait)(void *ctx, const char *const *keys, size_t nkeys, int64_t timeout_ms);
  /* *ready = 1 when every key exists now, 0 otherwise; never waits. */
  kt_result (*check)(void *ctx, const char *const *keys, size_t nkeys, int *ready);
  /* Delete key; deleting a missing key is not an error. */
  kt_result (*del)(void *ctx, const char *key);
  /* Release ctx (called by kt_store_free); may be NULL. */
  void (*destroy)(void *ctx);
} kt_store_ops;

typedef struct kt_store_s *kt_store;

/* Wrap a table of operations. ops is copied; ctx is passed to every call. */
KT_API kt_result kt_store_create(const kt_store_ops *ops, void *ctx, kt_store *store);
/* Connect to a KaiTian TCP store server at host:port presenting secret (may be
 * NULL or "" when the server has none). Retries until timeout_ms. */
KT_API kt_result kt_store_tcp_connect(const char *host, int port, const char *secret,
                                      int64_t timeout_ms, kt_store *store);
KT_API void kt_store_free(kt_store store);

/* Store operations through the table (for C users and tests). */
KT_API kt_result kt_store_set(kt_store s, const char *key, const void *value, size_t len);
KT_API kt_result kt_store_get(kt_store s, const char *key, void *buf, size_t cap, size_t *len,
                              int64_t timeout_ms);
KT_API kt_result kt_store_add(kt_store s, const char *key, int64_t delta, int64_t *result);
KT_API kt_result kt_store_wait(kt_store s, const char *const *keys, size_t nkeys,
                               int64_t timeout_ms);
KT_API kt_result kt_store_check(kt_store s, const char *const *keys, size_t nkeys, int *ready);
KT_API kt_result kt_store_delete(kt_store s, const char *key);

/* A TCP store server running on a background thread. port 0 picks a free port;
 * kt_store_server_port() tells which. Clients must present secret (NULL or ""
 * accepts everyone). */
typedef struct kt_store_server_s *kt_store_server;
KT_API kt_result kt_store_server_start(const char *bind_host, int port, const char *secret,
                                       kt_store_server *server);
KT_API int kt_store_server_port(kt_store_server server);
KT_API void kt_store_server_stop(kt_store_server server);

/* ------------------------------------------------------------------------ */
/* Communicators                                                             */
/* ------------------------------------------------------------------------ */

typedef struct kt_comm_s *kt_comm;

typedef struct kt_config {
  size_t struct_size;   /* sizeof(kt_config), for compatibility */
  int64_t timeout_ms;   /* deadline of every wait; <= 0: KAITIAN_TIMEOUT */
  const char *prefix;   /* store key prefix, so several communicators can share
                           one store; NULL or "": "kt" */
} kt_config;
#define KT_CONFIG_INIT {sizeof(kt_config), 0, NULL}

/* Create a communicator of size ranks; every rank calls it with the same size,
 * its own rank and a store all ranks share. config may be NULL. The store must
 * outlive the call only (the communicator does not keep it). */
KT_API kt_result kt_comm_init(kt_comm *comm, int rank, int size, kt_store store,
                              const kt_config *config);
/* The job's shape as the environment describes it, from the first source
 * that is set, in this order: KaiTian's own variables (KAITIAN_RANK,
 * KAITIAN_WORLD_SIZE, ...), torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
 * MASTER_ADDR, MASTER_PORT; what `kaitian run` sets), Open MPI's
 * (OMPI_COMM_WORLD_RANK, ...), PMI's (PMI_RANK, PMI_SIZE; MPICH) and Slurm's
 * (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
 * SLURM_STEP_NODELIST, ...; the MPI launchers first, since mpirun inside an
 * allocation starts its daemons with srun).
 * A source that is half set or inconsistent is an error naming the
 * variables; no source at all is a job of one rank (source "none"). */
typedef struct kt_job {
  int rank, size;             /* this process in the job */
  int local_rank, local_size; /* on this node; -1 where the source does not say */
  int node_rank, nnodes;      /* -1 where the source does not say */
  char store_host[256];       /* the rendezvous store ("" for a job of one rank) */
  int store_port;
  int serve_store;            /* 1: no launcher serves the store; rank 0 must
                                 (kt_comm_init_env does, at store_port) */
  char source[16];            /* "kaitian", "torchrun", "slurm", "openmpi", "pmi", "none" */
  char job_id[96];            /* the same on every rank, e.g. "slurm-4711.0"; "" if unknown */
} kt_job;
KT_API kt_result kt_job_from_env(kt_job *job);

/* Create a communicator of the whole job from the environment
 * (kt_job_from_env): under `kaitian run`, torchrun, `srun` or `mpirun`. Where
 * no launcher serves a store (srun, mpirun, plain torchrun variables), rank 0
 * serves one for the duration of the call. */
KT_API kt_result kt_comm_init_env(kt_comm *comm);
/* Collective over comm: ranks with the same color form a new communicator,
 * ordered by key then by rank in comm. color KT_SPLIT_NOCOLOR gives *newcomm
 * = NULL. */
#define KT_SPLIT_NOCOLOR (-1)
KT_API kt_result kt_comm_split(kt_comm comm, int color, int key, kt_comm *newcomm);
/* Local: waits for this rank's outstanding operations, then frees. */
KT_API kt_result kt_comm_destroy(kt_comm comm);
/* Local and thread-safe: every waiter on comm, now or later, gets
 * KT_ERR_ABORTED; peers notice within their next wait. Call kt_comm_destroy
 * afterwards to free. */
KT_API kt_result kt_comm_abort(kt_comm comm);
KT_API kt_result kt_comm_rank(kt_comm comm, int *rank);
KT_API kt_result kt_comm_size(kt_comm comm, int *size);
/* Error state: KT_SUCCESS while healthy, otherwise the error that broke it
 * (its message in kt_last_error()). Never waits. */
KT_API kt_result kt_comm_get_error(kt_comm comm);

/* ------------------------------------------------------------------------ */
/* Requests                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct kt_request_s *kt_request;

/* Wait for completion, then free the request. Returns the operation's result;
 * its message goes to this thread's kt_last_error(). */
KT_API kt_result kt_wait(kt_request req);
/* *done = 1 when complete (then kt_wait returns at once), 0 otherwise. */
KT_API kt_result kt_test(kt_request req, int *done);

/* Completion queues: one thread can wait for many requests at once (the
 * PyTorch binding completes its futures this way). A request registered with
 * kt_request_notify posts its tag to the queue when it completes (at once if it
 * already has); the request still belongs to the caller, who frees it with
 * kt_wait (which then returns immediately with the op's result). */
typedef struct kt_cq_s *kt_cq;
KT_API kt_result kt_cq_create(kt_cq *cq);
/* Free the queue. No request may still be registered with it. */
KT_API void kt_cq_destroy(kt_cq cq);
/* Post tag when req completes. At most one queue per request. */
KT_API kt_result kt_request_notify(kt_request req, kt_cq cq, uint64_t tag);
/* Post tag now (e.g. to wake the waiting thread for shutdown). */
KT_API kt_result kt_cq_post(kt_cq cq, uint64_t tag);
/* Take the oldest tag, waiting up to timeout_ms (negative: forever);
 * KT_ERR_TIMEOUT when none came. */
KT_API kt_result kt_cq_wait(kt_cq cq, uint64_t *tag, int64_t timeout_ms);

/* ------------------------------------------------------------------------ */
/* Buffers the ranks of a host share                                          */
/* ------------------------------------------------------------------------ */

/* An allreduce among ranks of one host runs single-copy when every rank's
 * buffers are registered: each rank reduces its share of the message straight
 * from the peers' buffers and writes the result into all of them (half the
 * memory traffic of copying through the communicator's segment). The peers map
 * a registered buffer through /proc/<pid>/fd/<fd> of the rank that owns it.
 * Registration is per process, not per communicator; unregistered buffers,
 * ranks that registered nothing and multi-host communicators keep the copying
 * algorithms, and results are the same either way.
 *
 * kt_mem_alloc: bytes (> 0) of zeroed, page-aligned memory backed by a memfd,
 * registered; free it with kt_mem_free. */
KT_API kt_result kt_mem_alloc(size_t bytes, void **ptr);
KT_API kt_result kt_mem_free(void *ptr);
/* Register memory that is a MAP_SHARED mapping of fd: buf holds the file's
 * bytes from offset on. fd must stay open and mapped there until kt_mem_deregister (a
 * registration whose fd was closed or now names another file is dropped when
 * next used). Registering a range that overlaps a registered one replaces it. */
KT_API kt_result kt_mem_register(void *buf, size_t bytes, int fd, uint64_t offset);
/* Forget the registration starting at buf; KT_ERR_INVALID_ARGUMENT if none. */
KT_API kt_result kt_mem_deregister(void *buf);

/* ------------------------------------------------------------------------ */
/* Collectives                                                               */
/* ------------------------------------------------------------------------ */

KT_API kt_result kt_allreduce(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                              kt_op op, kt_comm comm);
KT_API kt_result kt_iallreduce(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                               kt_op op, kt_comm comm, kt_request *req);

/* root's sendbuf goes to every rank's recvbuf (sendbuf is read on root only). */
KT_API kt_result kt_broadcast(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                              int root, kt_comm comm);
KT_API kt_result kt_ibroadcast(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                               int root, kt_comm comm, kt_request *req);

/* recvbuf is written on root only (may be NULL elsewhere). */
KT_API kt_result kt_reduce(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                           kt_op op, int root, kt_comm comm);
KT_API kt_result kt_ireduce(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                            kt_op op, int root, kt_comm comm, kt_request *req);

/* recvbuf holds size * sendcount elements, rank r's at r * sendcount. */
KT_API kt_result kt_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                              kt_dtype dtype, kt_comm comm);
KT_API kt_result kt_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                               kt_dtype dtype, kt_comm comm, kt_request *req);

/* Rank r contributes recvcounts[r] elements, placed at recvbuf + displs[r]
 * (element offsets). sendcount must equal recvcounts[rank]. */
KT_API kt_result kt_allgatherv(const void *sendbuf, size_t sendcount, void *recvbuf,
                               const size_t *recvcounts, const size_t *displs, kt_dtype dtype,
                               kt_comm comm);
KT_API kt_result kt_iallgatherv(const void *sendbuf, size_t sendcount, void *recvbuf,
                                const size_t *recvcounts, const size_t *displs, kt_dtype dtype,
                                kt_comm comm, kt_request *req);

/* sendbuf holds size * recvcount elements; rank r receives the reduction of
 * block r. */
KT_API kt_result kt_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                   kt_dtype dtype, kt_op op, kt_comm comm);
KT_API kt_result kt_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                    kt_dtype dtype, kt_op op, kt_comm comm, kt_request *req);

/* Uneven blocks (MPI_Reduce_scatter): sendbuf holds the sum of recvcounts
 * elements, block r (recvcounts[r] elements, after the blocks of the ranks
 * before r) reduced into rank r's recvbuf; a count may be 0. In place:
 * recvbuf == sendbuf + the counts before this rank's. */
KT_API kt_result kt_reduce_scatterv(const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                    kt_dtype dtype, kt_op op, kt_comm comm);
KT_API kt_result kt_ireduce_scatterv(const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                     kt_dtype dtype, kt_op op, kt_comm comm, kt_request *req);

/* root's recvbuf holds size * sendcount elements (NULL allowed elsewhere). */
KT_API kt_result kt_gather(const void *sendbuf, void *recvbuf, size_t sendcount, kt_dtype dtype,
                           int root, kt_comm comm);
KT_API kt_result kt_igather(const void *sendbuf, void *recvbuf, size_t sendcount, kt_dtype dtype,
                            int root, kt_comm comm, kt_request *req);

/* root's sendbuf holds size * recvcount elements (NULL allowed elsewhere). */
KT_API kt_result kt_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, kt_dtype dtype,
                            int root, kt_comm comm);
KT_API kt_result kt_iscatter(const void *sendbuf, void *recvbuf, size_t recvcount, kt_dtype dtype,
                             int root, kt_comm comm, kt_request *req);

/* Block r of sendbuf (count elements each) goes to rank r; block s of recvbuf
 * comes from rank s. In place when sendbuf == recvbuf. */
KT_API kt_result kt_alltoall(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                             kt_comm comm);
KT_API kt_result kt_ialltoall(const void *sendbuf, void *recvbuf, size_t count, kt_dtype dtype,
                              kt_comm comm, kt_request *req);

/* Counts and displacements in elements, one per rank. Sendcounts on rank a for
 * b must equal recvcounts on rank b for a. Not in place. */
KT_API kt_result kt_alltoallv(const void *sendbuf, const size_t *sendcounts,
                              const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                              const size_t *rdispls, kt_dtype dtype, kt_comm comm);
KT_API kt_result kt_ialltoallv(const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, kt_dtype dtype, kt_comm comm,
                               kt_request *req);

KT_API kt_result kt_barrier(kt_comm comm);
KT_API kt_result kt_ibarrier(kt_comm comm, kt_request *req);

/* Point to point. Messages between two ranks are matched in issue order; the
 * receiver's count, dtype and tag must match the sender's (a difference is a
 * KT_ERR_MISMATCH naming both sides). tag >= 0. Because a communicator runs its
 * operations in order, two ranks that both send first to each other with
 * messages larger than what the path buffers cannot both complete: between
 * ranks of one host (the shared-memory ring, KAITIAN_SHM_P2P_BYTES) the
 * senders fail at once with KT_ERR_MISMATCH (a cycle of up to 64 ranks each
 * sending to the next likewise); over TCP (the socket buffers) they wait until
 * KAITIAN_TIMEOUT. Use kt_sendrecv for exchanges. */
KT_API kt_result kt_send(const void *buf, size_t count, kt_dtype dtype, int peer, int tag,
                         kt_comm comm);
KT_API kt_result kt_isend(const void *buf, size_t count, kt_dtype dtype, int peer, int tag,
                          kt_comm comm, kt_request *req);
KT_API kt_result kt_recv(void *buf, size_t count, kt_dtype dtype, int peer, int tag,
                         kt_comm comm);
KT_API kt_result kt_irecv(void *buf, size_t count, kt_dtype dtype, int peer, int tag,
                          kt_comm comm, kt_request *req);
/* Send to dst and receive from src at the same time; the two buffers must not
 * overlap. */
KT_API kt_result kt_sendrecv(const void *sendbuf, size_t sendcount, int dst, void *recvbuf,
                             size_t recvcount, int src, kt_dtype dtype, int tag, kt_comm comm);

/* ------------------------------------------------------------------------ */
/* Optimizer kernels (CPU)                                                   */
/* ------------------------------------------------------------------------ */

/* Hyperparameters of one Adam/AdamW step. Start from KT_ADAM_CONFIG_INIT. */
typedef struct kt_adam_config {
  size_t struct_size;   /* sizeof(kt_adam_config), for compatibility */
  double lr;            /* learning rate, finite, >= 0 */
  double beta1, beta2;  /* moment decay rates, each in [0, 1) */
  double eps;           /* added to the denominator, finite, >= 0 */
  double weight_decay;  /* finite, >= 0 */
  int adamw;            /* nonzero: AdamW (param *= 1 - lr * weight_decay);
                           zero: Adam (grad += weight_decay * param) */
  int bias_correction;  /* nonzero: divide the moments by 1 - beta^step, as
                           torch.optim.Adam always does */
  int64_t step;         /* number of this step, 1 for the first */
  int threads;          /* > 0: at most this many threads; 0: KAITIAN_OPTIM_THREADS,
                           else the CPUs of the calling thread's affinity mask */
} kt_adam_config;
#define KT_ADAM_CONFIG_INIT {sizeof(kt_adam_config), 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1, 1, 0}

/* One Adam (cfg->adamw == 0) or AdamW step over n float32 parameters, in
 * place on param, exp_avg and exp_avg_sq (the state, zero before step 1).
 * grad holds n elements of grad_dtype: KT_FLOAT32, KT_FLOAT16 or
 * KT_BFLOAT16 (widened exactly). When param_copy is not NULL, the updated
 * parameters are also written there as copy_dtype (KT_FLOAT32, KT_FLOAT16 or
 * KT_BFLOAT16, rounded to nearest even) in the same pass, e.g. the bf16
 * model weights of an fp32 master copy; copy_dtype is ignored otherwise.
 *
 * Per element, in float32 and in torch.optim.Adam/AdamW's order (fma is one
 * rounding; every other operation rounds; the scalars are computed in double
 * and rounded to float once per call, as torch does with Python floats):
 *   AdamW: p = p * (1 - lr*wd)          Adam, wd != 0: g = fma(p, wd, g)
 *   m = fma(g, 1 - beta1, m * beta1)
 *   v = fma((1 - beta2) * g, g, v * beta2)
 *   p = p + (-lr/bc1 * m) / (sqrt(v) / sqrt(bc2) + eps)
 * with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (both 1 without bias
 * correction). Every kernel family gives the same bits.
 *
 * n = 0 does nothing (pointers may then be NULL). The buffers need no
 * alignment and must not overlap one another. Large n is split across
 * threads (a pool kept by the library; results do not depend on the
 * count). KAITIAN_OPTIM_IMPL forces a kernel family (scalar, avx2,
 * avx512); one this CPU lacks makes the call fail with KT_ERR_UNSUPPORTED.
 * Errors (KT_ERR_INVALID_ARGUMENT: NULL config or buffer, wrong struct_size,
 * a hyperparameter out of range, step < 1, threads < 0, an unsupported
 * dtype, n too large, overlapping buffers) leave every buffer untouched.
 * Thread-safe; concurrent calls on disjoint buffers may run at once. */
KT_API kt_result kt_adam_step(const kt_adam_config *cfg, float *param, const void *grad,
                              kt_dtype grad_dtype, float *exp_avg, float *exp_avg_sq,
                              void *param_copy, kt_dtype copy_dtype, size_t n);

/* ------------------------------------------------------------------------ */
/* Library                                                                   */
/* ------------------------------------------------------------------------ */

/* "0.1.0" */
KT_API const char *kt_version_string(void);
KT_API void kt_version(int *major, int *minor, int *patch);
/* Build description: compiler, flags, sanitizers, detected CPU features. */
KT_API const char *kt_build_info(void);

#ifdef __cplusplus
}
#endif
#endif /* KAITIAN_H */
