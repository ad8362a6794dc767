/* The server's Prometheus metrics (--metrics-port; every family is in
 * docs/OPERATIONS.md "Metrics").
 *
 * Who writes what, and why a scrape never waits for an update:
 *  - Each update thread owns a block (ps_srv_mthread) that only it writes:
 *    its counters (PS_STATS_COUNTERS, the same names STATS replies carry),
 *    its tables' figures and two histograms.  It copies its plain counters
 *    into the block with relaxed atomic stores when it is about to wait for
 *    work (its PAIR is empty) and at most every millisecond while it is busy
 *    (ps_srv_mthread_due), so a scrape sees figures at most that old and
 *    the update path pays a few stores a millisecond.  The histograms it
 *    adds to directly (relaxed atomic adds).
 *  - The I/O thread owns another block (ps_srv_metrics_io), written after
 *    every round of its loop, and the list of tables' labels, which it only
 *    appends to (the count is published with a release store).
 *  - The exporter's thread (libmicrohttpd's) reads all of it with relaxed
 *    loads (acquire for the table count) and takes no lock but the
 *    registry's, which nothing on the update path takes.
 * The STATS request would not do for a scrape: it is answered once every
 * update thread has answered over its PAIR, so it queues behind their
 * work, which is what a scrape must never do.
 *
 * Counters never go down: the blocks are cumulative from the start of the
 * process (a --restore's restored counters included, as STATS has them).
 *
 * With metrics off (metrics_port 0) nothing here exists: the server's
 * pointer is NULL and every caller checks it. */
#ifndef PS_SERVER_METRICS_H
#define PS_SERVER_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_metrics.h"
#include "server.h"
#include "table.h"

/* Tables with a label of their own; later ones are summed as table="other". */
#define PS_SRV_METRICS_TABLES 64

/* PS_STATS_COUNTERS as indices: PS_SRVM_pushes, ... */
enum {
#define PS_SRVM_INDEX_(f, key) PS_SRVM_##f,
    PS_STATS_COUNTERS(PS_SRVM_INDEX_)
#undef PS_SRVM_INDEX_
    PS_SRVM_NCOUNTERS
};

/* One table's figures in one update thread (its partition). */
typedef struct ps_srv_mtable {
    _Atomic uint64_t rows, bytes, pulled, pushed, updated, evicted, filtered;
} ps_srv_mtable;

/* One update thread's block: written by that thread alone. */
typedef struct ps_srv_mthread {
    _Alignas(64) _Atomic uint64_t c[PS_SRVM_NCOUNTERS];
    ps_metrics_hist apply; /* a push's receipt by the I/O thread to the update holding it
                              (sync: from the round's first push) */
    ps_metrics_hist round; /* sync: a round's first push to its last (the wait for the
                              slowest worker) */
    ps_srv_mtable tab[PS_SRV_METRICS_TABLES + 1]; /* by the slot ps_srv_metrics_table_slot
                                                     gives; the last: "other" */
    /* the thread's own bookkeeping (not read by a scrape) */
    int64_t published_ns;
} ps_srv_mthread;

/* What the I/O thread publishes after each round of its loop. */
typedef struct ps_srv_io_figures {
    uint64_t errors;            /* error replies of the I/O thread */
    uint64_t forged;            /* requests refused: another connection holds their rank */
    uint64_t dropped;           /* undecodable messages */
    uint64_t workers_seen, workers_lost, workers_rejoined, hellos_refused;
    uint64_t peer_refused;      /* pulls refused to peers not reading their replies */
    uint64_t shutdowns_refused;
    uint64_t curve_refused;     /* CURVE handshakes refused */
    uint64_t checkpoints, checkpoint_failures;
    int64_t checkpoint_done_ns; /* ps_now_ns of the last written checkpoint; 0: none */
    int64_t checkpoint_took_ns; /* how long its write took */
} ps_srv_io_figures;

typedef struct ps_srv_metrics ps_srv_metrics;

/* With c->metrics_port > 0: the registry, every block, and the exporter on
 * c->metrics_bind (default 127.0.0.1); *out NULL with metrics off.
 * mem_used: the server's memory charge, read at scrape time.  0, or PS_EIO
 * / PS_EINVAL (the port or address, why says) or PS_ENOMEM. */
int ps_srv_metrics_open(const ps_server_config *c, _Atomic uint64_t *mem_used,
                        ps_srv_metrics **out, char *why, size_t why_len);

/* Where it serves ("http://127.0.0.1:9401/metrics"). */
const char *ps_srv_metrics_url(const ps_srv_metrics *m);

/* Update thread i's block (NULL when m is NULL). */
ps_srv_mthread *ps_srv_metrics_thread(ps_srv_metrics *m, int i);

/* I/O thread: table `key` (declared or restored) gets a label, the name of
 * its declaration or, while declarations carry no name, its key in decimal.
 * Call before the update threads hear of the table. */
void ps_srv_metrics_add_table(ps_srv_metrics *m, uint64_t key);

/* Update thread: the slot of table `key` in its block (found among the
 * labels the I/O thread added; PS_SRV_METRICS_TABLES for "other"). */
int ps_srv_metrics_table_slot(const ps_srv_metrics *m, uint64_t key);

/* Update thread: is a publish due (now: ps_now_ns)?  At most every
 * millisecond while busy. */
static inline int ps_srv_mthread_due(const ps_srv_mthread *b, int64_t now)
{
    return now - b->published_ns >= 1000000;
}

/* Update thread: store its counters (st: its shard's and partitions'
 * counters, as upd_stats sums them) in its block. */
void ps_srv_mthread_publish(ps_srv_mthread *b, const ps_stats *st, int64_t now);

/* Update thread: store one table's figures (its partition's counts). */
void ps_srv_mthread_table(ps_srv_mthread *b, int slot, const ps_table_counts *c);

/* I/O thread: publish its figures. */
void ps_srv_metrics_io(ps_srv_metrics *m, const ps_srv_io_figures *f);

/* Stop the exporter (a scrape in progress ends first), then free.  After
 * the update threads stopped. */
void ps_srv_metrics_close(ps_srv_metrics *m);

/* The registry (tests add a collector of their own to it). */
ps_metrics *ps_srv_metrics_registry(ps_srv_metrics *m);

#endif
