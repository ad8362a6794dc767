/* A table's declaration with checkpoints on (issue 30): it is answered at
 * once, not after a checkpoint of every table; a server restored from a
 * checkpoint that does not hold it answers the table's requests
 * PS_ENOTFOUND and libps declares its tables again and goes on; and what a
 * capped table does when full survives a restore.  Live bin/ps_server
 * processes, a raw DEALER and libps clients. */
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "tables_job.h"

static int declare(void *d, uint64_t seq, uint64_t key, uint64_t max_rows, uint32_t full,
                   ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_TABLE, 0, seq, key, 0, 0);
    ps_table_options_default(&h.table);
    h.table.dim = 4;
    h.table.max_rows = max_rows;
    h.table.full = full;
    if (ps_test_send(d, &h, NULL, 0))
        return -1;
    return ps_test_recv(d, PS_TEST_RPC_MS, r, NULL, 0, NULL);
}

/* Checkpoint files in dir (shard-*.ckpt). */
static int checkpoints(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null | grep -c '^shard-.*[.]ckpt$'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* --checkpoint-every 1: 40 tables declared one after another are each
 * answered without a checkpoint being written (the old server wrote one per
 * declaration, holding every table, before it answered); a push's
 * checkpoint holds them all, and a server restored from it refuses a
 * declaration of one of them that differs (what it does when full). */
PS_TEST(a_declaration_is_answered_without_waiting_for_a_checkpoint)
{
    TJ_NEED_SERVER();
    char dir[600], words[900];
    snprintf(dir, sizeof dir, "%s/decl-ckpt", ps_test_tmpdir());
    snprintf(words, sizeof words, "--num-workers 1 --mode async --checkpoint-dir %s "
             "--checkpoint-every 1 --quiet", dir);
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    void *d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    ps_header r;
    for (uint64_t k = 0; k < 40; k++) {
        CHECK_OK(declare(d, 10 + k, 100 + k, k == 0 ? 8 : 0, k == 0, &r));
        CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    }
    CHECK_MSG(checkpoints(dir) == 0, "%d checkpoints written for 40 declarations",
              checkpoints(dir));
    /* a push: its checkpoint holds every table */
    uint64_t id = 5;
    uint32_t part = ps_table_row_part(ps_table_row_hash(100, id), 1, 1);
    ps_header h = ps_test_header(PS_MSG_SPUSH, 0, 60, 100, part, 0);
    h.dim = 4;
    h.dtype = PS_DTYPE_F32;
    h.count = 1;
    float g[4] = {1, 1, 1, 1};
    const void *f[2] = {&id, g};
    size_t b[2] = {8, sizeof g};
    CHECK_OK(ps_test_send_frames(d, &h, f, b, 2));
    CHECK_OK(ps_test_recv(d, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_SPUSH, "%s %s", ps_msg_type_name(r.type), r.err_text);
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, 5000));
    CHECK(checkpoints(dir) >= 1);
    /* restored: table 100 is still capped at 8 and refuses when full */
    snprintf(words, sizeof words, "--num-workers 1 --mode async --checkpoint-dir %s "
             "--checkpoint-every 1 --restore --quiet", dir);
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    CHECK_OK(declare(d, 70, 100, 8, 0, &r));
    CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_EMISMATCH && strstr(r.err_text, "full"),
              "%s %d %s", ps_msg_type_name(r.type), r.err_code, r.err_text);
    CHECK_OK(declare(d, 71, 100, 8, 1, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    CHECK_OK(declare(d, 72, 139, 0, 0, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, 5000));
}

/* Worker 0 inits a key: the server's checkpoints, before worker 1 says
 * hello and declares table 7, answered at once (no checkpoint more).  The server is killed and started with --restore from that
 * checkpoint, which knows neither worker 1 nor its table: worker 1's next
 * pull is refused (PS_EHELLO, then PS_ENOTFOUND), libps says hello, declares
 * the table again and sends the pull again, answered with the
 * initializer's rows. */
PS_TEST(a_server_restored_without_a_table_gets_it_declared_again_by_libps)
{
    TJ_NEED_SERVER();
    tj_job j;
    char flags[900], dir[600];
    snprintf(dir, sizeof dir, "%s/decl-kill", ps_test_tmpdir());
    snprintf(flags, sizeof flags, "--mode async --threads 1 --checkpoint-dir %s "
             "--checkpoint-every 1", dir);
    CHECK_OK(tj_prepare(&j, 1, 2, flags, 4, PS_TABLE_INIT_UNIFORM));
    /* both workers register key 1; worker 1 has table 7 too */
    ps_client *c[2];
    for (int k = 0; k < 2; k++) {
        ps_client_options o;
        ps_client_options_default(&o);
        o.servers = j.eps;
        o.rank = k;
        o.num_workers = 2;
        o.mode = PS_MODE_ASYNC;
        o.max_staleness = -1;
        o.hello_timeout_ms = TJ_WAIT_MS;
        o.request_timeout_ms = 2000;
        CHECK_OK(ps_client_open(&o, &c[k]));
        CHECK_OK(ps_client_register(c[k], 1, 4));
    }
    CHECK_OK(ps_client_register_table(c[1], j.table, &j.topt));
    float w[4] = {1, 2, 3, 4};
    ps_request r;
    CHECK_OK(ps_client_start(c[0]));
    CHECK_OK(ps_client_init(c[0], 1, w, &r));
    CHECK_OK(tj_wait(&r));
    ps_test_sleep_ms(200);
    int n0 = checkpoints(dir);
    CHECK_OK(ps_client_start(c[1])); /* table 7 declared */
    ps_test_sleep_ms(200);
    CHECK_MSG(n0 >= 1 && checkpoints(dir) == n0, "%d checkpoints, then %d", n0,
              checkpoints(dir));
    kill(j.pid[0], SIGKILL);
    ps_test_wait(j.pid[0], 5000);
    CHECK_OK(tj_server(&j, 0, "--restore"));
    uint64_t ids[2] = {3, 1ull << 50};
    float rows[8], want[8];
    CHECK_OK(ps_client_sparse_pull(c[1], j.table, ids, 2, rows, 0, &r));
    int st = ps_request_wait_for(&r, 30000);
    char *text = ps_test_read_file(j.log[0], NULL);
    CHECK_MSG(st == 0, "pull after the restore: %d %s; server: %s", st, r.err, text ? text : "");
    free(text);
    for (int k = 0; k < 2; k++)
        ps_table_init_row(11, 7, ids[k], PS_TABLE_INIT_UNIFORM, 0.25f, 4, want + 4 * k);
    CHECK(memcmp(rows, want, sizeof rows) == 0);
    CHECK(ps_test_file_has(j.log[0], "table 7 declared by worker 1"));
    ps_client_close(c[0]);
    ps_client_close(c[1]);
    CHECK_OK(tj_stop(&j));
}
