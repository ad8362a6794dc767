/* The exchange (include/ps_exchange.h, client/exchange.c) on its own: no
 * ps_worker, no model.  Its servers are real ps_servers run on threads of
 * this process (ps_server_open + ps_server_run), its other workers plain
 * ps_clients driven by the test, so each case decides exactly when the
 * round a pull waits for completes.  Values are dyadic rationals small
 * enough that every sum, mean and SGD step is exact in float, so expected
 * weights are compared bit for bit whatever the order of application.
 *
 * Checked:
 *  - double buffering: compute reads the front; a pull lands in the back
 *    and is swapped in at ps_exchange_before_use (sync: only once version
 *    t+1 exists, waiting for it; async: only once it has landed, never
 *    waiting); the gradient buffer on the wire is not the one the next
 *    backward writes;
 *  - async sums: gradients that find the previous push in flight are summed
 *    and go out with the next one as one message, which the server applies
 *    as their mean and counts as their number (version and worker clock);
 *  - staging: on a device whose memory is not host memory (a fake: the host
 *    backend with host_memory 0 whose copy stream runs only when the test
 *    says, and which logs every copy and event), each push is preceded by a
 *    device-to-host copy and is not sent before that copy's event, and each
 *    swap by a host-to-device copy and a wait of the compute stream on its
 *    event.
 * Every wait is bounded: a watchdog interrupts the exchange. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "ps_backend.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"
#include "server.h"

#define WAIT_MS 5000   /* bound on a wait that must end */
#define WATCH_MS 30000 /* bound on a whole case: then the exchange is interrupted */
#define KEY 7
#define LR 0.5f

/* ---------------------------------------------------------------- servers */

/* A ps_server on a thread of this process (ps_test_server.h), on tcp
 * 127.0.0.1, with the same-host data plane off: payloads take the network
 * path, the one these cases follow. */
typedef ps_test_isrv isrv;

static int isrv_start(isrv *v, int mode, int num_workers, int max_staleness)
{
    return ps_test_isrv_start(v, mode, num_workers, max_staleness, LR, 0);
}

/* ---------------------------------------------------------------- clients */

static void options(ps_client_options *o, const isrv *v, int rank, int nw, int mode,
                    int max_staleness)
{
    ps_client_options_default(o);
    o->servers = v->ep;
    o->rank = rank;
    o->num_workers = nw;
    o->mode = mode;
    o->max_staleness = mode == PS_MODE_SYNC ? -1 : max_staleness;
    o->hello_timeout_ms = WAIT_MS;
    o->shm = 0;
}

/* Another worker: a plain client with the tensor registered, started. */
static int peer_open(const isrv *v, int rank, int nw, int mode, int max_staleness, size_t n,
                     ps_client **out)
{
    ps_client_options o;
    options(&o, v, rank, nw, mode, max_staleness);
    int rc = ps_client_open(&o, out);
    if (rc)
        return rc;
    if ((rc = ps_client_register(*out, KEY, n)) || (rc = ps_client_start(*out))) {
        printf("# peer %d: %s\n", rank, ps_client_last_error(*out));
        ps_client_close(*out);
        *out = NULL;
    }
    return rc;
}

/* The peer's push of `step`, waited for: 0 or why not. */
static int peer_push(ps_client *c, const float *g, int64_t step)
{
    ps_request r;
    int rc = ps_client_push(c, KEY, g, step, &r);
    if (rc)
        return rc;
    rc = ps_request_wait_for(&r, WAIT_MS);
    return rc < 0 ? PS_ETIMEDOUT : rc;
}

/* The servers' current weights and their version, as the peer pulls them. */
static int peer_pull(ps_client *c, float *dst, int64_t *version)
{
    ps_request r;
    int rc = ps_client_pull(c, KEY, dst, 0, &r);
    if (rc)
        return rc;
    rc = ps_request_wait_for(&r, WAIT_MS);
    *version = r.version;
    return rc < 0 ? PS_ETIMEDOUT : rc;
}

/* ---------------------------------------------------------------- watchdog */

typedef struct watchdog {
    ps_exchange *x;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, fired;
} watchdog;

static void *watch_main(void *arg)
{
    watchdog *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WATCH_MS / 1000;
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0)
            break;
    if (!w->done) {
        w->fired = 1;
        ps_exchange_interrupt(w->x); /* whatever waits returns PS_ECLOSED */
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void watch_start(watchdog *w, ps_exchange *x)
{
    memset(w, 0, sizeof *w);
    w->x = x;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_create(&w->th, NULL, watch_main, w);
}

/* 1 when the watchdog had to interrupt. */
static int watch_stop(watchdog *w)
{
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return w->fired;
}

/* ---------------------------------------------------------------- a worker */

/* The exchange of one worker with one tensor of n floats, KEY, first
 * weights w0; its buffers from backend b. */
typedef struct worker {
    ps_backend *b;
    ps_exchange *x;
    float *w, *g;
    size_t n;
    watchdog dog;
} worker;

static int worker_open(worker *k, ps_backend *b, const ps_client_options *o, const float *w0,
                       size_t n)
{
    memset(k, 0, sizeof *k);
    k->b = b;
    k->n = n;
    int rc;
    if ((rc = b->alloc(b, n * sizeof(float), (void **)&k->w)) ||
        (rc = b->alloc(b, n * sizeof(float), (void **)&k->g)))
        return rc;
    memcpy(k->w, w0, n * sizeof(float));
    memset(k->g, 0, n * sizeof(float));
    if ((rc = ps_exchange_open(o, b, &k->x)))
        return rc;
    watch_start(&k->dog, k->x);
    if ((rc = ps_exchange_add(k->x, KEY, n, k->w, k->g, 0)))
        return rc;
    return ps_exchange_start(k->x);
}

/* Close; 1 when the watchdog had to interrupt a wait. */
static int worker_close(worker *k)
{
    int fired = k->x ? watch_stop(&k->dog) : 0;
    ps_exchange_close(k->x);
    if (k->w)
        k->b->free(k->b, k->w);
    if (k->g)
        k->b->free(k->b, k->g);
    k->x = NULL;
    return fired;
}

/* Two workers on one server: worker 0 through the exchange on the host
 * backend, worker 1 a plain client the test drives. */
typedef struct duo {
    isrv v;
    ps_backend *b;
    worker k;
    ps_client *peer;
} duo;

static int duo_open(duo *d, int mode, int max_staleness, const float *w0, size_t n)
{
    memset(d, 0, sizeof *d);
    int rc = isrv_start(&d->v, mode, 2, max_staleness);
    if (rc)
        return rc;
    ps_client_options o;
    options(&o, &d->v, 0, 2, mode, max_staleness);
    if (!(rc = ps_backend_host_create(&d->b)) && !(rc = worker_open(&d->k, d->b, &o, w0, n)))
        rc = peer_open(&d->v, 1, 2, mode, max_staleness, n, &d->peer);
    return rc;
}

/* Close all of it (also after a failed duo_open); 1 when the watchdog had
 * to interrupt a wait. */
static int duo_close(duo *d)
{
    int fired = worker_close(&d->k);
    if (d->peer)
        ps_client_close(d->peer);
    ps_test_isrv_stop(&d->v);
    ps_backend_host_destroy(d->b);
    return fired;
}

/* -------------------------------------------------------------- arithmetic */

/* Gradients: multiples of 1/8 up to 2.  With weights that are multiples of
 * 1/4 below 64, every sum, mean and SGD step these cases take is exact. */
static float grad_of(int who, int step, size_t i)
{
    return (float)(((int)i % 5 + 1) * (who + 1) + step % 3) / 8.0f;
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

#define CHECK_BITS(got, want, n, what)                                                   \
    do {                                                                                 \
        size_t ps_w_ = 0;                                                                \
        CHECK_MSG(same_bits((got), (want), (n), &ps_w_),                                 \
                  "%s: element %zu is %.9g, expected %.9g", (what), ps_w_,               \
                  (double)(got)[ps_w_], (double)(want)[ps_w_]);                          \
    } while (0)

/* ---------------------------------------------------------------- double buffering */

typedef struct late_push {
    ps_client *c;
    const float *g;
    int64_t step;
    int delay_ms;
    int64_t posted_ns; /* when the push was posted */
    int rc;
    pthread_t th;
} late_push;

static void *late_push_main(void *arg)
{
    late_push *p = arg;
    ps_test_sleep_ms(p->delay_ms);
    p->posted_ns = ps_now_ns();
    p->rc = peer_push(p->c, p->g, p->step);
    return NULL;
}

PS_TEST(sync_before_use_waits_for_version_t_plus_1_and_swaps_it_in_from_the_back_buffer)
{
    enum { N = 37, STEPS = 3 };
    float w0[N], want[N], g1[N];
    for (size_t i = 0; i < N; i++)
        w0[i] = want[i] = (float)i / 4.0f;
    duo d;
    int rc = duo_open(&d, PS_MODE_SYNC, 0, w0, N);
    ps_exchange *x = d.k.x;
    int64_t early_ns = 0, posted_ns = 0;
    int bad_step = -1, grad_same = 0, front_moved = 0, front_kept = 1, front_pair = 1,
        late_rc = 0;
    float *front[STEPS + 1] = {0}, bad_val = 0, bad_want = 0;
    size_t where = 0;
    if (!rc)
        front[0] = ps_exchange_weights(x, 0);
    for (int t = 0; t < STEPS && !rc && bad_step < 0; t++) {
        float *gbuf = ps_exchange_grad(x, 0);
        for (size_t i = 0; i < N; i++) {
            gbuf[i] = grad_of(0, t, i);
            g1[i] = grad_of(1, t, i);
        }
        if ((rc = ps_exchange_grad_ready(x, 0, t)))
            break;
        /* the push reads gbuf in place: backward writes the other buffer;
         * compute still reads the front, holding version t */
        grad_same += ps_exchange_grad(x, 0) == gbuf;
        front_kept &= ps_exchange_weights(x, 0) == front[t];
        if (!same_bits(ps_exchange_weights(x, 0), want, N, &where)) {
            bad_step = t;
            bad_val = ps_exchange_weights(x, 0)[where];
            bad_want = want[where];
        }
        /* version t+1 needs worker 1's push: it comes 300 ms from now */
        late_push p = {.c = d.peer, .g = g1, .step = t, .delay_ms = 300};
        if (pthread_create(&p.th, NULL, late_push_main, &p)) {
            rc = PS_ENOMEM;
            break;
        }
        rc = ps_exchange_before_use(x, 0);
        int64_t back_ns = ps_now_ns();
        pthread_join(p.th, NULL);
        late_rc |= p.rc;
        if (back_ns < p.posted_ns && !early_ns) {
            early_ns = back_ns;
            posted_ns = p.posted_ns;
        }
        front[t + 1] = ps_exchange_weights(x, 0);
        front_moved += front[t + 1] != front[t];
        /* two weight buffers take turns: the old front is the next back */
        if (t >= 1)
            front_pair &= front[t + 1] == front[t - 1];
        for (size_t i = 0; i < N; i++)
            want[i] = want[i] - LR * ((grad_of(0, t, i) + grad_of(1, t, i)) / 2.0f + 0.0f);
        if (!rc && !same_bits(front[t + 1], want, N, &where)) {
            bad_step = t + 1;
            bad_val = front[t + 1][where];
            bad_want = want[where];
        }
    }
    int fired = duo_close(&d);
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_OK(late_rc);
    CHECK_MSG(bad_step < 0, "the front at step %d: element %zu is %.9g, expected %.9g", bad_step,
              where, (double)bad_val, (double)bad_want);
    CHECK_MSG(!early_ns, "before_use returned %.1f ms before worker 1's push completed the "
              "round", (double)(posted_ns - early_ns) / 1e6);
    CHECK_MSG(grad_same == 0, "%d times the gradient on the wire was the next one's buffer",
              grad_same);
    CHECK_MSG(front_kept, "grad_ready changed the front before version t+1 was in");
    CHECK_EQ_INT(front_moved, STEPS); /* swapped in, not copied into the front */
    CHECK(front_pair);
}

PS_TEST(async_before_use_never_waits_and_swaps_in_a_pull_only_once_it_has_landed)
{
    enum { N = 20 };
    float w0[N], want[N], g0[N], g1[N];
    for (size_t i = 0; i < N; i++) {
        w0[i] = (float)i;
        g0[i] = grad_of(0, 0, i);
        g1[i] = grad_of(1, 0, i);
        want[i] = (w0[i] - LR * g0[i]) - LR * g1[i];
    }
    /* SSP 0: worker 0's pull of version 1 is held until worker 1 pushes */
    duo d;
    int rc = duo_open(&d, PS_MODE_ASYNC, 0, w0, N);
    ps_exchange *x = d.k.x;
    float *front0 = rc ? NULL : ps_exchange_weights(x, 0);
    int held_moved = 0, held_changed = 0, rc_peer = 0;
    int64_t slowest_ns = 0;
    float *front1 = NULL;
    if (!rc) {
        memcpy(ps_exchange_grad(x, 0), g0, sizeof g0);
        rc = ps_exchange_grad_ready(x, 0, 0);
    }
    /* the pull is held by the server: before_use returns at once and the
     * front stays what it was */
    for (int j = 0; j < 5 && !rc; j++) {
        int64_t t0 = ps_now_ns();
        rc = ps_exchange_before_use(x, 0);
        int64_t d = ps_now_ns() - t0;
        slowest_ns = d > slowest_ns ? d : slowest_ns;
        held_moved += ps_exchange_weights(x, 0) != front0;
        held_changed += memcmp(front0, w0, sizeof w0) != 0;
        ps_test_sleep_ms(20);
    }
    /* worker 1's push releases it: it lands, and the next before_use takes it */
    if (!rc)
        rc_peer = peer_push(d.peer, g1, 0);
    for (int t = 0; t < WAIT_MS && !rc && !rc_peer; t += 5) {
        if ((rc = ps_exchange_before_use(x, 0)) || ps_exchange_weights(x, 0) != front0)
            break;
        ps_test_sleep_ms(5);
    }
    float got[N];
    if (!rc) {
        front1 = ps_exchange_weights(x, 0);
        memcpy(got, front1, sizeof got);
    }
    int fired = duo_close(&d);
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_OK(rc_peer);
    CHECK_MSG(slowest_ns < 100 * 1000000LL, "an async before_use waited %.1f ms for a held pull",
              (double)slowest_ns / 1e6);
    CHECK_MSG(held_moved == 0 && held_changed == 0, "the front moved (%d) or changed (%d) "
              "before the pull landed", held_moved, held_changed);
    CHECK_MSG(front1 != front0, "the landed pull was not swapped in within %d ms", WAIT_MS);
    CHECK_BITS(got, want, N, "the front after the pull landed");
}

/* ---------------------------------------------------------------- async sums */

PS_TEST(async_gradients_that_find_the_wire_busy_go_out_as_one_sum_counted_as_their_number)
{
    /* SSP 3, worker 1 held at clock 0: worker 0's pulls of version 4 and up
     * are held, so from step 3 on its push-pull stays in flight.  Steps 4, 5
     * and 6 find it busy and wait in a sum (at most max-staleness 3 of
     * them); step 7 must wait for the wire (worker 1's first push, 300 ms
     * later, lets step 3's pull land), then joins the sum, which goes out as
     * one push of 4 gradients from step 4. */
    enum { N = 24, K = 3 };
    float w0[N], want[N], p[N];
    for (size_t i = 0; i < N; i++)
        w0[i] = want[i] = (float)i - 10.0f;
    duo d;
    int rc = duo_open(&d, PS_MODE_ASYNC, K, w0, N);
    ps_exchange *x = d.k.x;
    ps_client *peer = d.peer;
    int rc_peer = 0, peer_steps = 0;
    int64_t early_ns = 0;
    ps_stats before = {0}, after = {0};
    late_push lp = {.c = peer, .g = p, .step = 0, .delay_ms = 300};
    for (int t = 0; t < 9 && !rc && !rc_peer; t++) {
        float *g = ps_exchange_grad(x, 0);
        for (size_t i = 0; i < N; i++)
            g[i] = grad_of(0, t, i);
        if (t == 7) {
            for (size_t i = 0; i < N; i++)
                p[i] = grad_of(1, 0, i);
            peer_steps = 1;
            if (pthread_create(&lp.th, NULL, late_push_main, &lp)) {
                rc = PS_ENOMEM;
                break;
            }
            rc = ps_exchange_grad_ready(x, 0, t);
            int64_t back_ns = ps_now_ns();
            pthread_join(lp.th, NULL);
            rc_peer = lp.rc;
            if (back_ns < lp.posted_ns)
                early_ns = lp.posted_ns - back_ns;
            continue;
        }
        if (t == 8) {
            /* the sum of steps 4..7 needs worker 1 at clock 5 for its pull;
             * a push of step 8 is taken only if worker 0's clock is 8 */
            for (; peer_steps < 6 && !rc_peer; peer_steps++) {
                for (size_t i = 0; i < N; i++)
                    p[i] = grad_of(1, peer_steps, i);
                rc_peer = peer_push(peer, p, peer_steps);
            }
            if (rc_peer)
                break;
        }
        if ((rc = ps_exchange_grad_ready(x, 0, t)))
            break;
        /* steps 0..2: their pulls are answered at once; finish takes each */
        if (t < 3 && (rc = ps_exchange_finish(x)))
            break;
        /* step 3's push may still be on its way (it was taken, not
         * answered): wait up to 5 s for it to count, then look */
        for (int k = 0; t == 6 && k < 500; k++) {
            if (ps_test_stats(d.v.port, &before)) {
                rc = PS_ETIMEDOUT;
                break;
            }
            if (before.pushes >= 4)
                break;
            ps_test_sleep_ms(10);
        }
    }
    if (!rc && !rc_peer)
        rc = ps_exchange_finish(x);
    float front[N], pulled[N];
    int64_t version = -1;
    if (!rc && !rc_peer) {
        memcpy(front, ps_exchange_weights(x, 0), sizeof front);
        rc_peer = peer_pull(peer, pulled, &version);
        if (ps_test_stats(d.v.port, &after))
            rc = PS_ETIMEDOUT;
    }
    int fired = duo_close(&d);
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_MSG(rc_peer == 0, "worker 1: %s", ps_strerror(rc_peer));
    /* while steps 4..6 waited in the sum, nothing of theirs reached the server */
    CHECK_EQ_INT(before.pushes, 4);
    /* a fourth would be more than max-staleness past the last pull */
    CHECK_MSG(!early_ns, "step 7 joined the sum %.1f ms before the wire was free",
              (double)early_ns / 1e6);
    /* the server applied each of steps 0..3 and 8, the mean of steps 4..7,
     * and worker 1's six pushes */
    for (size_t i = 0; i < N; i++) {
        float sum = grad_of(0, 4, i) + grad_of(0, 5, i) + grad_of(0, 6, i) + grad_of(0, 7, i);
        for (int t = 0; t < 4; t++)
            want[i] -= LR * grad_of(0, t, i);
        want[i] -= LR * (sum / 4.0f);
        want[i] -= LR * grad_of(0, 8, i);
        for (int s = 0; s < 6; s++)
            want[i] -= LR * grad_of(1, s, i);
    }
    CHECK_BITS(pulled, want, N, "the servers' weights");
    CHECK_BITS(front, want, N, "worker 0's front after finish");
    /* the sum counts as 4 pushes: version and updates 9 + 6; it was one
     * message: the bytes of init + 6 + 6 messages */
    CHECK_EQ_INT(version, 15);
    CHECK_EQ_INT(after.updates, 15);
    CHECK_EQ_INT(after.pushes, 15);
    CHECK_EQ_INT(after.bytes_in, (uint64_t)(1 + 6 + 6) * N * sizeof(float));
}

/* ---------------------------------------------------------------- staging */

/* A device whose memory is host memory that the exchange must treat as
 * device memory (host_memory 0): the host backend underneath, with a copy
 * stream that runs only when the test calls dev_run (as a GPU's runs when
 * it gets to it), events that happen once the copies recorded before them
 * ran, and a log of every copy, record and wait in the order issued. */
typedef struct fake_event {
    int64_t at; /* happened once `at` copies of the copy stream ran */
} fake_event;

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_SYNC };

typedef struct dev_op {
    int op, kind, stream;
    const void *dst, *src;
    const fake_event *e;
} dev_op;

typedef struct fake_dev {
    ps_backend b; /* first: the exchange's callbacks get &b */
    ps_backend *host;
    pthread_mutex_t mu;
    struct { void *dst; const void *src; size_t bytes; void *snap; } q[64];
    int nq;
    int64_t queued, ran;
    dev_op log[256];
    int nlog;
    int torn;     /* a queued copy's source changed before the copy ran */
    int queries;  /* event_query calls (the comm thread's ready polls) */
} fake_dev;

static fake_dev *dev_of(ps_backend *b) { return (fake_dev *)b; }

static void dev_log(fake_dev *d, int op, int kind, int stream, const void *dst, const void *src,
                    const fake_event *e)
{
    if (d->nlog < 256)
        d->log[d->nlog++] = (dev_op){op, kind, stream, dst, src, e};
}

/* Run the copy stream's queue (with d->mu held). */
static void dev_drain(fake_dev *d)
{
    for (int k = 0; k < d->nq; k++) {
        if (memcmp(d->q[k].src, d->q[k].snap, d->q[k].bytes) != 0)
            d->torn++;
        memcpy(d->q[k].dst, d->q[k].src, d->q[k].bytes);
        free(d->q[k].snap);
        d->ran++;
    }
    d->nq = 0;
}

static void dev_run(fake_dev *d)
{
    pthread_mutex_lock(&d->mu);
    dev_drain(d);
    pthread_mutex_unlock(&d->mu);
}

static int dev_copy(ps_backend *b, void *dst, const void *src, size_t bytes, int kind,
                    int stream)
{
    fake_dev *d = dev_of(b);
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    dev_log(d, OP_COPY, kind, stream, dst, src, NULL);
    if (stream == PS_STREAM_COPY && d->nq < 64 && (d->q[d->nq].snap = malloc(bytes))) {
        /* later: keep what the source holds now, to see it is left alone */
        memcpy(d->q[d->nq].snap, src, bytes);
        d->q[d->nq].dst = dst;
        d->q[d->nq].src = src;
        d->q[d->nq].bytes = bytes;
        d->nq++;
        d->queued++;
    } else if (stream == PS_STREAM_COPY) {
        rc = PS_ENOMEM;
    } else {
        rc = d->host->copy(d->host, dst, src, bytes, kind, stream);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static int dev_event_create(ps_backend *b, ps_event **out)
{
    (void)b;
    fake_event *e = calloc(1, sizeof *e);
    *out = (ps_event *)e;
    return e ? 0 : PS_ENOMEM;
}

static void dev_event_destroy(ps_backend *b, ps_event *e)
{
    (void)b;
    free(e);
}

static int dev_event_record(ps_backend *b, ps_event *ev, int stream)
{
    fake_dev *d = dev_of(b);
    fake_event *e = (fake_event *)ev;
    pthread_mutex_lock(&d->mu);
    e->at = stream == PS_STREAM_COPY ? d->queued : 0;
    dev_log(d, OP_RECORD, -1, stream, NULL, NULL, e);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static int dev_stream_wait_event(ps_backend *b, int stream, ps_event *ev)
{
    fake_dev *d = dev_of(b);
    pthread_mutex_lock(&d->mu);
    dev_log(d, OP_WAIT, -1, stream, NULL, NULL, (fake_event *)ev);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* The host blocks until the device got there: it runs the copy stream. */
static int dev_event_sync(ps_backend *b, ps_event *ev)
{
    fake_dev *d = dev_of(b);
    pthread_mutex_lock(&d->mu);
    dev_log(d, OP_SYNC, -1, -1, NULL, NULL, (fake_event *)ev);
    dev_drain(d);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static int dev_stream_sync(ps_backend *b, int stream)
{
    fake_dev *d = dev_of(b);
    pthread_mutex_lock(&d->mu);
    dev_log(d, OP_SYNC, -1, stream, NULL, NULL, NULL);
    dev_drain(d);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static int dev_event_query(ps_backend *b, ps_event *ev)
{
    fake_dev *d = dev_of(b);
    pthread_mutex_lock(&d->mu);
    d->queries++;
    int done = d->ran >= ((fake_event *)ev)->at;
    pthread_mutex_unlock(&d->mu);
    return done;
}

static int dev_create(fake_dev *d)
{
    memset(d, 0, sizeof *d);
    int rc = ps_backend_host_create(&d->host);
    if (rc)
        return rc;
    d->b = *d->host;
    d->b.name = "fake-device";
    d->b.host_memory = 0;
    d->b.copy = dev_copy;
    d->b.event_create = dev_event_create;
    d->b.event_destroy = dev_event_destroy;
    d->b.event_record = dev_event_record;
    d->b.stream_wait_event = dev_stream_wait_event;
    d->b.event_sync = dev_event_sync;
    d->b.stream_sync = dev_stream_sync;
    d->b.event_query = dev_event_query;
    d->b.destroy = NULL; /* the caller destroys it with dev_destroy */
    pthread_mutex_init(&d->mu, NULL);
    return 0;
}

static void dev_destroy(fake_dev *d)
{
    for (int k = 0; k < d->nq; k++)
        free(d->q[k].snap);
    ps_backend_host_destroy(d->host);
    pthread_mutex_destroy(&d->mu);
}

/* The log from index `from` on, as a string such as
 * "copy d2h copy, record copy, wait compute" (for messages and checks). */
static void dev_describe(const fake_dev *d, int from, char *out, size_t len)
{
    static const char *const ops[] = {"copy", "record", "wait", "sync"};
    static const char *const kinds[] = {"h2d", "d2h", "d2d"};
    size_t off = 0;
    out[0] = 0;
    for (int k = from; k < d->nlog && off < len; k++) {
        const dev_op *o = &d->log[k];
        off += (size_t)snprintf(out + off, len - off, "%s%s%s%s%s", k > from ? ", " : "",
                                ops[o->op], o->op == OP_COPY ? " " : "",
                                o->op == OP_COPY ? kinds[o->kind] : "",
                                o->stream == PS_STREAM_COPY      ? " copy"
                                : o->stream == PS_STREAM_COMPUTE ? " compute"
                                                                 : "");
    }
}

PS_TEST(staged_pushes_wait_for_their_device_to_host_copy_and_swaps_for_the_host_to_device_copy)
{
    enum { N = 50, STEPS = 3 };
    isrv v;
    CHECK_OK(isrv_start(&v, PS_MODE_SYNC, 1, 0));
    fake_dev d;
    if (dev_create(&d)) {
        ps_test_isrv_stop(&v);
        CHECK_MSG(0, "no host backend");
    }
    worker k = {0};
    float w0[N], want[N];
    for (size_t i = 0; i < N; i++)
        w0[i] = want[i] = (float)i / 2.0f;
    ps_client_options o;
    options(&o, &v, 0, 1, PS_MODE_SYNC, 0);
    int rc = worker_open(&k, &d.b, &o, w0, N);
    char seen[400] = "", why[600] = "";
    int bad_step = -1, early_pushes = -1, polled = 0;
    size_t where = 0;
    float got[N];
    /* start went through the staging buffers too */
    if (!rc && !same_bits(ps_exchange_weights(k.x, 0), want, N, &where))
        bad_step = 0;
    for (int t = 0; t < STEPS && !rc && bad_step < 0 && !why[0]; t++) {
        float *gbuf = ps_exchange_grad(k.x, 0);
        for (size_t i = 0; i < N; i++)
            gbuf[i] = grad_of(0, t, i);
        pthread_mutex_lock(&d.mu);
        int mark = d.nlog, queries = d.queries;
        pthread_mutex_unlock(&d.mu);
        if ((rc = ps_exchange_grad_ready(k.x, 0, t)))
            break;
        /* the push: after backward (an event on compute that the copy
         * stream waits for), a device-to-host copy of this gradient, and
         * the event the comm thread waits for before it sends */
        dev_describe(&d, mark, seen, sizeof seen);
        const dev_op *l = &d.log[mark];
        if (strcmp(seen, "record compute, wait copy, copy d2h copy, record copy") ||
            l[1].e != l[0].e || l[2].src != gbuf) {
            snprintf(why, sizeof why, "step %d: grad_ready issued [%s]%s", t, seen,
                     l[2].src != gbuf ? " (not a copy of the gradient)" : "");
            break;
        }
        /* the next backward writes the other buffer while the copy waits */
        float *next = ps_exchange_grad(k.x, 0);
        if (next == gbuf) {
            snprintf(why, sizeof why, "step %d: the next backward would write the gradient "
                     "still being copied", t);
            break;
        }
        for (size_t i = 0; i < N; i++)
            next[i] = 1e9f;
        /* nothing is sent before the copy ran */
        ps_test_sleep_ms(150);
        ps_stats st;
        if (ps_test_stats(v.port, &st)) {
            rc = PS_ETIMEDOUT;
            break;
        }
        if (st.pushes != (uint64_t)t && early_pushes < 0)
            early_pushes = t;
        pthread_mutex_lock(&d.mu);
        polled += d.queries > queries;
        pthread_mutex_unlock(&d.mu);
        dev_run(&d);
        /* the last swap's host-to-device copy ran with this queue */
        if (t > 0 && !same_bits(ps_exchange_weights(k.x, 0), want, N, &where)) {
            bad_step = t;
            break;
        }
        /* the swap: the pull that landed in pinned memory goes to the back
         * buffer on the copy stream, and compute waits on its event */
        float *front = ps_exchange_weights(k.x, 0);
        mark = d.nlog;
        if ((rc = ps_exchange_before_use(k.x, 0)))
            break;
        dev_describe(&d, mark, seen, sizeof seen);
        l = &d.log[mark];
        if (strcmp(seen, "copy h2d copy, record copy, wait compute") || l[2].e != l[1].e ||
            l[0].dst != ps_exchange_weights(k.x, 0) || ps_exchange_weights(k.x, 0) == front) {
            snprintf(why, sizeof why, "step %d: before_use issued [%s]%s", t, seen,
                     l[0].dst != ps_exchange_weights(k.x, 0) ? " (not into the new front)" : "");
            break;
        }
        for (size_t i = 0; i < N; i++)
            want[i] = want[i] - LR * (grad_of(0, t, i) / 1.0f + 0.0f);
    }
    dev_run(&d);
    if (!rc)
        memcpy(got, ps_exchange_weights(k.x, 0), sizeof got);
    int fired = worker_close(&k);
    ps_test_isrv_stop(&v);
    int torn = d.torn;
    dev_destroy(&d);
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(!fired);
    CHECK_MSG(!why[0], "%s", why);
    CHECK_MSG(bad_step < 0, "the front at step %d: element %zu differs", bad_step, where);
    CHECK_MSG(early_pushes < 0, "step %d's push reached the server before its copy ran",
              early_pushes);
    CHECK_EQ_INT(polled, STEPS); /* the comm thread asked the copy's event */
    CHECK_MSG(torn == 0, "%d queued copies saw their source change before they ran", torn);
    CHECK_BITS(got, want, N, "the last front");
}
