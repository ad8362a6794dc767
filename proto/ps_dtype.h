/* Element types of payloads on the wire (docs/PROTOCOL.md, header field `d`)
 * and the conversions between them and float32.
 *
 * Weights and gradients are float32 everywhere but on the wire: with a
 * narrower wire type (`--wire-dtype bf16|f16`) a worker converts each
 * gradient it pushes, a server converts it back before applying it to its
 * float32 master weights, and pulled weights go the other way.
 *
 * float32 -> bfloat16 / float16 rounds to nearest, ties to even (IEEE 754's
 * default), as a scalar reference (tests/test_dtype.c) does:
 *   - a NaN stays a NaN of the same sign, made quiet, with the top bits of
 *     its payload that fit;
 *   - +-Inf stay +-Inf; a finite value too large for the type becomes +-Inf
 *     (f16: |x| >= 65520, the first value that rounds past 65504);
 *   - f16 subnormals are produced (|x| < 2^-14, in steps of 2^-24, the
 *     smallest rounding to 0 only below 2^-25) and read back exactly; bf16
 *     has float32's exponent range, so float32 subnormals keep their top 7
 *     fraction bits, rounded.
 * bfloat16 / float16 -> float32 is exact (every value is a float32).
 *
 * The array loops are plain integer arithmetic with selects and no calls,
 * written so that gcc vectorises them at -O3 (SSE2 in the default x86-64
 * build: 4 elements a step; the server and libps convert a 4 MiB chunk in
 * well under a millisecond).  No state, no threads. */
#ifndef PS_DTYPE_H
#define PS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

/* Bytes per element of dtype (enum ps_dtype), 0 if unknown. */
size_t ps_dtype_size(uint32_t dtype);

/* "f32", "bf16", "f16"; "?" for anything else. */
const char *ps_dtype_name(uint32_t dtype);

/* Parse a --wire-dtype value: f32 (or float32), bf16 (bfloat16), f16
 * (float16, fp16).  0, or PS_EINVAL for anything else. */
int ps_dtype_parse(const char *s, uint32_t *dtype);

/* dst (n elements of dtype) = src rounded to nearest even.  f32: a copy.
 * dst and src must not overlap.  Unknown dtype: nothing is written.
 * Returns 1 when a value of dst is not finite (a NaN or Inf of src, or a
 * value too large for bf16 / f16, which became Inf: ps_dtype_nonfinite
 * says which), else 0; f32 copies are not looked at (0). */
int ps_dtype_from_f32(uint32_t dtype, void *dst, const float *src, size_t n);

/* dst = src (n elements of dtype), exactly.  f32: a copy.  No overlap. */
void ps_dtype_to_f32(uint32_t dtype, float *dst, const void *src, size_t n);

/* How many of src[0..n) are not finite once in dtype: NaN and +-Inf, and
 * for bf16 / f16 the finite values too large for it, which the conversion
 * turns into +-Inf (f16: |x| >= 65520; bf16: |x| >= 0x1.fffp127).  *first
 * (may be NULL) gets the index of the first of them (n when none).  One
 * compare per element on the magnitude's bits: vectorised like the
 * conversions, a fraction of their time. */
size_t ps_dtype_nonfinite(uint32_t dtype, const float *src, size_t n, size_t *first);

/* dst = src (n float32, no overlap) and ps_dtype_nonfinite(PS_DTYPE_F32,
 * dst, n, first) in one pass over src: what a copy that is checked costs
 * when src is read once (a server copying a gradient out of a worker's
 * shared memory, where the worker could change it between two passes).
 * The count is of the copy's values. */
size_t ps_dtype_copy_nonfinite(float *dst, const float *src, size_t n, size_t *first);

/* One element each way (what the loops above do per element). */
uint16_t ps_f32_to_bf16(float x);
float ps_bf16_to_f32(uint16_t h);
uint16_t ps_f32_to_f16(float x);
float ps_f16_to_f32(uint16_t h);

#endif
