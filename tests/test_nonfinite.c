/* Non-finite gradients (--on-nonfinite refuse|skip|apply; docs/OPERATIONS.md
 * "Non-finite gradients"): pushes holding NaN or Inf in float32, bfloat16 and
 * float16 from a raw DEALER to a live bin/ps_server under each policy (the
 * reply, the weights after, the stats counter, the log line), a sync round
 * with a skipped push, and libps's own check before it sends (NaN, and a
 * float16 wire value beyond 65504, which would arrive as Inf). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_proto.h"
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
