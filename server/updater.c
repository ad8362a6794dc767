#include "updater.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zmq.h>

#include "checkpoint.h"
#include "ckpt_coord.h"
#include "optimizer.h"
#include "dup_log.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ratelimit.h"
#include "reply.h"
#include "repl.h"
#include "server_metrics.h"
#include "updater_reply.h"
#include "updater_export.h"
#include "updater_move.h"
#include "updater_tables.h"
#include "zmsg.h"

/* A received gradient the shard may keep: the message itself, or an aligned
 * copy when ZeroMQ handed us a buffer that is not 4-byte aligned, or (same
 * host) the worker's arena, where it stays until released: the worker may
 * write that buffer again only after its push is acknowledged, so the
 * acknowledgement of a kept push from the arena waits in `ack` until then. */
typedef struct hold {
    zmq_msg_t msg;
    float *copy;
    const float *g;
    ps_shm_peer *shm;
    req_ctx *ack;
    upd_push_id pid;
} hold;

/* ZeroMQ's free callback of a zero-copy reply: runs on whichever thread
 * closes the last copy of the message (a ZeroMQ I/O thread once the bytes
 * are written, or the I/O thread when it drops the reply). */
static void zc_release(void *data, void *ref)
{
    (void)data;
    ps_shard_unpin(ref);
}

/* Answer a pull with the weights w of `version`: zero-copy from the chunk's
 * weight buffer, which no update writes until the reply is gone (updates in
 * the meantime go out of place), else copied into the reply message. */
static void upd_weights(ps_updater *u, req_ctx *r, const float *w, size_t n, int64_t version)
{
    zmq_msg_t pl;
    size_t bytes = n * sizeof(float);
    if (r->shm) {
        /* same host: the weights go straight to the worker's buffer */
        float *dst = r->count == n ? ps_shm_peer_at(r->shm, r->shm_off, bytes) : NULL;
        if (!dst) {
            char why[160];
            snprintf(why, sizeof why, "the pull's destination holds %llu elements, chunk %u of "
                     "key %llu has %zu", (unsigned long long)r->count, r->chunk,
                     (unsigned long long)r->key, n);
            upd_error(u, r, PS_EPROTO, why);
            return;
        }
        memcpy(dst, w, bytes);
        upd_reply_payload(u, r, NULL, n, 0, n, PS_DTYPE_F32, version);
        return;
    }
    /* float32 on the wire: the weights themselves go (zero-copy); a narrower
     * wire type needs a converted copy */
    uint32_t dtype = u->cfg.wire_dtype;
    void *ref = NULL;
    const float *pinned = bytes >= ZC_MIN_BYTES && dtype == PS_DTYPE_F32
                              ? ps_shard_pin(u->shard, r->key, r->chunk, w, &ref)
                              : NULL;
    if (pinned && zmq_msg_init_data(&pl, (void *)pinned, bytes, zc_release, ref) != 0) {
        ps_shard_unpin(ref); /* ZeroMQ did not take it */
        pinned = NULL;
    }
    if (!pinned) {
        char why[256];
        int not_finite = 0;
        int rc = upd_copy_payload(u, &pl, w, n, dtype, &not_finite, why, sizeof why);
        if (rc) {
            upd_error(u, r, rc, why);
            return;
        }
        if (not_finite && dtype != PS_DTYPE_F32 && ps_rlimit_allow(&u->rl)) {
            size_t first = 0, bad = ps_dtype_nonfinite(dtype, w, n, &first);
            ps_warn("pull of key %llu chunk %u by worker %d: %zu of %zu weights are not finite "
                    "as %s (element %zu is %g%s); they go as Inf or NaN",
                    (unsigned long long)r->key, r->chunk, r->rank, bad, n,
                    ps_dtype_name(dtype), first, (double)w[first],
                    isfinite(w[first]) ? ", beyond the wire type: use --wire-dtype bf16 or f32"
                                       : "");
        }
    }
    upd_reply_payload(u, r, &pl, n, 0, n, dtype, version);
}

static void hook_ready(void *user, void *waiter, const float *w, size_t n, int64_t version)
{
    req_ctx *r = waiter;
    if (r->type == PS_MSG_PUSH) /* a deferred acknowledgement: its round is complete */
        upd_ack(user, r, version, 0);
    else
        upd_weights(user, r, w, n, version);
    upd_req_free(r);
}

static void hook_cancel(void *user, void *waiter)
{
    ps_updater *u = user;
    req_ctx *r = waiter;
    if (u->gone_code) /* its chunk or partition moved to another server */
        upd_error(u, r, u->gone_code, u->gone_why);
    else
        upd_error(u, r, PS_ECLOSED, "the server is shutting down; this pull was still waiting");
    upd_req_free(r);
}

/* A resend of a queued request (same rank, id and type): answer it on the
 * newest route, once. */
static int hook_merge(void *user, void *queued, void *incoming)
{
    (void)user;
    req_ctx *q = queued, *n = incoming;
    if (q->rank != n->rank || q->seq != n->seq || q->type != n->type)
        return 0;
    zmq_msg_close(&q->id);
    zmq_msg_init(&q->id);
    zmq_msg_move(&q->id, &n->id);
    /* and to the newest arena: the worker may have said hello with another */
    ps_shm_peer_unref(q->shm);
    q->shm = n->shm;
    q->shm_off = n->shm_off;
    q->count = n->count;
    n->shm = NULL;
    return 1;
}

static void hold_free(hold *h)
{
    if (!h)
        return;
    zmq_msg_close(&h->msg);
    free(h->copy);
    ps_shm_peer_unref(h->shm);
    free(h);
}

/* A kept gradient goes into its round: from the arena, copied and checked
 * now (upd_take_from_arena).  Refused: its acknowledgement, if it waits
 * here, is the error; a pushpull's pull or a deferred acknowledgement
 * waits on as the round does, for the push sent again. */
static int hook_take(void *user, void *v, const float **g, size_t n)
{
    ps_updater *u = user;
    hold *h = v;
    if (!h->shm)
        return 0;
    char why[256];
    int rc = upd_take_from_arena(u, &h->pid, g, n, &h->copy, why, sizeof why);
    if (!rc)
        return 0;
    if (h->ack) {
        upd_error(u, h->ack, rc, why);
        upd_req_free(h->ack);
        h->ack = NULL;
    } else {
        u->errors++;
        if (ps_rlimit_allow(&u->rl))
            ps_warn("refused a kept push of worker %d (key %llu chunk %u): %s; its round waits "
                    "for the push again", h->pid.rank, (unsigned long long)h->pid.key,
                    h->pid.chunk, why);
    }
    return rc;
}

/* The shard is done with a kept gradient.  From the arena, the push's
 * acknowledgement waited for this: send it now (its round is complete), or
 * at shutdown say the push was never applied. */
static void hook_release(void *user, void *v)
{
    ps_updater *u = user;
    hold *h = v;
    if (h->ack) {
        req_ctx *r = h->ack;
        if (u->gone_code) { /* its chunk moved before its round was complete */
            upd_error(u, r, u->gone_code, u->gone_why);
        } else if (u->destroying) {
            upd_error(u, r, PS_ECLOSED, "the server is shutting down; this push's round was not "
                      "complete");
        } else {
            size_t n;
            int64_t version = 0;
            ps_shard_weights(u->shard, r->key, r->chunk, &n, &version);
            upd_ack(u, r, version, 0);
        }
        upd_req_free(r);
        h->ack = NULL;
    }
    hold_free(h);
}

static void upd_pull(ps_updater *u, req_ctx *r, int64_t want)
{
    char why[256];
    const float *w = NULL;
    size_t n = 0;
    int64_t version = 0;
    int queued = 0;
    int rc = ps_shard_pull(u->shard, r->key, r->chunk, r->rank, want, r, &queued, &w, &n, &version,
                           why, sizeof why);
    if (rc)
        upd_error(u, r, rc, why);
    else if (queued == 1)
        u->spare = NULL; /* the shard holds r until hook_ready or hook_cancel */
    else if (queued == 0)
        upd_weights(u, r, w, n, version);
    /* 2: a resend of a queued pull, which now answers on r's route */
}

/* Sync with checkpoints: acknowledge a push of step t only once version t+1
 * exists, so a push whose round a crash lost is still unanswered and the
 * worker resends it to the restored server. */
static void upd_await(ps_updater *u, req_ctx *r, int64_t want)
{
    char why[256];
    int64_t version = 0;
    int queued = 0;
    int rc = ps_shard_await(u->shard, r->key, r->chunk, want, r, &queued, &version, why,
                            sizeof why);
    if (rc)
        upd_error(u, r, rc, why);
    else if (queued == 1)
        u->spare = NULL;
    else if (queued == 0)
        upd_ack(u, r, version, 0);
}


/* ASSIGN, SETSTATE, STATE and CLOCK (what ps.torch asks of a chunk:
 * shard.h), answered at once; payloads float32 both ways. */
static void upd_torch(ps_updater *u, req_ctx *r, const ps_header *h, zmq_msg_t *pl)
{
    char why[256];
    int64_t version = 0;
    int rc = 0;
    ps_header rep;
    ps_reply_header(&rep, h->type, r->seq, r->rank, r->key, r->chunk);
    if (h->type == PS_MSG_ASSIGN || h->type == PS_MSG_SETSTATE) {
        float *copy = NULL;
        const float *v = upd_frame_values(h, pl, &copy);
        if (!v)
            rc = PS_ENOMEM;
        else if (h->type == PS_MSG_ASSIGN)
            rc = ps_shard_assign(u->shard, h->key, h->chunk, v, (size_t)h->count, &version, why,
                                 sizeof why);
        else
            rc = ps_shard_set_state(u->shard, h->key, h->chunk, v, (size_t)h->count,
                                    h->opt_step, &version, why, sizeof why);
        free(copy);
        if (rc == PS_ENOMEM)
            snprintf(why, sizeof why, "out of memory receiving a %s", ps_msg_type_name(h->type));
        if (!rc)
            upd_ack(u, r, version, 0);
    } else if (h->type == PS_MSG_CLOCK) {
        /* a table's partition here (the I/O thread sent it to its owner; with
         * PS_FLAG_AWAY one moved here), or a chunk */
        ps_tparts *tp = upd_req_tparts(u, r, h);
        if (!tp)
            return; /* answered */
        if (!(rc = ps_tparts_decl(tp, h->key) || (h->flags & PS_FLAG_AWAY)
                       ? ps_tparts_clock(tp, h->key, h->rank, &rep.push_step, why, sizeof why)
                       : ps_shard_clock(u->shard, h->key, h->chunk, h->rank, &rep.push_step,
                                        why, sizeof why)))
            upd_send(u, &r->id, &rep, NULL);
    } else {
        const float *st[2];
        int nstate = 0;
        size_t n = 0;
        zmq_msg_t out;
        rc = ps_shard_get_state(u->shard, h->key, h->chunk, st, &nstate, &n, &rep.opt_step, why,
                                sizeof why);
        if (!rc && nstate == 0) {
            snprintf(why, sizeof why, "the servers' optimizer keeps no state (sgd, average "
                     "and add do not)");
            rc = PS_EPROTO;
        } else if (!rc && zmq_msg_init_size(&out, n * (size_t)nstate * sizeof(float)) != 0) {
            snprintf(why, sizeof why, "out of memory for a state reply");
            rc = PS_ENOMEM;
        }
        if (!rc) {
            for (int k = 0; k < nstate; k++)
                memcpy((float *)zmq_msg_data(&out) + (size_t)k * n, st[k], n * sizeof(float));
            rep.count = n * (size_t)nstate;
            rep.dtype = PS_DTYPE_F32;
            u->bytes_out += rep.count * sizeof(float);
            upd_send(u, &r->id, &rep, &out);
            zmq_msg_close(&out);
        }
    }
    if (rc)
        upd_error(u, r, rc, why);
}

static void upd_request(ps_updater *u, const ps_header *h, uint64_t mut, uint64_t rseq,
                        ps_shm_peer *shm, zmq_msg_t *id, zmq_msg_t *pl)
{
    if (rseq)
        u->last_rseq = rseq;
    if (!u->spare) {
        u->spare = calloc(1, sizeof *u->spare);
        if (!u->spare) {
            ps_error("update thread %d: out of memory; dropped a %s", u->cfg.idx,
                     ps_msg_type_name(h->type));
            ps_shm_peer_unref(shm);
            return;
        }
        zmq_msg_init(&u->spare->id);
    }
    req_ctx *r = u->spare;
    zmq_msg_move(&r->id, id);
    r->seq = h->seq;
    r->rank = h->rank;
    r->type = h->type;
    r->key = h->key;
    r->chunk = h->chunk;
    r->home = (h->flags & PS_FLAG_AWAY) ? h->home : u->cfg.server_rank;
    r->tp = u->tparts;
    r->mut = mut;
    r->rseq = rseq;
    r->t_arrive = u->cfg.trace ? ps_now_ns() : 0;
    r->shm = shm; /* the request's reference from here on */
    /* where a pull's weights go: a pushpull names a second place */
    r->shm_off = h->type == PS_MSG_PUSHPULL ? h->shm_dst : h->shm_off;
    r->count = h->count;
    /* the payload in the arena (the I/O thread checked the range) */
    const void *in_arena = shm && h->type != PS_MSG_PULL && !ps_msg_is_sparse(h->type)
                               ? ps_shm_peer_at(shm, h->shm_off, h->count * sizeof(float))
                               : NULL;
    char why[256];
    int64_t version = 0;
    uint64_t snap = 0;
    int rc;
    /* a narrower wire type counts as what crossed the wire (the shard counts
     * float32) */
    int narrow = !in_arena && h->type != PS_MSG_PULL && h->dtype != PS_DTYPE_F32;
    switch (h->type) {
    case PS_MSG_INIT: {
        float *wide = NULL;
        const void *vals = in_arena ? in_arena : upd_frame_values(h, pl, &wide);
        if (!vals) {
            upd_error(u, r, PS_ENOMEM, "out of memory receiving an init");
            break;
        }
        rc = ps_shard_init(u->shard, h->key, h->chunk, vals, (size_t)h->count, h->total,
                           &version, &snap, why, sizeof why);
        free(wide);
        if (narrow)
            ps_shard_count_narrow(u->shard, (size_t)h->count, ps_dtype_size(h->dtype));
        if (rc)
            upd_error(u, r, rc, why);
        else
            upd_ack(u, r, version, snap);
        break;
    }
    case PS_MSG_PUSH:
    case PS_MSG_PUSHPULL: {
        hold *g = calloc(1, sizeof *g);
        if (!g) {
            upd_error(u, r, PS_ENOMEM, "out of memory receiving a push");
            break;
        }
        zmq_msg_init(&g->msg);
        g->pid = (upd_push_id){h->type, h->rank, h->key, h->chunk, h->push_step};
        if (in_arena) {
            /* read in place, from the worker's buffer */
            g->g = in_arena;
            g->shm = shm;
            ps_shm_peer_ref(shm);
        } else {
            zmq_msg_move(&g->msg, pl);
            g->g = upd_frame_values(h, &g->msg, &g->copy);
            if (!g->g) {
                hold_free(g);
                upd_error(u, r, PS_ENOMEM, "out of memory receiving a push");
                break;
            }
            if (g->copy) { /* the frame is no longer needed */
                zmq_msg_close(&g->msg);
                zmq_msg_init(&g->msg);
            }
        }
        const float *grad = g->g;
        size_t first = 0, bad = ps_dtype_nonfinite(PS_DTYPE_F32, grad, (size_t)h->count, &first);
        if (bad && upd_nonfinite(u, h, (size_t)h->count, &grad, bad, first, why, sizeof why)) {
            hold_free(g);
            upd_error(u, r, PS_ENONFINITE, why);
            break;
        }
        int kept = 0, dup = 0;
        rc = ps_shard_push_sum(u->shard, h->key, h->chunk, h->rank, h->push_step,
                               h->npush > 1 ? h->npush : 1, grad, (size_t)h->count, g, &kept,
                               &dup, &version, why, sizeof why);
        if (narrow)
            ps_shard_count_narrow(u->shard, (size_t)h->count, ps_dtype_size(h->dtype));
        if (!kept)
            hold_free(g);
        if (rc) {
            upd_error(u, r, rc, why);
            break;
        }
        /* an update (this push's, or the round it completed) whose results
         * were not finite: refused to this push (kept: only logged) */
        if (upd_results_nonfinite(u, kept ? NULL : r))
            break;
        if (kept && in_arena && h->type == PS_MSG_PUSH && !u->cfg.defer_acks) {
            /* kept in the worker's arena: acknowledged when released */
            g->ack = r;
            u->spare = NULL;
            break;
        }
        if (dup)
            ps_dup_log_note(&u->dup, h);
        upd_note_restore_skips(u, h);
        if (h->type == PS_MSG_PUSHPULL) /* the version after the pushes it holds */
            upd_pull(u, r, h->push_step + (h->npush > 1 ? h->npush : 1));
        else if (u->cfg.defer_acks)
            upd_await(u, r, h->push_step + 1);
        else
            upd_ack(u, r, version, 0);
        break;
    }
    case PS_MSG_PULL:
        upd_pull(u, r, h->want_version);
        break;
    case PS_MSG_SPULL:
    case PS_MSG_SPUSH:
    case PS_MSG_SPUSHPULL:
    case PS_MSG_SASSIGN:
        if (upd_sparse(u, r, h, pl))
            u->spare = NULL; /* kept: answered later */
        break;
    case PS_MSG_ASSIGN:
    case PS_MSG_SETSTATE:
    case PS_MSG_STATE:
    case PS_MSG_CLOCK:
        upd_torch(u, r, h, pl);
        break;
    case PS_MSG_LOOKUP:
        upd_lookup(u, r, h, pl);
        break;
    default:
        upd_error(u, r, PS_EPROTO, "internal: request type not handled by update threads");
        break;
    }
    if (u->spare) { /* not queued: ready for the next request */
        zmq_msg_close(&u->spare->id);
        zmq_msg_init(&u->spare->id);
        ps_shm_peer_unref(u->spare->shm);
        u->spare->shm = NULL;
        free(u->spare->pids);
        u->spare->pids = NULL;
    }
    ps_dup_log_tick(&u->dup);
}

/* The thread's counters; with versions, the shard's version range too (a
 * walk over every chunk). */
static void upd_counters(ps_updater *u, ps_stats *st, int versions)
{
    if (versions)
        ps_shard_stats(u->shard, st);
    else
        ps_shard_counters(u->shard, st);
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++)
        ps_tparts_stats(tp, st);
    st->pushes += u->away_done.pushes;
    st->pulls += u->away_done.pulls;
    st->updates += u->away_done.updates;
    st->dup_dropped += u->away_done.dup_dropped;
    st->bytes_in += u->bytes_in;
    st->bytes_out = u->bytes_out;
    st->errors = u->errors;
    st->nonfinite = u->nonfinite;
}

/* Add to c the counts of table key's partitions moved here, from moved-in
 * ps_tparts `from` on. */
static void upd_add_away_counts(const ps_updater *u, uint64_t key, size_t from,
                                ps_table_counts *c)
{
    for (size_t a = from; a < u->naway; a++) {
        ps_table_counts x;
        if (ps_tparts_table_counts(u->away[a], key, &x))
            continue;
        c->rows += x.rows;
        c->bytes += x.bytes;
        c->created += x.created;
        c->evicted += x.evicted;
        c->filtered_pulls += x.filtered_pulls;
        c->filtered_pushes += x.filtered_pushes;
        c->pulled += x.pulled;
        c->pushed += x.pushed;
        c->updated += x.updated;
        c->rounds += x.rounds;
    }
}

/* --metrics-port: copy this thread's counters and its tables' figures into
 * its block, where a scrape reads them (server_metrics.h).  The cheap
 * counters only: no walk over the chunks. */
static void upd_publish(ps_updater *u, int64_t now)
{
    ps_stats st;
    upd_counters(u, &st, 0);
    ps_srv_mthread_publish(u->cfg.mblock, &st, now);
    size_t n = ps_tparts_count(u->tparts);
    if (n > u->nmslot) { /* a table was declared: find its label's slot once */
        int *p = realloc(u->mslot, n * sizeof *p);
        if (!p)
            return;
        u->mslot = p;
        for (size_t i = u->nmslot; i < n; i++) {
            ps_tpart_view v;
            ps_tparts_view(u->tparts, i, &v);
            p[i] = ps_srv_metrics_table_slot(u->cfg.metrics, v.key);
        }
        u->nmslot = n;
    }
    for (size_t i = 0; i < n; i++) {
        ps_tpart_view v;
        ps_table_counts c;
        ps_tparts_view(u->tparts, i, &v);
        ps_table_stats(v.store, &c);
        upd_add_away_counts(u, v.key, 0, &c);
        ps_srv_mthread_table(u->cfg.mblock, u->mslot[i], &c);
    }
    /* the tables of partitions moved here that this thread's own do not hold
     * (each once: the first moved-in partition of it adds the others) */
    for (size_t a = 0; a < u->naway; a++) {
        ps_tpart_view v;
        for (size_t i = 0; ps_tparts_view(u->away[a], i, &v); i++) {
            int seen = ps_tparts_decl(u->tparts, v.key) != NULL;
            for (size_t b = 0; b < a && !seen; b++)
                seen = ps_tparts_decl(u->away[b], v.key) != NULL;
            int slot = seen ? -1 : ps_srv_metrics_table_slot(u->cfg.metrics, v.key);
            if (slot < 0)
                continue;
            ps_table_counts c;
            ps_table_stats(v.store, &c);
            upd_add_away_counts(u, v.key, a + 1, &c);
            ps_srv_mthread_table(u->cfg.mblock, slot, &c);
        }
    }
}

/* The next command from the I/O thread.  With metrics, the counters are
 * published first whenever the thread is about to wait for one. */
static int upd_recv(ps_updater *u, zmq_msg_t *m)
{
    if (u->cfg.mblock) {
        int rc = ps_zmsg_recv(u->pair, m, ZMQ_DONTWAIT);
        if (rc == 0 || errno != EAGAIN)
            return rc;
        upd_publish(u, ps_now_ns());
    }
    return ps_zmsg_recv(u->pair, m, 0);
}

static void upd_send_stats(ps_updater *u, char tag, uint64_t token, const ps_stats *st)
{
    ps_stats_frame of = {token, *st};
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &of, sizeof of, 0);
}

/* PS_CMD_CKPT: serialize every chunk and table partition now, between two
 * requests, so each is in the checkpoint with whole updates only (full: every
 * partition whole; else each as a delta where its table allows); the I/O
 * thread takes the buffers. */
static void upd_checkpoint(ps_updater *u, uint64_t token, int full)
{
    /* The partitions moved here (u->away) are not in it: moves are refused
     * in jobs with --checkpoint-dir for now (servers added and removed). */
    int64_t t0 = ps_now_ns();
    ps_ckpt_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.token = token;
    int repl = (token & PS_REPL_SNAP_TOKEN) != 0;
    /* a replacement's snapshot is whole and starts no delta chain (2) */
    cf.rc = ps_ckpt_serialize(u->shard, u->tparts, u->cfg.mode, u->cfg.num_workers,
                              repl ? 2 : full, &cf.part);
    cf.rseq = u->last_rseq;
    if (!cf.rc && !repl) /* an init of these chunks waits for this checkpoint at most */
        ps_shard_mark_snapshot(u->shard, token);
    char tag = PS_OUT_CKPT;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &cf, sizeof cf, 0);
    if (u->cfg.trace)
        ps_trace_event(u->cfg.trace, "snapshot", "checkpoint", 1 + u->cfg.idx, t0, ps_now_ns(),
                       (int64_t)token, -1);
}

/* A replacement member loads its part of the primary's snapshot: the chunk
 * records into the shard, the partition records into the tables (declared
 * already: the stream declares them first). */
static void upd_load(ps_updater *u, const ps_cmd_frame *cf)
{
    char why[512] = "";
    ps_tparts_config tc = *ps_tparts_cfg(u->tparts);
    const char *b = cf->load_block;
    int64_t t0 = ps_now_ns();
    int rc = ps_ckpt_load_records(u->shard, u->tparts, &tc, u->cfg.idx, u->cfg.num_workers,
                                  ps_opt_state_arrays(ps_shard_opt_kind(u->shard)),
                                  b + cf->chunks_at, cf->chunks_len, b + cf->parts_at,
                                  cf->parts_len, why, sizeof why);
    free(cf->load_block);
    if (rc)
        ps_error("update thread %d: loading the primary's snapshot: %s", u->cfg.idx, why);
    else
        ps_info("update thread %d loaded its part of the primary's snapshot: %.1f MB in %.2f s",
                u->cfg.idx, (double)(cf->chunks_len + cf->parts_len) / 1e6,
                (double)(ps_now_ns() - t0) * 1e-9);
    char tag = PS_OUT_LOADED;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &rc, sizeof rc, 0);
}

/* Tell the I/O thread when this thread's lowest chunk version moved (it
 * decides on round-based checkpoints from the lowest over all threads). */
/* The lowest version over this thread's chunks and table partitions. */
static int64_t upd_min_version(const ps_updater *u, int *have)
{
    int64_t m = ps_shard_min_version(u->shard, have);
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++) {
        int ht;
        int64_t mt = ps_tparts_min_version(tp, &ht);
        if (ht && (!*have || mt < m))
            m = mt;
        *have = *have || ht;
    }
    return m;
}

static void upd_progress(ps_updater *u)
{
    int have;
    int64_t m = upd_min_version(u, &have);
    if (m == u->reported_min && have == u->reported_have)
        return;
    u->reported_min = m;
    u->reported_have = have;
    ps_progress_frame pf = {m, have};
    char tag = PS_OUT_PROGRESS;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &pf, sizeof pf, 0);
}

static void *upd_main(void *arg)
{
    ps_updater *u = arg;
    int stop = 0;
    while (!stop) {
        zmq_msg_t m, f[PS_CMD_MAX_FRAMES - 1]; /* the identity, then the request's */
        if (upd_recv(u, &m) < 0) {
            if (errno == EINTR)
                continue;
            ps_error("update thread %d: receive failed: %s", u->cfg.idx, zmq_strerror(errno));
            break;
        }
        int nf = 0;
        ps_zmsg_recv_rest(u->pair, zmq_msg_more(&m), f, &nf, PS_CMD_MAX_FRAMES - 1);
        for (int i = nf; i < PS_CMD_MAX_FRAMES - 1; i++)
            zmq_msg_init(&f[i]);
        ps_cmd_frame cf;
        if (zmq_msg_size(&m) == sizeof cf) {
            memcpy(&cf, zmq_msg_data(&m), sizeof cf);
            if (u->cfg.mblock) { /* where the push-to-apply time starts */
                ps_shard_set_recv(u->shard, cf.recv_ns);
                ps_tparts *tp;
                for (size_t i = 0; (tp = upd_tp(u, i)); i++)
                    ps_tparts_set_recv(tp, cf.recv_ns);
            }
            if (cf.cmd == PS_CMD_REQ) {
                upd_request(u, &cf.h, cf.mut, cf.rseq, cf.shm, &f[0], &f[1]);
            } else if (cf.cmd == PS_CMD_STATS) {
                ps_stats st;
                upd_counters(u, &st, 1);
                upd_send_stats(u, PS_OUT_STATS, cf.stats_token, &st);
            } else if (cf.cmd == PS_CMD_STOP) {
                stop = 1;
            } else if (cf.cmd == PS_CMD_CKPT && cf.snap_quiet && !upd_quiet(u)) {
                u->quiet_ckpt = cf.ckpt_seq; /* taken once no sync round holds a push */
            } else if (cf.cmd == PS_CMD_CKPT) {
                upd_checkpoint(u, cf.ckpt_seq, cf.ckpt_full);
            } else if (cf.cmd == PS_CMD_LOAD) {
                upd_load(u, &cf);
            } else if (cf.cmd == PS_CMD_LIVE) {
                ps_shard_set_live(u->shard, cf.rank, cf.live);
                ps_tparts *tp;
                for (size_t i = 0; (tp = upd_tp(u, i)); i++)
                    ps_tparts_set_live(tp, cf.rank, cf.live);
                upd_results_nonfinite(u, NULL); /* rounds its loss completed */
            } else if (cf.cmd == PS_CMD_JOIN) {
                ps_shard_join(u->shard, cf.rank, cf.h.push_step);
                ps_tparts *tp;
                for (size_t i = 0; (tp = upd_tp(u, i)); i++)
                    ps_tparts_join(tp, cf.rank, cf.h.push_step);
                upd_results_nonfinite(u, NULL); /* rounds it completed */
            } else if (cf.cmd == PS_CMD_TABLE) {
                upd_table(u, &cf);
            } else if (cf.cmd == PS_CMD_OPT) {
                ps_tparts *tp;
                /* a table's (HYPER with its key): its partitions here, moved ones too */
                for (size_t i = 0; cf.h.key && (tp = upd_tp(u, i)); i++)
                    ps_tparts_set_opt(tp, cf.h.key, cf.h.push_step, &cf.h.hello.opt);
                if (!cf.h.key)
                    ps_shard_set_opt(u->shard, cf.h.push_step, &cf.h.hello.opt);
            } else if (cf.cmd == PS_CMD_SNAP) {
                upd_snap_start(u, &cf);
            } else if (cf.cmd == PS_CMD_SNAP_FLUSH) {
                upd_snap_poll(u, 1);
            } else if (cf.cmd == PS_CMD_TAKE) {
                upd_move_take(u, &cf);
            } else if (cf.cmd == PS_CMD_OBJECTS) {
                upd_move_objects(u);
            } else if (cf.cmd == PS_CMD_LOAD_MOVED) {
                upd_move_load(u, &cf);
            }
            if (u->quiet_ckpt && upd_quiet(u)) {
                upd_checkpoint(u, u->quiet_ckpt, 1);
                u->quiet_ckpt = 0;
            }
            if (u->takes && !stop) /* sync: TAKEs waiting for the quiet point */
                upd_move_poll(u);
            if (u->snap && !stop) /* an export waits for items to reach its version */
                upd_snap_poll(u, 0);
            if (u->cfg.report_progress && !stop)
                upd_progress(u);
            if (u->cfg.mblock) { /* busy: a scrape's figures are at most 1 ms old */
                int64_t now = ps_now_ns();
                if (ps_srv_mthread_due(u->cfg.mblock, now))
                    upd_publish(u, now);
            }
        }
        zmq_msg_close(&m);
        ps_zmsg_close_all(f, PS_CMD_MAX_FRAMES - 1);
    }
    if (u->cfg.mblock) /* the last figures stay for the scrapes until the exporter stops */
        upd_publish(u, ps_now_ns());
    ps_stats st;
    upd_counters(u, &st, 1);
    /* each partition here, those moved here too (the I/O thread adds them by key) */
    size_t ntab = 0;
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++)
        ntab += ps_tparts_count(tp);
    ps_table_total *tot = calloc(ntab ? ntab : 1, sizeof *tot);
    size_t k = 0;
    for (size_t i = 0; tot && (tp = upd_tp(u, i)); i++) {
        ps_tpart_view v;
        for (size_t j = 0; ps_tparts_view(tp, j, &v); j++, k++) {
            tot[k].key = v.key;
            ps_table_stats(v.store, &tot[k].c);
        }
    }
    uint64_t spares, spare_bytes, copies;
    ps_shard_buffer_counts(u->shard, &spares, &spare_bytes, &copies);
    if (spares || copies)
        ps_debug("update thread %d: %llu spare weight buffers (%.1f MiB) let updates go out of "
                 "place while pull replies were in flight; %llu replies were copies (every "
                 "buffer of their chunk held, or --max-memory reached)", u->cfg.idx,
                 (unsigned long long)spares, (double)spare_bytes / 1048576.0,
                 (unsigned long long)copies);
    /* answers queued pulls with PS_ECLOSED, frees kept gradients; a weight
     * buffer a reply in flight still holds is freed when ZeroMQ releases it */
    upd_snap_drop(u);
    u->destroying = 1;
    ps_shard_destroy(u->shard);
    u->shard = NULL;
    ps_tparts_destroy(u->tparts);
    u->tparts = NULL;
    upd_move_stop(u); /* TAKEs still waiting answered; the moved-in partitions freed */
    st.errors = u->errors;
    upd_req_free(u->spare);
    u->spare = NULL;
    ps_rlimit_flush(&u->rl, ps_now_ns(), 1);
    ps_dup_log_flush(&u->dup, ps_now_ns());
    ps_stats_frame of = {0, st};
    char tag = PS_OUT_STOPPED;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &of, sizeof of, ZMQ_SNDMORE);
    zmq_send(u->pair, tot, tot ? ntab * sizeof *tot : 0, 0);
    free(tot);
    return NULL;
}

int ps_updater_create(const ps_updater_config *cfg, const ps_shard_config *sc, void *pair,
                      ps_updater **out)
{
    *out = NULL;
    if (!sc->mem_used || !cfg->copies)
        return PS_EINVAL; /* the counters a reply copy drops when it is freed */
    ps_updater *u = calloc(1, sizeof *u);
    if (!u)
        return PS_ENOMEM;
    u->cfg = *cfg;
    u->mem_used = sc->mem_used;
    u->max_memory = sc->max_memory;
    ps_shard_hooks hk = {u, hook_release, hook_ready, hook_cancel, hook_take};
    int rc = ps_shard_create(sc, &hk, &u->shard);
    if (rc) {
        free(u);
        return rc;
    }
    ps_shard_set_trace(u->shard, cfg->trace, 1 + cfg->idx);
    if (cfg->mblock)
        ps_shard_set_metrics(u->shard, &cfg->mblock->apply, &cfg->mblock->round);
    ps_shard_set_merge(u->shard, hook_merge);
    ps_tparts_config tc = {sc->mode,     sc->max_staleness, sc->num_workers, cfg->num_servers,
                           cfg->nparts,  cfg->idx,          sc->max_memory, sc->mem_used,
                           sc->guard,    cfg->worker_mem,   cfg->worker_share,
                           cfg->server_rank};
    u->thooks = (ps_tparts_hooks){u,          upd_thook_release, upd_thook_ready,
                                  hook_cancel, hook_merge,        upd_thook_take};
    rc = ps_tparts_create(&tc, &u->thooks, &u->tparts);
    if (rc) {
        ps_shard_destroy(u->shard);
        free(u);
        return rc;
    }
    if (cfg->mblock)
        ps_tparts_set_metrics(u->tparts, &cfg->mblock->apply, &cfg->mblock->round);
    if (cfg->elastic) {
        ps_shard_set_elastic(u->shard);
        ps_tparts_set_elastic(u->tparts);
    }
    u->pair = pair;
    *out = u;
    return 0;
}

ps_shard *ps_updater_shard(ps_updater *u) { return u->shard; }

ps_tparts *ps_updater_tparts(ps_updater *u) { return u->tparts; }

int ps_updater_start(ps_updater *u)
{
    /* what a restore put in the shard is known to the I/O thread already */
    u->reported_min = upd_min_version(u, &u->reported_have);
    if (pthread_create(&u->tid, NULL, upd_main, u) != 0)
        return PS_ENOMEM;
    u->started = 1;
    return 0;
}

void ps_updater_join(ps_updater *u)
{
    if (u->started)
        pthread_join(u->tid, NULL);
    u->started = 0;
}

void ps_updater_destroy(ps_updater *u)
{
    if (!u)
        return;
    u->destroying = 1;
    ps_shard_destroy(u->shard); /* before the PAIR: its hooks may still reply */
    ps_tparts_destroy(u->tparts);
    upd_move_stop(u);
    upd_rows_shrink(u);
    free(u->mslot);
    if (u->pair)
        zmq_close(u->pair);
    free(u);
}
