/* Helpers for the tests of ps_server and its parts: a live bin/ps_server,
 * a raw ZeroMQ DEALER that speaks the protocol below libps (so a test sees
 * exactly what the server answers), and shard hooks that record their calls.
 * Every test program links this module (see the Makefile). */
#ifndef PS_TEST_SERVER_H
#define PS_TEST_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "server.h"
#include "shard.h"

#define PS_TEST_RPC_MS 5000 /* bound on every wait for a reply that must come */

typedef struct ps_test_server {
    int pid, port;
    char log[512];
} ps_test_server;

/* Start bin/ps_server with the arguments in words (split at spaces, as
 * ps_test_spawn_words), first adding --bind on a free 127.0.0.1 port
 * (sv->port) when bind is set; its output goes to serverN.log in the scratch
 * directory (sv->log).  0, or -1 when it cannot be started. */
int ps_test_server_start(ps_test_server *sv, int bind, const char *words);

/* The admin token tests give servers (ps_server --admin-token-file) and
 * libps (ps_client_options.admin_token). */
#define PS_TEST_ADMIN_TOKEN "test-admin-token-0123456789abcdef"

/* A file holding `token` and a newline, mode `mode`, in the scratch
 * directory under `name`; its path (static storage, one per name), or NULL. */
const char *ps_test_token_file(const char *name, const char *token, int mode);

/* A DEALER connected to tcp://127.0.0.1:port, on a context the test
 * program shares (never terminated); linger 0, and reconnecting every 10 ms
 * because the server may still be starting.  The caller zmq_close()s it. */
void *ps_test_dealer(int port);

/* A request header (ps_header_init) with these fields set. */
ps_header ps_test_header(uint32_t type, int rank, uint64_t seq, uint64_t key, uint32_t chunk,
                         int64_t step);

/* Send h; with a payload, n floats follow as a second frame and the count
 * and dtype sent are n and f32 whatever h says.  0, or -1. */
int ps_test_send(void *s, const ps_header *h, const float *payload, size_t n);

/* Send h as it is, then n frames (frames[i]: bytes[i] bytes; NULL: zeros):
 * a table's ids and rows.  0, or -1. */
int ps_test_send_frames(void *s, const ps_header *h, const void *const *frames,
                        const size_t *bytes, int n);

/* Receive one reply.  0: decoded into h, its payload copied into out when
 * it fits in cap floats (*got, when got is not NULL, is then its length,
 * else 0); 1: nothing within timeout_ms; -1: a reply that does not decode. */
int ps_test_recv(void *s, int timeout_ms, ps_header *h, float *out, size_t cap, size_t *got);

/* A fake server's answer on its ROUTER s: to the peer of routing id `id`
 * (copied, kept), header h, and `bytes` bytes of pay as a payload frame
 * when pay is not NULL. */
void ps_test_reply(void *s, zmq_msg_t *id, const ps_header *h, const void *pay, size_t bytes);
/* ps_test_send, then ps_test_recv within PS_TEST_RPC_MS. */
int ps_test_rpc(void *s, const ps_header *h, const float *payload, size_t n, ps_header *r,
                float *out, size_t cap, size_t *got);

/* Hello as worker `rank` of nw to server 0 of 1 in `mode` with that
 * max-staleness, leaving the optimizer unchecked.  0 when accepted. */
int ps_test_hello(void *s, int rank, int mode, int nw, int max_staleness);

/* A ps_server on a thread of this process (ps_server_open + ps_server_run),
 * on a free tcp 127.0.0.1 port (so ps_test_stats and DEALERs can reach it):
 * sgd at lr, 1 update thread, the same-host data plane off (payloads take
 * the network path), max_staleness in async (sync: 0), --metrics-port when
 * metrics_port > 0.  Log level warn: its info lines are noise in a test.
 * 0, or the PS_E* of ps_server_open (its why printed as a # line). */
typedef struct ps_test_isrv {
    ps_server *s;
    pthread_t th;
    int port, running;
    char ep[64];
    uint64_t max_memory; /* its --max-memory: the host's default (ps_server_auto_memory) */
} ps_test_isrv;
static inline void *ps_test_isrv_main_(void *arg)
{
    ps_test_isrv *v = arg;
    ps_server_run(v->s);
    return NULL;
}

/* (inline: only the tests that start one link the server) */
static inline int ps_test_isrv_start(ps_test_isrv *v, int mode, int num_workers, int max_staleness, float lr,
                       int metrics_port)
{
    memset(v, 0, sizeof *v);
    ps_log_set_level(PS_LOG_WARN);
    ps_server_config c;
    ps_server_config_default(&c);
    v->port = ps_test_free_port();
    snprintf(v->ep, sizeof v->ep, "tcp://127.0.0.1:%d", v->port);
    c.bind = v->ep;
    c.num_workers = num_workers;
    c.mode = mode;
    c.max_staleness = mode == PS_MODE_SYNC ? 0 : max_staleness;
    c.opt.kind = PS_OPT_SGD;
    c.opt.lr = lr;
    c.threads = 1;
    c.shm = PS_SHM_OFF;
    c.metrics_port = metrics_port;
    v->max_memory = c.max_memory;
    char why[512];
    int rc = ps_server_open(&c, &v->s, why, sizeof why);
    if (rc) {
        printf("# ps_server_open: %s\n", why);
        return rc;
    }
    if (pthread_create(&v->th, NULL, ps_test_isrv_main_, v)) {
        ps_server_close(v->s);
        return PS_ENOMEM;
    }
    v->running = 1;
    return 0;
}

/* Stop it, join its thread and close it (nothing when it did not start). */
static inline void ps_test_isrv_stop(ps_test_isrv *v)
{
    if (!v->running)
        return;
    ps_server_stop(v->s);
    pthread_join(v->th, NULL);
    ps_server_close(v->s);
    v->running = 0;
}

/* The counters of the server on port, asked for as a tool (rank -1) on a
 * DEALER of its own.  0, or -1 when no STATS reply came within 10 s. */
int ps_test_stats(int port, ps_stats *st);

/* What shard hooks were called with: how many kept gradients were
 * released, waiting pulls made ready and cancelled, and the first (up to 8)
 * weights and the version of the last ready one. */
typedef struct ps_test_hook_log {
    int released, ready, cancelled;
    float w[8];
    int64_t version;
} ps_test_hook_log;

/* Hooks for ps_shard_create that record into log (zeroed here). */
ps_shard_hooks ps_test_hook_log_hooks(ps_test_hook_log *log);

#endif
