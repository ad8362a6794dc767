/* libps: the comm thread and the queue that feeds it (client_comm.c,
 * client_send.c).
 *
 * Its state (c->comm) is its own: the queue, under a mutex, between the
 * training thread and the comm thread; the sockets and the loop's state,
 * the comm thread's alone; the interrupt flag, any thread's. */
#ifndef PS_CLIENT_COMM_H
#define PS_CLIENT_COMM_H

#include <stdint.h>

#include "client_internal.h"

/* Not a PS_MSG_*: fail every sub-request of psc_op.req with psc_op.code (a
 * caller gave up waiting for it). */
#define PSC_OP_CANCEL 0

/* An operation posted by the training thread. */
typedef struct psc_op {
    uint32_t type;    /* PS_MSG_*, or PSC_OP_CANCEL */
    int server;       /* control messages: the target server */
    uint32_t tensor;  /* data messages: index in the placement */
    const float *src; /* init/push/pushpull payload (read in place) */
    float *dst;       /* pull/pushpull destination */
    int64_t step;     /* the header's step: a push's or pull's, a barrier's id */
    ps_request *req;
    void *out;        /* HELLO: ps_hello reply; STATS: psc_stats_out */
    ps_ready_fn ready;/* push_when: send once ready(ready_arg) != 0 */
    void *ready_arg;
    int npush;        /* push: how many gradients src sums (ps_client_push_sum) */
    int planes;       /* state, setstate: floats per element in src/dst (the optimizer's
                         state arrays, chunk after chunk); else 0 (one) */
    size_t count;     /* control messages with a payload (collectives): its elements */
    int code;         /* PSC_OP_CANCEL: the PS_E* code its sub-requests fail with */
    /* tables (SPULL, SPUSH, SPUSHPULL: tensor is the table's index in c->tables;
     * TABLE: too, to `server`): the ids pulled (SPULL) or pushed with src, and
     * a pushpull's ids pulled into dst */
    const uint64_t *ids;
    size_t nids;
    const uint64_t *ids2;
    size_t nids2;
    int table;        /* CLOCK of a table (tensor: its index in c->tables): a message
                         to every partition of every server */
} psc_op;

/* Where a STATS reply goes (psc_op.out of a STATS op); either may be NULL. */
typedef struct psc_stats_out {
    ps_stats *stats;
    ps_barrier_info *barrier;
} psc_stats_out;

/* What a MEMBERS reply says (ps_client_members). */
typedef struct psc_members_out {
    int count, index;
    int64_t version;
} psc_members_out;

/* Open: make the queue, the eventfd and the ZeroMQ context, start the comm
 * thread and wait until its sockets are up: 0, or a PS_E* code with the
 * reason in c->last_error (nothing is left then). */
int psc_comm_start(ps_client *c);
/* Close: stop the comm thread (what is queued or in flight completes with
 * PS_ECLOSED), join it and terminate the ZeroMQ context, which releases
 * every zero-copy frame it still holds (completing the last requests).
 * Nothing touches the requests or the arena afterwards. */
void psc_comm_stop(ps_client *c);
/* Training thread: queue an op for the comm thread; PS_ECLOSED once
 * stopping or interrupted, PS_ENOMEM. */
int psc_post(ps_client *c, const psc_op *o);
/* Wake the comm thread. */
void psc_kick(ps_client *c);
/* Any thread, or a signal handler (async-signal-safe): the comm thread
 * fails everything and ends, as when closing. */
void psc_comm_interrupt(ps_client *c);
/* 1 once psc_comm_interrupt was called. */
int psc_comm_interrupted(const ps_client *c);

#endif
