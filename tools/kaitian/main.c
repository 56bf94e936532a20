/* main.c - entry point of the `kaitian` command: dispatches to the run, bench
 * and info subcommands. */
#include "tool.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: kaitian COMMAND [ARGS...]\n"
          "\n"
          "commands:\n"
          "  run     start the ranks of a job (kaitian run -n 4 train.py ...)\n"
          "  bench   time (and check) the collectives; run it under `kaitian run`\n"
          "  info    version, build, CPU features and KAITIAN_* settings\n"
          "\n"
          "  kaitian COMMAND --help   help of one command\n"
          "  kaitian --version        the version\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "run")) return kt_tool_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return kt_tool_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "info")) return kt_tool_info(argc - 1, argv + 1);
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
    printf("kaitian %s\n", kt_version_string());
    return 0;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "kaitian: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
