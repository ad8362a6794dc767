#include "shm_peer.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "ps_error.h"
#include "ps_shm.h"

struct ps_shm_peer {
    ps_shm_arena a;
    _Atomic int refs;
};

int ps_shm_peer_open(const char *name, uint64_t nonce, uint64_t size, const uint32_t *users,
                     int nusers, ps_shm_peer **out, char *why, size_t why_len)
{
    *out = NULL;
    ps_shm_peer *p = calloc(1, sizeof *p);
    if (!p)
        return PS_ENOMEM;
    int rc = size > SIZE_MAX ? PS_EINVAL
                             : ps_shm_attach(name, nonce, (size_t)size, users, nusers, &p->a, why,
                                             why_len);
    if (rc) {
        free(p);
        return rc;
    }
    atomic_init(&p->refs, 1);
    *out = p;
    return 0;
}

void ps_shm_peer_ref(ps_shm_peer *p) { atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed); }

void ps_shm_peer_unref(ps_shm_peer *p)
{
    if (!p || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1)
        return;
    ps_shm_close(&p->a);
    free(p);
}

void *ps_shm_peer_at(const ps_shm_peer *p, uint64_t off, uint64_t bytes)
{
    return ps_shm_range_ok(&p->a, off, bytes) ? p->a.base + off : NULL;
}

const char *ps_shm_peer_name(const ps_shm_peer *p) { return p->a.name; }

uint64_t ps_shm_peer_nonce(const ps_shm_peer *p) { return p->a.nonce; }
