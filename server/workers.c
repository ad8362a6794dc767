#include "workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "server.h"

typedef struct worker_info {
    unsigned char id[256];
    size_t id_len;
    int64_t last_ns; /* when anything last came from this rank */
    int silent;      /* PS_LOSS_WAIT: its silence was logged */
    int dropped;     /* PS_LOSS_DROP: out of the live set until it says hello */
} worker_info;

struct ps_workers {
    int num_workers, timeout_ms, on_loss;
    worker_info **w;  /* per rank, NULL until its hello */
    uint8_t *hello;   /* per rank: w[r] != NULL */
    int seen, ndropped;
    uint64_t nlost, nrejoined;
};

int ps_workers_create(int num_workers, int timeout_ms, int on_loss, ps_workers **out)
{
    *out = NULL;
    ps_workers *w = calloc(1, sizeof *w);
    if (!w)
        return PS_ENOMEM;
    w->w = calloc((size_t)num_workers, sizeof *w->w);
    w->hello = calloc((size_t)num_workers, 1);
    if (!w->w || !w->hello) {
        free(w->w);
        free(w->hello);
        free(w);
        return PS_ENOMEM;
    }
    w->num_workers = num_workers;
    w->timeout_ms = timeout_ms;
    w->on_loss = on_loss;
    *out = w;
    return 0;
}

void ps_workers_destroy(ps_workers *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->num_workers; i++)
        free(w->w[i]);
    free(w->w);
    free(w->hello);
    free(w);
}

static worker_info *add(ps_workers *w, int rank)
{
    worker_info *wi = calloc(1, sizeof *wi);
    if (!wi)
        return NULL;
    w->w[rank] = wi;
    w->hello[rank] = 1;
    w->seen++;
    return wi;
}

static void id_hex(const unsigned char *p, size_t n, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 3 < len && i < 8; i++)
        o += (size_t)snprintf(out + o, len - o, "%02x", p[i]);
}

int ps_workers_hello(ps_workers *w, int rank, const void *id, size_t n, int64_t now,
                     int *rejoined)
{
    worker_info *wi = w->w[rank];
    char hex[40];
    id_hex(id, n, hex, sizeof hex);
    *rejoined = 0;
    if (!wi) {
        if (!(wi = add(w, rank)))
            return PS_ENOMEM;
        ps_info("hello from worker %d (identity %s), %d of %d workers", rank, hex, w->seen,
                w->num_workers);
    } else if (wi->dropped) {
        wi->dropped = 0;
        w->ndropped--;
        w->nrejoined++;
        *rejoined = 1;
        ps_info("worker %d said hello again (identity %s): rejoined at the current "
                "version; rounds and barriers wait for %d of %d workers again",
                rank, hex, w->num_workers - w->ndropped, w->num_workers);
    } else if (wi->id_len != n || memcmp(wi->id, id, n) != 0) {
        ps_info("hello again from worker %d with a new connection (identity %s)", rank, hex);
    } else {
        ps_debug("hello again from worker %d", rank);
    }
    wi->id_len = n < sizeof wi->id ? n : sizeof wi->id;
    memcpy(wi->id, id, wi->id_len);
    wi->last_ns = now;
    wi->silent = 0;
    return 0;
}

int ps_workers_restore(ps_workers *w, const uint8_t *hello, int64_t now)
{
    for (int r = 0; r < w->num_workers; r++) {
        if (!hello[r] || w->w[r])
            continue;
        worker_info *wi = add(w, r);
        if (!wi)
            return PS_ENOMEM;
        wi->last_ns = now;
    }
    return 0;
}

int ps_workers_heard(ps_workers *w, int rank, int64_t now)
{
    worker_info *wi = w->w[rank];
    if (!wi)
        return PS_WORKER_UNKNOWN;
    if (wi->dropped)
        return PS_WORKER_DROPPED;
    if (wi->silent)
        ps_info("worker %d is heard from again after %.1f s", rank,
                (double)(now - wi->last_ns) * 1e-9);
    wi->silent = 0;
    wi->last_ns = now;
    return PS_WORKER_LIVE;
}

int ps_workers_check(ps_workers *w, int64_t now)
{
    if (w->timeout_ms <= 0)
        return -1;
    int64_t limit = (int64_t)w->timeout_ms * 1000000LL;
    for (int r = 0; r < w->num_workers; r++) {
        worker_info *wi = w->w[r];
        if (!wi || wi->dropped || wi->silent || now - wi->last_ns <= limit)
            continue;
        double silent_s = (double)(now - wi->last_ns) * 1e-9;
        w->nlost++;
        if (w->on_loss == PS_LOSS_DROP) {
            wi->dropped = 1;
            w->ndropped++;
            ps_warn("worker %d silent for %.1f s: dropped; rounds continue with %d of %d "
                    "workers", r, silent_s, w->num_workers - w->ndropped, w->num_workers);
            return r;
        }
        wi->silent = 1;
        ps_warn("worker %d silent for %.1f s; rounds and barriers keep waiting for it "
                "(--on-worker-loss wait)", r, silent_s);
    }
    return -1;
}

const uint8_t *ps_workers_hello_flags(const ps_workers *w) { return w->hello; }

int ps_workers_seen(const ps_workers *w) { return w->seen; }

uint64_t ps_workers_lost(const ps_workers *w) { return w->nlost; }

uint64_t ps_workers_rejoined(const ps_workers *w) { return w->nrejoined; }
