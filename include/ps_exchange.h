/* libps's exchange: double buffering and staging between a training loop
 * and the client of ps_client.h (docs/DESIGN.md "Overlap on the worker").  The loop talks to the exchange
 * about tensors, by index; the exchange talks to the servers through libps
 * and to the device through the ps_backend's memory, copy, stream and event
 * functions (never its kernels), so it serves any caller that has a list of
 * tensors: ps_worker's layers, or parameter hooks of another framework.
 *
 * A tensor is a key, a count of float32 elements, a front weight buffer (what
 * compute reads) and a gradient buffer (what compute writes), both device
 * memory of the backend.  The exchange adds a back weight buffer that pulls
 * fill and a second gradient buffer, so step t+1's backward can write while
 * step t's push is still read in place.  Per step the caller calls, for each
 * tensor i:
 *   ps_exchange_before_use(x, i)       before compute reads the weights
 *   ps_exchange_grad_ready(x, i, step) once the gradient has been issued
 *                                      on PS_STREAM_COMPUTE
 * and after each call takes the buffers it names anew: ps_exchange_weights
 * (the front may have been swapped) and ps_exchange_grad (the next backward
 * writes the other buffer).
 *
 *   both:  grad_ready first waits for the tensor's previous push and pull
 *          (they hold the back buffer and the other gradient buffer), swaps
 *          in what they pulled, then posts the push of this step and the
 *          pull of the next version.
 *   sync:  before_use waits for that pull (version t+1 before step t+1
 *          reads the tensor), then swaps it in; so early layers compute
 *          while later layers' pulls are in flight.
 *   async: before_use never waits: it swaps in a pull that has landed.
 *
 * Staging (two helpers in exchange.c): on a device whose memory is not host
 * memory (ps_backend.host_memory == 0) the gradient goes to pinned host memory
 * on PS_STREAM_COPY after an event on PS_STREAM_COMPUTE, and the comm thread
 * sends it once that copy's event has happened; a pull lands in pinned host
 * memory and goes to the back buffer on PS_STREAM_COPY, and PS_STREAM_COMPUTE
 * waits on an event before the swap.  On host memory both are no-ops: pushes
 * read the gradient in place and pulls land in the back buffer.
 *
 * Timeline (ps_exchange_set_trace): a "push" event per push and a "pull" per
 * pull, from post to completion by the comm thread, on the request lane
 * (args.step: the gradient's step for a push, the version asked for for a
 * pull); a "wait" event on the caller's lane for each wait over 20 us
 * (args.step: the version waited for).  args.layer is the tensor's tag.
 *
 * Ownership: the caller owns the weight and gradient buffers it passes to
 * ps_exchange_add (and frees them after ps_exchange_close, wherever the
 * front and the current gradient point then); the exchange owns the client,
 * the buffers it allocates (one weight and one gradient buffer per tensor,
 * pinned staging on a device), the events, and frees them all in
 * ps_exchange_close.  Pointers from ps_exchange_weights/ps_exchange_grad stay
 * valid until then.
 *
 * Threads: one thread (the training thread) makes every call but
 * ps_exchange_interrupt (any thread, or a signal handler); the comm
 * thread only reads and writes the staging or back buffers of requests in
 * flight and queries events.  Functions that can fail return 0 or a PS_E*
 * code; request failures are also logged with the tensor's index. */
#ifndef PS_EXCHANGE_H
#define PS_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "ps_client.h"

typedef struct ps_exchange ps_exchange;
/* The device the tensors live on: a struct of memory, copy, stream and event
 * functions (libps's client/ps_backend.h; ps_worker's CPU and CUDA backends
 * implement it).  A caller that computes elsewhere and hands the exchange
 * host memory uses the host backend below. */
typedef struct ps_backend ps_backend;
/* A Chrome trace-event writer (common/ps_trace.h), for timelines. */
typedef struct ps_trace ps_trace;

/* The host-memory backend: memory, copies, fills, streams and events of
 * plain host memory, no compute kernels.  For a caller of the exchange that
 * computes elsewhere (the PyTorch wrapper stages its CUDA tensors itself).
 * 0 or PS_ENOMEM; free it with ps_backend_host_destroy after
 * ps_exchange_close (NULL is fine). */
int ps_backend_host_create(ps_backend **out);
void ps_backend_host_destroy(ps_backend *b);

/* Open the client with o (o->mode picks sync or async behaviour) on backend
 * b, which must outlive the exchange.  Nothing is sent yet. */
int ps_exchange_open(const ps_client_options *o, ps_backend *b, ps_exchange **out);

/* The wire type of pushes and pulls (ps_client_set_wire_dtype): before
 * ps_exchange_start.  The tensors' buffers stay float32. */
int ps_exchange_set_wire_dtype(ps_exchange *x, int dtype);

/* Local aggregation (local_group.h): this worker is local rank local_rank
 * of the local_size workers of its host, which share group `name` (a
 * shared-memory name, the same for the host's workers, another on each
 * host).  Rank 0, the leader, is the only one that talks to the servers
 * (its options name the host's rank and the number of hosts); before each
 * push it waits for the other workers' gradients of the step and pushes the
 * local-rank-order mean, and the weights it pulls go to them.  The others
 * never connect: their gradients go to the leader and their weights come
 * from it, waited for as pulls are (sync: the next version before use;
 * async: taken when newer).  A wait for the group gives up after timeout_ms
 * (0: never), or at once when a worker of the group died or stopped.  Before
 * ps_exchange_start: PS_ESTATE after, PS_EINVAL for bad values. */
int ps_exchange_set_local_group(ps_exchange *x, const char *name, int local_rank,
                                int local_size, int timeout_ms);

/* The same over a client the caller opened with options o (not started,
 * with no tensors registered that the exchange should not know of): on
 * success the exchange owns c and closes it in ps_exchange_close; on failure
 * c stays the caller's.  For a binding that opens the client first (the
 * Python package: errors of open surface before any model is wrapped). */
int ps_exchange_adopt(ps_client *c, const ps_client_options *o, ps_backend *b,
                      ps_exchange **out);

/* Who inits the servers' tensors at start.  By default every worker does
 * and the first init of a chunk wins: right when every worker draws the same
 * initial weights (ps_worker: one seed).  When they may differ (a framework
 * that draws them unseeded), one worker calls this with inits = 1 and every
 * other one with inits = 0 before ps_exchange_start: start then inits from
 * that worker only, waits at a barrier (id PS_EXCHANGE_INIT_BARRIER) until
 * every worker has said hello, and pulls, so every worker starts from its
 * weights. */
void ps_exchange_set_init(ps_exchange *x, int inits);
#define PS_EXCHANGE_INIT_BARRIER ((int64_t)1 << 61)

/* The start barrier (ps_exchange_set_init) and the final one
 * (ps_exchange_pull_final) say after 5 s, and then every 10 s, which
 * workers they still wait for; with timeout_ms > 0 they give up after that
 * long (PS_ETIMEDOUT, the client interrupted), naming them.  0, the
 * default: they wait as long as it takes. */
void ps_exchange_set_wait_timeout(ps_exchange *x, int timeout_ms);

/* Host memory only, before ps_exchange_start: tensor i's back weight buffer
 * is the caller's `back` (count floats) instead of one the exchange
 * allocates, so that every buffer that may become the front (what compute
 * reads) is the caller's: the PyTorch wrapper hands its tensors out and
 * they must outlive ps_exchange_close.  (In the shared-memory arena both
 * weight buffers are the arena's, which the caller may map itself.)
 * PS_ESTATE after start, PS_EINVAL for a bad index or a device backend. */
int ps_exchange_set_back(ps_exchange *x, int i, float *back);

/* Write the timeline events above to t (NULL: none): waits on lane wait_tid,
 * requests on lane request_tid.  t must outlive the exchange. */
void ps_exchange_set_trace(ps_exchange *x, ps_trace *t, int wait_tid, int request_tid);

/* Add a tensor; its index is the number added before it.  key and count are
 * registered with the client; w (its front weights) and g (its gradient
 * buffer) are the caller's device memory of count floats; tag is its
 * timeline args.layer (-1: none).  Allocates the exchange's buffers for it.
 * The same tensors in the same order on every worker.  PS_ESTATE after
 * ps_exchange_start. */
int ps_exchange_add(ps_exchange *x, uint64_t key, size_t count, float *w, float *g, int tag);

/* Say hello to every server, init every tensor with its current front
 * weights (the first init of a chunk wins; every worker's are identical from
 * the same seed anyway; see ps_exchange_set_init otherwise), and pull the
 * servers' current weights into the fronts, so a worker that joins late
 * starts from them.  Blocks. */
int ps_exchange_start(ps_exchange *x);

int ps_exchange_num_tensors(const ps_exchange *x);
/* Tensor i's front weights: what compute reads now. */
float *ps_exchange_weights(const ps_exchange *x, int i);
/* Tensor i's gradient buffer: what the next backward writes. */
float *ps_exchange_grad(const ps_exchange *x, int i);

/* Before compute reads tensor i: sync: wait for its version t+1 and swap it
 * in; async: swap it in if it has landed.  Then take ps_exchange_weights. */
int ps_exchange_before_use(ps_exchange *x, int i);

/* Tensor i's gradient of step `step` (the number of pushes made before) has
 * been issued on PS_STREAM_COMPUTE: wait for the tensor's previous requests,
 * swap in what they pulled, post the push of `step` and the pull of version
 * step+1.  Then take ps_exchange_grad (and ps_exchange_weights). */
int ps_exchange_grad_ready(ps_exchange *x, int i, int64_t step);

/* ---- embedding tables (ps_client.h "embedding tables") ----
 * A table's rows live on the servers; the exchange moves one batch's rows
 * at a time, overlapped with compute like the tensors' weights.  Per table
 * the caller hands the ids of each batch one step ahead and, per step:
 *   ps_exchange_table_next(x, t, ids of batch s+1)   while batch s computes
 *   ps_exchange_table_rows(x, t, &r)                 batch s's unique ids,
 *                                                    rows, gradient buffer
 *   (forward reads r.rows, backward writes r.grads)
 *   ps_exchange_table_push(x, t, s)                  posts the gradients
 * (the first next, before step 0, hands batch 0).  Dense tensors and tables
 * share one clock: `s` is the step of the dense grad_ready calls, and every
 * table is pushed once every step, in step order, also when its batch has
 * no ids (every partition's clock moves, docs/PROTOCOL.md "Tables").
 *
 *   next:  deduplicates the ids (first-seen order; each entry's index) into
 *          the batch's buffers.  async: posts the pull of its rows at once
 *          (answered with the rows as they are; with --max-staleness k, once
 *          the slowest worker is within k steps of the step that reads them).
 *          sync: the rows of batch s+1 must be version s+1, after every
 *          worker's step-s gradients, so the pull goes out as the pull part
 *          of step s's push (one SPUSHPULL per partition); when next comes
 *          after that push, a pull of version s+1 goes out at once.
 *   rows:  waits for the batch's rows only when they have not landed (the
 *          time counts in comm-wait), and for the push of two batches
 *          before, whose gradient buffer this batch reuses.
 *   push:  posts the gradients in r.grads (duplicates of an id are the
 *          caller's to sum: one gradient row per unique id) and is not
 *          waited for; the next batch handed becomes the current one.
 *
 * Buffers: two batches in flight at most (the one computing, the next one
 * landing): a table holds two row and two gradient buffers of max_ids x dim
 * floats and three id lists of max_ids, host memory, sized by the batch and
 * not by the table, whatever the row count.  They are the exchange's; what
 * ps_exchange_table_rows returns stays valid until the push of two batches
 * later (at most until ps_exchange_close).  A table's ids handed to next are
 * read during the call only.  Threads: the training thread, as every call
 * above.  Timeline: a "sparse pull", "sparse push" or "sparse pushpull"
 * event per request (args.step: the version asked for, the step pushed),
 * and "wait" events as the tensors'; args.layer is the tag.  Errors are
 * logged with the table's index, as the tensors'. */

/* Add table `key` with opts (ps_client_register_table: before
 * ps_exchange_start, in the same order on every worker) for batches of at
 * most max_ids ids; its index is the number of tables added before; tag
 * is its timeline args.layer (-1: none).  PS_ESTATE after start, PS_EINVAL
 * for max_ids 0 or over 2^30, or what register_table refuses (the client's
 * last error says), PS_ENOMEM. */
int ps_exchange_add_table(ps_exchange *x, uint64_t key, const ps_table_options *opts,
                          size_t max_ids, int tag);
int ps_exchange_num_tables(const ps_exchange *x);
/* Name table t for the servers' logs (ps_client_name_table).  Before
 * start. */
int ps_exchange_name_table(ps_exchange *x, int t, const char *name);
/* Table t's distinct ids in ascending order as int64 (torch's order of its
 * ids) instead of first seen, each entry's index following them (on: 1;
 * 0: first seen, the default).  ps.torch: torch's backward then sums a
 * row's entries in the order it would for the ids themselves.  Before
 * start; PS_EINVAL, PS_ESTATE. */
int ps_exchange_table_sorted(ps_exchange *x, int t, int on);

/* The ids of the next batch of table t: n ids (at most max_ids), entry e's
 * id ids[e * stride] (stride 1: an array of ids; F: field f's column of
 * a samples x F array, ids + f), repeats allowed.  See above.  PS_ESTATE
 * before start, or when two batches are handed already and the current one
 * is not pushed; PS_EINVAL (n, stride 0). */
int ps_exchange_table_next(ps_exchange *x, int t, const uint64_t *ids, size_t n, size_t stride);

/* The current batch of a table: its entries' rows as the CTR model's
 * embedding bag reads them. */
typedef struct ps_exchange_rows {
    size_t nentries;      /* the ids handed to next */
    size_t nunique;       /* distinct ids among them */
    size_t dim;
    const uint64_t *ids;  /* [nunique] the distinct ids, in the order first seen */
    const int32_t *index; /* [nentries] entry e's id is ids[index[e]], its row
                             rows[index[e] * dim ..] */
    const float *rows;    /* [nunique x dim] */
    float *grads;         /* [nunique x dim] the caller writes their gradients here */
    int64_t version;      /* the lowest version of the partitions the rows came from
                             (-1: no partition answered: no ids) */
} ps_exchange_rows;

/* Table t's current batch (the oldest handed and not pushed), waiting for
 * its rows if they have not landed.  PS_ESTATE when no batch is handed;
 * a request's failure (logged). */
int ps_exchange_table_rows(ps_exchange *x, int t, ps_exchange_rows *out);

/* Add ids[0..n) (distinct, none of them the current batch's) to the current
 * batch, after ps_exchange_table_rows gave it and before its push: its
 * unique ids grow by n (an accumulation over micro-batches: their rows came
 * from lookups), their gradient rows zeroed.  PS_ESTATE unless the batch was
 * given and not pushed; PS_ETOOBIG when the batch would pass max_ids.
 * ps_exchange_table_rows gives the batch again with them. */
int ps_exchange_table_extend(ps_exchange *x, int t, const uint64_t *ids, size_t n);

/* Post the current batch's gradients (ps_exchange_table_rows' grads) as
 * step `step`, with the pull of the next batch in sync mode; the next batch
 * becomes the current one.  PS_ESTATE unless ps_exchange_table_rows gave
 * this batch; PS_EINVAL for a step not above the last one pushed (steps go
 * up by one: the servers refuse a step beyond a partition's clock). */
int ps_exchange_table_push(ps_exchange *x, int t, int64_t step);

/* Blocking, outside the batches (an evaluation): the rows of ids[0..n)
 * (repeats allowed) into rows[i * dim ..], at the version of this worker's
 * clock (sync: after every round it pushed to), from the servers as they
 * are; rows not made yet are made with the initializer's values.  Counts in
 * comm-wait. */
int ps_exchange_table_lookup(ps_exchange *x, int t, const uint64_t *ids, size_t n,
                             float *rows);

/* Wait for every request in flight and swap in what landed, e.g. before an
 * evaluation or at the end.  The first error is returned; every tensor and
 * table is waited for anyway (a sync table's next batch handed and not yet
 * pulled stays so: the next push carries its pull). */
int ps_exchange_finish(ps_exchange *x);

/* After the last step and ps_exchange_finish: wait at a barrier for every
 * worker (all num_workers of the options, dropped ones and those that left
 * excepted), saying after 5 s and then every 10 s whom it still waits for
 * (ps_exchange_set_wait_timeout), then pull the servers' final weights into
 * the fronts (complete when this returns), so evaluation and saving see the
 * trained model. */
int ps_exchange_pull_final(ps_exchange *x);

/* Time the caller was blocked in the calls above since the last call of this
 * (the "comm-wait" figure), in ns; starts the next window. */
int64_t ps_exchange_take_wait_ns(ps_exchange *x);

/* A training step of `samples` samples is done: counted in
 * ps_worker_steps_total and ps_worker_samples_total when the client serves
 * metrics (options.metrics_port; docs/OPERATIONS.md "Metrics"), nothing
 * otherwise. */
void ps_exchange_step_done(ps_exchange *x, uint64_t samples);

/* Where its client serves metrics (ps_client_metrics_url), or NULL. */
const char *ps_exchange_metrics_url(const ps_exchange *x);

/* Close the client (requests in flight complete with PS_ECLOSED) and free
 * what the exchange owns.  NULL is fine. */
void ps_exchange_close(ps_exchange *x);

/* From a signal handler (async-signal-safe) or another thread: abort the
 * client (ps_client_interrupt), so whichever call above waits returns
 * PS_ECLOSED within milliseconds, and so do all later ones; failures
 * caused by it are not logged.  Not once ps_exchange_close has begun. */
void ps_exchange_interrupt(ps_exchange *x);

#endif
