/* What the checkpoint coordinator's files share (server/ckpt_coord.h has
 * the contract):
 *   ckpt_coord.c    taking checkpoints, the writer thread, held replies
 *   ckpt_restore.c  --restore: reading checkpoints back
 * Only these two include it. */
#ifndef PS_CKPT_COORD_INTERNAL_H
#define PS_CKPT_COORD_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "checkpoint.h"
#include "ckpt_coord.h"

/* The checkpoint writer thread and the one job it may have. */
typedef struct ckpt_writer {
    pthread_t tid;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, have_job, efd;
    /* the job (owned by the writer while have_job) and its result */
    ps_ckpt_meta meta;
    uint8_t *hello;
    ps_ckpt_part *parts;
    int nparts;
    uint64_t mut;      /* the mutations the snapshot holds (the I/O thread's count) */
    int rc;
    int recreated;     /* the directory was gone and made again */
    uint64_t bytes;
    int64_t t0, t1;
    char path[1024], why[512];
} ckpt_writer;

struct ps_ckpt_coord {
    /* the server's configuration, as far as checkpoints go */
    char *dir;
    int rank, num_servers, num_workers, mode, max_staleness, threads;
    ps_opt_config opt;
    int64_t every;
    int every_ms;
    ps_ckpt_policy pol;
    ps_trace *trace;
    int stopping;
    int state;
    uint64_t seq;             /* sequence number of the next checkpoint */
    uint64_t token;           /* the snapshot being collected */
    ps_ckpt_part *parts;
    int got, failed;
    int64_t *min_version;     /* per owner, as last reported (sync, by rounds) */
    uint8_t *have_min;
    int64_t last_round;       /* sync: lowest version when the last one was taken */
    int64_t prev_round;       /* last_round before that, to try again after a failure */
    uint64_t last_mut;        /* the I/O thread's mutation count at the last one */
    uint64_t count;
    int64_t last_ns, retry_ns, info_ns;
    int64_t durable_round;    /* durable rounds: versions up to it are on disk */
    uint64_t written_seq;     /* the last checkpoint written */
    int need_full;            /* the next checkpoint must be a full one (none written by
                                 this process or restored, or the last one failed) */
    int chain_len;            /* deltas written since the last full one */
    int snap_full;            /* the snapshot being collected is a full one */
    uint64_t snap_mut;        /* the mutations of the snapshot being collected */
    uint64_t written_mut;     /* ... and of the last one written (this process's count) */
    int on_failure;           /* PS_CKPT_FAIL_* */
    int64_t failure_ns;       /* stall: notice after; exit: give up after */
    int64_t fail_since;       /* writes failing since then; 0: the last one worked */
    int64_t fail_log_ns;      /* the last failure line */
    uint64_t nfail, fail_unlogged, fail_streak;
    char fail_why[512];
    ps_held_reply *held_head, *held_tail;
    size_t nheld_init;
    ckpt_writer wr;
    int64_t last_done_ns, last_took_ns; /* the last written checkpoint: when (ps_now_ns)
                                            and how long its write took */
};

#endif
