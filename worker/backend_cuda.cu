/* CUDA compute backend: device memory, pinned host memory and copies,
 * cuBLAS for gemm, events and streams, and making the backend; our own
 * kernels for the rest (backend_cuda_kernels.cu), and cuDNN for whole-batch
 * convolutions and pooling where it is there (backend_cudnn.cu).
 * worker/backend.h is the contract; backend_cpu.c is the reference the tests
 * compare against.
 *
 * Threads: the training thread and the comm thread may call into one backend
 * at the same time on different streams; each entry point selects the device
 * for its calling thread first. */
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
    b->gemm = cu_gemm;
    ps_cuda_kernels_attach(b); /* fill and the layers' elementwise pieces */
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
