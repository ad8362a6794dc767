/* Server 0's side of servers added and removed (move.h has the picture):
 * the map of the job's slots and moved objects, and one change at a time,
 * step by step, each step's requests to the servers through the links and
 * their replies back here (move_coord_reply). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "move_internal.h"
#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reply.h"
#include "server_internal.h"

enum { OP_ADD = 1, OP_REMOVE = 2, OP_MAP = 3 };
enum { ST_HELLO = 1, ST_CLAIM, ST_INV, ST_EXPECT, ST_GIVE, ST_CANCEL, ST_LEFT };

typedef struct move_coord {
    ps_smap map;
    int have_map;
    int *threads;         /* per slot: its update threads (0: not known) */
    /* the change in progress */
    int active, op, step, waiting;
    zmq_msg_t id;
    ps_header req;
    int slot;             /* added or removed */
    char ep[PS_ENDPOINT_MAX];
    ps_smap_obj *inv;
    size_t ninv, capinv;
    ps_smap_plan plan;
    ps_smap_move *done;   /* the moves the sources report done */
    size_t ndone;
    int rc;
    char why[512];
    int64_t t0, t_moves;
} move_coord;

uint64_t move_coord_epoch(const ps_move *m)
{
    return m->coord && m->coord->have_map ? m->coord->map.epoch : 0;
}

int move_coord_owner(ps_move *m, const mv_obj *o, int self)
{
    move_coord *c = m->coord;
    if (!c || !c->have_map || !c->map.nover)
        return MOVE_NONE;
    ps_smap_id id = {o->kind, o->key, o->a, o->b};
    int owner = ps_smap_owner(&c->map, &id, -1); /* -1: not moved */
    if (owner < 0 || owner == self || owner >= c->map.nslots)
        return MOVE_NONE;
    if (move_slot_set(m, owner, c->map.slots[owner].endpoint))
        return MOVE_NONE;
    return owner;
}

static void op_clear(move_coord *c)
{
    if (c->active)
        zmq_msg_close(&c->id);
    free(c->inv);
    free(c->done);
    ps_smap_plan_free(&c->plan);
    c->inv = NULL;
    c->done = NULL;
    c->ninv = c->capinv = c->ndone = 0;
    c->active = 0;
    c->waiting = 0;
    c->rc = 0;
    c->why[0] = 0;
}

void move_coord_free(ps_move *m)
{
    move_coord *c = m->coord;
    if (!c)
        return;
    op_clear(c);
    if (c->have_map)
        ps_smap_free(&c->map);
    free(c->threads);
    free(c);
    m->coord = NULL;
}

static int threads_of(const move_coord *c, int slot)
{
    return slot >= 0 && slot < c->map.nslots ? c->threads[slot] : 0;
}

static int set_threads(move_coord *c, int slot, int t)
{
    if (slot >= PS_SMAP_MAX_SLOTS)
        return PS_EINVAL;
    c->threads[slot] = t;
    return 0;
}

/* The map of the job's first servers, from the list the admin's tool has
 * (the workers' --servers): at the first change only. */
static int map_init(ps_server *s, move_coord *c, const char *list, size_t len, char *why,
                    size_t why_len)
{
    if (c->have_map)
        return 0;
    int S = s->cfg.num_servers;
    char *copy = malloc(len + 1), **eps = calloc((size_t)S, sizeof *eps);
    if (!copy || !eps) {
        free(copy);
        free(eps);
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    memcpy(copy, list, len);
    copy[len] = 0;
    int n = 0, rc = 0;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == S) {
            n++;
            break;
        }
        eps[n++] = t;
    }
    if (n != S) {
        ps_errorf(why, why_len, "the request lists %d%s server endpoints; this job started "
                  "with --num-servers %d: give the workers' --servers list", n,
                  n > S ? " or more" : "", S);
        rc = PS_EINVAL;
    }
    if (!rc)
        rc = ps_smap_init(&c->map, (const char *const *)eps, S, why, why_len);
    free(eps);
    free(copy);
    if (rc)
        return rc;
    c->have_map = 1;
    for (int i = 0; i < S; i++)
        c->threads[i] = i == s->cfg.rank ? s->cfg.threads : 0;
    ps_info("server map: %d servers at start (%s, ...)", S, c->map.slots[0].endpoint);
    return 0;
}

/* ---------- answering the admin ---------- */

static void op_done(ps_server *s, move_coord *c)
{
    ps_move *m = s->move;
    char line[768];
    double sec = (double)(ps_now_ns() - c->t0) * 1e-9;
    if (c->rc) {
        ps_error("servers: %s slot %d (%s) failed after %.2f s: %s",
                 c->op == OP_ADD ? "adding" : "removing", c->slot, c->ep, sec, c->why);
        srv_refuse(s, &c->id, &c->req, c->rc, c->why);
        op_clear(c);
        return;
    }
    ps_header r;
    ps_reply_header(&r, PS_MSG_SERVERS, c->req.seq, -1, 0, c->req.chunk);
    r.slot = c->slot;
    zmq_msg_t pl;
    if (c->op == OP_MAP) {
        size_t n = ps_smap_encoded_bytes(&c->map);
        zmq_msg_init_size(&pl, n);
        ps_smap_encode(&c->map, zmq_msg_data(&pl));
    } else {
        uint64_t bytes = 0;
        for (size_t i = 0; i < c->ndone; i++)
            bytes += c->done[i].bytes;
        double mv = c->t_moves ? (double)(ps_now_ns() - c->t_moves) * 1e-9 : 0;
        snprintf(line, sizeof line, "%s slot %d (%s): %zu objects, %.1f MB moved in %.3f s "
                 "(%.0f MB/s), %.3f s in all; map epoch %" PRIu64,
                 c->op == OP_ADD ? "added" : "removed", c->slot, c->ep, c->ndone,
                 (double)bytes / 1e6, mv, mv > 0 ? (double)bytes / 1e6 / mv : 0.0, sec,
                 c->map.epoch);
        ps_info("servers: %s", line);
        char desc[1024];
        ps_smap_describe(&c->map, desc, sizeof desc);
        ps_info("server map %s", desc);
        size_t n = strlen(line);
        zmq_msg_init_size(&pl, n);
        memcpy(zmq_msg_data(&pl), line, n);
    }
    r.count = zmq_msg_size(&pl);
    srv_send_payload(s, &c->id, &r, &pl);
    (void)m;
    op_clear(c);
}

static void fail(move_coord *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(move_coord *c, int rc, const char *fmt, ...)
{
    if (c->rc)
        return;
    c->rc = rc ? rc : PS_EIO;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

/* ---------- the steps ---------- */

static void ask(ps_move *m, int slot, ps_header *h, const void *pl, size_t len)
{
    move_coord *c = m->coord;
    char why[256];
    zmq_msg_t f;
    /* a type that carries bytes carries its frame, empty or not */
    int with = pl != NULL || ps_msg_request_layout(h->type) == PS_PL_BYTES;
    if (with) {
        zmq_msg_init_size(&f, pl ? len : 0);
        if (pl && len)
            memcpy(zmq_msg_data(&f), pl, len);
        h->count = pl ? len : 0;
    }
    const char *ep = slot == c->slot && c->op == OP_ADD ? c->ep : c->map.slots[slot].endpoint;
    /* a server that does not answer a question in PS_MOVE_ASK_MS is not
     * there; a move may take longer */
    int ms = h->type == PS_MSG_MOVEPLAN && h->chunk == MOVE_PLAN_GIVE ? PS_MOVE_TIMEOUT_MS
                                                                      : PS_MOVE_ASK_MS;
    int rc = ps_links_ask(m->links, ep, slot, h, with ? &f : NULL, ms,
                          MOVE_TAG_COORD | (uint64_t)slot, why, sizeof why);
    if (with)
        zmq_msg_close(&f);
    if (rc)
        fail(c, rc, "slot %d (%s): %s", slot, ep, why);
    else
        c->waiting++;
}

static void step(ps_server *s);

static void start_inventory(ps_server *s, move_coord *c)
{
    c->step = ST_INV;
    for (int i = 0; i < c->map.nslots; i++) {
        if (c->map.slots[i].state != PS_SMAP_LIVE || (c->op == OP_ADD && i == c->slot))
            continue;
        ps_header h;
        ps_header_init(&h, PS_MSG_OBJECTS);
        ask(s->move, i, &h, NULL, 0);
    }
}

/* The objects of the plan going to (to >= 0) or coming from (from >= 0)
 * a slot, in wire form with `slot` = their source. */
static void *plan_list(const move_coord *c, int to, int from, size_t prefix, size_t *len,
                       size_t *count)
{
    size_t n = 0;
    for (size_t i = 0; i < c->plan.n; i++)
        n += (to < 0 || c->plan.moves[i].to == to) && (from < 0 || c->plan.moves[i].from == from);
    unsigned char *b = calloc(1, prefix + n * MOVE_OBJ_BYTES + 1);
    if (!b)
        return NULL;
    mv_obj o;
    size_t k = 0;
    for (size_t i = 0; i < c->plan.n; i++) {
        const ps_smap_move *mv = &c->plan.moves[i];
        if ((to >= 0 && mv->to != to) || (from >= 0 && mv->from != from))
            continue;
        o = (mv_obj){mv->id.kind, mv->id.key, mv->id.a, mv->id.b, mv->from, mv->home};
        move_objs_write(b + prefix + k++ * MOVE_OBJ_BYTES, &o, 1);
    }
    *len = prefix + n * MOVE_OBJ_BYTES;
    *count = n;
    return b;
}

/* The destinations of the plan, each once. */
static int plan_slots(const move_coord *c, int dest, int *out)
{
    int n = 0;
    for (size_t i = 0; i < c->plan.n; i++) {
        int x = dest ? c->plan.moves[i].to : c->plan.moves[i].from, seen = 0;
        for (int k = 0; k < n; k++)
            seen |= out[k] == x;
        if (!seen)
            out[n++] = x;
    }
    return n;
}

static void start_expect(ps_server *s, move_coord *c)
{
    c->step = ST_EXPECT;
    int d[PS_SMAP_MAX_SLOTS];
    int nd = plan_slots(c, 1, d);
    for (int k = 0; k < nd; k++) {
        size_t len, n;
        void *b = plan_list(c, d[k], -1, 0, &len, &n);
        if (!b) {
            fail(c, PS_ENOMEM, "out of memory");
            return;
        }
        ps_header h;
        ps_header_init(&h, PS_MSG_MOVEPLAN);
        h.chunk = MOVE_PLAN_EXPECT;
        h.slot = d[k];
        snprintf(h.owner_ep, sizeof h.owner_ep, "%s",
                 d[k] == c->slot && c->op == OP_ADD ? c->ep : c->map.slots[d[k]].endpoint);
        ask(s->move, d[k], &h, b, len);
        free(b);
    }
}

static void start_give(ps_server *s, move_coord *c)
{
    c->step = ST_GIVE;
    c->t_moves = ps_now_ns();
    int src[PS_SMAP_MAX_SLOTS], dst[PS_SMAP_MAX_SLOTS];
    int ns = plan_slots(c, 0, src), nd = plan_slots(c, 1, dst);
    for (int a = 0; a < ns; a++)
        for (int b = 0; b < nd; b++) {
            size_t len, n;
            void *buf = plan_list(c, dst[b], src[a], 8, &len, &n);
            if (!buf) {
                fail(c, PS_ENOMEM, "out of memory");
                return;
            }
            if (n) {
                uint32_t t = (uint32_t)threads_of(c, dst[b]);
                memcpy(buf, &t, 4);
                ps_header h;
                ps_header_init(&h, PS_MSG_MOVEPLAN);
                h.chunk = MOVE_PLAN_GIVE;
                h.slot = dst[b];
                snprintf(h.owner_ep, sizeof h.owner_ep, "%s",
                         dst[b] == c->slot && c->op == OP_ADD ? c->ep
                                                              : c->map.slots[dst[b]].endpoint);
                h.key = (uint64_t)src[a]; /* which source answers (for the log) */
                ask(s->move, src[a], &h, buf, len);
            }
            free(buf);
        }
}

/* After the moves: tell the destinations what did not come. */
static void start_cancel(ps_server *s, move_coord *c)
{
    c->step = ST_CANCEL;
    int d[PS_SMAP_MAX_SLOTS];
    int nd = plan_slots(c, 1, d);
    for (int k = 0; k < nd; k++) {
        /* the plan's objects for d[k] that are not in c->done */
        size_t len, n;
        unsigned char *b = plan_list(c, d[k], -1, 0, &len, &n);
        if (!b)
            return;
        size_t keep = 0;
        for (size_t i = 0; i < n; i++) {
            mv_obj *o = NULL;
            size_t one;
            char why[64];
            if (move_objs_parse(b + i * MOVE_OBJ_BYTES, MOVE_OBJ_BYTES, 0, &o, &one, why,
                                sizeof why))
                continue;
            int moved = 0;
            for (size_t j = 0; j < c->ndone && !moved; j++)
                moved = c->done[j].id.kind == o->kind && c->done[j].id.key == o->key &&
                        c->done[j].id.a == o->a && c->done[j].id.b == o->b;
            if (!moved)
                memmove(b + keep++ * MOVE_OBJ_BYTES, b + i * MOVE_OBJ_BYTES, MOVE_OBJ_BYTES);
            free(o);
        }
        if (keep) {
            ps_header h;
            ps_header_init(&h, PS_MSG_MOVEPLAN);
            h.chunk = MOVE_PLAN_CANCEL;
            h.slot = d[k];
            ask(s->move, d[k], &h, b, keep * MOVE_OBJ_BYTES);
        }
        free(b);
    }
}

/* Every reply of the step came: the next one. */
static void step(ps_server *s)
{
    ps_move *m = s->move;
    move_coord *c = m->coord;
    char why[512];
    for (;;) {
        if (c->waiting)
            return;
        int before = c->step;
        if (c->rc && c->step == ST_EXPECT) {
            start_cancel(s, c); /* nothing moved: the destinations expect nothing more */
            continue;
        }
        if (c->rc && c->step != ST_GIVE && c->step != ST_CANCEL) {
            op_done(s, c); /* nothing moved yet: nothing to undo */
            return;
        }
        switch (c->step) {
        case ST_HELLO: { /* the added server's config was right: claim it */
            c->step = ST_CLAIM;
            ps_header h;
            ps_header_init(&h, PS_MSG_MOVEPLAN);
            h.chunk = MOVE_PLAN_CLAIM;
            h.slot = c->slot;
            snprintf(h.owner_ep, sizeof h.owner_ep, "%s", c->ep);
            ask(m, c->slot, &h, NULL, 0);
            break;
        }
        case ST_CLAIM: {
            int slot;
            int rc = ps_smap_add_slot(&c->map, c->ep, &slot, why, sizeof why);
            if (!rc && slot != c->slot) {
                rc = PS_EINVAL;
                snprintf(why, sizeof why, "the map's next slot is %d, not %d", slot, c->slot);
            }
            if (rc) {
                fail(c, rc, "%s", why);
                break;
            }
            start_inventory(s, c);
            break;
        }
        case ST_INV: {
            int rc = c->op == OP_ADD
                         ? ps_smap_plan_add(&c->map, c->inv, c->ninv, c->slot, &c->plan, why,
                                            sizeof why)
                         : ps_smap_plan_remove(&c->map, c->inv, c->ninv, c->slot, &c->plan, why,
                                               sizeof why);
            if (rc) {
                fail(c, rc, "planning: %s", why);
                break;
            }
            char desc[1024];
            ps_smap_plan_describe(&c->map, &c->plan, desc, sizeof desc);
            ps_info("servers: plan: %s", desc);
            if (!c->plan.n) {
                c->step = ST_CANCEL; /* nothing to move */
                break;
            }
            start_expect(s, c);
            break;
        }
        case ST_EXPECT:
            start_give(s, c);
            break;
        case ST_GIVE:
            start_cancel(s, c);
            break;
        case ST_CANCEL: {
            /* what moved is where the map says from now on */
            if (c->ndone) {
                int rc = ps_smap_apply(&c->map, c->done, c->ndone, why, sizeof why);
                if (rc && !c->rc)
                    fail(c, rc, "the map: %s", why);
            }
            if (!c->rc && c->ndone < c->plan.n)
                fail(c, PS_EIO, "%zu of %zu objects moved (the sources' logs say why the "
                     "others did not); they stay where they were", c->ndone, c->plan.n);
            if (c->op == OP_REMOVE && !c->rc) {
                c->step = ST_LEFT;
                ps_header h;
                ps_header_init(&h, PS_MSG_MOVEPLAN);
                h.chunk = MOVE_PLAN_LEFT;
                h.slot = c->slot;
                ask(m, c->slot, &h, NULL, 0);
                break;
            }
            op_done(s, c);
            return;
        }
        case ST_LEFT: {
            int rc = ps_smap_remove_slot(&c->map, c->slot, why, sizeof why);
            if (rc)
                fail(c, rc, "%s", why);
            op_done(s, c);
            return;
        }
        default:
            op_done(s, c);
            return;
        }
        if (c->step == before && !c->waiting) /* a step with nothing to wait for */
            continue;
    }
}

static int same_config(const ps_server *s, const ps_hello *h, char *why, size_t len)
{
    const ps_server_config *c = &s->cfg;
    if (h->mode != c->mode || h->num_workers != (uint32_t)c->num_workers ||
        h->num_servers != (uint32_t)c->num_servers || h->max_staleness != c->max_staleness ||
        h->opt.kind != c->opt.kind || h->wire_dtype != c->wire_dtype) {
        ps_errorf(why, len, "its configuration differs from this job's (mode %d/%d, workers "
                  "%u/%d, --num-servers %u/%d, staleness %d/%d, optimizer %d/%d, wire type "
                  "%u/%u): start it with the job's settings and --added", h->mode, c->mode,
                  h->num_workers, c->num_workers, h->num_servers, c->num_servers,
                  h->max_staleness, c->max_staleness, h->opt.kind, c->opt.kind, h->wire_dtype,
                  c->wire_dtype);
        return PS_EMISMATCH;
    }
    return 0;
}

/* A reply (or failure) of the step in progress, from `slot` (tag). */
void move_coord_reply(ps_move *m, uint64_t tag, const ps_header *h, zmq_msg_t *payload, int rc,
                      const char *why)
{
    move_coord *c = m->coord;
    ps_server *s = m->s;
    int slot = (int)(tag & 0xffff);
    if (!c || !c->active)
        return;
    c->waiting--;
    if (!rc && h->type == PS_MSG_ERROR) {
        rc = h->err_code ? h->err_code : PS_EIO;
        why = h->err_text;
    }
    const char *ep = slot == c->slot && c->op == OP_ADD ? c->ep
                     : slot < c->map.nslots            ? c->map.slots[slot].endpoint
                                                       : "?";
    if (rc) {
        fail(c, rc, "slot %d (%s) in step %d: %s", slot, ep, c->step, why);
    } else if (c->step == ST_HELLO) {
        char w[512];
        if ((rc = same_config(s, &h->hello, w, sizeof w)) != 0)
            fail(c, rc, "the server at %s: %s", c->ep, w);
        else if (h->hello.server_rank != c->slot)
            fail(c, PS_EINVAL, "the server at %s was started with --rank %d; the job's next "
                 "slot is %d: start it with --added --rank %d", c->ep, h->hello.server_rank,
                 c->slot, c->slot);
        else
            set_threads(c, c->slot, (int)h->hello.threads);
    } else if (c->step == ST_INV) {
        ps_move_inv *v = NULL;
        size_t n = 0;
        char w[256];
        if (!payload || move_inv_parse(zmq_msg_data(payload), zmq_msg_size(payload), &v, &n, w,
                                       sizeof w)) {
            fail(c, PS_EPROTO, "slot %d's objects: %s", slot, payload ? w : "no list");
        } else {
            if (h->total > 0 && h->total <= PS_SERVER_MAX_THREADS)
                set_threads(c, slot, (int)h->total);
            if (c->ninv + n > c->capinv) {
                size_t cap = (c->ninv + n) * 2;
                ps_smap_obj *a = realloc(c->inv, cap * sizeof *a);
                if (!a) {
                    free(v);
                    fail(c, PS_ENOMEM, "out of memory");
                    step(s);
                    return;
                }
                c->inv = a;
                c->capinv = cap;
            }
            for (size_t i = 0; i < n; i++)
                c->inv[c->ninv++] = (ps_smap_obj){{v[i].kind, v[i].key, v[i].a, v[i].b},
                                                  v[i].bytes, v[i].home, slot};
            free(v);
        }
    } else if (c->step == ST_GIVE) {
        /* the source's objects for that destination that moved, as it says */
        int src = (int)h->key, dst = h->slot;
        mv_obj *o = NULL;
        size_t n = 0;
        char w[256];
        if (payload && move_objs_parse(zmq_msg_data(payload), zmq_msg_size(payload), 0, &o, &n,
                                       w, sizeof w))
            fail(c, PS_EPROTO, "slot %d's moved objects: %s", src, w);
        for (size_t i = 0; i < c->plan.n; i++) {
            const ps_smap_move *mv = &c->plan.moves[i];
            int moved = 0;
            for (size_t k = 0; k < n && !moved; k++)
                moved = o[k].kind == mv->id.kind && o[k].key == mv->id.key &&
                        o[k].a == mv->id.a && o[k].b == mv->id.b;
            if (mv->from != src || mv->to != dst || !moved)
                continue;
            ps_smap_move *a = realloc(c->done, (c->ndone + 1) * sizeof *a);
            if (!a)
                break;
            c->done = a;
            c->done[c->ndone++] = *mv;
        }
        free(o);
    }
    step(s);
}

/* ---------- the admin's request ---------- */

void ps_move_on_servers(ps_server *s, zmq_msg_t *f, int nf, const ps_header *h)
{
    ps_move *m = s->move;
    char why[512];
    if (s->cfg.rank != 0) {
        srv_refuse(s, &f[0], h, PS_ESTATE, "servers are added and removed through server 0 "
                   "(the job's coordinator): send this to the first endpoint of --servers");
        return;
    }
    const char *no = s->repl                ? "with replicas (--replicas / --group)"
                     : s->cfg.checkpoint_dir ? "with --checkpoint-dir (the checkpoints would not "
                                               "say where moved objects went)"
                     : srv_elastic(&s->cfg)  ? "in an elastic job (--num-workers MIN:MAX)"
                     : s->curve_dir          ? "under --curve-keys"
                                             : NULL;
    if (no && h->chunk != OP_MAP) {
        ps_errorf(why, sizeof why, "servers are not added or removed %s yet: export the model "
            "(ps_export) and start a job of the new size with --import", no);
        srv_refuse(s, &f[0], h, PS_ESTATE, why);
        return;
    }
    if (!m->coord) {
        move_coord *c = calloc(1, sizeof *c);
        int *t = calloc(PS_SMAP_MAX_SLOTS, sizeof *t);
        if (!c || !t) {
            free(c);
            free(t);
            srv_refuse(s, &f[0], h, PS_ENOMEM, "out of memory");
            return;
        }
        c->threads = t;
        m->coord = c;
    }
    move_coord *c = m->coord;
    if (c->active) {
        srv_refuse(s, &f[0], h, PS_ESTATE, "another server is being added or removed; ask again "
                   "when it is done");
        return;
    }
    int rc = map_init(s, c, nf >= 3 ? zmq_msg_data(&f[2]) : "",
                      nf >= 3 ? zmq_msg_size(&f[2]) : 0, why, sizeof why);
    if (rc) {
        srv_refuse(s, &f[0], h, rc, why);
        return;
    }
    if (h->chunk == OP_ADD) {
        char zep[PS_ENDPOINT_MAX], msg[256];
        if (!h->owner_ep[0] || ps_endpoint_check(h->owner_ep, 0, zep, sizeof zep, msg,
                                                 sizeof msg)) {
            ps_errorf(why, sizeof why, "servers add needs the new server's endpoint: %s",
                      h->owner_ep[0] ? msg : "none given");
            srv_refuse(s, &f[0], h, PS_EINVAL, why);
            return;
        }
        for (int i = 0; i < c->map.nslots; i++)
            if (c->map.slots[i].state == PS_SMAP_LIVE && !strcmp(c->map.slots[i].endpoint,
                                                                 h->owner_ep)) {
                ps_errorf(why, sizeof why, "%s is slot %d of the job already", h->owner_ep, i);
                srv_refuse(s, &f[0], h, PS_EINVAL, why);
                return;
            }
        if (c->map.nslots >= PS_SMAP_MAX_SLOTS) {
            ps_errorf(why, sizeof why, "the job has had %d servers, the most it may",
                      PS_SMAP_MAX_SLOTS);
            srv_refuse(s, &f[0], h, PS_ETOOBIG, why);
            return;
        }
    } else if (h->chunk == OP_REMOVE) {
        if (h->slot <= 0 || h->slot >= c->map.nslots ||
            c->map.slots[h->slot].state != PS_SMAP_LIVE) {
            ps_errorf(why, sizeof why, "servers remove: slot %d is not a live server of the job "
                      "other than 0 (server 0 coordinates; live slots 1..%d)", h->slot,
                      c->map.nslots - 1);
            srv_refuse(s, &f[0], h, PS_EINVAL, why);
            return;
        }
    } else if (h->chunk != OP_MAP) {
        ps_errorf(why, sizeof why, "servers c = %u: 1 add, 2 remove, 3 the map", h->chunk);
        srv_refuse(s, &f[0], h, PS_EPROTO, why);
        return;
    }
    c->active = 1;
    zmq_msg_init(&c->id);
    zmq_msg_copy(&c->id, &f[0]);
    c->req = *h;
    c->op = (int)h->chunk;
    c->t0 = ps_now_ns();
    c->t_moves = 0;
    if (c->op == OP_MAP) {
        op_done(s, c);
        return;
    }
    if (c->op == OP_ADD) {
        c->slot = c->map.nslots;
        snprintf(c->ep, sizeof c->ep, "%s", h->owner_ep);
        ps_info("servers: adding %s as slot %d", c->ep, c->slot);
        c->step = ST_HELLO;
        ps_header q;
        ps_header_init(&q, PS_MSG_HELLO);
        q.hello = srv_my_hello(s);
        q.hello.server_rank = c->slot;
        q.hello.model_fp = 0;
        q.hello.tables_fp = 0;
        q.hello.threads = 0;
        ask(m, c->slot, &q, NULL, 0);
    } else {
        c->slot = h->slot;
        snprintf(c->ep, sizeof c->ep, "%s", c->map.slots[c->slot].endpoint);
        ps_info("servers: removing slot %d (%s)", c->slot, c->ep);
        start_inventory(s, c);
    }
    step(s);
}
