/* Replicas and failover: roles, the group's configuration and the changes
 * asked of etcd, failure detection, the members' messages, open and close
 * (server/repl.h has the contract; the stream and the held replies are in
 * repl_stream.c). */
#include "repl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_etcd.h"
#include "ps_group.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ratelimit.h"
#include "repl_coord.h"
#include "repl_internal.h"
#include "server_internal.h"
#include "zmsg.h"

/* How long a member that never said a word is given (processes start in
 * any order) before it counts as lost. */
#define FIRST_WORD_MS 10000
/* A member heard from but still not acknowledging a message this many
 * failure timeouts after it was sent lost it (a reconnect dropped it): it
 * is no longer an exact copy and is removed. */
#define ACK_LATE_FACTOR 8
/* A replacement still catching up may be silent this many failure timeouts
 * (its update threads load the snapshot, and its I/O thread does not read
 * while they cannot take more): nothing waits for it meanwhile. */
#define JOIN_SILENT_FACTOR 10
/* The lease: this many failure timeouts, at least LEASE_MIN_S. */
#define LEASE_MIN_S 5

/* ---------------------------------------------------------------- helpers */

static int64_t ms_ns(int ms) { return (int64_t)ms * 1000000LL; }

int ps_repl_role(const ps_repl *r) { return r ? r->role : PS_REPL_PRIMARY; }

int ps_repl_serves(const ps_repl *r) { return !r || r->role == PS_REPL_PRIMARY; }

const char *repl_role_name(int role)
{
    switch (role) {
    case PS_REPL_PRIMARY: return "primary";
    case PS_REPL_MEMBER: return "replica";
    case PS_REPL_JOINING: return "joining";
    default: return "deposed";
    }
}

/* members[] of the configuration: is slot in it with incarnation inc? */
static int cfg_has(const ps_group_cfg *c, int slot, uint64_t inc)
{
    int i = ps_group_find(c, slot);
    return i >= 0 && c->m[i].inc == inc;
}

/* ---------------------------------------------------------------- configuration */

/* Ask etcd for a change (one at a time): next from the configuration we
 * hold; why: what made us (for the log line when it is done). */
void repl_propose(ps_repl *r, const ps_group_cfg *next, int what, const char *why, int64_t seen)
{
    if (r->cas_busy)
        return;
    r->cas_busy = what;
    r->cas_seen_ns = seen;
    snprintf(r->cas_why, sizeof r->cas_why, "%s", why);
    ps_repl_coord_cas(r->agent, r->cfg.rev, next, (uint64_t)what);
}

/* Step down: this server is no longer part of its group (removed, or its
 * lease is gone).  What it held is dropped (the workers resend to the
 * primary), and it stops with exit 1, so that the supervisor replaces it. */
void repl_step_down(ps_repl *r, const char *why)
{
    if (r->role == PS_REPL_DEPOSED)
        return;
    ps_error("replicas: %s; this server stops (exit 1), the supervisor may start a replacement "
             "that copies the group's state", why);
    r->role = PS_REPL_DEPOSED;
    repl_held_drop_all(r);
    for (int k = 0; k < r->n; k++)
        repl_close_member(r, k);
    srv_set_stopping(r->s);
    r->s->io_failed = 1;
}

/* Act on the configuration c (read or written): our role follows it. */
void repl_apply(ps_repl *r, const ps_group_cfg *c, int64_t now)
{
    int was = r->role;
    ps_group_cfg old = r->cfg;
    r->cfg = *c;
    char d[256];
    ps_group_describe(c, d, sizeof d);
    if (c->primary == r->me && cfg_has(c, r->me, r->inc)) {
        if (was != PS_REPL_PRIMARY) {
            r->role = PS_REPL_PRIMARY;
            r->promotions += was == PS_REPL_MEMBER;
            r->have_pid = 0;
            /* its update threads saw the old primary's numbers up to recv_hi:
             * ours go on from there, so a snapshot's "up to" stays true */
            r->rseq = r->base = r->recv_hi;
            for (int k = 0; k < r->n; k++)
                if (k != r->me && ps_group_find(c, k) >= 0)
                    repl_open_member(r, k, 0, now);
            int64_t took = r->cas_seen_ns ? now - r->cas_seen_ns : 0;
            ps_info("replicas: this server is now the primary of group %d (%s)%s%s; failover took "
                    "%.1f ms from the failure seen to the decision", r->g, d,
                    r->cas_why[0] ? ": " : "", r->cas_why, (double)took * 1e-6);
            return;
        }
        /* still the primary: members that left are no longer waited for */
        for (int k = 0; k < r->n; k++) {
            if (k == r->me)
                continue;
            int in = ps_group_find(c, k) >= 0 && cfg_has(c, k, c->m[ps_group_find(c, k)].inc);
            if (r->m[k].in_cfg && !in) {
                repl_held_drop_member(r, k);
                repl_close_member(r, k);
            } else if (in && r->m[k].joining) { /* a replacement that caught up */
                r->m[k].joining = 0;
                r->m[k].in_cfg = 1;
                r->caught_up++;
            } else if (in && !r->m[k].dealer) {
                repl_open_member(r, k, 0, now);
            }
        }
        if (old.epoch != c->epoch)
            ps_info("replicas: group %d is now %s", r->g, d);
        return;
    }
    if (cfg_has(c, r->me, r->inc)) {
        if (was == PS_REPL_PRIMARY) {
            repl_step_down(r, "another member was made the primary of this group");
            return;
        }
        r->role = PS_REPL_MEMBER;
        if (old.primary != c->primary) {
            r->have_pid = 0; /* the new primary's hello comes */
            r->p_since_ns = now;
            r->p_heard_ns = 0;
        }
        if (old.epoch != c->epoch || was != PS_REPL_MEMBER)
            ps_info("replicas: this server is a replica of group %d (%s)", r->g, d);
        return;
    }
    if (was == PS_REPL_JOINING)
        return; /* not added yet */
    char why[320];
    snprintf(why, sizeof why, "no longer a member of group %d (%s)", r->g, d);
    repl_step_down(r, why);
}

/* What the agent answered. */
static void coord_result(ps_repl *r, const ps_repl_coord_result *res, int64_t now)
{
    if (res->kind == PS_RC_LEASE_LOST) {
        char why[400];
        snprintf(why, sizeof why, "this server's etcd lease is gone (%s): it cannot know whether "
                 "its group chose another primary", res->why);
        repl_step_down(r, why);
        return;
    }
    int what = (int)res->tag;
    if (res->kind == PS_RC_CAS)
        r->cas_busy = 0;
    if (res->rc && res->rc != PS_ESTALE) {
        if (ps_rlimit_allow(&r->rl))
            ps_warn("replicas: etcd: %s (%.1f ms); tried again", res->why,
                    (double)res->took_ns * 1e-6);
        r->load_busy = 0;
        return;
    }
    if (res->kind == PS_RC_LOAD)
        r->load_busy = 0;
    if (res->kind == PS_RC_CAS && res->rc == 0) {
        char d[256];
        ps_group_describe(&res->cfg, d, sizeof d);
        int64_t took = r->cas_seen_ns ? now - r->cas_seen_ns : 0;
        if (what == REPL_CAS_REMOVE)
            ps_info("replicas: %s: removed from group %d, now %s (%.1f ms from the failure "
                    "seen, etcd %.1f ms)", r->cas_why, r->g, d, (double)took * 1e-6,
                    (double)res->took_ns * 1e-6);
        else if (what == REPL_CAS_ADD)
            ps_info("replicas: %s: group %d is now %s (etcd %.1f ms)", r->cas_why, r->g, d,
                    (double)res->took_ns * 1e-6);
    } else if (res->kind == PS_RC_CAS) {
        ps_info("replicas: another change of group %d came first; following it", r->g);
    }
    repl_apply(r, &res->cfg, now);
    if (res->kind == PS_RC_LOAD || res->kind == PS_RC_CAS)
        repl_pending_hello(r, now);
    r->cas_seen_ns = 0;
    r->cas_why[0] = 0;
}

/* ---------------------------------------------------------------- failure detection */

static int64_t silent_limit(const ps_repl *r, int64_t heard)
{
    return heard ? ms_ns(r->failure_ms) : ms_ns(r->failure_ms > FIRST_WORD_MS ? r->failure_ms
                                                                                : FIRST_WORD_MS);
}

/* The primary is lost (why): promote this member. */
static void promote(ps_repl *r, const char *why, int64_t seen)
{
    if (r->role != PS_REPL_MEMBER || r->cas_busy)
        return;
    ps_group_cfg next = r->cfg;
    int old = next.primary;
    next.primary = r->me;
    ps_group_remove(&next, old);
    next.epoch++;
    ps_warn("replicas: the primary of group %d (member %d, %s) is lost: %s; asking etcd to make "
            "this server its primary", r->g, old, r->m[old].ep, why);
    char w[200];
    snprintf(w, sizeof w, "member %d lost (%s)", old, why);
    repl_propose(r, &next, REPL_CAS_PROMOTE, w, seen);
}

/* Member slot is lost (why): remove it from the configuration. */
void repl_remove(ps_repl *r, int slot, const char *why, int64_t seen)
{
    if (r->role != PS_REPL_PRIMARY || r->cas_busy || !r->m[slot].in_cfg)
        return;
    ps_group_cfg next = r->cfg;
    ps_group_remove(&next, slot);
    next.epoch++;
    ps_warn("replicas: member %d of group %d (%s) is lost: %s; removing it from the group so that "
            "replies stop waiting for it", slot, r->g, r->m[slot].ep, why);
    char w[200];
    snprintf(w, sizeof w, "member %d lost (%s)", slot, why);
    repl_propose(r, &next, REPL_CAS_REMOVE, w, seen);
}

static void timers(ps_repl *r, int64_t now)
{
    ps_rlimit_flush(&r->rl, now, 0);
    if (r->role == PS_REPL_PRIMARY) {
        if (now >= r->next_hb_ns) {
            r->next_hb_ns = now + r->hb_ns;
            ps_header h;
            ps_header_init(&h, PS_MSG_HEARTBEAT);
            h.rank = -1;
            h.flags = PS_FLAG_REPL;
            h.epoch = r->cfg.epoch;
            h.member = r->me;
            for (int k = 0; k < r->n; k++)
                if (k != r->me && r->m[k].dealer)
                    repl_send(r->m[k].dealer, &h, NULL, 0);
        }
        for (int k = 0; k < r->n; k++) {
            repl_member *m = &r->m[k];
            if (k == r->me || !m->dealer)
                continue;
            int64_t last = m->heard_ns > m->since_ns ? m->heard_ns : m->since_ns;
            char why[160];
            int64_t limit = silent_limit(r, m->heard_ns);
            if (m->joining && !m->in_cfg)
                limit *= JOIN_SILENT_FACTOR;
            if (now - last > limit) {
                snprintf(why, sizeof why, "%s for %.1f s", m->heard_ns ? "silent" : "never heard from",
                         (double)(now - last) * 1e-9);
                if (m->in_cfg)
                    repl_remove(r, k, why, now);
                else if (m->joining)
                    repl_join_failed(r, k, why);
            }
        }
        /* a member that answers but leaves a message unacknowledged lost it */
        repl_waited_release(r, now, ACK_LATE_FACTOR * ms_ns(r->failure_ms));
        if (r->nheld && r->cap) {
            held *e = &r->ring[r->base & (r->cap - 1)];
            if (e->rseq == r->base && now - e->t0 > ACK_LATE_FACTOR * ms_ns(r->failure_ms))
                for (int k = 0; k < r->n; k++)
                    if ((e->need & (1u << k)) && r->m[k].heard_ns > e->t0) {
                        char why[160];
                        snprintf(why, sizeof why, "message %llu of the stream unacknowledged "
                                 "for %.1f s while it answers others",
                                 (unsigned long long)e->rseq, (double)(now - e->t0) * 1e-9);
                        repl_remove(r, k, why, now);
                    }
        }
    } else if (r->role == PS_REPL_MEMBER) {
        int64_t last = r->p_heard_ns > r->p_since_ns ? r->p_heard_ns : r->p_since_ns;
        if (r->p_gone_ns) {
            promote(r, "its connection closed", r->p_gone_ns);
        } else if (now - last > silent_limit(r, r->p_heard_ns)) {
            char why[96];
            snprintf(why, sizeof why, "%s for %.1f s", r->p_heard_ns ? "silent" : "never heard from",
                     (double)(now - last) * 1e-9);
            promote(r, why, now);
        }
    }
    repl_join_timers(r, now);
}

/* ---------------------------------------------------------------- the I/O loop */

void ps_repl_poll_items(ps_repl *r, zmq_pollitem_t *it, int *n)
{
    r->npoll = 0;
    it[*n] = (zmq_pollitem_t){NULL, ps_repl_coord_fd(r->agent), ZMQ_POLLIN, 0};
    r->poll_slot[r->npoll++] = -1;
    (*n)++;
    for (int k = 0; k < r->n; k++)
        if (r->m[k].dealer) {
            it[*n] = (zmq_pollitem_t){r->m[k].dealer, 0, ZMQ_POLLIN, 0};
            r->poll_slot[r->npoll++] = k;
            (*n)++;
        }
    if (r->join_dealer) {
        it[*n] = (zmq_pollitem_t){r->join_dealer, 0, ZMQ_POLLIN, 0};
        r->poll_slot[r->npoll++] = REPL_POLL_JOIN;
        (*n)++;
    }
}

/* What came from member slot on our DEALER: acknowledgements, answers to
 * our hello and heartbeats, refusals. */
static void read_member(ps_repl *r, int slot, int64_t now)
{
    for (int b = 0; b < 4096; b++) {
        repl_member *m = &r->m[slot];
        if (!m->dealer)
            return;
        zmq_msg_t f[4];
        if (ps_zmsg_recv(m->dealer, &f[0], ZMQ_DONTWAIT) < 0)
            return;
        int nf = 1;
        ps_zmsg_recv_rest(m->dealer, zmq_msg_more(&f[0]), f, &nf, 4);
        ps_header h;
        char why[256];
        int rc = ps_proto_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &h, why, sizeof why);
        ps_zmsg_close_all(f, nf);
        if (rc) {
            if (ps_rlimit_allow(&r->rl))
                ps_warn("replicas: a bad reply from member %d: %s", slot, why);
            continue;
        }
        m->heard_ns = now;
        if (h.type == PS_MSG_ERROR) {
            if (h.err_code == PS_ESTALE || h.err_code == PS_ENOTPRIMARY) {
                /* it holds a later epoch: etcd says who we are now (a member
                 * that missed part of our stream is not taken back: it stops
                 * at the gap, or is removed when it does not acknowledge) */
                if (m->joining) {
                    repl_join_failed(r, slot, "it refused the stream (a new process?)");
                    return;
                }
                if (!r->load_busy) {
                    r->load_busy = 1;
                    ps_warn("replicas: member %d refused the stream: %s; asking etcd", slot,
                            h.err_text);
                    ps_repl_coord_load(r->agent, REPL_LOAD_REFRESH);
                }
                continue;
            }
            r->member_errors++;
            if (ps_rlimit_allow(&r->rl))
                ps_warn("replicas: member %d refused message %llu of the stream: %s (%llu so "
                        "far)", slot, (unsigned long long)h.seq, h.err_text,
                        (unsigned long long)r->member_errors);
        }
        if (h.type == PS_MSG_HEARTBEAT && (h.flags & PS_FLAG_REPL) && h.seq) {
            /* every stream message up to q is there (in order, no gap) */
            repl_held_ack_upto(r, h.seq, slot);
            continue;
        }
        if (h.type == PS_MSG_REPL_HELLO || h.type == PS_MSG_HEARTBEAT || !h.seq)
            continue;
        repl_held_ack(r, h.seq, slot);
    }
}

void ps_repl_flush_acks(ps_repl *r)
{
    if (!r || !r->ack_due || !r->have_pid)
        return;
    /* one acknowledgement of everything received so far: a member holds a
     * message once its I/O thread took it (its update thread takes them in
     * order; one that dies with them is no longer a member) */
    ps_header a;
    ps_header_init(&a, PS_MSG_HEARTBEAT);
    a.flags = PS_FLAG_REPLY | PS_FLAG_REPL;
    a.seq = r->recv_hi;
    a.rank = -1;
    a.epoch = r->cfg.epoch;
    a.member = r->me;
    zmq_msg_t id;
    zmq_msg_init(&id);
    zmq_msg_copy(&id, &r->pid);
    srv_send(r->s, &id, &a);
    zmq_msg_close(&id);
    r->ack_due = 0;
}

void ps_repl_dispatch(ps_repl *r, const zmq_pollitem_t *it, int first, int64_t now)
{
    for (int i = 0; i < r->npoll; i++) {
        if (!(it[first + i].revents & ZMQ_POLLIN))
            continue;
        int slot = r->poll_slot[i];
        if (slot == -1) {
            ps_repl_coord_result res;
            while (ps_repl_coord_take(r->agent, &res))
                coord_result(r, &res, now);
        } else if (slot == REPL_POLL_JOIN) {
            repl_join_read(r, now);
        } else {
            read_member(r, slot, now);
        }
    }
    timers(r, now);
}

long ps_repl_timeout_ms(const ps_repl *r, int64_t now)
{
    (void)now;
    long t = (long)(r->hb_ns / 1000000);
    return t > 0 ? t : 1;
}

/* ---------------------------------------------------------------- messages */

static void answer_error(ps_repl *r, zmq_msg_t *id, const ps_header *h, int code,
                         const char *why)
{
    ps_header e;
    ps_reply_error(&e, h->seq, h->rank, h->key, h->chunk, code, why);
    e.seq_negative = h->seq_negative;
    e.epoch = r->cfg.epoch;
    e.member = r->cfg.primary;
    srv_send(r->s, id, &e);
}

void ps_repl_not_primary(ps_repl *r, zmq_msg_t *id, const ps_header *h)
{
    char why[256];
    int p = r->cfg.primary;
    snprintf(why, sizeof why, "member %d of server %d is %s, not the primary (epoch %llu): member "
             "%d at %s is", r->me, r->g, repl_role_name(r->role),
             (unsigned long long)r->cfg.epoch, p, r->m[p].ep);
    r->redirects++;
    answer_error(r, id, h, PS_ENOTPRIMARY, why);
}

static int same_id(const zmq_msg_t *a, const zmq_msg_t *b)
{
    size_t n = zmq_msg_size((zmq_msg_t *)a);
    return n == zmq_msg_size((zmq_msg_t *)b) &&
           memcmp(zmq_msg_data((zmq_msg_t *)a), zmq_msg_data((zmq_msg_t *)b), n) == 0;
}

int repl_keep_pending(ps_repl *r, zmq_msg_t *f, int nf)
{
    if (!r->pend_hello || !same_id(&f[0], &r->pend_id))
        return 0;
    repl_msg *k = calloc(1, sizeof *k);
    if (!k)
        return 0;
    k->nf = nf < PS_CMD_MAX_FRAMES ? nf : PS_CMD_MAX_FRAMES;
    for (int i = 0; i < k->nf; i++) {
        zmq_msg_init(&k->f[i]);
        zmq_msg_copy(&k->f[i], &f[i]);
    }
    if (r->pq_tail)
        r->pq_tail->next = k;
    else
        r->pq_head = k;
    r->pq_tail = k;
    return 1;
}

/* The messages kept while a hello was checked: delivered now (their
 * sender's hello was taken) or dropped (it was not). */
static void pending_release(ps_repl *r, int deliver)
{
    while (r->pq_head) {
        repl_msg *k = r->pq_head;
        r->pq_head = k->next;
        if (deliver)
            srv_deliver(r->s, k->f, k->nf);
        ps_zmsg_close_all(k->f, k->nf);
        free(k);
    }
    r->pq_tail = NULL;
}

int ps_repl_accept(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h)
{
    char why[256];
    if (r && repl_keep_pending(r, f, nf))
        return -1; /* its sender's hello is being checked: after it */
    if (!r || (r->role != PS_REPL_MEMBER && r->role != PS_REPL_JOINING) || !r->have_pid ||
        !same_id(&f[0], &r->pid)) {
        snprintf(why, sizeof why, "server %d member %d takes the group's stream only from the "
                 "primary that said hello (it is %s, epoch %llu)", r ? r->g : -1,
                 r ? r->me : -1, r ? repl_role_name(r->role) : "not replicated",
                 r ? (unsigned long long)r->cfg.epoch : 0ull);
        if (r)
            answer_error(r, &f[0], h, PS_ESTALE, why);
        return -1;
    }
    if (h->epoch < r->cfg.epoch) {
        snprintf(why, sizeof why, "the stream of epoch %llu is stale: group %d is at epoch %llu",
                 (unsigned long long)h->epoch, r->g, (unsigned long long)r->cfg.epoch);
        answer_error(r, &f[0], h, PS_ESTALE, why);
        return -1;
    }
    if (h->epoch > r->cfg.epoch) {
        /* the primary changed the members (only it can raise its epoch, by a
         * compare-and-swap): follow, and read what it wrote */
        r->cfg.epoch = h->epoch;
        if (!r->load_busy) {
            r->load_busy = 1;
            ps_repl_coord_load(r->agent, REPL_LOAD_REFRESH);
        }
    }
    r->p_heard_ns = ps_now_ns();
    if (h->seq) {
        /* the stream's numbers come in order, one after the other: a gap is
         * a message lost (a connection that broke), and this member is no
         * longer the primary's copy */
        if (r->recv_hi && h->seq != r->recv_hi + 1) {
            char why[160];
            snprintf(why, sizeof why, "stream messages %llu..%llu from the primary never came "
                     "(the next to come was a %s)", (unsigned long long)r->recv_hi + 1,
                     (unsigned long long)h->seq - 1, ps_msg_type_name(h->type));
            repl_step_down(r, why);
            return -1;
        }
        r->recv_hi = h->seq;
        r->ack_due = 1;
    }
    return repl_join_stream(r, f, nf, h);
}

/* A REPL_HELLO: take the sender's stream if it is the primary of the epoch
 * etcd holds.  0: answered; 1: etcd must be asked first (kept). */
static int on_hello(ps_repl *r, zmq_msg_t *f, const ps_header *h, int64_t now)
{
    char why[320];
    ps_hello mine = srv_my_hello(r->s);
    ps_hello theirs = h->hello;
    if (ps_hello_compare(&mine, "this member", &theirs, "the primary", 1, why, sizeof why)) {
        answer_error(r, &f[0], h, PS_EMISMATCH, why);
        return 0;
    }
    if (h->epoch > r->cfg.epoch || h->member != r->cfg.primary)
        return 1;
    if (h->epoch < r->cfg.epoch || (r->role != PS_REPL_MEMBER && r->role != PS_REPL_JOINING)) {
        snprintf(why, sizeof why, "member %d of group %d holds epoch %llu (primary %d) and is %s; "
                 "a hello of epoch %llu from member %d is stale", r->me, r->g,
                 (unsigned long long)r->cfg.epoch, r->cfg.primary, repl_role_name(r->role),
                 (unsigned long long)h->epoch, h->member);
        answer_error(r, &f[0], h, PS_ESTALE, why);
        return 0;
    }
    if (r->have_pid)
        zmq_msg_close(&r->pid);
    zmq_msg_init(&r->pid);
    zmq_msg_copy(&r->pid, &f[0]);
    r->have_pid = 1;
    r->pfd = zmq_msg_get(&f[1], ZMQ_SRCFD);
    r->p_heard_ns = now;
    r->p_gone_ns = 0;
    r->recv_hi = h->stream_pos; /* its stream goes on from there */
    r->ack_due = 0;
    ps_info("replicas: member %d (%s) is the primary of group %d at epoch %llu: taking its "
            "stream from message %llu on", h->member, r->m[h->member].ep, r->g,
            (unsigned long long)h->epoch, (unsigned long long)h->stream_pos + 1);
    ps_header rep;
    ps_reply_header(&rep, PS_MSG_REPL_HELLO, h->seq, -1, 0, 0);
    rep.epoch = r->cfg.epoch;
    rep.member = r->me;
    srv_send(r->s, &f[0], &rep);
    return 0;
}

/* A hello kept until etcd answered: answer it now. */
void repl_pending_hello(ps_repl *r, int64_t now)
{
    if (!r->pend_hello)
        return;
    zmq_msg_t f[2];
    zmq_msg_init(&f[0]);
    zmq_msg_move(&f[0], &r->pend_id);
    zmq_msg_init(&f[1]);
    zmq_msg_move(&f[1], &r->pend_hdr);
    r->pend_hello = 0;
    ps_header h = r->pend_h;
    zmq_msg_t id; /* the answer takes f[0] */
    zmq_msg_init(&id);
    zmq_msg_copy(&id, &f[0]);
    if (h.epoch > r->cfg.epoch || h.member != r->cfg.primary) {
        char why[256];
        snprintf(why, sizeof why, "etcd holds epoch %llu with primary %d for group %d, not "
                 "epoch %llu with primary %d", (unsigned long long)r->cfg.epoch, r->cfg.primary,
                 r->g, (unsigned long long)h.epoch, h.member);
        answer_error(r, &f[0], &h, PS_ESTALE, why);
    } else {
        on_hello(r, f, &h, now);
    }
    /* what came after the hello on its connection: as if it came now */
    pending_release(r, r->have_pid && same_id(&id, &r->pid));
    zmq_msg_close(&id);
    ps_zmsg_close_all(f, 2);
}

static void on_live(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h)
{
    if (ps_repl_accept(r, f, nf, h) != 0)
        return;
    if (h->key >= (uint64_t)r->s->cfg.num_workers || h->chunk > 3) {
        answer_error(r, &f[0], h, PS_EPROTO, "a live change names a rank out of range");
        return;
    }
    if (h->chunk == 3)
        srv_stream_join(r->s, (int)h->key, h->push_step);
    else
        srv_stream_live(r->s, (int)h->key, (int)h->chunk);
    ps_header rep;
    ps_reply_header(&rep, PS_MSG_REPL_LIVE, h->seq, -1, h->key, h->chunk);
    srv_send(r->s, &f[0], &rep);
}

void ps_repl_on_message(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h)
{
    int64_t now = ps_now_ns();
    switch (h->type) {
    case PS_MSG_REPL_HELLO:
        if (on_hello(r, f, h, now) == 1) {
            /* a later epoch than ours: etcd says whether it is the primary */
            if (r->pend_hello) {
                zmq_msg_close(&r->pend_id);
                zmq_msg_close(&r->pend_hdr);
            }
            zmq_msg_init(&r->pend_id);
            zmq_msg_copy(&r->pend_id, &f[0]);
            zmq_msg_init(&r->pend_hdr);
            zmq_msg_copy(&r->pend_hdr, &f[1]);
            r->pend_h = *h;
            r->pend_hello = 1;
            if (!r->load_busy) {
                r->load_busy = 1;
                ps_repl_coord_load(r->agent, REPL_LOAD_HELLO);
            }
        }
        break;
    case PS_MSG_REPL_LIVE:
        on_live(r, f, nf, h);
        break;
    default:
        repl_join_message(r, f, nf, h, now);
        break;
    }
}

void ps_repl_conn_gone(ps_repl *r, int fd)
{
    if (r && r->role == PS_REPL_MEMBER && r->have_pid && fd == r->pfd && !r->p_gone_ns) {
        r->p_gone_ns = ps_now_ns();
        ps_debug("replicas: the primary's connection closed");
    }
}

/* ---------------------------------------------------------------- open and close */

/* "a|b|c" into r->m[].ep; the count, or -1. */
static int split_group(ps_repl *r, const char *list)
{
    int n = 0;
    for (const char *p = list; *p && n < PS_GROUP_MAX_MEMBERS;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (!len || len >= sizeof r->m[0].ep)
            return -1;
        memcpy(r->m[n].ep, p, len);
        r->m[n].ep[len] = 0;
        n++;
        if (!bar)
            return n;
        p = bar + 1;
    }
    return -1;
}

/* This process's place in the group's configuration at start: create it
 * (the first member to start), claim our slot (0: not claimed yet), or find
 * that we replace an earlier process (joining).  A group started with
 * --restore begins with member 0 alone: it restores its checkpoint, and the
 * others, whose own checkpoints may be of other points, join it as
 * replacements do (a copy of its state), so that every member holds the
 * same. */
static int first_config(ps_repl *r, ps_etcd *e, char *why, size_t why_len)
{
    for (int tries = 0; tries < 20; tries++) {
        ps_group_cfg c;
        int rc = ps_group_load(e, r->job, r->g, r->n, &c, why, why_len);
        if (rc == PS_ENOTFOUND) {
            ps_group_cfg init = {.epoch = 1, .primary = 0, .n = r->s->cfg.restore ? 1 : r->n};
            for (int k = 0; k < init.n; k++)
                init.m[k].slot = k;
            rc = ps_group_cas(e, r->job, r->g, r->n, 0, &init, NULL, why, why_len);
            if (rc == 0 || rc == PS_ESTALE)
                continue; /* read it back (ours or the one that came first) */
        }
        if (rc)
            return rc;
        int i = ps_group_find(&c, r->me);
        if (i >= 0 && c.m[i].inc == 0) {
            ps_group_cfg next = c;
            next.m[i].inc = r->inc;
            rc = ps_group_cas(e, r->job, r->g, r->n, c.rev, &next, NULL, why, why_len);
            if (rc == PS_ESTALE)
                continue;
            if (rc)
                return rc;
            r->cfg = next;
        } else {
            r->cfg = c;
        }
        return 0;
    }
    ps_errorf(why, why_len, "group %d's configuration kept changing while this server started",
              r->g);
    return PS_ESTATE;
}

int ps_repl_open(ps_server *s, ps_repl **out, char *why, size_t why_len)
{
    *out = NULL;
    const ps_server_config *c = &s->cfg;
    ps_repl *r = calloc(1, sizeof *r);
    if (!r)
        return PS_ENOMEM;
    r->s = s;
    r->g = c->rank;
    r->me = c->member;
    r->failure_ms = c->failure_timeout_ms > 0 ? c->failure_timeout_ms : 1000;
    r->hb_ns = ms_ns(r->failure_ms) / 4;
    if (r->hb_ns < 1000000)
        r->hb_ns = 1000000;
    snprintf(r->job, sizeof r->job, "%s", c->job ? c->job : "ps");
    r->n = split_group(r, c->group);
    if (r->n < 2 || r->me < 0 || r->me >= r->n) {
        ps_errorf(why, why_len, "--group '%s' must list 2 or 3 endpoints separated by '|' (a "
                  "primary and its replicas), and --member %d must be one of them", c->group,
                  r->me);
        free(r);
        return PS_EINVAL;
    }
    if (!c->coord) {
        ps_errorf(why, why_len, "--group needs --coord: the etcd endpoints through which the "
                  "members decide who is the primary");
        free(r);
        return PS_EINVAL;
    }
    ps_etcd *e;
    int rc = ps_etcd_open(c->coord, 2000, &e, why, why_len);
    if (rc) {
        free(r);
        return rc;
    }
    int ttl = (r->failure_ms * 5 + 999) / 1000;
    if (ttl < LEASE_MIN_S)
        ttl = LEASE_MIN_S;
    int64_t lease = 0;
    char key[256], val[512];
    if ((rc = ps_etcd_lease_grant(e, ttl, &lease, NULL, why, why_len)) == 0) {
        r->inc = (uint64_t)lease;
        ps_group_member_key(r->job, r->g, r->me, key, sizeof key);
        int n = snprintf(val, sizeof val, "{\"endpoint\":\"%s\",\"inc\":\"%" PRIu64 "\",\"pid\":%d}",
                         r->m[r->me].ep, r->inc, (int)getpid());
        rc = ps_etcd_put(e, key, val, (size_t)n, lease, NULL, why, why_len);
    }
    if (!rc)
        rc = first_config(r, e, why, why_len);
    if (rc) {
        char w2[300];
        snprintf(w2, sizeof w2, "%s", why);
        ps_errorf(why, why_len, "replicas: etcd at %s: %s", c->coord, w2);
        if (lease)
            ps_etcd_lease_revoke(e, lease, w2, sizeof w2);
        ps_etcd_close(e);
        free(r);
        return rc == PS_ENOTFOUND ? PS_EIO : rc;
    }
    rc = ps_repl_coord_start(e, r->job, r->g, r->n, lease, ttl, &r->agent);
    if (rc) {
        ps_errorf(why, why_len, "cannot start the replicas' etcd agent");
        free(r);
        return rc;
    }
    int64_t now = ps_now_ns();
    r->p_since_ns = now;
    char d[256];
    ps_group_describe(&r->cfg, d, sizeof d);
    if (r->cfg.primary == r->me && cfg_has(&r->cfg, r->me, r->inc)) {
        r->role = PS_REPL_PRIMARY;
        for (int k = 0; k < r->n; k++)
            if (k != r->me && ps_group_find(&r->cfg, k) >= 0)
                repl_open_member(r, k, 0, now);
    } else if (cfg_has(&r->cfg, r->me, r->inc)) {
        r->role = PS_REPL_MEMBER;
    } else {
        r->role = PS_REPL_JOINING;
    }
    ps_info("replicas: member %d of group %d (%s), job %s, etcd %s, lease %d s: %s; group %s",
            r->me, r->g, r->m[r->me].ep, r->job, c->coord, ttl, repl_role_name(r->role), d);
    if (r->role == PS_REPL_JOINING && (rc = repl_join_start(r, now, why, why_len)) != 0) {
        ps_repl_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void ps_repl_close(ps_repl *r)
{
    if (!r)
        return;
    repl_held_drop_all(r);
    free(r->ring);
    for (int k = 0; k < r->n; k++)
        repl_close_member(r, k);
    repl_join_close(r);
    if (r->have_pid)
        zmq_msg_close(&r->pid);
    if (r->pend_hello) {
        zmq_msg_close(&r->pend_id);
        zmq_msg_close(&r->pend_hdr);
    }
    pending_release(r, 0);
    ps_repl_coord_stop(r->agent);
    free(r);
}
