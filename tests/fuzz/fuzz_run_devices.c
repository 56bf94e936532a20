/* fuzz_run_devices.c - libFuzzer harness for what `kaitian run` reads from
 * its device-discovery helper (tools/kaitian/run_devices.c, included here to
 * reach its static functions): the helper's stdout, lines "TYPE COUNT"
 * (parse_known), then the message naming what it found (format_known) and
 * the accelerators --devices auto plans from it (auto_accelerators).
 *
 * Input: byte 0: -n for the plan (1-256); the rest is the helper's stdout
 * (up to the first NUL).
 * Checks besides crashes and sanitizer reports: an accepted output gives at
 * most KT_RUN_MAX_TYPES - 1 types (room for cpu), each a valid type name
 * (lower case, digits, '_', below KT_RUN_TYPE_LEN), not "cpu", each once,
 * with the count of its first line (0-999,999); a rejected one says why,
 * quoting the line; the plan takes at most -n ranks, each type at most its
 * count. */
#include "../../tools/kaitian/run_devices.c"

#include <stdint.h>

#define FUZZ_NAME "fuzz_run_devices"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > DISCOVER_OUT_MAX + 1) return 0;
  static char out[DISCOVER_OUT_MAX + 1];
  memcpy(out, data + 1, size - 1);
  out[size - 1] = '\0';
  known k;
  memset(&k, 0, sizeof k);
  if (!parse_known(out, "python3", &k)) {
    check(strncmp(k.why, "unexpected output from python3", 30) == 0, "a rejection says why");
    return 0;
  }
  check(k.n >= 0 && k.n <= KT_RUN_MAX_TYPES - 1, "room for cpu");
  for (int i = 0; i < k.n; i++) {
    size_t len = strnlen(k.name[i], KT_RUN_TYPE_LEN);
    check(len < KT_RUN_TYPE_LEN && valid_type(k.name[i], len), "a valid type name");
    check(strcmp(k.name[i], "cpu") != 0, "cpu is not an accelerator");
    for (int j = 0; j < i; j++) check(strcmp(k.name[i], k.name[j]) != 0, "each type once");
    check(k.count[i] >= 0 && k.count[i] <= 999999, "a count of at most 6 digits");
    /* Its first line says the same count. */
    char want[KT_RUN_TYPE_LEN + 2];
    snprintf(want, sizeof want, "%s ", k.name[i]);
    const char *line = out;
    while (line && strncmp(line, want, strlen(want)) != 0) {
      line = strchr(line, '\n');
      if (line) line++;
    }
    check(line && atoi(line + strlen(want)) == k.count[i], "the count of its line");
  }
  char buf[1024];
  format_known(&k, buf, sizeof buf);
  check(memchr(buf, '\0', sizeof buf) != NULL, "the message ends inside its buffer");
  int nproc = data[0] % 256 + 1, off = 0;
  kt_run_devspec plan;
  memset(&plan, 0, sizeof plan);
  if (auto_accelerators(&k, nproc, &plan, &off) == -1) {
    check(plan.total <= nproc && plan.ntypes <= k.n, "at most -n ranks");
    for (int i = 0; i < plan.ntypes; i++) {
      int j = 0;
      while (j < k.n && strcmp(k.name[j], plan.type[i]) != 0) j++;
      check(j < k.n && plan.count[i] >= 1 && plan.count[i] <= k.count[j], "each type at most its count");
    }
  }
  return 0;
}
