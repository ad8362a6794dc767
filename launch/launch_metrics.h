/* ps_launch's own Prometheus metrics, the job file and the Prometheus
 * targets file: what an operator's tools (ps_top, Prometheus) need to find
 * and watch the processes of a launch.
 *
 * The supervisor (main thread) counts starts and exits in a
 * ps_launch_counts with relaxed atomic adds; the exporter's thread reads
 * them at scrape time.  The files are written from the plan before the
 * processes start: every address in them is the plan's. */
#ifndef PS_LAUNCH_METRICS_H
#define PS_LAUNCH_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* Per role (PS_LAUNCH_SERVER, PS_LAUNCH_WORKER). */
typedef struct ps_launch_counts {
    _Atomic uint64_t started[2], exited_ok[2], failed[2];
} ps_launch_counts;

typedef struct ps_launch_metrics ps_launch_metrics;

/* Serve ps_launch's families (the plan's processes and counts) on
 * bind:port (bind NULL: 127.0.0.1).  0, or PS_EIO / PS_EINVAL / PS_ENOMEM
 * with why. */
int ps_launch_metrics_open(const ps_launch_plan *plan, const ps_launch_counts *counts,
                           const char *bind, int port, ps_launch_metrics **out, char *why,
                           size_t len);
const char *ps_launch_metrics_url(const ps_launch_metrics *m);
void ps_launch_metrics_close(ps_launch_metrics *m);

/* Where a scraper on this host reaches process i's /metrics (or
 * ps_launch's, i = -1, at port): the host it runs on (a hostfile's name
 * without user@), or on this host the bind address (127.0.0.1 for an
 * address of every interface).  "host:port" into buf. */
const char *ps_launch_metrics_target(const ps_launch_plan *plan, int i, int port,
                                     const char *bind, char *buf, size_t len);

/* Write the job file (docs/OPERATIONS.md "ps_top"): a comment, then lines
 *   servers ENDPOINT,ENDPOINT,...
 *   curve-keys DIR                      (with --curve-keys)
 *   launch - HOST:PORT                  (with metrics)
 *   server RANK ENDPOINT HOST:PORT|-
 *   worker RANK - HOST:PORT|-
 * atomically (a temporary file renamed).  0 or PS_EIO with why. */
int ps_launch_write_job(const char *path, const ps_launch_plan *plan, const char *curve_dir,
                        int launch_port, const char *bind, char *why, size_t len);

/* Write Prometheus file_sd targets: one group per process with labels
 * ps_job (job), role and, for servers and workers, ps_rank; atomically.
 * 0 or PS_EIO with why. */
int ps_launch_write_targets(const char *path, const ps_launch_plan *plan, const char *job,
                            int launch_port, const char *bind, char *why, size_t len);

#endif
