/* A table's declaration: defaults, checks, comparison, fingerprint
 * (ps_table_decl.h). */
#include "ps_table_decl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_hash.h"
#include "ps_limits.h"
#include "ps_opt_table.h"

void ps_table_options_default(ps_table_options *o)
{
    memset(o, 0, sizeof *o);
    o->init = PS_TABLE_INIT_UNIFORM;
    o->init_scale = 0.01f;
    ps_opt_default(&o->opt);
    o->opt.kind = PS_OPT_NONE;
    o->ftrl_beta = 1.0f;
}

int ps_table_decl_kind(const ps_table_options *o)
{
    return o->opt.kind == PS_OPT_NONE ? PS_OPT_ADAGRAD : o->opt.kind;
}

int ps_table_decl_params_kind(int kind)
{
    return kind == PS_TABLE_OPT_FTRL               ? PS_OPT_SGD
           : kind == PS_TABLE_OPT_ROWWISE_ADAGRAD ? PS_OPT_ADAGRAD
                                                  : kind;
}

static const char *kind_name(int kind)
{
    return kind == PS_TABLE_OPT_FTRL               ? "ftrl"
           : kind == PS_TABLE_OPT_ROWWISE_ADAGRAD ? "rowwise_adagrad"
                                                  : ps_opt_name(kind);
}

int ps_table_decl_check(uint64_t key, const ps_table_options *o, char *why, size_t why_len)
{
    unsigned long long tk = (unsigned long long)key;
    if (o->dim < 1 || o->dim > PS_MAX_TABLE_DIM) {
        ps_errorf(why, why_len, "table %llu: dim must be in [1, %d], got %u", tk,
            PS_MAX_TABLE_DIM, o->dim);
        return PS_EINVAL;
    }
    if (o->init != PS_TABLE_INIT_ZEROS && o->init != PS_TABLE_INIT_UNIFORM &&
        o->init != PS_TABLE_INIT_NORMAL) {
        ps_errorf(why, why_len, "table %llu: the initializer must be zeros (%d), uniform (%d) "
            "or normal (%d), got %d", tk, PS_TABLE_INIT_ZEROS, PS_TABLE_INIT_UNIFORM,
            PS_TABLE_INIT_NORMAL, o->init);
        return PS_EINVAL;
    }
    if (!(o->init_scale >= 0) || !isfinite(o->init_scale)) {
        ps_errorf(why, why_len, "table %llu: the initializer's scale must be a finite number "
            ">= 0, got %g", tk, (double)o->init_scale);
        return PS_EINVAL;
    }
    int kind = ps_table_decl_kind(o);
    if (kind != PS_TABLE_OPT_FTRL && kind != PS_TABLE_OPT_ROWWISE_ADAGRAD &&
        (kind < PS_OPT_SGD || kind > PS_OPT_KIND_MAX)) {
        ps_errorf(why, why_len, "table %llu: the optimizer must be sgd (%d), momentum, "
            "nesterov, adagrad, adam (%d), ftrl (%d) or rowwise_adagrad (%d), or none (0: "
            "adagrad), got %d", tk, PS_OPT_SGD, PS_OPT_ADAM, PS_TABLE_OPT_FTRL,
            PS_TABLE_OPT_ROWWISE_ADAGRAD, o->opt.kind);
        return PS_EINVAL;
    }
    /* the hyper-parameters the kind uses, each in the range of its flag */
    ps_opt_config c = o->opt;
    c.kind = ps_table_decl_params_kind(kind);
    c.given = 0;
    for (int p = 0; p < PS_OPT_NPARAMS; p++)
        if (ps_opt_uses(c.kind, p))
            c.given |= 1u << p;
    char msg[PS_ERR_TEXT_MAX];
    if (ps_opt_check(&c, 0, msg, sizeof msg) != 0) {
        ps_errorf(why, why_len, "table %llu (%s): %s", tk, kind_name(kind), msg);
        return PS_EINVAL;
    }
    if (kind == PS_TABLE_OPT_FTRL && !(o->opt.lr > 0)) {
        /* alpha divides: lr 0 (which the dense kinds take) is no FTRL */
        ps_errorf(why, why_len, "table %llu (ftrl): lr (FTRL's alpha) must be > 0, got %g", tk,
            (double)o->opt.lr);
        return PS_EINVAL;
    }
    if (kind == PS_TABLE_OPT_FTRL) {
        const char *names[3] = {"ftrl-beta", "ftrl-l1", "ftrl-l2"};
        float v[3] = {o->ftrl_beta, o->ftrl_l1, o->ftrl_l2};
        for (int i = 0; i < 3; i++)
            if (!(v[i] >= 0) || !isfinite(v[i])) {
                ps_errorf(why, why_len, "table %llu (ftrl): %s must be a finite number >= 0, "
                    "got %g", tk, names[i], (double)v[i]);
                return PS_EINVAL;
            }
    }
    if (o->min_count > 255) {
        ps_errorf(why, why_len, "table %llu: the frequency filter's min-count must be in "
            "[0, 255] (0 or 1: no filter), got %u", tk, o->min_count);
        return PS_EINVAL;
    }
    if (o->filter_cells != 0 && o->filter_cells < 64) {
        ps_errorf(why, why_len, "table %llu: the frequency filter needs at least 64 cells "
            "(0: the default), got %u", tk, o->filter_cells);
        return PS_EINVAL;
    }
    if (o->full != PS_TABLE_FULL_EVICT && o->full != PS_TABLE_FULL_REFUSE) {
        ps_errorf(why, why_len, "table %llu: full (what a table at its max-rows does) must be "
            "%d (evict) or %d (refuse), got %u", tk, PS_TABLE_FULL_EVICT, PS_TABLE_FULL_REFUSE,
            o->full);
        return PS_EINVAL;
    }
    return 0;
}

void ps_table_decl_normalize(ps_table_options *o)
{
    ps_table_options d;
    ps_table_options_default(&d);
    int kind = ps_table_decl_kind(o);
    o->opt.kind = kind;
    for (int p = 0; p < PS_OPT_NPARAMS; p++)
        if (!ps_opt_uses(ps_table_decl_params_kind(kind), p))
            ps_opt_set(&o->opt, p, ps_opt_get(&d.opt, p));
    o->opt.given = PS_OPT_GIVEN_ALL;
    if (kind != PS_TABLE_OPT_FTRL) {
        o->ftrl_beta = d.ftrl_beta;
        o->ftrl_l1 = d.ftrl_l1;
        o->ftrl_l2 = d.ftrl_l2;
    }
    if (o->init == PS_TABLE_INIT_ZEROS) /* zeros: the scale means nothing */
        o->init_scale = 0;
    if (o->min_count < 2) { /* no filter: its size means nothing */
        o->min_count = 0;
        o->filter_cells = 0;
    }
    if (!o->max_rows) /* no cap: nothing is ever full */
        o->full = PS_TABLE_FULL_EVICT;
}

/* Each field as a double (what messages print and the comparison sees). */
#define AS_DOUBLE_U32(v) ((double)(v))
#define AS_DOUBLE_I32(v) ((double)(v))
#define AS_DOUBLE_F32(v) ((double)(v))
#define AS_DOUBLE_U64(v) ((double)(v))

int ps_table_decl_compare(uint64_t key, const ps_table_options *a, const char *an,
                          const ps_table_options *b, const char *bn, char *why, size_t why_len)
{
    ps_table_options x = *a, y = *b;
    ps_table_decl_normalize(&x);
    ps_table_decl_normalize(&y);
    unsigned long long tk = (unsigned long long)key;
    if (x.opt.kind != y.opt.kind) {
        ps_errorf(why, why_len, "table %llu: optimizer: %s has %s, %s has %s", tk, an,
            kind_name(x.opt.kind), bn, kind_name(y.opt.kind));
        return PS_EMISMATCH;
    }
#define CMP_FIELD_(f, type, key_, name)                                                     \
    if (memcmp(&x.f, &y.f, sizeof x.f) != 0) {                                              \
        if (sizeof x.f == 8)                                                                \
            ps_errorf(why, why_len, "table %llu: %s: %s has %llu, %s has %llu", tk, name, an, \
                (unsigned long long)x.f, bn, (unsigned long long)y.f);                      \
        else                                                                                \
            ps_errorf(why, why_len, "table %llu: %s: %s has %g, %s has %g", tk, name, an,   \
                AS_DOUBLE_##type(x.f), bn, AS_DOUBLE_##type(y.f));                          \
        return PS_EMISMATCH;                                                                \
    }
    PS_TABLE_DECL_FIELDS(CMP_FIELD_)
#undef CMP_FIELD_
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        double u = ps_opt_get(&x.opt, p), v = ps_opt_get(&y.opt, p);
        if (u != v) {
            ps_errorf(why, why_len, "table %llu: %s: %s has %g, %s has %g", tk,
                ps_opt_param_at(p)->flag + 2, an, u, bn, v);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

uint64_t ps_table_decl_hash(uint64_t h, uint64_t key, const ps_table_options *o)
{
    ps_table_options x = *o;
    ps_table_decl_normalize(&x);
    h = ps_fnv1a_u64le(h, key);
    h = ps_fnv1a_u64le(h, (uint64_t)(uint32_t)x.opt.kind);
#define HASH_FIELD_(f, type, key_, name)                                                    \
    {                                                                                       \
        uint64_t v_ = 0;                                                                    \
        memcpy(&v_, &x.f, sizeof x.f);                                                      \
        h = ps_fnv1a_u64le(h, v_);                                                          \
    }
    PS_TABLE_DECL_FIELDS(HASH_FIELD_)
#undef HASH_FIELD_
    return ps_opt_hash(h, &x.opt);
}

uint64_t ps_table_decl_fingerprint(const void *base, size_t n, size_t stride, size_t key_off,
                                   size_t decl_off)
{
    if (!n)
        return 0;
    const char *b = base;
    uint64_t h = PS_FNV1A_BASIS, last = 0;
    /* in key order: each step the smallest key above the last (n is small) */
    for (size_t done = 0; done < n; done++) {
        size_t pick = n;
        uint64_t best = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t k;
            memcpy(&k, b + i * stride + key_off, sizeof k);
            if ((done == 0 || k > last) && (pick == n || k < best)) {
                best = k;
                pick = i;
            }
        }
        if (pick == n)
            break;
        ps_table_options o;
        memcpy(&o, b + pick * stride + decl_off, sizeof o);
        h = ps_table_decl_hash(h, best, &o);
        last = best;
    }
    return h ? h : 1;
}
