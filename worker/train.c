/* The training loop of ps_worker.  Reads top to bottom: the worker's state,
 * set-up, the per-layer hooks that overlap communication with compute, one
 * step, the loop, tear-down.
 *
 * Double buffering (DESIGN.md "Overlap on the worker"): every parameter has a
 * front copy (param->w, read by forward/backward) and a back copy that pulls
 * fill.  Gradients are double-buffered too, so step t+1's backward can write
 * while step t's zero-copy push may still be reading.
 *   async: forward never waits; a layer swaps to its new weights as soon as
 *          their pull has landed (checked before the layer runs, and at the
 *          latest when the layer's next gradient is ready).
 *   sync:  before a layer's forward we wait for that layer's version t+1 only,
 *          so early layers compute while later layers' pulls are in flight.
 * On a GPU the gradient goes device -> pinned host on the copy stream after an
 * event from the compute stream, the comm thread sends it once that copy is
 * done, and a pulled tensor goes pinned host -> device back buffer on the copy
 * stream; the compute stream waits on an event before it reads it. */
#include "train.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "data.h"
#include "model.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"
#include "ps_trace.h"

void ps_train_config_default(ps_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->num_workers = 1;
    c->mode = PS_MODE_ASYNC;
    c->max_staleness = -1;
    c->model = "mlp:784-256-128-10";
    c->batch = 64;
    c->epochs = 1;
    c->opt.kind = PS_OPT_SGD;
    c->opt.lr = 0.05f;
    c->opt.momentum = 0.9f;
    c->opt.beta1 = 0.9f;
    c->opt.beta2 = 0.999f;
    c->opt.eps = 1e-8f;
    c->device = "cpu";
    c->threads = 1;
    c->seed = 1;
    c->log_every = 100;
    /* a restarted server is reconnected by ZeroMQ; what it lost is resent */
    c->request_timeout_ms = 5000;
    c->heartbeat_ms = 1000;
}

/* One parameter tensor's communication state. */
typedef struct slot {
    float *back;       /* device: the copy pulls fill */
    float *own_w;      /* the second weight buffer, ours to free */
    float *grad[2];    /* device: gradient buffers, alternating per step */
    float *host_grad;  /* pinned host staging of the gradient (GPU only) */
    float *host_pull;  /* pinned host landing of pulls (GPU only) */
    ps_event *grad_done, *grad_copied, *pull_copied;
    ps_request push, pull;
    int in_flight;     /* push+pull posted, not yet seen complete */
    int landed;        /* the pull completed; back holds newer weights than front */
    int push_logged;   /* the push's timeline event is written */
    int64_t posted_ns;
    ps_backend *b;     /* for copy_done on the comm thread */
} slot;

typedef struct worker {
    const ps_train_config *cfg;
    ps_backend *b;
    int on_host;       /* backend memory is host memory (CPU): no staging copies */
    ps_model *m;
    ps_param *params;
    int nparams;
    slot *slots;
    ps_client *client; /* NULL: compute only */
    int64_t step;      /* iterations done = pushes made */
    int64_t wait_ns;   /* time blocked on communication in the current window */
    ps_trace *trace;
    ps_dataset *train, *test;
    ps_data_shard *shard; /* this worker's slice of each global batch (data.h) */
    float *hx;         /* host batch */
    int32_t *hy;
} worker;

enum { TID_TRAIN = 1, TID_COMM = 2 };

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* ---------- requests of one parameter ---------- */

/* The pull of slot i completed: check it, and on a GPU start the copy of the
 * new weights into the back buffer (the compute stream waits for it at swap). */
static int landed(worker *w, int i)
{
    slot *s = &w->slots[i];
    s->in_flight = 0;
    int rc = s->push.status ? s->push.status : s->pull.status;
    if (rc) {
        ps_error("step %lld: %s of param %d failed: %s (%s)", (long long)w->step,
                 s->push.status ? "push" : "pull", i, ps_strerror(rc),
                 s->push.status ? s->push.err : s->pull.err);
        return rc;
    }
    ps_trace_event(w->trace, "pull", "comm", TID_COMM, s->posted_ns, s->pull.done_ns, w->step,
                   w->params[i].layer);
    if (!w->on_host) {
        size_t bytes = w->params[i].count * sizeof(float);
        if ((rc = w->b->copy(w->b, s->back, s->host_pull, bytes, 0, PS_STREAM_COPY)) ||
            (rc = w->b->event_record(w->b, s->pull_copied, PS_STREAM_COPY)))
            return rc;
    }
    s->landed = 1;
    return 0;
}

/* The push of slot i was acknowledged: put it on the timeline (post to reply). */
static void push_seen(worker *w, int i)
{
    slot *s = &w->slots[i];
    if (s->push_logged)
        return;
    s->push_logged = 1;
    ps_trace_event(w->trace, "push", "comm", TID_COMM, s->posted_ns, s->push.done_ns, w->step,
                   w->params[i].layer);
}

/* Wait (block = 1) or look (block = 0) for slot i's requests. */
static int settle(worker *w, int i, int block)
{
    slot *s = &w->slots[i];
    if (!s->in_flight)
        return 0;
    if (!block) {
        if (!ps_request_test(&s->push))
            return 0;
        push_seen(w, i);
        if (!ps_request_test(&s->pull))
            return 0;
    } else {
        int64_t t0 = ps_now_ns();
        ps_request_wait(&s->push);
        push_seen(w, i);
        ps_request_wait(&s->pull);
        int64_t t1 = ps_now_ns();
        w->wait_ns += t1 - t0;
        if (t1 - t0 > 20000)
            ps_trace_event(w->trace, "wait", "comm", TID_TRAIN, t0, t1, w->step,
                           w->params[i].layer);
    }
    return landed(w, i);
}

/* Make the landed weights the front copy. */
static int swap_in(worker *w, int i)
{
    slot *s = &w->slots[i];
    if (!s->landed)
        return 0;
    if (!w->on_host) {
        int rc = w->b->stream_wait_event(w->b, PS_STREAM_COMPUTE, s->pull_copied);
        if (rc)
            return rc;
    }
    float *t = w->params[i].w;
    w->params[i].w = s->back;
    s->back = t;
    s->landed = 0;
    return 0;
}

/* Runs on the comm thread: has the gradient reached pinned host memory? */
static int copy_done(void *arg)
{
    slot *s = arg;
    return s->b->event_query(s->b, s->grad_copied) == 1;
}

/* Post the gradient of slot i for step w->step and the pull of step+1. */
static int post(worker *w, int i)
{
    slot *s = &w->slots[i];
    ps_param *p = &w->params[i];
    const float *src = p->g;
    float *dst = s->back;
    int rc;
    if (!w->on_host) {
        /* copy stream: after the backward kernels, gradient -> pinned host */
        size_t bytes = p->count * sizeof(float);
        if ((rc = w->b->event_record(w->b, s->grad_done, PS_STREAM_COMPUTE)) ||
            (rc = w->b->stream_wait_event(w->b, PS_STREAM_COPY, s->grad_done)) ||
            (rc = w->b->copy(w->b, s->host_grad, p->g, bytes, 1, PS_STREAM_COPY)) ||
            (rc = w->b->event_record(w->b, s->grad_copied, PS_STREAM_COPY)))
            return rc;
        src = s->host_grad;
        dst = s->host_pull; /* copied to the device back buffer in landed() */
    }
    s->posted_ns = ps_now_ns();
    /* on a GPU the comm thread sends once the copy's event has happened; the
     * training thread goes straight on with the backward of earlier layers */
    if ((rc = w->on_host ? ps_client_push(w->client, p->key, src, w->step, &s->push)
                         : ps_client_push_when(w->client, p->key, src, w->step, copy_done, s,
                                               &s->push)) ||
        (rc = ps_client_pull(w->client, p->key, dst, w->step + 1, &s->pull)))
        return rc;
    s->in_flight = 1;
    s->push_logged = 0;
    /* next backward writes the other buffer while this one is on the wire */
    p->g = p->g == s->grad[0] ? s->grad[1] : s->grad[0];
    return 0;
}

/* ---------- hooks: where communication meets compute ---------- */

static int before_layer(void *ctx, int layer, int first, int n)
{
    worker *w = ctx;
    (void)layer;
    for (int i = first; i < first + n; i++) {
        /* sync: this layer's version t+1 only; async: take it if it is there */
        int rc = settle(w, i, w->cfg->mode == PS_MODE_SYNC);
        if (rc || (rc = swap_in(w, i)))
            return rc;
    }
    return 0;
}

static int grad_ready(void *ctx, int layer, int first, int n)
{
    worker *w = ctx;
    (void)layer;
    for (int i = first; i < first + n; i++) {
        /* the previous step's requests hold the back buffer: finish them */
        int rc = settle(w, i, 1);
        if (rc || (rc = swap_in(w, i)) || (rc = post(w, i)))
            return rc;
    }
    return 0;
}

/* ---------- set-up ---------- */

static int alloc_slots(worker *w)
{
    ps_backend *b = w->b;
    w->slots = calloc((size_t)w->nparams, sizeof *w->slots);
    if (!w->slots)
        return PS_ENOMEM;
    for (int i = 0; i < w->nparams; i++) {
        slot *s = &w->slots[i];
        size_t bytes = w->params[i].count * sizeof(float);
        int rc;
        if ((rc = b->alloc(b, bytes, (void **)&s->own_w)) ||
            (rc = b->alloc(b, bytes, (void **)&s->grad[1])))
            return rc;
        s->back = s->own_w;
        s->b = b;
        s->grad[0] = w->params[i].g;
        if (!w->on_host &&
            ((rc = b->alloc_host(b, bytes, (void **)&s->host_grad)) ||
             (rc = b->alloc_host(b, bytes, (void **)&s->host_pull)) ||
             (rc = b->event_create(b, &s->grad_done)) ||
             (rc = b->event_create(b, &s->grad_copied)) ||
             (rc = b->event_create(b, &s->pull_copied))))
            return rc;
    }
    return 0;
}

/* The model frees the buffers it allocated, wherever params point then;
 * we free the ones we allocated (own_w, grad[1]). */
static void free_slots(worker *w)
{
    if (!w->slots)
        return;
    ps_backend *b = w->b;
    for (int i = 0; i < w->nparams; i++) {
        slot *s = &w->slots[i];
        if (s->own_w)
            b->free(b, s->own_w);
        if (s->grad[1])
            b->free(b, s->grad[1]);
        if (s->host_grad)
            b->free_host(b, s->host_grad);
        if (s->host_pull)
            b->free_host(b, s->host_pull);
        if (s->grad_done)
            b->event_destroy(b, s->grad_done);
        if (s->grad_copied)
            b->event_destroy(b, s->grad_copied);
        if (s->pull_copied)
            b->event_destroy(b, s->pull_copied);
    }
}

/* Register every tensor, say hello, init (first init wins: every worker's
 * values are identical anyway, from the same seed) and pull the servers'
 * current weights, so a worker that joins late starts from them. */
static int connect_servers(worker *w)
{
    const ps_train_config *c = w->cfg;
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = c->servers;
    o.rank = c->rank;
    o.num_workers = c->num_workers;
    o.mode = c->mode;
    o.max_staleness = c->max_staleness;
    o.chunk_bytes = c->chunk_bytes;
    o.request_timeout_ms = c->request_timeout_ms;
    o.hello_timeout_ms = c->hello_timeout_ms;
    o.heartbeat_ms = c->heartbeat_ms;
    o.curve_dir = c->curve_dir;
    /* check what the user asked for: the optimizer with --optimizer, the
     * learning rate with --lr; the servers' settings are used either way */
    o.expect = c->opt;
    if (!c->opt_given)
        o.expect.kind = PS_OPT_NONE;
    if (!c->lr_given)
        o.expect.lr = 0;
    int rc = ps_client_open(&o, &w->client);
    if (rc)
        return rc;
    for (int i = 0; i < w->nparams && !rc; i++)
        rc = ps_client_register(w->client, w->params[i].key, w->params[i].count);
    if (!rc && (rc = ps_client_start(w->client)))
        ps_error("cannot start: %s", ps_client_last_error(w->client));
    if (rc)
        return rc;
    for (int i = 0; i < w->nparams && !rc; i++) {
        slot *s = &w->slots[i];
        const float *src = w->params[i].w;
        float *dst = w->params[i].w;
        size_t bytes = w->params[i].count * sizeof(float);
        if (!w->on_host) {
            if ((rc = w->b->copy(w->b, s->host_grad, src, bytes, 1, PS_STREAM_COMPUTE)) ||
                (rc = w->b->stream_sync(w->b, PS_STREAM_COMPUTE)))
                return rc;
            src = s->host_grad;
            dst = s->host_pull;
        }
        if ((rc = ps_client_init(w->client, w->params[i].key, src, &s->push)) == 0 &&
            (rc = ps_request_wait(&s->push)) == 0 &&
            (rc = ps_client_pull(w->client, w->params[i].key, dst, 0, &s->pull)) == 0)
            rc = ps_request_wait(&s->pull);
        if (rc) {
            ps_error("init of param %d failed: %s %s", i, ps_strerror(rc),
                     s->push.status ? s->push.err : s->pull.err);
            return rc;
        }
        if (!w->on_host &&
            ((rc = w->b->copy(w->b, w->params[i].w, s->host_pull, bytes, 0, PS_STREAM_COMPUTE)) ||
             (rc = w->b->stream_sync(w->b, PS_STREAM_COMPUTE))))
            return rc;
    }
    return rc;
}

/* ---------- the loop ---------- */

static int evaluate(worker *w, int64_t epoch, double *acc_out)
{
    double acc = 0, loss = 0;
    char why[256];
    int rc = ps_model_evaluate(w->m, w->test, &acc, &loss, why, sizeof why);
    if (rc) {
        ps_error("evaluation failed: %s", why);
        return rc;
    }
    ps_info("epoch %lld test accuracy %.4f loss %.4f", (long long)epoch, acc, loss);
    if (acc_out)
        *acc_out = acc;
    return 0;
}

static int finish_requests(worker *w)
{
    int rc = 0;
    for (int i = 0; i < w->nparams; i++) {
        int r = settle(w, i, 1);
        if (!rc && r)
            rc = r;
        if (!r && (r = swap_in(w, i)) && !rc)
            rc = r;
    }
    return rc;
}

/* After the last step: every worker waits for the others, then takes the
 * servers' final weights, so evaluation and --save see the trained model. */
static int pull_final(worker *w)
{
    int rc = ps_client_barrier(w->client, 1);
    if (rc) {
        ps_error("final barrier failed: %s", ps_client_last_error(w->client));
        return rc;
    }
    /* host_pull may still feed an h2d copy issued when the last pull landed */
    if (!w->on_host && (rc = w->b->stream_sync(w->b, PS_STREAM_COPY)))
        return rc;
    for (int i = 0; i < w->nparams && !rc; i++) {
        slot *s = &w->slots[i];
        float *dst = w->on_host ? w->params[i].w : s->host_pull;
        if ((rc = ps_client_pull(w->client, w->params[i].key, dst, 0, &s->pull)) == 0)
            rc = ps_request_wait(&s->pull);
        if (!rc && !w->on_host)
            rc = w->b->copy(w->b, w->params[i].w, s->host_pull,
                            w->params[i].count * sizeof(float), 0, PS_STREAM_COMPUTE);
    }
    if (!rc && !w->on_host)
        rc = w->b->stream_sync(w->b, PS_STREAM_COMPUTE);
    return rc;
}

static int train_loop(worker *w)
{
    const ps_train_config *c = w->cfg;
    FILE *csv = NULL;
    if (c->log_csv) {
        csv = fopen(c->log_csv, "w");
        if (!csv) {
            ps_error("--log-csv %s: cannot create the file", c->log_csv);
            return PS_EIO;
        }
        fprintf(csv, "time_s,epoch,iter,loss,samples_per_s,comm_wait_pct\n");
    }
    /* the same on every worker: sync needs equal step counts (data.h) */
    int64_t per_epoch = (int64_t)ps_data_shard_steps_per_epoch(w->shard);
    int64_t total = per_epoch * c->epochs;
    if (c->max_steps > 0 && c->max_steps < total)
        total = c->max_steps;
    ps_model_hooks hooks = {w, w->client ? before_layer : NULL, w->client ? grad_ready : NULL};
    int rc = 0;
    double acc = -1;
    int64_t t_start = ps_now_ns(), t_win = t_start;
    int64_t win_steps = 0;
    double win_loss = 0;
    int do_eval = c->rank == 0 || c->eval_all;
    ps_info("training %s on %s: %lld steps (%lld per epoch), batch %d, %d worker(s), %s%s",
            ps_model_spec(w->m), w->b->name, (long long)total, (long long)per_epoch, c->batch,
            c->num_workers, w->client ? ps_mode_name(c->mode) : "no servers (local SGD)",
            c->mode == PS_MODE_ASYNC && c->max_staleness >= 0 && w->client ? " (bounded staleness)"
                                                                          : "");
    for (w->step = 0; w->step < total && !rc && !g_stop; w->step++) {
        int64_t k = w->step % per_epoch, epoch = w->step / per_epoch;
        /* our slice of global batch k of the epoch's shuffle, the same on every worker */
        if ((rc = ps_data_shard_fill(w->shard, (uint64_t)epoch, (size_t)k, w->hx, w->hy)))
            break;
        int64_t t0 = ps_now_ns();
        float loss = 0;
        if ((rc = ps_model_load_batch(w->m, w->hx, w->hy, c->batch)) ||
            (rc = ps_model_forward(w->m, ps_model_input(w->m), ps_model_labels(w->m), c->batch,
                                   &hooks, &loss, NULL)))
            break;
        int64_t t1 = ps_now_ns();
        if ((rc = ps_model_backward(w->m, &hooks)))
            break;
        if (!w->client && (rc = ps_model_sgd_step(w->m, c->opt.lr)))
            break;
        int64_t t2 = ps_now_ns();
        ps_trace_event(w->trace, "forward", "compute", TID_TRAIN, t0, t1, w->step, -1);
        ps_trace_event(w->trace, "backward", "compute", TID_TRAIN, t1, t2, w->step, -1);
        win_loss += loss;
        win_steps++;
        int64_t it = w->step + 1;
        if (it % c->log_every == 0 || it == total) {
            int64_t now = ps_now_ns();
            double dt = (double)(now - t_win) * 1e-9;
            double sps = (double)win_steps * c->batch / dt;
            double waitp = 100.0 * (double)w->wait_ns / (double)(now - t_win);
            ps_info("epoch %lld iter %lld/%lld loss %.4f samples/s %.0f comm-wait %.1f%%",
                    (long long)epoch + 1, (long long)it, (long long)total,
                    win_loss / (double)win_steps, sps, waitp);
            if (csv)
                fprintf(csv, "%.3f,%lld,%lld,%.6f,%.1f,%.2f\n", (double)(now - t_start) * 1e-9,
                        (long long)epoch + 1, (long long)it, win_loss / (double)win_steps, sps,
                        waitp);
            t_win = now;
            w->wait_ns = 0;
            win_steps = 0;
            win_loss = 0;
        }
        int epoch_end = (it % per_epoch == 0) && it < total;
        int eval_now = c->eval_every > 0 ? it % c->eval_every == 0 && it < total : epoch_end;
        if (do_eval && eval_now) {
            if (w->client && (rc = finish_requests(w)))
                break;
            rc = evaluate(w, epoch + 1, NULL);
        }
    }
    if (w->client) {
        int r = finish_requests(w);
        if (!rc && !g_stop)
            rc = r;
    }
    double elapsed = (double)(ps_now_ns() - t_start) * 1e-9;
    if (!rc && !g_stop && w->client)
        rc = pull_final(w);
    if (!rc && do_eval && !g_stop)
        rc = evaluate(w, (w->step + per_epoch - 1) / per_epoch, &acc);
    if (csv)
        fclose(csv);
    if (g_stop) {
        ps_warn("stopped by a signal after %lld steps", (long long)w->step);
        return PS_ECLOSED;
    }
    if (!rc) {
        double sps = elapsed > 0 ? (double)w->step * c->batch / elapsed : 0;
        if (acc >= 0)
            ps_info("summary: time %.1f s, %.0f samples/s per worker, test accuracy %.4f", elapsed,
                    sps, acc);
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

    if ((rc = ps_dataset_open(c->data, PS_SPLIT_TRAIN, c->seed, &w.train, why, sizeof why)) ||
        (rc = ps_dataset_open(c->data, PS_SPLIT_TEST, c->seed, &w.test, why, sizeof why))) {
        ps_error("--data: %s", why);
        goto out;
    }
    /* refuses a batch x workers larger than the training set, before anything starts */
    if ((rc = ps_data_shard_create(w.train, c->rank, c->num_workers, c->batch, c->seed, &w.shard,
                                   why, sizeof why))) {
        ps_error("%s", why);
        goto out;
    }
    if ((rc = ps_backend_create(c->device, c->threads, &w.b, why, sizeof why))) {
        ps_error("%s", why);
        goto out;
    }
    w.on_host = w.b->host_memory;
    if ((rc = ps_model_create(c->model, w.train->channels, w.train->height, w.train->width,
                              w.train->num_classes, c->batch, w.b, c->seed, &w.m, why,
                              sizeof why))) {
        ps_error("%s", why);
        goto out;
    }
    if (c->load_path && (rc = ps_model_load(w.m, c->load_path, why, sizeof why))) {
        ps_error("--load: %s", why);
        goto out;
    }
    w.params = ps_model_params(w.m);
    w.nparams = ps_model_num_params(w.m);
    size_t ss = ps_dataset_sample_size(w.train);
    w.hx = malloc((size_t)c->batch * ss * sizeof(float));
    w.hy = malloc((size_t)c->batch * sizeof(int32_t));
    if (!w.hx || !w.hy) {
        rc = PS_ENOMEM;
        goto out;
    }
    if ((rc = alloc_slots(&w))) {
        ps_error("cannot allocate buffers on %s: %s", w.b->name, ps_strerror(rc));
        goto out;
    }
    if (c->timeline) {
        char name[64];
        snprintf(name, sizeof name, "ps_worker[%d]", c->rank);
        if ((rc = ps_trace_open(c->timeline, 1000 + c->rank, name, &w.trace))) {
            ps_error("--timeline %s: cannot create the file", c->timeline);
            goto out;
        }
        ps_trace_thread_name(w.trace, TID_TRAIN, "train");
        ps_trace_thread_name(w.trace, TID_COMM, "requests");
    }
    if (c->servers && (rc = connect_servers(&w)))
        goto out;
    rc = train_loop(&w);
    if (!rc && c->save_path && (c->rank == 0) &&
        (rc = ps_model_save(w.m, c->save_path, why, sizeof why)))
        ps_error("--save: %s", why);
out:
    if (w.client)
        ps_client_close(w.client);
    ps_trace_close(w.trace);
    if (w.m) {
        /* hand the model back the buffers it allocated before it frees them */
        free_slots(&w);
        ps_model_destroy(w.m);
    }
    if (w.b)
        w.b->destroy(w.b);
    free(w.slots);
    free(w.hx);
    free(w.hy);
    ps_data_shard_destroy(w.shard);
    ps_dataset_free(w.train);
    ps_dataset_free(w.test);
    return rc;
}
