/* libps: the comm thread, and the queue that feeds it.
 *
 * One comm thread per client owns every socket (a DEALER per server, created
 * and closed here) and all sub-request state.  The training thread reaches it
 * only through psc_post (a mutex-protected ring of ops and an eventfd kick);
 * the loop takes the whole queue at once, turns each op into one message per
 * chunk (or one control message), sends them, and matches replies to their
 * slots.  A push_when op whose data is not ready yet is held, and every op
 * posted after it waits behind it.
 *
 * Sending a sub-request is psc_sub_send: the header frame, then
 * send_payload, the one place a payload leaves this process (zero-copy from
 * the caller's buffer, or, with a narrower wire type, a converted copy); a
 * same-host data plane replaces that function.  handle_reply is the one
 * place a pulled payload comes in (copied, or widened, into the caller's
 * buffer).
 * Resends and heartbeats are client_resend.c's; completions and slots
 * client_requests.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client_internal.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* ---------- the queue (training thread -> comm thread) ---------- */

void psc_kick(ps_client *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->efd, &one, sizeof one);
    (void)w;
}

/* Double a ring buffer of ops (*head: the oldest; len ops in it; capacity
 * *cap, which len has reached), unrolled so the oldest is at 0.  PS_ENOMEM
 * leaves it as it was. */
static int ring_grow(psc_op **ring, size_t *head, size_t len, size_t *cap)
{
    size_t ncap = *cap ? *cap * 2 : 64;
    psc_op *r = malloc(ncap * sizeof *r);
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

int psc_post(ps_client *c, const psc_op *o)
{
    if (__atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE))
        return PS_ECLOSED;
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
        psc_kick(c);
    return 0;
}

/* Comm thread: take everything queued in one go (into c->batch, so the work
 * happens without the lock); *stop is set once the client is closing. */
static size_t take_queue(ps_client *c, int *stop)
{
    pthread_mutex_lock(&c->qmu);
    size_t nb = c->qlen;
    if (nb > c->batch_cap) {
        psc_op *b = realloc(c->batch, nb * sizeof *b);
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
    *stop = c->stopping || __atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&c->qmu);
    return nb;
}

/* ---------- sending ---------- */

int psc_zsend(void *sock, const void *buf, size_t len, int flags)
{
    for (;;) {
        if (zmq_send(sock, buf, len, flags | ZMQ_DONTWAIT) >= 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

static void fill_header(const ps_client *c, uint32_t i, ps_header *h)
{
    const psc_sub *s = &c->subs[i];
    ps_header_init(h, s->type);
    h->seq = psc_slot_id(c, i);
    h->rank = c->opt.rank;
    h->key = s->key;
    h->chunk = s->chunk;
    ps_header_set_s(h, s->step); /* what `s` means for the type (ps_msg_table.h) */
    h->npush = s->type == PS_MSG_PUSH || s->type == PS_MSG_PUSHPULL ? s->npush : 0;
    if (ps_msg_request_has_payload(s->type)) {
        h->count = s->count;
        /* gradients in the wire type; an init's first weights stay exact */
        h->dtype = s->type == PS_MSG_INIT ? PS_DTYPE_F32 : c->wire_dtype;
    }
    if (s->type == PS_MSG_INIT)
        h->total = s->total;
    if (s->type == PS_MSG_HELLO) {
        h->hello = c->hello_req;
        h->hello.server_rank = s->server;
    }
    psc_tokens_fill(c, s->server, h);
}

/* Send the payload of sub-request i, the frame after its header.  The
 * release part its request counts for the payload is done exactly once,
 * whatever happens: by ZeroMQ through psc_release_cb when it is finished with
 * the caller's buffer, or here when the frame cannot go.  0, or PS_ENOMEM, or
 * PS_EIO with errno in *zerr.  The one place a payload leaves the process. */
static int send_payload(ps_client *c, uint32_t i, void *sock, uint32_t dtype, int *zerr)
{
    const psc_sub *s = &c->subs[i];
    ps_request *r = s->req;
    zmq_msg_t m;
    if (dtype != PS_DTYPE_F32) {
        /* a narrower wire type: the frame is a converted copy of its own, so
         * the caller's buffer is free again at once (a resend converts anew) */
        int rc = zmq_msg_init_size(&m, s->count * ps_dtype_size(dtype));
        if (rc == 0)
            ps_dtype_from_f32(dtype, zmq_msg_data(&m), s->src, s->count);
        psc_part_done(c, r);
        if (rc != 0)
            return PS_ENOMEM;
    } else if (zmq_msg_init_data(&m, (void *)s->src, s->count * sizeof(float), psc_release_cb,
                                 r) != 0) {
        /* zero-copy: ZeroMQ reads the caller's buffer in place */
        psc_part_done(c, r); /* the release that will never come */
        return PS_ENOMEM;
    }
    int rc;
    while ((rc = zmq_msg_send(&m, sock, ZMQ_DONTWAIT)) < 0 && errno == EINTR)
        ;
    if (rc < 0) {
        *zerr = errno;
        zmq_msg_close(&m); /* a zero-copy frame: calls psc_release_cb */
        return PS_EIO;
    }
    return 0;
}

void psc_sub_send(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->subs[i];
    ps_request *r = s->req;
    ps_header h;
    fill_header(c, i, &h);
    int payload = ps_msg_request_has_payload(s->type);
    if (psc_shm_use(c, s, &h.shm_off, &h.shm_dst)) {
        /* same host: the payload (or the pull's destination) is in the
         * arena; only the header goes, with where it is */
        h.flags |= PS_FLAG_SHM;
        h.count = s->count;
        h.dtype = PS_DTYPE_F32;
        if (payload) {
            payload = 0;
            psc_part_done(c, r); /* no frame holds the buffer: its release is now */
        }
    }
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    void *sock = c->socks[s->server];
    int err = 0, zerr = 0;
    int lost = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0) {
        err = PS_EPROTO;
    } else if (psc_zsend(sock, buf, len, payload ? ZMQ_SNDMORE : 0) < 0) {
        err = PS_EIO;
        zerr = errno;
        /* EAGAIN: ZeroMQ has no connection to queue it on: the server
         * refused our handshake (CURVE).  A hello is then as good as lost,
         * and its timeout says why */
        if (zerr == EAGAIN && s->type == PS_MSG_HELLO)
            lost = 1;
    }
    if (payload) {
        if (!err)
            err = send_payload(c, i, sock, h.dtype, &zerr);
        else
            psc_part_done(c, r); /* no frame was made: count its release now */
    }
    if (err && lost) {
        ps_debug("libps: %s has no connection for %s (refused?); waiting to resend",
                 c->endpoints[s->server], ps_msg_type_name(s->type));
    } else if (err) {
        psc_set_error(r, err, "%s: cannot send %s: %s%s", c->endpoints[s->server],
                      ps_msg_type_name(s->type),
                      err == PS_EIO ? zmq_strerror(zerr) : ps_strerror(err),
                      err == PS_EIO && zerr == EAGAIN
                          ? " (no connection: did the server refuse this worker's CURVE key?)"
                          : "");
        psc_slot_finish(c, i);
        return;
    }
    psc_resend_arm(c, i);
}

/* Cancel: fail every sub-request of o->req with code o->step. */
static void do_cancel(ps_client *c, const psc_op *o)
{
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].req == o->req) {
            psc_set_error(o->req, (int)o->step, "%s: %s", c->endpoints[c->subs[i].server],
                          ps_strerror((int)o->step));
            psc_slot_finish(c, i);
        }
}

/* Turn one posted operation into messages.  The poster set the request's
 * pending to the number of messages (plus one per payload frame). */
static void do_op(ps_client *c, const psc_op *o)
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
            uint32_t i = psc_slot_new(c, o, cp->server);
            if (i == PSC_NO_SLOT) {
                psc_set_error(r, PS_ENOMEM, "out of memory for request slots");
                /* this chunk's reply and release will never come */
                psc_part_done(c, r);
                if (payload)
                    psc_part_done(c, r);
                continue;
            }
            psc_sub *s = &c->subs[i];
            s->key = cp->key;
            s->chunk = cp->chunk;
            s->count = cp->count;
            s->total = c->specs[o->tensor].count;
            s->src = o->src ? o->src + cp->offset : NULL;
            s->dst = o->dst ? o->dst + cp->offset : NULL;
            psc_sub_send(c, i);
        }
        return;
    }
    /* control message to one server */
    uint32_t i = psc_slot_new(c, o, o->server);
    if (i == PSC_NO_SLOT) {
        psc_set_error(r, PS_ENOMEM, "out of memory for request slots");
        psc_part_done(c, r);
        return;
    }
    psc_sub_send(c, i);
}

/* ---------- held ops (push_when) ---------- */

/* A push_when op waits until its data is ready (e.g. a device-to-host copy
 * has finished); every op posted after it waits behind it, so a tensor's pull
 * never overtakes its push. */
static void take_op(ps_client *c, const psc_op *o)
{
    if (!c->held_len && (!o->ready || o->ready(o->ready_arg))) {
        do_op(c, o);
        return;
    }
    if (c->held_len == c->held_cap &&
        ring_grow(&c->held, &c->held_head, c->held_len, &c->held_cap) != 0) {
        psc_set_error(o->req, PS_ENOMEM, "out of memory holding a request");
        psc_fail_unsent(c, o);
        return;
    }
    c->held[(c->held_head + c->held_len++) % c->held_cap] = *o;
}

static void release_held(ps_client *c)
{
    while (c->held_len) {
        psc_op *o = &c->held[c->held_head];
        if (o->ready && !o->ready(o->ready_arg))
            return;
        psc_op now = *o;
        c->held_head = (c->held_head + 1) % c->held_cap;
        c->held_len--;
        do_op(c, &now);
    }
}

/* ---------- receiving ---------- */

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
    if (h.type == PS_MSG_HEARTBEAT || (h.type == PS_MSG_ERROR && h.seq == PSC_HEARTBEAT_SEQ)) {
        /* an answer to a heartbeat; an error one: the server dropped or forgot us */
        if (h.type == PS_MSG_ERROR && h.err_code == PS_EHELLO)
            psc_rejoin_heartbeat_refused(c, server, &h);
        return;
    }
    uint32_t i = psc_slot_find(c, h.seq, server);
    if (i == PSC_NO_SLOT) {
        ps_debug("libps: ignored a %s reply from %s for request %llu (already complete)",
                 ps_msg_type_name(h.type), ep, (unsigned long long)h.seq);
        return;
    }
    if (psc_rejoin_reply(c, i, &h))
        return; /* the answer to a hello that rejoins this server */
    psc_sub *s = &c->subs[i];
    ps_request *r = s->req;
    if (h.type == PS_MSG_ERROR) {
        /* "say hello again": parked until this server takes us back, then resent */
        if (h.err_code == PS_EHELLO && psc_rejoin_refused(c, i, &h) == 0)
            return;
        psc_set_error(r, h.err_code, "%s: %s", ep,
                      h.err_text[0] ? h.err_text : ps_strerror(h.err_code));
        psc_slot_finish(c, i);
        return;
    }
    if (h.type != s->type || !(h.flags & PS_FLAG_REPLY)) {
        psc_set_error(r, PS_EPROTO, "%s: answered a %s request with a %s message", ep,
                      ps_msg_type_name(s->type), ps_msg_type_name(h.type));
        psc_slot_finish(c, i);
        return;
    }
    size_t plen = nframes > 0 ? zmq_msg_size(pm) : 0;
    if (ps_proto_check_payload(&h, nframes, plen, why, sizeof why) != 0) {
        psc_set_error(r, PS_EPROTO, "%s: %s", ep, why);
        psc_slot_finish(c, i);
        return;
    }
    if (ps_msg_reply_has_payload(h.type)) {
        if (h.count != s->count || h.key != s->key || h.chunk != s->chunk) {
            psc_set_error(r, PS_EPROTO, "%s: %s reply for key %llu chunk %u has %llu elements, "
                          "expected key %llu chunk %u with %zu", ep, ps_msg_type_name(h.type),
                          (unsigned long long)h.key, h.chunk, (unsigned long long)h.count,
                          (unsigned long long)s->key, s->chunk, s->count);
            psc_slot_finish(c, i);
            return;
        }
        /* the one copy: received frame -> caller's buffer (widened from a
         * narrower wire type); through shared memory the server has written
         * the destination already */
        uint64_t off;
        if (!(h.flags & PS_FLAG_SHM)) {
            ps_dtype_to_f32(h.dtype, s->dst, zmq_msg_data(pm), s->count);
        } else if (!ps_shm_contains(&c->arena, s->dst, s->count * sizeof(float), &off) ||
                   off != h.shm_off) {
            psc_set_error(r, PS_EPROTO, "%s: %s reply says the weights are at offset %llu of "
                          "the arena, not where this request wanted them", ep,
                          ps_msg_type_name(h.type), (unsigned long long)h.shm_off);
            psc_slot_finish(c, i);
            return;
        }
    }
    switch (h.type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
        if (r->version < 0 || h.chunk_version < r->version)
            r->version = h.chunk_version;
        break;
    case PS_MSG_HELLO:
        psc_tokens_keep(c, s->server, &h.hello);
        if (s->out)
            *(ps_hello *)s->out = h.hello;
        break;
    case PS_MSG_STATS:
        if (s->out) {
            psc_stats_out *o = s->out;
            if (o->stats)
                *o->stats = h.stats;
            if (o->barrier)
                *o->barrier = h.barrier;
        }
        break;
    case PS_MSG_BARRIER:
        r->version = h.barrier_id;
        break;
    default:
        break;
    }
    psc_rejoin_served(c, server);
    psc_slot_finish(c, i);
}

static void drain_socket(ps_client *c, int server)
{
    void *sock = c->socks[server];
    for (int got = 0;; got = 1) {
        zmq_msg_t hm, pm, extra;
        zmq_msg_init(&hm);
        if (zmq_msg_recv(&hm, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&hm);
            if (errno == EINTR)
                continue;
            if (got) /* any message, even an error or a heartbeat's reply, is a sign of life */
                psc_server_heard(c, server, ps_now_ns());
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

/* ---------- sockets ---------- */

/* The DEALER of server s, into c->socks[s]; the reason of a failure goes to
 * why. */
static int open_socket(ps_client *c, int s, char *why, size_t why_len)
{
    void *z = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!z) {
        ps_errorf(why, why_len, "cannot create a socket: %s", zmq_strerror(errno));
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
        char cwhy[512];
        int rc = ps_curve_client_setup(z, c->curve_dir, c->opt.rank, s, cwhy, sizeof cwhy);
        if (rc) {
            ps_errorf(why, why_len, "CURVE for %s: %s", c->endpoints[s], cwhy);
            return rc;
        }
    }
    if (zmq_connect(z, c->endpoints[s]) != 0) {
        ps_errorf(why, why_len, "cannot connect to '%s': %s", c->endpoints[s],
                  zmq_strerror(errno));
        return PS_EINVAL;
    }
    return 0;
}

/* One DEALER per server; the reason of a failure goes to c->last_error. */
static int open_sockets(ps_client *c)
{
    c->socks = calloc((size_t)c->nservers, sizeof *c->socks);
    if (!c->socks) {
        ps_errorf(c->last_error, sizeof c->last_error, "out of memory for sockets");
        return PS_ENOMEM;
    }
    for (int s = 0; s < c->nservers; s++) {
        int rc = open_socket(c, s, c->last_error, sizeof c->last_error);
        if (rc)
            return rc;
    }
    return 0;
}

void psc_socket_reset(ps_client *c, int s)
{
    /* linger 0: ZeroMQ discards what it still queues for the server and
     * releases those payloads (psc_release_cb) on its own threads */
    zmq_close(c->socks[s]);
    c->socks[s] = NULL;
    char why[PSC_ERRBUF];
    if (open_socket(c, s, why, sizeof why) != 0) {
        /* it worked at open; if it no longer does, later sends to s fail */
        ps_error("libps: cannot reconnect to %s: %s", c->endpoints[s], why);
        if (c->socks[s]) {
            zmq_close(c->socks[s]);
            c->socks[s] = NULL;
        }
    }
    if (c->poll_items) {
        c->poll_items[s].socket = c->socks[s];
        c->poll_items[s].fd = -1; /* with no socket: ignored by the poll */
    }
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

/* ---------- the loop ---------- */

/* Closing or interrupted: whatever is still queued, held or in flight
 * completes with PS_ECLOSED; payload frames still queued in ZeroMQ are
 * released (and their requests completed) when close_sockets discards them
 * (linger 0). */
static void fail_everything(ps_client *c)
{
    const char *why = __atomic_load_n(&c->interrupted, __ATOMIC_ACQUIRE)
                          ? "interrupted (ps_client_interrupt, e.g. by a signal)"
                          : "client closed";
    pthread_mutex_lock(&c->qmu);
    c->stopping = 1;
    while (c->qlen) {
        psc_op o = c->queue[c->qhead];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
        pthread_mutex_unlock(&c->qmu);
        psc_fail_unsent(c, &o);
        pthread_mutex_lock(&c->qmu);
    }
    pthread_mutex_unlock(&c->qmu);
    for (; c->held_len; c->held_len--, c->held_head = (c->held_head + 1) % c->held_cap)
        psc_fail_unsent(c, &c->held[c->held_head]);
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i].req) {
            psc_set_error(c->subs[i].req, PS_ECLOSED, "%s while waiting for %s", why,
                          c->endpoints[c->subs[i].server]);
            psc_slot_finish(c, i);
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
    c->poll_items = items;
    int stop = items == NULL;
    while (!stop) {
        int64_t now = ps_now_ns();
        long timeout = psc_liveness_timeout_ms(c, now);
        if (c->held_len) {
            /* a device copy is in flight: look again in 20 us, not 1 ms */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            timeout = 0;
        }
        c->wake_by_ns = timeout < 0 ? INT64_MAX : now + (int64_t)timeout * 1000000LL;
        if (zmq_poll(items, n, timeout) < 0 && errno != EINTR) {
            ps_error("libps: zmq_poll failed: %s", zmq_strerror(errno));
            break;
        }
        if (items[c->nservers].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t rd = read(c->efd, &v, sizeof v);
            (void)rd;
        }
        size_t nb = take_queue(c, &stop);
        for (size_t k = 0; k < nb; k++) {
            if (stop)
                psc_fail_unsent(c, &c->batch[k]);
            else
                take_op(c, &c->batch[k]);
        }
        if (stop)
            break;
        release_held(c);
        for (int s = 0; s < c->nservers; s++)
            drain_socket(c, s);
        now = ps_now_ns();
        psc_resend_due(c, now);
        psc_heartbeat_due(c, now);
        psc_server_timeout_due(c, now);
    }
    fail_everything(c);
    c->poll_items = NULL;
    free(items);
    close_sockets(c);
    return NULL;
}

int psc_comm_start(ps_client *c)
{
    if (pthread_create(&c->thread, NULL, comm_main, c) != 0) {
        ps_errorf(c->last_error, sizeof c->last_error, "cannot start the comm thread");
        return PS_ENOMEM;
    }
    c->thread_started = 1;
    pthread_mutex_lock(&c->done_mu);
    while (c->ready == 0)
        pthread_cond_wait(&c->done_cv, &c->done_mu);
    int ready = c->ready;
    pthread_mutex_unlock(&c->done_mu);
    if (ready < 0) {
        pthread_join(c->thread, NULL);
        c->thread_started = 0;
        return -ready;
    }
    return 0;
}

void psc_comm_stop(ps_client *c)
{
    pthread_mutex_lock(&c->qmu);
    c->stopping = 1;
    pthread_mutex_unlock(&c->qmu);
    psc_kick(c);
    if (c->thread_started)
        pthread_join(c->thread, NULL);
    c->thread_started = 0;
}
