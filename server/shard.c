#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

typedef struct pending {
    int rank;
    const float *g;
    void *hold;
} pending;

typedef struct waiter {
    void *ctx;
    int64_t want;
} waiter;

/* A weight buffer: this header, then the data at WBUF_HDR (64-byte aligned).
 * refs is 1 for the chunk that holds it plus 1 per pin (a pull reply in
 * flight, ps_shard_pin); whoever drops the last reference frees it, on any
 * thread.  Buffer 0 of a chunk also holds the optimizer state and the sync
 * sum after the weights (never sent, so only the weights are ever pinned). */
typedef struct wbuf {
    _Atomic unsigned refs;
} wbuf;

#define WBUF_HDR 64

static float *wbuf_data(wbuf *b) { return (float *)((char *)b + WBUF_HDR); }

static wbuf *wbuf_new(size_t bytes)
{
    /* C11 aligned_alloc: the size must be a multiple of the alignment */
    wbuf *b = aligned_alloc(64, (WBUF_HDR + bytes + 63) & ~(size_t)63);
    if (b)
        atomic_init(&b->refs, 1);
    return b;
}

static void wbuf_unref(wbuf *b)
{
    if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

/* Does a reply still hold b?  Only the owner thread adds references, so a
 * buffer seen unpinned stays unpinned until it pins it; acquire: the reply's
 * reads of the data happen before the owner writes it again. */
static int wbuf_pinned(wbuf *b)
{
    return atomic_load_explicit(&b->refs, memory_order_acquire) > 1;
}

typedef struct chunk {
    uint64_t key;
    uint32_t chunk;
    size_t n;
    uint64_t total;
    int64_t version;   /* updates applied: sync rounds done, async pushes applied */
    float *w;          /* the current weights: wbuf_data(buf[cur]) */
    float *s0, *s1;    /* optimizer state, in buf[0] after its weights */
    wbuf *buf[PS_SHARD_MAX_WBUF]; /* weight buffers: buf[0] at creation, spares on demand */
    int nbuf, cur;
    float *sum;        /* sync: rank-order sum of the open round */
    int next_rank;     /* sync: ranks below it are in sum or were skipped (not live) */
    int ncontrib;      /* sync: gradients in sum */
    int nskipped;      /* sync: pushes of the round that carried no gradient (skipped) */
    int ff_ok;         /* sync, restored: may fast-forward until its first round */
    int64_t *clock;    /* per worker: pushes received (step + 1 of the last one) */
    uint64_t *jump;    /* async, restored: bit r set while rank r has not pushed since
                          the restore (its first push may be beyond its clock); NULL
                          once every rank has */
    int njump;         /* bits still set */
    pending *pend;     /* sync: pushes of the open round that came before a lower rank's */
    size_t npend, cap_pend;
    waiter *wait;      /* pulls that cannot be answered yet, in arrival order */
    size_t nwait, cap_wait;
    uint64_t charge;   /* bytes charged to mem_used */
    uint64_t snap;     /* the first checkpoint snapshot that held it; 0 none yet */
    int64_t t_base;    /* the optimizer's step count is version - t_base (a loaded
                          optimizer state sets it: ps_shard_set_state) */
} chunk;

/* A change of the hyper-parameters (ps_shard_set_opt) that sync rounds from
 * `from` on use. */
typedef struct opt_change {
    int64_t from;
    ps_opt_config cfg;
} opt_change;

struct ps_shard {
    ps_shard_config cfg;
    ps_shard_hooks hooks;
    _Atomic uint64_t own_mem; /* used when cfg.mem_used is NULL */
    chunk **table;            /* open addressing, cap a power of two */
    size_t cap, count;
    ps_stats st;
    uint8_t *live;            /* per rank: counted in rounds and the SSP rule */
    int64_t minv;             /* lowest chunk version, and how many chunks have it */
    size_t nat_min;
    uint64_t ff_rounds;
    uint64_t jumped;          /* async, restored: steps skipped by first pushes */
    ps_trace *trace;
    int trace_tid;
    int (*merge)(void *user, void *queued, void *incoming);
    uint64_t spares, spare_bytes, pin_copies; /* see ps_shard_buffer_counts */
    float *mean;              /* async: the mean of a push that sums several gradients */
    size_t mean_cap;
    /* sync: changes for rounds to come, by `from`; cfg.opt is what rounds
     * before the first use (a change every chunk has passed is folded in) */
    opt_change sched[PS_SHARD_MAX_OPT_CHANGES];
    int nsched;
};

static uint64_t mix(uint64_t key, uint32_t c)
{
    uint64_t x = key ^ ((uint64_t)c * 0x9e3779b97f4a7c15ull);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static chunk *find(const ps_shard *s, uint64_t key, uint32_t c)
{
    if (!s->cap)
        return NULL;
    for (size_t i = mix(key, c) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        chunk *ch = s->table[i];
        if (!ch)
            return NULL;
        if (ch->key == key && ch->chunk == c)
            return ch;
    }
}

/* find(), or NULL with why saying the chunk is not here. */
static chunk *find_initialized(const ps_shard *s, uint64_t key, uint32_t c, char *why,
                               size_t why_len)
{
    chunk *ch = find(s, key, c);
    if (!ch)
        ps_errorf(why, why_len,
            "key %llu chunk %u is not initialized on this server (init it first)",
            (unsigned long long)key, c);
    return ch;
}

static int insert(ps_shard *s, chunk *ch)
{
    if ((s->count + 1) * 2 > s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        chunk **t = calloc(ncap, sizeof *t);
        if (!t)
            return PS_ENOMEM;
        for (size_t j = 0; j < s->cap; j++) {
            chunk *o = s->table[j];
            if (!o)
                continue;
            size_t i = mix(o->key, o->chunk) & (ncap - 1);
            while (t[i])
                i = (i + 1) & (ncap - 1);
            t[i] = o;
        }
        free(s->table);
        s->table = t;
        s->cap = ncap;
    }
    size_t i = mix(ch->key, ch->chunk) & (s->cap - 1);
    while (s->table[i])
        i = (i + 1) & (s->cap - 1);
    s->table[i] = ch;
    s->count++;
    return 0;
}

static _Atomic uint64_t *mem(ps_shard *s)
{
    return s->cfg.mem_used ? s->cfg.mem_used : &s->own_mem;
}

int ps_shard_create(const ps_shard_config *cfg, const ps_shard_hooks *hooks, ps_shard **out)
{
    *out = NULL;
    if (cfg->num_workers < 1 || (cfg->mode != PS_MODE_SYNC && cfg->mode != PS_MODE_ASYNC) ||
        !ps_opt_kind_valid(cfg->opt.kind) ||
        (cfg->opt.kind == PS_OPT_AVERAGE && cfg->mode != PS_MODE_SYNC))
        return PS_EINVAL;
    ps_shard *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    s->live = malloc((size_t)cfg->num_workers);
    if (!s->live) {
        free(s);
        return PS_ENOMEM;
    }
    memset(s->live, 1, (size_t)cfg->num_workers);
    s->cfg = *cfg;
    if (cfg->mode == PS_MODE_SYNC)
        s->cfg.max_staleness = 0;
    s->hooks = *hooks;
    atomic_init(&s->own_mem, 0);
    *out = s;
    return 0;
}

static void free_chunk(ps_shard *s, chunk *ch)
{
    for (size_t i = 0; i < ch->nwait; i++)
        if (s->hooks.cancel)
            s->hooks.cancel(s->hooks.user, ch->wait[i].ctx);
    for (size_t i = 0; i < ch->npend; i++)
        if (s->hooks.release)
            s->hooks.release(s->hooks.user, ch->pend[i].hold);
    atomic_fetch_sub(mem(s), ch->charge);
    /* a buffer a reply in flight still holds is freed by that reply's release */
    for (int i = 0; i < ch->nbuf; i++)
        wbuf_unref(ch->buf[i]);
    free(ch->clock);
    free(ch->jump);
    free(ch->pend);
    free(ch->wait);
    free(ch);
}

void ps_shard_destroy(ps_shard *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->cap; i++)
        if (s->table[i])
            free_chunk(s, s->table[i]);
    free(s->table);
    free(s->live);
    free(s->mean);
    free(s);
}

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

/* ---- lowest version, kept incrementally ---- */

static void rescan_min(ps_shard *s)
{
    s->nat_min = 0;
    s->minv = 0;
    for (size_t i = 0; i < s->cap; i++) {
        const chunk *ch = s->table[i];
        if (!ch)
            continue;
        if (!s->nat_min || ch->version < s->minv) {
            s->minv = ch->version;
            s->nat_min = 1;
        } else if (ch->version == s->minv) {
            s->nat_min++;
        }
    }
}

/* A chunk's version went up from `old`. */
static void version_raised(ps_shard *s, int64_t old)
{
    if (old == s->minv && s->nat_min && --s->nat_min == 0)
        rescan_min(s);
}

/* A chunk was added with version v (s->count already counts it). */
static void chunk_added(ps_shard *s, int64_t v)
{
    if (s->count == 1 || v < s->minv) {
        s->minv = v;
        s->nat_min = 1;
    } else if (v == s->minv) {
        s->nat_min++;
    }
}

/* Charge bytes to the shared memory count unless that passes max_memory:
 * 1 charged, 0 not (*before: what was in use). */
static int charge_mem(ps_shard *s, uint64_t bytes, uint64_t *before)
{
    *before = atomic_fetch_add(mem(s), bytes);
    if (*before + bytes <= s->cfg.max_memory)
        return 1;
    atomic_fetch_sub(mem(s), bytes);
    return 0;
}

static size_t spare_charge(const chunk *ch) { return WBUF_HDR + round64(ch->n * sizeof(float)); }

/* A buffer of ch other than the current one that no reply holds, or -1. */
static int free_buffer(const chunk *ch)
{
    for (int i = 0; i < ch->nbuf; i++)
        if (i != ch->cur && !wbuf_pinned(ch->buf[i]))
            return i;
    return -1;
}

/* One more weight buffer for ch (at most PS_SHARD_MAX_WBUF), charged like
 * the rest of the chunk.  force: even past max_memory (the last resort of
 * apply).  Its index, or -1 when it cannot have one. */
static int add_spare(ps_shard *s, chunk *ch, int force)
{
    if (ch->nbuf == PS_SHARD_MAX_WBUF)
        return -1;
    uint64_t bytes = spare_charge(ch), before;
    if (force)
        atomic_fetch_add(mem(s), bytes);
    else if (!charge_mem(s, bytes, &before))
        return -1;
    wbuf *b = wbuf_new(ch->n * sizeof(float));
    if (!b) {
        atomic_fetch_sub(mem(s), bytes);
        return -1;
    }
    ch->charge += bytes;
    ch->buf[ch->nbuf] = b;
    s->spares++;
    s->spare_bytes += bytes;
    ps_debug("key %llu chunk %u: weight buffer %d of at most %d allocated (%llu bytes), "
             "as pull replies in flight hold the others (%llu spare buffers so far on this "
             "thread)", (unsigned long long)ch->key, ch->chunk, ch->nbuf + 1, PS_SHARD_MAX_WBUF,
             (unsigned long long)bytes, (unsigned long long)s->spares);
    return ch->nbuf++;
}

/* Give back the spare weight buffers no reply holds (an init is short of
 * memory).  buf[0] stays (it holds the optimizer state); when the current
 * weights are in a spare and no reply holds buf[0], they are copied back into
 * it first.  While a reply holds the current weights, one free buffer stays
 * for the next update.  1 when anything was freed. */
static int reclaim_spares(ps_shard *s)
{
    int freed = 0;
    for (size_t t = 0; t < s->cap; t++) {
        chunk *ch = s->table[t];
        if (!ch || ch->nbuf == 1)
            continue;
        if (ch->cur != 0 && !wbuf_pinned(ch->buf[0])) {
            float *w0 = wbuf_data(ch->buf[0]);
            memcpy(w0, ch->w, ch->n * sizeof(float));
            ch->w = w0;
            ch->cur = 0;
        }
        int keep = wbuf_pinned(ch->buf[ch->cur]);
        for (int i = ch->nbuf - 1; i >= 1; i--) {
            if (i == ch->cur || wbuf_pinned(ch->buf[i]))
                continue;
            if (keep) {
                keep = 0;
                continue;
            }
            uint64_t bytes = spare_charge(ch);
            wbuf_unref(ch->buf[i]);
            for (int k = i; k + 1 < ch->nbuf; k++)
                ch->buf[k] = ch->buf[k + 1];
            ch->nbuf--;
            if (ch->cur > i)
                ch->cur--;
            ch->charge -= bytes;
            atomic_fetch_sub(mem(s), bytes);
            freed = 1;
        }
    }
    return freed;
}

/* Allocate, charge and insert a chunk of n elements (values not set). */
static int create_chunk(ps_shard *s, uint64_t key, uint32_t c, size_t n, uint64_t total,
                        chunk **out, char *why, size_t why_len)
{
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    int sync = s->cfg.mode == PS_MODE_SYNC;
    size_t seg = round64(n * sizeof(float));
    size_t arrays = (size_t)(1 + nstate + sync);
    uint64_t charge = sizeof(chunk) + 2 * sizeof(chunk *) + (uint64_t)s->cfg.num_workers * 8 +
                      WBUF_HDR + (uint64_t)seg * arrays;
    uint64_t before;
    if (!charge_mem(s, charge, &before) &&
        !(reclaim_spares(s) && charge_mem(s, charge, &before))) {
        ps_errorf(why, why_len,
            "init of key %llu chunk %u needs %llu bytes; %llu of %llu bytes (--max-memory) in use",
            (unsigned long long)key, c, (unsigned long long)charge, (unsigned long long)before,
            (unsigned long long)s->cfg.max_memory);
        return PS_ETOOBIG;
    }
    chunk *ch = calloc(1, sizeof *ch);
    wbuf *b0 = wbuf_new(seg * arrays);
    float *block = b0 ? wbuf_data(b0) : NULL;
    int64_t *clock = calloc((size_t)s->cfg.num_workers, sizeof *clock);
    if (ch) {
        ch->key = key;
        ch->chunk = c;
    }
    if (!ch || !block || !clock || insert(s, ch) != 0) {
        free(ch);
        free(b0);
        free(clock);
        atomic_fetch_sub(mem(s), charge);
        ps_errorf(why, why_len, "out of memory registering key %llu chunk %u (%zu elements)",
            (unsigned long long)key, c, n);
        return PS_ENOMEM;
    }
    memset((char *)block + seg, 0, seg * (arrays - 1));
    ch->n = n;
    ch->total = total;
    ch->w = block;
    ch->buf[0] = b0;
    ch->nbuf = 1;
    ch->cur = 0;
    size_t per = seg / sizeof(float);
    ch->s0 = nstate >= 1 ? block + per : NULL;
    ch->s1 = nstate >= 2 ? block + 2 * per : NULL;
    ch->sum = sync ? block + (size_t)(1 + nstate) * per : NULL;
    ch->clock = clock;
    ch->charge = charge;
    *out = ch;
    return 0;
}

int ps_shard_init(ps_shard *s, uint64_t key, uint32_t c, const void *vals, size_t n,
                  uint64_t total, int64_t *version, uint64_t *snap, char *why, size_t why_len)
{
    uint64_t no_snap;
    if (!snap)
        snap = &no_snap;
    s->st.inits++;
    *snap = 0;
    s->st.bytes_in += n * sizeof(float);
    chunk *ch = find(s, key, c);
    if (ch) {
        if (ch->n != n || ch->total != total) {
            ps_errorf(why, why_len,
                "key %llu chunk %u is registered with n=%zu tot=%llu; this init has n=%zu "
                "tot=%llu",
                (unsigned long long)key, c, ch->n, (unsigned long long)ch->total, n,
                (unsigned long long)total);
            return PS_EMISMATCH;
        }
        *version = ch->version;
        *snap = ch->snap;
        return 0;
    }
    if (n == 0 || (total && n > total)) {
        ps_errorf(why, why_len, "init of key %llu chunk %u: n=%zu must be in [1, tot=%llu]",
            (unsigned long long)key, c, n, (unsigned long long)total);
        return PS_EPROTO;
    }
    int rc = create_chunk(s, key, c, n, total, &ch, why, why_len);
    if (rc)
        return rc;
    memcpy(ch->w, vals, n * sizeof(float));
    s->st.chunks++;
    chunk_added(s, 0);
    *version = 0;
    return 0;
}

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

/* The buffer new weights of ch go to: the current one when no reply holds
 * it; otherwise one no reply holds (ps_shard_pin made sure there is one),
 * which then becomes the current one: a reply in flight keeps exactly the
 * weights of the version it names. */
static int write_buffer(ps_shard *s, chunk *ch)
{
    int dst = ch->cur;
    if (wbuf_pinned(ch->buf[ch->cur])) {
        dst = free_buffer(ch);
        if (dst < 0) /* not reached: a pin leaves a free buffer */
            dst = add_spare(s, ch, 1);
        if (dst < 0) {
            ps_error("key %llu chunk %u: out of memory for a weight buffer; updating the "
                     "weights a pull reply is sending", (unsigned long long)ch->key, ch->chunk);
            dst = ch->cur;
        }
    }
    return dst;
}

/* One update, into write_buffer's buffer. */
/* One update with gradient g, which sums m pushes (async: a worker's
 * accumulated gradients; else 1): the version and the update count go up by
 * m, and the optimizer's step count t is that of the last of them. */
static void apply(ps_shard *s, chunk *ch, const float *g, int64_t m)
{
    int64_t t0 = s->trace ? ps_now_ns() : 0;
    int dst = write_buffer(s, ch);
    float *out = wbuf_data(ch->buf[dst]);
    /* sync: the round's hyper-parameters (ps_shard_set_opt) */
    ps_opt_apply_to(opt_of_round(s, ch->version), ch->w, out, ch->s0, ch->s1, g, ch->n,
                    ch->version + m - ch->t_base);
    ch->cur = dst;
    ch->w = out;
    ch->version += m;
    s->st.updates += (uint64_t)m;
    version_raised(s, ch->version - m);
    if (s->trace)
        ps_trace_event(s->trace, "apply", "update", s->trace_tid, t0, ps_now_ns(), ch->version,
                       -1);
}

/* g NULL: the rank's push of the round was skipped (--on-nonfinite skip):
 * it takes its turn and adds nothing. */
static void accumulate(chunk *ch, const float *restrict g)
{
    float *restrict sum = ch->sum;
    size_t n = ch->n;
    if (!g) {
        ch->nskipped++;
        ch->next_rank++;
        return;
    }
    if (ch->ncontrib == 0)
        memcpy(sum, g, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            sum[i] = sum[i] + g[i];
    ch->ncontrib++;
    ch->next_rank++;
}

static void finish_round(ps_shard *s, chunk *ch)
{
    float *restrict sum = ch->sum;
    /* the mean over the gradients summed: every worker's, or the live ones'
     * after a worker was dropped */
    float nw = (float)ch->ncontrib;
    for (size_t i = 0; i < ch->n; i++)
        sum[i] = sum[i] / nw;
    apply(s, ch, sum, 1);
    ch->next_rank = 0;
    ch->ncontrib = 0;
    ch->ff_ok = 0;
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
            accumulate(ch, p.g);
            s->hooks.release(s->hooks.user, p.hold);
        } else if (!s->live[r]) {
            ch->next_rank++;
        } else {
            return;
        }
    }
    if (ch->ncontrib == 0 && ch->nskipped == 0) { /* nobody live: nothing to apply, start over */
        ch->next_rank = 0;
        return;
    }
    if (ch->ncontrib == 0) { /* every gradient was skipped: the round ends, unchanged */
        ch->version++;
        version_raised(s, ch->version - 1);
        ch->next_rank = 0;
        ch->ff_ok = 0;
    } else {
        finish_round(s, ch);
    }
    ch->nskipped = 0;
    if (ch->nwait)
        wake(s, ch);
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
    ch->nskipped = 0;
    int64_t old = ch->version;
    s->ff_rounds += (uint64_t)(step - old);
    ch->version = step;
    for (int r = 0; r < s->cfg.num_workers; r++)
        if (ch->clock[r] < step)
            ch->clock[r] = step;
    version_raised(s, old);
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
    chunk *ch = find_initialized(s, key, c, why, why_len);
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
        accumulate(ch, g);
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
    chunk *ch = find_initialized(s, key, c, why, why_len);
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
    chunk *ch = find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    int rc = answer_or_queue(s, ch, want, ctx, queued, why, why_len);
    *version = ch->version;
    return rc;
}

const float *ps_shard_weights(const ps_shard *s, uint64_t key, uint32_t c, size_t *n,
                              int64_t *version)
{
    chunk *ch = find(s, key, c);
    if (!ch)
        return NULL;
    if (n)
        *n = ch->n;
    if (version)
        *version = ch->version;
    return ch->w;
}

const float *ps_shard_pin(ps_shard *s, uint64_t key, uint32_t c, const float *w, void **ref)
{
    *ref = NULL;
    chunk *ch = find(s, key, c);
    if (!ch || w != ch->w)
        return NULL;
    wbuf *cur = ch->buf[ch->cur];
    /* the first pin of these weights: the next update must find a free buffer */
    if (!wbuf_pinned(cur) && free_buffer(ch) < 0 && add_spare(s, ch, 0) < 0) {
        s->pin_copies++;
        if ((s->pin_copies & (s->pin_copies - 1)) == 0) /* 1, 2, 4, ...: rate-limited */
            ps_debug("key %llu chunk %u: every weight buffer (%d) is held by pull replies in "
                     "flight or --max-memory is reached: this reply is a copy (%llu so far on "
                     "this thread)", (unsigned long long)key, c, ch->nbuf,
                     (unsigned long long)s->pin_copies);
        return NULL;
    }
    atomic_fetch_add_explicit(&cur->refs, 1, memory_order_relaxed);
    *ref = cur;
    return w;
}

void ps_shard_unpin(void *ref) { wbuf_unref(ref); }

void ps_shard_buffer_counts(const ps_shard *s, uint64_t *spares, uint64_t *spare_bytes,
                            uint64_t *copies)
{
    *spares = s->spares;
    *spare_bytes = s->spare_bytes;
    *copies = s->pin_copies;
}

void ps_shard_stats(const ps_shard *s, ps_stats *out)
{
    *out = s->st;
    out->bytes_out = out->errors = out->workers_seen = 0;
    out->min_version = out->max_version = 0;
    int first = 1;
    for (size_t i = 0; i < s->cap; i++) {
        const chunk *ch = s->table[i];
        if (!ch)
            continue;
        if (first || ch->version < out->min_version)
            out->min_version = ch->version;
        if (first || ch->version > out->max_version)
            out->max_version = ch->version;
        first = 0;
    }
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

int ps_shard_assign(ps_shard *s, uint64_t key, uint32_t c, const float *w, size_t n,
                    int64_t *version, char *why, size_t why_len)
{
    chunk *ch = find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    *version = ch->version;
    if (n != ch->n) {
        ps_errorf(why, why_len, "assign of %zu elements to key %llu chunk %u, which has %zu", n,
            (unsigned long long)key, c, ch->n);
        return PS_EPROTO;
    }
    int dst = write_buffer(s, ch); /* a reply in flight keeps the weights it names */
    float *out = wbuf_data(ch->buf[dst]);
    memcpy(out, w, n * sizeof(float));
    ch->cur = dst;
    ch->w = out;
    s->st.bytes_in += n * sizeof(float);
    return 0;
}

int ps_shard_get_state(ps_shard *s, uint64_t key, uint32_t c, const float *state[2],
                       int *nstate, size_t *n, int64_t *opt_step, char *why, size_t why_len)
{
    chunk *ch = find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    state[0] = ch->s0;
    state[1] = ch->s1;
    *nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    *n = ch->n;
    *opt_step = ch->version - ch->t_base;
    return 0;
}

int ps_shard_set_state(ps_shard *s, uint64_t key, uint32_t c, const float *planes, size_t count,
                       int64_t opt_step, int64_t *version, char *why, size_t why_len)
{
    chunk *ch = find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    *version = ch->version;
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    if (nstate == 0 || count != ch->n * (size_t)nstate || opt_step < -1) {
        ps_errorf(why, why_len, "state of %zu floats at step %lld for key %llu chunk %u: %s "
            "keeps %d array(s) of %zu, and the step is >= -1", count, (long long)opt_step,
            (unsigned long long)key, c, ps_opt_name(s->cfg.opt.kind), nstate, ch->n);
        return PS_EPROTO;
    }
    memcpy(ch->s0, planes, ch->n * sizeof(float));
    if (nstate >= 2)
        memcpy(ch->s1, planes + ch->n, ch->n * sizeof(float));
    if (opt_step >= 0)
        ch->t_base = ch->version - opt_step;
    s->st.bytes_in += count * sizeof(float);
    return 0;
}

int ps_shard_clock(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t *step, char *why,
                   size_t why_len)
{
    chunk *ch = find_initialized(s, key, c, why, why_len);
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

void ps_shard_foreach(const ps_shard *s, void (*fn)(void *arg, const ps_shard_chunk_view *v),
                      void *arg)
{
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    for (size_t i = 0; i < s->cap; i++) {
        const chunk *ch = s->table[i];
        if (!ch)
            continue;
        ps_shard_chunk_view v = {ch->key, ch->chunk, ch->n, ch->total, ch->version, ch->clock,
                                 ch->w, {ch->s0, ch->s1}, nstate};
        fn(arg, &v);
    }
}

int ps_shard_restore_chunk(ps_shard *s, const ps_shard_chunk_view *v, char *why, size_t why_len)
{
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    if (v->nstate != nstate) {
        ps_errorf(why, why_len, "key %llu chunk %u has %d optimizer state arrays; %s needs %d",
            (unsigned long long)v->key, v->chunk, v->nstate, ps_opt_name(s->cfg.opt.kind), nstate);
        return PS_EMISMATCH;
    }
    if (find(s, v->key, v->chunk)) {
        ps_errorf(why, why_len, "key %llu chunk %u is there twice", (unsigned long long)v->key,
            v->chunk);
        return PS_EMISMATCH;
    }
    if (v->n == 0 || v->version < 0) {
        ps_errorf(why, why_len, "key %llu chunk %u: n=%zu, version %lld",
            (unsigned long long)v->key, v->chunk, v->n, (long long)v->version);
        return PS_EMISMATCH;
    }
    chunk *ch;
    int rc = create_chunk(s, v->key, v->chunk, v->n, v->total, &ch, why, why_len);
    if (rc)
        return rc;
    memcpy(ch->w, v->w, v->n * sizeof(float));
    if (nstate >= 1)
        memcpy(ch->s0, v->state[0], v->n * sizeof(float));
    if (nstate >= 2)
        memcpy(ch->s1, v->state[1], v->n * sizeof(float));
    memcpy(ch->clock, v->clock, (size_t)s->cfg.num_workers * sizeof(int64_t));
    ch->version = v->version;
    ch->snap = 1; /* on disk already */
    ch->ff_ok = s->cfg.mode == PS_MODE_SYNC;
    if (s->cfg.mode == PS_MODE_ASYNC) {
        /* the workers may be ahead of the checkpoint by the pushes the old
         * process acknowledged after it: each rank's first push may skip */
        int W = s->cfg.num_workers;
        size_t words = ((size_t)W + 63) / 64;
        if ((ch->jump = calloc(words, sizeof *ch->jump)) != NULL) {
            for (int r = 0; r < W; r++)
                ch->jump[r / 64] |= 1ull << (r % 64);
            ch->njump = W;
        }
    }
    s->st.chunks++;
    chunk_added(s, ch->version);
    return 0;
}

void ps_shard_count_narrow(ps_shard *s, size_t n, size_t elem_bytes)
{
    s->st.bytes_in -= n * (sizeof(float) - elem_bytes);
}

void ps_shard_add_counters(ps_shard *s, const ps_stats *b)
{
    int have = 1; /* the shard's version range is its chunks' (ps_shard_stats) */
    ps_stats_add(&s->st, &have, b);
}

int64_t ps_shard_min_version(const ps_shard *s, int *have)
{
    *have = s->count > 0;
    return s->count ? s->minv : 0;
}

uint64_t ps_shard_fast_forwards(const ps_shard *s) { return s->ff_rounds; }

uint64_t ps_shard_jumped(const ps_shard *s) { return s->jumped; }

void ps_shard_mark_snapshot(ps_shard *s, uint64_t seq)
{
    for (size_t i = 0; i < s->cap; i++)
        if (s->table[i] && !s->table[i]->snap)
            s->table[i]->snap = seq;
}

void ps_shard_set_merge(ps_shard *s, int (*merge)(void *user, void *queued, void *incoming))
{
    s->merge = merge;
}

void ps_shard_set_trace(ps_shard *s, ps_trace *t, int tid)
{
    s->trace = t;
    s->trace_tid = tid;
}
