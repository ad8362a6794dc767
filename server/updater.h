/* An update thread: the owner of every chunk that ps_server_owner maps to it,
 * in its own ps_shard (server/shard.h), and of partition `idx` of every
 * table (server/table_part.h), and the one thread that touches them once
 * started.  It talks to the I/O thread only over its inproc PAIR,
 * in the frames of server/updater_frames.h: requests and commands in, replies
 * (for the ROUTER), counters, checkpoint parts and progress out.
 *
 * It knows nothing of struct ps_server: everything it needs is in a
 * ps_updater_config, copied at create and never changed after, so the thread
 * reads no memory another thread writes (the shard's memory charge aside,
 * which is atomic).
 *
 * Ownership: the updater owns its shard and, once created, the owner end of
 * its PAIR (both gone at ps_updater_destroy; the shard already when the thread
 * exits).  Weight buffers lent to zero-copy pull replies outlive the shard
 * until ZeroMQ drops the last reply (ps_shard_unpin). */
#ifndef PS_UPDATER_H
#define PS_UPDATER_H

#include "ps_trace.h"
#include "shard.h"
#include "table_part.h"
#include "updater_frames.h"

typedef struct ps_updater ps_updater;

typedef struct ps_updater_config {
    int idx;             /* this thread's index: log lines, trace lane 1 + idx */
    int mode;            /* PS_MODE_SYNC or PS_MODE_ASYNC */
    uint32_t wire_dtype; /* pull replies in payload frames go in this enum ps_dtype
                            (converted from the float32 weights); incoming payloads
                            are converted from whatever their header's dtype says */
    int num_workers;
    int num_servers;     /* tables: a row cap or filter of a whole table is split over */
    int nparts;          /* num_servers x nparts partitions (nparts: the update threads) */
    int on_nonfinite;    /* enum ps_on_nonfinite: a pushed gradient with NaN or Inf */
    ps_trace *trace;     /* "apply", "pull" and "snapshot" events; NULL: none.  Shared by
                            every thread (ps_trace locks), outlives the updater */
    /* what checkpoints ask of the replies (ps_ckpt_policy, ckpt_coord.h) */
    int hold_inits;      /* an init acknowledgement goes as PS_OUT_INIT */
    int durable;         /* push and pull replies go as PS_OUT_HELD with their version */
    int defer_acks;      /* sync: a push is acknowledged when its round is complete */
    int report_progress; /* PS_OUT_PROGRESS whenever the lowest chunk version moves */
    int ack_bound;       /* async, by count: push acks and pushpull replies go as
                            PS_OUT_ACK with their mutation number */
    _Atomic uint64_t *copies; /* bytes of pull replies sent as copies and not yet freed by
                                 ZeroMQ (shared by every updater); they are charged to the
                                 shard config's mem_used too, against max_memory */
} ps_updater_config;

/* Create the updater and its shard (sc: the store's rules and the shared
 * memory charge; sc->mem_used and cfg->copies must be set and outlive every
 * reply, which may be freed after the updater) around `pair`, the owner end of its PAIR, which it closes at
 * destroy (on error the caller still owns it).  The thread does not run yet:
 * the shard may be filled first (ps_updater_shard).  PS_EINVAL, PS_ENOMEM,
 * or ps_shard_create's error. */
int ps_updater_create(const ps_updater_config *cfg, const ps_shard_config *sc, void *pair,
                      ps_updater **out);

/* The shard, to fill before ps_updater_start (restore); not to be touched by
 * anyone else once the thread runs. */
ps_shard *ps_updater_shard(ps_updater *u);
/* The same for its partitions of the tables (the thread's partition of each;
 * restore declares them and fills their stores). */
ps_tparts *ps_updater_tparts(ps_updater *u);

/* Start the thread.  It serves the PAIR until PS_CMD_STOP (or a receive
 * error), then answers queued pulls with PS_ECLOSED, destroys the shard and
 * sends PS_OUT_STOPPED, its last message.  PS_ENOMEM when no thread could be
 * made.  Call with the signals blocked that the thread must not take. */
int ps_updater_start(ps_updater *u);

/* Wait for the thread to end (after its PS_OUT_STOPPED); nothing when it was
 * never started. */
void ps_updater_join(ps_updater *u);

/* Close the PAIR end, destroy the shard if the thread did not, free.  A
 * started thread must have been joined.  NULL is fine. */
void ps_updater_destroy(ps_updater *u);

#endif
