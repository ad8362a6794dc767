/* A server's requests to other servers of its job (server/move.h): one
 * DEALER per endpoint, made when first needed, each request numbered and
 * its reply handed to whoever asked.  No threads; the I/O thread polls the
 * sockets (ps_links_poll_items) and reads what came (ps_links_dispatch). */
#ifndef PS_MOVE_LINK_H
#define PS_MOVE_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ps_proto.h"

typedef struct ps_links ps_links;

/* A reply (h, payload frame or NULL), or a failure (h NULL: rc and why;
 * PS_ETIMEDOUT when no reply came in time), for the request that asked
 * with (user, tag). */
typedef void (*ps_link_done)(void *user, uint64_t tag, const ps_header *h, zmq_msg_t *payload,
                             int rc, const char *why);

/* ctx: the server's ZeroMQ context; rank: this server's (in the sockets'
 * routing ids, for the other side's logs).  Plaintext only: moves are
 * refused under --curve-keys (server/move.h). */
int ps_links_open(void *ctx, int rank, ps_link_done done, void *user, ps_links **out);
void ps_links_close(ps_links *l);

/* Send request h (its q is set here) with an optional payload (moved) to
 * the server at ep, the reply expected within timeout_ms.  (tag: the
 * asker's, given back to done.)  0, or an error with why (no socket, a bad
 * endpoint): done is then not called. */
int ps_links_ask(ps_links *l, const char *ep, int slot, ps_header *h, zmq_msg_t *payload,
                 int timeout_ms, uint64_t tag, char *why, size_t why_len);

/* Requests that wait for their replies. */
size_t ps_links_pending(const ps_links *l);

void ps_links_poll_items(ps_links *l, zmq_pollitem_t *it, int *n, int max);
/* Read what came on the polled sockets, and fail what waited too long. */
void ps_links_dispatch(ps_links *l, const zmq_pollitem_t *it, int first, int n, int64_t now);
/* ms until the next request times out; -1 none. */
long ps_links_timeout_ms(const ps_links *l, int64_t now);

#endif
