#include "updater_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zmq.h>

#include "checkpoint.h"
#include "dup_log.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ratelimit.h"
#include "reply.h"
#include "zmsg.h"

/* Pull replies of at least this many bytes are sent from the chunk's weight
 * buffer itself (zero-copy, ps_shard_pin); smaller ones are copied, which
 * costs less than the pin (ZeroMQ copies frames under 8 KiB into its send
 * batch anyway) and needs no spare buffer. */
#define ZC_MIN_BYTES 8192
/* A copy this large gets pages of its own (mmap), which go back to the system
 * when ZeroMQ frees it: a burst of copies for a slow reader leaves no heap
 * behind. */
#define COPY_MAP_BYTES (128u << 10)

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
} hold;

/* Send [tag, identity, header, payload?] to the I/O thread.  Blocking: the I/O
 * thread always drains replies, so this never waits for long.  With durable
 * rounds, a reply naming a version (push ack, pull) is tagged to wait in the
 * I/O thread until a checkpoint holds that version; with the async ack
 * bound, one acknowledging mutation `mut` until a checkpoint is near enough;
 * an init acknowledgement until a checkpoint holds the chunk (snap: the
 * first snapshot that held it, 0 none yet). */
static void upd_send_as(ps_updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload,
                        uint64_t mut, uint64_t snap)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("update thread %d: cannot encode a %s reply", u->cfg.idx,
                 ps_msg_type_name(h->type));
        return;
    }
    char tag[1 + sizeof(int64_t)] = {PS_OUT_REPLY};
    size_t tlen = 1;
    int64_t arg = 0;
    /* with checkpoints, a chunk a worker was told exists is in one first, so
     * a restored server never lacks a chunk its workers use */
    if (u->cfg.hold_inits && h->type == PS_MSG_INIT) {
        tag[0] = PS_OUT_INIT;
        arg = (int64_t)snap;
    }
    if (u->cfg.durable && (h->type == PS_MSG_PUSH || h->type == PS_MSG_PULL ||
                            h->type == PS_MSG_PUSHPULL || ps_msg_is_sparse(h->type))) {
        tag[0] = PS_OUT_HELD;
        arg = h->chunk_version;
    }
    if (u->cfg.ack_bound && mut &&
        (h->type == PS_MSG_PUSH || h->type == PS_MSG_PUSHPULL || h->type == PS_MSG_SPUSH ||
         h->type == PS_MSG_SPUSHPULL)) {
        tag[0] = PS_OUT_ACK;
        arg = (int64_t)mut;
    }
    if (tag[0] != PS_OUT_REPLY) {
        memcpy(tag + 1, &arg, sizeof arg);
        tlen = sizeof tag;
    }
    zmq_send(u->pair, tag, tlen, ZMQ_SNDMORE);
    zmq_msg_send(id, u->pair, ZMQ_SNDMORE);
    zmq_send(u->pair, buf, len, payload ? ZMQ_SNDMORE : 0);
    if (payload)
        zmq_msg_send(payload, u->pair, 0);
}

static void upd_send(ps_updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    upd_send_as(u, id, h, payload, 0, 0);
}

void upd_error(ps_updater *u, req_ctx *r, int code, const char *why)
{
    ps_header h;
    ps_reply_error(&h, r->seq, r->rank, r->key, r->chunk, code, why);
    u->errors++;
    if (ps_rlimit_allow(&u->rl))
        ps_warn("refused %s from worker %d (key %llu chunk %u): %s: %s",
                ps_msg_type_name(r->type), r->rank, (unsigned long long)r->key, r->chunk,
                ps_strerror(code), why);
    upd_send(u, &r->id, &h, NULL);
}

void upd_ack(ps_updater *u, req_ctx *r, int64_t version, uint64_t snap)
{
    ps_header h;
    ps_reply_header(&h, r->type, r->seq, r->rank, r->key, r->chunk);
    h.chunk_version = version;
    upd_send_as(u, &r->id, &h, NULL, r->mut, snap);
}

/* ZeroMQ's free callback of a zero-copy reply: runs on whichever thread
 * closes the last copy of the message (a ZeroMQ I/O thread once the bytes
 * are written, or the I/O thread when it drops the reply). */
static void zc_release(void *data, void *ref)
{
    (void)data;
    ps_shard_unpin(ref);
}

/* A pull reply's copy of the weights: this header, then the data at
 * COPY_HDR (64-byte aligned).  A large one is charged to mem_used (and
 * copies) until ZeroMQ frees it. */
typedef struct copy_hdr {
    _Atomic uint64_t *mem_used, *copies;
    uint64_t charge;  /* bytes charged, 0 for a small copy */
    size_t map_len;   /* mmap'ed: its length; else 0 (malloc) */
} copy_hdr;
#define COPY_HDR 64

static void copy_free(void *data, void *hint)
{
    (void)data;
    copy_hdr *c = hint;
    if (c->charge) {
        atomic_fetch_sub(c->mem_used, c->charge);
        atomic_fetch_sub(c->copies, c->charge);
    }
    if (c->map_len)
        munmap(c, c->map_len);
    else
        free(c);
}

/* Make *pl a copy of the n weights w in dtype (a narrower wire type: each
 * rounded to nearest even; ps_dtype.h).  A copy of ZC_MIN_BYTES or more
 * (every buffer of the chunk is held by replies in flight, no spare fits in
 * --max-memory, or the wire type is not float32) is memory of its own,
 * counted against --max-memory: PS_ETOOBIG when it does not fit, PS_ENOMEM;
 * why says.  *not_finite: whether a value of the copy is NaN or Inf (a
 * weight beyond float16's 65504 becomes Inf). */
int upd_copy_payload(ps_updater *u, zmq_msg_t *pl, const float *w, size_t n, uint32_t dtype,
                     int *not_finite, char *why, size_t why_len)
{
    *not_finite = 0;
    size_t bytes = n * ps_dtype_size(dtype);
    uint64_t charge = bytes >= ZC_MIN_BYTES ? bytes : 0, before = 0;
    if (charge) {
        before = atomic_fetch_add(u->mem_used, charge);
        if (before + charge > u->max_memory) {
            atomic_fetch_sub(u->mem_used, charge);
            ps_errorf(why, why_len, "--max-memory %llu bytes is in use (chunks and pull replies "
                "not yet read); no room for this reply's %zu-byte copy: retry later",
                (unsigned long long)u->max_memory, bytes);
            return PS_ETOOBIG;
        }
        atomic_fetch_add(u->cfg.copies, charge);
    }
    size_t total = COPY_HDR + bytes, map_len = 0;
    void *blk;
    if (total >= COPY_MAP_BYTES) {
        blk = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (blk == MAP_FAILED)
            blk = NULL;
        else
            map_len = total;
    } else {
        blk = malloc(total);
    }
    copy_hdr *c = blk;
    if (c) {
        *c = (copy_hdr){u->mem_used, u->cfg.copies, charge, map_len};
        *not_finite = ps_dtype_from_f32(dtype, (char *)blk + COPY_HDR, w, n);
        if (zmq_msg_init_data(pl, (char *)blk + COPY_HDR, bytes, copy_free, c) == 0)
            return 0;
        copy_free(NULL, c);
    } else if (charge) {
        atomic_fetch_sub(u->mem_used, charge);
        atomic_fetch_sub(u->cfg.copies, charge);
    }
    ps_errorf(why, why_len, "out of memory building the pull reply");
    return PS_ENOMEM;
}

void upd_reply_payload(ps_updater *u, req_ctx *r, zmq_msg_t *pl, uint64_t count, uint32_t dim,
                       size_t elems, uint32_t dtype, int64_t version)
{
    ps_header h;
    ps_reply_header(&h, r->type, r->seq, r->rank, r->key, r->chunk);
    h.chunk_version = version;
    h.count = count;
    h.dim = dim;
    h.dtype = pl ? dtype : PS_DTYPE_F32;
    if (!pl) { /* written to the worker's arena already */
        h.flags |= PS_FLAG_SHM;
        h.shm_off = r->shm_off;
    }
    u->bytes_out += elems * ps_dtype_size(h.dtype);
    upd_send_as(u, &r->id, &h, pl, r->mut, 0);
    if (pl)
        zmq_msg_close(pl);
    if (u->cfg.trace)
        ps_trace_event(u->cfg.trace, "pull", "serve", 1 + u->cfg.idx, r->t_arrive, ps_now_ns(),
                       version, -1);
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

void upd_req_free(req_ctx *r)
{
    if (!r)
        return;
    zmq_msg_close(&r->id);
    ps_shm_peer_unref(r->shm);
    free(r->pids);
    free(r);
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
    req_ctx *r = waiter;
    upd_error(user, r, PS_ECLOSED, "the server is shutting down; this pull was still waiting");
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

/* The shard is done with a kept gradient.  From the arena, the push's
 * acknowledgement waited for this: send it now (its round is complete), or
 * at shutdown say the push was never applied. */
static void hook_release(void *user, void *v)
{
    ps_updater *u = user;
    hold *h = v;
    if (h->ack) {
        req_ctx *r = h->ack;
        if (u->destroying) {
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

/* The float32 values of payload frame pl (h->count elements of h->dtype):
 * the frame itself when it is float32 and 4-byte aligned (*copy NULL), else
 * a 64-byte aligned copy in *copy, which the caller frees: small frames can
 * sit unaligned in ZeroMQ's receive buffer, and a narrower wire type is
 * widened here, in the update thread (exactly: ps_dtype.h).  NULL when out
 * of memory. */
const float *upd_frame_values(const ps_header *h, zmq_msg_t *pl, float **copy)
{
    const void *data = zmq_msg_data(pl);
    size_t n = (size_t)h->count;
    *copy = NULL;
    if (h->dtype == PS_DTYPE_F32 && (uintptr_t)data % sizeof(float) == 0)
        return data;
    *copy = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    if (*copy)
        ps_dtype_to_f32(h->dtype, *copy, data, n);
    return *copy;
}

/* What a push (h) to a restored chunk or table partition skipped, said:
 * steps of an async rank beyond its restored clock, rounds of a sync one
 * fast-forwarded (the counts over both, and what was said already). */
void upd_note_restore_skips(ps_updater *u, const ps_header *h)
{
    const char *what = ps_msg_is_sparse(h->type) ? "table %llu partition %u"
                                                 : "key %llu chunk %u";
    char where[64];
    snprintf(where, sizeof where, what, (unsigned long long)h->key, h->chunk);
    uint64_t jumped = ps_shard_jumped(u->shard) + ps_tparts_jumped(u->tparts);
    if (jumped != u->jump_seen && ps_rlimit_allow(&u->rl)) {
        ps_warn("%s: the first push of worker %d since the restore is step %lld, %llu beyond "
                "its clock in the checkpoint: pushes the old process acknowledged after its "
                "last checkpoint were lost with it (%llu steps in all so far)", where, h->rank,
                (long long)h->push_step, (unsigned long long)(jumped - u->jump_seen),
                (unsigned long long)jumped);
        u->jump_seen = jumped;
    }
    uint64_t ff = ps_shard_fast_forwards(u->shard) + ps_tparts_fast_forwards(u->tparts);
    if (ff != u->ff_seen && ps_rlimit_allow(&u->rl)) {
        ps_warn("%s: worker %d pushed step %lld, beyond the round of the restored checkpoint; "
                "skipped to it (%llu round(s) in all were lost with the old process; a "
                "checkpoint every round loses none)", where, h->rank, (long long)h->push_step,
                (unsigned long long)ff);
        u->ff_seen = ff;
    }
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
        if (!(rc = ps_shard_clock(u->shard, h->key, h->chunk, h->rank, &rep.push_step, why,
                                  sizeof why)))
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

/* A pushed gradient g of n values (a dense chunk's, or a sparse push's
 * rows) holds NaN or Inf (bad of them, the first at index first): counted,
 * then as --on-nonfinite says refused (returns 1, the reply's reason in
 * why; upd_error logs it), or skipped (*g becomes NULL: the shard counts
 * the push and moves no weight) or applied, each logged (rate-limited).
 * A check of its own over the values, apart from the optimizer's vectorised
 * loops: one compare per value. */
int upd_nonfinite(ps_updater *u, const ps_header *h, size_t n, const float **g, size_t bad,
                  size_t first, char *why, size_t why_len)
{
    u->nonfinite++;
    int mode = u->cfg.on_nonfinite;
    snprintf(why, why_len, "push of step %lld from worker %d to %s %llu %s %u: %zu of %zu "
             "values are not finite (element %zu is %g); %s (--on-nonfinite %s)",
             (long long)h->push_step, h->rank, ps_msg_is_sparse(h->type) ? "table" : "key",
             (unsigned long long)h->key, ps_msg_is_sparse(h->type) ? "partition" : "chunk",
             h->chunk, bad, n, first, (double)(*g)[first],
             mode == PS_NONFINITE_REFUSE ? "refused" : mode == PS_NONFINITE_SKIP ? "skipped"
                                                                                 : "applied",
             mode == PS_NONFINITE_REFUSE ? "refuse" : mode == PS_NONFINITE_SKIP ? "skip"
                                                                                : "apply");
    if (mode == PS_NONFINITE_REFUSE)
        return 1;
    if (ps_rlimit_allow(&u->rl))
        ps_warn("%s", why);
    if (mode == PS_NONFINITE_SKIP)
        *g = NULL;
    return 0;
}

static void upd_request(ps_updater *u, const ps_header *h, uint64_t mut, ps_shm_peer *shm,
                        zmq_msg_t *id, zmq_msg_t *pl)
{
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
    r->mut = mut;
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
        if (upd_sparse(u, r, h, pl))
            u->spare = NULL; /* kept: answered later */
        break;
    case PS_MSG_ASSIGN:
    case PS_MSG_SETSTATE:
    case PS_MSG_STATE:
    case PS_MSG_CLOCK:
        upd_torch(u, r, h, pl);
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

static void upd_stats(ps_updater *u, ps_stats *st)
{
    ps_shard_stats(u->shard, st);
    ps_tparts_stats(u->tparts, st);
    st->bytes_in += u->bytes_in;
    st->bytes_out = u->bytes_out;
    st->errors = u->errors;
    st->nonfinite = u->nonfinite;
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
    int64_t t0 = ps_now_ns();
    ps_ckpt_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.token = token;
    cf.rc = ps_ckpt_serialize(u->shard, u->tparts, u->cfg.mode, u->cfg.num_workers, full,
                              &cf.part);
    if (!cf.rc) /* an init of these chunks waits for this checkpoint at most */
        ps_shard_mark_snapshot(u->shard, token);
    char tag = PS_OUT_CKPT;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &cf, sizeof cf, 0);
    if (u->cfg.trace)
        ps_trace_event(u->cfg.trace, "snapshot", "checkpoint", 1 + u->cfg.idx, t0, ps_now_ns(),
                       (int64_t)token, -1);
}

/* Tell the I/O thread when this thread's lowest chunk version moved (it
 * decides on round-based checkpoints from the lowest over all threads). */
/* The lowest version over this thread's chunks and table partitions. */
static int64_t upd_min_version(const ps_updater *u, int *have)
{
    int hc, ht;
    int64_t mc = ps_shard_min_version(u->shard, &hc), mt = ps_tparts_min_version(u->tparts, &ht);
    *have = hc || ht;
    return !ht ? mc : !hc ? mt : mc < mt ? mc : mt;
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
        if (ps_zmsg_recv(u->pair, &m, 0) < 0) {
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
            if (cf.cmd == PS_CMD_REQ) {
                upd_request(u, &cf.h, cf.mut, cf.shm, &f[0], &f[1]);
            } else if (cf.cmd == PS_CMD_STATS) {
                ps_stats st;
                upd_stats(u, &st);
                upd_send_stats(u, PS_OUT_STATS, cf.stats_token, &st);
            } else if (cf.cmd == PS_CMD_STOP) {
                stop = 1;
            } else if (cf.cmd == PS_CMD_CKPT) {
                upd_checkpoint(u, cf.ckpt_seq, cf.ckpt_full);
            } else if (cf.cmd == PS_CMD_LIVE) {
                ps_shard_set_live(u->shard, cf.rank, cf.live);
                ps_tparts_set_live(u->tparts, cf.rank, cf.live);
            } else if (cf.cmd == PS_CMD_TABLE) {
                upd_table(u, &cf);
            } else if (cf.cmd == PS_CMD_OPT) {
                ps_shard_set_opt(u->shard, cf.h.push_step, &cf.h.hello.opt);
            }
            if (u->cfg.report_progress && !stop)
                upd_progress(u);
        }
        zmq_msg_close(&m);
        ps_zmsg_close_all(f, PS_CMD_MAX_FRAMES - 1);
    }
    ps_stats st;
    upd_stats(u, &st);
    size_t ntab = ps_tparts_count(u->tparts);
    ps_table_total *tot = calloc(ntab ? ntab : 1, sizeof *tot);
    for (size_t i = 0; tot && i < ntab; i++) {
        ps_tpart_view v;
        ps_tparts_view(u->tparts, i, &v);
        tot[i].key = v.key;
        ps_table_stats(v.store, &tot[i].c);
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
    u->destroying = 1;
    ps_shard_destroy(u->shard);
    u->shard = NULL;
    ps_tparts_destroy(u->tparts);
    u->tparts = NULL;
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
    ps_shard_hooks hk = {u, hook_release, hook_ready, hook_cancel};
    int rc = ps_shard_create(sc, &hk, &u->shard);
    if (rc) {
        free(u);
        return rc;
    }
    ps_shard_set_trace(u->shard, cfg->trace, 1 + cfg->idx);
    ps_shard_set_merge(u->shard, hook_merge);
    ps_tparts_config tc = {sc->mode,     sc->max_staleness, sc->num_workers, cfg->num_servers,
                           cfg->nparts,  cfg->idx,          sc->max_memory, sc->mem_used};
    ps_tparts_hooks th = {u, upd_thook_release, upd_thook_ready, hook_cancel, hook_merge};
    rc = ps_tparts_create(&tc, &th, &u->tparts);
    if (rc) {
        ps_shard_destroy(u->shard);
        free(u);
        return rc;
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
    free(u->rows);
    if (u->pair)
        zmq_close(u->pair);
    free(u);
}
