/* A server's requests to other servers of its job (move_link.h). */
#include "move_link.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* Other servers one server talks to at most at a time (a move's
 * destinations, or every server of the job for the coordinator). */
#define MAX_LINKS 64
#define MAX_ASKS 1024

typedef struct link {
    char ep[PS_ENDPOINT_MAX];
    int slot;
    void *d;
} link;

typedef struct ask {
    uint64_t seq, tag;
    int li;             /* the link it went on */
    int64_t deadline_ns;
} ask;

struct ps_links {
    void *ctx;
    int rank;
    ps_link_done done;
    void *user;
    link l[MAX_LINKS];
    int n;
    ask a[MAX_ASKS];
    size_t na;
    uint64_t next_seq;
    int polled[MAX_LINKS]; /* it[first + k] is link polled[k] */
    int npolled;
};

int ps_links_open(void *ctx, int rank, ps_link_done done, void *user, ps_links **out)
{
    ps_links *l = calloc(1, sizeof *l);
    if (!l)
        return PS_ENOMEM;
    l->ctx = ctx;
    l->rank = rank;
    l->done = done;
    l->user = user;
    l->next_seq = 1;
    *out = l;
    return 0;
}

void ps_links_close(ps_links *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->n; i++)
        if (l->l[i].d)
            zmq_close(l->l[i].d);
    free(l);
}

static int set_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

/* The link to ep, made when first needed: its index, or -1 (why). */
static int link_to(ps_links *l, const char *ep, int slot, char *why, size_t why_len)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->l[i].ep, ep))
            return i;
    char zep[PS_ENDPOINT_MAX], msg[256];
    if (ps_endpoint_check(ep, 0, zep, sizeof zep, msg, sizeof msg) != 0) {
        ps_errorf(why, why_len, "%s", msg);
        return -1;
    }
    if (l->n == MAX_LINKS) {
        ps_errorf(why, why_len, "more than %d servers to talk to at once", MAX_LINKS);
        return -1;
    }
    void *d = zmq_socket(l->ctx, ZMQ_DEALER);
    if (!d) {
        ps_errorf(why, why_len, "cannot create a socket: %s", zmq_strerror(errno));
        return -1;
    }
    char id[64];
    int n = snprintf(id, sizeof id, "psmove-%d-%d-%d", l->rank, slot, l->n);
    int64_t maxmsg = (int64_t)PS_MAX_PAYLOAD_BYTES + PS_HEADER_MAX;
    if (set_int(d, ZMQ_LINGER, 0) || set_int(d, ZMQ_SNDHWM, 0) || set_int(d, ZMQ_RCVHWM, 0) ||
        zmq_setsockopt(d, ZMQ_ROUTING_ID, id, (size_t)n) ||
        zmq_setsockopt(d, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) || zmq_connect(d, zep)) {
        ps_errorf(why, why_len, "cannot connect to %s: %s", ep, zmq_strerror(errno));
        zmq_close(d);
        return -1;
    }
    link *k = &l->l[l->n];
    snprintf(k->ep, sizeof k->ep, "%s", ep);
    k->slot = slot;
    k->d = d;
    return l->n++;
}

int ps_links_ask(ps_links *l, const char *ep, int slot, ps_header *h, zmq_msg_t *payload,
                 int timeout_ms, uint64_t tag, char *why, size_t why_len)
{
    if (l->na == MAX_ASKS) {
        ps_errorf(why, why_len, "more than %d requests to other servers waiting", MAX_ASKS);
        return PS_ETOOBIG;
    }
    int li = link_to(l, ep, slot, why, why_len);
    if (li < 0)
        return PS_EIO;
    h->seq = l->next_seq++;
    h->rank = -1;
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_errorf(why, why_len, "cannot encode a %s request", ps_msg_type_name(h->type));
        return PS_EPROTO;
    }
    /* SNDHWM 0: queued while the connection is made; never EAGAIN */
    if (zmq_send(l->l[li].d, buf, len, payload ? ZMQ_SNDMORE : 0) < 0 ||
        (payload && zmq_msg_send(payload, l->l[li].d, 0) < 0)) {
        ps_errorf(why, why_len, "cannot send %s to %s: %s", ps_msg_type_name(h->type), ep,
                  zmq_strerror(errno));
        return PS_EIO;
    }
    l->a[l->na++] = (ask){h->seq, tag, li, ps_now_ns() + (int64_t)timeout_ms * 1000000};
    return 0;
}

size_t ps_links_pending(const ps_links *l) { return l ? l->na : 0; }

void ps_links_poll_items(ps_links *l, zmq_pollitem_t *it, int *n, int max)
{
    l->npolled = 0;
    for (int i = 0; i < l->n && l->npolled < max; i++) {
        it[(*n)++] = (zmq_pollitem_t){l->l[i].d, 0, ZMQ_POLLIN, 0};
        l->polled[l->npolled++] = i;
    }
}

/* The ask answered by seq on link li: its index, or -1 (a late reply). */
static long find_ask(const ps_links *l, int li, uint64_t seq)
{
    for (size_t k = 0; k < l->na; k++)
        if (l->a[k].seq == seq && l->a[k].li == li)
            return (long)k;
    return -1;
}

static void read_link(ps_links *l, int li)
{
    for (;;) {
        zmq_msg_t f[2];
        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], l->l[li].d, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[0]);
            return;
        }
        int nf = 1;
        while (zmq_msg_more(&f[nf - 1])) { /* a header and at most one payload */
            zmq_msg_t x;
            zmq_msg_init(&x);
            if (zmq_msg_recv(&x, l->l[li].d, 0) < 0) {
                zmq_msg_close(&x);
                break;
            }
            if (nf < 2)
                f[nf++] = x;
            else
                zmq_msg_close(&x);
        }
        ps_header h;
        char why[256];
        int rc = ps_proto_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &h, why, sizeof why);
        long k = rc ? -1 : find_ask(l, li, h.seq);
        if (rc)
            ps_warn("a reply from %s does not decode: %s; dropped", l->l[li].ep, why);
        else if (k < 0)
            ps_debug("a late %s reply from %s (q %" PRIu64 "); dropped",
                     ps_msg_type_name(h.type), l->l[li].ep, h.seq);
        if (k >= 0) {
            ask a = l->a[k];
            l->a[k] = l->a[--l->na];
            l->done(l->user, a.tag, &h, nf > 1 ? &f[1] : NULL, 0, NULL);
        }
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
}

void ps_links_dispatch(ps_links *l, const zmq_pollitem_t *it, int first, int n, int64_t now)
{
    for (int k = 0; k < l->npolled && k < n; k++)
        if (it[first + k].revents & ZMQ_POLLIN)
            read_link(l, l->polled[k]);
    for (size_t k = 0; k < l->na;) {
        if (now < l->a[k].deadline_ns) {
            k++;
            continue;
        }
        ask a = l->a[k];
        l->a[k] = l->a[--l->na];
        char why[PS_ENDPOINT_MAX + 64];
        snprintf(why, sizeof why, "no answer from %s in time", l->l[a.li].ep);
        l->done(l->user, a.tag, NULL, NULL, PS_ETIMEDOUT, why);
    }
}

long ps_links_timeout_ms(const ps_links *l, int64_t now)
{
    long t = -1;
    for (size_t k = 0; k < l->na; k++) {
        long d = l->a[k].deadline_ns <= now ? 0 : (long)((l->a[k].deadline_ns - now) / 1000000 + 1);
        if (t < 0 || d < t)
            t = d;
    }
    return t;
}
