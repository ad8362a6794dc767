/* ps_top's table: from two samples of each process' figures, the rates and
 * the lines, slowest first.  Pure: no socket, no terminal (tests give it
 * samples and read the text). */
#ifndef PS_TOP_VIEW_H
#define PS_TOP_VIEW_H

#include "ps_strbuf.h"
#include "ps_types.h"

enum { PS_TOP_SERVER = 0, PS_TOP_WORKER = 1 };

/* What ps_top reads of a /metrics page (docs/OPERATIONS.md "Metrics"). */
#define PS_TOP_METRICS(X)                                                                     \
    X(samples, "ps_worker_samples_total")                                                     \
    X(steps, "ps_worker_steps_total")                                                         \
    X(wait, "ps_worker_comm_wait_seconds_total")                                              \
    X(stale, "ps_worker_staleness_updates")                                                   \
    X(upd, "ps_server_updates_total")                                                         \
    X(mem, "ps_server_memory_bytes")                                                          \
    X(maxmem, "ps_server_max_memory_bytes")                                                   \
    X(round_sum, "ps_server_round_wait_seconds_sum")                                          \
    X(round_n, "ps_server_round_wait_seconds_count")                                          \
    X(ckpt_age, "ps_server_checkpoint_age_seconds")

enum {
#define PS_TOP_M_(id, name) PS_TOP_M_##id,
    PS_TOP_METRICS(PS_TOP_M_)
#undef PS_TOP_M_
    PS_TOP_NM
};
extern const char *const ps_top_metric_names[PS_TOP_NM];

typedef struct ps_top_sample {
    double t;               /* when (seconds, monotonic) */
    int stats_ok;           /* st holds a STATS reply */
    ps_stats st;
    int metrics_ok;         /* m holds the /metrics figures (has: which were there) */
    double m[PS_TOP_NM];
    int has[PS_TOP_NM];
} ps_top_sample;

typedef struct ps_top_proc {
    int role, rank;         /* rank -1: not known yet */
    char endpoint[256];     /* a server's ZeroMQ endpoint; "" none */
    char target[256];       /* its /metrics, host:port; "" none */
    ps_top_sample prev, cur;
    int nsamples;           /* 0, 1 (no rates yet) or 2 */
    char err[256];          /* why the last sample failed; "" when it did not */
} ps_top_proc;

/* A new sample becomes cur (cur becomes prev). */
void ps_top_push_sample(ps_top_proc *p, const ps_top_sample *s);

/* The table: title, a line per server, then a line per worker, each part
 * slowest first (what did not answer, then the fewest updates/s or
 * samples/s).  Appended to out. */
void ps_top_render(const ps_top_proc *p, int n, const char *title, ps_strbuf *out);

#endif
