/* libps when things go wrong around it, against the real bin/ps_server:
 * ps_client_interrupt ends every wait (also one whose payload ZeroMQ still
 * holds for a dead server) and start's hello wait; a silent server is given
 * up on after server_timeout_ms, naming it, while a live one holding a sync
 * pull is not; a worker the server dropped says hello again and its refused
 * request is resent and counted; barrier_info names the ranks a barrier
 * waits for.  Every wait is bounded; the servers are killed at exit. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define KEY 1
#define N 4

/* A client of the server on port as worker rank of nw in mode, with
 * tensor KEY of N floats, started; NULL on failure (why says it). */
static ps_client *client(int port, int rank, int nw, int mode, int heartbeat_ms,
                         int server_timeout_ms, char *why, size_t why_len)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.rank = rank;
    o.num_workers = nw;
    o.mode = mode;
    o.hello_timeout_ms = 10000;
    o.request_timeout_ms = 1000;
    o.heartbeat_ms = heartbeat_ms;
    o.server_timeout_ms = server_timeout_ms;
    ps_client *c;
    if (ps_client_open(&o, &c) != 0) {
        snprintf(why, why_len, "open: %s", ps_client_last_error(NULL));
        return NULL;
    }
    if (ps_client_register(c, KEY, N) != 0 || ps_client_start(c) != 0) {
        snprintf(why, why_len, "start: %s", ps_client_last_error(c));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

/* Init KEY with w and wait. */
static int init(ps_client *c, const float *w)
{
    ps_request r;
    int rc = ps_client_init(c, KEY, w, &r);
    return rc ? rc : ps_request_wait(&r);
}

static double ms_since(int64_t t0) { return (double)(ps_now_ns() - t0) * 1e-6; }

/* Interrupt c from another thread after a pause. */
typedef struct later {
    ps_client *c;
    int ms;
    pthread_t th;
} later;

static void *later_main(void *arg)
{
    later *l = arg;
    ps_test_sleep_ms(l->ms);
    ps_client_interrupt(l->c);
    return NULL;
}

static void interrupt_later(later *l, ps_client *c, int ms)
{
    l->c = c;
    l->ms = ms;
    pthread_create(&l->th, NULL, later_main, l);
}

/* A sync server of 2 workers (sv) and worker 0 (returned) with its pull of
 * version 1 posted into out (*pull): held by the server, since round 0
 * waits for worker 1, which never comes.  NULL on failure (why). */
static ps_client *held_sync_pull(ps_test_server *sv, int heartbeat_ms, int server_timeout_ms,
                                 float *out, ps_request *pull, char *why, size_t why_len)
{
    if (ps_test_server_start(sv, 1, "--mode sync --num-workers 2")) {
        snprintf(why, why_len, "cannot start bin/ps_server");
        return NULL;
    }
    ps_client *c = client(sv->port, 0, 2, PS_MODE_SYNC, heartbeat_ms, server_timeout_ms, why,
                          why_len);
    static const float w[N] = {1, 2, 3, 4}, g[N] = {0.5f, 0.5f, 0.5f, 0.5f};
    ps_request push;
    int rc = 0;
    if (c && ((rc = init(c, w)) || (rc = ps_client_push(c, KEY, g, 0, &push)) ||
              (rc = ps_request_wait(&push)) || (rc = ps_client_pull(c, KEY, out, 1, pull)))) {
        snprintf(why, why_len, "init, push or pull: %s", ps_strerror(rc));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

PS_TEST(interrupt_ends_a_held_sync_pull_and_a_push_held_for_a_dead_server)
{
    ps_test_server sv;
    char why[512];
    float w[N] = {1, 2, 3, 4}, g[N] = {0.5f, 0.5f, 0.5f, 0.5f}, out[N];
    ps_request push, pull;
    ps_client *c = held_sync_pull(&sv, 1000, 60000, out, &pull, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    later l;
    int64_t t0 = ps_now_ns();
    interrupt_later(&l, c, 300);
    CHECK_EQ_INT(ps_request_wait(&pull), PS_ECLOSED);
    double took = ms_since(t0);
    pthread_join(l.th, NULL);
    CHECK_MSG(took < 300 + 1000, "the wait ended %.0f ms after start (interrupt at 300)", took);
    CHECK_MSG(strstr(pull.err, "interrupted"), "err '%s'", pull.err);
    /* later posts and blocking helpers fail at once */
    CHECK_EQ_INT(ps_client_push(c, KEY, g, 1, &push), PS_ECLOSED);
    CHECK_EQ_INT(ps_request_wait(&push), PS_ECLOSED);
    CHECK_EQ_INT(ps_client_barrier(c, 3), PS_ECLOSED);
    ps_client_interrupt(c); /* again: nothing happens */
    ps_client_close(c);

    /* a push whose payload ZeroMQ queues for a server that is gone: the
     * interrupt discards it, so the request can complete */
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 1"));
    c = client(sv.port, 0, 1, PS_MODE_ASYNC, 1000, 60000, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    CHECK_OK(init(c, w));
    kill(sv.pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 128 + SIGKILL);
    CHECK_OK(ps_client_push(c, KEY, g, 0, &push));
    CHECK_EQ_INT(ps_request_wait_for(&push, 200), -1);
    t0 = ps_now_ns();
    ps_client_interrupt(c);
    CHECK_EQ_INT(ps_request_wait_for(&push, 2000), PS_ECLOSED);
    took = ms_since(t0);
    CHECK_MSG(took < 1000, "the push completed %.0f ms after the interrupt", took);
    printf("# interrupted waits ended; the held push %.1f ms after the interrupt\n", took);
    ps_client_close(c);
}

PS_TEST(interrupt_ends_start_waiting_for_hello)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ps_test_free_port()); /* nobody there */
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.hello_timeout_ms = 30000;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_OK(ps_client_register(c, KEY, N));
    later l;
    int64_t t0 = ps_now_ns();
    interrupt_later(&l, c, 200);
    int rc = ps_client_start(c);
    double took = ms_since(t0);
    pthread_join(l.th, NULL);
    CHECK_EQ_INT(rc, PS_ECLOSED);
    CHECK_MSG(took < 200 + 1000, "start returned after %.0f ms", took);
    CHECK_MSG(strstr(ps_client_last_error(c), "interrupted"), "last error '%s'",
              ps_client_last_error(c));
    ps_client_close(c);
}

PS_TEST(silent_server_is_given_up_after_server_timeout_but_a_live_one_is_not)
{
    ps_test_server sv;
    char why[512];
    float g[N] = {1, 1, 1, 1}, out[N];
    ps_request push, pull;
    ps_client *c = held_sync_pull(&sv, 100, 600, out, &pull, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    /* a live server holds the pull but answers heartbeats: that is not silence */
    CHECK_EQ_INT(ps_request_wait_for(&pull, 1500), -1);
    /* gone: given up on within the timeout (plus the poll's slack), also a
     * push whose payload ZeroMQ still queues for the dead server */
    kill(sv.pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 128 + SIGKILL);
    int64_t t0 = ps_now_ns();
    CHECK_OK(ps_client_push(c, KEY, g, 1, &push));
    CHECK_EQ_INT(ps_request_wait_for(&pull, 5000), PS_ETIMEDOUT);
    double took = ms_since(t0);
    CHECK_EQ_INT(ps_request_wait_for(&push, 2000), PS_ETIMEDOUT);
    char want[128];
    snprintf(want, sizeof want, "no reply from tcp://127.0.0.1:%d for 0.6 s (ps_server down?); "
             "giving up", sv.port);
    CHECK_MSG(strstr(pull.err, want), "err '%s', expected '%s'", pull.err, want);
    CHECK_MSG(took < 2000, "given up %.0f ms after the kill (timeout 600 ms)", took);
    printf("# a killed server was given up on %.0f ms after the kill (server timeout 600 ms)\n",
           took);
    ps_client_close(c);
}

PS_TEST(dropped_worker_says_hello_again_and_its_refused_push_is_resent_and_counted)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode sync --num-workers 2 --lr 1 "
                                          "--worker-timeout 1 --on-worker-loss drop"));
    char why[512];
    /* worker 1 sends no heartbeats: it goes silent between requests */
    ps_client *a = client(sv.port, 0, 2, PS_MODE_SYNC, 100, 60000, why, sizeof why);
    CHECK_MSG(a, "%s", why);
    ps_client *b = client(sv.port, 1, 2, PS_MODE_SYNC, 0, 60000, why, sizeof why);
    CHECK_MSG(b, "%s", why);
    float w[N] = {1, 2, 3, 4}, out[N];
    float ga[N] = {0.5f, 0.25f, -1, 2}, gb[N] = {1.5f, -0.75f, 3, 0.125f};
    CHECK_OK(init(a, w));
    ps_request pa, pb, pull;
    CHECK_OK(ps_client_push(a, KEY, ga, 0, &pa));
    CHECK_OK(ps_client_push(b, KEY, gb, 0, &pb));
    CHECK_OK(ps_request_wait(&pa));
    CHECK_OK(ps_request_wait(&pb));
    for (int i = 0; i < N; i++)
        w[i] = w[i] - 1.0f * ((ga[i] + gb[i]) / 2.0f + 0.0f * w[i]);
    CHECK_MSG(ps_test_wait_for_text(sv.log, "worker 1 silent for", 10000, sv.pid) == 0,
              "worker 1 was not dropped (%s)", sv.log);
    /* its next push is refused with PS_EHELLO; libps says hello and resends it */
    CHECK_OK(ps_client_push(b, KEY, gb, 1, &pb));
    CHECK_EQ_INT(ps_request_wait_for(&pb, 10000), 0);
    CHECK(ps_test_file_has(sv.log, "worker 1 said hello again"));
    /* round 1 has both gradients again: the mean of two, bitwise */
    CHECK_OK(ps_client_push(a, KEY, ga, 1, &pa));
    CHECK_OK(ps_request_wait(&pa));
    CHECK_OK(ps_client_pull(a, KEY, out, 2, &pull));
    CHECK_EQ_INT(ps_request_wait_for(&pull, 10000), 0);
    CHECK_EQ_INT(pull.version, 2);
    for (int i = 0; i < N; i++)
        w[i] = w[i] - 1.0f * ((ga[i] + gb[i]) / 2.0f + 0.0f * w[i]);
    CHECK(memcmp(out, w, sizeof w) == 0);
    ps_client_close(a);
    ps_client_close(b);
}

PS_TEST(barrier_info_names_the_ranks_a_barrier_waits_for)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 3"));
    char why[512];
    ps_client *a = client(sv.port, 0, 3, PS_MODE_ASYNC, 1000, 60000, why, sizeof why);
    CHECK_MSG(a, "%s", why);
    ps_client *b = client(sv.port, 1, 3, PS_MODE_ASYNC, 1000, 60000, why, sizeof why);
    CHECK_MSG(b, "%s", why);
    ps_barrier_info bi;
    CHECK_OK(ps_client_barrier_info(a, &bi));
    CHECK_EQ_INT(bi.id, -1);
    ps_request ba, bb;
    CHECK_OK(ps_client_barrier_post(a, 7, &ba));
    for (int t = 0; t < 100 && bi.id != 7; t++) { /* until the server has it */
        CHECK_OK(ps_client_barrier_info(b, &bi));
        ps_test_sleep_ms(10);
    }
    CHECK_EQ_INT(bi.id, 7);
    CHECK_EQ_INT(bi.missing, 2);
    CHECK_EQ_INT(bi.nranks, 2);
    CHECK_EQ_INT(bi.ranks[0], 1);
    CHECK_EQ_INT(bi.ranks[1], 2);
    CHECK_OK(ps_client_barrier_post(b, 7, &bb));
    for (int t = 0; t < 100 && bi.missing != 1; t++) {
        CHECK_OK(ps_client_barrier_info(a, &bi));
        ps_test_sleep_ms(10);
    }
    CHECK_EQ_INT(bi.missing, 1);
    CHECK_EQ_INT(bi.nranks, 1);
    CHECK_EQ_INT(bi.ranks[0], 2);
    CHECK_EQ_INT(ps_request_wait_for(&ba, 100), -1);
    ps_client_interrupt(a);
    CHECK_EQ_INT(ps_request_wait_for(&ba, 2000), PS_ECLOSED);
    ps_client_close(a);
    ps_client_close(b);
    CHECK_EQ_INT(bb.status, PS_ECLOSED);
}
