/* A shim over the CUDA runtime for fault tests (LD_PRELOAD it into a
 * program linked with the shared libcudart, as the Makefile links
 * ps_worker): PS_FAKE_CUDA picks the fault, and every call it does not fake
 * goes to the real runtime (dlsym RTLD_NEXT).
 *
 *   nodriver    cudaGetDeviceCount: cudaErrorInsufficientDriver, and
 *               cudaDriverGetVersion 0: a machine without a GPU driver
 *   olddriver   cudaGetDeviceCount: cudaErrorInsufficientDriver, with a
 *               driver of CUDA 12.4
 *   nodevice    cudaGetDeviceCount: cudaErrorNoDevice (a driver, no GPU)
 *   exclusive   one device, in EXCLUSIVE_PROCESS compute mode and held by
 *               another process: cudaSetDevice fails with
 *               cudaErrorDevicesUnavailable (the second worker on the GPU)
 *   sticky:N    the real device until cudaEventQuery has been called N
 *               times; from then on the queries, syncs, copies, records
 *               and cudaGetLastError fail with cudaErrorIllegalAddress, as
 *               after a kernel's illegal access (a sticky error: needs a GPU)
 *
 * The first four need no GPU: they stop before anything touches one. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

static const char *mode(void)
{
    const char *m = getenv("PS_FAKE_CUDA");
    return m ? m : "";
}

static int is(const char *m) { return strcmp(mode(), m) == 0; }

/* real_: the real runtime's fn, looked up on first use */
#define REAL(fn)                                                                 \
    static __typeof__(fn) *real_;                                                \
    if (!real_)                                                                  \
    real_ = (__typeof__(fn) *)dlsym(RTLD_NEXT, #fn)

cudaError_t cudaGetDeviceCount(int *count)
{
    REAL(cudaGetDeviceCount);
    if (is("nodriver") || is("olddriver")) {
        *count = 0;
        return cudaErrorInsufficientDriver;
    }
    if (is("nodevice")) {
        *count = 0;
        return cudaErrorNoDevice;
    }
    if (is("exclusive")) {
        *count = 1;
        return cudaSuccess;
    }
    return real_(count);
}

cudaError_t cudaDriverGetVersion(int *version)
{
    REAL(cudaDriverGetVersion);
    if (is("nodriver")) {
        *version = 0;
        return cudaSuccess;
    }
    if (is("olddriver") || is("nodevice") || is("exclusive")) {
        *version = is("olddriver") ? 12040 : 13000;
        return cudaSuccess;
    }
    return real_(version);
}

cudaError_t cudaSetDevice(int device)
{
    REAL(cudaSetDevice);
    if (is("exclusive"))
        return cudaErrorDevicesUnavailable;
    return real_(device);
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    REAL(cudaDeviceGetAttribute);
    if (is("exclusive")) {
        *value = attr == cudaDevAttrComputeMode ? cudaComputeModeExclusiveProcess : 1;
        return cudaSuccess;
    }
    return real_(value, attr, device);
}

/* ---- sticky:N ---- */

static long g_queries;
static int g_broken;

static int broken(void)
{
    return __atomic_load_n(&g_broken, __ATOMIC_ACQUIRE);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    REAL(cudaEventQuery);
    if (strncmp(mode(), "sticky:", 7) == 0 &&
        __atomic_add_fetch(&g_queries, 1, __ATOMIC_ACQ_REL) > atol(mode() + 7))
        __atomic_store_n(&g_broken, 1, __ATOMIC_RELEASE);
    return broken() ? cudaErrorIllegalAddress : real_(e);
}

cudaError_t cudaGetLastError(void)
{
    REAL(cudaGetLastError);
    return broken() ? cudaErrorIllegalAddress : real_();
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    REAL(cudaEventSynchronize);
    return broken() ? cudaErrorIllegalAddress : real_(e);
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    REAL(cudaEventRecord);
    return broken() ? cudaErrorIllegalAddress : real_(e, s);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    REAL(cudaStreamSynchronize);
    return broken() ? cudaErrorIllegalAddress : real_(s);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    REAL(cudaStreamWaitEvent);
    return broken() ? cudaErrorIllegalAddress : real_(s, e, flags);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s)
{
    REAL(cudaMemcpyAsync);
    return broken() ? cudaErrorIllegalAddress : real_(dst, src, n, k, s);
}
