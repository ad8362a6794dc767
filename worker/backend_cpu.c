/* CPU backend: OpenBLAS for gemm, plain loops (left for gcc to vectorize) for
 * the elementwise kernels.  Everything runs on the calling thread (plus the
 * BLAS threads inside gemm) and is complete when the call returns, so copies
 * are memcpy, streams are no-ops and events are always signalled: those are
 * the host backend's (backend_host.c), which this one starts from. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend.h"
#include "ps_error.h"
#include "ps_exchange.h"

/* Declared by OpenBLAS's cblas.h; repeated so a reference-CBLAS header (which
 * lacks it) still compiles.  Identical redeclarations are harmless. */
void openblas_set_num_threads(int num_threads);

static int cpu_gemm(ps_backend *b, int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)b;
    if (M < 0 || N < 0 || K < 0)
        return PS_EINVAL;
    /* Row strides as stored: op(A) is M x K, so A is M x K (lda >= K) or
     * K x M (lda >= M) when transposed; likewise B. */
    int a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (N > 1 ? N : 1))
        return PS_EINVAL;
    if (M == 0 || N == 0)
        return 0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

static int cpu_bias_add(ps_backend *b, float *y, const float *bias, int outer, int channels,
                        int inner)
{
    (void)b;
    if (outer < 0 || channels < 0 || inner < 0)
        return PS_EINVAL;
    if (inner == 1) { /* a dense layer's: whole rows, so the loop over c vectorizes */
        for (int o = 0; o < outer; o++) {
            float *restrict row = y + (size_t)o * channels;
            for (int c = 0; c < channels; c++)
                row[c] += bias[c];
        }
        return 0;
    }
    for (int o = 0; o < outer; o++)
        for (int c = 0; c < channels; c++) {
            float *row = y + ((size_t)o * channels + c) * inner;
            float v = bias[c];
            for (int i = 0; i < inner; i++)
                row[i] += v;
        }
    return 0;
}

static int cpu_bias_grad(ps_backend *b, float *db, const float *dy, int outer, int channels,
                         int inner)
{
    (void)b;
    if (outer < 0 || channels < 0 || inner < 0)
        return PS_EINVAL;
    for (int c = 0; c < channels; c++)
        db[c] = 0.0f;
    if (inner == 1) { /* a dense layer's: the same sums, in the same order, a row at a time */
        for (int o = 0; o < outer; o++) {
            const float *restrict row = dy + (size_t)o * channels;
            for (int c = 0; c < channels; c++)
                db[c] += row[c];
        }
        return 0;
    }
    for (int o = 0; o < outer; o++)
        for (int c = 0; c < channels; c++) {
            const float *row = dy + ((size_t)o * channels + c) * inner;
            float s = 0.0f;
            for (int i = 0; i < inner; i++)
                s += row[i];
            db[c] += s;
        }
    return 0;
}

static int cpu_relu_fwd(ps_backend *b, float *y, const float *x, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    return 0;
}

static int cpu_relu_bwd(ps_backend *b, float *dx, const float *dy, const float *y, size_t n)
{
    (void)b;
    /* dy read unconditionally: a select, not a branch the sign of each
     * activation mispredicts, and the loop vectorizes */
    for (size_t i = 0; i < n; i++) {
        float d = dy[i];
        dx[i] = y[i] > 0.0f ? d : 0.0f;
    }
    return 0;
}

static int cpu_softmax_xent(ps_backend *b, const float *logits, const int32_t *labels, int n,
                            int classes, float *dlogits, float *loss, int *correct)
{
    (void)b;
    if (n <= 0 || classes <= 0)
        return PS_EINVAL;
    for (int r = 0; r < n; r++)
        if (labels[r] < 0 || labels[r] >= classes)
            return PS_EINVAL;
    double total = 0.0;
    int hits = 0;
    float inv_n = 1.0f / (float)n;
    for (int r = 0; r < n; r++) {
        const float *z = logits + (size_t)r * classes;
        float *d = dlogits + (size_t)r * classes;
        /* Subtracting the row max keeps every exp() argument <= 0, so logits
         * of 1e4 neither overflow nor turn the sum into inf/inf = NaN. */
        float mx = z[0];
        int arg = 0;
        for (int c = 1; c < classes; c++)
            if (z[c] > mx) {
                mx = z[c];
                arg = c;
            }
        double sum = 0.0;
        for (int c = 0; c < classes; c++)
            sum += exp((double)z[c] - (double)mx);
        double lse = (double)mx + log(sum);
        int y = labels[r];
        total += lse - (double)z[y];
        hits += arg == y;
        for (int c = 0; c < classes; c++) {
            float p = (float)exp((double)z[c] - lse);
            d[c] = (p - (c == y ? 1.0f : 0.0f)) * inv_n;
        }
    }
    if (loss)
        *loss = (float)(total / n);
    if (correct)
        *correct = hits;
    return 0;
}

/* The output size of a k x k, stride 1 convolution over C x H x W padded
 * by pad on each side: 0, or PS_EINVAL when there is no such output. */
static int conv_out_size(int C, int H, int W, int k, int pad, int *OH, int *OW)
{
    if (C <= 0 || H <= 0 || W <= 0 || k <= 0 || pad < 0)
        return PS_EINVAL;
    *OH = H + 2 * pad - k + 1;
    *OW = W + 2 * pad - k + 1;
    return *OH > 0 && *OW > 0 ? 0 : PS_EINVAL;
}

static int cpu_im2col(ps_backend *b, const float *x, int C, int H, int W, int k, int pad,
                      float *col)
{
    (void)b;
    int OH, OW;
    if (conv_out_size(C, H, W, k, pad, &OH, &OW) != 0)
        return PS_EINVAL;
    size_t plane = (size_t)OH * OW;
    for (int c = 0; c < C; c++)
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                float *row = col + ((size_t)(c * k + ky) * k + kx) * plane;
                for (int oy = 0; oy < OH; oy++) {
                    int iy = oy + ky - pad;
                    float *out = row + (size_t)oy * OW;
                    if (iy < 0 || iy >= H) {
                        for (int ox = 0; ox < OW; ox++)
                            out[ox] = 0.0f;
                        continue;
                    }
                    /* three runs, no branch per element: zeros left of the
                     * image, a copy of the row, zeros right of it */
                    const float *in = x + ((size_t)c * H + iy) * W;
                    int lo = pad - kx, hi = W + pad - kx; /* ox in [lo, hi) reads the image */
                    lo = lo < 0 ? 0 : lo > OW ? OW : lo;
                    hi = hi < lo ? lo : hi > OW ? OW : hi;
                    for (int ox = 0; ox < lo; ox++)
                        out[ox] = 0.0f;
                    memcpy(out + lo, in + lo + kx - pad, (size_t)(hi - lo) * sizeof(float));
                    for (int ox = hi; ox < OW; ox++)
                        out[ox] = 0.0f;
                }
            }
    return 0;
}

static int cpu_col2im(ps_backend *b, const float *col, int C, int H, int W, int k, int pad,
                      float *dx)
{
    (void)b;
    int OH, OW;
    if (conv_out_size(C, H, W, k, pad, &OH, &OW) != 0)
        return PS_EINVAL;
    size_t plane = (size_t)OH * OW;
    memset(dx, 0, (size_t)C * H * W * sizeof *dx);
    for (int c = 0; c < C; c++)
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const float *row = col + ((size_t)(c * k + ky) * k + kx) * plane;
                for (int oy = 0; oy < OH; oy++) {
                    int iy = oy + ky - pad;
                    if (iy < 0 || iy >= H)
                        continue;
                    const float *in = row + (size_t)oy * OW;
                    float *out = dx + ((size_t)c * H + iy) * W;
                    for (int ox = 0; ox < OW; ox++) {
                        int ix = ox + kx - pad;
                        if (ix >= 0 && ix < W)
                            out[ix] += in[ox];
                    }
                }
            }
    return 0;
}

static int cpu_maxpool_fwd(ps_backend *b, const float *x, int NC, int H, int W, float *y,
                           uint8_t *argmax)
{
    (void)b;
    if (NC < 0 || H <= 0 || W <= 0 || H % 2 || W % 2)
        return PS_EINVAL;
    int OH = H / 2, OW = W / 2;
    for (int p = 0; p < NC; p++) {
        const float *in = x + (size_t)p * H * W;
        float *out = y + (size_t)p * OH * OW;
        uint8_t *am = argmax + (size_t)p * OH * OW;
        for (int oy = 0; oy < OH; oy++) {
            const float *r0 = in + (size_t)(2 * oy) * W, *r1 = r0 + W;
            float *o = out + (size_t)oy * OW;
            uint8_t *a = am + (size_t)oy * OW;
            for (int ox = 0; ox < OW; ox++) {
                /* first maximum wins on ties (and a NaN in front stays), like
                 * the CUDA kernel: the pairs, then the better pair, strictly */
                float v0 = r0[2 * ox], v1 = r0[2 * ox + 1], v2 = r1[2 * ox], v3 = r1[2 * ox + 1];
                int i01 = v1 > v0, i23 = v3 > v2;
                float m01 = i01 ? v1 : v0, m23 = i23 ? v3 : v2;
                int second = m23 > m01;
                o[ox] = second ? m23 : m01;
                a[ox] = (uint8_t)(second ? 2 + i23 : i01);
            }
        }
    }
    return 0;
}

static int cpu_maxpool_bwd(ps_backend *b, const float *dy, const uint8_t *argmax, int NC, int H,
                           int W, float *dx)
{
    (void)b;
    if (NC < 0 || H <= 0 || W <= 0 || H % 2 || W % 2)
        return PS_EINVAL;
    int OH = H / 2, OW = W / 2;
    for (int p = 0; p < NC; p++) {
        const float *g = dy + (size_t)p * OH * OW;
        const uint8_t *am = argmax + (size_t)p * OH * OW;
        float *out = dx + (size_t)p * H * W;
        /* windows do not overlap, so writing all four entries of each window
         * overwrites dx completely without a separate zeroing pass */
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float *r0 = out + (size_t)(2 * oy) * W + 2 * ox, *r1 = r0 + W;
                float v = g[oy * OW + ox];
                int a = am[oy * OW + ox];
                r0[0] = a == 0 ? v : 0.0f;
                r0[1] = a == 1 ? v : 0.0f;
                r1[0] = a == 2 ? v : 0.0f;
                r1[1] = a == 3 ? v : 0.0f;
            }
    }
    return 0;
}

/* ---- the click-through model ------------------------------------------- */

static int cpu_emb_bag_fwd(ps_backend *b, int nbags, const int32_t *offsets,
                           const int32_t *index, const float *weights, int mean,
                           const float *rows, int dim, float *out, size_t out_stride)
{
    (void)b;
    if (nbags < 0 || dim < 1)
        return PS_EINVAL;
    for (int s = 0; s < nbags; s++) {
        float *o = out + (size_t)s * out_stride;
        int32_t begin = offsets ? offsets[s] : s, end = offsets ? offsets[s + 1] : s + 1;
        int count = 0;
        for (int j = 0; j < dim; j++)
            o[j] = 0.0f;
        for (int32_t e = begin; e < end; e++) {
            if (index[e] < 0)
                continue;
            const float *r = rows + (size_t)index[e] * dim;
            float w = weights ? weights[e] : 1.0f;
            count++;
            for (int j = 0; j < dim; j++)
                o[j] += w * r[j];
        }
        /* a mean of one row or a sum: no multiply (as the CUDA kernel) */
        float scale = !mean ? 1.0f : count ? 1.0f / (float)count : 0.0f;
        if (scale != 1.0f)
            for (int j = 0; j < dim; j++)
                o[j] *= scale;
    }
    return 0;
}

static int cpu_emb_bag_bwd(ps_backend *b, int nrows, int dim, const int32_t *start,
                           const int32_t *bag, const float *coef, const float *dout,
                           size_t dout_stride, float *grads)
{
    (void)b;
    if (nrows < 0 || dim < 1)
        return PS_EINVAL;
    for (int u = 0; u < nrows; u++) {
        float *g = grads + (size_t)u * dim;
        for (int j = 0; j < dim; j++)
            g[j] = 0.0f;
        for (int32_t k = start[u]; k < start[u + 1]; k++) {
            const float *d = dout + (size_t)bag[k] * dout_stride;
            for (int j = 0; j < dim; j++)
                g[j] += coef[k] * d[j];
        }
    }
    return 0;
}

static int cpu_interact_fwd(ps_backend *b, const float *x, const float *emb, int n, int in,
                            int F, int E, int dot, float *y)
{
    (void)b;
    if (n < 0 || in < 1 || F < 1 || E < 1 || (dot && in != E))
        return PS_EINVAL;
    int out = in + (dot ? (F + 1) * F / 2 : F * E);
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * in, *es = emb + (size_t)s * F * E;
        float *ys = y + (size_t)s * out;
        memcpy(ys, xs, (size_t)in * sizeof(float));
        if (!dot) {
            memcpy(ys + in, es, (size_t)F * E * sizeof(float));
            continue;
        }
        float *z = ys + in;
        for (int i = 1; i <= F; i++) {
            const float *vi = es + (size_t)(i - 1) * E;
            for (int j = 0; j < i; j++) {
                const float *vj = j ? es + (size_t)(j - 1) * E : xs;
                float d = 0.0f;
                for (int k = 0; k < E; k++)
                    d += vi[k] * vj[k];
                *z++ = d;
            }
        }
    }
    return 0;
}

/* The copied parts pass their gradient through; a dot d = vi.vj sends
 * dd * vj to vi and dd * vi to vj. */
static int cpu_interact_bwd(ps_backend *b, const float *x, const float *emb, const float *dy,
                            int n, int in, int F, int E, int dot, float *dx, float *demb)
{
    (void)b;
    if (n < 0 || in < 1 || F < 1 || E < 1 || (dot && in != E))
        return PS_EINVAL;
    int out = in + (dot ? (F + 1) * F / 2 : F * E);
    for (int s = 0; s < n; s++) {
        const float *xs = x + (size_t)s * in, *es = emb + (size_t)s * F * E;
        const float *ds = dy + (size_t)s * out;
        float *des = demb + (size_t)s * F * E, *dxs = dx ? dx + (size_t)s * in : NULL;
        if (dxs)
            memcpy(dxs, ds, (size_t)in * sizeof(float));
        if (!dot) {
            memcpy(des, ds + in, (size_t)F * E * sizeof(float));
            continue;
        }
        memset(des, 0, (size_t)F * E * sizeof(float));
        const float *dz = ds + in;
        for (int i = 1; i <= F; i++) {
            const float *vi = es + (size_t)(i - 1) * E;
            float *dvi = des + (size_t)(i - 1) * E;
            for (int j = 0; j < i; j++) {
                const float *vj = j ? es + (size_t)(j - 1) * E : xs;
                float *dvj = j ? des + (size_t)(j - 1) * E : dxs;
                float g = *dz++;
                for (int k = 0; k < E; k++)
                    dvi[k] += g * vj[k];
                if (dvj)
                    for (int k = 0; k < E; k++)
                        dvj[k] += g * vi[k];
            }
        }
    }
    return 0;
}

static int cpu_bce_logits(ps_backend *b, const float *logits, const int32_t *labels, int n,
                          float *dlogits, float *loss, int *correct)
{
    (void)b;
    if (n <= 0)
        return PS_EINVAL;
    for (int r = 0; r < n; r++)
        if (labels[r] != 0 && labels[r] != 1)
            return PS_EINVAL;
    double total = 0.0;
    int hits = 0;
    float inv_n = 1.0f / (float)n;
    for (int r = 0; r < n; r++) {
        double z = logits[r], y = labels[r];
        /* e^-|z| never overflows; log1p keeps the loss of a confident right
         * answer (tiny e^-|z|) from rounding to 0 */
        double t = exp(-fabs(z));
        total += (z > 0 ? z : 0) - z * y + log1p(t);
        double p = z >= 0 ? 1.0 / (1.0 + t) : t / (1.0 + t); /* sigmoid(z) */
        dlogits[r] = (float)(p - y) * inv_n;
        hits += (z > 0) == (labels[r] == 1);
    }
    if (loss)
        *loss = (float)(total / n);
    if (correct)
        *correct = hits;
    return 0;
}

int ps_backend_cpu_create(int threads, ps_backend **out)
{
    if (!out)
        return PS_EINVAL;
    /* memory, copies, streams and events are the host backend's: CPU work is
     * complete when a call returns */
    int rc = ps_backend_host_create(out);
    if (rc)
        return rc;
    ps_backend *b = *out;
    /* OpenBLAS's thread count is process-wide; the last backend created wins. */
    openblas_set_num_threads(threads > 0 ? threads : 1);
    b->name = "cpu";
    b->gemm = cpu_gemm;
    b->bias_add = cpu_bias_add;
    b->bias_grad = cpu_bias_grad;
    b->relu_fwd = cpu_relu_fwd;
    b->relu_bwd = cpu_relu_bwd;
    b->softmax_xent = cpu_softmax_xent;
    b->im2col = cpu_im2col;
    b->col2im = cpu_col2im;
    b->maxpool_fwd = cpu_maxpool_fwd;
    b->maxpool_bwd = cpu_maxpool_bwd;
    b->emb_bag_fwd = cpu_emb_bag_fwd;
    b->emb_bag_bwd = cpu_emb_bag_bwd;
    b->interact_fwd = cpu_interact_fwd;
    b->interact_bwd = cpu_interact_bwd;
    b->bce_logits = cpu_bce_logits;
    return 0;
}
