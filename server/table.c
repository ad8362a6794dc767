/* The table store (server/table.h): configuration, the frequency filter,
 * pulls, async pushes, checkpoint views and counters.  Its sync rounds are
 * table_round.c's (the struct and the helpers both use: table_internal.h),
 * the hash, the slabs and the memory charge table_hash.c's (below it), a
 * row's arithmetic table_opt.c's and its first values
 * common/ps_table_row.c's. */
#include "table.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_table_decl.h"
#include "ps_table_row.h"
#include "table_hash.h"
#include "table_internal.h"

_Static_assert(PS_TABLE_MAX_ROWS == TBL_MAX_ROWS, "table.h and table_hash.h disagree");


/* lookups run ahead of their use: the hash entry of the id PREFETCH ahead
 * is fetched, and the row record of the one PREFETCH / 2 ahead (its entry
 * fetched by then) */
#define PREFETCH 16

/* ---- configuration ---- */

int ps_table_check_config(const ps_table_config *c, char *why, size_t why_len)
{
    unsigned long long tk = (unsigned long long)c->table;
    if (ps_table_state_arrays(c->opt.kind) < 0) { /* the store takes no "none" */
        ps_errorf(why, why_len, "table %llu: the optimizer must be sgd, momentum, nesterov, "
            "adagrad, adam, ftrl or rowwise_adagrad, got kind %d (%s)", tk, c->opt.kind,
            ps_opt_name(c->opt.kind));
        return PS_EINVAL;
    }
    /* what a declaration has: its checks (proto/ps_table_decl.h) */
    ps_table_options d;
    memset(&d, 0, sizeof d);
    d.dim = c->dim;
    d.init = c->init;
    d.init_scale = c->init_scale;
    d.opt = c->opt;
    d.ftrl_beta = c->ftrl_beta;
    d.ftrl_l1 = c->ftrl_l1;
    d.ftrl_l2 = c->ftrl_l2;
    d.min_count = c->min_count;
    d.filter_cells = c->min_count >= 2 ? c->filter_cells : 0;
    int rc = ps_table_decl_check(c->table, &d, why, why_len);
    if (rc)
        return rc;
    if (c->max_rows > PS_TABLE_MAX_ROWS) {
        ps_errorf(why, why_len, "table %llu: the row cap must be at most %llu (0: none), got "
            "%llu", tk, (unsigned long long)PS_TABLE_MAX_ROWS, (unsigned long long)c->max_rows);
        return PS_EINVAL;
    }
    return 0;
}

int ps_table_create(const ps_table_config *cfg, ps_table **out, char *why, size_t why_len)
{
    *out = NULL;
    int rc = ps_table_check_config(cfg, why, why_len);
    if (rc)
        return rc;
    ps_table *t = calloc(1, sizeof *t);
    if (!t) {
        ps_errorf(why, why_len, "out of memory creating table %llu",
            (unsigned long long)cfg->table);
        return PS_ENOMEM;
    }
    t->cfg = *cfg;
    t->o = (tbl_opt){cfg->opt, cfg->ftrl_beta, cfg->ftrl_l1, cfg->ftrl_l2};
    t->nstate = ps_table_state_arrays(cfg->opt.kind);
    t->slen = ps_table_state_len(cfg->opt.kind, cfg->dim);
    t->last_rank = -1;
    t->maker = -1;
    t->ncells = cfg->min_count >= 2 ? (cfg->filter_cells ? cfg->filter_cells
                                                        : PS_TABLE_FILTER_CELLS) : 0;
    tbl_rows_config rc_ = {cfg->table,      cfg->dim + (uint32_t)(t->nstate * t->slen),
                           cfg->opt.kind == PS_OPT_ADAM, cfg->max_rows,
                           cfg->max_memory, cfg->mem_used,
                           cfg->worker_mem, cfg->num_workers,
                           cfg->worker_share};
    rc = tbl_rows_init(&t->r, &rc_, sizeof *t + cfg->dim * sizeof(float) + t->ncells, why,
                       why_len);
    if (rc) {
        free(t);
        return rc;
    }
    t->scratch = malloc(cfg->dim * sizeof(float));
    t->cells = t->ncells ? calloc(t->ncells, 1) : NULL;
    if (!t->scratch || (t->ncells && !t->cells)) {
        ps_table_destroy(t);
        ps_errorf(why, why_len, "out of memory creating table %llu",
            (unsigned long long)cfg->table);
        return PS_ENOMEM;
    }
    *out = t;
    return 0;
}

void ps_table_destroy(ps_table *t)
{
    if (!t)
        return;
    free(t->pos);
    free(t->cells);
    free(t->acc_ids);
    free(t->acc_rows);
    free(t->acc_map);
    free(t->acc_maker);
    free(t->scratch);
    tbl_rows_free(&t->r); /* gives back every byte charged */
    free(t);
}

const ps_table_config *ps_table_get_config(const ps_table *t) { return &t->cfg; }

void ps_table_initial_row(const ps_table_config *c, uint64_t id, float *out)
{
    ps_table_init_row(c->seed, c->table, id, c->init, c->init_scale, c->dim, out);
}

size_t ps_table_row_bytes(const ps_table *t)
{
    return (size_t)4 * (t->cfg.dim + (size_t)t->nstate * t->slen) +
           (t->cfg.opt.kind == PS_OPT_ADAM ? 4 : 0);
}

/* ---- the frequency filter: a counting Bloom filter, 3 cells per id ---- */

static void filter_cells3(const ps_table *t, uint64_t id, uint64_t c[3])
{
    uint64_t h = ps_table_mix(id ^ 0xbb67ae8584caa73bull);
    for (int k = 0; k < 3; k++)
        c[k] = tbl_home(ps_table_mix(h + (uint64_t)k * 0x9e3779b97f4a7c15ull), t->ncells);
}

/* The id's count: the least of its cells (never below its sightings). */
unsigned table_filter_count(const ps_table *t, uint64_t id)
{
    uint64_t c[3];
    filter_cells3(t, id, c);
    unsigned m = t->cells[c[0]];
    for (int k = 1; k < 3; k++)
        if (t->cells[c[k]] < m)
            m = t->cells[c[k]];
    return m;
}

/* One more sighting of id; its count after it.  Conservative update: only
 * the cells at the least value go up, so ids sharing cells inflate each
 * other's counts less. */
static unsigned filter_sight(ps_table *t, uint64_t id)
{
    uint64_t c[3];
    filter_cells3(t, id, c);
    unsigned m = 255;
    for (int k = 0; k < 3; k++)
        if (t->cells[c[k]] < m)
            m = t->cells[c[k]];
    if (m == 255)
        return m;
    for (int k = 0; k < 3; k++)
        if (t->cells[c[k]] == m)
            t->cells[c[k]] = (uint8_t)(m + 1);
    return m + 1;
}

/* A new row for id (its lookup ended at empty entry pos; room reserved):
 * the initializer's values, zero state.  Its entry's position. */
uint64_t table_create_row(ps_table *t, uint64_t id, uint64_t pos)
{
    pos = tbl_create_row(&t->r, id, pos);
    float *w = tbl_rec_w(tbl_rec(&t->r, tbl_slot_at(&t->r, pos)));
    ps_table_initial_row(&t->cfg, id, w);
    memset(w + t->cfg.dim, 0, (size_t)t->nstate * t->slen * sizeof(float));
    return pos;
}

/* ---- a request's rows: look them all up first (and reserve room for
 * those missing), so a request is refused before it changes anything ---- */

int table_size_error(const ps_table *t, const char *what, size_t n, size_t len, char *why,
                      size_t why_len)
{
    ps_errorf(why, why_len, "%s of %zu ids with %zu floats: table %llu has rows of %u floats, "
        "so %zu were expected", what, n, len, (unsigned long long)t->cfg.table, t->cfg.dim,
        n * t->cfg.dim);
    return PS_EPROTO;
}

/* t->pos grows with the largest request, charged to max_memory like the
 * rows; one past POS_KEEP entries (a large request) goes back after it. */
#define POS_KEEP 65536u

int table_pos_reserve(ps_table *t, size_t n, char *why, size_t why_len)
{
    if (n <= t->npos)
        return 0;
    size_t ncap = t->npos ? t->npos : 256;
    while (ncap < n)
        ncap *= 2;
    uint64_t more = (uint64_t)(ncap - t->npos) * sizeof *t->pos;
    if (!tbl_charge(&t->r, more)) {
        ps_errorf(why, why_len, "table %llu: no room in --max-memory (%llu bytes) for the "
            "scratch of a request of %zu ids", (unsigned long long)t->cfg.table,
            (unsigned long long)t->cfg.max_memory, n);
        return PS_ETOOBIG;
    }
    uint64_t *p = realloc(t->pos, ncap * sizeof *p);
    if (!p) {
        tbl_uncharge(&t->r, more);
        ps_errorf(why, why_len, "table %llu: out of memory for a request of %zu ids",
            (unsigned long long)t->cfg.table, n);
        return PS_ENOMEM;
    }
    t->pos = p;
    t->npos = ncap;
    return 0;
}

/* A refused request changes nothing: its scratch back to the npos it had. */
void table_pos_undo(ps_table *t, size_t npos)
{
    if (t->npos <= npos)
        return;
    uint64_t *p = npos ? realloc(t->pos, npos * sizeof *p) : NULL;
    if (npos && !p)
        return; /* stays larger, still charged */
    if (!npos)
        free(t->pos);
    tbl_uncharge(&t->r, (uint64_t)(t->npos - npos) * sizeof *t->pos);
    t->pos = p;
    t->npos = npos;
}

void table_pos_release(ps_table *t)
{
    if (t->npos <= POS_KEEP)
        return;
    tbl_uncharge(&t->r, (uint64_t)t->npos * sizeof *t->pos);
    free(t->pos);
    t->pos = NULL;
    t->npos = 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The distinct values among v[0..n) (a copy sorted; n when out of memory:
 * the caller then charges them all).  A request's duplicate ids make one
 * row: they are counted once where rows are charged. */
size_t table_count_distinct(const uint64_t *v, size_t n)
{
    if (n < 2)
        return n;
    uint64_t *c = malloc(n * sizeof *c);
    if (!c)
        return n;
    memcpy(c, v, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_u64);
    size_t d = 1;
    for (size_t i = 1; i < n; i++)
        d += c[i] != c[i - 1];
    free(c);
    return d;
}

/* The distinct ids of ids[0..n) whose pos is `mark` (NO_ROW: those missing). */
static uint64_t distinct_missing(const ps_table *t, const uint64_t *ids, size_t n)
{
    uint64_t *m = malloc(n * sizeof *m);
    size_t k = 0;
    if (!m)
        return n;
    for (size_t i = 0; i < n; i++)
        if (t->pos[i] == NO_ROW)
            m[k++] = ids[i];
    size_t d = table_count_distinct(m, k);
    free(m);
    return d;
}

/* A capped table that refuses new rows when full (ps_table_config.
 * full_refuse): PS_ETOOBIG when `missing` more rows (each distinct id once;
 * *missing may come down to that) do not fit under the cap with the rows
 * that exist and those a sync round reserved. */
int table_full_refuses(ps_table *t, const uint64_t *ids, size_t n, uint64_t *missing,
                        char *why, size_t why_len)
{
    uint64_t have = t->r.rows + t->r.reserved;
    if (have + *missing <= t->cfg.max_rows)
        return 0;
    if (ids && *missing > 1)
        *missing = distinct_missing(t, ids, n);
    if (have + *missing <= t->cfg.max_rows)
        return 0;
    ps_errorf(why, why_len, "table %llu is full here: %llu rows, its max_rows share %llu, and "
        "it refuses new rows then (full=refuse): %llu new ids refused",
        (unsigned long long)t->cfg.table, (unsigned long long)have,
        (unsigned long long)t->cfg.max_rows, (unsigned long long)*missing);
    return PS_ETOOBIG;
}

/* Entry positions of ids[0..n) into t->pos (NO_ROW: no row yet), and room
 * for the rows missing, each id once.  *gen: the hash's generation they
 * hold for.  t->pos is scratch (pos_reserve; the caller calls pos_release
 * once done). */
static int look_up(ps_table *t, const uint64_t *ids, size_t n, uint64_t *gen, uint64_t *charged,
                   char *why, size_t why_len)
{
    *charged = 0;
    int rc = table_pos_reserve(t, n, why, why_len);
    if (rc)
        return rc;
    uint64_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + PREFETCH < n)
            __builtin_prefetch(&t->r.map[tbl_home(tbl_hash(ids[i + PREFETCH]), t->r.hcap)]);
        if (i + PREFETCH / 2 < n) {
            uint32_t e = t->r.map[tbl_home(tbl_hash(ids[i + PREFETCH / 2]), t->r.hcap)];
            if (e)
                __builtin_prefetch(tbl_rec(&t->r, (e & TBL_SLOT) - 1));
        }
        int found;
        uint64_t p = tbl_find(&t->r, ids[i], &found);
        t->pos[i] = found ? p : NO_ROW;
        missing += !found;
    }
    *gen = t->r.map_gen; /* before the reserve: growing the hash moves the entries */
    if (!missing)
        return 0;
    /* the rows it may make: charged to its worker's share first, then room */
    rc = tbl_worker_charge(&t->r, t->maker, missing, why, why_len);
    int distinct = 0;
    if (rc && missing > 1) { /* each distinct id once */
        missing = distinct_missing(t, ids, n);
        distinct = 1;
        rc = tbl_worker_charge(&t->r, t->maker, missing, why, why_len);
    }
    if (rc)
        return rc;
    *charged = t->r.cfg.worker_mem ? missing : 0;
    if (t->cfg.full_refuse && (rc = table_full_refuses(t, ids, n, &missing, why, why_len)) != 0) {
        tbl_worker_uncharge(&t->r, t->maker, *charged);
        *charged = 0;
        return rc;
    }
    if (tbl_has_room(&t->r, missing))
        return 0;
    if (missing > 1 && !distinct) {
        uint64_t d = distinct_missing(t, ids, n);
        tbl_worker_uncharge(&t->r, t->maker, *charged ? missing - d : 0);
        missing = d;
        *charged = *charged ? d : 0;
    }
    rc = tbl_has_room(&t->r, missing) ? 0 : tbl_reserve(&t->r, missing, 0, why, why_len);
    if (rc) {
        tbl_worker_uncharge(&t->r, t->maker, *charged);
        *charged = 0;
    }
    return rc;
}

/* A pull's or push's rows are made: what its worker was charged for and
 * did not make (ids the filter did not admit, duplicates) goes back. */
static void charge_settle(ps_table *t, uint64_t charged, uint64_t created_before)
{
    uint64_t made = t->r.created - created_before;
    if (charged > made)
        tbl_worker_uncharge(&t->r, t->maker, charged - made);
}

void ps_table_set_maker(ps_table *t, int rank)
{
    t->maker = rank;
    t->r.maker = rank >= 0 ? (uint32_t)rank : TBL_NO_MAKER;
}

/* The entry of ids[i]'s row now: as looked up while the hash has not moved,
 * else found again; a row missing is created unless the filter has not
 * admitted the id (sight: a pull, which counts as a sighting first): then
 * NO_ROW. */
static uint64_t entry_of(ps_table *t, size_t i, uint64_t id, uint64_t gen, int sight)
{
    if (t->pos[i] != NO_ROW && t->r.map_gen == gen)
        return t->pos[i];
    int found;
    uint64_t p = tbl_find(&t->r, id, &found);
    if (found)
        return p;
    if (t->cells && (sight ? filter_sight(t, id) : table_filter_count(t, id)) < t->cfg.min_count)
        return NO_ROW;
    return table_create_row(t, id, p);
}

/* Fetch the record of the row ids[i] a few ids ahead (its first lines) */
static void prefetch_row(const ps_table *t, size_t i, size_t n, uint64_t gen)
{
    i += 4;
    if (i >= n || t->pos[i] == NO_ROW || t->r.map_gen != gen)
        return;
    const char *rec = tbl_rec(&t->r, tbl_slot_at(&t->r, t->pos[i]));
    size_t b = t->r.stride < 256 ? t->r.stride : 256;
    for (size_t o = 0; o < b; o += 64)
        __builtin_prefetch(rec + o, 1);
}

int ps_table_pull(ps_table *t, const uint64_t *ids, size_t n, float *out, size_t out_len,
                  char *why, size_t why_len)
{
    size_t d = t->cfg.dim;
    if (out_len != n * d)
        return table_size_error(t, "pull", n, out_len, why, why_len);
    if (t->cfg.passive_pulls) { /* nothing created, nothing touched */
        for (size_t i = 0; i < n; i++) {
            float *o = out + i * d;
            uint32_t e = tbl_lookup(&t->r, ids[i]);
            if (e) {
                memcpy(o, tbl_rec_w(tbl_rec(&t->r, e - 1)), d * sizeof(float));
                continue;
            }
            ps_table_initial_row(&t->cfg, ids[i], o);
            if (t->cells && filter_sight(t, ids[i]) < t->cfg.min_count)
                t->st.filtered_pulls++;
        }
        t->st.pulled += n;
        return 0;
    }
    uint64_t gen, charged, created = t->r.created;
    size_t npos = t->npos;
    int rc = look_up(t, ids, n, &gen, &charged, why, why_len);
    if (rc) {
        table_pos_undo(t, npos);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        float *o = out + i * d;
        prefetch_row(t, i, n, gen);
        uint64_t p = entry_of(t, i, ids[i], gen, 1);
        if (p == NO_ROW) {
            ps_table_initial_row(&t->cfg, ids[i], o);
            t->st.filtered_pulls++;
            continue;
        }
        uint32_t s = tbl_slot_at(&t->r, p);
        memcpy(o, tbl_rec_w(tbl_rec(&t->r, s)), d * sizeof(float));
        tbl_touch(&t->r, s);
    }
    t->st.pulled += n;
    charge_settle(t, charged, created);
    table_pos_release(t);
    return 0;
}

/* Update the row of entry p with gradient row g at rate lr, counting as m
 * updates. */
void table_update_row(ps_table *t, uint64_t p, const float *g, float lr, int64_t m)
{
    uint32_t s = tbl_slot_at(&t->r, p);
    t->r.map[p] |= TBL_DIRTY;
    char *rec = tbl_rec(&t->r, s);
    size_t kept = tbl_apply_row(&t->o, tbl_rec_w(rec), t->cfg.dim, tbl_cnt(&t->r, s), g, lr, m,
                                t->cfg.guard);
    if (kept) {
        if (t->nf.rows++ == 0)
            t->nf.id = tbl_rec_id(rec);
        t->nf.values += kept;
    }
    tbl_touch(&t->r, s);
    t->st.updated++;
}

void table_take_opt(ps_table *t, int64_t version)
{
    int k = 0;
    while (k < t->nsched && t->sched[k].from <= version) {
        t->cfg.opt = t->sched[k].opt;
        t->o.opt = t->sched[k].opt;
        k++;
    }
    if (k) {
        t->nsched -= k;
        memmove(t->sched, t->sched + k, (size_t)t->nsched * sizeof t->sched[0]);
    }
}

void ps_table_set_opt(ps_table *t, int64_t from, const ps_opt_config *opt)
{
    if (t->nsched == TABLE_SCHED) /* the oldest change is due first: it takes effect now */
        table_take_opt(t, t->sched[0].from);
    ps_opt_config o = *opt;
    o.kind = t->cfg.opt.kind;
    int at = t->nsched; /* in the order of `from` (after the changes of the same) */
    while (at > 0 && t->sched[at - 1].from > from)
        at--;
    memmove(t->sched + at + 1, t->sched + at, (size_t)(t->nsched - at) * sizeof t->sched[0]);
    t->sched[at].from = from;
    t->sched[at].opt = o;
    t->nsched++;
    table_take_opt(t, t->version);
}

int ps_table_assign(ps_table *t, const uint64_t *ids, size_t n, const float *rows, size_t len,
                    char *why, size_t why_len)
{
    size_t d = t->cfg.dim;
    if (len != n * d)
        return table_size_error(t, "assign", n, len, why, why_len);
    uint64_t gen, charged, created = t->r.created;
    size_t npos = t->npos;
    int rc = look_up(t, ids, n, &gen, &charged, why, why_len); /* room for the rows to make */
    if (rc) {
        table_pos_undo(t, npos);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t p = t->pos[i];
        if (p == NO_ROW || t->r.map_gen != gen) {
            int found;
            p = tbl_find(&t->r, ids[i], &found);
            if (!found)
                p = table_create_row(t, ids[i], p);
        }
        uint32_t s = tbl_slot_at(&t->r, p);
        float *w = tbl_rec_w(tbl_rec(&t->r, s));
        memcpy(w, rows + i * d, d * sizeof(float));
        memset(w + d, 0, (size_t)t->nstate * t->slen * sizeof(float));
        uint32_t *c = tbl_cnt(&t->r, s);
        if (c)
            *c = 0;
        t->r.map[p] |= TBL_DIRTY;
        tbl_touch(&t->r, s);
    }
    charge_settle(t, charged, created);
    table_pos_release(t);
    return 0;
}

int ps_table_push(ps_table *t, const uint64_t *ids, size_t n, const float *g, size_t g_len,
                  int64_t m, char *why, size_t why_len)
{
    size_t d = t->cfg.dim;
    table_take_opt(t, t->version);
    if (g_len != n * d)
        return table_size_error(t, "push", n, g_len, why, why_len);
    if (m < 1) {
        ps_errorf(why, why_len, "a push to table %llu summing %lld gradients: at least 1",
            (unsigned long long)t->cfg.table, (long long)m);
        return PS_EPROTO;
    }
    uint64_t gen, charged, created = t->r.created;
    size_t npos = t->npos;
    int rc = look_up(t, ids, n, &gen, &charged, why, why_len);
    if (rc) {
        table_pos_undo(t, npos);
        return rc;
    }
    float lr = ps_opt_lr_at(&t->cfg.opt, t->version + m);
    float inv = 1.0f / (float)m;
    for (size_t i = 0; i < n; i++) {
        prefetch_row(t, i, n, gen);
        uint64_t p = entry_of(t, i, ids[i], gen, 0);
        if (p == NO_ROW) {
            t->st.filtered_pushes++;
            continue;
        }
        const float *gi = g + i * d;
        if (m > 1) {
            /* the mean of the gradients summed, as ps_shard_push_sum */
            for (size_t k = 0; k < d; k++)
                t->scratch[k] = gi[k] * inv;
            gi = t->scratch;
        }
        table_update_row(t, p, gi, lr, m);
    }
    t->version += m;
    t->st.pushed += n;
    charge_settle(t, charged, created);
    table_pos_release(t);
    return 0;
}

void ps_table_take_nonfinite(ps_table *t, ps_table_nonfinite *out)
{
    *out = t->nf;
    memset(&t->nf, 0, sizeof t->nf);
}

int64_t ps_table_version(const ps_table *t) { return t->version; }

void ps_table_set_version(ps_table *t, int64_t version) { t->version = version; }

/* ---- checkpoints ---- */

static void view_of(const ps_table *t, uint32_t s, ps_table_row_view *v)
{
    char *rec = tbl_rec(&t->r, s);
    size_t d = t->cfg.dim;
    uint32_t *c = tbl_cnt(&t->r, s);
    v->id = tbl_rec_id(rec);
    v->dim = t->cfg.dim;
    v->nstate = t->nstate;
    v->state_len = (uint32_t)t->slen;
    v->w = tbl_rec_w(rec);
    v->state[0] = t->nstate >= 1 ? v->w + d : NULL;
    v->state[1] = t->nstate >= 2 ? v->w + d + t->slen : NULL;
    v->count = c ? *c : 0;
}

int ps_table_get_row(const ps_table *t, uint64_t id, ps_table_row_view *v)
{
    uint32_t e = tbl_lookup(&t->r, id);
    if (!e)
        return 0;
    view_of(t, e - 1, v);
    return 1;
}

void ps_table_foreach(const ps_table *t, int which,
                      void (*fn)(void *arg, const ps_table_row_view *v), void *arg)
{
    ps_table_row_view v;
    if (which == PS_TABLE_ROWS_DIRTY) {
        for (uint64_t i = 0; i < t->r.hcap; i++)
            if (t->r.map[i] & TBL_DIRTY) {
                view_of(t, (t->r.map[i] & TBL_SLOT) - 1, &v);
                fn(arg, &v);
            }
    } else if (t->cfg.max_rows) {
        for (uint32_t s = t->r.lru_tail; s != TBL_NIL; s = tbl_lru_prev(&t->r, s)) {
            view_of(t, s, &v);
            fn(arg, &v);
        }
    } else {
        for (uint64_t s = 0; s < t->r.rows; s++) {
            view_of(t, (uint32_t)s, &v);
            fn(arg, &v);
        }
    }
}

const uint64_t *ps_table_deleted(const ps_table *t, size_t *n)
{
    *n = t->r.deleted_lost ? 0 : t->r.ndeleted;
    return t->r.deleted_lost ? NULL : t->r.deleted;
}

void ps_table_mark_clean(ps_table *t) { tbl_mark_clean(&t->r); }

int ps_table_delta_ok(const ps_table *t) { return t->r.tracking && !t->r.deleted_lost; }

int ps_table_touch(ps_table *t, uint64_t id)
{
    uint32_t e = tbl_lookup(&t->r, id);
    if (e)
        tbl_touch(&t->r, e - 1);
    return e != 0;
}

int ps_table_restore_row(ps_table *t, const ps_table_row_view *v, char *why, size_t why_len)
{
    if (v->dim != t->cfg.dim || v->nstate != t->nstate) {
        ps_errorf(why, why_len, "row %llu has %u values and %d state arrays; table %llu (%s) "
            "has rows of %u values and %d", (unsigned long long)v->id, v->dim, v->nstate,
            (unsigned long long)t->cfg.table, ps_table_opt_name(t->cfg.opt.kind), t->cfg.dim,
            t->nstate);
        return PS_EMISMATCH;
    }
    int found;
    uint64_t p = tbl_find(&t->r, v->id, &found);
    if (!found) {
        if (!tbl_has_room(&t->r, 1)) {
            int rc = tbl_reserve(&t->r, 1, 0, why, why_len);
            if (rc)
                return rc;
            p = tbl_find(&t->r, v->id, &found);
        }
        p = tbl_create_row(&t->r, v->id, p); /* no initializer: every float is v's, below */
    }
    uint32_t s = tbl_slot_at(&t->r, p);
    size_t d = t->cfg.dim;
    float *w = tbl_rec_w(tbl_rec(&t->r, s));
    memcpy(w, v->w, d * sizeof(float));
    for (int k = 0; k < t->nstate; k++)
        memcpy(w + d + (size_t)k * t->slen, v->state[k], t->slen * sizeof(float));
    uint32_t *c = tbl_cnt(&t->r, s);
    if (c)
        *c = v->count;
    t->r.map[p] |= TBL_DIRTY;
    tbl_touch(&t->r, s);
    return 0;
}

int ps_table_reserve(ps_table *t, uint64_t rows, char *why, size_t why_len)
{
    return tbl_has_room(&t->r, rows) ? 0 : tbl_reserve(&t->r, rows, 0, why, why_len);
}

int ps_table_remove(ps_table *t, uint64_t id)
{
    int found;
    uint64_t p = tbl_find(&t->r, id, &found);
    if (!found)
        return 0;
    tbl_delete_row(&t->r, p);
    return 1;
}

const uint8_t *ps_table_filter_cells(const ps_table *t, size_t *n)
{
    *n = t->ncells;
    return t->cells;
}

int ps_table_restore_filter(ps_table *t, const uint8_t *cells, size_t n, char *why,
                            size_t why_len)
{
    if (n != t->ncells) {
        ps_errorf(why, why_len, "table %llu's frequency filter has %zu cells; the checkpoint "
            "has %zu", (unsigned long long)t->cfg.table, t->ncells, n);
        return PS_EMISMATCH;
    }
    if (n)
        memcpy(t->cells, cells, n);
    return 0;
}

/* ---- counters ---- */

void ps_table_stats(const ps_table *t, ps_table_counts *out)
{
    *out = t->st;
    out->created += t->r.created;
    out->evicted += t->r.evicted;
    out->lookups = t->r.lookups;
    out->probes = t->r.probes;
    out->rows = t->r.rows;
    out->bytes = t->r.bytes;
    out->slots = t->r.slot_cap;
    out->hash_entries = t->r.hcap;
}

void ps_table_set_counters(ps_table *t, const ps_table_counts *c)
{
    t->r.created = t->r.evicted = 0;
    t->st.created = c->created;
    t->st.evicted = c->evicted;
    t->st.filtered_pulls = c->filtered_pulls;
    t->st.filtered_pushes = c->filtered_pushes;
    t->st.pulled = c->pulled;
    t->st.pushed = c->pushed;
    t->st.updated = c->updated;
    t->st.rounds = c->rounds;
}

void ps_table_add_counters(ps_table *t, const ps_table_counts *b)
{
    t->st.created += b->created;
    t->st.evicted += b->evicted;
    t->st.filtered_pulls += b->filtered_pulls;
    t->st.filtered_pushes += b->filtered_pushes;
    t->st.pulled += b->pulled;
    t->st.pushed += b->pushed;
    t->st.updated += b->updated;
    t->st.rounds += b->rounds;
}
