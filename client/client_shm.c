/* libps: the same-host data plane, client side (DESIGN.md "Data plane";
 * docs/PROTOCOL.md "Same host").
 *
 * At start the client creates one shared-memory arena (common/ps_shm.h: a
 * sealed memfd, allocated then, so a machine without the memory says so at
 * once and the client uses the network) and names it in its hello to every
 * server.  A server on this host maps it and says so in its reply; from
 * then on, a push or init whose buffer lies in the
 * arena sends only its header, with the buffer's offset (the server reads the
 * gradient in place), and a pull whose destination lies there asks the
 * server to write the weights straight into it.  Buffers outside the arena,
 * and servers that did not map it (other hosts, --shm off), take the network
 * as before, per request, so nothing else has to know which path is used.
 *
 * The arena's buffers come from ps_client_shm_alloc: the exchange puts its
 * weight and gradient buffers there, so on one host a gradient is written
 * once (by backward) and read once (by the server's optimizer), and pulled
 * weights are written once (by the server) into the back buffer. */
#include <stdlib.h>
#include <string.h>

#include "client_shm.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_shm.h"

struct psc_shm {
    ps_shm_arena arena; /* base NULL: none */
    int failed;         /* it could not be made (said once): the network, from then on */
    int servers;        /* how many map it */
    unsigned char on[]; /* per server: its payloads go through the arena */
};

int psc_shm_setup(ps_client *c)
{
    ps_hello *hq = &c->hello_req;
    hq->shm_name[0] = 0;
    if (!c->shm && !(c->shm = calloc(1, sizeof *c->shm + (size_t)c->nservers)))
        return PS_ENOMEM;
    struct psc_shm *m = c->shm;
    memset(m->on, 0, (size_t)c->nservers);
    m->servers = 0;
    if (!c->opt.shm || m->failed)
        return 0;
    if (!m->arena.base) {
        size_t bytes = c->opt.shm_bytes;
        if (!bytes) {
            /* six buffers a tensor: front and back weights, three gradients
             * (the exchange's), one spare; pages not touched cost nothing */
            for (size_t t = 0; t < c->nspecs; t++)
                bytes += 6 * ((c->specs[t].count * sizeof(float) + PS_SHM_ALIGN - 1) &
                              ~(size_t)(PS_SHM_ALIGN - 1));
            bytes += 64 << 10;
        }
        char why[256];
        if (ps_shm_create(bytes, &m->arena, why, sizeof why) != 0) {
            /* a machine short of memory trains on, over the network */
            ps_warn("libps: no shared-memory arena (%s): payloads go over the network", why);
            m->failed = 1;
            return 0;
        }
    }
    snprintf(hq->shm_name, sizeof hq->shm_name, "%s", m->arena.name);
    hq->shm_nonce = m->arena.nonce;
    hq->shm_size = m->arena.size;
    return 0;
}

void psc_shm_hello_reply(ps_client *c, int s, const ps_hello *rep)
{
    struct psc_shm *m = c->shm;
    if (!m || s < 0 || s >= c->nservers)
        return;
    int on = m->arena.base && rep->shm == 1;
    if (on != m->on[s] || !__atomic_load_n(&c->started, __ATOMIC_ACQUIRE))
        ps_info("libps: %s: payloads %s%s%s%s", c->endpoints[s],
                on ? "through shared memory (same host)" : "over the network",
                !on && rep->shm_why[0] ? " (" : "", !on ? rep->shm_why : "",
                !on && rep->shm_why[0] ? ")" : "");
    m->servers += on - m->on[s];
    m->on[s] = (unsigned char)on;
}

int psc_shm_holds(const ps_client *c, const void *p, size_t bytes, uint64_t *off)
{
    return c->shm && ps_shm_contains(&c->shm->arena, p, bytes, off);
}

int psc_shm_use(const ps_client *c, const psc_sub *s, uint64_t *off, uint64_t *dst_off)
{
    if (!c->shm || !c->shm->on[s->server])
        return 0;
    size_t bytes = s->count * sizeof(float);
    switch (s->type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
        return psc_shm_holds(c, s->src, bytes, off);
    case PS_MSG_PULL:
        return psc_shm_holds(c, s->dst, bytes, off);
    case PS_MSG_PUSHPULL: /* both buffers, or the network */
        return psc_shm_holds(c, s->src, bytes, off) && psc_shm_holds(c, s->dst, bytes, dst_off);
    default:
        return 0;
    }
}

void psc_shm_close(ps_client *c)
{
    if (!c->shm)
        return;
    ps_shm_close(&c->shm->arena);
    free(c->shm);
    c->shm = NULL;
}

void *ps_client_shm_alloc(ps_client *c, size_t bytes)
{
    if (!c || !c->started || !c->shm)
        return NULL;
    return ps_shm_alloc(&c->shm->arena, bytes);
}

int ps_client_shm_servers(const ps_client *c) { return c && c->shm ? c->shm->servers : 0; }

void ps_client_shm_region(const ps_client *c, void **base, size_t *bytes)
{
    *base = NULL;
    *bytes = 0;
    if (c && c->started && c->shm && c->shm->arena.base) {
        *base = c->shm->arena.base + PS_SHM_HEADER_BYTES;
        *bytes = c->shm->arena.size - PS_SHM_HEADER_BYTES;
    }
}
