/* fuzz_algo.c - libFuzzer harness for the parser of KAITIAN_ALGO
 * (parse_algo_spec in src/coll/tuner.c, reached by including that file).
 *
 * Input: the variable's text (up to 4 KiB; it is cut at its first NUL).
 * Checks besides crashes and sanitizer reports: every collective is either
 * left to the tuner (-1) or forced to an algorithm of that very collective;
 * send, recv and sendrecv are forced together to the same algorithm or not
 * at all; parsing is deterministic (twice, the same answer); a spec of one
 * "collective=algorithm" pair built from the table forces exactly that. */
#include "../../src/coll/tuner.c"

#define FUZZ_NAME "fuzz_algo" /* logs quiet: each ignored name would warn */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  int got[KT_COLL_COUNT], again[KT_COLL_COUNT];
  parse_algo_spec(text, got);
  parse_algo_spec(text, again);
  check(memcmp(got, again, sizeof got) == 0, "the same text parses the same way");
  for (int c = 0; c < KT_COLL_COUNT; c++) {
    check(got[c] >= -1 && got[c] < (int)NALGOS, "an index into the table or -1");
    if (got[c] >= 0) check(algos[got[c]].coll == (kt__coll)c, "a collective forced to one of its own algorithms");
  }
  const int s = got[KT_COLL_SEND], r = got[KT_COLL_RECV], sr = got[KT_COLL_SENDRECV];
  check((s < 0) == (r < 0) && (s < 0) == (sr < 0), "send, recv and sendrecv forced together");
  if (s >= 0)
    check(!strcmp(algos[s].name, algos[r].name) && !strcmp(algos[s].name, algos[sr].name),
          "send, recv and sendrecv forced to the same algorithm");
  /* The first byte also picks an entry of the table: "collective=name". */
  if (size > 0) {
    const algo *a = &algos[data[0] % NALGOS];
    char one[128];
    snprintf(one, sizeof one, "%s=%s", kt__coll_name(a->coll), a->name);
    parse_algo_spec(one, got);
    check(got[a->coll] >= 0 && !strcmp(algos[got[a->coll]].name, a->name), "a valid pair is forced");
    for (int c = 0; c < KT_COLL_COUNT; c++)
      if (c != (int)a->coll && got[c] >= 0)
        check(a->coll >= KT_COLL_SEND && a->coll <= KT_COLL_SENDRECV && c >= KT_COLL_SEND && c <= KT_COLL_SENDRECV,
              "a pair forces only its collective (point to point: all three)");
  }
  free(text);
  return 0;
}
