/* ps_backend_create: map a --device string to a backend. */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "ps_error.h"

/* Strict "cuda:N": N is a non-negative decimal that fits an int, no sign, no
 * spaces, no trailing text.  Returns 1 and sets *index, or 0. */
static int parse_cuda_index(const char *device, int *index)
{
    const char *p = device + 5; /* after "cuda:" */
    if (!*p)
        return 0;
    long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (*p - '0');
        if (v > 1000000) /* no host has that many GPUs; also keeps v an int */
            return 0;
    }
    *index = (int)v;
    return 1;
}

int ps_backend_create(const char *device, int threads, ps_backend **out, char *why,
                      size_t why_len)
{
    if (!out) {
        snprintf(why, why_len, "ps_backend_create: out is NULL");
        return PS_EINVAL;
    }
    *out = NULL;
    if (!device)
        device = "cpu";
    if (strcmp(device, "cpu") == 0) {
        int rc = ps_backend_cpu_create(threads, out);
        if (rc)
            snprintf(why, why_len, "--device cpu: %s", ps_strerror(rc));
        return rc;
    }
    int index;
    if (strncmp(device, "cuda:", 5) == 0 && parse_cuda_index(device, &index)) {
#ifdef PS_HAVE_CUDA
        return ps_backend_cuda_create(index, out, why, why_len);
#else
        (void)index;
        snprintf(why, why_len,
                 "--device %s: this build has no CUDA backend (rebuild with nvcc present, or use "
                 "--device cpu)",
                 device);
        return PS_EDEVICE;
#endif
    }
    snprintf(why, why_len,
             "--device '%s': expected 'cpu' or 'cuda:N' with N a GPU index (e.g. cuda:0)", device);
    return PS_EINVAL;
}
