/* bench_data.h - input values and closed-form expectations for `kaitian bench -c`. */
#ifndef KT_BENCH_DATA_H
#define KT_BENCH_DATA_H

#include "kaitian.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pseudo-op of the collectives that only move data (broadcast, allgather, ...). */
#define BD_MOVE (-1)

/* How the inputs of one checked iteration are made. Element j of rank r's
 * input is a pure function of (dtype, op, nranks, seed, r, j), chosen so that
 * the reduction over all ranks is exact in the dtype whatever order the
 * library combines the ranks in (see bench_data.c for the value ranges). */
typedef struct bd_gen {
  kt_dtype dtype;
  int op; /* a kt_op, or BD_MOVE */
  int nranks;
  uint64_t seed;
} bd_gen;

/* One element's value: integers and bool in i (already wrapped to the dtype's
 * width), floating types in f (already rounded to the dtype). */
typedef struct bd_value {
  int64_t i;
  double f;
} bd_value;

bool bd_is_float(kt_dtype dtype);
/* Bytes per element (the checker's own table), 0 for an unknown dtype. */
size_t bd_size(kt_dtype dtype);
/* Short names used on the command line and in the tables ("float32"). */
const char *bd_dtype_name(kt_dtype dtype);
const char *bd_op_name(int op); /* "none" for BD_MOVE */

/* Element j of rank's input. */
bd_value bd_input(const bd_gen *g, int rank, size_t j);
/* The reduction over every rank of element j of their inputs (g->op must be a
 * reduction). */
bd_value bd_reduced(const bd_gen *g, size_t j);

/* Write inputs j = first .. first+n-1 of rank into buf[0..n-1]. */
void bd_fill(const bd_gen *g, int rank, void *buf, size_t first, size_t n);
/* Fill nbytes with a pattern no correct result is likely to equal, so that
 * an output the library never wrote is caught. */
void bd_poison(void *buf, size_t nbytes);
/* Read element idx of buf. */
bd_value bd_read(kt_dtype dtype, const void *buf, size_t idx);
/* True when got is an acceptable result for expected (exact, except AVG on
 * floating types, which allows the rounding of a division). */
bool bd_equal(const bd_gen *g, bd_value expected, bd_value got);
/* Change element idx of buf so that it no longer holds a correct value (the
 * --inject-error self-test). */
void bd_corrupt(kt_dtype dtype, void *buf, size_t idx);
/* Print a value as the dtype reads ("3", "-0.5", "true"). */
void bd_format(kt_dtype dtype, bd_value v, char *out, size_t cap);

/* IEEE binary16 and bfloat16 conversions, round to nearest even (the
 * checker's own, independent of the library's kernels). */
float bd_half_to_float(uint16_t h);
uint16_t bd_float_to_half(float f);
float bd_bf16_to_float(uint16_t h);
uint16_t bd_float_to_bf16(float f);

#endif /* KT_BENCH_DATA_H */
