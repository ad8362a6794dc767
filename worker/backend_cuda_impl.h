/* What the CUDA backend's three files share (backend_cuda.cu: memory,
 * cuBLAS, events, create; backend_cuda_kernels.cu: our kernels;
 * backend_cudnn.cu: cuDNN): the backend's state and the checks that turn a
 * CUDA error into a message and a PS_E* code.  C++, for nvcc only. */
#ifndef PS_BACKEND_CUDA_IMPL_H
#define PS_BACKEND_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stddef.h>

extern "C" {
#include "backend.h"
#include "ps_error.h"
#include "ps_log.h"
}

#define CUDA_CHECK(call)                                                            \
    do {                                                                            \
        cudaError_t ps_e_ = (call);                                                 \
        if (ps_e_ != cudaSuccess) {                                                 \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cudaGetErrorString(ps_e_));                                    \
            return PS_EDEVICE;                                                      \
        }                                                                           \
    } while (0)

/* for functions that cannot return an error: log and go on */
#define CUDA_LOG(call)                                                              \
    do {                                                                            \
        cudaError_t ps_e_ = (call);                                                 \
        if (ps_e_ != cudaSuccess)                                                   \
            ps_error("%s:%d: %s: %s", __FILE__, __LINE__, #call,                    \
                     cudaGetErrorString(ps_e_));                                    \
    } while (0)

/* Launch errors (bad configuration, no kernel image for this GPU) show up in
 * cudaGetLastError right after the launch; faults inside the kernel show up
 * at the next synchronizing call. */
#define LAUNCH_CHECK(kernel_name)                                                   \
    do {                                                                            \
        cudaError_t ps_e_ = cudaGetLastError();                                     \
        if (ps_e_ != cudaSuccess) {                                                 \
            ps_error("%s:%d: launch of %s: %s", __FILE__, __LINE__, kernel_name,    \
                     cudaGetErrorString(ps_e_));                                    \
            return PS_EDEVICE;                                                      \
        }                                                                           \
    } while (0)

struct xent_result {
    float loss; /* mean over rows */
    int correct;
};

struct dnn_state; /* backend_cudnn.cu */

/* Threads per block of our kernels; max_blocks counts blocks of this size. */
enum { THREADS = 256 };

struct cuda_ctx {
    int device;
    unsigned max_blocks; /* grid cap for grid-stride kernels */
    cudaStream_t stream[2];
    cublasHandle_t blas;
    /* softmax_xent: per-row loss and hit, reduced by a second kernel */
    float *row_loss;
    int *row_correct;
    size_t row_cap;
    xent_result *d_result; /* device */
    xent_result *h_result; /* pinned host */
    dnn_state *dnn;        /* NULL: no cuDNN (not built, PS_CUDNN=0, or it failed to start) */
    char name[24];
};

static inline cuda_ctx *ctx_of(ps_backend *b) { return (cuda_ctx *)b->ctx; }

/* The current device is per host thread; the comm thread and the training
 * thread each call in, so every entry point sets it (cheap after the first). */
#define SET_DEVICE(c) CUDA_CHECK(cudaSetDevice((c)->device))

/* backend_cuda_kernels.cu: fill b's fill, bias_add, bias_grad, relu_*,
 * softmax_xent*, im2col, col2im, maxpool_* and axpy entries. */
void ps_cuda_kernels_attach(ps_backend *b);

/* backend_cudnn.cu.  Attach: start cuDNN on c's compute stream and fill b's
 * conv_* and pool_* entries; they stay NULL (the layers then use im2col +
 * cuBLAS and our pooling kernels) when built without cuDNN, under
 * PS_CUDNN=0, or when cuDNN cannot start (a warning says why).  tf32: the
 * convolutions may use TF32 tensor cores (PS_CUDA_TF32=1), else exact FP32.
 * Release frees what attach made, after the streams are idle. */
void ps_cudnn_attach(ps_backend *b, cuda_ctx *c, bool tf32);
void ps_cudnn_release(cuda_ctx *c);

#endif
