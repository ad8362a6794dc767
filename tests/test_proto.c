/* Wire format: every message type round-trips field for field, and decode
 * refuses anything that is not exactly a valid header. */
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_proto.h"
#include "ps_test.h"

static int rt(const ps_header *in, ps_header *out)
{
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    int rc = ps_proto_encode(in, buf, sizeof buf, &len);
    if (rc)
        return rc;
    char why[256];
    return ps_proto_decode(buf, len, out, why, sizeof why);
}

/* a header with every common field set to a distinctive value */
static void full(ps_header *h, uint32_t type, uint32_t flags)
{
    ps_header_init(h, type);
    h->flags = flags;
    h->seq = 0xfedcba9876543210ull;
    h->rank = 65535;
    h->key = UINT64_MAX - 5;
    h->chunk = PS_MAX_CHUNK - 1;
    ps_header_set_s(h, ((int64_t)1 << 62) - 1); /* into the field the type has for it */
    h->count = 123456789;
    h->dtype = PS_DTYPE_F32;
    h->total = 987654321012ull;
    if (ps_msg_is_sparse(type)) { /* a table's: the width of its rows */
        h->dim = PS_MAX_TABLE_DIM;
        h->npull = type == PS_MSG_SPUSHPULL && !(flags & PS_FLAG_REPLY) ? PS_MAX_SPARSE_IDS : 0;
    }
    if (type == PS_MSG_TABLE && !(flags & PS_FLAG_REPLY))
        h->table.dim = 3;
    if (type >= PS_MSG_REPL_HELLO) { /* the group's epoch and a member */
        h->epoch = 0xabcdef0123ull;
        h->member = 2;
        h->stream_pos = type == PS_MSG_REPL_SNAP && !(flags & PS_FLAG_REPLY) ? 1ull << 50 : 0;
    }
}

static int same_common(const ps_header *a, const ps_header *b)
{
    return a->version == b->version && a->type == b->type && a->flags == b->flags &&
           a->seq == b->seq && a->rank == b->rank && a->key == b->key && a->chunk == b->chunk &&
           a->push_step == b->push_step && a->want_version == b->want_version &&
           a->chunk_version == b->chunk_version && a->barrier_id == b->barrier_id &&
           a->opt_step == b->opt_step &&
           a->count == b->count && a->dtype == b->dtype &&
           a->total == b->total && a->dim == b->dim && a->npull == b->npull &&
           a->table.dim == b->table.dim && a->epoch == b->epoch && a->member == b->member &&
           a->stream_pos == b->stream_pos;
}

PS_TEST(every_plain_type_request_and_reply_round_trips)
{
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        if (t == PS_MSG_HELLO || t == PS_MSG_HYPER || t == PS_MSG_ERROR)
            continue;
        for (uint32_t f = 0; f <= PS_FLAG_REPLY; f++) {
            /* a primary's hello and a replacement's join carry its config */
            if (!f && (t == PS_MSG_REPL_HELLO || t == PS_MSG_REPL_JOIN))
                continue;
            ps_header a, b;
            full(&a, t, f);
            CHECK_OK(rt(&a, &b));
            CHECK_MSG(same_common(&a, &b), "type %u flags %u differs after round trip", t, f);
        }
    }
    /* negative and zero edge values */
    ps_header a, b;
    ps_header_init(&a, PS_MSG_PULL);
    a.want_version = -1;
    a.rank = -1;
    CHECK_OK(rt(&a, &b));
    CHECK(same_common(&a, &b));
    CHECK_EQ_INT(b.want_version, -1);
    CHECK_EQ_INT(b.rank, -1);
}

PS_TEST(a_hello_round_trips_with_every_config_field)
{
    ps_header a, b;
    for (uint32_t f = 0; f <= PS_FLAG_REPLY; f++) {
        full(&a, PS_MSG_HELLO, f);
        a.hello.mode = PS_MODE_ASYNC;
        a.hello.max_staleness = 17;
        a.hello.num_workers = 65536;
        a.hello.num_servers = 3;
        a.hello.server_rank = 2;
        a.hello.model_fp = 0x0123456789abcdefull;
        a.hello.opt.kind = PS_OPT_ADAM;
        a.hello.opt.given = PS_OPT_GIVEN_ALL; /* every field on the wire */
        a.hello.opt.lr = 0.125f;
        a.hello.opt.momentum = 0.9f;
        a.hello.opt.beta1 = 0.8f;
        a.hello.opt.beta2 = 0.999f;
        a.hello.opt.eps = 1e-8f;
        a.hello.opt.weight_decay = 5e-4f;
        a.hello.opt.lr_decay = 0.5f;
        a.hello.opt.lr_decay_every = 7;
        a.hello.wire_dtype = PS_DTYPE_BF16;
        CHECK_OK(rt(&a, &b));
        CHECK(same_common(&a, &b));
        CHECK(memcmp(&a.hello, &b.hello, sizeof a.hello) == 0);
    }
    ps_header_init(&a, PS_MSG_HELLO);
    a.hello.mode = PS_MODE_SYNC;
    a.hello.max_staleness = -1;
    a.hello.num_workers = 1;
    a.hello.num_servers = 1;
    a.hello.server_rank = -1;
    CHECK_OK(rt(&a, &b));
    CHECK(memcmp(&a.hello, &b.hello, sizeof a.hello) == 0);
}

PS_TEST(stats_and_error_replies_round_trip)
{
    ps_header a, b;
    full(&a, PS_MSG_STATS, PS_FLAG_REPLY);
    ps_stats *s = &a.stats;
    s->pushes = 1, s->pulls = 2, s->inits = 3, s->updates = 4, s->bytes_in = UINT64_MAX;
    s->bytes_out = 6, s->dup_dropped = 7, s->errors = 8, s->chunks = 9, s->workers_seen = 10;
    s->min_version = -1, s->max_version = INT64_MAX;
    CHECK_OK(rt(&a, &b));
    CHECK(same_common(&a, &b));
    CHECK(memcmp(&a.stats, &b.stats, sizeof a.stats) == 0);
    CHECK_EQ_INT(b.barrier.id, -1); /* no `bw` unless a barrier is open */

    /* `bw`: who the oldest open barrier waits for, at most
     * PS_BARRIER_RANKS_MAX ranks listed, the worst case still fits */
    a.barrier.id = ((int64_t)1 << 62) - 1;
    a.barrier.missing = 65536;
    a.barrier.nranks = PS_BARRIER_RANKS_MAX;
    for (int k = 0; k < PS_BARRIER_RANKS_MAX; k++)
        a.barrier.ranks[k] = 65535 - k;
    CHECK_OK(rt(&a, &b));
    CHECK(memcmp(&a.barrier, &b.barrier, sizeof a.barrier) == 0);
    CHECK(memcmp(&a.stats, &b.stats, sizeof a.stats) == 0);

    full(&a, PS_MSG_ERROR, PS_FLAG_REPLY);
    a.err_code = PS_EMISMATCH;
    snprintf(a.err_text, sizeof a.err_text, "mode: server has async, worker has sync");
    CHECK_OK(rt(&a, &b));
    CHECK(same_common(&a, &b));
    CHECK_EQ_INT(b.err_code, PS_EMISMATCH);
    CHECK(strcmp(b.err_text, a.err_text) == 0);

    /* the longest allowed text survives intact */
    memset(a.err_text, 'x', PS_ERR_TEXT_MAX);
    a.err_text[PS_ERR_TEXT_MAX] = 0;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(strlen(b.err_text), PS_ERR_TEXT_MAX);
}

PS_TEST(encode_refuses_a_too_small_buffer)
{
    ps_header a;
    full(&a, PS_MSG_PUSH, 0);
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    CHECK_OK(ps_proto_encode(&a, buf, sizeof buf, &len));
    for (size_t cap = 0; cap < len; cap++) {
        size_t l2 = 0;
        CHECK_EQ_INT(ps_proto_encode(&a, buf, cap, &l2), PS_ETOOBIG);
    }
}

/* ---------- hand-made headers ---------- */

typedef struct mk {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mk;

static void mk_init(mk *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}
static void mk_free(mk *m) { msgpack_sbuffer_destroy(&m->sb); }
static void mk_key(mk *m, const char *k)
{
    msgpack_pack_str(&m->pk, strlen(k));
    msgpack_pack_str_body(&m->pk, k, strlen(k));
}
static void mk_u(mk *m, const char *k, uint64_t v)
{
    mk_key(m, k);
    msgpack_pack_uint64(&m->pk, v);
}
static void mk_i(mk *m, const char *k, int64_t v)
{
    mk_key(m, k);
    msgpack_pack_int64(&m->pk, v);
}

static int dec(const mk *m, char *why, size_t wl)
{
    ps_header h;
    return ps_proto_decode(m->sb.data, m->sb.size, &h, why, wl);
}

/* Build {v:1, t:HEARTBEAT, <one extra field>} and decode it (a heartbeat
 * requires no other field: proto/ps_msg_table.h). */
enum { X_U, X_I, X_STR, X_ARR, X_F, X_NIL };
static int one_field(const char *key, int kind, int64_t v, char *why, size_t wl)
{
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HEARTBEAT);
    mk_key(&m, key);
    switch (kind) {
    case X_U: msgpack_pack_uint64(&m.pk, (uint64_t)v); break;
    case X_I: msgpack_pack_int64(&m.pk, v); break;
    case X_STR: msgpack_pack_str(&m.pk, 1); msgpack_pack_str_body(&m.pk, "x", 1); break;
    case X_ARR: msgpack_pack_array(&m.pk, 0); break;
    case X_F: msgpack_pack_double(&m.pk, (double)v); break;
    default: msgpack_pack_nil(&m.pk); break;
    }
    int rc = dec(&m, why, wl);
    mk_free(&m);
    return rc;
}

PS_TEST(decode_accepts_minimal_header_and_ignores_unknown_keys)
{
    char why[256];
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mk_u(&m, "t", PS_MSG_HEARTBEAT);
    mk_u(&m, "zz_future", 7);
    mk_key(&m, "also_new");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_true(&m.pk);
    mk_u(&m, "v", 1); /* version need not come first */
    ps_header h;
    int rc = ps_proto_decode(m.sb.data, m.sb.size, &h, why, sizeof why);
    mk_free(&m);
    CHECK_OK(rc);
    CHECK_EQ_INT(h.type, PS_MSG_HEARTBEAT);
    CHECK_EQ_INT(h.rank, -1);
}

PS_TEST(decode_refuses_wrong_types_and_out_of_range_values)
{
    char why[256];
    struct { const char *k; int kind; int64_t v; int want; } cases[] = {
        {"t", X_U, 0, PS_EPROTO},            {"t", X_U, PS_MSG_TYPE_MAX + 1, PS_EPROTO},
        {"t", X_STR, 0, PS_EPROTO},          {"f", X_U, PS_FLAG_MASK + 1, PS_EPROTO},
        {"f", X_I, -1, PS_EPROTO},           {"q", X_I, -1, PS_EPROTO},
        {"q", X_STR, 0, PS_EPROTO},          {"r", X_I, -2, PS_EPROTO},
        {"r", X_U, PS_MAX_RANK + 1, PS_EPROTO}, {"r", X_F, 1, PS_EPROTO},
        {"k", X_I, -1, PS_EPROTO},           {"k", X_ARR, 0, PS_EPROTO},
        {"c", X_U, PS_MAX_CHUNK, PS_EPROTO}, {"s", X_I, -2, PS_EPROTO},
        {"s", X_U, (int64_t)1 << 62, PS_EPROTO}, {"s", X_NIL, 0, PS_EPROTO},
        {"n", X_U, (int64_t)PS_MAX_PAYLOAD_BYTES + 1, PS_EPROTO}, {"d", X_U, PS_DTYPE_MAX + 1, PS_EPROTO},
        {"tot", X_I, -1, PS_EPROTO},         {"ec", X_I, -1, PS_EPROTO},
        {"ec", X_U, 1001, PS_EPROTO},        {"et", X_U, 5, PS_EPROTO},
        {"h", X_U, 1, PS_EPROTO},            {"h", X_ARR, 0, PS_EPROTO},
        {"st", X_STR, 0, PS_EPROTO},         {"v", X_STR, 0, PS_EPROTO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        why[0] = 0;
        int rc = one_field(cases[i].k, cases[i].kind, cases[i].v, why, sizeof why);
        CHECK_MSG(rc == cases[i].want, "field %s kind %d value %lld: got %d, want %d",
                  cases[i].k, cases[i].kind, (long long)cases[i].v, rc, cases[i].want);
        CHECK_MSG(why[0] != 0, "field %s: no reason given", cases[i].k);
    }
    /* in-range values of the same fields are fine */
    CHECK_OK(one_field("r", X_I, -1, why, sizeof why));
    CHECK_OK(one_field("s", X_I, -1, why, sizeof why));
    CHECK_OK(one_field("c", X_U, PS_MAX_CHUNK - 1, why, sizeof why));
    CHECK_OK(one_field("zz", X_STR, 0, why, sizeof why));
}

/* h.dt: 1..3 (f32, bf16, f16); 0 and 4 are refused, naming the key */
PS_TEST(decode_refuses_a_hello_wire_dtype_out_of_range)
{
    char why[256];
    for (uint64_t dt = 0; dt <= PS_DTYPE_MAX + 1; dt++) {
        mk m;
        mk_init(&m);
        msgpack_pack_map(&m.pk, 3);
        mk_u(&m, "v", 1);
        mk_u(&m, "t", PS_MSG_HELLO);
        mk_key(&m, "h");
        msgpack_pack_map(&m.pk, 4);
        mk_i(&m, "mode", PS_MODE_SYNC);
        mk_u(&m, "nw", 1);
        mk_u(&m, "ns", 1);
        mk_u(&m, "dt", dt);
        ps_header h;
        why[0] = 0;
        int rc = ps_proto_decode(m.sb.data, m.sb.size, &h, why, sizeof why);
        mk_free(&m);
        if (dt >= PS_DTYPE_F32 && dt <= PS_DTYPE_MAX) {
            CHECK_MSG(rc == 0, "dt %llu refused: %s", (unsigned long long)dt, why);
            CHECK_EQ_INT(h.hello.wire_dtype, dt);
        } else {
            CHECK_EQ_INT(rc, PS_EPROTO);
            CHECK_MSG(strstr(why, "h.dt"), "dt %llu: %s", (unsigned long long)dt, why);
        }
    }
}

PS_TEST(decode_refuses_count_beyond_payload_limit)
{
    char why[256];
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_PUSH);
    mk_u(&m, "n", PS_MAX_PAYLOAD_BYTES / 4 + 1);
    mk_u(&m, "d", PS_DTYPE_F32);
    int rc = dec(&m, why, sizeof why);
    mk_free(&m);
    CHECK_EQ_INT(rc, PS_ETOOBIG);
}

PS_TEST(decode_refuses_missing_version_type_and_hello_body)
{
    char why[256];
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 1);
    mk_u(&m, "t", PS_MSG_PULL);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);

    mk_init(&m);
    msgpack_pack_map(&m.pk, 1);
    mk_u(&m, "v", 1);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);

    mk_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HELLO);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);

    /* hello body missing its required fields, or with bad ones */
    struct { const char *k; int64_t v; } bad[] = {
        {"mode", 3}, {"mode", 0}, {"stal", -2}, {"nw", 0}, {"ns", 0}, {"sr", -2}, {"opt", 6},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mk_init(&m);
        msgpack_pack_map(&m.pk, 3);
        mk_u(&m, "v", 1);
        mk_u(&m, "t", PS_MSG_HELLO);
        mk_key(&m, "h");
        msgpack_pack_map(&m.pk, 4);
        const char *keys[] = {"mode", "nw", "ns"};
        int64_t vals[] = {1, 1, 1};
        for (int j = 0; j < 3; j++)
            if (strcmp(keys[j], bad[i].k) != 0)
                mk_i(&m, keys[j], vals[j]);
        mk_i(&m, bad[i].k, bad[i].v);
        if (!strcmp(bad[i].k, "mode") || !strcmp(bad[i].k, "nw") || !strcmp(bad[i].k, "ns"))
            mk_i(&m, "zz", 0); /* keep the declared 4 entries */
        int rc = dec(&m, why, sizeof why);
        mk_free(&m);
        CHECK_MSG(rc == PS_EPROTO, "hello %s = %lld: got %d", bad[i].k, (long long)bad[i].v, rc);
    }
    /* a float that is not a number */
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HELLO);
    mk_key(&m, "h");
    msgpack_pack_map(&m.pk, 4);
    mk_i(&m, "mode", 1);
    mk_i(&m, "nw", 1);
    mk_i(&m, "ns", 1);
    mk_key(&m, "lr");
    msgpack_pack_float(&m.pk, __builtin_nanf(""));
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);
}

/* A hello {mode 1, nw 1, ns 1} plus the entries add() packs (n of them). */
static int hello_with(int n, void (*add)(mk *), ps_header *h, char *why, size_t wl)
{
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HELLO);
    mk_key(&m, "h");
    msgpack_pack_map(&m.pk, 3 + (size_t)n);
    mk_i(&m, "mode", 1);
    mk_i(&m, "nw", 1);
    mk_i(&m, "ns", 1);
    add(&m);
    int rc = ps_proto_decode(m.sb.data, m.sb.size, h, why, wl);
    mk_free(&m);
    return rc;
}

static void add_sk(mk *m) { mk_u(m, "sk", 5); }
static void add_sa_sk(mk *m)
{
    mk_key(m, "sa");
    msgpack_pack_str(&m->pk, 3);
    msgpack_pack_str_body(&m->pk, "/ps", 3);
    mk_u(m, "sk", 5);
}
static void add_arena(mk *m)
{
    add_sa_sk(m);
    mk_u(m, "sz", 8192);
}
static void add_tiny_eps(mk *m)
{
    mk_key(m, "eps");
    msgpack_pack_double(&m->pk, -4.7e-303); /* -0 as a float32 */
}
static void add_zero_lrd(mk *m)
{
    mk_key(m, "lrd");
    msgpack_pack_double(&m->pk, -0.0);
}
static void add_zero_lr(mk *m)
{
    mk_key(m, "lr");
    msgpack_pack_double(&m->pk, 0.0);
}
static void add_sm(mk *m) { mk_i(m, "sm", 1); }

/* Found by fuzz_proto's round trip (tests/fuzz/regress/fuzz_proto/): a
 * header must decode to what its encoding says, or be refused. */
PS_TEST(a_hello_arena_offer_and_hyperparameters_decode_whole_or_are_refused)
{
    char why[256];
    ps_header h;
    /* sk without sa: the encoder would drop it; an offer is all three */
    CHECK_EQ_INT(hello_with(1, add_sk, &h, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "'h.sa'") != NULL, "%s", why);
    CHECK_EQ_INT(hello_with(2, add_sa_sk, &h, why, sizeof why), PS_EPROTO);
    CHECK_OK(hello_with(3, add_arena, &h, why, sizeof why));
    CHECK(strcmp(h.hello.shm_name, "/ps") == 0 && h.hello.shm_nonce == 5 &&
          h.hello.shm_size == 8192);
    /* -4.7e-303 is -0 as a float32: not "not given", out of eps's (0, 1] */
    CHECK_EQ_INT(hello_with(1, add_tiny_eps, &h, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "eps") != NULL, "%s", why);
    /* an exact 0 (here -0) in a row where 0 means "not given" stays that */
    CHECK_OK(hello_with(1, add_zero_lrd, &h, why, sizeof why));
    CHECK(!ps_opt_is_given(&h.hello.opt, PS_OPT_P_lr_decay));
    uint32_t bits;
    memcpy(&bits, &h.hello.opt.lr_decay, sizeof bits);
    CHECK_EQ_INT(bits, 0);
    /* lr 0 is a rate (steps that move nothing): given */
    CHECK_OK(hello_with(1, add_zero_lr, &h, why, sizeof why));
    CHECK(ps_opt_is_given(&h.hello.opt, PS_OPT_P_lr) && h.hello.opt.lr == 0.0f);
    /* the server's answer in a request is ignored */
    CHECK_OK(hello_with(1, add_sm, &h, why, sizeof why));
    CHECK_EQ_INT(h.hello.shm, 0);
}

PS_TEST(keys_of_other_messages_are_ignored_like_unknown_ones)
{
    char why[256];
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 10);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_PULL);
    mk_u(&m, "k", 1);
    mk_u(&m, "c", 0);
    mk_i(&m, "s", 0);
    mk_u(&m, "o", 4096); /* without the shared-memory flag */
    mk_u(&m, "m", 3);    /* a pull sums no gradients */
    mk_i(&m, "ec", 4);   /* not an error */
    mk_key(&m, "adm");
    msgpack_pack_str(&m.pk, 16);
    msgpack_pack_str_body(&m.pk, "0123456789abcdef", 16);
    mk_key(&m, "st");
    msgpack_pack_map(&m.pk, 1);
    mk_u(&m, "push", 7);
    ps_header h, plain;
    int rc = ps_proto_decode(m.sb.data, m.sb.size, &h, why, sizeof why);
    mk_free(&m);
    CHECK_OK(rc);
    ps_header_init(&plain, PS_MSG_PULL);
    plain.key = 1;
    CHECK(memcmp(&h, &plain, sizeof h) == 0);
    /* "m" 1 is the default one gradient */
    mk_init(&m);
    msgpack_pack_map(&m.pk, 6);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_PUSH);
    mk_u(&m, "k", 1);
    mk_u(&m, "c", 0);
    mk_i(&m, "s", 0);
    mk_u(&m, "m", 1);
    rc = ps_proto_decode(m.sb.data, m.sb.size, &h, why, sizeof why);
    mk_free(&m);
    CHECK_OK(rc);
    CHECK_EQ_INT(h.npush, 0);
}

PS_TEST(decode_refuses_other_protocol_version)
{
    char why[256] = "";
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mk_u(&m, "t", PS_MSG_PULL);
    mk_u(&m, "v", 2);
    int rc = dec(&m, why, sizeof why);
    mk_free(&m);
    CHECK_EQ_INT(rc, PS_EVERSION);
    CHECK(strstr(why, "2") != NULL);
    mk_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mk_u(&m, "v", 0);
    mk_u(&m, "t", PS_MSG_PULL);
    rc = dec(&m, why, sizeof why);
    mk_free(&m);
    CHECK_EQ_INT(rc, PS_EVERSION);
}

PS_TEST(decode_refuses_non_map_garbage_and_non_string_keys)
{
    char why[256];
    ps_header h;
    const uint8_t garbage[][6] = {
        {0xc1},                         /* never-used byte */
        {0x93, 0x01, 0x02, 0x03},       /* array [1,2,3] */
        {0x05},                         /* the integer 5 */
        {0xa3, 'a', 'b', 'c'},          /* a string */
        {0xc0},                         /* nil */
        {0x81, 0x01, 0x01},             /* {1: 1} */
    };
    const size_t lens[] = {1, 4, 1, 4, 1, 3};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        CHECK_MSG(ps_proto_decode(garbage[i], lens[i], &h, why, sizeof why) == PS_EPROTO,
                  "garbage %zu accepted", i);
    CHECK_EQ_INT(ps_proto_decode("", 0, &h, why, sizeof why), PS_EPROTO);
    /* pseudo-random bytes never crash and never pass */
    uint32_t x = 12345;
    uint8_t buf[64];
    for (int round = 0; round < 2000; round++) {
        size_t n = 1 + (x % 64);
        for (size_t j = 0; j < n; j++) {
            x = x * 1103515245u + 12345u;
            buf[j] = (uint8_t)(x >> 16);
        }
        buf[0] = 0x80 | (buf[0] & 0x0f); /* a fixmap, to get past the first check */
        int rc = ps_proto_decode(buf, n, &h, why, sizeof why);
        CHECK(rc == 0 || rc == PS_EPROTO || rc == PS_EVERSION || rc == PS_ETOOBIG);
    }
}

PS_TEST(decode_refuses_every_truncation_and_trailing_bytes)
{
    ps_header a, b;
    full(&a, PS_MSG_HELLO, 0);
    a.hello.mode = 1;
    a.hello.num_workers = 2;
    a.hello.num_servers = 2;
    char buf[PS_HEADER_MAX + 8], why[256];
    size_t len;
    CHECK_OK(ps_proto_encode(&a, buf, PS_HEADER_MAX, &len));
    for (size_t n = 0; n < len; n++)
        CHECK_MSG(ps_proto_decode(buf, n, &b, why, sizeof why) != 0, "prefix of %zu accepted", n);
    buf[len] = 0x00;
    CHECK_EQ_INT(ps_proto_decode(buf, len + 1, &b, why, sizeof why), PS_EPROTO);
    CHECK_OK(ps_proto_decode(buf, len, &b, why, sizeof why));
}

PS_TEST(decode_refuses_absurd_container_counts_and_depth)
{
    char why[256];
    ps_header h;
    /* map32 claiming 2^32-1 pairs in a 5-byte frame */
    const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    CHECK_EQ_INT(ps_proto_decode(map32, sizeof map32, &h, why, sizeof why), PS_EPROTO);
    const uint8_t arr32[] = {0x81, 0xa1, 'x', 0xdd, 0x7f, 0xff, 0xff, 0xff};
    CHECK_EQ_INT(ps_proto_decode(arr32, sizeof arr32, &h, why, sizeof why), PS_EPROTO);
    const uint8_t map16[] = {0xde, 0xff, 0xff, 0x01};
    CHECK_EQ_INT(ps_proto_decode(map16, sizeof map16, &h, why, sizeof why), PS_EPROTO);
    /* str32 / bin32 / ext32 claiming more bytes than there are */
    const uint8_t str32[] = {0x81, 0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'};
    CHECK_EQ_INT(ps_proto_decode(str32, sizeof str32, &h, why, sizeof why), PS_EPROTO);
    const uint8_t bin32[] = {0x81, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xff, 0};
    CHECK_EQ_INT(ps_proto_decode(bin32, sizeof bin32, &h, why, sizeof why), PS_EPROTO);
    const uint8_t ext32[] = {0x81, 0xa1, 'x', 0xc9, 0xff, 0xff, 0xff, 0xff, 1};
    CHECK_EQ_INT(ps_proto_decode(ext32, sizeof ext32, &h, why, sizeof why), PS_EPROTO);
    /* nesting deeper than 4 levels */
    uint8_t deep[32];
    size_t n = 0;
    deep[n++] = 0x83;
    deep[n++] = 0xa1, deep[n++] = 'v', deep[n++] = 0x01;
    deep[n++] = 0xa1, deep[n++] = 't', deep[n++] = 0x04;
    deep[n++] = 0xa1, deep[n++] = 'x';
    for (int d = 0; d < 6; d++)
        deep[n++] = 0x91; /* [[[[[[ ... */
    deep[n++] = 0x01;
    CHECK_EQ_INT(ps_proto_decode(deep, n, &h, why, sizeof why), PS_EPROTO);
    /* ... yet a map with its version: answerable, naming the field (the
     * server's error reply echoes q and t) */
    CHECK_EQ_INT(h.version, PS_PROTO_VERSION);
    CHECK_EQ_INT(h.type, PS_MSG_PULL);
    CHECK_MSG(strstr(why, "field 'x' nests deeper than the header's 4 levels"), "%s", why);
    /* a value of a value too deep: the same; cut short or with a version
     * too deep itself: not answerable */
    const uint8_t tb[] = {0x83, 0xa1, 'v', 0x01, 0xa1, 'q', 0x2a, 0xa2, 't', 'b', 0x81, 0xa1,
                          'x', 0x91, 0x91, 0x91, 0x91, 0x01};
    CHECK_EQ_INT(ps_proto_decode(tb, sizeof tb, &h, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(h.version, PS_PROTO_VERSION);
    CHECK_EQ_INT(h.seq, 42);
    CHECK_MSG(strstr(why, "field 'tb' nests deeper"), "%s", why);
    CHECK_EQ_INT(ps_proto_decode(tb, sizeof tb - 1, &h, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(h.version, 0);
    const uint8_t deep_v[] = {0x81, 0xa1, 'v', 0x91, 0x91, 0x91, 0x91, 0x91, 0x01};
    CHECK_EQ_INT(ps_proto_decode(deep_v, sizeof deep_v, &h, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(h.version, 0);
}

PS_TEST(decode_refuses_oversize_frame)
{
    char why[256];
    ps_header h;
    size_t n = PS_HEADER_MAX + 1;
    uint8_t *big = calloc(1, n);
    CHECK(big);
    /* a valid map (a heartbeat) padded with a long unknown string value */
    big[0] = 0x83;
    size_t p = 1;
    big[p++] = 0xa1, big[p++] = 'v', big[p++] = 0x01;
    big[p++] = 0xa1, big[p++] = 't', big[p++] = 0x0a;
    big[p++] = 0xa1, big[p++] = 'z', big[p++] = 0xda;
    size_t rest = n - p - 2;
    big[p++] = (uint8_t)(rest >> 8), big[p++] = (uint8_t)rest;
    int rc = ps_proto_decode(big, n, &h, why, sizeof why);
    /* the same shape one byte under the limit is fine */
    big[9] = 0xda;
    rest -= 1;
    big[10] = (uint8_t)(rest >> 8), big[11] = (uint8_t)rest;
    int rc2 = ps_proto_decode(big, n - 1, &h, why, sizeof why);
    free(big);
    CHECK_EQ_INT(rc, PS_ETOOBIG);
    CHECK_OK(rc2);
}

PS_TEST(a_payload_frame_is_taken_exactly_where_the_type_carries_one_and_of_its_size)
{
    char why[256];
    ps_header h;
    ps_header_init(&h, PS_MSG_PUSH);
    h.count = 10;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(ps_proto_check_payload(&h, 1, 40, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_payload(&h, 0, 0, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_proto_check_payload(&h, 2, 40, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 39, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 44, why, sizeof why), PS_EPROTO);
    h.dtype = 0;
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 40, why, sizeof why), PS_EPROTO);
    h.dtype = PS_DTYPE_F32;
    h.count = 0;
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 0, why, sizeof why), PS_EPROTO);
    /* INIT and PUSHPULL requests carry payloads too */
    ps_header_init(&h, PS_MSG_INIT);
    h.count = 1, h.dtype = PS_DTYPE_F32;
    CHECK_OK(ps_proto_check_payload(&h, 1, 4, why, sizeof why));
    ps_header_init(&h, PS_MSG_PUSHPULL);
    h.count = 3, h.dtype = PS_DTYPE_F32;
    CHECK_OK(ps_proto_check_payload(&h, 1, 12, why, sizeof why));
    /* a pull request has none; its reply has one */
    ps_header_init(&h, PS_MSG_PULL);
    CHECK_OK(ps_proto_check_payload(&h, 0, 0, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 4, why, sizeof why), PS_EPROTO);
    h.flags = PS_FLAG_REPLY;
    h.count = 1, h.dtype = PS_DTYPE_F32;
    CHECK_OK(ps_proto_check_payload(&h, 1, 4, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_payload(&h, 0, 0, why, sizeof why), PS_EPROTO);
    /* a push ack has none */
    ps_header_init(&h, PS_MSG_PUSH);
    h.flags = PS_FLAG_REPLY;
    CHECK_OK(ps_proto_check_payload(&h, 0, 0, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 4, why, sizeof why), PS_EPROTO);
    for (uint32_t t = PS_MSG_BARRIER; t <= PS_MSG_TYPE_MAX; t++) {
        if (ps_msg_request_layout(t) != PS_PL_NONE) /* a table's: below */
            continue;
        ps_header_init(&h, t);
        CHECK_OK(ps_proto_check_payload(&h, 0, 0, why, sizeof why));
        CHECK_EQ_INT(ps_proto_check_payload(&h, 1, 4, why, sizeof why), PS_EPROTO);
    }
}

/* A table's messages: ids frames of 8 x n (and np) bytes, a rows frame of
 * n x dim x the size of d, each named when it is wrong; n and np up to
 * PS_MAX_SPARSE_IDS, dim up to PS_MAX_TABLE_DIM. */
PS_TEST(a_table_message_takes_its_frames_each_of_its_size)
{
    char why[256];
    ps_header h;
    ps_header_init(&h, PS_MSG_SPUSH);
    h.count = 3, h.dim = 4, h.dtype = PS_DTYPE_BF16;
    size_t ok[3] = {24, 24, 0};
    CHECK_OK(ps_proto_check_frames(&h, 2, ok, why, sizeof why));
    size_t short_ids[3] = {16, 24, 0}, long_rows[3] = {24, 48, 0};
    CHECK_EQ_INT(ps_proto_check_frames(&h, 2, short_ids, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "frame 1 (ids) has 16 bytes, not 24"), "%s", why);
    CHECK_EQ_INT(ps_proto_check_frames(&h, 2, long_rows, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "frame 2 (rows) has 48 bytes, not 24"), "%s", why);
    CHECK_EQ_INT(ps_proto_check_frames(&h, 1, ok, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "spush request needs 2 frames after its header, got 1"), "%s", why);
    /* no rows at all: a partition the worker touched nothing of */
    h.count = 0;
    size_t none[3] = {0, 0, 0};
    CHECK_OK(ps_proto_check_frames(&h, 2, none, why, sizeof why));
    /* too many ids, a width out of range, an unknown dtype */
    h.count = PS_MAX_SPARSE_IDS + 1;
    CHECK_EQ_INT(ps_proto_check_frames(&h, 2, none, why, sizeof why), PS_ETOOBIG);
    CHECK_MSG(strstr(why, "at most 1048576 per message"), "%s", why);
    h.count = 3;
    h.dim = 0;
    CHECK_EQ_INT(ps_proto_check_frames(&h, 2, ok, why, sizeof why), PS_EPROTO);
    h.dim = 4;
    h.dtype = 0;
    CHECK_EQ_INT(ps_proto_check_frames(&h, 2, ok, why, sizeof why), PS_EPROTO);
    /* a pull: ids only; its reply: rows only */
    ps_header_init(&h, PS_MSG_SPULL);
    h.count = 2, h.dim = 5;
    size_t pull[3] = {16, 0, 0};
    CHECK_OK(ps_proto_check_frames(&h, 1, pull, why, sizeof why));
    h.flags = PS_FLAG_REPLY;
    h.dtype = PS_DTYPE_F32;
    size_t rows[3] = {40, 0, 0};
    CHECK_OK(ps_proto_check_frames(&h, 1, rows, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_frames(&h, 1, pull, why, sizeof why), PS_EPROTO);
    /* a pushpull: ids, rows, ids to pull (np of them) */
    ps_header_init(&h, PS_MSG_SPUSHPULL);
    h.count = 1, h.dim = 2, h.dtype = PS_DTYPE_F32, h.npull = 3;
    size_t pp[3] = {8, 8, 24}, pp_bad[3] = {8, 8, 16};
    CHECK_OK(ps_proto_check_frames(&h, 3, pp, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_frames(&h, 3, pp_bad, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "frame 3 (ids to pull)"), "%s", why);
    /* in the worker's arena: no frame, float32, the reply's rows within the
     * limit too; the block is the frames' bytes, then the rows pulled */
    h.flags = PS_FLAG_SHM;
    CHECK_OK(ps_proto_check_frames(&h, 0, pp, why, sizeof why));
    CHECK_EQ_INT(ps_proto_check_frames(&h, 3, pp, why, sizeof why), PS_EPROTO);
    uint64_t at;
    CHECK_EQ_INT(ps_proto_sparse_shm_bytes(&h, &at), 8 + 8 + 24 + 3 * 8);
    CHECK_EQ_INT(at, 8 + 8 + 24);
    h.dtype = PS_DTYPE_BF16;
    CHECK_EQ_INT(ps_proto_check_frames(&h, 0, pp, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "in shared memory: rows are float32"), "%s", why);
    h.dtype = PS_DTYPE_F32;
    h.dim = 1024, h.npull = PS_MAX_PAYLOAD_BYTES / 4096 + 1;
    CHECK_EQ_INT(ps_proto_check_frames(&h, 0, pp, why, sizeof why), PS_ETOOBIG);
    ps_header_init(&h, PS_MSG_SPULL);
    h.flags = PS_FLAG_SHM, h.count = 3, h.dim = 5, h.dtype = PS_DTYPE_F32;
    CHECK_OK(ps_proto_check_frames(&h, 0, pp, why, sizeof why));
    CHECK_EQ_INT(ps_proto_sparse_shm_bytes(&h, &at), 3 * 8 + 3 * 20);
    CHECK_EQ_INT(at, 3 * 8);
    ps_header_init(&h, PS_MSG_SPUSH);
    h.flags = PS_FLAG_SHM, h.count = 3, h.dim = 5, h.dtype = PS_DTYPE_F32;
    CHECK_EQ_INT(ps_proto_sparse_shm_bytes(&h, &at), 3 * 8 + 3 * 20);
    CHECK_EQ_INT(at, 3 * 8 + 3 * 20);
}

/* A TABLE request's declaration round-trips field for field; the values
 * are checked by ps_table_decl_check, which names the field and its range. */
PS_TEST(a_table_declaration_round_trips_with_every_field)
{
    ps_header a, b;
    ps_header_init(&a, PS_MSG_TABLE);
    a.key = 99;
    ps_table_options_default(&a.table);
    a.table.dim = 65536;
    a.table.init = PS_TABLE_INIT_NORMAL;
    a.table.init_scale = 0.125f;
    a.table.seed = UINT64_MAX;
    a.table.opt.kind = PS_TABLE_OPT_FTRL;
    a.table.opt.lr = 0.5f;
    a.table.opt.lr_decay_every = 4000000000u;
    a.table.ftrl_beta = 2.0f;
    a.table.ftrl_l1 = 0.25f;
    a.table.ftrl_l2 = 0.75f;
    a.table.max_rows = 1ull << 40;
    a.table.min_count = 255;
    a.table.filter_cells = 4096;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.key, 99);
    CHECK_STR(b.table_name, ""); /* no name: no `nm` */
    /* its optional name (`nm`), printable, at most PS_TABLE_NAME_MAX */
    snprintf(a.table_name, sizeof a.table_name, "emb_l.0.weight_q");
    CHECK_OK(rt(&a, &b));
    CHECK_STR(b.table_name, "emb_l.0.weight_q");
    a.table_name[3] = '\n';
    CHECK_EQ_INT(rt(&a, &b), PS_EPROTO);
    a.table_name[0] = 0;
    CHECK_OK(rt(&a, &b));
    char why[256];
    CHECK_MSG(ps_table_decl_compare(99, &a.table, "a", &b.table, "b", why, sizeof why) == 0,
              "%s", why);
    CHECK(b.table.dim == 65536 && b.table.seed == UINT64_MAX && b.table.opt.kind == 6 &&
          b.table.opt.lr_decay_every == 4000000000u && b.table.max_rows == 1ull << 40 &&
          b.table.ftrl_l2 == 0.75f && b.table.filter_cells == 4096);
    /* and one field differing is named with both values */
    b.table.min_count = 3;
    CHECK_EQ_INT(ps_table_decl_compare(99, &a.table, "worker 1", &b.table, "server 0", why,
                                       sizeof why),
                 PS_EMISMATCH);
    CHECK_STR(why, "table 99: min-count: worker 1 has 255, server 0 has 3");
    b.table.min_count = 255;
    b.table.dim = 16;
    a.table.dim = 32;
    CHECK_EQ_INT(ps_table_decl_compare(7, &b.table, "worker 1", &a.table, "server 0", why,
                                       sizeof why),
                 PS_EMISMATCH);
    CHECK_STR(why, "table 7: dim: worker 1 has 16, server 0 has 32");
    /* values out of range: named */
    a.table.dim = 0;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(ps_table_decl_check(99, &b.table, why, sizeof why), PS_EINVAL);
    CHECK_STR(why, "table 99: dim must be in [1, 65536], got 0");
    b.table.dim = 8;
    b.table.opt.lr = 0;
    CHECK_EQ_INT(ps_table_decl_check(99, &b.table, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "table 99 (ftrl): ") && strstr(why, "lr"), "%s", why);
    b.table.opt.lr = 0.5f;
    b.table.opt.kind = PS_OPT_AVERAGE; /* a worker-side kind: no table's */
    CHECK_EQ_INT(ps_table_decl_check(99, &b.table, why, sizeof why), PS_EINVAL);
    b.table.opt.kind = PS_TABLE_OPT_ROWWISE_ADAGRAD;
    CHECK_OK(ps_table_decl_check(99, &b.table, why, sizeof why));
    b.table.opt.kind = PS_OPT_NONE; /* adagrad */
    CHECK_OK(ps_table_decl_check(99, &b.table, why, sizeof why));
    b.table.min_count = 256;
    CHECK_EQ_INT(ps_table_decl_check(99, &b.table, why, sizeof why), PS_EINVAL);
}

static void hello_base(ps_hello *h)
{
    memset(h, 0, sizeof *h);
    h->mode = PS_MODE_SYNC;
    h->num_workers = 2;
    h->num_servers = 2;
    h->model_fp = 77;
    h->opt.kind = PS_OPT_SGD;
    h->opt.lr = 0.5f;
    h->opt.given = PS_OPT_GIVEN_ALL;
}

PS_TEST(hello_compare_names_field_and_both_values)
{
    ps_hello a, b;
    char why[256];
    hello_base(&a);
    hello_base(&b);
    b.server_rank = 1; /* not compared: every server has its own */
    CHECK_OK(ps_hello_compare(&a, "A", &b, "B", 1, why, sizeof why));
#define EXPECT(mutate, s1, s2, s3)                                                         \
    do {                                                                                   \
        hello_base(&b);                                                                    \
        mutate;                                                                            \
        why[0] = 0;                                                                        \
        CHECK_EQ_INT(ps_hello_compare(&a, "wA", &b, "sB", 1, why, sizeof why), PS_EMISMATCH); \
        CHECK_MSG(strstr(why, s1) && strstr(why, s2) && strstr(why, s3) && strstr(why, "wA") && \
                      strstr(why, "sB"),                                                   \
                  "message '%s' lacks '%s' '%s' '%s'", why, s1, s2, s3);                   \
    } while (0)
    EXPECT(b.mode = PS_MODE_ASYNC, "mode", "sync", "async");
    EXPECT(b.max_staleness = 3, "staleness", "0", "3");
    EXPECT(b.num_workers = 5, "workers", "2", "5");
    EXPECT(b.num_servers = 3, "servers", "2", "3");
    EXPECT(b.model_fp = 78, "model", "4d", "4e");
    EXPECT(b.opt.kind = PS_OPT_ADAM, "optimizer", "sgd", "adam");
    EXPECT(b.opt.lr = 0.25f, "lr", "0.5", "0.25");
    EXPECT(b.opt.weight_decay = 0.125f, "weight-decay", "0", "0.125");
    EXPECT(b.wire_dtype = PS_DTYPE_BF16, "wire-dtype", "f32", "bf16");
    EXPECT((a.wire_dtype = PS_DTYPE_F16, b.wire_dtype = PS_DTYPE_BF16), "wire-dtype", "f16",
           "bf16");
    a.wire_dtype = 0;
#undef EXPECT
    /* a peer that leaves "dt" out (0) means float32 */
    hello_base(&b);
    b.wire_dtype = PS_DTYPE_F32;
    CHECK_OK(ps_hello_compare(&a, "A", &b, "B", 1, why, sizeof why));
    /* unset fingerprint, unchecked or unnamed optimizer: no complaint */
    hello_base(&b);
    b.model_fp = 0;
    CHECK_OK(ps_hello_compare(&a, "A", &b, "B", 1, why, sizeof why));
    hello_base(&b);
    b.opt.kind = PS_OPT_ADAM;
    CHECK_OK(ps_hello_compare(&a, "A", &b, "B", 0, why, sizeof why));
    b.opt.kind = PS_OPT_NONE;
    CHECK_OK(ps_hello_compare(&a, "A", &b, "B", 1, why, sizeof why));
}

PS_TEST(message_mode_and_optimizer_names_print_and_parse)
{
    int v;
    CHECK(strcmp(ps_msg_type_name(PS_MSG_PUSHPULL), "pushpull") == 0);
    CHECK(strcmp(ps_msg_type_name(0), "unknown") == 0);
    CHECK(strcmp(ps_msg_type_name(PS_MSG_TYPE_MAX + 1), "unknown") == 0);
    CHECK_OK(ps_mode_parse("async", &v));
    CHECK_EQ_INT(v, PS_MODE_ASYNC);
    CHECK_EQ_INT(ps_mode_parse("bsp", &v), PS_EINVAL);
    CHECK_EQ_INT(ps_mode_parse(NULL, &v), PS_EINVAL);
    CHECK_OK(ps_opt_parse("adam", &v));
    CHECK_EQ_INT(v, PS_OPT_ADAM);
    CHECK_EQ_INT(ps_opt_parse("none", &v), PS_EINVAL);
    CHECK(strcmp(ps_opt_name(PS_OPT_NESTEROV), "nesterov") == 0);
    CHECK_EQ_INT(ps_dtype_size(PS_DTYPE_F32), 4);
    CHECK_EQ_INT(ps_dtype_size(0), 0);
}

/* ---------- duplicate keys, and what a refused header still tells ---------- */

PS_TEST(decode_refuses_a_known_key_given_twice)
{
    char why[256];
    ps_header h;
    /* in the header: a second 's' would let a checker and a user of the
     * header read different steps */
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 5);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_PUSH);
    mk_u(&m, "q", 77);
    mk_u(&m, "s", 1);
    mk_u(&m, "s", 4611686018427387903ull);
    int rc = ps_proto_decode(m.sb.data, m.sb.size, &h, why, sizeof why);
    mk_free(&m);
    CHECK_EQ_INT(rc, PS_EPROTO);
    CHECK(strstr(why, "'s' appears twice"));
    CHECK_EQ_INT(h.seq, 77);
    CHECK_EQ_INT(h.push_step, 1); /* the first one is what an error reply echoes */
    /* in the hello map */
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HELLO);
    mk_key(&m, "h");
    msgpack_pack_map(&m.pk, 5);
    mk_i(&m, "mode", 1);
    mk_i(&m, "nw", 2);
    mk_i(&m, "ns", 1);
    mk_key(&m, "lr");
    msgpack_pack_float(&m.pk, 0.1f);
    mk_key(&m, "lr");
    msgpack_pack_float(&m.pk, 0.5f);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);
    CHECK(strstr(why, "'lr' appears twice in 'h'"));
    /* in the stats map */
    mk_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_STATS);
    mk_u(&m, "f", 1);
    mk_key(&m, "st");
    msgpack_pack_map(&m.pk, 2);
    mk_u(&m, "push", 1);
    mk_u(&m, "push", 2);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);
    /* unknown keys may repeat: they are ignored either way */
    mk_init(&m);
    msgpack_pack_map(&m.pk, 4);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_HEARTBEAT);
    mk_u(&m, "zz", 1);
    mk_u(&m, "zz", 2);
    CHECK_OK(dec(&m, why, sizeof why));
    mk_free(&m);
}

/* {v, t, f, q (signed or not), r, k, c} with the values given, q first or last. */
static int refused_echo(uint64_t v, uint64_t t, uint64_t f, int64_t q, int q_first, ps_header *h,
                        char *why, size_t wl)
{
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 7);
    if (q_first)
        mk_i(&m, "q", q);
    mk_u(&m, "v", v);
    mk_u(&m, "t", t);
    mk_u(&m, "f", f);
    mk_i(&m, "r", 3);
    mk_u(&m, "k", 99);
    mk_u(&m, "c", 7);
    if (!q_first)
        mk_i(&m, "q", q);
    int rc = ps_proto_decode(m.sb.data, m.sb.size, h, why, wl);
    mk_free(&m);
    return rc;
}

PS_TEST(a_refused_header_still_gives_q_rank_key_and_chunk_to_echo)
{
    char why[256];
    ps_header h;
    struct { uint64_t v, t, f; int64_t q; int want; } cases[] = {
        {2, PS_MSG_PULL, 0, 41, PS_EVERSION},  /* another protocol version */
        {1, 0, 0, 42, PS_EPROTO},              /* type 0 */
        {1, PS_MSG_TYPE_MAX + 1, 0, 43, PS_EPROTO}, /* type 11 */
        {1, PS_MSG_PULL, 4, 44, PS_EPROTO},    /* an unknown flag (2 is shared memory) */
        {1, PS_MSG_PULL, 0, -45, PS_EPROTO},   /* a negative q */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int first = 0; first < 2; first++) {
            int rc = refused_echo(cases[i].v, cases[i].t, cases[i].f, cases[i].q, first, &h, why,
                                  sizeof why);
            CHECK_MSG(rc == cases[i].want, "case %zu: rc %d", i, rc);
            CHECK_MSG(h.seq == (uint64_t)cases[i].q && h.seq_negative == (cases[i].q < 0),
                      "case %zu (q %s): seq %llu", i, first ? "first" : "last",
                      (unsigned long long)h.seq);
            CHECK_EQ_INT(h.rank, 3);
            CHECK_EQ_INT(h.key, 99);
            CHECK_EQ_INT(h.chunk, 7);
            CHECK_EQ_INT(h.version, cases[i].want == PS_EVERSION ? 0 : PS_PROTO_VERSION);
        }
    /* the error reply to a negative q carries it back as a negative integer */
    ps_header e;
    ps_header_init(&e, PS_MSG_ERROR);
    e.flags = PS_FLAG_REPLY;
    e.seq = (uint64_t)(int64_t)-45;
    e.seq_negative = 1;
    e.err_code = PS_EPROTO;
    char buf[PS_HEADER_MAX];
    size_t len;
    CHECK_OK(ps_proto_encode(&e, buf, sizeof buf, &len));
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, buf, len, NULL) == MSGPACK_UNPACK_SUCCESS);
    int64_t q = 0;
    int found = 0;
    for (uint32_t i = 0; i < u.data.via.map.size; i++) {
        msgpack_object_kv *kv = &u.data.via.map.ptr[i];
        if (kv->key.via.str.size == 1 && kv->key.via.str.ptr[0] == 'q' &&
            kv->val.type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            q = kv->val.via.i64;
            found = 1;
        }
    }
    msgpack_unpacked_destroy(&u);
    CHECK(found);
    CHECK_EQ_INT(q, -45);
}

PS_TEST(hello_and_admin_tokens_round_trip_and_bad_admin_tokens_are_refused)
{
    ps_header a, b;
    full(&a, PS_MSG_HELLO, 0);
    a.hello.mode = 2;
    a.hello.num_workers = 3;
    a.hello.num_servers = 1;
    a.hello.token = 0x0123456789abcdefull;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.hello.token, 0x0123456789abcdefull);
    full(&a, PS_MSG_SHUTDOWN, 0);
    snprintf(a.admin, sizeof a.admin, "s3cret-T0ken_with.punct!");
    CHECK_OK(rt(&a, &b));
    CHECK(strcmp(b.admin, a.admin) == 0);
    /* not printable, or too long: refused */
    char why[256];
    mk m;
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_SHUTDOWN);
    mk_key(&m, "adm");
    msgpack_pack_str(&m.pk, 3);
    msgpack_pack_str_body(&m.pk, "a\nb", 3);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);
    char longer[PS_ADMIN_TOKEN_MAX + 2];
    memset(longer, 'x', sizeof longer);
    mk_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mk_u(&m, "v", 1);
    mk_u(&m, "t", PS_MSG_SHUTDOWN);
    mk_key(&m, "adm");
    msgpack_pack_str(&m.pk, sizeof longer);
    msgpack_pack_str_body(&m.pk, longer, sizeof longer);
    CHECK_EQ_INT(dec(&m, why, sizeof why), PS_EPROTO);
    mk_free(&m);
}

/* Replicas: a primary's hello carries its config, the group's epoch and its
 * member; the stream's flag and a snapshot piece's position come back; a
 * PS_ENOTPRIMARY error names the primary and the epoch. */
PS_TEST(replica_fields_round_trip)
{
    ps_header a, b;
    ps_header_init(&a, PS_MSG_REPL_HELLO);
    a.epoch = 7;
    a.member = 1;
    a.hello.mode = PS_MODE_ASYNC;
    a.hello.num_workers = 3;
    a.hello.num_servers = 2;
    a.hello.max_staleness = -1;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.epoch, 7);
    CHECK_EQ_INT(b.member, 1);
    CHECK_EQ_INT(b.hello.num_workers, 3);
    ps_header_init(&a, PS_MSG_PUSH);
    a.flags = PS_FLAG_REPL;
    a.rank = 1;
    a.epoch = 9;
    a.count = 4;
    a.dtype = PS_DTYPE_F32;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.flags, PS_FLAG_REPL);
    CHECK_EQ_INT(b.epoch, 9);
    CHECK_EQ_INT(b.stream_pos, 0); /* only a snapshot piece has one */
    ps_header_init(&a, PS_MSG_ERROR);
    a.flags = PS_FLAG_REPLY;
    a.seq = 5;
    a.err_code = PS_ENOTPRIMARY;
    snprintf(a.err_text, sizeof a.err_text, "go to member 2");
    a.epoch = 3;
    a.member = 2;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.err_code, PS_ENOTPRIMARY);
    CHECK_EQ_INT(b.member, 2);
    CHECK_EQ_INT(b.epoch, 3);
    /* a member is 0, 1 or 2 */
    char why[256];
    CHECK_EQ_INT(one_field("mb", X_U, 3, why, sizeof why), PS_EPROTO);
}

/* Moved objects: a PS_EMOVED error names the slot and endpoint that hold the
 * object now (and nothing else does); a table request with flag AWAY names
 * its partition's home and is refused without it. */
PS_TEST(moved_fields_round_trip_only_where_they_mean_something)
{
    ps_header a, b;
    ps_header_init(&a, PS_MSG_ERROR);
    a.flags = PS_FLAG_REPLY;
    a.seq = 6;
    a.err_code = PS_EMOVED;
    a.slot = 3;
    snprintf(a.owner_ep, sizeof a.owner_ep, "tcp://127.0.0.1:4567");
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.err_code, PS_EMOVED);
    CHECK_EQ_INT(b.slot, 3);
    CHECK_STR(b.owner_ep, "tcp://127.0.0.1:4567");
    a.err_code = PS_ENOTFOUND; /* another error: no place in it */
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.slot, -1);
    CHECK_STR(b.owner_ep, "");
    ps_header_init(&a, PS_MSG_SPULL);
    a.key = 9;
    a.chunk = 1;
    a.dim = 4;
    a.flags = PS_FLAG_AWAY;
    a.home = 2;
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.home, 2);
    a.flags = 0; /* at home: no hs sent, none read */
    CHECK_OK(rt(&a, &b));
    CHECK_EQ_INT(b.home, -1);
    char why[256];
    CHECK_EQ_INT(one_field("sl", X_U, PS_MAX_SERVERS, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(one_field("f", X_U, PS_FLAG_AWAY, why, sizeof why), PS_EPROTO);
    CHECK(strstr(why, "'hs'") != NULL);
}
