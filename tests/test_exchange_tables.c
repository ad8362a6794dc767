/* The exchange's embedding tables (include/ps_exchange.h, "embedding
 * tables") on their own: worker 0 through the exchange on the host backend,
 * the other workers plain libps clients the test drives, bin/ps_server
 * processes (tests/tables_job.h), so each case decides exactly when the
 * round a batch's rows wait for completes.
 *
 * Checked:
 *  - sync: the rows of batch t+1 are version t+1 (every worker's step-t
 *    gradients applied, bitwise the rank-order mean computed here) and
 *    ps_exchange_table_rows waits for them, counting the wait in comm-wait;
 *  - async: the next batch's pull goes out at once and is answered with the
 *    rows as they are (before this worker's own push); rows that landed are
 *    taken without waiting; with --max-staleness 0 the wait for a slower
 *    worker is comm-wait;
 *  - what is pushed: one gradient row per distinct id of the batch, in the
 *    order first seen, exactly what the caller wrote (an id that comes
 *    three times is updated once);
 *  - the order of the calls (two batches in flight at most, a push of the
 *    rows given, steps that go up) is enforced;
 *  - ps.torch's: a sorted table's ids ascending as int64, extend's ids
 *    pushed with the batch's.
 * Every wait is bounded: a watchdog interrupts the exchange. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"
#include "tables_job.h"

#define DIM 4
#define LR 0.5f
#define MAXIDS 16
#define WATCH_S 60 /* bound on a whole case: then the exchange is interrupted */

/* ---- worker 0: the exchange, and a watchdog over it ---- */

typedef struct xworker {
    ps_backend *b;
    ps_exchange *x;
    pthread_t dog;
    volatile int done, fired;
    int dog_on;
} xworker;

static void *dog_main(void *arg)
{
    xworker *k = arg;
    for (int i = 0; i < WATCH_S * 20 && !k->done; i++)
        ps_test_sleep_ms(50);
    if (!k->done) {
        k->fired = 1;
        ps_exchange_interrupt(k->x); /* whatever waits returns PS_ECLOSED */
    }
    return NULL;
}

/* Worker 0 of job j: the exchange with j's table, started. */
static int xworker_sorted; /* the table's ids ascending (ps_exchange_table_sorted) */

static int xworker_open(xworker *k, tj_job *j)
{
    memset(k, 0, sizeof *k);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = j->eps;
    o.rank = 0;
    o.num_workers = j->W;
    o.mode = j->mode;
    o.max_staleness = j->mode == PS_MODE_ASYNC ? j->max_staleness : 0;
    o.hello_timeout_ms = TJ_WAIT_MS;
    int rc;
    if ((rc = ps_backend_host_create(&k->b)) || (rc = ps_exchange_open(&o, k->b, &k->x)))
        return rc;
    k->dog_on = pthread_create(&k->dog, NULL, dog_main, k) == 0;
    if ((rc = ps_exchange_add_table(k->x, j->table, &j->topt, MAXIDS, 0)) ||
        (xworker_sorted && (rc = ps_exchange_table_sorted(k->x, 0, 1))))
        return rc;
    return ps_exchange_start(k->x);
}

/* Close; 1 when the watchdog had to interrupt a wait. */
static int xworker_close(xworker *k)
{
    k->done = 1;
    if (k->dog_on)
        pthread_join(k->dog, NULL);
    ps_exchange_close(k->x);
    ps_backend_host_destroy(k->b);
    return k->fired;
}

/* ---- the reference: rows as the servers must hold them ---- */

typedef struct ref {
    int n;
    uint64_t ids[128];
    float w[128][DIM];
} ref;

static float *ref_row(ref *r, const tj_job *j, uint64_t id)
{
    for (int i = 0; i < r->n; i++)
        if (r->ids[i] == id)
            return r->w[i];
    r->ids[r->n] = id;
    ps_table_init_row(j->topt.seed, j->table, id, j->topt.init, j->topt.init_scale, DIM,
                      r->w[r->n]);
    return r->w[r->n++];
}

/* One sync round: each worker's distinct ids and their gradient rows, added
 * in rank order, divided by the workers, sgd (the servers' arithmetic). */
typedef struct round {
    int n;
    uint64_t ids[64];
    float sum[64][DIM];
} sround;

static void round_add(sround *rd, const uint64_t *ids, size_t n, const float *g)
{
    for (size_t i = 0; i < n; i++) {
        int at = 0;
        while (at < rd->n && rd->ids[at] != ids[i])
            at++;
        if (at == rd->n) {
            rd->ids[rd->n++] = ids[i];
            memcpy(rd->sum[at], g + i * DIM, sizeof rd->sum[at]);
        } else {
            for (int k = 0; k < DIM; k++)
                rd->sum[at][k] = rd->sum[at][k] + g[i * DIM + k];
        }
    }
}

static void round_apply(const sround *rd, ref *r, const tj_job *j, int W)
{
    for (int a = 0; a < rd->n; a++) {
        float *w = ref_row(r, j, rd->ids[a]);
        for (int k = 0; k < DIM; k++)
            w[k] = w[k] - LR * (rd->sum[a][k] / (float)W + 0.0f * w[k]);
    }
}

/* ---- batches and gradients ---- */

/* Worker 0's batch t: ids with repeats, some shared with the peer's. */
static size_t batch0(int t, uint64_t *ids)
{
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        ids[n++] = (uint64_t)(i * 5 + t % 2); /* shared */
    for (int i = 0; i < 3; i++)
        ids[n++] = 500 + (uint64_t)((t * 2 + i) % 7); /* its own */
    ids[n++] = ids[1];
    ids[n++] = ids[5];
    ids[n++] = ids[1];
    return n;
}

/* The peer's (rank 1): distinct ids. */
static size_t batch1(int t, uint64_t *ids)
{
    size_t n = 0;
    for (int i = 0; i < 3; i++)
        ids[n++] = (uint64_t)(i * 5 + (t + 1) % 2);
    for (int i = 0; i < 2; i++)
        ids[n++] = 900 + (uint64_t)((t + i) % 5);
    return n;
}

/* Gradient values: multiples of 1/64 of mixed sign. */
static float gval(int rank, uint64_t id, int t, int k)
{
    return (float)((int)((id * 7 + (uint64_t)t * 3 + (uint64_t)k + (uint64_t)rank * 11) % 29) -
                   14) / 64.0f;
}

/* The distinct ids of ids[0..n) in the order first seen, and each entry's
 * place among them: what the exchange must hand out. */
static size_t distinct(const uint64_t *ids, size_t n, uint64_t *u, int32_t *index)
{
    size_t nu = 0;
    for (size_t e = 0; e < n; e++) {
        size_t at = 0;
        while (at < nu && u[at] != ids[e])
            at++;
        if (at == nu)
            u[nu++] = ids[e];
        index[e] = (int32_t)at;
    }
    return nu;
}

/* r holds batch ids[0..n) with the reference's rows; else why. */
static int check_batch(const ps_exchange_rows *r, const uint64_t *ids, size_t n, ref *rf,
                       const tj_job *j, char *why, size_t len)
{
    uint64_t u[MAXIDS];
    int32_t index[MAXIDS];
    size_t nu = distinct(ids, n, u, index);
    if (r->nentries != n || r->nunique != nu || r->dim != DIM ||
        memcmp(r->ids, u, nu * sizeof *u) || memcmp(r->index, index, n * sizeof *index)) {
        snprintf(why, len, "the batch is %zu entries, %zu distinct, not %zu and %zu in the "
                 "order first seen", r->nentries, r->nunique, n, nu);
        return 0;
    }
    for (size_t i = 0; i < nu; i++) {
        const float *want = ref_row(rf, j, u[i]);
        if (memcmp(r->rows + i * DIM, want, DIM * sizeof(float))) {
            snprintf(why, len, "row of id %llu is %.9g.., expected %.9g..",
                     (unsigned long long)u[i], (double)r->rows[i * DIM], (double)want[0]);
            return 0;
        }
    }
    return 1;
}

/* ---- a peer's push that comes late ---- */

typedef struct late {
    ps_client *c;
    uint64_t table;
    const uint64_t *ids;
    size_t n;
    const float *g;
    int64_t step;
    int delay_ms;
    int64_t posted_ns;
    int rc;
    pthread_t th;
} late;

static void *late_main(void *arg)
{
    late *p = arg;
    ps_test_sleep_ms(p->delay_ms);
    p->posted_ns = ps_now_ns();
    ps_request r;
    p->rc = ps_client_sparse_push(p->c, p->table, p->ids, p->n, p->g, p->step, &r);
    if (!p->rc)
        p->rc = tj_wait(&r);
    return NULL;
}

/* ------------------------------------------------------------------ sync */

PS_TEST(sync_rows_of_batch_t_plus_1_are_version_t_plus_1_and_waited_for_as_comm_wait)
{
    TJ_NEED_SERVER();
    enum { STEPS = 4, DELAY_MS = 300 };
    tj_job j;
    CHECK_OK(tj_prepare(&j, 2, 2, "--mode sync --optimizer sgd --lr 0.1 --threads 2", DIM,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.opt.lr = LR;
    xworker k;
    int rc = xworker_open(&k, &j);
    if (!rc)
        rc = tj_client(&j, 1);
    ref rf = {0};
    uint64_t ids[STEPS + 1][MAXIDS], pids[MAXIDS];
    float pg[MAXIDS * DIM];
    size_t n[STEPS + 1];
    char why[256] = "";
    int64_t early_ns = 0;
    int bad_step = -1, late_rc = 0, peer_late = 0;
    late p = {0};
    for (int t = 0; t <= STEPS; t++)
        n[t] = batch0(t, ids[t]);
    if (!rc)
        rc = ps_exchange_table_next(k.x, 0, ids[0], n[0], 1);
    for (int t = 0; t <= STEPS && !rc && bad_step < 0; t++) {
        /* the next batch's ids while this one computes: its pull goes with
         * this step's push */
        if (t < STEPS && (rc = ps_exchange_table_next(k.x, 0, ids[t + 1], n[t + 1], 1)))
            break;
        ps_exchange_take_wait_ns(k.x);
        ps_exchange_rows r;
        int64_t t0 = ps_now_ns();
        rc = ps_exchange_table_rows(k.x, 0, &r);
        int64_t back_ns = ps_now_ns(), wait_ns = ps_exchange_take_wait_ns(k.x);
        if (peer_late) { /* batch t needs the peer's step t-1, posted DELAY_MS late */
            pthread_join(p.th, NULL);
            peer_late = 0;
            late_rc |= p.rc;
            if (back_ns < p.posted_ns && !early_ns)
                early_ns = p.posted_ns - back_ns;
            if (!rc && wait_ns < (back_ns - t0) / 2) {
                snprintf(why, sizeof why, "comm-wait %.1f ms of a %.1f ms wait",
                         (double)wait_ns / 1e6, (double)(back_ns - t0) / 1e6);
                bad_step = t;
            }
        }
        if (rc || bad_step >= 0)
            break;
        if (!check_batch(&r, ids[t], n[t], &rf, &j, why, sizeof why) || r.version != t) {
            if (!why[0])
                snprintf(why, sizeof why, "version %lld", (long long)r.version);
            bad_step = t;
            break;
        }
        if (t == STEPS)
            break;
        sround rd = {0};
        for (size_t i = 0; i < r.nunique; i++)
            for (int d = 0; d < DIM; d++)
                r.grads[i * DIM + d] = gval(0, r.ids[i], t, d);
        round_add(&rd, r.ids, r.nunique, r.grads);
        if ((rc = ps_exchange_table_push(k.x, 0, t)))
            break;
        /* the peer pushes step t DELAY_MS from now */
        size_t pn = batch1(t, pids);
        for (size_t i = 0; i < pn; i++)
            for (int d = 0; d < DIM; d++)
                pg[i * DIM + d] = gval(1, pids[i], t, d);
        round_add(&rd, pids, pn, pg);
        round_apply(&rd, &rf, &j, 2);
        p = (late){.c = j.c[1], .table = j.table, .ids = pids, .n = pn, .g = pg, .step = t,
                   .delay_ms = DELAY_MS};
        if (pthread_create(&p.th, NULL, late_main, &p)) {
            rc = PS_ENOMEM;
            break;
        }
        peer_late = 1;
    }
    if (peer_late)
        pthread_join(p.th, NULL);
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_OK(late_rc);
    CHECK_MSG(bad_step < 0, "batch %d: %s", bad_step, why);
    CHECK_MSG(!early_ns, "the rows came %.1f ms before the peer's push was posted",
              (double)early_ns / 1e6);
}

/* ------------------------------------------------------------------ async */

/* Wait (at most 10 s) until server 0 of j has answered `pulls` pulls, then
 * a little more for the reply to reach the client: 0, or -1. */
static int wait_pulls(const tj_job *j, uint64_t pulls)
{
    for (int i = 0; i < 200; i++) {
        ps_stats st;
        if (ps_test_stats(j->port[0], &st) == 0 && st.pulls >= pulls) {
            ps_test_sleep_ms(300);
            return 0;
        }
        ps_test_sleep_ms(50);
    }
    return -1;
}

PS_TEST(async_next_batch_is_pulled_at_once_and_rows_that_landed_are_taken_without_waiting)
{
    TJ_NEED_SERVER();
    enum { STEPS = 3 };
    tj_job j;
    /* one server, one partition: its pull count says which pulls were answered */
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode async --optimizer sgd --lr 0.1 --threads 1", DIM,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.opt.lr = LR;
    xworker k;
    int rc = xworker_open(&k, &j);
    /* snap[s]: the rows after pushes 0..s-1 */
    static ref snap[STEPS + 1];
    memset(snap, 0, sizeof snap);
    uint64_t ids[STEPS + 1][MAXIDS];
    size_t n[STEPS + 1];
    char why[256] = "";
    int bad_step = -1;
    int64_t waited = 0;
    for (int t = 0; t <= STEPS; t++)
        n[t] = batch0(t, ids[t]);
    if (!rc)
        rc = ps_exchange_table_next(k.x, 0, ids[0], n[0], 1);
    for (int t = 0; t < STEPS && !rc && bad_step < 0; t++) {
        /* batch t+1's pull goes out now, before this step's push */
        if ((rc = ps_exchange_table_next(k.x, 0, ids[t + 1], n[t + 1], 1)))
            break;
        if (wait_pulls(&j, (uint64_t)t + 2)) {
            snprintf(why, sizeof why, "the server did not answer pull %d", t + 2);
            bad_step = t;
            break;
        }
        ps_exchange_take_wait_ns(k.x);
        ps_exchange_rows r;
        if ((rc = ps_exchange_table_rows(k.x, 0, &r)))
            break;
        waited += ps_exchange_take_wait_ns(k.x);
        /* batch t was pulled at the start of step t-1: after the pushes before it */
        if (!check_batch(&r, ids[t], n[t], &snap[t ? t - 1 : 0], &j, why, sizeof why)) {
            bad_step = t;
            break;
        }
        snap[t + 1] = snap[t];
        for (size_t i = 0; i < r.nunique; i++) {
            float *w = ref_row(&snap[t + 1], &j, r.ids[i]);
            for (int d = 0; d < DIM; d++) {
                r.grads[i * DIM + d] = gval(0, r.ids[i], t, d);
                w[d] = w[d] - LR * (r.grads[i * DIM + d] / 1.0f + 0.0f * w[d]);
            }
        }
        if ((rc = ps_exchange_table_push(k.x, 0, t)))
            break;
    }
    if (!rc && bad_step < 0)
        rc = ps_exchange_finish(k.x);
    /* what the servers hold now: every update, each applied once */
    const ref *last = &snap[STEPS];
    for (int a = 0; !rc && bad_step < 0 && a < last->n; a++) {
        float row[DIM];
        if ((rc = ps_exchange_table_lookup(k.x, 0, &last->ids[a], 1, row)))
            break;
        if (memcmp(row, last->w[a], sizeof row)) {
            snprintf(why, sizeof why, "id %llu holds %.9g.., expected %.9g..",
                     (unsigned long long)last->ids[a], (double)row[0], (double)last->w[a][0]);
            bad_step = STEPS;
        }
    }
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_MSG(bad_step < 0, "batch %d: %s", bad_step, why);
    CHECK_MSG(waited == 0, "rows that had landed cost %.3f ms of comm-wait", waited / 1e6);
}

PS_TEST(async_ssp_0_rows_wait_for_the_slower_worker_and_the_wait_is_comm_wait)
{
    TJ_NEED_SERVER();
    enum { DELAY_MS = 300 };
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 2,
                        "--mode async --max-staleness 0 --optimizer sgd --lr 0.1 --threads 2",
                        DIM, PS_TABLE_INIT_UNIFORM));
    j.topt.opt.lr = LR;
    xworker k;
    int rc = xworker_open(&k, &j);
    if (!rc)
        rc = tj_client(&j, 1);
    ref rf = {0};
    uint64_t ids0[MAXIDS], ids1[MAXIDS], pids[MAXIDS];
    float pg[MAXIDS * DIM];
    size_t n0 = batch0(0, ids0), n1 = batch0(1, ids1), pn = batch1(0, pids);
    char why[256] = "";
    int64_t wait_ns = 0, took_ns = 0;
    late p = {0};
    int started = 0;
    ps_exchange_rows r;
    if (!rc && !(rc = ps_exchange_table_next(k.x, 0, ids0, n0, 1)) &&
        !(rc = ps_exchange_table_next(k.x, 0, ids1, n1, 1)) &&
        !(rc = ps_exchange_table_rows(k.x, 0, &r))) {
        /* batch 1 is read at step 1: its pull waits until both workers pushed step 0 */
        for (size_t i = 0; i < r.nunique; i++) {
            float *w = ref_row(&rf, &j, r.ids[i]);
            for (int d = 0; d < DIM; d++) {
                r.grads[i * DIM + d] = gval(0, r.ids[i], 0, d);
                w[d] = w[d] - LR * (r.grads[i * DIM + d] / 1.0f + 0.0f * w[d]);
            }
        }
        rc = ps_exchange_table_push(k.x, 0, 0);
        for (size_t i = 0; i < pn; i++) {
            float *w = ref_row(&rf, &j, pids[i]);
            for (int d = 0; d < DIM; d++) {
                pg[i * DIM + d] = gval(1, pids[i], 0, d);
                w[d] = w[d] - LR * (pg[i * DIM + d] / 1.0f + 0.0f * w[d]);
            }
        }
        p = (late){.c = j.c[1], .table = j.table, .ids = pids, .n = pn, .g = pg, .step = 0,
                   .delay_ms = DELAY_MS};
        started = !rc && pthread_create(&p.th, NULL, late_main, &p) == 0;
        if (!rc && !started)
            rc = PS_ENOMEM;
    }
    if (!rc) {
        ps_exchange_take_wait_ns(k.x);
        int64_t t0 = ps_now_ns();
        rc = ps_exchange_table_rows(k.x, 0, &r);
        took_ns = ps_now_ns() - t0;
        wait_ns = ps_exchange_take_wait_ns(k.x);
        if (!rc)
            check_batch(&r, ids1, n1, &rf, &j, why, sizeof why);
    }
    if (started)
        pthread_join(p.th, NULL);
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_OK(p.rc);
    CHECK_MSG(!why[0], "batch 1: %s", why);
    CHECK_MSG(took_ns >= (DELAY_MS - 50) * 1000000LL, "the rows came after %.1f ms, before the "
              "slower worker pushed", (double)took_ns / 1e6);
    CHECK_MSG(wait_ns >= took_ns / 2, "comm-wait %.1f ms of a %.1f ms wait",
              (double)wait_ns / 1e6, (double)took_ns / 1e6);
}

/* ------------------------------------------------------------------ what is pushed */

PS_TEST(a_push_is_one_gradient_row_per_distinct_id_exactly_as_written)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 2, 1, "--mode sync --optimizer sgd --lr 0.1 --threads 2", DIM,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.opt.lr = LR;
    xworker k;
    int rc = xworker_open(&k, &j);
    /* 5 three times, 9 twice, 7 once; a field's column of a samples x 2 array */
    const uint64_t batch[12] = {5, 100, 9, 101, 5, 102, 7, 103, 9, 104, 5, 105};
    const uint64_t want_ids[3] = {5, 9, 7};
    const int32_t want_index[6] = {0, 1, 0, 2, 1, 0};
    ref rf = {0};
    char why[256] = "";
    ps_exchange_rows r;
    if (!rc && !(rc = ps_exchange_table_next(k.x, 0, batch, 6, 2)) &&
        !(rc = ps_exchange_table_rows(k.x, 0, &r))) {
        if (r.nunique != 3 || r.nentries != 6 || memcmp(r.ids, want_ids, sizeof want_ids) ||
            memcmp(r.index, want_index, sizeof want_index))
            snprintf(why, sizeof why, "%zu distinct ids of %zu entries, not 5, 9, 7 of 6",
                     r.nunique, r.nentries);
        /* the caller's gradient rows, each id's sum over its entries */
        for (size_t i = 0; i < r.nunique; i++) {
            float *w = ref_row(&rf, &j, r.ids[i]);
            for (int d = 0; d < DIM; d++) {
                r.grads[i * DIM + d] = gval(0, r.ids[i], 0, d) * (float)(3 - i);
                w[d] = w[d] - LR * (r.grads[i * DIM + d] / 1.0f + 0.0f * w[d]);
            }
        }
        if (!(rc = ps_exchange_table_push(k.x, 0, 0)))
            rc = ps_exchange_finish(k.x);
    }
    ps_stats st0 = {0}, st1 = {0};
    float got[3 * DIM];
    if (!rc && !why[0] && !(rc = ps_exchange_table_lookup(k.x, 0, want_ids, 3, got)))
        for (int i = 0; i < 3; i++)
            if (memcmp(got + i * DIM, ref_row(&rf, &j, want_ids[i]), DIM * sizeof(float)))
                snprintf(why, sizeof why, "id %llu holds %.9g.., expected %.9g..",
                         (unsigned long long)want_ids[i], (double)got[i * DIM],
                         (double)ref_row(&rf, &j, want_ids[i])[0]);
    int stats_rc = ps_test_stats(j.port[0], &st0) || ps_test_stats(j.port[1], &st1);
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_MSG(!why[0], "%s", why);
    CHECK_OK(stats_rc);
    /* the two servers hold the three rows between them, nothing else */
    CHECK_EQ_INT(st0.rows + st1.rows, 3);
}

/* ps.torch's calls: a sorted table gives its distinct ids ascending as
 * int64 (negative ones first) with each entry's index following them, and
 * extend adds ids to the taken batch, their gradient rows pushed with its
 * own (zeroed first), the batch's rows untouched; extend past max_ids or
 * before rows is refused. */
PS_TEST(a_sorted_table_orders_its_ids_and_extend_adds_rows_to_the_push)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode sync --optimizer sgd --lr 0.1", DIM,
                        PS_TABLE_INIT_UNIFORM));
    j.topt.opt.lr = LR;
    xworker_sorted = 1;
    xworker k;
    int rc = xworker_open(&k, &j);
    xworker_sorted = 0;
    const uint64_t batch[6] = {9, (uint64_t)-3, 9, 2, 40, (uint64_t)-3};
    const uint64_t want_ids[4] = {(uint64_t)-3, 2, 9, 40};
    const int32_t want_index[6] = {2, 0, 2, 1, 3, 0};
    const uint64_t more[2] = {77, 1};
    uint64_t all[6];
    memcpy(all, want_ids, sizeof want_ids);
    memcpy(all + 4, more, sizeof more);
    ref rf = {0};
    char why[256] = "";
    int refused[3] = {0};
    ps_exchange_rows r;
    if (!rc) {
        refused[0] = ps_exchange_table_extend(k.x, 0, more, 2) == PS_ESTATE; /* nothing given */
        rc = ps_exchange_table_next(k.x, 0, batch, 6, 1);
    }
    if (!rc && !(rc = ps_exchange_table_rows(k.x, 0, &r))) {
        if (r.nunique != 4 || memcmp(r.ids, want_ids, sizeof want_ids) ||
            memcmp(r.index, want_index, sizeof want_index))
            snprintf(why, sizeof why, "ids %llu %llu .. index %d %d .., not ascending as int64",
                     (unsigned long long)r.ids[0], (unsigned long long)r.ids[1], r.index[0],
                     r.index[1]);
        for (size_t i = 0; i < 4; i++)
            for (int d = 0; d < DIM; d++)
                r.grads[i * DIM + d] = gval(0, r.ids[i], 0, d);
        rc = ps_exchange_table_extend(k.x, 0, more, 2);
    }
    if (!rc) {
        uint64_t too_many[MAXIDS];
        for (int i = 0; i < MAXIDS; i++)
            too_many[i] = 1000 + (uint64_t)i;
        refused[1] = ps_exchange_table_extend(k.x, 0, too_many, MAXIDS - 5) == PS_ETOOBIG;
        rc = ps_exchange_table_rows(k.x, 0, &r);
    }
    if (!rc) {
        refused[2] = r.nunique == 6 && memcmp(r.ids, all, sizeof all) == 0 &&
                     r.grads[4 * DIM] == 0.0f && r.grads[6 * DIM - 1] == 0.0f;
        for (size_t i = 0; i < 6; i++) {
            float *w = ref_row(&rf, &j, r.ids[i]);
            for (int d = 0; d < DIM; d++) {
                if (i >= 4)
                    r.grads[i * DIM + d] = gval(0, r.ids[i], 1, d);
                w[d] = w[d] - LR * r.grads[i * DIM + d];
            }
        }
        if (!(rc = ps_exchange_table_push(k.x, 0, 0)))
            rc = ps_exchange_finish(k.x);
    }
    float got[6 * DIM];
    if (!rc && !why[0] && !(rc = ps_exchange_table_lookup(k.x, 0, all, 6, got)))
        for (int i = 0; i < 6; i++)
            if (memcmp(got + i * DIM, ref_row(&rf, &j, all[i]), DIM * sizeof(float)))
                snprintf(why, sizeof why, "id %llu holds %.9g.., expected %.9g..",
                         (unsigned long long)all[i], (double)got[i * DIM],
                         (double)ref_row(&rf, &j, all[i])[0]);
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_MSG(!why[0], "%s", why);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(refused[i], "case %d", i);
}

PS_TEST(calls_out_of_order_are_refused_and_change_nothing)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 1, "--mode sync --optimizer sgd --lr 0.1", DIM,
                        PS_TABLE_INIT_UNIFORM));
    xworker k;
    int rc = xworker_open(&k, &j);
    uint64_t ids[MAXIDS + 1];
    for (int i = 0; i <= MAXIDS; i++)
        ids[i] = (uint64_t)i;
    ps_exchange_rows r;
    int refused[9] = {0}, nrows = -1;
    if (!rc) {
        refused[0] = ps_exchange_table_rows(k.x, 0, &r) == PS_ESTATE;   /* nothing handed */
        refused[1] = ps_exchange_table_next(k.x, 1, ids, 1, 1) == PS_EINVAL; /* no table 1 */
        refused[2] = ps_exchange_table_next(k.x, 0, ids, MAXIDS + 1, 1) == PS_EINVAL;
        refused[3] = ps_exchange_table_next(k.x, 0, ids, 2, 0) == PS_EINVAL;
        rc = ps_exchange_table_next(k.x, 0, ids, 2, 1);
    }
    if (!rc) {
        refused[4] = ps_exchange_table_push(k.x, 0, 0) == PS_ESTATE; /* rows not taken */
        rc = ps_exchange_table_next(k.x, 0, ids + 2, 3, 1);
    }
    if (!rc) {
        /* three batches in flight: one too many */
        refused[5] = ps_exchange_table_next(k.x, 0, ids, 1, 1) == PS_ESTATE;
        if (!(rc = ps_exchange_table_rows(k.x, 0, &r)))
            nrows = (int)r.nunique;
    }
    if (!rc && !(rc = ps_exchange_table_push(k.x, 0, 0))) {
        refused[6] = ps_exchange_table_push(k.x, 0, 1) == PS_ESTATE; /* batch 1 not taken */
        if (!(rc = ps_exchange_table_rows(k.x, 0, &r)))
            refused[7] = ps_exchange_table_push(k.x, 0, 0) == PS_EINVAL; /* step 0 again */
        refused[8] = r.nunique == 3 && ps_exchange_table_push(k.x, 0, 1) == 0;
    }
    if (!rc)
        rc = ps_exchange_finish(k.x);
    int fired = xworker_close(&k);
    CHECK_OK(tj_stop(&j));
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_EQ_INT(nrows, 2);
    for (int i = 0; i < 9; i++)
        CHECK_MSG(refused[i], "case %d was not refused as it should", i);
}
