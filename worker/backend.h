/* The compute backends of ps_worker: the CPU one (OpenBLAS, backend_cpu.c)
 * and the CUDA one (cuBLAS, backend_cuda.cu, + our kernels,
 * backend_cuda_kernels.cu), behind the interface of client/ps_backend.h. */
#ifndef PS_BACKEND_H
#define PS_BACKEND_H

#include "ps_backend.h"

/* Create the backend for a --device string: "cpu" or "cuda:N".  threads: BLAS
 * threads for the CPU backend (1 by default).  On failure writes a message
 * into why: "--device cuda:0: no CUDA device is usable (cudaGetDeviceCount:
 * ...)" and returns PS_EDEVICE, PS_EINVAL for a malformed string. */
int ps_backend_create(const char *device, int threads, ps_backend **out, char *why,
                      size_t why_len);

int ps_backend_cpu_create(int threads, ps_backend **out);
/* Defined only when built with CUDA (PS_HAVE_CUDA). */
int ps_backend_cuda_create(int device, ps_backend **out, char *why, size_t why_len);
/* backend_cuda_emb.cu: the click-through model's kernels (ps_backend.h's
 * emb_bag_fwd .. bce_logits) onto the CUDA backend b that create is making,
 * on its device and compute stream (a cudaStream_t); detach frees their
 * state (also after a failed attach).  0 or PS_EDEVICE, PS_ENOMEM. */
int ps_backend_cuda_ctr_attach(ps_backend *b, int device, void *compute_stream,
                               unsigned max_blocks);
void ps_backend_cuda_ctr_detach(ps_backend *b);

#endif
