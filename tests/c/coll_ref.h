/* coll_ref.h - deterministic inputs and independent reference results for
 * coll_test: every rank can compute every other rank's input, and the expected
 * output is computed here without any of the library's code. */
#ifndef KT_COLL_REF_H
#define KT_COLL_REF_H

#include "kaitian.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pseudo-op used for data-movement collectives: inputs are arbitrary bit
 * patterns (0/1 for bool) and outputs are compared byte for byte. */
#define REF_RAW ((kt_op)KT_NUM_OPS)

/* IEEE binary16 and bfloat16 <-> float, round to nearest even, NaN kept. */
uint16_t ref_float_to_half(float f);
float ref_half_to_float(uint16_t h);
uint16_t ref_float_to_bf16(float f);
float ref_bf16_to_float(uint16_t h);

/* Own tables (not the library's): element size, names, validity of an op. */
size_t ref_dtype_size(kt_dtype dt);
const char *ref_dtype_name(kt_dtype dt);
const char *ref_op_name(kt_op op);
bool ref_is_float(kt_dtype dt);
bool ref_op_valid(kt_dtype dt, kt_op op);

/* The number of ranks the inputs are generated for (AVG inputs on integers
 * are scaled so that the sum over all ranks never wraps). Call once. */
void ref_set_nranks(int nranks);

/* Key of one rank's input stream for one test case. */
uint64_t ref_key(uint64_t salt, int rank);
/* Write element idx of the stream `key` for (dt, op) to dst. */
void ref_elem(kt_dtype dt, kt_op op, uint64_t key, size_t idx, void *dst);
/* Fill n elements: buf[i] = element idx0 + i of the stream of (salt, rank). */
void ref_fill(void *buf, size_t n, kt_dtype dt, kt_op op, uint64_t salt, int rank, size_t idx0);

/* What a check prints before each wrong element (rank, collective, dtype, op,
 * count, variant); kept by the caller. */
typedef struct ref_ctx {
  const char *what;
  int max_print; /* remaining wrong elements to print; decremented */
} ref_ctx;

/* Compare got[i] (i < n, printed as recvbuf index out0 + i) with the
 * reduction with op over ranks 0..nranks-1 of element idx0 + i of each rank's
 * stream (salt, rank). Returns the number of wrong elements. */
size_t ref_check_reduce(const void *got, size_t n, kt_dtype dt, kt_op op, uint64_t salt,
                        int nranks, size_t idx0, size_t out0, ref_ctx *ctx);
/* Compare got[i] with element idx0 + i of rank src's stream (salt, src),
 * byte for byte. Returns the number of wrong elements. */
size_t ref_check_copy(const void *got, size_t n, kt_dtype dt, kt_op op, uint64_t salt, int src,
                      size_t idx0, size_t out0, ref_ctx *ctx);

#endif /* KT_COLL_REF_H */
