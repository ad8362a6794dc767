#include "layers.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ps_error.h"

/* Every size handed to the backend is an int (gemm dimensions), so shapes are
 * refused at set-up when a per-sample product would not fit one. */
static int prod_fits(long long a, long long b, long long c)
{
    return a > 0 && b > 0 && c > 0 && a <= INT_MAX && b <= INT_MAX / a &&
           c <= INT_MAX / (a * b);
}

static void set_shape(ps_layer *l, ps_layer_kind kind, int in_c, int in_h, int in_w, int out_c,
                      int out_h, int out_w)
{
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->in_c = in_c;
    l->in_h = in_h;
    l->in_w = in_w;
    l->out_c = out_c;
    l->out_h = out_h;
    l->out_w = out_w;
}

int ps_layer_linear(ps_layer *l, int in, int out)
{
    if (!prod_fits(in, out, 1))
        return PS_EINVAL;
    set_shape(l, PS_LAYER_LINEAR, in, 1, 1, out, 1, 1);
    return 0;
}

int ps_layer_relu(ps_layer *l, int c, int h, int w)
{
    if (!prod_fits(c, h, w))
        return PS_EINVAL;
    set_shape(l, PS_LAYER_RELU, c, h, w, c, h, w);
    return 0;
}

int ps_layer_conv2d(ps_layer *l, int in_c, int h, int w, int out_c, int k)
{
    if (k <= 0 || k % 2 == 0 || !prod_fits(in_c, h, w) || !prod_fits(out_c, h, w) ||
        !prod_fits(in_c, k, k) || !prod_fits((long long)in_c * k * k, h, w) ||
        !prod_fits(out_c, (long long)in_c * k, k))
        return PS_EINVAL;
    set_shape(l, PS_LAYER_CONV2D, in_c, h, w, out_c, h, w);
    l->k = k;
    l->pad = k / 2; /* odd k with pad k/2 keeps H x W ('same') at stride 1 */
    return 0;
}

int ps_layer_maxpool(ps_layer *l, int c, int h, int w)
{
    if (!prod_fits(c, h, w) || h % 2 || w % 2)
        return PS_EINVAL;
    set_shape(l, PS_LAYER_MAXPOOL, c, h, w, c, h / 2, w / 2);
    return 0;
}

int ps_layer_flatten(ps_layer *l, int c, int h, int w)
{
    if (!prod_fits(c, h, w))
        return PS_EINVAL;
    set_shape(l, PS_LAYER_FLATTEN, c, h, w, c * h * w, 1, 1);
    return 0;
}

int ps_layer_interact(ps_layer *l, int in, int fields, int dim, int dot)
{
    if (!prod_fits(in, 1, 1) || !prod_fits(fields, dim, 1) || (dot && in != dim))
        return PS_EINVAL;
    long long out = dot ? (long long)in + ((long long)fields + 1) * fields / 2
                        : (long long)in + (long long)fields * dim;
    if (out > INT_MAX)
        return PS_EINVAL;
    set_shape(l, PS_LAYER_INTERACT, in, 1, 1, (int)out, 1, 1);
    l->fields = fields;
    l->dim = dim;
    l->dot = dot;
    return 0;
}

size_t ps_layer_in_size(const ps_layer *l)
{
    return (size_t)l->in_c * l->in_h * l->in_w;
}

size_t ps_layer_out_size(const ps_layer *l)
{
    return (size_t)l->out_c * l->out_h * l->out_w;
}

size_t ps_layer_weight_count(const ps_layer *l)
{
    switch (l->kind) {
    case PS_LAYER_LINEAR: return (size_t)l->out_c * l->in_c;
    case PS_LAYER_CONV2D: return (size_t)l->out_c * l->in_c * l->k * l->k;
    default: return 0;
    }
}

size_t ps_layer_bias_count(const ps_layer *l)
{
    return (l->kind == PS_LAYER_LINEAR || l->kind == PS_LAYER_CONV2D) ? (size_t)l->out_c : 0;
}

void ps_layer_describe(const ps_layer *l, char *buf, size_t len)
{
    switch (l->kind) {
    case PS_LAYER_LINEAR: snprintf(buf, len, "linear %d->%d", l->in_c, l->out_c); break;
    case PS_LAYER_RELU: snprintf(buf, len, "relu %zu", ps_layer_in_size(l)); break;
    case PS_LAYER_CONV2D:
        snprintf(buf, len, "conv%dx%d %dx%dx%d->%dx%dx%d", l->k, l->k, l->in_c, l->in_h, l->in_w,
                 l->out_c, l->out_h, l->out_w);
        break;
    case PS_LAYER_MAXPOOL:
        snprintf(buf, len, "maxpool2 %dx%dx%d->%dx%dx%d", l->in_c, l->in_h, l->in_w, l->out_c,
                 l->out_h, l->out_w);
        break;
    case PS_LAYER_FLATTEN:
        snprintf(buf, len, "flatten %dx%dx%d->%d", l->in_c, l->in_h, l->in_w, l->out_c);
        break;
    case PS_LAYER_INTERACT:
        snprintf(buf, len, "interact %s %d+%dx%d->%d", l->dot ? "dot" : "cat", l->in_c, l->fields,
                 l->dim, l->out_c);
        break;
    default: snprintf(buf, len, "unknown layer %d", (int)l->kind); break;
    }
}

/* Whether the backend does a whole batch's convolution (or pooling) in one
 * call; the layer then needs no im2col columns (no argmax). */
static int batch_conv(const ps_backend *b)
{
    return b->conv_fwd && b->conv_bwd_data && b->conv_bwd_filter;
}

static int batch_pool(const ps_backend *b)
{
    return b->pool_fwd && b->pool_bwd;
}

int ps_layer_alloc(ps_layer *l, ps_backend *b, int max_batch)
{
    if (max_batch <= 0)
        return PS_EINVAL;
    ps_layer_release(l, b);
    l->max_batch = max_batch;
    int rc = 0;
    if (l->kind == PS_LAYER_CONV2D && !batch_conv(b)) {
        size_t n = (size_t)l->in_c * l->k * l->k * l->out_h * l->out_w;
        rc = b->alloc(b, n * sizeof(float), (void **)&l->col);
    } else if (l->kind == PS_LAYER_MAXPOOL && !batch_pool(b)) {
        size_t n = (size_t)max_batch * ps_layer_out_size(l);
        rc = b->alloc(b, n, (void **)&l->argmax);
    } else if (l->kind == PS_LAYER_INTERACT) {
        size_t n = (size_t)max_batch * l->fields * l->dim * sizeof(float);
        rc = b->alloc(b, n, (void **)&l->emb);
        if (!rc)
            rc = b->alloc(b, n, (void **)&l->demb);
    }
    if (rc)
        ps_layer_release(l, b);
    return rc;
}

void ps_layer_release(ps_layer *l, ps_backend *b)
{
    if (l->col)
        b->free(b, l->col);
    if (l->argmax)
        b->free(b, l->argmax);
    if (l->emb)
        b->free(b, l->emb);
    if (l->demb)
        b->free(b, l->demb);
    l->col = NULL;
    l->argmax = NULL;
    l->emb = l->demb = NULL;
    l->max_batch = 0;
}

static int has_params(const ps_layer *l)
{
    return l->kind == PS_LAYER_LINEAR || l->kind == PS_LAYER_CONV2D;
}

static int check_call(const ps_layer *l, int n)
{
    if (n <= 0 || n > l->max_batch)
        return PS_EINVAL;
    if (has_params(l) && (!l->weight || !l->bias || !l->weight->w || !l->bias->w))
        return PS_ESTATE;
    if (l->kind == PS_LAYER_INTERACT && !l->emb)
        return PS_ESTATE;
    return 0;
}

/* Return on the first backend error: later kernels would read garbage. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

static ps_conv_shape conv_shape_of(const ps_layer *l, int n)
{
    ps_conv_shape s = {n, l->in_c, l->in_h, l->in_w, l->out_c, l->k, l->pad};
    return s;
}

static int conv_forward(ps_backend *b, ps_layer *l, const float *x, float *y, int n)
{
    int ckk = l->in_c * l->k * l->k, hw = l->out_h * l->out_w;
    size_t in_sz = ps_layer_in_size(l), out_sz = ps_layer_out_size(l);
    const float *w = l->weight->w;
    if (batch_conv(b)) {
        ps_conv_shape s = conv_shape_of(l, n);
        TRY(b->conv_fwd(b, &s, x, w, y));
        return b->bias_add(b, y, l->bias->w, n, l->out_c, hw);
    }
    if (!l->col) /* allocated for a backend with whole-batch convolutions */
        return PS_ESTATE;
    /* One im2col + gemm per image keeps the scratch at one image's columns;
     * images run in order on the compute stream, so the buffer is reused. */
    for (int i = 0; i < n; i++) {
        TRY(b->im2col(b, x + i * in_sz, l->in_c, l->in_h, l->in_w, l->k, l->pad, l->col));
        TRY(b->gemm(b, 0, 0, l->out_c, hw, ckk, 1.0f, w, ckk, l->col, hw, 0.0f, y + i * out_sz,
                    hw));
    }
    return b->bias_add(b, y, l->bias->w, n, l->out_c, hw);
}

static int conv_backward(ps_backend *b, ps_layer *l, const float *x, const float *dy, float *dx,
                         int n)
{
    int ckk = l->in_c * l->k * l->k, hw = l->out_h * l->out_w;
    size_t in_sz = ps_layer_in_size(l), out_sz = ps_layer_out_size(l);
    const float *w = l->weight->w;
    float *dw = l->weight->g;
    TRY(b->bias_grad(b, l->bias->g, dy, n, l->out_c, hw));
    if (batch_conv(b)) {
        ps_conv_shape s = conv_shape_of(l, n);
        TRY(b->conv_bwd_filter(b, &s, x, dy, dw));
        return dx ? b->conv_bwd_data(b, &s, w, dy, dx) : 0;
    }
    if (!l->col)
        return PS_ESTATE;
    for (int i = 0; i < n; i++) {
        const float *dyi = dy + i * out_sz;
        TRY(b->im2col(b, x + i * in_sz, l->in_c, l->in_h, l->in_w, l->k, l->pad, l->col));
        /* dW (+)= dy_i col_i^T; the first image overwrites, so no zeroing pass */
        TRY(b->gemm(b, 0, 1, l->out_c, ckk, hw, 1.0f, dyi, hw, l->col, hw, i ? 1.0f : 0.0f, dw,
                    ckk));
        if (dx) {
            /* dcol = W^T dy_i reuses the column buffer: the dW gemm above is
             * ordered before it on the same stream */
            TRY(b->gemm(b, 1, 0, ckk, hw, l->out_c, 1.0f, w, ckk, dyi, hw, 0.0f, l->col, hw));
            TRY(b->col2im(b, l->col, l->in_c, l->in_h, l->in_w, l->k, l->pad, dx + i * in_sz));
        }
    }
    return 0;
}

/* The backend's kernels (ps_backend.h); a backend without them is refused. */
static int interact_forward(ps_backend *b, const ps_layer *l, const float *x, float *y, int n)
{
    if (!b->interact_fwd)
        return PS_EDEVICE;
    return b->interact_fwd(b, x, l->emb, n, l->in_c, l->fields, l->dim, l->dot, y);
}

static int interact_backward(ps_backend *b, const ps_layer *l, const float *x, const float *dy,
                             float *dx, int n)
{
    if (!b->interact_bwd)
        return PS_EDEVICE;
    return b->interact_bwd(b, x, l->emb, dy, n, l->in_c, l->fields, l->dim, l->dot, dx, l->demb);
}

int ps_layer_forward(ps_backend *b, ps_layer *l, const float *x, float *y, int n)
{
    TRY(check_call(l, n));
    size_t total_in = (size_t)n * ps_layer_in_size(l);
    switch (l->kind) {
    case PS_LAYER_LINEAR:
        /* y[n, out] = x[n, in] W[out, in]^T */
        TRY(b->gemm(b, 0, 1, n, l->out_c, l->in_c, 1.0f, x, l->in_c, l->weight->w, l->in_c, 0.0f,
                    y, l->out_c));
        return b->bias_add(b, y, l->bias->w, n, l->out_c, 1);
    case PS_LAYER_RELU: return b->relu_fwd(b, y, x, total_in);
    case PS_LAYER_CONV2D: return conv_forward(b, l, x, y, n);
    case PS_LAYER_MAXPOOL:
        if (batch_pool(b))
            return b->pool_fwd(b, x, n * l->in_c, l->in_h, l->in_w, y);
        if (!l->argmax)
            return PS_ESTATE;
        return b->maxpool_fwd(b, x, n * l->in_c, l->in_h, l->in_w, y, l->argmax);
    case PS_LAYER_FLATTEN:
        /* NCHW is already N x (C*H*W) in memory */
        if (y == x)
            return 0;
        return b->copy(b, y, x, total_in * sizeof(float), 2, PS_STREAM_COMPUTE);
    case PS_LAYER_INTERACT: return interact_forward(b, l, x, y, n);
    }
    return PS_EINVAL;
}

/* dW[out, in] = dy[n, out]^T x[n, in];  db = column sums of dy */
static int linear_params(ps_backend *b, ps_layer *l, const float *x, const float *dy, int n)
{
    TRY(b->gemm(b, 1, 0, l->out_c, l->in_c, n, 1.0f, dy, l->out_c, x, l->in_c, 0.0f,
                l->weight->g, l->in_c));
    return b->bias_grad(b, l->bias->g, dy, n, l->out_c, 1);
}

/* dx[n, in] = dy[n, out] W[out, in] */
static int linear_input(ps_backend *b, ps_layer *l, const float *dy, float *dx, int n)
{
    return b->gemm(b, 0, 0, n, l->in_c, l->out_c, 1.0f, dy, l->out_c, l->weight->w, l->in_c,
                   0.0f, dx, l->in_c);
}

int ps_layer_backward_input(ps_backend *b, ps_layer *l, const float *x, const float *y,
                            const float *dy, float *dx, int n)
{
    if (l->kind != PS_LAYER_LINEAR)
        return ps_layer_backward(b, l, x, y, dy, dx, n);
    TRY(check_call(l, n));
    return dx ? linear_input(b, l, dy, dx, n) : 0;
}

int ps_layer_backward_params(ps_backend *b, ps_layer *l, const float *x, const float *dy, int n)
{
    TRY(check_call(l, n));
    if (l->kind != PS_LAYER_LINEAR)
        return PS_EINVAL;
    if (!l->weight->g || !l->bias->g)
        return PS_ESTATE;
    return linear_params(b, l, x, dy, n);
}

int ps_layer_backward(ps_backend *b, ps_layer *l, const float *x, const float *y, const float *dy,
                      float *dx, int n)
{
    TRY(check_call(l, n));
    if (has_params(l) && (!l->weight->g || !l->bias->g))
        return PS_ESTATE;
    size_t total_in = (size_t)n * ps_layer_in_size(l);
    switch (l->kind) {
    case PS_LAYER_LINEAR:
        TRY(linear_params(b, l, x, dy, n));
        return dx ? linear_input(b, l, dy, dx, n) : 0;
    case PS_LAYER_RELU:
        /* y > 0 exactly where x > 0, and y survives an in-place forward */
        return dx ? b->relu_bwd(b, dx, dy, y, total_in) : 0;
    case PS_LAYER_CONV2D: return conv_backward(b, l, x, dy, dx, n);
    case PS_LAYER_MAXPOOL:
        if (!dx)
            return 0;
        if (batch_pool(b))
            return b->pool_bwd(b, x, y, dy, n * l->in_c, l->in_h, l->in_w, dx);
        if (!l->argmax)
            return PS_ESTATE;
        return b->maxpool_bwd(b, dy, l->argmax, n * l->in_c, l->in_h, l->in_w, dx);
    case PS_LAYER_FLATTEN:
        if (!dx || dx == dy)
            return 0;
        return b->copy(b, dx, dy, total_in * sizeof(float), 2, PS_STREAM_COMPUTE);
    case PS_LAYER_INTERACT: return interact_backward(b, l, x, dy, dx, n);
    }
    return PS_EINVAL;
}

int ps_loss_softmax_xent(ps_backend *b, const float *logits, const int32_t *labels, int n,
                         int classes, float *dlogits, float *loss, int *correct)
{
    if (n <= 0 || classes <= 0)
        return PS_EINVAL;
    return b->softmax_xent(b, logits, labels, n, classes, dlogits, loss, correct);
}

int ps_loss_softmax_xent_async(ps_backend *b, const float *logits, const int32_t *labels, int n,
                               int classes, float *dlogits, float *loss, int *correct)
{
    if (n <= 0 || classes <= 0)
        return PS_EINVAL;
    /* without an asynchronous form the results are there on return, which
     * is as early as the contract asks */
    if (!b->softmax_xent_async)
        return b->softmax_xent(b, logits, labels, n, classes, dlogits, loss, correct);
    return b->softmax_xent_async(b, logits, labels, n, classes, dlogits, loss, correct);
}

int ps_loss_bce_logits(ps_backend *b, const float *logits, const int32_t *labels, int n,
                       float *dlogits, float *loss, int *correct)
{
    if (!b->bce_logits)
        return PS_EDEVICE;
    if (n <= 0)
        return PS_EINVAL;
    return b->bce_logits(b, logits, labels, n, dlogits, loss, correct);
}
