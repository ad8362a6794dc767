#include "client_metrics.h"

#include <stdio.h>
#include <stdlib.h>

#include "ps_error.h"
#include "ps_metrics_http.h"

static void collect(void *user, ps_metrics_out *o)
{
    const struct psc_metrics *m = user;
    char lab[160];
    ps_metrics_family(o, "ps_client_requests_total", PS_METRIC_COUNTER,
                      "Operations posted to the servers, by message type.");
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        uint64_t v = atomic_load_explicit(&m->posted[t], memory_order_relaxed);
        if (!v)
            continue;
        snprintf(lab, sizeof lab, "%s", m->base);
        ps_metrics_label(lab, sizeof lab, "type", ps_msg_type_name(t));
        ps_metrics_sample_u64(o, lab, v);
    }
    ps_metrics_family(o, "ps_client_wait_seconds_total", PS_METRIC_COUNTER,
                      "Time callers spent blocked waiting for replies.");
    ps_metrics_sample(o, m->base,
                      (double)atomic_load_explicit(&m->wait_ns, memory_order_relaxed) * 1e-9);
}

int psc_metrics_open(ps_client *c, const ps_client_options *o)
{
    if (o->metrics_port <= 0)
        return 0;
    struct psc_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return PS_ENOMEM;
    char r[16];
    snprintf(r, sizeof r, "%d", o->rank);
    ps_metrics_label(m->base, sizeof m->base, "rank", r);
    ps_metrics_label(m->base, sizeof m->base, "mode", ps_mode_name(o->mode));
    int rc = PS_ENOMEM;
    if (!(m->reg = ps_metrics_create()) || ps_metrics_add(m->reg, collect, m)) {
        snprintf(c->last_error, sizeof c->last_error, "out of memory for the metrics");
        goto fail;
    }
    if ((rc = ps_metrics_http_start(m->reg, o->metrics_bind, o->metrics_port, &m->http,
                                    c->last_error, sizeof c->last_error)))
        goto fail;
    c->metrics = m;
    return 0;
fail:
    ps_metrics_destroy(m->reg);
    free(m);
    return rc;
}

void psc_metrics_close(ps_client *c)
{
    struct psc_metrics *m = c->metrics;
    if (!m)
        return;
    ps_metrics_http_stop(m->http);
    ps_metrics_destroy(m->reg);
    free(m);
    c->metrics = NULL;
}

ps_metrics *psc_metrics_registry(const ps_client *c) { return c->metrics ? c->metrics->reg : NULL; }

const char *psc_metrics_labels(const ps_client *c) { return c->metrics ? c->metrics->base : ""; }

const char *ps_client_metrics_url(const ps_client *c)
{
    return c && c->metrics ? ps_metrics_http_url(c->metrics->http) : NULL;
}
