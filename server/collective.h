/* Collectives (docs/PROTOCOL.md "Collectives"): ALLREDUCE (the mean of
 * every live worker's float buffer) and BROADCAST (rank 0's bytes to every
 * live worker), held by the I/O thread of server 0 as barriers are
 * (barrier.h): each request waits until every live worker has sent one
 * with the same id, then all are answered with the result.  For metrics,
 * objects and buffers of a few MiB; the training's tensors go through the
 * shards.
 *
 * Allreduce sums the contributions in rank order, then divides by their
 * count, so every worker gets the same bits and a run is repeatable.  A
 * broadcast's result is rank 0's payload, byte for byte (the others send
 * any payload of at least one element, which is dropped).
 *
 * The live set is this module's own copy, as the barriers' is: a rank that
 * was dropped (--on-worker-loss drop) is not waited for, and its
 * contribution, if it made one, is left out.  A broadcast whose rank 0 is
 * not live is refused.  (A worker that left, LEAVE, is still counted: the
 * workers that joined average their buffers together.)
 *
 * Ownership: a waiting request's route is moved in and kept until it is
 * answered, closed or destroyed; contributions are copied. */
#ifndef PS_COLLECTIVE_H
#define PS_COLLECTIVE_H

#include <stddef.h>
#include <zmq.h>

#include "ps_proto.h"

/* Collectives open at once; completed ids remembered (a resend of one is
 * refused rather than opening it again); the largest payload (bytes).
 * Allreduce and broadcast ids are two spaces, barriers' a third. */
#define PS_COLLS_MAX 16
#define PS_COLLS_DONE 64
#define PS_COLL_MAX_BYTES (64u << 20)

/* Where the answers go: send(user, id, h, payload) puts [id, h, payload?]
 * on the ROUTER (payload NULL for an error); it may empty id and payload,
 * the module closes them afterwards. */
typedef struct ps_coll_to {
    void *user;
    void (*send)(void *user, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload);
} ps_coll_to;

typedef struct ps_colls ps_colls;

/* PS_ENOMEM. */
int ps_colls_create(int num_workers, ps_coll_to to, ps_colls **out);

/* Close the routes still waiting, unanswered, and free.  NULL is fine. */
void ps_colls_destroy(ps_colls *c);

/* An ALLREDUCE or BROADCAST request h (id h->barrier_id) from live worker
 * h->rank with its payload (h->count float32 elements at `payload`).  0:
 * taken, its route moved out of id; answered now when it completes the
 * collective.  Otherwise refuse it with the code and *why (PS_EPROTO: a
 * count that differs from the collective's, a payload over
 * PS_COLL_MAX_BYTES, an id reused by the same rank; PS_ESTATE: the id
 * completed already, or a broadcast without a live rank 0; PS_ETOOBIG,
 * PS_ENOMEM); id is left alone. */
int ps_colls_arrive(ps_colls *c, zmq_msg_t *id, const ps_header *h, const void *payload,
                    const char **why);

/* Rank leaves (live 0) or rejoins (1) the set collectives wait for.
 * Leaving answers those every remaining live worker has reached. */
void ps_colls_set_live(ps_colls *c, int rank, int live);

/* At stop: answer every waiting request with PS_ECLOSED. */
void ps_colls_close(ps_colls *c);

#endif
