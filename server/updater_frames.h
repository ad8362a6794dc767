/* The frames between the I/O thread and an update thread (the "owner" of a
 * set of chunks), over the inproc PAIR the two share; server.h has the
 * picture.  One ZeroMQ multipart message per item below.
 *
 * Both ends are one process, so the structs travel as raw bytes, one struct
 * per frame, and a receiver ignores a frame whose size is not the struct's.
 * Identity, header and payload frames are ZeroMQ messages moved with
 * zmq_msg_send (no copy): whoever sends one no longer owns it.
 *
 * I/O thread -> owner: the first frame is a ps_cmd_frame.
 *   PS_CMD_REQ    [cmd] [identity] [payload?]  an init, push, pull or pushpull (or an
 *                                              assign, state, setstate or clock);
 *                                              cmd.h is its decoded and checked header,
 *                                              cmd.mut its mutation number;
 *                                              with PS_FLAG_SHM no payload frame: the
 *                                              payload is in cmd.shm at cmd.h.shm_off
 *                 [cmd] [identity] [frame]...  a sparse pull, push or pushpull: its
 *                                              frames (ids, rows, ids) as they came;
 *                                              cmd.h.chunk is this thread's partition
 *   PS_CMD_TABLE  [cmd]   table cmd.h.key is declared (cmd.h.table): take cmd.store, the
 *                         store of this thread's partition of it (the I/O thread made
 *                         it; the receiver owns it)
 *   PS_CMD_STATS  [cmd]   answer PS_OUT_STATS with cmd.stats_token
 *   PS_CMD_STOP   [cmd]   answer queued pulls with PS_ECLOSED, send PS_OUT_STOPPED, exit
 *   PS_CMD_CKPT   [cmd]   serialize every chunk now; answer PS_OUT_CKPT with cmd.ckpt_seq
 *   PS_CMD_LIVE   [cmd]   rank cmd.rank joins (cmd.live 1) or leaves (0) the live set
 *   PS_CMD_JOIN   [cmd]   live rank cmd.rank's membership starts at step cmd.h.push_step
 *                         (an elastic job's JOIN: ps_shard_join)
 *   PS_CMD_OPT    [cmd]   the optimizer cmd.h.hello.opt from step cmd.h.push_step on
 *                         (a HYPER request: ps_shard_set_opt)
 *   PS_CMD_LOAD   [cmd]   a replacement member (server/repl.h): load cmd.load (this
 *                         thread's part of the primary's snapshot, in cmd.load_block,
 *                         which it frees);
 *                         answer PS_OUT_LOADED
 *   PS_CMD_SNAP   [cmd]   an export's snapshot (server/snapshot.h): at version
 *                         cmd.h.want_version (< 0: as it is), cmd.snap_targets per key
 *                         (the I/O thread's, read now); answer PS_OUT_SNAP with
 *                         cmd.snap_token once every item is taken
 *   PS_CMD_SNAP_FLUSH [cmd] the snapshot's wait ran out: take what still waits, as it is
 *   PS_CMD_TAKE   [cmd]   servers added and removed (server/move_records.h): take the
 *                         cmd.move_nobjs objects cmd.move_objs (malloc'd; the receiver
 *                         frees it) out of this thread for server slot cmd.h.slot at
 *                         endpoint cmd.h.owner_ep: sync, at the first point where no
 *                         round of this thread holds a push (queued until then, in
 *                         order); async, at once.  Serialized as one move block, then
 *                         removed; the requests that waited on them are answered
 *                         PS_EMOVED naming that slot and endpoint.  All or nothing.
 *                         Answer PS_OUT_TAKEN with cmd.move_token
 *   PS_CMD_OBJECTS [cmd]  list every chunk and table partition of this thread with its
 *                         bytes (weights, optimizer state, rows): answer PS_OUT_OBJECTS
 *   PS_CMD_LOAD_MOVED [cmd] load the move block cmd.move_block (malloc'd, cmd.move_len
 *                         bytes: this thread's, ps_move_split) all or nothing: chunks
 *                         into the shard, partitions home (this server's, partition
 *                         idx) into the thread's own tables, others into a moved-in
 *                         ps_tparts of their (home, part).  An object here already is
 *                         refused (PS_EMISMATCH).  Answer PS_OUT_MOVED_IN with
 *                         cmd.move_token
 *
 * owner -> I/O thread: the first frame is a tag, one byte (PS_OUT_HELD,
 * PS_OUT_INIT, PS_OUT_ACK: the byte and an int64, native byte order).  A
 * reply to a request the primary sent on to its group's members
 * (cmd.rseq != 0) has both and then the uint64 rseq: it waits for the
 * members' acknowledgements (server/repl.h) before what the tag says.
 *   PS_OUT_REPLY    [tag] [identity] [header] [payload?]   for the ROUTER, as it is
 *   PS_OUT_HELD     [tag version] [identity] [header] [payload?]
 *                   durable rounds: for the ROUTER once a checkpoint holds `version`
 *   PS_OUT_INIT     [tag seq] [identity] [header]   an init acknowledgement with
 *                   checkpoints: for the ROUTER once a checkpoint holds the chunk:
 *                   checkpoint `seq`, the first snapshot that held it, or for
 *                   seq 0 (a chunk in no snapshot yet) the next one
 *   PS_OUT_ACK      [tag mut] [identity] [header] [payload?]   async with
 *                   --checkpoint-every N: a push acknowledgement (or pushpull
 *                   reply) of mutation `mut`, for the ROUTER once a written
 *                   checkpoint holds every mutation up to mut - N
 *   PS_OUT_STATS    [tag] [ps_stats_frame]      the counters PS_CMD_STATS asked for
 *   PS_OUT_STOPPED  [tag] [ps_stats_frame] [ps_table_total...]   final counters, and
 *                   each table's partition here (an array, one frame); the owner's last
 *                   message
 *   PS_OUT_CKPT     [tag] [ps_ckpt_frame]       the chunks PS_CMD_CKPT asked for (with
 *                   token & PS_REPL_SNAP_TOKEN: a replacement's snapshot, taken
 *                   where no sync round is open when cmd.snap_quiet)
 *   PS_OUT_LOADED   [tag] [int rc]              PS_CMD_LOAD is done
 *   PS_OUT_PROGRESS [tag] [ps_progress_frame]   the owner's lowest chunk version moved
 *                   (only with ps_updater_config.report_progress)
 *   PS_OUT_SNAP     [tag] [ps_snap_frame]       the items PS_CMD_SNAP asked for
 *   PS_OUT_TAKEN    [tag] [ps_move_frame]       PS_CMD_TAKE is done: rc 0 with the move
 *                   block (the I/O thread's now) and its counts; else nothing was
 *                   taken (why says)
 *   PS_OUT_OBJECTS  [tag] [ps_objects_frame]    the objects PS_CMD_OBJECTS asked for
 *   PS_OUT_MOVED_IN [tag] [ps_move_frame]       PS_CMD_LOAD_MOVED is done: rc 0 (the
 *                   thread freed the block), else nothing was loaded and the block
 *                   comes back (the I/O thread's again: the objects are in it alone) */
#ifndef PS_UPDATER_FRAMES_H
#define PS_UPDATER_FRAMES_H

#include <stdint.h>

#include "checkpoint.h"
#include "move_records.h"
#include "ps_proto.h"
#include "shm_peer.h"
#include "snapshot.h"
#include "table.h"

enum {
    PS_CMD_REQ = 1,
    PS_CMD_STATS = 2,
    PS_CMD_STOP = 3,
    PS_CMD_CKPT = 4,
    PS_CMD_LIVE = 5,
    PS_CMD_TABLE = 6,
    PS_CMD_OPT = 7,
    PS_CMD_LOAD = 8,
    PS_CMD_SNAP = 9,
    PS_CMD_SNAP_FLUSH = 10,
    PS_CMD_JOIN = 11,
    PS_CMD_TAKE = 12,
    PS_CMD_LOAD_MOVED = 13,
    PS_CMD_OBJECTS = 14
};

/* Frames a PAIR message of PS_CMD_REQ carries after its command: the
 * identity and at most three of the request's. */
#define PS_CMD_MAX_FRAMES 5

enum {
    PS_OUT_REPLY = 'R',
    PS_OUT_HELD = 'H',
    PS_OUT_INIT = 'I',
    PS_OUT_ACK = 'A',
    PS_OUT_STATS = 'S',
    PS_OUT_STOPPED = 'X',
    PS_OUT_CKPT = 'C',
    PS_OUT_PROGRESS = 'P',
    PS_OUT_LOADED = 'L',
    PS_OUT_SNAP = 'N',
    PS_OUT_TAKEN = 'T',
    PS_OUT_MOVED_IN = 'M',
    PS_OUT_OBJECTS = 'O'
};

/* Each command reads its own fields; the others are 0. */
typedef struct ps_cmd_frame {
    int cmd;              /* PS_CMD_* */
    /* REQ */
    ps_header h;          /* the request's header (OPT: the HYPER's, opt and step set) */
    uint64_t mut;         /* its mutation number: the I/O thread's count of inits and
                             pushes, this one included; 0 for a pull */
    ps_shm_peer *shm;     /* with PS_FLAG_SHM: the worker's arena, one reference the
                             receiver owns (the range was checked); else NULL */
    uint64_t stats_token; /* STATS: the request (stats_req.h) the counters answer */
    uint64_t ckpt_seq;    /* CKPT: the checkpoint's sequence number */
    int32_t rank;         /* LIVE: the rank that joins (live 1) or leaves (0) */
    int live;
    int ckpt_full;        /* CKPT: every table partition whole (else only what changed
                             since the last checkpoint, where the table allows) */
    ps_table *store;      /* TABLE: this thread's partition of table h.key */
    int after_restore;    /* TABLE: declared on a restored server whose checkpoint did
                             not hold it: its partition starts as restored, at version 0 */
    int64_t recv_ns;      /* REQ, with --metrics-port: when the I/O thread read it (ps_now_ns;
                             the push-to-apply histogram starts there); else 0 */
    uint64_t rseq;        /* REQ: its number in the primary's stream to the members (the
                             reply's tag carries it); 0 none */
    int snap_quiet;       /* CKPT of a replacement's snapshot: wait for a point where no
                             sync round of this thread holds a push */
    void *load_block;     /* LOAD: malloc'd (the receiver frees it), holding the chunk */
    size_t chunks_at, chunks_len, parts_at, parts_len; /* records and the partitions' */
    uint64_t snap_token;  /* SNAP: the snapshot the items answer */
    const ps_snap_target *snap_targets; /* SNAP: per-key versions (the I/O thread's) */
    size_t snap_ntargets;
    uint64_t move_token;  /* TAKE, LOAD_MOVED: the move the reply answers */
    ps_move_obj *move_objs; /* TAKE: the objects (malloc'd; the receiver frees it); the
                               destination is h.slot and h.owner_ep */
    size_t move_nobjs;
    void *move_block;     /* LOAD_MOVED: a move block (malloc'd; the receiver's) */
    size_t move_len;
} ps_cmd_frame;

/* One table's partition at the end (PS_OUT_STOPPED). */
typedef struct ps_table_total {
    uint64_t key;
    ps_table_counts c;
} ps_table_total;

typedef struct ps_stats_frame {
    uint64_t token; /* PS_CMD_STATS's; 0 in PS_OUT_STOPPED */
    ps_stats st;    /* the shard's counters, bytes_out and errors of the thread */
} ps_stats_frame;

typedef struct ps_ckpt_frame {
    uint64_t token;    /* the checkpoint's sequence number */
    uint64_t rseq;     /* a replacement's snapshot: the last stream message (cmd.rseq)
                          this thread had applied when it was taken */
    int rc;            /* 0, or PS_ENOMEM: part is empty */
    ps_ckpt_part part; /* part.buf now belongs to the I/O thread */
} ps_ckpt_frame;

typedef struct ps_snap_frame {
    uint64_t token;      /* PS_CMD_SNAP's */
    int rc;              /* 0, or why the thread's part failed */
    char why[256];
    ps_snap_buf **items; /* rc 0: n item streams, each a reference; the I/O thread's now */
    size_t n;
} ps_snap_frame;

/* PS_OUT_TAKEN and PS_OUT_MOVED_IN. */
/* One object an update thread holds, with its bytes (PS_OUT_OBJECTS): a
 * chunk (kind PS_MOVE_CHUNK, a its index, b 0) or a table partition
 * (PS_MOVE_PART, a its home, b its index, nparts its home's partitions);
 * home is the I/O thread's to fill (server/move.h). */
typedef struct ps_upd_obj {
    uint32_t kind, nparts;
    uint64_t key;
    uint32_t a, b;
    uint64_t bytes;
    int32_t home;
} ps_upd_obj;

/* PS_OUT_OBJECTS: every object of the thread (objs malloc'd, the I/O
 * thread's now; NULL when n is 0 or rc is not). */
typedef struct ps_objects_frame {
    int rc;
    ps_upd_obj *objs;
    size_t n;
} ps_objects_frame;

typedef struct ps_move_frame {
    uint64_t token;     /* cmd.move_token */
    int rc;             /* 0, or why nothing was taken / loaded */
    char why[256];
    void *block;        /* TAKEN, rc 0: the move block (ps_move_serialize's); MOVED_IN,
                           rc != 0: the block given back; else NULL.  The I/O thread's */
    size_t len;
    uint64_t nchunks, nparts; /* objects taken / loaded */
    uint64_t bytes;     /* their records' bytes (the block's) */
} ps_move_frame;

typedef struct ps_progress_frame {
    int64_t min_version; /* ps_shard_min_version */
    int have;            /* 0: the shard has no chunk yet */
} ps_progress_frame;

#endif
