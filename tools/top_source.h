/* Where ps_top's figures come from: a server's STATS reply (the protocol's
 * counters, over CURVE when the job uses it) and a process' /metrics page
 * (libcurl fetches it; the Prometheus text format is read here).
 *
 * Ownership: a ps_top_conn owns its socket (made in the caller's ZeroMQ
 * context) and is used from one thread. */
#ifndef PS_TOP_SOURCE_H
#define PS_TOP_SOURCE_H

#include <stddef.h>

#include "ps_strbuf.h"
#include "ps_types.h"

/* ---- STATS ---- */

typedef struct ps_top_conn ps_top_conn;

/* A DEALER to server `server_rank` at endpoint (CURVE with curve_dir: the
 * server's key DIR/server-<rank>.pub, ours DIR/<key>.key/.pub).  Requests go
 * as rank -1 (a tool: no hello).  0, or PS_E* with why. */
int ps_top_conn_open(void *zctx, const char *endpoint, int server_rank, const char *curve_dir,
                     const char *key, ps_top_conn **out, char *why, size_t len);

/* Ask for the server's counters and wait up to timeout_ms for them.  0, or
 * PS_ETIMEDOUT (no answer: the socket is made again for the next try),
 * PS_EPROTO (a reply that is not one), or the server's error, with why. */
int ps_top_conn_stats(ps_top_conn *c, int timeout_ms, ps_stats *out, char *why, size_t len);

void ps_top_conn_close(ps_top_conn *c);

/* ---- /metrics ---- */

/* GET http://target/metrics (target "host:port") into out (reset first),
 * for at most timeout_ms.  0, or PS_EIO with why ("127.0.0.1:9403:
 * Couldn't connect to server"). */
int ps_top_scrape(const char *target, int timeout_ms, ps_strbuf *out, char *why, size_t len);

/* The sum of the samples of `name` (exactly that name, any labels) in an
 * exposition; *found = how many there were. */
double ps_top_metric(const char *text, const char *name, int *found);

/* The value of label `label` of the first sample of `name` into buf
 * ("" when there is none).  buf. */
const char *ps_top_metric_label(const char *text, const char *name, const char *label,
                                char *buf, size_t len);

#endif
