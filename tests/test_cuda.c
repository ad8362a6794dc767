/* The CUDA backend against the CPU backend: every operation on the same random
 * inputs, results compared element by element.
 *
 * Error bounds (u = 2^-24, the float unit roundoff).  Each bound covers both
 * backends' rounding, so it is twice one side's worst case:
 *   exact (bit for bit, compared with ==): fill, copies, bias_add (one add of
 *     the same operands), relu fwd/bwd, im2col (copies), maxpool fwd (values
 *     and argmax) and bwd, softmax_xent's `correct` (argmax of the inputs).
 *   gemm:       |g - c| <= 2 (K + 2) u * S,  S = |alpha| |op(A)| |op(B)| + |beta| |C0|
 *               (classic sum-of-products bound; with PS_CUDA_TF32=1 the GPU
 *               rounds A and B to 10 mantissa bits, so 2^-9 S is added)
 *   bias_grad:  |g - c| <= 2 m u * sum |dy|, m = outer * inner terms per channel
 *   col2im:     |g - c| <= 2 k^2 u * (col2im of |col|), at most k^2 terms a pixel
 *   axpy:       |g - c| <= 4 u * (|y| + |alpha x|)  (GPU fuses multiply-add)
 *   softmax_xent dlogits: |g - c| <= 2 (classes + 64) u * (|d| + onehot / n)
 *               (exp/log of the GPU within 2 ulp, the row sum within classes u)
 *   softmax_xent loss:    |g - c| <= 2 (classes + 16) u * max(1, loss)
 *   cuDNN (the layers on a backend with conv_fwd etc. against the CPU's
 *   im2col + gemm): y, dx, dW, db each |g - c| <= 2 (K + 2) u * S, S the
 *   same layer run on the CPU with |x|, |W|, |b|, |dy| and K its terms
 *   (forward C k^2, backward data K_out k^2, filter and bias n OH OW); exact
 *   FP32 takes only gemm-like algorithms, for which this classic bound holds.
 *   With PS_CUDA_TF32=1 inputs round to 10 mantissa bits and cuDNN may use
 *   FFT or Winograd transforms: 2^-9 S + 2^-12 max(S) is added.  Max-pool
 *   forward and backward: exact (inputs all distinct, so no ties).
 *   A whole CNN step with cuDNN and with PS_CUDNN=0: the loss within
 *   1e-5 max(1, loss) (TF32 2e-3); each gradient within 5e-3 of its norm
 *   (TF32 1e-1) in the 2-norm, since a ReLU input within rounding of 0, or
 *   a max-pool window of near-equal entries, may choose differently on one
 *   path and move a few terms of a weight's gradient.
 *   embedding bags, interact: |g - c| <= 2 (m + 2) u * (the same on |inputs|),
 *               m the terms of the longest sum (the kernels keep the CPU's
 *               order without fused multiply-adds: equal on x86-64 in fact)
 *   bce_logits dlogits: |g - c| <= 8 u (|d| + 1/n) (exp of the GPU within 1
 *               ulp in double, then rounded to float); loss within 1e-6
 *               relative; `correct` exact
 *   a CTR step (embeddings, interaction, MLPs, BCE, SGD on weights and rows)
 *               CUDA vs CPU after 3 steps: every weight and row within
 *               1e-5 + 1e-4 |cpu| (gemm's order differs: measured ~1e-7);
 *               with PS_CUDA_TF32=1 (gemm inputs to 10 mantissa bits)
 *               1e-3 + 1e-2 |cpu|
 *
 * Without a CUDA build or a usable device every case is skipped. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "embedding.h"
#include "layers.h"
#include "model.h"
#include "ps_error.h"
#include "ps_test.h"

#define U 0x1p-24

/* ---- the two backends, made once --------------------------------------- */

static ps_backend *g_cpu, *g_gpu;
static int g_tried;

/* Everything a case allocates goes here and is freed by the next case's set-up
 * (or at exit), so a CHECK that returns early leaks nothing. */
enum { ARENA_MAX = 1024 };
static struct {
    ps_backend *b; /* NULL: malloc'd host memory */
    int pinned;
    void *p;
} g_arena[ARENA_MAX];
static int g_narena;

static void arena_reset(void)
{
    for (int i = g_narena - 1; i >= 0; i--) {
        if (!g_arena[i].b)
            free(g_arena[i].p);
        else if (g_arena[i].pinned)
            g_arena[i].b->free_host(g_arena[i].b, g_arena[i].p);
        else
            g_arena[i].b->free(g_arena[i].b, g_arena[i].p);
    }
    g_narena = 0;
}

static void teardown(void)
{
    arena_reset();
    if (g_gpu)
        g_gpu->destroy(g_gpu);
    if (g_cpu)
        g_cpu->destroy(g_cpu);
    g_gpu = g_cpu = NULL;
}

static int setup(void)
{
    arena_reset();
    if (!g_tried) {
        g_tried = 1;
#ifdef PS_HAVE_CUDA
        char why[256];
        if (ps_backend_cuda_create(0, &g_gpu, why, sizeof why) != 0) {
            fprintf(stderr, "test_cuda: %s\n", why);
            g_gpu = NULL;
        } else if (ps_backend_cpu_create(1, &g_cpu) != 0) {
            fprintf(stderr, "test_cuda: the CPU backend failed to start\n");
            g_gpu->destroy(g_gpu);
            g_gpu = NULL;
        }
#else
        fprintf(stderr, "test_cuda: built without the CUDA backend (no nvcc, or CUDA=0)\n");
#endif
        /* registered after the CUDA runtime's own exit handler, so it runs
         * first, while the device is still there */
        atexit(teardown);
    }
    return g_gpu && g_cpu;
}

#define NEED_GPU()                                                                   \
    do {                                                                             \
        if (!setup())                                                                \
            SKIP("skipped: no CUDA device");                                                  \
    } while (0)

static void *track(ps_backend *b, int pinned, void *p)
{
    if (p && g_narena < ARENA_MAX) {
        g_arena[g_narena].b = b;
        g_arena[g_narena].pinned = pinned;
        g_arena[g_narena].p = p;
        g_narena++;
        return p;
    }
    if (p) { /* arena full: a test bug; hand back nothing so the CHECK fails */
        if (!b)
            free(p);
        else if (pinned)
            b->free_host(b, p);
        else
            b->free(b, p);
    }
    return NULL;
}

static void *host(size_t bytes) { return track(NULL, 0, malloc(bytes ? bytes : 1)); }

static void *dev(ps_backend *b, size_t bytes)
{
    void *p = NULL;
    if (b->alloc(b, bytes, &p) != 0)
        return NULL;
    return track(b, 0, p);
}

static void *pinned(ps_backend *b, size_t bytes)
{
    void *p = NULL;
    if (b->alloc_host(b, bytes, &p) != 0)
        return NULL;
    return track(b, 1, p);
}

/* host -> device on the copy stream, complete on return */
static int up(ps_backend *b, void *d, const void *h, size_t bytes)
{
    int rc = b->copy(b, d, h, bytes, 0, PS_STREAM_COPY);
    return rc ? rc : b->stream_sync(b, PS_STREAM_COPY);
}

/* device -> host on the compute stream, so it follows the kernels */
static int down(ps_backend *b, void *h, const void *d, size_t bytes)
{
    int rc = b->copy(b, h, d, bytes, 1, PS_STREAM_COMPUTE);
    return rc ? rc : b->stream_sync(b, PS_STREAM_COMPUTE);
}

/* A device copy of host data on each backend. */
typedef struct {
    void *c, *g;
} pair;

static int pair_up(pair *p, const void *h, size_t bytes)
{
    p->c = dev(g_cpu, bytes);
    p->g = dev(g_gpu, bytes);
    if (!p->c || !p->g)
        return PS_ENOMEM;
    int rc = up(g_cpu, p->c, h, bytes);
    return rc ? rc : up(g_gpu, p->g, h, bytes);
}

/* Both results back to host buffers (allocated here). */
static int pair_down(const pair *p, size_t bytes, void **hc, void **hg)
{
    *hc = host(bytes);
    *hg = host(bytes);
    if (!*hc || !*hg)
        return PS_ENOMEM;
    int rc = down(g_cpu, *hc, p->c, bytes);
    return rc ? rc : down(g_gpu, *hg, p->g, bytes);
}

/* ---- random inputs and comparisons ------------------------------------- */

static uint64_t g_rng;

static void seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 1; }

/* uniform in [-1, 1) */
static float rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545F4914F6CDD1Dull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static float *rnd_host(size_t n, float scale)
{
    float *h = host(n * sizeof(float));
    if (h)
        for (size_t i = 0; i < n; i++)
            h[i] = scale * rnd();
    return h;
}

static float *abs_host(const float *x, size_t n)
{
    float *h = host(n * sizeof(float));
    if (h)
        for (size_t i = 0; i < n; i++)
            h[i] = fabsf(x[i]);
    return h;
}

/* First index where g and c differ (==), or -1. */
static long diff_exact(const float *g, const float *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(g[i] == c[i]))
            return (long)i;
    return -1;
}

/* First index where |g - c| > tol * scale, or -1 (NaN counts as outside). */
static long diff_bound(const float *g, const float *c, const float *scale, double tol, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)g[i] - (double)c[i]) <= tol * (double)scale[i]))
            return (long)i;
    return -1;
}

#define CHECK_EXACT(g, c, n)                                                          \
    do {                                                                              \
        long at_ = diff_exact((g), (c), (n));                                         \
        CHECK_MSG(at_ < 0, "element %ld: gpu %.9g, cpu %.9g", at_, (double)(g)[at_],  \
                  (double)(c)[at_]);                                                  \
    } while (0)

#define CHECK_BOUND(g, c, scale, tol, n)                                              \
    do {                                                                              \
        long at_ = diff_bound((g), (c), (scale), (tol), (n));                         \
        CHECK_MSG(at_ < 0, "element %ld: gpu %.9g, cpu %.9g, bound %.3g", at_,        \
                  (double)(g)[at_], (double)(c)[at_], (tol) * (double)(scale)[at_]);  \
    } while (0)

/* ---- gemm -------------------------------------------------------------- */

static int tf32_on(void)
{
    const char *e = getenv("PS_CUDA_TF32");
    return e && strcmp(e, "1") == 0;
}

/* One gemm on both backends with padded row strides; the padding must come
 * back untouched.  A failure stops the running case (ps_test_stopped()). */
static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta)
{
    int a_rows = ta ? K : M, a_cols = ta ? M : K;
    int b_rows = tb ? N : K, b_cols = tb ? K : N;
    int lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
    size_t na = (size_t)a_rows * lda, nb = (size_t)b_rows * ldb, nc = (size_t)M * ldc;
    float *A = rnd_host(na, 1.0f), *B = rnd_host(nb, 1.0f), *C0 = rnd_host(nc, 1.0f);
    CHECK(A && B && C0);
    pair a, b, c;
    CHECK_OK(pair_up(&a, A, na * sizeof(float)));
    CHECK_OK(pair_up(&b, B, nb * sizeof(float)));
    CHECK_OK(pair_up(&c, C0, nc * sizeof(float)));
    CHECK_OK(g_cpu->gemm(g_cpu, ta, tb, M, N, K, alpha, a.c, lda, b.c, ldb, beta, c.c, ldc));
    CHECK_OK(g_gpu->gemm(g_gpu, ta, tb, M, N, K, alpha, a.g, lda, b.g, ldb, beta, c.g, ldc));
    float *hc, *hg;
    CHECK_OK(pair_down(&c, nc * sizeof(float), (void **)&hc, (void **)&hg));
    /* S = |alpha| |op(A)| |op(B)| + |beta| |C0|, on the CPU */
    float *S = abs_host(C0, nc), *aA = abs_host(A, na), *aB = abs_host(B, nb);
    CHECK(S && aA && aB);
    CHECK_OK(g_cpu->gemm(g_cpu, ta, tb, M, N, K, fabsf(alpha), aA, lda, aB, ldb, fabsf(beta),
                         S, ldc));
    double tol = 2.0 * (K + 2) * U + (tf32_on() ? 0x1p-9 : 0.0);
    CHECK_BOUND(hg, hc, S, tol, nc);
}

PS_TEST(gemm_all_transposes_odd_sizes_match_cpu)
{
    NEED_GPU();
    seed(1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ta, tb, 37, 53, 29, 0.75f, -0.5f);
            if (ps_test_stopped())
                return;
            gemm_case(ta, tb, 1, 7, 3, 1.0f, 1.0f);
            if (ps_test_stopped())
                return;
        }
}

PS_TEST(gemm_large_beta_zero_matches_cpu)
{
    NEED_GPU();
    seed(2);
    gemm_case(0, 0, 257, 129, 300, 1.0f, 0.0f);
    if (ps_test_stopped())
        return;
    gemm_case(1, 0, 65, 300, 511, 0.5f, 0.0f); /* the weight-gradient shape */
}

/* ---- elementwise pieces ------------------------------------------------ */

PS_TEST(fill_sets_every_element)
{
    NEED_GPU();
    size_t n = 10007;
    float *want = host(n * sizeof(float)), *got = host(n * sizeof(float));
    float *d = dev(g_gpu, n * sizeof(float));
    CHECK(want && got && d);
    for (size_t i = 0; i < n; i++)
        want[i] = 3.25f;
    CHECK_OK(g_gpu->fill(g_gpu, d, 3.25f, n));
    CHECK_OK(down(g_gpu, got, d, n * sizeof(float)));
    CHECK_EXACT(got, want, n);
}

static void bias_add_case(int outer, int channels, int inner)
{
    size_t n = (size_t)outer * channels * inner;
    float *Y = rnd_host(n, 1.0f), *Bi = rnd_host((size_t)channels, 1.0f);
    CHECK(Y && Bi);
    pair y, bias;
    CHECK_OK(pair_up(&y, Y, n * sizeof(float)));
    CHECK_OK(pair_up(&bias, Bi, (size_t)channels * sizeof(float)));
    CHECK_OK(g_cpu->bias_add(g_cpu, y.c, bias.c, outer, channels, inner));
    CHECK_OK(g_gpu->bias_add(g_gpu, y.g, bias.g, outer, channels, inner));
    float *hc, *hg;
    CHECK_OK(pair_down(&y, n * sizeof(float), (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, n);
}

PS_TEST(bias_add_matches_cpu_exactly)
{
    NEED_GPU();
    seed(3);
    bias_add_case(5, 7, 33); /* conv: [N, C, H*W] */
    if (ps_test_stopped())
        return;
    bias_add_case(64, 10, 1); /* dense: [N, features] */
}

static void bias_grad_case(int outer, int channels, int inner)
{
    size_t n = (size_t)outer * channels * inner;
    float *DY = rnd_host(n, 1.0f);
    CHECK(DY);
    pair dy, db;
    CHECK_OK(pair_up(&dy, DY, n * sizeof(float)));
    float *junk = rnd_host((size_t)channels, 1.0f); /* overwritten, not added to */
    CHECK(junk);
    CHECK_OK(pair_up(&db, junk, (size_t)channels * sizeof(float)));
    CHECK_OK(g_cpu->bias_grad(g_cpu, db.c, dy.c, outer, channels, inner));
    CHECK_OK(g_gpu->bias_grad(g_gpu, db.g, dy.g, outer, channels, inner));
    float *hc, *hg;
    CHECK_OK(pair_down(&db, (size_t)channels * sizeof(float), (void **)&hc, (void **)&hg));
    float *adY = abs_host(DY, n), *S = host((size_t)channels * sizeof(float));
    CHECK(adY && S);
    CHECK_OK(g_cpu->bias_grad(g_cpu, S, adY, outer, channels, inner));
    CHECK_BOUND(hg, hc, S, 2.0 * (double)outer * inner * U, (size_t)channels);
}

PS_TEST(bias_grad_matches_cpu)
{
    NEED_GPU();
    seed(4);
    bias_grad_case(5, 7, 33);
    if (ps_test_stopped())
        return;
    bias_grad_case(130, 70, 1); /* dense: column sums over 3 blocks of 32 channels */
    if (ps_test_stopped())
        return;
    bias_grad_case(3, 4, 1000);
}

PS_TEST(relu_fwd_bwd_match_cpu_in_place_too)
{
    NEED_GPU();
    seed(5);
    size_t n = 10007, bytes = n * sizeof(float);
    float *X = rnd_host(n, 1.0f), *DY = rnd_host(n, 1.0f);
    CHECK(X && DY);
    pair x, y, dy, dx;
    CHECK_OK(pair_up(&x, X, bytes));
    CHECK_OK(pair_up(&y, X, bytes)); /* overwritten */
    CHECK_OK(pair_up(&dy, DY, bytes));
    CHECK_OK(pair_up(&dx, DY, bytes));
    CHECK_OK(g_cpu->relu_fwd(g_cpu, y.c, x.c, n));
    CHECK_OK(g_gpu->relu_fwd(g_gpu, y.g, x.g, n));
    float *hc, *hg;
    CHECK_OK(pair_down(&y, bytes, (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, n);
    CHECK_OK(g_cpu->relu_bwd(g_cpu, dx.c, dy.c, y.c, n));
    CHECK_OK(g_gpu->relu_bwd(g_gpu, dx.g, dy.g, y.g, n));
    CHECK_OK(pair_down(&dx, bytes, (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, n);
    /* in place: x = relu(x); dy = dy * (x > 0) */
    CHECK_OK(g_gpu->relu_fwd(g_gpu, x.g, x.g, n));
    CHECK_OK(g_gpu->relu_bwd(g_gpu, dy.g, dy.g, x.g, n));
    float *hx = host(bytes), *hdy = host(bytes);
    CHECK(hx && hdy);
    CHECK_OK(down(g_gpu, hx, x.g, bytes));
    CHECK_OK(down(g_gpu, hdy, dy.g, bytes));
    CHECK_OK(down(g_cpu, hc, y.c, bytes));
    CHECK_EXACT(hx, hc, n);
    CHECK_OK(down(g_cpu, hc, dx.c, bytes));
    CHECK_EXACT(hdy, hc, n);
}

PS_TEST(axpy_matches_cpu)
{
    NEED_GPU();
    seed(6);
    size_t n = 10007, bytes = n * sizeof(float);
    float alpha = -0.3f;
    float *X = rnd_host(n, 1.0f), *Y = rnd_host(n, 1.0f), *S = host(bytes);
    CHECK(X && Y && S);
    for (size_t i = 0; i < n; i++)
        S[i] = fabsf(Y[i]) + fabsf(alpha * X[i]);
    pair x, y;
    CHECK_OK(pair_up(&x, X, bytes));
    CHECK_OK(pair_up(&y, Y, bytes));
    CHECK_OK(g_cpu->axpy(g_cpu, y.c, alpha, x.c, n));
    CHECK_OK(g_gpu->axpy(g_gpu, y.g, alpha, x.g, n));
    float *hc, *hg;
    CHECK_OK(pair_down(&y, bytes, (void **)&hc, (void **)&hg));
    CHECK_BOUND(hg, hc, S, 4.0 * U, n);
}

/* ---- softmax cross-entropy --------------------------------------------- */

static void xent_case(int n, int classes, int with_loss)
{
    size_t total = (size_t)n * classes, bytes = total * sizeof(float);
    float *L = rnd_host(total, 3.0f);
    int32_t *lab = host((size_t)n * sizeof(int32_t));
    CHECK(L && lab);
    for (int r = 0; r < n; r++) {
        lab[r] = (int32_t)((rnd() + 1.0f) * 0.5f * (float)classes) % classes;
        if (r % 5 == 0) /* some rows predicted right, so `correct` is not just 0 */
            L[(size_t)r * classes + lab[r]] += 4.0f;
    }
    for (int j = 0; j < classes; j++) /* stability: a row far from zero */
        L[j] += 1.0e4f;
    pair lg, lb, d;
    CHECK_OK(pair_up(&lg, L, bytes));
    CHECK_OK(pair_up(&lb, lab, (size_t)n * sizeof(int32_t)));
    CHECK_OK(pair_up(&d, L, bytes)); /* overwritten */
    float loss_c = 0, loss_g = 0;
    int corr_c = 0, corr_g = 0;
    CHECK_OK(g_cpu->softmax_xent(g_cpu, lg.c, lb.c, n, classes, d.c, &loss_c, &corr_c));
    if (with_loss)
        CHECK_OK(g_gpu->softmax_xent(g_gpu, lg.g, lb.g, n, classes, d.g, &loss_g, &corr_g));
    else
        CHECK_OK(g_gpu->softmax_xent(g_gpu, lg.g, lb.g, n, classes, d.g, NULL, NULL));
    float *hc, *hg;
    CHECK_OK(pair_down(&d, bytes, (void **)&hc, (void **)&hg));
    float *S = host(bytes);
    CHECK(S);
    for (size_t i = 0; i < total; i++)
        S[i] = fabsf(hc[i]);
    for (int r = 0; r < n; r++)
        S[(size_t)r * classes + lab[r]] += 1.0f / (float)n;
    CHECK_BOUND(hg, hc, S, 2.0 * (classes + 64) * U, total);
    if (with_loss) {
        CHECK_NEAR(loss_g, loss_c, 2.0 * (classes + 16) * U);
        CHECK_EQ_INT(corr_g, corr_c);
    }
}

PS_TEST(softmax_xent_matches_cpu)
{
    NEED_GPU();
    seed(7);
    static const int shapes[][2] = {{67, 10}, {33, 1000}, {3, 5}, {9, 1}, {1000, 37}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        xent_case(shapes[i][0], shapes[i][1], 1);
        if (ps_test_stopped())
            return;
    }
    xent_case(2000, 10, 1); /* grows the per-row scratch */
    if (ps_test_stopped())
        return;
    xent_case(50, 10, 0); /* loss and correct not asked for: no wait */
}

/* ---- convolution pieces ------------------------------------------------ */

static void conv_case(int C, int H, int W, int k, int pad)
{
    int OH = H + 2 * pad - k + 1, OW = W + 2 * pad - k + 1;
    size_t nx = (size_t)C * H * W, ncol = (size_t)C * k * k * OH * OW;
    float *X = rnd_host(nx, 1.0f), *COL = rnd_host(ncol, 1.0f);
    CHECK(X && COL);
    pair x, col, dx;
    CHECK_OK(pair_up(&x, X, nx * sizeof(float)));
    CHECK_OK(pair_up(&col, COL, ncol * sizeof(float)));
    CHECK_OK(pair_up(&dx, X, nx * sizeof(float))); /* overwritten */

    CHECK_OK(g_cpu->col2im(g_cpu, col.c, C, H, W, k, pad, dx.c));
    CHECK_OK(g_gpu->col2im(g_gpu, col.g, C, H, W, k, pad, dx.g));
    float *hc, *hg;
    CHECK_OK(pair_down(&dx, nx * sizeof(float), (void **)&hc, (void **)&hg));
    float *acol = abs_host(COL, ncol), *S = host(nx * sizeof(float));
    CHECK(acol && S);
    CHECK_OK(g_cpu->col2im(g_cpu, acol, C, H, W, k, pad, S));
    CHECK_BOUND(hg, hc, S, 2.0 * k * k * U, nx);

    CHECK_OK(g_cpu->im2col(g_cpu, x.c, C, H, W, k, pad, col.c));
    CHECK_OK(g_gpu->im2col(g_gpu, x.g, C, H, W, k, pad, col.g));
    CHECK_OK(pair_down(&col, ncol * sizeof(float), (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, ncol);
}

PS_TEST(im2col_col2im_match_cpu)
{
    NEED_GPU();
    seed(8);
    static const int shapes[][5] = {
        {3, 11, 9, 3, 1}, {2, 7, 8, 5, 0}, {4, 6, 5, 1, 0}, {2, 5, 6, 3, 2}, {16, 32, 32, 3, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int *s = shapes[i];
        conv_case(s[0], s[1], s[2], s[3], s[4]);
        if (ps_test_stopped())
            return;
    }
}

PS_TEST(maxpool_fwd_bwd_match_cpu_exactly)
{
    NEED_GPU();
    seed(9);
    int NC = 6, H = 10, W = 14;
    size_t nx = (size_t)NC * H * W, ny = nx / 4;
    float *X = rnd_host(nx, 1.0f), *DY = rnd_host(ny, 1.0f);
    CHECK(X && DY);
    pair x, y, dy, dx, am;
    CHECK_OK(pair_up(&x, X, nx * sizeof(float)));
    CHECK_OK(pair_up(&y, DY, ny * sizeof(float))); /* overwritten */
    CHECK_OK(pair_up(&dy, DY, ny * sizeof(float)));
    CHECK_OK(pair_up(&dx, X, nx * sizeof(float))); /* overwritten */
    CHECK_OK(pair_up(&am, X, ny));                 /* overwritten */
    CHECK_OK(g_cpu->maxpool_fwd(g_cpu, x.c, NC, H, W, y.c, am.c));
    CHECK_OK(g_gpu->maxpool_fwd(g_gpu, x.g, NC, H, W, y.g, am.g));
    float *hc, *hg;
    CHECK_OK(pair_down(&y, ny * sizeof(float), (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, ny);
    uint8_t *ac, *ag;
    CHECK_OK(pair_down(&am, ny, (void **)&ac, (void **)&ag));
    for (size_t i = 0; i < ny; i++)
        CHECK_MSG(ac[i] == ag[i], "argmax %zu: gpu %d, cpu %d", i, ag[i], ac[i]);
    CHECK_OK(g_cpu->maxpool_bwd(g_cpu, dy.c, am.c, NC, H, W, dx.c));
    CHECK_OK(g_gpu->maxpool_bwd(g_gpu, dy.g, am.g, NC, H, W, dx.g));
    CHECK_OK(pair_down(&dx, nx * sizeof(float), (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, nx);
}

/* ---- cuDNN: the layers on the GPU's whole-batch operations -------------- */

#include "layers.h"
#include "model.h"

static int cudnn_off(void)
{
    const char *e = getenv("PS_CUDNN");
    return e && strcmp(e, "0") == 0;
}

/* cuDNN built in and asked for: it must be in use, or the comparison below
 * would pass on the im2col path it is meant to replace */
#define NEED_CUDNN()                                                                   \
    do {                                                                               \
        NEED_GPU();                                                                    \
        if (!have_cudnn_build())                                                       \
            SKIP("skipped: built without cuDNN (no cudnn.h under CUDA_HOME)");         \
        if (cudnn_off())                                                               \
            SKIP("skipped: PS_CUDNN=0");                                               \
        CHECK_MSG(g_gpu->conv_fwd && g_gpu->pool_fwd,                                  \
                  "cuDNN is built in but the backend has no conv_fwd/pool_fwd: it did "  \
                  "not start (see the warning above)");                                \
    } while (0)

static int have_cudnn_build(void)
{
#ifdef PS_HAVE_CUDNN
    return 1;
#else
    return 0;
#endif
}

/* Every element of a within the bound above of c, scale S and K terms. */
static long diff_dnn(const float *g, const float *c, const float *S, double K, size_t n)
{
    double smax = 0;
    for (size_t i = 0; i < n; i++)
        smax = S[i] > smax ? S[i] : smax;
    int tf32 = tf32_on();
    for (size_t i = 0; i < n; i++) {
        double tol = (2.0 * (K + 2) * U + (tf32 ? 0x1p-9 : 0.0)) * S[i] +
                     (tf32 ? 0x1p-12 * smax : 0.0);
        if (!(fabs((double)g[i] - (double)c[i]) <= tol))
            return (long)i;
    }
    return -1;
}

#define CHECK_DNN(what, g, c, S, K, n)                                                 \
    do {                                                                               \
        long at_ = diff_dnn((g), (c), (S), (K), (n));                                   \
        CHECK_MSG(at_ < 0, "%s element %ld: gpu %.9g, cpu %.9g, scale %.3g", what, at_, \
                  (double)(g)[at_], (double)(c)[at_], (double)(S)[at_]);               \
    } while (0)

/* One conv layer forward and backward on both backends with n images. */
static void dnn_conv_case(int n, int C, int H, int W, int K_out, int k)
{
    ps_layer lc, lg;
    CHECK_OK(ps_layer_conv2d(&lc, C, H, W, K_out, k));
    lg = lc;
    size_t nx = (size_t)n * ps_layer_in_size(&lc), ny = (size_t)n * ps_layer_out_size(&lc);
    size_t nw = ps_layer_weight_count(&lc), nb = (size_t)K_out;
    float *X = rnd_host(nx, 1.0f), *Wt = rnd_host(nw, 1.0f), *B = rnd_host(nb, 1.0f);
    float *DY = rnd_host(ny, 1.0f);
    CHECK(X && Wt && B && DY);
    pair x, w, bias, y, dy, dx, gw, gb;
    CHECK_OK(pair_up(&x, X, nx * 4));
    CHECK_OK(pair_up(&w, Wt, nw * 4));
    CHECK_OK(pair_up(&bias, B, nb * 4));
    CHECK_OK(pair_up(&dy, DY, ny * 4));
    CHECK_OK(pair_up(&y, DY, ny * 4)); /* overwritten */
    CHECK_OK(pair_up(&dx, X, nx * 4)); /* overwritten */
    CHECK_OK(pair_up(&gw, Wt, nw * 4)); /* overwritten */
    CHECK_OK(pair_up(&gb, B, nb * 4)); /* overwritten */
    ps_param pwc = {.count = nw, .w = w.c, .g = gw.c}, pbc = {.key = 1, .count = nb, .w = bias.c,
                                                              .g = gb.c};
    ps_param pwg = {.count = nw, .w = w.g, .g = gw.g}, pbg = {.key = 1, .count = nb, .w = bias.g,
                                                              .g = gb.g};
    lc.weight = &pwc, lc.bias = &pbc, lg.weight = &pwg, lg.bias = &pbg;
    int rc = ps_layer_alloc(&lc, g_cpu, n);
    if (!rc)
        rc = ps_layer_alloc(&lg, g_gpu, n);
    int no_col = !lg.col; /* cuDNN needs no im2col scratch */
    if (!rc)
        rc = ps_layer_forward(g_cpu, &lc, x.c, y.c, n);
    if (!rc)
        rc = ps_layer_forward(g_gpu, &lg, x.g, y.g, n);
    if (!rc)
        rc = ps_layer_backward(g_cpu, &lc, x.c, y.c, dy.c, dx.c, n);
    if (!rc)
        rc = ps_layer_backward(g_gpu, &lg, x.g, y.g, dy.g, dx.g, n);
    float *hy[2], *hdx[2], *hgw[2], *hgb[2];
    if (!rc)
        rc = pair_down(&y, ny * 4, (void **)&hy[0], (void **)&hy[1]);
    if (!rc)
        rc = pair_down(&dx, nx * 4, (void **)&hdx[0], (void **)&hdx[1]);
    if (!rc)
        rc = pair_down(&gw, nw * 4, (void **)&hgw[0], (void **)&hgw[1]);
    if (!rc)
        rc = pair_down(&gb, nb * 4, (void **)&hgb[0], (void **)&hgb[1]);
    /* the scales: the same layer on the CPU with every input's magnitude */
    float *ax = abs_host(X, nx), *aw = abs_host(Wt, nw), *ab = abs_host(B, nb),
          *ady = abs_host(DY, ny);
    float *Sy = host(ny * 4), *Sdx = host(nx * 4), *Sgw = host(nw * 4), *Sgb = host(nb * 4);
    if (!rc && !(ax && aw && ab && ady && Sy && Sdx && Sgw && Sgb))
        rc = PS_ENOMEM;
    if (!rc) {
        pwc.w = aw, pwc.g = Sgw, pbc.w = ab, pbc.g = Sgb;
        rc = ps_layer_forward(g_cpu, &lc, ax, Sy, n);
        if (!rc)
            rc = ps_layer_backward(g_cpu, &lc, ax, Sy, ady, Sdx, n);
    }
    ps_layer_release(&lc, g_cpu);
    ps_layer_release(&lg, g_gpu);
    CHECK_OK(rc);
    CHECK_MSG(no_col, "the cuDNN layer allocated im2col columns");
    double terms = (double)n * lc.out_h * lc.out_w;
    CHECK_DNN("y", hy[1], hy[0], Sy, (double)C * k * k + 1, ny);
    CHECK_DNN("dx", hdx[1], hdx[0], Sdx, (double)K_out * k * k, nx);
    CHECK_DNN("dW", hgw[1], hgw[0], Sgw, terms, nw);
    CHECK_DNN("db", hgb[1], hgb[0], Sgb, terms, nb);
}

PS_TEST(cudnn_conv_forward_and_backward_match_cpu)
{
    NEED_CUDNN();
    seed(11);
    /* n, C, H, W, K_out, k: the CNN's two convolutions with odd batches,
     * then small odd shapes (H != W, C != K_out), a 1x1 and a 7x7 */
    static const int shapes[][6] = {{7, 1, 28, 28, 32, 5}, {5, 32, 14, 14, 64, 5},
                                    {3, 3, 7, 5, 4, 3},    {1, 2, 4, 6, 3, 1},
                                    {2, 4, 9, 11, 5, 7},   {64, 1, 28, 28, 32, 5}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int *s = shapes[i];
        dnn_conv_case(s[0], s[1], s[2], s[3], s[4], s[5]);
        if (ps_test_stopped())
            return;
    }
    /* the first shape again: its plan is reused, same results */
    dnn_conv_case(7, 1, 28, 28, 32, 5);
}

static void dnn_pool_case(int n, int C, int H, int W)
{
    ps_layer lc, lg;
    CHECK_OK(ps_layer_maxpool(&lc, C, H, W));
    lg = lc;
    size_t nx = (size_t)n * ps_layer_in_size(&lc), ny = (size_t)n * ps_layer_out_size(&lc);
    /* all inputs distinct (i -> i * 7919 mod P is one-to-one for i < P, P
     * not a multiple of the prime 7919, and the quotients stay apart in
     * float), so no window has a tie that the two could route differently */
    float *X = host(nx * 4), *DY = rnd_host(ny, 1.0f);
    CHECK(X && DY);
    const size_t P = 2000003;
    CHECK(nx < P);
    for (size_t i = 0; i < nx; i++)
        X[i] = (float)((i * 7919u) % P) / (float)P - 0.5f;
    pair x, y, dy, dx;
    CHECK_OK(pair_up(&x, X, nx * 4));
    CHECK_OK(pair_up(&dy, DY, ny * 4));
    CHECK_OK(pair_up(&y, DY, ny * 4)); /* overwritten */
    CHECK_OK(pair_up(&dx, X, nx * 4)); /* overwritten */
    int rc = ps_layer_alloc(&lc, g_cpu, n);
    if (!rc)
        rc = ps_layer_alloc(&lg, g_gpu, n);
    int no_argmax = !lg.argmax;
    if (!rc)
        rc = ps_layer_forward(g_cpu, &lc, x.c, y.c, n);
    if (!rc)
        rc = ps_layer_forward(g_gpu, &lg, x.g, y.g, n);
    if (!rc)
        rc = ps_layer_backward(g_cpu, &lc, x.c, y.c, dy.c, dx.c, n);
    if (!rc)
        rc = ps_layer_backward(g_gpu, &lg, x.g, y.g, dy.g, dx.g, n);
    ps_layer_release(&lc, g_cpu);
    ps_layer_release(&lg, g_gpu);
    CHECK_OK(rc);
    CHECK_MSG(no_argmax, "the cuDNN pool allocated an argmax");
    float *hc, *hg;
    CHECK_OK(pair_down(&y, ny * 4, (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, ny);
    CHECK_OK(pair_down(&dx, nx * 4, (void **)&hc, (void **)&hg));
    CHECK_EXACT(hg, hc, nx);
}

PS_TEST(cudnn_maxpool_forward_and_backward_match_cpu_exactly)
{
    NEED_CUDNN();
    seed(12);
    static const int shapes[][4] = {{7, 32, 28, 28}, {5, 64, 14, 14}, {3, 3, 10, 14}, {1, 1, 2, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int *s = shapes[i];
        dnn_pool_case(s[0], s[1], s[2], s[3]);
        if (ps_test_stopped())
            return;
    }
}

/* ||a - b||_2 <= tol ||b||_2 (b all zero: a must be too) */
static int close_in_norm(const float *a, const float *b, size_t n, double tol, double *rel)
{
    double d = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        nb += (double)b[i] * b[i];
    }
    *rel = nb > 0 ? sqrt(d / nb) : sqrt(d);
    return *rel <= tol;
}

/* One forward + backward of model m on backend b with the batch X, Y; the
 * loss and every gradient back to host memory (tracked). */
static int cnn_step(ps_backend *b, ps_model *m, const float *X, const int32_t *Y, int n,
                    float *loss, float **grads)
{
    int rc = ps_model_load_batch(m, X, Y, n);
    if (!rc)
        rc = ps_model_forward(m, ps_model_input(m), ps_model_labels(m), n, NULL, loss, NULL);
    if (!rc)
        rc = ps_model_backward(m, NULL);
    for (int p = 0; !rc && p < ps_model_num_params(m); p++) {
        ps_param *q = &ps_model_params(m)[p];
        if (!(grads[p] = host(q->count * sizeof(float))))
            return PS_ENOMEM;
        rc = down(b, grads[p], q->g, q->count * sizeof(float));
    }
    return rc;
}

/* One CNN step on g_gpu (cuDNN, heuristic algorithms) and on a second
 * backend made with VAR=VALUE in its environment, from the same weights and
 * batch: the loss and every gradient compared (tolerances below).  0 or the
 * first failed check's line, as PS_TEST's checks do. */
static void cnn_step_against(const char *var, const char *value, int other_has_cudnn)
{
    seed(13);
    enum { N = 37, MAXP = 16 };
    /* a second backend on the same GPU with cuDNN off, from the environment
     * it reads at creation */
    ps_backend *off = NULL;
    char why[256];
    setenv(var, value, 1);
    int rc = ps_backend_cuda_create(0, &off, why, sizeof why);
    unsetenv(var);
    CHECK_MSG(rc == 0, "%s", why);
    int off_has_cudnn = off->conv_fwd != NULL;
    ps_model *m[2] = {NULL, NULL};
    ps_backend *bs[2] = {g_gpu, off};
    size_t in = 28 * 28;
    float *X = rnd_host((size_t)N * in, 1.0f);
    int32_t *Y = host(N * sizeof(int32_t));
    float loss[2] = {0, 0}, *grads[2][MAXP];
    if (!X || !Y)
        rc = PS_ENOMEM;
    for (int i = 0; !rc && i < N; i++)
        Y[i] = (int32_t)((rnd() + 1.0f) * 5.0f) % 10;
    for (int i = 0; i < 2 && !rc; i++) {
        /* the same seed: the same initial weights on both */
        rc = ps_model_create("cnn", 1, 28, 28, 10, N, bs[i], 7, &m[i], why, sizeof why);
        if (!rc && ps_model_num_params(m[i]) > MAXP)
            rc = PS_EINVAL;
        if (!rc)
            rc = cnn_step(bs[i], m[i], X, Y, N, &loss[i], grads[i]);
    }
    int np = rc ? 0 : ps_model_num_params(m[0]);
    /* FP32: the two paths differ by summation order alone (the H200 showed
     * 6.6e-7 of the norm).  TF32 rounds every operand to 10 bits, so the
     * forward values differ by about 1e-3 relative and some max-pool windows
     * with near-equal entries, and ReLUs near zero, choose differently on
     * the two paths: each such flip moves a gradient contribution whole to
     * another position (the H200 showed 0.031 of the norm, in conv1's filter
     * gradient).  The loss, a mean over the batch, stays within 2e-3. */
    double worst = 0, gtol = tf32_on() ? 1e-1 : 5e-3;
    int bad = -1;
    for (int p = 0; p < np; p++) {
        double rel;
        if (!close_in_norm(grads[0][p], grads[1][p], ps_model_params(m[0])[p].count, gtol, &rel) &&
            bad < 0)
            bad = p;
        worst = rel > worst ? rel : worst;
    }
    ps_model_destroy(m[0]);
    ps_model_destroy(m[1]);
    off->destroy(off);
    CHECK_OK(rc);
    CHECK_MSG(off_has_cudnn == other_has_cudnn, "%s=%s: cuDNN %s", var, value,
              off_has_cudnn ? "on" : "off");
    printf("# CNN step, cuDNN vs %s=%s: loss %.7g vs %.7g, worst gradient %.3g of its norm\n",
           var, value, loss[0], loss[1], worst);
    double ltol = (tf32_on() ? 2e-3 : 1e-5) * (fabs(loss[1]) > 1 ? fabs(loss[1]) : 1);
    CHECK_NEAR(loss[0], loss[1], ltol);
    CHECK_MSG(bad < 0, "gradient %d differs by more than %.3g of its norm (worst %.3g)", bad,
              gtol, worst);
}

PS_TEST(cnn_step_with_cudnn_matches_cudnn_off)
{
    NEED_CUDNN();
    cnn_step_against("PS_CUDNN", "0", 0);
}

/* Algorithms chosen by timing (PS_CUDNN_ALGO=find: deterministic ones;
 * fastest: any) compute the same step within the same tolerances. */
PS_TEST(cnn_step_with_timed_cudnn_algorithms_matches_the_heuristic_ones)
{
    NEED_CUDNN();
    cnn_step_against("PS_CUDNN_ALGO", "find", 1);
    cnn_step_against("PS_CUDNN_ALGO", "fastest", 1);
}

/* The loss read without waiting: it arrives in pinned memory once the
 * compute stream gets there, equal to the waiting call's bit for bit (the
 * same kernels), step after step with nothing but the last sync. */
PS_TEST(softmax_xent_async_matches_the_waiting_call)
{
    NEED_GPU();
    seed(14);
    enum { N = 67, CL = 10, STEPS = 3 };
    float *L = rnd_host((size_t)N * CL * STEPS, 3.0f);
    int32_t *lab = host(N * sizeof(int32_t));
    float *loss = pinned(g_gpu, STEPS * sizeof(float));
    int *corr = pinned(g_gpu, STEPS * sizeof(int));
    CHECK(L && lab && loss && corr && g_gpu->softmax_xent_async);
    for (int r = 0; r < N; r++)
        lab[r] = (int32_t)((rnd() + 1.0f) * 5.0f) % CL;
    pair lg, lb, d;
    CHECK_OK(pair_up(&lg, L, (size_t)N * CL * STEPS * 4));
    CHECK_OK(pair_up(&lb, lab, N * sizeof(int32_t)));
    CHECK_OK(pair_up(&d, L, (size_t)N * CL * 4));
    for (int s = 0; s < STEPS; s++)
        CHECK_OK(g_gpu->softmax_xent_async(g_gpu, (float *)lg.g + (size_t)s * N * CL, lb.g, N,
                                           CL, d.g, &loss[s], &corr[s]));
    CHECK_OK(g_gpu->stream_sync(g_gpu, PS_STREAM_COMPUTE));
    for (int s = 0; s < STEPS; s++) {
        float want = 0;
        int want_c = 0;
        CHECK_OK(g_gpu->softmax_xent(g_gpu, (float *)lg.g + (size_t)s * N * CL, lb.g, N, CL, d.g,
                                     &want, &want_c));
        CHECK_MSG(loss[s] == want, "step %d: %.9g vs %.9g", s, loss[s], want);
        CHECK_EQ_INT(corr[s], want_c);
    }
}

/* ---- streams and events ------------------------------------------------ */

/* The training step's pattern: upload on the copy stream, compute after an
 * event, download on the copy stream after another event, wait on the host. */
PS_TEST(copies_across_streams_are_ordered_by_events)
{
    NEED_GPU();
    seed(10);
    size_t n = (size_t)1 << 20, bytes = n * sizeof(float);
    float *src = pinned(g_gpu, bytes), *dst = pinned(g_gpu, bytes), *dst2 = pinned(g_gpu, bytes);
    float *a = dev(g_gpu, bytes), *b = dev(g_gpu, bytes), *c = dev(g_gpu, bytes);
    float *want = host(bytes);
    CHECK(src && dst && dst2 && a && b && c && want);
    for (size_t i = 0; i < n; i++) {
        src[i] = rnd();
        /* relu(x) + 2x: 2x is exact, so fused or not the sum rounds once */
        want[i] = (src[i] > 0.0f ? src[i] : 0.0f) + 2.0f * src[i];
    }
    ps_event *up_done = NULL, *calc_done = NULL, *down_done = NULL;
    int rc = g_gpu->event_create(g_gpu, &up_done);
    if (!rc)
        rc = g_gpu->event_create(g_gpu, &calc_done);
    if (!rc)
        rc = g_gpu->event_create(g_gpu, &down_done);
    if (!rc)
        rc = g_gpu->copy(g_gpu, a, src, bytes, 0, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->event_record(g_gpu, up_done, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->stream_wait_event(g_gpu, PS_STREAM_COMPUTE, up_done);
    if (!rc)
        rc = g_gpu->relu_fwd(g_gpu, b, a, n);
    if (!rc)
        rc = g_gpu->axpy(g_gpu, b, 2.0f, a, n);
    if (!rc)
        rc = g_gpu->event_record(g_gpu, calc_done, PS_STREAM_COMPUTE);
    if (!rc)
        rc = g_gpu->stream_wait_event(g_gpu, PS_STREAM_COPY, calc_done);
    if (!rc)
        rc = g_gpu->copy(g_gpu, dst, b, bytes, 1, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->copy(g_gpu, c, a, bytes, 2, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->copy(g_gpu, dst2, c, bytes, 1, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->event_record(g_gpu, down_done, PS_STREAM_COPY);
    if (!rc)
        rc = g_gpu->event_sync(g_gpu, down_done);
    int q = rc ? 0 : g_gpu->event_query(g_gpu, down_done);
    ps_event *evs[3] = {up_done, calc_done, down_done};
    for (int i = 0; i < 3; i++)
        if (evs[i])
            g_gpu->event_destroy(g_gpu, evs[i]);
    CHECK_OK(rc);
    CHECK_EQ_INT(q, 1);
    CHECK_EXACT(dst, want, n);
    CHECK_EXACT(dst2, src, n);
}

/* ---- the click-through model ------------------------------------------ */

/* nbags bags of 0..maxlen entries over nrows unique rows (duplicates and
 * empty bags among them), a fifth of the entries padding, weights in
 * [0.5, 2); every one of nbags * maxlen entries valid (for offsets NULL). */
static void random_bags(int nbags, int maxlen, size_t nrows, int32_t *off, int32_t *index,
                        float *weights)
{
    for (int e = 0; e < nbags * maxlen; e++) {
        index[e] = (rnd() + 1.0f) * 2.5f < 1.0f ? -1 : (int32_t)((rnd() + 1.0f) * 0.5f * nrows);
        if (index[e] >= (int32_t)nrows)
            index[e] = (int32_t)nrows - 1;
        weights[e] = 1.25f + 0.75f * rnd();
    }
    off[0] = 0;
    for (int s = 0; s < nbags; s++)
        off[s + 1] = off[s] + (int32_t)((rnd() + 1.0f) * 0.5f * (maxlen + 1)) % (maxlen + 1);
}

static void emb_bag_case(int dim, int pool, int wt, int single)
{
    enum { NB = 300, MAXLEN = 6, NROWS = 200 };
    size_t stride = (size_t)dim + 3, outn = NB * stride;
    int32_t *off = host((NB + 1) * sizeof(int32_t)), *index = host(NB * MAXLEN * sizeof(int32_t));
    float *weights = host(NB * MAXLEN * sizeof(float));
    float *rows = rnd_host((size_t)NROWS * dim, 1.0f), *dout = rnd_host(outn, 1.0f);
    float *want = host(outn * sizeof(float)), *scale = host(outn * sizeof(float));
    float *got = host(outn * sizeof(float)), *dev_out = dev(g_gpu, outn * sizeof(float));
    size_t gn = (size_t)NROWS * dim;
    float *gw = host(gn * sizeof(float)), *gs = host(gn * sizeof(float));
    float *gg = host(gn * sizeof(float)), *dev_dout = dev(g_gpu, outn * sizeof(float));
    CHECK(off && index && weights && rows && dout && want && scale && got && dev_out && gw &&
          gs && gg && dev_dout);
    random_bags(NB, MAXLEN, NROWS, off, index, weights);
    ps_emb_bags bags = {NB, single ? NULL : off, index, wt ? weights : NULL, NROWS};
    float *arows = abs_host(rows, gn), *adout = abs_host(dout, outn);
    float *aw = abs_host(weights, NB * MAXLEN);
    CHECK(arows && adout && aw);
    ps_emb_bags abags = bags;
    abags.weights = wt ? aw : NULL;
    for (size_t i = 0; i < outn; i++)
        want[i] = scale[i] = 7.0f; /* between the rows: untouched */
    CHECK_OK(ps_emb_bag_forward(g_cpu, &bags, (ps_pool)pool, rows, dim, want, stride));
    CHECK_OK(ps_emb_bag_forward(g_cpu, &abags, (ps_pool)pool, arows, dim, scale, stride));
    ps_emb_dev *d = NULL;
    CHECK_OK(ps_emb_dev_create(g_gpu, NB * MAXLEN, NB, dim, &d));
    int rc = g_gpu->fill(g_gpu, dev_out, 7.0f, outn);
    if (!rc)
        rc = ps_emb_dev_forward(d, &bags, (ps_pool)pool, rows, dev_out, stride);
    if (!rc)
        rc = down(g_gpu, got, dev_out, outn * sizeof(float));
    /* backward, twice: the second reuses the staging */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        rc = up(g_gpu, dev_dout, dout, outn * sizeof(float));
        if (!rc)
            rc = ps_emb_dev_backward(d, &bags, (ps_pool)pool, dev_dout, stride);
        if (!rc)
            rc = ps_emb_dev_grads(d, gg);
    }
    ps_emb_dev_destroy(d);
    CHECK_OK(rc);
    CHECK_BOUND(got, want, scale, 2.0 * (MAXLEN + 2) * U, outn);
    CHECK_OK(ps_emb_bag_backward(g_cpu, &bags, (ps_pool)pool, dout, stride, dim, gw));
    CHECK_OK(ps_emb_bag_backward(g_cpu, &abags, (ps_pool)pool, adout, stride, dim, gs));
    for (size_t i = 0; i < gn; i++) /* rows no entry reads: exactly 0 on both */
        gs[i] = gs[i] > 0 ? gs[i] : 1.0f;
    CHECK_BOUND(gg, gw, gs, 2.0 * (NB * MAXLEN + 2) * U, gn);
}

PS_TEST(emb_bag_forward_backward_match_cpu_on_random_bags)
{
    NEED_GPU();
    seed(31);
    static const int dims[] = {16, 13, 64, 1};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (int c = 0; c < 8; c++) {
            emb_bag_case(dims[di], c & 1, c >> 1 & 1, c >> 2 & 1);
            if (ps_test_stopped())
                return;
            arena_reset();
        }
}

static void interact_case(int n, int in, int F, int E, int dot, int with_dx)
{
    int out = in + (dot ? (F + 1) * F / 2 : F * E);
    size_t nx = (size_t)n * in, ne = (size_t)n * F * E, ny = (size_t)n * out;
    float *x = rnd_host(nx, 1.0f), *emb = rnd_host(ne, 1.0f), *dy = rnd_host(ny, 1.0f);
    CHECK(x && emb && dy);
    float *ax = abs_host(x, nx), *aemb = abs_host(emb, ne), *ady = abs_host(dy, ny);
    float *sy = host(ny * sizeof(float)), *sdx = host(nx * sizeof(float));
    float *semb = host(ne * sizeof(float));
    CHECK(ax && aemb && ady && sy && sdx && semb);
    pair px, pe, pdy, py, pdx, pdemb;
    CHECK_OK(pair_up(&px, x, nx * sizeof(float)));
    CHECK_OK(pair_up(&pe, emb, ne * sizeof(float)));
    CHECK_OK(pair_up(&pdy, dy, ny * sizeof(float)));
    CHECK_OK(pair_up(&py, dy, ny * sizeof(float)));      /* overwritten */
    CHECK_OK(pair_up(&pdx, x, nx * sizeof(float)));      /* overwritten (or kept) */
    CHECK_OK(pair_up(&pdemb, emb, ne * sizeof(float)));  /* overwritten */
    CHECK_OK(g_cpu->interact_fwd(g_cpu, px.c, pe.c, n, in, F, E, dot, py.c));
    CHECK_OK(g_gpu->interact_fwd(g_gpu, px.g, pe.g, n, in, F, E, dot, py.g));
    CHECK_OK(g_cpu->interact_bwd(g_cpu, px.c, pe.c, pdy.c, n, in, F, E, dot,
                                 with_dx ? pdx.c : NULL, pdemb.c));
    CHECK_OK(g_gpu->interact_bwd(g_gpu, px.g, pe.g, pdy.g, n, in, F, E, dot,
                                 with_dx ? pdx.g : NULL, pdemb.g));
    CHECK_OK(g_cpu->interact_fwd(g_cpu, ax, aemb, n, in, F, E, dot, sy));
    CHECK_OK(g_cpu->interact_bwd(g_cpu, ax, aemb, ady, n, in, F, E, dot, sdx, semb));
    float *yc, *yg, *dxc, *dxg, *dec, *deg;
    CHECK_OK(pair_down(&py, ny * sizeof(float), (void **)&yc, (void **)&yg));
    CHECK_OK(pair_down(&pdx, nx * sizeof(float), (void **)&dxc, (void **)&dxg));
    CHECK_OK(pair_down(&pdemb, ne * sizeof(float), (void **)&dec, (void **)&deg));
    CHECK_BOUND(yg, yc, sy, 2.0 * (E + 2) * U, ny);
    CHECK_BOUND(deg, dec, semb, 2.0 * (F + 3) * U, ne);
    if (with_dx)
        CHECK_BOUND(dxg, dxc, sdx, 2.0 * (F + 3) * U, nx);
    else
        CHECK_EXACT(dxg, x, nx); /* dx NULL: nothing written */
}

PS_TEST(interact_cat_and_dot_match_cpu)
{
    NEED_GPU();
    seed(37);
    interact_case(37, 7, 5, 13, 0, 1);
    interact_case(37, 13, 5, 13, 1, 1);
    interact_case(64, 16, 26, 16, 1, 1);
    interact_case(5, 4, 3, 4, 1, 0);
    interact_case(3, 2, 1, 1, 0, 0);
}

static void bce_case(int n, int with_loss)
{
    float *z = rnd_host((size_t)n, 12.0f);
    int32_t *lab = host((size_t)n * sizeof(int32_t));
    CHECK(z && lab);
    for (int r = 0; r < n; r++)
        lab[r] = rnd() > 0.3f;
    pair pz, pl, pd;
    CHECK_OK(pair_up(&pz, z, (size_t)n * sizeof(float)));
    CHECK_OK(pair_up(&pl, lab, (size_t)n * sizeof(int32_t)));
    CHECK_OK(pair_up(&pd, z, (size_t)n * sizeof(float)));
    float lc = 0, lg = 0;
    int cc = 0, cg = 0;
    CHECK_OK(g_cpu->bce_logits(g_cpu, pz.c, pl.c, n, pd.c, &lc, &cc));
    CHECK_OK(g_gpu->bce_logits(g_gpu, pz.g, pl.g, n, pd.g, with_loss ? &lg : NULL,
                               with_loss ? &cg : NULL));
    float *dc, *dg;
    CHECK_OK(pair_down(&pd, (size_t)n * sizeof(float), (void **)&dc, (void **)&dg));
    float *S = host((size_t)n * sizeof(float));
    CHECK(S);
    for (int r = 0; r < n; r++)
        S[r] = fabsf(dc[r]) + 1.0f / (float)n;
    CHECK_BOUND(dg, dc, S, 8.0 * U, (size_t)n);
    if (with_loss) {
        CHECK_NEAR(lg, lc, 1e-6 * lc);
        CHECK_EQ_INT(cg, cc);
    }
}

PS_TEST(bce_logits_matches_cpu)
{
    NEED_GPU();
    seed(41);
    bce_case(1, 1);
    bce_case(64, 1);
    bce_case(5000, 1); /* grows the per-row scratch */
    bce_case(300, 0);
}

/* Three SGD steps of a CTR model, tables updated in between, on each
 * backend from the same seed and batches. */
static void ctr_step_case(const char *spec)
{
    enum { N = 64, F = 4, D = 13, DIM = 16, STEPS = 3, IDS = 40 };
    ps_backend *bk[2] = {g_cpu, g_gpu};
    ps_model *m[2] = {NULL, NULL};
    ps_row_source *src[2] = {NULL, NULL};
    char why[512];
    float loss[2][STEPS];
    float *x = host(N * D * sizeof(float));
    uint64_t *ids = host(N * F * sizeof(uint64_t));
    int32_t *y = host(N * sizeof(int32_t));
    CHECK(x && ids && y);
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        seed(43);
        rc = ps_model_create(spec, D, 1, 1, 2, N, bk[k], 5, &m[k], why, sizeof why);
        if (!rc)
            rc = ps_row_source_local_create(F, DIM, 5, PS_OPT_SGD, 0.5f, 1e-8f, &src[k]);
        for (int step = 0; step < STEPS && !rc; step++) {
            for (int i = 0; i < N * D; i++)
                x[i] = rnd() + 1.0f;
            for (int i = 0; i < N * F; i++) /* duplicates in every field */
                ids[i] = (uint64_t)((rnd() + 1.0f) * 0.5f * IDS);
            for (int i = 0; i < N; i++)
                y[i] = rnd() > 0.0f;
            if (!(rc = ps_model_load_batch(m[k], x, y, N)) &&
                !(rc = ps_model_set_ids(m[k], ids, N)) &&
                !(rc = ps_model_fetch_rows(m[k], src[k])) &&
                !(rc = ps_model_forward(m[k], ps_model_input(m[k]), ps_model_labels(m[k]), N,
                                        NULL, &loss[k][step], NULL)) &&
                !(rc = ps_model_backward(m[k], NULL)) && !(rc = ps_model_sgd_step(m[k], 0.5f)))
                rc = ps_model_push_rows(m[k], src[k], step);
        }
    }
    double worst = 0, abs_tol = tf32_on() ? 1e-3 : 1e-5, rel_tol = tf32_on() ? 1e-2 : 1e-4;
    for (int step = 0; step < STEPS && !rc; step++) {
        double e = fabs((double)loss[1][step] - loss[0][step]) /
                   (abs_tol + rel_tol * loss[0][step]);
        worst = e > worst ? e : worst;
    }
    for (int p = 0; !rc && p < ps_model_num_params(m[0]); p++) {
        ps_param *pc = &ps_model_params(m[0])[p], *pg = &ps_model_params(m[1])[p];
        float *h = host(pc->count * sizeof(float));
        if (!h || (rc = down(g_gpu, h, pg->w, pc->count * sizeof(float))))
            break;
        for (size_t i = 0; i < pc->count; i++) {
            double e = fabs((double)h[i] - pc->w[i]) / (abs_tol + rel_tol * fabs(pc->w[i]));
            worst = e > worst ? e : worst;
        }
    }
    uint64_t all[IDS + 1];
    float rc0[(IDS + 1) * DIM], rg0[(IDS + 1) * DIM];
    for (int i = 0; i <= IDS; i++)
        all[i] = (uint64_t)i;
    for (int f = 0; f < F && !rc; f++) {
        if ((rc = src[0]->fetch(src[0], f, all, IDS + 1, rc0)) ||
            (rc = src[1]->fetch(src[1], f, all, IDS + 1, rg0)))
            break;
        for (int i = 0; i < (IDS + 1) * DIM; i++) {
            double e = fabs((double)rg0[i] - rc0[i]) / (abs_tol + rel_tol * fabs(rc0[i]));
            worst = e > worst ? e : worst;
        }
    }
    for (int k = 0; k < 2; k++) {
        if (src[k])
            src[k]->destroy(src[k]);
        ps_model_destroy(m[k]);
    }
    CHECK_MSG(rc == 0, "%s: %s %s", spec, ps_strerror(rc), why);
    printf("# %s: CUDA vs CPU after %d steps, worst %.3g of the tolerance, losses %.6f %.6f\n",
           spec, STEPS, worst, (double)loss[1][STEPS - 1], (double)loss[0][STEPS - 1]);
    CHECK_MSG(worst <= 1.0, "%s: %.3g x the tolerance", spec, worst);
}

PS_TEST(ctr_steps_match_cpu_cat_sum_and_dot_mean)
{
    NEED_GPU();
    ctr_step_case("ctr:fields=4,dense=13,dim=16,mlp=32-1,opt=sgd,lr=0.5");
    if (ps_test_stopped())
        return;
    ctr_step_case("ctr:fields=4,dense=13,dim=16,bot=24-16,mlp=32-16-1,pool=mean,interact=dot,"
                  "opt=sgd,lr=0.5");
}

/* The exchange stages through pinned host memory exactly when this is 0. */
PS_TEST(device_memory_is_not_host_memory)
{
    NEED_GPU();
    CHECK_EQ_INT(g_gpu->host_memory, 0);
    CHECK_EQ_INT(g_cpu->host_memory, 1);
}

PS_TEST(bad_device_index_is_a_clear_error)
{
    NEED_GPU();
#ifdef PS_HAVE_CUDA
    ps_backend *b = NULL;
    char why[256] = "";
    CHECK_EQ_INT(ps_backend_cuda_create(1000, &b, why, sizeof why), PS_EDEVICE);
    CHECK(b == NULL);
    CHECK_MSG(strstr(why, "--device cuda:1000: only ") != NULL, "why = '%s'", why);
#endif
}
