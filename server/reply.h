/* The headers of the server's replies (docs/PROTOCOL.md "Replies"): a reply
 * echoes the request's seq, rank, key and chunk so the worker can match it. */
#ifndef PS_REPLY_H
#define PS_REPLY_H

#include <stdint.h>
#include <zmq.h>

#include "ps_proto.h"

/* Where a module that answers requests later (barriers, stats) sends its
 * replies: send(user, id, h) puts [id, h] on the ROUTER.  id is the route the
 * request came by; send may empty it, the module closes it afterwards. */
typedef struct ps_reply_to {
    void *user;
    void (*send)(void *user, zmq_msg_t *id, const ps_header *h);
} ps_reply_to;

/* A reply of `type` (PS_FLAG_REPLY set).  What its `s` says (a chunk's
 * version, a barrier's id: ps_msg_table.h) the caller sets in its own field. */
void ps_reply_header(ps_header *r, uint32_t type, uint64_t seq, int32_t rank, uint64_t key,
                     uint32_t chunk);

/* A PS_MSG_ERROR reply with code and text (cut to what the protocol carries). */
void ps_reply_error(ps_header *r, uint64_t seq, int32_t rank, uint64_t key, uint32_t chunk,
                    int code, const char *text);

#endif
