/* The HTTP exporter of a metrics registry: GET /metrics answers with the
 * exposition (text/plain; version=0.0.4), served by libmicrohttpd on a
 * thread of its own (no HTTP of ours: the library parses every request).
 * The library is loaded (dlopen) when the first exporter starts, so a
 * process with metrics off never maps it; without it, start says so.
 *
 * Bound to 127.0.0.1 unless the caller names another address (the
 * --metrics-bind setting): the figures say how a job runs, so they are
 * not offered to the network by default.  A scrape renders the registry on
 * the exporter's thread; nothing else waits for it.
 *
 * Ownership: the exporter borrows the registry, which must outlive it. */
#ifndef PS_METRICS_HTTP_H
#define PS_METRICS_HTTP_H

#include <stddef.h>

#include "ps_metrics.h"

typedef struct ps_metrics_http ps_metrics_http;

/* Listen on bind:port (bind: an IPv4 or IPv6 address or a host name; NULL
 * or "": 127.0.0.1; port 0: one the system picks) and serve m.  0, or
 * PS_EIO with why ("cannot listen on 127.0.0.1:9400 for metrics: Address
 * already in use"), PS_EINVAL (a bind that does not resolve), PS_ENOMEM.
 * *out is NULL on error. */
int ps_metrics_http_start(ps_metrics *m, const char *bind, int port, ps_metrics_http **out,
                          char *why, size_t why_len);

/* The port it listens on (the one picked for 0). */
int ps_metrics_http_port(const ps_metrics_http *h);

/* "http://127.0.0.1:9400/metrics": where it serves (a buffer of h's). */
const char *ps_metrics_http_url(const ps_metrics_http *h);

/* Scrapes answered so far. */
unsigned long long ps_metrics_http_scrapes(const ps_metrics_http *h);

/* Stop serving (a scrape in progress finishes first) and free h. */
void ps_metrics_http_stop(ps_metrics_http *h);

#endif
