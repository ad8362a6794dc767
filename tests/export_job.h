/* A job for the export tests: S bin/ps_server processes, W libps workers in
 * this process with one dense tensor (several chunks) and one table, steps
 * of deterministic gradients, and readers of what an export wrote.
 * Header-only (static inline), like tables_job.h. */
#ifndef EXPORT_JOB_H
#define EXPORT_JOB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ps_client.h"
#include "ps_npy.h"
#include "ps_table_row.h"
#include "ps_test.h"

#define EJ_MAX 4
#define EJ_WAIT_MS 15000
#define EJ_KEY 3         /* the dense tensor */
#define EJ_COUNT 1000    /* its elements: 4 chunks of 256 (chunk_bytes 1024) */
#define EJ_TABLE 7
#define EJ_DIM 4
#define EJ_IDS 600       /* ids a step draws from */
#define EJ_BATCH 64

typedef struct ej_job {
    int S, W;
    int pid[EJ_MAX], port[EJ_MAX];
    char log[EJ_MAX][512];
    char flags[3072];
    char eps[512];
    ps_client *c[EJ_MAX];
    ps_table_options topt;
    char tname[PS_TABLE_NAME_MAX + 1]; /* the workers name the table so ("": no name) */
    int mode;
    float w[EJ_MAX][EJ_COUNT]; /* each worker's dense weights as pulled */
} ej_job;

static inline int ej_wait(ps_request *r)
{
    int st = ps_request_wait_for(r, EJ_WAIT_MS);
    if (st < 0) {
        snprintf(r->err, sizeof r->err, "(still pending after %d ms)", EJ_WAIT_MS);
        return PS_ETIMEDOUT;
    }
    return st;
}

/* Start server k (ports chosen by ej_init), with `more` after the job's flags. */
static inline int ej_server(ej_job *j, int k, const char *more)
{
    static int count;
    char words[8192];
    snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --rank %d --num-servers %d "
             "--num-workers %d %s %s", j->port[k], k, j->S, j->W, j->flags, more);
    snprintf(j->log[k], sizeof j->log[k], "%s/eserver%d-%d.log", ps_test_tmpdir(), k, count++);
    j->pid[k] = ps_test_spawn_words("ps_server", words, j->log[k]);
    return j->pid[k] > 0 ? 0 : -1;
}

/* S servers (flags name --mode and the dense optimizer), W workers; the
 * table's declaration in j->topt (adagrad, lr 0.05, uniform 0.25 seed 11)
 * may change before ej_connect. */
static inline int ej_init(ej_job *j, int S, int W, const char *flags, const char *more)
{
    memset(j, 0, sizeof *j);
    j->S = S;
    j->W = W;
    snprintf(j->flags, sizeof j->flags, "%s", flags);
    j->mode = strstr(flags, "--mode async") ? PS_MODE_ASYNC : PS_MODE_SYNC;
    ps_table_options_default(&j->topt);
    j->topt.dim = EJ_DIM;
    j->topt.init = PS_TABLE_INIT_UNIFORM;
    j->topt.init_scale = 0.25f;
    j->topt.seed = 11;
    j->topt.opt.kind = PS_OPT_ADAGRAD;
    j->topt.opt.lr = 0.05f;
    size_t off = 0;
    for (int k = 0; k < S; k++) {
        j->port[k] = ps_test_free_port();
        off += (size_t)snprintf(j->eps + off, sizeof j->eps - off, "%stcp://127.0.0.1:%d",
                                k ? "," : "", j->port[k]);
    }
    for (int k = 0; k < S; k++)
        if (ej_server(j, k, more))
            return -1;
    return 0;
}

static inline void ej_options(const ej_job *j, ps_client_options *o, int rank)
{
    ps_client_options_default(o);
    o->servers = j->eps;
    o->rank = rank;
    o->num_workers = j->W;
    o->mode = j->mode;
    o->max_staleness = j->mode == PS_MODE_ASYNC ? -1 : 0;
    o->chunk_bytes = 1024;
    o->hello_timeout_ms = EJ_WAIT_MS;
    o->request_timeout_ms = 3000;
}

/* Worker r: the tensor and the table, started; rank 0 inits the tensor. */
static inline int ej_worker(ej_job *j, int r)
{
    ps_client_options o;
    ej_options(j, &o, r);
    int rc = ps_client_open(&o, &j->c[r]);
    if (rc) {
        fprintf(stderr, "open: %s\n", ps_client_last_error(NULL));
        return rc;
    }
    if ((rc = ps_client_register(j->c[r], EJ_KEY, EJ_COUNT)) ||
        (rc = ps_client_register_table(j->c[r], EJ_TABLE, &j->topt)) ||
        (j->tname[0] && (rc = ps_client_name_table(j->c[r], EJ_TABLE, j->tname))) ||
        (rc = ps_client_start(j->c[r]))) {
        fprintf(stderr, "worker %d: %s\n", r, ps_client_last_error(j->c[r]));
        return rc;
    }
    for (int i = 0; i < EJ_COUNT; i++)
        j->w[r][i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    ps_request req;
    if (r == 0 && (ps_client_init(j->c[r], EJ_KEY, j->w[r], &req) || ej_wait(&req))) {
        fprintf(stderr, "init: %s\n", req.err);
        return -1;
    }
    return 0;
}

static inline int ej_connect(ej_job *j)
{
    for (int r = 0; r < j->W; r++)
        if (ej_worker(j, r))
            return -1;
    return 0;
}

/* A reader of j's servers (its table registered: key and dim), started. */
static inline ps_client *ej_reader(const ej_job *j, const char *curve_dir)
{
    ps_client_options o;
    ej_options(j, &o, PS_RANK_READER);
    o.num_workers = 1; /* a reader takes the servers' */
    o.curve_dir = curve_dir;
    ps_client *c;
    if (ps_client_open(&o, &c)) {
        fprintf(stderr, "reader open: %s\n", ps_client_last_error(NULL));
        return NULL;
    }
    if (ps_client_register(c, EJ_KEY, EJ_COUNT) ||
        ps_client_register_table(c, EJ_TABLE, &j->topt) || ps_client_start(c)) {
        fprintf(stderr, "reader: %s\n", ps_client_last_error(c));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

/* rank r's ids at `step` (a window that moves, some twice) */
static inline size_t ej_batch(int r, int step, uint64_t *ids)
{
    size_t n = 0;
    for (int i = 0; i < EJ_BATCH; i++)
        ids[n++] = (uint64_t)((step * 97 + r * 311 + i * 7) % EJ_IDS);
    for (int i = 0; i < 4; i++)
        ids[n++] = ids[i * 5];
    return n;
}

static inline float ej_grad(int r, uint64_t x, int step, int k)
{
    uint64_t h = ps_table_mix(((uint64_t)r << 40) ^ (x << 8) ^ ((uint64_t)step << 24) ^
                              (uint64_t)k);
    return (float)((int64_t)(h >> 40) - (1 << 23)) * 0x1p-24f;
}

/* Step t of every worker: a dense pushpull and the table's pushpull of its
 * batch (pulling its next batch). */
static inline int ej_step(ej_job *j, int t)
{
    static uint64_t ids[EJ_MAX][EJ_BATCH + 8], next[EJ_MAX][EJ_BATCH + 8];
    static float g[EJ_MAX][(EJ_BATCH + 8) * EJ_DIM], rows[EJ_MAX][(EJ_BATCH + 8) * EJ_DIM];
    static float dg[EJ_MAX][EJ_COUNT];
    ps_request dreq[EJ_MAX], sreq[EJ_MAX];
    for (int r = 0; r < j->W; r++) {
        size_t n = ej_batch(r, t, ids[r]), nn = ej_batch(r, t + 1, next[r]);
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < EJ_DIM; k++)
                g[r][i * EJ_DIM + k] = ej_grad(r, ids[r][i], t, k);
        for (int i = 0; i < EJ_COUNT; i++)
            dg[r][i] = ej_grad(r, (uint64_t)i, t, 9);
        if (ps_client_pushpull(j->c[r], EJ_KEY, dg[r], j->w[r], t, &dreq[r]) ||
            ps_client_sparse_pushpull(j->c[r], EJ_TABLE, ids[r], n, g[r], next[r], nn, rows[r], t,
                                      &sreq[r])) {
            fprintf(stderr, "step %d worker %d: %s %s\n", t, r, dreq[r].err, sreq[r].err);
            return -1;
        }
    }
    for (int r = 0; r < j->W; r++)
        if (ej_wait(&dreq[r]) || ej_wait(&sreq[r])) {
            fprintf(stderr, "step %d worker %d: %s %s\n", t, r, dreq[r].err, sreq[r].err);
            return -1;
        }
    return 0;
}

static inline int ej_steps(ej_job *j, int from, int to)
{
    for (int t = from; t < to; t++)
        if (ej_step(j, t))
            return -1;
    return 0;
}

static inline int ej_stop(ej_job *j)
{
    for (int r = 0; r < j->W; r++) {
        ps_client_close(j->c[r]);
        j->c[r] = NULL;
    }
    int bad = 0;
    for (int k = 0; k < j->S; k++)
        if (j->pid[k] > 0) {
            if (ps_test_stop(j->pid[k], 8000) != 0) {
                fprintf(stderr, "server %d did not exit 0 (log %s)\n", k, j->log[k]);
                bad = 1;
            }
            j->pid[k] = 0;
        }
    return bad;
}

/* ---- an export's files ---- */

/* Map dir/rel (rel as the manifest names it). */
static inline int ej_npy(const char *dir, const char *rel, ps_npy_in *in)
{
    char path[2048], why[512];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    int rc = ps_npy_open(in, path, why, sizeof why);
    if (rc)
        fprintf(stderr, "%s\n", why);
    return rc;
}

/* ---- an export's manifest (json-c) ---- */

/* dir's manifest.json, or NULL (json-c's reason printed); json_object_put it */
static inline struct json_object *ej_manifest(const char *dir)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct json_object *m = json_object_from_file(path);
    if (!m)
        fprintf(stderr, "%s: %s\n", path, json_util_get_last_err());
    return m;
}

/* Member key of object o, or NULL. */
static inline struct json_object *ej_get(struct json_object *o, const char *key)
{
    struct json_object *v = NULL;
    return o && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* The member's string, or NULL. */
static inline const char *ej_str(struct json_object *o, const char *key)
{
    struct json_object *v = ej_get(o, key);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

/* The member's integer, or def. */
static inline int64_t ej_int(struct json_object *o, const char *key, int64_t def)
{
    struct json_object *v = ej_get(o, key);
    return v && json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : def;
}

/* The manifest's table (or dense tensor) entry of key. */
static inline struct json_object *ej_entry(struct json_object *m, const char *list, uint64_t key)
{
    struct json_object *l = ej_get(m, list);
    size_t n = l && json_object_is_type(l, json_type_array) ? json_object_array_length(l) : 0;
    for (size_t k = 0; k < n; k++) {
        struct json_object *e = json_object_array_get_idx(l, k), *v = ej_get(e, "key");
        if (v && json_object_is_type(v, json_type_int) && json_object_get_uint64(v) == key)
            return e;
    }
    return NULL;
}

#endif
