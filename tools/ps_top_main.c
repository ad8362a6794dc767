/* ps_top: a live terminal view of a running job (docs/OPERATIONS.md
 * "ps_top"): a line per server (its STATS counters, and its /metrics when
 * known) and per worker (its /metrics), refreshed every --interval, slowest
 * first; q quits.  --once prints one table and exits.  The figures come
 * from top_source.c, the table from top_view.c; this file is flags, the job
 * file and the terminal. */
#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_settings.h"
#include "ps_time.h"
#include "top_source.h"
#include "top_view.h"

#define P "ps_top"
#define MAX_PROCS 4096

static const char usage_head[] =
    "usage: ps_top (--job FILE | --servers LIST [--metrics LIST]) [--once]\n"
    "\n"
    "A live view of a running job: a line per server and per worker, refreshed\n"
    "every second, the slowest first; q quits.  Servers answer STATS requests (any\n"
    "key they accept may ask, over CURVE too); workers are read from their /metrics\n"
    "(ps_worker --metrics-port; ps_launch gives every process one and writes them\n"
    "all to --job-file).\n"
    "\n"
    "flags (--flag VALUE or --flag=VALUE):\n";

static const char usage_tail[] =
    "\n"
    "Exit status: 0 done (q, a signal, or --once printed its table); 1 nothing\n"
    "answered (--once) or the terminal failed; 2 bad flags.\n"
    "\n"
    "examples:\n"
    "  ps_launch --servers 2 --workers 4 --job-file job.txt -- --model cnn &\n"
    "  ps_top --job job.txt\n"
    "  ps_top --servers tcp://host1:29500,tcp://host1:29501 --curve-keys keys --key top\n";

/* ps_top's settings (the TOP rows of common/ps_settings.h). */
typedef struct ps_top_opts {
    const char *servers, *job, *metrics, *curve_dir, *key;
    int interval_ms, timeout_ms;
    int once;
} ps_top_opts;

static const ps_setting_field fields[] = {PS_SETTING_FIELDS(TOP)};

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

typedef struct top {
    ps_top_opts o;
    ps_top_proc *p;
    ps_top_conn **conn; /* per process: a server's STATS connection, or NULL */
    int n;
    void *zctx;
    char curve_dir[1024];
    char *job_servers; /* the job file's server list */
    ps_strbuf page;
} top;

static ps_top_proc *add_proc(top *t, int role, int rank)
{
    if (t->n == MAX_PROCS)
        return NULL;
    ps_top_proc *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    p->role = role;
    p->rank = rank;
    return p;
}

static ps_top_proc *find_server(top *t, int rank)
{
    for (int i = 0; i < t->n; i++)
        if (t->p[i].role == PS_TOP_SERVER && t->p[i].rank == rank)
            return &t->p[i];
    return NULL;
}

/* The job file of ps_launch --job-file (launch/launch_metrics.h). */
static int read_job(top *t, const char *path, char *why, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, len, P ": --job %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    char line[8192], role[16], a[4096], b[256], c[256];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        int k = sscanf(line, "%15s %4095s %255s %255s", role, a, b, c);
        if (!strcmp(role, "servers") && k >= 2) {
            if (!t->o.servers && !(t->o.servers = t->job_servers = strdup(a)))
                rc = PS_ENOMEM;
        } else if (!strcmp(role, "curve-keys") && k >= 2) {
            if (!t->o.curve_dir)
                snprintf(t->curve_dir, sizeof t->curve_dir, "%.1023s", a);
        } else if (!strcmp(role, "launch")) {
            /* ps_launch's own page: nothing a line shows */
        } else if ((!strcmp(role, "server") || !strcmp(role, "worker")) && k == 4) {
            int r = atoi(a), srv = role[0] == 's';
            ps_top_proc *p = srv ? find_server(t, r) : NULL;
            if (!p && !(p = add_proc(t, srv ? PS_TOP_SERVER : PS_TOP_WORKER, r))) {
                rc = PS_ETOOBIG;
                break;
            }
            if (srv && strcmp(b, "-"))
                snprintf(p->endpoint, sizeof p->endpoint, "%s", b);
            if (strcmp(c, "-"))
                snprintf(p->target, sizeof p->target, "%s", c);
        } else {
            snprintf(why, len, P ": --job %s line %d: not a line of ps_launch --job-file: %.80s",
                     path, lineno, line);
            rc = PS_EINVAL;
        }
    }
    fclose(f);
    if (rc == PS_ENOMEM || rc == PS_ETOOBIG)
        snprintf(why, len, P ": --job %s: more than %d processes, or out of memory", path,
                 MAX_PROCS);
    return rc;
}

/* The processes to watch: the job file's, --servers', --metrics'. */
static int gather(top *t, char *why, size_t len)
{
    if (t->o.job) {
        int rc = read_job(t, t->o.job, why, len);
        if (rc)
            return rc;
    }
    if (t->o.curve_dir)
        snprintf(t->curve_dir, sizeof t->curve_dir, "%s", t->o.curve_dir);
    char *list = t->o.servers ? strdup(t->o.servers) : NULL, *save = NULL;
    int r = 0;
    for (char *e = list ? strtok_r(list, ",", &save) : NULL; e; e = strtok_r(NULL, ",", &save)) {
        ps_top_proc *p = find_server(t, r);
        if (!p && !(p = add_proc(t, PS_TOP_SERVER, r)))
            break;
        snprintf(p->endpoint, sizeof p->endpoint, "%s", e);
        r++;
    }
    free(list);
    list = t->o.metrics ? strdup(t->o.metrics) : NULL;
    for (char *e = list ? strtok_r(list, ",", &save) : NULL; e; e = strtok_r(NULL, ",", &save)) {
        ps_top_proc *p = add_proc(t, PS_TOP_WORKER, -1); /* the page says what it is */
        if (!p)
            break;
        snprintf(p->target, sizeof p->target, "%s", e);
    }
    free(list);
    if (t->n == 0) {
        snprintf(why, len, P ": nothing to watch: give --job FILE (ps_launch --job-file), or "
                 "--servers LIST and --metrics LIST");
        return PS_EINVAL;
    }
    return 0;
}

/* A --metrics page's process: a server's page names its rank; it joins
 * that server's line when there is one. */
static void settle_role(top *t, int i)
{
    ps_top_proc *p = &t->p[i];
    const char *page = ps_strbuf_str(&t->page);
    char rank[32];
    int srv = strstr(page, "\nps_server_") != NULL;
    ps_top_metric_label(page, srv ? "ps_server_updates_total" : "ps_worker_steps_total", "rank",
                        rank, sizeof rank);
    p->rank = *rank ? atoi(rank) : -1;
    if (!srv)
        return;
    p->role = PS_TOP_SERVER;
    ps_top_proc *s = find_server(t, p->rank);
    if (s && s != p && !s->target[0]) { /* the server's line reads this page from now on */
        snprintf(s->target, sizeof s->target, "%s", p->target);
        p->target[0] = 0;
        p->role = -1; /* no line */
    }
}

static void sample_one(top *t, int i)
{
    ps_top_proc *p = &t->p[i];
    ps_top_sample s;
    memset(&s, 0, sizeof s);
    char why[sizeof p->err] = "";
    p->err[0] = 0;
    if (t->conn[i]) {
        int rc = ps_top_conn_stats(t->conn[i], t->o.timeout_ms, &s.st, why, sizeof why);
        s.stats_ok = rc == 0;
        if (rc)
            snprintf(p->err, sizeof p->err, "%s", why);
    }
    if (p->target[0]) {
        if (ps_top_scrape(p->target, t->o.timeout_ms, &t->page, why, sizeof why) == 0) {
            if (p->rank < 0 && p->role == PS_TOP_WORKER)
                settle_role(t, i);
            const char *page = ps_strbuf_str(&t->page);
            for (int k = 0; k < PS_TOP_NM; k++) {
                int found;
                s.m[k] = ps_top_metric(page, ps_top_metric_names[k], &found);
                s.has[k] = found > 0;
            }
            s.metrics_ok = 1;
        } else if (!t->conn[i] || !s.stats_ok) {
            snprintf(p->err, sizeof p->err, "%s", why);
        }
    }
    s.t = ps_now_s();
    ps_top_push_sample(p, &s);
}

static void sample_all(top *t)
{
    for (int i = 0; i < t->n && !g_stop; i++)
        if (t->p[i].role >= 0)
            sample_one(t, i);
}

static void render(top *t, int refresh, ps_strbuf *out)
{
    int ns = 0, nw = 0;
    for (int i = 0; i < t->n; i++) {
        ns += t->p[i].role == PS_TOP_SERVER;
        nw += t->p[i].role == PS_TOP_WORKER;
    }
    char title[256], when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%H:%M:%S", localtime(&now));
    snprintf(title, sizeof title, "ps_top %s  %d servers, %d workers  refresh %d every %.1f s%s",
             when, ns, nw, refresh, t->o.interval_ms / 1000.0,
             t->o.once ? "" : "  (q quits)");
    ps_top_render(t->p, t->n, title, out);
}

/* Wait up to ms for the interval to pass; 1 when q (or a signal) says stop. */
static int wait_key(int ms, int tty)
{
    int64_t end = ps_now_ns() + (int64_t)ms * 1000000;
    while (!g_stop) {
        int64_t left = (end - ps_now_ns()) / 1000000;
        if (left <= 0)
            return 0;
        struct pollfd pf = {STDIN_FILENO, POLLIN, 0};
        int r = poll(&pf, tty ? 1 : 0, (int)left);
        if (r > 0 && (pf.revents & POLLIN)) {
            char ch;
            ssize_t n = read(STDIN_FILENO, &ch, 1);
            if (n == 1 && (ch == 'q' || ch == 'Q'))
                return 1;
            if (n == 0)
                tty = 0; /* input ended: go on until a signal */
        }
    }
    return 1;
}

static int live(top *t)
{
    int tty = isatty(STDIN_FILENO);
    struct termios old, raw;
    if (tty && tcgetattr(STDIN_FILENO, &old) == 0) {
        raw = old;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    } else {
        tty = 0;
    }
    ps_strbuf out = {0};
    int rc = 0;
    for (int refresh = 1; !g_stop; refresh++) {
        int64_t t0 = ps_now_ns();
        sample_all(t);
        ps_strbuf_reset(&out);
        ps_strbuf_add(&out, "\033[H\033[2J"); /* home, clear */
        render(t, refresh, &out);
        if (fputs(ps_strbuf_str(&out), stdout) < 0 || fflush(stdout)) {
            rc = 1;
            break;
        }
        int spent = (int)((ps_now_ns() - t0) / 1000000);
        if (wait_key(t->o.interval_ms > spent ? t->o.interval_ms - spent : 0, tty))
            break;
    }
    if (tty)
        tcsetattr(STDIN_FILENO, TCSANOW, &old);
    ps_strbuf_free(&out);
    return rc;
}

static int once(top *t)
{
    sample_all(t);
    wait_key(t->o.interval_ms, 0);
    sample_all(t);
    ps_strbuf out = {0};
    render(t, 2, &out);
    fputs(ps_strbuf_str(&out), stdout);
    ps_strbuf_free(&out);
    int answered = 0;
    for (int i = 0; i < t->n; i++)
        answered += t->p[i].role >= 0 && !t->p[i].err[0];
    return answered ? 0 : 1;
}

int main(int argc, char **argv)
{
    top t;
    memset(&t, 0, sizeof t);
    char why[1024];
    ps_settings_cmd cmd = {.prog = P, .program = PS_PROG_TOP, .cfg = &t.o, .fields = fields,
                           .nfields = (int)(sizeof fields / sizeof fields[0])};
    ps_settings_defaults(PS_PROG_TOP, fields, cmd.nfields, &t.o);
    if (ps_settings_parse(&cmd, argc, argv, why, sizeof why))
        return ps_flag_error(why);
    if (cmd.help) {
        ps_settings_print_help(P, PS_PROG_TOP, cmd.help, usage_head, usage_tail);
        return 0;
    }
    t.p = calloc(MAX_PROCS, sizeof *t.p);
    t.conn = calloc(MAX_PROCS, sizeof *t.conn);
    if (!t.p || !t.conn) {
        fprintf(stderr, P ": out of memory\n");
        return 1;
    }
    int rc = gather(&t, why, sizeof why);
    if (rc)
        return rc == PS_EINVAL ? ps_flag_error(why) : (fprintf(stderr, "%s\n", why), 1);
    t.zctx = zmq_ctx_new();
    for (int i = 0; i < t.n; i++) {
        if (t.p[i].role != PS_TOP_SERVER || !t.p[i].endpoint[0])
            continue;
        if (ps_top_conn_open(t.zctx, t.p[i].endpoint, t.p[i].rank,
                             t.curve_dir[0] ? t.curve_dir : NULL, t.o.key, &t.conn[i], why,
                             sizeof why)) {
            fprintf(stderr, P ": server %d: %s\n", t.p[i].rank, why);
            return 2;
        }
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = t.o.once ? once(&t) : live(&t);
    for (int i = 0; i < t.n; i++)
        ps_top_conn_close(t.conn[i]);
    zmq_ctx_term(t.zctx);
    curl_global_cleanup();
    ps_strbuf_free(&t.page);
    free(t.job_servers);
    free(t.p);
    free(t.conn);
    return rc;
}
