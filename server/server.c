#include "server.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "shard.h"

/* ROUTER messages handled per poll round before looking at replies again. */
#define IO_BATCH 256
/* Open barriers (distinct ids waiting) and STATS requests in flight. */
#define MAX_BARRIERS 64
#define MAX_STATS_INFLIGHT 64
/* Replies queued per worker on the ROUTER before ZeroMQ drops (the client
 * resends on timeout).  Covers a pull burst over thousands of chunks. */
#define ROUTER_SNDHWM 10000
/* Requests the ROUTER queues per worker while the I/O thread is held up, and
 * messages each inproc PAIR queues per direction.  They bound the memory held
 * in flight (a queued push is a whole chunk) and beyond them ZeroMQ pushes
 * back on TCP; the update threads cannot go faster anyway. */
#define ROUTER_RCVHWM 256
#define PAIR_HWM 128
/* Log lines about bad messages per second and thread; the rest are counted. */
#define RL_LINES 10

/* ---- frames between the I/O thread and an update thread ----
 * I/O -> owner: [cmd_frame] [identity] [payload]   (CMD_REQ)
 *               [cmd_frame]                         (CMD_STATS, CMD_STOP)
 * owner -> I/O: ['R'] [identity] [header] [payload] (a reply for the ROUTER)
 *               ['S' or 'X'] [out_frame]            (stats; final stats on stop) */
enum { CMD_REQ = 1, CMD_STATS = 2, CMD_STOP = 3 };
enum { OUT_REPLY = 'R', OUT_STATS = 'S', OUT_STOPPED = 'X' };

typedef struct cmd_frame {
    int cmd;
    uint64_t token;
    ps_header h;
} cmd_frame;

typedef struct out_frame {
    uint64_t token;
    ps_stats st;
} out_frame;

/* ---- rate-limited logging of bad messages ---- */
typedef struct rlimit {
    int64_t win;
    unsigned n;
    unsigned long long suppressed;
} rlimit;

/* Start a new one-second window, first saying how many lines the last
 * window swallowed; `force` does it now (at exit). */
static void rl_flush(rlimit *r, int64_t now, int force)
{
    if (!force && now - r->win < 1000000000LL)
        return;
    if (r->suppressed)
        ps_warn("%llu more refused or dropped messages not logged", r->suppressed);
    r->win = now;
    r->n = 0;
    r->suppressed = 0;
}

static int rl_allow(rlimit *r)
{
    rl_flush(r, ps_now_ns(), 0);
    if (r->n < RL_LINES) {
        r->n++;
        return 1;
    }
    r->suppressed++;
    return 0;
}

/* ---- update threads ---- */

/* A request an update thread answers now or, for a queued pull, later. */
typedef struct req_ctx {
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
    uint32_t type;
    uint64_t key;
    uint32_t chunk;
    int64_t step;
} req_ctx;

/* A received gradient the shard may keep: the message itself, or an aligned
 * copy when ZeroMQ handed us a buffer that is not 4-byte aligned. */
typedef struct hold {
    zmq_msg_t msg;
    float *copy;
    const float *g;
} hold;

typedef struct updater {
    ps_server *srv;
    int idx;
    pthread_t tid;
    int started;
    void *pair;   /* owner end; used only by this thread once started */
    ps_shard *shard;
    req_ctx *spare;
    uint64_t bytes_out, errors;
    rlimit rl;
    /* written by the I/O thread when the thread's final counters arrive */
    int stopped;
    ps_stats final;
} updater;

/* ---- I/O thread state ---- */
typedef struct outmsg {
    struct outmsg *next;
    int nf;
    zmq_msg_t f[3];
} outmsg;

typedef struct outbox { /* messages for an owner whose PAIR was full */
    outmsg *head, *tail;
    size_t n;
} outbox;

typedef struct worker_info {
    unsigned char id[256];
    size_t id_len;
} worker_info;

typedef struct bwait {
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
} bwait;

typedef struct barrier {
    int64_t id;
    uint8_t *arrived; /* per rank */
    int count;
    bwait *w;
    size_t nw, capw;
} barrier;

typedef struct stats_req {
    uint64_t token;
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
    int remaining;
    int have_versions;
    ps_stats acc;
} stats_req;

struct ps_server {
    ps_server_config cfg;
    char bind[256], endpoint[256];
    void *ctx, *router;
    void **pairs; /* I/O ends */
    updater *upd;
    outbox *out;
    size_t out_total;
    int efd;
    _Atomic uint64_t mem_used;
    uint64_t model_fp;
    worker_info **workers; /* per rank, NULL until its hello */
    int workers_seen;
    barrier barriers[MAX_BARRIERS];
    int nbarriers;
    stats_req sreq[MAX_STATS_INFLIGHT];
    int nsreq;
    uint64_t next_token;
    uint64_t io_errors, dropped;
    rlimit rl;
    ps_stats totals;
    int threads_running, run_called, stopping, io_failed;
};

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
    if (!why || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

int ps_server_owner(uint64_t key, uint32_t chunk, int threads)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull ^ ((uint64_t)chunk + 0x632be59bd9b4e019ull);
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return threads > 1 ? (int)(x % (uint64_t)threads) : 0;
}

void ps_server_config_default(ps_server_config *c)
{
    memset(c, 0, sizeof *c);
    c->rank = 0;
    c->num_servers = 1;
    c->num_workers = 1;
    c->mode = PS_MODE_ASYNC;
    c->max_staleness = -1;
    c->opt.kind = PS_OPT_SGD;
    c->opt.lr = 0.01f;
    c->opt.momentum = 0.9f;
    c->opt.beta1 = 0.9f;
    c->opt.beta2 = 0.999f;
    c->opt.eps = 1e-8f;
    c->opt.weight_decay = 0.0f;
    c->threads = 1;
    c->max_memory = PS_SERVER_DEFAULT_MAX_MEMORY;
}

int ps_server_config_check(const ps_server_config *c, char *why, size_t why_len)
{
#define BAD(...) do { say(why, why_len, __VA_ARGS__); return PS_EINVAL; } while (0)
    if (!c->bind || !*c->bind || strlen(c->bind) >= 256)
        BAD("bind endpoint is missing or longer than 255 characters");
    if (c->num_servers < 1 || c->num_servers > PS_MAX_RANK + 1)
        BAD("num-servers must be in [1, %d], got %d", PS_MAX_RANK + 1, c->num_servers);
    if (c->rank < 0 || c->rank >= c->num_servers)
        BAD("rank must be in [0, num-servers - 1 = %d], got %d", c->num_servers - 1, c->rank);
    if (c->num_workers < 1 || c->num_workers > PS_MAX_RANK + 1)
        BAD("num-workers must be in [1, %d], got %d", PS_MAX_RANK + 1, c->num_workers);
    if (c->mode != PS_MODE_SYNC && c->mode != PS_MODE_ASYNC)
        BAD("mode must be sync or async");
    if (c->mode == PS_MODE_SYNC && c->max_staleness != 0)
        BAD("max-staleness must be 0 in sync mode, got %d", c->max_staleness);
    if (c->max_staleness < -1 || c->max_staleness > 1000000)
        BAD("max-staleness must be in [-1, 1000000], got %d", c->max_staleness);
    if (c->opt.kind < PS_OPT_SGD || c->opt.kind > PS_OPT_KIND_MAX)
        BAD("unknown optimizer %d", c->opt.kind);
    const ps_opt_config *o = &c->opt;
    if (!(o->lr >= 0) || !(o->momentum >= 0 && o->momentum <= 1) ||
        !(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0) ||
        !(o->weight_decay >= 0))
        BAD("optimizer hyper-parameter out of range");
    if (c->threads < 1 || c->threads > PS_SERVER_MAX_THREADS)
        BAD("threads must be in [1, %d], got %d", PS_SERVER_MAX_THREADS, c->threads);
    if (c->max_memory < 1)
        BAD("max-memory must be at least 1 byte");
    return 0;
#undef BAD
}

static ps_hello my_hello(const ps_server *s)
{
    ps_hello h;
    memset(&h, 0, sizeof h);
    h.mode = s->cfg.mode;
    h.max_staleness = s->cfg.max_staleness;
    h.num_workers = (uint32_t)s->cfg.num_workers;
    h.num_servers = (uint32_t)s->cfg.num_servers;
    h.server_rank = s->cfg.rank;
    h.model_fp = s->model_fp;
    h.opt = s->cfg.opt;
    return h;
}

static void reply_header(ps_header *r, uint32_t type, uint64_t seq, int32_t rank, uint64_t key,
                         uint32_t chunk, int64_t step)
{
    ps_header_init(r, type);
    r->flags = PS_FLAG_REPLY;
    r->seq = seq;
    r->rank = rank;
    r->key = key;
    r->chunk = chunk;
    r->step = step;
}

static void error_header(ps_header *r, uint64_t seq, int32_t rank, uint64_t key, uint32_t chunk,
                         int code, const char *text)
{
    reply_header(r, PS_MSG_ERROR, seq, rank, key, chunk, 0);
    r->err_code = code;
    snprintf(r->err_text, sizeof r->err_text, "%s", text);
}

/* ================= update threads ================= */

/* Send [tag, identity, header, payload?] to the I/O thread.  Blocking: the I/O
 * thread always drains replies, so this never waits for long. */
static void upd_send(updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("update thread %d: cannot encode a %s reply", u->idx, ps_msg_type_name(h->type));
        return;
    }
    char tag = OUT_REPLY;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_msg_send(id, u->pair, ZMQ_SNDMORE);
    zmq_send(u->pair, buf, len, payload ? ZMQ_SNDMORE : 0);
    if (payload)
        zmq_msg_send(payload, u->pair, 0);
}

static void upd_error(updater *u, req_ctx *r, int code, const char *why)
{
    ps_header h;
    error_header(&h, r->seq, r->rank, r->key, r->chunk, code, why);
    u->errors++;
    if (rl_allow(&u->rl))
        ps_warn("refused %s from worker %d (key %llu chunk %u): %s: %s",
                ps_msg_type_name(r->type), r->rank, (unsigned long long)r->key, r->chunk,
                ps_strerror(code), why);
    upd_send(u, &r->id, &h, NULL);
}

static void upd_ack(updater *u, req_ctx *r, int64_t version)
{
    ps_header h;
    reply_header(&h, r->type, r->seq, r->rank, r->key, r->chunk, version);
    upd_send(u, &r->id, &h, NULL);
}

/* Copy the weights once, into the reply message. */
static void upd_weights(updater *u, req_ctx *r, const float *w, size_t n, int64_t version)
{
    zmq_msg_t pl;
    size_t bytes = n * sizeof(float);
    if (zmq_msg_init_size(&pl, bytes) != 0) {
        upd_error(u, r, PS_ENOMEM, "out of memory building the pull reply");
        return;
    }
    memcpy(zmq_msg_data(&pl), w, bytes);
    ps_header h;
    reply_header(&h, r->type, r->seq, r->rank, r->key, r->chunk, version);
    h.count = n;
    h.dtype = PS_DTYPE_F32;
    u->bytes_out += bytes;
    upd_send(u, &r->id, &h, &pl);
    zmq_msg_close(&pl);
}

static void req_free(req_ctx *r)
{
    if (!r)
        return;
    zmq_msg_close(&r->id);
    free(r);
}

static void hook_ready(void *user, void *waiter, const float *w, size_t n, int64_t version)
{
    req_ctx *r = waiter;
    upd_weights(user, r, w, n, version);
    req_free(r);
}

static void hook_cancel(void *user, void *waiter)
{
    req_ctx *r = waiter;
    upd_error(user, r, PS_ECLOSED, "the server is shutting down; this pull was still waiting");
    req_free(r);
}

static void hold_free(hold *h)
{
    if (!h)
        return;
    zmq_msg_close(&h->msg);
    free(h->copy);
    free(h);
}

static void hook_release(void *user, void *h)
{
    (void)user;
    hold_free(h);
}

static void upd_pull(updater *u, req_ctx *r, int64_t want)
{
    char why[256];
    const float *w = NULL;
    size_t n = 0;
    int64_t version = 0;
    int queued = 0;
    int rc = ps_shard_pull(u->shard, r->key, r->chunk, r->rank, want, r, &queued, &w, &n, &version,
                           why, sizeof why);
    if (rc)
        upd_error(u, r, rc, why);
    else if (queued)
        u->spare = NULL; /* the shard holds r until hook_ready or hook_cancel */
    else
        upd_weights(u, r, w, n, version);
}

static void upd_request(updater *u, const ps_header *h, zmq_msg_t *id, zmq_msg_t *pl)
{
    if (!u->spare) {
        u->spare = calloc(1, sizeof *u->spare);
        if (!u->spare) {
            ps_error("update thread %d: out of memory; dropped a %s", u->idx,
                     ps_msg_type_name(h->type));
            return;
        }
        zmq_msg_init(&u->spare->id);
    }
    req_ctx *r = u->spare;
    zmq_msg_move(&r->id, id);
    r->seq = h->seq;
    r->rank = h->rank;
    r->type = h->type;
    r->key = h->key;
    r->chunk = h->chunk;
    r->step = h->step;
    char why[256];
    int64_t version = 0;
    int rc;
    switch (h->type) {
    case PS_MSG_INIT:
        rc = ps_shard_init(u->shard, h->key, h->chunk, zmq_msg_data(pl), (size_t)h->count,
                           h->total, &version, why, sizeof why);
        if (rc)
            upd_error(u, r, rc, why);
        else
            upd_ack(u, r, version);
        break;
    case PS_MSG_PUSH:
    case PS_MSG_PUSHPULL: {
        hold *g = calloc(1, sizeof *g);
        if (!g) {
            upd_error(u, r, PS_ENOMEM, "out of memory receiving a push");
            break;
        }
        zmq_msg_init(&g->msg);
        zmq_msg_move(&g->msg, pl);
        void *data = zmq_msg_data(&g->msg);
        size_t bytes = zmq_msg_size(&g->msg);
        if ((uintptr_t)data % sizeof(float)) {
            /* small frames can sit unaligned in ZeroMQ's receive buffer */
            g->copy = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
            if (!g->copy) {
                hold_free(g);
                upd_error(u, r, PS_ENOMEM, "out of memory receiving a push");
                break;
            }
            memcpy(g->copy, data, bytes);
            zmq_msg_close(&g->msg);
            zmq_msg_init(&g->msg);
            g->g = g->copy;
        } else {
            g->g = data;
        }
        int kept = 0, dup = 0;
        rc = ps_shard_push(u->shard, h->key, h->chunk, h->rank, h->step, g->g, (size_t)h->count,
                           g, &kept, &dup, &version, why, sizeof why);
        if (!kept)
            hold_free(g);
        if (rc) {
            upd_error(u, r, rc, why);
            break;
        }
        if (dup)
            ps_debug("duplicate push from worker %d, key %llu chunk %u step %lld: dropped",
                     h->rank, (unsigned long long)h->key, h->chunk, (long long)h->step);
        if (h->type == PS_MSG_PUSH)
            upd_ack(u, r, version);
        else
            upd_pull(u, r, h->step + 1);
        break;
    }
    case PS_MSG_PULL:
        upd_pull(u, r, h->step);
        break;
    default:
        upd_error(u, r, PS_EPROTO, "internal: request type not handled by update threads");
        break;
    }
    if (u->spare) { /* not queued: ready for the next request */
        zmq_msg_close(&u->spare->id);
        zmq_msg_init(&u->spare->id);
    }
}

static void upd_stats(updater *u, ps_stats *st)
{
    ps_shard_stats(u->shard, st);
    st->bytes_out = u->bytes_out;
    st->errors = u->errors;
}

static void upd_send_stats(updater *u, char tag, uint64_t token, const ps_stats *st)
{
    out_frame of = {token, *st};
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &of, sizeof of, 0);
}

static void *upd_main(void *arg)
{
    updater *u = arg;
    int stop = 0;
    while (!stop) {
        zmq_msg_t m, id, pl;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, u->pair, 0) < 0) {
            zmq_msg_close(&m);
            if (errno == EINTR)
                continue;
            ps_error("update thread %d: receive failed: %s", u->idx, zmq_strerror(errno));
            break;
        }
        zmq_msg_init(&id);
        zmq_msg_init(&pl);
        int more = zmq_msg_more(&m);
        for (int i = 0; more; i++) {
            zmq_msg_t *dst = i == 0 ? &id : &pl, extra;
            if (i >= 2) {
                zmq_msg_init(&extra);
                dst = &extra;
            }
            if (zmq_msg_recv(dst, u->pair, 0) < 0)
                break;
            more = zmq_msg_more(dst);
            if (i >= 2)
                zmq_msg_close(&extra);
        }
        cmd_frame cf;
        if (zmq_msg_size(&m) == sizeof cf) {
            memcpy(&cf, zmq_msg_data(&m), sizeof cf);
            if (cf.cmd == CMD_REQ) {
                upd_request(u, &cf.h, &id, &pl);
            } else if (cf.cmd == CMD_STATS) {
                ps_stats st;
                upd_stats(u, &st);
                upd_send_stats(u, OUT_STATS, cf.token, &st);
            } else if (cf.cmd == CMD_STOP) {
                stop = 1;
            }
        }
        zmq_msg_close(&m);
        zmq_msg_close(&id);
        zmq_msg_close(&pl);
    }
    ps_stats st;
    upd_stats(u, &st);
    /* answers queued pulls with PS_ECLOSED, frees kept gradients */
    ps_shard_destroy(u->shard);
    u->shard = NULL;
    st.errors = u->errors;
    req_free(u->spare);
    u->spare = NULL;
    rl_flush(&u->rl, ps_now_ns(), 1);
    upd_send_stats(u, OUT_STOPPED, 0, &st);
    return NULL;
}

/* ================= I/O thread ================= */

static void io_send(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("cannot encode a %s reply", ps_msg_type_name(h->type));
        return;
    }
    if (zmq_msg_send(id, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(s->router, buf, len, ZMQ_DONTWAIT);
}

static void io_error(ps_server *s, zmq_msg_t *id, const ps_header *req, int code, const char *why)
{
    ps_header h;
    error_header(&h, req->seq, req->rank, req->key, req->chunk, code, why);
    s->io_errors++;
    if (rl_allow(&s->rl))
        ps_warn("refused %s from rank %d: %s: %s", ps_msg_type_name(req->type), req->rank,
                ps_strerror(code), why);
    io_send(s, id, &h);
}

static void io_drop(ps_server *s, const char *why)
{
    s->dropped++;
    if (rl_allow(&s->rl))
        ps_warn("dropped a message with no usable header: %s", why);
}

static void id_hex(const zmq_msg_t *id, char *out, size_t len)
{
    const unsigned char *p = zmq_msg_data((zmq_msg_t *)id);
    size_t n = zmq_msg_size((zmq_msg_t *)id), o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 3 < len && i < 8; i++)
        o += (size_t)snprintf(out + o, len - o, "%02x", p[i]);
}

/* Try to hand frames to an owner without blocking: 0 sent, 1 full (frames
 * untouched), -1 failed. */
static int pair_try(void *sock, zmq_msg_t *f, int nf)
{
    if (zmq_msg_send(&f[0], sock, ZMQ_DONTWAIT | (nf > 1 ? ZMQ_SNDMORE : 0)) < 0)
        return errno == EAGAIN ? 1 : -1;
    /* the rest of a multipart message is never refused once its first frame went */
    for (int i = 1; i < nf; i++)
        zmq_msg_send(&f[i], sock, i < nf - 1 ? ZMQ_SNDMORE : 0);
    return 0;
}

static void close_frames(zmq_msg_t *f, int nf)
{
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
}

static void to_owner(ps_server *s, int owner, zmq_msg_t *f, int nf)
{
    outbox *ob = &s->out[owner];
    if (!ob->head) {
        int rc = pair_try(s->pairs[owner], f, nf);
        if (rc == 0) {
            close_frames(f, nf);
            return;
        }
        if (rc < 0) {
            ps_error("handing a message to update thread %d failed: %s", owner,
                     zmq_strerror(errno));
            close_frames(f, nf);
            return;
        }
    }
    if (!ob->head)
        ps_debug("update thread %d is behind: reads from the ROUTER pause until it catches up",
                 owner);
    outmsg *m = calloc(1, sizeof *m);
    if (!m) {
        ps_error("out of memory queueing a message for update thread %d; dropped", owner);
        close_frames(f, nf);
        return;
    }
    m->nf = nf;
    for (int i = 0; i < nf; i++) {
        zmq_msg_init(&m->f[i]);
        zmq_msg_move(&m->f[i], &f[i]);
    }
    if (ob->tail)
        ob->tail->next = m;
    else
        ob->head = m;
    ob->tail = m;
    ob->n++;
    s->out_total++;
}

static void flush_outbox(ps_server *s, int owner)
{
    outbox *ob = &s->out[owner];
    while (ob->head) {
        outmsg *m = ob->head;
        int rc = pair_try(s->pairs[owner], m->f, m->nf);
        if (rc == 1)
            return;
        if (rc < 0)
            ps_error("handing a message to update thread %d failed: %s", owner,
                     zmq_strerror(errno));
        close_frames(m->f, m->nf);
        ob->head = m->next;
        if (!ob->head)
            ob->tail = NULL;
        ob->n--;
        s->out_total--;
        free(m);
    }
}

static void send_cmd(ps_server *s, int owner, int cmd, uint64_t token, const ps_header *h,
                     zmq_msg_t *id, zmq_msg_t *payload)
{
    zmq_msg_t f[3];
    int nf = 1;
    zmq_msg_init_size(&f[0], sizeof(cmd_frame));
    cmd_frame *cf = zmq_msg_data(&f[0]);
    memset(cf, 0, sizeof *cf);
    cf->cmd = cmd;
    cf->token = token;
    if (h)
        cf->h = *h;
    if (id) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], id);
    }
    if (payload) {
        zmq_msg_init(&f[nf]);
        zmq_msg_move(&f[nf++], payload);
    }
    to_owner(s, owner, f, nf);
}

static void io_hello(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    ps_hello mine = my_hello(s);
    char why[256], who[32];
    snprintf(who, sizeof who, h->rank >= 0 ? "worker %d" : "rank %d", h->rank);
    int rc = ps_hello_compare(&mine, "server", &h->hello, who, 1, why, sizeof why);
    if (rc == 0 && h->hello.server_rank >= 0 && h->hello.server_rank != s->cfg.rank) {
        say(why, sizeof why,
            "server-rank: server has %d, %s has %d (check the order of the server list)",
            s->cfg.rank, who, h->hello.server_rank);
        rc = PS_EMISMATCH;
    }
    if (rc == 0 && h->rank >= s->cfg.num_workers) {
        say(why, sizeof why, "rank %d is out of range: this server has --num-workers %d", h->rank,
            s->cfg.num_workers);
        rc = PS_EPROTO;
    }
    if (rc) {
        io_error(s, id, h, rc, why);
        return;
    }
    if (h->hello.model_fp && !s->model_fp) {
        s->model_fp = h->hello.model_fp;
        ps_info("model fingerprint %016llx (from %s)", (unsigned long long)s->model_fp, who);
    }
    if (h->rank >= 0) {
        worker_info *wi = s->workers[h->rank];
        size_t n = zmq_msg_size(id);
        const void *p = zmq_msg_data(id);
        char hex[40];
        id_hex(id, hex, sizeof hex);
        if (!wi) {
            wi = calloc(1, sizeof *wi);
            if (!wi) {
                io_error(s, id, h, PS_ENOMEM, "out of memory recording the worker");
                return;
            }
            s->workers[h->rank] = wi;
            s->workers_seen++;
            ps_info("hello from worker %d (identity %s), %d of %d workers", h->rank, hex,
                    s->workers_seen, s->cfg.num_workers);
        } else if (wi->id_len != n || memcmp(wi->id, p, n) != 0) {
            ps_info("hello again from worker %d with a new connection (identity %s)", h->rank,
                    hex);
        } else {
            ps_debug("hello again from worker %d", h->rank);
        }
        wi->id_len = n < sizeof wi->id ? n : sizeof wi->id;
        memcpy(wi->id, p, wi->id_len);
    } else {
        ps_debug("hello from a tool (rank -1)");
    }
    ps_header r;
    reply_header(&r, PS_MSG_HELLO, h->seq, h->rank, h->key, h->chunk, h->step);
    r.hello = my_hello(s);
    io_send(s, id, &r);
}

static void barrier_free(barrier *b)
{
    for (size_t i = 0; i < b->nw; i++)
        zmq_msg_close(&b->w[i].id);
    free(b->w);
    free(b->arrived);
    memset(b, 0, sizeof *b);
}

static void io_barrier(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    barrier *b = NULL;
    for (int i = 0; i < s->nbarriers; i++)
        if (s->barriers[i].id == h->step)
            b = &s->barriers[i];
    if (!b) {
        if (s->nbarriers == MAX_BARRIERS) {
            io_error(s, id, h, PS_ETOOBIG, "too many barriers open at once");
            return;
        }
        b = &s->barriers[s->nbarriers];
        memset(b, 0, sizeof *b);
        b->id = h->step;
        b->arrived = calloc((size_t)s->cfg.num_workers, 1);
        if (!b->arrived) {
            io_error(s, id, h, PS_ENOMEM, "out of memory opening a barrier");
            return;
        }
        s->nbarriers++;
    }
    size_t limit = 4 * (size_t)s->cfg.num_workers + 16;
    if (b->nw >= limit) {
        io_error(s, id, h, PS_ETOOBIG, "too many requests wait on this barrier");
        return;
    }
    if (b->nw == b->capw) {
        size_t ncap = b->capw ? 2 * b->capw : 8;
        bwait *w = realloc(b->w, ncap * sizeof *w);
        if (!w) {
            io_error(s, id, h, PS_ENOMEM, "out of memory waiting on a barrier");
            return;
        }
        b->w = w;
        b->capw = ncap;
    }
    bwait *w = &b->w[b->nw++];
    zmq_msg_init(&w->id);
    zmq_msg_move(&w->id, id);
    w->seq = h->seq;
    w->rank = h->rank;
    if (!b->arrived[h->rank]) {
        b->arrived[h->rank] = 1;
        b->count++;
    }
    if (b->count < s->cfg.num_workers)
        return;
    ps_debug("barrier %lld: all %d workers arrived", (long long)b->id, s->cfg.num_workers);
    for (size_t i = 0; i < b->nw; i++) {
        ps_header r;
        reply_header(&r, PS_MSG_BARRIER, b->w[i].seq, b->w[i].rank, 0, 0, b->id);
        io_send(s, &b->w[i].id, &r);
    }
    barrier_free(b);
    *b = s->barriers[--s->nbarriers];
    memset(&s->barriers[s->nbarriers], 0, sizeof(barrier));
}

static void io_stats(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    if (s->nsreq == MAX_STATS_INFLIGHT) {
        io_error(s, id, h, PS_ETOOBIG, "too many stats requests in flight");
        return;
    }
    stats_req *q = &s->sreq[s->nsreq++];
    memset(q, 0, sizeof *q);
    q->token = ++s->next_token;
    zmq_msg_init(&q->id);
    zmq_msg_move(&q->id, id);
    q->seq = h->seq;
    q->rank = h->rank;
    q->remaining = s->cfg.threads;
    for (int i = 0; i < s->cfg.threads; i++)
        send_cmd(s, i, CMD_STATS, q->token, NULL, NULL, NULL);
}

static void add_stats(ps_stats *acc, int *have_versions, const ps_stats *p)
{
    acc->pushes += p->pushes;
    acc->pulls += p->pulls;
    acc->inits += p->inits;
    acc->updates += p->updates;
    acc->bytes_in += p->bytes_in;
    acc->bytes_out += p->bytes_out;
    acc->dup_dropped += p->dup_dropped;
    acc->errors += p->errors;
    if (p->chunks) {
        if (!*have_versions || p->min_version < acc->min_version)
            acc->min_version = p->min_version;
        if (!*have_versions || p->max_version > acc->max_version)
            acc->max_version = p->max_version;
        *have_versions = 1;
    }
    acc->chunks += p->chunks;
}

static void stats_part(ps_server *s, const out_frame *of)
{
    for (int i = 0; i < s->nsreq; i++) {
        stats_req *q = &s->sreq[i];
        if (q->token != of->token)
            continue;
        add_stats(&q->acc, &q->have_versions, &of->st);
        if (--q->remaining > 0)
            return;
        ps_header r;
        reply_header(&r, PS_MSG_STATS, q->seq, q->rank, 0, 0, 0);
        r.stats = q->acc;
        r.stats.errors += s->io_errors;
        r.stats.workers_seen = (uint64_t)s->workers_seen;
        io_send(s, &q->id, &r);
        zmq_msg_close(&q->id);
        *q = s->sreq[--s->nsreq];
        return;
    }
}

/* One message from the ROUTER: f[0] identity, f[1] header, f[2] payload;
 * `total` counts every frame received, kept or not. */
static void io_message(ps_server *s, zmq_msg_t *f, int nf, int total)
{
    if (nf < 2) {
        io_drop(s, "no header frame");
        return;
    }
    ps_header h;
    char why[256];
    int rc = ps_proto_decode(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &h, why, sizeof why);
    if (rc) {
        /* a header that got past the version check is a map from a peer we
         * can answer; anything else is too broken to answer */
        if (h.version == 0 && rc != PS_EVERSION) {
            io_drop(s, why);
            return;
        }
        io_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.flags & PS_FLAG_REPLY) {
        say(why, sizeof why, "the server takes requests; got a %s reply", ps_msg_type_name(h.type));
        io_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    if (h.type == PS_MSG_ERROR) {
        io_error(s, &f[0], &h, PS_EPROTO, "error messages are replies only");
        return;
    }
    size_t pbytes = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    rc = ps_proto_check_payload(&h, total - 2, pbytes, why, sizeof why);
    if (rc) {
        io_error(s, &f[0], &h, rc, why);
        return;
    }
    if (h.type == PS_MSG_HELLO) { /* checks the rank after the config */
        io_hello(s, &f[0], &h);
        return;
    }
    if (h.rank >= s->cfg.num_workers) {
        say(why, sizeof why, "rank %d is out of range: this server has --num-workers %d", h.rank,
            s->cfg.num_workers);
        io_error(s, &f[0], &h, PS_EPROTO, why);
        return;
    }
    if (h.rank < 0) {
        if (h.type != PS_MSG_STATS && h.type != PS_MSG_SHUTDOWN && h.type != PS_MSG_HEARTBEAT) {
            say(why, sizeof why, "%s needs a worker rank; rank -1 may send only hello, stats, "
                "heartbeat and shutdown", ps_msg_type_name(h.type));
            io_error(s, &f[0], &h, PS_ESTATE, why);
            return;
        }
    } else if (!s->workers[h.rank]) {
        say(why, sizeof why, "worker %d sent %s before hello; say hello first", h.rank,
            ps_msg_type_name(h.type));
        io_error(s, &f[0], &h, PS_ESTATE, why);
        return;
    }
    switch (h.type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
        send_cmd(s, ps_server_owner(h.key, h.chunk, s->cfg.threads), CMD_REQ, 0, &h, &f[0],
                 nf >= 3 ? &f[2] : NULL);
        return;
    case PS_MSG_BARRIER:
        io_barrier(s, &f[0], &h);
        return;
    case PS_MSG_STATS:
        io_stats(s, &f[0], &h);
        return;
    case PS_MSG_HEARTBEAT: {
        ps_header r;
        reply_header(&r, PS_MSG_HEARTBEAT, h.seq, h.rank, h.key, h.chunk, h.step);
        io_send(s, &f[0], &r);
        return;
    }
    case PS_MSG_SHUTDOWN: {
        ps_header r;
        reply_header(&r, PS_MSG_SHUTDOWN, h.seq, h.rank, h.key, h.chunk, h.step);
        io_send(s, &f[0], &r);
        ps_info("shutdown requested by rank %d", h.rank);
        s->stopping = 1;
        return;
    }
    default:
        io_error(s, &f[0], &h, PS_EPROTO, "unhandled message type");
        return;
    }
}

/* Read up to IO_BATCH messages from the ROUTER.  Returns -1 on a socket error. */
static int io_read_router(ps_server *s)
{
    for (int b = 0; b < IO_BATCH && !s->out_total && !s->stopping; b++) {
        zmq_msg_t f[3];
        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], s->router, ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&f[0]);
            if (e == EAGAIN || e == EINTR)
                return 0;
            ps_error("receive on %s failed: %s", s->endpoint, zmq_strerror(e));
            return -1;
        }
        int nf = 1, total = 1, more = zmq_msg_more(&f[0]);
        while (more) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, s->router, 0) < 0) {
                zmq_msg_close(&x);
                break;
            }
            more = zmq_msg_more(&x);
            total++;
            if (nf < 3) {
                zmq_msg_init(&f[nf]);
                zmq_msg_move(&f[nf++], &x);
            }
            zmq_msg_close(&x);
        }
        io_message(s, f, nf, total);
        close_frames(f, nf);
    }
    return 0;
}

/* Take everything update thread i has sent.  Its last message (its final
 * counters) sets upd[i].stopped. */
static void io_read_pair(ps_server *s, int i)
{
    for (int b = 0; b < IO_BATCH * 4; b++) {
        zmq_msg_t tag;
        zmq_msg_init(&tag);
        if (zmq_msg_recv(&tag, s->pairs[i], ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tag);
            break;
        }
        char t = zmq_msg_size(&tag) == 1 ? *(char *)zmq_msg_data(&tag) : 0;
        int more = zmq_msg_more(&tag);
        zmq_msg_close(&tag);
        if (t == OUT_REPLY) {
            /* forward [identity, header, payload?] to the ROUTER as they are */
            while (more) {
                zmq_msg_t m;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, s->pairs[i], 0) < 0) {
                    zmq_msg_close(&m);
                    break;
                }
                more = zmq_msg_more(&m);
                zmq_msg_send(&m, s->router, (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
                zmq_msg_close(&m);
            }
            continue;
        }
        out_frame of;
        memset(&of, 0, sizeof of);
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s->pairs[i], 0) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            if (zmq_msg_size(&m) == sizeof of)
                memcpy(&of, zmq_msg_data(&m), sizeof of);
            zmq_msg_close(&m);
        }
        if (t == OUT_STATS) {
            stats_part(s, &of);
        } else if (t == OUT_STOPPED) {
            s->upd[i].final = of.st;
            s->upd[i].stopped = 1;
            if (!s->stopping) {
                ps_error("update thread %d stopped unexpectedly; shutting down", i);
                s->stopping = 1;
                s->io_failed = 1;
            }
            break;
        }
    }
}

static void drain_eventfd(ps_server *s)
{
    uint64_t v;
    ssize_t r = read(s->efd, &v, sizeof v);
    (void)r;
}

/* Stop the update threads: they answer their queued pulls (PS_ECLOSED) and
 * send their final counters, which go into s->totals. */
static void stop_threads(ps_server *s)
{
    int T = s->cfg.threads;
    if (!s->threads_running || T == 0)
        return;
    s->stopping = 1;
    zmq_pollitem_t *items = calloc((size_t)T, sizeof *items);
    if (!items) {
        ps_error("out of memory stopping the update threads");
        abort();
    }
    for (int i = 0; i < T; i++)
        if (!s->upd[i].stopped)
            send_cmd(s, i, CMD_STOP, 0, NULL, NULL, NULL);
    for (;;) {
        int left = 0;
        for (int i = 0; i < T; i++) {
            left += !s->upd[i].stopped;
            items[i].socket = s->pairs[i];
            items[i].events = (short)(s->upd[i].stopped ? 0
                                      : ZMQ_POLLIN | (s->out[i].head ? ZMQ_POLLOUT : 0));
            items[i].revents = 0;
        }
        if (!left)
            break;
        if (zmq_poll(items, T, 100) < 0 && errno != EINTR) {
            ps_error("poll failed while stopping: %s", zmq_strerror(errno));
            abort();
        }
        for (int i = 0; i < T; i++) {
            if (s->upd[i].stopped)
                continue;
            if (s->out[i].head)
                flush_outbox(s, i);
            io_read_pair(s, i);
        }
    }
    for (int i = 0; i < T; i++) {
        if (s->upd[i].started)
            pthread_join(s->upd[i].tid, NULL);
        s->upd[i].started = 0;
    }
    s->threads_running = 0;
    int have = 0;
    memset(&s->totals, 0, sizeof s->totals);
    for (int i = 0; i < T; i++)
        add_stats(&s->totals, &have, &s->upd[i].final);
    s->totals.errors += s->io_errors;
    s->totals.workers_seen = (uint64_t)s->workers_seen;
    free(items);
}

static void close_waiters(ps_server *s)
{
    for (int i = 0; i < s->nbarriers; i++) {
        barrier *b = &s->barriers[i];
        for (size_t j = 0; j < b->nw; j++) {
            ps_header r;
            error_header(&r, b->w[j].seq, b->w[j].rank, 0, 0, PS_ECLOSED,
                         "the server is shutting down; the barrier was not complete");
            io_send(s, &b->w[j].id, &r);
        }
        barrier_free(b);
    }
    s->nbarriers = 0;
    for (int i = 0; i < s->nsreq; i++) {
        ps_header r;
        error_header(&r, s->sreq[i].seq, s->sreq[i].rank, 0, 0, PS_ECLOSED,
                     "the server is shutting down");
        io_send(s, &s->sreq[i].id, &r);
        zmq_msg_close(&s->sreq[i].id);
    }
    s->nsreq = 0;
}

int ps_server_run(ps_server *s)
{
    if (s->run_called)
        return PS_ESTATE;
    s->run_called = 1;
    int T = s->cfg.threads;
    zmq_pollitem_t *items = calloc((size_t)T + 2, sizeof *items);
    if (!items)
        return PS_ENOMEM;
    int rc = 0;
    while (!s->stopping) {
        items[0] = (zmq_pollitem_t){s->router, 0, (short)(s->out_total ? 0 : ZMQ_POLLIN), 0};
        items[1] = (zmq_pollitem_t){NULL, s->efd, ZMQ_POLLIN, 0};
        for (int i = 0; i < T; i++) {
            short ev = (short)(ZMQ_POLLIN | (s->out[i].head ? ZMQ_POLLOUT : 0));
            items[2 + i] = (zmq_pollitem_t){s->pairs[i], 0, ev, 0};
        }
        if (zmq_poll(items, T + 2, 1000) < 0) {
            if (errno == EINTR)
                continue;
            ps_error("poll failed: %s", zmq_strerror(errno));
            rc = PS_EIO;
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            drain_eventfd(s);
            ps_info("stop requested");
            break;
        }
        for (int i = 0; i < T; i++) {
            if (items[2 + i].revents & ZMQ_POLLIN)
                io_read_pair(s, i);
            if (s->out[i].head)
                flush_outbox(s, i);
        }
        if ((items[0].revents & ZMQ_POLLIN) && io_read_router(s) < 0) {
            rc = PS_EIO;
            break;
        }
        rl_flush(&s->rl, ps_now_ns(), 0);
    }
    free(items);
    stop_threads(s);
    close_waiters(s);
    if (s->io_failed)
        rc = PS_EIO;
    rl_flush(&s->rl, ps_now_ns(), 1);
    const ps_stats *t = &s->totals;
    ps_info("stopped: %llu pushes, %llu pulls, %llu inits, %llu updates, %llu duplicates dropped, "
            "%llu error replies, %llu undecodable messages dropped, %llu chunks, versions "
            "%lld..%lld, %llu MiB in, %llu MiB out, %d of %d workers said hello",
            (unsigned long long)t->pushes, (unsigned long long)t->pulls,
            (unsigned long long)t->inits, (unsigned long long)t->updates,
            (unsigned long long)t->dup_dropped, (unsigned long long)t->errors,
            (unsigned long long)s->dropped, (unsigned long long)t->chunks,
            (long long)t->min_version, (long long)t->max_version,
            (unsigned long long)(t->bytes_in >> 20), (unsigned long long)(t->bytes_out >> 20),
            s->workers_seen, s->cfg.num_workers);
    return rc;
}

void ps_server_stop(ps_server *s)
{
    uint64_t one = 1;
    ssize_t r = write(s->efd, &one, sizeof one);
    (void)r;
}

void ps_server_totals(const ps_server *s, ps_stats *out) { *out = s->totals; }

const char *ps_server_endpoint(const ps_server *s) { return s->endpoint; }

void ps_server_close(ps_server *s)
{
    if (!s)
        return;
    if (s->threads_running)
        stop_threads(s);
    close_waiters(s);
    for (int i = 0; i < s->cfg.threads && s->out; i++) {
        while (s->out[i].head) {
            outmsg *m = s->out[i].head;
            s->out[i].head = m->next;
            close_frames(m->f, m->nf);
            free(m);
        }
    }
    for (int i = 0; i < s->cfg.threads && s->upd; i++) {
        if (s->upd[i].pair)
            zmq_close(s->upd[i].pair);
        ps_shard_destroy(s->upd[i].shard);
    }
    for (int i = 0; i < s->cfg.threads && s->pairs; i++)
        if (s->pairs[i])
            zmq_close(s->pairs[i]);
    if (s->router)
        zmq_close(s->router);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->efd >= 0)
        close(s->efd);
    /* libzmq 4.3 leaves the socket file of an ipc:// endpoint behind */
    if (strncmp(s->endpoint, "ipc://", 6) == 0 && s->endpoint[6] && s->endpoint[6] != '@')
        unlink(s->endpoint + 6);
    if (s->workers)
        for (int i = 0; i < s->cfg.num_workers; i++)
            free(s->workers[i]);
    free(s->workers);
    free(s->upd);
    free(s->pairs);
    free(s->out);
    free(s);
}

static int set_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

int ps_server_open(const ps_server_config *c, ps_server **out, char *why, size_t why_len)
{
    *out = NULL;
    int rc = ps_server_config_check(c, why, why_len);
    if (rc)
        return rc;
    ps_server *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    s->cfg = *c;
    s->efd = -1;
    snprintf(s->bind, sizeof s->bind, "%s", c->bind);
    s->cfg.bind = s->bind;
    atomic_init(&s->mem_used, 0);
    int T = c->threads;
    s->workers = calloc((size_t)c->num_workers, sizeof *s->workers);
    s->upd = calloc((size_t)T, sizeof *s->upd);
    s->pairs = calloc((size_t)T, sizeof *s->pairs);
    s->out = calloc((size_t)T, sizeof *s->out);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->ctx = zmq_ctx_new();
    if (!s->workers || !s->upd || !s->pairs || !s->out || s->efd < 0 || !s->ctx) {
        say(why, why_len, "out of memory or descriptors starting the server");
        ps_server_close(s);
        return PS_ENOMEM;
    }
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    int64_t maxmsg = (int64_t)PS_MAX_PAYLOAD_BYTES + PS_HEADER_MAX;
    if (!s->router || set_int(s->router, ZMQ_LINGER, 1000) ||
        set_int(s->router, ZMQ_SNDHWM, ROUTER_SNDHWM) ||
        set_int(s->router, ZMQ_RCVHWM, ROUTER_RCVHWM) ||
        zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        say(why, why_len, "cannot create the ROUTER socket: %s", zmq_strerror(errno));
        ps_server_close(s);
        return PS_EIO;
    }
    if (zmq_bind(s->router, s->bind) != 0) {
        say(why, why_len, "cannot bind %s: %s", s->bind, zmq_strerror(errno));
        ps_server_close(s);
        return PS_EIO;
    }
    size_t len = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &len) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", s->bind);

    ps_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = c->mode;
    sc.max_staleness = c->max_staleness;
    sc.num_workers = c->num_workers;
    sc.opt = c->opt;
    sc.max_memory = c->max_memory;
    sc.mem_used = &s->mem_used;
    for (int i = 0; i < T; i++) {
        updater *u = &s->upd[i];
        u->srv = s;
        u->idx = i;
        ps_shard_hooks hk = {u, hook_release, hook_ready, hook_cancel};
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://ps-update-%d", i);
        s->pairs[i] = zmq_socket(s->ctx, ZMQ_PAIR);
        u->pair = zmq_socket(s->ctx, ZMQ_PAIR);
        if (!s->pairs[i] || !u->pair || set_int(s->pairs[i], ZMQ_LINGER, 0) ||
            set_int(u->pair, ZMQ_LINGER, 0) || set_int(s->pairs[i], ZMQ_SNDHWM, PAIR_HWM) ||
            set_int(s->pairs[i], ZMQ_RCVHWM, PAIR_HWM) || set_int(u->pair, ZMQ_SNDHWM, PAIR_HWM) ||
            set_int(u->pair, ZMQ_RCVHWM, PAIR_HWM) || zmq_bind(s->pairs[i], ep) != 0 ||
            zmq_connect(u->pair, ep) != 0) {
            say(why, why_len, "cannot set up %s: %s", ep, zmq_strerror(errno));
            ps_server_close(s);
            return PS_EIO;
        }
        if ((rc = ps_shard_create(&sc, &hk, &u->shard)) != 0) {
            say(why, why_len, "cannot create the shard store: %s", ps_strerror(rc));
            ps_server_close(s);
            return rc;
        }
    }
    /* update threads take no signals: SIGINT/SIGTERM land on the I/O thread */
    sigset_t all, old;
    sigemptyset(&all);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
        sigaddset(&all, sigs[k]);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < T; i++) {
        if (pthread_create(&s->upd[i].tid, NULL, upd_main, &s->upd[i]) != 0) {
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            say(why, why_len, "cannot start update thread %d", i);
            s->threads_running = 1;
            s->cfg.threads = i; /* stop the ones that started */
            stop_threads(s);
            s->cfg.threads = T;
            ps_server_close(s);
            return PS_ENOMEM;
        }
        s->upd[i].started = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    s->threads_running = 1;
    *out = s;
    return 0;
}
