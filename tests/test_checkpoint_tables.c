/* Tables in checkpoints: a server killed mid-run and restarted with
 * --restore from its chain (a full checkpoint and the deltas after it),
 * its workers resending, ends with rows byte-equal to a run that was never
 * interrupted (sync, a checkpoint every round, a capped table whose LRU
 * order must come back exactly); the deltas hold only what changed; a
 * restore with another declaration is refused naming both sides; the files
 * a chain needs are kept and no others; a format 2 file is still read. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "shard.h"
#include "tables_job.h"

#define DIM 4
#define IDS 3000  /* ids 0 .. IDS-1 are touched */
#define BATCH 200

/* rank r's batch at `step`: a window that moves, some ids twice */
static size_t batch(int r, int step, uint64_t *ids)
{
    size_t n = 0;
    for (int i = 0; i < BATCH; i++)
        ids[n++] = (uint64_t)((step * 137 + r * 911 + i * 13) % IDS);
    for (int i = 0; i < 10; i++)
        ids[n++] = ids[i * 3];
    return n;
}

static float grad(int r, uint64_t id, int step, int k)
{
    uint64_t x = ps_table_mix(((uint64_t)r << 40) ^ (id << 8) ^ ((uint64_t)step << 24) ^
                              (uint64_t)k);
    return (float)((int64_t)(x >> 40) - (1 << 23)) * 0x1p-24f;
}

/* Steps [from, to) of W sync workers: each pushes its batch's gradients
 * and pulls the next batch (a pushpull).  0, or -1 (said). */
static int run_steps(tj_job *j, int from, int to, void (*after_post)(tj_job *, int))
{
    static uint64_t ids[TJ_MAX][BATCH + 16], next[TJ_MAX][BATCH + 16];
    static float g[TJ_MAX][(BATCH + 16) * DIM], rows[TJ_MAX][(BATCH + 16) * DIM];
    ps_request req[TJ_MAX];
    for (int t = from; t < to; t++) {
        for (int r = 0; r < j->W; r++) {
            size_t n = batch(r, t, ids[r]), nn = batch(r, t + 1, next[r]);
            for (size_t i = 0; i < n; i++)
                for (int k = 0; k < DIM; k++)
                    g[r][i * DIM + k] = grad(r, ids[r][i], t, k);
            if (ps_client_sparse_pushpull(j->c[r], j->table, ids[r], n, g[r], next[r], nn,
                                          rows[r], t, &req[r])) {
                fprintf(stderr, "step %d rank %d: cannot post: %s\n", t, r, req[r].err);
                return -1;
            }
        }
        if (after_post)
            after_post(j, t);
        for (int r = 0; r < j->W; r++)
            if (tj_wait(&req[r])) {
                fprintf(stderr, "step %d rank %d: %s\n", t, r, req[r].err);
                return -1;
            }
    }
    return 0;
}

/* Every row 0 .. IDS-1 as worker 0 pulls it at version `step` (a pull
 * creates the rows that are not there, evicted ones too: the same in both
 * runs).  malloc'd, or NULL. */
static float *all_rows(tj_job *j, int step)
{
    uint64_t *ids = malloc(IDS * sizeof *ids);
    float *rows = malloc((size_t)IDS * DIM * sizeof *rows);
    for (int i = 0; ids && i < IDS; i++)
        ids[i] = (uint64_t)i;
    ps_request req;
    if (!ids || !rows || ps_client_sparse_pull(j->c[0], j->table, ids, IDS, rows, step, &req) ||
        tj_wait(&req)) {
        free(rows);
        rows = NULL;
    }
    free(ids);
    return rows;
}

/* the job of these tests: 2 servers of 2 threads, 2 sync workers, a table
 * of optimizer `kind` (adagrad, or row-wise adagrad and its one state float
 * a row) capped below the ids it sees (evictions) */
static int start_job(tj_job *j, const char *more, int kind)
{
    char flags[600];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads 2 %s", more);
    if (tj_prepare(j, 2, 2, flags, DIM, PS_TABLE_INIT_UNIFORM))
        return -1;
    j->topt.opt.kind = kind;
    j->topt.opt.lr = 0.05f;
    j->topt.max_rows = 2400;
    return tj_connect(j);
}

static char kill_dir[600];
static int kill_at = -1;

/* after posting step `kill_at`'s pushpulls: server 0 is killed and started
 * again from its checkpoints on the same port; the workers resend */
static void kill_and_restore(tj_job *j, int step)
{
    if (step != kill_at)
        return;
    ps_test_sleep_ms(1); /* some of the step is in, some not: resent */
    kill(j->pid[0], SIGKILL);
    ps_test_wait(j->pid[0], 5000);
    tj_server(j, 0, "--restore");
}

PS_TEST(a_killed_server_restored_from_its_chain_ends_with_the_rows_of_an_uninterrupted_run)
{
    /* row-wise adagrad: its state (one float a row) goes through the chain
     * too, else the rows after the restore would differ */
    TJ_NEED_SERVER();
    const int steps = 12;
    /* the run that is not interrupted */
    tj_job a;
    CHECK_OK(start_job(&a, "", PS_TABLE_OPT_ROWWISE_ADAGRAD));
    CHECK_OK(run_steps(&a, 0, steps, NULL));
    float *want = all_rows(&a, steps);
    CHECK(want);
    CHECK_OK(tj_stop(&a));
    /* the same, with a checkpoint every round, server 0 killed in step 7 */
    snprintf(kill_dir, sizeof kill_dir, "%s/chain", ps_test_tmpdir());
    char more[700];
    snprintf(more, sizeof more, "--checkpoint-dir %s --checkpoint-every 1", kill_dir);
    tj_job b;
    CHECK_OK(start_job(&b, more, PS_TABLE_OPT_ROWWISE_ADAGRAD));
    kill_at = 7;
    int rc = run_steps(&b, 0, steps, kill_and_restore);
    kill_at = -1;
    CHECK_MSG(rc == 0, "the run with a restore did not finish (logs %s, %s)", b.log[0],
              b.log[1]);
    float *got = all_rows(&b, steps);
    CHECK(got);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)IDS * DIM; i++)
        diff += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    CHECK_MSG(diff == 0, "%zu of %d floats differ from the uninterrupted run", diff, IDS * DIM);
    CHECK_MSG(ps_test_file_has(b.log[0], "restored "), "no restore in %s", b.log[0]);
    free(want);
    free(got);
    CHECK_OK(tj_stop(&b));
}

/* After a run with a checkpoint every round: the files kept are the two
 * newest full ones and the deltas after each (every chain the newest two
 * need, and the one before); a delta holds, of each partition,
 * only the rows its rounds changed; a restore with another declaration of
 * the table is refused at hello, naming both and the checkpoint's table. */
PS_TEST(deltas_hold_what_changed_chains_are_kept_and_another_declaration_is_refused)
{
    TJ_NEED_SERVER();
    char dir[600], more[700];
    snprintf(dir, sizeof dir, "%s/deltas", ps_test_tmpdir());
    snprintf(more, sizeof more, "--checkpoint-dir %s --checkpoint-every 1", dir);
    tj_job j;
    CHECK_OK(start_job(&j, more, PS_OPT_ADAGRAD));
    CHECK_OK(run_steps(&j, 0, 14, NULL));
    float *before = all_rows(&j, 14);
    CHECK(before);
    CHECK_OK(tj_stop(&j));
    for (int k = 0; k < 2; k++) {
        uint64_t *seqs = NULL;
        char why[256], path[800];
        int n = ps_ckpt_list(dir, k, &seqs, why, sizeof why);
        CHECK_MSG(n >= 2, "server %d: %d checkpoints", k, n);
        /* what the newest two need, and every one from the second newest
         * full checkpoint on (its chain stays whole: the one to fall back
         * to), and nothing older */
        int need[64] = {0}, fulls = 0, deltas = 0;
        CHECK(n <= 64);
        for (int i = 0, f = 0; i < n && f < 2; i++) {
            need[i] = 1;
            f += ps_ckpt_prev_of(dir, k, seqs[i]) == 0;
        }
        for (int i = 0; i < 2; i++)
            for (int64_t s = (int64_t)seqs[i]; s > 0;) {
                int at = 0;
                while (at < n && seqs[at] != (uint64_t)s)
                    at++;
                CHECK_MSG(at < n, "server %d: checkpoint %lld of a chain is gone", k,
                          (long long)s);
                need[at] = 1;
                s = ps_ckpt_prev_of(dir, k, (uint64_t)s);
            }
        for (int i = 0; i < n; i++) {
            CHECK_MSG(need[i], "server %d: checkpoint %llu is kept but is older than the "
                      "second newest full one", k, (unsigned long long)seqs[i]);
            ps_ckpt_file f;
            ps_ckpt_path(dir, k, seqs[i], path, sizeof path);
            CHECK_OK(ps_ckpt_read(path, &f, why, sizeof why));
            CHECK_EQ_INT(f.meta.nparts, 2); /* one table, two threads */
            uint64_t rows = 0;
            size_t off = f.first_part;
            ps_ckpt_part_view v;
            while (ps_ckpt_next_part(&f, &off, &v)) {
                CHECK_EQ_INT(v.delta, f.meta.prev != 0);
                CHECK_EQ_INT(v.decl.dim, DIM);
                rows += v.nrows;
                /* a capped table's delta says the order of every row */
                if (v.delta)
                    CHECK(v.norder >= v.nrows);
            }
            if (f.meta.prev) {
                deltas++;
                /* a round touches at most 2 x 210 ids, of which about half
                 * are this server's */
                CHECK_MSG(rows > 0 && rows <= 2 * (BATCH + 10), "server %d: a delta of %llu rows",
                          k, (unsigned long long)rows);
            } else if (!fulls++) { /* the newest (the one before may be the first: empty) */
                CHECK_MSG(rows > 600, "server %d: a full checkpoint of %llu rows", k,
                          (unsigned long long)rows);
            }
            ps_ckpt_file_free(&f);
        }
        CHECK_MSG(deltas > 0 && fulls == 2, "server %d: %d full, %d deltas", k, fulls, deltas);
        free(seqs);
    }
    /* restored, and a worker that declares the table with another width */
    tj_job r;
    char rmore[800];
    snprintf(rmore, sizeof rmore, "%s --restore", more);
    char flags[900];
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads 2 %s", rmore);
    CHECK_OK(tj_prepare(&r, 2, 2, flags, DIM + 4, PS_TABLE_INIT_UNIFORM));
    r.topt.opt.kind = PS_OPT_ADAGRAD;
    r.topt.opt.lr = 0.05f;
    r.topt.max_rows = 2400;
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = r.eps;
    o.num_workers = 2;
    o.mode = PS_MODE_SYNC;
    o.hello_timeout_ms = TJ_WAIT_MS;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_OK(ps_client_register_table(c, r.table, &r.topt));
    CHECK_EQ_INT(ps_client_start(c), PS_EMISMATCH);
    CHECK_MSG(strstr(ps_client_last_error(c), "tables: server has fingerprint ") &&
                  strstr(ps_client_last_error(c), ", worker 0 has ") &&
                  strstr(ps_client_last_error(c), "its checkpoint has table 7 (dim 4, adagrad)"),
              "%s", ps_client_last_error(c));
    ps_client_close(c);
    /* the workers as they were: every row as before the stop, restored from
     * the full checkpoint and the deltas after it */
    r.topt.dim = DIM;
    CHECK_OK(tj_connect(&r));
    float *after = all_rows(&r, 14);
    CHECK(after);
    CHECK_MSG(memcmp(before, after, (size_t)IDS * DIM * sizeof(float)) == 0,
              "the rows restored from the chain differ from those before the stop");
    free(before);
    free(after);
    CHECK_OK(tj_stop(&r));
    CHECK_MSG(ps_test_file_has(r.log[0], "with the full one and deltas before it"),
              "no chain restore in %s", r.log[0]);
}

/* One server, the job above: the newest full checkpoint damaged (one byte),
 * --restore falls back to the chain before it (kept for that), says so and
 * what was lost, and holds the rows of an uninterrupted run at that chain's
 * newest version. */
PS_TEST(a_damaged_newest_full_checkpoint_restores_the_chain_before_it)
{
    TJ_NEED_SERVER();
    char dir[600], more[800], flags[900], path[800], why[256];
    snprintf(dir, sizeof dir, "%s/fallback", ps_test_tmpdir());
    snprintf(more, sizeof more, "--checkpoint-dir %s --checkpoint-every 1", dir);
    snprintf(flags, sizeof flags, "--mode sync --optimizer sgd --lr 0.1 --threads 2 %s", more);
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 2, flags, DIM, PS_TABLE_INIT_UNIFORM));
    j.topt.opt.kind = PS_OPT_ADAGRAD;
    j.topt.opt.lr = 0.05f;
    j.topt.max_rows = 2400;
    CHECK_OK(tj_connect(&j));
    CHECK_OK(run_steps(&j, 0, 14, NULL));
    CHECK_OK(tj_stop(&j));
    /* the newest full one, and the newest checkpoint before it: the head of
     * the chain before */
    uint64_t *seqs = NULL;
    int n = ps_ckpt_list(dir, 0, &seqs, why, sizeof why);
    int full = 0;
    while (full < n && ps_ckpt_prev_of(dir, 0, seqs[full]) != 0)
        full++;
    CHECK_MSG(full + 1 < n, "no checkpoint before the newest full one (of %d) is kept", n);
    uint64_t lost_full = seqs[full], head = seqs[full + 1];
    int64_t s = (int64_t)head;
    while (s > 0) /* its chain is whole, down to its full one */
        s = ps_ckpt_prev_of(dir, 0, (uint64_t)s);
    CHECK_MSG(s == 0, "the chain of checkpoint %llu is not whole", (unsigned long long)head);
    ps_ckpt_file f;
    ps_ckpt_path(dir, 0, head, path, sizeof path);
    CHECK_OK(ps_ckpt_read(path, &f, why, sizeof why));
    int64_t v = f.meta.min_version;
    ps_ckpt_file_free(&f);
    free(seqs);
    CHECK(v > 0 && v < 14);
    /* one byte of the newest full one, in its rows */
    ps_ckpt_path(dir, 0, lost_full, path, sizeof path);
    FILE *fp = fopen(path, "r+b");
    CHECK(fp);
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, size / 2, SEEK_SET);
    int byte = fgetc(fp);
    fseek(fp, size / 2, SEEK_SET);
    fputc(byte ^ 0x40, fp);
    fclose(fp);
    /* the uninterrupted run to that version */
    tj_job a;
    CHECK_OK(tj_prepare(&a, 1, 2, "--mode sync --optimizer sgd --lr 0.1 --threads 2", DIM,
                        PS_TABLE_INIT_UNIFORM));
    a.topt = j.topt;
    CHECK_OK(tj_connect(&a));
    CHECK_OK(run_steps(&a, 0, (int)v, NULL));
    float *want = all_rows(&a, (int)v);
    CHECK(want);
    CHECK_OK(tj_stop(&a));
    /* restored: the chain before, and the log says what was lost */
    tj_job r;
    char rflags[1000];
    snprintf(rflags, sizeof rflags, "%s --restore", flags);
    CHECK_OK(tj_prepare(&r, 1, 2, rflags, DIM, PS_TABLE_INIT_UNIFORM));
    r.topt = j.topt;
    CHECK_OK(tj_connect(&r));
    float *got = all_rows(&r, (int)v);
    CHECK(got);
    size_t diff = 0;
    for (size_t i = 0; i < (size_t)IDS * DIM; i++)
        diff += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    CHECK_MSG(diff == 0, "%zu of %d floats differ from the run stopped at version %lld", diff,
              IDS * DIM, (long long)v);
    free(want);
    free(got);
    CHECK_OK(tj_stop(&r));
    char line[200];
    snprintf(line, sizeof line, "--restore fell back to checkpoint %llu: the ",
             (unsigned long long)head);
    CHECK_MSG(ps_test_file_has(r.log[0], line) &&
                  ps_test_file_has(r.log[0], "could not be restored (above); the updates they "
                                             "held after version ") &&
                  ps_test_file_has(r.log[0], "CRC-32 mismatch"),
              "no line about the fallback in %s", r.log[0]);
}

/* A checkpoint of format 2 (before tables) is read as it was: its chunks,
 * no table partitions, no chain. */
PS_TEST(a_format_2_checkpoint_is_still_read)
{
    ps_shard_config sc = {PS_MODE_SYNC, 0, 1, {PS_OPT_SGD, 1.0f, 0, 0, 0, 1e-8f, 0, 1.0f, 0,
                          PS_OPT_GIVEN_ALL}, 1 << 20, NULL, 1};
    ps_shard_hooks hk = {0};
    ps_shard *sh;
    CHECK_OK(ps_shard_create(&sc, &hk, &sh));
    float w[3] = {1.5f, -2, 0.25f};
    int64_t version;
    char why[256], dir[600], path[800];
    CHECK_OK(ps_shard_init(sh, 9, 0, w, 3, 3, &version, NULL, why, sizeof why));
    ps_ckpt_part part;
    CHECK_OK(ps_ckpt_serialize(sh, NULL, PS_MODE_SYNC, 1, 1, &part));
    ps_shard_destroy(sh);
    ps_ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.seq = 3;
    m.num_servers = m.num_workers = 1;
    m.mode = PS_MODE_SYNC;
    m.opt = sc.opt;
    m.nchunks = 1;
    snprintf(dir, sizeof dir, "%s/format2", ps_test_tmpdir());
    CHECK(mkdir(dir, 0700) == 0);
    uint64_t bytes;
    CHECK_OK(ps_ckpt_write(dir, &m, &part, 1, 2, path, sizeof path, &bytes, why, sizeof why));
    free(part.buf);
    free(part.tbuf);
    /* as format 2 wrote it: no prev, threads, 0, partitions in the header */
    size_t len;
    unsigned char *d = (unsigned char *)ps_test_read_file(path, &len);
    CHECK(d);
    uint32_t format = 2, hb;
    memcpy(&hb, d + 12, 4);
    size_t hdr2 = 8 + 4 + 4 + 8 + 8 + 6 * 4 + 7 * 4 + 4 + 8 + 8 + 8 + 8 + 6 * 8;
    size_t hb2 = (hdr2 + 1 + 7) & ~(size_t)7;
    unsigned char *o = malloc(len);
    CHECK(o);
    memcpy(o, d, hdr2);
    memcpy(o + 8, &format, 4);
    uint32_t hb2u = (uint32_t)hb2;
    memcpy(o + 12, &hb2u, 4);
    memset(o + hdr2, 0, hb2 - hdr2);
    o[hdr2] = d[hdr2 + 24]; /* the hello flag */
    size_t body = len - 4 - hb;
    memcpy(o + hb2, d + hb, body);
    uint32_t crc = (uint32_t)crc32(0, o, (uInt)(hb2 + body));
    memcpy(o + hb2 + body, &crc, 4);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(o, 1, hb2 + body + 4, f) == hb2 + body + 4 && fclose(f) == 0);
    free(d);
    free(o);
    ps_ckpt_file cf;
    CHECK_MSG(ps_ckpt_read(path, &cf, why, sizeof why) == 0, "%s", why);
    CHECK_EQ_INT(cf.meta.nchunks, 1);
    CHECK_EQ_INT(cf.meta.nparts, 0);
    CHECK_EQ_INT(cf.meta.prev, 0);
    size_t off = cf.first;
    ps_shard_chunk_view v;
    CHECK(ps_ckpt_next_chunk(&cf, &off, &v));
    CHECK(v.key == 9 && v.n == 3 && memcmp(v.w, w, sizeof w) == 0);
    CHECK(!ps_ckpt_next_chunk(&cf, &off, &v));
    ps_ckpt_part_view pv;
    off = cf.first_part;
    CHECK(!ps_ckpt_next_part(&cf, &off, &pv));
    CHECK_EQ_INT(ps_ckpt_prev_of(dir, 0, 3), 0);
    ps_ckpt_file_free(&cf);
}
