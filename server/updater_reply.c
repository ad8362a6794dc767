/* An update thread's replies and what its modules share (updater_reply.h):
 * replies to the I/O thread, copies of weights for pull replies, a push's
 * values read and checked. */
#include "updater_reply.h"
#include "updater_move.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <zmq.h>

#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reply.h"
#include "zmsg.h"

/* A copy this large gets pages of its own (mmap), which go back to the system
 * when ZeroMQ frees it: a burst of copies for a slow reader leaves no heap
 * behind. */
#define COPY_MAP_BYTES (128u << 10)

/* Send [tag, identity, header, payload?] to the I/O thread.  Blocking: the I/O
 * thread always drains replies, so this never waits for long.  With durable
 * rounds, a reply naming a version (push ack, pull) is tagged to wait in the
 * I/O thread until a checkpoint holds that version; with the async ack
 * bound, one acknowledging mutation `mut` until a checkpoint is near enough;
 * an init acknowledgement until a checkpoint holds the chunk (snap: the
 * first snapshot that held it, 0 none yet). */
static void upd_send_as(ps_updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload,
                        uint64_t mut, uint64_t snap, uint64_t rseq)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0) {
        ps_error("update thread %d: cannot encode a %s reply", u->cfg.idx,
                 ps_msg_type_name(h->type));
        return;
    }
    char tag[1 + 2 * sizeof(int64_t)] = {PS_OUT_REPLY};
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
    if (tag[0] != PS_OUT_REPLY || rseq) {
        memcpy(tag + 1, &arg, sizeof arg);
        tlen = 1 + sizeof arg;
    }
    if (rseq) { /* it waits for the group's members first (server/repl.h) */
        memcpy(tag + tlen, &rseq, sizeof rseq);
        tlen += sizeof rseq;
    }
    zmq_send(u->pair, tag, tlen, ZMQ_SNDMORE);
    zmq_msg_send(id, u->pair, ZMQ_SNDMORE);
    zmq_send(u->pair, buf, len, payload ? ZMQ_SNDMORE : 0);
    if (payload)
        zmq_msg_send(payload, u->pair, 0);
}

void upd_send(ps_updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload)
{
    upd_send_as(u, id, h, payload, 0, 0, 0);
}

void upd_error(ps_updater *u, req_ctx *r, int code, const char *why)
{
    ps_header h;
    int32_t slot;
    const char *ep;
    char moved[PS_ERR_TEXT_MAX];
    if (code == PS_ENOTFOUND && u->nmoved && upd_move_where(u, r, &slot, &ep)) {
        /* sent here before the I/O thread knew it moved */
        snprintf(moved, sizeof moved, "it moved to server slot %d (%.120s)", slot, ep);
        ps_reply_error(&h, r->seq, r->rank, r->key, r->chunk, PS_EMOVED, moved);
        h.slot = slot;
        snprintf(h.owner_ep, sizeof h.owner_ep, "%s", ep);
        upd_send_as(u, &r->id, &h, NULL, 0, 0, r->rseq);
        return;
    }
    ps_reply_error(&h, r->seq, r->rank, r->key, r->chunk, code, why);
    if (code == PS_EMOVED) /* where it is now */
        upd_move_name_dest(u, &h);
    u->errors++;
    const char *name = ps_msg_is_sparse(r->type)
                           ? ps_tparts_name(r->tp ? r->tp : u->tparts, r->key)
                           : NULL;
    int say = ps_rlimit_allow(&u->rl);
    if (say && name)
        ps_warn("refused %s from worker %d (table '%s', key %llu, partition %u): %s: %s",
                ps_msg_type_name(r->type), r->rank, name, (unsigned long long)r->key, r->chunk,
                ps_strerror(code), why);
    else if (say)
        ps_warn("refused %s from worker %d (key %llu chunk %u): %s: %s",
                ps_msg_type_name(r->type), r->rank, (unsigned long long)r->key, r->chunk,
                ps_strerror(code), why);
    upd_send_as(u, &r->id, &h, NULL, 0, 0, r->rseq);
}

void upd_ack(ps_updater *u, req_ctx *r, int64_t version, uint64_t snap)
{
    ps_header h;
    ps_reply_header(&h, r->type, r->seq, r->rank, r->key, r->chunk);
    h.chunk_version = version;
    upd_send_as(u, &r->id, &h, NULL, r->mut, snap, r->rseq);
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
    upd_send_as(u, &r->id, &h, pl, r->mut, 0, r->rseq);
    if (pl)
        zmq_msg_close(pl);
    if (u->cfg.trace)
        ps_trace_event(u->cfg.trace, "pull", "serve", 1 + u->cfg.idx, r->t_arrive, ps_now_ns(),
                       version, -1);
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
    const char *name = ps_msg_is_sparse(h->type) ? ps_tparts_name(u->tparts, h->key) : NULL;
    char where[128];
    if (name)
        snprintf(where, sizeof where, "table '%s' partition %u", name, h->chunk);
    else
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

int upd_take_from_arena(ps_updater *u, const upd_push_id *p, const float **g, size_t n,
                        float **copy, char *why, size_t why_len)
{
    if (!n)
        return 0;
    float *c = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    if (!c) {
        ps_errorf(why, why_len, "out of memory copying a kept push of %zu values", n);
        return PS_ENOMEM;
    }
    /* one read of the worker's memory: what is checked is what is summed */
    size_t first = 0, bad = ps_dtype_copy_nonfinite(c, *g, n, &first);
    free(*copy);
    *copy = c;
    *g = c;
    if (!bad)
        return 0;
    ps_header h;
    memset(&h, 0, sizeof h);
    h.type = p->type;
    h.rank = p->rank;
    h.key = p->key;
    h.chunk = p->chunk;
    h.push_step = p->step;
    if (upd_nonfinite(u, &h, n, g, bad, first, why, why_len)) {
        size_t len = strlen(why);
        snprintf(why + len, why_len - len, " (written in shared memory after it came)");
        return PS_ENONFINITE;
    }
    return 0;
}

int upd_results_nonfinite(ps_updater *u, req_ctx *r)
{
    ps_shard_nonfinite d;
    ps_table_nonfinite t;
    uint64_t tkey = 0;
    ps_shard_take_nonfinite(u->shard, &d);
    /* every partition here, those moved here too: the first one's key named */
    memset(&t, 0, sizeof t);
    int tpart = u->cfg.idx, thome = u->cfg.server_rank;
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++) {
        uint64_t k;
        ps_table_nonfinite x;
        ps_tparts_take_nonfinite(tp, &k, &x);
        if (!x.rows)
            continue;
        if (!t.rows) {
            t = x;
            tkey = k;
            tpart = ps_tparts_cfg(tp)->part;
            thome = ps_tparts_cfg(tp)->home;
        } else {
            t.rows += x.rows;
            t.values += x.values;
        }
    }
    if (!d.updates && !t.rows)
        return 0;
    u->nonfinite += d.updates + t.rows;
    int refuse = u->cfg.on_nonfinite == PS_NONFINITE_REFUSE;
    char why[256];
    if (d.updates)
        snprintf(why, sizeof why, "update result not finite: %llu values of key %llu chunk %u "
                 "kept their old values and state (--on-nonfinite %s)",
                 (unsigned long long)d.values, (unsigned long long)d.key, d.chunk,
                 refuse ? "refuse" : "skip");
    else
        snprintf(why, sizeof why, "update result not finite: %llu values of %llu row(s) of "
                 "table %llu partition %d of server %d (the first: row %llu) kept their old "
                 "values and state (--on-nonfinite %s)", (unsigned long long)t.values,
                 (unsigned long long)t.rows, (unsigned long long)tkey, tpart, thome,
                 (unsigned long long)t.id, refuse ? "refuse" : "skip");
    if (refuse && r) {
        upd_error(u, r, PS_ENONFINITE, why);
        return 1;
    }
    if (ps_rlimit_allow(&u->rl))
        ps_warn("update thread %d: %s", u->cfg.idx, why);
    return 0;
}
