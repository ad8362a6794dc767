#include "stats_req.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

typedef struct stats_req {
    uint64_t token;
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
    int remaining;
    int have_versions;
    ps_stats acc;
} stats_req;

struct ps_stats_reqs {
    int owners;
    ps_reply_to to;
    uint64_t next_token;
    stats_req req[PS_STATS_REQS_MAX];
    int n;
};

int ps_stats_reqs_create(int owners, ps_reply_to to, ps_stats_reqs **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return PS_ENOMEM;
    (*out)->owners = owners;
    (*out)->to = to;
    return 0;
}

void ps_stats_reqs_destroy(ps_stats_reqs *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n; i++)
        zmq_msg_close(&q->req[i].id);
    free(q);
}

int ps_stats_reqs_begin(ps_stats_reqs *q, zmq_msg_t *id, const ps_header *h, uint64_t *token,
                        const char **why)
{
    if (q->n == PS_STATS_REQS_MAX) {
        *why = "too many stats requests in flight";
        return PS_ETOOBIG;
    }
    stats_req *r = &q->req[q->n++];
    memset(r, 0, sizeof *r);
    r->token = ++q->next_token;
    zmq_msg_init(&r->id);
    zmq_msg_move(&r->id, id);
    r->seq = h->seq;
    r->rank = h->rank;
    r->remaining = q->owners;
    *token = r->token;
    return 0;
}

void ps_stats_reqs_part(ps_stats_reqs *q, const ps_stats_frame *of, const ps_stats *io,
                        const ps_barriers *bars)
{
    for (int i = 0; i < q->n; i++) {
        stats_req *r = &q->req[i];
        if (r->token != of->token)
            continue;
        ps_stats_add(&r->acc, &r->have_versions, &of->st);
        if (--r->remaining > 0)
            return;
        ps_header h;
        ps_reply_header(&h, PS_MSG_STATS, r->seq, r->rank, 0, 0);
        h.stats = r->acc;
        ps_stats_add(&h.stats, &r->have_versions, io);
        ps_barriers_info(bars, &h.barrier);
        q->to.send(q->to.user, &r->id, &h);
        zmq_msg_close(&r->id);
        *r = q->req[--q->n];
        return;
    }
}

void ps_stats_reqs_close(ps_stats_reqs *q)
{
    for (int i = 0; i < q->n; i++) {
        ps_header h;
        ps_reply_error(&h, q->req[i].seq, q->req[i].rank, 0, 0, PS_ECLOSED,
                       "the server is shutting down");
        q->to.send(q->to.user, &q->req[i].id, &h);
        zmq_msg_close(&q->req[i].id);
    }
    q->n = 0;
}
