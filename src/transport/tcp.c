/* tcp.c - TCP transport: a full mesh of non-blocking sockets, two per peer
 * pair. The data socket carries framed messages in issue order; the control
 * socket carries goodbyes, abort notices and status notices, so that a peer
 * that dies (EOF or reset on its control socket without a goodbye) is noticed
 * by every rank during any wait, whatever it is waiting for, and so that ranks
 * stuck in different collectives find out (kt__net_stuck). */
#include "transport.h"
#include "tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#define HDR_MAGIC 0x4B54u /* "KT" */
#define HELLO_MAGIC 0x4B544845u
#define CTRL_MAGIC 0x4B544354u
enum { CONN_DATA = 1, CONN_CTRL = 2 };
enum { CTRL_BYE = 1, CTRL_ABORT = 2, CTRL_STATUS = 3, CTRL_SENDWAIT = 4, CTRL_PROBE = 5 };

/* A send-wait notice: the sender's message number msg to the receiver (its
 * place in the pair's issue order, from 0), of len bytes, has made no progress
 * for a second while the sender ran kt_send. */
struct sendwait {
  uint64_t msg, len;
};

/* A cycle probe: sends that wait for each other around a cycle of three or
 * more ranks (a pair is the send-wait notice's case). A rank whose kt_send
 * has stalled sends one to its receiver (pass 1, hop[0] itself); a receiver
 * stalled in its own kt_send adds itself and passes it on to its receiver,
 * until it comes back to the rank that began it. That rank, still stalled
 * with nothing moved, sends it around once more (pass 2): each rank checks
 * that its send has not moved either since pass 1. When it comes back again,
 * every send of the cycle stood still over one common moment, while each
 * waited for the next rank, which was sending: none of them can complete. */
#define PROBE_HOPS 16
struct probe_hop {
  int32_t rank;
  uint32_t pad;
  uint64_t msg, done; /* its stalled send: message number to the next rank, bytes moved */
};
struct probe {
  uint32_t pass; /* 1 or 2 */
  uint32_t hops; /* entries of hop[] in use (pass 1: so far) */
  uint32_t at;   /* pass 2: index of the hop it goes to (hops: back to hop[0]) */
  uint32_t pad;
  struct probe_hop hop[PROBE_HOPS];
};
#define PROBE_BYTES(n) (offsetof(struct probe, hop) + (size_t)(n) * sizeof(struct probe_hop))

/* The first bytes of every mesh connection, from the connecting (higher)
 * rank. token: the communicator's random token (rank 0's kt__tcp_addr.token),
 * which only the job can read; compared in constant time. */
struct hello {
  uint32_t magic;
  uint32_t kind;
  int32_t rank;
  uint32_t lane; /* CONN_DATA: which of the pair's data connections */
  uint8_t token[KT_TCP_TOKEN_BYTES];
};

struct ctrl_frame {
  uint32_t magic;
  uint32_t type;
  int32_t code;
  uint32_t len; /* bytes of text that follow, < KT_TCP_CTRL_TEXT */
};
#define KT_TCP_CTRL_TEXT 900
#define KT_TCP_MIN_SOCKBUF 65536

/* A data connection of a peer pair. A message longer than one LANE_UNIT is
 * striped over the pair's lanes (see "data path" below): every lane sends the
 * message's header, then records of the units it claims, then an end record.
 * Each lane streams the posted messages in issue order, independently of the
 * others; a message is complete when every lane is past it. */
struct unit_desc {
  uint32_t magic; /* UNIT_MAGIC, or HINT_MAGIC: no bytes follow, and the lane's next unit is unit or later */
  uint32_t unit;  /* index of the unit whose bytes follow; UNIT_END: none follow, the lane is done */
};
#define UNIT_MAGIC 0x4b54554eu
#define HINT_MAGIC 0x4b54484eu
#define UNIT_END UINT32_MAX
#define UNIT_HINT (UINT32_MAX - 1) /* lane state su: the record being sent is a hint */
#define HINT_UNITS 2               /* a lane that claims nothing says so once claims passed it by this many */

struct lane {
  int fd;
  kt__xfer *scur, *rcur; /* the message this lane sends / receives now; NULL: past all posted */
  size_t shdr, rhdr;     /* header bytes sent / received */
  size_t sdone, rdone;   /* bytes sent / received: of the message (one lane), of unit su / ru (striped) */
  /* striped messages */
  bool srec;             /* a record is partly sent: unit su (or the end record), sdesc bytes of sd */
  bool rin;              /* receiving unit ru's bytes (else its descriptor: rdesc bytes of rd so far) */
  uint32_t su, ru;
  size_t sdesc, rdesc;
  size_t rlow;           /* receive: what this lane has yet to deliver of rcur lies at or above (its last
                            unit's end, or its last hint) */
  size_t shint;          /* send: units below this one the receiver knows this lane will not send */
  struct unit_desc sd, rd;
  uint64_t sbytes, rbytes; /* bytes of striped messages sent / received on it (logged at close, with INFO) */
  unsigned char rhbuf[KT_NET_HDR_BYTES];
};

#define KT_TCP_MAX_LANES 16
#define LANE_UNIT ((size_t)65536) /* bytes of a striped message a lane claims at a time */
#define LANE_IOV 64               /* units one sendmsg moves at most */

struct peer {
  int nlanes; /* 1 to a rank on this host; else the smaller KAITIAN_NSOCKS of both ends */
  struct lane lane[KT_TCP_MAX_LANES];
  int ctrl_fd;
  kt__xfer *sq_head, *sq_tail; /* sends, in issue order */
  kt__xfer *rq_head, *rq_tail; /* receives, in issue order */
  uint64_t tx_posted, rx_done; /* messages posted to it; messages from it received */
  bool said_bye;
  int64_t heard_ns;     /* when a byte last came from it, on any of its sockets (describe_timeout) */
  kt_result abort_code; /* its abort notice, once read: what it reported ... */
  char *abort_msg;      /* ... and why (kept: its connection closing next is no news) */
  size_t ctrl_fill;
  unsigned char ctrl_buf[sizeof(struct ctrl_frame) + KT_TCP_CTRL_TEXT];
};

#define KT_TCP_HIST 64                  /* signatures of recent collectives kept */
#define STATUS_FIRST_NS 1000000000LL    /* an op waits this long before its first status notice */
#define STATUS_MAX_NS 60000000000LL     /* notices then double their interval up to this */
#define POLL_SLICE_MS 250               /* longest sleep of a wait between checks */
#define TCP_SPIN_CAP_NS 10000000LL      /* KAITIAN_TCP_SPIN_NS above this is cut to it */

struct kt__tcp {
  int nranks;
  int listen_fd;
  struct peer *peers;
  struct pollfd *pfds; /* scratch for poll: 2 per peer + abort fd */
  int *pfd_peer;
  uint8_t token[KT_TCP_TOKEN_BYTES]; /* the hello token (set by kt__tcp_mesh) */
  kt__sig hist[KT_TCP_HIST];      /* recent collectives, by seq % KT_TCP_HIST */
  int64_t next_status_ns;         /* when the op in progress sends its next status notice */
  int64_t status_gap_ns;
  int64_t sendwait_ns;            /* when a stalled kt_send tells its receiver (CTRL_SENDWAIT, CTRL_PROBE) */
  int64_t sendwait_gap_ns;
  int64_t spin_ns;       /* KAITIAN_TCP_SPIN_NS (at most TCP_SPIN_CAP_NS) */
  int64_t idle_since_ns; /* when progress last found nothing to move (0: it moved since) */
};

/* ---- headers ------------------------------------------------------------ */

/* Header: magic, collective, tag, sequence, length, and the op's signature
 * (dtype, reduction, root) so that ranks disagreeing on any of them are
 * caught, not only on the collective and size. */
typedef struct hdr {
  uint16_t magic, coll;
  uint32_t tag;
  uint64_t seq, len;
  uint8_t dtype, op;
  uint16_t pad;
  int32_t root;
} hdr;
_Static_assert(sizeof(hdr) == KT_NET_HDR_BYTES, "header size");

static hdr op_hdr(const kt__op *op, uint32_t tag, uint64_t len) {
  bool rooted = op->coll == KT_COLL_BROADCAST || op->coll == KT_COLL_REDUCE ||
                op->coll == KT_COLL_GATHER || op->coll == KT_COLL_SCATTER;
  bool reduces = op->coll == KT_COLL_ALLREDUCE || op->coll == KT_COLL_REDUCE ||
                 op->coll == KT_COLL_REDUCE_SCATTER;
  return (hdr){.magic = HDR_MAGIC, .coll = (uint16_t)op->coll, .tag = tag, .seq = op->seq, .len = len,
               .dtype = (uint8_t)op->dtype, .op = reduces ? (uint8_t)op->op : 0xff,
               .root = rooted ? op->root : -1};
}

static const char *coll_name_safe(uint16_t c) {
  return c < KT_COLL_COUNT ? kt__coll_name((kt__coll)c) : "unknown-op";
}

/* ---- failure messages --------------------------------------------------- */

static kt_result handle_ctrl(kt__exec *ex, int peer);
static void send_ctrl_bytes(int fd, uint32_t type, kt_result code, const void *data, size_t len);
static bool ctrl_backlogged(int fd);

/* A data connection failed. A peer that breaks a connection without a
 * goodbye has usually failed itself because a third rank died, and has said so
 * on its control socket (or the dead rank's control socket shows the death):
 * give those notices a moment to arrive and report the root cause rather than
 * the messenger. */
static kt_result find_root_cause(kt__exec *ex, int64_t wait_ms) {
  struct kt__tcp *t = ex->group->tcp;
  int64_t until = kt__now_ns() + wait_ms * 1000000;
  for (;;) {
    int n = 0;
    for (int i = 0; i < t->nranks; i++) {
      if (t->peers[i].ctrl_fd < 0) continue;
      t->pfds[n] = (struct pollfd){t->peers[i].ctrl_fd, POLLIN, 0};
      t->pfd_peer[n++] = i;
    }
    int64_t left = (until - kt__now_ns()) / 1000000;
    int r;
    KT_SYSCALL_RETRY(r, poll(t->pfds, (nfds_t)n, (int)KT_MAX(left, 0)));
    if (r <= 0) return KT_SUCCESS;
    for (int k = 0; k < n; k++)
      if (t->pfds[k].revents) KT_CHECK(handle_ctrl(ex, t->pfd_peer[k]));
    if (left <= 0) return KT_SUCCESS;
  }
}

static kt_result peer_lost(kt__exec *ex, int peer, const char *what, int err) {
  kt__group *c = ex->group;
  char who[128];
  kt__peer_desc(c, peer, who, sizeof who);
  if (c->tcp->peers[peer].said_bye)
    return kt__err(KT_ERR_PEER_FAILED,
                   "%s destroyed its communicator while this rank still expected data (%s)", who,
                   what);
  KT_CHECK(find_root_cause(ex, 500));
  if (err)
    return kt__err(KT_ERR_PEER_FAILED, "%s failed: %s (%s)", who, what, strerror(err));
  return kt__err(KT_ERR_PEER_FAILED, "%s failed: %s", who, what);
}

static void describe_hdr(const hdr *h, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "op #%llu %s, %llu bytes, tag %u", (unsigned long long)h->seq,
                   coll_name_safe(h->coll), (unsigned long long)h->len, h->tag);
  if (n > 0 && (size_t)n < cap && h->dtype < KT_NUM_DTYPES)
    n += snprintf(buf + n, cap - (size_t)n, ", %s", kt_dtype_name((kt_dtype)h->dtype));
  if (n > 0 && (size_t)n < cap && h->op != 0xff)
    n += snprintf(buf + n, cap - (size_t)n, ", %s", kt_op_name((kt_op)h->op));
  if (n > 0 && (size_t)n < cap && h->root >= 0) snprintf(buf + n, cap - (size_t)n, ", root %d", h->root);
}

static kt_result check_header(kt__exec *ex, int peer, const kt__xfer *x, const unsigned char *raw) {
  hdr got;
  memcpy(&got, raw, sizeof got);
  if (got.magic != HDR_MAGIC)
    return kt__err(KT_ERR_INTERNAL, "corrupt message header from rank %d (magic 0x%x)", kt__rank_label(ex->group, peer),
                   got.magic);
  const kt__op *op = ex->op;
  hdr want = op_hdr(op, x->tag, x->len);
  /* Point-to-point messages match by kind, tag, length and dtype only: ranks
   * issue different numbers of them, so sequence numbers are not compared. */
  bool p2p = op->coll == KT_COLL_SEND || op->coll == KT_COLL_RECV || op->coll == KT_COLL_SENDRECV;
  bool got_p2p = got.coll == KT_COLL_SEND || got.coll == KT_COLL_RECV || got.coll == KT_COLL_SENDRECV;
  bool same = p2p ? got_p2p && got.tag == want.tag && got.len == want.len && got.dtype == want.dtype
                  : got.coll == want.coll && got.seq == want.seq && got.tag == want.tag &&
                        got.len == want.len && got.dtype == want.dtype && got.op == want.op &&
                        got.root == want.root;
  if (same) return KT_SUCCESS;
  if (p2p) want.seq = got_p2p ? got.seq : want.seq; /* not part of the p2p signature */
  char who[128], mine[192], theirs[192];
  kt__peer_desc(ex->group, peer, who, sizeof who);
  describe_hdr(&want, mine, sizeof mine);
  describe_hdr(&got, theirs, sizeof theirs);
  return kt__err(KT_ERR_MISMATCH,
                 "mismatched operations: this rank expected (%s) from %s, which sent (%s)", mine,
                 who, theirs);
}

/* ---- data path ---------------------------------------------------------- */

/* A message of up to one LANE_UNIT, or one to go on one connection (x->lanes
 * == 1, or a pair with one), goes as its header and its bytes. A longer one is
 * striped over the pair's lanes: every lane sends the header, then a record (a
 * struct unit_desc and the unit's bytes) for each unit it claims, then the end
 * record. A lane claims the message's next unclaimed unit whenever its socket
 * takes bytes, so the connection the link serves faster carries more of the
 * message and the lanes finish together: with a fixed half each, the slower of
 * two flows on a shaped 1 Gbit/s link finished 8-10 ms behind the other per
 * 8 MiB message. Units go out in the order they are claimed, so the units of
 * any one lane ascend, and a receiver knows that nothing a lane has yet to
 * deliver lies below that lane's last unit (recv_prefix). */

static size_t units_of(size_t len) { return (len + LANE_UNIT - 1) / LANE_UNIT; }
static size_t unit_len(const kt__xfer *x, size_t u) { return KT_MIN(LANE_UNIT, x->len - u * LANE_UNIT); }

/* A unit's number mixed to 64 bits (splitmix64's finalizer). A striped
 * receive sums it over the units it begins. Each lane's units ascend, so a
 * unit can come twice only on two lanes; if another unit then never came,
 * the bytes still add up to the message, but the sum differs from the sum
 * over units 0..n-1 (except with a chance of 2^-64). It needs no memory per
 * unit: a receive's state lives in its xfer, gone once its op has failed. */
static uint64_t unit_mix(uint64_t u) {
  u += 0x9e3779b97f4a7c15ull;
  u = (u ^ (u >> 30)) * 0xbf58476d1ce4e5b9ull;
  u = (u ^ (u >> 27)) * 0x94d049bb133111ebull;
  return u ^ (u >> 31);
}

static bool units_each_once(const kt__xfer *x) {
  uint64_t want = 0;
  for (size_t u = 0, n = units_of(x->len); u < n; u++) want += unit_mix(u);
  return x->units_mix == want;
}

/* Lanes message x travels on: the pair's (at most x->lanes, and one per unit). */
static int lanes_used(const struct peer *p, const kt__xfer *x) {
  size_t most = x->lanes > 0 ? (size_t)KT_MIN(x->lanes, p->nlanes) : (size_t)p->nlanes;
  return (int)KT_MAX((size_t)1, KT_MIN(most, units_of(x->len)));
}

kt_result kt__net_post(kt__exec *ex, kt__xfer *x) {
  struct kt__tcp *t = ex->group->tcp;
  if (x->peer < 0 || x->peer >= t->nranks || x->peer == ex->group->rank)
    return kt__err(KT_ERR_INTERNAL, "transfer to invalid peer %d", x->peer);
  if (units_of(x->len) >= UNIT_HINT)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "a message of %zu bytes to rank %d is too large for TCP (at most %zu)",
                   x->len, kt__rank_label(ex->group, x->peer), (size_t)(UNIT_HINT - 1) * LANE_UNIT);
  struct peer *p = &t->peers[x->peer];
  x->next = NULL;
  x->complete = false;
  x->done = 0;
  x->next_unit = 0;
  x->got = 0;
  x->units_mix = 0;
  x->lanes_left = p->nlanes;
  if (x->is_send) {
    x->msg = p->tx_posted++;
    hdr h = op_hdr(ex->op, x->tag, x->len);
    memcpy(x->hdr, &h, sizeof h);
    if (p->sq_tail) p->sq_tail->next = x; else p->sq_head = x;
    p->sq_tail = x;
    for (int s = 0; s < p->nlanes; s++)
      if (!p->lane[s].scur) p->lane[s].scur = x;
  } else {
    if (p->rq_tail) p->rq_tail->next = x; else p->rq_head = x;
    p->rq_tail = x;
    for (int s = 0; s < p->nlanes; s++)
      if (!p->lane[s].rcur) p->lane[s].rcur = x;
  }
  return KT_SUCCESS;
}

/* Lane s is past x: x is complete once every lane is. Lanes move in issue
 * order, so the message completing is always the queue's head. */
static void lane_passed(kt__xfer **head, kt__xfer **tail, kt__xfer *x) {
  if (--x->lanes_left > 0) return;
  x->complete = true;
  x->done = x->len;
  *head = x->next;
  if (!*head) *tail = NULL;
}

/* Is the lane's record in progress all sent? */
static bool record_sent(const struct lane *l, const kt__xfer *x) {
  return l->sdesc == sizeof l->sd && (l->su >= UNIT_HINT || l->sdone == unit_len(x, l->su));
}

/* Does lane s have bytes of its current send that it could write now? */
static bool lane_can_send(const struct peer *p, int s) {
  const struct lane *l = &p->lane[s];
  const kt__xfer *x = l->scur;
  if (!x) return false;
  int n = lanes_used(p, x);
  if (s >= n || l->shdr < KT_NET_HDR_BYTES) return true; /* past it at once; its header */
  if (n == 1) return l->sdone < x->avail;
  if (l->srec) return l->sdesc < sizeof l->sd || l->su >= UNIT_HINT || l->su * LANE_UNIT + l->sdone < x->avail;
  /* the end, a unit, or a hint (send_striped) */
  return x->next_unit == units_of(x->len) || x->next_unit * LANE_UNIT < x->avail ||
         x->next_unit >= l->shint + HINT_UNITS;
}

/* One lane's send of x, all of it: *past once done. */
static kt_result send_whole(kt__exec *ex, int peer, struct lane *l, kt__xfer *x, bool *moved, bool *past) {
  for (;;) {
    struct iovec iov[2];
    int k = 0;
    if (l->shdr < KT_NET_HDR_BYTES) iov[k++] = (struct iovec){x->hdr + l->shdr, KT_NET_HDR_BYTES - l->shdr};
    if (l->sdone < x->avail) iov[k++] = (struct iovec){x->buf + l->sdone, x->avail - l->sdone};
    *past = k == 0 && l->sdone == x->len;
    if (k == 0) return KT_SUCCESS; /* done, or waiting for the producer */
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t w;
    KT_SYSCALL_RETRY(w, sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT));
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return KT_SUCCESS;
      return peer_lost(ex, peer, "sending data", errno);
    }
    size_t h = KT_MIN((size_t)w, KT_NET_HDR_BYTES - l->shdr);
    l->shdr += h;
    l->sdone += (size_t)w - h;
    x->done += (size_t)w - h;
    *moved = true;
  }
}

/* One lane's part of striped x: the header, the record in progress, records
 * of units claimed now (as many as the socket takes; the ones it did not take
 * go back), and the end record once no unit is left. *past once that is sent. */
static kt_result send_striped(kt__exec *ex, int peer, struct lane *l, kt__xfer *x, bool *moved, bool *past) {
  size_t units = units_of(x->len);
  *past = false;
  for (;;) {
    struct iovec iov[2 * LANE_IOV + 4];
    struct unit_desc nd[LANE_IOV + 1]; /* records begun now (the last may be the end record) */
    size_t nbytes[LANE_IOV + 1];       /* ... and their bytes of data in iov */
    int k = 0, m = 0;
    size_t total = 0, hrem = KT_NET_HDR_BYTES - l->shdr, cdesc = 0, cdata = 0;
    bool open = false; /* the last record in iov stops short (its bytes are not all produced yet) */
    if (hrem) iov[k++] = (struct iovec){x->hdr + l->shdr, hrem};
    if (l->srec) {
      cdesc = sizeof l->sd - l->sdesc;
      if (cdesc) iov[k++] = (struct iovec){(char *)&l->sd + l->sdesc, cdesc};
      if (l->su < UNIT_HINT) {
        size_t off = l->su * LANE_UNIT, end = off + unit_len(x, l->su), lim = KT_MIN(end, x->avail);
        if (off + l->sdone < lim) {
          cdata = lim - off - l->sdone;
          iov[k++] = (struct iovec){x->buf + off + l->sdone, cdata};
        }
        open = lim < end;
      }
    }
    size_t first = x->next_unit;
    while (!open && m < LANE_IOV && x->next_unit < units && x->next_unit * LANE_UNIT < x->avail) {
      size_t u = x->next_unit++, off = u * LANE_UNIT, end = off + unit_len(x, u), lim = KT_MIN(end, x->avail);
      nd[m] = (struct unit_desc){UNIT_MAGIC, (uint32_t)u};
      nbytes[m] = lim - off;
      iov[k++] = (struct iovec){&nd[m], sizeof nd[m]};
      iov[k++] = (struct iovec){x->buf + off, lim - off};
      open = lim < end;
      m++;
    }
    int records = m;
    if (!open && x->next_unit == units && !(l->srec && l->su == UNIT_END)) {
      nd[m] = (struct unit_desc){UNIT_MAGIC, UNIT_END};
      nbytes[m] = 0;
      iov[k++] = (struct iovec){&nd[m], sizeof nd[m]};
      records++;
    } else if (m == 0 && !l->srec && x->next_unit >= l->shint + HINT_UNITS) {
      /* Claiming nothing while other lanes claim units as the producer makes
       * them (lane 0, tried first, often takes them all): tell the receiver
       * that this lane sends nothing below x->next_unit, or its prefix
       * (recv_prefix) would stay at this lane's last unit until the end. */
      nd[m] = (struct unit_desc){HINT_MAGIC, (uint32_t)x->next_unit};
      nbytes[m] = 0;
      iov[k++] = (struct iovec){&nd[m], sizeof nd[m]};
      records++;
    }
    if (k == 0) return KT_SUCCESS; /* waiting for the producer */
    for (int i = 0; i < k; i++) total += iov[i].iov_len;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t w;
    KT_SYSCALL_RETRY(w, sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT));
    if (w < 0) {
      x->next_unit = first; /* none of the units claimed now went */
      if (errno == EAGAIN || errno == EWOULDBLOCK) return KT_SUCCESS;
      return peer_lost(ex, peer, "sending data", errno);
    }
    *moved = true;
    size_t rem = (size_t)w, d = KT_MIN(rem, hrem);
    l->shdr += d;
    rem -= d;
    if (l->srec) {
      d = KT_MIN(rem, cdesc);
      l->sdesc += d;
      rem -= d;
      d = KT_MIN(rem, cdata);
      l->sdone += d;
      l->sbytes += d;
      x->done += d;
      rem -= d;
      if (record_sent(l, x)) l->srec = false, *past = l->su == UNIT_END;
    }
    for (int i = 0; i < records && !*past; i++) {
      if (rem == 0) { /* the socket took none of record i: its unit and the ones after go back */
        if (i < m) x->next_unit = nd[i].unit;
        break;
      }
      l->srec = true;
      l->su = nd[i].magic == HINT_MAGIC ? UNIT_HINT : nd[i].unit;
      l->sd = nd[i];
      if (l->su < UNIT_HINT) l->shint = (size_t)l->su + 1;
      else if (l->su == UNIT_HINT) l->shint = nd[i].unit;
      l->sdesc = KT_MIN(rem, sizeof nd[i]);
      rem -= l->sdesc;
      l->sdone = KT_MIN(rem, nbytes[i]);
      l->sbytes += l->sdone;
      x->done += l->sdone;
      rem -= l->sdone;
      if (record_sent(l, x)) l->srec = false, *past = l->su == UNIT_END;
    }
    if (*past || (size_t)w < total) return KT_SUCCESS; /* done, or the socket is full */
  }
}

static kt_result advance_sends(kt__exec *ex, int peer, int s, bool *moved) {
  struct peer *p = &ex->group->tcp->peers[peer];
  struct lane *l = &p->lane[s];
  kt__xfer *x;
  while ((x = l->scur) != NULL) {
    int n = lanes_used(p, x);
    bool past = s >= n; /* carries no part */
    if (!past && n == 1) KT_CHECK(send_whole(ex, peer, l, x, moved, &past));
    else if (!past) KT_CHECK(send_striped(ex, peer, l, x, moved, &past));
    if (!past) return KT_SUCCESS;
    l->scur = x->next;
    l->shdr = l->sdone = l->sdesc = l->shint = 0;
    l->srec = false;
    lane_passed(&p->sq_head, &p->sq_tail, x);
  }
  return KT_SUCCESS;
}

/* Bytes of striped x received from its start without a gap (what a consumer
 * may use): below the least that any of its lanes may still deliver. */
static size_t recv_prefix(const struct peer *p, const kt__xfer *x, int n) {
  size_t prefix = x->len;
  for (int s = 0; s < n; s++) {
    const struct lane *l = &p->lane[s];
    size_t at;
    if (l->rcur == x)
      at = l->rin ? l->ru * LANE_UNIT + l->rdone : l->rlow;
    else { /* before x (nothing of it yet) or past it (all of its part) */
      bool past = true;
      for (const kt__xfer *y = l->rcur; y; y = y->next)
        if (y == x) past = false;
      at = past ? x->len : 0;
    }
    prefix = KT_MIN(prefix, at);
  }
  return prefix;
}

/* readv on lane l into iov: *got bytes (0: none there now); a closed or
 * broken connection is the peer lost. */
static kt_result lane_read(kt__exec *ex, int peer, struct lane *l, struct iovec *iov, int k, ssize_t *got) {
  ssize_t r;
  KT_SYSCALL_RETRY(r, readv(l->fd, iov, k));
  *got = 0;
  if (r == 0) return peer_lost(ex, peer, "connection closed while receiving", 0);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return KT_SUCCESS;
    return peer_lost(ex, peer, "receiving data", errno);
  }
  ex->group->tcp->peers[peer].heard_ns = kt__now_ns();
  *got = r;
  return KT_SUCCESS;
}

/* One lane's receive of x, all of it: *past once done. */
static kt_result recv_whole(kt__exec *ex, int peer, struct lane *l, kt__xfer *x, bool *moved,
                            bool *past) {
  for (;;) {
    *past = l->rhdr == KT_NET_HDR_BYTES && l->rdone == x->len;
    if (*past) return KT_SUCCESS;
    bool had_hdr = l->rhdr == KT_NET_HDR_BYTES;
    struct iovec iov[2];
    int k = 0;
    if (!had_hdr) iov[k++] = (struct iovec){l->rhbuf + l->rhdr, KT_NET_HDR_BYTES - l->rhdr};
    if (l->rdone < x->len) iov[k++] = (struct iovec){x->buf + l->rdone, x->len - l->rdone};
    ssize_t r;
    KT_CHECK(lane_read(ex, peer, l, iov, k, &r));
    if (r == 0) return KT_SUCCESS; /* nothing there now */
    size_t h = KT_MIN((size_t)r, KT_NET_HDR_BYTES - l->rhdr);
    l->rhdr += h;
    l->rdone += (size_t)r - h;
    x->done = l->rdone;
    *moved = true;
    if (!had_hdr && l->rhdr == KT_NET_HDR_BYTES) KT_CHECK(check_header(ex, peer, x, l->rhbuf));
  }
}

static kt_result corrupt_stream(kt__exec *ex, int peer, int s, const kt__xfer *x, const char *what) {
  return kt__err(KT_ERR_INTERNAL, "corrupt data stream from rank %d (connection %d, message of %zu bytes): %s",
                 kt__rank_label(ex->group, peer), s, x->len, what);
}

/* One lane's part of striped x: the header, then records until the end
 * record (*past). Each read takes the rest of the unit in progress and the
 * next record's descriptor, which tells where the bytes after it go. */
static kt_result recv_striped(kt__exec *ex, int peer, struct peer *p, int s, kt__xfer *x, int n, bool *moved,
                              bool *past) {
  struct lane *l = &p->lane[s];
  size_t units = units_of(x->len);
  *past = false;
  for (;;) {
    bool had_hdr = l->rhdr == KT_NET_HDR_BYTES;
    struct iovec iov[3];
    int k = 0;
    size_t hrem = KT_NET_HDR_BYTES - l->rhdr, drem = 0, total = 0;
    if (hrem) iov[k++] = (struct iovec){l->rhbuf + l->rhdr, hrem};
    if (l->rin) {
      drem = unit_len(x, l->ru) - l->rdone;
      iov[k++] = (struct iovec){x->buf + l->ru * LANE_UNIT + l->rdone, drem};
      iov[k++] = (struct iovec){&l->rd, sizeof l->rd};
    } else {
      iov[k++] = (struct iovec){(char *)&l->rd + l->rdesc, sizeof l->rd - l->rdesc};
    }
    for (int i = 0; i < k; i++) total += iov[i].iov_len;
    ssize_t r;
    KT_CHECK(lane_read(ex, peer, l, iov, k, &r));
    if (r == 0) return KT_SUCCESS; /* nothing there now */
    *moved = true;
    size_t rem = (size_t)r, d = KT_MIN(rem, hrem);
    l->rhdr += d;
    rem -= d;
    if (!had_hdr && l->rhdr == KT_NET_HDR_BYTES) KT_CHECK(check_header(ex, peer, x, l->rhbuf));
    if (l->rin) {
      d = KT_MIN(rem, drem);
      l->rdone += d;
      l->rbytes += d;
      x->got += d;
      rem -= d;
      if (l->rdone == unit_len(x, l->ru)) {
        l->rlow = l->ru * LANE_UNIT + l->rdone;
        l->rin = false;
        l->rdesc = 0;
      }
    }
    l->rdesc += rem;
    if (l->rdesc == sizeof l->rd && l->rd.magic == HINT_MAGIC) { /* nothing of this lane below rd.unit now */
      if (l->rd.unit > units || l->rd.unit * LANE_UNIT < l->rlow)
        return corrupt_stream(ex, peer, s, x, "hint out of order");
      l->rlow = l->rd.unit * LANE_UNIT;
      l->rdesc = 0;
    } else if (l->rdesc == sizeof l->rd) {
      if (l->rd.magic != UNIT_MAGIC) return corrupt_stream(ex, peer, s, x, "bad record descriptor");
      if (l->rd.unit == UNIT_END) {
        *past = true;
        return KT_SUCCESS;
      }
      if (l->rd.unit >= units || l->rd.unit * LANE_UNIT < l->rlow)
        return corrupt_stream(ex, peer, s, x, "unit out of order");
      l->rin = true;
      l->ru = l->rd.unit;
      x->units_mix += unit_mix(l->ru);
      l->rdone = l->rdesc = 0;
    }
    x->done = recv_prefix(p, x, n);
    if ((size_t)r < total) return KT_SUCCESS; /* the socket has no more now */
  }
}

static kt_result advance_recvs(kt__exec *ex, int peer, int s, bool *moved) {
  struct peer *p = &ex->group->tcp->peers[peer];
  struct lane *l = &p->lane[s];
  kt__xfer *x;
  while ((x = l->rcur) != NULL) {
    int n = lanes_used(p, x);
    bool past = s >= n; /* carries no part */
    if (!past && n == 1) KT_CHECK(recv_whole(ex, peer, l, x, moved, &past));
    else if (!past) KT_CHECK(recv_striped(ex, peer, p, s, x, n, moved, &past));
    if (!past) return KT_SUCCESS;
    l->rcur = x->next;
    l->rhdr = l->rdone = l->rdesc = l->rlow = 0;
    l->rin = false;
    lane_passed(&p->rq_head, &p->rq_tail, x);
    if (x->complete && n > 1 && x->got != x->len)
      return corrupt_stream(ex, peer, s, x, "the units received do not add up to the message");
    if (x->complete && n > 1 && !units_each_once(x))
      return corrupt_stream(ex, peer, s, x,
                            "the units received do not add up to the message (one came twice, another never)");
    if (x->complete) p->rx_done++;
    else if (n > 1) x->done = recv_prefix(p, x, n);
  }
  return KT_SUCCESS;
}

/* A peer's status notice: it is waiting in op `theirs`. Same op number with
 * another signature, or an op this rank already ran with another signature:
 * the ranks called different collectives. Anything else is a peer behind or
 * ahead of this rank, which is normal. */
static kt_result check_status(kt__exec *ex, int peer, const kt__sig *theirs) {
  const kt__op *op = ex->op;
  if (!op || op->seq == 0 || theirs->seq == 0) return KT_SUCCESS; /* setup; point-to-point */
  if (theirs->seq > op->seq || op->seq - theirs->seq >= KT_TCP_HIST) return KT_SUCCESS;
  kt__group *c = ex->group;
  /* The op in progress and the ones before it, as kt__net_op_begin kept them
   * (not kept over shared memory: nothing to compare there). */
  const kt__sig mine = c->tcp->hist[theirs->seq % KT_TCP_HIST];
  if (mine.seq != theirs->seq) return KT_SUCCESS;
  bool now = theirs->seq == op->seq;
  if (kt__sig_equal(&mine, theirs)) return KT_SUCCESS;
  char a[160], b[160], who[128];
  kt__sig_describe(&mine, a, sizeof a);
  kt__sig_describe(theirs, b, sizeof b);
  kt__peer_desc(c, peer, who, sizeof who);
  if (now)
    return kt__err(KT_ERR_MISMATCH, "mismatched operations: rank %d is in (%s) but %s is in (%s)",
                   kt__rank_label(c, c->rank), a, who, b);
  return kt__err(KT_ERR_MISMATCH, "mismatched operations: %s is still in (%s), which rank %d ran as (%s)", who, b,
                 kt__rank_label(c, c->rank), a);
}

static kt_result peer_aborted(kt__group *c, int peer, kt_result code, const char *why) {
  return kt__err(code, "rank %d failed and aborted the communicator: %s", kt__rank_label(c, peer), why);
}

/* Move this rank's sends to peer on every lane, as far as the sockets take. */
static kt_result advance_peer_sends(kt__exec *ex, int peer, bool *moved) {
  struct peer *p = &ex->group->tcp->peers[peer];
  for (int l = 0; l < p->nlanes; l++)
    if (p->lane[l].scur) KT_CHECK(advance_sends(ex, peer, l, moved));
  return KT_SUCCESS;
}

/* Peer says its kt_send of message w->msg to this rank has stalled. When this
 * rank is itself in a kt_send to that peer, has not received that message,
 * and its own send cannot finish either (the socket buffers are full: the
 * peer is not reading), neither send can ever complete: ops run in issue
 * order, so neither rank receives before its send is done. */
static kt_result check_sendwait(kt__exec *ex, int peer, const struct sendwait *w) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  struct peer *p = &c->tcp->peers[peer];
  if (!op || op->coll != KT_COLL_SEND || op->root != peer || p->rx_done > w->msg) return KT_SUCCESS;
  bool moved = false;
  KT_CHECK(advance_peer_sends(ex, peer, &moved));
  if (!p->sq_head) return KT_SUCCESS; /* mine fit in the buffers: this rank receives next */
  return kt__err(KT_ERR_MISMATCH,
                 "send of %zu bytes to rank %d can never complete: rank %d sends %llu bytes to rank %d at "
                 "the same time, and neither receives before its own send completes (a message larger "
                 "than the socket buffers waits for its receiver). Let one side receive first, or "
                 "exchange with kt_sendrecv",
                 p->sq_head->len, kt__rank_label(c, peer), kt__rank_label(c, peer), (unsigned long long)w->len,
                 kt__rank_label(c, c->rank));
}

/* Is this rank's op a kt_send whose message to its receiver cannot move now
 * (the socket buffers are full)? Then *to, *msg and *done describe it. */
static kt_result stalled_send(kt__exec *ex, bool *stalled, int *to, uint64_t *msg, uint64_t *done) {
  const kt__op *op = ex->op;
  kt__group *c = ex->group;
  *stalled = false;
  if (!op || op->coll != KT_COLL_SEND || op->root < 0 || op->root >= c->tcp->nranks || op->root == c->rank)
    return KT_SUCCESS;
  struct peer *p = &c->tcp->peers[op->root];
  bool moved = false;
  KT_CHECK(advance_peer_sends(ex, op->root, &moved));
  if (!p->sq_head || moved) return KT_SUCCESS;
  *stalled = true;
  *to = op->root;
  *msg = p->sq_head->msg;
  *done = p->sq_head->done;
  return KT_SUCCESS;
}

static void send_probe(kt__group *c, int to, const struct probe *pr) {
  struct peer *p = &c->tcp->peers[to];
  if (p->ctrl_fd >= 0 && !ctrl_backlogged(p->ctrl_fd))
    send_ctrl_bytes(p->ctrl_fd, CTRL_PROBE, KT_SUCCESS, pr, PROBE_BYTES(pr->hops));
}

/* A cycle probe from peer (see struct probe): pass it on, start its second
 * pass, or, back for the second time, report the cycle. Anything that does
 * not fit (a send moved, a rank not stalled, a malformed probe) drops it. */
static kt_result handle_probe(kt__exec *ex, int peer, struct probe *pr) {
  kt__group *c = ex->group;
  uint32_t n = pr->hops;
  if (n < 1 || n > PROBE_HOPS || (pr->pass != 1 && pr->pass != 2)) return KT_SUCCESS;
  for (uint32_t i = 0; i < n; i++)
    if (pr->hop[i].rank < 0 || pr->hop[i].rank >= c->tcp->nranks) return KT_SUCCESS;
  bool mine = pr->hop[0].rank == c->rank; /* I began it: it is coming back */
  uint32_t k = pr->pass == 1 ? (mine ? 0 : n) : (pr->at == n ? 0 : pr->at); /* my hop */
  uint32_t up = pr->pass == 1 || k == 0 ? n - 1 : k - 1;                      /* the sender's hop */
  if ((pr->pass == 2 && (pr->at < 1 || pr->at > n || pr->hop[k].rank != c->rank)) || (mine && k != 0) ||
      pr->hop[up].rank != peer)
    return KT_SUCCESS;
  /* The sender waits on a message this rank has not received yet. */
  if (c->tcp->peers[peer].rx_done > pr->hop[up].msg) return KT_SUCCESS;
  bool stalled;
  int to = -1;
  uint64_t msg = 0, done = 0;
  KT_CHECK(stalled_send(ex, &stalled, &to, &msg, &done));
  if (!stalled) return KT_SUCCESS;
  if (pr->pass == 1 && !mine) {
    for (uint32_t i = 0; i < n; i++)
      if (pr->hop[i].rank == c->rank) return KT_SUCCESS; /* a cycle without its first rank: its own probes */
    if (n == PROBE_HOPS || (to == pr->hop[0].rank && n == 1)) return KT_SUCCESS; /* a pair: the send-wait notice's */
    pr->hop[n] = (struct probe_hop){.rank = c->rank, .msg = msg, .done = done};
    pr->hops = n + 1;
    send_probe(c, to, pr);
    return KT_SUCCESS;
  }
  /* My hop again (pass 2, or the end of a pass): nothing of mine moved since? */
  int next = pr->hop[k + 1 < n ? k + 1 : 0].rank;
  if (to != next || msg != pr->hop[k].msg || done != pr->hop[k].done) return KT_SUCCESS;
  if (pr->pass == 1 || k != 0) { /* the first rank starts pass 2; the others pass it on */
    pr->pass = 2;
    pr->at = k + 1;
    send_probe(c, to, pr);
    return KT_SUCCESS;
  }
  char cycle[512] = "";
  size_t off = 0;
  for (uint32_t i = 0; i < n && off < sizeof cycle - 64; i++)
    off += (size_t)snprintf(cycle + off, sizeof cycle - off, "%srank %d sends to rank %d",
                            i == 0 ? "" : i + 1 < n ? ", " : " and ", kt__rank_label(c, pr->hop[i].rank),
                            kt__rank_label(c, pr->hop[i + 1 < n ? i + 1 : 0].rank));
  return kt__err(KT_ERR_MISMATCH,
                 "send of %zu bytes to rank %d can never complete: %s at the same time, and no rank in this "
                 "cycle receives before its own send completes (a message larger than the socket buffers waits "
                 "for its receiver). Let one side receive first, or exchange with kt_sendrecv",
                 c->tcp->peers[to].sq_head->len, kt__rank_label(c, to), cycle);
}

/* A control frame arrived (or the socket closed): decide what it means. */
static kt_result handle_ctrl(kt__exec *ex, int peer) {
  kt__group *c = ex->group;
  struct peer *p = &c->tcp->peers[peer];
  if (p->abort_msg) /* read before (by a phase watching its parent, say): the cause stays the cause */
    return peer_aborted(c, peer, p->abort_code, p->abort_msg);
  for (;;) {
    ssize_t r;
    KT_SYSCALL_RETRY(r, recv(p->ctrl_fd, p->ctrl_buf + p->ctrl_fill,
                             sizeof p->ctrl_buf - p->ctrl_fill, MSG_DONTWAIT));
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return KT_SUCCESS;
    if (r > 0) p->heard_ns = kt__now_ns();
    if (r <= 0) {
      if (p->said_bye) { /* orderly: stop watching it */
        close(p->ctrl_fd);
        p->ctrl_fd = -1;
        return KT_SUCCESS;
      }
      char who[128];
      kt__peer_desc(c, peer, who, sizeof who);
      if (!ex->op) /* kt__net_check_peers from setup */
        return kt__err(KT_ERR_PEER_FAILED,
                       "%s died or closed its connection while setting up the communicator (noticed by rank %d)",
                       who, kt__rank_label(c, c->rank));
      return kt__err(KT_ERR_PEER_FAILED,
                     "%s died or closed its connection without destroying its communicator "
                     "(noticed by rank %d during op #%llu %s)",
                     who, kt__rank_label(c, c->rank), (unsigned long long)ex->op->seq, kt__coll_name(ex->op->coll));
    }
    p->ctrl_fill += (size_t)r;
    while (p->ctrl_fill >= sizeof(struct ctrl_frame)) {
      struct ctrl_frame f;
      memcpy(&f, p->ctrl_buf, sizeof f);
      if (f.magic != CTRL_MAGIC || f.len >= KT_TCP_CTRL_TEXT)
        return kt__err(KT_ERR_INTERNAL, "corrupt control frame from rank %d", kt__rank_label(c, peer));
      size_t total = sizeof f + f.len;
      if (p->ctrl_fill < total) break;
      char text[KT_TCP_CTRL_TEXT + 1];
      memcpy(text, p->ctrl_buf + sizeof f, f.len);
      text[f.len] = '\0';
      memmove(p->ctrl_buf, p->ctrl_buf + total, p->ctrl_fill - total);
      p->ctrl_fill -= total;
      if (f.type == CTRL_BYE) {
        p->said_bye = true;
      } else if (f.type == CTRL_STATUS && f.len == sizeof(kt__sig)) {
        kt__sig theirs;
        memcpy(&theirs, text, sizeof theirs);
        KT_CHECK(check_status(ex, peer, &theirs));
      } else if (f.type == CTRL_SENDWAIT && f.len == sizeof(struct sendwait)) {
        struct sendwait w;
        memcpy(&w, text, sizeof w);
        KT_CHECK(check_sendwait(ex, peer, &w));
      } else if (f.type == CTRL_PROBE && f.len >= PROBE_BYTES(1) && f.len <= sizeof(struct probe) &&
                 (f.len - PROBE_BYTES(0)) % sizeof(struct probe_hop) == 0) {
        struct probe pr;
        memset(&pr, 0, sizeof pr);
        memcpy(&pr, text, f.len);
        if (PROBE_BYTES(pr.hops) == f.len) KT_CHECK(handle_probe(ex, peer, &pr));
      } else if (f.type == CTRL_ABORT) {
        kt_result code = (f.code > 0 && f.code <= KT_ERR_INTERNAL) ? (kt_result)f.code : KT_ERR_ABORTED;
        p->abort_code = code;
        p->abort_msg = strdup(text); /* NULL when out of memory: only the repeat is lost */
        return peer_aborted(c, peer, code, text);
      }
    }
  }
}

/* The ranks of the op's communicator (the parent's, for a phase: it has a
 * socket to every rank) heard from on no socket since the op began. A rank
 * that waits sends status notices (kt__net_stuck) from STATUS_FIRST_NS on, so
 * after twice that, silence means stopped, hung, cut off or busy elsewhere:
 * the rank this one waits for may itself be waiting for one of those, and it
 * is the one to name (as shm.c names ranks with no activity). */
static void quiet_ranks(const kt__exec *ex, char *buf, size_t cap) {
  const kt__exec *top = ex->parent ? ex->parent : ex;
  const kt__group *c = top->group;
  const struct kt__tcp *t = c->tcp;
  buf[0] = '\0';
  int64_t began = top->deadline_ns - c->timeout_ms * 1000000, now = kt__now_ns();
  if (!t || now - began < 2 * STATUS_FIRST_NS) return;
  size_t off = 0;
  for (int i = 0; i < t->nranks && off + 48 < cap; i++) {
    if (i == c->rank || t->peers[i].said_bye || t->peers[i].heard_ns >= began) continue;
    off += (size_t)snprintf(buf + off, cap - off, "%s rank %d", off ? "," : "", kt__rank_label(c, i));
  }
}

static kt_result describe_timeout(kt__exec *ex) {
  kt__group *c = ex->group;
  char pend[512] = "";
  size_t off = 0;
  int shown = 0;
  for (int i = 0; i < c->tcp->nranks && shown < 4; i++) {
    struct peer *p = &c->tcp->peers[i];
    if (p->rq_head) {
      off += (size_t)snprintf(pend + off, sizeof pend - off, "%s receive from rank %d (%zu/%zu bytes)",
                              shown ? "," : "", kt__rank_label(c, i), p->rq_head->done, p->rq_head->len);
      shown++;
    }
    if (p->sq_head && off < sizeof pend && shown < 4) {
      off += (size_t)snprintf(pend + off, sizeof pend - off, "%s send to rank %d (%zu/%zu bytes)",
                              shown ? "," : "", kt__rank_label(c, i), p->sq_head->done, p->sq_head->len);
      shown++;
    }
    if (off >= sizeof pend) break;
  }
  char quiet[256];
  quiet_ranks(ex, quiet, sizeof quiet);
  return kt__err(KT_ERR_TIMEOUT,
                 "rank %d: op #%llu %s timed out after %lld ms (KAITIAN_TIMEOUT) waiting for:%s%s%s",
                 kt__rank_label(c, c->rank), (unsigned long long)ex->op->seq, kt__coll_name(ex->op->coll),
                 (long long)c->timeout_ms, pend[0] ? pend : " nothing posted",
                 quiet[0] ? "; nothing heard since the op began (stopped, hung, cut off or busy elsewhere) from" : "",
                 quiet);
}

kt_result kt__net_timeout(kt__exec *ex, const char *what, const char *detail) {
  kt__group *c = ex->group;
  char quiet[256] = "";
  if (c->tcp) quiet_ranks(ex, quiet, sizeof quiet);
  return kt__err(KT_ERR_TIMEOUT, "rank %d: op #%llu %s timed out after %lld ms (KAITIAN_TIMEOUT) waiting for %s%s%s%s%s",
                 kt__rank_label(c, c->rank), (unsigned long long)ex->op->seq, kt__coll_name(ex->op->coll),
                 (long long)c->timeout_ms, what,
                 quiet[0] ? "; nothing heard since the op began (stopped, hung, cut off or busy elsewhere) from" : "",
                 quiet, detail ? "; it reported: " : "", detail ? detail : "");
}

kt_result kt__net_progress(kt__exec *ex, bool block) {
  kt__group *c = ex->group;
  struct kt__tcp *t = c->tcp;
  if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
    return kt__err(KT_ERR_ABORTED, "rank %d: communicator aborted (kt_comm_abort)", kt__rank_label(c, c->rank));
  bool moved = false;
  for (int i = 0; i < t->nranks; i++) {
    struct peer *p = &t->peers[i];
    for (int l = 0; l < p->nlanes; l++) {
      if (p->lane[l].scur) KT_CHECK(advance_sends(ex, i, l, &moved));
      if (p->lane[l].rcur) KT_CHECK(advance_recvs(ex, i, l, &moved));
    }
  }
  if (moved || !block) {
    if (moved) t->idle_since_ns = 0;
    return KT_SUCCESS;
  }
  /* Nothing could move: for KAITIAN_TCP_SPIN_NS try again, yielding the
   * CPU between tries (a peer's bytes often arrive within microseconds,
   * sooner than a sleeping rank wakes up); the caller loops back here.
   * Until 2026-11-28 only ops of up to 64 KiB spun, on the view that larger
   * ones are bound by the link or the copies; at 2 hosts x 1 rank on
   * 10 Gbit/s, allgather and reduce_scatter of 256 KiB then ran at 55-63%
   * of the link (docs/algorithms.md). */
  if (t->spin_ns > 0) {
    int64_t now = kt__now_ns();
    if (t->idle_since_ns == 0) t->idle_since_ns = now;
    if (now - t->idle_since_ns < t->spin_ns) {
      sched_yield();
      return KT_SUCCESS;
    }
  }

  /* Nothing could move: sleep until a socket is ready, a peer fails, or an
   * abort; wake now and then to check the deadline and to tell peers which
   * op this rank waits in (kt__net_stuck). */
  int n = 0;
  for (int i = 0; i < t->nranks; i++) {
    struct peer *p = &t->peers[i];
    if (i == c->rank) continue;
    for (int l = 0; l < p->nlanes; l++) {
      short ev = (short)((p->lane[l].rcur ? POLLIN : 0) | (lane_can_send(p, l) ? POLLOUT : 0));
      if (ev) {
        t->pfds[n] = (struct pollfd){p->lane[l].fd, ev, 0};
        t->pfd_peer[n++] = i;
      }
    }
    if (p->ctrl_fd >= 0) {
      t->pfds[n] = (struct pollfd){p->ctrl_fd, POLLIN, 0};
      t->pfd_peer[n++] = -1 - i;
    }
  }
  t->pfds[n] = (struct pollfd){c->abort_fd, POLLIN, 0};
  t->pfd_peer[n++] = INT32_MIN;
  int64_t left_ms = (ex->deadline_ns - kt__now_ns() + 999999) / 1000000;
  if (left_ms <= 0) return describe_timeout(ex);
  int r;
  KT_SYSCALL_RETRY(r, poll(t->pfds, (nfds_t)n, (int)KT_MIN(left_ms, POLL_SLICE_MS)));
  if (r < 0) return kt__err(KT_ERR_SYSTEM, "poll failed: %s", strerror(errno));
  if (r == 0) {
    if (kt__now_ns() >= ex->deadline_ns) return describe_timeout(ex);
    KT_CHECK(kt__net_stuck(ex));
    return ex->parent ? kt__net_stuck(ex->parent) : KT_SUCCESS;
  }
  for (int k = 0; k < n; k++) {
    if (!t->pfds[k].revents) continue;
    int who = t->pfd_peer[k];
    if (who == INT32_MIN)
      return kt__err(KT_ERR_ABORTED, "rank %d: communicator aborted (kt_comm_abort)", kt__rank_label(c, c->rank));
    if (who < 0) KT_CHECK(handle_ctrl(ex, -1 - who));
  }
  return KT_SUCCESS;
}

kt_result kt__net_check_peers(kt__exec *ex) {
  kt__group *c = ex->group;
  struct kt__tcp *t = c->tcp;
  if (!t || t->nranks == 1) return KT_SUCCESS;
  int n = 0;
  for (int i = 0; i < t->nranks; i++) {
    if (t->peers[i].ctrl_fd < 0) continue;
    t->pfds[n] = (struct pollfd){t->peers[i].ctrl_fd, POLLIN, 0};
    t->pfd_peer[n++] = i;
  }
  int r;
  KT_SYSCALL_RETRY(r, poll(t->pfds, (nfds_t)n, 0));
  if (r <= 0) return KT_SUCCESS;
  for (int k = 0; k < n; k++)
    if (t->pfds[k].revents) KT_CHECK(handle_ctrl(ex, t->pfd_peer[k]));
  return KT_SUCCESS;
}

void kt__net_op_begin(kt__exec *ex) {
  struct kt__tcp *t = ex->group->tcp;
  if (!t) return;
  t->idle_since_ns = 0; /* each op's first wait may spin */
  const kt__op *op = ex->op;
  t->sendwait_ns = op->coll == KT_COLL_SEND ? kt__now_ns() + STATUS_FIRST_NS : INT64_MAX;
  t->sendwait_gap_ns = STATUS_FIRST_NS;
  /* Point-to-point ops are not numbered (ranks issue different numbers of
   * them); over shared memory ranks compare signatures in the segment. */
  if (op->seq == 0 || ex->group->shm) {
    t->next_status_ns = INT64_MAX;
    return;
  }
  kt__op_sig(op, ex->group->size, &t->hist[op->seq % KT_TCP_HIST]);
  t->status_gap_ns = STATUS_FIRST_NS;
  t->next_status_ns = kt__now_ns() + STATUS_FIRST_NS;
}

/* Status notices are advice: skip one while the peer has left more than
 * 4 KiB of earlier control frames unread, so that a frame is never cut short
 * by a full socket buffer (the peer would take the rest for a corrupt frame). */
static bool ctrl_backlogged(int fd) {
  int queued = 0;
  return ioctl(fd, TIOCOUTQ, &queued) != 0 || queued > 4096;
}

kt_result kt__net_stuck(kt__exec *ex) {
  struct kt__tcp *t = ex->group->tcp;
  if (!t || t->nranks == 1) return KT_SUCCESS;
  int64_t now = kt__now_ns();
  if (now >= t->next_status_ns) {
    const kt__sig *mine = &t->hist[ex->op->seq % KT_TCP_HIST]; /* kt__net_op_begin's */
    for (int i = 0; i < t->nranks; i++)
      if (i != ex->group->rank && t->peers[i].ctrl_fd >= 0 && !ctrl_backlogged(t->peers[i].ctrl_fd))
        send_ctrl_bytes(t->peers[i].ctrl_fd, CTRL_STATUS, KT_SUCCESS, mine, sizeof *mine);
    t->status_gap_ns = KT_MIN(2 * t->status_gap_ns, STATUS_MAX_NS);
    t->next_status_ns = now + t->status_gap_ns;
  }
  if (now >= t->sendwait_ns) {
    /* A kt_send stalled for a second: tell its receiver, and send a cycle
     * probe; again after 2, 4, ... s (up to a minute), in case a rank of a
     * cycle was not stalled yet when the last probe passed it. */
    t->sendwait_gap_ns = KT_MIN(2 * t->sendwait_gap_ns, STATUS_MAX_NS);
    t->sendwait_ns = now + t->sendwait_gap_ns;
    int to = ex->op->root;
    struct peer *p = to >= 0 && to < t->nranks && to != ex->group->rank ? &t->peers[to] : NULL;
    if (p && p->sq_head && p->ctrl_fd >= 0 && !ctrl_backlogged(p->ctrl_fd)) {
      struct sendwait w = {p->sq_head->msg, p->sq_head->len};
      send_ctrl_bytes(p->ctrl_fd, CTRL_SENDWAIT, KT_SUCCESS, &w, sizeof w);
      bool stalled;
      uint64_t msg = 0, done = 0;
      KT_CHECK(stalled_send(ex, &stalled, &to, &msg, &done));
      if (stalled) {
        struct probe pr = {.pass = 1, .hops = 1};
        pr.hop[0] = (struct probe_hop){.rank = ex->group->rank, .msg = msg, .done = done};
        send_probe(ex->group, to, &pr);
      }
    }
  }
  return kt__net_check_peers(ex);
}

kt_result kt__net_wait(kt__exec *ex, kt__xfer *x) {
  while (!x->complete) KT_CHECK(kt__net_progress(ex, true));
  return KT_SUCCESS;
}

kt_result kt__net_waitall(kt__exec *ex, kt__xfer *xs, int n) {
  for (int i = 0; i < n; i++) KT_CHECK(kt__net_wait(ex, &xs[i]));
  return KT_SUCCESS;
}

kt_result kt__net_copy_while_sending(kt__exec *ex, void *dst, const void *src, size_t bytes, size_t piece) {
  if (piece == 0) {
    memcpy(dst, src, bytes);
    return KT_SUCCESS;
  }
  for (size_t at = 0; at < bytes; at += piece) {
    memcpy((char *)dst + at, (const char *)src + at, KT_MIN(piece, bytes - at));
    KT_CHECK(kt__net_progress(ex, false));
  }
  return KT_SUCCESS;
}

kt_result kt__net_sendrecv(kt__exec *ex, int dst, const void *sbuf, size_t slen, int src,
                           void *rbuf, size_t rlen, uint32_t tag) {
  kt__xfer x[2];
  kt__xfer_send(&x[0], dst, sbuf, slen, tag);
  kt__xfer_recv(&x[1], src, rbuf, rlen, tag);
  KT_CHECK(kt__net_post(ex, &x[0]));
  KT_CHECK(kt__net_post(ex, &x[1]));
  return kt__net_waitall(ex, x, 2);
}

void kt__tcp_reset_queues(kt__group *c) {
  if (!c->tcp) return;
  for (int i = 0; i < c->tcp->nranks; i++) {
    struct peer *p = &c->tcp->peers[i];
    p->sq_head = p->sq_tail = p->rq_head = p->rq_tail = NULL;
    for (int l = 0; l < p->nlanes; l++) {
      struct lane *ln = &p->lane[l];
      *ln = (struct lane){.fd = ln->fd, .sbytes = ln->sbytes, .rbytes = ln->rbytes};
    }
  }
}

/* ---- connection setup --------------------------------------------------- */

/* Descriptors this process has open now. */
static long open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 0;
  long n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

/* The lanes this rank offers its peers in a communicator of up to size ranks:
 * KAITIAN_NSOCKS, when the descriptors allow it. The soft RLIMIT_NOFILE is
 * raised toward the hard one where the mesh needs it (leaving 256 spare);
 * where even the hard limit is short, fewer lanes (peers use the smaller
 * count of the two ends, so both agree). */
static int choose_lanes(int rank, int size, int share) {
  int want = KT_MAX(1, kt__tcp_lanes_param() / KT_MAX(share, 1));
  if (want == 1 || size < 2) return want;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return want;
  long base = open_fds() + 256;
  rlim_t need = (rlim_t)(base + (long)(want + 1) * (size - 1));
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    rlim_t to = rl.rlim_max == RLIM_INFINITY ? need : KT_MIN(need, rl.rlim_max);
    if (to > rl.rlim_cur) {
      KT_INFO("rank %d: raising the open-file limit from %llu to %llu for %d TCP connections per peer", rank,
              (unsigned long long)rl.rlim_cur, (unsigned long long)to, want + 1);
      rl.rlim_cur = to;
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0) getrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return want;
  long room = ((long)rl.rlim_cur - base) / (size - 1) - 1;
  int lanes = (int)KT_MAX(1, KT_MIN(room, want));
  static atomic_int warned;
  if (!atomic_exchange(&warned, 1))
    KT_WARN("rank %d: the open-file limit (%llu) leaves room for %d of KAITIAN_NSOCKS=%d data connections per "
            "peer among %d ranks; raise it (ulimit -n) for full speed between hosts",
            rank, (unsigned long long)rl.rlim_cur, lanes, want, size);
  return lanes;
}

int kt__tcp_lanes_param(void) {
  int64_t v = kt__param_NSOCKS();
  if (v >= 1 && v <= KT_TCP_MAX_LANES) return (int)v;
  static atomic_int warned;
  int use = v < 1 ? 1 : KT_TCP_MAX_LANES;
  if (!atomic_exchange(&warned, 1))
    KT_WARN("KAITIAN_NSOCKS=%lld is outside 1-%d; using %d", (long long)v, KT_TCP_MAX_LANES, use);
  return use;
}

static int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* striped: a data connection of a pair with several (nlanes > 1). */
static void tune_socket(int fd, bool striped) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int64_t bufsz = kt__param_SOCKET_BUFFER_BYTES();
  /* Buffers below the loopback MSS leave TCP waiting on zero-window probes
   * (a transfer then crawls for seconds): keep at least 64 KiB. */
  if (bufsz > 0 && bufsz < KT_TCP_MIN_SOCKBUF) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
      KT_WARN("KAITIAN_SOCKET_BUFFER_BYTES=%lld is below the minimum; using %d", (long long)bufsz,
              KT_TCP_MIN_SOCKBUF);
    bufsz = KT_TCP_MIN_SOCKBUF;
  }
  /* Striped messages (send_striped) are balanced by what each connection
   * takes: with the kernel's default, a connection takes megabytes it has not
   * sent yet, and the lanes finish milliseconds apart. A pair with one
   * connection has nothing to balance, and keeps the kernel's room for a
   * kt_send that completes before its receiver reads (docs/failures.md). */
  int64_t notsent = kt__param_TCP_NOTSENT_BYTES();
  if (striped && notsent > 0) {
    int v = (int)KT_MIN(KT_MAX(notsent, (int64_t)LANE_UNIT), INT32_MAX);
    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
  }
  if (bufsz > 0) {
    int b = (int)KT_MIN(bufsz, INT32_MAX);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
  }
}

/* Does interface name match the KAITIAN_SOCKET_IFNAME spec? "eth" matches
 * eth0 (prefix), "=eth0" exactly, "^docker" excludes; comma-separated. */
static bool ifname_matches(const char *spec, const char *name) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec);
  bool exclude = buf[0] == '^';
  char *s = buf + (exclude ? 1 : 0);
  bool exact = s[0] == '=';
  if (exact) s++;
  bool hit = false;
  for (char *tok = strtok(s, ","); tok && !hit; tok = strtok(NULL, ","))
    hit = exact ? strcmp(tok, name) == 0 : strncmp(tok, name, strlen(tok)) == 0;
  return exclude ? !hit : hit;
}

/* The local IPv4 address a packet to host would leave from, via a connected
 * UDP socket (no traffic is sent). */
static bool route_source(const char *host, char *ip, size_t cap) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
  if (getaddrinfo(host, "9", &hints, &res) != 0 || !res) return false;
  bool ok = false;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 &&
        inet_ntop(AF_INET, &sa.sin_addr, ip, (socklen_t)cap))
      ok = true;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return ok;
}

/* Pick the address to listen on. See KAITIAN_SOCKET_IFNAME in params.def. */
static kt_result choose_address(char *ip, size_t cap) {
  const char *spec = kt__param_SOCKET_IFNAME();
  struct ifaddrs *ifs = NULL;
  if (!spec[0]) {
    char host[256];
    int port;
    const char *store = kt__param_STORE_ADDR();
    if (store[0] && sscanf(store, "%255[^:]:%d", host, &port) == 2 && route_source(host, ip, cap))
      return KT_SUCCESS;
  }
  if (getifaddrs(&ifs) != 0) return kt__err(KT_ERR_SYSTEM, "getifaddrs: %s", strerror(errno));
  bool found = false;
  /* Two passes without a spec: non-loopback first, then loopback. */
  for (int pass = 0; pass < 2 && !found; pass++) {
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
      bool loop = (i->ifa_flags & IFF_LOOPBACK) != 0;
      if (spec[0]) {
        if (!ifname_matches(spec, i->ifa_name)) continue;
      } else if (loop != (pass == 1)) {
        continue;
      }
      found = inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip,
                        (socklen_t)cap) != NULL;
    }
    if (spec[0]) break;
  }
  freeifaddrs(ifs);
  if (!found)
    return kt__err(KT_ERR_SYSTEM, "no usable IPv4 interface%s%s%s", spec[0] ? " matches KAITIAN_SOCKET_IFNAME='" : "",
                   spec, spec[0] ? "'" : "");
  return KT_SUCCESS;
}

/* hostname + boot id: equal on ranks that share a kernel and a host name
 * (network namespaces of one machine with their own UTS names differ). */
static void host_id(const char *host, char *buf, size_t cap) {
  char boot[64] = "noboot";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "noboot");
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
  }
  snprintf(buf, cap, "%.63s/%.36s", host, boot);
}

kt_result kt__tcp_listen(int rank, int size, int share, kt__tcp_addr *me, int *listen_fd) {
  kt_result res = KT_SUCCESS;
  memset(me, 0, sizeof *me);
  KT_CHECK(choose_address(me->ip, sizeof me->ip));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return kt__err(KT_ERR_SYSTEM, "socket: %s", strerror(errno));
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, me->ip, &sa.sin_addr);
  socklen_t sl = sizeof sa;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    res = kt__err(KT_ERR_SYSTEM, "rank %d: cannot listen on %s: %s", rank, me->ip, strerror(errno));
    close(fd);
    return res;
  }
  me->port = ntohs(sa.sin_port);
  for (size_t got = 0; got < sizeof me->token;) {
    ssize_t r = getrandom(me->token + got, sizeof me->token - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      res = kt__err(KT_ERR_SYSTEM, "rank %d: getrandom for the connection token: %s", rank, strerror(errno));
      close(fd);
      return res;
    }
    got += (size_t)r;
  }
  me->pid = (int32_t)getpid();
  me->lanes = choose_lanes(rank, size, share);
  if (gethostname(me->host, sizeof me->host) != 0) snprintf(me->host, sizeof me->host, "?");
  me->host[sizeof me->host - 1] = '\0';
  host_id(me->host, me->hostid, sizeof me->hostid);
  *listen_fd = fd;
  return KT_SUCCESS;
}

kt_result kt__tcp_create(kt__group *c, int listen_fd) {
  struct kt__tcp *t = kt__calloc(1, sizeof *t);
  if (!t) {
    close(listen_fd);
    return KT_ERR_NO_MEMORY;
  }
  t->nranks = c->size;
  t->spin_ns = KT_MIN(KT_MAX(kt__param_TCP_SPIN_NS(), (int64_t)0), TCP_SPIN_CAP_NS);
  t->listen_fd = listen_fd;
  t->peers = kt__calloc((size_t)c->size, sizeof *t->peers);
  size_t npfd = (size_t)(kt__tcp_lanes_param() + 1) * (size_t)c->size + 1; /* lanes + ctrl per peer, abort */
  t->pfds = kt__calloc(npfd, sizeof *t->pfds);
  t->pfd_peer = kt__calloc(npfd, sizeof *t->pfd_peer);
  if (!t->peers || !t->pfds || !t->pfd_peer) {
    free(t->peers);
    free(t->pfds);
    free(t->pfd_peer);
    free(t);
    close(listen_fd);
    return KT_ERR_NO_MEMORY;
  }
  for (int i = 0; i < c->size; i++) {
    t->peers[i].ctrl_fd = -1;
    for (int l = 0; l < KT_TCP_MAX_LANES; l++) t->peers[i].lane[l].fd = -1;
  }
  c->tcp = t;
  return KT_SUCCESS;
}

static kt_result connect_one(kt__group *c, const kt__tcp_addr *a, int peer, uint32_t kind,
                             uint32_t lane, int64_t deadline, int *out) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
  if (inet_pton(AF_INET, a->ip, &sa.sin_addr) != 1)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d published a bad address '%s'", peer, a->ip);
  int delay_ms = 1;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return kt__err(KT_ERR_SYSTEM, "socket: %s", strerror(errno));
    int r;
    KT_SYSCALL_RETRY(r, connect(fd, (struct sockaddr *)&sa, sizeof sa));
    if (r == 0) {
      struct hello h = {HELLO_MAGIC, kind, c->rank, lane, {0}};
      memcpy(h.token, c->tcp->token, sizeof h.token);
      if (kt__write_full(fd, &h, sizeof h) == 0) {
        *out = fd;
        return KT_SUCCESS;
      }
    }
    int err = errno;
    close(fd);
    if (kt__now_ns() >= deadline)
      return kt__err(KT_ERR_TIMEOUT, "rank %d: cannot connect to rank %d at %s:%d: %s", c->rank,
                     peer, a->ip, a->port, strerror(err));
    usleep((useconds_t)delay_ms * 1000);
    delay_ms = KT_MIN(delay_ms * 2, 100);
  }
}

/* NULL when h is the hello of a higher rank of this communicator for a
 * connection it has yet to make (its control one, or one of the pair's data
 * lanes); else why not. The token is checked before anything it protects. */
static const char *hello_problem(const kt__group *c, const struct hello *h) {
  const struct kt__tcp *t = c->tcp;
  if (h->magic != HELLO_MAGIC) return "not a KaiTian hello";
  if (!kt__equal_ct(h->token, t->token, sizeof t->token)) return "wrong token";
  if (h->rank <= c->rank || h->rank >= c->size) return "rank out of place";
  if (h->kind != CONN_DATA && h->kind != CONN_CTRL) return "unknown connection kind";
  if (h->kind == CONN_DATA && h->lane >= (uint32_t)t->peers[h->rank].nlanes) return "lane out of range";
  int fd = h->kind == CONN_DATA ? t->peers[h->rank].lane[h->lane].fd : t->peers[h->rank].ctrl_fd;
  if (fd >= 0) return "its connection is made already (a replayed hello)";
  return NULL;
}

/* Accept until every higher rank has connected all its sockets. Anything
 * else that connects is closed with one WARN line naming its address. */
static kt_result accept_all(kt__group *c, int64_t deadline) {
  struct kt__tcp *t = c->tcp;
  int need = 0;
  for (int j = c->rank + 1; j < c->size; j++) need += t->peers[j].nlanes + 1;
  while (need > 0) {
    int64_t left = (deadline - kt__now_ns()) / 1000000;
    if (left <= 0)
      return kt__err(KT_ERR_TIMEOUT, "rank %d: timed out waiting for %d connections from higher ranks",
                     c->rank, need);
    struct pollfd pfd = {t->listen_fd, POLLIN, 0};
    int r;
    KT_SYSCALL_RETRY(r, poll(&pfd, 1, (int)KT_MIN(left, 1000)));
    if (r <= 0) continue;
    int fd;
    struct sockaddr_storage from;
    socklen_t fromlen = sizeof from;
    memset(&from, 0, sizeof from);
    KT_SYSCALL_RETRY(fd, accept4(t->listen_fd, (struct sockaddr *)&from, &fromlen, SOCK_CLOEXEC));
    if (fd < 0) continue;
    struct hello h;
    /* A peer that connected sends its hello at once; do not let a stray
     * connection stall us. */
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *why = kt__read_full(fd, &h, sizeof h) != 0 ? "no complete hello within 2 s" : hello_problem(c, &h);
    if (why) {
      char addr[INET6_ADDRSTRLEN + 8];
      kt__format_sockaddr(&from, addr, sizeof addr);
      KT_WARN("rank %d: closed a connection from %s to communicator '%s': %s; the job goes on",
              kt__rank_label(c, c->rank), addr, c->prefix, why);
      close(fd);
      continue;
    }
    tv = (struct timeval){0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int *slot = h.kind == CONN_DATA ? &t->peers[h.rank].lane[h.lane].fd : &t->peers[h.rank].ctrl_fd;
    *slot = fd;
    need--;
  }
  return KT_SUCCESS;
}

/* NULL when a is a record a rank may publish (every text ends inside its
 * field, an IPv4 address, a port 1-65535, a pid above 0, 1-16 lanes); else
 * what is wrong with it. */
static const char *addr_problem(const kt__tcp_addr *a) {
  struct in_addr ip;
  if (!memchr(a->ip, '\0', sizeof a->ip) || inet_pton(AF_INET, a->ip, &ip) != 1) return "its IPv4 address";
  if (a->port < 1 || a->port > 65535) return "its port";
  if (a->pid < 1) return "its pid";
  if (a->lanes < 1 || a->lanes > KT_TCP_MAX_LANES) return "its connection count";
  if (!memchr(a->host, '\0', sizeof a->host)) return "its host name";
  if (!memchr(a->hostid, '\0', sizeof a->hostid)) return "its host id";
  return NULL;
}

/* Check every rank's record before anything reads it. */
static kt_result check_addrs(const kt__group *c, const kt__tcp_addr *all) {
  for (int j = 0; j < c->size; j++) {
    const char *why = addr_problem(&all[j]);
    if (why)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "rank %d: rank %d published a malformed address record (%s)",
                     kt__rank_label(c, c->rank), kt__rank_label(c, j), why);
  }
  return KT_SUCCESS;
}

/* Data connections of each pair: one to a rank on this host (nothing to
 * gain over loopback), else the smaller KAITIAN_NSOCKS of the two ends, so
 * both count the same. */
static void plan_lanes(kt__group *c, const kt__tcp_addr *all) {
  struct kt__tcp *t = c->tcp;
  for (int j = 0; j < c->size; j++)
    t->peers[j].nlanes = j == c->rank ? 0
                         : strcmp(all[j].hostid, all[c->rank].hostid) == 0
                             ? 1
                             : KT_MAX(1, KT_MIN(all[c->rank].lanes, KT_MIN(all[j].lanes, KT_TCP_MAX_LANES)));
}

kt_result kt__tcp_mesh(kt__group *c, const kt__tcp_addr *all) {
  struct kt__tcp *t = c->tcp;
  KT_CHECK(check_addrs(c, all));
  int64_t deadline = kt__now_ns() + kt__param_CONNECT_TIMEOUT() * 1000000;
  memcpy(t->token, all[0].token, sizeof t->token);
  plan_lanes(c, all);
  for (int j = 0; j < c->rank; j++) {
    for (int l = 0; l < t->peers[j].nlanes; l++)
      KT_CHECK(connect_one(c, &all[j], j, CONN_DATA, (uint32_t)l, deadline, &t->peers[j].lane[l].fd));
    KT_CHECK(connect_one(c, &all[j], j, CONN_CTRL, 0, deadline, &t->peers[j].ctrl_fd));
  }
  KT_CHECK(accept_all(c, deadline));
  close(t->listen_fd);
  t->listen_fd = -1;
  for (int j = 0; j < c->size; j++) {
    if (j == c->rank) continue;
    struct peer *p = &t->peers[j];
    if (set_nonblock(p->ctrl_fd) != 0) return kt__err(KT_ERR_SYSTEM, "fcntl: %s", strerror(errno));
    for (int l = 0; l < p->nlanes; l++) {
      if (set_nonblock(p->lane[l].fd) != 0) return kt__err(KT_ERR_SYSTEM, "fcntl: %s", strerror(errno));
      tune_socket(p->lane[l].fd, p->nlanes > 1);
    }
    int one = 1;
    setsockopt(p->ctrl_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    snprintf(c->peer_host[j], sizeof c->peer_host[j], "%s", all[j].host);
    c->peer_pid[j] = all[j].pid;
  }
  c->all_local = true;
  for (int j = 0; j < c->size; j++) c->all_local &= strcmp(all[j].hostid, all[c->rank].hostid) == 0;
  return KT_SUCCESS;
}

static void send_ctrl_bytes(int fd, uint32_t type, kt_result code, const void *data, size_t len) {
  if (fd < 0) return;
  unsigned char buf[sizeof(struct ctrl_frame) + KT_TCP_CTRL_TEXT];
  len = KT_MIN(len, (size_t)KT_TCP_CTRL_TEXT - 1);
  struct ctrl_frame f = {CTRL_MAGIC, type, (int32_t)code, (uint32_t)len};
  memcpy(buf, &f, sizeof f);
  if (len) memcpy(buf + sizeof f, data, len);
  ssize_t w;
  KT_SYSCALL_RETRY(w, send(fd, buf, sizeof f + len, MSG_NOSIGNAL | MSG_DONTWAIT));
  (void)w; /* best effort: the peer may be gone, or its buffer full */
}

static void send_ctrl(int fd, uint32_t type, kt_result code, const char *text) {
  send_ctrl_bytes(fd, type, code, text, text ? strlen(text) : 0);
}

void kt__tcp_broadcast_abort(kt__group *c, kt_result code, const char *why) {
  if (!c->tcp) return;
  for (int i = 0; i < c->tcp->nranks; i++)
    if (i != c->rank) send_ctrl(c->tcp->peers[i].ctrl_fd, CTRL_ABORT, code, why);
}

/* With KAITIAN_DEBUG=INFO: how the striped bytes to and from peer spread over
 * the pair's connections (even on an even link; a connection the link serves
 * worse carries less). */
static void log_lane_shares(kt__group *c, int peer) {
  const struct peer *p = &c->tcp->peers[peer];
  if (kt__log_level < KT_LOG_INFO || p->nlanes < 2) return;
  for (int dir = 0; dir < 2; dir++) {
    char buf[KT_TCP_MAX_LANES * 24] = "";
    size_t off = 0;
    uint64_t total = 0;
    for (int l = 0; l < p->nlanes; l++) total += dir ? p->lane[l].rbytes : p->lane[l].sbytes;
    if (!total) continue;
    for (int l = 0; l < p->nlanes && off < sizeof buf; l++)
      off += (size_t)snprintf(buf + off, sizeof buf - off, "%s%.1f%%", l ? " " : "",
                              100.0 * (double)(dir ? p->lane[l].rbytes : p->lane[l].sbytes) / (double)total);
    KT_INFO("rank %d: striped bytes %s rank %d: %llu over %d connections, %s", kt__rank_label(c, c->rank),
            dir ? "from" : "to", kt__rank_label(c, peer), (unsigned long long)total, p->nlanes, buf);
  }
}

void kt__tcp_close(kt__group *c, bool graceful) {
  struct kt__tcp *t = c->tcp;
  if (!t) return;
  for (int i = 0; i < t->nranks; i++) {
    struct peer *p = &t->peers[i];
    log_lane_shares(c, i);
    if (graceful) send_ctrl(p->ctrl_fd, CTRL_BYE, KT_SUCCESS, NULL);
    for (int l = 0; l < KT_TCP_MAX_LANES; l++)
      if (p->lane[l].fd >= 0) close(p->lane[l].fd);
    if (p->ctrl_fd >= 0) close(p->ctrl_fd);
    free(p->abort_msg);
  }
  if (t->listen_fd >= 0) close(t->listen_fd);
  free(t->peers);
  free(t->pfds);
  free(t->pfd_peer);
  free(t);
  c->tcp = NULL;
}

