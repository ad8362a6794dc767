/* The I/O thread's table of workers: who said hello and by which
 * connection, when each was last heard from, and the --on-worker-loss rule
 * (server.h "Liveness").  No sockets: the caller takes a dropped or rejoined
 * worker out of (or back into) the owners' and barriers' live sets.
 *
 * A worker is known once it said hello, to this process or to the one whose
 * checkpoint was restored.  Every rank starts live; a dropped one is live
 * again when it says hello again. */
#ifndef PS_WORKERS_H
#define PS_WORKERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_workers ps_workers;

/* timeout_ms: silence after which a worker is lost (0: never); on_loss:
 * PS_LOSS_WAIT or PS_LOSS_DROP.  PS_ENOMEM. */
int ps_workers_create(int num_workers, int timeout_ms, int on_loss, ps_workers **out);
void ps_workers_destroy(ps_workers *w);

/* Worker rank said hello at now on the connection whose ROUTER identity is
 * id[0..n-1]; logged.  *rejoined = 1 when it had been dropped and is live
 * again.  PS_ENOMEM. */
int ps_workers_hello(ps_workers *w, int rank, const void *id, size_t n, int64_t now,
                     int *rejoined);

/* Workers a checkpoint knew (hello: num_workers flags), heard from at now.
 * PS_ENOMEM. */
int ps_workers_restore(ps_workers *w, const uint8_t *hello, int64_t now);

enum { PS_WORKER_LIVE = 0, PS_WORKER_UNKNOWN = 1, PS_WORKER_DROPPED = 2 };

/* A message from worker rank at now.  PS_WORKER_LIVE: known and live, and
 * heard from now (logged when it had been silent); PS_WORKER_UNKNOWN: it
 * never said hello; PS_WORKER_DROPPED: dropped until it says hello again. */
int ps_workers_heard(ps_workers *w, int rank, int64_t now);

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

#endif
