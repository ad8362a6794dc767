/* cuDNN for the CUDA backend's optional whole-batch operations
 * (client/ps_backend.h: conv_fwd, conv_bwd_data, conv_bwd_filter, pool_fwd,
 * pool_bwd): one library call per layer and batch instead of an im2col and a
 * gemm per image.
 *
 * Plans: the first call with a shape (batch size included) makes its
 * descriptors and chooses its algorithms from cuDNN's heuristics
 * (cudnnGet*Algorithm_v7, what PyTorch does unless told to benchmark); later
 * calls with that shape reuse them.  A plan cache of MAX_PLANS shapes
 * (training, evaluation and a last short batch need a few per layer); when it
 * is full the least recently used plan is remade on its next use.
 *
 * Algorithms: deterministic ones only, so a run repeats bit for bit.  Exact
 * FP32 (the default) also takes only the algorithms that sum products as a
 * gemm does (implicit or explicit gemm, direct) with FMA math: their error
 * has the classic sum-of-products bound the tests check against the CPU
 * (FFT and Winograd transforms spread rounding errors across a tile).
 * PS_CUDA_TF32=1 lets cuDNN use tensor cores and every transform.  A shape
 * with no such algorithm falls back to any deterministic one that works,
 * with a warning.
 *
 * Workspace: one buffer for every plan (all run in order on the compute
 * stream), grown when a new plan needs more, so a step allocates nothing.
 *
 * Threads: only the training thread calls these (ps_backend.h), so the
 * plan cache has no lock. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_impl.h"

#ifndef PS_HAVE_CUDNN

void ps_cudnn_attach(ps_backend *b, cuda_ctx *c, bool tf32)
{
    (void)b;
    (void)c;
    (void)tf32;
}

void ps_cudnn_release(cuda_ctx *c) { (void)c; }

#else

#include <cudnn.h>

/* A bad argument is the caller's; running out is memory; the rest is the
 * device or the library failing. */
static int dnn_code(cudnnStatus_t s)
{
    if (s >= CUDNN_STATUS_BAD_PARAM && s < CUDNN_STATUS_NOT_SUPPORTED)
        return PS_EINVAL;
    if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
        return PS_ENOMEM;
    if (s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        return PS_ENOMEM;
    return PS_EDEVICE;
}

#define DNN_CHECK(call)                                                             \
    do {                                                                            \
        cudnnStatus_t ps_s_ = (call);                                               \
        if (ps_s_ != CUDNN_STATUS_SUCCESS) {                                        \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cudnnGetErrorString(ps_s_));                                   \
            return dnn_code(ps_s_);                                                 \
        }                                                                           \
    } while (0)

#define DNN_LOG(call)                                                               \
    do {                                                                            \
        cudnnStatus_t ps_s_ = (call);                                               \
        if (ps_s_ != CUDNN_STATUS_SUCCESS)                                          \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cudnnGetErrorString(ps_s_));                                   \
    } while (0)

enum { PLAN_FREE = 0, PLAN_CONV = 1, PLAN_POOL = 2, MAX_PLANS = 32 };

/* No algorithm whose workspace is larger is taken (the CNN's need a few MiB). */
static const size_t WS_CAP = (size_t)512 << 20;

struct dnn_plan {
    int kind;        /* PLAN_*; PLAN_FREE: an unused slot */
    ps_conv_shape s; /* pool: n = planes (N*C), h, w; the rest 0 */
    uint64_t used;   /* the cache's clock at the last use */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    /* forward, backward data, backward filter: each with its algorithm's math */
    cudnnConvolutionDescriptor_t conv[3];
    cudnnPoolingDescriptor_t pool;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws_fwd, ws_data, ws_filter;
};

/* How a shape's algorithms are chosen (PS_CUDNN_ALGO): by cuDNN's
 * heuristics (the default: no timing at start, the same choice every run),
 * by timing every candidate once (find, as PyTorch's cudnn.benchmark), or by
 * timing with non-deterministic algorithms admitted too (fastest: a sync
 * run's rounding may then differ from run to run). */
enum { ALGO_HEURISTIC = 0, ALGO_FIND = 1, ALGO_FASTEST = 2 };

struct dnn_state {
    cudnnHandle_t h;
    bool tf32;
    int algo; /* ALGO_* */
    void *ws;       /* the shared workspace (device) */
    size_t ws_size;
    uint64_t clock;
    dnn_plan plan[MAX_PLANS];
};

static void plan_clear(dnn_plan *p)
{
    if (p->x)
        DNN_LOG(cudnnDestroyTensorDescriptor(p->x));
    if (p->y)
        DNN_LOG(cudnnDestroyTensorDescriptor(p->y));
    if (p->w)
        DNN_LOG(cudnnDestroyFilterDescriptor(p->w));
    for (int i = 0; i < 3; i++)
        if (p->conv[i])
            DNN_LOG(cudnnDestroyConvolutionDescriptor(p->conv[i]));
    if (p->pool)
        DNN_LOG(cudnnDestroyPoolingDescriptor(p->pool));
    memset(p, 0, sizeof *p);
}

static bool same_shape(const ps_conv_shape *a, const ps_conv_shape *b)
{
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w &&
           a->k_out == b->k_out && a->k == b->k && a->pad == b->pad;
}

/* The plan for (kind, s) if made, else a cleared slot to make it in: a free
 * one or the least recently used.  *found says which. */
static dnn_plan *plan_slot(dnn_state *d, int kind, const ps_conv_shape *s, bool *found)
{
    dnn_plan *slot = NULL;
    d->clock++;
    for (int i = 0; i < MAX_PLANS; i++) {
        dnn_plan *p = &d->plan[i];
        if (p->kind == kind && same_shape(&p->s, s)) {
            p->used = d->clock;
            *found = true;
            return p;
        }
        if (!slot || (slot->kind != PLAN_FREE && (p->kind == PLAN_FREE || p->used < slot->used)))
            slot = p;
    }
    plan_clear(slot);
    *found = false;
    return slot;
}

/* Make the shared workspace at least `need` bytes.  Plans are made between
 * operations on the compute stream, which may still be using the old one. */
static int ws_reserve(cuda_ctx *c, size_t need)
{
    dnn_state *d = c->dnn;
    if (need <= d->ws_size)
        return 0;
    CUDA_CHECK(cudaStreamSynchronize(c->stream[PS_STREAM_COMPUTE]));
    if (d->ws)
        CUDA_CHECK(cudaFree(d->ws));
    d->ws = NULL;
    d->ws_size = 0;
    cudaError_t e = cudaMalloc(&d->ws, need);
    if (e != cudaSuccess) {
        d->ws = NULL;
        ps_error("%s:%d: cudaMalloc(%zu bytes) for the cuDNN workspace on %s: %s", __FILE__,
                 __LINE__, need, c->name, cudaGetErrorString(e));
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return PS_ENOMEM;
        }
        return PS_EDEVICE;
    }
    d->ws_size = need;
    return 0;
}

static int tensor4(cudnnTensorDescriptor_t *t, int n, int c, int h, int w)
{
    DNN_CHECK(cudnnCreateTensorDescriptor(t));
    DNN_CHECK(cudnnSetTensor4dDescriptor(*t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
    return 0;
}

static bool tensor_math(cudnnMathType_t m)
{
    return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

/* Whether a heuristic's answer may be taken: it works, fits WS_CAP and is
 * deterministic; in exact FP32 (strict) also FMA math and a sum of products. */
template <typename Perf>
static bool usable(const Perf &p, bool strict, bool sum_of_products, bool any_order)
{
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > WS_CAP ||
        (p.determinism != CUDNN_DETERMINISTIC && !any_order))
        return false;
    return !strict || (!tensor_math(p.mathType) && sum_of_products);
}

static bool fwd_sum_of_products(cudnnConvolutionFwdAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}

static bool data_sum_of_products(cudnnConvolutionBwdDataAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}

static bool filter_sum_of_products(cudnnConvolutionBwdFilterAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/* The first usable answer, best first as the heuristics rank them: strictly
 * when the math must be exact, then (with a warning) any usable one.  -1 if
 * none. */
template <typename Perf, typename Pred>
static int pick(const Perf *perf, int count, bool exact, Pred sum_of_products, const char *what,
                const cuda_ctx *c, const ps_conv_shape *s)
{
    const bool any_order = c->dnn->algo == ALGO_FASTEST;
    for (int i = 0; i < count; i++)
        if (usable(perf[i], exact, sum_of_products(perf[i].algo), any_order))
            return i;
    for (int i = 0; i < count; i++)
        if (usable(perf[i], false, true, any_order)) {
            if (exact)
                ps_warn("%s: cuDNN %s of %dx%dx%dx%d k%d -> %d: no deterministic sum-of-products "
                        "algorithm; algorithm %d instead (results within the transform's "
                        "error, not the gemm's)", c->name, what, s->n, s->c, s->h, s->w, s->k,
                        s->k_out, (int)perf[i].algo);
            return i;
        }
    ps_error("%s: cuDNN has no deterministic %s algorithm for %dx%dx%dx%d k%d pad %d -> %d "
             "within a %zu MiB workspace; PS_CUDNN=0 runs it through im2col + cuBLAS", c->name,
             what, s->n, s->c, s->h, s->w, s->k, s->pad, s->k_out, WS_CAP >> 20);
    return -1;
}

/* The math type a chosen algorithm runs with: FMA alone in exact FP32
 * (cuDNN's default math allows TF32 on Ampere and newer), else the one the
 * heuristic ranked it under. */
static cudnnMathType_t math_for(const dnn_state *d, cudnnMathType_t ranked)
{
    return d->tf32 ? ranked : CUDNN_FMA_MATH;
}

static int conv_plan_make(cuda_ctx *c, dnn_plan *p, const ps_conv_shape *s)
{
    dnn_state *d = c->dnn;
    const int oh = s->h + 2 * s->pad - s->k + 1, ow = s->w + 2 * s->pad - s->k + 1;
    int rc;
    p->kind = PLAN_CONV; /* from here plan_clear undoes it */
    p->s = *s;
    p->used = d->clock;
    if ((rc = tensor4(&p->x, s->n, s->c, s->h, s->w)) ||
        (rc = tensor4(&p->y, s->n, s->k_out, oh, ow)))
        return rc;
    DNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
    DNN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s->k_out,
                                         s->c, s->k, s->k));
    for (int i = 0; i < 3; i++) {
        DNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv[i]));
        DNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv[i], s->pad, s->pad, 1, 1, 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
        DNN_CHECK(cudnnSetConvolutionMathType(p->conv[i], d->tf32 ? CUDNN_TENSOR_OP_MATH
                                                                  : CUDNN_FMA_MATH));
    }
    int n, k, h, w;
    DNN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv[0], p->x, p->w, &n, &k, &h, &w));
    if (n != s->n || k != s->k_out || h != oh || w != ow) {
        ps_error("%s: cuDNN makes conv %dx%dx%dx%d k%d pad %d -> %dx%dx%dx%d, not %dx%dx%dx%d",
                 c->name, s->n, s->c, s->h, s->w, s->k, s->pad, n, k, h, w, s->n, s->k_out, oh,
                 ow);
        return PS_EINVAL;
    }

    cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int nf = 0, nd = 0, nw = 0;
    if (d->algo == ALGO_HEURISTIC) {
        DNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
            d->h, p->x, p->w, p->conv[0], p->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nf, fp));
        DNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            d->h, p->w, p->y, p->conv[1], p->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, dp));
        DNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            d->h, p->x, p->y, p->conv[2], p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw,
            wp));
    } else {
        /* each candidate run once on scratch cuDNN allocates, fastest first;
         * once per shape, outside the timed steps of a run that keeps its
         * batch size */
        DNN_CHECK(cudnnFindConvolutionForwardAlgorithm(
            d->h, p->x, p->w, p->conv[0], p->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nf, fp));
        DNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
            d->h, p->w, p->y, p->conv[1], p->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, dp));
        DNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
            d->h, p->x, p->y, p->conv[2], p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw,
            wp));
    }
    const bool exact = !d->tf32;
    int i_f = pick(fp, nf, exact, fwd_sum_of_products, "forward", c, s);
    int i_d = pick(dp, nd, exact, data_sum_of_products, "backward data", c, s);
    int i_w = pick(wp, nw, exact, filter_sum_of_products, "backward filter", c, s);
    if (i_f < 0 || i_d < 0 || i_w < 0)
        return PS_EDEVICE;
    p->fwd = fp[i_f].algo;
    p->bwd_data = dp[i_d].algo;
    p->bwd_filter = wp[i_w].algo;
    DNN_CHECK(cudnnSetConvolutionMathType(p->conv[0], math_for(d, fp[i_f].mathType)));
    DNN_CHECK(cudnnSetConvolutionMathType(p->conv[1], math_for(d, dp[i_d].mathType)));
    DNN_CHECK(cudnnSetConvolutionMathType(p->conv[2], math_for(d, wp[i_w].mathType)));
    /* the sizes for the math type now set, which the ranking's may not be */
    DNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(d->h, p->x, p->w, p->conv[0], p->y, p->fwd,
                                                      &p->ws_fwd));
    DNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(d->h, p->w, p->y, p->conv[1], p->x,
                                                           p->bwd_data, &p->ws_data));
    DNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(d->h, p->x, p->y, p->conv[2], p->w,
                                                             p->bwd_filter, &p->ws_filter));
    size_t need = p->ws_fwd;
    if (p->ws_data > need)
        need = p->ws_data;
    if (p->ws_filter > need)
        need = p->ws_filter;
    if ((rc = ws_reserve(c, need)))
        return rc;
    ps_debug("%s: cuDNN conv %dx%dx%dx%d k%d pad %d -> %d: algorithms forward %d, backward "
             "data %d, backward filter %d; workspace %zu bytes", c->name, s->n, s->c, s->h, s->w,
             s->k, s->pad, s->k_out, (int)p->fwd, (int)p->bwd_data, (int)p->bwd_filter, need);
    return 0;
}

static int check_conv_shape(const ps_conv_shape *s)
{
    if (!s || s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k_out < 1 || s->k < 1 ||
        s->pad < 0 || s->h + 2 * s->pad - s->k + 1 < 1 || s->w + 2 * s->pad - s->k + 1 < 1)
        return PS_EINVAL;
    return 0;
}

/* The plan for s, made now if it is new; NULL with *rc set on failure. */
static dnn_plan *conv_plan(cuda_ctx *c, const ps_conv_shape *s, int *rc)
{
    bool found;
    dnn_plan *p = plan_slot(c->dnn, PLAN_CONV, s, &found);
    if (found)
        return p;
    if ((*rc = conv_plan_make(c, p, s))) {
        plan_clear(p);
        return NULL;
    }
    return p;
}

static const float ONE = 1.0f, ZERO = 0.0f;

static int dnn_conv_fwd(ps_backend *b, const ps_conv_shape *s, const float *x, const float *w,
                        float *y)
{
    cuda_ctx *c = ctx_of(b);
    int rc = check_conv_shape(s);
    if (rc)
        return rc;
    SET_DEVICE(c);
    dnn_plan *p = conv_plan(c, s, &rc);
    if (!p)
        return rc;
    DNN_CHECK(cudnnConvolutionForward(c->dnn->h, &ONE, p->x, x, p->w, w, p->conv[0], p->fwd,
                                      c->dnn->ws, p->ws_fwd, &ZERO, p->y, y));
    return 0;
}

static int dnn_conv_bwd_data(ps_backend *b, const ps_conv_shape *s, const float *w,
                             const float *dy, float *dx)
{
    cuda_ctx *c = ctx_of(b);
    int rc = check_conv_shape(s);
    if (rc)
        return rc;
    SET_DEVICE(c);
    dnn_plan *p = conv_plan(c, s, &rc);
    if (!p)
        return rc;
    DNN_CHECK(cudnnConvolutionBackwardData(c->dnn->h, &ONE, p->w, w, p->y, dy, p->conv[1],
                                           p->bwd_data, c->dnn->ws, p->ws_data, &ZERO, p->x,
                                           dx));
    return 0;
}

static int dnn_conv_bwd_filter(ps_backend *b, const ps_conv_shape *s, const float *x,
                               const float *dy, float *dw)
{
    cuda_ctx *c = ctx_of(b);
    int rc = check_conv_shape(s);
    if (rc)
        return rc;
    SET_DEVICE(c);
    dnn_plan *p = conv_plan(c, s, &rc);
    if (!p)
        return rc;
    DNN_CHECK(cudnnConvolutionBackwardFilter(c->dnn->h, &ONE, p->x, x, p->y, dy, p->conv[2],
                                             p->bwd_filter, c->dnn->ws, p->ws_filter, &ZERO,
                                             p->w, dw));
    return 0;
}

/* 2x2, stride 2 over NC planes of H x W: each plane an image of one channel,
 * so the descriptors need no batch size apart. */
static int pool_plan_make(cuda_ctx *c, dnn_plan *p, const ps_conv_shape *s)
{
    int rc;
    p->kind = PLAN_POOL;
    p->s = *s;
    p->used = c->dnn->clock;
    if ((rc = tensor4(&p->x, s->n, 1, s->h, s->w)) ||
        (rc = tensor4(&p->y, s->n, 1, s->h / 2, s->w / 2)))
        return rc;
    DNN_CHECK(cudnnCreatePoolingDescriptor(&p->pool));
    /* a NaN wins its window, so a diverged run shows in the loss */
    DNN_CHECK(cudnnSetPooling2dDescriptor(p->pool, CUDNN_POOLING_MAX_DETERMINISTIC,
                                          CUDNN_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
    return 0;
}

static dnn_plan *pool_plan(cuda_ctx *c, int NC, int H, int W, int *rc)
{
    ps_conv_shape s = {NC, 0, H, W, 0, 0, 0};
    bool found;
    dnn_plan *p = plan_slot(c->dnn, PLAN_POOL, &s, &found);
    if (found)
        return p;
    if ((*rc = pool_plan_make(c, p, &s))) {
        plan_clear(p);
        return NULL;
    }
    return p;
}

static int dnn_pool_fwd(ps_backend *b, const float *x, int NC, int H, int W, float *y)
{
    cuda_ctx *c = ctx_of(b);
    if (NC < 0 || H < 2 || W < 2 || (H & 1) || (W & 1))
        return PS_EINVAL;
    if (NC == 0)
        return 0;
    SET_DEVICE(c);
    int rc = 0;
    dnn_plan *p = pool_plan(c, NC, H, W, &rc);
    if (!p)
        return rc;
    DNN_CHECK(cudnnPoolingForward(c->dnn->h, p->pool, &ONE, p->x, x, &ZERO, p->y, y));
    return 0;
}

static int dnn_pool_bwd(ps_backend *b, const float *x, const float *y, const float *dy, int NC,
                        int H, int W, float *dx)
{
    cuda_ctx *c = ctx_of(b);
    if (NC < 0 || H < 2 || W < 2 || (H & 1) || (W & 1))
        return PS_EINVAL;
    if (NC == 0)
        return 0;
    SET_DEVICE(c);
    int rc = 0;
    dnn_plan *p = pool_plan(c, NC, H, W, &rc);
    if (!p)
        return rc;
    DNN_CHECK(cudnnPoolingBackward(c->dnn->h, p->pool, &ONE, p->y, y, p->y, dy, p->x, x, &ZERO,
                                   p->x, dx));
    return 0;
}

void ps_cudnn_attach(ps_backend *b, cuda_ctx *c, bool tf32)
{
    const char *off = getenv("PS_CUDNN");
    if (off && strcmp(off, "0") == 0) {
        ps_info("%s: cuDNN off (PS_CUDNN=0): convolutions by im2col + cuBLAS", c->name);
        return;
    }
    dnn_state *d = (dnn_state *)calloc(1, sizeof *d);
    if (!d) {
        ps_warn("%s: out of host memory for cuDNN's state: convolutions by im2col + cuBLAS",
                c->name);
        return;
    }
    d->tf32 = tf32;
    static const char *const algo_names[] = {"heuristic", "find", "fastest"};
    const char *algo = getenv("PS_CUDNN_ALGO");
    if (algo && *algo) {
        d->algo = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(algo, algo_names[i]) == 0)
                d->algo = i;
        if (d->algo < 0) {
            ps_warn("%s: PS_CUDNN_ALGO must be heuristic, find or fastest, got '%s': "
                    "heuristic", c->name, algo);
            d->algo = ALGO_HEURISTIC;
        }
    }
    cudnnStatus_t st = cudnnCreate(&d->h);
    const char *step = "cudnnCreate";
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "cudnnSetStream";
        st = cudnnSetStream(d->h, c->stream[PS_STREAM_COMPUTE]);
        if (st != CUDNN_STATUS_SUCCESS)
            DNN_LOG(cudnnDestroy(d->h));
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        ps_warn("%s: cuDNN cannot start (%s: %s): convolutions by im2col + cuBLAS instead "
                "(PS_CUDNN=0 says so without this warning)", c->name, step,
                cudnnGetErrorString(st));
        (void)cudaGetLastError(); /* a failed start must not fail the next launch check */
        free(d);
        return;
    }
    c->dnn = d;
    b->conv_fwd = dnn_conv_fwd;
    b->conv_bwd_data = dnn_conv_bwd_data;
    b->conv_bwd_filter = dnn_conv_bwd_filter;
    b->pool_fwd = dnn_pool_fwd;
    b->pool_bwd = dnn_pool_bwd;
    size_t v = cudnnGetVersion();
    ps_info("%s: cuDNN %zu.%zu.%zu for convolutions and pooling, %s, algorithms by %s",
            c->name, v / 10000, v / 100 % 100, v % 100,
            tf32 ? "TF32 tensor cores allowed (PS_CUDA_TF32=1)" : "exact FP32",
            d->algo == ALGO_HEURISTIC ? "cuDNN's heuristics"
            : d->algo == ALGO_FIND    ? "timing the deterministic ones (PS_CUDNN_ALGO=find)"
                                      : "timing all (PS_CUDNN_ALGO=fastest)");
}

void ps_cudnn_release(cuda_ctx *c)
{
    dnn_state *d = c->dnn;
    if (!d)
        return;
    for (int i = 0; i < MAX_PLANS; i++)
        plan_clear(&d->plan[i]);
    if (d->ws)
        CUDA_LOG(cudaFree(d->ws));
    DNN_LOG(cudnnDestroy(d->h));
    free(d);
    c->dnn = NULL;
}

#endif
