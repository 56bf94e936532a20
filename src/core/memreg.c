/* memreg.c - the process's registered buffers (kt_mem_*): memory that is a
 * shared mapping of a file descriptor, so that the peers on this host can map
 * it too and an allreduce can read and write it in place (see
 * allreduce_shm_direct.c). One table per process, under a mutex: the caller's
 * threads register, the progress thread looks up. */
#include "memreg.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct reg {
  char *buf;
  size_t bytes;
  int fd;
  uint64_t off, dev, ino;
  bool owned; /* kt_mem_alloc's: unmapped and closed by kt_mem_free */
} reg;

_Atomic uint64_t kt__memreg_direct_runs;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static reg *regs;
static size_t nregs, capregs;

static void drop_at(size_t i) {
  regs[i] = regs[--nregs];
}

/* Remove registrations overlapping [buf, buf + bytes) (not owned ones). */
static void drop_overlapping(const char *buf, size_t bytes) {
  for (size_t i = 0; i < nregs;)
    if (!regs[i].owned && regs[i].buf < buf + bytes && buf < regs[i].buf + regs[i].bytes) drop_at(i);
    else i++;
}

static kt_result add(char *buf, size_t bytes, int fd, uint64_t off, const struct stat *st, bool owned) {
  if (nregs == capregs) {
    size_t cap = capregs ? capregs * 2 : 16;
    reg *r = realloc(regs, cap * sizeof *r);
    if (!r) return kt__err(KT_ERR_NO_MEMORY, "kt_mem_register: cannot grow the registration table");
    regs = r;
    capregs = cap;
  }
  regs[nregs++] = (reg){buf, bytes, fd, off, (uint64_t)st->st_dev, (uint64_t)st->st_ino, owned};
  return KT_SUCCESS;
}

kt_result kt_mem_register(void *buf, size_t bytes, int fd, uint64_t offset) {
  if (!buf || bytes == 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_register: %s", buf ? "bytes is 0" : "buf is NULL");
  long page = sysconf(_SC_PAGESIZE);
  if ((uintptr_t)buf % (uintptr_t)page != offset % (uint64_t)page)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_mem_register: buf %p and offset %llu differ modulo the page size (%ld): buf cannot be "
                   "a mapping of the file at that offset",
                   buf, (unsigned long long)offset, page);
  struct stat st;
  if (fstat(fd, &st) != 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_register: fd %d: %s", fd, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_register: fd %d is not a regular file (shm_open or memfd)",
                   fd);
  if (offset > (uint64_t)st.st_size || bytes > (uint64_t)st.st_size - offset)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_mem_register: %zu bytes at offset %llu run past the end of fd %d (%lld bytes)", bytes,
                   (unsigned long long)offset, fd, (long long)st.st_size);
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nregs; i++)
    if (regs[i].owned && regs[i].buf < (char *)buf + bytes && (char *)buf < regs[i].buf + regs[i].bytes) {
      pthread_mutex_unlock(&lock);
      return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_register: %p overlaps memory from kt_mem_alloc", buf);
    }
  drop_overlapping(buf, bytes);
  kt_result r = add(buf, bytes, fd, offset, &st, false);
  pthread_mutex_unlock(&lock);
  return r;
}

kt_result kt_mem_deregister(void *buf) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nregs; i++)
    if (regs[i].buf == buf) {
      if (regs[i].owned) {
        pthread_mutex_unlock(&lock);
        return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_deregister: %p is from kt_mem_alloc: use kt_mem_free",
                       buf);
      }
      drop_at(i);
      pthread_mutex_unlock(&lock);
      return KT_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_deregister: no registration starts at %p", buf);
}

kt_result kt_mem_alloc(size_t bytes, void **ptr) {
  if (!ptr) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_alloc: bytes is 0");
  int fd = memfd_create("kaitian-buffer", MFD_CLOEXEC);
  if (fd < 0) return kt__err(KT_ERR_SYSTEM, "kt_mem_alloc: memfd_create: %s", strerror(errno));
  if (ftruncate(fd, (off_t)bytes) != 0) {
    int e = errno;
    close(fd);
    return kt__err(KT_ERR_NO_MEMORY, "kt_mem_alloc: %zu bytes: ftruncate: %s", bytes, strerror(e));
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return kt__err(KT_ERR_NO_MEMORY, "kt_mem_alloc: %zu bytes: mmap: %s", bytes, strerror(e));
  }
  struct stat st;
  kt_result r = fstat(fd, &st) == 0 ? KT_SUCCESS : kt__err(KT_ERR_SYSTEM, "kt_mem_alloc: fstat: %s", strerror(errno));
  if (r == KT_SUCCESS) {
    pthread_mutex_lock(&lock);
    drop_overlapping(p, bytes); /* stale registrations of memory since unmapped */
    r = add(p, bytes, fd, 0, &st, true);
    pthread_mutex_unlock(&lock);
  }
  if (r != KT_SUCCESS) {
    munmap(p, bytes);
    close(fd);
    return r;
  }
  *ptr = p;
  return KT_SUCCESS;
}

kt_result kt_mem_free(void *ptr) {
  if (!ptr) return KT_SUCCESS;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nregs; i++)
    if (regs[i].buf == ptr && regs[i].owned) {
      reg r = regs[i];
      drop_at(i);
      pthread_mutex_unlock(&lock);
      munmap(r.buf, r.bytes);
      close(r.fd);
      return KT_SUCCESS;
    }
  pthread_mutex_unlock(&lock);
  return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_mem_free: %p was not returned by kt_mem_alloc", ptr);
}

bool kt__memreg_find(const void *buf, size_t bytes, kt__membuf *out) {
  const char *p = buf;
  bool found = false;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < nregs && !found; i++) {
    reg *g = &regs[i];
    if (p < g->buf || p >= g->buf + g->bytes || bytes > (size_t)(g->buf + g->bytes - p)) continue;
    /* Still the file it was registered with? (A buffer freed without
     * kt_mem_deregister closes its fd, or the number now names another file.)
     * kt_mem_alloc's own fds stay open until kt_mem_free. */
    struct stat st;
    if (!g->owned && (fstat(g->fd, &st) != 0 || (uint64_t)st.st_dev != g->dev || (uint64_t)st.st_ino != g->ino ||
        (uint64_t)st.st_size < g->off + g->bytes)) {
      KT_INFO("registered buffer %p (%zu bytes, fd %d) is gone: registration dropped", (void *)g->buf, g->bytes,
              g->fd);
      drop_at(i);
      break;
    }
    *out = (kt__membuf){g->fd, g->dev, g->ino, g->off + (uint64_t)(p - g->buf)};
    found = true;
  }
  pthread_mutex_unlock(&lock);
  return found;
}
