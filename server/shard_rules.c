/* The shard store's consistency rules (docs/PROTOCOL.md "Semantics";
 * shard.h has the contract): a push in sync mode waits its rank's turn in
 * the open round and the round's mean is applied once every live rank is in
 * or skipped; in async mode each push is applied with its rank's clock moved
 * by one; a pull waits while the round is open (sync) or the slowest live
 * worker is too far behind (SSP); a restored chunk fast-forwards to where its
 * workers are; ranks leave and rejoin; hyper-parameters change from a given
 * round.  The chunks themselves, their buffers and memory are shard.c. */
#include "shard_internal.h"

#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_clones.h"
#include "ps_error.h"
#include "ps_time.h"

/* The slowest live worker's clock (INT64_MAX when none is live). */
static int64_t min_clock(const ps_shard *s, const chunk *ch)
{
    int64_t m = INT64_MAX;
    for (int r = 0; r < s->cfg.num_workers; r++)
        if (s->live[r] && ch->clock[r] < m)
            m = ch->clock[r];
    return m;
}

static int can_answer(const ps_shard *s, const chunk *ch, int64_t want)
{
    if (s->cfg.mode == PS_MODE_SYNC)
        return ch->version >= want;
    if (s->cfg.max_staleness < 0)
        return 1;
    int64_t m = min_clock(s, ch);
    return m == INT64_MAX || m >= want - s->cfg.max_staleness;
}

/* Answer, in arrival order, every queued pull the chunk can now satisfy. */
static void wake(ps_shard *s, chunk *ch)
{
    size_t keep = 0;
    for (size_t i = 0; i < ch->nwait; i++) {
        if (can_answer(s, ch, ch->wait[i].want))
            s->hooks.ready(s->hooks.user, ch->wait[i].ctx, ch->w, ch->n, ch->version);
        else
            ch->wait[keep++] = ch->wait[i];
    }
    ch->nwait = keep;
}

/* The hyper-parameters of sync round `round` (async: the current ones). */
static const ps_opt_config *opt_of_round(ps_shard *s, int64_t round)
{
    int have;
    int64_t minv = ps_shard_min_version(s, &have);
    /* every chunk is past it: it is what the rest uses */
    while (s->nsched && have && s->sched[0].from <= minv) {
        s->cfg.opt = s->sched[0].cfg;
        memmove(s->sched, s->sched + 1, (size_t)--s->nsched * sizeof s->sched[0]);
    }
    const ps_opt_config *c = &s->cfg.opt;
    for (int i = 0; i < s->nsched && s->sched[i].from <= round; i++)
        c = &s->sched[i].cfg;
    return c;
}

/* One update, into shard_write_buffer's buffer, with gradient g, which sums
 * m pushes (async: a worker's accumulated gradients; else 1): the version
 * and the update count go up by m, and the optimizer's step count t is that
 * of the last of them. */
static void apply(ps_shard *s, chunk *ch, const float *g, int64_t m)
{
    int64_t t0 = s->trace ? ps_now_ns() : 0;
    int dst = shard_write_buffer(s, ch);
    float *out = wbuf_data(ch->buf[dst]);
    /* sync: the round's hyper-parameters (ps_shard_set_opt) */
    const ps_opt_config *opt = opt_of_round(s, ch->version);
    int64_t t = ch->version + m - ch->t_base;
    size_t kept = ps_opt_apply_checked(opt, ch->w, out, ch->s0, ch->s1, g, ch->n, t,
                                       s->cfg.guard);
    if (kept && s->nf.updates++ == 0) {
        s->nf.key = ch->key;
        s->nf.chunk = ch->chunk;
    }
    s->nf.values += kept;
    ch->cur = dst;
    ch->w = out;
    ch->version += m;
    s->st.updates += (uint64_t)m;
    if (s->m_apply) { /* sync: from the round's first push; async: this push's receipt */
        int64_t from = ch->round_t0 ? ch->round_t0 : s->recv_ns;
        if (from)
            ps_metrics_hist_observe(s->m_apply, ps_now_ns() - from);
    }
    shard_version_raised(s, ch->version - m);
    if (s->trace)
        ps_trace_event(s->trace, "apply", "update", s->trace_tid, t0, ps_now_ns(), ch->version,
                       -1);
}

/* The round's passes over its chunk, on the update thread between the last
 * push of a round and its replies (the critical path of a sync step):
 * built for x86-64-v3 too (PS_CLONES_V3), so the sum and the division go 8
 * lanes at a time.  The same results on every path: one add and one IEEE
 * division per element. */

PS_CLONES_V3 static void sum_add(float *restrict sum, const float *restrict g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = sum[i] + g[i];
}

/* The last gradient of the round in and the mean taken, in one pass: what
 * sum_add and then sum_div would store. */
PS_CLONES_V3 static void sum_add_div(float *restrict sum, const float *restrict g, size_t n,
                                     float nw)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = (sum[i] + g[i]) / nw;
}

PS_CLONES_V3 static void sum_div(float *restrict sum, size_t n, float nw)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = sum[i] / nw;
}

/* No rank after `rank` can still add to the open round: each is out of the
 * live set with no push kept for it. */
static int last_contributor(const ps_shard *s, const chunk *ch, int rank)
{
    for (int r = rank + 1; r < s->cfg.num_workers; r++) {
        if (s->live[r])
            return 0;
        for (size_t i = 0; i < ch->npend; i++)
            if (ch->pend[i].rank == r)
                return 0;
    }
    return 1;
}

/* g NULL: the rank's push of the round was skipped (--on-nonfinite skip):
 * it takes its turn and adds nothing.  The last gradient of the round also
 * divides by the count (ch->divided), which finish_round otherwise does. */
static void accumulate(ps_shard *s, chunk *ch, const float *restrict g)
{
    float *restrict sum = ch->sum;
    size_t n = ch->n;
    int rank = ch->next_rank;
    ch->next_rank++;
    if (!g) {
        ch->nskipped++;
        return;
    }
    ch->ncontrib++;
    float nw = (float)ch->ncontrib;
    if (ch->ncontrib > 1 && nw != 1.0f && last_contributor(s, ch, rank)) {
        sum_add_div(sum, g, n, nw);
        ch->divided = 1;
    } else if (ch->ncontrib == 1) {
        memcpy(sum, g, n * sizeof(float));
    } else {
        sum_add(sum, g, n);
    }
}

static void finish_round(ps_shard *s, chunk *ch)
{
    /* the mean over the gradients summed: every worker's, or the live ones'
     * after a worker was dropped (x / 1 is x: one gradient needs no pass) */
    float nw = (float)ch->ncontrib;
    if (!ch->divided && nw != 1.0f)
        sum_div(ch->sum, ch->n, nw);
    if (s->m_round && ch->round_t0) /* to the last push's receipt (or now: a drop ended it) */
        ps_metrics_hist_observe(s->m_round, (s->recv_ns ? s->recv_ns : ps_now_ns()) -
                                                ch->round_t0);
    apply(s, ch, ch->sum, 1);
    ch->next_rank = 0;
    ch->ncontrib = 0;
    ch->divided = 0;
    ch->ff_ok = 0;
}

/* Sync: a live rank's membership starts at a later round than the open one. */
static int joins_later(const ps_shard *s, const chunk *ch)
{
    for (int r = 0; r < s->cfg.num_workers; r++)
        if (s->live[r] && ch->clock[r] > ch->version)
            return 1;
    return 0;
}

/* Sync: add, in rank order, every gradient of the open round that is next in
 * line (a kept push of rank next_rank; a rank that is not live is skipped),
 * and finish the round once every rank is in or skipped. */
static void advance(ps_shard *s, chunk *ch)
{
    int W = s->cfg.num_workers;
    while (ch->next_rank < W) {
        int r = ch->next_rank;
        size_t i = 0;
        while (i < ch->npend && ch->pend[i].rank != r)
            i++;
        if (i < ch->npend) {
            pending p = ch->pend[i];
            ch->pend[i] = ch->pend[--ch->npend];
            const float *g = p.g;
            if (g && s->hooks.take && s->hooks.take(s->hooks.user, p.hold, &g, ch->n)) {
                /* refused now: its resend is taken, and the round waits for it */
                ch->clock[r] = ch->version;
                s->hooks.release(s->hooks.user, p.hold);
                return;
            }
            accumulate(s, ch, g);
            s->hooks.release(s->hooks.user, p.hold);
        } else if (!s->live[r] || ch->clock[r] > ch->version) {
            /* not live, or it joins at a later round (ps_shard_join) */
            ch->next_rank++;
        } else {
            return;
        }
    }
    if (ch->ncontrib == 0 && ch->nskipped == 0) {
        ch->next_rank = 0;
        ch->round_t0 = 0;
        if (!joins_later(s, ch)) /* nobody live: nothing to apply, start over */
            return;
        /* the only live ranks join later: the round ends unchanged */
        ch->version++;
        shard_version_raised(s, ch->version - 1);
        ch->ff_ok = 0;
        if (ch->nwait)
            wake(s, ch);
        return;
    }
    if (ch->ncontrib == 0) { /* every gradient was skipped: the round ends, unchanged */
        ch->version++;
        shard_version_raised(s, ch->version - 1);
        ch->next_rank = 0;
        ch->ff_ok = 0;
    } else {
        finish_round(s, ch);
    }
    ch->round_t0 = 0;
    ch->nskipped = 0;
    if (ch->nwait)
        wake(s, ch);
}

void ps_shard_take_nonfinite(ps_shard *s, ps_shard_nonfinite *out)
{
    *out = s->nf;
    memset(&s->nf, 0, sizeof s->nf);
}

/* Sync, restored chunk: a worker is at `step`, beyond the restored round.
 * The rounds in between died with the old process; go on from `step`. */
static void fast_forward(ps_shard *s, chunk *ch, int64_t step)
{
    for (size_t i = 0; i < ch->npend; i++)
        s->hooks.release(s->hooks.user, ch->pend[i].hold);
    ch->npend = 0;
    ch->next_rank = 0;
    ch->ncontrib = 0;
    ch->divided = 0;
    ch->nskipped = 0;
    ch->round_t0 = 0;
    int64_t old = ch->version;
    s->ff_rounds += (uint64_t)(step - old);
    ch->version = step;
    for (int r = 0; r < s->cfg.num_workers; r++)
        if (ch->clock[r] < step)
            ch->clock[r] = step;
    shard_version_raised(s, old);
    if (ch->nwait)
        wake(s, ch);
}

int ps_shard_push(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t step, const float *g,
                  size_t n, void *hold, int *kept, int *dup, int64_t *version, char *why,
                  size_t why_len)
{
    return ps_shard_push_sum(s, key, c, rank, step, 1, g, n, hold, kept, dup, version, why,
                             why_len);
}

int ps_shard_push_sum(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t step, int64_t m,
                      const float *g, size_t n, void *hold, int *kept, int *dup,
                      int64_t *version, char *why, size_t why_len)
{
    *kept = 0;
    *dup = 0;
    if (m < 1 || (m > 1 && s->cfg.mode != PS_MODE_ASYNC)) {
        ps_errorf(why, why_len, "a push summing %lld gradients: only async mode takes sums",
            (long long)m);
        return PS_EPROTO;
    }
    s->st.pushes += (uint64_t)m;
    s->st.bytes_in += n * sizeof(float);
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    *version = ch->version;
    if (n != ch->n) {
        ps_errorf(why, why_len, "push of %zu elements to key %llu chunk %u, which has %zu", n,
            (unsigned long long)key, c, ch->n);
        return PS_EPROTO;
    }
    if (rank < 0 || rank >= s->cfg.num_workers || step < 0) {
        ps_errorf(why, why_len,
            "push needs a worker rank in [0, %d) and a step >= 0, got rank %d step %lld",
            s->cfg.num_workers, rank, (long long)step);
        return PS_EPROTO;
    }
    if (s->cfg.mode == PS_MODE_ASYNC) {
        if (step < ch->clock[rank]) {
            *dup = 1;
            s->st.dup_dropped++;
            return 0;
        }
        /* a push moves its rank's clock by one at most: one push claiming a
         * far step would make every later push of the real worker a
         * "duplicate" (docs/PROTOCOL.md "async") */
        int jump = ch->jump && (ch->jump[rank / 64] >> (rank % 64) & 1);
        if (step > ch->clock[rank] && !jump) {
            ps_errorf(why, why_len, "push of step %lld to key %llu chunk %u refused: worker %d "
                "has pushed %lld times there, so its next step is %lld; a push may not skip "
                "steps", (long long)step, (unsigned long long)key, c, rank,
                (long long)ch->clock[rank], (long long)ch->clock[rank]);
            return PS_ESTATE;
        }
        if (jump) {
            s->jumped += (uint64_t)(step - ch->clock[rank]);
            ch->jump[rank / 64] &= ~(1ull << (rank % 64));
            if (--ch->njump == 0) {
                free(ch->jump);
                ch->jump = NULL;
            }
        }
        if (m > 1 && g && s->cfg.opt.kind != PS_OPT_ADD) {
            /* gradients a worker computed on the same (stale) weights while
             * its last push was on the wire: one update with their mean,
             * like a larger batch (their sum at the same rate diverges as
             * the sums grow).  Not so the weight deltas of `add`: each moved
             * the worker's own weights, so together they move by their sum */
            if (s->mean_cap < n) {
                float *p = realloc(s->mean, n * sizeof(float));
                if (!p) {
                    ps_errorf(why, why_len, "out of memory for the mean of %lld gradients",
                        (long long)m);
                    return PS_ENOMEM;
                }
                s->mean = p;
                s->mean_cap = n;
            }
            float inv = 1.0f / (float)m;
            for (size_t i = 0; i < n; i++)
                s->mean[i] = g[i] * inv;
            g = s->mean;
        }
        ch->clock[rank] = step + m;
        if (g) /* else skipped: the clock moves, the weights stay */
            apply(s, ch, g, m);
        if (ch->nwait)
            wake(s, ch);
        *version = ch->version;
        return 0;
    }
    /* sync */
    if (step > ch->version && ch->ff_ok)
        fast_forward(s, ch, step);
    if (step > ch->version) {
        ps_errorf(why, why_len,
            "push for step %lld of key %llu chunk %u, but round %lld is still open (wait for it)",
            (long long)step, (unsigned long long)key, c, (long long)ch->version);
        return PS_ESTATE;
    }
    /* below the round, pushed already, or a rank the rank-order sum has
     * passed (it rejoined mid-round: it joins the next one) */
    if (step < ch->version || ch->clock[rank] > step || rank < ch->next_rank) {
        *dup = 1;
        s->st.dup_dropped++;
        return 0;
    }
    ch->clock[rank] = step + 1;
    if (s->m_round && !ch->round_t0)
        ch->round_t0 = s->recv_ns;
    /* sum in rank order so sync runs are bitwise repeatable: a push that comes
     * before a lower rank's waits (kept, not copied) until its turn */
    if (rank != ch->next_rank) {
        if (ch->npend == ch->cap_pend) {
            size_t ncap = ch->cap_pend ? ch->cap_pend * 2 : 4;
            pending *p = realloc(ch->pend, ncap * sizeof *p);
            if (!p) {
                ch->clock[rank] = step;
                ps_errorf(why, why_len, "out of memory buffering a push");
                return PS_ENOMEM;
            }
            ch->pend = p;
            ch->cap_pend = ncap;
        }
        ch->pend[ch->npend++] = (pending){rank, g, hold};
        *kept = 1;
    } else {
        accumulate(s, ch, g);
    }
    /* also when kept: the ranks before it may all be out of the live set */
    advance(s, ch);
    *version = ch->version;
    return 0;
}

/* Answer now (0, *queued = 0) or queue ctx until the chunk can answer `want`. */
static int answer_or_queue(ps_shard *s, chunk *ch, int64_t want, void *ctx, int *queued,
                           char *why, size_t why_len)
{
    *queued = 0;
    if (can_answer(s, ch, want))
        return 0;
    for (size_t i = 0; s->merge && i < ch->nwait; i++)
        if (ch->wait[i].want == want && s->merge(s->hooks.user, ch->wait[i].ctx, ctx)) {
            *queued = 2;
            return 0;
        }
    size_t limit = PS_SHARD_MAX_WAITERS(s->cfg.num_workers);
    if (ch->nwait >= limit) {
        ps_errorf(why, why_len, "%zu requests already wait on key %llu chunk %u (limit %zu)",
            ch->nwait, (unsigned long long)ch->key, ch->chunk, limit);
        return PS_ETOOBIG;
    }
    if (ch->nwait == ch->cap_wait) {
        size_t ncap = ch->cap_wait ? ch->cap_wait * 2 : 4;
        waiter *p = realloc(ch->wait, ncap * sizeof *p);
        if (!p) {
            ps_errorf(why, why_len, "out of memory queueing a pull");
            return PS_ENOMEM;
        }
        ch->wait = p;
        ch->cap_wait = ncap;
    }
    ch->wait[ch->nwait++] = (waiter){ctx, want};
    *queued = 1;
    return 0;
}

int ps_shard_pull(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t want, void *ctx,
                  int *queued, const float **w, size_t *n, int64_t *version, char *why,
                  size_t why_len)
{
    (void)rank;
    *queued = 0;
    s->st.pulls++;
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    int rc = answer_or_queue(s, ch, want, ctx, queued, why, why_len);
    if (rc || *queued)
        return rc;
    *w = ch->w;
    *n = ch->n;
    *version = ch->version;
    return 0;
}

int ps_shard_await(ps_shard *s, uint64_t key, uint32_t c, int64_t want, void *ctx, int *queued,
                   int64_t *version, char *why, size_t why_len)
{
    *queued = 0;
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    int rc = answer_or_queue(s, ch, want, ctx, queued, why, why_len);
    *version = ch->version;
    return rc;
}
int ps_shard_set_opt(ps_shard *s, int64_t from, const ps_opt_config *cfg)
{
    if (cfg->kind != s->cfg.opt.kind)
        return PS_EINVAL;
    ps_opt_config c = *cfg;
    c.given = PS_OPT_GIVEN_ALL;
    if (s->cfg.mode != PS_MODE_SYNC) {
        s->cfg.opt = c;
        return 0;
    }
    int i = 0;
    while (i < s->nsched && s->sched[i].from < from)
        i++;
    if (i < s->nsched && s->sched[i].from == from) {
        s->sched[i].cfg = c;
        return 0;
    }
    if (s->nsched == PS_SHARD_MAX_OPT_CHANGES) {
        s->cfg.opt = s->sched[0].cfg;
        memmove(s->sched, s->sched + 1, (size_t)--s->nsched * sizeof s->sched[0]);
        i = i > 0 ? i - 1 : 0;
    }
    memmove(s->sched + i + 1, s->sched + i, (size_t)(s->nsched - i) * sizeof s->sched[0]);
    s->sched[i] = (opt_change){from, c};
    s->nsched++;
    return 0;
}
int ps_shard_clock(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t *step, char *why,
                   size_t why_len)
{
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    if (rank < 0 || rank >= s->cfg.num_workers) {
        ps_errorf(why, why_len, "clock of rank %d: ranks are 0..%d", rank,
            s->cfg.num_workers - 1);
        return PS_EPROTO;
    }
    /* sync: a push below the open round is a duplicate, and one beyond it
     * is refused; a rank that pushed the open round already has its
     * gradient in, so its push of the same step is a harmless duplicate */
    *step = s->cfg.mode == PS_MODE_SYNC ? ch->version : ch->clock[rank];
    return 0;
}

void ps_shard_set_live(ps_shard *s, int rank, int live)
{
    int W = s->cfg.num_workers;
    live = live ? 1 : 0;
    if (rank < 0 || rank >= W || s->live[rank] == live)
        return;
    s->live[rank] = (uint8_t)live;
    for (size_t i = 0; i < s->cap; i++) {
        chunk *ch = s->table[i];
        if (!ch)
            continue;
        if (live && s->cfg.mode == PS_MODE_SYNC) {
            /* join the open round unless the rank-order sum has passed it */
            int64_t c = ch->version + (ch->next_rank > rank ? 1 : 0);
            if (ch->clock[rank] < c)
                ch->clock[rank] = c;
        } else if (live) {
            /* as far as the slowest other live worker, so SSP does not wait on it */
            s->live[rank] = 0;
            int64_t m = min_clock(s, ch);
            s->live[rank] = 1;
            if (m != INT64_MAX && ch->clock[rank] < m)
                ch->clock[rank] = m;
        } else if (s->cfg.mode == PS_MODE_SYNC) {
            advance(s, ch);
        } else if (ch->nwait) {
            wake(s, ch);
        }
    }
}

void ps_shard_set_elastic(ps_shard *s)
{
    memset(s->live, 0, (size_t)s->cfg.num_workers);
}

void ps_shard_join(ps_shard *s, int rank, int64_t step)
{
    if (rank < 0 || rank >= s->cfg.num_workers || !s->live[rank] || step < 0)
        return;
    for (size_t i = 0; i < s->cap; i++) {
        chunk *ch = s->table[i];
        if (!ch || ch->clock[rank] >= step)
            continue;
        ch->clock[rank] = step;
        if (s->cfg.mode == PS_MODE_SYNC)
            advance(s, ch); /* a round that waited for it may end without it */
        else if (ch->nwait)
            wake(s, ch);
    }
}

uint64_t ps_shard_fast_forwards(const ps_shard *s) { return s->ff_rounds; }

uint64_t ps_shard_jumped(const ps_shard *s) { return s->jumped; }

void ps_shard_set_merge(ps_shard *s, int (*merge)(void *user, void *queued, void *incoming))
{
    s->merge = merge;
}
