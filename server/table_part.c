/* The consistency rules of table partitions (server/table_part.h). */
#include "table_part.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_time.h"
#include "shard.h"

typedef struct tpend {
    int rank;
    const uint64_t *ids;
    size_t n;
    const float *g;
    void *hold;
} tpend;

typedef struct twait {
    void *ctx;
    int64_t want;
} twait;

typedef struct tpart {
    uint64_t key;
    ps_table_options decl; /* normalized */
    ps_table *store;
    int64_t *clock;        /* per worker: pushes received (step + 1 of the last one) */
    int next_rank;         /* sync: ranks below it are in the round or were skipped */
    int ff_ok;             /* sync, restored: may fast-forward until its first round */
    uint64_t *jump;        /* async, restored: bit r while rank r has not pushed since */
    int njump;
    tpend *pend;           /* sync: pushes of the open round before a lower rank's */
    size_t npend, cap_pend;
    twait *wait;           /* pulls and acknowledgements that wait, in arrival order */
    size_t nwait, cap_wait;
    char name[PS_TABLE_NAME_MAX + 1]; /* for logs; "" none (ps_tparts_set_name) */
    int64_t round_t0;      /* sync, with metrics: the open round's first push's receipt */
} tpart;

struct ps_tparts {
    ps_tparts_config cfg;
    ps_tparts_hooks hooks;
    tpart **parts;
    size_t n, cap;
    uint8_t *live;
    uint64_t ff_rounds, jumped;
    uint64_t pushes, pulls, updates, dups;
    uint64_t nf_key;        /* updates with results not finite, not yet taken */
    ps_table_nonfinite nf;
    ps_metrics_hist *m_apply, *m_round; /* ps_tparts_set_metrics; NULL: off */
    int64_t recv_ns;                    /* the receipt of the request being handled */
};

/* An update of p was applied: time it from the oldest push it holds. */
static void timed_apply(ps_tparts *t, tpart *p)
{
    if (!t->m_apply)
        return;
    int64_t from = p->round_t0 ? p->round_t0 : t->recv_ns;
    if (from)
        ps_metrics_hist_observe(t->m_apply, ps_now_ns() - from);
    p->round_t0 = 0;
}

void ps_tparts_set_metrics(ps_tparts *t, ps_metrics_hist *apply, ps_metrics_hist *round)
{
    t->m_apply = apply;
    t->m_round = round;
}

void ps_tparts_set_recv(ps_tparts *t, int64_t recv_ns) { t->recv_ns = recv_ns; }

static tpart *find(const ps_tparts *t, uint64_t key)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->parts[i]->key == key)
            return t->parts[i];
    return NULL;
}

static tpart *find_declared(const ps_tparts *t, uint64_t key, char *why, size_t why_len)
{
    tpart *p = find(t, key);
    if (!p)
        ps_errorf(why, why_len, "table %llu is not declared on this server (libps declares its "
            "tables at start: ps_client_register_table)", (unsigned long long)key);
    return p;
}

int ps_tparts_create(const ps_tparts_config *cfg, const ps_tparts_hooks *hooks, ps_tparts **out)
{
    *out = NULL;
    if (cfg->num_workers < 1 || cfg->num_servers < 1 || cfg->nparts < 1 ||
        (cfg->mode != PS_MODE_SYNC && cfg->mode != PS_MODE_ASYNC))
        return PS_EINVAL;
    ps_tparts *t = calloc(1, sizeof *t);
    if (!t)
        return PS_ENOMEM;
    t->live = malloc((size_t)cfg->num_workers);
    if (!t->live) {
        free(t);
        return PS_ENOMEM;
    }
    memset(t->live, 1, (size_t)cfg->num_workers);
    t->cfg = *cfg;
    if (cfg->mode == PS_MODE_SYNC)
        t->cfg.max_staleness = 0;
    t->hooks = *hooks;
    *out = t;
    return 0;
}

/* Cancel p's waiters and release its kept pushes with rc (why says), then
 * free it. */
static void free_part(ps_tparts *t, tpart *p, int rc, const char *why)
{
    for (size_t i = 0; i < p->nwait; i++)
        t->hooks.cancel(t->hooks.user, p->wait[i].ctx);
    for (size_t i = 0; i < p->npend; i++)
        t->hooks.release(t->hooks.user, p->pend[i].hold, rc, why);
    ps_table_destroy(p->store);
    free(p->clock);
    free(p->jump);
    free(p->pend);
    free(p->wait);
    free(p);
}

int ps_tparts_remove(ps_tparts *t, uint64_t key, int rc, const char *reason, char *why,
                     size_t why_len)
{
    size_t i = 0;
    while (i < t->n && t->parts[i]->key != key)
        i++;
    if (i == t->n) {
        find_declared(t, key, why, why_len);
        return PS_ENOTFOUND;
    }
    tpart *p = t->parts[i];
    /* out of the list first: a hook that asks for the table finds none */
    memmove(&t->parts[i], &t->parts[i + 1], (t->n - i - 1) * sizeof *t->parts);
    t->n--;
    free_part(t, p, rc, reason);
    return 0;
}

void ps_tparts_copy_live(ps_tparts *dst, const ps_tparts *src)
{
    if (dst->cfg.num_workers == src->cfg.num_workers)
        memcpy(dst->live, src->live, (size_t)dst->cfg.num_workers);
}

void ps_tparts_destroy(ps_tparts *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        free_part(t, t->parts[i], PS_ECLOSED,
                  "the server is shutting down; this push's round was not complete");
    free(t->parts);
    free(t->live);
    free(t);
}

/* One partition's share of a whole table's count: ceil(ceil(whole / S) / P). */
static uint64_t share(const ps_tparts_config *cfg, uint64_t whole)
{
    uint64_t s = (uint64_t)cfg->num_servers, p = (uint64_t)cfg->nparts;
    uint64_t per_server = whole / s + (whole % s != 0);
    return per_server / p + (per_server % p != 0);
}

int ps_tparts_make_store(const ps_tparts_config *cfg, uint64_t key, const ps_table_options *decl,
                         ps_table **out, char *why, size_t why_len)
{
    *out = NULL;
    int rc = ps_table_decl_check(key, decl, why, why_len);
    if (rc)
        return rc;
    ps_table_options d = *decl;
    ps_table_decl_normalize(&d);
    ps_table_config c;
    memset(&c, 0, sizeof c);
    c.table = key;
    c.dim = d.dim;
    c.init = d.init;
    c.init_scale = d.init_scale;
    c.seed = d.seed;
    c.opt = d.opt;
    c.ftrl_beta = d.ftrl_beta;
    c.ftrl_l1 = d.ftrl_l1;
    c.ftrl_l2 = d.ftrl_l2;
    c.max_rows = d.max_rows ? share(cfg, d.max_rows) : 0;
    if (c.max_rows > PS_TABLE_MAX_ROWS)
        c.max_rows = PS_TABLE_MAX_ROWS;
    c.full_refuse = c.max_rows && d.full == PS_TABLE_FULL_REFUSE;
    c.min_count = d.min_count;
    if (d.min_count >= 2 && d.filter_cells) {
        uint64_t cells = share(cfg, d.filter_cells);
        c.filter_cells = (uint32_t)(cells < 64 ? 64 : cells);
    }
    /* sync, capped: the LRU order (and so which row is evicted) follows the
     * rounds, not the order the workers' pulls arrive in */
    c.passive_pulls = cfg->mode == PS_MODE_SYNC && c.max_rows;
    c.guard = cfg->guard;
    c.worker_mem = cfg->worker_mem;
    c.num_workers = cfg->num_workers;
    c.worker_share = cfg->worker_share;
    c.max_memory = cfg->max_memory;
    c.mem_used = cfg->mem_used;
    return ps_table_create(&c, out, why, why_len);
}

int ps_tparts_adopt(ps_tparts *t, uint64_t key, const ps_table_options *decl, ps_table *store,
                    char *why, size_t why_len)
{
    if (find(t, key)) {
        ps_table_destroy(store);
        return 0;
    }
    tpart *p = NULL;
    int64_t *clock = NULL;
    if (t->n == t->cap) {
        size_t ncap = t->cap ? 2 * t->cap : 8;
        tpart **np = realloc(t->parts, ncap * sizeof *np);
        if (np) {
            t->parts = np;
            t->cap = ncap;
        }
    }
    if (t->n < t->cap) {
        p = calloc(1, sizeof *p);
        clock = calloc((size_t)t->cfg.num_workers, sizeof *clock);
    }
    if (!p || !clock) {
        free(p);
        free(clock);
        ps_table_destroy(store);
        ps_errorf(why, why_len, "out of memory declaring table %llu", (unsigned long long)key);
        return PS_ENOMEM;
    }
    p->key = key;
    p->decl = *decl;
    ps_table_decl_normalize(&p->decl);
    p->store = store;
    p->clock = clock;
    t->parts[t->n++] = p;
    return 0;
}

const ps_table_options *ps_tparts_decl(const ps_tparts *t, uint64_t key)
{
    tpart *p = find(t, key);
    return p ? &p->decl : NULL;
}

/* ---- waiting ---- */

/* The slowest live worker's clock (INT64_MAX when none is live). */
static int64_t min_clock(const ps_tparts *t, const tpart *p)
{
    int64_t m = INT64_MAX;
    for (int r = 0; r < t->cfg.num_workers; r++)
        if (t->live[r] && p->clock[r] < m)
            m = p->clock[r];
    return m;
}

static int can_answer(const ps_tparts *t, const tpart *p, int64_t want)
{
    if (t->cfg.mode == PS_MODE_SYNC)
        return ps_table_version(p->store) >= want;
    if (t->cfg.max_staleness < 0)
        return 1;
    int64_t m = min_clock(t, p);
    return m == INT64_MAX || m >= want - t->cfg.max_staleness;
}

/* Answer, in arrival order, every waiter the partition can now satisfy:
 * they leave the list before their hooks run (16 at a time), so a hook may
 * pull rows or queue another waiter. */
static void wake(ps_tparts *t, tpart *p)
{
    int64_t v = ps_table_version(p->store);
    for (;;) {
        twait ready[16];
        size_t keep = 0, nready = 0;
        for (size_t i = 0; i < p->nwait; i++) {
            if (nready < 16 && can_answer(t, p, p->wait[i].want))
                ready[nready++] = p->wait[i];
            else
                p->wait[keep++] = p->wait[i];
        }
        p->nwait = keep;
        for (size_t i = 0; i < nready; i++)
            t->hooks.ready(t->hooks.user, ready[i].ctx, v);
        if (nready < 16)
            return;
    }
}

static int answer_or_queue(ps_tparts *t, tpart *p, int64_t want, void *ctx, int *queued,
                           int64_t *version, char *why, size_t why_len)
{
    *queued = 0;
    *version = ps_table_version(p->store);
    if (can_answer(t, p, want))
        return 0;
    for (size_t i = 0; t->hooks.merge && i < p->nwait; i++)
        if (p->wait[i].want == want && t->hooks.merge(t->hooks.user, p->wait[i].ctx, ctx)) {
            *queued = 2;
            return 0;
        }
    size_t limit = PS_SHARD_MAX_WAITERS(t->cfg.num_workers);
    if (p->nwait >= limit) {
        ps_errorf(why, why_len, "%zu requests already wait on table %llu (limit %zu)", p->nwait,
            (unsigned long long)p->key, limit);
        return PS_ETOOBIG;
    }
    if (p->nwait == p->cap_wait) {
        size_t ncap = p->cap_wait ? p->cap_wait * 2 : 4;
        twait *w = realloc(p->wait, ncap * sizeof *w);
        if (!w) {
            ps_errorf(why, why_len, "out of memory queueing a pull of table %llu",
                (unsigned long long)p->key);
            return PS_ENOMEM;
        }
        p->wait = w;
        p->cap_wait = ncap;
    }
    p->wait[p->nwait++] = (twait){ctx, want};
    *queued = 1;
    return 0;
}

int ps_tparts_pull(ps_tparts *t, uint64_t key, int64_t want, void *waiter, int *queued,
                   int64_t *version, char *why, size_t why_len)
{
    *queued = 0;
    t->pulls++;
    tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    return answer_or_queue(t, p, want, waiter, queued, version, why, why_len);
}

int ps_tparts_await(ps_tparts *t, uint64_t key, int64_t want, void *waiter, int *queued,
                    int64_t *version, char *why, size_t why_len)
{
    *queued = 0;
    tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    return answer_or_queue(t, p, want, waiter, queued, version, why, why_len);
}

int ps_tparts_rows(ps_tparts *t, uint64_t key, int rank, const uint64_t *ids, size_t n,
                   float *out, size_t out_len, char *why, size_t why_len)
{
    tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    ps_table_set_maker(p->store, rank);
    int rc = ps_table_pull(p->store, ids, n, out, out_len, why, why_len);
    ps_table_set_maker(p->store, -1);
    return rc;
}

/* ---- results that were not finite ---- */

static void note_nonfinite(ps_tparts *t, tpart *p)
{
    ps_table_nonfinite x;
    ps_table_take_nonfinite(p->store, &x);
    if (!x.rows)
        return;
    if (!t->nf.rows) {
        t->nf_key = p->key;
        t->nf = x;
    } else {
        t->nf.rows += x.rows;
        t->nf.values += x.values;
    }
}

void ps_tparts_take_nonfinite(ps_tparts *t, uint64_t *key, ps_table_nonfinite *out)
{
    *key = t->nf_key;
    *out = t->nf;
    memset(&t->nf, 0, sizeof t->nf);
}

/* ---- the sync round ---- */

/* Add, in rank order, every push of the open round that is next in line (a
 * kept push of rank next_rank; a rank that is not live is skipped), and
 * finish the round once every rank is in or skipped. */
static void advance(ps_tparts *t, tpart *p)
{
    int W = t->cfg.num_workers;
    while (p->next_rank < W) {
        int r = p->next_rank;
        size_t i = 0;
        while (i < p->npend && p->pend[i].rank != r)
            i++;
        if (i < p->npend) {
            tpend q = p->pend[i];
            p->pend[i] = p->pend[--p->npend];
            char why[PS_ERR_TEXT_MAX];
            const float *g = q.g;
            int rc = t->hooks.take ? t->hooks.take(t->hooks.user, q.hold, &g, q.n * p->decl.dim,
                                                   why, sizeof why)
                                   : 0;
            size_t n = g ? q.n : 0; /* NULL: skipped (--on-nonfinite skip) */
            if (!rc)
                rc = ps_table_round_add(p->store, r, q.ids, n, g, n * p->decl.dim, why,
                                        sizeof why);
            if (rc) {
                /* not in the round: its resend is taken again, and the
                 * round waits for it */
                p->clock[r] = ps_table_version(p->store);
                t->hooks.release(t->hooks.user, q.hold, rc, why);
                return;
            }
            p->next_rank++;
            t->hooks.release(t->hooks.user, q.hold, 0, NULL);
        } else if (!t->live[r] || p->clock[r] > ps_table_version(p->store)) {
            /* not live, or it joins at a later round (ps_tparts_join) */
            p->next_rank++;
        } else {
            return;
        }
    }
    p->next_rank = 0;
    if (ps_table_round_contributors(p->store, NULL) == 0) {
        ps_table_round_cancel(p->store); /* nobody live: nothing to apply */
        p->round_t0 = 0;
        int64_t v = ps_table_version(p->store);
        for (int r = 0; r < W; r++)
            if (t->live[r] && p->clock[r] > v) {
                /* the only live ranks join later: the round ends unchanged */
                ps_table_set_version(p->store, v + 1);
                if (p->nwait)
                    wake(t, p);
                break;
            }
        return;
    }
    if (t->m_round && p->round_t0) /* to the last push's receipt (or now: a drop ended it) */
        ps_metrics_hist_observe(t->m_round, (t->recv_ns ? t->recv_ns : ps_now_ns()) -
                                                p->round_t0);
    ps_table_round_finish(p->store);
    note_nonfinite(t, p);
    t->updates++;
    timed_apply(t, p);
    p->ff_ok = 0;
    if (p->nwait)
        wake(t, p);
}

/* Sync, restored partition: a worker is at `step`, beyond the restored
 * round.  The rounds in between died with the old process; go on from it. */
static void fast_forward(ps_tparts *t, tpart *p, int64_t step)
{
    /* their round is lost with the old process, as a chunk's kept pushes */
    for (size_t i = 0; i < p->npend; i++)
        t->hooks.release(t->hooks.user, p->pend[i].hold, 0, NULL);
    p->npend = 0;
    p->next_rank = 0;
    p->round_t0 = 0;
    ps_table_round_cancel(p->store);
    t->ff_rounds += (uint64_t)(step - ps_table_version(p->store));
    ps_table_set_version(p->store, step);
    for (int r = 0; r < t->cfg.num_workers; r++)
        if (p->clock[r] < step)
            p->clock[r] = step;
    if (p->nwait)
        wake(t, p);
}

static int push_sync(ps_tparts *t, tpart *p, int rank, int64_t step, const uint64_t *ids,
                     size_t n, const float *g, void *hold, int *kept, int *dup, char *why,
                     size_t why_len)
{
    int64_t v = ps_table_version(p->store);
    if (step > v && p->ff_ok) {
        fast_forward(t, p, step);
        v = step;
    }
    if (step > v) {
        ps_errorf(why, why_len, "push for step %lld of table %llu, but round %lld is still open "
            "(wait for it)", (long long)step, (unsigned long long)p->key, (long long)v);
        return PS_ESTATE;
    }
    /* below the round, pushed already, or a rank the rank-order sum has
     * passed (it rejoined mid-round: it joins the next one) */
    if (step < v || p->clock[rank] > step || rank < p->next_rank) {
        *dup = 1;
        t->dups++;
        return 0;
    }
    if (t->m_round && !p->round_t0)
        p->round_t0 = t->recv_ns;
    if (rank == p->next_rank) {
        int rc = ps_table_round_add(p->store, rank, ids, n, g, n * p->decl.dim, why, why_len);
        if (rc)
            return rc;
        p->clock[rank] = step + 1;
        p->next_rank++;
    } else {
        /* it waits, kept, for the ranks before it */
        if (p->npend == p->cap_pend) {
            size_t ncap = p->cap_pend ? p->cap_pend * 2 : 4;
            tpend *q = realloc(p->pend, ncap * sizeof *q);
            if (!q) {
                ps_errorf(why, why_len, "out of memory buffering a push of table %llu",
                    (unsigned long long)p->key);
                return PS_ENOMEM;
            }
            p->pend = q;
            p->cap_pend = ncap;
        }
        p->clock[rank] = step + 1;
        p->pend[p->npend++] = (tpend){rank, ids, n, g, hold};
        *kept = 1;
    }
    /* also when kept: the ranks before it may all be out of the live set */
    advance(t, p);
    return 0;
}

static int push_async(ps_tparts *t, tpart *p, int rank, int64_t step, int64_t m,
                      const uint64_t *ids, size_t n, const float *g, int *dup, char *why,
                      size_t why_len)
{
    if (step < p->clock[rank]) {
        *dup = 1;
        t->dups++;
        return 0;
    }
    int jump = p->jump && (p->jump[rank / 64] >> (rank % 64) & 1);
    if (step > p->clock[rank] && !jump) {
        ps_errorf(why, why_len, "push of step %lld to table %llu refused: worker %d has pushed "
            "%lld times to this partition, so its next step is %lld; a push may not skip steps",
            (long long)step, (unsigned long long)p->key, rank, (long long)p->clock[rank],
            (long long)p->clock[rank]);
        return PS_ESTATE;
    }
    ps_table_set_maker(p->store, rank);
    int rc = ps_table_push(p->store, ids, n, g, n * p->decl.dim, m, why, why_len);
    ps_table_set_maker(p->store, -1);
    if (rc)
        return rc;
    note_nonfinite(t, p);
    if (jump) {
        t->jumped += (uint64_t)(step - p->clock[rank]);
        p->jump[rank / 64] &= ~(1ull << (rank % 64));
        if (--p->njump == 0) {
            free(p->jump);
            p->jump = NULL;
        }
    }
    p->clock[rank] = step + m;
    t->updates += (uint64_t)m;
    timed_apply(t, p);
    if (p->nwait)
        wake(t, p);
    return 0;
}

int ps_tparts_push(ps_tparts *t, uint64_t key, int rank, int64_t step, int64_t m,
                   const uint64_t *ids, size_t n, const float *g, void *hold, int *kept,
                   int *dup, int64_t *version, char *why, size_t why_len)
{
    *kept = 0;
    *dup = 0;
    *version = 0;
    if (m < 1 || (m > 1 && t->cfg.mode != PS_MODE_ASYNC)) {
        ps_errorf(why, why_len, "a push summing %lld gradients: only async mode takes sums",
            (long long)m);
        return PS_EPROTO;
    }
    t->pushes += (uint64_t)m;
    tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    *version = ps_table_version(p->store);
    if (rank < 0 || rank >= t->cfg.num_workers || step < 0) {
        ps_errorf(why, why_len, "push needs a worker rank in [0, %d) and a step >= 0, got rank "
            "%d step %lld", t->cfg.num_workers, rank, (long long)step);
        return PS_EPROTO;
    }
    int rc = t->cfg.mode == PS_MODE_SYNC
                 ? push_sync(t, p, rank, step, ids, n, g, hold, kept, dup, why, why_len)
                 : push_async(t, p, rank, step, m, ids, n, g, dup, why, why_len);
    *version = ps_table_version(p->store);
    return rc;
}

void ps_tparts_set_live(ps_tparts *t, int rank, int live)
{
    int W = t->cfg.num_workers;
    live = live ? 1 : 0;
    if (rank < 0 || rank >= W || t->live[rank] == live)
        return;
    t->live[rank] = (uint8_t)live;
    for (size_t i = 0; i < t->n; i++) {
        tpart *p = t->parts[i];
        int64_t v = ps_table_version(p->store);
        if (live && t->cfg.mode == PS_MODE_SYNC) {
            /* join the open round unless the rank-order sum has passed it */
            int64_t c = v + (p->next_rank > rank ? 1 : 0);
            if (p->clock[rank] < c)
                p->clock[rank] = c;
        } else if (live) {
            /* as far as the slowest other live worker, so SSP does not wait on it */
            t->live[rank] = 0;
            int64_t m = min_clock(t, p);
            t->live[rank] = 1;
            if (m != INT64_MAX && p->clock[rank] < m)
                p->clock[rank] = m;
        } else if (t->cfg.mode == PS_MODE_SYNC) {
            advance(t, p);
        } else if (p->nwait) {
            wake(t, p);
        }
    }
}

void ps_tparts_set_elastic(ps_tparts *t)
{
    memset(t->live, 0, (size_t)t->cfg.num_workers);
}

void ps_tparts_join(ps_tparts *t, int rank, int64_t step)
{
    if (rank < 0 || rank >= t->cfg.num_workers || !t->live[rank] || step < 0)
        return;
    for (size_t i = 0; i < t->n; i++) {
        tpart *p = t->parts[i];
        if (p->clock[rank] >= step)
            continue;
        p->clock[rank] = step;
        if (t->cfg.mode == PS_MODE_SYNC)
            advance(t, p);
        else if (p->nwait)
            wake(t, p);
    }
}

/* ---- counters and checkpoints ---- */

int ps_tparts_clock(const ps_tparts *t, uint64_t key, int rank, int64_t *step, char *why,
                    size_t why_len)
{
    const tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    if (rank < 0 || rank >= t->cfg.num_workers) {
        ps_errorf(why, why_len, "clock of rank %d: ranks are 0..%d", rank,
            t->cfg.num_workers - 1);
        return PS_EPROTO;
    }
    *step = t->cfg.mode == PS_MODE_SYNC ? ps_table_version(p->store) : p->clock[rank];
    return 0;
}

int64_t ps_tparts_min_version(const ps_tparts *t, int *have)
{
    *have = t->n > 0;
    int64_t m = 0;
    for (size_t i = 0; i < t->n; i++) {
        int64_t v = ps_table_version(t->parts[i]->store);
        if (i == 0 || v < m)
            m = v;
    }
    return m;
}

void ps_tparts_stats(const ps_tparts *t, ps_stats *st)
{
    ps_stats add;
    memset(&add, 0, sizeof add);
    add.pushes = t->pushes;
    add.pulls = t->pulls;
    add.updates = t->updates;
    add.dup_dropped = t->dups;
    add.partitions = t->n;
    for (size_t i = 0; i < t->n; i++) {
        ps_table_counts c;
        ps_table_stats(t->parts[i]->store, &c);
        add.rows += c.rows;
        add.table_bytes += c.bytes;
        add.evicted += c.evicted;
        add.filtered += c.filtered_pulls + c.filtered_pushes;
        int64_t v = ps_table_version(t->parts[i]->store);
        if (i == 0 || v < add.min_version)
            add.min_version = v;
        if (i == 0 || v > add.max_version)
            add.max_version = v;
    }
    int have = st->chunks > 0 || st->partitions > 0;
    ps_stats_add(st, &have, &add);
}

uint64_t ps_tparts_fast_forwards(const ps_tparts *t) { return t->ff_rounds; }

uint64_t ps_tparts_jumped(const ps_tparts *t) { return t->jumped; }

const ps_tparts_config *ps_tparts_cfg(const ps_tparts *t) { return &t->cfg; }

size_t ps_tparts_open_rounds(const ps_tparts *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        n += t->parts[i]->next_rank > 0 || t->parts[i]->npend > 0;
    return n;
}

size_t ps_tparts_count(const ps_tparts *t) { return t->n; }

int ps_tparts_view(const ps_tparts *t, size_t i, ps_tpart_view *v)
{
    if (i >= t->n)
        return 0;
    const tpart *p = t->parts[i];
    *v = (ps_tpart_view){p->key, (uint32_t)t->cfg.part, &p->decl, ps_table_version(p->store),
                         p->clock, p->store, p->name};
    return 1;
}

int ps_tparts_restored(ps_tparts *t, uint64_t key, int64_t version, const int64_t *clock)
{
    return ps_tparts_set_restored(t, key, version, clock, 1);
}

int ps_tparts_set_restored(ps_tparts *t, uint64_t key, int64_t version, const int64_t *clock,
                           int lenient)
{
    tpart *p = find(t, key);
    if (!p)
        return PS_ENOTFOUND;
    ps_table_set_version(p->store, version);
    memcpy(p->clock, clock, (size_t)t->cfg.num_workers * sizeof *clock);
    p->ff_ok = lenient && t->cfg.mode == PS_MODE_SYNC;
    if (lenient && t->cfg.mode == PS_MODE_ASYNC && !p->jump) {
        /* the workers may be ahead of the checkpoint by the pushes the old
         * process acknowledged after it: each rank's first push may skip */
        int W = t->cfg.num_workers;
        size_t words = ((size_t)W + 63) / 64;
        if ((p->jump = calloc(words, sizeof *p->jump)) != NULL) {
            for (int r = 0; r < W; r++)
                p->jump[r / 64] |= 1ull << (r % 64);
            p->njump = W;
        }
    }
    return 0;
}

ps_table *ps_tparts_store(ps_tparts *t, uint64_t key)
{
    tpart *p = find(t, key);
    return p ? p->store : NULL;
}

int ps_tparts_table_counts(const ps_tparts *t, uint64_t key, ps_table_counts *out)
{
    tpart *p = find(t, key);
    if (!p)
        return PS_ENOTFOUND;
    ps_table_stats(p->store, out);
    return 0;
}

/* ---- what the I/O thread tells a table (server_msg.c) ---- */

void ps_tparts_set_name(ps_tparts *t, uint64_t key, const char *name)
{
    tpart *p = find(t, key);
    if (p && name[0])
        snprintf(p->name, sizeof p->name, "%s", name);
}

const char *ps_tparts_name(const ps_tparts *t, uint64_t key)
{
    tpart *p = find(t, key);
    return p && p->name[0] ? p->name : NULL;
}

int ps_tparts_set_opt(ps_tparts *t, uint64_t key, int64_t from, const ps_opt_config *opt)
{
    tpart *p = find(t, key);
    if (!p)
        return PS_ENOTFOUND;
    /* async: from the next push on */
    ps_table_set_opt(p->store, t->cfg.mode == PS_MODE_SYNC ? from : 0, opt);
    return 0;
}

int ps_tparts_assign(ps_tparts *t, uint64_t key, int rank, const uint64_t *ids, size_t n,
                     const float *rows, int64_t *version, char *why, size_t why_len)
{
    tpart *p = find_declared(t, key, why, why_len);
    if (!p)
        return PS_ENOTFOUND;
    ps_table_set_maker(p->store, rank);
    int rc = ps_table_assign(p->store, ids, n, rows, n * p->decl.dim, why, why_len);
    ps_table_set_maker(p->store, -1);
    *version = ps_table_version(p->store);
    return rc;
}
