/* A table row's first values and its place: the formulas of ps_table_row.h. */
#include "ps_table_row.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define GOLDEN 0x9e3779b97f4a7c15ull

/* one SplitMix64 output for state x */
static uint64_t sm(uint64_t x) { return ps_table_mix(x + GOLDEN); }

void ps_table_init_row(uint64_t seed, uint64_t table, uint64_t id, int kind, float scale,
                       uint32_t dim, float *out)
{
    size_t d = dim;
    if (kind != PS_TABLE_INIT_UNIFORM && kind != PS_TABLE_INIT_NORMAL) {
        memset(out, 0, d * sizeof(float));
        return;
    }
    uint64_t k = sm(sm(sm(seed) ^ table) ^ id);
    if (kind == PS_TABLE_INIT_UNIFORM) {
        for (size_t i = 0; i < d; i++) {
            uint64_t r = sm(k + (uint64_t)i * GOLDEN);
            out[i] = scale * ((float)((int64_t)(r >> 40) - 8388608) * 0x1p-23f);
        }
        return;
    }
    double s = scale;
    for (size_t i = 0; i < d; i++) {
        uint64_t r1 = sm(k + (uint64_t)(2 * i) * GOLDEN), r2 = sm(k + (uint64_t)(2 * i + 1) * GOLDEN);
        double u1 = (double)((r1 >> 11) + 1) * 0x1p-53, u2 = (double)(r2 >> 11) * 0x1p-53;
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        out[i] = (float)(s * z);
    }
}

uint64_t ps_table_row_hash(uint64_t table, uint64_t id)
{
    return sm(sm(table ^ 0x7461626c652d726full) ^ id);
}

size_t ps_table_rowwise_adagrad_checked(float *restrict w, float *restrict m,
                                        const float *restrict g, size_t d, float lr, float eps,
                                        float wd, int guard)
{
    /* the mean of the squares, summed in order (FBGEMM's CPU kernel); the
     * sum stays in order: no -ffast-math, so the compiler keeps it */
    float sq = 0.0f;
    if (wd != 0.0f) {
        for (size_t i = 0; i < d; i++) {
            float gi = g[i] + wd * w[i];
            sq += gi * gi;
        }
    } else {
        for (size_t i = 0; i < d; i++)
            sq += g[i] * g[i];
    }
    float sum = *m + sq / (float)d;
    float r = lr / (sqrtf(sum) + eps);
    float c = 1.0f - r * wd;
    if (guard) {
        /* the row and its one state float move together: all of it or,
         * when a new value or the state would not be finite, none of it
         * (a pass of compares without stores, the same arithmetic) */
        int ok = (fabsf(sum) <= FLT_MAX) & (fabsf(r) <= FLT_MAX);
        if (wd != 0.0f) {
            for (size_t i = 0; i < d; i++)
                ok &= fabsf(c * w[i] - g[i] * r) <= FLT_MAX;
        } else {
            for (size_t i = 0; i < d; i++)
                ok &= fabsf(w[i] - g[i] * r) <= FLT_MAX;
        }
        if (!ok)
            return d;
    }
    *m = sum;
    if (wd != 0.0f) {
        for (size_t i = 0; i < d; i++)
            w[i] = c * w[i] - g[i] * r;
    } else {
        for (size_t i = 0; i < d; i++)
            w[i] = w[i] - g[i] * r;
    }
    return 0;
}

void ps_table_rowwise_adagrad(float *restrict w, float *restrict m, const float *restrict g,
                              size_t d, float lr, float eps, float wd)
{
    ps_table_rowwise_adagrad_checked(w, m, g, d, lr, eps, wd, 0);
}

size_t ps_table_row_misplaced(uint64_t table, const uint64_t *ids, size_t n, int server,
                              int nservers, uint32_t part, uint32_t nparts)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h = ps_table_row_hash(table, ids[i]);
        if (ps_table_row_server(h, nservers) != server ||
            ps_table_row_part(h, nservers, nparts) != part)
            return i;
    }
    return n;
}
