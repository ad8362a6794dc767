/* libps: the tables' requests (client_sparse.h). */
#include "client_sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client_moved.h"
#include "client_shm.h"
#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_table_row.h"

/* The scratch of one split, kept between requests (comm thread). */
struct psc_sparse {
    /* unique ids: an open-addressing map id -> unique index; entries of
     * older requests are told apart by their stamp, so it is never cleared */
    size_t hcap;
    uint64_t *hkey;
    uint32_t *hval, *hstamp;
    uint32_t stamp;
    /* per unique id: its partition (a flat index over every server's) */
    uint32_t *part;
    size_t part_cap;
    /* per partition: ids in it (push, pull), and its slot */
    size_t *npush, *npull;
    uint32_t *slot_of;
    size_t nparts_cap;
    uint32_t *slots;
    size_t slots_cap;
    /* the placement (placer_init) */
    size_t *pbase;
    int8_t *pshift;
    size_t servers_cap;
    int sshift;
};

static struct psc_sparse *scratch(ps_client *c)
{
    if (!c->sparse)
        c->sparse = calloc(1, sizeof *c->sparse);
    return c->sparse;
}

void psc_sparse_free(ps_client *c)
{
    struct psc_sparse *x = c->sparse;
    if (!x)
        return;
    free(x->hkey);
    free(x->hval);
    free(x->hstamp);
    free(x->part);
    free(x->npush);
    free(x->npull);
    free(x->slot_of);
    free(x->slots);
    free(x->pbase);
    free(x->pshift);
    free(x);
    c->sparse = NULL;
}

/* Room for n unique ids in the map (at most half full) and their parts. */
static int map_reserve(struct psc_sparse *x, size_t n)
{
    if (2 * n > x->hcap) {
        size_t cap = x->hcap ? x->hcap : 1024;
        while (cap < 2 * n)
            cap *= 2;
        uint64_t *k = malloc(cap * sizeof *k);
        uint32_t *v = malloc(cap * sizeof *v), *st = calloc(cap, sizeof *st);
        if (!k || !v || !st) {
            free(k);
            free(v);
            free(st);
            return PS_ENOMEM;
        }
        free(x->hkey);
        free(x->hval);
        free(x->hstamp);
        x->hkey = k;
        x->hval = v;
        x->hstamp = st;
        x->hcap = cap;
        x->stamp = 0;
    }
    if (n > x->part_cap) {
        uint32_t *p = realloc(x->part, n * sizeof *p);
        if (!p)
            return PS_ENOMEM;
        x->part = p;
        x->part_cap = n;
    }
    if (++x->stamp == 0) { /* wrapped: every entry is old again */
        memset(x->hstamp, 0, x->hcap * sizeof *x->hstamp);
        x->stamp = 1;
    }
    return 0;
}

/* The unique index of id, added (as *nu, the next) when new: *fresh. */
static uint32_t map_put(struct psc_sparse *x, uint64_t id, uint32_t *nu, int *fresh)
{
    size_t mask = x->hcap - 1, i = (size_t)ps_table_mix(id) & mask;
    while (x->hstamp[i] == x->stamp) {
        if (x->hkey[i] == id) {
            *fresh = 0;
            return x->hval[i];
        }
        i = (i + 1) & mask;
    }
    x->hstamp[i] = x->stamp;
    x->hkey[i] = id;
    x->hval[i] = (*nu)++;
    *fresh = 1;
    return x->hval[i];
}

/* Every server's partitions, flattened: partition p of server s is
 * base(s) + p.  The total. */
static size_t total_parts(const ps_client *c)
{
    size_t n = 0;
    for (int s = 0; s < c->nservers; s++)
        n += c->server_parts[s];
    return n;
}

/* log2(n) when n is a power of two, else -1. */
static int pow2_shift(uint64_t n)
{
    return n && !(n & (n - 1)) ? __builtin_ctzll(n) : -1;
}

/* The placement of one request's rows (common/ps_table_row.h): each
 * server's first flat partition, and shifts for the server count and the
 * partition counts that are powers of two (the usual), whose divisions
 * were most of a split's time. */
static int placer_init(struct psc_sparse *x, const ps_client *c)
{
    size_t ns = (size_t)c->nservers;
    if (ns > x->servers_cap) {
        size_t *b = realloc(x->pbase, ns * sizeof *b);
        if (b)
            x->pbase = b;
        int8_t *sh = b ? realloc(x->pshift, ns * sizeof *sh) : NULL;
        if (!sh)
            return PS_ENOMEM;
        x->pshift = sh;
        x->servers_cap = ns;
    }
    size_t base = 0;
    for (size_t s = 0; s < ns; s++) {
        x->pbase[s] = base;
        x->pshift[s] = (int8_t)pow2_shift(c->server_parts[s]);
        base += c->server_parts[s];
    }
    x->sshift = pow2_shift((uint64_t)ns);
    return 0;
}

/* The flat partition of (key, id): ps_table_row_server and
 * ps_table_row_part's arithmetic. */
static size_t flat_part(const struct psc_sparse *x, const ps_client *c, uint64_t key,
                        uint64_t id)
{
    uint64_t h = ps_table_row_hash(key, id), q;
    size_t s;
    if (x->sshift >= 0) {
        s = (size_t)(h & (((uint64_t)1 << x->sshift) - 1));
        q = h >> x->sshift;
    } else {
        s = (size_t)(h % (uint64_t)c->nservers);
        q = h / (uint64_t)c->nservers;
    }
    int ps = x->pshift[s];
    return x->pbase[s] + (size_t)(ps >= 0 ? q & (((uint64_t)1 << ps) - 1)
                                          : q % c->server_parts[s]);
}

static void flat_split(const ps_client *c, size_t flat, int *server, uint32_t *part)
{
    int s = 0;
    while (flat >= c->server_parts[s])
        flat -= c->server_parts[s++];
    *server = s;
    *part = (uint32_t)flat;
}

static int grow_parts(struct psc_sparse *x, size_t np, size_t nslots)
{
    if (np > x->nparts_cap) {
        size_t *a = realloc(x->npush, np * sizeof *a);
        if (a)
            x->npush = a;
        size_t *b = a ? realloc(x->npull, np * sizeof *b) : NULL;
        if (b)
            x->npull = b;
        uint32_t *o = b ? realloc(x->slot_of, np * sizeof *o) : NULL;
        if (!o)
            return PS_ENOMEM;
        x->slot_of = o;
        x->nparts_cap = np;
    }
    if (nslots > x->slots_cap) {
        uint32_t *s = realloc(x->slots, nslots * sizeof *s);
        if (!s)
            return PS_ENOMEM;
        x->slots = s;
        x->slots_cap = nslots;
    }
    return 0;
}

/* The pull side: unique ids of ids[0..n), each one's partition, counted per
 * partition; the scatter (first/next positions) in op. */
static int dedup_pull(ps_client *c, const psc_table *t, const uint64_t *ids, size_t n,
                      psc_sparse_op *op, uint64_t **uniq, uint32_t *nu)
{
    struct psc_sparse *x = c->sparse;
    int rc = map_reserve(x, n);
    uint64_t *u = rc ? NULL : malloc((n ? n : 1) * sizeof *u);
    if (!u)
        return PS_ENOMEM;
    *nu = 0;
    /* the positions of each unique id, chained in the caller's order */
    int64_t *last = malloc((n ? n : 1) * sizeof *last);
    if (!last) {
        free(u);
        return PS_ENOMEM;
    }
    for (size_t j = 0; j < n; j++) {
        int fresh;
        uint32_t k = map_put(x, ids[j], nu, &fresh);
        op->next[j] = -1;
        if (fresh) {
            u[k] = ids[j];
            op->first[k] = (int64_t)j;
            x->part[k] = (uint32_t)flat_part(x, c, t->key, ids[j]);
            x->npull[x->part[k]]++;
        } else {
            op->next[last[k]] = (int64_t)j;
        }
        last[k] = (int64_t)j;
    }
    free(last);
    *uniq = u;
    return 0;
}

long psc_sparse_begin(ps_client *c, uint32_t type, uint32_t ti, ps_request *r,
                      const uint64_t *ids, size_t n, const float *g, const uint64_t *ids2,
                      size_t n2, float *dst, int64_t step, uint32_t npush, uint32_t **slots)
{
    const psc_table *t = &c->tables[ti];
    size_t d = t->opts.dim, np = total_parts(c);
    int push = type != PS_MSG_SPULL;
    int assign = type == PS_MSG_SASSIGN; /* rows to set: only where they go, no sums */
    /* the pull's ids and how many: a pull's are ids; a pushpull's ids2 */
    const uint64_t *pids = type == PS_MSG_SPULL ? ids : type == PS_MSG_SPUSHPULL ? ids2 : NULL;
    size_t npl = type == PS_MSG_SPULL ? n : type == PS_MSG_SPUSHPULL ? n2 : 0;
    struct psc_sparse *x = scratch(c);
    psc_sparse_op *op = NULL;
    uint64_t *pu = NULL, *su = NULL;
    float *sums = NULL;
    uint32_t npu = 0, nsu = 0, *spart = NULL;
    long nslots = 0;
    int rc = !x || grow_parts(x, np, np) || placer_init(x, c) ? PS_ENOMEM : 0;
    if (!rc) {
        memset(x->npush, 0, np * sizeof *x->npush);
        memset(x->npull, 0, np * sizeof *x->npull);
    }
    /* the pull: its scatter (shared by the slots), its unique ids */
    if (!rc && npl) {
        size_t bytes = sizeof *op + 8 * npl + 8 * npl;
        op = malloc(bytes);
        if (!op) {
            rc = PS_ENOMEM;
        } else {
            op->refs = 1; /* ours until the slots are made */
            op->dim = (uint32_t)d;
            op->dst = dst;
            op->first = (int64_t *)(op + 1);
            op->next = op->first + npl;
            rc = dedup_pull(c, t, pids, npl, op, &pu, &npu);
        }
    }
    uint32_t *ppart = NULL; /* the pull's unique ids' partitions, kept from x->part */
    if (!rc && npu) {
        ppart = malloc(npu * sizeof *ppart);
        if (ppart)
            memcpy(ppart, x->part, npu * sizeof *ppart);
        else
            rc = PS_ENOMEM;
    }
    /* the push: unique ids, their rows summed in the caller's order */
    if (!rc && push && n) {
        rc = map_reserve(x, n);
        su = rc ? NULL : malloc(n * sizeof *su);
        sums = su ? malloc(n * d * sizeof *sums) : NULL;
        spart = sums ? malloc(n * sizeof *spart) : NULL;
        if (!spart)
            rc = PS_ENOMEM;
        for (size_t j = 0; !rc && j < n; j++) {
            int fresh;
            uint32_t k = map_put(x, ids[j], &nsu, &fresh);
            const float *gj = g + j * d;
            float *sk = sums + (size_t)k * d;
            if (fresh) {
                su[k] = ids[j];
                memcpy(sk, gj, d * sizeof *sk);
                spart[k] = (uint32_t)flat_part(x, c, t->key, ids[j]);
                x->npush[spart[k]]++;
            } else if (assign) {
                psc_set_error(r, PS_EINVAL, "assign to table %llu: id %llu given twice",
                              (unsigned long long)t->key, (unsigned long long)ids[j]);
                rc = -1;
            } else {
                for (size_t e = 0; e < d; e++)
                    sk[e] = sk[e] + gj[e];
            }
        }
    }
    /* gradient rows with NaN or Inf (or beyond a float16 wire): under
     * --on-nonfinite refuse not sent, so the worker sees the step that made
     * them, as for dense pushes (client_send.c); otherwise the servers decide */
    if (!rc && nsu && !assign && c->opt.on_nonfinite == PS_NONFINITE_REFUSE) {
        size_t first = 0, bad = ps_dtype_nonfinite(c->wire_dtype, sums, (size_t)nsu * d, &first);
        if (bad) {
            float v = sums[first];
            psc_set_error(r, PS_ENONFINITE, "push of step %lld to table %llu: %zu of %zu gradient "
                          "values %s (id %llu, element %zu is %g); not sent (--on-nonfinite "
                          "refuse)", (long long)step, (unsigned long long)t->key, bad,
                          (size_t)nsu * d, isfinite(v) ? "overflow the wire type float16"
                                                       : "are not finite",
                          (unsigned long long)su[first / d], first % d, (double)v);
            rc = -1;
        }
    }
    /* every partition's share within the limits */
    for (size_t p = 0; !rc && p < np; p++)
        if (x->npush[p] > PS_MAX_SPARSE_IDS || x->npull[p] > PS_MAX_SPARSE_IDS ||
            (x->npush[p] > x->npull[p] ? x->npush[p] : x->npull[p]) * d * sizeof(float) >
                PS_MAX_PAYLOAD_BYTES) {
            psc_set_error(r, PS_ETOOBIG, "table %llu: %zu ids to push and %zu to pull in one "
                          "partition, more than one message takes (%u ids, %llu bytes of rows): "
                          "split the request", (unsigned long long)t->key, x->npush[p],
                          x->npull[p], PS_MAX_SPARSE_IDS,
                          (unsigned long long)PS_MAX_PAYLOAD_BYTES);
            rc = -1;
        }
    /* one slot per partition that gets anything (every one for a push) */
    for (size_t p = 0; !rc && p < np; p++) {
        if ((!push && !x->npull[p]) || (assign && !x->npush[p]))
            continue;
        int server;
        uint32_t part;
        flat_split(c, p, &server, &part);
        uint32_t mtype = assign ? PS_MSG_SASSIGN
                         : push ? (x->npull[p] ? PS_MSG_SPUSHPULL : PS_MSG_SPUSH)
                                : PS_MSG_SPULL;
        size_t a = x->npush[p], b = x->npull[p];
        psc_sparse_sub *sp = malloc(sizeof *sp + a * 8 + a * d * 4 + b * 8 + b * 4);
        /* the partition keeps its identity (home, part) wherever it is now */
        int to = psc_route_obj(c, PSC_OBJ_PART, ti, (uint32_t)p, server);
        uint32_t i = sp ? psc_slot_new(c, to, mtype, r) : PSC_NO_SLOT;
        if (i == PSC_NO_SLOT) {
            free(sp);
            rc = PS_ENOMEM;
            break;
        }
        sp->op = b ? op : NULL;
        if (b)
            op->refs++;
        sp->table = ti;
        sp->versioned = type != PS_MSG_SPUSHPULL || mtype == PS_MSG_SPUSHPULL;
        sp->npush = 0; /* filled below */
        sp->npull = 0;
        sp->blk_off = sp->blk_len = 0;
        sp->shm_sends = 0;
        sp->answered = 0;
        sp->push_ids = (uint64_t *)(sp + 1);
        sp->pull_ids = sp->push_ids + a;
        sp->rows = (float *)(sp->pull_ids + b);
        sp->pull_u = (uint32_t *)(sp->rows + a * d);
        psc_sub *s = &c->slots->sub[i];
        s->sp = sp;
        s->key = t->key;
        s->chunk = part;
        s->obj_kind = PSC_OBJ_PART;
        s->home = server;
        s->obj = (uint32_t)p;
        s->obj_table = ti;
        s->step = step;
        s->npush = npush;
        s->dst = dst;
        x->slot_of[p] = i; /* filled below */
        x->slots[nslots++] = i;
    }
    if (!rc) {
        /* the ids (and rows) of each partition, in the order of first appearance */
        for (uint32_t k = 0; k < nsu; k++) {
            psc_sparse_sub *sp = c->slots->sub[x->slot_of[spart[k]]].sp;
            memcpy(sp->rows + sp->npush * d, sums + (size_t)k * d, d * sizeof(float));
            sp->push_ids[sp->npush++] = su[k];
        }
        for (uint32_t k = 0; k < npu; k++) {
            psc_sparse_sub *sp = c->slots->sub[x->slot_of[ppart[k]]].sp;
            sp->pull_u[sp->npull] = k;
            sp->pull_ids[sp->npull++] = pu[k];
        }
    } else {
        /* nothing is sent: the slots go, with their parts of the scatter */
        for (long k = 0; k < nslots; k++)
            psc_slot_drop(c, x->slots[k]);
        if (rc > 0)
            psc_set_error(r, rc, "out of memory splitting a request of table %llu",
                          (unsigned long long)t->key);
    }
    if (op && --op->refs == 0)
        free(op);
    free(pu);
    free(ppart);
    free(su);
    free(sums);
    free(spart);
    if (rc)
        return -1;
    *slots = x->slots;
    return nslots;
}

int psc_sparse_frames(const ps_client *c, uint32_t i, ps_header *h, uint32_t dtype,
                      zmq_msg_t *f, int *nf)
{
    const psc_sub *s = &c->slots->sub[i];
    const psc_sparse_sub *sp = s->sp;
    size_t d = c->tables[sp->table].opts.dim;
    h->dim = (uint32_t)d;
    *nf = 0;
    if (s->type == PS_MSG_SPULL) {
        h->count = sp->npull;
        h->dtype = 0;
    } else {
        h->count = sp->npush;
        h->dtype = s->type == PS_MSG_SASSIGN ? PS_DTYPE_F32 : dtype; /* values: exact */
        dtype = h->dtype;
        h->npull = s->type == PS_MSG_SPUSHPULL ? sp->npull : 0;
        h->npush = s->npush; /* `m`: sent when > 1 */
    }
    /* frames: ids (the push's or the pull's), rows, the pull's ids */
    const uint64_t *first = s->type == PS_MSG_SPULL ? sp->pull_ids : sp->push_ids;
    size_t nfirst = s->type == PS_MSG_SPULL ? sp->npull : sp->npush;
    int want = s->type == PS_MSG_SPULL                                   ? 1
               : s->type == PS_MSG_SPUSH || s->type == PS_MSG_SASSIGN ? 2
                                                                      : 3;
    for (int k = 0; k < want; k++) {
        size_t bytes = k == 0 ? 8 * nfirst : k == 1 ? sp->npush * d * ps_dtype_size(dtype)
                                                    : 8 * sp->npull;
        if (zmq_msg_init_size(&f[k], bytes) != 0) {
            for (int j = 0; j < k; j++)
                zmq_msg_close(&f[j]);
            return PS_ENOMEM;
        }
        void *data = zmq_msg_data(&f[k]);
        if (k == 0 && bytes)
            memcpy(data, first, bytes);
        else if (k == 1)
            ps_dtype_from_f32(dtype, data, sp->rows, sp->npush * d);
        else if (bytes)
            memcpy(data, sp->pull_ids, bytes);
    }
    *nf = want;
    return 0;
}

void psc_sparse_sub_free(ps_client *c, psc_sparse_sub *sp)
{
    if (!sp)
        return;
    /* a block the server may still write (no reply came, or a resend of
     * it may yet arrive) stays taken */
    if (sp->blk_len && sp->answered && sp->shm_sends == 1)
        psc_shm_block_free(c, sp->blk_off);
    psc_sparse_op *op = sp->op;
    free(sp);
    if (op && --op->refs == 0)
        free(op);
}

void psc_sparse_moved(ps_client *c, uint32_t i)
{
    psc_sparse_sub *sp = c->slots->sub[i].sp;
    /* sent once, answered "not here": that server never touched the block */
    if (sp && sp->blk_len && sp->shm_sends == 1) {
        psc_shm_block_free(c, sp->blk_off);
        sp->blk_off = sp->blk_len = 0;
        sp->shm_sends = 0;
    }
}

/* Where the reply's rows of slot s begin in its block (ps_proto_sparse_shm_bytes). */
static uint64_t reply_at(const psc_sub *s, size_t d)
{
    const psc_sparse_sub *sp = s->sp;
    if (s->type == PS_MSG_SPULL)
        return 8 * (uint64_t)sp->npull;
    return (8 + 4 * (uint64_t)d) * sp->npush + (s->type == PS_MSG_SPUSHPULL ? 8 * sp->npull : 0);
}

int psc_sparse_shm(ps_client *c, uint32_t i, ps_header *h)
{
    psc_sub *s = &c->slots->sub[i];
    psc_sparse_sub *sp = s->sp;
    size_t d = c->tables[sp->table].opts.dim;
    int pull = s->type == PS_MSG_SPULL, pushpull = s->type == PS_MSG_SPUSHPULL;
    size_t n = pull ? sp->npull : sp->npush;
    uint64_t bytes = reply_at(s, d) + (pull || pushpull ? 4 * (uint64_t)d * sp->npull : 0);
    if (!psc_shm_on(c, s->server) || !bytes)
        return 0;
    if (!sp->blk_len) {
        if (!psc_shm_block(c, s->server, bytes, &sp->blk_off))
            return 0; /* the stage is full: over the network */
        sp->blk_len = bytes;
    }
    /* the frames' bytes one after the other, float32 */
    char *at = psc_shm_at(c, sp->blk_off, bytes);
    memcpy(at, pull ? sp->pull_ids : sp->push_ids, 8 * n);
    if (!pull) {
        memcpy(at + 8 * n, sp->rows, 4 * d * n);
        if (pushpull)
            memcpy(at + (8 + 4 * d) * n, sp->pull_ids, 8 * sp->npull);
    }
    h->dim = (uint32_t)d;
    h->count = n;
    h->dtype = PS_DTYPE_F32;
    h->npull = pushpull ? sp->npull : 0;
    if (!pull)
        h->npush = s->npush; /* `m`: sent when > 1 */
    h->flags |= PS_FLAG_SHM;
    h->shm_off = sp->blk_off;
    sp->shm_sends++;
    return 1;
}

int psc_sparse_reply(const ps_client *c, uint32_t i, const ps_header *h, const zmq_msg_t *rows,
                     char *why, size_t why_len)
{
    const psc_sub *s = &c->slots->sub[i];
    psc_sparse_sub *sp = s->sp;
    size_t d = c->tables[sp->table].opts.dim;
    const char *data = (h->flags & PS_FLAG_SHM) ? NULL : zmq_msg_data((zmq_msg_t *)rows);
    if (h->flags & PS_FLAG_SHM) {
        /* the server wrote the rows into this slot's block, after its request */
        uint64_t want = sp->blk_off + reply_at(s, d);
        if (sp->blk_len && sp->op && h->count == sp->npull && h->dim == d)
            data = psc_shm_at(c, h->shm_off, (size_t)h->count * d * sizeof(float));
        if (!data || h->shm_off != want) {
            ps_errorf(why, why_len, "%s reply says its rows are at offset %llu of the arena, "
                "not where this request wanted them", ps_msg_type_name(h->type),
                (unsigned long long)h->shm_off);
            return PS_EPROTO;
        }
    }
    sp->answered = 1;
    if (!sp->op) /* a push's acknowledgement: nothing to write */
        return 0;
    if (h->count != sp->npull || h->dim != d) {
        ps_errorf(why, why_len, "%s reply of %llu rows of dim %u, for %zu rows of dim %zu",
            ps_msg_type_name(h->type), (unsigned long long)h->count, h->dim, sp->npull, d);
        return PS_EPROTO;
    }
    size_t rb = d * ps_dtype_size(h->dtype);
    for (size_t k = 0; k < sp->npull; k++) {
        const char *row = data + k * rb;
        for (int64_t j = sp->op->first[sp->pull_u[k]]; j >= 0; j = sp->op->next[j])
            ps_dtype_to_f32(h->dtype, sp->op->dst + (size_t)j * d, row, d);
    }
    return 0;
}
