/* libps: liveness, on the comm thread.
 *
 *  - Resends: with request_timeout_ms set, a sub-request unanswered for its
 *    backoff is sent again and its backoff doubles (up to 30 s).  Resending
 *    is safe: servers drop duplicate pushes by (rank, key, chunk, step),
 *    queue a resent pull or barrier once (and answer a barrier that has
 *    completed), and a second reply to the same id finds its slot freed.
 *  - Heartbeats: after start, every heartbeat_ms a HEARTBEAT goes to every
 *    server, fire-and-forget (no slot, no resend, the reply is dropped), so a
 *    server notices a worker that died (--worker-timeout).
 *
 * Everything here runs on the comm thread and touches only its state. */
#include <stdint.h>

#include "client_internal.h"
#include "ps_log.h"
#include "ps_time.h"

#define RESEND_MAX_BACKOFF_NS (30LL * 1000000000LL)

/* Every request but SHUTDOWN may be resent (see the top of this file). */
static int resendable(uint32_t type) { return type != PS_MSG_SHUTDOWN; }

void psc_resend_arm(ps_client *c, uint32_t i)
{
    if (c->opt.request_timeout_ms <= 0)
        return;
    psc_sub *s = &c->subs[i];
    s->deadline_ns = ps_now_ns() + s->backoff_ns;
    if (s->deadline_ns < c->next_resend_check)
        c->next_resend_check = s->deadline_ns;
}

void psc_resend_due(ps_client *c, int64_t now)
{
    if (c->opt.request_timeout_ms <= 0 || now < c->next_resend_check)
        return;
    int64_t next = INT64_MAX;
    for (uint32_t i = 0; i < c->nsubs; i++) {
        psc_sub *s = &c->subs[i];
        if (!s->req || !resendable(s->type))
            continue;
        if (s->deadline_ns <= now) {
            ps_warn("libps: no reply from %s to %s key %llu chunk %u after %lld ms, resending",
                    c->endpoints[s->server], ps_msg_type_name(s->type),
                    (unsigned long long)s->key, s->chunk, (long long)(s->backoff_ns / 1000000));
            s->backoff_ns = s->backoff_ns * 2 < RESEND_MAX_BACKOFF_NS ? s->backoff_ns * 2
                                                                       : RESEND_MAX_BACKOFF_NS;
            if (ps_msg_request_has_payload(s->type))
                __atomic_add_fetch(&s->req->_priv.pending, 1, __ATOMIC_ACQ_REL);
            psc_sub_send(c, i); /* may finish the slot on error */
            if (!c->subs[i].req)
                continue;
        }
        if (s->deadline_ns < next)
            next = s->deadline_ns;
    }
    c->next_resend_check = next;
}

void psc_heartbeat_due(ps_client *c, int64_t now)
{
    if (c->opt.heartbeat_ms <= 0 || !__atomic_load_n(&c->hb_on, __ATOMIC_ACQUIRE))
        return;
    if (now < c->next_hb_ns)
        return;
    c->next_hb_ns = now + (int64_t)c->opt.heartbeat_ms * 1000000LL;
    ps_header h;
    ps_header_init(&h, PS_MSG_HEARTBEAT);
    h.seq = PSC_HEARTBEAT_SEQ;
    h.rank = c->opt.rank;
    char buf[PS_HEADER_MAX];
    size_t len = 0;
    if (ps_proto_encode(&h, buf, sizeof buf, &len) != 0)
        return;
    for (int s = 0; s < c->nservers; s++)
        psc_zsend(c->socks[s], buf, len, 0); /* queued while a server is away; fine */
}

long psc_liveness_timeout_ms(const ps_client *c, int64_t now)
{
    long timeout = -1;
    if (c->opt.request_timeout_ms > 0 && c->live) {
        int64_t d = c->next_resend_check - now;
        timeout = d <= 0 ? 0 : (long)(d / 1000000 + 1);
    }
    if (c->opt.heartbeat_ms > 0 && __atomic_load_n(&c->hb_on, __ATOMIC_ACQUIRE)) {
        int64_t d = c->next_hb_ns - now;
        long t = d <= 0 ? 0 : (long)(d / 1000000 + 1);
        if (timeout < 0 || t < timeout)
            timeout = t;
    }
    return timeout;
}
