/* fuzz_params.c - libFuzzer harness for the parsing of the KAITIAN_*
 * variables (src/core/params.c, included here to reach its static parsers):
 * integers with K/M/G suffixes and booleans, as every INT and BOOL entry of
 * params.def reads them.
 *
 * Input: byte 0 picks the parser (bit 0: integer or boolean), the rest is the
 * variable's value (up to the first NUL).
 * Checks besides crashes and sanitizer reports (a signed overflow in a
 * suffix was one): an accepted integer is exactly what the text says (the
 * number, times 2^10, 2^20 or 2^30 for a suffix, no overflow); anything
 * else is rejected with the default returned and a WARN line (captured);
 * a boolean is one of the documented spellings, else the default with a
 * WARN line. */
#define FUZZ_OWN_INIT
#include "../../src/core/params.c"

#include <ctype.h>
#include <limits.h>
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_params"
#include "fuzz_common.h"

static int warn_pipe[2] = {-1, -1};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("KAITIAN_DEBUG", "WARN", 1);
  kt__log_init();
  /* WARN lines go to stderr: catch them in a pipe to see that a rejection
   * said so. */
  if (pipe(warn_pipe) != 0) abort();
  fcntl(warn_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(warn_pipe[1], F_SETFL, O_NONBLOCK);
  return 0;
}

/* Bytes WARN wrote since the last call (the pipe drained). */
static size_t warned(void) {
  char buf[4096];
  size_t total = 0;
  ssize_t r;
  while ((r = read(warn_pipe[0], buf, sizeof buf)) > 0) total += (size_t)r;
  return total;
}

/* The value the text stands for, by a second reading: false when it is no
 * integer the parser may accept. */
static bool expect_int(const char *s, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno || end == s) return false;
  __int128 w = v;
  if (*end == 'k' || *end == 'K') w *= (__int128)1 << 10, end++;
  else if (*end == 'm' || *end == 'M') w *= (__int128)1 << 20, end++;
  else if (*end == 'g' || *end == 'G') w *= (__int128)1 << 30, end++;
  if (*end || w > LLONG_MAX || w < LLONG_MIN) return false;
  *out = (int64_t)w;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 256) return 0;
  char s[257];
  memcpy(s, data + 1, size - 1);
  s[size - 1] = '\0';
  int saved = dup(2);
  dup2(warn_pipe[1], 2);
  warned();
  if (data[0] & 1) {
    bool b = parse_bool("FUZZ", s, true);
    size_t w = warned();
    dup2(saved, 2);
    bool yes = !strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "true") || !strcasecmp(s, "on");
    bool no = !strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "false") || !strcasecmp(s, "off");
    check(yes ? b && !w : no ? !b && !w : b && w > 0, "a boolean is a documented spelling, else the default and a WARN");
  } else {
    const int64_t def = 424242;
    int64_t v = parse_int("FUZZ", s, def), want = 0;
    size_t w = warned();
    dup2(saved, 2);
    if (expect_int(s, &want)) check(v == want && !w, "an accepted integer is what the text says");
    else check(v == def && w > 0, "a rejected integer gives the default and a WARN");
  }
  close(saved);
  return 0;
}
