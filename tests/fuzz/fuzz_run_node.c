/* fuzz_run_node.c - libFuzzer harness for what the launchers of a
 * multi-node job read from each other through the store
 * (tools/kaitian/run_node.c, run_live.c): a node's published -n
 * (kt__run_parse_nproc), a posted failure's "node status host"
 * (kt__run_parse_failed_info), node 0's heartbeat "PORT TOKEN"
 * (kt__run_live_parse), and a whole failure poll (kt__run_node_poll_failure)
 * against a store (a table of operations here) whose failure line and
 * failure info are the input's.
 *
 * Input: byte 0 picks the target (mod 4); bytes 1-4 a number (the ranks of
 * the job so far, for -n); the rest is the text (for the poll: the line, a
 * NUL, the info).
 * Checks besides crashes and sanitizer reports: an accepted -n is the
 * decimal text exactly, 1-4096, and keeps the job within 2^30 ranks; a
 * failure's status is always 1-255, its node a rank or -1, its host ends
 * inside its buffer; an accepted heartbeat address has a port 1-65535 and a
 * token of 32 hex digits that reads back the same; a poll returns 1 with
 * the line (cut to the buffer) and a rejected text is an error with a
 * message. */
#include "../../tools/kaitian/tool.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_run_node"
#include "fuzz_common.h"

static const char *g_line, *g_info;
static size_t g_line_len, g_info_len;

static kt_result fake_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, int64_t timeout_ms) {
  (void)ctx;
  (void)timeout_ms;
  const char *v = !strcmp(key, KT_RUN_KEY_FAILED) ? g_line : !strcmp(key, KT_RUN_KEY_FAILED_INFO) ? g_info : NULL;
  size_t n = v == g_line ? g_line_len : g_info_len;
  if (!v) return kt__err(KT_ERR_TIMEOUT, "no key %s", key);
  *len = n;
  if (n > cap) return kt__err(KT_ERR_TRUNCATED, "value of %zu bytes", n);
  memcpy(buf, v, n);
  return KT_SUCCESS;
}
static kt_result fake_check(void *ctx, const char *const *keys, size_t nkeys, int *ready) {
  (void)ctx;
  (void)keys;
  (void)nkeys;
  *ready = 1;
  return KT_SUCCESS;
}

static void nproc(const char *s, int world) {
  int np = -7;
  bool ok = kt__run_parse_nproc(s, world, &np);
  char *end;
  long v = strtol(s, &end, 10);
  if (ok) {
    check(end != s && *end == '\0' && v == np, "-n is the text exactly");
    check(np >= 1 && np <= KT_RUN_MAX_NPROC && (int64_t)world + np <= (1 << 30), "-n in range");
  } else {
    check(np == -7, "a rejected -n sets nothing");
  }
}

static void failed_info(const char *s) {
  char host[16];
  memset(host, 'x', sizeof host);
  snprintf(host, sizeof host, "?");
  int node = -1, status = 1;
  kt__run_parse_failed_info(s, &node, &status, host, sizeof host);
  check(status >= 1 && status <= 255, "a status 1-255");
  check(node >= -1, "a node rank or -1");
  check(memchr(host, '\0', sizeof host) != NULL, "the host ends inside its buffer");
}

static void live(const char *s) {
  int port = -1;
  uint8_t token[KT_RUN_LIVE_TOKEN];
  kt__clear_error();
  if (kt__run_live_parse(s, &port, token) == KT_SUCCESS) {
    check(port >= 1 && port <= 65535, "a port 1-65535");
    char back[2 * KT_RUN_LIVE_TOKEN + 1];
    for (int i = 0; i < KT_RUN_LIVE_TOKEN; i++) snprintf(back + 2 * i, 3, "%02x", token[i]);
    const char *t = strrchr(s, ' ');
    check(t && strlen(t + 1) == 2 * KT_RUN_LIVE_TOKEN, "a token of 32 digits");
    for (int i = 0; i < 2 * KT_RUN_LIVE_TOKEN; i++)
      check(tolower((unsigned char)t[1 + i]) == back[i], "the token reads back the same");
  } else {
    check(kt_last_error()[0] != '\0', "a rejection has a message");
  }
}

static void poll_failure(const char *p, size_t n) {
  const char *nul = memchr(p, '\0', n);
  g_line = p;
  g_line_len = nul ? (size_t)(nul - p) : n;
  g_info = nul ? nul + 1 : "";
  g_info_len = nul ? n - g_line_len - 1 : 0;
  kt_store_ops ops = {.get = fake_get, .check = fake_check};
  kt_run_node node;
  memset(&node, 0, sizeof node);
  if (kt_store_create(&ops, NULL, &node.store) != KT_SUCCESS) abort();
  char line[64], host[32];
  int status = 0, who = -2;
  int rc = kt__run_node_poll_failure(&node, line, sizeof line, &status, &who, host, sizeof host);
  if (g_line_len < sizeof line) {
    check(rc == 1, "a posted failure is seen");
    check(strlen(line) <= g_line_len && memchr(line, '\0', sizeof line), "the line as posted");
    check(status >= 1 && status <= 255 && who >= -1, "status 1-255, node a rank or -1");
    check(memchr(host, '\0', sizeof host) != NULL, "the host ends inside its buffer");
  } else {
    check(rc == -1 && kt_last_error()[0], "a line too long for the buffer is an error with a message");
  }
  kt_store_free(node.store);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5 || size > 2048) return 0;
  char s[2048];
  memcpy(s, data + 5, size - 5);
  s[size - 5] = '\0';
  int world = (int)(get_le(data + 1, 4) % ((1u << 30) + 1));
  switch (data[0] % 4) {
    case 0: nproc(s, world); break;
    case 1: failed_info(s); break;
    case 2: live(s); break;
    default: poll_failure((const char *)data + 5, size - 5); break;
  }
  return 0;
}
