/* proto/ps_dtype: the wire types' conversions against a scalar reference
 * written from the definition (round the exact value to the nearest
 * representable one, ties to the even one, in double arithmetic where every
 * step is exact), on every bfloat16 and float16 bit pattern, on a sweep of
 * float32 bit patterns, and on the cases that go wrong first: NaN (quiet,
 * sign kept, never Inf), +-Inf, overflow to Inf, subnormals both ways, and
 * exact ties. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "ps_dtype.h"
#include "ps_test.h"

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float ffrom(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* A binary format with `m` fraction bits and `e` exponent bits. */
typedef struct fmt {
    int m, e;
    const char *name;
} fmt;
static const fmt BF16 = {7, 8, "bf16"}, F16 = {10, 5, "f16"};

/* The reference: x (not NaN) rounded to the format, ties to even. */
static uint16_t ref_narrow(fmt f, float x)
{
    int bias = (1 << (f.e - 1)) - 1, emin = 1 - bias, emax = bias;
    uint16_t sign = (uint16_t)((fbits(x) >> 31) << 15);
    uint16_t inf = (uint16_t)(((1u << f.e) - 1) << f.m);
    if (isinf(x))
        return sign | inf;
    double a = fabs((double)x);
    if (a == 0)
        return sign;
    int E;
    frexp(a, &E);
    E -= 1; /* a in [2^E, 2^(E+1)) */
    if (E < emin)
        E = emin; /* the subnormal range has the smallest normal's spacing */
    double q = a / ldexp(1.0, E - f.m); /* exact: a power of two */
    double r = nearbyint(q);            /* the default mode: to nearest, ties to even */
    if (r >= ldexp(1.0, f.m + 1)) {     /* rounded up into the next binade */
        r /= 2;
        E++;
    }
    if (E > emax)
        return sign | inf;
    if (r < ldexp(1.0, f.m)) /* subnormal (E == emin) */
        return sign | (uint16_t)r;
    return sign | (uint16_t)((unsigned)(E + bias) << f.m) | (uint16_t)(r - ldexp(1.0, f.m));
}

/* The reference decode: the exact value of a (non-NaN) pattern. */
static double ref_value(fmt f, uint16_t h)
{
    int bias = (1 << (f.e - 1)) - 1;
    unsigned field = (h >> f.m) & ((1u << f.e) - 1), frac = h & ((1u << f.m) - 1);
    double s = (h >> 15) ? -1.0 : 1.0;
    if (field == (1u << f.e) - 1)
        return s * INFINITY;
    if (field == 0)
        return s * ldexp((double)frac, 1 - bias - f.m);
    return s * ldexp((double)(frac | (1u << f.m)), (int)field - bias - f.m);
}

static int is_nan_pattern(fmt f, uint16_t h)
{
    unsigned field = (h >> f.m) & ((1u << f.e) - 1), frac = h & ((1u << f.m) - 1);
    return field == (1u << f.e) - 1 && frac != 0;
}

static uint16_t to_narrow(fmt f, float x)
{
    return f.m == 7 ? ps_f32_to_bf16(x) : ps_f32_to_f16(x);
}

static float from_narrow(fmt f, uint16_t h)
{
    return f.m == 7 ? ps_bf16_to_f32(h) : ps_f16_to_f32(h);
}

/* Every narrow pattern: the decode is its exact value, and it converts back
 * to itself; a NaN stays a NaN of the same sign (quiet after the round trip). */
static void every_pattern(fmt f)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float x = from_narrow(f, (uint16_t)h);
        uint16_t back = to_narrow(f, x);
        if (is_nan_pattern(f, (uint16_t)h)) {
            uint16_t quiet = (uint16_t)(1u << (f.m - 1));
            CHECK_MSG(isnan(x) && (fbits(x) >> 31) == (h >> 15),
                      "%s NaN %04x decoded to %08x", f.name, h, fbits(x));
            CHECK_MSG(is_nan_pattern(f, back) && (back & 0x8000) == (h & 0x8000) &&
                          (back | quiet) == (h | quiet) && (back & quiet),
                      "%s NaN %04x came back as %04x", f.name, h, back);
            continue;
        }
        double v = ref_value(f, (uint16_t)h);
        CHECK_MSG((double)x == v && !!signbit(x) == !!(h >> 15),
                  "%s %04x decoded to %.9g, the value is %.9g", f.name, h, (double)x, v);
        CHECK_MSG(back == h, "%s %04x -> %.9g -> %04x", f.name, h, (double)x, back);
    }
}

PS_TEST(every_bf16_pattern_decodes_exactly_and_round_trips)
{
    every_pattern(BF16);
}

PS_TEST(every_f16_pattern_decodes_exactly_and_round_trips)
{
    every_pattern(F16);
}

/* float32 -> narrow over a sweep of every 251st float32 pattern (all signs,
 * exponents and fractions, subnormals included) plus every pattern within
 * +-3 of a rounding tie of the narrow format near 1, 2^-14 and 65504. */
static void sweep(fmt f)
{
    uint64_t checked = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        float x = ffrom((uint32_t)u);
        if (isnan(x))
            continue;
        uint16_t got = to_narrow(f, x), want = ref_narrow(f, x);
        CHECK_MSG(got == want, "%s(%08x = %.9g) = %04x, reference %04x", f.name, (uint32_t)u,
                  (double)x, got, want);
        checked++;
    }
    int drop = 23 - f.m;
    float anchors[] = {1.0f, 1.0f / 16384, 65504.0f, 3.0e-5f, 1e-38f, 1e30f};
    for (size_t k = 0; k < sizeof anchors / sizeof anchors[0]; k++)
        for (uint32_t step = 0; step < 64; step++) {
            uint32_t base = (fbits(anchors[k]) & ~((1u << drop) - 1)) + (step << drop);
            for (int d = -3; d <= 3; d++) {
                uint32_t u = base + (1u << (drop - 1)) + (uint32_t)d;
                for (int s = 0; s < 2; s++, u ^= 0x80000000u) {
                    float x = ffrom(u);
                    CHECK_MSG(to_narrow(f, x) == ref_narrow(f, x),
                              "%s(%08x) = %04x, reference %04x", f.name, u, to_narrow(f, x),
                              ref_narrow(f, x));
                }
            }
        }
    printf("# %s: %llu float32 patterns of the sweep agree with the reference\n", f.name,
           (unsigned long long)checked);
}

PS_TEST(f32_to_bf16_matches_the_reference)
{
    sweep(BF16);
}

PS_TEST(f32_to_f16_matches_the_reference)
{
    sweep(F16);
}

PS_TEST(nan_stays_a_quiet_nan_with_its_sign_and_inf_stays_inf)
{
    uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu,
                       0x7fffffffu, 0x7f812345u, 0xffa00000u};
    for (size_t k = 0; k < sizeof nans / sizeof nans[0]; k++) {
        float x = ffrom(nans[k]);
        uint16_t b = ps_f32_to_bf16(x), h = ps_f32_to_f16(x);
        uint16_t sign = (uint16_t)((nans[k] >> 31) << 15);
        /* a signalling NaN whose payload sits in the dropped bits must not
         * become Inf */
        CHECK_MSG(is_nan_pattern(BF16, b) && (b & 0x40) && (b & 0x8000) == sign,
                  "bf16 of NaN %08x is %04x", nans[k], b);
        CHECK_MSG(is_nan_pattern(F16, h) && (h & 0x200) && (h & 0x8000) == sign,
                  "f16 of NaN %08x is %04x", nans[k], h);
        /* the top payload bits that fit are kept */
        CHECK_EQ_INT(b & 0x3f, (nans[k] >> 16) & 0x3f);
        CHECK_EQ_INT(h & 0x1ff, (nans[k] >> 13) & 0x1ff);
    }
    CHECK_EQ_INT(ps_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(ps_f32_to_bf16(-INFINITY), 0xff80);
    CHECK_EQ_INT(ps_f32_to_f16(INFINITY), 0x7c00);
    CHECK_EQ_INT(ps_f32_to_f16(-INFINITY), 0xfc00);
    CHECK(isinf(ps_f16_to_f32(0x7c00)) && ps_f16_to_f32(0xfc00) < 0);
    CHECK(isinf(ps_bf16_to_f32(0xff80)) && ps_bf16_to_f32(0xff80) < 0);
    CHECK(isnan(ps_f16_to_f32(0x7e00)) && isnan(ps_bf16_to_f32(0xffc1)));
}

PS_TEST(overflow_rounds_to_inf_and_the_largest_finite_values_stay)
{
    CHECK_EQ_INT(ps_f32_to_f16(65504.0f), 0x7bff);       /* the largest f16 */
    CHECK_EQ_INT(ps_f32_to_f16(65519.996f), 0x7bff);     /* below the tie: stays */
    CHECK_EQ_INT(ps_f32_to_f16(65520.0f), 0x7c00);       /* the tie: even is Inf */
    CHECK_EQ_INT(ps_f32_to_f16(-1e6f), 0xfc00);
    CHECK_EQ_INT(ps_f32_to_f16(3.4e38f), 0x7c00);
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x7f7f0000u)), 0x7f7f); /* the largest bf16 */
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x7f7f7fffu)), 0x7f7f);
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x7f7f8000u)), 0x7f80); /* the tie: even is Inf */
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0xff7fffffu)), 0xff80); /* -FLT_MAX */
}

PS_TEST(subnormals_round_to_nearest_even_and_decode_exactly)
{
    /* f16 subnormals: m x 2^-24 */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1, -24)), 0x0001);
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1, -25)), 0x0000);          /* tie 0 | 1: even */
    CHECK_EQ_INT(ps_f32_to_f16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    CHECK_EQ_INT(ps_f32_to_f16(-ldexpf(1, -25)), 0x8000);         /* -0 */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(3, -25)), 0x0002);          /* tie 1 | 2: even */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(5, -25)), 0x0002);          /* tie 2 | 3: even */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1023, -24)), 0x03ff);       /* the largest */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(2047, -25)), 0x0400);       /* tie 1023 | 1024 */
    CHECK_EQ_INT(ps_f32_to_f16(ldexpf(1, -14)), 0x0400);          /* the smallest normal */
    CHECK_EQ_INT(ps_f32_to_f16(ffrom(0x00000001u)), 0x0000);      /* f32 subnormal */
    CHECK(ps_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(ps_f16_to_f32(0x83ff) == -ldexpf(1023, -24));
    /* bf16 has f32's range: f32 subnormals keep their top bits, rounded */
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x00010000u)), 0x0001);
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x00008000u)), 0x0000);     /* tie 0 | 1: even */
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x00018000u)), 0x0002);     /* tie 1 | 2: even */
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x00008001u)), 0x0001);
    CHECK_EQ_INT(ps_f32_to_bf16(ffrom(0x807fffffu)), 0x8080);     /* up into the normals */
    CHECK(ps_bf16_to_f32(0x0001) == ffrom(0x00010000u));
}

PS_TEST(ties_go_to_even)
{
    /* 1 + 2^-8 lies halfway between bf16 1 and 1 + 2^-7 (even: 1) */
    CHECK_EQ_INT(ps_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);
    CHECK_EQ_INT(ps_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82); /* 1|2 -> 2 */
    CHECK_EQ_INT(ps_f32_to_bf16(nextafterf(1.0f + ldexpf(1, -8), 2)), 0x3f81);
    /* f16: 1 + 2^-11 halfway between 1 and 1 + 2^-10 */
    CHECK_EQ_INT(ps_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00);
    CHECK_EQ_INT(ps_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    CHECK_EQ_INT(ps_f32_to_f16(-(1.0f + 3 * ldexpf(1, -11))), 0xbc02);
    CHECK_EQ_INT(ps_f32_to_f16(2049.0f), 0x6800); /* 2048 | 2050: even is 2048 */
    CHECK_EQ_INT(ps_f32_to_f16(2051.0f), 0x6802); /* 2050 | 2052: even is 2052 */
}

/* The vectorised array loops give what the scalar functions give, for every
 * length up to 70 (their tails) and at every misalignment of the 16-bit side. */
PS_TEST(array_loops_match_the_scalar_conversions)
{
    enum { N = 70 };
    float src[N], back[N];
    uint16_t buf[N + 1];
    uint32_t seed = 12345;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t u = seed;
        if (i % 7 == 0)
            u = (u & 0x80000000u) | 0x7f800000u | (u & 0x7fffffu); /* NaN or Inf */
        else if (i % 7 == 1)
            u &= 0x807fffffu; /* subnormal */
        else if (i % 7 == 2)
            u = (u & 0x80ffffffu) | 0x38000000u; /* near 2^-15 */
        src[i] = ffrom(u);
    }
    uint32_t types[] = {PS_DTYPE_BF16, PS_DTYPE_F16, PS_DTYPE_F32};
    for (size_t t = 0; t < 3; t++)
        for (int n = 0; n <= N; n++) {
            uint16_t *dst = buf + (n & 1); /* 2-byte aligned, not 4 */
            if (types[t] == PS_DTYPE_F32) {
                float f[N];
                ps_dtype_from_f32(PS_DTYPE_F32, f, src, (size_t)n);
                ps_dtype_to_f32(PS_DTYPE_F32, back, f, (size_t)n);
                CHECK(memcmp(back, src, (size_t)n * 4) == 0);
                continue;
            }
            ps_dtype_from_f32(types[t], dst, src, (size_t)n);
            ps_dtype_to_f32(types[t], back, dst, (size_t)n);
            for (int i = 0; i < n; i++) {
                fmt f = types[t] == PS_DTYPE_BF16 ? BF16 : F16;
                CHECK_MSG(dst[i] == to_narrow(f, src[i]), "%s loop n=%d [%d]", f.name, n, i);
                CHECK_MSG(fbits(back[i]) == fbits(from_narrow(f, dst[i])), "%s back n=%d [%d]",
                          f.name, n, i);
            }
        }
    CHECK_EQ_INT(ps_dtype_size(PS_DTYPE_BF16), 2);
    CHECK_EQ_INT(ps_dtype_size(PS_DTYPE_F16), 2);
    CHECK_EQ_INT(ps_dtype_size(PS_DTYPE_F32), 4);
    CHECK_EQ_INT(ps_dtype_size(4), 0);
    uint32_t dt = 0;
    CHECK(ps_dtype_parse("bf16", &dt) == 0 && dt == PS_DTYPE_BF16);
    CHECK(ps_dtype_parse("fp16", &dt) == 0 && dt == PS_DTYPE_F16);
    CHECK(ps_dtype_parse("f32", &dt) == 0 && dt == PS_DTYPE_F32);
    CHECK(ps_dtype_parse("f8", &dt) == PS_EINVAL);
    CHECK(!strcmp(ps_dtype_name(PS_DTYPE_BF16), "bf16"));
}

/* A payload frame may start at any address: the narrow buffers need no
 * alignment (UBSan's alignment check fails this if they did). */
PS_TEST(narrow_buffers_at_an_odd_address_convert_the_same)
{
    enum { N = 33 };
    float src[N], back[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)i * 0.37f - 5.0f;
    unsigned char raw[2 * N + 1];
    uint32_t types[] = {PS_DTYPE_BF16, PS_DTYPE_F16};
    for (size_t t = 0; t < 2; t++) {
        fmt f = types[t] == PS_DTYPE_BF16 ? BF16 : F16;
        ps_dtype_from_f32(types[t], raw + 1, src, N);
        ps_dtype_to_f32(types[t], back, raw + 1, N);
        for (int i = 0; i < N; i++) {
            uint16_t v;
            memcpy(&v, raw + 1 + 2 * i, 2);
            CHECK_MSG(v == to_narrow(f, src[i]), "%s [%d]", f.name, i);
            CHECK_MSG(fbits(back[i]) == fbits(from_narrow(f, v)), "%s back [%d]", f.name, i);
        }
    }
}

/* Megabyte arrays, timed: the loops give bitwise what the scalar functions
 * give on every element of a run long enough to time (float32 patterns of
 * every exponent, NaN, Inf and subnormals among them).  The speed is a '#'
 * line for the record, never checked: speed goals are bench/'s, and the
 * machine is shared. */
PS_TEST(megabyte_arrays_convert_both_ways_bitwise_as_the_scalar_functions)
{
    enum { N = 1 << 20 };
    float *src = malloc(N * sizeof *src), *back = malloc(N * sizeof *back);
    uint16_t *mid = malloc(N * sizeof *mid);
    if (!src || !back || !mid) {
        free(src), free(back), free(mid);
        CHECK_MSG(0, "out of memory");
    }
    uint32_t seed = 2024;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        src[i] = ffrom(seed);
    }
    memset(back, 0, N * sizeof *back); /* fault the pages in before timing */
    memset(mid, 0, N * sizeof *mid);
    struct timespec t0, t1;
    const fmt fmts[] = {BF16, F16};
    uint32_t types[] = {PS_DTYPE_BF16, PS_DTYPE_F16};
    long bad = -1;
    int bad_t = 0;
    for (int t = 0; t < 2 && bad < 0; t++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < 8; r++) {
            ps_dtype_from_f32(types[t], mid, src, N);
            ps_dtype_to_f32(types[t], back, mid, N);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("# %s: %.2f G elements/s each way (4 MiB of float32, both directions, 8 times)\n",
               fmts[t].name, 16.0 * N / s / 1e9);
        for (long i = 0; i < N && bad < 0; i++)
            if (mid[i] != to_narrow(fmts[t], src[i]) ||
                fbits(back[i]) != fbits(from_narrow(fmts[t], mid[i]))) {
                bad = i;
                bad_t = t;
            }
    }
    uint32_t in = bad >= 0 ? fbits(src[bad]) : 0;
    unsigned got = bad >= 0 ? mid[bad] : 0, want = bad >= 0 ? to_narrow(fmts[bad_t], src[bad]) : 0;
    free(src);
    free(back);
    free(mid);
    CHECK_MSG(bad < 0, "%s: element %ld (%08x) went to %04x, the scalar function gives %04x "
              "(or its way back differs)", fmts[bad_t].name, bad, in, got, want);
}

/* ps_dtype_nonfinite counts exactly the values that are not finite once
 * converted: every float32 magnitude from 2^15 up (f16's and bf16's tops and
 * Inf and NaN), both signs, checked against what the conversion gives. */
PS_TEST(nonfinite_counts_exactly_what_the_conversion_makes_inf_or_nan)
{
    enum { BATCH = 4096 };
    static float x[BATCH];
    const uint32_t dts[] = {PS_DTYPE_F32, PS_DTYPE_BF16, PS_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        uint32_t dt = dts[d];
        size_t want_total = 0, got_total = 0;
        /* 2^15 .. the largest NaN, in steps that hit every rounding boundary
         * near the limits (step 1 there, coarser elsewhere) */
        for (uint64_t u = 0x47000000u; u <= 0x7fffffffu;) {
            size_t k = 0, want = 0, first_want = BATCH;
            for (; k < BATCH && u <= 0x7fffffffu; k++) {
                uint32_t b = (uint32_t)u | (k & 1 ? 0x80000000u : 0);
                x[k] = ffrom(b);
                float back = dt == PS_DTYPE_F32 ? x[k]
                             : dt == PS_DTYPE_BF16 ? ps_bf16_to_f32(ps_f32_to_bf16(x[k]))
                                                   : ps_f16_to_f32(ps_f32_to_f16(x[k]));
                if (!isfinite(back)) {
                    if (!want)
                        first_want = k;
                    want++;
                }
                int near = (u >= 0x477fe000u && u <= 0x47800100u) ||
                           (u >= 0x7f7f0000u && u <= 0x7f800100u);
                u += near ? 1 : 0x1001;
            }
            size_t first = 0;
            size_t got = ps_dtype_nonfinite(dt, x, k, &first);
            CHECK_MSG(got == want && (want == 0 ? first == k : first == first_want),
                      "%s: %zu of %zu counted (first %zu), the conversion gives %zu (first %zu)",
                      ps_dtype_name(dt), got, k, first, want, first_want);
            want_total += want;
            got_total += got;
        }
        CHECK(want_total > 0 && got_total == want_total);
    }
    /* finite values below the limits are not counted */
    float ok[4] = {65504.0f, -65504.0f, 1e38f, -3.3e38f};
    CHECK_EQ_INT(ps_dtype_nonfinite(PS_DTYPE_F16, ok, 2, NULL), 0);
    CHECK_EQ_INT(ps_dtype_nonfinite(PS_DTYPE_BF16, ok, 4, NULL), 0);
    CHECK_EQ_INT(ps_dtype_nonfinite(PS_DTYPE_F32, ok, 4, NULL), 0);
    float big = 70000.0f;
    CHECK_EQ_INT(ps_dtype_nonfinite(PS_DTYPE_F16, &big, 1, NULL), 1);
    /* and the conversion says whether it made any */
    uint16_t h[4];
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_F16, h, ok, 2), 0);
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_F16, h, ok, 3), 1); /* 1e38 */
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_BF16, h, ok, 4), 0);
    float nan_inf[2] = {NAN, -INFINITY};
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_BF16, h, nan_inf, 1), 1);
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_BF16, h, nan_inf + 1, 1), 1);
    float f[2];
    CHECK_EQ_INT(ps_dtype_from_f32(PS_DTYPE_F32, f, nan_inf, 2), 0); /* a copy, not looked at */
}

/* ps_dtype_copy_nonfinite: the copy is bitwise the source (NaN payloads and
 * signs too), and the count and the first index are ps_dtype_nonfinite's,
 * wherever the bad value sits: the first element, the vector loop's body, its
 * tail, the last element; at every length up to 3 vectors and from an
 * address that is not 32-byte aligned. */
PS_TEST(copy_nonfinite_copies_bitwise_and_counts_as_nonfinite)
{
    enum { N = 67 };
    static float src[N + 1], dst[N + 1];
    const uint32_t odd[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffbfffffu, 0x7f7fffffu,
                            0x80000001u, 0x00000000u};
    for (int off = 0; off < 2; off++)
        for (size_t n = 0; n <= (size_t)(N - off); n++)
            for (size_t at = 0; at <= n; at++) /* at == n: nothing bad */
                for (int v = 0; v < 7; v++) {
                    float *s = src + off;
                    for (size_t i = 0; i < n; i++)
                        s[i] = ffrom(0x3f800000u + (uint32_t)i * 0x1234u);
                    if (at < n)
                        s[at] = ffrom(odd[v]);
                    if (n > 2 && at + 2 < n) /* a second one after it */
                        s[n - 1] = ffrom(0x7f800000u);
                    memset(dst, 0xa5, sizeof dst);
                    size_t f1 = 7, f2 = 9;
                    size_t want = ps_dtype_nonfinite(PS_DTYPE_F32, s, n, &f1);
                    size_t got = ps_dtype_copy_nonfinite(dst, s, n, &f2);
                    CHECK_MSG(got == want && f1 == f2 && !memcmp(dst, s, n * sizeof(float)) &&
                                  fbits(dst[n]) == 0xa5a5a5a5u,
                              "n %zu off %d bad at %zu (%08x): counted %zu first %zu, "
                              "ps_dtype_nonfinite %zu first %zu, or the copy differs",
                              n, off, at, odd[v], got, f2, want, f1);
                    if (got != want || f1 != f2)
                        return;
                }
    /* what it counts: 0x7f7fffff (FLT_MAX) and the rest are finite */
    float two[2] = {ffrom(0x7f7fffffu), NAN};
    size_t first = 0;
    CHECK_EQ_INT(ps_dtype_copy_nonfinite(dst, two, 1, &first), 0);
    CHECK_EQ_INT(first, 1);
    CHECK_EQ_INT(ps_dtype_copy_nonfinite(dst, two, 2, &first), 1);
    CHECK_EQ_INT(first, 1);
}
