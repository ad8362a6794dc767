/* Replicas: the primary's stream to its group's members and the replies
 * held until they acknowledged it; the DEALERs it goes on; the figures of
 * each member's lag (server/repl.h has the contract, repl_internal.h what
 * the replicas' files share). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "repl_internal.h"
#include "server_internal.h"
#include "zmsg.h"

static int mutation(uint32_t t)
{
    return t == PS_MSG_INIT || t == PS_MSG_PUSH || t == PS_MSG_PUSHPULL || t == PS_MSG_ASSIGN ||
           t == PS_MSG_SETSTATE || t == PS_MSG_SPUSH || t == PS_MSG_SPUSHPULL ||
           t == PS_MSG_SASSIGN;
}

/* ---------------------------------------------------------------- sockets */

static int set_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

/* A DEALER of ours to member `slot` (the stream, or a join), routed as
 * "psrepl-G-ME-INC-N": a reconnect keeps its identity, and each socket has
 * its own (a ROUTER ignores a second peer with an identity in use, taking
 * its first frame for the identity when it tries again: a new stream on
 * the old one's identity could lose its first messages). */
void *repl_dealer(ps_repl *r, int slot, char *why, size_t why_len)
{
    void *d = zmq_socket(r->s->ctx, ZMQ_DEALER);
    if (!d) {
        ps_errorf(why, why_len, "cannot create a socket: %s", zmq_strerror(errno));
        return NULL;
    }
    char id[64];
    int n = snprintf(id, sizeof id, "psrepl-%d-%d-%" PRIx64 "-%" PRIu64, r->g, r->me, r->inc,
                     ++r->dealers_made);
    int64_t maxmsg = (int64_t)PS_MAX_PAYLOAD_BYTES + PS_HEADER_MAX;
    if (set_int(d, ZMQ_LINGER, 0) || set_int(d, ZMQ_SNDHWM, 0) || set_int(d, ZMQ_RCVHWM, 0) ||
        zmq_setsockopt(d, ZMQ_ROUTING_ID, id, (size_t)n) ||
        zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        ps_errorf(why, why_len, "cannot set up a socket: %s", zmq_strerror(errno));
        zmq_close(d);
        return NULL;
    }
    if (r->s->curve_dir) {
        /* members of a group share its server key: each authorises it */
        char key[32], msg[512];
        snprintf(key, sizeof key, "server-%d", r->g);
        int rc = ps_curve_client_setup_key(d, r->s->curve_dir, key, r->g, msg, sizeof msg);
        if (rc) {
            ps_errorf(why, why_len, "CURVE to member %d: %s", slot, msg);
            zmq_close(d);
            return NULL;
        }
    }
    if (zmq_connect(d, r->m[slot].ep) != 0) {
        ps_errorf(why, why_len, "cannot connect to member %d at %s: %s", slot, r->m[slot].ep,
                  zmq_strerror(errno));
        zmq_close(d);
        return NULL;
    }
    return d;
}

/* Send header h and the frames (copied: shared, not duplicated) on d. */
void repl_send(void *d, const ps_header *h, const zmq_msg_t *frames, int nframes)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("replicas: cannot encode a %s", ps_msg_type_name(h->type));
        return;
    }
    if (zmq_send(d, buf, len, ZMQ_DONTWAIT | (nframes ? ZMQ_SNDMORE : 0)) < 0)
        return;
    for (int i = 0; i < nframes; i++) {
        zmq_msg_t c;
        zmq_msg_init(&c);
        zmq_msg_copy(&c, (zmq_msg_t *)&frames[i]);
        if (zmq_msg_send(&c, d, ZMQ_DONTWAIT | (i + 1 < nframes ? ZMQ_SNDMORE : 0)) < 0)
            zmq_msg_close(&c);
    }
}

void repl_close_member(ps_repl *r, int slot)
{
    repl_member *m = &r->m[slot];
    if (m->dealer)
        zmq_close(m->dealer);
    m->dealer = NULL;
    m->in_cfg = 0;
    m->joining = 0;
    m->asked = 0;
}

/* The primary's hello to member slot: the stream on this connection is ours
 * from now on. */
void repl_send_hello(ps_repl *r, int slot)
{
    ps_header h;
    ps_header_init(&h, PS_MSG_REPL_HELLO);
    h.rank = -1;
    h.epoch = r->cfg.epoch;
    h.member = r->me;
    h.stream_pos = r->rseq; /* its stream on this connection starts after it */
    h.hello = srv_my_hello(r->s);
    repl_send(r->m[slot].dealer, &h, NULL, 0);
}

/* Open the stream to member slot (a member of the configuration, or a
 * replacement that joins). */
int repl_open_member(ps_repl *r, int slot, int joining, int64_t now)
{
    repl_member *m = &r->m[slot];
    char why[512];
    if (!m->dealer && !(m->dealer = repl_dealer(r, slot, why, sizeof why))) {
        ps_error("replicas: %s", why);
        return PS_EIO;
    }
    m->joining = joining;
    m->in_cfg = !joining;
    m->since_ns = now;
    m->heard_ns = 0;
    m->sent = m->acked = 0;
    m->acked_upto = r->rseq; /* it takes the stream from here */
    m->asked = 0;
    repl_send_hello(r, slot);
    return 0;
}

/* ---------------------------------------------------------------- held replies */

static held *held_at(ps_repl *r, uint64_t q)
{
    if (!r->cap || q < r->base || q > r->rseq)
        return NULL;
    held *e = &r->ring[q & (r->cap - 1)];
    return e->rseq == q ? e : NULL;
}

/* A new entry for q = r->rseq (the newest); NULL when out of memory. */
static held *held_new(ps_repl *r, uint64_t q)
{
    if (r->nheld == 0)
        r->base = q;
    if (q - r->base >= r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 1024;
        while (q - r->base >= ncap)
            ncap *= 2;
        held *n = calloc(ncap, sizeof *n);
        if (!n)
            return NULL;
        for (size_t i = 0; i < r->cap; i++)
            if (r->ring[i].rseq)
                n[r->ring[i].rseq & (ncap - 1)] = r->ring[i];
        free(r->ring);
        r->ring = n;
        r->cap = ncap;
    }
    held *e = &r->ring[q & (r->cap - 1)];
    memset(e, 0, sizeof *e);
    e->rseq = q;
    r->nheld++;
    return e;
}

static void held_free(ps_repl *r, held *e, int send)
{
    if (send && e->have)
        srv_reply_out(r->s, e->tag, e->version, e->f, e->nf);
    ps_zmsg_close_all(e->f, e->have ? e->nf : 0);
    e->rseq = 0;
    e->have = 0;
    r->nheld--;
    while (r->nheld && r->base <= r->rseq && r->ring[r->base & (r->cap - 1)].rseq != r->base)
        r->base++;
}

/* Member slot acknowledged q. */
void repl_held_ack(ps_repl *r, uint64_t q, int slot)
{
    held *e = held_at(r, q);
    if (!e || !(e->need & (1u << slot)))
        return;
    e->need &= ~(1u << slot);
    r->m[slot].acked++;
    if (!e->need && e->have)
        held_free(r, e, 1);
}

void repl_held_ack_upto(ps_repl *r, uint64_t q, int slot)
{
    repl_member *m = &r->m[slot];
    uint64_t from = m->acked_upto + 1 > r->base ? m->acked_upto + 1 : r->base;
    if (q > r->rseq)
        q = r->rseq;
    for (uint64_t k = from; k <= q && r->nheld; k++)
        repl_held_ack(r, k, slot);
    if (q > m->acked_upto)
        m->acked_upto = q;
    repl_waited_release(r, 0, 0);
}

static unsigned need_mask(const ps_repl *r);

static int waited_done(const ps_repl *r, const waited *w)
{
    for (int k = 0; k < r->n; k++)
        if ((w->need & (1u << k)) && r->m[k].in_cfg && r->m[k].dealer &&
            r->m[k].acked_upto < w->upto)
            return 0;
    return 1;
}

void repl_waited_release(ps_repl *r, int64_t now, int64_t late_ns)
{
    while (r->wq_head && waited_done(r, r->wq_head)) {
        waited *w = r->wq_head;
        r->wq_head = w->next;
        if (!r->wq_head)
            r->wq_tail = NULL;
        srv_reply_out(r->s, w->tag, w->version, w->f, w->nf);
        free(w);
    }
    waited *w = r->wq_head;
    if (!w || !late_ns || now - w->t0 <= late_ns)
        return;
    for (int k = 0; k < r->n; k++)
        if ((w->need & (1u << k)) && r->m[k].in_cfg && r->m[k].acked_upto < w->upto &&
            r->m[k].heard_ns > w->t0) {
            char why[160];
            snprintf(why, sizeof why, "stream message %llu unacknowledged for %.1f s while it "
                     "answers others", (unsigned long long)r->m[k].acked_upto + 1,
                     (double)(now - w->t0) * 1e-9);
            repl_remove(r, k, why, now);
        }
}

static void waited_drop_all(ps_repl *r)
{
    while (r->wq_head) {
        waited *w = r->wq_head;
        r->wq_head = w->next;
        ps_zmsg_close_all(w->f, w->nf);
        free(w);
    }
    r->wq_tail = NULL;
}

/* Sync mode: a reply of an update thread may show a round that pushes of
 * other workers closed; it goes once the members hold every message
 * forwarded so far (so a worker never sees a round the next primary could
 * lack). 1: held (moved); 0: send it now. */
static int waited_hold(ps_repl *r, uint64_t rseq, int tag, int64_t version, zmq_msg_t *f,
                       int nf)
{
    held *e = rseq ? held_at(r, rseq) : NULL;
    if (e)
        held_free(r, e, 0); /* what it waited for is part of this */
    waited w0 = {.upto = r->rseq, .need = need_mask(r)};
    if (!w0.need || (!r->wq_head && waited_done(r, &w0)))
        return 0;
    waited *w = malloc(sizeof *w);
    if (!w) {
        r->unheld++;
        return 0;
    }
    *w = w0;
    for (int k = 0; k < nf && k < 3; k++) {
        zmq_msg_init(&w->f[k]);
        zmq_msg_move(&w->f[k], &f[k]);
    }
    w->nf = nf < 3 ? nf : 3;
    w->tag = tag;
    w->version = version;
    w->t0 = ps_now_ns();
    if (r->wq_tail)
        r->wq_tail->next = w;
    else
        r->wq_head = w;
    r->wq_tail = w;
    return 1;
}

/* Member slot is no longer waited for: what waited only for it goes out. */
void repl_held_drop_member(ps_repl *r, int slot)
{
    for (size_t i = 0; i < r->cap; i++) {
        held *e = &r->ring[i];
        if (!e->rseq || !(e->need & (1u << slot)))
            continue;
        e->need &= ~(1u << slot);
        if (!e->need && e->have)
            held_free(r, e, 1);
    }
    for (waited *w = r->wq_head; w; w = w->next)
        w->need &= ~(1u << slot);
    repl_waited_release(r, 0, 0);
}

/* Everything held is dropped (not sent): the workers resend to the next
 * primary. */
void repl_held_drop_all(ps_repl *r)
{
    for (size_t i = 0; i < r->cap; i++)
        if (r->ring[i].rseq)
            held_free(r, &r->ring[i], 0);
    waited_drop_all(r);
}

/* The members a new message waits for: those of the configuration (not a
 * replacement still catching up). */
static unsigned need_mask(const ps_repl *r)
{
    unsigned need = 0;
    for (int k = 0; k < r->n; k++)
        if (k != r->me && r->m[k].in_cfg && r->m[k].dealer)
            need |= 1u << k;
    return need;
}

static int has_targets(const ps_repl *r)
{
    for (int k = 0; k < r->n; k++)
        if (k != r->me && r->m[k].dealer && (r->m[k].in_cfg || r->m[k].joining))
            return 1;
    return 0;
}

int ps_repl_hold(ps_repl *r, uint64_t rseq, int tag, int64_t version, zmq_msg_t *f, int nf)
{
    if (!r)
        return 0;
    if (r->role == PS_REPL_PRIMARY && r->s->cfg.mode == PS_MODE_SYNC)
        return waited_hold(r, rseq, tag, version, f, nf);
    if (!rseq)
        return 0;
    if (r->role != PS_REPL_PRIMARY) {
        /* a member's own reply to the primary's stream: acknowledged when it
         * came (ps_repl_flush_acks); a refusal says this member differs */
        ps_header h;
        if (nf >= 2 && ps_proto_decode(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), &h, NULL, 0) == 0 &&
            h.type == PS_MSG_ERROR) {
            r->member_errors++;
            if (ps_rlimit_allow(&r->rl))
                ps_warn("replicas: message %llu of the primary's stream was refused here: %s "
                        "(%llu so far): this member may differ from its primary",
                        (unsigned long long)rseq, h.err_text,
                        (unsigned long long)r->member_errors);
        }
        ps_zmsg_close_all(f, nf);
        return 1;
    }
    held *e = held_at(r, rseq);
    if (!e)
        return 0;
    if (!e->need) {
        held_free(r, e, 0);
        return 0;
    }
    for (int k = 0; k < nf && k < 3; k++) {
        zmq_msg_init(&e->f[k]);
        zmq_msg_move(&e->f[k], &f[k]);
    }
    e->nf = nf < 3 ? nf : 3;
    e->have = 1;
    e->tag = tag;
    e->version = version;
    return 1;
}

int ps_repl_hold_io(ps_repl *r, uint64_t rseq, zmq_msg_t *id, const ps_header *h)
{
    if (!r || !held_at(r, rseq))
        return 0;
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0)
        return 0;
    zmq_msg_t f[2];
    zmq_msg_init(&f[0]);
    zmq_msg_move(&f[0], id);
    zmq_msg_init_size(&f[1], len);
    memcpy(zmq_msg_data(&f[1]), buf, len);
    if (ps_repl_hold(r, rseq, PS_OUT_REPLY, 0, f, 2))
        return 1;
    zmq_msg_move(id, &f[0]); /* not held: the caller sends it */
    ps_zmsg_close_all(f, 2);
    return 0;
}

/* ---------------------------------------------------------------- the stream */

/* Send fh and its frames to every member that takes the stream; with wait,
 * a new entry waits for those of the configuration.  The stream number
 * (the owner's command carries it: a replacement's snapshot says up to
 * where it holds the stream, and the reply's tag names the entry, if any). */
static uint64_t stream_out(ps_repl *r, ps_header *fh, const zmq_msg_t *frames, int nframes,
                           int wait)
{
    uint64_t q = ++r->rseq;
    fh->seq = q;
    fh->flags = (fh->flags & ~(PS_FLAG_SHM | PS_FLAG_REPLY)) | PS_FLAG_REPL;
    fh->epoch = r->cfg.epoch;
    fh->member = r->me;
    fh->shm_off = fh->shm_dst = 0;
    for (int k = 0; k < r->n; k++) {
        repl_member *m = &r->m[k];
        if (k == r->me || !m->dealer || !(m->in_cfg || m->joining))
            continue;
        repl_send(m->dealer, fh, frames, nframes);
        m->sent++;
    }
    unsigned need = wait ? need_mask(r) : 0;
    if (!need)
        return q;
    held *e = held_new(r, q);
    if (!e) {
        /* not held: the reply goes at once; counted so an operator sees it */
        r->unheld++;
        if (ps_rlimit_allow(&r->rl))
            ps_error("replicas: out of memory holding a reply for the members (%llu so far): "
                     "it goes before they acknowledge it", (unsigned long long)r->unheld);
        return q;
    }
    e->need = need;
    e->t0 = ps_now_ns();
    return q;
}

uint64_t ps_repl_forward(ps_repl *r, const zmq_msg_t *f, int nf, const ps_header *h,
                         const void *arena_bytes)
{
    if (r && (h->flags & PS_FLAG_REPL) && r->role != PS_REPL_PRIMARY)
        return h->seq; /* a member applies the stream: its own reply is not sent */
    if (!r || r->role != PS_REPL_PRIMARY || !mutation(h->type) || !has_targets(r))
        return 0;
    ps_header fh = *h;
    zmq_msg_t fr[3];
    int nfr = 0;
    int sparse = ps_msg_is_sparse(h->type);
    if (h->type == PS_MSG_PUSHPULL) /* the push is what changes the state */
        fh.type = PS_MSG_PUSH;
    if (h->type == PS_MSG_SPUSHPULL) {
        fh.type = PS_MSG_SPUSH;
        fh.npull = 0;
    }
    if (arena_bytes) {
        /* same host: the bytes are in the worker's arena; the members get
         * them as frames (float32: what an arena holds) */
        size_t sizes[2] = {0, 0};
        int k = 0;
        if (sparse) {
            sizes[k++] = 8 * (size_t)h->count;
            sizes[k++] = (size_t)h->count * h->dim * sizeof(float);
        } else {
            sizes[k++] = (size_t)h->count * sizeof(float);
        }
        const char *p = arena_bytes;
        for (int i = 0; i < k; i++) {
            if (zmq_msg_init_size(&fr[i], sizes[i]) != 0) {
                ps_zmsg_close_all(fr, i);
                ps_error("replicas: out of memory copying a request out of shared memory");
                return 0;
            }
            memcpy(zmq_msg_data(&fr[i]), p, sizes[i]);
            p += sizes[i];
        }
        nfr = k;
    } else {
        int want = sparse ? 2 : 1; /* a sparse pushpull's third frame is its pull */
        for (int i = 0; i < want && 2 + i < nf; i++) {
            zmq_msg_init(&fr[i]);
            zmq_msg_copy(&fr[i], (zmq_msg_t *)&f[2 + i]);
            nfr++;
        }
    }
    uint64_t q = stream_out(r, &fh, fr, nfr, 1);
    ps_zmsg_close_all(fr, nfr);
    return q;
}

uint64_t ps_repl_forward_io(ps_repl *r, const ps_header *h)
{
    if (!r || r->role != PS_REPL_PRIMARY || !has_targets(r))
        return 0;
    ps_header fh = *h;
    return stream_out(r, &fh, NULL, 0, 1);
}

void ps_repl_forward_live(ps_repl *r, int rank, int live)
{
    if (!r || r->role != PS_REPL_PRIMARY || !has_targets(r))
        return;
    ps_header fh;
    ps_header_init(&fh, PS_MSG_REPL_LIVE);
    fh.rank = -1;
    fh.key = (uint64_t)rank;
    fh.chunk = (uint32_t)live;
    stream_out(r, &fh, NULL, 0, 0);
}

void ps_repl_forward_join(ps_repl *r, int rank, int64_t step)
{
    if (!r || r->role != PS_REPL_PRIMARY || !has_targets(r))
        return;
    ps_header fh;
    ps_header_init(&fh, PS_MSG_REPL_LIVE);
    fh.rank = -1;
    fh.key = (uint64_t)rank;
    fh.chunk = 3;
    fh.push_step = step;
    stream_out(r, &fh, NULL, 0, 0);
}

/* ---------------------------------------------------------------- what operators see */

int64_t ps_repl_lag(const ps_repl *r, int m, int64_t now, int64_t *oldest_ns)
{
    *oldest_ns = 0;
    if (!r || r->role != PS_REPL_PRIMARY || m < 0 || m >= r->n || m == r->me ||
        !r->m[m].dealer)
        return -1;
    /* the stream messages it has not acknowledged, and since when the
     * oldest reply waits for it */
    const repl_member *mm = &r->m[m];
    int64_t oldest = 0, lag = r->rseq > mm->acked_upto ? (int64_t)(r->rseq - mm->acked_upto) : 0;
    for (size_t i = 0; lag && i < r->cap; i++) {
        const held *e = &r->ring[i];
        if (e->rseq && (e->need & (1u << m)) && (!oldest || e->t0 < oldest))
            oldest = e->t0;
    }
    for (const waited *w = r->wq_head; lag && w; w = w->next)
        if ((w->need & (1u << m)) && mm->acked_upto < w->upto && (!oldest || w->t0 < oldest))
            oldest = w->t0;
    *oldest_ns = oldest ? now - oldest : 0;
    return lag;
}

void ps_repl_stats(const ps_repl *r, uint64_t *epoch, uint64_t *lag)
{
    *epoch = *lag = 0;
    if (!r)
        return;
    *epoch = r->cfg.epoch;
    int64_t now = ps_now_ns(), old;
    for (int k = 0; k < r->n; k++) {
        int64_t l = ps_repl_lag(r, k, now, &old);
        if (l > (int64_t)*lag)
            *lag = (uint64_t)l;
    }
}

void ps_repl_figures(const ps_repl *r, ps_srv_io_figures *f)
{
    for (int k = 0; k < 3; k++)
        f->repl_lag[k] = -1;
    if (!r)
        return;
    int64_t now = ps_now_ns();
    f->repl_role = r->role;
    f->repl_epoch = r->cfg.epoch;
    f->repl_promotions = r->promotions;
    f->repl_redirects = r->redirects;
    f->repl_caught_up = r->caught_up;
    for (int k = 0; k < r->n && k < 3; k++)
        f->repl_lag[k] = ps_repl_lag(r, k, now, &f->repl_lag_ns[k]);
}

void ps_repl_describe(const ps_repl *r, char *out, size_t cap)
{
    if (!r) {
        snprintf(out, cap, "-");
        return;
    }
    int64_t now = ps_now_ns();
    size_t w = (size_t)snprintf(out, cap, "group %d member %d: %s, epoch %llu, primary %d", r->g,
                                r->me, repl_role_name(r->role),
                                (unsigned long long)r->cfg.epoch, r->cfg.primary);
    for (int k = 0; k < r->n && w < cap; k++) {
        int64_t oldest;
        int64_t lag = ps_repl_lag(r, k, now, &oldest);
        if (lag >= 0)
            w += (size_t)snprintf(out + w, cap - w, "; member %d%s: lag %lld (%.1f ms)", k,
                                  r->m[k].joining ? " (joining)" : "", (long long)lag,
                                  (double)oldest * 1e-6);
    }
}
