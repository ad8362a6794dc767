/* Objects that move between servers: what a server does when the
 * coordinator asks (MOVEPLAN), as the source of a move (take, send, wait
 * for the load, or load back) and as its destination (MOVE: load).
 * move.h has the picture; move.c the tables, the redirects and the loop. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "move_internal.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reply.h"
#include "server_internal.h"

/* ---------- MOVEPLAN: what the coordinator asks of this server ---------- */

/* The reply to req: a MOVEPLAN's carries its frame (the objects that
 * moved, or empty); a MOVE's none. */
static void ack_with(ps_server *s, zmq_msg_t *id, const ps_header *req, const mv_obj *o,
                     size_t n, uint64_t bytes)
{
    ps_header r;
    ps_reply_header(&r, req->type, req->seq, -1, req->key, req->chunk);
    r.slot = req->slot;
    if (req->type != PS_MSG_MOVEPLAN) {
        srv_send(s, id, &r);
        return;
    }
    zmq_msg_t pl;
    if (zmq_msg_init_size(&pl, n * MOVE_OBJ_BYTES)) {
        n = 0;
        zmq_msg_init(&pl);
    }
    if (n)
        move_objs_write(zmq_msg_data(&pl), o, n);
    r.count = n * MOVE_OBJ_BYTES;
    r.total = bytes;
    srv_send_payload(s, id, &r, &pl);
}

static void ack(ps_server *s, zmq_msg_t *id, const ps_header *req)
{
    ack_with(s, id, req, NULL, 0, 0);
}

static int give_start(ps_server *s, zmq_msg_t *f, const ps_header *h, char *why, size_t len);

/* The objects of a MOVEPLAN's frame (malloc'd), or NULL when they do not
 * read (refused, saying why). */
static mv_obj *plan_objs(ps_server *s, zmq_msg_t *f, const ps_header *h, const void *pl,
                         size_t plen, size_t *n)
{
    char why[512];
    mv_obj *o;
    int rc = move_objs_parse(pl, plen, 0, &o, n, why, sizeof why);
    if (rc) {
        srv_refuse(s, &f[0], h, rc, why);
        return NULL;
    }
    return o;
}

void ps_move_on_moveplan(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move *m = s->move;
    char why[512];
    const void *pl = nf >= 3 ? zmq_msg_data(&f[2]) : NULL;
    size_t plen = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    switch (h->chunk) {
    case MOVE_PLAN_CLAIM: /* an added server: you are slot sl; the slots' endpoints follow */
        if (!s->cfg.added || h->slot != s->cfg.rank) {
            ps_errorf(why, sizeof why, "this server is %s rank %d; the coordinator makes it slot "
                "%d: start it with --added --rank %d", s->cfg.added ? "--added with" : "not "
                "--added (it is the job's own server of", s->cfg.rank, h->slot, h->slot);
            srv_refuse(s, &f[0], h, PS_EMISMATCH, why);
            return;
        }
        if (m->claimed) { /* the coordinator asked again (its first answer was lost) */
            ack(s, &f[0], h);
            return;
        }
        m->claimed = 1;
        if (h->owner_ep[0])
            snprintf(m->self_ep, sizeof m->self_ep, "%s", h->owner_ep);
        ps_info("joined the job as server slot %d (%s); objects move here next", s->cfg.rank,
                m->self_ep);
        ack(s, &f[0], h);
        return;
    case MOVE_PLAN_EXPECT: { /* these objects are coming (each names its source) */
        size_t n;
        mv_obj *o = plan_objs(s, f, h, pl, plen, &n);
        if (!o)
            return;
        int rc = 0;
        if (h->owner_ep[0])
            snprintf(m->self_ep, sizeof m->self_ep, "%s", h->owner_ep);
        for (size_t i = 0; i < n && !rc; i++)
            rc = move_tab_put(&m->incoming, &o[i], o[i].slot);
        free(o);
        if (rc) {
            srv_refuse(s, &f[0], h, rc, "out of memory noting the objects to come");
            return;
        }
        ack(s, &f[0], h);
        return;
    }
    case MOVE_PLAN_CANCEL: { /* they are not coming: they stay at their sources */
        size_t n;
        mv_obj *o = plan_objs(s, f, h, pl, plen, &n);
        if (!o)
            return;
        for (size_t i = 0; i < n; i++) {
            int from = move_tab_get(&m->incoming, &o[i]);
            if (from == MOVE_NONE)
                continue; /* loaded after all: it is here */
            move_tab_del(&m->incoming, &o[i]);
            if (from != s->cfg.rank)
                move_tab_put(&m->gone, &o[i], from);
        }
        free(o);
        ack(s, &f[0], h);
        return;
    }
    case MOVE_PLAN_GIVE:
        if (give_start(s, f, h, why, sizeof why) != 0)
            srv_refuse(s, &f[0], h, PS_EINVAL, why);
        return;
    case MOVE_PLAN_LEFT:
        if (!m->left) {
            m->left = 1;
            m->left_ns = m->left_heard_ns = ps_now_ns();
            ps_info("removed from the job: every object moved off; answering everything "
                    "PS_EMOVED until no worker asks for %d ms (at most %d ms), then exiting",
                    PS_MOVE_LEFT_QUIET_MS, PS_MOVE_LEFT_MAX_MS);
        }
        ack(s, &f[0], h);
        return;
    default:
        ps_errorf(why, sizeof why, "moveplan c = %u: 1 claim, 2 expect, 3 give, 4 left, 5 cancel",
                  h->chunk);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
    }
}

/* ---------- a source: take, send, and wait for the load ---------- */

static void give_finish(ps_server *s, give_job *g);

static int give_start(ps_server *s, zmq_msg_t *f, const ps_header *h, char *why, size_t len)
{
    ps_move *m = s->move;
    const void *pl = zmq_msg_data(&f[2]);
    size_t plen = zmq_msg_size(&f[2]);
    if (h->slot < 0 || !h->owner_ep[0] || h->slot == s->cfg.rank) {
        ps_errorf(why, len, "moveplan give needs the destination: `sl` (not this server's "
                  "%d) and `to`", s->cfg.rank);
        return PS_EINVAL;
    }
    uint32_t to_threads = 0;
    if (plen >= 8)
        memcpy(&to_threads, pl, 4);
    if (to_threads < 1 || to_threads > PS_SERVER_MAX_THREADS) {
        ps_errorf(why, len, "moveplan give: the destination's threads (first u32 of the "
                  "frame) must be in [1, %d], got %u", PS_SERVER_MAX_THREADS, to_threads);
        return PS_EINVAL;
    }
    give_job *g = NULL;
    for (int i = 0; i < MOVE_MAX_GIVES && !g; i++)
        if (!m->give[i].active)
            g = &m->give[i];
    if (!g) {
        ps_errorf(why, len, "%d moves from this server at once already", MOVE_MAX_GIVES);
        return PS_EINVAL;
    }
    mv_obj *o;
    size_t n;
    int rc = move_objs_parse(pl, plen, 8, &o, &n, why, len);
    if (rc)
        return rc;
    memset(g, 0, sizeof *g);
    g->objs = o;
    g->nobjs = n;
    g->slot_to = h->slot;
    g->to_threads = (int)to_threads;
    snprintf(g->to_ep, sizeof g->to_ep, "%s", h->owner_ep);
    g->req = *h;
    g->t0 = ps_now_ns();
    /* groups: (this server's owning thread, the destination's) */
    int T = s->cfg.threads;
    g->grp = calloc((size_t)T * (size_t)to_threads + 1, sizeof *g->grp);
    if (!g->grp || move_slot_set(m, h->slot, h->owner_ep)) {
        free(g->grp);
        free(o);
        memset(g, 0, sizeof *g);
        g->slot_to = -1;
        ps_errorf(why, len, "out of memory planning the move");
        return PS_ENOMEM;
    }
    /* order the objects by group, so each group's are contiguous */
    for (size_t i = 0; i < n; i++) {
        int a = move_owner_thread(s->cfg.rank, T, &o[i]);
        int b = move_owner_thread(h->slot, (int)to_threads, &o[i]);
        o[i].slot = a * (int)to_threads + b; /* the group, for the sort */
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort: lists are short */
        mv_obj x = o[i];
        size_t j = i;
        for (; j > 0 && o[j - 1].slot > x.slot; j--)
            o[j] = o[j - 1];
        o[j] = x;
    }
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && o[j].slot == o[i].slot)
            j++;
        give_grp *gr = &g->grp[g->ngroups++];
        gr->thread = o[i].slot / (int)to_threads;
        gr->to_thread = o[i].slot % (int)to_threads;
        gr->objs = &o[i];
        gr->n = j - i;
        i = j;
    }
    g->active = 1;
    zmq_msg_init(&g->id);
    zmq_msg_copy(&g->id, &f[0]);
    g->have_id = 1;
    g->left = g->ngroups;
    ps_info("moving %zu objects to slot %d (%s) in %d groups", n, g->slot_to, g->to_ep,
            g->ngroups);
    if (!g->ngroups) {
        give_finish(s, g);
        return 0;
    }
    for (int k = 0; k < g->ngroups; k++)
        move_send_take(s, g->grp[k].thread, g->grp[k].objs, g->grp[k].n, g->slot_to, g->to_ep,
                       ((uint64_t)(g - m->give) << 16) | (uint64_t)k);
    return 0;
}

/* Every group is over: the coordinator is told which objects moved (all,
 * or those whose groups were loaded there: the others are here again). */
static void give_finish(ps_server *s, give_job *g)
{
    ps_move *m = s->move;
    double sec = (double)(ps_now_ns() - g->t0) * 1e-9;
    size_t moved = 0;
    uint64_t bytes = 0;
    for (int k = 0; k < g->ngroups; k++)
        if (g->grp[k].state == 2) { /* loaded there: in place, before what is not */
            memmove(&g->objs[moved], g->grp[k].objs, g->grp[k].n * sizeof *g->objs);
            moved += g->grp[k].n;
            bytes += g->grp[k].bytes;
        }
    if (g->rc)
        ps_error("moving %zu objects to slot %d (%s): %zu moved, the rest stay here: %s",
                 g->nobjs, g->slot_to, g->to_ep, moved, g->why);
    else
        ps_info("moved %zu objects (%.1f MB) to slot %d (%s) in %.3f s (%.0f MB/s; taken "
                "after %.3f s)", g->nobjs, (double)g->bytes / 1e6, g->slot_to, g->to_ep, sec,
                sec > 0 ? (double)g->bytes / 1e6 / sec : 0.0,
                g->t_taken ? (double)(g->t_taken - g->t0) * 1e-9 : 0.0);
    m->out_objects += moved;
    ack_with(s, &g->id, &g->req, g->objs, moved, bytes);
    move_give_free(g);
}

/* Group gr did not move (rc, why): its records load back into the thread
 * they came from, and this server answers for its objects again. */
static void grp_back(ps_server *s, give_job *g, give_grp *gr, int rc, const char *why)
{
    for (size_t j = 0; j < gr->n; j++)
        move_tab_del(&s->move->gone, &gr->objs[j]);
    move_send_load(s, gr->thread, gr->block, gr->len, 0);
    gr->block = NULL;
    gr->state = 3;
    if (!g->rc) {
        g->rc = rc;
        snprintf(g->why, sizeof g->why, "slot %d: %s", g->slot_to, why);
    }
}

/* A group is over (loaded there, or back here). */
static void grp_over(ps_server *s, give_job *g)
{
    if (--g->left == 0)
        give_finish(s, g);
}

void ps_move_taken(ps_server *s, int i, ps_move_frame *tf)
{
    ps_move *m = s->move;
    uint64_t gi = tf->token >> 16, k = tf->token & 0xffff;
    give_job *g = gi < MOVE_MAX_GIVES ? &m->give[gi] : NULL;
    if (!g || !g->active || k >= (uint64_t)g->ngroups || g->grp[k].thread != i) {
        ps_error("update thread %d took objects for no move in progress; loading them back", i);
        if (!tf->rc && tf->block)
            move_send_load(s, i, tf->block, tf->len, 0);
        return;
    }
    give_grp *gr = &g->grp[k];
    if (tf->rc) { /* nothing taken: the objects stay here, served as before */
        if (!g->rc) {
            g->rc = tf->rc;
            snprintf(g->why, sizeof g->why, "update thread %d: %s", i, tf->why);
        }
        free(tf->block);
        gr->state = 3;
        grp_over(s, g);
        return;
    }
    gr->block = tf->block;
    gr->len = tf->len;
    gr->bytes = tf->bytes;
    g->bytes += tf->bytes;
    if (!g->t_taken)
        g->t_taken = ps_now_ns();
    /* from here on this server answers for them: they are at slot_to */
    for (size_t j = 0; j < gr->n; j++) {
        move_tab_put(&m->gone, &gr->objs[j], g->slot_to);
        move_tab_del(&m->homes, &gr->objs[j]);
    }
    /* [u32 objects, u32 destination thread, the objects (24 bytes each), the records] */
    size_t head = 8 + gr->n * MOVE_OBJ_BYTES;
    zmq_msg_t pl;
    char why[256];
    int rc = zmq_msg_init_size(&pl, head + gr->len) ? PS_ENOMEM : 0;
    if (!rc) {
        unsigned char *p = zmq_msg_data(&pl);
        uint32_t nn = (uint32_t)gr->n, tt = (uint32_t)gr->to_thread;
        memcpy(p, &nn, 4);
        memcpy(p + 4, &tt, 4);
        move_objs_write(p + 8, gr->objs, gr->n);
        memcpy(p + head, gr->block, gr->len);
        ps_header h;
        ps_header_init(&h, PS_MSG_MOVE);
        h.slot = s->cfg.rank;
        h.chunk = (uint32_t)gr->to_thread;
        h.count = head + gr->len;
        rc = ps_links_ask(m->links, g->to_ep, g->slot_to, &h, &pl, PS_MOVE_TIMEOUT_MS,
                          tf->token, why, sizeof why);
        zmq_msg_close(&pl);
    } else {
        snprintf(why, sizeof why, "out of memory for the records' message");
    }
    if (rc) { /* not sent: they come back here */
        grp_back(s, g, gr, rc, why);
        grp_over(s, g);
        return;
    }
    gr->state = 1;
}

/* The destination's answer to a MOVE (tag: the group), or its failure. */
static void move_answered(ps_move *m, uint64_t tag, const ps_header *h, int rc, const char *why)
{
    ps_server *s = m->s;
    uint64_t gi = tag >> 16, k = tag & 0xffff;
    give_job *g = gi < MOVE_MAX_GIVES ? &m->give[gi] : NULL;
    if (!g || !g->active || k >= (uint64_t)g->ngroups || g->grp[k].state != 1)
        return;
    give_grp *gr = &g->grp[k];
    if (!rc && h->type == PS_MSG_ERROR) {
        rc = h->err_code ? h->err_code : PS_EIO;
        why = h->err_text;
    }
    if (!rc) {
        free(gr->block);
        gr->block = NULL;
        gr->state = 2;
    } else {
        /* the destination does not have them: back here, served again */
        ps_error("slot %d (%s) did not load %zu objects (%s); they stay here", g->slot_to,
                 g->to_ep, gr->n, why);
        grp_back(s, g, gr, rc, why);
    }
    grp_over(s, g);
}

void move_link_done(void *user, uint64_t tag, const ps_header *h, zmq_msg_t *payload, int rc,
                    const char *why)
{
    ps_move *m = user;
    if (tag & MOVE_TAG_COORD)
        move_coord_reply(m, tag, h, payload, rc, why);
    else
        move_answered(m, tag, h, rc, why);
}

/* ---------- a destination: load what came ---------- */

void ps_move_on_move(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move *m = s->move;
    char why[256];
    const unsigned char *p = nf >= 3 ? zmq_msg_data(&f[2]) : NULL;
    size_t len = nf >= 3 ? zmq_msg_size(&f[2]) : 0;
    uint32_t n = 0, t = 0;
    if (len >= 8) {
        memcpy(&n, p, 4);
        memcpy(&t, p + 4, 4);
    }
    size_t head = 8 + (size_t)n * MOVE_OBJ_BYTES;
    if (h->slot < 0) {
        srv_refuse(s, &f[0], h, PS_EPROTO, "a move names the slot it comes from (`sl`)");
        return;
    }
    if (len < head || t >= (uint32_t)s->cfg.threads) {
        ps_errorf(why, sizeof why, "a move of %zu bytes for update thread %u (of %d) is not "
            "[u32 objects, u32 thread, the objects, the records]", len, t, s->cfg.threads);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    load_job *lj = NULL;
    for (int i = 0; i < MOVE_MAX_LOADS && !lj; i++)
        if (!m->load[i].active)
            lj = &m->load[i];
    if (!lj) {
        srv_refuse(s, &f[0], h, PS_ETOOBIG, "too many moves loading here at once; ask again");
        return;
    }
    mv_obj *o;
    size_t no;
    int rc = move_objs_parse(p + 8, head - 8, 0, &o, &no, why, sizeof why);
    void *block = rc ? NULL : malloc(len - head ? len - head : 1);
    if (!rc && !block) {
        free(o);
        rc = PS_ENOMEM;
        snprintf(why, sizeof why, "out of memory for %zu bytes of records", len - head);
    }
    if (rc) {
        srv_refuse(s, &f[0], h, rc, why);
        return;
    }
    memcpy(block, p + head, len - head);
    free(lj->objs);
    memset(lj, 0, sizeof *lj);
    lj->active = 1;
    zmq_msg_init(&lj->id);
    zmq_msg_copy(&lj->id, &f[0]);
    lj->have_id = 1;
    lj->req = *h;
    lj->objs = o;
    lj->n = no;
    lj->from_slot = h->slot;
    lj->bytes = len - head;
    lj->t0 = ps_now_ns();
    move_send_load(s, (int)t, block, len - head, (uint64_t)(lj - m->load) + 1);
}

void ps_move_loaded(ps_server *s, int i, ps_move_frame *lf)
{
    ps_move *m = s->move;
    if (lf->rc) /* nothing loaded: the block came back */
        free(lf->block);
    if (!lf->token) { /* records loaded back where they came from */
        if (lf->rc)
            ps_error("update thread %d could not load back objects that did not move: %s", i,
                     lf->why);
        return;
    }
    uint64_t k = lf->token - 1;
    if (k >= MOVE_MAX_LOADS || !m->load[k].active)
        return;
    load_job *lj = &m->load[k];
    if (lf->rc) {
        ps_error("loading %zu objects from slot %d failed: %s", lj->n, lj->from_slot, lf->why);
        /* they stay at the source, which loads them back */
        for (size_t j = 0; j < lj->n; j++) {
            move_tab_del(&m->incoming, &lj->objs[j]);
            move_tab_put(&m->gone, &lj->objs[j], lj->from_slot);
        }
        srv_refuse(s, &lj->id, &lj->req, lf->rc, lf->why);
    } else {
        for (size_t j = 0; j < lj->n; j++) {
            move_tab_del(&m->incoming, &lj->objs[j]);
            move_tab_del(&m->gone, &lj->objs[j]); /* back home, some of them */
            if (lj->objs[j].kind == PS_SMAP_CHUNK && lj->objs[j].home != s->cfg.rank)
                move_tab_put(&m->homes, &lj->objs[j], lj->objs[j].home);
            else
                move_tab_del(&m->homes, &lj->objs[j]);
        }
        m->in_objects += lj->n;
        ps_info("loaded %zu objects (%.1f MB) from slot %d on update thread %d in %.3f s",
                lj->n, (double)lj->bytes / 1e6, lj->from_slot, i,
                (double)(ps_now_ns() - lj->t0) * 1e-9);
        ack(s, &lj->id, &lj->req);
    }
    lj->have_id = 0;
    free(lj->objs);
    memset(lj, 0, sizeof *lj);
}
