/* A table server's memory under a worker that asks too much (issue 30):
 * replies sized before they are built, a request's duplicate ids charged
 * once, the update thread's scratch charged and given back after a large
 * request; each against a live bin/ps_server from a raw DEALER, with the
 * server's resident memory read from /proc/PID/status. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctr.h"
#include "embedding.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "tables_job.h"

#define KEY 7

/* Under AddressSanitizer freed memory waits in its quarantine (still
 * resident) and every allocation carries shadow memory: the bounds on the
 * server's resident memory hold for the plain build only. */
#ifdef __SANITIZE_ADDRESS__
#define RSS_CHECKED 0
#else
#define RSS_CHECKED 1
#endif

/* Send h with frames; the reply into r (rows into out, at most cap floats,
 * *got of them).  0, or -1 when none came. */
static int ask(void *d, const ps_header *h, const void *const *f, const size_t *b, int n,
               ps_header *r, float *out, size_t cap, size_t *got)
{
    if (ps_test_send_frames(d, h, f, b, n))
        return -1;
    return ps_test_recv(d, 30000, r, out, cap, got) == 0 ? 0 : -1;
}

static int declare(void *d, int rank, uint64_t seq, uint64_t key, uint32_t dim, ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_TABLE, rank, seq, key, 0, 0);
    ps_table_options_default(&h.table);
    h.table.dim = dim;
    h.table.opt.kind = PS_OPT_ADAGRAD;
    return ask(d, &h, NULL, NULL, 0, r, NULL, 0, NULL);
}

/* A sparse message of `type` for table key, partition part: count ids
 * (npull for a pushpull's pull), rows of dim. */
static ps_header sparse(uint32_t type, int rank, uint64_t seq, uint64_t key, uint32_t part,
                        uint32_t dim, uint64_t count)
{
    ps_header h = ps_test_header(type, rank, seq, key, part, 0);
    h.dim = dim;
    h.dtype = PS_DTYPE_F32;
    h.count = count;
    return h;
}

#define REFUSED(r, code, text)                                                                  \
    CHECK_MSG((r).type == PS_MSG_ERROR && (r).err_code == (code) && strstr((r).err_text, text), \
              "got %s %d: %s (expected %d: ...%s...)", ps_msg_type_name((r).type),            \
              (r).err_code, (r).err_text, code, text)

/* An 8 MiB SPULL of 2^20 copies of one id on a dim-512 table would be a
 * 2 GiB reply: refused before anything is built, naming both numbers (also
 * as a SPUSHPULL's pull), the server's peak resident memory bounded.  2^15
 * copies of a new id (a 64 MiB reply) are answered: the id makes one row,
 * charged once, and the scratch the reply took goes back.  Then normal
 * traffic goes on. */
PS_TEST(a_reply_is_sized_before_it_is_built_and_duplicate_ids_make_one_row)
{
    TJ_NEED_SERVER();
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --max-memory 160M "
                                  "--max-peer-bytes 1G --quiet"));
    void *d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    ps_header r;
    const uint32_t dim = 512;
    CHECK_OK(declare(d, 0, 10, KEY, dim, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    long rss0 = ps_test_status_kb(sv.pid, "VmRSS");
    CHECK(rss0 > 0);

    enum { BIG = 1 << 20, MID = 1 << 15 };
    const size_t big = BIG;
    static uint64_t ids[BIG];
    static float rows[(size_t)MID * 512];
    uint64_t id = 42;
    for (size_t i = 0; i < big; i++)
        ids[i] = id;
    uint32_t part = ps_table_row_part(ps_table_row_hash(KEY, id), 1, 1);
    const void *f[3] = {ids, NULL, ids};
    size_t b[3] = {big * 8, 0, big * 8};
    ps_header h = sparse(PS_MSG_SPULL, 0, 11, KEY, part, dim, big);
    CHECK_OK(ask(d, &h, f, b, 1, &r, NULL, 0, NULL));
    REFUSED(r, PS_ETOOBIG, "reply of 2147483648 bytes (1048576 ids x dim 512 x 4)");
    REFUSED(r, PS_ETOOBIG, "over the frame limit, 1073741824 bytes");
    h = sparse(PS_MSG_SPUSHPULL, 0, 12, KEY, part, dim, 0);
    h.npull = big;
    size_t bpp[3] = {0, 0, big * 8};
    CHECK_OK(ask(d, &h, f, bpp, 3, &r, NULL, 0, NULL));
    REFUSED(r, PS_ETOOBIG, "reply of 2147483648 bytes");
    long hwm = ps_test_status_kb(sv.pid, "VmHWM");
    CHECK_MSG(hwm < rss0 + 64 * 1024 || !RSS_CHECKED, "the server's peak went from %ld to %ld KiB",
              rss0, hwm);

    /* 2^15 copies of one new id: a 64 MiB reply of the same row; the id
     * makes one row (the old server reserved 2^15 and had no room) */
    const size_t mid = MID;
    h = sparse(PS_MSG_SPULL, 0, 13, KEY, part, dim, mid);
    b[0] = mid * 8;
    size_t got = 0;
    CHECK_OK(ask(d, &h, f, b, 1, &r, rows, mid * dim, &got));
    CHECK_MSG(r.type == PS_MSG_SPULL && got == mid * dim, "got %s (%zu values): %s",
              ps_msg_type_name(r.type), got, r.err_text);
    CHECK(memcmp(rows, rows + (mid - 1) * dim, dim * sizeof(float)) == 0);
    ps_stats st;
    CHECK_OK(ps_test_stats(sv.port, &st));
    CHECK_MSG(st.rows == 1 && st.table_bytes < (1u << 20), "rows %llu, table bytes %llu",
              (unsigned long long)st.rows, (unsigned long long)st.table_bytes);
    /* its scratch went back: resident memory near where it was */
    ps_test_sleep_ms(200);
    long rss1 = ps_test_status_kb(sv.pid, "VmRSS");
    CHECK_MSG(rss1 < rss0 + 32 * 1024 || !RSS_CHECKED, "resident %ld KiB before, %ld after the "
              "64 MiB reply", rss0, rss1);

    /* and the table serves as before */
    uint64_t two[2] = {5, 6};
    for (int k = 0; k < 2; k++) {
        uint32_t p = ps_table_row_part(ps_table_row_hash(KEY, two[k]), 1, 1);
        h = sparse(PS_MSG_SPULL, 0, 20 + (uint64_t)k, KEY, p, dim, 1);
        const void *g[1] = {&two[k]};
        size_t gb[1] = {8};
        CHECK_OK(ask(d, &h, g, gb, 1, &r, rows, dim, &got));
        CHECK_MSG(r.type == PS_MSG_SPULL && got == dim, "pull of id %llu: %s",
                  (unsigned long long)two[k], r.err_text);
    }
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, 5000));
}

/* ---- one worker's flood of new ids ---- */

/* Has child pid exited (a zombie, not reaped yet)? */
static int exited(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    char *text = ps_test_read_file(path, NULL);
    const char *p = text ? strrchr(text, ')') : NULL;
    int z = !p || (p[1] == ' ' && p[2] == 'Z');
    free(text);
    return z;
}

/* One raw SPULL of n ids of table key on partition 0 (--threads 1): its
 * reply's type and error code. */
static int flood_pull(void *d, int rank, uint64_t seq, uint64_t key, uint32_t dim,
                      const uint64_t *ids, size_t n, ps_header *r)
{
    ps_header h = sparse(PS_MSG_SPULL, rank, seq, key, 0, dim, n);
    const void *f[1] = {ids};
    size_t b[1] = {n * 8};
    return ask(d, &h, f, b, 1, r, NULL, 0, NULL);
}

/* Three async workers, --max-memory 256M (so a share of 256M x 1.25 / 3 =
 * 106.7 MiB each).  Worker 2, a raw client, declares field 0's table as
 * ps_worker does and pulls random 64-bit ids, 4096 a request, until the
 * server refuses it: the refusal names its share.  Then workers 0 and 1,
 * two ps_worker processes training the click-through model on the same
 * tables, run an epoch to the end (exit 0) while worker 2 keeps pulling new
 * ids, every request refused; the server's peak resident memory stays
 * within the budget and what a server needs beside it. */
PS_TEST(a_worker_flooding_new_ids_is_refused_while_two_ctr_workers_finish)
{
    TJ_NEED_SERVER();
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 3 --mode async --max-memory 256M "
                                  "--optimizer sgd --lr 0.05"));
    CHECK(ps_test_wait_for_text(sv.log, "table rows per worker 111848106 bytes", 5000, sv.pid) ==
          0);
    void *d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 2, PS_MODE_ASYNC, 3, -1));
    const char *spec = "ctr:fields=8,rows=100000,mlp=64-1";
    ps_ctr_spec cs;
    char why[256];
    CHECK_OK(ps_ctr_spec_parse(spec, &cs, why, sizeof why));
    ps_header h = ps_test_header(PS_MSG_TABLE, 2, 1, PS_EMB_TABLE_KEY(0), 0, 0), r;
    ps_ctr_table_options(&cs, 1, &h.table); /* ps_worker's --seed 1 */
    CHECK_OK(ask(d, &h, NULL, NULL, 0, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);

    enum { B = 4096 };
    static uint64_t ids[B];
    uint64_t x = 0x9e3779b97f4a7c15ull, seq = 10;
    int refused = 0, sent = 0;
    for (; sent < 1000 && !refused; sent++) {
        for (int i = 0; i < B; i++)
            ids[i] = ps_table_mix(x++);
        CHECK_OK(flood_pull(d, 2, ++seq, PS_EMB_TABLE_KEY(0), (uint32_t)cs.dim, ids, B, &r));
        if (r.type == PS_MSG_ERROR) {
            REFUSED(r, PS_ETOOBIG, "worker 2's rows here take");
            REFUSED(r, PS_ETOOBIG, "of its share of 111848106 (--table-memory-per-worker)");
            refused = 1;
        }
    }
    CHECK_MSG(refused, "%d requests of %d new ids were all answered", sent, B);
    printf("# worker 2 refused after %d requests of %d new ids\n", sent, B);

    /* the honest workers train while worker 2 goes on */
    int wpid[2];
    char words[1024], log[2][512];
    for (int k = 0; k < 2; k++) {
        snprintf(words, sizeof words, "--servers tcp://127.0.0.1:%d --rank %d --num-workers 3 "
                 "--mode async --model %s --data synthetic-ctr:200000 --log-every 1000",
                 sv.port, k, spec);
        snprintf(log[k], sizeof log[k], "%s/flood-worker%d.log", ps_test_tmpdir(), k);
        wpid[k] = ps_test_spawn_words("ps_worker", words, log[k]);
        CHECK(wpid[k] > 0);
    }
    int more = 0, answered = 0;
    for (int k = 0; k < 2; k++)
        while (!exited(wpid[k]) && !ps_test_file_has(log[k], "at the final barrier") &&
               more < 20000) {
            for (int i = 0; i < B; i++)
                ids[i] = ps_table_mix(x++);
            CHECK_OK(flood_pull(d, 2, ++seq, PS_EMB_TABLE_KEY(0), (uint32_t)cs.dim, ids, B, &r));
            more++;
            answered += r.type != PS_MSG_ERROR;
        }
    /* worker 2's part of ps_worker's final barrier, for them to finish */
    h = ps_test_header(PS_MSG_BARRIER, 2, ++seq, 0, 0, 1);
    CHECK_OK(ask(d, &h, NULL, NULL, 0, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_BARRIER);
    for (int k = 0; k < 2; k++) {
        int st = ps_test_wait(wpid[k], 60000);
        char *text = ps_test_read_file(log[k], NULL);
        CHECK_MSG(st == 0, "ps_worker %d exited %d: %s", k, st, text ? text : "");
        free(text);
    }
    CHECK_MSG(answered == 0, "%d of worker 2's %d later requests of new ids were answered",
              answered, more);
    long hwm = ps_test_status_kb(sv.pid, "VmHWM");
    printf("# worker 2 sent %d more requests, all refused; server peak %ld KiB\n", more, hwm);
    CHECK_MSG(hwm < (256 + 160) * 1024 || !RSS_CHECKED, "server peak %ld KiB", hwm);
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, 5000));
}

/* --max-tables: a declaration beyond it is refused naming it, one of a
 * table declared already is still answered; and the start line says the
 * budget the host gave (no --max-memory) and each worker's share. */
PS_TEST(tables_past_max_tables_are_refused_and_the_start_line_says_the_budget)
{
    TJ_NEED_SERVER();
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode async --max-tables 3"));
    CHECK_MSG(ps_test_wait_for_text(sv.log, "bytes MemAvailable said at start; --max-memory to "
                                    "set it), table rows per worker ", 5000, sv.pid) == 0 &&
                  ps_test_file_has(sv.log, "(--max-memory x 1.25 / workers), at most 3 tables"),
              "%s", sv.log);
    void *d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 2, -1));
    ps_header r;
    for (uint64_t k = 0; k < 4; k++) {
        CHECK_OK(declare(d, 0, 10 + k, 100 + k, 4, &r));
        if (k < 3)
            CHECK_EQ_INT(r.type, PS_MSG_TABLE);
        else
            REFUSED(r, PS_ETOOBIG, "table 103: this server holds 3 tables, --max-tables 3");
    }
    CHECK_OK(declare(d, 0, 20, 101, 4, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, 5000));
}
