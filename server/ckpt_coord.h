/* Checkpoint coordination: the I/O thread's side of server/checkpoint.h.
 * When a checkpoint is due, collecting every update thread's serialized
 * part, the writer thread that writes the file while training goes on, the
 * replies held until a checkpoint makes them durable, and --restore.
 * docs/OPERATIONS.md "Checkpoints and restore" is the policy in words.
 *
 * It sends nothing: it says what to send and the I/O thread sends it.
 *  - ps_ckpt_coord_due / ps_ckpt_coord_final return a token: send
 *    PS_CMD_CKPT with it to every update thread; each PS_OUT_CKPT that comes
 *    back goes to ps_ckpt_coord_part.  The last part hands the snapshot to
 *    the writer thread, which posts ps_ckpt_coord_fd when the file is on disk:
 *    then call ps_ckpt_coord_written.
 *  - Replies an update thread tagged PS_OUT_INIT, PS_OUT_HELD or PS_OUT_ACK
 *    are offered to ps_ckpt_coord_hold; those it keeps come back, in arrival
 *    order, from the call that made them durable (ps_ckpt_coord_written, or
 *    ps_ckpt_coord_part when the file was written right there) as a list of
 *    ps_held_reply for the I/O thread to put on the ROUTER.
 *  - When writes fail, --on-checkpoint-failure decides (server.h): stall
 *    keeps holding (ps_ckpt_coord_overdue names the replies held so long
 *    that their workers should be told why), continue releases them from
 *    the failed write on, exit makes ps_ckpt_coord_give_up true.
 *
 * Threads: every function runs on the I/O thread.  The writer thread only
 * writes the job it was handed and posts the eventfd.
 *
 * Ownership: the coordinator owns the parts it collects (until the writer
 * is done with them), the replies it holds, the writer thread and its
 * eventfd.  A released ps_held_reply belongs to the caller
 * (ps_held_reply_free). */
#ifndef PS_CKPT_COORD_H
#define PS_CKPT_COORD_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ps_trace.h"
#include "server.h"
#include "shard.h"
#include "table_part.h"
#include "updater_frames.h"

typedef struct ps_ckpt_coord ps_ckpt_coord;

/* What checkpoints ask of the update threads and the I/O loop. */
typedef struct ps_ckpt_policy {
    int on;              /* checkpoints are taken: a directory and an interval */
    int defer_acks;      /* sync: a push is acknowledged when its round is complete, so
                            the pushes of a round a crash lost are resent by the workers */
    int durable;         /* sync, one per round ("durable rounds"): replies that reveal a
                            version wait until a checkpoint holding it is on disk */
    int report_progress; /* sync, by rounds: update threads report their lowest version */
    int ack_bound;       /* async, every N pushes: a push is acknowledged only once a
                            written checkpoint holds every mutation up to N before it,
                            so a crash loses at most N acknowledged pushes */
} ps_ckpt_policy;


/* A reply held until a checkpoint makes it durable: frames
 * [identity, header, payload?] for the ROUTER. */
typedef struct ps_held_reply {
    struct ps_held_reply *next;
    int kind;        /* PS_OUT_INIT: `version` is the sequence number of the first
                        checkpoint that holds its chunk; PS_OUT_HELD: the version a
                        checkpoint must hold; PS_OUT_ACK: the mutation number */
    int64_t version;
    int64_t held_ns; /* when it was held */
    int noticed;     /* named by ps_ckpt_coord_overdue already */
    int nf;
    zmq_msg_t f[3];
} ps_held_reply;

/* From the server's config: the policy, and with a checkpoint directory,
 * that directory created if missing (ps_mkdir_p), checked by writing a file
 * in it, and the next sequence number above every checkpoint already there.
 * Errors: PS_EINVAL (the directory cannot be made or written: why names it
 * and the errno), PS_EIO (no eventfd), PS_ENOMEM; why says. */
int ps_ckpt_coord_create(const ps_server_config *cfg, ps_ckpt_coord **out, char *why,
                         size_t why_len);

/* Stop the writer thread, drop held replies and collected parts, free.  NULL
 * is fine. */
void ps_ckpt_coord_destroy(ps_ckpt_coord *c);

const ps_ckpt_policy *ps_ckpt_coord_policy(const ps_ckpt_coord *c);

/* Trace the writer's "write" events on a lane of their own, named
 * "checkpoint-writer" here when checkpoints are on.  t outlives c. */
void ps_ckpt_coord_set_trace(ps_ckpt_coord *c, ps_trace *t);

/* What --restore puts back, into the update threads' stores before they
 * run: shard i and table partitions i of each of nshards threads, the
 * partitions' stores made with tc; declared(user, key, decl) is called for
 * each table the checkpoint declares. */
typedef struct ps_ckpt_restore_to {
    ps_shard *const *shards;
    ps_tparts *const *tparts;
    int nshards;
    const ps_tparts_config *tc;
    void (*declared)(void *user, uint64_t key, const ps_table_options *decl);
    void *user;
} ps_ckpt_restore_to;

/* --restore, before any update thread runs: the newest checkpoint of this
 * rank that reads back whole with its chain (a delta's previous ones down to
 * the full one), else an older one.  Its chunks go to the shard of their
 * owner, shards[ps_server_owner(key, chunk, nshards)], its counters to
 * shards[0]; its tables are declared and their partitions filled from the
 * chain's full checkpoint and then each delta in order (a partition's rows,
 * optimizer state, filter, LRU order, counters, version and clocks as the
 * newest left them); hello[r] (num_workers flags) is set for every worker
 * that had said hello, *model_fp to the model's fingerprint.  Checkpoints
 * continue from it (sequence numbers, rounds on disk, each owner's lowest
 * version, and the next one may be a delta on it).  Errors: PS_EDATA (none
 * valid), PS_EMISMATCH (written with another configuration); why says. */
int ps_ckpt_coord_restore(ps_ckpt_coord *c, const ps_ckpt_restore_to *to, uint8_t *hello,
                          uint64_t *model_fp, char *why, size_t why_len);

/* A replacement member (server/repl.h), on update thread idx: load its part
 * of the primary's snapshot (ps_ckpt_view_records: chunk records buf,
 * partition records tbuf) into its shard and partitions, as --restore
 * would; the tables are declared already.  PS_EDATA (a bad record, or one
 * of another thread), PS_EMISMATCH, PS_ENOMEM with why. */
int ps_ckpt_load_records(ps_shard *shard, ps_tparts *tp, const ps_tparts_config *tc, int idx,
                         int num_workers, int nstate, const void *buf, size_t len,
                         const void *tbuf, size_t tlen, char *why, size_t why_len);

/* Partition record v into table v->key of tp (declared there already): a
 * whole record replaces the rows, a delta deletes and puts back what
 * changed; then the filter, the LRU order, the counters, the version and
 * the clocks are the record's (ps_tparts_set_restored with lenient: 1 from
 * a checkpoint, 0 for a partition moved here).  Errors: PS_ENOTFOUND (not
 * declared), PS_EMISMATCH (a row does not fit the table), PS_ETOOBIG,
 * PS_ENOMEM; why says. */
int ps_ckpt_fill_part(ps_tparts *tp, const ps_ckpt_part_view *v, int lenient, char *why,
                      size_t why_len);

/* Start the writer thread (once the update threads run; checkpoints are on).
 * The time between checkpoints counts from here.  PS_ENOMEM when no thread
 * could be made: files are then written on the I/O thread, in
 * ps_ckpt_coord_part. */
int ps_ckpt_coord_run_writer(ps_ckpt_coord *c);

/* The eventfd the writer posts when a file is written; -1 when off. */
int ps_ckpt_coord_fd(const ps_ckpt_coord *c);

/* The server is stopping: no periodic checkpoint starts any more, and a
 * snapshot completed from now on is written at once on the I/O thread. */
void ps_ckpt_coord_stopping(ps_ckpt_coord *c);

/* Is a checkpoint due?  Round-based (sync): every owner's lowest version
 * went up checkpoint_every since the last one; count-based (async): that
 * many of `mut` (inits and pushes forwarded so far) came in; time-based:
 * that long passed and mut moved; and always when init acknowledgements
 * wait.  1 with *token: send PS_CMD_CKPT(token) to every owner. */
int ps_ckpt_coord_due(ps_ckpt_coord *c, int64_t now, uint64_t mut, uint64_t *token);

/* At stop, once idle: 1 with *token as above when mut moved since the last
 * checkpoint, so a clean stop and --restore lose nothing. */
int ps_ckpt_coord_final(ps_ckpt_coord *c, int64_t now, uint64_t mut, uint64_t *token);

/* Is the snapshot just started (by ps_ckpt_coord_due or _final) a full one:
 * every table partition whole?  Else each holds only the rows changed since
 * the last checkpoint written (docs/OPERATIONS.md "Checkpoints"). */
int ps_ckpt_coord_full(const ps_ckpt_coord *c);

/* Owner i's lowest chunk version moved (PS_OUT_PROGRESS). */
void ps_ckpt_coord_progress(ps_ckpt_coord *c, int i, int64_t min_version, int have);

/* Owner i's part (PS_OUT_CKPT); cf->part.buf is taken (freed when it is not
 * the snapshot being collected).  With the last part the snapshot is
 * described (model_fp, hello: num_workers flags, read now) and handed to the
 * writer, or written here when stopping or without a writer thread: then the
 * replies it made durable are returned (NULL: none). */
ps_held_reply *ps_ckpt_coord_part(ps_ckpt_coord *c, int i, ps_ckpt_frame *cf, uint64_t model_fp,
                                  const uint8_t *hello);

/* The writer posted ps_ckpt_coord_fd: log the write, or schedule a retry in
 * 1 s after a failure.  Returns the replies it made durable (NULL: none). */
ps_held_reply *ps_ckpt_coord_written(ps_ckpt_coord *c);

/* No snapshot being collected or written. */
int ps_ckpt_coord_idle(const ps_ckpt_coord *c);

/* A snapshot is being collected (some parts still missing). */
int ps_ckpt_coord_collecting(const ps_ckpt_coord *c);

/* Give up the snapshot being collected (an owner is gone); returns its
 * token. */
uint64_t ps_ckpt_coord_abandon(ps_ckpt_coord *c);

/* A reply an owner tagged PS_OUT_INIT, PS_OUT_HELD or PS_OUT_ACK (version:
 * the tag's), at now.  0: send it now.  1: it waits for a checkpoint; *slot
 * is where its frames go (f[], nf), already queued, or NULL when out of
 * memory (drop the frames: the worker resends). */
int ps_ckpt_coord_hold(ps_ckpt_coord *c, int tag, int64_t version, int64_t now,
                       ps_held_reply **slot);

/* Checkpoint writes are failing: 1 with the last reason (why) and since
 * when (*since_ns); 0 when the last one was written (or none was tried). */
int ps_ckpt_coord_failing(const ps_ckpt_coord *c, char *why, size_t why_len, int64_t *since_ns);

/* While writes fail (stall): call fn(user, m) for each held reply held for
 * the config's checkpoint_failure_ms (while writes failed) and not named
 * before (m stays held). */
void ps_ckpt_coord_overdue(ps_ckpt_coord *c, int64_t now,
                           void (*fn)(void *user, const ps_held_reply *m), void *user);

/* --on-checkpoint-failure exit: writes have failed for checkpoint_failure_ms
 * (1: stop the server). */
int ps_ckpt_coord_give_up(const ps_ckpt_coord *c, int64_t now);

/* Take every held reply out (the server stops without another checkpoint:
 * the caller answers them). */
ps_held_reply *ps_ckpt_coord_take_held(ps_ckpt_coord *c);

/* Close a held reply's frames (those not sent) and free it. */
void ps_held_reply_free(ps_held_reply *m);

/* Checkpoints written so far, and writes that failed. */
uint64_t ps_ckpt_coord_count(const ps_ckpt_coord *c);
/* The last checkpoint written: when it was done (ps_now_ns; 0: none yet)
 * and how long its write took. */
void ps_ckpt_coord_last(const ps_ckpt_coord *c, int64_t *done_ns, int64_t *took_ns);
uint64_t ps_ckpt_coord_failures(const ps_ckpt_coord *c);

#endif
