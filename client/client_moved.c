/* libps: which server slot holds each object now, and the slots added and
 * removed (client_moved.h has the contract).
 *
 * Overrides are kept per object only once one moved: a dense array over
 * c->place's chunks, and one per table over its flat home partitions, each
 * made on the first move of that kind and holding -1 (at home) elsewhere.
 * Until anything moves c->moved_any is 0 and the send path never calls in
 * here (psc_route_obj). */
#include "client_moved.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* One line per (from, to) pair per this much, with the count since. */
#define SAY_EVERY_NS 1000000000LL
#define SAY_PAIRS 8

typedef struct added_slot {
    int state;                 /* PSC_SLOT_* */
    char ep[PS_ENDPOINT_MAX];  /* checked, as ZeroMQ takes it */
} added_slot;

struct psc_moved {
    int nslots;          /* homes + added (the highest named + 1) */
    added_slot *added;   /* slot nservers + k, for k < nslots - nservers */
    unsigned char *home_left; /* per home: it left the job */
    int32_t *chunk_at;   /* per flat chunk: its slot, -1 at home; NULL none moved */
    int32_t **part_at;   /* per table: per flat home partition, the same */
    size_t nparts;       /* flat home partitions (every table has as many) */
    struct said {        /* the redirect lines: one per pair per second */
        int from, to;
        int64_t at_ns;
        uint64_t unsaid;
    } said[SAY_PAIRS];
};

int psc_moved_new(ps_client *c)
{
    struct psc_moved *m = calloc(1, sizeof *m);
    unsigned char *hl = calloc((size_t)c->nservers, 1);
    if (!m || !hl) {
        free(m);
        free(hl);
        return PS_ENOMEM;
    }
    m->nslots = c->nservers;
    m->home_left = hl;
    c->moved = m;
    return 0;
}

void psc_moved_free(ps_client *c)
{
    struct psc_moved *m = c->moved;
    if (!m)
        return;
    free(m->added);
    free(m->home_left);
    free(m->chunk_at);
    for (size_t t = 0; m->part_at && t < c->ntables; t++)
        free(m->part_at[t]);
    free(m->part_at);
    free(m);
    c->moved = NULL;
}

int psc_nslots(const ps_client *c) { return c->moved ? c->moved->nslots : c->nservers; }

int psc_slot_state(const ps_client *c, int s)
{
    const struct psc_moved *m = c->moved;
    if (s < 0 || !m || s >= m->nslots)
        return s >= 0 && s < c->nservers ? PSC_SLOT_LIVE : PSC_SLOT_UNKNOWN;
    if (s < c->nservers)
        return m->home_left[s] ? PSC_SLOT_REMOVED : PSC_SLOT_LIVE;
    return m->added[s - c->nservers].state;
}

const char *psc_moved_endpoint(const ps_client *c, int s)
{
    const struct psc_moved *m = c->moved;
    if (!m || s < c->nservers || s >= m->nslots || !m->added[s - c->nservers].ep[0])
        return NULL;
    return m->added[s - c->nservers].ep;
}

const char *psc_slot_name(const ps_client *c, int s)
{
    if (s >= 0 && s < c->nservers)
        return c->endpoints[s];
    const char *ep = psc_moved_endpoint(c, s);
    return ep ? ep : "(no such server slot)";
}

int psc_moved_check(const ps_client *c, int from, const ps_header *h, char *why, size_t why_len)
{
    const char *fname = psc_slot_name(c, from);
    int s = h->slot;
    if (s < 0) {
        if (from == 0) { /* server 0 holds the barriers and collectives: it never leaves */
            ps_errorf(why, why_len, "%s (server 0) says it left the job (PS_EMOVED without a "
                      "slot); server 0 is never removed", fname);
            return PSC_MOVED_BAD;
        }
        return PSC_MOVED_LEFT;
    }
    if (s >= c->nservers + PSC_MAX_ADDED_SLOTS) {
        ps_errorf(why, why_len, "%s says the object moved to server slot %d, beyond the %d "
                  "servers listed plus %d added this client takes", fname, s, c->nservers,
                  PSC_MAX_ADDED_SLOTS);
        return PSC_MOVED_BAD;
    }
    if (s == from)
        return PSC_MOVED_LOADING;
    int st = psc_slot_state(c, s);
    if (st == PSC_SLOT_REMOVED)
        return PSC_MOVED_GONE;
    if (s < c->nservers)
        return PSC_MOVED_KNOWN; /* a home: its endpoint is the listed one */
    char ep[PS_ENDPOINT_MAX], cwhy[256];
    if (!h->owner_ep[0]) {
        if (st != PSC_SLOT_UNKNOWN)
            return PSC_MOVED_KNOWN;
        ps_errorf(why, why_len, "%s says the object moved to server slot %d, new to this "
                  "worker, without its endpoint (field 'to')", fname, s);
        return PSC_MOVED_BAD;
    }
    if (ps_endpoint_check(h->owner_ep, 0, ep, sizeof ep, cwhy, sizeof cwhy) != 0) {
        ps_errorf(why, why_len, "%s says the object moved to server slot %d at an endpoint "
                  "that does not check: %s", fname, s, cwhy);
        return PSC_MOVED_BAD;
    }
    if (st == PSC_SLOT_UNKNOWN)
        return PSC_MOVED_NEW;
    const char *known = psc_moved_endpoint(c, s);
    if (strcmp(known, ep) != 0) {
        ps_errorf(why, why_len, "%s says server slot %d is at %s, but it is at %s (a slot "
                  "keeps its endpoint)", fname, s, ep, known);
        return PSC_MOVED_BAD;
    }
    return PSC_MOVED_KNOWN;
}

int psc_moved_add(ps_client *c, int s, const char *ep)
{
    struct psc_moved *m = c->moved;
    if (s >= m->nslots) {
        size_t n = (size_t)(s + 1 - c->nservers);
        added_slot *a = realloc(m->added, n * sizeof *a);
        if (!a)
            return PS_ENOMEM;
        memset(a + (m->nslots - c->nservers), 0,
               (n - (size_t)(m->nslots - c->nservers)) * sizeof *a);
        m->added = a;
        m->nslots = s + 1;
    }
    added_slot *a = &m->added[s - c->nservers];
    char why[256];
    if (ps_endpoint_check(ep, 0, a->ep, sizeof a->ep, why, sizeof why) != 0)
        snprintf(a->ep, sizeof a->ep, "%s", ep); /* psc_moved_check checked it */
    a->state = PSC_SLOT_JOINING;
    c->moved_any = 1;
    ps_info("libps: server slot %d (%s) was added to the job; saying hello to it", s, a->ep);
    return 0;
}

void psc_moved_joined(ps_client *c, int s)
{
    if (psc_slot_state(c, s) != PSC_SLOT_JOINING)
        return;
    c->moved->added[s - c->nservers].state = PSC_SLOT_LIVE;
    ps_info("libps: server slot %d (%s) took this worker", s, psc_slot_name(c, s));
}

void psc_moved_remove(ps_client *c, int s)
{
    struct psc_moved *m = c->moved;
    if (s <= 0 || s >= m->nslots || psc_slot_state(c, s) == PSC_SLOT_REMOVED)
        return;
    if (s < c->nservers)
        m->home_left[s] = 1;
    else
        m->added[s - c->nservers].state = PSC_SLOT_REMOVED;
    c->moved_any = 1;
    /* what was said to be there is looked for where it is found from now */
    size_t forgot = 0;
    for (size_t k = 0; m->chunk_at && k < c->place.num_chunks; k++)
        if (m->chunk_at[k] == s) {
            m->chunk_at[k] = -1;
            forgot++;
        }
    for (size_t t = 0; m->part_at && t < c->ntables; t++)
        for (size_t p = 0; m->part_at[t] && p < m->nparts; p++)
            if (m->part_at[t][p] == s) {
                m->part_at[t][p] = -1;
                forgot++;
            }
    ps_info("libps: server slot %d (%s) left the job; %zu moved object%s thought to be there "
            "%s asked for at %s home%s", s, psc_slot_name(c, s), forgot, forgot == 1 ? "" : "s",
            forgot == 1 ? "is" : "are", forgot == 1 ? "its" : "their", forgot == 1 ? "" : "s");
}

/* The flat home partitions (the homes' server_parts summed). */
static size_t home_parts(const ps_client *c)
{
    size_t n = 0;
    for (int s = 0; c->server_parts && s < c->nservers; s++)
        n += c->server_parts[s];
    return n;
}

static int32_t *new_overrides(size_t n)
{
    int32_t *a = malloc((n ? n : 1) * sizeof *a);
    for (size_t k = 0; a && k < n; k++)
        a[k] = -1;
    return a;
}

/* The override cell of an object, made when `make` (NULL: none, or out of
 * memory, or out of range). */
static int32_t *cell(ps_client *c, int kind, uint32_t table, uint32_t obj, int make)
{
    struct psc_moved *m = c->moved;
    if (kind == PSC_OBJ_CHUNK) {
        if (obj >= c->place.num_chunks)
            return NULL;
        if (!m->chunk_at && (!make || !(m->chunk_at = new_overrides(c->place.num_chunks))))
            return NULL;
        return &m->chunk_at[obj];
    }
    if (kind != PSC_OBJ_PART || table >= c->ntables)
        return NULL;
    if (!m->part_at) {
        if (!make || !(m->part_at = calloc(c->ntables, sizeof *m->part_at)))
            return NULL;
        m->nparts = home_parts(c);
    }
    if (obj >= m->nparts)
        return NULL;
    if (!m->part_at[table] && (!make || !(m->part_at[table] = new_overrides(m->nparts))))
        return NULL;
    return &m->part_at[table][obj];
}

int psc_moved_set(ps_client *c, int kind, uint32_t table, uint32_t obj, int s)
{
    int32_t *at = cell(c, kind, table, obj, 1);
    if (!at)
        return PS_ENOMEM;
    *at = s;
    c->moved_any = 1;
    return 0;
}

int psc_moved_route(const ps_client *c, int kind, uint32_t table, uint32_t obj, int home)
{
    int32_t *at = kind == PSC_OBJ_NONE ? NULL : cell((ps_client *)c, kind, table, obj, 0);
    int s = at && *at >= 0 ? *at : home;
    if (psc_slot_state(c, s) == PSC_SLOT_REMOVED)
        s = psc_slot_state(c, home) == PSC_SLOT_REMOVED ? 0 : home;
    return s;
}

void psc_moved_said(ps_client *c, int from, int to)
{
    struct psc_moved *m = c->moved;
    int64_t now = ps_now_ns();
    struct said *w = NULL, *oldest = &m->said[0];
    for (int k = 0; k < SAY_PAIRS && !w; k++) {
        if (m->said[k].at_ns && m->said[k].from == from && m->said[k].to == to)
            w = &m->said[k];
        else if (m->said[k].at_ns < oldest->at_ns)
            oldest = &m->said[k];
    }
    if (w && now - w->at_ns < SAY_EVERY_NS) {
        w->unsaid++;
        return;
    }
    uint64_t more = w ? w->unsaid : 0;
    if (!w) { /* a new pair takes the place of the one said longest ago */
        w = oldest;
        if (w->unsaid)
            ps_info("libps: %llu more objects moved from server slot %d to slot %d",
                    (unsigned long long)w->unsaid, w->from, w->to);
        w->from = from;
        w->to = to;
    }
    char since[64] = "";
    if (more)
        snprintf(since, sizeof since, " (and %llu more since the last such line)",
                 (unsigned long long)more);
    ps_info("libps: an object moved from server slot %d (%s) to slot %d (%s): its requests "
            "follow it%s", from, psc_slot_name(c, from), to, psc_slot_name(c, to), since);
    w->at_ns = now;
    w->unsaid = 0;
}
