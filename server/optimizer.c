#include "optimizer.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* Adagrad and adam need sqrt.  With -fmath-errno (the C default, and the
 * optimize attribute cannot turn it off per function) gcc guards every sqrtf
 * with a branch to set errno and refuses to vectorize the loop.  So those two
 * run in blocks: a vectorized loop, a sqrt pass over a small stack buffer
 * (SSE sqrtps where available), a second vectorized loop.  The arithmetic is
 * the same as one fused loop, operation for operation. */
#define BLOCK 256

static void sqrt_block(float *restrict x, size_t n)
{
    size_t i = 0;
#if defined(__SSE__)
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++)
        x[i] = sqrtf(x[i]);
}

int ps_opt_state_arrays(int kind)
{
    switch (kind) {
    case PS_OPT_MOMENTUM:
    case PS_OPT_NESTEROV:
    case PS_OPT_ADAGRAD: return 1;
    case PS_OPT_ADAM: return 2;
    default: return 0;
    }
}

void ps_opt_sgd(float *restrict w, const float *restrict g, size_t n, float lr, float wd)
{
    for (size_t i = 0; i < n; i++)
        w[i] = w[i] - lr * (g[i] + wd * w[i]);
}

void ps_opt_momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    for (size_t i = 0; i < n; i++) {
        float gp = g[i] + wd * w[i];
        v[i] = mu * v[i] + gp;
        w[i] = w[i] - lr * v[i];
    }
}

void ps_opt_nesterov(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    for (size_t i = 0; i < n; i++) {
        float gp = g[i] + wd * w[i];
        v[i] = mu * v[i] + gp;
        w[i] = w[i] - lr * (gp + mu * v[i]);
    }
}

void ps_opt_adagrad(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                    float lr, float eps, float wd)
{
    float d[BLOCK];
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict hb = h + o;
        const float *restrict gb = g + o;
        for (size_t i = 0; i < b; i++) {
            float gp = gb[i] + wd * wb[i];
            hb[i] = hb[i] + gp * gp;
            d[i] = hb[i];
        }
        sqrt_block(d, b);
        for (size_t i = 0; i < b; i++) {
            float gp = gb[i] + wd * wb[i]; /* w is unchanged since the first loop */
            wb[i] = wb[i] - lr * gp / (d[i] + eps);
        }
    }
}

void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    /* bias corrections once per step, in double, then rounded to float */
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    float d[BLOCK];
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict mb = m + o, *restrict vb = v + o;
        const float *restrict gb = g + o;
        for (size_t i = 0; i < b; i++) {
            float gp = gb[i] + wd * wb[i];
            mb[i] = b1 * mb[i] + c1 * gp;
            vb[i] = b2 * vb[i] + c2 * (gp * gp);
            d[i] = vb[i] / bc2;
        }
        sqrt_block(d, b);
        for (size_t i = 0; i < b; i++)
            wb[i] = wb[i] - lr * (mb[i] / bc1) / (d[i] + eps);
    }
}

int ps_opt_apply(const ps_opt_config *c, float *w, float *s0, float *s1, const float *g, size_t n,
                 int64_t t)
{
    switch (c->kind) {
    case PS_OPT_SGD: ps_opt_sgd(w, g, n, c->lr, c->weight_decay); return 0;
    case PS_OPT_MOMENTUM:
        ps_opt_momentum(w, s0, g, n, c->lr, c->momentum, c->weight_decay);
        return 0;
    case PS_OPT_NESTEROV:
        ps_opt_nesterov(w, s0, g, n, c->lr, c->momentum, c->weight_decay);
        return 0;
    case PS_OPT_ADAGRAD: ps_opt_adagrad(w, s0, g, n, c->lr, c->eps, c->weight_decay); return 0;
    case PS_OPT_ADAM:
        ps_opt_adam(w, s0, s1, g, n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, t);
        return 0;
    default: return PS_EINVAL;
    }
}
