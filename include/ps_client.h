/* libps: the worker-side client of the parameter server.
 *
 * One ps_client owns ONE background comm thread, and that thread owns every
 * socket (a DEALER per server).  The caller registers its tensors, starts the
 * client (placement + hello with every server), then posts non-blocking
 * requests and waits on each request's completion.
 *
 * This header needs only ps_types.h (error codes, modes, the optimizer,
 * server counters) and standard headers: a program builds against it with
 * -Iinclude alone and links lib/libps.a (README.md, "The client library").
 *
 * Ownership:
 *  - ps_client_open allocates the client and ps_client_close frees it; open
 *    copies the strings in ps_client_options, so they need not outlive it.
 *  - push/pushpull/init read the caller's source buffer IN PLACE (zero-copy
 *    send); the buffer must stay valid and unchanged until the request
 *    completes.
 *  - pull/pushpull write the weights directly into the caller's destination
 *    buffer (one copy from the received frame); the buffer must stay valid until
 *    the request completes and must not be read before then.
 *  - ps_request is caller-allocated (on the stack, in an array, in a struct)
 *    and must not move or be reused while pending; libps keeps no pointer to
 *    it once it is complete.
 *  - ps_client_last_error's text is libps's, valid until the next call that
 *    sets it.
 * Threads: post and wait from one thread (the training thread); other
 * threads may only call ps_request_test/ps_request_wait on their own
 * requests.  Nothing in libps calls back into the caller except ready()
 * (ps_client_push_when), on the comm thread. */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

typedef struct ps_client ps_client;

/* A reader: a client of rank -1 that reads what the workers train while they
 * train (docs/OPERATIONS.md "Export and serve").  It pulls dense weights
 * (ps_client_pull, any `step`: the servers' current weights) and looks rows
 * up (ps_client_lookup), and takes a snapshot (ps_client_export); it is no
 * worker: counted in no round or barrier, and every request only a worker
 * sends (a push, an init, a table's pull that makes rows, a barrier) fails
 * with PS_ESTATE saying so.  It takes the servers' mode and worker count at
 * start (num_workers and mode need not match), shares no memory with them,
 * and with curve_dir uses DIR/reader.key (the servers' DIR/reader/ holds its
 * public key, which may do nothing but read).  It registers the tensors it
 * pulls (as the workers do: the placement) and each table it looks up (only
 * the key and dim are used). */
#define PS_RANK_READER (-1)

typedef struct ps_client_options {
    const char *servers;   /* comma-separated endpoints, server rank order:
                              tcp://HOST:PORT, ipc://PATH or inproc://NAME */
    int rank;              /* this worker's rank, 0..num_workers-1; PS_RANK_READER: a
                              reader (below), not a worker */
    int num_workers;
    int mode;              /* PS_MODE_SYNC or PS_MODE_ASYNC */
    int max_staleness;     /* async only: -1 unbounded, k >= 0 SSP */
    size_t chunk_bytes;    /* tensors are cut into chunks of at most this; 0: 4 MiB */
    /* The optimizer this worker expects the servers to run; start refuses a
     * server that disagrees (PS_EMISMATCH).  Checked: the kind, unless
     * PS_OPT_NONE; and each hyper-parameter the servers' optimizer uses that
     * this expectation gives: its PS_OPT_GIVEN(x) bit is set in
     * expect.given, or, for eps and lr_decay (where 0 is out of range), it
     * is non-zero (lr 0 is a rate: set its bit).  The default (all zero, kind PS_OPT_NONE) checks
     * nothing.  The table is PS_OPT_PARAMS in ps_types.h. */
    ps_opt_config expect;
    int hello_timeout_ms;  /* how long start waits for every server; 0: 10000 */
    int request_timeout_ms;/* resend an unanswered request after this; 0: never */
    const char *curve_dir; /* CURVE keys directory (see ps_keygen); NULL: plaintext */
    int heartbeat_ms;      /* after start, the comm thread sends a HEARTBEAT to every server
                              this often, so servers notice a worker that died
                              (--worker-timeout); 0: never.  Default 1000. */
    /* The same-host data plane.  shm 1 (the default): start creates a
     * shared-memory arena (ps_client_shm_alloc hands out its buffers) and
     * offers it to every server in the hello; a server on the same host maps
     * it, and the payloads of requests whose buffers lie in the arena then
     * move through it (a push's gradient is read in place by the server, a
     * pull's weights are written straight into its destination) while
     * ZeroMQ carries only the headers.  Buffers elsewhere, and servers on
     * other hosts, use the network as before.  0: no arena. */
    int shm;
    size_t shm_bytes;      /* the arena's size; 0: six times the registered tensors */
    int server_timeout_ms; /* after start, a server from which nothing (no reply, not even
                              to a heartbeat) came for this long while requests wait on it
                              is given up on: those requests complete with PS_ETIMEDOUT
                              ("no reply from ENDPOINT for N s ..."); 0: never.  Default
                              60000.  Keep heartbeats on: they are what a live server
                              answers while a sync round waits for a slow worker. */
    const char *admin_token; /* sent with ps_client_shutdown_servers: the token of the
                              servers' --admin-token-file (16..128 printable characters,
                              no spaces); NULL: none (servers then refuse, unless this
                              worker's CURVE key is one of their admin keys) */
    int on_nonfinite;      /* a push's gradient with NaN or Inf (or, with a float16 wire
                              type, a value beyond its 65504) is, PS_NONFINITE_REFUSE
                              (the default): not sent, the push fails with
                              PS_ENONFINITE naming its step, key, chunk and value;
                              _SKIP or _APPLY: sent, with a warning (the servers'
                              --on-nonfinite decides) */
    int metrics_port;      /* > 0: ps_client_open serves this client's Prometheus metrics
                              (ps_client_metrics_*) at http://metrics_bind:metrics_port/metrics;
                              0 (the default, PS_METRICS_PORT): none */
    const char *metrics_bind; /* the address it listens on; NULL: 127.0.0.1 */
    int failure_timeout_ms;/* with replicas (servers given as groups, "a|b,c|d": each group's
                              members, its primary first): a primary silent this long
                              (its connection closed: at once) is taken as lost and the
                              group's requests go to the member that took over, with
                              hellos and resends; 0: the default, 1000 */
    int num_workers_min;   /* an elastic job's MIN (PS_NUM_WORKERS=MIN:MAX; the default
                              and a plain count: num_workers).  libps does not read it:
                              a worker that starts in a running elastic job calls
                              ps_client_join */
} ps_client_options;

/* One posted operation, allocated by the caller and filled by libps.
 *
 * The public fields are the results: valid once ps_request_test returns 1
 * or ps_request_wait returns, not before (the comm thread writes them while
 * the request is pending).  A post that fails (non-zero return) completes
 * the request at once, with that code in status and the reason in err. */
typedef struct ps_request {
    int status;            /* 0, or the first error (PS_E*) of any part */
    int64_t version;       /* the smallest version the servers' replies carried
                              over all chunks (pull: of the weights written to
                              dst); -1 when no reply carried one */
    int64_t done_ns;       /* when the comm thread completed it
                              (CLOCK_MONOTONIC ns), for timelines */
    char err[PS_ERR_TEXT_MAX + 1]; /* status != 0: which server and why; else "" */

    /* libps's bookkeeping: private, do not read or write. */
    struct ps_request_private {
        int pending;       /* parts outstanding: chunk replies + zero-copy releases */
        int done;          /* 1 once complete */
        ps_client *client; /* the client that completes it; NULL: not in flight */
    } _priv;
} ps_request;

/* The defaults ps_worker has too (README.md, "ps_worker"): servers NULL,
 * rank 0 of 1 worker, sync, chunks of 4 MiB, hello timeout 10000 ms,
 * heartbeat 1000 ms, shared memory on, server timeout 60000 ms; request
 * timeout 0 (never resend: ps_worker and ps.Client give 5000), no CURVE, no
 * admin token, the optimizer unchecked. */
void ps_client_options_default(ps_client_options *o);

/* A worker's run setting by name (a ps_worker flag without "--": "mode",
 * "rank", "wire-dtype"): *env gets the environment variables that carry it
 * to a worker program ("PS_RANK SLURM_PROCID ...", the first set wins;
 * NULL: none) and *def its default as ps_worker's flag takes it ("sync";
 * NULL: none); either may be NULL.  0, or PS_ENOTFOUND.  ps.Client reads
 * the same variables as ps_worker through it. */
int ps_client_setting(const char *name, const char **env, const char **def);

/* Check the options and every endpoint, create the client and its comm
 * thread and connect to every server.  Nothing is sent yet.  On failure *out
 * is NULL, the reason is logged and ps_client_last_error(NULL) returns it
 * (e.g. PS_EINVAL: "'127.0.0.1:5555' is not an endpoint: write
 * tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555"). */
int ps_client_open(const ps_client_options *o, ps_client **out);

/* Declare a tensor of `count` float32 elements.  Call for every tensor, in the
 * same order on every worker, before ps_client_start. */
int ps_client_register(ps_client *c, uint64_t key, size_t count);

/* ---- embedding tables (docs/PROTOCOL.md "Tables") ----
 * A table is a key whose rows (`dim` floats each) are addressed by any
 * uint64 id and live on the servers, spread over them and over each one's
 * partitions (its update threads) by a hash of (table, id); a row is made on
 * its first pull with the initializer's values (a pure function of (seed,
 * table, id): the same on every server, in every run, after every restart),
 * and updated by the table's own optimizer (ps_table_options, ps_types.h).
 * Tables and dense keys share the worker's clock: the `step` of a sparse
 * push is the step of the worker's dense pushes, and sync sums a row's
 * gradients over the workers in rank order, divided by the number of
 * workers as for dense keys (rows no worker touched do not change). */

/* Every field of o at its default: dim 0 (set it), uniform in [-0.01, 0.01),
 * seed 0, adagrad (opt.kind PS_OPT_NONE) with the optimizer table's
 * defaults (lr 0.01, eps 1e-8), FTRL beta 1, l1 and l2 0, no row cap, no
 * frequency filter. */
void ps_table_options_default(ps_table_options *o);

/* Declare table `key` (a key no tensor has) before ps_client_start, in the
 * same order on every worker: start sends the declaration to every server
 * after the hello (a server keeps the first and refuses another, naming the
 * field: "table 7: dim: worker 1 has 16, server 0 has 32"), and the hello
 * carries the fingerprint of every table's declaration, so workers that
 * declare differently (or a server restored with other tables) are refused
 * at start.  PS_EINVAL (a field out of range, ps_client_last_error
 * says which; a key registered twice), PS_ESTATE after start. */
int ps_client_register_table(ps_client *c, uint64_t key, const ps_table_options *opts);
/* Name a registered table for the servers' logs (at most PS_TABLE_NAME_MAX
 * printable characters; sent with its declaration, compared with nothing).
 * Before start.  PS_ENOTFOUND, PS_EINVAL, PS_ESTATE. */
int ps_client_name_table(ps_client *c, uint64_t key, const char *name);

/* Compute placement and say hello to every server (then declare the
 * tables); fails with PS_EMISMATCH (message in ps_client_last_error) if a
 * server disagrees with this worker or with another server, PS_ETIMEDOUT if a
 * server does not answer. */
int ps_client_start(ps_client *c);

/* Why the last of register, start, barrier, barrier_info, stats or
 * shutdown_servers on c failed (the calls that take no ps_request; requests carry their own text
 * in ps_request.err).  c NULL: why the calling thread's last ps_client_open
 * failed ("" when it succeeded), so after `if (ps_client_open(&o, &c))`
 * ps_client_last_error(c) says why. */
const char *ps_client_last_error(const ps_client *c);

/* Post requests.  Return 0 when posted (then wait on req) or an error code.
 * `step` is the worker's clock: the number of pushes it made before this one.
 * init: first values of the tensor; the first init of a chunk wins, later
 * inits are checked for the same length.  On completion req->version holds
 * the server's version.
 * pull: weights of at least version `step` (sync: waits for round step-1 to be
 * applied; SSP: waits until the slowest worker is within max_staleness). */
int ps_client_init(ps_client *c, uint64_t key, const float *values, ps_request *req);
int ps_client_push(ps_client *c, uint64_t key, const float *grad, int64_t step, ps_request *req);
int ps_client_pull(ps_client *c, uint64_t key, float *dst, int64_t step, ps_request *req);
/* push the gradient of `step`, then pull version step+1 into dst */
int ps_client_pushpull(ps_client *c, uint64_t key, const float *grad, float *dst, int64_t step,
                       ps_request *req);

/* Like ps_client_push, but the comm thread sends only once ready(ready_arg)
 * returns non-zero: for a gradient still being copied off a GPU (ready =
 * "has the copy's event happened?").  ready is called on the comm thread,
 * repeatedly, so it must be cheap and thread-safe.  Requests posted after
 * this one are held behind it, in order, until it has been sent. */
typedef int (*ps_ready_fn)(void *arg);
int ps_client_push_when(ps_client *c, uint64_t key, const float *grad, int64_t step,
                        ps_ready_fn ready, void *ready_arg, ps_request *req);

/* Async only: push the sum of `count` >= 1 gradients, those of steps step ..
 * step+count-1, in one message (a worker that kept computing while its last
 * push was on the wire).  The servers apply it as one update with the mean
 * of the gradients (computed on the same weights, they are one larger batch)
 * that counts as `count` pushes: the worker's clock, the chunk's version and
 * the update counters all go up by count.  ready: as ps_client_push_when
 * (NULL: send at once).  count 1 is ps_client_push / ps_client_push_when. */
int ps_client_push_sum(ps_client *c, uint64_t key, const float *sum, int64_t step, int count,
                       ps_ready_fn ready, void *ready_arg, ps_request *req);
/* The same, then the pull of version step+count into dst, in one round trip
 * (ps_client_pushpull with a sum; count 1 and ready NULL is exactly
 * ps_client_pushpull).  Through shared memory both buffers must lie in the
 * arena for the request to use it. */
int ps_client_pushpull_sum(ps_client *c, uint64_t key, const float *sum, float *dst, int64_t step,
                           int count, ps_ready_fn ready, void *ready_arg, ps_request *req);

/* 1 when complete, 0 while pending. */
int ps_request_test(ps_request *req);
/* Block until complete; returns its status (0 or PS_E*).  A request that
 * was never posted (zero-initialised) gives PS_EINVAL at once. */
int ps_request_wait(ps_request *req);
/* Like ps_request_wait, for at most timeout_ms (< 0: no limit): its status
 * once complete, or -1 when it is still pending (it goes on: wait again,
 * or test it, later). */
int ps_request_wait_for(ps_request *req, int timeout_ms);

/* ---- sparse requests of a table (non-blocking, as the dense ones) ----
 * ids may repeat and come in any order.  libps removes duplicates (a pushed
 * id's gradient rows summed in the order they come, so the sum is the same
 * every run), sends each server partition its ids in one message, and
 * writes every requested id's row into rows[i * dim ..] in the caller's
 * order (a repeated id gets the one row fetched).  ids, grads and rows are
 * the caller's until the request completes, as the buffers of dense
 * requests; req->version is the lowest version of the partitions' replies.
 * Errors at post: PS_ESTATE (before start), PS_ENOTFOUND (not a table),
 * PS_EINVAL (NULL buffers for n > 0, a bad step); at completion, a
 * partition's refusal (PS_ETOOBIG when one partition's share of the ids is
 * over what one message takes: 1 << 20 ids, 1 GiB of rows).
 *
 * pull: the rows of ids[0..n) at version `step` at least (sync: after round
 * step-1, as ps_client_pull); rows that do not exist yet are made with the
 * initializer's values (a capped table in sync mode gives those values
 * and makes the row at its first update, so its LRU order follows the
 * rounds).  n = 0 completes at once. */
int ps_client_sparse_pull(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                          float *rows, int64_t step, ps_request *req);
/* push: the gradient rows of step `step` (grads[i * dim ..] for ids[i]).
 * Every partition of every server gets one (without rows where none of ids
 * lives), so call it once per table and step on every live worker, also
 * with n = 0, as for a dense key. */
int ps_client_sparse_push(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                          const float *grads, int64_t step, ps_request *req);
/* pushpull: the push of step `step`, then the pull of pull_ids at version
 * step+1, in one round trip per partition (this batch's gradients and the
 * next batch's rows). */
int ps_client_sparse_pushpull(ps_client *c, uint64_t key, const uint64_t *push_ids,
                              size_t npush, const float *grads, const uint64_t *pull_ids,
                              size_t npull, float *rows, int64_t step, ps_request *req);

/* assign: set the rows of ids[0..n) (distinct: PS_EINVAL for an id given
 * twice) to rows[i * dim ..], float32 exactly whatever the wire type; rows
 * missing are made (charged to the servers' --max-memory: PS_ETOOBIG past
 * it), their optimizer state zeroed.  Only the partitions that hold some of
 * ids get a message; not a step (no clock moves).  A model's own first rows
 * (ps.torch), before training. */
int ps_client_sparse_assign(ps_client *c, uint64_t key, const uint64_t *ids, size_t n,
                            const float *rows, ps_request *req);

/* Blocking helpers. */
/* (A barrier is resent like any request when request_timeout_ms is set;
 * servers count a rank once per barrier and answer a resent one.) */
/* ---- readers (PS_RANK_READER, above; a worker may call these too) ----
 * Rows of several tables in one request: ntables tables, table t's
 * counts[t] ids ids[t] (any, repeats too), their rows (counts[t] x dim
 * floats, dim as registered) into rows[t].  One LOOKUP message per server
 * partition the ids are on, whatever the number of tables.  Read-only on the
 * servers: a row that does not exist reads as its initializer's values and
 * is not made, and nothing is touched or counted (an LRU order, a frequency
 * filter, the rounds).  Each partition answers with the rows as they are
 * (sync: after the last round it finished, at most one step behind the
 * workers' newest); req->version is the lowest version of those read.  The
 * arrays and buffers stay valid until the request completes.  PS_ENOTFOUND
 * (a table not registered here: ps_client_register_table gives its key and
 * dim), PS_ETOOBIG (more ids of one partition than a message takes), and
 * the servers' refusals. */
int ps_client_lookup(ps_client *c, size_t ntables, const uint64_t *keys,
                     const uint64_t *const *ids, const size_t *counts, float *const *rows,
                     ps_request *req);

/* Export (docs/OPERATIONS.md "Export and serve"): a snapshot of every dense
 * tensor and table partition of every server, written to the folder dir
 * (it must not exist or be empty; it is written as dir.partial and renamed
 * when whole): manifest.json, dense/KEY.weights.npy (float32, the whole
 * tensor), tables/KEY.ids.npy (uint64, sorted) and tables/KEY.weights.npy
 * (float32, rows x dim), with PS_EXPORT_STATE the optimizer's state arrays
 * (KEY.stateN.npy) and a table's per-row counts (KEY.counts.npy) too.
 * Consistency, sync: every item at one version: `version`, or with
 * version -1 the newest any server has; nkeys keys with versions of their
 * own (a worker's steps, ps.torch's export) override it.  An item one
 * version behind is waited for (wait_ms; < 0: 10000), one further behind (a
 * tensor that does not train) is taken as it is and the manifest says so,
 * and when training went past the version asked for the snapshot is taken
 * again (at most 20 times).  Async: each partition and chunk as it is when
 * its server's update thread gets to it (one version per item, in the
 * manifest).  Blocking; PS_EIO (a file: ps_client_last_error names it),
 * PS_ESTATE, PS_ETIMEDOUT, PS_ETOOBIG (a server's --max-memory: a
 * snapshot is a copy) and the servers' refusals. */
#define PS_EXPORT_STATE 1
int ps_client_export(ps_client *c, const char *dir, int flags, int64_t version,
                     const uint64_t *keys, const int64_t *versions, size_t nkeys, int wait_ms);

int ps_client_barrier(ps_client *c, int64_t id);
/* server: 0 .. ps_client_num_servers() - 1, the servers listed at open, or
 * the slot of a server added while training (docs/PROTOCOL.md "Moved
 * objects"); PS_EINVAL for a slot this client does not know or that left. */
int ps_client_stats(ps_client *c, int server, ps_stats *out);
/* Ask every server to stop.  A server obeys only a peer it was told to
 * (ps_server --admin-token-file, with ps_client_options.admin_token here; or
 * a CURVE key in its key directory's admin/); otherwise it refuses with
 * PS_EAUTH and goes on (stop servers with SIGTERM, as ps_launch does). */
int ps_client_shutdown_servers(ps_client *c);

/* The same-host data plane (options.shm).  After ps_client_start: `bytes`
 * of the client's shared-memory arena, 64-byte aligned and zeroed, valid
 * until ps_client_close; NULL when there is no arena (shm 0, or it could not
 * be made) or it is full.  Use them as push sources and pull destinations:
 * to a server on the same host their payloads then never cross a socket.
 * Not thread-safe: call from the training thread. */
void *ps_client_shm_alloc(ps_client *c, size_t bytes);
/* How many servers move payloads through the arena (0..num servers). */
int ps_client_shm_servers(const ps_client *c);
/* The arena's buffers, [*base, *base + *bytes) (NULL, 0 without an arena):
 * e.g. to page-lock it for a GPU's copies. */
void ps_client_shm_region(const ps_client *c, void **base, size_t *bytes);
/* The barrier as a request: post it and wait on req (ps_request_wait_for
 * lets the caller say meanwhile whom it waits for, below). */
int ps_client_barrier_post(ps_client *c, int64_t id, ps_request *req);
/* Whom the barrier with the lowest id that is open on server 0 (where
 * barriers are held) still waits for: live ranks that have not reached it
 * (out->id -1 when none is open).  Asks server 0 (a STATS request) and
 * waits at most 2 s for the answer (PS_ETIMEDOUT). */
int ps_client_barrier_info(ps_client *c, ps_barrier_info *out);

/* ---- for a framework's optimizer (ps.torch: docs/TORCH.md, docs/PROTOCOL.md
 * "ps.torch's messages").  After ps_client_start. ---- */

/* Change the servers' hyper-parameters: those whose PS_OPT_GIVEN bit is set
 * in change->given (change->kind: the servers' kind or PS_OPT_NONE; none
 * given: only ask).  Sync rounds from step from_step on use them (the
 * rounds of earlier steps keep what they had), async pushes from now on.
 * *now (may be NULL) gets server 0's optimizer as it runs afterwards.
 * Blocks until every server answered: PS_EMISMATCH (another kind),
 * PS_EINVAL (a value out of range), the reason in ps_client_last_error. */
int ps_client_hyper(ps_client *c, const ps_opt_config *change, int64_t from_step,
                    ps_opt_config *now);
/* The same for table `key`'s optimizer (those hyper-parameters its kind
 * uses): sync rounds of the table from step from_step on (the table's own
 * steps), async pushes from now on.  *now gets the table's optimizer as it
 * runs, its kind the dense one whose hyper-parameters it takes (adagrad for
 * row-wise adagrad, sgd for ftrl).  PS_ENOTFOUND (no such table),
 * PS_EMISMATCH, PS_EINVAL. */
int ps_client_table_hyper(ps_client *c, uint64_t key, const ps_opt_config *change,
                          int64_t from_step, ps_opt_config *now);

/* Overwrite the tensor's weights on the servers with w (a loaded model); its
 * version and optimizer state stay.  On completion req->version holds the
 * chunks' smallest version. */
int ps_client_assign(ps_client *c, uint64_t key, const float *w, ps_request *req);

/* The servers' optimizer state of the tensor (nstate = 1 or 2 arrays, as
 * the servers' optimizer keeps: momentum, nesterov, adagrad 1, adam 2) into
 * dst, count * nstate floats: chunk after chunk, each chunk's arrays one
 * after the other (chunk k of the tensor's elements [o, o + n) at dst +
 * o * nstate).  req->version: the optimizer's step count (adam's t), the
 * smallest over the chunks.  A kind without state is refused (PS_EPROTO). */
int ps_client_state(ps_client *c, uint64_t key, float *dst, int nstate, ps_request *req);

/* Load the tensor's optimizer state: src as ps_client_state fills dst, and
 * the step count it belongs to (the next update is step opt_step + 1; -1:
 * the servers' count stays, for momentum, nesterov). */
int ps_client_set_state(ps_client *c, uint64_t key, const float *src, int nstate,
                        int64_t opt_step, ps_request *req);

/* The step this worker's next push of the tensor or table carries
 * (req->version, the smallest over the tensor's chunks, or over every
 * partition of the table on every server): sync, the open round; async, its
 * pushes so far.  A restarted worker goes on from it, so none of its pushes
 * is dropped as a duplicate. */
int ps_client_clock(ps_client *c, uint64_t key, ps_request *req);

/* Collectives, held on server 0 until every live worker sent the same id
 * (ids: each once per kind; allreduce and broadcast ids are apart from each
 * other and from barriers'); at most 64 MiB.  allreduce: dst gets the mean
 * of the workers' src (count floats each, summed in rank order).
 * broadcast: dst gets rank 0's src; the others' src must have count
 * elements too (not read), and every worker must give the same count.  src
 * is read in place until the request completes. */
int ps_client_allreduce(ps_client *c, int64_t id, const float *src, float *dst, size_t count,
                        ps_request *req);
int ps_client_broadcast(ps_client *c, int64_t id, const float *src, float *dst, size_t count,
                        ps_request *req);

/* This worker is done (uneven step counts: ps.torch's join): every server
 * takes it out of the live set, so sync rounds and barriers go on without
 * it; its pulls are still answered, and collectives still wait for it.
 * Blocks until every server acknowledged.  Push nothing more afterwards. */
int ps_client_leave(ps_client *c);
/* The same to one server, as a request (wait on req, ps_request_wait_for):
 * a worker that ends after an error leaves without waiting long on a server
 * that may be gone.  Server 0's also goes to every server added while
 * training; one that left the job completes at once. */
int ps_client_leave_post(ps_client *c, int server, ps_request *req);

/* An elastic job (ps_server --num-workers MIN:MAX): this worker, started
 * while the others train (its hello made it a member), asks every chunk and
 * table partition for its clock and tells every server that its gradients
 * count from *step on: async, the largest of those clocks; sync, the
 * largest open round plus one (no chunk can have passed it).  The rounds
 * before it go on without it, on every chunk alike.  Then pull the weights
 * of version *step (sync) and push step *step first.  Blocks until every
 * server acknowledged.  PS_ESTATE from a server of a fixed-size job. */
int ps_client_join(ps_client *c, int64_t *step);

/* The membership now, from server 0: *count members (a fixed job: every
 * rank), this worker the *index-th of them in rank order (-1: not a member);
 * *version (may be NULL) counts its changes, so a training loop that reads
 * it at a step boundary sees that it changed (dense ranks for the data
 * split: ps.torch's ElasticSampler).  Blocks for one round trip. */
int ps_client_members(ps_client *c, int *index, int *count, int64_t *version);

/* The element type of the gradients this client pushes and of the weights it
 * pulls on the network: PS_DTYPE_F32 (the default), PS_DTYPE_BF16 or
 * PS_DTYPE_F16.  Buffers stay float32: the comm thread converts each pushed
 * chunk into the narrower type (round to nearest even) and each pulled one
 * back (exactly); the servers keep float32 weights and optimizer state.
 * Every server must run with the same type (ps_server --wire-dtype; start
 * refuses a mismatch with PS_EMISMATCH, naming both).  Inits stay float32,
 * and so does everything that moves through shared memory (a server on the
 * same host), whatever the type.  Before ps_client_start: PS_ESTATE after,
 * PS_EINVAL for another value. */
int ps_client_set_wire_dtype(ps_client *c, int dtype);

/* Placement introspection (for tests and tools). */
int ps_client_num_servers(const ps_client *c);
/* The tables registered (ps_client_register_table). */
int ps_client_num_tables(const ps_client *c);
/* The partitions server `server` splits each table into (its update
 * threads, from its hello reply); 0 before start or for a bad index. */
int ps_client_server_parts(const ps_client *c, int server);
size_t ps_client_chunk_elems(const ps_client *c);

/* Stop the comm thread, close sockets, free everything.  Pending requests
 * complete with PS_ECLOSED. */
void ps_client_close(ps_client *c);

/* Where this client serves its Prometheus metrics
 * ("http://127.0.0.1:9403/metrics"; options.metrics_port), or NULL when it
 * does not.  Valid until ps_client_close. */
const char *ps_client_metrics_url(const ps_client *c);

/* Abort c from any thread or from a signal handler (it only stores a flag
 * and writes an eventfd: async-signal-safe).  Within milliseconds every
 * request queued or in flight completes with PS_ECLOSED (the sockets are
 * closed, so ZeroMQ lets go of every payload first), so whatever waits
 * returns: ps_request_wait, ps_client_start, barrier, stats; later posts
 * fail with PS_ECLOSED.  What is left to do is ps_client_close.  Calling it
 * again does nothing; it must not be called once ps_client_close began
 * (a handler needs the caller to guard the pointer). */
void ps_client_interrupt(ps_client *c);

#endif
