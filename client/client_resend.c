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
 *  - Silent servers: after start, a server from which nothing came (a reply
 *    to anything, heartbeats included) for server_timeout_ms while
 *    sub-requests wait on it is given up on: they fail with PS_ETIMEDOUT,
 *    so the caller sees an error naming the server instead of resends that
 *    never end.  Silence counts from the later of the last message and the
 *    moment something began to wait on the server, and afresh after the
 *    process was stopped (SIGSTOP), whose replies may still be on the way.
 *
 * Everything here runs on the comm thread and touches only its state.  It
 * decides and sends nothing: the comm loop asks what is due (psc_resend_next,
 * psc_heartbeat_due, psc_give_up_next) and sends it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_moved.h"
#include "client_requests.h"
#include "client_resend.h"
#include "client_route.h"
#include "ps_log.h"
#include "ps_time.h"

#define RESEND_MAX_BACKOFF_NS (30LL * 1000000000LL)
/* A poll that returns this much later than it was due means the process
 * did not run (stopped, or a suspended machine), not that servers were
 * silent. */
#define PAUSE_SLACK_NS (500LL * 1000000LL)

struct psc_liveness {
    int64_t next_resend_check; /* no resend deadline is earlier */
    int64_t next_hb_ns;        /* when the next heartbeats are due */
    int64_t wake_by_ns;        /* the latest the loop's poll should have returned */
    int64_t resumed_ns;        /* when the process last ran again after a pause */
    int nheard;
    int64_t heard_ns[];        /* per server slot: when anything last came from it (0: never) */
};

int psc_liveness_new(ps_client *c)
{
    struct psc_liveness *lv =
        calloc(1, sizeof *lv + (size_t)c->nservers * sizeof lv->heard_ns[0]);
    if (!lv)
        return PS_ENOMEM;
    lv->wake_by_ns = INT64_MAX;
    lv->next_resend_check = INT64_MAX;
    lv->nheard = c->nservers;
    c->live = lv;
    return 0;
}

int psc_liveness_grow(ps_client *c, int nslots)
{
    struct psc_liveness *lv = c->live;
    if (nslots <= lv->nheard)
        return 0;
    lv = realloc(lv, sizeof *lv + (size_t)nslots * sizeof lv->heard_ns[0]);
    if (!lv)
        return PS_ENOMEM;
    memset(lv->heard_ns + lv->nheard, 0, (size_t)(nslots - lv->nheard) * sizeof lv->heard_ns[0]);
    lv->nheard = nslots;
    c->live = lv;
    return 0;
}

void psc_liveness_free(ps_client *c)
{
    free(c->live);
    c->live = NULL;
}

/* Every request but SHUTDOWN may be resent (see the top of this file). */
static int resendable(uint32_t type) { return type != PS_MSG_SHUTDOWN; }

void psc_resend_arm(ps_client *c, uint32_t i, int64_t now)
{
    if (c->opt.request_timeout_ms <= 0)
        return;
    psc_sub *s = &c->slots->sub[i];
    if (!s->backoff_ns) /* its first send */
        s->backoff_ns = (int64_t)c->opt.request_timeout_ms * 1000000LL;
    s->deadline_ns = now + s->backoff_ns;
    if (s->deadline_ns < c->live->next_resend_check)
        c->live->next_resend_check = s->deadline_ns;
}

void psc_resend_after(ps_client *c, uint32_t i, int64_t at_ns)
{
    psc_sub *s = &c->slots->sub[i];
    s->retry = 1;
    s->deadline_ns = at_ns;
    if (at_ns < c->live->next_resend_check)
        c->live->next_resend_check = at_ns;
}

uint32_t psc_resend_next(ps_client *c, int64_t now, uint32_t from)
{
    struct psc_liveness *lv = c->live;
    const struct psc_slots *sl = c->slots;
    /* deadlines are set by resend_arm (resending on) and resend_after */
    if (from == 0) {
        if (now < lv->next_resend_check)
            return PSC_NO_SLOT;
        /* a new round: the next check is the earliest deadline it sees, the
         * resent slots' new ones included (psc_resend_arm) */
        lv->next_resend_check = INT64_MAX;
    }
    for (uint32_t i = from; i < sl->n; i++) {
        psc_sub *s = &sl->sub[i];
        if (!s->req || !resendable(s->type))
            continue;
        if (s->deadline_ns > now) {
            if (s->deadline_ns < lv->next_resend_check)
                lv->next_resend_check = s->deadline_ns;
            continue;
        }
        if (s->retry) { /* a retry asked for, not a resend: no backoff, no line */
            s->retry = 0;
            s->deadline_ns = INT64_MAX; /* psc_resend_arm sets it again when resending is on */
            return i;
        }
        /* a server that answered something since (a heartbeat) is alive and
         * holds the request (a sync round or a barrier waiting for others):
         * the resend is a precaution, not news */
        int heard = lv->heard_ns[s->server] > s->deadline_ns - s->backoff_ns;
        ps_log(heard ? PS_LOG_DEBUG : PS_LOG_WARN,
               "libps: no reply from %s to %s key %llu chunk %u after %lld ms, resending",
               psc_route_endpoint(c, s->server), ps_msg_type_name(s->type), (unsigned long long)s->key,
               s->chunk, (long long)(s->backoff_ns / 1000000));
        s->backoff_ns = s->backoff_ns * 2 < RESEND_MAX_BACKOFF_NS ? s->backoff_ns * 2
                                                                   : RESEND_MAX_BACKOFF_NS;
        return i;
    }
    return PSC_NO_SLOT;
}

/* The heartbeats' period (ms): a replicated group's member is lost after
 * failure_ms of silence, so they go at least four times in that. */
static int hb_period_ms(const ps_client *c)
{
    int hb = c->opt.heartbeat_ms, f = psc_route_failure_ms(c) / 4;
    return f > 0 && f < hb ? f : hb;
}

int psc_heartbeat_due(ps_client *c, int64_t now)
{
    if (c->opt.heartbeat_ms <= 0 || !__atomic_load_n(&c->started, __ATOMIC_ACQUIRE))
        return 0;
    if (now < c->live->next_hb_ns)
        return 0;
    c->live->next_hb_ns = now + (int64_t)hb_period_ms(c) * 1000000LL;
    return 1;
}

void psc_server_heard(ps_client *c, int s, int64_t now) { c->live->heard_ns[s] = now; }

void psc_liveness_wake_by(ps_client *c, int64_t wake_by_ns) { c->live->wake_by_ns = wake_by_ns; }

static int server_timeout_on(const ps_client *c)
{
    return c->opt.server_timeout_ms > 0 && __atomic_load_n(&c->started, __ATOMIC_ACQUIRE);
}

/* When server s's silence began: its last message, when we began to wait
 * on it, or when the process ran again after a pause, whichever is latest. */
static int64_t silent_since(const ps_client *c, int s)
{
    int64_t t = c->live->heard_ns[s];
    int64_t busy = c->slots->server[s].busy_since_ns;
    if (busy > t)
        t = busy;
    return c->live->resumed_ns > t ? c->live->resumed_ns : t;
}

/* Fail every sub-request to server s: it has been silent for too long. */
static void fail_server(ps_client *c, int s)
{
    const struct psc_slots *sl = c->slots;
    char why[PS_ERR_TEXT_MAX + 1];
    snprintf(why, sizeof why, "no reply from %s for %g s (ps_server down?); giving up",
             psc_route_endpoint(c, s), c->opt.server_timeout_ms / 1000.0);
    ps_error("libps: %s", why);
    for (uint32_t i = 0; i < sl->n && sl->server[s].nlive; i++)
        if (sl->sub[i].req && sl->sub[i].server == s) {
            psc_set_error(sl->sub[i].req, PS_ETIMEDOUT, "%s", why);
            psc_slot_finish(c, i);
        }
}

/* The loop is at now; its poll was due back by wake_by_ns.  Much later
 * means the process was stopped (SIGSTOP, a suspended VM): silence is
 * counted afresh from now, so a resumed worker does not give up on servers
 * whose replies are still on their way. */
static void pause_check(ps_client *c, int64_t now)
{
    struct psc_liveness *lv = c->live;
    int64_t late = now - lv->wake_by_ns;
    if (late <= PAUSE_SLACK_NS)
        return;
    lv->wake_by_ns = now; /* one line per pause */
    ps_info("libps: this process did not run for %.1f s (stopped?); the servers' silence "
            "counts from now", (double)late * 1e-9);
    lv->resumed_ns = now;
}

int psc_lost(ps_client *c, int64_t now, int s)
{
    int f = psc_route_failure_ms(c);
    if (!f || !__atomic_load_n(&c->started, __ATOMIC_ACQUIRE) || !c->slots->server[s].nlive ||
        c->opt.heartbeat_ms <= 0)
        return 0;
    return now - silent_since(c, s) > (int64_t)f * 1000000LL;
}

int psc_give_up_next(ps_client *c, int64_t now, int from)
{
    if (!server_timeout_on(c))
        return -1;
    /* here, not only after the poll: a stop anywhere since it was due counts */
    if (from == 0)
        pause_check(c, now);
    int64_t limit = (int64_t)c->opt.server_timeout_ms * 1000000LL;
    for (int s = from; s < psc_nslots(c); s++)
        if (c->slots->server[s].nlive && now - silent_since(c, s) > limit) {
            fail_server(c, s);
            return s;
        }
    return -1;
}

/* *timeout (ms, -1: none yet) becomes at most the wait until now + d ns,
 * rounded up. */
static void sooner(long *timeout, int64_t d)
{
    long t = d <= 0 ? 0 : (long)(d / 1000000 + 1);
    if (*timeout < 0 || t < *timeout)
        *timeout = t;
}

long psc_liveness_timeout_ms(const ps_client *c, int64_t now)
{
    const struct psc_liveness *lv = c->live;
    long timeout = -1;
    if (server_timeout_on(c)) {
        int64_t limit = (int64_t)c->opt.server_timeout_ms * 1000000LL;
        for (int s = 0; s < psc_nslots(c); s++)
            if (c->slots->server[s].nlive)
                sooner(&timeout, silent_since(c, s) + limit - now);
    }
    if (c->slots->live && lv->next_resend_check != INT64_MAX)
        sooner(&timeout, lv->next_resend_check - now);
    int f = psc_route_failure_ms(c); /* a replicated group's member may be lost */
    for (int s = 0; f && c->opt.heartbeat_ms > 0 && __atomic_load_n(&c->started, __ATOMIC_ACQUIRE) &&
                    s < c->nservers; s++)
        if (c->slots->server[s].nlive)
            sooner(&timeout, silent_since(c, s) + (int64_t)f * 1000000LL - now);
    if (c->opt.heartbeat_ms > 0 && __atomic_load_n(&c->started, __ATOMIC_ACQUIRE))
        sooner(&timeout, lv->next_hb_ns - now);
    return timeout;
}
