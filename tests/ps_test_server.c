#include "ps_test_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "ps_test.h"

int ps_test_server_start(ps_test_server *sv, int bind, const char *words)
{
    static int count;
    size_t len = strlen(words) + 64;
    char *all = malloc(len);
    if (!all)
        return -1;
    sv->port = ps_test_free_port();
    if (bind)
        snprintf(all, len, "--bind tcp://127.0.0.1:%d %s", sv->port, words);
    else
        snprintf(all, len, "%s", words);
    snprintf(sv->log, sizeof sv->log, "%s/server%d.log", ps_test_tmpdir(), count++);
    sv->pid = ps_test_spawn_words("ps_server", all, sv->log);
    free(all);
    return sv->pid > 0 ? 0 : -1;
}

const char *ps_test_token_file(const char *name, const char *token, int mode)
{
    static char path[8][512];
    static int n;
    char *p = path[n++ % 8];
    snprintf(p, 512, "%s/%s", ps_test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    if (!f)
        return NULL;
    fprintf(f, "%s\n", token);
    fclose(f);
    return chmod(p, (mode_t)mode) == 0 ? p : NULL;
}

void *ps_test_dealer(int port)
{
    static void *ctx;
    if (!ctx)
        ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, ivl = 10;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(s, ep);
    return s;
}

ps_header ps_test_header(uint32_t type, int rank, uint64_t seq, uint64_t key, uint32_t chunk,
                         int64_t step)
{
    ps_header h;
    ps_header_init(&h, type);
    h.rank = rank;
    h.seq = seq;
    h.key = key;
    h.chunk = chunk;
    ps_header_set_s(&h, step); /* what `s` means for the type */
    return h;
}

int ps_test_send(void *s, const ps_header *h, const float *payload, size_t n)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    ps_header c = *h;
    if (payload) {
        c.count = n;
        c.dtype = PS_DTYPE_F32;
    }
    if (ps_proto_encode(&c, buf, sizeof buf, &len) != 0)
        return -1;
    if (zmq_send(s, buf, len, payload ? ZMQ_SNDMORE : 0) < 0)
        return -1;
    if (payload && zmq_send(s, payload, n * sizeof(float), 0) < 0)
        return -1;
    return 0;
}

int ps_test_send_frames(void *s, const ps_header *h, const void *const *frames,
                        const size_t *bytes, int n)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0 ||
        zmq_send(s, buf, len, n ? ZMQ_SNDMORE : 0) < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        zmq_msg_t m;
        if (zmq_msg_init_size(&m, bytes[i]) != 0)
            return -1;
        if (bytes[i]) {
            if (frames[i])
                memcpy(zmq_msg_data(&m), frames[i], bytes[i]);
            else
                memset(zmq_msg_data(&m), 0, bytes[i]);
        }
        if (zmq_msg_send(&m, s, i + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
            zmq_msg_close(&m);
            return -1;
        }
    }
    return 0;
}

int ps_test_recv(void *s, int timeout_ms, ps_header *h, float *out, size_t cap, size_t *got)
{
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (got)
        *got = 0;
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 1;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    int rc = ps_proto_decode(zmq_msg_data(&m), zmq_msg_size(&m), h, NULL, 0) ? -1 : 0;
    int more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) {
        zmq_msg_init(&m);
        zmq_msg_recv(&m, s, 0);
        size_t bytes = zmq_msg_size(&m);
        if (out && bytes <= cap * sizeof(float)) {
            memcpy(out, zmq_msg_data(&m), bytes);
            if (got)
                *got = bytes / sizeof(float);
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return rc;
}

int ps_test_rpc(void *s, const ps_header *h, const float *payload, size_t n, ps_header *r,
                float *out, size_t cap, size_t *got)
{
    if (ps_test_send(s, h, payload, n) != 0)
        return -1;
    return ps_test_recv(s, PS_TEST_RPC_MS, r, out, cap, got);
}

int ps_test_hello(void *s, int rank, int mode, int nw, int max_staleness)
{
    ps_header h = ps_test_header(PS_MSG_HELLO, rank, 1000 + (uint64_t)rank, 0, 0, 0), r;
    h.hello.mode = mode;
    h.hello.max_staleness = max_staleness;
    h.hello.num_workers = (uint32_t)nw;
    h.hello.num_servers = 1;
    h.hello.server_rank = 0;
    h.hello.opt.kind = PS_OPT_NONE;
    return ps_test_rpc(s, &h, NULL, 0, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_HELLO ? 0 : -1;
}

int ps_test_stats(int port, ps_stats *st)
{
    void *s = ps_test_dealer(port);
    ps_header h = ps_test_header(PS_MSG_STATS, -1, 77, 0, 0, 0), r;
    int rc = -1;
    if (ps_test_send(s, &h, NULL, 0) == 0 && ps_test_recv(s, 10000, &r, NULL, 0, NULL) == 0 &&
        r.type == PS_MSG_STATS) {
        *st = r.stats;
        rc = 0;
    }
    zmq_close(s);
    return rc;
}

static void log_release(void *user, void *hold)
{
    (void)hold;
    ((ps_test_hook_log *)user)->released++;
}

static void log_ready(void *user, void *waiter, const float *w, size_t n, int64_t version)
{
    (void)waiter;
    ps_test_hook_log *l = user;
    l->ready++;
    memcpy(l->w, w, (n < 8 ? n : 8) * sizeof(float));
    l->version = version;
}

static void log_cancel(void *user, void *waiter)
{
    (void)waiter;
    ((ps_test_hook_log *)user)->cancelled++;
}

ps_shard_hooks ps_test_hook_log_hooks(ps_test_hook_log *log)
{
    memset(log, 0, sizeof *log);
    return (ps_shard_hooks){log, log_release, log_ready, log_cancel, NULL};
}


void ps_test_reply(void *s, zmq_msg_t *id, const ps_header *h, const void *pay, size_t bytes)
{
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    ps_proto_encode(h, buf, sizeof buf, &len);
    zmq_msg_t cp;
    zmq_msg_init(&cp);
    zmq_msg_copy(&cp, id);
    zmq_msg_send(&cp, s, ZMQ_SNDMORE);
    zmq_send(s, buf, len, pay ? ZMQ_SNDMORE : 0);
    if (pay)
        zmq_send(s, pay, bytes, 0);
}
