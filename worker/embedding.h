/* Embedding bags and where their rows come from.
 *
 * A click-through model looks up, for every sample and categorical field, a
 * row of that field's table and pools the rows of a bag (sum or mean).
 * Tables are large and live elsewhere (local tables now, the parameter
 * servers later) while one batch touches few of their rows, so a batch is
 * worked in three steps, each its own piece here:
 *
 *   ps_emb_batch     the batch's ids of one table, deduplicated: its unique
 *                    ids (in first-seen order) and, for each entry, the
 *                    index of its unique row; holds the unique rows and
 *                    their gradients
 *   ps_row_source    where the unique rows come from (fetch) and where
 *                    their gradients go (push): local tables
 *                    (ps_row_source_local_create), or the servers through
 *                    the exchange (ps_row_source_servers_create), which
 *                    fetch the next batch's rows while this one computes
 *                    and deduplicate its ids themselves; the training loop
 *                    does not know which
 *   ps_emb_bag_*     the layer: forward gathers from the unique rows and
 *                    pools; backward writes one gradient row per unique id,
 *                    duplicates summed: what is pushed
 *
 * Rows and gradients are host memory wherever the model runs: the row
 * sources hand them there (the exchange's buffers, the local tables).  On
 * the CPU the layer (ps_emb_bag_*) reads and writes them in place, through
 * the backend's emb_bag_fwd (client/ps_backend.h) and a host scatter.  On a
 * device, ps_emb_dev_* carry one table's batch across: forward copies its
 * unique rows and bags host->device through pinned staging and pools on the
 * device into the model's input; backward builds on the host, from the
 * index it knows, a CSR of every unique row's entries, so the device sums
 * each row's gradient in entry order without atomics (deterministic, the
 * same order as the host scatter), and copies the gradient rows back to
 * pinned memory for the push.  Functions that can fail return 0 or a PS_E*
 * code. */
#ifndef PS_EMBEDDING_H
#define PS_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef enum { PS_POOL_SUM = 0, PS_POOL_MEAN = 1 } ps_pool;

/* ---- the layer ----------------------------------------------------------
 * Bags over entries: bag s holds entries offsets[s] .. offsets[s+1]-1
 * (offsets NULL: bag s is entry s alone, one id per sample and field, as in
 * Criteo).  Entry e reads unique row index[e] (index < 0: padding, which
 * adds nothing and is not counted by a mean), scaled by weights[e] (weights
 * NULL: 1).  The weights are constants: no gradient flows to them. */
typedef struct ps_emb_bags {
    int nbags;
    const int32_t *offsets; /* nbags + 1 ascending entry indices, from 0; or NULL */
    const int32_t *index;   /* per entry: the unique row it reads (< nrows), or < 0 */
    const float *weights;   /* per entry, or NULL */
    size_t nrows;           /* unique rows */
} ps_emb_bags;

/* Both passes refuse (PS_EINVAL) offsets that do not start at 0 or go
 * down, and an index of nrows or more; PS_EDEVICE on a device backend (or
 * one without emb_bag_fwd): ps_emb_dev_* there. */

/* out[s * out_stride + j] for s < nbags, j < dim: the pool of
 * weights[e] * rows[index[e] * dim + j] over bag s's entries; a mean divides
 * by the bag's non-padding entries; an empty bag pools to zeros.  A stride
 * larger than dim writes into a wider row (the model's concatenation). */
int ps_emb_bag_forward(ps_backend *b, const ps_emb_bags *bags, ps_pool pool, const float *rows,
                       int dim, float *out, size_t out_stride);

/* The gradient of every unique row: grads[u * dim + j] for u < nrows is
 * the sum, over the entries e that read row u (in entry order), of
 * weights[e] (or 1), divided by the bag's count for a mean, times
 * dout[s * dout_stride + j] of e's bag s.  Overwrites all nrows rows (rows
 * no entry reads get zeros). */
int ps_emb_bag_backward(ps_backend *b, const ps_emb_bags *bags, ps_pool pool, const float *dout,
                        size_t dout_stride, int dim, float *grads);

/* ---- the layer on a device ----------------------------------------------
 * One table's batch on a device backend (one with emb_bag_fwd and
 * emb_bag_bwd; any other: PS_EDEVICE): the bags and rows stay host memory,
 * out and dout are the backend's.  Every copy and kernel is enqueued on
 * PS_STREAM_COMPUTE; the staging of a pass is reused by the next pass of
 * its kind once the copy out of it has happened (an event).  Batches of up
 * to max_entries entries (and unique rows) in max_bags bags of dim-wide
 * rows; PS_EINVAL beyond, or for bags the layer refuses; PS_ENOMEM. */
typedef struct ps_emb_dev ps_emb_dev;
int ps_emb_dev_create(ps_backend *b, size_t max_entries, size_t max_bags, int dim,
                      ps_emb_dev **out);
void ps_emb_dev_destroy(ps_emb_dev *d);
/* ps_emb_bag_forward with rows (host) copied to the device first. */
int ps_emb_dev_forward(ps_emb_dev *d, const ps_emb_bags *bags, ps_pool pool, const float *rows,
                       float *out, size_t out_stride);
/* ps_emb_bag_backward's gradients, on their way back: ps_emb_dev_grads
 * waits for them and copies them into grads (host, nrows x dim);
 * PS_ESTATE without a backward since the last. */
int ps_emb_dev_backward(ps_emb_dev *d, const ps_emb_bags *bags, ps_pool pool, const float *dout,
                        size_t dout_stride);
int ps_emb_dev_grads(ps_emb_dev *d, float *grads);

/* ---- one table's share of a batch ---------------------------------------- */
typedef struct ps_emb_batch {
    int dim;
    size_t max_entries;
    size_t nentries, nunique; /* of the current batch */
    uint64_t *ids;   /* [nunique] the unique ids, in the order first seen */
    int32_t *index;  /* [nentries] each entry's row in ids, -1 for padding */
    float *rows;     /* [nunique x dim] the rows of ids: the row source fills them */
    float *grads;    /* [nunique x dim] their gradients: backward writes them */
    /* the deduplication's open-addressing map, id -> row; entries of older
     * batches are told apart by their stamp, so a batch never clears it */
    size_t hcap;
    uint64_t *hkey;
    int32_t *hrow;
    uint32_t *hstamp;
    uint32_t stamp;
} ps_emb_batch;

/* Buffers for batches of up to max_entries entries of dim-wide rows.
 * PS_EINVAL for sizes below 1 or too large for int32 indices; PS_ENOMEM.
 * Release frees them (also after a failed init, or on a zeroed batch). */
int ps_emb_batch_init(ps_emb_batch *eb, size_t max_entries, int dim);
void ps_emb_batch_release(ps_emb_batch *eb);

/* Deduplicate n entries' ids, entry e's id being ids[e * stride] (stride
 * fields picks one field's column out of a samples x fields array).  Ids
 * equal to *pad (pad non-NULL) are padding: index -1, no row.  PS_EINVAL
 * when n is more than max_entries. */
int ps_emb_batch_set(ps_emb_batch *eb, const uint64_t *ids, size_t n, size_t stride,
                     const uint64_t *pad);

/* ---- row sources ----------------------------------------------------------
 * Tables 0 .. tables-1, rows of dim floats addressed by 64-bit ids; a row
 * exists from its first fetch (or push) on, with initial values that are a
 * pure function of (seed, table, id): ps_emb_init_row.  ids hold no
 * duplicates (a ps_emb_batch's unique ids). */
typedef struct ps_row_source ps_row_source;

/* One table's share of the current batch as a source that follows the
 * batches itself lends it (the servers, through the exchange): the batch's
 * distinct ids in the order first seen, each entry's place among them, their
 * rows and the buffer for their gradients, all the source's (valid until
 * the push after next). */
typedef struct ps_emb_lent {
    size_t nentries, nunique;
    const uint64_t *ids;
    const int32_t *index;
    const float *rows;
    float *grads;
} ps_emb_lent;

struct ps_row_source {
    const char *name; /* for logs: "local tables" */
    void *ctx;
    /* rows[i * dim ..] = the current row ids[i] of table, for i < n */
    int (*fetch)(ps_row_source *s, int table, const uint64_t *ids, size_t n, float *rows);
    /* Apply one gradient row per id (grads[i * dim ..] for ids[i]) of the
     * worker's step `step` (the servers' clock; the local tables ignore it). */
    int (*push)(ps_row_source *s, int table, const uint64_t *ids, size_t n, const float *grads,
                int64_t step);
    void (*destroy)(ps_row_source *s);
    /* A source that fetches a batch's rows while the one before computes
     * (NULL in local tables), per table and step:
     *   ahead   the ids of the batch after the current one: n entries,
     *           entry e's id ids[e * stride]; deduplicated by the source
     *   lend    the current batch, once its rows are in
     *   push_lent  its gradients (the lent grads) for `step`; the batch
     *           handed ahead becomes the current one
     * fetch and push above then serve what is outside the batches (an
     * evaluation's rows; push is refused). */
    int (*ahead)(ps_row_source *s, int table, const uint64_t *ids, size_t n, size_t stride);
    int (*lend)(ps_row_source *s, int table, ps_emb_lent *out);
    int (*push_lent)(ps_row_source *s, int table, int64_t step);
};

/* Table t's key: on the servers, and the `table` of the initializer; above
 * the keys of the dense params (0, 1, ...: model.c). */
#define PS_EMB_TABLE_KEY(t) ((uint64_t)1 << 40 | (uint64_t)(t))

/* The initial row of (table, id): the servers' initializer
 * (common/ps_table_row.h, ps_table_init_row) for table key
 * PS_EMB_TABLE_KEY(table), uniform in [-PS_EMB_INIT_SCALE,
 * PS_EMB_INIT_SCALE), so local tables start where server tables declared
 * with that key, seed, initializer and scale do. */
#define PS_EMB_INIT_SCALE 0.05f
void ps_emb_init_row(uint64_t seed, int table, uint64_t id, int dim, float *row);

/* Local tables, the compute-only baseline (--servers none): every table in
 * memory, a row made on first touch (an open-addressing map from id to a
 * row of growing slabs), updated in place by push with opt PS_OPT_SGD
 * (w -= lr g), PS_OPT_ADAGRAD (h += g^2, w -= lr g / (sqrt(h) + eps), h
 * from 0, as the servers' adagrad and torch.optim.Adagrad) or
 * PS_TABLE_OPT_ROWWISE_ADAGRAD (one sum per row, the servers' kernel).  PS_EINVAL for
 * another opt or bad sizes; PS_ENOMEM.  Free with s->destroy(s). */
int ps_row_source_local_create(int tables, int dim, uint64_t seed, int opt, float lr, float eps,
                               ps_row_source **out);
/* Rows the local tables hold over all tables (for logs and tests). */
size_t ps_row_source_local_rows(const ps_row_source *s);

/* The servers' tables: tables 0 .. tables-1 are the exchange's tables
 * first .. first+tables-1 (ps_exchange_add_table, before it started), whose
 * batches go through it (include/ps_exchange.h): no table on the worker,
 * only the buffers of two batches.  fetch is ps_exchange_table_lookup; push
 * is refused (PS_ESTATE): gradients go a batch at a time, push_lent.  x
 * must outlive the source.  PS_EINVAL, PS_ENOMEM. */
typedef struct ps_exchange ps_exchange;
int ps_row_source_servers_create(ps_exchange *x, int first, int tables, ps_row_source **out);

#endif
