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

/* In place and out of place: each kernel's loop is written once, as a macro
 * over WI (the weights read) and WO (the weights written), and instantiated
 * twice: in place with WI and WO the same restrict pointer, out of place with
 * two restrict pointers.  One function cannot serve both (two restrict
 * pointers to the same array, one of them written, is undefined behaviour),
 * and a plain pointer pair would make gcc vectorize behind a run-time overlap
 * check that w_in == w_out fails.  Both instances do the same float
 * operations in the same order, so their results are bitwise identical. */

void ps_opt_sqrt_block(float *restrict x, size_t n)
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

/* ---- sgd ---- */

#define SGD_LOOP(WI, WO)                            \
    for (size_t i = 0; i < n; i++)                  \
        WO[i] = WI[i] - lr * (g[i] + wd * WI[i]);

void ps_opt_sgd(float *restrict w, const float *restrict g, size_t n, float lr, float wd)
{
    SGD_LOOP(w, w)
}

static void sgd_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                    size_t n, float lr, float wd)
{
    SGD_LOOP(wi, wo)
}

void ps_opt_sgd_to(const float *w_in, float *w_out, const float *g, size_t n, float lr, float wd)
{
    if (w_in == w_out)
        ps_opt_sgd(w_out, g, n, lr, wd);
    else
        sgd_out(w_in, w_out, g, n, lr, wd);
}

/* ---- momentum ---- */

#define MOMENTUM_LOOP(WI, WO)                       \
    for (size_t i = 0; i < n; i++) {                \
        float gp = g[i] + wd * WI[i];               \
        v[i] = mu * v[i] + gp;                      \
        WO[i] = WI[i] - lr * v[i];                  \
    }

void ps_opt_momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    MOMENTUM_LOOP(w, w)
}

static void momentum_out(const float *restrict wi, float *restrict wo, float *restrict v,
                         const float *restrict g, size_t n, float lr, float mu, float wd)
{
    MOMENTUM_LOOP(wi, wo)
}

void ps_opt_momentum_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd)
{
    if (w_in == w_out)
        ps_opt_momentum(w_out, v, g, n, lr, mu, wd);
    else
        momentum_out(w_in, w_out, v, g, n, lr, mu, wd);
}

/* ---- nesterov ---- */

#define NESTEROV_LOOP(WI, WO)                       \
    for (size_t i = 0; i < n; i++) {                \
        float gp = g[i] + wd * WI[i];               \
        v[i] = mu * v[i] + gp;                      \
        WO[i] = WI[i] - lr * (gp + mu * v[i]);      \
    }

void ps_opt_nesterov(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    NESTEROV_LOOP(w, w)
}

static void nesterov_out(const float *restrict wi, float *restrict wo, float *restrict v,
                         const float *restrict g, size_t n, float lr, float mu, float wd)
{
    NESTEROV_LOOP(wi, wo)
}

void ps_opt_nesterov_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd)
{
    if (w_in == w_out)
        ps_opt_nesterov(w_out, v, g, n, lr, mu, wd);
    else
        nesterov_out(w_in, w_out, v, g, n, lr, mu, wd);
}

/* ---- adagrad: one block of b elements at offset o (gb, hb: g, h + o) ---- */

#define ADAGRAD_BLOCK(WI, WO)                                   \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = gb[i] + wd * WI[i];                          \
        hb[i] = hb[i] + gp * gp;                                \
        d[i] = hb[i];                                           \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = gb[i] + wd * WI[i]; /* WI is not written */  \
        WO[i] = WI[i] - lr * gp / (d[i] + eps);                 \
    }

void ps_opt_adagrad(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                    float lr, float eps, float wd)
{
    float d[BLOCK];
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict hb = h + o;
        const float *restrict gb = g + o;
        ADAGRAD_BLOCK(wb, wb)
    }
}

static void adagrad_out(const float *restrict wi, float *restrict wo, float *restrict h,
                        const float *restrict g, size_t n, float lr, float eps, float wd)
{
    float d[BLOCK];
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        const float *restrict wib = wi + o, *restrict gb = g + o;
        float *restrict wob = wo + o, *restrict hb = h + o;
        ADAGRAD_BLOCK(wib, wob)
    }
}

void ps_opt_adagrad_to(const float *w_in, float *w_out, float *h, const float *g, size_t n,
                       float lr, float eps, float wd)
{
    if (w_in == w_out)
        ps_opt_adagrad(w_out, h, g, n, lr, eps, wd);
    else
        adagrad_out(w_in, w_out, h, g, n, lr, eps, wd);
}

/* ---- adam: one block, as adagrad's ---- */

#define ADAM_BLOCK(WI, WO)                                      \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = gb[i] + wd * WI[i];                          \
        mb[i] = b1 * mb[i] + c1 * gp;                           \
        vb[i] = b2 * vb[i] + c2 * (gp * gp);                    \
        d[i] = vb[i] / bc2;                                     \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    for (size_t i = 0; i < b; i++)                              \
        WO[i] = WI[i] - lr * (mb[i] / bc1) / (d[i] + eps);

/* bias corrections once per step, in double, then rounded to float */
#define ADAM_PROLOGUE                                           \
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));      \
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));      \
    float c1 = 1.0f - b1, c2 = 1.0f - b2;                       \
    float d[BLOCK];

void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict mb = m + o, *restrict vb = v + o;
        const float *restrict gb = g + o;
        ADAM_BLOCK(wb, wb)
    }
}

static void adam_out(const float *restrict wi, float *restrict wo, float *restrict m,
                     float *restrict v, const float *restrict g, size_t n, float lr, float b1,
                     float b2, float eps, float wd, int64_t t)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        const float *restrict wib = wi + o, *restrict gb = g + o;
        float *restrict wob = wo + o, *restrict mb = m + o, *restrict vb = v + o;
        ADAM_BLOCK(wib, wob)
    }
}

void ps_opt_adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    if (w_in == w_out)
        ps_opt_adam(w_out, m, v, g, n, lr, b1, b2, eps, wd, t);
    else
        adam_out(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, t);
}

/* The learning rate of update t (1, 2, ...) under the step decay schedule. */
float ps_opt_lr_at(const ps_opt_config *c, int64_t t)
{
    if (c->lr_decay_every == 0 || c->lr_decay == 1.0f || t < 1)
        return c->lr;
    return (float)((double)c->lr * pow((double)c->lr_decay, (double)((t - 1) / c->lr_decay_every)));
}

/* The worker-side kinds (ps_types.h): the new weights are the push itself
 * (average: the round's mean) or the old ones plus it (add). */
static void average_to(float *restrict w_out, const float *restrict g, size_t n)
{
    memcpy(w_out, g, n * sizeof(float));
}

#define ADD_LOOP(WI, WO)                            \
    for (size_t i = 0; i < n; i++)                  \
        WO[i] = WI[i] + g[i];

static void add_in(float *restrict w, const float *restrict g, size_t n) { ADD_LOOP(w, w) }

static void add_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                    size_t n)
{
    ADD_LOOP(wi, wo)
}

int ps_opt_apply_to(const ps_opt_config *cfg, const float *w_in, float *w_out, float *s0,
                    float *s1, const float *g, size_t n, int64_t t)
{
    ps_opt_config at = *cfg;
    at.lr = ps_opt_lr_at(cfg, t);
    const ps_opt_config *c = &at;
    switch (c->kind) {
    case PS_OPT_SGD: ps_opt_sgd_to(w_in, w_out, g, n, c->lr, c->weight_decay); return 0;
    case PS_OPT_MOMENTUM:
        ps_opt_momentum_to(w_in, w_out, s0, g, n, c->lr, c->momentum, c->weight_decay);
        return 0;
    case PS_OPT_NESTEROV:
        ps_opt_nesterov_to(w_in, w_out, s0, g, n, c->lr, c->momentum, c->weight_decay);
        return 0;
    case PS_OPT_ADAGRAD:
        ps_opt_adagrad_to(w_in, w_out, s0, g, n, c->lr, c->eps, c->weight_decay);
        return 0;
    case PS_OPT_ADAM:
        ps_opt_adam_to(w_in, w_out, s0, s1, g, n, c->lr, c->beta1, c->beta2, c->eps,
                       c->weight_decay, t);
        return 0;
    case PS_OPT_AVERAGE: average_to(w_out, g, n); return 0;
    case PS_OPT_ADD:
        if (w_in == w_out)
            add_in(w_out, g, n);
        else
            add_out(w_in, w_out, g, n);
        return 0;
    default: return PS_EINVAL;
    }
}

int ps_opt_apply(const ps_opt_config *c, float *w, float *s0, float *s1, const float *g, size_t n,
                 int64_t t)
{
    return ps_opt_apply_to(c, w, w, s0, s1, g, n, t);
}
