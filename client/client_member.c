/* libps: joining an elastic job (docs/OPERATIONS.md "Elastic jobs").
 *
 * A worker that starts in a job already training says hello as any other
 * (ps_client_start: its hello makes it a member, and each chunk and table
 * partition then counts it from its open round, or the next where the
 * rank-order sum had passed it, so none can pass that round without it).
 * ps_client_join then asks every chunk and partition for its clock and
 * tells every server that its gradients count from step J on: async, the
 * largest clock (this rank's pushes there); sync, the largest open round
 * plus one, which no chunk can have passed (a chunk counts the rank from
 * its open round or the next, and holds that round for it).  The rounds
 * before J complete without it, on every chunk alike, so a sync run depends
 * only on the rounds each worker took part in.  The worker then pulls the
 * weights of version J and starts there. */
#include <stdlib.h>
#include <string.h>

#include "client_comm.h"
#include "client_internal.h"
#include "client_requests.h"
#include "ps_client.h"
#include "ps_error.h"

/* Post CLOCK for tensor t (table 0) or table t (1); the largest answer of any
 * chunk or partition goes to *max (written by the comm thread). */
static int post_clock(ps_client *c, size_t t, int table, int64_t *max, ps_request *req)
{
    int parts = 0;
    if (table)
        for (int s = 0; s < c->nservers; s++)
            parts += (int)c->server_parts[s];
    else
        parts = (int)c->place.tensor_chunks[t];
    psc_req_reset(c, req, parts);
    psc_op o = {.type = PS_MSG_CLOCK, .server = -1, .tensor = (uint32_t)t, .req = req,
                .npush = 1, .planes = 1, .table = table, .out = max};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(req, rc, ps_strerror(rc));
    return rc;
}

int ps_client_members(ps_client *c, int *index, int *count, int64_t *version)
{
    if (!c || !index || !count)
        return PS_EINVAL;
    if (!c->started) {
        snprintf(c->last_error, sizeof c->last_error, "members before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    psc_members_out out = {0, -1, 0};
    ps_request r;
    psc_req_reset(c, &r, 1);
    psc_op o = {.type = PS_MSG_MEMBERS, .server = 0, .req = &r, .out = &out};
    int rc = psc_post(c, &o);
    if (rc)
        psc_req_fail(&r, rc, ps_strerror(rc));
    if ((rc = ps_request_wait(&r)) != 0) {
        snprintf(c->last_error, sizeof c->last_error, "members: %s", r.err);
        return rc;
    }
    if (out.count < 0) {
        snprintf(c->last_error, sizeof c->last_error, "members: a count out of range");
        return PS_EPROTO;
    }
    *index = out.index;
    *count = out.count;
    if (version)
        *version = out.version;
    return 0;
}

int ps_client_join(ps_client *c, int64_t *step)
{
    if (!c || !step)
        return PS_EINVAL;
    if (!c->started) {
        snprintf(c->last_error, sizeof c->last_error, "join before start");
        return PS_ESTATE;
    }
    c->last_error[0] = 0;
    size_t n = c->place.num_tensors + c->ntables;
    ps_request *reqs = calloc(n ? n : 1, sizeof *reqs);
    if (!reqs)
        return PS_ENOMEM;
    int64_t max = 0;
    int rc = 0;
    size_t posted = 0;
    for (; posted < n && !rc; posted++) {
        int table = posted >= c->place.num_tensors;
        rc = post_clock(c, table ? posted - c->place.num_tensors : posted, table, &max,
                        &reqs[posted]);
    }
    if (rc)
        posted--;
    for (size_t k = 0; k < posted; k++) {
        int st = ps_request_wait(&reqs[k]);
        if (st && !rc) {
            rc = st;
            snprintf(c->last_error, sizeof c->last_error, "join: clock: %s", reqs[k].err);
        }
    }
    free(reqs);
    if (rc)
        return rc;
    if (c->opt.mode == PS_MODE_SYNC && (c->place.num_tensors || c->ntables))
        max++; /* past every chunk's open round: none holds a round J for us */
    /* every server, in turn: the step its chunks count this rank from */
    for (int s = 0; s < c->nservers && !rc; s++) {
        ps_request r;
        psc_req_reset(c, &r, 1);
        psc_op o = {.type = PS_MSG_JOIN, .server = s, .step = max, .req = &r};
        if ((rc = psc_post(c, &o)) != 0)
            psc_req_fail(&r, rc, ps_strerror(rc));
        int st = ps_request_wait(&r);
        if (st && !rc)
            rc = st;
        if (rc)
            snprintf(c->last_error, sizeof c->last_error, "join: server %d: %s", s, r.err);
    }
    if (!rc)
        *step = max;
    return rc;
}
