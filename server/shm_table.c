#include "shm_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_shm.h"

struct ps_shm_table {
    int n, enabled;
    ps_shm_peer **peer; /* per rank; NULL: none */
    uint32_t users[PS_SHM_MAX_USERS]; /* trusted besides the server's own user */
    int nusers;
};

int ps_shm_table_create(int num_workers, int enabled, const uint32_t *users, int nusers,
                        ps_shm_table **out)
{
    if (nusers < 0 || nusers > PS_SHM_MAX_USERS)
        return PS_EINVAL;
    ps_shm_table *t = calloc(1, sizeof *t);
    if (!t || !(t->peer = calloc((size_t)num_workers, sizeof *t->peer))) {
        free(t);
        return PS_ENOMEM;
    }
    t->n = num_workers;
    t->enabled = enabled;
    if (nusers)
        memcpy(t->users, users, (size_t)nusers * sizeof *users);
    t->nusers = nusers;
    *out = t;
    return 0;
}

void ps_shm_table_destroy(ps_shm_table *t)
{
    if (!t)
        return;
    for (int r = 0; r < t->n; r++)
        ps_shm_peer_unref(t->peer[r]);
    free(t->peer);
    free(t);
}

static void set_why(ps_hello *reply, const char *why)
{
    /* cut to what the hello carries */
    size_t n = strnlen(why, sizeof reply->shm_why - 1);
    memcpy(reply->shm_why, why, n);
    reply->shm_why[n] = 0;
}

void ps_shm_table_hello(ps_shm_table *t, int r, const ps_hello *req, ps_hello *reply)
{
    reply->shm = 0;
    reply->shm_why[0] = 0;
    if (r < 0 || r >= t->n)
        return;
    ps_shm_peer *old = t->peer[r];
    if (!req->shm_name[0]) {
        t->peer[r] = NULL;
        ps_shm_peer_unref(old);
        ps_info("worker %d: payloads over the network (the worker offers no shared memory)", r);
        return;
    }
    if (!t->enabled) {
        t->peer[r] = NULL;
        ps_shm_peer_unref(old);
        set_why(reply, "the server runs with --shm off");
        ps_info("worker %d: payloads over the network (--shm off)", r);
        return;
    }
    if (old && strcmp(ps_shm_peer_name(old), req->shm_name) == 0 &&
        ps_shm_peer_nonce(old) == req->shm_nonce) {
        reply->shm = 1; /* a hello again with the same arena: keep the mapping */
        return;
    }
    char why[200];
    ps_shm_peer *p = NULL;
    int rc = ps_shm_peer_open(req->shm_name, req->shm_nonce, req->shm_size, t->users, t->nusers,
                              &p, why, sizeof why);
    t->peer[r] = p;
    ps_shm_peer_unref(old);
    if (rc) {
        /* on another host the arena's process is not here: that is the
         * normal way to find out, not an error; an arena it may not trust
         * is worth a warning (the worker trains on, over the network) */
        set_why(reply, rc == PS_ENOTFOUND ? "not on the same host" : why);
        if (rc == PS_EAUTH)
            ps_warn("worker %d: payloads over the network: shared memory refused: %s", r, why);
        else
            ps_info("worker %d: payloads over the network (shared memory: %s)", r,
                    rc == PS_ENOTFOUND ? "not on the same host" : why);
        return;
    }
    reply->shm = 1;
    ps_info("worker %d: payloads through shared memory (%s, %.1f MiB)", r, req->shm_name,
            (double)req->shm_size / 1048576.0);
}

int ps_shm_table_take(ps_shm_table *t, int r, uint64_t off, uint64_t bytes, ps_shm_peer **out,
                      char *why, size_t why_len)
{
    *out = NULL;
    ps_shm_peer *p = r >= 0 && r < t->n ? t->peer[r] : NULL;
    if (!p) {
        ps_errorf(why, why_len, "worker %d's shared-memory arena is not mapped here (this server "
            "started after its hello, or it said hello without one); say hello again", r);
        return PS_EHELLO;
    }
    if (!ps_shm_peer_at(p, off, bytes)) {
        ps_errorf(why, why_len, "worker %d: bytes [%llu, +%llu) are outside its arena %s", r,
            (unsigned long long)off, (unsigned long long)bytes, ps_shm_peer_name(p));
        return PS_EPROTO;
    }
    ps_shm_peer_ref(p);
    *out = p;
    return 0;
}

int ps_shm_table_count(const ps_shm_table *t)
{
    int n = 0;
    for (int r = 0; r < t->n; r++)
        n += t->peer[r] != NULL;
    return n;
}
