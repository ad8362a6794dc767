/* An update thread's part of a snapshot for an export (docs/OPERATIONS.md
 * "Export and serve"): a copy of each of its chunks and table partitions
 * with their optimizer state, as ps_snap item streams (proto/ps_snap.h),
 * each taken between two of the thread's messages, so no update is half in
 * it.  No sockets and no threads: the update thread drives a job
 * (server/updater_export.c); the offline exporter (tools/ps_export) runs
 * one over the stores a checkpoint restored.
 *
 * Which version each item is taken at: with a target T (sync; per key, or
 * one for all) an item at T is taken at once, one at T - 1 when it gets
 * there (ps_snap_poll after every message of the thread), one further
 * behind at once as it is (flagged PS_SNAP_BEHIND: a key that does not
 * advance with the rest, as a frozen tensor), and one past T makes the
 * job fail (PS_ESTATE, why names it: the exporter asks again with a later
 * T).  Without a target (T < 0, async) every item is taken as it is now.
 * poll(force) takes whatever still waits, as it is (the exporter's wait
 * ran out); those are flagged too.
 *
 * Memory: each item's bytes are charged to *mem_used first; past
 * max_memory the job fails with PS_ETOOBIG (nothing of it kept).  Whoever
 * frees an item gives its charge back (ps_snap_buf_unref). */
#ifndef PS_SNAPSHOT_H
#define PS_SNAPSHOT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "shard.h"
#include "table_part.h"

/* One item's stream, shared by the replies (pages) that send it. */
typedef struct ps_snap_buf {
    _Atomic int refs;
    unsigned char *data;
    size_t len;
    _Atomic uint64_t *mem_used; /* charged with len while it lives */
} ps_snap_buf;

/* Drop a reference; the last one frees the stream and gives its charge back. */
void ps_snap_buf_unref(ps_snap_buf *b);

/* A key's own target (overrides the job's). */
typedef struct ps_snap_target {
    uint64_t key;
    int64_t version;
} ps_snap_target;

typedef struct ps_snap_config {
    int32_t server;             /* the server's rank, written into each item */
    ps_opt_config opt;          /* the dense optimizer, written into each chunk's item */
    int64_t target;             /* < 0: each item as it is */
    const ps_snap_target *targets; /* per key; read during ps_snap_begin only */
    size_t ntargets;
    uint64_t max_memory;
    _Atomic uint64_t *mem_used;
} ps_snap_config;

typedef struct ps_snap_job ps_snap_job;

/* Start a job over the chunks of s and the partitions of tp (either may be
 * NULL) and take what can be taken now.  0, PS_ENOMEM. */
int ps_snap_begin(const ps_snap_config *cfg, const ps_shard *s, ps_tparts *tp,
                  ps_snap_job **out);
/* Take what reached its target (force: everything that waits).  1 when the
 * job is over (done or failed), 0 while items wait. */
int ps_snap_poll(ps_snap_job *j, const ps_shard *s, ps_tparts *tp, int force);
/* The job's result, and the job freed: 0 with *items (malloc'd, n of them,
 * each one reference the caller owns), or an error with why (items freed). */
int ps_snap_end(ps_snap_job *j, ps_snap_buf ***items, size_t *n, char *why, size_t why_len);

#endif
