/* Elastic jobs (docs/OPERATIONS.md "Elastic jobs"): ps_server --num-workers
 * MIN:MAX.  Two workers train, a third joins while they do (ps_client_join),
 * one leaves (ps_client_leave): async applies every push exactly once;
 * sync ends bitwise where a run with the same membership history ends (the
 * same join step and leave step, reached with other timing); a barrier
 * waits for MIN members.  With a table (async), every worker also pushes a
 * row gradient for every id each step: the joiner's from its join step on,
 * each applied exactly once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_client.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define KEY 7
#define N 1000          /* 4 chunks of 256 floats over 2 servers */
#define STEPS 150
#define JOIN_AT 50      /* worker 2 joins once worker 0 reached this step */
#define LEAVE_AFTER 100 /* worker 1 pushes steps 0..99, then leaves */
#define JOINED_BY 90    /* workers 0 and 1 wait here for the join (a loaded host) */
#define WAIT_MS 20000
#define TKEY 9          /* the table of the table run */
#define TDIM 4
#define NIDS 64         /* ids 0..63, over both servers' partitions */

typedef struct job {
    char eps[128];
    int mode;
    int table;           /* async: also a table TKEY, each id pushed -1 each step */
    int controlled;      /* sync reference: workers 0 and 1 stop before the join step's
                            last round (the joiner's step is the open round + 1) */
    int64_t join_step;   /* controlled: the step worker 2 must join at */
    _Atomic int64_t step0; /* worker 0's step */
    _Atomic int parked;  /* controlled: workers 0 and 1 stopped before join_step */
    _Atomic int go;      /* worker 2 joined (or failed), go on */
    _Atomic int failed;  /* a worker failed: nobody waits for another */
    _Atomic int64_t pushes; /* pushes acknowledged (not duplicates: async clocks) */
    int64_t joined_at;   /* worker 2's step from ps_client_join */
    _Atomic int done;    /* workers 1 and 2 finished */
    float final[N];      /* worker 0's pull once they have */
    float final_rows[NIDS * TDIM]; /* table: worker 0's pull of every id's row */
    int rc[3];
    char why[3][256];
} job;

typedef struct wk {
    job *j;
    int rank;
} wk;

static ps_client *open_client(job *j, int rank, char *why, size_t len)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = j->eps;
    o.rank = rank;
    o.num_workers = 3;
    o.mode = j->mode;
    o.chunk_bytes = 256 * sizeof(float);
    o.hello_timeout_ms = WAIT_MS;
    o.request_timeout_ms = 2000;
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = TDIM;
    t.init = PS_TABLE_INIT_ZEROS;
    t.opt.kind = PS_OPT_SGD;
    t.opt.lr = 1;
    ps_client *c;
    int rc = ps_client_open(&o, &c);
    if (!rc && (rc = ps_client_register(c, KEY, N)) == 0 &&
        (!j->table || (rc = ps_client_register_table(c, TKEY, &t)) == 0) &&
        (rc = ps_client_start(c)) == 0)
        return c;
    snprintf(why, len, "worker %d: start: %s %s", rank, ps_strerror(rc),
             rc && c ? ps_client_last_error(c) : "");
    return NULL;
}

/* The gradient of a worker at a step, from the weights it pulled: it
 * depends on the weights, so the order and membership of rounds show. */
static void grad(int mode, int rank, int64_t step, const float *w, float *g)
{
    for (int i = 0; i < N; i++) /* async: -1, so the weights count the updates */
        g[i] = mode == PS_MODE_ASYNC ? -1.0f
               : ((float)(rank + 1) * 0.37f * (float)(1 + i % 7) + 0.01f * w[i]) * 0.1f +
                     0.0001f * (float)(step % 13);
}

static void *worker(void *arg)
{
    wk *k = arg;
    job *j = k->j;
    int r = k->rank;
    char *why = j->why[r];
    float *w = calloc(N, sizeof *w), *g = calloc(N, sizeof *g);
    float *tg = calloc(NIDS * TDIM, sizeof *tg);
    uint64_t ids[NIDS];
    for (int i = 0; i < NIDS; i++) {
        ids[i] = (uint64_t)i * 7919u; /* spread over the partitions */
        for (int d = 0; d < TDIM; d++)
            tg[i * TDIM + d] = -1.0f;
    }
    ps_client *c = NULL;
    int rc = 0;
    int64_t first = 0, last = r == 1 ? LEAVE_AFTER : STEPS;
    if (r == 2) { /* joins while the others train */
        while ((j->controlled ? atomic_load(&j->parked) < 2 : atomic_load(&j->step0) < JOIN_AT) &&
               !atomic_load(&j->failed))
            ps_test_sleep_ms(1);
    }
    if (!(c = open_client(j, r, why, 256))) {
        rc = -1;
        goto out;
    }
    if (r == 0) { /* the first values */
        ps_request q;
        memset(w, 0, N * sizeof *w);
        if ((rc = ps_client_init(c, KEY, w, &q)) == 0)
            rc = ps_request_wait(&q);
    }
    if (r == 2) {
        if ((rc = ps_client_join(c, &first)) != 0) {
            snprintf(why, 256, "join: %s", ps_client_last_error(c));
            goto out;
        }
        j->joined_at = first;
        atomic_store(&j->go, 1);
    }
    /* workers 0 and 1: after worker 0's init, a barrier, which waits for MIN = 2 */
    if (r != 2 && (rc = ps_client_barrier(c, 1)) != 0) {
        snprintf(why, 256, "barrier: %s", ps_client_last_error(c));
        goto out;
    }
    for (int64_t s = first; s < last && !rc; s++) {
        ps_request q;
        if (r == 0)
            atomic_store(&j->step0, s);
        if (!j->controlled && r != 2 && s == JOINED_BY)
            while (!atomic_load(&j->go) && !atomic_load(&j->failed))
                ps_test_sleep_ms(1);
        if (j->controlled && r != 2 && s == j->join_step - 1) {
            atomic_fetch_add(&j->parked, 1);
            while (!atomic_load(&j->go) && !atomic_load(&j->failed))
                ps_test_sleep_ms(1);
        }
        /* sync: the weights of version s; async: whatever they are */
        if ((rc = ps_client_pull(c, KEY, w, j->mode == PS_MODE_SYNC ? s : 0, &q)) ||
            (rc = ps_request_wait_for(&q, WAIT_MS))) {
            snprintf(why, 256, "pull %lld: %s", (long long)s, q.err);
            break;
        }
        grad(j->mode, r, s, w, g);
        if ((rc = ps_client_push(c, KEY, g, s, &q)) || (rc = ps_request_wait_for(&q, WAIT_MS))) {
            snprintf(why, 256, "push %lld: %s", (long long)s, q.err);
            break;
        }
        atomic_fetch_add(&j->pushes, 1);
        /* the table's push of step s: the joiner's first is its join step */
        if (j->table && ((rc = ps_client_sparse_push(c, TKEY, ids, NIDS, tg, s, &q)) ||
                         (rc = ps_request_wait_for(&q, WAIT_MS)))) {
            snprintf(why, 256, "table push %lld: %s", (long long)s, q.err);
            break;
        }
    }
    if (!rc && r == 1 && (rc = ps_client_leave(c)) != 0)
        snprintf(why, 256, "leave: %s", ps_client_last_error(c));
    if (r == 0 && !rc) { /* the final weights, once the others are done */
        ps_request q;
        while (atomic_load(&j->done) < 2 && !atomic_load(&j->failed))
            ps_test_sleep_ms(1);
        if ((rc = ps_client_pull(c, KEY, j->final, j->mode == PS_MODE_SYNC ? STEPS : 0, &q)) ||
            (rc = ps_request_wait_for(&q, WAIT_MS)))
            snprintf(why, 256, "final pull: %s", q.err);
        else if (j->table &&
                 ((rc = ps_client_sparse_pull(c, TKEY, ids, NIDS, j->final_rows, 0, &q)) ||
                  (rc = ps_request_wait_for(&q, WAIT_MS))))
            snprintf(why, 256, "final table pull: %s", q.err);
    }
out:
    if (rc)
        atomic_store(&j->failed, 1);
    if (r == 2) /* joined or failed: nobody waits for it any more */
        atomic_store(&j->go, 1);
    if (r != 0)
        atomic_fetch_add(&j->done, 1);
    if (c)
        ps_client_close(c);
    free(w);
    free(g);
    free(tg);
    j->rc[r] = rc;
    return NULL;
}

/* Two servers (ranks 0 and 1) of an elastic job, its endpoints in j->eps. */
static int start_servers(job *j, ps_test_server sv[2])
{
    char words[256];
    for (int k = 0; k < 2; k++) {
        snprintf(words, sizeof words, "--mode %s --num-workers 2:3 --num-servers 2 --rank %d "
                 "--threads 2 --lr 1 --worker-timeout 30",
                 j->mode == PS_MODE_SYNC ? "sync" : "async", k);
        if (ps_test_server_start(&sv[k], 1, words))
            return -1;
    }
    snprintf(j->eps, sizeof j->eps, "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", sv[0].port,
             sv[1].port);
    return 0;
}

/* One run of the three workers; 0 when every one ended well. */
static int run(job *j, ps_test_server sv[2])
{
    pthread_t t[3];
    wk k[3];
    if (start_servers(j, sv))
        return -1;
    for (int r = 0; r < 3; r++) {
        k[r] = (wk){j, r};
        pthread_create(&t[r], NULL, worker, &k[r]);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(t[r], NULL);
    int bad = 0;
    for (int r = 0; r < 3; r++)
        if (j->rc[r]) {
            printf("# worker %d: %s (rc %d)\n", r, j->why[r], j->rc[r]);
            bad = 1;
        }
    return bad;
}

static void stop_servers(ps_test_server sv[2])
{
    for (int k = 0; k < 2; k++)
        ps_test_stop(sv[k].pid, 10000);
}

PS_TEST(async_a_worker_joins_and_one_leaves_every_push_applied_once)
{
    job *j = calloc(1, sizeof *j);
    ps_test_server sv[2];
    j->mode = PS_MODE_ASYNC;
    int rc = run(j, sv);
    stop_servers(sv);
    CHECK_EQ_INT(rc, 0);
    CHECK(ps_test_file_has(sv[0].log, "worker 2 joins"));
    CHECK(ps_test_file_has(sv[1].log, "worker 1 left: "));
    int64_t want = STEPS + LEAVE_AFTER + (STEPS - j->joined_at);
    printf("# async: worker 2 joined at step %lld; %lld pushes\n", (long long)j->joined_at,
           (long long)atomic_load(&j->pushes));
    CHECK_EQ_INT(atomic_load(&j->pushes), want);
    /* -1 each, with lr 1: the weights count the updates, on every chunk */
    for (int i = 0; i < N; i++)
        CHECK_MSG(j->final[i] == (float)want, "element %d is %g after %lld pushes", i,
                  (double)j->final[i], (long long)want);
    free(j);
}

PS_TEST(async_a_joiners_table_pushes_count_from_its_join_step_every_push_applied_once)
{
    job *j = calloc(1, sizeof *j);
    ps_test_server sv[2];
    j->mode = PS_MODE_ASYNC;
    j->table = 1;
    int rc = run(j, sv);
    stop_servers(sv);
    CHECK_EQ_INT(rc, 0);
    CHECK(ps_test_file_has(sv[0].log, "worker 2 is a member from step"));
    CHECK(ps_test_file_has(sv[1].log, "worker 1 left: "));
    CHECK_MSG(j->joined_at >= JOIN_AT, "worker 2 joined at step %lld, before %d",
              (long long)j->joined_at, JOIN_AT);
    /* workers 0 and 1 push steps 0..STEPS-1 and 0..LEAVE_AFTER-1, the joiner
     * J..STEPS-1: with sgd lr 1 and -1 each, a row counts the pushes applied */
    int64_t want = STEPS + LEAVE_AFTER + (STEPS - j->joined_at);
    printf("# table: worker 2 joined at step %lld; %lld pushes of each id\n",
           (long long)j->joined_at, (long long)want);
    CHECK_EQ_INT(atomic_load(&j->pushes), want);
    for (int i = 0; i < NIDS * TDIM; i++)
        CHECK_MSG(j->final_rows[i] == (float)want, "row %d value %d is %g after %lld pushes",
                  i / TDIM, i % TDIM, (double)j->final_rows[i], (long long)want);
    for (int i = 0; i < N; i++)
        CHECK_MSG(j->final[i] == (float)want, "element %d is %g after %lld pushes", i,
                  (double)j->final[i], (long long)want);
    free(j);
}

PS_TEST(sync_membership_history_gives_bitwise_the_same_weights)
{
    job *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    ps_test_server sv[2];
    a->mode = b->mode = PS_MODE_SYNC;
    int rc = run(a, sv);
    stop_servers(sv);
    CHECK_EQ_INT(rc, 0);
    CHECK(ps_test_file_has(sv[0].log, "worker 2 is a member from step"));
    CHECK_MSG(a->joined_at >= JOIN_AT && a->joined_at <= JOINED_BY + 2, "joined at %lld",
              (long long)a->joined_at);
    /* the same history, other timing: workers 0 and 1 wait at the join step */
    b->controlled = 1;
    b->join_step = a->joined_at;
    rc = run(b, sv);
    stop_servers(sv);
    CHECK_EQ_INT(rc, 0);
    printf("# sync: worker 2 joined at step %lld, then at %lld with workers 0 and 1 waiting\n",
           (long long)a->joined_at, (long long)b->joined_at);
    CHECK_EQ_INT(b->joined_at, a->joined_at);
    CHECK(memcmp(a->final, b->final, sizeof a->final) == 0);
    /* and not the weights of another history (the check can fail) */
    int moved = 0;
    for (int i = 0; i < N; i++)
        moved += a->final[i] != 0.0f;
    CHECK(moved == N);
    free(a);
    free(b);
}

PS_TEST(a_barrier_waits_for_min_members)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode sync --num-workers 2:3"));
    job j;
    memset(&j, 0, sizeof j);
    snprintf(j.eps, sizeof j.eps, "tcp://127.0.0.1:%d", sv.port);
    j.mode = PS_MODE_SYNC;
    char why[256];
    ps_client *c0 = open_client(&j, 0, why, sizeof why);
    CHECK_MSG(c0, "%s", why);
    ps_request q;
    CHECK_OK(ps_client_barrier_post(c0, 5, &q));
    /* one member of MIN 2: the barrier holds */
    CHECK_EQ_INT(ps_request_wait_for(&q, 500), -1);
    ps_client *c1 = open_client(&j, 1, why, sizeof why);
    CHECK_MSG(c1, "%s", why);
    CHECK_OK(ps_client_barrier(c1, 5));
    CHECK_EQ_INT(ps_request_wait_for(&q, WAIT_MS), 0);
    ps_client_close(c0);
    ps_client_close(c1);
    ps_test_stop(sv.pid, 10000);
}

/* Push key k's gradient g (n floats) at step s from c and wait. */
static int push_wait(ps_client *c, uint64_t k, const float *g, int64_t s)
{
    ps_request q;
    int rc = ps_client_push(c, k, g, s, &q);
    return rc ? rc : ps_request_wait_for(&q, WAIT_MS);
}

/* A worker's hello lands between two chunks' rounds: key 1 has finished
 * round 0, key 2 has not.  Its join step is 2 on both (past the largest
 * open round), and key 2's rounds 0 and 1 and key 1's round 1 end without
 * it (key 2's round 0 would wait for the joiner forever otherwise). */
PS_TEST(a_join_between_two_chunks_rounds_counts_from_one_step_on_both)
{
    enum { M = 4 };
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode sync --num-workers 2:3 --lr 1"));
    char eps[64];
    snprintf(eps, sizeof eps, "tcp://127.0.0.1:%d", sv.port);
    ps_client *c[3] = {0};
    for (int r = 0; r < 3; r++) {
        ps_client_options o;
        ps_client_options_default(&o);
        o.servers = eps;
        o.rank = r;
        o.num_workers = 3;
        o.mode = PS_MODE_SYNC;
        o.hello_timeout_ms = WAIT_MS;
        CHECK_OK(ps_client_open(&o, &c[r]));
        CHECK_OK(ps_client_register(c[r], 1, M));
        CHECK_OK(ps_client_register(c[r], 2, M));
        if (r < 2)
            CHECK_OK(ps_client_start(c[r]));
    }
    float zero[M] = {0}, g[3][M], w[M], out[M];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < M; i++)
            g[r][i] = 0.3f * (float)(r + 1) + 0.07f * (float)i;
    ps_request q;
    CHECK_OK(ps_client_init(c[0], 1, zero, &q));
    CHECK_OK(ps_request_wait(&q));
    CHECK_OK(ps_client_init(c[0], 2, zero, &q));
    CHECK_OK(ps_request_wait(&q));
    /* round 0 of key 1 only */
    CHECK_OK(push_wait(c[0], 1, g[0], 0));
    CHECK_OK(push_wait(c[1], 1, g[1], 0));
    /* worker 2 joins now */
    int rc = ps_client_start(c[2]);
    CHECK_MSG(rc == 0, "%s", ps_client_last_error(c[2]));
    int64_t step = -1;
    rc = ps_client_join(c[2], &step);
    CHECK_MSG(rc == 0, "%s", ps_client_last_error(c[2]));
    CHECK_EQ_INT(step, 2);
    /* key 2's round 0 goes on without it */
    CHECK_OK(push_wait(c[0], 2, g[0], 0));
    CHECK_OK(push_wait(c[1], 2, g[1], 0));
    CHECK_OK(ps_client_pull(c[2], 2, out, 1, &q));
    rc = ps_request_wait_for(&q, 5000);
    CHECK_MSG(rc == 0, "key 2's round 0 did not end without the joiner (%d: %s)", rc, q.err);
    /* round 1 without it, round 2 with all three, on both keys: their means */
    for (int k = 1; k <= 2; k++) {
        for (int r = 0; r < 2; r++)
            CHECK_OK(push_wait(c[r], (uint64_t)k, g[r], 1));
        for (int r = 0; r < 3; r++)
            CHECK_OK(push_wait(c[r], (uint64_t)k, g[r], 2));
        CHECK_OK(ps_client_pull(c[2], (uint64_t)k, out, 3, &q));
        CHECK_EQ_INT(ps_request_wait_for(&q, WAIT_MS), 0);
        CHECK_EQ_INT(q.version, 3);
        for (int i = 0; i < M; i++) {
            w[i] = 0.0f - 1.0f * ((g[0][i] + g[1][i]) / 2.0f + 0.0f * 0.0f);
            w[i] = w[i] - 1.0f * ((g[0][i] + g[1][i]) / 2.0f + 0.0f * w[i]);
            w[i] = w[i] - 1.0f * ((g[0][i] + g[1][i] + g[2][i]) / 3.0f + 0.0f * w[i]);
        }
        CHECK_MSG(memcmp(out, w, sizeof w) == 0, "key %d: %g, expected %g", k, (double)out[0],
                  (double)w[0]);
    }
    CHECK(ps_test_file_has(sv.log, "worker 2 is a member from step 2 on"));
    for (int r = 0; r < 3; r++)
        ps_client_close(c[r]);
    ps_test_stop(sv.pid, 10000);
}

/* A fixed-size job refuses a join: its ranks are members from step 0. */
PS_TEST(a_fixed_job_refuses_a_join)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode sync --num-workers 1"));
    job j;
    memset(&j, 0, sizeof j);
    snprintf(j.eps, sizeof j.eps, "tcp://127.0.0.1:%d", sv.port);
    j.mode = PS_MODE_SYNC;
    char why[256];
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = j.eps;
    o.hello_timeout_ms = WAIT_MS;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_OK(ps_client_register(c, KEY, 4));
    CHECK_OK(ps_client_start(c));
    float zero[4] = {0};
    ps_request q;
    CHECK_OK(ps_client_init(c, KEY, zero, &q));
    CHECK_OK(ps_request_wait(&q));
    int64_t step;
    int rc = ps_client_join(c, &step);
    snprintf(why, sizeof why, "%s", ps_client_last_error(c));
    CHECK_MSG(rc == PS_ESTATE, "%d: %s", rc, why);
    CHECK_MSG(strstr(why, "elastic job"), "%s", why);
    ps_client_close(c);
    ps_test_stop(sv.pid, 10000);
}

/* The membership as each worker sees it: dense indices in rank order, a
 * version that counts the changes. */
PS_TEST(members_gives_dense_indices_and_a_version)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 2:3"));
    job j;
    memset(&j, 0, sizeof j);
    snprintf(j.eps, sizeof j.eps, "tcp://127.0.0.1:%d", sv.port);
    j.mode = PS_MODE_ASYNC;
    char why[256];
    ps_client *c0 = open_client(&j, 0, why, sizeof why), *c2 = NULL, *c1 = NULL;
    CHECK_MSG(c0, "%s", why);
    c2 = open_client(&j, 2, why, sizeof why);
    CHECK_MSG(c2, "%s", why);
    int idx, n;
    int64_t v0, v;
    CHECK_OK(ps_client_members(c2, &idx, &n, &v0));
    CHECK(idx == 1 && n == 2);
    c1 = open_client(&j, 1, why, sizeof why);
    CHECK_MSG(c1, "%s", why);
    CHECK_OK(ps_client_members(c2, &idx, &n, &v));
    CHECK(idx == 2 && n == 3 && v == v0 + 1);
    CHECK_OK(ps_client_members(c1, &idx, &n, &v));
    CHECK(idx == 1 && n == 3);
    CHECK_OK(ps_client_leave(c0));
    CHECK_OK(ps_client_members(c2, &idx, &n, &v));
    CHECK(idx == 1 && n == 2 && v == v0 + 2);
    CHECK_OK(ps_client_members(c0, &idx, &n, &v)); /* it left: not a member */
    CHECK(idx == -1 && n == 2);
    ps_client_close(c0);
    ps_client_close(c1);
    ps_client_close(c2);
    ps_test_stop(sv.pid, 10000);
}
