/* Compute backend interface (libps: the exchange moves data through it): one
 * struct of function pointers with a CPU implementation (OpenBLAS,
 * backend_cpu.c) and a CUDA implementation (cuBLAS, backend_cuda.cu; our
 * kernels, backend_cuda_kernels.cu; cuDNN, backend_cudnn.cu).  Layers call
 * only these, so the same layer code runs on both.  All tensors are float32,
 * row-major; images are NCHW.
 *
 * Memory: `alloc` returns device memory (host memory for the CPU backend);
 * `alloc_host` returns host memory the device can copy from/to asynchronously
 * (pinned on CUDA).  Pointers from one backend are only valid with it.
 *
 * Streams: PS_STREAM_COMPUTE runs kernels, PS_STREAM_COPY runs host<->device
 * copies.  Work on one stream runs in order; across streams order only through
 * events.  On the CPU every call is complete when it returns and events are
 * always signalled.
 *
 * Every function that can fail returns 0 or a PS_E* code (ps_error.h). */
#ifndef PS_BACKEND_IFACE_H
#define PS_BACKEND_IFACE_H

#include <stddef.h>
#include <stdint.h>

enum { PS_STREAM_COMPUTE = 0, PS_STREAM_COPY = 1 };

typedef struct ps_event ps_event;
typedef struct ps_backend ps_backend;

/* A batch's k x k convolution, stride 1, zero padding pad on each side:
 * x[n, c, h, w] with weights [k_out, c, k, k] gives y[n, k_out, oh, ow],
 * oh = h + 2 pad - k + 1 (ow likewise), as im2col + gemm computes it. */
typedef struct ps_conv_shape {
    int n, c, h, w, k_out, k, pad;
} ps_conv_shape;

struct ps_backend {
    const char *name; /* "cpu" or "cuda:N": for messages; test host_memory, not the name */
    void *ctx;        /* backend-private state */
    /* 1 when alloc returns plain host memory (CPU): the host can read and
     * write device buffers directly, so data bound for or coming from the
     * network needs no staging copy.  0 for device memory (CUDA). */
    int host_memory;

    /* memory */
    int (*alloc)(ps_backend *b, size_t bytes, void **out);
    void (*free)(ps_backend *b, void *p);
    int (*alloc_host)(ps_backend *b, size_t bytes, void **out);
    void (*free_host)(ps_backend *b, void *p);
    /* Page-lock host memory the program mapped itself (the shared-memory
     * arena), so copies to and from it run by DMA like alloc_host's; undone
     * by host_unregister before it is unmapped.  NULL on a backend whose
     * memory is host memory (nothing to do). */
    int (*host_register)(ps_backend *b, void *p, size_t bytes);
    void (*host_unregister)(ps_backend *b, void *p);
    /* kind: 0 host->device, 1 device->host, 2 device->device; async on stream */
    int (*copy)(ps_backend *b, void *dst, const void *src, size_t bytes, int kind, int stream);
    int (*fill)(ps_backend *b, float *x, float value, size_t n);

    /* C[M,N] = alpha * op(A) * op(B) + beta * C, row-major; op(A) is M x K.
     * lda/ldb/ldc are the row strides of A, B, C as stored. */
    int (*gemm)(ps_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha,
                const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

    /* y[o, c, i] += bias[c] for o < outer, c < channels, i < inner */
    int (*bias_add)(ps_backend *b, float *y, const float *bias, int outer, int channels, int inner);
    /* db[c] = sum over o, i of dy[o, c, i]  (overwrites db) */
    int (*bias_grad)(ps_backend *b, float *db, const float *dy, int outer, int channels, int inner);
    /* y = max(x, 0); may run in place */
    int (*relu_fwd)(ps_backend *b, float *y, const float *x, size_t n);
    /* dx = dy * (y > 0); may run in place (dx == dy) */
    int (*relu_bwd)(ps_backend *b, float *dx, const float *dy, const float *y, size_t n);
    /* Numerically stable softmax cross-entropy over rows of logits[n, classes].
     * Writes dlogits = (softmax - onehot) / n, and into host memory *loss the
     * mean loss and *correct the number of rows whose argmax equals the label
     * (both may be NULL; when given, the call waits for the result).
     * labels are device int32 indices in [0, classes). */
    int (*softmax_xent)(ps_backend *b, const float *logits, const int32_t *labels, int n,
                        int classes, float *dlogits, float *loss, int *correct);
    /* im2col for one image x[C, H, W] with a k x k kernel, zero padding pad,
     * stride 1: col[(c*k + ky)*k + kx, oy*OW + ox]; OH = H + 2pad - k + 1. */
    int (*im2col)(ps_backend *b, const float *x, int C, int H, int W, int k, int pad, float *col);
    /* adjoint of im2col: dx[C, H, W] = sum of col entries (overwrites dx) */
    int (*col2im)(ps_backend *b, const float *col, int C, int H, int W, int k, int pad, float *dx);
    /* 2x2 max-pool, stride 2, over x[N*C, H, W] (H, W even); argmax holds the
     * index within the window (0..3) of each output for backward. */
    int (*maxpool_fwd)(ps_backend *b, const float *x, int NC, int H, int W, float *y,
                       uint8_t *argmax);
    /* dx = scatter of dy through argmax (overwrites dx) */
    int (*maxpool_bwd)(ps_backend *b, const float *dy, const uint8_t *argmax, int NC, int H,
                       int W, float *dx);
    /* y += alpha * x */
    int (*axpy)(ps_backend *b, float *y, float alpha, const float *x, size_t n);

    /* Optional whole-batch operations (cuDNN on CUDA); NULL where the backend
     * has none, and the layers then use im2col, gemm and maxpool_fwd/bwd
     * above, as on the CPU.  All run on PS_STREAM_COMPUTE and overwrite their
     * output.  A backend may keep per-shape state (descriptors, the chosen
     * algorithm, a workspace) made at the first call with a shape: calls come
     * from one thread at a time.
     * y = x (*) w, the cross-correlation im2col + gemm computes (no bias) */
    int (*conv_fwd)(ps_backend *b, const ps_conv_shape *s, const float *x, const float *w,
                    float *y);
    /* dx = the adjoint of conv_fwd in x, applied to dy */
    int (*conv_bwd_data)(ps_backend *b, const ps_conv_shape *s, const float *w, const float *dy,
                         float *dx);
    /* dw = the gradient of sum(dy . conv_fwd(x, w)) in w, summed over the batch */
    int (*conv_bwd_filter)(ps_backend *b, const ps_conv_shape *s, const float *x,
                           const float *dy, float *dw);
    /* 2x2 max-pool, stride 2, like maxpool_fwd but without an argmax: its
     * backward finds each window's maximum again from the forward's x and y */
    int (*pool_fwd)(ps_backend *b, const float *x, int NC, int H, int W, float *y);
    int (*pool_bwd)(ps_backend *b, const float *x, const float *y, const float *dy, int NC, int H,
                    int W, float *dx);
    /* softmax_xent that does not wait: loss and correct (either may be NULL)
     * are host memory from alloc_host, written when PS_STREAM_COMPUTE gets
     * there, so they are read after stream_sync(PS_STREAM_COMPUTE).  NULL
     * where softmax_xent is complete on return anyway (the CPU). */
    int (*softmax_xent_async)(ps_backend *b, const float *logits, const int32_t *labels, int n,
                              int classes, float *dlogits, float *loss, int *correct);

    /* events and streams */
    int (*event_create)(ps_backend *b, ps_event **out);
    void (*event_destroy)(ps_backend *b, ps_event *e);
    int (*event_record)(ps_backend *b, ps_event *e, int stream);
    /* make `stream` wait for e without blocking the host */
    int (*stream_wait_event)(ps_backend *b, int stream, ps_event *e);
    /* block the host until e has happened */
    int (*event_sync)(ps_backend *b, ps_event *e);
    /* 1 if e has happened, 0 if not, negative PS_E* on error */
    int (*event_query)(ps_backend *b, ps_event *e);
    int (*stream_sync)(ps_backend *b, int stream);

    void (*destroy)(ps_backend *b);

    /* ---- the click-through model (worker/embedding.h, worker/layers.h) ----
     * Optional: NULL on a backend without them (the host backend), where
     * the model refuses to run.  All pointers are the backend's memory
     * except where said; every call is enqueued on PS_STREAM_COMPUTE.
     *
     * emb_bag_fwd: for s < nbags, j < dim: out[s * out_stride + j] = the sum
     * over entries e of bag s (offsets[s] .. offsets[s+1]-1; offsets NULL:
     * entry s alone) with index[e] >= 0 of weights[e] (NULL: 1) times
     * rows[index[e] * dim + j], in entry order; with mean, then times
     * 1/count of those entries (0 for none).  index < the rows there are
     * (the caller checked). */
    int (*emb_bag_fwd)(ps_backend *b, int nbags, const int32_t *offsets, const int32_t *index,
                       const float *weights, int mean, const float *rows, int dim, float *out,
                       size_t out_stride);
    /* emb_bag_bwd: the scatter-add of the bags' gradient into unique rows as
     * a gather, deterministic without atomics: the caller lists every row's
     * entries (a CSR by unique row, built on the host, which knows the
     * batch's index).  For u < nrows, j < dim: grads[u * dim + j] = the sum
     * over k in start[u] .. start[u+1]-1, in that order, of coef[k] times
     * dout[bag[k] * dout_stride + j] (overwrites every row; none listed: 0). */
    int (*emb_bag_bwd)(ps_backend *b, int nrows, int dim, const int32_t *start,
                       const int32_t *bag, const float *coef, const float *dout,
                       size_t dout_stride, float *grads);
    /* The interact layer (layers.h, PS_LAYER_INTERACT) over n samples: x
     * [n, in], emb [n, fields * dim], y [n, out]: y = x then the embeddings
     * (cat), or x then the dots of the pairs (i, j), j < i, of vectors 0 = x,
     * 1..fields = the embeddings (dot, in == dim).  Backward writes demb and
     * dx (when non-NULL) from dy, every sum in the order of the pairs. */
    int (*interact_fwd)(ps_backend *b, const float *x, const float *emb, int n, int in,
                        int fields, int dim, int dot, float *y);
    int (*interact_bwd)(ps_backend *b, const float *x, const float *emb, const float *dy, int n,
                        int in, int fields, int dim, int dot, float *dx, float *demb);
    /* Binary cross-entropy on logits[n] against labels 0 or 1 (the
     * backend's memory): dlogits = (sigmoid(z) - y) / n and, into host
     * memory when non-NULL (the call then waits), the mean loss and the
     * number of rows with (z > 0) == y.  A label that is not 0 or 1:
     * PS_EINVAL where the labels are host memory, a NaN loss elsewhere. */
    int (*bce_logits)(ps_backend *b, const float *logits, const int32_t *labels, int n,
                      float *dlogits, float *loss, int *correct);
    /* the state of the five above where the backend keeps it apart from ctx
     * (CUDA: worker/backend_cuda_emb.cu's) */
    void *ctr_ctx;
};

/* The host-memory backend (backend_host.c) is created with
 * ps_backend_host_create (include/ps_exchange.h). */

#endif
