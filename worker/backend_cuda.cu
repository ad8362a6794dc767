/* CUDA compute backend: cuBLAS for gemm, our own kernels for the rest, and
 * cuDNN for whole-batch convolutions and pooling where it is there
 * (backend_cudnn.cu).  worker/backend.h is the contract; backend_cpu.c is the
 * reference the tests compare against.
 *
 * Launch shapes:
 *   - elementwise kernels (fill, relu, axpy, bias_add, im2col, col2im,
 *     maxpool): 256 threads per block, grid-stride loop, the grid capped at
 *     what the device keeps resident at once (SMs * threads-per-SM / 256).
 *     Index arithmetic is 32-bit when every index fits in 31 bits, 64-bit
 *     otherwise (template on the index type).
 *   - bias_grad: one 256-thread block per channel (inner > 1), or 32 channels
 *     x 8 row-slices per block (inner == 1, the dense layer's column sums);
 *     fixed summation order, so results are bitwise repeatable.
 *   - softmax_xent: one warp per row, 8 rows per block; the loss/correct
 *     reduction is a second one-block kernel over per-row results (no
 *     atomics, so the loss is bitwise repeatable).
 *
 * Threads: the training thread and the comm thread may call into one backend
 * at the same time on different streams; each entry point selects the device
 * for its calling thread first.  softmax_xent with loss/correct uses per-
 * backend scratch and must not run concurrently with itself. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_impl.h"

/* ---- error checking (CUDA_CHECK, CUDA_LOG, LAUNCH_CHECK: backend_cuda_impl.h) */

#define CUBLAS_CHECK(call)                                                          \
    do {                                                                            \
        cublasStatus_t ps_s_ = (call);                                              \
        if (ps_s_ != CUBLAS_STATUS_SUCCESS) {                                       \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cublas_status_str(ps_s_));                                     \
            return PS_EDEVICE;                                                      \
        }                                                                           \
    } while (0)

static const char *cublas_status_str(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no context)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (bad argument)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH (GPU too old)";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

/* ---- launch shapes (the backend's state: backend_cuda_impl.h) ------------ */

enum { THREADS = 256 };

static unsigned grid_for(const cuda_ctx *c, size_t n)
{
    size_t g = (n + THREADS - 1) / THREADS;
    if (g > c->max_blocks)
        g = c->max_blocks;
    return g ? (unsigned)g : 1u;
}

/* 32-bit index math when i + grid stride cannot wrap */
static bool fits32(size_t n) { return n <= (size_t)INT32_MAX; }

#define GRID_STRIDE(I, i, n)                                                        \
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < (n);            \
         i += (I)gridDim.x * (I)blockDim.x)

/* ---- kernels ----------------------------------------------------------- */

static __global__ void k_fill(float *x, float v, size_t n)
{
    GRID_STRIDE(size_t, i, n) x[i] = v;
}

static __global__ void k_relu_fwd(float *y, const float *x, size_t n)
{
    GRID_STRIDE(size_t, i, n)
    {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

static __global__ void k_relu_bwd(float *dx, const float *dy, const float *y, size_t n)
{
    GRID_STRIDE(size_t, i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static __global__ void k_axpy(float *y, float alpha, const float *x, size_t n)
{
    GRID_STRIDE(size_t, i, n) y[i] = fmaf(alpha, x[i], y[i]);
}

template <typename I>
static __global__ void k_bias_add(float *y, const float *bias, I total, I channels, I inner)
{
    GRID_STRIDE(I, i, total) y[i] += bias[(i / inner) % channels];
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* db[c] = sum of dy[o, c, i]: one block per channel.  Each thread sums a
 * strided slice in order, then a fixed-shape tree: repeatable bit for bit. */
static __global__ void k_bias_grad_plane(float *db, const float *dy, int outer, int channels,
                                         int inner)
{
    __shared__ float part[THREADS / 32];
    const int c = blockIdx.x;
    const size_t per = (size_t)outer * (size_t)inner;
    float s = 0.0f;
    for (size_t j = threadIdx.x; j < per; j += blockDim.x) {
        size_t o = j / (size_t)inner, i = j - o * (size_t)inner;
        s += dy[(o * (size_t)channels + (size_t)c) * (size_t)inner + i];
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < THREADS / 32 ? part[threadIdx.x] : 0.0f;
        s = warp_sum(s);
        if (threadIdx.x == 0)
            db[c] = s;
    }
}

/* inner == 1: column sums of dy[outer, channels].  Block (32, 8): x walks 32
 * adjacent channels (coalesced rows), y splits the rows 8 ways. */
static __global__ void k_bias_grad_cols(float *db, const float *dy, int outer, int channels)
{
    __shared__ float part[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < channels)
        for (int o = threadIdx.y; o < outer; o += 8)
            s += dy[(size_t)o * (size_t)channels + (size_t)c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        float t = part[0][threadIdx.x];
        for (int k = 1; k < 8; k++)
            t += part[k][threadIdx.x];
        db[c] = t;
    }
}

/* One warp per row: max and argmax (first index on ties), sum of exp, then
 * dlogits = (softmax - onehot) / n.  With row_loss != NULL also writes the
 * row's loss log(sum) - (x[label] - max) and whether argmax == label.  A label
 * outside [0, classes) gets no onehot and a NaN loss, so it shows in the mean
 * instead of reading out of bounds. */
static __global__ void k_softmax_xent(const float *logits, const int32_t *labels, int n,
                                      int classes, float inv_n, float *dlogits, float *row_loss,
                                      int *row_correct)
{
    const int lane = threadIdx.x & 31;
    const int warps = (int)((gridDim.x * blockDim.x) >> 5);
    for (int r = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5); r < n; r += warps) {
        const float *x = logits + (size_t)r * (size_t)classes;
        float *d = dlogits + (size_t)r * (size_t)classes;
        float m = -INFINITY;
        int am = INT_MAX;
        for (int j = lane; j < classes; j += 32) {
            float v = x[j];
            if (v > m || am == INT_MAX) {
                m = v;
                am = j;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, o);
            int oa = __shfl_xor_sync(0xffffffffu, am, o);
            if (oa != INT_MAX && (am == INT_MAX || om > m || (om == m && oa < am))) {
                m = om;
                am = oa;
            }
        }
        float s = 0.0f;
        for (int j = lane; j < classes; j += 32)
            s += expf(x[j] - m);
        s = warp_sum(s);
        const int label = labels[r];
        const bool valid = label >= 0 && label < classes;
        for (int j = lane; j < classes; j += 32) {
            float p = expf(x[j] - m) / s;
            d[j] = (p - (j == label ? 1.0f : 0.0f)) * inv_n;
        }
        if (row_loss && lane == 0) {
            row_loss[r] = valid ? logf(s) - (x[label] - m) : NAN;
            row_correct[r] = am == label;
        }
    }
}

/* One block: mean loss (summed in double, fixed order) and number correct. */
static __global__ void k_xent_reduce(const float *row_loss, const int *row_correct, int n,
                                     xent_result *out)
{
    __shared__ double sl[THREADS];
    __shared__ int sc[THREADS];
    double l = 0.0;
    int c = 0;
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        l += (double)row_loss[r];
        c += row_correct[r];
    }
    sl[threadIdx.x] = l;
    sc[threadIdx.x] = c;
    __syncthreads();
    for (int h = THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            sl[threadIdx.x] += sl[threadIdx.x + h];
            sc[threadIdx.x] += sc[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out->loss = (float)(sl[0] / (double)n);
        out->correct = sc[0];
    }
}

/* col[(c*k + ky)*k + kx, oy*OW + ox] = x[c, oy + ky - pad, ox + kx - pad] or 0 */
template <typename I>
static __global__ void k_im2col(const float *x, int H, int W, int k, int pad, int OH, int OW,
                                I total, float *col)
{
    const I ohw = (I)OH * (I)OW;
    GRID_STRIDE(I, i, total)
    {
        I p = i % ohw, row = i / ohw;
        int ox = (int)(p % (I)OW), oy = (int)(p / (I)OW);
        int kx = (int)(row % (I)k);
        I t = row / (I)k;
        int ky = (int)(t % (I)k);
        I c = t / (I)k;
        int iy = oy + ky - pad, ix = ox + kx - pad;
        float v = 0.0f;
        if (iy >= 0 && iy < H && ix >= 0 && ix < W)
            v = x[(c * (I)H + (I)iy) * (I)W + (I)ix];
        col[i] = v;
    }
}

/* The adjoint of im2col as a gather: each input pixel sums the col entries
 * that copied it, in (ky, kx) order, so no two threads write one address. */
template <typename I>
static __global__ void k_col2im(const float *col, int H, int W, int k, int pad, int OH, int OW,
                                I total, float *dx)
{
    const I ohw = (I)OH * (I)OW;
    GRID_STRIDE(I, i, total)
    {
        int x = (int)(i % (I)W);
        I t = i / (I)W;
        int y = (int)(t % (I)H);
        I c = t / (I)H;
        float s = 0.0f;
        for (int ky = 0; ky < k; ky++) {
            int oy = y + pad - ky;
            if (oy < 0 || oy >= OH)
                continue;
            for (int kx = 0; kx < k; kx++) {
                int ox = x + pad - kx;
                if (ox < 0 || ox >= OW)
                    continue;
                I row = (c * (I)k + (I)ky) * (I)k + (I)kx;
                s += col[row * ohw + (I)oy * (I)OW + (I)ox];
            }
        }
        dx[i] = s;
    }
}

/* one thread per output; argmax is dy*2 + dx within the window, first max wins */
template <typename I>
static __global__ void k_maxpool_fwd(const float *x, int H, int W, I total, float *y,
                                     uint8_t *argmax)
{
    const int OH = H / 2, OW = W / 2;
    GRID_STRIDE(I, i, total)
    {
        int ox = (int)(i % (I)OW);
        I t = i / (I)OW;
        int oy = (int)(t % (I)OH);
        I nc = t / (I)OH;
        const float *p = x + (nc * (I)H + (I)(2 * oy)) * (I)W + (I)(2 * ox);
        float v[4] = {p[0], p[1], p[W], p[W + 1]};
        float best = v[0];
        int idx = 0;
#pragma unroll
        for (int q = 1; q < 4; q++)
            if (v[q] > best) {
                best = v[q];
                idx = q;
            }
        y[i] = best;
        if (argmax)
            argmax[i] = (uint8_t)idx;
    }
}

/* one thread per input pixel: a gather, so no atomics and dx is overwritten */
template <typename I>
static __global__ void k_maxpool_bwd(const float *dy, const uint8_t *argmax, int H, int W, I total,
                                     float *dx)
{
    const int OH = H / 2, OW = W / 2;
    GRID_STRIDE(I, i, total)
    {
        int x = (int)(i % (I)W);
        I t = i / (I)W;
        int y = (int)(t % (I)H);
        I nc = t / (I)H;
        I o = (nc * (I)OH + (I)(y >> 1)) * (I)OW + (I)(x >> 1);
        dx[i] = argmax[o] == (uint8_t)((y & 1) * 2 + (x & 1)) ? dy[o] : 0.0f;
    }
}

/* ---- memory ------------------------------------------------------------ */

static int cu_alloc(ps_backend *b, size_t bytes, void **out)
{
    cuda_ctx *c = ctx_of(b);
    *out = NULL;
    SET_DEVICE(c);
    /* a zero-byte request still gets a distinct, freeable pointer */
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        ps_error("%s:%d: cudaMalloc(%zu bytes) on %s: %s", __FILE__, __LINE__, bytes, c->name,
                 cudaGetErrorString(e));
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError(); /* not sticky: clear it for the next launch check */
            return PS_ENOMEM;
        }
        return PS_EDEVICE;
    }
    return 0;
}

static void cu_free(ps_backend *b, void *p)
{
    if (!p)
        return;
    CUDA_LOG(cudaSetDevice(ctx_of(b)->device));
    CUDA_LOG(cudaFree(p));
}

static int cu_alloc_host(ps_backend *b, size_t bytes, void **out)
{
    cuda_ctx *c = ctx_of(b);
    *out = NULL;
    SET_DEVICE(c);
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *out = NULL;
        ps_error("%s:%d: cudaHostAlloc(%zu bytes) on %s: %s", __FILE__, __LINE__, bytes,
                 c->name, cudaGetErrorString(e));
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return PS_ENOMEM;
        }
        return PS_EDEVICE;
    }
    return 0;
}

static void cu_free_host(ps_backend *b, void *p)
{
    if (!p)
        return;
    CUDA_LOG(cudaSetDevice(ctx_of(b)->device));
    CUDA_LOG(cudaFreeHost(p));
}

static int cu_host_register(ps_backend *b, void *p, size_t bytes)
{
    cuda_ctx *c = ctx_of(b);
    SET_DEVICE(c);
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        ps_error("%s:%d: cudaHostRegister(%zu bytes) on %s: %s", __FILE__, __LINE__, bytes,
                 c->name, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return PS_EDEVICE;
    }
    return 0;
}

static void cu_host_unregister(ps_backend *b, void *p)
{
    if (!p)
        return;
    CUDA_LOG(cudaSetDevice(ctx_of(b)->device));
    CUDA_LOG(cudaHostUnregister(p));
}

static int cu_copy(ps_backend *b, void *dst, const void *src, size_t bytes, int kind, int stream)
{
    cuda_ctx *c = ctx_of(b);
    static const cudaMemcpyKind kinds[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                            cudaMemcpyDeviceToDevice};
    if (kind < 0 || kind > 2 || stream < 0 || stream > 1)
        return PS_EINVAL;
    if (bytes == 0)
        return 0;
    SET_DEVICE(c);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kinds[kind], c->stream[stream]));
    return 0;
}

static int cu_fill(ps_backend *b, float *x, float value, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    if (n == 0)
        return 0;
    SET_DEVICE(c);
    k_fill<<<grid_for(c, n), THREADS, 0, c->stream[PS_STREAM_COMPUTE]>>>(x, value, n);
    LAUNCH_CHECK("k_fill");
    return 0;
}

/* ---- gemm -------------------------------------------------------------- */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
 * row-major matrix read as column-major is its transpose, so cuBLAS gets B
 * first with the same transpose flags and m = N, n = M. */
static int cu_gemm(ps_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C,
                   int ldc)
{
    cuda_ctx *c = ctx_of(b);
    if (M < 0 || N < 0 || K < 0)
        return PS_EINVAL;
    /* row strides as stored: A is M x K (K x M when transposed), B is K x N
     * (N x K), C is M x N */
    int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (N > 1 ? N : 1))
        return PS_EINVAL;
    if (M == 0 || N == 0)
        return 0;
    SET_DEVICE(c);
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasSgemm(c->blas, op_b, op_a, N, M, K, &alpha, B, ldb, A, lda, &beta, C,
                             ldc));
    return 0;
}

/* ---- layers' elementwise pieces ---------------------------------------- */

static int cu_bias_add(ps_backend *b, float *y, const float *bias, int outer, int channels,
                       int inner)
{
    cuda_ctx *c = ctx_of(b);
    if (outer < 0 || channels < 0 || inner < 0)
        return PS_EINVAL;
    size_t total = (size_t)outer * (size_t)channels * (size_t)inner;
    if (total == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (fits32(total))
        k_bias_add<uint32_t><<<grid_for(c, total), THREADS, 0, s>>>(
            y, bias, (uint32_t)total, (uint32_t)channels, (uint32_t)inner);
    else
        k_bias_add<size_t><<<grid_for(c, total), THREADS, 0, s>>>(y, bias, total,
                                                                   (size_t)channels,
                                                                   (size_t)inner);
    LAUNCH_CHECK("k_bias_add");
    return 0;
}

static int cu_bias_grad(ps_backend *b, float *db, const float *dy, int outer, int channels,
                        int inner)
{
    cuda_ctx *c = ctx_of(b);
    if (outer < 0 || channels < 0 || inner < 0)
        return PS_EINVAL;
    if (channels == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (outer == 0 || inner == 0) {
        CUDA_CHECK(cudaMemsetAsync(db, 0, (size_t)channels * sizeof(float), s));
        return 0;
    }
    if (inner == 1) {
        dim3 block(32, 8);
        k_bias_grad_cols<<<(unsigned)((channels + 31) / 32), block, 0, s>>>(db, dy, outer,
                                                                             channels);
        LAUNCH_CHECK("k_bias_grad_cols");
    } else {
        k_bias_grad_plane<<<(unsigned)channels, THREADS, 0, s>>>(db, dy, outer, channels, inner);
        LAUNCH_CHECK("k_bias_grad_plane");
    }
    return 0;
}

static int cu_relu_fwd(ps_backend *b, float *y, const float *x, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    if (n == 0)
        return 0;
    SET_DEVICE(c);
    k_relu_fwd<<<grid_for(c, n), THREADS, 0, c->stream[PS_STREAM_COMPUTE]>>>(y, x, n);
    LAUNCH_CHECK("k_relu_fwd");
    return 0;
}

static int cu_relu_bwd(ps_backend *b, float *dx, const float *dy, const float *y, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    if (n == 0)
        return 0;
    SET_DEVICE(c);
    k_relu_bwd<<<grid_for(c, n), THREADS, 0, c->stream[PS_STREAM_COMPUTE]>>>(dx, dy, y, n);
    LAUNCH_CHECK("k_relu_bwd");
    return 0;
}

/* The loss and the number correct, when asked for, reach *loss and *correct
 * (pinned host memory) by a copy on the compute stream: nothing waits here. */
static int cu_softmax_xent_async(ps_backend *b, const float *logits, const int32_t *labels,
                                 int n, int classes, float *dlogits, float *loss, int *correct)
{
    cuda_ctx *c = ctx_of(b);
    if (n <= 0 || classes <= 0)
        return PS_EINVAL;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    const bool want = loss || correct;
    if (want && (size_t)n > c->row_cap) {
        /* earlier launches may still read the old buffers */
        CUDA_CHECK(cudaStreamSynchronize(s));
        size_t cap = c->row_cap ? c->row_cap : 256;
        while (cap < (size_t)n)
            cap *= 2;
        CUDA_CHECK(cudaFree(c->row_loss));
        CUDA_CHECK(cudaFree(c->row_correct));
        c->row_loss = NULL;
        c->row_correct = NULL;
        c->row_cap = 0;
        CUDA_CHECK(cudaMalloc((void **)&c->row_loss, cap * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void **)&c->row_correct, cap * sizeof(int)));
        c->row_cap = cap;
    }
    const int rows_per_block = THREADS / 32;
    size_t blocks = ((size_t)n + rows_per_block - 1) / rows_per_block;
    if (blocks > c->max_blocks)
        blocks = c->max_blocks;
    k_softmax_xent<<<(unsigned)blocks, THREADS, 0, s>>>(logits, labels, n, classes,
                                                         1.0f / (float)n, dlogits,
                                                         want ? c->row_loss : NULL,
                                                         want ? c->row_correct : NULL);
    LAUNCH_CHECK("k_softmax_xent");
    if (!want)
        return 0;
    /* d_result is reused by the next call: the copies below are ordered
     * before that call's reduction on the same stream */
    k_xent_reduce<<<1, THREADS, 0, s>>>(c->row_loss, c->row_correct, n, c->d_result);
    LAUNCH_CHECK("k_xent_reduce");
    if (loss)
        CUDA_CHECK(cudaMemcpyAsync(loss, &c->d_result->loss, sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    if (correct)
        CUDA_CHECK(cudaMemcpyAsync(correct, &c->d_result->correct, sizeof(int),
                                   cudaMemcpyDeviceToHost, s));
    return 0;
}

static int cu_softmax_xent(ps_backend *b, const float *logits, const int32_t *labels, int n,
                           int classes, float *dlogits, float *loss, int *correct)
{
    cuda_ctx *c = ctx_of(b);
    const bool want = loss || correct;
    int rc = cu_softmax_xent_async(b, logits, labels, n, classes, dlogits,
                                   want ? &c->h_result->loss : NULL,
                                   want ? &c->h_result->correct : NULL);
    if (rc || !want)
        return rc;
    CUDA_CHECK(cudaStreamSynchronize(c->stream[PS_STREAM_COMPUTE]));
    if (loss)
        *loss = c->h_result->loss;
    if (correct)
        *correct = c->h_result->correct;
    return 0;
}

static int conv_shape(int C, int H, int W, int k, int pad, int *OH, int *OW)
{
    if (C < 1 || H < 1 || W < 1 || k < 1 || pad < 0)
        return PS_EINVAL;
    *OH = H + 2 * pad - k + 1;
    *OW = W + 2 * pad - k + 1;
    if (*OH < 1 || *OW < 1)
        return PS_EINVAL;
    return 0;
}

static int cu_im2col(ps_backend *b, const float *x, int C, int H, int W, int k, int pad,
                     float *col)
{
    cuda_ctx *c = ctx_of(b);
    int OH, OW, rc = conv_shape(C, H, W, k, pad, &OH, &OW);
    if (rc)
        return rc;
    size_t total = (size_t)C * (size_t)k * (size_t)k * (size_t)OH * (size_t)OW;
    size_t in = (size_t)C * (size_t)H * (size_t)W;
    if (total == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (fits32(total) && fits32(in))
        k_im2col<uint32_t><<<grid_for(c, total), THREADS, 0, s>>>(x, H, W, k, pad, OH, OW,
                                                                  (uint32_t)total, col);
    else
        k_im2col<size_t><<<grid_for(c, total), THREADS, 0, s>>>(x, H, W, k, pad, OH, OW, total,
                                                                col);
    LAUNCH_CHECK("k_im2col");
    return 0;
}

static int cu_col2im(ps_backend *b, const float *col, int C, int H, int W, int k, int pad,
                     float *dx)
{
    cuda_ctx *c = ctx_of(b);
    int OH, OW, rc = conv_shape(C, H, W, k, pad, &OH, &OW);
    if (rc)
        return rc;
    size_t total = (size_t)C * (size_t)H * (size_t)W;
    size_t cols = (size_t)C * (size_t)k * (size_t)k * (size_t)OH * (size_t)OW;
    if (total == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (fits32(total) && fits32(cols))
        k_col2im<uint32_t><<<grid_for(c, total), THREADS, 0, s>>>(col, H, W, k, pad, OH, OW,
                                                                  (uint32_t)total, dx);
    else
        k_col2im<size_t><<<grid_for(c, total), THREADS, 0, s>>>(col, H, W, k, pad, OH, OW, total,
                                                                dx);
    LAUNCH_CHECK("k_col2im");
    return 0;
}

static int cu_maxpool_fwd(ps_backend *b, const float *x, int NC, int H, int W, float *y,
                          uint8_t *argmax)
{
    cuda_ctx *c = ctx_of(b);
    if (NC < 0 || H < 1 || W < 1 || (H & 1) || (W & 1))
        return PS_EINVAL;
    size_t total = (size_t)NC * (size_t)(H / 2) * (size_t)(W / 2);
    size_t in = (size_t)NC * (size_t)H * (size_t)W;
    if (total == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (fits32(in))
        k_maxpool_fwd<uint32_t><<<grid_for(c, total), THREADS, 0, s>>>(x, H, W, (uint32_t)total,
                                                                       y, argmax);
    else
        k_maxpool_fwd<size_t><<<grid_for(c, total), THREADS, 0, s>>>(x, H, W, total, y, argmax);
    LAUNCH_CHECK("k_maxpool_fwd");
    return 0;
}

static int cu_maxpool_bwd(ps_backend *b, const float *dy, const uint8_t *argmax, int NC, int H,
                          int W, float *dx)
{
    cuda_ctx *c = ctx_of(b);
    if (NC < 0 || H < 1 || W < 1 || (H & 1) || (W & 1))
        return PS_EINVAL;
    size_t total = (size_t)NC * (size_t)H * (size_t)W;
    if (total == 0)
        return 0;
    SET_DEVICE(c);
    cudaStream_t s = c->stream[PS_STREAM_COMPUTE];
    if (fits32(total))
        k_maxpool_bwd<uint32_t><<<grid_for(c, total), THREADS, 0, s>>>(dy, argmax, H, W,
                                                                       (uint32_t)total, dx);
    else
        k_maxpool_bwd<size_t><<<grid_for(c, total), THREADS, 0, s>>>(dy, argmax, H, W, total,
                                                                     dx);
    LAUNCH_CHECK("k_maxpool_bwd");
    return 0;
}

static int cu_axpy(ps_backend *b, float *y, float alpha, const float *x, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    if (n == 0)
        return 0;
    SET_DEVICE(c);
    k_axpy<<<grid_for(c, n), THREADS, 0, c->stream[PS_STREAM_COMPUTE]>>>(y, alpha, x, n);
    LAUNCH_CHECK("k_axpy");
    return 0;
}

/* ---- events and streams ------------------------------------------------ */

/* A ps_event is the cudaEvent_t itself (an opaque pointer either way). */
static cudaEvent_t ev_of(ps_event *e) { return (cudaEvent_t)(void *)e; }

static int cu_event_create(ps_backend *b, ps_event **out)
{
    cuda_ctx *c = ctx_of(b);
    *out = NULL;
    SET_DEVICE(c);
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = (ps_event *)(void *)ev;
    return 0;
}

static void cu_event_destroy(ps_backend *b, ps_event *e)
{
    if (!e)
        return;
    CUDA_LOG(cudaSetDevice(ctx_of(b)->device));
    CUDA_LOG(cudaEventDestroy(ev_of(e)));
}

static int cu_event_record(ps_backend *b, ps_event *e, int stream)
{
    cuda_ctx *c = ctx_of(b);
    if (!e || stream < 0 || stream > 1)
        return PS_EINVAL;
    SET_DEVICE(c);
    CUDA_CHECK(cudaEventRecord(ev_of(e), c->stream[stream]));
    return 0;
}

static int cu_stream_wait_event(ps_backend *b, int stream, ps_event *e)
{
    cuda_ctx *c = ctx_of(b);
    if (!e || stream < 0 || stream > 1)
        return PS_EINVAL;
    SET_DEVICE(c);
    CUDA_CHECK(cudaStreamWaitEvent(c->stream[stream], ev_of(e), 0));
    return 0;
}

static int cu_event_sync(ps_backend *b, ps_event *e)
{
    cuda_ctx *c = ctx_of(b);
    if (!e)
        return PS_EINVAL;
    SET_DEVICE(c);
    CUDA_CHECK(cudaEventSynchronize(ev_of(e)));
    return 0;
}

static int cu_event_query(ps_backend *b, ps_event *e)
{
    cuda_ctx *c = ctx_of(b);
    if (!e)
        return -PS_EINVAL;
    cudaError_t r = cudaSetDevice(c->device);
    if (r == cudaSuccess)
        r = cudaEventQuery(ev_of(e));
    if (r == cudaSuccess)
        return 1;
    if (r == cudaErrorNotReady) {
        /* not an error, but the runtime records it as the last error; clear
         * it so the next launch check does not report it */
        (void)cudaGetLastError();
        return 0;
    }
    ps_error("%s:%d: cudaEventQuery on %s: %s", __FILE__, __LINE__, c->name,
             cudaGetErrorString(r));
    return -PS_EDEVICE;
}

static int cu_stream_sync(ps_backend *b, int stream)
{
    cuda_ctx *c = ctx_of(b);
    if (stream < 0 || stream > 1)
        return PS_EINVAL;
    SET_DEVICE(c);
    CUDA_CHECK(cudaStreamSynchronize(c->stream[stream]));
    return 0;
}

/* ---- create / destroy -------------------------------------------------- */

/* Releases whatever create got to; safe on a partly built context. */
static void release_ctx(cuda_ctx *c)
{
    if (!c)
        return;
    /* nothing made yet (the device refused us): nothing to select it for */
    if (!c->stream[0] && !c->stream[1] && !c->blas && !c->d_result && !c->h_result) {
        free(c);
        return;
    }
    CUDA_LOG(cudaSetDevice(c->device));
    for (int i = 0; i < 2; i++)
        if (c->stream[i])
            CUDA_LOG(cudaStreamSynchronize(c->stream[i]));
    ps_cudnn_release(c);
    if (c->blas) {
        cublasStatus_t st = cublasDestroy(c->blas);
        if (st != CUBLAS_STATUS_SUCCESS)
            ps_error("%s:%d: cublasDestroy: %s", __FILE__, __LINE__, cublas_status_str(st));
    }
    if (c->row_loss)
        CUDA_LOG(cudaFree(c->row_loss));
    if (c->row_correct)
        CUDA_LOG(cudaFree(c->row_correct));
    if (c->d_result)
        CUDA_LOG(cudaFree(c->d_result));
    if (c->h_result)
        CUDA_LOG(cudaFreeHost(c->h_result));
    for (int i = 0; i < 2; i++)
        if (c->stream[i])
            CUDA_LOG(cudaStreamDestroy(c->stream[i]));
    free(c);
}

static void cu_destroy(ps_backend *b)
{
    if (!b)
        return;
    ps_backend_cuda_ctr_detach(b);
    release_ctx(ctx_of(b));
    free(b);
}

/* What to do about an error of create, where the runtime's own text
 * misleads or says nothing of the remedy; "" when it says enough. */
static const char *create_advice(cudaError_t e, int device, char *buf, size_t len)
{
    if (e != cudaErrorDevicesUnavailable)
        return "";
    /* a device attribute needs no context, so this works where the context failed */
    int mode = -1;
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device) != cudaSuccess) {
        (void)cudaGetLastError();
        mode = -1;
    }
    /* nvidia-smi numbers GPUs as the machine does, not as CUDA_VISIBLE_DEVICES
     * renumbers them: the advice names no index */
    if (mode == cudaComputeModeExclusiveProcess)
        snprintf(buf, len, "; cuda:%d is in EXCLUSIVE_PROCESS compute mode and another process "
                 "holds it (a second worker on this GPU?): run one worker per GPU, or let "
                 "workers share it through MPS (nvidia-cuda-mps-control -d), or set the "
                 "default compute mode (nvidia-smi -c DEFAULT, as root)", device);
    else if (mode == cudaComputeModeProhibited)
        snprintf(buf, len, "; cuda:%d is in PROHIBITED compute mode: no process may use it "
                 "(nvidia-smi -c DEFAULT, as root)", device);
    else
        snprintf(buf, len, "; cuda:%d is busy or unavailable: nvidia-smi shows its compute "
                 "mode and the processes on it", device);
    return buf;
}

/* Steps of create that can fail: on failure, name the step in `why`. */
#define CREATE_CUDA(call)                                                           \
    do {                                                                            \
        cudaError_t ps_e_ = (call);                                                 \
        if (ps_e_ != cudaSuccess) {                                                 \
            char ps_adv_[400];                                                      \
            const char *ps_a_ = create_advice(ps_e_, device, ps_adv_, sizeof ps_adv_); \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cudaGetErrorString(ps_e_));                                    \
            if (why && why_len)                                                     \
                snprintf(why, why_len, "--device cuda:%d: %s: %s%s", device, #call, \
                         cudaGetErrorString(ps_e_), ps_a_);                         \
            (void)cudaGetLastError();                                               \
            release_ctx(c);                                                         \
            free(b);                                                                \
            return PS_EDEVICE;                                                      \
        }                                                                           \
    } while (0)

/* cudaGetDeviceCount failed or found none.  Without a driver the runtime
 * says "CUDA driver version is insufficient", which sends people to update
 * a driver they do not have: cudaDriverGetVersion gives 0 then, and the
 * message says there is no CUDA device. */
static void no_device(cudaError_t e, int device, char *why, size_t why_len)
{
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess)
        driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        runtime = 0;
    (void)cudaGetLastError(); /* not sticky; keep it out of later checks */
    if (!why || !why_len)
        return;
    if (driver == 0)
        snprintf(why, why_len, "--device cuda:%d: no CUDA device: no NVIDIA driver is loaded on "
                 "this machine (no GPU, or its driver is not installed or not visible here); "
                 "train with --device cpu", device);
    else if (e == cudaErrorInsufficientDriver)
        snprintf(why, why_len, "--device cuda:%d: the NVIDIA driver supports CUDA %d.%d, this "
                 "build's runtime needs CUDA %d.%d: update the driver, or train with --device "
                 "cpu", device, driver / 1000, driver % 1000 / 10, runtime / 1000,
                 runtime % 1000 / 10);
    else
        snprintf(why, why_len, "--device cuda:%d: no CUDA device: the NVIDIA driver (CUDA %d.%d) "
                 "sees no usable GPU (%s%s%s); train with --device cpu", device, driver / 1000,
                 driver % 1000 / 10, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices",
                 getenv("CUDA_VISIBLE_DEVICES") ? ", CUDA_VISIBLE_DEVICES=" : "",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "");
}

extern "C" int ps_backend_cuda_create(int device, ps_backend **out, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!out)
        return PS_EINVAL;
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        no_device(e, device, why, why_len);
        return PS_EDEVICE;
    }
    if (device < 0 || device >= count) {
        if (why && why_len)
            snprintf(why, why_len, "--device cuda:%d: only %d CUDA device(s) here (cuda:0..%d%s)",
                     device, count, count - 1,
                     getenv("CUDA_VISIBLE_DEVICES") ? ", as CUDA_VISIBLE_DEVICES allows" : "");
        return PS_EDEVICE;
    }

    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    ps_backend *b = (ps_backend *)calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        if (why && why_len)
            snprintf(why, why_len, "--device cuda:%d: out of host memory", device);
        return PS_ENOMEM;
    }
    c->device = device;
    snprintf(c->name, sizeof c->name, "cuda:%d", device);

    CREATE_CUDA(cudaSetDevice(device));
    int sms = 0, threads_per_sm = 0;
    CREATE_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CREATE_CUDA(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor,
                                       device));
    c->max_blocks = (unsigned)(sms > 0 ? sms : 1) *
                    (unsigned)(threads_per_sm >= THREADS ? threads_per_sm / THREADS : 1);
    for (int i = 0; i < 2; i++)
        CREATE_CUDA(cudaStreamCreateWithFlags(&c->stream[i], cudaStreamNonBlocking));
    CREATE_CUDA(cudaMalloc((void **)&c->d_result, sizeof(xent_result)));
    CREATE_CUDA(cudaHostAlloc((void **)&c->h_result, sizeof(xent_result), cudaHostAllocDefault));

    cublasStatus_t st = cublasCreate(&c->blas);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetStream(c->blas, c->stream[PS_STREAM_COMPUTE]);
    /* Exact FP32 unless asked: TF32 tensor cores round the inputs to 10
     * mantissa bits, which the CPU backend and the tests would not match. */
    const char *tf32 = getenv("PS_CUDA_TF32");
    const bool use_tf32 = tf32 && strcmp(tf32, "1") == 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetMathMode(c->blas,
                               use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) {
        ps_error("%s:%d: cuBLAS set-up on %s: %s", __FILE__, __LINE__, c->name,
                 cublas_status_str(st));
        if (why && why_len)
            snprintf(why, why_len, "--device cuda:%d: cuBLAS set-up failed: %s", device,
                     cublas_status_str(st));
        release_ctx(c);
        free(b);
        return PS_EDEVICE;
    }
    if (use_tf32)
        ps_info("%s: cuBLAS gemm uses TF32 tensor cores (PS_CUDA_TF32=1)", c->name);
    if (ps_backend_cuda_ctr_attach(b, device, c->stream[PS_STREAM_COMPUTE], c->max_blocks)) {
        if (why && why_len)
            snprintf(why, why_len, "--device cuda:%d: the click-through model's kernels could "
                     "not be set up (the log says why)", device);
        ps_backend_cuda_ctr_detach(b);
        release_ctx(c);
        free(b);
        return PS_EDEVICE;
    }

    b->name = c->name;
    b->ctx = c;
    b->host_memory = 0;
    b->alloc = cu_alloc;
    b->free = cu_free;
    b->alloc_host = cu_alloc_host;
    b->free_host = cu_free_host;
    b->host_register = cu_host_register;
    b->host_unregister = cu_host_unregister;
    b->copy = cu_copy;
    b->fill = cu_fill;
    b->gemm = cu_gemm;
    b->bias_add = cu_bias_add;
    b->bias_grad = cu_bias_grad;
    b->relu_fwd = cu_relu_fwd;
    b->relu_bwd = cu_relu_bwd;
    b->softmax_xent = cu_softmax_xent;
    b->im2col = cu_im2col;
    b->col2im = cu_col2im;
    b->maxpool_fwd = cu_maxpool_fwd;
    b->maxpool_bwd = cu_maxpool_bwd;
    b->axpy = cu_axpy;
    b->softmax_xent_async = cu_softmax_xent_async;
    ps_cudnn_attach(b, c, use_tf32); /* conv_* and pool_*, or NULL */
    b->event_create = cu_event_create;
    b->event_destroy = cu_event_destroy;
    b->event_record = cu_event_record;
    b->stream_wait_event = cu_stream_wait_event;
    b->event_sync = cu_event_sync;
    b->event_query = cu_event_query;
    b->stream_sync = cu_stream_sync;
    b->destroy = cu_destroy;
    *out = b;
    return 0;
}
