#include "ctr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_flags.h"

#define MAX_WIDTH 1000000

/* ---- the spec ------------------------------------------------------------ */

int ps_ctr_spec_is(const char *spec)
{
    return spec && strncmp(spec, "ctr", 3) == 0 && (spec[3] == '\0' || spec[3] == ':');
}

/* "512-256-1" into sizes (at most PS_CTR_MAX_MLP, each in [1, MAX_WIDTH]);
 * "" is no sizes. */
static int parse_sizes(const char *prog, const char *key, const char *text, int *sizes,
                       int *count, char *why, size_t why_len)
{
    *count = 0;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '-');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char tok[16];
        long long v;
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        if (len >= sizeof tok || *count == PS_CTR_MAX_MLP || (end && !end[1]) ||
            ps_parse_int(prog, key, tok, 1, MAX_WIDTH, &v, why, why_len)) {
            snprintf(why, why_len,
                     "%s: %s takes up to %d layer sizes in [1, %d] joined by '-', e.g. "
                     "%s=512-256-1, got '%s'",
                     prog, key, PS_CTR_MAX_MLP, MAX_WIDTH, key, text);
            return PS_EINVAL;
        }
        sizes[(*count)++] = (int)v;
        p = end ? end + 1 : p + len;
    }
    return 0;
}

static void put_sizes(char *buf, size_t len, const char *key, const int *sizes, int n)
{
    size_t off = strlen(buf);
    off += (size_t)snprintf(buf + off, off < len ? len - off : 0, ",%s=", key);
    for (int i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, i ? "-%d" : "%d", sizes[i]);
}

enum {
    K_FIELDS, K_DENSE, K_DIM, K_ROWS, K_POOL, K_INTERACT, K_BOT, K_MLP, K_OPT, K_LR, K_CAP,
    K_FULL, K_COUNT
};
static const char *const keys[K_COUNT] = {"fields", "dense", "dim",  "rows", "pool", "interact",
                                          "bot",    "mlp",   "opt",  "lr",   "cap",  "full"};

static int parse_value(ps_ctr_spec *s, int k, const char *prog, const char *val, char *why,
                       size_t why_len)
{
    long long v;
    double d;
    int rc = 0;
    switch (k) {
    case K_FIELDS:
        if (!(rc = ps_parse_int(prog, "fields", val, 1, 1024, &v, why, why_len)))
            s->fields = (int)v;
        break;
    case K_DENSE:
        if (!(rc = ps_parse_int(prog, "dense", val, 1, 65536, &v, why, why_len)))
            s->dense = (int)v;
        break;
    case K_DIM:
        if (!(rc = ps_parse_int(prog, "dim", val, 1, 4096, &v, why, why_len)))
            s->dim = (int)v;
        break;
    case K_ROWS:
        if (!(rc = ps_parse_int(prog, "rows", val, 1, 1LL << 40, &v, why, why_len)))
            s->rows = (uint64_t)v;
        break;
    case K_OPT:
        if (!strcmp(val, "sgd") || !strcmp(val, "adagrad") || !strcmp(val, "rowwise_adagrad"))
            s->opt = val[0] == 's' ? PS_OPT_SGD : val[0] == 'a' ? PS_OPT_ADAGRAD
                                                                : PS_TABLE_OPT_ROWWISE_ADAGRAD;
        else {
            snprintf(why, why_len, "%s: opt must be sgd, adagrad or rowwise_adagrad, got '%s'",
                     prog, val);
            return PS_EINVAL;
        }
        break;
    case K_CAP:
        if (!(rc = ps_parse_int(prog, "cap", val, 1, 1LL << 40, &v, why, why_len)))
            s->cap = (uint64_t)v;
        break;
    case K_POOL:
    case K_INTERACT:
    case K_FULL: {
        static const char *const names[][2] = {[K_POOL] = {"sum", "mean"},
                                               [K_INTERACT] = {"cat", "dot"},
                                               [K_FULL] = {"evict", "refuse"}};
        int which = !strcmp(val, names[k][0]) ? 0 : !strcmp(val, names[k][1]) ? 1 : -1;
        if (which < 0) {
            snprintf(why, why_len, "%s: %s must be %s or %s, got '%s'", prog, keys[k],
                     names[k][0], names[k][1], val);
            return PS_EINVAL;
        }
        if (k == K_POOL)
            s->pool = which ? PS_POOL_MEAN : PS_POOL_SUM;
        else if (k == K_FULL)
            s->full = which ? PS_TABLE_FULL_REFUSE : PS_TABLE_FULL_EVICT;
        else
            s->dot = which;
        break;
    }
    case K_BOT: rc = parse_sizes(prog, "bot", val, s->bot, &s->nbot, why, why_len); break;
    case K_MLP: rc = parse_sizes(prog, "mlp", val, s->top, &s->ntop, why, why_len); break;
    case K_LR:
        if (!(rc = ps_parse_float(prog, "lr", val, 1e-9, 1e6, &d, why, why_len)))
            s->lr = (float)d;
        break;
    }
    return rc;
}

int ps_ctr_spec_parse(const char *spec, ps_ctr_spec *out, char *why, size_t why_len)
{
    ps_ctr_spec s = {.fields = 26, .dense = 13, .dim = 16, .rows = 1000000,
                     .pool = PS_POOL_SUM, .ntop = 3, .top = {512, 256, 1},
                     .opt = PS_OPT_ADAGRAD, .lr = 0.05f};
    char prog[160];
    snprintf(prog, sizeof prog, "--model %.140s", spec ? spec : "");
    if (!ps_ctr_spec_is(spec)) {
        snprintf(why, why_len, "%s: not a click-through model spec (ctr or ctr:KEY=VALUE,...)",
                 prog);
        return PS_EINVAL;
    }
    unsigned seen = 0;
    int rc;
    for (const char *p = spec[3] ? spec + 4 : spec + 3; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char tok[256];
        snprintf(tok, sizeof tok, "%.*s", (int)(len < sizeof tok ? len : sizeof tok - 1), p);
        char *eq = strchr(tok, '=');
        int k = K_COUNT;
        if (eq) {
            *eq = '\0';
            for (k = 0; k < K_COUNT && strcmp(tok, keys[k]); k++)
                ;
        }
        if (k == K_COUNT || len >= sizeof tok) {
            snprintf(why, why_len,
                     "%s: expected KEY=VALUE with KEY one of fields, dense, dim, rows, pool, "
                     "interact, bot, mlp, opt, lr, cap, full (e.g. ctr:dim=16,mlp=512-256-1), "
                     "got '%.*s'",
                     prog, (int)(len > 40 ? 40 : len), p);
            return PS_EINVAL;
        }
        if (seen & (1u << k)) {
            snprintf(why, why_len, "%s: %s given twice", prog, keys[k]);
            return PS_EINVAL;
        }
        seen |= 1u << k;
        if ((rc = parse_value(&s, k, prog, eq + 1, why, why_len)))
            return rc;
        p = end ? end + 1 : p + len;
    }
    if (s.dot && s.nbot == 0) {
        s.nbot = 1;
        s.bot[0] = s.dim;
    }
    if (s.dot && s.bot[s.nbot - 1] != s.dim) {
        snprintf(why, why_len,
                 "%s: interact=dot takes the dense side's vector into dot products with the "
                 "embeddings, so bot must end in dim=%d (e.g. bot=64-%d), got %d",
                 prog, s.dim, s.dim, s.bot[s.nbot - 1]);
        return PS_EINVAL;
    }
    if (s.ntop == 0 || s.top[s.ntop - 1] != 1) {
        snprintf(why, why_len,
                 "%s: mlp must end in 1 (one logit: the click probability), e.g. mlp=512-256-1",
                 prog);
        return PS_EINVAL;
    }
    char *c = s.canonical;
    size_t cl = sizeof s.canonical;
    snprintf(c, cl, "ctr:fields=%d,dense=%d,dim=%d,rows=%llu", s.fields, s.dense, s.dim,
             (unsigned long long)s.rows);
    if (s.nbot)
        put_sizes(c, cl, "bot", s.bot, s.nbot);
    put_sizes(c, cl, "mlp", s.top, s.ntop);
    size_t off = strlen(c);
    snprintf(c + off, cl - off, ",pool=%s,interact=%s,opt=%s,lr=%g",
             s.pool == PS_POOL_MEAN ? "mean" : "sum", s.dot ? "dot" : "cat",
             s.opt == PS_OPT_ADAGRAD ? "adagrad" : s.opt == PS_OPT_SGD ? "sgd"
                                                                       : "rowwise_adagrad",
             (double)s.lr);
    off = strlen(c);
    if (s.cap)
        snprintf(c + off, cl - off, ",cap=%llu,full=%s", (unsigned long long)s.cap,
                 s.full == PS_TABLE_FULL_REFUSE ? "refuse" : "evict");
    if (strlen(c) >= cl - 1) {
        snprintf(why, why_len, "%s: spec too long", prog);
        return PS_EINVAL;
    }
    *out = s;
    return 0;
}

/* ---- the sparse side --------------------------------------------------------- */

struct ps_ctr_sparse {
    int fields, dim, max_batch;
    ps_pool pool;
    ps_emb_batch *t; /* per field: set_ids' deduplication, fetch's rows */
    ps_emb_lent *v;  /* per field: what forward and backward read and write, t's
                        buffers or a source's (take) */
    int n;           /* samples of the batch set_ids or take gave; 0: none */
    int fetched;     /* its rows were fetched (or taken) */
    int lent;        /* taken: the rows and gradients are the source's */
    ps_emb_dev **dev; /* per field, on a device backend: the layer's staging */
};

int ps_ctr_sparse_create(const ps_ctr_spec *spec, int max_batch, ps_backend *b,
                         ps_ctr_sparse **out)
{
    *out = NULL;
    if (max_batch < 1)
        return PS_EINVAL;
    ps_ctr_sparse *sp = calloc(1, sizeof *sp);
    if (!sp || !(sp->t = calloc((size_t)spec->fields, sizeof *sp->t)) ||
        !(sp->v = calloc((size_t)spec->fields, sizeof *sp->v)) ||
        (!b->host_memory && !(sp->dev = calloc((size_t)spec->fields, sizeof *sp->dev)))) {
        if (sp) {
            free(sp->t);
            free(sp->v);
        }
        free(sp);
        return PS_ENOMEM;
    }
    sp->fields = spec->fields;
    sp->dim = spec->dim;
    sp->pool = spec->pool;
    sp->max_batch = max_batch;
    for (int f = 0; f < sp->fields; f++) {
        int rc = ps_emb_batch_init(&sp->t[f], (size_t)max_batch, spec->dim);
        if (!rc && sp->dev)
            rc = ps_emb_dev_create(b, (size_t)max_batch, (size_t)max_batch, spec->dim,
                                   &sp->dev[f]);
        if (rc) {
            ps_ctr_sparse_destroy(sp);
            return rc;
        }
    }
    *out = sp;
    return 0;
}

void ps_ctr_sparse_destroy(ps_ctr_sparse *sp)
{
    if (!sp)
        return;
    for (int f = 0; f < sp->fields; f++) {
        ps_emb_batch_release(&sp->t[f]);
        if (sp->dev)
            ps_emb_dev_destroy(sp->dev[f]);
    }
    free(sp->dev);
    free(sp->t);
    free(sp->v);
    free(sp);
}

int ps_ctr_sparse_set_ids(ps_ctr_sparse *sp, const uint64_t *ids, int n)
{
    sp->n = 0;
    sp->fetched = 0;
    sp->lent = 0;
    if (n < 1 || n > sp->max_batch)
        return PS_EINVAL;
    for (int f = 0; f < sp->fields; f++) {
        int rc = ps_emb_batch_set(&sp->t[f], ids + f, (size_t)n, (size_t)sp->fields, NULL);
        if (rc)
            return rc;
    }
    sp->n = n;
    return 0;
}

int ps_ctr_sparse_fetch(ps_ctr_sparse *sp, ps_row_source *src)
{
    if (!sp->n)
        return PS_ESTATE;
    for (int f = 0; f < sp->fields; f++) {
        ps_emb_batch *eb = &sp->t[f];
        int rc = src->fetch(src, f, eb->ids, eb->nunique, eb->rows);
        if (rc)
            return rc;
        sp->v[f] = (ps_emb_lent){eb->nentries, eb->nunique, eb->ids, eb->index, eb->rows,
                                 eb->grads};
    }
    sp->fetched = 1;
    return 0;
}

int ps_ctr_sparse_ahead(ps_ctr_sparse *sp, ps_row_source *src, const uint64_t *ids, int n)
{
    if (!src->ahead)
        return PS_EINVAL;
    if (n < 1 || n > sp->max_batch)
        return PS_EINVAL;
    for (int f = 0; f < sp->fields; f++) {
        int rc = src->ahead(src, f, ids + f, (size_t)n, (size_t)sp->fields);
        if (rc)
            return rc;
    }
    return 0;
}

int ps_ctr_sparse_take(ps_ctr_sparse *sp, ps_row_source *src, int n)
{
    sp->n = 0;
    sp->fetched = 0;
    sp->lent = 0;
    if (!src->lend)
        return PS_EINVAL;
    for (int f = 0; f < sp->fields; f++) {
        int rc = src->lend(src, f, &sp->v[f]);
        if (rc)
            return rc;
        if (sp->v[f].nentries != (size_t)n)
            return PS_EINVAL;
    }
    sp->n = n;
    sp->fetched = 1;
    sp->lent = 1;
    return 0;
}

/* Field f's bags: one entry per sample. */
static ps_emb_bags field_bags(const ps_ctr_sparse *sp, int f)
{
    ps_emb_bags bags = {sp->n, NULL, sp->v[f].index, NULL, sp->v[f].nunique};
    return bags;
}

int ps_ctr_sparse_forward(ps_backend *b, ps_ctr_sparse *sp, int n, float *emb)
{
    if (!sp->fetched)
        return PS_ESTATE;
    if (n != sp->n)
        return PS_EINVAL;
    size_t stride = (size_t)sp->fields * sp->dim;
    for (int f = 0; f < sp->fields; f++) {
        ps_emb_bags bags = field_bags(sp, f);
        float *out = emb + (size_t)f * sp->dim;
        int rc = sp->dev ? ps_emb_dev_forward(sp->dev[f], &bags, sp->pool, sp->v[f].rows, out,
                                              stride)
                         : ps_emb_bag_forward(b, &bags, sp->pool, sp->v[f].rows, sp->dim, out,
                                              stride);
        if (rc)
            return rc;
    }
    return 0;
}

int ps_ctr_sparse_backward(ps_backend *b, ps_ctr_sparse *sp, const float *demb)
{
    if (!sp->fetched)
        return PS_ESTATE;
    size_t stride = (size_t)sp->fields * sp->dim;
    for (int f = 0; f < sp->fields; f++) {
        ps_emb_bags bags = field_bags(sp, f);
        const float *dout = demb + (size_t)f * sp->dim;
        int rc = sp->dev ? ps_emb_dev_backward(sp->dev[f], &bags, sp->pool, dout, stride)
                         : ps_emb_bag_backward(b, &bags, sp->pool, dout, stride, sp->dim,
                                               sp->v[f].grads);
        if (rc)
            return rc;
    }
    /* every field's kernels and copies enqueued first, then one wait */
    for (int f = 0; sp->dev && f < sp->fields; f++) {
        int rc = ps_emb_dev_grads(sp->dev[f], sp->v[f].grads);
        if (rc)
            return rc;
    }
    return 0;
}

int ps_ctr_sparse_push(ps_ctr_sparse *sp, ps_row_source *src, int64_t step)
{
    if (!sp->fetched)
        return PS_ESTATE;
    for (int f = 0; f < sp->fields; f++) {
        const ps_emb_lent *v = &sp->v[f];
        int rc = sp->lent ? src->push_lent(src, f, step)
                          : src->push(src, f, v->ids, v->nunique, v->grads, step);
        if (rc)
            return rc;
    }
    sp->fetched = 0; /* the lent buffers go back to the source */
    return 0;
}

void ps_ctr_table_options(const ps_ctr_spec *s, uint64_t seed, ps_table_options *o)
{
    ps_table_options_default(o);
    o->dim = (uint32_t)s->dim;
    o->init = PS_TABLE_INIT_UNIFORM;
    o->init_scale = PS_EMB_INIT_SCALE;
    o->seed = seed;
    o->opt.kind = s->opt;
    o->opt.lr = s->lr;
    o->opt.eps = PS_CTR_ADAGRAD_EPS;
    o->max_rows = s->cap;
    o->full = (uint32_t)s->full;
}

const ps_emb_batch *ps_ctr_sparse_table(const ps_ctr_sparse *sp, int f)
{
    return f >= 0 && f < sp->fields ? &sp->t[f] : NULL;
}
