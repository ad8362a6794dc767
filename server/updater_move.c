/* An update thread's side of servers added and removed (updater_move.h):
 * taking objects out at a quiet point, loading those moved here, and the
 * table partitions moved here from other servers (one ps_tparts per (home,
 * part), created on the first load of one and given up when its last table
 * moves on). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "move_records.h"
#include "optimizer.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "server.h"
#include "server_metrics.h"
#include "updater_move.h"

/* A TAKE waiting for the quiet point. */
typedef struct upd_take {
    ps_cmd_frame cf;
    struct upd_take *next;
} upd_take;

int upd_quiet(const ps_updater *u)
{
    if (u->cfg.mode != PS_MODE_SYNC)
        return 1;
    if (ps_shard_open_rounds(u->shard))
        return 0;
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++)
        if (ps_tparts_open_rounds(tp))
            return 0;
    return 1;
}

void upd_move_name_dest(const ps_updater *u, ps_header *h)
{
    if (u->gone_code != PS_EMOVED)
        return;
    h->slot = u->gone_slot;
    snprintf(h->owner_ep, sizeof h->owner_ep, "%s", u->gone_ep ? u->gone_ep : "");
}

/* Moved-in tparts i has no table left: its counters go to away_done, it goes. */
static void away_drop(ps_updater *u, size_t i)
{
    ps_stats st;
    memset(&st, 0, sizeof st);
    ps_tparts_stats(u->away[i], &st);
    u->away_done.pushes += st.pushes;
    u->away_done.pulls += st.pulls;
    u->away_done.updates += st.updates;
    u->away_done.dup_dropped += st.dup_dropped;
    ps_tparts_destroy(u->away[i]);
    memmove(&u->away[i], &u->away[i + 1], (u->naway - i - 1) * sizeof *u->away);
    u->naway--;
}

static void away_sweep(ps_updater *u)
{
    for (size_t i = u->naway; i-- > 0;)
        if (ps_tparts_count(u->away[i]) == 0)
            away_drop(u, i);
}

static void send_move(ps_updater *u, char tag, const ps_move_frame *mf)
{
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, mf, sizeof *mf, 0);
}

/* An object taken from here and where it went (u->moved). */
struct upd_moved {
    ps_move_obj o;
    int32_t slot;
    char ep[PS_ENDPOINT_MAX];
};

/* Note where the objects of cf went (an entry per object, the last move's). */
static void note_moved(ps_updater *u, const ps_cmd_frame *cf)
{
    for (size_t k = 0; k < cf->move_nobjs; k++) {
        const ps_move_obj *o = &cf->move_objs[k];
        size_t i = 0;
        while (i < u->nmoved && memcmp(&u->moved[i].o, o, sizeof *o))
            i++;
        if (i == u->nmoved) {
            if (u->nmoved == u->cap_moved) {
                size_t cap = u->cap_moved ? 2 * u->cap_moved : 16;
                struct upd_moved *a = realloc(u->moved, cap * sizeof *a);
                if (!a) /* then the request gets "not found", and libps resends */
                    return;
                u->moved = a;
                u->cap_moved = cap;
            }
            memset(&u->moved[i], 0, sizeof u->moved[i]);
            u->moved[i].o = *o;
            u->nmoved++;
        }
        u->moved[i].slot = cf->h.slot;
        snprintf(u->moved[i].ep, sizeof u->moved[i].ep, "%s", cf->h.owner_ep);
    }
}

int upd_move_where(const ps_updater *u, const req_ctx *r, int32_t *slot, const char **ep)
{
    int part = ps_msg_is_sparse(r->type) || r->type == PS_MSG_SASSIGN ||
               (r->type == PS_MSG_CLOCK && r->home >= 0 && r->tp &&
                ps_tparts_decl(r->tp, r->key));
    for (size_t i = 0; i < u->nmoved; i++) {
        const ps_move_obj *o = &u->moved[i].o;
        int hit = part ? o->kind == PS_MOVE_PART && o->key == r->key && o->b == r->chunk &&
                             o->a == (uint64_t)r->home
                       : o->kind == PS_MOVE_CHUNK && o->key == r->key && o->a == r->chunk;
        if (!hit && r->type == PS_MSG_CLOCK) /* a table's or a chunk's: either */
            hit = o->key == r->key && ((o->kind == PS_MOVE_CHUNK && o->a == r->chunk) ||
                                       (o->kind == PS_MOVE_PART && o->b == r->chunk &&
                                        o->a == (uint64_t)r->home));
        if (hit) {
            *slot = u->moved[i].slot;
            *ep = u->moved[i].ep;
            return 1;
        }
    }
    return 0;
}

/* Remove the objects just serialized; the requests waiting on them are
 * answered PS_EMOVED naming the destination. */
static void remove_taken(ps_updater *u, const ps_cmd_frame *cf)
{
    char why[256];
    note_moved(u, cf);
    u->gone_code = PS_EMOVED;
    u->gone_slot = cf->h.slot;
    u->gone_ep = cf->h.owner_ep;
    snprintf(u->gone_why, sizeof u->gone_why, "moved to server slot %d (%.120s) while this "
             "request waited: send it there", cf->h.slot, cf->h.owner_ep);
    for (size_t k = 0; k < cf->move_nobjs; k++) {
        const ps_move_obj *o = &cf->move_objs[k];
        if (o->kind == PS_MOVE_CHUNK) {
            ps_shard_remove_chunk(u->shard, o->key, (uint32_t)o->a, why, sizeof why);
            continue;
        }
        int i = ps_move_find_tparts(&u->tparts, 1, (int)o->a, o->b);
        ps_tparts *tp = i == 0 ? u->tparts : NULL;
        if (!tp) {
            i = ps_move_find_tparts(u->away, u->naway, (int)o->a, o->b);
            tp = i >= 0 ? u->away[i] : NULL;
        }
        if (tp) /* found: ps_move_serialize did */
            ps_tparts_remove(tp, o->key, PS_EMOVED, u->gone_why, why, sizeof why);
        if (tp == u->tparts)
            u->nmslot = 0; /* its partitions moved up: their metrics slots are found again */
    }
    u->gone_code = 0;
    u->gone_ep = NULL;
    away_sweep(u);
}

static void do_take(ps_updater *u, const ps_cmd_frame *cf)
{
    int64_t t0 = ps_now_ns();
    ps_move_frame mf;
    memset(&mf, 0, sizeof mf);
    mf.token = cf->move_token;
    size_t ntps = 1 + u->naway;
    ps_tparts **tps = malloc(ntps * sizeof *tps);
    if (!tps) {
        mf.rc = PS_ENOMEM;
        snprintf(mf.why, sizeof mf.why, "out of memory taking %zu objects", cf->move_nobjs);
    } else {
        for (size_t i = 0; i < ntps; i++)
            tps[i] = upd_tp(u, i);
        mf.rc = ps_move_serialize(u->shard, tps, ntps, cf->move_objs, cf->move_nobjs,
                                  u->cfg.mode, u->cfg.num_workers, &mf.block, &mf.len, mf.why,
                                  sizeof mf.why);
        free(tps);
    }
    if (!mf.rc) {
        for (size_t k = 0; k < cf->move_nobjs; k++)
            cf->move_objs[k].kind == PS_MOVE_CHUNK ? mf.nchunks++ : mf.nparts++;
        mf.bytes = mf.len;
        remove_taken(u, cf);
        ps_info("update thread %d took %llu chunks and %llu table partitions (%.1f MB) for "
                "server slot %d (%s) in %.3f s", u->cfg.idx, (unsigned long long)mf.nchunks,
                (unsigned long long)mf.nparts, (double)mf.len / 1e6, cf->h.slot,
                cf->h.owner_ep, (double)(ps_now_ns() - t0) * 1e-9);
    } else {
        ps_error("update thread %d: taking %zu objects for server slot %d: %s", u->cfg.idx,
                 cf->move_nobjs, cf->h.slot, mf.why);
    }
    free(cf->move_objs);
    send_move(u, PS_OUT_TAKEN, &mf);
}

void upd_move_take(ps_updater *u, const ps_cmd_frame *cf)
{
    if (!u->takes && upd_quiet(u)) {
        do_take(u, cf);
        return;
    }
    /* after the ones before it, at the quiet point */
    upd_take *t = malloc(sizeof *t);
    if (!t) {
        ps_move_frame mf;
        memset(&mf, 0, sizeof mf);
        mf.token = cf->move_token;
        mf.rc = PS_ENOMEM;
        snprintf(mf.why, sizeof mf.why, "out of memory queueing a take");
        free(cf->move_objs);
        send_move(u, PS_OUT_TAKEN, &mf);
        return;
    }
    t->cf = *cf;
    t->next = NULL;
    upd_take **end = &u->takes;
    while (*end)
        end = &(*end)->next;
    *end = t;
}

void upd_move_poll(ps_updater *u)
{
    while (u->takes && upd_quiet(u)) {
        upd_take *t = u->takes;
        u->takes = t->next;
        do_take(u, &t->cf);
        free(t);
    }
}

/* ps_move_place_fn: where partition (home, part) goes on this thread. */
static ps_tparts *place(void *user, int home, uint32_t part, int nparts, int create, int *rc,
                        char *why, size_t why_len)
{
    ps_updater *u = user;
    *rc = 0;
    int T = u->cfg.nparts, want = home == u->cfg.server_rank
                                      ? (int)part
                                      : ps_server_away_owner(home, part, T);
    if (want != u->cfg.idx) {
        ps_errorf(why, why_len, "partition %u of server %d belongs to update thread %d of this "
            "server (%s), not to %d where it was sent", part, home, want,
            home == u->cfg.server_rank ? "its home" : "ps_server_away_owner", u->cfg.idx);
        *rc = PS_EDATA;
        return NULL;
    }
    if (home == u->cfg.server_rank)
        return u->tparts;
    int i = ps_move_find_tparts(u->away, u->naway, home, part);
    if (i >= 0 || !create)
        return i >= 0 ? u->away[i] : NULL;
    if (u->naway == u->cap_away) {
        size_t ncap = u->cap_away ? 2 * u->cap_away : 4;
        ps_tparts **a = realloc(u->away, ncap * sizeof *a);
        if (!a) {
            ps_errorf(why, why_len, "out of memory for partition %u of server %d", part, home);
            *rc = PS_ENOMEM;
            return NULL;
        }
        u->away = a;
        u->cap_away = ncap;
    }
    ps_tparts_config tc = *ps_tparts_cfg(u->tparts);
    tc.home = home;
    tc.part = (int)part;
    tc.nparts = nparts;
    ps_tparts *tp;
    if ((*rc = ps_tparts_create(&tc, &u->thooks, &tp)) != 0) {
        ps_errorf(why, why_len, "cannot hold partition %u of %d of server %d here: %s", part,
            nparts, home, ps_strerror(*rc));
        return NULL;
    }
    ps_tparts_copy_live(tp, u->tparts); /* the workers that came and went already */
    if (u->cfg.mblock)
        ps_tparts_set_metrics(tp, &u->cfg.mblock->apply, &u->cfg.mblock->round);
    u->away[u->naway++] = tp;
    return tp;
}

void upd_move_load(ps_updater *u, const ps_cmd_frame *cf)
{
    int64_t t0 = ps_now_ns();
    ps_move_frame mf;
    memset(&mf, 0, sizeof mf);
    mf.token = cf->move_token;
    mf.bytes = cf->move_len;
    mf.rc = ps_move_load(u->shard, cf->move_block, cf->move_len, u->cfg.num_workers,
                         ps_opt_state_arrays(ps_shard_opt_kind(u->shard)), place, u,
                         &mf.nchunks, &mf.nparts, mf.why, sizeof mf.why);
    if (mf.rc) {
        away_sweep(u); /* one made for it and left empty */
        mf.block = cf->move_block; /* the objects are in it alone: back to the I/O thread */
        mf.len = cf->move_len;
        ps_error("update thread %d: loading %zu bytes of moved objects: %s", u->cfg.idx,
                 cf->move_len, mf.why);
    } else {
        free(cf->move_block);
        /* their names for logs: the table's, as this server knows it */
        for (size_t a = 0; a < u->naway; a++) {
            ps_tpart_view v;
            const char *name;
            for (size_t i = 0; ps_tparts_view(u->away[a], i, &v); i++)
                if (!v.name[0] && (name = ps_tparts_name(u->tparts, v.key)))
                    ps_tparts_set_name(u->away[a], v.key, name);
        }
        ps_info("update thread %d loaded %llu chunks and %llu table partitions moved here "
                "(%.1f MB) in %.3f s", u->cfg.idx, (unsigned long long)mf.nchunks,
                (unsigned long long)mf.nparts, (double)cf->move_len / 1e6,
                (double)(ps_now_ns() - t0) * 1e-9);
    }
    send_move(u, PS_OUT_MOVED_IN, &mf);
}

void upd_move_stop(ps_updater *u)
{
    free(u->moved);
    u->moved = NULL;
    u->nmoved = u->cap_moved = 0;
    while (u->takes) {
        upd_take *t = u->takes;
        u->takes = t->next;
        ps_move_frame mf;
        memset(&mf, 0, sizeof mf);
        mf.token = t->cf.move_token;
        mf.rc = PS_ECLOSED;
        snprintf(mf.why, sizeof mf.why, "the server stopped before the take's quiet point");
        free(t->cf.move_objs);
        if (u->pair)
            send_move(u, PS_OUT_TAKEN, &mf);
        free(t);
    }
    for (size_t i = 0; i < u->naway; i++)
        ps_tparts_destroy(u->away[i]);
    free(u->away);
    u->away = NULL;
    u->naway = u->cap_away = 0;
}

ps_tparts *upd_req_tparts(ps_updater *u, req_ctx *r, const ps_header *h)
{
    if (!(h->flags & PS_FLAG_AWAY))
        return u->tparts;
    int i = ps_move_find_tparts(u->away, u->naway, h->home, h->chunk);
    if (i >= 0)
        return u->away[i];
    char why[256];
    snprintf(why, sizeof why, "table %llu: partition %u of server %d is not on update thread %d "
             "of this server (it was never moved here, or it moved on): ask the coordinator "
             "where it is", (unsigned long long)h->key, h->chunk, h->home, u->cfg.idx);
    upd_error(u, r, PS_ENOTFOUND, why);
    return NULL;
}

/* ---- PS_CMD_OBJECTS: what this thread holds, for a move's plan ---- */

typedef struct obj_list {
    ps_upd_obj *o;
    size_t n, cap;
    int rc;
} obj_list;

static void obj_add(obj_list *l, const ps_upd_obj *o)
{
    if (l->rc)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        ps_upd_obj *a = realloc(l->o, cap * sizeof *a);
        if (!a) {
            l->rc = PS_ENOMEM;
            return;
        }
        l->o = a;
        l->cap = cap;
    }
    l->o[l->n++] = *o;
}

/* A chunk's bytes: its weights and optimizer state (what a move carries). */
static void chunk_obj(void *arg, const ps_shard_chunk_view *v)
{
    ps_upd_obj o = {PS_MOVE_CHUNK, 0, v->key, v->chunk, 0,
                    (uint64_t)v->n * sizeof(float) * (uint64_t)(1 + v->nstate), -1};
    obj_add(arg, &o);
}

void upd_move_objects(ps_updater *u)
{
    obj_list l = {0};
    ps_shard_foreach(u->shard, chunk_obj, &l);
    ps_tparts *tp;
    for (size_t i = 0; (tp = upd_tp(u, i)); i++) {
        const ps_tparts_config *tc = ps_tparts_cfg(tp);
        /* an added server's own partitions: it is the home of no row (the
         * tables its workers declared here are empty), nothing to move */
        if (tc->home >= u->cfg.num_servers)
            continue;
        ps_tpart_view v;
        for (size_t k = 0; ps_tparts_view(tp, k, &v); k++) {
            ps_table_counts c;
            memset(&c, 0, sizeof c);
            ps_tparts_table_counts(tp, v.key, &c);
            /* the rows' charge (values, state, id) stands for their bytes */
            ps_upd_obj o = {PS_MOVE_PART, (uint32_t)tc->nparts, v.key, (uint32_t)tc->home,
                            v.part, c.bytes, (int32_t)tc->home};
            obj_add(&l, &o);
        }
    }
    ps_objects_frame of = {.rc = l.rc, .objs = l.rc ? NULL : l.o, .n = l.rc ? 0 : l.n};
    if (l.rc)
        free(l.o);
    char tag = PS_OUT_OBJECTS;
    zmq_send(u->pair, &tag, 1, ZMQ_SNDMORE);
    zmq_send(u->pair, &of, sizeof of, 0);
}
