/* ps_launch: start S ps_server and W ps_worker processes on this host (or on
 * the hosts of a hostfile, over ssh), print every line they write prefixed
 * with role and rank, forward SIGINT/SIGTERM to them, and stop them all as
 * soon as one fails.
 *
 * The program has two halves:
 *  - the plan (plan_build): who runs where with which argv and environment.
 *    It starts nothing and opens nothing, so `--dry-run` prints exactly what
 *    would run, and the hostfile case can be checked without ssh peers;
 *  - the supervisor (supervise): fork/exec with pipes, one poll loop over the
 *    children's output and a self-pipe fed by the signal handlers. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "ps_flags.h"

#define P "ps_launch"
#define MAX_SERVERS 256
#define MAX_WORKERS 1024
#define STOP_GRACE_MS 5000  /* SIGTERM -> SIGKILL */
#define KILL_GRACE_MS 5000  /* SIGKILL -> give up waiting */
#define DRAIN_MS 1000       /* after the last exit, wait this long for pipe EOFs */
#define MAX_LINE 65536      /* a longer line is cut and printed in pieces */

enum { ROLE_SERVER = 0, ROLE_WORKER = 1 };
static const char *const role_name[] = {"server", "worker"};

/* ------------------------------------------------------------------ memory */

static void oom(void)
{
    static const char msg[] = P ": out of memory\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
    }
    exit(1);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        oom();
    return p;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        oom();
    return d;
}

/* Growable string. */
typedef struct {
    char *p;
    size_t n, cap;
} strbuf;

static void sb_addn(strbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_add(strbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_addf(strbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        sb_addn(b, tmp, (size_t)n);
        return;
    }
    char *big = xrealloc(NULL, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_addn(b, big, (size_t)n);
    free(big);
}

/* Growable NULL-terminated vector of owned strings (an argv). */
typedef struct {
    char **v;
    int n, cap;
} strvec;

static void sv_push(strvec *s, const char *str)
{
    if (s->n + 2 > s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v = xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = xstrdup(str);
    s->v[s->n] = NULL;
}

__attribute__((format(printf, 2, 3))) static void sv_pushf(strvec *s, const char *fmt, ...)
{
    char tmp[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sv_push(s, tmp);
}

static void sv_free(strvec *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

/* ------------------------------------------------------------------ quoting */

static int shell_safe(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-",
                    *s))
            return 0;
    return 1;
}

/* Quote for a POSIX shell: bare when safe, else '...' with ' as '\''. */
static void sh_quote(strbuf *b, const char *s)
{
    if (shell_safe(s)) {
        sb_add(b, s);
        return;
    }
    sb_add(b, "'");
    for (; *s; s++) {
        if (*s == '\'')
            sb_add(b, "'\\''");
        else
            sb_addn(b, s, 1);
    }
    sb_add(b, "'");
}

/* Quote inside the command string ssh hands to the remote shell.  Double
 * quotes where they suffice, so the whole command still reads well when it is
 * itself printed in single quotes (the `*` of a bind address must not be
 * globbed). */
static void remote_quote(strbuf *b, const char *s)
{
    if (shell_safe(s)) {
        sb_add(b, s);
    } else if (!strpbrk(s, "\"$`\\!")) {
        sb_add(b, "\"");
        sb_add(b, s);
        sb_add(b, "\"");
    } else {
        sh_quote(b, s);
    }
}

/* ------------------------------------------------------------------ options */

typedef struct {
    int servers, workers;       /* 0: not given */
    const char *mode;           /* "sync" / "async" */
    const char *gpus;           /* "auto", "none" or "0,1,..." */
    int server_threads;
    const char *timeline_dir;   /* NULL: no timelines */
    const char *bin_dir;        /* NULL: the directory of ps_launch */
    const char *hostfile;
    int base_port;
    int dry_run;
    strvec server_args;         /* --server-arg, in order */
    char **wflags;              /* the worker flags after "--" (argv slice) */
    int nwflags;
} launch_opts;

typedef struct {
    char *name;                 /* as written: "host" or "user@host" */
    int servers, workers;
    int gpus;                   /* gpus=G, -1 when not given */
} hf_host;

typedef struct {
    hf_host *hosts;
    int n;
} hostfile;

/* One process to start. */
typedef struct {
    int role, rank;
    const char *host;           /* hostfile host, NULL: this host */
    char *endpoint;             /* servers: what workers connect to */
    char *device;               /* workers: "cpu" / "cuda:0" */
    char *env;                  /* "NAME=value" added to the environment, or NULL */
    strvec argv;                /* argv[0]: program path, or "ssh" */
} launch_cmd;

typedef struct {
    launch_cmd *cmds;           /* servers in rank order, then workers */
    int n, num_servers, num_workers;
} launch_plan;

static void plan_free(launch_plan *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->cmds[i].endpoint);
        free(p->cmds[i].device);
        free(p->cmds[i].env);
        sv_free(&p->cmds[i].argv);
    }
    free(p->cmds);
    memset(p, 0, sizeof *p);
}

static void hostfile_free(hostfile *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->hosts[i].name);
    free(h->hosts);
    memset(h, 0, sizeof *h);
}

/* Worker flags that the servers must see too (the worker checks them against
 * the servers at hello, so both sides get the same value). */
static const char *const shared_flags[] = {"--lr",   "--optimizer",    "--momentum",
                                           "--beta1", "--beta2",       "--eps",
                                           "--weight-decay", "--lr-decay", "--lr-decay-every",
                                           "--max-staleness", "--curve-keys",
                                           NULL};
/* Worker flags the launcher sets itself, per worker. */
static const char *const reserved_flags[] = {"--servers", "--rank", "--num-workers", "--mode",
                                             "--device", NULL};
/* Worker flags naming an output file: without {rank} in the value, only
 * worker 0 gets them, so W workers do not write over one file. */
static const char *const per_worker_file_flags[] = {"--log-csv", "--timeline", "--save", NULL};

static int in_list(const char *const *list, const char *s)
{
    for (; *list; list++)
        if (!strcmp(*list, s))
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ GPUs */

/* The GPUs `auto` finds: the entries of CUDA_VISIBLE_DEVICES when it is set
 * (a scheduler already chose them), else indices 0..N-1 with N counted from
 * /proc/driver/nvidia/gpus or `nvidia-smi -L`. */
static void detect_gpus(strvec *ids)
{
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd) {
        char *copy = xstrdup(cvd), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            /* "-1" or "NoDevFiles" hide every GPU */
            if (!strcmp(t, "-1") || !strcmp(t, "NoDevFiles")) {
                sv_free(ids);
                break;
            }
            if (*t)
                sv_push(ids, t);
        }
        free(copy);
        return;
    }
    int n = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
    }
    if (n == 0) {
        FILE *f = popen("nvidia-smi -L 2>/dev/null", "r");
        if (f) {
            char line[512];
            while (fgets(line, sizeof line, f))
                if (!strncmp(line, "GPU ", 4))
                    n++;
            pclose(f);
        }
    }
    for (int i = 0; i < n; i++)
        sv_pushf(ids, "%d", i);
}

static int parse_gpu_list(const char *spec, strvec *ids, char *why, size_t len)
{
    char *copy = xstrdup(spec), *p = copy;
    int rc = 0;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = 0;
        long long v;
        char tmp[8];
        if (ps_parse_int(P, "--gpus", p, 0, 1023, &v, tmp, sizeof tmp)) {
            snprintf(why, len,
                     P ": --gpus must be auto, none or a list of GPU ids in [0, 1023] like 0,1, "
                       "got '%s'",
                     spec);
            rc = 1;
            break;
        }
        sv_pushf(ids, "%lld", v);
        if (!comma)
            break;
        p = comma + 1;
    }
    free(copy);
    return rc;
}

/* ------------------------------------------------------------------ hostfile */

static int host_name_ok(const char *s)
{
    if (!*s || *s == '-' || *s == '@')
        return 0;
    for (; *s; s++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@", *s))
            return 0;
    return 1;
}

/* Lines "host [servers=N] [workers=M] [gpus=G]"; '#' starts a comment. */
static int hostfile_read(const char *path, hostfile *h, char *why, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, len, P ": cannot read --hostfile '%s': %s", path, strerror(errno));
        return 1;
    }
    char line[4096];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok)
            continue;
        if (!host_name_ok(tok)) {
            snprintf(why, len, P ": %s:%d: bad host name '%s'", path, lineno, tok);
            rc = 1;
            break;
        }
        h->hosts = xrealloc(h->hosts, (size_t)(h->n + 1) * sizeof *h->hosts);
        hf_host *hh = &h->hosts[h->n++];
        hh->name = xstrdup(tok);
        hh->servers = hh->workers = 0;
        hh->gpus = -1;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            char *eq = strchr(tok, '=');
            int *dst = NULL;
            long long hi = 0;
            if (eq) {
                *eq = 0;
                if (!strcmp(tok, "servers"))
                    dst = &hh->servers, hi = MAX_SERVERS;
                else if (!strcmp(tok, "workers"))
                    dst = &hh->workers, hi = MAX_WORKERS;
                else if (!strcmp(tok, "gpus"))
                    dst = &hh->gpus, hi = 1024;
            }
            if (!dst) {
                snprintf(why, len,
                         P ": %s:%d: expected servers=N, workers=M or gpus=G after the host, "
                           "got '%s'",
                         path, lineno, tok);
                rc = 1;
                break;
            }
            char flag[32], tmp[256];
            long long v;
            snprintf(flag, sizeof flag, "%s=", tok);
            if (ps_parse_int(path, flag, eq + 1, 0, hi, &v, tmp, sizeof tmp)) {
                snprintf(why, len, P ": %s (line %d)", tmp, lineno);
                rc = 1;
                break;
            }
            *dst = (int)v;
        }
    }
    if (!rc && ferror(f)) {
        snprintf(why, len, P ": error reading --hostfile '%s'", path);
        rc = 1;
    }
    fclose(f);
    if (!rc && h->n == 0) {
        snprintf(why, len, P ": --hostfile '%s' lists no hosts", path);
        rc = 1;
    }
    return rc;
}

/* ------------------------------------------------------------------ the plan */

/* The host part of "user@host". */
static const char *host_addr(const char *name)
{
    const char *at = strrchr(name, '@');
    return at ? at + 1 : name;
}

/* The value of a per-worker flag with every "{rank}" replaced. */
static char *subst_rank(const char *s, int rank)
{
    strbuf b = {0};
    for (;;) {
        const char *m = strstr(s, "{rank}");
        if (!m) {
            sb_add(&b, s);
            break;
        }
        sb_addn(&b, s, (size_t)(m - s));
        sb_addf(&b, "%d", rank);
        s = m + 6;
    }
    if (!b.p)
        sb_add(&b, "");
    return b.p;
}

/* Check the worker flags for ones the launcher owns.  0 or 1 with `why`. */
static int check_worker_flags(const launch_opts *o, char *why, size_t len)
{
    for (int i = 0; i < o->nwflags; i++) {
        const char *a = o->wflags[i];
        if (in_list(reserved_flags, a)) {
            snprintf(why, len,
                     P ": %s is set by ps_launch for each worker; remove it from the worker "
                       "flags%s",
                     a,
                     !strcmp(a, "--mode")     ? " (use ps_launch --mode)"
                     : !strcmp(a, "--device") ? " (use ps_launch --gpus)"
                                              : "");
            return 1;
        }
        if (o->timeline_dir && !strcmp(a, "--timeline")) {
            snprintf(why, len,
                     P ": --timeline in the worker flags conflicts with --timeline-dir; "
                       "give one of them");
            return 1;
        }
    }
    return 0;
}

/* Append argv (local path or remote "cd DIR && exec ...") to cmd. */
static void cmd_finish(launch_cmd *cmd, const strvec *args, const char *remote_dir,
                       const char *remote_mkdir)
{
    if (!cmd->host) {
        for (int i = 0; i < args->n; i++)
            sv_push(&cmd->argv, args->v[i]);
        return;
    }
    strbuf r = {0};
    sb_add(&r, "cd ");
    remote_quote(&r, remote_dir);
    sb_add(&r, " && ");
    if (remote_mkdir) {
        sb_add(&r, "mkdir -p ");
        remote_quote(&r, remote_mkdir);
        sb_add(&r, " && ");
    }
    sb_add(&r, "exec ");
    if (cmd->env) {
        sb_add(&r, "env ");
        remote_quote(&r, cmd->env);
        sb_add(&r, " ");
    }
    for (int i = 0; i < args->n; i++) {
        if (i)
            sb_add(&r, " ");
        remote_quote(&r, args->v[i]);
    }
    sv_push(&cmd->argv, "ssh");
    sv_push(&cmd->argv, "-o");
    sv_push(&cmd->argv, "BatchMode=yes");
    sv_push(&cmd->argv, cmd->host);
    sv_push(&cmd->argv, r.p);
    free(r.p);
}

/* Build who runs where with which argv.  Local (hf NULL): server i binds
 * 127.0.0.1:ports[i]; workers use the GPUs in `gpus` round-robin.  Hostfile:
 * servers bind tcp://0.0.0.0 (`*`) on base_port + rank on their host, workers
 * use the gpus= of their host under `auto`.  bin_dir is where the programs are
 * (on every host), remote_dir the directory the remote commands cd to.
 * Starts nothing, opens nothing.  Returns 0, or 1 with a message in why. */
static int plan_build(const launch_opts *o, const hostfile *hf, const int *ports,
                      const strvec *gpus, const char *bin_dir, const char *remote_dir,
                      launch_plan *p, char *why, size_t len)
{
    memset(p, 0, sizeof *p);
    int S = o->servers, W = o->workers;
    if (hf) {
        int s = 0, w = 0;
        for (int i = 0; i < hf->n; i++)
            s += hf->hosts[i].servers, w += hf->hosts[i].workers;
        if (s == 0 || w == 0) {
            snprintf(why, len,
                     P ": the hostfile places %d server(s) and %d worker(s); give servers=N "
                       "and workers=M on some hosts",
                     s, w);
            return 1;
        }
        if ((S && S != s) || (W && W != w)) {
            snprintf(why, len,
                     P ": --servers %d --workers %d disagree with the hostfile (%d servers, %d "
                       "workers); leave them out or make them match",
                     S ? S : s, W ? W : w, s, w);
            return 1;
        }
        if (s > MAX_SERVERS || w > MAX_WORKERS) {
            snprintf(why, len, P ": the hostfile asks for %d servers and %d workers (at most %d and %d)",
                     s, w, MAX_SERVERS, MAX_WORKERS);
            return 1;
        }
        S = s, W = w;
        if (o->base_port + S - 1 > 65535) {
            snprintf(why, len, P ": --base-port %d + %d servers goes past port 65535",
                     o->base_port, S);
            return 1;
        }
    }
    p->num_servers = S;
    p->num_workers = W;
    p->n = S + W;
    p->cmds = xrealloc(NULL, (size_t)p->n * sizeof *p->cmds);
    memset(p->cmds, 0, (size_t)p->n * sizeof *p->cmds);

    /* place ranks on hosts in hostfile order: host 1's servers= take the
     * first server ranks, and so on; the same for workers */
    for (int r = 0; r < S; r++) {
        p->cmds[r].role = ROLE_SERVER;
        p->cmds[r].rank = r;
    }
    for (int r = 0; r < W; r++) {
        p->cmds[S + r].role = ROLE_WORKER;
        p->cmds[S + r].rank = r;
    }
    int local_idx[MAX_WORKERS]; /* a worker's index among those on its host */
    const hf_host *whost[MAX_WORKERS];
    if (hf) {
        int s = 0, w = 0;
        for (int h = 0; h < hf->n; h++) {
            for (int j = 0; j < hf->hosts[h].servers; j++)
                p->cmds[s++].host = hf->hosts[h].name;
            for (int j = 0; j < hf->hosts[h].workers; j++, w++) {
                p->cmds[S + w].host = hf->hosts[h].name;
                whost[w] = &hf->hosts[h];
                local_idx[w] = j;
            }
        }
    } else {
        for (int r = 0; r < W; r++)
            whost[r] = NULL, local_idx[r] = r;
    }
    for (int r = 0; r < S; r++) {
        launch_cmd *c = &p->cmds[r];
        strbuf e = {0};
        if (hf)
            sb_addf(&e, "tcp://%s:%d", host_addr(c->host), o->base_port + r);
        else
            sb_addf(&e, "tcp://127.0.0.1:%d", ports[r]);
        c->endpoint = e.p;
    }
    for (int r = 0; r < W; r++) {
        launch_cmd *c = &p->cmds[S + r];
        /* one worker per GPU, round-robin; each sees only its GPU, as cuda:0 */
        char gpu[64] = "";
        if (!strcmp(o->gpus, "auto") && whost[r]) {
            if (whost[r]->gpus > 0)
                snprintf(gpu, sizeof gpu, "%d", local_idx[r] % whost[r]->gpus);
        } else if (strcmp(o->gpus, "none") && gpus->n > 0) {
            snprintf(gpu, sizeof gpu, "%s", gpus->v[local_idx[r] % gpus->n]);
        }
        if (*gpu) {
            strbuf e = {0};
            sb_addf(&e, "CUDA_VISIBLE_DEVICES=%s", gpu);
            c->env = e.p;
            c->device = xstrdup("cuda:0");
        } else {
            c->device = xstrdup("cpu");
        }
    }

    strbuf list = {0};
    for (int r = 0; r < S; r++) {
        if (r)
            sb_add(&list, ",");
        sb_add(&list, p->cmds[r].endpoint);
    }

    for (int i = 0; i < p->n; i++) {
        launch_cmd *c = &p->cmds[i];
        strvec a = {0};
        sv_pushf(&a, "%s/ps_%s", bin_dir, role_name[c->role]);
        if (c->role == ROLE_SERVER) {
            sv_push(&a, "--bind");
            if (hf)
                sv_pushf(&a, "tcp://*:%d", o->base_port + c->rank);
            else
                sv_push(&a, c->endpoint);
            sv_push(&a, "--rank");
            sv_pushf(&a, "%d", c->rank);
            sv_push(&a, "--num-servers");
            sv_pushf(&a, "%d", S);
            sv_push(&a, "--num-workers");
            sv_pushf(&a, "%d", W);
            sv_push(&a, "--mode");
            sv_push(&a, o->mode);
            sv_push(&a, "--threads");
            sv_pushf(&a, "%d", o->server_threads);
            if (o->timeline_dir) {
                sv_push(&a, "--timeline");
                sv_pushf(&a, "%s/server-%d.json", o->timeline_dir, c->rank);
            }
            for (int k = 0; k + 1 < o->nwflags; k++)
                if (in_list(shared_flags, o->wflags[k])) {
                    sv_push(&a, o->wflags[k]);
                    sv_push(&a, o->wflags[++k]);
                }
            for (int k = 0; k < o->server_args.n; k++)
                sv_push(&a, o->server_args.v[k]);
        } else {
            sv_push(&a, "--servers");
            sv_push(&a, list.p);
            sv_push(&a, "--rank");
            sv_pushf(&a, "%d", c->rank);
            sv_push(&a, "--num-workers");
            sv_pushf(&a, "%d", W);
            sv_push(&a, "--mode");
            sv_push(&a, o->mode);
            for (int k = 0; k < o->nwflags; k++) {
                const char *f = o->wflags[k];
                if (in_list(per_worker_file_flags, f) && k + 1 < o->nwflags) {
                    const char *v = o->wflags[++k];
                    if (c->rank == 0 || strstr(v, "{rank}")) {
                        char *s = subst_rank(v, c->rank);
                        sv_push(&a, f);
                        sv_push(&a, s);
                        free(s);
                    }
                    continue;
                }
                char *s = subst_rank(f, c->rank);
                sv_push(&a, s);
                free(s);
            }
            sv_push(&a, "--device");
            sv_push(&a, c->device);
            if (o->timeline_dir) {
                sv_push(&a, "--timeline");
                sv_pushf(&a, "%s/worker-%d.json", o->timeline_dir, c->rank);
            }
        }
        cmd_finish(c, &a, remote_dir, hf ? o->timeline_dir : NULL);
        sv_free(&a);
    }
    free(list.p);
    return 0;
}

/* One line per process, as a shell would run it. */
static void plan_print(const launch_plan *p, const launch_opts *o, FILE *f)
{
    fprintf(f, "# ps_launch plan: %d server%s, %d worker%s, mode %s\n", p->num_servers,
            p->num_servers == 1 ? "" : "s", p->num_workers, p->num_workers == 1 ? "" : "s",
            o->mode);
    for (int i = 0; i < p->n; i++) {
        const launch_cmd *c = &p->cmds[i];
        fprintf(f, "# %s %d on %s", role_name[c->role], c->rank, c->host ? c->host : "this host");
        if (c->role == ROLE_SERVER)
            fprintf(f, ", reached at %s\n", c->endpoint);
        else
            fprintf(f, ", device %s\n", c->device);
        strbuf b = {0};
        if (!c->host && c->env) {
            sb_add(&b, c->env);
            sb_add(&b, " ");
        }
        for (int k = 0; k < c->argv.n; k++) {
            if (k)
                sb_add(&b, " ");
            sh_quote(&b, c->argv.v[k]);
        }
        fprintf(f, "%s\n", b.p);
        free(b.p);
    }
}

/* ------------------------------------------------------------------ supervisor */

typedef struct {
    char *p;
    size_t n, cap;
} linebuf;

typedef struct {
    const launch_cmd *cmd;
    pid_t pid;
    int fd[2];       /* read ends of stdout, stderr; -1 once closed */
    linebuf lb[2];
    int reaped, status;
} child;

enum { ST_RUN, ST_STOP_SERVERS, ST_STOP_FAIL, ST_STOP_SIGNAL };

static int g_sigpipe[2] = {-1, -1};
static int g_out_broken[3];

/* Worker summaries seen in the output, for the closing line. */
static double g_sum_rate;
static int g_nrate;
static double g_acc0 = -1;

static void on_signal(int sig)
{
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_sigpipe[1], &b, 1) < 0) {
    }
    errno = e;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    default: return "signal";
    }
}

static void describe_status(int st, char *out, size_t n)
{
    if (WIFEXITED(st)) {
        snprintf(out, n, "exited with status %d", WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        int core = 0;
#ifdef WCOREDUMP
        core = WCOREDUMP(st) != 0;
#endif
        snprintf(out, n, "was killed by signal %d (%s)%s", WTERMSIG(st), sig_name(WTERMSIG(st)),
                 core ? ", core dumped" : "");
    } else {
        snprintf(out, n, "ended with wait status 0x%x", (unsigned)st);
    }
}

static void child_name(const child *c, char *out, size_t n)
{
    if (c->cmd->host)
        snprintf(out, n, "%s %d (pid %ld, ssh to %s)", role_name[c->cmd->role], c->cmd->rank,
                 (long)c->pid, c->cmd->host);
    else
        snprintf(out, n, "%s %d (pid %ld)", role_name[c->cmd->role], c->cmd->rank, (long)c->pid);
}

static void write_all(int fd, const char *p, size_t n)
{
    if (g_out_broken[fd])
        return;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
            continue;
        }
        if (w <= 0) {
            g_out_broken[fd] = 1; /* our stdout went away: drop, keep supervising */
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Pick up "summary: time 12.3 s, 4567 samples/s per worker, test accuracy 0.88". */
static void note_summary(const child *c, const char *line)
{
    const char *s = strstr(line, "summary:");
    if (!s)
        return;
    const char *r = strstr(s, " samples/s");
    if (r) {
        const char *b = r;
        while (b > s && (b[-1] == '.' || (b[-1] >= '0' && b[-1] <= '9')))
            b--;
        if (b < r) {
            g_sum_rate += strtod(b, NULL);
            g_nrate++;
        }
    }
    const char *a = strstr(s, "test accuracy ");
    if (a && c->cmd->rank == 0)
        g_acc0 = strtod(a + 14, NULL);
}

static void emit_line(const child *c, int stream, const char *line, size_t n)
{
    static strbuf b;
    while (n > 0 && line[n - 1] == '\r')
        n--;
    b.n = 0;
    sb_addf(&b, "[%s %d] ", role_name[c->cmd->role], c->cmd->rank);
    size_t head = b.n;
    sb_addn(&b, line, n);
    if (c->cmd->role == ROLE_WORKER)
        note_summary(c, b.p + head);
    sb_add(&b, "\n");
    /* one write per line, so lines of different children never mix */
    write_all(stream == 0 ? STDOUT_FILENO : STDERR_FILENO, b.p, b.n);
}

static void feed(child *c, int s, const char *data, size_t n)
{
    linebuf *lb = &c->lb[s];
    if (lb->n + n > lb->cap) {
        lb->cap = (lb->n + n) * 2;
        lb->p = xrealloc(lb->p, lb->cap);
    }
    memcpy(lb->p + lb->n, data, n);
    lb->n += n;
    size_t start = 0;
    for (size_t i = lb->n - n; i < lb->n; i++) {
        if (lb->p[i] == '\n') {
            emit_line(c, s, lb->p + start, i - start);
            start = i + 1;
        } else if (i + 1 - start >= MAX_LINE) {
            emit_line(c, s, lb->p + start, i + 1 - start);
            start = i + 1;
        }
    }
    memmove(lb->p, lb->p + start, lb->n - start);
    lb->n -= start;
}

static void close_stream(child *c, int s)
{
    if (c->fd[s] < 0)
        return;
    if (c->lb[s].n > 0)
        emit_line(c, s, c->lb[s].p, c->lb[s].n); /* last line had no newline */
    c->lb[s].n = 0;
    close(c->fd[s]);
    c->fd[s] = -1;
}

/* Read what is there now.  Returns 1 when it stopped early with more maybe
 * left (so one busy child cannot starve the others), else 0. */
static int read_stream(child *c, int s)
{
    char tmp[16384];
    for (int rounds = 0; rounds < 16; rounds++) {
        if (c->fd[s] < 0)
            return 0;
        ssize_t r = read(c->fd[s], tmp, sizeof tmp);
        if (r > 0) {
            feed(c, s, tmp, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return 0;
        close_stream(c, s); /* EOF or error */
        return 0;
    }
    return 1;
}

/* Everything a child wrote before it ended, so its last words come out
 * before ps_launch's verdict on it. */
static void drain_child(child *c)
{
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 64 && read_stream(c, s); i++) {
        }
}

/* Start one process with stdout/stderr on pipes.  The child gets its own
 * process group (so ps_launch alone decides which signals reach it, and a
 * stop reaches anything it forked) and, on Linux, SIGTERM if ps_launch dies. */
static int spawn(child *c, char *why, size_t len)
{
    int out[2], err[2];
    if (pipe(out) || pipe(err)) {
        snprintf(why, len, P ": pipe: %s", strerror(errno));
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(out[i], F_SETFD, FD_CLOEXEC);
        fcntl(err[i], F_SETFD, FD_CLOEXEC);
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
#else
        (void)parent;
#endif
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            signal(sigs[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0 && devnull != STDIN_FILENO) {
            dup2(devnull, STDIN_FILENO);
            close(devnull);
        }
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        if (c->cmd->env && !c->cmd->host)
            putenv(c->cmd->env);
        char *const *argv = c->cmd->argv.v;
        if (strchr(argv[0], '/'))
            execv(argv[0], argv);
        else
            execvp(argv[0], argv);
        dprintf(STDERR_FILENO, P ": cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int fork_errno = errno;
    if (pid > 0)
        setpgid(pid, pid); /* also here: no race with a signal sent right away */
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        snprintf(why, len, P ": fork: %s", strerror(fork_errno));
        return 1;
    }
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    c->pid = pid;
    c->fd[0] = out[0];
    c->fd[1] = err[0];
    return 0;
}

static void signal_child(const child *c, int sig)
{
    if (c->reaped || c->pid <= 0)
        return;
    kill(-c->pid, sig);
    kill(c->pid, sig);
}

typedef struct {
    child *ch;
    int n;
    int state;
    int exit_code;
    int64_t deadline;     /* 0: none */
    int killed;           /* SIGKILL sent */
    int workers_ok, workers;
    char failure[512];    /* what made us stop, for the last line */
    int64_t t0;
} supervisor;

static void stop_all(supervisor *sv, int sig, int servers_only)
{
    for (int i = 0; i < sv->n; i++)
        if (!servers_only || sv->ch[i].cmd->role == ROLE_SERVER)
            signal_child(&sv->ch[i], sig);
    sv->deadline = now_ms() + STOP_GRACE_MS;
}

static void on_exit_child(supervisor *sv, child *c)
{
    char name[300], how[128];
    child_name(c, name, sizeof name);
    describe_status(c->status, how, sizeof how);
    int ok = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
    if (sv->state == ST_RUN) {
        if (c->cmd->role == ROLE_WORKER && ok) {
            if (++sv->workers_ok == sv->workers) {
                fprintf(stderr, P ": %s finished; stopping the servers\n",
                        sv->workers == 1 ? "the worker" : "all workers");
                sv->state = ST_STOP_SERVERS;
                stop_all(sv, SIGTERM, 1);
            }
            return;
        }
        fprintf(stderr, P ": %s %s%s; stopping the others\n", name, how,
                c->cmd->role == ROLE_SERVER ? " before the workers finished" : "");
        snprintf(sv->failure, sizeof sv->failure, "%s %s", name, how);
        sv->state = ST_STOP_FAIL;
        sv->exit_code = 1;
        stop_all(sv, SIGTERM, 0);
        return;
    }
    if (sv->state == ST_STOP_SERVERS && c->cmd->role == ROLE_SERVER && !ok &&
        !(WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGTERM))
        fprintf(stderr, P ": warning: %s %s while stopping\n", name, how);
}

static void reap(supervisor *sv)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        for (int i = 0; i < sv->n; i++) {
            child *c = &sv->ch[i];
            if (c->pid == pid && !c->reaped) {
                c->reaped = 1;
                c->status = st;
                drain_child(c);
                on_exit_child(sv, c);
                break;
            }
        }
    }
}

static void on_launcher_signal(supervisor *sv, int sig)
{
    int fwd = sig == SIGHUP ? SIGTERM : sig;
    if (sv->state == ST_RUN) {
        int live = 0;
        for (int i = 0; i < sv->n; i++)
            live += !sv->ch[i].reaped;
        fprintf(stderr, P ": got %s; sending %s to the %d running processes\n", sig_name(sig),
                sig_name(fwd), live);
        snprintf(sv->failure, sizeof sv->failure, "interrupted by %s", sig_name(sig));
        sv->state = ST_STOP_SIGNAL;
        sv->exit_code = 128 + sig;
        stop_all(sv, fwd, 0);
        return;
    }
    /* a second signal while stopping: do not wait any longer */
    fprintf(stderr, P ": got %s again; killing what is left\n", sig_name(sig));
    if (sv->state == ST_STOP_SERVERS) {
        sv->exit_code = 128 + sig;
        snprintf(sv->failure, sizeof sv->failure, "interrupted by %s", sig_name(sig));
    }
    for (int i = 0; i < sv->n; i++)
        signal_child(&sv->ch[i], SIGKILL);
    sv->killed = 1;
    sv->deadline = now_ms() + KILL_GRACE_MS;
}

static int install_signals(void)
{
    if (pipe(g_sigpipe))
        return 1;
    for (int i = 0; i < 2; i++) {
        fcntl(g_sigpipe[i], F_SETFD, FD_CLOEXEC);
        fcntl(g_sigpipe[i], F_SETFL, fcntl(g_sigpipe[i], F_GETFL) | O_NONBLOCK);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Start everything in the plan and supervise until it is over.  Returns the
 * exit code of ps_launch. */
static int supervise(const launch_plan *plan, const launch_opts *o)
{
    supervisor sv = {0};
    sv.n = plan->n;
    sv.workers = plan->num_workers;
    sv.ch = xrealloc(NULL, (size_t)sv.n * sizeof *sv.ch);
    memset(sv.ch, 0, (size_t)sv.n * sizeof *sv.ch);
    sv.t0 = now_ms();
    if (install_signals()) {
        fprintf(stderr, P ": pipe: %s\n", strerror(errno));
        free(sv.ch);
        return 1;
    }
    char why[512];
    for (int i = 0; i < sv.n; i++) {
        child *c = &sv.ch[i];
        c->cmd = &plan->cmds[i];
        c->fd[0] = c->fd[1] = -1;
        c->reaped = 1; /* until started */
    }
    /* servers first: workers connect to them (ZeroMQ retries until they bind) */
    for (int i = 0; i < sv.n && sv.state == ST_RUN; i++) {
        child *c = &sv.ch[i];
        if (spawn(c, why, sizeof why)) {
            fprintf(stderr, "%s; stopping the others\n", why);
            snprintf(sv.failure, sizeof sv.failure, "could not start %s %d",
                     role_name[c->cmd->role], c->cmd->rank);
            sv.state = ST_STOP_FAIL;
            sv.exit_code = 1;
            stop_all(&sv, SIGTERM, 0);
            break;
        }
        c->reaped = 0;
        const launch_cmd *k = c->cmd;
        if (k->role == ROLE_SERVER)
            fprintf(stderr, P ": started server %d (pid %ld)%s%s at %s\n", k->rank, (long)c->pid,
                    k->host ? " on " : "", k->host ? k->host : "", k->endpoint);
        else
            fprintf(stderr, P ": started worker %d (pid %ld)%s%s, device %s%s%s\n", k->rank,
                    (long)c->pid, k->host ? " on " : "", k->host ? k->host : "", k->device,
                    k->env ? " with " : "", k->env ? k->env : "");
        /* a signal or an early exit during start-up is handled right away */
        unsigned char sigs[64];
        ssize_t r = read(g_sigpipe[0], sigs, sizeof sigs);
        for (ssize_t j = 0; j < r; j++)
            if (sigs[j] != SIGCHLD)
                on_launcher_signal(&sv, sigs[j]);
        reap(&sv);
    }

    struct pollfd *pfd = xrealloc(NULL, (size_t)(2 * sv.n + 1) * sizeof *pfd);
    int64_t drain_deadline = 0;
    for (;;) {
        reap(&sv);
        int all_reaped = 1, open_fds = 0;
        for (int i = 0; i < sv.n; i++) {
            all_reaped &= sv.ch[i].reaped;
            open_fds += (sv.ch[i].fd[0] >= 0) + (sv.ch[i].fd[1] >= 0);
        }
        int64_t now = now_ms();
        if (all_reaped) {
            if (!open_fds)
                break;
            if (!drain_deadline)
                drain_deadline = now + DRAIN_MS;
            if (now >= drain_deadline) { /* something the child forked holds the pipe */
                for (int i = 0; i < sv.n; i++)
                    close_stream(&sv.ch[i], 0), close_stream(&sv.ch[i], 1);
                break;
            }
        } else if (sv.deadline && now >= sv.deadline) {
            if (!sv.killed) {
                for (int i = 0; i < sv.n; i++) {
                    child *c = &sv.ch[i];
                    if (c->reaped)
                        continue;
                    char name[300];
                    child_name(c, name, sizeof name);
                    fprintf(stderr, P ": %s did not stop within %d s; sending SIGKILL\n", name,
                            STOP_GRACE_MS / 1000);
                    signal_child(c, SIGKILL);
                }
                sv.killed = 1;
                sv.deadline = now + KILL_GRACE_MS;
            } else {
                fprintf(stderr, P ": some processes did not exit even after SIGKILL; giving up\n");
                if (!sv.exit_code)
                    sv.exit_code = 1;
                break;
            }
        }
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = g_sigpipe[0], .events = POLLIN};
        for (int i = 0; i < sv.n; i++)
            for (int s = 0; s < 2; s++)
                if (sv.ch[i].fd[s] >= 0)
                    pfd[np++] = (struct pollfd){.fd = sv.ch[i].fd[s], .events = POLLIN};
        int64_t until = all_reaped ? drain_deadline : sv.deadline;
        int timeout = -1;
        if (until) {
            int64_t d = until - now;
            timeout = d < 0 ? 0 : d > 1000 ? 1000 : (int)d;
        }
        int rc = poll(pfd, (nfds_t)np, timeout);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, P ": poll: %s\n", strerror(errno));
            break;
        }
        if (rc <= 0)
            continue;
        if (pfd[0].revents) {
            unsigned char sigs[64];
            ssize_t r;
            while ((r = read(g_sigpipe[0], sigs, sizeof sigs)) > 0)
                for (ssize_t j = 0; j < r; j++)
                    if (sigs[j] != SIGCHLD)
                        on_launcher_signal(&sv, sigs[j]);
        }
        for (int k = 1; k < np; k++) {
            if (!pfd[k].revents)
                continue;
            for (int i = 0; i < sv.n; i++)
                for (int s = 0; s < 2; s++)
                    if (sv.ch[i].fd[s] == pfd[k].fd)
                        read_stream(&sv.ch[i], s);
        }
    }
    free(pfd);

    double secs = (double)(now_ms() - sv.t0) / 1000.0;
    if (sv.exit_code == 0) {
        strbuf b = {0};
        sb_addf(&b, P ": done in %.1f s: %d worker%s finished (mode %s), %d server%s stopped",
                secs, sv.workers, sv.workers == 1 ? "" : "s", o->mode, plan->num_servers,
                plan->num_servers == 1 ? "" : "s");
        if (g_nrate)
            sb_addf(&b, "; %.0f samples/s over all workers", g_sum_rate);
        if (g_acc0 >= 0)
            sb_addf(&b, ", test accuracy %.4f (worker 0)", g_acc0);
        fprintf(stderr, "%s\n", b.p);
        free(b.p);
    } else {
        fprintf(stderr, P ": %s after %.1f s: %s\n", sv.exit_code > 128 ? "stopped" : "failed",
                secs, sv.failure);
    }
    for (int i = 0; i < sv.n; i++) {
        close_stream(&sv.ch[i], 0);
        close_stream(&sv.ch[i], 1);
        free(sv.ch[i].lb[0].p);
        free(sv.ch[i].lb[1].p);
    }
    free(sv.ch);
    return sv.exit_code;
}

/* ------------------------------------------------------------------ main */

static const char usage[] =
    "usage: ps_launch --servers S --workers W [flags] -- <worker flags>\n"
    "       ps_launch --hostfile FILE [flags] -- <worker flags>\n"
    "\n"
    "Starts S ps_server and W ps_worker processes on this host (or, with --hostfile,\n"
    "on other hosts over ssh), prints every line they write prefixed with its role\n"
    "and rank ([server 0] ..., [worker 1] ...), forwards SIGINT/SIGTERM to them, and\n"
    "stops them all when one fails.  Exit status: 0 when every worker exited 0;\n"
    "1 when a process died (the others are stopped); 2 for bad flags; 130/143\n"
    "after SIGINT/SIGTERM.\n"
    "\n"
    "flags:\n"
    "  --servers S           ps_server processes, 1..256           e.g. --servers 2\n"
    "  --workers W           ps_worker processes, 1..1024          e.g. --workers 4\n"
    "  --gpus auto|none|IDS  auto (default): one worker per GPU found (the entries of\n"
    "                        CUDA_VISIBLE_DEVICES, else /proc/driver/nvidia/gpus or\n"
    "                        nvidia-smi -L), round-robin when W > GPUs; worker i sees\n"
    "                        only its GPU (CUDA_VISIBLE_DEVICES) and gets --device\n"
    "                        cuda:0.  No GPU, or none: --device cpu.  e.g. --gpus 0,1\n"
    "  --mode sync|async     consistency, given to servers and workers (default sync)\n"
    "                                                              e.g. --mode async\n"
    "  --server-threads T    update threads per server, 1..256 (default 1)\n"
    "                                                              e.g. --server-threads 4\n"
    "  --timeline-dir DIR    Chrome trace of each process: DIR/server-i.json,\n"
    "                        DIR/worker-i.json (created)    e.g. --timeline-dir out/tl\n"
    "  --bin-dir DIR         where ps_server and ps_worker are (default: the directory\n"
    "                        of ps_launch)                  e.g. --bin-dir build/bin\n"
    "  --server-arg ARG      one more argument for every server (repeat it)\n"
    "                                          e.g. --server-arg --verbose\n"
    "  --hostfile FILE       run over ssh: lines 'host [servers=N] [workers=M] [gpus=G]'\n"
    "                        (# comments); --servers/--workers may then be left out\n"
    "                                                              e.g. --hostfile hosts.txt\n"
    "  --base-port P         with --hostfile: server i listens on P+i (default 29500)\n"
    "                                                              e.g. --base-port 40000\n"
    "  --dry-run             print the commands (and their hosts) and start nothing\n"
    "  --help, --version\n"
    "\n"
    "Worker flags (after --) go to every worker; \"{rank}\" in them becomes the worker's\n"
    "rank.  --log-csv, --timeline and --save without {rank} go to worker 0 only.\n"
    "These worker flags also go to the servers, which must agree with the workers:\n"
    "  --lr --optimizer --momentum --beta1 --beta2 --eps --weight-decay --max-staleness\n"
    "  --lr-decay --lr-decay-every --curve-keys\n"
    "ps_launch itself sets --servers --rank --num-workers --mode --device.\n"
    "\n"
    "examples:\n"
    "  ps_launch --servers 2 --workers 4 --mode async -- --model mlp:784-256-128-10 \\\n"
    "      --epochs 2 --lr 0.05 --log-csv out/async-worker0.csv\n"
    "  ps_launch --servers 1 --workers 2 --gpus none --timeline-dir out/tl -- --steps 300\n"
    "  ps_launch --hostfile hosts.txt --dry-run -- --model cnn --epochs 5\n"
    "See docs/LAUNCH.md (ssh, Slurm and mpirun).\n";

/* Directory holding this program. */
static char *self_dir(const char *argv0)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = 0;
    } else {
        snprintf(buf, sizeof buf, "%s", strchr(argv0, '/') ? argv0 : "./ps_launch");
    }
    char *slash = strrchr(buf, '/');
    if (slash == buf)
        slash[1] = 0;
    else if (slash)
        *slash = 0;
    return xstrdup(buf);
}

static int mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0777) && errno != EEXIST)
                rc = -1;
            *s = c;
            if (!c)
                break;
        }
    }
    free(p);
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : (rc ? rc : -1);
}

/* Free ports on 127.0.0.1: bind port 0, read it back; every socket stays
 * open until all are read, so the ports differ. */
static int pick_ports(int n, int *ports, char *why, size_t len)
{
    int *fds = xrealloc(NULL, (size_t)n * sizeof *fds), rc = 0, i;
    for (i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof a;
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) ||
            getsockname(fds[i], (struct sockaddr *)&a, &al)) {
            snprintf(why, len, P ": cannot find a free port on 127.0.0.1: %s", strerror(errno));
            rc = 1;
            if (fds[i] >= 0)
                close(fds[i]);
            break;
        }
        ports[i] = ntohs(a.sin_port);
    }
    while (i-- > 0)
        close(fds[i]);
    free(fds);
    return rc;
}

int main(int argc, char **argv)
{
    static launch_opts o;
    o.mode = "sync";
    o.gpus = "auto";
    o.server_threads = 1;
    o.base_port = 29500;
    char why[1024];
    long long v;
    int servers_given = 0, workers_given = 0;

    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (ps_flag_help_version(P, usage, a))
            return 0;
        if (!strcmp(a, "--dry-run")) {
            o.dry_run = 1;
            continue;
        }
        static const char *const valued[] = {
            "--servers",  "--workers",  "--gpus",     "--mode",       "--server-threads",
            "--timeline-dir", "--bin-dir", "--hostfile", "--base-port", "--server-arg", NULL};
        const char *val, *name = ps_flag_value(argc, argv, &i, valued, &val);
        if (!name) {
            if (strncmp(a, "--", 2) == 0)
                snprintf(why, sizeof why,
                         P ": unknown flag '%s' (see --help; worker flags go after --)", a);
            else
                snprintf(why, sizeof why,
                         P ": unexpected argument '%s' (worker flags go after --)", a);
            return ps_flag_error(why);
        }
        if (!val) {
            snprintf(why, sizeof why, P ": %s needs a value (see --help)", name);
            return ps_flag_error(why);
        }
        if (!strcmp(name, "--servers")) {
            if (ps_parse_int(P, name, val, 1, MAX_SERVERS, &v, why, sizeof why))
                return ps_flag_error(why);
            o.servers = (int)v, servers_given = 1;
        } else if (!strcmp(name, "--workers")) {
            if (ps_parse_int(P, name, val, 1, MAX_WORKERS, &v, why, sizeof why))
                return ps_flag_error(why);
            o.workers = (int)v, workers_given = 1;
        } else if (!strcmp(name, "--server-threads")) {
            if (ps_parse_int(P, name, val, 1, 256, &v, why, sizeof why))
                return ps_flag_error(why);
            o.server_threads = (int)v;
        } else if (!strcmp(name, "--base-port")) {
            if (ps_parse_int(P, name, val, 1, 65535, &v, why, sizeof why))
                return ps_flag_error(why);
            o.base_port = (int)v;
        } else if (!strcmp(name, "--mode")) {
            if (strcmp(val, "sync") && strcmp(val, "async")) {
                snprintf(why, sizeof why, P ": --mode must be sync or async, got '%s'", val);
                return ps_flag_error(why);
            }
            o.mode = val;
        } else if (!strcmp(name, "--gpus")) {
            o.gpus = val;
        } else if (!strcmp(name, "--timeline-dir") || !strcmp(name, "--bin-dir") ||
                   !strcmp(name, "--hostfile")) {
            if (!*val) {
                snprintf(why, sizeof why, P ": %s must not be empty", name);
                return ps_flag_error(why);
            }
            if (!strcmp(name, "--timeline-dir"))
                o.timeline_dir = val;
            else if (!strcmp(name, "--bin-dir"))
                o.bin_dir = val;
            else
                o.hostfile = val;
        } else if (!strcmp(name, "--server-arg")) {
            sv_push(&o.server_args, val);
        }
    }
    o.wflags = argv + i;
    o.nwflags = argc > i ? argc - i : 0;

    if (!o.hostfile && !servers_given)
        return ps_flag_error(P ": --servers is required (see --help)");
    if (!o.hostfile && !workers_given)
        return ps_flag_error(P ": --workers is required (see --help)");
    if (check_worker_flags(&o, why, sizeof why))
        return ps_flag_error(why);

    int rc = 0;
    strvec gpus = {0};
    hostfile hf = {0};
    launch_plan plan = {0};
    int *ports = NULL;
    char *exe_dir = NULL, *bin_dir = NULL;
    char cwd[PATH_MAX];
    int gpus_auto = !strcmp(o.gpus, "auto");
    if (strcmp(o.gpus, "none") && !gpus_auto && parse_gpu_list(o.gpus, &gpus, why, sizeof why)) {
        rc = ps_flag_error(why);
        goto out;
    }
    if (o.hostfile && hostfile_read(o.hostfile, &hf, why, sizeof why)) {
        rc = ps_flag_error(why);
        goto out;
    }
    if (!getcwd(cwd, sizeof cwd)) {
        fprintf(stderr, P ": getcwd: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    /* On other hosts, the programs are at the same path as here: relative to
     * the working directory when they are below it, so the commands read
     * `cd DIR && exec bin/ps_server ...`. */
    exe_dir = self_dir(argv[0]);
    if (o.bin_dir) {
        bin_dir = xstrdup(o.bin_dir);
    } else if (o.hostfile) {
        size_t n = strlen(cwd);
        if (!strcmp(exe_dir, cwd))
            bin_dir = xstrdup(".");
        else if (!strncmp(exe_dir, cwd, n) && exe_dir[n] == '/' && n > 1)
            bin_dir = xstrdup(exe_dir + n + 1);
        else
            bin_dir = xstrdup(exe_dir);
    } else {
        bin_dir = xstrdup(exe_dir);
    }

    if (!o.hostfile) {
        if (gpus_auto)
            detect_gpus(&gpus);
        ports = xrealloc(NULL, (size_t)o.servers * sizeof *ports);
        if (pick_ports(o.servers, ports, why, sizeof why)) {
            fprintf(stderr, "%s\n", why);
            rc = 1;
            goto out;
        }
    }
    if (plan_build(&o, o.hostfile ? &hf : NULL, ports, &gpus, bin_dir, cwd, &plan, why,
                   sizeof why)) {
        rc = ps_flag_error(why);
        goto out;
    }
    for (int k = 0; k < o.nwflags; k++)
        if (in_list(per_worker_file_flags, o.wflags[k]) && k + 1 < o.nwflags &&
            !strstr(o.wflags[k + 1], "{rank}") && plan.num_workers > 1 &&
            (strcmp(o.wflags[k], "--timeline") || !o.timeline_dir))
            fprintf(stderr,
                    P ": %s '%s' goes to worker 0 only (put {rank} in the path for one file "
                      "per worker)\n",
                    o.wflags[k], o.wflags[k + 1]);
    if (!o.hostfile) {
        if (!strcmp(o.gpus, "none"))
            fprintf(stderr, P ": --gpus none, running %d CPU workers\n", plan.num_workers);
        else if (gpus.n == 0)
            fprintf(stderr, P ": no GPU found, running %d CPU workers\n", plan.num_workers);
        else {
            strbuf ids = {0};
            for (int k = 0; k < gpus.n; k++)
                sb_addf(&ids, "%s%s", k ? "," : "", gpus.v[k]);
            fprintf(stderr, P ": %d GPU%s (%s), %d worker%s, one per GPU round-robin\n", gpus.n,
                    gpus.n == 1 ? "" : "s", ids.p, plan.num_workers,
                    plan.num_workers == 1 ? "" : "s");
            free(ids.p);
        }
    }
    if (o.dry_run) {
        fflush(stderr);
        plan_print(&plan, &o, stdout);
        goto out;
    }
    if (!o.hostfile) {
        const char *progs[] = {"ps_server", "ps_worker"};
        for (int k = 0; k < 2; k++) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", bin_dir, progs[k]);
            if (access(path, X_OK)) {
                fprintf(stderr, P ": cannot run %s: %s (build it with make, or give --bin-dir)\n",
                        path, strerror(errno));
                rc = 2;
                goto out;
            }
        }
        if (o.timeline_dir && mkdir_p(o.timeline_dir)) {
            fprintf(stderr, P ": cannot create --timeline-dir '%s': %s\n", o.timeline_dir,
                    strerror(errno));
            rc = 1;
            goto out;
        }
    }
    fflush(stdout);
    rc = supervise(&plan, &o);
out:
    plan_free(&plan);
    hostfile_free(&hf);
    sv_free(&gpus);
    sv_free(&o.server_args);
    free(ports);
    free(bin_dir);
    free(exe_dir);
    return rc;
}
