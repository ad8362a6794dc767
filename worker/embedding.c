#include "embedding.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_table_row.h"
#include "rng.h"

/* ---- the layer ------------------------------------------------------------ */

static int32_t bag_begin(const ps_emb_bags *bags, int s)
{
    return bags->offsets ? bags->offsets[s] : s;
}

static int32_t bag_end(const ps_emb_bags *bags, int s)
{
    return bags->offsets ? bags->offsets[s + 1] : s + 1;
}

/* What each entry of bag s is scaled by beyond its weight: 1, or 1/count
 * for a mean (0 for a bag of padding alone, which pools to zeros). */
static float bag_scale(const ps_emb_bags *bags, ps_pool pool, int s)
{
    if (pool != PS_POOL_MEAN)
        return 1.0f;
    int count = 0;
    for (int32_t e = bag_begin(bags, s); e < bag_end(bags, s); e++)
        count += bags->index[e] >= 0;
    return count ? 1.0f / (float)count : 0.0f;
}

static int check_bags(ps_backend *b, const ps_emb_bags *bags, int dim)
{
    if (!b->host_memory)
        return PS_EDEVICE; /* host loops: no device kernels yet */
    if (bags->nbags < 0 || dim < 1)
        return PS_EINVAL;
    if (bags->offsets && bags->nbags > 0 && bags->offsets[0] != 0)
        return PS_EINVAL;
    for (int s = 0; bags->offsets && s < bags->nbags; s++)
        if (bags->offsets[s + 1] < bags->offsets[s])
            return PS_EINVAL;
    int32_t entries = bag_begin(bags, bags->nbags);
    for (int32_t e = 0; e < entries; e++)
        if (bags->index[e] >= 0 && (size_t)bags->index[e] >= bags->nrows)
            return PS_EINVAL;
    return 0;
}

int ps_emb_bag_forward(ps_backend *b, const ps_emb_bags *bags, ps_pool pool, const float *rows,
                       int dim, float *out, size_t out_stride)
{
    int rc = check_bags(b, bags, dim);
    if (rc)
        return rc;
    for (int s = 0; s < bags->nbags; s++) {
        float *o = out + (size_t)s * out_stride;
        for (int j = 0; j < dim; j++)
            o[j] = 0.0f;
        for (int32_t e = bag_begin(bags, s); e < bag_end(bags, s); e++) {
            if (bags->index[e] < 0)
                continue;
            const float *r = rows + (size_t)bags->index[e] * dim;
            float w = bags->weights ? bags->weights[e] : 1.0f;
            for (int j = 0; j < dim; j++)
                o[j] += w * r[j];
        }
        float scale = bag_scale(bags, pool, s);
        if (scale != 1.0f)
            for (int j = 0; j < dim; j++)
                o[j] *= scale;
    }
    return 0;
}

int ps_emb_bag_backward(ps_backend *b, const ps_emb_bags *bags, ps_pool pool, const float *dout,
                        size_t dout_stride, int dim, float *grads)
{
    int rc = check_bags(b, bags, dim);
    if (rc)
        return rc;
    memset(grads, 0, bags->nrows * (size_t)dim * sizeof *grads);
    for (int s = 0; s < bags->nbags; s++) {
        const float *d = dout + (size_t)s * dout_stride;
        float scale = bag_scale(bags, pool, s);
        for (int32_t e = bag_begin(bags, s); e < bag_end(bags, s); e++) {
            int32_t u = bags->index[e];
            if (u < 0)
                continue;
            float w = (bags->weights ? bags->weights[e] : 1.0f) * scale;
            float *g = grads + (size_t)u * dim;
            for (int j = 0; j < dim; j++)
                g[j] += w * d[j];
        }
    }
    return 0;
}

/* ---- one table's share of a batch ------------------------------------------ */

int ps_emb_batch_init(ps_emb_batch *eb, size_t max_entries, int dim)
{
    memset(eb, 0, sizeof *eb);
    if (max_entries < 1 || max_entries > INT32_MAX / 4 || dim < 1 ||
        max_entries > SIZE_MAX / sizeof(float) / (size_t)dim)
        return PS_EINVAL;
    eb->dim = dim;
    eb->max_entries = max_entries;
    /* at most half full: probes stay short */
    eb->hcap = 1;
    while (eb->hcap < 2 * max_entries)
        eb->hcap *= 2;
    eb->ids = malloc(max_entries * sizeof *eb->ids);
    eb->index = malloc(max_entries * sizeof *eb->index);
    eb->rows = malloc(max_entries * (size_t)dim * sizeof *eb->rows);
    eb->grads = malloc(max_entries * (size_t)dim * sizeof *eb->grads);
    eb->hkey = malloc(eb->hcap * sizeof *eb->hkey);
    eb->hrow = malloc(eb->hcap * sizeof *eb->hrow);
    eb->hstamp = calloc(eb->hcap, sizeof *eb->hstamp);
    if (!eb->ids || !eb->index || !eb->rows || !eb->grads || !eb->hkey || !eb->hrow ||
        !eb->hstamp) {
        ps_emb_batch_release(eb);
        return PS_ENOMEM;
    }
    return 0;
}

void ps_emb_batch_release(ps_emb_batch *eb)
{
    free(eb->ids);
    free(eb->index);
    free(eb->rows);
    free(eb->grads);
    free(eb->hkey);
    free(eb->hrow);
    free(eb->hstamp);
    memset(eb, 0, sizeof *eb);
}

int ps_emb_batch_set(ps_emb_batch *eb, const uint64_t *ids, size_t n, size_t stride,
                     const uint64_t *pad)
{
    if (n > eb->max_entries)
        return PS_EINVAL;
    if (++eb->stamp == 0) { /* wrapped: stamps of 2^32 batches ago would match */
        memset(eb->hstamp, 0, eb->hcap * sizeof *eb->hstamp);
        eb->stamp = 1;
    }
    size_t mask = eb->hcap - 1, nu = 0;
    for (size_t e = 0; e < n; e++) {
        uint64_t id = ids[e * stride];
        if (pad && id == *pad) {
            eb->index[e] = -1;
            continue;
        }
        size_t h = (size_t)ps_rng_mix(id) & mask;
        while (eb->hstamp[h] == eb->stamp && eb->hkey[h] != id)
            h = (h + 1) & mask;
        if (eb->hstamp[h] != eb->stamp) {
            eb->hstamp[h] = eb->stamp;
            eb->hkey[h] = id;
            eb->hrow[h] = (int32_t)nu;
            eb->ids[nu++] = id;
        }
        eb->index[e] = eb->hrow[h];
    }
    eb->nentries = n;
    eb->nunique = nu;
    return 0;
}

/* ---- local tables ---------------------------------------------------------- */

void ps_emb_init_row(uint64_t seed, int table, uint64_t id, int dim, float *row)
{
    ps_table_init_row(seed, PS_EMB_TABLE_KEY(table), id, PS_TABLE_INIT_UNIFORM, PS_EMB_INIT_SCALE,
                      (uint32_t)dim, row);
}

typedef struct local_table {
    size_t count, cap; /* rows made, rows the slabs hold */
    float *w;          /* cap x dim values */
    float *h;          /* cap x dim adagrad sums (adagrad only) */
    /* id -> row + 1 (0: an empty slot); a power of two, at most half full */
    size_t hcap;
    uint64_t *keys;
    size_t *rowp1;
} local_table;

typedef struct local_source {
    ps_row_source iface;
    int ntables, dim, opt;
    uint64_t seed;
    float lr, eps;
    local_table *t;
} local_source;

static int table_grow_map(local_table *t)
{
    size_t ncap = t->hcap ? 2 * t->hcap : 1024;
    uint64_t *keys = malloc(ncap * sizeof *keys);
    size_t *rowp1 = calloc(ncap, sizeof *rowp1);
    if (!keys || !rowp1) {
        free(keys);
        free(rowp1);
        return PS_ENOMEM;
    }
    for (size_t i = 0; i < t->hcap; i++) {
        if (!t->rowp1[i])
            continue;
        size_t h = (size_t)ps_rng_mix(t->keys[i]) & (ncap - 1);
        while (rowp1[h])
            h = (h + 1) & (ncap - 1);
        keys[h] = t->keys[i];
        rowp1[h] = t->rowp1[i];
    }
    free(t->keys);
    free(t->rowp1);
    t->keys = keys;
    t->rowp1 = rowp1;
    t->hcap = ncap;
    return 0;
}

static int table_grow_rows(local_source *ls, local_table *t)
{
    size_t ncap = t->cap ? 2 * t->cap : 1024, width = (size_t)ls->dim * sizeof(float);
    if (ncap > SIZE_MAX / width)
        return PS_ENOMEM;
    float *w = realloc(t->w, ncap * width);
    if (!w)
        return PS_ENOMEM;
    t->w = w;
    if (ls->opt == PS_OPT_ADAGRAD) {
        float *h = realloc(t->h, ncap * width);
        if (!h)
            return PS_ENOMEM;
        t->h = h;
    }
    t->cap = ncap;
    return 0;
}

/* The row of id in table ti, made (initialized) when it does not exist. */
static int table_row(local_source *ls, int ti, uint64_t id, float **row, float **sum)
{
    local_table *t = &ls->t[ti];
    int rc;
    if (2 * (t->count + 1) > t->hcap && (rc = table_grow_map(t)))
        return rc;
    size_t h = (size_t)ps_rng_mix(id) & (t->hcap - 1);
    while (t->rowp1[h] && t->keys[h] != id)
        h = (h + 1) & (t->hcap - 1);
    size_t dim = (size_t)ls->dim;
    if (!t->rowp1[h]) {
        if (t->count == t->cap && (rc = table_grow_rows(ls, t)))
            return rc;
        ps_emb_init_row(ls->seed, ti, id, ls->dim, t->w + t->count * dim);
        if (t->h)
            memset(t->h + t->count * dim, 0, dim * sizeof(float));
        t->keys[h] = id;
        t->rowp1[h] = ++t->count;
    }
    *row = t->w + (t->rowp1[h] - 1) * dim;
    *sum = t->h ? t->h + (t->rowp1[h] - 1) * dim : NULL;
    return 0;
}

static int local_fetch(ps_row_source *s, int table, const uint64_t *ids, size_t n, float *rows)
{
    local_source *ls = s->ctx;
    if (table < 0 || table >= ls->ntables)
        return PS_EINVAL;
    size_t dim = (size_t)ls->dim;
    for (size_t i = 0; i < n; i++) {
        float *row, *sum;
        int rc = table_row(ls, table, ids[i], &row, &sum);
        if (rc)
            return rc;
        memcpy(rows + i * dim, row, dim * sizeof(float));
    }
    return 0;
}

static int local_push(ps_row_source *s, int table, const uint64_t *ids, size_t n,
                      const float *grads, int64_t step)
{
    local_source *ls = s->ctx;
    (void)step;
    if (table < 0 || table >= ls->ntables)
        return PS_EINVAL;
    int dim = ls->dim;
    float lr = ls->lr, eps = ls->eps;
    for (size_t i = 0; i < n; i++) {
        float *w, *h;
        int rc = table_row(ls, table, ids[i], &w, &h);
        if (rc)
            return rc;
        const float *g = grads + i * (size_t)dim;
        if (h) {
            for (int j = 0; j < dim; j++) {
                h[j] += g[j] * g[j];
                w[j] -= lr * g[j] / (sqrtf(h[j]) + eps);
            }
        } else {
            for (int j = 0; j < dim; j++)
                w[j] -= lr * g[j];
        }
    }
    return 0;
}

static void local_destroy(ps_row_source *s)
{
    if (!s)
        return;
    local_source *ls = s->ctx;
    for (int i = 0; ls->t && i < ls->ntables; i++) {
        free(ls->t[i].w);
        free(ls->t[i].h);
        free(ls->t[i].keys);
        free(ls->t[i].rowp1);
    }
    free(ls->t);
    free(ls);
}

int ps_row_source_local_create(int tables, int dim, uint64_t seed, int opt, float lr, float eps,
                               ps_row_source **out)
{
    *out = NULL;
    if (tables < 1 || dim < 1 || (opt != PS_OPT_SGD && opt != PS_OPT_ADAGRAD) || !(lr > 0) ||
        !(eps > 0))
        return PS_EINVAL;
    local_source *ls = calloc(1, sizeof *ls);
    if (!ls || !(ls->t = calloc((size_t)tables, sizeof *ls->t))) {
        free(ls);
        return PS_ENOMEM;
    }
    ls->ntables = tables;
    ls->dim = dim;
    ls->opt = opt;
    ls->seed = seed;
    ls->lr = lr;
    ls->eps = eps;
    ls->iface.name = "local tables";
    ls->iface.ctx = ls;
    ls->iface.fetch = local_fetch;
    ls->iface.push = local_push;
    ls->iface.destroy = local_destroy;
    *out = &ls->iface;
    return 0;
}

size_t ps_row_source_local_rows(const ps_row_source *s)
{
    const local_source *ls = s->ctx;
    size_t n = 0;
    for (int i = 0; i < ls->ntables; i++)
        n += ls->t[i].count;
    return n;
}

/* ---- the servers' tables ---------------------------------------------------- */

typedef struct servers_source {
    ps_row_source iface;
    ps_exchange *x;
    int first, ntables;
} servers_source;

static int servers_table(const servers_source *ss, int table)
{
    return table >= 0 && table < ss->ntables ? ss->first + table : -1;
}

static int servers_fetch(ps_row_source *s, int table, const uint64_t *ids, size_t n, float *rows)
{
    servers_source *ss = s->ctx;
    int t = servers_table(ss, table);
    return t < 0 ? PS_EINVAL : ps_exchange_table_lookup(ss->x, t, ids, n, rows);
}

static int servers_push(ps_row_source *s, int table, const uint64_t *ids, size_t n,
                        const float *grads, int64_t step)
{
    (void)s, (void)table, (void)ids, (void)n, (void)grads, (void)step;
    return PS_ESTATE; /* the servers take a batch's gradients with its step: push_lent */
}

static int servers_ahead(ps_row_source *s, int table, const uint64_t *ids, size_t n,
                         size_t stride)
{
    servers_source *ss = s->ctx;
    int t = servers_table(ss, table);
    return t < 0 ? PS_EINVAL : ps_exchange_table_next(ss->x, t, ids, n, stride);
}

static int servers_lend(ps_row_source *s, int table, ps_emb_lent *out)
{
    servers_source *ss = s->ctx;
    int t = servers_table(ss, table);
    ps_exchange_rows r;
    int rc = t < 0 ? PS_EINVAL : ps_exchange_table_rows(ss->x, t, &r);
    if (rc)
        return rc;
    *out = (ps_emb_lent){r.nentries, r.nunique, r.ids, r.index, r.rows, r.grads};
    return 0;
}

static int servers_push_lent(ps_row_source *s, int table, int64_t step)
{
    servers_source *ss = s->ctx;
    int t = servers_table(ss, table);
    return t < 0 ? PS_EINVAL : ps_exchange_table_push(ss->x, t, step);
}

static void servers_destroy(ps_row_source *s)
{
    if (s)
        free(s->ctx);
}

int ps_row_source_servers_create(ps_exchange *x, int first, int tables, ps_row_source **out)
{
    *out = NULL;
    if (!x || first < 0 || tables < 1 || first + tables > ps_exchange_num_tables(x))
        return PS_EINVAL;
    servers_source *ss = calloc(1, sizeof *ss);
    if (!ss)
        return PS_ENOMEM;
    ss->x = x;
    ss->first = first;
    ss->ntables = tables;
    ss->iface.name = "the servers' tables";
    ss->iface.ctx = ss;
    ss->iface.fetch = servers_fetch;
    ss->iface.push = servers_push;
    ss->iface.destroy = servers_destroy;
    ss->iface.ahead = servers_ahead;
    ss->iface.lend = servers_lend;
    ss->iface.push_lent = servers_push_lent;
    *out = &ss->iface;
    return 0;
}
