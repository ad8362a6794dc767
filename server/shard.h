/* The shard store: the chunks one update thread owns, with their versions,
 * per-worker clocks, optimizer state and the consistency rules of
 * docs/PROTOCOL.md "Semantics".  No sockets and no threads here: one ps_shard
 * belongs to one thread and nothing in it is locked.
 * (shard.c holds the chunks, shard_rules.c the rules over them.)
 *
 * Ownership:
 *  - The shard owns each chunk's weights, optimizer state and sync sum.
 *  - ps_shard_push may KEEP the caller's gradient (a sync push that arrived
 *    before a lower rank's push of the same round).  It then sets *kept = 1
 *    and reads g until it calls hooks.release(user, hold) once; the caller
 *    must keep g valid and unchanged until then.  When *kept = 0 the shard
 *    has finished with g when the call returns.
 *  - ps_shard_pull may QUEUE the caller's waiter (sync: the round is not done;
 *    SSP: the slowest worker is too far behind).  It then sets *queued = 1 and
 *    later calls exactly one of hooks.ready(user, waiter, ...) (answer it now;
 *    w is valid only during the call unless ps_shard_pin pins it) or
 *    hooks.cancel(user, waiter) (at destroy).  The waiter pointer is opaque to
 *    the shard.
 *  - Weights sent without a copy: ps_shard_pin takes a reference on the
 *    buffer of a chunk's current weights (a pull reply sends them from there);
 *    until ps_shard_unpin drops it (from any thread) no update writes that
 *    buffer.  An update of a chunk whose current buffer is pinned is applied
 *    out of place into another of its weight buffers (at most
 *    PS_SHARD_MAX_WBUF; spares are allocated when first needed and kept),
 *    which becomes the current one.  A pinned buffer outlives
 *    ps_shard_destroy until its last pin is dropped.
 *  - Hooks run on the calling thread, from inside push or destroy.
 *
 * Memory: each new chunk is charged to *mem_used (shared by every shard of a
 * server, atomically) and refused with PS_ETOOBIG when the total would pass
 * max_memory.  The charge covers the chunk's struct, its per-worker clocks,
 * its weights and optimizer state and, in sync mode, its round sum, and later
 * the spare weight buffers ps_shard_pin adds (none when that would pass
 * max_memory: the pull is then answered with a copy; an init short of memory
 * first frees the spares no reply holds).  Gradients
 * kept by push stay in the caller's buffers (at most num_workers - 1 per
 * chunk) and queued pulls are capped per chunk (PS_SHARD_MAX_WAITERS). */
#ifndef PS_SHARD_H
#define PS_SHARD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_metrics.h"
#include "ps_proto.h"
#include "ps_trace.h"

typedef struct ps_shard ps_shard;

typedef struct ps_shard_hooks {
    void *user;
    void (*release)(void *user, void *hold);
    void (*ready)(void *user, void *waiter, const float *w, size_t n, int64_t version);
    void (*cancel)(void *user, void *waiter);
    /* A kept gradient at the moment it goes into the round (NULL: as kept).
     * The caller may replace *g (a copy; NULL: the push adds nothing, its
     * turn is taken, as --on-nonfinite skip) or refuse it (nonzero, after
     * answering it): the push is released and its rank's clock goes back,
     * so its resend is taken and the round waits for it.  For gradients the
     * sender can still write (the worker's arena), so that what is summed is
     * what was checked. */
    int (*take)(void *user, void *hold, const float **g, size_t n);
} ps_shard_hooks;

typedef struct ps_shard_config {
    int mode;          /* PS_MODE_SYNC or PS_MODE_ASYNC */
    int max_staleness; /* async: -1 unbounded, k >= 0 SSP; sync: 0 */
    int num_workers;
    ps_opt_config opt;
    uint64_t max_memory;         /* bytes, over every shard sharing mem_used */
    _Atomic uint64_t *mem_used;  /* shared charge; NULL: a private counter */
    /* Check every update's results (--on-nonfinite refuse and skip): a value
     * whose new weight or optimizer state would be NaN or +-Inf keeps its
     * old ones (ps_opt_apply_checked, server/optimizer.h), and the update is noted
     * for ps_shard_take_nonfinite.  0: applied as computed. */
    int guard;
} ps_shard_config;

/* The updates since the last ps_shard_take_nonfinite whose results were not
 * finite: how many, the values kept, and the first one's chunk.  A sync
 * round's are those of the push (or set_live) that completed it. */
typedef struct ps_shard_nonfinite {
    uint64_t updates, values;
    uint64_t key;
    uint32_t chunk;
} ps_shard_nonfinite;

/* Weight buffers per chunk at most: the current weights and spares for the
 * updates that come while pull replies still send older versions. */
#define PS_SHARD_MAX_WBUF 4

/* Queued pulls per chunk beyond which a pull is refused with PS_ETOOBIG. */
#define PS_SHARD_MAX_WAITERS(num_workers) (4 * (size_t)(num_workers) + 16)

void ps_shard_take_nonfinite(ps_shard *s, ps_shard_nonfinite *out);

/* Counters of one shard: pushes, pulls, inits, updates, bytes_in, dup_dropped,
 * chunks, min_version and max_version are filled (0/0 versions with no
 * chunks); bytes_out, errors and workers_seen are left 0 for the caller. */
void ps_shard_stats(const ps_shard *s, ps_stats *out);

int ps_shard_create(const ps_shard_config *cfg, const ps_shard_hooks *hooks, ps_shard **out);
/* Cancel every queued pull (hooks.cancel), release every kept gradient
 * (hooks.release), free everything. */
void ps_shard_destroy(ps_shard *s);

/* The init or push of n elements just given to the shard crossed the wire in
 * a narrower type (elem_bytes per element; the server widened it): its
 * bytes_in counts those bytes, not the float32 ones. */
void ps_shard_count_narrow(ps_shard *s, size_t n, size_t elem_bytes);

/* Register (key, chunk) with n first values (float32, any alignment).  A
 * second init must match n and total (PS_EMISMATCH otherwise) and leaves the
 * values alone.  total may be 0 (unknown); otherwise n <= total.  *version
 * gets the chunk's version, *snap the first checkpoint snapshot that holds
 * the chunk (ps_shard_mark_snapshot; 1 for a restored chunk; 0 for one in no
 * snapshot yet, a new one included; snap may be NULL).  Errors: PS_ETOOBIG (over max_memory),
 * PS_ENOMEM, PS_EPROTO; why says what was wrong. */
int ps_shard_init(ps_shard *s, uint64_t key, uint32_t chunk, const void *vals, size_t n,
                  uint64_t total, int64_t *version, uint64_t *snap, char *why, size_t why_len);

/* Every chunk is in checkpoint snapshot `seq` (just serialized): those in no
 * snapshot before note it. */
void ps_shard_mark_snapshot(ps_shard *s, uint64_t seq);

/* A worker's gradient of step `step` (>= 0).  Errors: PS_ENOTFOUND (no such
 * chunk), PS_EPROTO (length differs, bad rank or step), PS_ESTATE (sync: step
 * is beyond the open round; async: step is beyond the rank's clock, which a
 * push moves by one at most; a restored chunk takes each rank's first push at
 * any step >= its clock, see ps_shard_jumped).  A duplicate (step below the
 * clock, or sync below the round or pushed already) returns 0 with *dup = 1
 * and is not applied.  *version gets the chunk's version after the push.  g
 * must be 4-byte aligned; NULL is a push whose gradient is skipped
 * (--on-nonfinite skip): it counts as the rank's push (its clock moves, a
 * sync round takes its turn) and changes no weight (a sync round averages
 * the gradients it has; one with none ends with the weights as they were). */
int ps_shard_push(ps_shard *s, uint64_t key, uint32_t chunk, int rank, int64_t step,
                  const float *g, size_t n, void *hold, int *kept, int *dup, int64_t *version,
                  char *why, size_t why_len);

/* The same for a push whose g sums m >= 1 gradients of the worker's steps
 * step .. step+m-1 (async only; PS_EPROTO otherwise): one update with their
 * mean that counts as m pushes and m updates, raising the version and the
 * worker's clock by m (a worker that accumulated gradients while its last
 * push was on the wire, so it never waits for a round trip; they were all
 * computed on the same weights, so they are one larger batch). */
int ps_shard_push_sum(ps_shard *s, uint64_t key, uint32_t chunk, int rank, int64_t step, int64_t m,
                      const float *g, size_t n, void *hold, int *kept, int *dup,
                      int64_t *version, char *why, size_t why_len);

/* A pull of version `want` by `rank`.  When it can be answered now it returns
 * 0 with *queued = 0 and *w, *n, *version set (w valid until the next call on
 * this shard, or until ps_shard_unpin when pinned); otherwise it queues
 * waiter (*queued = 1, see above).
 * Errors: PS_ENOTFOUND, PS_ETOOBIG (too many queued pulls on the chunk). */
int ps_shard_pull(ps_shard *s, uint64_t key, uint32_t chunk, int rank, int64_t want, void *waiter,
                  int *queued, const float **w, size_t *n, int64_t *version, char *why,
                  size_t why_len);

/* Pin w, the current weights of (key, chunk) as ps_shard_pull or hooks.ready
 * just gave them, for a reply that sends them without a copy: they stay valid
 * and unchanged until ps_shard_unpin(*ref), whatever happens to the chunk
 * (later updates go to another buffer; destroy leaves the buffer to the last
 * unpin).  Returns w, or NULL (*ref NULL, nothing pinned) when w is not the
 * chunk's current weights or every buffer is held and no spare may be added
 * (PS_SHARD_MAX_WBUF, max_memory): then copy the weights instead. */
const float *ps_shard_pin(ps_shard *s, uint64_t key, uint32_t chunk, const float *w, void **ref);

/* Drop a pin.  Any thread, any time (also after ps_shard_destroy). */
void ps_shard_unpin(void *ref);

/* Spare weight buffers allocated so far (and their bytes), and pins refused
 * (replies that had to be copies). */
void ps_shard_buffer_counts(const ps_shard *s, uint64_t *spares, uint64_t *spare_bytes,
                            uint64_t *copies);

/* Read-only look at a chunk (tests, checkpoints): NULL when unknown. */
const float *ps_shard_weights(const ps_shard *s, uint64_t key, uint32_t chunk, size_t *n,
                              int64_t *version);

/* Resent requests: when set, a waiter about to be queued is first offered to
 * merge(user, queued, incoming) for each waiter queued on its chunk; 1 means
 * it is a resend of that one, which merge has brought up to date (the reply
 * route): it is not queued again, and pull/await return with *queued = 2 and
 * leave the incoming waiter to the caller.  So a request resent for as long
 * as a round stays open takes one place in the queue, not one per resend. */
void ps_shard_set_merge(ps_shard *s, int (*merge)(void *user, void *queued, void *incoming));

/* Like ps_shard_pull, but for a waiter that wants no weights (a sync push's
 * deferred acknowledgement: "tell me when version `want` exists").  Not
 * counted as a pull; the waiter is answered with hooks.ready like a pull. */
int ps_shard_await(ps_shard *s, uint64_t key, uint32_t chunk, int64_t want, void *waiter,
                   int *queued, int64_t *version, char *why, size_t why_len);

/* ---- what ps.torch asks of a chunk (docs/PROTOCOL.md "Worker-side
 * optimizers") ---- */

/* Hyper-parameter changes waiting for their round, at most (sync). */
#define PS_SHARD_MAX_OPT_CHANGES 16

/* Change the hyper-parameters (cfg: the same kind, complete).  Sync: rounds
 * `from` and later use them (round t: the one that makes version t + 1 from
 * the pushes of step t), those before keep what they had; a change for a
 * round some chunk has passed applies to that chunk from its open round.
 * Async: every update from now on.  When PS_SHARD_MAX_OPT_CHANGES are
 * waiting, the oldest takes effect at once.  PS_EINVAL for another kind. */
int ps_shard_set_opt(ps_shard *s, int64_t from, const ps_opt_config *cfg);

/* Overwrite a chunk's n weights with w (a worker's loaded weights); the
 * version, the optimizer state and an open round's sum stay.  A buffer a
 * pull reply still sends is not written (the weights go to another, as an
 * update's do).  *version: the chunk's.  PS_ENOTFOUND, PS_EPROTO (length). */
int ps_shard_assign(ps_shard *s, uint64_t key, uint32_t chunk, const float *w, size_t n,
                    int64_t *version, char *why, size_t why_len);

/* A chunk's optimizer state: *nstate arrays of *n floats (ps_opt_state_arrays
 * of the kind; state[k], valid until the next call that changes the shard)
 * and the optimizer's step count (adam's t of the last update: the version,
 * unless ps_shard_set_state moved it).  PS_ENOTFOUND. */
int ps_shard_get_state(ps_shard *s, uint64_t key, uint32_t chunk, const float *state[2],
                       int *nstate, size_t *n, int64_t *opt_step, char *why, size_t why_len);

/* Load a chunk's optimizer state: `planes` holds its state arrays one after
 * the other (count = n * nstate floats) and opt_step the step count they
 * belong to, from which the next update goes on (t = opt_step + 1; -1: the
 * count stays, for a kind whose arithmetic has none).  PS_ENOTFOUND,
 * PS_EPROTO (count, a step below -1, a kind without state). */
int ps_shard_set_state(ps_shard *s, uint64_t key, uint32_t chunk, const float *planes,
                       size_t count, int64_t opt_step, int64_t *version, char *why,
                       size_t why_len);

/* The step the next push of `rank` to the chunk carries: sync, the open
 * round (its version); async, the rank's clock there (its pushes so far).
 * A worker that restarts goes on from it, so none of its pushes is taken for
 * a duplicate.  PS_ENOTFOUND, PS_EPROTO (rank). */
int ps_shard_clock(ps_shard *s, uint64_t key, uint32_t chunk, int rank, int64_t *step,
                   char *why, size_t why_len);

/* ---- the live set (worker loss, server.h --on-worker-loss) ----
 * Every rank starts live.  A rank that is not live is skipped by sync rounds
 * (a round completes with the gradients of the live workers, their mean taken
 * over the gradients summed) and by the SSP rule (the slowest LIVE worker).
 * Dropping a rank may complete rounds and answer queued pulls (hooks run).
 * A rank made live again joins the open round when the rank-order sum has not
 * passed it yet, else the next one; its clock is raised so that its pushes of
 * earlier steps count as duplicates (async: to the slowest live clock). */
void ps_shard_set_live(ps_shard *s, int rank, int live);

/* Live rank's membership starts at step (an elastic job's new worker, JOIN):
 * every chunk's clock of it is raised to step, and sync rounds before it
 * are completed without it (a round that waited for it may end now; one
 * whose only live ranks join later ends unchanged).  The rounds a joiner
 * takes part in are thus the same on every chunk, however the hello raced
 * them (server.h "Elastic jobs"). */
void ps_shard_join(ps_shard *s, int rank, int64_t step);

/* An elastic job (server.h "Elastic jobs"), right after create: no rank is
 * live until it joins (ps_shard_set_live). */
void ps_shard_set_elastic(ps_shard *s);

/* ---- checkpoints (server/checkpoint.h) ---- */

/* One chunk as a checkpoint sees it.  Pointers are valid until the next call
 * that changes the shard. */
typedef struct ps_shard_chunk_view {
    uint64_t key;
    uint32_t chunk;
    size_t n;
    uint64_t total;
    int64_t version;
    const int64_t *clock;   /* num_workers entries */
    const float *w;         /* n weights */
    const float *state[2];  /* optimizer state arrays (ps_opt_state_arrays of them) */
    int nstate;
} ps_shard_chunk_view;

/* Call fn for every chunk (in table order). */
void ps_shard_foreach(const ps_shard *s, void (*fn)(void *arg, const ps_shard_chunk_view *v),
                      void *arg);

/* Recreate a chunk from a checkpoint (weights, optimizer state, version,
 * clocks) with the same memory charge as init.  In sync mode the restored
 * chunk may be FAST-FORWARDED once: until it completes its first round, a push
 * for a step beyond its version (a worker that got further before the server
 * died) moves the round to that step instead of being refused; the rounds in
 * between are lost (ps_shard_fast_forwards counts them).  In async mode each
 * rank's first push to the restored chunk may be beyond its clock (the pushes
 * in between are lost: ps_shard_jumped).  Errors: PS_EMISMATCH
 * (already there, or the state arrays do not fit this optimizer),
 * PS_ETOOBIG, PS_ENOMEM. */
int ps_shard_restore_chunk(ps_shard *s, const ps_shard_chunk_view *v, char *why, size_t why_len);

/* Chunk (key, chunk) as ps_shard_foreach shows it, and its optimizer's step
 * count (ps_shard_get_state's).  PS_ENOTFOUND. */
int ps_shard_view(const ps_shard *s, uint64_t key, uint32_t chunk, ps_shard_chunk_view *v,
                  int64_t *opt_step);

/* A chunk moved here from another server (ps_shard_remove_chunk there,
 * server/move_records.h): as ps_shard_restore_chunk, but exact, since its
 * version and clocks are what they were (taken where no round of it held a
 * push): no fast-forward, no jumped first pushes.  opt_step: the optimizer's
 * step count it had (ps_shard_get_state's), from which its next update goes
 * on.  Errors: those of ps_shard_restore_chunk (PS_EMISMATCH when the chunk
 * is here already: never overwritten), PS_EMISMATCH for opt_step < 0. */
int ps_shard_move_in(ps_shard *s, const ps_shard_chunk_view *v, int64_t opt_step, char *why,
                     size_t why_len);

/* Remove chunk (key, chunk) (moved to another server): every queued pull is
 * given to hooks.cancel and every kept gradient to hooks.release, as at
 * destroy (the caller sets beforehand what its hooks answer them with: the
 * shard knows no replies); its memory charge is given back; a weight buffer
 * a reply in flight pins is freed by the last ps_shard_unpin.  Its
 * counters stay with the shard.  PS_ENOTFOUND. */
int ps_shard_remove_chunk(ps_shard *s, uint64_t key, uint32_t chunk, char *why, size_t why_len);

/* Add base counters (restored from a checkpoint) to this shard's counters. */
void ps_shard_add_counters(ps_shard *s, const ps_stats *base);

/* Lowest version over the shard's chunks; *have = 0 when it has none.  Kept
 * up to date incrementally (cheap to call after every request). */
int64_t ps_shard_min_version(const ps_shard *s, int *have);

/* Sync: chunks whose open round holds a push (summed or kept); 0 at the
 * quiet point between rounds, where a snapshot needs no round's sums
 * (a replica's catch-up, server/repl.h).  A walk over every chunk. */
size_t ps_shard_open_rounds(const ps_shard *s);
/* Its optimizer's kind (enum ps_opt_kind). */
int ps_shard_opt_kind(const ps_shard *s);

/* Rounds skipped by fast-forwards so far (see ps_shard_restore_chunk). */
uint64_t ps_shard_fast_forwards(const ps_shard *s);

/* Async, restored: steps skipped so far by the first push of a rank beyond
 * its restored clock (pushes the old process acknowledged after its last
 * checkpoint, lost with it). */
uint64_t ps_shard_jumped(const ps_shard *s);

/* Trace an "apply" event (cat "update", args.step = the new version) on lane
 * tid of t for every update.  NULL: none (the default). */
void ps_shard_set_trace(ps_shard *s, ps_trace *t, int tid);

/* --metrics-port: time every update into `apply` (from the receipt of the
 * oldest push it holds) and every sync round into `round` (its first push's
 * receipt to its last's); NULL, NULL: off (the default).  The histograms
 * outlive the shard. */
void ps_shard_set_metrics(ps_shard *s, ps_metrics_hist *apply, ps_metrics_hist *round);
/* The receipt (ps_now_ns) of the request handled next; 0: not known. */
void ps_shard_set_recv(ps_shard *s, int64_t recv_ns);
/* The counters of ps_shard_stats without the version range (which walks
 * every chunk): O(1). */
void ps_shard_counters(const ps_shard *s, ps_stats *out);

#endif
