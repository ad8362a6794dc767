#include "barrier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_log.h"

typedef struct bwait {
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
} bwait;

typedef struct barrier {
    int64_t id;
    uint8_t *arrived; /* per rank */
    bwait *w;
    size_t nw, capw;
} barrier;

struct ps_barriers {
    int num_workers;
    ps_reply_to to;
    barrier open[PS_BARRIERS_MAX];
    int nopen;
    int64_t done[PS_BARRIERS_DONE];
    int ndone, done_next;
    uint8_t *dropped; /* per rank: out of the live set */
    int ndropped;
    struct {
        int code; /* 0: not refused */
        char why[PS_ERR_TEXT_MAX + 1];
    } *refused; /* per rank: its last hello was refused, and why */
};

int ps_barriers_create(int num_workers, ps_reply_to to, ps_barriers **out)
{
    *out = NULL;
    ps_barriers *b = calloc(1, sizeof *b);
    if (!b)
        return PS_ENOMEM;
    b->dropped = calloc((size_t)num_workers, 1);
    b->refused = calloc((size_t)num_workers, sizeof *b->refused);
    if (!b->dropped || !b->refused) {
        free(b->dropped);
        free(b->refused);
        free(b);
        return PS_ENOMEM;
    }
    b->num_workers = num_workers;
    b->to = to;
    *out = b;
    return 0;
}

static void barrier_free(barrier *b)
{
    for (size_t i = 0; i < b->nw; i++)
        zmq_msg_close(&b->w[i].id);
    free(b->w);
    free(b->arrived);
    memset(b, 0, sizeof *b);
}

void ps_barriers_destroy(ps_barriers *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->nopen; i++)
        barrier_free(&b->open[i]);
    free(b->dropped);
    free(b->refused);
    free(b);
}

static void answer(ps_barriers *b, zmq_msg_t *id, uint64_t seq, int32_t rank, int64_t bid)
{
    ps_header r;
    ps_reply_header(&r, PS_MSG_BARRIER, seq, rank, 0, 0);
    r.barrier_id = bid;
    b->to.send(b->to.user, id, &r);
}

/* Answer barrier i when every live worker has arrived; 1 when it did (the
 * barrier is then gone and its slot holds another). */
static int barrier_try(ps_barriers *bs, int i)
{
    barrier *b = &bs->open[i];
    int W = bs->num_workers, arrived = 0;
    for (int r = 0; r < W; r++)
        arrived += b->arrived[r] && !bs->dropped[r];
    if (arrived < W - bs->ndropped)
        return 0;
    ps_debug("barrier %lld: all %d live workers arrived", (long long)b->id, W - bs->ndropped);
    for (size_t k = 0; k < b->nw; k++)
        answer(bs, &b->w[k].id, b->w[k].seq, b->w[k].rank, b->id);
    /* remembered, so a worker's resend of it is answered, not a new barrier */
    bs->done[bs->done_next] = b->id;
    bs->done_next = (bs->done_next + 1) % PS_BARRIERS_DONE;
    if (bs->ndone < PS_BARRIERS_DONE)
        bs->ndone++;
    barrier_free(b);
    *b = bs->open[--bs->nopen];
    memset(&bs->open[bs->nopen], 0, sizeof(barrier));
    return 1;
}

/* Barrier i waits for a rank refused at hello: answer its waiters with the
 * refusal and drop it; 1 when it did. */
static int barrier_fail_refused(ps_barriers *bs, int i)
{
    barrier *b = &bs->open[i];
    int r = 0;
    while (r < bs->num_workers && (b->arrived[r] || bs->dropped[r] || !bs->refused[r].code))
        r++;
    if (r == bs->num_workers)
        return 0;
    char text[2 * PS_ERR_TEXT_MAX]; /* the reply keeps what fits */
    snprintf(text, sizeof text, "worker %d was refused at hello, so a barrier waiting for it "
             "fails: %s", r, bs->refused[r].why);
    ps_warn("barrier %lld: %zu waiting requests fail: %s", (long long)b->id, b->nw, text);
    for (size_t k = 0; k < b->nw; k++) {
        ps_header e;
        ps_reply_error(&e, b->w[k].seq, b->w[k].rank, 0, 0, bs->refused[r].code, text);
        bs->to.send(bs->to.user, &b->w[k].id, &e);
    }
    barrier_free(b);
    *b = bs->open[--bs->nopen];
    memset(&bs->open[bs->nopen], 0, sizeof(barrier));
    return 1;
}

void ps_barriers_refused(ps_barriers *bs, int rank, int code, const char *why)
{
    if (rank < 0 || rank >= bs->num_workers || !code)
        return;
    bs->refused[rank].code = code;
    snprintf(bs->refused[rank].why, sizeof bs->refused[rank].why, "%s", why);
    for (int i = 0; i < bs->nopen;)
        if (!barrier_fail_refused(bs, i))
            i++;
}

void ps_barriers_accepted(ps_barriers *bs, int rank)
{
    if (rank >= 0 && rank < bs->num_workers)
        bs->refused[rank].code = 0;
}

int ps_barriers_arrive(ps_barriers *bs, zmq_msg_t *id, const ps_header *h, const char **why)
{
    for (int i = 0; i < bs->ndone; i++)
        if (bs->done[i] == h->barrier_id) {
            answer(bs, id, h->seq, h->rank, h->barrier_id);
            return 0;
        }
    barrier *b = NULL;
    int bi = -1;
    for (int i = 0; i < bs->nopen; i++)
        if (bs->open[i].id == h->barrier_id) {
            b = &bs->open[i];
            bi = i;
        }
    if (!b) {
        if (bs->nopen == PS_BARRIERS_MAX) {
            *why = "too many barriers open at once";
            return PS_ETOOBIG;
        }
        bi = bs->nopen;
        b = &bs->open[bi];
        memset(b, 0, sizeof *b);
        b->id = h->barrier_id;
        b->arrived = calloc((size_t)bs->num_workers, 1);
        if (!b->arrived) {
            *why = "out of memory opening a barrier";
            return PS_ENOMEM;
        }
        bs->nopen++;
    }
    for (size_t k = 0; k < b->nw; k++)
        if (b->w[k].rank == h->rank && b->w[k].seq == h->seq) {
            /* a resend: answer it once, on the newest route */
            zmq_msg_close(&b->w[k].id);
            zmq_msg_init(&b->w[k].id);
            zmq_msg_move(&b->w[k].id, id);
            return 0;
        }
    size_t limit = 4 * (size_t)bs->num_workers + 16;
    if (b->nw >= limit) {
        *why = "too many requests wait on this barrier";
        return PS_ETOOBIG;
    }
    if (b->nw == b->capw) {
        size_t ncap = b->capw ? 2 * b->capw : 8;
        bwait *w = realloc(b->w, ncap * sizeof *w);
        if (!w) {
            *why = "out of memory waiting on a barrier";
            return PS_ENOMEM;
        }
        b->w = w;
        b->capw = ncap;
    }
    bwait *w = &b->w[b->nw++];
    zmq_msg_init(&w->id);
    zmq_msg_move(&w->id, id);
    w->seq = h->seq;
    w->rank = h->rank;
    b->arrived[h->rank] = 1;
    if (!barrier_try(bs, bi))
        barrier_fail_refused(bs, bi);
    return 0;
}

void ps_barriers_set_live(ps_barriers *bs, int rank, int live)
{
    if (bs->dropped[rank] == !live)
        return;
    bs->dropped[rank] = (uint8_t)!live;
    bs->ndropped += live ? -1 : 1;
    if (live)
        return;
    for (int i = 0; i < bs->nopen;)
        if (!barrier_try(bs, i))
            i++;
}

void ps_barriers_close(ps_barriers *bs)
{
    for (int i = 0; i < bs->nopen; i++) {
        barrier *b = &bs->open[i];
        for (size_t j = 0; j < b->nw; j++) {
            ps_header r;
            ps_reply_error(&r, b->w[j].seq, b->w[j].rank, 0, 0, PS_ECLOSED,
                           "the server is shutting down; the barrier was not complete");
            bs->to.send(bs->to.user, &b->w[j].id, &r);
        }
        barrier_free(b);
    }
    bs->nopen = 0;
}

void ps_barriers_info(const ps_barriers *bs, ps_barrier_info *out)
{
    memset(out, 0, sizeof *out);
    out->id = -1;
    const barrier *b = NULL;
    for (int i = 0; i < bs->nopen; i++)
        if (!b || bs->open[i].id < b->id)
            b = &bs->open[i];
    if (!b)
        return;
    out->id = b->id;
    for (int r = 0; r < bs->num_workers; r++) {
        if (b->arrived[r] || bs->dropped[r])
            continue;
        if (out->nranks < PS_BARRIER_RANKS_MAX)
            out->ranks[out->nranks++] = r;
        out->missing++;
    }
}
