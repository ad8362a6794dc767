/* libps: a request's life and the sub-request slots.
 *
 * A ps_request is posted by the training thread (psc_req_reset), split by the
 * comm thread into one sub-request slot per message, and completed when its
 * _priv.pending parts are done: each slot's reply (psc_slot_finish) and each
 * zero-copy frame's release (psc_release_cb, on ZeroMQ's I/O thread).
 * Waiters sleep on a condition variable (c->waits) that is touched only
 * when somebody waits, so completing costs no lock when communication
 * overlaps compute.
 *
 * Slots belong to the comm thread alone: no lock.  A slot index and its
 * generation make the request id, so a late duplicate reply finds its slot
 * freed or reused and is dropped. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_metrics.h"
#include "client_requests.h"
#include "ps_time.h"

/* Completions: any thread. */
struct psc_waits {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC, as psc_wait_until's deadlines */
    int nwaiters;      /* threads in psc_wait_until (atomic) */
};

int psc_requests_new(ps_client *c, void (*sp_free)(ps_client *c, psc_sparse_sub *sp))
{
    struct psc_waits *w = calloc(1, sizeof *w);
    struct psc_slots *sl = calloc(1, sizeof *sl);
    psc_slot_server *ss = calloc((size_t)c->nservers, sizeof *ss);
    if (!w || !sl || !ss) {
        free(w);
        free(sl);
        free(ss);
        return PS_ENOMEM;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    sl->free_head = PSC_NO_SLOT;
    sl->server = ss;
    sl->nserver = c->nservers;
    sl->sp_free = sp_free;
    c->waits = w;
    c->slots = sl;
    return 0;
}

void psc_requests_free(ps_client *c)
{
    if (c->waits) {
        pthread_mutex_destroy(&c->waits->mu);
        pthread_cond_destroy(&c->waits->cv);
        free(c->waits);
        c->waits = NULL;
    }
    if (c->slots) {
        free(c->slots->sub);
        free(c->slots->server);
        free(c->slots);
        c->slots = NULL;
    }
}

/* ---------- completion ---------- */

/* Mark r done and wake waiters.  The lock and broadcast are skipped when
 * nobody waits (the usual case when communication overlaps compute); the
 * seq_cst pair done/nwaiters here and in psc_wait_until makes sure a waiter
 * that saw done == 0 is always counted before we look. */
static void complete(ps_client *c, ps_request *r)
{
    r->done_ns = ps_now_ns(); /* published by the store of done below */
    __atomic_store_n(&r->_priv.done, 1, __ATOMIC_SEQ_CST);
    struct psc_waits *w = c->waits;
    if (__atomic_load_n(&w->nwaiters, __ATOMIC_SEQ_CST) == 0)
        return;
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void psc_part_done(ps_client *c, ps_request *r)
{
    if (__atomic_sub_fetch(&r->_priv.pending, 1, __ATOMIC_ACQ_REL) == 0)
        complete(c, r);
}

void psc_release_cb(void *data, void *hint)
{
    (void)data;
    ps_request *r = hint;
    psc_part_done(r->_priv.client, r);
}

void psc_set_error(ps_request *r, int code, const char *fmt, ...)
{
    if (r->status)
        return;
    r->status = code ? code : PS_EPROTO;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
}

void psc_req_reset(ps_client *c, ps_request *r, int pending)
{
    r->status = 0;
    r->version = -1;
    r->done_ns = 0;
    r->err[0] = 0;
    r->_priv.pending = pending;
    r->_priv.done = 0;
    r->_priv.client = c;
}

void psc_req_fail(ps_request *r, int code, const char *text)
{
    r->status = code;
    r->version = -1;
    snprintf(r->err, sizeof r->err, "%s", text);
    r->_priv.pending = 0;
    r->_priv.client = NULL;
    r->done_ns = ps_now_ns();
    __atomic_store_n(&r->_priv.done, 1, __ATOMIC_RELEASE);
}

void psc_req_unsent(ps_client *c, ps_request *r)
{
    psc_set_error(r, PS_ECLOSED, "client closed before the request was sent");
    __atomic_store_n(&r->_priv.pending, 0, __ATOMIC_RELEASE);
    complete(c, r);
}

/* ---------- waiting (any thread) ---------- */

int ps_request_test(ps_request *req) { return __atomic_load_n(&req->_priv.done, __ATOMIC_ACQUIRE); }

int psc_wait_until(ps_request *r, int64_t deadline_ns)
{
    if (__atomic_load_n(&r->_priv.done, __ATOMIC_ACQUIRE))
        return 1;
    ps_client *c = r->_priv.client;
    if (!c)
        return 0;
    struct psc_waits *w = c->waits;
    int64_t t0 = c->metrics ? ps_now_ns() : 0;
    pthread_mutex_lock(&w->mu);
    __atomic_add_fetch(&w->nwaiters, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&r->_priv.done, __ATOMIC_SEQ_CST)) {
        if (deadline_ns == INT64_MAX) {
            pthread_cond_wait(&w->cv, &w->mu);
        } else {
            if (ps_now_ns() >= deadline_ns)
                break;
            struct timespec ts = {deadline_ns / 1000000000LL, deadline_ns % 1000000000LL};
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
    }
    __atomic_sub_fetch(&w->nwaiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&w->mu);
    if (t0)
        psc_metrics_waited(c, ps_now_ns() - t0);
    return __atomic_load_n(&r->_priv.done, __ATOMIC_ACQUIRE);
}

int ps_request_wait(ps_request *req)
{
    if (!req)
        return PS_EINVAL;
    if (!psc_wait_until(req, INT64_MAX))
        return PS_EINVAL; /* never posted */
    return req->status;
}

int ps_request_wait_for(ps_request *req, int timeout_ms)
{
    if (!req)
        return PS_EINVAL;
    if (__atomic_load_n(&req->_priv.done, __ATOMIC_ACQUIRE))
        return req->status;
    if (!req->_priv.client)
        return PS_EINVAL; /* never posted */
    int64_t deadline =
        timeout_ms < 0 ? INT64_MAX : ps_now_ns() + (int64_t)timeout_ms * 1000000LL;
    return psc_wait_until(req, deadline) ? req->status : -1;
}

/* ---------- sub-request slots (comm thread) ---------- */

static uint32_t slot_alloc(struct psc_slots *sl)
{
    if (sl->free_head == PSC_NO_SLOT) {
        if (sl->n == sl->cap) {
            uint32_t ncap = sl->cap ? sl->cap * 2 : 256;
            psc_sub *n = realloc(sl->sub, (size_t)ncap * sizeof *n);
            if (!n)
                return PSC_NO_SLOT;
            sl->sub = n;
            sl->cap = ncap;
        }
        uint32_t i = sl->n++;
        memset(&sl->sub[i], 0, sizeof sl->sub[i]);
        sl->sub[i].gen = 1;
        sl->sub[i].next_free = PSC_NO_SLOT;
        sl->free_head = i;
    }
    uint32_t i = sl->free_head;
    sl->free_head = sl->sub[i].next_free;
    sl->live++;
    return i;
}

static void slot_free(ps_client *c, uint32_t i)
{
    struct psc_slots *sl = c->slots;
    psc_sub *s = &sl->sub[i];
    sl->server[s->server].nlive--;
    s->req = NULL;
    if (s->sp)
        sl->sp_free(c, s->sp);
    s->sp = NULL;
    free(s->own);
    s->own = NULL;
    s->gen = s->gen + 1 ? s->gen + 1 : 1;
    s->next_free = sl->free_head;
    sl->free_head = i;
    sl->live--;
}

uint32_t psc_slot_new(ps_client *c, int server, uint32_t type, ps_request *r)
{
    struct psc_slots *sl = c->slots;
    uint32_t i = slot_alloc(sl);
    if (i == PSC_NO_SLOT)
        return PSC_NO_SLOT;
    psc_sub *s = &sl->sub[i];
    s->req = r;
    s->type = type;
    s->server = server;
    if (sl->server[server].nlive++ == 0)
        sl->server[server].busy_since_ns = ps_now_ns();
    s->chunk = 0;
    s->key = 0;
    s->count = 0;
    s->total = 0;
    s->src = NULL;
    s->dst = NULL;
    s->step = 0;
    s->npush = 1;
    s->out = NULL;
    s->sp = NULL;
    s->own = NULL;
    s->deadline_ns = INT64_MAX;
    s->backoff_ns = 0;
    s->parked = 0;
    s->obj_kind = 0;
    s->home = server;
    s->obj = s->obj_table = 0;
    s->hops = s->loads = 0;
    s->load_since_ns = 0;
    s->retry = 0;
    return i;
}

void psc_slot_move(ps_client *c, uint32_t i, int to)
{
    struct psc_slots *sl = c->slots;
    psc_sub *s = &sl->sub[i];
    if (s->server == to)
        return;
    sl->server[s->server].nlive--;
    s->server = to;
    if (sl->server[to].nlive++ == 0)
        sl->server[to].busy_since_ns = ps_now_ns();
}

int psc_requests_grow(ps_client *c, int nslots)
{
    struct psc_slots *sl = c->slots;
    if (nslots <= sl->nserver)
        return 0;
    psc_slot_server *ss = realloc(sl->server, (size_t)nslots * sizeof *ss);
    if (!ss)
        return PS_ENOMEM;
    memset(ss + sl->nserver, 0, (size_t)(nslots - sl->nserver) * sizeof *ss);
    sl->server = ss;
    sl->nserver = nslots;
    return 0;
}

uint64_t psc_slot_id(const ps_client *c, uint32_t i)
{
    return (uint64_t)c->slots->sub[i].gen << 32 | i;
}

uint32_t psc_slot_find(const ps_client *c, uint64_t seq, int server)
{
    const struct psc_slots *sl = c->slots;
    uint32_t i = (uint32_t)(seq & 0xffffffffu);
    if (i >= sl->n || !sl->sub[i].req || psc_slot_id(c, i) != seq ||
        sl->sub[i].server != server)
        return PSC_NO_SLOT;
    return i;
}

void psc_slot_drop(ps_client *c, uint32_t i) { slot_free(c, i); }

void psc_slot_finish(ps_client *c, uint32_t i)
{
    ps_request *r = c->slots->sub[i].req;
    slot_free(c, i);
    psc_part_done(c, r);
}
