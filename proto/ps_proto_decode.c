/* The wire format's other side: decoding a received header frame
 * (ps_proto_decode).  Untrusted bytes: the msgpack is walked before it is
 * unpacked (no absurd container counts), every field is checked for type,
 * range and repetition, the keys a type's row of the message table requires
 * must be there, and a refused header still yields what its error reply
 * echoes (q, r, k, c, s, t).  Encoding is ps_proto.c. */
#include "ps_proto.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_opt_table.h"

/* One msgpack element at *pos: its header and, for a scalar, its bytes are
 * consumed; *items is how many elements it contains (an array's count, a
 * map's twice its count; 0 for a scalar).  -1 when it is cut short or its
 * declared count could not fit in the bytes that remain.  Never allocates. */
static int elem(const uint8_t *p, size_t len, size_t *pos, uint64_t *items)
{
    if (*pos >= len)
        return -1;
    uint8_t b = p[(*pos)++];
    size_t rem = len - *pos;
    uint64_t n = 0, skip = 0;
    int container = 0; /* 1 array, 2 map */
#define NEED(k) do { if (rem < (k)) return -1; } while (0)
#define BE(k) ({ uint64_t v_ = 0; for (int i_ = 0; i_ < (k); i_++) v_ = v_ << 8 | p[*pos + i_]; *pos += (k); rem -= (k); v_; })
    *items = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return 0;
    if ((b & 0xe0) == 0xa0)
        skip = b & 0x1f;
    else if ((b & 0xf0) == 0x90)
        container = 1, n = b & 0x0f;
    else if ((b & 0xf0) == 0x80)
        container = 2, n = b & 0x0f;
    else
        switch (b) {
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: case 0xca: skip = 4; break;
        case 0xcf: case 0xd3: case 0xcb: skip = 8; break;
        case 0xd4: skip = 2; break;
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xd9: case 0xc4: NEED(1); skip = BE(1); break;
        case 0xda: case 0xc5: NEED(2); skip = BE(2); break;
        case 0xdb: case 0xc6: NEED(4); skip = BE(4); break;
        case 0xc7: NEED(1); skip = BE(1) + 1; break;
        case 0xc8: NEED(2); skip = BE(2) + 1; break;
        case 0xc9: NEED(4); skip = BE(4) + 1; break;
        case 0xdc: NEED(2); container = 1; n = BE(2); break;
        case 0xdd: NEED(4); container = 1; n = BE(4); break;
        case 0xde: NEED(2); container = 2; n = BE(2); break;
        case 0xdf: NEED(4); container = 2; n = BE(4); break;
        default: return -1; /* 0xc1 is never used */
        }
#undef NEED
#undef BE
    if (!container) {
        if (skip > rem)
            return -1;
        *pos += skip;
        return 0;
    }
    if (container == 2)
        n *= 2;
    if (n > rem) /* every element takes at least one byte */
        return -1;
    *items = n;
    return 0;
}

/* Walk one msgpack value without allocating, checking that every container's
 * declared element count could fit in the bytes that remain and that nesting
 * stays shallow (depth 0: the value itself).  msgpack-c allocates a
 * container's slots as soon as it reads the count, so an absurd count in a
 * tiny frame must be refused before it. */
static int scan(const uint8_t *p, size_t len, size_t *pos, int depth)
{
    uint64_t n;
    if (depth > 4 || elem(p, len, pos, &n) < 0)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        if (scan(p, len, pos, depth + 1) < 0)
            return -1;
    return 0;
}

/* Past one msgpack value however deep it nests (no recursion: the elements
 * still to walk are counted); -1 when it is not well-formed. */
static int skip_value(const uint8_t *p, size_t len, size_t *pos)
{
    for (uint64_t pending = 1; pending > 0; pending--) {
        uint64_t n;
        if (elem(p, len, pos, &n) < 0 || n > len - *pos)
            return -1;
        pending += n;
    }
    return 0;
}

/* A header too deep for scan may still be a well-formed map: then flat gets
 * a copy of it (at most len bytes) whose values that nest too deep are nil,
 * so its version and the fields an error reply echoes can be read, and
 * *deep the first such value's key (a string key, else "?").  0 when so, -1
 * when the bytes are no well-formed map. */
static int flatten(const uint8_t *p, size_t len, uint8_t *flat, size_t *flat_len, char *deep,
                   size_t deep_len)
{
    size_t pos = 0, out = 0;
    uint64_t n;
    snprintf(deep, deep_len, "?");
    if (!len || !((p[0] & 0xf0) == 0x80 || p[0] == 0xde || p[0] == 0xdf) ||
        elem(p, len, &pos, &n) < 0)
        return -1;
    memcpy(flat, p, pos);
    out = pos;
    int found = 0;
    for (uint64_t i = 0; i < n; i += 2) {
        size_t k = pos;
        if (scan(p, len, &pos, 1) < 0) /* a key nesting deep: no header of ours */
            return -1;
        memcpy(flat + out, p + k, pos - k); /* the key, as it is */
        out += pos - k;
        size_t v = pos, t = pos;
        if (skip_value(p, len, &pos) < 0)
            return -1;
        if (scan(p, len, &t, 1) == 0) { /* shallow enough: as it is */
            memcpy(flat + out, p + v, pos - v);
            out += pos - v;
            continue;
        }
        flat[out++] = 0xc0;
        if (!found++ && ((p[k] & 0xe0) == 0xa0))
            snprintf(deep, deep_len, "%.*s", (int)(p[k] & 0x1f), (const char *)p + k + 1);
    }
    if (pos != len || !found)
        return -1;
    *flat_len = out;
    return 0;
}

static int get_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    *v = o->via.u64;
    return 0;
}

static int get_i64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return -1;
        *v = (int64_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return 0;
    }
    return -1;
}

/* A number as a float32: 0, -1 when it is no number, -2 when it is not
 * zero but becomes ±0 as a float32 (a double below 1.4e-45): the protocol's
 * numbers are float32, and such a value would decode as a given ±0 whose own
 * encoding (an exact ±0) means something else ("not given", "+0"). */
static int get_f32(const msgpack_object *o, float *v)
{
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        *v = (float)o->via.f64;
        return *v == 0 && o->via.f64 != 0 ? -2 : 0;
    }
    int64_t i;
    if (get_i64(o, &i) == 0) {
        *v = (float)i;
        return 0;
    }
    return -1;
}

static int key_is(const msgpack_object *k, const char *s)
{
    size_t n = strlen(s);
    return k->via.str.size == n && memcmp(k->via.str.ptr, s, n) == 0;
}

/* Range-checked field readers: on failure name the field. */
static int field_u(const msgpack_object *o, const char *name, uint64_t lo, uint64_t hi,
                   uint64_t *out, char *why, size_t why_len)
{
    uint64_t v;
    if (get_u64(o, &v) < 0 || v < lo || v > hi) {
        ps_errorf(why, why_len, "field '%s' must be an unsigned integer in [%llu, %llu]", name,
            (unsigned long long)lo, (unsigned long long)hi);
        return PS_EPROTO;
    }
    *out = v;
    return 0;
}

static int field_i(const msgpack_object *o, const char *name, int64_t lo, int64_t hi,
                   int64_t *out, char *why, size_t why_len)
{
    int64_t v;
    if (get_i64(o, &v) < 0 || v < lo || v > hi) {
        ps_errorf(why, why_len, "field '%s' must be an integer in [%lld, %lld]", name,
            (long long)lo, (long long)hi);
        return PS_EPROTO;
    }
    *out = v;
    return 0;
}

#define FIELD_U(obj, name, dst, lo, hi)                                           \
    do {                                                                          \
        uint64_t v_;                                                              \
        if (field_u(obj, name, lo, hi, &v_, why, why_len))                        \
            return PS_EPROTO;                                                     \
        (dst) = v_;                                                               \
    } while (0)
#define FIELD_I(obj, name, dst, lo, hi)                                           \
    do {                                                                          \
        int64_t v_;                                                               \
        if (field_i(obj, name, lo, hi, &v_, why, why_len))                        \
            return PS_EPROTO;                                                     \
        (dst) = v_;                                                               \
    } while (0)
#define FIELD_F(obj, name, dst)                                                   \
    do {                                                                          \
        float v_;                                                                 \
        int r_ = get_f32(obj, &v_);                                               \
        if (r_ == -2) {                                                           \
            ps_errorf(why, why_len, "field '%s' is %g, which a float32 cannot "   \
                "hold (it would be 0)", name, (obj)->via.f64);                    \
            return PS_EPROTO;                                                     \
        }                                                                         \
        if (r_ < 0 || v_ != v_) {                                                 \
            ps_errorf(why, why_len, "field '%s' must be a number", name);          \
            return PS_EPROTO;                                                     \
        }                                                                         \
        (dst) = v_;                                                               \
    } while (0)

/* A string field that must fit (with its terminator) in cap bytes and hold
 * no NUL. */
static int field_str(const msgpack_object *o, const char *name, char *out, size_t cap, char *why,
                     size_t why_len)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap ||
        memchr(o->via.str.ptr, 0, o->via.str.size)) {
        ps_errorf(why, why_len, "field '%s' must be a string of at most %zu bytes", name, cap - 1);
        return PS_EPROTO;
    }
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = 0;
    return 0;
}

/* A text for people ends at its first NUL, if it has one (what the encoder
 * then sends). */
static size_t text_len(const char *p, size_t n)
{
    const char *z = memchr(p, 0, n);
    return z ? (size_t)(z - p) : n;
}

/* Index of k in names[0..n), or -1 (not a string, or a key this side does
 * not know). */
static int key_index(const msgpack_object *k, const char *const *names, int n)
{
    if (k->type != MSGPACK_OBJECT_STR)
        return -1;
    for (int i = 0; i < n; i++)
        if (key_is(k, names[i]))
            return i;
    return -1;
}

/* A known key may come once: which of two values would count is not for the
 * receiver to guess (a checker and a user of the header could pick
 * differently), so a second one is refused. */
static int once(uint64_t *seen, int i, const char *where, const char *name, char *why,
                size_t why_len)
{
    if (*seen & (1ull << i)) {
        ps_errorf(why, why_len, "key '%s' appears twice in %s", name, where);
        return PS_EPROTO;
    }
    *seen |= 1ull << i;
    return 0;
}

/* Hyper-parameter p of an optimizer map (the hello's `h`, a table's `tb`)
 * into c, checked as its type; name (with the map's prefix) in messages. */
static int decode_opt_param(const msgpack_object *v, const char *prefix, int p,
                            ps_opt_config *c, int *given, char *why, size_t why_len)
{
    const ps_opt_param *r = ps_opt_param_at(p);
    char name[16];
    snprintf(name, sizeof name, "%s.%s", prefix, r->key);
    if (r->is_int) {
        uint64_t u;
        FIELD_U(v, name, u, 0, (uint64_t)r->hi);
        ps_opt_set(c, p, (double)u);
        *given = !r->zero_unset || u != 0;
        return 0;
    }
    float f;
    FIELD_F(v, name, f);
    ps_opt_set(c, p, f);
    /* an older peer's 0 (either sign) in a "zero means not given" row is not
     * given; a value that would only become 0 as a float32 (-4.7e-303) was
     * refused above */
    *given = !r->zero_unset || f != 0;
    if (!*given) /* not given: left at +0, as if absent */
        ps_opt_set(c, p, 0);
    return 0;
}

/* Index of the hyper-parameter whose key k is, or -1. */
static int opt_param_index(const msgpack_object *k)
{
    for (int j = 0; k->type == MSGPACK_OBJECT_STR && j < PS_OPT_NPARAMS; j++)
        if (key_is(k, ps_opt_param_at(j)->key))
            return j;
    return -1;
}

static const char *const hello_keys[] = {"sr", "fp", "opt", "tok", "sa", "sk", "sz", "sm", "sw",
                                         "th", "tfp"};
enum { HK_N = sizeof hello_keys / sizeof hello_keys[0] };

/* Index of k among the agreed settings' keys (ps_hello_agreed), or -1. */
static int agreed_index(const msgpack_object *k)
{
    for (int j = 0; k->type == MSGPACK_OBJECT_STR && j < ps_hello_nagreed(); j++)
        if (key_is(k, ps_hello_agreed(j)->hello))
            return j;
    return -1;
}

static int decode_hello(const msgpack_object *m, ps_hello *o, char *why, size_t why_len)
{
    if (m->type != MSGPACK_OBJECT_MAP) {
        ps_errorf(why, why_len, "field 'h' must be a map");
        return PS_EPROTO;
    }
    uint64_t seen = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        int ki = key_index(k, hello_keys, HK_N), ai = ki < 0 ? agreed_index(k) : -1;
        int p = ki < 0 && ai < 0 ? opt_param_index(k) : -1;
        if (ki < 0 && ai < 0 && p < 0)
            continue; /* a newer peer's field, or a non-string key: ignored */
        int bit = ki >= 0 ? ki : ai >= 0 ? HK_N + ai : HK_N + ps_hello_nagreed() + p;
        const char *key = ki >= 0 ? hello_keys[ki]
                          : ai >= 0 ? ps_hello_agreed(ai)->hello
                                    : ps_opt_param_at(p)->key;
        if (once(&seen, bit, "'h'", key, why, why_len))
            return PS_EPROTO;
        if (ai >= 0) { /* an agreed setting: the table's range */
            char name[16];
            long long lo, hi;
            int64_t x;
            snprintf(name, sizeof name, "h.%s", key);
            ps_setting_range(ps_hello_agreed(ai), &lo, &hi);
            FIELD_I(v, name, x, lo, hi);
            ps_hello_set(o, ai, x);
            continue;
        }
        switch (ki) {
        case 0: FIELD_I(v, "h.sr", o->server_rank, -1, PS_MAX_RANK); continue;
        case 1: FIELD_U(v, "h.fp", o->model_fp, 0, UINT64_MAX); continue;
        case 2:
            FIELD_I(v, "h.opt", o->opt.kind, 0, PS_OPT_KIND_LAST);
            if (o->opt.kind != PS_OPT_NONE && !ps_opt_kind_valid(o->opt.kind)) {
                ps_errorf(why, why_len, "field 'h.opt' is %d, no optimizer", o->opt.kind);
                return PS_EPROTO;
            }
            continue;
        case 3: FIELD_U(v, "h.tok", o->token, 0, UINT64_MAX); continue;
        /* the same-host data plane */
        case 4:
            if (field_str(v, "h.sa", o->shm_name, sizeof o->shm_name, why, why_len))
                return PS_EPROTO;
            continue;
        case 5: FIELD_U(v, "h.sk", o->shm_nonce, 0, UINT64_MAX); continue;
        case 6: FIELD_U(v, "h.sz", o->shm_size, 0, UINT64_MAX); continue;
        case 7: FIELD_I(v, "h.sm", o->shm, 0, 1); continue;
        case 8: {
            /* a reason for people: cut to fit rather than refused */
            if (v->type != MSGPACK_OBJECT_STR) {
                ps_errorf(why, why_len, "field 'h.sw' must be a string");
                return PS_EPROTO;
            }
            size_t n = v->via.str.size < sizeof o->shm_why ? v->via.str.size
                                                            : sizeof o->shm_why - 1;
            n = text_len(v->via.str.ptr, n);
            memcpy(o->shm_why, v->via.str.ptr, n);
            o->shm_why[n] = 0;
            continue;
        }
        case 9: FIELD_U(v, "h.th", o->threads, 1, PS_SERVER_MAX_THREADS); continue;
        case 10: FIELD_U(v, "h.tfp", o->tables_fp, 0, UINT64_MAX); continue;
        default: break;
        }
        int given;
        if (decode_opt_param(v, "h", p, &o->opt, &given, why, why_len))
            return PS_EPROTO;
        if (given)
            o->opt.given |= 1u << p;
    }
    if (o->mode == 0 || o->num_workers == 0 || o->num_servers == 0) {
        ps_errorf(why, why_len, "hello needs mode, nw and ns");
        return PS_EPROTO;
    }
    /* a hyper-parameter out of the range its flag takes: what the command
     * line refuses is no value to compare against */
    char bad[160];
    if (ps_opt_check(&o->opt, 1, bad, sizeof bad)) {
        ps_errorf(why, why_len, "field 'h': %s", bad);
        return PS_EPROTO;
    }
    /* a worker's arena is its name, nonce and size together */
    uint64_t arena = seen >> 4 & 7u; /* sa, sk, sz: hello_keys[4..6] */
    if ((arena && arena != 7u) || (arena && !o->shm_name[0])) {
        ps_errorf(why, why_len, "fields 'h.sa' (a non-empty name), 'h.sk' and 'h.sz' come "
            "together or not at all");
        return PS_EPROTO;
    }
    return 0;
}

/* `tb`: a table's declaration, each field range-checked as its type (the
 * server checks the values: ps_table_decl_check). */
static int decode_decl(const msgpack_object *m, ps_table_options *o, char *why, size_t why_len)
{
    if (m->type != MSGPACK_OBJECT_MAP) {
        ps_errorf(why, why_len, "field 'tb' must be a map");
        return PS_EPROTO;
    }
    static const char *const keys[] = {
#define DECL_KEY_(f, type, key, name) key,
        PS_TABLE_DECL_FIELDS(DECL_KEY_)
#undef DECL_KEY_
        "opt"};
    enum { NK = sizeof keys / sizeof keys[0] };
    uint64_t seen = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        int ki = key_index(k, keys, NK), p = ki < 0 ? opt_param_index(k) : -1;
        if (ki < 0 && p < 0)
            continue; /* a newer peer's field: ignored */
        if (once(&seen, ki >= 0 ? ki : NK + p, "'tb'", ki >= 0 ? keys[ki] : ps_opt_param_at(p)->key,
                 why, why_len))
            return PS_EPROTO;
        if (p >= 0) {
            int given; /* a declaration's optimizer is complete: every value counts */
            if (decode_opt_param(v, "tb", p, &o->opt, &given, why, why_len))
                return PS_EPROTO;
            continue;
        }
        char name[16];
        snprintf(name, sizeof name, "tb.%s", keys[ki]);
        int idx = 0;
#define DECL_GET_U32(f) FIELD_U(v, name, o->f, 0, UINT32_MAX)
#define DECL_GET_U64(f) FIELD_U(v, name, o->f, 0, UINT64_MAX)
#define DECL_GET_I32(f) FIELD_I(v, name, o->f, INT32_MIN, INT32_MAX)
#define DECL_GET_F32(f) FIELD_F(v, name, o->f)
#define DECL_GET_(f, type, key, nm)                                                         \
        if (ki == idx++) {                                                                  \
            DECL_GET_##type(f);                                                             \
            continue;                                                                       \
        }
        PS_TABLE_DECL_FIELDS(DECL_GET_)
#undef DECL_GET_
        FIELD_I(v, name, o->opt.kind, 0, PS_TABLE_OPT_ROWWISE_ADAGRAD); /* "opt" */
    }
    o->opt.given = PS_OPT_GIVEN_ALL;
    if (!(seen & 1u)) {
        ps_errorf(why, why_len, "field 'tb' has no 'dim'");
        return PS_EPROTO;
    }
    return 0;
}

static int decode_stats(const msgpack_object *m, ps_stats *s, char *why, size_t why_len)
{
    if (m->type != MSGPACK_OBJECT_MAP) {
        ps_errorf(why, why_len, "field 'st' must be a map");
        return PS_EPROTO;
    }
    struct { const char *name; uint64_t *dst; } u[] = {
#define COUNTER_(f, key) {key, &s->f},
        PS_STATS_COUNTERS(COUNTER_)
#undef COUNTER_
    };
    const int nu = (int)(sizeof u / sizeof u[0]);
    uint64_t seen = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        int j = 0;
        while (j < nu && !key_is(k, u[j].name))
            j++;
        int bit = j < nu ? j : key_is(k, "vmin") ? nu : key_is(k, "vmax") ? nu + 1 : -1;
        if (bit < 0)
            continue;
        if (once(&seen, bit, "'st'", j < nu ? u[j].name : bit == nu ? "vmin" : "vmax", why,
                 why_len))
            return PS_EPROTO;
        if (j < nu)
            FIELD_U(v, u[j].name, *u[j].dst, 0, UINT64_MAX);
        else if (bit == nu)
            FIELD_I(v, "vmin", s->min_version, INT64_MIN, INT64_MAX);
        else
            FIELD_I(v, "vmax", s->max_version, INT64_MIN, INT64_MAX);
    }
    return 0;
}

/* `bw`: {id, n, r: [ranks]}; ranks past PS_BARRIER_RANKS_MAX are ignored. */
static int decode_barrier(const msgpack_object *m, ps_barrier_info *b, char *why, size_t why_len)
{
    if (m->type != MSGPACK_OBJECT_MAP) {
        ps_errorf(why, why_len, "field 'bw' must be a map");
        return PS_EPROTO;
    }
    int have_id = 0;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        if (key_is(k, "id")) {
            FIELD_I(v, "bw.id", b->id, 0, INT64_MAX / 2);
            have_id = 1;
        } else if (key_is(k, "n")) {
            FIELD_U(v, "bw.n", b->missing, 0, PS_MAX_RANK + 1);
        } else if (key_is(k, "r")) {
            if (v->type != MSGPACK_OBJECT_ARRAY) {
                ps_errorf(why, why_len, "field 'bw.r' must be an array");
                return PS_EPROTO;
            }
            uint32_t n = v->via.array.size;
            b->nranks = n < PS_BARRIER_RANKS_MAX ? n : PS_BARRIER_RANKS_MAX;
            for (uint32_t j = 0; j < b->nranks; j++)
                FIELD_I(&v->via.array.ptr[j], "bw.r", b->ranks[j], 0, PS_MAX_RANK);
        }
    }
    if (!have_id) {
        ps_errorf(why, why_len, "field 'bw' has no 'id'");
        return PS_EPROTO;
    }
    return 0;
}

static const char *const hdr_keys[] = {
#define HDR_KEY_(name, key) key,
    PS_HDR_KEYS(HDR_KEY_)
#undef HDR_KEY_
};

/* What an error reply echoes, read from the first occurrence of each key
 * before anything is checked: a request refused for one field is still
 * answered to its q (a client drops a reply whose q is not one of its
 * requests, and would wait for its timeout instead of seeing the error). */
static void recover_echo(const msgpack_object *root, ps_header *h)
{
    uint64_t seen = 0;
    int64_t s = 0;
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object *v = &root->via.map.ptr[i].val;
        int ki = key_index(&root->via.map.ptr[i].key, hdr_keys, PS_HK_COUNT);
        if (ki < 0 || (seen & (1ull << ki)))
            continue;
        seen |= 1ull << ki;
        uint64_t u;
        int64_t x;
        if (ki == PS_HK_Q && get_u64(v, &u) == 0) {
            h->seq = u;
        } else if (ki == PS_HK_Q && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            h->seq = (uint64_t)v->via.i64;
            h->seq_negative = 1;
        } else if (ki == PS_HK_R && get_i64(v, &x) == 0 && x >= -1 && x <= PS_MAX_RANK) {
            h->rank = (int32_t)x;
        } else if (ki == PS_HK_K && get_u64(v, &u) == 0) {
            h->key = u;
        } else if (ki == PS_HK_C && get_u64(v, &u) == 0 && u < PS_MAX_CHUNK) {
            h->chunk = (uint32_t)u;
        } else if (ki == PS_HK_S && get_i64(v, &x) == 0 && x >= -1 && x <= INT64_MAX / 2) {
            s = x;
        } else if (ki == PS_HK_T && get_u64(v, &u) == 0 && u >= 1 && u <= PS_MSG_TYPE_MAX) {
            h->type = (uint32_t)u;
        }
    }
    ps_header_set_s(h, s); /* as a request's: only requests are answered */
}

/* One known header field, checked into h. */
static int decode_field(int ki, const msgpack_object *v, ps_header *h, char *why, size_t why_len)
{
    switch (ki) {
    case PS_HK_T: FIELD_U(v, "t", h->type, 1, PS_MSG_TYPE_MAX); break;
    case PS_HK_F: FIELD_U(v, "f", h->flags, 0, PS_FLAG_MASK); break;
    case PS_HK_Q: FIELD_U(v, "q", h->seq, 0, UINT64_MAX); break;
    case PS_HK_R: FIELD_I(v, "r", h->rank, -1, PS_MAX_RANK); break;
    case PS_HK_K: FIELD_U(v, "k", h->key, 0, UINT64_MAX); break;
    case PS_HK_C: FIELD_U(v, "c", h->chunk, 0, PS_MAX_CHUNK - 1); break;
    case PS_HK_N: FIELD_U(v, "n", h->count, 0, PS_MAX_PAYLOAD_BYTES); break;
    case PS_HK_D: FIELD_U(v, "d", h->dtype, 0, PS_DTYPE_MAX); break;
    case PS_HK_TOT: FIELD_U(v, "tot", h->total, 0, UINT64_MAX / 8); break;
    case PS_HK_O: FIELD_U(v, "o", h->shm_off, 0, UINT64_MAX / 8); break;
    case PS_HK_M: FIELD_U(v, "m", h->npush, 1, 1u << 30); break;
    case PS_HK_P: FIELD_U(v, "p", h->shm_dst, 0, UINT64_MAX / 8); break;
    case PS_HK_DIM: FIELD_U(v, "dim", h->dim, 1, PS_MAX_TABLE_DIM); break;
    case PS_HK_NP: FIELD_U(v, "np", h->npull, 0, PS_MAX_SPARSE_IDS); break;
    case PS_HK_TB: return decode_decl(v, &h->table, why, why_len);
    case PS_HK_EP: FIELD_U(v, "ep", h->epoch, 0, UINT64_MAX); break;
    case PS_HK_MB: FIELD_I(v, "mb", h->member, 0, 2); break;
    case PS_HK_RS: FIELD_U(v, "rs", h->stream_pos, 0, UINT64_MAX); break;
    case PS_HK_SL: FIELD_I(v, "sl", h->slot, 0, PS_MAX_SERVERS - 1); break;
    case PS_HK_HS: FIELD_I(v, "hs", h->home, 0, PS_MAX_SERVERS - 1); break;
    case PS_HK_TO: {
        int ok = v->type == MSGPACK_OBJECT_STR && v->via.str.size > 0 &&
                 v->via.str.size < PS_ENDPOINT_MAX;
        for (uint32_t j = 0; ok && j < v->via.str.size; j++)
            ok = v->via.str.ptr[j] > 0x20 && v->via.str.ptr[j] < 0x7f;
        if (!ok) {
            ps_errorf(why, why_len, "field 'to' must be an endpoint: 1 to %d printable "
                "characters without spaces", PS_ENDPOINT_MAX - 1);
            return PS_EPROTO;
        }
        memcpy(h->owner_ep, v->via.str.ptr, v->via.str.size);
        h->owner_ep[v->via.str.size] = 0;
        break;
    }
    case PS_HK_EC: FIELD_I(v, "ec", h->err_code, 0, 1000); break;
    case PS_HK_ET: {
        if (v->type != MSGPACK_OBJECT_STR) {
            ps_errorf(why, why_len, "field 'et' must be a string");
            return PS_EPROTO;
        }
        size_t n = v->via.str.size < PS_ERR_TEXT_MAX ? v->via.str.size : PS_ERR_TEXT_MAX;
        n = text_len(v->via.str.ptr, n);
        memcpy(h->err_text, v->via.str.ptr, n);
        h->err_text[n] = 0;
        break;
    }
    case PS_HK_NM: {
        int ok = v->type == MSGPACK_OBJECT_STR && v->via.str.size <= PS_TABLE_NAME_MAX;
        for (uint32_t j = 0; ok && j < v->via.str.size; j++)
            ok = v->via.str.ptr[j] >= 0x20 && v->via.str.ptr[j] < 0x7f;
        if (!ok) {
            ps_errorf(why, why_len, "field 'nm' must be a string of at most %d printable "
                "characters", PS_TABLE_NAME_MAX);
            return PS_EPROTO;
        }
        memcpy(h->table_name, v->via.str.ptr, v->via.str.size);
        h->table_name[v->via.str.size] = 0;
        break;
    }
    case PS_HK_ADM: {
        int ok = v->type == MSGPACK_OBJECT_STR && v->via.str.size <= PS_ADMIN_TOKEN_MAX;
        for (uint32_t j = 0; ok && j < v->via.str.size; j++)
            ok = v->via.str.ptr[j] > 0x20 && v->via.str.ptr[j] < 0x7f;
        if (!ok) {
            ps_errorf(why, why_len, "field 'adm' must be a string of at most %d printable "
                "characters", PS_ADMIN_TOKEN_MAX);
            return PS_EPROTO;
        }
        memcpy(h->admin, v->via.str.ptr, v->via.str.size);
        h->admin[v->via.str.size] = 0;
        break;
    }
    case PS_HK_H: return decode_hello(v, &h->hello, why, why_len);
    case PS_HK_ST: return decode_stats(v, &h->stats, why, why_len);
    case PS_HK_BW: return decode_barrier(v, &h->barrier, why, why_len);
    default: break; /* v: checked first; s: by decode_fields */
    }
    return 0;
}

/* A key of another kind of message (the header table of docs/PROTOCOL.md
 * says where each applies) is ignored, as an unknown key is, once it passed
 * its checks: the header then holds exactly what its encoding says, and
 * every receiver reads the same message. */
static void drop_inapplicable(ps_header *d)
{
    int reply = (d->flags & PS_FLAG_REPLY) != 0, shm = (d->flags & PS_FLAG_SHM) != 0;
    if (!shm)
        d->shm_off = 0;
    if (!shm || reply || d->type != PS_MSG_PUSHPULL)
        d->shm_dst = 0;
    /* "m": 0 and 1 both mean one gradient */
    if (d->npush == 1 || (d->type != PS_MSG_PUSH && d->type != PS_MSG_PUSHPULL &&
                          d->type != PS_MSG_SPUSH && d->type != PS_MSG_SPUSHPULL))
        d->npush = 0;
    if (d->type != PS_MSG_ERROR) {
        d->err_code = 0;
        memset(d->err_text, 0, sizeof d->err_text);
    }
    if (d->type != PS_MSG_HELLO && d->type != PS_MSG_HYPER &&
        ((d->type != PS_MSG_REPL_HELLO && d->type != PS_MSG_REPL_JOIN) || reply))
        /* HYPER: its optimizer in h; REPL_HELLO, REPL_JOIN: the sender's config */
        memset(&d->hello, 0, sizeof d->hello);
    else if (!reply) { /* the server's answer to an arena, its update threads */
        d->hello.shm = 0;
        memset(d->hello.shm_why, 0, sizeof d->hello.shm_why);
        d->hello.threads = 0;
    }
    if (d->type != PS_MSG_STATS || !reply) {
        memset(&d->stats, 0, sizeof d->stats);
        memset(&d->barrier, 0, sizeof d->barrier);
        d->barrier.id = -1;
    }
    if (ps_msg_info_of(d->type)->from != PS_FROM_ADMIN || reply) /* SHUTDOWN, SERVERS */
        memset(d->admin, 0, sizeof d->admin);
    /* tables: a row width on sparse messages, the pull's count on a
     * pushpull's request, a declaration on a TABLE request */
    if (!ps_msg_is_sparse(d->type))
        d->dim = 0;
    if (d->type != PS_MSG_SPUSHPULL || reply)
        d->npull = 0;
    if (d->type != PS_MSG_TABLE || reply) {
        memset(&d->table, 0, sizeof d->table);
        memset(d->table_name, 0, sizeof d->table_name);
    }
    if ((d->type != PS_MSG_REPL_SNAP && d->type != PS_MSG_REPL_HELLO) || reply)
        d->stream_pos = 0;
    if (!d->epoch) /* a member is named with an epoch only */
        d->member = 0;
    /* moved objects: the new place in a PS_EMOVED error, a home with AWAY */
    if ((d->type != PS_MSG_ERROR || d->err_code != PS_EMOVED) && !ps_msg_names_slot(d->type)) {
        d->slot = -1;
        memset(d->owner_ep, 0, sizeof d->owner_ep);
    }
    if (!(d->flags & PS_FLAG_AWAY))
        d->home = -1;
}

/* The checked header of a map with v = 1, into d (ps_header_init'ed). */
static int decode_fields(const msgpack_object *root, ps_header *d, char *why, size_t why_len)
{
    uint64_t seen = 0;
    int64_t s = 0; /* its field depends on t and f, which may come later */
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object *k = &root->via.map.ptr[i].key, *v = &root->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR) {
            ps_errorf(why, why_len, "header keys must be strings");
            return PS_EPROTO;
        }
        int ki = key_index(k, hdr_keys, PS_HK_COUNT), rc;
        if (ki < 0)
            continue; /* a newer peer's optional field, ignored */
        if ((rc = once(&seen, ki, "the header", hdr_keys[ki], why, why_len)))
            return rc;
        if (ki == PS_HK_S)
            FIELD_I(v, "s", s, -1, INT64_MAX / 2);
        else if ((rc = decode_field(ki, v, d, why, why_len)))
            return rc;
    }
    if (!(seen & PS_HK(T))) {
        ps_errorf(why, why_len, "header has no message type field 't'");
        return PS_EPROTO;
    }
    if (d->dtype && d->count * ps_dtype_size(d->dtype) > PS_MAX_PAYLOAD_BYTES) {
        ps_errorf(why, why_len, "count %llu elements is more than the %llu-byte payload limit",
            (unsigned long long)d->count, (unsigned long long)PS_MAX_PAYLOAD_BYTES);
        return PS_ETOOBIG;
    }
    /* what the type's row requires: a push without its step, say, would
     * otherwise be taken as step 0 */
    const ps_msg_info *m = ps_msg_info_of(d->type);
    int reply = (d->flags & PS_FLAG_REPLY) != 0;
    uint64_t missing = (reply ? m->rep_keys : m->req_keys) & ~seen;
    if (missing) {
        int ki = __builtin_ctzll(missing);
        char what[64] = "";
        if (ki == PS_HK_S)
            snprintf(what, sizeof what, " (%s)", ps_s_meaning_doc(reply ? m->s_rep : m->s_req));
        ps_errorf(why, why_len, "%s %s without field '%s'%s", m->name, reply ? "reply" : "request",
            hdr_keys[ki], what);
        return PS_EPROTO;
    }
    if ((d->flags & PS_FLAG_AWAY) && !(seen & PS_HK(HS))) {
        ps_errorf(why, why_len, "%s %s with flag AWAY (%#x) without field 'hs' (the partition's "
            "home server)", m->name, reply ? "reply" : "request", PS_FLAG_AWAY);
        return PS_EPROTO;
    }
    ps_header_set_s(d, s);
    drop_inapplicable(d);
    return 0;
}

/* The version of header map root, checked (PS_EPROTO without an unsigned
 * `v`, PS_EVERSION for another), with what an error reply echoes recovered
 * into h; h->version is set once the header is answerable. */
static int decode_version(const msgpack_object *root, ps_header *h, char *why, size_t why_len)
{
    int have_v = 0;
    uint64_t version = 0;
    if (root->type != MSGPACK_OBJECT_MAP) {
        ps_errorf(why, why_len, "header must be a msgpack map");
        return PS_EPROTO;
    }
    /* version first, so a peer of another version gets the right error */
    for (uint32_t i = 0; i < root->via.map.size && !have_v; i++) {
        const msgpack_object *k = &root->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && key_is(k, "v")) {
            if (get_u64(&root->via.map.ptr[i].val, &version) < 0) {
                ps_errorf(why, why_len, "field 'v' must be an unsigned integer");
                return PS_EPROTO;
            }
            have_v = 1;
        }
    }
    if (!have_v) {
        ps_errorf(why, why_len, "header has no protocol version field 'v'");
        return PS_EPROTO;
    }
    recover_echo(root, h);
    if (version != PS_PROTO_VERSION) {
        ps_errorf(why, why_len, "protocol version %llu, this side speaks %d",
            (unsigned long long)version, PS_PROTO_VERSION);
        return PS_EVERSION;
    }
    h->version = PS_PROTO_VERSION; /* answerable from here on */
    return 0;
}

static int decode_map(const msgpack_object *root, ps_header *h, char *why, size_t why_len)
{
    int rc = decode_version(root, h, why, why_len);
    if (rc)
        return rc;
    ps_header d;
    ps_header_init(&d, 0);
    rc = decode_fields(root, &d, why, why_len);
    if (rc)
        return rc; /* h keeps what recover_echo found */
    *h = d;
    return 0;
}

int ps_proto_decode(const void *buf, size_t len, ps_header *h, char *why, size_t why_len)
{
    ps_header_init(h, 0);
    h->version = 0;
    if (len == 0) {
        ps_errorf(why, why_len, "empty header frame");
        return PS_EPROTO;
    }
    if (len > PS_HEADER_MAX) {
        ps_errorf(why, why_len, "header frame of %zu bytes is over the %d-byte limit", len,
            PS_HEADER_MAX);
        return PS_ETOOBIG;
    }
    size_t pos = 0;
    uint8_t flat[PS_HEADER_MAX];
    size_t flat_len = 0;
    char deep[40];
    int too_deep = 0;
    if (scan(buf, len, &pos, 0) < 0 || pos != len) {
        /* a map nesting too deep is still answered, naming the field */
        if (flatten(buf, len, flat, &flat_len, deep, sizeof deep) < 0) {
            ps_errorf(why, why_len, "header is not one well-formed msgpack value (%zu bytes)",
                len);
            return PS_EPROTO;
        }
        too_deep = 1;
        buf = flat;
        len = flat_len;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
        ps_errorf(why, why_len, "header is not valid msgpack");
        rc = PS_EPROTO;
    } else if (too_deep) {
        rc = decode_version(&u.data, h, why, why_len);
        if (!rc) {
            ps_errorf(why, why_len, "field '%s' nests deeper than the header's 4 levels", deep);
            rc = PS_EPROTO;
        }
    } else {
        rc = decode_map(&u.data, h, why, why_len);
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}
