/* What ps.torch asks of the servers (docs/PROTOCOL.md "ps.torch's
 * messages"), first on the modules alone, then through libps and a live
 * bin/ps_server: the worker-side optimizer kinds (average, add),
 * hyper-parameters that change from a given round, a chunk's weights
 * overwritten, its optimizer state read and loaded, the step a restarted
 * worker goes on from, allreduce and broadcast, and a worker leaving.
 * Values are compared bit for bit where the arithmetic is the shard's own
 * float formula. */
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "collective.h"
#include "optimizer.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_opt_table.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"
#include "shard.h"

static ps_shard *shard(int mode, int W, int kind, float lr)
{
    static ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = mode;
    sc.max_staleness = mode == PS_MODE_SYNC ? 0 : -1;
    sc.num_workers = W;
    ps_opt_default(&sc.opt);
    sc.opt.kind = kind;
    sc.opt.lr = lr;
    sc.max_memory = 1 << 20;
    ps_shard *s = NULL;
    return ps_shard_create(&sc, &hk, &s) == 0 ? s : NULL;
}

static const float *weights(ps_shard *s, int64_t *v)
{
    return ps_shard_weights(s, 1, 0, NULL, v);
}

/* push g (n floats) of `step` from `rank` to key 1 chunk 0; its version after */
static int64_t push(ps_shard *s, int rank, int64_t step, const float *g, size_t n)
{
    int kept, dup;
    int64_t v = -1;
    char why[256];
    if (ps_shard_push(s, 1, 0, rank, step, g, n, NULL, &kept, &dup, &v, why, sizeof why))
        return -1;
    return dup ? -2 : v;
}

/* ---------------- the worker-side kinds ---------------- */

PS_TEST(average_and_add_set_and_add_the_push_in_and_out_of_place)
{
    int kind;
    CHECK_OK(ps_opt_parse("average", &kind));
    CHECK_EQ_INT(kind, PS_OPT_AVERAGE);
    CHECK_OK(ps_opt_parse("add", &kind));
    CHECK_EQ_INT(kind, PS_OPT_ADD);
    CHECK_EQ_INT(ps_opt_parse("ftrl", &kind), PS_EINVAL); /* the tables' 6: no dense kind */
    CHECK(!ps_opt_kind_valid(6) && !ps_opt_kind_valid(PS_OPT_NONE) && ps_opt_kind_valid(8));
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_AVERAGE), 0);
    CHECK_EQ_INT(ps_opt_state_arrays(PS_OPT_ADD), 0);
    char d[64];
    ps_opt_config c;
    ps_opt_default(&c);
    c.kind = PS_OPT_ADD;
    ps_opt_describe(&c, d, sizeof d);
    CHECK_STR(d, "add"); /* no hyper-parameter to show */
    float g[5] = {0.5f, -1.25f, 3.0f, 1e-7f, -0.0f};
    for (int k = PS_OPT_AVERAGE; k <= PS_OPT_ADD; k++) {
        c.kind = k;
        c.lr = 0.1f; /* not used: the push is the update */
        float w[5] = {1, 2, 3, 4, 5}, in[5] = {1, 2, 3, 4, 5}, out[5];
        CHECK_OK(ps_opt_apply(&c, w, NULL, NULL, g, 5, 7));
        CHECK_OK(ps_opt_apply_to(&c, in, out, NULL, NULL, g, 5, 7));
        for (int i = 0; i < 5; i++) {
            float want = k == PS_OPT_AVERAGE ? g[i] : (float)(i + 1) + g[i];
            CHECK(memcmp(&w[i], &want, 4) == 0 && memcmp(&out[i], &want, 4) == 0);
        }
    }
}

PS_TEST(average_round_is_the_rank_order_mean_and_needs_sync)
{
    CHECK(shard(PS_MODE_ASYNC, 2, PS_OPT_AVERAGE, 0.1f) == NULL);
    ps_shard *s = shard(PS_MODE_SYNC, 3, PS_OPT_AVERAGE, 0.1f);
    CHECK(s != NULL);
    float w0[2] = {7, 7}, g[3][2] = {{1e8f, 1}, {1, -1e8f}, {-1e8f, 3}};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 2, 2, &v, NULL, why, sizeof why));
    for (int step = 0; step < 2; step++)
        for (int r = 2; r >= 0; r--) /* against rank order: the sum is still 0, 1, 2 */
            CHECK_EQ_INT(push(s, r, step, g[r], 2), r ? step : step + 1);
    const float *w = weights(s, &v);
    for (int i = 0; i < 2; i++) {
        float want = (g[0][i] + g[1][i] + g[2][i]) / 3.0f;
        CHECK(memcmp(&w[i], &want, 4) == 0);
    }
    CHECK_EQ_INT(v, 2);
    ps_shard_destroy(s);
}

PS_TEST(add_applies_a_sum_of_deltas_as_their_sum)
{
    ps_shard *s = shard(PS_MODE_ASYNC, 2, PS_OPT_ADD, 1.0f);
    float w0[2] = {1, 2}, d[2] = {0.25f, -0.5f};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 2, 2, &v, NULL, why, sizeof why));
    CHECK_EQ_INT(push(s, 0, 0, d, 2), 1);
    /* three deltas summed by the worker while the wire was busy: not their mean */
    int kept, dup;
    float sum[2] = {3 * d[0], 3 * d[1]};
    CHECK_OK(ps_shard_push_sum(s, 1, 0, 1, 0, 3, sum, 2, NULL, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(v, 4);
    const float *w = weights(s, &v);
    CHECK(w[0] == 1 + 4 * d[0] && w[1] == 2 + 4 * d[1]);
    ps_shard_destroy(s);
}

/* ---------------- hyper-parameters from a round on ---------------- */

PS_TEST(a_hyper_parameter_change_applies_from_its_round_on)
{
    /* sgd, one worker, weight 0, gradient 1: round t moves the weight by lr */
    ps_shard *s = shard(PS_MODE_SYNC, 1, PS_OPT_SGD, 0.125f);
    float w0[1] = {0}, g[1] = {1};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 1, 1, &v, NULL, why, sizeof why));
    ps_opt_config c;
    ps_opt_default(&c);
    c.lr = 0.5f;
    CHECK_OK(ps_shard_set_opt(s, 2, &c)); /* rounds 2 and on */
    c.lr = 0.25f;
    CHECK_OK(ps_shard_set_opt(s, 4, &c)); /* rounds 4 and on */
    float want = 0;
    const float lrs[6] = {0.125f, 0.125f, 0.5f, 0.5f, 0.25f, 0.25f};
    for (int t = 0; t < 6; t++) {
        CHECK_EQ_INT(push(s, 0, t, g, 1), t + 1);
        want = want - lrs[t] * (1.0f + 0.0f * want);
        const float *w = weights(s, &v);
        CHECK_MSG(w[0] == want, "round %d: %g, want %g", t, (double)w[0], (double)want);
    }
    /* a change for a round the chunk has passed: from its open round */
    c.lr = 1.0f;
    CHECK_OK(ps_shard_set_opt(s, 1, &c));
    CHECK_EQ_INT(push(s, 0, 6, g, 1), 7);
    CHECK(weights(s, &v)[0] == want - 1.0f);
    /* the kind never changes */
    c.kind = PS_OPT_ADAM;
    CHECK_EQ_INT(ps_shard_set_opt(s, 9, &c), PS_EINVAL);
    ps_shard_destroy(s);
    /* async: from the next push */
    s = shard(PS_MODE_ASYNC, 1, PS_OPT_SGD, 0.125f);
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 1, 1, &v, NULL, why, sizeof why));
    CHECK_EQ_INT(push(s, 0, 0, g, 1), 1);
    c.kind = PS_OPT_SGD;
    c.lr = 0.5f;
    CHECK_OK(ps_shard_set_opt(s, 0, &c));
    CHECK_EQ_INT(push(s, 0, 1, g, 1), 2);
    CHECK(weights(s, &v)[0] == -0.625f);
    ps_shard_destroy(s);
}

/* ---------------- weights, state, clocks ---------------- */

PS_TEST(assign_keeps_version_and_state_and_state_round_trips_bitwise)
{
    enum { N = 3 };
    float w0[N] = {0.5f, -1, 2}, g[6][N];
    for (int t = 0; t < 6; t++)
        for (int i = 0; i < N; i++)
            g[t][i] = (float)((t + 1) * (i + 2) % 7) * 0.37f - 1.1f;
    /* a: 3 steps, saved, then step 4 */
    ps_shard *a = shard(PS_MODE_SYNC, 1, PS_OPT_ADAM, 0.01f);
    ps_shard *b = shard(PS_MODE_SYNC, 1, PS_OPT_ADAM, 0.01f);
    int64_t v, step;
    char why[256];
    CHECK_OK(ps_shard_init(a, 1, 0, w0, N, N, &v, NULL, why, sizeof why));
    CHECK_OK(ps_shard_init(b, 1, 0, w0, N, N, &v, NULL, why, sizeof why));
    for (int t = 0; t < 3; t++)
        push(a, 0, t, g[t], N);
    float saved_w[N], saved_st[2 * N];
    const float *st[2];
    int nstate;
    size_t n;
    memcpy(saved_w, weights(a, &v), sizeof saved_w);
    CHECK_OK(ps_shard_get_state(a, 1, 0, st, &nstate, &n, &step, why, sizeof why));
    CHECK(nstate == 2 && n == N && step == 3);
    memcpy(saved_st, st[0], N * 4);
    memcpy(saved_st + N, st[1], N * 4);
    push(a, 0, 3, g[3], N);
    /* b: 5 other steps, then the saved weights and state, then step 4 */
    for (int t = 0; t < 5; t++)
        push(b, 0, t, g[5 - t], N);
    CHECK_OK(ps_shard_assign(b, 1, 0, saved_w, N, &v, why, sizeof why));
    CHECK_EQ_INT(v, 5); /* the version stays */
    CHECK_OK(ps_shard_set_state(b, 1, 0, saved_st, 2 * N, 3, &v, why, sizeof why));
    CHECK_OK(ps_shard_get_state(b, 1, 0, st, &nstate, &n, &step, why, sizeof why));
    CHECK_EQ_INT(step, 3);
    CHECK(memcmp(st[0], saved_st, N * 4) == 0 && memcmp(st[1], saved_st + N, N * 4) == 0);
    CHECK(memcmp(weights(b, &v), saved_w, sizeof saved_w) == 0);
    CHECK_EQ_INT(push(b, 0, 5, g[3], N), 6);
    CHECK(memcmp(weights(b, &v), weights(a, &v), sizeof saved_w) == 0);
    CHECK_OK(ps_shard_get_state(b, 1, 0, st, &nstate, &n, &step, why, sizeof why));
    CHECK_EQ_INT(step, 4);
    /* refused: a length that does not fit, a kind without state */
    CHECK_EQ_INT(ps_shard_set_state(b, 1, 0, saved_st, N, 3, &v, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_shard_assign(b, 1, 0, saved_w, N - 1, &v, why, sizeof why), PS_EPROTO);
    CHECK_EQ_INT(ps_shard_assign(b, 2, 0, saved_w, N, &v, why, sizeof why), PS_ENOTFOUND);
    ps_shard_destroy(a);
    ps_shard_destroy(b);
    ps_shard *s = shard(PS_MODE_SYNC, 1, PS_OPT_SGD, 0.1f);
    CHECK_OK(ps_shard_init(s, 1, 0, w0, N, N, &v, NULL, why, sizeof why));
    CHECK_OK(ps_shard_get_state(s, 1, 0, st, &nstate, &n, &step, why, sizeof why));
    CHECK_EQ_INT(nstate, 0);
    CHECK_EQ_INT(ps_shard_set_state(s, 1, 0, saved_st, N, 0, &v, why, sizeof why), PS_EPROTO);
    ps_shard_destroy(s);
}

PS_TEST(clock_is_the_open_round_in_sync_and_the_rank_pushes_in_async)
{
    float w0[1] = {0}, g[1] = {1};
    int64_t v, step;
    char why[256];
    ps_shard *s = shard(PS_MODE_SYNC, 2, PS_OPT_SGD, 0.1f);
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 1, 1, &v, NULL, why, sizeof why));
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 2; r++)
            push(s, r, t, g, 1);
    push(s, 1, 3, g, 1); /* rank 1 is in round 3 already */
    for (int r = 0; r < 2; r++) {
        CHECK_OK(ps_shard_clock(s, 1, 0, r, &step, why, sizeof why));
        CHECK_EQ_INT(step, 3);
    }
    /* rank 1 going on from there pushes a harmless duplicate */
    CHECK_EQ_INT(push(s, 1, 3, g, 1), -2);
    CHECK_EQ_INT(ps_shard_clock(s, 1, 0, 2, &step, why, sizeof why), PS_EPROTO);
    ps_shard_destroy(s);
    s = shard(PS_MODE_ASYNC, 2, PS_OPT_SGD, 0.1f);
    CHECK_OK(ps_shard_init(s, 1, 0, w0, 1, 1, &v, NULL, why, sizeof why));
    for (int t = 0; t < 5; t++)
        push(s, 0, t, g, 1);
    push(s, 1, 0, g, 1);
    CHECK_OK(ps_shard_clock(s, 1, 0, 0, &step, why, sizeof why));
    CHECK_EQ_INT(step, 5);
    CHECK_OK(ps_shard_clock(s, 1, 0, 1, &step, why, sizeof why));
    CHECK_EQ_INT(step, 1);
    ps_shard_destroy(s);
}

/* ---------------- collectives ---------------- */

typedef struct got {
    int n;
    ps_header h[8];
    float pay[8][4];
} got;

static void record(void *user, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    (void)id;
    got *g = user;
    if (g->n < 8) {
        g->h[g->n] = *h;
        if (payload && zmq_msg_size(payload) <= sizeof g->pay[0])
            memcpy(g->pay[g->n], zmq_msg_data(payload), zmq_msg_size(payload));
    }
    g->n++;
}

static int arrive(ps_colls *c, uint32_t type, int rank, uint64_t seq, int64_t id,
                  const float *p, uint64_t n, const char **why)
{
    ps_header h;
    ps_header_init(&h, type);
    h.rank = rank;
    h.seq = seq;
    h.barrier_id = id;
    h.count = n;
    h.dtype = PS_DTYPE_F32;
    zmq_msg_t route;
    zmq_msg_init_size(&route, 4);
    int rc = ps_colls_arrive(c, &route, &h, p, why);
    zmq_msg_close(&route);
    return rc;
}

PS_TEST(allreduce_is_the_rank_order_mean_of_the_live_workers)
{
    got g = {0};
    ps_colls *c;
    CHECK_OK(ps_colls_create(3, (ps_coll_to){&g, record}, &c));
    float x[3][2] = {{1e8f, 1}, {1, -1e8f}, {-1e8f, 3}};
    const char *why;
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 2, 12, 5, x[2], 2, &why));
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 0, 10, 5, x[0], 2, &why));
    CHECK_EQ_INT(g.n, 0);
    /* a resend waits on, a second contribution under the id is refused */
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 0, 10, 5, x[0], 2, &why));
    CHECK_EQ_INT(arrive(c, PS_MSG_ALLREDUCE, 0, 11, 5, x[0], 2, &why), PS_EPROTO);
    CHECK_EQ_INT(arrive(c, PS_MSG_ALLREDUCE, 1, 13, 5, x[1], 1, &why), PS_EPROTO); /* length */
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 1, 14, 5, x[1], 2, &why));
    CHECK_EQ_INT(g.n, 3);
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(g.h[k].type, PS_MSG_ALLREDUCE);
        CHECK_EQ_INT(g.h[k].barrier_id, 5);
        for (int i = 0; i < 2; i++) {
            float want = ((x[0][i] + x[1][i]) + x[2][i]) / 3.0f;
            CHECK(memcmp(&g.pay[k][i], &want, 4) == 0);
        }
    }
    CHECK_EQ_INT(arrive(c, PS_MSG_ALLREDUCE, 0, 20, 5, x[0], 2, &why), PS_ESTATE); /* done */
    /* rank 1 leaves: the next one is the mean of the other two */
    ps_colls_set_live(c, 1, 0);
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 0, 21, 6, x[0], 2, &why));
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 2, 22, 6, x[2], 2, &why));
    CHECK_EQ_INT(g.n, 5);
    float want = (x[0][1] + x[2][1]) / 2.0f;
    CHECK(memcmp(&g.pay[4][1], &want, 4) == 0);
    ps_colls_destroy(c);
}

PS_TEST(broadcast_gives_rank_0s_bytes_and_fails_without_rank_0)
{
    got g = {0};
    ps_colls *c;
    CHECK_OK(ps_colls_create(2, (ps_coll_to){&g, record}, &c));
    uint32_t bits[3] = {0x7fa00001u, 0x80000000u, 0xdeadbeefu}; /* a NaN, -0: kept as they are */
    float src[3], other[3] = {0};
    memcpy(src, bits, sizeof src);
    const char *why;
    CHECK_OK(arrive(c, PS_MSG_BROADCAST, 1, 1, 0, other, 3, &why));
    CHECK_OK(arrive(c, PS_MSG_BROADCAST, 0, 2, 0, src, 3, &why));
    CHECK_EQ_INT(g.n, 2);
    CHECK(memcmp(g.pay[0], bits, sizeof bits) == 0 && memcmp(g.pay[1], bits, sizeof bits) == 0);
    /* the same id as an allreduce is another collective */
    CHECK_OK(arrive(c, PS_MSG_ALLREDUCE, 1, 3, 0, other, 3, &why));
    CHECK_OK(arrive(c, PS_MSG_BROADCAST, 1, 4, 1, other, 3, &why));
    ps_colls_set_live(c, 0, 0); /* the broadcast has lost its source */
    CHECK_EQ_INT(g.n, 4);
    CHECK_EQ_INT(g.h[2].type, PS_MSG_ALLREDUCE); /* rank 1 alone now: its own mean */
    CHECK_EQ_INT(g.h[3].type, PS_MSG_ERROR);
    CHECK_EQ_INT(g.h[3].err_code, PS_ESTATE);
    ps_colls_close(c);
    ps_colls_destroy(c);
}

/* ---------------- through libps and bin/ps_server ---------------- */

typedef struct srv {
    int pid;
    char ep[64], log[256];
} srv;

static int srv_start(srv *s, int nw, const char *mode, const char *opt)
{
    char words[512], bin[256];
    if (access(ps_test_bin("ps_server", bin, sizeof bin), X_OK) != 0)
        return -1;
    snprintf(s->ep, sizeof s->ep, "tcp://127.0.0.1:%d", ps_test_free_port());
    snprintf(s->log, sizeof s->log, "%s/torch-server-%s.log", ps_test_tmpdir(),
             strrchr(s->ep, ':') + 1);
    snprintf(words, sizeof words, "--bind %s --num-workers %d --mode %s %s --threads 1",
             s->ep, nw, mode, opt);
    s->pid = ps_test_spawn_words("ps_server", words, s->log);
    return s->pid > 0 ? 0 : -1;
}

static ps_client *client(const srv *s, int rank, int nw, int mode)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = s->ep;
    o.rank = rank;
    o.num_workers = nw;
    o.mode = mode;
    o.shm = 0;
    ps_client *c = NULL;
    if (ps_client_open(&o, &c) || ps_client_register(c, 9, 4) || ps_client_start(c)) {
        ps_client_close(c);
        return NULL;
    }
    return c;
}

PS_TEST(hyper_state_clock_and_assign_through_a_server)
{
    srv s;
    if (srv_start(&s, 1, "sync", "--optimizer momentum --lr 0.5 --momentum 0.5") != 0)
        SKIP("bin/ps_server is not built");
    ps_client *c = client(&s, 0, 1, PS_MODE_SYNC);
    CHECK(c != NULL);
    float w[4] = {0, 0, 0, 0}, g[4] = {1, 1, 1, 1}, st[4];
    ps_request r;
    CHECK_OK(ps_client_init(c, 9, w, &r));
    CHECK_OK(ps_request_wait(&r));
    ps_opt_config q, now;
    memset(&q, 0, sizeof q);
    CHECK_OK(ps_client_hyper(c, &q, 0, &now)); /* a question */
    CHECK(now.kind == PS_OPT_MOMENTUM && now.lr == 0.5f);
    /* lr 0.25 from round 1 on: round 0 moves by 0.5, round 1 by 0.25 * (0.5 + 1) */
    q.lr = 0.25f;
    q.given = PS_OPT_GIVEN(lr);
    CHECK_OK(ps_client_hyper(c, &q, 1, &now));
    CHECK(now.lr == 0.25f);
    for (int t = 0; t < 2; t++) {
        CHECK_OK(ps_client_pushpull(c, 9, g, w, t, &r));
        CHECK_OK(ps_request_wait(&r));
    }
    CHECK_MSG(w[0] == -0.5f - 0.375f, "%g", (double)w[0]);
    CHECK_OK(ps_client_state(c, 9, st, 1, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK(st[0] == 1.5f && r.version == 2);
    /* another kind, or a value out of range: refused, naming why */
    q.kind = PS_OPT_ADAM;
    CHECK_EQ_INT(ps_client_hyper(c, &q, 2, NULL), PS_EMISMATCH);
    CHECK(strstr(ps_client_last_error(c), "the server runs momentum"));
    q.kind = PS_OPT_NONE;
    q.lr = -1;
    CHECK_EQ_INT(ps_client_hyper(c, &q, 2, NULL), PS_EINVAL);
    /* loaded state and weights, at step 2 */
    float w2[4] = {3, 3, 3, 3}, st2[4] = {0, 0, 0, 0};
    CHECK_OK(ps_client_assign(c, 9, w2, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_OK(ps_client_set_state(c, 9, st2, 1, 2, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_OK(ps_client_clock(c, 9, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_EQ_INT(r.version, 2);
    CHECK_OK(ps_client_pushpull(c, 9, g, w, 2, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK(w[3] == 3.0f - 0.25f);
    ps_client_close(c);
    ps_test_stop(s.pid, 3000);
}

PS_TEST(collectives_and_leave_through_a_server)
{
    srv s;
    if (srv_start(&s, 2, "sync", "--optimizer sgd --lr 1") != 0)
        SKIP("bin/ps_server is not built");
    ps_client *c0 = client(&s, 0, 2, PS_MODE_SYNC), *c1 = client(&s, 1, 2, PS_MODE_SYNC);
    CHECK(c0 && c1);
    float x0[2] = {1, 4}, x1[2] = {2, 8}, y0[2], y1[2];
    ps_request r0, r1;
    CHECK_OK(ps_client_allreduce(c0, 1, x0, y0, 2, &r0));
    CHECK_OK(ps_client_allreduce(c1, 1, x1, y1, 2, &r1));
    CHECK_OK(ps_request_wait(&r0));
    CHECK_OK(ps_request_wait(&r1));
    CHECK(y0[0] == 1.5f && y0[1] == 6.0f && y1[0] == 1.5f && y1[1] == 6.0f);
    CHECK_OK(ps_client_broadcast(c1, 1, x1, y1, 2, &r1));
    CHECK_OK(ps_client_broadcast(c0, 1, x0, y0, 2, &r0));
    CHECK_OK(ps_request_wait(&r0));
    CHECK_OK(ps_request_wait(&r1));
    CHECK(y1[0] == 1 && y1[1] == 4 && y0[0] == 1);
    /* worker 1 leaves: rounds and barriers go on with worker 0 alone */
    float w[4] = {0, 0, 0, 0}, g[4] = {1, 1, 1, 1};
    CHECK_OK(ps_client_init(c0, 9, w, &r0));
    CHECK_OK(ps_request_wait(&r0));
    CHECK_OK(ps_client_leave(c1));
    CHECK_OK(ps_client_pushpull(c0, 9, g, w, 0, &r0));
    CHECK_OK(ps_request_wait(&r0));
    CHECK(w[0] == -1.0f);
    CHECK_OK(ps_client_barrier(c0, 3));
    /* its pulls are still answered */
    CHECK_OK(ps_client_pull(c1, 9, w, 0, &r1));
    CHECK_OK(ps_request_wait(&r1));
    CHECK(w[1] == -1.0f);
    ps_client_close(c0);
    ps_client_close(c1);
    ps_test_stop(s.pid, 3000);
}

PS_TEST(the_start_barrier_gives_up_after_the_wait_timeout)
{
    srv s;
    if (srv_start(&s, 2, "sync", "--optimizer sgd --lr 1") != 0)
        SKIP("bin/ps_server is not built");
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = s.ep;
    o.num_workers = 2;
    o.mode = PS_MODE_SYNC;
    o.shm = 0;
    ps_backend *b;
    ps_exchange *x;
    CHECK_OK(ps_backend_host_create(&b));
    CHECK_OK(ps_exchange_open(&o, b, &x));
    float w[4] = {0}, g[4] = {0};
    CHECK_OK(ps_exchange_add(x, 9, 4, w, g, 0));
    ps_exchange_set_init(x, 1);
    ps_exchange_set_wait_timeout(x, 1500);
    int64_t t0 = ps_now_ns();
    CHECK_EQ_INT(ps_exchange_start(x), PS_ETIMEDOUT); /* worker 1 never comes */
    int64_t ms = (ps_now_ns() - t0) / 1000000;
    CHECK_MSG(ms >= 1400 && ms < 4000, "gave up after %lld ms", (long long)ms);
    ps_exchange_close(x);
    ps_backend_host_destroy(b);
    ps_test_stop(s.pid, 3000);
}
