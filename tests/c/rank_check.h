/* rank_check.h - CHECK for test programs run under `kaitian run`: on a false
 * condition print the rank (a variable `rank` in scope), the place, the
 * message and the library's last error, and exit 1. */
#ifndef KT_TEST_RANK_CHECK_H
#define KT_TEST_RANK_CHECK_H

#include "kaitian.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, " (%s)\n", kt_last_error());                        \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

#endif /* KT_TEST_RANK_CHECK_H */
