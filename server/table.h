/* The table store: the rows of one embedding table that one server holds
 * (DESIGN.md "Tables"), beside the dense chunks of server/shard.h.  No
 * sockets and no threads here: one ps_table belongs to one update thread and
 * nothing in it is locked (the caller guarantees it).
 *
 * A table has rows of `dim` float32 values addressed by any uint64 id (hashed
 * features: no vocabulary, no range).  A row is created on its first pull,
 * and on a push to an id that has no row (an async push to an id never
 * pulled; a row evicted or lost between a pull and the push), with the
 * values of the initializer (below), so a row is the same on every server,
 * in every run and after every restart.
 *
 * Layout: an open-addressing hash (linear probing, at most 3/4 full) of
 * 4-byte entries, each the row's slot + 1 with the row's dirty bit on top;
 * the rows in slabs, each row record the 8-byte id followed by its values
 * and its optimizer state arrays side by side; adam's per-row update counts
 * (and, in capped tables, the 32-bit links of the LRU list) in arrays beside
 * each slab.  Slabs are allocated as the table grows (16 rows, then doubling
 * up to about 2 MiB each), never one per row; slots stay dense (0 .. rows-1:
 * an evicted row's slot goes to the new row).  Beyond the values and the
 * optimizer state a row costs its id (8 bytes) and its share of the hash
 * (4 bytes / load, 5.3 to 8 bytes): at most 16 bytes (a capped table adds 12
 * for its LRU links and the row's maker), plus the unused part of the last
 * slab.  (Adam's count,
 * 4 bytes, is optimizer state: ps_table_row_bytes counts it.)
 *
 * Memory: every allocation that grows with the rows (slabs, the hash, the
 * round's sums, the deletion list, the filter) is charged to *mem_used
 * (shared by every shard and table of a server, atomically) before it is
 * made, and an operation that would pass max_memory is refused with
 * PS_ETOOBIG before it changes anything (the deletion list alone is charged
 * but never refused: an eviction cannot wait).  A request's scratch (8
 * bytes per id) is charged too, and given back after a request of more
 * than 65536 ids.  A request's duplicate ids are one row: the rows it may
 * create are counted once each.
 *
 * Updates (the optimizer: ps_table_config.opt), only ever on rows touched:
 *  - async: ps_table_push applies each gradient row on arrival;
 *  - sync: ps_table_round_add takes each contributing worker's push in rank
 *    order and ps_table_round_finish applies, to every row touched, the sum
 *    of its gradient rows in rank order (the first contributor's row copied,
 *    the next ones added, as server/shard.c) divided by the number of
 *    pushes in the round, as the dense path divides.
 *
 * With cfg.guard (--on-nonfinite refuse and skip) every update's results
 * are checked in the kernel's pass: a value whose new value or state would
 * not be finite keeps its old ones, noted for ps_table_take_nonfinite.
 *
 * Initializer: a pure function of (seed, table, id, element index i), the
 * formula of common/ps_table_row.h (ps_table_init_row), which libps, the
 * local tables of ps_worker and python/ps/table_init.py share.
 * The optimizer state of a new row is zero.
 *
 * Optional per table:
 *  - a row cap (max_rows): creating a row in a full table first evicts the
 *    least recently touched row, exactly (an intrusive doubly linked list of
 *    32-bit slots; a pull, a push or a restore touches a row; with
 *    passive_pulls a pull does not).  Set it well
 *    above the rows of a request or a round: a row evicted between a pull and
 *    its push comes back with the initializer's values before the update;
 *  - a frequency filter (min_count N >= 2, as Monolith's): an id gets a row
 *    at its Nth pull (sighting); before that a pull returns the initializer's
 *    values and creates nothing, and a gradient row for it is dropped.  The
 *    sightings are counted in a counting Bloom filter of filter_cells one-byte
 *    cells (3 cells per id, conservative update, saturating at 255): an id's
 *    count is never below its true number of sightings, so it is never
 *    admitted late, but it may be admitted early when all its 3 cells are
 *    shared with ids seen often (with n ids seen and m cells, at most about
 *    (1 - e^(-3n/m))^3 of the ids, e.g. 1.5% with n = m/10; fewer in
 *    practice, as the shared counts must also reach N).  The filter never
 *    forgets: size it for the ids a run sees.
 *
 * Checkpoints: ps_table_foreach visits the rows with values, state and
 * counts (all of them, or those changed since ps_table_mark_clean: a dirty
 * bit per row); ps_table_deleted lists the ids evicted or removed since that
 * mark, for an incremental checkpoint; ps_table_restore_row and
 * ps_table_remove put rows back exactly.
 *
 * Ownership: the table copies everything it keeps; pointers it returns (row
 * views, the deletion list, the filter cells) are valid until the next call
 * that changes it. */
#ifndef PS_TABLE_H
#define PS_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"
#include "table_opt.h"

typedef struct ps_table ps_table;

/* The initializer kinds (enum ps_table_init) and PS_TABLE_OPT_FTRL are
 * ps_types.h's; ps_table_state_arrays, ps_table_opt_name and the FTRL
 * kernel table_opt.h's. */

/* Rows per table and server at most (a hash entry holds slot + 1 in 31 bits). */
#define PS_TABLE_MAX_ROWS 0x7fffffffull
#define PS_TABLE_MAX_DIM 65536
/* Frequency filter cells when filter_cells is 0. */
#define PS_TABLE_FILTER_CELLS 4194304u

typedef struct ps_table_config {
    uint64_t table;     /* the table's key: an input of the initializer */
    uint32_t dim;       /* floats per row, 1 .. PS_TABLE_MAX_DIM */
    int init;           /* enum ps_table_init (ps_types.h) */
    float init_scale;   /* uniform: a; normal: the standard deviation s (>= 0) */
    uint64_t seed;
    /* kind: sgd, momentum, nesterov, adagrad, adam (lazy: a row's bias
     * correction counts that row's updates) or PS_TABLE_OPT_FTRL; lr is
     * FTRL's alpha; lr decay follows the table's version (its updates);
     * weight decay reaches only the rows touched */
    ps_opt_config opt;
    float ftrl_beta, ftrl_l1, ftrl_l2; /* FTRL's beta, l1 and l2, each >= 0 */
    uint64_t max_rows;      /* 0: no cap; else evict the least recently touched */
    int full_refuse;        /* capped: refuse (PS_ETOOBIG) what would make a row in a full
                               table instead of evicting one */
    uint32_t min_count;     /* frequency filter: 0 or 1 off; N <= 255: a row at the Nth pull */
    uint32_t filter_cells;  /* its size in cells (bytes); 0: PS_TABLE_FILTER_CELLS */
    /* A pull creates no row and touches none (a missing row's values are the
     * initializer's; the filter still counts the sighting): rows are created
     * and touched by updates alone.  For a capped table in sync mode, whose
     * LRU order would otherwise follow the order the workers' pulls arrive
     * in, and its evictions with it: with it the order follows the rounds,
     * and a run is repeatable. */
    int passive_pulls;
    /* Check every update's results (--on-nonfinite refuse and skip): a value
     * whose new value or optimizer state would be NaN or +-Inf keeps its old
     * ones (ps_opt_apply_checked, server/optimizer.h), and the update is noted for
     * ps_table_take_nonfinite.  0 (--on-nonfinite apply): applied as computed. */
    int guard;
    uint64_t max_memory;        /* bytes, over everything sharing mem_used */
    _Atomic uint64_t *mem_used; /* shared charge; NULL: a private counter */
    /* Per-worker shares (NULL: none): each row is charged to the worker
     * whose pull or push made it (ps_table_set_maker; a sync round's rows
     * to the rank whose push brought the id), num_workers counters shared
     * by every table of the server, each at most worker_share bytes; a
     * request that would pass its worker's share is refused (PS_ETOOBIG)
     * before it changes anything.  See table_hash.h "Makers". */
    _Atomic uint64_t *worker_mem;
    int num_workers;
    uint64_t worker_share;
} ps_table_config;

/* Counters of one table. */
typedef struct ps_table_counts {
    uint64_t rows;            /* rows that exist */
    uint64_t bytes;           /* bytes charged now (ps_table_row_bytes: the rows' own part) */
    uint64_t created;         /* rows created: first pulls, pushes, restores */
    uint64_t evicted;         /* rows evicted by the row cap */
    uint64_t filtered_pulls;  /* ids pulled that the filter had not admitted (initializer values) */
    uint64_t filtered_pushes; /* gradient rows dropped: no row, id not admitted (sync: one per
                                 row and round) */
    uint64_t pulled;          /* ids pulled */
    uint64_t pushed;          /* gradient rows received (async pushes, sync round adds) */
    uint64_t updated;         /* row updates applied */
    uint64_t rounds;          /* sync rounds finished */
    uint64_t lookups, probes; /* hash lookups and the entries they compared */
    uint64_t slots;           /* rows the slabs hold: rows and room for more */
    uint64_t hash_entries;    /* entries of the hash (4 bytes each) */
} ps_table_counts;

/* PS_EINVAL, with why naming the field, its range and the value, when a
 * field is out of range (dim, init, scale, optimizer kind and
 * hyper-parameters, FTRL's, max_rows, min_count, filter_cells); else 0. */
int ps_table_check_config(const ps_table_config *cfg, char *why, size_t why_len);

/* A new empty table (cfg checked as above; PS_ETOOBIG when the filter does
 * not fit in max_memory).  The table keeps a copy of cfg. */
int ps_table_create(const ps_table_config *cfg, ps_table **out, char *why, size_t why_len);
/* Free everything and give its charge back.  NULL is fine. */
void ps_table_destroy(ps_table *t);
const ps_table_config *ps_table_get_config(const ps_table *t);

/* The initializer's values of row id (dim floats into out):
 * ps_table_init_row with cfg's seed, table, kind and scale. */
void ps_table_initial_row(const ps_table_config *cfg, uint64_t id, float *out);

/* The worker the next pulls and pushes are for (their new rows are charged
 * to its share); -1: nobody (restores). */
void ps_table_set_maker(ps_table *t, int rank);

/* Values of the rows of ids[0..n) into out (out_len floats: n * dim): rows
 * that do not exist are created (when the filter admits the id; else out
 * gets the initializer's values).  Every row pulled is touched.
 * Errors: PS_EPROTO (out_len is not n * dim), PS_ETOOBIG (the rows to create
 * do not fit; nothing changed, the filter's counts included), PS_ENOMEM. */
int ps_table_pull(ps_table *t, const uint64_t *ids, size_t n, float *out, size_t out_len,
                  char *why, size_t why_len);

/* Async: apply one push of n gradient rows (g: g_len = n * dim floats,
 * 4-byte aligned) to the rows of ids, each on its own row, in order; a row
 * missing is created unless the filter has not admitted its id (then the
 * gradient row is dropped and counted).  m >= 1: each gradient row sums m
 * gradients (a worker's accumulated pushes, as ps_shard_push_sum): the
 * update uses g * (1.0f / m), counts m updates of the row (adam's t) and
 * raises the table's version by m.  An id twice in one push is updated
 * twice.  Errors: PS_EPROTO (g_len, m), PS_ETOOBIG (nothing changed),
 * PS_ENOMEM. */
int ps_table_push(ps_table *t, const uint64_t *ids, size_t n, const float *g, size_t g_len,
                  int64_t m, char *why, size_t why_len);

/* ---- sync rounds ----
 * A round collects one push per contributing worker, IN RANK ORDER (a push
 * that arrives before a lower rank's waits with the caller, as shard.c keeps
 * it), each a list of ids with one gradient row each (n may be 0: a worker
 * that touched no row still contributes).  The table copies the rows into
 * its own sums, per id in order of first appearance: the first contributor's
 * row copied, the next ones added (an id twice in one push is added too).
 * ps_table_round_finish then updates every row touched with its sum divided
 * by the number of pushes the round took (float division, as shard.c), in
 * order of first appearance, creating rows as ps_table_push does; rows no
 * push touched do not change.  So a round is bitwise repeatable.
 *
 * round_add errors (nothing added): PS_ESTATE (rank not above the last rank
 * added in this round, or negative), PS_EPROTO (g_len is not n * dim),
 * PS_ETOOBIG (the sums, or the rows the round would create, do not fit:
 * round_add reserves both, so round_finish cannot fail), PS_ENOMEM. */
int ps_table_round_add(ps_table *t, int rank, const uint64_t *ids, size_t n, const float *g,
                       size_t g_len, char *why, size_t why_len);
/* Apply the open round (see above), raise the version by one and start the
 * next round.  A round no push was added to changes nothing (as shard.c
 * when no worker is live). */
void ps_table_round_finish(ps_table *t);
/* Drop the open round's sums (a restore, a fast-forward). */
void ps_table_round_cancel(ps_table *t);
/* Pushes in the open round, and the last rank added (-1: none). */
int ps_table_round_contributors(const ps_table *t, int *last_rank);

/* New hyper-parameters (opt: complete; its kind is the table's whatever it
 * says) for the updates after version `from`: the sync round that makes
 * version from + 1 and every later one; 0 (or a version reached already):
 * from the next update on.  A table holds 8 changes not due yet; a ninth
 * makes the oldest take effect now. */
void ps_table_set_opt(ps_table *t, int64_t from, const ps_opt_config *opt);

/* Set the values of the rows of ids[0..n) (distinct) to rows (len = n * dim
 * floats): rows missing are made (whatever the filter says), their optimizer
 * state and count zeroed; touched and dirty; the rows made are charged to
 * the worker of ps_table_set_maker as a pull's.  Errors: PS_EPROTO (len),
 * PS_ETOOBIG (the rows to make do not fit the table, its worker's share or
 * a full=refuse cap: nothing changed), PS_ENOMEM. */
int ps_table_assign(ps_table *t, const uint64_t *ids, size_t n, const float *rows, size_t len,
                    char *why, size_t why_len);

/* The row updates since the last call whose results were not finite (the
 * table's guard kept those values; see ps_table_config.guard): how many,
 * the values kept, and the first row's id. */
typedef struct ps_table_nonfinite {
    uint64_t rows;
    uint64_t values;
    uint64_t id;
} ps_table_nonfinite;
void ps_table_take_nonfinite(ps_table *t, ps_table_nonfinite *out);

/* Updates applied: sync rounds finished, or async pushes (m each).  The
 * learning-rate decay of update t uses ps_opt_lr_at(opt, t). */
int64_t ps_table_version(const ps_table *t);
void ps_table_set_version(ps_table *t, int64_t version);

/* ---- rows as checkpoints see them ---- */
typedef struct ps_table_row_view {
    uint64_t id;
    uint32_t dim;
    int nstate;            /* ps_table_state_arrays(kind) */
    const float *w;        /* dim values */
    const float *state[2]; /* nstate arrays of state_len floats (adam: m, v; ftrl: z, n;
                              row-wise adagrad: its one float) */
    uint32_t count;        /* adam: the row's updates (its t, saturating); else 0 */
    uint32_t state_len;    /* floats per state array: dim (row-wise adagrad: 1); a view
                              given to ps_table_restore_row has the table's */
} ps_table_row_view;

/* Read-only look at one row (no touch, nothing created): 1 and *v filled
 * when it exists, else 0. */
int ps_table_get_row(const ps_table *t, uint64_t id, ps_table_row_view *v);

enum { PS_TABLE_ROWS_ALL = 0, PS_TABLE_ROWS_DIRTY = 1 };
/* Call fn for every row (ALL; in a capped table from the least to the most
 * recently touched, so restoring them in this order restores the LRU order;
 * else in slot order) or for the rows changed since the last
 * ps_table_mark_clean (DIRTY: created, updated or restored since; in hash
 * order).  fn must not change the table. */
void ps_table_foreach(const ps_table *t, int which,
                      void (*fn)(void *arg, const ps_table_row_view *v), void *arg);
/* Ids of the rows evicted or removed since the last ps_table_mark_clean (a
 * row deleted and created again is in both lists: apply an incremental
 * checkpoint's deletions first, then its rows).  Recorded only once
 * ps_table_mark_clean was called (the first checkpoint is a full one).
 * NULL (*n = 0) when one could not be recorded (out of memory, logged): the
 * next checkpoint must then be a full one. */
const uint64_t *ps_table_deleted(const ps_table *t, size_t *n);
/* A checkpoint holds every change so far: clear the dirty bits and the
 * deletion list, and record deletions from now on.  After restoring a chain
 * of checkpoints, call it so that the next delta holds only later changes. */
void ps_table_mark_clean(ps_table *t);
/* Can the next checkpoint hold only what changed (the dirty rows and the
 * deletion list) since the last ps_table_mark_clean?  0 before the first
 * mark (every row must go in: rows evicted before it were not recorded) and
 * after a deletion could not be recorded. */
int ps_table_delta_ok(const ps_table *t);
/* Make row id the most recently touched (a capped table; else nothing):
 * touching every row in a checkpoint's LRU order restores that order.  0
 * when there is no such row. */
int ps_table_touch(ps_table *t, uint64_t id);

/* Put a row back from a checkpoint: created (whatever the filter says;
 * evicting in a full capped table) or overwritten, with v's values, state
 * and count; touched and dirty.  Errors: PS_EMISMATCH (dim or nstate differ
 * from the table's), PS_ETOOBIG, PS_ENOMEM. */
int ps_table_restore_row(ps_table *t, const ps_table_row_view *v, char *why, size_t why_len);
/* Room for `rows` rows more than the table holds, made now (before
 * restoring a checkpoint's record: its rows come in the hash order of the
 * table that wrote them, which a hash of the same function that grows as
 * they come packs into one long run, every insertion probing all of it;
 * at its final size the probes stay short).  PS_ETOOBIG, PS_ENOMEM. */
int ps_table_reserve(ps_table *t, uint64_t rows, char *why, size_t why_len);
/* Delete row id (an incremental checkpoint's deletion): 1 when it existed, 0
 * when not.  Recorded in the deletion list like an eviction. */
int ps_table_remove(ps_table *t, uint64_t id);

/* The frequency filter's cells (NULL, 0 without a filter), for checkpoints,
 * and putting them back (PS_EMISMATCH when n differs). */
const uint8_t *ps_table_filter_cells(const ps_table *t, size_t *n);
int ps_table_restore_filter(ps_table *t, const uint8_t *cells, size_t n, char *why,
                            size_t why_len);

void ps_table_stats(const ps_table *t, ps_table_counts *out);
/* Add base counters (restored from a checkpoint) to the cumulative ones
 * (created, evicted, filtered, pulled, pushed, updated, rounds). */
void ps_table_add_counters(ps_table *t, const ps_table_counts *base);
/* Set the cumulative counters to c's (restored from a checkpoint, after the
 * rows: what restoring them counted is forgotten); the lookups, probes and
 * what describes memory are not set. */
void ps_table_set_counters(ps_table *t, const ps_table_counts *c);
/* Bytes of one row's values, optimizer state and update count: what a row
 * needs anyway; ps_table_stats' bytes less rows times this is the store's
 * overhead. */
size_t ps_table_row_bytes(const ps_table *t);

#endif
