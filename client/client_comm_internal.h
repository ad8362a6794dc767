/* What the comm thread's files share (client_comm.h has the contract):
 *   client_comm.c  the queue, held ops, receiving, the sockets, the loop,
 *                  start and stop
 *   client_send.c  turning ops into messages, and sending them
 * Only these two include it; who may touch which member of struct
 * psc_comm is said at each. */
#ifndef PS_CLIENT_COMM_INTERNAL_H
#define PS_CLIENT_COMM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "client_comm.h"

/* Request id of heartbeats: never a slot's (generations start at 1), so their
 * replies are recognised and dropped. */
#define HEARTBEAT_SEQ 0

struct psc_comm {
    /* training thread -> comm thread, under mu */
    pthread_mutex_t mu;
    psc_op *queue;
    size_t qhead, qlen, qcap; /* ring buffer */
    int stopping;
    pthread_cond_t ready_cv;  /* start waits on it until ready */
    int ready;                /* 1 once the thread opened its sockets, or failed to */
    int open_rc;              /* then: 0, or why not (a PS_E* code; the text in
                                 c->last_error) */
    /* set before the thread starts, read-only while it runs */
    int efd;                  /* the eventfd that wakes the loop */
    void *zctx;
    pthread_t thread;
    int thread_started;
    /* ps_client_interrupt (atomic, any thread or a signal handler) */
    int interrupted;

    /* the comm thread's own */
    void **socks;             /* per server slot (NULL: none, or it left) */
    int nsocks;
    /* the loop's: one per home's socket, the eventfd, each replicated
     * group's monitor, then one per added slot's socket (poll_at) */
    zmq_pollitem_t *poll_items;
    int npoll;
    psc_op *batch;            /* the ops taken off the queue in one go */
    size_t batch_cap;
    /* ops held behind a push_when whose data is not ready yet, in post order */
    psc_op *held;
    size_t held_head, held_len, held_cap;
    /* gradients with NaN or Inf sent anyway (--on-nonfinite skip|apply): when
     * that was last said, and how many since */
    int64_t nonfinite_said_ns;
    uint64_t nonfinite_unsaid;
};

/* client_send.c (comm thread) */
/* Send sub-request i (first time or again): 0, or the error it failed with. */
int psc_sub_send(ps_client *c, uint32_t i);
/* Send sub-request i again, counting its payload's release once more. */
void psc_resend(ps_client *c, uint32_t i);
/* A hello to server slot `slot`, added while training (client_moved.h),
 * unless one is on its way: 0, or -1 when none can go (its requests fail). */
int psc_join_send(ps_client *c, int slot);
/* A LEAVE, HYPER, SHUTDOWN or JOIN: posted to every listed server, and
 * through server 0's to every slot added while training (client_send.c). */
int psc_to_every_server(uint32_t type);
/* A heartbeat to every server, fire-and-forget. */
void psc_send_heartbeats(ps_client *c);
/* Turn one posted operation into messages and send them. */
void psc_do_op(ps_client *c, const psc_op *o);
/* An op that will never be sent completes at once. */
void psc_fail_unsent(ps_client *c, const psc_op *o);

#endif
