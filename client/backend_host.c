/* The host-memory backend (backend.h): what the exchange needs and nothing
 * more.  Buffers are aligned host memory, copies are memcpy, streams are
 * no-ops and events are always signalled: everything is complete when the
 * call returns.  It is part of libps, so a caller of the exchange that
 * computes elsewhere (the PyTorch wrapper over libps.so) needs no BLAS; the
 * CPU backend (backend_cpu.c) starts from it and adds the kernels. */
#include <stdlib.h>
#include <string.h>

#include "ps_backend.h"
#include "ps_exchange.h"
#include "ps_error.h"

/* Large enough for AVX-512 loads and a cache line. */
#define HOST_ALIGN 64

struct ps_event {
    int unused; /* host work is complete on return: nothing to record */
};

static int host_alloc(ps_backend *b, size_t bytes, void **out)
{
    (void)b;
    /* aligned_alloc wants a multiple of the alignment; never hand back NULL
     * for 0 bytes so callers can treat NULL as "not allocated". */
    size_t rounded = (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    if (rounded < bytes)
        return PS_ENOMEM;
    if (rounded == 0)
        rounded = HOST_ALIGN;
    void *p = aligned_alloc(HOST_ALIGN, rounded);
    if (!p)
        return PS_ENOMEM;
    *out = p;
    return 0;
}

static void host_free(ps_backend *b, void *p)
{
    (void)b;
    free(p);
}

static int host_copy(ps_backend *b, void *dst, const void *src, size_t bytes, int kind, int stream)
{
    (void)b;
    (void)stream;
    if (kind < 0 || kind > 2)
        return PS_EINVAL;
    if (bytes == 0 || dst == src)
        return 0;
    if (!dst || !src)
        return PS_EINVAL;
    memcpy(dst, src, bytes);
    return 0;
}

static int host_fill(ps_backend *b, float *x, float value, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        x[i] = value;
    return 0;
}

static int host_axpy(ps_backend *b, float *y, float alpha, const float *x, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
    return 0;
}

static int host_event_create(ps_backend *b, ps_event **out)
{
    (void)b;
    ps_event *e = calloc(1, sizeof *e);
    if (!e)
        return PS_ENOMEM;
    *out = e;
    return 0;
}

static void host_event_destroy(ps_backend *b, ps_event *e)
{
    (void)b;
    free(e);
}

/* record, stream_wait_event, event_sync and stream_sync: nothing is ever
 * pending on the host */
static int host_event_op(ps_backend *b, ps_event *e, int stream)
{
    (void)b;
    (void)e;
    (void)stream;
    return 0;
}

static int host_stream_wait_event(ps_backend *b, int stream, ps_event *e)
{
    return host_event_op(b, e, stream);
}

static int host_event_sync(ps_backend *b, ps_event *e)
{
    return host_event_op(b, e, 0);
}

static int host_event_query(ps_backend *b, ps_event *e)
{
    (void)b;
    (void)e;
    return 1;
}

static int host_stream_sync(ps_backend *b, int stream)
{
    return host_event_op(b, NULL, stream);
}

static void host_destroy(ps_backend *b)
{
    free(b);
}

static void host_init(ps_backend *b)
{
    memset(b, 0, sizeof *b);
    b->name = "host";
    b->host_memory = 1;
    b->alloc = host_alloc;
    b->free = host_free;
    /* host memory is already what the "device" copies from */
    b->alloc_host = host_alloc;
    b->free_host = host_free;
    b->copy = host_copy;
    b->fill = host_fill;
    b->axpy = host_axpy;
    b->event_create = host_event_create;
    b->event_destroy = host_event_destroy;
    b->event_record = host_event_op;
    b->stream_wait_event = host_stream_wait_event;
    b->event_sync = host_event_sync;
    b->event_query = host_event_query;
    b->stream_sync = host_stream_sync;
    b->destroy = host_destroy;
}

int ps_backend_host_create(ps_backend **out)
{
    if (!out)
        return PS_EINVAL;
    ps_backend *b = malloc(sizeof *b);
    if (!b)
        return PS_ENOMEM;
    host_init(b);
    *out = b;
    return 0;
}

void ps_backend_host_destroy(ps_backend *b)
{
    if (b)
        b->destroy(b);
}
