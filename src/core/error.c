/* error.c - result-code names and the thread-local last-error text. */
#include "common.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *kt_strerror(kt_result r) {
  switch (r) {
#define KT_X_STR(name, value, msg) \
  case name:                       \
    return #name ": " msg;
    KT_RESULT_LIST(KT_X_STR)
#undef KT_X_STR
  }
  return "KT_ERR_UNKNOWN: unknown result code";
}

const char *kt_last_error(void) { return last_error; }

kt_result kt__set_error(kt_result r, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  KT_LOG_AT(KT_LOG_INFO, "%s:%d error %s: %s", file, line, kt_strerror(r), last_error);
  (void)file;
  (void)line;
  return r;
}

void kt__error_prefix(const char *fmt, ...) {
  char prefix[512];
  char old[sizeof last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, last_error, sizeof old);
  size_t pl = strnlen(prefix, sizeof last_error - 1);
  size_t ol = strnlen(old, sizeof last_error - 1 - pl);
  memcpy(last_error, prefix, pl);
  memcpy(last_error + pl, old, ol);
  last_error[pl + ol] = '\0';
}

void kt__clear_error(void) { last_error[0] = '\0'; }

void kt__error_copy(char *dst, size_t cap) {
  if (cap == 0) return;
  snprintf(dst, cap, "%s", last_error);
}

void kt__error_set_text(const char *text) { snprintf(last_error, sizeof last_error, "%s", text); }
