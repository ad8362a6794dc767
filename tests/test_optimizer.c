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
#include "ps_test.h"

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
        case PS_OPT_ADAM:
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
    ps_opt_config c = {kind, 0.05f, 0.9f, 0.9f, 0.999f, 1e-8f, wd};
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
            w2[i] = wi - lr * (gi + wd * wi);
        }
        CHECK(memcmp(w, w2, sizeof w) == 0);
    }
}

PS_TEST(state_arrays_per_kind_and_unknown_kind_refused)
{
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_SGD), 0);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_MOMENTUM), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_NESTEROV), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADAGRAD), 1);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADAM), 2);
    float w[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
    ps_opt_config c = {42, 0.1f, 0, 0, 0, 0, 0};
    CHECK_EQ_INT(ps_opt_apply(&c, w, NULL, NULL, g, 4, 1), PS_EINVAL);
    CHECK(w[0] == 1 && w[3] == 4);
}

PS_TEST(short_arrays_and_zero_length)
{
    /* lengths below one vector and zero must work for every kind */
    for (int kind = PS_OPT_SGD; kind <= PS_OPT_ADAM; kind++) {
        for (size_t n = 0; n <= 5; n++) {
            float w[5] = {1, -1, 0.5f, 2, -3}, s0[5] = {0}, s1[5] = {0}, g[5] = {1, 1, -1, 0.5f, 2};
            ps_opt_config c = {kind, 0.1f, 0.9f, 0.9f, 0.999f, 1e-8f, 0};
            CHECK_OK(ps_opt_apply(&c, w, s0, s1, g, n, 1));
            for (size_t i = 0; i < 5; i++)
                CHECK(isfinite(w[i]));
            for (size_t i = n; i < 5; i++)
                CHECK(s0[i] == 0 && s1[i] == 0);
        }
    }
}
