/* STATS requests in flight (docs/PROTOCOL.md "Stats"): the I/O thread asks
 * every owner for its counters (PS_CMD_STATS with the request's token) and
 * answers once all have replied, so a STATS sent after a reply reflects that
 * request.  No sockets here: replies go through a ps_reply_to.
 *
 * Ownership: a request's route (identity frame) is moved in and kept until
 * it is answered, closed or destroyed. */
#ifndef PS_STATS_REQ_H
#define PS_STATS_REQ_H

#include <stdint.h>
#include <zmq.h>

#include "barrier.h"
#include "ps_proto.h"
#include "reply.h"
#include "updater_frames.h"

/* STATS requests in flight at most. */
#define PS_STATS_REQS_MAX 64

typedef struct ps_stats_reqs ps_stats_reqs;

/* owners: how many parts answer a request.  PS_ENOMEM. */
int ps_stats_reqs_create(int owners, ps_reply_to to, ps_stats_reqs **out);

/* Close the routes still waiting, unanswered, and free.  NULL is fine. */
void ps_stats_reqs_destroy(ps_stats_reqs *q);

/* A STATS request h: 0 with its route moved out of id and *token to send as
 * PS_CMD_STATS to every owner; PS_ETOOBIG with *why (id left alone). */
int ps_stats_reqs_begin(ps_stats_reqs *q, zmq_msg_t *id, const ps_header *h, uint64_t *token,
                        const char **why);

/* An owner's counters (PS_OUT_STATS).  The last part answers the request,
 * with io's counters (the I/O thread's own: errors, workers_seen, forged;
 * none of them holds chunks) added to the owners', and who the
 * oldest open barrier of bars waits for (`bw`, when one is open). */
void ps_stats_reqs_part(ps_stats_reqs *q, const ps_stats_frame *of, const ps_stats *io,
                        const ps_barriers *bars);

/* At stop: answer every request in flight with PS_ECLOSED. */
void ps_stats_reqs_close(ps_stats_reqs *q);

#endif
