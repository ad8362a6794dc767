#include "server_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"
#include "ps_metrics_http.h"
#include "ps_proto.h"
#include "ps_time.h"

#define LABEL_MAX 96

struct ps_srv_metrics {
    ps_metrics *reg;
    ps_metrics_http *http;
    int threads;
    uint64_t max_memory;
    _Atomic uint64_t *mem_used;
    char base[LABEL_MAX];      /* rank="0",mode="sync" */
    ps_srv_mthread *th;        /* [threads], each 64-byte aligned */
    /* the I/O thread's block */
    struct {
        _Atomic uint64_t errors, forged, dropped, workers_seen, workers_lost, workers_rejoined,
            hellos_refused, peer_refused, shutdowns_refused, curve_refused, checkpoints,
            checkpoint_failures;
        _Atomic int64_t checkpoint_done_ns;
        ps_metrics_hist checkpoint_write;
        uint64_t observed; /* checkpoints already in the histogram (I/O thread only) */
    } io;
    /* the tables' labels: appended by the I/O thread, ntables published last */
    struct {
        uint64_t key;
        char label[LABEL_MAX];
    } tables[PS_SRV_METRICS_TABLES];
    _Atomic size_t ntables;
};

static uint64_t ld(const _Atomic uint64_t *p)
{
    return atomic_load_explicit(p, memory_order_relaxed);
}

static void st(_Atomic uint64_t *p, uint64_t v)
{
    atomic_store_explicit(p, v, memory_order_relaxed);
}

/* ---- what the update threads and the I/O thread call ---- */

ps_srv_mthread *ps_srv_metrics_thread(ps_srv_metrics *m, int i)
{
    return m ? &m->th[i] : NULL;
}

void ps_srv_metrics_add_table(ps_srv_metrics *m, uint64_t key)
{
    if (!m)
        return;
    size_t n = atomic_load_explicit(&m->ntables, memory_order_relaxed);
    for (size_t i = 0; i < n; i++)
        if (m->tables[i].key == key)
            return;
    if (n == PS_SRV_METRICS_TABLES)
        return; /* its figures go to table="other" */
    m->tables[n].key = key;
    /* the declaration carries no name (yet): the key is what names it */
    m->tables[n].label[0] = 0;
    char v[24];
    snprintf(v, sizeof v, "%llu", (unsigned long long)key);
    ps_metrics_label(m->tables[n].label, sizeof m->tables[n].label, "table", v);
    atomic_store_explicit(&m->ntables, n + 1, memory_order_release);
}

int ps_srv_metrics_table_slot(const ps_srv_metrics *m, uint64_t key)
{
    size_t n = atomic_load_explicit(&m->ntables, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (m->tables[i].key == key)
            return (int)i;
    return PS_SRV_METRICS_TABLES;
}

void ps_srv_mthread_publish(ps_srv_mthread *b, const ps_stats *s, int64_t now)
{
#define PUB_(f, key) st(&b->c[PS_SRVM_##f], s->f);
    PS_STATS_COUNTERS(PUB_)
#undef PUB_
    b->published_ns = now;
}

void ps_srv_mthread_table(ps_srv_mthread *b, int slot, const ps_table_counts *c)
{
    ps_srv_mtable *t = &b->tab[slot];
    st(&t->rows, c->rows);
    st(&t->bytes, c->bytes);
    st(&t->pulled, c->pulled);
    st(&t->pushed, c->pushed);
    st(&t->updated, c->updated);
    st(&t->evicted, c->evicted);
    st(&t->filtered, c->filtered_pulls + c->filtered_pushes);
}

void ps_srv_metrics_io(ps_srv_metrics *m, const ps_srv_io_figures *f)
{
    st(&m->io.errors, f->errors);
    st(&m->io.forged, f->forged);
    st(&m->io.dropped, f->dropped);
    st(&m->io.workers_seen, f->workers_seen);
    st(&m->io.workers_lost, f->workers_lost);
    st(&m->io.workers_rejoined, f->workers_rejoined);
    st(&m->io.hellos_refused, f->hellos_refused);
    st(&m->io.peer_refused, f->peer_refused);
    st(&m->io.shutdowns_refused, f->shutdowns_refused);
    st(&m->io.curve_refused, f->curve_refused);
    st(&m->io.checkpoint_failures, f->checkpoint_failures);
    if (f->checkpoints > m->io.observed) { /* one more written since the last round */
        m->io.observed = f->checkpoints;
        ps_metrics_hist_observe(&m->io.checkpoint_write, f->checkpoint_took_ns);
        atomic_store_explicit(&m->io.checkpoint_done_ns, f->checkpoint_done_ns,
                              memory_order_relaxed);
    }
    st(&m->io.checkpoints, f->checkpoints);
}

/* ---- the scrape ---- */

static uint64_t sum_counter(const ps_srv_metrics *m, int idx)
{
    uint64_t v = 0;
    for (int i = 0; i < m->threads; i++)
        v += ld(&m->th[i].c[idx]);
    return v;
}

static void counter(ps_metrics_out *o, const ps_srv_metrics *m, const char *name,
                    const char *help, uint64_t v)
{
    ps_metrics_family(o, name, PS_METRIC_COUNTER, help);
    ps_metrics_sample_u64(o, m->base, v);
}

static void gauge(ps_metrics_out *o, const ps_srv_metrics *m, const char *name,
                  const char *help, double v)
{
    ps_metrics_family(o, name, PS_METRIC_GAUGE, help);
    ps_metrics_sample(o, m->base, v);
}

/* One family of per-table figures: field `off` of ps_srv_mtable summed over
 * the threads, per labelled table (and "other" when it has any). */
static void table_family(ps_metrics_out *o, const ps_srv_metrics *m, size_t n, int type,
                         const char *name, const char *help, size_t off)
{
    ps_metrics_family(o, name, type, help);
    char lab[2 * LABEL_MAX];
    for (size_t t = 0; t <= PS_SRV_METRICS_TABLES; t++) {
        if (t >= n && t < PS_SRV_METRICS_TABLES)
            continue;
        uint64_t v = 0, any = 0;
        for (int i = 0; i < m->threads; i++) {
            const ps_srv_mtable *tb = &m->th[i].tab[t];
            v += ld((const _Atomic uint64_t *)((const char *)tb + off));
            any |= ld(&tb->rows) | ld(&tb->pulled) | ld(&tb->pushed);
        }
        if (t == PS_SRV_METRICS_TABLES && !any)
            continue;
        snprintf(lab, sizeof lab, "%s,%s", m->base,
                 t < PS_SRV_METRICS_TABLES ? m->tables[t].label : "table=\"other\"");
        ps_metrics_sample_u64(o, lab, v);
    }
}

static void collect(void *user, ps_metrics_out *o)
{
    ps_srv_metrics *m = user;
#define C_(f) sum_counter(m, PS_SRVM_##f)
    counter(o, m, "ps_server_pushes_total", "Gradient pushes received (dense and table).",
            C_(pushes));
    counter(o, m, "ps_server_pulls_total", "Pulls served (dense and table).", C_(pulls));
    counter(o, m, "ps_server_inits_total", "Chunks initialized by workers.", C_(inits));
    counter(o, m, "ps_server_updates_total",
            "Optimizer updates applied to chunks and table partitions.", C_(updates));
    counter(o, m, "ps_server_received_bytes_total", "Payload bytes received.", C_(bytes_in));
    counter(o, m, "ps_server_sent_bytes_total", "Payload bytes sent.", C_(bytes_out));
    counter(o, m, "ps_server_duplicates_total",
            "Duplicate pushes dropped (a worker's resend of a push already applied).",
            C_(dup_dropped));
    counter(o, m, "ps_server_refused_requests_total",
            "Requests answered with an error (refused: bad, too big, out of memory, not "
            "hello'd, not reading replies).",
            C_(errors) + ld(&m->io.errors));
    counter(o, m, "ps_server_nonfinite_pushes_total",
            "Pushed gradients holding NaN or Inf (--on-nonfinite decides what happens).",
            C_(nonfinite));
    counter(o, m, "ps_server_evicted_rows_total", "Table rows evicted by row caps.",
            C_(evicted));
    gauge(o, m, "ps_server_chunks", "Dense chunks held.", (double)C_(chunks));
    gauge(o, m, "ps_server_table_partitions", "Table partitions held.", (double)C_(partitions));
#undef C_
    gauge(o, m, "ps_server_memory_bytes",
          "Memory charged against --max-memory: chunks, table rows, large reply copies.",
          (double)ld(m->mem_used));
    gauge(o, m, "ps_server_max_memory_bytes", "The --max-memory limit.", (double)m->max_memory);
    gauge(o, m, "ps_server_workers_seen", "Workers that said hello.",
          (double)ld(&m->io.workers_seen));
    counter(o, m, "ps_server_workers_lost_total",
            "Workers silent past --worker-timeout.", ld(&m->io.workers_lost));
    counter(o, m, "ps_server_workers_rejoined_total", "Lost workers that came back.",
            ld(&m->io.workers_rejoined));
    counter(o, m, "ps_server_forged_requests_total",
            "Requests refused (PS_EPERM) because another connection holds their rank.",
            ld(&m->io.forged));
    counter(o, m, "ps_server_hellos_refused_total",
            "Hellos refused: the rank is held by another live connection.",
            ld(&m->io.hellos_refused));
    counter(o, m, "ps_server_peer_refusals_total",
            "Pulls refused to peers that leave too many replies unread.",
            ld(&m->io.peer_refused));
    counter(o, m, "ps_server_shutdowns_refused_total",
            "SHUTDOWN messages refused (no admin token or key).",
            ld(&m->io.shutdowns_refused));
    counter(o, m, "ps_server_curve_handshakes_refused_total",
            "CURVE handshakes refused (a key not in authorized/).", ld(&m->io.curve_refused));
    counter(o, m, "ps_server_undecodable_messages_total",
            "Messages dropped because they did not decode.", ld(&m->io.dropped));

    const ps_metrics_hist *h[PS_SERVER_MAX_THREADS];
    ps_metrics_family(o, "ps_server_push_apply_seconds", PS_METRIC_HISTOGRAM,
                      "From a push's receipt to the update that holds it (sync: from the "
                      "round's first push).");
    for (int i = 0; i < m->threads; i++)
        h[i] = &m->th[i].apply;
    ps_metrics_sample_hist(o, m->base, h, m->threads);
    ps_metrics_family(o, "ps_server_round_wait_seconds", PS_METRIC_HISTOGRAM,
                      "Sync mode: from a round's first push to its last, per chunk and "
                      "table partition (the wait for the slowest worker).");
    for (int i = 0; i < m->threads; i++)
        h[i] = &m->th[i].round;
    ps_metrics_sample_hist(o, m->base, h, m->threads);

    counter(o, m, "ps_server_checkpoints_total", "Checkpoints written.",
            ld(&m->io.checkpoints));
    counter(o, m, "ps_server_checkpoint_failures_total", "Checkpoint writes that failed.",
            ld(&m->io.checkpoint_failures));
    ps_metrics_family(o, "ps_server_checkpoint_write_seconds", PS_METRIC_HISTOGRAM,
                      "How long writing a checkpoint took (file, fsync, rename).");
    h[0] = &m->io.checkpoint_write;
    ps_metrics_sample_hist(o, m->base, h, 1);
    int64_t done = atomic_load_explicit(&m->io.checkpoint_done_ns, memory_order_relaxed);
    if (done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double age = (double)(ps_now_ns() - done) * 1e-9;
        gauge(o, m, "ps_server_checkpoint_last_success_timestamp_seconds",
              "When the last checkpoint was written, since the Unix epoch.",
              (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - age);
        gauge(o, m, "ps_server_checkpoint_age_seconds",
              "Seconds since the last checkpoint was written.", age);
    }

    size_t n = atomic_load_explicit(&m->ntables, memory_order_acquire);
    if (!n)
        return;
    table_family(o, m, n, PS_METRIC_GAUGE, "ps_server_table_rows", "Rows a table holds here.",
                 offsetof(ps_srv_mtable, rows));
    table_family(o, m, n, PS_METRIC_GAUGE, "ps_server_table_bytes",
                 "Memory a table's rows take here.", offsetof(ps_srv_mtable, bytes));
    table_family(o, m, n, PS_METRIC_COUNTER, "ps_server_table_pulled_rows_total",
                 "Row ids pulled from a table.", offsetof(ps_srv_mtable, pulled));
    table_family(o, m, n, PS_METRIC_COUNTER, "ps_server_table_pushed_rows_total",
                 "Gradient rows pushed to a table.", offsetof(ps_srv_mtable, pushed));
    table_family(o, m, n, PS_METRIC_COUNTER, "ps_server_table_row_updates_total",
                 "Row updates applied to a table.", offsetof(ps_srv_mtable, updated));
    table_family(o, m, n, PS_METRIC_COUNTER, "ps_server_table_evicted_rows_total",
                 "Rows a table's row cap evicted.", offsetof(ps_srv_mtable, evicted));
    table_family(o, m, n, PS_METRIC_COUNTER, "ps_server_table_filtered_total",
                 "Pulled ids the frequency filter had not admitted, and gradient rows "
                 "dropped for them.", offsetof(ps_srv_mtable, filtered));
}

/* ---- life ---- */

int ps_srv_metrics_open(const ps_server_config *c, _Atomic uint64_t *mem_used,
                        ps_srv_metrics **out, char *why, size_t why_len)
{
    *out = NULL;
    if (c->metrics_port <= 0)
        return 0;
    ps_srv_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return PS_ENOMEM;
    m->threads = c->threads;
    m->max_memory = c->max_memory;
    m->mem_used = mem_used;
    char r[16];
    snprintf(r, sizeof r, "%d", c->rank);
    ps_metrics_label(m->base, sizeof m->base, "rank", r);
    ps_metrics_label(m->base, sizeof m->base, "mode", ps_mode_name(c->mode));
    m->th = aligned_alloc(64, (size_t)c->threads * sizeof *m->th);
    if (m->th)
        memset(m->th, 0, (size_t)c->threads * sizeof *m->th);
    int rc = PS_ENOMEM;
    if (!m->th || !(m->reg = ps_metrics_create()) || ps_metrics_add(m->reg, collect, m))
        goto fail;
    if ((rc = ps_metrics_http_start(m->reg, c->metrics_bind, c->metrics_port, &m->http, why,
                                    why_len)))
        goto fail;
    *out = m;
    return 0;
fail:
    if (rc == PS_ENOMEM)
        ps_errorf(why, why_len, "out of memory for the metrics");
    ps_metrics_destroy(m->reg);
    free(m->th);
    free(m);
    return rc;
}

const char *ps_srv_metrics_url(const ps_srv_metrics *m) { return ps_metrics_http_url(m->http); }

ps_metrics *ps_srv_metrics_registry(ps_srv_metrics *m) { return m ? m->reg : NULL; }

void ps_srv_metrics_close(ps_srv_metrics *m)
{
    if (!m)
        return;
    ps_metrics_http_stop(m->http);
    ps_metrics_destroy(m->reg);
    free(m->th);
    free(m);
}
