/* Public types of libps: error codes, consistency modes, the optimizer and
 * its hyper-parameters, server counters.  The wire format (proto/) and every
 * program use these same definitions; a C or Python user needs only this
 * header and ps_client.h.
 *
 * Tables, not lists: each enumerated thing is one X-macro here, and the
 * code that encodes, decodes, compares, parses flags, prints help or writes
 * checkpoints walks the table.  Adding a hyper-parameter is one row of
 * PS_OPT_PARAMS (and, if a new optimizer uses it, the kernel). */
#ifndef PS_TYPES_H
#define PS_TYPES_H

#include <stdint.h>

/* ---- error codes: X(name, value, text) ----
 * Functions that can fail return 0 or one of these (always positive); the
 * values travel in ERROR replies (docs/PROTOCOL.md), so they never change. */
#define PS_ERRORS(X)                                                         \
    X(PS_OK, 0, "success")                                                   \
    X(PS_EINVAL, 1, "invalid argument")                                      \
    X(PS_ENOMEM, 2, "out of memory")                                         \
    X(PS_EPROTO, 3, "malformed or unexpected message")                       \
    X(PS_EIO, 4, "I/O error")                                                \
    X(PS_ETIMEDOUT, 5, "timed out")                                          \
    X(PS_ENOTFOUND, 6, "not found")                                          \
    X(PS_ESTATE, 7, "not valid in the current state")                        \
    X(PS_EMISMATCH, 8, "configuration mismatch between peers")               \
    X(PS_ECLOSED, 9, "shut down")                                            \
    X(PS_EVERSION, 10, "protocol version mismatch")                          \
    X(PS_ETOOBIG, 11, "size too large")                                      \
    X(PS_EDEVICE, 12, "compute device unusable")                             \
    X(PS_EAUTH, 13, "authentication refused")                                \
    X(PS_EDATA, 14, "bad data file")                                         \
    X(PS_EHELLO, 15, "say hello (again): the server dropped or does not know this rank") \
    X(PS_ENONFINITE, 16, "a gradient holds NaN or Inf")                      \
    X(PS_EPERM, 17, "the rank is held by another connection")                \
    X(PS_ENOTPRIMARY, 18, "not the primary of this shard group: go to the one named") \
    X(PS_ESTALE, 19, "a stale epoch or revision: the configuration moved on") \
    X(PS_EMOVED, 20, "not on this server any more: it moved to the server named")

enum {
#define PS_ERR_ENUM_(name, value, text) name = value,
    PS_ERRORS(PS_ERR_ENUM_)
#undef PS_ERR_ENUM_
    PS_ECODE_MAX = 19
};

/* Short, static description of a PS_E* code; never NULL. */
const char *ps_strerror(int code);

/* Longest error text a reply carries (bytes, without the terminator). */
#define PS_ERR_TEXT_MAX 200

/* ---- log lines (stderr): "ROLE[RANK] LEVEL HH:MM:SS.mmm: text", one
 * write each, so grep 'ps_server\[1\] error' works ---- */
enum { PS_LOG_ERROR = 0, PS_LOG_WARN = 1, PS_LOG_INFO = 2, PS_LOG_DEBUG = 3 };
/* The role ("ps_server", "python") and rank (-1: none) printed on each line. */
void ps_log_init(const char *role, int rank);
/* The least severe level printed (default PS_LOG_INFO). */
void ps_log_set_level(int level);

/* ---- element types of payloads (the `d` of docs/PROTOCOL.md); weights and
 * gradients are float32 everywhere but, with a narrower wire type, on the
 * network (ps_client_set_wire_dtype) ---- */
enum ps_dtype { PS_DTYPE_F32 = 1, PS_DTYPE_BF16 = 2, PS_DTYPE_F16 = 3 };
#define PS_DTYPE_MAX 3

/* ---- what a server does with a pushed gradient that holds NaN or Inf,
 * and what a worker does before it pushes one (--on-nonfinite,
 * docs/OPERATIONS.md "Non-finite gradients") ---- */
enum ps_on_nonfinite {
    PS_NONFINITE_REFUSE = 0, /* an error reply (PS_ENONFINITE); a worker does not send it */
    PS_NONFINITE_SKIP = 1,   /* acknowledged and counted as the rank's push; no weight moves */
    PS_NONFINITE_APPLY = 2   /* applied as it is (the weights become NaN/Inf) */
};

/* ---- consistency ---- */
enum ps_mode { PS_MODE_SYNC = 1, PS_MODE_ASYNC = 2 };

/* ---- the optimizer the servers run ---- */
enum ps_opt_kind {
    PS_OPT_NONE = 0, /* in a worker's expectation: accept whatever the server runs */
    PS_OPT_SGD = 1,
    PS_OPT_MOMENTUM = 2,
    PS_OPT_NESTEROV = 3,
    PS_OPT_ADAGRAD = 4,
    PS_OPT_ADAM = 5,
    /* 6 is the tables' FTRL (server/table.h): never a dense kind */
    /* Worker-side updates: the servers combine what the workers push and
     * every worker steps its own optimizer (ps.torch update="worker").
     * average: sync only; the weights of version t+1 are the mean of the
     * round's pushes (the round's mean gradient, which every worker then
     * applies).  add: w += the push (a worker's weight delta; a push summing
     * m deltas adds their sum; sync: the round's mean delta).  Neither uses
     * a hyper-parameter nor keeps state. */
    PS_OPT_AVERAGE = 7,
    PS_OPT_ADD = 8,
    /* adam with decoupled weight decay (torch's AdamW): w *= 1 - lr x
     * weight_decay before adam's step, whose gradient gets no wd x w */
    PS_OPT_ADAMW = 9
    /* 10 is the tables' row-wise adagrad (below): never a dense kind */
};
#define PS_OPT_KIND_MAX 5        /* the update rules the servers run: sgd .. adam */
#define PS_OPT_WORKER_KIND_MAX 8 /* and, after the tables' 6, the worker-side kinds */
#define PS_OPT_KIND_LAST 9       /* the last kind of all: adamw */
/* FTRL-proximal: tables only (ps_client.h, ps_table_options), the kind after
 * the dense ones.  Its hyper-parameters: lr (FTRL's alpha), weight_decay,
 * and ps_table_options' ftrl_beta, ftrl_l1, ftrl_l2. */
#define PS_TABLE_OPT_FTRL 6
/* Row-wise adagrad: tables only, FBGEMM's EXACT_ROWWISE_ADAGRAD (DLRM's
 * RWSAdagrad, TorchRec's default): one state float per row, the sum over the
 * row's updates of the mean of its squared gradient.  Per row of d values,
 * with g' = g + weight_decay * w:
 *   m += (g'_0^2 + g'_1^2 + ... + g'_{d-1}^2) / d   (summed in that order, float)
 *   r = lr / (sqrt(m) + eps);  w = (1 - r * weight_decay) * w - r * g
 * Its hyper-parameters are adagrad's: lr, eps, weight_decay (and the decay). */
#define PS_TABLE_OPT_ROWWISE_ADAGRAD 10

/* A table row's first values (ps_table_options.init), pure functions of
 * (seed, table, id): docs/PROTOCOL.md "Tables" has the formulas. */
enum ps_table_init {
    PS_TABLE_INIT_ZEROS = 0,
    PS_TABLE_INIT_UNIFORM = 1, /* uniform in [-scale, scale) */
    PS_TABLE_INIT_NORMAL = 2   /* normal(0, scale) */
};

/* "sgd", ..., "average", "add", "adamw", "none" for PS_OPT_NONE, "unknown"
 * otherwise. */
const char *ps_opt_name(int kind);
/* "sgd".."adam", "average", "add", "adamw" -> kind; PS_EINVAL for anything
 * else (also "none"). */
int ps_opt_parse(const char *s, int *kind);
/* 1 for a kind a server may run: sgd .. adam, average, add, adamw. */
int ps_opt_kind_valid(int kind);

/* Which optimizers use a hyper-parameter (bit 1 << kind). */
#define PS_OPT_USED_SGD (1u << PS_OPT_SGD)
#define PS_OPT_USED_MOMENTUM (1u << PS_OPT_MOMENTUM)
#define PS_OPT_USED_NESTEROV (1u << PS_OPT_NESTEROV)
#define PS_OPT_USED_ADAGRAD (1u << PS_OPT_ADAGRAD)
#define PS_OPT_USED_ADAM (1u << PS_OPT_ADAM)
#define PS_OPT_USED_ADAMW (1u << PS_OPT_ADAMW)
#define PS_OPT_USED_ALL (0x3eu | PS_OPT_USED_ADAMW)

/* Bounds of a hyper-parameter's range. */
#define PS_OPT_CLOSED 0 /* the bound is allowed */
#define PS_OPT_OPEN 1   /* the bound itself is not */

/* The hyper-parameters, one row each:
 *   X(field, C type (float | uint32_t), wire key, flag, default,
 *     lo, lo bound, hi, hi bound, used by, zero means "not given", help)
 * "zero means not given": for rows where 0 is outside the range (or means
 * "off"), a 0 in a worker's expectation or hello is "do not check".
 * The wire keys are those of the hello map (docs/PROTOCOL.md). */
#define PS_OPT_PARAMS(X)                                                                    \
    X(lr, float, "lr", "--lr", 0.01, 0, PS_OPT_CLOSED, 1e6, PS_OPT_CLOSED, PS_OPT_USED_ALL, 0, \
      "learning rate (0: steps that move no weight)")                                       \
    X(momentum, float, "mom", "--momentum", 0.9, 0, PS_OPT_CLOSED, 1, PS_OPT_CLOSED,        \
      PS_OPT_USED_MOMENTUM | PS_OPT_USED_NESTEROV, 0, "momentum and nesterov: momentum")    \
    X(beta1, float, "b1", "--beta1", 0.9, 0, PS_OPT_CLOSED, 1, PS_OPT_OPEN,                 \
      PS_OPT_USED_ADAM | PS_OPT_USED_ADAMW, 0, "adam, adamw: first-moment decay")           \
    X(beta2, float, "b2", "--beta2", 0.999, 0, PS_OPT_CLOSED, 1, PS_OPT_OPEN,               \
      PS_OPT_USED_ADAM | PS_OPT_USED_ADAMW, 0, "adam, adamw: second-moment decay")          \
    X(eps, float, "eps", "--eps", 1e-8, 0, PS_OPT_OPEN, 1, PS_OPT_CLOSED,                   \
      PS_OPT_USED_ADAGRAD | PS_OPT_USED_ADAM | PS_OPT_USED_ADAMW, 1,                        \
      "adagrad, adam, adamw: denominator term")                                             \
    X(weight_decay, float, "wd", "--weight-decay", 0, 0, PS_OPT_CLOSED, 1, PS_OPT_CLOSED,   \
      PS_OPT_USED_ALL, 0, "L2 term added to every gradient (adamw: decoupled)")             \
    X(lr_decay, float, "lrd", "--lr-decay", 1, 0, PS_OPT_OPEN, 1, PS_OPT_CLOSED,            \
      PS_OPT_USED_ALL, 1, "step decay: multiply the rate by this")                          \
    X(lr_decay_every, uint32_t, "lrde", "--lr-decay-every", 0, 0, PS_OPT_CLOSED, 4294967295.0, \
      PS_OPT_CLOSED, PS_OPT_USED_ALL, 0,                                                    \
      "decay every N updates (rounds/pushes), 0: never")

/* Index of each hyper-parameter in the table: PS_OPT_P_lr, ... */
enum {
#define PS_OPT_INDEX_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) PS_OPT_P_##f,
    PS_OPT_PARAMS(PS_OPT_INDEX_)
#undef PS_OPT_INDEX_
    PS_OPT_NPARAMS
};
/* Bit of a hyper-parameter in ps_opt_config.given: PS_OPT_GIVEN(lr). */
#define PS_OPT_GIVEN(field) (1u << PS_OPT_P_##field)
#define PS_OPT_GIVEN_ALL ((1u << PS_OPT_NPARAMS) - 1u)

/* An optimizer with its hyper-parameters.  Learning-rate decay: update t
 * (1, 2, ...) uses lr * lr_decay^floor((t - 1) / lr_decay_every).
 * `given`: which hyper-parameters a worker's expectation checks
 * (PS_OPT_GIVEN bits); a row marked "zero means not given" also counts as
 * given when it is non-zero.  A server's own configuration is complete. */
typedef struct ps_opt_config {
    int kind; /* enum ps_opt_kind */
#define PS_OPT_FIELD_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) t f;
    PS_OPT_PARAMS(PS_OPT_FIELD_)
#undef PS_OPT_FIELD_
    uint32_t given;
} ps_opt_config;

/* An embedding table (ps_client_register_table, docs/PROTOCOL.md
 * "Tables"): rows of `dim` float32 values addressed by any uint64 id, each
 * created on the servers at its first pull with the initializer's values,
 * updated by the table's own optimizer.  Every worker declares the same
 * tables (the hello compares their fingerprint); the servers keep the first
 * declaration and refuse another.  ps_table_options_default (ps_client.h)
 * fills every field. */
typedef struct ps_table_options {
    uint32_t dim;       /* floats per row, 1 .. 65536 */
    int init;           /* enum ps_table_init */
    float init_scale;   /* uniform: rows in [-scale, scale); normal: the standard
                           deviation; >= 0 */
    uint64_t seed;      /* the initializer's seed */
    /* The optimizer: kind PS_OPT_NONE (the default) is adagrad; else sgd ..
     * adam, or PS_TABLE_OPT_FTRL; every hyper-parameter the kind uses is
     * taken (`given` is not read).  Adam is lazy: a row's bias correction
     * counts that row's updates.  The rate decays with the updates of the
     * row's partition (lr_decay, lr_decay_every). */
    ps_opt_config opt;
    float ftrl_beta, ftrl_l1, ftrl_l2; /* FTRL's beta (1), l1 and l2 (0), each >= 0 */
    /* A row cap for the whole table (0: none, the default): each server keeps
     * at most ceil(max_rows / servers) rows, split evenly over its
     * partitions, and a partition that is full evicts its least recently
     * touched row (pulled or pushed; in sync mode updated, so a run repeats)
     * to make a new one. */
    uint64_t max_rows;
    /* A frequency filter (0 or 1: none): an id gets a row at its
     * min_count-th pull (at most 255); before that a pull returns its
     * initializer's values and a gradient for it is dropped.  Sightings are
     * counted in a counting Bloom filter of filter_cells one-byte cells for
     * the whole table (0: 4194304 per partition), split like max_rows; it
     * may admit an id early when its cells are shared, never late. */
    uint32_t min_count;
    uint32_t filter_cells;
    /* What a partition that holds its share of max_rows does with a new id:
     * PS_TABLE_FULL_EVICT (0, the default) evicts its least recently
     * touched row; PS_TABLE_FULL_REFUSE makes none: the request (pull or
     * push) that would is refused with PS_ETOOBIG, to its worker alone, and
     * the rows there stay.  Without max_rows it means nothing. */
    uint32_t full;
} ps_table_options;

enum { PS_TABLE_FULL_EVICT = 0, PS_TABLE_FULL_REFUSE = 1 };

/* A table's name (ps_client_name_table): for the servers' logs, at most this
 * many printable characters. */
#define PS_TABLE_NAME_MAX 63

/* ---- a server's counters (STATS): X(field, wire key) ---- */
#define PS_STATS_COUNTERS(X)                                                  \
    X(pushes, "push")                                                         \
    X(pulls, "pull")                                                          \
    X(inits, "init")                                                          \
    X(updates, "upd")                                                         \
    X(bytes_in, "bin")                                                        \
    X(bytes_out, "bout")                                                      \
    X(dup_dropped, "dup")                                                     \
    X(errors, "err")                                                          \
    X(chunks, "chunks")                                                       \
    X(workers_seen, "workers")                                                \
    X(partitions, "parts")                                                    \
    X(rows, "rows")                                                           \
    X(table_bytes, "tbytes")                                                  \
    X(evicted, "evict")                                                       \
    X(filtered, "filt")                                                       \
    X(nonfinite, "nonf")                                                      \
    X(forged, "forged")                                                       \
    X(repl_epoch, "rep")                                                      \
    X(repl_lag, "rlag")

typedef struct ps_stats {
#define PS_STATS_FIELD_(f, key) uint64_t f;
    PS_STATS_COUNTERS(PS_STATS_FIELD_)
#undef PS_STATS_FIELD_
    /* partitions: table partitions held (a declared table has one per update
     * thread); rows: table rows held; table_bytes: the memory they and their
     * tables take; evicted: rows evicted by row caps; filtered: pulled ids
     * the frequency filters had not admitted yet and gradient rows dropped for
     * them; forged: requests refused (PS_EPERM) because another connection
     * held their rank; repl_epoch: with replicas, the shard group's epoch
     * this server acts on (0: none); repl_lag: on a primary, the most stream
     * messages a member of its group has not acknowledged yet */
    int64_t min_version, max_version; /* over the server's chunks and table partitions
                                         (wire keys vmin, vmax) */
} ps_stats;

/* ---- who a barrier waits for (STATS reply key `bw`, docs/PROTOCOL.md) ---- */
#define PS_BARRIER_RANKS_MAX 32
typedef struct ps_barrier_info {
    int64_t id;       /* the open barrier with the lowest id; -1: none is open */
    uint32_t missing; /* live workers that have not reached it */
    uint32_t nranks;  /* how many of them ranks lists: the lowest first */
    int32_t ranks[PS_BARRIER_RANKS_MAX];
} ps_barrier_info;

#endif
