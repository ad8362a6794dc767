/* The table store's arithmetic (server/table_opt.h): the optimizer kinds
 * tables take and one row's update. */
#include "table_opt.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "optimizer.h"
#include "ps_table_row.h"

int ps_table_state_arrays(int kind)
{
    switch (kind) {
    case PS_OPT_SGD: return 0;
    case PS_OPT_MOMENTUM:
    case PS_OPT_NESTEROV:
    case PS_OPT_ADAGRAD:
    case PS_TABLE_OPT_ROWWISE_ADAGRAD: return 1;
    case PS_OPT_ADAM:
    case PS_TABLE_OPT_FTRL: return 2;
    default: return -1;
    }
}

size_t ps_table_state_len(int kind, size_t dim)
{
    return kind == PS_TABLE_OPT_ROWWISE_ADAGRAD ? 1 : dim;
}

const char *ps_table_opt_name(int kind)
{
    if (kind == PS_TABLE_OPT_FTRL)
        return "ftrl";
    if (kind == PS_TABLE_OPT_ROWWISE_ADAGRAD)
        return "rowwise_adagrad";
    return ps_table_state_arrays(kind) < 0 ? "unknown" : ps_opt_name(kind);
}

/* ---- FTRL-proximal: in blocks, as optimizer.c's adagrad, so the loops
 * vectorize around the square roots ---- */

#define BLOCK 256

static size_t ftrl(float *restrict w, float *restrict z, float *restrict nacc,
                   const float *restrict g, size_t n, float alpha, float beta, float l1, float l2,
                   float wd, int off)
{
    float rn[BLOCK], rn1[BLOCK]; /* sqrt(n), sqrt(n') */
    uint32_t kept = 0;
    for (size_t o = 0; o < n; o += BLOCK) {
        size_t b = n - o < BLOCK ? n - o : BLOCK;
        float *restrict wb = w + o, *restrict zb = z + o, *restrict nb = nacc + o;
        const float *restrict gb = g + o;
        for (size_t i = 0; i < b; i++) {
            float gp = gb[i] + wd * wb[i];
            rn[i] = nb[i];
            rn1[i] = nb[i] + gp * gp;
        }
        ps_opt_sqrt_block(rn, b);
        ps_opt_sqrt_block(rn1, b);
        /* the new value and state stored only when all are finite (or the
         * check is off), as optimizer.c's kernels */
        for (size_t i = 0; i < b; i++) {
            float ow = wb[i], oz = zb[i], on = nb[i];
            float gp = gb[i] + wd * ow;
            float sigma = (rn1[i] - rn[i]) / alpha;
            float zi = oz + gp - sigma * ow;
            float ni = on + gp * gp;
            float shrunk = zi - copysignf(l1, zi);
            float nw = fabsf(zi) <= l1 ? 0.0f : -shrunk / ((beta + rn1[i]) / alpha + l2);
            int ok = ((fabsf(nw) <= FLT_MAX) & (fabsf(zi) <= FLT_MAX) & (fabsf(ni) <= FLT_MAX)) |
                     off;
            zb[i] = ok ? zi : oz;
            nb[i] = ok ? ni : on;
            wb[i] = ok ? nw : ow;
            kept += (uint32_t)!ok;
        }
    }
    return kept;
}

void ps_table_ftrl(float *restrict w, float *restrict z, float *restrict nacc,
                   const float *restrict g, size_t n, float alpha, float beta, float l1,
                   float l2, float wd)
{
    ftrl(w, z, nacc, g, n, alpha, beta, l1, l2, wd, 1);
}

size_t tbl_apply_row(const tbl_opt *o, float *w, size_t d, uint32_t *cnt, const float *g,
                     float lr, int64_t m, int guard)
{
    const ps_opt_config *c = &o->opt;
    float *s0 = w + d, *s1 = w + 2 * d;
    switch (c->kind) {
    case PS_OPT_SGD: return ps_opt_sgd_checked(w, g, d, lr, c->weight_decay, guard);
    case PS_OPT_MOMENTUM:
        return ps_opt_momentum_checked(w, s0, g, d, lr, c->momentum, c->weight_decay, guard);
    case PS_OPT_NESTEROV:
        return ps_opt_nesterov_checked(w, s0, g, d, lr, c->momentum, c->weight_decay, guard);
    case PS_OPT_ADAGRAD:
        return ps_opt_adagrad_checked(w, s0, g, d, lr, c->eps, c->weight_decay, guard);
    case PS_OPT_ADAM: {
        /* lazy: the bias correction counts this row's updates; saturating,
         * which changes nothing (1 - b^t is 1.0f in float long before) */
        uint32_t before = *cnt;
        uint64_t rt = (uint64_t)*cnt + (uint64_t)m;
        *cnt = rt > UINT32_MAX ? UINT32_MAX : (uint32_t)rt;
        size_t kept = ps_opt_adam_checked(w, s0, s1, g, d, lr, c->beta1, c->beta2, c->eps,
                                          c->weight_decay, (int64_t)*cnt, guard);
        if (kept == d) /* nothing of the row moved: nor does its count */
            *cnt = before;
        return kept;
    }
    case PS_TABLE_OPT_ROWWISE_ADAGRAD:
        return ps_table_rowwise_adagrad_checked(w, s0, g, d, lr, c->eps, c->weight_decay, guard);
    case PS_TABLE_OPT_FTRL:
        return ftrl(w, s0, s1, g, d, lr, o->ftrl_beta, o->ftrl_l1, o->ftrl_l2, c->weight_decay,
                    !guard);
    default: return 0; /* refused by ps_table_check_config */
    }
}
