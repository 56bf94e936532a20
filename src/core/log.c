/* log.c - leveled logging to stderr with a host:pid:tid [rank] prefix. The
 * level test happens in the KT_* macros before any formatting. */
#include "common.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int kt__log_level = KT_LOG_WARN;
static int log_rank = -1;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_init_once(void) {
  const char *lvl = kt__param_DEBUG();
  if (strcasecmp(lvl, "NONE") == 0) kt__log_level = KT_LOG_NONE;
  else if (strcasecmp(lvl, "INFO") == 0) kt__log_level = KT_LOG_INFO;
  else if (strcasecmp(lvl, "TRACE") == 0) kt__log_level = KT_LOG_TRACE;
  else kt__log_level = KT_LOG_WARN;
  if (gethostname(log_host, sizeof log_host) != 0) strcpy(log_host, "?");
  log_host[sizeof log_host - 1] = '\0';
  char *dot = strchr(log_host, '.');
  if (dot) *dot = '\0';
}

void kt__log_init(void) { pthread_once(&log_once, log_init_once); }

void kt__log_set_rank(int rank) { __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED); }

void kt__log(int level, const char *file, int line, const char *fmt, ...) {
  static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int rank = __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
  /* One fprintf so lines from several threads do not interleave. */
  fprintf(stderr, "%s:%d:%ld [%d] KAITIAN %s %s:%d %s\n", log_host, (int)getpid(),
          (long)syscall(SYS_gettid), rank, names[level], base, line, msg);
}
