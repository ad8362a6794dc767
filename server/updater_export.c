/* Readers' lookups and exports' snapshots on an update thread (updater_export.h). */
#include "updater_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_limits.h"
#include "ps_table_row.h"
#include "ps_time.h"
#include "snapshot.h"
#include "updater_move.h"

/* One table of a lookup, as its entry says. */
typedef struct lk_table {
    uint64_t key;
    uint32_t n, dim;
    ps_table *store;
    int64_t version;
} lk_table;

/* The partition versions of the tables named in t (found by key in tp). */
static void versions(ps_tparts *tp, lk_table *t, size_t nt)
{
    ps_tpart_view v;
    for (size_t i = 0; ps_tparts_view(tp, i, &v); i++)
        for (size_t k = 0; k < nt; k++)
            if (t[k].key == v.key)
                t[k].version = v.version;
}

void upd_lookup(ps_updater *u, req_ctx *r, const ps_header *h, zmq_msg_t *pl)
{
    ps_tparts *tp = upd_req_tparts(u, r, h); /* with PS_FLAG_AWAY: a partition moved here */
    if (!tp)
        return; /* answered */
    const ps_tparts_config *c = ps_tparts_cfg(tp); /* its rows: (home, part) */
    size_t nt = zmq_msg_size(&pl[0]) / PS_LOOKUP_ENTRY_BYTES, n = (size_t)h->count;
    const unsigned char *e = zmq_msg_data(&pl[0]);
    lk_table *t = malloc(nt * sizeof *t);
    uint64_t *ids = malloc((n ? n : 1) * sizeof *ids);
    char why[256];
    int rc = t && ids ? 0 : PS_ENOMEM;
    if (rc)
        ps_errorf(why, sizeof why, "out of memory reading a lookup");
    if (!rc && n)
        memcpy(ids, zmq_msg_data(&pl[1]), n * sizeof *ids); /* any alignment */
    u->bytes_in += zmq_msg_size(&pl[0]) + zmq_msg_size(&pl[1]);
    uint64_t ids_sum = 0, floats = 0;
    for (size_t k = 0; !rc && k < nt; k++, e += PS_LOOKUP_ENTRY_BYTES) {
        memcpy(&t[k].key, e, 8);
        memcpy(&t[k].n, e + 8, 4);
        memcpy(&t[k].dim, e + 12, 4);
        t[k].version = 0;
        t[k].store = ps_tparts_store(tp, t[k].key);
        const ps_table_options *d = ps_tparts_decl(tp, t[k].key);
        if (!t[k].store || !d) {
            ps_errorf(why, sizeof why, "lookup: table %llu is not declared on this server",
                (unsigned long long)t[k].key);
            rc = PS_ENOTFOUND;
        } else if (d->dim != t[k].dim) {
            ps_errorf(why, sizeof why, "lookup: rows of table %llu have dim %u, not %u",
                (unsigned long long)t[k].key, d->dim, t[k].dim);
            rc = PS_EMISMATCH;
        }
        ids_sum += t[k].n;
        floats += (uint64_t)t[k].n * t[k].dim;
    }
    if (!rc && ids_sum != n) {
        ps_errorf(why, sizeof why, "lookup: its tables name %llu ids, its frame holds %zu",
            (unsigned long long)ids_sum, n);
        rc = PS_EPROTO;
    }
    if (!rc && floats * sizeof(float) > PS_MAX_PAYLOAD_BYTES) {
        ps_errorf(why, sizeof why, "lookup: %llu floats of rows are over the %llu-byte payload "
            "limit: ask for fewer ids at once", (unsigned long long)floats,
            (unsigned long long)PS_MAX_PAYLOAD_BYTES);
        rc = PS_ETOOBIG;
    }
    /* every id is a row of this partition (docs/PROTOCOL.md "Tables") */
    const uint64_t *at = ids;
    for (size_t k = 0; !rc && k < nt; at += t[k].n, k++) {
        size_t i = ps_table_row_misplaced(t[k].key, at, t[k].n, c->home, c->num_servers,
                                          (uint32_t)c->part, (uint32_t)c->nparts);
        if (i < t[k].n) {
            ps_errorf(why, sizeof why, "lookup: id %llu of table %llu is not a row of partition "
                "%d of server %d (common/ps_table_row.h places a row)",
                (unsigned long long)at[i], (unsigned long long)t[k].key, c->part, c->home);
            rc = PS_EPROTO;
        }
    }
    zmq_msg_t rep;
    if (!rc && zmq_msg_init_size(&rep, floats * sizeof(float)) != 0) {
        ps_errorf(why, sizeof why, "out of memory answering a lookup");
        rc = PS_ENOMEM;
    }
    if (rc) {
        free(t);
        free(ids);
        upd_error(u, r, rc, why);
        return;
    }
    versions(tp, t, nt);
    int64_t version = nt ? t[0].version : 0;
    float *out = zmq_msg_data(&rep);
    at = ids;
    for (size_t k = 0; k < nt; at += t[k].n, k++) {
        size_t d = t[k].dim;
        for (size_t j = 0; j < t[k].n; j++, out += d) {
            ps_table_row_view v;
            if (ps_table_get_row(t[k].store, at[j], &v))
                memcpy(out, v.w, d * sizeof(float));
            else
                ps_table_initial_row(ps_table_get_config(t[k].store), at[j], out);
        }
        if (t[k].version < version)
            version = t[k].version;
    }
    free(t);
    free(ids);
    upd_reply_payload(u, r, &rep, floats, 0, (size_t)floats, PS_DTYPE_F32, version);
}

/* ---- snapshots ---- */

static void snap_send(ps_updater *u, ps_snap_frame *sf)
{
    char tag = PS_OUT_SNAP;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, sf, sizeof *sf, 0);
}

static void snap_finish(ps_updater *u)
{
    ps_snap_frame sf;
    memset(&sf, 0, sizeof sf);
    sf.token = u->snap_token;
    sf.rc = ps_snap_end(u->snap, &sf.items, &sf.n, sf.why, sizeof sf.why);
    u->snap = NULL;
    snap_send(u, &sf);
}

void upd_snap_drop(ps_updater *u)
{
    if (!u->snap)
        return;
    ps_snap_buf **items;
    size_t n;
    char why[8];
    if (ps_snap_end(u->snap, &items, &n, why, sizeof why) == 0) {
        for (size_t k = 0; k < n; k++)
            ps_snap_buf_unref(items[k]);
        free(items);
    }
    u->snap = NULL;
}

void upd_snap_start(ps_updater *u, const ps_cmd_frame *cf)
{
    upd_snap_drop(u); /* replaced: the I/O thread dropped the old one */
    int64_t t0 = ps_now_ns();
    ps_snap_config sc = {.server = u->cfg.server_rank, .opt = cf->h.hello.opt,
                         .target = cf->h.want_version, .targets = cf->snap_targets,
                         .ntargets = cf->snap_ntargets, .max_memory = u->max_memory,
                         .mem_used = u->mem_used};
    u->snap_token = cf->snap_token;
    /* The partitions moved here (u->away) are not in it: exports are refused
     * after a move for now (servers added and removed). */
    if (ps_snap_begin(&sc, u->shard, u->tparts, &u->snap) != 0) {
        ps_snap_frame sf;
        memset(&sf, 0, sizeof sf);
        sf.token = cf->snap_token;
        sf.rc = PS_ENOMEM;
        snprintf(sf.why, sizeof sf.why, "server %d: out of memory starting a snapshot",
                 u->cfg.server_rank);
        snap_send(u, &sf);
        return;
    }
    if (u->cfg.trace)
        ps_trace_event(u->cfg.trace, "snapshot", "export", 1 + u->cfg.idx, t0, ps_now_ns(),
                       (int64_t)cf->snap_token, -1);
    upd_snap_poll(u, 0);
}

void upd_snap_poll(ps_updater *u, int force)
{
    if (!u->snap)
        return;
    int64_t t0 = ps_now_ns();
    int over = ps_snap_poll(u->snap, u->shard, u->tparts, force);
    if (u->cfg.trace && force)
        ps_trace_event(u->cfg.trace, "snapshot", "export", 1 + u->cfg.idx, t0, ps_now_ns(),
                       (int64_t)u->snap_token, -1);
    if (over)
        snap_finish(u);
}

