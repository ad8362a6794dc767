/* Objects that move between servers: the I/O thread's side of a source,
 * a destination and a removed server (move.h has the picture; the
 * coordinator's side is move_coord.c). */
#include "move.h"

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

/* ---------- a table of objects: where each is (a slot) ---------- */

static uint64_t obj_hash(const mv_obj *o)
{
    uint64_t x = o->key * 0x9e3779b97f4a7c15ull ^ ((uint64_t)o->kind << 56) ^
                 ((uint64_t)o->a << 24) ^ o->b;
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    return x ^ (x >> 32);
}

static int obj_eq(const mv_obj *x, const mv_obj *y)
{
    return x->kind == y->kind && x->key == y->key && x->a == y->a && x->b == y->b;
}

static long tab_find(const move_tab *t, const mv_obj *o)
{
    if (!t->n)
        return -1;
    for (size_t i = obj_hash(o) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (!t->e[i].used)
            return -1;
        if (obj_eq(&t->e[i].o, o))
            return (long)i;
    }
}

int move_tab_get(const move_tab *t, const mv_obj *o)
{
    long i = tab_find(t, o);
    return i < 0 ? MOVE_NONE : t->e[i].slot;
}

int move_tab_put(move_tab *t, const mv_obj *o, int slot)
{
    long i = tab_find(t, o);
    if (i >= 0) {
        t->e[i].slot = slot;
        return 0;
    }
    if ((t->n + 1) * 2 > t->cap) { /* at most half full */
        size_t cap = t->cap ? t->cap * 2 : 64;
        move_ent *e = calloc(cap, sizeof *e);
        if (!e)
            return PS_ENOMEM;
        for (size_t k = 0; k < t->cap; k++)
            if (t->e[k].used)
                for (size_t j = obj_hash(&t->e[k].o) & (cap - 1);; j = (j + 1) & (cap - 1))
                    if (!e[j].used) {
                        e[j] = t->e[k];
                        break;
                    }
        free(t->e);
        t->e = e;
        t->cap = cap;
    }
    for (size_t j = obj_hash(o) & (t->cap - 1);; j = (j + 1) & (t->cap - 1))
        if (!t->e[j].used) {
            t->e[j] = (move_ent){*o, slot, 1};
            t->n++;
            return 0;
        }
}

void move_tab_del(move_tab *t, const mv_obj *o)
{
    long i = tab_find(t, o);
    if (i < 0)
        return;
    /* backward-shift deletion keeps every probe chain whole */
    size_t hole = (size_t)i, mask = t->cap - 1;
    t->e[hole].used = 0;
    t->n--;
    for (size_t j = (hole + 1) & mask; t->e[j].used; j = (j + 1) & mask) {
        size_t home = obj_hash(&t->e[j].o) & mask;
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->e[hole] = t->e[j];
            t->e[j].used = 0;
            hole = j;
        }
    }
}

void move_tab_free(move_tab *t)
{
    free(t->e);
    memset(t, 0, sizeof *t);
}

/* ---------- slots' endpoints (for the PS_EMOVED replies) ---------- */

int move_slot_set(ps_move *m, int slot, const char *ep)
{
    if (slot < 0 || slot >= PS_SMAP_MAX_SLOTS || !ep || strlen(ep) >= PS_ENDPOINT_MAX)
        return PS_EINVAL;
    if (slot >= m->nslots) {
        char(*a)[PS_ENDPOINT_MAX] = realloc(m->slot_ep, (size_t)(slot + 1) * sizeof *a);
        if (!a)
            return PS_ENOMEM;
        memset(a + m->nslots, 0, (size_t)(slot + 1 - m->nslots) * sizeof *a);
        m->slot_ep = a;
        m->nslots = slot + 1;
    }
    snprintf(m->slot_ep[slot], PS_ENDPOINT_MAX, "%s", ep);
    return 0;
}

const char *move_slot_ep(const ps_move *m, int slot)
{
    return slot >= 0 && slot < m->nslots ? m->slot_ep[slot] : "";
}

/* ---------- open, close ---------- */

int ps_move_open(ps_server *s, ps_move **out)
{
    ps_move *m = calloc(1, sizeof *m);
    if (!m)
        return PS_ENOMEM;
    m->s = s;
    int rc = ps_links_open(s->ctx, s->cfg.rank, move_link_done, m, &m->links);
    if (rc) {
        free(m);
        return rc;
    }
    for (int i = 0; i < MOVE_MAX_GIVES; i++)
        m->give[i].slot_to = -1;
    *out = m;
    return 0;
}

static void give_free(give_job *g)
{
    for (int k = 0; k < g->ngroups; k++)
        free(g->grp[k].block);
    free(g->grp);
    free(g->objs);
    if (g->have_id)
        zmq_msg_close(&g->id);
    memset(g, 0, sizeof *g);
    g->slot_to = -1;
}

void ps_move_close(ps_move *m)
{
    if (!m)
        return;
    for (int i = 0; i < MOVE_MAX_GIVES; i++)
        if (m->give[i].active)
            give_free(&m->give[i]);
    for (int i = 0; i < MOVE_MAX_LOADS; i++) {
        if (m->load[i].active && m->load[i].have_id)
            zmq_msg_close(&m->load[i].id);
        free(m->load[i].objs);
    }
    if (m->inv.have_id)
        zmq_msg_close(&m->inv.id);
    free(m->inv.buf);
    move_coord_free(m);
    ps_links_close(m->links);
    move_tab_free(&m->gone);
    move_tab_free(&m->incoming);
    move_tab_free(&m->homes);
    free(m->slot_ep);
    free(m);
}

/* ---------- requests for objects that are not here ---------- */

/* The object a data request names, or 0 when it names none. */
static int object_of(const ps_server *s, const ps_header *h, mv_obj *o)
{
    memset(o, 0, sizeof *o);
    if (ps_msg_is_sparse(h->type) || h->type == PS_MSG_SASSIGN ||
        (h->type == PS_MSG_CLOCK && srv_find_table((ps_server *)s, h->key))) {
        o->kind = PS_SMAP_PART;
        o->a = (h->flags & PS_FLAG_AWAY) ? (uint32_t)h->home : (uint32_t)s->cfg.rank;
        o->b = h->chunk;
    } else if (h->type == PS_MSG_INIT || h->type == PS_MSG_PUSH || h->type == PS_MSG_PULL ||
               h->type == PS_MSG_PUSHPULL || h->type == PS_MSG_ASSIGN ||
               h->type == PS_MSG_STATE || h->type == PS_MSG_SETSTATE ||
               h->type == PS_MSG_CLOCK) {
        o->kind = PS_SMAP_CHUNK;
        o->a = h->chunk;
    } else {
        return 0;
    }
    o->key = h->key;
    return 1;
}

static void answer_moved(ps_server *s, zmq_msg_t *id, const ps_header *h, int slot,
                         const char *ep, const char *why)
{
    ps_header r;
    ps_reply_error(&r, h->seq, h->rank, h->key, h->chunk, PS_EMOVED, why);
    r.slot = slot;
    if (ep && *ep)
        snprintf(r.owner_ep, sizeof r.owner_ep, "%s", ep);
    s->move->redirects++;
    srv_send(s, id, &r);
}

int ps_move_redirect(ps_server *s, zmq_msg_t *id, const ps_header *h)
{
    ps_move *m = s->move;
    if (!m || (!m->left && !m->gone.n && !m->incoming.n && !move_coord_epoch(m)))
        return 0;
    int64_t now = ps_now_ns();
    mv_obj o;
    int obj = object_of(s, h, &o);
    if (m->left) {
        if (h->rank >= 0) /* a worker still asks: it has not heard yet */
            m->left_heard_ns = now;
        if (h->type == PS_MSG_STATS || h->type == PS_MSG_SHUTDOWN)
            return 0;
        int slot = obj ? move_tab_get(&m->gone, &o) : MOVE_NONE;
        if (slot == MOVE_NONE) {
            answer_moved(s, id, h, -1, NULL, "this server left the job (it was removed and its "
                         "objects moved to the others): ask server 0 where an object is");
            return 1;
        }
    }
    if (!obj)
        return 0;
    int slot = move_tab_get(&m->incoming, &o);
    if (slot != MOVE_NONE) {
        answer_moved(s, id, h, s->cfg.rank, m->self_ep,
                     "on its way to this server: ask again shortly");
        return 1;
    }
    slot = move_tab_get(&m->gone, &o);
    if (slot == MOVE_NONE)
        slot = move_coord_owner(m, &o, s->cfg.rank); /* server 0 knows every move */
    if (slot == MOVE_NONE)
        return 0;
    char why[PS_ENDPOINT_MAX + 64];
    snprintf(why, sizeof why, "it moved to server slot %d (%s)", slot, move_slot_ep(m, slot));
    answer_moved(s, id, h, slot, move_slot_ep(m, slot), why);
    return 1;
}

/* ---------- wire forms ---------- */

int move_objs_parse(const void *p, size_t len, size_t skip, mv_obj **out, size_t *n,
                    char *why, size_t why_len)
{
    if (len < skip || (len - skip) % MOVE_OBJ_BYTES) {
        ps_errorf(why, why_len, "an object list of %zu bytes is not %zu + %d per object", len,
                  skip, MOVE_OBJ_BYTES);
        return PS_EPROTO;
    }
    size_t k = (len - skip) / MOVE_OBJ_BYTES;
    mv_obj *o = calloc(k ? k : 1, sizeof *o);
    if (!o)
        return PS_ENOMEM;
    const unsigned char *b = (const unsigned char *)p + skip;
    for (size_t i = 0; i < k; i++, b += MOVE_OBJ_BYTES) {
        memcpy(&o[i].kind, b, 4);
        memcpy(&o[i].slot, b + 4, 4);
        memcpy(&o[i].key, b + 8, 8);
        memcpy(&o[i].a, b + 16, 4);
        memcpy(&o[i].b, b + 20, 4);
        memcpy(&o[i].home, b + 24, 4);
        int bad_home = o[i].home < 0 || o[i].home >= PS_SMAP_MAX_SLOTS ||
                       (o[i].kind == PS_SMAP_PART && (uint32_t)o[i].home != o[i].a);
        if (bad_home) {
            ps_errorf(why, why_len, "object %zu of the list has home %d", i, o[i].home);
            free(o);
            return PS_EPROTO;
        }
        if (o[i].kind != PS_SMAP_CHUNK && o[i].kind != PS_SMAP_PART) {
            ps_errorf(why, why_len, "object %zu of the list has kind %u (1 chunk, 2 table "
                      "partition)", i, o[i].kind);
            free(o);
            return PS_EPROTO;
        }
    }
    *out = o;
    *n = k;
    return 0;
}

void move_objs_write(void *p, const mv_obj *o, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += MOVE_OBJ_BYTES) {
        memset(b, 0, MOVE_OBJ_BYTES);
        memcpy(b, &o[i].kind, 4);
        memcpy(b + 4, &o[i].slot, 4);
        memcpy(b + 8, &o[i].key, 8);
        memcpy(b + 16, &o[i].a, 4);
        memcpy(b + 20, &o[i].b, 4);
        memcpy(b + 24, &o[i].home, 4);
    }
}

/* The update thread of this server (T threads) that owns object o here. */
int move_owner_thread(int rank, int T, const mv_obj *o)
{
    if (o->kind == PS_SMAP_CHUNK)
        return ps_server_owner(o->key, o->a, T);
    if ((int)o->a == rank) /* a partition at home: thread p owns it */
        return (int)(o->b % (uint32_t)T);
    return ps_server_away_owner((int)o->a, o->b, T);
}

/* ---------- OBJECTS: what this server holds ---------- */

void ps_move_on_objects(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    (void)nf;
    ps_move *m = s->move;
    if (m->inv.active) {
        srv_refuse(s, &f[0], h, PS_ESTATE, "an inventory of this server is being taken");
        return;
    }
    memset(&m->inv, 0, sizeof m->inv);
    m->inv.active = 1;
    m->inv.req = *h;
    zmq_msg_init(&m->inv.id);
    zmq_msg_copy(&m->inv.id, &f[0]);
    m->inv.have_id = 1;
    m->inv.left = s->cfg.threads;
    for (int i = 0; i < s->cfg.threads; i++) {
        ps_cmd_frame cmd = {.cmd = PS_CMD_OBJECTS};
        srv_send_cmd(s, i, &cmd, NULL, NULL);
    }
}

void ps_move_objects(ps_server *s, int i, ps_objects_frame *of)
{
    (void)i;
    ps_move *m = s->move;
    if (!m->inv.active) {
        free(of->objs);
        return;
    }
    for (size_t k = 0; k < of->n; k++) { /* where each is at home */
        ps_move_inv *v = &of->objs[k];
        mv_obj o = {v->kind, v->key, v->a, v->b, 0, 0};
        int home = v->kind == PS_SMAP_PART ? (int)v->a : move_tab_get(&m->homes, &o);
        v->home = home == MOVE_NONE ? s->cfg.rank : home;
    }
    if (of->n) {
        size_t more = of->n * MOVE_INV_BYTES;
        unsigned char *b = realloc(m->inv.buf, m->inv.len + more);
        if (!b) {
            m->inv.rc = PS_ENOMEM;
        } else {
            m->inv.buf = b;
            move_inv_write(b + m->inv.len, of->objs, of->n);
            m->inv.len += more;
        }
    }
    free(of->objs);
    if (--m->inv.left)
        return;
    if (m->inv.rc) {
        srv_refuse(s, &m->inv.id, &m->inv.req, m->inv.rc, "out of memory listing the objects");
    } else {
        ps_header r;
        ps_reply_header(&r, PS_MSG_OBJECTS, m->inv.req.seq, -1, 0, 0);
        r.count = m->inv.len;
        r.total = (uint64_t)s->cfg.threads; /* the coordinator plans moves here with it */
        zmq_msg_t pl;
        zmq_msg_init_size(&pl, m->inv.len);
        if (m->inv.len)
            memcpy(zmq_msg_data(&pl), m->inv.buf, m->inv.len);
        srv_send_payload(s, &m->inv.id, &r, &pl);
    }
    zmq_msg_close(&m->inv.id);
    free(m->inv.buf);
    memset(&m->inv, 0, sizeof m->inv);
}

void move_inv_write(void *p, const ps_move_inv *v, size_t n)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += MOVE_INV_BYTES) {
        memset(b, 0, MOVE_INV_BYTES);
        memcpy(b, &v[i].kind, 4);
        memcpy(b + 4, &v[i].nparts, 4);
        memcpy(b + 8, &v[i].key, 8);
        memcpy(b + 16, &v[i].a, 4);
        memcpy(b + 20, &v[i].b, 4);
        memcpy(b + 24, &v[i].bytes, 8);
        memcpy(b + 32, &v[i].home, 4);
    }
}

int move_inv_parse(const void *p, size_t len, ps_move_inv **out, size_t *n, char *why,
                   size_t why_len)
{
    if (len % MOVE_INV_BYTES) {
        ps_errorf(why, why_len, "an inventory of %zu bytes is not %d per object", len,
                  MOVE_INV_BYTES);
        return PS_EPROTO;
    }
    size_t k = len / MOVE_INV_BYTES;
    ps_move_inv *v = calloc(k ? k : 1, sizeof *v);
    if (!v)
        return PS_ENOMEM;
    const unsigned char *b = p;
    for (size_t i = 0; i < k; i++, b += MOVE_INV_BYTES) {
        memcpy(&v[i].kind, b, 4);
        memcpy(&v[i].nparts, b + 4, 4);
        memcpy(&v[i].key, b + 8, 8);
        memcpy(&v[i].a, b + 16, 4);
        memcpy(&v[i].b, b + 20, 4);
        memcpy(&v[i].bytes, b + 24, 8);
        memcpy(&v[i].home, b + 32, 4);
        if (v[i].kind != PS_SMAP_CHUNK && v[i].kind != PS_SMAP_PART) {
            ps_errorf(why, why_len, "inventory entry %zu has kind %u", i, v[i].kind);
            free(v);
            return PS_EPROTO;
        }
    }
    *out = v;
    *n = k;
    return 0;
}

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
        mv_obj *o;
        size_t n;
        int rc = move_objs_parse(pl, plen, 0, &o, &n, why, sizeof why);
        if (rc) {
            srv_refuse(s, &f[0], h, rc, why);
            return;
        }
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
        mv_obj *o;
        size_t n;
        int rc = move_objs_parse(pl, plen, 0, &o, &n, why, sizeof why);
        if (rc) {
            srv_refuse(s, &f[0], h, rc, why);
            return;
        }
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
    give_free(g);
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
    if (rc) {
        /* not sent: they come back here */
        for (size_t j = 0; j < gr->n; j++)
            move_tab_del(&m->gone, &gr->objs[j]);
        move_send_load(s, gr->thread, gr->block, gr->len, 0);
        gr->block = NULL;
        gr->state = 3;
        if (!g->rc) {
            g->rc = rc;
            snprintf(g->why, sizeof g->why, "%s", why);
        }
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
        for (size_t j = 0; j < gr->n; j++)
            move_tab_del(&m->gone, &gr->objs[j]);
        move_send_load(s, gr->thread, gr->block, gr->len, 0);
        gr->block = NULL;
        gr->state = 3;
        if (!g->rc) {
            g->rc = rc;
            snprintf(g->why, sizeof g->why, "slot %d: %s", g->slot_to, why);
        }
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

/* ---------- the loop ---------- */

void ps_move_poll_items(ps_move *m, zmq_pollitem_t *it, int *n)
{
    ps_links_poll_items(m->links, it, n, PS_MOVE_MAX_POLL);
}

void ps_move_dispatch(ps_server *s, const zmq_pollitem_t *it, int first, int64_t now)
{
    ps_links_dispatch(s->move->links, it, first, PS_MOVE_MAX_POLL, now);
}

long ps_move_timeout_ms(const ps_move *m, int64_t now)
{
    long t = ps_links_timeout_ms(m->links, now);
    if (m->left && (t < 0 || t > 500))
        t = 500; /* look at the quiet period again */
    return t;
}

int ps_move_left_done(const ps_move *m, int64_t now)
{
    return m && m->left &&
           (now - m->left_heard_ns >= (int64_t)PS_MOVE_LEFT_QUIET_MS * 1000000 ||
            now - m->left_ns >= (int64_t)PS_MOVE_LEFT_MAX_MS * 1000000);
}

int ps_move_happened(const ps_move *m)
{
    return m && (m->s->cfg.added || m->left || m->gone.n || m->homes.n || m->in_objects ||
                 m->out_objects || m->incoming.n || move_coord_epoch(m));
}

void ps_move_figures(const ps_move *m, uint64_t *out_objects, uint64_t *in_objects,
                     uint64_t *epoch)
{
    *out_objects = m ? m->out_objects : 0;
    *in_objects = m ? m->in_objects : 0;
    *epoch = m ? move_coord_epoch(m) : 0;
}

/* ---------- the update threads' commands ---------- */

void move_send_take(ps_server *s, int thread, const mv_obj *o, size_t n, int slot,
                    const char *ep, uint64_t token)
{
    ps_move_obj *objs = malloc((n ? n : 1) * sizeof *objs);
    ps_move_frame tf = {.token = token};
    if (!objs) {
        tf.rc = PS_ENOMEM;
        snprintf(tf.why, sizeof tf.why, "out of memory for the objects to take");
        ps_move_taken(s, thread, &tf);
        return;
    }
    for (size_t i = 0; i < n; i++)
        objs[i] = (ps_move_obj){o[i].kind == PS_SMAP_CHUNK ? PS_MOVE_CHUNK : PS_MOVE_PART,
                                o[i].kind == PS_SMAP_CHUNK ? 0 : o[i].b, o[i].key,
                                o[i].kind == PS_SMAP_CHUNK ? o[i].a : o[i].a};
    ps_cmd_frame cmd = {.cmd = PS_CMD_TAKE, .move_token = token, .move_objs = objs,
                        .move_nobjs = n};
    ps_header_init(&cmd.h, PS_MSG_MOVE);
    cmd.h.slot = slot;
    snprintf(cmd.h.owner_ep, sizeof cmd.h.owner_ep, "%s", ep);
    srv_send_cmd(s, thread, &cmd, NULL, NULL);
}

void move_send_load(ps_server *s, int thread, void *records, size_t len, uint64_t token)
{
    ps_cmd_frame cmd = {.cmd = PS_CMD_LOAD_MOVED, .move_token = token, .move_block = records,
                        .move_len = len};
    srv_send_cmd(s, thread, &cmd, NULL, NULL);
}
