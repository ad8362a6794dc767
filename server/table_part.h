/* The consistency rules of table partitions (DESIGN.md "Tables",
 * docs/PROTOCOL.md "Tables"), as server/shard.h is for chunks: every
 * partition one update thread owns, each a table store (server/table.h)
 * with per-worker clocks, the sync round in rank order, the SSP rule and
 * the pulls and acknowledgements that wait.  No sockets and no threads: one
 * ps_tparts belongs to one update thread and nothing in it is locked.
 *
 * A server splits each declared table into P partitions, one per update
 * thread (P = --threads): row (table, id) lives in partition
 * (h / S) mod P of server h mod S (common/ps_table_row.h), and update thread
 * p owns partition p of every table.  So this thread holds one partition of
 * each table declared, found by the table's key.
 *
 * Versions and clocks, per partition, exactly as a chunk's (shard.h): the
 * version counts sync rounds or async pushes (+ m for a sum of m); a
 * worker's clock counts its pushes there (step + 1 of the last).  Every live
 * worker pushes to every partition every step (a push of no rows when it
 * touched none there), so the rules of chunks hold unchanged:
 *  - sync: a push of step t is taken when t is the open round (t = version);
 *    below it, or a second one of the rank, is a duplicate (*dup = 1, not
 *    applied); beyond it PS_ESTATE (a restored partition fast-forwards once,
 *    as a chunk).  The round adds each rank's rows in rank order
 *    (ps_table_round_add: a push that comes before a lower rank's is KEPT
 *    until its turn) and is finished when every live rank is in: every row
 *    touched gets the sum of its rows in rank order divided by the pushes
 *    the round took; rows no push touched do not change.
 *  - async: a push of step s by a rank whose clock is c is applied at once
 *    when s = c (a sum of m gradients: one update with their mean, counted
 *    as m), a duplicate when s < c, refused when s > c (a restored
 *    partition takes each rank's first push beyond its clock).
 *  - a pull of version `want` is answered when version >= want (sync), or
 *    the slowest live worker's clock is >= want - k (SSP), or at once
 *    (async, k = -1); otherwise it waits (queued) until a push makes it true.
 *
 * Ownership (the hooks, as shard.h's):
 *  - push may KEEP the caller's push (a sync push before a lower rank's): it
 *    then sets *kept = 1 and reads ids and g until it calls
 *    hooks.release(user, hold, rc, why) once: rc 0 when the rows were added
 *    to the round; else the rows could not be added (PS_ETOOBIG, PS_ENOMEM:
 *    nothing of them is in the round, the rank's clock is back at the step,
 *    so a resend is taken) or the partition is being destroyed (PS_ECLOSED).
 *    A fast-forward releases its kept pushes with 0: their round is lost
 *    with the old process, as a chunk's.
 *  - pull and await may QUEUE a waiter (*queued = 1) and call exactly one of
 *    hooks.ready(user, waiter, version) (answer it now: the caller reads the
 *    rows with ps_tparts_rows inside the hook) or hooks.cancel at destroy;
 *    hooks.merge takes resends as ps_shard_set_merge does (*queued = 2).
 *  - Hooks run on the calling thread, from inside push, set_live or destroy,
 *    never while the waiter list is being walked.
 *
 * Memory: every table store charges the server's shared count
 * (--max-memory); a push or pull that would pass it is refused with
 * PS_ETOOBIG before it changes anything.  Kept pushes stay in the caller's
 * buffers (at most num_workers - 1 per partition); queued waiters are capped
 * per partition (PS_SHARD_MAX_WAITERS). */
#ifndef PS_TABLE_PART_H
#define PS_TABLE_PART_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_metrics.h"
#include "ps_proto.h"
#include "table.h"

typedef struct ps_tparts ps_tparts;

typedef struct ps_tparts_hooks {
    void *user;
    void (*release)(void *user, void *hold, int rc, const char *why);
    void (*ready)(void *user, void *waiter, int64_t version);
    void (*cancel)(void *user, void *waiter);
    int (*merge)(void *user, void *queued, void *incoming); /* NULL: no merging */
    /* A kept push's rows at the moment they go into the round (NULL: as
     * kept).  The caller may replace *g (a copy; NULL: the push adds no
     * rows, it still counts) or refuse it: an error code with why, and the
     * push is released with it, as one whose rows did not fit.  For rows the
     * sender can still write (the worker's arena), so that what is added is
     * what was checked. */
    int (*take)(void *user, void *hold, const float **g, size_t len, char *why, size_t why_len);
} ps_tparts_hooks;

typedef struct ps_tparts_config {
    int mode;          /* PS_MODE_SYNC or PS_MODE_ASYNC */
    int max_staleness; /* async: -1 unbounded, k >= 0 SSP; sync: 0 */
    int num_workers;
    int num_servers;   /* S, and the partitions of each table here (P): a row cap or */
    int nparts;        /* filter of the whole table is split over S x P partitions */
    int part;          /* the partition this thread owns (its index, < nparts) */
    uint64_t max_memory;         /* bytes, over everything sharing mem_used */
    _Atomic uint64_t *mem_used;  /* shared charge; NULL: a private counter */
    int guard;                   /* check the updates' results (ps_table_config.guard) */
    _Atomic uint64_t *worker_mem; /* rows charged to their makers (ps_table_config) */
    uint64_t worker_share;
    /* The server whose partition `part` (of `nparts`) this is: the rows it
     * holds are those ps_table_row_misplaced places on (home, part).  A
     * thread's own partitions: its server's rank.  A partition moved here
     * from server h (servers added and removed: server/move_records.h) lives
     * in a ps_tparts of its own with home h, part and nparts its home's
     * (num_servers: the job's base count, as everywhere). */
    int home;
} ps_tparts_config;

int ps_tparts_create(const ps_tparts_config *cfg, const ps_tparts_hooks *hooks, ps_tparts **out);
/* Cancel every queued waiter, release every kept push (PS_ECLOSED), free
 * every store.  NULL is fine. */
void ps_tparts_destroy(ps_tparts *t);

/* The store of one partition of table `key`, empty, from its declaration
 * (checked; normalized: ps_table_decl.h) and cfg: the row cap and filter of
 * one partition are ceil(ceil(whole / S) / P) (a filter at least 64 cells).
 * Made by the I/O thread when a table is declared (so that a refusal is
 * answered to the worker that declared it) and handed to the update thread;
 * it charges cfg->mem_used.  Errors: PS_EINVAL (a bad declaration),
 * PS_ETOOBIG (past max_memory), PS_ENOMEM; why says. */
int ps_tparts_make_store(const ps_tparts_config *cfg, uint64_t key, const ps_table_options *decl,
                         ps_table **out, char *why, size_t why_len);
/* Declare table `key` here with its store (ps_tparts_make_store's), which t
 * owns from now on (destroyed on failure).  A table declared already:
 * 0, the store is destroyed (the I/O thread compared the declarations).
 * PS_ENOMEM. */
int ps_tparts_adopt(ps_tparts *t, uint64_t key, const ps_table_options *decl, ps_table *store,
                    char *why, size_t why_len);
/* The declaration of table `key` here (normalized), or NULL. */
const ps_table_options *ps_tparts_decl(const ps_tparts *t, uint64_t key);

/* A push of `rank` at `step` to table `key`: n ids, n rows of the table's
 * dim in g (4-byte aligned), summing m >= 1 gradients (async only).  See
 * above for the rules and `hold`.  *version: the partition's version after
 * it.  Errors: PS_ENOTFOUND (no such table), PS_EPROTO (rank, step, m),
 * PS_ESTATE (beyond the round or the clock), PS_ETOOBIG / PS_ENOMEM (the
 * rows do not fit: nothing applied). */
int ps_tparts_push(ps_tparts *t, uint64_t key, int rank, int64_t step, int64_t m,
                   const uint64_t *ids, size_t n, const float *g, void *hold, int *kept,
                   int *dup, int64_t *version, char *why, size_t why_len);

/* The updates since the last call whose results were not finite (their
 * values kept; ps_table_take_nonfinite), in every partition here: *key the
 * first one's table.  A sync round's are those of the push (or the
 * set_live) that completed it. */
void ps_tparts_take_nonfinite(ps_tparts *t, uint64_t *key, ps_table_nonfinite *out);

/* A pull of version `want` of table `key`: *queued = 0 when it can be
 * answered now (then read the rows with ps_tparts_rows), else queued (1) or
 * merged into a queued resend (2).  Counted as a pull.  Errors:
 * PS_ENOTFOUND, PS_ETOOBIG (too many waiting). */
int ps_tparts_pull(ps_tparts *t, uint64_t key, int64_t want, void *waiter, int *queued,
                   int64_t *version, char *why, size_t why_len);
/* The same for a waiter that wants no rows (a sync push's acknowledgement
 * deferred until version `want` exists); not counted as a pull. */
int ps_tparts_await(ps_tparts *t, uint64_t key, int64_t want, void *waiter, int *queued,
                    int64_t *version, char *why, size_t why_len);
/* The current rows of ids[0..n) of table `key` into out (n x dim floats),
 * creating those missing (ps_table_pull), charged to worker `rank`'s
 * share.  Errors: PS_ENOTFOUND, PS_EPROTO (out_len), PS_ETOOBIG (past
 * --max-memory or the worker's share), PS_ENOMEM. */
int ps_tparts_rows(ps_tparts *t, uint64_t key, int rank, const uint64_t *ids, size_t n,
                   float *out, size_t out_len, char *why, size_t why_len);

/* The step `rank`'s next push to this partition of table `key` carries, as
 * ps_shard_clock's for a chunk: sync, the open round (the partition's
 * version); async, the rank's clock.  A restarted worker asks before its
 * first push (CLOCK), so none of its pushes is taken for a duplicate.
 * Errors: PS_ENOTFOUND, PS_EPROTO (rank). */
int ps_tparts_clock(const ps_tparts *t, uint64_t key, int rank, int64_t *step, char *why,
                    size_t why_len);

/* The live set (ps_shard_set_live's rules): a rank that is not live is
 * skipped by sync rounds and the SSP rule; dropping one may finish rounds
 * and answer waiters (hooks run). */
void ps_tparts_set_live(ps_tparts *t, int rank, int live);
/* A live rank's membership starts at step (ps_shard_join's rules). */
void ps_tparts_join(ps_tparts *t, int rank, int64_t step);
/* Right after create: no rank live until it joins (ps_shard_set_elastic). */
void ps_tparts_set_elastic(ps_tparts *t);

/* Lowest partition version here; *have = 0 when no table is declared. */
int64_t ps_tparts_min_version(const ps_tparts *t, int *have);
/* Counters added to st: pushes, pulls, updates, dup_dropped (bytes_in is the
 * caller's); partitions, rows, table_bytes, evicted, filtered; the version
 * range widened over the partitions. */
void ps_tparts_stats(const ps_tparts *t, ps_stats *st);
/* --metrics-port: time updates and sync rounds as ps_shard_set_metrics does;
 * NULL, NULL: off (the default). */
void ps_tparts_set_metrics(ps_tparts *t, ps_metrics_hist *apply, ps_metrics_hist *round);
/* The receipt (ps_now_ns) of the request handled next; 0: not known. */
void ps_tparts_set_recv(ps_tparts *t, int64_t recv_ns);
/* Rounds skipped by fast-forwards, and async steps skipped by first pushes,
 * since a restore (as ps_shard_fast_forwards and ps_shard_jumped). */
uint64_t ps_tparts_fast_forwards(const ps_tparts *t);
uint64_t ps_tparts_jumped(const ps_tparts *t);
/* What it was made with. */
const ps_tparts_config *ps_tparts_cfg(const ps_tparts *t);
/* Sync: partitions whose open round holds a push (ps_shard_open_rounds). */
size_t ps_tparts_open_rounds(const ps_tparts *t);

/* ---- checkpoints ---- */

/* One partition as a checkpoint sees it; pointers valid until the next call
 * that changes t. */
typedef struct ps_tpart_view {
    uint64_t key;
    uint32_t part;          /* its partition index (the owning thread's) */
    const ps_table_options *decl; /* normalized */
    int64_t version;
    const int64_t *clock;   /* num_workers entries */
    ps_table *store;        /* read it with table.h's foreach, deleted, filter */
    const char *name;       /* the table's name (ps_tparts_set_name), "" none */
} ps_tpart_view;

/* The number of partitions (tables) here, and partition i (in declaration
 * order); 0 when i is out of range. */
size_t ps_tparts_count(const ps_tparts *t);
int ps_tparts_view(const ps_tparts *t, size_t i, ps_tpart_view *v);

/* After a restore put the rows of table `key` back into its store: its
 * version and clocks (sync: the partition may fast-forward once; async:
 * each rank's first push may skip, as ps_shard_restore_chunk's).
 * PS_ENOTFOUND when the table is not declared here. */
int ps_tparts_restored(ps_tparts *t, uint64_t key, int64_t version, const int64_t *clock);

/* The same, lenient 0: exactly as they were (a partition moved here, taken
 * where no round of it held a push): no fast-forward, no jumped first
 * pushes.  ps_tparts_restored is lenient 1. */
int ps_tparts_set_restored(ps_tparts *t, uint64_t key, int64_t version, const int64_t *clock,
                           int lenient);

/* Remove table `key`'s partition from t (it moves to another server): its
 * queued waiters go to hooks.cancel and its kept pushes to hooks.release
 * with rc and reason (the caller's hooks answer them: set what they answer
 * with beforehand), then its store is freed (its memory charge given back).
 * t's counters keep what it did.  PS_ENOTFOUND (why says). */
int ps_tparts_remove(ps_tparts *t, uint64_t key, int rc, const char *reason, char *why,
                     size_t why_len);

/* dst's live set becomes src's (a moved-in ps_tparts made on a thread whose
 * workers came and went already); before dst holds any table. */
void ps_tparts_copy_live(ps_tparts *dst, const ps_tparts *src);

/* The store of table `key` here (a restore fills it), or NULL. */
ps_table *ps_tparts_store(ps_tparts *t, uint64_t key);

/* The table's counters here (its partition's store). */
int ps_tparts_table_counts(const ps_tparts *t, uint64_t key, ps_table_counts *out);

/* ---- what the I/O thread tells a table ---- */

/* The table's name for logs (a worker's declaration gave it; "" none). */
void ps_tparts_set_name(ps_tparts *t, uint64_t key, const char *name);
/* Its name, or NULL when it has none (or no such table). */
const char *ps_tparts_name(const ps_tparts *t, uint64_t key);
/* New hyper-parameters of table `key` (a HYPER of its key): sync, for the
 * rounds from step `from` on; async, from the next push on (ps_table_set_opt).
 * PS_ENOTFOUND. */
int ps_tparts_set_opt(ps_tparts *t, uint64_t key, int64_t from, const ps_opt_config *opt);
/* Set rows of table `key` (a SASSIGN of worker `rank`, charged the rows it
 * makes: ps_table_assign); *version: the partition's.  Errors:
 * PS_ENOTFOUND, PS_ETOOBIG, PS_ENOMEM. */
int ps_tparts_assign(ps_tparts *t, uint64_t key, int rank, const uint64_t *ids, size_t n,
                     const float *rows, int64_t *version, char *why, size_t why_len);

#endif
