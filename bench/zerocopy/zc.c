// zc.c - measure sender/receiver CPU for plain send, MSG_ZEROCOPY and
// vmsplice+splice over TCP.
//
//   zc recv <bindaddr> <port> [readsize]
//   zc send <addr> <port> <plain|zc|splice> <chunk> <total> [ringbytes]
//
// Each side prints one line of key=value pairs with the CPU time
// (getrusage RUSAGE_SELF, user and sys) and wall time consumed between the
// start of the transfer and its end (sender: connect .. receiver's EOF;
// receiver: accept .. EOF).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

#define die(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno=%d %s)\n", errno, strerror(errno)); exit(1); } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double tv(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

struct snap { double wall, user, sys; };
static struct snap take(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (struct snap){now(), tv(ru.ru_utime), tv(ru.ru_stime)};
}

static void *alloc_buf(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap %zu", n);
  memset(p, 0x5a, n); // fault pages in before timing
  return p;
}

/* ---------------- receiver ---------------- */
static int do_recv(const char *addr, int port, size_t rsz) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) die("bad addr %s", addr);
  if (bind(ls, (void *)&sa, sizeof sa)) die("bind");
  if (listen(ls, 1)) die("listen");
  char *buf = alloc_buf(rsz);
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) die("accept");
  close(ls);
  int verify = getenv("ZC_VERIFY") != NULL;
  uint64_t bad = 0;
  struct snap a = take();
  uint64_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf, rsz);
    if (n < 0) { if (errno == EINTR) continue; die("read"); }
    if (n == 0) break;
    if (verify) // every 4 KiB stream offset carries its own offset as a 64-bit stamp
      for (uint64_t o = (total + 4095) & ~4095ull; o + 8 <= total + n; o += 4096) {
        uint64_t v;
        memcpy(&v, buf + (o - total), 8);
        if (v != o) bad++;
      }
    total += n;
  }
  struct snap b = take();
  close(fd);
  printf("RECV bytes=%llu wall=%.6f user=%.6f sys=%.6f", (unsigned long long)total,
         b.wall - a.wall, b.user - a.user, b.sys - a.sys);
  if (verify) printf(" verify_bad_pages=%llu", (unsigned long long)bad);
  printf("\n");
  return 0;
}

/* ---------------- MSG_ZEROCOPY completion bookkeeping ---------------- */
// Zerocopy send calls are numbered 0,1,2,... by the kernel (one id per
// sendmsg call that queued >0 bytes).  Completions arrive on the error queue as
// inclusive ranges [ee_info, ee_data].
#define IDWIN 65536u                  // window of ids tracked; >> ids outstanding
static uint8_t done_id[IDWIN];
static uint64_t zc_ids_done, zc_ids_copied, zc_notifs, zc_waits;

static void mark_done(uint32_t lo, uint32_t hi, int copied) {
  for (uint32_t i = lo;; i++) {
    done_id[i % IDWIN] = 1;
    zc_ids_done++;
    if (copied) zc_ids_copied++;
    if (i == hi) break;
  }
}

// Read all pending completions; if block, wait for at least one.
static void drain_errqueue(int fd, int block) {
  for (;;) {
    char ctrl[128];
    struct msghdr m = {.msg_control = ctrl, .msg_controllen = sizeof ctrl};
    int r = recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!block) return;
        struct pollfd p = {.fd = fd, .events = 0};
        zc_waits++;
        if (poll(&p, 1, 10000) <= 0) die("poll errqueue (timeout or error)");
        continue;
      }
      if (errno == EINTR) continue;
      die("recvmsg MSG_ERRQUEUE");
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)))
        continue;
      struct sock_extended_err *e = (void *)CMSG_DATA(c);
      if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY || e->ee_errno != 0) {
        fprintf(stderr, "unexpected errqueue origin=%u errno=%u\n", e->ee_origin, e->ee_errno);
        exit(1);
      }
      zc_notifs++;
      mark_done(e->ee_info, e->ee_data, (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0);
    }
    block = 0; // got something; keep draining without blocking
  }
}

/* ---------------- sender ---------------- */
enum mode { M_PLAIN, M_ZC, M_SPLICE };

struct slot { uint32_t first, last; int busy; };

static int slot_free(struct slot *s) {
  if (!s->busy) return 1;
  for (uint32_t i = s->first;; i++) {
    if (!done_id[i % IDWIN]) return 0;
    if (i == s->last) break;
  }
  s->busy = 0;
  return 1;
}

static int do_send(const char *addr, int port, enum mode mode, size_t chunk, uint64_t total,
                   size_t ringbytes) {
  size_t nbuf = ringbytes / chunk;
  if (nbuf < 4) nbuf = 4;
  char *ring = alloc_buf(nbuf * chunk);
  struct slot *slots = calloc(nbuf, sizeof *slots);

  int fd = -1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) die("bad addr %s", addr);
  for (int tries = 0;; tries++) { // receiver may not be listening yet
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (void *)&sa, sizeof sa) == 0) break;
    close(fd);
    if (tries > 1000) die("connect");
    usleep(10000);
  }
  if (mode == M_ZC) {
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
  }
  int pfd[2] = {-1, -1};
  if (mode == M_SPLICE) {
    if (pipe(pfd)) die("pipe");
    size_t psz = chunk < 65536 ? 65536 : chunk;
    if (fcntl(pfd[1], F_SETPIPE_SZ, (int)psz) < 0) die("F_SETPIPE_SZ %zu", psz);
  }

  int verify = getenv("ZC_VERIFY") != NULL; // correctness check only; not for timing
  struct snap a = take();
  uint64_t sent = 0, calls = 0, enobufs = 0;
  uint32_t next_id = 0;
  size_t k = 0;
  while (sent < total) {
    char *buf = ring + k * chunk;
    size_t len = chunk;
    if (total - sent < len) len = total - sent;
    if (verify && mode != M_ZC) // zc stamps below, after the slot is known to be free
      for (size_t o = 0; o + 8 <= len; o += 4096) { uint64_t v = sent + o; memcpy(buf + o, &v, 8); }
    if (mode == M_PLAIN) {
      size_t off = 0;
      while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, 0);
        if (n < 0) { if (errno == EINTR) continue; die("send"); }
        off += n; calls++;
      }
    } else if (mode == M_ZC) {
      while (!slot_free(&slots[k])) drain_errqueue(fd, 1);
      if (verify)
        for (size_t o = 0; o + 8 <= len; o += 4096) { uint64_t v = sent + o; memcpy(buf + o, &v, 8); }
      size_t off = 0;
      slots[k].first = next_id;
      while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_ZEROCOPY);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == ENOBUFS) { enobufs++; drain_errqueue(fd, 1); continue; } // optmem exhausted
          die("send MSG_ZEROCOPY");
        }
        off += n; calls++;
        done_id[next_id % IDWIN] = 0;
        next_id++;
      }
      slots[k].last = next_id - 1;
      slots[k].busy = 1;
      drain_errqueue(fd, 0);
    } else { // vmsplice user pages into the pipe, then splice pipe -> socket
      size_t off = 0;
      while (off < len) {
        struct iovec iov = {buf + off, len - off};
        ssize_t n = vmsplice(pfd[1], &iov, 1, 0);
        if (n < 0) { if (errno == EINTR) continue; die("vmsplice"); }
        off += n;
        ssize_t left = n;
        while (left > 0) {
          ssize_t m = splice(pfd[0], NULL, fd, NULL, left, SPLICE_F_MOVE | SPLICE_F_MORE);
          if (m < 0) { if (errno == EINTR) continue; die("splice"); }
          left -= m; calls++;
        }
      }
    }
    sent += len;
    k = (k + 1) % nbuf;
  }
  if (mode == M_ZC) // every id must complete before the buffers may be freed
    while (zc_ids_done < next_id) drain_errqueue(fd, 1);
  if (shutdown(fd, SHUT_WR)) die("shutdown");
  char tmp[64];
  while (read(fd, tmp, sizeof tmp) > 0) {} // wait for receiver's close
  struct snap b = take();
  close(fd);
  const char *mn[] = {"plain", "zc", "splice"};
  printf("SEND mode=%s chunk=%zu nbuf=%zu bytes=%llu wall=%.6f user=%.6f sys=%.6f calls=%llu "
         "zc_ids=%u zc_done=%llu zc_copied=%llu zc_notifs=%llu zc_waits=%llu enobufs=%llu\n",
         mn[mode], chunk, nbuf, (unsigned long long)sent, b.wall - a.wall, b.user - a.user,
         b.sys - a.sys, (unsigned long long)calls, next_id, (unsigned long long)zc_ids_done,
         (unsigned long long)zc_ids_copied, (unsigned long long)zc_notifs,
         (unsigned long long)zc_waits, (unsigned long long)enobufs);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "recv"))
    return do_recv(argv[2], atoi(argv[3]), argc > 4 ? strtoull(argv[4], 0, 0) : (1u << 20));
  if (argc >= 7 && !strcmp(argv[1], "send")) {
    enum mode m;
    if (!strcmp(argv[4], "plain")) m = M_PLAIN;
    else if (!strcmp(argv[4], "zc")) m = M_ZC;
    else if (!strcmp(argv[4], "splice")) m = M_SPLICE;
    else die("mode must be plain|zc|splice");
    return do_send(argv[2], atoi(argv[3]), m, strtoull(argv[5], 0, 0), strtoull(argv[6], 0, 0),
                   argc > 7 ? strtoull(argv[7], 0, 0) : (8u << 20));
  }
  fprintf(stderr, "usage: zc recv <bindaddr> <port> [readsize]\n"
                  "       zc send <addr> <port> <plain|zc|splice> <chunk> <total> [ringbytes]\n");
  return 2;
}
