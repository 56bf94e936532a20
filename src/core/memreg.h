/* memreg.h - the process's registered buffers (kt_mem_register and
 * kt_mem_alloc): where a buffer lives in a file its peers can map. */
#ifndef KT_MEMREG_H
#define KT_MEMREG_H

#include "common.h"

/* A byte of a registered buffer, as a peer finds it: file (dev, ino), open in
 * this process as fd, at byte offset off. */
typedef struct kt__membuf {
  int32_t fd;
  uint64_t dev, ino, off;
} kt__membuf;

/* Whether [buf, buf + bytes) lies in one registered buffer whose fd still
 * names its file; if so, where its first byte is (*out). */
KT_INTERNAL bool kt__memreg_find(const void *buf, size_t bytes, kt__membuf *out);

/* Allreduces this process ran single-copy (tests read it). */
extern KT_INTERNAL _Atomic uint64_t kt__memreg_direct_runs;

#endif /* KT_MEMREG_H */
