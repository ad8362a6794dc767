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

static int check_shape(const ps_emb_bags *bags, int dim)
{
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

static int check_bags(ps_backend *b, const ps_emb_bags *bags, int dim)
{
    /* host pointers: ps_emb_dev_* on a device */
    return b->host_memory ? check_shape(bags, dim) : PS_EDEVICE;
}

int ps_emb_bag_forward(ps_backend *b, const ps_emb_bags *bags, ps_pool pool, const float *rows,
                       int dim, float *out, size_t out_stride)
{
    int rc = check_bags(b, bags, dim);
    if (rc)
        return rc;
    if (!b->emb_bag_fwd)
        return PS_EDEVICE;
    return b->emb_bag_fwd(b, bags->nbags, bags->offsets, bags->index, bags->weights,
                          pool == PS_POOL_MEAN, rows, dim, out, out_stride);
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

/* ---- the layer on a device ------------------------------------------------ */

struct ps_emb_dev {
    ps_backend *b;
    int dim;
    size_t max_entries, max_bags;
    /* forward's staging: the rows, then the index, offsets and weights, each
     * at a 256-byte boundary; one copy to the device (fwd_d) */
    unsigned char *fwd_h, *fwd_d;
    size_t fwd_cap;
    /* backward's: the CSR by unique row (start, bag, coef); and the
     * gradients, back from the device */
    unsigned char *bwd_h, *bwd_d;
    size_t bwd_cap;
    float *grads_h, *grads_d;
    int32_t *cursor; /* host scratch for building the CSR */
    /* recorded after each staging copy (and the gradients' copy back): the
     * pinned buffer is free again, or the gradients are in, once it has
     * happened */
    ps_event *fwd_ev, *bwd_ev, *grads_ev;
    int fwd_used, bwd_used, grads_pending;
    size_t grads_rows;
};

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

void ps_emb_dev_destroy(ps_emb_dev *d)
{
    if (!d)
        return;
    ps_backend *b = d->b;
    /* nothing of ours may be in flight when the buffers go */
    if (d->fwd_ev || d->bwd_ev || d->grads_ev)
        (void)b->stream_sync(b, PS_STREAM_COMPUTE);
    if (d->fwd_h)
        b->free_host(b, d->fwd_h);
    if (d->bwd_h)
        b->free_host(b, d->bwd_h);
    if (d->grads_h)
        b->free_host(b, d->grads_h);
    if (d->fwd_d)
        b->free(b, d->fwd_d);
    if (d->bwd_d)
        b->free(b, d->bwd_d);
    if (d->grads_d)
        b->free(b, d->grads_d);
    ps_event *ev[3] = {d->fwd_ev, d->bwd_ev, d->grads_ev};
    for (int i = 0; i < 3; i++)
        if (ev[i])
            b->event_destroy(b, ev[i]);
    free(d->cursor);
    free(d);
}

int ps_emb_dev_create(ps_backend *b, size_t max_entries, size_t max_bags, int dim,
                      ps_emb_dev **out)
{
    *out = NULL;
    if (!b->emb_bag_fwd || !b->emb_bag_bwd)
        return PS_EDEVICE;
    if (max_entries < 1 || max_entries > INT32_MAX / 4 || max_bags < 1 ||
        max_bags > INT32_MAX / 4 || dim < 1 ||
        max_entries > SIZE_MAX / 4 / sizeof(float) / (size_t)dim)
        return PS_EINVAL;
    ps_emb_dev *d = calloc(1, sizeof *d);
    if (!d)
        return PS_ENOMEM;
    d->b = b;
    d->dim = dim;
    d->max_entries = max_entries;
    d->max_bags = max_bags;
    size_t rows = max_entries * (size_t)dim * sizeof(float), ints = max_entries * sizeof(int32_t);
    d->fwd_cap = align256(rows) + align256(ints) + align256((max_bags + 1) * sizeof(int32_t)) +
                 align256(max_entries * sizeof(float));
    d->bwd_cap = align256(ints + sizeof(int32_t)) + align256(ints) + align256(ints);
    int rc;
    if (!(d->cursor = malloc(ints + sizeof(int32_t))))
        rc = PS_ENOMEM;
    else if (!(rc = b->alloc_host(b, d->fwd_cap, (void **)&d->fwd_h)) &&
             !(rc = b->alloc_host(b, d->bwd_cap, (void **)&d->bwd_h)) &&
             !(rc = b->alloc_host(b, rows, (void **)&d->grads_h)) &&
             !(rc = b->alloc(b, d->fwd_cap, (void **)&d->fwd_d)) &&
             !(rc = b->alloc(b, d->bwd_cap, (void **)&d->bwd_d)) &&
             !(rc = b->alloc(b, rows, (void **)&d->grads_d)) &&
             !(rc = b->event_create(b, &d->fwd_ev)) && !(rc = b->event_create(b, &d->bwd_ev)))
        rc = b->event_create(b, &d->grads_ev);
    if (rc) {
        ps_emb_dev_destroy(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* bytes of n items of `size` into the staging at *off; the offset of them */
static size_t stage(unsigned char *h, size_t *off, const void *src, size_t n, size_t size)
{
    size_t at = *off;
    if (src && n)
        memcpy(h + at, src, n * size);
    *off = at + align256(n * size);
    return at;
}

int ps_emb_dev_forward(ps_emb_dev *d, const ps_emb_bags *bags, ps_pool pool, const float *rows,
                       float *out, size_t out_stride)
{
    ps_backend *b = d->b;
    int rc = check_shape(bags, d->dim);
    if (rc)
        return rc;
    size_t entries = (size_t)bag_begin(bags, bags->nbags);
    if (entries > d->max_entries || (size_t)bags->nbags > d->max_bags ||
        bags->nrows > d->max_entries)
        return PS_EINVAL;
    if (bags->nbags == 0)
        return 0;
    /* the last batch's copy out of the staging must be done before it is
     * written again (long since, as a rule: a step lies between) */
    if (d->fwd_used && (rc = b->event_sync(b, d->fwd_ev)))
        return rc;
    size_t off = 0;
    size_t o_rows = stage(d->fwd_h, &off, rows, bags->nrows * (size_t)d->dim, sizeof(float));
    size_t o_index = stage(d->fwd_h, &off, bags->index, entries, sizeof(int32_t));
    size_t o_offsets = stage(d->fwd_h, &off, bags->offsets,
                             bags->offsets ? (size_t)bags->nbags + 1 : 0, sizeof(int32_t));
    size_t o_weights = stage(d->fwd_h, &off, bags->weights, bags->weights ? entries : 0,
                             sizeof(float));
    if ((rc = b->copy(b, d->fwd_d, d->fwd_h, off, 0, PS_STREAM_COMPUTE)) ||
        (rc = b->event_record(b, d->fwd_ev, PS_STREAM_COMPUTE)))
        return rc;
    d->fwd_used = 1;
    unsigned char *dd = d->fwd_d;
    return b->emb_bag_fwd(b, bags->nbags, bags->offsets ? (const int32_t *)(dd + o_offsets) : NULL,
                          (const int32_t *)(dd + o_index),
                          bags->weights ? (const float *)(dd + o_weights) : NULL,
                          pool == PS_POOL_MEAN, (const float *)(dd + o_rows), d->dim, out,
                          out_stride);
}

int ps_emb_dev_backward(ps_emb_dev *d, const ps_emb_bags *bags, ps_pool pool, const float *dout,
                        size_t dout_stride)
{
    ps_backend *b = d->b;
    int rc = check_shape(bags, d->dim);
    if (rc)
        return rc;
    size_t entries = (size_t)bag_begin(bags, bags->nbags), nrows = bags->nrows;
    if (entries > d->max_entries || (size_t)bags->nbags > d->max_bags || nrows > d->max_entries)
        return PS_EINVAL;
    if (d->bwd_used && (rc = b->event_sync(b, d->bwd_ev)))
        return rc;
    /* the CSR: count each row's entries, prefix sums, then every entry in
     * entry order into its row's run, with its bag and weight x scale */
    size_t o_start = 0, o_bag = align256((nrows + 1) * sizeof(int32_t));
    size_t o_coef = o_bag + align256(entries * sizeof(int32_t));
    int32_t *start = (int32_t *)(d->bwd_h + o_start), *bag = (int32_t *)(d->bwd_h + o_bag);
    float *coef = (float *)(d->bwd_h + o_coef);
    memset(d->cursor, 0, (nrows + 1) * sizeof *d->cursor);
    for (size_t e = 0; e < entries; e++)
        if (bags->index[e] >= 0)
            d->cursor[bags->index[e] + 1]++;
    for (size_t u = 0; u < nrows; u++)
        d->cursor[u + 1] += d->cursor[u];
    memcpy(start, d->cursor, (nrows + 1) * sizeof *start);
    for (int s = 0; s < bags->nbags; s++) {
        float scale = bag_scale(bags, pool, s);
        for (int32_t e = bag_begin(bags, s); e < bag_end(bags, s); e++) {
            int32_t u = bags->index[e];
            if (u < 0)
                continue;
            int32_t k = d->cursor[u]++;
            bag[k] = s;
            coef[k] = (bags->weights ? bags->weights[e] : 1.0f) * scale;
        }
    }
    size_t used = o_coef + entries * sizeof(float);
    if ((rc = b->copy(b, d->bwd_d, d->bwd_h, used, 0, PS_STREAM_COMPUTE)) ||
        (rc = b->event_record(b, d->bwd_ev, PS_STREAM_COMPUTE)))
        return rc;
    d->bwd_used = 1;
    if (nrows == 0) {
        d->grads_pending = 1;
        d->grads_rows = 0;
        return b->event_record(b, d->grads_ev, PS_STREAM_COMPUTE);
    }
    unsigned char *dd = d->bwd_d;
    size_t bytes = nrows * (size_t)d->dim * sizeof(float);
    if ((rc = b->emb_bag_bwd(b, (int)nrows, d->dim, (const int32_t *)(dd + o_start),
                             (const int32_t *)(dd + o_bag), (const float *)(dd + o_coef), dout,
                             dout_stride, d->grads_d)) ||
        (rc = b->copy(b, d->grads_h, d->grads_d, bytes, 1, PS_STREAM_COMPUTE)) ||
        (rc = b->event_record(b, d->grads_ev, PS_STREAM_COMPUTE)))
        return rc;
    d->grads_pending = 1;
    d->grads_rows = nrows;
    return 0;
}

int ps_emb_dev_grads(ps_emb_dev *d, float *grads)
{
    if (!d->grads_pending)
        return PS_ESTATE;
    int rc = d->b->event_sync(d->b, d->grads_ev);
    if (rc)
        return rc;
    d->grads_pending = 0;
    memcpy(grads, d->grads_h, d->grads_rows * (size_t)d->dim * sizeof(float));
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

/* The optimizer state of a row: adagrad's dim sums, row-wise adagrad's one. */
static size_t state_len(const local_source *ls)
{
    return ls->opt == PS_TABLE_OPT_ROWWISE_ADAGRAD ? 1 : (size_t)ls->dim;
}

static size_t state_width(const local_source *ls) { return state_len(ls) * sizeof(float); }

static int table_grow_rows(local_source *ls, local_table *t)
{
    size_t ncap = t->cap ? 2 * t->cap : 1024, width = (size_t)ls->dim * sizeof(float);
    if (ncap > SIZE_MAX / width)
        return PS_ENOMEM;
    float *w = realloc(t->w, ncap * width);
    if (!w)
        return PS_ENOMEM;
    t->w = w;
    if (ls->opt != PS_OPT_SGD) { /* adagrad: a sum per value; row-wise: one per row */
        float *h = realloc(t->h, ncap * state_width(ls));
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
            memset(t->h + t->count * state_len(ls), 0, state_width(ls));
        t->keys[h] = id;
        t->rowp1[h] = ++t->count;
    }
    *row = t->w + (t->rowp1[h] - 1) * dim;
    *sum = t->h ? t->h + (t->rowp1[h] - 1) * state_len(ls) : NULL;
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
        if (ls->opt == PS_TABLE_OPT_ROWWISE_ADAGRAD) {
            ps_table_rowwise_adagrad(w, h, g, (size_t)dim, lr, eps, 0.0f);
        } else if (h) {
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
    if (tables < 1 || dim < 1 ||
        (opt != PS_OPT_SGD && opt != PS_OPT_ADAGRAD && opt != PS_TABLE_OPT_ROWWISE_ADAGRAD) ||
        !(lr > 0) ||
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
