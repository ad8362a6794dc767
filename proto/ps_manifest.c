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

void ps_manifest_put_str(ps_strbuf *b, const char *s)
{
    ps_strbuf_add(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            ps_strbuf_addf(b, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            ps_strbuf_addf(b, "\\u%04x", *p);
        else
            ps_strbuf_addf(b, "%c", *p);
    }
    ps_strbuf_add(b, "\"");
}

const char *ps_manifest_kind_name(int kind, int table)
{
    if (table && kind == PS_TABLE_OPT_FTRL)
        return "ftrl";
    if (table && kind == PS_TABLE_OPT_ROWWISE_ADAGRAD)
        return "rowwise_adagrad";
    return ps_opt_name(kind);
}

/* a float as the shortest text that reads back the same float32 */
static void put_float(ps_strbuf *b, const char *name, double v)
{
    ps_strbuf_addf(b, "\"%s\": %.9g", name, v);
}

void ps_manifest_put_opt(ps_strbuf *b, const ps_opt_config *o, int table)
{
    ps_strbuf_addf(b, "\"optimizer\": {\"kind\": \"%s\", \"kind_id\": %d", ps_manifest_kind_name(o->kind, table),
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
