/* no_cma.c - run a program where the kernel refuses process_vm_readv, as a
 * seccomp filter or Yama's ptrace_scope does in some deployments: installs a
 * seccomp filter that fails that system call with EPERM, then execs argv[1..].
 * With KT_NO_CMA_RANK=r it does so only when RANK is r (other ranks exec
 * directly), so one rank of a job refuses and the others do not. With
 * KT_NO_CMA_CALL=writev it refuses process_vm_writev instead. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int refuse_cma(long call) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)call, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: no_cma PROGRAM [ARGS...]\n");
    return 2;
  }
  const char *only = getenv("KT_NO_CMA_RANK"), *rank = getenv("RANK"), *which = getenv("KT_NO_CMA_CALL");
  long call = which && strcmp(which, "writev") == 0 ? SYS_process_vm_writev : SYS_process_vm_readv;
  if ((!only || (rank && strcmp(only, rank) == 0)) && refuse_cma(call) != 0) {
    perror("no_cma: seccomp");
    return 2;
  }
  execvp(argv[1], argv + 1);
  perror("no_cma: exec");
  return 127;
}
