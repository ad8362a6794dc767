/* An export's manifest members (ps_manifest.h). */
#include "ps_manifest.h"

#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_table_decl.h"

void ps_manifest_file(char *out, size_t len, int table, uint64_t key, const char *what)
{
    snprintf(out, len, "%s/%llu.%s.npy", table ? "tables" : "dense", (unsigned long long)key,
             what);
}

static const char *kind_name(int kind, int table)
{
    if (table && kind == PS_TABLE_OPT_FTRL)
        return "ftrl";
    return ps_opt_name(kind);
}

/* a float as the shortest text that reads back the same float32 */
static void put_float(ps_strbuf *b, const char *name, double v)
{
    ps_strbuf_addf(b, "\"%s\": %.9g", name, v);
}

void ps_manifest_put_opt(ps_strbuf *b, const ps_opt_config *o, int table)
{
    ps_strbuf_addf(b, "\"optimizer\": {\"kind\": \"%s\", \"kind_id\": %d", kind_name(o->kind, table),
                   o->kind);
#define PUT_OPT_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help)                      \
    ps_strbuf_add(b, ", ");                                                                  \
    put_float(b, #f, (double)o->f);
    PS_OPT_PARAMS(PUT_OPT_)
#undef PUT_OPT_
    ps_strbuf_add(b, "}");
}

static const char *init_name(int init)
{
    return init == PS_TABLE_INIT_ZEROS ? "zeros" : init == PS_TABLE_INIT_UNIFORM ? "uniform"
                                                                                  : "normal";
}

void ps_manifest_put_decl(ps_strbuf *b, const ps_table_options *d)
{
#define PUT_U32(f) ps_strbuf_addf(b, "\"%s\": %u, ", #f, (unsigned)d->f);
#define PUT_I32(f) ps_strbuf_addf(b, "\"%s\": %d, ", #f, (int)d->f);
#define PUT_U64(f) ps_strbuf_addf(b, "\"%s\": %llu, ", #f, (unsigned long long)d->f);
#define PUT_F32(f) put_float(b, #f, (double)d->f), ps_strbuf_add(b, ", ");
#define PUT_DECL_(f, type, key, name) PUT_##type(f)
    PS_TABLE_DECL_FIELDS(PUT_DECL_)
#undef PUT_DECL_
#undef PUT_U32
#undef PUT_I32
#undef PUT_U64
#undef PUT_F32
    ps_strbuf_addf(b, "\"init_name\": \"%s\", ", init_name(d->init));
    ps_manifest_put_opt(b, &d->opt, 1);
}

static int missing(const char *what, char *why, size_t why_len)
{
    ps_errorf(why, why_len, "the member \"%s\" is missing or not a number", what);
    return PS_EDATA;
}

int ps_manifest_get_decl(const ps_json *t, ps_table_options *d, char *why, size_t why_len)
{
    memset(d, 0, sizeof *d);
    uint64_t u;
    int64_t i;
    double f;
#define GET_U32(fl)                                                                      \
    do {                                                                                 \
        if (ps_json_u64(t, #fl, &u) || u > UINT32_MAX)                                   \
            return missing(#fl, why, why_len);                                           \
        d->fl = (uint32_t)u;                                                             \
    } while (0);
#define GET_I32(fl)                                                                      \
    do {                                                                                 \
        if (ps_json_i64(t, #fl, &i) || i < INT32_MIN || i > INT32_MAX)                   \
            return missing(#fl, why, why_len);                                           \
        d->fl = (int)i;                                                                  \
    } while (0);
#define GET_U64(fl)                                                                      \
    do {                                                                                 \
        if (ps_json_u64(t, #fl, &u))                                                     \
            return missing(#fl, why, why_len);                                           \
        d->fl = u;                                                                       \
    } while (0);
#define GET_F32(fl)                                                                      \
    do {                                                                                 \
        if (ps_json_f64(t, #fl, &f))                                                     \
            return missing(#fl, why, why_len);                                           \
        d->fl = (float)f;                                                                \
    } while (0);
#define GET_DECL_(fl, type, key, name) GET_##type(fl)
    PS_TABLE_DECL_FIELDS(GET_DECL_)
#undef GET_DECL_
    const ps_json *o = ps_json_get(t, "optimizer");
    if (!o || ps_json_i64(o, "kind_id", &i))
        return missing("optimizer.kind_id", why, why_len);
    d->opt.kind = (int)i;
#define GET_OPT_(fl, ty, key, flag, def, lo, lob, hi, hib, used, zu, help)                    \
    if (ps_json_f64(o, #fl, &f))                                                             \
        return missing("optimizer." #fl, why, why_len);                                      \
    d->opt.fl = (ty)f;
    PS_OPT_PARAMS(GET_OPT_)
#undef GET_OPT_
#undef GET_U32
#undef GET_I32
#undef GET_U64
#undef GET_F32
    d->opt.given = PS_OPT_GIVEN_ALL;
    return 0;
}
