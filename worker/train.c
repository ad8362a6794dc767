/* The training loop of ps_worker.  Reads top to bottom: the worker's state,
 * the hooks that hand each layer's tensors to the exchange, set-up, the loop
 * (fill the batch, forward, backward, log, evaluate), tear-down.
 *
 * Communication overlaps compute through the model's hooks: before a layer's
 * forward the exchange swaps in that layer's newest weights (sync: waits for
 * them), and as soon as backward has issued a layer's gradient the exchange
 * pushes it and pulls the next version (ps_exchange.h).  Without servers the
 * loop trains alone with local SGD, the compute-only baseline.
 *
 * The click-through model (--model ctr) adds its tables, which are not
 * params: each step takes the rows of the batch's ids from a row source and
 * pushes one gradient row per id back (embedding.h); the loop calls only the
 * row source's functions, so where rows live is set up once: local tables
 * without servers, else the servers' tables through the exchange, to which
 * the loop hands each batch's ids one step ahead (the data order is known),
 * so a batch's rows are fetched while the batch before computes.  Its test
 * metric is AUC. */
#include "train.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ctr.h"
#include "data.h"
#include "embedding.h"
#include "ps_exchange.h"
#include "model.h"
#include "ps_error.h"
#include "ps_fs.h"
#include "ps_hash.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ps_trace.h"

/* Where each of ps_worker's settings (common/ps_settings.h) lives. */
static const ps_setting_field fields[] = {PS_SETTING_FIELDS(WORKER)};

const ps_setting_field *ps_train_config_fields(int *n)
{
    *n = (int)(sizeof fields / sizeof fields[0]);
    return fields;
}

void ps_train_config_default(ps_train_config *c)
{
    memset(c, 0, sizeof *c);
    ps_settings_defaults(PS_PROG_WORKER, fields, (int)(sizeof fields / sizeof fields[0]), c);
    c->expect.kind = PS_OPT_NONE; /* check nothing unless told */
    c->local_lr = 0.05f;
}

typedef struct worker {
    const ps_train_config *cfg;
    ps_backend *b;
    ps_model *m;
    ps_param *params;  /* the model's tensors; param i is the exchange's tensor i */
    int nparams;
    ps_exchange *x;    /* NULL: compute only */
    int64_t step;      /* iterations done = pushes made */
    ps_trace *trace;
    FILE *csv;
    ps_dataset *train, *test;
    ps_data_shard *shard; /* this worker's slice of each global batch (data.h) */
    int elastic;          /* --num-workers MIN:MAX: re-split each epoch among the members */
    int64_t split_epoch;  /* elastic: the epoch the shard's split was taken for (-1: none) */
    int split_index, split_count; /* elastic: that split (logged when it changes) */
    /* host batches (the backend's host memory: pinned on CUDA), two so that
     * the next is filled while the copy of this one may still be queued;
     * loaded[i] is recorded after the copy out of buffer i */
    float *hx[2];
    int32_t *hy[2];
    ps_event *loaded[2];
    /* each step's mean loss, written by the device in its own time
     * (ps_model_forward_deferred) and summed at the log steps: the host waits
     * for the device there, not every step */
    float *losses;     /* loss_cap slots (the backend's host memory) */
    int loss_cap, pending;
    /* the click-through model: where its tables' rows come from, and the
     * batch's ids (NULL for mlp and cnn) */
    ps_row_source *rows;
    uint64_t *hids;
} worker;

enum { TID_TRAIN = 1, TID_COMM = 2 };

/* SIGINT/SIGTERM: the signal that asked us to stop, and the exchange it
 * interrupts so that a wait anywhere (hello, a step, the final barrier)
 * ends at once.  g_x is read and cleared atomically; g_in_handler counts
 * handlers that may still use the exchange they read, so close_exchange
 * frees it only once none can. */
static volatile sig_atomic_t g_stop;
static ps_exchange *g_x;
static int g_in_handler;
/* An elastic job's member between its join and the end of its loop: the
 * first signal lets the step in progress end, and the worker sends LEAVE
 * (the servers remove it at once, not at its connection's close or its
 * --worker-timeout); a second signal, or LEAVE_GRACE_S seconds without the
 * leave done (SIGALRM), interrupts as in a fixed job. */
static int g_leave_ok;
#define LEAVE_GRACE_S 5

static void on_signal(int sig)
{
    int first = !g_stop;
    /* stored before g_leave_ok is read, as leave_on_signal reads them the
     * other way round: one of the two sees the other's */
    __atomic_store_n(&g_stop, sig == SIGALRM ? g_stop : sig, __ATOMIC_SEQ_CST);
    if (sig != SIGALRM && first && __atomic_load_n(&g_leave_ok, __ATOMIC_SEQ_CST)) {
        alarm(LEAVE_GRACE_S);
        return;
    }
    __atomic_add_fetch(&g_in_handler, 1, __ATOMIC_SEQ_CST);
    ps_exchange *x = __atomic_load_n(&g_x, __ATOMIC_SEQ_CST);
    if (x)
        ps_exchange_interrupt(x);
    __atomic_sub_fetch(&g_in_handler, 1, __ATOMIC_SEQ_CST);
}

/* The exchange is open: from now on a signal interrupts it (also one that
 * came before). */
static void watch_exchange(ps_exchange *x)
{
    __atomic_store_n(&g_x, x, __ATOMIC_SEQ_CST);
    if (g_stop)
        ps_exchange_interrupt(x);
}

/* Stopped by a signal while a member of an elastic job: LEAVE, bounded by
 * the grace alarm the signal armed. */
static void leave_on_signal(worker *w)
{
    if (!__atomic_exchange_n(&g_leave_ok, 0, __ATOMIC_SEQ_CST) ||
        !__atomic_load_n(&g_stop, __ATOMIC_SEQ_CST))
        return;
    int rc = ps_exchange_leave(w->x);
    alarm(0);
    if (rc)
        ps_warn("stopped by a signal: could not leave the job (%s); the servers remove this "
                "worker when its connection closes or after --worker-timeout",
                ps_strerror(rc));
    else
        ps_info("stopped by a signal: left the job at step %lld", (long long)w->step);
}

static void close_exchange(worker *w)
{
    __atomic_store_n(&g_leave_ok, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_x, NULL, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g_in_handler, __ATOMIC_SEQ_CST))
        sched_yield(); /* a handler on another thread is still using it */
    ps_exchange_close(w->x);
    w->x = NULL;
}

int ps_train_stop_signal(void) { return g_stop; }

/* ---------- hooks: a layer's params are the exchange's tensors first..first+n-1 ---------- */

/* The exchange may have swapped buffers: point the params at the current ones. */
static void take_buffers(worker *w, int first, int n)
{
    for (int i = first; i < first + n; i++) {
        w->params[i].w = ps_exchange_weights(w->x, i);
        w->params[i].g = ps_exchange_grad(w->x, i);
    }
}

static int before_layer(void *ctx, int layer, int first, int n)
{
    worker *w = ctx;
    (void)layer;
    int rc = 0;
    for (int i = first; i < first + n && !rc; i++)
        rc = ps_exchange_before_use(w->x, i);
    take_buffers(w, first, n);
    return rc;
}

static int grad_ready(void *ctx, int layer, int first, int n)
{
    worker *w = ctx;
    (void)layer;
    int rc = 0;
    for (int i = first; i < first + n && !rc; i++)
        rc = ps_exchange_grad_ready(w->x, i, w->step);
    take_buffers(w, first, n);
    return rc;
}

static int finish_requests(worker *w)
{
    int rc = ps_exchange_finish(w->x);
    take_buffers(w, 0, w->nparams);
    return rc;
}

/* ---------- set-up ---------- */

/* Before anything starts: the files we will write can be created (their
 * directories are made here), so a bad path fails now, not after training. */
static int check_outputs(const ps_train_config *c)
{
    const char *flag[] = {"--log-csv", "--timeline", "--save"};
    const char *path[] = {c->log_csv, c->timeline, c->rank == 0 ? c->save_path : NULL};
    char why[1024];
    for (int k = 0; k < 3; k++)
        if (path[k] && ps_check_output_file(flag[k], path[k], why, sizeof why)) {
            ps_error("%s", why);
            return PS_EINVAL; /* a flag to fix, like any other bad flag */
        }
    return 0;
}

static int open_outputs(worker *w)
{
    const ps_train_config *c = w->cfg;
    if (c->log_csv) {
        if (!(w->csv = fopen(c->log_csv, "w"))) {
            ps_error("--log-csv %s: cannot create the file: %s", c->log_csv, strerror(errno));
            return PS_EIO;
        }
        fprintf(w->csv, "time_s,epoch,iter,loss,samples_per_s,comm_wait_pct\n");
    }
    if (c->timeline) {
        char name[64];
        snprintf(name, sizeof name, "ps_worker[%d]", c->rank);
        int rc = ps_trace_open(c->timeline, 1000 + c->rank, name, &w->trace);
        if (rc) {
            ps_error("--timeline %s: cannot create the file: %s", c->timeline, strerror(errno));
            return rc;
        }
        ps_trace_thread_name(w->trace, TID_TRAIN, "train");
        ps_trace_thread_name(w->trace, TID_COMM, "requests");
    }
    return 0;
}

/* Open the exchange, give it every param, and start: hello, init, first pull. */
static int connect_servers(worker *w)
{
    const ps_train_config *c = w->cfg;
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = c->servers;
    o.rank = c->rank;
    o.num_workers = c->num_workers;
    int L = c->local_size > 1 ? c->local_size : 1;
    int elastic = c->num_workers_min > 0 && c->num_workers_min < c->num_workers;
    if (elastic && L > 1) {
        ps_error("--num-workers %d:%d (an elastic job) does not take --local-aggregate yet; "
                 "run without it", c->num_workers_min, c->num_workers);
        return PS_EINVAL;
    }
    if (L > 1) {
        /* the servers see one worker per host: the host's leader */
        o.rank = c->rank / L;
        o.num_workers = c->num_workers / L;
    }
    o.mode = c->mode;
    o.max_staleness = c->max_staleness;
    o.chunk_bytes = c->chunk_bytes;
    o.request_timeout_ms = c->request_timeout_ms;
    o.hello_timeout_ms = c->hello_timeout_ms;
    o.heartbeat_ms = c->heartbeat_ms;
    o.failure_timeout_ms = c->failure_timeout_ms;
    o.server_timeout_ms = c->server_timeout_ms;
    o.curve_dir = c->curve_dir;
    o.shm = c->shm;
    o.on_nonfinite = c->on_nonfinite;
    o.metrics_port = c->metrics_port;
    o.metrics_bind = c->metrics_bind;
    /* check what the user gave; the servers' settings are used either way */
    o.expect = c->expect;
    if (elastic) /* the model is built: the clock of a join starts here (bench/elastic_bench.sh) */
        ps_info("model built; rank %d joins the elastic job (%d..%d workers)", c->rank,
                c->num_workers_min, c->num_workers);
    int rc = ps_exchange_open(&o, w->b, &w->x);
    if (rc)
        return rc;
    if (ps_exchange_metrics_url(w->x))
        ps_info("metrics: %s", ps_exchange_metrics_url(w->x));
    watch_exchange(w->x);
    if (elastic) /* start joins the running job (docs/OPERATIONS.md "Elastic jobs") */
        ps_exchange_set_elastic(w->x);
    w->elastic = elastic;
    w->split_epoch = -1;
    w->split_index = w->split_count = -1;
    if ((rc = ps_exchange_set_wire_dtype(w->x, c->wire_dtype)))
        return rc;
    if (L > 1) {
        /* one group per host and job: the servers' list names the job */
        uint64_t h = ps_fnv1a(PS_FNV1A_BASIS, c->servers, strlen(c->servers));
        char name[64];
        snprintf(name, sizeof name, "/ps-agg-%016llx-%d", (unsigned long long)h, c->rank / L);
        if ((rc = ps_exchange_set_local_group(w->x, name, c->rank % L, L,
                                              c->server_timeout_ms)))
            return rc;
    }
    ps_exchange_set_trace(w->x, w->trace, TID_TRAIN, TID_COMM);
    for (int i = 0; i < w->nparams && !rc; i++) {
        ps_param *p = &w->params[i];
        rc = ps_exchange_add(w->x, p->key, p->count, p->w, p->g, p->layer);
    }
    if (rc) {
        ps_error("cannot allocate buffers on %s: %s", w->b->name, ps_strerror(rc));
        return rc;
    }
    /* the click-through model's tables live on the servers: declared from
     * the spec, with buffers for two batches */
    const ps_ctr_spec *cs = ps_model_ctr_spec(w->m);
    for (int f = 0; cs && f < cs->fields && !rc; f++) {
        ps_table_options to;
        ps_ctr_table_options(cs, c->seed, &to);
        rc = ps_exchange_add_table(w->x, PS_EMB_TABLE_KEY(f), &to, (size_t)c->batch, f);
        char name[32]; /* the servers' logs name it by its field */
        snprintf(name, sizeof name, "ctr field %d", f);
        if (!rc)
            rc = ps_exchange_name_table(w->x, f, name);
    }
    if (rc) {
        ps_error("--model %s: cannot declare its tables: %s", c->model, ps_strerror(rc));
        return rc;
    }
    if ((rc = ps_exchange_start(w->x)))
        return rc;
    /* the exchange may have moved the buffers (into shared memory) */
    take_buffers(w, 0, w->nparams);
    if (cs && (rc = ps_row_source_servers_create(w->x, 0, cs->fields, &w->rows)))
        ps_error("--model %s: %s", c->model, ps_strerror(rc));
    return rc;
}

/* The click-through model's data, after what only it refuses: a model
 * file cannot hold its tables. */
static int open_ctr(worker *w, char *why, size_t why_len)
{
    const ps_train_config *c = w->cfg;
    ps_ctr_spec cs;
    int rc = ps_ctr_spec_parse(c->model, &cs, why, why_len);
    if (rc)
        return rc;
    if (c->save_path || c->load_path) {
        snprintf(why, why_len,
                 "%s: --model %s keeps its embedding tables outside the model file, which "
                 "cannot hold them yet%s",
                 c->save_path ? "--save" : "--load", c->model,
                 c->servers ? " (the servers' checkpoints hold them: ps_server "
                              "--checkpoint-dir)" : "");
        return PS_EINVAL;
    }
    return ps_dataset_open_ctr(c->data, c->seed, cs.fields, cs.rows, &w->train, &w->test, why,
                               why_len);
}

/* The tables' rows: without servers local tables, made as batches touch
 * them (through servers connect_servers declares them); and the batch's ids. */
static int start_tables(worker *w, char *why, size_t why_len)
{
    const ps_ctr_spec *cs = ps_model_ctr_spec(w->m);
    int rc = w->cfg->servers ? 0
                             : ps_row_source_local_create(cs->fields, cs->dim, w->cfg->seed,
                                                          cs->opt, cs->lr, PS_CTR_ADAGRAD_EPS,
                                                          &w->rows);
    if (!rc && !(w->hids = malloc((size_t)w->cfg->batch * cs->fields * sizeof *w->hids)))
        rc = PS_ENOMEM;
    if (rc)
        snprintf(why, why_len, "--model %s: cannot make its tables: %s", ps_model_spec(w->m),
                 ps_strerror(rc));
    return rc;
}

/* ---------- the loop ---------- */

/* The test metric: accuracy, or AUC for the click-through model. */
static const char *metric_name(const worker *w)
{
    return w->rows ? "auc" : "accuracy";
}

static int evaluate(worker *w, int64_t epoch, double *metric_out)
{
    double metric = 0, loss = 0;
    uint64_t fp = 0;
    char why[256];
    int rc = w->rows ? ps_model_evaluate_ctr(w->m, w->test, w->rows, &metric, &loss, &fp, why,
                                             sizeof why)
                     : ps_model_evaluate(w->m, w->test, &metric, &loss, why, sizeof why);
    if (rc) {
        ps_error("evaluation failed: %s", why);
        return rc;
    }
    /* the click-through model: the scores' fingerprint tells runs that
     * trained the same model (sync runs repeat bit for bit) */
    char more[64] = "";
    if (w->rows)
        snprintf(more, sizeof more, " (scores %016llx)", (unsigned long long)fp);
    ps_info("epoch %lld test %s %.4f loss %.4f%s", (long long)epoch, metric_name(w), metric, loss,
            more);
    if (metric_out)
        *metric_out = metric;
    return 0;
}

/* The data loader ahead of the step: the ids of step `step`'s batch to a
 * row source that fetches ahead. */
/* Elastic: at the first step of an epoch (or this worker's first), split the
 * data among the members now: this worker's dense index of their number
 * (docs/OPERATIONS.md "Elastic jobs").  A change that races the epoch's
 * start can give two workers different views for that epoch. */
static int split_for(worker *w, int64_t step, int64_t per_epoch)
{
    int64_t epoch = step / per_epoch;
    if (!w->elastic || epoch == w->split_epoch)
        return 0;
    int index, count;
    int64_t version;
    int rc = ps_exchange_members(w->x, &index, &count, &version);
    if (!rc && index < 0) {
        ps_error("epoch %lld: this worker is no longer a member of the job (removed after "
                 "--worker-timeout?): it has no share of the data", (long long)epoch + 1);
        return PS_ESTATE;
    }
    if (!rc && (rc = ps_data_shard_set_split(w->shard, index, count)) != 0)
        ps_error("epoch %lld: %d members, more than --num-workers %d", (long long)epoch + 1,
                 count, w->cfg->num_workers);
    if (rc)
        return rc;
    if (index != w->split_index || count != w->split_count)
        ps_info("epoch %lld: this worker takes share %d of %d (membership version %lld)",
                (long long)epoch + 1, index, count, (long long)version);
    w->split_epoch = epoch;
    w->split_index = index;
    w->split_count = count;
    return 0;
}

static int hand_ids_ahead(worker *w, int64_t step, int64_t per_epoch)
{
    int rc = split_for(w, step, per_epoch);
    if (rc)
        return rc;
    rc = ps_data_shard_fill_ids(w->shard, (uint64_t)(step / per_epoch),
                                    (size_t)(step % per_epoch), w->hids);
    return rc ? rc : ps_model_ahead_ids(w->m, w->rows, w->hids, w->cfg->batch);
}

/* The most steps' losses held before they are summed, whatever --log-every. */
enum { LOSS_SLOTS = 4096 };

/* Wait for the steps' losses and add them to *sum in step order: the number
 * the log shows is the same as if each had been added in its own step. */
static int take_losses(worker *w, double *sum)
{
    int rc = w->b->stream_sync(w->b, PS_STREAM_COMPUTE);
    if (rc)
        return rc;
    for (int i = 0; i < w->pending; i++)
        *sum += w->losses[i];
    w->pending = 0;
    return 0;
}

static int train_loop(worker *w)
{
    const ps_train_config *c = w->cfg;
    /* the same on every worker: sync needs equal step counts (data.h) */
    int64_t per_epoch = (int64_t)ps_data_shard_steps_per_epoch(w->shard);
    int64_t total = per_epoch * c->epochs;
    if (c->max_steps > 0 && c->max_steps < total)
        total = c->max_steps;
    ps_model_hooks hooks = {w, w->x ? before_layer : NULL, w->x ? grad_ready : NULL};
    int rc = 0;
    double metric = -1;
    int64_t t_start = ps_now_ns(), t_win = t_start, t_run = t_start;
    int64_t win_steps = 0;
    double win_loss = 0;
    int do_eval = c->rank == 0 || c->eval_all;
    ps_info("training %s on %s: %lld steps (%lld per epoch), batch %d, %d worker(s), %s%s",
            ps_model_spec(w->m), w->b->name, (long long)total, (long long)per_epoch, c->batch,
            c->num_workers, w->x ? ps_mode_name(c->mode) : "no servers (local SGD)",
            c->mode == PS_MODE_ASYNC && c->max_staleness >= 0 && w->x ? " (bounded staleness)"
                                                                      : "");
    if (w->rows)
        ps_info("embedding tables: %d of %d-wide rows, in %s", ps_model_num_tables(w->m),
                ps_model_table_dim(w->m), w->rows->name);
    /* a source that fetches ahead gets the first batch's ids now */
    int ahead = w->rows && w->rows->ahead;
    /* 0, or where this worker joined an elastic job */
    int64_t first = w->x ? ps_exchange_start_step(w->x) : 0;
    int64_t timed_from = first; /* the first step the summary counts (--warmup) */
    if (first > 0)
        ps_info("going on from step %lld, where this worker joined", (long long)first);
    if (ahead && first < total && (rc = hand_ids_ahead(w, first, per_epoch)))
        return rc;
    if (w->elastic && w->x)
        __atomic_store_n(&g_leave_ok, 1, __ATOMIC_SEQ_CST);
    for (w->step = first; w->step < total && !rc && !g_stop; w->step++) {
        int64_t k = w->step % per_epoch, epoch = w->step / per_epoch;
        int buf = (int)(w->step & 1);
        if ((rc = split_for(w, w->step, per_epoch)))
            break;
        /* our slice of global batch k of the epoch's shuffle, the same on every
         * worker, into the buffer whose copy two steps ago has been done */
        if ((rc = w->b->event_sync(w->b, w->loaded[buf])) ||
            (rc = ps_data_shard_fill(w->shard, (uint64_t)epoch, (size_t)k, w->hx[buf],
                                     w->hy[buf])) ||
            (w->rows && !ahead &&
             (rc = ps_data_shard_fill_ids(w->shard, (uint64_t)epoch, (size_t)k, w->hids))))
            break;
        int64_t t0 = ps_now_ns();
        /* the click-through model's rows of this batch, from wherever they live:
         * the next batch's ids go ahead, before this batch's rows are waited for */
        if (ahead && ((w->step + 1 < total && (rc = hand_ids_ahead(w, w->step + 1, per_epoch))) ||
                      (rc = ps_model_take_rows(w->m, w->rows, c->batch))))
            break;
        if (w->rows && !ahead && ((rc = ps_model_set_ids(w->m, w->hids, c->batch)) ||
                                  (rc = ps_model_fetch_rows(w->m, w->rows))))
            break;
        if ((rc = ps_model_load_batch(w->m, w->hx[buf], w->hy[buf], c->batch)) ||
            (rc = w->b->event_record(w->b, w->loaded[buf], PS_STREAM_COMPUTE)) ||
            (rc = ps_model_forward_deferred(w->m, ps_model_input(w->m), ps_model_labels(w->m),
                                            c->batch, &hooks, &w->losses[w->pending++], NULL)))
            break;
        int64_t t1 = ps_now_ns();
        if ((rc = ps_model_backward(w->m, &hooks)) ||
            (w->rows && (rc = ps_model_push_rows(w->m, w->rows, w->step))))
            break;
        if (!w->x && (rc = ps_model_sgd_step(w->m, c->local_lr)))
            break;
        int64_t t2 = ps_now_ns();
        ps_trace_event(w->trace, "forward", "compute", TID_TRAIN, t0, t1, w->step, -1);
        ps_trace_event(w->trace, "backward", "compute", TID_TRAIN, t1, t2, w->step, -1);
        if (w->x)
            ps_exchange_step_done(w->x, (uint64_t)c->batch);
        if (w->elastic && w->step == first)
            ps_info("step %lld done, this worker's first", (long long)first);
        win_steps++;
        int64_t it = w->step + 1;
        int log_now = it % c->log_every == 0 || it == total;
        if ((log_now || w->pending == w->loss_cap) && (rc = take_losses(w, &win_loss)))
            break;
        if (log_now) {
            int64_t now = ps_now_ns();
            double dt = (double)(now - t_win) * 1e-9;
            double sps = (double)win_steps * c->batch / dt;
            int64_t wait_ns = w->x ? ps_exchange_take_wait_ns(w->x) : 0;
            double waitp = 100.0 * (double)wait_ns / (double)(now - t_win);
            ps_info("epoch %lld iter %lld/%lld loss %.4f samples/s %.0f comm-wait %.1f%%",
                    (long long)epoch + 1, (long long)it, (long long)total,
                    win_loss / (double)win_steps, sps, waitp);
            if (w->csv)
                fprintf(w->csv, "%.3f,%lld,%lld,%.6f,%.1f,%.2f\n", (double)(now - t_run) * 1e-9,
                        (long long)epoch + 1, (long long)it, win_loss / (double)win_steps, sps,
                        waitp);
            t_win = now;
            win_steps = 0;
            win_loss = 0;
        }
        /* the summary's clock starts after the warm-up, on an idle device */
        if (it == first + c->warmup && it < total) {
            if ((rc = w->b->stream_sync(w->b, PS_STREAM_COMPUTE)))
                break;
            t_start = ps_now_ns();
            timed_from = it;
        }
        int epoch_end = (it % per_epoch == 0) && it < total;
        int eval_now = c->eval_every > 0 ? it % c->eval_every == 0 && it < total : epoch_end;
        if (do_eval && eval_now) {
            if (w->x && (rc = finish_requests(w)))
                break;
            rc = evaluate(w, epoch + 1, NULL);
        }
    }
    if (w->x) {
        int r = finish_requests(w);
        if (!rc && !g_stop)
            rc = r;
        leave_on_signal(w);
    }
    double elapsed = (double)(ps_now_ns() - t_start) * 1e-9;
    if (!rc && !g_stop && w->x)
        rc = ps_exchange_pull_final(w->x);
    if (!rc && do_eval && !g_stop)
        rc = evaluate(w, (w->step + per_epoch - 1) / per_epoch, &metric);
    if (g_stop) {
        ps_warn("stopped by a signal after %lld steps", (long long)w->step);
        return PS_ECLOSED;
    }
    if (!rc) {
        double sps = elapsed > 0 ? (double)(w->step - timed_from) * c->batch / elapsed : 0;
        if (metric >= 0)
            ps_info("summary: time %.1f s, %.0f samples/s per worker, test %s %.4f", elapsed,
                    sps, metric_name(w), metric);
        else
            ps_info("summary: time %.1f s, %.0f samples/s per worker", elapsed, sps);
    }
    return rc;
}

int ps_train_run(const ps_train_config *c)
{
    worker w = {0};
    w.cfg = c;
    char why[512];
    int rc;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);

    if ((rc = check_outputs(c)))
        return rc;
    if (ps_ctr_spec_is(c->model)) {
        if ((rc = open_ctr(&w, why, sizeof why))) {
            ps_error("%s", why);
            goto out;
        }
    } else if ((rc = ps_dataset_open(c->data, PS_SPLIT_TRAIN, c->seed, &w.train, why,
                                     sizeof why)) ||
               (rc = ps_dataset_open(c->data, PS_SPLIT_TEST, c->seed, &w.test, why,
                                     sizeof why))) {
        ps_error("--data: %s", why);
        goto out;
    }
    /* refuses a batch x workers larger than the training set, before anything starts */
    if ((rc = ps_data_shard_create(w.train, c->rank, c->num_workers, c->batch, c->seed, &w.shard,
                                   why, sizeof why)) ||
        (rc = ps_backend_create(c->device, c->threads, &w.b, why, sizeof why)) ||
        (rc = ps_model_create(c->model, w.train->channels, w.train->height, w.train->width,
                              w.train->num_classes, c->batch, w.b, c->seed, &w.m, why,
                              sizeof why))) {
        ps_error("%s", why);
        goto out;
    }
    if (c->load_path && (rc = ps_model_load(w.m, c->load_path, why, sizeof why))) {
        ps_error("--load: %s", why);
        goto out;
    }
    if (ps_model_num_tables(w.m) && (rc = start_tables(&w, why, sizeof why))) {
        ps_error("%s", why);
        goto out;
    }
    w.params = ps_model_params(w.m);
    w.nparams = ps_model_num_params(w.m);
    size_t ss = ps_dataset_sample_size(w.train);
    w.loss_cap = c->log_every < LOSS_SLOTS ? c->log_every : LOSS_SLOTS;
    rc = w.b->alloc_host(w.b, (size_t)w.loss_cap * sizeof(float), (void **)&w.losses);
    for (int i = 0; i < 2 && !rc; i++)
        if (!(rc = w.b->alloc_host(w.b, (size_t)c->batch * ss * sizeof(float),
                                   (void **)&w.hx[i])) &&
            !(rc = w.b->alloc_host(w.b, (size_t)c->batch * sizeof(int32_t), (void **)&w.hy[i])))
            rc = w.b->event_create(w.b, &w.loaded[i]);
    if (rc) {
        ps_error("--batch %d: cannot allocate the host batches: %s", c->batch, ps_strerror(rc));
        goto out;
    }
    if ((rc = open_outputs(&w)) || (c->servers && (rc = connect_servers(&w)))) {
        if (g_stop) {
            ps_warn("stopped by a signal while connecting to the servers");
            rc = PS_ECLOSED;
        }
        goto out;
    }
    rc = train_loop(&w);
    if (!rc && c->save_path && (c->rank == 0) &&
        (rc = ps_model_save(w.m, c->save_path, why, sizeof why)))
        ps_error("--save: %s", why);
out:
    /* the exchange first: its comm thread may still use the model's buffers */
    close_exchange(&w);
    ps_trace_close(w.trace);
    if (w.csv)
        fclose(w.csv);
    ps_model_destroy(w.m);
    if (w.rows)
        w.rows->destroy(w.rows);
    if (w.b) {
        /* a failed step may have left copies out of the host batches queued */
        (void)w.b->stream_sync(w.b, PS_STREAM_COMPUTE);
        for (int i = 0; i < 2; i++) {
            if (w.hx[i])
                w.b->free_host(w.b, w.hx[i]);
            if (w.hy[i])
                w.b->free_host(w.b, w.hy[i]);
            if (w.loaded[i])
                w.b->event_destroy(w.b, w.loaded[i]);
        }
        if (w.losses)
            w.b->free_host(w.b, w.losses);
        w.b->destroy(w.b);
    }
    free(w.hids);
    ps_data_shard_destroy(w.shard);
    ps_dataset_free(w.train);
    ps_dataset_free(w.test);
    return rc;
}
