#include "top_view.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PS_TOP_NAME_(id, name) name,
const char *const ps_top_metric_names[PS_TOP_NM] = {PS_TOP_METRICS(PS_TOP_NAME_)};
#undef PS_TOP_NAME_

void ps_top_push_sample(ps_top_proc *p, const ps_top_sample *s)
{
    p->prev = p->cur;
    p->cur = *s;
    if (p->nsamples < 2)
        p->nsamples++;
}

/* The rate of a counter between the two samples; -1 when there is none. */
static double rate(const ps_top_proc *p, double now, double before)
{
    double dt = p->cur.t - p->prev.t;
    if (p->nsamples < 2 || dt <= 0 || now < before)
        return -1;
    return (now - before) / dt;
}

static double stat_rate(const ps_top_proc *p, size_t off)
{
    if (!p->cur.stats_ok || !p->prev.stats_ok)
        return -1;
    uint64_t a = *(const uint64_t *)((const char *)&p->cur.st + off);
    uint64_t b = *(const uint64_t *)((const char *)&p->prev.st + off);
    return rate(p, (double)a, (double)b);
}

static double metric_rate(const ps_top_proc *p, int k)
{
    if (!p->cur.metrics_ok || !p->prev.metrics_ok || !p->cur.has[k] || !p->prev.has[k])
        return -1;
    return rate(p, p->cur.m[k], p->prev.m[k]);
}

/* What a line is sorted by: updates/s of a server, samples/s of a worker. */
static double speed(const ps_top_proc *p)
{
    if (p->role == PS_TOP_SERVER) {
        double r = stat_rate(p, offsetof(ps_stats, updates));
        return r >= 0 ? r : metric_rate(p, PS_TOP_M_upd);
    }
    return metric_rate(p, PS_TOP_M_samples);
}

static int slowest_first(const void *a, const void *b)
{
    const ps_top_proc *x = *(const ps_top_proc *const *)a, *y = *(const ps_top_proc *const *)b;
    int ex = x->err[0] != 0, ey = y->err[0] != 0;
    if (ex != ey)
        return ey - ex; /* what did not answer first */
    double sx = speed(x), sy = speed(y);
    if (sx != sy)
        return sx < sy ? -1 : 1;
    return x->rank - y->rank;
}

/* A number in a column of width w: "-" when not known. */
static void col(ps_strbuf *o, int w, double v, const char *fmt)
{
    if (v < 0)
        ps_strbuf_addf(o, " %*s", w, "-");
    else
        ps_strbuf_addf(o, fmt, w, v);
}

static void bytes_col(ps_strbuf *o, int w, double v)
{
    static const char *const u[] = {"B", "K", "M", "G", "T"};
    int k = 0;
    while (v >= 1024 && k < 4) {
        v /= 1024;
        k++;
    }
    char t[32];
    snprintf(t, sizeof t, k ? "%.1f%s" : "%.0f%s", v, u[k]);
    ps_strbuf_addf(o, " %*s", w, t);
}

static void server_line(const ps_top_proc *p, ps_strbuf *o)
{
    char rk[16];
    snprintf(rk, sizeof rk, p->rank >= 0 ? "%d" : "?", p->rank);
    ps_strbuf_addf(o, "server %-4s %-22.22s", rk, p->endpoint[0] ? p->endpoint : p->target);
    if (p->err[0]) {
        ps_strbuf_addf(o, " no answer: %s\n", p->err);
        return;
    }
    col(o, 8, speed(p), " %*.0f");
    col(o, 8, stat_rate(p, offsetof(ps_stats, pushes)), " %*.0f");
    col(o, 8, stat_rate(p, offsetof(ps_stats, pulls)), " %*.0f");
    double in = stat_rate(p, offsetof(ps_stats, bytes_in));
    double out = stat_rate(p, offsetof(ps_stats, bytes_out));
    col(o, 8, in < 0 ? -1 : in / 1048576.0, " %*.1f");
    col(o, 8, out < 0 ? -1 : out / 1048576.0, " %*.1f");
    col(o, 9, p->cur.stats_ok ? (double)p->cur.st.rows : -1, " %*.0f");
    const ps_top_sample *c = &p->cur;
    if (c->metrics_ok && c->has[PS_TOP_M_mem] && c->has[PS_TOP_M_maxmem] &&
        c->m[PS_TOP_M_maxmem] > 0) {
        bytes_col(o, 7, c->m[PS_TOP_M_mem]);
        ps_strbuf_addf(o, " %4.0f%%", 100.0 * c->m[PS_TOP_M_mem] / c->m[PS_TOP_M_maxmem]);
    } else {
        ps_strbuf_addf(o, " %7s %5s", "-", "-");
    }
    col(o, 6, c->stats_ok ? (double)c->st.dup_dropped : -1, " %*.0f");
    col(o, 7, c->stats_ok ? (double)c->st.errors : -1, " %*.0f");
    double dn = metric_rate(p, PS_TOP_M_round_n), ds = metric_rate(p, PS_TOP_M_round_sum);
    col(o, 8, dn > 0 && ds >= 0 ? 1000.0 * ds / dn : -1, " %*.2f");
    col(o, 7, c->metrics_ok && c->has[PS_TOP_M_ckpt_age] ? c->m[PS_TOP_M_ckpt_age] : -1,
        " %*.0f");
    ps_strbuf_add(o, "\n");
}

static void worker_line(const ps_top_proc *p, ps_strbuf *o)
{
    char rk[16];
    snprintf(rk, sizeof rk, p->rank >= 0 ? "%d" : "?", p->rank);
    ps_strbuf_addf(o, "worker %-4s %-22.22s", rk, p->target);
    if (p->err[0]) {
        ps_strbuf_addf(o, " no answer: %s\n", p->err);
        return;
    }
    const ps_top_sample *c = &p->cur;
    col(o, 10, speed(p), " %*.0f");
    col(o, 8, metric_rate(p, PS_TOP_M_steps), " %*.1f");
    double w = metric_rate(p, PS_TOP_M_wait);
    col(o, 10, w < 0 ? -1 : 100.0 * w, " %*.1f");
    col(o, 9, c->metrics_ok && c->has[PS_TOP_M_stale] ? c->m[PS_TOP_M_stale] : -1, " %*.0f");
    col(o, 10, c->metrics_ok && c->has[PS_TOP_M_steps] ? c->m[PS_TOP_M_steps] : -1, " %*.0f");
    ps_strbuf_add(o, "\n");
}

void ps_top_render(const ps_top_proc *p, int n, const char *title, ps_strbuf *out)
{
    const ps_top_proc **v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) {
        out->failed = 1;
        return;
    }
    ps_strbuf_addf(out, "%s\n", title);
    for (int role = PS_TOP_SERVER; role <= PS_TOP_WORKER; role++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (p[i].role == role)
                v[k++] = &p[i];
        qsort(v, (size_t)k, sizeof *v, slowest_first);
        if (role == PS_TOP_SERVER)
            ps_strbuf_addf(out, "\n%-11s %-22s %8s %8s %8s %8s %8s %9s %7s %5s %6s %7s %8s %7s\n",
                           "SERVER", "ENDPOINT", "UPD/S", "PUSH/S", "PULL/S", "IN MB/S",
                           "OUT MB/S", "ROWS", "MEM", "MEM%", "DUP", "REFUSED", "ROUND MS",
                           "CKPT S");
        else
            ps_strbuf_addf(out, "\n%-11s %-22s %10s %8s %10s %9s %10s\n", "WORKER", "METRICS",
                           "SAMPLES/S", "STEPS/S", "COMM-WAIT%", "STALENESS", "STEPS");
        for (int i = 0; i < k; i++)
            (role == PS_TOP_SERVER ? server_line : worker_line)(v[i], out);
        if (!k)
            ps_strbuf_add(out, role == PS_TOP_SERVER
                                   ? "(no servers)\n"
                                   : "(no worker /metrics known: give --job or --metrics)\n");
    }
    free(v);
}
