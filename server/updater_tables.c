/* An update thread's tables (updater_tables.h): sparse pulls, pushes and
 * pushpulls on this thread's partition of each table (server/table_part.h),
 * their rows over the network or, same host, in the worker's arena. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_table_row.h"
#include "updater_move.h"
#include "updater_tables.h"

/* A sparse push the table's partition may keep (a sync push before a lower
 * rank's): its ids (a copy) and rows (the frame, an aligned float32 copy,
 * or in the worker's arena, shm its reference: the worker writes them again
 * only once the push is answered), and its request, answered when the rows
 * are in the round (the push's acknowledgement, or a pushpull's rows,
 * `want` its version). */
typedef struct shold {
    uint64_t *ids;
    zmq_msg_t msg;
    float *copy;
    const float *g;
    ps_shm_peer *shm;
    req_ctx *r;
    int64_t want;
    upd_push_id pid;
} shold;

/* ---- tables: sparse pulls and pushes ----
 * Each returns 1 when r is kept (queued on its partition, or waiting with a
 * kept push): the caller must not free or reuse it; 0 when it was answered
 * (the caller frees or reuses it). */

/* The n ids at p (8 x n bytes, any alignment: a frame, or the worker's
 * arena, which it may write meanwhile), copied; NULL when out of memory (an
 * empty array for n 0 is a valid, non-NULL one). */
static uint64_t *ids_of(const void *p, size_t n)
{
    uint64_t *ids = malloc(n ? n * sizeof *ids : 1);
    if (ids && n)
        memcpy(ids, p, n * sizeof *ids);
    return ids;
}

/* Every one of the n ids (what of them, for the reason) is a row of the
 * partition r is for (r->tp: this thread's own, or one moved here from its
 * home): 0, or PS_EPROTO with an error reply naming the first that is not
 * and where it belongs (no row is made for any of them). */
static int upd_ids_here(ps_updater *u, req_ctx *r, const ps_header *h, const uint64_t *ids,
                        size_t n, const char *what)
{
    const ps_tparts_config *c = ps_tparts_cfg(r->tp); /* its identity: (home, part of nparts) */
    size_t i = ps_table_row_misplaced(h->key, ids, n, c->home, c->num_servers,
                                      (uint32_t)c->part, (uint32_t)c->nparts);
    if (i == n)
        return 0;
    uint64_t hash = ps_table_row_hash(h->key, ids[i]);
    char why[256];
    int away = r->tp != u->tparts;
    ps_errorf(why, sizeof why, "%s %llu (number %zu of the request) belongs to partition %u "
        "of table %llu on server %d, not to partition %d of server %d where it was sent%s "
        "(common/ps_table_row.h places a row)", what, (unsigned long long)ids[i], i,
        ps_table_row_part(hash, c->num_servers, (uint32_t)c->nparts), (unsigned long long)h->key,
        ps_table_row_server(hash, c->num_servers), c->part, c->home,
        away ? " (moved to this server from its home)" : "");
    upd_error(u, r, PS_EPROTO, why);
    return PS_EPROTO;
}

/* Answer a sparse pull (or pushpull) with the rows of its ids at `version`:
 * read them (those missing are created) in the wire type, or (same host)
 * straight into the worker's arena. */
static void upd_rows(ps_updater *u, req_ctx *r, int64_t version)
{
    char why[256];
    size_t n = r->npull, len = n * r->dim;
    float *dst = r->shm ? ps_shm_peer_at(r->shm, r->shm_off, len * sizeof(float)) : NULL;
    if (r->shm && !dst) { /* not reached: the I/O thread checked the range */
        upd_error(u, r, PS_EPROTO, "the sparse pull's rows would be outside the arena");
        return;
    }
    if (!dst && len > u->rows_cap) {
        /* the rows before they become the payload: memory of the server's,
         * charged to --max-memory before it is taken */
        uint64_t more = (uint64_t)(len - u->rows_cap) * sizeof(float);
        uint64_t before = atomic_fetch_add(u->mem_used, more);
        if (before + more > u->max_memory) {
            atomic_fetch_sub(u->mem_used, more);
            snprintf(why, sizeof why, "no room in --max-memory (%llu of %llu bytes in use) for "
                     "the %zu rows of this pull: retry later, or pull fewer ids at a time",
                     (unsigned long long)before, (unsigned long long)u->max_memory, n);
            upd_error(u, r, PS_ETOOBIG, why);
            return;
        }
        float *p = realloc(u->rows, len * sizeof *p);
        if (!p) {
            atomic_fetch_sub(u->mem_used, more);
            upd_error(u, r, PS_ENOMEM, "out of memory reading the rows of a sparse pull");
            return;
        }
        u->rows = p;
        u->rows_cap = len;
    }
    int rc = ps_tparts_rows(r->tp, r->key, r->rank, r->pids, n, dst ? dst : u->rows, len,
                            why, sizeof why);
    zmq_msg_t pl;
    uint32_t dtype = u->cfg.wire_dtype;
    int not_finite; /* rows beyond float16 go as Inf, as dense pulls' do */
    if (!rc && !dst)
        rc = upd_copy_payload(u, &pl, u->rows, len, dtype, &not_finite, why, sizeof why);
    if (u->rows_cap > UPD_ROWS_KEEP)
        upd_rows_shrink(u); /* a large request's scratch goes back at once */
    if (rc) {
        upd_error(u, r, rc, why);
        return;
    }
    upd_reply_payload(u, r, dst ? NULL : &pl, n, r->dim, len, dtype, version);
}

void upd_rows_shrink(ps_updater *u)
{
    atomic_fetch_sub(u->mem_used, (uint64_t)u->rows_cap * sizeof(float));
    free(u->rows);
    u->rows = NULL;
    u->rows_cap = 0;
}

/* A sparse pull of version `want` (the ids in r): answered now or queued. */
static int upd_spull(ps_updater *u, req_ctx *r, int64_t want)
{
    char why[256];
    int64_t version = 0;
    int queued = 0;
    int rc = ps_tparts_pull(r->tp, r->key, want, r, &queued, &version, why, sizeof why);
    if (rc)
        upd_error(u, r, rc, why);
    else if (queued == 0)
        upd_rows(u, r, version);
    return queued == 1; /* 2: a resend of a queued pull, which now answers on r's route */
}

/* What follows a sparse push that is in: a pushpull's pull of the version
 * after it, or the push's acknowledgement (sync with checkpoints: once the
 * round is complete, as upd_await). */
static int upd_spush_done(ps_updater *u, req_ctx *r, int64_t want, int64_t version)
{
    if (r->type == PS_MSG_SPUSHPULL)
        return upd_spull(u, r, want);
    if (!u->cfg.defer_acks) {
        upd_ack(u, r, version, 0);
        return 0;
    }
    char why[256];
    int queued = 0;
    int rc = ps_tparts_await(r->tp, r->key, want, r, &queued, &version, why, sizeof why);
    if (rc)
        upd_error(u, r, rc, why);
    else if (queued == 0)
        upd_ack(u, r, version, 0);
    return queued == 1;
}

static void shold_free(shold *g)
{
    if (!g)
        return;
    free(g->ids);
    zmq_msg_close(&g->msg);
    free(g->copy);
    ps_shm_peer_unref(g->shm);
    free(g);
}

/* The partition added a kept push to its round (rc 0), or could not. */
void upd_thook_release(void *user, void *v, int rc, const char *why)
{
    ps_updater *u = user;
    shold *g = v;
    req_ctx *r = g->r;
    int64_t want = g->want;
    shold_free(g);
    if (rc)
        upd_error(u, r, rc, why);
    else if (upd_spush_done(u, r, want, want - 1))
        return;
    upd_req_free(r);
}

int upd_thook_take(void *user, void *v, const float **g, size_t len, char *why,
                   size_t why_len)
{
    shold *k = v;
    if (!k->shm)
        return 0;
    return upd_take_from_arena(user, &k->pid, g, len, &k->copy, why, why_len);
}

void upd_thook_ready(void *user, void *waiter, int64_t version)
{
    req_ctx *r = waiter;
    if (r->type == PS_MSG_SPUSH) /* a deferred acknowledgement: its round is complete */
        upd_ack(user, r, version, 0);
    else
        upd_rows(user, r, version);
    upd_req_free(r);
}

/* A SASSIGN: the rows set (exactly: float32 only), acknowledged. */
static void upd_sassign(ps_updater *u, req_ctx *r, const ps_header *h, const char *ids,
                        const char *in_arena, zmq_msg_t *pl)
{
    char why[256];
    size_t n = (size_t)h->count;
    if (h->dtype != PS_DTYPE_F32) {
        upd_error(u, r, PS_EPROTO, "a sparse assign's rows are float32 (d = 1): the values are "
                  "set as they are");
        return;
    }
    uint64_t *id = ids_of(ids, n);
    if (id && upd_ids_here(u, r, h, id, n, "assigned id")) {
        free(id);
        return;
    }
    float *copy = NULL;
    const float *rows = NULL;
    if (in_arena && n) { /* copied, then checked: the worker may write its arena meanwhile */
        size_t bytes = n * h->dim * sizeof(float);
        if ((copy = malloc(bytes)))
            memcpy(copy, in_arena + 8 * n, bytes);
        rows = copy;
    } else if (n) {
        ps_header vh = *h; /* the rows frame as values */
        vh.count = n * h->dim;
        rows = upd_frame_values(&vh, &pl[1], &copy);
    } else {
        static const float none[1];
        rows = none;
    }
    size_t first = 0, bad = rows && n ? ps_dtype_nonfinite(PS_DTYPE_F32, rows, n * h->dim, &first) : 0;
    if (bad) { /* a row set to NaN or Inf is never meant: refused whatever --on-nonfinite says */
        u->nonfinite++;
        snprintf(why, sizeof why, "sparse assign of table %llu from worker %d: %zu of %zu values "
                 "are not finite (element %zu, row of id %llu, is %g); refused: a table's rows are "
                 "set only to finite values (check the module's weights before wrapping it)",
                 (unsigned long long)h->key, h->rank, bad, n * h->dim, first,
                 id ? (unsigned long long)id[first / h->dim] : 0ULL, (double)rows[first]);
        free(id);
        free(copy);
        upd_error(u, r, PS_ENONFINITE, why);
        return;
    }
    int64_t version = 0;
    int rc = PS_ENOMEM;
    if (id && rows)
        rc = ps_tparts_assign(r->tp, h->key, h->rank, id, n, rows, &version, why, sizeof why);
    else
        snprintf(why, sizeof why, "out of memory receiving a sparse assign");
    free(id);
    free(copy);
    if (rc)
        upd_error(u, r, rc, why);
    else
        upd_ack(u, r, version, 0);
}

/* A sparse request (updater_tables.h).  1 when r is kept. */
int upd_sparse(ps_updater *u, req_ctx *r, const ps_header *h, zmq_msg_t *pl)
{
    /* this thread's partition, or (PS_FLAG_AWAY) the one of h->home moved here */
    if (!(r->tp = upd_req_tparts(u, r, h)))
        return 0; /* answered */
    r->dim = h->dim;
    size_t n = (size_t)h->count;
    /* the ids, the rows and the ids to pull: the frames, or (same host) one
     * after the other in the worker's arena, in the range the I/O thread
     * checked, with room after them where the reply's rows go */
    const char *ids, *pids = NULL, *in_arena = NULL;
    if (r->shm) {
        uint64_t reply_at, bytes = ps_proto_sparse_shm_bytes(h, &reply_at);
        in_arena = ps_shm_peer_at(r->shm, h->shm_off, bytes);
        if (!in_arena) { /* not reached: checked before */
            upd_error(u, r, PS_EPROTO, "the sparse request's bytes are outside the arena");
            return 0;
        }
        ids = in_arena;
        if (h->type == PS_MSG_SPUSHPULL)
            pids = in_arena + (8 + (size_t)h->dim * sizeof(float)) * n;
        r->shm_off = h->shm_off + reply_at;
        u->bytes_in += reply_at;
    } else {
        ids = zmq_msg_data(&pl[0]);
        pids = zmq_msg_data(&pl[2]);
        u->bytes_in += zmq_msg_size(&pl[0]) + zmq_msg_size(&pl[1]) + zmq_msg_size(&pl[2]);
    }
    if (h->type == PS_MSG_SASSIGN) {
        upd_sassign(u, r, h, ids, in_arena, pl);
        return 0;
    }
    if (h->type == PS_MSG_SPULL) {
        r->npull = n;
        if (!(r->pids = ids_of(ids, r->npull))) {
            upd_error(u, r, PS_ENOMEM, "out of memory receiving a sparse pull");
            return 0;
        }
        if (upd_ids_here(u, r, h, r->pids, r->npull, "id"))
            return 0;
        return upd_spull(u, r, h->want_version);
    }
    int64_t m = h->npush > 1 ? h->npush : 1;
    shold *g = calloc(1, sizeof *g);
    if (g) {
        zmq_msg_init(&g->msg);
        static const float no_rows[1];
        if (!n) {
            g->g = no_rows;
        } else if (in_arena) { /* read in place (4-byte aligned after the ids) */
            g->g = (const float *)(in_arena + 8 * n);
            g->shm = r->shm;
            ps_shm_peer_ref(g->shm);
        } else {
            zmq_msg_move(&g->msg, &pl[1]);
            ps_header vh = *h; /* the rows frame as values */
            vh.count = n * h->dim;
            g->g = upd_frame_values(&vh, &g->msg, &g->copy);
        }
        g->ids = ids_of(ids, n);
        g->r = r;
        g->want = h->push_step + m;
        g->pid = (upd_push_id){h->type, h->rank, h->key, h->chunk, h->push_step};
    }
    if (h->type == PS_MSG_SPUSHPULL) {
        r->npull = (size_t)h->npull;
        r->pids = ids_of(pids, r->npull);
    }
    if (!g || !g->g || !g->ids || (h->type == PS_MSG_SPUSHPULL && !r->pids)) {
        shold_free(g);
        upd_error(u, r, PS_ENOMEM, "out of memory receiving a sparse push");
        return 0;
    }
    if (upd_ids_here(u, r, h, g->ids, n, "pushed id") ||
        (h->type == PS_MSG_SPUSHPULL && upd_ids_here(u, r, h, r->pids, r->npull, "id to pull"))) {
        shold_free(g);
        return 0;
    }
    char why[256];
    size_t first = 0, bad = n ? ps_dtype_nonfinite(PS_DTYPE_F32, g->g, n * h->dim, &first) : 0;
    if (bad) {
        const float *rows = g->g;
        if (upd_nonfinite(u, h, n * h->dim, &rows, bad, first, why, sizeof why)) {
            shold_free(g);
            upd_error(u, r, PS_ENONFINITE, why);
            return 0;
        }
        if (!rows) /* skip: the rank's push counts (its clock, the round), no row moves */
            n = 0;
    }
    int kept = 0, dup = 0;
    int64_t version = 0;
    int rc = ps_tparts_push(r->tp, h->key, h->rank, h->push_step, m, g->ids, n, g->g, g,
                            &kept, &dup, &version, why, sizeof why);
    if (kept) /* upd_thook_release answers r once its rows are in the round */
        return 1;
    shold_free(g);
    if (rc) {
        upd_error(u, r, rc, why);
        return 0;
    }
    /* an update (this push's, or the round it completed) whose results were
     * not finite: refused to this push */
    if (upd_results_nonfinite(u, r))
        return 0;
    if (dup)
        ps_dup_log_note(&u->dup, h);
    upd_note_restore_skips(u, h);
    return upd_spush_done(u, r, h->push_step + m, version);
}


/* PS_CMD_TABLE: take this thread's partition of a table just declared (no
 * store: only its name, given by a later declaration of a restored table). */
void upd_table(ps_updater *u, const ps_cmd_frame *cf)
{
    char why[256];
    if (!cf->store) { /* a restored table's name */
        ps_tparts_set_name(u->tparts, cf->h.key, cf->h.table_name);
        return;
    }
    int rc = ps_tparts_adopt(u->tparts, cf->h.key, &cf->h.table, cf->store, why, sizeof why);
    if (rc) {
        ps_error("update thread %d: %s", u->cfg.idx, why);
        return;
    }
    ps_tparts_set_name(u->tparts, cf->h.key, cf->h.table_name);
    if (!cf->after_restore)
        return;
    /* the workers may be steps ahead of it: a sync partition fast-forwards
     * to their round once, an async one takes each rank's first push */
    int64_t *zero = calloc((size_t)u->cfg.num_workers, sizeof *zero);
    if (!zero || ps_tparts_restored(u->tparts, cf->h.key, 0, zero) != 0)
        ps_error("update thread %d: table %llu, declared after the restore, could not start "
                 "as restored (out of memory): its workers' pushes beyond step 0 are refused",
                 u->cfg.idx, (unsigned long long)cf->h.key);
    free(zero);
}

