/* ps_server: one shard of the model's weights and the rules of
 * docs/PROTOCOL.md around it.
 *
 * Architecture (one socket, one thread; no lock on the hot path):
 *
 *   workers' DEALERs ──tcp/ipc──> ROUTER ── I/O thread (the caller of ps_server_run)
 *                                            │  inproc PAIR per update thread
 *                                            ├── update thread 0: ps_shard (its chunks)
 *                                            ├── ...
 *                                            └── update thread T-1
 *
 * Modules (each a .c with its .h, which states the contract and who owns
 * what):
 *   server.c          the I/O thread: owns the ROUTER, the I/O ends of the
 *                     PAIRs and every module below except the updaters'
 *                     insides; one pump (io_pump) polls and dispatches for the
 *                     run loop, the stop and the wait for a last checkpoint
 *   server_dispatch.c one ROUTER message to its handler: decode, the checks
 *                     of its type's row (proto/ps_msg_table.h: who may send it,
 *                     its frames), replicas' and moved objects' answers
 *   server_msg.c      the handler of each type: answer control messages,
 *                     hand data to an owner
 *   server_io.c       what server.c and server_msg.c both do: send on the
 *                     ROUTER, hand a command to an owner, mark stopping
 *   server_open.c     ps_server_open and ps_server_close
 *   membership.c      an elastic job's membership on the I/O thread: the live
 *                     sets at open, JOIN to every owner (below, "Elastic jobs")
 *   server_internal.h struct ps_server, shared by those four files
 *   server_config.c   ps_server_config_default/check, ps_server_owner,
 *                     ps_server_away_owner
 *   updater.c         an update thread: its ps_shard and the owner end of its
 *                     PAIR, and an immutable ps_updater_config copied before
 *                     it starts (it never sees struct ps_server); its dense
 *                     chunks' requests and the replies
 *   updater_tables.c  the update thread's sparse requests (SPULL, SPUSH,
 *                     SPUSHPULL) on its table partitions
 *   updater_reply.c   struct ps_updater and what those two share: the
 *                     replies, a push's values read and checked
 *   updater_move.c    servers added and removed, the update thread's side:
 *                     PS_CMD_TAKE at its quiet point, PS_CMD_LOAD_MOVED, the
 *                     table partitions moved here (PS_FLAG_AWAY requests)
 *   move.c            servers added and removed, the I/O thread's tables: what
 *                     this server gave away, expects, holds away from home,
 *                     and the PS_EMOVED redirects; OBJECTS; a removed
 *                     server's last seconds (move.h has the picture)
 *   move_give.c       MOVEPLAN and MOVE: a move's source (take, send, wait,
 *                     load back) and destination (load)
 *   move_coord.c      server 0's SERVERS: the map, one change step by step
 *   move_link.c       requests to other servers of the job (a DEALER each)
 *   move_records.c    moved objects as records: a chosen set serialized into
 *                     a move block (checkpoint records, each partition's home
 *                     and P_h), loaded all or nothing, split per thread
 *   updater_config.h  what an update thread is given (ps_updater_config)
 *   updater_frames.h  every frame on a PAIR, both directions (the tags, the
 *                     command, stats, checkpoint and progress frames)
 *   shard.c           the chunks of one update thread: the table, weight
 *                     buffers and pins, memory, checkpoint views
 *   shard_rules.c     the consistency rules over them: sync rounds, async
 *                     clocks, pulls that wait, live ranks
 *   shard_internal.h  struct ps_shard and its chunk, shared by those two
 *   table_part.c      the table partitions of one update thread and their rules
 *                     (the same as chunks'), each on a table store: table.c
 *                     (its sync rounds table_round.c) on table_hash.c (rows in
 *                     memory) and table_opt.c (a row's arithmetic)
 *   dup_log.c         the duplicate pushes an update thread dropped, said in a
 *                     line per window
 *   optimizer.c       the update kernels (their results checked: a value that
 *                     would not be finite keeps its old one)
 *   ckpt_coord.c      checkpoint coordination: when one is due, collecting
 *                     the parts, the writer thread, the replies held until a
 *                     checkpoint makes them durable.  It sends nothing: it
 *                     returns the token to send as PS_CMD_CKPT and the
 *                     replies to put on the ROUTER
 *   ckpt_restore.c    --restore: the newest valid chain of checkpoints read
 *                     back into the shard and the tables (its struct shared
 *                     with ckpt_coord.c in ckpt_coord_internal.h)
 *   checkpoint.c      the checkpoint file: format, atomic write, read, check
 *   workers.c         the worker table: hello, identity, last heard from, the
 *                     --on-worker-loss rule
 *   barrier.c         barriers waiting for every live worker
 *   collective.c      allreduce and broadcast waiting for every live worker
 *   stats_req.c       STATS requests waiting for every owner's counters
 *   server_metrics.c  --metrics-port: the blocks each update thread and the
 *                     I/O thread publish for a scrape, read without a lock,
 *                     and the server's families
 *   outbox.c          messages for a PAIR whose owner is behind
 *   hs_monitor.c      the ROUTER's connection events: disconnects, and CURVE
 *                     handshake failures the ZAP handler never sees
 *   peers.c           what each peer's unread replies hold, and its name
 *   admin.c           who may stop the server with a SHUTDOWN message
 *   ratelimit.c, reply.c, zmsg.c
 *                     rate-limited logging, reply headers, multipart frames
 *   repl.c            --group: replicas and failover (repl.h has the picture):
 *                     roles, the primary's stream to the members, the replies
 *                     held until they acknowledged, failure detection
 *   repl_join.c       a replacement member's catch-up (snapshot, then stream)
 *   repl_coord.c      the agent thread between them and etcd (coord/)
 * Apart from the updaters and the checkpoint writer, every module runs on
 * the I/O thread and none of them touches a socket it does not own: barriers
 * and stats requests answer through a ps_reply_to the I/O thread provides.
 *
 *  - The I/O thread alone owns the ROUTER.  It receives every message,
 *    decodes and checks the header (ps_proto_decode, ps_proto_check_payload,
 *    rank < num_workers, hello first, on the rank's own connection), and
 *    answers control messages itself:
 *    hello, barrier, stats, shutdown, heartbeat, and ps.torch's hyper (to
 *    every owner as PS_CMD_OPT), allreduce, broadcast and leave.
 *  - Update thread i owns every chunk with ps_server_owner(key, chunk, T) == i,
 *    in its own ps_shard (server/shard.h): weights, optimizer state, versions,
 *    per-worker clocks, sync round sums, queued pulls; and partition i of
 *    every embedding table (server/table_part.h: rows placed there by a hash
 *    of (table, id)).  Nothing is shared, so nothing is locked; the only
 *    shared data are the atomic memory charge taken when a chunk or a row is
 *    created and each worker's charge for the table rows its requests made
 *    (--table-memory-per-worker).
 *  - Tables are declared by a TABLE message: the I/O thread keeps the first
 *    declaration (and compares later ones), makes each thread's partition
 *    store and hands it over (PS_CMD_TABLE), and routes a sparse message to
 *    the thread of its partition (`c`) after checking the table, the width
 *    of its rows and its frames.
 *  - The I/O thread hands init/push/pull/pushpull (and ps.torch's assign,
 *    state, setstate, clock) to the owner over that
 *    thread's PAIR socket: a small command frame (the decoded header), the
 *    ROUTER identity and the payload frame, moved with zmq_msg_send (no copy).
 *  - The owner answers over the same PAIR: [tag, identity, header, payload];
 *    the I/O thread forwards those frames on the ROUTER, a payload counted
 *    against its peer until ZeroMQ has sent it (server/peers.h: a peer that
 *    does not read its replies gets no more payloads).  A pull's
 *    weights are not copied: the reply's payload is the chunk's weight buffer
 *    itself (zmq_msg_init_data), pinned by a reference count that ZeroMQ's
 *    free callback drops once the bytes are sent, from whichever thread that
 *    is.  An update of a chunk whose weights a reply still holds is applied
 *    out of place into another of its buffers (shard.h), so every reply
 *    carries exactly the version it names.  Replies under 8 KiB, and those of
 *    a chunk whose buffers are all held (or past --max-memory), are copies;
 *    a large copy counts against --max-memory until ZeroMQ frees it.
 *  - A pull that cannot be answered yet (sync: its round is not complete;
 *    SSP: the slowest worker is too far behind) is queued on its chunk and
 *    answered by the push that makes it true.
 *  - Back-pressure: the I/O thread never blocks.  When an owner's PAIR is full
 *    it stops reading the ROUTER until that owner catches up, and it always
 *    drains replies, so an owner blocked on sending a reply always resumes.
 *  - Stats: the I/O thread asks every owner for its counters and answers when
 *    all have replied (so a STATS sent after a reply reflects that request).
 *    A Prometheus scrape does not go that way (it would queue behind the
 *    updates): it reads what the threads publish (server_metrics.h).
 *  - A rank belongs to the connection whose hello was accepted last; another
 *    connection's hello for it is refused while that one is live, unless it
 *    carries the rank's token, and every other message under the rank is
 *    taken only from that connection (and, under CURVE, its key): refused
 *    with PS_EPERM while the holder is live, PS_EHELLO when none is
 *    (server/workers.h, docs/SECURITY.md).
 *  - Liveness: the I/O thread notes when it last heard from each worker (any
 *    message; the client library sends HEARTBEATs).  A worker silent for
 *    worker_timeout_ms is lost: with PS_LOSS_WAIT this is logged and everything
 *    keeps waiting for it; with PS_LOSS_DROP it leaves the live set
 *    (PS_CMD_LIVE to every owner: sync rounds and the SSP rule skip it,
 *    ps_shard_set_live; ps_barriers_set_live: barriers stop counting it); its
 *    requests are refused until it says hello again, which puts it back.
 *  - Elastic jobs (--num-workers MIN:MAX with MIN < MAX; membership.c): ranks
 *    0..MAX-1 may be members, and none is until its hello (the owners' live
 *    sets start empty, ps_shard_set_elastic; a rank that never said hello is
 *    not waited for).  A hello makes the rank a member (PS_CMD_LIVE 1: each
 *    chunk counts it from its open round, or the next where the rank-order
 *    sum had passed it, so no round it is not in can end meanwhile); the
 *    worker then reads every chunk's clock and sends JOIN with the largest
 *    (ps_client_join), and PS_CMD_JOIN raises its clock to that step on every
 *    chunk and partition, ending the earlier rounds without it.  So the
 *    rounds a joiner is in are the same on every chunk: a sync run depends
 *    only on its membership history (who was in which round), not on the
 *    timing.  LEAVE and the worker timeout remove a member (whatever
 *    --on-worker-loss says); a round's mean divides by the gradients summed,
 *    its members'.  Barriers complete only with MIN members arrived
 *    (ps_barriers_set_min), so the job starts with MIN; fewer later is
 *    logged, and rounds go on with whoever is a member.
 *  - Checkpoints (server/ckpt_coord.h, server/checkpoint.h): when one is due,
 *    the I/O thread sends PS_CMD_CKPT to every owner; each serializes its
 *    chunks between two messages (a memory copy, so the hot path stalls only
 *    that long) and sends the buffer back; a writer thread writes the file
 *    (tmp, fsync, rename, fsync dir) while training goes on.  An init is
 *    acknowledged once a checkpoint holds its chunk (so a restored server has
 *    every chunk its workers use).  In sync mode with checkpoints, a push is
 *    acknowledged only when its round is complete (so pushes of a round that
 *    a crash lost are resent by the workers), and with a checkpoint every
 *    round ("durable rounds") the replies that reveal a version (pull replies,
 *    push acknowledgements) wait in the I/O thread until a checkpoint holding
 *    that version is on disk: after a kill and --restore no worker is ahead of
 *    the restored state, so the run continues exactly.  In async mode with a
 *    checkpoint every N pushes, a push is acknowledged only once a written
 *    checkpoint holds every mutation up to N before it (a crash loses at most
 *    N acknowledged pushes).  While writes fail, --on-checkpoint-failure
 *    decides what happens to the replies that wait (ckpt_coord.h).  A stop
 *    writes a last checkpoint.
 *  - Stop (ps_server_stop, SIGINT/SIGTERM in main, a SHUTDOWN message from a
 *    peer with authority: server/admin.h): owners
 *    answer their queued pulls with PS_ECLOSED, send their final counters and
 *    exit; the I/O thread answers waiting barriers and stats with PS_ECLOSED,
 *    joins the threads, logs the totals and closes every socket.  A weight
 *    buffer that replies still hold outlives its shard: the last reply that
 *    ZeroMQ closes (zmq_ctx_term closes what is left) frees it.
 *
 * Thread-safety: ps_server_stop may be called from any thread or a signal
 * handler; everything else from one thread. */
#ifndef PS_SERVER_H
#define PS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "ps_limits.h"
#include "ps_proto.h"
#include "ps_settings.h"

/* --max-memory when /proc/meminfo does not say what is available. */
#define PS_SERVER_DEFAULT_MAX_MEMORY (8ull << 30)

/* --shm: the same-host data plane (docs/PROTOCOL.md "Same host"). */
enum { PS_SHM_OFF = 0, PS_SHM_AUTO = 1 };

/* --import-state: the imported rows' optimizer state and the tables' steps. */
enum { PS_IMPORT_KEEP = 0, PS_IMPORT_RESET = 1 };

/* What to do about a worker silent for worker_timeout_ms. */
enum { PS_LOSS_WAIT = 0, PS_LOSS_DROP = 1 };

/* What to do while checkpoint writes keep failing (docs/OPERATIONS.md):
 * STALL holds what waits for a checkpoint until one is written, and a reply
 * held for checkpoint_failure_ms while writes fail is answered with an error
 * saying why (the reply stays held); CONTINUE lets it go without one; EXIT
 * stops the server (exit 1) once writes have failed for
 * checkpoint_failure_ms. */
enum { PS_CKPT_FAIL_STALL = 0, PS_CKPT_FAIL_CONTINUE = 1, PS_CKPT_FAIL_EXIT = 2 };
#define PS_CKPT_STALL_NOTICE_MS 30000 /* default checkpoint_failure_ms for STALL */
#define PS_CKPT_EXIT_AFTER_MS 10000   /* ... and for EXIT */

typedef struct ps_server ps_server;

typedef struct ps_server_config {
    const char *bind;   /* ZeroMQ endpoint, e.g. tcp://0.0.0.0:5555 or ipc:///tmp/ps0; copied */
    int rank;           /* this server's rank, 0..num_servers-1; an added server's is
                           its slot, >= num_servers */
    int num_servers;    /* 1..65536: the servers the job started with (the row layout) */
    int added;          /* joins a running job (--added): holds nothing until objects
                           move to it (server/move.h) */
    int num_workers;    /* 1..65536; an elastic job's MAX */
    int num_workers_min; /* an elastic job's MIN (--num-workers MIN:MAX, MIN < MAX); else
                            num_workers (or 0: the same) */
    int mode;           /* PS_MODE_SYNC or PS_MODE_ASYNC */
    int max_staleness;  /* async: -1 unbounded, k >= 0 SSP; must be 0 in sync */
    ps_opt_config opt;  /* kind PS_OPT_SGD..PS_OPT_ADAM */
    int threads;        /* update threads, 1..PS_SERVER_MAX_THREADS */
    uint64_t max_memory;/* bytes of chunk state, table rows and of pull replies sent as copies
                           and not yet read; inits, rows (and such copies) beyond it get
                           PS_ETOOBIG; ps_server_config_default: ps_server_auto_memory */
    uint64_t table_memory_per_worker; /* bytes of table rows one worker may make here;
                                         0: max_memory * 5 / 4 / num_workers */
    int max_tables;     /* tables a job may declare (a later one is refused) */
    /* optional; NULL / 0 is off; strings are copied */
    const char *timeline;       /* Chrome trace JSON: an "apply" per update and a "pull"
                                   per served pull, one lane per update thread */
    const char *curve_dir;      /* CURVE keys (common/ps_curve.h): serve only the workers
                                   whose public keys are in DIR/authorized */
    const char *checkpoint_dir; /* checkpoints go here (created if missing) */
    int64_t checkpoint_every;   /* sync: every N rounds (the lowest chunk version went up
                                   N); async: every N pushes received; 0: by time only */
    int checkpoint_every_ms;    /* at most this long between checkpoints; 0: by count */
    int restore;                /* load the newest valid checkpoint of checkpoint_dir */
    int on_checkpoint_failure;  /* PS_CKPT_FAIL_STALL (default), _CONTINUE or _EXIT */
    int checkpoint_failure_ms;  /* see above; 0: the policy's default */
    int worker_timeout_ms;      /* a worker silent this long is lost; 0: never */
    int on_worker_loss;         /* PS_LOSS_WAIT (default) or PS_LOSS_DROP */
    uint32_t wire_dtype;        /* enum ps_dtype of gradients and weights in payload frames
                                   (default PS_DTYPE_F32): pull replies are sent in it,
                                   pushes are taken in whatever `d` they name and
                                   converted to float32 before they are applied; workers
                                   must give the same (--wire-dtype, checked at hello).
                                   Shared-memory payloads are float32 whatever it is */
    int on_nonfinite;           /* enum ps_on_nonfinite: a pushed gradient with NaN or Inf is
                                   refused (PS_NONFINITE_REFUSE, default), skipped or
                                   applied; counted (stats nonfinite) and logged either way */
    int shm;                    /* PS_SHM_AUTO (default): map the arena a worker on the
                                   same host offers and move its payloads through it;
                                   PS_SHM_OFF: always over the network */
    const char *shm_users;      /* comma-separated users (names or uids) whose arenas are
                                   mapped besides the server's own user's; NULL: none */
    uint64_t max_peer_replies;  /* payload replies one peer may leave unread before its pulls
                                   are refused (server/peers.h); default 10000 */
    uint64_t max_peer_bytes;    /* their bytes; 0 (default): the larger of 64 MiB and twice
                                   the server's chunk memory */
    const char *import_dir;     /* start with the tables of this export (server/import.h) */
    int import_state;           /* PS_IMPORT_KEEP (default) or PS_IMPORT_RESET */
    const char *admin_token_file; /* a SHUTDOWN message carrying this file's token may
                                     stop the server (server/admin.h); NULL: only
                                     signals (and, with curve_dir, admin keys) */
    int metrics_port;           /* serve Prometheus metrics on this port (server_metrics.h);
                                   0: off (the default) */
    const char *metrics_bind;   /* ... on this address; NULL: 127.0.0.1; copied */
    /* replicas (server/repl.h): group NULL is off */
    const char *group;          /* the endpoints of this shard group's members, "a|b[|c]"
                                   (member 0 first); copied */
    int member;                 /* which of them this server is */
    const char *coord;          /* etcd's endpoints (coord/ps_etcd.h); copied */
    const char *job;            /* the job's name in etcd (/ps/JOB/...); copied */
    int failure_timeout_ms;     /* a member silent this long is lost (default 1000) */
} ps_server_config;

/* Defaults: those of the settings table (common/ps_settings.h: rank 0, 1
 * server, 1 worker, sync with staleness 0, 1 thread, max memory
 * ps_server_auto_memory(),
 * shared memory on, f32 on the wire, worker timeout 0 (never),
 * PS_LOSS_WAIT, 10000 unread replies per peer and bytes "auto") and of the
 * optimizer's (sgd lr 0.01, ...); bind NULL (must be set), no timeline, no
 * CURVE, no checkpoints (PS_CKPT_FAIL_STALL), no admin token. */
void ps_server_config_default(ps_server_config *c);
/* The default --max-memory: half of MemAvailable (/proc/meminfo) now, at
 * least 64 MiB; PS_SERVER_DEFAULT_MAX_MEMORY when it cannot be read.
 * *avail: the MemAvailable read (0: none). */
uint64_t ps_server_auto_memory(uint64_t *avail);
/* The per-worker share of the table memory c gives (its
 * table_memory_per_worker, or max_memory * 5 / 4 / num_workers). */
uint64_t ps_server_worker_share(const ps_server_config *c);

/* Where the settings table's server rows live in ps_server_config (n of
 * them), for ps_settings_parse. */
const ps_setting_field *ps_server_config_fields(int *n);

/* PS_EINVAL with a message naming the field when c is not usable. */
int ps_server_config_check(const ps_server_config *c, char *why, size_t why_len);

/* Check the config, restore the checkpoint (restore set), bind the ROUTER
 * (as a CURVE server when curve_dir is set) and start the update threads.
 * Errors: PS_EINVAL (config, why says), PS_EIO (bind failed: address in use,
 * bad endpoint; timeline or checkpoint directory not writable), PS_EDATA
 * (restore: no valid checkpoint), PS_EMISMATCH (restore: the checkpoint was
 * written with another configuration), PS_ENOTFOUND / PS_EAUTH (CURVE keys),
 * PS_ENOMEM.  On error *out is NULL and nothing is left running. */
int ps_server_open(const ps_server_config *c, ps_server **out, char *why, size_t why_len);

/* The endpoint actually bound (a tcp port chosen for "*" filled in). */
const char *ps_server_endpoint(const ps_server *s);

/* Run the I/O loop on the calling thread until a SHUTDOWN message or
 * ps_server_stop.  Then stop the update threads, answer what still waits with
 * PS_ECLOSED and log the totals.  Returns 0, or PS_EIO when a socket failed.
 * Call once. */
int ps_server_run(ps_server *s);

/* Ask ps_server_run to return.  Async-signal-safe (one write(2)). */
void ps_server_stop(ps_server *s);

/* Counters summed over the I/O and update threads, as of the end of
 * ps_server_run (all zero before). */
void ps_server_totals(const ps_server *s, ps_stats *out);

/* Close sockets and free.  After ps_server_run returned, or instead of it. */
void ps_server_close(ps_server *s);

/* The registry of --metrics-port (server_metrics.h), or NULL with metrics
 * off: tests add a collector of their own to it. */
struct ps_metrics *ps_server_metrics(ps_server *s);

/* Update thread owning (key, chunk) among `threads`. */
int ps_server_owner(uint64_t key, uint32_t chunk, int threads);
/* Update thread holding table partition `part` of server `home` when that
 * partition was moved to this server (servers added and removed:
 * server/move_records.h; its requests carry PS_FLAG_AWAY, hs = home and
 * chunk = part): (home + part) mod threads, so the partitions one server
 * gives away spread over the threads of the one that takes them.  A
 * partition back at its home is its own thread's (part), not this. */
int ps_server_away_owner(int home, uint32_t part, int threads);

#endif
