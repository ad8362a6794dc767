/* The wire format's one side: the message table's queries (ps_msg_info_of,
 * names, payload layouts), the header's fields (ps_header_init, what `s`
 * means by type), the counters' sum, and encoding a header into msgpack
 * (ps_proto_encode).  Decoding and validating a received header is
 * ps_proto_decode.c; the two share only ps_proto.h. */
#include "ps_proto.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "ps_opt_table.h"

/* ---------- the message table ---------- */

int ps_msg_names_slot(uint32_t type)
{
    return type == PS_MSG_SERVERS || type == PS_MSG_MOVEPLAN || type == PS_MSG_MOVE;
}

uint64_t ps_msg_bytes_limit(uint32_t type)
{
    /* objects that move between servers go whole, not in pages */
    return ps_msg_names_slot(type) || type == PS_MSG_OBJECTS ? PS_MAX_PAYLOAD_BYTES
                                                              : PS_SNAP_PAGE_BYTES;
}

/* s is needed where it means something */
#define S_KEY_(m) (PS_S_##m == PS_S_NONE ? 0u : PS_HK(S))
static const ps_msg_info msg_info[PS_MSG_TYPE_MAX + 1] = {
#define MSG_ROW_(NAME, t, name, from, rq_keys, rp_keys, rq_pl, rp_pl, shm, s_rq, s_rp, handler, \
                 rq_doc, rp_doc)                                                             \
    [t] = {t, name, PS_FROM_##from, (rq_keys) | S_KEY_(s_rq), (rp_keys) | S_KEY_(s_rp), rq_pl,   \
           rp_pl, shm, PS_S_##s_rq, PS_S_##s_rp, rq_doc, rp_doc},
    PS_MSG_TABLE(MSG_ROW_)
#undef MSG_ROW_
};
#undef S_KEY_

const ps_msg_info *ps_msg_info_of(uint32_t type)
{
    /* a row left out of the middle of the table has type 0 */
    return type >= 1 && type <= PS_MSG_TYPE_MAX && msg_info[type].type == type ? &msg_info[type]
                                                                               : NULL;
}

const char *ps_msg_type_name(uint32_t type)
{
    const ps_msg_info *m = ps_msg_info_of(type);
    return m ? m->name : "unknown";
}

const char *ps_msg_names(char *out, size_t cap, int (*want)(const ps_msg_info *m))
{
    int n = 0, k = 0;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++)
        n += ps_msg_info_of(t) && want(&msg_info[t]);
    size_t off = 0;
    out[0] = 0;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX && off < cap; t++)
        if (ps_msg_info_of(t) && want(&msg_info[t])) {
            k++;
            off += (size_t)snprintf(out + off, cap - off, "%s%s",
                                    k == 1 ? "" : k == n ? " and " : ", ", msg_info[t].name);
        }
    return out;
}

const char *ps_s_meaning_doc(int meaning)
{
    switch (meaning) {
    case PS_S_PUSH_STEP: return "the step of the gradient";
    case PS_S_WANT_VERSION: return "the lowest version the reply may carry";
    case PS_S_CHUNK_VERSION: return "the version of the chunk or partition";
    case PS_S_BARRIER_ID: return "the barrier's id";
    case PS_S_OPT_STEP: return "the optimizer's step count";
    case PS_S_MEMBERS: return "the membership's version";
    default: return "nothing";
    }
}

const char *ps_mode_name(int mode)
{
    return mode == PS_MODE_SYNC ? "sync" : mode == PS_MODE_ASYNC ? "async" : "unknown";
}

int ps_mode_parse(const char *s, int *mode)
{
    if (s && strcmp(s, "sync") == 0)
        *mode = PS_MODE_SYNC;
    else if (s && strcmp(s, "async") == 0)
        *mode = PS_MODE_ASYNC;
    else
        return PS_EINVAL;
    return 0;
}

int ps_msg_request_layout(uint32_t type)
{
    const ps_msg_info *m = ps_msg_info_of(type);
    return m ? m->req_payload : PS_PL_NONE;
}

int ps_msg_reply_layout(uint32_t type)
{
    const ps_msg_info *m = ps_msg_info_of(type);
    return m ? m->rep_payload : PS_PL_NONE;
}

int ps_msg_request_has_payload(uint32_t type)
{
    return ps_msg_request_layout(type) == PS_PL_VALUES;
}

int ps_msg_reply_has_payload(uint32_t type) { return ps_msg_reply_layout(type) == PS_PL_VALUES; }

int ps_msg_is_sparse(uint32_t type)
{
    return type == PS_MSG_SPULL || type == PS_MSG_SPUSH || type == PS_MSG_SPUSHPULL ||
           type == PS_MSG_SASSIGN;
}

void ps_header_init(ps_header *h, uint32_t type)
{
    memset(h, 0, sizeof *h);
    h->version = PS_PROTO_VERSION;
    h->type = type;
    h->rank = -1;
    h->barrier.id = -1;
    h->slot = -1;
    h->home = -1;
}

/* Where in a ps_header the field of `s` is for a message of this type and
 * direction; 0: `s` means nothing there. */
static size_t s_offset(uint32_t type, int reply)
{
    const ps_msg_info *m = ps_msg_info_of(type);
    switch (!m ? PS_S_NONE : reply ? m->s_rep : m->s_req) {
    case PS_S_PUSH_STEP: return offsetof(ps_header, push_step);
    case PS_S_WANT_VERSION: return offsetof(ps_header, want_version);
    case PS_S_CHUNK_VERSION: return offsetof(ps_header, chunk_version);
    case PS_S_BARRIER_ID: return offsetof(ps_header, barrier_id);
    case PS_S_OPT_STEP: return offsetof(ps_header, opt_step);
    case PS_S_MEMBERS: return offsetof(ps_header, members_version);
    default: return 0;
    }
}

int64_t ps_header_get_s(const ps_header *h)
{
    size_t off = s_offset(h->type, (h->flags & PS_FLAG_REPLY) != 0);
    int64_t v = 0;
    if (off)
        memcpy(&v, (const char *)h + off, sizeof v);
    return v;
}

void ps_header_set_s(ps_header *h, int64_t s)
{
    size_t off = s_offset(h->type, (h->flags & PS_FLAG_REPLY) != 0);
    if (off)
        memcpy((char *)h + off, &s, sizeof s);
}

void ps_stats_add(ps_stats *acc, int *have_versions, const ps_stats *p)
{
#define ADD_COUNTER_(f, key) acc->f += p->f;
    PS_STATS_COUNTERS(ADD_COUNTER_)
#undef ADD_COUNTER_
    if (p->chunks || p->partitions) {
        if (!*have_versions || p->min_version < acc->min_version)
            acc->min_version = p->min_version;
        if (!*have_versions || p->max_version > acc->max_version)
            acc->max_version = p->max_version;
        *have_versions = 1;
    }
}

/* ---------- encode ---------- */

typedef struct wbuf {
    char *p;
    size_t len, cap;
    int overflow;
} wbuf;

static int wbuf_write(void *data, const char *buf, size_t len)
{
    wbuf *w = data;
    if (w->overflow || len > w->cap - w->len) {
        w->overflow = 1;
        return -1;
    }
    memcpy(w->p + w->len, buf, len);
    w->len += len;
    return 0;
}

static void pk_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}
static void pk_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
    pk_key(pk, k);
    msgpack_pack_uint64(pk, v);
}
static void pk_i64(msgpack_packer *pk, const char *k, int64_t v)
{
    pk_key(pk, k);
    msgpack_pack_int64(pk, v);
}
static void pk_str(msgpack_packer *pk, const char *k, const char *v)
{
    size_t n = strlen(v);
    pk_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, v, n);
}
static void pk_f32(msgpack_packer *pk, const char *k, float v)
{
    pk_key(pk, k);
    msgpack_pack_float(pk, v);
}

/* The map `tb` of a TABLE request: every field of the declaration. */
static void pk_decl(msgpack_packer *pk, const ps_table_options *o)
{
#define DECL_ONE_(f, type, key, name) +1
    pk_key(pk, "tb");
    msgpack_pack_map(pk, 1 + PS_OPT_NPARAMS + (0 PS_TABLE_DECL_FIELDS(DECL_ONE_)));
#undef DECL_ONE_
#define PK_DECL_U32(key, v) pk_u64(pk, key, v)
#define PK_DECL_U64(key, v) pk_u64(pk, key, v)
#define PK_DECL_I32(key, v) pk_i64(pk, key, v)
#define PK_DECL_F32(key, v) pk_f32(pk, key, v)
#define DECL_PK_(f, type, key, name) PK_DECL_##type(key, o->f);
    PS_TABLE_DECL_FIELDS(DECL_PK_)
#undef DECL_PK_
    pk_i64(pk, "opt", o->opt.kind);
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        const ps_opt_param *r = ps_opt_param_at(p);
        if (r->is_int)
            pk_u64(pk, r->key, (uint64_t)ps_opt_get(&o->opt, p));
        else
            pk_f32(pk, r->key, (float)ps_opt_get(&o->opt, p));
    }
}

int ps_proto_encode(const ps_header *h, void *buf, size_t cap, size_t *len)
{
    wbuf w = {buf, 0, cap, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, wbuf_write);
    int is_hello = h->type == PS_MSG_HELLO || h->type == PS_MSG_HYPER ||
                   ((h->type == PS_MSG_REPL_HELLO || h->type == PS_MSG_REPL_JOIN) &&
                    !(h->flags & PS_FLAG_REPLY)); /* they carry `h` */
    /* replicas: the group's epoch, and a member: when set, and always where
     * the type needs them (a replhello reply of epoch 0 still says `ep`) */
    const ps_msg_info *mi = ps_msg_info_of(h->type);
    uint32_t need = mi ? ((h->flags & PS_FLAG_REPLY) ? mi->rep_keys : mi->req_keys) : 0;
    int is_ep = h->epoch != 0 || (need & (PS_HK(EP) | PS_HK(MB))) != 0;
    int is_rs = (h->type == PS_MSG_REPL_SNAP || h->type == PS_MSG_REPL_HELLO) &&
                !(h->flags & PS_FLAG_REPLY);
    int is_stats = h->type == PS_MSG_STATS && (h->flags & PS_FLAG_REPLY);
    int is_error = h->type == PS_MSG_ERROR;
    int has_bw = is_stats && h->barrier.id >= 0;
    int is_shm = (h->flags & PS_FLAG_SHM) != 0;
    int is_sum = h->npush > 1;
    int is_dst = is_shm && h->type == PS_MSG_PUSHPULL && !(h->flags & PS_FLAG_REPLY);
    int is_sparse = ps_msg_is_sparse(h->type) && h->dim; /* (a push's ack has none) */
    int is_np = h->type == PS_MSG_SPUSHPULL && !(h->flags & PS_FLAG_REPLY);
    int is_decl = h->type == PS_MSG_TABLE && !(h->flags & PS_FLAG_REPLY);
    int is_name = is_decl && h->table_name[0];
    size_t alen = ps_msg_info_of(h->type) && ps_msg_info_of(h->type)->from == PS_FROM_ADMIN &&
                          !(h->flags & PS_FLAG_REPLY)
                      ? strnlen(h->admin, PS_ADMIN_TOKEN_MAX)
                      : 0;
    /* moved objects: where one is now, and a partition's home */
    int is_moved = (h->type == PS_MSG_ERROR && h->err_code == PS_EMOVED) ||
                   ps_msg_names_slot(h->type);
    int is_sl = is_moved && h->slot >= 0;
    size_t tolen = is_moved ? strnlen(h->owner_ep, PS_ENDPOINT_MAX - 1) : 0;
    int is_hs = (h->flags & PS_FLAG_AWAY) != 0;
    size_t n = (size_t)is_sl + (tolen > 0) + (size_t)is_hs + 11 + (size_t)is_hello + (size_t)is_stats + 2 * (size_t)is_error + (alen > 0) +
               (size_t)has_bw + (size_t)is_shm + (size_t)is_sum + (size_t)is_dst +
               (size_t)is_sparse + (size_t)is_np + (size_t)is_decl + (size_t)is_name +
               2 * (size_t)is_ep + (size_t)is_rs;
    msgpack_pack_map(&pk, n);
    pk_u64(&pk, "v", h->version);
    pk_u64(&pk, "t", h->type);
    pk_u64(&pk, "f", h->flags);
    if (h->seq_negative) /* echo a refused negative q as the client sent it */
        pk_i64(&pk, "q", (int64_t)h->seq);
    else
        pk_u64(&pk, "q", h->seq);
    pk_i64(&pk, "r", h->rank);
    pk_u64(&pk, "k", h->key);
    pk_u64(&pk, "c", h->chunk);
    pk_i64(&pk, "s", ps_header_get_s(h));
    pk_u64(&pk, "n", h->count);
    pk_u64(&pk, "d", h->dtype);
    pk_u64(&pk, "tot", h->total);
    if (is_shm) /* the payload's place in the worker's arena */
        pk_u64(&pk, "o", h->shm_off);
    if (is_sum) /* a sum of that many gradients */
        pk_u64(&pk, "m", h->npush);
    if (is_dst) /* a pushpull's destination in the arena */
        pk_u64(&pk, "p", h->shm_dst);
    if (is_sparse) /* a table's rows */
        pk_u64(&pk, "dim", h->dim);
    if (is_np) /* the ids a sparse pushpull pulls */
        pk_u64(&pk, "np", h->npull);
    if (is_decl)
        pk_decl(&pk, &h->table);
    if (is_name) {
        size_t nl = strnlen(h->table_name, PS_TABLE_NAME_MAX);
        pk_key(&pk, "nm");
        msgpack_pack_str(&pk, nl);
        msgpack_pack_str_body(&pk, h->table_name, nl);
    }
    if (is_ep) {
        pk_u64(&pk, "ep", h->epoch);
        pk_i64(&pk, "mb", h->member);
    }
    if (is_rs)
        pk_u64(&pk, "rs", h->stream_pos);
    if (is_sl)
        pk_i64(&pk, "sl", h->slot);
    if (tolen) {
        pk_key(&pk, "to");
        msgpack_pack_str(&pk, tolen);
        msgpack_pack_str_body(&pk, h->owner_ep, tolen);
    }
    if (is_hs)
        pk_i64(&pk, "hs", h->home);
    if (is_error) {
        pk_i64(&pk, "ec", h->err_code);
        size_t tl = strnlen(h->err_text, PS_ERR_TEXT_MAX);
        pk_key(&pk, "et");
        msgpack_pack_str(&pk, tl);
        msgpack_pack_str_body(&pk, h->err_text, tl);
    }
    if (alen) {
        pk_key(&pk, "adm");
        msgpack_pack_str(&pk, alen);
        msgpack_pack_str_body(&pk, h->admin, alen);
    }
    if (is_hello) {
        const ps_hello *o = &h->hello;
        pk_key(&pk, "h");
        /* a hyper-parameter the sender does not give is left out (not compared) */
        int nopt = 0;
        for (int p = 0; p < PS_OPT_NPARAMS; p++)
            nopt += ps_opt_is_given(&o->opt, p);
        /* the same-host data plane: the worker's arena; the server's answer */
        int reply = (h->flags & PS_FLAG_REPLY) != 0;
        size_t nshm = (o->shm_name[0] ? 3 : 0) + (reply ? 1 + (o->shm_why[0] != 0) : 0);
        size_t nth = reply && o->threads; /* the partitions of each table */
        /* the settings servers and workers agree on, under their table keys;
         * one not given is left out (absent "dt": float32) */
        size_t nagreed = 0;
        for (int i = 0; i < ps_hello_nagreed(); i++)
            nagreed += (size_t)ps_hello_sends(o, i);
        msgpack_pack_map(&pk, 3 + nagreed + (size_t)nopt + (o->token != 0) + nshm + nth +
                                  (o->tables_fp != 0));
        for (int i = 0; i < ps_hello_nagreed(); i++)
            if (ps_hello_sends(o, i))
                pk_i64(&pk, ps_hello_agreed(i)->hello, ps_hello_get(o, i));
        pk_i64(&pk, "sr", o->server_rank);
        pk_u64(&pk, "fp", o->model_fp);
        pk_i64(&pk, "opt", o->opt.kind);
        if (o->token)
            pk_u64(&pk, "tok", o->token);
        for (int p = 0; p < PS_OPT_NPARAMS; p++) {
            if (!ps_opt_is_given(&o->opt, p))
                continue;
            const ps_opt_param *r = ps_opt_param_at(p);
            if (r->is_int)
                pk_u64(&pk, r->key, (uint64_t)ps_opt_get(&o->opt, p));
            else
                pk_f32(&pk, r->key, (float)ps_opt_get(&o->opt, p));
        }
        if (o->shm_name[0]) {
            pk_str(&pk, "sa", o->shm_name);
            pk_u64(&pk, "sk", o->shm_nonce);
            pk_u64(&pk, "sz", o->shm_size);
        }
        if (reply) {
            pk_i64(&pk, "sm", o->shm);
            if (o->shm_why[0])
                pk_str(&pk, "sw", o->shm_why);
        }
        if (nth)
            pk_u64(&pk, "th", o->threads);
        if (o->tables_fp)
            pk_u64(&pk, "tfp", o->tables_fp);
    }
    if (is_stats) {
        const ps_stats *s = &h->stats;
        pk_key(&pk, "st");
#define N_COUNTER_(f, key) +1
        msgpack_pack_map(&pk, 2 PS_STATS_COUNTERS(N_COUNTER_));
#undef N_COUNTER_
#define PK_COUNTER_(f, key) pk_u64(&pk, key, s->f);
        PS_STATS_COUNTERS(PK_COUNTER_)
#undef PK_COUNTER_
        pk_i64(&pk, "vmin", s->min_version);
        pk_i64(&pk, "vmax", s->max_version);
    }
    if (has_bw) {
        const ps_barrier_info *b = &h->barrier;
        uint32_t nr = b->nranks < PS_BARRIER_RANKS_MAX ? b->nranks : PS_BARRIER_RANKS_MAX;
        pk_key(&pk, "bw");
        msgpack_pack_map(&pk, 3);
        pk_i64(&pk, "id", b->id);
        pk_u64(&pk, "n", b->missing);
        pk_key(&pk, "r");
        msgpack_pack_array(&pk, nr);
        for (uint32_t k = 0; k < nr; k++)
            msgpack_pack_int32(&pk, b->ranks[k]);
    }
    if (w.overflow)
        return PS_ETOOBIG;
    *len = w.len;
    return 0;
}
