/* The click-through (CTR) model's spec and its sparse side.
 *
 * --model ctr[:KEY=VALUE,...], every key optional (the defaults in brackets):
 *
 *   fields=F      categorical fields, one embedding table and bag each [26]
 *   dense=D       dense features per sample [13]
 *   dim=E         embedding width [16]
 *   rows=R        ids per field of synthetic-ctr data (0 .. R-1); tables
 *                 hold only the rows a run touches, whatever R [1000000]
 *   pool=sum|mean how a bag's rows are pooled [sum]
 *   interact=cat|dot
 *                 cat: the dense vector and the F pooled rows side by side
 *                 (D + F*E values) into the top MLP; dot: DLRM's pairwise
 *                 interaction, the dense vector (the bottom MLP's output,
 *                 E wide) followed by the dot products of every pair among
 *                 it and the F rows ((F+1)F/2 values, pair (i, j) for
 *                 i = 1..F, j < i, vector 0 the dense one) [cat]
 *   bot=H1-...-Hk the bottom MLP on the dense features, each layer followed
 *                 by a ReLU; dot needs Hk = E and defaults to bot=E [none]
 *   mlp=H1-...-1  the top MLP, ReLU between layers, one logit out
 *                 [512-256-1]
 *   opt=sgd|adagrad|rowwise_adagrad, lr=X
 *                 the tables' optimizer: their rows are updated by it where
 *                 they live (the dense layers follow --optimizer and --lr);
 *                 rowwise_adagrad keeps one state float per row (DLRM's and
 *                 TorchRec's); the adagrads' eps is PS_CTR_ADAGRAD_EPS
 *                 [adagrad, 0.05]
 *
 * e.g. ctr:fields=26,dim=16,rows=4000000,mlp=512-256-1,pool=sum,interact=dot
 * The loss is binary cross-entropy on the logit; the test metric AUC. */
#ifndef PS_CTR_H
#define PS_CTR_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "embedding.h"

#define PS_CTR_MAX_MLP 16
/* adagrad's denominator term for the tables (as the servers' default) */
#define PS_CTR_ADAGRAD_EPS 1e-8f

typedef struct ps_ctr_spec {
    int fields, dense, dim;
    uint64_t rows;
    ps_pool pool;
    int dot;              /* interact=dot */
    int nbot, bot[PS_CTR_MAX_MLP];
    int ntop, top[PS_CTR_MAX_MLP];
    int opt;              /* PS_OPT_SGD, PS_OPT_ADAGRAD or PS_TABLE_OPT_ROWWISE_ADAGRAD */
    float lr;
    uint64_t cap;         /* each field's table: max_rows (0: none) */
    int full;             /* and what it does when full: PS_TABLE_FULL_EVICT or _REFUSE */
    char canonical[256];  /* every key, in the order above */
} ps_ctr_spec;

/* 1 when spec names the click-through model ("ctr" or "ctr:..."). */
int ps_ctr_spec_is(const char *spec);

/* Parse spec into *out (defaults for what it does not give).  PS_EINVAL,
 * with why naming the key and what it takes, for an unknown or repeated
 * key, a bad value, dot with a bottom MLP that does not end in dim, or a
 * top MLP that does not end in 1. */
int ps_ctr_spec_parse(const char *spec, ps_ctr_spec *out, char *why, size_t why_len);

/* ---- the sparse side: one table per field -------------------------------
 * For a batch: set_ids deduplicates each field's ids (ps_emb_batch), fetch
 * brings their rows from a row source, forward pools them into the model's
 * input, backward turns the gradient of that input into one gradient row
 * per unique id, and push hands those to the row source.  The ids, rows
 * and gradients are host memory; emb and demb are b's (on a device, each
 * field's rows cross over in forward and its gradients come back in
 * backward: ps_emb_dev, embedding.h). */
typedef struct ps_ctr_sparse ps_ctr_sparse;

int ps_ctr_sparse_create(const ps_ctr_spec *spec, int max_batch, ps_backend *b,
                         ps_ctr_sparse **out);
void ps_ctr_sparse_destroy(ps_ctr_sparse *sp);

/* The batch's ids: ids[s * fields + f] is field f's id of sample s, for
 * s < n <= max_batch (PS_EINVAL otherwise). */
int ps_ctr_sparse_set_ids(ps_ctr_sparse *sp, const uint64_t *ids, int n);
/* Every field's unique rows from src.  PS_ESTATE before set_ids. */
int ps_ctr_sparse_fetch(ps_ctr_sparse *sp, ps_row_source *src);
/* emb[s * fields*dim + f*dim + j]: field f's pooled row of sample s, for
 * s < n, the n of set_ids (PS_EINVAL for another).  PS_ESTATE unless the
 * rows were fetched since set_ids. */
int ps_ctr_sparse_forward(ps_backend *b, ps_ctr_sparse *sp, int n, float *emb);
/* From demb (laid out as emb): every field's unique-row gradients. */
int ps_ctr_sparse_backward(ps_backend *b, ps_ctr_sparse *sp, const float *demb);
/* Those gradients to src, for the worker's step (a batch taken: the
 * source's push_lent).  PS_ESTATE unless the rows were fetched or taken
 * since the last push. */
int ps_ctr_sparse_push(ps_ctr_sparse *sp, ps_row_source *src, int64_t step);

/* With a source that fetches ahead (src->ahead, embedding.h): the next
 * batch's ids (laid out as set_ids'), handed to src while this batch
 * computes; and take, instead of set_ids and fetch, lends this batch's
 * rows from src (its deduplication, its buffers; forward, backward and
 * push then use them).  PS_EINVAL for a source without them or an n that
 * is not the batch's. */
int ps_ctr_sparse_ahead(ps_ctr_sparse *sp, ps_row_source *src, const uint64_t *ids, int n);
int ps_ctr_sparse_take(ps_ctr_sparse *sp, ps_row_source *src, int n);

/* Field f's table as the servers declare it (ps_client.h), under key
 * PS_EMB_TABLE_KEY(f): dim, the spec's optimizer and lr (adagrad's eps
 * PS_CTR_ADAGRAD_EPS), the local tables' initializer (uniform in
 * +-PS_EMB_INIT_SCALE with `seed`), so --servers none and the servers
 * start from the same rows. */
typedef struct ps_table_options ps_table_options;
void ps_ctr_table_options(const ps_ctr_spec *s, uint64_t seed, ps_table_options *o);
/* Field f's share of the batch (its unique ids, rows and gradients). */
const ps_emb_batch *ps_ctr_sparse_table(const ps_ctr_sparse *sp, int f);

#endif
