/* params.c - getters for the KAITIAN_* variables declared in params.def. Each
 * is read once, on first use, and cached; its value is logged at INFO. */
#include "common.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int64_t parse_int(const char *name, const char *s, int64_t def) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno != 0 || end == s) {
    KT_WARN("KAITIAN_%s=%s is not an integer; using the default %lld", name, s, (long long)def);
    return def;
  }
  /* Allow K/M/G suffixes for byte sizes. */
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    default: break;
  }
  if (shift) {
    if (v > LLONG_MAX / (1LL << shift) || v < LLONG_MIN / (1LL << shift)) {
      KT_WARN("KAITIAN_%s=%s is out of range; using the default %lld", name, s, (long long)def);
      return def;
    }
    v *= 1LL << shift;
    end++;
  }
  if (*end != '\0') {
    KT_WARN("KAITIAN_%s=%s has trailing characters; using the default %lld", name, s, (long long)def);
    return def;
  }
  return v;
}

__attribute__((unused)) static bool parse_bool(const char *name, const char *s, bool def) {
  if (!strcmp(s, "1") || !strcasecmp(s, "yes") || !strcasecmp(s, "true") || !strcasecmp(s, "on"))
    return true;
  if (!strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "false") || !strcasecmp(s, "off"))
    return false;
  KT_WARN("KAITIAN_%s=%s is not a boolean; using the default %d", name, s, def);
  return def;
}

static const char *parse_str(const char *name, const char *s, const char *def) {
  (void)name;
  (void)def;
  return s;
}

/* The logging level itself is a parameter, so log only after it is known. */
#define KT_PARAM_PARSE_INT parse_int
#define KT_PARAM_PARSE_STR parse_str
#define KT_PARAM_PARSE_BOOL parse_bool

#define KT_PARAM(name, type, def, help)                                          \
  static pthread_once_t once_##name = PTHREAD_ONCE_INIT;                        \
  static KT_PARAM_TYPE_##type value_##name;                                      \
  static bool set_##name;                                                        \
  static void init_##name(void) {                                                \
    const char *s = getenv("KAITIAN_" #name);                                    \
    set_##name = s && *s;                                                        \
    value_##name = set_##name ? KT_PARAM_PARSE_##type(#name, s, def) : def;      \
  }                                                                              \
  KT_PARAM_TYPE_##type kt__param_##name(void) {                                  \
    pthread_once(&once_##name, init_##name);                                     \
    return value_##name;                                                         \
  }                                                                              \
  bool kt__param_set_##name(void) {                                              \
    pthread_once(&once_##name, init_##name);                                     \
    return set_##name;                                                           \
  }
#include "params.def"
#undef KT_PARAM

static void format_INT(char *buf, size_t cap, int64_t v) { snprintf(buf, cap, "%lld", (long long)v); }
static void format_STR(char *buf, size_t cap, const char *v) { snprintf(buf, cap, "%s", v ? v : ""); }
__attribute__((unused)) static void format_BOOL(char *buf, size_t cap, bool v) { snprintf(buf, cap, "%d", (int)v); }

void kt__param_visit(kt__param_visit_fn fn, void *arg) {
  char value[512];
#define KT_PARAM(name, type, def, help)          \
  format_##type(value, sizeof value, kt__param_##name()); \
  fn("KAITIAN_" #name, #type, #def, value, help, arg);
#include "params.def"
#undef KT_PARAM
}
