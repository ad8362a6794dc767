/* libps: ps_client_export (include/ps_client.h): a snapshot of every
 * server, read page by page into the export's folder (export_write.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "client_read.h"
#include "export_write.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_limits.h"
#include "ps_log.h"
#include "ps_time.h"

#define SNAP_TRIES 20
#define SNAP_WAIT_MS 10000
/* pages asked for at once while reading an item */
#define PAGES_IN_FLIGHT 8

/* Every server's snapshot at target (and the keys' own): 0, PS_ESTATE when
 * a server's training went past it (the caller asks again), or an error
 * (last_error). */
static int take(ps_client *c, int64_t target, const void *tg, size_t tg_bytes, int wait_ms,
                psc_snap_io *io)
{
    int ns = c->nservers, rc = 0;
    ps_request *reqs = ns > 0 ? calloc((size_t)ns, sizeof *reqs) : NULL;
    if (!reqs)
        return PS_ENOMEM;
    for (int s = 0; s < ns; s++) {
        io[s].wait_ms = (uint32_t)wait_ms;
        psc_snapshot_post(c, s, target, tg, tg_bytes, &io[s], &reqs[s]);
    }
    for (int s = 0; s < ns; s++) {
        int st = ps_request_wait(&reqs[s]);
        if (st && (!rc || rc == PS_ESTATE)) {
            rc = st;
            snprintf(c->last_error, sizeof c->last_error, "export: %s", reqs[s].err);
        }
    }
    free(reqs);
    return rc;
}

/* The newest version of any item of any server (its stats). */
static int newest(ps_client *c, int64_t *v)
{
    *v = 0;
    for (int s = 0; s < c->nservers; s++) {
        ps_stats st;
        int rc = ps_client_stats(c, s, &st);
        if (rc)
            return rc;
        if (st.max_version > *v)
            *v = st.max_version;
    }
    return 0;
}

/* Item k of server s, whole, into a new buffer (*buf, *len). */
static int read_item(ps_client *c, int s, uint64_t k, unsigned char **buf, size_t *len)
{
    unsigned char *first = malloc(PS_SNAP_PAGE_BYTES);
    if (!first)
        return PS_ENOMEM;
    psc_page_io io = {k, 0, first, PS_SNAP_PAGE_BYTES, 0, 0};
    ps_request req;
    psc_snapread_post(c, s, &io, &req);
    int rc = ps_request_wait(&req);
    if (rc) {
        snprintf(c->last_error, sizeof c->last_error, "export: %s", req.err);
        free(first);
        return rc;
    }
    if (io.got == io.total) { /* one page: shrink to fit */
        unsigned char *b = realloc(first, io.total ? io.total : 1);
        *buf = b ? b : first;
        *len = io.total;
        return 0;
    }
    if (io.total > ((uint64_t)1 << 40) || io.got != PS_SNAP_PAGE_BYTES) {
        free(first);
        snprintf(c->last_error, sizeof c->last_error, "export: server %d item %llu: a first page "
                 "of %llu bytes of %llu", s, (unsigned long long)k, (unsigned long long)io.got,
                 (unsigned long long)io.total);
        return PS_EPROTO;
    }
    unsigned char *b = malloc(io.total);
    if (!b) {
        free(first);
        return PS_ENOMEM;
    }
    memcpy(b, first, io.got);
    free(first);
    uint32_t pages = (uint32_t)((io.total + PS_SNAP_PAGE_BYTES - 1) / PS_SNAP_PAGE_BYTES);
    psc_page_io pio[PAGES_IN_FLIGHT];
    ps_request preq[PAGES_IN_FLIGHT];
    for (uint32_t p0 = 1; !rc && p0 < pages; p0 += PAGES_IN_FLIGHT) {
        uint32_t np = pages - p0 < PAGES_IN_FLIGHT ? pages - p0 : PAGES_IN_FLIGHT;
        for (uint32_t j = 0; j < np; j++) {
            uint64_t off = (uint64_t)(p0 + j) * PS_SNAP_PAGE_BYTES;
            pio[j] = (psc_page_io){k, p0 + j, b + off, (size_t)(io.total - off), 0, 0};
            psc_snapread_post(c, s, &pio[j], &preq[j]);
        }
        for (uint32_t j = 0; j < np; j++) {
            int st = ps_request_wait(&preq[j]);
            uint64_t off = (uint64_t)(p0 + j) * PS_SNAP_PAGE_BYTES;
            uint64_t want = io.total - off < PS_SNAP_PAGE_BYTES ? io.total - off
                                                                : PS_SNAP_PAGE_BYTES;
            if (st && !rc) {
                rc = st;
                snprintf(c->last_error, sizeof c->last_error, "export: %s", preq[j].err);
            } else if (!st && !rc && pio[j].got != want) {
                rc = PS_EPROTO;
                snprintf(c->last_error, sizeof c->last_error, "export: server %d item %llu page "
                         "%u: %llu bytes, not %llu", s, (unsigned long long)k, p0 + j,
                         (unsigned long long)pio[j].got, (unsigned long long)want);
            }
        }
    }
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = io.total;
    return 0;
}

int ps_client_export(ps_client *c, const char *dir, int flags, int64_t version,
                     const uint64_t *keys, const int64_t *versions, size_t nkeys, int wait_ms)
{
    if (!c || !dir || (nkeys && (!keys || !versions)))
        return PS_EINVAL;
    if (!c->started) {
        snprintf(c->last_error, sizeof c->last_error, "export before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    int64_t t0 = ps_now_ns();
    int sync = c->opt.mode == PS_MODE_SYNC;
    /* the keys' own versions, as the SNAPSHOT's frame has them */
    size_t tg_bytes = nkeys * 16;
    unsigned char *tg = malloc(tg_bytes ? tg_bytes : 1);
    psc_snap_io *io = calloc((size_t)c->nservers, sizeof *io);
    if (!tg || !io) {
        free(tg);
        free(io);
        return PS_ENOMEM;
    }
    for (size_t k = 0; k < nkeys; k++) {
        memcpy(tg + 16 * k, &keys[k], 8);
        int64_t v = sync ? versions[k] : -1;
        memcpy(tg + 16 * k + 8, &v, 8);
    }
    int rc = PS_ESTATE;
    int64_t target = -1;
    for (int tries = 0; rc == PS_ESTATE && tries < SNAP_TRIES; tries++) {
        target = -1;
        if (sync && version >= 0)
            target = version;
        else if (sync && (rc = newest(c, &target)) != 0)
            break;
        rc = take(c, target, tg, tg_bytes, wait_ms < 0 ? SNAP_WAIT_MS : wait_ms, io);
        if (rc == PS_ESTATE && version >= 0)
            break; /* the version asked for is gone: say so */
        if (rc == PS_ESTATE)
            ps_debug("export: training went past version %lld; the snapshot again",
                     (long long)target);
    }
    free(tg);
    if (rc) {
        free(io);
        if (!c->last_error[0])
            snprintf(c->last_error, sizeof c->last_error, "export: %s", ps_strerror(rc));
        return rc;
    }
    int64_t t1 = ps_now_ns();
    char from[1024];
    size_t off = 0;
    for (int s = 0; s < c->nservers && off < sizeof from; s++)
        off += (size_t)snprintf(from + off, sizeof from - off, "%s%s", s ? "," : "",
                                c->endpoints[s]);
    ps_export_info info = {"live", from, c->opt.mode, c->nservers, (flags & PS_EXPORT_STATE) != 0,
                           target, nkeys > 0};
    ps_export_writer *w;
    char why[PSC_ERRBUF - 64];
    if ((rc = ps_export_writer_open(dir, &info, &w, why, sizeof why)) != 0) {
        free(io);
        snprintf(c->last_error, sizeof c->last_error, "%s", why);
        return rc;
    }
    for (int s = 0; s < c->nservers && !rc; s++)
        for (uint64_t k = 0; k < io[s].items && !rc; k++) {
            unsigned char *buf;
            size_t len;
            if ((rc = read_item(c, s, k, &buf, &len)) != 0)
                break;
            if ((rc = ps_export_writer_add(w, buf, len, why, sizeof why)) != 0)
                snprintf(c->last_error, sizeof c->last_error, "export: server %d: %s", s, why);
        }
    free(io);
    if (rc) {
        ps_export_writer_abort(w);
        return rc;
    }
    int64_t t2 = ps_now_ns();
    uint64_t bytes;
    if ((rc = ps_export_writer_finish(w, &bytes, why, sizeof why)) != 0) {
        snprintf(c->last_error, sizeof c->last_error, "%s", why);
        return rc;
    }
    ps_info("export to %s: %.1f MiB in %.2f s (snapshot %.2f s, reading %.2f s, writing %.2f s)",
            dir, (double)bytes / 1048576.0, (double)(ps_now_ns() - t0) / 1e9,
            (double)(t1 - t0) / 1e9, (double)(t2 - t1) / 1e9, (double)(ps_now_ns() - t2) / 1e9);
    return 0;
}
