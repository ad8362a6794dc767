/* Barriers (docs/PROTOCOL.md "Barrier"): the I/O thread holds each BARRIER
 * request until every live worker has sent one with the same id, then
 * answers them all.  No sockets here: replies go through a ps_reply_to.
 *
 * The live set is this module's own copy, kept in step by the I/O thread
 * (ps_barriers_set_live, like ps_shard_set_live for the owners): a dropped
 * worker is not waited for.
 *
 * Ownership: a waiting request's route (identity frame) is moved in and kept
 * until the barrier is answered, closed or destroyed. */
#ifndef PS_BARRIER_H
#define PS_BARRIER_H

#include <zmq.h>

#include "ps_proto.h"
#include "reply.h"

/* Distinct barrier ids open at once, and completed ids remembered so that a
 * worker's resend of one is answered rather than opening a new one. */
#define PS_BARRIERS_MAX 64
#define PS_BARRIERS_DONE 16

typedef struct ps_barriers ps_barriers;

/* PS_ENOMEM. */
int ps_barriers_create(int num_workers, ps_reply_to to, ps_barriers **out);

/* Close the routes still waiting, unanswered, and free.  NULL is fine. */
void ps_barriers_destroy(ps_barriers *b);

/* A BARRIER request h (h->barrier_id) from live worker h->rank.
 * 0: taken, its route moved out of id; answered now when it completes the
 * barrier (a resend: on the newest route, once).  PS_ETOOBIG or PS_ENOMEM
 * with *why: refuse it; id is left alone. */
int ps_barriers_arrive(ps_barriers *b, zmq_msg_t *id, const ps_header *h, const char **why);

/* Rank leaves (live 0) or rejoins (1) the set barriers wait for.  Leaving
 * answers the barriers every remaining live worker has reached. */
void ps_barriers_set_live(ps_barriers *b, int rank, int live);

/* Rank's hello was refused (code, why: the refusal): every open barrier it
 * has not reached fails, its waiters answered with code and a text naming
 * the rank and why, and so does every barrier opened later while the rank
 * is missing, until ps_barriers_accepted: a worker refused at hello never
 * comes, and its peers must not wait for it in silence. */
void ps_barriers_refused(ps_barriers *b, int rank, int code, const char *why);

/* Rank's hello was accepted: barriers wait for it again. */
void ps_barriers_accepted(ps_barriers *b, int rank);

/* At stop: answer every waiting request with PS_ECLOSED. */
void ps_barriers_close(ps_barriers *b);

/* Who the open barrier with the lowest id still waits for: the live ranks
 * that have not arrived, counted, the lowest PS_BARRIER_RANKS_MAX listed
 * (out->id -1 when none is open).  For the STATS reply's `bw`. */
void ps_barriers_info(const ps_barriers *b, ps_barrier_info *out);

#endif
