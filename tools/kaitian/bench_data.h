/* bench_data.h - input values and closed-form expectations for `kaitian bench -c`. */
#ifndef KT_BENCH_DATA_H
#define KT_BENCH_DATA_H

#include "common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pseudo-op of the collectives that only move data (broadcast, allgather, ...). */
#define KT_BENCH_MOVE (-1)

/* How the inputs of one checked iteration are made. Element j of rank r's
 * input is a pure function of (dtype, op, nranks, seed, r, j), chosen so that
 * the reduction over all ranks is exact in the dtype whatever order the
 * library combines the ranks in (see bench_data.c for the value ranges). */
typedef struct kt_bench_gen {
  kt_dtype dtype;
  int op; /* a kt_op, or KT_BENCH_MOVE */
  int nranks;
  uint64_t seed;
} kt_bench_gen;

/* One element's value: integers and bool in i (already wrapped to the dtype's
 * width), floating types in f (already rounded to the dtype). */
typedef struct kt_bench_value {
  int64_t i;
  double f;
} kt_bench_value;

KT_INTERNAL bool kt__bench_is_float(kt_dtype dtype);
/* Bytes per element (the checker's own table), 0 for an unknown dtype. */
KT_INTERNAL size_t kt__bench_size(kt_dtype dtype);
/* Short names used on the command line and in the tables ("float32"). */
KT_INTERNAL const char *kt__bench_dtype_name(kt_dtype dtype);
KT_INTERNAL const char *kt__bench_op_name(int op); /* "none" for KT_BENCH_MOVE */

/* Element j of rank's input. */
KT_INTERNAL kt_bench_value kt__bench_input(const kt_bench_gen *g, int rank, size_t j);
/* The reduction over every rank of element j of their inputs (g->op must be a
 * reduction). */
KT_INTERNAL kt_bench_value kt__bench_reduced(const kt_bench_gen *g, size_t j);

/* Write inputs j = first .. first+n-1 of rank into buf[0..n-1]. */
KT_INTERNAL void kt__bench_fill(const kt_bench_gen *g, int rank, void *buf, size_t first, size_t n);
/* Fill nbytes with a pattern no correct result is likely to equal, so that
 * an output the library never wrote is caught. */
KT_INTERNAL void kt__bench_poison(void *buf, size_t nbytes);
/* Read element idx of buf. */
KT_INTERNAL kt_bench_value kt__bench_read(kt_dtype dtype, const void *buf, size_t idx);
/* True when got is an acceptable result for expected (exact, except AVG on
 * floating types, which allows the rounding of a division). */
KT_INTERNAL bool kt__bench_equal(const kt_bench_gen *g, kt_bench_value expected,
                                 kt_bench_value got);
/* Change element idx of buf so that it no longer holds a correct value (the
 * --inject-error self-test). */
KT_INTERNAL void kt__bench_corrupt(kt_dtype dtype, void *buf, size_t idx);
/* Print a value as the dtype reads ("3", "-0.5", "true"). */
KT_INTERNAL void kt__bench_format(kt_dtype dtype, kt_bench_value v, char *out, size_t cap);

/* IEEE binary16 and bfloat16 conversions, round to nearest even (the
 * checker's own, independent of the library's kernels). */
KT_INTERNAL float kt__bench_half_to_float(uint16_t h);
KT_INTERNAL uint16_t kt__bench_float_to_half(float f);
KT_INTERNAL float kt__bench_bf16_to_float(uint16_t h);
KT_INTERNAL uint16_t kt__bench_float_to_bf16(float f);

#endif /* KT_BENCH_DATA_H */
