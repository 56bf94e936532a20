/* fuzz_store_client.c - libFuzzer harness for the store client's reply
 * decoding (src/store/tcp_client.c, included here to reach its static
 * functions): what a client makes of whatever a "store" answers.
 *
 * Each input is one connection: a client whose socket is one end of a
 * socketpair; the other end holds the input's reply bytes, then end of file
 * (no real server, no network). The first two bytes pick up to four
 * requests (3 bits each: hello, set, get into a 16- or 4096-byte buffer, add,
 * wait, check, delete); the rest is the stream of replies they read. The
 * requests run until one breaks the connection.
 * Checks besides crashes and sanitizer reports: every request ends with
 * success or a documented error code, and an error has a message; a request
 * that leaves the connection open has read exactly one whole reply frame
 * (header and value: the stream stays in step), otherwise it has closed the
 * connection; a GET's value is the reply's bytes and never more than the
 * buffer holds. The client allocates nothing sized by a reply (the run's
 * -rss_limit_mb would catch it). */
#include "../../src/store/tcp_client.c"

#include <stdint.h>
#include <sys/ioctl.h>

#define FUZZ_NAME "fuzz_store_client"
#include "fuzz_common.h"

/* Reply bytes the client has not read yet. */
static size_t unread(int fd) {
  int n = 0;
  if (ioctl(fd, FIONREAD, &n) != 0) abort();
  return (size_t)n;
}

/* One request of kind op; the reply's value, for a GET, in got/len. */
static kt_result request(tcp_client *cl, int op, char *got, size_t cap, size_t *len, bool *denied) {
  const char *keys[2] = {"fuzz/a", "fuzz/b"};
  int64_t result = 0;
  int ready = 0;
  switch (op) {
    case 0: return hello(cl, deadline_after(5000), denied);
    case 1: return op_set(cl, keys[0], "value", 5);
    case 2: return op_get(cl, keys[0], got, cap, len, 0);
    case 3: return op_add(cl, keys[0], 1, &result);
    case 4: return op_wait(cl, keys, 2, 0);
    case 5: return op_check(cl, keys, 2, &ready);
    default: return op_del(cl, keys[1]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 65536) return 0;
  const uint8_t *reply = data + 2;
  size_t rlen = size - 2;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) abort();
  int big = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (rlen && send(sv[1], reply, rlen, MSG_NOSIGNAL) != (ssize_t)rlen) abort();
  shutdown(sv[1], SHUT_WR);

  tcp_client *cl = calloc(1, sizeof *cl);
  if (!cl) abort();
  pthread_mutex_init(&cl->mu, NULL);
  cl->fd = sv[0];
  cl->port = 1;
  snprintf(cl->host, sizeof cl->host, "fuzz");
  snprintf(cl->addr, sizeof cl->addr, "fuzz:1");
  memcpy(cl->secret, "fuzz-secret", 11);
  cl->secret_len = 11;

  unsigned sel = data[0] | (unsigned)data[1] << 8;
  for (int k = 0; k < 4 && cl->fd >= 0; k++) {
    int op = (sel >> (3 * k)) & 7;
    size_t cap = (sel >> 12) & (1u << k) ? 4096 : 16, len = 0;
    char got[4096];
    bool denied = false;
    size_t at = rlen - unread(cl->fd); /* where this request's reply starts */
    kt__clear_error();
    kt_result r = request(cl, op == 7 ? 0 : op, got, cap, &len, &denied);
    check(r == KT_SUCCESS || r == KT_ERR_STORE || r == KT_ERR_TIMEOUT || r == KT_ERR_INVALID_ARGUMENT ||
              r == KT_ERR_TRUNCATED,
          "a documented result");
    check(r == KT_SUCCESS || kt_last_error()[0], "an error has a message");
    if (cl->fd < 0) {
      check(r != KT_SUCCESS, "a request that closed the connection failed");
      break;
    }
    /* Still connected: exactly one frame was read. */
    size_t now = rlen - unread(cl->fd);
    check(rlen - at >= KT_PROTO_HDR_SIZE, "a whole header was there");
    kt_proto_hdr h;
    kt_proto_decode(reply + at, &h);
    check(h.magic == KT_PROTO_MAGIC && h.op == KT_OP_REPLY && h.vlen <= KT_STORE_MAX_VALUE, "a well-formed reply");
    check(now - at == KT_PROTO_HDR_SIZE + (size_t)h.vlen, "the stream stays in step: one whole frame read");
    if (op == 2 && r == KT_SUCCESS) {
      check(len == h.vlen && len <= cap, "a value within the buffer");
      check(memcmp(got, reply + at + KT_PROTO_HDR_SIZE, len) == 0, "the value is the reply's");
    }
    if (op == 2 && r == KT_ERR_TRUNCATED) check(len == h.vlen && len > cap, "truncated only when too long");
    if (denied) check(false, "a denied hello closes the connection");
  }
  if (cl->fd >= 0) close(cl->fd);
  pthread_mutex_destroy(&cl->mu);
  free(cl);
  close(sv[1]);
  return 0;
}
