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
 * to the rank-order mean computed here.  sgd (w - lr * mean). */
static void sync_case(int W, int S, int T, int pushpull)
{
    tj_job j;
    char flags[128];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads %d", T);
    CHECK_OK(tj_start(&j, S, W, flags, 4, PS_TABLE_INIT_NORMAL));
    ref rf = {.dim = 4};
    enum { MAXB = 16 };
    static const int orders[4][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}};
    uint64_t ids[3][MAXB], next[3][MAXB];
    float g[3][MAXB * 4], rows[3][MAXB * 4];
    size_t n[3], nn[3];
    const int steps = 4;
    for (int r = 0; r < W; r++)
        n[r] = batch(r, 0, ids[r]);
    /* step 0's rows: the initializer's */
    ps_request req[3];
    for (int r = 0; r < W; r++)
        CHECK_OK(ps_client_sparse_pull(j.c[r], j.table, ids[r], n[r], rows[r], 0, &req[r]));
    for (int r = 0; r < W; r++) {
        CHECK_MSG(tj_wait(&req[r]) == 0, "pull: %s", req[r].err);
        for (size_t i = 0; i < n[r]; i++)
            CHECK(memcmp(rows[r] + i * 4, ref_row(&rf, &j, ids[r][i]), 16) == 0);
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
                w[k] = w[k] - 0.1f * (sum[a][k] / (float)W);
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
                CHECK_MSG(memcmp(rows[r] + i * 4, want, 16) == 0,
                          "step %d rank %d id %llu: %.9g, expected %.9g", t, r,
                          (unsigned long long)next[r][i], (double)rows[r][i * 4],
                          (double)want[0]);
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
    sync_case(2, 2, 2, 0);
}

PS_TEST(sync_three_workers_pushpull_rows_are_the_rank_order_mean_bitwise)
{
    TJ_NEED_SERVER();
    sync_case(3, 2, 3, 1);
}
