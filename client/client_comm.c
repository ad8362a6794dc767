/* libps: the comm thread, and the queue that feeds it.
 *
 * One comm thread per client owns every socket (a DEALER per server, created
 * and closed here) and all sub-request state.  The training thread reaches it
 * only through psc_post (a mutex-protected ring of ops and an eventfd kick);
 * the loop takes the whole queue at once, has each op turned into one message
 * per chunk (or one control message) and sent (client_send.c), and matches
 * replies to their slots.  A push_when op whose data is not ready yet is
 * held, and every op posted after it waits behind it.
 *
 * handle_reply is the one place a pulled payload comes in (copied, or
 * widened, into the caller's buffer).
 *
 * When to resend, to send heartbeats and to give up on a silent server is
 * client_resend.c's, when to say hello again to a server that refused us
 * client_rejoin.c's: they say what to send (a slot, a server) and the loop
 * here sends it, so only this file and client_send.c touch a socket and they
 * call nothing in either.  Completions and slots are client_requests.c's. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client_comm_internal.h"
#include "client_metrics.h"
#include "client_moved.h"
#include "client_rejoin.h"
#include "client_route.h"
#include "client_requests.h"
#include "client_resend.h"
#include "client_shm.h"
#include "client_read.h"
#include "client_sparse.h"
#include "client_token.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"


/* ---------- the queue (training thread -> comm thread) ---------- */

void psc_kick(ps_client *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->comm->efd, &one, sizeof one);
    (void)w;
}

void psc_comm_interrupt(ps_client *c)
{
    __atomic_store_n(&c->comm->interrupted, 1, __ATOMIC_RELEASE);
    psc_kick(c); /* write(2) on the eventfd: async-signal-safe */
}

int psc_comm_interrupted(const ps_client *c)
{
    return __atomic_load_n(&c->comm->interrupted, __ATOMIC_ACQUIRE);
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
    struct psc_comm *m = c->comm;
    if (psc_comm_interrupted(c))
        return PS_ECLOSED;
    pthread_mutex_lock(&m->mu);
    if (m->stopping) {
        pthread_mutex_unlock(&m->mu);
        return PS_ECLOSED;
    }
    if (m->qlen == m->qcap && ring_grow(&m->queue, &m->qhead, m->qlen, &m->qcap) != 0) {
        pthread_mutex_unlock(&m->mu);
        return PS_ENOMEM;
    }
    m->queue[(m->qhead + m->qlen) % m->qcap] = *o;
    int was_empty = m->qlen++ == 0;
    pthread_mutex_unlock(&m->mu);
    psc_metrics_posted(c, o->type);
    /* the comm thread drains the whole queue after each wake-up, so only the
     * post that makes the queue non-empty needs to wake it */
    if (was_empty)
        psc_kick(c);
    return 0;
}

/* Comm thread: take everything queued in one go (into m->batch, so the work
 * happens without the lock); *stop is set once the client is closing. */
static size_t take_queue(ps_client *c, int *stop)
{
    struct psc_comm *m = c->comm;
    pthread_mutex_lock(&m->mu);
    size_t nb = m->qlen;
    if (nb > m->batch_cap) {
        psc_op *b = realloc(m->batch, nb * sizeof *b);
        if (b) {
            m->batch = b;
            m->batch_cap = nb;
        } else {
            nb = m->batch_cap;
        }
    }
    for (size_t k = 0; k < nb; k++)
        m->batch[k] = m->queue[(m->qhead + k) % m->qcap];
    m->qhead = m->qcap ? (m->qhead + nb) % m->qcap : 0;
    m->qlen -= nb;
    *stop = m->stopping || psc_comm_interrupted(c);
    pthread_mutex_unlock(&m->mu);
    return nb;
}

/* ---------- held ops (push_when) ---------- */

/* A push_when op waits until its data is ready (e.g. a device-to-host copy
 * has finished); every op posted after it waits behind it, so a tensor's pull
 * never overtakes its push. */
static void take_op(ps_client *c, const psc_op *o)
{
    struct psc_comm *m = c->comm;
    if (!m->held_len && (!o->ready || o->ready(o->ready_arg))) {
        psc_do_op(c, o);
        return;
    }
    if (m->held_len == m->held_cap &&
        ring_grow(&m->held, &m->held_head, m->held_len, &m->held_cap) != 0) {
        psc_set_error(o->req, PS_ENOMEM, "out of memory holding a request");
        psc_fail_unsent(c, o);
        return;
    }
    m->held[(m->held_head + m->held_len++) % m->held_cap] = *o;
}

static void release_held(ps_client *c)
{
    struct psc_comm *m = c->comm;
    while (m->held_len) {
        psc_op *o = &m->held[m->held_head];
        if (o->ready && !o->ready(o->ready_arg))
            return;
        psc_op now = *o;
        m->held_head = (m->held_head + 1) % m->held_cap;
        m->held_len--;
        psc_do_op(c, &now);
    }
}

/* ---------- receiving ---------- */

/* `server` refused us with `refusal` (PS_EHELLO: it dropped or forgot this
 * rank; PS_EPERM: it counts another connection as this rank's, e.g. our old
 * one, which it has not seen close): say hello again, with the rank's token,
 * unless client_rejoin.c says not now. */
static void rejoin(ps_client *c, int server, const ps_header *refusal)
{
    uint32_t i = psc_rejoin_hello(c, server, refusal);
    if (i != PSC_NO_SLOT && psc_sub_send(c, i) != 0)
        psc_rejoin_unsent(c, server);
}

static void socket_reset(ps_client *c, int s);

/* Replicated groups (client_route.h): group g moves to the member
 * client_route.c chose.  A new socket there; every request that waited on
 * the group waits for our hello to it (client_rejoin.c), then goes again. */
static void move_group(ps_client *c, int g, const char *why)
{
    socket_reset(c, g);
    psc_server_heard(c, g, ps_now_ns()); /* its silence counts from here */
    psc_rejoin_served(c, g);             /* a fresh count of hellos */
    const struct psc_slots *sl = c->slots;
    uint32_t hello = psc_rejoin_slot(c, g);
    for (uint32_t i = 0; i < sl->n; i++) {
        psc_sub *s = &sl->sub[i];
        if (!s->req || s->server != g || s->parked)
            continue;
        /* hellos go again at once; the rest once the member took us */
        if (s->type == PS_MSG_HELLO || psc_rejoin_park(c, i) != 0)
            psc_resend(c, i);
    }
    if (hello == PSC_NO_SLOT && __atomic_load_n(&c->started, __ATOMIC_ACQUIRE)) {
        ps_header h;
        ps_header_init(&h, PS_MSG_ERROR);
        h.err_code = PS_ENOTPRIMARY;
        snprintf(h.err_text, sizeof h.err_text, "moved here: %s", why);
        rejoin(c, g, &h);
    }
}

/* A member of a replicated group answered PS_ENOTPRIMARY (h): move, or ask
 * it again shortly (its promotion is under way); the refused request i
 * (PSC_NO_SLOT: a heartbeat's) waits for the hello. */
static void not_primary(ps_client *c, int g, uint32_t i, const ps_header *h)
{
    if (i != PSC_NO_SLOT && c->slots->sub[i].type != PS_MSG_HELLO &&
        psc_rejoin_park(c, i) != 0)
        c->slots->sub[i].deadline_ns = 0; /* not parked (start): resent soon */
    if (psc_route_refused(c, g, h, ps_now_ns()))
        move_group(c, g, h->err_text);
}

/* A hello to group g is due again (after a refusal): the one on its way is
 * sent again, else a new one. */
static void hello_again(ps_client *c, int g)
{
    uint32_t i = psc_rejoin_slot(c, g);
    if (i != PSC_NO_SLOT) {
        psc_resend(c, i);
    } else if (__atomic_load_n(&c->started, __ATOMIC_ACQUIRE)) {
        ps_header h;
        ps_header_init(&h, PS_MSG_ERROR);
        h.err_code = PS_ENOTPRIMARY;
        snprintf(h.err_text, sizeof h.err_text, "asking the group's member again");
        rejoin(c, g, &h);
    }
}

/* `server` does not know a table of ours (PS_ENOTFOUND): declare them all
 * to it again, unless client_rejoin.c says one is on its way. */
static void redeclare(ps_client *c, int server, const ps_header *refusal)
{
    if (psc_redeclare_begin(c, server, refusal) != 0)
        return;
    for (size_t t = 0; t < c->ntables; t++) {
        uint32_t i = psc_redeclare_slot(c, server, t);
        if (i != PSC_NO_SLOT)
            psc_sub_send(c, i); /* a failure finishes its slot, with the error */
    }
    psc_redeclare_unsent(c, server);
}

static void handle_moved(ps_client *c, int server, uint32_t i, const ps_header *h);

static void handle_reply(ps_client *c, int server, const zmq_msg_t *hm, zmq_msg_t *pm,
                         int nframes)
{
    ps_header h;
    char why[256];
    const char *ep = psc_slot_name(c, server);
    int rc = ps_proto_decode(zmq_msg_data((zmq_msg_t *)hm), zmq_msg_size((zmq_msg_t *)hm), &h,
                             why, sizeof why);
    if (rc) {
        /* without a valid header there is no request id to answer */
        ps_warn("libps: dropped a message from %s: %s", ep, why);
        return;
    }
    if (h.type == PS_MSG_ERROR && h.err_code == PS_ENOTPRIMARY && psc_route_any(c)) {
        not_primary(c, server, h.seq == HEARTBEAT_SEQ ? PSC_NO_SLOT : psc_slot_find(c, h.seq, server),
                    &h);
        return;
    }
    /* a server that left the job (any reply may say so, a heartbeat's too) */
    if (h.type == PS_MSG_ERROR && h.err_code == PS_EMOVED &&
        (h.slot < 0 || h.seq == HEARTBEAT_SEQ)) {
        handle_moved(c, server, h.seq == HEARTBEAT_SEQ ? PSC_NO_SLOT
                                                       : psc_slot_find(c, h.seq, server), &h);
        return;
    }
    if (h.type == PS_MSG_HEARTBEAT || (h.type == PS_MSG_ERROR && h.seq == HEARTBEAT_SEQ)) {
        /* an answer to a heartbeat; an error one: the server dropped or forgot us */
        if (h.type == PS_MSG_ERROR && (h.err_code == PS_EHELLO || h.err_code == PS_EPERM))
            rejoin(c, server, &h); /* before a request runs into the refusal */
        return;
    }
    uint32_t i = psc_slot_find(c, h.seq, server);
    if (i == PSC_NO_SLOT) {
        ps_debug("libps: ignored a %s reply from %s for request %llu (already complete)",
                 ps_msg_type_name(h.type), ep, (unsigned long long)h.seq);
        return;
    }
    int ok;
    if (psc_redeclare_reply(c, i, &h, &ok)) {
        /* a TABLE of a re-declaration: once all are taken, what waited goes */
        for (uint32_t k = ok ? psc_rejoin_unpark(c, server, 0) : PSC_NO_SLOT;
             k != PSC_NO_SLOT; k = psc_rejoin_unpark(c, server, k + 1))
            psc_resend(c, k);
        return;
    }
    if (psc_rejoin_reply(c, i, &h)) {
        /* the answer to a hello that rejoins this server: if it took us
         * back, what waited for that goes again */
        if (h.type == PS_MSG_HELLO)
            psc_route_settled(c, server, ps_now_ns());
        for (uint32_t k = psc_rejoin_unpark(c, server, 0); k != PSC_NO_SLOT;
             k = psc_rejoin_unpark(c, server, k + 1))
            psc_resend(c, k);
        return;
    }
    psc_sub *s = &c->slots->sub[i];
    ps_request *r = s->req;
    if (h.type == PS_MSG_ERROR) {
        /* "say hello again": parked until this server takes us back, then resent */
        if ((h.err_code == PS_EHELLO || h.err_code == PS_EPERM) && psc_rejoin_park(c, i) == 0) {
            rejoin(c, server, &h);
            return;
        }
        /* "not declared on this server": parked until our tables are again */
        if (h.err_code == PS_ENOTFOUND && psc_redeclare_park(c, i) == 0) {
            redeclare(c, server, &h);
            return;
        }
        /* "not here any more": after it, to where it is now */
        if (h.err_code == PS_EMOVED) {
            handle_moved(c, server, i, &h);
            return;
        }
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
    if (ps_proto_check_payload(&h, nframes, plen, why, sizeof why) != 0 ||
        (s->sp && psc_sparse_reply(c, i, &h, pm, why, sizeof why) != 0) ||
        ((h.type == PS_MSG_SNAPSHOT || h.type == PS_MSG_SNAPREAD) &&
         psc_read_reply(c, i, &h, pm, why, sizeof why) != 0)) {
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
        } else if (!psc_shm_holds(c, s->dst, s->count * sizeof(float), &off) ||
                   off != h.shm_off) {
            psc_set_error(r, PS_EPROTO, "%s: %s reply says the weights are at offset %llu of "
                          "the arena, not where this request wanted them", ep,
                          ps_msg_type_name(h.type), (unsigned long long)h.shm_off);
            psc_slot_finish(c, i);
            return;
        }
    }
    if (h.type == PS_MSG_LOOKUP) /* its rows, copied in above, to the caller's places */
        psc_read_reply(c, i, &h, pm, why, sizeof why);
    switch (h.type) {
    case PS_MSG_SPULL:
    case PS_MSG_SPUSH:
    case PS_MSG_SPUSHPULL:
    case PS_MSG_SASSIGN:
        if (!s->sp->versioned)
            break;
        /* fall through */
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
    case PS_MSG_PULL:
    case PS_MSG_PUSHPULL:
    case PS_MSG_ASSIGN:
    case PS_MSG_SETSTATE:
    case PS_MSG_STATE:
    case PS_MSG_LOOKUP:
    case PS_MSG_CLOCK: {
        /* what `s` says for the type: the smallest over the chunks */
        int64_t v = ps_header_get_s(&h);
        if (r->version < 0 || v < r->version)
            r->version = v;
        if (h.type == PS_MSG_CLOCK && s->out && v > *(int64_t *)s->out)
            *(int64_t *)s->out = v; /* ps_client_join: the largest too */
        break;
    }
    case PS_MSG_HELLO:
        psc_tokens_keep(c, s->server, &h.hello);
        if (s->out)
            *(ps_hello *)s->out = h.hello;
        break;
    case PS_MSG_HYPER:
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
    case PS_MSG_ALLREDUCE:
    case PS_MSG_BROADCAST:
        r->version = h.barrier_id;
        break;
    case PS_MSG_MEMBERS:
        if (s->out) {
            psc_members_out *o = s->out;
            o->count = h.key <= INT32_MAX ? (int)h.key : -1;
            o->index = (int)h.chunk - 1; /* c = 0: not a member */
            o->version = h.members_version;
        }
        break;
    default:
        break;
    }
    psc_rejoin_served(c, server);
    psc_slot_finish(c, i);
}

/* ---------- moved objects (client_moved.h) ---------- */

/* Asking again for an object on its way to the server asked: after 2 ms,
 * doubling to 50 ms. */
#define LOAD_FIRST_NS (2LL * 1000000LL)
#define LOAD_MAX_NS (50LL * 1000000LL)

static int open_socket(ps_client *c, int s, char *why, size_t why_len);

/* The poll item of server slot s's socket. */
static int poll_at(const ps_client *c, int s)
{
    return s < c->nservers ? s : c->nservers + 1 + (psc_route_any(c) ? c->nservers : 0) +
                                     (s - c->nservers);
}

/* Room for nslots server slots in every per-slot array: the modules', the
 * sockets and the poll items. */
static int grow_slots(ps_client *c, int nslots)
{
    struct psc_comm *m = c->comm;
    if (psc_requests_grow(c, nslots) || psc_liveness_grow(c, nslots) ||
        psc_rejoin_grow(c, nslots) || psc_tokens_grow(c, nslots))
        return PS_ENOMEM;
    if (nslots > m->nsocks) {
        void **sk = realloc(m->socks, (size_t)nslots * sizeof *sk);
        if (!sk)
            return PS_ENOMEM;
        memset(sk + m->nsocks, 0, (size_t)(nslots - m->nsocks) * sizeof *sk);
        m->socks = sk;
        m->nsocks = nslots;
    }
    int np = poll_at(c, nslots - 1) + 1;
    if (np > m->npoll) {
        zmq_pollitem_t *it = realloc(m->poll_items, (size_t)np * sizeof *it);
        if (!it)
            return PS_ENOMEM;
        for (int k = m->npoll; k < np; k++)
            it[k] = (zmq_pollitem_t){.socket = NULL, .fd = -1, .events = ZMQ_POLLIN};
        m->poll_items = it;
        m->npoll = np;
    }
    return 0;
}

/* Server slot `slot`, new to us, at ep: its arrays, its socket (made as the
 * listed servers' are: CURVE with its key) and our hello, which what goes
 * there waits for.  0, or the reason in why. */
static int add_slot(ps_client *c, int slot, const char *ep, char *why, size_t why_len)
{
    struct psc_comm *m = c->comm;
    if (grow_slots(c, slot + 1) || psc_moved_add(c, slot, ep)) {
        ps_errorf(why, why_len, "out of memory adding server slot %d (%s)", slot, ep);
        return PS_ENOMEM;
    }
    int rc = open_socket(c, slot, why, why_len);
    if (rc) {
        if (m->socks[slot])
            zmq_close(m->socks[slot]);
        m->socks[slot] = NULL;
        psc_moved_remove(c, slot); /* nothing can go there: looked for elsewhere */
        return rc;
    }
    m->poll_items[poll_at(c, slot)].socket = m->socks[slot];
    psc_server_heard(c, slot, ps_now_ns()); /* its silence counts from now */
    psc_join_send(c, slot); /* a failure fails what then waits for it */
    return 0;
}

/* Sub-request i goes to server slot `to` (its object is there, or is to be
 * asked for there): now, or at at_ns when not 0. */
static void redirect(ps_client *c, uint32_t i, int to, int64_t at_ns)
{
    if (c->slots->sub[i].sp)
        psc_sparse_moved(c, i);
    psc_slot_move(c, i, to);
    if (at_ns)
        psc_resend_after(c, i, at_ns);
    else
        psc_resend(c, i);
}

/* Fail sub-request i with code and what it was about. */
static void moved_fail(ps_client *c, uint32_t i, int code, const char *fmt, const char *a,
                       int n)
{
    psc_sub *s = &c->slots->sub[i];
    char text[PS_ERR_TEXT_MAX + 128];
    snprintf(text, sizeof text, fmt, a, n);
    psc_set_error(s->req, code, "%s (%s key %llu chunk %u)", text, ps_msg_type_name(s->type),
                  (unsigned long long)s->key, s->chunk);
    psc_slot_finish(c, i);
}

/* Server slot `slot` left the job: nothing goes there again, its socket
 * closes, and what waited on it follows its object from the object's home
 * (or server 0), whose PS_EMOVED names where it is now; control messages to
 * it fail, but those every server hears (a leave, ...) are done. */
static void slot_left(ps_client *c, int slot)
{
    struct psc_comm *m = c->comm;
    if (psc_slot_state(c, slot) == PSC_SLOT_REMOVED)
        return;
    psc_moved_remove(c, slot);
    const struct psc_slots *sl = c->slots;
    for (uint32_t i = 0; i < sl->n; i++) {
        psc_sub *s = &sl->sub[i]; /* sl->sub may move as hellos are made: read anew */
        if (!s->req || s->server != slot)
            continue;
        if (s->obj_kind == PSC_OBJ_NONE && psc_to_every_server(s->type)) {
            psc_slot_finish(c, i);
        } else if (s->obj_kind == PSC_OBJ_NONE) {
            moved_fail(c, i, PS_EMOVED, "%s (server slot %d) left the job before answering",
                       psc_slot_name(c, slot), slot);
        } else if (++s->hops > PSC_MOVED_MAX_HOPS) {
            moved_fail(c, i, PS_EMOVED, "%s: redirected %d times without an answer",
                       psc_slot_name(c, slot), PSC_MOVED_MAX_HOPS);
        } else {
            s->parked = 0;
            redirect(c, i, psc_moved_route(c, s->obj_kind, s->obj_table, s->obj, s->home), 0);
        }
    }
    if (slot < m->nsocks && m->socks[slot]) {
        /* linger 0: what ZeroMQ still queued for it is released (those
         * requests went again above) */
        psc_route_unwatch(c, slot, m->socks[slot]);
        zmq_close(m->socks[slot]);
        m->socks[slot] = NULL;
        m->poll_items[poll_at(c, slot)].socket = NULL;
        m->poll_items[poll_at(c, slot)].fd = -1;
    }
}

/* Server `server` answered PS_EMOVED (h) to sub-request i (PSC_NO_SLOT: to
 * a heartbeat, or a request already complete). */
static void handle_moved(ps_client *c, int server, uint32_t i, const ps_header *h)
{
    char why[PS_ERR_TEXT_MAX + 256];
    int what = psc_moved_check(c, server, h, why, sizeof why);
    if (what == PSC_MOVED_LEFT) {
        slot_left(c, server);
        return;
    }
    if (i == PSC_NO_SLOT) {
        if (what == PSC_MOVED_BAD)
            ps_warn("libps: %s", why);
        return;
    }
    psc_sub *s = &c->slots->sub[i];
    const char *ep = psc_slot_name(c, server);
    if (what == PSC_MOVED_BAD) {
        ps_error("libps: %s", why);
        psc_set_error(s->req, PS_EPROTO, "%s", why);
        psc_slot_finish(c, i);
        return;
    }
    if (s->obj_kind == PSC_OBJ_NONE) { /* a control message has no object to follow */
        moved_fail(c, i, PS_EMOVED, "%s answered PS_EMOVED (to server slot %d) to a message "
                   "that is about no object", ep, h->slot);
        return;
    }
    int64_t now = ps_now_ns();
    if (what == PSC_MOVED_LOADING) {
        /* it is being loaded there: ask again shortly, as long as a silent
         * server would be waited for */
        if (!s->loads++)
            s->load_since_ns = now;
        if (c->opt.server_timeout_ms > 0 &&
            now - s->load_since_ns > (int64_t)c->opt.server_timeout_ms * 1000000LL) {
            moved_fail(c, i, PS_ETIMEDOUT, "%s: still on its way there after %d ms", ep,
                       c->opt.server_timeout_ms);
            return;
        }
        int64_t d = LOAD_FIRST_NS << (s->loads - 1 < 5 ? s->loads - 1 : 5);
        redirect(c, i, server, now + (d < LOAD_MAX_NS ? d : LOAD_MAX_NS));
        return;
    }
    s->loads = 0;
    if (++s->hops > PSC_MOVED_MAX_HOPS) {
        moved_fail(c, i, PS_EMOVED, "%s: redirected %d times without an answer (do the servers "
                   "disagree where it is?)", ep, PSC_MOVED_MAX_HOPS);
        return;
    }
    if (what == PSC_MOVED_GONE) {
        /* named a slot that left: from its home (or server 0) again, after a pause */
        psc_moved_set(c, s->obj_kind, s->obj_table, s->obj, s->home);
        redirect(c, i, psc_moved_route(c, s->obj_kind, s->obj_table, s->obj, s->home),
                 now + LOAD_MAX_NS);
        return;
    }
    if (what == PSC_MOVED_NEW && add_slot(c, h->slot, h->owner_ep, why, sizeof why) != 0) {
        s = &c->slots->sub[i];
        ps_error("libps: %s", why);
        psc_set_error(s->req, PS_EIO, "%s", why);
        psc_slot_finish(c, i);
        return;
    }
    s = &c->slots->sub[i]; /* the hello's slot may have moved the table */
    /* the object is there from now on (out of memory: this request goes
     * there anyway, the next ones find it again) */
    uint32_t tables[PS_MAX_LOOKUP_TABLES];
    size_t nt = 1;
    tables[0] = s->obj_table;
    if (s->obj_table == PSC_ALL_TABLES)
        nt = psc_lookup_tables(c, i, tables, PS_MAX_LOOKUP_TABLES);
    for (size_t k = 0; k < nt; k++)
        psc_moved_set(c, s->obj_kind, tables[k], s->obj, h->slot);
    psc_moved_said(c, server, h->slot);
    redirect(c, i, h->slot, 0);
}

static void drain_socket(ps_client *c, int server)
{
    void *sock = c->comm->socks[server];
    for (int got = 0; sock && sock == c->comm->socks[server]; got = 1) {
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

/* The DEALER of server s, into socks[s]; the reason of a failure goes to
 * why. */
static int open_socket(ps_client *c, int s, char *why, size_t why_len)
{
    struct psc_comm *m = c->comm;
    void *z = zmq_socket(m->zctx, ZMQ_DEALER);
    if (!z) {
        ps_errorf(why, why_len, "cannot create a socket: %s", zmq_strerror(errno));
        return PS_EIO;
    }
    m->socks[s] = z;
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
            ps_errorf(why, why_len, "CURVE for %s: %s", psc_slot_name(c, s), cwhy);
            return rc;
        }
    }
    if (zmq_connect(z, psc_route_endpoint(c, s)) != 0) {
        ps_errorf(why, why_len, "cannot connect to '%s': %s", psc_route_endpoint(c, s),
                  zmq_strerror(errno));
        return PS_EINVAL;
    }
    psc_route_watch(c, s, m->zctx, z); /* a replicated group: its disconnects */
    return 0;
}

/* One DEALER per server; the reason of a failure goes to c->last_error. */
static int open_sockets(ps_client *c)
{
    struct psc_comm *m = c->comm;
    m->socks = calloc((size_t)c->nservers, sizeof *m->socks);
    m->nsocks = m->socks ? c->nservers : 0;
    if (!m->socks) {
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

/* Close the socket of server s and connect a new one: ZeroMQ drops what it
 * still queued for s, releasing those payloads, so requests given up on can
 * complete; a server that comes back later gets a fresh connection. */
static void socket_reset(ps_client *c, int s)
{
    struct psc_comm *m = c->comm;
    /* linger 0: ZeroMQ discards what it still queues for the server and
     * releases those payloads (psc_release_cb) on its own threads */
    psc_route_unwatch(c, s, m->socks[s]);
    zmq_close(m->socks[s]);
    m->socks[s] = NULL;
    char why[PSC_ERRBUF];
    if (open_socket(c, s, why, sizeof why) != 0) {
        /* it worked at open; if it no longer does, later sends to s fail */
        ps_error("libps: cannot reconnect to %s: %s", psc_slot_name(c, s), why);
        if (m->socks[s]) {
            zmq_close(m->socks[s]);
            m->socks[s] = NULL;
        }
    }
    if (m->poll_items) {
        m->poll_items[poll_at(c, s)].socket = m->socks[s];
        m->poll_items[poll_at(c, s)].fd = -1; /* with no socket: ignored by the poll */
        if (psc_route_any(c) && s < c->nservers) {
            m->poll_items[c->nservers + 1 + s].socket = psc_route_watch_socket(c, s);
            m->poll_items[c->nservers + 1 + s].fd = -1;
        }
    }
}

static void close_sockets(ps_client *c)
{
    struct psc_comm *m = c->comm;
    if (!m->socks)
        return;
    for (int s = 0; s < m->nsocks; s++)
        if (m->socks[s]) {
            psc_route_unwatch(c, s, m->socks[s]);
            zmq_close(m->socks[s]);
        }
    free(m->socks);
    m->socks = NULL;
}

/* ---------- the loop ---------- */

/* Closing or interrupted: whatever is still queued, held or in flight
 * completes with PS_ECLOSED; payload frames still queued in ZeroMQ are
 * released (and their requests completed) when close_sockets discards them
 * (linger 0). */
static void fail_everything(ps_client *c)
{
    struct psc_comm *m = c->comm;
    const struct psc_slots *sl = c->slots;
    const char *why = psc_comm_interrupted(c)
                          ? "interrupted (ps_client_interrupt, e.g. by a signal)"
                          : "client closed";
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    while (m->qlen) {
        psc_op o = m->queue[m->qhead];
        m->qhead = (m->qhead + 1) % m->qcap;
        m->qlen--;
        pthread_mutex_unlock(&m->mu);
        psc_fail_unsent(c, &o);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    for (; m->held_len; m->held_len--, m->held_head = (m->held_head + 1) % m->held_cap)
        psc_fail_unsent(c, &m->held[m->held_head]);
    for (uint32_t i = 0; i < sl->n; i++)
        if (sl->sub[i].req) {
            psc_set_error(sl->sub[i].req, PS_ECLOSED, "%s while waiting for %s", why,
                          psc_slot_name(c, sl->sub[i].server));
            psc_slot_finish(c, i);
        }
}

static void *comm_main(void *arg)
{
    ps_client *c = arg;
    struct psc_comm *m = c->comm;
    int rc = open_sockets(c);
    pthread_mutex_lock(&m->mu);
    m->ready = 1;
    m->open_rc = rc;
    pthread_cond_broadcast(&m->ready_cv);
    pthread_mutex_unlock(&m->mu);
    if (rc) {
        close_sockets(c);
        return NULL;
    }
    /* the sockets, the eventfd, and with replicated groups their monitors
     * (slots added later go after them: grow_slots) */
    int n = c->nservers + 1 + (psc_route_any(c) ? c->nservers : 0);
    zmq_pollitem_t *items = calloc((size_t)n, sizeof *items);
    if (!items) {
        ps_error("libps: out of memory in the comm thread");
        pthread_mutex_lock(&m->mu);
        m->stopping = 1;
        pthread_mutex_unlock(&m->mu);
    }
    for (int s = 0; items && s < c->nservers; s++) {
        items[s].socket = m->socks[s];
        items[s].events = ZMQ_POLLIN;
    }
    if (items) {
        items[c->nservers].fd = m->efd;
        items[c->nservers].events = ZMQ_POLLIN;
    }
    for (int s = 0; items && psc_route_any(c) && s < c->nservers; s++) {
        items[c->nservers + 1 + s].socket = psc_route_watch_socket(c, s);
        items[c->nservers + 1 + s].fd = -1;
        items[c->nservers + 1 + s].events = ZMQ_POLLIN;
    }
    m->poll_items = items;
    m->npoll = items ? n : 0;
    int stop = items == NULL;
    while (!stop) {
        items = m->poll_items; /* an added server slot grows them */
        n = m->npoll;
        int64_t now = ps_now_ns();
        long timeout = psc_liveness_timeout_ms(c, now);
        long rt = psc_route_timeout_ms(c, now);
        if (rt >= 0 && (timeout < 0 || rt < timeout))
            timeout = rt;
        if (m->held_len) {
            /* a device copy is in flight: look again in 20 us, not 1 ms */
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            timeout = 0;
        }
        psc_liveness_wake_by(c, timeout < 0 ? INT64_MAX : now + (int64_t)timeout * 1000000LL);
        if (zmq_poll(items, n, timeout) < 0 && errno != EINTR) {
            ps_error("libps: zmq_poll failed: %s", zmq_strerror(errno));
            break;
        }
        if (items[c->nservers].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t rd = read(m->efd, &v, sizeof v);
            (void)rd;
        }
        size_t nb = take_queue(c, &stop);
        for (size_t k = 0; k < nb; k++) {
            if (stop)
                psc_fail_unsent(c, &m->batch[k]);
            else
                take_op(c, &m->batch[k]);
        }
        if (stop)
            break;
        release_held(c);
        for (int s = 0; s < m->nsocks; s++) /* the homes and the slots added */
            drain_socket(c, s);
        items = m->poll_items;
        now = ps_now_ns();
        for (uint32_t i = psc_resend_next(c, now, 0); i != PSC_NO_SLOT;
             i = psc_resend_next(c, now, i + 1))
            psc_resend(c, i);
        if (psc_heartbeat_due(c, now))
            psc_send_heartbeats(c);
        for (int s = psc_give_up_next(c, now, 0); s >= 0; s = psc_give_up_next(c, now, s + 1))
            socket_reset(c, s);
        for (int s = 0; psc_route_any(c) && s < c->nservers; s++) {
            /* a replicated group's member lost: its connection closed, or
             * silent past the failure timeout while requests wait */
            char why[96] = "";
            if ((items[c->nservers + 1 + s].revents & ZMQ_POLLIN) && psc_route_watch_read(c, s))
                snprintf(why, sizeof why, "its connection closed");
            else if (psc_lost(c, now, s))
                snprintf(why, sizeof why, "silent for %d ms", psc_route_failure_ms(c));
            if (why[0] && psc_route_lost(c, s, why, now))
                move_group(c, s, why);
            else if (psc_route_retry_due(c, s, now))
                hello_again(c, s);
        }
    }
    fail_everything(c);
    free(m->poll_items);
    m->poll_items = NULL;
    m->npoll = 0;
    close_sockets(c);
    return NULL;
}

/* ---------- start and stop (training thread) ---------- */

/* Free what psc_comm_start made, once the thread has ended or never ran:
 * terminating the context releases every zero-copy frame ZeroMQ still
 * holds, which completes the last requests (psc_release_cb). */
static void comm_free(ps_client *c)
{
    struct psc_comm *m = c->comm;
    if (m->zctx)
        zmq_ctx_term(m->zctx);
    if (m->efd >= 0)
        close(m->efd);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->ready_cv);
    free(m->queue);
    free(m->batch);
    free(m->held);
    free(m);
    c->comm = NULL;
}

int psc_comm_start(ps_client *c)
{
    struct psc_comm *m = calloc(1, sizeof *m);
    if (!m) {
        ps_errorf(c->last_error, sizeof c->last_error, "out of memory");
        return PS_ENOMEM;
    }
    c->comm = m;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->ready_cv, NULL);
    m->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    m->zctx = zmq_ctx_new();
    if (m->efd < 0 || !m->zctx) {
        ps_errorf(c->last_error, sizeof c->last_error,
                  "cannot create the wake-up eventfd or ZeroMQ context: %s", strerror(errno));
        comm_free(c);
        return PS_EIO;
    }
    if (pthread_create(&m->thread, NULL, comm_main, c) != 0) {
        ps_errorf(c->last_error, sizeof c->last_error, "cannot start the comm thread");
        comm_free(c);
        return PS_ENOMEM;
    }
    m->thread_started = 1;
    pthread_mutex_lock(&m->mu);
    while (!m->ready)
        pthread_cond_wait(&m->ready_cv, &m->mu);
    int rc = m->open_rc;
    pthread_mutex_unlock(&m->mu);
    if (rc) {
        pthread_join(m->thread, NULL);
        comm_free(c);
    }
    return rc;
}

void psc_comm_stop(ps_client *c)
{
    struct psc_comm *m = c->comm;
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_mutex_unlock(&m->mu);
    psc_kick(c);
    if (m->thread_started)
        pthread_join(m->thread, NULL);
    comm_free(c);
}
