#include "collective.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"
#include "reply.h"

typedef struct cwait {
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
} cwait;

typedef struct coll {
    int64_t id;
    uint32_t type;   /* PS_MSG_ALLREDUCE or PS_MSG_BROADCAST */
    uint64_t count;  /* allreduce: every contribution's; broadcast: rank 0's, once it came */
    float **part;    /* per rank: its payload (allreduce; broadcast: rank 0's only) */
    cwait *w;
    size_t nw, capw;
} coll;

struct ps_colls {
    int num_workers;
    ps_coll_to to;
    coll open[PS_COLLS_MAX];
    int nopen;
    struct {
        int64_t id;
        uint32_t type;
    } done[PS_COLLS_DONE];        /* allreduce and broadcast ids are apart */
    int ndone, done_next;
    uint8_t *out; /* per rank: out of the live set */
};

int ps_colls_create(int num_workers, ps_coll_to to, ps_colls **out)
{
    *out = NULL;
    ps_colls *c = calloc(1, sizeof *c);
    if (!c || !(c->out = calloc((size_t)num_workers, 1))) {
        free(c);
        return PS_ENOMEM;
    }
    c->num_workers = num_workers;
    c->to = to;
    *out = c;
    return 0;
}

static void coll_free(ps_colls *cs, coll *c)
{
    for (size_t i = 0; i < c->nw; i++)
        zmq_msg_close(&c->w[i].id);
    for (int r = 0; c->part && r < cs->num_workers; r++)
        free(c->part[r]);
    free(c->part);
    free(c->w);
    memset(c, 0, sizeof *c);
}

void ps_colls_destroy(ps_colls *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nopen; i++)
        coll_free(c, &c->open[i]);
    free(c->out);
    free(c);
}

static void answer_error(ps_colls *cs, cwait *w, int code, const char *why)
{
    ps_header r;
    ps_reply_error(&r, w->seq, w->rank, 0, 0, code, why);
    cs->to.send(cs->to.user, &w->id, &r, NULL);
}

/* The result of collective c into msg: allreduce, the rank-order sum of the
 * live contributions divided by their count; broadcast, rank 0's payload. */
static int result(const ps_colls *cs, const coll *c, zmq_msg_t *msg)
{
    size_t n = (size_t)c->count;
    if (zmq_msg_init_size(msg, n * sizeof(float)) != 0)
        return PS_ENOMEM;
    float *dst = zmq_msg_data(msg);
    if (c->type == PS_MSG_BROADCAST) {
        memcpy(dst, c->part[0], n * sizeof(float));
        return 0;
    }
    int k = 0;
    for (int r = 0; r < cs->num_workers; r++) {
        const float *p = c->part[r];
        if (!p || cs->out[r])
            continue;
        if (k++ == 0)
            memcpy(dst, p, n * sizeof(float));
        else
            for (size_t i = 0; i < n; i++)
                dst[i] = dst[i] + p[i];
    }
    float nk = (float)k;
    for (size_t i = 0; i < n; i++)
        dst[i] = dst[i] / nk;
    return 0;
}

/* Remove open collective i (its slot then holds another). */
static void coll_close(ps_colls *cs, int i)
{
    cs->done[cs->done_next].id = cs->open[i].id;
    cs->done[cs->done_next].type = cs->open[i].type;
    cs->done_next = (cs->done_next + 1) % PS_COLLS_DONE;
    if (cs->ndone < PS_COLLS_DONE)
        cs->ndone++;
    coll_free(cs, &cs->open[i]);
    cs->open[i] = cs->open[--cs->nopen];
    memset(&cs->open[cs->nopen], 0, sizeof(coll));
}

/* Answer collective i when every live worker has come; 1 when it did. */
static int coll_try(ps_colls *cs, int i)
{
    coll *c = &cs->open[i];
    int live = 0, came = 0;
    for (int r = 0; r < cs->num_workers; r++) {
        live += !cs->out[r];
        came += !cs->out[r] && c->part[r] != NULL;
    }
    /* a broadcast whose source left can never complete: say so to all */
    if (c->type == PS_MSG_BROADCAST && cs->out[0]) {
        for (size_t k = 0; k < c->nw; k++)
            answer_error(cs, &c->w[k], PS_ESTATE,
                         "broadcast: rank 0, its source, left or was dropped");
        coll_close(cs, i);
        return 1;
    }
    if (came < live || live == 0)
        return 0;
    zmq_msg_t res;
    int rc = result(cs, c, &res);
    ps_debug("%s %lld: all %d live workers came", ps_msg_type_name(c->type), (long long)c->id,
             live);
    for (size_t k = 0; k < c->nw; k++) {
        cwait *w = &c->w[k];
        if (rc) {
            answer_error(cs, w, rc, "out of memory for the collective's result");
            continue;
        }
        ps_header r;
        ps_reply_header(&r, c->type, w->seq, w->rank, 0, 0);
        r.barrier_id = c->id;
        r.count = c->count;
        r.dtype = PS_DTYPE_F32;
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_copy(&m, &res); /* shares the buffer */
        cs->to.send(cs->to.user, &w->id, &r, &m);
        zmq_msg_close(&m);
    }
    if (!rc)
        zmq_msg_close(&res);
    coll_close(cs, i);
    return 1;
}

int ps_colls_arrive(ps_colls *cs, zmq_msg_t *id, const ps_header *h, const void *payload,
                    const char **why)
{
    for (int i = 0; i < cs->ndone; i++)
        if (cs->done[i].id == h->barrier_id && cs->done[i].type == h->type) {
            *why = "this collective id completed already: use each id once";
            return PS_ESTATE;
        }
    if (h->count * sizeof(float) > PS_COLL_MAX_BYTES) {
        *why = "a collective's payload is at most 64 MiB";
        return PS_EPROTO;
    }
    coll *c = NULL;
    int ci = -1;
    for (int i = 0; i < cs->nopen; i++)
        if (cs->open[i].id == h->barrier_id && cs->open[i].type == h->type) {
            c = &cs->open[i];
            ci = i;
        }
    int counted = h->type == PS_MSG_ALLREDUCE || h->rank == 0;
    if (c && counted && c->count && c->count != h->count) {
        *why = "the workers' payloads of this collective differ in length";
        return PS_EPROTO;
    }
    for (size_t k = 0; c && k < c->nw; k++)
        if (c->w[k].rank == h->rank) {
            if (c->w[k].seq != h->seq) {
                *why = "this worker reached this collective id already: use each id once";
                return PS_EPROTO;
            }
            /* a resend: answered once, on the newest route */
            zmq_msg_close(&c->w[k].id);
            zmq_msg_init(&c->w[k].id);
            zmq_msg_move(&c->w[k].id, id);
            return 0;
        }
    if (!c) {
        if (cs->nopen == PS_COLLS_MAX) {
            *why = "too many collectives open at once";
            return PS_ETOOBIG;
        }
        ci = cs->nopen;
        c = &cs->open[ci];
        memset(c, 0, sizeof *c);
        c->id = h->barrier_id;
        c->type = h->type;
        if (!(c->part = calloc((size_t)cs->num_workers, sizeof *c->part))) {
            *why = "out of memory opening a collective";
            return PS_ENOMEM;
        }
        cs->nopen++;
    }
    if (c->nw == c->capw) {
        size_t ncap = c->capw ? 2 * c->capw : 8;
        cwait *w = realloc(c->w, ncap * sizeof *w);
        if (!w) {
            *why = "out of memory waiting on a collective";
            return PS_ENOMEM;
        }
        c->w = w;
        c->capw = ncap;
    }
    /* what a broadcast's other ranks send is not kept: a marker that they came */
    size_t keep = counted ? (size_t)h->count : 1;
    float *p = malloc(keep * sizeof(float));
    if (!p) {
        *why = "out of memory for a collective's payload";
        return PS_ENOMEM;
    }
    if (counted) {
        memcpy(p, payload, keep * sizeof(float));
        c->count = h->count;
    }
    free(c->part[h->rank]); /* a contribution of a rank that left and came back */
    c->part[h->rank] = p;
    cwait *w = &c->w[c->nw++];
    zmq_msg_init(&w->id);
    zmq_msg_move(&w->id, id);
    w->seq = h->seq;
    w->rank = h->rank;
    coll_try(cs, ci);
    return 0;
}

void ps_colls_set_live(ps_colls *cs, int rank, int live)
{
    if (rank < 0 || rank >= cs->num_workers || cs->out[rank] == !live)
        return;
    cs->out[rank] = (uint8_t)!live;
    if (live)
        return;
    for (int i = 0; i < cs->nopen;)
        if (!coll_try(cs, i))
            i++;
}

void ps_colls_close(ps_colls *cs)
{
    for (int i = 0; i < cs->nopen; i++) {
        coll *c = &cs->open[i];
        for (size_t k = 0; k < c->nw; k++)
            answer_error(cs, &c->w[k], PS_ECLOSED,
                         "the server is shutting down; the collective was not complete");
        coll_free(cs, c);
    }
    cs->nopen = 0;
}
