/* libps and moved objects (docs/PROTOCOL.md "Moved objects"): what a client
 * does with PS_EMOVED, against fake servers (a ROUTER each, in a thread of
 * this process) that answer as each case scripts them: a request for an
 * object that is "not here" gets PS_EMOVED naming the server slot that holds
 * it now (and its endpoint), or -1 when the server left the job.
 * Every wait is bounded. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_proto.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define WAIT_MS 5000
#define TKEY 7   /* the dense tensor: NELEM floats, one chunk */
#define NELEM 8
#define TABLE 41 /* the table: DIM floats a row */
#define DIM 4
#define LOGN 256

typedef struct fake {
    char ep[64];
    void *ctx, *sock;
    pthread_t th;
    pthread_mutex_t mu;
    ps_hello cfg; /* the hello reply: server_rank is its slot */
    /* the script (under mu): requests for (move_key, move_chunk) without
     * flag AWAY (every key: 0; every chunk: -1) are answered PS_EMOVED naming
     * move_slot (-2: none) at move_ep, move_times times (-1: always) */
    int move_slot;
    char move_ep[PS_ENDPOINT_MAX];
    uint64_t move_key;
    int move_chunk;
    int move_times;
    int move_home; /* >= 0: only the requests with AWAY and that home instead */
    int left; /* heartbeats too are answered "left" (slot -1) */
    /* what it saw (under mu) */
    int stop;
    int nhello, nhb;
    ps_header log[LOGN]; /* every other request, in order */
    int nlog;
} fake;

/* The reply a real server gives q when it holds the object (f->mu held). */
static void answer(fake *f, zmq_msg_t *id, const ps_header *q, const zmq_msg_t *frames, int nf)
{
    ps_header h;
    ps_header_init(&h, q->type);
    h.flags = PS_FLAG_REPLY;
    h.seq = q->seq;
    h.key = q->key;
    h.chunk = q->chunk;
    float rows[4096];
    size_t n = 0;
    if (q->type == PS_MSG_HELLO) {
        h.hello = f->cfg;
    } else if (q->type == PS_MSG_PULL) {
        n = NELEM;
        for (size_t k = 0; k < n; k++)
            rows[k] = (float)k + 0.5f;
        h.count = n;
        h.dtype = PS_DTYPE_F32;
    } else if (q->type == PS_MSG_LOOKUP && nf > 1) {
        /* frame 1: its tables (16 bytes each: key, ids, dim); frame 2: the ids */
        const unsigned char *ent = zmq_msg_data((zmq_msg_t *)&frames[0]);
        const uint64_t *ids = zmq_msg_data((zmq_msg_t *)&frames[1]);
        size_t nent = zmq_msg_size((zmq_msg_t *)&frames[0]) / 16, k = 0;
        for (size_t e = 0; e < nent; e++) {
            uint32_t cnt, dim;
            memcpy(&cnt, ent + 16 * e + 8, 4);
            memcpy(&dim, ent + 16 * e + 12, 4);
            for (uint32_t j = 0; j < cnt && n + dim <= 4096; j++, k++)
                for (uint32_t d = 0; d < dim; d++)
                    rows[n++] = d == 0 ? (float)ids[k] : (float)f->cfg.server_rank;
        }
        h.key = 0;
        h.count = n;
        h.dtype = PS_DTYPE_F32;
    } else if (q->type == PS_MSG_SPULL && nf > 0) {
        /* each row: its id, then the slot that answered */
        const uint64_t *ids = zmq_msg_data((zmq_msg_t *)&frames[0]);
        for (size_t k = 0; k < q->count && (k + 1) * DIM <= 4096; k++)
            for (size_t e = 0; e < DIM; e++)
                rows[k * DIM + e] = e == 0 ? (float)ids[k] : (float)f->cfg.server_rank;
        n = q->count * DIM;
        h.count = q->count;
        h.dim = DIM;
        h.dtype = PS_DTYPE_F32;
    }
    ps_test_reply(f->sock, id, &h, n ? rows : NULL, n * sizeof(float));
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int stop = f->stop;
        pthread_mutex_unlock(&f->mu);
        if (stop)
            break;
        zmq_pollitem_t it = {f->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5) <= 0)
            continue;
        zmq_msg_t id, hm, fr[4];
        zmq_msg_init(&id);
        zmq_msg_init(&hm);
        zmq_msg_recv(&id, f->sock, 0);
        zmq_msg_recv(&hm, f->sock, 0);
        int nf = 0;
        for (int more = zmq_msg_more(&hm); more; nf++) {
            zmq_msg_init(&fr[nf < 4 ? nf : 3]);
            zmq_msg_recv(&fr[nf < 4 ? nf : 3], f->sock, 0);
            more = zmq_msg_more(&fr[nf < 4 ? nf : 3]);
        }
        ps_header q;
        if (ps_proto_decode(zmq_msg_data(&hm), zmq_msg_size(&hm), &q, NULL, 0) == 0) {
            pthread_mutex_lock(&f->mu);
            int moved = 0;
            if (q.type == PS_MSG_HELLO) {
                f->nhello++;
            } else if (q.type == PS_MSG_HEARTBEAT) {
                f->nhb++;
                moved = f->left;
            } else {
                if (f->nlog < LOGN)
                    f->log[f->nlog++] = q;
                moved = q.type != PS_MSG_TABLE && f->move_slot >= -1 && f->move_times != 0 &&
                        (!f->move_key || q.key == f->move_key) &&
                        (f->move_chunk < 0 || (int)q.chunk == f->move_chunk) &&
                        (f->move_home < 0 ? !(q.flags & PS_FLAG_AWAY)
                                          : (q.flags & PS_FLAG_AWAY) && q.home == f->move_home);
                if (moved && f->move_times > 0)
                    f->move_times--;
            }
            if (moved) {
                ps_header h;
                ps_header_init(&h, PS_MSG_ERROR);
                h.flags = PS_FLAG_REPLY;
                h.seq = q.seq;
                h.err_code = PS_EMOVED;
                h.slot = q.type == PS_MSG_HEARTBEAT ? -1 : f->move_slot;
                snprintf(h.owner_ep, sizeof h.owner_ep, "%s", f->move_ep);
                snprintf(h.err_text, sizeof h.err_text, "not here");
                ps_test_reply(f->sock, &id, &h, NULL, 0);
            } else if (q.type != PS_MSG_HEARTBEAT || !f->left) {
                answer(f, &id, &q, fr, nf < 4 ? nf : 4);
            }
            pthread_mutex_unlock(&f->mu);
        }
        for (int k = 0; k < nf && k < 4; k++)
            zmq_msg_close(&fr[k]);
        zmq_msg_close(&id);
        zmq_msg_close(&hm);
    }
    zmq_close(f->sock);
    return NULL;
}

/* A fake server at slot `slot` of a job whose hellos list ns servers, with
 * `threads` table partitions; running. */
static int fake_start(fake *f, int slot, int ns, int threads)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->cfg.mode = PS_MODE_ASYNC;
    f->cfg.max_staleness = -1;
    f->cfg.num_workers = 1;
    f->cfg.num_servers = (uint32_t)ns;
    f->cfg.server_rank = slot;
    f->cfg.threads = (uint32_t)threads;
    f->cfg.opt.kind = PS_OPT_SGD;
    f->cfg.opt.lr = 0.1f;
    f->cfg.opt.given = PS_OPT_GIVEN(lr);
    f->move_slot = -2;
    f->move_chunk = -1;
    f->move_home = -1;
    f->ctx = zmq_ctx_new();
    f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->sock, ZMQ_LINGER, &linger, sizeof linger);
    for (int tries = 0; tries < 20; tries++) {
        snprintf(f->ep, sizeof f->ep, "tcp://127.0.0.1:%d", ps_test_free_port());
        if (zmq_bind(f->sock, f->ep) == 0) {
            pthread_create(&f->th, NULL, fake_main, f);
            return 0;
        }
    }
    return -1;
}

static void fake_stop(fake *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL);
    zmq_ctx_term(f->ctx);
    pthread_mutex_destroy(&f->mu);
}

/* Answer requests for (key, chunk) PS_EMOVED naming slot at ep, times times. */
static void fake_move(fake *f, uint64_t key, int chunk, int slot, const char *ep, int times)
{
    pthread_mutex_lock(&f->mu);
    f->move_key = key;
    f->move_chunk = chunk;
    f->move_slot = slot;
    snprintf(f->move_ep, sizeof f->move_ep, "%s", ep ? ep : "");
    f->move_times = times;
    pthread_mutex_unlock(&f->mu);
}

static int fake_int(fake *f, const int *v)
{
    pthread_mutex_lock(&f->mu);
    int x = *v;
    pthread_mutex_unlock(&f->mu);
    return x;
}

/* How many requests of type (0: any) for key (0: any) f logged; with
 * flags_set, only those carrying all of them; home >= 0: with that home. */
static int fake_count(fake *f, uint32_t type, uint64_t key, int chunk, uint32_t flags, int home)
{
    pthread_mutex_lock(&f->mu);
    int n = 0;
    for (int k = 0; k < f->nlog; k++) {
        const ps_header *q = &f->log[k];
        if ((!type || q->type == type) && (!key || q->key == key) &&
            (chunk < 0 || (int)q->chunk == chunk) && (q->flags & flags) == flags &&
            (home < 0 || q->home == home))
            n++;
    }
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* A client of the servers eps (the homes), one worker of an async job, with
 * the dense tensor and (tables) the table registered, started. */
static ps_client *client(const char *eps, int tables, int heartbeat_ms)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = eps;
    o.rank = 0;
    o.num_workers = 1;
    o.mode = PS_MODE_ASYNC;
    o.hello_timeout_ms = WAIT_MS;
    o.heartbeat_ms = heartbeat_ms;
    o.server_timeout_ms = WAIT_MS;
    ps_client *c;
    if (ps_client_open(&o, &c) != 0)
        return NULL;
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = DIM;
    if (ps_client_register(c, TKEY, NELEM) != 0 ||
        (tables && ps_client_register_table(c, TABLE, &t) != 0) || ps_client_start(c) != 0) {
        fprintf(stderr, "client: %s\n", ps_client_last_error(c));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

/* 1 when r completed within WAIT_MS. */
static int done_soon(ps_request *r)
{
    for (int t = 0; t < WAIT_MS; t++) {
        if (ps_request_test(r))
            return 1;
        ps_test_sleep_ms(1);
    }
    return ps_request_test(r);
}

/* Push step `step` of the dense tensor and wait: its status. */
static int push(ps_client *c, int64_t step, ps_request *r)
{
    float g[NELEM] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (ps_client_push(c, TKEY, g, step, r) != 0 || !done_soon(r))
        return -1;
    return ps_request_wait(r);
}

/* ---------------------------------------------------------------------- */

PS_TEST(a_dense_push_follows_emoved_to_a_new_slot_and_goes_there_next_time)
{
    fake f0, f2;
    CHECK_OK(fake_start(&f0, 0, 1, 1));
    CHECK_OK(fake_start(&f2, 2, 1, 1)); /* slot 2: slot 1 was never added */
    fake_move(&f0, TKEY, 0, 2, f2.ep, -1);
    ps_client *c = client(f0.ep, 0, 0);
    CHECK(c != NULL);
    ps_request r;
    CHECK_EQ_INT(push(c, 0, &r), 0);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_PUSH, TKEY, 0, 0, -1), 1);
    CHECK_EQ_INT(fake_int(&f2, &f2.nhello), 1); /* said hello before the push went */
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PUSH, TKEY, 0, 0, -1), 1);
    /* the next push of the chunk goes straight to slot 2, and a pull too */
    CHECK_EQ_INT(push(c, 1, &r), 0);
    float w[NELEM];
    CHECK_OK(ps_client_pull(c, TKEY, w, 0, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK(w[3] == 3.5f);
    CHECK_EQ_INT(fake_count(&f0, 0, TKEY, -1, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PUSH, TKEY, 0, 0, -1), 2);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PULL, TKEY, 0, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f2, 0, 0, -1, PS_FLAG_AWAY, -1), 0); /* chunks carry no AWAY */
    CHECK_EQ_INT(fake_int(&f2, &f2.nhello), 1);
    /* stats of the added slot by its index; of an unknown slot refused */
    ps_stats st;
    CHECK_OK(ps_client_stats(c, 2, &st));
    CHECK_EQ_INT(ps_client_stats(c, 1, &st), PS_EINVAL);
    ps_client_close(c);
    fake_stop(&f0);
    fake_stop(&f2);
}

PS_TEST(b_emoved_naming_the_same_slot_is_asked_again_after_a_pause)
{
    fake f0;
    CHECK_OK(fake_start(&f0, 0, 1, 1));
    fake_move(&f0, TKEY, 0, 0, NULL, 3); /* "on its way here", three times */
    ps_client *c = client(f0.ep, 0, 0);
    CHECK(c != NULL);
    ps_request r;
    CHECK_EQ_INT(push(c, 0, &r), 0);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_PUSH, TKEY, 0, 0, -1), 4);
    CHECK_EQ_INT(fake_int(&f0, &f0.move_times), 0);
    ps_client_close(c);
    fake_stop(&f0);
}

/* An id of TABLE whose row lives in partition `part` of home `home` of ns
 * homes with nparts partitions each. */
static uint64_t id_in(int home, uint32_t part, int ns, uint32_t nparts)
{
    for (uint64_t id = 1;; id++) {
        uint64_t h = ps_table_row_hash(TABLE, id);
        if (ps_table_row_server(h, ns) == home && ps_table_row_part(h, ns, nparts) == part)
            return id;
    }
}

PS_TEST(c_table_requests_to_a_moved_partition_carry_away_and_their_home)
{
    fake f0, f1, f2;
    CHECK_OK(fake_start(&f0, 0, 2, 2));
    CHECK_OK(fake_start(&f1, 1, 2, 2));
    CHECK_OK(fake_start(&f2, 2, 2, 2));
    fake_move(&f1, TABLE, 1, 2, f2.ep, -1); /* home 1's partition 1 is at slot 2 */
    char eps[200];
    snprintf(eps, sizeof eps, "%s,%s", f0.ep, f1.ep);
    ps_client *c = client(eps, 1, 0);
    CHECK(c != NULL);
    uint64_t ids[2] = {id_in(1, 1, 2, 2), id_in(0, 1, 2, 2)};
    float g[2 * DIM] = {0};
    ps_request r;
    CHECK_OK(ps_client_sparse_push(c, TABLE, ids, 2, g, 0, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    /* every partition got the push: the moved one at slot 2, away from home 1 */
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_SPUSH, TABLE, 1, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_SPUSH, TABLE, 1, 0, -1), 1); /* the redirected one */
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_SPUSH, TABLE, 0, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_SPUSH, TABLE, -1, 0, -1), 2);
    CHECK_EQ_INT(fake_count(&f0, 0, 0, -1, PS_FLAG_AWAY, -1), 0);
    CHECK_EQ_INT(fake_count(&f1, 0, 0, -1, PS_FLAG_AWAY, -1), 0);
    /* a pull goes straight there, the other partition's home */
    float rows[2 * DIM];
    CHECK_OK(ps_client_sparse_pull(c, TABLE, ids, 2, rows, 0, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK(rows[0] == (float)ids[0] && rows[1] == 2.0f); /* from slot 2 */
    CHECK(rows[DIM] == (float)ids[1] && rows[DIM + 1] == 0.0f); /* from home 0 */
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_SPULL, TABLE, 1, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_SPULL, TABLE, -1, 0, -1), 0);
    /* a lookup reads the moved partition where it is, away from home */
    memset(rows, 0, sizeof rows);
    const uint64_t key = TABLE, *idp = ids;
    const size_t cnt = 2;
    float *rp = rows;
    CHECK_OK(ps_client_lookup(c, 1, &key, &idp, &cnt, &rp, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK(rows[0] == (float)ids[0] && rows[1] == 2.0f);
    CHECK(rows[DIM] == (float)ids[1] && rows[DIM + 1] == 0.0f);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_LOOKUP, 0, 1, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_LOOKUP, 0, -1, 0, -1), 0);
    /* the table's clock: every home partition, the moved one where it is */
    CHECK_OK(ps_client_clock(c, TABLE, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_CLOCK, TABLE, 1, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_CLOCK, TABLE, -1, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_CLOCK, TABLE, -1, 0, -1), 2);
    ps_client_close(c);
    fake_stop(&f0);
    fake_stop(&f1);
    fake_stop(&f2);
}

PS_TEST(d_a_server_that_left_gets_no_heartbeats_and_its_objects_are_found_via_their_homes)
{
    fake f0, f2;
    CHECK_OK(fake_start(&f0, 0, 1, 1));
    CHECK_OK(fake_start(&f2, 2, 1, 1));
    fake_move(&f0, TKEY, 0, 2, f2.ep, 1); /* moved to slot 2 once */
    ps_client *c = client(f0.ep, 0, 20);
    CHECK(c != NULL);
    ps_request r;
    CHECK_EQ_INT(push(c, 0, &r), 0);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PUSH, TKEY, 0, 0, -1), 1);
    /* slot 2 hears heartbeats once it took us */
    for (int t = 0; t < WAIT_MS && fake_int(&f2, &f2.nhb) < 2; t++)
        ps_test_sleep_ms(1);
    CHECK(fake_int(&f2, &f2.nhb) >= 2);
    /* it leaves (a request learns it): its object went back home (slot 0
     * holds it again) */
    fake_move(&f2, 0, -1, -1, NULL, -1);
    CHECK_EQ_INT(push(c, 1, &r), 0);
    pthread_mutex_lock(&f2.mu);
    f2.left = 1; /* and so would any heartbeat still on its way */
    pthread_mutex_unlock(&f2.mu);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PUSH, TKEY, 0, 0, -1), 2);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_PUSH, TKEY, 0, 0, -1), 2);
    /* no more heartbeats there (a few may have been on their way), home's go on */
    ps_test_sleep_ms(100);
    int hb2 = fake_int(&f2, &f2.nhb), hb0 = fake_int(&f0, &f0.nhb);
    ps_test_sleep_ms(200);
    CHECK_EQ_INT(fake_int(&f2, &f2.nhb), hb2);
    CHECK(fake_int(&f0, &f0.nhb) > hb0);
    /* the next push goes home at once; a leave completes without slot 2 */
    CHECK_EQ_INT(push(c, 2, &r), 0);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_PUSH, TKEY, 0, 0, -1), 2);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_PUSH, TKEY, 0, 0, -1), 3);
    CHECK_OK(ps_client_leave(c));
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_LEAVE, 0, -1, 0, -1), 0);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_LEAVE, 0, -1, 0, -1), 1);
    ps_stats st;
    CHECK_EQ_INT(ps_client_stats(c, 2, &st), PS_EINVAL);
    CHECK(strstr(ps_client_last_error(c), "left the job") != NULL);
    ps_client_close(c);
    fake_stop(&f0);
    fake_stop(&f2);
}

PS_TEST(f_a_home_that_left_sends_its_partitions_to_server_0_which_names_the_owner)
{
    fake f0, f1, f2;
    CHECK_OK(fake_start(&f0, 0, 2, 1));
    CHECK_OK(fake_start(&f1, 1, 2, 1));
    CHECK_OK(fake_start(&f2, 2, 2, 1));
    char eps[200];
    snprintf(eps, sizeof eps, "%s,%s", f0.ep, f1.ep);
    ps_client *c = client(eps, 1, 0);
    CHECK(c != NULL);
    fake_move(&f1, 0, -1, -1, NULL, -1); /* home 1 left the job */
    fake_move(&f0, TABLE, 0, 2, f2.ep, -1);
    pthread_mutex_lock(&f0.mu);
    f0.move_home = 1; /* server 0 knows where home 1's partition went */
    pthread_mutex_unlock(&f0.mu);
    ps_request r;
    CHECK_OK(ps_client_sparse_push(c, TABLE, NULL, 0, NULL, 0, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_SPUSH, TABLE, 0, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_SPUSH, TABLE, 0, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_SPUSH, TABLE, 0, PS_FLAG_AWAY, 1), 1);
    /* the next one goes straight to its owner; server 0's own partition home */
    CHECK_OK(ps_client_sparse_push(c, TABLE, NULL, 0, NULL, 1, &r));
    CHECK(done_soon(&r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_EQ_INT(fake_count(&f1, PS_MSG_SPUSH, TABLE, -1, 0, -1), 1);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_SPUSH, TABLE, 0, PS_FLAG_AWAY, 1), 1);
    CHECK_EQ_INT(fake_count(&f2, PS_MSG_SPUSH, TABLE, 0, PS_FLAG_AWAY, 1), 2);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_SPUSH, TABLE, 0, 0, -1), 3); /* 2 its own, 1 away */
    ps_client_close(c);
    fake_stop(&f0);
    fake_stop(&f1);
    fake_stop(&f2);
}

PS_TEST(e_bad_emoved_replies_fail_the_request_with_a_clear_error)
{
    fake f0;
    CHECK_OK(fake_start(&f0, 0, 1, 1));
    ps_client *c = client(f0.ep, 0, 0);
    CHECK(c != NULL);
    ps_request r;
    struct { int slot; const char *ep; const char *says; } bad[] = {
        {2, "not-an-endpoint", "does not check"},
        {2, "", "without its endpoint"},
        {5000, "tcp://127.0.0.1:5", "beyond"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        fake_move(&f0, TKEY, 0, bad[k].slot, bad[k].ep, 1);
        CHECK_EQ_INT(push(c, (int64_t)k, &r), PS_EPROTO);
        CHECK_MSG(strstr(r.err, bad[k].says) != NULL, "case %zu: %s", k, r.err);
    }
    /* server 0 never leaves: a "left" from it is refused too */
    fake_move(&f0, TKEY, 0, -1, NULL, 1);
    CHECK_EQ_INT(push(c, 3, &r), PS_EPROTO);
    CHECK(strstr(r.err, "never removed") != NULL);
    /* nothing was routed anywhere: the next push goes to server 0 and works */
    CHECK_EQ_INT(push(c, 4, &r), 0);
    CHECK_EQ_INT(fake_count(&f0, PS_MSG_PUSH, TKEY, 0, 0, -1), 5);
    ps_client_close(c);
    fake_stop(&f0);
}
