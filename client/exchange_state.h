/* What the exchange's two files share (include/ps_exchange.h has the
 * contract):
 *   exchange.c        the dense tensors: double buffers, the staging between
 *                     device and host memory, their pushes and pulls, local
 *                     aggregation, the start and final barriers; open,
 *                     start, finish, close
 *   exchange_table.c  the embedding tables: each table's batches (distinct
 *                     ids, the next batch's rows pulled while one computes,
 *                     in sync carried by the push before), their pushes and
 *                     lookups
 * exchange.c calls the tables' part only to finish and free them
 * (psx_tables_finish, psx_tables_free).  Only those two files include this;
 * nothing here is exported (client/libps.map). */
#ifndef PS_EXCHANGE_STATE_H
#define PS_EXCHANGE_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "local_group.h"
#include "ps_backend.h"
#include "ps_exchange.h"
#include "ps_trace.h"

/* A wait shorter than this is not worth a timeline event. */
#define WAIT_EVENT_NS 20000

typedef struct tensor tensor; /* one dense tensor: exchange.c */

/* The worker's figures a scrape reads (exchange_metrics.c): written by the
 * training thread with relaxed atomic stores and adds, never reset. */
typedef struct psx_metrics {
    _Atomic uint64_t steps, samples; /* ps_exchange_step_done */
    _Atomic uint64_t wait_ns;        /* every wait: the comm-wait total */
    _Atomic uint64_t pushes;         /* dense pushes whose staleness was measured */
    _Atomic uint64_t stale;          /* their staleness, summed */
    _Atomic int64_t last_stale;      /* the last one's */
    int on;                          /* the client serves metrics: its collector is added */
} psx_metrics;
typedef struct xtable xtable; /* one embedding table: exchange_table.c */

struct ps_exchange {
    ps_backend *b;
    ps_client *client;
    int mode;
    int accumulate;    /* async: a gradient need not wait for the wire */
    int64_t max_sum;   /* how many may wait in a sum (--max-staleness; unbounded: max) */
    int num_workers;
    int init;          /* ps_exchange_set_init: -1 every worker inits, 1 this one, 0 another */
    int started;
    int in_arena;      /* the buffers live in the client's shared-memory arena */
    void *registered;  /* the arena as registered with the device (pinned) */
    tensor *t;         /* the dense tensors (exchange.c) */
    int n, cap;
    xtable *tb;        /* the embedding tables (exchange_table.c) */
    int ntb, captb;
    int64_t wait_ns;   /* time blocked on requests since ps_exchange_take_wait_ns */
    psx_metrics met;   /* what a scrape reads (exchange_metrics.c) */
    uint64_t summed;   /* gradients that went out in a sum instead of waiting */
    ps_trace *trace;
    int wait_tid, request_tid;
    int interrupted;   /* ps_exchange_interrupt was called (atomic) */
    int failed;        /* a request failure was logged */
    int device_rc;     /* a gradient copy off the device failed: its PS_E* (atomic;
                        * set on the comm thread by copy_done) */
    int wait_timeout_ms; /* the start and final barriers give up after it (0: never) */
    /* local aggregation (ps_exchange_set_local_group) */
    char lg_name[256];
    int lg_rank, lg_size, lg_timeout_ms;
    ps_lgroup *lg;     /* set once open (atomic: ps_exchange_interrupt reads it) */
    int lg_done;       /* the final weights went through the group */
    float *lg_scratch; /* leader on a device: host memory for the sum */
};

/* The training thread was blocked ns on requests: comm-wait. */
static inline void psx_waited(ps_exchange *x, int64_t ns)
{
    x->wait_ns += ns;
    if (x->met.on)
        atomic_fetch_add_explicit(&x->met.wait_ns, (uint64_t)ns, memory_order_relaxed);
}

/* exchange_metrics.c: add the worker's families to the client's registry
 * (when it serves metrics); take them away again. */
void psx_metrics_open(ps_exchange *x);
void psx_metrics_close(ps_exchange *x);
/* A push's staleness: the updates of other workers applied between the
 * weights its gradient was computed on and its own. */
void psx_metrics_stale(ps_exchange *x, int64_t stale);

/* A member of a local group: the leader talks to the servers for it. */
static inline int psx_member(const ps_exchange *x) { return x->lg_size > 1 && x->lg_rank > 0; }
static inline int psx_leader(const ps_exchange *x) { return x->lg_size > 1 && x->lg_rank == 0; }

/* A failure to log: not the PS_ECLOSED that ps_exchange_interrupt, or a
 * failed device (copy_done), causes. */
static inline int psx_worth_logging(const ps_exchange *x, int rc)
{
    return rc != PS_ECLOSED || !(__atomic_load_n(&x->interrupted, __ATOMIC_ACQUIRE) ||
                                 __atomic_load_n(&x->device_rc, __ATOMIC_ACQUIRE));
}

/* The device error copy_done (exchange.c) met, or 0: it, not the PS_ECLOSED
 * of the interrupt it caused, is what the exchange's calls return. */
static inline int psx_device_failed(const ps_exchange *x)
{
    return __atomic_load_n(&x->device_rc, __ATOMIC_ACQUIRE);
}

/* exchange_table.c.  Finish: every table request in flight, waited for;
 * the first error.  Free: the tables' buffers and x->tb. */
int psx_tables_finish(ps_exchange *x);
void psx_tables_free(ps_exchange *x);

/* The client's last error (ps_client_last_error) becomes text: what the
 * exchange's caller reads after a failure of its own waits (client.c). */
void psc_client_set_error(ps_client *c, const char *text);

#endif
