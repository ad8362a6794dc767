/* libps: the member of each server group that is its primary (client_route.h
 * has the contract). */
#include "client_route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "client_moved.h"
#include "ps_log.h"

#define MAXM 3
/* A member that answered "not the primary, the one you left is" has not
 * taken over yet: ask it again this much later. */
#define RETRY_NS (20LL * 1000000LL)
#define DEFAULT_FAILURE_MS 1000

struct psc_route {
    int any;
    struct grp {
        int n, cur;
        const char *ep[MAXM];
        uint64_t epoch;
        int left;          /* the member we left last (-1: none) */
        int64_t retry_ns;  /* a hello is due then (0: none) */
        int64_t moved_ns;  /* when we left a lost member (0: settled) */
        void *mon;         /* the PAIR that hears the DEALER's disconnects */
    } *g;
    int ng;
};

int psc_route_new(ps_client *c, int nservers)
{
    struct psc_route *r = calloc(1, sizeof *r);
    if (!r || !(r->g = calloc((size_t)nservers, sizeof *r->g))) {
        free(r);
        return PS_ENOMEM;
    }
    for (int i = 0; i < nservers; i++)
        r->g[i].left = -1;
    r->ng = nservers;
    c->route = r;
    return 0;
}

void psc_route_free(ps_client *c)
{
    if (!c->route)
        return;
    /* the monitors went with the comm thread's sockets (psc_route_unwatch) */
    free(c->route->g);
    free(c->route);
    c->route = NULL;
}

int psc_route_add(ps_client *c, int g, char *tok, int (*check)(const char *ep, char *why),
                  char *why)
{
    struct grp *gr = &c->route->g[g];
    for (char *p = tok;;) {
        char *bar = strchr(p, '|');
        if (bar)
            *bar = 0;
        if (gr->n == MAXM) {
            snprintf(why, PSC_ERRBUF, "server group %d lists more than %d members (a primary "
                     "and at most 2 replicas)", g, MAXM);
            return PS_EINVAL;
        }
        int rc = check(p, why);
        if (rc)
            return rc;
        gr->ep[gr->n++] = p;
        if (!bar)
            break;
        p = bar + 1;
    }
    if (gr->n > 1)
        c->route->any = 1;
    return 0;
}

int psc_route_any(const ps_client *c) { return c->route && c->route->any; }

const char *psc_route_endpoint(const ps_client *c, int g)
{
    if (g >= c->nservers) /* an added server slot: one member, learned at run time */
        return psc_slot_name(c, g);
    if (!c->route) /* no table (a client put together without psc_route_new) */
        return c->endpoints[g];
    const struct grp *gr = &c->route->g[g];
    return gr->ep[gr->cur];
}

int psc_route_failure_ms(const ps_client *c)
{
    if (!psc_route_any(c))
        return 0;
    return c->opt.failure_timeout_ms > 0 ? c->opt.failure_timeout_ms : DEFAULT_FAILURE_MS;
}

static void move_to(ps_client *c, int g, int k, const char *why, int64_t now)
{
    struct grp *gr = &c->route->g[g];
    ps_warn("libps: server %d: %s; moving to member %d (%s)", g, why, k, gr->ep[k]);
    gr->left = gr->cur;
    gr->cur = k;
    gr->retry_ns = 0;
    if (!gr->moved_ns)
        gr->moved_ns = now;
}

int psc_route_refused(ps_client *c, int g, const ps_header *h, int64_t now)
{
    struct grp *gr = &c->route->g[g];
    int k = h->member;
    if (h->epoch > gr->epoch)
        gr->epoch = h->epoch;
    /* the member we left, named again long after: it was not lost after all */
    int back = k == gr->left && gr->moved_ns &&
               now - gr->moved_ns > 2LL * psc_route_failure_ms(c) * 1000000LL;
    if (k >= 0 && k < gr->n && k != gr->cur && (k != gr->left || back) &&
        h->epoch >= gr->epoch) {
        char why[PS_ERR_TEXT_MAX + 64];
        snprintf(why, sizeof why, "member %d is not its primary (%s)", gr->cur, h->err_text);
        move_to(c, g, k, why, now);
        return 1;
    }
    /* it names the member we left (it has not taken over yet), or itself:
     * ask again shortly */
    if (!gr->retry_ns)
        gr->retry_ns = now + RETRY_NS;
    return 0;
}

int psc_route_lost(ps_client *c, int g, const char *why, int64_t now)
{
    struct grp *gr = &c->route->g[g];
    if (gr->n < 2)
        return 0;
    move_to(c, g, (gr->cur + 1) % gr->n, why, now);
    return 1;
}

void psc_route_settled(ps_client *c, int g, int64_t now)
{
    if (!psc_route_any(c) || g >= c->route->ng)
        return;
    struct grp *gr = &c->route->g[g];
    if (gr->moved_ns)
        ps_info("libps: server %d: member %d (%s) serves this worker now, %.1f ms after it "
                "left member %d", g, gr->cur, gr->ep[gr->cur], (double)(now - gr->moved_ns) * 1e-6,
                gr->left);
    gr->moved_ns = 0;
    gr->retry_ns = 0;
    gr->left = -1;
}

int psc_route_moving(const ps_client *c, int g)
{
    return psc_route_any(c) && g < c->route->ng && c->route->g[g].moved_ns != 0;
}

int psc_route_retry_due(ps_client *c, int g, int64_t now)
{
    struct grp *gr = &c->route->g[g];
    if (!gr->retry_ns || now < gr->retry_ns)
        return 0;
    gr->retry_ns = 0;
    return 1;
}

long psc_route_timeout_ms(const ps_client *c, int64_t now)
{
    long t = -1;
    if (!psc_route_any(c))
        return t;
    for (int g = 0; g < c->nservers; g++) {
        int64_t at = c->route->g[g].retry_ns;
        if (!at)
            continue;
        long d = at <= now ? 0 : (long)((at - now) / 1000000 + 1);
        if (t < 0 || d < t)
            t = d;
    }
    return t;
}

/* ---------- disconnects ---------- */

void psc_route_watch(ps_client *c, int g, void *zctx, void *sock)
{
    if (!psc_route_any(c) || g >= c->route->ng || c->route->g[g].n < 2 || !sock)
        return;
    struct grp *gr = &c->route->g[g];
    static unsigned serial; /* comm threads of several clients: a name each */
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://psc-route-%p-%d-%u", (void *)c, g,
             __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_DISCONNECTED) != 0)
        return;
    void *p = zmq_socket(zctx, ZMQ_PAIR);
    int linger = 0;
    if (!p || zmq_setsockopt(p, ZMQ_LINGER, &linger, sizeof linger) || zmq_connect(p, ep)) {
        if (p)
            zmq_close(p);
        zmq_socket_monitor(sock, NULL, 0);
        return;
    }
    gr->mon = p;
}

void *psc_route_watch_socket(const ps_client *c, int g)
{
    return c->route && g < c->route->ng ? c->route->g[g].mon : NULL;
}

int psc_route_watch_read(ps_client *c, int g)
{
    void *p = c->route->g[g].mon;
    int closed = 0;
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, p, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return closed;
        }
        uint16_t e = 0;
        if (zmq_msg_size(&ev) >= 2)
            memcpy(&e, zmq_msg_data(&ev), 2);
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&addr);
            zmq_msg_recv(&addr, p, 0);
            zmq_msg_close(&addr);
        }
        closed |= e == ZMQ_EVENT_DISCONNECTED;
    }
}

void psc_route_unwatch(ps_client *c, int g, void *sock)
{
    if (!c->route || g >= c->route->ng || !c->route->g[g].mon)
        return;
    if (sock)
        zmq_socket_monitor(sock, NULL, 0);
    zmq_close(c->route->g[g].mon);
    c->route->g[g].mon = NULL;
}
