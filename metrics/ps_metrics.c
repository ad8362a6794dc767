#include "ps_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ps_error.h"

struct ps_metrics_out {
    ps_strbuf *b;
    char family[128]; /* the family samples go to */
};

typedef struct collector {
    ps_metrics_collect_fn fn;
    void *user;
} collector;

struct ps_metrics {
    pthread_mutex_t mu; /* the collectors; held by a render (never by code that counts) */
    collector *c;
    size_t n, cap;
    double start_s;     /* when the process made its registry (process_start_time_seconds) */
};

/* ---- histograms ---- */

#define BOUND_NS_(s) (int64_t)((s) * 1e9 + 0.5),
static const int64_t bound_ns[PS_METRICS_BUCKETS - 1] = {PS_METRICS_BOUNDS(BOUND_NS_)};
#undef BOUND_NS_
#define BOUND_TXT_(s) #s,
static const char *const bound_txt[PS_METRICS_BUCKETS - 1] = {PS_METRICS_BOUNDS(BOUND_TXT_)};
#undef BOUND_TXT_

void ps_metrics_hist_observe(ps_metrics_hist *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    int i = 0;
    while (i < PS_METRICS_BUCKETS - 1 && ns > bound_ns[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)ns, memory_order_relaxed);
}

/* ---- the exposition ---- */

/* A value as the format reads it: Go's float syntax, +Inf, -Inf, NaN. */
static void add_value(ps_strbuf *b, double v)
{
    if (isnan(v))
        ps_strbuf_add(b, "NaN");
    else if (isinf(v))
        ps_strbuf_add(b, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 1e15)
        ps_strbuf_addf(b, "%.0f", v);
    else
        ps_strbuf_addf(b, "%.15g", v);
}

/* # HELP text escapes backslash and newline only. */
static void add_help(ps_strbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            ps_strbuf_add(b, "\\\\");
        else if (*s == '\n')
            ps_strbuf_add(b, "\\n");
        else
            ps_strbuf_addn(b, s, 1);
    }
}

void ps_metrics_family(ps_metrics_out *o, const char *name, int type, const char *help)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    snprintf(o->family, sizeof o->family, "%s", name);
    ps_strbuf_addf(o->b, "# HELP %s ", name);
    add_help(o->b, help);
    ps_strbuf_addf(o->b, "\n# TYPE %s %s\n", name, types[type]);
}

static void add_name(ps_metrics_out *o, const char *suffix, const char *labels,
                     const char *extra)
{
    ps_strbuf_addf(o->b, "%s%s", o->family, suffix);
    int have = labels && *labels, more = extra && *extra;
    if (have || more)
        ps_strbuf_addf(o->b, "{%s%s%s}", have ? labels : "", have && more ? "," : "",
                       more ? extra : "");
    ps_strbuf_add(o->b, " ");
}

void ps_metrics_sample(ps_metrics_out *o, const char *labels, double v)
{
    add_name(o, "", labels, NULL);
    add_value(o->b, v);
    ps_strbuf_add(o->b, "\n");
}

void ps_metrics_sample_u64(ps_metrics_out *o, const char *labels, uint64_t v)
{
    add_name(o, "", labels, NULL);
    ps_strbuf_addf(o->b, "%llu\n", (unsigned long long)v);
}

void ps_metrics_sample_hist(ps_metrics_out *o, const char *labels,
                            const ps_metrics_hist *const *h, int n)
{
    uint64_t cum = 0, sum_ns = 0;
    char le[48];
    for (int b = 0; b < PS_METRICS_BUCKETS; b++) {
        for (int i = 0; i < n; i++)
            cum += atomic_load_explicit(&h[i]->bucket[b], memory_order_relaxed);
        snprintf(le, sizeof le, "le=\"%s\"", b < PS_METRICS_BUCKETS - 1 ? bound_txt[b] : "+Inf");
        add_name(o, "_bucket", labels, le);
        ps_strbuf_addf(o->b, "%llu\n", (unsigned long long)cum);
    }
    for (int i = 0; i < n; i++)
        sum_ns += atomic_load_explicit(&h[i]->sum_ns, memory_order_relaxed);
    add_name(o, "_sum", labels, NULL);
    add_value(o->b, (double)sum_ns * 1e-9);
    ps_strbuf_add(o->b, "\n");
    add_name(o, "_count", labels, NULL);
    ps_strbuf_addf(o->b, "%llu\n", (unsigned long long)cum);
}

char *ps_metrics_label(char *buf, size_t cap, const char *name, const char *value)
{
    size_t n0 = strlen(buf), n = n0;
    int ok = 1;
#define PUT_(c)                 \
    do {                        \
        if (n + 1 >= cap)       \
            ok = 0;             \
        else                    \
            buf[n++] = (c);     \
    } while (0)
    if (n)
        PUT_(',');
    for (const char *p = name; *p; p++)
        PUT_(*p);
    PUT_('=');
    PUT_('"');
    for (const char *p = value; *p; p++) {
        if (*p == '\\' || *p == '"') {
            PUT_('\\');
            PUT_(*p);
        } else if (*p == '\n') {
            PUT_('\\');
            PUT_('n');
        } else {
            PUT_(*p);
        }
    }
    PUT_('"');
#undef PUT_
    buf[ok ? n : n0] = 0;
    return buf;
}

/* ---- the registry ---- */

static void process_families(void *user, ps_metrics_out *o)
{
    ps_metrics *m = user;
    ps_metrics_family(o, "process_start_time_seconds", PS_METRIC_GAUGE,
                      "Start time of the process since the Unix epoch, in seconds.");
    ps_metrics_sample(o, "", m->start_s);
    ps_metrics_family(o, "ps_build_info", PS_METRIC_GAUGE,
                      "The ps version this process runs (value 1).");
#ifdef PS_VERSION
    ps_metrics_sample(o, "version=\"" PS_VERSION "\"", 1);
#else
    ps_metrics_sample(o, "version=\"unknown\"", 1);
#endif
}

ps_metrics *ps_metrics_create(void)
{
    ps_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    pthread_mutex_init(&m->mu, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->start_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (ps_metrics_add(m, process_families, m)) {
        ps_metrics_destroy(m);
        return NULL;
    }
    return m;
}

int ps_metrics_add(ps_metrics *m, ps_metrics_collect_fn fn, void *user)
{
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 8;
        collector *c = realloc(m->c, cap * sizeof *c);
        if (!c)
            rc = PS_ENOMEM;
        else {
            m->c = c;
            m->cap = cap;
        }
    }
    if (!rc)
        m->c[m->n++] = (collector){fn, user};
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void ps_metrics_remove(ps_metrics *m, void *user)
{
    pthread_mutex_lock(&m->mu);
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->c[i].user != user)
            m->c[k++] = m->c[i];
    m->n = k;
    pthread_mutex_unlock(&m->mu);
}

int ps_metrics_render(ps_metrics *m, ps_strbuf *out)
{
    ps_metrics_out o = {out, ""};
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++)
        m->c[i].fn(m->c[i].user, &o);
    pthread_mutex_unlock(&m->mu);
    return out->failed ? PS_ENOMEM : 0;
}

void ps_metrics_destroy(ps_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m->c);
    free(m);
}
