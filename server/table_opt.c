/* The table store's arithmetic (server/table.h): the initializer, the
 * optimizer kinds tables take, and one row's update.  A row's update is the
 * dense kernel of server/optimizer.h on that row's dim values (so a table
 * row and a dense chunk of the same gradients agree bit for bit), with
 * adam's t the row's own update count, and FTRL's kernel here. */
#include <math.h>
#include <string.h>

#include "optimizer.h"
#include "table_internal.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

/* one SplitMix64 output for state x */
static uint64_t sm(uint64_t x) { return tbl_mix(x + GOLDEN); }

void ps_table_initial_row(const ps_table_config *c, uint64_t id, float *out)
{
    size_t d = c->dim;
    if (c->init != PS_TABLE_INIT_UNIFORM && c->init != PS_TABLE_INIT_NORMAL) {
        memset(out, 0, d * sizeof(float));
        return;
    }
    uint64_t k = sm(sm(sm(c->seed) ^ c->table) ^ id);
    if (c->init == PS_TABLE_INIT_UNIFORM) {
        float a = c->init_scale;
        for (size_t i = 0; i < d; i++) {
            uint64_t r = sm(k + (uint64_t)i * GOLDEN);
            out[i] = a * ((float)((int64_t)(r >> 40) - 8388608) * 0x1p-23f);
        }
        return;
    }
    double s = c->init_scale;
    for (size_t i = 0; i < d; i++) {
        uint64_t r1 = sm(k + (uint64_t)(2 * i) * GOLDEN), r2 = sm(k + (uint64_t)(2 * i + 1) * GOLDEN);
        double u1 = (double)((r1 >> 11) + 1) * 0x1p-53, u2 = (double)(r2 >> 11) * 0x1p-53;
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        out[i] = (float)(s * z);
    }
}

int ps_table_state_arrays(int kind)
{
    switch (kind) {
    case PS_OPT_SGD: return 0;
    case PS_OPT_MOMENTUM:
    case PS_OPT_NESTEROV:
    case PS_OPT_ADAGRAD: return 1;
    case PS_OPT_ADAM:
    case PS_TABLE_OPT_FTRL: return 2;
    default: return -1;
    }
}

const char *ps_table_opt_name(int kind)
{
    if (kind == PS_TABLE_OPT_FTRL)
        return "ftrl";
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

void tbl_apply_row(const ps_table *t, const tbl_step *st, char *rec, uint32_t s,
                   const float *g)
{
    const ps_opt_config *c = &t->cfg.opt;
    size_t d = t->cfg.dim;
    float *w = tbl_rec_w(rec), *s0 = w + d, *s1 = w + 2 * d;
    switch (c->kind) {
    case PS_OPT_SGD: ps_opt_sgd(w, g, d, st->lr, c->weight_decay); break;
    case PS_OPT_MOMENTUM:
        ps_opt_momentum(w, s0, g, d, st->lr, c->momentum, c->weight_decay);
        break;
    case PS_OPT_NESTEROV:
        ps_opt_nesterov(w, s0, g, d, st->lr, c->momentum, c->weight_decay);
        break;
    case PS_OPT_ADAGRAD: ps_opt_adagrad(w, s0, g, d, st->lr, c->eps, c->weight_decay); break;
    case PS_OPT_ADAM: {
        /* lazy: the bias correction counts this row's updates; saturating,
         * which changes nothing (1 - b^t is 1.0f in float long before) */
        uint32_t *cnt = tbl_cnt(t, s);
        uint64_t rt = (uint64_t)*cnt + (uint64_t)st->m;
        *cnt = rt > UINT32_MAX ? UINT32_MAX : (uint32_t)rt;
        ps_opt_adam(w, s0, s1, g, d, st->lr, c->beta1, c->beta2, c->eps, c->weight_decay,
                    (int64_t)*cnt);
        break;
    }
    case PS_TABLE_OPT_FTRL:
        ps_table_ftrl(w, s0, s1, g, d, st->lr, t->cfg.ftrl_beta, t->cfg.ftrl_l1, t->cfg.ftrl_l2,
                      c->weight_decay);
        break;
    default: break; /* refused by ps_table_check_config */
    }
}
