/* The exchange (exchange.h): per-tensor double buffers, the staging between
 * device and host memory, and the requests that move them. */
#include "exchange.h"

#include <stdlib.h>

#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* A wait shorter than this is not worth a timeline event. */
#define WAIT_EVENT_NS 20000

/* One tensor's buffers and requests. */
typedef struct tensor {
    uint64_t key;
    size_t count;
    int tag;           /* timeline args.layer */
    float *front;      /* device: what compute reads */
    float *back;       /* device: what pulls fill */
    float *own_w;      /* the weight buffer we allocated (front or back) */
    float *grad[2];    /* device: [0] the caller's, [1] ours; alternate per push */
    float *g;          /* the one the next backward writes */
    float *host_grad;  /* pinned host: the gradient the comm thread sends (device only) */
    float *host_pull;  /* pinned host: where pulls land (device only) */
    ps_event *grad_done, *grad_copied, *pull_copied;
    ps_request push, pull;
    int in_flight;     /* push+pull posted, not yet seen complete */
    int landed;        /* the pull completed; back holds newer weights than front */
    int push_logged;   /* the push's timeline event is written */
    int64_t step;      /* the step of the push in flight (its pull asks for step+1) */
    int64_t posted_ns;
    ps_backend *b;     /* for copy_done on the comm thread */
} tensor;

struct ps_exchange {
    ps_backend *b;
    ps_client *client;
    int mode;
    int init;          /* ps_exchange_set_init: -1 every worker inits, 1 this one, 0 another */
    int started;
    tensor *t;
    int n, cap;
    int64_t wait_ns;   /* time blocked on requests since ps_exchange_take_wait_ns */
    ps_trace *trace;
    int wait_tid, request_tid;
};

/* ---------- staging: the only code that differs with the memory kind ---------- */

/* Runs on the comm thread: has the gradient reached pinned host memory? */
static int copy_done(void *arg)
{
    tensor *t = arg;
    return t->b->event_query(t->b, t->grad_copied) == 1;
}

/* The way out: make gradient g, issued on the compute stream, readable by
 * the comm thread.  *send is the host buffer to send from and *ready (NULL
 * when it already is) what the comm thread polls before it may. */
static int stage_out(ps_exchange *x, tensor *t, const float *g, const float **send,
                     ps_ready_fn *ready)
{
    ps_backend *b = x->b;
    *send = g;
    *ready = NULL;
    if (b->host_memory)
        return 0;
    /* copy stream: after the backward kernels, gradient -> pinned host */
    int rc;
    if ((rc = b->event_record(b, t->grad_done, PS_STREAM_COMPUTE)) ||
        (rc = b->stream_wait_event(b, PS_STREAM_COPY, t->grad_done)) ||
        (rc = b->copy(b, t->host_grad, g, t->count * sizeof(float), 1, PS_STREAM_COPY)) ||
        (rc = b->event_record(b, t->grad_copied, PS_STREAM_COPY)))
        return rc;
    *send = t->host_grad;
    *ready = copy_done;
    return 0;
}

/* Where a pull meant for device buffer dst lands: dst itself in host memory,
 * the pinned host buffer otherwise (then stage_in moves it to dst). */
static float *landing(const ps_exchange *x, tensor *t, float *dst)
{
    return x->b->host_memory ? dst : t->host_pull;
}

/* The way in: move a landed pull to device buffer dst on `stream` and record
 * pull_copied after it; the compute stream waits on that event before it
 * reads dst (see swap_in). */
static int stage_in(ps_exchange *x, tensor *t, float *dst, int stream)
{
    ps_backend *b = x->b;
    if (b->host_memory)
        return 0;
    int rc = b->copy(b, dst, t->host_pull, t->count * sizeof(float), 0, stream);
    return rc ? rc : b->event_record(b, t->pull_copied, stream);
}

/* ---------- requests of one tensor ---------- */

/* The pull of tensor i completed: check it, and start the copy of the new
 * weights into the back buffer. */
static int landed(ps_exchange *x, int i)
{
    tensor *t = &x->t[i];
    t->in_flight = 0;
    int rc = t->push.status ? t->push.status : t->pull.status;
    if (rc) {
        ps_error("step %lld: %s of param %d failed: %s (%s)", (long long)t->step,
                 t->push.status ? "push" : "pull", i, ps_strerror(rc),
                 t->push.status ? t->push.err : t->pull.err);
        return rc;
    }
    ps_trace_event(x->trace, "pull", "comm", x->request_tid, t->posted_ns, t->pull.done_ns,
                   t->step + 1, t->tag);
    if ((rc = stage_in(x, t, t->back, PS_STREAM_COPY)))
        return rc;
    t->landed = 1;
    return 0;
}

/* The push of tensor t was acknowledged: put it on the timeline (post to reply). */
static void push_seen(ps_exchange *x, tensor *t)
{
    if (t->push_logged)
        return;
    t->push_logged = 1;
    ps_trace_event(x->trace, "push", "comm", x->request_tid, t->posted_ns, t->push.done_ns,
                   t->step, t->tag);
}

/* Wait (block = 1) or look (block = 0) for tensor i's requests. */
static int settle(ps_exchange *x, int i, int block)
{
    tensor *t = &x->t[i];
    if (!t->in_flight)
        return 0;
    if (!block) {
        if (!ps_request_test(&t->push))
            return 0;
        push_seen(x, t);
        if (!ps_request_test(&t->pull))
            return 0;
    } else {
        int64_t t0 = ps_now_ns();
        ps_request_wait(&t->push);
        push_seen(x, t);
        ps_request_wait(&t->pull);
        int64_t t1 = ps_now_ns();
        x->wait_ns += t1 - t0;
        if (t1 - t0 > WAIT_EVENT_NS)
            ps_trace_event(x->trace, "wait", "comm", x->wait_tid, t0, t1, t->step + 1, t->tag);
    }
    return landed(x, i);
}

/* Make the landed weights the front copy. */
static int swap_in(ps_exchange *x, tensor *t)
{
    if (!t->landed)
        return 0;
    if (!x->b->host_memory) {
        int rc = x->b->stream_wait_event(x->b, PS_STREAM_COMPUTE, t->pull_copied);
        if (rc)
            return rc;
    }
    float *w = t->front;
    t->front = t->back;
    t->back = w;
    t->landed = 0;
    return 0;
}

/* Post the gradient of tensor t for `step` and the pull of step+1. */
static int post(ps_exchange *x, tensor *t, int64_t step)
{
    const float *send;
    ps_ready_fn ready;
    int rc = stage_out(x, t, t->g, &send, &ready);
    if (rc)
        return rc;
    t->step = step;
    t->posted_ns = ps_now_ns();
    /* on a device the comm thread sends once the copy's event has happened;
     * the training thread goes straight on with the backward of earlier layers */
    if ((rc = ready ? ps_client_push_when(x->client, t->key, send, step, ready, t, &t->push)
                    : ps_client_push(x->client, t->key, send, step, &t->push)) ||
        (rc = ps_client_pull(x->client, t->key, landing(x, t, t->back), step + 1, &t->pull)))
        return rc;
    t->in_flight = 1;
    t->push_logged = 0;
    /* the next backward writes the other buffer while this one is on the wire */
    t->g = t->g == t->grad[0] ? t->grad[1] : t->grad[0];
    return 0;
}

/* Pull tensor t's current weights on the servers (version 0: whatever they
 * hold) into its front, on the compute stream; the caller syncs it. */
static int pull_front(ps_exchange *x, tensor *t)
{
    int rc = ps_client_pull(x->client, t->key, landing(x, t, t->front), 0, &t->pull);
    if (!rc)
        rc = ps_request_wait(&t->pull);
    return rc ? rc : stage_in(x, t, t->front, PS_STREAM_COMPUTE);
}

/* ---------- the API ---------- */

int ps_exchange_adopt(ps_client *c, int mode, ps_backend *b, ps_exchange **out)
{
    *out = NULL;
    ps_exchange *x = calloc(1, sizeof *x);
    if (!x)
        return PS_ENOMEM;
    x->b = b;
    x->mode = mode;
    x->init = -1;
    x->client = c;
    *out = x;
    return 0;
}

int ps_exchange_open(const ps_client_options *o, ps_backend *b, ps_exchange **out)
{
    *out = NULL;
    ps_client *c;
    int rc = ps_client_open(o, &c);
    if (rc)
        return rc;
    if ((rc = ps_exchange_adopt(c, o->mode, b, out)))
        ps_client_close(c);
    return rc;
}

void ps_exchange_set_init(ps_exchange *x, int inits)
{
    x->init = inits ? 1 : 0;
}

void ps_exchange_set_trace(ps_exchange *x, ps_trace *t, int wait_tid, int request_tid)
{
    x->trace = t;
    x->wait_tid = wait_tid;
    x->request_tid = request_tid;
}

int ps_exchange_add(ps_exchange *x, uint64_t key, size_t count, float *w, float *g, int tag)
{
    if (x->started)
        return PS_ESTATE;
    if (x->n == x->cap) {
        /* no request is in flight before start, so the tensors may move */
        int cap = x->cap ? 2 * x->cap : 16;
        tensor *more = realloc(x->t, (size_t)cap * sizeof *more);
        if (!more)
            return PS_ENOMEM;
        x->t = more;
        x->cap = cap;
    }
    tensor *t = &x->t[x->n++];
    *t = (tensor){.key = key, .count = count, .tag = tag, .front = w, .g = g};
    t->grad[0] = g;
    t->b = x->b;
    ps_backend *b = x->b;
    size_t bytes = count * sizeof(float);
    int rc;
    if ((rc = b->alloc(b, bytes, (void **)&t->own_w)) ||
        (rc = b->alloc(b, bytes, (void **)&t->grad[1])))
        return rc;
    t->back = t->own_w;
    if (!b->host_memory &&
        ((rc = b->alloc_host(b, bytes, (void **)&t->host_grad)) ||
         (rc = b->alloc_host(b, bytes, (void **)&t->host_pull)) ||
         (rc = b->event_create(b, &t->grad_done)) ||
         (rc = b->event_create(b, &t->grad_copied)) ||
         (rc = b->event_create(b, &t->pull_copied))))
        return rc;
    return ps_client_register(x->client, key, count);
}

/* Init tensor t on the servers with its front weights; blocks. */
static int init_one(ps_exchange *x, tensor *t)
{
    const float *send;
    ps_ready_fn ready;
    int rc;
    if ((rc = stage_out(x, t, t->front, &send, &ready)) ||
        (ready && (rc = x->b->event_sync(x->b, t->grad_copied))))
        return rc;
    if ((rc = ps_client_init(x->client, t->key, send, &t->push)) == 0)
        rc = ps_request_wait(&t->push);
    return rc;
}

int ps_exchange_start(ps_exchange *x)
{
    int rc = ps_client_start(x->client);
    if (rc) {
        ps_error("cannot start: %s", ps_client_last_error(x->client));
        return rc;
    }
    x->started = 1;
    for (int i = 0; i < x->n && x->init != 0; i++)
        if ((rc = init_one(x, &x->t[i]))) {
            ps_error("init of param %d failed: %s %s", i, ps_strerror(rc), x->t[i].push.err);
            return rc;
        }
    /* one worker inits: the others pull only once it has */
    if (x->init >= 0 && (rc = ps_client_barrier(x->client, PS_EXCHANGE_INIT_BARRIER))) {
        ps_error("start barrier failed: %s", ps_client_last_error(x->client));
        return rc;
    }
    for (int i = 0; i < x->n; i++) {
        if ((rc = pull_front(x, &x->t[i]))) {
            ps_error("first pull of param %d failed: %s %s", i, ps_strerror(rc),
                     x->t[i].pull.err);
            return rc;
        }
        /* host_pull is the next pull's landing: the copy out of it must be done */
        if ((rc = x->b->stream_sync(x->b, PS_STREAM_COMPUTE)))
            return rc;
    }
    return 0;
}

int ps_exchange_num_tensors(const ps_exchange *x)
{
    return x->n;
}

float *ps_exchange_weights(const ps_exchange *x, int i)
{
    return x->t[i].front;
}

float *ps_exchange_grad(const ps_exchange *x, int i)
{
    return x->t[i].g;
}

int ps_exchange_before_use(ps_exchange *x, int i)
{
    /* sync: this tensor's version t+1 only; async: take it if it is there */
    int rc = settle(x, i, x->mode == PS_MODE_SYNC);
    return rc ? rc : swap_in(x, &x->t[i]);
}

/* Async accumulation (DESIGN.md) goes here: when the previous push is still
 * on the wire, add the gradient into a per-tensor sum instead of waiting,
 * and post the sum with the next gradient that finds the wire free; the
 * callers would not change. */
int ps_exchange_grad_ready(ps_exchange *x, int i, int64_t step)
{
    /* the previous step's requests hold the back buffer: finish them */
    int rc = settle(x, i, 1);
    if (rc || (rc = swap_in(x, &x->t[i])))
        return rc;
    return post(x, &x->t[i], step);
}

int ps_exchange_finish(ps_exchange *x)
{
    int rc = 0;
    for (int i = 0; i < x->n; i++) {
        int r = settle(x, i, 1);
        if (!r)
            r = swap_in(x, &x->t[i]);
        if (!rc)
            rc = r;
    }
    return rc;
}

int ps_exchange_pull_final(ps_exchange *x)
{
    int rc = ps_client_barrier(x->client, 1);
    if (rc) {
        ps_error("final barrier failed: %s", ps_client_last_error(x->client));
        return rc;
    }
    /* host_pull may still feed a copy issued when the last pull landed */
    if ((rc = x->b->stream_sync(x->b, PS_STREAM_COPY)))
        return rc;
    for (int i = 0; i < x->n && !rc; i++)
        rc = pull_front(x, &x->t[i]);
    if (!rc)
        rc = x->b->stream_sync(x->b, PS_STREAM_COMPUTE);
    return rc;
}

int64_t ps_exchange_take_wait_ns(ps_exchange *x)
{
    int64_t ns = x->wait_ns;
    x->wait_ns = 0;
    return ns;
}

void ps_exchange_close(ps_exchange *x)
{
    if (!x)
        return;
    /* first the comm thread: it may still read or write our buffers */
    ps_client_close(x->client);
    ps_backend *b = x->b;
    for (int i = 0; i < x->n; i++) {
        tensor *t = &x->t[i];
        if (t->own_w)
            b->free(b, t->own_w);
        if (t->grad[1])
            b->free(b, t->grad[1]);
        if (t->host_grad)
            b->free_host(b, t->host_grad);
        if (t->host_pull)
            b->free_host(b, t->host_pull);
        if (t->grad_done)
            b->event_destroy(b, t->grad_done);
        if (t->grad_copied)
            b->event_destroy(b, t->grad_copied);
        if (t->pull_copied)
            b->event_destroy(b, t->pull_copied);
    }
    free(x->t);
    free(x);
}
