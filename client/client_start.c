/* libps: registering tensors and starting a client (include/ps_client.h),
 * on the caller's (training) thread: the placement of the registered
 * tensors and its key map, one hello per server (every answer checked to
 * agree on the job: mode, workers, optimizer, placement, the same-host data
 * plane), and the tables declared.  Opening, posting and closing are
 * client.c's. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_api_internal.h"
#include "client_comm.h"
#include "client_internal.h"
#include "client_requests.h"
#include "client_shm.h"
#include "ps_error.h"
#include "ps_limits.h"
#include "ps_placement.h"
#include "ps_table_decl.h"
#include "ps_time.h"

int ps_client_register(ps_client *c, uint64_t key, size_t count)
{
    if (!c)
        return PS_EINVAL;
    if (c->started) {
        psc_set_last_error(c, "register key %llu after start", (unsigned long long)key);
        return PS_ESTATE;
    }
    if (count == 0 || count > (size_t)1 << 40) {
        psc_set_last_error(c, "key %llu: count %zu must be in [1, 2^40]", (unsigned long long)key,
                           count);
        return PS_EINVAL;
    }
    for (size_t i = 0; i < c->nspecs; i++)
        if (c->specs[i].key == key) {
            psc_set_last_error(c, "key %llu registered twice", (unsigned long long)key);
            return PS_EINVAL;
        }
    if (psc_find_table(c, key) >= 0) {
        psc_set_last_error(c, "key %llu registered twice (a table has it)",
                           (unsigned long long)key);
        return PS_EINVAL;
    }
    if ((size_t)(count + c->chunk_elems - 1) / c->chunk_elems > PS_MAX_CHUNK) {
        psc_set_last_error(c, "key %llu: %zu elements make more than %u chunks",
                           (unsigned long long)key, count, PS_MAX_CHUNK);
        return PS_ETOOBIG;
    }
    if (c->nspecs == c->cap_specs) {
        size_t ncap = c->cap_specs ? c->cap_specs * 2 : 16;
        ps_tensor_spec *n = realloc(c->specs, ncap * sizeof *n);
        if (!n)
            return PS_ENOMEM;
        c->specs = n;
        c->cap_specs = ncap;
    }
    c->specs[c->nspecs].key = key;
    c->specs[c->nspecs].count = count;
    c->nspecs++;
    return 0;
}

static int build_keymap(ps_client *c)
{
    size_t cap = 16;
    while (cap < 2 * c->nspecs)
        cap *= 2;
    c->kmap_keys = calloc(cap, sizeof *c->kmap_keys);
    c->kmap_val = calloc(cap, sizeof *c->kmap_val);
    if (!c->kmap_keys || !c->kmap_val)
        return PS_ENOMEM;
    c->kmap_mask = cap - 1;
    for (size_t t = 0; t < c->nspecs; t++) {
        uint64_t key = c->specs[t].key;
        size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & c->kmap_mask;
        while (c->kmap_val[h])
            h = (h + 1) & c->kmap_mask;
        c->kmap_keys[h] = key;
        c->kmap_val[h] = (uint32_t)t + 1;
    }
    return 0;
}

static void drop_placement(ps_client *c)
{
    if (c->have_place)
        ps_placement_free(&c->place);
    c->have_place = 0;
    free(c->kmap_keys);
    free(c->kmap_val);
    c->kmap_keys = NULL;
    c->kmap_val = NULL;
}

/* Check every hello reply: answered, no error, consistent with this worker
 * and with each other.  Fills last_error. */
static int check_hellos(ps_client *c, ps_request *reqs, ps_hello *reps)
{
    char why[400];
    int ns = c->nservers;
    /* a server that refused us says why */
    for (int s = 0; s < ns; s++)
        if (reqs[s].status && reqs[s].status != PS_ETIMEDOUT) {
            psc_set_last_error(c, "%s", reqs[s].err);
            return PS_EMISMATCH;
        }
    size_t off = 0;
    int missing = 0;
    for (int s = 0; s < ns; s++)
        if (reqs[s].status == PS_ETIMEDOUT) {
            if (!missing)
                off += (size_t)snprintf(c->last_error, sizeof c->last_error,
                                        "no hello reply within %d ms from ",
                                        c->opt.hello_timeout_ms ? c->opt.hello_timeout_ms
                                                                : PSC_DEFAULT_HELLO_MS);
            if (off < sizeof c->last_error)
                off += (size_t)snprintf(c->last_error + off, sizeof c->last_error - off, "%s%s",
                                        missing ? ", " : "", c->endpoints[s]);
            missing++;
        }
    if (missing && c->curve_dir) {
        off = strlen(c->last_error);
        snprintf(c->last_error + off, sizeof c->last_error - off,
                 " (CURVE is on: a server that does not accept this worker's key never answers; "
                 "check --curve-keys and %s)", c->curve_dir);
    } else if (missing) {
        off = strlen(c->last_error);
        snprintf(c->last_error + off, sizeof c->last_error - off,
                 " (is it running and reachable? a server started with --curve-keys never "
                 "answers a plaintext worker: give this worker --curve-keys too)");
    }
    if (missing)
        return PS_ETIMEDOUT;
    /* a reader joins no round: it takes the servers' settings (the servers
     * must still agree with each other) */
    if (c->opt.rank == PS_RANK_READER) {
        ps_hello *hq = &c->hello_req;
        uint32_t nserv = hq->num_servers;
        for (int i = 0; i < ps_hello_nagreed(); i++)
            ps_hello_set(hq, i, ps_hello_get(&reps[0], i));
        hq->num_servers = nserv;
        c->opt.mode = hq->mode;
        c->opt.num_workers = (int)hq->num_workers;
        c->opt.max_staleness = hq->max_staleness;
        c->wire_dtype = hq->wire_dtype ? hq->wire_dtype : PS_DTYPE_F32;
    }
    for (int s = 0; s < ns; s++) {
        if (reps[s].server_rank != s) {
            psc_set_last_error(c, "server rank: %s is rank %d but is listed at position %d",
                               c->endpoints[s], reps[s].server_rank, s);
            return PS_EMISMATCH;
        }
        /* the server should have refused a mismatch itself; check anyway, by
         * the same rule (ps_opt_compare: what this worker gives) */
        ps_hello mine = c->hello_req;
        if (ps_hello_compare(&mine, "this worker", &reps[s], c->endpoints[s], 1, why, sizeof why)) {
            psc_set_last_error(c, "%s", why);
            return PS_EMISMATCH;
        }
        if (s > 0 &&
            ps_hello_compare(&reps[0], c->endpoints[0], &reps[s], c->endpoints[s], 1, why, sizeof why)) {
            psc_set_last_error(c, "servers disagree: %s", why);
            return PS_EMISMATCH;
        }
    }
    return 0;
}

/* After the hellos: every server's partitions (its reply's threads), and
 * every table declared to every server (a TABLE each), waited for.  Fills
 * last_error. */
static int declare_tables(ps_client *c, const ps_hello *reps)
{
    if (!c->ntables && c->opt.rank != PS_RANK_READER)
        return 0;
    int ns = c->nservers;
    free(c->server_parts);
    c->server_parts = calloc((size_t)ns, sizeof *c->server_parts);
    if (!c->server_parts)
        return PS_ENOMEM;
    for (int s = 0; s < ns; s++) {
        if (!reps[s].threads) {
            psc_set_last_error(c, "%s does not say how it partitions tables (an older ps_server?): "
                               "tables need servers that take them", c->endpoints[s]);
            return PS_EMISMATCH;
        }
        c->server_parts[s] = reps[s].threads;
    }
    if (c->opt.rank == PS_RANK_READER)
        return 0; /* a reader looks rows up; the workers declared the tables */
    size_t n = c->ntables * (size_t)ns;
    ps_request *reqs = calloc(n, sizeof *reqs);
    if (!reqs)
        return PS_ENOMEM;
    int rc = 0;
    size_t posted = 0;
    for (size_t t = 0; t < c->ntables && !rc; t++)
        for (int s = 0; s < ns && !rc; s++, posted++) {
            psc_req_reset(c, &reqs[posted], 1);
            psc_op o = {.type = PS_MSG_TABLE, .server = s, .tensor = (uint32_t)t,
                        .req = &reqs[posted]};
            if ((rc = psc_post(c, &o)) != 0)
                psc_req_fail(&reqs[posted], rc, ps_strerror(rc));
        }
    /* answered at once (a server that loses a declaration to a restore says
     * PS_ENOTFOUND later, and client_rejoin.c declares the tables again) */
    int timeout = c->opt.hello_timeout_ms ? c->opt.hello_timeout_ms : PSC_DEFAULT_HELLO_MS;
    int64_t deadline = ps_now_ns() + (int64_t)timeout * 1000000LL;
    for (size_t k = 0; k < posted; k++)
        if (reqs[k]._priv.client && !psc_wait_until(&reqs[k], deadline))
            psc_cancel(c, &reqs[k], PS_ETIMEDOUT);
    for (size_t k = 0; k < posted && !rc; k++)
        if (reqs[k].status) {
            rc = reqs[k].status;
            psc_set_last_error(c, "declaring table %llu: %s",
                               (unsigned long long)c->tables[k / (size_t)ns].key, reqs[k].err);
        }
    free(reqs);
    return rc;
}

int ps_client_start(ps_client *c)
{
    if (!c)
        return PS_EINVAL;
    if (c->started) {
        psc_set_last_error(c, "client already started");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    drop_placement(c);
    /* ps_placement_build sorts through a file-static pointer (not
     * reentrant); clients starting in several threads take turns */
    static pthread_mutex_t place_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&place_mu);
    int rc = ps_placement_build(c->specs, c->nspecs, c->chunk_elems, c->nservers, &c->place);
    pthread_mutex_unlock(&place_mu);
    if (rc) {
        psc_set_last_error(c, "placement failed: %s", ps_strerror(rc));
        return rc;
    }
    c->have_place = 1;
    rc = build_keymap(c);
    if (rc) {
        psc_set_last_error(c, "out of memory");
        drop_placement(c);
        return rc;
    }
    ps_hello *hq = &c->hello_req;
    memset(hq, 0, sizeof *hq);
    hq->mode = c->opt.mode;
    hq->max_staleness = c->opt.mode == PS_MODE_SYNC ? 0 : c->opt.max_staleness;
    hq->num_workers = (uint32_t)c->opt.num_workers;
    hq->num_servers = (uint32_t)c->nservers;
    hq->server_rank = -1;
    hq->model_fp = ps_placement_fingerprint(c->specs, c->nspecs, c->chunk_elems);
    hq->tables_fp = ps_table_decl_fingerprint(c->tables, c->ntables, sizeof *c->tables,
                                              offsetof(psc_table, key), offsetof(psc_table, opts));
    hq->opt = c->opt.expect;
    hq->wire_dtype = c->wire_dtype;
    if (c->opt.rank == PS_RANK_READER) {
        hq->tables_fp = 0; /* a reader declares nothing: its tables are keys and dims */
        if (!c->nspecs)
            hq->model_fp = 0; /* it pulls no tensor: any model */
    }
    if ((rc = psc_shm_setup(c)) != 0) {
        drop_placement(c);
        return rc;
    }

    int ns = c->nservers;
    ps_request *reqs = calloc((size_t)ns, sizeof *reqs);
    ps_hello *reps = calloc((size_t)ns, sizeof *reps);
    if (!reqs || !reps) {
        free(reqs);
        free(reps);
        drop_placement(c);
        return PS_ENOMEM;
    }
    for (int s = 0; s < ns && !rc; s++)
        rc = psc_post_ctl(c, PS_MSG_HELLO, s, 0, &reps[s], &reqs[s]);
    int timeout = c->opt.hello_timeout_ms ? c->opt.hello_timeout_ms : PSC_DEFAULT_HELLO_MS;
    int64_t deadline = ps_now_ns() + (int64_t)timeout * 1000000LL;
    for (int s = 0; s < ns; s++) {
        if (reqs[s]._priv.client && !psc_wait_until(&reqs[s], deadline))
            psc_cancel(c, &reqs[s], PS_ETIMEDOUT);
    }
    if (psc_comm_interrupted(c)) {
        psc_set_last_error(c, "interrupted while saying hello to the servers");
        rc = PS_ECLOSED;
    } else if (rc) {
        psc_set_last_error(c, "cannot post hello: %s", ps_strerror(rc));
    } else {
        rc = check_hellos(c, reqs, reps);
    }
    for (int s = 0; s < ns && !rc; s++)
        psc_shm_hello_reply(c, s, &reps[s]);
    if (!rc)
        rc = declare_tables(c, reps);
    free(reqs);
    free(reps);
    if (rc) {
        drop_placement(c);
        return rc;
    }
    __atomic_store_n(&c->started, 1, __ATOMIC_RELEASE);
    psc_kick(c); /* the comm thread may be asleep with no timeout: start the heartbeats */
    return 0;
}
