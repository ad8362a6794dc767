/* The exchange when the device fails under it, without a GPU: a fake device
 * backend (the host backend with host_memory 0, so the exchange stages every
 * gradient through "pinned" buffers and the comm thread polls the copy's
 * event) whose event_query fails on demand the way a CUDA event does after a
 * sticky error (cudaErrorIllegalAddress and the like: every later query
 * fails too).  The push held behind that copy must not be polled forever:
 * the waiting call returns PS_EDEVICE, the failing query is asked once (no
 * log flooded at 50 000 lines a second), and every later call fails fast.
 * Every wait is bounded: a call still blocked after 10 s fails the case and
 * is freed by ps_exchange_interrupt. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ps_backend.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define N 1000
#define HANG_MS 10000

/* event_query's answer: ready, not yet, or failed (atomic) */
enum { EV_READY, EV_PENDING, EV_FAILED };
static int g_event_state;
static int g_failed_queries; /* how often a failing query was asked (atomic) */

static int fake_event_query(ps_backend *b, ps_event *e)
{
    (void)b;
    (void)e;
    switch (__atomic_load_n(&g_event_state, __ATOMIC_ACQUIRE)) {
    case EV_READY:
        return 1;
    case EV_PENDING:
        return 0;
    default:
        __atomic_add_fetch(&g_failed_queries, 1, __ATOMIC_ACQ_REL);
        return -PS_EDEVICE;
    }
}

/* The host backend dressed as a device: copies are memcpy and events are
 * signalled at once, except what event_query says. */
static ps_backend *fake_device(void)
{
    ps_backend *b;
    if (ps_backend_host_create(&b) != 0)
        return NULL;
    b->name = "fake:0";
    b->host_memory = 0;
    b->event_query = fake_event_query;
    return b;
}

/* One blocking exchange call on a thread, so a hang fails the case
 * instead of the whole program. */
typedef struct call {
    ps_exchange *x;
    int what; /* 0 before_use(0), 1 finish */
    int rc;
} call;

static void *call_main(void *arg)
{
    call *c = arg;
    c->rc = c->what == 0 ? ps_exchange_before_use(c->x, 0) : ps_exchange_finish(c->x);
    return NULL;
}

/* Run the call; its return code, or -1 when it was still blocked after
 * HANG_MS (it is then interrupted and joined).  *ms: how long it took. */
static int bounded(ps_exchange *x, int what, double *ms)
{
    call c = {.x = x, .what = what, .rc = -1};
    pthread_t th;
    int64_t t0 = ps_now_ns();
    if (pthread_create(&th, NULL, call_main, &c) != 0)
        return -2;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += HANG_MS / 1000;
    int hung = pthread_timedjoin_np(th, NULL, &until) != 0;
    *ms = (double)(ps_now_ns() - t0) * 1e-6;
    if (hung) {
        ps_exchange_interrupt(x);
        pthread_join(th, NULL);
        return -1;
    }
    return c.rc;
}

/* A step's gradient goes out while its copy is still "in flight", then the
 * device fails: the blocking call (sync: before_use waits for the next
 * version; async: finish) must return PS_EDEVICE. */
static void copy_failure_case(const char *mode, int shm)
{
    __atomic_store_n(&g_event_state, EV_READY, __ATOMIC_RELEASE);
    __atomic_store_n(&g_failed_queries, 0, __ATOMIC_RELEASE);
    int sync = strcmp(mode, "sync") == 0;
    char words[128], ep[64];
    snprintf(words, sizeof words, "--num-workers 1 --mode %s --lr 0.1 --threads 1", mode);
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.num_workers = 1;
    o.mode = sync ? PS_MODE_SYNC : PS_MODE_ASYNC;
    o.shm = shm;
    o.hello_timeout_ms = 10000;
    ps_backend *b = fake_device();
    CHECK(b);
    static float w[N], g[N];
    for (int i = 0; i < N; i++) {
        w[i] = 1.0f;
        g[i] = 0.5f;
    }
    ps_exchange *x = NULL;
    int rc = ps_exchange_open(&o, b, &x);
    if (!rc)
        rc = ps_exchange_add(x, 7, N, w, g, 0);
    if (!rc)
        rc = ps_exchange_start(x);
    /* a healthy step first: the staging path works with this fake */
    if (!rc)
        rc = ps_exchange_grad_ready(x, 0, 0);
    double ms = 0;
    if (!rc)
        rc = bounded(x, sync ? 0 : 1, &ms);
    float w1 = rc ? 0.0f : ps_exchange_weights(x, 0)[0];
    int failed_rc = -3, later_rc = -3;
    double failed_ms = 0;
    if (!rc) {
        /* step 1: the copy is pending when the push is posted, then fails */
        __atomic_store_n(&g_event_state, EV_PENDING, __ATOMIC_RELEASE);
        rc = ps_exchange_grad_ready(x, 0, 1);
        ps_test_sleep_ms(50);
        __atomic_store_n(&g_event_state, EV_FAILED, __ATOMIC_RELEASE);
        if (!rc) {
            failed_rc = bounded(x, sync ? 0 : 1, &failed_ms);
            later_rc = ps_exchange_grad_ready(x, 0, 2);
        }
    }
    ps_exchange_close(x);
    ps_backend_host_destroy(b);
    ps_test_stop(sv.pid, 5000);
    CHECK_OK(rc);
    /* 1 - 0.1 * 0.5 after the healthy step */
    CHECK_NEAR(w1, 0.95, 1e-6);
    CHECK_MSG(failed_rc != -1, "%s shm %d: the call after the failed copy still waited after "
              "%d ms (the push is polled forever)", mode, shm, HANG_MS);
    CHECK_MSG(failed_rc == PS_EDEVICE, "%s shm %d: the call after the failed copy returned %d "
              "(%s), expected PS_EDEVICE", mode, shm, failed_rc,
              failed_rc > 0 ? ps_strerror(failed_rc) : "-");
    CHECK_MSG(failed_ms < 2000, "%s shm %d: PS_EDEVICE came after %.0f ms", mode, shm,
              failed_ms);
    CHECK_EQ_INT(__atomic_load_n(&g_failed_queries, __ATOMIC_ACQUIRE), 1);
    CHECK_EQ_INT(later_rc, PS_EDEVICE);
}

PS_TEST(sync_failed_gradient_copy_returns_edevice_not_a_hang)
{
    copy_failure_case("sync", 0);
}

PS_TEST(sync_failed_gradient_copy_through_shared_memory_returns_edevice)
{
    copy_failure_case("sync", 1);
}

PS_TEST(async_failed_gradient_copy_returns_edevice_not_a_hang)
{
    copy_failure_case("async", 0);
}
