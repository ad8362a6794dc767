/* Export (docs/OPERATIONS.md "Export and serve"): a live sync job's export
 * holds every row and dense value the servers hold, bit for bit, with the
 * optimizer state; an export of the job's checkpoints equals the live one
 * at the same step; ps_server --import on another number of servers (1 ->
 * 3, 3 -> 1, other threads) goes on with the next step exactly as the job
 * that never stopped; the files are what numpy reads. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_job.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_npy.h"
#include "ps_test.h"
#include "ps_table_decl.h"
#include "ps_test_server.h"
#include "table_opt.h"

#define NEED_SERVER()                                                                      \
    do {                                                                                   \
        char bin_[256];                                                                    \
        if (access(ps_test_bin("ps_server", bin_, sizeof bin_), X_OK) != 0)                \
            SKIP("bin/ps_server is not built");                                            \
    } while (0)

static const char *tmp_path(const char *name)
{
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 1024, "%s/%s", ps_test_tmpdir(), name);
    return p;
}

/* Every file of export a equals b's, byte for byte (the data files the
 * manifest names). */
static int same_files(const char *a, const char *b, struct json_object *m)
{
    static const char *const lists[] = {"dense", "tables"};
    static const char *const names[] = {"weights", "ids", "counts", "state0", "state1"};
    int files = 0;
    for (int l = 0; l < 2; l++) {
        struct json_object *arr = ej_get(m, lists[l]);
        size_t na = arr ? json_object_array_length(arr) : 0;
        for (size_t k = 0; k < na; k++)
            for (int f = 0; f < 5; f++) {
                const char *rel = ej_str(json_object_array_get_idx(arr, k), names[f]);
                if (!rel)
                    continue;
                char pa[1024], pb[1024];
                snprintf(pa, sizeof pa, "%s/%s", a, rel);
                snprintf(pb, sizeof pb, "%s/%s", b, rel);
                size_t la, lb;
                char *da = ps_test_read_file(pa, &la), *db = ps_test_read_file(pb, &lb);
                int same = da && db && la == lb && !memcmp(da, db, la);
                free(da);
                free(db);
                if (!same) {
                    fprintf(stderr, "%s and %s differ\n", pa, pb);
                    return 0;
                }
                files++;
            }
    }
    return files;
}

/* ---------- a live sync job's export ---------- */

PS_TEST(live_sync_export_is_the_servers_state)
{
    NEED_SERVER();
    ej_job j;
    CHECK_OK(ej_init(&j, 2, 2, "--mode sync --optimizer adam --lr 0.01 --threads 2", ""));
    CHECK_OK(ej_connect(&j));
    const int T = 5;
    CHECK_OK(ej_steps(&j, 0, T));
    ps_client *rd = ej_reader(&j, NULL);
    CHECK(rd != NULL);
    const char *dir = tmp_path("export-live");
    CHECK_MSG(ps_client_export(rd, dir, PS_EXPORT_STATE, -1, NULL, NULL, 0, -1) == 0, "%s",
              ps_client_last_error(rd));
    struct json_object *m = ej_manifest(dir);
    CHECK(m != NULL);
    CHECK_EQ_INT(ej_int(m, "step", -1), T);
    CHECK_STR(ej_str(m, "mode"), "sync");
    const char *cons = ej_str(m, "consistency");
    CHECK(cons && strstr(cons, "one round"));
    /* the dense tensor: worker 0's weights at version T, and the servers'
     * adam state */
    struct json_object *d = ej_entry(m, "dense", EJ_KEY);
    CHECK(d != NULL);
    ps_npy_in dw, ds0, ds1;
    CHECK_OK(ej_npy(dir, ej_str(d, "weights"), &dw));
    CHECK(dw.dtype == PS_NPY_F4 && dw.rows == EJ_COUNT && dw.ndim == 1);
    CHECK(!memcmp(dw.data, j.w[0], sizeof j.w[0]));
    static float st[2 * EJ_COUNT];
    ps_request req;
    CHECK_OK(ps_client_state(j.c[0], EJ_KEY, st, 2, &req));
    CHECK_OK(ej_wait(&req));
    CHECK_OK(ej_npy(dir, ej_str(d, "state0"), &ds0));
    CHECK_OK(ej_npy(dir, ej_str(d, "state1"), &ds1));
    /* STATE gives each chunk's arrays one after the other, chunk by chunk */
    size_t at = 0;
    for (size_t c0 = 0; c0 < EJ_COUNT; c0 += 256) {
        size_t n = EJ_COUNT - c0 < 256 ? EJ_COUNT - c0 : 256;
        CHECK(!memcmp((const float *)ds0.data + c0, st + at, n * 4));
        CHECK(!memcmp((const float *)ds1.data + c0, st + at + n, n * 4));
        at += 2 * n;
    }
    /* the table: every row made (the batches of steps 0 .. T, the last one
     * pulled), ids sorted, each as the servers have it at version T */
    struct json_object *t = ej_entry(m, "tables", EJ_TABLE);
    CHECK(t != NULL);
    ps_npy_in ids, w, s0, cn;
    CHECK_OK(ej_npy(dir, ej_str(t, "ids"), &ids));
    CHECK_OK(ej_npy(dir, ej_str(t, "weights"), &w));
    CHECK_OK(ej_npy(dir, ej_str(t, "state0"), &s0));
    CHECK_OK(ej_npy(dir, ej_str(t, "counts"), &cn));
    static uint8_t seen[EJ_IDS];
    memset(seen, 0, sizeof seen);
    for (int s = 0; s <= T; s++)
        for (int r = 0; r < j.W; r++) {
            uint64_t b[EJ_BATCH + 8];
            size_t n = ej_batch(r, s, b);
            for (size_t i = 0; i < n; i++)
                seen[b[i]] = 1;
        }
    size_t want = 0;
    for (int i = 0; i < EJ_IDS; i++)
        want += seen[i];
    CHECK_EQ_INT(ids.rows, want);
    CHECK(w.rows == want && w.cols == EJ_DIM && s0.rows == want && cn.rows == want);
    const uint64_t *iv = ids.data;
    for (size_t i = 0; i < ids.rows; i++) {
        CHECK(iv[i] < EJ_IDS && seen[iv[i]]);
        CHECK(i == 0 || iv[i] > iv[i - 1]);
    }
    float *rows = malloc(want * EJ_DIM * sizeof *rows);
    CHECK_OK(ps_client_sparse_pull(j.c[0], EJ_TABLE, iv, want, rows, T, &req));
    CHECK_OK(ej_wait(&req));
    CHECK(!memcmp(rows, w.data, want * EJ_DIM * sizeof *rows));
    /* adagrad's sums: a row pushed has a positive sum, a row only pulled 0 */
    const float *sv = s0.data;
    int pushed_any = 0;
    for (size_t i = 0; i < want * EJ_DIM; i++) {
        CHECK(sv[i] >= 0);
        pushed_any |= sv[i] > 0;
    }
    CHECK(pushed_any);
    free(rows);
    ps_npy_close_in(&dw);
    ps_npy_close_in(&ds0);
    ps_npy_close_in(&ds1);
    ps_npy_close_in(&ids);
    ps_npy_close_in(&w);
    ps_npy_close_in(&s0);
    ps_npy_close_in(&cn);
    /* an export goes to a new folder */
    CHECK_EQ_INT(ps_client_export(rd, dir, 0, -1, NULL, NULL, 0, -1), PS_EINVAL);
    CHECK(strstr(ps_client_last_error(rd), "not an empty folder"));
    json_object_put(m);
    ps_client_close(rd);
    CHECK_OK(ej_stop(&j));
}

/* ---------- from checkpoints, no server running ---------- */

/* Rows of ids 0 .. EJ_IDS-1 as reader c looks them up (no row is made). */
static float *lookup_all(ps_client *c, int64_t *version)
{
    uint64_t *ids = malloc(EJ_IDS * sizeof *ids);
    float *rows = malloc((size_t)EJ_IDS * EJ_DIM * sizeof *rows);
    for (int i = 0; i < EJ_IDS; i++)
        ids[i] = (uint64_t)i;
    uint64_t key = EJ_TABLE;
    size_t n = EJ_IDS;
    const uint64_t *idp[1] = {ids};
    float *rp[1] = {rows};
    ps_request req;
    if (ps_client_lookup(c, 1, &key, idp, &n, rp, &req) || ej_wait(&req)) {
        fprintf(stderr, "lookup: %s\n", req.err);
        free(rows);
        rows = NULL;
    }
    *version = req.version;
    free(ids);
    return rows;
}

PS_TEST(checkpoint_export_equals_live_export)
{
    NEED_SERVER();
    ej_job j;
    const char *ck = tmp_path("export-ckpt");
    char more[1200];
    snprintf(more, sizeof more, "--checkpoint-dir %s --checkpoint-every 2", ck);
    CHECK_OK(ej_init(&j, 2, 1, "--mode sync --optimizer momentum --lr 0.05 --threads 2", more));
    CHECK_OK(ej_connect(&j));
    CHECK_OK(ej_steps(&j, 0, 6));
    ps_client *rd = ej_reader(&j, NULL);
    CHECK(rd != NULL);
    const char *live = tmp_path("export-ckpt-live");
    CHECK_MSG(ps_client_export(rd, live, PS_EXPORT_STATE, -1, NULL, NULL, 0, -1) == 0, "%s",
              ps_client_last_error(rd));
    int64_t vl;
    float *rl = lookup_all(rd, &vl);
    CHECK(rl != NULL);
    ps_client_close(rd);
    /* a clean stop writes the last checkpoint: the same state */
    CHECK_OK(ej_stop(&j));
    const char *off = tmp_path("export-ckpt-off");
    char args[2400], log[1024];
    snprintf(args, sizeof args, "--checkpoint-dir %s --out %s", ck, off);
    snprintf(log, sizeof log, "%s/ps_export-ckpt.log", ps_test_tmpdir());
    int pid = ps_test_spawn_words("ps_export", args, log);
    CHECK(pid > 0);
    CHECK_MSG(ps_test_wait(pid, 30000) == 0, "ps_export failed: see %s", log);
    struct json_object *a = ej_manifest(live), *b = ej_manifest(off);
    CHECK(a != NULL && b != NULL);
    CHECK_EQ_INT(ej_int(a, "step", -1), 6);
    CHECK_EQ_INT(ej_int(b, "step", -1), 6);
    CHECK_STR(ej_str(b, "source"), "checkpoint");
    CHECK(same_files(live, off, a) >= 6); /* weights and 1 state + ids, counts, ... */
    json_object_put(a);
    json_object_put(b);

    /* the checkpoints of 2 servers (2 threads, 2 workers) go into 1 server
     * (1 thread) of a job of 1 worker: its rows are the live job's, at its
     * step, and that one worker's push makes the next round */
    ej_job n;
    char imp[1200];
    snprintf(imp, sizeof imp, "--import %s", off);
    CHECK_OK(ej_init(&n, 1, 1, "--mode sync --optimizer momentum --lr 0.05", imp));
    n.topt = j.topt;
    CHECK_OK(ej_connect(&n));
    ps_client *rn = ej_reader(&n, NULL);
    CHECK(rn != NULL);
    int64_t vn;
    float *rows = lookup_all(rn, &vn);
    CHECK(rows != NULL);
    CHECK_EQ_INT(vn, vl);
    CHECK_MSG(!memcmp(rows, rl, (size_t)EJ_IDS * EJ_DIM * sizeof(float)),
              "the imported rows differ from the live job's");
    free(rows);
    static uint64_t ids[EJ_BATCH + 8], next[EJ_BATCH + 8];
    static float g[(EJ_BATCH + 8) * EJ_DIM], got[(EJ_BATCH + 8) * EJ_DIM];
    size_t cnt = ej_batch(0, 6, ids), nn = ej_batch(0, 7, next);
    for (size_t i = 0; i < cnt * EJ_DIM; i++)
        g[i] = 0.5f;
    ps_request req;
    CHECK_OK(ps_client_sparse_pushpull(n.c[0], EJ_TABLE, ids, cnt, g, next, nn, got, 6, &req));
    CHECK_MSG(ej_wait(&req) == 0, "%s", req.err);
    rows = lookup_all(rn, &vn);
    CHECK(rows != NULL);
    CHECK_EQ_INT(vn, 7);
    int moved = 0;
    for (int i = 0; i < EJ_IDS; i++) {
        int in = 0;
        for (size_t k = 0; k < cnt; k++)
            in |= ids[k] == (uint64_t)i;
        int same = !memcmp(rows + i * EJ_DIM, rl + i * EJ_DIM, EJ_DIM * sizeof(float));
        CHECK_MSG(in ? !same : same, "id %d: %s", i, in ? "not updated" : "updated");
        moved += !same;
    }
    CHECK(moved > 0);
    free(rows);
    free(rl);
    ps_client_close(rn);
    CHECK_OK(ej_stop(&n));
}

/* ---------- warm start on another number of servers ---------- */

/* The table's optimizer state as an export holds it: each state array one
 * float a row, (rows,), for row-wise adagrad (its sums of mean squared
 * gradients: >= 0, some > 0), else (rows, dim); the manifest names the
 * kind and the floats a row. */
static void check_state(const char *dir, struct json_object *t, int kind)
{
    ps_npy_in ids, st;
    CHECK_OK(ej_npy(dir, ej_str(t, "ids"), &ids));
    CHECK_STR(ej_str(ej_get(t, "optimizer"), "kind"), ps_table_opt_name(kind));
    int nstate = ps_table_state_arrays(kind), row_wise = kind == PS_TABLE_OPT_ROWWISE_ADAGRAD;
    CHECK_EQ_INT(ej_int(t, "state_cols", -1), row_wise ? 1 : EJ_DIM);
    struct json_object *files = ej_get(t, "state");
    CHECK(files && json_object_array_length(files) == (size_t)nstate);
    for (int k = 0; k < nstate; k++) {
        char what[24]; /* "state" and an int: room the sanitized build sees */
        snprintf(what, sizeof what, "state%d", k);
        CHECK_OK(ej_npy(dir, ej_str(t, what), &st));
        CHECK(st.dtype == PS_NPY_F4 && st.rows == ids.rows);
        CHECK_MSG(row_wise ? st.ndim == 1 : st.ndim == 2 && st.cols == EJ_DIM,
                  "%s: %d dimensions, %llu columns", what, st.ndim, (unsigned long long)st.cols);
        if (row_wise) {
            const float *v = st.data;
            int some = 0;
            for (uint64_t i = 0; i < st.rows; i++) {
                CHECK(v[i] >= 0);
                some |= v[i] > 0;
            }
            CHECK(some);
        }
        ps_npy_close_in(&st);
    }
    ps_npy_close_in(&ids);
}

/* A warm start: a job of S servers (T threads) trains K steps and exports
 * with its state; it trains one more step.  A new job of S2 servers (T2
 * threads, `more_b` after --import) imports the export; its workers take
 * the table's step from the servers and push the same step: the rows equal
 * the first job's.  With tname the first job's workers name the table so:
 * the manifest says it (escaped), and the second job, whose workers give
 * no name, exports it under that name (its servers took it from the
 * import). */
typedef struct warm {
    int S, T, S2, T2;
    const char *name;   /* the export's folder */
    int kind;           /* the table's optimizer; 0: ej_init's (adagrad) */
    const char *tname;  /* NULL: no name */
    const char *more_b; /* "" or the second job's servers' flags */
} warm;

static void warm_start(const warm *o)
{
    const int K = 4;
    ej_job a, b;
    char flags[256];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads %d", o->T);
    CHECK_OK(ej_init(&a, o->S, 2, flags, ""));
    if (o->kind)
        a.topt.opt.kind = o->kind;
    a.topt.opt.lr_decay = 0.5f; /* the step matters: the rate halves every 2 updates */
    a.topt.opt.lr_decay_every = 2;
    if (o->tname)
        snprintf(a.tname, sizeof a.tname, "%s", o->tname);
    CHECK_OK(ej_connect(&a));
    CHECK_OK(ej_steps(&a, 0, K));
    ps_client *rd = ej_reader(&a, NULL);
    CHECK(rd != NULL);
    const char *dir = tmp_path(o->name);
    CHECK_MSG(ps_client_export(rd, dir, PS_EXPORT_STATE, -1, NULL, NULL, 0, -1) == 0, "%s",
              ps_client_last_error(rd));
    struct json_object *m = ej_manifest(dir), *t = ej_entry(m, "tables", EJ_TABLE);
    CHECK(t != NULL);
    check_state(dir, t, ps_table_decl_kind(&a.topt));
    if (o->tname) {
        CHECK_STR(ej_str(t, "name"), o->tname); /* json-c reads back what was escaped */
    } else {
        struct json_object *nm = NULL; /* null: json-c's NULL, the member there */
        CHECK(json_object_object_get_ex(t, "name", &nm) && nm == NULL);
    }
    json_object_put(m);
    CHECK_OK(ej_step(&a, K));
    int64_t va;
    float *ra = lookup_all(rd, &va);
    CHECK(ra != NULL);
    ps_client_close(rd);
    CHECK_OK(ej_stop(&a));

    char flags2[256], more[1400];
    snprintf(flags2, sizeof flags2, "--mode sync --optimizer sgd --lr 0.1 --threads %d", o->T2);
    snprintf(more, sizeof more, "--import %s %s", dir, o->more_b ? o->more_b : "");
    CHECK_OK(ej_init(&b, o->S2, 2, flags2, more));
    b.topt = a.topt;
    CHECK_OK(ej_connect(&b));
    /* the table goes on at the export's step (a restarted worker asks) */
    ps_request req;
    CHECK_OK(ps_client_clock(b.c[0], EJ_TABLE, &req));
    CHECK_OK(ej_wait(&req));
    CHECK_EQ_INT(req.version, K);
    /* the dense tensor is the model's: its workers start from the export's
     * weights (ps.torch's tables_from=); here from a's step K weights */
    /* step K of the table alone, as job a's */
    static uint64_t ids[EJ_MAX][EJ_BATCH + 8], next[EJ_MAX][EJ_BATCH + 8];
    static float g[EJ_MAX][(EJ_BATCH + 8) * EJ_DIM], rows[EJ_MAX][(EJ_BATCH + 8) * EJ_DIM];
    ps_request sreq[EJ_MAX];
    for (int r = 0; r < b.W; r++) {
        size_t n = ej_batch(r, K, ids[r]), nn = ej_batch(r, K + 1, next[r]);
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < EJ_DIM; k++)
                g[r][i * EJ_DIM + k] = ej_grad(r, ids[r][i], K, k);
        CHECK_OK(ps_client_sparse_pushpull(b.c[r], EJ_TABLE, ids[r], n, g[r], next[r], nn,
                                           rows[r], K, &sreq[r]));
    }
    for (int r = 0; r < b.W; r++)
        CHECK_MSG(ej_wait(&sreq[r]) == 0, "%s", sreq[r].err);
    ps_client *rb_ = ej_reader(&b, NULL);
    CHECK(rb_ != NULL);
    int64_t vb;
    float *rbv = lookup_all(rb_, &vb);
    CHECK(rbv != NULL);
    CHECK_EQ_INT(vb, va);
    CHECK_MSG(!memcmp(ra, rbv, (size_t)EJ_IDS * EJ_DIM * sizeof(float)),
              "the rows after the step differ from the job that never stopped");
    if (o->tname) { /* the import's name, in the next export */
        char dir2[1100];
        snprintf(dir2, sizeof dir2, "%s-again", dir);
        CHECK_MSG(ps_client_export(rb_, dir2, 0, -1, NULL, NULL, 0, -1) == 0, "%s",
                  ps_client_last_error(rb_));
        struct json_object *m2 = ej_manifest(dir2);
        CHECK_STR(ej_str(ej_entry(m2, "tables", EJ_TABLE), "name"), o->tname);
        json_object_put(m2);
    }
    free(ra);
    free(rbv);
    ps_client_close(rb_);
    CHECK_OK(ej_stop(&b));
}

PS_TEST(warm_start_1_to_3_servers_goes_on_exactly)
{
    NEED_SERVER();
    warm_start(&(warm){1, 2, 3, 1, "export-warm-1-3", 0, NULL, NULL});
}

PS_TEST(warm_start_3_to_1_server_goes_on_exactly)
{
    NEED_SERVER();
    warm_start(&(warm){3, 1, 1, 3, "export-warm-3-1", 0, NULL, NULL});
}

/* Row-wise adagrad (table kind 10): its one state float a row leaves as
 * (rows,) and comes back, so the step after the warm start is the one the
 * job that never stopped took.  The table's name, with a quote and a
 * backslash, is in the manifest as JSON has them and survives the import.
 * The imported rows are no worker's (a restore charges nobody): with a
 * share below their values alone (--table-memory-per-worker 8192) each
 * worker's own new rows of the next step are still made. */
PS_TEST(warm_start_of_a_rowwise_adagrad_table_keeps_its_state_and_name)
{
    NEED_SERVER();
    const char *tname = "emb \"q\" \\ back";
    warm_start(&(warm){2, 1, 1, 2, "export-warm-rowwise", PS_TABLE_OPT_ROWWISE_ADAGRAD, tname,
                       "--table-memory-per-worker 8192"});
    /* the manifest's text: the name escaped as JSON wants it */
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.json", tmp_path("export-warm-rowwise"));
    CHECK(ps_test_file_has(path, "\"name\": \"emb \\\"q\\\" \\\\ back\""));
    CHECK(ps_test_file_has(path, "\"kind\": \"rowwise_adagrad\""));
    struct json_object *m = ej_manifest(tmp_path("export-warm-rowwise"));
    CHECK(ej_int(ej_entry(m, "tables", EJ_TABLE), "rows", 0) * (EJ_DIM + 1) * 4 > 8192);
    json_object_put(m);
}

/* An export without the optimizer state cannot keep it: --import-state
 * keep is refused (naming what to do), reset starts the tables at step 0. */
PS_TEST(import_without_state_needs_reset)
{
    NEED_SERVER();
    ej_job a;
    CHECK_OK(ej_init(&a, 1, 1, "--mode sync --optimizer sgd --lr 0.1", ""));
    CHECK_OK(ej_connect(&a));
    CHECK_OK(ej_steps(&a, 0, 2));
    ps_client *rd = ej_reader(&a, NULL);
    CHECK(rd != NULL);
    const char *dir = tmp_path("export-nostate");
    CHECK_OK(ps_client_export(rd, dir, 0, -1, NULL, NULL, 0, -1));
    ps_client_close(rd);
    CHECK_OK(ej_stop(&a));
    char words[1600], log[1024];
    snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --num-workers 1 --import %s",
             ps_test_free_port(), dir);
    snprintf(log, sizeof log, "%s/import-keep.log", ps_test_tmpdir());
    int pid = ps_test_spawn_words("ps_server", words, log);
    CHECK(pid > 0);
    CHECK(ps_test_wait(pid, 10000) > 0);
    CHECK(ps_test_file_has(log, "--import-state reset"));
    ej_job b;
    char more[1200];
    snprintf(more, sizeof more, "--import %s --import-state reset", dir);
    CHECK_OK(ej_init(&b, 1, 1, "--mode sync --optimizer sgd --lr 0.1", more));
    b.topt = a.topt;
    CHECK_OK(ej_connect(&b));
    ps_request req;
    CHECK_OK(ps_client_clock(b.c[0], EJ_TABLE, &req));
    CHECK_OK(ej_wait(&req));
    CHECK_EQ_INT(req.version, 0);
    CHECK_OK(ej_stop(&b));
}
