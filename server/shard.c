#include "shard.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"

typedef struct pending {
    int rank;
    const float *g;
    void *hold;
} pending;

typedef struct waiter {
    void *ctx;
    int64_t want;
} waiter;

typedef struct chunk {
    uint64_t key;
    uint32_t chunk;
    size_t n;
    uint64_t total;
    int64_t version;   /* updates applied: sync rounds done, async pushes applied */
    float *w, *s0, *s1; /* weights and optimizer state, in one aligned block */
    float *sum;        /* sync: rank-order sum of the open round */
    int next_rank;     /* sync: ranks below it are in sum */
    int64_t *clock;    /* per worker: pushes received (step + 1 of the last one) */
    pending *pend;     /* sync: pushes of the open round that came before a lower rank's */
    size_t npend, cap_pend;
    waiter *wait;      /* pulls that cannot be answered yet, in arrival order */
    size_t nwait, cap_wait;
    uint64_t charge;   /* bytes charged to mem_used */
} chunk;

struct ps_shard {
    ps_shard_config cfg;
    ps_shard_hooks hooks;
    _Atomic uint64_t own_mem; /* used when cfg.mem_used is NULL */
    chunk **table;            /* open addressing, cap a power of two */
    size_t cap, count;
    ps_stats st;
};

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
    if (!why || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

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
        cfg->opt.kind < PS_OPT_SGD || cfg->opt.kind > PS_OPT_KIND_MAX)
        return PS_EINVAL;
    ps_shard *s = calloc(1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
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
    free(ch->w);
    free(ch->clock);
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
    free(s);
}

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

int ps_shard_init(ps_shard *s, uint64_t key, uint32_t c, const void *vals, size_t n,
                  uint64_t total, int64_t *version, char *why, size_t why_len)
{
    s->st.inits++;
    s->st.bytes_in += n * sizeof(float);
    chunk *ch = find(s, key, c);
    if (ch) {
        if (ch->n != n || ch->total != total) {
            say(why, why_len,
                "key %llu chunk %u is registered with n=%zu tot=%llu; this init has n=%zu "
                "tot=%llu",
                (unsigned long long)key, c, ch->n, (unsigned long long)ch->total, n,
                (unsigned long long)total);
            return PS_EMISMATCH;
        }
        *version = ch->version;
        return 0;
    }
    if (n == 0 || (total && n > total)) {
        say(why, why_len, "init of key %llu chunk %u: n=%zu must be in [1, tot=%llu]",
            (unsigned long long)key, c, n, (unsigned long long)total);
        return PS_EPROTO;
    }
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    int sync = s->cfg.mode == PS_MODE_SYNC;
    size_t seg = round64(n * sizeof(float));
    size_t arrays = (size_t)(1 + nstate + sync);
    uint64_t charge = sizeof(chunk) + 2 * sizeof(chunk *) + (uint64_t)s->cfg.num_workers * 8 +
                      (uint64_t)seg * arrays;
    uint64_t before = atomic_fetch_add(mem(s), charge);
    if (before + charge > s->cfg.max_memory) {
        atomic_fetch_sub(mem(s), charge);
        say(why, why_len,
            "init of key %llu chunk %u needs %llu bytes; %llu of %llu bytes (--max-memory) in use",
            (unsigned long long)key, c, (unsigned long long)charge, (unsigned long long)before,
            (unsigned long long)s->cfg.max_memory);
        return PS_ETOOBIG;
    }
    ch = calloc(1, sizeof *ch);
    float *block = aligned_alloc(64, seg * arrays);
    int64_t *clock = calloc((size_t)s->cfg.num_workers, sizeof *clock);
    if (ch) {
        ch->key = key;
        ch->chunk = c;
    }
    if (!ch || !block || !clock || insert(s, ch) != 0) {
        free(ch);
        free(block);
        free(clock);
        atomic_fetch_sub(mem(s), charge);
        say(why, why_len, "out of memory registering key %llu chunk %u (%zu elements)",
            (unsigned long long)key, c, n);
        return PS_ENOMEM;
    }
    memset((char *)block + seg, 0, seg * (arrays - 1));
    memcpy(block, vals, n * sizeof(float));
    ch->n = n;
    ch->total = total;
    ch->w = block;
    size_t per = seg / sizeof(float);
    ch->s0 = nstate >= 1 ? block + per : NULL;
    ch->s1 = nstate >= 2 ? block + 2 * per : NULL;
    ch->sum = sync ? block + (size_t)(1 + nstate) * per : NULL;
    ch->clock = clock;
    ch->charge = charge;
    s->st.chunks++;
    *version = 0;
    return 0;
}

static int64_t min_clock(const ps_shard *s, const chunk *ch)
{
    int64_t m = ch->clock[0];
    for (int r = 1; r < s->cfg.num_workers; r++)
        if (ch->clock[r] < m)
            m = ch->clock[r];
    return m;
}

static int can_answer(const ps_shard *s, const chunk *ch, int64_t want)
{
    if (s->cfg.mode == PS_MODE_SYNC)
        return ch->version >= want;
    if (s->cfg.max_staleness < 0)
        return 1;
    return min_clock(s, ch) >= want - s->cfg.max_staleness;
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

static void apply(ps_shard *s, chunk *ch, const float *g)
{
    ps_opt_apply(&s->cfg.opt, ch->w, ch->s0, ch->s1, g, ch->n, ch->version + 1);
    ch->version++;
    s->st.updates++;
}

static void accumulate(chunk *ch, const float *restrict g)
{
    float *restrict sum = ch->sum;
    size_t n = ch->n;
    if (ch->next_rank == 0)
        memcpy(sum, g, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            sum[i] = sum[i] + g[i];
    ch->next_rank++;
}

static void finish_round(ps_shard *s, chunk *ch)
{
    float *restrict sum = ch->sum;
    float nw = (float)s->cfg.num_workers;
    for (size_t i = 0; i < ch->n; i++)
        sum[i] = sum[i] / nw;
    apply(s, ch, sum);
    ch->next_rank = 0;
}

int ps_shard_push(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t step, const float *g,
                  size_t n, void *hold, int *kept, int *dup, int64_t *version, char *why,
                  size_t why_len)
{
    *kept = 0;
    *dup = 0;
    s->st.pushes++;
    s->st.bytes_in += n * sizeof(float);
    chunk *ch = find(s, key, c);
    if (!ch) {
        say(why, why_len, "key %llu chunk %u is not initialized on this server (init it first)",
            (unsigned long long)key, c);
        return PS_ENOTFOUND;
    }
    *version = ch->version;
    if (n != ch->n) {
        say(why, why_len, "push of %zu elements to key %llu chunk %u, which has %zu", n,
            (unsigned long long)key, c, ch->n);
        return PS_EPROTO;
    }
    if (rank < 0 || rank >= s->cfg.num_workers || step < 0) {
        say(why, why_len,
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
        ch->clock[rank] = step + 1;
        apply(s, ch, g);
        if (ch->nwait)
            wake(s, ch);
        *version = ch->version;
        return 0;
    }
    /* sync */
    if (step > ch->version) {
        say(why, why_len,
            "push for step %lld of key %llu chunk %u, but round %lld is still open (wait for it)",
            (long long)step, (unsigned long long)key, c, (long long)ch->version);
        return PS_ESTATE;
    }
    if (step < ch->version || ch->clock[rank] > step) {
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
                say(why, why_len, "out of memory buffering a push");
                return PS_ENOMEM;
            }
            ch->pend = p;
            ch->cap_pend = ncap;
        }
        ch->pend[ch->npend++] = (pending){rank, g, hold};
        *kept = 1;
        return 0;
    }
    accumulate(ch, g);
    for (size_t i = 0; i < ch->npend;) {
        if (ch->pend[i].rank == ch->next_rank) {
            pending p = ch->pend[i];
            ch->pend[i] = ch->pend[--ch->npend];
            accumulate(ch, p.g);
            s->hooks.release(s->hooks.user, p.hold);
            i = 0; /* the next rank may sit anywhere */
        } else {
            i++;
        }
    }
    if (ch->next_rank == s->cfg.num_workers) {
        finish_round(s, ch);
        if (ch->nwait)
            wake(s, ch);
    }
    *version = ch->version;
    return 0;
}

int ps_shard_pull(ps_shard *s, uint64_t key, uint32_t c, int rank, int64_t want, void *ctx,
                  int *queued, const float **w, size_t *n, int64_t *version, char *why,
                  size_t why_len)
{
    (void)rank;
    *queued = 0;
    s->st.pulls++;
    chunk *ch = find(s, key, c);
    if (!ch) {
        say(why, why_len, "key %llu chunk %u is not initialized on this server (init it first)",
            (unsigned long long)key, c);
        return PS_ENOTFOUND;
    }
    if (can_answer(s, ch, want)) {
        *w = ch->w;
        *n = ch->n;
        *version = ch->version;
        return 0;
    }
    size_t limit = PS_SHARD_MAX_WAITERS(s->cfg.num_workers);
    if (ch->nwait >= limit) {
        say(why, why_len, "%zu pulls already wait on key %llu chunk %u (limit %zu)", ch->nwait,
            (unsigned long long)key, c, limit);
        return PS_ETOOBIG;
    }
    if (ch->nwait == ch->cap_wait) {
        size_t ncap = ch->cap_wait ? ch->cap_wait * 2 : 4;
        waiter *p = realloc(ch->wait, ncap * sizeof *p);
        if (!p) {
            say(why, why_len, "out of memory queueing a pull");
            return PS_ENOMEM;
        }
        ch->wait = p;
        ch->cap_wait = ncap;
    }
    ch->wait[ch->nwait++] = (waiter){ctx, want};
    *queued = 1;
    return 0;
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
