/* libps: turning the comm thread's ops into messages, and sending them.
 *
 * Runs on the comm thread only (client_comm.c's loop calls it).  An op
 * becomes one message per chunk (or one control message), each in a slot.
 * Sending a sub-request is psc_sub_send: the header frame, then
 * send_payload, the one place a payload leaves this process (zero-copy from
 * the caller's buffer, or, with a narrower wire type, a converted copy); a
 * same-host data plane replaces that function.  Receiving the replies is
 * client_comm.c's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "client_comm_internal.h"
#include "client_moved.h"
#include "client_rejoin.h"
#include "client_route.h"
#include "client_requests.h"
#include "client_resend.h"
#include "client_shm.h"
#include "client_read.h"
#include "client_sparse.h"
#include "client_token.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* ---------- sending ---------- */

/* Send one frame without blocking (EINTR retried): 0, or -1 with errno. */
static int zsend(void *sock, const void *buf, size_t len, int flags)
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
    const psc_sub *s = &c->slots->sub[i];
    ps_header_init(h, s->type);
    h->seq = psc_slot_id(c, i);
    h->rank = c->opt.rank;
    h->key = s->key;
    h->chunk = s->chunk;
    ps_header_set_s(h, s->step); /* what `s` means for the type (ps_msg_table.h) */
    int grad = s->type == PS_MSG_PUSH || s->type == PS_MSG_PUSHPULL;
    h->npush = grad ? s->npush : 0;
    if (ps_msg_request_has_payload(s->type)) {
        h->count = s->count;
        /* gradients in the wire type; weights, state and collectives stay exact */
        h->dtype = grad ? c->wire_dtype : PS_DTYPE_F32;
    }
    if (s->type == PS_MSG_INIT)
        h->total = s->total;
    /* a table's partition away from its home names the home */
    if (s->obj_kind == PSC_OBJ_PART && s->server != s->home) {
        h->flags |= PS_FLAG_AWAY;
        h->home = s->home;
    }
    if (s->type == PS_MSG_HELLO || s->type == PS_MSG_HYPER) {
        h->hello = c->hello_req;
        h->hello.server_rank = s->server;
        if (s->server >= c->nservers) /* no arena offered to a slot added while training */
            h->hello.shm_name[0] = 0;
        if (s->type == PS_MSG_HYPER) {
            h->hello.opt = c->hyper;
            h->key = c->hyper_key;
        }
    }
    for (size_t t = 0; s->type == PS_MSG_TABLE && t < c->ntables; t++)
        if (c->tables[t].key == s->key) {
            h->table = c->tables[t].opts;
            memcpy(h->table_name, c->tables[t].name, sizeof h->table_name);
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
    const psc_sub *s = &c->slots->sub[i];
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

/* The gradient of push sub-request i holds NaN or Inf, or values its wire
 * type makes Inf (float16 above 65504)?  With --on-nonfinite refuse it is
 * not sent: the request fails here with PS_ENONFINITE naming the step, so
 * the worker sees which step made it (a server would refuse it anyway);
 * otherwise it goes, said at most once in NONFINITE_SAY_NS.  0: send it. */
#define NONFINITE_SAY_NS (10LL * 1000000000LL)
static int nonfinite_refused(ps_client *c, const psc_sub *s, int in_arena)
{
    if (s->type != PS_MSG_PUSH && s->type != PS_MSG_PUSHPULL)
        return 0;
    uint32_t dt = in_arena ? PS_DTYPE_F32 : c->wire_dtype;
    size_t first = 0, bad = ps_dtype_nonfinite(dt, s->src, s->count, &first);
    if (!bad)
        return 0;
    float v = s->src[first];
    char what[200];
    snprintf(what, sizeof what, "push of step %lld to key %llu chunk %u: %zu of %zu values %s "
             "(element %zu is %g)", (long long)s->step, (unsigned long long)s->key, s->chunk,
             bad, s->count, isfinite(v) ? "overflow the wire type float16 (largest 65504)"
                                        : "are not finite", first, (double)v);
    int mode = c->opt.on_nonfinite;
    if (mode == PS_NONFINITE_REFUSE) {
        psc_set_error(s->req, PS_ENONFINITE, "%s; not sent (--on-nonfinite refuse)", what);
        return 1;
    }
    struct psc_comm *m = c->comm;
    int64_t now = ps_now_ns();
    if (now - m->nonfinite_said_ns < NONFINITE_SAY_NS) {
        m->nonfinite_unsaid++;
        return 0;
    }
    ps_warn("libps: %s; sent as %s (--on-nonfinite %s)%s", what, ps_dtype_name(dt),
            mode == PS_NONFINITE_SKIP ? "skip" : "apply",
            m->nonfinite_unsaid ? " (and more since the last such line)" : "");
    m->nonfinite_said_ns = now;
    m->nonfinite_unsaid = 0;
    return 0;
}

/* Send sub-request i (first time or again).  The caller has already counted
 * the payload's release in its request's pending.  0 when it went (or waits
 * for a connection to resend on); otherwise the sub-request is finished with
 * the error, which is returned. */
int psc_sub_send(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->slots->sub[i];
    ps_request *r = s->req;
    ps_header h;
    /* a replicated group between members, or a server slot added while
     * training that has not taken our hello yet: it waits for the hello */
    int joining = s->server >= c->nservers && psc_slot_state(c, s->server) == PSC_SLOT_JOINING;
    if (s->type != PS_MSG_HELLO && (joining || psc_route_moving(c, s->server))) {
        int to = s->server, rc = joining ? psc_join_send(c, to) : 0;
        s = &c->slots->sub[i]; /* the hello's slot may have moved the table */
        if (rc == 0 && psc_rejoin_park(c, i) == 0) {
            if (ps_msg_request_has_payload(s->type))
                psc_part_done(c, r); /* no frame holds the buffer: its release is now */
            return 0;
        }
        if (joining) {
            if (ps_msg_request_has_payload(s->type))
                psc_part_done(c, r); /* no frame was made: count its release now */
            psc_set_error(r, PS_EIO, "%s (server slot %d, added while training) did not take "
                          "this worker's hello; its %s cannot go", psc_slot_name(c, to), to,
                          ps_msg_type_name(s->type));
            psc_slot_finish(c, i);
            return PS_EIO;
        }
    }
    fill_header(c, i, &h);
    int payload = ps_msg_request_has_payload(s->type);
    /* a table's request: its frames are made anew for every send */
    zmq_msg_t sf[3];
    int nsf = 0;
    if ((s->sp && !psc_sparse_shm(c, i, &h) &&
         psc_sparse_frames(c, i, &h, c->wire_dtype, sf, &nsf) != 0) ||
        (!s->sp && psc_read_frames(c, i, &h, sf, &nsf) != 0)) {
        psc_set_error(r, PS_ENOMEM, "%s: out of memory building a %s",
                      psc_slot_name(c, s->server), ps_msg_type_name(s->type));
        psc_slot_finish(c, i);
        return PS_ENOMEM;
    }
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
    if (nonfinite_refused(c, s, (h.flags & PS_FLAG_SHM) != 0)) {
        if (payload)
            psc_part_done(c, r); /* no frame was made: count its release now */
        psc_slot_finish(c, i);
        return PS_ENONFINITE;
    }
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    void *sock = c->comm->socks[s->server];
    int err = 0, zerr = 0;
    int lost = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0) {
        err = PS_EPROTO;
    } else if (zsend(sock, buf, len, payload || nsf ? ZMQ_SNDMORE : 0) < 0) {
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
    for (int k = 0; k < nsf; k++) {
        while (!err && zmq_msg_send(&sf[k], sock, ZMQ_DONTWAIT | (k + 1 < nsf ? ZMQ_SNDMORE : 0)) < 0) {
            if (errno == EINTR)
                continue;
            err = PS_EIO;
            zerr = errno;
        }
        zmq_msg_close(&sf[k]);
    }
    if (err && lost) {
        ps_debug("libps: %s has no connection for %s (refused?); waiting to resend",
                 psc_slot_name(c, s->server), ps_msg_type_name(s->type));
    } else if (err) {
        psc_set_error(r, err, "%s: cannot send %s: %s%s", psc_slot_name(c, s->server),
                      ps_msg_type_name(s->type),
                      err == PS_EIO ? zmq_strerror(zerr) : ps_strerror(err),
                      err == PS_EIO && zerr == EAGAIN
                          ? " (no connection: did the server refuse this worker's CURVE key?)"
                          : "");
        psc_slot_finish(c, i);
        return err;
    }
    psc_resend_arm(c, i, ps_now_ns());
    return 0;
}

/* Send sub-request i again (a resend, or one parked until its server took
 * us back): its payload frame is one more release to wait for. */
void psc_resend(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->slots->sub[i];
    if (ps_msg_request_has_payload(s->type))
        __atomic_add_fetch(&s->req->_priv.pending, 1, __ATOMIC_ACQ_REL);
    psc_sub_send(c, i);
}

/* A heartbeat to every server, fire-and-forget: no slot, no resend, its
 * reply is dropped. */
void psc_send_heartbeats(ps_client *c)
{
    ps_header h;
    ps_header_init(&h, PS_MSG_HEARTBEAT);
    h.seq = HEARTBEAT_SEQ;
    h.rank = c->opt.rank;
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0)
        return;
    /* the homes and the added slots that took our hello; not one that left */
    for (int s = 0; s < psc_nslots(c); s++)
        if (c->comm->socks[s] && psc_slot_state(c, s) == PSC_SLOT_LIVE)
            zsend(c->comm->socks[s], buf, len, 0); /* queued while a server is away; fine */
}

int psc_join_send(ps_client *c, int slot)
{
    if (psc_rejoin_slot(c, slot) != PSC_NO_SLOT)
        return 0; /* on its way */
    uint32_t i = psc_rejoin_hello(c, slot, NULL);
    if (i == PSC_NO_SLOT)
        return -1;
    if (psc_sub_send(c, i) != 0) {
        psc_rejoin_unsent(c, slot);
        return -1;
    }
    return 0;
}

/* Cancel: fail every sub-request of o->req with o->code. */
static void do_cancel(ps_client *c, const psc_op *o)
{
    const struct psc_slots *sl = c->slots;
    for (uint32_t i = 0; i < sl->n; i++)
        if (sl->sub[i].req == o->req) {
            psc_set_error(o->req, o->code, "%s: %s", psc_slot_name(c, sl->sub[i].server),
                          ps_strerror(o->code));
            psc_slot_finish(c, i);
        }
}

/* A slot for one message of op o to `server`, with o's request, type, step,
 * gradient count and reply destination.  PSC_NO_SLOT when out of memory:
 * the request has the error, and the parts this message would have
 * completed (its reply, its payload's release) are done. */
static uint32_t op_slot(ps_client *c, const psc_op *o, int server)
{
    uint32_t i = psc_slot_new(c, server, o->type, o->req);
    if (i == PSC_NO_SLOT) {
        psc_set_error(o->req, PS_ENOMEM, "out of memory for request slots");
        psc_part_done(c, o->req);
        if (ps_msg_request_has_payload(o->type))
            psc_part_done(c, o->req);
        return i;
    }
    psc_sub *s = &c->slots->sub[i];
    s->step = o->step;
    s->npush = o->npush > 1 ? (uint32_t)o->npush : 1;
    s->out = o->out;
    return i;
}

/* An op that will never be sent completes at once (a cancel has nothing to
 * complete). */
void psc_fail_unsent(ps_client *c, const psc_op *o)
{
    if (o->type != PSC_OP_CANCEL)
        psc_req_unsent(c, o->req);
}

/* A table's request: one message per partition it goes to (client_sparse.c),
 * each a part of the request; the poster counted one part, which the split
 * takes over. */
static void do_sparse(ps_client *c, const psc_op *o)
{
    ps_request *r = o->req;
    uint32_t *slots;
    long n = psc_sparse_begin(c, o->type, o->tensor, r, o->ids, o->nids, o->src, o->ids2,
                              o->nids2, o->dst, o->step, o->npush > 1 ? (uint32_t)o->npush : 1,
                              &slots);
    if (n > 0)
        __atomic_add_fetch(&r->_priv.pending, (int)n, __ATOMIC_ACQ_REL);
    for (long k = 0; k < n; k++)
        psc_sub_send(c, slots[k]);
    psc_part_done(c, r);
}

/* A lookup: one message per partition it reads (client_read.c), as a
 * table's request. */
static void do_lookup(ps_client *c, const psc_op *o)
{
    ps_request *r = o->req;
    size_t np = psc_lookup_max_slots(c, o);
    uint32_t *slots = malloc((np ? np : 1) * sizeof *slots);
    long n = -1;
    if (slots) {
        n = psc_lookup_begin(c, o, slots);
    } else {
        free(o->out);
        psc_set_error(r, PS_ENOMEM, "out of memory splitting a lookup");
    }
    if (n > 0)
        __atomic_add_fetch(&r->_priv.pending, (int)n, __ATOMIC_ACQ_REL);
    for (long k = 0; k < n; k++)
        psc_sub_send(c, slots[k]);
    free(slots);
    psc_part_done(c, r);
}

/* What every server holding state must hear (client_comm_internal.h): the
 * calls that post it to each listed server (0 to nservers - 1) reach the
 * slots added while training through server 0's message (to_added_slots),
 * and skip those that left. */
int psc_to_every_server(uint32_t type)
{
    return type == PS_MSG_LEAVE || type == PS_MSG_HYPER || type == PS_MSG_SHUTDOWN ||
           type == PS_MSG_JOIN;
}

/* Op o (to server 0) also to every added slot that is live or joining, as
 * more parts of the same request (their replies' out not kept). */
static void to_added_slots(ps_client *c, const psc_op *o)
{
    psc_op to = *o;
    to.out = NULL;
    for (int sv = c->nservers; sv < psc_nslots(c); sv++) {
        int st = psc_slot_state(c, sv);
        if (st != PSC_SLOT_LIVE && st != PSC_SLOT_JOINING)
            continue;
        __atomic_add_fetch(&o->req->_priv.pending, 1, __ATOMIC_ACQ_REL);
        uint32_t i = op_slot(c, &to, sv);
        if (i != PSC_NO_SLOT)
            psc_sub_send(c, i);
    }
}

/* Turn one posted operation into messages.  The poster set the request's
 * pending to the number of messages (plus one per payload frame). */
void psc_do_op(ps_client *c, const psc_op *o)
{
    if (o->type == PSC_OP_CANCEL) {
        do_cancel(c, o);
        return;
    }
    if (o->type == PS_MSG_LOOKUP) {
        do_lookup(c, o);
        return;
    }
    if (ps_msg_is_sparse(o->type)) {
        do_sparse(c, o);
        return;
    }
    /* a table's clock: every partition of every server (the request takes
     * the smallest answer, as a tensor's over its chunks) */
    if (o->type == PS_MSG_CLOCK && o->table) {
        uint32_t flat = 0; /* the homes' partitions, each where it is now */
        for (int sv = 0; sv < c->nservers; sv++)
            for (uint32_t p = 0, i; p < c->server_parts[sv]; p++, flat++)
                if ((i = op_slot(c, o, psc_route_obj(c, PSC_OBJ_PART, o->tensor, flat, sv))) !=
                    PSC_NO_SLOT) {
                    psc_sub *s = &c->slots->sub[i];
                    s->key = c->tables[o->tensor].key;
                    s->chunk = p;
                    s->obj_kind = PSC_OBJ_PART;
                    s->home = sv;
                    s->obj = flat;
                    s->obj_table = o->tensor;
                    psc_sub_send(c, i);
                }
        return;
    }
    /* a message per chunk for the types that name one (init, push, pull ...) */
    if ((ps_msg_info_of(o->type)->req_keys & PS_HK(C)) && o->server < 0) {
        const ps_placement *p = &c->place;
        size_t planes = o->planes > 1 ? (size_t)o->planes : 1;
        size_t first = p->first_chunk[o->tensor], n = p->tensor_chunks[o->tensor];
        for (size_t k = 0; k < n; k++) {
            const ps_chunk_place *cp = &p->chunks[first + k];
            uint32_t obj = (uint32_t)(first + k);
            uint32_t i = op_slot(c, o, psc_route_obj(c, PSC_OBJ_CHUNK, 0, obj, cp->server));
            if (i == PSC_NO_SLOT)
                continue;
            psc_sub *s = &c->slots->sub[i];
            s->obj_kind = PSC_OBJ_CHUNK;
            s->home = cp->server;
            s->obj = obj;
            s->key = cp->key;
            s->chunk = cp->chunk;
            s->count = cp->count * planes;
            s->total = c->specs[o->tensor].count;
            s->src = o->src ? o->src + cp->offset * planes : NULL;
            s->dst = o->dst ? o->dst + cp->offset * planes : NULL;
            psc_sub_send(c, i);
        }
        return;
    }
    /* control message to one server (a TABLE names its table) */
    int st = psc_slot_state(c, o->server);
    if (st == PSC_SLOT_UNKNOWN || (st == PSC_SLOT_REMOVED && !psc_to_every_server(o->type))) {
        psc_set_error(o->req, PS_EINVAL, "no server slot %d%s: a %s goes to the servers listed "
                      "at open (0 to %d) or to one added while training", o->server,
                      st == PSC_SLOT_REMOVED ? " (it left the job)" : "",
                      ps_msg_type_name(o->type), c->nservers - 1);
        psc_req_unsent(c, o->req);
        return;
    }
    if (st == PSC_SLOT_REMOVED) { /* it left the job: nothing to tell it */
        psc_part_done(c, o->req); /* its one part (none of these has a payload) */
        return;
    }
    if (o->server == 0 && c->moved_any && psc_to_every_server(o->type))
        to_added_slots(c, o);
    uint32_t i = op_slot(c, o, o->server);
    if (i == PSC_NO_SLOT)
        return;
    if (o->type == PS_MSG_TABLE)
        c->slots->sub[i].key = c->tables[o->tensor].key;
    /* a collective's payload, both ways */
    c->slots->sub[i].src = o->src;
    c->slots->sub[i].dst = o->dst;
    c->slots->sub[i].count = o->count;
    psc_sub_send(c, i);
}

