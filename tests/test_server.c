/* ps_server semantics (docs/PROTOCOL.md "Semantics"), checked at the protocol
 * level with raw ZeroMQ DEALER sockets against a live bin/ps_server (the
 * shard store on its own: test_shard.c).  Values are compared bit for bit
 * where the arithmetic is the server's own (same float formula, same
 * kernels). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "server.h"

#define QUIET_MS 250 /* how long "no reply yet" is watched */

/* ---------------- helpers ---------------- */

static ps_hello hello_cfg(int mode, int nw, int opt, float lr)
{
    ps_hello c;
    memset(&c, 0, sizeof c);
    c.mode = mode;
    c.max_staleness = mode == PS_MODE_SYNC ? 0 : -1;
    c.num_workers = (uint32_t)nw;
    c.num_servers = 1;
    c.server_rank = 0;
    c.opt.kind = opt;
    c.opt.lr = lr;
    c.opt.given = lr != 0 ? PS_OPT_GIVEN(lr) : 0;
    c.opt.momentum = 0.9f;
    c.opt.beta1 = 0.9f;
    c.opt.beta2 = 0.999f;
    c.opt.eps = 1e-8f;
    return c;
}

static int hello_with(void *s, int rank, const ps_hello *cfg, ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_HELLO, rank, 1000 + (uint64_t)rank, 0, 0, 0);
    h.hello = *cfg;
    return ps_test_rpc(s, &h, NULL, 0, r, NULL, 0, NULL);
}

/* Stop the server as an operator does (a shutdown message needs authority,
 * test_server_badinput.c) and return its exit status.  s: unused. */
static int shutdown_server(const ps_test_server *sv, void *s)
{
    (void)s;
    return ps_test_stop(sv->pid, PS_TEST_RPC_MS);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* ---------------- live server: semantics ---------------- */

PS_TEST(async_push_applied_on_arrival_and_pull_returns_exact_values)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode async --lr 0.5 --quiet"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 2, -1));
    CHECK_OK(ps_test_hello(b, 1, PS_MODE_ASYNC, 2, -1));
    enum { N = 37 };
    float w[N], g[N], out[N], exp[N];
    for (int i = 0; i < N; i++)
        w[i] = frand();
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 42, 3, 0), r;
    h.total = N;
    size_t got;
    CHECK_OK(ps_test_rpc(a, &h, w, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    CHECK_EQ_INT(r.seq, 1);
    CHECK_EQ_INT(r.chunk_version, 0);
    /* each push is applied at once, without waiting for the other worker */
    void *who[3] = {a, b, a};
    int rank[3] = {0, 1, 0}, step[3] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++)
            g[i] = frand();
        h = ps_test_header(PS_MSG_PUSH, rank[k], 10 + (uint64_t)k, 42, 3, step[k]);
        CHECK_OK(ps_test_rpc(who[k], &h, g, N, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        CHECK_EQ_INT(r.seq, 10 + k);
        CHECK_EQ_INT(r.chunk_version, k + 1);
        for (int i = 0; i < N; i++)
            w[i] = w[i] - 0.5f * (g[i] + 0.0f * w[i]);
        /* the other worker sees it (on its own connection, as its rank) */
        h = ps_test_header(PS_MSG_PULL, rank[(k + 1) % 3], 20 + (uint64_t)k, 42, 3, 0);
        CHECK_OK(ps_test_rpc(who[(k + 1) % 3], &h, NULL, 0, &r, out, N, &got));
        CHECK_EQ_INT(r.type, PS_MSG_PULL);
        CHECK_EQ_INT(r.chunk_version, k + 1);
        CHECK_EQ_INT(r.count, N);
        CHECK_EQ_INT(got, N);
        memcpy(exp, w, sizeof exp);
        CHECK(memcmp(out, exp, sizeof out) == 0);
    }
    /* a push below the worker's clock is a duplicate: acked, not applied */
    h = ps_test_header(PS_MSG_PUSH, 0, 30, 42, 3, 1);
    CHECK_OK(ps_test_rpc(a, &h, g, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(r.chunk_version, 3);
    ps_stats st;
    CHECK_OK(ps_test_stats(sv.port, &st));
    CHECK_EQ_INT(st.dup_dropped, 1);
    CHECK_EQ_INT(st.updates, 3);
    CHECK_EQ_INT(st.pushes, 4);
    CHECK_EQ_INT(st.pulls, 3);
    CHECK_EQ_INT(st.inits, 1);
    CHECK_EQ_INT(st.chunks, 1);
    CHECK_EQ_INT(st.workers_seen, 2);
    CHECK_EQ_INT(st.min_version, 3);
    CHECK_EQ_INT(st.max_version, 3);
    CHECK_EQ_INT(st.bytes_out, 3 * N * 4);
    CHECK_EQ_INT(st.bytes_in, 5 * N * 4);
    CHECK_EQ_INT(shutdown_server(&sv, a), 0);
    zmq_close(a);
    zmq_close(b);
}

PS_TEST(sync_pull_waits_for_all_workers_then_mean_in_rank_order)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 3 --mode sync --lr 0.25 --quiet"));
    void *d[3];
    for (int k = 0; k < 3; k++) {
        d[k] = ps_test_dealer(sv.port);
        CHECK_OK(ps_test_hello(d[k], k, PS_MODE_SYNC, 3, 0));
    }
    enum { N = 64 };
    float w[N], g[3][N], out[N];
    for (int i = 0; i < N; i++)
        w[i] = frand();
    ps_header h = ps_test_header(PS_MSG_INIT, 1, 1, 5, 0, 0), r;
    h.total = N;
    CHECK_OK(ps_test_rpc(d[1], &h, w, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    for (int round = 0; round < 2; round++) {
        /* magnitudes far apart, so another summation order gives other bits */
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < N; i++)
                g[k][i] = frand() * (k == 1 ? 1e-3f : 1e4f);
        /* worker 0 asks for version round+1: no answer until the round is done */
        h = ps_test_header(PS_MSG_PULL, 0, 50, 5, 0, round + 1);
        CHECK_OK(ps_test_send(d[0], &h, NULL, 0));
        size_t got;
        CHECK_EQ_INT(ps_test_recv(d[0], QUIET_MS, &r, out, N, &got), 1);
        int order[3] = {2, 0, 1}; /* rank 2 first: the sum must still go 0, 1, 2 */
        for (int j = 0; j < 3; j++) {
            int k = order[j];
            h = ps_test_header(PS_MSG_PUSH, k, 60 + (uint64_t)k, 5, 0, round);
            CHECK_OK(ps_test_rpc(d[k], &h, g[k], N, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_PUSH);
            CHECK_EQ_INT(r.chunk_version, j < 2 ? round : round + 1);
            if (j < 2)
                CHECK_EQ_INT(ps_test_recv(d[0], 50, &r, out, N, &got), 1);
        }
        CHECK_OK(ps_test_recv(d[0], PS_TEST_RPC_MS, &r, out, N, &got));
        CHECK_EQ_INT(r.type, PS_MSG_PULL);
        CHECK_EQ_INT(r.seq, 50);
        CHECK_EQ_INT(r.chunk_version, round + 1);
        CHECK_EQ_INT(got, N);
        for (int i = 0; i < N; i++) {
            float sum = g[0][i];
            sum = sum + g[1][i];
            sum = sum + g[2][i];
            float mean = sum / 3.0f;
            w[i] = w[i] - 0.25f * (mean + 0.0f * w[i]);
        }
        CHECK(memcmp(out, w, sizeof w) == 0);
    }
    /* pushpull: each worker's reply waits for the round, then brings version 3 */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < N; i++)
            g[k][i] = frand();
    for (int k = 2; k >= 0; k--) {
        h = ps_test_header(PS_MSG_PUSHPULL, k, 70 + (uint64_t)k, 5, 0, 2);
        CHECK_OK(ps_test_send(d[k], &h, g[k], N));
    }
    for (int i = 0; i < N; i++) {
        float sum = g[0][i];
        sum = sum + g[1][i];
        sum = sum + g[2][i];
        w[i] = w[i] - 0.25f * (sum / 3.0f + 0.0f * w[i]);
    }
    for (int k = 0; k < 3; k++) {
        size_t got;
        CHECK_OK(ps_test_recv(d[k], PS_TEST_RPC_MS, &r, out, N, &got));
        CHECK_EQ_INT(r.type, PS_MSG_PUSHPULL);
        CHECK_EQ_INT(r.seq, 70 + k);
        CHECK_EQ_INT(r.chunk_version, 3);
        CHECK(memcmp(out, w, sizeof w) == 0);
    }
    CHECK_EQ_INT(shutdown_server(&sv, d[0]), 0);
    for (int k = 0; k < 3; k++)
        zmq_close(d[k]);
}

PS_TEST(sync_duplicate_push_dropped_and_counted_future_push_refused)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode sync --lr 1 --quiet"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_SYNC, 2, 0));
    CHECK_OK(ps_test_hello(b, 1, PS_MODE_SYNC, 2, 0));
    float w[4] = {1, 2, 3, 4}, g0[4] = {1, 1, 1, 1}, g1[4] = {3, 3, 3, 3};
    float junk[4] = {100, 100, 100, 100};
    float out[4];
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 9, 0, 0), r;
    h.total = 4;
    CHECK_OK(ps_test_rpc(a, &h, w, 4, &r, NULL, 0, NULL));
    h = ps_test_header(PS_MSG_PUSH, 0, 2, 9, 0, 0);
    CHECK_OK(ps_test_rpc(a, &h, g0, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    /* same rank, same round: a duplicate (a resend), acknowledged, not applied */
    h = ps_test_header(PS_MSG_PUSH, 0, 3, 9, 0, 0);
    CHECK_OK(ps_test_rpc(a, &h, junk, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(r.chunk_version, 0);
    /* a round that is not open yet is refused */
    h = ps_test_header(PS_MSG_PUSH, 0, 4, 9, 0, 5);
    CHECK_OK(ps_test_rpc(a, &h, junk, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_ESTATE);
    CHECK_EQ_INT(r.seq, 4);
    h = ps_test_header(PS_MSG_PUSH, 1, 5, 9, 0, 0);
    CHECK_OK(ps_test_rpc(b, &h, g1, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.chunk_version, 1);
    /* a step below the version: duplicate again */
    h = ps_test_header(PS_MSG_PUSH, 1, 6, 9, 0, 0);
    CHECK_OK(ps_test_rpc(b, &h, junk, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(r.chunk_version, 1);
    h = ps_test_header(PS_MSG_PULL, 1, 7, 9, 0, 1);
    size_t got;
    CHECK_OK(ps_test_rpc(b, &h, NULL, 0, &r, out, 4, &got));
    CHECK_EQ_INT(r.chunk_version, 1);
    for (int i = 0; i < 4; i++)
        CHECK(out[i] == w[i] - 1.0f * ((g0[i] + g1[i]) / 2.0f)); /* = w - 2 */
    ps_stats st;
    CHECK_OK(ps_test_stats(sv.port, &st));
    CHECK_EQ_INT(st.dup_dropped, 2);
    CHECK_EQ_INT(st.updates, 1);
    CHECK_EQ_INT(st.errors, 1);
    CHECK_EQ_INT(st.min_version, 1);
    CHECK_EQ_INT(shutdown_server(&sv, a), 0);
    zmq_close(a);
    zmq_close(b);
}

PS_TEST(ssp_pull_waits_for_the_slowest_worker)
{
    ps_test_server sv;
    CHECK_OK(
        ps_test_server_start(&sv, 1, "--num-workers 2 --mode async --max-staleness 1 --quiet"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 2, 1));
    CHECK_OK(ps_test_hello(b, 1, PS_MODE_ASYNC, 2, 1));
    float w[3] = {0, 0, 0}, g[3] = {1, 1, 1}, out[3];
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 1, 0, 0), r;
    h.total = 3;
    CHECK_OK(ps_test_rpc(a, &h, w, 3, &r, NULL, 0, NULL));
    for (int t = 0; t < 3; t++) {
        h = ps_test_header(PS_MSG_PUSH, 0, 10 + (uint64_t)t, 1, 0, t);
        CHECK_OK(ps_test_rpc(a, &h, g, 3, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.chunk_version, t + 1);
    }
    size_t got;
    /* t = 1: slowest clock 0 >= 1 - 1, answered at once */
    h = ps_test_header(PS_MSG_PULL, 0, 20, 1, 0, 1);
    CHECK_OK(ps_test_rpc(a, &h, NULL, 0, &r, out, 3, &got));
    CHECK_EQ_INT(r.type, PS_MSG_PULL);
    /* t = 3 needs worker 1 at clock 2 */
    h = ps_test_header(PS_MSG_PULL, 0, 21, 1, 0, 3);
    CHECK_OK(ps_test_send(a, &h, NULL, 0));
    CHECK_EQ_INT(ps_test_recv(a, QUIET_MS, &r, out, 3, &got), 1);
    h = ps_test_header(PS_MSG_PUSH, 1, 30, 1, 0, 0);
    CHECK_OK(ps_test_rpc(b, &h, g, 3, &r, NULL, 0, NULL));
    CHECK_EQ_INT(ps_test_recv(a, 100, &r, out, 3, &got), 1);
    h = ps_test_header(PS_MSG_PUSH, 1, 31, 1, 0, 1);
    CHECK_OK(ps_test_rpc(b, &h, g, 3, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.chunk_version, 5);
    CHECK_OK(ps_test_recv(a, PS_TEST_RPC_MS, &r, out, 3, &got));
    CHECK_EQ_INT(r.type, PS_MSG_PULL);
    CHECK_EQ_INT(r.seq, 21);
    CHECK_EQ_INT(r.chunk_version, 5);
    float e = 0; /* five sgd steps of the default lr 0.01 */
    for (int t = 0; t < 5; t++)
        e = e - 0.01f * (1.0f + 0.0f * e);
    CHECK(out[0] == e && out[2] == e);
    CHECK_EQ_INT(shutdown_server(&sv, a), 0);
    zmq_close(a);
    zmq_close(b);
}

PS_TEST(hello_mismatch_refused_naming_both_values)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode sync --optimizer momentum "
                                          "--lr 0.05 --quiet"));
    void *s = ps_test_dealer(sv.port);
    ps_header r;
    struct {
        ps_hello cfg;
        const char *a, *b;
    } cases[6];
    cases[0].cfg = hello_cfg(PS_MODE_ASYNC, 2, PS_OPT_NONE, 0);
    cases[0].a = "sync", cases[0].b = "async";
    cases[1].cfg = hello_cfg(PS_MODE_SYNC, 3, PS_OPT_NONE, 0);
    cases[1].a = "has 2", cases[1].b = "has 3";
    cases[2].cfg = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_ADAM, 0.05f);
    cases[2].a = "momentum", cases[2].b = "adam";
    cases[3].cfg = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_MOMENTUM, 0.02f);
    cases[3].a = "0.05", cases[3].b = "0.02";
    cases[4].cfg = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_NONE, 0);
    cases[4].cfg.server_rank = 1;
    cases[4].a = "server-rank", cases[4].b = "has 1";
    cases[5].cfg = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_NONE, 0);
    cases[5].cfg.num_servers = 4;
    cases[5].a = "has 1", cases[5].b = "has 4";
    for (int i = 0; i < 6; i++) {
        CHECK_OK(hello_with(s, 0, &cases[i].cfg, &r));
        CHECK_EQ_INT(r.type, PS_MSG_ERROR);
        CHECK_EQ_INT(r.err_code, PS_EMISMATCH);
        CHECK_MSG(strstr(r.err_text, cases[i].a) && strstr(r.err_text, cases[i].b),
                  "case %d: '%s' should name '%s' and '%s'", i, r.err_text, cases[i].a,
                  cases[i].b);
    }
    /* refused hellos do not count: a push is still "before hello" */
    float v[2] = {1, 2};
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 5, 1, 0, 0);
    CHECK_OK(ps_test_rpc(s, &h, v, 2, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_EHELLO);
    /* a matching hello (optimizer named) gets the server's config back */
    ps_hello ok = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_MOMENTUM, 0.05f);
    ok.model_fp = 0x1234;
    CHECK_OK(hello_with(s, 0, &ok, &r));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    CHECK_EQ_INT(r.seq, 1000);
    CHECK_EQ_INT(r.hello.mode, PS_MODE_SYNC);
    CHECK_EQ_INT(r.hello.num_workers, 2);
    CHECK_EQ_INT(r.hello.max_staleness, 0);
    CHECK_EQ_INT(r.hello.opt.kind, PS_OPT_MOMENTUM);
    CHECK(r.hello.opt.lr == 0.05f);
    CHECK_EQ_INT(r.hello.model_fp, 0x1234);
    /* the first fingerprint accepted sticks */
    void *s2 = ps_test_dealer(sv.port);
    ps_hello other = hello_cfg(PS_MODE_SYNC, 2, PS_OPT_NONE, 0);
    other.model_fp = 0x9999;
    CHECK_OK(hello_with(s2, 1, &other, &r));
    CHECK_EQ_INT(r.err_code, PS_EMISMATCH);
    CHECK(strstr(r.err_text, "1234") && strstr(r.err_text, "9999"));
    CHECK_EQ_INT(shutdown_server(&sv, s), 0);
    zmq_close(s);
    zmq_close(s2);
}

PS_TEST(barrier_answers_when_every_worker_arrived)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 3 --quiet"));
    void *d[3];
    for (int k = 0; k < 3; k++) {
        d[k] = ps_test_dealer(sv.port);
        CHECK_OK(ps_test_hello(d[k], k, PS_MODE_ASYNC, 3, -1));
    }
    ps_header h, r;
    for (int k = 0; k < 2; k++) {
        h = ps_test_header(PS_MSG_BARRIER, k, 40 + (uint64_t)k, 0, 0, 7);
        CHECK_OK(ps_test_send(d[k], &h, NULL, 0));
    }
    /* a second barrier id in flight does not disturb the first */
    h = ps_test_header(PS_MSG_BARRIER, 0, 49, 0, 0, 8);
    CHECK_OK(ps_test_send(d[0], &h, NULL, 0));
    CHECK_EQ_INT(ps_test_recv(d[0], QUIET_MS, &r, NULL, 0, NULL), 1);
    CHECK_EQ_INT(ps_test_recv(d[1], 10, &r, NULL, 0, NULL), 1);
    h = ps_test_header(PS_MSG_BARRIER, 2, 42, 0, 0, 7);
    CHECK_OK(ps_test_send(d[2], &h, NULL, 0));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(ps_test_recv(d[k], PS_TEST_RPC_MS, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_BARRIER);
        CHECK_EQ_INT(r.seq, 40 + k);
        CHECK_EQ_INT(r.barrier_id, 7);
    }
    CHECK_EQ_INT(ps_test_recv(d[0], 50, &r, NULL, 0, NULL), 1); /* barrier 8 still open */
    /* heartbeat is answered by the I/O thread at once */
    h = ps_test_header(PS_MSG_HEARTBEAT, 1, 55, 0, 0, 0);
    CHECK_OK(ps_test_rpc(d[1], &h, NULL, 0, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_HEARTBEAT);
    CHECK_EQ_INT(r.seq, 55);
    /* shutdown answers the open barrier with PS_ECLOSED */
    CHECK_EQ_INT(shutdown_server(&sv, d[2]), 0);
    CHECK_OK(ps_test_recv(d[0], PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_ECLOSED);
    CHECK_EQ_INT(r.seq, 49);
    for (int k = 0; k < 3; k++)
        zmq_close(d[k]);
}

/* A sync workload over many chunks of several sizes: returns 0 and the final
 * weights of every chunk in out (concatenated). */
enum { NKEYS = 6, NCH = 2 };
static const size_t g_sizes[NKEYS] = {1, 7, 300, 1000, 33, 4};

static size_t total_elems(void)
{
    size_t t = 0;
    for (int k = 0; k < NKEYS; k++)
        t += g_sizes[k] * NCH;
    return t;
}

static int workload(const char *threads, float *out)
{
    ps_test_server sv;
    char flags[256];
    snprintf(flags, sizeof flags, "--num-workers 2 --mode sync --optimizer nesterov --lr 0.1 "
             "--momentum 0.8 --weight-decay 0.01 --threads %s --quiet", threads);
    if (ps_test_server_start(&sv, 1, flags) != 0)
        return -1;
    void *d[2] = {ps_test_dealer(sv.port), ps_test_dealer(sv.port)};
    int rc = -1;
    float buf[1000];
    ps_header h, r;
    uint64_t rng = 12345;
    if (ps_test_hello(d[0], 0, PS_MODE_SYNC, 2, 0) || ps_test_hello(d[1], 1, PS_MODE_SYNC, 2, 0))
        goto out;
    for (int k = 0; k < NKEYS; k++)
        for (int c = 0; c < NCH; c++) {
            for (size_t i = 0; i < g_sizes[k]; i++)
                buf[i] = (float)(k + 1) * 0.1f + (float)i * 0.001f - (float)c;
            h = ps_test_header(PS_MSG_INIT, k % 2, 1, 100 + (uint64_t)k, (uint32_t)c, 0);
            h.total = g_sizes[k] * NCH;
            if (ps_test_rpc(d[k % 2], &h, buf, g_sizes[k], &r, NULL, 0, NULL) ||
                r.type != PS_MSG_INIT)
                goto out;
        }
    for (int t = 0; t < 4; t++)
        for (int w = 1; w >= 0; w--) /* rank 1 first every round */
            for (int k = 0; k < NKEYS; k++)
                for (int c = 0; c < NCH; c++) {
                    for (size_t i = 0; i < g_sizes[k]; i++) {
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        buf[i] = (float)(int64_t)(rng >> 40) / (float)(1 << 22) - 1.0f;
                    }
                    h = ps_test_header(PS_MSG_PUSH, w, 2, 100 + (uint64_t)k, (uint32_t)c, t);
                    if (ps_test_rpc(d[w], &h, buf, g_sizes[k], &r, NULL, 0, NULL) ||
                        r.type != PS_MSG_PUSH)
                        goto out;
                }
    size_t o = 0, got;
    for (int k = 0; k < NKEYS; k++)
        for (int c = 0; c < NCH; c++) {
            h = ps_test_header(PS_MSG_PULL, 0, 3, 100 + (uint64_t)k, (uint32_t)c, 4);
            if (ps_test_rpc(d[0], &h, NULL, 0, &r, out + o, g_sizes[k], &got) ||
                r.type != PS_MSG_PULL || got != g_sizes[k] || r.chunk_version != 4)
                goto out;
            o += got;
        }
    rc = shutdown_server(&sv, d[0]);
out:
    zmq_close(d[0]);
    zmq_close(d[1]);
    return rc;
}

PS_TEST(two_update_threads_give_the_same_weights_as_one)
{
    /* the chunks really are split between the two threads */
    int used[2] = {0, 0};
    for (int k = 0; k < NKEYS; k++)
        for (int c = 0; c < NCH; c++)
            used[ps_server_owner(100 + (uint64_t)k, (uint32_t)c, 2)]++;
    CHECK(used[0] > 0 && used[1] > 0);
    size_t n = total_elems();
    float *one = calloc(n, sizeof(float)), *two = calloc(n, sizeof(float));
    CHECK(one && two);
    int r1 = workload("1", one), r2 = workload("2", two);
    int same = memcmp(one, two, n * sizeof(float)) == 0;
    free(one);
    free(two);
    CHECK_EQ_INT(r1, 0);
    CHECK_EQ_INT(r2, 0);
    CHECK(same);
}

PS_TEST(init_beyond_max_memory_refused_with_etoobig)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --max-memory 64K --optimizer adam --quiet"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
    static float v[8192];
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 1, 0, 0), r;
    /* 1000 floats x 3 arrays (weights, m, v) fit in 64 KiB */
    CHECK_OK(ps_test_rpc(s, &h, v, 1000, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    h.chunk = 1;
    CHECK_OK(ps_test_rpc(s, &h, v, 8192, &r, NULL, 0, NULL)); /* 96 KiB of state */
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_ETOOBIG);
    CHECK(strstr(r.err_text, "max-memory") != NULL);
    /* the refused chunk does not exist; the first one still works */
    h = ps_test_header(PS_MSG_PUSH, 0, 2, 1, 1, 0);
    CHECK_OK(ps_test_rpc(s, &h, v, 8192, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_ENOTFOUND);
    h = ps_test_header(PS_MSG_PUSH, 0, 3, 1, 0, 0);
    CHECK_OK(ps_test_rpc(s, &h, v, 1000, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    CHECK_EQ_INT(shutdown_server(&sv, s), 0);
    zmq_close(s);
}

PS_TEST(waiting_pull_gets_eclosed_on_sigterm_and_server_exits_0)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode sync --threads 2"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_SYNC, 2, 0));
    float v[3] = {1, 2, 3};
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 3, 0, 0), r;
    CHECK_OK(ps_test_rpc(s, &h, v, 3, &r, NULL, 0, NULL));
    h = ps_test_header(PS_MSG_PULL, 0, 2, 3, 0, 1);
    CHECK_OK(ps_test_send(s, &h, NULL, 0));
    CHECK_EQ_INT(ps_test_recv(s, 100, &r, NULL, 0, NULL), 1);
    kill(sv.pid, SIGTERM);
    CHECK_OK(ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_ECLOSED);
    CHECK_EQ_INT(r.seq, 2);
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(s);
}

PS_TEST(burst_of_pushes_all_applied_under_back_pressure_and_4mib_chunks_work)
{
    /* far more pushes than the internal queues hold: the server must pause
     * reading, not drop or block, and apply every one of them */
    enum { N = 16, CHUNKS = 4, PUSHES = 20000, BIG = 1 << 20 };
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --optimizer adam --threads 2 --verbose"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
    float buf[N] = {0}, out[N], expect[N] = {0}, m[N] = {0}, v[N] = {0}, ones[N];
    ps_header h, r;
    for (uint32_t c = 0; c < CHUNKS; c++) {
        h = ps_test_header(PS_MSG_INIT, 0, 1, 8, c, 0);
        CHECK_OK(ps_test_rpc(s, &h, buf, N, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_INIT);
    }
    for (int i = 0; i < N; i++)
        ones[i] = 1.0f;
    int acks = 0, bad = 0;
    for (int i = 0; i < PUSHES; i++) {
        h = ps_test_header(PS_MSG_PUSH, 0, (uint64_t)i, 8, (uint32_t)(i % CHUNKS), i / CHUNKS);
        CHECK_OK(ps_test_send(s, &h, ones, N));
        while (ps_test_recv(s, 0, &r, NULL, 0, NULL) == 0) {
            acks++;
            bad += r.type != PS_MSG_PUSH;
        }
    }
    while (acks < PUSHES && ps_test_recv(s, PS_TEST_RPC_MS, &r, NULL, 0, NULL) == 0) {
        acks++;
        bad += r.type != PS_MSG_PUSH;
    }
    CHECK_EQ_INT(acks, PUSHES);
    CHECK_EQ_INT(bad, 0);
    /* the same steps through the same kernel, here */
    for (int64_t t = 1; t <= PUSHES / CHUNKS; t++)
        ps_opt_adam(expect, m, v, ones, N, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, t);
    size_t got;
    for (uint32_t c = 0; c < CHUNKS; c++) {
        h = ps_test_header(PS_MSG_PULL, 0, 9, 8, c, 0);
        CHECK_OK(ps_test_rpc(s, &h, NULL, 0, &r, out, N, &got));
        CHECK_EQ_INT(r.chunk_version, PUSHES / CHUNKS);
        CHECK_EQ_INT(got, N);
        CHECK(memcmp(out, expect, sizeof out) == 0);
    }
    /* a 4 MiB chunk: init, two pushes, pull */
    float *big = calloc(BIG, sizeof(float)), *bout = calloc(BIG, sizeof(float));
    CHECK(big && bout);
    for (int i = 0; i < BIG; i++)
        big[i] = (float)i;
    h = ps_test_header(PS_MSG_INIT, 0, 1, 9, 0, 0);
    int ok = ps_test_rpc(s, &h, big, BIG, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_INIT;
    for (int k = 0; k < 2 && ok; k++) {
        h = ps_test_header(PS_MSG_PUSH, 0, 2, 9, 0, k);
        ok = ps_test_rpc(s, &h, big, BIG, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_PUSH;
    }
    h = ps_test_header(PS_MSG_PULL, 0, 3, 9, 0, 0);
    ok = ok && ps_test_rpc(s, &h, NULL, 0, &r, bout, BIG, &got) == 0 && got == BIG && r.chunk_version == 2;
    float b0 = bout[0], b1 = bout[BIG - 1];
    free(big);
    free(bout);
    CHECK(ok);
    CHECK(b0 == 0.0f);
    CHECK_NEAR(b1, (double)(BIG - 1) - 0.02, 1e-6);
    ps_stats st;
    CHECK_OK(ps_test_stats(sv.port, &st));
    CHECK_EQ_INT(st.updates, PUSHES + 2);
    CHECK_EQ_INT(st.errors, 0);
    CHECK_EQ_INT(st.chunks, CHUNKS + 1);
    CHECK_EQ_INT(shutdown_server(&sv, s), 0);
    FILE *f = fopen(sv.log, "r");
    char line[1024];
    int paused = 0;
    while (f && fgets(line, sizeof line, f))
        paused += strstr(line, "reads from the ROUTER pause") != NULL;
    if (f)
        fclose(f);
    printf("# the I/O thread paused reading %d times\n", paused);
    zmq_close(s);
}

/* ---------------- zero-copy pull replies ---------------- */

PS_TEST(pulls_in_flight_with_pushes_on_one_chunk_each_carry_exactly_their_version)
{
    /* pull replies are sent from the chunk's weight buffer (no copy); an
     * update while replies still hold it goes out of place.  Pushes of known
     * values (exact in float: lr 0.5, small integers), many pulls and
     * push-pulls in flight between them, replies read while the server keeps
     * updating: every reply must be w0 - lr * (sum of the first v pushes)
     * for the v it names, every element (a reply torn by a later update
     * would mix two versions). */
    enum { N = 16384, P = 240, R = 3 };
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --lr 0.5 --verbose"));
    void *s = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(s, 0, PS_MODE_ASYNC, 1, -1));
    static float w0[N], g[N], out[N];
    static double sum[P + 1]; /* sum of the per-push constants of the first v pushes */
    for (int i = 0; i < N; i++)
        w0[i] = (float)(i % 1000);
    sum[0] = 0;
    for (int k = 0; k < P; k++)
        sum[k + 1] = sum[k] + (double)(1 + k % 5);
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 5, 0, 0), r;
    CHECK_OK(ps_test_rpc(s, &h, w0, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    int replies = 0, weights = 0, bad_type = 0, bad_version = 0, bad_values = 0, first_bad = -1;
    int sent = 0;
    const int want = P * (1 + R);
    for (int k = 0; k <= P; k++) {
        if (k < P) {
            /* push k: g[i] = 1 + k % 5 + i % 3; every 4th is a push-pull */
            for (int i = 0; i < N; i++)
                g[i] = (float)(1 + k % 5 + i % 3);
            uint32_t type = k % 4 == 3 ? PS_MSG_PUSHPULL : PS_MSG_PUSH;
            h = ps_test_header(type, 0, 100000 + (uint64_t)k, 5, 0, k);
            CHECK_OK(ps_test_send(s, &h, g, N));
            for (int j = 0; j < R; j++) {
                h = ps_test_header(PS_MSG_PULL, 0, (uint64_t)k * R + (uint64_t)j, 5, 0, 0);
                CHECK_OK(ps_test_send(s, &h, NULL, 0));
            }
            sent += 1 + R;
        }
        /* read what has come, while pushes go on: in the first half with at
         * most three pushes' requests in flight (a few versions held by
         * replies: zero-copy, updates out of place), then with no limit
         * (every buffer held: replies are copies); at the end, everything */
        int window = k < P / 2 ? 3 * (1 + R) : want;
        size_t got;
        while (replies < want) {
            int wait = k == P || sent - replies > window;
            if (ps_test_recv(s, wait ? PS_TEST_RPC_MS : 0, &r, out, N, &got) != 0)
                break;
            replies++;
            if (r.type == PS_MSG_PUSH)
                continue;
            if (r.type != PS_MSG_PULL && r.type != PS_MSG_PUSHPULL) {
                bad_type++;
                continue;
            }
            /* one socket, one owner: requests are served in order, so a
             * reply names the version right after the push sent before it */
            int64_t k_of = r.type == PS_MSG_PUSHPULL ? (int64_t)r.seq - 100000
                                                     : (int64_t)(r.seq / R);
            int64_t v = r.chunk_version;
            bad_version += v != k_of + 1 || got != N;
            if (v < 0 || v > P || got != N)
                continue;
            weights++;
            for (int i = 0; i < N; i++) {
                double e = (double)w0[i] - 0.5 * (sum[v] + (double)v * (double)(i % 3));
                if (out[i] != (float)e) {
                    bad_values++;
                    if (first_bad < 0)
                        first_bad = (int)v;
                    break;
                }
            }
        }
    }
    CHECK_EQ_INT(replies, want);
    CHECK_EQ_INT(weights, P * R + P / 4);
    CHECK_EQ_INT(bad_type, 0);
    CHECK_EQ_INT(bad_version, 0);
    CHECK_MSG(bad_values == 0, "%d replies do not hold the weights of their version (first: %d)",
              bad_values, first_bad);
    ps_stats st;
    CHECK_OK(ps_test_stats(sv.port, &st));
    CHECK_EQ_INT(st.updates, P);
    CHECK_EQ_INT(st.bytes_out, (uint64_t)(P * R + P / 4) * N * 4);
    CHECK_EQ_INT(shutdown_server(&sv, s), 0);
    /* the zero-copy path ran: updates went out of place into a spare buffer */
    CHECK(ps_test_file_has(sv.log, "weight buffer 2 of at most"));
    zmq_close(s);
}

PS_TEST(stop_with_zero_copy_replies_still_queued_frees_them_and_exits_0)
{
    /* a worker that stops reading: zero-copy replies (and their weight
     * buffers) pile up in the server's ROUTER while pushes keep updating the
     * chunk; a shutdown then must free every buffer after the last reply is
     * dropped, with nothing used after free (the SAN=1 server checks) */
    enum { N = 1 << 18, K = 24 };
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --lr 0.5 --quiet"));
    void *ctx = zmq_ctx_new();
    void *a = zmq_socket(ctx, ZMQ_DEALER);
    int one = 1, zero = 0, small = 64 * 1024;
    zmq_setsockopt(a, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(a, ZMQ_RCVBUF, &small, sizeof small);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    CHECK_OK(zmq_connect(a, ep));
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    static float w[N];
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 6, 0, 0), r;
    CHECK_OK(ps_test_rpc(a, &h, w, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    for (int k = 0; k < K; k++) {
        h = ps_test_header(k % 2 ? PS_MSG_PUSHPULL : PS_MSG_PUSH, 0, 10 + (uint64_t)k, 6, 0, k);
        CHECK_OK(ps_test_send(a, &h, w, N));
        h = ps_test_header(PS_MSG_PULL, 0, 100 + (uint64_t)k, 6, 0, 0);
        CHECK_OK(ps_test_send(a, &h, NULL, 0));
    }
    /* every request served; most replies cannot leave the server */
    ps_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 500 && (st.updates < K || st.pulls < K + K / 2); i++) {
        CHECK_OK(ps_test_stats(sv.port, &st));
        if (st.updates < K || st.pulls < K + K / 2)
            ps_test_sleep_ms(10);
    }
    CHECK_EQ_INT(st.updates, K);
    CHECK_EQ_INT(st.pulls, K + K / 2);
    void *t = ps_test_dealer(sv.port);
    CHECK_EQ_INT(shutdown_server(&sv, t), 0);
    zmq_close(t);
    zmq_close(a);
    zmq_ctx_term(ctx);
}
