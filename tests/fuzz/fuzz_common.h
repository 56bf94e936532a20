/* fuzz_common.h - what the harnesses that drive library internals share:
 * check() (a failed check is a finding: abort, naming the harness, FUZZ_NAME,
 * and the library's last error), quiet logs, little-endian fields of the
 * input. Included after the library's sources. */
#ifndef KT_FUZZ_COMMON_H
#define KT_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including fuzz_common.h"
#endif

static void check(int cond, const char *what) {
  if (!cond) {
    fprintf(stderr, FUZZ_NAME ": check failed: %s (last error: %s)\n", what, kt_last_error());
    abort();
  }
}

#ifndef FUZZ_OWN_INIT /* a harness that needs more at start defines its own */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  setenv("KAITIAN_DEBUG", "NONE", 1); /* quiet logs */
  kt__log_init();
  return 0;
}
#endif

/* The n-byte little-endian number at p. */
__attribute__((unused)) static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

#endif
