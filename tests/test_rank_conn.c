/* A rank belongs to its connection (docs/SECURITY.md "Who may speak for a
 * worker rank"): a live bin/ps_server takes a worker's messages only from
 * the connection whose hello holds that rank (under CURVE, with the key
 * that said it).  A raw DEALER that never said hello, or whose hello was
 * refused, sends for a live worker's rank: every message is refused with
 * PS_EPERM naming the rank, counted (`forged`), and nothing of it is
 * applied; the honest worker's own push of that step is applied, not
 * dropped as a duplicate.  Plaintext and CURVE (an authorised worker key
 * that is not the rank's), dense keys and tables, sync and async. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define KEY 5    /* a dense key of 4 floats */
#define TKEY 7   /* a table of DIM-wide rows, zeros, sgd */
#define DIM 2
#define LR 0.5f

/* ---------- connections: plaintext, or CURVE with worker-i's key ---------- */

static void *g_ctx; /* the CURVE DEALERs' context (never terminated) */

/* A DEALER to the server on port; with dir, a CURVE client of server 0 of
 * dir holding the key pair of worker `key`. */
static void *dealer(int port, const char *dir, int key)
{
    if (!dir)
        return ps_test_dealer(port);
    if (!g_ctx)
        g_ctx = zmq_ctx_new();
    char path[700], why[256], spub[41], pub[41], sec[41], ep[64];
    snprintf(path, sizeof path, "%s/server-0.pub", dir);
    if (ps_curve_read_key(path, spub, why, sizeof why))
        return NULL;
    snprintf(path, sizeof path, "%s/worker-%d.pub", dir, key);
    if (ps_curve_read_key(path, pub, why, sizeof why))
        return NULL;
    snprintf(path, sizeof path, "%s/worker-%d.key", dir, key);
    if (ps_curve_read_key(path, sec, why, sizeof why))
        return NULL;
    void *d = zmq_socket(g_ctx, ZMQ_DEALER);
    int zero = 0, ivl = 10;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, spub, 41);
    zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, 41);
    zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, 41);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(d, ep);
    return d;
}

/* Send h and its frames, the reply into r (rows into out, cap floats).  0,
 * or -1 when none came. */
static int ask(void *d, const ps_header *h, const void *const *f, const size_t *b, int n,
               ps_header *r, float *out, size_t cap)
{
    if (ps_test_send_frames(d, h, f, b, n))
        return -1;
    return ps_test_recv(d, PS_TEST_RPC_MS, r, out, cap, NULL) == 0 ? 0 : -1;
}

/* The server's counters, asked for as a tool on connection d. */
static int stats(void *d, ps_stats *st)
{
    ps_header h = ps_test_header(PS_MSG_STATS, -1, 999, 0, 0, 0), r;
    if (ask(d, &h, NULL, NULL, 0, &r, NULL, 0) || r.type != PS_MSG_STATS)
        return -1;
    *st = r.stats;
    return 0;
}

static ps_header declaration(int rank, uint64_t seq)
{
    ps_header h = ps_test_header(PS_MSG_TABLE, rank, seq, TKEY, 0, 0);
    ps_table_options_default(&h.table);
    h.table.dim = DIM;
    h.table.init = PS_TABLE_INIT_ZEROS;
    h.table.opt.kind = PS_OPT_SGD;
    h.table.opt.lr = LR;
    return h;
}

static ps_header sparse(uint32_t type, int rank, uint64_t seq, uint32_t n, int64_t step)
{
    ps_header h = ps_test_header(type, rank, seq, TKEY, 0, step);
    h.dim = DIM;
    h.dtype = PS_DTYPE_F32;
    h.count = n;
    return h;
}

/* an error reply with this code whose text holds `text` */
#define REFUSED(r, code, text)                                                                  \
    CHECK_MSG((r).type == PS_MSG_ERROR && (r).err_code == (code) && strstr((r).err_text, text), \
              "got %s %d: %s (expected %d: ...%s...)", ps_msg_type_name((r).type),            \
              (r).err_code, (r).err_text, code, text)

/* One job of 2 workers (mode, over CURVE when dir): worker 1 trains a dense
 * key and a table while connection f, which said no hello (or had its
 * hello for rank 1 refused), sends for rank 1.  Checks everything above. */
static void forged_case(int mode, const char *dir)
{
    char words[800];
    snprintf(words, sizeof words, "--num-workers 2 --mode %s --threads 1 --lr 0.5%s%s",
             mode == PS_MODE_SYNC ? "sync" : "async", dir ? " --curve-keys " : "", dir ? dir : "");
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    int ssp = mode == PS_MODE_SYNC ? 0 : -1;
    void *a = dealer(sv.port, dir, 0), *b = dealer(sv.port, dir, 1);
    /* under CURVE the forger holds an authorised worker key of its own */
    void *f = dealer(sv.port, dir, 2);
    CHECK(a && b && f);
    CHECK_OK(ps_test_hello(a, 0, mode, 2, ssp));
    CHECK_OK(ps_test_hello(b, 1, mode, 2, ssp));
    ps_header h, r;
    uint64_t seq = 100;
    float w[4] = {1, 2, 3, 4}, ga[4] = {1, 1, 1, 1}, gb[4] = {2, 0, -2, 4}, evil[4];
    for (int i = 0; i < 4; i++)
        evil[i] = 100;
    h = ps_test_header(PS_MSG_INIT, 0, ++seq, KEY, 0, 0);
    h.total = 4;
    CHECK_OK(ps_test_rpc(a, &h, w, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    h = declaration(0, ++seq);
    CHECK_OK(ask(a, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_MSG(r.type == PS_MSG_TABLE, "%s", r.err_text);

    /* the forger: a dense push of +100 as worker 1, step 0 */
    h = ps_test_header(PS_MSG_PUSH, 1, ++seq, KEY, 0, 0);
    CHECK_OK(ps_test_rpc(f, &h, evil, 4, &r, NULL, 0, NULL));
    REFUSED(r, PS_EPERM, "worker 1 is held by another");
    CHECK_EQ_INT(r.seq, seq);
    /* its own hello for rank 1 is refused (the rank is live) ... */
    CHECK_MSG(ps_test_hello(f, 1, mode, 2, ssp) != 0, "a second hello for a live rank");
    /* ... and it sends anyway: an SPUSH of +100, a pull, a declaration */
    uint64_t id = 3;
    float rows[DIM] = {100, 100}, got[DIM];
    const void *push[2] = {&id, rows};
    size_t push_b[2] = {8, sizeof rows};
    h = sparse(PS_MSG_SPUSH, 1, ++seq, 1, 0);
    CHECK_OK(ask(f, &h, push, push_b, 2, &r, NULL, 0));
    REFUSED(r, PS_EPERM, "worker 1 is held by another");
    h = sparse(PS_MSG_SPULL, 1, ++seq, 1, 0);
    CHECK_OK(ask(f, &h, push, push_b, 1, &r, NULL, 0));
    REFUSED(r, PS_EPERM, "only the connection whose hello was accepted may send for it");
    h = ps_test_header(PS_MSG_PULL, 1, ++seq, KEY, 0, 0);
    CHECK_OK(ps_test_rpc(f, &h, NULL, 0, &r, NULL, 0, NULL));
    REFUSED(r, PS_EPERM, "worker 1");
    /* its heartbeats are no sign of rank 1's life either */
    h = ps_test_header(PS_MSG_HEARTBEAT, 1, ++seq, 0, 0, 0);
    CHECK_OK(ps_test_rpc(f, &h, NULL, 0, &r, NULL, 0, NULL));
    REFUSED(r, PS_EPERM, "worker 1");

    /* the honest workers' step 0: applied (worker 1's is no duplicate) */
    h = ps_test_header(PS_MSG_PUSH, 0, ++seq, KEY, 0, 0);
    CHECK_OK(ps_test_send(a, &h, ga, 4));
    h = ps_test_header(PS_MSG_PUSH, 1, ++seq, KEY, 0, 0);
    CHECK_OK(ps_test_send(b, &h, gb, 4));
    CHECK_OK(ps_test_recv(a, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_PUSH, "worker 0's push: %s", r.err_text);
    CHECK_OK(ps_test_recv(b, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_PUSH, "worker 1's push: %s", r.err_text);
    float rows_a[DIM] = {1, -1}, rows_b[DIM] = {3, 5};
    const void *pa[2] = {&id, rows_a}, *pb[2] = {&id, rows_b};
    h = sparse(PS_MSG_SPUSH, 0, ++seq, 1, 0);
    CHECK_OK(ps_test_send_frames(a, &h, pa, push_b, 2));
    h = sparse(PS_MSG_SPUSH, 1, ++seq, 1, 0);
    CHECK_OK(ps_test_send_frames(b, &h, pb, push_b, 2));
    CHECK_OK(ps_test_recv(a, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_SPUSH, "worker 0's spush: %s", r.err_text);
    CHECK_OK(ps_test_recv(b, PS_TEST_RPC_MS, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_SPUSH, "worker 1's spush: %s", r.err_text);

    /* the weights and the row: the honest gradients alone (sync: their
     * mean in one round; async: one after the other) */
    float want[4], out[4];
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        want[i] = mode == PS_MODE_SYNC ? w[i] - LR * ((ga[i] + gb[i]) / 2)
                                       : (w[i] - LR * ga[i]) - LR * gb[i];
    h = ps_test_header(PS_MSG_PULL, 1, ++seq, KEY, 0, mode == PS_MODE_SYNC ? 1 : 0);
    CHECK_OK(ps_test_rpc(b, &h, NULL, 0, &r, out, 4, &n));
    CHECK_MSG(r.type == PS_MSG_PULL && n == 4, "%s", r.err_text);
    CHECK_EQ_INT(r.chunk_version, 2 - (mode == PS_MODE_SYNC));
    for (int i = 0; i < 4; i++)
        CHECK_MSG(out[i] == want[i], "weight %d is %g, expected %g", i, out[i], want[i]);
    h = sparse(PS_MSG_SPULL, 1, ++seq, 1, 1);
    CHECK_OK(ask(b, &h, push, push_b, 1, &r, got, DIM));
    CHECK_MSG(r.type == PS_MSG_SPULL, "%s", r.err_text);
    for (int k = 0; k < DIM; k++) {
        float e = mode == PS_MODE_SYNC ? -LR * ((rows_a[k] + rows_b[k]) / 2)
                                       : (0 - LR * rows_a[k]) - LR * rows_b[k];
        CHECK_MSG(got[k] == e, "row element %d is %g, expected %g", k, got[k], e);
    }
    ps_stats st;
    CHECK_OK(stats(a, &st));
    CHECK_EQ_INT(st.forged, 5);
    CHECK_EQ_INT(st.dup_dropped, 0);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    CHECK_MSG(ps_test_file_has(sv.log, "refused a message for worker 1 from connection") &&
                  ps_test_file_has(sv.log, "5 requests refused (their rank held by another "
                                           "connection)"),
              "no line about the forged messages in %s", sv.log);
    if (dir)
        CHECK_MSG(ps_test_file_has(sv.log, "key worker-2: the rank is held by connection"),
                  "the log does not name the forger's key: %s", sv.log);
    zmq_close(a);
    zmq_close(b);
    zmq_close(f);
}

PS_TEST(forged_rank_messages_are_refused_and_the_honest_push_applies_async)
{
    forged_case(PS_MODE_ASYNC, NULL);
}

PS_TEST(forged_rank_messages_are_refused_and_the_honest_push_applies_sync)
{
    forged_case(PS_MODE_SYNC, NULL);
}

static const char *curve_keys(void)
{
    static char dir[600];
    char why[512];
    if (!zmq_has("curve"))
        return NULL;
    snprintf(dir, sizeof dir, "%s/rank-conn-keys", ps_test_tmpdir());
    if (ps_curve_keygen(dir, 1, 3, 1, why, sizeof why) != 0) {
        printf("# keygen: %s\n", why);
        return NULL;
    }
    return dir;
}

PS_TEST(forged_rank_messages_under_curve_are_refused_async_and_sync)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    const char *dir = curve_keys();
    CHECK(dir);
    forged_case(PS_MODE_ASYNC, dir);
    forged_case(PS_MODE_SYNC, dir);
}

/* Every message a worker sends under its rank (the table's types from
 * WORKER: 19 today, among them an init of a 1 GiB chunk), sent as worker 0
 * by a connection whose hello for rank 0 was refused: each refused with
 * PS_EPERM, counted, and none of it applied. */
PS_TEST(every_worker_message_past_a_refused_hello_is_refused)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode async --threads 1 --lr 0.5"));
    void *a = ps_test_dealer(sv.port), *f = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 2, -1));
    CHECK_MSG(ps_test_hello(f, 0, PS_MODE_ASYNC, 2, -1) != 0, "a second hello for rank 0");
    ps_header h, r;
    float w[4] = {1, 2, 3, 4};
    h = ps_test_header(PS_MSG_INIT, 0, 1, KEY, 0, 0);
    h.total = 4;
    CHECK_OK(ps_test_rpc(a, &h, w, 4, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    h = declaration(0, 2);
    CHECK_OK(ask(a, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    ps_stats st0;
    CHECK_OK(stats(a, &st0));

    uint64_t ids[2] = {3, 4};
    float pay[4] = {1e30f, 1e30f, 1e30f, 1e30f};
    int sent = 0;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        const ps_msg_info *m = ps_msg_info_of(t);
        /* what only a worker sends, and a pull (a reader's too, as rank -1) */
        if (!m || (m->from != PS_FROM_WORKER && t != PS_MSG_PULL))
            continue;
        h = ps_test_header(t, 0, 100 + t, KEY, 0, 0);
        const void *fr[3] = {pay, NULL, NULL};
        size_t b[3] = {sizeof pay, 0, 0};
        int nf = 0;
        switch (t) {
        case PS_MSG_INIT: /* a new chunk of 1 GiB */
            h.key = 99;
            h.total = 1u << 28;
            /* fall through */
        case PS_MSG_PUSH:
        case PS_MSG_PUSHPULL:
        case PS_MSG_ASSIGN:
        case PS_MSG_SETSTATE:
        case PS_MSG_ALLREDUCE:
        case PS_MSG_BROADCAST:
            h.count = 4;
            h.dtype = PS_DTYPE_F32;
            nf = 1;
            break;
        case PS_MSG_PULL:
        case PS_MSG_STATE:
        case PS_MSG_CLOCK:
        case PS_MSG_BARRIER:
        case PS_MSG_LEAVE:
        case PS_MSG_JOIN:
        case PS_MSG_MEMBERS:
            break;
        case PS_MSG_HYPER: /* lr 1e6 from step 0 on */
            h.hello.mode = PS_MODE_ASYNC;
            h.hello.max_staleness = -1;
            h.hello.num_workers = 2;
            h.hello.num_servers = 1;
            h.hello.opt.kind = PS_OPT_NONE;
            ps_opt_set(&h.hello.opt, PS_OPT_P_lr, 1e6);
            break;
        case PS_MSG_TABLE:
            h = declaration(0, 100 + t);
            h.key = 98;
            break;
        case PS_MSG_SPULL:
        case PS_MSG_SPUSH:
        case PS_MSG_SPUSHPULL:
        case PS_MSG_SASSIGN: /* rows of 1e30 set */
            h = sparse(t, 0, 100 + t, 2, 0);
            fr[0] = ids, b[0] = sizeof ids, nf = 1;
            if (t != PS_MSG_SPULL)
                fr[1] = pay, b[1] = sizeof pay, nf = 2;
            if (t == PS_MSG_SPUSHPULL)
                h.npull = 2, fr[2] = ids, b[2] = sizeof ids, nf = 3;
            break;
        default:
            CHECK_MSG(0, "no attack written for %s: add one", m->name);
        }
        CHECK_MSG(ask(f, &h, fr, b, nf, &r, NULL, 0) == 0, "%s: no reply", m->name);
        CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_EPERM && r.seq == 100 + t &&
                      strstr(r.err_text, "worker 0 is held by another connection"),
                  "%s: got %s %d: %s", m->name, ps_msg_type_name(r.type), r.err_code,
                  r.err_text);
        sent++;
    }
    CHECK_MSG(sent >= 17, "%d worker message types", sent);
    /* nothing moved: no chunk, no table, no update, no row, rank 0 still in */
    ps_stats st;
    CHECK_OK(stats(a, &st));
    CHECK_EQ_INT(st.forged, (uint64_t)sent);
    CHECK_EQ_INT(st.chunks, st0.chunks);
    CHECK_EQ_INT(st.updates, st0.updates);
    CHECK_EQ_INT(st.rows, st0.rows);
    CHECK_EQ_INT(st.partitions, st0.partitions);
    CHECK_EQ_INT(st.inits, st0.inits);
    h = ps_test_header(PS_MSG_PUSH, 0, 500, KEY, 0, 0);
    float g[4] = {2, 2, 2, 2}, out[4];
    CHECK_OK(ps_test_rpc(a, &h, g, 4, &r, NULL, 0, NULL));
    CHECK_MSG(r.type == PS_MSG_PUSH && r.chunk_version == 1, "%s", r.err_text);
    h = ps_test_header(PS_MSG_PULL, 0, 501, KEY, 0, 0);
    CHECK_OK(ps_test_rpc(a, &h, NULL, 0, &r, out, 4, NULL));
    for (int i = 0; i < 4; i++)
        CHECK_MSG(out[i] == w[i] - LR * g[i], "weight %d is %g", i, out[i]);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(a);
    zmq_close(f);
}

/* A worker whose connection closed, or a reconnected libps with the rank's
 * token, gets its rank back: its requests on the new connection get
 * PS_EHELLO (no live holder) or PS_EPERM (the old one still counts), and
 * after a hello they go through. */
PS_TEST(a_worker_on_a_new_connection_takes_its_rank_back_by_hello)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --threads 1"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    ps_header h = ps_test_header(PS_MSG_HELLO, 0, 1, 0, 0, 0), r;
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.max_staleness = -1;
    h.hello.num_workers = 1;
    h.hello.num_servers = 1;
    h.hello.opt.kind = PS_OPT_NONE;
    CHECK_OK(ask(a, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    uint64_t tok = r.hello.token;
    /* the old connection is still open: PS_EPERM; the token takes it over */
    ps_header p = ps_test_header(PS_MSG_CLOCK, 0, 2, KEY, 0, 0);
    CHECK_OK(ask(b, &p, NULL, NULL, 0, &r, NULL, 0));
    REFUSED(r, PS_EPERM, "worker 0 is held by another connection");
    h.hello.token = tok;
    h.seq = 3;
    CHECK_OK(ask(b, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_EQ_INT(r.type, PS_MSG_HELLO);
    p.seq = 4;
    CHECK_OK(ask(b, &p, NULL, NULL, 0, &r, NULL, 0));
    REFUSED(r, PS_ENOTFOUND, "key 5"); /* past the rank check: no such chunk */
    /* the old one is not the rank's any more */
    p.seq = 5;
    CHECK_OK(ask(a, &p, NULL, NULL, 0, &r, NULL, 0));
    REFUSED(r, PS_EPERM, "worker 0 is held by another connection");
    /* the holder closes: its rank waits for a hello, PS_EHELLO till then */
    zmq_close(b);
    int ehello = 0;
    for (int t = 0; t < 100 && !ehello; t++) { /* the close reaches the server in a few ms */
        p.seq = 10 + (uint64_t)t;
        CHECK_OK(ask(a, &p, NULL, NULL, 0, &r, NULL, 0));
        ehello = r.type == PS_MSG_ERROR && r.err_code == PS_EHELLO;
        if (!ehello)
            ps_test_sleep_ms(20);
    }
    CHECK_MSG(ehello, "got %d: %s", r.err_code, r.err_text);
    CHECK(strstr(r.err_text, "say hello on it first"));
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    ps_stats st;
    CHECK_OK(stats(a, &st));
    CHECK_MSG(st.forged >= 2, "forged %llu", (unsigned long long)st.forged);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(a);
}
