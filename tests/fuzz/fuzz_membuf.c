/* fuzz_membuf.c - libFuzzer harness for the single-copy buffer offers a
 * peer posts in the segment (kt__membuf: file descriptor, device, inode,
 * offset; src/transport/shm.c, included here to reach map_peer_buf), as the
 * single-copy allreduce maps them.
 *
 * The "peer" is this process (its pid): two registered-like files (memfds of
 * 64 KiB and 1 MiB) are open in it. Each input is a sequence of offers (up
 * to 8, each: which descriptor (one of the two files, stdin, a closed or a
 * random number), whether dev/ino are the file's or mutated, offset, bytes),
 * mapped in turn into a peer map table of SHM_MAPS entries, so the cached
 * path, eviction and fresh maps all run.
 * Checks besides crashes and sanitizer reports: a mapped offer names one of
 * the two files by its device and inode, and [offset, offset + bytes) lies
 * inside it (the byte there reads back what the file holds); a refused one
 * says why; the table never holds two entries for one file. */
#include "../../src/transport/shm.c"

#include <stdint.h>
#include <sys/mman.h>

#define FUZZ_NAME "fuzz_membuf"
#include "fuzz_common.h"

static int files[2] = {-1, -1};
static size_t sizes[2] = {65536, 1 << 20};
static struct stat st[2];

static void open_files(void) {
  if (files[0] >= 0) return;
  for (int i = 0; i < 2; i++) {
    files[i] = memfd_create(i ? "kt_fuzz_membuf_b" : "kt_fuzz_membuf_a", MFD_CLOEXEC);
    if (files[i] < 0 || ftruncate(files[i], (off_t)sizes[i]) != 0 || fstat(files[i], &st[i]) != 0) abort();
    /* Every byte says which file and where: b[k] = (k + 7 * i) & 0xff. */
    unsigned char *p = mmap(NULL, sizes[i], PROT_READ | PROT_WRITE, MAP_SHARED, files[i], 0);
    if (p == MAP_FAILED) abort();
    for (size_t k = 0; k < sizes[i]; k++) p[k] = (unsigned char)(k + 7 * (size_t)i);
    munmap(p, sizes[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  open_files();
  static int32_t pids[2];
  kt__group c;
  kt__shm s;
  memset(&c, 0, sizeof c);
  memset(&s, 0, sizeof s);
  c.rank = 0;
  c.size = 2;
  pids[1] = (int32_t)getpid();
  c.peer_pid = pids;
  c.shm = &s;
  s.n = 2;
  s.maps = calloc(2 * SHM_MAPS, sizeof *s.maps);
  if (!s.maps) abort();
  for (size_t at = 0; at + 20 <= size && at < 8 * 20; at += 20) {
    const uint8_t *q = data + at;
    kt__membuf b;
    int which = q[0] % 6; /* 0, 1: a file; 2: stdin; 3: a closed fd; 4, 5: a random number */
    int f = which < 2 ? which : -1;
    b.fd = which < 2 ? files[which] : which == 2 ? 0 : which == 3 ? 1000 : (int32_t)get_le(q + 1, 4);
    b.dev = f >= 0 && !(q[5] & 1) ? (uint64_t)st[f].st_dev : get_le(q + 6, 2);
    b.ino = f >= 0 && !(q[5] & 2) ? (uint64_t)st[f].st_ino : get_le(q + 8, 2);
    b.off = q[5] & 4 ? get_le(q + 10, 8) : get_le(q + 10, 3);
    size_t bytes = q[5] & 8 ? (size_t)get_le(q + 18, 2) << (q[5] >> 4) : get_le(q + 18, 2);
    char why[256] = "";
    char *p = map_peer_buf(&c, 1, &b, bytes, why, sizeof why);
    if (!p) {
      check(why[0] != '\0', "a refusal says why");
      continue;
    }
    int g = -1;
    for (int i = 0; i < 2; i++)
      if ((uint64_t)st[i].st_dev == b.dev && (uint64_t)st[i].st_ino == b.ino) g = i;
    check(g >= 0, "a mapped offer names one of the files");
    check(b.off <= sizes[g] && bytes <= sizes[g] - b.off, "the offer lies inside its file");
    if (bytes) {
      check((unsigned char)p[0] == (unsigned char)(b.off + 7 * (uint64_t)g), "its first byte is the file's");
      check((unsigned char)p[bytes - 1] == (unsigned char)(b.off + bytes - 1 + 7 * (uint64_t)g), "its last byte too");
    }
    for (int i = 0; i < SHM_MAPS; i++)
      for (int j = i + 1; j < SHM_MAPS; j++)
        check(!s.maps[SHM_MAPS + i].base || !s.maps[SHM_MAPS + j].base || s.maps[SHM_MAPS + i].ino != s.maps[SHM_MAPS + j].ino ||
                  s.maps[SHM_MAPS + i].dev != s.maps[SHM_MAPS + j].dev,
              "one entry per file");
  }
  for (int i = 0; i < 2 * SHM_MAPS; i++)
    if (s.maps[i].base) munmap(s.maps[i].base, s.maps[i].len);
  free(s.maps);
  return 0;
}
