/* The exchange's embedding tables (include/ps_exchange.h,
 * ps_exchange_add_table, _num_tables, _table_*): per table, the batches of
 * ids handed a step ahead, each deduplicated into its distinct ids, whose
 * rows are pulled while the batch before computes (in sync carried by that
 * batch's push, one message), then their gradients pushed; and lookups
 * outside training.  The dense tensors, and the state both share, are
 * exchange.c's (exchange_state.h). */
#include <stdlib.h>
#include <string.h>

#include "exchange_state.h"
#include "ps_log.h"
#include "ps_table_row.h"
#include "ps_time.h"

/* ---- a table's batches (ps_exchange_table_*) ----
 * Batch b's ids live in slot b % TSLOTS (its pull reads them, then its
 * push), its rows in rows[b % 2] and its gradients in grads[b % 2]: while
 * batch b computes, batch b+1's rows land and batch b-1's push may still be
 * on the wire, reading its ids and gradients. */
#define TSLOTS 3
#define TABLE_MAX_IDS ((size_t)1 << 30)

enum { TPULL_NONE, TPULL_OWN, TPULL_CARRY, TPULL_CARRIED };

typedef struct tbatch {
    int64_t b;            /* the batch held; -1: none */
    uint64_t *ids;        /* [max_ids] its distinct ids, first seen first */
    int32_t *index;       /* [max_ids] each entry's place in ids */
    size_t nentries, nunique;
    int pull;             /* TPULL_OWN: its own SPULL (in `preq`) is in flight;
                             TPULL_CARRY: the push of the batch before will
                             carry it (sync); TPULL_CARRIED: that push's
                             SPUSHPULL is in flight */
    int landed;           /* its rows are in */
    int taken;            /* ps_exchange_table_rows gave it */
    int pushing;          /* its push (in `push`) posted, not yet seen complete */
    int carries;          /* that push is a SPUSHPULL with the next batch's pull */
    int64_t want;         /* the version its pull asks for */
    int64_t step;         /* the step of its push */
    int64_t pull_ns, push_ns; /* when they were posted (timeline) */
    int64_t version;      /* of the rows that landed */
    int rc;               /* why its rows did not land */
    ps_request preq, push;
} tbatch;

struct xtable {
    uint64_t key;
    size_t dim, max_ids;
    int tag;
    tbatch s[TSLOTS];
    float *rows[2], *grads[2];
    int64_t given;        /* batches handed to next */
    int64_t cur;          /* the current batch: the oldest handed and not pushed */
    int64_t clock;        /* the step after the last push: the version pulls ask for */
    /* the deduplication's map id -> place, entries of older batches told
     * apart by their stamp (never cleared) */
    int sorted;           /* distinct ids ascending as int64 (ps_exchange_table_sorted) */
    int64_t *skey;        /* [max_ids] scratch of the sort: the ids */
    int32_t *sperm;       /* [max_ids] their places, then each place's rank */
    size_t hcap;
    uint64_t *hkey;
    int32_t *hval;
    uint32_t *hstamp;
    uint32_t stamp;
};

static xtable *table_at(const ps_exchange *x, int t)
{
    return t >= 0 && t < x->ntb ? &x->tb[t] : NULL;
}

static void table_free(xtable *t)
{
    for (int k = 0; k < TSLOTS; k++) {
        free(t->s[k].ids);
        free(t->s[k].index);
    }
    for (int k = 0; k < 2; k++) {
        free(t->rows[k]);
        free(t->grads[k]);
    }
    free(t->hkey);
    free(t->hval);
    free(t->hstamp);
    free(t->skey);
    free(t->sperm);
}

int ps_exchange_add_table(ps_exchange *x, uint64_t key, const ps_table_options *opts,
                          size_t max_ids, int tag)
{
    if (x->started)
        return PS_ESTATE;
    /* the dim's range is the client's to say (below); the buffers need it first */
    if (!opts || max_ids < 1 || max_ids > TABLE_MAX_IDS || opts->dim < 1 || opts->dim > 65536)
        return PS_EINVAL;
    if (x->ntb == x->captb) {
        int cap = x->captb ? 2 * x->captb : 8;
        xtable *more = realloc(x->tb, (size_t)cap * sizeof *more);
        if (!more)
            return PS_ENOMEM;
        x->tb = more;
        x->captb = cap;
    }
    xtable *t = &x->tb[x->ntb];
    memset(t, 0, sizeof *t);
    t->key = key;
    t->dim = opts->dim;
    t->max_ids = max_ids;
    t->tag = tag;
    /* the map at most half full: probes stay short */
    t->hcap = 1;
    while (t->hcap < 2 * max_ids)
        t->hcap *= 2;
    int ok = (t->hkey = malloc(t->hcap * sizeof *t->hkey)) &&
             (t->hval = malloc(t->hcap * sizeof *t->hval)) &&
             (t->hstamp = calloc(t->hcap, sizeof *t->hstamp));
    for (int k = 0; ok && k < TSLOTS; k++) {
        t->s[k].b = -1;
        ok = (t->s[k].ids = malloc(max_ids * sizeof *t->s[k].ids)) &&
             (t->s[k].index = malloc(max_ids * sizeof *t->s[k].index));
    }
    for (int k = 0; ok && k < 2; k++)
        ok = (t->rows[k] = malloc(max_ids * t->dim * sizeof(float))) &&
             (t->grads[k] = calloc(max_ids * t->dim, sizeof(float)));
    int rc = ok ? ps_client_register_table(x->client, key, opts) : PS_ENOMEM;
    if (rc) {
        table_free(t);
        return rc;
    }
    x->ntb++;
    return 0;
}

int ps_exchange_num_tables(const ps_exchange *x)
{
    return x->ntb;
}

int ps_exchange_name_table(ps_exchange *x, int ti, const char *name)
{
    xtable *t = table_at(x, ti);
    return t ? ps_client_name_table(x->client, t->key, name) : PS_EINVAL;
}

int ps_exchange_table_sorted(ps_exchange *x, int ti, int on)
{
    xtable *t = table_at(x, ti);
    if (!t)
        return PS_EINVAL;
    if (x->started)
        return PS_ESTATE;
    if (on && !t->skey) {
        t->skey = malloc(t->max_ids * sizeof *t->skey);
        t->sperm = malloc(t->max_ids * sizeof *t->sperm);
        if (!t->skey || !t->sperm)
            return PS_ENOMEM;
    }
    t->sorted = on != 0;
    return 0;
}

/* Sort batch s's distinct ids ascending as int64 and renumber its entries'
 * index: an insertion sort for a batch's few ids, a heap sort past it (no
 * allocation, no recursion). */
static void sift(int64_t *k, int32_t *p, size_t i, size_t n)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && k[c + 1] > k[c])
            c++;
        if (k[i] >= k[c])
            return;
        int64_t tk = k[i];
        k[i] = k[c];
        k[c] = tk;
        int32_t tp = p[i];
        p[i] = p[c];
        p[c] = tp;
        i = c;
    }
}

static void sort_batch(xtable *t, tbatch *s)
{
    size_t u = s->nunique;
    int64_t *k = t->skey;
    int32_t *p = t->sperm;
    for (size_t i = 0; i < u; i++) {
        k[i] = (int64_t)s->ids[i];
        p[i] = (int32_t)i;
    }
    if (u <= 32) {
        for (size_t i = 1; i < u; i++)
            for (size_t j = i; j > 0 && k[j - 1] > k[j]; j--) {
                int64_t tk = k[j];
                k[j] = k[j - 1];
                k[j - 1] = tk;
                int32_t tp = p[j];
                p[j] = p[j - 1];
                p[j - 1] = tp;
            }
    } else {
        for (size_t i = u / 2; i-- > 0;)
            sift(k, p, i, u);
        for (size_t n = u; n-- > 1;) {
            int64_t tk = k[0];
            k[0] = k[n];
            k[n] = tk;
            int32_t tp = p[0];
            p[0] = p[n];
            p[n] = tp;
            sift(k, p, 0, n);
        }
    }
    /* ids in order; p[r] is the old place of rank r: k becomes old -> rank */
    for (size_t r = 0; r < u; r++)
        s->ids[r] = (uint64_t)k[r];
    for (size_t r = 0; r < u; r++)
        k[p[r]] = (int64_t)r;
    for (size_t e = 0; e < s->nentries; e++)
        s->index[e] = (int32_t)k[s->index[e]];
}

/* The ids of batch s: its distinct ids in first-seen order and each entry's
 * place among them. */
static void table_dedup(xtable *t, tbatch *s, const uint64_t *ids, size_t n, size_t stride)
{
    if (++t->stamp == 0) { /* wrapped: stamps of 2^32 batches ago would match */
        memset(t->hstamp, 0, t->hcap * sizeof *t->hstamp);
        t->stamp = 1;
    }
    size_t mask = t->hcap - 1, nu = 0;
    for (size_t e = 0; e < n; e++) {
        uint64_t id = ids[e * stride];
        size_t h = (size_t)ps_table_mix(id) & mask;
        while (t->hstamp[h] == t->stamp && t->hkey[h] != id)
            h = (h + 1) & mask;
        if (t->hstamp[h] != t->stamp) {
            t->hstamp[h] = t->stamp;
            t->hkey[h] = id;
            t->hval[h] = (int32_t)nu;
            s->ids[nu++] = id;
        }
        s->index[e] = t->hval[h];
    }
    s->nentries = n;
    s->nunique = nu;
}

/* Wait for table request r (counted as comm-wait; a "wait" event past
 * WAIT_EVENT_NS, args.step `step`). */
static void table_wait(ps_exchange *x, const xtable *t, ps_request *r, int64_t step)
{
    if (ps_request_test(r))
        return;
    int64_t t0 = ps_now_ns();
    ps_request_wait(r);
    int64_t t1 = ps_now_ns();
    psx_waited(x, t1 - t0);
    if (t1 - t0 > WAIT_EVENT_NS)
        ps_trace_event(x->trace, "wait", "comm", x->wait_tid, t0, t1, step, t->tag);
}

/* The status of table ti's completed request r; a failure is logged as the
 * tensors' are (the first one says why). */
static int table_status(ps_exchange *x, int ti, const ps_request *r, const char *what,
                        int64_t step)
{
    int rc = r->status;
    if (!rc)
        return 0;
    if (psx_device_failed(x))
        return psx_device_failed(x);
    if (psx_worth_logging(x, rc))
        ps_log(x->failed++ ? PS_LOG_DEBUG : PS_LOG_ERROR,
               "step %lld: %s of table %d failed: %s (%s)", (long long)step, what, ti,
               ps_strerror(rc), r->err);
    return rc;
}

/* Wait for batch s's push, if in flight: then its ids and gradients are
 * free and the pull it carried has landed. */
static int settle_push(ps_exchange *x, int ti, tbatch *s)
{
    xtable *t = &x->tb[ti];
    if (!s->pushing)
        return 0;
    table_wait(x, t, &s->push, s->step);
    s->pushing = 0;
    ps_trace_event(x->trace, s->carries ? "sparse pushpull" : "sparse push", "comm",
                   x->request_tid, s->push_ns, s->push.done_ns, s->step, t->tag);
    int rc = table_status(x, ti, &s->push, s->carries ? "pushpull" : "push", s->step);
    if (s->carries) {
        tbatch *n = &t->s[(s->b + 1) % TSLOTS];
        n->pull = TPULL_NONE;
        n->landed = !rc;
        n->rc = rc;
        n->version = s->push.version;
        s->carries = 0;
    }
    return rc;
}

/* Wait for batch s's own pull, if in flight. */
static int settle_pull(ps_exchange *x, int ti, tbatch *s)
{
    xtable *t = &x->tb[ti];
    if (s->pull != TPULL_OWN)
        return 0;
    table_wait(x, t, &s->preq, s->want);
    s->pull = TPULL_NONE;
    ps_trace_event(x->trace, "sparse pull", "comm", x->request_tid, s->pull_ns, s->preq.done_ns,
                   s->want, t->tag);
    s->rc = table_status(x, ti, &s->preq, "pull", s->want);
    s->landed = !s->rc;
    s->version = s->preq.version;
    return s->rc;
}

/* Post the pull of batch s's rows into rows[b % 2]: the version of the step
 * that computes it (this worker's clock, one more when a batch computes
 * before it). */
static int post_pull(ps_exchange *x, int ti, tbatch *s)
{
    xtable *t = &x->tb[ti];
    s->want = t->clock + (s->b - t->cur);
    s->pull_ns = ps_now_ns();
    if (ps_client_sparse_pull(x->client, t->key, s->ids, s->nunique, t->rows[s->b % 2], s->want,
                              &s->preq))
        return s->rc = table_status(x, ti, &s->preq, "pull", s->want);
    s->pull = TPULL_OWN;
    return 0;
}

int ps_exchange_table_next(ps_exchange *x, int ti, const uint64_t *ids, size_t n, size_t stride)
{
    xtable *t = table_at(x, ti);
    if (!t || (n && !ids) || stride < 1 || n > t->max_ids)
        return PS_EINVAL;
    /* two batches in flight at most: the current one and this */
    if (!x->started || psx_member(x) || t->given > t->cur + 1)
        return PS_ESTATE;
    int64_t b = t->given;
    tbatch *s = &t->s[b % TSLOTS];
    /* the slot's last batch, three before: its push must be done with its
     * ids (it had two steps) */
    int rc;
    if (s->b >= 0 && ((rc = settle_push(x, ti, s)) || (rc = settle_pull(x, ti, s))))
        return rc;
    /* rows[b % 2] was batch b-2's, pushed (its compute is over) */
    table_dedup(t, s, ids, n, stride);
    if (t->sorted)
        sort_batch(t, s);
    s->b = b;
    s->landed = s->taken = s->pushing = s->carries = 0;
    s->pull = TPULL_NONE;
    s->rc = 0;
    s->version = -1;
    t->given++;
    /* sync: batch b is computed at step clock+1, after every worker's
     * gradients of the current step: the current batch's push carries the
     * pull (after it, in one message per partition) */
    if (x->mode == PS_MODE_SYNC && b == t->cur + 1) {
        s->pull = TPULL_CARRY;
        return 0;
    }
    return post_pull(x, ti, s);
}

int ps_exchange_table_rows(ps_exchange *x, int ti, ps_exchange_rows *out)
{
    memset(out, 0, sizeof *out);
    xtable *t = table_at(x, ti);
    if (!t)
        return PS_EINVAL;
    if (t->cur >= t->given)
        return PS_ESTATE;
    tbatch *s = &t->s[t->cur % TSLOTS];
    int rc = 0;
    if (!s->landed) {
        if (s->pull == TPULL_OWN)
            rc = settle_pull(x, ti, s);
        else if (s->pull == TPULL_CARRIED)
            rc = settle_push(x, ti, &t->s[(s->b + TSLOTS - 1) % TSLOTS]);
        if (!rc && !s->landed)
            rc = s->rc ? s->rc : PS_ESTATE; /* failed before, or never asked for */
        if (rc)
            return rc;
    }
    /* the gradient buffer was batch cur-2's: its push must be done reading it */
    tbatch *old = &t->s[(t->cur + 1) % TSLOTS];
    if (old->b == t->cur - 2 && (rc = settle_push(x, ti, old)))
        return rc;
    s->taken = 1;
    out->nentries = s->nentries;
    out->nunique = s->nunique;
    out->dim = t->dim;
    out->ids = s->ids;
    out->index = s->index;
    out->rows = t->rows[s->b % 2];
    out->grads = t->grads[s->b % 2];
    out->version = s->version;
    return 0;
}

int ps_exchange_table_extend(ps_exchange *x, int ti, const uint64_t *ids, size_t n)
{
    xtable *t = table_at(x, ti);
    if (!t || (n && !ids))
        return PS_EINVAL;
    if (t->cur >= t->given || !t->s[t->cur % TSLOTS].taken)
        return PS_ESTATE;
    tbatch *s = &t->s[t->cur % TSLOTS];
    if (n > t->max_ids - s->nunique)
        return PS_ETOOBIG;
    /* the batch's pull landed and its push is not posted: its ids and its
     * gradient buffer are ours */
    memcpy(s->ids + s->nunique, ids, n * sizeof *ids);
    memset(t->grads[s->b % 2] + s->nunique * t->dim, 0, n * t->dim * sizeof(float));
    s->nunique += n;
    return 0;
}

int ps_exchange_table_push(ps_exchange *x, int ti, int64_t step)
{
    xtable *t = table_at(x, ti);
    if (!t || step < t->clock || step > INT64_MAX / 2)
        return PS_EINVAL;
    if (t->cur >= t->given || !t->s[t->cur % TSLOTS].taken)
        return PS_ESTATE;
    tbatch *s = &t->s[t->cur % TSLOTS];
    tbatch *next = t->given > t->cur + 1 ? &t->s[(t->cur + 1) % TSLOTS] : NULL;
    const float *g = t->grads[s->b % 2];
    s->step = step;
    s->push_ns = ps_now_ns();
    s->carries = next && next->pull == TPULL_CARRY;
    int rc = s->carries ? ps_client_sparse_pushpull(x->client, t->key, s->ids, s->nunique, g,
                                                    next->ids, next->nunique,
                                                    t->rows[next->b % 2], step, &s->push)
                        : ps_client_sparse_push(x->client, t->key, s->ids, s->nunique, g, step,
                                                &s->push);
    if (rc) {
        s->carries = 0;
        return table_status(x, ti, &s->push, "push", step);
    }
    s->pushing = 1;
    if (s->carries) {
        next->pull = TPULL_CARRIED;
        next->want = step + 1;
        next->pull_ns = s->push_ns;
    }
    t->cur++;
    t->clock = step + 1;
    return 0;
}

int ps_exchange_table_lookup(ps_exchange *x, int ti, const uint64_t *ids, size_t n, float *rows)
{
    xtable *t = table_at(x, ti);
    if (!t || (n && (!ids || !rows)))
        return PS_EINVAL;
    if (!x->started || psx_member(x))
        return PS_ESTATE;
    ps_request r;
    if (ps_client_sparse_pull(x->client, t->key, ids, n, rows, t->clock, &r) == 0)
        table_wait(x, t, &r, t->clock);
    return table_status(x, ti, &r, "lookup", t->clock);
}

/* Every request of table ti in flight, waited for; the first error. */
static int table_finish(ps_exchange *x, int ti)
{
    xtable *t = &x->tb[ti];
    int rc = 0;
    /* oldest first: a push may carry the next batch's pull */
    for (int64_t b = t->given - TSLOTS; b < t->given; b++) {
        if (b < 0)
            continue;
        tbatch *s = &t->s[b % TSLOTS];
        int r = settle_push(x, ti, s);
        if (!r)
            r = settle_pull(x, ti, s);
        if (!rc)
            rc = r;
    }
    return rc;
}

int psx_tables_finish(ps_exchange *x)
{
    int rc = 0;
    for (int i = 0; i < x->ntb; i++) {
        int r = table_finish(x, i);
        if (!rc)
            rc = r;
    }
    return rc;
}

void psx_tables_free(ps_exchange *x)
{
    for (int i = 0; i < x->ntb; i++)
        table_free(&x->tb[i]);
    free(x->tb);
}
