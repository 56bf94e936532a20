/* fuzz_run.c - libFuzzer harness for `kaitian run`'s option parser
 * (parse_opts in tools/kaitian/run.c, reached by including that file) and
 * the --devices / KAITIAN_DEVICES parser (kt__run_parse_devices in
 * tools/kaitian/run_devices.c). Nothing is started: parse_opts only reads
 * argv (and, with no --nnodes/--node-rank/--master, the cluster manager's
 * variables, which this harness unsets).
 *
 * Input: NUL-separated fields. The first byte picks the target:
 *   even: the fields are kaitian run's arguments (after "run"), at most 64;
 *   odd: the first field is a --devices SPEC.
 * Checks besides crashes and sanitizer reports: a rejected command line
 * (status 2) or SPEC says why (a message on stderr, captured here); an
 * accepted one is within the documented bounds (1..4096 ranks per node,
 * node rank below the node count, a master port 1..65534, a program inside
 * argv, a device plan whose counts add up to its total and to -n, auto and
 * auto+cpu accepted only alone). */
#include "../../tools/kaitian/run.c"

#include <sanitizer/common_interface_defs.h>
#include <stdint.h>
#include <sys/mman.h>

#define MAX_ARGS 64

static int capture_fd = -1, saved_err = -1, saved_out = -1;

#define FUZZ_NAME "fuzz_run"
#define FUZZ_OWN_INIT /* below: cluster-manager variables unset, output captured */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  static const char *const unset[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID",
                                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                                      "PMIX_NAMESPACE", "KAITIAN_DEVICES", "KAITIAN_JOB_SECRET"};
  for (size_t i = 0; i < sizeof unset / sizeof unset[0]; i++) unsetenv(unset[i]);
  setenv("KAITIAN_DEBUG", "NONE", 1);
  kt__log_init();
  /* The parsers print their messages on fd 2 (and --help on stdout): each
   * input's go to a memory file, read back to check that a rejection says
   * why. Sanitizer reports keep a copy of the real stderr. */
  capture_fd = memfd_create("fuzz_run", MFD_CLOEXEC);
  saved_err = dup(2);
  saved_out = dup(1);
  if (capture_fd < 0 || saved_err < 0 || saved_out < 0) abort();
  __sanitizer_set_report_fd((void *)(intptr_t)saved_err);
  return 0;
}

static void capture_begin(void) {
  ftruncate(capture_fd, 0);
  lseek(capture_fd, 0, SEEK_SET);
  dup2(capture_fd, 2);
  dup2(capture_fd, 1);
}

/* Bytes the parser printed. */
static off_t capture_end(void) {
  fflush(stdout);
  fflush(stderr);
  dup2(saved_err, 2);
  dup2(saved_out, 1);
  return lseek(capture_fd, 0, SEEK_CUR);
}

static void check_devspec(const kt_run_devspec *d) {
  check(!d->fill_cpu || d->is_auto, "auto+cpu is a kind of auto");
  if (d->is_auto) {
    check(!strcmp(d->text, d->fill_cpu ? "auto+cpu" : "auto"), "auto and auto+cpu stand alone");
    return;
  }
  check(d->ntypes >= 1 && d->ntypes <= KT_RUN_MAX_TYPES, "1..16 device types");
  int sum = 0;
  for (int i = 0; i < d->ntypes; i++) {
    check(memchr(d->type[i], 0, KT_RUN_TYPE_LEN) != NULL && d->type[i][0], "a type name within its buffer");
    check(d->count[i] >= 1, "a count of at least one rank");
    for (int j = 0; j < i; j++) check(strcmp(d->type[i], d->type[j]) != 0, "each type once");
    sum += d->count[i];
  }
  check(sum == d->total && d->total <= KT_RUN_MAX_NPROC, "the counts add up to the total, at most 4096");
}

static void options(char **argv, int argc) {
  run_opts o;
  memset(&o, 0, sizeof o);
  capture_begin();
  int rc = parse_opts(argc, argv, &o);
  off_t said = capture_end();
  check(rc == -1 || rc == 0 || rc == 2, "status: go on, 0 (help) or 2 (usage error)");
  check(rc == -1 || said > 0, "a rejection or --help prints something");
  if (rc != -1) return;
  check(o.nproc >= 1 && o.nproc <= MAX_NPROC, "ranks per node in 1..4096");
  check(o.nnodes >= 1 && o.nnodes <= 65536 && o.node_rank >= 0 && o.node_rank < o.nnodes,
        "node rank below the node count");
  check(o.prog >= argv + 1 && o.prog < argv + argc && *o.prog != NULL, "the program is one of the arguments");
  check(o.grace_ms >= 0 && o.grace_ms <= 86400000, "grace in 0..86400 s");
  check(o.cpus_per_accel >= 1 && o.cpus_per_accel <= 65536, "CPUs per accelerator in 1..65536");
  if (o.master) {
    check(memchr(o.master_host, 0, sizeof o.master_host) != NULL, "master host within its buffer");
    check(o.master_port >= 1 && o.master_port <= 65534, "master port in 1..65534");
  }
  check(o.nnodes == 1 || o.master, "several nodes have a master");
  check_devspec(&o.devspec);
  if (!o.devspec.is_auto && o.nproc_given) check(o.nproc == o.devspec.total, "-n agrees with --devices");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  char *buf = malloc(size + 1); /* the fields, each NUL-terminated */
  if (!buf) return 0;
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  if (data[0] & 1) {
    kt_run_devspec d;
    capture_begin();
    bool ok = kt__run_parse_devices(buf, "--devices", &d);
    off_t said = capture_end();
    check(ok || said > 0, "a rejected SPEC says why");
    if (ok) check_devspec(&d);
    free(buf);
    return 0;
  }
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = "run";
  for (char *p = buf; p < buf + size - 1 && argc <= MAX_ARGS; p += strlen(p) + 1) argv[argc++] = p;
  argv[argc] = NULL;
  options(argv, argc);
  free(buf);
  return 0;
}
