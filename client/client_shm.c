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

/* The stage for tables' requests with an arena of the default size: this
 * much per table (4096 ids of dim 128 pulled and pushed at once are 6 MiB),
 * at most STAGE_BYTES_MAX; with options.shm_bytes a quarter of the arena.
 * Pages never touched cost nothing. */
#define STAGE_BYTES_PER_TABLE (8u << 20)
#define STAGE_BYTES_MAX (32u << 20)

/* A block of the stage in use (a table request's ids and rows). */
typedef struct stage_block {
    uint64_t off, len;
} stage_block;

struct psc_shm {
    ps_shm_arena arena; /* base NULL: none */
    /* the stage: the part of the arena where tables' requests are written
     * (comm thread): [stage_off, + stage_len), its blocks in use sorted by
     * offset */
    uint64_t stage_off, stage_len;
    stage_block *blocks;
    size_t nblocks, cap_blocks;
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
        size_t bytes = c->opt.shm_bytes, stage = 0;
        if (c->ntables) /* the tables' requests: a part of a given arena, or more */
            stage = bytes ? bytes / 4 : STAGE_BYTES_PER_TABLE * c->ntables < STAGE_BYTES_MAX
                                             ? STAGE_BYTES_PER_TABLE * c->ntables
                                             : STAGE_BYTES_MAX;
        if (!bytes) {
            /* six buffers a tensor: front and back weights, three gradients
             * (the exchange's), one spare; pages not touched cost nothing */
            for (size_t t = 0; t < c->nspecs; t++)
                bytes += 6 * ((c->specs[t].count * sizeof(float) + PS_SHM_ALIGN - 1) &
                              ~(size_t)(PS_SHM_ALIGN - 1));
            bytes += (64 << 10) + stage;
        }
        char why[256];
        if (ps_shm_create(bytes, &m->arena, why, sizeof why) != 0) {
            /* a machine short of memory trains on, over the network */
            ps_warn("libps: no shared-memory arena (%s): payloads go over the network", why);
            m->failed = 1;
            return 0;
        }
        unsigned char *st = stage ? ps_shm_alloc(&m->arena, stage) : NULL;
        if (st) {
            m->stage_off = (uint64_t)(st - m->arena.base);
            m->stage_len = stage;
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
    if (!psc_shm_on(c, s->server))
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

int psc_shm_on(const ps_client *c, int server)
{
    /* a server slot added while training (>= nservers) is never told of the
     * arena (client_send.c leaves it out of their hello): the network */
    return c->shm && server < c->nservers && c->shm->on[server];
}

void *psc_shm_block(ps_client *c, int server, size_t bytes, uint64_t *off)
{
    struct psc_shm *m = c->shm;
    if (!psc_shm_on(c, server) || !bytes || bytes > m->stage_len)
        return NULL;
    if (m->nblocks == m->cap_blocks) {
        size_t ncap = m->cap_blocks ? 2 * m->cap_blocks : 16;
        stage_block *b = realloc(m->blocks, ncap * sizeof *b);
        if (!b)
            return NULL;
        m->blocks = b;
        m->cap_blocks = ncap;
    }
    /* first fit: the gaps before each block in use, and after the last */
    uint64_t len = (bytes + PS_SHM_ALIGN - 1) & ~(uint64_t)(PS_SHM_ALIGN - 1);
    uint64_t at = m->stage_off, end = m->stage_off + m->stage_len;
    size_t k = 0;
    while (k < m->nblocks && m->blocks[k].off - at < len) {
        at = m->blocks[k].off + m->blocks[k].len;
        k++;
    }
    if (k == m->nblocks && end - at < len)
        return NULL; /* full: this request goes over the network */
    memmove(m->blocks + k + 1, m->blocks + k, (m->nblocks - k) * sizeof *m->blocks);
    m->blocks[k] = (stage_block){at, len};
    m->nblocks++;
    *off = at;
    return m->arena.base + at;
}

void psc_shm_block_free(ps_client *c, uint64_t off)
{
    struct psc_shm *m = c->shm;
    size_t lo = 0, hi = m ? m->nblocks : 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->blocks[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < (m ? m->nblocks : 0) && m->blocks[lo].off == off) {
        memmove(m->blocks + lo, m->blocks + lo + 1, (m->nblocks - lo - 1) * sizeof *m->blocks);
        m->nblocks--;
    }
}

void *psc_shm_at(const ps_client *c, uint64_t off, size_t bytes)
{
    const struct psc_shm *m = c->shm;
    if (!m || !m->arena.base || off < m->stage_off || bytes > m->stage_len ||
        off - m->stage_off > m->stage_len - bytes)
        return NULL;
    return m->arena.base + off;
}

void psc_shm_close(ps_client *c)
{
    if (!c->shm)
        return;
    free(c->shm->blocks);
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
