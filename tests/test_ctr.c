/* The click-through model and its data: the embedding bag against a naive
 * reference (duplicates, padding, sum and mean, weights), the local tables,
 * the model's gradients against finite differences, the binary
 * cross-entropy, AUC on hand-computed cases with ties, the Criteo parser on
 * hand-written files, the synthetic generator (deterministic, Zipf shaped),
 * the spec, the servers' tables (their first rows are the local tables'),
 * and ps_worker end to end, alone and through servers. */
#include <stdint.h>
#include <string.h>

#include <zlib.h>

#include "auc.h"
#include "backend.h"
#include "ctr.h"
#include "data.h"
#include "embedding.h"
#include "layers.h"
#include "model.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "rng.h"

static ps_backend *cpu(void)
{
    ps_backend *b = NULL;
    return ps_backend_cpu_create(1, &b) == 0 ? b : NULL;
}

static void fill_uniform(ps_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)ps_rng_uniform(r);
}

/* ---- the embedding bag ------------------------------------------------------ */

#define TB_ROWS 12 /* ids 0..11 of a small full table; 11 is the padding id */
#define TB_DIM 5
#define TB_PAD 11

/* Bags over ids with duplicates, an empty bag and a bag of padding alone:
 * bag s holds entries off[s]..off[s+1]-1. */
static const uint64_t tb_ids[] = {3, 3, 7, 1, 3, 11, 7, 0, 11, 11, 9, 3, 9, 9};
static const int32_t tb_off[] = {0, 3, 3, 6, 8, 10, 14}; /* bag 1 empty, bag 4 all padding */
#define TB_ENTRIES 14
#define TB_BAGS 6

/* The reference: pool straight from the full table by id. */
static void naive_forward(const float *table, const float *weights, ps_pool pool, float *out)
{
    for (int s = 0; s < TB_BAGS; s++) {
        double acc[TB_DIM] = {0};
        int count = 0;
        for (int e = tb_off[s]; e < tb_off[s + 1]; e++) {
            if (tb_ids[e] == TB_PAD)
                continue;
            count++;
            for (int j = 0; j < TB_DIM; j++)
                acc[j] += (weights ? weights[e] : 1.0) * table[tb_ids[e] * TB_DIM + j];
        }
        for (int j = 0; j < TB_DIM; j++)
            out[s * TB_DIM + j] =
                (float)(pool == PS_POOL_MEAN && count ? acc[j] / count : acc[j]);
    }
}

/* The reference gradient of every table row (zero for rows no entry reads). */
static void naive_backward(const float *dout, const float *weights, ps_pool pool, double *gtable)
{
    memset(gtable, 0, sizeof(double) * TB_ROWS * TB_DIM);
    for (int s = 0; s < TB_BAGS; s++) {
        int count = 0;
        for (int e = tb_off[s]; e < tb_off[s + 1]; e++)
            count += tb_ids[e] != TB_PAD;
        for (int e = tb_off[s]; e < tb_off[s + 1]; e++) {
            if (tb_ids[e] == TB_PAD)
                continue;
            double w = (weights ? weights[e] : 1.0) / (pool == PS_POOL_MEAN ? count : 1);
            for (int j = 0; j < TB_DIM; j++)
                gtable[tb_ids[e] * TB_DIM + j] += w * dout[s * TB_DIM + j];
        }
    }
}

PS_TEST(emb_batch_dedups_in_first_seen_order_and_skips_padding)
{
    ps_emb_batch eb;
    CHECK_OK(ps_emb_batch_init(&eb, 8, 2));
    /* one field's column of a 5 x 2 samples-by-fields array: stride 2 */
    const uint64_t ids[] = {5, 0, 7, 0, 5, 0, UINT64_MAX, 0, 7, 0};
    CHECK_OK(ps_emb_batch_set(&eb, ids, 5, 2, NULL));
    CHECK_EQ_INT(eb.nunique, 3);
    CHECK(eb.ids[0] == 5 && eb.ids[1] == 7 && eb.ids[2] == UINT64_MAX);
    const int32_t want[] = {0, 1, 0, 2, 1};
    for (int e = 0; e < 5; e++)
        CHECK_EQ_INT(eb.index[e], want[e]);
    /* the next batch reuses the map: no id of the last one leaks in */
    uint64_t pad = 7;
    const uint64_t next[] = {7, 2, 5, 2};
    CHECK_OK(ps_emb_batch_set(&eb, next, 4, 1, &pad));
    CHECK_EQ_INT(eb.nunique, 2);
    CHECK(eb.ids[0] == 2 && eb.ids[1] == 5);
    CHECK(eb.index[0] == -1 && eb.index[1] == 0 && eb.index[2] == 1 && eb.index[3] == 0);
    CHECK_EQ_INT(ps_emb_batch_set(&eb, next, 9, 1, NULL), PS_EINVAL);
    ps_emb_batch_release(&eb);
}

PS_TEST(emb_bag_matches_naive_pooling_with_duplicates_padding_and_weights)
{
    ps_backend *b = cpu();
    CHECK(b);
    ps_rng r;
    ps_rng_seed(&r, 21);
    float table[TB_ROWS * TB_DIM], weights[TB_ENTRIES], out[TB_BAGS * TB_DIM];
    float want[TB_BAGS * TB_DIM], dout[TB_BAGS * TB_DIM];
    double gtable[TB_ROWS * TB_DIM];
    fill_uniform(&r, table, TB_ROWS * TB_DIM, -1, 1);
    fill_uniform(&r, weights, TB_ENTRIES, 0.5f, 2);
    fill_uniform(&r, dout, TB_BAGS * TB_DIM, -1, 1);
    ps_emb_batch eb;
    CHECK_OK(ps_emb_batch_init(&eb, TB_ENTRIES, TB_DIM));
    uint64_t pad = TB_PAD;
    CHECK_OK(ps_emb_batch_set(&eb, tb_ids, TB_ENTRIES, 1, &pad));
    CHECK_EQ_INT(eb.nunique, 5); /* 3, 7, 1, 0, 9 */
    for (size_t u = 0; u < eb.nunique; u++) /* what a row source would fetch */
        memcpy(eb.rows + u * TB_DIM, table + eb.ids[u] * TB_DIM, sizeof(float) * TB_DIM);
    for (int pool = PS_POOL_SUM; pool <= PS_POOL_MEAN; pool++)
        for (int wt = 0; wt < 2; wt++) {
            const float *w = wt ? weights : NULL;
            ps_emb_bags bags = {TB_BAGS, tb_off, eb.index, w, eb.nunique};
            /* a stride wider than dim: the bag writes into a concatenation */
            float wide[TB_BAGS * (TB_DIM + 3)];
            for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
                wide[i] = 99.0f;
            CHECK_OK(ps_emb_bag_forward(b, &bags, (ps_pool)pool, eb.rows, TB_DIM, wide + 2,
                                        TB_DIM + 3));
            naive_forward(table, w, (ps_pool)pool, want);
            for (int s = 0; s < TB_BAGS; s++) {
                CHECK(wide[s * (TB_DIM + 3)] == 99.0f && wide[s * (TB_DIM + 3) + 1] == 99.0f);
                for (int j = 0; j < TB_DIM; j++)
                    CHECK_NEAR(wide[2 + s * (TB_DIM + 3) + j], want[s * TB_DIM + j], 1e-6);
            }
            /* empty bag and padding-only bag pool to zeros, also for a mean */
            for (int j = 0; j < TB_DIM; j++)
                CHECK(wide[2 + 1 * (TB_DIM + 3) + j] == 0.0f &&
                      wide[2 + 4 * (TB_DIM + 3) + j] == 0.0f);
            CHECK_OK(ps_emb_bag_forward(b, &bags, (ps_pool)pool, eb.rows, TB_DIM, out, TB_DIM));
            /* backward: one row per unique id, duplicates summed */
            for (size_t i = 0; i < eb.nunique * TB_DIM; i++)
                eb.grads[i] = 123.0f; /* overwritten, not added to */
            CHECK_OK(ps_emb_bag_backward(b, &bags, (ps_pool)pool, dout, TB_DIM, TB_DIM,
                                         eb.grads));
            naive_backward(dout, w, (ps_pool)pool, gtable);
            for (size_t u = 0; u < eb.nunique; u++)
                for (int j = 0; j < TB_DIM; j++)
                    CHECK_NEAR(eb.grads[u * TB_DIM + j], gtable[eb.ids[u] * TB_DIM + j], 1e-6);
        }
    /* one id per bag (offsets NULL), as Criteo's fields */
    ps_emb_bags single = {4, NULL, eb.index, NULL, eb.nunique};
    CHECK_OK(ps_emb_bag_forward(b, &single, PS_POOL_MEAN, eb.rows, TB_DIM, out, TB_DIM));
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < TB_DIM; j++)
            CHECK(out[s * TB_DIM + j] == table[tb_ids[s] * TB_DIM + j]);
    ps_emb_batch_release(&eb);
    b->destroy(b);
}

PS_TEST(emb_bag_refuses_bad_offsets_indices_and_device_memory)
{
    ps_backend *b = cpu();
    CHECK(b);
    float rows[8] = {0}, out[8], g[8];
    int32_t index[] = {0, 1, 2};
    int32_t down[] = {0, 2, 1, 3}, late[] = {1, 2, 3};
    ps_emb_bags bags = {3, down, index, NULL, 3};
    CHECK_EQ_INT(ps_emb_bag_forward(b, &bags, PS_POOL_SUM, rows, 2, out, 2), PS_EINVAL);
    bags.offsets = late;
    bags.nbags = 2;
    CHECK_EQ_INT(ps_emb_bag_backward(b, &bags, PS_POOL_SUM, out, 2, 2, g), PS_EINVAL);
    ps_emb_bags beyond = {3, NULL, index, NULL, 2}; /* index 2 of 2 rows */
    CHECK_EQ_INT(ps_emb_bag_forward(b, &beyond, PS_POOL_SUM, rows, 2, out, 2), PS_EINVAL);
    CHECK_EQ_INT(ps_emb_bag_backward(b, &beyond, PS_POOL_SUM, out, 2, 2, g), PS_EINVAL);
    beyond.nrows = 3;
    CHECK_OK(ps_emb_bag_forward(b, &beyond, PS_POOL_SUM, rows, 2, out, 2));
    b->host_memory = 0; /* a device backend: the host loops cannot read its memory */
    CHECK_EQ_INT(ps_emb_bag_forward(b, &beyond, PS_POOL_SUM, rows, 2, out, 2), PS_EDEVICE);
    b->host_memory = 1;
    b->destroy(b);
}

/* Random bags of a batch: nbags bags of 0..maxlen entries over nrows unique
 * rows, a fifth of the entries padding, with weights in [0.5, 2). */
static void random_bags(ps_rng *r, int nbags, int maxlen, size_t nrows, int32_t *off,
                        int32_t *index, float *weights)
{
    for (int e = 0; e < nbags * maxlen; e++) {
        index[e] = ps_rng_next(r) % 5 == 0 ? -1 : (int32_t)(ps_rng_next(r) % nrows);
        weights[e] = 0.5f + 1.5f * (float)(ps_rng_next(r) >> 40) / (float)(1 << 24);
    }
    off[0] = 0;
    for (int s = 0; s < nbags; s++)
        off[s + 1] = off[s] + (int32_t)(ps_rng_next(r) % (uint64_t)(maxlen + 1));
}

/* ps_emb_dev (the layer on a device: staging, the CSR by unique row) on the
 * CPU backend, whose copies are memcpy: the same sums in the same order as
 * the host layer, so equal bit for bit, over passes that reuse the
 * staging. */
PS_TEST(emb_dev_staging_and_csr_match_the_host_layer_bit_for_bit)
{
    enum { NB = 40, MAXLEN = 5, NROWS = 30 };
    ps_backend *b = cpu();
    CHECK(b);
    ps_rng r;
    ps_rng_seed(&r, 5);
    static const int dims[] = {16, 13, 64};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        int dim = dims[di];
        size_t stride = (size_t)dim + 3;
        ps_emb_dev *d = NULL;
        CHECK_OK(ps_emb_dev_create(b, NB * MAXLEN, NB, dim, &d));
        float *rows = malloc(sizeof(float) * NROWS * dim);
        float *dout = malloc(sizeof(float) * NB * stride);
        float *want = malloc(sizeof(float) * NB * stride), *got = malloc(sizeof(float) * NB * stride);
        float *gw = malloc(sizeof(float) * NROWS * dim), *gg = malloc(sizeof(float) * NROWS * dim);
        int32_t off[NB + 1], index[NB * MAXLEN];
        float weights[NB * MAXLEN];
        int ok = rows && dout && want && got && gw && gg;
        for (int pass = 0; ok && pass < 8; pass++) {
            int pool = pass & 1, wt = pass >> 1 & 1, single = pass >> 2 & 1;
            random_bags(&r, NB, MAXLEN, NROWS, off, index, weights);
            fill_uniform(&r, rows, (size_t)NROWS * dim, -1, 1);
            fill_uniform(&r, dout, NB * stride, -1, 1);
            /* single: one entry per bag (offsets NULL), as the CTR model's */
            ps_emb_bags bags = {NB, single ? NULL : off, index, wt ? weights : NULL, NROWS};
            for (size_t i = 0; i < NB * stride; i++)
                want[i] = got[i] = 7.0f; /* between the rows: untouched */
            CHECK_OK(ps_emb_bag_forward(b, &bags, (ps_pool)pool, rows, dim, want, stride));
            CHECK_OK(ps_emb_dev_forward(d, &bags, (ps_pool)pool, rows, got, stride));
            CHECK_MSG(memcmp(got, want, sizeof(float) * NB * stride) == 0,
                      "dim %d pass %d: forward differs", dim, pass);
            CHECK_OK(ps_emb_bag_backward(b, &bags, (ps_pool)pool, dout, stride, dim, gw));
            CHECK_OK(ps_emb_dev_backward(d, &bags, (ps_pool)pool, dout, stride));
            CHECK_OK(ps_emb_dev_grads(d, gg));
            CHECK_MSG(memcmp(gg, gw, sizeof(float) * NROWS * dim) == 0,
                      "dim %d pass %d: row gradients differ", dim, pass);
        }
        CHECK(ok);
        /* the gradients once per backward; bags beyond the staging refused */
        CHECK_EQ_INT(ps_emb_dev_grads(d, gg), PS_ESTATE);
        ps_emb_bags big = {NB + 1, NULL, index, NULL, NROWS};
        CHECK_EQ_INT(ps_emb_dev_forward(d, &big, PS_POOL_SUM, rows, got, stride), PS_EINVAL);
        index[0] = NROWS;
        ps_emb_bags beyond = {1, NULL, index, NULL, NROWS};
        CHECK_EQ_INT(ps_emb_dev_backward(d, &beyond, PS_POOL_SUM, dout, stride), PS_EINVAL);
        free(rows), free(dout), free(want), free(got), free(gw), free(gg);
        ps_emb_dev_destroy(d);
    }
    b->destroy(b);
}

/* ---- local tables ------------------------------------------------------------- */

PS_TEST(local_rows_start_at_the_pure_initializer_and_follow_sgd_and_adagrad)
{
    const int dim = 3;
    ps_row_source *sgd, *ada, *adam;
    CHECK_EQ_INT(ps_row_source_local_create(2, dim, 5, PS_OPT_ADAM, 0.5f, 1e-8f, &adam),
                 PS_EINVAL);
    CHECK(adam == NULL);
    CHECK_OK(ps_row_source_local_create(2, dim, 5, PS_OPT_SGD, 0.5f, 1e-8f, &sgd));
    CHECK_OK(ps_row_source_local_create(2, dim, 5, PS_OPT_ADAGRAD, 0.5f, 1e-8f, &ada));
    /* the first fetch of a row is its initial value, the same in both, and
     * the servers' initializer's (uniform, scale 0.05): the row a server
     * table declared so starts with */
    uint64_t ids[] = {42, UINT64_MAX, 0};
    float rows[9], rows2[9], init[3];
    CHECK_OK(sgd->fetch(sgd, 1, ids, 3, rows));
    CHECK_OK(ada->fetch(ada, 1, ids, 3, rows2));
    for (int i = 0; i < 3; i++) {
        ps_table_init_row(5, PS_EMB_TABLE_KEY(1), ids[i], PS_TABLE_INIT_UNIFORM, 0.05f, dim,
                          init);
        for (int j = 0; j < dim; j++) {
            CHECK(rows[i * dim + j] == init[j] && rows2[i * dim + j] == init[j]);
            CHECK(init[j] >= -0.05f && init[j] < 0.05f);
        }
    }
    /* another table, another row for the same id */
    CHECK_OK(sgd->fetch(sgd, 0, ids, 1, rows2));
    CHECK(memcmp(rows, rows2, sizeof(float) * dim) != 0);
    CHECK_EQ_INT(sgd->fetch(sgd, 2, ids, 1, rows2), PS_EINVAL);
    /* two pushes of row 42: sgd w - lr g each; adagrad h += g^2,
     * w -= lr g / (sqrt(h) + eps) */
    float g1[3] = {0.5f, -1.0f, 2.0f}, g2[3] = {1.5f, 1.0f, 0.0f};
    float w_sgd[3], w_ada[3], h[3];
    for (int j = 0; j < dim; j++) {
        w_sgd[j] = rows[j] - 0.5f * g1[j];
        w_sgd[j] -= 0.5f * g2[j];
        h[j] = g1[j] * g1[j];
        w_ada[j] = rows[j] - 0.5f * g1[j] / (sqrtf(h[j]) + 1e-8f);
        h[j] += g2[j] * g2[j];
        w_ada[j] -= 0.5f * g2[j] / (sqrtf(h[j]) + 1e-8f);
    }
    CHECK_OK(sgd->push(sgd, 1, ids, 1, g1, 0));
    CHECK_OK(sgd->push(sgd, 1, ids, 1, g2, 1));
    CHECK_OK(ada->push(ada, 1, ids, 1, g1, 0));
    CHECK_OK(ada->push(ada, 1, ids, 1, g2, 1));
    /* many more rows: the map and the slabs grow, the old rows stay */
    enum { MANY = 5000 };
    uint64_t *many = malloc(MANY * sizeof *many);
    float *mrows = malloc(MANY * dim * sizeof *mrows);
    CHECK(many && mrows);
    for (int i = 0; i < MANY; i++)
        many[i] = ps_rng_mix((uint64_t)i);
    CHECK_OK(sgd->fetch(sgd, 1, many, MANY, mrows));
    CHECK_OK(ada->fetch(ada, 1, many, MANY, mrows));
    CHECK_EQ_INT(ps_row_source_local_rows(sgd), 1 + 3 + MANY);
    free(many);
    free(mrows);
    CHECK_OK(sgd->fetch(sgd, 1, ids, 1, rows));
    CHECK_OK(ada->fetch(ada, 1, ids, 1, rows2));
    for (int j = 0; j < dim; j++) {
        CHECK(rows[j] == w_sgd[j]);
        CHECK(rows2[j] == w_ada[j]);
    }
    /* a row first seen in a push starts from its initial value too */
    uint64_t fresh = 77;
    CHECK_OK(sgd->push(sgd, 0, &fresh, 1, g1, 2));
    CHECK_OK(sgd->fetch(sgd, 0, &fresh, 1, rows));
    ps_table_init_row(5, PS_EMB_TABLE_KEY(0), fresh, PS_TABLE_INIT_UNIFORM, 0.05f, dim, init);
    for (int j = 0; j < dim; j++)
        CHECK(rows[j] == init[j] - 0.5f * g1[j]);
    sgd->destroy(sgd);
    ada->destroy(ada);
    /* row-wise adagrad: one sum a row, the mean of the squared gradient
     * (summed in order) added each push, w -= lr g / (sqrt(m) + eps) */
    ps_row_source *rw;
    CHECK_OK(ps_row_source_local_create(2, dim, 5, PS_TABLE_OPT_ROWWISE_ADAGRAD, 0.5f, 1e-8f,
                                        &rw));
    CHECK_OK(rw->fetch(rw, 1, ids, 1, rows));
    float w_rw[3], m = 0.0f;
    memcpy(w_rw, rows, sizeof w_rw);
    const float *gs[2] = {g1, g2};
    for (int k = 0; k < 2; k++) {
        float sq = 0.0f;
        for (int j = 0; j < dim; j++)
            sq += gs[k][j] * gs[k][j];
        m += sq / (float)dim;
        float r = 0.5f / (sqrtf(m) + 1e-8f);
        for (int j = 0; j < dim; j++)
            w_rw[j] = w_rw[j] - gs[k][j] * r;
        CHECK_OK(rw->push(rw, 1, ids, 1, gs[k], k));
    }
    CHECK_OK(rw->fetch(rw, 1, ids, 1, rows));
    CHECK(memcmp(rows, w_rw, sizeof w_rw) == 0);
    rw->destroy(rw);
}

/* ---- the model: spec, loss, gradients ---------------------------------------- */

PS_TEST(ctr_spec_has_defaults_and_refuses_bad_keys_with_the_reason)
{
    ps_ctr_spec s;
    char why[512];
    CHECK(ps_ctr_spec_is("ctr") && ps_ctr_spec_is("ctr:dim=8"));
    CHECK(!ps_ctr_spec_is("ctrx") && !ps_ctr_spec_is("mlp:1-2") && !ps_ctr_spec_is(NULL));
    CHECK_OK(ps_ctr_spec_parse("ctr", &s, why, sizeof why));
    CHECK_MSG(strcmp(s.canonical, "ctr:fields=26,dense=13,dim=16,rows=1000000,mlp=512-256-1,"
                                  "pool=sum,interact=cat,opt=adagrad,lr=0.05") == 0,
              "%s", s.canonical);
    CHECK_OK(ps_ctr_spec_parse("ctr:interact=dot,pool=mean,dim=8,rows=4000000,mlp=64-1,opt=sgd,"
                               "lr=0.5,fields=3,dense=2",
                               &s, why, sizeof why));
    CHECK_MSG(strcmp(s.canonical, "ctr:fields=3,dense=2,dim=8,rows=4000000,bot=8,mlp=64-1,"
                                  "pool=mean,interact=dot,opt=sgd,lr=0.5") == 0,
              "%s", s.canonical);
    CHECK(s.dot && s.pool == PS_POOL_MEAN && s.nbot == 1 && s.bot[0] == 8 && s.opt == PS_OPT_SGD);
    /* a row cap for each table, and what a full one does */
    CHECK_OK(ps_ctr_spec_parse("ctr:fields=2,cap=5000,full=refuse", &s, why, sizeof why));
    CHECK_MSG(strstr(s.canonical, ",lr=0.05,cap=5000,full=refuse"), "%s", s.canonical);
    ps_table_options to;
    ps_ctr_table_options(&s, 1, &to);
    CHECK(to.max_rows == 5000 && to.full == PS_TABLE_FULL_REFUSE);
    CHECK_OK(ps_ctr_spec_parse("ctr:cap=7", &s, why, sizeof why));
    ps_ctr_table_options(&s, 1, &to);
    CHECK(to.max_rows == 7 && to.full == PS_TABLE_FULL_EVICT);
    struct {
        const char *spec, *says;
    } bad[] = {
        {"ctr:foo=1", "KEY one of fields, dense, dim"},
        {"ctr:dim", "expected KEY=VALUE"},
        {"ctr:dim=0", "dim must be an integer in [1, 4096]"},
        {"ctr:dim=4,dim=5", "dim given twice"},
        {"ctr:pool=max", "pool must be sum or mean, got 'max'"},
        {"ctr:interact=dot,bot=64-8", "bot must end in dim=16"},
        {"ctr:mlp=64-2", "mlp must end in 1"},
        {"ctr:mlp=64-", "mlp takes up to 16 layer sizes"},
        {"ctr:mlp=", "mlp must end in 1"},
        {"ctr:lr=-1", "lr must be a number"},
        {"ctr:opt=adam", "opt must be sgd, adagrad or rowwise_adagrad"},
        {"ctr:full=drop", "full must be evict or refuse"},
        {"ctr:cap=0", "cap must be an integer in [1, "},
        {"ctrl", "not a click-through model spec"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = '\0';
        CHECK_MSG(ps_ctr_spec_parse(bad[i].spec, &s, why, sizeof why) == PS_EINVAL, "%s",
                  bad[i].spec);
        CHECK_MSG(strstr(why, bad[i].says) && strstr(why, "--model "), "%s: %s", bad[i].spec,
                  why);
    }
}

PS_TEST(bce_loss_is_stable_and_its_gradient_is_sigmoid_minus_label_over_n)
{
    ps_backend *b = cpu();
    CHECK(b);
    const float z[] = {0.0f, 2.0f, -3.0f, 100.0f, -100.0f, 1e4f, 1e4f};
    const int32_t y[] = {1, 0, 1, 1, 1, 0, 1};
    const int n = 7;
    float d[7], loss;
    int correct;
    CHECK_OK(ps_loss_bce_logits(b, z, y, n, d, &loss, &correct));
    /* per sample: log 2, 2 + log(1 + e^-2), 3 + log(1 + e^-3), ~4e-44, 100 + ~0,
     * 1e4, ~0 */
    double want = (log(2.0) + 2 + log1p(exp(-2.0)) + 3 + log1p(exp(-3.0)) + 100 + 1e4) / n;
    CHECK_NEAR(loss, want, 1e-6);
    double sig[] = {0.5, 1 / (1 + exp(-2.0)), 1 / (1 + exp(3.0)), 1, 0, 1, 1};
    for (int i = 0; i < n; i++)
        CHECK_NEAR(d[i], (sig[i] - y[i]) / n, 1e-7);
    CHECK_EQ_INT(correct, 2); /* z > 0 == y: samples 3 and 6 */
    int32_t two[] = {2};
    CHECK_EQ_INT(ps_loss_bce_logits(b, z, two, 1, d, &loss, NULL), PS_EINVAL);
    b->destroy(b);
}

PS_TEST(interact_dot_joins_the_dense_vector_and_every_pair_of_embeddings)
{
    ps_backend *b = cpu();
    CHECK(b);
    ps_layer l;
    CHECK_EQ_INT(ps_layer_interact(&l, 3, 2, 2, 1), PS_EINVAL); /* dot needs in == dim */
    CHECK_OK(ps_layer_interact(&l, 2, 3, 2, 1));
    CHECK_EQ_INT(ps_layer_out_size(&l), 2 + 6);
    CHECK_OK(ps_layer_alloc(&l, b, 1));
    const float x[] = {1, 2};
    const float e[] = {3, 4, 5, 6, 7, 8}; /* e1, e2, e3 */
    memcpy(l.emb, e, sizeof e);
    float y[8];
    CHECK_OK(ps_layer_forward(b, &l, x, y, 1));
    /* x, then x.e1, e2.x, e2.e1, e3.x, e3.e1, e3.e2 */
    const float want[] = {1, 2, 11, 17, 39, 23, 53, 83};
    for (int i = 0; i < 8; i++)
        CHECK_MSG(y[i] == want[i], "y[%d] = %g, expected %g", i, y[i], want[i]);
    ps_layer_release(&l, b);
    CHECK_OK(ps_layer_interact(&l, 2, 3, 2, 0));
    CHECK_EQ_INT(ps_layer_out_size(&l), 2 + 6);
    CHECK_OK(ps_layer_alloc(&l, b, 1));
    memcpy(l.emb, e, sizeof e);
    CHECK_OK(ps_layer_forward(b, &l, x, y, 1));
    for (int i = 0; i < 8; i++)
        CHECK(y[i] == (i < 2 ? x[i] : e[i - 2]));
    ps_layer_release(&l, b);
    b->destroy(b);
}

/* One forward with labels: the mean loss. */
static int model_loss(ps_model *m, const float *x, const int32_t *y, int n, float *loss)
{
    return ps_model_forward(m, x, y, n, NULL, loss, NULL);
}

/* Central differences of the mean loss against the analytic gradients of
 * every dense parameter and every unique row of a small model.  The loss is
 * float32 (about 0.7, ulp 6e-8), so each difference carries rounding noise
 * of about 1.2e-7 / (2 eps) = 2e-5 with eps = 3e-3: the tolerance is 5e-5
 * plus 0.2% of the gradient.  The model is smooth away from ReLU kinks, and
 * the seed's inputs and weights keep those out of eps's reach.  An indexing
 * mistake is off by the size of the gradient itself. */
static void check_model_gradients(const char *spec)
{
    enum { N = 6, F = 3, D = 4 };
    ps_backend *b = cpu();
    CHECK(b);
    char why[512];
    ps_model *m;
    CHECK_OK(ps_model_create(spec, D, 1, 1, 2, N, b, 3, &m, why, sizeof why));
    CHECK_EQ_INT(ps_model_num_tables(m), F);
    ps_row_source *src;
    CHECK_OK(ps_row_source_local_create(F, ps_model_table_dim(m), 3, PS_OPT_SGD, 0.1f, 1e-8f,
                                        &src));
    ps_rng r;
    ps_rng_seed(&r, 8);
    float x[N * D];
    fill_uniform(&r, x, N * D, 0, 2);
    const int32_t y[N] = {1, 0, 0, 1, 1, 0};
    /* duplicates within each field: sample 0, 3 and 5 share field 0's id */
    const uint64_t ids[N * F] = {4, 9, 1, 2, 9, 1, 6, 8, 3, 4, 8, 1, 2, 7, 3, 4, 7, 5};
    CHECK_OK(ps_model_set_ids(m, ids, N));
    CHECK_OK(ps_model_fetch_rows(m, src));
    /* rows far from their tiny initial values, so the dots carry weight */
    ps_ctr_sparse *sp = ps_model_sparse(m);
    for (int f = 0; f < F; f++) {
        const ps_emb_batch *eb = ps_ctr_sparse_table(sp, f);
        fill_uniform(&r, eb->rows, eb->nunique * (size_t)eb->dim, -1, 1);
    }
    float loss;
    CHECK_OK(model_loss(m, x, y, N, &loss));
    CHECK_OK(ps_model_backward(m, NULL));
    const float eps = 3e-3f;
    int checked = 0;
    ps_param *p = ps_model_params(m);
    for (int k = 0; k < ps_model_num_params(m); k++)
        for (size_t i = 0; i < p[k].count; i++) {
            float keep = p[k].w[i], lp, lm;
            p[k].w[i] = keep + eps;
            CHECK_OK(model_loss(m, x, y, N, &lp));
            p[k].w[i] = keep - eps;
            CHECK_OK(model_loss(m, x, y, N, &lm));
            p[k].w[i] = keep;
            double fd = ((double)lp - lm) / (2.0 * eps), g = p[k].g[i];
            CHECK_MSG(fabs(fd - g) <= 2e-3 * fabs(g) + 5e-5,
                      "%s: param %d [%zu]: analytic %.7g, numeric %.7g", spec, k, i, g, fd);
            checked++;
        }
    for (int f = 0; f < F; f++) {
        const ps_emb_batch *eb = ps_ctr_sparse_table(sp, f);
        CHECK(eb->nunique >= 2 && eb->nunique < N);
        for (size_t i = 0; i < eb->nunique * (size_t)eb->dim; i++) {
            float keep = eb->rows[i], lp, lm;
            eb->rows[i] = keep + eps;
            CHECK_OK(model_loss(m, x, y, N, &lp));
            eb->rows[i] = keep - eps;
            CHECK_OK(model_loss(m, x, y, N, &lm));
            eb->rows[i] = keep;
            double fd = ((double)lp - lm) / (2.0 * eps), g = eb->grads[i];
            CHECK_MSG(fabs(fd - g) <= 2e-3 * fabs(g) + 5e-5,
                      "%s: field %d row %zu [%zu]: analytic %.7g, numeric %.7g", spec, f,
                      i / (size_t)eb->dim, i % (size_t)eb->dim, g, fd);
            checked++;
        }
    }
    CHECK(checked > 100);
    src->destroy(src);
    ps_model_destroy(m);
    b->destroy(b);
}

PS_TEST(ctr_model_gradients_match_finite_differences_cat_sum)
{
    check_model_gradients("ctr:fields=3,dense=4,dim=3,mlp=5-1,pool=sum,interact=cat");
}

PS_TEST(ctr_model_gradients_match_finite_differences_dot_mean_bottom_mlp)
{
    check_model_gradients("ctr:fields=3,dense=4,dim=3,bot=5-3,mlp=4-1,pool=mean,interact=dot");
}

PS_TEST(ctr_model_refuses_backends_without_its_kernels_other_data_and_a_file)
{
    ps_backend *b = cpu();
    CHECK(b);
    char why[512];
    ps_model *m = NULL;
    CHECK_EQ_INT(ps_model_create("ctr", 5, 1, 1, 2, 8, b, 1, &m, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "dense=13, but the data has 5 dense features"), "%s", why);
    CHECK_EQ_INT(ps_model_create("ctr", 13, 1, 1, 10, 8, b, 1, &m, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "needs click data"), "%s", why);
    /* a backend without the model's kernels (the host backend) */
    int (*bce)(ps_backend *, const float *, const int32_t *, int, float *, float *, int *) =
        b->bce_logits;
    b->bce_logits = NULL;
    CHECK_EQ_INT(ps_model_create("ctr", 13, 1, 1, 2, 8, b, 1, &m, why, sizeof why), PS_EDEVICE);
    CHECK_MSG(strstr(why, "no kernels for the click-through model") && strstr(why, "--device"),
              "%s", why);
    b->bce_logits = bce;
    CHECK_OK(ps_model_create("ctr:mlp=4-1", 13, 1, 1, 2, 8, b, 1, &m, why, sizeof why));
    CHECK_EQ_INT(ps_model_save(m, "/nonexistent/m.bin", why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "embedding tables"), "%s", why);
    /* a forward without the batch's rows is refused, not read from garbage,
     * and so is one of another size than the rows' batch */
    float x[2 * 13] = {0};
    int32_t y[2] = {1, 0};
    uint64_t ids[2 * 26] = {0};
    CHECK_EQ_INT(ps_model_forward(m, x, y, 1, NULL, NULL, NULL), PS_ESTATE);
    CHECK_OK(ps_model_set_ids(m, ids, 2));
    CHECK_EQ_INT(ps_model_forward(m, x, y, 2, NULL, NULL, NULL), PS_ESTATE);
    ps_row_source *src;
    CHECK_OK(ps_row_source_local_create(26, 16, 1, PS_OPT_SGD, 0.1f, 1e-8f, &src));
    CHECK_OK(ps_model_fetch_rows(m, src));
    CHECK_EQ_INT(ps_model_forward(m, x, y, 1, NULL, NULL, NULL), PS_EINVAL);
    CHECK_OK(ps_model_forward(m, x, y, 2, NULL, NULL, NULL));
    src->destroy(src);
    ps_model_destroy(m);
    b->destroy(b);
}

/* The model on a device backend (its rows staged across, ps_emb_dev)
 * played by a CPU backend that says its memory is not host memory: the
 * same kernels in the same order as the host path, so three SGD steps with
 * the tables updated in between give the same losses, weights and rows bit
 * for bit.  What only a GPU adds (the kernels themselves) test_cuda
 * checks. */
PS_TEST(ctr_model_device_path_on_the_cpu_matches_the_host_path_bit_for_bit)
{
    enum { N = 8, F = 3, D = 4, STEPS = 3 };
    const char *spec = "ctr:fields=3,dense=4,dim=5,bot=7-5,mlp=6-1,interact=dot,opt=sgd,lr=0.5";
    ps_backend *b[2] = {cpu(), cpu()};
    CHECK(b[0] && b[1]);
    b[1]->host_memory = 0;
    ps_model *m[2] = {NULL, NULL};
    ps_row_source *src[2] = {NULL, NULL};
    char why[512];
    float loss[2][STEPS];
    ps_rng r;
    float x[N * D];
    uint64_t ids[N * F];
    int32_t y[N];
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ps_model_create(spec, D, 1, 1, 2, N, b[k], 9, &m[k], why, sizeof why));
        CHECK_OK(ps_row_source_local_create(F, 5, 9, PS_OPT_SGD, 0.5f, 1e-8f, &src[k]));
        ps_rng_seed(&r, 12);
        for (int step = 0; step < STEPS; step++) {
            fill_uniform(&r, x, N * D, 0, 2);
            for (int i = 0; i < N * F; i++)
                ids[i] = ps_rng_next(&r) % 6; /* duplicates in every field */
            for (int i = 0; i < N; i++)
                y[i] = (int32_t)(ps_rng_next(&r) & 1);
            CHECK_OK(ps_model_load_batch(m[k], x, y, N));
            CHECK_OK(ps_model_set_ids(m[k], ids, N));
            CHECK_OK(ps_model_fetch_rows(m[k], src[k]));
            CHECK_OK(ps_model_forward(m[k], ps_model_input(m[k]), ps_model_labels(m[k]), N, NULL,
                                      &loss[k][step], NULL));
            CHECK_OK(ps_model_backward(m[k], NULL));
            CHECK_OK(ps_model_sgd_step(m[k], 0.5f));
            CHECK_OK(ps_model_push_rows(m[k], src[k], step));
        }
    }
    for (int step = 0; step < STEPS; step++)
        CHECK_MSG(loss[1][step] == loss[0][step], "step %d: loss %.9g, host path %.9g", step,
                  (double)loss[1][step], (double)loss[0][step]);
    for (int p = 0; p < ps_model_num_params(m[0]); p++) {
        ps_param *p0 = &ps_model_params(m[0])[p], *p1 = &ps_model_params(m[1])[p];
        CHECK_MSG(memcmp(p0->w, p1->w, p0->count * sizeof(float)) == 0, "param %d differs", p);
    }
    const uint64_t all[6] = {0, 1, 2, 3, 4, 5};
    float r0[6 * 5], r1[6 * 5];
    for (int f = 0; f < F; f++) {
        CHECK_OK(src[0]->fetch(src[0], f, all, 6, r0));
        CHECK_OK(src[1]->fetch(src[1], f, all, 6, r1));
        CHECK_MSG(memcmp(r0, r1, sizeof r0) == 0, "field %d's rows differ", f);
    }
    for (int k = 0; k < 2; k++) {
        src[k]->destroy(src[k]);
        ps_model_destroy(m[k]);
        b[k]->destroy(b[k]);
    }
}

/* ---- AUC ------------------------------------------------------------------------ */

PS_TEST(auc_is_exact_on_hand_computed_cases_with_ties)
{
    double auc;
    const int32_t y4[] = {0, 0, 1, 1};
    const float perfect[] = {0.1f, 0.2f, 0.3f, 0.4f}, reversed[] = {4, 3, 2, 1};
    const float one_swap[] = {0.1f, 0.4f, 0.35f, 0.8f}, all_tied[] = {1, 1, 1, 1};
    CHECK_OK(ps_auc(perfect, y4, 4, &auc));
    CHECK(auc == 1.0);
    CHECK_OK(ps_auc(reversed, y4, 4, &auc));
    CHECK(auc == 0.0);
    CHECK_OK(ps_auc(one_swap, y4, 4, &auc)); /* 3 of the 4 pairs ordered */
    CHECK(auc == 0.75);
    CHECK_OK(ps_auc(all_tied, y4, 4, &auc));
    CHECK(auc == 0.5);
    /* ties across classes count one half: positive 0.5 ties both negatives
     * (1), positive 0.9 beats both (2): 3 of 4 */
    const float tied[] = {0.5f, 0.5f, 0.5f, 0.9f};
    const int32_t yt[] = {1, 0, 0, 1};
    CHECK_OK(ps_auc(tied, yt, 4, &auc));
    CHECK(auc == 0.75);
    /* 3 positives, 2 negatives: s = 2 (pos) ties neg 2 and beats neg 1;
     * the pos at 1 ties neg 1; the pos at 3 beats both: (1.5 + 0.5 + 2) / 6 */
    const float s5[] = {2, 1, 3, 1, 2};
    const int32_t y5[] = {1, 1, 1, 0, 0};
    CHECK_OK(ps_auc(s5, y5, 5, &auc));
    CHECK(auc == 4.0 / 6.0);
    const int32_t one_class[] = {1, 1, 1, 1}, bad_label[] = {0, 2, 1, 0};
    CHECK_EQ_INT(ps_auc(perfect, one_class, 4, &auc), PS_EINVAL);
    CHECK_EQ_INT(ps_auc(perfect, bad_label, 4, &auc), PS_EINVAL);
    CHECK_EQ_INT(ps_auc(perfect, y4, 0, &auc), PS_EINVAL);
    const float with_nan[] = {0.1f, NAN, 0.3f, 0.4f};
    CHECK_EQ_INT(ps_auc(with_nan, y4, 4, &auc), PS_EDATA);
}

PS_TEST(auc_equals_the_pairwise_count_on_random_scores_with_many_ties)
{
    enum { N = 3000 };
    static float s[N];
    static int32_t y[N];
    ps_rng r;
    ps_rng_seed(&r, 5);
    uint64_t pos = 0;
    for (int i = 0; i < N; i++) {
        y[i] = ps_rng_uniform(&r) < 0.3;
        /* 40 distinct scores, nudged up for positives: many ties, AUC > 0.5 */
        s[i] = (float)(ps_rng_below(&r, 40) + (y[i] ? ps_rng_below(&r, 8) : 0));
        pos += (uint64_t)y[i];
    }
    uint64_t twice = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (y[i] == 1 && y[j] == 0)
                twice += s[i] > s[j] ? 2 : s[i] == s[j] ? 1 : 0;
    double auc, want = (double)twice / (2.0 * (double)pos * (double)(N - pos));
    CHECK_OK(ps_auc(s, y, N, &auc));
    CHECK_MSG(auc == want, "auc %.17g, pairwise %.17g", auc, want);
    CHECK(auc > 0.55 && auc < 0.9);
}

/* ---- Criteo -------------------------------------------------------------------- */

static const char *tmp_path(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", ps_test_tmpdir(), name);
    return buf;
}

static int write_text(const char *path, const char *text, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        int put = f ? gzwrite(f, text, (unsigned)strlen(text)) : 0;
        return f && gzclose(f) == Z_OK && (size_t)put == strlen(text) ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(text, 1, strlen(text), f);
    return fclose(f) == 0 && put == strlen(text) ? 0 : -1;
}

/* A Criteo line: label, 13 integers, 26 categorical values, with field k's
 * integer "k*v" and categorical "%08x" of (v << 8 | k); v = 0 leaves every
 * feature empty. */
static void criteo_line(char *buf, size_t len, int label, int v)
{
    size_t off = (size_t)snprintf(buf, len, "%d", label);
    for (int k = 0; k < PS_CTR_DENSE; k++)
        off += v ? (size_t)snprintf(buf + off, len - off, "\t%d", k * v)
                 : (size_t)snprintf(buf + off, len - off, "\t");
    for (int k = 0; k < PS_CRITEO_FIELDS; k++)
        off += v ? (size_t)snprintf(buf + off, len - off, "\t%08x", (unsigned)(v << 8 | k))
                 : (size_t)snprintf(buf + off, len - off, "\t");
    snprintf(buf + off, len - off, "\n");
}

PS_TEST(criteo_reads_missing_values_negative_counts_and_ids_per_field)
{
    char path[512], text[4096] = "", line[1024];
    criteo_line(line, sizeof line, 1, 3);
    strcat(text, line);
    criteo_line(line, sizeof line, 0, 0); /* everything missing */
    strcat(text, line);
    /* negative integers count as 0, upper-case hex, a CRLF ending, the
     * same value in two fields */
    strcat(text, "1\t-5\t7");
    for (int k = 2; k < PS_CTR_DENSE; k++)
        strcat(text, "\t");
    strcat(text, "\tABCDEF01\tabcdef01");
    for (int k = 2; k < PS_CRITEO_FIELDS; k++)
        strcat(text, "\t0");
    strcat(text, "\r\n");
    for (int gz = 0; gz < 2; gz++) {
        tmp_path(gz ? "small.txt.gz" : "small.txt", path, sizeof path);
        CHECK_OK(write_text(path, text, gz));
        ps_dataset *ds;
        char why[512];
        CHECK_OK(ps_dataset_load_criteo(path, 0, &ds, why, sizeof why));
        CHECK_EQ_INT(ds->count, 3);
        CHECK(ds->num_fields == 26 && ds->channels == 13 && ds->num_classes == 2);
        CHECK(ds->labels[0] == 1 && ds->labels[1] == 0 && ds->labels[2] == 1);
        for (int k = 0; k < PS_CTR_DENSE; k++) {
            CHECK(ds->images[k] == (float)log1p(3.0 * k));
            CHECK(ds->images[13 + k] == 0.0f);
        }
        CHECK(ds->images[26] == 0.0f && ds->images[27] == (float)log1p(7.0));
        for (int f = 0; f < PS_CRITEO_FIELDS; f++) {
            CHECK(ds->ids[f] == ps_criteo_id(f, (uint64_t)(3 << 8 | f), 0));
            CHECK(ds->ids[26 + f] == ps_criteo_id(f, 0, 1));
            CHECK(ds->ids[f] >> 58 == (uint64_t)f); /* the field in the top bits */
        }
        /* the same value in fields 0 and 1 gives two ids; missing is not 0 */
        CHECK(ds->ids[52] == ps_criteo_id(0, 0xabcdef01, 0) && ds->ids[53] != ds->ids[52]);
        CHECK(ds->ids[53] == ps_criteo_id(1, 0xabcdef01, 0));
        CHECK(ps_criteo_id(2, 0, 1) != ps_criteo_id(2, 0, 0));
        ps_dataset_free(ds);
    }
}

/* Columns joined by tabs, ending in a newline. */
static void join_columns(char *buf, size_t len, const char *const *col, int n)
{
    size_t off = 0;
    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "\t" : "", col[i]);
    snprintf(buf + off, len - off, "\n");
}

PS_TEST(criteo_refuses_a_bad_line_with_its_number)
{
    enum { COLS = 1 + PS_CTR_DENSE + PS_CRITEO_FIELDS };
    char num[PS_CTR_DENSE][16], hex[PS_CRITEO_FIELDS][16];
    const char *col[COLS] = {"1"};
    for (int k = 0; k < PS_CTR_DENSE; k++)
        snprintf(num[k], sizeof num[k], "%d", k), col[1 + k] = num[k];
    for (int f = 0; f < PS_CRITEO_FIELDS; f++)
        snprintf(hex[f], sizeof hex[f], "%08x", f), col[1 + PS_CTR_DENSE + f] = hex[f];
    char good[1024], second[1024], path[512], text[4096], why[512];
    join_columns(good, sizeof good, col, COLS);
    struct {
        int column, ncol;
        const char *value, *says;
    } bad[] = {
        {0, 3, "1", "expected 40 tab-separated fields (label, 13 integers, 26 categorical), "
                    "got 3"},
        {0, COLS, "2", "label must be 0 or 1, got '2'"},
        {0, COLS, "", "label must be 0 or 1, got ''"},
        {3, COLS, "12x", "integer feature 3 must be an integer or empty, got '12x'"},
        {13, COLS, "+4", "integer feature 13 must be an integer or empty, got '+4'"},
        {14, COLS, "zz", "categorical feature 1 must be up to 16 hex digits or empty, got 'zz'"},
        {39, COLS, "00000000000000001",
         "categorical feature 26 must be up to 16 hex digits or empty, got '00000000000000001'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *keep = col[bad[i].column];
        col[bad[i].column] = bad[i].value;
        join_columns(second, sizeof second, col, bad[i].ncol);
        col[bad[i].column] = keep;
        snprintf(text, sizeof text, "%s%s%s", good, second, good);
        tmp_path("bad.txt", path, sizeof path);
        CHECK_OK(write_text(path, text, 0));
        ps_dataset *ds = NULL;
        why[0] = '\0';
        CHECK_EQ_INT(ps_dataset_load_criteo(path, 0, &ds, why, sizeof why), PS_EDATA);
        CHECK(ds == NULL);
        char where[700];
        snprintf(where, sizeof where, "%s:2: %s", path, bad[i].says);
        CHECK_MSG(strstr(why, where), "case %zu: %s", i, why);
    }
    /* the good line alone reads */
    tmp_path("good.txt", path, sizeof path);
    CHECK_OK(write_text(path, good, 0));
    ps_dataset *ds = NULL;
    CHECK_OK(ps_dataset_load_criteo(path, 0, &ds, why, sizeof why));
    CHECK(ds->count == 1 && ds->labels[0] == 1);
    ps_dataset_free(ds);
    tmp_path("empty.txt", path, sizeof path);
    CHECK_OK(write_text(path, "", 0));
    CHECK_EQ_INT(ps_dataset_load_criteo(path, 0, &ds, why, sizeof why), PS_EDATA);
    CHECK_MSG(strstr(why, "no samples"), "%s", why);
    tmp_path("missing.txt", path, sizeof path);
    CHECK_EQ_INT(ps_dataset_load_criteo(path, 0, &ds, why, sizeof why), PS_EDATA);
    CHECK_MSG(strstr(why, "cannot open"), "%s", why);
}

PS_TEST(criteo_spec_holds_out_the_last_tenth_or_reads_a_test_file)
{
    char path[512], test_path[512], text[40 * 1024] = "", line[1024], spec[1200], why[512];
    for (int i = 0; i < 20; i++) {
        criteo_line(line, sizeof line, i % 2, i + 1);
        strcat(text, line);
    }
    tmp_path("twenty.txt", path, sizeof path);
    CHECK_OK(write_text(path, text, 0));
    ps_dataset *tr, *te;
    snprintf(spec, sizeof spec, "criteo:%s", path);
    CHECK_OK(ps_dataset_open_ctr(spec, 1, 26, 100, &tr, &te, why, sizeof why));
    CHECK(tr->count == 18 && te->count == 2);
    /* the test set is lines 19 and 20 */
    CHECK(te->ids[0] == ps_criteo_id(0, 19 << 8, 0) && te->ids[26] == ps_criteo_id(0, 20 << 8, 0));
    CHECK(tr->ids[17 * 26] == ps_criteo_id(0, 18 << 8, 0));
    ps_dataset_free(tr);
    ps_dataset_free(te);
    snprintf(spec, sizeof spec, "criteo:%s,lines=10", path);
    CHECK_OK(ps_dataset_open_ctr(spec, 1, 26, 100, &tr, &te, why, sizeof why));
    CHECK(tr->count == 9 && te->count == 1);
    ps_dataset_free(tr);
    ps_dataset_free(te);
    criteo_line(line, sizeof line, 1, 77);
    tmp_path("test.txt", test_path, sizeof test_path);
    CHECK_OK(write_text(test_path, line, 0));
    snprintf(spec, sizeof spec, "criteo:%s,test=%s", path, test_path);
    CHECK_OK(ps_dataset_open_ctr(spec, 1, 26, 100, &tr, &te, why, sizeof why));
    CHECK(tr->count == 20 && te->count == 1 && te->ids[0] == ps_criteo_id(0, 77 << 8, 0));
    ps_dataset_free(tr);
    ps_dataset_free(te);
    snprintf(spec, sizeof spec, "criteo:%s", path);
    CHECK_EQ_INT(ps_dataset_open_ctr(spec, 1, 8, 100, &tr, &te, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "26 categorical fields, the model fields=8"), "%s", why);
    const char *bad[] = {"criteo:", "criteo:x,lines=0", "criteo:x,zipf=1", "synthetic-ctr:0",
                         "synthetic-ctr:10,test=x", "synthetic-ctr:10,lines=3", "mnist"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(ps_dataset_open_ctr(bad[i], 1, 26, 100, &tr, &te, why, sizeof why) ==
                      PS_EINVAL,
                  "%s", bad[i]);
        CHECK_MSG(strstr(why, "synthetic-ctr:N"), "%s: %s", bad[i], why);
    }
}

/* ---- synthetic ----------------------------------------------------------------- */

PS_TEST(synthetic_ctr_is_a_pure_function_of_the_sample_index)
{
    ps_dataset *a, *b, *c, *tr, *te;
    char why[512];
    CHECK_OK(ps_dataset_synthetic_ctr(0, 100, 1, 5, 1000, 1.05, &a, why, sizeof why));
    CHECK_OK(ps_dataset_synthetic_ctr(50, 50, 1, 5, 1000, 1.05, &b, why, sizeof why));
    CHECK_OK(ps_dataset_synthetic_ctr(0, 100, 2, 5, 1000, 1.05, &c, why, sizeof why));
    /* samples 50..99 alone are the second half of 0..99 */
    CHECK(memcmp(a->ids + 50 * 5, b->ids, 50 * 5 * sizeof *b->ids) == 0);
    CHECK(memcmp(a->images + 50 * 13, b->images, 50 * 13 * sizeof *b->images) == 0);
    CHECK(memcmp(a->labels + 50, b->labels, 50 * sizeof *b->labels) == 0);
    /* another seed, other samples */
    CHECK(memcmp(a->ids, c->ids, 100 * 5 * sizeof *a->ids) != 0);
    for (size_t i = 0; i < 100 * 5; i++)
        CHECK(a->ids[i] < 1000);
    /* synthetic-ctr:N: train 0..N-1, test the N/10 after */
    CHECK_OK(ps_dataset_open_ctr("synthetic-ctr:90", 1, 5, 1000, &tr, &te, why, sizeof why));
    CHECK(tr->count == 90 && te->count == 9);
    CHECK(memcmp(tr->ids, a->ids, 90 * 5 * sizeof *a->ids) == 0);
    CHECK(memcmp(te->ids, a->ids + 90 * 5, 9 * 5 * sizeof *a->ids) == 0);
    ps_dataset_free(tr);
    ps_dataset_free(te);
    CHECK_OK(ps_dataset_open_ctr("synthetic-ctr:60,test=40,zipf=1.05", 1, 5, 1000, &tr, &te, why,
                                 sizeof why));
    CHECK(tr->count == 60 && te->count == 40);
    CHECK(memcmp(te->labels, a->labels + 60, 40 * sizeof *a->labels) == 0);
    ps_dataset_free(tr);
    ps_dataset_free(te);
    CHECK_EQ_INT(ps_dataset_synthetic_ctr(0, 10, 1, 5, (1ull << 40) + 1, 1.05, &tr, why,
                                          sizeof why),
                 PS_EINVAL);
    CHECK_MSG(strstr(why, "rows in [1, 1099511627776]"), "%s", why);
    /* a billion ids: the tail past the table's 2^22 ranks is drawn too */
    CHECK_OK(ps_dataset_synthetic_ctr(0, 2000, 1, 4, 1000000000, 1.05, &tr, why, sizeof why));
    int past = 0;
    for (size_t k = 0; k < 2000 * 4; k++) {
        CHECK(tr->ids[k] < 1000000000);
        past += tr->ids[k] >= (1u << 22);
    }
    CHECK_MSG(past > 2000 * 4 / 10, "%d of 8000 ids past the table", past);
    ps_dataset_free(tr);
    ps_dataset_free(a);
    ps_dataset_free(b);
    ps_dataset_free(c);
}

PS_TEST(synthetic_ctr_ids_have_the_stated_zipf_shape_and_a_quarter_clicks)
{
    enum { N = 20000, F = 4, ROWS = 1000 };
    ps_dataset *ds;
    char why[512];
    CHECK_OK(ps_dataset_synthetic_ctr(0, N, 3, F, ROWS, 1.05, &ds, why, sizeof why));
    static unsigned count[ROWS];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < (size_t)N * F; i++)
        count[ds->ids[i]]++;
    double h = 0;
    for (int k = 1; k <= ROWS; k++)
        h += pow(k, -1.05);
    /* id k is rank k+1: expected N F (k+1)^-1.05 / H; within 5 sigma */
    const int probe[] = {0, 1, 2, 4, 9, 31, 99, 999};
    for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) {
        double e = (double)N * F * pow(probe[i] + 1, -1.05) / h;
        CHECK_MSG(fabs(count[probe[i]] - e) < 5 * sqrt(e) + 1, "id %d: %u draws, expected %.1f",
                  probe[i], count[probe[i]], e);
    }
    /* the head's ratio: rank 1 over rank 2 is 2^1.05 = 2.07 */
    double ratio = (double)count[0] / count[1];
    CHECK_MSG(ratio > 1.9 && ratio < 2.25, "ratio %.3f", ratio);
    size_t clicks = 0;
    for (size_t i = 0; i < N; i++)
        clicks += (size_t)ds->labels[i];
    CHECK_MSG(clicks > N / 5 && clicks < 3 * N / 10, "%zu clicks of %d", clicks, N);
    ps_dataset_free(ds);
}

PS_TEST(shard_fills_the_ids_of_the_samples_it_fills)
{
    ps_dataset *ds;
    char why[512];
    CHECK_OK(ps_dataset_synthetic_ctr(0, 64, 1, 3, 50, 1.05, &ds, why, sizeof why));
    ps_data_shard *s;
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 8, 9, &s, why, sizeof why));
    float x[8 * 13];
    int32_t y[8];
    uint64_t ids[8 * 3];
    CHECK_OK(ps_data_shard_fill(s, 2, 3, x, y));
    CHECK_OK(ps_data_shard_fill_ids(s, 2, 3, ids));
    const size_t *order = ps_data_shard_order(s, 2);
    for (int j = 0; j < 8; j++) {
        size_t idx = order[3 * 16 + 8 + j];
        CHECK(memcmp(ids + j * 3, ds->ids + idx * 3, 3 * sizeof *ids) == 0);
        CHECK(memcmp(x + j * 13, ds->images + idx * 13, 13 * sizeof *x) == 0);
    }
    CHECK_EQ_INT(ps_data_shard_fill_ids(s, 2, 4, ids), PS_EINVAL);
    ps_data_shard_destroy(s);
    ps_dataset_free(ds);
}

/* ---- ps_worker ------------------------------------------------------------------- */

/* The "summary: ... test auc X" of a log, or -1. */
static double summary_auc(const char *path)
{
    char *text = ps_test_read_file(path, NULL);
    const char *p = text ? strstr(text, "summary:") : NULL;
    double auc = p && (p = strstr(p, "test auc ")) ? strtod(p + 9, NULL) : -1;
    free(text);
    return auc;
}

/* One pass over synthetic-ctr:200000 with a smaller top MLP than the
 * default (64-1 for 512-256-1: a fifth of the time, the same AUC within
 * 0.001) and a 100000-id space per field. */
PS_TEST(ps_worker_ctr_one_epoch_of_synthetic_ctr_reaches_test_auc_0_75)
{
    char log[512];
    tmp_path("ctr-worker.log", log, sizeof log);
    int pid = ps_test_spawn_words("ps_worker",
                                  "--servers none --model ctr:rows=100000,mlp=64-1 "
                                  "--data synthetic-ctr:200000 --log-every 1000",
                                  log);
    CHECK(pid > 0);
    int st = ps_test_wait(pid, 120000);
    char *text = ps_test_read_file(log, NULL);
    CHECK_MSG(st == 0, "exit %d: %s", st, text ? text : "");
    free(text);
    double auc = summary_auc(log);
    printf("# test auc after one pass of 200000 samples: %.4f\n", auc);
    CHECK_MSG(auc >= 0.75, "test auc %.4f", auc);
    CHECK(ps_test_file_has(log, "loss") && ps_test_file_has(log, "samples/s") &&
          ps_test_file_has(log, "epoch 1 test auc "));
}

PS_TEST(ps_worker_ctr_refuses_a_file_and_other_data_with_exit_2)
{
    struct {
        const char *args, *says;
    } cases[] = {
        {"--servers tcp://127.0.0.1:1 --model ctr --data synthetic-ctr:100 --load m.bin",
         "--load: --model ctr keeps its embedding tables outside the model file, which cannot "
         "hold them yet (the servers' checkpoints hold them"},
        {"--servers none --model ctr --data synthetic-ctr:100 --save m.bin",
         "--save: --model ctr keeps its embedding tables outside the model file"},
        {"--servers none --model ctr", "--model ctr reads click-through data"},
        {"--servers none --model mlp:13-2 --data synthetic-ctr:100", "it needs --model ctr"},
        {"--servers none --model ctr:fields=8 --data criteo:/nonexistent",
         "Criteo data has 26 categorical fields"},
        {"--servers none --model ctr:dim=x --data synthetic-ctr:100",
         "dim must be an integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char log[512];
        tmp_path("ctr-refused.log", log, sizeof log);
        int pid = ps_test_spawn_words("ps_worker", cases[i].args, log);
        CHECK(pid > 0);
        int st = ps_test_wait(pid, 30000);
        char *text = ps_test_read_file(log, NULL);
        int ok = st == 2 && text && strstr(text, cases[i].says);
        CHECK_MSG(ok, "%s: exit %d: %s", cases[i].args, st, text ? text : "");
        free(text);
    }
}

/* ---- through servers ---------------------------------------------------------- */

/* Field f's table as ps_worker declares it (ps_ctr_table_options), fetched
 * through a server, starts where the local tables do: the same rows, bit
 * for bit, for the same seed. */
PS_TEST(servers_tables_start_from_the_local_tables_rows)
{
    enum { F = 3, N = 5 };
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode sync"));
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    char why[256];
    ps_ctr_spec cs;
    CHECK_OK(ps_ctr_spec_parse("ctr:fields=3,dim=8,opt=sgd,lr=0.5", &cs, why, sizeof why));
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.mode = PS_MODE_SYNC;
    ps_backend *b = NULL;
    ps_exchange *x = NULL;
    ps_row_source *remote = NULL, *local = NULL;
    int rc = ps_backend_host_create(&b);
    if (!rc)
        rc = ps_exchange_open(&o, b, &x);
    for (int f = 0; f < F && !rc; f++) {
        ps_table_options to;
        ps_ctr_table_options(&cs, 77, &to);
        rc = ps_exchange_add_table(x, PS_EMB_TABLE_KEY(f), &to, N, f);
    }
    if (!rc && !(rc = ps_exchange_start(x)))
        rc = ps_row_source_servers_create(x, 0, F, &remote);
    if (!rc)
        rc = ps_row_source_local_create(F, cs.dim, 77, cs.opt, cs.lr, PS_CTR_ADAGRAD_EPS, &local);
    const uint64_t ids[N] = {0, 1, 99, 123456789, UINT64_MAX};
    float got[N * 8], want[N * 8];
    int same = 1;
    for (int f = 0; f < F && !rc; f++) {
        if ((rc = remote->fetch(remote, f, ids, N, got)) ||
            (rc = local->fetch(local, f, ids, N, want)))
            break;
        same &= memcmp(got, want, sizeof got) == 0;
    }
    /* a batch's gradients go with its step: a push of loose ids is refused */
    int refused = remote && remote->push(remote, 0, ids, 1, got, 0) == PS_ESTATE;
    if (remote)
        remote->destroy(remote);
    if (local)
        local->destroy(local);
    ps_exchange_close(x);
    ps_backend_host_destroy(b);
    ps_test_stop(sv.pid, 5000);
    CHECK_MSG(rc == 0, "%s", ps_strerror(rc));
    CHECK(same);
    CHECK(refused);
}

/* The last "epoch N test auc X loss Y (scores FP)" of a log: X, and FP
 * into fp. */
static double epoch_auc(const char *path, char *fp, size_t fp_len)
{
    char *text = ps_test_read_file(path, NULL);
    const char *p = text, *last = NULL;
    while (p && (p = strstr(p, " (scores ")))
        last = p++;
    const char *line = last;
    while (line && line > text && line[-1] != '\n')
        line--;
    const char *a = line ? strstr(line, " test auc ") : NULL;
    double auc = a && a < last ? strtod(a + 10, NULL) : -1;
    snprintf(fp, fp_len, "%.16s", last ? last + 9 : "");
    free(text);
    return auc;
}

/* One pass of synthetic-ctr:200000, 8 fields, through S servers in `mode`
 * by W workers: 0 when every process exited 0; rank 0's test AUC and its
 * scores' fingerprint. */
static int ctr_through_servers(int S, int W, const char *mode, const char *tag, double *auc,
                               char *fp, size_t fp_len, const char *opt)
{
    int spid[4], wpid[4], port[4];
    char eps[256] = "", words[1024], log[512];
    size_t off = 0;
    for (int k = 0; k < S; k++) {
        port[k] = ps_test_free_port();
        off += (size_t)snprintf(eps + off, sizeof eps - off, "%stcp://127.0.0.1:%d",
                                k ? "," : "", port[k]);
    }
    for (int k = 0; k < S; k++) {
        snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --rank %d --num-servers %d "
                 "--num-workers %d --mode %s --optimizer sgd --lr 0.05", port[k], k, S, W, mode);
        snprintf(log, sizeof log, "%s/%s-server%d.log", ps_test_tmpdir(), tag, k);
        spid[k] = ps_test_spawn_words("ps_server", words, log);
    }
    for (int r = 0; r < W; r++) {
        snprintf(words, sizeof words, "--servers %s --rank %d --num-workers %d --mode %s "
                 "--model ctr:fields=8,rows=100000,mlp=64-1,opt=%s --data synthetic-ctr:200000 "
                 "--log-every 1000", eps, r, W, mode, opt);
        snprintf(log, sizeof log, "%s/%s-worker%d.log", ps_test_tmpdir(), tag, r);
        wpid[r] = ps_test_spawn_words("ps_worker", words, log);
    }
    int bad = 0;
    for (int r = 0; r < W; r++)
        if (wpid[r] <= 0 || ps_test_wait(wpid[r], 240000) != 0) {
            snprintf(log, sizeof log, "%s/%s-worker%d.log", ps_test_tmpdir(), tag, r);
            char *text = ps_test_read_file(log, NULL);
            printf("# %s worker %d failed: %s\n", tag, r, text ? text : "");
            free(text);
            bad = 1;
        }
    for (int k = 0; k < S; k++) {
        if (spid[k] <= 0 || ps_test_stop(spid[k], 5000) != 0)
            bad = 1;
        /* the closing line counts every table's rows */
        snprintf(log, sizeof log, "%s/%s-server%d.log", ps_test_tmpdir(), tag, k);
        if (!ps_test_file_has(log, ", 8 tables: ")) {
            printf("# %s server %d: no closing line with its tables\n", tag, k);
            bad = 1;
        }
        /* and names them by field (the declaration's name) */
        if (!ps_test_file_has(log, "table 'ctr field 7' (key ")) {
            printf("# %s server %d: its log does not name the tables by field\n", tag, k);
            bad = 1;
        }
    }
    snprintf(log, sizeof log, "%s/%s-worker0.log", ps_test_tmpdir(), tag);
    *auc = epoch_auc(log, fp, fp_len);
    return bad ? -1 : 0;
}

/* One PyTorch process on the same model and data (bench/torch_ctr_ref.py
 * --model ctr:fields=8,rows=100000,mlp=64-1 --data synthetic-ctr:200000
 * --batch 64) reaches test AUC 0.8026; these runs 0.8029 (sync) and 0.8024
 * (async) here: 0.6 leaves room for any machine and still fails a run
 * whose rows do not train (0.5). */
PS_TEST(ps_worker_ctr_through_2_servers_sync_and_async_reaches_test_auc_0_6)
{
    const char *modes[] = {"sync", "async"};
    for (int i = 0; i < 2; i++) {
        double auc;
        char fp[32];
        CHECK_OK(ctr_through_servers(2, 1, modes[i], modes[i], &auc, fp, sizeof fp, "adagrad"));
        printf("# %s through 2 servers: test auc %.4f\n", modes[i], auc);
        CHECK_MSG(auc >= 0.6, "%s: test auc %.4f", modes[i], auc);
    }
}

/* The tables with row-wise adagrad (one state float a row) learn as well. */
PS_TEST(ps_worker_ctr_with_rowwise_adagrad_tables_reaches_test_auc_0_6)
{
    double auc;
    char fp[32];
    CHECK_OK(ctr_through_servers(1, 1, "async", "rowwise", &auc, fp, sizeof fp,
                                 "rowwise_adagrad"));
    printf("# async, row-wise adagrad tables: test auc %.4f\n", auc);
    CHECK_MSG(auc >= 0.6, "test auc %.4f", auc);
}

PS_TEST(ps_worker_ctr_sync_two_workers_through_servers_repeats_bit_for_bit)
{
    double auc[2];
    char fp[2][32];
    for (int run = 0; run < 2; run++)
        CHECK_OK(ctr_through_servers(2, 2, "sync", run ? "sync2b" : "sync2a", &auc[run], fp[run],
                                     sizeof fp[run], "adagrad"));
    printf("# sync, 2 workers: test auc %.4f and %.4f, scores %s and %s\n", auc[0], auc[1],
           fp[0], fp[1]);
    CHECK_MSG(strlen(fp[0]) == 16, "no scores fingerprint in the log");
    CHECK_STR(fp[1], fp[0]);
    CHECK(auc[0] >= 0.6);
}
