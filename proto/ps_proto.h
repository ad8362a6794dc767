/* Wire format.  Every message is a ZeroMQ multipart message:
 *   frame 0: msgpack header (a map with short string keys, see docs/PROTOCOL.md)
 *   frame 1: raw payload, only for data-carrying messages (count * dtype size bytes)
 * Payloads are never packed into msgpack, so they travel zero-copy.
 * No sockets and no threads here: encode/decode/validate only. */
#ifndef PS_PROTO_H
#define PS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "ps_dtype.h"
#include "ps_limits.h"
#include "ps_msg_table.h"
#include "ps_opt_table.h"
#include "ps_settings.h"
#include "ps_table_decl.h"
#include "ps_types.h"

#define PS_PROTO_VERSION 1

/* Largest header we ever encode or accept (bytes). */
#define PS_HEADER_MAX 1024

/* Longest admin token a SHUTDOWN request carries (bytes, printable ASCII;
 * server/admin.h). */
#define PS_ADMIN_TOKEN_MAX 128

/* The message types: proto/ps_msg_table.h has a row for each (PS_MSG_HELLO = 1,
 * INIT, PUSH, PULL, PUSHPULL, BARRIER, STATS, SHUTDOWN, ERROR, HEARTBEAT = 10,
 * the tables': TABLE, SPULL, SPUSH, SPUSHPULL = 14, then ps.torch's: HYPER
 * .. LEAVE = 22, the tables' SASSIGN = 23, then readers' and exports': LOOKUP,
 * SNAPSHOT, SNAPREAD = 26). */
enum ps_msg_type {
#define PS_MSG_ENUM_(NAME, t, ...) PS_MSG_##NAME = t,
    PS_MSG_TABLE(PS_MSG_ENUM_)
#undef PS_MSG_ENUM_
};
/* The highest type: the table's rows are 1, 2, ... PS_MSG_TYPE_MAX. */
enum {
#define PS_MSG_COUNT_(...) +1
    PS_MSG_TYPE_MAX = 0 PS_MSG_TABLE(PS_MSG_COUNT_)
#undef PS_MSG_COUNT_
};

/* A type's row of the table (ps_msg_info). */
typedef struct ps_msg_info {
    uint32_t type;
    const char *name;
    int from;              /* enum ps_msg_from */
    uint32_t req_keys;     /* PS_HK bits a request must carry besides v and t (s included
                              when s_req is not PS_S_NONE) */
    uint32_t rep_keys;     /* the same for a reply */
    uint8_t req_payload, rep_payload; /* enum ps_payload: the frames after the header */
    uint8_t shm;
    uint8_t s_req, s_rep;  /* enum ps_s_meaning */
    const char *req_doc, *rep_doc;
} ps_msg_info;

/* Types whose requests and replies may name a server slot and its endpoint
 * (`sl`, `to`), as a PS_EMOVED error does: SERVERS, MOVEPLAN, MOVE. */
int ps_msg_names_slot(uint32_t type);
/* The most bytes a PS_PL_BYTES frame of `type` may hold: a page
 * (PS_SNAP_PAGE_BYTES), or for the objects moved between servers (MOVE,
 * MOVEPLAN, OBJECTS, SERVERS) PS_MAX_PAYLOAD_BYTES. */
uint64_t ps_msg_bytes_limit(uint32_t type);

/* The row of `type`; NULL for a type the table does not have. */
const ps_msg_info *ps_msg_info_of(uint32_t type);

/* header flags */
#define PS_FLAG_REPLY 0x1u  /* this message answers request `seq` */
#define PS_FLAG_SHM 0x2u    /* the payload is in the worker's shared-memory arena at
                               offset `shm_off` (no payload frame): a push's gradient,
                               a pull's destination (docs/PROTOCOL.md "Same host") */
#define PS_FLAG_REPL 0x4u   /* forwarded by the shard group's primary (epoch `ep`) to a
                               member: `q` is the stream's sequence number and the reply
                               goes back to the primary (docs/PROTOCOL.md "Replicas") */
#define PS_FLAG_AWAY 0x8u   /* a table request to a partition away from its home server
                               (it moved): `hs` names the home (docs/PROTOCOL.md
                               "Moved objects") */
#define PS_FLAG_MASK 0xfu

/* A worker's shared-memory arena, announced in its hello (name "" : none). */
#define PS_SHM_NAME_LEN 48

/* HELLO body.  Request: the worker's view.  Reply: the server's config. */
typedef struct ps_hello {
    int32_t mode;           /* enum ps_mode */
    int32_t max_staleness;  /* -1: unbounded (pure async); sync uses 0 */
    uint32_t num_workers;
    uint32_t num_servers;
    int32_t server_rank;    /* request: which server the client believes it talks to */
    uint64_t model_fp;      /* hash of the registered tensor list + chunk size; 0 = unset */
    ps_opt_config opt;      /* request: what the worker checks (kind PS_OPT_NONE: any
                               optimizer; hyper-parameters it does not give are left
                               out of the map); reply: the server's, complete */
    /* same-host data plane: request: the worker's arena (name "" when it has
     * none); reply: shm 1 when the server mapped it and will read and write
     * payloads there, else 0 with the reason in shm_why */
    char shm_name[PS_SHM_NAME_LEN];
    uint64_t shm_nonce, shm_size;
    int32_t shm;
    char shm_why[96];
    uint32_t wire_dtype;    /* enum ps_dtype of pushed gradients and pulled weights in
                               payload frames (key "dt"); 0 = not given = PS_DTYPE_F32 */
    uint64_t token;         /* reply: the rank's token for this run; request: the token
                               an earlier reply gave this worker (proves it is the same
                               worker); 0 = none, left out of the map */
    uint32_t threads;       /* reply: the server's update threads, the partitions of each
                               of its tables (key "th"); 0 in a request (not sent) */
    uint64_t tables_fp;     /* the tables' fingerprint (ps_table_decl_fingerprint, key
                               "tfp"): request: the worker's tables; reply: those the
                               server compares it with; 0 = no tables, not sent */
} ps_hello;

typedef struct ps_header {
    uint32_t version;  /* PS_PROTO_VERSION */
    uint32_t type;     /* enum ps_msg_type */
    uint32_t flags;    /* PS_FLAG_* */
    uint64_t seq;      /* request id chosen by the client, echoed in the reply */
    uint8_t seq_negative; /* a refused request's q was a negative integer: seq holds it
                             (two's complement) and the error reply echoes it as one */
    int32_t rank;      /* worker rank, -1 when not a worker */
    uint64_t key;      /* tensor id */
    uint32_t chunk;    /* chunk index within the tensor */
    /* The header's `s`, one field per meaning: a message carries the one its
     * type's row names for a request or a reply (proto/ps_msg_table.h: s_req,
     * s_rep); the others are not sent and decode as 0.  Each in [-1, 2^62). */
    int64_t push_step;     /* PUSH, PUSHPULL request: the step of the gradient; the worker
                              pushes steps 0, 1, 2, ... of each chunk (its clock there) */
    int64_t want_version;  /* PULL request: the reply's version is at least this */
    int64_t chunk_version; /* INIT, PUSH, PULL, PUSHPULL reply: the chunk's version (the
                              weights' in a pull and pushpull reply) */
    int64_t barrier_id;    /* BARRIER, ALLREDUCE, BROADCAST request and reply */
    int64_t opt_step;      /* STATE reply, SETSTATE request: the optimizer's step count
                              (adam's t of the last update) */
    int64_t members_version; /* MEMBERS reply: how many times the membership changed */
    uint64_t count;    /* elements in the payload frame */
    uint32_t dtype;    /* enum ps_dtype; 0 when no payload */
    uint64_t total;    /* INIT: elements of the whole tensor (length check) */
    uint64_t shm_off;  /* PS_FLAG_SHM: offset of the payload in the worker's arena (a
                          pushpull: of the gradient; its reply: of the weights) */
    uint64_t shm_dst;  /* PS_FLAG_SHM pushpull request: where the weights go (key "p") */
    uint32_t npush;    /* async push: how many gradients (of steps push_step ..
                          push_step+npush-1) its payload sums; 0 and 1 both mean one (key
                          "m", sent when > 1) */
    uint32_t dim;      /* SPULL, SPUSH, SPUSHPULL: floats per row (the table's) */
    uint64_t npull;    /* SPUSHPULL request: the ids of its third frame (key "np") */
    ps_table_options table; /* TABLE request: the declaration (key "tb") */
    char table_name[PS_TABLE_NAME_MAX + 1]; /* TABLE request, optional: the table's name
                                               for logs ("" none; key "nm") */
    int32_t err_code;  /* ERROR: PS_E* code */
    char err_text[PS_ERR_TEXT_MAX + 1];
    ps_hello hello;    /* HELLO and HYPER only */
    ps_stats stats;    /* STATS reply only */
    ps_barrier_info barrier; /* STATS reply only, optional: id -1 when absent */
    char admin[PS_ADMIN_TOKEN_MAX + 1]; /* SHUTDOWN request: the admin token; "" none */
    /* Replicas (key "ep", sent when not 0, and "mb" with it): the shard group's
     * epoch, and a member slot: the sender's (REPL_HELLO, REPL_JOIN), the
     * primary's (a PS_ENOTPRIMARY error) */
    uint64_t epoch;
    int32_t member;
    uint64_t stream_pos; /* "rs": REPL_SNAP, the last stream message its part holds;
                            REPL_HELLO, the last one before this connection's */
    /* Servers added and removed (docs/PROTOCOL.md "Moved objects"): a
     * PS_EMOVED error names the server slot that holds the object now ("sl",
     * sent when >= 0) and its endpoint ("to", sent when not ""); a table
     * request with PS_FLAG_AWAY names the partition's home server ("hs").
     * -1 / "" when absent (ps_header_init). */
    int32_t slot;
    char owner_ep[PS_ENDPOINT_MAX];
    int32_t home;
} ps_header;

/* Fill h with defaults: current version, rank -1, no barrier info
 * (barrier.id -1), everything else zero. */
void ps_header_init(ps_header *h, uint32_t type);

/* The header's `s` as the field its type and direction (h->flags'
 * PS_FLAG_REPLY) name: the value ps_proto_encode sends (0 where `s` means
 * nothing), and the field ps_proto_decode fills (nothing is set there). */
int64_t ps_header_get_s(const ps_header *h);
void ps_header_set_s(ps_header *h, int64_t s);

/* Encode h into buf (cap bytes).  Returns 0 and the length in *len,
 * or PS_ETOOBIG when cap is too small. */
int ps_proto_encode(const ps_header *h, void *buf, size_t cap, size_t *len);

/* Decode and validate a header frame.  Every field is type- and range-checked;
 * on failure returns PS_EPROTO / PS_EVERSION / PS_ETOOBIG and writes a
 * human-readable reason into why (may be NULL).  Unknown map keys are ignored
 * (forward compatible); a key this side knows given twice (in the header, `h`
 * or `st`) is refused; a different protocol version is refused; a message
 * without a key its type's row requires (proto/ps_msg_table.h) is refused,
 * naming the key.
 * Even on failure h holds what an error reply echoes, as far as the frame
 * gives it: seq (seq_negative for a negative q), and rank, key, chunk and type
 * when they are in range, and `s` in the field a request of that type has for
 * it; version is PS_PROTO_VERSION once the frame was a map with v = 1 (so the
 * request can be answered), else 0. */
int ps_proto_decode(const void *buf, size_t len, ps_header *h, char *why, size_t why_len);

/* Check that a message of type h->type came with the frames it needs (the
 * table's payload columns): data-carrying types need exactly one payload of
 * count * dtype size bytes, others none; with PS_FLAG_SHM (types whose row
 * allows it) no frame and a count and dtype.  nframes counts frames after
 * the header.  For a type of one frame at most; ps_proto_check_frames takes
 * every type. */
int ps_proto_check_payload(const ps_header *h, int nframes, size_t payload_bytes, char *why,
                           size_t why_len);

/* The same for any layout (enum ps_payload): nframes frames after the
 * header, bytes[i] the size of frame i (those beyond the layout's are not
 * read).  A table's: ids frames of 8 x `n` (and 8 x `np`) bytes, a rows
 * frame of `n` x `dim` x the size of `d`, `dim` in [1, PS_MAX_TABLE_DIM],
 * `n` and `np` at most PS_MAX_SPARSE_IDS. */
int ps_proto_check_frames(const ps_header *h, int nframes, const size_t *bytes, char *why,
                          size_t why_len);

/* A table's request in the worker's arena (PS_FLAG_SHM, checked by
 * ps_proto_check_frames): at `o` its frames' bytes one after the other (ids,
 * float32 rows, ids to pull, as its layout), then room for the rows its
 * reply writes there (a pull's `n`, a pushpull's `np`), which begin at `o`
 * + *reply_at.  The block's bytes. */
uint64_t ps_proto_sparse_shm_bytes(const ps_header *h, uint64_t *reply_at);

/* How many frames a layout (enum ps_payload) has after the header. */
int ps_payload_frames(int layout);

/* The request layout of a type (PS_PL_*), and the reply's; PS_PL_NONE for
 * a type the table does not have. */
int ps_msg_request_layout(uint32_t type);
int ps_msg_reply_layout(uint32_t type);
/* True for types whose request carries one payload frame of values (INIT,
 * PUSH, PUSHPULL). */
int ps_msg_request_has_payload(uint32_t type);
/* True for types whose reply carries one payload frame of values (PULL,
 * PUSHPULL). */
int ps_msg_reply_has_payload(uint32_t type);
/* True for the sparse types (SPULL, SPUSH, SPUSHPULL). */
int ps_msg_is_sparse(uint32_t type);

/* The type's name ("pushpull"); "unknown" for a type the table does not have. */
const char *ps_msg_type_name(uint32_t type);
/* The names of the types whose row `want` accepts, in type order ("hello,
 * stats, shutdown and heartbeat"), into out (cut to cap bytes).  out. */
const char *ps_msg_names(char *out, size_t cap, int (*want)(const ps_msg_info *m));
/* What `s` is for an enum ps_s_meaning ("the step of the gradient"). */
const char *ps_s_meaning_doc(int meaning);

/* acc += p: every counter of PS_STATS_COUNTERS summed, the version range
 * widened over the parts that hold chunks (*have_versions: acc's range is
 * set; start with 0).  The one place counters are added up (a server's
 * owners, a STATS reply, checkpoints and their restore). */
void ps_stats_add(ps_stats *acc, int *have_versions, const ps_stats *p);
const char *ps_mode_name(int mode);
int ps_mode_parse(const char *s, int *mode);

/* ---- proto/ps_hello.c: the settings servers and workers agree on ----
 * The rows of the settings table with a hello key (common/ps_settings.h),
 * in table order, i from 0 to ps_hello_nagreed() - 1: the field of ps_hello
 * the row names holds the value, the hello map carries it under the key. */
int ps_hello_nagreed(void);
const ps_setting *ps_hello_agreed(int i);
int64_t ps_hello_get(const ps_hello *h, int i);
void ps_hello_set(ps_hello *h, int i, int64_t v);
/* Is it given: 0 where the row takes no 0 is "not given" (left out of the
 * map; compared as the row's default: a hello without "dt" is float32). */
int ps_hello_sends(const ps_hello *h, int i);

/* Compare two configs: every agreed setting, then the model fingerprint
 * and the tables' (each when both give one), then with check_opt the
 * optimizer (ps_opt_compare).
 * On mismatch returns PS_EMISMATCH and writes a message naming the setting
 * and both sides' values ("mode: worker 0 has sync, server has async"). */
int ps_hello_compare(const ps_hello *a, const char *a_name, const ps_hello *b, const char *b_name,
                     int check_opt, char *why, size_t why_len);

#endif
