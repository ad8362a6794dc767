/* libps: the public API of the worker-side client.  The contract is
 * include/ps_client.h; how the modules share the work is
 * client/client_internal.h.
 *
 * Everything here runs on the caller's (training) thread: checking options
 * and opening, posting requests to the comm thread (psc_post) and the
 * blocking helpers built on them (barrier, stats, shutdown), and closing;
 * registering tensors and starting (placement, hello) are client_start.c's.  Posting a request fills
 * the caller's ps_request and one op in the queue, under the queue mutex
 * alone; it allocates only when the queue must grow. */
#include "ps_client.h"

#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_api_internal.h"
#include "client_comm.h"
#include "client_internal.h"
#include "client_metrics.h"
#include "client_moved.h"
#include "client_rejoin.h"
#include "client_route.h"
#include "client_requests.h"
#include "client_resend.h"
#include "client_shm.h"
#include "client_sparse.h"
#include "client_token.h"
#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_hash.h"
#include "ps_placement.h"
#include "ps_settings.h"
#include "ps_table_decl.h"
#include "ps_time.h"

/* Why this thread's last ps_client_open failed (ps_client_last_error(NULL)):
 * there is no client to hold it. */
static _Thread_local char open_error[PSC_ERRBUF];

static int open_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int open_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(open_error, sizeof open_error, fmt, ap);
    va_end(ap);
    ps_error("libps: %s", open_error);
    return code;
}

void psc_set_last_error(ps_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
}

/* ---------- posting ---------- */

static long find_tensor(const ps_client *c, uint64_t key)
{
    if (!c->kmap_keys)
        return -1;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & c->kmap_mask;
    for (;; h = (h + 1) & c->kmap_mask) {
        if (c->kmap_val[h] == 0)
            return -1;
        if (c->kmap_keys[h] == key)
            return (long)c->kmap_val[h] - 1;
    }
}

/* A reader (rank -1) reads: what the servers take from a worker alone is
 * refused here, with the reason in req (NULL: in last_error).  0 when c
 * may send a `type`. */
static int reader_refuses(ps_client *c, uint32_t type, ps_request *req)
{
    const ps_msg_info *m = ps_msg_info_of(type);
    if (!c || c->opt.rank != PS_RANK_READER || !m || m->from != PS_FROM_WORKER)
        return 0;
    char why[PS_ERR_TEXT_MAX + 1];
    snprintf(why, sizeof why, "this client is a reader (rank -1): a %s is a worker's; a reader "
             "pulls and looks rows up (ps_client_pull, ps_client_lookup) and is counted in no "
             "round or barrier", m->name);
    if (req)
        psc_req_fail(req, PS_ESTATE, why);
    else
        psc_set_last_error(c, "%s", why);
    return PS_ESTATE;
}

static int post_data(ps_client *c, uint32_t type, uint64_t key, const float *src, float *dst,
                     int64_t step, int npush, ps_ready_fn ready, void *ready_arg, int planes,
                     ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    if (reader_refuses(c, type, req))
        return PS_ESTATE;
    int rc = 0;
    long t = -1;
    if (!c || !c->started)
        rc = PS_ESTATE;
    else if ((t = find_tensor(c, key)) < 0)
        rc = PS_ENOTFOUND;
    else if ((ps_msg_request_has_payload(type) && !src) || (ps_msg_reply_has_payload(type) && !dst) ||
             step < (type == PS_MSG_SETSTATE ? -1 : 0) || step > INT64_MAX / 2 || npush < 1 ||
             npush > (1 << 30) || planes < 1 ||
             planes > 2 ||
             (npush > 1 && c->opt.mode != PS_MODE_ASYNC))
        rc = PS_EINVAL;
    if (rc) {
        psc_req_fail(req, rc, t < 0 && rc == PS_ENOTFOUND ? "key was not registered" : ps_strerror(rc));
        return rc;
    }
    int nchunks = (int)c->place.tensor_chunks[t];
    psc_req_reset(c, req, nchunks * (ps_msg_request_has_payload(type) ? 2 : 1));
    psc_op o = {.type = type, .server = -1, .tensor = (uint32_t)t, .src = src, .dst = dst,
            .step = step, .req = req, .out = NULL, .ready = ready, .ready_arg = ready_arg,
            .npush = npush, .planes = planes};
    rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_init(ps_client *c, uint64_t key, const float *values, ps_request *req)
{
    return post_data(c, PS_MSG_INIT, key, values, NULL, 0, 1, NULL, NULL, 1, req);
}

int ps_client_push(ps_client *c, uint64_t key, const float *grad, int64_t step, ps_request *req)
{
    return post_data(c, PS_MSG_PUSH, key, grad, NULL, step, 1, NULL, NULL, 1, req);
}

int ps_client_pull(ps_client *c, uint64_t key, float *dst, int64_t step, ps_request *req)
{
    return post_data(c, PS_MSG_PULL, key, NULL, dst, step, 1, NULL, NULL, 1, req);
}

int ps_client_pushpull(ps_client *c, uint64_t key, const float *grad, float *dst, int64_t step,
                       ps_request *req)
{
    return post_data(c, PS_MSG_PUSHPULL, key, grad, dst, step, 1, NULL, NULL, 1, req);
}

int ps_client_push_when(ps_client *c, uint64_t key, const float *grad, int64_t step,
                        ps_ready_fn ready, void *ready_arg, ps_request *req)
{
    return post_data(c, PS_MSG_PUSH, key, grad, NULL, step, 1, ready, ready_arg, 1, req);
}

int ps_client_push_sum(ps_client *c, uint64_t key, const float *sum, int64_t step, int count,
                       ps_ready_fn ready, void *ready_arg, ps_request *req)
{
    return post_data(c, PS_MSG_PUSH, key, sum, NULL, step, count, ready, ready_arg, 1, req);
}

int ps_client_pushpull_sum(ps_client *c, uint64_t key, const float *sum, float *dst, int64_t step,
                           int count, ps_ready_fn ready, void *ready_arg, ps_request *req)
{
    return post_data(c, PS_MSG_PUSHPULL, key, sum, dst, step, count, ready, ready_arg, 1, req);
}

/* ---- tables ---- */

long psc_find_table(const ps_client *c, uint64_t key)
{
    for (size_t t = 0; t < c->ntables; t++)
        if (c->tables[t].key == key)
            return (long)t;
    return -1;
}

static int post_sparse(ps_client *c, uint32_t type, uint64_t key, const uint64_t *ids, size_t n,
                       const float *grads, const uint64_t *ids2, size_t n2, float *rows,
                       int64_t step, ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    if (reader_refuses(c, type, req))
        return PS_ESTATE;
    int rc = 0;
    long t = -1;
    if (!c || !c->started)
        rc = PS_ESTATE;
    else if ((t = psc_find_table(c, key)) < 0)
        rc = PS_ENOTFOUND;
    else if ((n && !ids) || (type != PS_MSG_SPULL && n && !grads) || (n2 && (!ids2 || !rows)) ||
             (type == PS_MSG_SPULL && n && !rows) || step < 0 || step > INT64_MAX / 2 ||
             n > UINT32_MAX / 2 || n2 > UINT32_MAX / 2)
        rc = PS_EINVAL;
    if (rc) {
        psc_req_fail(req, rc, rc == PS_ENOTFOUND ? "table key was not registered"
                              : rc == PS_ESTATE  ? "the client is not started"
                                                 : ps_strerror(rc));
        return rc;
    }
    /* one part now; the comm thread adds one per message it splits it into */
    psc_req_reset(c, req, 1);
    psc_op o = {.type = type, .server = -1, .tensor = (uint32_t)t, .src = grads, .dst = rows,
                .step = step, .req = req, .npush = 1, .ids = ids, .nids = n, .ids2 = ids2,
                .nids2 = n2};
    rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_sparse_pull(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                          float *rows, int64_t step, ps_request *req)
{
    return post_sparse(c, PS_MSG_SPULL, key, ids, n, NULL, NULL, 0, rows, step, req);
}

int ps_client_sparse_push(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                          const float *grads, int64_t step, ps_request *req)
{
    return post_sparse(c, PS_MSG_SPUSH, key, ids, n, grads, NULL, 0, NULL, step, req);
}

int ps_client_sparse_pushpull(ps_client *c, uint64_t key, const uint64_t *push_ids,
                              size_t npush, const float *grads, const uint64_t *pull_ids,
                              size_t npull, float *rows, int64_t step, ps_request *req)
{
    return post_sparse(c, PS_MSG_SPUSHPULL, key, push_ids, npush, grads, pull_ids, npull, rows,
                       step, req);
}

int ps_client_sparse_assign(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                            const float *rows, ps_request *req)
{
    return post_sparse(c, PS_MSG_SASSIGN, key, ids, n, rows, NULL, 0, NULL, 0, req);
}

int ps_client_name_table(ps_client *c, uint64_t key, const char *name)
{
    if (!c || !name)
        return PS_EINVAL;
    if (c->started) {
        psc_set_last_error(c, "name table %llu after start", (unsigned long long)key);
        return PS_ESTATE;
    }
    long t = psc_find_table(c, key);
    if (t < 0) {
        psc_set_last_error(c, "name table %llu: no such table registered", (unsigned long long)key);
        return PS_ENOTFOUND;
    }
    size_t n = strlen(name);
    int ok = n <= PS_TABLE_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = name[i] >= 0x20 && name[i] < 0x7f;
    if (!ok) {
        psc_set_last_error(c, "table %llu's name must be at most %d printable characters",
                           (unsigned long long)key, PS_TABLE_NAME_MAX);
        return PS_EINVAL;
    }
    memcpy(c->tables[t].name, name, n + 1);
    return 0;
}

int ps_client_register_table(ps_client *c, uint64_t key, const ps_table_options *opts)
{
    if (!c || !opts)
        return PS_EINVAL;
    if (c->started) {
        psc_set_last_error(c, "register table %llu after start", (unsigned long long)key);
        return PS_ESTATE;
    }
    char why[PS_ERR_TEXT_MAX];
    if (ps_table_decl_check(key, opts, why, sizeof why)) {
        psc_set_last_error(c, "%s", why);
        return PS_EINVAL;
    }
    int twice = psc_find_table(c, key) >= 0;
    for (size_t i = 0; i < c->nspecs && !twice; i++)
        twice = c->specs[i].key == key;
    if (twice) {
        psc_set_last_error(c, "key %llu registered twice (a tensor or table has it)",
                           (unsigned long long)key);
        return PS_EINVAL;
    }
    if (c->ntables == c->cap_tables) {
        size_t ncap = c->cap_tables ? c->cap_tables * 2 : 8;
        psc_table *n = realloc(c->tables, ncap * sizeof *n);
        if (!n)
            return PS_ENOMEM;
        c->tables = n;
        c->cap_tables = ncap;
    }
    c->tables[c->ntables].key = key;
    c->tables[c->ntables].opts = *opts;
    c->tables[c->ntables].name[0] = '\0';
    ps_table_decl_normalize(&c->tables[c->ntables].opts);
    c->ntables++;
    return 0;
}

int ps_client_num_tables(const ps_client *c) { return c ? (int)c->ntables : 0; }

int ps_client_server_parts(const ps_client *c, int server)
{
    return c && c->server_parts && server >= 0 && server < c->nservers
               ? (int)c->server_parts[server]
               : 0;
}

/* Post a control message to one server. */
int psc_post_ctl(ps_client *c, uint32_t type, int server, int64_t step, void *out,
                 ps_request *req)
{
    if (reader_refuses(c, type, req))
        return PS_ESTATE;
    psc_req_reset(c, req, 1);
    psc_op o = {.type = type, .server = server, .tensor = 0, .src = NULL, .dst = NULL, .step = step,
            .req = req, .out = out};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

/* ---------- what ps.torch asks of the servers ---------- */

int ps_client_assign(ps_client *c, uint64_t key, const float *w, ps_request *req)
{
    return post_data(c, PS_MSG_ASSIGN, key, w, NULL, 0, 1, NULL, NULL, 1, req);
}

int ps_client_state(ps_client *c, uint64_t key, float *dst, int nstate, ps_request *req)
{
    return post_data(c, PS_MSG_STATE, key, NULL, dst, 0, 1, NULL, NULL, nstate, req);
}

int ps_client_set_state(ps_client *c, uint64_t key, const float *src, int nstate,
                        int64_t opt_step, ps_request *req)
{
    return post_data(c, PS_MSG_SETSTATE, key, src, NULL, opt_step, 1, NULL, NULL, nstate, req);
}

/* A table's clock: a message to each partition of each server. */
static int post_table_clock(ps_client *c, long t, ps_request *req)
{
    if (reader_refuses(c, PS_MSG_CLOCK, req))
        return PS_ESTATE;
    size_t parts = 0;
    for (int s = 0; s < c->nservers; s++)
        parts += c->server_parts[s];
    psc_req_reset(c, req, (int)parts);
    psc_op o = {.type = PS_MSG_CLOCK, .server = -1, .tensor = (uint32_t)t, .req = req,
                .npush = 1, .table = 1};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_clock(ps_client *c, uint64_t key, ps_request *req)
{
    long t;
    if (req && c && c->started && find_tensor(c, key) < 0 && (t = psc_find_table(c, key)) >= 0)
        return post_table_clock(c, t, req);
    return post_data(c, PS_MSG_CLOCK, key, NULL, NULL, 0, 1, NULL, NULL, 1, req);
}

/* A collective: to server 0, with its payload both ways. */
static int post_coll(ps_client *c, uint32_t type, int64_t id, const float *src, float *dst,
                     size_t count, ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    if (reader_refuses(c, type, req))
        return PS_ESTATE;
    int rc = !c || !src || !dst || count == 0 || id < 0 || id > INT64_MAX / 2 ||
                     count * sizeof(float) > PS_MAX_PAYLOAD_BYTES
                 ? PS_EINVAL
                 : !c->started ? PS_ESTATE : 0;
    if (rc) {
        psc_req_fail(req, rc, rc == PS_ESTATE ? "collective before start" : ps_strerror(rc));
        return rc;
    }
    psc_req_reset(c, req, 2); /* the reply and the payload's release */
    psc_op o = {.type = type, .server = 0, .src = src, .dst = dst, .count = count, .step = id,
                .req = req};
    if ((rc = psc_post(c, &o)))
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_allreduce(ps_client *c, int64_t id, const float *src, float *dst, size_t count,
                        ps_request *req)
{
    return post_coll(c, PS_MSG_ALLREDUCE, id, src, dst, count, req);
}

int ps_client_broadcast(ps_client *c, int64_t id, const float *src, float *dst, size_t count,
                        ps_request *req)
{
    return post_coll(c, PS_MSG_BROADCAST, id, src, dst, count, req);
}

/* Give up on req: fail its outstanding messages with `code` and wait until
 * the comm thread has let go of it.  A cancel that cannot be posted means
 * the comm thread is ending (closed or interrupted) and fails everything
 * itself: waiting is still what makes req safe to free. */
void psc_cancel(ps_client *c, ps_request *req, int code)
{
    psc_op o = {.type = PSC_OP_CANCEL, .server = -1, .req = req, .code = code};
    psc_post(c, &o);
    psc_wait_until(req, INT64_MAX);
}

/* ---------- lifecycle ---------- */

/* Where the settings table's libps rows (common/ps_settings.h) live in
 * ps_client_options: their defaults are the programs' defaults. */
static const ps_setting_field option_fields[] = {PS_SETTING_FIELDS(LIBPS)};

void ps_client_options_default(ps_client_options *o)
{
    memset(o, 0, sizeof *o);
    ps_settings_defaults(PS_PROG_LIBPS, option_fields,
                         (int)(sizeof option_fields / sizeof option_fields[0]), o);
    o->expect.kind = PS_OPT_NONE;
}

int ps_client_setting(const char *name, const char **env, const char **def)
{
    char flag[64];
    if (!name || strlen(name) + 3 > sizeof flag)
        return PS_ENOTFOUND;
    snprintf(flag, sizeof flag, "--%s", name);
    int id = ps_setting_find(PS_PROG_WORKER | PS_PROG_LIBPS, flag);
    if (id < 0)
        return PS_ENOTFOUND;
    if (env)
        *env = ps_setting_at(id)->env;
    if (def)
        *def = ps_setting_at(id)->def;
    return 0;
}

/* An endpoint to connect to, checked (why: PSC_ERRBUF bytes).  For a
 * connect (bind 0) the form to hand to ZeroMQ is the one given. */
static int check_endpoint(const char *ep, char *why)
{
    char form[PS_ENDPOINT_MAX];
    return ps_endpoint_check(ep, 0, form, sizeof form, why, PSC_ERRBUF) != 0 ? PS_EINVAL : 0;
}

/* Split `servers` at commas into c->endpoints (blanks around each trimmed)
 * and check each one, so a mistake reads "'127.0.0.1:5555' is not an
 * endpoint: write tcp://HOST:PORT, ..." instead of ZeroMQ's "Invalid
 * argument" from the comm thread. */
static int split_endpoints(ps_client *c, const char *servers)
{
    c->servers_str = strdup(servers);
    if (!c->servers_str)
        return open_fail(PS_ENOMEM, "out of memory");
    size_t cap = 1;
    for (const char *p = c->servers_str; *p; p++)
        cap += *p == ',';
    c->endpoints = calloc(cap, sizeof *c->endpoints);
    if (!c->endpoints || psc_route_new(c, (int)cap) != 0)
        return open_fail(PS_ENOMEM, "out of memory");
    char *save = NULL;
    for (char *tok = strtok_r(c->servers_str, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t')
            tok++;
        char *e = tok + strlen(tok);
        while (e > tok && (e[-1] == ' ' || e[-1] == '\t'))
            *--e = 0;
        if (!*tok)
            continue;
        /* "a|b": a group's members, its primary first (client_route.h) */
        char why[PSC_ERRBUF];
        if (psc_route_add(c, c->nservers, tok, check_endpoint, why) != 0)
            return open_fail(PS_EINVAL, "%s", why);
        c->endpoints[c->nservers++] = tok;
    }
    if (c->nservers == 0)
        return open_fail(PS_EINVAL, "no server endpoint in '%s'", servers);
    return 0;
}

/* After the comm thread and the arena are gone (psc_comm_stop,
 * psc_shm_close), or were never made. */
static void client_free(ps_client *c)
{
    psc_metrics_close(c); /* no scrape reads the client after this */
    psc_requests_free(c);
    psc_liveness_free(c);
    psc_rejoin_free(c);
    psc_tokens_free(c);
    psc_moved_free(c); /* before the tables and placement it sizes by */
    if (c->have_place)
        ps_placement_free(&c->place);
    free(c->kmap_keys);
    free(c->kmap_val);
    free(c->specs);
    free(c->tables);
    free(c->server_parts);
    psc_sparse_free(c);
    free(c->endpoints);
    psc_route_free(c);
    free(c->servers_str);
    free(c->curve_dir);
    free(c);
}

int ps_client_open(const ps_client_options *o, ps_client **out)
{
    open_error[0] = 0;
    if (!out)
        return open_fail(PS_EINVAL, "ps_client_open: out is NULL");
    *out = NULL;
    if (!o || !o->servers || !*o->servers)
        return open_fail(PS_EINVAL, "no server endpoints given");
    if (o->num_workers < 1 || o->num_workers > PS_MAX_RANK + 1 || o->rank < PS_RANK_READER ||
        o->rank >= o->num_workers)
        return open_fail(PS_EINVAL, "rank %d must be in [0, num_workers %d) (or %d: a reader), "
                         "num_workers in [1, %d]", o->rank, o->num_workers, PS_RANK_READER,
                         PS_MAX_RANK + 1);
    if (o->mode != PS_MODE_SYNC && o->mode != PS_MODE_ASYNC)
        return open_fail(PS_EINVAL, "mode must be sync (%d) or async (%d), got %d",
                         PS_MODE_SYNC, PS_MODE_ASYNC, o->mode);
    if (o->mode == PS_MODE_ASYNC && (o->max_staleness < -1 || o->max_staleness > 1000000))
        return open_fail(PS_EINVAL, "max_staleness must be -1 (unbounded) or 0..1000000, "
                         "got %d", o->max_staleness);
    size_t cb = o->chunk_bytes ? o->chunk_bytes : PSC_DEFAULT_CHUNK_BYTES;
    if (cb < sizeof(float) || cb > PS_MAX_PAYLOAD_BYTES)
        return open_fail(PS_EINVAL, "chunk_bytes must be in [4, %llu], got %zu",
                         (unsigned long long)PS_MAX_PAYLOAD_BYTES, cb);
    if ((o->expect.kind != PS_OPT_NONE && !ps_opt_kind_valid(o->expect.kind)) ||
        o->hello_timeout_ms < 0 || o->request_timeout_ms < 0 || o->heartbeat_ms < 0 ||
        o->server_timeout_ms < 0)
        return open_fail(PS_EINVAL, "bad optimizer kind %d or negative timeout",
                         o->expect.kind);
    size_t tl = o->admin_token ? strlen(o->admin_token) : 0;
    int printable = 1;
    for (size_t i = 0; i < tl; i++)
        printable &= o->admin_token[i] > 0x20 && o->admin_token[i] < 0x7f;
    if (o->admin_token && (tl < 16 || tl > PS_ADMIN_TOKEN_MAX || !printable))
        return open_fail(PS_EINVAL, "admin_token must be 16..%d printable characters without "
                         "spaces", PS_ADMIN_TOKEN_MAX);
    ps_client *c = calloc(1, sizeof *c);
    if (!c)
        return open_fail(PS_ENOMEM, "out of memory");
    c->opt = *o;
    if (o->rank == PS_RANK_READER)
        c->opt.shm = 0; /* a reader moves nothing the servers write into */
    /* the caller's strings may go away; we keep copies */
    c->opt.servers = NULL;
    c->opt.curve_dir = NULL;
    c->opt.admin_token = NULL;
    if (o->curve_dir && !(c->curve_dir = strdup(o->curve_dir))) {
        free(c);
        return open_fail(PS_ENOMEM, "out of memory");
    }
    c->chunk_elems = cb / sizeof(float);
    c->wire_dtype = PS_DTYPE_F32;
    int rc = split_endpoints(c, o->servers);
    if (rc)
        goto fail;
    if ((rc = psc_requests_new(c, psc_sparse_sub_free)) || (rc = psc_liveness_new(c)) || (rc = psc_rejoin_new(c)) ||
        (rc = psc_tokens_new(c, o->admin_token)) || (rc = psc_moved_new(c))) {
        rc = open_fail(rc, "out of memory");
        goto fail;
    }
    if ((rc = psc_metrics_open(c, o))) {
        open_fail(rc, "%s", c->last_error);
        goto fail;
    }
    rc = psc_comm_start(c);
    if (rc) {
        open_fail(rc, "%s", c->last_error);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    client_free(c);
    return rc;
}

const char *ps_client_last_error(const ps_client *c) { return c ? c->last_error : open_error; }

/* Post `type` to each server in [lo, hi) and wait for every reply; server
 * s's reply goes to out + (s - lo) * stride (stride 0: all to out). */
static int ctl_all(ps_client *c, uint32_t type, int lo, int hi, int64_t step, void *out,
                   size_t stride)
{
    int n = hi - lo;
    ps_request one, *reqs = n == 1 ? &one : calloc((size_t)n, sizeof *reqs);
    if (!reqs)
        return PS_ENOMEM;
    int rc = 0;
    int posted = 0;
    for (int s = lo; s < hi && !rc; s++, posted++)
        rc = psc_post_ctl(c, type, s, step, out ? (char *)out + (size_t)(s - lo) * stride : NULL,
                          &reqs[s - lo]);
    if (rc) {
        psc_set_last_error(c, "cannot post %s: %s", ps_msg_type_name(type), ps_strerror(rc));
        posted--;
    }
    for (int k = 0; k < posted; k++) {
        int st = ps_request_wait(&reqs[k]);
        if (st && !rc) {
            rc = st;
            psc_set_last_error(c, "%s", reqs[k].err);
        }
    }
    if (reqs != &one)
        free(reqs);
    return rc;
}

int ps_client_hyper(ps_client *c, const ps_opt_config *change, int64_t from_step,
                    ps_opt_config *now)
{
    return ps_client_table_hyper(c, 0, change, from_step, now);
}

int ps_client_table_hyper(ps_client *c, uint64_t key, const ps_opt_config *change,
                          int64_t from_step, ps_opt_config *now)
{
    if (!c || !change || from_step < 0 || from_step > INT64_MAX / 2)
        return PS_EINVAL;
    if (key && c->started && psc_find_table(c, key) < 0) {
        psc_set_last_error(c, "hyper-parameters of table %llu: no such table registered",
                           (unsigned long long)key);
        return PS_ENOTFOUND;
    }
    if (!c->started) {
        psc_set_last_error(c, "hyper-parameters before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    /* a value out of its flag's range is no change to ask for (the servers
     * would refuse the message) */
    char why[200];
    if (ps_opt_check(change, 1, why, sizeof why)) {
        psc_set_last_error(c, "hyper-parameters: %s", why);
        return PS_EINVAL;
    }
    ps_hello *reps = calloc((size_t)c->nservers, sizeof *reps);
    if (!reps)
        return PS_ENOMEM;
    c->hyper = *change;
    c->hyper_key = key;
    int rc = ctl_all(c, PS_MSG_HYPER, 0, c->nservers, from_step, reps, sizeof *reps);
    if (!rc && now)
        *now = reps[0].opt;
    free(reps);
    return rc;
}

int ps_client_leave(ps_client *c)
{
    if (!c)
        return PS_EINVAL;
    if (!c->started) {
        psc_set_last_error(c, "leave before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    if (reader_refuses(c, PS_MSG_LEAVE, NULL))
        return PS_ESTATE;
    return ctl_all(c, PS_MSG_LEAVE, 0, c->nservers, 0, NULL, 0);
}

void psc_client_set_error(ps_client *c, const char *text)
{
    if (c)
        psc_set_last_error(c, "%s", text);
}

int ps_client_leave_post(ps_client *c, int server, ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    /* a slot added while training too (client_moved.h): the comm thread
     * knows which are; one that left the job has nothing to hear */
    int rc = !c || server < 0 || server >= c->nservers + PSC_MAX_ADDED_SLOTS ? PS_EINVAL
             : !c->started                                                   ? PS_ESTATE
                                                                             : 0;
    if (rc) {
        psc_req_fail(req, rc, rc == PS_ESTATE ? "leave before start" : ps_strerror(rc));
        return rc;
    }
    return psc_post_ctl(c, PS_MSG_LEAVE, server, 0, NULL, req);
}

int ps_client_barrier(ps_client *c, int64_t id)
{
    if (!c || id < 0 || id > INT64_MAX / 2)
        return PS_EINVAL;
    if (!c->started) {
        psc_set_last_error(c, "barrier before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    if (reader_refuses(c, PS_MSG_BARRIER, NULL))
        return PS_ESTATE;
    return ctl_all(c, PS_MSG_BARRIER, 0, 1, id, NULL, 0);
}

int ps_client_barrier_post(ps_client *c, int64_t id, ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    int rc = !c || id < 0 || id > INT64_MAX / 2 ? PS_EINVAL : !c->started ? PS_ESTATE : 0;
    if (rc) {
        psc_req_fail(req, rc, rc == PS_ESTATE ? "barrier before start" : ps_strerror(rc));
        return rc;
    }
    return psc_post_ctl(c, PS_MSG_BARRIER, 0, id, NULL, req);
}

int ps_client_stats(ps_client *c, int server, ps_stats *out)
{
    /* a slot added while training too (client_moved.h): the comm thread
     * refuses one it does not know, or that left */
    if (!c || !out || server < 0 || server >= c->nservers + PSC_MAX_ADDED_SLOTS)
        return PS_EINVAL;
    c->last_error[0] = 0;
    memset(out, 0, sizeof *out);
    psc_stats_out so = {out, NULL};
    return ctl_all(c, PS_MSG_STATS, server, server + 1, 0, &so, 0);
}

/* How long ps_client_barrier_info waits for server 0's answer. */
#define BARRIER_INFO_MS 2000

int ps_client_barrier_info(ps_client *c, ps_barrier_info *out)
{
    if (!c || !out)
        return PS_EINVAL;
    memset(out, 0, sizeof *out);
    out->id = -1;
    if (!c->started) {
        psc_set_last_error(c, "barrier_info before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    ps_stats st;
    psc_stats_out so = {&st, out};
    ps_request req;
    int rc = psc_post_ctl(c, PS_MSG_STATS, 0, 0, &so, &req);
    /* a server too busy or gone must not hold up a caller that only reports */
    if (!rc && !psc_wait_until(&req, ps_now_ns() + BARRIER_INFO_MS * 1000000LL))
        psc_cancel(c, &req, PS_ETIMEDOUT);
    if (req.status)
        psc_set_last_error(c, "%s", req.err);
    return req.status;
}

int ps_client_shutdown_servers(ps_client *c)
{
    if (!c)
        return PS_EINVAL;
    c->last_error[0] = 0;
    return ctl_all(c, PS_MSG_SHUTDOWN, 0, c->nservers, 0, NULL, 0);
}

int ps_client_set_wire_dtype(ps_client *c, int dtype)
{
    if (!c || ps_dtype_size(dtype > 0 ? (uint32_t)dtype : 0) == 0)
        return PS_EINVAL;
    if (c->started) {
        psc_set_last_error(c, "the wire dtype is set before start");
        return PS_ESTATE;
    }
    c->wire_dtype = (uint32_t)dtype;
    return 0;
}

int ps_client_num_servers(const ps_client *c) { return c ? c->nservers : 0; }

size_t ps_client_chunk_elems(const ps_client *c) { return c ? c->chunk_elems : 0; }

void ps_client_interrupt(ps_client *c)
{
    if (c)
        psc_comm_interrupt(c);
}

void ps_client_close(ps_client *c)
{
    if (!c)
        return;
    psc_comm_stop(c); /* every request is complete afterwards */
    psc_shm_close(c); /* nothing reads or writes the arena any more */
    client_free(c);
}
