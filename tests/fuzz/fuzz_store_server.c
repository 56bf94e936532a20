/* fuzz_store_server.c - libFuzzer harness for the rendezvous store server's
 * frame decoder and request handling (src/store/tcp_server.c), the part
 * that reads bytes from any peer on the network.
 *
 * One server runs for the whole campaign (loopback, a job secret). Each
 * input is sent on a new connection, then the connection is half-closed and
 * its replies read until the server closes it or 100 ms pass. The first
 * byte picks the preamble: even: the input as is (a peer without the
 * secret, or with a forged HELLO); odd: a correct HELLO first, so the rest
 * reaches request handling. Every 32 inputs a real client sets and gets a
 * key: a server that stopped answering, or answers wrongly, is a finding, as
 * are crashes and sanitizer reports (the server runs in this process). */
#include "store/proto.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SECRET "fuzz-secret-0123"

static kt_store_server server;
static int port;
static unsigned long inputs;

static void fail(const char *what) {
  fprintf(stderr, "fuzz_store_server: %s: %s\n", what, kt_last_error());
  abort();
}

static void start(void) {
  if (server) return;
  setenv("KAITIAN_DEBUG", "NONE", 1);
  if (kt_store_server_start("127.0.0.1", 0, SECRET, &server) != KT_SUCCESS) fail("cannot start the server");
  port = kt_store_server_port(server);
}

/* A real client still gets correct answers. */
static void probe(void) {
  kt_store st;
  if (kt_store_tcp_connect("127.0.0.1", port, SECRET, 5000, &st) != KT_SUCCESS) fail("a real client cannot connect");
  char key[32], got[32];
  size_t len = 0;
  snprintf(key, sizeof key, "probe/%lu", inputs);
  if (kt_store_set(st, key, "v", 1) != KT_SUCCESS) fail("set failed");
  if (kt_store_get(st, key, got, sizeof got, &len, 5000) != KT_SUCCESS || len != 1 || got[0] != 'v')
    fail("get returned a wrong value");
  kt_store_delete(st, key);
  kt_store_free(st);
}

static void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0) return; /* the server closed: fine */
    p += n;
    len -= (size_t)n;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 16) return 0;
  start();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0) fail("socket");
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    /* libFuzzer's timer signal can interrupt it: the connection goes on. */
    int err = errno;
    socklen_t elen = sizeof err;
    struct pollfd w = {.fd = fd, .events = POLLOUT};
    if (err == EINTR) {
      while (poll(&w, 1, 5000) < 0 && errno == EINTR) {
      }
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) err = errno;
    }
    if (err) {
      fprintf(stderr, "fuzz_store_server: connect: %s\n", strerror(err));
      fail("cannot connect");
    }
  }
  /* Close with a reset: a campaign opens a connection per input, more than
   * the ephemeral ports could hold in TIME_WAIT. */
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  if (data[0] & 1) {
    unsigned char hdr[KT_PROTO_HDR_SIZE];
    kt_proto_hdr h = {.magic = KT_PROTO_MAGIC, .version = KT_PROTO_VERSION, .op = KT_OP_HELLO,
                      .vlen = (uint32_t)strlen(SECRET)};
    kt_proto_encode(&h, hdr);
    send_all(fd, hdr, sizeof hdr);
    send_all(fd, SECRET, strlen(SECRET));
  }
  send_all(fd, data + 1, size - 1);
  shutdown(fd, SHUT_WR);
  char buf[4096];
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (poll(&p, 1, 100) > 0 && recv(fd, buf, sizeof buf, 0) > 0) {
  }
  close(fd);
  if (++inputs % 32 == 0) probe();
  return 0;
}
