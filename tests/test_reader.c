/* Readers (include/ps_client.h PS_RANK_READER, docs/OPERATIONS.md "Export
 * and serve"): a client of rank -1 that reads while workers train.  It is
 * refused any push, by libps and by the servers; it is counted in no sync
 * round; what it looks up is the servers' rows at most one step behind the
 * workers, read-only (no row made, no filter sighting counted); one request
 * reads several tables; under CURVE a reader key can do nothing but read. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "export_job.h"
#include "ps_client.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define NEED_SERVER()                                                                      \
    do {                                                                                   \
        char bin_[256];                                                                    \
        if (access(ps_test_bin("ps_server", bin_, sizeof bin_), X_OK) != 0)                \
            SKIP("bin/ps_server is not built");                                            \
    } while (0)

/* Look ids[0..n) of the table up through c; the request's version. */
static int lookup(ps_client *c, const uint64_t *ids, size_t n, float *rows, int64_t *version)
{
    uint64_t key = EJ_TABLE;
    const uint64_t *idp[1] = {ids};
    float *rp[1] = {rows};
    ps_request req;
    int rc = ps_client_lookup(c, 1, &key, idp, &n, rp, &req);
    if (!rc)
        rc = ej_wait(&req);
    if (rc)
        fprintf(stderr, "lookup: %s\n", req.err);
    *version = req.version;
    return rc;
}

PS_TEST(a_reader_is_refused_every_push)
{
    NEED_SERVER();
    ej_job j;
    CHECK_OK(ej_init(&j, 1, 1, "--mode sync --optimizer sgd --threads 2", ""));
    CHECK_OK(ej_connect(&j));
    ps_client *rd = ej_reader(&j, NULL);
    CHECK(rd != NULL);
    float g[EJ_COUNT] = {0}, w[EJ_COUNT];
    uint64_t ids[2] = {1, 2};
    float rows[2 * EJ_DIM] = {0};
    ps_request req;
    /* libps says no, naming what a reader does */
    CHECK_EQ_INT(ps_client_push(rd, EJ_KEY, g, 0, &req), PS_ESTATE);
    CHECK_MSG(strstr(req.err, "reader") && strstr(req.err, "push"), "%s", req.err);
    CHECK_EQ_INT(ps_client_init(rd, EJ_KEY, g, &req), PS_ESTATE);
    CHECK_EQ_INT(ps_client_pushpull(rd, EJ_KEY, g, w, 0, &req), PS_ESTATE);
    CHECK_EQ_INT(ps_client_sparse_push(rd, EJ_TABLE, ids, 2, rows, 0, &req), PS_ESTATE);
    CHECK_MSG(strstr(req.err, "spush"), "%s", req.err);
    /* a table's pull makes rows: a reader looks them up instead */
    CHECK_EQ_INT(ps_client_sparse_pull(rd, EJ_TABLE, ids, 2, rows, 0, &req), PS_ESTATE);
    CHECK_EQ_INT(ps_client_assign(rd, EJ_KEY, g, &req), PS_ESTATE);
    CHECK_EQ_INT(ps_client_barrier(rd, 1), PS_ESTATE);
    CHECK(strstr(ps_client_last_error(rd), "counted in no round or barrier"));
    CHECK_EQ_INT(ps_client_leave(rd), PS_ESTATE);
    /* and so do the servers, to rank -1 on the wire */
    void *raw = ps_test_dealer(j.port[0]);
    ps_header h = ps_test_header(PS_MSG_SPUSH, -1, 5, EJ_TABLE, 0, 0), r;
    h.dim = EJ_DIM;
    h.count = 1;
    h.dtype = PS_DTYPE_F32;
    const void *fr[2] = {ids, rows};
    size_t b[2] = {8, 4 * EJ_DIM};
    CHECK_OK(ps_test_send_frames(raw, &h, fr, b, 2));
    CHECK_OK(ps_test_recv(raw, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK(r.type == PS_MSG_ERROR && r.err_code == PS_ESTATE &&
          strstr(r.err_text, "needs a worker rank"));
    h = ps_test_header(PS_MSG_PUSH, -1, 6, EJ_KEY, 0, 0);
    CHECK_OK(ps_test_rpc(raw, &h, g, 4, &r, NULL, 0, NULL));
    CHECK(r.type == PS_MSG_ERROR && r.err_code == PS_ESTATE);
    zmq_close(raw);
    /* nothing moved: the worker's first step finds the initial weights */
    ps_client_close(rd);
    CHECK_OK(ej_steps(&j, 0, 1));
    CHECK_OK(ej_stop(&j));
}

/* Two sync workers train while a reader reads between and during their
 * steps: every round completes with the two (a reader counted would hold
 * it), what it reads is never older than the workers' last complete step
 * and equals what a worker pulled at that version, and it makes nothing. */
PS_TEST(a_reader_is_not_counted_and_reads_at_most_one_step_behind)
{
    NEED_SERVER();
    ej_job j;
    CHECK_OK(ej_init(&j, 2, 2, "--mode sync --optimizer sgd --lr 0.1 --threads 2", ""));
    CHECK_OK(ej_connect(&j));
    ps_client *rd = ej_reader(&j, NULL);
    CHECK(rd != NULL);
    ps_stats st0, st1;
    const int T = 6;
    for (int t = 0; t < T; t++) {
        CHECK_OK(ej_step(&j, t));
        /* worker 0's next batch, as it pulled it at version t + 1 */
        uint64_t ids[EJ_BATCH + 8];
        size_t n = ej_batch(0, t + 1, ids);
        static float mine[(EJ_BATCH + 8) * EJ_DIM], rows[(EJ_BATCH + 8) * EJ_DIM];
        ps_request req;
        CHECK_OK(ps_client_sparse_pull(j.c[0], EJ_TABLE, ids, n, mine, t + 1, &req));
        CHECK_OK(ej_wait(&req));
        int64_t v;
        CHECK_OK(lookup(rd, ids, n, rows, &v));
        CHECK_MSG(v >= t + 1, "step %d done, the reader read version %lld", t, (long long)v);
        CHECK(!memcmp(rows, mine, n * EJ_DIM * sizeof(float)));
        /* the dense weights too: a reader's pull of any version */
        static float w[EJ_COUNT];
        CHECK_OK(ps_client_pull(rd, EJ_KEY, w, 0, &req));
        CHECK_OK(ej_wait(&req));
        CHECK(req.version >= t + 1);
        CHECK(!memcmp(w, j.w[0], sizeof w));
    }
    /* ids never touched read as their initializer, and are not made */
    CHECK_OK(ps_test_stats(j.port[0], &st0));
    uint64_t fresh[3] = {EJ_IDS + 1, EJ_IDS + 77, 1ull << 60};
    float rows[3 * EJ_DIM], want[EJ_DIM];
    int64_t v;
    CHECK_OK(lookup(rd, fresh, 3, rows, &v));
    for (int i = 0; i < 3; i++) {
        ps_table_init_row(j.topt.seed, EJ_TABLE, fresh[i], j.topt.init, j.topt.init_scale, EJ_DIM,
                          want);
        CHECK(!memcmp(rows + i * EJ_DIM, want, sizeof want));
    }
    CHECK_OK(ps_test_stats(j.port[0], &st1));
    CHECK_EQ_INT(st1.rows, st0.rows);
    /* a round waits only for the workers */
    CHECK_OK(ej_steps(&j, T, T + 2));
    ps_client_close(rd);
    CHECK_OK(ej_stop(&j));
}

/* One request reads several tables; each row is where the caller said; a
 * table the servers do not have is named. */
PS_TEST(one_lookup_reads_several_tables)
{
    NEED_SERVER();
    ej_job j;
    CHECK_OK(ej_init(&j, 2, 1, "--mode async --optimizer sgd --threads 3", ""));
    ps_table_options o2 = j.topt;
    o2.dim = 3;
    o2.seed = 5;
    o2.init = PS_TABLE_INIT_NORMAL;
    ps_client_options wo;
    ej_options(&j, &wo, 0);
    CHECK_OK(ps_client_open(&wo, &j.c[0]));
    CHECK_OK(ps_client_register_table(j.c[0], EJ_TABLE, &j.topt));
    CHECK_OK(ps_client_register_table(j.c[0], 8, &o2));
    CHECK_MSG(ps_client_start(j.c[0]) == 0, "%s", ps_client_last_error(j.c[0]));
    ps_client *rd;
    ps_client_options ro;
    ej_options(&j, &ro, PS_RANK_READER);
    CHECK_OK(ps_client_open(&ro, &rd));
    CHECK_OK(ps_client_register_table(rd, EJ_TABLE, &j.topt));
    CHECK_OK(ps_client_register_table(rd, 8, &o2));
    CHECK_OK(ps_client_register_table(rd, 9, &o2));
    CHECK_OK(ps_client_start(rd));
    uint64_t keys[2] = {EJ_TABLE, 8}, a[5] = {1, 2, 3, 2, 900}, bids[2] = {4, 4};
    const uint64_t *ids[2] = {a, bids};
    size_t n[2] = {5, 2};
    float ra[5 * EJ_DIM], rb[2 * 3];
    float *rows[2] = {ra, rb};
    ps_request req;
    CHECK_OK(ps_client_lookup(rd, 2, keys, ids, n, rows, &req));
    CHECK_MSG(ej_wait(&req) == 0, "%s", req.err);
    float want[EJ_DIM];
    for (int i = 0; i < 5; i++) {
        ps_table_init_row(j.topt.seed, EJ_TABLE, a[i], j.topt.init, j.topt.init_scale, EJ_DIM,
                          want);
        CHECK(!memcmp(ra + i * EJ_DIM, want, sizeof want));
    }
    for (int i = 0; i < 2; i++) {
        ps_table_init_row(o2.seed, 8, 4, o2.init, o2.init_scale, 3, want);
        CHECK(!memcmp(rb + i * 3, want, 3 * sizeof(float)));
    }
    /* table 9: this reader's, not the servers' */
    uint64_t k9[2] = {8, 9};
    CHECK_OK(ps_client_lookup(rd, 2, k9, ids, n, rows, &req));
    CHECK_EQ_INT(ej_wait(&req), PS_ENOTFOUND);
    CHECK_MSG(strstr(req.err, "table 9 is not declared"), "%s", req.err);
    /* a table this reader did not register: said before anything is sent */
    uint64_t k10 = 10;
    CHECK_EQ_INT(ps_client_lookup(rd, 1, &k10, ids, n, rows, &req), PS_ENOTFOUND);
    CHECK_MSG(strstr(req.err, "table 10 was not registered"), "%s", req.err);
    ps_client_close(rd);
    CHECK_OK(ej_stop(&j));
}

/* ---------- CURVE: a reader key reads, and does nothing else ---------- */

static int copy_file(const char *from, const char *to)
{
    size_t len;
    char *d = ps_test_read_file(from, &len);
    FILE *f = d ? fopen(to, "w") : NULL;
    int ok = f && fwrite(d, 1, len, f) == len;
    if (f)
        fclose(f);
    free(d);
    chmod(to, 0600);
    return ok ? 0 : -1;
}

PS_TEST(a_reader_key_can_only_read)
{
    NEED_SERVER();
    char why[512];
    if (ps_curve_available(why, sizeof why))
        SKIP("%s", why);
    char keys[1024], rk[1024], rdir[1024], path[2048], path2[2048];
    snprintf(keys, sizeof keys, "%s/rkeys", ps_test_tmpdir());
    snprintf(rk, sizeof rk, "%s/rkeys-reader", ps_test_tmpdir());
    snprintf(rdir, sizeof rdir, "%s/rkeys-readerhost", ps_test_tmpdir());
    CHECK_OK(ps_curve_keygen(keys, 1, 1, 0, why, sizeof why));
    CHECK_OK(ps_curve_keygen(rk, 1, 1, 0, why, sizeof why));
    /* the servers accept rk's key as a reader's */
    snprintf(path, sizeof path, "%s/reader", keys);
    CHECK_OK(mkdir(path, 0755));
    snprintf(path, sizeof path, "%s/worker-0.pub", rk);
    snprintf(path2, sizeof path2, "%s/reader/inference.pub", keys);
    CHECK_OK(copy_file(path, path2));
    /* the reader's host: the server's public key, its own pair as reader.*;
     * and the same pair as a worker's, to try */
    CHECK_OK(mkdir(rdir, 0755));
    snprintf(path, sizeof path, "%s/server-0.pub", keys);
    snprintf(path2, sizeof path2, "%s/server-0.pub", rdir);
    CHECK_OK(copy_file(path, path2));
    static const char *const ends[2] = {"pub", "key"};
    for (int e = 0; e < 2; e++) {
        snprintf(path, sizeof path, "%s/worker-0.%s", rk, ends[e]);
        snprintf(path2, sizeof path2, "%s/reader.%s", rdir, ends[e]);
        CHECK_OK(copy_file(path, path2));
        snprintf(path2, sizeof path2, "%s/worker-0.%s", rdir, ends[e]);
        CHECK_OK(copy_file(path, path2));
    }
    ej_job j;
    char flags[2600];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --curve-keys %s "
             "--admin-token-file %s", keys, ps_test_token_file("rtoken", PS_TEST_ADMIN_TOKEN, 0600));
    CHECK_OK(ej_init(&j, 1, 1, flags, ""));
    /* the real worker */
    ps_client_options o;
    ej_options(&j, &o, 0);
    o.curve_dir = keys;
    CHECK_OK(ps_client_open(&o, &j.c[0]));
    CHECK_OK(ps_client_register(j.c[0], EJ_KEY, EJ_COUNT));
    CHECK_OK(ps_client_register_table(j.c[0], EJ_TABLE, &j.topt));
    CHECK_MSG(ps_client_start(j.c[0]) == 0, "%s", ps_client_last_error(j.c[0]));
    ps_request req;
    for (int i = 0; i < EJ_COUNT; i++)
        j.w[0][i] = 0.5f;
    CHECK_OK(ps_client_init(j.c[0], EJ_KEY, j.w[0], &req));
    CHECK_OK(ej_wait(&req));
    CHECK_OK(ej_steps(&j, 0, 2));
    /* the reader key reads */
    ps_client *rd = ej_reader(&j, rdir);
    CHECK(rd != NULL);
    uint64_t ids[3] = {1, 2, 3};
    float rows[3 * EJ_DIM];
    int64_t v;
    CHECK_OK(lookup(rd, ids, 3, rows, &v));
    CHECK_EQ_INT(v, 2);
    static float w[EJ_COUNT];
    CHECK_OK(ps_client_pull(rd, EJ_KEY, w, 0, &req));
    CHECK_OK(ej_wait(&req));
    CHECK(!memcmp(w, j.w[0], sizeof w));
    /* a stats request is a read too */
    ps_stats st;
    CHECK_OK(ps_client_stats(rd, 0, &st));
    /* not even with the admin token does it stop a server */
    ps_client_close(rd);
    ps_client_options ao;
    ej_options(&j, &ao, PS_RANK_READER);
    ao.curve_dir = rdir;
    ao.admin_token = PS_TEST_ADMIN_TOKEN;
    CHECK_OK(ps_client_open(&ao, &rd));
    CHECK_OK(ps_client_start(rd));
    CHECK_EQ_INT(ps_client_shutdown_servers(rd), PS_EAUTH);
    CHECK_MSG(strstr(ps_client_last_error(rd), "reader/inference is a reader key"), "%s",
              ps_client_last_error(rd));
    ps_client_close(rd);
    /* as a worker (the same key pair as worker-0): its hello is refused */
    ps_client *bad;
    ps_client_options bo;
    ej_options(&j, &bo, 0);
    bo.curve_dir = rdir;
    bo.hello_timeout_ms = 3000;
    CHECK_OK(ps_client_open(&bo, &bad));
    CHECK_OK(ps_client_register(bad, EJ_KEY, EJ_COUNT));
    CHECK(ps_client_start(bad) != 0);
    CHECK_MSG(strstr(ps_client_last_error(bad), "reader key"), "%s", ps_client_last_error(bad));
    ps_client_close(bad);
    /* the job goes on */
    CHECK_OK(ej_steps(&j, 2, 3));
    CHECK_OK(ej_stop(&j));
}
