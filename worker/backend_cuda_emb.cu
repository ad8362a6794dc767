/* The click-through model's kernels on a CUDA backend (client/ps_backend.h:
 * emb_bag_fwd, emb_bag_bwd, interact_fwd, interact_bwd, bce_logits), apart
 * from backend_cuda.cu, which attaches them to every backend it makes
 * (ps_backend_cuda_ctr_attach) with its device and compute stream.
 * backend_cpu.c is the reference the tests compare against.
 *
 * Every sum runs in the order of the CPU loops, each product and sum
 * rounded on its own (__fmul_rn, __fadd_rn: no fused multiply-add, which
 * the CPU build does not use either), so the pooling, the rows' gradients
 * and the interaction equal the CPU's bit for bit on x86-64; the tests
 * still allow a few ulps.  No atomics: the rows' gradients are a gather
 * over a CSR by unique row that the host builds (embedding.c), so a run
 * repeats bit for bit.
 *
 * Launch shapes: one thread per output element (bag x column, row x
 * column, sample x output or sample x vector x column), 256 threads per
 * block, grid-stride loop, the grid capped at what the device keeps
 * resident.  bce_logits: one thread per row in double (as the CPU), then
 * one block reduces the loss and the hits in a fixed order. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend_cuda_impl.h" /* CUDA_CHECK, CUDA_LOG, LAUNCH_CHECK, THREADS */

struct bce_result {
    double loss; /* sum over rows */
    int correct;
};

struct ctr_ctx {
    int device;
    cudaStream_t s; /* the backend's compute stream */
    unsigned max_blocks;
    /* bce_logits with loss/correct: per-row results, reduced by a second
     * kernel; grown like backend_cuda_kernels.cu's softmax scratch */
    double *row_loss;
    int *row_hit;
    size_t row_cap;
    bce_result *d_result; /* device */
    bce_result *h_result; /* pinned host */
};

static ctr_ctx *ctr_of(ps_backend *b) { return (ctr_ctx *)b->ctr_ctx; }

static unsigned grid_for(const ctr_ctx *c, size_t n)
{
    size_t g = (n + THREADS - 1) / THREADS;
    if (g > c->max_blocks)
        g = c->max_blocks;
    return g ? (unsigned)g : 1u;
}

#define GRID_STRIDE(i, n)                                                           \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- embedding bags ------------------------------------------------------ */

static __global__ void k_emb_bag_fwd(int nbags, const int32_t *offsets, const int32_t *index,
                                     const float *weights, int mean, const float *rows, int dim,
                                     float *out, size_t out_stride)
{
    const size_t total = (size_t)nbags * (size_t)dim;
    GRID_STRIDE(i, total)
    {
        const int s = (int)(i / (size_t)dim), j = (int)(i % (size_t)dim);
        const int32_t begin = offsets ? offsets[s] : s, end = offsets ? offsets[s + 1] : s + 1;
        float o = 0.0f;
        int count = 0;
        for (int32_t e = begin; e < end; e++) {
            const int32_t u = index[e];
            if (u < 0)
                continue;
            const float w = weights ? weights[e] : 1.0f;
            o = __fadd_rn(o, __fmul_rn(w, rows[(size_t)u * (size_t)dim + (size_t)j]));
            count++;
        }
        /* as the CPU: a sum or a mean of one row is not multiplied */
        if (mean && count != 1)
            o = __fmul_rn(o, count ? __fdiv_rn(1.0f, (float)count) : 0.0f);
        out[(size_t)s * out_stride + (size_t)j] = o;
    }
}

static __global__ void k_emb_bag_bwd(int nrows, int dim, const int32_t *start, const int32_t *bag,
                                     const float *coef, const float *dout, size_t dout_stride,
                                     float *grads)
{
    const size_t total = (size_t)nrows * (size_t)dim;
    GRID_STRIDE(i, total)
    {
        const size_t u = i / (size_t)dim, j = i % (size_t)dim;
        float g = 0.0f;
        for (int32_t k = start[u]; k < start[u + 1]; k++)
            g = __fadd_rn(g, __fmul_rn(coef[k], dout[(size_t)bag[k] * dout_stride + j]));
        grads[i] = g;
    }
}

static int cu_emb_bag_fwd(ps_backend *b, int nbags, const int32_t *offsets, const int32_t *index,
                          const float *weights, int mean, const float *rows, int dim, float *out,
                          size_t out_stride)
{
    ctr_ctx *c = ctr_of(b);
    if (nbags < 0 || dim < 1 || out_stride < (size_t)dim)
        return PS_EINVAL;
    if (nbags == 0)
        return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t total = (size_t)nbags * (size_t)dim;
    k_emb_bag_fwd<<<grid_for(c, total), THREADS, 0, c->s>>>(nbags, offsets, index, weights, mean,
                                                             rows, dim, out, out_stride);
    LAUNCH_CHECK("k_emb_bag_fwd");
    return 0;
}

static int cu_emb_bag_bwd(ps_backend *b, int nrows, int dim, const int32_t *start,
                          const int32_t *bag, const float *coef, const float *dout,
                          size_t dout_stride, float *grads)
{
    ctr_ctx *c = ctr_of(b);
    if (nrows < 0 || dim < 1)
        return PS_EINVAL;
    if (nrows == 0)
        return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t total = (size_t)nrows * (size_t)dim;
    k_emb_bag_bwd<<<grid_for(c, total), THREADS, 0, c->s>>>(nrows, dim, start, bag, coef, dout,
                                                             dout_stride, grads);
    LAUNCH_CHECK("k_emb_bag_bwd");
    return 0;
}

/* ---- the interaction ------------------------------------------------------- */

/* Pair p of the dot layout: (i, j), j < i, p = i (i - 1) / 2 + j. */
static __device__ __forceinline__ void pair_of(int p, int *i, int *j)
{
    int a = (int)((1.0 + sqrt(1.0 + 8.0 * (double)p)) * 0.5);
    while (a * (a - 1) / 2 > p)
        a--;
    while ((a + 1) * a / 2 <= p)
        a++;
    *i = a;
    *j = p - a * (a - 1) / 2;
}

static __global__ void k_interact_fwd(const float *x, const float *emb, int n, int in, int F,
                                      int E, int dot, int out, float *y)
{
    const size_t total = (size_t)n * (size_t)out;
    GRID_STRIDE(idx, total)
    {
        const size_t s = idx / (size_t)out;
        const int c = (int)(idx % (size_t)out);
        const float *xs = x + s * (size_t)in, *es = emb + s * (size_t)F * (size_t)E;
        float v;
        if (c < in) {
            v = xs[c];
        } else if (!dot) {
            v = es[c - in];
        } else {
            int i, j;
            pair_of(c - in, &i, &j);
            const float *vi = es + (size_t)(i - 1) * E, *vj = j ? es + (size_t)(j - 1) * E : xs;
            v = 0.0f;
            for (int k = 0; k < E; k++)
                v = __fadd_rn(v, __fmul_rn(vi[k], vj[k]));
        }
        y[idx] = v;
    }
}

/* cat: one thread per value of dy, passed through to dx or demb */
static __global__ void k_interact_bwd_cat(const float *dy, int n, int in, int out, float *dx,
                                          float *demb)
{
    const size_t total = (size_t)n * (size_t)out;
    const size_t femb = (size_t)(out - in);
    GRID_STRIDE(idx, total)
    {
        const size_t s = idx / (size_t)out;
        const int c = (int)(idx % (size_t)out);
        if (c < in) {
            if (dx)
                dx[s * (size_t)in + (size_t)c] = dy[idx];
        } else {
            demb[s * femb + (size_t)(c - in)] = dy[idx];
        }
    }
}

/* dot: one thread per (sample, vector m, column k), vector 0 being x (its
 * gradient dx, skipped when NULL).  The CPU adds, for vector m, first the
 * pairs (m, j) for j < m (at i = m), then (i, m) for i > m: so here. */
static __global__ void k_interact_bwd_dot(const float *x, const float *emb, const float *dy,
                                          int n, int F, int E, int out, float *dx, float *demb)
{
    const size_t per = (size_t)(F + 1) * (size_t)E;
    const size_t total = (size_t)n * per;
    GRID_STRIDE(idx, total)
    {
        const size_t s = idx / per;
        const int m = (int)(idx % per / (size_t)E), k = (int)(idx % (size_t)E);
        if (m == 0 && !dx)
            continue;
        const float *xs = x + s * (size_t)E, *es = emb + s * (size_t)F * (size_t)E;
        const float *ds = dy + s * (size_t)out, *dz = ds + E;
        float acc = m == 0 ? ds[k] : 0.0f;
        for (int j = 0; j < m; j++) {
            const float vj = j ? es[(size_t)(j - 1) * E + k] : xs[k];
            acc = __fadd_rn(acc, __fmul_rn(dz[m * (m - 1) / 2 + j], vj));
        }
        for (int i = m + 1; i <= F; i++)
            acc = __fadd_rn(acc, __fmul_rn(dz[i * (i - 1) / 2 + m], es[(size_t)(i - 1) * E + k]));
        if (m == 0)
            dx[s * (size_t)E + (size_t)k] = acc;
        else
            demb[s * (size_t)F * (size_t)E + (size_t)(m - 1) * E + (size_t)k] = acc;
    }
}

static int interact_shape(int n, int in, int F, int E, int dot, int *out)
{
    if (n < 0 || in < 1 || F < 1 || E < 1 || (dot && in != E))
        return PS_EINVAL;
    *out = in + (dot ? (F + 1) * F / 2 : F * E);
    return 0;
}

static int cu_interact_fwd(ps_backend *b, const float *x, const float *emb, int n, int in, int F,
                           int E, int dot, float *y)
{
    ctr_ctx *c = ctr_of(b);
    int out, rc = interact_shape(n, in, F, E, dot, &out);
    if (rc || n == 0)
        return rc;
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t total = (size_t)n * (size_t)out;
    k_interact_fwd<<<grid_for(c, total), THREADS, 0, c->s>>>(x, emb, n, in, F, E, dot, out, y);
    LAUNCH_CHECK("k_interact_fwd");
    return 0;
}

static int cu_interact_bwd(ps_backend *b, const float *x, const float *emb, const float *dy,
                           int n, int in, int F, int E, int dot, float *dx, float *demb)
{
    ctr_ctx *c = ctr_of(b);
    int out, rc = interact_shape(n, in, F, E, dot, &out);
    if (rc || n == 0)
        return rc;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (!dot) {
        size_t total = (size_t)n * (size_t)out;
        k_interact_bwd_cat<<<grid_for(c, total), THREADS, 0, c->s>>>(dy, n, in, out, dx, demb);
        LAUNCH_CHECK("k_interact_bwd_cat");
    } else {
        size_t total = (size_t)n * (size_t)(F + 1) * (size_t)E;
        k_interact_bwd_dot<<<grid_for(c, total), THREADS, 0, c->s>>>(x, emb, dy, n, F, E, out, dx,
                                                                      demb);
        LAUNCH_CHECK("k_interact_bwd_dot");
    }
    return 0;
}

/* ---- binary cross-entropy ---------------------------------------------------- */

/* The CPU's arithmetic, in double: dlogits = (sigmoid(z) - y) / n, the
 * row's loss max(z, 0) - z y + log(1 + e^-|z|) and hit.  A label other than
 * 0 or 1 gets a NaN gradient and loss (the labels are not read back). */
static __global__ void k_bce(const float *logits, const int32_t *labels, int n, float inv_n,
                             float *dlogits, double *row_loss, int *row_hit)
{
    GRID_STRIDE(r, (size_t)n)
    {
        const int32_t lab = labels[r];
        const double z = logits[r], y = lab;
        if (lab != 0 && lab != 1) {
            dlogits[r] = __int_as_float(0x7fc00000);
            if (row_loss) {
                row_loss[r] = __longlong_as_double(0x7ff8000000000000ll);
                row_hit[r] = 0;
            }
            continue;
        }
        const double t = exp(-fabs(z));
        const double p = z >= 0 ? 1.0 / (1.0 + t) : t / (1.0 + t);
        dlogits[r] = __fmul_rn((float)(p - y), inv_n);
        if (row_loss) {
            row_loss[r] = __dadd_rn(__dsub_rn(z > 0 ? z : 0.0, __dmul_rn(z, y)), log1p(t));
            row_hit[r] = (z > 0) == (lab == 1);
        }
    }
}

/* One block: each thread sums a strided slice in order, then a fixed tree. */
static __global__ void k_bce_reduce(const double *row_loss, const int *row_hit, int n,
                                    bce_result *out)
{
    __shared__ double ls[THREADS];
    __shared__ int hs[THREADS];
    double l = 0.0;
    int h = 0;
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        l += row_loss[r];
        h += row_hit[r];
    }
    ls[threadIdx.x] = l;
    hs[threadIdx.x] = h;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            ls[threadIdx.x] += ls[threadIdx.x + w];
            hs[threadIdx.x] += hs[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out->loss = ls[0];
        out->correct = hs[0];
    }
}

static int cu_bce_logits(ps_backend *b, const float *logits, const int32_t *labels, int n,
                         float *dlogits, float *loss, int *correct)
{
    ctr_ctx *c = ctr_of(b);
    if (n <= 0)
        return PS_EINVAL;
    CUDA_CHECK(cudaSetDevice(c->device));
    const bool want = loss || correct;
    if (want && (size_t)n > c->row_cap) {
        /* every earlier use with a result ended in a stream sync, and one
         * without never touches these: the old buffers are idle */
        size_t cap = c->row_cap ? c->row_cap : 256;
        while (cap < (size_t)n)
            cap *= 2;
        CUDA_CHECK(cudaFree(c->row_loss));
        CUDA_CHECK(cudaFree(c->row_hit));
        c->row_loss = NULL;
        c->row_hit = NULL;
        c->row_cap = 0;
        CUDA_CHECK(cudaMalloc((void **)&c->row_loss, cap * sizeof(double)));
        CUDA_CHECK(cudaMalloc((void **)&c->row_hit, cap * sizeof(int)));
        c->row_cap = cap;
    }
    k_bce<<<grid_for(c, (size_t)n), THREADS, 0, c->s>>>(logits, labels, n, 1.0f / (float)n,
                                                         dlogits, want ? c->row_loss : NULL,
                                                         want ? c->row_hit : NULL);
    LAUNCH_CHECK("k_bce");
    if (!want)
        return 0;
    k_bce_reduce<<<1, THREADS, 0, c->s>>>(c->row_loss, c->row_hit, n, c->d_result);
    LAUNCH_CHECK("k_bce_reduce");
    CUDA_CHECK(cudaMemcpyAsync(c->h_result, c->d_result, sizeof(bce_result),
                               cudaMemcpyDeviceToHost, c->s));
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    if (loss)
        *loss = (float)(c->h_result->loss / n);
    if (correct)
        *correct = c->h_result->correct;
    return 0;
}

/* ---- attach / detach ------------------------------------------------------------ */

extern "C" void ps_backend_cuda_ctr_detach(ps_backend *b)
{
    ctr_ctx *c = b ? ctr_of(b) : NULL;
    if (!c)
        return;
    CUDA_LOG(cudaSetDevice(c->device));
    if (c->s)
        CUDA_LOG(cudaStreamSynchronize(c->s));
    if (c->row_loss)
        CUDA_LOG(cudaFree(c->row_loss));
    if (c->row_hit)
        CUDA_LOG(cudaFree(c->row_hit));
    if (c->d_result)
        CUDA_LOG(cudaFree(c->d_result));
    if (c->h_result)
        CUDA_LOG(cudaFreeHost(c->h_result));
    free(c);
    b->ctr_ctx = NULL;
}

extern "C" int ps_backend_cuda_ctr_attach(ps_backend *b, int device, void *compute_stream,
                                          unsigned max_blocks)
{
    ctr_ctx *c = (ctr_ctx *)calloc(1, sizeof *c);
    if (!c)
        return PS_ENOMEM;
    c->device = device;
    c->s = (cudaStream_t)compute_stream;
    c->max_blocks = max_blocks ? max_blocks : 1;
    b->ctr_ctx = c; /* from here on detach frees what there is */
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaMalloc((void **)&c->d_result, sizeof(bce_result)));
    CUDA_CHECK(cudaHostAlloc((void **)&c->h_result, sizeof(bce_result), cudaHostAllocDefault));
    b->emb_bag_fwd = cu_emb_bag_fwd;
    b->emb_bag_bwd = cu_emb_bag_bwd;
    b->interact_fwd = cu_interact_fwd;
    b->interact_bwd = cu_interact_bwd;
    b->bce_logits = cu_bce_logits;
    return 0;
}
