/* Servers added and removed while training goes on (server/move.h): the
 * servers' side, seen by a raw worker below libps.  A server added with
 * ps_servers takes about 1/(S+1) of the chunks; the old server answers a
 * request for a chunk it gave away PS_EMOVED naming the new one; the chunk
 * there has every update it had; a removed server moves everything off and
 * exits; bad requests are refused saying why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define NEED_SERVER()                                                                      \
    do {                                                                                   \
        char bin_[256];                                                                    \
        if (access(ps_test_bin("ps_server", bin_, sizeof bin_), X_OK) != 0 ||              \
            access(ps_test_bin("ps_servers", bin_, sizeof bin_), X_OK) != 0)               \
            SKIP("bin/ps_server or bin/ps_servers is not built");                          \
    } while (0)

#define NCH 4   /* chunks per key */
#define N 4     /* floats per chunk */
#define NSRV 3  /* two at start, one added */

typedef struct job {
    ps_test_server sv[NSRV];
    void *d[NSRV];   /* worker 0's connection to each */
    int said[NSRV];  /* it said hello there */
    char list[256];  /* the workers' --servers */
    char ep[NSRV][64];
    const char *token;
} job;

static const char *common =
    "--num-servers 2 --num-workers 1 --mode async --threads 2 --optimizer sgd --lr 0.5 "
    "--shm off";

static int start(job *j, int i, const char *extra)
{
    char words[512];
    snprintf(words, sizeof words, "%s %s --admin-token-file %s", common, extra, j->token);
    if (ps_test_server_start(&j->sv[i], 1, words))
        return -1;
    snprintf(j->ep[i], sizeof j->ep[i], "tcp://127.0.0.1:%d", j->sv[i].port);
    j->d[i] = ps_test_dealer(j->sv[i].port);
    return 0;
}

static int hello(job *j, int i)
{
    if (j->said[i])
        return 0;
    ps_header h = ps_test_header(PS_MSG_HELLO, 0, 1, 0, 0, 0), r;
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.num_workers = 1;
    h.hello.num_servers = 2;
    h.hello.max_staleness = -1;
    h.hello.server_rank = i;
    if (ps_test_rpc(j->d[i], &h, NULL, 0, &r, NULL, 0, NULL) || r.type != PS_MSG_HELLO) {
        fprintf(stderr, "hello to %d: %s\n", i, r.err_text);
        return -1;
    }
    j->said[i] = 1;
    return 0;
}

static void stop(job *j)
{
    for (int i = 0; i < NSRV; i++) {
        if (j->d[i])
            zmq_close(j->d[i]);
        if (j->sv[i].pid > 0)
            ps_test_stop(j->sv[i].pid, 5000);
    }
}

/* ps_servers with these words; its exit status, its output in out. */
static int tool(const job *j, const char *words, char *out, size_t len)
{
    static int calls;
    char args[1024], log[512];
    snprintf(args, sizeof args, "--servers %s --admin-token-file %s %s", j->list, j->token,
             words);
    snprintf(log, sizeof log, "%s/ps_servers.%d.log", ps_test_tmpdir(), ++calls);
    int pid = ps_test_spawn_words("ps_servers", args, log);
    int rc = pid > 0 ? ps_test_wait(pid, 60000) : -1;
    size_t n = 0;
    char *text = ps_test_read_file(log, &n);
    snprintf(out, len, "%s", text ? text : "");
    free(text);
    return rc;
}

/* A request for (key, chunk) sent where it is, following PS_EMOVED: the
 * reply; *at the server that answered. */
static int ask(job *j, int *at, ps_header *h, const float *pl, size_t n, ps_header *r, float *out,
               size_t cap, int *hops)
{
    for (int k = 0; k < 4; k++) {
        if (hello(j, *at) || ps_test_rpc(j->d[*at], h, pl, n, r, out, cap, NULL))
            return -1;
        if (r->type != PS_MSG_ERROR || r->err_code != PS_EMOVED)
            return 0;
        if (r->slot == *at) { /* on its way there: ask again */
            ps_test_sleep_ms(5);
            continue;
        }
        if (r->slot == -1 && *at != 0) { /* that server left: server 0 knows */
            *at = 0;
            h->seq++;
            continue;
        }
        if (r->slot < 0 || r->slot >= NSRV || strcmp(r->owner_ep, j->ep[r->slot])) {
            fprintf(stderr, "moved to slot %d at '%s'?\n", r->slot, r->owner_ep);
            return -1;
        }
        *at = r->slot;
        (*hops)++;
        h->seq++;
    }
    return -1;
}

PS_TEST(a_server_added_takes_a_third_and_a_removed_one_moves_everything_off)
{
    NEED_SERVER();
    job j;
    memset(&j, 0, sizeof j);
    j.token = ps_test_token_file("move.token", PS_TEST_ADMIN_TOKEN, 0600);
    CHECK(j.token != NULL);
    CHECK_OK(start(&j, 0, "--rank 0"));
    CHECK_OK(start(&j, 1, "--rank 1"));
    CHECK_OK(start(&j, 2, "--added --rank 2"));
    snprintf(j.list, sizeof j.list, "%s,%s", j.ep[0], j.ep[1]);
    int where[2][NCH];
    uint64_t seq = 100;
    float w[N], g[N];
    ps_header r;
    /* key 7's chunks on server 0, key 8's on server 1: init, one step */
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < NCH; c++) {
            where[k][c] = k;
            CHECK_OK(hello(&j, k));
            for (int i = 0; i < N; i++)
                w[i] = (float)(10 * k + c), g[i] = 1;
            ps_header h = ps_test_header(PS_MSG_INIT, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            h.total = NCH * N;
            CHECK_OK(ps_test_rpc(j.d[k], &h, w, N, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_INIT);
            h = ps_test_header(PS_MSG_PUSH, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            CHECK_OK(ps_test_rpc(j.d[k], &h, g, N, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        }
    /* refused: without the admin token, a server of another rank, slot 0 */
    char out[2048];
    char args[512];
    snprintf(args, sizeof args, "--servers %s add %s", j.list, j.ep[2]);
    char log[512];
    snprintf(log, sizeof log, "%s/ps_servers_notoken.log", ps_test_tmpdir());
    int pid = ps_test_spawn_words("ps_servers", args, log);
    CHECK_EQ_INT(ps_test_wait(pid, 30000), 1);
    CHECK_MSG(ps_test_file_has(log, "authentication"), "see %s", log);
    CHECK_EQ_INT(tool(&j, "remove 0", out, sizeof out), 2);
    CHECK_MSG(strstr(out, "server 0 coordinates"), "%s", out);
    /* the server joins: a third of the chunks go to it */
    CHECK_EQ_INT(tool(&j, "add", out, sizeof out), 2); /* no endpoint */
    snprintf(args, sizeof args, "add %s", j.ep[2]);
    CHECK_MSG(tool(&j, args, out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "added slot 2"), "%s", out);
    int moved = 0, hops = 0;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < NCH; c++) {
            for (int i = 0; i < N; i++)
                g[i] = 1;
            ps_header h = ps_test_header(PS_MSG_PUSH, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 1);
            int at = where[k][c];
            CHECK_OK(ask(&j, &at, &h, g, N, &r, NULL, 0, &hops));
            CHECK_MSG(r.type == PS_MSG_PUSH, "push of %d/%d: %s", k, c, r.err_text);
            moved += at != where[k][c];
            CHECK(at == where[k][c] || at == 2);
            where[k][c] = at;
            /* every update is there: two steps of lr 0.5 x 1 */
            h = ps_test_header(PS_MSG_PULL, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            CHECK_OK(ps_test_rpc(j.d[at], &h, NULL, 0, &r, w, N, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_PULL);
            for (int i = 0; i < N; i++)
                CHECK_MSG(w[i] == (float)(10 * k + c) - 1.0f, "chunk %d/%d: %g", k, c, w[i]);
        }
    /* 8 equal chunks on 3 servers: the new one has 2 or 3 */
    CHECK_MSG(moved >= 2 && moved <= 3, "%d chunks moved", moved);
    CHECK_EQ_INT(hops, moved);
    /* the map says so */
    CHECK_MSG(tool(&j, "map", out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "3 slots (3 live)") && strstr(out, "next slot: 3"), "%s", out);
    /* server 1 leaves: everything it holds goes to 0 and 2, then it exits */
    CHECK_MSG(tool(&j, "remove 1", out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "removed slot 1"), "%s", out);
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < NCH; c++) {
            for (int i = 0; i < N; i++)
                g[i] = 1;
            ps_header h = ps_test_header(PS_MSG_PUSH, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 2);
            int at = where[k][c];
            CHECK_OK(ask(&j, &at, &h, g, N, &r, NULL, 0, &hops));
            CHECK_MSG(r.type == PS_MSG_PUSH, "push of %d/%d: %s", k, c, r.err_text);
            CHECK(at != 1);
            where[k][c] = at;
            h = ps_test_header(PS_MSG_PULL, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            CHECK_OK(ps_test_rpc(j.d[at], &h, NULL, 0, &r, w, N, NULL));
            for (int i = 0; i < N; i++)
                CHECK_MSG(w[i] == (float)(10 * k + c) - 1.5f, "chunk %d/%d: %g", k, c, w[i]);
        }
    /* removed: it says where what it had went, that it left for the rest,
     * and exits once nobody asks */
    ps_header h = ps_test_header(PS_MSG_PULL, 0, ++seq, 8, 0, 0);
    CHECK_OK(ps_test_rpc(j.d[1], &h, NULL, 0, &r, NULL, 0, NULL));
    CHECK(r.type == PS_MSG_ERROR && r.err_code == PS_EMOVED && r.slot == where[1][0]);
    h = ps_test_header(PS_MSG_PULL, 0, ++seq, 99, 0, 0);
    CHECK_OK(ps_test_rpc(j.d[1], &h, NULL, 0, &r, NULL, 0, NULL));
    CHECK(r.type == PS_MSG_ERROR && r.err_code == PS_EMOVED && r.slot == -1);
    CHECK_EQ_INT(ps_test_wait(j.sv[1].pid, 20000), 0);
    j.sv[1].pid = 0;
    stop(&j);
}

PS_TEST(an_added_server_of_another_configuration_or_rank_is_refused)
{
    NEED_SERVER();
    job j;
    memset(&j, 0, sizeof j);
    j.token = ps_test_token_file("move.token", PS_TEST_ADMIN_TOKEN, 0600);
    CHECK_OK(start(&j, 0, "--rank 0"));
    CHECK_OK(start(&j, 1, "--rank 1"));
    char words[512];
    snprintf(words, sizeof words, "--num-servers 2 --num-workers 1 --mode sync --threads 2 "
             "--added --rank 2 --admin-token-file %s", j.token);
    CHECK_OK(ps_test_server_start(&j.sv[2], 1, words));
    snprintf(j.ep[2], sizeof j.ep[2], "tcp://127.0.0.1:%d", j.sv[2].port);
    snprintf(j.list, sizeof j.list, "%s,%s", j.ep[0], j.ep[1]);
    char out[2048], args[512];
    /* a server list of another length than the job's first */
    snprintf(args, sizeof args, "--servers %s --admin-token-file %s map", j.ep[0], j.token);
    char log[512];
    snprintf(log, sizeof log, "%s/ps_servers_short.log", ps_test_tmpdir());
    int pid = ps_test_spawn_words("ps_servers", args, log);
    CHECK_EQ_INT(ps_test_wait(pid, 30000), 1);
    CHECK_MSG(ps_test_file_has(log, "--num-servers 2"), "see %s", log);
    snprintf(args, sizeof args, "add %s", j.ep[2]);
    CHECK_EQ_INT(tool(&j, args, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "configuration mismatch") || strstr(out, "configuration differs"), "%s",
              out);
    ps_test_stop(j.sv[2].pid, 5000);
    /* the right settings but the wrong rank */
    CHECK_OK(start(&j, 2, "--added --rank 5"));
    snprintf(args, sizeof args, "add %s", j.ep[2]);
    CHECK_EQ_INT(tool(&j, args, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "server-rank") && strstr(out, "has 5"), "%s", out);
    stop(&j);
}

/* ---- through libps: a sync job whose servers change while it trains ---- */

#include "export_job.h"

#define BIG_ROWS 1000000 /* the table's rows before training */
#define BIG_PULL 250000

/* Pull every row of 0..BIG_ROWS-1 of the table through worker 0 (made at
 * their first pull; read back at the end) into rows (BIG_ROWS x EJ_DIM). */
static int pull_all(ej_job *j, float *rows, int64_t step)
{
    static uint64_t ids[BIG_PULL];
    for (size_t at = 0; at < BIG_ROWS; at += BIG_PULL) {
        for (size_t i = 0; i < BIG_PULL; i++)
            ids[i] = at + i;
        ps_request req;
        if (ps_client_sparse_pull(j->c[0], EJ_TABLE, ids, BIG_PULL, rows + at * EJ_DIM, step,
                                  &req) ||
            ej_wait(&req)) {
            fprintf(stderr, "pull of rows %zu..: %s\n", at, req.err);
            return -1;
        }
    }
    return 0;
}

/* ps_servers on j's servers, started (its pid); the training goes on meanwhile. */
static int tool_start(const ej_job *j, const char *token, const char *words, const char *log)
{
    char args[2048];
    snprintf(args, sizeof args, "--servers %s --admin-token-file %s %s", j->eps, token, words);
    return ps_test_spawn_words("ps_servers", args, log);
}

/* Train 30 steps of 2 sync workers over 2 servers with a table of a million
 * rows; with moves, a third server is added while steps 5..14 run and
 * server 1 removed while steps 15..24 run.  The dense weights and every row
 * at the end, into w and rows. */
static int run_job(int moves, float *w, float *rows, char *why, int len)
{
    ej_job j;
    const char *token = ps_test_token_file("move.token", PS_TEST_ADMIN_TOKEN, 0600);
    char flags[512];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads 2 --shm off "
             "--admin-token-file %s", token);
    if (ej_init(&j, 2, 2, flags, "") || ej_connect(&j)) {
        snprintf(why, (size_t)len, "the job did not start");
        ej_stop(&j);
        return -1;
    }
    int rc = pull_all(&j, rows, 0), pid = 0;
    char log[512];
    for (int t = 0; t < 30 && !rc; t++) {
        if (moves && t == 5) { /* a third server joins while steps 5.. run */
            j.port[2] = ps_test_free_port();
            j.S = 3;
            /* (not ej_server: an added server keeps the job's --num-servers 2) */
            char words[4096];
            snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --rank 2 --num-servers 2 "
                     "--num-workers 2 %s --added", j.port[2], j.flags);
            snprintf(j.log[2], sizeof j.log[2], "%s/added.log", ps_test_tmpdir());
            j.pid[2] = ps_test_spawn_words("ps_server", words, j.log[2]);
            char args[128];
            snprintf(args, sizeof args, "add tcp://127.0.0.1:%d", j.port[2]);
            snprintf(log, sizeof log, "%s/add.log", ps_test_tmpdir());
            pid = tool_start(&j, token, args, log);
        }
        if (moves && t == 15) { /* server 1 leaves while steps 15.. run */
            if (ps_test_wait(pid, 60000) != 0) {
                snprintf(why, (size_t)len, "ps_servers add failed: see %s", log);
                rc = -1;
                break;
            }
            snprintf(log, sizeof log, "%s/remove.log", ps_test_tmpdir());
            pid = tool_start(&j, token, "remove 1", log);
        }
        rc = ej_step(&j, t);
        if (rc)
            snprintf(why, (size_t)len, "step %d failed", t);
    }
    if (!rc && moves && ps_test_wait(pid, 60000) != 0) {
        snprintf(why, (size_t)len, "ps_servers remove failed: see %s", log);
        rc = -1;
    }
    if (!rc && moves && ps_test_wait(j.pid[1], 20000) != 0) { /* it left, and exits */
        snprintf(why, (size_t)len, "the removed server did not exit 0: see %s", j.log[1]);
        rc = -1;
    }
    if (!rc && moves)
        j.pid[1] = 0;
    if (!rc)
        rc = pull_all(&j, rows, 30);
    if (!rc)
        memcpy(w, j.w[0], sizeof j.w[0]);
    if (ej_stop(&j) && !rc) {
        snprintf(why, (size_t)len, "a server did not stop cleanly");
        rc = -1;
    }
    return rc;
}

PS_TEST(sync_rows_and_weights_equal_a_run_without_moves_bitwise)
{
    NEED_SERVER();
    static float w0[EJ_COUNT], w1[EJ_COUNT];
    float *r0 = malloc((size_t)BIG_ROWS * EJ_DIM * sizeof(float));
    float *r1 = malloc((size_t)BIG_ROWS * EJ_DIM * sizeof(float));
    CHECK(r0 && r1);
    char why[1024] = "";
    CHECK_MSG(run_job(0, w0, r0, why, (int)sizeof why) == 0, "%s", why);
    CHECK_MSG(run_job(1, w1, r1, why, (int)sizeof why) == 0, "%s", why);
    CHECK(memcmp(w0, w1, sizeof w0) == 0);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)BIG_ROWS * EJ_DIM; i++)
        diff += memcmp(&r0[i], &r1[i], sizeof(float)) != 0;
    CHECK_MSG(diff == 0, "%zu of %d row values differ", diff, BIG_ROWS * EJ_DIM);
    free(r0);
    free(r1);
}

/* A destination that cannot load (its --max-memory is too small for one
 * chunk): each source loads its objects back and serves them as before,
 * ps_servers says how many moved (none) and why to look at the logs, and
 * the map keeps them where they are; removing that slot then moves nothing. */
PS_TEST(a_move_the_destination_cannot_load_leaves_every_object_where_it_was)
{
    NEED_SERVER();
    enum { BIG = 2048 };
    job j;
    memset(&j, 0, sizeof j);
    j.token = ps_test_token_file("move.token", PS_TEST_ADMIN_TOKEN, 0600);
    CHECK_OK(start(&j, 0, "--rank 0"));
    CHECK_OK(start(&j, 1, "--rank 1"));
    CHECK_OK(start(&j, 2, "--added --rank 2 --max-memory 4096"));
    snprintf(j.list, sizeof j.list, "%s,%s", j.ep[0], j.ep[1]);
    static float w[BIG], g[BIG];
    uint64_t seq = 500;
    ps_header r;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < NCH; c++) {
            CHECK_OK(hello(&j, k));
            for (int i = 0; i < BIG; i++)
                w[i] = (float)(10 * k + c), g[i] = 1;
            ps_header h = ps_test_header(PS_MSG_INIT, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            h.total = NCH * BIG;
            CHECK_OK(ps_test_rpc(j.d[k], &h, w, BIG, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_INIT);
        }
    char out[2048], args[256];
    snprintf(args, sizeof args, "add %s", j.ep[2]);
    CHECK_EQ_INT(tool(&j, args, out, sizeof out), 1);
    CHECK_MSG(strstr(out, "0 of ") && strstr(out, "objects moved"), "%s", out);
    /* every chunk is at home, whole: a push there is taken, the pull says so */
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < NCH; c++) {
            ps_header h = ps_test_header(PS_MSG_PUSH, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            CHECK_OK(ps_test_rpc(j.d[k], &h, g, BIG, &r, NULL, 0, NULL));
            CHECK_MSG(r.type == PS_MSG_PUSH, "push of %d/%d: %d %s", k, c, r.err_code,
                      r.err_text);
            h = ps_test_header(PS_MSG_PULL, 0, ++seq, 7 + (uint64_t)k, (uint32_t)c, 0);
            CHECK_OK(ps_test_rpc(j.d[k], &h, NULL, 0, &r, w, BIG, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_PULL);
            CHECK_MSG(w[0] == (float)(10 * k + c) - 0.5f && w[BIG - 1] == w[0], "%d/%d: %g", k,
                      c, w[0]);
        }
    CHECK_MSG(tool(&j, "map", out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "0 objects away from home"), "%s", out);
    /* the slot it was given holds nothing: removing it moves nothing */
    CHECK_MSG(tool(&j, "remove 2", out, sizeof out) == 0, "%s", out);
    CHECK_MSG(strstr(out, "removed slot 2") && strstr(out, ": 0 objects"), "%s", out);
    CHECK_EQ_INT(ps_test_wait(j.sv[2].pid, 20000), 0);
    j.sv[2].pid = 0;
    stop(&j);
}
