/* Objects that move between servers, the I/O thread's tables: what this
 * server gave away, expects and holds away from home, the redirects
 * (PS_EMOVED) that follow from them, a removed server's last seconds, the
 * objects' wire forms, OBJECTS and the loop (move.h has the picture;
 * move_give.c a source's and a destination's steps, move_coord.c server
 * 0's). */
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

void move_give_free(give_job *g)
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
            move_give_free(&m->give[i]);
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
