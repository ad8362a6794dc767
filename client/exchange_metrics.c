/* The worker's Prometheus families (docs/OPERATIONS.md "Metrics"): what
 * the exchange counts for a training loop, on the registry of the client
 * it drives.  The training thread writes x->met with relaxed atomics; a
 * scrape reads them on the exporter's thread and never waits for it. */
#include <stdio.h>

#include "client_metrics.h"
#include "exchange_state.h"
#include "ps_metrics.h"

static uint64_t ld(const _Atomic uint64_t *p)
{
    return atomic_load_explicit(p, memory_order_relaxed);
}

static void collect(void *user, ps_metrics_out *o)
{
    ps_exchange *x = user;
    const psx_metrics *m = &x->met;
    const char *lab = psc_metrics_labels(x->client);
    ps_metrics_family(o, "ps_worker_steps_total", PS_METRIC_COUNTER, "Training steps done.");
    ps_metrics_sample_u64(o, lab, ld(&m->steps));
    ps_metrics_family(o, "ps_worker_samples_total", PS_METRIC_COUNTER,
                      "Samples trained on (rate() of it: samples/s).");
    ps_metrics_sample_u64(o, lab, ld(&m->samples));
    ps_metrics_family(o, "ps_worker_comm_wait_seconds_total", PS_METRIC_COUNTER,
                      "Time the training loop was blocked on the servers (comm-wait; rate() "
                      "of it: the fraction of the time).");
    ps_metrics_sample(o, lab, (double)ld(&m->wait_ns) * 1e-9);
    ps_metrics_family(o, "ps_worker_measured_pushes_total", PS_METRIC_COUNTER,
                      "Dense pushes whose staleness was measured.");
    ps_metrics_sample_u64(o, lab, ld(&m->pushes));
    ps_metrics_family(o, "ps_worker_stale_updates_total", PS_METRIC_COUNTER,
                      "Their staleness summed: updates of other workers applied between the "
                      "weights a gradient was computed on and its own update.");
    ps_metrics_sample_u64(o, lab, ld(&m->stale));
    ps_metrics_family(o, "ps_worker_staleness_updates", PS_METRIC_GAUGE,
                      "The last push's staleness (sync: always 0).");
    ps_metrics_sample(o, lab,
                      (double)atomic_load_explicit(&m->last_stale, memory_order_relaxed));
}

void psx_metrics_open(ps_exchange *x)
{
    ps_metrics *reg = psc_metrics_registry(x->client);
    x->met.on = reg && ps_metrics_add(reg, collect, x) == 0;
}

void psx_metrics_close(ps_exchange *x)
{
    if (x->met.on)
        ps_metrics_remove(psc_metrics_registry(x->client), x);
    x->met.on = 0;
}

void psx_metrics_stale(ps_exchange *x, int64_t stale)
{
    if (stale < 0) /* a version the servers restored: not a staleness */
        return;
    atomic_fetch_add_explicit(&x->met.pushes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&x->met.stale, (uint64_t)stale, memory_order_relaxed);
    atomic_store_explicit(&x->met.last_stale, stale, memory_order_relaxed);
}
