/* The table store's arithmetic (server/table_opt.h): the optimizer kinds
 * tables take and one row's update. */
#include "table_opt.h"

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

void ps_table_ftrl(float *restrict w, float *restrict z, float *restrict nacc,
                   const float *restrict g, size_t n, float alpha, float beta, float l1,
                   float l2, float wd)
{
    float rn[BLOCK], rn1[BLOCK]; /* sqrt(n), sqrt(n') */
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
        for (size_t i = 0; i < b; i++) {
            float gp = gb[i] + wd * wb[i];
            float sigma = (rn1[i] - rn[i]) / alpha;
            float zi = zb[i] + gp - sigma * wb[i];
            zb[i] = zi;
            nb[i] = nb[i] + gp * gp;
            float shrunk = zi - copysignf(l1, zi);
            wb[i] = fabsf(zi) <= l1 ? 0.0f : -shrunk / ((beta + rn1[i]) / alpha + l2);
        }
    }
}

void tbl_apply_row(const tbl_opt *o, float *w, size_t d, uint32_t *cnt, const float *g,
                   float lr, int64_t m)
{
    const ps_opt_config *c = &o->opt;
    float *s0 = w + d, *s1 = w + 2 * d;
    switch (c->kind) {
    case PS_OPT_SGD: ps_opt_sgd(w, g, d, lr, c->weight_decay); break;
    case PS_OPT_MOMENTUM: ps_opt_momentum(w, s0, g, d, lr, c->momentum, c->weight_decay); break;
    case PS_OPT_NESTEROV: ps_opt_nesterov(w, s0, g, d, lr, c->momentum, c->weight_decay); break;
    case PS_OPT_ADAGRAD: ps_opt_adagrad(w, s0, g, d, lr, c->eps, c->weight_decay); break;
    case PS_OPT_ADAM: {
        /* lazy: the bias correction counts this row's updates; saturating,
         * which changes nothing (1 - b^t is 1.0f in float long before) */
        uint64_t rt = (uint64_t)*cnt + (uint64_t)m;
        *cnt = rt > UINT32_MAX ? UINT32_MAX : (uint32_t)rt;
        ps_opt_adam(w, s0, s1, g, d, lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                    (int64_t)*cnt);
        break;
    }
    case PS_TABLE_OPT_ROWWISE_ADAGRAD:
        ps_table_rowwise_adagrad(w, s0, g, d, lr, c->eps, c->weight_decay);
        break;
    case PS_TABLE_OPT_FTRL:
        ps_table_ftrl(w, s0, s1, g, d, lr, o->ftrl_beta, o->ftrl_l1, o->ftrl_l2,
                      c->weight_decay);
        break;
    default: break; /* refused by ps_table_check_config */
    }
}
