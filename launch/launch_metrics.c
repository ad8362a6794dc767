#include "launch_metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_error.h"
#include "ps_metrics.h"
#include "ps_metrics_http.h"

#define P "ps_launch"

struct ps_launch_metrics {
    ps_metrics *reg;
    ps_metrics_http *http;
    const ps_launch_counts *counts;
    int planned[2];
};

static void collect(void *user, ps_metrics_out *o)
{
    const ps_launch_metrics *m = user;
    static const char *const lab[2] = {"role=\"server\"", "role=\"worker\""};
    ps_metrics_family(o, "ps_launch_processes", PS_METRIC_GAUGE,
                      "Processes of the plan, by role.");
    for (int r = 0; r < 2; r++)
        ps_metrics_sample(o, lab[r], m->planned[r]);
    uint64_t started[2], ok[2], failed[2];
    for (int r = 0; r < 2; r++) {
        started[r] = atomic_load_explicit(&m->counts->started[r], memory_order_relaxed);
        ok[r] = atomic_load_explicit(&m->counts->exited_ok[r], memory_order_relaxed);
        failed[r] = atomic_load_explicit(&m->counts->failed[r], memory_order_relaxed);
    }
    ps_metrics_family(o, "ps_launch_running_processes", PS_METRIC_GAUGE,
                      "Processes started and not ended yet, by role.");
    for (int r = 0; r < 2; r++)
        ps_metrics_sample(o, lab[r], (double)(started[r] - ok[r] - failed[r]));
    ps_metrics_family(o, "ps_launch_started_processes_total", PS_METRIC_COUNTER,
                      "Processes started, by role.");
    for (int r = 0; r < 2; r++)
        ps_metrics_sample_u64(o, lab[r], started[r]);
    ps_metrics_family(o, "ps_launch_exited_processes_total", PS_METRIC_COUNTER,
                      "Processes that ended, by role and result (ok: exit status 0).");
    char l[64];
    for (int r = 0; r < 2; r++) {
        snprintf(l, sizeof l, "%s,result=\"ok\"", lab[r]);
        ps_metrics_sample_u64(o, l, ok[r]);
        snprintf(l, sizeof l, "%s,result=\"failed\"", lab[r]);
        ps_metrics_sample_u64(o, l, failed[r]);
    }
}

int ps_launch_metrics_open(const ps_launch_plan *plan, const ps_launch_counts *counts,
                           const char *bind, int port, ps_launch_metrics **out, char *why,
                           size_t len)
{
    *out = NULL;
    ps_launch_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return PS_ENOMEM;
    m->counts = counts;
    m->planned[PS_LAUNCH_SERVER] = plan->num_servers;
    m->planned[PS_LAUNCH_WORKER] = plan->num_workers;
    int rc = PS_ENOMEM;
    if ((m->reg = ps_metrics_create()) && !ps_metrics_add(m->reg, collect, m))
        rc = ps_metrics_http_start(m->reg, bind, port, &m->http, why, len);
    if (rc) {
        if (rc == PS_ENOMEM)
            snprintf(why, len, P ": out of memory");
        ps_metrics_destroy(m->reg);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

const char *ps_launch_metrics_url(const ps_launch_metrics *m)
{
    return ps_metrics_http_url(m->http);
}

void ps_launch_metrics_close(ps_launch_metrics *m)
{
    if (!m)
        return;
    ps_metrics_http_stop(m->http);
    ps_metrics_destroy(m->reg);
    free(m);
}

const char *ps_launch_metrics_target(const ps_launch_plan *plan, int i, int port,
                                     const char *bind, char *buf, size_t len)
{
    const char *host = i >= 0 ? plan->cmds[i].host : NULL;
    if (host) {
        const char *at = strchr(host, '@');
        host = at ? at + 1 : host;
    } else if (!bind || !*bind || !strcmp(bind, "0.0.0.0") || !strcmp(bind, "::")) {
        host = "127.0.0.1";
    } else {
        host = bind;
    }
    int v6 = strchr(host, ':') != NULL;
    snprintf(buf, len, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
    return buf;
}

/* Write text to path through path.tmp and a rename. */
static int write_atomic(const char *path, const char *text, const char *what, char *why,
                        size_t len)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f))
        ok = 0;
    if (!ok || rename(tmp, path)) {
        snprintf(why, len, P ": %s %s: cannot write it: %s", what, path, strerror(errno));
        if (f)
            unlink(tmp);
        return PS_EIO;
    }
    return 0;
}

int ps_launch_write_job(const char *path, const ps_launch_plan *plan, const char *curve_dir,
                        int launch_port, const char *bind, char *why, size_t len)
{
    ps_strbuf b = {0};
    char t[300];
    ps_strbuf_add(&b, "# ps_launch job: role rank endpoint metrics (ps_top --job reads it)\n"
                      "servers ");
    for (int i = 0; i < plan->num_servers; i++)
        ps_strbuf_addf(&b, "%s%s", i ? "," : "", plan->cmds[i].endpoint);
    ps_strbuf_add(&b, "\n");
    if (curve_dir)
        ps_strbuf_addf(&b, "curve-keys %s\n", curve_dir);
    if (launch_port)
        ps_strbuf_addf(&b, "launch - - %s\n",
                       ps_launch_metrics_target(plan, -1, launch_port, bind, t, sizeof t));
    for (int i = 0; i < plan->n; i++) {
        const ps_launch_cmd *c = &plan->cmds[i];
        ps_strbuf_addf(&b, "%s %d %s %s\n", ps_launch_role_name(c->role), c->rank,
                       c->role == PS_LAUNCH_SERVER ? c->endpoint : "-",
                       c->metrics_port ? ps_launch_metrics_target(plan, i, c->metrics_port,
                                                                  bind, t, sizeof t)
                                       : "-");
    }
    int rc = b.failed ? PS_ENOMEM : write_atomic(path, ps_strbuf_str(&b), "--job-file", why, len);
    ps_strbuf_free(&b);
    return rc;
}

int ps_launch_write_targets(const char *path, const ps_launch_plan *plan, const char *job,
                            int launch_port, const char *bind, char *why, size_t len)
{
    ps_strbuf b = {0};
    char t[300];
    ps_strbuf_add(&b, "[\n");
    if (launch_port)
        ps_strbuf_addf(&b, "  {\"targets\": [\"%s\"], \"labels\": {\"ps_job\": \"%s\", "
                           "\"role\": \"launch\"}}",
                       ps_launch_metrics_target(plan, -1, launch_port, bind, t, sizeof t), job);
    int first = !launch_port;
    for (int i = 0; i < plan->n; i++) {
        const ps_launch_cmd *c = &plan->cmds[i];
        if (!c->metrics_port)
            continue;
        ps_strbuf_addf(&b, "%s  {\"targets\": [\"%s\"], \"labels\": {\"ps_job\": \"%s\", "
                           "\"role\": \"%s\", \"ps_rank\": \"%d\"}}",
                       first ? "" : ",\n",
                       ps_launch_metrics_target(plan, i, c->metrics_port, bind, t, sizeof t),
                       job, ps_launch_role_name(c->role), c->rank);
        first = 0;
    }
    ps_strbuf_add(&b, "\n]\n");
    int rc = b.failed ? PS_ENOMEM
                      : write_atomic(path, ps_strbuf_str(&b), "--metrics-targets", why, len);
    ps_strbuf_free(&b);
    return rc;
}
