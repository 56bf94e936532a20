/* test_tcp_stripe.c - the TCP transport's striping of long messages over a
 * pair's data connections (src/transport/tcp.c, included here to reach its
 * state), between two communicators of one process joined by socketpairs.
 *
 * Rank 0 sends rank 1 a queue of messages of awkward lengths (one unit, one
 * byte over, a short last unit, empty, one sent on one connection) over 2-4
 * connections, one of which has a send buffer a fraction of the others', and
 * with the sender's bytes produced a little at a time (x->avail, as the ring
 * streams a block it is still reducing). After every step of either side,
 * every byte a receive reports (x->done) holds what was sent. At the end:
 * every message holds its bytes, each connection received what its other end
 * sent and together the striped messages' bytes, and the narrow connection
 * carried less than the others (units go to the connection that takes them;
 * a fixed share would give each the same). A message produced slower than
 * the sockets take it is usable as it arrives (the lanes that claim nothing
 * send hints). A lane that could send has a full socket after progress (a
 * blocking wait would otherwise spin). A corrupt stream (a unit out of range
 * or descending, a bad descriptor, units missing at the end, a unit on two
 * connections where another never came) is an error
 * naming the sender, not a crash, a hang or a completed message.
 *
 * Usage: test_tcp_stripe (no arguments; exit status 0 when every check held). */
#include "../../src/transport/tcp.c"

#include <stdio.h>
#include <stdlib.h>

static int failures;
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      failures++;                                            \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);   \
      fprintf(stderr, __VA_ARGS__);                          \
      fputc('\n', stderr);                                   \
    }                                                        \
  } while (0)

static unsigned char pattern(size_t msg, size_t i) { return (unsigned char)(i * 131 + msg * 7 + (i >> 16)); }

struct side {
  kt__group c;
  kt__op op;
  kt__exec ex;
};

static void side_init(struct side *s, int rank, int lanes) {
  memset(s, 0, sizeof *s);
  s->c.rank = rank;
  s->c.size = 2;
  s->c.abort_fd = -1;
  s->c.timeout_ms = 60000;
  snprintf(s->c.prefix, sizeof s->c.prefix, "test/tcp_stripe");
  if (kt__tcp_create(&s->c, -1) != KT_SUCCESS) abort();
  s->c.tcp->peers[1 - rank].nlanes = lanes;
  s->op = (kt__op){.coll = KT_COLL_ALLGATHER, .dtype = KT_UINT8, .op = KT_SUM, .seq = 1, .root = -1};
  s->ex = (kt__exec){.group = &s->c, .op = &s->op, .deadline_ns = kt__now_ns() + 60000000000LL};
  kt__net_op_begin(&s->ex);
}

/* Join the two sides' lanes and control sockets; lane 0's send buffers are
 * narrow (narrow != 0). */
static void join(struct side *a, struct side *b, int lanes, int narrow) {
  struct peer *pa = &a->c.tcp->peers[1], *pb = &b->c.tcp->peers[0];
  for (int l = 0; l <= lanes; l++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) abort();
    int buf = l == 0 && narrow ? narrow : 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (l < lanes) {
      pa->lane[l].fd = sv[0];
      pb->lane[l].fd = sv[1];
    } else {
      pa->ctrl_fd = sv[0];
      pb->ctrl_fd = sv[1];
    }
  }
}

#define NMSG 8

static void run_case(int lanes, int narrow, size_t produce_step) {
  static const size_t lens[NMSG] = {3 * LANE_UNIT + 12345, LANE_UNIT, LANE_UNIT + 1, 0, 40 * LANE_UNIT,
                                    7 * LANE_UNIT - 1, 2 * LANE_UNIT, 5 * LANE_UNIT + 777};
  struct side a, b;
  side_init(&a, 0, lanes);
  side_init(&b, 1, lanes);
  join(&a, &b, lanes, narrow);
  unsigned char *sbuf[NMSG], *rbuf[NMSG];
  kt__xfer tx[NMSG], rx[NMSG];
  for (size_t m = 0; m < NMSG; m++) {
    sbuf[m] = malloc(lens[m] + 1);
    rbuf[m] = calloc(1, lens[m] + 1);
    if (!sbuf[m] || !rbuf[m]) abort();
    for (size_t i = 0; i < lens[m]; i++) sbuf[m][i] = pattern(m, i);
    kt__xfer_send(&tx[m], 1, sbuf[m], lens[m], (uint32_t)m);
    kt__xfer_recv(&rx[m], 0, rbuf[m], lens[m], (uint32_t)m);
    if (m == 6) tx[m].lanes = rx[m].lanes = 1; /* one connection, as halving-doubling asks */
    if (produce_step && m == 4) tx[m].avail = 0; /* produced as it goes */
    CHECK(kt__net_post(&a.ex, &tx[m]) == KT_SUCCESS, "post send %zu", m);
    CHECK(kt__net_post(&b.ex, &rx[m]) == KT_SUCCESS, "post receive %zu", m);
  }
  struct peer *pa = &a.c.tcp->peers[1], *pb = &b.c.tcp->peers[0];
  int64_t until = kt__now_ns() + 30000000000LL;
  size_t checked[NMSG] = {0};
  bool spun = false;
  size_t early = 0; /* most of message 4 reported received before its sender had produced 3/4 of it */
  for (;;) {
    kt__clear_error();
    kt_result ra = kt__net_progress(&a.ex, false);
    /* A lane that says it could send (and so would be polled for POLLOUT)
     * has a full socket after a pass of progress: else a blocking wait would
     * spin on it. */
    for (int l = 0; l < lanes && ra == KT_SUCCESS && !spun; l++) {
      struct pollfd pf = {pa->lane[l].fd, POLLOUT, 0};
      if (lane_can_send(pa, l) && poll(&pf, 1, 0) == 1 && (pf.revents & POLLOUT)) {
        CHECK(0, "%d connections: connection %d could send and its socket has room after progress", lanes, l);
        spun = true;
      }
    }
    kt_result rb = kt__net_progress(&b.ex, false);
    CHECK(ra == KT_SUCCESS && rb == KT_SUCCESS, "progress: %s", kt_last_error());
    if (ra != KT_SUCCESS || rb != KT_SUCCESS) break;
    if (produce_step && tx[4].avail < tx[4].len) {
      if (tx[4].avail < tx[4].len * 3 / 4) early = KT_MAX(early, rx[4].done);
      tx[4].avail = KT_MIN(tx[4].len, tx[4].avail + produce_step);
    }
    bool all = true;
    for (size_t m = 0; m < NMSG; m++) {
      CHECK(rx[m].done <= rx[m].len, "message %zu reports %zu of %zu bytes", m, rx[m].done, rx[m].len);
      for (; checked[m] < rx[m].done; checked[m]++)
        if (rbuf[m][checked[m]] != pattern(m, checked[m])) {
          CHECK(0, "message %zu: byte %zu reported received (done %zu) but wrong", m, checked[m], rx[m].done);
          checked[m] = rx[m].len;
          break;
        }
      all &= rx[m].complete && tx[m].complete;
    }
    if (all) break;
    if (kt__now_ns() > until) {
      CHECK(0, "%d connections: not done after 30 s", lanes);
      break;
    }
  }
  for (size_t m = 0; m < NMSG; m++) {
    CHECK(rx[m].complete && memcmp(rbuf[m], sbuf[m], lens[m]) == 0, "message %zu (%zu bytes) arrived intact", m,
          lens[m]);
    free(sbuf[m]);
    free(rbuf[m]);
  }
  uint64_t others = 0, sent = 0, received = 0, striped = 0;
  for (size_t m = 0; m < NMSG; m++)
    if (lanes_used(pa, &tx[m]) > 1) striped += lens[m];
  printf("%d connections, lane 0 send buffer %d, produced %zu at a time: KiB per connection", lanes, narrow,
         produce_step);
  for (int l = 0; l < lanes; l++) {
    printf(" %llu", (unsigned long long)(pb->lane[l].rbytes >> 10));
    CHECK(pa->lane[l].sbytes == pb->lane[l].rbytes, "connection %d: %llu bytes sent, %llu received", l,
          (unsigned long long)pa->lane[l].sbytes, (unsigned long long)pb->lane[l].rbytes);
    sent += pa->lane[l].sbytes;
    received += pb->lane[l].rbytes;
    if (l) others = KT_MAX(others, pb->lane[l].rbytes);
  }
  printf("\n");
  CHECK(sent == striped && received == striped, "striped bytes: %llu sent, %llu received, %llu in the messages",
        (unsigned long long)sent, (unsigned long long)received, (unsigned long long)striped);
  if (narrow) CHECK(pb->lane[0].rbytes < others, "the narrow connection carried less than the widest other");
  /* While a message is produced slower than the sockets take it, the lane
   * tried first claims each unit as it appears and the others claim none;
   * their hints must still let the receiver use what has arrived. */
  if (produce_step)
    CHECK(early >= lens[4] / 2, "%zu of %zu bytes of the streamed message usable before 3/4 of it was produced",
          early, lens[4]);
  kt__tcp_close(&a.c, false);
  kt__tcp_close(&b.c, false);
}

/* A corrupt stream on a 2-connection pair: lane l gets the header then
 * stream[l]; the receive must fail with KT_ERR_INTERNAL naming rank 0 and
 * saying why (want), not crash, hang or complete. */
static void corrupt_case(const char *what, size_t len, const unsigned char *stream[2], const size_t slen[2],
                         const char *want) {
  struct side b;
  side_init(&b, 1, 2);
  struct peer *pb = &b.c.tcp->peers[0];
  int far[3];
  for (int l = 0; l < 3; l++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) abort();
    int buf = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    if (l < 2) pb->lane[l].fd = sv[0];
    else pb->ctrl_fd = sv[0];
    far[l] = sv[1];
  }
  unsigned char *rbuf = malloc(len);
  kt__xfer rx;
  kt__xfer_recv(&rx, 0, rbuf, len, 5);
  CHECK(kt__net_post(&b.ex, &rx) == KT_SUCCESS, "%s: post", what);
  hdr h = op_hdr(&b.op, 5, len);
  for (int l = 0; l < 2; l++) {
    CHECK(write(far[l], &h, sizeof h) == sizeof h, "%s: write header", what);
    CHECK(write(far[l], stream[l], slen[l]) == (ssize_t)slen[l], "%s: write lane %d", what, l);
  }
  kt_result r = KT_SUCCESS;
  for (int i = 0; i < 100 && r == KT_SUCCESS && !rx.complete; i++) {
    kt__clear_error();
    r = kt__net_progress(&b.ex, false);
  }
  CHECK(r == KT_ERR_INTERNAL && strstr(kt_last_error(), "corrupt data stream from rank 0") &&
            strstr(kt_last_error(), want),
        "%s: reported as corrupt (%s): got %d, %s", what, want, (int)r, kt_last_error());
  for (int l = 0; l < 3; l++) close(far[l]);
  free(rbuf);
  kt__tcp_close(&b.c, false);
}

/* A record: descriptor (magic, unit) and n bytes of data, appended at *at. */
static size_t put_record(unsigned char *at, uint32_t magic, uint32_t unit, size_t n) {
  struct unit_desc d = {magic, unit};
  memcpy(at, &d, sizeof d);
  memset(at + sizeof d, 0x5a, n);
  return sizeof d + n;
}

static void corrupt_cases(void) {
  static unsigned char a[3 * (LANE_UNIT + 16)], b[3 * (LANE_UNIT + 16)];
  const unsigned char *st[2] = {a, b};
  size_t n[2];
  n[0] = put_record(a, UNIT_MAGIC, 7, 0); /* past the last unit of 3 */
  n[1] = put_record(b, 0x12345678, 0, 0);
  corrupt_case("unit out of range", 3 * LANE_UNIT, st, n, "unit out of order");
  n[0] = put_record(a, 0x12345678, 0, 0);
  n[1] = 0;
  corrupt_case("bad magic", 3 * LANE_UNIT, st, n, "bad record descriptor");
  n[0] = put_record(a, UNIT_MAGIC, 1, LANE_UNIT);
  n[0] += put_record(a + n[0], UNIT_MAGIC, 0, 0); /* descending */
  n[1] = 0;
  corrupt_case("descending units", 3 * LANE_UNIT, st, n, "unit out of order");
  n[0] = put_record(a, UNIT_MAGIC, 0, LANE_UNIT);
  n[0] += put_record(a + n[0], UNIT_MAGIC, UNIT_END, 0);
  n[1] = put_record(b, UNIT_MAGIC, UNIT_END, 0); /* units 1 and 2 never sent */
  corrupt_case("units missing", 3 * LANE_UNIT, st, n, "do not add up");
  n[0] = put_record(a, UNIT_MAGIC, 0, LANE_UNIT);
  n[0] += put_record(a + n[0], UNIT_MAGIC, 1, LANE_UNIT);
  n[0] += put_record(a + n[0], UNIT_MAGIC, UNIT_END, 0);
  n[1] = put_record(b, UNIT_MAGIC, 1, LANE_UNIT); /* unit 1 on both lanes, unit 2 never: the bytes add up */
  n[1] += put_record(b + n[1], UNIT_MAGIC, UNIT_END, 0);
  corrupt_case("a unit twice, another never", 3 * LANE_UNIT, st, n, "one came twice");
  n[0] = put_record(a, HINT_MAGIC, 2, 0);
  n[0] += put_record(a + n[0], UNIT_MAGIC, 1, 0); /* below its own hint */
  n[1] = 0;
  corrupt_case("unit below a hint", 3 * LANE_UNIT, st, n, "unit out of order");
}

int main(void) {
  setenv("KAITIAN_NSOCKS", "4", 1); /* room in the poll set for 4 connections */
  run_case(2, 0, 0);
  run_case(2, 16384, 0);
  run_case(3, 0, 10007);
  run_case(3, 16384, 0);
  run_case(4, 8192, 0);
  corrupt_cases();
  if (failures) fprintf(stderr, "test_tcp_stripe: %d check(s) failed\n", failures);
  else printf("test_tcp_stripe: all checks passed\n");
  return failures ? 1 : 0;
}
