/* Payload element types and their conversions (ps_dtype.h).
 *
 * Each conversion is one branch-free function of the element's bits (every
 * case computed, then selected), inlined into a plain loop: gcc vectorises
 * those loops at -O3 (check with EXTRA_CFLAGS=-fopt-info-vec-optimized; the
 * loops of ps_dtype_from_f32 and ps_dtype_to_f32 are reported vectorised).
 * Bits are moved between float and uint32_t with memcpy, which compiles to
 * nothing. */
#include "ps_dtype.h"

#include <string.h>

#include "ps_clones.h"

static inline uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* float32 bits -> bfloat16: keep the top 16 bits, rounding the 16 dropped
 * ones to nearest even (adding 0x7fff, plus 1 when the kept part is odd,
 * carries into the kept part exactly when the dropped part is more than
 * half, or half with an odd kept part; a carry out of the largest finite
 * value gives Inf).  A NaN keeps its sign and top payload bits and is made
 * quiet (bit 6 of the result), so no NaN turns into Inf. */
static inline uint16_t bf16_of(uint32_t u)
{
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* float32 bits -> float16, three cases on the magnitude a:
 *  - a >= 65536 (2^16): Inf, or for a NaN a quiet NaN with the top 10
 *    payload bits (finite values from 65520 up round to Inf in the normal
 *    case below, by the carry);
 *  - 2^-14 <= a < 2^16, a normal float16: rebias the exponent (127 -> 15)
 *    and round the 13 dropped fraction bits to nearest even, as bf16_of;
 *  - a < 2^-14, a subnormal float16 (or 0): adding 0.5f makes the FPU round
 *    a to a multiple of 2^-24 (the ulp of 0.5, and the spacing of float16
 *    subnormals), to nearest even in the default rounding mode; the bits
 *    above 0.5's are then the float16 bits (0x400, the smallest normal,
 *    when it rounds up to 2^-14).
 * The sign is put back last. */
static inline uint16_t f16_of(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t normal = (a - ((127u - 15u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t sub = bits(from_bits(a) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    /* masks, not branches: the loops stay vectorisable */
    uint32_t is_nan = -(uint32_t)(a > 0x7f800000u);
    uint32_t is_big = -(uint32_t)(a >= 0x47800000u);
    uint32_t is_sub = -(uint32_t)(a < 0x38800000u);
    uint32_t big = (nan & is_nan) | (0x7c00u & ~is_nan);
    uint32_t r = (big & is_big) | (sub & is_sub) | (normal & ~(is_big | is_sub));
    return (uint16_t)(r | sign);
}

/* float16 bits -> float32, exactly: normal values rebias the exponent;
 * exponent 31 (Inf, NaN) keeps the fraction (payload and quiet bit); a
 * subnormal or zero f (fraction m) is m x 2^-24, which 0.5 + m x 2^-24 - 0.5
 * computes without rounding. */
static inline float f32_of_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7fffu;
    uint32_t normal = (a << 13) + ((127u - 15u) << 23);
    uint32_t special = (a << 13) | 0x7f800000u;
    uint32_t sub = bits(from_bits(0x3f000000u + a) - 0.5f);
    uint32_t is_special = -(uint32_t)(a >= 0x7c00u);
    uint32_t is_sub = -(uint32_t)(a < 0x400u);
    uint32_t r = (special & is_special) | (sub & is_sub) | (normal & ~(is_special | is_sub));
    return from_bits(r | sign);
}

uint16_t ps_f32_to_bf16(float x) { return bf16_of(bits(x)); }
float ps_bf16_to_f32(uint16_t h) { return from_bits((uint32_t)h << 16); }
uint16_t ps_f32_to_f16(float x) { return f16_of(bits(x)); }
float ps_f16_to_f32(uint16_t h) { return f32_of_f16(h); }

size_t ps_dtype_size(uint32_t dtype)
{
    switch (dtype) {
    case PS_DTYPE_F32: return 4;
    case PS_DTYPE_BF16:
    case PS_DTYPE_F16: return 2;
    default: return 0;
    }
}

const char *ps_dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case PS_DTYPE_F32: return "f32";
    case PS_DTYPE_BF16: return "bf16";
    case PS_DTYPE_F16: return "f16";
    default: return "?";
    }
}

int ps_dtype_parse(const char *s, uint32_t *dtype)
{
    static const struct { const char *name; uint32_t dt; } names[] = {
        {"f32", PS_DTYPE_F32},  {"float32", PS_DTYPE_F32}, {"bf16", PS_DTYPE_BF16},
        {"bfloat16", PS_DTYPE_BF16}, {"f16", PS_DTYPE_F16}, {"float16", PS_DTYPE_F16},
        {"fp16", PS_DTYPE_F16}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *dtype = names[i].dt;
            return 0;
        }
    return PS_EINVAL;
}

/* dst and src of the narrow types need not be 2-byte aligned (a payload
 * frame may start anywhere): their elements move through memcpy, which the
 * compiler turns into plain loads and stores where that is allowed. */
static inline void put16(unsigned char *restrict d, size_t i, uint16_t v)
{
    memcpy(d + 2 * i, &v, 2);
}

static inline uint16_t get16(const unsigned char *restrict s, size_t i)
{
    uint16_t v;
    memcpy(&v, s + 2 * i, 2);
    return v;
}

/* Counts the values of src at or above lim in magnitude (the rare pass, for
 * a gradient that has some). */
static size_t count_from(const float *src, size_t n, uint32_t lim, size_t *first)
{
    size_t bad = 0, at = n;
    for (size_t i = 0; i < n; i++)
        if ((bits(src[i]) & 0x7fffffffu) >= lim) {
            if (!bad)
                at = i;
            bad++;
        }
    if (first)
        *first = at;
    return bad;
}

/* Whether there is any, the pass every gradient takes (twice on the way
 * from a worker to the weights: the worker's comm thread before it sends,
 * the server before it sums): lim - 1 - |x| is negative exactly for those
 * (both are below 2^31), so the sign bit of the or of them all says (a
 * subtract and an or per element, 8 lanes on x86-64-v3). */
PS_CLONES_V3 static uint32_t any_from(const float *restrict src, size_t n, uint32_t lim)
{
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= lim - 1u - (bits(src[i]) & 0x7fffffffu);
    return any >> 31;
}

/* any_from while copying src to dst: each value is read once. */
PS_CLONES_V3 static uint32_t copy_any(float *restrict dst, const float *restrict src, size_t n)
{
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = bits(src[i]);
        memcpy(&dst[i], &u, sizeof u);
        any |= 0x7f800000u - 1u - (u & 0x7fffffffu);
    }
    return any >> 31;
}

size_t ps_dtype_copy_nonfinite(float *dst, const float *src, size_t n, size_t *first)
{
    if (!copy_any(dst, src, n)) {
        if (first)
            *first = n;
        return 0;
    }
    return count_from(dst, n, 0x7f800000u, first);
}

size_t ps_dtype_nonfinite(uint32_t dtype, const float *src, size_t n, size_t *first)
{
    /* the smallest magnitude that is not finite in dtype: Inf's bits for
     * float32; for the narrow types the first value that rounds up to Inf
     * (ties to even: the largest finite value has an odd last bit) */
    uint32_t lim = dtype == PS_DTYPE_F16 ? 0x477ff000u : dtype == PS_DTYPE_BF16 ? 0x7f7f8000u
                                                                                : 0x7f800000u;
    if (!any_from(src, n, lim)) {
        if (first)
            *first = n;
        return 0;
    }
    return count_from(src, n, lim, first);
}

/* Bit 16 of the or of (|h| + 0x10000 - exp_all) over narrow values h is set
 * exactly when one has every exponent bit (Inf or NaN): three integer ops
 * per element inside the conversion loops. */
#define NOT_FINITE16(h, exp_all) (((uint32_t)(h) & 0x7fffu) + (0x10000u - (exp_all)))

int ps_dtype_from_f32(uint32_t dtype, void *dst, const float *restrict src, size_t n)
{
    unsigned char *restrict d = dst;
    uint32_t any = 0;
    switch (dtype) {
    case PS_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case PS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = bf16_of(bits(src[i]));
            any |= NOT_FINITE16(h, 0x7f80u);
            put16(d, i, h);
        }
        break;
    case PS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = f16_of(bits(src[i]));
            any |= NOT_FINITE16(h, 0x7c00u);
            put16(d, i, h);
        }
        break;
    default:
        break;
    }
    return (any >> 16) & 1u;
}

void ps_dtype_to_f32(uint32_t dtype, float *restrict dst, const void *src, size_t n)
{
    const unsigned char *restrict s = src;
    switch (dtype) {
    case PS_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case PS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = from_bits((uint32_t)get16(s, i) << 16);
        break;
    case PS_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f32_of_f16(get16(s, i));
        break;
    default:
        break;
    }
}
