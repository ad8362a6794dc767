#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "auc.h"
#include "ctr.h"
#include "data.h"
#include "ps_error.h"
#include "ps_hash.h"
#include "rng.h"

#define MAX_MLP_SIZES 64
#define MAX_WIDTH 1000000
/* every layer of an mlp spec plus a ReLU after each but the last; cnn: 10 */
#define MAX_LAYERS (2 * MAX_MLP_SIZES)

#define FILE_MAGIC "PSMODEL\0"
#define FILE_VERSION 1u
#define FILE_MAX_SPEC 1024u

struct ps_model {
    char spec[256];
    ps_backend *b;
    int in_c, in_h, in_w, num_classes, max_batch;

    int nlayers;
    ps_layer *layers;
    int *first_param, *num_layer_params; /* per layer */

    int nparams;
    ps_param *params;
    float **own_w, **own_g; /* what the model allocated, freed at destroy */

    /* act[i] is the input of layer i, act[i+1] its output; act[0] is the
     * caller's x for the current pass.  ReLU and flatten run in place, so
     * their output aliases their input (and likewise dact); own_act and
     * own_dact list what was allocated. */
    float **act, **dact, **own_act, **own_dact;
    float *input;
    int32_t *labels;

    /* the pass in flight */
    const float *x;
    int n;
    int have_grad; /* a forward with labels succeeded: backward may run */

    /* the click-through model (NULL sparse for mlp and cnn): its spec, its
     * tables' side of the batch, and the layer that joins the two */
    ps_ctr_spec ctr;
    ps_ctr_sparse *sparse;
    int interact;
};

/* ---- spec parsing ------------------------------------------------------- */

/* "784-256-10" -> sizes.  Returns 0, or PS_EINVAL with why naming the bad
 * token. */
static int parse_sizes(const char *spec, const char *text, int *sizes, int max, int *count,
                       char *why, size_t why_len)
{
    *count = 0;
    if (!*text)
        return 0;
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, '-');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        long v = 0;
        int ok = len > 0 && len <= 7;
        for (size_t i = 0; ok && i < len; i++) {
            if (p[i] < '0' || p[i] > '9')
                ok = 0;
            else
                v = v * 10 + (p[i] - '0');
        }
        if (!ok || v < 1 || v > MAX_WIDTH) {
            snprintf(why, why_len, "--model %s: sizes must be integers in [1, %d], got '%.*s'",
                     spec, MAX_WIDTH, (int)(len > 32 ? 32 : len), p);
            return PS_EINVAL;
        }
        if (*count == max) {
            snprintf(why, why_len, "--model %s: at most %d sizes", spec, max);
            return PS_EINVAL;
        }
        sizes[(*count)++] = (int)v;
        if (!end)
            return 0;
        p = end + 1;
    }
}

/* Fill m->layers from the spec; m->spec gets the canonical form. */
static int build_layers(ps_model *m, const char *spec, char *why, size_t why_len)
{
    int sizes[MAX_MLP_SIZES], ns, rc;
    ps_layer *L = m->layers;
    int n = 0;
    size_t in_size = (size_t)m->in_c * m->in_h * m->in_w;
#define ADD(call)                                                                                  \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            snprintf(why, why_len, "--model %s: a layer is too large for this input (%dx%dx%d)",  \
                     spec, m->in_c, m->in_h, m->in_w);                                             \
            return PS_EINVAL;                                                                      \
        }                                                                                          \
        n++;                                                                                       \
    } while (0)

    if (strncmp(spec, "mlp:", 4) == 0) {
        if ((rc = parse_sizes(spec, spec + 4, sizes, MAX_MLP_SIZES, &ns, why, why_len)))
            return rc;
        if (ns < 2) {
            snprintf(why, why_len,
                     "--model %s: need at least an input and an output size, e.g. "
                     "mlp:784-256-10",
                     spec);
            return PS_EINVAL;
        }
        if ((size_t)sizes[0] != in_size) {
            snprintf(why, why_len,
                     "--model %s: input size %d does not match the data (%dx%dx%d = %zu values)",
                     spec, sizes[0], m->in_c, m->in_h, m->in_w, in_size);
            return PS_EINVAL;
        }
        if (sizes[ns - 1] != m->num_classes) {
            snprintf(why, why_len,
                     "--model %s: output size %d does not match the data's %d classes", spec,
                     sizes[ns - 1], m->num_classes);
            return PS_EINVAL;
        }
        int off = snprintf(m->spec, sizeof m->spec, "mlp:%d", sizes[0]);
        for (int i = 1; i < ns; i++) {
            ADD(ps_layer_linear(&L[n], sizes[i - 1], sizes[i]));
            if (i < ns - 1)
                ADD(ps_layer_relu(&L[n], sizes[i], 1, 1));
            if (off < (int)sizeof m->spec)
                off += snprintf(m->spec + off, sizeof m->spec - (size_t)off, "-%d", sizes[i]);
        }
        if (off >= (int)sizeof m->spec) {
            snprintf(why, why_len, "--model %s: spec too long", spec);
            return PS_EINVAL;
        }
    } else if (strcmp(spec, "cnn") == 0 || strncmp(spec, "cnn:", 4) == 0) {
        if (spec[3] == '\0') {
            sizes[0] = 32, sizes[1] = 64, sizes[2] = 1024, ns = 3;
        } else if ((rc = parse_sizes(spec, spec + 4, sizes, 3, &ns, why, why_len)) || ns != 3) {
            snprintf(why, why_len,
                     "--model %s: expected cnn or cnn:C1-C2-F (conv channels and hidden units), "
                     "e.g. cnn:32-64-1024",
                     spec);
            return PS_EINVAL;
        }
        if (m->in_h % 4 || m->in_w % 4) {
            snprintf(why, why_len,
                     "--model %s: needs input height and width divisible by 4 (two 2x2 pools), "
                     "got %dx%dx%d",
                     spec, m->in_c, m->in_h, m->in_w);
            return PS_EINVAL;
        }
        int c = m->in_c, h = m->in_h, w = m->in_w;
        for (int s = 0; s < 2; s++) {
            ADD(ps_layer_conv2d(&L[n], c, h, w, sizes[s], 5));
            c = sizes[s];
            ADD(ps_layer_relu(&L[n], c, h, w));
            ADD(ps_layer_maxpool(&L[n], c, h, w));
            h /= 2, w /= 2;
        }
        ADD(ps_layer_flatten(&L[n], c, h, w)); /* refuses c*h*w beyond an int */
        ADD(ps_layer_linear(&L[n], c * h * w, sizes[2]));
        ADD(ps_layer_relu(&L[n], sizes[2], 1, 1));
        ADD(ps_layer_linear(&L[n], sizes[2], m->num_classes));
        snprintf(m->spec, sizeof m->spec, "cnn:%d-%d-%d", sizes[0], sizes[1], sizes[2]);
    } else if (ps_ctr_spec_is(spec)) {
        ps_ctr_spec *cs = &m->ctr;
        if ((rc = ps_ctr_spec_parse(spec, cs, why, why_len)))
            return rc;
        if (m->num_classes != 2) {
            snprintf(why, why_len,
                     "--model %s: a click-through model needs click data (labels 0 and 1): "
                     "--data synthetic-ctr:N or criteo:PATH",
                     spec);
            return PS_EINVAL;
        }
        if ((size_t)cs->dense != in_size) {
            snprintf(why, why_len, "--model %s: dense=%d, but the data has %zu dense features",
                     spec, cs->dense, in_size);
            return PS_EINVAL;
        }
        int width = cs->dense;
        for (int i = 0; i < cs->nbot; width = cs->bot[i++]) {
            ADD(ps_layer_linear(&L[n], width, cs->bot[i]));
            ADD(ps_layer_relu(&L[n], cs->bot[i], 1, 1));
        }
        m->interact = n;
        ADD(ps_layer_interact(&L[n], width, cs->fields, cs->dim, cs->dot));
        width = L[m->interact].out_c;
        for (int i = 0; i < cs->ntop; width = cs->top[i++]) {
            ADD(ps_layer_linear(&L[n], width, cs->top[i]));
            if (i < cs->ntop - 1)
                ADD(ps_layer_relu(&L[n], cs->top[i], 1, 1));
        }
        snprintf(m->spec, sizeof m->spec, "%s", cs->canonical);
    } else {
        snprintf(why, why_len,
                 "--model %s: unknown model; expected mlp:IN-H1-...-OUT (e.g. mlp:784-256-10), "
                 "cnn, cnn:C1-C2-F, or ctr[:KEY=VALUE,...] (e.g. ctr:dim=16,mlp=512-256-1)",
                 spec);
        return PS_EINVAL;
    }
#undef ADD
    m->nlayers = n;
    return 0;
}

/* ---- creation ----------------------------------------------------------- */

static int has_params(const ps_layer *l)
{
    return l->kind == PS_LAYER_LINEAR || l->kind == PS_LAYER_CONV2D;
}

static int alloc_floats(ps_backend *b, size_t n, float **out)
{
    return b->alloc(b, n * sizeof(float), (void **)out);
}

/* Draw every weight on the host from one stream seeded by `seed`, in param
 * order, so the same seed gives the same model everywhere. */
static int init_params(ps_model *m, uint64_t seed)
{
    size_t max = 0;
    for (int p = 0; p < m->nparams; p++)
        if (m->params[p].count > max)
            max = m->params[p].count;
    float *host = malloc(max * sizeof(float));
    if (!host)
        return PS_ENOMEM;
    ps_rng r;
    uint64_t st = seed ^ 0x696e697477656967ull; /* "initweig": not the data streams */
    ps_rng_seed(&r, ps_splitmix64(&st));
    int rc = 0;
    for (int p = 0; p < m->nparams && !rc; p++) {
        ps_param *q = &m->params[p];
        const ps_layer *l = &m->layers[q->layer];
        if (q == l->bias) {
            memset(host, 0, q->count * sizeof(float));
        } else {
            int relu_next =
                q->layer + 1 < m->nlayers && m->layers[q->layer + 1].kind == PS_LAYER_RELU;
            /* He keeps the activation variance through a ReLU; Glorot suits
             * the last (linear) layer feeding the softmax */
            double std = relu_next ? sqrt(2.0 / q->fan_in) : sqrt(2.0 / (q->fan_in + q->fan_out));
            for (size_t i = 0; i < q->count; i++)
                host[i] = (float)(std * ps_rng_normal(&r));
        }
        rc = m->b->copy(m->b, q->w, host, q->count * sizeof(float), 0, PS_STREAM_COMPUTE);
        /* the host buffer is refilled next round: the copy must be done */
        if (!rc)
            rc = m->b->stream_sync(m->b, PS_STREAM_COMPUTE);
    }
    free(host);
    return rc;
}

int ps_model_create(const char *spec, int in_c, int in_h, int in_w, int num_classes,
                    int max_batch, ps_backend *b, uint64_t seed, ps_model **out, char *why,
                    size_t why_len)
{
    *out = NULL;
    if (!spec)
        spec = "";
    if (in_c <= 0 || in_h <= 0 || in_w <= 0 || num_classes <= 0 || max_batch <= 0 || !b ||
        (long long)in_c * in_h * in_w > (1LL << 28)) {
        snprintf(why, why_len,
                 "--model %s: bad input %dx%dx%d, %d classes or batch %d (all must be positive, "
                 "the input at most 2^28 values)",
                 spec, in_c, in_h, in_w, num_classes, max_batch);
        return PS_EINVAL;
    }
    ps_model *m = calloc(1, sizeof *m);
    if (!m || !(m->layers = calloc(MAX_LAYERS, sizeof *m->layers))) {
        free(m);
        snprintf(why, why_len, "--model %s: out of memory", spec);
        return PS_ENOMEM;
    }
    m->b = b;
    m->in_c = in_c, m->in_h = in_h, m->in_w = in_w;
    m->num_classes = num_classes;
    m->max_batch = max_batch;
    int rc = build_layers(m, spec, why, why_len);
    if (!rc && ps_ctr_spec_is(spec) &&
        (!b->emb_bag_fwd || !b->emb_bag_bwd || !b->interact_fwd || !b->interact_bwd ||
         !b->bce_logits)) {
        snprintf(why, why_len,
                 "--model %s: the %s backend has no kernels for the click-through model's "
                 "embeddings, interaction and loss: use --device cpu or cuda:N",
                 spec, b->name);
        rc = PS_EDEVICE;
    }
    if (rc) {
        ps_model_destroy(m);
        return rc;
    }
    int L = m->nlayers;
    for (int i = 0; i < L; i++)
        m->nparams += has_params(&m->layers[i]) ? 2 : 0;
    m->first_param = calloc((size_t)L, sizeof(int));
    m->num_layer_params = calloc((size_t)L, sizeof(int));
    m->params = calloc((size_t)m->nparams, sizeof *m->params);
    m->own_w = calloc((size_t)m->nparams, sizeof(float *));
    m->own_g = calloc((size_t)m->nparams, sizeof(float *));
    m->act = calloc((size_t)L + 1, sizeof(float *));
    m->dact = calloc((size_t)L + 1, sizeof(float *));
    m->own_act = calloc((size_t)L + 1, sizeof(float *));
    m->own_dact = calloc((size_t)L + 1, sizeof(float *));
    if (!m->first_param || !m->num_layer_params || !m->params || !m->own_w || !m->own_g ||
        !m->act || !m->dact || !m->own_act || !m->own_dact) {
        rc = PS_ENOMEM;
        goto fail;
    }

    /* params: weights then bias per layer, key = index */
    for (int i = 0, p = 0; i < L; i++) {
        ps_layer *l = &m->layers[i];
        m->first_param[i] = p;
        if (!has_params(l))
            continue;
        int kk = l->kind == PS_LAYER_CONV2D ? l->k * l->k : 1;
        ps_param *w = &m->params[p], *bias = &m->params[p + 1];
        w->count = ps_layer_weight_count(l);
        bias->count = ps_layer_bias_count(l);
        w->fan_in = bias->fan_in = l->in_c * kk;
        w->fan_out = bias->fan_out = l->out_c * kk;
        for (int j = 0; j < 2; j++) {
            ps_param *q = &m->params[p + j];
            q->key = (uint64_t)(p + j);
            q->layer = i;
            if ((rc = alloc_floats(b, q->count, &m->own_w[p + j])) ||
                (rc = alloc_floats(b, q->count, &m->own_g[p + j])))
                goto fail;
            q->w = m->own_w[p + j];
            q->g = m->own_g[p + j];
            /* a gradient read before the first backward reads zeros */
            if ((rc = b->fill(b, q->g, 0.0f, q->count)))
                goto fail;
        }
        l->weight = w;
        l->bias = bias;
        m->num_layer_params[i] = 2;
        p += 2;
    }

    /* activations; in-place layers alias (never the caller's x at act[0]) */
    for (int i = 0; i < L; i++) {
        ps_layer *l = &m->layers[i];
        if ((rc = ps_layer_alloc(l, b, max_batch)))
            goto fail;
        int inplace = i > 0 && (l->kind == PS_LAYER_RELU || l->kind == PS_LAYER_FLATTEN);
        if (inplace) {
            m->act[i + 1] = m->act[i];
        } else {
            size_t count = (size_t)max_batch * ps_layer_out_size(l);
            if ((rc = alloc_floats(b, count, &m->own_act[i + 1])))
                goto fail;
            m->act[i + 1] = m->own_act[i + 1];
        }
    }
    if ((rc = alloc_floats(b, (size_t)max_batch * ps_layer_out_size(&m->layers[L - 1]),
                           &m->own_dact[L])))
        goto fail;
    m->dact[L] = m->own_dact[L];
    for (int i = L - 1; i >= 1; i--) { /* dact[i] = dx of layer i; layer 0 needs none */
        ps_layer *l = &m->layers[i];
        if (l->kind == PS_LAYER_RELU || l->kind == PS_LAYER_FLATTEN) {
            m->dact[i] = m->dact[i + 1];
        } else {
            if ((rc = alloc_floats(b, (size_t)max_batch * ps_layer_in_size(l), &m->own_dact[i])))
                goto fail;
            m->dact[i] = m->own_dact[i];
        }
    }
    if ((rc = alloc_floats(b, (size_t)max_batch * ps_model_input_size(m), &m->input)) ||
        (rc = b->alloc(b, (size_t)max_batch * sizeof(int32_t), (void **)&m->labels)))
        goto fail;

    if (m->ctr.fields && (rc = ps_ctr_sparse_create(&m->ctr, max_batch, b, &m->sparse)))
        goto fail;
    if ((rc = init_params(m, seed)))
        goto fail;
    *out = m;
    return 0;
fail:
    snprintf(why, why_len, "--model %s: cannot allocate the model on %s: %s", spec, b->name,
             ps_strerror(rc));
    ps_model_destroy(m);
    return rc;
}

void ps_model_destroy(ps_model *m)
{
    if (!m)
        return;
    ps_backend *b = m->b;
    for (int i = 0; i < m->nlayers; i++)
        ps_layer_release(&m->layers[i], b);
    for (int p = 0; p < m->nparams; p++) {
        if (m->own_w && m->own_w[p])
            b->free(b, m->own_w[p]);
        if (m->own_g && m->own_g[p])
            b->free(b, m->own_g[p]);
    }
    for (int i = 0; i <= m->nlayers; i++) {
        if (m->own_act && m->own_act[i])
            b->free(b, m->own_act[i]);
        if (m->own_dact && m->own_dact[i])
            b->free(b, m->own_dact[i]);
    }
    if (m->input)
        b->free(b, m->input);
    if (m->labels)
        b->free(b, m->labels);
    ps_ctr_sparse_destroy(m->sparse);
    free(m->layers);
    free(m->first_param);
    free(m->num_layer_params);
    free(m->params);
    free(m->own_w);
    free(m->own_g);
    free(m->act);
    free(m->dact);
    free(m->own_act);
    free(m->own_dact);
    free(m);
}

/* ---- accessors ---------------------------------------------------------- */

const char *ps_model_spec(const ps_model *m) { return m->spec; }
int ps_model_max_batch(const ps_model *m) { return m->max_batch; }
int ps_model_num_classes(const ps_model *m) { return m->num_classes; }
size_t ps_model_input_size(const ps_model *m) { return (size_t)m->in_c * m->in_h * m->in_w; }
int ps_model_num_layers(const ps_model *m) { return m->nlayers; }
int ps_model_num_params(const ps_model *m) { return m->nparams; }
ps_param *ps_model_params(ps_model *m) { return m->params; }
float *ps_model_input(ps_model *m) { return m->input; }
int32_t *ps_model_labels(ps_model *m) { return m->labels; }
const float *ps_model_logits(const ps_model *m) { return m->act[m->nlayers]; }

const ps_layer *ps_model_layer(const ps_model *m, int layer)
{
    return layer >= 0 && layer < m->nlayers ? &m->layers[layer] : NULL;
}

void ps_model_layer_params(const ps_model *m, int layer, int *first, int *count)
{
    int ok = layer >= 0 && layer < m->nlayers;
    *first = ok ? m->first_param[layer] : 0;
    *count = ok ? m->num_layer_params[layer] : 0;
}

size_t ps_model_param_floats(const ps_model *m)
{
    size_t n = 0;
    for (int p = 0; p < m->nparams; p++)
        n += m->params[p].count;
    return n;
}

/* ---- passes ------------------------------------------------------------- */

int ps_model_load_batch(ps_model *m, const float *host_x, const int32_t *host_labels, int n)
{
    if (n <= 0 || n > m->max_batch)
        return PS_EINVAL;
    ps_backend *b = m->b;
    int rc = b->copy(b, m->input, host_x, (size_t)n * ps_model_input_size(m) * sizeof(float), 0,
                     PS_STREAM_COMPUTE);
    if (!rc && host_labels)
        rc = b->copy(b, m->labels, host_labels, (size_t)n * sizeof(int32_t), 0,
                     PS_STREAM_COMPUTE);
    return rc;
}

static int forward(ps_model *m, const float *x, const int32_t *labels, int n,
                   const ps_model_hooks *hooks, float *loss, int *correct, int defer)
{
    m->have_grad = 0;
    if (n <= 0 || n > m->max_batch || !x)
        return PS_EINVAL;
    m->x = x;
    m->n = n;
    int rc;
    /* the tables' side first: the interact layer reads the pooled rows */
    if (m->sparse &&
        (rc = ps_ctr_sparse_forward(m->b, m->sparse, n, m->layers[m->interact].emb)))
        return rc;
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer *l = &m->layers[i];
        if (m->num_layer_params[i] && hooks && hooks->before_layer &&
            (rc = hooks->before_layer(hooks->ctx, i, m->first_param[i], m->num_layer_params[i])))
            return rc;
        if ((rc = ps_layer_forward(m->b, l, i ? m->act[i] : x, m->act[i + 1], n)))
            return rc;
    }
    if (!labels)
        return 0;
    if (m->sparse)
        rc = ps_loss_bce_logits(m->b, m->act[m->nlayers], labels, n, m->dact[m->nlayers], loss,
                                correct);
    else if (defer)
        rc = ps_loss_softmax_xent_async(m->b, m->act[m->nlayers], labels, n, m->num_classes,
                                        m->dact[m->nlayers], loss, correct);
    else
        rc = ps_loss_softmax_xent(m->b, m->act[m->nlayers], labels, n, m->num_classes,
                                  m->dact[m->nlayers], loss, correct);
    m->have_grad = rc == 0;
    return rc;
}

int ps_model_forward(ps_model *m, const float *x, const int32_t *labels, int n,
                     const ps_model_hooks *hooks, float *loss, int *correct)
{
    return forward(m, x, labels, n, hooks, loss, correct, 0);
}

int ps_model_forward_deferred(ps_model *m, const float *x, const int32_t *labels, int n,
                              const ps_model_hooks *hooks, float *loss, int *correct)
{
    return forward(m, x, labels, n, hooks, loss, correct, 1);
}

/* Whether backward runs bottom_up: every layer with parameters is linear
 * (the MLPs). */
static int linear_params_only(const ps_model *m)
{
    if (m->sparse)
        return 0;
    for (int i = 0; i < m->nlayers; i++)
        if (m->num_layer_params[i] && m->layers[i].kind != PS_LAYER_LINEAR)
            return 0;
    return 1;
}

/* The MLPs' backward: the input gradients down the chain first (the
 * linear layers' dx, the ReLUs'), then the parameter gradients in the order
 * the next forward needs their new weights, first layer first, each handed
 * on as it is done.  The first layer's gradient (the largest: 784x256 of
 * 235 k parameters in 784-256-128-10) was the last one backward produced
 * while its new weights are the first ones forward waits for; now it leaves
 * first, ahead of the smaller layers' on the wire and in the servers' queue,
 * and their gradients are computed while it is on its way.  The same kernels
 * on the same buffers as the layer-by-layer order (no layer below a linear
 * one writes that layer's dy or reads its weights' new values), so the same
 * bits. */
static int bottom_up(ps_model *m, const ps_model_hooks *hooks)
{
    for (int i = m->nlayers - 1; i >= 1; i--) { /* the first layer's dx is not needed */
        int rc = ps_layer_backward_input(m->b, &m->layers[i], m->act[i], m->act[i + 1],
                                         m->dact[i + 1], m->dact[i], m->n);
        if (rc)
            return rc;
    }
    for (int i = 0; i < m->nlayers; i++) {
        if (!m->num_layer_params[i])
            continue;
        int rc = ps_layer_backward_params(m->b, &m->layers[i], i ? m->act[i] : m->x,
                                          m->dact[i + 1], m->n);
        if (!rc && hooks && hooks->grad_ready)
            rc = hooks->grad_ready(hooks->ctx, i, m->first_param[i], m->num_layer_params[i]);
        if (rc)
            return rc;
    }
    return 0;
}

int ps_model_backward(ps_model *m, const ps_model_hooks *hooks)
{
    if (!m->have_grad)
        return PS_ESTATE;
    if (linear_params_only(m))
        return bottom_up(m, hooks);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        ps_layer *l = &m->layers[i];
        int rc = ps_layer_backward(m->b, l, i ? m->act[i] : m->x, m->act[i + 1], m->dact[i + 1],
                                   i ? m->dact[i] : NULL, m->n);
        /* the rows' gradients as soon as they exist, before the bottom MLP's */
        if (!rc && m->sparse && i == m->interact)
            rc = ps_ctr_sparse_backward(m->b, m->sparse, l->demb);
        if (rc)
            return rc;
        if (m->num_layer_params[i] && hooks && hooks->grad_ready &&
            (rc = hooks->grad_ready(hooks->ctx, i, m->first_param[i], m->num_layer_params[i])))
            return rc;
    }
    return 0;
}

int ps_model_sgd_step(ps_model *m, float lr)
{
    for (int p = 0; p < m->nparams; p++) {
        ps_param *q = &m->params[p];
        int rc = m->b->axpy(m->b, q->w, -lr, q->g, q->count);
        if (rc)
            return rc;
    }
    return 0;
}

int ps_model_evaluate(ps_model *m, const ps_dataset *ds, double *accuracy, double *mean_loss,
                      char *why, size_t why_len)
{
    if (m->sparse) {
        snprintf(why, why_len, "evaluate: %s is a click-through model: ps_model_evaluate_ctr",
                 m->spec);
        return PS_EINVAL;
    }
    if (ds->channels != m->in_c || ds->height != m->in_h || ds->width != m->in_w ||
        ds->num_classes > m->num_classes || ds->count == 0) {
        snprintf(why, why_len,
                 "evaluate: %s (%zu samples of %dx%dx%d, %d classes) does not fit the model "
                 "(%dx%dx%d, %d classes)",
                 ds->name, ds->count, ds->channels, ds->height, ds->width, ds->num_classes,
                 m->in_c, m->in_h, m->in_w, m->num_classes);
        return PS_EINVAL;
    }
    size_t ss = ps_dataset_sample_size(ds);
    double loss_sum = 0.0;
    size_t hits = 0;
    for (size_t i = 0; i < ds->count; i += (size_t)m->max_batch) {
        int n = ds->count - i < (size_t)m->max_batch ? (int)(ds->count - i) : m->max_batch;
        float loss;
        int correct;
        int rc = ps_model_load_batch(m, ds->images + i * ss, ds->labels + i, n);
        if (!rc)
            rc = ps_model_forward(m, m->input, m->labels, n, NULL, &loss, &correct);
        if (rc) {
            snprintf(why, why_len, "evaluate: batch at sample %zu failed: %s", i,
                     ps_strerror(rc));
            return rc;
        }
        loss_sum += (double)loss * n;
        hits += (size_t)correct;
    }
    /* evaluation leaves no gradient to apply */
    m->have_grad = 0;
    if (accuracy)
        *accuracy = (double)hits / (double)ds->count;
    if (mean_loss)
        *mean_loss = loss_sum / (double)ds->count;
    return 0;
}

/* ---- the click-through model's tables ------------------------------------ */

int ps_model_num_tables(const ps_model *m) { return m->sparse ? m->ctr.fields : 0; }
int ps_model_table_dim(const ps_model *m) { return m->sparse ? m->ctr.dim : 0; }
const ps_ctr_spec *ps_model_ctr_spec(const ps_model *m) { return m->sparse ? &m->ctr : NULL; }
ps_ctr_sparse *ps_model_sparse(ps_model *m) { return m->sparse; }

int ps_model_set_ids(ps_model *m, const uint64_t *ids, int n)
{
    return m->sparse ? ps_ctr_sparse_set_ids(m->sparse, ids, n) : PS_EINVAL;
}

int ps_model_fetch_rows(ps_model *m, ps_row_source *src)
{
    return m->sparse ? ps_ctr_sparse_fetch(m->sparse, src) : PS_EINVAL;
}

int ps_model_push_rows(ps_model *m, ps_row_source *src, int64_t step)
{
    return m->sparse ? ps_ctr_sparse_push(m->sparse, src, step) : PS_EINVAL;
}

int ps_model_ahead_ids(ps_model *m, ps_row_source *src, const uint64_t *ids, int n)
{
    return m->sparse ? ps_ctr_sparse_ahead(m->sparse, src, ids, n) : PS_EINVAL;
}

int ps_model_take_rows(ps_model *m, ps_row_source *src, int n)
{
    return m->sparse ? ps_ctr_sparse_take(m->sparse, src, n) : PS_EINVAL;
}

int ps_model_evaluate_ctr(ps_model *m, const ps_dataset *ds, ps_row_source *src, double *auc,
                          double *mean_loss, uint64_t *scores_fp, char *why, size_t why_len)
{
    size_t ss = ps_dataset_sample_size(ds);
    if (!m->sparse || ds->num_fields != m->ctr.fields || ss != (size_t)m->ctr.dense ||
        ds->count == 0) {
        snprintf(why, why_len,
                 "evaluate: %s (%zu samples of %zu dense features and %d fields) does not fit "
                 "the model %s",
                 ds->name, ds->count, ss, ds->num_fields, m->spec);
        return PS_EINVAL;
    }
    float *scores = malloc(ds->count * sizeof *scores);
    if (!scores) {
        snprintf(why, why_len, "evaluate: out of memory for %zu scores", ds->count);
        return PS_ENOMEM;
    }
    double loss_sum = 0.0;
    int rc = 0;
    size_t i;
    for (i = 0; i < ds->count; i += (size_t)m->max_batch) {
        int n = ds->count - i < (size_t)m->max_batch ? (int)(ds->count - i) : m->max_batch;
        float loss = 0;
        if ((rc = ps_model_load_batch(m, ds->images + i * ss, ds->labels + i, n)) ||
            (rc = ps_model_set_ids(m, ds->ids + i * (size_t)ds->num_fields, n)) ||
            (rc = ps_model_fetch_rows(m, src)) ||
            (rc = ps_model_forward(m, m->input, m->labels, n, NULL, &loss, NULL)) ||
            (rc = m->b->copy(m->b, scores + i, ps_model_logits(m), (size_t)n * sizeof(float), 1,
                             PS_STREAM_COMPUTE)) ||
            (rc = m->b->stream_sync(m->b, PS_STREAM_COMPUTE)))
            break;
        loss_sum += (double)loss * n;
    }
    m->have_grad = 0; /* evaluation leaves no gradient to apply */
    if (rc) {
        snprintf(why, why_len, "evaluate: batch at sample %zu failed: %s", i, ps_strerror(rc));
    } else if ((rc = ps_auc(scores, ds->labels, ds->count, auc)) == PS_EDATA) {
        snprintf(why, why_len, "evaluate: the model's scores are NaN: training diverged (a lower "
                               "--lr or lr= of the tables may help)");
    } else if (rc) {
        snprintf(why, why_len, "evaluate: no AUC on %s: %s", ds->name,
                 rc == PS_EINVAL ? "its labels are all of one class" : ps_strerror(rc));
    } else {
        if (mean_loss)
            *mean_loss = loss_sum / (double)ds->count;
        if (scores_fp)
            *scores_fp = ps_fnv1a(PS_FNV1A_BASIS, scores, ds->count * sizeof *scores);
    }
    free(scores);
    return rc;
}

/* ---- save / load -------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static uint32_t crc_of(const unsigned char *p, size_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)crc;
}

/* Header size for a spec of spec_len bytes and nparams params. */
static size_t header_size(size_t spec_len, size_t nparams)
{
    return 8 + 4 + 4 + spec_len + 4 + 8 * nparams;
}

/* A click-through model's tables are not in its param array: a file of
 * the params alone would restore a model without its embeddings. */
static int refuse_tables(const ps_model *m, const char *what, const char *path, char *why,
                         size_t why_len)
{
    if (!m->sparse)
        return 0;
    snprintf(why, why_len,
             "%s %s: %s keeps its embedding tables outside the model file, which cannot hold "
             "them yet",
             what, path, m->spec);
    return PS_EINVAL;
}

int ps_model_save(ps_model *m, const char *path, char *why, size_t why_len)
{
    if (refuse_tables(m, "save", path, why, why_len))
        return PS_EINVAL;
    size_t spec_len = strlen(m->spec), hdr = header_size(spec_len, (size_t)m->nparams);
    size_t total = hdr + 4 * ps_model_param_floats(m) + 4;
    unsigned char *buf = malloc(total);
    float *host = malloc(ps_model_param_floats(m) * sizeof(float) + 1);
    if (!buf || !host) {
        free(buf);
        free(host);
        snprintf(why, why_len, "save %s: out of memory", path);
        return PS_ENOMEM;
    }
    memcpy(buf, FILE_MAGIC, 8);
    put_u32(buf + 8, FILE_VERSION);
    put_u32(buf + 12, (uint32_t)spec_len);
    memcpy(buf + 16, m->spec, spec_len);
    put_u32(buf + 16 + spec_len, (uint32_t)m->nparams);
    unsigned char *p = buf + 20 + spec_len;
    for (int i = 0; i < m->nparams; i++, p += 8)
        put_u64(p, m->params[i].count);
    int rc = 0;
    size_t off = 0;
    for (int i = 0; i < m->nparams && !rc; i++) {
        rc = m->b->copy(m->b, host + off, m->params[i].w, m->params[i].count * sizeof(float), 1,
                        PS_STREAM_COMPUTE);
        off += m->params[i].count;
    }
    if (!rc)
        rc = m->b->stream_sync(m->b, PS_STREAM_COMPUTE);
    if (rc) {
        free(buf);
        free(host);
        snprintf(why, why_len, "save %s: reading the weights from %s failed: %s", path,
                 m->b->name, ps_strerror(rc));
        return rc;
    }
    /* little-endian on disk whatever the host */
    for (size_t i = 0; i < off; i++, p += 4) {
        uint32_t u;
        memcpy(&u, &host[i], 4);
        put_u32(p, u);
    }
    free(host);
    put_u32(p, crc_of(buf, total - 4));

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(buf, 1, total, f) == total && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        err = errno;
    }
    free(buf);
    if (!ok) {
        if (f)
            unlink(tmp);
        snprintf(why, why_len, "save %s: %s", path, strerror(err));
        return PS_EIO;
    }
    return 0;
}

int ps_model_load(ps_model *m, const char *path, char *why, size_t why_len)
{
    if (refuse_tables(m, "load", path, why, why_len))
        return PS_EINVAL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_len, "load %s: cannot open: %s", path, strerror(errno));
        return PS_EIO;
    }
    /* Read it all: a model file is at most the model's size (checked below),
     * and whole-file reads make every later bound check a plain compare. */
    size_t expect = header_size(strlen(m->spec), (size_t)m->nparams) +
                    4 * ps_model_param_floats(m) + 4;
    size_t cap = expect + FILE_MAX_SPEC + 8 * 4096 + 1, size = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        snprintf(why, why_len, "load %s: out of memory", path);
        return PS_ENOMEM;
    }
    size = fread(buf, 1, cap, f);
    int read_err = ferror(f);
    fclose(f);
    int rc = PS_EDATA;
    if (read_err) {
        snprintf(why, why_len, "load %s: read error", path);
        rc = PS_EIO;
        goto out;
    }
    if (size < 16 || memcmp(buf, FILE_MAGIC, 8) != 0) {
        snprintf(why, why_len, "load %s: not a model file (bad magic)", path);
        goto out;
    }
    uint32_t version = get_u32(buf + 8), spec_len = get_u32(buf + 12);
    if (version != FILE_VERSION) {
        snprintf(why, why_len, "load %s: file format version %u, this build reads version %u",
                 path, version, FILE_VERSION);
        goto out;
    }
    if (spec_len > FILE_MAX_SPEC || size < 20 + (size_t)spec_len) {
        snprintf(why, why_len, "load %s: truncated or corrupt header", path);
        goto out;
    }
    uint32_t nparams = get_u32(buf + 16 + spec_len);
    size_t hdr = header_size(spec_len, nparams);
    if (nparams > 4096 || size < hdr) {
        snprintf(why, why_len, "load %s: truncated or corrupt header", path);
        goto out;
    }
    /* counts first, with an overflow guard, to know the size the file claims */
    size_t floats = 0;
    for (uint32_t i = 0; i < nparams; i++) {
        uint64_t c = get_u64(buf + 20 + spec_len + 8 * (size_t)i);
        if (c > (1ull << 40) || floats + c < floats) {
            snprintf(why, why_len, "load %s: corrupt header (param %u count %llu)", path, i,
                     (unsigned long long)c);
            goto out;
        }
        floats += (size_t)c;
    }
    if (floats > (SIZE_MAX - hdr - 4) / 4 || size != hdr + 4 * floats + 4) {
        if (size == cap) /* read stopped at our cap: far too big for this model */
            snprintf(why, why_len,
                     "load %s: holds a different model (larger than %s, %zu parameters)", path,
                     m->spec, ps_model_param_floats(m));
        else
            snprintf(why, why_len,
                     "load %s: truncated or corrupt: %zu bytes, the header implies %zu", path,
                     size, floats <= (SIZE_MAX - hdr - 4) / 4 ? hdr + 4 * floats + 4 : 0);
        goto out;
    }
    if (crc_of(buf, size - 4) != get_u32(buf + size - 4)) {
        snprintf(why, why_len, "load %s: checksum mismatch: the file is corrupt", path);
        goto out;
    }
    rc = PS_EMISMATCH;
    if (spec_len != strlen(m->spec) || memcmp(buf + 16, m->spec, spec_len) != 0) {
        snprintf(why, why_len, "load %s: holds a model for --model %.*s, this one is %s", path,
                 (int)spec_len, (const char *)(buf + 16), m->spec);
        goto out;
    }
    if (nparams != (uint32_t)m->nparams) {
        snprintf(why, why_len, "load %s: holds %u parameter tensors, %s has %d", path, nparams,
                 m->spec, m->nparams);
        goto out;
    }
    for (uint32_t i = 0; i < nparams; i++) {
        uint64_t c = get_u64(buf + 20 + spec_len + 8 * (size_t)i);
        if (c != m->params[i].count) {
            snprintf(why, why_len,
                     "load %s: parameter %u has %llu values, %s expects %zu (different input "
                     "shape or classes?)",
                     path, i, (unsigned long long)c, m->spec, m->params[i].count);
            goto out;
        }
    }
    /* decode in place: each 4-byte little-endian word becomes a host float */
    unsigned char *p = buf + hdr;
    for (size_t i = 0; i < floats; i++) {
        uint32_t u = get_u32(p + 4 * i);
        memcpy(p + 4 * i, &u, 4);
    }
    rc = 0;
    for (int i = 0; i < m->nparams && !rc; i++) {
        rc = m->b->copy(m->b, m->params[i].w, p, m->params[i].count * sizeof(float), 0,
                        PS_STREAM_COMPUTE);
        p += m->params[i].count * sizeof(float);
    }
    if (!rc)
        rc = m->b->stream_sync(m->b, PS_STREAM_COMPUTE);
    if (rc)
        snprintf(why, why_len, "load %s: copying to %s failed: %s", path, m->b->name,
                 ps_strerror(rc));
out:
    free(buf);
    return rc;
}
