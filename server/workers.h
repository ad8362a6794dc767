/* The I/O thread's table of workers: who said hello and by which
 * connection, when each was last heard from, and the --on-worker-loss rule
 * (server.h "Liveness").  No sockets: the caller takes a dropped or rejoined
 * worker out of (or back into) the owners' and barriers' live sets.
 *
 * A worker is known once it said hello, to this process or to the one whose
 * checkpoint was restored.  Every rank starts live; a dropped one is live
 * again when it says hello again.
 *
 * A rank belongs to one connection (docs/SECURITY.md "Who may speak for a
 * worker rank"): the one whose hello was accepted last.  Its first accepted
 * hello gets a token (64 random bits); a hello for the rank from another
 * connection is refused while the holder is live (heard from on its own
 * connection within the hold window: max(3 s, the worker timeout), and not
 * seen to close), unless it carries that token.  A rank known only from a restored checkpoint has
 * no holder and no token: its first hello is accepted. */
#ifndef PS_WORKERS_H
#define PS_WORKERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_workers ps_workers;

/* timeout_ms: silence after which a worker is lost (0: never); on_loss:
 * PS_LOSS_WAIT or PS_LOSS_DROP.  PS_ENOMEM. */
int ps_workers_create(int num_workers, int timeout_ms, int on_loss, ps_workers **out);
void ps_workers_destroy(ps_workers *w);

/* Worker rank says hello at now on the connection whose ROUTER identity is
 * id[0..n-1], with `token` (0: none).  Accepted (0, logged): the connection
 * holds the rank from now on, *token_out is the rank's token for the reply,
 * and *rejoined = 1 when it had been dropped and is live again.  PS_ESTATE:
 * another live connection holds the rank and the token does not prove it is
 * the same worker; why says so for the requester, and the refusal is logged
 * (rate-limited) naming `who`, the new peer.  PS_ENOMEM. */
int ps_workers_hello(ps_workers *w, int rank, const void *id, size_t n, int fd,
                     uint64_t token, int64_t now, const char *who, uint64_t *token_out,
                     int *rejoined, char *why, size_t why_len);

/* The connection on socket fd closed (the ROUTER's monitor): a rank it held
 * is free for the next hello at once (fd: zmq_msg_get ZMQ_SRCFD of the
 * hello; -1 never matches). */
void ps_workers_gone(ps_workers *w, int fd);

/* Workers a checkpoint knew (hello: num_workers flags), heard from at now.
 * PS_ENOMEM. */
int ps_workers_restore(ps_workers *w, const uint8_t *hello, int64_t now);

enum { PS_WORKER_LIVE = 0, PS_WORKER_UNKNOWN = 1, PS_WORKER_DROPPED = 2 };

/* A message from worker rank at now, on the connection id[0..n-1].
 * PS_WORKER_LIVE: known and live, and heard from now (logged when it had
 * been silent); PS_WORKER_UNKNOWN: it never said hello; PS_WORKER_DROPPED:
 * dropped until it says hello again.  Only a message on the holder's
 * connection keeps the rank held against another connection's hello. */
int ps_workers_heard(ps_workers *w, int rank, const void *id, size_t n, int64_t now);

/* Apply the timeout at now.  A known, live worker silent for longer is lost
 * (logged once): with PS_LOSS_WAIT nothing else changes; with PS_LOSS_DROP it
 * is dropped and its rank returned, to take out of the live sets; call again
 * for the next one.  -1 when there is none (left). */
int ps_workers_check(ps_workers *w, int64_t now);

/* num_workers flags: 1 = known (what a checkpoint records). */
const uint8_t *ps_workers_hello_flags(const ps_workers *w);

/* Known workers; workers lost and rejoined so far. */
int ps_workers_seen(const ps_workers *w);
uint64_t ps_workers_lost(const ps_workers *w);
uint64_t ps_workers_rejoined(const ps_workers *w);
/* Hellos refused because another live connection held the rank. */
uint64_t ps_workers_refused(const ps_workers *w);

#endif
