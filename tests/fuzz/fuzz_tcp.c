/* fuzz_tcp.c - libFuzzer harness for what the TCP transport decodes from a
 * peer (src/transport/tcp.c, included here to reach its static functions):
 * the hello of a new connection (hello_problem: token, rank, lane, replay), message headers and striped
 * payloads on the data lanes (advance_recvs, check_header), and the control
 * stream's frames: goodbye, abort notice, status notice, send-wait notice,
 * cycle probe (handle_ctrl, check_status, check_sendwait, handle_probe).
 *
 * Each input builds rank 0 of a communicator of 2 or 3 ranks whose peer 1
 * is connected by socketpairs: 1 to 4 data lanes and a control socket. The
 * input's control bytes are written to the control socket, then end of file;
 * its data records go to the lanes, which stay open (a receive that gets too
 * little waits, it does not fail). Then rank 0 runs an op (from the input's
 * op fields) that receives a message from rank 1, and for a send also sends
 * one to it, advancing the sockets (kt__net_progress without blocking,
 * kt__net_check_peers) until an error or until nothing moves.
 *
 * Input: a 14-byte head, then the control bytes, then data records.
 *   0: mode: bits 0-1: 0 hello check, 1 receive, 2 send and receive (a kt_send,
 *      so send-wait notices apply), 3 control frames only during setup (no op);
 *      bit 2: each lane's stream starts with the header this rank expects
 *      (so that the fuzzer reaches the payloads)
 *   1: bits 0-1: lanes - 1; bit 2: 3 ranks
 *   2-6: the op: collective, dtype, reduction, sequence number, root
 *   7-8: tag; 9-11: message length (at most 300,000 bytes); 12-13: control bytes
 *   data records: lane (byte), length (2 bytes), bytes.
 * Hello mode: the rest is a struct hello whose token is XORed with the
 * communicator's (0 is the right token), then a byte whose bit 0 pretends
 * the connection it names is made already (a replay).
 * Checks besides crashes and sanitizer reports: an accepted hello names a
 * higher rank of the communicator and a lane it has; every error is a known
 * code with a message; a received message never reports more bytes than its
 * length, and a complete one of a single lane holds the bytes that followed
 * its header; an abort notice's text, kept, ends within its bound. */
#include "../../src/transport/tcp.c"

#include <stdint.h>

#define HEAD 14
#define MAX_LEN 300000

#define FUZZ_NAME "fuzz_tcp"
#include "fuzz_common.h"

static void hello_mode(kt__group *c, const uint8_t *p, size_t n) {
  struct hello h;
  memset(&h, 0, sizeof h);
  memcpy(&h, p, KT_MIN(n, sizeof h));
  for (size_t i = 0; i < sizeof h.token; i++) h.token[i] ^= c->tcp->token[i];
  /* Some lanes already connected: a hello for one of them is a replay. */
  if (n > sizeof h && (p[sizeof h] & 1) && h.rank > 0 && h.rank < c->size) {
    if (h.kind == CONN_CTRL) c->tcp->peers[h.rank].ctrl_fd = 0;
    else if (h.lane < KT_TCP_MAX_LANES) c->tcp->peers[h.rank].lane[h.lane].fd = 0;
  }
  const char *why = hello_problem(c, &h);
  if (why) {
    check(why[0] != '\0', "a rejection says why");
  } else {
    check(h.magic == HELLO_MAGIC && memcmp(h.token, c->tcp->token, sizeof h.token) == 0, "the magic and the token");
    check(h.rank > c->rank && h.rank < c->size, "a higher rank of the communicator");
    check(h.kind == CONN_CTRL || (h.kind == CONN_DATA && h.lane < (uint32_t)c->tcp->peers[h.rank].nlanes &&
                                  h.lane < KT_TCP_MAX_LANES),
          "a connection the pair has");
    int fd = h.kind == CONN_CTRL ? c->tcp->peers[h.rank].ctrl_fd : c->tcp->peers[h.rank].lane[h.lane].fd;
    check(fd < 0, "a connection not yet made");
  }
  for (int r = 0; r < c->size; r++) { /* undo the pretend connections */
    c->tcp->peers[r].ctrl_fd = -1;
    for (int l = 0; l < KT_TCP_MAX_LANES; l++) c->tcp->peers[r].lane[l].fd = -1;
  }
}

/* The lane bytes written, for the content check (lane 0 only). */
static uint8_t lane0[8192];
static size_t lane0_len;

static void feed(int fd, int lane, const void *p, size_t n) {
  if (n && send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)n) abort();
  if (lane == 0 && lane0_len + n <= sizeof lane0) memcpy(lane0 + lane0_len, p, n);
  if (lane == 0) lane0_len += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < HEAD || size > 8192) return 0;
  const int mode = data[0] & 3, lanes = (data[1] & 3) + 1, nranks = data[1] & 4 ? 3 : 2;
  kt__group c;
  memset(&c, 0, sizeof c);
  c.rank = 0;
  c.size = nranks;
  c.abort_fd = -1;
  snprintf(c.prefix, sizeof c.prefix, "fuzz/tcp");
  if (kt__tcp_create(&c, -1) != KT_SUCCESS) abort();
  struct kt__tcp *t = c.tcp;
  for (size_t i = 0; i < sizeof t->token; i++) t->token[i] = (uint8_t)(0x5a + 7 * i); /* a fixed token */
  for (int i = 1; i < nranks; i++) t->peers[i].nlanes = i == 1 ? lanes : 1;
  if (mode == 0) {
    hello_mode(&c, data + HEAD, size - HEAD);
    kt__tcp_close(&c, false);
    return 0;
  }
  int far[KT_TCP_MAX_LANES + 1]; /* the peer's ends: lanes, then control */
  struct peer *p = &t->peers[1];
  for (int l = 0; l <= lanes; l++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) abort();
    if (l < lanes) p->lane[l].fd = sv[0];
    else p->ctrl_fd = sv[0];
    far[l] = sv[1];
  }
  size_t counts[3] = {0, 0, 0};
  kt__op op = {.coll = (kt__coll)(data[2] % KT_COLL_COUNT), .dtype = (kt_dtype)(data[3] % KT_NUM_DTYPES),
               .op = (kt_op)(data[4] % KT_NUM_OPS), .seq = data[5], .root = data[6] % nranks,
               .tag = (int)get_le(data + 7, 2), .counts = counts};
  if (mode == 2) {
    op.coll = KT_COLL_SEND;
    op.root = 1;
  }
  size_t len = get_le(data + 9, 3) % (MAX_LEN + 1);
  size_t clen = KT_MIN(get_le(data + 12, 2), size - HEAD);
  kt__exec ex = {.group = &c, .op = mode == 3 ? NULL : &op, .deadline_ns = kt__now_ns() + 10000000000LL};

  kt__xfer rx, tx;
  char *rbuf = malloc(len ? len : 1), *sbuf = calloc(1, len ? len : 1);
  if (!rbuf || !sbuf) abort();
  if (mode != 3) {
    kt__net_op_begin(&ex);
    if (mode == 2) {
      kt__xfer_send(&tx, 1, sbuf, len, (uint32_t)op.tag);
      check(kt__net_post(&ex, &tx) == KT_SUCCESS, "post a send");
    }
    kt__xfer_recv(&rx, 1, rbuf, len, (uint32_t)op.tag);
    check(kt__net_post(&ex, &rx) == KT_SUCCESS, "post a receive");
  }
  /* The peer's bytes. */
  lane0_len = 0;
  if (data[0] & 4 && mode != 3) {
    hdr want = op_hdr(&op, (uint32_t)op.tag, len);
    for (int l = 0; l < lanes_used(p, &rx); l++) feed(far[l], l, &want, sizeof want);
  }
  feed(far[lanes], -1, data + HEAD, clen);
  shutdown(far[lanes], SHUT_WR);
  for (const uint8_t *r = data + HEAD + clen; r + 3 <= data + size;) {
    int lane = r[0] % lanes;
    size_t n = KT_MIN(get_le(r + 1, 2), (size_t)(data + size - r - 3));
    feed(far[lane], lane, r + 3, n);
    r += 3 + n;
  }

  kt_result res = KT_SUCCESS;
  for (int k = 0; k < 64 && res == KT_SUCCESS; k++) {
    kt__clear_error();
    res = ex.op ? kt__net_progress(&ex, false) : KT_SUCCESS;
    if (res == KT_SUCCESS) res = kt__net_check_peers(&ex);
    if (p->ctrl_fd < 0 && (!ex.op || rx.complete)) break; /* said goodbye, nothing left to read */
  }
  if (res != KT_SUCCESS) {
    check(res > KT_SUCCESS && res <= KT_ERR_INTERNAL, "a known result code");
    check(kt_last_error()[0] != '\0', "an error has a message");
  }
  if (p->abort_msg) check(strlen(p->abort_msg) < KT_TCP_CTRL_TEXT, "an abort notice's text within its bound");
  if (ex.op) {
    check(rx.done <= rx.len, "no more received than the message's length");
    if (rx.complete && lanes_used(p, &rx) == 1 && lane0_len <= sizeof lane0) {
      check(lane0_len >= KT_NET_HDR_BYTES + len, "a complete message had all its bytes");
      check(memcmp(rbuf, lane0 + KT_NET_HDR_BYTES, len) == 0, "it holds the bytes after its header");
    }
  }
  free(rbuf);
  free(sbuf);
  for (int l = 0; l <= lanes; l++) close(far[l]);
  kt__tcp_close(&c, false);
  return 0;
}
