/* transport.h - point-to-point layer the collective algorithms run on.
 *
 * Messages between two ranks travel in issue order. Each message carries a
 * header (op sequence number, collective, tag, length); the receiver posts what
 * it expects and a different header is a KT_ERR_MISMATCH naming both sides;
 * ranks that wait with nothing arriving exchange status notices on the
 * control sockets, which catch the mismatches no message shows.
 * Transfers are posted, then advanced by kt__net_progress() until complete;
 * payloads are read and written in place (no copies in the library), and a
 * sender may stream a buffer that is still being produced (x->avail). */
#ifndef KT_TRANSPORT_H
#define KT_TRANSPORT_H

#include "group.h"

#define KT_NET_HDR_BYTES 32

typedef struct kt__xfer {
  int peer;
  bool is_send;
  uint32_t tag;          /* algorithm step, or user tag for send/recv */
  char *buf;
  size_t len;            /* payload bytes */
  size_t done;           /* payload bytes moved so far */
  size_t avail;          /* send only: bytes of buf ready to go (<= len) */
  int lanes;             /* most TCP connections of the pair to stripe it over (0: all); the
                            sender's and the receiver's must agree */
  /* transport private */
  unsigned char hdr[KT_NET_HDR_BYTES]; /* send: the header every lane sends first */
  struct kt__xfer *next;
  uint64_t msg;                        /* send: its place among the messages to the peer */
  int lanes_left;                      /* lanes of the connection not yet past it */
  size_t next_unit;                    /* send, striped: its first unit no lane has claimed */
  size_t got;                          /* receive, striped: bytes of it received */
  uint64_t units_mix;                  /* receive, striped: sum of unit_mix() of the units begun */
  bool complete;
} kt__xfer;

/* Fill a transfer descriptor; sends start with everything available. */
static inline void kt__xfer_send(kt__xfer *x, int peer, const void *buf, size_t len, uint32_t tag) {
  *x = (kt__xfer){.peer = peer, .is_send = true, .tag = tag, .buf = (char *)buf, .len = len,
                  .avail = len};
}
static inline void kt__xfer_recv(kt__xfer *x, int peer, void *buf, size_t len, uint32_t tag) {
  *x = (kt__xfer){.peer = peer, .is_send = false, .tag = tag, .buf = (char *)buf, .len = len};
}

/* Queue x behind earlier transfers to/from the same peer. x must stay valid
 * until complete (or until the op fails). */
KT_INTERNAL kt_result kt__net_post(kt__exec *ex, kt__xfer *x);
/* Advance every posted transfer as far as the sockets allow. block: when
 * nothing moved, wait until something can (or the deadline, an abort, a dead
 * peer). Returns an error naming the peer and op on failure. */
KT_INTERNAL kt_result kt__net_progress(kt__exec *ex, bool block);
/* memcpy(dst, src, bytes) on a rank whose sends are posted: in pieces of
 * `piece` bytes with kt__net_progress(ex, false) after each, so that a send
 * bound by its link goes on while the copy runs and the peers do not wait
 * for the copy; piece 0: in one go. */
KT_INTERNAL kt_result kt__net_copy_while_sending(kt__exec *ex, void *dst, const void *src, size_t bytes, size_t piece);
/* Without waiting: has a peer died or aborted since we last looked? Run at
 * the start of every operation so that a rank never starts an op on a
 * communicator its peers have already given up. */
KT_INTERNAL kt_result kt__net_check_peers(kt__exec *ex);
/* At the start of every op: remember its signature and restart the clock of
 * status notices. */
KT_INTERNAL void kt__net_op_begin(kt__exec *ex);
/* A wait that has made no progress for a while calls this: when the op has
 * been waiting long enough, tell every peer which op this rank is in (a
 * status notice; then again after 2, 4, ... up to 60 s), and read the peers'
 * notices. A peer's notice for the same op number with another signature,
 * or for an earlier op this rank ran with another signature, is
 * KT_ERR_MISMATCH: ranks that called different collectives find out even
 * when none of their messages ever reaches the other. */
KT_INTERNAL kt_result kt__net_stuck(kt__exec *ex);
/* KT_ERR_TIMEOUT for op ex, which waited for what (a phase running on
 * another thread), naming the peers not heard from since it began; detail
 * (or NULL): what that phase reported. */
KT_INTERNAL kt_result kt__net_timeout(kt__exec *ex, const char *what, const char *detail);
/* Progress until x (or all n of xs) complete. */
KT_INTERNAL kt_result kt__net_wait(kt__exec *ex, kt__xfer *x);
KT_INTERNAL kt_result kt__net_waitall(kt__exec *ex, kt__xfer *xs, int n);
/* Post a send and a receive and wait for both. */
KT_INTERNAL kt_result kt__net_sendrecv(kt__exec *ex, int dst, const void *sbuf, size_t slen,
                                       int src, void *rbuf, size_t rlen, uint32_t tag);

/* TCP transport life cycle (src/transport/tcp.c; setup in tcp.h). */
/* Drop posted transfers after a failure (the op is over). */
KT_INTERNAL void kt__tcp_reset_queues(kt__group *g);
/* graceful: tell peers goodbye so they do not report us as failed. */
KT_INTERNAL void kt__tcp_close(kt__group *g, bool graceful);
/* Best effort: tell every peer this communicator failed with code and why. */
KT_INTERNAL void kt__tcp_broadcast_abort(kt__group *g, kt_result code, const char *why);

#endif /* KT_TRANSPORT_H */
