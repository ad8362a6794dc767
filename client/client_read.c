/* libps: readers' lookups and exports' snapshot messages (client_read.h). */
#include "client_read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_moved.h"
#include "ps_client.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_limits.h"
#include "ps_table_row.h"

/* One LOOKUP's block (slot.own): its tables' entries (16 bytes each), its
 * ids, where each id's row goes, and the reply's rows; dims per entry. */
typedef struct lk_sub {
    size_t nent, nids;
    unsigned char *ent;  /* nent x (u64 key, u32 ids, u32 dim) */
    uint64_t *ids;
    float **dst;         /* per id: its row's place in the caller's rows */
    uint32_t *dims;      /* per entry */
    uint32_t *counts;    /* per entry */
    float *rows;         /* the reply's rows (the slot's dst) */
} lk_sub;

size_t psc_read_parts(const ps_client *c)
{
    size_t n = 0;
    for (int s = 0; s < c->nservers; s++)
        n += c->server_parts[s];
    return n;
}

/* The flat partition of (key, id) (client_sparse.c's order: server s's
 * partitions after those of the servers before it). */
static size_t flat_of(const ps_client *c, const size_t *base, uint64_t key, uint64_t id)
{
    uint64_t h = ps_table_row_hash(key, id);
    int s = ps_table_row_server(h, c->nservers);
    return base[s] + ps_table_row_part(h, c->nservers, c->server_parts[s]);
}

static void free_req(psc_lookup_req *q)
{
    free(q);
}

/* Tables per lookup message: all of a partition's in one, until anything
 * moved; then one each, so each message is about one object (a table's
 * partition) and follows it alone. */
static size_t lookup_per(const ps_client *c, const psc_lookup_req *q)
{
    return c->moved_any && q->nt > 1 ? q->nt : 1;
}

size_t psc_lookup_max_slots(const ps_client *c, const psc_op *o)
{
    return psc_read_parts(c) * lookup_per(c, o->out);
}

long psc_lookup_begin(ps_client *c, const psc_op *o, uint32_t *slots)
{
    psc_lookup_req *q = o->out;
    ps_request *r = o->req;
    size_t np = psc_read_parts(c), ns = (size_t)c->nservers;
    size_t per = lookup_per(c, q), nu = np * per; /* messages: (partition, table) units */
    /* per flat partition and table: how many ids (np x nt counters) */
    size_t *base = calloc(ns, sizeof *base);
    uint32_t *cnt = calloc(np * q->nt + 1, sizeof *cnt);
    uint32_t *fl = NULL;
    uint32_t *made = malloc((nu ? nu : 1) * sizeof *made);
    size_t total = 0;
    for (size_t t = 0; t < q->nt; t++)
        total += q->n[t];
    fl = malloc((total ? total : 1) * sizeof *fl);
    long nslots = 0;
    int rc = base && cnt && fl && made ? 0 : PS_ENOMEM;
    for (size_t s = 1; !rc && s < ns; s++)
        base[s] = base[s - 1] + c->server_parts[s - 1];
    size_t at = 0;
    for (size_t t = 0; !rc && t < q->nt; t++)
        for (size_t j = 0; j < q->n[t]; j++, at++) {
            fl[at] = (uint32_t)flat_of(c, base, q->keys[t], q->ids[t][j]);
            cnt[(size_t)fl[at] * q->nt + t]++;
        }
    /* a slot per partition (and table, once anything moved) with ids, its
     * block laid out */
    for (size_t u = 0; !rc && u < nu; u++) {
        made[u] = PSC_NO_SLOT;
        size_t p = u / per, t0 = per > 1 ? u % per : 0, t1 = per > 1 ? t0 + 1 : q->nt;
        size_t nent = 0, nids = 0, floats = 0;
        for (size_t t = t0; t < t1; t++)
            if (cnt[p * q->nt + t]) {
                nent++;
                nids += cnt[p * q->nt + t];
                floats += (size_t)cnt[p * q->nt + t] * c->tables[q->table[t]].opts.dim;
            }
        if (!nids)
            continue;
        if (nids > PS_MAX_SPARSE_IDS || floats * sizeof(float) > PS_MAX_PAYLOAD_BYTES ||
            nent > PS_MAX_LOOKUP_TABLES) {
            psc_set_error(r, PS_ETOOBIG, "lookup: %zu ids (%zu floats of rows) of %zu tables in one "
                          "partition, more than one message takes: ask for fewer at once", nids,
                          floats, nent);
            rc = -1;
            break;
        }
        size_t bytes = sizeof(lk_sub) + 16 * nent + 8 * nids + sizeof(float *) * nids +
                       8 * nent + 4 * floats + 64;
        lk_sub *b = calloc(1, bytes);
        int server;
        uint32_t part = (uint32_t)p;
        for (server = 0; part >= c->server_parts[server]; server++)
            part -= c->server_parts[server];
        uint32_t table = q->nt == 1 || per > 1 ? q->table[t0] : PSC_ALL_TABLES;
        uint32_t i = b ? psc_slot_new(c, psc_route_obj(c, PSC_OBJ_PART, table, (uint32_t)p,
                                                       server), PS_MSG_LOOKUP, r)
                       : PSC_NO_SLOT;
        if (i == PSC_NO_SLOT) {
            free(b);
            rc = PS_ENOMEM;
            break;
        }
        b->ids = (uint64_t *)(b + 1);
        b->dst = (float **)(b->ids + nids);
        b->ent = (unsigned char *)(b->dst + nids);
        b->dims = (uint32_t *)(b->ent + 16 * nent);
        b->counts = b->dims + nent;
        b->rows = (float *)(((uintptr_t)(b->counts + nent) + 63) & ~(uintptr_t)63);
        for (size_t t = t0; t < t1; t++) {
            uint32_t n = cnt[p * q->nt + t];
            if (!n)
                continue;
            uint32_t dim = c->tables[q->table[t]].opts.dim;
            unsigned char *e = b->ent + 16 * b->nent;
            memcpy(e, &q->keys[t], 8);
            memcpy(e + 8, &n, 4);
            memcpy(e + 12, &dim, 4);
            b->dims[b->nent] = dim;
            b->counts[b->nent++] = n;
        }
        psc_sub *s = &c->slots->sub[i];
        s->own = b;
        s->key = 0;
        s->chunk = part;
        s->count = floats;
        s->dst = b->rows;
        s->obj_kind = PSC_OBJ_PART;
        s->home = server;
        s->obj = (uint32_t)p;
        s->obj_table = table;
        made[u] = i;
        slots[nslots++] = i;
    }
    /* the ids and their places, entry by entry (tables in the caller's order) */
    for (size_t t = 0, at2 = 0; !rc && t < q->nt; t++) {
        uint32_t dim = c->tables[q->table[t]].opts.dim;
        for (size_t j = 0; j < q->n[t]; j++, at2++) {
            lk_sub *b = c->slots->sub[made[fl[at2] * per + (per > 1 ? t : 0)]].own;
            /* ids of table t come after those of the tables before it in
             * this partition: count them in the order the entries were made */
            b->ids[b->nids] = q->ids[t][j];
            b->dst[b->nids++] = q->rows[t] + j * dim;
        }
    }
    if (rc) {
        for (long k = 0; k < nslots; k++)
            psc_slot_drop(c, slots[k]);
        if (rc > 0)
            psc_set_error(r, rc, "out of memory splitting a lookup");
        nslots = -1;
    }
    free(base);
    free(cnt);
    free(fl);
    free(made);
    free_req(q);
    return nslots;
}

size_t psc_lookup_tables(const ps_client *c, uint32_t i, uint32_t *tables, size_t cap)
{
    const lk_sub *b = c->slots->sub[i].own;
    size_t n = 0;
    for (size_t e = 0; b && e < b->nent && n < cap; e++) {
        uint64_t key;
        memcpy(&key, b->ent + 16 * e, 8);
        for (size_t t = 0; t < c->ntables; t++)
            if (c->tables[t].key == key) {
                tables[n++] = (uint32_t)t;
                break;
            }
    }
    return n;
}

int psc_read_frames(ps_client *c, uint32_t i, ps_header *h, zmq_msg_t *f, int *nf)
{
    psc_sub *s = &c->slots->sub[i];
    *nf = 0;
    if (s->type == PS_MSG_LOOKUP) {
        lk_sub *b = s->own;
        h->count = b->nids;
        if (zmq_msg_init_size(&f[0], 16 * b->nent) != 0)
            return PS_ENOMEM;
        if (zmq_msg_init_size(&f[1], 8 * b->nids) != 0) {
            zmq_msg_close(&f[0]);
            return PS_ENOMEM;
        }
        memcpy(zmq_msg_data(&f[0]), b->ent, 16 * b->nent);
        memcpy(zmq_msg_data(&f[1]), b->ids, 8 * b->nids);
        *nf = 2;
    } else if (s->type == PS_MSG_SNAPSHOT) {
        const psc_snap_io *io = s->out;
        h->count = s->count;
        h->total = io->wait_ms;
        if (zmq_msg_init_size(&f[0], s->count) != 0)
            return PS_ENOMEM;
        if (s->count)
            memcpy(zmq_msg_data(&f[0]), s->src, s->count);
        *nf = 1;
    } else if (s->type == PS_MSG_SNAPREAD) {
        const psc_page_io *io = s->out;
        h->key = io->item;
        h->chunk = io->page;
    }
    return 0;
}

int psc_read_reply(ps_client *c, uint32_t i, const ps_header *h, zmq_msg_t *pm, char *why,
                   size_t why_len)
{
    psc_sub *s = &c->slots->sub[i];
    if (s->type == PS_MSG_LOOKUP) {
        /* the rows are in s->dst (b->rows) already: to their places */
        lk_sub *b = s->own;
        const float *row = b->rows;
        size_t k = 0;
        for (size_t e = 0; e < b->nent; e++) {
            size_t d = b->dims[e];
            for (uint32_t j = 0; j < b->counts[e]; j++, k++, row += d)
                memcpy(b->dst[k], row, d * sizeof(float));
        }
        return 0;
    }
    if (s->type == PS_MSG_SNAPSHOT) {
        psc_snap_io *io = s->out;
        io->items = h->count;
        io->lo = h->chunk_version;
        io->hi = (int64_t)h->total;
        return 0;
    }
    if (s->type == PS_MSG_SNAPREAD) {
        psc_page_io *io = s->out;
        size_t n = zmq_msg_size(pm);
        if (h->key != io->item || h->chunk != io->page || n > io->cap) {
            ps_errorf(why, why_len, "snapread reply of item %llu page %u (%zu bytes) for item "
                "%llu page %u (room for %zu)", (unsigned long long)h->key, h->chunk, n,
                (unsigned long long)io->item, io->page, io->cap);
            return PS_EPROTO;
        }
        memcpy(io->dst, zmq_msg_data(pm), n);
        io->got = n;
        io->total = h->total;
    }
    return 0;
}

static long find_table(const ps_client *c, uint64_t key)
{
    for (size_t t = 0; t < c->ntables; t++)
        if (c->tables[t].key == key)
            return (long)t;
    return -1;
}

int ps_client_lookup(ps_client *c, size_t ntables, const uint64_t *keys,
                     const uint64_t *const *ids, const size_t *counts, float *const *rows,
                     ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    int rc = !c || (ntables && (!keys || !ids || !counts || !rows)) ? PS_EINVAL
             : !c->started                                         ? PS_ESTATE
                                                                   : 0;
    char why[PS_ERR_TEXT_MAX + 1] = "";
    psc_lookup_req *q = NULL;
    if (!rc) {
        size_t nt = ntables;
        q = malloc(sizeof *q + nt * (8 + 4 + sizeof(uint64_t *) + sizeof(size_t) +
                                     sizeof(float *)) + 8);
        if (!q) {
            rc = PS_ENOMEM;
        } else {
            q->nt = nt;
            q->ids = (const uint64_t **)(q + 1);
            q->rows = (float **)(q->ids + nt);
            q->n = (size_t *)(q->rows + nt);
            q->keys = (uint64_t *)(q->n + nt);
            q->table = (uint32_t *)(q->keys + nt);
        }
    }
    for (size_t t = 0; !rc && t < ntables; t++) {
        long ti = find_table(c, keys[t]);
        if (ti < 0) {
            snprintf(why, sizeof why, "lookup: table %llu was not registered "
                     "(ps_client_register_table: its key and dim)", (unsigned long long)keys[t]);
            rc = PS_ENOTFOUND;
        } else if (counts[t] && (!ids[t] || !rows[t])) {
            rc = PS_EINVAL;
        } else {
            q->keys[t] = keys[t];
            q->table[t] = (uint32_t)ti;
            q->ids[t] = ids[t];
            q->n[t] = counts[t];
            q->rows[t] = rows[t];
        }
    }
    if (rc) {
        free(q);
        psc_req_fail(req, rc, why[0] ? why : rc == PS_ESTATE ? "the client is not started"
                                                          : ps_strerror(rc));
        return rc;
    }
    psc_req_reset(c, req, 1);
    psc_op o = {.type = PS_MSG_LOOKUP, .server = -1, .req = req, .out = q, .npush = 1};
    rc = psc_post(c, &o);
    if (rc) {
        free(q);
        psc_req_fail(req, rc, ps_strerror(rc));
    }
    return rc;
}

int psc_snapshot_post(ps_client *c, int server, int64_t version, const void *targets,
                      size_t bytes, psc_snap_io *io, ps_request *req)
{
    psc_req_reset(c, req, 1);
    psc_op o = {.type = PS_MSG_SNAPSHOT, .server = server, .req = req, .out = io,
                .step = version, .src = targets, .count = bytes, .npush = 1};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int psc_snapread_post(ps_client *c, int server, psc_page_io *io, ps_request *req)
{
    psc_req_reset(c, req, 1);
    psc_op o = {.type = PS_MSG_SNAPREAD, .server = server, .req = req, .out = io, .npush = 1};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}
