/* libps: the worker-side client.  See include/ps_client.h for the contract.
 *
 * Threads:
 *  - the training thread posts operations (one per API call) into a
 *    mutex-protected queue and kicks an eventfd;
 *  - the comm thread (one per client) owns every socket: it creates one DEALER
 *    per server, turns each operation into one sub-request per chunk, sends
 *    them, matches replies to sub-requests by request id and completes the
 *    caller's ps_request;
 *  - ZeroMQ's I/O thread calls release_cb when it no longer needs a zero-copy
 *    payload frame.
 *
 * A ps_request's `pending` counts what must still happen before the caller
 * may touch its buffers again: one per chunk reply, plus one per zero-copy
 * frame not yet released.  Whoever takes it to zero (comm thread or I/O
 * thread) marks the request done and wakes waiters.  Everything else in a
 * ps_request (status, err, version) is written by the comm thread only,
 * before its own decrement, so a waiter that sees done sees them. */
#include "ps_client.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_placement.h"
#include "ps_time.h"

#define DEFAULT_CHUNK_BYTES (4u << 20)
#define DEFAULT_HELLO_MS 10000
#define DEFAULT_HEARTBEAT_MS 1000
/* Request id of heartbeats: never a slot's (generations start at 1), so their
 * replies are recognised and dropped. */
#define HEARTBEAT_SEQ 0
#define RESEND_MAX_BACKOFF_NS (30LL * 1000000000LL)
#define ERRBUF 512

/* An operation posted by the training thread.  type 0 is a cancel: fail every
 * sub-request of `req` with code `step` (used when start gives up waiting). */
typedef struct op {
    uint32_t type;    /* PS_MSG_*, or 0 for cancel */
    int server;       /* control messages: the target server */
    uint32_t tensor;  /* data messages: index in the placement */
    const float *src; /* init/push/pushpull payload (read in place) */
    float *dst;       /* pull/pushpull destination */
    int64_t step;
    ps_request *req;
    void *out;        /* HELLO: ps_hello reply; STATS: ps_stats */
    ps_ready_fn ready;/* push_when: send once ready(ready_arg) != 0 */
    void *ready_arg;
} op;

/* One message in flight to one server.  Indexed by the low 32 bits of the
 * request id; the high 32 bits are the slot's generation, so a reply to a
 * slot that was freed (a duplicate after a resend) is recognised and dropped. */
typedef struct sub {
    ps_request *req; /* NULL when the slot is free */
    uint32_t gen;
    uint32_t next_free;
    uint32_t type;
    int server;
    uint32_t chunk;
    uint64_t key;
    size_t count;    /* elements in the payload / expected reply */
    uint64_t total;  /* INIT: elements of the whole tensor */
    const float *src;
    float *dst;
    int64_t step;
    void *out;
    int64_t deadline_ns; /* resend time, when resending is on */
    int64_t backoff_ns;
} sub;

#define NO_SLOT UINT32_MAX

struct ps_client {
    ps_client_options opt;
    char *servers_str;
    char *curve_dir; /* our copy; NULL: plaintext */
    char **endpoints;
    int nservers;
    size_t chunk_elems;

    /* registration and placement: written by the training thread before
     * start, read-only afterwards (the queue mutex orders it for the comm
     * thread) */
    ps_tensor_spec *specs;
    size_t nspecs, cap_specs;
    ps_placement place;
    int have_place;
    uint64_t *kmap_keys; /* open addressing: key -> tensor index + 1 */
    uint32_t *kmap_val;
    size_t kmap_mask;
    ps_hello hello_req;  /* template; server_rank filled per server */
    int started;
    char last_error[ERRBUF];

    /* training thread -> comm thread */
    pthread_mutex_t qmu;
    op *queue;
    size_t qhead, qlen, qcap; /* ring buffer */
    int stopping;
    int efd;

    /* completions */
    pthread_mutex_t done_mu;
    pthread_cond_t done_cv;
    int nwaiters; /* threads in wait_until (atomic) */

    /* comm thread */
    void *zctx;
    pthread_t thread;
    int thread_started;
    int ready; /* 1 sockets up, -1 failed; guarded by done_mu */
    void **socks;
    sub *subs;
    uint32_t nsubs, cap_subs, free_head, live;
    op *batch;
    size_t batch_cap;
    /* ops held behind a push_when whose data is not ready yet, in post order */
    op *held;
    size_t held_head, held_len, held_cap;
    int64_t next_resend_check;
    int hb_on;           /* set by start (atomic): heartbeats may go */
    int64_t next_hb_ns;  /* comm thread: when the next heartbeats are due */
};

/* ---------- completion ---------- */

/* Mark r done and wake waiters.  The lock and broadcast are skipped when
 * nobody waits (the usual case when communication overlaps compute); the
 * seq_cst pair done/nwaiters here and in wait_until makes sure a waiter that
 * saw done == 0 is always counted before we look. */
static void complete(ps_client *c, ps_request *r)
{
    r->done_ns = ps_now_ns(); /* published by the store of done below */
    __atomic_store_n(&r->done, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->nwaiters, __ATOMIC_SEQ_CST) == 0)
        return;
    pthread_mutex_lock(&c->done_mu);
    pthread_cond_broadcast(&c->done_cv);
    pthread_mutex_unlock(&c->done_mu);
}

/* One part of r finished.  After this call the caller must not touch r. */
static void part_done(ps_client *c, ps_request *r)
{
    if (__atomic_sub_fetch(&r->pending, 1, __ATOMIC_ACQ_REL) == 0)
        complete(c, r);
}

/* ZeroMQ is done with a zero-copy payload frame (called from its I/O thread,
 * or from the comm thread when a send fails). */
static void release_cb(void *data, void *hint)
{
    (void)data;
    ps_request *r = hint;
    part_done(r->priv, r);
}

/* comm thread only; first error wins */
static void set_error(ps_request *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(ps_request *r, int code, const char *fmt, ...)
{
    if (r->status)
        return;
    r->status = code ? code : PS_EPROTO;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
}

static void set_last_error(ps_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_last_error(ps_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
}

/* ---------- sub-request slots (comm thread) ---------- */

static uint32_t slot_alloc(ps_client *c)
{
    if (c->free_head == NO_SLOT) {
        if (c->nsubs == c->cap_subs) {
            uint32_t ncap = c->cap_subs ? c->cap_subs * 2 : 256;
            sub *n = realloc(c->subs, (size_t)ncap * sizeof *n);
            if (!n)
                return NO_SLOT;
            c->subs = n;
            c->cap_subs = ncap;
        }
        uint32_t i = c->nsubs++;
        memset(&c->subs[i], 0, sizeof c->subs[i]);
        c->subs[i].gen = 1;
        c->subs[i].next_free = NO_SLOT;
        c->free_head = i;
    }
    uint32_t i = c->free_head;
    c->free_head = c->subs[i].next_free;
    c->live++;
    return i;
}

static void slot_free(ps_client *c, uint32_t i)
{
    sub *s = &c->subs[i];
    s->req = NULL;
    s->gen = s->gen + 1 ? s->gen + 1 : 1;
    s->next_free = c->free_head;
    c->free_head = i;
    c->live--;
}

/* Fail or finish sub-request i: record the error, free the slot and count the
 * reply part of its request as done. */
static void sub_finish(ps_client *c, uint32_t i)
{
    ps_request *r = c->subs[i].req;
    slot_free(c, i);
    part_done(c, r);
}

/* ---------- sending (comm thread) ---------- */

static uint64_t sub_id(const ps_client *c, uint32_t i)
{
    return (uint64_t)c->subs[i].gen << 32 | i;
}

static int zsend(void *sock, void *buf, size_t len, int flags)
{
    for (;;) {
        if (zmq_send(sock, buf, len, flags | ZMQ_DONTWAIT) >= 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* Send sub-request i (first time or a resend).  The caller has already
 * counted the payload's release in req->pending.  On failure the sub-request
 * is finished with PS_EIO. */
static void sub_send(ps_client *c, uint32_t i)
{
    sub *s = &c->subs[i];
    ps_request *r = s->req;
    ps_header h;
    ps_header_init(&h, s->type);
    h.seq = sub_id(c, i);
    h.rank = c->opt.rank;
    h.key = s->key;
    h.chunk = s->chunk;
    h.step = s->step;
    int payload = ps_msg_request_has_payload(s->type);
    if (payload) {
        h.count = s->count;
        h.dtype = PS_DTYPE_F32;
    }
    if (s->type == PS_MSG_INIT)
        h.total = s->total;
    if (s->type == PS_MSG_HELLO) {
        h.hello = c->hello_req;
        h.hello.server_rank = s->server;
    }
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    void *sock = c->socks[s->server];
    int err = 0, zerr = 0;
    int lost = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0) {
        err = PS_EPROTO;
    } else if (zsend(sock, buf, len, payload ? ZMQ_SNDMORE : 0) < 0) {
        err = PS_EIO;
        zerr = errno;
        /* EAGAIN: ZeroMQ has no connection to queue it on: the server
         * refused our handshake (CURVE).  A hello is then as good as lost,
         * and its timeout says why */
        if (zerr == EAGAIN && s->type == PS_MSG_HELLO)
            lost = 1;
    }
    if (payload) {
        if (!err) {
            zmq_msg_t m;
            /* zero-copy: ZeroMQ reads the caller's buffer in place and calls
             * release_cb when done with it */
            if (zmq_msg_init_data(&m, (void *)(s->src), s->count * sizeof(float), release_cb,
                                  r) != 0) {
                err = PS_ENOMEM;
                part_done(c, r); /* the release that will never come */
            } else {
                int rc;
                while ((rc = zmq_msg_send(&m, sock, ZMQ_DONTWAIT)) < 0 && errno == EINTR)
                    ;
                if (rc < 0) {
                    err = PS_EIO;
                    zerr = errno;
                    zmq_msg_close(&m); /* calls release_cb */
                }
            }
        } else {
            part_done(c, r); /* no frame was made: count its release now */
        }
    }
    if (err && lost) {
        ps_debug("libps: %s has no connection for %s (refused?); waiting to resend",
                 c->endpoints[s->server], ps_msg_type_name(s->type));
    } else if (err) {
        set_error(r, err, "%s: cannot send %s: %s%s", c->endpoints[s->server],
                  ps_msg_type_name(s->type), err == PS_EIO ? zmq_strerror(zerr) : ps_strerror(err),
                  err == PS_EIO && zerr == EAGAIN
                      ? " (no connection: did the server refuse this worker's CURVE key?)"
                      : "");
        sub_finish(c, i);
        return;
    }
    if (c->opt.request_timeout_ms > 0) {
        s->deadline_ns = ps_now_ns() + s->backoff_ns;
        if (s->deadline_ns < c->next_resend_check)
            c->next_resend_check = s->deadline_ns;
    }
}

/* Fire-and-forget HEARTBEAT to every server: no slot, no resend; the reply
 * is dropped.  A server that hears nothing from a worker for its
 * --worker-timeout treats it as lost. */
static void send_heartbeats(ps_client *c, int64_t now)
{
    if (c->opt.heartbeat_ms <= 0 || !__atomic_load_n(&c->hb_on, __ATOMIC_ACQUIRE))
        return;
    if (now < c->next_hb_ns)
        return;
    c->next_hb_ns = now + (int64_t)c->opt.heartbeat_ms * 1000000LL;
    ps_header h;
    ps_header_init(&h, PS_MSG_HEARTBEAT);
    h.seq = HEARTBEAT_SEQ;
    h.rank = c->opt.rank;
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0)
        return;
    for (int s = 0; s < c->nservers; s++)
        zsend(c->socks[s], buf, len, 0); /* queued while a server is away; fine */
}

/* Resending is safe: servers drop duplicate pushes by (rank, key, chunk,
 * step), queue a resent pull or barrier once (and answer a barrier that has
 * completed), and a second reply to the same id finds its slot freed. */
static int resendable(uint32_t type) { return type != PS_MSG_SHUTDOWN; }

static void check_resends(ps_client *c)
{
    int64_t now = ps_now_ns();
    if (c->opt.request_timeout_ms <= 0 || now < c->next_resend_check)
        return;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < c->nsubs; i++) {
        sub *s = &c->subs[i];
        if (!s->req || !resendable(s->type))
            continue;
        if (s->deadline_ns <= now) {
            ps_warn("libps: no reply from %s to %s key %llu chunk %u after %lld ms, resending",
                    c->endpoints[s->server], ps_msg_type_name(s->type),
                    (unsigned long long)s->key, s->chunk, (long long)(s->backoff_ns / 1000000));
            s->backoff_ns = s->backoff_ns * 2 < RESEND_MAX_BACKOFF_NS ? s->backoff_ns * 2
                                                                       : RESEND_MAX_BACKOFF_NS;
            if (ps_msg_request_has_payload(s->type))
                __atomic_add_fetch(&s->req->pending, 1, __ATOMIC_ACQ_REL);
            sub_send(c, i); /* may finish the slot on error */
            if (!c->subs[i].req)
                continue;
        }
        if (s->deadline_ns < next)
            next = s->deadline_ns;
    }
    c->next_resend_check = next;
}

/* Fill a new slot for one message; returns its index or NO_SLOT. */
static uint32_t sub_new(ps_client *c, const op *o, int server)
{
    uint32_t i = slot_alloc(c);
    if (i == NO_SLOT)
        return NO_SLOT;
    sub *s = &c->subs[i];
    s->req = o->req;
    s->type = o->type;
    s->server = server;
    s->chunk = 0;
    s->key = 0;
    s->count = 0;
    s->total = 0;
    s->src = NULL;
    s->dst = NULL;
    s->step = o->step;
    s->out = o->out;
    s->backoff_ns = (int64_t)c->opt.request_timeout_ms * 1000000LL;
    s->deadline_ns = INT64_MAX;
    return i;
}

/* Cancel: fail every sub-request of o->req with code o->step. */
static void do_cancel(ps_client *c, const op *o)
{
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].req == o->req) {
            set_error(o->req, (int)o->step, "%s: %s", c->endpoints[c->subs[i].server],
                      ps_strerror((int)o->step));
            sub_finish(c, i);
        }
}

/* Turn one posted operation into messages.  The poster set req->pending to
 * the number of messages (plus one per payload frame). */
static void do_op(ps_client *c, const op *o)
{
    ps_request *r = o->req;
    if (o->type == 0) {
        do_cancel(c, o);
        return;
    }
    if (o->type == PS_MSG_INIT || o->type == PS_MSG_PUSH || o->type == PS_MSG_PULL ||
        o->type == PS_MSG_PUSHPULL) {
        const ps_placement *p = &c->place;
        size_t first = p->first_chunk[o->tensor], n = p->tensor_chunks[o->tensor];
        int payload = ps_msg_request_has_payload(o->type);
        for (size_t k = 0; k < n; k++) {
            const ps_chunk_place *cp = &p->chunks[first + k];
            uint32_t i = sub_new(c, o, cp->server);
            if (i == NO_SLOT) {
                set_error(r, PS_ENOMEM, "out of memory for request slots");
                /* this chunk's reply and release will never come */
                part_done(c, r);
                if (payload)
                    part_done(c, r);
                continue;
            }
            sub *s = &c->subs[i];
            s->key = cp->key;
            s->chunk = cp->chunk;
            s->count = cp->count;
            s->total = c->specs[o->tensor].count;
            s->src = o->src ? o->src + cp->offset : NULL;
            s->dst = o->dst ? o->dst + cp->offset : NULL;
            sub_send(c, i);
        }
        return;
    }
    /* control message to one server */
    uint32_t i = sub_new(c, o, o->server);
    if (i == NO_SLOT) {
        set_error(r, PS_ENOMEM, "out of memory for request slots");
        part_done(c, r);
        return;
    }
    sub_send(c, i);
}

/* ---------- receiving (comm thread) ---------- */

static void handle_reply(ps_client *c, int server, const zmq_msg_t *hm, zmq_msg_t *pm,
                         int nframes)
{
    ps_header h;
    char why[256];
    const char *ep = c->endpoints[server];
    int rc = ps_proto_decode(zmq_msg_data((zmq_msg_t *)hm), zmq_msg_size((zmq_msg_t *)hm), &h,
                             why, sizeof why);
    if (rc) {
        /* without a valid header there is no request id to answer */
        ps_warn("libps: dropped a message from %s: %s", ep, why);
        return;
    }
    if (h.type == PS_MSG_HEARTBEAT || (h.type == PS_MSG_ERROR && h.seq == HEARTBEAT_SEQ))
        return; /* an answer to a heartbeat (an error one: the server does not know us) */
    uint32_t i = (uint32_t)(h.seq & 0xffffffffu);
    if (i >= c->nsubs || !c->subs[i].req || sub_id(c, i) != h.seq || c->subs[i].server != server) {
        ps_debug("libps: ignored a %s reply from %s for request %llu (already complete)",
                 ps_msg_type_name(h.type), ep, (unsigned long long)h.seq);
        return;
    }
    sub *s = &c->subs[i];
    ps_request *r = s->req;
    if (h.type == PS_MSG_ERROR) {
        set_error(r, h.err_code, "%s: %s", ep, h.err_text[0] ? h.err_text : ps_strerror(h.err_code));
        sub_finish(c, i);
        return;
    }
    if (h.type != s->type || !(h.flags & PS_FLAG_REPLY)) {
        set_error(r, PS_EPROTO, "%s: answered a %s request with a %s message", ep,
                  ps_msg_type_name(s->type), ps_msg_type_name(h.type));
        sub_finish(c, i);
        return;
    }
    size_t plen = nframes > 0 ? zmq_msg_size(pm) : 0;
    if (ps_proto_check_payload(&h, nframes, plen, why, sizeof why) != 0) {
        set_error(r, PS_EPROTO, "%s: %s", ep, why);
        sub_finish(c, i);
        return;
    }
    if (ps_msg_reply_has_payload(h.type)) {
        if (h.count != s->count || h.key != s->key || h.chunk != s->chunk) {
            set_error(r, PS_EPROTO, "%s: %s reply for key %llu chunk %u has %llu elements, expected "
                      "key %llu chunk %u with %zu", ep, ps_msg_type_name(h.type),
                      (unsigned long long)h.key, h.chunk, (unsigned long long)h.count,
                      (unsigned long long)s->key, s->chunk, s->count);
            sub_finish(c, i);
            return;
        }
        /* the one copy: received frame -> caller's buffer */
        memcpy(s->dst, zmq_msg_data(pm), plen);
    }
    switch (h.type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
        if (r->version < 0 || h.step < r->version)
            r->version = h.step;
        break;
    case PS_MSG_HELLO:
        if (s->out)
            *(ps_hello *)s->out = h.hello;
        break;
    case PS_MSG_STATS:
        if (s->out)
            *(ps_stats *)s->out = h.stats;
        break;
    case PS_MSG_BARRIER:
        r->version = h.step;
        break;
    default:
        break;
    }
    sub_finish(c, i);
}

static void drain_socket(ps_client *c, int server)
{
    void *sock = c->socks[server];
    for (;;) {
        zmq_msg_t hm, pm, extra;
        zmq_msg_init(&hm);
        if (zmq_msg_recv(&hm, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&hm);
            if (errno == EINTR)
                continue;
            return; /* EAGAIN: nothing more */
        }
        int nframes = 0;
        zmq_msg_init(&pm);
        int more = zmq_msg_more(&hm);
        if (more) {
            zmq_msg_recv(&pm, sock, 0);
            nframes = 1;
            more = zmq_msg_more(&pm);
        }
        while (more) { /* a well-formed reply has at most one payload */
            zmq_msg_init(&extra);
            zmq_msg_recv(&extra, sock, 0);
            more = zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            nframes++;
        }
        handle_reply(c, server, &hm, &pm, nframes);
        zmq_msg_close(&pm);
        zmq_msg_close(&hm);
    }
}

/* ---------- the comm thread ---------- */

static void fail_unsent(ps_client *c, const op *o)
{
    ps_request *r = o->req;
    if (o->type == 0)
        return;
    set_error(r, PS_ECLOSED, "client closed before the request was sent");
    __atomic_store_n(&r->pending, 0, __ATOMIC_RELEASE);
    complete(c, r);
}

static int open_sockets(ps_client *c)
{
    c->socks = calloc((size_t)c->nservers, sizeof *c->socks);
    if (!c->socks)
        return PS_ENOMEM;
    for (int s = 0; s < c->nservers; s++) {
        void *z = zmq_socket(c->zctx, ZMQ_DEALER);
        if (!z) {
            ps_error("libps: cannot create a socket: %s", zmq_strerror(errno));
            return PS_EIO;
        }
        c->socks[s] = z;
        int linger = 0, hwm = 0, immediate = 0;
        /* HWM 0: unlimited, so nothing is ever dropped or blocks; immediate
         * off: messages queue until the server is up */
        zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(z, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(z, ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_setsockopt(z, ZMQ_IMMEDIATE, &immediate, sizeof immediate);
        if (c->curve_dir) {
            char why[512];
            int rc = ps_curve_client_setup(z, c->curve_dir, c->opt.rank, s, why, sizeof why);
            if (rc) {
                ps_error("libps: CURVE for %s: %s", c->endpoints[s], why);
                return rc;
            }
        }
        if (zmq_connect(z, c->endpoints[s]) != 0) {
            ps_error("libps: cannot connect to '%s': %s", c->endpoints[s], zmq_strerror(errno));
            return PS_EINVAL;
        }
    }
    return 0;
}

static void close_sockets(ps_client *c)
{
    if (!c->socks)
        return;
    for (int s = 0; s < c->nservers; s++)
        if (c->socks[s])
            zmq_close(c->socks[s]);
    free(c->socks);
    c->socks = NULL;
}

/* Double a ring buffer of ops (*head: the oldest; len ops in it; capacity
 * *cap, which len has reached), unrolled so the oldest is at 0.  PS_ENOMEM
 * leaves it as it was. */
static int ring_grow(op **ring, size_t *head, size_t len, size_t *cap)
{
    size_t ncap = *cap ? *cap * 2 : 64;
    op *r = malloc(ncap * sizeof *r);
    if (!r)
        return PS_ENOMEM;
    for (size_t k = 0; k < len; k++)
        r[k] = (*ring)[(*head + k) % *cap];
    free(*ring);
    *ring = r;
    *head = 0;
    *cap = ncap;
    return 0;
}

/* A push_when op waits until its data is ready (e.g. a device-to-host copy
 * has finished); every op posted after it waits behind it, so a tensor's pull
 * never overtakes its push. */
static void take_op(ps_client *c, const op *o)
{
    if (!c->held_len && (!o->ready || o->ready(o->ready_arg))) {
        do_op(c, o);
        return;
    }
    if (c->held_len == c->held_cap &&
        ring_grow(&c->held, &c->held_head, c->held_len, &c->held_cap) != 0) {
        set_error(o->req, PS_ENOMEM, "out of memory holding a request");
        fail_unsent(c, o);
        return;
    }
    c->held[(c->held_head + c->held_len++) % c->held_cap] = *o;
}

static void release_held(ps_client *c)
{
    while (c->held_len) {
        op *o = &c->held[c->held_head];
        if (o->ready && !o->ready(o->ready_arg))
            return;
        op now = *o;
        c->held_head = (c->held_head + 1) % c->held_cap;
        c->held_len--;
        do_op(c, &now);
    }
}

static void *comm_main(void *arg)
{
    ps_client *c = arg;
    int rc = open_sockets(c);
    pthread_mutex_lock(&c->done_mu);
    c->ready = rc ? -rc : 1;
    pthread_cond_broadcast(&c->done_cv);
    pthread_mutex_unlock(&c->done_mu);
    if (rc) {
        close_sockets(c);
        return NULL;
    }
    int n = c->nservers + 1;
    zmq_pollitem_t *items = calloc((size_t)n, sizeof *items);
    if (!items) {
        ps_error("libps: out of memory in the comm thread");
        pthread_mutex_lock(&c->qmu);
        c->stopping = 1;
        pthread_mutex_unlock(&c->qmu);
    }
    for (int s = 0; items && s < c->nservers; s++) {
        items[s].socket = c->socks[s];
        items[s].events = ZMQ_POLLIN;
    }
    if (items) {
        items[c->nservers].fd = c->efd;
        items[c->nservers].events = ZMQ_POLLIN;
    }
    int stop = items == NULL;
    while (!stop) {
        long timeout = -1;
        int64_t now = ps_now_ns();
        if (c->opt.request_timeout_ms > 0 && c->live) {
            int64_t d = c->next_resend_check - now;
            timeout = d <= 0 ? 0 : d / 1000000 + 1;
        }
        if (c->opt.heartbeat_ms > 0 && __atomic_load_n(&c->hb_on, __ATOMIC_ACQUIRE)) {
            int64_t d = c->next_hb_ns - now;
            long t = d <= 0 ? 0 : (long)(d / 1000000 + 1);
            if (timeout < 0 || t < timeout)
                timeout = t;
        }
        if (c->held_len) {
            /* a device copy is in flight: look again in 20 us, not 1 ms */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            timeout = 0;
        }
        if (zmq_poll(items, n, timeout) < 0 && errno != EINTR) {
            ps_error("libps: zmq_poll failed: %s", zmq_strerror(errno));
            break;
        }
        if (items[c->nservers].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t rd = read(c->efd, &v, sizeof v);
            (void)rd;
        }
        /* take everything queued in one go, then work without the lock */
        pthread_mutex_lock(&c->qmu);
        size_t nb = c->qlen;
        if (nb > c->batch_cap) {
            op *b = realloc(c->batch, nb * sizeof *b);
            if (b) {
                c->batch = b;
                c->batch_cap = nb;
            } else {
                nb = c->batch_cap;
            }
        }
        for (size_t k = 0; k < nb; k++)
            c->batch[k] = c->queue[(c->qhead + k) % c->qcap];
        c->qhead = c->qcap ? (c->qhead + nb) % c->qcap : 0;
        c->qlen -= nb;
        stop = c->stopping;
        pthread_mutex_unlock(&c->qmu);
        for (size_t k = 0; k < nb; k++) {
            if (stop)
                fail_unsent(c, &c->batch[k]);
            else
                take_op(c, &c->batch[k]);
        }
        if (stop)
            break;
        release_held(c);
        for (int s = 0; s < c->nservers; s++)
            drain_socket(c, s);
        check_resends(c);
        send_heartbeats(c, ps_now_ns());
    }
    /* closing: whatever is still queued or in flight completes with
     * PS_ECLOSED; payload frames still queued in ZeroMQ are released (and
     * their requests completed) when the context terminates */
    pthread_mutex_lock(&c->qmu);
    c->stopping = 1;
    while (c->qlen) {
        op o = c->queue[c->qhead];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
        pthread_mutex_unlock(&c->qmu);
        fail_unsent(c, &o);
        pthread_mutex_lock(&c->qmu);
    }
    pthread_mutex_unlock(&c->qmu);
    for (; c->held_len; c->held_len--, c->held_head = (c->held_head + 1) % c->held_cap)
        fail_unsent(c, &c->held[c->held_head]);
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].req) {
            set_error(c->subs[i].req, PS_ECLOSED, "client closed while waiting for %s",
                      c->endpoints[c->subs[i].server]);
            sub_finish(c, i);
        }
    free(items);
    close_sockets(c);
    return NULL;
}

/* ---------- posting (training thread) ---------- */

static void kick(ps_client *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof one);
    (void)w;
}

static void req_reset(ps_client *c, ps_request *r, int pending)
{
    r->pending = pending;
    r->status = 0;
    r->done = 0;
    r->version = -1;
    r->done_ns = 0;
    r->err[0] = 0;
    r->priv = c;
}

static void req_fail(ps_request *r, int code, const char *text)
{
    r->pending = 0;
    r->status = code;
    r->version = -1;
    snprintf(r->err, sizeof r->err, "%s", text);
    r->priv = NULL;
    r->done_ns = ps_now_ns();
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}

static int post(ps_client *c, const op *o)
{
    pthread_mutex_lock(&c->qmu);
    if (c->stopping) {
        pthread_mutex_unlock(&c->qmu);
        return PS_ECLOSED;
    }
    if (c->qlen == c->qcap && ring_grow(&c->queue, &c->qhead, c->qlen, &c->qcap) != 0) {
        pthread_mutex_unlock(&c->qmu);
        return PS_ENOMEM;
    }
    c->queue[(c->qhead + c->qlen) % c->qcap] = *o;
    int was_empty = c->qlen++ == 0;
    pthread_mutex_unlock(&c->qmu);
    /* the comm thread drains the whole queue after each wake-up, so only the
     * post that makes the queue non-empty needs to wake it */
    if (was_empty)
        kick(c);
    return 0;
}

static long find_tensor(const ps_client *c, uint64_t key)
{
    if (!c->kmap_keys)
        return -1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & c->kmap_mask;
    for (;; h = (h + 1) & c->kmap_mask) {
        if (c->kmap_val[h] == 0)
            return -1;
        if (c->kmap_keys[h] == key)
            return (long)c->kmap_val[h] - 1;
    }
}

static int post_data(ps_client *c, uint32_t type, uint64_t key, const float *src, float *dst,
                     int64_t step, ps_ready_fn ready, void *ready_arg, ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    int rc = 0;
    long t = -1;
    if (!c || !c->started)
        rc = PS_ESTATE;
    else if ((t = find_tensor(c, key)) < 0)
        rc = PS_ENOTFOUND;
    else if ((ps_msg_request_has_payload(type) && !src) || (ps_msg_reply_has_payload(type) && !dst) ||
             step < 0 || step > INT64_MAX / 2)
        rc = PS_EINVAL;
    if (rc) {
        req_fail(req, rc, t < 0 && rc == PS_ENOTFOUND ? "key was not registered" : ps_strerror(rc));
        return rc;
    }
    int nchunks = (int)c->place.tensor_chunks[t];
    req_reset(c, req, nchunks * (ps_msg_request_has_payload(type) ? 2 : 1));
    op o = {.type = type, .server = -1, .tensor = (uint32_t)t, .src = src, .dst = dst,
            .step = step, .req = req, .out = NULL, .ready = ready, .ready_arg = ready_arg};
    rc = post(c, &o);
    if (rc)
        req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_init(ps_client *c, uint64_t key, const float *values, ps_request *req)
{
    return post_data(c, PS_MSG_INIT, key, values, NULL, 0, NULL, NULL, req);
}

int ps_client_push(ps_client *c, uint64_t key, const float *grad, int64_t step, ps_request *req)
{
    return post_data(c, PS_MSG_PUSH, key, grad, NULL, step, NULL, NULL, req);
}

int ps_client_pull(ps_client *c, uint64_t key, float *dst, int64_t step, ps_request *req)
{
    return post_data(c, PS_MSG_PULL, key, NULL, dst, step, NULL, NULL, req);
}

int ps_client_pushpull(ps_client *c, uint64_t key, const float *grad, float *dst, int64_t step,
                       ps_request *req)
{
    return post_data(c, PS_MSG_PUSHPULL, key, grad, dst, step, NULL, NULL, req);
}

int ps_client_push_when(ps_client *c, uint64_t key, const float *grad, int64_t step,
                        ps_ready_fn ready, void *ready_arg, ps_request *req)
{
    return post_data(c, PS_MSG_PUSH, key, grad, NULL, step, ready, ready_arg, req);
}

int ps_request_test(ps_request *req) { return __atomic_load_n(&req->done, __ATOMIC_ACQUIRE); }

/* Wait for r until deadline (INT64_MAX: forever); 1 when done. */
static int wait_until(ps_request *r, int64_t deadline_ns)
{
    if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE))
        return 1;
    ps_client *c = r->priv;
    if (!c)
        return 0;
    pthread_mutex_lock(&c->done_mu);
    __atomic_add_fetch(&c->nwaiters, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&r->done, __ATOMIC_SEQ_CST)) {
        if (deadline_ns == INT64_MAX) {
            pthread_cond_wait(&c->done_cv, &c->done_mu);
        } else {
            if (ps_now_ns() >= deadline_ns)
                break;
            struct timespec ts = {deadline_ns / 1000000000LL, deadline_ns % 1000000000LL};
            pthread_cond_timedwait(&c->done_cv, &c->done_mu, &ts);
        }
    }
    __atomic_sub_fetch(&c->nwaiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->done_mu);
    return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

int ps_request_wait(ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    if (!wait_until(req, INT64_MAX))
        return PS_EINVAL; /* never posted */
    return req->status;
}

/* Post a control message to one server. */
static int post_ctl(ps_client *c, uint32_t type, int server, int64_t step, void *out,
                    ps_request *req)
{
    req_reset(c, req, 1);
    op o = {.type = type, .server = server, .tensor = 0, .src = NULL, .dst = NULL, .step = step,
            .req = req, .out = out};
    int rc = post(c, &o);
    if (rc)
        req_fail(req, rc, ps_strerror(rc));
    return rc;
}

/* Give up on req: fail its outstanding messages with `code` and wait until
 * the comm thread has let go of it. */
static void cancel(ps_client *c, ps_request *req, int code)
{
    op o = {.type = 0, .server = -1, .tensor = 0, .src = NULL, .dst = NULL, .step = code,
            .req = req, .out = NULL};
    if (post(c, &o) == 0)
        wait_until(req, INT64_MAX);
}

/* ---------- lifecycle ---------- */

void ps_client_options_default(ps_client_options *o)
{
    memset(o, 0, sizeof *o);
    o->servers = NULL;
    o->rank = 0;
    o->num_workers = 1;
    o->mode = PS_MODE_SYNC;
    o->max_staleness = -1;
    o->chunk_bytes = 0;
    o->expect.kind = PS_OPT_NONE;
    o->hello_timeout_ms = 0;
    o->request_timeout_ms = 0;
    o->curve_dir = NULL;
    o->heartbeat_ms = DEFAULT_HEARTBEAT_MS;
}

static int split_endpoints(ps_client *c)
{
    c->servers_str = strdup(c->opt.servers);
    if (!c->servers_str)
        return PS_ENOMEM;
    size_t cap = 1;
    for (const char *p = c->servers_str; *p; p++)
        cap += *p == ',';
    c->endpoints = calloc(cap, sizeof *c->endpoints);
    if (!c->endpoints)
        return PS_ENOMEM;
    char *save = NULL;
    for (char *tok = strtok_r(c->servers_str, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        char *e = tok + strlen(tok);
        while (e > tok && (e[-1] == ' ' || e[-1] == '\t'))
            *--e = 0;
        if (!*tok)
            continue;
        c->endpoints[c->nservers++] = tok;
    }
    return c->nservers > 0 ? 0 : PS_EINVAL;
}

static void client_free(ps_client *c)
{
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    if (c->efd >= 0)
        close(c->efd);
    pthread_mutex_destroy(&c->qmu);
    pthread_mutex_destroy(&c->done_mu);
    pthread_cond_destroy(&c->done_cv);
    if (c->have_place)
        ps_placement_free(&c->place);
    free(c->kmap_keys);
    free(c->kmap_val);
    free(c->specs);
    free(c->queue);
    free(c->batch);
    free(c->held);
    free(c->subs);
    free(c->endpoints);
    free(c->servers_str);
    free(c->curve_dir);
    free(c);
}

int ps_client_open(const ps_client_options *o, ps_client **out)
{
    *out = NULL;
    if (!o || !o->servers || !*o->servers) {
        ps_error("libps: no server endpoints given");
        return PS_EINVAL;
    }
    if (o->num_workers < 1 || o->num_workers > PS_MAX_RANK + 1 || o->rank < 0 ||
        o->rank >= o->num_workers) {
        ps_error("libps: rank %d must be in [0, num_workers %d), num_workers in [1, %d]", o->rank,
                 o->num_workers, PS_MAX_RANK + 1);
        return PS_EINVAL;
    }
    if (o->mode != PS_MODE_SYNC && o->mode != PS_MODE_ASYNC) {
        ps_error("libps: mode must be sync (%d) or async (%d), got %d", PS_MODE_SYNC,
                 PS_MODE_ASYNC, o->mode);
        return PS_EINVAL;
    }
    if (o->mode == PS_MODE_ASYNC && (o->max_staleness < -1 || o->max_staleness > 1000000)) {
        ps_error("libps: max_staleness must be -1 (unbounded) or 0..1000000, got %d",
                 o->max_staleness);
        return PS_EINVAL;
    }
    size_t cb = o->chunk_bytes ? o->chunk_bytes : DEFAULT_CHUNK_BYTES;
    if (cb < sizeof(float) || cb > PS_MAX_PAYLOAD_BYTES) {
        ps_error("libps: chunk_bytes must be in [4, %llu], got %zu",
                 (unsigned long long)PS_MAX_PAYLOAD_BYTES, cb);
        return PS_EINVAL;
    }
    if (o->expect.kind < PS_OPT_NONE || o->expect.kind > PS_OPT_KIND_MAX ||
        o->hello_timeout_ms < 0 || o->request_timeout_ms < 0 || o->heartbeat_ms < 0) {
        ps_error("libps: bad optimizer kind %d or negative timeout", o->expect.kind);
        return PS_EINVAL;
    }
    ps_client *c = calloc(1, sizeof *c);
    if (!c)
        return PS_ENOMEM;
    c->opt = *o;
    c->opt.curve_dir = NULL; /* the caller's string may go away; we keep a copy */
    if (o->curve_dir && !(c->curve_dir = strdup(o->curve_dir))) {
        free(c);
        return PS_ENOMEM;
    }
    c->chunk_elems = cb / sizeof(float);
    c->efd = -1;
    c->free_head = NO_SLOT;
    pthread_mutex_init(&c->qmu, NULL);
    pthread_mutex_init(&c->done_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = split_endpoints(c);
    if (rc) {
        ps_error("libps: no server endpoint in '%s'", o->servers);
        goto fail;
    }
    c->opt.servers = NULL; /* the caller's string may go away; we keep our copy */
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->zctx = zmq_ctx_new();
    if (c->efd < 0 || !c->zctx) {
        ps_error("libps: cannot create the wake-up eventfd or ZeroMQ context: %s", strerror(errno));
        rc = PS_EIO;
        goto fail;
    }
    if (pthread_create(&c->thread, NULL, comm_main, c) != 0) {
        ps_error("libps: cannot start the comm thread");
        rc = PS_ENOMEM;
        goto fail;
    }
    c->thread_started = 1;
    pthread_mutex_lock(&c->done_mu);
    while (c->ready == 0)
        pthread_cond_wait(&c->done_cv, &c->done_mu);
    int ready = c->ready;
    pthread_mutex_unlock(&c->done_mu);
    if (ready < 0) {
        pthread_join(c->thread, NULL);
        rc = -ready;
        goto fail;
    }
    *out = c;
    return 0;
fail:
    client_free(c);
    return rc;
}

int ps_client_register(ps_client *c, uint64_t key, size_t count)
{
    if (!c)
        return PS_EINVAL;
    if (c->started) {
        set_last_error(c, "register key %llu after start", (unsigned long long)key);
        return PS_ESTATE;
    }
    if (count == 0 || count > (size_t)1 << 40) {
        set_last_error(c, "key %llu: count %zu must be in [1, 2^40]", (unsigned long long)key,
                       count);
        return PS_EINVAL;
    }
    for (size_t i = 0; i < c->nspecs; i++)
        if (c->specs[i].key == key) {
            set_last_error(c, "key %llu registered twice", (unsigned long long)key);
            return PS_EINVAL;
        }
    if ((size_t)(count + c->chunk_elems - 1) / c->chunk_elems > PS_MAX_CHUNK) {
        set_last_error(c, "key %llu: %zu elements make more than %u chunks",
                       (unsigned long long)key, count, PS_MAX_CHUNK);
        return PS_ETOOBIG;
    }
    if (c->nspecs == c->cap_specs) {
        size_t ncap = c->cap_specs ? c->cap_specs * 2 : 16;
        ps_tensor_spec *n = realloc(c->specs, ncap * sizeof *n);
        if (!n)
            return PS_ENOMEM;
        c->specs = n;
        c->cap_specs = ncap;
    }
    c->specs[c->nspecs].key = key;
    c->specs[c->nspecs].count = count;
    c->nspecs++;
    return 0;
}

static int build_keymap(ps_client *c)
{
    size_t cap = 16;
    while (cap < 2 * c->nspecs)
        cap *= 2;
    c->kmap_keys = calloc(cap, sizeof *c->kmap_keys);
    c->kmap_val = calloc(cap, sizeof *c->kmap_val);
    if (!c->kmap_keys || !c->kmap_val)
        return PS_ENOMEM;
    c->kmap_mask = cap - 1;
    for (size_t t = 0; t < c->nspecs; t++) {
        uint64_t key = c->specs[t].key;
        size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & c->kmap_mask;
        while (c->kmap_val[h])
            h = (h + 1) & c->kmap_mask;
        c->kmap_keys[h] = key;
        c->kmap_val[h] = (uint32_t)t + 1;
    }
    return 0;
}

static void drop_placement(ps_client *c)
{
    if (c->have_place)
        ps_placement_free(&c->place);
    c->have_place = 0;
    free(c->kmap_keys);
    free(c->kmap_val);
    c->kmap_keys = NULL;
    c->kmap_val = NULL;
}

/* Check every hello reply: answered, no error, consistent with this worker
 * and with each other.  Fills last_error. */
static int check_hellos(ps_client *c, ps_request *reqs, ps_hello *reps)
{
    char why[400];
    int ns = c->nservers;
    /* a server that refused us says why */
    for (int s = 0; s < ns; s++)
        if (reqs[s].status && reqs[s].status != PS_ETIMEDOUT) {
            set_last_error(c, "%s", reqs[s].err);
            return PS_EMISMATCH;
        }
    size_t off = 0;
    int missing = 0;
    for (int s = 0; s < ns; s++)
        if (reqs[s].status == PS_ETIMEDOUT) {
            if (!missing)
                off += (size_t)snprintf(c->last_error, sizeof c->last_error,
                                        "no hello reply within %d ms from ",
                                        c->opt.hello_timeout_ms ? c->opt.hello_timeout_ms
                                                                : DEFAULT_HELLO_MS);
            if (off < sizeof c->last_error)
                off += (size_t)snprintf(c->last_error + off, sizeof c->last_error - off, "%s%s",
                                        missing ? ", " : "", c->endpoints[s]);
            missing++;
        }
    if (missing && c->curve_dir) {
        off = strlen(c->last_error);
        snprintf(c->last_error + off, sizeof c->last_error - off,
                 " (CURVE is on: a server that does not accept this worker's key never answers; "
                 "check --curve-keys and %s)", c->curve_dir);
    } else if (missing) {
        off = strlen(c->last_error);
        snprintf(c->last_error + off, sizeof c->last_error - off,
                 " (is it running and reachable? a server started with --curve-keys never "
                 "answers a plaintext worker: give this worker --curve-keys too)");
    }
    if (missing)
        return PS_ETIMEDOUT;
    for (int s = 0; s < ns; s++) {
        if (reps[s].server_rank != s) {
            set_last_error(c, "server rank: %s is rank %d but is listed at position %d", c->endpoints[s],
                           reps[s].server_rank, s);
            return PS_EMISMATCH;
        }
        /* the server should have refused a mismatch itself; check anyway, by
         * the same rule (ps_opt_compare: what this worker gives) */
        ps_hello mine = c->hello_req;
        if (ps_hello_compare(&mine, "this worker", &reps[s], c->endpoints[s], 1, why, sizeof why)) {
            set_last_error(c, "%s", why);
            return PS_EMISMATCH;
        }
        if (s > 0 &&
            ps_hello_compare(&reps[0], c->endpoints[0], &reps[s], c->endpoints[s], 1, why, sizeof why)) {
            set_last_error(c, "servers disagree: %s", why);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

int ps_client_start(ps_client *c)
{
    if (!c)
        return PS_EINVAL;
    if (c->started) {
        set_last_error(c, "client already started");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    drop_placement(c);
    /* ps_placement_build sorts through a file-static pointer (not
     * reentrant); clients starting in several threads take turns */
    static pthread_mutex_t place_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&place_mu);
    int rc = ps_placement_build(c->specs, c->nspecs, c->chunk_elems, c->nservers, &c->place);
    pthread_mutex_unlock(&place_mu);
    if (rc) {
        set_last_error(c, "placement failed: %s", ps_strerror(rc));
        return rc;
    }
    c->have_place = 1;
    rc = build_keymap(c);
    if (rc) {
        set_last_error(c, "out of memory");
        drop_placement(c);
        return rc;
    }
    ps_hello *hq = &c->hello_req;
    memset(hq, 0, sizeof *hq);
    hq->mode = c->opt.mode;
    hq->max_staleness = c->opt.mode == PS_MODE_SYNC ? 0 : c->opt.max_staleness;
    hq->num_workers = (uint32_t)c->opt.num_workers;
    hq->num_servers = (uint32_t)c->nservers;
    hq->server_rank = -1;
    hq->model_fp = ps_placement_fingerprint(c->specs, c->nspecs, c->chunk_elems);
    hq->opt = c->opt.expect;

    int ns = c->nservers;
    ps_request *reqs = calloc((size_t)ns, sizeof *reqs);
    ps_hello *reps = calloc((size_t)ns, sizeof *reps);
    if (!reqs || !reps) {
        free(reqs);
        free(reps);
        drop_placement(c);
        return PS_ENOMEM;
    }
    for (int s = 0; s < ns && !rc; s++)
        rc = post_ctl(c, PS_MSG_HELLO, s, 0, &reps[s], &reqs[s]);
    int timeout = c->opt.hello_timeout_ms ? c->opt.hello_timeout_ms : DEFAULT_HELLO_MS;
    int64_t deadline = ps_now_ns() + (int64_t)timeout * 1000000LL;
    for (int s = 0; s < ns; s++) {
        if (reqs[s].priv && !wait_until(&reqs[s], deadline))
            cancel(c, &reqs[s], PS_ETIMEDOUT);
    }
    if (rc)
        set_last_error(c, "cannot post hello: %s", ps_strerror(rc));
    else
        rc = check_hellos(c, reqs, reps);
    free(reqs);
    free(reps);
    if (rc) {
        drop_placement(c);
        return rc;
    }
    c->started = 1;
    __atomic_store_n(&c->hb_on, 1, __ATOMIC_RELEASE);
    kick(c); /* the comm thread may be asleep with no timeout: start the heartbeats */
    return 0;
}

const char *ps_client_last_error(const ps_client *c) { return c ? c->last_error : ""; }

/* Post `type` to each server in [lo, hi) and wait for every reply. */
static int ctl_all(ps_client *c, uint32_t type, int lo, int hi, int64_t step, void *out)
{
    int n = hi - lo;
    ps_request one, *reqs = n == 1 ? &one : calloc((size_t)n, sizeof *reqs);
    if (!reqs)
        return PS_ENOMEM;
    int rc = 0;
    int posted = 0;
    for (int s = lo; s < hi && !rc; s++, posted++)
        rc = post_ctl(c, type, s, step, out, &reqs[s - lo]);
    if (rc) {
        set_last_error(c, "cannot post %s: %s", ps_msg_type_name(type), ps_strerror(rc));
        posted--;
    }
    for (int k = 0; k < posted; k++) {
        int st = ps_request_wait(&reqs[k]);
        if (st && !rc) {
            rc = st;
            set_last_error(c, "%s", reqs[k].err);
        }
    }
    if (reqs != &one)
        free(reqs);
    return rc;
}

int ps_client_barrier(ps_client *c, int64_t id)
{
    if (!c || id < 0 || id > INT64_MAX / 2)
        return PS_EINVAL;
    if (!c->started) {
        set_last_error(c, "barrier before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    return ctl_all(c, PS_MSG_BARRIER, 0, 1, id, NULL);
}

int ps_client_stats(ps_client *c, int server, ps_stats *out)
{
    if (!c || !out || server < 0 || server >= c->nservers)
        return PS_EINVAL;
    c->last_error[0] = 0;
    memset(out, 0, sizeof *out);
    return ctl_all(c, PS_MSG_STATS, server, server + 1, 0, out);
}

int ps_client_shutdown_servers(ps_client *c)
{
    if (!c)
        return PS_EINVAL;
    c->last_error[0] = 0;
    return ctl_all(c, PS_MSG_SHUTDOWN, 0, c->nservers, 0, NULL);
}

int ps_client_num_servers(const ps_client *c) { return c ? c->nservers : 0; }

size_t ps_client_chunk_elems(const ps_client *c) { return c ? c->chunk_elems : 0; }

void ps_client_close(ps_client *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->qmu);
    c->stopping = 1;
    pthread_mutex_unlock(&c->qmu);
    kick(c);
    if (c->thread_started)
        pthread_join(c->thread, NULL);
    /* terminating the context releases every zero-copy frame ZeroMQ still
     * holds, which completes the last requests (release_cb) */
    zmq_ctx_term(c->zctx);
    c->zctx = NULL;
    client_free(c);
}
