/* The message types: one row each, and everything that depends on the type
 * is read from here (Redis's command table is the model): the enum, the
 * names, which header keys a message must carry, who may send it, whether
 * it carries a payload, what `s` means in it (proto/ps_proto.c), the
 * server's dispatch (server/server_dispatch.c, server_msg.c) and the list
 * in docs/PROTOCOL.md "Message types" (`make protocol-doc` writes it;
 * tests/test_msg_table.c fails when it differs).  Adding a type is a row here plus its handler on
 * the server.
 *
 * X(NAME, t, name, from, req_keys, rep_keys, req_payload, rep_payload, shm,
 *   s_req, s_rep, handler, req_doc, rep_doc)
 *   NAME         PS_MSG_<NAME>
 *   t            the value of the header's `t`; never changes, 1, 2, ... in order
 *   name         in log lines, error texts and the docs
 *   from         who may send the request (PS_FROM_<from>, below)
 *   req_keys     header keys a request must carry besides `v` and `t` (PS_HK bits);
 *                `s` is needed wherever it means something (s_req, s_rep)
 *   rep_keys     the same for the reply
 *   req_payload  the frames after the request's header (enum ps_payload, below): 0 none,
 *                1 one payload frame (count x dtype-size bytes), or a table's frames
 *   rep_payload  the same for the reply
 *   shm          1: with PS_FLAG_SHM the payload (or a pull's destination) is in the
 *                worker's shared-memory arena instead of a frame (a table's: its frames'
 *                bytes one after the other, then room for the reply's rows:
 *                ps_proto_sparse_shm_bytes)
 *   s_req, s_rep what the header's `s` means in the request / the reply (PS_S_<..>,
 *                below); NONE: sent as 0 and not read
 *   handler      the server's io_on_<handler> (server/server_msg.c); proto never
 *                reads this column
 *   req_doc, rep_doc  what the request asks and what the reply says (the docs) */
#ifndef PS_MSG_TABLE_H
#define PS_MSG_TABLE_H

/* clang-format off */
#define PS_MSG_TABLE(X)                                                                          \
    X(HELLO, 1, "hello", ANY, PS_HK(H), PS_HK(H), 0, 0, 0, NONE, NONE, hello,                    \
      "agree on mode, model and config: the worker's view in `h`",                               \
      "the server's config in `h`")                                                              \
    X(INIT, 2, "init", WORKER, PS_HK(K) | PS_HK(C), 0, 1, 0, 1, NONE, CHUNK_VERSION, data,      \
      "register a chunk with its first values (the payload)",                                    \
      "acknowledged")                                                                            \
    X(PUSH, 3, "push", WORKER, PS_HK(K) | PS_HK(C), 0, 1, 0, 1, PUSH_STEP, CHUNK_VERSION, data, \
      "a gradient of the chunk (the payload; `m` > 1: a sum of that many)",                      \
      "acknowledged")                                                                            \
    X(PULL, 4, "pull", LIVE, PS_HK(K) | PS_HK(C), 0, 0, 1, 1, WANT_VERSION, CHUNK_VERSION,      \
      data,                                                                                      \
      "the chunk's weights (rank -1, a reader: any version, `s` 0)",                             \
      "the weights (the payload)")                                                               \
    X(PUSHPULL, 5, "pushpull", WORKER, PS_HK(K) | PS_HK(C), 0, 1, 1, 1, PUSH_STEP,              \
      CHUNK_VERSION, data,                                                                       \
      "a push, then a pull of the version after it (`s` + `m`) in one round trip",               \
      "the weights (the payload)")                                                               \
    X(BARRIER, 6, "barrier", WORKER, 0, 0, 0, 0, 0, BARRIER_ID, BARRIER_ID, barrier,            \
      "wait until every live worker reached this barrier (sent to server 0)",                    \
      "once they all have")                                                                      \
    X(STATS, 7, "stats", LIVE, 0, PS_HK(ST), 0, 0, 0, NONE, NONE, stats,                         \
      "the server's counters",                                                                   \
      "the counters in `st`; `bw` while a barrier is open")                                      \
    X(SHUTDOWN, 8, "shutdown", ADMIN, 0, 0, 0, 0, 0, NONE, NONE, shutdown,                       \
      "stop the server (`adm`: the admin token)",                                                \
      "acknowledged, then the server stops (exit 0); without authority `PS_EAUTH`")              \
    X(ERROR, 9, "error", NOBODY, 0, PS_HK(EC), 0, 0, 0, NONE, NONE, none,                        \
      "-",                                                                                       \
      "the answer to any request that was refused: `ec` and `et`")                               \
    X(HEARTBEAT, 10, "heartbeat", LIVE, 0, 0, 0, 0, 0, NONE, NONE, heartbeat,                    \
      "a sign of life (`q` = 0, fire and forget)",                                               \
      "acknowledged; `PS_EHELLO` from a rank the server does not count as live")                \
    X(TABLE, 11, "table", WORKER, PS_HK(K) | PS_HK(TB), 0, 0, 0, 0, NONE, NONE, table,           \
      "declare table `k` (`tb`: its row width, initializer, optimizer, row cap and filter), to " \
      "every server after hello, before any sparse request",                                     \
      "acknowledged (with checkpoints: once one has the declaration written); the first one "  \
      "stays, another is refused with `PS_EMISMATCH` naming the field")                         \
    X(SPULL, 12, "spull", WORKER, PS_HK(K) | PS_HK(C) | PS_HK(DIM), PS_HK(DIM), PS_PL_IDS,       \
      PS_PL_ROWS, 1, WANT_VERSION, CHUNK_VERSION, sparse,                                        \
      "rows of table `k` in partition `c`: their ids (`n`, frame 1)",                            \
      "the rows in the ids' order (`n` x `dim`)")                                                \
    X(SPUSH, 13, "spush", WORKER, PS_HK(K) | PS_HK(C) | PS_HK(DIM), 0, PS_PL_IDS_ROWS, 0, 1,     \
      PUSH_STEP, CHUNK_VERSION, sparse,                                                          \
      "gradient rows for table `k`, partition `c`: ids (`n`, frame 1), rows (frame 2); every "   \
      "partition gets one per step, `n` = 0 when no row of it was touched",                     \
      "acknowledged")                                                                            \
    X(SPUSHPULL, 14, "spushpull", WORKER, PS_HK(K) | PS_HK(C) | PS_HK(DIM), PS_HK(DIM),          \
      PS_PL_IDS_ROWS_IDS, PS_PL_ROWS, 1, PUSH_STEP, CHUNK_VERSION, sparse,                       \
      "a sparse push (frames 1, 2), then the rows of the `np` ids of frame 3 at the version "    \
      "after it (`s` + `m`)",                                                                    \
      "the rows (`n` x `dim`)")                                                                  \
    X(HYPER, 15, "hyper", WORKER, PS_HK(H), PS_HK(H), 0, 0, 0, PUSH_STEP, NONE, hyper,           \
      "change the optimizer's hyper-parameters (those `h` gives) from step `s` on; none "        \
      "given: only ask; `k` a table's key: that table's optimizer (0: the dense one)",          \
      "the server's (or the table's) optimizer as it is now, in `h`")                                             \
    X(ASSIGN, 16, "assign", WORKER, PS_HK(K) | PS_HK(C), 0, 1, 0, 0, NONE, CHUNK_VERSION, data,  \
      "overwrite the chunk's weights with the payload (a loaded model); its version and "        \
      "optimizer state stay",                                                                    \
      "acknowledged")                                                                            \
    X(STATE, 17, "state", WORKER, PS_HK(K) | PS_HK(C), 0, 0, 1, 0, NONE, OPT_STEP, data,         \
      "the chunk's optimizer state",                                                             \
      "its state arrays one after the other (the payload)")                                      \
    X(SETSTATE, 18, "setstate", WORKER, PS_HK(K) | PS_HK(C), 0, 1, 0, 0, OPT_STEP,               \
      CHUNK_VERSION, data,                                                                       \
      "load the chunk's optimizer state: the payload as a state reply has it",                   \
      "acknowledged")                                                                            \
    X(CLOCK, 19, "clock", WORKER, PS_HK(K) | PS_HK(C), 0, 0, 0, 0, NONE, PUSH_STEP, data,        \
      "the step this worker's next push to the chunk (or to partition `c` of table `k`) "       \
      "carries (a restarted worker goes on from it)",                                           \
      "that step: sync, the open round; async, the worker's pushes there so far")                \
    X(ALLREDUCE, 20, "allreduce", WORKER, 0, 0, 1, 1, 0, BARRIER_ID, BARRIER_ID, collective,     \
      "add the payload to collective `s` (sent to server 0)",                                    \
      "the mean of every live worker's payload, summed in rank order")                           \
    X(BROADCAST, 21, "broadcast", WORKER, 0, 0, 1, 1, 0, BARRIER_ID, BARRIER_ID, collective,     \
      "collective `s`: rank 0's payload to every live worker (the others send one element "      \
      "or more, unread; sent to server 0)",                                                      \
      "rank 0's payload")                                                                        \
    X(LEAVE, 22, "leave", WORKER, 0, 0, 0, 0, 0, NONE, NONE, leave,                              \
      "this worker is done (join): rounds and barriers stop waiting for it; its pulls are "      \
      "still answered",                                                                          \
      "acknowledged")                                                                            \
    X(SASSIGN, 23, "sassign", WORKER, PS_HK(K) | PS_HK(C) | PS_HK(DIM), 0, PS_PL_IDS_ROWS, 0, 1, \
      NONE, CHUNK_VERSION, sparse,                                                               \
      "set the rows of table `k`, partition `c`: ids (`n`, frame 1), rows (frame 2, float32): "  \
      "those missing are made (charged to --max-memory and the worker's share), their "          \
      "optimizer state zeroed",                                                                  \
      "acknowledged")                                                                            \
    X(LOOKUP, 24, "lookup", LIVE, PS_HK(C), 0, PS_PL_LOOKUP, PS_PL_VALUES, 0, NONE,              \
      CHUNK_VERSION, lookup,                                                                     \
      "read rows of several tables in partition `c` (a reader): frame 1 the tables, 16 bytes "   \
      "each (u64 key, u32 ids, u32 dim), frame 2 their `n` ids, table after table; no row is "   \
      "made, touched or counted",                                                                \
      "the rows in the request's order, float32 (`n` = their floats); `s` the lowest version "   \
      "of the partitions read")                                                                  \
    X(SNAPSHOT, 25, "snapshot", LIVE, 0, 0, PS_PL_BYTES, 0, 0, WANT_VERSION, CHUNK_VERSION,      \
      snapshot,                                                                                  \
      "copy every chunk and table partition of this server for this connection to read (an "     \
      "export): sync, each at version `s` (one behind waits up to `tot` ms for it; `s` -1: each " \
      "as it is now); frame 1 (`n` bytes, may be empty): keys with versions of their own, 16 "    \
      "bytes each (u64 key, i64 version)",                                                       \
      "the copy is taken: `n` items, versions `s` (lowest) to `tot` (highest)")                  \
    X(SNAPREAD, 26, "snapread", LIVE, PS_HK(K) | PS_HK(C), 0, 0, PS_PL_BYTES, 0, NONE, NONE,     \
      snapread,                                                                                  \
      "page `c` of item `k` of this connection's snapshot (pages of 16 MiB)",                   \
      "the page's `n` bytes; `tot` the item's bytes (\"Export and readers\" below)")  \
    X(REPL_HELLO, 27, "replhello", PEER, PS_HK(H) | PS_HK(EP) | PS_HK(MB), PS_HK(EP), 0, 0, 0,  \
      NONE, NONE, repl,                                                                          \
      "a shard group's primary (member `mb`, epoch `ep`, its config in `h`) to a member: from "  \
      "now on the messages flagged `f` & 4 on this connection are the group's stream, its "      \
      "numbers from `rs` + 1 on",                                                                \
      "taken (`ep`: the epoch the member is at now); `PS_ESTALE` when etcd names another "       \
      "primary or a later epoch")                                                                \
    X(REPL_LIVE, 28, "repllive", PEER, PS_HK(K) | PS_HK(C) | PS_HK(EP), 0, 0, 0, 0, PUSH_STEP,  \
      NONE,                                                                                      \
      repl,                                                                                      \
      "the primary's stream: worker `k` is lost (`c` = 0), back (1) or left (2) the live sets, " \
      "or (3) a member from step `s` on",                                                        \
      "acknowledged")                                                                            \
    X(REPL_JOIN, 29, "repljoin", PEER, PS_HK(H) | PS_HK(EP) | PS_HK(MB) | PS_HK(K) | PS_HK(C), 0, \
      0, 0, 0, NONE, NONE, repl,                                                                 \
      "a replacement server (member `mb`, incarnation `k`, its config in `h`) to the primary: "  \
      "`c` = 0 send me the group's state (a snapshot, then the stream); 1 I loaded it, add me",  \
      "acknowledged (`c` = 0: the snapshot is on its way)")                                      \
    X(REPL_SNAP, 30, "replsnap", PEER, PS_HK(K) | PS_HK(C) | PS_HK(EP) | PS_HK(TOT) | PS_HK(RS),  \
      0, PS_PL_BYTES, 0, 0, NONE, NONE, repl,                                                    \
      "the primary's stream to a replacement: bytes [`k`, `k` + `n`) of update thread `c`'s "    \
      "part of the snapshot (`tot` bytes: u64 length of the chunk records, the chunk records, "  \
      "the table partition records), with the stream in it up to its message `rs`",            \
      "acknowledged")                                                                            \
    X(JOIN, 31, "join", WORKER, 0, 0, 0, 0, 0, PUSH_STEP, NONE, join,                            \
      "an elastic job's new member (after its hello): its gradients count from step `s` on, "    \
      "on every chunk and partition; the rounds before it go on without it",                    \
      "acknowledged")                                                                            \
    X(MEMBERS, 32, "members", WORKER, 0, 0, 0, 0, 0, NONE, MEMBERS, members,                     \
      "the workers that are members now (sent to server 0)",                                     \
      "`k` members, this worker the (`c` - 1)-th of them in rank order (`c` = 0: not one); "    \
      "`s` counts the changes so far (an elastic job's; a fixed job: every rank, version 0)")    \
    X(SERVERS, 33, "servers", ADMIN, PS_HK(C), PS_HK(C), PS_PL_BYTES, PS_PL_BYTES, 0, NONE, NONE, \
      servers, \
      "to server 0: `c` = 1 add the server listening at `to` (started with --added), 2 remove "  \
      "slot `sl` (its objects move off first), 3 the map as it is; frame 1 (`n` bytes): the "  \
      "job's server list as its workers have it (comma-separated)",                              \
      "done: `sl` the slot added or removed; frame 1 (`n` bytes): `c` 1, 2 a line saying what "   \
      "moved, 3 the map (common/ps_smap.h)")                                                     \
    X(OBJECTS, 34, "objects", SERVER, 0, 0, 0, PS_PL_BYTES, 0, NONE, NONE, objects,             \
      "the coordinator (server 0) to a server: list the objects on it",                          \
      "frame 1 (`n` bytes): 40 bytes per object (u32 kind, u32 home's partitions, u64 key, u32 "  \
      "a, u32 b, u64 bytes, i32 home, i32 0)")                                                   \
    X(MOVEPLAN, 35, "moveplan", SERVER, PS_HK(C), 0, PS_PL_BYTES, PS_PL_BYTES, 0, NONE, NONE,   \
      moveplan,                                                                                  \
      "the coordinator to a server: `c` = 1 you are slot `sl` of the job (an added server, its " \
      "config checked by a hello first); 2 the objects of frame 1 (32 bytes each: u32 kind, "   \
      "i32 source slot, u64 key, u32 a, u32 b, i32 home, u32 0) are coming to you; 3 send them " \
      "(frame 1: u32 the destination's threads, u32 0, then the objects) to slot `sl` at `to`; " \
      "4 you are removed: answer everything PS_EMOVED; 5 the objects of frame 1 are not coming", \
      "done; frame 1 (`n` bytes): `c` 3, the objects that moved (as asked: all of them, unless " \
      "some could not; `tot` their bytes), else empty")                                          \
    X(MOVE, 36, "move", SERVER, 0, 0, PS_PL_BYTES, 0, 0, NONE, NONE, move,               \
      "a server to another: load these objects (frame 1: their checkpoint records, "            \
      "server/move_records.h), sent by slot `sl`",                                               \
      "loaded")
/* clang-format on */

/* The header keys, in one list for the decoder and the table's key masks:
 * X(NAME, "key").  PS_HK(NAME) is the key's bit. */
#define PS_HDR_KEYS(X)                                                                           \
    X(V, "v") X(T, "t") X(F, "f") X(Q, "q") X(R, "r") X(K, "k") X(C, "c") X(S, "s") X(N, "n")     \
    X(D, "d") X(TOT, "tot") X(EC, "ec") X(ET, "et") X(H, "h") X(ST, "st") X(ADM, "adm")           \
    X(BW, "bw") X(O, "o") X(M, "m") X(P, "p") X(DIM, "dim") X(NP, "np") X(TB, "tb")           \
    X(NM, "nm") X(EP, "ep") X(MB, "mb") X(RS, "rs")         \
    X(SL, "sl") X(TO, "to") X(HS, "hs")

enum ps_hdr_key {
#define PS_HK_ENUM_(name, key) PS_HK_##name,
    PS_HDR_KEYS(PS_HK_ENUM_)
#undef PS_HK_ENUM_
    PS_HK_COUNT
};
#define PS_HK(name) (1u << PS_HK_##name)

/* The frames after a message's header (the table's req_payload and
 * rep_payload).  A table's ids are little-endian uint64, its rows `dim`
 * elements of `d` each (docs/PROTOCOL.md "Tables"). */
enum ps_payload {
    PS_PL_NONE = 0,         /* no frame */
    PS_PL_VALUES = 1,       /* one frame: `n` elements of `d` */
    PS_PL_IDS = 2,          /* one frame: `n` ids */
    PS_PL_ROWS = 3,         /* one frame: `n` rows */
    PS_PL_IDS_ROWS = 4,     /* `n` ids, then their `n` rows */
    PS_PL_IDS_ROWS_IDS = 5, /* `n` ids, their `n` rows, then `np` ids */
    PS_PL_LOOKUP = 6,       /* a lookup's tables (16 bytes each), then its `n` ids */
    PS_PL_BYTES = 7         /* one frame of `n` bytes (a snapshot's page; a replica's part) */
};

/* Who may send a request of a type (the table's `from`). */
enum ps_msg_from {
    PS_FROM_NOBODY = 0, /* a reply only: a request of this type is refused */
    PS_FROM_ANY,        /* a worker rank or rank -1 (a tool), before hello too: hello itself */
    PS_FROM_LIVE,       /* rank -1, or a worker rank this server counts as live (it said
                           hello and was not dropped); under CURVE a reader key may send
                           these (and hello) as rank -1, nothing else */
    PS_FROM_WORKER,     /* a live worker rank only */
    PS_FROM_ADMIN,      /* as LIVE, and only with authority (server/admin.h) */
    PS_FROM_PEER,       /* another server of the shard group, rank -1 (server/repl.h
                           checks which: the primary of the epoch, a member, a key the
                           servers authorise) */
    PS_FROM_SERVER      /* another server of the job, rank -1 (objects that move between
                           servers): under CURVE a peer with a server key (server-N) */
};

/* What the header's `s` means in a message (the table's s_req, s_rep); each
 * meaning is its own field of ps_header. */
enum ps_s_meaning {
    PS_S_NONE = 0,      /* nothing: sent as 0, not read */
    PS_S_PUSH_STEP,     /* ps_header.push_step */
    PS_S_WANT_VERSION,  /* ps_header.want_version */
    PS_S_CHUNK_VERSION, /* ps_header.chunk_version */
    PS_S_BARRIER_ID,    /* ps_header.barrier_id */
    PS_S_OPT_STEP,      /* ps_header.opt_step */
    PS_S_MEMBERS        /* ps_header.members_version */
};

#endif
