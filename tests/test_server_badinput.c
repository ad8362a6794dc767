/* ps_server against bad input: malformed and hostile messages from a raw
 * ZeroMQ DEALER, floods of garbage, bad flags, and the ways it stops.
 * A message with a decodable header must get an ERROR reply with the right
 * code; an undecodable one must get no reply (checked by sending a heartbeat
 * right after it: the next reply must be the heartbeat's); the server must keep
 * serving a correct client and keep its memory bounded. */
#include <msgpack.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

/* ---------------- helpers ---------------- */

static size_t enc(const ps_header *h, char *buf)
{
    size_t len = 0;
    ps_proto_encode(h, buf, PS_HEADER_MAX, &len);
    return len;
}

/* Send frames as given (a NULL data with len 0 is an empty frame). */
static int send_frames(void *s, int n, const void *const *data, const size_t *len)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(s, data[i], len[i], i < n - 1 ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    return 0;
}

/* Send h and, when not NULL, a payload of any length as it is: count and
 * dtype are what h says, so the two may disagree. */
static int send_raw(void *s, const ps_header *h, const void *payload, size_t bytes)
{
    char buf[PS_HEADER_MAX];
    size_t len = enc(h, buf);
    const void *d[2] = {buf, payload};
    size_t l[2] = {len, bytes};
    return send_frames(s, payload ? 2 : 1, d, l);
}

/* The next reply on s must be the heartbeat we send now: nothing came back
 * for whatever was sent before it.  0 when so. */
static int only_heartbeat_follows(void *s, int rank, uint64_t seq)
{
    ps_header h = ps_test_header(PS_MSG_HEARTBEAT, rank, seq, 0, 0, 0), r;
    if (send_raw(s, &h, NULL, 0) || ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL))
        return -1;
    return r.type == PS_MSG_HEARTBEAT && r.seq == seq ? 0 : -1;
}

/* A correct client's whole round trip still works (as worker 1: the tests
 * hold rank 0 on a connection of their own). */
static int correct_client_works(const ps_test_server *sv, uint64_t key)
{
    void *s = ps_test_dealer(sv->port);
    int ok = 0;
    float w[5] = {1, 2, 3, 4, 5}, g[5] = {1, 1, 1, 1, 1}, out[5];
    ps_header h, r;
    size_t got;
    if (ps_test_hello(s, 1, PS_MODE_ASYNC, 2, -1) == 0) {
        h = ps_test_header(PS_MSG_INIT, 1, 2, key, 0, 0);
        h.total = 5;
        if (ps_test_rpc(s, &h, w, 5, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_INIT) {
            h = ps_test_header(PS_MSG_PUSH, 1, 3, key, 0, 0);
            if (ps_test_rpc(s, &h, g, 5, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_PUSH) {
                h = ps_test_header(PS_MSG_PULL, 1, 4, key, 0, 0);
                ok = ps_test_rpc(s, &h, NULL, 0, &r, out, 5, &got) == 0 &&
                     r.type == PS_MSG_PULL && got == 5 && out[0] == 1.0f - 0.01f * 1.0f &&
                     out[4] == 5.0f - 0.01f;
            }
        }
    }
    zmq_close(s);
    return ok ? 0 : -1;
}

/* msgpack maps with arbitrary field types */
typedef struct kv {
    const char *k;
    char kind; /* 'u' uint, 'i' int, 's' string, 'f' float */
    uint64_t u;
    int64_t i;
    const char *s;
} kv;

static size_t pack(char *buf, size_t cap, const kv *f, int n)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    for (int j = 0; j < n; j++) {
        msgpack_pack_str(&pk, strlen(f[j].k));
        msgpack_pack_str_body(&pk, f[j].k, strlen(f[j].k));
        switch (f[j].kind) {
        case 'u': msgpack_pack_uint64(&pk, f[j].u); break;
        case 'i': msgpack_pack_int64(&pk, f[j].i); break;
        case 'f': msgpack_pack_double(&pk, 1.5); break;
        default:
            msgpack_pack_str(&pk, strlen(f[j].s));
            msgpack_pack_str_body(&pk, f[j].s, strlen(f[j].s));
        }
    }
    size_t len = sb.size < cap ? sb.size : cap;
    memcpy(buf, sb.data, len);
    msgpack_sbuffer_destroy(&sb);
    return len;
}

/* ---------------- cases ---------------- */

PS_TEST(undecodable_headers_are_dropped_without_reply)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 2 --quiet"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 2, -1));
    char good[PS_HEADER_MAX];
    ps_header gh = ps_test_header(PS_MSG_PULL, 0, 5, 1, 0, 0);
    size_t glen = enc(&gh, good);
    static char big[1 << 20];
    memset(big, 0x81, sizeof big);
    struct {
        const char *name;
        const void *data;
        size_t len;
    } cases[] = {
#define LIT(x) x, sizeof(x) - 1
        {"garbage bytes", LIT("\xc1\x17\xff\x00garbage\x01\x02")},
        {"truncated msgpack", good, glen / 2},
        {"not a map (array)", LIT("\x93\x01\x02\x03")},
        {"not a map (int)", LIT("\x05")},
        {"map declaring 2^32-1 entries in 10 bytes", LIT("\xdf\xff\xff\xff\xff\xa1v\x01\xa1t")},
        {"array declaring 65535 entries", LIT("\xdc\xff\xff\x01\x02")},
        {"1 MiB header frame", big, sizeof big},
        {"empty header frame", "", 0},
        {"map without version", LIT("\x81\xa1t\x03")},
        {"trailing bytes", LIT("\x81\xa1v\x01\x00")},
        {"nesting deeper than 4", LIT("\x81\xa1v\x91\x91\x91\x91\x91\x01")},
#undef LIT
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const void *d[1] = {cases[i].data};
        size_t l[1] = {cases[i].len};
        CHECK_OK(send_frames(s, 1, d, l));
        CHECK_MSG(only_heartbeat_follows(s, 0, 100 + i) == 0, "%s got a reply", cases[i].name);
    }
    /* bad header plus a payload frame: still dropped */
    {
        const void *d[2] = {"\x93\x01\x02\x03", "abcd"};
        size_t l[2] = {4, 4};
        CHECK_OK(send_frames(s, 2, d, l));
        CHECK_OK(only_heartbeat_follows(s, 0, 200));
    }
    CHECK_OK(correct_client_works(&sv, 77));
    char *log = ps_test_read_file(sv.log, NULL);
    CHECK(log && strstr(log, "dropped a message with no usable header"));
    free(log);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(s);
}

PS_TEST(bad_requests_get_error_replies_with_the_right_code)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 2 --quiet"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 2, -1));
    ps_header r;
    char buf[PS_HEADER_MAX];
    float pay[4] = {1, 2, 3, 4};
    size_t len;

    /* a registered chunk to aim at */
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 10, 0, 0);
    h.count = 4;
    h.dtype = PS_DTYPE_F32;
    h.total = 4;
    CHECK_OK(send_raw(s, &h, pay, sizeof pay));
    CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);

#define EXPECT_ERROR(code, seqv)                                                       \
    do {                                                                               \
        CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));                  \
        CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == (code) && r.seq == (seqv),   \
                  "expected error %d for q=%d, got type %u code %d q=%llu (%s)",       \
                  (int)(code), (int)(seqv), r.type, r.err_code,                        \
                  (unsigned long long)r.seq, r.err_text);                              \
        CHECK(r.err_text[0] != 0);                                                     \
    } while (0)

    /* wrong field type: key is a string */
    kv f1[] = {{"v", 'u', 1, 0, 0}, {"t", 'u', 3, 0, 0}, {"q", 'u', 11, 0, 0},
               {"r", 'i', 0, 0, 0}, {"k", 's', 0, 0, "ten"}};
    len = pack(buf, sizeof buf, f1, 5);
    CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
    EXPECT_ERROR(PS_EPROTO, 11);
    CHECK(strstr(r.err_text, "'k'"));
    /* wrong type: rank is a float */
    kv f1b[] = {{"v", 'u', 1, 0, 0}, {"t", 'u', 4, 0, 0}, {"q", 'u', 12, 0, 0},
                {"r", 'f', 0, 0, 0}};
    len = pack(buf, sizeof buf, f1b, 4);
    CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
    EXPECT_ERROR(PS_EPROTO, 12);
    /* unknown message type */
    kv f2[] = {{"v", 'u', 1, 0, 0}, {"q", 'u', 13, 0, 0}, {"t", 'u', 42, 0, 0},
               {"r", 'i', 0, 0, 0}};
    len = pack(buf, sizeof buf, f2, 4);
    CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
    EXPECT_ERROR(PS_EPROTO, 13);
    /* no type at all */
    kv f2b[] = {{"v", 'u', 1, 0, 0}, {"q", 'u', 14, 0, 0}};
    len = pack(buf, sizeof buf, f2b, 2);
    CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
    EXPECT_ERROR(PS_EPROTO, 14);
    /* wrong protocol version */
    kv f3[] = {{"v", 'u', 2, 0, 0}, {"t", 'u', 4, 0, 0}, {"q", 'u', 15, 0, 0}};
    len = pack(buf, sizeof buf, f3, 3);
    CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
    CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_EVERSION);
    /* a declaration whose `tb` nests 5 deep: answered, naming the field */
    static const char deep_tb[] = "\x86\xa1v\x01\xa1t\x0b\xa1q\x32\xa1r\x00\xa1k\x07"
                                  "\xa2tb\x81\xa3" "dim\x91\x91\x91\x91\x01";
    CHECK_OK(send_frames(s, 1, (const void *[]){deep_tb}, (size_t[]){sizeof deep_tb - 1}));
    EXPECT_ERROR(PS_EPROTO, 50);
    CHECK_MSG(strstr(r.err_text, "field 'tb' nests deeper"), "%s", r.err_text);
    CHECK_EQ_INT(r.key, 7);
    /* absurd count: 2^40 elements (out of the field's range) */
    kv f4[] = {{"v", 'u', 1, 0, 0}, {"t", 'u', 3, 0, 0}, {"q", 'u', 16, 0, 0},
               {"r", 'i', 0, 0, 0}, {"k", 'u', 10, 0, 0}, {"n", 'u', 1ull << 40, 0, 0},
               {"d", 'u', 1, 0, 0}};
    len = pack(buf, sizeof buf, f4, 7);
    CHECK_OK(send_frames(s, 2, (const void *[]){buf, pay}, (size_t[]){len, 16}));
    EXPECT_ERROR(PS_EPROTO, 16);
    /* 2^29 float32 elements = 2 GiB, over the 1 GiB payload limit */
    f4[2].u = 17;
    f4[5].u = 1ull << 29;
    len = pack(buf, sizeof buf, f4, 7);
    CHECK_OK(send_frames(s, 2, (const void *[]){buf, pay}, (size_t[]){len, 16}));
    EXPECT_ERROR(PS_ETOOBIG, 17);

    /* frames that do not match the header */
    h = ps_test_header(PS_MSG_PUSH, 0, 20, 10, 0, 0);
    h.count = 4;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(send_raw(s, &h, pay, 12)); /* 12 bytes for 4 floats */
    EXPECT_ERROR(PS_EPROTO, 20);
    h.seq = 21;
    CHECK_OK(send_raw(s, &h, NULL, 0)); /* missing payload frame */
    EXPECT_ERROR(PS_EPROTO, 21);
    h.seq = 22;
    len = enc(&h, buf);
    CHECK_OK(send_frames(s, 3, (const void *[]){buf, pay, pay}, (size_t[]){len, 16, 16}));
    EXPECT_ERROR(PS_EPROTO, 22); /* two payload frames */
    ps_header p = ps_test_header(PS_MSG_PULL, 0, 23, 10, 0, 0);
    CHECK_OK(send_raw(s, &p, pay, 16)); /* a pull carries no payload */
    EXPECT_ERROR(PS_EPROTO, 23);
    h.seq = 24;
    h.dtype = 0;
    CHECK_OK(send_raw(s, &h, pay, 16)); /* payload without a dtype */
    EXPECT_ERROR(PS_EPROTO, 24);

    /* semantics */
    h = ps_test_header(PS_MSG_PUSH, 0, 30, 999, 0, 0); /* unknown key */
    h.count = 4;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(send_raw(s, &h, pay, 16));
    EXPECT_ERROR(PS_ENOTFOUND, 30);
    CHECK_EQ_INT(r.key, 999);
    h = ps_test_header(PS_MSG_PULL, 0, 31, 10, 5, 0); /* unknown chunk */
    CHECK_OK(send_raw(s, &h, NULL, 0));
    EXPECT_ERROR(PS_ENOTFOUND, 31);
    /* consistent frames, wrong length for the chunk */
    h = ps_test_header(PS_MSG_PUSH, 0, 32, 10, 0, 0);
    h.count = 3;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(send_raw(s, &h, pay, 12));
    EXPECT_ERROR(PS_EPROTO, 32);
    h = ps_test_header(PS_MSG_INIT, 0, 33, 10, 0, 0); /* init of an existing chunk, other length */
    h.count = 3;
    h.dtype = PS_DTYPE_F32;
    h.total = 3;
    CHECK_OK(send_raw(s, &h, pay, 12));
    EXPECT_ERROR(PS_EMISMATCH, 33);
    h = ps_test_header(PS_MSG_PUSH, 2, 34, 10, 0, 0); /* rank >= num-workers */
    h.count = 4;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(send_raw(s, &h, pay, 16));
    EXPECT_ERROR(PS_EPROTO, 34);
    CHECK(strstr(r.err_text, "num-workers"));
    h.rank = -1; /* not a worker */
    h.seq = 35;
    CHECK_OK(send_raw(s, &h, pay, 16));
    EXPECT_ERROR(PS_ESTATE, 35);
    h.rank = 0; /* a negative step */
    h.push_step = -1;
    h.seq = 36;
    CHECK_OK(send_raw(s, &h, pay, 16));
    EXPECT_ERROR(PS_EPROTO, 36);
    ps_header e = ps_test_header(PS_MSG_ERROR, 0, 37, 0, 0, 0); /* error is reply-only */
    CHECK_OK(send_raw(s, &e, NULL, 0));
    EXPECT_ERROR(PS_EPROTO, 37);
    ps_header rep = ps_test_header(PS_MSG_PULL, 0, 38, 10, 0, 0); /* a reply sent to the server */
    rep.flags = PS_FLAG_REPLY;
    CHECK_OK(send_raw(s, &rep, NULL, 0));
    EXPECT_ERROR(PS_EPROTO, 38);

    /* before hello, from another connection and rank */
    void *s2 = ps_test_dealer(sv.port);
    h = ps_test_header(PS_MSG_PUSH, 1, 40, 10, 0, 0);
    h.count = 4;
    h.dtype = PS_DTYPE_F32;
    CHECK_OK(send_raw(s2, &h, pay, 16));
    CHECK_OK(ps_test_recv(s2, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_EHELLO);
    CHECK(strstr(r.err_text, "hello"));
    zmq_close(s2);

    CHECK_OK(correct_client_works(&sv, 78));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(s);
}

/* The next reply's q (as the integer it was sent as), type and error code,
 * read with msgpack itself: a reply to a negative q does not pass
 * ps_proto_decode (q is unsigned there).  0, or -1 when none came. */
static int recv_q(void *s, int64_t *q, uint64_t *type, int64_t *ec)
{
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, PS_TEST_RPC_MS) <= 0)
        return -1;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0)
        return -1;
    while (zmq_msg_more(&m)) { /* only the header counts here */
        zmq_msg_t x;
        zmq_msg_init(&x);
        zmq_msg_recv(&x, s, 0);
        int more = zmq_msg_more(&x);
        zmq_msg_close(&x);
        if (!more)
            break;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = -1;
    *q = -1;
    *type = 0;
    *ec = 0;
    if (msgpack_unpack_next(&u, zmq_msg_data(&m), zmq_msg_size(&m), NULL) ==
            MSGPACK_UNPACK_SUCCESS && u.data.type == MSGPACK_OBJECT_MAP) {
        rc = 0;
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object_kv *kv = &u.data.via.map.ptr[i];
            const char *k = kv->key.via.str.ptr;
            size_t kl = kv->key.via.str.size;
            int64_t v = kv->val.type == MSGPACK_OBJECT_NEGATIVE_INTEGER
                            ? kv->val.via.i64
                            : (int64_t)kv->val.via.u64;
            if (kl == 1 && k[0] == 'q')
                *q = v;
            else if (kl == 1 && k[0] == 't')
                *type = (uint64_t)v;
            else if (kl == 2 && !memcmp(k, "ec", 2))
                *ec = v;
        }
    }
    msgpack_unpacked_destroy(&u);
    zmq_msg_close(&m);
    return rc;
}

PS_TEST(every_error_reply_echoes_the_requests_q)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 2 --quiet"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 2, -1));
    char buf[PS_HEADER_MAX];
    /* each refused for one field, with q after the field that fails (the
     * decoder used to stop at the first bad field and answer q=0, which a
     * client drops: it waited for its timeout instead of seeing the error) */
    struct { kv f[4]; int want; } cases[] = {
        {{{"v", 'u', 2, 0, 0}, {"t", 'u', 4, 0, 0}, {"r", 'i', 0, 0, 0}, {"q", 'u', 501, 0, 0}},
         PS_EVERSION},
        {{{"v", 'u', 1, 0, 0}, {"t", 'u', 0, 0, 0}, {"r", 'i', 0, 0, 0}, {"q", 'u', 502, 0, 0}},
         PS_EPROTO},
        {{{"v", 'u', 1, 0, 0}, {"t", 'u', 11, 0, 0}, {"r", 'i', 0, 0, 0}, {"q", 'u', 503, 0, 0}},
         PS_EPROTO},
        {{{"v", 'u', 1, 0, 0}, {"t", 'u', 4, 0, 0}, {"f", 'u', 2, 0, 0}, {"q", 'u', 504, 0, 0}},
         PS_EPROTO},
        {{{"v", 'u', 1, 0, 0}, {"t", 'u', 4, 0, 0}, {"r", 'i', 0, 0, 0}, {"q", 'i', 0, -505, 0}},
         PS_EPROTO},
        {{{"v", 'u', 1, 0, 0}, {"t", 'u', 4, 0, 0}, {"s", 'i', 0, -9, 0}, {"q", 'u', 506, 0, 0}},
         PS_EPROTO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = pack(buf, sizeof buf, cases[i].f, 4);
        CHECK_OK(send_frames(s, 1, (const void *[]){buf}, (size_t[]){len}));
        int64_t q, ec;
        uint64_t type;
        CHECK_OK(recv_q(s, &q, &type, &ec));
        int64_t want_q = cases[i].f[3].kind == 'i' ? cases[i].f[3].i : (int64_t)cases[i].f[3].u;
        CHECK_MSG(q == want_q && type == PS_MSG_ERROR && ec == cases[i].want,
                  "case %zu: reply q=%lld type %llu ec %lld, expected q=%lld error %d", i,
                  (long long)q, (unsigned long long)type, (long long)ec, (long long)want_q,
                  cases[i].want);
    }
    CHECK_OK(only_heartbeat_follows(s, 0, 600));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(s);
}

/* ps_test_server_start for a test of the server's RSS: under
 * AddressSanitizer freed memory sits in a 256 MiB quarantine and would read
 * as growth; keep it small for the server (ignored otherwise). */
static int start_for_rss(ps_test_server *sv, const char *words)
{
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan ? strdup(asan) : NULL, opts[512];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=4:thread_local_quarantine_size_kb=64",
             asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    int spawned = ps_test_server_start(sv, 1, words);
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
    return spawned;
}

PS_TEST(garbage_flood_keeps_rss_bounded_and_logs_rate_limited)
{
    ps_test_server sv;
    CHECK_OK(start_for_rss(&sv, "--mode async --num-workers 2 --threads 2"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 2, -1));
    ps_header bad = ps_test_header(PS_MSG_PUSH, 0, 1, 4242, 0, 0); /* unknown key: an error reply */
    bad.count = 8;
    bad.dtype = PS_DTYPE_F32;
    char bh[PS_HEADER_MAX], junk[512];
    size_t bhl = enc(&bad, bh);
    float pay[8] = {0};
    uint64_t rng = 99;
    long rss0 = 0;
    int replies = 0;
    for (int round = 0; round < 2; round++) {
        int n = round == 0 ? 2000 : 20000;
        for (int i = 0; i < n; i++) {
            if (i % 4 == 3) { /* decodable: answered with an error */
                CHECK_OK(send_frames(s, 2, (const void *[]){bh, pay}, (size_t[]){bhl, 32}));
                replies++;
            } else { /* random bytes of random length, sometimes several frames */
                size_t len = 1 + (size_t)(rng % sizeof junk);
                for (size_t j = 0; j < len; j++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    junk[j] = (char)(rng >> 56);
                }
                int nf = 1 + (int)(rng % 3);
                CHECK_OK(send_frames(s, nf, (const void *[]){junk, junk, junk},
                                     (size_t[]){len, len / 2, 7}));
            }
            if (i % 500 == 499) /* drain the error replies as we go */
                while (replies > 0) {
                    ps_header r;
                    CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
                    CHECK_EQ_INT(r.err_code, PS_ENOTFOUND);
                    replies--;
                }
        }
        while (replies > 0) {
            ps_header r;
            CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
            replies--;
        }
        CHECK_OK(only_heartbeat_follows(s, 0, 500 + (uint64_t)round));
        if (round == 0)
            rss0 = ps_test_status_kb(sv.pid, "VmRSS");
    }
    long rss1 = ps_test_status_kb(sv.pid, "VmRSS");
    CHECK(rss0 > 0 && rss1 > 0);
    printf("# server RSS %ld kB after 2000 bad messages, %ld kB after 20000 more\n", rss0, rss1);
    CHECK_MSG(rss1 - rss0 < 8 * 1024, "RSS grew from %ld kB to %ld kB over 20000 bad messages",
              rss0, rss1);
    CHECK_OK(correct_client_works(&sv, 79));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    /* one line per refused message would be 22000 lines */
    char *log = ps_test_read_file(sv.log, NULL);
    CHECK(log);
    int lines = 0;
    for (char *p = log; *p; p++)
        lines += *p == '\n';
    int summarized = strstr(log, "not logged") != NULL;
    int totals = strstr(log, "stopped:") != NULL;
    free(log);
    CHECK_MSG(lines < 300, "%d log lines", lines);
    CHECK(summarized);
    CHECK(totals);
    zmq_close(s);
}

/* A hello as worker `rank` of 2 (async) carrying `token`: the reply, whose
 * hello.token is the rank's token when accepted. */
static int hello_tok(void *s, int rank, uint64_t token, uint64_t seq, ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_HELLO, rank, seq, 0, 0, 0);
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.max_staleness = -1;
    h.hello.num_workers = 2;
    h.hello.num_servers = 1;
    h.hello.token = token;
    if (send_raw(s, &h, NULL, 0))
        return -1;
    return ps_test_recv(s, PS_TEST_RPC_MS, r, NULL, 0, NULL);
}

static int push_step(void *s, int rank, uint64_t seq, uint64_t key, int64_t step, ps_header *r)
{
    float g[4] = {0, 0, 0, 0};
    ps_header h = ps_test_header(PS_MSG_PUSH, rank, seq, key, 0, step);
    return ps_test_rpc(s, &h, g, 4, r, NULL, 0, NULL);
}

PS_TEST(a_live_rank_cannot_be_taken_and_an_async_push_cannot_skip_steps)
{
    ps_test_server sv; /* a worker timeout of 30 s: the hold window is 30 s */
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 2 --worker-timeout 30"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    ps_header r;
    CHECK_OK(hello_tok(a, 0, 0, 1, &r));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    uint64_t tok = r.hello.token;
    CHECK(tok != 0);
    float w[4] = {1, 2, 3, 4};
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 2, 5, 0, 0);
    h.total = 4;
    CHECK_OK(ps_test_rpc(a, &h, w, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    CHECK_OK(push_step(a, 0, 3, 5, 0, &r));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(r.chunk_version, 1);
    /* another connection says it is worker 0: refused, with or without a
     * made-up token */
    CHECK_OK(hello_tok(b, 0, 0, 10, &r));
    CHECK_EQ_INT(r.err_code, PS_ESTATE);
    CHECK_EQ_INT(r.seq, 10);
    CHECK(strstr(r.err_text, "held by another connection"));
    CHECK_OK(hello_tok(b, 0, tok ^ 1, 11, &r));
    CHECK_EQ_INT(r.err_code, PS_ESTATE);
    /* the spoofed push of the issue: refused, as b does not hold rank 0 ... */
    CHECK_OK(push_step(b, 0, 12, 5, ((int64_t)1 << 62) - 1, &r));
    CHECK_EQ_INT(r.err_code, PS_EPERM);
    CHECK(strstr(r.err_text, "worker 0 is held by another connection"));
    /* ... and from the holder itself step 2^62-1 would have frozen the chunk */
    CHECK_OK(push_step(a, 0, 12, 5, ((int64_t)1 << 62) - 1, &r));
    CHECK_EQ_INT(r.err_code, PS_ESTATE);
    CHECK(strstr(r.err_text, "next step is 1"));
    CHECK_OK(push_step(a, 0, 13, 5, 2, &r)); /* one ahead is a skip too */
    CHECK_EQ_INT(r.err_code, PS_ESTATE);
    CHECK_OK(push_step(a, 0, 14, 5, 1, &r)); /* the real worker goes on */
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(r.chunk_version, 2);
    /* duplicates, many: dropped, and said in the log */
    for (int i = 0; i < 150; i++) {
        CHECK_OK(push_step(a, 0, 100 + (uint64_t)i, 5, 0, &r));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    }
    /* the same worker on a new connection proves itself with its token */
    CHECK_OK(hello_tok(b, 0, tok, 15, &r));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    CHECK_EQ_INT(r.hello.token, tok);
    /* a connection that closed frees its rank at once (well inside the 30 s
     * window): a worker restarted after a crash gets its rank back */
    CHECK_OK(hello_tok(b, 1, 0, 16, &r));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    zmq_close(b);
    void *c = ps_test_dealer(sv.port);
    int took = 0;
    for (int t = 0; t < 40 && !took; t++) { /* the close reaches the server in a few ms */
        CHECK_OK(hello_tok(c, 1, 0, 20 + (uint64_t)t, &r));
        took = r.type == PS_MSG_HELLO;
        if (!took)
            ps_test_sleep_ms(50);
    }
    CHECK_MSG(took, "worker 1's rank was not freed when its connection closed");
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    char *log = ps_test_read_file(sv.log, NULL);
    CHECK(log);
    int refused = strstr(log, "refused a hello for worker 0 from rank 0, routing id ") != NULL;
    int first = strstr(log, "worker 0: push of step 0 to key 5 chunk 0 is a duplicate") != NULL;
    int summed = strstr(log, "worker 0: 150 duplicate pushes dropped in the last") != NULL;
    /* 2, or more when a retry above came before the close did */
    int total = strstr(log, "hellos refused (rank held by another connection)") != NULL;
    free(log);
    CHECK(refused);
    CHECK(first);
    CHECK_MSG(summed, "no summary of the duplicates in %s", sv.log);
    CHECK(total);
    zmq_close(a);
    zmq_close(c);
}

static int flag_case(const char *words, int with_bind, const char *expect)
{
    ps_test_server sv;
    if (ps_test_server_start(&sv, with_bind, words) != 0)
        return -1;
    int rc = ps_test_wait(sv.pid, PS_TEST_RPC_MS);
    char *out = ps_test_read_file(sv.log, NULL);
    int ok = rc == 2 && out && strstr(out, expect);
    if (!ok)
        printf("# flag case: exit %d, output '%s', expected '%s'\n", rc, out ? out : "",
               expect);
    free(out);
    return ok ? 0 : -1;
}

PS_TEST(bad_flags_exit_2_with_a_clear_message)
{
    CHECK_OK(flag_case("--num-workers 0", 1,
                       "ps_server: --num-workers must be an integer in [1, 65536], got '0'"));
    CHECK_OK(flag_case("--mode bsp", 1, "--mode must be sync or async, got 'bsp'"));
    CHECK_OK(flag_case("--lr fast", 1, "--lr must be a number in"));
    CHECK_OK(flag_case("--lr -1", 1, "got '-1'"));
    CHECK_OK(flag_case("--threads 0", 1, "--threads must be an integer in [1, 64]"));
    CHECK_OK(flag_case("--optimizer rmsprop", 1, "got 'rmsprop'"));
    CHECK_OK(flag_case("--frobnicate", 1, "unknown flag '--frobnicate'"));
    CHECK_OK(flag_case("--num-workers 2", 0, "--bind is required"));
    CHECK_OK(flag_case("--rank 2 --num-servers 2", 1, "--rank must be"));
    CHECK_OK(flag_case("--max-memory 12Q", 1, "--max-memory must be a size"));
    CHECK_OK(flag_case("--beta2 1", 1, "--beta2 must be a number in [0, 1)"));
    CHECK_OK(flag_case("--eps 0", 1, "--eps must be a number in (0, 1]"));
    CHECK_OK(flag_case("--mode sync --max-staleness 3", 1,
                       "--max-staleness must be 0 in sync mode"));
    CHECK_OK(flag_case("--max-staleness -2", 1, "--max-staleness must be an integer"));
    CHECK_OK(flag_case("--lr", 1, "--lr needs a value"));
    CHECK_OK(flag_case("stray", 1, "unexpected argument 'stray'"));
    CHECK_OK(flag_case("--on-checkpoint-failure panic", 1,
                       "--on-checkpoint-failure must be stall[:S], continue or exit[:S]"));
    CHECK_OK(flag_case("--on-checkpoint-failure stall:x", 1, "got 'stall:x'"));
    CHECK_OK(flag_case("--max-peer-replies 0", 1, "--max-peer-replies must be an integer"));
}

PS_TEST(help_documents_every_flag_and_version_prints)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 0, "--help"));
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 0);
    char *out = ps_test_read_file(sv.log, NULL);
    CHECK(out);
    static const char *flags[] = {"--bind", "--rank", "--num-servers", "--num-workers", "--mode",
                                  "--max-staleness", "--optimizer", "--lr", "--momentum",
                                  "--beta1", "--beta2", "--eps", "--weight-decay", "--threads",
                                  "--max-memory", "--verbose", "--quiet", "--help", "--version",
                                  "--admin-token-file", "--max-peer-replies", "--max-peer-bytes",
                                  "--on-checkpoint-failure", "--table-memory-per-worker",
                                  "--max-tables"};
    int missing = -1;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(out, flags[i]))
            missing = (int)i;
    int defaults = strstr(out, "default 0.01") && strstr(out, "MemAvailable") &&
                   strstr(out, "default sync") && strstr(out, "default 0.999");
    free(out);
    CHECK_MSG(missing < 0, "--help does not mention %s", flags[missing]);
    CHECK(defaults);
    CHECK_OK(ps_test_server_start(&sv, 0, "--version"));
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 0);
    out = ps_test_read_file(sv.log, NULL);
    int has = out && strstr(out, "ps_server " PS_VERSION);
    free(out);
    CHECK(has);
}

PS_TEST(exits_0_on_sigterm)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --threads 3"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    char *log = ps_test_read_file(sv.log, NULL);
    int ok = log && strstr(log, "stop requested") && strstr(log, "stopped:") &&
             strstr(log, "listening on tcp://127.0.0.1:");
    free(log);
    CHECK(ok);
    zmq_close(s);
}

/* A SHUTDOWN from rank -1 on connection s with token adm ("" none): its reply. */
static int shutdown_rpc(void *s, uint64_t seq, const char *adm, ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_SHUTDOWN, -1, seq, 0, 0, 0);
    snprintf(h.admin, sizeof h.admin, "%s", adm);
    if (send_raw(s, &h, NULL, 0))
        return -1;
    return ps_test_recv(s, PS_TEST_RPC_MS, r, NULL, 0, NULL);
}

PS_TEST(shutdown_is_refused_by_default_and_each_refusal_names_the_peer)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --threads 2"));
    void *s = ps_test_dealer(sv.port);
    ps_header r;
    /* anyone who can connect, no hello needed: used to stop the server */
    CHECK_OK(shutdown_rpc(s, 9, "", &r));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    CHECK_EQ_INT(r.seq, 9);
    CHECK(strstr(r.err_text, "SIGTERM"));
    /* a token does not help a server that takes none */
    CHECK_OK(shutdown_rpc(s, 10, PS_TEST_ADMIN_TOKEN, &r));
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    /* nor does saying hello as a worker first */
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
    ps_header h = ps_test_header(PS_MSG_SHUTDOWN, 0, 11, 0, 0, 0);
    CHECK_OK(send_raw(s, &h, NULL, 0));
    CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    CHECK_OK(only_heartbeat_follows(s, -1, 12)); /* still serving */
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0); /* signals do stop it */
    char *log = ps_test_read_file(sv.log, NULL);
    CHECK(log);
    int named = strstr(log, "refused a shutdown from rank -1, routing id ") != NULL &&
                strstr(log, "refused a shutdown from rank 0, routing id ") != NULL &&
                strstr(log, "stops on signals only") != NULL;
    free(log);
    CHECK(named);
    zmq_close(s);
}

PS_TEST(shutdown_with_the_admin_token_stops_the_server_and_a_wrong_one_is_refused)
{
    const char *tf = ps_test_token_file("admin.token", PS_TEST_ADMIN_TOKEN, 0600);
    CHECK(tf);
    char words[800];
    snprintf(words, sizeof words, "--threads 2 --admin-token-file %s", tf);
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    void *s = ps_test_dealer(sv.port);
    ps_header r;
    CHECK_OK(shutdown_rpc(s, 20, "", &r));
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    CHECK_EQ_INT(r.seq, 20);
    CHECK(strstr(r.err_text, "no admin token"));
    CHECK_OK(shutdown_rpc(s, 21, "test-admin-token-0123456789abcdeX", &r));
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    CHECK(strstr(r.err_text, "wrong admin token"));
    CHECK_OK(shutdown_rpc(s, 22, "test-admin-token", &r)); /* a prefix is not the token */
    CHECK_EQ_INT(r.err_code, PS_EAUTH);
    CHECK_OK(only_heartbeat_follows(s, -1, 24)); /* still serving */
    CHECK_OK(shutdown_rpc(s, 23, PS_TEST_ADMIN_TOKEN, &r));
    CHECK_EQ_INT(r.type, PS_MSG_SHUTDOWN);
    CHECK_EQ_INT(r.seq, 23);
    CHECK(r.flags & PS_FLAG_REPLY);
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 0);
    char *log = ps_test_read_file(sv.log, NULL);
    CHECK(log);
    /* every refusal logged with the peer; the token itself never */
    int named = strstr(log, "refused a shutdown from rank -1, routing id ") != NULL &&
                strstr(log, "from 127.0.0.1") != NULL;
    int leaked = strstr(log, PS_TEST_ADMIN_TOKEN) != NULL;
    int said = strstr(log, "shutdown requested by rank -1") != NULL &&
               strstr(log, "3 shutdowns refused") != NULL;
    free(log);
    CHECK(named);
    CHECK(!leaked);
    CHECK(said);
    zmq_close(s);
}

PS_TEST(an_admin_token_file_others_can_read_or_a_short_token_exits_2)
{
    const char *loose = ps_test_token_file("loose.token", PS_TEST_ADMIN_TOKEN, 0644);
    const char *shrt = ps_test_token_file("short.token", "abc", 0600);
    CHECK(loose && shrt);
    char words[800];
    snprintf(words, sizeof words, "--admin-token-file %s", loose);
    CHECK_OK(flag_case(words, 1, "chmod 600"));
    snprintf(words, sizeof words, "--admin-token-file %s", shrt);
    CHECK_OK(flag_case(words, 1, "16 to 128 printable characters"));
    CHECK_OK(flag_case("--admin-token-file /nonexistent/token", 1, "cannot open it"));
}

PS_TEST(bind_failure_exits_1)
{
    ps_test_server a, b;
    CHECK_OK(ps_test_server_start(&a, 1, "--quiet"));
    void *s = ps_test_dealer(a.port);
    CHECK_OK(only_heartbeat_follows(s, -1, 1)); /* a is up and bound */
    char words[64];
    snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d", a.port);
    CHECK_OK(ps_test_server_start(&b, 0, words));
    CHECK_EQ_INT(ps_test_wait(b.pid, PS_TEST_RPC_MS), 1);
    char *log = ps_test_read_file(b.log, NULL);
    int ok = log && strstr(log, "cannot bind");
    free(log);
    CHECK(ok);
    CHECK_EQ_INT(ps_test_stop(a.pid, PS_TEST_RPC_MS), 0);
    zmq_close(s);
}

/* ---------------- memory a peer can pin ---------------- */

/* The bound on the server's RSS with a slow reader: the 64 MiB a peer may
 * leave unread (the default for a server this small), the weights and their
 * spare buffers (4 x 784 KB), ZeroMQ's buffers and the idle process (about
 * 10 MB) stay well under 150 MB.  Under AddressSanitizer the process starts
 * near 200 MB (shadow memory): there the growth over idle is what counts. */
#define RSS_BOUND_KB (150L << 10)
#ifdef __SANITIZE_ADDRESS__
#define RSS_BASE(idle) (idle)
#define RSS_SLACK_KB (48L << 10)
#else
#define RSS_BASE(idle) 0L
#define RSS_SLACK_KB (24L << 10)
#endif

/* What slow_reader saw. */
typedef struct slow_run {
    long rss_idle, rss_busy, hwm, rss_after; /* kB */
    char log[512];
} slow_run;

/* A server (flags) with a 784 KB chunk; a peer sends npull pulls of it and
 * never reads the replies (its side takes one message and a tiny socket
 * buffer, so what it does not read stays on the server) while another
 * worker pushes, so the replies cannot all share one pinned buffer and most
 * would be copies (a push every `every` pulls, 200 at most); then the slow
 * peer leaves.  served: the writer's own pull must be answered meanwhile.
 * 0, or -1 (said). */
static int slow_reader(const char *flags, int npull, int every, int served, slow_run *out)
{
    enum { N = 196000, PUSHES = 200 };
    ps_test_server sv;
    if (start_for_rss(&sv, flags))
        return -1;
    snprintf(out->log, sizeof out->log, "%s", sv.log);
    void *w = ps_test_dealer(sv.port);
    float *buf = calloc(N, sizeof *buf);
    ps_header h = ps_test_header(PS_MSG_INIT, 1, 1, 9, 0, 0), r;
    h.total = N;
    int rc = -1;
    void *ctx = zmq_ctx_new(), *slow = zmq_socket(ctx, ZMQ_DEALER);
    if (!buf || ps_test_hello(w, 1, PS_MODE_ASYNC, 2, -1) ||
        ps_test_rpc(w, &h, buf, N, &r, NULL, 0, NULL) || r.type != PS_MSG_INIT)
        goto out;
    out->rss_idle = ps_test_status_kb(sv.pid, "VmRSS");
    int one = 1, small = 4096, zero = 0;
    zmq_setsockopt(slow, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(slow, ZMQ_RCVBUF, &small, sizeof small);
    zmq_setsockopt(slow, ZMQ_LINGER, &zero, sizeof zero);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    if (zmq_connect(slow, ep) || ps_test_hello(slow, 0, PS_MODE_ASYNC, 2, -1))
        goto out;
    int pushes = npull / every < PUSHES ? npull / every : PUSHES;
    for (int i = 0; i < npull; i++) {
        ps_header p = ps_test_header(PS_MSG_PULL, 0, 100 + (uint64_t)i, 9, 0, 0);
        if (send_raw(slow, &p, NULL, 0))
            goto out;
        if (i % every == 0 && i / every < pushes) { /* the writer goes on meanwhile */
            h = ps_test_header(PS_MSG_PUSH, 1, 1000 + (uint64_t)i, 9, 0, i / every);
            if (ps_test_rpc(w, &h, buf, N, &r, NULL, 0, NULL) || r.type != PS_MSG_PUSH) {
                printf("# push %d: %s\n", i / every, r.err_text);
                goto out;
            }
        }
    }
    if (only_heartbeat_follows(w, 1, 7)) /* every pull has been taken in */
        goto out;
    ps_test_sleep_ms(200);
    out->rss_busy = ps_test_status_kb(sv.pid, "VmRSS");
    out->hwm = ps_test_status_kb(sv.pid, "VmHWM");
    /* the other worker is served all along */
    h = ps_test_header(PS_MSG_PULL, 1, 8, 9, 0, 0);
    if (ps_test_rpc(w, &h, NULL, 0, &r, buf, N, NULL) || (served && r.type != PS_MSG_PULL)) {
        printf("# the writer's pull: %s\n", r.err_text);
        goto out;
    }
    /* the slow peer leaves: ZeroMQ drops what it never read */
    zmq_close(slow);
    slow = NULL;
    out->rss_after = out->rss_busy;
    for (int t = 0; t < 50 && out->rss_after > out->rss_idle + 40 * 1024; t++) {
        ps_test_sleep_ms(100);
        out->rss_after = ps_test_status_kb(sv.pid, "VmRSS");
    }
    printf("# %d unread pulls of a %d-byte chunk (%s): server RSS %ld kB idle, %ld kB with "
           "them queued (peak %ld kB), %ld kB once the peer left\n", npull, N * 4, flags,
           out->rss_idle, out->rss_busy, out->hwm, out->rss_after);
    rc = ps_test_stop(sv.pid, PS_TEST_RPC_MS) == 0 ? 0 : -1;
out:
    if (slow)
        zmq_close(slow);
    zmq_ctx_term(ctx);
    zmq_close(w);
    free(buf);
    if (rc)
        ps_test_stop(sv.pid, PS_TEST_RPC_MS);
    return rc;
}

PS_TEST(a_peer_that_never_reads_its_replies_cannot_grow_the_server)
{
    /* the case: 5000 pulls of a 784 KB chunk, never read, took the
     * server to 1.5-1.9 GB (each unread reply its own copy or pinned buffer) */
    const int npull = getenv("PS_TEST_NPULL") ? atoi(getenv("PS_TEST_NPULL")) : 5000;
    slow_run run;
    CHECK_OK(slow_reader("--mode async --num-workers 2 --lr 0.001", npull, 25, 1, &run));
    char *log = ps_test_read_file(run.log, NULL);
    int said = log && strstr(log, "rank 0, routing id ") &&
               strstr(log, "it has not read: refusing its pulls until it reads them") &&
               strstr(log, "pulls refused to peers not reading their replies");
    free(log);
    /* the per-peer default: 64 MiB of unread payloads for a server this small */
    CHECK_MSG(run.hwm > 0 && run.hwm - RSS_BASE(run.rss_idle) < RSS_BOUND_KB,
              "server peak RSS %ld kB (idle %ld kB), bound %ld kB", run.hwm, run.rss_idle,
              RSS_BOUND_KB);
    CHECK_MSG(run.rss_after < run.rss_idle + 40 * 1024,
              "RSS %ld kB after the peer left (idle %ld kB)", run.rss_after, run.rss_idle);
    CHECK_MSG(said, "no refusal in %s", run.log);
}

PS_TEST(reply_copies_count_against_max_memory)
{
    /* a per-peer limit far above --max-memory: the copies stop at the latter
     * (and so may another worker's pull that needs a copy: memory is full) */
    slow_run run;
    CHECK_OK(slow_reader("--mode async --num-workers 2 --lr 0.001 --max-memory 6M "
                         "--max-peer-bytes 1G", 400, 2, 0, &run));
    char *log = ps_test_read_file(run.log, NULL);
    int said = log && strstr(log, "--max-memory 6291456 bytes is in use (chunks and pull "
                                  "replies not yet read)");
    free(log);
    CHECK_MSG(said, "no refusal naming --max-memory in %s", run.log);
    CHECK_MSG(run.rss_busy - run.rss_idle < RSS_SLACK_KB, "RSS went from %ld kB to %ld kB",
              run.rss_idle, run.rss_busy);
}
