/* run_proc.c - `kaitian run`: starting ranks, signalling them, and killing
 * and reaping every descendant at the end so that no orphan survives. */
#include "tool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#include <sys/syscall.h>

const char *kt__run_signame(int sig, char *buf, size_t cap) {
  static const struct { int sig; const char *name; } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].sig == sig) return names[i].name;
  snprintf(buf, cap, "SIG%d", sig);
  return buf;
}

int kt__run_describe_status(int wstatus, char *buf, size_t cap) {
  if (WIFEXITED(wstatus)) {
    snprintf(buf, cap, "exited with code %d", WEXITSTATUS(wstatus));
    return WEXITSTATUS(wstatus);
  }
  if (WIFSIGNALED(wstatus)) {
    char tmp[16];
    int sig = WTERMSIG(wstatus);
    snprintf(buf, cap, "was killed by signal %d (%s)%s", sig, kt__run_signame(sig, tmp, sizeof tmp),
             WCOREDUMP(wstatus) ? ", core dumped" : "");
    return 128 + sig;
  }
  snprintf(buf, cap, "ended with wait status 0x%x", (unsigned)wstatus);
  return 1;
}

char *kt__run_find_program(const char *prog) {
  struct stat st;
  if (!prog || !*prog) {
    kt__err(KT_ERR_INVALID_ARGUMENT, "empty program name");
    return NULL;
  }
  if (strchr(prog, '/')) {
    if (stat(prog, &st) != 0) {
      kt__err(KT_ERR_SYSTEM, "cannot execute '%s': %s", prog, strerror(errno));
      return NULL;
    }
    if (S_ISDIR(st.st_mode) || access(prog, X_OK) != 0) {
      kt__err(KT_ERR_SYSTEM, "cannot execute '%s': %s", prog,
              S_ISDIR(st.st_mode) ? "it is a directory" : strerror(errno));
      return NULL;
    }
    return strdup(prog);
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  size_t plen = strlen(prog);
  bool denied = false;
  for (const char *p = path;;) {
    const char *colon = strchr(p, ':');
    size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
    char *cand = malloc(dlen + plen + 3);
    if (!cand) {
      kt__err(KT_ERR_NO_MEMORY, "out of memory looking up '%s' in PATH", prog);
      return NULL;
    }
    /* An empty PATH element means the current directory. */
    if (dlen == 0) snprintf(cand, dlen + plen + 3, "./%s", prog);
    else snprintf(cand, dlen + plen + 3, "%.*s/%s", (int)dlen, p, prog);
    if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
      if (access(cand, X_OK) == 0) return cand;
      denied = true;
    }
    free(cand);
    if (!colon) break;
    p = colon + 1;
  }
  kt__err(KT_ERR_SYSTEM, "cannot execute '%s': %s (PATH=%s)", prog,
          denied ? "found in PATH but not executable" : "command not found in PATH", path);
  return NULL;
}

/* ---- CPU binding ---------------------------------------------------------- */

/* This process's affinity mask, grown until the kernel's mask fits. */
static cpu_set_t *allowed_cpus(size_t *bytes_out, int *max_out) {
  for (int max = 1024; max <= (1 << 22); max *= 2) {
    cpu_set_t *set = CPU_ALLOC((size_t)max);
    if (!set) return NULL;
    size_t bytes = CPU_ALLOC_SIZE((size_t)max);
    if (sched_getaffinity(0, bytes, set) == 0) {
      *bytes_out = bytes;
      *max_out = max;
      return set;
    }
    CPU_FREE(set);
    if (errno != EINVAL) return NULL;
  }
  return NULL;
}

/* A set of the CPUs ids[lo..hi). NULL when out of memory. */
static cpu_set_t *cpu_block(const int *ids, int lo, int hi, int max, size_t bytes) {
  cpu_set_t *set = CPU_ALLOC((size_t)max);
  if (!set) return NULL;
  CPU_ZERO_S(bytes, set);
  for (int j = lo; j < hi; j++) CPU_SET_S((size_t)ids[j], bytes, set);
  return set;
}

/* Bind every rank: accelerator ranks, in rank order, take the first per
 * CPUs each of ids[0..k); CPU ranks split the rest into blocks. */
static bool bind_blocks(kt_run_rank *ranks, int n, const int *ids, int k, int per, int max,
                        size_t bytes) {
  int nacc = 0;
  for (int i = 0; i < n; i++) nacc += ranks[i].accel;
  int next = 0, ncpu = n - nacc, c = 0;
  int base = nacc * per, rest = k - base;
  for (int i = 0; i < n; i++) {
    int lo, hi;
    if (ranks[i].accel) {
      lo = next;
      hi = next + per;
      next = hi;
    } else {
      lo = base + (int)((long)c * rest / ncpu);
      hi = base + (int)((long)(c + 1) * rest / ncpu);
      c++;
    }
    ranks[i].cpus = cpu_block(ids, lo, hi, max, bytes);
    ranks[i].cpus_bytes = bytes;
    if (!ranks[i].cpus) return false;
  }
  return true;
}

int kt__run_plan_cpus(kt_run_rank *ranks, int n, bool bind, int cpus_per_accel) {
  size_t bytes;
  int max;
  cpu_set_t *all = allowed_cpus(&bytes, &max);
  if (!all) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
  }
  int count = CPU_COUNT_S(bytes, all);
  if (count < 1) count = 1;
  long need = 0; /* one CPU per CPU rank, cpus_per_accel per accelerator rank */
  for (int i = 0; i < n; i++) need += ranks[i].accel ? cpus_per_accel : 1;
  if (bind && need <= count) {
    int *ids = malloc((size_t)count * sizeof *ids);
    int k = 0;
    for (int cpu = 0; ids && cpu < max && k < count; cpu++)
      if (CPU_ISSET_S((size_t)cpu, bytes, all)) ids[k++] = cpu;
    if (!ids || k < need || !bind_blocks(ranks, n, ids, k, cpus_per_accel, max, bytes))
      kt__run_free_cpus(ranks, n); /* all or nothing */
    free(ids);
  }
  CPU_FREE(all);
  return count;
}

void kt__run_free_cpus(kt_run_rank *ranks, int n) {
  for (int i = 0; i < n; i++) {
    if (ranks[i].cpus) CPU_FREE(ranks[i].cpus);
    ranks[i].cpus = NULL;
  }
}

void kt__run_format_cpus(const cpu_set_t *set, size_t bytes, char *buf, size_t cap) {
  size_t len = 0;
  int max = (int)(bytes * 8);
  buf[0] = '\0';
  for (int cpu = 0; cpu < max && len < cap; cpu++) {
    if (!CPU_ISSET_S((size_t)cpu, bytes, set)) continue;
    int last = cpu;
    while (last + 1 < max && CPU_ISSET_S((size_t)(last + 1), bytes, set)) last++;
    if (last == cpu) len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? "," : "", cpu);
    else len += (size_t)snprintf(buf + len, cap - len, "%s%d-%d", len ? "," : "", cpu, last);
    cpu = last;
  }
}

/* ---- starting a rank -------------------------------------------------------- */

/* In the child, between fork and execve: async-signal-safe calls only. */
static void child_exec(const kt_run_rank *r, const kt_run_exec *ex, char **envp, int out_w,
                       int err_w, int status_w, pid_t launcher) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  /* The launcher may have died before prctl took effect. */
  if (getppid() != launcher) _exit(127);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL); /* ignored dispositions would survive execve */
  /* Best effort: a subset of the launcher's own CPUs cannot be refused
   * unless a cpuset changed meanwhile; the rank then runs unbound. */
  if (r->cpus) sched_setaffinity(0, r->cpus_bytes, r->cpus);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0 && devnull != 0) {
    dup2(devnull, 0);
    close(devnull);
  }
  if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) {
    int e = errno;
    (void)!write(status_w, &e, sizeof e);
    _exit(127);
  }
  /* Nothing of the launcher (store sockets, other ranks' pipes) leaks into
   * the rank; status_w closes at execve, telling the parent it worked. */
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < 65536; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  execve(ex->path, ex->argv, envp);
  int e = errno;
  (void)!write(status_w, &e, sizeof e);
  _exit(127);
}

kt_result kt__run_spawn(kt_run_rank *r, const kt_run_exec *ex, char **envp, bool prefix) {
  int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, st_p[2] = {-1, -1};
  kt_result res = KT_SUCCESS;
  if (pipe2(out_p, O_CLOEXEC) != 0 || pipe2(err_p, O_CLOEXEC) != 0 ||
      pipe2(st_p, O_CLOEXEC) != 0) {
    res = kt__err(KT_ERR_SYSTEM, "rank %d: cannot create pipes: %s", r->rank, strerror(errno));
    goto fail;
  }
  pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    res = kt__err(KT_ERR_SYSTEM, "rank %d: fork failed: %s", r->rank, strerror(errno));
    goto fail;
  }
  if (pid == 0) child_exec(r, ex, envp, out_p[1], err_p[1], st_p[1], launcher);
  /* Also from the parent, so that the group exists before we ever signal it. */
  setpgid(pid, pid);
  r->pid = pid;
  r->running = true;
  close(out_p[1]);
  close(err_p[1]);
  close(st_p[1]);
  out_p[1] = err_p[1] = st_p[1] = -1;
  fcntl(out_p[0], F_SETFL, O_NONBLOCK);
  fcntl(err_p[0], F_SETFL, O_NONBLOCK);
  kt__run_stream_init(&r->out, out_p[0], 1, r->rank, prefix);
  kt__run_stream_init(&r->err, err_p[0], 2, r->rank, prefix);
  out_p[0] = err_p[0] = -1;

  /* execve closes st_p[1] (success: read gives 0) or the child writes errno. */
  int child_errno = 0;
  ssize_t n;
  KT_SYSCALL_RETRY(n, read(st_p[0], &child_errno, sizeof child_errno));
  close(st_p[0]);
  st_p[0] = -1;
  if (n == (ssize_t)sizeof child_errno) {
    bool same = strcmp(ex->name, ex->path) == 0;
    res = kt__err(KT_ERR_SYSTEM, "cannot execute '%s'%s%s%s for rank %d: %s%s", ex->name,
                  same ? "" : " (", same ? "" : ex->path, same ? "" : ")", r->rank,
                  strerror(child_errno),
                  child_errno == ENOEXEC ? " (not a binary for this machine, or a script "
                                           "without a #! line)" : "");
  }
  return res;

fail:
  for (int i = 0; i < 2; i++) {
    if (out_p[i] >= 0) close(out_p[i]);
    if (err_p[i] >= 0) close(err_p[i]);
    if (st_p[i] >= 0) close(st_p[i]);
  }
  return res;
}

void kt__run_signal_rank(kt_run_rank *r, int sig) {
  if (!r->running || r->pid <= 0) return;
  r->stopped = true;
  if (kill(-r->pid, sig) != 0 && errno == ESRCH) kill(r->pid, sig);
}

/* SIGKILL every process whose parent is us; returns how many. */
static int kill_children(pid_t self) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    char path[64], stat_line[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t len;
    KT_SYSCALL_RETRY(len, read(fd, stat_line, sizeof stat_line - 1));
    close(fd);
    if (len <= 0) continue;
    stat_line[len] = '\0';
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
    char *rp = strrchr(stat_line, ')');
    char state;
    long ppid;
    if (!rp || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid == self && state != 'Z') {
      kill((pid_t)pid, SIGKILL);
      n++;
    }
  }
  closedir(d);
  return n;
}

void kt__run_kill_descendants(void (*on_reap)(pid_t pid, int wstatus, void *arg), void *arg) {
  pid_t self = getpid();
  /* Killing a child makes its own children ours (we are a subreaper) before
   * its exit can be reaped, so each round finds the next generation. */
  for (;;) {
    kill_children(self);
    int st;
    pid_t pid = waitpid(-1, &st, __WALL);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break; /* ECHILD: nothing left */
    }
    if (on_reap) on_reap(pid, st, arg);
  }
}
