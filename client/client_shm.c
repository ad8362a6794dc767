/* libps: the same-host data plane, client side (DESIGN.md "Data plane";
 * docs/PROTOCOL.md "Same host").
 *
 * At start the client creates one shared-memory arena (common/ps_shm.h) and
 * names it in its hello to every server.  A server on this host maps it and
 * says so in its reply; from then on, a push or init whose buffer lies in the
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

#include "client_internal.h"
#include "ps_error.h"
#include "ps_log.h"

int psc_shm_setup(ps_client *c)
{
    ps_hello *hq = &c->hello_req;
    hq->shm_name[0] = 0;
    free(c->shm_on);
    c->shm_on = calloc((size_t)c->nservers, 1);
    if (!c->shm_on)
        return PS_ENOMEM;
    c->shm_servers = 0;
    if (!c->opt.shm)
        return 0;
    if (!c->arena.base) {
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
        if (ps_shm_create(bytes, &c->arena, why, sizeof why) != 0) {
            ps_warn("libps: no shared-memory arena (%s): payloads go over the network", why);
            return 0;
        }
    }
    snprintf(hq->shm_name, sizeof hq->shm_name, "%s", c->arena.name);
    hq->shm_nonce = c->arena.nonce;
    hq->shm_size = c->arena.size;
    return 0;
}

void psc_shm_hello_reply(ps_client *c, int s, const ps_hello *rep)
{
    if (!c->shm_on || s < 0 || s >= c->nservers)
        return;
    int on = c->arena.base && rep->shm == 1;
    if (on != c->shm_on[s] || !c->started)
        ps_info("libps: %s: payloads %s%s%s%s", c->endpoints[s],
                on ? "through shared memory (same host)" : "over the network",
                !on && rep->shm_why[0] ? " (" : "", !on ? rep->shm_why : "",
                !on && rep->shm_why[0] ? ")" : "");
    c->shm_servers += on - c->shm_on[s];
    c->shm_on[s] = (unsigned char)on;
}

int psc_shm_use(const ps_client *c, const psc_sub *s, uint64_t *off, uint64_t *dst_off)
{
    if (!c->shm_on || !c->shm_on[s->server])
        return 0;
    size_t bytes = s->count * sizeof(float);
    switch (s->type) {
    case PS_MSG_INIT:
    case PS_MSG_PUSH:
        return ps_shm_contains(&c->arena, s->src, bytes, off);
    case PS_MSG_PULL:
        return ps_shm_contains(&c->arena, s->dst, bytes, off);
    case PS_MSG_PUSHPULL: /* both buffers, or the network */
        return ps_shm_contains(&c->arena, s->src, bytes, off) &&
               ps_shm_contains(&c->arena, s->dst, bytes, dst_off);
    default:
        return 0;
    }
}

void psc_shm_close(ps_client *c)
{
    ps_shm_close(&c->arena);
    free(c->shm_on);
    c->shm_on = NULL;
}

void *ps_client_shm_alloc(ps_client *c, size_t bytes)
{
    if (!c || !c->started)
        return NULL;
    return ps_shm_alloc(&c->arena, bytes);
}

int ps_client_shm_servers(const ps_client *c) { return c ? c->shm_servers : 0; }

void ps_client_shm_region(const ps_client *c, void **base, size_t *bytes)
{
    *base = NULL;
    *bytes = 0;
    if (c && c->started && c->arena.base) {
        *base = c->arena.base + PS_SHM_HEADER_BYTES;
        *bytes = c->arena.size - PS_SHM_HEADER_BYTES;
    }
}
