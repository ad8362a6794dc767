#include "optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
    case PS_OPT_ADAM:
    case PS_OPT_ADAMW: return 2;
    default: return 0;
    }
}

/* Each kernel is torch.optim's single-tensor step (torch 1.13, foreach=False)
 * operation for operation, so one worker through the servers repeats plain
 * torch bit for bit.  torch's `a.add(b, alpha=x)` is one fused multiply-add
 * on the CPU (fmaf(b, x, a)), `addcmul_(t1, t2, value=x)` is
 * fmaf(x * t1, t2, a), `addcdiv_(t1, t2, value=x)` is a + (x * t1) / t2 and
 * a tensor divided by a number divides (no reciprocal); its Python numbers
 * (1 - beta1, lr / (1 - beta1^t), ...) are doubles rounded to float once.
 * The hyper-parameters reach the servers as float32; those doubles are
 * computed here from the number each float32 was most likely written as:
 * the shortest decimal that rounds to it (ps_opt_decimal: 0.9f -> 0.9, 1e-3f ->
 * 0.001), which is the script's double whenever that has at most 7
 * significant digits (0.9, 0.999, 3e-4, 0.0078125).  So Adam and AdamW with
 * torch's defaults repeat torch's bits; a value with more digits (a
 * scheduler's 0.000904508..., 1 - 2^-10) rounds once more than in torch.
 * -std=c11 gcc contracts nothing else into an fma.
 *
 * PS_OPT_FMA: the kernels are built twice (gcc's target_clones): with the
 * FMA instructions, vectorized, and plain x86-64, where fmaf is libm's (the
 * same results, slower); the loader picks the one the CPU runs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define PS_OPT_FMA __attribute__((target_clones("fma", "default")))
#else
#define PS_OPT_FMA
#endif

/* torch's `grad.add(param, alpha=wd)`, skipped when wd is 0 (as torch does:
 * fmaf(w, 0, g) would not be g for an infinite w) */
#define L2(gi, wi) (wd != 0.0f ? fmaf((wi), wd, (gi)) : (gi))

/* ---- sgd: w.add_(g', alpha=-lr) ---- */

#define SGD_LOOP(WI, WO)                                  \
    for (size_t i = 0; i < n; i++)                        \
        WO[i] = fmaf(L2(g[i], WI[i]), -lr, WI[i]);

PS_OPT_FMA
void ps_opt_sgd(float *restrict w, const float *restrict g, size_t n, float lr, float wd)
{
    SGD_LOOP(w, w)
}

PS_OPT_FMA
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

/* ---- momentum: v.mul_(mu).add_(g'); w.add_(v, alpha=-lr) (torch's first
 * step clones g' into v: 0 * mu + g' is the same number) ---- */

#define MOMENTUM_LOOP(WI, WO)                             \
    for (size_t i = 0; i < n; i++) {                      \
        v[i] = v[i] * mu + L2(g[i], WI[i]);               \
        WO[i] = fmaf(v[i], -lr, WI[i]);                   \
    }

PS_OPT_FMA
void ps_opt_momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    MOMENTUM_LOOP(w, w)
}

PS_OPT_FMA
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

/* ---- nesterov: as momentum, then g'.add(v, alpha=mu) is the step ---- */

#define NESTEROV_LOOP(WI, WO)                             \
    for (size_t i = 0; i < n; i++) {                      \
        float gp = L2(g[i], WI[i]);                       \
        v[i] = v[i] * mu + gp;                            \
        WO[i] = fmaf(fmaf(v[i], mu, gp), -lr, WI[i]);     \
    }

PS_OPT_FMA
void ps_opt_nesterov(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    NESTEROV_LOOP(w, w)
}

PS_OPT_FMA
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

/* ---- adagrad: h.addcmul_(g', g'); w.addcdiv_(g', sqrt(h) + eps, value=-lr);
 * one block of b elements at offset o (gb, hb: g, h + o) ---- */

#define ADAGRAD_BLOCK(WI, WO)                                   \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = L2(gb[i], WI[i]);                            \
        hb[i] = fmaf(gp, gp, hb[i]);                            \
        d[i] = hb[i];                                           \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = L2(gb[i], WI[i]); /* WI is not written */    \
        WO[i] = WI[i] + (-lr * gp) / (d[i] + eps);              \
    }

PS_OPT_FMA
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

PS_OPT_FMA
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

/* ---- adam and adamw: one block, as adagrad's.  adamw first scales the
 * weights by keep = 1 - lr * wd (w.mul_), adam adds wd * w to the gradient;
 * then m.mul_(b1).add_(g', alpha=1 - b1); v.mul_(b2).addcmul_(g', g',
 * value=1 - b2); w.addcdiv_(m, sqrt(v) / sqrt(1 - b2^t) + eps,
 * value=-lr / (1 - b1^t)) ---- */

#define ADAM_BLOCK(WI, WO)                                      \
    for (size_t i = 0; i < b; i++) {                            \
        float wk = WI[i] * keep;                                \
        float gp = L2(gb[i], wk);                               \
        WO[i] = wk;                                             \
        mb[i] = fmaf(gp, c1, mb[i] * b1);                       \
        vb[i] = fmaf(c2 * gp, gp, vb[i] * b2);                  \
        d[i] = vb[i];                                           \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    for (size_t i = 0; i < b; i++)                              \
        WO[i] = WO[i] + (step * mb[i]) / (d[i] / bc2s + eps);

/* The shortest decimal that rounds to f, as a double (see above).  Kernels
 * call it a few times per chunk (a table's row, often): the last values are
 * kept, per thread. */
double ps_opt_decimal(float f)
{
    static _Thread_local struct {
        uint32_t bits;
        int used;
        double d;
    } memo[4];
    static _Thread_local unsigned next;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    for (int k = 0; k < 4; k++)
        if (memo[k].used && memo[k].bits == bits)
            return memo[k].d;
    double d = f;
    char buf[32];
    for (int p = 1; p <= 9 && isfinite(f); p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f) {
            d = strtod(buf, NULL);
            break;
        }
    }
    unsigned k = next++ % 4;
    memo[k].bits = bits;
    memo[k].used = 1;
    memo[k].d = d;
    return d;
}

/* torch's Python numbers: doubles, each rounded to float where a tensor
 * op takes it */
#define ADAM_PROLOGUE                                                         \
    double b1d = ps_opt_decimal(b1), b2d = ps_opt_decimal(b2);                \
    double lrd = ps_opt_decimal(lr);                                          \
    double bc1 = 1.0 - pow(b1d, (double)t);                                   \
    float bc2s = (float)sqrt(1.0 - pow(b2d, (double)t));                      \
    float step = (float)-(lrd / bc1);                                         \
    float c1 = (float)(1.0 - b1d), c2 = (float)(1.0 - b2d);                   \
    float keep = decoupled ? (float)(1.0 - lrd * ps_opt_decimal(wd)) : 1.0f;  \
    if (decoupled)                                                            \
        wd = 0.0f;                                                            \
    float d[BLOCK];

PS_OPT_FMA
static void adam_in(float *restrict w, float *restrict m, float *restrict v,
                    const float *restrict g, size_t n, float lr, float b1, float b2, float eps,
                    float wd, int decoupled, int64_t t)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict mb = m + o, *restrict vb = v + o;
        const float *restrict gb = g + o;
        ADAM_BLOCK(wb, wb)
    }
}

PS_OPT_FMA
static void adam_out(const float *restrict wi, float *restrict wo, float *restrict m,
                     float *restrict v, const float *restrict g, size_t n, float lr, float b1,
                     float b2, float eps, float wd, int decoupled, int64_t t)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        const float *restrict wib = wi + o, *restrict gb = g + o;
        float *restrict wob = wo + o, *restrict mb = m + o, *restrict vb = v + o;
        ADAM_BLOCK(wib, wob)
    }
}

static void adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int decoupled,
                    int64_t t)
{
    if (w_in == w_out)
        adam_in(w_out, m, v, g, n, lr, b1, b2, eps, wd, decoupled, t);
    else
        adam_out(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, decoupled, t);
}

void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, 0, t);
}

void ps_opt_adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_to(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, 0, t);
}

void ps_opt_adamw(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                  size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, 1, t);
}

void ps_opt_adamw_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                     size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_to(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, 1, t);
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
    case PS_OPT_ADAMW:
        ps_opt_adamw_to(w_in, w_out, s0, s1, g, n, c->lr, c->beta1, c->beta2, c->eps,
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
