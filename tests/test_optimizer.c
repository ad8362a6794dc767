/* Optimizer kernels against references written in double precision, over
 * several steps with random weights and gradients.  Tolerance: every weight
 * within REL_TOL * max(1, |reference|) of the double reference (float keeps
 * ~7 digits; 8 steps of rounding measure about 2.5e-7).  Plain SGD is also
 * checked bit for bit against the same formula evaluated in float. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_test.h"
#include "table.h"

#define REL_TOL 2e-6
#define STEPS 8
/* not a multiple of the vector width or of the 256-element sqrt block */
#define N 1031

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static double urand(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* the update rules the servers run */
static const int kinds[] = {PS_OPT_SGD,     PS_OPT_MOMENTUM, PS_OPT_NESTEROV,
                            PS_OPT_ADAGRAD, PS_OPT_ADAM,     PS_OPT_ADAMW};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

typedef struct ref {
    double w[N], s0[N], s1[N];
} ref;

/* the formulas of server/optimizer.h, in double */
static void ref_step(const ps_opt_config *c, ref *r, const float *g, int64_t t)
{
    double lr = c->lr, mu = c->momentum, b1 = c->beta1, b2 = c->beta2, eps = c->eps,
           wd = c->weight_decay;
    for (int i = 0; i < N; i++) {
        double gp = (double)g[i] + wd * r->w[i];
        switch (c->kind) {
        case PS_OPT_SGD: r->w[i] -= lr * gp; break;
        case PS_OPT_MOMENTUM:
            r->s0[i] = mu * r->s0[i] + gp;
            r->w[i] -= lr * r->s0[i];
            break;
        case PS_OPT_NESTEROV:
            r->s0[i] = mu * r->s0[i] + gp;
            r->w[i] -= lr * (gp + mu * r->s0[i]);
            break;
        case PS_OPT_ADAGRAD:
            r->s0[i] += gp * gp;
            r->w[i] -= lr * gp / (sqrt(r->s0[i]) + eps);
            break;
        case PS_OPT_ADAMW:
        case PS_OPT_ADAM:
            if (c->kind == PS_OPT_ADAMW) { /* decoupled: the weights shrink, g stays */
                r->w[i] *= 1 - lr * wd;
                gp = (double)g[i];
            }
            r->s0[i] = b1 * r->s0[i] + (1 - b1) * gp;
            r->s1[i] = b2 * r->s1[i] + (1 - b2) * gp * gp;
            r->w[i] -= lr * (r->s0[i] / (1 - pow(b1, (double)t))) /
                       (sqrt(r->s1[i] / (1 - pow(b2, (double)t))) + eps);
            break;
        }
    }
}

/* Run STEPS steps of kernel and reference from the same random start;
 * returns the worst relative error seen, or a negative value on setup error. */
static double compare(int kind, float wd)
{
    ps_opt_config c = {kind, 0.05f, 0.9f, 0.9f, 0.999f, 1e-8f, wd, 1.0f, 0, PS_OPT_GIVEN_ALL};
    static float w[N], s0[N], s1[N], g[N];
    static ref r;
    memset(&r, 0, sizeof r);
    memset(s0, 0, sizeof s0);
    memset(s1, 0, sizeof s1);
    for (int i = 0; i < N; i++) {
        w[i] = (float)urand();
        r.w[i] = w[i];
    }
    double worst = 0;
    for (int64_t t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)urand();
        if (ps_opt_apply(&c, w, s0, s1, g, N, t) != 0)
            return -1;
        ref_step(&c, &r, g, t);
        for (int i = 0; i < N; i++) {
            double scale = fabs(r.w[i]) > 1 ? fabs(r.w[i]) : 1;
            double e = fabs((double)w[i] - r.w[i]) / scale;
            if (!(e <= worst)) /* also catches NaN */
                worst = isnan(e) ? INFINITY : e;
        }
    }
    return worst;
}

#define CHECK_OPT(kind, wd)                                                            \
    do {                                                                               \
        double e_ = compare(kind, wd);                                                 \
        CHECK_MSG(e_ >= 0 && e_ <= REL_TOL, "%s wd=%g: worst relative error %.3g > %g", \
                  ps_opt_name(kind), (double)(wd), e_, REL_TOL);                       \
    } while (0)

PS_TEST(sgd_matches_double_reference)
{
    CHECK_OPT(PS_OPT_SGD, 0.0f);
    CHECK_OPT(PS_OPT_SGD, 0.01f);
}

PS_TEST(momentum_matches_double_reference)
{
    CHECK_OPT(PS_OPT_MOMENTUM, 0.0f);
    CHECK_OPT(PS_OPT_MOMENTUM, 0.01f);
}

PS_TEST(nesterov_matches_double_reference)
{
    CHECK_OPT(PS_OPT_NESTEROV, 0.0f);
    CHECK_OPT(PS_OPT_NESTEROV, 0.01f);
}

PS_TEST(adagrad_matches_double_reference)
{
    CHECK_OPT(PS_OPT_ADAGRAD, 0.0f);
    CHECK_OPT(PS_OPT_ADAGRAD, 0.01f);
}

PS_TEST(adam_matches_double_reference_with_bias_correction)
{
    CHECK_OPT(PS_OPT_ADAM, 0.0f);
    CHECK_OPT(PS_OPT_ADAM, 0.01f);
}

PS_TEST(adamw_matches_double_reference_with_decoupled_decay)
{
    CHECK_OPT(PS_OPT_ADAMW, 0.0f);
    CHECK_OPT(PS_OPT_ADAMW, 0.01f);
    CHECK_OPT(PS_OPT_ADAMW, 0.5f);
}

PS_TEST(sgd_is_bitwise_the_float_formula)
{
    static float w[N], w2[N], g[N];
    const float lr = 0.037f, wd = 0.003f;
    for (int i = 0; i < N; i++) {
        w[i] = w2[i] = (float)urand();
    }
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)urand();
        ps_opt_sgd(w, g, N, lr, wd);
        for (int i = 0; i < N; i++) {
            float gi = g[i], wi = w2[i];
            w2[i] = fmaf(fmaf(wi, wd, gi), -lr, wi); /* torch's two fused adds */
        }
        CHECK(memcmp(w, w2, sizeof w) == 0);
    }
}

/* torch.optim's single-tensor steps (torch 1.13, foreach=False) written out
 * in float: each kernel must be these operations exactly (fmaf where torch
 * fuses a multiply-add, adam's numbers from the decimals 0.9, 0.999, 1e-3,
 * 0.01 in double as Python computes them); tests/python compares the
 * servers with torch itself. */
static void torch_step(int kind, float *w, float *s0, float *s1, const float *g, int64_t t)
{
    const float lr = 0.001f, mu = 0.9f, wd = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    double bc1 = 1.0 - pow(0.9, (double)t), bc2 = 1.0 - pow(0.999, (double)t);
    float step = (float)-(0.001 / bc1), bc2s = (float)sqrt(bc2);
    for (int i = 0; i < N; i++) {
        float gp = kind == PS_OPT_ADAMW ? g[i] : fmaf(w[i], wd, g[i]); /* grad.add(w, alpha=wd) */
        switch (kind) {
        case PS_OPT_SGD: w[i] = fmaf(gp, -lr, w[i]); break;
        case PS_OPT_MOMENTUM: /* buf.mul_(mu).add_(g'); w.add_(buf, alpha=-lr) */
            s0[i] = s0[i] * mu + gp;
            w[i] = fmaf(s0[i], -lr, w[i]);
            break;
        case PS_OPT_NESTEROV: /* ... g'.add(buf, alpha=mu) */
            s0[i] = s0[i] * mu + gp;
            w[i] = fmaf(fmaf(s0[i], mu, gp), -lr, w[i]);
            break;
        case PS_OPT_ADAGRAD: /* sum.addcmul_(g', g'); w.addcdiv_(g', sqrt + eps, value=-lr) */
            s0[i] = fmaf(gp, gp, s0[i]);
            w[i] = w[i] + (-lr * gp) / (sqrtf(s0[i]) + eps);
            break;
        case PS_OPT_ADAMW: /* w.mul_(1 - lr * wd), then adam's step */
            w[i] = w[i] * (float)(1.0 - 0.001 * 0.01);
            /* fall through */
        case PS_OPT_ADAM:
            s0[i] = fmaf(gp, (float)(1.0 - 0.9), s0[i] * b1);
            s1[i] = fmaf((float)(1.0 - 0.999) * gp, gp, s1[i] * b2);
            w[i] = w[i] + (step * s0[i]) / (sqrtf(s1[i]) / bc2s + eps);
            break;
        }
    }
}

PS_TEST(every_kernel_is_torchs_single_tensor_step_bitwise)
{
    static float w[N], s0[N], s1[N], w2[N], r0[N], r1[N], g[N];
    for (int k = 0; k < NKINDS; k++) {
        ps_opt_config c;
        ps_opt_default(&c);
        c.kind = kinds[k];
        c.lr = 0.001f, c.momentum = 0.9f, c.weight_decay = 0.01f;
        c.beta1 = 0.9f, c.beta2 = 0.999f, c.eps = 1e-8f;
        for (int i = 0; i < N; i++) {
            w[i] = w2[i] = (float)urand();
            s0[i] = s1[i] = r0[i] = r1[i] = 0;
        }
        int bad = 0;
        for (int64_t t = 1; t <= STEPS; t++) {
            for (int i = 0; i < N; i++)
                g[i] = (float)urand();
            CHECK_OK(ps_opt_apply(&c, w, s0, s1, g, N, t));
            torch_step(c.kind, w2, r0, r1, g, t);
            bad += memcmp(w, w2, sizeof w) != 0 || memcmp(s0, r0, sizeof s0) != 0 ||
                   memcmp(s1, r1, sizeof s1) != 0;
        }
        CHECK_MSG(bad == 0, "%s: %d of %d steps differ from torch's float operations",
                  ps_opt_name(c.kind), bad, STEPS);
    }
}

PS_TEST(lr_0_moves_no_weight_and_still_counts_adams_step)
{
    /* a scheduler's 0 (CosineAnnealingLR's eta_min, a warm-up's start) */
    static float w[N], w0[N], s0[N], s1[N], g[N];
    for (int k = 0; k < NKINDS; k++) {
        ps_opt_config c;
        ps_opt_default(&c);
        c.kind = kinds[k];
        c.lr = 0;
        c.weight_decay = 0.01f;
        char why[128];
        CHECK_OK(ps_opt_check(&c, 0, why, sizeof why));
        for (int i = 0; i < N; i++) {
            w[i] = w0[i] = (float)urand();
            g[i] = (float)urand();
            s0[i] = s1[i] = 0;
        }
        CHECK_OK(ps_opt_apply(&c, w, s0, s1, g, N, 1));
        CHECK_MSG(memcmp(w, w0, sizeof w) == 0, "%s: lr 0 moved a weight", ps_opt_name(c.kind));
        if (ps_opt_state_arrays(c.kind) > 0) /* the moments (adagrad's sum) move as torch's */
            CHECK_MSG(s0[0] != 0, "%s: lr 0 skipped the state", ps_opt_name(c.kind));
    }
    /* adam: a step at lr 0 is still step 1 of the bias correction, as torch
     * counts it: step 2 at lr 0.001 after it is not step 1 at lr 0.001 */
    ps_opt_config c;
    ps_opt_default(&c);
    c.kind = PS_OPT_ADAM;
    static float a[N], b[N], as0[N], as1[N], bs0[N], bs1[N];
    for (int i = 0; i < N; i++)
        a[i] = b[i] = (float)urand(), as0[i] = as1[i] = bs0[i] = bs1[i] = 0;
    c.lr = 0;
    CHECK_OK(ps_opt_apply(&c, a, as0, as1, g, N, 1));
    c.lr = 0.001f;
    CHECK_OK(ps_opt_apply(&c, a, as0, as1, g, N, 2));
    CHECK_OK(ps_opt_apply(&c, b, bs0, bs1, g, N, 1));
    CHECK(memcmp(a, b, sizeof a) != 0);
    /* below 0 is still refused */
    c.lr = -0.5f;
    char why[128];
    CHECK_EQ_INT(ps_opt_check(&c, 0, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "lr must be in [0, 1e+06]"), "%s", why);
}

/* The tables' range check is the same table's: lr 0 passes for every kind
 * that takes it (a row's push then moves nothing), and FTRL, whose alpha
 * divides, refuses it. */
PS_TEST(tables_take_lr_0_except_ftrl)
{
    const int tkinds[6] = {PS_OPT_SGD,     PS_OPT_MOMENTUM, PS_OPT_NESTEROV,
                           PS_OPT_ADAGRAD, PS_OPT_ADAM,     PS_TABLE_OPT_FTRL};
    for (int k = 0; k < 6; k++) {
        ps_table_config c;
        memset(&c, 0, sizeof c);
        c.table = 3, c.dim = 4, c.init = PS_TABLE_INIT_UNIFORM, c.init_scale = 0.5f, c.seed = 1;
        c.max_memory = UINT64_MAX;
        ps_opt_default(&c.opt);
        c.opt.kind = tkinds[k];
        c.opt.lr = 0;
        c.ftrl_beta = 1.0f;
        ps_table *t = NULL;
        char why[256] = "";
        int rc = ps_table_create(&c, &t, why, sizeof why);
        if (tkinds[k] == PS_TABLE_OPT_FTRL) {
            CHECK_EQ_INT(rc, PS_EINVAL);
            CHECK_MSG(strstr(why, "lr (FTRL's alpha) must be > 0"), "%s", why);
            continue;
        }
        CHECK_MSG(rc == 0, "%s: %s", ps_opt_name(tkinds[k]), why);
        uint64_t id = 9;
        float w0[4], g[4] = {1, -2, 3, -4}, w1[4];
        CHECK_OK(ps_table_pull(t, &id, 1, w0, 4, why, sizeof why));
        CHECK_OK(ps_table_push(t, &id, 1, g, 4, 1, why, sizeof why));
        CHECK_OK(ps_table_pull(t, &id, 1, w1, 4, why, sizeof why));
        CHECK_MSG(memcmp(w0, w1, sizeof w0) == 0, "%s: lr 0 moved a row",
                  ps_opt_name(tkinds[k]));
        ps_table_destroy(t);
    }
}

PS_TEST(hyper_parameters_are_taken_as_their_shortest_decimal)
{
    CHECK(ps_opt_decimal(0.9f) == 0.9);
    CHECK(ps_opt_decimal(0.999f) == 0.999);
    CHECK(ps_opt_decimal(1e-3f) == 1e-3);
    CHECK(ps_opt_decimal(3e-4f) == 3e-4);
    CHECK(ps_opt_decimal(0.0078125f) == 0.0078125); /* a binary fraction: itself */
    CHECK(ps_opt_decimal(0.0f) == 0.0);
    /* and a float is always the float of its decimal */
    for (int i = 0; i < 1000; i++) {
        float f = (float)fabs(urand()) * 1e-3f;
        CHECK((float)ps_opt_decimal(f) == f);
    }
}

PS_TEST(each_kind_keeps_its_state_arrays_and_an_unknown_kind_is_refused)
{
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_SGD), 0);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_MOMENTUM), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_NESTEROV), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADAGRAD), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADAM), 2);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADAMW), 2);
    float w[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
    ps_opt_config c = {42, 0.1f, 0, 0, 0, 0, 0, 1.0f, 0, PS_OPT_GIVEN_ALL};
    CHECK_EQ_INT(ps_opt_apply(&c, w, NULL, NULL, g, 4, 1), PS_EINVAL);
    CHECK(w[0] == 1 && w[3] == 4);
}

PS_TEST(short_and_empty_arrays_update_their_n_elements_and_nothing_past_them)
{
    /* lengths below one vector and zero must work for every kind */
    for (int k = 0; k < NKINDS; k++) {
        int kind = kinds[k];
        for (size_t n = 0; n <= 5; n++) {
            const float w0[5] = {1, -1, 0.5f, 2, -3};
            float w[5] = {1, -1, 0.5f, 2, -3}, s0[5] = {0}, s1[5] = {0}, g[5] = {1, 1, -1, 0.5f, 2};
            ps_opt_config c = {kind, 0.1f, 0.9f, 0.9f, 0.999f, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL};
            CHECK_OK(ps_opt_apply(&c, w, s0, s1, g, n, 1));
            for (size_t i = 0; i < 5; i++)
                CHECK(isfinite(w[i]));
            /* every gradient element is non-zero: the first n weights move */
            for (size_t i = 0; i < n; i++)
                CHECK_MSG(w[i] != w0[i], "kind %d n %zu: w[%zu] did not move", kind, n, i);
            for (size_t i = n; i < 5; i++)
                CHECK(w[i] == w0[i] && s0[i] == 0 && s1[i] == 0);
        }
    }
}

/* In place (w_in == w_out) and out of place (w_in != w_out, state in place)
 * must give bitwise the same weights and state, step after step, for every
 * kind: the server updates out of place while a pull reply still sends the
 * old weights.  The out-of-place runs ping-pong between two buffers, one of
 * them misaligned by a float (other vector peeling), and w_in must come out
 * unchanged. */
PS_TEST(out_of_place_is_bitwise_the_in_place_update_for_every_kind)
{
    static float wa[N], sa0[N], sa1[N];                /* in place */
    static float wb[2][N + 1], sb0[N], sb1[N], keep[N]; /* out of place */
    static float g[N];
    for (int k = 0; k < NKINDS; k++) {
        int kind = kinds[k];
        for (int wdi = 0; wdi < 2; wdi++) {
            ps_opt_config c = {kind, 0.05f, 0.9f, 0.9f, 0.999f, 1e-8f, wdi ? 0.01f : 0.0f, 1.0f, 0, PS_OPT_GIVEN_ALL};
            memset(sa0, 0, sizeof sa0);
            memset(sa1, 0, sizeof sa1);
            memset(sb0, 0, sizeof sb0);
            memset(sb1, 0, sizeof sb1);
            float *buf[2] = {wb[0], wb[1] + 1};
            for (int i = 0; i < N; i++)
                wa[i] = buf[0][i] = (float)urand();
            int cur = 0, diff = 0, touched = 0;
            for (int64_t t = 1; t <= STEPS; t++) {
                for (int i = 0; i < N; i++)
                    g[i] = (float)urand();
                CHECK_OK(ps_opt_apply(&c, wa, sa0, sa1, g, N, t));
                memcpy(keep, buf[cur], sizeof keep);
                CHECK_OK(ps_opt_apply_to(&c, buf[cur], buf[1 - cur], sb0, sb1, g, N, t));
                touched += memcmp(keep, buf[cur], sizeof keep) != 0;
                cur = 1 - cur;
                diff += memcmp(wa, buf[cur], sizeof wa) != 0 || memcmp(sa0, sb0, sizeof sa0) != 0 ||
                        memcmp(sa1, sb1, sizeof sa1) != 0;
                /* and the in-place form of the _to call is the same too */
                if (t == STEPS) {
                    CHECK_OK(ps_opt_apply_to(&c, wa, wa, sa0, sa1, g, N, t + 1));
                    CHECK_OK(ps_opt_apply(&c, buf[cur], sb0, sb1, g, N, t + 1));
                    diff += memcmp(wa, buf[cur], sizeof wa) != 0 ||
                            memcmp(sa0, sb0, sizeof sa0) != 0 || memcmp(sa1, sb1, sizeof sa1) != 0;
                }
            }
            CHECK_MSG(diff == 0, "%s wd=%g: out of place differs from in place in %d steps",
                      ps_opt_name(kind), (double)c.weight_decay, diff);
            CHECK_MSG(touched == 0, "%s: out of place changed w_in in %d steps",
                      ps_opt_name(kind), touched);
        }
    }
}

PS_TEST(out_of_place_kernels_match_the_in_place_kernels)
{
    /* the kernels themselves, called directly, short lengths included */
    static float w[N], w2[N], out[N], v[N], v2[N], m[N], m2[N], g[N];
    for (size_t n = 0; n <= N; n = n < 9 ? n + 1 : n * 4 + 3) {
        for (int kind = PS_OPT_SGD; kind <= PS_OPT_ADAM; kind++) {
            for (size_t i = 0; i < N; i++) {
                w[i] = w2[i] = (float)urand();
                g[i] = (float)urand();
                v[i] = v2[i] = (float)(urand() * urand());
                m[i] = m2[i] = (float)urand();
            }
            v[0] = v2[0] = 0.25f; /* adagrad / adam state must stay >= 0 */
            for (size_t i = 0; i < N; i++)
                v[i] = v2[i] = v[i] < 0 ? -v[i] : v[i];
            memcpy(out, w2, sizeof out);
            switch (kind) {
            case PS_OPT_SGD:
                ps_opt_sgd(w, g, n, 0.05f, 0.01f);
                ps_opt_sgd_to(w2, out, g, n, 0.05f, 0.01f);
                break;
            case PS_OPT_MOMENTUM:
                ps_opt_momentum(w, v, g, n, 0.05f, 0.9f, 0.01f);
                ps_opt_momentum_to(w2, out, v2, g, n, 0.05f, 0.9f, 0.01f);
                break;
            case PS_OPT_NESTEROV:
                ps_opt_nesterov(w, v, g, n, 0.05f, 0.9f, 0.01f);
                ps_opt_nesterov_to(w2, out, v2, g, n, 0.05f, 0.9f, 0.01f);
                break;
            case PS_OPT_ADAGRAD:
                ps_opt_adagrad(w, v, g, n, 0.05f, 1e-8f, 0.01f);
                ps_opt_adagrad_to(w2, out, v2, g, n, 0.05f, 1e-8f, 0.01f);
                break;
            case PS_OPT_ADAM:
                ps_opt_adam(w, m, v, g, n, 0.05f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
                ps_opt_adam_to(w2, out, m2, v2, g, n, 0.05f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
                break;
            }
            CHECK_MSG(memcmp(w, out, sizeof w) == 0 && memcmp(v, v2, sizeof v) == 0 &&
                          memcmp(m, m2, sizeof m) == 0,
                      "%s n=%zu: the out-of-place kernel differs", ps_opt_name(kind), n);
        }
    }
}

/* Step decay: with lr_decay 0.5 every 2 updates, updates 1-2 use lr, 3-4 lr/2,
 * 5 lr/4; SGD with g = 1 then moves w by exactly those amounts (powers of 2). */
PS_TEST(lr_step_decay_follows_the_schedule)
{
    ps_opt_config c = {PS_OPT_SGD, 0.5f, 0, 0, 0, 1e-8f, 0, 0.5f, 2, PS_OPT_GIVEN_ALL};
    CHECK(ps_opt_lr_at(&c, 1) == 0.5f && ps_opt_lr_at(&c, 2) == 0.5f);
    CHECK(ps_opt_lr_at(&c, 3) == 0.25f && ps_opt_lr_at(&c, 4) == 0.25f);
    CHECK(ps_opt_lr_at(&c, 5) == 0.125f);
    float w[4] = {8, 8, 8, 8}, g[4] = {1, 1, 1, 1};
    float expect = 8;
    for (int64_t t = 1; t <= 5; t++) {
        CHECK_OK(ps_opt_apply(&c, w, NULL, NULL, g, 4, t));
        expect -= ps_opt_lr_at(&c, t);
    }
    CHECK(expect == 8 - 0.5f - 0.5f - 0.25f - 0.25f - 0.125f);
    for (int i = 0; i < 4; i++)
        CHECK(w[i] == expect);
    c.lr_decay_every = 0; /* no decay */
    CHECK(ps_opt_lr_at(&c, 100) == 0.5f);
}

/* The results checked (--on-nonfinite refuse): a step whose new weight or
 * state would not be finite for some values keeps those values' weight and
 * state; every other value is bitwise the unchecked step's, in place and
 * out of place, for every kind; the count is the values kept.  Values 7 and
 * 300 (second sqrt block) get finite gradients whose step overflows: -3e38
 * at rate 0.5 from a weight of 3e38 (sgd, momentum, nesterov; add: +3e38),
 * 3e38 whose square overflows the state (adagrad, adam); average's new
 * weight is the gradient itself, Inf there; adamw's decoupled decay at
 * weight_decay 10 scales the weights by 1 - 0.5 x 10 = -4 first: a weight
 * of 3e38 overflows, its moments do not. */
PS_TEST(checked_step_keeps_the_values_whose_result_is_not_finite_and_only_those)
{
    static float w0[N], g[N], wa[N], sa0[N], sa1[N], wb[N], sb0[N], sb1[N], wo[N];
    const int kinds[] = {PS_OPT_SGD, PS_OPT_MOMENTUM, PS_OPT_NESTEROV, PS_OPT_ADAGRAD,
                         PS_OPT_ADAM, PS_OPT_AVERAGE, PS_OPT_ADD, PS_OPT_ADAMW};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int kind = kinds[k];
        ps_opt_config c = {kind, 0.5f, 0.9f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 0,
                           PS_OPT_GIVEN_ALL};
        if (kind == PS_OPT_ADAMW)
            c.weight_decay = 10.0f;
        for (int i = 0; i < N; i++) {
            w0[i] = (float)urand();
            g[i] = (float)urand();
        }
        const int bad[2] = {7, 300};
        for (int b = 0; b < 2; b++) {
            if (kind == PS_OPT_ADAGRAD || kind == PS_OPT_ADAM) {
                g[bad[b]] = 3e38f; /* its square: the state */
            } else if (kind == PS_OPT_ADAMW) {
                w0[bad[b]] = 3e38f; /* x -4 */
            } else {
                w0[bad[b]] = 3e38f; /* the weight */
                g[bad[b]] = kind == PS_OPT_ADD ? 3e38f : -3e38f;
            }
        }
        if (kind == PS_OPT_AVERAGE) /* the new weight is g: make two of them overflowed */
            g[bad[0]] = g[bad[1]] = INFINITY;
        for (int out = 0; out < 2; out++) {
            memcpy(wa, w0, sizeof wa);
            memcpy(wb, w0, sizeof wb);
            memset(sa0, 0, sizeof sa0), memset(sa1, 0, sizeof sa1);
            memset(sb0, 0, sizeof sb0), memset(sb1, 0, sizeof sb1);
            CHECK_OK(ps_opt_apply(&c, wa, sa0, sa1, g, N, 1)); /* unchecked */
            size_t kept = ps_opt_apply_checked(&c, wb, out ? wo : wb, sb0, sb1, g, N, 1, 1);
            const float *nw = out ? wo : wb;
            CHECK_MSG(kept == 2, "%s out=%d: %zu values kept", ps_opt_name(kind), out, kept);
            int diff = 0;
            for (int i = 0; i < N; i++) {
                int is_bad = i == bad[0] || i == bad[1];
                if (is_bad)
                    diff += nw[i] != w0[i] || sb0[i] != 0.0f || sb1[i] != 0.0f;
                else
                    diff += memcmp(&nw[i], &wa[i], 4) != 0 || memcmp(&sb0[i], &sa0[i], 4) != 0 ||
                            memcmp(&sb1[i], &sa1[i], 4) != 0;
            }
            CHECK_MSG(diff == 0, "%s out=%d: %d values differ", ps_opt_name(kind), out, diff);
            /* without the check: the same call stores what it computes */
            memcpy(wb, w0, sizeof wb);
            memset(sb0, 0, sizeof sb0), memset(sb1, 0, sizeof sb1);
            CHECK(ps_opt_apply_checked(&c, wb, out ? wo : wb, sb0, sb1, g, N, 1, 0) == 0);
            CHECK(memcmp(out ? wo : wb, wa, sizeof wa) == 0);
        }
    }
}
