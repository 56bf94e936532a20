/* tool.h - the subcommands of the `kaitian` command and the launcher's
 * internals shared by tools/kaitian/run*.c. Not installed. */
#ifndef KT_TOOL_H
#define KT_TOOL_H

#include "common.h"

#include <stdbool.h>
#include <sched.h>
#include <stdint.h>
#include <sys/types.h>

/* Subcommands. argv[0] is the subcommand's name ("run", "bench", "info").
 * Each returns the process exit status: 0 on success, 2 on a usage error,
 * otherwise as its own documentation says. */
int kt_tool_run(int argc, char **argv);
int kt_tool_bench(int argc, char **argv);
int kt_tool_info(int argc, char **argv);

/* ---- launcher internals (run.c, run_proc.c, run_output.c, run_node.c) -- */

/* Store keys the launchers of one multi-node job share. */
#define KT_RUN_KEY_FAILED "kaitian/run/failed"          /* first failure line */
#define KT_RUN_KEY_FAILED_INFO "kaitian/run/failed_info" /* "node status host" */
#define KT_RUN_KEY_FAILURES "kaitian/run/failures"      /* counter: who posts */
#define KT_RUN_KEY_DONE "kaitian/run/done"              /* counter of nodes done */
#define KT_RUN_KEY_NNODES "kaitian/run/nnodes"          /* --nnodes of node 0 */
#define KT_RUN_KEY_NPROC "kaitian/run/nproc/"           /* + node rank: its -n */
#define KT_RUN_KEY_NODE "kaitian/run/node/"             /* + node rank: join count */
#define KT_RUN_KEY_LIVE "kaitian/run/live"              /* node 0's heartbeat port and token */
#define KT_RUN_KEY_HOST "kaitian/run/host/"             /* + node rank: its hostname */
#define KT_RUN_KEY_NODE_DONE "kaitian/run/done/"        /* + node rank: 1 once done */
/* KAITIAN_RUN_LOST_MS: its default and bounds (see run_live.c). */
#define KT_RUN_LOST_MS_MIN 3000
#define KT_RUN_LOST_MS_MAX 86400000
#define KT_RUN_BEAT_MS 200 /* a node's heartbeat interval */

/* One output stream of one rank, forwarded line by line. */
typedef struct kt_run_stream {
  int fd;             /* non-blocking read end of the pipe; -1 once closed */
  int out_fd;         /* where complete lines go: 1 or 2 */
  char prefix[24];    /* "[R] ", or "" with --no-prefix */
  size_t prefix_len;
  char *buf;          /* pending bytes not yet ending in a newline */
  size_t len, cap;
} kt_run_stream;

typedef struct kt_run_rank {
  int rank;           /* global rank */
  int local_rank;
  pid_t pid;          /* also its process group id; 0 when never started */
  bool running;       /* started and not reaped yet */
  bool stopped;       /* the launcher sent it a signal (its exit is no failure) */
  bool failed;        /* exited non-zero or by a signal on its own */
  int wstatus;        /* waitpid status once reaped */
  kt_run_stream out, err;
  cpu_set_t *cpus;    /* CPUs it is bound to (CPU_ALLOC'ed), NULL: not bound */
  size_t cpus_bytes;  /* CPU_ALLOC_SIZE of cpus */
  char device[48];    /* its KAITIAN_DEVICE: "cuda:1", "cpu" */
  bool accel;         /* device is an accelerator (not the CPU) */
} kt_run_rank;

/* What to start: the program resolved before any fork, so that the child
 * only calls async-signal-safe functions (the store server thread runs). */
typedef struct kt_run_exec {
  const char *path;   /* file given to execve */
  char **argv;        /* NULL-terminated */
  const char *name;   /* the program as the user named it, for messages */
} kt_run_exec;

/* run_output.c: line forwarding. A stream adds "[R] " before each complete
 * line (unless prefix is false) and writes whole lines with one write each
 * batch, so lines of different ranks never interleave mid-line. Writes to a
 * closed stdout/stderr (EPIPE) are dropped silently. */
KT_INTERNAL void kt__run_stream_init(kt_run_stream *s, int fd, int out_fd, int rank, bool prefix);
/* Read what is available now and forward complete lines. Returns 1 at end of
 * file (the fd is then closed), 0 otherwise. */
KT_INTERNAL int kt__run_stream_pump(kt_run_stream *s);
/* Read what the pipe holds now (not more: a live writer could keep it full),
 * forwarding complete lines; an empty pipe with no writer left closes it. */
KT_INTERNAL void kt__run_stream_drain(kt_run_stream *s);
/* Forward a pending partial line (a newline is added when prefixing), close
 * the fd and free the buffer. */
KT_INTERNAL void kt__run_stream_finish(kt_run_stream *s);
/* Write a message of the launcher itself to fd (2 normally), whole. */
KT_INTERNAL void kt__run_say(int fd, const char *fmt, ...) KT_PRINTF(2, 3);
/* Write all of buf to fd, waiting on a non-blocking fd; false on EPIPE or
 * another error (the data is dropped). */
KT_INTERNAL bool kt__run_write_all(int fd, const char *buf, size_t len);

/* run_proc.c: processes. */
/* CPU binding of the CPUs this process may run on (sched_getaffinity, so
 * taskset and cpusets are honoured), in CPU-number order: each accelerator
 * rank (ranks[i].accel), in rank order, takes the next cpus_per_accel CPUs;
 * the CPU ranks split the rest into contiguous blocks, as equal as possible,
 * in rank order (ranks[i].cpus). Without accelerator ranks: n blocks, local
 * rank i on block i. Binds nothing when bind is false or the CPUs do not
 * suffice (each CPU rank needs one). Returns the number of CPUs this process
 * may run on (at least 1); ranks[i].cpus stays NULL when not bound. Out of
 * memory: binds nothing. */
KT_INTERNAL int kt__run_plan_cpus(kt_run_rank *ranks, int n, bool bind, int cpus_per_accel);
/* Free what kt__run_plan_cpus allocated. */
KT_INTERNAL void kt__run_free_cpus(kt_run_rank *ranks, int n);
/* "0-3,8,10-11": the CPUs of set, for messages. */
KT_INTERNAL void kt__run_format_cpus(const cpu_set_t *set, size_t bytes, char *buf, size_t cap);
/* Start one rank: pipes for stdout/stderr (stdin is /dev/null), its own
 * process group, PDEATHSIG=SIGKILL, envp as its whole environment. On success
 * r->pid, r->running and r's streams are set. When execve fails in the child,
 * returns KT_ERR_SYSTEM with the program and errno in kt_last_error() (the
 * child has exited; it is reaped like any other). */
KT_INTERNAL kt_result kt__run_spawn(kt_run_rank *r, const kt_run_exec *ex, char **envp,
                                    bool prefix);
/* Send sig to the process group of a running rank (to the pid itself when the
 * group is gone, e.g. after the rank called setsid). Marks it stopped. */
KT_INTERNAL void kt__run_signal_rank(kt_run_rank *r, int sig);
/* SIGKILL every remaining descendant (the launcher is a child subreaper, so
 * orphans of any depth become its children) and reap them all. on_reap is
 * called for each reaped pid (may be NULL). */
KT_INTERNAL void kt__run_kill_descendants(void (*on_reap)(pid_t pid, int wstatus, void *arg),
                                          void *arg);
/* Resolve prog for execve: a path with '/' as is, otherwise a PATH lookup.
 * Returns a malloc'ed path, or NULL with the reason in kt_last_error(). */
KT_INTERNAL char *kt__run_find_program(const char *prog);
/* "SIGKILL" for 9, "SIG42" for unnamed ones. buf holds at least 16 bytes. */
KT_INTERNAL const char *kt__run_signame(int sig, char *buf, size_t cap);
/* Describe a waitpid status: "exited with code 3" / "was killed by signal 9
 * (SIGKILL)". Returns the launcher exit code it maps to (code, or 128+sig). */
KT_INTERNAL int kt__run_describe_status(int wstatus, char *buf, size_t cap);

/* run_devices.c: the device plan (--devices, KAITIAN_DEVICES). */
#define KT_RUN_MAX_TYPES 16   /* device types in one plan, and known to torch */
#define KT_RUN_TYPE_LEN 32    /* longest type name + 1 */
#define KT_RUN_MAX_NPROC 4096 /* local ranks */
/* A parsed SPEC: `auto`, `auto+cpu`, or TYPE[:COUNT],... with each type
 * once. */
typedef struct kt_run_devspec {
  const char *text;   /* as the user gave it */
  const char *source; /* "--devices" or "KAITIAN_DEVICES", for messages */
  bool is_auto;       /* auto or auto+cpu: the plan comes from torch */
  bool fill_cpu;      /* auto+cpu: CPU ranks after the accelerators, up to -n */
  int ntypes;
  char type[KT_RUN_MAX_TYPES][KT_RUN_TYPE_LEN];
  int count[KT_RUN_MAX_TYPES];
  int total;          /* sum of count: the ranks of an explicit plan */
} kt_run_devspec;
/* One local rank's device. */
typedef struct kt_run_device {
  char name[48];      /* KAITIAN_DEVICE: "cuda:1", "cpu" */
  bool accel;
} kt_run_device;
/* Parse text into d (no discovery, no switches). Returns false, with one
 * line printed saying what is wrong, on a malformed SPEC. */
KT_INTERNAL bool kt__run_parse_devices(const char *text, const char *source, kt_run_devspec *d);
/* Decide the device of every local rank. nproc: -n (nproc_given: the user
 * gave it); py: PROGRAM is a .py file; python: the interpreter whose torch
 * is asked (in a helper process, at most once, only when an explicit plan
 * names an accelerator or auto plans a .py program). On success returns -1
 * with *plan (malloc'ed, *n entries, free()) set; otherwise the launcher's
 * exit status (2: the plan cannot be made, 128+sig: interrupted) with one
 * line printed. */
KT_INTERNAL int kt__run_plan_devices(const kt_run_devspec *d, int nproc, bool nproc_given, bool py,
                                     const char *python, kt_run_device **plan, int *n);
/* KAITIAN_DEBUG is INFO or TRACE: the launcher says what it planned. */
KT_INTERNAL bool kt__run_info_on(void);

/* run_live.c: liveness of the nodes of a multi-node job, on threads that
 * nothing else blocks. */
#define KT_RUN_LIVE_TOKEN 16 /* bytes of the heartbeat token */
typedef struct kt_run_live kt_run_live;
/* Node 0: listen on bind_host (the store's address, a port the kernel
 * picks) for the other nodes' heartbeats and start the watcher thread.
 * *port and token_hex are what the others need (published in the store,
 * KT_RUN_KEY_LIVE: "PORT TOKEN"). On failure nothing is left. */
KT_INTERNAL kt_result kt__run_live_watch(const char *bind_host, int nnodes, int64_t lost_ms, kt_run_live **out,
                                         int *port, char token_hex[2 * KT_RUN_LIVE_TOKEN + 1]);
/* Parse node 0's "PORT TOKEN" (PORT 1-65535, TOKEN 32 hex digits). */
KT_INTERNAL kt_result kt__run_live_parse(const char *value, int *port, uint8_t token[KT_RUN_LIVE_TOKEN]);
/* Node K > 0: connect to host at node 0's published value within
 * timeout_ms, say hello, and start the thread that beats every
 * KT_RUN_BEAT_MS. On failure nothing is left. */
KT_INTERNAL kt_result kt__run_live_beat(const char *host, const char *value, int node_rank, int64_t timeout_ms,
                                        kt_run_live **out);
/* Node 0: 1 when a node that is not done is gone (*node, why: the second
 * signal that says so), each node once; 2 when a node's heartbeat stopped
 * for the limit but its host answers (slow: why says so, once per silence);
 * 0 otherwise. */
KT_INTERNAL int kt__run_live_event(kt_run_live *l, int *node, char *why, size_t cap);
/* Node 0: heartbeat gaps so far (n gaps, the longest and its node, the 99th
 * percentile to 10 ms) and hellos refused. */
KT_INTERNAL void kt__run_live_gaps(kt_run_live *l, uint64_t *n, int64_t *max_ms, int64_t *p99_ms, int *max_node,
                                   int *refused);
/* Node K: say DONE to node 0 and stop beating (the connection stays until
 * kt__run_live_stop). */
KT_INTERNAL void kt__run_live_done(kt_run_live *l);
/* Stop the thread, close everything, free l (NULL: nothing). */
KT_INTERNAL void kt__run_live_stop(kt_run_live *l);

/* run_node.c: coordination of the launchers of a multi-node job through the
 * rendezvous store. */
typedef struct kt_run_node {
  kt_store store;     /* client connection; NULL on a single node */
  int node_rank, nnodes, nproc;
  int rank_base;      /* join: global rank of this node's local rank 0 */
  int world;          /* join: ranks on all nodes (the sum of their -n) */
  char host[256];     /* this machine's hostname, for messages */
  bool posted;        /* this node posted the job's first failure */
  int interrupted_by; /* join: the signal that interrupted it, else 0 */
  const char *live_bind; /* node 0: where to listen for heartbeats (the store's bind host) */
  int64_t lost_ms;    /* KAITIAN_RUN_LOST_MS */
  kt_run_live *live;  /* node 0: the watcher; other nodes: the heartbeat */
} kt_run_node;
/* Connect to the store at host:port with secret, claim node_rank (a second
 * launcher with the same node rank is an error), check that node 0 uses the
 * same --nnodes, publish this node's -n and wait for every node's: sets
 * rank_base and world. Fails with a message naming what disagreed; a pending
 * SIGINT/SIGTERM/SIGHUP ends the wait with KT_ERR_ABORTED and sets
 * interrupted_by. On failure n->store is NULL. */
KT_INTERNAL kt_result kt__run_node_join(kt_run_node *n, const char *host, int port,
                                        const char *secret);
/* Publish a local failure (first one of the job wins): line is the failure
 * line as printed, status the exit code this node will return. Errors are
 * reported as warnings only: the local stop goes on regardless. */
KT_INTERNAL void kt__run_node_post_failure(kt_run_node *n, const char *line, int status);
/* Look for another node's failure. Returns 1 and fills line/status/node/host
 * when one was posted, 0 when none, -1 when the store cannot be reached
 * (message in kt_last_error()). */
KT_INTERNAL int kt__run_node_poll_failure(kt_run_node *n, char *line, size_t cap, int *status,
                                          int *node, char *host, size_t hostcap);
/* Node 0: a node (not this one) that is gone and not done (see run_live.c):
 * 1 with its rank, host and why; 0 if none. A slow node is said once. */
KT_INTERNAL int kt__run_node_find_lost(kt_run_node *n, int *node, char *host, size_t hostcap, char *why,
                                       size_t whycap);
/* A node's published -n (decimal, 1..KT_RUN_MAX_NPROC, the job's ranks so
 * far plus it at most 2^30): true with *np set. */
KT_INTERNAL bool kt__run_parse_nproc(const char *text, int world, int *np);
/* The "node status host" of a posted failure: sets *node (-1 when not a
 * node rank), *status (1-255; 1 when out of range) and host when it parses;
 * otherwise leaves node and host and makes *status 1-255. */
KT_INTERNAL void kt__run_parse_failed_info(const char *info, int *node, int *status, char *host, size_t hostcap);
/* Post a failure on behalf of another node (a lost one). */
KT_INTERNAL void kt__run_node_post_failure_of(kt_run_node *n, int node, const char *host, const char *line,
                                             int status);
/* This node's ranks are all finished: count it in KT_RUN_KEY_DONE. */
KT_INTERNAL void kt__run_node_done(kt_run_node *n);
/* Node 0: current KT_RUN_KEY_DONE count, -1 when the store fails. */
KT_INTERNAL int64_t kt__run_node_done_count(kt_run_node *n);
KT_INTERNAL void kt__run_node_leave(kt_run_node *n);
/* A SIGINT/SIGTERM/SIGHUP waiting in the (blocked) signal mask, or 0. */
KT_INTERNAL int kt__run_pending_stop_signal(void);

#endif /* KT_TOOL_H */
