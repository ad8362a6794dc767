/* An update thread's part of an export's snapshot (snapshot.h). */
#include "snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_snap.h"
#include "table_opt.h"

enum { TAKE, WAIT, BEHIND, PAST };

typedef struct want {
    uint32_t kind, index;
    uint64_t key;
    int64_t target;
} want;

struct ps_snap_job {
    ps_snap_config cfg;
    want *pend;
    size_t npend, cap_pend;
    ps_snap_buf **items;
    size_t n, cap;
    int rc;
    char why[256];
};

void ps_snap_buf_unref(ps_snap_buf *b)
{
    if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    if (b->mem_used)
        atomic_fetch_sub(b->mem_used, (uint64_t)b->len);
    free(b->data);
    free(b);
}

static int64_t target_of(const ps_snap_config *c, uint64_t key)
{
    for (size_t k = 0; k < c->ntargets; k++)
        if (c->targets[k].key == key)
            return c->targets[k].version;
    return c->target;
}

static int decide(int64_t version, int64_t target)
{
    if (target < 0 || version == target)
        return TAKE;
    if (version == target - 1)
        return WAIT;
    return version < target ? BEHIND : PAST;
}

static void failf(ps_snap_job *j, int rc, const char *what, uint64_t key, uint32_t index,
                  int64_t version, int64_t target)
{
    if (j->rc)
        return;
    j->rc = rc;
    if (rc == PS_ESTATE)
        snprintf(j->why, sizeof j->why, "server %d: key %llu %s %u is at version %lld, past the "
                 "%lld asked for (training went on: ask again)", j->cfg.server,
                 (unsigned long long)key, what, index, (long long)version, (long long)target);
    else if (rc == PS_ETOOBIG)
        snprintf(j->why, sizeof j->why, "server %d: the snapshot does not fit in --max-memory "
                 "(%llu bytes) beside the model (key %llu %s %u): raise --max-memory to export",
                 j->cfg.server, (unsigned long long)j->cfg.max_memory, (unsigned long long)key,
                 what, index);
    else
        snprintf(j->why, sizeof j->why, "server %d: out of memory copying key %llu %s %u",
                 j->cfg.server, (unsigned long long)key, what, index);
}

/* A new item's stream, charged and laid out; NULL (the job failed) when it
 * does not fit. */
static ps_snap_buf *new_item(ps_snap_job *j, ps_snap_item *it)
{
    const char *what = it->kind == PS_SNAP_CHUNK ? "chunk" : "partition";
    if (j->n == j->cap) {
        size_t nc = j->cap ? 2 * j->cap : 16;
        ps_snap_buf **a = realloc(j->items, nc * sizeof *a);
        if (!a) {
            failf(j, PS_ENOMEM, what, it->key, it->index, 0, 0);
            return NULL;
        }
        j->items = a;
        j->cap = nc;
    }
    size_t len = ps_snap_bytes(it);
    _Atomic uint64_t *mem = j->cfg.mem_used;
    if (mem && atomic_fetch_add(mem, (uint64_t)len) + len > j->cfg.max_memory) {
        atomic_fetch_sub(mem, (uint64_t)len);
        failf(j, PS_ETOOBIG, what, it->key, it->index, 0, 0);
        return NULL;
    }
    ps_snap_buf *b = calloc(1, sizeof *b);
    unsigned char *data = b ? malloc(len) : NULL;
    if (!data) {
        free(b);
        if (mem)
            atomic_fetch_sub(mem, (uint64_t)len);
        failf(j, PS_ENOMEM, what, it->key, it->index, 0, 0);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->len = len;
    b->mem_used = mem;
    ps_snap_layout(it, data);
    j->items[j->n++] = b;
    return b;
}

static void take_chunk(ps_snap_job *j, const ps_shard_chunk_view *v, uint32_t flags)
{
    ps_snap_item it = {.kind = PS_SNAP_CHUNK, .index = v->chunk, .server = j->cfg.server,
                       .key = v->key, .version = v->version, .total = v->total, .n = v->n,
                       .dim = 1, .nstate = (uint32_t)v->nstate, .flags = flags, .slen = 1};
    it.decl.opt = j->cfg.opt;
    if (!new_item(j, &it))
        return;
    memcpy(it.w, v->w, v->n * sizeof(float));
    for (int k = 0; k < v->nstate; k++)
        memcpy(it.state[k], v->state[k], v->n * sizeof(float));
}

typedef struct fill {
    ps_snap_item *it;
    size_t k;
} fill;

static void put_row(void *arg, const ps_table_row_view *r)
{
    fill *f = arg;
    ps_snap_item *it = f->it;
    if (f->k >= it->n)
        return; /* cannot be: the stats counted every row */
    size_t d = it->dim, at = f->k * d;
    it->ids[f->k] = r->id;
    it->counts[f->k] = r->count;
    memcpy(it->w + at, r->w, d * sizeof(float));
    for (uint32_t s = 0; s < it->nstate; s++) /* slen floats a row: the table's state_len */
        memcpy(it->state[s] + f->k * it->slen, r->state[s], it->slen * sizeof(float));
    f->k++;
}

static void take_part(ps_snap_job *j, const ps_tpart_view *v, uint32_t flags)
{
    ps_table_counts c;
    ps_table_stats(v->store, &c);
    ps_snap_item it = {.kind = PS_SNAP_PART, .index = v->part, .server = j->cfg.server,
                       .key = v->key, .version = v->version, .n = c.rows, .dim = v->decl->dim,
                       .nstate = (uint32_t)ps_table_state_arrays(v->decl->opt.kind),
                       .flags = flags, .decl = *v->decl,
                       .slen = (uint32_t)ps_table_state_len(v->decl->opt.kind, v->decl->dim)};
    snprintf(it.name, sizeof it.name, "%s", v->name ? v->name : "");
    if (!new_item(j, &it))
        return;
    fill f = {&it, 0};
    ps_table_foreach(v->store, PS_TABLE_ROWS_ALL, put_row, &f);
}

static void add_pending(ps_snap_job *j, uint32_t kind, uint64_t key, uint32_t index,
                        int64_t target)
{
    if (j->npend == j->cap_pend) {
        size_t nc = j->cap_pend ? 2 * j->cap_pend : 16;
        want *a = realloc(j->pend, nc * sizeof *a);
        if (!a) {
            failf(j, PS_ENOMEM, kind == PS_SNAP_CHUNK ? "chunk" : "partition", key, index, 0, 0);
            return;
        }
        j->pend = a;
        j->cap_pend = nc;
    }
    j->pend[j->npend++] = (want){kind, index, key, target};
}

/* What to do with one item now: begin (pending NULL) or a poll (its entry). */
static void consider(ps_snap_job *j, uint32_t kind, uint64_t key, uint32_t index,
                     int64_t version, want *pending, int force, const void *view)
{
    if (j->rc)
        return;
    int64_t target = pending ? pending->target : target_of(&j->cfg, key);
    int d = decide(version, target);
    const char *what = kind == PS_SNAP_CHUNK ? "chunk" : "partition";
    if (d == PAST) {
        failf(j, PS_ESTATE, what, key, index, version, target);
        return;
    }
    if (d == WAIT && !force) {
        if (!pending)
            add_pending(j, kind, key, index, target);
        return;
    }
    uint32_t flags = d == TAKE ? 0 : PS_SNAP_BEHIND;
    if (kind == PS_SNAP_CHUNK)
        take_chunk(j, view, flags);
    else
        take_part(j, view, flags);
    if (pending)
        pending->kind = 0; /* taken */
}

typedef struct scan {
    ps_snap_job *j;
    int begin, force;
} scan;

static want *find_pending(ps_snap_job *j, uint32_t kind, uint64_t key, uint32_t index)
{
    for (size_t k = 0; k < j->npend; k++)
        if (j->pend[k].kind == kind && j->pend[k].key == key && j->pend[k].index == index)
            return &j->pend[k];
    return NULL;
}

static void on_chunk(void *arg, const ps_shard_chunk_view *v)
{
    scan *sc = arg;
    want *p = sc->begin ? NULL : find_pending(sc->j, PS_SNAP_CHUNK, v->key, v->chunk);
    if (sc->begin || p)
        consider(sc->j, PS_SNAP_CHUNK, v->key, v->chunk, v->version, p, sc->force, v);
}

static void walk(ps_snap_job *j, const ps_shard *s, ps_tparts *tp, int begin, int force)
{
    scan sc = {j, begin, force};
    if (s)
        ps_shard_foreach(s, on_chunk, &sc);
    ps_tpart_view v;
    for (size_t i = 0; tp && ps_tparts_view(tp, i, &v); i++) {
        want *p = begin ? NULL : find_pending(j, PS_SNAP_PART, v.key, v.part);
        if (begin || p)
            consider(j, PS_SNAP_PART, v.key, v.part, v.version, p, force, &v);
    }
    /* drop what was taken */
    size_t w = 0;
    for (size_t k = 0; k < j->npend; k++)
        if (j->pend[k].kind)
            j->pend[w++] = j->pend[k];
    j->npend = w;
}

int ps_snap_begin(const ps_snap_config *cfg, const ps_shard *s, ps_tparts *tp,
                  ps_snap_job **out)
{
    ps_snap_job *j = calloc(1, sizeof *j);
    *out = j;
    if (!j)
        return PS_ENOMEM;
    j->cfg = *cfg;
    walk(j, s, tp, 1, 0);
    j->cfg.targets = NULL; /* the caller's: read only here */
    j->cfg.ntargets = 0;
    return 0;
}

int ps_snap_poll(ps_snap_job *j, const ps_shard *s, ps_tparts *tp, int force)
{
    if (!j->rc && j->npend)
        walk(j, s, tp, 0, force);
    if (force && !j->rc && j->npend) {
        /* cannot be: every pending item is a chunk or partition here */
        j->rc = PS_ESTATE;
        snprintf(j->why, sizeof j->why, "server %d: %zu items of the snapshot vanished",
                 j->cfg.server, j->npend);
    }
    return j->rc || !j->npend;
}

int ps_snap_end(ps_snap_job *j, ps_snap_buf ***items, size_t *n, char *why, size_t why_len)
{
    *items = NULL;
    *n = 0;
    int rc = j->rc;
    if (rc) {
        ps_errorf(why, why_len, "%s", j->why);
        for (size_t k = 0; k < j->n; k++)
            ps_snap_buf_unref(j->items[k]);
        free(j->items);
    } else {
        *items = j->items;
        *n = j->n;
    }
    free(j->pend);
    free(j);
    return rc;
}
