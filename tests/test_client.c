/* libps semantics.
 *
 * Two kinds of peer:
 *  - a fake server (a ROUTER in a thread of this process) that answers as the
 *    test scripts it: holds a reply, drops a request, answers twice, answers
 *    with an error.  These cases check the client's own machinery exactly.
 *  - the real bin/ps_server, for the sync / async / staleness semantics.
 *    Those cases SKIP when bin/ps_server is not built.
 * Every wait is bounded. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_placement.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define WAIT_MS 5000

/* 1 when r completed within ms */
static int wait_ms(ps_request *r, int ms)
{
    for (int t = 0; t < ms; t++) {
        if (ps_request_test(r))
            return 1;
        ps_test_sleep_ms(1);
    }
    return ps_request_test(r);
}

static int same_bits(const float *a, const float *b, size_t n, size_t *where)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            *where = i;
            return 0;
        }
    return 1;
}

/* ======================================================================
 * Fake server
 * ====================================================================== */

typedef struct fake {
    char ep[64];
    void *ctx, *sock;
    ps_curve_auth *auth;   /* CURVE handler when started with keys */
    pthread_t th;
    pthread_mutex_t mu;
    /* script (set before start, or under mu) */
    ps_hello cfg;          /* hello reply config */
    int hello_err;         /* answer hello with this error */
    int close_after_hello; /* go away after answering hello */
    int hold;              /* keep data requests unanswered until release */
    int drop_first;        /* ignore the first data request */
    int dup_reply;         /* answer every data request twice */
    int data_err;          /* answer data requests with this error */
    int bad_count;         /* pull replies carry one element too many */
    int garbage_first;     /* send a non-msgpack frame before the first reply */
    size_t tensor_len, chunk_elems; /* to size pull replies */
    int64_t version;       /* data replies carry s = version + chunk */
    ps_stats stats;
    /* what it saw (under mu) */
    int stop, release;
    int nhello, ndata, nbarrier, nstats, nshutdown;
    ps_header last;
    float last_payload[64];
    size_t last_bytes;
    uint64_t seqs[16];
} fake;

static void fake_answer(fake *f, zmq_msg_t *id, const ps_header *q)
{
    ps_header h;
    if (f->data_err) {
        ps_header_init(&h, PS_MSG_ERROR);
        h.err_code = f->data_err;
        snprintf(h.err_text, sizeof h.err_text, "key %llu chunk %u is not initialized",
                 (unsigned long long)q->key, q->chunk);
    } else {
        ps_header_init(&h, q->type);
        h.chunk_version = f->version + q->chunk;
    }
    h.flags = PS_FLAG_REPLY;
    h.seq = q->seq;
    h.key = q->key;
    h.chunk = q->chunk;
    float vals[4096];
    size_t n = 0;
    if (!f->data_err && (q->type == PS_MSG_PULL || q->type == PS_MSG_PUSHPULL)) {
        size_t off = (size_t)q->chunk * f->chunk_elems;
        n = f->tensor_len - off < f->chunk_elems ? f->tensor_len - off : f->chunk_elems;
        n += (size_t)f->bad_count;
        for (size_t i = 0; i < n && i < 4096; i++)
            vals[i] = (float)(q->chunk * 1000 + i) + 0.5f;
        h.count = n;
        h.dtype = PS_DTYPE_F32;
    }
    for (int k = 0; k < (f->dup_reply ? 2 : 1); k++)
        ps_test_reply(f->sock, id, &h, n ? vals : NULL, n * sizeof(float));
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    zmq_msg_t held_id;
    ps_header held;
    int have_held = 0, first_reply = 1;
    zmq_msg_init(&held_id);
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int stop = f->stop, release = f->release;
        pthread_mutex_unlock(&f->mu);
        if (stop)
            break;
        if (have_held && release) {
            fake_answer(f, &held_id, &held);
            have_held = 0;
        }
        if (!f->sock) {
            ps_test_sleep_ms(5);
            continue;
        }
        zmq_pollitem_t it = {f->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5) <= 0)
            continue;
        zmq_msg_t id, hm, pm;
        zmq_msg_init(&id);
        zmq_msg_init(&hm);
        zmq_msg_init(&pm);
        zmq_msg_recv(&id, f->sock, 0);
        zmq_msg_recv(&hm, f->sock, 0);
        int has_pay = zmq_msg_more(&hm);
        if (has_pay)
            zmq_msg_recv(&pm, f->sock, 0);
        ps_header q;
        if (ps_proto_decode(zmq_msg_data(&hm), zmq_msg_size(&hm), &q, NULL, 0) != 0)
            goto next;
        if (f->garbage_first && first_reply) {
            zmq_msg_t cp;
            zmq_msg_init(&cp);
            zmq_msg_copy(&cp, &id);
            zmq_msg_send(&cp, f->sock, ZMQ_SNDMORE);
            zmq_send(f->sock, "\xc1garbage", 8, 0);
        }
        first_reply = 0;
        pthread_mutex_lock(&f->mu);
        if (q.type == PS_MSG_HELLO) {
            f->nhello++;
            ps_hello cfg = f->cfg;
            pthread_mutex_unlock(&f->mu);
            ps_header h;
            if (f->hello_err) {
                ps_header_init(&h, PS_MSG_ERROR);
                h.err_code = f->hello_err;
                snprintf(h.err_text, sizeof h.err_text, "mode: server has async, worker has %s",
                         ps_mode_name(q.hello.mode));
            } else {
                ps_header_init(&h, PS_MSG_HELLO);
                h.hello = cfg;
            }
            h.flags = PS_FLAG_REPLY;
            h.seq = q.seq;
            ps_test_reply(f->sock, &id, &h, NULL, 0);
            if (f->close_after_hello) {
                int linger = 1000;
                zmq_setsockopt(f->sock, ZMQ_LINGER, &linger, sizeof linger);
                zmq_close(f->sock);
                f->sock = NULL;
            }
        } else if (q.type >= PS_MSG_INIT && q.type <= PS_MSG_PUSHPULL) {
            int nth = f->ndata++;
            if (nth < 16)
                f->seqs[nth] = q.seq;
            f->last = q;
            f->last_bytes = has_pay ? zmq_msg_size(&pm) : 0;
            if (f->last_bytes <= sizeof f->last_payload)
                memcpy(f->last_payload, zmq_msg_data(&pm), f->last_bytes);
            int hold = f->hold, drop = f->drop_first && nth == 0;
            pthread_mutex_unlock(&f->mu);
            if (drop) {
                /* pretend it was lost */
            } else if (hold) {
                zmq_msg_copy(&held_id, &id);
                held = q;
                have_held = 1;
            } else {
                fake_answer(f, &id, &q);
            }
        } else {
            ps_header h;
            ps_header_init(&h, q.type);
            h.flags = PS_FLAG_REPLY;
            h.seq = q.seq;
            h.barrier_id = q.barrier_id; /* the only `s` of these replies */
            if (q.type == PS_MSG_BARRIER)
                f->nbarrier++;
            if (q.type == PS_MSG_SHUTDOWN)
                f->nshutdown++;
            if (q.type == PS_MSG_STATS) {
                f->nstats++;
                h.stats = f->stats;
            }
            pthread_mutex_unlock(&f->mu);
            ps_test_reply(f->sock, &id, &h, NULL, 0);
        }
    next:
        zmq_msg_close(&id);
        zmq_msg_close(&hm);
        zmq_msg_close(&pm);
    }
    zmq_msg_close(&held_id);
    if (f->sock)
        zmq_close(f->sock);
    return NULL;
}

/* Bind a fake server with config cfg on a free port; the socket is handed to
 * the fake's thread (pthread_create is the barrier ZeroMQ asks for).  With
 * curve_dir, the ROUTER is a CURVE server accepting DIR/authorized keys. */
static int fake_start_curve(fake *f, int rank, int ns, int nw, int mode, float lr,
                            const char *curve_dir)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    f->cfg.mode = mode;
    f->cfg.max_staleness = mode == PS_MODE_SYNC ? 0 : -1;
    f->cfg.num_workers = (uint32_t)nw;
    f->cfg.num_servers = (uint32_t)ns;
    f->cfg.server_rank = rank;
    f->cfg.opt.kind = PS_OPT_SGD;
    f->cfg.opt.lr = lr;
    f->cfg.opt.given = PS_OPT_GIVEN(lr); /* a server names its whole config */
    f->tensor_len = 10;
    f->chunk_elems = 1 << 20;
    f->ctx = zmq_ctx_new();
    f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(f->sock, ZMQ_LINGER, &linger, sizeof linger);
    char why[512];
    if (curve_dir && ps_curve_server_setup(f->ctx, f->sock, curve_dir, rank, &f->auth, why,
                                           sizeof why) != 0) {
        fprintf(stderr, "fake: %s\n", why);
        return -1;
    }
    for (int tries = 0; tries < 20; tries++) {
        snprintf(f->ep, sizeof f->ep, "tcp://127.0.0.1:%d", ps_test_free_port());
        if (zmq_bind(f->sock, f->ep) == 0)
            return 0;
    }
    return -1;
}

static int fake_start(fake *f, int rank, int ns, int nw, int mode, float lr)
{
    return fake_start_curve(f, rank, ns, nw, mode, lr, NULL);
}

static void fake_run(fake *f) { pthread_create(&f->th, NULL, fake_main, f); }

static void fake_stop(fake *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL); /* the thread closed the ROUTER */
    ps_curve_auth_stop(f->auth);
    zmq_ctx_term(f->ctx);
    pthread_mutex_destroy(&f->mu);
}

static int fake_get(fake *f, const int *field)
{
    pthread_mutex_lock(&f->mu);
    int v = *field;
    pthread_mutex_unlock(&f->mu);
    return v;
}

/* wait until *field >= want (bounded) */
static int fake_wait(fake *f, const int *field, int want)
{
    for (int t = 0; t < WAIT_MS; t++) {
        if (fake_get(f, field) >= want)
            return 1;
        ps_test_sleep_ms(1);
    }
    return 0;
}

static void opts(ps_client_options *o, const char *eps, int rank, int nw, int mode)
{
    ps_client_options_default(o);
    o->servers = eps;
    o->rank = rank;
    o->num_workers = nw;
    o->mode = mode;
    o->hello_timeout_ms = WAIT_MS;
}

/* open + register one tensor + start; on failure *out is NULL and why holds
 * the reason */
static int connect_one(ps_client_options *o, uint64_t key, size_t n, ps_client **out, char *why,
                       size_t why_len)
{
    *out = NULL;
    ps_client *c;
    int rc = ps_client_open(o, &c);
    if (rc) {
        snprintf(why, why_len, "open: %s", ps_strerror(rc));
        return rc;
    }
    if (n && (rc = ps_client_register(c, key, n)) != 0) {
        snprintf(why, why_len, "register: %s", ps_strerror(rc));
        ps_client_close(c);
        return rc;
    }
    rc = ps_client_start(c);
    if (rc) {
        snprintf(why, why_len, "%s", ps_client_last_error(c));
        ps_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* connect_one with wire type dt (ps_client_set_wire_dtype before start) */
static int connect_one_dt(ps_client_options *o, uint64_t key, size_t n, uint32_t dt,
                          ps_client **out, char *why, size_t why_len)
{
    *out = NULL;
    ps_client *c;
    int rc = ps_client_open(o, &c);
    if (rc) {
        snprintf(why, why_len, "open: %s", ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_client_set_wire_dtype(c, (int)dt)) != 0 ||
        (rc = ps_client_register(c, key, n)) != 0 || (rc = ps_client_start(c)) != 0) {
        snprintf(why, why_len, "%s", ps_client_last_error(c));
        ps_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Run f and connect a client to it as the one worker of an async job, with
 * tensor `key` of n elements registered (request_timeout_ms 0 keeps the
 * default).  When that fails, f is stopped again and why says why. */
static int fake_connect(fake *f, uint64_t key, size_t n, int request_timeout_ms, ps_client **c,
                        char *why, size_t why_len)
{
    fake_run(f);
    ps_client_options o;
    opts(&o, f->ep, 0, 1, PS_MODE_ASYNC);
    if (request_timeout_ms)
        o.request_timeout_ms = request_timeout_ms;
    int rc = connect_one(&o, key, n, c, why, why_len);
    if (rc)
        fake_stop(f);
    return rc;
}

/* ---------------------------------------------------------------------- */

PS_TEST(open_refuses_bad_options)
{
    ps_client_options o;
    ps_client *c = (ps_client *)1;
    opts(&o, NULL, 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK(c == NULL);
    opts(&o, " , ", 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    opts(&o, "tcp://127.0.0.1:1", 2, 2, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    opts(&o, "tcp://127.0.0.1:1", 0, 1, 7);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    opts(&o, "not-an-endpoint", 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK(c == NULL);
    /* a good one: posting before start is refused and the request is done */
    opts(&o, "tcp://127.0.0.1:1, tcp://127.0.0.1:2", 0, 1, PS_MODE_SYNC);
    o.chunk_bytes = 4096;
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_EQ_INT(ps_client_num_servers(c), 2);
    CHECK_EQ_INT(ps_client_chunk_elems(c), 1024);
    float x[4] = {0};
    ps_request r;
    CHECK_EQ_INT(ps_client_push(c, 1, x, 0, &r), PS_ESTATE);
    CHECK(ps_request_test(&r));
    CHECK_EQ_INT(ps_request_wait(&r), PS_ESTATE);
    CHECK_OK(ps_client_register(c, 1, 4));
    CHECK_EQ_INT(ps_client_register(c, 1, 8), PS_EINVAL);
    CHECK_EQ_INT(ps_client_register(c, 2, 0), PS_EINVAL);
    ps_client_close(c);
}

PS_TEST(open_names_the_endpoint_form_when_the_transport_is_missing)
{
    ps_client_options o;
    ps_client *c = (ps_client *)1;
    opts(&o, "127.0.0.1:5555", 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK(c == NULL);
    /* c is NULL after a failed open: the reason is the thread's */
    const char *want = "'127.0.0.1:5555' is not an endpoint: write tcp://HOST:PORT, e.g. "
                       "tcp://127.0.0.1:5555";
    CHECK_MSG(strcmp(ps_client_last_error(c), want) == 0, "last error '%s'",
              ps_client_last_error(c));
    /* the bad one of several is named */
    opts(&o, "tcp://127.0.0.1:1, localhost:2", 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK_MSG(strstr(ps_client_last_error(NULL), "'localhost:2' is not an endpoint") != NULL,
              "last error '%s'", ps_client_last_error(NULL));
    opts(&o, "tcp://127.0.0.1:70000", 0, 1, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK_MSG(strstr(ps_client_last_error(NULL), "port '70000'") != NULL, "last error '%s'",
              ps_client_last_error(NULL));
    /* options checked before the endpoints say why too */
    opts(&o, "tcp://127.0.0.1:1", 3, 2, PS_MODE_SYNC);
    CHECK_EQ_INT(ps_client_open(&o, &c), PS_EINVAL);
    CHECK_MSG(strstr(ps_client_last_error(NULL), "rank 3") != NULL, "last error '%s'",
              ps_client_last_error(NULL));
    /* an open that works clears the reason */
    opts(&o, "tcp://127.0.0.1:1,ipc:///tmp/ps-test-client-none", 0, 1, PS_MODE_SYNC);
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_EQ_INT(ps_client_last_error(NULL)[0], 0);
    ps_client_close(c);
}

PS_TEST(open_reports_why_the_comm_thread_could_not_set_up_a_socket)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/no-such-keys", ps_test_tmpdir());
    ps_client_options o;
    ps_client *c = (ps_client *)1;
    opts(&o, "tcp://127.0.0.1:1", 0, 1, PS_MODE_SYNC);
    o.curve_dir = dir;
    int rc = ps_client_open(&o, &c);
    CHECK(rc != 0);
    CHECK(c == NULL);
    CHECK_MSG(strstr(ps_client_last_error(NULL), "CURVE for tcp://127.0.0.1:1") != NULL,
              "last error '%s'", ps_client_last_error(NULL));
}

PS_TEST(hello_timeout_names_the_silent_endpoint)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 2, 1, PS_MODE_SYNC, 0.5f));
    fake_run(&f);
    char eps[160], silent[64];
    snprintf(silent, sizeof silent, "tcp://127.0.0.1:%d", ps_test_free_port());
    snprintf(eps, sizeof eps, "%s,%s", f.ep, silent);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_SYNC);
    o.hello_timeout_ms = 800;
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    fake_stop(&f);
    CHECK_EQ_INT(rc, PS_ETIMEDOUT);
    CHECK_MSG(strstr(why, silent) && !strstr(why, f.ep), "message: %s", why);
}

PS_TEST(hello_error_reply_is_refused_with_the_server_text)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.hello_err = PS_EMISMATCH;
    fake_run(&f);
    ps_client_options o;
    opts(&o, f.ep, 0, 1, PS_MODE_SYNC);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    fake_stop(&f);
    CHECK_EQ_INT(rc, PS_EMISMATCH);
    CHECK_MSG(strstr(why, f.ep) && strstr(why, "async") && strstr(why, "sync"), "message: %s",
              why);
}

PS_TEST(hello_servers_that_disagree_are_refused_naming_both)
{
    fake a, b;
    CHECK_OK(fake_start(&a, 0, 2, 1, PS_MODE_SYNC, 0.5f));
    CHECK_OK(fake_start(&b, 1, 2, 1, PS_MODE_SYNC, 0.25f));
    fake_run(&a);
    fake_run(&b);
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", a.ep, b.ep);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_SYNC);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    /* and a server listed at the wrong position */
    char eps2[160], why2[512];
    snprintf(eps2, sizeof eps2, "%s,%s", b.ep, a.ep);
    pthread_mutex_lock(&b.mu);
    b.cfg.opt.lr = 0.5f;
    pthread_mutex_unlock(&b.mu);
    ps_client_options o2;
    opts(&o2, eps2, 0, 1, PS_MODE_SYNC);
    int rc2 = connect_one(&o2, 1, 10, &c, why2, sizeof why2);
    fake_stop(&a);
    fake_stop(&b);
    CHECK_EQ_INT(rc, PS_EMISMATCH);
    CHECK_MSG(strstr(why, a.ep) && strstr(why, b.ep) && strstr(why, "0.5") &&
                  strstr(why, "0.25") && strstr(why, "lr"),
              "message: %s", why);
    CHECK_EQ_INT(rc2, PS_EMISMATCH);
    CHECK_MSG(strstr(why2, "rank"), "message: %s", why2);
}

PS_TEST(zero_copy_push_is_not_done_before_the_reply)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.hold = 1;
    f.version = 41;
    ps_client *c;
    char why[512];
    CHECK_MSG(fake_connect(&f, 9, 10, 0, &c, why, sizeof why) == 0, "start: %s", why);
    float grad[10];
    for (int i = 0; i < 10; i++)
        grad[i] = (float)i * 0.25f;
    ps_request r;
    CHECK_OK(ps_client_push(c, 9, grad, 3, &r));
    int got = fake_wait(&f, &f.ndata, 1);
    ps_test_sleep_ms(50);
    int early = ps_request_test(&r);
    pthread_mutex_lock(&f.mu);
    ps_header seen = f.last;
    int payload_ok = f.last_bytes == sizeof grad && memcmp(f.last_payload, grad, sizeof grad) == 0;
    f.release = 1;
    pthread_mutex_unlock(&f.mu);
    int done = wait_ms(&r, WAIT_MS);
    ps_client_close(c);
    fake_stop(&f);
    CHECK(got);
    CHECK_MSG(!early, "push completed before the server answered");
    CHECK(payload_ok);
    CHECK_EQ_INT(seen.type, PS_MSG_PUSH);
    CHECK_EQ_INT(seen.key, 9);
    CHECK_EQ_INT(seen.push_step, 3);
    CHECK_EQ_INT(seen.rank, 0);
    CHECK_EQ_INT(seen.count, 10);
    CHECK(done);
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_INT(r.version, 41);
    CHECK_EQ_INT(r._priv.pending, 0);
}

PS_TEST(pull_fills_every_chunk_and_reports_min_version)
{
    fake a, b;
    CHECK_OK(fake_start(&a, 0, 2, 1, PS_MODE_ASYNC, 0.5f));
    CHECK_OK(fake_start(&b, 1, 2, 1, PS_MODE_ASYNC, 0.5f));
    const size_t n = 2500, ce = 1000; /* 3 chunks: 1000, 1000, 500 */
    a.tensor_len = b.tensor_len = n;
    a.chunk_elems = b.chunk_elems = ce;
    a.version = 7;
    b.version = 5;
    fake_run(&a);
    fake_run(&b);
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", a.ep, b.ep);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_ASYNC);
    o.chunk_bytes = ce * sizeof(float);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 3, n, &c, why, sizeof why);
    float *dst = calloc(n, sizeof *dst);
    ps_request r;
    int prc = -1, done = 0;
    if (!rc) {
        prc = ps_client_pull(c, 3, dst, 0, &r);
        done = wait_ms(&r, WAIT_MS);
        ps_client_close(c);
    }
    fake_stop(&a);
    fake_stop(&b);
    CHECK_MSG(rc == 0, "start: %s", why);
    CHECK_OK(prc);
    CHECK(done);
    CHECK_EQ_INT(r.status, 0);
    int bad = -1;
    for (size_t i = 0; i < n && bad < 0; i++) {
        size_t ch = i / ce;
        if (dst[i] != (float)(ch * 1000 + i % ce) + 0.5f)
            bad = (int)i;
    }
    free(dst);
    CHECK_MSG(bad < 0, "element %d wrong", bad);
    /* each server answers s = its version + chunk; the request reports the
     * smallest over the chunks, wherever placement put them */
    ps_tensor_spec spec = {3, n};
    ps_placement p;
    CHECK_OK(ps_placement_build(&spec, 1, ce, 2, &p));
    int64_t lo = INT64_MAX;
    for (size_t k = 0; k < p.num_chunks; k++) {
        int64_t v = (p.chunks[k].server == 0 ? 7 : 5) + (int64_t)p.chunks[k].chunk;
        lo = v < lo ? v : lo;
    }
    ps_placement_free(&p);
    CHECK_EQ_INT(r.version, lo);
    /* fakes are stopped (joined): their counters can be read directly */
    CHECK_EQ_INT(a.ndata + b.ndata, 3);
    CHECK(a.ndata > 0 && b.ndata > 0);
}

PS_TEST(error_reply_sets_status_and_server_text)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.data_err = PS_ENOTFOUND;
    ps_client *c;
    char why[512];
    CHECK_MSG(fake_connect(&f, 5, 10, 0, &c, why, sizeof why) == 0, "start: %s", why);
    float g[10] = {0};
    ps_request r;
    CHECK_OK(ps_client_push(c, 5, g, 0, &r));
    int st = wait_ms(&r, WAIT_MS) ? r.status : -1;
    char err[sizeof r.err];
    memcpy(err, r.err, sizeof err);
    ps_client_close(c);
    fake_stop(&f);
    CHECK_EQ_INT(st, PS_ENOTFOUND);
    CHECK_MSG(strstr(err, "not initialized") && strstr(err, f.ep), "err: %s", err);
}

PS_TEST(bad_replies_are_refused_or_dropped)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.bad_count = 1;
    f.garbage_first = 1; /* a garbage frame before the hello reply: dropped */
    ps_client *c;
    char why[512];
    CHECK_MSG(fake_connect(&f, 5, 10, 0, &c, why, sizeof why) == 0, "start: %s", why);
    float dst[10];
    ps_request r;
    CHECK_OK(ps_client_pull(c, 5, dst, 0, &r));
    int st = wait_ms(&r, WAIT_MS) ? r.status : -1;
    ps_client_close(c);
    fake_stop(&f);
    CHECK_EQ_INT(st, PS_EPROTO);
}

PS_TEST(unanswered_request_is_resent_and_duplicate_reply_ignored)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.drop_first = 1;
    f.dup_reply = 1;
    f.version = 3;
    ps_client *c;
    char why[512];
    CHECK_MSG(fake_connect(&f, 5, 10, 100, &c, why, sizeof why) == 0, "start: %s", why);
    float g[10];
    for (int i = 0; i < 10; i++)
        g[i] = (float)i;
    ps_request r, r2;
    CHECK_OK(ps_client_push(c, 5, g, 0, &r));
    int done = wait_ms(&r, WAIT_MS);
    int st = r.status;
    /* the second answer to the resent id must not complete another request */
    float dst[10];
    CHECK_OK(ps_client_pull(c, 5, dst, 1, &r2));
    int done2 = wait_ms(&r2, WAIT_MS);
    int st2 = r2.status;
    pthread_mutex_lock(&f.mu);
    int ndata = f.ndata;
    uint64_t s0 = f.seqs[0], s1 = f.seqs[1], s2 = f.seqs[2];
    pthread_mutex_unlock(&f.mu);
    ps_client_close(c);
    fake_stop(&f);
    CHECK(done);
    CHECK_EQ_INT(st, 0);
    CHECK_EQ_INT(ndata, 3);
    CHECK_MSG(s0 == s1, "resend used another id: %llx vs %llx", (unsigned long long)s0,
              (unsigned long long)s1);
    CHECK(s2 != s1);
    CHECK(done2);
    CHECK_EQ_INT(st2, 0);
    CHECK(dst[9] == 9.5f);
}

PS_TEST(close_completes_pending_requests_with_eclosed)
{
    fake f;
    CHECK_OK(fake_start(&f, 0, 1, 1, PS_MODE_ASYNC, 0.5f));
    f.close_after_hello = 1; /* the push stays queued in ZeroMQ, zero-copy */
    size_t n = 1 << 18;
    ps_client *c;
    char why[512];
    CHECK_MSG(fake_connect(&f, 5, n, 0, &c, why, sizeof why) == 0, "start: %s", why);
    float *g = calloc(n, sizeof *g), *dst = calloc(n, sizeof *dst);
    ps_request r1, r2;
    CHECK_OK(ps_client_push(c, 5, g, 0, &r1));
    CHECK_OK(ps_client_pull(c, 5, dst, 1, &r2));
    ps_test_sleep_ms(100);
    int early = ps_request_test(&r1) || ps_request_test(&r2);
    ps_client_close(c);
    int d1 = ps_request_test(&r1), d2 = ps_request_test(&r2);
    free(g);
    free(dst);
    fake_stop(&f);
    CHECK(!early);
    CHECK(d1 && d2);
    CHECK_EQ_INT(r1.status, PS_ECLOSED);
    CHECK_EQ_INT(r2.status, PS_ECLOSED);
    CHECK_EQ_INT(r1._priv.pending, 0);
}

PS_TEST(barrier_stats_and_shutdown_reach_the_right_servers)
{
    fake a, b;
    CHECK_OK(fake_start(&a, 0, 2, 1, PS_MODE_SYNC, 0.5f));
    CHECK_OK(fake_start(&b, 1, 2, 1, PS_MODE_SYNC, 0.5f));
    b.stats.pushes = 11;
    b.stats.max_version = 12;
    fake_run(&a);
    fake_run(&b);
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", a.ep, b.ep);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_SYNC);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 5, 10, &c, why, sizeof why);
    int brc = -1, src = -1, shrc = -1;
    ps_stats st;
    memset(&st, 0, sizeof st);
    if (!rc) {
        brc = ps_client_barrier(c, 4);
        src = ps_client_stats(c, 1, &st);
        shrc = ps_client_shutdown_servers(c);
        ps_client_close(c);
    }
    fake_stop(&a);
    fake_stop(&b);
    CHECK_MSG(rc == 0, "start: %s", why);
    CHECK_OK(brc);
    CHECK_OK(src);
    CHECK_OK(shrc);
    CHECK_EQ_INT(a.nbarrier, 1);
    CHECK_EQ_INT(b.nbarrier, 0);
    CHECK_EQ_INT(a.nstats, 0);
    CHECK_EQ_INT(b.nstats, 1);
    CHECK_EQ_INT(st.pushes, 11);
    CHECK_EQ_INT(st.max_version, 12);
    CHECK_EQ_INT(a.nshutdown, 1);
    CHECK_EQ_INT(b.nshutdown, 1);
}

PS_TEST(curve_keys_connect_an_authorized_worker_and_shut_out_others)
{
    char why[512];
    if (ps_curve_available(why, sizeof why) != 0)
        SKIP("%s", why);
    char dir[400], revoked[480];
    snprintf(dir, sizeof dir, "%s/curve", ps_test_tmpdir());
    CHECK_MSG(ps_curve_keygen(dir, 1, 2, 1, why, sizeof why) == 0, "keygen: %s", why);
    snprintf(revoked, sizeof revoked, "%s/authorized/worker-1.pub", dir);
    CHECK(unlink(revoked) == 0);
    fake f;
    CHECK_OK(fake_start_curve(&f, 0, 1, 2, PS_MODE_ASYNC, 0.5f, dir));
    fake_run(&f);
    ps_client_options o;
    opts(&o, f.ep, 0, 2, PS_MODE_ASYNC);
    o.curve_dir = dir;
    ps_client *c = NULL;
    int rc0 = connect_one(&o, 5, 10, &c, why, sizeof why);
    char why0[512];
    snprintf(why0, sizeof why0, "%s", why);
    float dst[10] = {0};
    ps_request r;
    int pull_ok = 0;
    if (!rc0) {
        pull_ok = ps_client_pull(c, 5, dst, 0, &r) == 0 && wait_ms(&r, WAIT_MS) && r.status == 0;
        ps_client_close(c);
    }
    /* worker 1's key was revoked: the server never answers */
    o.rank = 1;
    o.hello_timeout_ms = 500;
    int rc1 = connect_one(&o, 5, 10, &c, why, sizeof why);
    /* a key directory that is not there fails at open */
    ps_client_options bad = o;
    char missing[480];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    bad.curve_dir = missing;
    ps_client *cb = NULL;
    int rc2 = ps_client_open(&bad, &cb);
    uint64_t refused = ps_curve_auth_refused(f.auth);
    fake_stop(&f);
    CHECK_MSG(rc0 == 0, "authorized worker: %s", why0);
    CHECK(pull_ok);
    CHECK(dst[9] == 9.5f);
    CHECK_EQ_INT(rc1, PS_ETIMEDOUT);
    CHECK_MSG(strstr(why, "CURVE"), "message: %s", why);
    CHECK(refused >= 1);
    CHECK_EQ_INT(rc2, PS_ENOTFOUND);
    CHECK(cb == NULL);
}

/* ======================================================================
 * Real server
 * ====================================================================== */

typedef struct srv {
    int pid;
    char ep[64];
    char log[300];
} srv;

static int have_server(void)
{
    char bin[256];
    return access(ps_test_bin("ps_server", bin, sizeof bin), X_OK) == 0;
}

/* stal < -1: no --max-staleness flag; extra: more flags ("" none) */
static int srv_start_with(srv *s, int rank, int ns, int nw, const char *mode, int stal,
                          const char *lr, const char *extra)
{
    char words[640], staleness[40] = "";
    snprintf(s->ep, sizeof s->ep, "tcp://127.0.0.1:%d", ps_test_free_port());
    snprintf(s->log, sizeof s->log, "%s/server-%s.log", ps_test_tmpdir(), strrchr(s->ep, ':') + 1);
    if (stal >= -1)
        snprintf(staleness, sizeof staleness, " --max-staleness %d", stal);
    snprintf(words, sizeof words, "--bind %s --rank %d --num-servers %d --num-workers %d "
             "--mode %s%s --optimizer sgd --lr %s --threads 1 %s", s->ep, rank, ns, nw, mode,
             staleness, lr, extra);
    s->pid = ps_test_spawn_words("ps_server", words, s->log);
    return s->pid > 0 ? 0 : -1;
}

static int srv_start(srv *s, int rank, int ns, int nw, const char *mode, int stal, const char *lr)
{
    return srv_start_with(s, rank, ns, nw, mode, stal, lr, "");
}

static void srv_stop(srv *s)
{
    if (s->pid > 0)
        ps_test_stop(s->pid, 3000);
    s->pid = 0;
}

#define NEED_SERVER()                                                                  \
    do {                                                                               \
        if (!have_server())                                                            \
            SKIP("bin/ps_server is not built");                                        \
    } while (0)

/* deterministic gradient values of mixed magnitude, so that the float sum
 * depends on the order it is taken in */
static float grad_val(int rank, size_t i, int step)
{
    uint32_t x = (uint32_t)(rank * 7919 + (int)i * 104729 + step * 1299709) * 2654435761u;
    float m = (float)(x >> 8) / (float)(1u << 24);          /* [0, 1) */
    int e = (int)((x >> 3) % 24) - 12;                      /* 2^-12 .. 2^11 */
    return (x & 1 ? -1.0f : 1.0f) * ldexpf(1.0f + m, e);
}

/* x as it arrives after a trip through the wire type dt (float32: itself) */
static float via_wire(uint32_t dt, float x)
{
    uint16_t h[2];
    float y;
    ps_dtype_from_f32(dt, dt == PS_DTYPE_F32 ? (void *)&y : (void *)h, &x, 1);
    if (dt != PS_DTYPE_F32)
        ps_dtype_to_f32(dt, &y, h, 1);
    return y;
}

/* W workers, 3 sync rounds over 2 servers with wire type dt.  Expected,
 * computed here: the servers widen each rank's gradient (rounded to dt by
 * the worker), sum them in rank order, divide by W and take an SGD step on
 * their float32 master weights; a pull returns the master rounded to dt.  So
 * float32 is the rank-order mean bitwise, and bf16/f16 are bitwise that too,
 * with the master kept in float32 (were it kept in dt, steps smaller than
 * half its ulp would vanish, and the pulls would differ). */
static int sync_rounds_dt(int W, uint32_t dt)
{
    const size_t n = 1000, ce = 400; /* 3 chunks over 2 servers */
    const float lr = 0.1f;
    const int steps = 3;
    srv s[2];
    int rc = 0;
    char extra[40];
    snprintf(extra, sizeof extra, "--wire-dtype %s", ps_dtype_name(dt));
    for (int k = 0; k < 2; k++)
        if (srv_start_with(&s[k], k, 2, W, "sync", -2, "0.1", extra))
            rc = -1;
    if (rc) {
        ps_test_fail(__FILE__, __LINE__, "cannot spawn ps_server");
        return -1;
    }
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    ps_client *c[3] = {NULL, NULL, NULL};
    char why[512];
    float *w = calloc(n, sizeof *w), *want = calloc(n, sizeof *want);
    float *master = calloc(n, sizeof *master);
    size_t narrow_lost = 0;
    float *g[3], *dst[3];
    for (int r = 0; r < 3; r++) {
        g[r] = calloc(n, sizeof(float));
        dst[r] = calloc(n, sizeof(float));
    }
    for (size_t i = 0; i < n; i++)
        w[i] = (float)i * 0.001f - 0.5f;
    for (int r = 0; r < W && !rc; r++) {
        ps_client_options o;
        opts(&o, eps, r, W, PS_MODE_SYNC);
        o.chunk_bytes = ce * sizeof(float);
        rc = connect_one_dt(&o, 7, n, dt, &c[r], why, sizeof why);
        if (rc)
            ps_test_fail(__FILE__, __LINE__, "worker %d start: %s", r, why);
    }
    ps_request ri;
    if (!rc && (ps_client_init(c[0], 7, w, &ri) || !wait_ms(&ri, WAIT_MS) || ri.status)) {
        ps_test_fail(__FILE__, __LINE__, "init failed: %s", ri.err);
        rc = -1;
    }
    /* arrival orders: each step another one.  The requests outlive the loop:
     * after a failure they may still be pending until the clients close */
    static const int orders[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}};
    ps_request rp[3], pull;
    size_t order_sensitive = 0;
    for (int t = 0; t < steps && !rc; t++) {
        int ord[3], m = 0;
        for (int j = 0; j < 3; j++)
            if (orders[t][j] < W)
                ord[m++] = orders[t][j];
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++)
                g[r][i] = grad_val(r, i, t);
        /* expected: sum in rank order, divide by W, one SGD step (master[]
         * in float32; want[] is what a pull returns) */
        for (size_t i = 0; i < n; i++) {
            float sum = via_wire(dt, g[0][i]);
            for (int r = 1; r < W; r++)
                sum += via_wire(dt, g[r][i]);
            float mean = sum / (float)W;
            master[i] = fmaf(mean, -lr, w[i]); /* torch's w.add_(g, alpha=-lr) */
            want[i] = via_wire(dt, master[i]);
            if (W == 3) {
                float other = (via_wire(dt, g[2][i]) + via_wire(dt, g[1][i])) +
                              via_wire(dt, g[0][i]);
                order_sensitive += other != sum;
            }
            narrow_lost += want[i] != master[i];
        }
        for (int j = 0; j < W - 1 && !rc; j++) {
            int r = ord[j];
            if (ps_client_push(c[r], 7, g[r], t, &rp[r]) || !wait_ms(&rp[r], WAIT_MS) ||
                rp[r].status) {
                ps_test_fail(__FILE__, __LINE__, "step %d push of rank %d: status %d %s", t, r,
                             rp[r].status, rp[r].err);
                rc = -1;
            }
        }
        if (rc)
            break;
        /* the round is not complete: a pull of version t+1 must wait */
        ps_client_pull(c[ord[0]], 7, dst[ord[0]], t + 1, &pull);
        ps_test_sleep_ms(100);
        if (ps_request_test(&pull)) {
            ps_test_fail(__FILE__, __LINE__, "step %d: pull of version %d completed before all "
                         "%d workers pushed (status %d)", t, t + 1, W, pull.status);
            rc = -1;
            break;
        }
        int last = ord[W - 1];
        if (ps_client_push(c[last], 7, g[last], t, &rp[last]) || !wait_ms(&rp[last], WAIT_MS) ||
            rp[last].status) {
            ps_test_fail(__FILE__, __LINE__, "step %d last push: %s", t, rp[last].err);
            rc = -1;
            break;
        }
        if (!wait_ms(&pull, WAIT_MS) || pull.status || pull.version < t + 1) {
            ps_test_fail(__FILE__, __LINE__, "step %d pull: done %d status %d version %lld %s", t,
                         ps_request_test(&pull), pull.status, (long long)pull.version, pull.err);
            rc = -1;
            break;
        }
        /* every worker sees the same bits */
        for (int r = 0; r < W && !rc; r++) {
            if (r != ord[0]) {
                ps_request p2;
                if (ps_client_pull(c[r], 7, dst[r], t + 1, &p2) || !wait_ms(&p2, WAIT_MS) ||
                    p2.status) {
                    ps_test_fail(__FILE__, __LINE__, "pull of rank %d failed", r);
                    rc = -1;
                    break;
                }
            }
            size_t where = 0;
            if (!same_bits(dst[r], want, n, &where)) {
                ps_test_fail(__FILE__, __LINE__,
                             "W=%d step %d rank %d: element %zu is %.9g (0x%08x), expected %.9g",
                             W, t, r, where, (double)dst[r][where],
                             *(uint32_t *)&dst[r][where], (double)want[where]);
                rc = -1;
            }
        }
        memcpy(w, master, n * sizeof *w);
    }
    if (!rc && W == 3 && order_sensitive == 0) {
        ps_test_fail(__FILE__, __LINE__, "test gradients do not depend on summation order");
        rc = -1;
    }
    if (!rc && dt != PS_DTYPE_F32 && narrow_lost == 0) {
        ps_test_fail(__FILE__, __LINE__, "no weight lost bits on the wire: the test cannot "
                     "tell a float32 master from a %s one", ps_dtype_name(dt));
        rc = -1;
    }
    /* what crossed the wire into the servers: the init in float32, every
     * gradient in dt */
    uint64_t bin = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        ps_stats st = {0};
        if (ps_client_stats(c[0], k, &st)) {
            ps_test_fail(__FILE__, __LINE__, "stats of server %d failed", k);
            rc = -1;
        }
        bin += st.bytes_in;
    }
    uint64_t want_bin = n * 4 + (uint64_t)W * steps * n * ps_dtype_size(dt);
    if (!rc && bin != want_bin) {
        ps_test_fail(__FILE__, __LINE__, "servers received %llu payload bytes, expected %llu",
                     (unsigned long long)bin, (unsigned long long)want_bin);
        rc = -1;
    }
    for (int r = 0; r < 3; r++) {
        if (c[r])
            ps_client_close(c[r]);
        free(g[r]);
        free(dst[r]);
    }
    free(w);
    free(want);
    free(master);
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    return rc;
}

PS_TEST(sync_pull_waits_for_all_2_workers_and_is_bitwise_rank_order_mean)
{
    NEED_SERVER();
    sync_rounds_dt(2, PS_DTYPE_F32);
}

PS_TEST(sync_pull_waits_for_all_3_workers_and_is_bitwise_rank_order_mean)
{
    NEED_SERVER();
    sync_rounds_dt(3, PS_DTYPE_F32);
}

PS_TEST(sync_bf16_wire_is_bitwise_the_rank_order_mean_on_a_float32_master)
{
    NEED_SERVER();
    sync_rounds_dt(3, PS_DTYPE_BF16);
}

PS_TEST(sync_f16_wire_is_bitwise_the_rank_order_mean_on_a_float32_master)
{
    NEED_SERVER();
    sync_rounds_dt(2, PS_DTYPE_F16);
}

/* ---------- async, in threads ---------- */

typedef struct async_arg {
    const char *eps;
    int rank, W, K;
    size_t n;
    const float *init;
    char err[512];
} async_arg;

static void *async_worker(void *p)
{
    async_arg *a = p;
    ps_client_options o;
    opts(&o, a->eps, a->rank, a->W, PS_MODE_ASYNC);
    ps_client *c;
    char why[400];
    if (connect_one(&o, 11, a->n, &c, why, sizeof why)) {
        snprintf(a->err, sizeof a->err, "rank %d start: %s", a->rank, why);
        return NULL;
    }
    ps_request r;
    /* every worker inits with the same values; the first one wins */
    if (ps_client_init(c, 11, a->init, &r) || !wait_ms(&r, WAIT_MS) || r.status) {
        snprintf(a->err, sizeof a->err, "rank %d init: %s", a->rank, r.err);
        ps_client_close(c);
        return NULL;
    }
    float *g = malloc(a->n * sizeof *g);
    for (int k = 0; k < a->K; k++) {
        /* multiples of 1/8: every partial sum is exact in any order */
        for (size_t i = 0; i < a->n; i++)
            g[i] = (float)((a->rank + 1) * (int)(i % 5 + 1) * (k % 3 + 1)) / 8.0f;
        if (ps_client_push(c, 11, g, k, &r) || !wait_ms(&r, WAIT_MS) || r.status) {
            snprintf(a->err, sizeof a->err, "rank %d push %d: status %d %s", a->rank, k, r.status,
                     r.err);
            break;
        }
    }
    free(g);
    ps_client_close(c);
    return NULL;
}

PS_TEST(async_pushes_from_threads_sum_exactly)
{
    NEED_SERVER();
    const int W = 3, K = 20;
    const size_t n = 3000;
    srv s;
    CHECK_OK(srv_start(&s, 0, 1, W, "async", -2, "0.5"));
    float *init = malloc(n * sizeof *init), *dst = malloc(n * sizeof *dst);
    for (size_t i = 0; i < n; i++)
        init[i] = (float)(i % 17) - 8.0f;
    async_arg args[3];
    pthread_t th[3];
    for (int r = 0; r < W; r++) {
        args[r] = (async_arg){s.ep, r, W, K, n, init, ""};
        pthread_create(&th[r], NULL, async_worker, &args[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < W; r++)
        CHECK_MSG(!args[r].err[0], "%s", args[r].err);
    ps_client_options o;
    opts(&o, s.ep, 0, W, PS_MODE_ASYNC);
    ps_client *c;
    char why[512];
    CHECK_MSG(connect_one(&o, 11, n, &c, why, sizeof why) == 0, "%s", why);
    ps_request r;
    CHECK_OK(ps_client_pull(c, 11, dst, 0, &r));
    int done = wait_ms(&r, WAIT_MS);
    ps_client_close(c);
    srv_stop(&s);
    CHECK(done);
    CHECK_EQ_INT(r.status, 0);
    CHECK_EQ_INT(r.version, W * K);
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (int rk = 0; rk < W; rk++)
            for (int k = 0; k < K; k++)
                sum += (double)((rk + 1) * (int)(i % 5 + 1) * (k % 3 + 1)) / 8.0;
        float want = (float)((double)init[i] - 0.5 * sum);
        CHECK_MSG(dst[i] == want, "element %zu: %.9g, expected %.9g", i, (double)dst[i],
                  (double)want);
    }
    free(init);
    free(dst);
}

/* ---------- bounded staleness ---------- */

static int staleness_case(int K)
{
    srv s;
    if (srv_start(&s, 0, 1, 2, "async", K, "0.5")) {
        ps_test_fail(__FILE__, __LINE__, "cannot spawn ps_server");
        return -1;
    }
    const size_t n = 16;
    float w0[16] = {0}, g[16], dst[16];
    for (size_t i = 0; i < n; i++)
        g[i] = 1.0f;
    ps_client *a = NULL, *b = NULL;
    char why[512];
    int rc = 0;
    ps_client_options o;
    opts(&o, s.ep, 0, 2, PS_MODE_ASYNC);
    o.max_staleness = K;
    if (connect_one(&o, 1, n, &a, why, sizeof why)) {
        ps_test_fail(__FILE__, __LINE__, "K=%d worker 0: %s", K, why);
        rc = -1;
    }
    o.rank = 1;
    if (!rc && connect_one(&o, 1, n, &b, why, sizeof why)) {
        ps_test_fail(__FILE__, __LINE__, "K=%d worker 1: %s", K, why);
        rc = -1;
    }
    ps_request r;
    if (!rc && (ps_client_init(a, 1, w0, &r) || !wait_ms(&r, WAIT_MS) || r.status)) {
        ps_test_fail(__FILE__, __LINE__, "init: %s", r.err);
        rc = -1;
    }
    /* worker 0 runs K+1 steps ahead of worker 1 (clock K+1 vs 0) */
    for (int t = 0; t <= K && !rc; t++)
        if (ps_client_push(a, 1, g, t, &r) || !wait_ms(&r, WAIT_MS) || r.status) {
            ps_test_fail(__FILE__, __LINE__, "push %d: %s", t, r.err);
            rc = -1;
        }
    if (!rc) {
        /* within K of the slowest: no wait */
        ps_request near;
        ps_client_pull(a, 1, dst, K, &near);
        if (!wait_ms(&near, 2000) || near.status) {
            ps_test_fail(__FILE__, __LINE__, "K=%d: pull at step %d (within K) blocked or failed "
                         "(status %d %s)", K, K, near.status, near.err);
            rc = -1;
        }
    }
    ps_request far;
    if (!rc) {
        /* K+1 ahead: waits until worker 1 pushes once */
        ps_client_pull(a, 1, dst, K + 1, &far);
        ps_test_sleep_ms(150);
        if (ps_request_test(&far)) {
            ps_test_fail(__FILE__, __LINE__, "K=%d: pull at step %d did not wait for the slowest "
                         "worker (status %d %s)", K, K + 1, far.status, far.err);
            rc = -1;
        }
    }
    if (!rc) {
        ps_request pb;
        if (ps_client_push(b, 1, g, 0, &pb) || !wait_ms(&pb, WAIT_MS) || pb.status) {
            ps_test_fail(__FILE__, __LINE__, "worker 1 push: %s", pb.err);
            rc = -1;
        } else if (!wait_ms(&far, WAIT_MS) || far.status) {
            ps_test_fail(__FILE__, __LINE__, "K=%d: pull did not complete once the slowest caught "
                         "up (status %d)", K, far.status);
            rc = -1;
        } else if (far.version != K + 2 || dst[0] != -0.5f * (float)(K + 2)) {
            ps_test_fail(__FILE__, __LINE__, "K=%d: version %lld weight %g, expected %d and %g", K,
                         (long long)far.version, (double)dst[0], K + 2, -0.5 * (K + 2));
            rc = -1;
        }
    }
    if (a)
        ps_client_close(a);
    if (b)
        ps_client_close(b);
    srv_stop(&s);
    return rc;
}

PS_TEST(staleness_0_1_2_blocks_only_beyond_the_bound)
{
    NEED_SERVER();
    for (int K = 0; K <= 2; K++)
        if (staleness_case(K))
            return;
}

/* ---------- multi-chunk tensor over two servers, pushpull ---------- */

PS_TEST(big_tensor_over_two_servers_round_trips_exactly)
{
    NEED_SERVER();
    srv s[2];
    CHECK_OK(srv_start(&s[0], 0, 2, 1, "async", -2, "0.5"));
    CHECK_OK(srv_start(&s[1], 1, 2, 1, "async", -2, "0.5"));
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    const size_t n = 4567, ce = 1000; /* 5 chunks */
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_ASYNC);
    o.chunk_bytes = ce * sizeof(float);
    ps_client *c;
    char why[512];
    CHECK_MSG(connect_one(&o, 77, n, &c, why, sizeof why) == 0, "%s", why);
    float *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g), *dst = malloc(n * sizeof *dst);
    for (size_t i = 0; i < n; i++) {
        w[i] = (float)i * 0.25f - 300.0f;
        g[i] = (float)(i % 8) / 8.0f;
    }
    ps_request r;
    int ok = 1;
    char msg[600] = "";
    if (ps_client_init(c, 77, w, &r) || !wait_ms(&r, WAIT_MS) || r.status)
        ok = 0, snprintf(msg, sizeof msg, "init: %s", r.err);
    if (ok && (ps_client_pull(c, 77, dst, 0, &r) || !wait_ms(&r, WAIT_MS) || r.status))
        ok = 0, snprintf(msg, sizeof msg, "pull: %s", r.err);
    size_t where = 0;
    if (ok && (!same_bits(dst, w, n, &where) || r.version != 0))
        ok = 0, snprintf(msg, sizeof msg, "pull of init values: element %zu, version %lld", where,
                         (long long)r.version);
    if (ok && (ps_client_push(c, 77, g, 0, &r) || !wait_ms(&r, WAIT_MS) || r.status))
        ok = 0, snprintf(msg, sizeof msg, "push: %s", r.err);
    if (ok && (ps_client_pull(c, 77, dst, 1, &r) || !wait_ms(&r, WAIT_MS) || r.status))
        ok = 0, snprintf(msg, sizeof msg, "pull 2: %s", r.err);
    for (size_t i = 0; ok && i < n; i++)
        if (dst[i] != w[i] - 0.5f * g[i])
            ok = 0, snprintf(msg, sizeof msg, "element %zu: %g, expected %g", i, (double)dst[i],
                             (double)(w[i] - 0.5f * g[i]));
    if (ok && r.version != 1)
        ok = 0, snprintf(msg, sizeof msg, "version %lld", (long long)r.version);
    ps_stats st0, st1;
    if (ok && (ps_client_stats(c, 0, &st0) || ps_client_stats(c, 1, &st1)))
        ok = 0, snprintf(msg, sizeof msg, "stats: %s", ps_client_last_error(c));
    if (ok && (st0.chunks + st1.chunks != 5 || !st0.chunks || !st1.chunks))
        ok = 0, snprintf(msg, sizeof msg, "chunks per server: %llu + %llu",
                         (unsigned long long)st0.chunks, (unsigned long long)st1.chunks);
    ps_client_close(c);
    free(w);
    free(g);
    free(dst);
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    CHECK_MSG(ok, "%s", msg);
}

PS_TEST(pushpull_returns_the_updated_weights_and_shutdown_stops_the_server)
{
    NEED_SERVER();
    srv s;
    /* the server obeys a shutdown that carries the token of its file */
    const char *tf = ps_test_token_file("admin.token", PS_TEST_ADMIN_TOKEN, 0600);
    CHECK(tf);
    char lr[600]; /* the rate, then the flags that follow it */
    snprintf(lr, sizeof lr, "0.5 --admin-token-file %s", tf);
    CHECK_OK(srv_start(&s, 0, 1, 1, "sync", -2, lr));
    const size_t n = 100;
    ps_client_options o;
    opts(&o, s.ep, 0, 1, PS_MODE_SYNC);
    o.admin_token = PS_TEST_ADMIN_TOKEN;
    ps_client *c;
    char why[512];
    CHECK_MSG(connect_one(&o, 5, n, &c, why, sizeof why) == 0, "%s", why);
    float w[100], g[100], dst[100];
    for (size_t i = 0; i < n; i++) {
        w[i] = (float)i;
        g[i] = (float)(i % 4) * 0.25f;
    }
    ps_request r;
    int ok = 1;
    char msg[600] = "";
    if (ps_client_init(c, 5, w, &r) || !wait_ms(&r, WAIT_MS) || r.status)
        ok = 0, snprintf(msg, sizeof msg, "init: %s", r.err);
    for (int t = 0; ok && t < 3; t++) {
        if (ps_client_pushpull(c, 5, g, dst, t, &r) || !wait_ms(&r, WAIT_MS) || r.status) {
            ok = 0, snprintf(msg, sizeof msg, "pushpull %d: %s", t, r.err);
            break;
        }
        for (size_t i = 0; i < n; i++)
            w[i] = w[i] - 0.5f * g[i];
        size_t where = 0;
        if (!same_bits(dst, w, n, &where) || r.version != t + 1)
            ok = 0, snprintf(msg, sizeof msg, "step %d: element %zu %g expected %g, version %lld",
                             t, where, (double)dst[where], (double)w[where],
                             (long long)r.version);
    }
    int shrc = ps_client_shutdown_servers(c);
    ps_client_close(c);
    int status = ps_test_wait(s.pid, 5000);
    s.pid = 0;
    CHECK_MSG(ok, "%s", msg);
    CHECK_OK(shrc);
    CHECK_EQ_INT(status, 0);
}

/* ---------- many requests in flight ---------- */

PS_TEST(many_requests_in_flight_complete_independently)
{
    NEED_SERVER();
    enum { T = 300 };
    srv s[2];
    CHECK_OK(srv_start(&s[0], 0, 2, 1, "async", -2, "0.5"));
    CHECK_OK(srv_start(&s[1], 1, 2, 1, "async", -2, "0.5"));
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_ASYNC);
    o.chunk_bytes = 64 * sizeof(float);
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    size_t len[T];
    float *w[T], *g[T], *dst[T];
    for (int t = 0; t < T; t++) {
        len[t] = 1 + (size_t)(t * 37) % 300; /* 1..300 elements: 1 to 5 chunks */
        ps_client_register(c, 1000 + (uint64_t)t, len[t]);
        w[t] = malloc(len[t] * sizeof(float));
        g[t] = malloc(len[t] * sizeof(float));
        dst[t] = malloc(len[t] * sizeof(float));
        for (size_t i = 0; i < len[t]; i++) {
            w[t][i] = (float)(t + (int)i);
            g[t][i] = (float)((t + (int)i) % 8) / 4.0f;
        }
    }
    int rc = ps_client_start(c);
    char msg[600] = "";
    int ok = rc == 0;
    if (!ok)
        snprintf(msg, sizeof msg, "start: %s", ps_client_last_error(c));
    static ps_request r[T], p[T];
    /* post everything before waiting on anything */
    for (int t = 0; ok && t < T; t++)
        ok = ps_client_init(c, 1000 + (uint64_t)t, w[t], &r[t]) == 0;
    for (int t = 0; ok && t < T; t++)
        ok = ps_request_wait(&r[t]) == 0;
    for (int t = 0; ok && t < T; t++)
        ok = ps_client_push(c, 1000 + (uint64_t)t, g[t], 0, &r[t]) == 0 &&
             ps_client_pull(c, 1000 + (uint64_t)t, dst[t], 1, &p[t]) == 0;
    /* wait in reverse order: completion order must not matter */
    for (int t = T - 1; ok && t >= 0; t--) {
        if (!wait_ms(&p[t], WAIT_MS) || p[t].status || !wait_ms(&r[t], WAIT_MS) || r[t].status) {
            snprintf(msg, sizeof msg, "tensor %d: push %d pull %d (%s%s)", t, r[t].status,
                     p[t].status, r[t].err, p[t].err);
            ok = 0;
        }
    }
    /* a pull posted after its push's ack sees the push applied (async); the
     * pull posted together with it may or may not, so pull again */
    for (int t = 0; ok && t < T; t++) {
        if (ps_client_pull(c, 1000 + (uint64_t)t, dst[t], 1, &p[t]) || ps_request_wait(&p[t])) {
            snprintf(msg, sizeof msg, "tensor %d: second pull %s", t, p[t].err);
            ok = 0;
        }
        for (size_t i = 0; ok && i < len[t]; i++)
            if (dst[t][i] != w[t][i] - 0.5f * g[t][i]) {
                snprintf(msg, sizeof msg, "tensor %d element %zu: %g, expected %g", t, i,
                         (double)dst[t][i], (double)(w[t][i] - 0.5f * g[t][i]));
                ok = 0;
            }
    }
    ps_client_close(c);
    for (int t = 0; t < T; t++) {
        free(w[t]);
        free(g[t]);
        free(dst[t]);
    }
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    CHECK_MSG(ok, "%s", msg);
}

/* ---------- start-up mismatches ---------- */

PS_TEST(mismatch_client_sync_vs_server_async_is_refused)
{
    NEED_SERVER();
    srv s;
    CHECK_OK(srv_start(&s, 0, 1, 1, "async", -2, "0.5"));
    ps_client_options o;
    opts(&o, s.ep, 0, 1, PS_MODE_SYNC);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    srv_stop(&s);
    CHECK_EQ_INT(rc, PS_EMISMATCH);
    CHECK_MSG(strstr(why, "sync") && strstr(why, "async") && strstr(why, s.ep), "message: %s",
              why);
}

PS_TEST(mismatch_servers_with_different_lr_are_refused_naming_both)
{
    NEED_SERVER();
    srv s[2];
    CHECK_OK(srv_start(&s[0], 0, 2, 1, "sync", -2, "0.5"));
    CHECK_OK(srv_start(&s[1], 1, 2, 1, "sync", -2, "0.25"));
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    ps_client_options o;
    opts(&o, eps, 0, 1, PS_MODE_SYNC);
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    CHECK_EQ_INT(rc, PS_EMISMATCH);
    CHECK_MSG(strstr(why, s[0].ep) && strstr(why, s[1].ep) && strstr(why, "0.5") &&
                  strstr(why, "0.25"),
              "message: %s", why);
}

PS_TEST(mismatch_client_expecting_adam_vs_sgd_server_is_refused)
{
    NEED_SERVER();
    srv s;
    CHECK_OK(srv_start(&s, 0, 1, 1, "async", -2, "0.5"));
    ps_client_options o;
    opts(&o, s.ep, 0, 1, PS_MODE_ASYNC);
    o.expect.kind = PS_OPT_ADAM;
    o.expect.lr = 0.5f;
    ps_client *c;
    char why[512];
    int rc = connect_one(&o, 1, 10, &c, why, sizeof why);
    srv_stop(&s);
    CHECK_EQ_INT(rc, PS_EMISMATCH);
    CHECK_MSG(strstr(why, "adam") && strstr(why, "sgd"), "message: %s", why);
}

/* --wire-dtype: a worker and a server that disagree are refused at start,
 * naming both types; so are two servers that disagree; the setter takes
 * only the known types, and only before start */
PS_TEST(mismatch_wire_dtype_is_refused_naming_both)
{
    NEED_SERVER();
    ps_client_options o;
    ps_client *c = NULL;
    char why0[512], why1[512], why2[512];
    /* one bf16 server: a float32 worker (the default) is refused, a bf16 one
     * starts, and its type is fixed from then on */
    srv a;
    CHECK_OK(srv_start_with(&a, 0, 1, 1, "sync", -2, "0.5", "--wire-dtype bf16"));
    opts(&o, a.ep, 0, 1, PS_MODE_SYNC);
    int rc0 = connect_one(&o, 1, 10, &c, why0, sizeof why0);
    int rc1 = connect_one_dt(&o, 1, 10, PS_DTYPE_BF16, &c, why1, sizeof why1);
    int late = c ? ps_client_set_wire_dtype(c, PS_DTYPE_F16) : -1;
    if (c)
        ps_client_close(c);
    srv_stop(&a);
    /* two servers of one job that disagree (bf16, f16) */
    srv s[2];
    CHECK_OK(srv_start_with(&s[0], 0, 2, 1, "sync", -2, "0.5", "--wire-dtype bf16"));
    CHECK_OK(srv_start_with(&s[1], 1, 2, 1, "sync", -2, "0.5", "--wire-dtype f16"));
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    opts(&o, eps, 0, 1, PS_MODE_SYNC);
    int rc2 = connect_one_dt(&o, 1, 10, PS_DTYPE_BF16, &c, why2, sizeof why2);
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    CHECK_EQ_INT(rc0, PS_EMISMATCH);
    CHECK_MSG(strstr(why0, "wire-dtype") && strstr(why0, "bf16") && strstr(why0, "f32"),
              "message: %s", why0);
    CHECK_MSG(rc1 == 0, "a bf16 worker and a bf16 server: %s", why1);
    CHECK_EQ_INT(late, PS_ESTATE);
    CHECK_EQ_INT(rc2, PS_EMISMATCH);
    CHECK_MSG(strstr(why2, "wire-dtype") && strstr(why2, "bf16") && strstr(why2, "f16"),
              "message: %s", why2);
    /* the setter takes the known types only */
    opts(&o, "tcp://127.0.0.1:1", 0, 1, PS_MODE_SYNC);
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_EQ_INT(ps_client_set_wire_dtype(c, 0), PS_EINVAL);
    CHECK_EQ_INT(ps_client_set_wire_dtype(c, PS_DTYPE_MAX + 1), PS_EINVAL);
    CHECK_OK(ps_client_set_wire_dtype(c, PS_DTYPE_F16));
    ps_client_close(c);
}
