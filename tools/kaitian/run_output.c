/* run_output.c - `kaitian run`: forwards each rank's stdout/stderr to the
 * launcher's own, one complete line at a time with a "[R] " prefix. */
#include "tool.h"

#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* Bytes read per read() call, and the longest line kept whole: a line longer
 * than this is cut (a newline is added) so memory stays bounded. */
#define READ_CHUNK 65536
#define MAX_LINE (1u << 20)

bool kt__run_write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        /* Someone made our stdout non-blocking (a shared tty): wait for room. */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rc;
        KT_SYSCALL_RETRY(rc, poll(&p, 1, -1));
        continue;
      }
      return false; /* EPIPE (reader gone) or worse: drop the output */
    }
    buf += w;
    len -= (size_t)w;
  }
  return true;
}

void kt__run_say(int fd, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  size_t len = KT_MIN((size_t)n, sizeof msg - 2);
  if (len == 0 || msg[len - 1] != '\n') msg[len++] = '\n';
  kt__run_write_all(fd, msg, len);
}

void kt__run_stream_init(kt_run_stream *s, int fd, int out_fd, int rank, bool prefix) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->out_fd = out_fd;
  if (prefix) snprintf(s->prefix, sizeof s->prefix, "[%d] ", rank);
  s->prefix_len = strlen(s->prefix);
}

/* Output assembled for one write: prefix + line for every complete line of a
 * read. Shared by all streams (the launcher is single-threaded). */
static char *out_buf;
static size_t out_cap;

static bool out_reserve(size_t need) {
  if (need <= out_cap) return true;
  size_t cap = out_cap ? out_cap : READ_CHUNK;
  while (cap < need) cap *= 2;
  char *p = realloc(out_buf, cap);
  if (!p) return false;
  out_buf = p;
  out_cap = cap;
  return true;
}

/* Forward the complete lines in s->buf; keep the partial tail. When force is
 * set the tail is forwarded too (with a newline added when prefixing). */
static void forward_lines(kt_run_stream *s, bool force) {
  size_t start = 0, used = 0;
  for (;;) {
    char *nl = start < s->len ? memchr(s->buf + start, '\n', s->len - start) : NULL;
    size_t end; /* one past the bytes of this piece */
    bool add_nl = false;
    if (nl) {
      end = (size_t)(nl - s->buf) + 1;
    } else if (start < s->len && (force || s->len - start >= MAX_LINE)) {
      end = s->len;
      add_nl = s->prefix_len > 0;
    } else {
      break;
    }
    size_t piece = end - start;
    if (!out_reserve(used + s->prefix_len + piece + 1)) {
      /* No memory for batching: write this line on its own. */
      kt__run_write_all(s->out_fd, out_buf, used);
      used = 0;
      kt__run_write_all(s->out_fd, s->prefix, s->prefix_len);
      kt__run_write_all(s->out_fd, s->buf + start, piece);
      if (add_nl) kt__run_write_all(s->out_fd, "\n", 1);
    } else {
      memcpy(out_buf + used, s->prefix, s->prefix_len);
      used += s->prefix_len;
      memcpy(out_buf + used, s->buf + start, piece);
      used += piece;
      if (add_nl) out_buf[used++] = '\n';
    }
    start = end;
  }
  if (used > 0) kt__run_write_all(s->out_fd, out_buf, used);
  if (start > 0) {
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
  }
}

static void stream_close(kt_run_stream *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* One read: bytes read (> 0), 0 when the pipe is empty now, -1 at the end
 * of the stream (the fd is then closed). */
static ssize_t pump_once(kt_run_stream *s) {
  if (s->fd < 0) return -1;
  if (s->cap - s->len < READ_CHUNK) {
    size_t cap = s->len + READ_CHUNK;
    char *p = realloc(s->buf, cap);
    if (p) {
      s->buf = p;
      s->cap = cap;
    } else {
      /* Out of memory: push out what we hold, whole lines or not, and read
       * through a small buffer so the rank never blocks on a full pipe. */
      forward_lines(s, true);
      if (s->cap - s->len < 4096) {
        char tmp[4096];
        ssize_t r;
        KT_SYSCALL_RETRY(r, read(s->fd, tmp, sizeof tmp));
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r <= 0) {
          stream_close(s);
          return -1;
        }
        kt__run_write_all(s->out_fd, s->prefix, s->prefix_len);
        kt__run_write_all(s->out_fd, tmp, (size_t)r);
        return r;
      }
    }
  }
  ssize_t r;
  KT_SYSCALL_RETRY(r, read(s->fd, s->buf + s->len, s->cap - s->len));
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    stream_close(s); /* EIO and friends: treat as the end of the stream */
    return -1;
  }
  if (r == 0) {
    stream_close(s);
    return -1;
  }
  s->len += (size_t)r;
  forward_lines(s, false);
  return r;
}

int kt__run_stream_pump(kt_run_stream *s) { return pump_once(s) < 0; }

void kt__run_stream_drain(kt_run_stream *s) {
  /* Read what the pipe holds now and no more: a descendant that keeps
   * writing must not keep us here. An empty pipe whose writers are all gone
   * reads as the end, which closes the stream. */
  int avail = 0;
  if (s->fd < 0) return;
  if (ioctl(s->fd, FIONREAD, &avail) != 0 || avail < 0) avail = 0;
  size_t got = 0;
  for (;;) {
    ssize_t n = pump_once(s);
    if (n <= 0) break;
    got += (size_t)n;
    if (got >= (size_t)avail) break;
  }
}

void kt__run_stream_finish(kt_run_stream *s) {
  kt__run_stream_drain(s);
  forward_lines(s, true);
  stream_close(s);
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
}
