/* The shard store's store half (shard.h; shard_internal.h says what the
 * halves share): the chunk table (open addressing), each chunk's weight
 * buffers and the pins replies in flight hold on them, the memory charged
 * for both, init, the lowest version kept incrementally, and the checkpoint
 * views (foreach, restore, optimizer state).  The consistency rules, which
 * change versions and clocks, are shard_rules.c. */
#include "shard_internal.h"

#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_error.h"
#include "ps_log.h"

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

chunk *shard_find(const ps_shard *s, uint64_t key, uint32_t c)
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

/* shard_find(), or NULL with why saying the chunk is not here. */
chunk *shard_find_initialized(const ps_shard *s, uint64_t key, uint32_t c, char *why,
                               size_t why_len)
{
    chunk *ch = shard_find(s, key, c);
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
void shard_version_raised(ps_shard *s, int64_t old)
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
    chunk *ch = shard_find(s, key, c);
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

/* The buffer new weights of ch go to: the current one when no reply holds
 * it; otherwise one no reply holds (ps_shard_pin made sure there is one),
 * which then becomes the current one: a reply in flight keeps exactly the
 * weights of the version it names. */
int shard_write_buffer(ps_shard *s, chunk *ch)
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


const float *ps_shard_weights(const ps_shard *s, uint64_t key, uint32_t c, size_t *n,
                              int64_t *version)
{
    chunk *ch = shard_find(s, key, c);
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
    chunk *ch = shard_find(s, key, c);
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
    ps_shard_counters(s, out);
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

int ps_shard_assign(ps_shard *s, uint64_t key, uint32_t c, const float *w, size_t n,
                    int64_t *version, char *why, size_t why_len)
{
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    *version = ch->version;
    if (n != ch->n) {
        ps_errorf(why, why_len, "assign of %zu elements to key %llu chunk %u, which has %zu", n,
            (unsigned long long)key, c, ch->n);
        return PS_EPROTO;
    }
    int dst = shard_write_buffer(s, ch); /* a reply in flight keeps the weights it names */
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
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
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
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
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

int ps_shard_view(const ps_shard *s, uint64_t key, uint32_t c, ps_shard_chunk_view *v,
                  int64_t *opt_step)
{
    const chunk *ch = shard_find(s, key, c);
    if (!ch)
        return PS_ENOTFOUND;
    *v = (ps_shard_chunk_view){ch->key,   ch->chunk, ch->n, ch->total, ch->version, ch->clock,
                               ch->w,     {ch->s0, ch->s1}, ps_opt_state_arrays(s->cfg.opt.kind)};
    *opt_step = ch->version - ch->t_base;
    return 0;
}

/* Recreate a chunk from v; lenient: as restored from a checkpoint (see
 * ps_shard_restore_chunk), else exactly as it was (a move). */
static int restore_chunk(ps_shard *s, const ps_shard_chunk_view *v, int lenient, chunk **out,
                         char *why, size_t why_len)
{
    int nstate = ps_opt_state_arrays(s->cfg.opt.kind);
    if (v->nstate != nstate) {
        ps_errorf(why, why_len, "key %llu chunk %u has %d optimizer state arrays; %s needs %d",
            (unsigned long long)v->key, v->chunk, v->nstate, ps_opt_name(s->cfg.opt.kind), nstate);
        return PS_EMISMATCH;
    }
    if (shard_find(s, v->key, v->chunk)) {
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
    ch->snap = lenient; /* restored: on disk already; moved: in no snapshot here yet */
    ch->ff_ok = lenient && s->cfg.mode == PS_MODE_SYNC;
    if (lenient && s->cfg.mode == PS_MODE_ASYNC) {
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
    *out = ch;
    return 0;
}

int ps_shard_restore_chunk(ps_shard *s, const ps_shard_chunk_view *v, char *why, size_t why_len)
{
    chunk *ch;
    return restore_chunk(s, v, 1, &ch, why, why_len);
}

int ps_shard_move_in(ps_shard *s, const ps_shard_chunk_view *v, int64_t opt_step, char *why,
                     size_t why_len)
{
    if (opt_step < 0) {
        ps_errorf(why, why_len, "key %llu chunk %u moved in at version %lld with optimizer step "
            "%lld: a step count is >= 0", (unsigned long long)v->key, v->chunk,
            (long long)v->version, (long long)opt_step);
        return PS_EMISMATCH;
    }
    chunk *ch;
    int rc = restore_chunk(s, v, 0, &ch, why, why_len);
    if (!rc)
        ch->t_base = v->version - opt_step;
    return rc;
}

/* Take ch out of the open-addressing table: the entries after it in its
 * probe run move back, so every other chunk is still found. */
static void unlink_chunk(ps_shard *s, chunk *ch)
{
    size_t mask = s->cap - 1, i = mix(ch->key, ch->chunk) & mask;
    while (s->table[i] != ch)
        i = (i + 1) & mask;
    s->table[i] = NULL;
    for (size_t j = (i + 1) & mask; s->table[j]; j = (j + 1) & mask) {
        chunk *o = s->table[j];
        size_t home = mix(o->key, o->chunk) & mask;
        /* o may move to the hole at i when its home is not in (i, j] */
        if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
            s->table[i] = o;
            s->table[j] = NULL;
            i = j;
        }
    }
    s->count--;
}

int ps_shard_remove_chunk(ps_shard *s, uint64_t key, uint32_t c, char *why, size_t why_len)
{
    chunk *ch = shard_find_initialized(s, key, c, why, why_len);
    if (!ch)
        return PS_ENOTFOUND;
    unlink_chunk(s, ch);
    s->st.chunks--;
    if (ch->version == s->minv && s->nat_min && --s->nat_min == 0)
        rescan_min(s);
    free_chunk(s, ch); /* the hooks answer what waits; pinned buffers stay to the last unpin */
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

int ps_shard_opt_kind(const ps_shard *s) { return s->cfg.opt.kind; }

size_t ps_shard_open_rounds(const ps_shard *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->cap; i++) {
        const chunk *ch = s->table[i];
        n += ch && (ch->next_rank > 0 || ch->npend > 0);
    }
    return n;
}

void ps_shard_mark_snapshot(ps_shard *s, uint64_t seq)
{
    for (size_t i = 0; i < s->cap; i++)
        if (s->table[i] && !s->table[i]->snap)
            s->table[i]->snap = seq;
}

void ps_shard_set_metrics(ps_shard *s, ps_metrics_hist *apply, ps_metrics_hist *round)
{
    s->m_apply = apply;
    s->m_round = round;
}

void ps_shard_set_recv(ps_shard *s, int64_t recv_ns) { s->recv_ns = recv_ns; }

void ps_shard_counters(const ps_shard *s, ps_stats *out)
{
    *out = s->st;
    out->bytes_out = out->errors = out->workers_seen = 0;
    out->min_version = out->max_version = 0;
}

void ps_shard_set_trace(ps_shard *s, ps_trace *t, int tid)
{
    s->trace = t;
    s->trace_tid = tid;
}
