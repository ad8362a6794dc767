#include "optimizer.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* The kernels run in blocks of BLOCK values (their results are checked per
 * block, below).  Adagrad and adam need sqrt.  With -fmath-errno (the C
 * default, and the optimize attribute cannot turn it off per function) gcc
 * guards every sqrtf with a branch to set errno and refuses to vectorize the
 * loop.  So theirs have a vectorized loop, a sqrt pass over a small stack
 * buffer (SSE sqrtps where available), a second vectorized loop.  The
 * arithmetic is the same as one fused loop, operation for operation. */
#define BLOCK 256

/* In place and out of place: each kernel's blocks are written once, as a
 * macro over WI (the weights read) and WO (the weights written), instantiated
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
 * PS_OPT_FMA: the kernels are built three times (gcc's target_clones): for
 * x86-64-v3 (AVX2 and FMA: the checks' integer ORs and counts vectorize at
 * the floats' 8 lanes), with the FMA instructions alone (AVX: 4 lanes where a
 * loop has integer operations), and plain x86-64, where fmaf is libm's.  The
 * same results, at different speeds; the loader picks the one the CPU runs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define PS_OPT_FMA __attribute__((target_clones("arch=x86-64-v3", "fma", "default")))
#else
#define PS_OPT_FMA
#endif

/* torch's `grad.add(param, alpha=wd)`, skipped when wd is 0 (as torch does:
 * fmaf(w, 0, g) would not be g for an infinite w) */
#define L2(gi, wi) (wd != 0.0f ? fmaf((wi), wd, (gi)) : (gi))

/* ---- the results checked ----
 * A value whose new weight or state would not be finite keeps its old ones
 * and is counted (unless the check is off: `off`).  Each kernel computes a
 * block's new weights and states once and stores them as torch's step
 * does, ORing whether each is finite (|x| <= FLT_MAX, false for NaN) as it
 * goes; the old ones it overwrites go to stack buffers of BLOCK values (in
 * the cache).  A block whose results all are finite is done: no second
 * pass.  Else a selecting loop puts back, value by value, the old weight
 * and state of each value that has a new one not finite.  No branch in a
 * loop's body (the values are read into locals first: `a[i] = ok ? x :
 * a[i]` is a conditional store to gcc, which it does not vectorize).  A
 * result is stored exactly as computed: the check changes no bit of
 * torch's step.
 *
 * The Makefile builds this file with -fno-tree-loop-distribute-patterns:
 * gcc would take the saving of the old values out of the loop that computes
 * the new ones into a memcpy of its own, before it (rep movs, which costs
 * more than a whole short row's update: the table store updates rows of a
 * few dozen values, one call each).
 *
 * A block's weights (DECL declares the pointers): WI (read), WO (written),
 * WOLD (the old weights after the pass) and SAVE_W(i, x) (keeps WI[i], read
 * into x).  In place: one restrict pointer wb, and the old weights saved to
 * the buffer ob; out of place: wib and wob, and w_in keeps them. */
#define FIN(x) (fabsf(x) <= FLT_MAX)
#define IN_PLACE float *restrict wb = w + o;
#define OUT_OF_PLACE const float *restrict wib = wi + o; float *restrict wob = wo + o;
#define SAVE_IN_PLACE(i, x) ob[i] = (x);
#define SAVE_OUT_OF_PLACE(i, x)

#define BLOCKS_BEGIN(DECL)                                          \
    uint32_t kept = 0;                                              \
    for (size_t o = 0; o < n; o += BLOCK) {                         \
        size_t b = n - o < BLOCK ? n - o : BLOCK;                   \
        const float *restrict gb = g + o;                           \
        DECL                                                        \
        uint32_t bad = 0;
#define BLOCKS_END                                                  \
    }                                                               \
    return kept;

/* ---- sgd: w.add_(g', alpha=-lr) ---- */

#define SGD_BLOCKS(DECL, WI, WO, WOLD, SAVE_W)                      \
    BLOCKS_BEGIN(DECL)                                              \
    for (size_t i = 0; i < b; i++) {                                \
        float ow = WI[i];                                           \
        SAVE_W(i, ow)                                               \
        float nw = fmaf(L2(gb[i], ow), -lr, ow);                    \
        WO[i] = nw;                                                 \
        bad |= (uint32_t)!FIN(nw);                                  \
    }                                                               \
    if (bad && !off)                                                \
        for (size_t i = 0; i < b; i++) {                            \
            float nw = WO[i];                                       \
            int ok = FIN(nw);                                       \
            WO[i] = ok ? nw : WOLD[i];                              \
            kept += (uint32_t)!ok;                                  \
        }                                                           \
    BLOCKS_END

PS_OPT_FMA
static size_t sgd_in(float *restrict w, const float *restrict g, size_t n, float lr, float wd,
                     int off)
{
    float ob[BLOCK];
    SGD_BLOCKS(IN_PLACE, wb, wb, ob, SAVE_IN_PLACE)
}

PS_OPT_FMA
static size_t sgd_out(const float *restrict wi, float *restrict wo, const float *restrict g,
                      size_t n, float lr, float wd, int off)
{
    SGD_BLOCKS(OUT_OF_PLACE, wib, wob, wib, SAVE_OUT_OF_PLACE)
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

/* The old weight and state (in os, the state's buffer) put back where a
 * value's new ones are not both finite, in a block that has one */
#define SELECT_1(WO, WOLD, sb, os)                                  \
    if (bad && !off)                                                \
        for (size_t i = 0; i < b; i++) {                            \
            float nw = WO[i], ns = sb[i];                           \
            int ok = FIN(nw) & FIN(ns);                             \
            sb[i] = ok ? ns : os[i];                                \
            WO[i] = ok ? nw : WOLD[i];                              \
            kept += (uint32_t)!ok;                                  \
        }

/* ---- momentum: v.mul_(mu).add_(g'); w.add_(v, alpha=-lr) (torch's first
 * step clones g' into v: 0 * mu + g' is the same number); nesterov: as
 * momentum, then g'.add(v, alpha=mu) is the step.  STEP: the step's
 * direction from gp and the new velocity nv ---- */

#define MOMENTUM_BLOCKS(DECL, WI, WO, WOLD, SAVE_W, STEP)           \
    BLOCKS_BEGIN(DECL)                                              \
    float *restrict vb = v + o;                                     \
    for (size_t i = 0; i < b; i++) {                                \
        float ow = WI[i], ov = vb[i];                               \
        SAVE_W(i, ow)                                               \
        ovb[i] = ov;                                                \
        float gp = L2(gb[i], ow);                                   \
        float nv = ov * mu + gp;                                    \
        float nw = fmaf(STEP, -lr, ow);                             \
        vb[i] = nv;                                                 \
        WO[i] = nw;                                                 \
        bad |= (uint32_t)!(FIN(nw) & FIN(nv));                      \
    }                                                               \
    SELECT_1(WO, WOLD, vb, ovb)                                     \
    BLOCKS_END

#define MOMENTUM_STEP nv
#define NESTEROV_STEP fmaf(nv, mu, gp)

PS_OPT_FMA
static size_t momentum_in(float *restrict w, float *restrict v, const float *restrict g,
                          size_t n, float lr, float mu, float wd, int off)
{
    float ob[BLOCK], ovb[BLOCK];
    MOMENTUM_BLOCKS(IN_PLACE, wb, wb, ob, SAVE_IN_PLACE, MOMENTUM_STEP)
}

PS_OPT_FMA
static size_t momentum_out(const float *restrict wi, float *restrict wo, float *restrict v,
                           const float *restrict g, size_t n, float lr, float mu, float wd,
                           int off)
{
    float ovb[BLOCK];
    MOMENTUM_BLOCKS(OUT_OF_PLACE, wib, wob, wib, SAVE_OUT_OF_PLACE, MOMENTUM_STEP)
}

PS_OPT_FMA
static size_t nesterov_in(float *restrict w, float *restrict v, const float *restrict g,
                          size_t n, float lr, float mu, float wd, int off)
{
    float ob[BLOCK], ovb[BLOCK];
    MOMENTUM_BLOCKS(IN_PLACE, wb, wb, ob, SAVE_IN_PLACE, NESTEROV_STEP)
}

PS_OPT_FMA
static size_t nesterov_out(const float *restrict wi, float *restrict wo, float *restrict v,
                           const float *restrict g, size_t n, float lr, float mu, float wd,
                           int off)
{
    float ovb[BLOCK];
    MOMENTUM_BLOCKS(OUT_OF_PLACE, wib, wob, wib, SAVE_OUT_OF_PLACE, NESTEROV_STEP)
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

/* ---- adagrad: h.addcmul_(g', g'); w.addcdiv_(g', sqrt(h) + eps, value=-lr).
 * The new state, into d too (d's sqrt by the sqrt pass), then the new
 * weights ---- */

#define ADAGRAD_BLOCKS(DECL, WI, WO, WOLD, SAVE_W)                  \
    BLOCKS_BEGIN(DECL)                                              \
    float *restrict hb = h + o;                                     \
    for (size_t i = 0; i < b; i++) {                                \
        float gp = L2(gb[i], WI[i]), oh = hb[i];                    \
        ohb[i] = oh;                                                \
        float nh = fmaf(gp, gp, oh);                                \
        hb[i] = nh;                                                 \
        d[i] = nh;                                                  \
        bad |= (uint32_t)!FIN(nh);                                  \
    }                                                               \
    ps_opt_sqrt_block(d, b);                                        \
    for (size_t i = 0; i < b; i++) {                                \
        float ow = WI[i];                                           \
        SAVE_W(i, ow)                                               \
        float gp = L2(gb[i], ow); /* the same as above */           \
        float nw = ow + (-lr * gp) / (d[i] + eps);                  \
        WO[i] = nw;                                                 \
        bad |= (uint32_t)!FIN(nw);                                  \
    }                                                               \
    SELECT_1(WO, WOLD, hb, ohb)                                     \
    BLOCKS_END

PS_OPT_FMA
static size_t adagrad_in(float *restrict w, float *restrict h, const float *restrict g, size_t n,
                         float lr, float eps, float wd, int off)
{
    float ob[BLOCK], ohb[BLOCK], d[BLOCK];
    ADAGRAD_BLOCKS(IN_PLACE, wb, wb, ob, SAVE_IN_PLACE)
}

PS_OPT_FMA
static size_t adagrad_out(const float *restrict wi, float *restrict wo, float *restrict h,
                          const float *restrict g, size_t n, float lr, float eps, float wd,
                          int off)
{
    float ohb[BLOCK], d[BLOCK];
    ADAGRAD_BLOCKS(OUT_OF_PLACE, wib, wob, wib, SAVE_OUT_OF_PLACE)
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

/* ---- adam and adamw.  adamw first scales the weights by keep = 1 - lr * wd
 * (w.mul_), adam adds wd * w to the gradient; then m.mul_(b1).add_(g',
 * alpha=1 - b1); v.mul_(b2).addcmul_(g', g', value=1 - b2);
 * w.addcdiv_(m, sqrt(v) / sqrt(1 - b2^t) + eps, value=-lr / (1 - b1^t)).
 * The new moments, v's into d too (d's sqrt by the sqrt pass), then the new
 * weights ---- */

#define ADAM_BLOCKS(DECL, WI, WO, WOLD, SAVE_W)                     \
    BLOCKS_BEGIN(DECL)                                              \
    float *restrict mb = m + o, *restrict vb = v + o;               \
    for (size_t i = 0; i < b; i++) {                                \
        float gp = L2(gb[i], WI[i] * keep), om = mb[i], ov = vb[i]; \
        omb[i] = om;                                                \
        ovb[i] = ov;                                                \
        float nm = fmaf(gp, c1, om * b1);                           \
        float nv = fmaf(c2 * gp, gp, ov * b2);                      \
        mb[i] = nm;                                                 \
        vb[i] = nv;                                                 \
        d[i] = nv;                                                  \
        bad |= (uint32_t)!(FIN(nm) & FIN(nv));                      \
    }                                                               \
    ps_opt_sqrt_block(d, b);                                        \
    for (size_t i = 0; i < b; i++) {                                \
        float ow = WI[i];                                           \
        SAVE_W(i, ow)                                               \
        float wk = ow * keep;                                       \
        float nw = wk + (step * mb[i]) / (d[i] / bc2s + eps);       \
        WO[i] = nw;                                                 \
        bad |= (uint32_t)!FIN(nw);                                  \
    }                                                               \
    if (bad && !off)                                                \
        for (size_t i = 0; i < b; i++) {                            \
            float nw = WO[i], nm = mb[i], nv = vb[i];               \
            int ok = FIN(nw) & FIN(nm) & FIN(nv);                   \
            mb[i] = ok ? nm : omb[i];                               \
            vb[i] = ok ? nv : ovb[i];                               \
            WO[i] = ok ? nw : WOLD[i];                              \
            kept += (uint32_t)!ok;                                  \
        }                                                           \
    BLOCKS_END

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
    float omb[BLOCK], ovb[BLOCK], d[BLOCK];

PS_OPT_FMA
static size_t adam_in(float *restrict w, float *restrict m, float *restrict v,
                      const float *restrict g, size_t n, float lr, float b1, float b2, float eps,
                      float wd, int decoupled, int64_t t, int off)
{
    float ob[BLOCK];
    ADAM_PROLOGUE
    ADAM_BLOCKS(IN_PLACE, wb, wb, ob, SAVE_IN_PLACE)
}

PS_OPT_FMA
static size_t adam_out(const float *restrict wi, float *restrict wo, float *restrict m,
                       float *restrict v, const float *restrict g, size_t n, float lr, float b1,
                       float b2, float eps, float wd, int decoupled, int64_t t, int off)
{
    ADAM_PROLOGUE
    ADAM_BLOCKS(OUT_OF_PLACE, wib, wob, wib, SAVE_OUT_OF_PLACE)
}

static size_t adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                      size_t n, float lr, float b1, float b2, float eps, float wd, int decoupled,
                      int64_t t, int off)
{
    if (w_in == w_out)
        return adam_in(w_out, m, v, g, n, lr, b1, b2, eps, wd, decoupled, t, off);
    return adam_out(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, decoupled, t, off);
}

void ps_opt_adam(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                 size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, 0, t, 1);
}

size_t ps_opt_adam_checked(float *w, float *m, float *v, const float *g, size_t n, float lr,
                           float b1, float b2, float eps, float wd, int64_t t, int guard)
{
    return adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, 0, t, !guard);
}

void ps_opt_adam_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                    size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_to(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, 0, t, 1);
}

void ps_opt_adamw(float *restrict w, float *restrict m, float *restrict v, const float *restrict g,
                  size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_in(w, m, v, g, n, lr, b1, b2, eps, wd, 1, t, 1);
}

void ps_opt_adamw_to(const float *w_in, float *w_out, float *m, float *v, const float *g,
                     size_t n, float lr, float b1, float b2, float eps, float wd, int64_t t)
{
    adam_to(w_in, w_out, m, v, g, n, lr, b1, b2, eps, wd, 1, t, 1);
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
    case PS_OPT_ADAMW:
        return adam_to(w_in, w_out, s0, s1, g, n, lr, cfg->beta1, cfg->beta2, cfg->eps, wd,
                       cfg->kind == PS_OPT_ADAMW, t, off);
    case PS_OPT_AVERAGE:
        return in ? average_in(w_out, g, n, off) : average_out(w_in, w_out, g, n, off);
    case PS_OPT_ADD: return in ? add_in(w_out, g, n, off) : add_out(w_in, w_out, g, n, off);
    default: return 0;
    }
}

int ps_opt_apply_to(const ps_opt_config *cfg, const float *w_in, float *w_out, float *s0,
                    float *s1, const float *g, size_t n, int64_t t)
{
    if (!ps_opt_kind_valid(cfg->kind))
        return PS_EINVAL;
    ps_opt_apply_checked(cfg, w_in, w_out, s0, s1, g, n, t, 0);
    return 0;
}

int ps_opt_apply(const ps_opt_config *c, float *w, float *s0, float *s1, const float *g, size_t n,
                 int64_t t)
{
    return ps_opt_apply_to(c, w, w, s0, s1, g, n, t);
}
