/* The shard store on its own (server/shard.h): no sockets, no threads.
 * Each case drives ps_shards through their API and checks what they answer,
 * what their hooks were called with (ps_test_server.h records them) and the
 * memory they charge: sync sums in rank order whatever the arrival order,
 * rounds over the live set, queued pulls and kept gradients at destroy, the
 * memory bound, and the pinned weight buffers that pull replies send without
 * a copy.  Values are compared bit for bit: the arithmetic is the shard's
 * own float formula. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "shard.h"

/* ---------------- rounds ---------------- */

PS_TEST(shard_sync_sum_is_rank_order_whatever_the_arrival_order)
{
    enum { W = 4 };
    /* values whose float sum depends on the order */
    static const float g[W][2] = {{1e8f, 1.0f}, {1.0f, -1e8f}, {-1e8f, 3.0f}, {1.5f, 1e8f}};
    float expect[2];
    for (int i = 0; i < 2; i++) {
        float s = g[0][i];
        for (int k = 1; k < W; k++)
            s = s + g[k][i];
        expect[i] = 5.0f - 1.0f * (s / (float)W + 0.0f * 5.0f);
    }
    static const int orders[4][W] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}, {1, 3, 0, 2}};
    for (int o = 0; o < 4; o++) {
        ps_test_hook_log log;
        ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
        ps_shard_config sc = {PS_MODE_SYNC, 0, W, {PS_OPT_SGD, 1.0f, 0, 0, 0, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL}, 1 << 20,
                              NULL, 1};
        ps_shard *s;
        CHECK_OK(ps_shard_create(&sc, &hk, &s));
        float w0[2] = {5.0f, 5.0f};
        int64_t v;
        char why[256];
        CHECK_OK(ps_shard_init(s, 1, 0, w0, 2, 2, &v, NULL, why, sizeof why));
        int queued;
        const float *pw;
        size_t n;
        CHECK_OK(ps_shard_pull(s, 1, 0, 0, 1, (void *)1, &queued, &pw, &n, &v, why, sizeof why));
        CHECK_EQ_INT(queued, 1);
        int kept_total = 0;
        for (int j = 0; j < W; j++) {
            int k = orders[o][j], kept, dup;
            CHECK_OK(ps_shard_push(s, 1, 0, k, 0, g[k], 2, (void *)2, &kept, &dup, &v, why,
                                   sizeof why));
            CHECK_EQ_INT(dup, 0);
            kept_total += kept;
            CHECK_EQ_INT(log.ready, j == W - 1 ? 1 : 0);
        }
        CHECK_EQ_INT(log.released, kept_total); /* every kept gradient given back */
        CHECK_EQ_INT(log.version, 1);
        CHECK_MSG(memcmp(log.w, expect, sizeof expect) == 0, "order %d: %.9g %.9g vs %.9g %.9g",
                  o, (double)log.w[0], (double)log.w[1], (double)expect[0], (double)expect[1]);
        ps_shard_destroy(s);
        CHECK_EQ_INT(log.cancelled, 0);
    }
}

/* rounds over the live set (--on-worker-loss drop) */
PS_TEST(shard_round_skips_a_dropped_lowest_rank_and_takes_it_back)
{
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = PS_MODE_SYNC;
    sc.num_workers = 3;
    sc.opt.kind = PS_OPT_SGD;
    sc.opt.lr = 1.0f;
    sc.opt.eps = 1e-8f;
    sc.max_memory = 1 << 20;
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    float w[2] = {10, 20}, g[3][2] = {{1e8f, 1}, {1, -1e8f}, {-1e8f, 3}};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 1, 0, w, 2, 2, &v, NULL, why, sizeof why));
    int kept, dup, queued;
    const float *pw;
    size_t n;
    ps_shard_set_live(s, 0, 0);
    CHECK_OK(ps_shard_pull(s, 1, 0, 1, 1, (void *)1, &queued, &pw, &n, &v, why, sizeof why));
    CHECK_EQ_INT(queued, 1);
    /* rank 2 first: kept, then rank 1 completes the round of the two live */
    CHECK_OK(ps_shard_push(s, 1, 0, 2, 0, g[2], 2, (void *)2, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(kept, 1);
    CHECK_EQ_INT(log.ready, 0);
    CHECK_OK(ps_shard_push(s, 1, 0, 1, 0, g[1], 2, (void *)3, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(log.ready, 1);
    CHECK_EQ_INT(log.version, 1);
    for (int i = 0; i < 2; i++)
        w[i] = w[i] - 1.0f * ((g[1][i] + g[2][i]) / 2.0f + 0.0f * w[i]);
    CHECK(memcmp(log.w, w, sizeof w) == 0);
    /* round 1 opens with rank 0 still out: the sum skips it, waits for rank 1 */
    CHECK_OK(ps_shard_push(s, 1, 0, 2, 1, g[2], 2, (void *)4, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(v, 1);
    /* rank 0 comes back after the sum passed it: it joins the next round */
    ps_shard_set_live(s, 0, 1);
    CHECK_OK(ps_shard_push(s, 1, 0, 1, 1, g[1], 2, (void *)5, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(v, 2);
    CHECK_OK(ps_shard_push(s, 1, 0, 0, 1, g[0], 2, (void *)6, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(dup, 1);
    for (int i = 0; i < 2; i++)
        w[i] = w[i] - 1.0f * ((g[1][i] + g[2][i]) / 2.0f + 0.0f * w[i]);
    /* round 2 waits for all three again, summed in rank order */
    for (int k = 2; k >= 0; k--) {
        CHECK_OK(ps_shard_push(s, 1, 0, k, 2, g[k], 2, (void *)7, &kept, &dup, &v, why,
                               sizeof why));
        CHECK_EQ_INT(dup, 0);
        CHECK_EQ_INT(v, k == 0 ? 3 : 2);
    }
    CHECK_OK(ps_shard_pull(s, 1, 0, 0, 3, (void *)8, &queued, &pw, &n, &v, why, sizeof why));
    CHECK_EQ_INT(queued, 0);
    for (int i = 0; i < 2; i++) {
        float sum = g[0][i];
        sum = sum + g[1][i];
        sum = sum + g[2][i];
        w[i] = w[i] - 1.0f * (sum / 3.0f + 0.0f * w[i]);
    }
    CHECK(memcmp(pw, w, sizeof w) == 0);
    ps_shard_destroy(s);
    CHECK_EQ_INT(log.released, 4); /* every kept gradient given back */
}

/* The round's sum and mean over a chunk long enough for the vector passes
 * (and a tail): bit for bit the scalar formula, whether the last gradient
 * of the round divides as it is added (every rank after it out) or the
 * round ends on a skipped rank and divides in a pass of its own. */
PS_TEST(shard_sync_mean_of_a_long_chunk_is_the_rank_order_formula)
{
    enum { W = 3, N = 1037 };
    static float g[W][N], w0[N], expect[N];
    for (int k = 0; k < W; k++)
        for (int i = 0; i < N; i++) /* magnitudes far apart: the order shows */
            g[k][i] = (float)((i * 7919 + k * 104729) % 2003 - 1001) * (k == 1 ? 1e7f : 0.37f);
    for (int i = 0; i < N; i++)
        w0[i] = (float)(i % 17) * 0.25f;
    /* live: which ranks take part; order: the arrival order of the live ones */
    static const struct { int live[W]; int order[W]; int n; } cases[] = {
        {{1, 1, 1}, {2, 0, 1}, 3}, /* all in; rank 2 waits for 0 and 1 */
        {{1, 1, 0}, {1, 0}, 2},    /* the highest rank out: rank 1 is the last */
        {{1, 0, 1}, {2, 0}, 2},    /* rank 1 out: rank 2's kept push is the last */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ps_test_hook_log log;
        ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
        ps_shard_config sc;
        memset(&sc, 0, sizeof sc);
        sc.mode = PS_MODE_SYNC;
        sc.num_workers = W;
        sc.opt.kind = PS_OPT_SGD;
        sc.opt.lr = 0.5f;
        sc.opt.eps = 1e-8f;
        sc.max_memory = 1 << 22;
        ps_shard *s;
        CHECK_OK(ps_shard_create(&sc, &hk, &s));
        int64_t v;
        char why[256];
        CHECK_OK(ps_shard_init(s, 1, 0, w0, N, N, &v, NULL, why, sizeof why));
        int nlive = 0;
        for (int k = 0; k < W; k++) {
            ps_shard_set_live(s, k, cases[c].live[k]);
            nlive += cases[c].live[k];
        }
        for (int j = 0; j < cases[c].n; j++) {
            int k = cases[c].order[j], kept, dup;
            CHECK_OK(ps_shard_push(s, 1, 0, k, 0, g[k], N, (void *)2, &kept, &dup, &v, why,
                                   sizeof why));
            CHECK_EQ_INT(v, j == cases[c].n - 1 ? 1 : 0);
        }
        for (int i = 0; i < N; i++) {
            float sum = 0.0f;
            int first = 1;
            for (int k = 0; k < W; k++)
                if (cases[c].live[k]) {
                    sum = first ? g[k][i] : sum + g[k][i];
                    first = 0;
                }
            expect[i] = fmaf(sum / (float)nlive, -0.5f, w0[i]);
        }
        int queued;
        const float *pw;
        size_t n;
        CHECK_OK(ps_shard_pull(s, 1, 0, 0, 1, (void *)3, &queued, &pw, &n, &v, why, sizeof why));
        CHECK_EQ_INT(queued, 0);
        CHECK_EQ_INT((int)n, N);
        int bad = -1;
        for (int i = 0; i < N && bad < 0; i++)
            if (memcmp(&pw[i], &expect[i], sizeof(float)) != 0)
                bad = i;
        CHECK_MSG(bad < 0, "case %zu: element %d is %.9g, the formula says %.9g", c, bad,
                  bad < 0 ? 0.0 : (double)pw[bad], bad < 0 ? 0.0 : (double)expect[bad]);
        ps_shard_destroy(s);
    }
}

/* ---------------- memory and destroy ---------------- */

PS_TEST(shard_memory_charge_is_bounded_and_returned)
{
    _Atomic uint64_t used = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = {PS_MODE_ASYNC, -1, 2, {PS_OPT_ADAM, 0.1f, 0, 0.9f, 0.999f, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL},
                          100000, &used, 1};
    ps_shard *a, *b;
    CHECK_OK(ps_shard_create(&sc, &hk, &a));
    CHECK_OK(ps_shard_create(&sc, &hk, &b));
    static float v[6000];
    int64_t ver;
    char why[256];
    CHECK_OK(ps_shard_init(a, 1, 0, v, 6000, 0, &ver, NULL, why, sizeof why)); /* ~72 KB */
    CHECK(used > 72000 && used < 100000);
    /* the charge is shared: the other shard cannot take what is left */
    CHECK_EQ_INT(ps_shard_init(b, 1, 1, v, 6000, 0, &ver, NULL, why, sizeof why), PS_ETOOBIG);
    CHECK_OK(ps_shard_init(b, 1, 2, v, 100, 0, &ver, NULL, why, sizeof why));
    /* same chunk, other length */
    CHECK_EQ_INT(ps_shard_init(a, 1, 0, v, 5, 0, &ver, NULL, why, sizeof why), PS_EMISMATCH);
    /* a queued SSP-less async pull never waits; cancel happens at destroy only for queued ones */
    ps_shard_destroy(a);
    ps_shard_destroy(b);
    CHECK_EQ_INT(used, 0);
}

PS_TEST(shard_destroy_cancels_queued_pulls_and_releases_kept_pushes)
{
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = {PS_MODE_SYNC, 0, 3, {PS_OPT_SGD, 0.1f, 0, 0, 0, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL}, 1 << 20, NULL, 1};
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    float w[2] = {1, 2};
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 7, 0, w, 2, 0, &v, NULL, why, sizeof why));
    int kept, dup, queued;
    const float *pw;
    size_t n;
    CHECK_OK(ps_shard_push(s, 7, 0, 2, 0, w, 2, (void *)1, &kept, &dup, &v, why, sizeof why));
    CHECK_EQ_INT(kept, 1); /* rank 2 before ranks 0 and 1 */
    CHECK_OK(ps_shard_pull(s, 7, 0, 1, 1, (void *)2, &queued, &pw, &n, &v, why, sizeof why));
    CHECK_EQ_INT(queued, 1);
    /* wrong length, unknown chunk, step ahead of the round */
    CHECK_EQ_INT(ps_shard_push(s, 7, 0, 0, 0, w, 1, NULL, &kept, &dup, &v, why, sizeof why),
                 PS_EPROTO);
    CHECK_EQ_INT(ps_shard_push(s, 7, 1, 0, 0, w, 2, NULL, &kept, &dup, &v, why, sizeof why),
                 PS_ENOTFOUND);
    CHECK_EQ_INT(ps_shard_push(s, 7, 0, 0, 1, w, 2, NULL, &kept, &dup, &v, why, sizeof why),
                 PS_ESTATE);
    ps_shard_destroy(s);
    CHECK_EQ_INT(log.released, 1);
    CHECK_EQ_INT(log.cancelled, 1);
    CHECK_EQ_INT(log.ready, 0);
}

/* ---------------- pinned weights (zero-copy pull replies) ---------------- */

/* A pinned buffer keeps its version through later updates, spares are
 * charged to the memory count, and a pinned buffer outlives the shard until
 * its last unpin (test_server.c checks the replies that rely on this). */
PS_TEST(shard_pinned_weights_survive_updates_and_destroy)
{
    enum { N = 1001 }; /* not a multiple of 16 floats */
    _Atomic uint64_t used = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    ps_shard_config sc = {PS_MODE_ASYNC, -1, 1, {PS_OPT_SGD, 0.5f, 0, 0, 0, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL}, 1 << 20,
                          &used, 1};
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    static float w[N], g[N], expect[PS_SHARD_MAX_WBUF + 3][N];
    for (int i = 0; i < N; i++) {
        w[i] = (float)i;
        g[i] = 1.0f;
    }
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 3, 0, w, N, 0, &v, NULL, why, sizeof why));
    uint64_t base = used;
    size_t spare = 64 + ((N * sizeof(float) + 63) & ~(size_t)63); /* header + weights */
    void *ref[PS_SHARD_MAX_WBUF + 3] = {0};
    const float *pinned[PS_SHARD_MAX_WBUF + 3] = {0};
    int kept, dup, queued;
    size_t n;
    const float *pw;
    /* pin version k, push: version k + 1 goes to another buffer */
    for (int k = 0; k < PS_SHARD_MAX_WBUF; k++) {
        CHECK_OK(ps_shard_pull(s, 3, 0, 0, 0, NULL, &queued, &pw, &n, &v, why, sizeof why));
        CHECK_EQ_INT(v, k);
        memcpy(expect[k], pw, sizeof w);
        pinned[k] = ps_shard_pin(s, 3, 0, pw, &ref[k]);
        if (k < PS_SHARD_MAX_WBUF - 1) {
            CHECK(pinned[k] == pw && ref[k] != NULL);
            CHECK_EQ_INT(used, base + (uint64_t)(k + 1) * spare); /* a spare each */
        } else {
            /* every other buffer is held: no free one would be left, so no pin */
            CHECK(pinned[k] == NULL && ref[k] == NULL);
            CHECK_EQ_INT(used, base + (uint64_t)k * spare);
        }
        CHECK_OK(ps_shard_push(s, 3, 0, 0, k, g, N, NULL, &kept, &dup, &v, why, sizeof why));
        CHECK_EQ_INT(v, k + 1);
        const float *now = ps_shard_weights(s, 3, 0, &n, &v);
        CHECK(k == PS_SHARD_MAX_WBUF - 1 ? now == pw : now != pw); /* unpinned: in place */
        for (int j = 0; j <= k; j++)
            if (pinned[j])
                CHECK(memcmp(pinned[j], expect[j], sizeof w) == 0);
        for (int i = 0; i < N; i++)
            CHECK(now[i] == (float)i - 0.5f * (float)(k + 1));
    }
    uint64_t spares, bytes, copies;
    ps_shard_buffer_counts(s, &spares, &bytes, &copies);
    CHECK_EQ_INT(spares, PS_SHARD_MAX_WBUF - 1);
    CHECK_EQ_INT(copies, 1);
    /* a pin that is not of the current weights is refused */
    CHECK(ps_shard_pin(s, 3, 0, pinned[0], &ref[PS_SHARD_MAX_WBUF]) == NULL);
    /* one reply gone: its buffer takes the next out-of-place update */
    ps_shard_unpin(ref[0]);
    pw = ps_shard_weights(s, 3, 0, &n, &v);
    CHECK(ps_shard_pin(s, 3, 0, pw, &ref[PS_SHARD_MAX_WBUF]) == pw);
    CHECK_OK(ps_shard_push(s, 3, 0, 0, PS_SHARD_MAX_WBUF, g, N, NULL, &kept, &dup, &v, why,
                           sizeof why));
    CHECK(ps_shard_weights(s, 3, 0, &n, &v) == pinned[0]);
    CHECK(pw[0] == 0.0f - 0.5f * (float)PS_SHARD_MAX_WBUF);
    CHECK(pinned[0][0] == 0.0f - 0.5f * (float)(PS_SHARD_MAX_WBUF + 1));
    /* destroy with pins held: the charge is returned, the buffers live on */
    ps_shard_destroy(s);
    CHECK_EQ_INT(used, 0);
    for (int k = 1; k < PS_SHARD_MAX_WBUF - 1; k++)
        CHECK(memcmp(pinned[k], expect[k], sizeof w) == 0);
    for (int k = 1; k <= PS_SHARD_MAX_WBUF; k++)
        ps_shard_unpin(ref[k]); /* frees them (ASan: no leak, no use after free) */
}

PS_TEST(shard_spares_respect_max_memory_and_give_way_to_inits)
{
    enum { N = 4096 };
    _Atomic uint64_t used = 0;
    ps_test_hook_log log;
    ps_shard_hooks hk = ps_test_hook_log_hooks(&log);
    /* room for three chunks of N weights, or two and a spare, not two and two spares */
    ps_shard_config sc = {PS_MODE_ASYNC, -1, 1, {PS_OPT_SGD, 0.5f, 0, 0, 0, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL},
                          3 * (N * 4 + 64) + 1024, &used, 1};
    ps_shard *s;
    CHECK_OK(ps_shard_create(&sc, &hk, &s));
    static float w[N], g[N];
    for (int i = 0; i < N; i++)
        g[i] = 1.0f;
    int64_t v;
    char why[256];
    CHECK_OK(ps_shard_init(s, 1, 0, w, N, 0, &v, NULL, why, sizeof why));
    CHECK_OK(ps_shard_init(s, 1, 1, w, N, 0, &v, NULL, why, sizeof why));
    size_t n;
    void *r0, *r1;
    const float *p0 = ps_shard_weights(s, 1, 0, &n, &v);
    CHECK(ps_shard_pin(s, 1, 0, p0, &r0) == p0);
    /* no room for a second spare: chunk 1's reply is a copy */
    const float *p1 = ps_shard_weights(s, 1, 1, &n, &v);
    CHECK(ps_shard_pin(s, 1, 1, p1, &r1) == NULL);
    int kept, dup;
    CHECK_OK(ps_shard_push(s, 1, 0, 0, 0, g, N, NULL, &kept, &dup, &v, why, sizeof why));
    CHECK(ps_shard_weights(s, 1, 0, &n, &v) != p0);
    /* chunk 0's spare is current, its first buffer still pinned: no room */
    CHECK_EQ_INT(ps_shard_init(s, 1, 2, w, N, 0, &v, NULL, why, sizeof why), PS_ETOOBIG);
    ps_shard_unpin(r0);
    /* now the weights move back to the first buffer and the spare is given
     * back for the init */
    CHECK_OK(ps_shard_init(s, 1, 2, w, N, 0, &v, NULL, why, sizeof why));
    const float *p = ps_shard_weights(s, 1, 0, &n, &v);
    CHECK(p == p0);
    CHECK_EQ_INT(v, 1);
    for (int i = 0; i < N; i++)
        CHECK(p[i] == -0.5f);
    ps_shard_destroy(s);
    CHECK_EQ_INT(used, 0);
}
