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
 * seen to close), unless it carries that token.  A rank known only from a
 * restored checkpoint has no holder and no token: its first hello is
 * accepted.  Every other message of a rank is taken only from its holder
 * (ps_workers_heard): the same connection and, under CURVE, the same key.
 *
 * A rank that never said hello is waited for like a silent one: once any
 * worker said hello, the timeout runs for it from that first hello. */
#ifndef PS_WORKERS_H
#define PS_WORKERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_workers ps_workers;

/* A connection, as the ROUTER shows it: the routing identity id[0..n-1], its
 * socket fd (zmq_msg_get ZMQ_SRCFD; -1 unknown) and, under CURVE, the ZAP
 * user id its key was authorised as (zmq_msg_gets "User-Id"; NULL or ""
 * without CURVE).  Borrowed for the call. */
typedef struct ps_conn {
    const void *id;
    size_t n;
    int fd;
    const char *user;
} ps_conn;

/* timeout_ms: silence after which a worker is lost (0: never); on_loss:
 * PS_LOSS_WAIT or PS_LOSS_DROP.  PS_ENOMEM. */
int ps_workers_create(int num_workers, int timeout_ms, int on_loss, ps_workers **out);
void ps_workers_destroy(ps_workers *w);

/* Worker rank says hello at now on connection c, with `token` (0: none).  Accepted (0, logged): the connection
 * holds the rank from now on, *token_out is the rank's token for the reply,
 * and *rejoined = 1 when it had been dropped and is live again.  PS_ESTATE:
 * another live connection holds the rank and the token does not prove it is
 * the same worker; why says so for the requester, and the refusal is logged
 * (rate-limited) naming `who`, the new peer.  PS_ENOMEM. */
int ps_workers_hello(ps_workers *w, int rank, const ps_conn *c, uint64_t token, int64_t now, const char *who, uint64_t *token_out,
                     int *rejoined, char *why, size_t why_len);

/* The connection on socket fd closed (the ROUTER's monitor): a rank it held
 * is free for the next hello at once (fd: zmq_msg_get ZMQ_SRCFD of the
 * hello; -1 never matches). */
void ps_workers_gone(ps_workers *w, int fd);

/* Workers a checkpoint knew (hello: num_workers flags), heard from at now.
 * PS_ENOMEM. */
int ps_workers_restore(ps_workers *w, const uint8_t *hello, int64_t now);

enum {
    PS_WORKER_LIVE = 0,    /* known, live, and c holds the rank */
    PS_WORKER_UNKNOWN = 1, /* it never said hello */
    PS_WORKER_DROPPED = 2, /* dropped until it says hello again */
    PS_WORKER_UNHELD = 3,  /* c does not hold the rank, and no live connection does
                              (its holder closed or went silent, or none since a
                              restore): c may say hello for it */
    PS_WORKER_FORGED = 4   /* another live connection (or, under CURVE, another key)
                              holds the rank: c speaks for a rank it does not hold */
};

/* A message from worker rank at now, on connection c.  PS_WORKER_LIVE: heard
 * from now (logged when it had been silent).  Anything else: the message is
 * to be refused, and it does not count as a sign of life; PS_WORKER_FORGED is
 * counted (ps_workers_forged) and logged, rate-limited, naming both
 * connections; why says, for the sender, what is wrong and what to do. */
int ps_workers_heard(ps_workers *w, int rank, const ps_conn *c, int64_t now, char *why,
                     size_t why_len);

/* Apply the timeout at now.  A known, live worker silent for longer is lost
 * (logged once), and so is a rank that never said hello by the timeout after
 * the first hello of any worker: with PS_LOSS_WAIT nothing else changes, and
 * every PS_WORKERS_WAIT_LOG_MS while some rank is lost a line names them all
 * (those that never said hello as such); with PS_LOSS_DROP it is dropped and
 * its rank returned, to take out of the live sets; call again for the next
 * one.  -1 when there is none (left). */
#define PS_WORKERS_WAIT_LOG_MS 10000
int ps_workers_check(ps_workers *w, int64_t now);

/* num_workers flags: 1 = known (what a checkpoint records). */
const uint8_t *ps_workers_hello_flags(const ps_workers *w);

/* Known workers; workers lost and rejoined so far. */
int ps_workers_seen(const ps_workers *w);
uint64_t ps_workers_lost(const ps_workers *w);
uint64_t ps_workers_rejoined(const ps_workers *w);
/* Hellos refused because another live connection held the rank. */
uint64_t ps_workers_refused(const ps_workers *w);
/* Other messages refused because another live connection held their rank
 * (PS_WORKER_FORGED). */
uint64_t ps_workers_forged(const ps_workers *w);

#endif
