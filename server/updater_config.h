/* What an update thread is given (server/updater.h): its settings, copied at
 * create and read-only after.  A header of its own so that the thread's
 * modules (updater_reply.h) hold it without the updater's interface. */
#ifndef PS_UPDATER_CONFIG_H
#define PS_UPDATER_CONFIG_H

#include <stdint.h>

#include "ps_trace.h"

typedef struct ps_updater ps_updater;
typedef struct ps_srv_metrics ps_srv_metrics;
typedef struct ps_srv_mthread ps_srv_mthread;

typedef struct ps_updater_config {
    int idx;             /* this thread's index: log lines, trace lane 1 + idx */
    int mode;            /* PS_MODE_SYNC or PS_MODE_ASYNC */
    uint32_t wire_dtype; /* pull replies in payload frames go in this enum ps_dtype
                            (converted from the float32 weights); incoming payloads
                            are converted from whatever their header's dtype says */
    int num_workers;
    int server_rank;     /* this server's rank: the rows of a table it holds */
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
    _Atomic uint64_t *worker_mem; /* the table rows each worker made (the server's) */
    uint64_t worker_share;        /* bytes of them one worker may have */
    /* --metrics-port (server_metrics.h): the registry's tables and this thread's block,
       which it alone writes; both NULL with metrics off */
    const ps_srv_metrics *metrics;
    ps_srv_mthread *mblock;
} ps_updater_config;

#endif
