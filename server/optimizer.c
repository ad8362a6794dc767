#include "optimizer.h"

#include <float.h>
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

/* ---- the results checked ----
 * Each kernel computes a value's new weight and state in registers and
 * stores them only when they are all finite (|x| <= FLT_MAX, false for NaN)
 * or the check is off (`off`); else the old ones stay, and the value is
 * counted.  A compare and a select per value, in the same pass, no branch:
 * the loops still vectorize (the old values are read into locals first:
 * `a[i] = ok ? x : a[i]` is a conditional store to gcc, which it does not
 * vectorize).  A finite result is stored exactly as before. */
#define FIN(x) (fabsf(x) <= FLT_MAX)

/* The weight pointers of a block at o (see above: one restrict pointer in
 * place, two out of place) */
#define IN_PLACE float *restrict wb = w + o;
#define OUT_OF_PLACE const float *restrict wib = wi + o; float *restrict wob = wo + o;

/* ---- sgd: with the check, each block's new weights are computed and
 * their finiteness ORed first (the block is in the cache for the loop that
 * stores them), as momentum's below ---- */

#define SGD_BLOCKS(DECL, WI, WO)                                    \
    uint32_t kept = 0;                                              \
    for (size_t o = 0; o < n; o += BLOCK) {                         \
        size_t b = n - o < BLOCK ? n - o : BLOCK;                   \
        const float *restrict gb = g + o;                           \
        DECL                                                        \
        uint32_t bad = 0;                                           \
        if (!off)                                                   \
            for (size_t i = 0; i < b; i++)                          \
                bad |= (uint32_t)!FIN(WI[i] - lr * (gb[i] + wd * WI[i])); \
        if (!bad) {                                                 \
            for (size_t i = 0; i < b; i++)                          \
                WO[i] = WI[i] - lr * (gb[i] + wd * WI[i]);          \
        } else {                                                    \
            for (size_t i = 0; i < b; i++) {                        \
                float ow = WI[i];                                   \
                float nw = ow - lr * (gb[i] + wd * ow);             \
                int ok = FIN(nw);                                   \
                WO[i] = ok ? nw : ow;                               \
                kept += (uint32_t)!ok;                              \
            }                                                       \
        }                                                           \
    }                                                               \
    return kept;

static size_t sgd_in(float *restrict w, const float *restrict g, size_t n, float lr, float wd,
                     int off)
{
    SGD_BLOCKS(IN_PLACE, wb, wb)
}

static size_t sgd_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                      size_t n, float lr, float wd, int off)
{
    SGD_BLOCKS(OUT_OF_PLACE, wib, wob)
}

void ps_opt_sgd(float *restrict w, const float *restrict g, size_t n, float lr, float wd)
{
    sgd_in(w, g, n, lr, wd, 1);
}

size_t ps_opt_sgd_checked(float *w, const float *g, size_t n, float lr, float wd, int guard)
{
    return sgd_in(w, g, n, lr, wd, !guard);
}

void ps_opt_sgd_to(const float *w_in, float *w_out, const float *g, size_t n, float lr, float wd)
{
    if (w_in == w_out)
        sgd_in(w_out, g, n, lr, wd, 1);
    else
        sgd_out(w_in, w_out, g, n, lr, wd, 1);
}

/* ---- momentum and nesterov: with the check, a pass that computes each
 * value's new velocity and weight and only ORs their finiteness first (in
 * the cache for the pass that stores: blocks of BLOCK), then the plain
 * loop, or the selecting one when the block has a value that is not ---- */

#define MOMENTUM_CHECK(WI, STEP)                        \
    for (size_t i = 0; i < b; i++) {                    \
        float ow = WI[i];                               \
        float gp = gb[i] + wd * ow;                     \
        float nv = mu * vb[i] + gp;                     \
        float nw = ow - lr * (STEP);                    \
        bad |= (uint32_t)!(FIN(nw) & FIN(nv));          \
    }

#define MOMENTUM_LOOP(WI, WO, STEP)                     \
    for (size_t i = 0; i < b; i++) {                    \
        float gp = gb[i] + wd * WI[i];                  \
        vb[i] = mu * vb[i] + gp;                        \
        float nv = vb[i];                               \
        WO[i] = WI[i] - lr * (STEP);                    \
    }

#define MOMENTUM_SELECT(WI, WO, STEP)                   \
    for (size_t i = 0; i < b; i++) {                    \
        float ow = WI[i], ov = vb[i];                   \
        float gp = gb[i] + wd * ow;                     \
        float nv = mu * ov + gp;                        \
        float nw = ow - lr * (STEP);                    \
        int ok = FIN(nw) & FIN(nv);                     \
        vb[i] = ok ? nv : ov;                           \
        WO[i] = ok ? nw : ow;                           \
        kept += (uint32_t)!ok;                          \
    }

/* DECL declares the block's weight pointers WI and WO (IN_PLACE,
 * OUT_OF_PLACE) */
#define MOMENTUM_BLOCKS(DECL, WI, WO, STEP)                                 \
    uint32_t kept = 0;                                                      \
    for (size_t o = 0; o < n; o += BLOCK) {                                 \
        size_t b = n - o < BLOCK ? n - o : BLOCK;                           \
        const float *restrict gb = g + o;                                   \
        float *restrict vb = v + o;                                         \
        DECL                                                                \
        uint32_t bad = 0;                                                   \
        if (!off) {                                                         \
            MOMENTUM_CHECK(WI, STEP)                                        \
        }                                                                   \
        if (!bad) {                                                         \
            MOMENTUM_LOOP(WI, WO, STEP)                                     \
        } else {                                                            \
            MOMENTUM_SELECT(WI, WO, STEP)                                   \
        }                                                                   \
    }                                                                       \
    return kept;

static size_t momentum_in(float *restrict w, float *restrict v, const float *restrict g,
                          size_t n, float lr, float mu, float wd, int off)
{
    MOMENTUM_BLOCKS(IN_PLACE, wb, wb, nv)
}

static size_t momentum_out(const float *restrict wi, float *restrict wo, float *restrict v,
                           const float *restrict g, size_t n, float lr, float mu, float wd,
                           int off)
{
    MOMENTUM_BLOCKS(OUT_OF_PLACE, wib, wob, nv)
}

static size_t nesterov_in(float *restrict w, float *restrict v, const float *restrict g,
                          size_t n, float lr, float mu, float wd, int off)
{
    MOMENTUM_BLOCKS(IN_PLACE, wb, wb, gp + mu * nv)
}

static size_t nesterov_out(const float *restrict wi, float *restrict wo, float *restrict v,
                           const float *restrict g, size_t n, float lr, float mu, float wd,
                           int off)
{
    MOMENTUM_BLOCKS(OUT_OF_PLACE, wib, wob, gp + mu * nv)
}

void ps_opt_momentum(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    momentum_in(w, v, g, n, lr, mu, wd, 1);
}

size_t ps_opt_momentum_checked(float *w, float *v, const float *g, size_t n, float lr, float mu,
                               float wd, int guard)
{
    return momentum_in(w, v, g, n, lr, mu, wd, !guard);
}

void ps_opt_momentum_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd)
{
    if (w_in == w_out)
        momentum_in(w_out, v, g, n, lr, mu, wd, 1);
    else
        momentum_out(w_in, w_out, v, g, n, lr, mu, wd, 1);
}

void ps_opt_nesterov(float *restrict w, float *restrict v, const float *restrict g, size_t n,
                     float lr, float mu, float wd)
{
    nesterov_in(w, v, g, n, lr, mu, wd, 1);
}

size_t ps_opt_nesterov_checked(float *w, float *v, const float *g, size_t n, float lr, float mu,
                               float wd, int guard)
{
    return nesterov_in(w, v, g, n, lr, mu, wd, !guard);
}

void ps_opt_nesterov_to(const float *w_in, float *w_out, float *v, const float *g, size_t n,
                        float lr, float mu, float wd)
{
    if (w_in == w_out)
        nesterov_in(w_out, v, g, n, lr, mu, wd, 1);
    else
        nesterov_out(w_in, w_out, v, g, n, lr, mu, wd, 1);
}

/* ---- adagrad: one block of b elements at offset o (gb, hb: g, h + o).
 * Its step is at most lr in size (|g'| / (sqrt(h + g'^2) + eps) <= 1), and
 * lr <= 1e6 is far below half an ulp of FLT_MAX (2^103): so with a finite
 * weight, the new weight is finite exactly when the new state h + g'^2 is
 * (which is not finite when g' is not).  So the check is on the new state,
 * in the first loop, before anything is stored; the second loop stores
 * (the state's sum computed again there, the same operations) unless the
 * block has a value whose state would not be finite, which then goes
 * through the selecting loop. ---- */

#define ADAGRAD_BLOCK(WI, WO)                                   \
    uint32_t bad = 0;                                           \
    for (size_t i = 0; i < b; i++) {                            \
        float gp = gb[i] + wd * WI[i];                          \
        d[i] = hb[i] + gp * gp;                                 \
        bad |= (uint32_t)!FIN(d[i]);                            \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    if (!bad || off) {                                          \
        for (size_t i = 0; i < b; i++) {                        \
            float gp = gb[i] + wd * WI[i];                      \
            hb[i] = hb[i] + gp * gp;                            \
            WO[i] = WI[i] - lr * gp / (d[i] + eps);             \
        }                                                       \
    } else {                                                    \
        for (size_t i = 0; i < b; i++) {                        \
            float ow = WI[i], oh = hb[i];                       \
            float gp = gb[i] + wd * ow;                         \
            float nh = oh + gp * gp;                            \
            float nw = ow - lr * gp / (d[i] + eps);             \
            int ok = FIN(nw) & FIN(nh);                         \
            hb[i] = ok ? nh : oh;                               \
            WO[i] = ok ? nw : ow;                               \
            kept += (uint32_t)!ok;                              \
        }                                                       \
    }

static size_t adagrad_in(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                         float lr, float eps, float wd, int off)
{
    float d[BLOCK];
    uint32_t kept = 0;
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict hb = h + o;
        const float *restrict gb = g + o;
        ADAGRAD_BLOCK(wb, wb)
    }
    return kept;
}

static size_t adagrad_out(const float *restrict wi, float *restrict wo, float *restrict h,
                          const float *restrict g, size_t n, float lr, float eps, float wd,
                          int off)
{
    float d[BLOCK];
    uint32_t kept = 0;
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        const float *restrict wib = wi + o, *restrict gb = g + o;
        float *restrict wob = wo + o, *restrict hb = h + o;
        ADAGRAD_BLOCK(wib, wob)
    }
    return kept;
}

void ps_opt_adagrad(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                    float lr, float eps, float wd)
{
    adagrad_in(w, h, g, n, lr, eps, wd, 1);
}

size_t ps_opt_adagrad_checked(float *w, float *h, const float *g, size_t n, float lr, float eps,
                              float wd, int guard)
{
    return adagrad_in(w, h, g, n, lr, eps, wd, !guard);
}

void ps_opt_adagrad_to(const float *w_in, float *w_out, float *h, const float *g, size_t n,
                       float lr, float eps, float wd)
{
    if (w_in == w_out)
        adagrad_in(w_out, h, g, n, lr, eps, wd, 1);
    else
        adagrad_out(w_in, w_out, h, g, n, lr, eps, wd, 1);
}

/* ---- adam: one block, as adagrad's.  The first loop computes the new
 * moments (stored by the last loop) and ORs their finiteness; with the
 * check, a second pass does the same for the new weights; then the plain
 * loop stores them (the same operations again), or the selecting one when
 * the block has a value that is not finite ---- */

#define ADAM_NEW                                                \
    float gp = gb[i] + wd * ow;                                 \
    float nm = b1 * mb[i] + c1 * gp;                            \
    float nv = b2 * vb[i] + c2 * (gp * gp);

#define ADAM_BLOCK(WI, WO)                                      \
    uint32_t bad = 0;                                           \
    for (size_t i = 0; i < b; i++) {                            \
        float ow = WI[i];                                       \
        ADAM_NEW                                                \
        d[i] = nv / bc2;                                        \
        bad |= (uint32_t)!(FIN(nm) & FIN(nv));                  \
    }                                                           \
    ps_opt_sqrt_block(d, b);                                    \
    if (!off && !bad)                                           \
        for (size_t i = 0; i < b; i++) {                        \
            float ow = WI[i];                                   \
            ADAM_NEW                                            \
            (void)nv;                                           \
            bad |= (uint32_t)!FIN(ow - lr * (nm / bc1) / (d[i] + eps)); \
        }                                                       \
    if (!bad || off) {                                          \
        for (size_t i = 0; i < b; i++) {                        \
            float ow = WI[i];                                   \
            ADAM_NEW                                            \
            mb[i] = nm;                                         \
            vb[i] = nv;                                         \
            WO[i] = ow - lr * (nm / bc1) / (d[i] + eps);        \
        }                                                       \
    } else {                                                    \
        for (size_t i = 0; i < b; i++) {                        \
            float ow = WI[i], om = mb[i], ov = vb[i];           \
            ADAM_NEW                                            \
            float nw = ow - lr * (nm / bc1) / (d[i] + eps);     \
            int ok = FIN(nw) & FIN(nm) & FIN(nv);               \
            mb[i] = ok ? nm : om;                               \
            vb[i] = ok ? nv : ov;                               \
            WO[i] = ok ? nw : ow;                               \
            kept += (uint32_t)!ok;                              \
        }                                                       \
    }

/* bias corrections once per step, in double, then rounded to float */
#define ADAM_PROLOGUE                                           \
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));      \
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));      \
    float c1 = 1.0f - b1, c2 = 1.0f - b2;                       \
    float d[BLOCK];                                             \
    uint32_t kept = 0;

static size_t adam_in(float *restrict w, float *restrict m, float *restrict v,
                      const float *restrict g, size_t n, float lr, float b1, float b2, float eps,
                      float wd, int64_t t, int off)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict mb = m + o, *restrict vb = v + o;
        const float *restrict gb = g + o;
        ADAM_BLOCK(wb, wb)
    }
    return kept;
}

static size_t adam_out(const float *restrict wi, float *restrict wo, float *restrict m,
                       float *restrict v, const float *restrict g, size_t n, float lr, float b1,
                       float b2, float eps, float wd, int64_t t, int off)
{
    ADAM_PROLOGUE
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        const float *restrict wib = wi + o, *restrict gb = g + o;
        float *restrict wob = wo + o, *restrict mb = m + o, *restrict vb = v + o;
        ADAM_BLOCK(wib, wob)
    }
    return kept;
}

void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, t, 1);
}

size_t ps_opt_adam_checked(float *w, float *m, float *v, const float *g, size_t n, float lr,
                           float b1, float b2, float eps, float wd, int64_t t, int guard)
{
    return adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, t, !guard);
}

void ps_opt_adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    if (w_in == w_out)
        adam_in(w_out, m, v, g, n, lr, b1, b2, eps, wd, t, 1);
    else
        adam_out(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, t, 1);
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
#define NEW_LOOP(WI, WO, NEW)                       \
    for (size_t i = 0; i < n; i++) {                \
        float ow = WI[i];                           \
        float nw = NEW;                             \
        int ok = FIN(nw) | off;                     \
        WO[i] = ok ? nw : ow;                       \
        kept += (uint32_t)!ok;                      \
    }
#define AVG_LOOP(WI, WO) NEW_LOOP(WI, WO, g[i])
#define ADD_LOOP(WI, WO) NEW_LOOP(WI, WO, ow + g[i])

static size_t average_in(float *restrict w, const float *restrict g, size_t n, int off)
{
    uint32_t kept = 0;
    AVG_LOOP(w, w)
    return kept;
}

static size_t average_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                          size_t n, int off)
{
    uint32_t kept = 0;
    AVG_LOOP(wi, wo)
    return kept;
}

static size_t add_in(float *restrict w, const float *restrict g, size_t n, int off)
{
    uint32_t kept = 0;
    ADD_LOOP(w, w)
    return kept;
}

static size_t add_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                      size_t n, int off)
{
    uint32_t kept = 0;
    ADD_LOOP(wi, wo)
    return kept;
}

size_t ps_opt_apply_checked(const ps_opt_config *cfg, const float *w_in, float *w_out,
                            float *s0, float *s1, const float *g, size_t n, int64_t t,
                            int guard)
{
    float lr = ps_opt_lr_at(cfg, t), wd = cfg->weight_decay;
    int off = !guard, in = w_in == w_out;
    switch (cfg->kind) {
    case PS_OPT_SGD:
        return in ? sgd_in(w_out, g, n, lr, wd, off) : sgd_out(w_in, w_out, g, n, lr, wd, off);
    case PS_OPT_MOMENTUM:
        return in ? momentum_in(w_out, s0, g, n, lr, cfg->momentum, wd, off)
                  : momentum_out(w_in, w_out, s0, g, n, lr, cfg->momentum, wd, off);
    case PS_OPT_NESTEROV:
        return in ? nesterov_in(w_out, s0, g, n, lr, cfg->momentum, wd, off)
                  : nesterov_out(w_in, w_out, s0, g, n, lr, cfg->momentum, wd, off);
    case PS_OPT_ADAGRAD:
        return in ? adagrad_in(w_out, s0, g, n, lr, cfg->eps, wd, off)
                  : adagrad_out(w_in, w_out, s0, g, n, lr, cfg->eps, wd, off);
    case PS_OPT_ADAM:
        return in ? adam_in(w_out, s0, s1, g, n, lr, cfg->beta1, cfg->beta2, cfg->eps, wd, t,
                            off)
                  : adam_out(w_in, w_out, s0, s1, g, n, lr, cfg->beta1, cfg->beta2, cfg->eps,
                             wd, t, off);
    case PS_OPT_AVERAGE:
        return in ? average_in(w_out, g, n, off) : average_out(w_in, w_out, g, n, off);
    case PS_OPT_ADD: return in ? add_in(w_out, g, n, off) : add_out(w_in, w_out, g, n, off);
    default: return 0;
    }
}

int ps_opt_apply_to(const ps_opt_config *cfg, const float *w_in, float *w_out, float *s0,
                    float *s1, const float *g, size_t n, int64_t t)
{
    int k = cfg->kind;
    if (!((k >= PS_OPT_SGD && k <= PS_OPT_KIND_MAX) || k == PS_OPT_AVERAGE || k == PS_OPT_ADD))
        return PS_EINVAL;
    ps_opt_apply_checked(cfg, w_in, w_out, s0, s1, g, n, t, 0);
    return 0;
}

int ps_opt_apply(const ps_opt_config *c, float *w, float *s0, float *s1, const float *g, size_t n,
                 int64_t t)
{
    return ps_opt_apply_to(c, w, w, s0, s1, g, n, t);
}
