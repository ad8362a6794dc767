/* Prometheus metrics: a registry of collectors and the text exposition
 * format (version 0.0.4) they write in.
 *
 * How a process exports its figures: the threads that own counters keep
 * them where a scrape may read them without a lock (relaxed atomics, or a
 * block each thread publishes with relaxed stores), and register a
 * collector that reads them and writes whole metric families at scrape
 * time.  A scrape never takes a lock that the code it reads from waits on:
 * the registry's own lock orders scrapes against adding and removing
 * collectors, nothing else.  ps_metrics_http.h serves it over HTTP.
 *
 * Names follow Prometheus' conventions: a prefix naming the process kind
 * (ps_server_, ps_worker_, ps_client_, ps_launch_), base units (seconds,
 * bytes), `_total` on counters, and labels for rank, table and mode.
 * Counters never go down while the process lives.
 *
 * Threads: ps_metrics_add, _remove and _render may be called from any
 * thread; a collector runs on the thread that renders (the exporter's). */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_strbuf.h"

/* ---- histograms of durations ------------------------------------------ */

/* Bucket upper bounds in seconds: 100 us .. 10 s, and +Inf. */
#define PS_METRICS_BOUNDS(X)                                                   \
    X(0.0001) X(0.00025) X(0.0005) X(0.001) X(0.0025) X(0.005) X(0.01)        \
    X(0.025) X(0.05) X(0.1) X(0.25) X(0.5) X(1.0) X(2.5) X(5.0) X(10.0)
#define PS_METRICS_BUCKETS 17 /* the bounds above and +Inf */

/* Durations observed by the threads that measure them (relaxed atomic adds:
 * lock-free, and one writer pays no more than an add) and read by a scrape.
 * Zeroed memory is an empty histogram. */
typedef struct ps_metrics_hist {
    _Atomic uint64_t bucket[PS_METRICS_BUCKETS]; /* observations in each bucket (not
                                                    cumulative; the last: above 10 s) */
    _Atomic uint64_t sum_ns;                     /* their sum, nanoseconds */
} ps_metrics_hist;

/* Count one duration of ns nanoseconds (negative counts as 0). */
void ps_metrics_hist_observe(ps_metrics_hist *h, int64_t ns);

/* ---- writing families -------------------------------------------------- */

enum { PS_METRIC_COUNTER = 0, PS_METRIC_GAUGE = 1, PS_METRIC_HISTOGRAM = 2 };

/* Where a collector writes: the exposition being built. */
typedef struct ps_metrics_out ps_metrics_out;

/* Start family `name` (its # HELP and # TYPE lines).  Every sample of a
 * family follows its start, before the next family starts; a family is
 * started once per scrape (collectors own disjoint names). */
void ps_metrics_family(ps_metrics_out *o, const char *name, int type, const char *help);

/* One sample of the current family: `name{labels} value`.  labels is
 * "" or what ps_metrics_label built (without braces). */
void ps_metrics_sample(ps_metrics_out *o, const char *labels, double v);
void ps_metrics_sample_u64(ps_metrics_out *o, const char *labels, uint64_t v);

/* The _bucket, _sum and _count samples of a histogram family: the sum of
 * the n histograms h[0..n-1] (per-thread ones), read without a lock (a
 * scrape racing an observation may see the bucket and not yet the sum). */
void ps_metrics_sample_hist(ps_metrics_out *o, const char *labels,
                            const ps_metrics_hist *const *h, int n);

/* Append `name="value"` (a comma first when buf is not empty) to the label
 * set in buf, the value escaped as the format wants (\\, \", \n).  Cut at
 * cap bytes (a cut label set is left out whole: buf as before).  buf. */
char *ps_metrics_label(char *buf, size_t cap, const char *name, const char *value);

/* ---- the registry ------------------------------------------------------ */

typedef struct ps_metrics ps_metrics;

/* Writes the collector's families; user is what ps_metrics_add was given. */
typedef void (*ps_metrics_collect_fn)(void *user, ps_metrics_out *o);

/* A registry with the process' own families (process_start_time_seconds,
 * ps_build_info).  NULL when out of memory. */
ps_metrics *ps_metrics_create(void);

/* Call fn(user, out) at every render, after the collectors added before it.
 * 0 or PS_ENOMEM. */
int ps_metrics_add(ps_metrics *m, ps_metrics_collect_fn fn, void *user);

/* Remove the collectors added with user; once this returns none of them
 * runs (a render in progress finishes first). */
void ps_metrics_remove(ps_metrics *m, void *user);

/* The exposition of every collector, appended to out.  0 or PS_ENOMEM. */
int ps_metrics_render(ps_metrics *m, ps_strbuf *out);

/* Free the registry (no exporter may serve it any more). */
void ps_metrics_destroy(ps_metrics *m);

#endif
