/* The I/O thread's snapshot sessions (export.h). */
#include "export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_limits.h"
#include "ps_log.h"
#include "ps_snap.h"
#include "reply.h"

enum { NONE = 0, COLLECTING = 1, READY = 2 };

struct ps_export {
    int threads;
    int state;
    uint64_t token, count;
    /* the request: its route, id and its own targets */
    unsigned char route[256];
    size_t route_len;
    zmq_msg_t id;
    int have_id;
    uint64_t seq;
    int32_t rank;
    ps_snap_target *targets;
    size_t ntargets;
    int64_t deadline_ns, last_ns;
    int flushed;
    /* the parts */
    uint8_t *got;
    int ngot, rc;
    char why[256];
    ps_snap_buf **items;
    size_t n, cap;
    uint64_t bytes;
    ps_header reply; /* once READY */
};

int ps_export_create(int threads, ps_export **out)
{
    ps_export *e = calloc(1, sizeof *e);
    if (e)
        e->got = calloc((size_t)threads, 1);
    if (!e || !e->got) {
        free(e);
        *out = NULL;
        return PS_ENOMEM;
    }
    e->threads = threads;
    zmq_msg_init(&e->id);
    *out = e;
    return 0;
}

static void drop(ps_export *e)
{
    for (size_t k = 0; k < e->n; k++)
        ps_snap_buf_unref(e->items[k]);
    free(e->items);
    e->items = NULL;
    e->n = e->cap = 0;
    free(e->targets);
    e->targets = NULL;
    e->ntargets = 0;
    zmq_msg_close(&e->id);
    zmq_msg_init(&e->id);
    e->have_id = 0;
    e->state = NONE;
}

void ps_export_destroy(ps_export *e)
{
    if (!e)
        return;
    drop(e);
    zmq_msg_close(&e->id);
    free(e->got);
    free(e);
}

static int same_route(const ps_export *e, zmq_msg_t *id)
{
    return zmq_msg_size(id) == e->route_len && !memcmp(zmq_msg_data(id), e->route, e->route_len);
}

int ps_export_begin(ps_export *e, zmq_msg_t *id, const ps_header *h, const void *targets,
                    size_t bytes, int64_t now, uint64_t *token, const ps_snap_target **t,
                    size_t *nt, int *send, ps_header *reply, char *why, size_t why_len)
{
    *send = 0;
    if (e->state != NONE && same_route(e, id) && e->seq == h->seq) {
        e->last_ns = now;
        if (e->state == READY) { /* its reply went: again */
            *reply = e->reply;
            *send = 2;
        }
        return 0;
    }
    if (bytes % sizeof(ps_snap_target)) {
        ps_errorf(why, why_len, "snapshot: its targets frame has %zu bytes, not a multiple of "
            "%zu (u64 key, i64 version)", bytes, sizeof(ps_snap_target));
        return PS_EPROTO;
    }
    if (zmq_msg_size(id) > sizeof e->route) {
        ps_errorf(why, why_len, "snapshot: a routing id of %zu bytes", zmq_msg_size(id));
        return PS_EPROTO;
    }
    size_t n = bytes / sizeof(ps_snap_target);
    ps_snap_target *tg = malloc(n ? bytes : 1);
    if (!tg) {
        ps_errorf(why, why_len, "out of memory starting a snapshot");
        return PS_ENOMEM;
    }
    if (n)
        memcpy(tg, targets, bytes);
    if (e->state != NONE)
        ps_warn("export: a snapshot from another connection (or request) replaces the one under "
                "way; its reader's next page is refused");
    drop(e);
    e->targets = tg;
    e->ntargets = n;
    e->route_len = zmq_msg_size(id);
    memcpy(e->route, zmq_msg_data(id), e->route_len);
    zmq_msg_copy(&e->id, id);
    e->have_id = 1;
    e->seq = h->seq;
    e->rank = h->rank;
    uint64_t wait = h->total < PS_EXPORT_MAX_WAIT_MS ? h->total : PS_EXPORT_MAX_WAIT_MS;
    e->deadline_ns = now + (int64_t)wait * 1000000;
    e->last_ns = now;
    e->flushed = 0;
    memset(e->got, 0, (size_t)e->threads);
    e->ngot = 0;
    e->rc = 0;
    e->why[0] = 0;
    e->bytes = 0;
    e->state = COLLECTING;
    e->token++;
    *token = e->token;
    *t = tg;
    *nt = n;
    *send = 1;
    return 0;
}

int ps_export_part(ps_export *e, int i, ps_snap_frame *sf, int64_t now, zmq_msg_t *id,
                   ps_header *reply)
{
    if (e->state != COLLECTING || sf->token != e->token || i < 0 || i >= e->threads ||
        e->got[i]) {
        /* a replaced session's: its items go */
        for (size_t k = 0; k < sf->n; k++)
            ps_snap_buf_unref(sf->items[k]);
        free(sf->items);
        return 0;
    }
    e->got[i] = 1;
    e->ngot++;
    if (sf->rc && !e->rc) {
        e->rc = sf->rc;
        snprintf(e->why, sizeof e->why, "%s", sf->why);
    }
    if (!sf->rc && e->n + sf->n > e->cap) {
        size_t nc = e->cap ? e->cap : 64;
        while (nc < e->n + sf->n)
            nc *= 2;
        ps_snap_buf **a = realloc(e->items, nc * sizeof *a);
        if (a) {
            e->items = a;
            e->cap = nc;
        } else if (!e->rc) {
            e->rc = PS_ENOMEM;
            snprintf(e->why, sizeof e->why, "out of memory collecting a snapshot");
        }
    }
    for (size_t k = 0; k < sf->n; k++) {
        if (!e->rc && e->n < e->cap) {
            e->items[e->n++] = sf->items[k];
            e->bytes += sf->items[k]->len;
        } else {
            ps_snap_buf_unref(sf->items[k]);
        }
    }
    free(sf->items);
    if (e->ngot < e->threads)
        return 0;
    /* complete: the reply (versions over the items) */
    e->last_ns = now;
    if (e->rc) {
        ps_reply_error(reply, e->seq, e->rank, 0, 0, e->rc, e->why);
    } else {
        int64_t lo = 0, hi = 0;
        for (size_t k = 0; k < e->n; k++) {
            ps_snap_item it;
            char why[8];
            if (ps_snap_parse(e->items[k]->data, e->items[k]->len, &it, why, sizeof why) != 0)
                continue;
            if (!k || it.version < lo)
                lo = it.version;
            if (!k || it.version > hi)
                hi = it.version;
        }
        ps_reply_header(reply, PS_MSG_SNAPSHOT, e->seq, e->rank, 0, 0);
        reply->chunk_version = lo;
        reply->count = e->n;
        reply->total = (uint64_t)hi;
        e->count++;
        ps_info("export: snapshot %llu taken: %zu items, %.1f MiB, versions %lld..%lld",
                (unsigned long long)e->token, e->n, (double)e->bytes / 1048576.0, (long long)lo,
                (long long)hi);
    }
    e->reply = *reply;
    zmq_msg_init(id);
    zmq_msg_move(id, &e->id);
    int sent = e->have_id;
    e->have_id = 0;
    if (e->rc)
        drop(e);
    else
        e->state = READY;
    return sent;
}

static void page_free(void *data, void *hint)
{
    (void)data;
    ps_snap_buf_unref(hint);
}

int ps_export_read(ps_export *e, zmq_msg_t *id, const ps_header *h, int64_t now,
                   zmq_msg_t *page, ps_header *reply, char *why, size_t why_len)
{
    if (e->state != READY || !same_route(e, id)) {
        ps_errorf(why, why_len, "snapread: no snapshot of this connection is ready here (it "
            "was replaced by another, or went idle for %d s): take the snapshot again",
            PS_EXPORT_IDLE_MS / 1000);
        return PS_ESTATE;
    }
    if (h->key >= e->n) {
        ps_errorf(why, why_len, "snapread: item %llu of %zu", (unsigned long long)h->key, e->n);
        return PS_EPROTO;
    }
    ps_snap_buf *b = e->items[h->key];
    if (!b) {
        ps_errorf(why, why_len, "snapread: item %llu was read already", (unsigned long long)h->key);
        return PS_ESTATE;
    }
    uint64_t off = (uint64_t)h->chunk * PS_SNAP_PAGE_BYTES;
    if (off >= b->len) {
        ps_errorf(why, why_len, "snapread: page %u of item %llu, which has %zu bytes", h->chunk,
            (unsigned long long)h->key, b->len);
        return PS_EPROTO;
    }
    size_t len = b->len - off < PS_SNAP_PAGE_BYTES ? (size_t)(b->len - off) : PS_SNAP_PAGE_BYTES;
    atomic_fetch_add(&b->refs, 1);
    if (zmq_msg_init_data(page, b->data + off, len, page_free, b) != 0) {
        atomic_fetch_sub(&b->refs, 1);
        ps_errorf(why, why_len, "out of memory sending a page");
        return PS_ENOMEM;
    }
    ps_reply_header(reply, PS_MSG_SNAPREAD, h->seq, h->rank, h->key, h->chunk);
    reply->count = len;
    reply->total = b->len;
    e->last_ns = now;
    if (off + len == b->len) { /* its last page: the session's reference goes */
        e->items[h->key] = NULL;
        ps_snap_buf_unref(b);
        size_t left = 0;
        for (size_t k = 0; k < e->n; k++)
            left += e->items[k] != NULL;
        if (!left)
            drop(e);
    }
    return 0;
}

int ps_export_tick(ps_export *e, int64_t now)
{
    if (e->state == COLLECTING && !e->flushed && now >= e->deadline_ns) {
        e->flushed = 1;
        return 1;
    }
    if (e->state == READY && now - e->last_ns > (int64_t)PS_EXPORT_IDLE_MS * 1000000) {
        ps_warn("export: snapshot %llu dropped: not read for %d s", (unsigned long long)e->token,
                PS_EXPORT_IDLE_MS / 1000);
        drop(e);
    }
    return 0;
}

int ps_export_busy(const ps_export *e) { return e->state != NONE; }

uint64_t ps_export_count(const ps_export *e) { return e->count; }
