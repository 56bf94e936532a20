/* info.c - `kaitian info`: version, build, CPU features, transports, host, the
 * Python side (interpreter, torch, the torch_kaitian package and the library it
 * loads) and the KAITIAN_* parameters; --env-markdown writes docs/env.md. */
#include "tool.h"
#include "reduce/reduce.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: kaitian info [--env-markdown]\n"
          "\n"
          "Print the version, the build, the CPU features the reduction kernels use,\n"
          "the transports, this host's name, the Python that `kaitian run` gives .py\n"
          "programs ($PYTHON, else /usr/bin/python3) with its torch, the torch_kaitian\n"
          "package it imports and the libkaitian that package loads, and every\n"
          "KAITIAN_* parameter with its current value (secrets are not shown).\n"
          "\n"
          "  --env-markdown   print the table of every KAITIAN_* variable (name,\n"
          "                   default, description) as Markdown: docs/env.md is this\n"
          "                   output (kaitian info --env-markdown > docs/env.md)\n");
}

/* The default as written in params.def, without the quotes of a string. */
static void plain_default(const char *def, char *out, size_t cap) {
  size_t len = strlen(def);
  if (len >= 2 && def[0] == '"' && def[len - 1] == '"')
    snprintf(out, cap, "%.*s", (int)(len - 2), def + 1);
  else
    snprintf(out, cap, "%s", def);
}

static bool is_secret(const char *name) { return strstr(name, "SECRET") != NULL; }

/* KAITIAN_SECRET_FILE: the file in force, found as src/core/jobenv.c finds it
 * ($KAITIAN_SECRET_FILE, else $HOME/.kaitian/secret), and what is there; its
 * contents are never shown. */
static void print_secret_file(const char *name, const char *value, const char *def) {
  char path[4096];
  bool set = kt__param_set_SECRET_FILE();
  const char *home = getenv("HOME");
  if (set) snprintf(path, sizeof path, "%s", value);
  else if (home && *home) snprintf(path, sizeof path, "%s/.kaitian/secret", home);
  else {
    printf("  %-28s %s (HOME is not set: no key file)\n", name, value);
    return;
  }
  char state[160];
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT && !set)
      snprintf(state, sizeof state, "absent: a job secret derived under srun or mpirun uses the job "
               "id and user id only");
    else
      snprintf(state, sizeof state, "cannot be read: %s%s", strerror(errno),
               set ? " (an error where a job secret is derived)" : "");
  } else if (!S_ISREG(st.st_mode)) {
    snprintf(state, sizeof state, "not a regular file: an error where a job secret is derived");
  } else if (st.st_uid != geteuid() || (st.st_mode & 077)) {
    snprintf(state, sizeof state, "present but %s (mode %03o): chmod 600 it",
             st.st_uid != geteuid() ? "not yours" : "readable by others",
             (unsigned)(st.st_mode & 0777));
  } else {
    snprintf(state, sizeof state, "present, mode %03o (contents not shown)", (unsigned)(st.st_mode & 0777));
  }
  if (set) printf("  %-28s %s: %s   (default: %s)\n", name, path, state, def);
  else printf("  %-28s %s = %s: %s\n", name, value, path, state);
}

static void print_param(const char *name, const char *type, const char *def, const char *value,
                        const char *help, void *arg) {
  (void)type;
  (void)help;
  (void)arg;
  char d[256];
  plain_default(def, d, sizeof d);
  /* BOOL defaults may be spelled true/false in params.def; values print 0/1. */
  bool is_default = strcmp(d, value) == 0 ||
                    (!strcmp(type, "BOOL") && ((!strcmp(d, "true") && !strcmp(value, "1")) ||
                                               (!strcmp(d, "false") && !strcmp(value, "0"))));
  if (!strcmp(name, "KAITIAN_SECRET_FILE"))
    print_secret_file(name, value, d);
  else if (is_secret(name))
    printf("  %-28s %s\n", name, *value ? "(set, not shown)" : "(not set)");
  else if (is_default)
    printf("  %-28s %s\n", name, *value ? value : "\"\"");
  else
    printf("  %-28s %s   (default: %s)\n", name, value, *d ? d : "\"\"");
}

/* ---- the Python side ------------------------------------------------------ */

#define PROBE_TIMEOUT_MS 60000
#define PROBE_OUT_MAX 8192

/* Run as `$PYTHON -c SCRIPT`: one "KEY VALUE..." line per fact, as far as
 * it gets (torch, then torch_kaitian, which loads the library). */
static const char python_probe[] =
    "import os, sys\n"
    "def why(e):\n"
    "    s = ' '.join(str(e).split())\n"
    "    return (type(e).__name__ + (': ' + s if s else ''))[:600]\n"
    "print('version', '%d.%d.%d' % sys.version_info[:3], flush=True)\n"
    "try:\n"
    "    import torch\n"
    "except Exception as e:\n"
    "    print('torch-error', why(e)); sys.exit(0)\n"
    "print('torch', torch.__version__, 'in', os.path.dirname(torch.__file__), flush=True)\n"
    "try:\n"
    "    import torch_kaitian as t\n"
    "except Exception as e:\n"
    "    print('package-error', why(e)); sys.exit(0)\n"
    "print('package', os.path.dirname(t.__file__))\n"
    "print('library', t.library_path, t.core_version)\n";

/* Run the probe under `path`; its stdout and stderr (NUL-terminated) in out.
 * Returns 0 when it exited 0, else -1 with why in `why`. */
static int run_probe(const char *path, char *out, size_t cap, char *why, size_t whycap) {
  int p[2];
  out[0] = '\0';
  if (pipe2(p, O_CLOEXEC) != 0) {
    snprintf(why, whycap, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, whycap, "fork: %s", strerror(errno));
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(p[1], 1);
    dup2(p[1], 2);
    execl(path, path, "-c", python_probe, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  size_t len = 0;
  int64_t deadline = kt__now_ms() + PROBE_TIMEOUT_MS;
  bool timed_out = false;
  for (;;) {
    int64_t left = deadline - kt__now_ms();
    struct pollfd pfd = {.fd = p[0], .events = POLLIN};
    int n = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    char buf[1024];
    ssize_t got = read(p[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    size_t keep = KT_MIN((size_t)got, cap - 1 - len);
    memcpy(out + len, buf, keep);
    len += keep;
  }
  out[len] = '\0';
  close(p[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {}
  if (timed_out) {
    snprintf(why, whycap, "did not answer within %d s (killed)", PROBE_TIMEOUT_MS / 1000);
    return -1;
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return 0;
  char desc[96];
  kt__run_describe_status(wstatus, desc, sizeof desc);
  /* The last line of its output: for Python, the exception. */
  size_t end = len;
  while (end > 0 && (out[end - 1] == '\n' || out[end - 1] == ' ')) end--;
  size_t start = end;
  while (start > 0 && out[start - 1] != '\n') start--;
  snprintf(why, whycap, "%s%s%.*s", desc, end > start ? ": " : "", (int)KT_MIN(end - start, 400),
           out + start);
  return -1;
}

/* The value of the probe's line "KEY VALUE", copied into val; false when absent. */
static bool probe_line(const char *out, const char *key, char *val, size_t cap) {
  size_t klen = strlen(key);
  for (const char *p = out; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    if (len > klen && !strncmp(p, key, klen) && p[klen] == ' ') {
      snprintf(val, cap, "%.*s", (int)(len - klen - 1), p + klen + 1);
      return true;
    }
    if (!nl) break;
    p = nl + 1;
  }
  return false;
}

/* python:, torch:, package: and library: lines. The interpreter is the one
 * `kaitian run` gives .py programs. */
static void print_python(void) {
  const char *env = getenv("PYTHON");
  const char *python = env && *env ? env : "/usr/bin/python3";
  const char *whence = env && *env ? "$PYTHON" : "$PYTHON unset: kaitian run's default";
  char *path = kt__run_find_program(python);
  if (!path) {
    printf("python:      %s (%s): %s\n", python, whence, kt_last_error());
    printf("torch:       not found (set PYTHON to the python that has torch)\n");
    return;
  }
  char *out = malloc(PROBE_OUT_MAX);
  char why[600], v[700];
  if (!out) {
    printf("python:      %s (%s): out of memory\n", path, whence);
    free(path);
    return;
  }
  int rc = run_probe(path, out, PROBE_OUT_MAX, why, sizeof why);
  if (!probe_line(out, "version", v, sizeof v)) {
    printf("python:      %s (%s): did not run: %s\n", path, whence, rc ? why : "no answer");
  } else {
    printf("python:      %s (%s; %s)\n", path, v, whence);
    if (probe_line(out, "torch", v, sizeof v)) printf("torch:       %s\n", v);
    else if (probe_line(out, "torch-error", v, sizeof v))
      printf("torch:       not found: %s (set PYTHON to the python that has torch)\n", v);
    else printf("torch:       %s\n", rc ? why : "no answer");
    if (probe_line(out, "package", v, sizeof v)) {
      printf("package:     torch_kaitian in %s\n", v);
      char lib[700];
      if (probe_line(out, "library", lib, sizeof lib)) {
        char *sp = strrchr(lib, ' ');
        if (sp) *sp++ = '\0';
        if (sp && strcmp(sp, kt_version_string()))
          printf("library:     %s (%s: not this command's %s)\n", lib, sp, kt_version_string());
        else
          printf("library:     %s (%s)\n", lib, sp ? sp : "?");
      }
    } else if (probe_line(out, "package-error", v, sizeof v)) {
      printf("package:     torch_kaitian not importable: %s\n", v);
    } else if (probe_line(out, "torch", v, sizeof v)) {
      printf("package:     %s\n", rc ? why : "no answer");
    }
  }
  free(out);
  free(path);
}

/* One table cell: pipes escaped so they do not split the cell. */
static void md_cell(const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputs("\\|", stdout);
    else if (*s == '\n') fputc(' ', stdout);
    else fputc(*s, stdout);
  }
}

static void md_param(const char *name, const char *type, const char *def, const char *value,
                     const char *help, void *arg) {
  (void)value;
  (void)arg;
  char d[256];
  plain_default(def, d, sizeof d);
  printf("| `%s` | %s | ", name, !strcmp(type, "INT") ? "integer" : !strcmp(type, "BOOL") ? "boolean" : "string");
  if (*d) {
    fputc('`', stdout);
    md_cell(d);
    fputc('`', stdout);
  } else {
    fputs("(empty)", stdout);
  }
  fputs(" | ", stdout);
  md_cell(help);
  fputs(" |\n", stdout);
}

static void env_markdown(void) {
  printf("# KaiTian environment variables\n"
         "\n"
         "Generated by `kaitian info --env-markdown` from `src/core/params.def`; do not edit\n"
         "by hand (a test fails when this file and the table in the code differ).\n"
         "\n"
         "| Variable | Type | Default | Description |\n"
         "| --- | --- | --- | --- |\n");
  kt__param_visit(md_param, NULL);
  printf("\n"
         "## Device switches\n"
         "\n"
         "`kaitian run` also reads two variables for each device type, named after the type\n"
         "and therefore not rows of the table: `KAITIAN_USE_<TYPE>` and `USE_<TYPE>` (`TYPE`\n"
         "upper-cased: `USE_CUDA`, `KAITIAN_USE_XPU`, `KAITIAN_USE_CPU`). `0`, `no`, `false` or\n"
         "`off` switches the type off: `--devices auto` (or `auto+cpu`) plans no rank on it,\n"
         "and an explicit plan that needs it is an error. `1`, `yes`, `true`, `on` or unset\n"
         "leave it on. `KAITIAN_USE_<TYPE>` wins when both are set; any other value is an\n"
         "error. A switch is read only for a type the plan would use. See\n"
         "[launcher.md](launcher.md).\n");
}

int kt_tool_info(int argc, char **argv) {
  bool markdown = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--env-markdown")) {
      markdown = true;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "kaitian info: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (markdown) {
    env_markdown();
    return fflush(stdout) == 0 ? 0 : 1;
  }
  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "(unknown)");
  host[sizeof host - 1] = '\0';
  printf("kaitian %s\n", kt_version_string());
  printf("build:       %s\n", kt_build_info());
  printf("cpu:         %s\n", kt__cpu_features());
  printf("reduce:      %s\n", kt__reduce_impl_name());
  /* What a communicator uses (src/core/comm.c): shared memory among the
   * ranks of one host unless KAITIAN_TRANSPORT=tcp, TCP between hosts. */
  if (strcmp(kt__param_TRANSPORT(), "tcp") == 0)
    printf("transports:  tcp (KAITIAN_TRANSPORT=tcp: also between ranks of one host)\n");
  else
    printf("transports:  shm (ranks of one host), tcp (between hosts)\n");
  printf("hostname:    %s\n", host);
  fflush(stdout); /* before the probe's child exists */
  print_python();
  printf("parameters (docs/env.md):\n");
  kt__param_visit(print_param, NULL);
  return fflush(stdout) == 0 ? 0 : 1;
}
