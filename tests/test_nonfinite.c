/* Non-finite gradients (--on-nonfinite refuse|skip|apply; docs/OPERATIONS.md
 * "Non-finite gradients"): pushes holding NaN or Inf in float32, bfloat16 and
 * float16 from a raw DEALER to a live bin/ps_server under each policy (the
 * reply, the weights after, the stats counter, the log line), a sync round
 * with a skipped push, and libps's own check before it sends (NaN, and a
 * float16 wire value beyond 65504, which would arrive as Inf).  And what is
 * applied is what was checked: a sync push kept in the sender's shared
 * memory and rewritten there before its turn, and finite gradients whose
 * update overflows to Inf, dense and tables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_shm.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "tables_job.h"
#include "ps_test_server.h"

#define N 4
#define KEY 7

static const float W0[N] = {1.0f, 2.0f, 3.0f, 4.0f};
static const float G[N] = {0.5f, 0.25f, -0.5f, 1.0f};

/* A push of step `step` from `rank` whose payload is n values of dtype at p. */
static int push_raw(void *s, int rank, uint64_t seq, int64_t step, uint32_t dtype, const void *p,
                    ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_PUSH, rank, seq, KEY, 0, step);
    h.count = N;
    h.dtype = dtype;
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) || zmq_send(s, buf, len, ZMQ_SNDMORE) < 0 ||
        zmq_send(s, p, N * ps_dtype_size(dtype), 0) < 0)
        return -1;
    return ps_test_recv(s, PS_TEST_RPC_MS, r, NULL, 0, NULL);
}

static int pull(void *s, int rank, uint64_t seq, int64_t want, float *out)
{
    ps_header h = ps_test_header(PS_MSG_PULL, rank, seq, KEY, 0, want), r;
    size_t got = 0;
    if (ps_test_rpc(s, &h, NULL, 0, &r, out, N, &got) || r.type != PS_MSG_PULL || got != N)
        return -1;
    return 0;
}

static int stats(void *s, ps_stats *st)
{
    ps_header h = ps_test_header(PS_MSG_STATS, -1, 99, 0, 0, 0), r;
    if (ps_test_rpc(s, &h, NULL, 0, &r, NULL, 0, NULL) || r.type != PS_MSG_STATS)
        return -1;
    *st = r.stats;
    return 0;
}

/* The bad gradients: G with element 1 replaced, in each wire type. */
typedef struct bad_push {
    const char *what;
    uint32_t dtype;
    unsigned char bytes[N * 4];
} bad_push;

static void make_bad(bad_push *b, int which)
{
    float g[N];
    memcpy(g, G, sizeof g);
    switch (which) {
    case 0: /* float32 NaN */
        b->what = "f32 NaN";
        b->dtype = PS_DTYPE_F32;
        g[1] = NAN;
        break;
    case 1: /* bfloat16 -Inf */
        b->what = "bf16 -Inf";
        b->dtype = PS_DTYPE_BF16;
        g[1] = -INFINITY;
        break;
    default: /* float16: 70000 becomes +Inf, as a worker with no check of its own sends it */
        b->what = "f16 70000 (Inf)";
        b->dtype = PS_DTYPE_F16;
        g[1] = 70000.0f;
        break;
    }
    ps_dtype_from_f32(b->dtype, b->bytes, g, N);
}

/* A fresh server (async, sgd lr 1, one worker) under policy `mode`, rank 0
 * said hello and key KEY inited to W0.  Returns the socket. */
static void *setup(ps_test_server *sv, const char *mode, int nw, const char *sync)
{
    char words[300];
    snprintf(words, sizeof words, "--num-workers %d --mode %s --optimizer sgd --lr 1 "
             "--on-nonfinite %s", nw, sync, mode);
    if (ps_test_server_start(sv, 1, words))
        return NULL;
    void *s = ps_test_dealer(sv->port);
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 2, KEY, 0, 0), r;
    h.total = N;
    int is_sync = strcmp(sync, "sync") == 0;
    if (ps_test_hello(s, 0, is_sync ? PS_MODE_SYNC : PS_MODE_ASYNC, nw, is_sync ? 0 : -1) ||
        ps_test_rpc(s, &h, W0, N, &r, NULL, 0, NULL) || r.type != PS_MSG_INIT) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

PS_TEST(refuse_is_the_default_and_answers_an_error_naming_key_chunk_step_and_worker)
{
    for (int which = 0; which < 3; which++) {
        ps_test_server sv;
        bad_push b;
        make_bad(&b, which);
        /* no --on-nonfinite: the default */
        CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --optimizer sgd "
                                      "--lr 1"));
        void *s = ps_test_dealer(sv.port);
        ps_header h = ps_test_header(PS_MSG_INIT, 0, 2, KEY, 0, 0), r;
        h.total = N;
        CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
        CHECK_OK(ps_test_rpc(s, &h, W0, N, &r, NULL, 0, NULL));
        CHECK_OK(push_raw(s, 0, 3, 0, b.dtype, b.bytes, &r));
        CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_ENONFINITE, "%s: reply type %u "
                  "code %d '%s'", b.what, r.type, r.err_code, r.err_text);
        CHECK_MSG(strstr(r.err_text, "key 7 chunk 0") && strstr(r.err_text, "worker 0") &&
                      strstr(r.err_text, "step 0") && strstr(r.err_text, "element 1") &&
                      strstr(r.err_text, "refuse"),
                  "%s: %s", b.what, r.err_text);
        /* nothing moved: the weights, and the worker's clock (step 0 again is
         * taken, not a duplicate) */
        float w[N];
        CHECK_OK(pull(s, 0, 4, 0, w));
        CHECK(memcmp(w, W0, sizeof w) == 0);
        ps_stats st;
        CHECK_OK(stats(s, &st));
        CHECK_EQ_INT(st.nonfinite, 1);
        CHECK_EQ_INT(st.updates, 0);
        ps_header ok = ps_test_header(PS_MSG_PUSH, 0, 5, KEY, 0, 0);
        CHECK_OK(ps_test_rpc(s, &ok, G, N, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        CHECK_OK(pull(s, 0, 6, 0, w));
        for (int i = 0; i < N; i++)
            CHECK(w[i] == W0[i] - G[i]);
        zmq_close(s);
        ps_test_stop(sv.pid, 3000);
        CHECK_MSG(ps_test_file_has(sv.log, "refused push from worker 0 (key 7 chunk 0)") &&
                      ps_test_file_has(sv.log, "pushes held NaN or Inf"),
                  "%s: no log line in %s", b.what, sv.log);
    }
}

PS_TEST(skip_acknowledges_moves_the_clock_and_changes_no_weight)
{
    for (int which = 0; which < 3; which++) {
        ps_test_server sv;
        bad_push b;
        make_bad(&b, which);
        void *s = setup(&sv, "skip", 1, "async");
        CHECK(s != NULL);
        ps_header r;
        CHECK_OK(push_raw(s, 0, 3, 0, b.dtype, b.bytes, &r));
        CHECK_MSG(r.type == PS_MSG_PUSH, "%s: reply type %u '%s'", b.what, r.type, r.err_text);
        float w[N];
        CHECK_OK(pull(s, 0, 4, 0, w));
        CHECK(memcmp(w, W0, sizeof w) == 0);
        /* the skipped push was step 0: the next is step 1, and it applies */
        ps_header ok = ps_test_header(PS_MSG_PUSH, 0, 5, KEY, 0, 1);
        CHECK_OK(ps_test_rpc(s, &ok, G, N, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        CHECK_OK(pull(s, 0, 6, 0, w));
        for (int i = 0; i < N; i++)
            CHECK(w[i] == W0[i] - G[i]);
        ps_stats st;
        CHECK_OK(stats(s, &st));
        CHECK_EQ_INT(st.nonfinite, 1);
        CHECK_EQ_INT(st.updates, 1);
        CHECK_EQ_INT(st.pushes, 2);
        zmq_close(s);
        ps_test_stop(sv.pid, 3000);
        CHECK_MSG(ps_test_file_has(sv.log, "skipped (--on-nonfinite skip)"), "%s: %s", b.what,
                  sv.log);
    }
}

PS_TEST(apply_applies_it_and_counts_it)
{
    for (int which = 0; which < 3; which++) {
        ps_test_server sv;
        bad_push b;
        make_bad(&b, which);
        void *s = setup(&sv, "apply", 1, "async");
        CHECK(s != NULL);
        ps_header r;
        CHECK_OK(push_raw(s, 0, 3, 0, b.dtype, b.bytes, &r));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        float w[N];
        CHECK_OK(pull(s, 0, 4, 0, w));
        CHECK_MSG(!isfinite(w[1]) && w[0] == W0[0] - G[0], "%s: w = %g %g", b.what,
                  (double)w[0], (double)w[1]);
        ps_stats st;
        CHECK_OK(stats(s, &st));
        CHECK_EQ_INT(st.nonfinite, 1);
        CHECK_EQ_INT(st.updates, 1);
        zmq_close(s);
        ps_test_stop(sv.pid, 3000);
        CHECK_MSG(ps_test_file_has(sv.log, "applied (--on-nonfinite apply)"), "%s", sv.log);
    }
}

/* Sync: a skipped push takes its rank's turn; the round averages the
 * gradients it has, and a round of skipped pushes only ends. */
PS_TEST(a_sync_round_with_a_skipped_push_averages_the_others)
{
    ps_test_server sv;
    bad_push b;
    make_bad(&b, 0);
    void *s0 = setup(&sv, "skip", 2, "sync");
    CHECK(s0 != NULL);
    void *s1 = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s1, 1, PS_MODE_SYNC, 2, 0));
    ps_header r;
    /* round 0: rank 1 pushes G first (kept for rank order), rank 0's NaN is skipped */
    ps_header p1 = ps_test_header(PS_MSG_PUSH, 1, 3, KEY, 0, 0);
    CHECK_OK(ps_test_rpc(s1, &p1, G, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_OK(push_raw(s0, 0, 4, 0, b.dtype, b.bytes, &r));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    float w[N];
    CHECK_OK(pull(s0, 0, 5, 1, w));
    for (int i = 0; i < N; i++)
        CHECK_MSG(w[i] == W0[i] - G[i], "w[%d] = %g, want %g (the mean of rank 1's alone)", i,
                  (double)w[i], (double)(W0[i] - G[i]));
    /* round 1: both skipped: version 2, weights as they were */
    bad_push b2;
    make_bad(&b2, 1);
    CHECK_OK(push_raw(s0, 0, 6, 1, b.dtype, b.bytes, &r));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_OK(push_raw(s1, 1, 7, 1, b2.dtype, b2.bytes, &r));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    float w2[N];
    ps_header h = ps_test_header(PS_MSG_PULL, 0, 8, KEY, 0, 2);
    size_t got = 0;
    CHECK_OK(ps_test_rpc(s0, &h, NULL, 0, &r, w2, N, &got));
    CHECK_EQ_INT(r.type, PS_MSG_PULL);
    CHECK_EQ_INT(r.chunk_version, 2);
    CHECK(memcmp(w, w2, sizeof w) == 0);
    ps_stats st;
    CHECK_OK(stats(s0, &st));
    CHECK_EQ_INT(st.nonfinite, 3);
    CHECK_EQ_INT(st.updates, 1);
    zmq_close(s0);
    zmq_close(s1);
    ps_test_stop(sv.pid, 3000);
}

/* libps, with the default policy, does not send such a gradient: the push
 * fails at once naming its step, and the server never sees it. */
PS_TEST(libps_refuses_to_send_nan_or_a_float16_overflow_and_names_the_step)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --optimizer sgd --lr 1 "
                                  "--wire-dtype f16 --shm off"));
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    for (int policy = 0; policy < 2; policy++) {
        ps_client_options o;
        ps_client_options_default(&o);
        CHECK_EQ_INT(o.on_nonfinite, PS_NONFINITE_REFUSE);
        o.servers = ep;
        o.rank = 0;
        o.num_workers = 1;
        o.mode = PS_MODE_ASYNC;
        o.shm = 0;
        o.hello_timeout_ms = 5000;
        o.request_timeout_ms = 0;
        if (policy == 1)
            o.on_nonfinite = PS_NONFINITE_APPLY; /* sent: the server refuses it instead */
        ps_client *c = NULL;
        CHECK_OK(ps_client_open(&o, &c));
        CHECK_OK(ps_client_set_wire_dtype(c, PS_DTYPE_F16));
        CHECK_OK(ps_client_register(c, KEY, N));
        CHECK_OK(ps_client_start(c));
        float w[N], g[N];
        memcpy(w, W0, sizeof w);
        ps_request q;
        if (policy == 0) {
            CHECK_OK(ps_client_init(c, KEY, w, &q));
            CHECK_OK(ps_request_wait(&q));
        }
        memcpy(g, G, sizeof g);
        g[2] = policy == 0 ? NAN : 70000.0f;
        ps_client_push(c, KEY, g, 0, &q);
        CHECK_EQ_INT(ps_request_wait(&q), PS_ENONFINITE);
        CHECK_MSG(strstr(q.err, "step 0") && strstr(q.err, "key 7 chunk 0") &&
                      strstr(q.err, "element 2"),
                  "%s", q.err);
        if (policy == 0) {
            CHECK_MSG(strstr(q.err, "not sent"), "%s", q.err);
            /* a value float16 cannot hold is refused the same way */
            g[2] = 70000.0f;
            ps_client_push(c, KEY, g, 0, &q);
            CHECK_EQ_INT(ps_request_wait(&q), PS_ENONFINITE);
            CHECK_MSG(strstr(q.err, "float16") && strstr(q.err, "70000"), "%s", q.err);
            ps_stats st;
            CHECK_OK(ps_client_stats(c, 0, &st));
            CHECK_EQ_INT(st.pushes, 0);
            CHECK_EQ_INT(st.nonfinite, 0);
        } else {
            CHECK_MSG(strstr(q.err, "refuse") && strstr(q.err, "worker 0"), "%s", q.err);
            ps_stats st;
            CHECK_OK(ps_client_stats(c, 0, &st));
            CHECK_EQ_INT(st.nonfinite, 1);
        }
        ps_client_close(c);
    }
    ps_test_stop(sv.pid, 3000);
}

/* ps_worker with a learning rate that blows the weights up, float16 on the
 * wire: the server says the weights it sends no longer fit float16 (they
 * went as Inf, silently, before), and the worker stops at the step whose
 * gradient is not finite, saying so, instead of training on. */
PS_TEST(a_diverging_worker_stops_at_its_step_and_the_float16_overflow_is_said)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode sync --optimizer sgd "
                                  "--lr 1000000 --wire-dtype f16 --shm off"));
    char words[400], log[512];
    snprintf(words, sizeof words, "--servers tcp://127.0.0.1:%d --rank 0 --num-workers 1 "
             "--mode sync --wire-dtype f16 --model mlp:784-64-10 --data synthetic:2048 "
             "--batch 32 --steps 60 --log-every 1000", sv.port);
    snprintf(log, sizeof log, "%s/nonfinite-worker.log", ps_test_tmpdir());
    int w = ps_test_spawn_words("ps_worker", words, log);
    CHECK(w > 0);
    int rc = ps_test_wait(w, 60000);
    ps_test_stop(sv.pid, 3000);
    CHECK_MSG(rc == 1, "the worker exited %d, not 1: %s", rc, log);
    CHECK_MSG(ps_test_file_has(log, "push of step") &&
                  ps_test_file_has(log, "not sent (--on-nonfinite refuse)"),
              "no word of the non-finite gradient in %s", log);
    CHECK_MSG(ps_test_file_has(sv.log, "weights are not finite as f16") &&
                  ps_test_file_has(sv.log, "use --wire-dtype bf16"),
              "the server did not say its float16 weights overflowed: %s", sv.log);
}

/* Tables: a gradient row with NaN is not sent by libps under refuse (the
 * request names the table and the step); a server refuses one that comes
 * anyway, or under skip counts the push with no row moved. */
PS_TEST(table_rows_with_nan_are_refused_by_libps_and_by_the_server_or_skipped)
{
    TJ_NEED_SERVER();
    uint64_t ids[3] = {5, 6, 7000001};
    float g[3 * 2] = {0.5f, 0.5f, NAN, 1.0f, 0.25f, 0.25f}, rows[3 * 2];
    for (int srv = 0; srv < 2; srv++) {
        tj_job j;
        CHECK_OK(tj_prepare(&j, 1, 1,
                            srv ? "--mode async --on-nonfinite skip" : "--mode async", 2,
                            PS_TABLE_INIT_ZEROS));
        /* libps refuses first (the default); then it sends, and the server decides */
        for (int cl = 0; cl < 2; cl++) {
            j.on_nonfinite = cl ? PS_NONFINITE_APPLY : PS_NONFINITE_REFUSE;
            CHECK_OK(tj_client(&j, 0));
            ps_request r;
            int rc = ps_client_sparse_push(j.c[0], j.table, ids, 3, g, 0, &r);
            int st = rc ? rc : tj_wait(&r);
            if (!cl) {
                CHECK_MSG(st == PS_ENONFINITE && strstr(r.err, "table 7") &&
                              strstr(r.err, "step 0") && strstr(r.err, "not sent"),
                          "libps: %d %s", st, r.err);
            } else if (!srv) {
                CHECK_MSG(st == PS_ENONFINITE && strstr(r.err, "table 7 partition"),
                          "server refuse: %d %s", st, r.err);
            } else {
                CHECK_MSG(st == 0, "server skip: %s", r.err);
                /* skipped: the clock moved (step 1 is taken), no row did */
                CHECK_OK(ps_client_sparse_push(j.c[0], j.table, ids, 0, g, 1, &r));
                CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
                CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, ids, 3, rows, 0, &r));
                CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
                for (int i = 0; i < 6; i++)
                    CHECK_MSG(rows[i] == 0.0f, "row value %d is %g", i, (double)rows[i]);
                ps_stats s;
                CHECK_OK(ps_client_stats(j.c[0], 0, &s));
                CHECK_EQ_INT(s.nonfinite, 1);
            }
            ps_client_close(j.c[0]);
            j.c[0] = NULL;
        }
        CHECK_OK(tj_stop(&j));
    }
}

/* ---- what is applied is what was checked ---- */

#define TKEY 9
#define TDIM 4

static void declare_table(ps_header *h, uint64_t seq, int rank, float lr)
{
    *h = ps_test_header(PS_MSG_TABLE, rank, seq, TKEY, 0, 0);
    ps_table_options_default(&h->table);
    h->table.dim = TDIM;
    h->table.opt.kind = PS_OPT_SGD;
    h->table.opt.lr = lr;
}

static ps_header table_msg(uint32_t type, int rank, uint64_t seq, uint32_t part, int64_t s)
{
    ps_header h = ps_test_header(type, rank, seq, TKEY, part, s);
    h.dim = TDIM;
    h.dtype = PS_DTYPE_F32;
    h.count = 1;
    return h;
}

/* Send h (and its frames); the reply into r, rows into out. */
static int table_rpc(void *d, const ps_header *h, const void *const *f, const size_t *b, int n,
                     ps_header *r, float *out, size_t cap)
{
    if (ps_test_send_frames(d, h, f, b, n))
        return -1;
    return ps_test_recv(d, PS_TEST_RPC_MS, r, out, cap, NULL);
}

/* A hello of rank `rank` of a sync job of two workers, with arena a (NULL:
 * none). */
static int hello2(void *d, int rank, const ps_shm_arena *a)
{
    ps_header h = ps_test_header(PS_MSG_HELLO, rank, 1, 0, 0, 0), r;
    h.hello.mode = PS_MODE_SYNC;
    h.hello.max_staleness = 0;
    h.hello.num_workers = 2;
    h.hello.num_servers = 1;
    h.hello.opt.kind = PS_OPT_NONE;
    if (a) {
        snprintf(h.hello.shm_name, sizeof h.hello.shm_name, "%s", a->name);
        h.hello.shm_nonce = a->nonce;
        h.hello.shm_size = a->size;
    }
    if (table_rpc(d, &h, NULL, NULL, 0, &r, NULL, 0) || r.type != PS_MSG_HELLO)
        return -1;
    return a && r.hello.shm != 1 ? -1 : 0;
}

/* Sync, two workers: rank 1's push of step 0 sits in its arena, kept while
 * rank 0's is missing; rank 1 then writes NaN over it.  When rank 0's push
 * completes the round, the kept push is read again (copied) and checked:
 * refused to rank 1, counted, nothing applied, the round waits; rank 1's
 * push sent again with its finite gradient completes it.  Dense (table 0)
 * and a table (1). */
PS_TEST(a_kept_shared_memory_push_rewritten_with_nan_is_refused_when_it_is_used)
{
    TJ_NEED_SERVER();
    for (int tbl = 0; tbl < 2; tbl++) {
        ps_test_server sv;
        CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode sync --optimizer sgd "
                                      "--lr 1 --quiet"));
        ps_shm_arena a;
        char w[256];
        CHECK_MSG(ps_shm_create(1 << 16, &a, w, sizeof w) == 0, "%s", w);
        void *d0 = ps_test_dealer(sv.port), *d1 = ps_test_dealer(sv.port);
        CHECK_OK(hello2(d0, 0, NULL));
        CHECK_OK(hello2(d1, 1, &a));
        ps_header h, r, r1;
        uint64_t id = 5, seq = 10;
        uint32_t part = ps_table_row_part(ps_table_row_hash(TKEY, id), 1, 1);
        float before[N], after[N], g1[N] = {1, 2, 3, 4};
        const void *f[2] = {&id, G};
        size_t b[2] = {8, sizeof G};
        if (tbl) {
            declare_table(&h, ++seq, 0, 1.0f);
            CHECK_OK(table_rpc(d0, &h, NULL, NULL, 0, &r, NULL, 0));
            CHECK_EQ_INT(r.type, PS_MSG_TABLE);
            h = table_msg(PS_MSG_SPULL, 0, ++seq, part, 0);
            CHECK_OK(table_rpc(d0, &h, f, b, 1, &r, before, N));
            CHECK_EQ_INT(r.type, PS_MSG_SPULL);
        } else {
            h = ps_test_header(PS_MSG_INIT, 0, ++seq, KEY, 0, 0);
            h.total = N;
            CHECK_OK(ps_test_rpc(d0, &h, W0, N, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_INIT);
            memcpy(before, W0, sizeof before);
        }
        /* rank 1's push from its arena: kept (rank 0's is not in) */
        unsigned char *blk = ps_shm_alloc(&a, 4096);
        CHECK(blk != NULL);
        uint64_t off = (uint64_t)(blk - a.base);
        if (tbl) {
            memcpy(blk, &id, 8);
            memcpy(blk + 8, g1, sizeof g1);
            h = table_msg(PS_MSG_SPUSH, 1, 100, part, 0);
        } else {
            memcpy(blk, g1, sizeof g1);
            h = ps_test_header(PS_MSG_PUSH, 1, 100, KEY, 0, 0);
            h.count = N;
            h.dtype = PS_DTYPE_F32;
        }
        h.flags = PS_FLAG_SHM;
        h.shm_off = off;
        CHECK_OK(ps_test_send_frames(d1, &h, NULL, NULL, 0));
        CHECK_MSG(ps_test_recv(d1, 300, &r1, NULL, 0, NULL) != 0,
                  "rank 1's push was answered before its round: %s %s",
                  ps_msg_type_name(r1.type), r1.err_text);
        /* ... written over while it waits */
        float nan4[N] = {NAN, NAN, NAN, NAN};
        memcpy(blk + (tbl ? 8 : 0), nan4, sizeof nan4);
        /* rank 0's push completes the round: rank 1's is refused now */
        if (tbl) {
            h = table_msg(PS_MSG_SPUSH, 0, ++seq, part, 0);
            CHECK_OK(table_rpc(d0, &h, f, b, 2, &r, NULL, 0));
            CHECK_MSG(r.type == PS_MSG_SPUSH, "rank 0: %s %s", ps_msg_type_name(r.type),
                      r.err_text);
        } else {
            h = ps_test_header(PS_MSG_PUSH, 0, ++seq, KEY, 0, 0);
            CHECK_OK(ps_test_rpc(d0, &h, G, N, &r, NULL, 0, NULL));
            CHECK_MSG(r.type == PS_MSG_PUSH, "rank 0: %s %s", ps_msg_type_name(r.type),
                      r.err_text);
        }
        CHECK_OK(ps_test_recv(d1, PS_TEST_RPC_MS, &r1, NULL, 0, NULL));
        CHECK_MSG(r1.type == PS_MSG_ERROR && r1.err_code == PS_ENONFINITE &&
                      strstr(r1.err_text, "worker 1") && strstr(r1.err_text, "shared memory"),
                  "rank 1: %s %d %s", ps_msg_type_name(r1.type), r1.err_code, r1.err_text);
        ps_stats st;
        CHECK_OK(ps_test_stats(sv.port, &st));
        CHECK_MSG(st.nonfinite >= 1, "nonfinite %llu", (unsigned long long)st.nonfinite);
        /* nothing applied: the round is open, the row (weights) as before */
        float now[N];
        if (tbl) {
            h = table_msg(PS_MSG_SPULL, 0, ++seq, part, 0);
            CHECK_OK(table_rpc(d0, &h, f, b, 1, &r, now, N));
            CHECK_MSG(r.type == PS_MSG_SPULL && r.chunk_version == 0, "%s v%lld",
                      ps_msg_type_name(r.type), (long long)r.chunk_version);
        } else {
            CHECK_OK(pull(d0, 0, ++seq, 0, now));
        }
        for (int k = 0; k < N; k++)
            CHECK_MSG(now[k] == before[k], "value %d: %g, was %g", k, (double)now[k],
                      (double)before[k]);
        /* rank 1 sends it again, finite: the round completes with both */
        memcpy(blk + (tbl ? 8 : 0), g1, sizeof g1);
        if (tbl) {
            h = table_msg(PS_MSG_SPUSH, 1, 101, part, 0);
        } else {
            h = ps_test_header(PS_MSG_PUSH, 1, 101, KEY, 0, 0);
            h.count = N;
            h.dtype = PS_DTYPE_F32;
        }
        h.flags = PS_FLAG_SHM;
        h.shm_off = off;
        CHECK_OK(table_rpc(d1, &h, NULL, NULL, 0, &r1, NULL, 0));
        CHECK_MSG(r1.type == (tbl ? PS_MSG_SPUSH : PS_MSG_PUSH), "resend: %s %s",
                  ps_msg_type_name(r1.type), r1.err_text);
        for (int k = 0; k < N; k++)
            after[k] = before[k] - 1.0f * ((G[k] + g1[k]) / 2.0f);
        if (tbl) {
            h = table_msg(PS_MSG_SPULL, 0, ++seq, part, 1);
            CHECK_OK(table_rpc(d0, &h, f, b, 1, &r, now, N));
            CHECK_EQ_INT(r.type, PS_MSG_SPULL);
        } else {
            CHECK_OK(pull(d0, 0, ++seq, 1, now));
        }
        CHECK(memcmp(now, after, sizeof now) == 0);
        zmq_close(d0);
        zmq_close(d1);
        ps_shm_close(&a);
        CHECK_OK(ps_test_stop(sv.pid, 3000));
    }
}

/* Three finite pushes of -3e38 at rate 0.5 take a value to 1.5e38, 3e38
 * and then past FLT_MAX: the third update's result is Inf.  Refused like a
 * non-finite gradient: an error naming it, counted, the value unchanged;
 * --on-nonfinite skip keeps the value and acknowledges.  Dense and a table,
 * async and sync. */
PS_TEST(an_update_whose_result_overflows_to_inf_is_refused_and_changes_nothing)
{
    TJ_NEED_SERVER();
    for (int c = 0; c < 5; c++) {
        int tbl = c % 2, sync = c >= 2 && c < 4, skip = c == 4;
        ps_test_server sv;
        char words[256];
        snprintf(words, sizeof words, "--num-workers 1 --mode %s --optimizer sgd --lr 0.5 "
                 "--quiet%s", sync ? "sync" : "async", skip ? " --on-nonfinite skip" : "");
        CHECK_OK(ps_test_server_start(&sv, 1, words));
        void *d = ps_test_dealer(sv.port);
        CHECK_OK(ps_test_hello(d, 0, sync ? PS_MODE_SYNC : PS_MODE_ASYNC, 1, sync ? 0 : -1));
        ps_header h, r;
        uint64_t id = 5, seq = 10;
        uint32_t part = ps_table_row_part(ps_table_row_hash(TKEY, id), 1, 1);
        float big[N] = {-3e38f, -3e38f, -3e38f, -3e38f}, w[N], was[N];
        const void *f[2] = {&id, big};
        size_t b[2] = {8, sizeof big};
        if (tbl) {
            declare_table(&h, ++seq, 0, 0.5f);
            CHECK_OK(table_rpc(d, &h, NULL, NULL, 0, &r, NULL, 0));
            CHECK_EQ_INT(r.type, PS_MSG_TABLE);
        } else {
            h = ps_test_header(PS_MSG_INIT, 0, ++seq, KEY, 0, 0);
            h.total = N;
            float zero[N] = {0};
            CHECK_OK(ps_test_rpc(d, &h, zero, N, &r, NULL, 0, NULL));
        }
        for (int step = 0; step < 3; step++) {
            if (tbl) {
                h = table_msg(PS_MSG_SPUSH, 0, ++seq, part, step);
                CHECK_OK(table_rpc(d, &h, f, b, 2, &r, NULL, 0));
            } else {
                h = ps_test_header(PS_MSG_PUSH, 0, ++seq, KEY, 0, step);
                h.count = N;
                CHECK_OK(ps_test_rpc(d, &h, big, N, &r, NULL, 0, NULL));
            }
            if (step == 1) { /* the values after two pushes: finite */
                if (tbl) {
                    h = table_msg(PS_MSG_SPULL, 0, ++seq, part, 2);
                    CHECK_OK(table_rpc(d, &h, f, b, 1, &r, was, N));
                } else {
                    CHECK_OK(pull(d, 0, ++seq, 2, was));
                }
                CHECK_MSG(isfinite(was[0]) && was[0] > 2e38f, "after two: %g", (double)was[0]);
            }
        }
        if (skip) {
            CHECK_MSG(r.type == (tbl ? PS_MSG_SPUSH : PS_MSG_PUSH), "case %d: %s %s", c,
                      ps_msg_type_name(r.type), r.err_text);
        } else {
            CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_ENONFINITE &&
                          strstr(r.err_text, "not finite") && strstr(r.err_text, "refuse") &&
                          strstr(r.err_text, tbl ? "table 9" : "key 7 chunk 0"),
                      "case %d: %s %d %s", c, ps_msg_type_name(r.type), r.err_code, r.err_text);
        }
        /* the values as after two pushes */
        if (tbl) {
            h = table_msg(PS_MSG_SPULL, 0, ++seq, part, 3);
            CHECK_OK(table_rpc(d, &h, f, b, 1, &r, w, N));
            CHECK_EQ_INT(r.type, PS_MSG_SPULL);
        } else {
            CHECK_OK(pull(d, 0, ++seq, 3, w));
        }
        CHECK_MSG(memcmp(w, was, sizeof w) == 0, "case %d: %g, was %g", c, (double)w[0],
                  (double)was[0]);
        ps_stats st;
        CHECK_OK(ps_test_stats(sv.port, &st));
        CHECK_MSG(st.nonfinite == 1, "case %d: nonfinite %llu", c,
                  (unsigned long long)st.nonfinite);
        zmq_close(d);
        CHECK_OK(ps_test_stop(sv.pid, 3000));
    }
}
