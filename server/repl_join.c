/* A replacement member catching up while training goes on (server/repl.h):
 *
 *  replacement                          primary
 *  REPL_JOIN c=0 (its incarnation) ---> member opened as "joining": the
 *                                       stream goes to it from here on, not
 *                                       waited for; the tables' declarations
 *                                       first, then PS_CMD_CKPT (a snapshot)
 *                                       to every update thread: sync takes it
 *                                       where no round holds a push
 *  <--- REPL_HELLO, the stream, and per update thread its part of the
 *       snapshot (REPL_SNAP pieces: `rs` the last stream message it holds)
 *  stream data kept until every part is loaded (PS_CMD_LOAD, on its update
 *  thread), then replayed but for what a part holds already (seq <= rs)
 *  REPL_JOIN c=1 ---------------------> etcd: add it to the members (a new
 *                                       epoch); from then on replies wait
 *                                       for it too
 *
 * A replacement whose primary is lost before it is a member stops (exit 1):
 * what it loaded is the old primary's, and the supervisor starts another.
 * Everything here runs on the I/O thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "repl_internal.h"
#include "server_internal.h"
#include "zmsg.h"

/* The bytes of a REPL_SNAP piece: a page, as an export's (the frame check's
 * limit for PS_PL_BYTES) */
#define SNAP_PIECE PS_SNAP_PAGE_BYTES
/* A replacement that sees no progress (no hello, stream, piece) this long
 * after it asked, or after the last one, gives up. */
#define JOIN_STALL_MS 60000

/* A stream message kept until the snapshot is loaded. */
typedef struct kept {
    struct kept *next;
    ps_header h;
    int nf;
    zmq_msg_t f[PS_CMD_MAX_FRAMES];
} kept;

struct repl_join {
    /* the replacement's side */
    int T;                   /* update threads (parts) */
    int64_t asked_ns, t0, progress_ns;
    int acked, done;
    unsigned char **part;    /* per update thread: its part as it comes */
    uint64_t *tot, *got, *upto;
    uint8_t *state;          /* 0 coming, 1 sent to load, 2 loaded */
    int nloaded;
    kept **head, **tail;     /* per update thread: the stream kept until its part loads */
    size_t nkept, applied, skipped;
    uint64_t bytes;
    int64_t got_ns;          /* when the last part was whole */
    /* the primary's side: one replacement at a time */
    int slot;                /* -1: none */
    uint64_t inc, token, sent;
    int parts_left, add_pending;
    int64_t p_t0, p_sent_ns;
};

static repl_join *join_of(ps_repl *r)
{
    if (!r->join) {
        repl_join *j = calloc(1, sizeof *j);
        if (!j)
            return NULL;
        j->slot = -1;
        r->join = j;
    }
    return r->join;
}

static void free_kept(repl_join *j)
{
    for (int o = 0; j->head && o < j->T; o++)
        while (j->head[o]) {
            kept *k = j->head[o];
            j->head[o] = k->next;
            ps_zmsg_close_all(k->f, k->nf);
            free(k);
        }
    j->nkept = 0;
}

void repl_join_close(ps_repl *r)
{
    repl_join *j = r->join;
    if (r->join_dealer)
        zmq_close(r->join_dealer);
    r->join_dealer = NULL;
    if (!j)
        return;
    free_kept(j);
    for (int i = 0; j->part && i < j->T; i++)
        free(j->part[i]);
    free(j->part);
    free(j->tot);
    free(j->got);
    free(j->upto);
    free(j->state);
    free(j->head);
    free(j->tail);
    free(j);
    r->join = NULL;
}

static void send_join(ps_repl *r, int caught_up, int64_t now)
{
    ps_header h;
    ps_header_init(&h, PS_MSG_REPL_JOIN);
    h.rank = -1;
    h.epoch = r->cfg.epoch ? r->cfg.epoch : 1;
    h.member = r->me;
    h.key = r->inc;
    h.chunk = (uint32_t)caught_up;
    h.hello = srv_my_hello(r->s);
    repl_send(r->join_dealer, &h, NULL, 0);
    r->join->asked_ns = now;
}

/* (Re)connect the join's DEALER to the primary the configuration names. */
static int dial_primary(ps_repl *r, char *why, size_t why_len)
{
    if (r->join_dealer)
        zmq_close(r->join_dealer);
    r->join_dealer = repl_dealer(r, r->cfg.primary, why, why_len);
    return r->join_dealer ? 0 : PS_EIO;
}

int repl_join_start(ps_repl *r, int64_t now, char *why, size_t why_len)
{
    repl_join *j = join_of(r);
    if (!j)
        return PS_ENOMEM;
    j->T = r->s->cfg.threads;
    j->part = calloc((size_t)j->T, sizeof *j->part);
    j->tot = calloc((size_t)j->T, sizeof *j->tot);
    j->got = calloc((size_t)j->T, sizeof *j->got);
    j->upto = calloc((size_t)j->T, sizeof *j->upto);
    j->state = calloc((size_t)j->T, 1);
    j->head = calloc((size_t)j->T, sizeof *j->head);
    j->tail = calloc((size_t)j->T, sizeof *j->tail);
    if (!j->part || !j->tot || !j->got || !j->upto || !j->state || !j->head || !j->tail)
        return PS_ENOMEM;
    if (r->cfg.primary == r->me) {
        ps_errorf(why, why_len, "group %d's configuration names member %d (this slot) as the "
                  "primary, held by an earlier process (%s): its replicas take over first; "
                  "start this one again once they have", r->g, r->me, r->m[r->me].ep);
        return PS_ESTATE;
    }
    int rc = dial_primary(r, why, why_len);
    if (rc)
        return rc;
    j->t0 = j->progress_ns = now;
    send_join(r, 0, now);
    ps_info("replicas: this server replaces member %d of group %d: asking the primary (member "
            "%d, %s) for the group's state", r->me, r->g, r->cfg.primary, r->m[r->cfg.primary].ep);
    return 0;
}

/* ---------------------------------------------------------------- replacement side */

static int takes_now(uint32_t t)
{
    /* declarations and settings go at once (the snapshot's partitions need
     * their tables); data waits for the snapshot */
    return t == PS_MSG_TABLE || t == PS_MSG_HYPER || t == PS_MSG_HEARTBEAT ||
           t == PS_MSG_REPL_LIVE;
}

/* The update thread a stream message goes to (-1: the I/O thread's). */
static int owner_of(const ps_repl *r, const ps_header *h)
{
    if (ps_msg_is_sparse(h->type))
        return (int)h->chunk;
    if (h->type == PS_MSG_INIT || h->type == PS_MSG_PUSH || h->type == PS_MSG_ASSIGN ||
        h->type == PS_MSG_SETSTATE)
        return ps_server_owner(h->key, h->chunk, r->s->cfg.threads);
    return -1;
}

int repl_join_stream(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h)
{
    repl_join *j = r->join;
    if (r->role != PS_REPL_JOINING || !j || takes_now(h->type))
        return 0;
    int o = owner_of(r, h);
    if (o < 0 || o >= j->T)
        return 0;
    if (j->state[o]) /* its part is loading or loaded: after it in the PAIR's order */
        return h->seq <= j->upto[o] ? -1 : 0;
    kept *k = calloc(1, sizeof *k);
    if (!k) {
        /* without it the copy would differ: give up this replacement */
        ps_error("replicas: out of memory keeping the stream while the snapshot comes");
        r->s->io_failed = 1;
        srv_set_stopping(r->s);
        return -1;
    }
    k->h = *h;
    k->nf = nf;
    for (int i = 0; i < nf && i < PS_CMD_MAX_FRAMES; i++) {
        zmq_msg_init(&k->f[i]);
        zmq_msg_move(&k->f[i], &f[i]);
    }
    if (j->tail[o])
        j->tail[o]->next = k;
    else
        j->head[o] = k;
    j->tail[o] = k;
    j->nkept++;
    j->progress_ns = ps_now_ns();
    return -1;
}

/* Update thread o was handed its part (PS_CMD_LOAD): what the stream
 * brought it meanwhile follows in its PAIR, but for what the part holds
 * already (seq <= its upto). */
static void flush_owner(ps_repl *r, int o)
{
    repl_join *j = r->join;
    while (j->head[o]) {
        kept *k = j->head[o];
        j->head[o] = k->next;
        if (k->h.seq <= j->upto[o]) {
            j->skipped++;
        } else {
            srv_stream_dispatch(r->s, k->f, k->nf, &k->h);
            j->applied++;
        }
        ps_zmsg_close_all(k->f, k->nf);
        free(k);
    }
    j->tail[o] = NULL;
}

/* Every part is loaded: ask to be a member. */
static void loaded_all(ps_repl *r, int64_t now)
{
    repl_join *j = r->join;
    double secs = (double)(now - j->t0) * 1e-9, got = (double)(j->got_ns - j->t0) * 1e-9;
    ps_info("replicas: loaded the primary's snapshot of group %d: %.1f MB in %.2f s (%.0f MB/s; "
            "all of it here after %.2f s); %zu stream messages kept meanwhile applied, %zu "
            "already in it; asking to be a member", r->g, (double)j->bytes / 1e6, secs,
            secs > 0 ? (double)j->bytes / 1e6 / secs : 0.0, got, j->applied, j->skipped);
    j->done = 1;
    send_join(r, 1, now);
}

void ps_repl_loaded(ps_repl *r, int owner, int rc)
{
    repl_join *j = r ? r->join : NULL;
    if (!j || owner < 0 || owner >= j->T || j->state[owner] != 1)
        return;
    if (rc) {
        char why[128];
        snprintf(why, sizeof why, "update thread %d could not load its part of the snapshot (%s)",
                 owner, ps_strerror(rc));
        r->s->io_failed = 1;
        srv_set_stopping(r->s);
        ps_error("replicas: %s; this server stops (exit 1)", why);
        return;
    }
    j->state[owner] = 2;
    if (++j->nloaded == j->T)
        loaded_all(r, ps_now_ns());
}

static int from_primary(const ps_repl *r, const zmq_msg_t *id)
{
    size_t n = zmq_msg_size((zmq_msg_t *)id);
    return r->have_pid && n == zmq_msg_size((zmq_msg_t *)&r->pid) &&
           memcmp(zmq_msg_data((zmq_msg_t *)id), zmq_msg_data((zmq_msg_t *)&r->pid), n) == 0;
}

static void refuse(ps_repl *r, zmq_msg_t *id, const ps_header *h, int code, const char *why)
{
    ps_header e;
    ps_reply_error(&e, h->seq, h->rank, h->key, h->chunk, code, why);
    e.epoch = r->cfg.epoch;
    e.member = r->cfg.primary;
    srv_send(r->s, id, &e);
}

/* A piece of the snapshot from the primary. */
static void on_snap(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h, int64_t now)
{
    repl_join *j = r->join;
    char why[256];
    if (repl_keep_pending(r, f, nf))
        return; /* its sender's hello is being checked: after it */
    if (r->role != PS_REPL_JOINING || !j || !from_primary(r, &f[0]) || h->epoch < r->cfg.epoch) {
        refuse(r, &f[0], h, PS_ESTALE, "a snapshot is taken only by a joining member from the "
               "primary that said hello");
        return;
    }
    int c = (int)h->chunk;
    uint64_t n = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    if (c >= j->T || j->state[c] || h->total < 16 || h->key > h->total ||
        n > h->total - h->key || (j->tot[c] && j->tot[c] != h->total) || h->key != j->got[c]) {
        snprintf(why, sizeof why, "snapshot piece [%llu, +%llu) of %llu bytes for update thread "
                 "%u does not follow the %llu bytes taken (%d threads here)",
                 (unsigned long long)h->key, (unsigned long long)n,
                 (unsigned long long)h->total, h->chunk,
                 (unsigned long long)(c < j->T ? j->got[c] : 0), j->T);
        refuse(r, &f[0], h, PS_EPROTO, why);
        return;
    }
    if (!j->part[c]) {
        j->part[c] = malloc(h->total);
        if (!j->part[c]) {
            refuse(r, &f[0], h, PS_ENOMEM, "out of memory for the snapshot");
            ps_error("replicas: out of memory for %llu bytes of snapshot; this server stops",
                     (unsigned long long)h->total);
            r->s->io_failed = 1;
            srv_set_stopping(r->s);
            return;
        }
        j->tot[c] = h->total;
        j->upto[c] = h->stream_pos;
    }
    memcpy(j->part[c] + h->key, zmq_msg_data(&f[2]), n);
    j->got[c] += n;
    j->bytes += n;
    j->progress_ns = now;
    ps_header ack;
    ps_reply_header(&ack, PS_MSG_REPL_SNAP, h->seq, -1, h->key, h->chunk);
    srv_send(r->s, &f[0], &ack);
    if (j->got[c] < j->tot[c])
        return;
    /* whole: [u64 chunk bytes][chunk records][partition records] */
    uint64_t clen;
    memcpy(&clen, j->part[c], 8);
    if (clen > j->tot[c] - 8) {
        ps_error("replicas: update thread %d's part of the snapshot says %llu bytes of chunks in "
                 "%llu; this server stops", c, (unsigned long long)clen,
                 (unsigned long long)j->tot[c]);
        r->s->io_failed = 1;
        srv_set_stopping(r->s);
        return;
    }
    ps_cmd_frame cmd = {.cmd = PS_CMD_LOAD, .load_block = j->part[c], .chunks_at = 8,
                        .chunks_len = clen, .parts_at = 8 + clen,
                        .parts_len = j->tot[c] - 8 - clen};
    j->part[c] = NULL; /* the update thread frees it */
    j->state[c] = 1;
    srv_send_cmd(r->s, c, &cmd, NULL, NULL);
    flush_owner(r, c);
    j->got_ns = now;
}

void repl_join_read(ps_repl *r, int64_t now)
{
    repl_join *j = r->join;
    for (int b = 0; b < 64 && r->join_dealer; b++) {
        zmq_msg_t f[4];
        if (ps_zmsg_recv(r->join_dealer, &f[0], ZMQ_DONTWAIT) < 0)
            return;
        int nf = 1;
        ps_zmsg_recv_rest(r->join_dealer, zmq_msg_more(&f[0]), f, &nf, 4);
        ps_header h;
        char why[256];
        int rc = ps_proto_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &h, why, sizeof why);
        ps_zmsg_close_all(f, nf);
        if (rc || !j)
            continue;
        j->progress_ns = now;
        if (h.type == PS_MSG_REPL_JOIN) {
            if (!j->acked && !j->done)
                ps_info("replicas: the primary sends group %d's state", r->g);
            j->acked = 1;
            continue;
        }
        if (h.type != PS_MSG_ERROR)
            continue;
        if (h.err_code == PS_ENOTPRIMARY && !j->acked && h.epoch >= r->cfg.epoch &&
            h.member != r->me && h.member != r->cfg.primary) {
            /* another member is the primary now: ask it */
            ps_info("replicas: %s; asking member %d", h.err_text, h.member);
            r->cfg.primary = h.member;
            r->cfg.epoch = h.epoch;
            if (dial_primary(r, why, sizeof why) == 0)
                send_join(r, j->done, now);
            continue;
        }
        if (j->done && h.err_code == PS_ESTALE) {
            /* what it loaded is no longer followed by a stream: start over */
            char w[400];
            snprintf(w, sizeof w, "the primary will not add this replacement: %s", h.err_text);
            repl_step_down(r, w);
            return;
        }
        /* not now (a member still listed for this slot, another join): again
         * shortly (the primary is removing what stood in the way) */
        ps_info("replicas: the primary answered the join: %s; asking again", h.err_text);
        j->asked_ns = now - (int64_t)r->failure_ms * 2000000LL + (int64_t)r->failure_ms * 250000LL;
    }
}

/* ---------------------------------------------------------------- primary side */

/* Send header fh (no frames) to the joining member alone, outside the
 * stream's numbering (nothing waits for its answer). */
static void to_joiner(ps_repl *r, int slot, ps_header *fh)
{
    fh->seq = 0;
    fh->flags |= PS_FLAG_REPL;
    fh->epoch = r->cfg.epoch;
    fh->member = r->me;
    repl_send(r->m[slot].dealer, fh, NULL, 0);
}

/* What the snapshot's update threads need before their parts: every table
 * declared, the optimizer as HYPER changed it, the workers that left. */
static void preamble(ps_repl *r, int slot)
{
    ps_server *s = r->s;
    for (size_t i = 0; i < s->ntables; i++) {
        ps_header h;
        ps_header_init(&h, PS_MSG_TABLE);
        h.rank = -1;
        h.key = s->tables[i].key;
        h.table = s->tables[i].decl;
        snprintf(h.table_name, sizeof h.table_name, "%s", s->tables[i].name);
        to_joiner(r, slot, &h);
        /* its optimizer as HYPER changed it */
        ps_header_init(&h, PS_MSG_HYPER);
        h.rank = -1;
        h.key = s->tables[i].key;
        h.hello = srv_my_hello(s);
        h.hello.opt = s->tables[i].opt_now;
        h.hello.opt.kind = ps_table_decl_params_kind(s->tables[i].opt_now.kind);
        h.hello.opt.given = PS_OPT_GIVEN_ALL;
        to_joiner(r, slot, &h);
    }
    ps_header h;
    ps_header_init(&h, PS_MSG_HYPER);
    h.rank = -1;
    h.hello = srv_my_hello(s);
    h.hello.opt = s->opt_now;
    h.hello.opt.given = PS_OPT_GIVEN_ALL;
    to_joiner(r, slot, &h);
    for (int w = 0; w < s->cfg.num_workers; w++)
        if (s->left[w]) {
            ps_header_init(&h, PS_MSG_REPL_LIVE);
            h.rank = -1;
            h.key = (uint64_t)w;
            h.chunk = 2;
            to_joiner(r, slot, &h);
        }
}

static void answer(ps_repl *r, zmq_msg_t *id, const ps_header *h)
{
    ps_header rep;
    ps_reply_header(&rep, h->type, h->seq, -1, h->key, h->chunk);
    rep.epoch = r->cfg.epoch;
    rep.member = r->me;
    srv_send(r->s, id, &rep);
}

static void on_join(ps_repl *r, zmq_msg_t *f, const ps_header *h, int64_t now)
{
    char why[320];
    repl_join *j = join_of(r);
    int k = h->member;
    if (r->role != PS_REPL_PRIMARY) {
        ps_repl_not_primary(r, &f[0], h);
        return;
    }
    ps_hello mine = srv_my_hello(r->s), theirs = h->hello;
    if (ps_hello_compare(&mine, "the primary", &theirs, "the replacement", 1, why, sizeof why)) {
        refuse(r, &f[0], h, PS_EMISMATCH, why);
        return;
    }
    if (!j || k < 0 || k >= r->n || k == r->me) {
        refuse(r, &f[0], h, !j ? PS_ENOMEM : PS_EPROTO, "no such member to join");
        return;
    }
    if (h->chunk == 1) { /* it loaded the snapshot: add it */
        if (j->slot != k || j->inc != h->key || j->parts_left) {
            /* its join was given up (or another primary's): it starts over
             * as a new process */
            refuse(r, &f[0], h, PS_ESTALE, "no snapshot of this primary was sent to it (its "
                   "join was given up, or another primary sent it)");
            return;
        }
        j->add_pending = 1;
        answer(r, &f[0], h);
        return;
    }
    int i = ps_group_find(&r->cfg, k);
    if (i >= 0 && r->cfg.m[i].inc == h->key) {
        answer(r, &f[0], h); /* a member already */
        return;
    }
    if (i >= 0) {
        /* the process it replaces is still listed: out first */
        snprintf(why, sizeof why, "member %d is still in group %d as incarnation %" PRIx64
                 ": removing it first, ask again", k, r->g, r->cfg.m[i].inc);
        refuse(r, &f[0], h, PS_ESTATE, why);
        repl_remove(r, k, "a new process replaces it", now);
        return;
    }
    if (j->slot == k && j->inc != h->key)
        /* a new process of the one that was joining: that one is gone */
        repl_join_failed(r, k, "a new process replaces it");
    if (j->slot >= 0 && (j->slot != k || j->inc != h->key)) {
        snprintf(why, sizeof why, "member %d is joining group %d now: one at a time, ask again",
                 j->slot, r->g);
        refuse(r, &f[0], h, PS_ESTATE, why);
        return;
    }
    if (j->slot == k) { /* asked again while it comes */
        answer(r, &f[0], h);
        return;
    }
    if (r->m[k].dealer) {
        zmq_close(r->m[k].dealer);
        r->m[k].dealer = NULL;
    }
    if (repl_open_member(r, k, 1, now) != 0) {
        refuse(r, &f[0], h, PS_EIO, "cannot open the stream to it");
        return;
    }
    j->slot = k;
    j->inc = h->key;
    j->parts_left = r->s->cfg.threads;
    j->token = PS_REPL_SNAP_TOKEN | (uint64_t)++r->snaps;
    j->sent = 0;
    j->add_pending = 0;
    j->p_t0 = now;
    preamble(r, k);
    ps_cmd_frame cmd = {.cmd = PS_CMD_CKPT, .ckpt_seq = j->token, .ckpt_full = 1,
                        .snap_quiet = r->s->cfg.mode == PS_MODE_SYNC};
    for (int t = 0; t < r->s->cfg.threads; t++)
        srv_send_cmd(r->s, t, &cmd, NULL, NULL);
    answer(r, &f[0], h);
    ps_info("replicas: member %d (%s) joins group %d: sending it a snapshot of every update "
            "thread%s, then the stream", k, r->m[k].ep, r->g,
            r->s->cfg.mode == PS_MODE_SYNC ? " (each where no sync round holds a push)" : "");
}

void ps_repl_snap_part(ps_repl *r, int owner, ps_ckpt_frame *cf)
{
    repl_join *j = r ? r->join : NULL;
    ps_ckpt_part *p = &cf->part;
    if (!j || j->slot < 0 || cf->token != j->token || !r->m[j->slot].dealer || cf->rc) {
        if (j && cf->token == j->token && cf->rc)
            repl_join_failed(r, j->slot, "a snapshot part could not be made (out of memory)");
        free(p->buf);
        free(p->tbuf);
        return;
    }
    uint64_t clen = p->len, tot = 8 + p->len + p->tlen;
    ps_header h;
    ps_header_init(&h, PS_MSG_REPL_SNAP);
    h.rank = -1;
    h.flags = PS_FLAG_REPL;
    h.epoch = r->cfg.epoch;
    h.member = r->me;
    h.chunk = (uint32_t)owner;
    h.total = tot;
    h.stream_pos = cf->rseq;
    /* pieces of [u64 clen][buf][tbuf] */
    for (uint64_t at = 0; at < tot;) {
        uint64_t n = tot - at < SNAP_PIECE ? tot - at : SNAP_PIECE;
        zmq_msg_t piece;
        if (zmq_msg_init_size(&piece, n) != 0) {
            repl_join_failed(r, j->slot, "out of memory sending the snapshot");
            break;
        }
        unsigned char *d = zmq_msg_data(&piece);
        for (uint64_t w = 0; w < n;) {
            uint64_t pos = at + w, take;
            if (pos < 8) {
                take = 8 - pos < n - w ? 8 - pos : n - w;
                memcpy(d + w, (const unsigned char *)&clen + pos, take);
            } else if (pos < 8 + p->len) {
                take = 8 + p->len - pos < n - w ? 8 + p->len - pos : n - w;
                memcpy(d + w, (const unsigned char *)p->buf + (pos - 8), take);
            } else {
                take = n - w;
                memcpy(d + w, (const unsigned char *)p->tbuf + (pos - 8 - p->len), take);
            }
            w += take;
        }
        h.key = at;
        h.count = n;
        repl_send(r->m[j->slot].dealer, &h, &piece, 1);
        zmq_msg_close(&piece);
        at += n;
    }
    j->sent += tot;
    free(p->buf);
    free(p->tbuf);
    if (--j->parts_left == 0 && j->slot >= 0) {
        j->p_sent_ns = ps_now_ns();
        double secs = (double)(j->p_sent_ns - j->p_t0) * 1e-9;
        ps_info("replicas: snapshot for member %d sent: %.1f MB in %.2f s", j->slot,
                (double)j->sent / 1e6, secs);
    }
}

void repl_join_failed(ps_repl *r, int slot, const char *why)
{
    repl_join *j = r->join;
    if (!j || j->slot != slot || slot < 0)
        return;
    ps_warn("replicas: member %d (%s) stopped joining group %d: %s", slot, r->m[slot].ep, r->g,
            why);
    if (r->m[slot].dealer && !r->m[slot].in_cfg) {
        zmq_close(r->m[slot].dealer);
        r->m[slot].dealer = NULL;
        r->m[slot].joining = 0;
    }
    j->slot = -1;
    j->parts_left = 0;
    j->add_pending = 0;
}

void repl_join_message(ps_repl *r, zmq_msg_t *f, int nf, const ps_header *h, int64_t now)
{
    if (h->type == PS_MSG_REPL_JOIN)
        on_join(r, f, h, now);
    else if (h->type == PS_MSG_REPL_SNAP)
        on_snap(r, f, nf, h, now);
}

void repl_join_timers(ps_repl *r, int64_t now)
{
    repl_join *j = r->join;
    if (!j)
        return;
    if (r->role == PS_REPL_PRIMARY && j->slot >= 0 && j->add_pending && !r->cas_busy) {
        ps_group_cfg next = r->cfg;
        if (next.n < PS_GROUP_MAX_MEMBERS && ps_group_find(&next, j->slot) < 0) {
            next.m[next.n].slot = j->slot;
            next.m[next.n].inc = j->inc;
            next.n++;
            next.epoch++;
            char w[200];
            double secs = (double)(now - j->p_t0) * 1e-9;
            snprintf(w, sizeof w, "member %d caught up (%.1f MB of snapshot, %.2f s from its "
                     "join, %.0f MB/s)", j->slot, (double)j->sent / 1e6, secs,
                     secs > 0 ? (double)j->sent / 1e6 / secs : 0.0);
            repl_propose(r, &next, REPL_CAS_ADD, w, 0);
        }
        j->add_pending = 0;
        j->slot = -1; /* repl_apply makes it a member once etcd has it */
    }
    if (r->role != PS_REPL_JOINING)
        return;
    /* the replacement: its primary lost while it came, or no progress */
    int64_t last = r->p_heard_ns > r->p_since_ns ? r->p_heard_ns : r->p_since_ns;
    if (r->have_pid && (r->p_gone_ns || now - last > (int64_t)r->failure_ms * 1000000LL * 4)) {
        r->s->io_failed = 1;
        srv_set_stopping(r->s);
        r->role = PS_REPL_DEPOSED;
        ps_error("replicas: the primary of group %d was lost while this server caught up from "
                 "it; this server stops (exit 1), a new replacement copies from the next one",
                 r->g);
        return;
    }
    if (!j->acked && now - j->asked_ns > (int64_t)r->failure_ms * 2000000LL)
        send_join(r, 0, now);
    else if (j->done && now - j->asked_ns > (int64_t)r->failure_ms * 2000000LL)
        send_join(r, 1, now); /* not added yet: say it again */
    if (now - j->progress_ns > (int64_t)JOIN_STALL_MS * 1000000LL) {
        r->s->io_failed = 1;
        srv_set_stopping(r->s);
        r->role = PS_REPL_DEPOSED;
        ps_error("replicas: no progress joining group %d for %d s; this server stops (exit 1)",
                 r->g, JOIN_STALL_MS / 1000);
    }
}
