/* The snapshot item stream (ps_snap.h). */
#include "ps_snap.h"

#include <string.h>

#include "ps_error.h"
#include "ps_limits.h"
#include "ps_table_decl.h"

#define MAGIC "PSSNAP1"
#define PUT(p, v) do { __typeof__(v) put_v_ = (v); memcpy((p), &put_v_, sizeof put_v_); \
                       (p) += sizeof put_v_; } while (0)
#define GET(p, v) do { memcpy(&(v), (p), sizeof(v)); (p) += sizeof(v); } while (0)

/* the declaration's bytes: its fields, the kind, the hyper-parameters */
#define DECL_F_(f, type, key, name) +sizeof(((ps_table_options *)0)->f)
#define OPT_F_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) +sizeof(t)
#define HEAD_FIXED (8 + 4 * 4 + 8 * 4 + 4 * 4)
#define HEAD_BYTES                                                                         \
    ((HEAD_FIXED + (0 PS_TABLE_DECL_FIELDS(DECL_F_)) + 4 + (0 PS_OPT_PARAMS(OPT_F_)) +      \
      (PS_TABLE_NAME_MAX + 1) + 7) & ~7)

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

size_t ps_snap_bytes(const ps_snap_item *it)
{
    size_t n = (size_t)it->n, vals = 4 * n * (it->dim + (size_t)it->nstate * it->slen);
    if (it->kind == PS_SNAP_PART)
        return HEAD_BYTES + 8 * n + pad8(4 * n) + pad8(vals);
    return HEAD_BYTES + pad8(vals);
}

static void point(ps_snap_item *it, unsigned char *buf)
{
    unsigned char *p = buf + HEAD_BYTES;
    size_t n = (size_t)it->n, vals = n * it->dim, svals = n * it->slen;
    it->ids = NULL;
    it->counts = NULL;
    if (it->kind == PS_SNAP_PART) {
        it->ids = (uint64_t *)p;
        p += 8 * n;
        it->counts = (uint32_t *)p;
        p += pad8(4 * n);
    }
    it->w = (float *)p;
    for (uint32_t k = 0; k < PS_SNAP_MAX_STATE; k++)
        it->state[k] = k < it->nstate ? it->w + vals + k * svals : NULL;
}

void ps_snap_layout(ps_snap_item *it, unsigned char *buf)
{
    unsigned char *p = buf;
    memset(buf, 0, HEAD_BYTES);
    memcpy(p, MAGIC, 8);
    p += 8;
    PUT(p, (uint32_t)HEAD_BYTES);
    PUT(p, it->kind);
    PUT(p, it->index);
    PUT(p, (uint32_t)it->server);
    PUT(p, it->key);
    PUT(p, it->version);
    PUT(p, it->total);
    PUT(p, it->n);
    PUT(p, it->dim);
    PUT(p, it->nstate);
    PUT(p, it->flags);
    PUT(p, it->slen);
#define PUT_DECL_(f, type, key, name) PUT(p, it->decl.f);
    PS_TABLE_DECL_FIELDS(PUT_DECL_)
#undef PUT_DECL_
    PUT(p, (int32_t)it->decl.opt.kind);
#define PUT_OPT_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) PUT(p, (t)it->decl.opt.f);
    PS_OPT_PARAMS(PUT_OPT_)
#undef PUT_OPT_
    memcpy(p, it->name, strnlen(it->name, PS_TABLE_NAME_MAX)); /* NUL padded: head zeroed */
    point(it, buf);
}

int ps_snap_parse(unsigned char *buf, size_t len, ps_snap_item *it, char *why, size_t why_len)
{
    memset(it, 0, sizeof *it);
    const unsigned char *p = buf;
    uint32_t head, server;
    if (len < HEAD_BYTES || memcmp(p, MAGIC, 8) != 0) {
        ps_errorf(why, why_len, "a snapshot item of %zu bytes without its head", len);
        return PS_EPROTO;
    }
    p += 8;
    GET(p, head);
    GET(p, it->kind);
    GET(p, it->index);
    GET(p, server);
    GET(p, it->key);
    GET(p, it->version);
    GET(p, it->total);
    GET(p, it->n);
    GET(p, it->dim);
    GET(p, it->nstate);
    GET(p, it->flags);
    GET(p, it->slen);
    it->server = (int32_t)server;
#define GET_DECL_(f, type, key, name) GET(p, it->decl.f);
    PS_TABLE_DECL_FIELDS(GET_DECL_)
#undef GET_DECL_
    int32_t kind;
    GET(p, kind);
    it->decl.opt.kind = kind;
#define GET_OPT_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) GET(p, it->decl.opt.f);
    PS_OPT_PARAMS(GET_OPT_)
#undef GET_OPT_
    memcpy(it->name, p, PS_TABLE_NAME_MAX);
    it->name[PS_TABLE_NAME_MAX] = 0;
    it->decl.opt.given = PS_OPT_GIVEN_ALL;
    if (head != HEAD_BYTES || (it->kind != PS_SNAP_CHUNK && it->kind != PS_SNAP_PART) ||
        it->nstate > PS_SNAP_MAX_STATE || it->dim < 1 || it->dim > PS_MAX_TABLE_DIM ||
        (it->kind == PS_SNAP_CHUNK && it->dim != 1) || (it->slen != it->dim && it->slen != 1) ||
        it->n > (1ull << 40)) {
        ps_errorf(why, why_len, "a snapshot item with a bad head (head %u bytes, kind %u, dim "
            "%u, %u state arrays of %u floats a row, n %llu)", head, it->kind, it->dim,
            it->nstate, it->slen, (unsigned long long)it->n);
        return PS_EPROTO;
    }
    if (ps_snap_bytes(it) != len) {
        ps_errorf(why, why_len, "snapshot item of key %llu (%u %u): %zu bytes, its head says %zu",
            (unsigned long long)it->key, it->kind, it->index, len, ps_snap_bytes(it));
        return PS_EPROTO;
    }
    point(it, buf);
    return 0;
}
