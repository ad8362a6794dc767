/* An update thread: the owner of every chunk that ps_server_owner maps to it,
 * in its own ps_shard (server/shard.h), and of partition `idx` of every
 * table (server/table_part.h), and the one thread that touches them once
 * started.  It talks to the I/O thread only over its inproc PAIR,
 * in the frames of server/updater_frames.h: requests and commands in, replies
 * (for the ROUTER), counters, checkpoint parts and progress out.
 *
 * It knows nothing of struct ps_server: everything it needs is in a
 * ps_updater_config (updater_config.h), copied at create and never changed after, so the thread
 * reads no memory another thread writes (the shard's memory charge aside,
 * which is atomic).
 *
 * Ownership: the updater owns its shard and, once created, the owner end of
 * its PAIR (both gone at ps_updater_destroy; the shard already when the thread
 * exits).  Weight buffers lent to zero-copy pull replies outlive the shard
 * until ZeroMQ drops the last reply (ps_shard_unpin). */
#ifndef PS_UPDATER_H
#define PS_UPDATER_H

#include "shard.h"
#include "table_part.h"
#include "updater_config.h"
#include "updater_frames.h"


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
