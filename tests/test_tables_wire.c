/* Embedding tables end to end: bin/ps_server processes and libps clients in
 * this process (one per worker), through real sockets.  The servers'
 * semantics (sync rank-order means, async sums, SSP, duplicates, the
 * initializer, the row cap and the filter, the hash spread) against the
 * arithmetic done here, and libps's part (duplicate ids summed once,
 * requests split by server and partition, rows written back in the
 * caller's order).  Bad input on the wire is tests/test_tables_badinput.c's;
 * checkpoints are tests/test_checkpoint_tables.c's. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_time.h"
#include "ps_test_server.h"
#include "tables_job.h"

/* ---- the reference: rows as the servers must have them ---- */

typedef struct ref {
    uint32_t dim;
    size_t n, cap;
    uint64_t *ids;
    float *w;
} ref;

static float *ref_row(ref *r, const tj_job *j, uint64_t id)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->ids[i] == id)
            return r->w + i * r->dim;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
        r->w = realloc(r->w, r->cap * r->dim * sizeof *r->w);
    }
    r->ids[r->n] = id;
    float *w = r->w + r->n * r->dim;
    ps_table_init_row(j->topt.seed, j->table, id, j->topt.init, j->topt.init_scale, r->dim, w);
    r->n++;
    return w;
}

static void ref_free(ref *r)
{
    free(r->ids);
    free(r->w);
}

/* deterministic gradient values of mixed magnitude (the float sums depend on
 * the order they are taken in) */
static float gval(int rank, uint64_t id, int step, uint32_t k, int dup)
{
    uint64_t x = ps_table_mix(((uint64_t)rank << 48) ^ (id * 0x9e3779b97f4a7c15ull) ^
                              ((uint64_t)step << 32) ^ ((uint64_t)k << 16) ^ (uint64_t)dup);
    float m = (float)(x >> 40) / (float)(1u << 24);
    int e = (int)((x >> 3) % 20) - 10;
    return (x & 1 ? -1.0f : 1.0f) * ldexpf(1.0f + m, e);
}

/* ids of rank r's batch at `step`: some shared by every rank, some its own,
 * each of the first few twice */
static size_t batch(int rank, int step, uint64_t *ids)
{
    size_t n = 0;
    for (int i = 0; i < 6; i++)
        ids[n++] = (uint64_t)(i * 7 + step % 3);         /* shared */
    for (int i = 0; i < 5; i++)
        ids[n++] = 1000 + (uint64_t)(rank * 100 + (step * 3 + i) % 17); /* its own */
    for (int i = 0; i < 3; i++)
        ids[n++] = ids[i * 2];                            /* repeats */
    return n;
}

/* W workers, `steps` sync rounds of sparse pushes (posted in a different
 * order each step) and pulls or pushpulls; every pulled row bitwise equal
 * to the rank-order mean computed here.  sgd (fma(mean, -lr, w): torch's);
 * dt: the wire type (0: float32); shm: the clients' shared-memory arena, which every
 * server (same host) maps, so the rows go through it, float32 whatever the
 * wire type, as dense payloads do. */
/* x as it arrives after a trip through the wire type dt (float32: itself) */
static float via(int dt, float x)
{
    uint16_t h;
    float y = x;
    if (dt && dt != PS_DTYPE_F32) {
        ps_dtype_from_f32((uint32_t)dt, &h, &x, 1);
        ps_dtype_to_f32((uint32_t)dt, &y, &h, 1);
    }
    return y;
}

static void sync_case(int W, int S, int T, int pushpull, int dt, int shm)
{
    tj_job j;
    int wt = shm ? 0 : dt; /* what the rows travel as */
    char flags[160];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads %d%s%s", T,
             dt ? " --wire-dtype " : "", dt ? ps_dtype_name((uint32_t)dt) : "");
    CHECK_OK(tj_prepare(&j, S, W, flags, 4, PS_TABLE_INIT_NORMAL));
    j.wire_dtype = dt;
    j.no_shm = !shm;
    CHECK_OK(tj_connect(&j));
    for (int r = 0; r < W; r++)
        CHECK_EQ_INT(ps_client_shm_servers(j.c[r]), shm ? S : 0);
    ref rf = {.dim = 4};
    enum { MAXB = 16 };
    static const int orders[4][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}};
    uint64_t ids[3][MAXB], next[3][MAXB];
    float g[3][MAXB * 4], rows[3][MAXB * 4];
    size_t n[3], nn[3];
    const int steps = 4;
    for (int r = 0; r < W; r++)
        n[r] = batch(r, 0, ids[r]);
    /* step 0's rows: the initializer's (through the wire type) */
    ps_request req[3];
    for (int r = 0; r < W; r++)
        CHECK_OK(ps_client_sparse_pull(j.c[r], j.table, ids[r], n[r], rows[r], 0, &req[r]));
    for (int r = 0; r < W; r++) {
        CHECK_MSG(tj_wait(&req[r]) == 0, "pull: %s", req[r].err);
        for (size_t i = 0; i < n[r] * 4; i++)
            CHECK(rows[r][i] == via(wt, ref_row(&rf, &j, ids[r][i / 4])[i % 4]));
    }
    for (int t = 0; t < steps; t++) {
        /* the gradients, and the mean the servers must apply */
        float sum[64][4];
        uint64_t touched[64];
        int nt = 0;
        for (int r = 0; r < W; r++) {
            /* this rank's rows: duplicates summed in the order they come */
            uint64_t u[MAXB];
            float us[MAXB][4];
            int nu = 0;
            for (size_t i = 0; i < n[r]; i++) {
                int dup = 0;
                for (size_t k = 0; k < i; k++)
                    dup += ids[r][k] == ids[r][i];
                for (uint32_t k = 0; k < 4; k++)
                    g[r][i * 4 + k] = gval(r, ids[r][i], t, k, dup);
                /* the server sums what arrives: each unique row's sum, narrowed */
                int at = 0;
                while (at < nu && u[at] != ids[r][i])
                    at++;
                if (at == nu) {
                    u[nu++] = ids[r][i];
                    memcpy(us[at], &g[r][i * 4], 16);
                } else {
                    for (int k = 0; k < 4; k++)
                        us[at][k] = us[at][k] + g[r][i * 4 + k];
                }
            }
            for (int a = 0; a < nu; a++)
                for (int k = 0; k < 4; k++)
                    us[a][k] = via(wt, us[a][k]);
            /* into the round, rank after rank */
            for (int a = 0; a < nu; a++) {
                int at = 0;
                while (at < nt && touched[at] != u[a])
                    at++;
                if (at == nt) {
                    touched[nt++] = u[a];
                    memcpy(sum[at], us[a], 16);
                } else {
                    for (int k = 0; k < 4; k++)
                        sum[at][k] = sum[at][k] + us[a][k];
                }
            }
        }
        for (int a = 0; a < nt; a++) {
            float *w = ref_row(&rf, &j, touched[a]);
            for (int k = 0; k < 4; k++)
                w[k] = fmaf(sum[a][k] / (float)W, -0.1f, w[k]); /* torch's sgd */
        }
        for (int r = 0; r < W; r++)
            nn[r] = batch(r, t + 1, next[r]);
        /* pushes in this step's order, none waited for before the next */
        int ord[3], m = 0;
        for (int k = 0; k < 3; k++)
            if (orders[t % 4][k] < W)
                ord[m++] = orders[t % 4][k];
        for (int k = 0; k < W; k++) {
            int r = ord[k];
            if (pushpull)
                CHECK_OK(ps_client_sparse_pushpull(j.c[r], j.table, ids[r], n[r], g[r], next[r],
                                                   nn[r], rows[r], t, &req[r]));
            else
                CHECK_OK(ps_client_sparse_push(j.c[r], j.table, ids[r], n[r], g[r], t, &req[r]));
        }
        for (int r = 0; r < W; r++)
            CHECK_MSG(tj_wait(&req[r]) == 0, "step %d rank %d: %s", t, r, req[r].err);
        if (!pushpull)
            for (int r = 0; r < W; r++)
                CHECK_OK(ps_client_sparse_pull(j.c[r], j.table, next[r], nn[r], rows[r], t + 1,
                                               &req[r]));
        for (int r = 0; r < W; r++) {
            if (!pushpull)
                CHECK_MSG(tj_wait(&req[r]) == 0, "pull: %s", req[r].err);
            CHECK_MSG(req[r].version == t + 1, "step %d: version %lld", t,
                      (long long)req[r].version);
            for (size_t i = 0; i < nn[r]; i++) {
                const float *want = ref_row(&rf, &j, next[r][i]);
                for (int k = 0; k < 4; k++)
                    CHECK_MSG(rows[r][i * 4 + k] == via(wt, want[k]),
                              "step %d rank %d id %llu: %.9g, expected %.9g", t, r,
                              (unsigned long long)next[r][i], (double)rows[r][i * 4 + k],
                              (double)via(wt, want[k]));
            }
            memcpy(ids[r], next[r], sizeof next[r]);
            n[r] = nn[r];
        }
    }
    ref_free(&rf);
    CHECK_OK(tj_stop(&j));
}

PS_TEST(sync_two_workers_rows_are_the_rank_order_mean_bitwise)
{
    TJ_NEED_SERVER();
    sync_case(2, 2, 2, 0, 0, 0);
}

PS_TEST(sync_three_workers_pushpull_rows_are_the_rank_order_mean_bitwise)
{
    TJ_NEED_SERVER();
    sync_case(3, 2, 3, 1, 0, 0);
}

/* bfloat16 and float16 on the wire: the servers sum the widened rows in
 * rank order (float32 masters) and send the rows rounded */
PS_TEST(sync_rows_through_bf16_and_f16_are_the_mean_of_the_narrowed_rows)
{
    TJ_NEED_SERVER();
    sync_case(2, 2, 2, 1, PS_DTYPE_BF16, 0);
    if (ps_test_stopped())
        return;
    sync_case(2, 1, 2, 0, PS_DTYPE_F16, 0);
}

/* Same host, the rows of pulls, pushes and pushpulls go through the
 * workers' arenas: the same rank-order means bitwise as over TCP (the
 * cases above), and float32 exact with the servers' --wire-dtype bf16,
 * which rows over the network would have rounded (so they did not take
 * it). */
PS_TEST(rows_through_shared_memory_are_the_rank_order_mean_bitwise_and_not_narrowed)
{
    TJ_NEED_SERVER();
    sync_case(2, 2, 2, 0, 0, 1);
    if (ps_test_stopped())
        return;
    sync_case(3, 2, 3, 1, 0, 1);
    if (ps_test_stopped())
        return;
    sync_case(2, 2, 2, 1, PS_DTYPE_BF16, 1);
}

/* ---- async: each push on arrival; the sums exact ---- */

PS_TEST(async_pushes_apply_on_arrival_and_sum_exactly)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 2, 2, "--mode async --optimizer sgd --lr 0.5 --threads 2", 3,
                        PS_TABLE_INIT_ZEROS));
    j.topt.opt.lr = 0.5f;
    CHECK_OK(tj_connect(&j));
    /* integers and halves: every partial sum is exact in float, so the
     * order the pushes land in does not change a bit */
    enum { N = 40, STEPS = 6 };
    uint64_t ids[N];
    float g[2][N * 3], want[N * 3], rows[N * 3];
    memset(want, 0, sizeof want);
    for (int i = 0; i < N; i++)
        ids[i] = (uint64_t)i * 1000003u;
    ps_request req[2][STEPS];
    for (int t = 0; t < STEPS; t++)
        for (int r = 0; r < 2; r++) {
            for (int i = 0; i < N * 3; i++) {
                g[r][i] = (float)((r + 1) * (t + 1) + i % 7) * 0.5f;
                want[i] -= 0.5f * g[r][i];
            }
            CHECK_OK(ps_client_sparse_push(j.c[r], j.table, ids, N, g[r], t, &req[r][t]));
            CHECK_MSG(tj_wait(&req[r][t]) == 0, "%s", req[r][t].err); /* g is reused */
        }
    ps_request p;
    CHECK_OK(ps_client_sparse_pull(j.c[1], j.table, ids, N, rows, STEPS, &p));
    CHECK_MSG(tj_wait(&p) == 0, "%s", p.err);
    for (int i = 0; i < N * 3; i++)
        CHECK_MSG(rows[i] == want[i], "element %d: %g, expected %g", i, (double)rows[i],
                  (double)want[i]);
    /* every push is an update of each partition: 2 workers x STEPS x 4 */
    CHECK_EQ_INT(p.version >= 0, 1);
    ps_stats st[2];
    CHECK_OK(ps_client_stats(j.c[0], 0, &st[0]));
    CHECK_OK(ps_client_stats(j.c[0], 1, &st[1]));
    CHECK_EQ_INT(st[0].updates + st[1].updates, 2 * STEPS * 4);
    CHECK_EQ_INT(st[0].rows + st[1].rows, N);
    CHECK_EQ_INT(st[0].partitions + st[1].partitions, 4);
    /* the clock a restarted worker asks for: its pushes so far, the
     * smallest over the 4 partitions; a key that is no table nor tensor is
     * refused before anything is sent */
    for (int r = 0; r < 2; r++) {
        ps_request ck;
        CHECK_OK(ps_client_clock(j.c[r], j.table, &ck));
        CHECK_MSG(tj_wait(&ck) == 0, "%s", ck.err);
        CHECK_EQ_INT(ck.version, STEPS);
    }
    ps_request bad;
    CHECK_EQ_INT(ps_client_clock(j.c[0], j.table + 1, &bad), PS_ENOTFOUND);
    CHECK_OK(tj_stop(&j));
}

/* ---- libps: duplicates summed once, rows written back in order ---- */

/* adagrad: one update with the sum differs from two updates, so a row
 * updated twice would show */
PS_TEST(duplicate_ids_are_summed_once_in_order_and_every_position_gets_its_row)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 2, 1, "--mode sync --optimizer sgd --lr 0.1 --threads 2", 2,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.opt.kind = PS_OPT_ADAGRAD;
    j.topt.opt.lr = 0.25f;
    CHECK_OK(tj_connect(&j));
    uint64_t ids[6] = {5, 9, 5, 5, 12, 9};
    float g[12] = {0.5f, -1, 0.125f, 4, 3, 0.75f, -2, 0.0625f, 1.5f, -0.5f, 6, 7};
    ps_request r;
    CHECK_OK(ps_client_sparse_push(j.c[0], j.table, ids, 6, g, 0, &r));
    CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    uint64_t pull[7] = {5, 5, 12, 9, 5, 77, 9};
    float rows[14];
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, pull, 7, rows, 1, &r));
    CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    CHECK_EQ_INT(r.version, 1);
    /* the sums in the order the ids came: 5: (g0 + g2) + g3; 9: g1 + g5 */
    float sum5[2], sum9[2], sum12[2];
    for (int k = 0; k < 2; k++) {
        sum5[k] = (g[0 + k] + g[4 + k]) + g[6 + k];
        sum9[k] = g[2 + k] + g[10 + k];
        sum12[k] = g[8 + k];
    }
    const float *sums[3] = {sum5, sum9, sum12};
    uint64_t uid[3] = {5, 9, 12};
    float want[3][2];
    for (int u = 0; u < 3; u++) {
        ps_table_init_row(j.topt.seed, j.table, uid[u], j.topt.init, j.topt.init_scale, 2,
                          want[u]);
        for (int k = 0; k < 2; k++) { /* adagrad from h = 0, one update; mean over 1 worker */
            float gk = sums[u][k] / 1.0f, h = gk * gk;
            want[u][k] = want[u][k] + (-0.25f * gk) / (sqrtf(h) + 1e-8f);
        }
    }
    float fresh[2];
    ps_table_init_row(j.topt.seed, j.table, 77, j.topt.init, j.topt.init_scale, 2, fresh);
    const float *expect[7] = {want[0], want[0], want[2], want[1], want[0], fresh, want[1]};
    for (int i = 0; i < 7; i++)
        CHECK_MSG(memcmp(rows + 2 * i, expect[i], 8) == 0, "position %d (id %llu): %g %g, "
                  "expected %g %g", i, (unsigned long long)pull[i], (double)rows[2 * i],
                  (double)rows[2 * i + 1], (double)expect[i][0], (double)expect[i][1]);
    /* an empty pull completes at once; a push of nothing still reaches every
     * partition (the round of step 1 completes) */
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, NULL, 0, NULL, 1, &r));
    CHECK_EQ_INT(tj_wait(&r), 0);
    CHECK_OK(ps_client_sparse_push(j.c[0], j.table, NULL, 0, NULL, 1, &r));
    CHECK_EQ_INT(tj_wait(&r), 0);
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, pull, 1, rows, 2, &r));
    CHECK_EQ_INT(tj_wait(&r), 0);
    CHECK_EQ_INT(r.version, 2);
    CHECK(memcmp(rows, want[0], 8) == 0); /* untouched by the empty round */
    CHECK_OK(tj_stop(&j));
}

/* ---- the initializer, on every server and after a restart ---- */

PS_TEST(first_touch_rows_are_the_initializer_on_every_server_and_after_a_restart)
{
    TJ_NEED_SERVER();
    enum { N = 600, D = 5 };
    static uint64_t ids[N];
    static float rows[N * D], again[N * D], want[D];
    for (int i = 0; i < N; i++)
        ids[i] = ps_table_mix((uint64_t)i) ^ (uint64_t)i;
    for (int round = 0; round < 2; round++) {
        tj_job j;
        CHECK_OK(tj_start(&j, 3, 1, "--mode async --optimizer sgd --lr 0.1 --threads 2", D,
                          PS_TABLE_INIT_NORMAL));
        ps_request r;
        CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, ids, N, round ? again : rows, 0, &r));
        CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
        for (int k = 0; k < 3; k++) {
            ps_stats st;
            CHECK_OK(ps_client_stats(j.c[0], k, &st));
            CHECK_MSG(st.rows > N / 6, "server %d holds %llu of %d rows", k,
                      (unsigned long long)st.rows, N);
        }
        CHECK_OK(tj_stop(&j));
    }
    for (int i = 0; i < N; i++) {
        ps_table_init_row(11, 7, ids[i], PS_TABLE_INIT_NORMAL, 0.25f, D, want);
        CHECK_MSG(memcmp(rows + i * D, want, sizeof want) == 0, "id %llu",
                  (unsigned long long)ids[i]);
    }
    CHECK(memcmp(rows, again, sizeof rows) == 0);
}

/* ---- placement: Zipf-hot ids spread by hash ---- */

/* ids drawn Zipf(1.1) from 1 .. 1e6 (the hot ones are the small ids, where
 * ranges would put them all on one server), pulled through 4 servers: none
 * holds more than 1.2 times the mean of the rows */
PS_TEST(zipf_ids_spread_over_four_servers_within_1_2_times_the_mean)
{
    TJ_NEED_SERVER();
    enum { RANKS = 1000000, DRAWS = 120000 };
    double *cdf = malloc(RANKS * sizeof *cdf);
    uint64_t *ids = malloc(DRAWS * sizeof *ids);
    float *rows = malloc((size_t)DRAWS * 2 * sizeof *rows);
    CHECK(cdf && ids && rows);
    double acc = 0;
    for (int k = 0; k < RANKS; k++)
        cdf[k] = acc += pow((double)(k + 1), -1.1);
    uint64_t x = 12345;
    for (int d = 0; d < DRAWS; d++) {
        x = ps_table_mix(x + 0x9e3779b97f4a7c15ull);
        double u = (double)(x >> 11) * 0x1p-53 * acc;
        int lo = 0, hi = RANKS - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        ids[d] = (uint64_t)lo;
    }
    tj_job j;
    CHECK_OK(tj_start(&j, 4, 1, "--mode async --optimizer sgd --lr 0.1 --threads 2", 2,
                      PS_TABLE_INIT_ZEROS));
    ps_request r;
    int64_t t0 = ps_now_ns();
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, ids, DRAWS, rows, 0, &r));
    CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    int64_t t1 = ps_now_ns();
    /* and once more, the rows there now, and a push of them all */
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, ids, DRAWS, rows, 0, &r));
    CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    int64_t t2 = ps_now_ns();
    CHECK_OK(ps_client_sparse_push(j.c[0], j.table, ids, DRAWS, rows, 0, &r));
    CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    int64_t t3 = ps_now_ns();
    printf("# one worker, 4 servers x 2 partitions, dim 2: a pull of %d ids (duplicates "
           "included) %.1f ms making the rows, %.1f ms again; their push %.1f ms (%.2f M ids/s "
           "pulled)\n", DRAWS, (double)(t1 - t0) * 1e-6, (double)(t2 - t1) * 1e-6,
           (double)(t3 - t2) * 1e-6, (double)DRAWS / ((double)(t2 - t1) * 1e-9) * 1e-6);
    uint64_t n[4], total = 0, most = 0;
    for (int k = 0; k < 4; k++) {
        ps_stats st;
        CHECK_OK(ps_client_stats(j.c[0], k, &st));
        n[k] = st.rows;
        total += n[k];
        most = n[k] > most ? n[k] : most;
    }
    printf("# %d Zipf(1.1) draws: %llu distinct ids on 4 servers: %llu %llu %llu %llu (most "
           "%.3f x the mean)\n", DRAWS, (unsigned long long)total, (unsigned long long)n[0],
           (unsigned long long)n[1], (unsigned long long)n[2], (unsigned long long)n[3],
           (double)most * 4 / (double)total);
    CHECK(total > 10000);
    CHECK_MSG((double)most <= 1.2 * (double)total / 4, "a server holds %llu of %llu rows",
              (unsigned long long)most, (unsigned long long)total);
    free(cdf);
    free(ids);
    free(rows);
    CHECK_OK(tj_stop(&j));
}

/* ---- SSP: a pull waits for the slowest worker ---- */

PS_TEST(ssp_a_table_pull_waits_until_the_slowest_worker_is_within_k)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_start(&j, 1, 2, "--mode async --max-staleness 1 --optimizer sgd --lr 0.1 "
                      "--threads 2", 2, PS_TABLE_INIT_ZEROS));
    uint64_t id = 3;
    float g[2] = {1, 1}, row[2];
    ps_request r, p;
    for (int t = 0; t < 2; t++) {
        CHECK_OK(ps_client_sparse_push(j.c[0], j.table, &id, 1, g, t, &r));
        CHECK_MSG(tj_wait(&r) == 0, "%s", r.err);
    }
    /* worker 0 at step 3 wants version 3: worker 1 (clock 0) must reach 2 */
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, &id, 1, row, 3, &p));
    ps_test_sleep_ms(200);
    CHECK_MSG(!ps_request_test(&p), "the pull did not wait (status %d)", p.status);
    CHECK_OK(ps_client_sparse_push(j.c[1], j.table, NULL, 0, NULL, 0, &r));
    CHECK_EQ_INT(tj_wait(&r), 0);
    ps_test_sleep_ms(200);
    CHECK_MSG(!ps_request_test(&p), "the pull did not wait for clock 2");
    CHECK_OK(ps_client_sparse_push(j.c[1], j.table, &id, 1, g, 1, &r));
    CHECK_EQ_INT(tj_wait(&r), 0);
    CHECK_MSG(tj_wait(&p) == 0, "%s", p.err);
    CHECK(row[0] == -0.1f - 0.1f - 0.1f && row[1] == row[0]);
    CHECK_OK(tj_stop(&j));
}

/* ---- the row cap and the frequency filter ---- */

static int stats0(tj_job *j, ps_stats *st) { return ps_client_stats(j->c[0], 0, st); }

static int pull1(tj_job *j, uint64_t id, float *row, int64_t step)
{
    ps_request r;
    if (ps_client_sparse_pull(j->c[0], j->table, &id, 1, row, step, &r))
        return -1;
    return tj_wait(&r);
}

static int push1(tj_job *j, uint64_t id, const float *g, int64_t step)
{
    ps_request r;
    if (ps_client_sparse_push(j->c[0], j->table, &id, 1, g, step, &r))
        return -1;
    return tj_wait(&r);
}

PS_TEST(the_row_cap_evicts_the_least_recently_touched_row)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode async --optimizer sgd --lr 0.5 --threads 1", 2,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.max_rows = 4;
    j.topt.opt.lr = 0.5f;
    CHECK_OK(tj_connect(&j));
    float row[2], init1[2], init2[2], g[2] = {1, 2};
    for (uint64_t id = 1; id <= 4; id++)
        CHECK_OK(pull1(&j, id, row, 0));
    /* touched in order 1 2 3 4; a push makes 1 the most recent */
    CHECK_OK(push1(&j, 1, g, 0));
    CHECK_OK(pull1(&j, 5, row, 0)); /* evicts 2 */
    ps_stats st;
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.rows, 4);
    CHECK_EQ_INT(st.evicted, 1);
    ps_table_init_row(11, 7, 1, PS_TABLE_INIT_UNIFORM, 0.25f, 2, init1);
    CHECK_OK(pull1(&j, 1, row, 0)); /* still there, with its update */
    CHECK(row[0] == init1[0] - 0.5f * g[0] && row[1] == init1[1] - 0.5f * g[1]);
    CHECK_OK(push1(&j, 2, g, 1)); /* 2 comes back (evicting 3), updated from its first values */
    CHECK_OK(pull1(&j, 2, row, 0));
    ps_table_init_row(11, 7, 2, PS_TABLE_INIT_UNIFORM, 0.25f, 2, init2);
    CHECK(row[0] == init2[0] - 0.5f * g[0] && row[1] == init2[1] - 0.5f * g[1]);
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.rows, 4);
    CHECK_EQ_INT(st.evicted, 2);
    CHECK_OK(pull1(&j, 4, row, 0)); /* 4 was not evicted: 3 was */
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.evicted, 2);
    CHECK_OK(tj_stop(&j));
}

/* A table declared full=refuse (through libps) keeps its rows at the cap:
 * the request that would make a row beyond it is refused to its worker,
 * naming the cap; the rows there are pulled and pushed as before; nothing
 * is evicted. */
PS_TEST(a_full_table_that_refuses_keeps_its_rows_and_refuses_new_ids)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode async --optimizer sgd --lr 0.5 --threads 1", 2,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.max_rows = 4;
    j.topt.full = PS_TABLE_FULL_REFUSE;
    j.topt.opt.lr = 0.5f;
    CHECK_OK(tj_connect(&j));
    float row[2], g[2] = {1, 2};
    for (uint64_t id = 1; id <= 4; id++)
        CHECK_OK(pull1(&j, id, row, 0));
    ps_request r;
    uint64_t five = 5;
    CHECK_OK(ps_client_sparse_pull(j.c[0], j.table, &five, 1, row, 0, &r));
    CHECK_EQ_INT(tj_wait(&r), PS_ETOOBIG);
    CHECK_MSG(strstr(r.err, "is full here: 4 rows, its max_rows share 4") &&
                  strstr(r.err, "full=refuse"), "%s", r.err);
    CHECK_OK(ps_client_sparse_push(j.c[0], j.table, &five, 1, g, 0, &r));
    CHECK_EQ_INT(tj_wait(&r), PS_ETOOBIG);
    CHECK_OK(push1(&j, 1, g, 0)); /* its push of step 0 again: the refused one did not count */
    CHECK_OK(pull1(&j, 4, row, 1));
    ps_stats st;
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.rows, 4);
    CHECK_EQ_INT(st.evicted, 0);
    CHECK_OK(tj_stop(&j));
}

PS_TEST(the_frequency_filter_makes_a_row_at_the_nth_pull_and_drops_gradients_before)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode async --optimizer sgd --lr 0.5 --threads 1", 2,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.min_count = 3;
    j.topt.filter_cells = 4096;
    j.topt.opt.lr = 0.5f;
    CHECK_OK(tj_connect(&j));
    float row[2], init[2], g[2] = {1, -1};
    ps_table_init_row(11, 7, 42, PS_TABLE_INIT_UNIFORM, 0.25f, 2, init);
    for (int k = 0; k < 2; k++) {
        CHECK_OK(pull1(&j, 42, row, 0));
        CHECK(memcmp(row, init, sizeof row) == 0);
    }
    CHECK_OK(push1(&j, 42, g, 0)); /* not admitted yet: dropped */
    ps_stats st;
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.rows, 0);
    CHECK_EQ_INT(st.filtered, 3);
    CHECK_OK(pull1(&j, 42, row, 0)); /* the third: its row, as it was first */
    CHECK(memcmp(row, init, sizeof row) == 0);
    CHECK_OK(push1(&j, 42, g, 1));
    CHECK_OK(pull1(&j, 42, row, 0));
    CHECK(row[0] == init[0] - 0.5f * g[0] && row[1] == init[1] - 0.5f * g[1]);
    CHECK_OK(stats0(&j, &st));
    CHECK_EQ_INT(st.rows, 1);
    CHECK_EQ_INT(st.filtered, 3);
    CHECK_OK(tj_stop(&j));
}
