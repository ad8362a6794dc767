/* The exchange (include/ps_exchange.h): per-tensor double buffers, the
 * staging between device and host memory, and the requests that move them;
 * local aggregation, the start and final barriers, and the exchange's life
 * (open, start, finish, close).  The embedding tables' batches are
 * exchange_table.c's; what both share is in exchange_state.h. */
#include "ps_exchange.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exchange_state.h"
#include "local_group.h"
#include "ps_backend.h"
#include "ps_trace.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_time.h"

/* The barrier every worker reaches after its last step. */
#define FINAL_BARRIER_ID 1
/* While the start or final barrier waits, say for whom: first after this
 * long, then this often. */
#define WAIT_NOTE_FIRST_NS (5LL * 1000000000LL)
#define WAIT_NOTE_EVERY_NS (10LL * 1000000000LL)

/* Gradient buffers per tensor: one on the wire, one backward writes, and in
 * async mode one more for the sum of the gradients that came while the wire
 * was busy. */
#define NGRAD 3

/* One tensor's buffers and requests. */
struct tensor {
    uint64_t key;
    size_t count;
    int tag;           /* timeline args.layer */
    float *front;      /* device: what compute reads */
    float *back;       /* device: what pulls fill */
    float *own_w;      /* the weight buffer we allocated (front or back) */
    float *gbuf[NGRAD];/* device: [0] the caller's, the others ours */
    int own_g;         /* gbuf[1..] are ours to free (not in the arena) */
    float *g;          /* the one the next backward writes */
    float *wire;       /* the one the push in flight sends (NULL: none) */
    float *acc;        /* async: the sum of gradients that waited for the wire */
    int64_t acc_n;     /* how many it sums */
    int64_t acc_step;  /* the step of the first of them */
    float *host_grad;  /* pinned host: the gradient the comm thread sends (device only) */
    float *host_pull;  /* pinned host: where pulls land (device only) */
    int own_host;      /* host_grad/host_pull are ours to free (not in the arena) */
    ps_event *grad_done, *grad_copied, *pull_copied;
    ps_request push, pull; /* pp: one pushpull in pull, push unused */
    int pp;
    int in_flight;     /* push+pull posted, not yet seen complete */
    int landed;        /* the pull completed; back holds newer weights than front */
    int push_logged;   /* the push's timeline event is written */
    int64_t step;      /* the step of the push in flight (its pull asks for step+npush) */
    int npush;         /* gradients the push in flight sums */
    int64_t posted_ns;
    /* versions, for the staleness a scrape reads: of the landed weights in back,
     * of those in front, and of those the push in flight was computed on
     * (-1: not known) */
    int64_t v_back, v_front, v_used;
    ps_exchange *x;    /* for copy_done on the comm thread */
    /* local aggregation, a member (local rank > 0): */
    int lg_wait;       /* posted a gradient; the weights it leads to are not in yet */
    uint64_t lg_seen;  /* the generation of the leader's weights last taken */
};

/* ---------- staging: the only code that differs with the memory kind ---------- */

/* Runs on the comm thread: has the gradient reached pinned host memory?
 * When the device failed instead (a sticky CUDA error: every later query
 * fails the same way) the gradient never will: polling on would hold the
 * push, and the training thread waiting for it, forever.  So the first
 * failure is recorded and the client interrupted (a flag and an eventfd
 * write, fine on this thread): every request fails, whatever waits returns,
 * and the exchange's calls return the device's error (psx_device_failed). */
static int copy_done(void *arg)
{
    tensor *t = arg;
    ps_exchange *x = t->x;
    if (__atomic_load_n(&x->device_rc, __ATOMIC_ACQUIRE))
        return 0; /* failed already: the interrupt fails this request too */
    int r = x->b->event_query(x->b, t->grad_copied);
    if (r >= 0)
        return r == 1;
    /* the backend logged the device's own error (file, line, CUDA message) */
    ps_error("%s failed while a gradient (key %llu, step %lld) was copied off it: %s; the "
             "exchange stops: after such an error the device runs nothing more",
             x->b->name, (unsigned long long)t->key, (long long)t->step, ps_strerror(-r));
    __atomic_store_n(&x->device_rc, -r, __ATOMIC_RELEASE);
    ps_client_interrupt(x->client);
    return 0;
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

/* The request that carries tensor t's push: its own, or the pushpull. */
static ps_request *push_req(tensor *t) { return t->pp ? &t->pull : &t->push; }

/* The pull of tensor i completed: check it, and start the copy of the new
 * weights into the back buffer. */
static int landed(ps_exchange *x, int i)
{
    tensor *t = &x->t[i];
    t->in_flight = 0;
    t->wire = NULL; /* the server is done with it */
    ps_request *push = push_req(t);
    int rc = push->status ? push->status : t->pull.status;
    if (rc && psx_device_failed(x))
        return psx_device_failed(x); /* said by copy_done */
    if (rc) {
        /* the first failure says why; the other tensors' (the same cause,
         * as a rule) only with --verbose */
        if (psx_worth_logging(x, rc))
            ps_log(x->failed++ ? PS_LOG_DEBUG : PS_LOG_ERROR,
                   "step %lld: %s of param %d failed: %s (%s)", (long long)t->step,
                   push->status ? "push" : "pull", i, ps_strerror(rc),
                   push->status ? push->err : t->pull.err);
        return rc;
    }
    ps_trace_event(x->trace, "pull", "comm", x->request_tid, t->posted_ns, t->pull.done_ns,
                   t->step + t->npush, t->tag);
    if ((rc = stage_in(x, t, t->back, PS_STREAM_COPY)))
        return rc;
    t->landed = 1;
    t->v_back = t->pull.version;
    /* the updates of others between the weights it was computed on and its own */
    if (t->pp && t->v_used >= 0 && x->met.on)
        psx_metrics_stale(x, t->v_back - t->v_used - t->npush);
    /* the host's other workers take the same weights (what landed: the
     * back buffer in host memory, the pinned landing on a device) */
    if (psx_leader(x))
        ps_lgroup_publish(x->lg, i, x->b->host_memory ? t->back : t->host_pull);
    return 0;
}

/* The push of tensor t was acknowledged: put it on the timeline (post to reply). */
static void push_seen(ps_exchange *x, tensor *t)
{
    if (t->push_logged)
        return;
    t->push_logged = 1;
    ps_trace_event(x->trace, "push", "comm", x->request_tid, t->posted_ns, push_req(t)->done_ns,
                   t->step, t->tag);
}

/* Wait (block = 1) or look (block = 0) for tensor i's requests. */
static int settle(ps_exchange *x, int i, int block)
{
    tensor *t = &x->t[i];
    if (!t->in_flight)
        return 0;
    if (!block) {
        if (!ps_request_test(push_req(t)))
            return 0;
        push_seen(x, t);
        if (!ps_request_test(&t->pull))
            return 0;
    } else {
        int64_t t0 = ps_now_ns();
        ps_request_wait(push_req(t));
        push_seen(x, t);
        ps_request_wait(&t->pull);
        int64_t t1 = ps_now_ns();
        psx_waited(x, t1 - t0);
        if (t1 - t0 > WAIT_EVENT_NS)
            ps_trace_event(x->trace, "wait", "comm", x->wait_tid, t0, t1, t->step + t->npush,
                           t->tag);
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
    t->v_front = t->v_back;
    return 0;
}

/* A gradient buffer that nothing holds: not on the wire, not the sum, not
 * the one backward writes. */
static float *free_grad(const tensor *t)
{
    for (int k = 0; k < NGRAD; k++)
        if (t->gbuf[k] && t->gbuf[k] != t->wire && t->gbuf[k] != t->acc && t->gbuf[k] != t->g)
            return t->gbuf[k];
    return NULL;
}

/* Post gradient buffer `send` of tensor t, which sums npush gradients from
 * `step` on, and the pull of the version after them; backward writes
 * another buffer while this one is on the wire. */
static int post(ps_exchange *x, tensor *t, float *send_buf, int64_t step, int npush)
{
    const float *send;
    ps_ready_fn ready;
    int rc = stage_out(x, t, send_buf, &send, &ready);
    if (rc)
        return rc;
    t->step = step;
    t->npush = npush;
    t->v_used = t->v_front;
    t->posted_ns = ps_now_ns();
    /* on a device the comm thread sends once the copy's event has happened;
     * the training thread goes straight on with the backward of earlier layers */
    /* one round trip: the push and the pull of the version after it in one
     * message (through shared memory, two offsets in one header) */
    t->pp = 1;
    if ((rc = ps_client_pushpull_sum(x->client, t->key, send, landing(x, t, t->back), step,
                                     npush, ready, t, &t->pull)))
        return psx_device_failed(x) ? psx_device_failed(x) : rc;
    t->in_flight = 1;
    t->push_logged = 0;
    t->wire = send_buf;
    if (t->g == send_buf)
        t->g = free_grad(t);
    return 0;
}

/* Add gradient g into the sum acc on the compute stream. */
static int add_into(ps_exchange *x, tensor *t, float *acc, const float *g)
{
    return x->b->axpy(x->b, acc, 1.0f, g, t->count);
}

/* Pull tensor t's current weights on the servers (version 0: whatever they
 * hold) into its front, on the compute stream; the caller syncs it. */
static int pull_front(ps_exchange *x, tensor *t)
{
    int rc = ps_client_pull(x->client, t->key, landing(x, t, t->front), 0, &t->pull);
    if (!rc)
        rc = ps_request_wait(&t->pull);
    t->v_front = rc ? -1 : t->pull.version;
    return rc ? rc : stage_in(x, t, t->front, PS_STREAM_COMPUTE);
}

/* ---------- local aggregation (local_group.h) ---------- */

static int lg_fail(ps_exchange *x, int rc, const char *why)
{
    if (psx_worth_logging(x, rc))
        ps_error("%s", why);
    return rc;
}

/* Member: the gradient of tensor i (issued on the compute stream) into its
 * slot of the group; the leader sums it into the host's push. */
static int lg_post(ps_exchange *x, int i)
{
    tensor *t = &x->t[i];
    ps_backend *b = x->b;
    const float *src = t->g;
    int rc;
    if (!b->host_memory) {
        if ((rc = b->copy(b, t->host_grad, t->g, t->count * sizeof(float), 1,
                          PS_STREAM_COMPUTE)) ||
            (rc = b->stream_sync(b, PS_STREAM_COMPUTE)))
            return rc;
        src = t->host_grad;
    }
    char why[400];
    int64_t t0 = ps_now_ns();
    rc = ps_lgroup_post_grad(x->lg, i, src, why, sizeof why);
    psx_waited(x, ps_now_ns() - t0);
    if (rc)
        return lg_fail(x, rc, why);
    t->lg_wait = 1;
    return 0;
}

/* Member: the leader's newest weights of tensor i into the front, if it
 * published any since the last taken (block: wait for them). */
static int lg_take(ps_exchange *x, int i, int block)
{
    tensor *t = &x->t[i];
    ps_backend *b = x->b;
    float *dst = b->host_memory ? t->front : t->host_pull;
    int took = 0;
    char why[400];
    int64_t t0 = ps_now_ns();
    int rc = ps_lgroup_take(x->lg, i, dst, &t->lg_seen, block, &took, why, sizeof why);
    int64_t t1 = ps_now_ns();
    psx_waited(x, t1 - t0);
    if (t1 - t0 > WAIT_EVENT_NS)
        ps_trace_event(x->trace, "wait", "comm", x->wait_tid, t0, t1, (int64_t)t->lg_seen,
                       t->tag);
    if (rc)
        return lg_fail(x, rc, why);
    if (!took)
        return 0;
    t->lg_wait = 0;
    if (b->host_memory)
        return 0;
    /* the landing is taken into again only after this copy is done */
    if ((rc = b->copy(b, t->front, t->host_pull, t->count * sizeof(float), 0,
                      PS_STREAM_COMPUTE)))
        return rc;
    return b->stream_sync(b, PS_STREAM_COMPUTE);
}

/* Leader: tensor i's gradient becomes the mean of the host's workers'. */
static int lg_sum(ps_exchange *x, int i)
{
    tensor *t = &x->t[i];
    ps_backend *b = x->b;
    size_t bytes = t->count * sizeof(float);
    float *g = b->host_memory ? t->g : x->lg_scratch;
    int rc;
    if (!b->host_memory && ((rc = b->copy(b, g, t->g, bytes, 1, PS_STREAM_COMPUTE)) ||
                            (rc = b->stream_sync(b, PS_STREAM_COMPUTE))))
        return rc;
    char why[400];
    int64_t t0 = ps_now_ns();
    rc = ps_lgroup_sum_grads(x->lg, i, g, why, sizeof why);
    psx_waited(x, ps_now_ns() - t0);
    if (rc)
        return lg_fail(x, rc, why);
    if (!b->host_memory && ((rc = b->copy(b, t->g, g, bytes, 0, PS_STREAM_COMPUTE)) ||
                            (rc = b->stream_sync(b, PS_STREAM_COMPUTE))))
        return rc;
    return 0;
}

static int lg_open(ps_exchange *x)
{
    if (x->n < 1)
        return 0;
    size_t *counts = malloc((size_t)x->n * sizeof *counts), most = 0;
    if (!counts)
        return PS_ENOMEM;
    for (int i = 0; i < x->n; i++) {
        counts[i] = x->t[i].count;
        if (counts[i] > most)
            most = counts[i];
    }
    char why[600];
    ps_lgroup *g = NULL;
    int rc = ps_lgroup_open(x->lg_name, x->lg_rank, x->lg_size, counts, x->n,
                            x->lg_timeout_ms, &x->interrupted, &g, why, sizeof why);
    free(counts);
    if (rc)
        return lg_fail(x, rc, why);
    __atomic_store_n(&x->lg, g, __ATOMIC_RELEASE);
    if (psx_leader(x) && !x->b->host_memory && !(x->lg_scratch = malloc(most * sizeof(float))))
        return PS_ENOMEM;
    ps_info("local aggregation: local rank %d of %d on this host (group %s): %s", x->lg_rank,
            x->lg_size, x->lg_name,
            x->lg_rank ? "gradients and weights go through the leader"
                       : "the leader: sums the host's gradients and talks to the servers");
    return 0;
}

int ps_exchange_set_local_group(ps_exchange *x, const char *name, int local_rank,
                                int local_size, int timeout_ms)
{
    if (x->started)
        return PS_ESTATE;
    if (!name || strlen(name) >= sizeof x->lg_name || local_size < 2 ||
        local_size > PS_LGROUP_MAX || local_rank < 0 || local_rank >= local_size)
        return PS_EINVAL;
    snprintf(x->lg_name, sizeof x->lg_name, "%s", name);
    x->lg_rank = local_rank;
    x->lg_size = local_size;
    x->lg_timeout_ms = timeout_ms;
    return 0;
}

/* ---------- the start and final barriers ---------- */

/* Barrier `id` (the `what` one) still waits: say for whom (server 0
 * knows), at `level`, so a run whose other workers never came, were
 * refused, or died, does not look hung. */
static void note_wait(ps_exchange *x, int64_t id, const char *what, int level)
{
    const char *why = "every worker waits here for all --num-workers";
    ps_barrier_info bi;
    int rc = ps_client_barrier_info(x->client, &bi);
    if (!psx_worth_logging(x, rc))
        return;
    if (rc || bi.id != id || bi.missing == 0) {
        ps_log(level, "waiting at the %s barrier for the other workers (%s %d)", what, why,
               x->num_workers);
        return;
    }
    char who[512];
    size_t off = (size_t)snprintf(who, sizeof who, "worker%s", bi.missing > 1 ? "s" : "");
    for (uint32_t k = 0; k < bi.nranks && off < sizeof who; k++)
        off += (size_t)snprintf(who + off, sizeof who - off, "%s %d", k ? "," : "",
                                (int)bi.ranks[k]);
    if (bi.missing > bi.nranks && off < sizeof who)
        snprintf(who + off, sizeof who - off, " and %u more", bi.missing - bi.nranks);
    ps_log(level, "waiting for %s at the %s barrier (%s %d)", who, what, why, x->num_workers);
}

/* Wait at barrier `id`, saying for whom after 5 s and then every 10 s, and
 * giving up after the wait timeout (ps_exchange_set_wait_timeout). */
static int wait_barrier(ps_exchange *x, int64_t id, const char *what)
{
    ps_request bar;
    int rc = ps_client_barrier_post(x->client, id, &bar);
    int64_t t0 = ps_now_ns(), note_at = t0 + WAIT_NOTE_FIRST_NS;
    int64_t end = x->wait_timeout_ms ? t0 + x->wait_timeout_ms * 1000000LL : INT64_MAX;
    while (!rc) {
        int64_t until = note_at < end ? note_at : end;
        int64_t ms = (until - ps_now_ns()) / 1000000;
        int st = ps_request_wait_for(&bar, ms > 0 ? (int)ms : 0);
        if (st >= 0) { /* complete */
            rc = st;
            break;
        }
        if (ps_now_ns() >= end) {
            note_wait(x, id, what, PS_LOG_ERROR);
            ps_error("gave up at the %s barrier after %d s (the wait timeout): the workers "
                     "named above never came; start them, or check their logs for why they "
                     "were refused", what, x->wait_timeout_ms / 1000);
            rc = PS_ETIMEDOUT;
            ps_client_interrupt(x->client); /* the barrier is still posted: nothing goes on */
            ps_request_wait(&bar);
            return rc;
        }
        note_wait(x, id, what, PS_LOG_INFO);
        note_at = ps_now_ns() + WAIT_NOTE_EVERY_NS;
    }
    if (rc && psx_worth_logging(x, rc))
        ps_error("%s barrier failed: %s", what, bar.err);
    if (rc)
        psc_client_set_error(x->client, bar.err);
    return rc;
}

/* ---------- the API ---------- */

int ps_exchange_adopt(ps_client *c, const ps_client_options *o, ps_backend *b,
                      ps_exchange **out)
{
    *out = NULL;
    ps_exchange *x = calloc(1, sizeof *x);
    if (!x)
        return PS_ENOMEM;
    x->b = b;
    x->mode = o->mode;
    /* async: a gradient that finds the wire busy joins a sum instead of
     * waiting; with --max-staleness k at most k of them, so the worker never
     * computes more than k steps past the weights it last pulled (k = 0:
     * lock-step, it always waits) */
    x->accumulate = o->mode == PS_MODE_ASYNC && o->max_staleness != 0;
    x->max_sum = o->max_staleness < 0 ? INT64_MAX : o->max_staleness;
    x->num_workers = o->num_workers;
    x->init = -1;
    x->client = c;
    psx_metrics_open(x);
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
    if ((rc = ps_exchange_adopt(c, o, b, out)))
        ps_client_close(c);
    return rc;
}

void ps_exchange_set_init(ps_exchange *x, int inits)
{
    x->init = inits ? 1 : 0;
}

int ps_exchange_set_wire_dtype(ps_exchange *x, int dtype)
{
    return ps_client_set_wire_dtype(x->client, dtype);
}

void ps_exchange_set_wait_timeout(ps_exchange *x, int timeout_ms)
{
    x->wait_timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

int ps_exchange_set_back(ps_exchange *x, int i, float *back)
{
    if (x->started)
        return PS_ESTATE;
    if (i < 0 || i >= x->n || !back || !x->b->host_memory)
        return PS_EINVAL;
    tensor *t = &x->t[i];
    if (t->own_w) {
        x->b->free(x->b, t->own_w);
        t->own_w = NULL;
    }
    t->back = back;
    return 0;
}

void ps_exchange_set_trace(ps_exchange *x, ps_trace *t, int wait_tid, int request_tid)
{
    x->trace = t;
    x->wait_tid = wait_tid;
    x->request_tid = request_tid;
}

/* Gradient buffers a tensor needs: the sum is only kept in async mode. */
static int grad_buffers(const ps_exchange *x) { return x->accumulate ? 3 : 2; }

/* Free what tensor t's buffers came from the backend (not the arena's, not
 * the caller's). */
static void free_own(ps_backend *b, tensor *t)
{
    if (t->own_w)
        b->free(b, t->own_w);
    t->own_w = NULL;
    for (int k = 1; t->own_g && k < NGRAD; k++)
        if (t->gbuf[k])
            b->free(b, t->gbuf[k]);
    t->own_g = 0;
    if (t->own_host) {
        if (t->host_grad)
            b->free_host(b, t->host_grad);
        if (t->host_pull)
            b->free_host(b, t->host_pull);
    }
    t->own_host = 0;
}

/* Same host as a server (ps_client_shm_servers > 0): the buffers the
 * network would carry move into the client's shared-memory arena, so a
 * server reads gradients where backward wrote them and writes weights where
 * forward reads them: on host memory the weights and gradients themselves;
 * on a device the pinned staging buffers, the arena page-locked for DMA.
 * Best effort: a tensor the arena has no room for stays where it was. */
static void to_arena(ps_exchange *x)
{
    ps_backend *b = x->b;
    if (!b->host_memory) {
        void *base;
        size_t bytes;
        ps_client_shm_region(x->client, &base, &bytes);
        if (!base || (b->host_register && b->host_register(b, base, bytes) != 0))
            return;
        x->registered = b->host_register ? base : NULL;
    }
    int moved = 0;
    for (int i = 0; i < x->n; i++) {
        tensor *t = &x->t[i];
        size_t bytes = t->count * sizeof(float);
        float *buf[2 + NGRAD] = {0};
        int need = b->host_memory ? 2 + grad_buffers(x) : 2, k;
        for (k = 0; k < need; k++)
            if (!(buf[k] = ps_client_shm_alloc(x->client, bytes)))
                break;
        if (k < need) {
            ps_warn("the shared-memory arena is full at tensor %d of %d: the rest go over the "
                    "network", i, x->n);
            break;
        }
        if (b->host_memory) {
            memcpy(buf[0], t->front, bytes); /* the first weights, before init */
            free_own(b, t);
            t->front = buf[0];
            t->back = buf[1];
            for (k = 0; k < NGRAD; k++)
                t->gbuf[k] = k < grad_buffers(x) ? buf[2 + k] : NULL;
            t->g = t->gbuf[0];
        } else {
            if (t->own_host) {
                b->free_host(b, t->host_grad);
                b->free_host(b, t->host_pull);
            }
            t->own_host = 0;
            t->host_grad = buf[0];
            t->host_pull = buf[1];
        }
        moved++;
    }
    x->in_arena = moved > 0;
    ps_info("%d of %d tensors in shared memory (%s buffers)", moved, x->n,
            b->host_memory ? "weight and gradient" : "pinned staging");
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
    *t = (tensor){.key = key, .count = count, .tag = tag, .front = w, .g = g, .v_back = -1,
                  .v_front = -1, .v_used = -1};
    t->gbuf[0] = g;
    t->own_g = 1;
    t->x = x;
    ps_backend *b = x->b;
    size_t bytes = count * sizeof(float);
    int rc;
    if ((rc = b->alloc(b, bytes, (void **)&t->own_w)))
        return rc;
    for (int k = 1; k < grad_buffers(x); k++)
        if ((rc = b->alloc(b, bytes, (void **)&t->gbuf[k])))
            return rc;
    t->back = t->own_w;
    t->own_host = 1;
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
    int rc;
    if (x->lg_size > 1 && ps_client_num_tables(x->client) > 0)
        return lg_fail(x, PS_EINVAL, "local aggregation (--local-aggregate) does not take "
                       "embedding tables yet: this worker's client has tables registered; run "
                       "without it");
    if (x->lg_size > 1 && (rc = lg_open(x)))
        return rc;
    if (psx_member(x)) {
        /* no servers: the leader's first weights */
        x->started = 1;
        for (int i = 0; i < x->n; i++)
            if ((rc = lg_take(x, i, 1)))
                return rc;
        return 0;
    }
    rc = ps_client_start(x->client);
    if (rc) {
        if (psx_worth_logging(x, rc))
            ps_error("cannot start: %s", ps_client_last_error(x->client));
        return rc;
    }
    x->started = 1;
    if (ps_client_shm_servers(x->client) > 0)
        to_arena(x);
    for (int i = 0; i < x->n && x->init != 0; i++)
        if ((rc = init_one(x, &x->t[i]))) {
            ps_error("init of param %d failed: %s %s", i, ps_strerror(rc), x->t[i].push.err);
            return rc;
        }
    /* one worker inits: the others pull only once it has */
    if (x->init >= 0 && (rc = wait_barrier(x, PS_EXCHANGE_INIT_BARRIER, "start")))
        return rc;
    for (int i = 0; i < x->n; i++) {
        if ((rc = pull_front(x, &x->t[i]))) {
            ps_error("first pull of param %d failed: %s %s", i, ps_strerror(rc),
                     x->t[i].pull.err);
            return rc;
        }
        if (psx_leader(x))
            ps_lgroup_publish(x->lg, i, landing(x, &x->t[i], x->t[i].front));
        /* host_pull is the next pull's landing: the copy out of it must be done */
        if ((rc = x->b->stream_sync(x->b, PS_STREAM_COMPUTE)))
            return rc;
    }
    if (psx_leader(x)) {
        char why[400];
        if ((rc = ps_lgroup_wait_members(x->lg, why, sizeof why)))
            return lg_fail(x, rc, why);
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
    if (psx_member(x)) /* sync: the weights its last gradient leads to */
        return lg_take(x, i, x->mode == PS_MODE_SYNC && x->t[i].lg_wait);
    /* sync: this tensor's version t+1 only; async: take it if it is there */
    int rc = settle(x, i, x->mode == PS_MODE_SYNC);
    return rc ? rc : swap_in(x, &x->t[i]);
}

int ps_exchange_grad_ready(ps_exchange *x, int i, int64_t step)
{
    tensor *t = &x->t[i];
    int rc;
    if (psx_member(x))
        return lg_post(x, i);
    if (psx_leader(x) && (rc = lg_sum(x, i)))
        return rc;
    if (x->accumulate && t->in_flight && t->acc_n < x->max_sum &&
        !(ps_request_test(push_req(t)) && ps_request_test(&t->pull))) {
        /* async: the wire is busy with the previous push; never wait for a
         * round trip: keep this gradient in the sum, sent when it is free */
        if (!t->acc) {
            t->acc = t->g;
            t->acc_n = 1;
            t->acc_step = step;
            t->g = free_grad(t);
        } else {
            if ((rc = add_into(x, t, t->acc, t->g)))
                return rc;
            t->acc_n++;
        }
        return 0;
    }
    /* the previous step's requests hold the back buffer: finish them */
    if ((rc = settle(x, i, 1)) || (rc = swap_in(x, t)))
        return rc;
    if (!t->acc)
        return post(x, t, t->g, step, 1);
    /* this gradient joins the sum, which goes out now */
    if ((rc = add_into(x, t, t->acc, t->g)))
        return rc;
    float *sum = t->acc;
    int64_t first = t->acc_step, m = t->acc_n + 1;
    t->acc = NULL;
    t->acc_n = 0;
    x->summed += (uint64_t)m;
    return post(x, t, sum, first, (int)m);
}

/* A sum still waiting for the wire goes out (at the end, before an
 * evaluation): wait for the wire, then post it. */
static int flush_sum(ps_exchange *x, int i)
{
    tensor *t = &x->t[i];
    if (!t->acc)
        return 0;
    int rc = settle(x, i, 1);
    if (rc || (rc = swap_in(x, t)))
        return rc;
    float *sum = t->acc;
    int64_t m = t->acc_n;
    t->acc = NULL;
    t->acc_n = 0;
    x->summed += (uint64_t)m;
    return post(x, t, sum, t->acc_step, (int)m);
}

int ps_exchange_finish(ps_exchange *x)
{
    int rc = 0;
    if (psx_member(x)) {
        for (int i = 0; i < x->n && !rc; i++)
            if (x->t[i].lg_wait)
                rc = lg_take(x, i, 1);
        return rc;
    }
    for (int i = 0; i < x->n; i++) {
        int r = flush_sum(x, i);
        if (!r)
            r = settle(x, i, 1);
        if (!r)
            r = swap_in(x, &x->t[i]);
        if (!rc)
            rc = r;
    }
    int r = psx_tables_finish(x);
    return rc ? rc : r;
}

int ps_exchange_pull_final(ps_exchange *x)
{
    int rc;
    if (psx_member(x)) {
        char why[400];
        if ((rc = ps_lgroup_wait_final(x->lg, why, sizeof why)))
            return lg_fail(x, rc, why);
        for (int i = 0; i < x->n && !rc; i++)
            rc = lg_take(x, i, 0);
        x->lg_done = !rc;
        return rc;
    }
    if ((rc = wait_barrier(x, FINAL_BARRIER_ID, "final")))
        return rc;
    /* host_pull may still feed a copy issued when the last pull landed */
    if ((rc = x->b->stream_sync(x->b, PS_STREAM_COPY)))
        return rc;
    for (int i = 0; i < x->n && !rc; i++)
        rc = pull_front(x, &x->t[i]);
    if (!rc && psx_leader(x)) {
        for (int i = 0; i < x->n; i++)
            ps_lgroup_publish(x->lg, i, landing(x, &x->t[i], x->t[i].front));
        ps_lgroup_set_final(x->lg);
        x->lg_done = 1;
    }
    if (!rc)
        rc = x->b->stream_sync(x->b, PS_STREAM_COMPUTE);
    return rc;
}

void ps_exchange_step_done(ps_exchange *x, uint64_t samples)
{
    if (!x->met.on)
        return;
    atomic_fetch_add_explicit(&x->met.steps, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&x->met.samples, samples, memory_order_relaxed);
}

const char *ps_exchange_metrics_url(const ps_exchange *x)
{
    return ps_client_metrics_url(x->client);
}

int64_t ps_exchange_take_wait_ns(ps_exchange *x)
{
    int64_t ns = x->wait_ns;
    x->wait_ns = 0;
    return ns;
}

void ps_exchange_interrupt(ps_exchange *x)
{
    __atomic_store_n(&x->interrupted, 1, __ATOMIC_RELEASE);
    ps_client_interrupt(x->client);
    /* the host's other workers stop waiting for this one (an atomic store) */
    ps_lgroup_abort(__atomic_load_n(&x->lg, __ATOMIC_ACQUIRE));
}

void ps_exchange_close(ps_exchange *x)
{
    if (!x)
        return;
    if (x->summed)
        ps_info("%llu gradients went out in sums with others instead of waiting for the wire",
                (unsigned long long)x->summed);
    psx_metrics_close(x); /* no scrape reads x after this */
    ps_backend *b = x->b;
    if (x->registered) {
        /* no copy may still run on the arena when it is unpinned */
        b->stream_sync(b, PS_STREAM_COPY);
        b->stream_sync(b, PS_STREAM_COMPUTE);
        b->host_unregister(b, x->registered);
    }
    /* then the comm thread: it may still read or write our buffers; closing
     * the client unmaps the arena */
    ps_client_close(x->client);
    if (x->lg) {
        if (!x->lg_done) /* stopped early: nobody of the host waits for us */
            ps_lgroup_abort(x->lg);
        ps_lgroup_close(x->lg);
    }
    free(x->lg_scratch);
    for (int i = 0; i < x->n; i++) {
        tensor *t = &x->t[i];
        free_own(b, t);
        if (t->grad_done)
            b->event_destroy(b, t->grad_done);
        if (t->grad_copied)
            b->event_destroy(b, t->grad_copied);
        if (t->pull_copied)
            b->event_destroy(b, t->pull_copied);
    }
    free(x->t);
    psx_tables_free(x);
    free(x);
}
