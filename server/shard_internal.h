/* What the two halves of the shard store share (shard.h has the contract):
 *   shard.c        the store: the chunk table, weight buffers and their pins,
 *                  memory, init, the lowest version, checkpoint views
 *   shard_rules.c  the consistency rules: pushes (sync rounds in rank order,
 *                  async clocks), pulls that wait (SSP, the open round),
 *                  live ranks, hyper-parameter changes by round
 * Calls go one way, from the rules to the store.  Only those two files
 * include this. */
#ifndef PS_SHARD_INTERNAL_H
#define PS_SHARD_INTERNAL_H

#include "shard.h"

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

static inline float *wbuf_data(wbuf *b) { return (float *)((char *)b + WBUF_HDR); }

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
    int divided;       /* sync: sum already holds their mean (the last one divided) */
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
    int64_t round_t0;  /* sync, with metrics: the receipt of the open round's first push;
                          0: none yet */
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
    ps_shard_nonfinite nf;    /* results not finite, not yet taken */
    /* --metrics-port: where applies and sync rounds are timed (ps_shard_set_metrics;
     * NULL: off), and the receipt of the request being handled */
    ps_metrics_hist *m_apply, *m_round;
    int64_t recv_ns;
};

/* The chunk (key, c), or NULL. */
chunk *shard_find(const ps_shard *s, uint64_t key, uint32_t c);
/* shard_find(), or NULL with why saying the chunk is not here. */
chunk *shard_find_initialized(const ps_shard *s, uint64_t key, uint32_t c, char *why,
                              size_t why_len);
/* The index in ch->buf of the buffer new weights of ch go to; the caller
 * makes it the current one (ch->cur, ch->w). */
int shard_write_buffer(ps_shard *s, chunk *ch);
/* A chunk's version went up from `old` (the shard's lowest version follows). */
void shard_version_raised(ps_shard *s, int64_t old);

#endif
