#include "ps_opt_table.h"

#include <math.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_hash.h"

static const ps_opt_param params[PS_OPT_NPARAMS] = {
#define ROW_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help)                         \
    {#f, key, flag, sizeof(t) == sizeof(uint32_t) && (t)0.5 == 0, def, lo, hi, lob, hib, used, \
     zu, help},
    PS_OPT_PARAMS(ROW_)
#undef ROW_
};

const ps_opt_param *ps_opt_param_at(int p)
{
    return p >= 0 && p < PS_OPT_NPARAMS ? &params[p] : NULL;
}

/* by kind; 6 (the tables' FTRL) is no dense kind */
static const char *const kind_names[PS_OPT_KIND_LAST + 1] = {
    [PS_OPT_NONE] = "none",         [PS_OPT_SGD] = "sgd",         [PS_OPT_MOMENTUM] = "momentum",
    [PS_OPT_NESTEROV] = "nesterov", [PS_OPT_ADAGRAD] = "adagrad", [PS_OPT_ADAM] = "adam",
    [PS_OPT_AVERAGE] = "average",   [PS_OPT_ADD] = "add",         [PS_OPT_ADAMW] = "adamw"};

int ps_opt_kind_valid(int kind)
{
    return kind >= PS_OPT_SGD && kind <= PS_OPT_KIND_LAST && kind_names[kind];
}

const char *ps_opt_name(int kind)
{
    return kind == PS_OPT_NONE || ps_opt_kind_valid(kind) ? kind_names[kind] : "unknown";
}

int ps_opt_parse(const char *s, int *kind)
{
    for (int i = PS_OPT_SGD; s && i <= PS_OPT_KIND_LAST; i++)
        if (kind_names[i] && strcmp(s, kind_names[i]) == 0) {
            *kind = i;
            return 0;
        }
    return PS_EINVAL;
}

double ps_opt_get(const ps_opt_config *c, int p)
{
    switch (p) {
#define GET_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help)                         \
    case PS_OPT_P_##f:                                                                      \
        return (double)c->f;
        PS_OPT_PARAMS(GET_)
#undef GET_
    default:
        return 0;
    }
}

void ps_opt_set(ps_opt_config *c, int p, double v)
{
    switch (p) {
#define SET_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help)                         \
    case PS_OPT_P_##f:                                                                      \
        c->f = (t)v;                                                                        \
        break;
        PS_OPT_PARAMS(SET_)
#undef SET_
    default:
        break;
    }
}

void ps_opt_default(ps_opt_config *c)
{
    memset(c, 0, sizeof *c);
    c->kind = PS_OPT_SGD;
    for (int p = 0; p < PS_OPT_NPARAMS; p++)
        ps_opt_set(c, p, params[p].def);
    c->given = PS_OPT_GIVEN_ALL;
}

int ps_opt_is_given(const ps_opt_config *c, int p)
{
    return (c->given >> p & 1u) || (params[p].zero_unset && ps_opt_get(c, p) != 0);
}

int ps_opt_uses(int kind, int p)
{
    return kind == PS_OPT_NONE || (params[p].used >> kind & 1u);
}

static int in_range(const ps_opt_param *r, double v)
{
    if (v != v)
        return 0;
    if (r->lo_open ? !(v > r->lo) : !(v >= r->lo))
        return 0;
    if (r->hi_open ? !(v < r->hi) : !(v <= r->hi))
        return 0;
    return !r->is_int || v == floor(v);
}

static void range_text(const ps_opt_param *r, char *buf, size_t len)
{
    snprintf(buf, len, r->is_int ? "%s%.0f, %.0f%s" : "%s%g, %g%s", r->lo_open ? "(" : "[",
             r->lo, r->hi, r->hi_open ? ")" : "]");
}

int ps_opt_check(const ps_opt_config *c, int allow_none, char *why, size_t why_len)
{
    if (!ps_opt_kind_valid(c->kind) && !(allow_none && c->kind == PS_OPT_NONE)) {
        ps_errorf(why, why_len, "optimizer must be sgd, momentum, nesterov, adagrad, adam, "
            "adamw, average or add, got %d", c->kind);
        return PS_EINVAL;
    }
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        double v = ps_opt_get(c, p);
        if (!ps_opt_is_given(c, p) || in_range(&params[p], v))
            continue;
        char range[64];
        range_text(&params[p], range, sizeof range);
        ps_errorf(why, why_len, "%s must be in %s, got %g", params[p].flag + 2, range, v);
        return PS_EINVAL;
    }
    return 0;
}

int ps_opt_compare(const ps_opt_config *a, const char *an, const ps_opt_config *b,
                   const char *bn, char *why, size_t why_len)
{
    if (a->kind != PS_OPT_NONE && b->kind != PS_OPT_NONE && a->kind != b->kind) {
        ps_errorf(why, why_len, "optimizer: %s has %s, %s has %s", an, ps_opt_name(a->kind), bn,
            ps_opt_name(b->kind));
        return PS_EMISMATCH;
    }
    int kind = a->kind != PS_OPT_NONE ? a->kind : b->kind;
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        if (!ps_opt_uses(kind, p) || !ps_opt_is_given(a, p) || !ps_opt_is_given(b, p))
            continue;
        double x = ps_opt_get(a, p), y = ps_opt_get(b, p);
        if (x != y) {
            ps_errorf(why, why_len, "%s: %s has %g, %s has %g", params[p].flag + 2, an, x, bn, y);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

static const char *const flag_names[] = {
    "--optimizer",
#define FLAG_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) flag,
    PS_OPT_PARAMS(FLAG_)
#undef FLAG_
    NULL};

const char *const *ps_opt_flag_names(void) { return flag_names; }

int ps_opt_flag(const char *prog, const char *flag, const char *val, ps_opt_config *c,
                int *handled, char *why, size_t why_len)
{
    *handled = 0;
    if (strcmp(flag, "--optimizer") == 0) {
        *handled = 1;
        if (ps_opt_parse(val, &c->kind) != 0) {
            ps_errorf(why, why_len, "%s: --optimizer must be one of sgd, momentum, nesterov, "
                "adagrad, adam, adamw, average, add, got '%s'", prog, val ? val : "");
            return PS_EINVAL;
        }
        return 0;
    }
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        const ps_opt_param *r = &params[p];
        if (strcmp(flag, r->flag) != 0)
            continue;
        *handled = 1;
        double v = 0;
        int rc;
        if (r->is_int) {
            long long iv = 0;
            rc = ps_parse_int(prog, flag, val, (long long)r->lo, (long long)r->hi, &iv, why,
                              why_len);
            v = (double)iv;
        } else {
            rc = ps_parse_float(prog, flag, val, r->lo, r->hi, &v, why, why_len);
            /* a value that rounds to an open bound as a float is refused too */
            if (!rc && !in_range(r, (double)(float)v))
                rc = PS_EINVAL;
        }
        if (rc) {
            char range[64];
            range_text(r, range, sizeof range);
            ps_errorf(why, why_len, "%s: %s must be a %s in %s, got '%s'", prog, flag,
                r->is_int ? "whole number" : "number", range, val ? val : "");
            return PS_EINVAL;
        }
        ps_opt_set(c, p, v);
        c->given |= 1u << p;
        return 0;
    }
    return 0;
}

void ps_opt_usage(FILE *f, int indent)
{
    fprintf(f, "%*s%-22s %s\n", indent, "", "--optimizer NAME",
            "sgd, momentum, nesterov, adagrad, adam or adamw (default sgd); average");
    fprintf(f, "%*s%-22s %s\n", indent, "", "",
            "(sync) or add: the workers step their own optimizers (docs/TORCH.md)");
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        const ps_opt_param *r = &params[p];
        char head[48], range[64], tail[128];
        snprintf(head, sizeof head, "%s %s", r->flag, r->is_int ? "N" : "X");
        range_text(r, range, sizeof range);
        snprintf(tail, sizeof tail, "in %s (default %g)", range, r->def);
        /* one line when it fits in 80 columns, else the range goes below */
        if (indent + 23 + strlen(r->help) + 2 + strlen(tail) <= 80)
            fprintf(f, "%*s%-22s %s, %s\n", indent, "", head, r->help, tail);
        else
            fprintf(f, "%*s%-22s %s,\n%*s%s\n", indent, "", head, r->help, indent + 23, "", tail);
    }
}

void ps_opt_describe(const ps_opt_config *c, char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "%s (", ps_opt_name(c->kind));
    const char *sep = "";
    for (int p = 0; p < PS_OPT_NPARAMS && off < len; p++) {
        if (!ps_opt_uses(c->kind, p))
            continue;
        off += (size_t)snprintf(buf + off, len - off, "%s%s %g", sep, params[p].flag + 2,
                                ps_opt_get(c, p));
        sep = ", ";
    }
    if (!*sep) /* it uses none: the name alone */
        snprintf(buf, len, "%s", ps_opt_name(c->kind));
    else if (off < len)
        snprintf(buf + off, len - off, ")");
}

uint64_t ps_opt_hash(uint64_t h, const ps_opt_config *c)
{
    int32_t kind = c->kind;
    h = ps_fnv1a(h, &kind, sizeof kind);
#define HASH_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) \
    h = ps_fnv1a(h, &c->f, sizeof c->f);
    PS_OPT_PARAMS(HASH_)
#undef HASH_
    return h;
}
