/* Layers: forward and backward written only against the backend interface
 * (backend.h), so the same code runs on the CPU and on CUDA.
 *
 * Tensors are float32, row-major, images NCHW, batch first.  A layer maps an
 * input of n samples x in_size floats to n x out_size floats (per-sample sizes
 * below).  All tensor pointers passed to forward/backward are device memory of
 * the backend; nothing here copies to the host or waits for the device.
 *
 * Parameters live in ps_param records owned by the caller (the model).  A
 * layer keeps a POINTER to its ps_param records, never to the weight memory:
 * forward and backward read param->w and write param->g at call time, so the
 * training loop may swap param->w (double buffering) or param->g between
 * calls. */
#ifndef PS_LAYERS_H
#define PS_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* One parameter tensor (a layer's weights or its bias) = one server key. */
typedef struct ps_param {
    uint64_t key;  /* index in the model's param array */
    size_t count;  /* elements */
    float *w;      /* weights read by forward/backward (device); may be swapped
                      by the caller between calls, never cached by a layer */
    float *g;      /* gradient written by backward (device), overwritten on
                      every backward */
    int layer;     /* index of the owning layer in the model */
    int fan_in;    /* inputs per output unit (init scale) */
    int fan_out;   /* outputs per input unit (init scale) */
} ps_param;

typedef enum {
    PS_LAYER_LINEAR = 0,  /* y = x W^T + b, W [out, in] */
    PS_LAYER_RELU = 1,    /* y = max(x, 0); may run in place (y == x) */
    PS_LAYER_CONV2D = 2,  /* k x k, stride 1, 'same' zero padding (k odd) */
    PS_LAYER_MAXPOOL = 3, /* 2x2, stride 2 */
    PS_LAYER_FLATTEN = 4, /* NCHW -> N x (C*H*W): a no-op, y may equal x */
    PS_LAYER_INTERACT = 5 /* the click-through model's join of its dense vector x
                             with the pooled embeddings in l->emb (ctr.h): cat
                             or DLRM's pairwise dots (the backend's
                             interact_fwd/bwd) */
} ps_layer_kind;

typedef struct ps_layer {
    ps_layer_kind kind;
    int in_c, in_h, in_w;    /* per-sample input shape (linear: in_c features, 1x1) */
    int out_c, out_h, out_w; /* per-sample output shape */
    int k, pad;              /* conv2d only */
    ps_param *weight;        /* linear/conv2d: [out, in] / [out_c, in_c, k, k]; else NULL */
    ps_param *bias;          /* linear/conv2d: [out] / [out_c]; else NULL */
    /* scratch, owned by the layer, allocated by ps_layer_alloc for max_batch */
    int max_batch;
    float *col;              /* conv2d: im2col of one image [in_c*k*k, out_h*out_w]; NULL
                                when the backend convolves whole batches (conv_fwd) */
    uint8_t *argmax;         /* maxpool: window index of each output of the last forward;
                                NULL when the backend pools from x and y (pool_fwd) */
    /* interact only: fields embeddings of dim each per sample, joined by dot
     * products (dot) or side by side; emb [max_batch x fields*dim] is filled
     * by the caller before forward, demb (same shape) written by backward */
    int fields, dim, dot;
    float *emb, *demb;
} ps_layer;

/* Shape set-up (no allocation).  Return 0 or PS_EINVAL for non-positive or
 * unsupported sizes (conv: even k; maxpool: odd h or w; sizes whose products
 * overflow an int).  weight/bias start NULL: the caller points them at its
 * ps_param records before the first forward. */
int ps_layer_linear(ps_layer *l, int in, int out);
int ps_layer_relu(ps_layer *l, int c, int h, int w);
int ps_layer_conv2d(ps_layer *l, int in_c, int h, int w, int out_c, int k);
int ps_layer_maxpool(ps_layer *l, int c, int h, int w);
int ps_layer_flatten(ps_layer *l, int c, int h, int w);
/* x of `in` values and fields embeddings of dim: out = in + fields*dim
 * (cat), or in + (fields+1)*fields/2 (dot: x first, then x.e_1, e_2.x,
 * e_2.e_1, e_3.x, ...: the pairs (i, j), j < i, of vectors 0 = x, 1..fields =
 * the embeddings); dot needs in == dim. */
int ps_layer_interact(ps_layer *l, int in, int fields, int dim, int dot);

/* Per-sample element counts of the input and the output. */
size_t ps_layer_in_size(const ps_layer *l);
size_t ps_layer_out_size(const ps_layer *l);
/* Element counts of the weight and bias tensors (0 for layers without). */
size_t ps_layer_weight_count(const ps_layer *l);
size_t ps_layer_bias_count(const ps_layer *l);
/* Short description for logs, e.g. "conv5x5 1x28x28->32x28x28". */
void ps_layer_describe(const ps_layer *l, char *buf, size_t len);

/* Allocate the layer's scratch for batches of up to max_batch samples (device
 * memory of b, which forward and backward must then be given: the scratch
 * depends on the backend's optional operations); free it with
 * ps_layer_release.  Release is safe on a layer that was never allocated
 * (all-zero scratch fields). */
int ps_layer_alloc(ps_layer *l, ps_backend *b, int max_batch);
void ps_layer_release(ps_layer *l, ps_backend *b);

/* y[n, out_size] = layer(x[n, in_size]) for 1 <= n <= max_batch.  Reads
 * l->weight->w and l->bias->w now.  relu and flatten may run in place. */
int ps_layer_forward(ps_backend *b, ps_layer *l, const float *x, float *y, int n);

/* Backward of the last forward of this layer (same n; maxpool uses the argmax
 * that forward saved, or finds the maxima again in x and y).  x and y are
 * that forward's input and output, dy the gradient of the loss with respect
 * to y.  Writes (overwrites) the parameter
 * gradients into l->weight->g and l->bias->g, and dx (the gradient with
 * respect to x) unless dx is NULL (the first layer needs none).  relu may run
 * in place (dx == dy); flatten with dx == dy does nothing. */
int ps_layer_backward(ps_backend *b, ps_layer *l, const float *x, const float *y, const float *dy,
                      float *dx, int n);

/* ps_layer_backward in two halves, for a model that wants a linear layer's
 * input gradient before its parameter gradients (ps_model_backward): the
 * same calls, so the same bits.  _input: a linear layer's dx alone (reads
 * l->weight->w); any other kind, its whole backward.  _params: a linear
 * layer's l->weight->g and l->bias->g (PS_EINVAL for another kind). */
int ps_layer_backward_input(ps_backend *b, ps_layer *l, const float *x, const float *y,
                            const float *dy, float *dx, int n);
int ps_layer_backward_params(ps_backend *b, ps_layer *l, const float *x, const float *dy, int n);

/* Softmax cross-entropy loss over logits[n, classes] with device int32
 * labels: writes dlogits = d(mean loss)/d(logits) and, when non-NULL, the mean
 * loss and the number of correct argmax predictions into host memory (which
 * makes the call wait for the device). */
int ps_loss_softmax_xent(ps_backend *b, const float *logits, const int32_t *labels, int n,
                         int classes, float *dlogits, float *loss, int *correct);

/* The same without waiting: loss and correct (either may be NULL) are host
 * memory from b->alloc_host, filled when PS_STREAM_COMPUTE gets there (read
 * them after b->stream_sync(b, PS_STREAM_COMPUTE)); on the CPU, before it
 * returns. */
int ps_loss_softmax_xent_async(ps_backend *b, const float *logits, const int32_t *labels, int n,
                               int classes, float *dlogits, float *loss, int *correct);

/* Binary cross-entropy on logits[n] (one per sample) against int32 labels 0
 * or 1: writes dlogits = (sigmoid(z) - y) / n = d(mean loss)/d(logits) and,
 * when non-NULL, the mean loss (as max(z, 0) - z y + log(1 + e^-|z|), finite
 * for any finite z) and the number of samples with (z > 0) == y: the
 * backend's bce_logits (PS_EDEVICE without one).  Another label: PS_EINVAL
 * on the CPU, a NaN loss on a device (whose labels are not read back). */
int ps_loss_bce_logits(ps_backend *b, const float *logits, const int32_t *labels, int n,
                       float *dlogits, float *loss, int *correct);

#endif
