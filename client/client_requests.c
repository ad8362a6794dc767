/* libps: a request's life and the sub-request slots.
 *
 * A ps_request is posted by the training thread (psc_req_reset), split by the
 * comm thread into one sub-request slot per message, and completed when its
 * _priv.pending parts are done: each slot's reply (psc_slot_finish) and each
 * zero-copy frame's release (psc_release_cb, on ZeroMQ's I/O thread).
 * Waiters sleep on the client's done_cv; the condition variable is touched
 * only when somebody waits, so completing costs no lock when communication
 * overlaps compute.
 *
 * Slots belong to the comm thread alone: no lock.  A slot index and its
 * generation make the request id, so a late duplicate reply finds its slot
 * freed or reused and is dropped. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "ps_time.h"

/* ---------- completion ---------- */

/* Mark r done and wake waiters.  The lock and broadcast are skipped when
 * nobody waits (the usual case when communication overlaps compute); the
 * seq_cst pair done/nwaiters here and in psc_wait_until makes sure a waiter
 * that saw done == 0 is always counted before we look. */
static void complete(ps_client *c, ps_request *r)
{
    r->done_ns = ps_now_ns(); /* published by the store of done below */
    __atomic_store_n(&r->_priv.done, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->nwaiters, __ATOMIC_SEQ_CST) == 0)
        return;
    pthread_mutex_lock(&c->done_mu);
    pthread_cond_broadcast(&c->done_cv);
    pthread_mutex_unlock(&c->done_mu);
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

void psc_fail_unsent(ps_client *c, const psc_op *o)
{
    ps_request *r = o->req;
    if (o->type == PSC_OP_CANCEL)
        return;
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
    pthread_mutex_lock(&c->done_mu);
    __atomic_add_fetch(&c->nwaiters, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&r->_priv.done, __ATOMIC_SEQ_CST)) {
        if (deadline_ns == INT64_MAX) {
            pthread_cond_wait(&c->done_cv, &c->done_mu);
        } else {
            if (ps_now_ns() >= deadline_ns)
                break;
            struct timespec ts = {deadline_ns / 1000000000LL, deadline_ns % 1000000000LL};
            pthread_cond_timedwait(&c->done_cv, &c->done_mu, &ts);
        }
    }
    __atomic_sub_fetch(&c->nwaiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->done_mu);
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

static uint32_t slot_alloc(ps_client *c)
{
    if (c->free_head == PSC_NO_SLOT) {
        if (c->nsubs == c->cap_subs) {
            uint32_t ncap = c->cap_subs ? c->cap_subs * 2 : 256;
            psc_sub *n = realloc(c->subs, (size_t)ncap * sizeof *n);
            if (!n)
                return PSC_NO_SLOT;
            c->subs = n;
            c->cap_subs = ncap;
        }
        uint32_t i = c->nsubs++;
        memset(&c->subs[i], 0, sizeof c->subs[i]);
        c->subs[i].gen = 1;
        c->subs[i].next_free = PSC_NO_SLOT;
        c->free_head = i;
    }
    uint32_t i = c->free_head;
    c->free_head = c->subs[i].next_free;
    c->live++;
    return i;
}

static void slot_free(ps_client *c, uint32_t i)
{
    psc_sub *s = &c->subs[i];
    psc_server *sv = &c->srv[s->server];
    sv->nlive--;
    if (s->req == &sv->rj_req)
        sv->rejoining = 0; /* answered, failed or given up: a later refusal may try again */
    s->req = NULL;
    s->gen = s->gen + 1 ? s->gen + 1 : 1;
    s->next_free = c->free_head;
    c->free_head = i;
    c->live--;
}

uint32_t psc_slot_new(ps_client *c, const psc_op *o, int server)
{
    uint32_t i = slot_alloc(c);
    if (i == PSC_NO_SLOT)
        return PSC_NO_SLOT;
    psc_sub *s = &c->subs[i];
    s->req = o->req;
    s->type = o->type;
    s->server = server;
    s->parked = 0;
    /* the server's silence counts from now if nothing else waited on it */
    if (c->srv[server].nlive++ == 0)
        c->srv[server].quiet_from_ns = ps_now_ns();
    s->chunk = 0;
    s->key = 0;
    s->count = 0;
    s->total = 0;
    s->src = NULL;
    s->dst = NULL;
    s->step = o->step;
    s->npush = o->npush > 1 ? (uint32_t)o->npush : 1;
    s->out = o->out;
    s->backoff_ns = (int64_t)c->opt.request_timeout_ms * 1000000LL;
    s->deadline_ns = INT64_MAX;
    return i;
}

uint64_t psc_slot_id(const ps_client *c, uint32_t i)
{
    return (uint64_t)c->subs[i].gen << 32 | i;
}

uint32_t psc_slot_find(const ps_client *c, uint64_t seq, int server)
{
    uint32_t i = (uint32_t)(seq & 0xffffffffu);
    if (i >= c->nsubs || !c->subs[i].req || psc_slot_id(c, i) != seq ||
        c->subs[i].server != server)
        return PSC_NO_SLOT;
    return i;
}

void psc_slot_finish(ps_client *c, uint32_t i)
{
    ps_request *r = c->subs[i].req;
    slot_free(c, i);
    psc_part_done(c, r);
}
