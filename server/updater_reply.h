/* An update thread's state and what its modules share (updater_reply.c):
 * a request's context, the replies, and reading and checking a push's
 * values.  updater.c (the thread, dense chunks) and updater_tables.c (the
 * tables' sparse requests) both answer through it.  Everything here runs on
 * the update thread alone. */
#ifndef PS_UPDATER_REPLY_H
#define PS_UPDATER_REPLY_H

#include <pthread.h>
#include <stdint.h>
#include <zmq.h>

#include "dup_log.h"
#include "ratelimit.h"
#include "shard.h"
#include "shm_peer.h"
#include "table_part.h"
#include "updater_config.h"
#include "updater_frames.h"

/* Pull replies of at least this many bytes are sent from the chunk's weight
 * buffer itself (zero-copy, ps_shard_pin); smaller ones are copied, which
 * costs less than the pin (ZeroMQ copies frames under 8 KiB into its send
 * batch anyway) and needs no spare buffer. */
#define ZC_MIN_BYTES 8192

/* A request an update thread answers now or, for a queued pull, later. */
typedef struct req_ctx {
    zmq_msg_t id;
    uint64_t seq;
    int32_t rank;
    uint32_t type;    /* PS_MSG_PUSH here: a deferred acknowledgement (no weights) */
    uint64_t key;
    uint32_t chunk;
    int32_t home;     /* a table request's partition's home (PS_FLAG_AWAY's hs, else this
                         server's rank) */
    uint64_t mut;     /* its mutation number (ps_cmd_frame.mut), 0 for a pull */
    uint64_t rseq;    /* its number in the primary's stream to the members (cmd.rseq) */
    int64_t t_arrive; /* for the timeline */
    ps_shm_peer *shm; /* PS_FLAG_SHM: the worker's arena (a reference) */
    uint64_t shm_off; /* where a pull's weights (a table's: rows) go in it */
    uint64_t count;   /* PS_FLAG_SHM pull: the destination's elements */
    /* sparse: the partition it is for (this thread's own, or one moved here:
     * PS_FLAG_AWAY), its rows dim wide; a pull's npull ids (a copy) */
    ps_tparts *tp;
    uint32_t dim;
    uint64_t *pids;
    size_t npull;
} req_ctx;

struct ps_updater {
    ps_updater_config cfg; /* set at create, read-only after */
    _Atomic uint64_t *mem_used; /* the shard config's: chunks and large reply copies */
    uint64_t max_memory;
    pthread_t tid;
    int started;
    void *pair;            /* owner end; used only by this thread once started */
    ps_shard *shard;
    ps_tparts *tparts;     /* this thread's partition of every table */
    float *rows;           /* a sparse reply's rows before they become its payload
                              (charged to --max-memory: updater_tables.h) */
    size_t rows_cap;
    req_ctx *spare;
    uint64_t bytes_in, bytes_out, errors; /* bytes_in: of sparse requests (the shard
                                             counts its own) */
    uint64_t nonfinite;    /* pushes whose gradient held NaN or Inf, and updates whose
                              results were not (values kept) */
    ps_rlimit rl;
    int64_t reported_min;  /* progress last sent to the I/O thread */
    int reported_have;
    uint64_t ff_seen;      /* fast-forwarded rounds already logged (chunks and tables) */
    uint64_t jump_seen;    /* async steps skipped after a restore, already logged */
    int destroying;        /* the shard is being destroyed: kept pushes were not applied */
    ps_dup_log dup;
    int *mslot;            /* metrics: table partition i's slot in the block */
    size_t nmslot;
    uint64_t last_rseq;    /* the last stream message (cmd.rseq) handed to this thread */
    uint64_t quiet_ckpt;   /* a replacement's snapshot waiting for a quiet point (0: none) */
    struct ps_snap_job *snap; /* an export's snapshot being taken (updater_export.c) */
    uint64_t snap_token;
    /* servers added and removed (updater_move.c) */
    ps_tparts_hooks thooks;   /* every ps_tparts of this thread answers through these */
    ps_tparts **away;         /* table partitions moved here from other servers: one
                                 ps_tparts per (home, part), each holding that partition
                                 of the tables moved */
    size_t naway, cap_away;
    ps_stats away_done;       /* counters of moved-in ps_tparts given up (every table of
                                 theirs moved on): the thread's counters keep them */
    struct upd_take *takes;   /* sync: TAKEs waiting for the quiet point, oldest first */
    /* while objects are being taken: what the hooks answer the requests that wait
     * on them (gone_code 0: none; PS_EMOVED names gone_slot, gone_ep) */
    int gone_code;
    int32_t gone_slot;
    /* objects taken from here (PS_CMD_TAKE) and where they went: a request
     * the I/O thread sent before it knew is answered PS_EMOVED, not "not
     * found" (upd_error); an entry whose object came back is never asked */
    struct upd_moved *moved;
    size_t nmoved, cap_moved;
    const char *gone_ep;
    char gone_why[PS_ERR_TEXT_MAX];
};

/* The thread's ps_tparts: i = 0 its own, then each moved-in one; NULL past
 * the last (for (i = 0; (tp = upd_tp(u, i)); i++)). */
static inline ps_tparts *upd_tp(const ps_updater *u, size_t i)
{
    return i == 0 ? u->tparts : i <= u->naway ? u->away[i - 1] : NULL;
}

/* Replies.  upd_send sends reply h (and payload, sent, when not NULL) to
 * the worker with identity id; upd_error answers r with error `code` (why says
 * what was wrong); upd_ack acknowledges r at `version` (snap: an init's
 * first snapshot, else 0); upd_reply_payload answers r with payload pl
 * (taken; NULL: the values are in the worker's arena at r->shm_off, float32,
 * and only the header goes): count (a table's: rows of dim), elems elements
 * of dtype, the weights of `version`. */
void upd_send(ps_updater *u, zmq_msg_t *id, const ps_header *h, zmq_msg_t *payload);
void upd_error(ps_updater *u, req_ctx *r, int code, const char *why);
void upd_ack(ps_updater *u, req_ctx *r, int64_t version, uint64_t snap);
void upd_reply_payload(ps_updater *u, req_ctx *r, zmq_msg_t *pl, uint64_t count, uint32_t dim,
                       size_t elems, uint32_t dtype, int64_t version);
/* *pl a copy of the n values w in dtype, counted against --max-memory when
 * large; *not_finite when a value of it is NaN or Inf.  0, PS_ETOOBIG or
 * PS_ENOMEM (why says). */
int upd_copy_payload(ps_updater *u, zmq_msg_t *pl, const float *w, size_t n, uint32_t dtype,
                     int *not_finite, char *why, size_t why_len);
/* The float32 values of payload frame pl (h->count elements of h->dtype):
 * the frame itself, or an aligned copy in *copy (the caller frees it); NULL
 * when out of memory. */
const float *upd_frame_values(const ps_header *h, zmq_msg_t *pl, float **copy);
/* Say what a push h to a restored chunk or partition skipped. */
void upd_note_restore_skips(ps_updater *u, const ps_header *h);
/* A pushed gradient g of n values holds bad NaN or Inf, the first at
 * index first: 1 when --on-nonfinite refuses it (why says), else 0 (*g
 * NULL: skipped). */
int upd_nonfinite(ps_updater *u, const ps_header *h, size_t n, const float **g, size_t bad,
                  size_t first, char *why, size_t why_len);
void upd_req_free(req_ctx *r);

/* What names a push in messages (a kept one's, after its request moved on). */
typedef struct upd_push_id {
    uint32_t type;
    int32_t rank;
    uint64_t key;
    uint32_t chunk;
    int64_t step;
} upd_push_id;

/* A kept push's n values at the moment they are used, when they sit in the
 * worker's arena (which its sender can write until the push is answered):
 * copied out into *copy (the caller frees it) and checked there, so that
 * what is summed is what was checked; --on-nonfinite as on arrival
 * (upd_nonfinite).  0: *g is the copy, or NULL (skip); PS_ENONFINITE
 * (refused: why says), PS_ENOMEM. */
int upd_take_from_arena(ps_updater *u, const upd_push_id *p, const float **g, size_t n,
                        float **copy, char *why, size_t why_len);

/* After a push (r: its request, NULL for none, e.g. a round that a worker's
 * loss completed): the updates since the last look whose results were not
 * finite (the shard's and the tables', their values kept), counted and
 * logged, and under --on-nonfinite refuse answered to r with PS_ENONFINITE.
 * 1 when r was answered (the caller frees it and answers nothing more). */
int upd_results_nonfinite(ps_updater *u, req_ctx *r);

#endif
