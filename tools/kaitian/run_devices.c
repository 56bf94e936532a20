/* run_devices.c - `kaitian run --devices`: the device plan. Parses SPEC,
 * reads the USE_<TYPE> switches, asks torch (once, in a helper process)
 * which device types this host has and how many of each, and gives every
 * local rank its device. */
#include "tool.h"

#include <ctype.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The helper imports torch (1-2 s); past this deadline it is killed. */
#define DISCOVER_TIMEOUT_MS 60000
#define DISCOVER_OUT_MAX 8192 /* its stdout: a few "TYPE COUNT" lines */
#define DISCOVER_ERR_MAX 4096 /* the end of its stderr, for the message */

/* Run as `$PYTHON -c SCRIPT`: prints "TYPE COUNT" for every device type
 * this torch knows besides the CPU. torch.accelerator (torch >= 2.6) names
 * the host's accelerator; every torch.<name> module with device_count()
 * whose name torch.device() accepts (cuda, xpu, mps, mtia, a privateuse1
 * backend's module...) adds its type, with 0 devices when is_available()
 * says no. No vendor is named here. */
static const char discover_script[] =
    "import re, types, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "import torch\n"
    "found = {}\n"
    "def note(name, count):\n"
    "    if name not in found and name != 'cpu' and re.fullmatch('[a-z][a-z0-9_]{0,30}', name):\n"
    "        found[name] = max(0, int(count))\n"
    "def probe(name, mod):\n"
    "    try:\n"
    "        count = getattr(mod, 'device_count', None)\n"
    "        if isinstance(mod, types.ModuleType) and callable(count):\n"
    "            torch.device(name)\n"
    "            avail = getattr(mod, 'is_available', None)\n"
    "            note(name, count() if not callable(avail) or avail() else 0)\n"
    "    except Exception:\n"
    "        pass\n"
    "try:\n"
    "    cur = torch.accelerator.current_accelerator()\n"
    "    if cur is not None:\n"
    "        note(cur.type, torch.accelerator.device_count())\n"
    "except Exception:\n"
    "    pass\n"
    "try:\n"
    "    pu1 = torch._C._get_privateuse1_backend_name()\n"
    "except Exception:\n"
    "    pu1 = 'privateuseone'\n"
    "if pu1 != 'privateuseone':\n"
    "    probe(pu1, getattr(torch, pu1, None))\n"
    "for name, mod in sorted(vars(torch).items()):\n"
    "    if not name.startswith('_'):\n"
    "        probe(name, mod)\n"
    "for name, count in found.items():\n"
    "    print(name, count)\n";

bool kt__run_info_on(void) {
  kt__log_init();
  return kt__log_level >= KT_LOG_INFO;
}

/* ---- SPEC ----------------------------------------------------------------- */

static bool valid_type(const char *s, size_t len) {
  if (len == 0 || len >= KT_RUN_TYPE_LEN || s[0] < 'a' || s[0] > 'z') return false;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
      return false;
  return true;
}

static bool all_digits(const char *s, size_t len) {
  if (len == 0) return false;
  for (size_t i = 0; i < len; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* "--devices cuda:2,cpu:2" or "KAITIAN_DEVICES=cuda:2", for messages. */
static void spec_label(const kt_run_devspec *d, char *buf, size_t cap) {
  snprintf(buf, cap, "%s%s%.200s", d->source, d->source[0] == '-' ? " " : "=",
           *d->text ? d->text : "''");
}

static void spec_add(kt_run_devspec *d, const char *type, size_t tlen, int count) {
  snprintf(d->type[d->ntypes], KT_RUN_TYPE_LEN, "%.*s", (int)tlen, type);
  d->count[d->ntypes++] = count;
  d->total += count;
}

/* One item "TYPE[:COUNT]" (len bytes at item). */
static bool parse_item(const char *item, size_t len, kt_run_devspec *d, const char *label) {
  const char *colon = memchr(item, ':', len);
  size_t tlen = colon ? (size_t)(colon - item) : len;
  int it = (int)len;
  if (!valid_type(item, tlen)) {
    kt__run_say(2, "kaitian run: %s: bad device type '%.*s' in '%.*s' (a torch device type: "
                   "lower-case letters, digits and _, e.g. cuda, cpu, xpu)",
                label, (int)tlen, item, it, item);
    return false;
  }
  long count = 1;
  if (colon) {
    const char *num = colon + 1;
    size_t nlen = len - tlen - 1;
    if (!all_digits(num, nlen) || nlen > 9) {
      kt__run_say(2, "kaitian run: %s: COUNT '%.*s' in '%.*s' is not a number of ranks "
                     "(TYPE[:COUNT], e.g. cuda:2)", label, (int)nlen, num, it, item);
      return false;
    }
    count = strtol(num, NULL, 10);
    if (count == 0) {
      kt__run_say(2, "kaitian run: %s: COUNT must be at least 1 in '%.*s' (TYPE:COUNT is a "
                     "number of ranks, not a device index)", label, it, item);
      return false;
    }
  }
  for (int j = 0; j < d->ntypes; j++) {
    if (strlen(d->type[j]) == tlen && !strncmp(d->type[j], item, tlen)) {
      kt__run_say(2, "kaitian run: %s: %s is listed twice (give each type once, with its "
                     "count)", label, d->type[j]);
      return false;
    }
  }
  if (d->ntypes == KT_RUN_MAX_TYPES) {
    kt__run_say(2, "kaitian run: %s: more than %d device types", label, KT_RUN_MAX_TYPES);
    return false;
  }
  if (d->total + count > KT_RUN_MAX_NPROC) {
    kt__run_say(2, "kaitian run: %s: more than %d ranks on one node", label, KT_RUN_MAX_NPROC);
    return false;
  }
  spec_add(d, item, tlen, (int)count);
  return true;
}

bool kt__run_parse_devices(const char *text, const char *source, kt_run_devspec *d) {
  memset(d, 0, sizeof *d);
  d->text = text;
  d->source = source;
  if (!strcmp(text, "auto") || !strcmp(text, "auto+cpu")) {
    d->is_auto = true;
    d->fill_cpu = text[4] != '\0';
    return true;
  }
  char label[300];
  spec_label(d, label, sizeof label);
  if (!*text) {
    kt__run_say(2, "kaitian run: %s is empty: give auto, auto+cpu or TYPE[:COUNT],... (e.g. "
                   "cuda:2,cpu:2)", label);
    return false;
  }
  for (const char *p = text;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0) {
      kt__run_say(2, "kaitian run: %s: empty item; the form is auto, auto+cpu or "
                     "TYPE[:COUNT],... (e.g. cuda:2,cpu:2)", label);
      return false;
    }
    if ((len == 4 && !strncmp(p, "auto", 4)) || (len == 8 && !strncmp(p, "auto+cpu", 8))) {
      kt__run_say(2, "kaitian run: %s: %.*s stands alone, it cannot be combined with other "
                     "items", label, (int)len, p);
      return false;
    }
    if (!parse_item(p, len, d, label)) return false;
    if (!comma) break;
    p = comma + 1;
  }
  return true;
}

/* ---- switches ------------------------------------------------------------- */

static void upper(const char *type, char *buf, size_t cap) {
  size_t i = 0;
  for (; type[i] && i + 1 < cap; i++) buf[i] = (char)toupper((unsigned char)type[i]);
  buf[i] = '\0';
}

/* The switch of one device type: KAITIAN_USE_<TYPE>, else USE_<TYPE> (an
 * empty value counts as unset). Named after the type, these cannot be rows
 * of params.def: this is the one place they are read (documented in
 * docs/launcher.md and docs/env.md). *on: the type may be used (true when
 * neither is set); decided: "USE_CUDA=0", the variable that decided, "" when
 * none. Returns 0, or 2 with the message printed for a value that is not a
 * switch. */
static int type_switch(const char *type, bool *on, char *decided, size_t cap) {
  char up[KT_RUN_TYPE_LEN], names[2][KT_RUN_TYPE_LEN + 16];
  upper(type, up, sizeof up);
  snprintf(names[0], sizeof names[0], "KAITIAN_USE_%s", up);
  snprintf(names[1], sizeof names[1], "USE_%s", up);
  *on = true;
  decided[0] = '\0';
  for (int k = 0; k < 2; k++) {
    const char *v = getenv(names[k]);
    if (!v || !*v) continue;
    if (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") ||
        !strcasecmp(v, "on")) {
      *on = true;
    } else if (!strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "false") ||
               !strcasecmp(v, "off")) {
      *on = false;
    } else {
      kt__run_say(2, "kaitian run: %s=%.100s is not a switch: use 1 or 0 (yes/no, true/false, "
                     "on/off)", names[k], v);
      return 2;
    }
    snprintf(decided, cap, "%s=%.100s", names[k], v);
    return 0;
  }
  return 0;
}

/* ---- discovery: asking torch in a helper process ---------------------------- */

typedef struct known {
  bool ok;            /* the helper answered */
  char why[768];      /* otherwise what went wrong */
  int n;
  char name[KT_RUN_MAX_TYPES][KT_RUN_TYPE_LEN];
  int count[KT_RUN_MAX_TYPES];
} known;

typedef struct helper_out {
  char out[DISCOVER_OUT_MAX + 1];
  size_t out_len;
  bool out_full;      /* more stdout than out holds: not our script's */
  char err[DISCOVER_ERR_MAX + 1];
  size_t err_len;     /* the last DISCOVER_ERR_MAX bytes of stderr */
} helper_out;

/* In the child between fork and execv. The launcher has one thread here
 * (the store server starts later), so stdio is safe to use. */
static void helper_child(const char *path, int out_w, int err_w, pid_t launcher) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull > 0) {
    dup2(devnull, 0);
    close(devnull);
  }
  if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(127);
  char *const argv[] = {(char *)path, (char *)"-c", (char *)discover_script, NULL};
  execv(path, argv);
  dprintf(2, "cannot execute '%s': %s\n", path, strerror(errno));
  _exit(127);
}

/* Read what fd has now into h's stdout (which 0) or stderr (1) buffer.
 * Returns false at end of file or on an error: the fd is done. */
static bool read_some(int fd, helper_out *h, int which) {
  char chunk[4096];
  for (;;) {
    ssize_t got = read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (got == 0) return false;
    size_t g = (size_t)got;
    if (which == 0) {
      size_t room = DISCOVER_OUT_MAX - h->out_len;
      if (g > room) h->out_full = true;
      memcpy(h->out + h->out_len, chunk, KT_MIN(g, room));
      h->out_len += KT_MIN(g, room);
      h->out[h->out_len] = '\0';
    } else { /* keep the tail */
      if (h->err_len + g > DISCOVER_ERR_MAX) {
        size_t drop = KT_MIN(h->err_len, h->err_len + g - DISCOVER_ERR_MAX);
        memmove(h->err, h->err + drop, h->err_len - drop);
        h->err_len -= drop;
      }
      size_t keep = KT_MIN(g, (size_t)DISCOVER_ERR_MAX);
      memcpy(h->err + h->err_len, chunk + g - keep, keep);
      h->err_len += keep;
      h->err[h->err_len] = '\0';
    }
  }
}

/* Wait for the helper (pid) while collecting fds[0] (stdout) and fds[1]
 * (stderr), until it is reaped or the deadline passes (then it is killed).
 * Returns 0 with *wstatus set, or the stop signal that interrupted the
 * wait (the helper is killed and reaped). */
static int wait_helper(pid_t pid, int fds[2], helper_out *h, int *wstatus, bool *timed_out) {
  int64_t deadline = kt__now_ms() + DISCOVER_TIMEOUT_MS;
  int sig = 0;
  for (;;) {
    if (waitpid(pid, wstatus, WNOHANG) == pid) {
      for (int k = 0; k < 2; k++) /* what is left in the pipes */
        if (fds[k] >= 0) read_some(fds[k], h, k);
      return 0;
    }
    int64_t now = kt__now_ms();
    if (now >= deadline || (sig = kt__run_pending_stop_signal()) != 0) break;
    struct pollfd p[2];
    int idx[2];
    nfds_t n = 0;
    for (int k = 0; k < 2; k++) {
      if (fds[k] < 0) continue;
      idx[n] = k;
      p[n++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
    }
    /* Pipes closed: the helper is exiting; look again soon. */
    int rc = poll(p, n, (int)KT_MIN(deadline - now, n ? 200 : 10));
    for (nfds_t i = 0; rc > 0 && i < n; i++) {
      if (!p[i].revents || read_some(p[i].fd, h, idx[i])) continue;
      close(fds[idx[i]]);
      fds[idx[i]] = -1;
    }
  }
  *timed_out = sig == 0;
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  while (waitpid(pid, wstatus, 0) < 0 && errno == EINTR) {
  }
  return sig;
}

/* Start `path -c SCRIPT` and collect its output. Returns 0 when it ran
 * (*wstatus, *timed_out), -1 when it could not start (k->why), or the stop
 * signal that interrupted it. */
static int run_helper(const char *path, helper_out *h, int *wstatus, bool *timed_out, known *k) {
  int fds[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
  if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0) {
    snprintf(k->why, sizeof k->why, "cannot create pipes: %s", strerror(errno));
    goto fail;
  }
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(k->why, sizeof k->why, "fork failed: %s", strerror(errno));
    goto fail;
  }
  if (pid == 0) helper_child(path, out_p[1], err_p[1], launcher);
  setpgid(pid, pid); /* also here, so the group exists before we may kill it */
  close(out_p[1]);
  close(err_p[1]);
  fds[0] = out_p[0];
  fds[1] = err_p[0];
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  int sig = wait_helper(pid, fds, h, wstatus, timed_out);
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0) close(fds[i]);
  return sig;
fail:
  for (int i = 0; i < 2; i++) {
    if (out_p[i] >= 0) close(out_p[i]);
    if (err_p[i] >= 0) close(err_p[i]);
  }
  return -1;
}

/* The helper's stdout: lines "TYPE COUNT". Anything else means $PYTHON is
 * not the interpreter we think it is. */
static bool parse_known(const char *out, const char *path, known *k) {
  for (const char *p = out; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    const char *sp = memchr(p, ' ', len);
    size_t tlen = sp ? (size_t)(sp - p) : 0;
    if (!sp || !valid_type(p, tlen) || !all_digits(sp + 1, len - tlen - 1) ||
        len - tlen - 1 > 6) {
      snprintf(k->why, sizeof k->why, "unexpected output from %s -c <device discovery>: "
               "'%.*s'", path, (int)KT_MIN(len, 200), p);
      return false;
    }
    bool dup = tlen == 3 && !strncmp(p, "cpu", 3);
    for (int i = 0; i < k->n && !dup; i++)
      dup = strlen(k->name[i]) == tlen && !strncmp(k->name[i], p, tlen);
    if (!dup && k->n < KT_RUN_MAX_TYPES - 1) { /* room for cpu in a plan */
      snprintf(k->name[k->n], KT_RUN_TYPE_LEN, "%.*s", (int)tlen, p);
      k->count[k->n++] = (int)strtol(sp + 1, NULL, 10);
    }
    if (!nl) break;
    p = nl + 1;
  }
  return true;
}

/* "cuda (2 devices), xpu (0 devices), cpu" */
static void format_known(const known *k, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < k->n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s (%d device%s), ", k->name[i], k->count[i],
                            k->count[i] == 1 ? "" : "s");
  if (len < cap) snprintf(buf + len, cap - len, "cpu");
}

/* Why a helper that ran did not answer: the last line of its stderr, which
 * for Python is the exception ("ModuleNotFoundError: No module named 'torch'"). */
static void helper_failure(const helper_out *h, const char *path, int wstatus, bool timed_out,
                           known *k) {
  char desc[96];
  if (timed_out) {
    snprintf(k->why, sizeof k->why, "%s did not answer within %d s (killed)", path,
             DISCOVER_TIMEOUT_MS / 1000);
    return;
  }
  kt__run_describe_status(wstatus, desc, sizeof desc);
  size_t end = h->err_len;
  while (end > 0 && (h->err[end - 1] == '\n' || h->err[end - 1] == '\r' || h->err[end - 1] == ' '))
    end--;
  size_t start = end;
  while (start > 0 && h->err[start - 1] != '\n') start--;
  snprintf(k->why, sizeof k->why, "%s %s%s%.*s", path, desc, end > start ? ": " : "",
           (int)KT_MIN(end - start, 500), h->err + start);
}

/* Ask torch, through `python -c`, which device types it knows and how many
 * devices of each this host has. Returns 0 (k->ok when it answered, else
 * k->why says what failed), or 128+sig when a stop signal interrupted it
 * (message printed). */
static int discover(const char *python, known *k) {
  memset(k, 0, sizeof *k);
  int64_t t0 = kt__now_ms();
  char *path = kt__run_find_program(python);
  if (!path) {
    snprintf(k->why, sizeof k->why, "%s (set PYTHON to the python that has torch)",
             kt_last_error());
    return 0;
  }
  helper_out *h = calloc(1, sizeof *h);
  int wstatus = 0, sig = -1;
  bool timed_out = false;
  if (!h) snprintf(k->why, sizeof k->why, "out of memory");
  else sig = run_helper(path, h, &wstatus, &timed_out, k);
  if (sig > 0) {
    char tmp[16];
    kt__run_say(2, "kaitian run: interrupted by %s while asking %s's torch for this host's "
                   "devices", kt__run_signame(sig, tmp, sizeof tmp), path);
  } else if (sig == 0) {
    if (timed_out || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
      helper_failure(h, path, wstatus, timed_out, k);
    else if (h->out_full)
      snprintf(k->why, sizeof k->why, "more output than expected from %s -c <device "
               "discovery>", path);
    else
      k->ok = parse_known(h->out, path, k);
  }
  if (k->ok && kt__run_info_on()) {
    char list[600];
    format_known(k, list, sizeof list);
    kt__run_say(2, "kaitian run: devices: the torch of %s knows %s (asked in %.1f s)", path, list,
                (double)(kt__now_ms() - t0) / 1000.0);
  }
  free(h);
  free(path);
  return sig > 0 ? 128 + sig : 0;
}

static int find_known(const known *k, const char *type) {
  for (int i = 0; i < k->n; i++)
    if (!strcmp(k->name[i], type)) return k->count[i];
  return -1;
}

/* ---- the plan ----------------------------------------------------------------- */

/* An explicit plan: every type switched on, known to torch, with enough
 * devices. Returns -1 when it can run, else the exit status (printed). */
static int check_explicit(const kt_run_devspec *d, const char *python) {
  char label[300], up[KT_RUN_TYPE_LEN], var[KT_RUN_TYPE_LEN + 128];
  spec_label(d, label, sizeof label);
  bool need_torch = false;
  for (int i = 0; i < d->ntypes; i++) {
    bool on;
    int rc = type_switch(d->type[i], &on, var, sizeof var);
    if (rc) return rc;
    upper(d->type[i], up, sizeof up);
    if (!on) {
      kt__run_say(2, "kaitian run: %s needs %s, switched off by %s", label, up, var);
      return 2;
    }
    if (strcmp(d->type[i], "cpu") != 0) need_torch = true;
  }
  if (!need_torch) return -1;
  known k;
  int rc = discover(python, &k);
  if (rc) return rc;
  if (!k.ok) {
    kt__run_say(2, "kaitian run: %s: cannot ask torch which devices this host has: %s", label,
                k.why);
    return 2;
  }
  for (int i = 0; i < d->ntypes; i++) {
    if (!strcmp(d->type[i], "cpu")) continue;
    int have = find_known(&k, d->type[i]);
    upper(d->type[i], up, sizeof up);
    if (have < 0) {
      char list[600];
      format_known(&k, list, sizeof list);
      kt__run_say(2, "kaitian run: %s: unknown device type '%s' (this host's torch knows: %s)",
                  d->source, d->type[i], list);
      return 2;
    }
    if (d->count[i] > have) {
      kt__run_say(2, "kaitian run: %s: this host has %d %s device%s", label, have, up,
                  have == 1 ? "" : "s");
      return 2;
    }
  }
  return -1;
}

/* Every switched-on accelerator torch sees, one rank each in type order,
 * at most left of them, into out; *off: the devices of the types switched
 * off. Returns -1, or the exit status. */
static int auto_accelerators(const known *k, int left, kt_run_devspec *out, int *off) {
  *off = 0;
  for (int i = 0; i < k->n && left > 0; i++) {
    if (k->count[i] <= 0) continue;
    bool on;
    char var[KT_RUN_TYPE_LEN + 128];
    int rc = type_switch(k->name[i], &on, var, sizeof var);
    if (rc) return rc;
    if (!on) {
      *off += k->count[i];
      if (kt__run_info_on())
        kt__run_say(2, "kaitian run: devices: %s (%d device%s) switched off by %s", k->name[i],
                    k->count[i], k->count[i] == 1 ? "" : "s", var);
      continue;
    }
    int take = KT_MIN(k->count[i], left);
    spec_add(out, k->name[i], strlen(k->name[i]), take);
    left -= take;
  }
  return -1;
}

/* -n asks for more ranks than the accelerators of plan acc (all of them):
 * auto puts no CPU rank beside them. Prints the error naming both ways to
 * get CPU ranks; returns its exit status. */
static int too_few_accelerators(int nproc, const kt_run_devspec *acc, int off) {
  char list[KT_RUN_MAX_TYPES * (KT_RUN_TYPE_LEN + 12)];
  size_t len = 0;
  list[0] = '\0';
  for (int i = 0; i < acc->ntypes && len < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s:%d", i ? "," : "", acc->type[i],
                            acc->count[i]);
  kt__run_say(2, "kaitian run: -n %d asks for more ranks than this host's %d accelerator%s%s "
                 "(%s); --devices auto puts no rank on the CPU beside accelerators: give "
                 "--devices auto+cpu to fill up with CPU ranks, or an explicit plan such as "
                 "--devices %s,cpu:%d", nproc, acc->total, acc->total == 1 ? "" : "s",
              off ? " switched on" : "", list, list, nproc - acc->total);
  return 2;
}

/* --devices auto: for a .py program, one rank per switched-on accelerator
 * (at most -n), and -n beyond them is an error: CPU ranks beside
 * accelerators usually make the job slower than the accelerators alone
 * (issue 39), so they are planned only when asked for (auto+cpu: CPU ranks after the accelerators, up to -n). With
 * no accelerator (none switched on, torch not asked or not answering, a
 * program that is not .py) the CPU is the only device: -n CPU ranks
 * (default 1), for auto and auto+cpu alike. */
static int plan_auto(int nproc, bool nproc_given, bool fill_cpu, bool py, const char *python,
                     kt_run_devspec *out) {
  bool cpu_on;
  char cpu_var[KT_RUN_TYPE_LEN + 128];
  int rc = type_switch("cpu", &cpu_on, cpu_var, sizeof cpu_var);
  if (rc) return rc;
  known k;
  memset(&k, 0, sizeof k);
  if (py) {
    if ((rc = discover(python, &k)) != 0) return rc;
    if (!k.ok && kt__run_info_on())
      kt__run_say(2, "kaitian run: devices: cannot ask torch which devices this host has (%s); "
                     "planning CPU ranks", k.why);
  }
  int off;
  if ((rc = auto_accelerators(&k, nproc_given ? nproc : KT_RUN_MAX_NPROC, out, &off)) >= 0)
    return rc;
  int nacc = out->total;
  if (nacc > 0 && !fill_cpu && nproc_given && nproc > nacc)
    return too_few_accelerators(nproc, out, off);
  int ncpu = nproc_given ? nproc - nacc : (nacc > 0 ? 0 : 1);
  if (ncpu > 0 && !cpu_on) {
    if (nacc > 0)
      kt__run_say(2, "kaitian run: -n %d needs %d CPU rank%s besides the %d accelerator "
                     "rank%s, but the CPU is switched off by %s", nproc, ncpu,
                  ncpu == 1 ? "" : "s", nacc, nacc == 1 ? "" : "s", cpu_var);
    else
      kt__run_say(2, "kaitian run: no device left for the ranks: the CPU is switched off by %s "
                     "and %s", cpu_var,
                  !py ? "accelerators are planned only for a .py program or with --devices"
                  : k.ok ? "torch sees no accelerator that is switched on"
                         : "torch could not be asked for accelerators");
    return 2;
  }
  if (ncpu > 0) spec_add(out, "cpu", 3, ncpu);
  return -1;
}

int kt__run_plan_devices(const kt_run_devspec *d, int nproc, bool nproc_given, bool py,
                         const char *python, kt_run_device **plan, int *n) {
  kt_run_devspec resolved;
  memset(&resolved, 0, sizeof resolved);
  const kt_run_devspec *use = d;
  int rc;
  if (d->is_auto) {
    rc = plan_auto(nproc, nproc_given, d->fill_cpu, py, python, &resolved);
    use = &resolved;
  } else {
    rc = check_explicit(d, python);
  }
  if (rc >= 0) return rc;
  kt_run_device *p = calloc((size_t)use->total, sizeof *p);
  if (!p) {
    kt__run_say(2, "kaitian run: out of memory for the device plan of %d ranks", use->total);
    return 1;
  }
  int r = 0;
  for (int i = 0; i < use->ntypes; i++) {
    bool cpu = !strcmp(use->type[i], "cpu");
    for (int j = 0; j < use->count[i]; j++, r++) {
      if (cpu) snprintf(p[r].name, sizeof p[r].name, "cpu");
      else snprintf(p[r].name, sizeof p[r].name, "%s:%d", use->type[i], j);
      p[r].accel = !cpu;
    }
  }
  *plan = p;
  *n = use->total;
  return -1;
}
