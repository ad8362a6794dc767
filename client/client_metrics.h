/* A client's Prometheus metrics (ps_client_options.metrics_port): the
 * registry, its exporter, and the client's own counters.
 *
 * The registry is the process' when the client is its only one (ps_worker,
 * a ps.Client): the exchange adds the worker's families to it
 * (client/exchange.c), and the exporter serves it on a thread of its own.
 * The counters are relaxed atomic adds by the threads that post and wait,
 * read by a scrape without a lock. */
#ifndef PSC_CLIENT_METRICS_H
#define PSC_CLIENT_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "client_internal.h"
#include "ps_metrics.h"

struct psc_metrics {
    ps_metrics *reg;
    struct ps_metrics_http *http;
    char base[96];                          /* rank="0",mode="sync" */
    _Atomic uint64_t posted[PS_MSG_TYPE_MAX + 1]; /* operations posted, by message type */
    _Atomic uint64_t wait_ns;               /* time callers spent blocked in waits */
};

/* With o->metrics_port > 0: the registry and the exporter on
 * o->metrics_bind, into c->metrics (NULL with metrics off).  0, or PS_EIO /
 * PS_EINVAL / PS_ENOMEM with c->last_error saying why. */
int psc_metrics_open(ps_client *c, const ps_client_options *o);
/* Stop the exporter, then free (before the rest of the client). */
void psc_metrics_close(ps_client *c);

/* The registry, for the exchange's families; NULL with metrics off. */
ps_metrics *psc_metrics_registry(const ps_client *c);
/* "rank=\"0\",mode=\"sync\"": the labels every family of this client has. */
const char *psc_metrics_labels(const ps_client *c);

static inline void psc_metrics_posted(ps_client *c, uint32_t type)
{
    if (c->metrics && type <= PS_MSG_TYPE_MAX)
        atomic_fetch_add_explicit(&c->metrics->posted[type], 1, memory_order_relaxed);
}

static inline void psc_metrics_waited(ps_client *c, int64_t ns)
{
    if (c->metrics && ns > 0)
        atomic_fetch_add_explicit(&c->metrics->wait_ns, (uint64_t)ns, memory_order_relaxed);
}

#endif
