/* libps: rejoining a server that dropped or forgot this rank, on the comm
 * thread.
 *
 * A server answers PS_EHELLO to any request but hello from a rank it does
 * not count as live: one it dropped (--on-worker-loss drop, after the worker
 * was silent, e.g. stopped with SIGSTOP), one it does not know (it
 * restarted without a checkpoint that knew us), or one whose old connection
 * closed (ours, before ZeroMQ reconnected); and PS_EPERM when it counts
 * another connection as the rank's (our old one, if it has not seen it
 * close: the hello's token proves we are that worker; another process that
 * holds the rank keeps it, and our hello is refused).  Such a sub-request
 * is not failed.  It is parked (no resends), a hello goes to that server (the one
 * start sent; one at a time per server) and, once the server accepts it,
 * every sub-request parked on that server is sent again.  A refused
 * heartbeat starts the hello before any request runs into the refusal.
 *
 * The server takes the rank back at its current version (docs/PROTOCOL.md
 * "Liveness"), as it does a restarted worker: in sync mode the pushes of
 * rounds that completed without this worker are acknowledged as
 * duplicates and its pulls of those versions answered at once, so the
 * worker runs through them quickly, with the newest weights, until its
 * step reaches the open round, which then waits for it again.
 *
 * A server that refuses us again and again right after accepting our hello
 * (REJOIN_MAX hellos with no request served in between) is not asked
 * forever: the refused sub-requests fail with its PS_EHELLO.  A hello that
 * is refused or gets no answer fails the sub-requests parked on it.
 *
 * This is the one place that re-establishes a server's view of this worker;
 * whatever a server must be told again after it lost us (a per-connection
 * attachment, say) belongs here, after the hello.
 *
 * Tables too: a server acknowledges a table's declaration at once, so one
 * restored from a checkpoint written before a declaration does not know
 * that table.  A sparse sub-request it answers PS_ENOTFOUND is parked the
 * same way, every table is declared to that server again (one TABLE each,
 * one re-declaration at a time per server) and, once all are taken, what
 * is parked there is sent again; a refused declaration fails it.
 *
 * It sends nothing itself: psc_rejoin_hello makes the hello's slot and
 * psc_rejoin_unpark hands back the parked sub-requests, for the comm loop
 * to send. */
#include <stdio.h>
#include <stdlib.h>

#include "client_moved.h"
#include "client_rejoin.h"
#include "client_requests.h"
#include "client_route.h"
#include "client_shm.h"
#include "client_token.h"
#include "ps_log.h"

#define REJOIN_MAX 3

/* What rejoining one server takes (*c->rejoin[server]). */
struct psc_rejoin {
    int rejoins;    /* hellos since a request of ours was last served there */
    ps_request req; /* the hello's request, libps's own */
    int redeclares; /* re-declarations since a request was last served there */
    ps_request decl; /* a re-declaration of every table: one part per table */
};

int psc_rejoin_new(ps_client *c) { return psc_rejoin_grow(c, c->nservers); }

int psc_rejoin_grow(ps_client *c, int nslots)
{
    if (nslots <= c->nrejoin)
        return 0;
    /* one block per server: the requests in it stay where they are (slots
     * point at them) while the table of them grows */
    struct psc_rejoin **r = realloc(c->rejoin, (size_t)nslots * sizeof *r);
    if (!r)
        return PS_ENOMEM;
    c->rejoin = r;
    for (; c->nrejoin < nslots; c->nrejoin++)
        if (!(r[c->nrejoin] = calloc(1, sizeof *r[c->nrejoin])))
            return PS_ENOMEM;
    return 0;
}

void psc_rejoin_free(ps_client *c)
{
    for (int s = 0; s < c->nrejoin; s++)
        free(c->rejoin[s]);
    free(c->rejoin);
    c->rejoin = NULL;
    c->nrejoin = 0;
}

/* A hello of ours to it is on its way: its request was posted and has not
 * completed (answered, failed or given up on). */
static int hello_on_its_way(const struct psc_rejoin *sv)
{
    return sv->req._priv.client && !__atomic_load_n(&sv->req._priv.done, __ATOMIC_ACQUIRE);
}

static int decl_on_its_way(const struct psc_rejoin *sv)
{
    return sv->decl._priv.client && !__atomic_load_n(&sv->decl._priv.done, __ATOMIC_ACQUIRE);
}

/* The first sub-request at or after slot `from` parked on `server`;
 * PSC_NO_SLOT when none is left. */
static uint32_t next_parked(const ps_client *c, int server, uint32_t from)
{
    const struct psc_slots *sl = c->slots;
    for (uint32_t i = from; i < sl->n; i++)
        if (sl->sub[i].req && sl->sub[i].server == server && sl->sub[i].parked)
            return i;
    return PSC_NO_SLOT;
}

/* Fail every sub-request parked on server `server` with code and text. */
static void fail_parked(ps_client *c, int server, int code, const char *text)
{
    for (uint32_t i = next_parked(c, server, 0); i != PSC_NO_SLOT;
         i = next_parked(c, server, i + 1)) {
        psc_set_error(c->slots->sub[i].req, code, "%s", text);
        psc_slot_finish(c, i);
    }
}

uint32_t psc_rejoin_hello(ps_client *c, int server, const ps_header *refusal)
{
    struct psc_rejoin *sv = c->rejoin[server];
    if (!__atomic_load_n(&c->started, __ATOMIC_ACQUIRE) || hello_on_its_way(sv) ||
        sv->rejoins >= REJOIN_MAX)
        return PSC_NO_SLOT;
    if (refusal)
        ps_warn("libps: %s does not count this worker as live (%s); saying hello again to "
                "rejoin", psc_route_endpoint(c, server),
                refusal->err_text[0] ? refusal->err_text : ps_strerror(refusal->err_code));
    uint32_t i = psc_slot_new(c, server, PS_MSG_HELLO, &sv->req);
    if (i == PSC_NO_SLOT) {
        fail_parked(c, server, PS_ENOMEM, "out of memory for a hello to rejoin");
        return PSC_NO_SLOT;
    }
    psc_req_reset(c, &sv->req, 1);
    sv->rejoins++;
    return i;
}

void psc_rejoin_unsent(ps_client *c, int server)
{
    const ps_request *r = &c->rejoin[server]->req;
    char why[2 * PSC_ERRBUF];
    snprintf(why, sizeof why, "cannot rejoin %s: %s", psc_route_endpoint(c, server), r->err);
    fail_parked(c, server, r->status ? r->status : PS_EIO, why);
}

int psc_rejoin_park(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->slots->sub[i];
    struct psc_rejoin *sv = c->rejoin[s->server];
    if (!__atomic_load_n(&c->started, __ATOMIC_ACQUIRE) || s->type == PS_MSG_HELLO)
        return -1;
    if (!hello_on_its_way(sv) && sv->rejoins >= REJOIN_MAX) {
        if (sv->rejoins++ == REJOIN_MAX) /* once, not per refused request */
            ps_error("libps: %s refused this worker again after %d hellos in a row; its "
                     "requests fail", psc_route_endpoint(c, s->server), REJOIN_MAX);
        return -1;
    }
    s->parked = 1;
    s->deadline_ns = INT64_MAX; /* no resends while parked */
    return 0;
}

void psc_rejoin_served(ps_client *c, int server)
{
    c->rejoin[server]->rejoins = 0;
    c->rejoin[server]->redeclares = 0;
}

int psc_redeclare_park(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->slots->sub[i];
    struct psc_rejoin *sv = c->rejoin[s->server];
    if (!__atomic_load_n(&c->started, __ATOMIC_ACQUIRE) || !s->sp || !c->ntables)
        return -1;
    if (!decl_on_its_way(sv) && sv->redeclares >= REJOIN_MAX) {
        if (sv->redeclares++ == REJOIN_MAX)
            ps_error("libps: %s does not know our tables again after %d declarations in a row; "
                     "its table requests fail", psc_slot_name(c, s->server), REJOIN_MAX);
        return -1;
    }
    s->parked = 1;
    s->deadline_ns = INT64_MAX;
    return 0;
}

int psc_redeclare_begin(ps_client *c, int server, const ps_header *refusal)
{
    struct psc_rejoin *sv = c->rejoin[server];
    if (decl_on_its_way(sv))
        return -1;
    ps_warn("libps: %s does not know a table of ours (%s; restored from a checkpoint older "
            "than its declaration?): declaring our %zu tables to it again",
            psc_slot_name(c, server),
            refusal->err_text[0] ? refusal->err_text : ps_strerror(refusal->err_code),
            c->ntables);
    psc_req_reset(c, &sv->decl, (int)c->ntables);
    sv->redeclares++;
    return 0;
}

uint32_t psc_redeclare_slot(ps_client *c, int server, size_t t)
{
    struct psc_rejoin *sv = c->rejoin[server];
    uint32_t i = psc_slot_new(c, server, PS_MSG_TABLE, &sv->decl);
    if (i == PSC_NO_SLOT) { /* this part will not go: done, with the error */
        psc_set_error(&sv->decl, PS_ENOMEM, "out of memory declaring tables again");
        psc_part_done(c, &sv->decl);
        return PSC_NO_SLOT;
    }
    c->slots->sub[i].key = c->tables[t].key;
    return i;
}

int psc_redeclare_reply(ps_client *c, uint32_t i, const ps_header *h, int *ok)
{
    int server = c->slots->sub[i].server;
    struct psc_rejoin *sv = c->rejoin[server];
    *ok = 0;
    if (c->slots->sub[i].req != &sv->decl)
        return 0;
    if (h->type == PS_MSG_ERROR)
        psc_set_error(&sv->decl, h->err_code ? h->err_code : PS_EPROTO,
                      "declaring table %llu to %s again: %s",
                      (unsigned long long)c->slots->sub[i].key, psc_slot_name(c, server),
                      h->err_text[0] ? h->err_text : ps_strerror(h->err_code));
    psc_slot_finish(c, i);
    if (!__atomic_load_n(&sv->decl._priv.done, __ATOMIC_ACQUIRE))
        return 1; /* more to come */
    if (sv->decl.status) {
        ps_error("libps: %s", sv->decl.err);
        fail_parked(c, server, sv->decl.status, sv->decl.err);
        return 1;
    }
    ps_info("libps: %s took our %zu tables again; what waited for them is sent again",
            psc_slot_name(c, server), c->ntables);
    *ok = 1;
    return 1;
}

void psc_redeclare_unsent(ps_client *c, int server)
{
    struct psc_rejoin *sv = c->rejoin[server];
    if (__atomic_load_n(&sv->decl._priv.done, __ATOMIC_ACQUIRE))
        fail_parked(c, server, sv->decl.status ? sv->decl.status : PS_EIO, sv->decl.err);
}

uint32_t psc_rejoin_slot(ps_client *c, int server)
{
    if (!hello_on_its_way(c->rejoin[server]))
        return PSC_NO_SLOT;
    const struct psc_slots *sl = c->slots;
    for (uint32_t i = 0; i < sl->n; i++)
        if (sl->sub[i].req == &c->rejoin[server]->req)
            return i;
    return PSC_NO_SLOT;
}

int psc_rejoin_reply(ps_client *c, uint32_t i, const ps_header *h)
{
    int server = c->slots->sub[i].server;
    if (c->slots->sub[i].req != &c->rejoin[server]->req)
        return 0;
    const char *ep = psc_route_endpoint(c, server);
    char why[PSC_ERRBUF] = "";
    int code = 0;
    if (h->type == PS_MSG_ERROR) {
        code = h->err_code ? h->err_code : PS_EPROTO;
        snprintf(why, sizeof why, "%s", h->err_text[0] ? h->err_text : ps_strerror(code));
    } else if (h->type != PS_MSG_HELLO || !(h->flags & PS_FLAG_REPLY)) {
        code = PS_EPROTO;
        snprintf(why, sizeof why, "answered hello with a %s message", ps_msg_type_name(h->type));
    } else if (h->hello.server_rank != server) {
        code = PS_EMISMATCH;
        snprintf(why, sizeof why, "it is server rank %d now, listed at position %d",
                 h->hello.server_rank, server);
    } else {
        /* start checked the same; a server restarted with other flags fails here */
        ps_hello mine = c->hello_req;
        if (ps_hello_compare(&mine, "this worker", &h->hello, ep, 1, why, sizeof why))
            code = PS_EMISMATCH;
    }
    psc_slot_finish(c, i); /* our own request: the hello is no longer on its way */
    if (code) {
        char text[2 * PSC_ERRBUF];
        snprintf(text, sizeof text, "cannot rejoin %s: %s", ep, why);
        ps_error("libps: %s", text);
        fail_parked(c, server, code, text);
        return 1;
    }
    /* the rank's token for our next hello there (new if it was not held),
     * and what the server must be told again: whether it (still) maps our
     * arena */
    psc_tokens_keep(c, server, &h->hello);
    psc_shm_hello_reply(c, server, &h->hello);
    int joined = psc_slot_state(c, server) == PSC_SLOT_JOINING;
    psc_moved_joined(c, server); /* an added slot: it serves us now (said there) */
    int n = 0;
    for (uint32_t k = next_parked(c, server, 0); k != PSC_NO_SLOT;
         k = next_parked(c, server, k + 1))
        n++;
    if (!joined)
        ps_info("libps: rejoined %s: it counts this worker again (%d waiting request%s sent again)",
            ep, n, n == 1 ? "" : "s");
    return 1;
}

uint32_t psc_rejoin_unpark(ps_client *c, int server, uint32_t from)
{
    /* not taken back yet, or our tables not declared again yet */
    if (hello_on_its_way(c->rejoin[server]) || decl_on_its_way(c->rejoin[server]))
        return PSC_NO_SLOT;
    uint32_t i = next_parked(c, server, from);
    if (i != PSC_NO_SLOT)
        c->slots->sub[i].parked = 0;
    return i;
}
