/* The CUDA backend's own kernels and the entry points that launch them
 * (client/ps_backend.h: fill, bias_add, bias_grad, relu_fwd, relu_bwd,
 * softmax_xent, im2col, col2im, maxpool_fwd, maxpool_bwd, axpy), apart from
 * backend_cuda.cu (memory, cuBLAS, events, create), which attaches them to
 * every backend it makes (ps_cuda_kernels_attach).  backend_cpu.c is the
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
 * softmax_xent with loss/correct uses per-backend scratch (cuda_ctx) and must
 * not run concurrently with itself. */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "backend_cuda_impl.h"

/* ---- launch shapes (the backend's state, THREADS: backend_cuda_impl.h) ---- */

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

/* ---- fill -------------------------------------------------------------- */

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

/* ---- attach ------------------------------------------------------------ */

void ps_cuda_kernels_attach(ps_backend *b)
{
    b->fill = cu_fill;
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
}
