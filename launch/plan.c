/* The plan of ps_launch (launch/plan.h): from the flags opts.c read, who
 * runs where with which argv and environment, quoted for ssh; and what
 * --dry-run and the notes print. */
#include "plan_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "remote.h"

const char *ps_launch_role_name(int role)
{
    return role == PS_LAUNCH_SERVER ? "server" : "worker";
}

const char *ps_launch_mode_name(int mode)
{
    const char *n = ps_setting_choice_name(ps_setting_at(PS_SET_mode), mode);
    return n ? n : "?";
}

/* ------------------------------------------------------------ quoting */

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
static void sh_quote(ps_strbuf *b, const char *s)
{
    if (shell_safe(s)) {
        ps_strbuf_add(b, s);
        return;
    }
    ps_strbuf_add(b, "'");
    for (; *s; s++) {
        if (*s == '\'')
            ps_strbuf_add(b, "'\\''");
        else
            ps_strbuf_addn(b, s, 1);
    }
    ps_strbuf_add(b, "'");
}

/* Quote inside the command string ssh hands to the remote shell.  Double
 * quotes where they suffice, so the whole command still reads well when it is
 * itself printed in single quotes (the `*` of a bind address must not be
 * globbed). */
static void remote_quote(ps_strbuf *b, const char *s)
{
    if (shell_safe(s)) {
        ps_strbuf_add(b, s);
    } else if (!strpbrk(s, "\"$`\\!")) {
        ps_strbuf_add(b, "\"");
        ps_strbuf_add(b, s);
        ps_strbuf_add(b, "\"");
    } else {
        sh_quote(b, s);
    }
}

/* ------------------------------------------------------------ the plan */

/* The host part of "user@host". */
static const char *host_addr(const char *name)
{
    const char *at = strrchr(name, '@');
    return at ? at + 1 : name;
}

/* s with every "{rank}" replaced, pushed onto a. */
static void push_subst_rank(ps_strvec *a, const char *s, int rank)
{
    ps_strbuf b = {0};
    for (;;) {
        const char *m = strstr(s, "{rank}");
        if (!m) {
            ps_strbuf_add(&b, s);
            break;
        }
        ps_strbuf_addn(&b, s, (size_t)(m - s));
        ps_strbuf_addf(&b, "%d", rank);
        s = m + 6;
    }
    if (b.failed)
        a->failed = 1;
    else
        ps_strvec_push(a, ps_strbuf_str(&b));
    ps_strbuf_free(&b);
}

/* The GPU ids workers on this host take round-robin (none: empty). */
static const ps_strvec *gpu_list(const ps_launch_opts *o, const ps_launch_site *site)
{
    static const ps_strvec none;
    if (!strcmp(o->gpus, "auto"))
        return site->gpus ? site->gpus : &none;
    return strcmp(o->gpus, "none") ? &o->gpu_ids : &none;
}

/* Set cmd's argv to args: as they are here, or on its host as
 * `SSH [OPTS] -o BatchMode=yes HOST 'cd DIR && [mkdir -p MKDIR && ]exec
 * BIN/ps_launch --remote-child [env VAR=x...] args...'`: the remote wrapper
 * (remote.h) takes signals from the ssh channel and stops the program when
 * the connection ends. */
static void cmd_finish_into(ps_strvec *argv, const ps_launch_cmd *cmd, const ps_strvec *args,
                            const ps_launch_opts *o, const ps_launch_site *site)
{
    if (!cmd->host) {
        for (int i = 0; i < args->n; i++)
            ps_strvec_push(argv, args->v[i]);
        return;
    }
    ps_strbuf r = {0};
    ps_strbuf_add(&r, "cd ");
    remote_quote(&r, site->remote_dir);
    ps_strbuf_add(&r, " && ");
    if (o->timeline_dir) {
        ps_strbuf_add(&r, "mkdir -p ");
        remote_quote(&r, o->timeline_dir);
        ps_strbuf_add(&r, " && ");
    }
    ps_strbuf_add(&r, "exec ");
    ps_strbuf b = {0};
    ps_strbuf_addf(&b, "%s/ps_launch", site->bin_dir);
    remote_quote(&r, ps_strbuf_str(&b));
    ps_strbuf_free(&b);
    ps_strbuf_add(&r, " " PS_REMOTE_FLAG " ");
    if (cmd->env.n) {
        ps_strbuf_add(&r, "env ");
        for (int i = 0; i < cmd->env.n; i++) {
            remote_quote(&r, cmd->env.v[i]);
            ps_strbuf_add(&r, " ");
        }
    }
    for (int i = 0; i < args->n; i++) {
        if (i)
            ps_strbuf_add(&r, " ");
        remote_quote(&r, args->v[i]);
    }
    /* the user's ssh and options first: for ssh the first value given wins */
    push_words(argv, site->ssh && *site->ssh ? site->ssh : "ssh");
    for (int i = 0; i < o->ssh_opts.n; i++)
        ps_strvec_push(argv, o->ssh_opts.v[i]);
    ps_strvec_push(argv, "-o");
    ps_strvec_push(argv, "BatchMode=yes");
    ps_strvec_push(argv, cmd->host);
    if (r.failed)
        argv->failed = 1;
    else
        ps_strvec_push(argv, ps_strbuf_str(&r));
    ps_strbuf_free(&r);
}

static void cmd_finish(ps_launch_cmd *cmd, const ps_strvec *args, const ps_launch_opts *o,
                       const ps_launch_site *site)
{
    cmd_finish_into(&cmd->argv, cmd, args, o, site);
}

/* S and W from the flags and the hostfile, checked against each other. */
static int plan_sizes(const ps_launch_opts *o, const ps_launch_hostfile *hf, int *S, int *W,
                      char *why, size_t len)
{
    *S = o->servers, *W = o->workers;
    if (!hf)
        return 0;
    int s = 0, w = 0;
    for (int i = 0; i < hf->n; i++)
        s += hf->hosts[i].servers, w += hf->hosts[i].workers;
    if (s == 0 || w == 0) {
        snprintf(why, len,
                 P ": the hostfile places %d server(s) and %d worker(s); give servers=N "
                   "and workers=M on some hosts",
                 s, w);
        return PS_EINVAL;
    }
    if ((*S && *S != s) || (*W && *W != w)) {
        snprintf(why, len,
                 P ": --servers %d --workers %d disagree with the hostfile (%d servers, %d "
                   "workers); leave them out or make them match",
                 *S ? *S : s, *W ? *W : w, s, w);
        return PS_EINVAL;
    }
    if (s > PS_LAUNCH_MAX_SERVERS || w > PS_LAUNCH_MAX_WORKERS) {
        snprintf(why, len,
                 P ": the hostfile asks for %d servers and %d workers (at most %d and %d)", s, w,
                 PS_LAUNCH_MAX_SERVERS, PS_LAUNCH_MAX_WORKERS);
        return PS_EINVAL;
    }
    if (o->base_port + s - 1 > 65535) {
        snprintf(why, len, P ": --base-port %d + %d servers goes past port 65535", o->base_port,
                 s);
        return PS_EINVAL;
    }
    *S = s, *W = w;
    return 0;
}

/* The workers per host that sum their gradients there (ps_worker
 * --local-aggregate; docs/LAUNCH.md): the value given among the worker
 * flags; else, on its own, when the job spans hosts (a hostfile: on one host
 * the servers' shared memory keeps payloads off the network anyway), runs
 * ps_worker in sync mode (in async mode the host's workers would move in
 * lock-step: give it yourself), and every host with workers runs the same
 * number L > 1 of them; else 1 (off).  PS_EINVAL when a given value does not
 * divide the workers. */
static int plan_aggregate(const ps_launch_opts *o, const ps_launch_hostfile *hf, int W, int *L,
                          char *why, size_t len)
{
    *L = 1;
    const char *given = wflag_value(o, "--local-aggregate");
    if (given) {
        const ps_setting *r = ps_setting_at(PS_SET_local_aggregate);
        char *end;
        long v = strtol(given, &end, 10);
        if (*end || end == given || v < r->lo || v > r->hi || W % v) {
            snprintf(why, len,
                     P ": worker flag --local-aggregate must be %lld..%lld and divide the %d "
                       "workers (workers per host), got '%s'",
                     r->lo, r->hi, W, given);
            return PS_EINVAL;
        }
        *L = (int)v;
        return 0;
    }
    if (o->exec || !hf || o->mode != PS_MODE_SYNC)
        return 0;
    int per = 0;
    for (int h = 0; h < hf->n; h++) {
        int w = hf->hosts[h].workers;
        if (w == 0)
            continue;
        if (per && w != per)
            return 0;
        per = w;
    }
    *L = per > 1 ? per : 1;
    return 0;
}

/* Place ranks on hosts in hostfile order (host 1's servers= take the first
 * server ranks, and so on; the same for workers), then give every process its
 * endpoint or device. */
static void plan_place(const ps_launch_opts *o, const ps_launch_site *site, ps_launch_plan *p)
{
    const ps_launch_hostfile *hf = site->hostfile;
    int S = p->num_servers, W = p->num_workers, NP = p->server_procs;
    int local_idx[PS_LAUNCH_MAX_WORKERS]; /* a worker's index among those on its host */
    const ps_launch_host *whost[PS_LAUNCH_MAX_WORKERS];
    /* server process i: member i / S of group i % S */
    for (int i = 0; i < NP; i++)
        p->cmds[i].role = PS_LAUNCH_SERVER, p->cmds[i].rank = i % S, p->cmds[i].member = i / S;
    for (int r = 0; r < W; r++) {
        p->cmds[NP + r].role = PS_LAUNCH_WORKER, p->cmds[NP + r].rank = r;
        whost[r] = NULL, local_idx[r] = r;
    }
    if (hf) {
        int s = 0, w = 0;
        for (int h = 0; h < hf->n; h++) {
            for (int j = 0; j < hf->hosts[h].servers; j++)
                p->cmds[s++].host = hf->hosts[h].name;
            for (int j = 0; j < hf->hosts[h].workers; j++, w++) {
                p->cmds[NP + w].host = hf->hosts[h].name;
                whost[w] = &hf->hosts[h];
                local_idx[w] = j;
            }
        }
        /* member k of group g on the host of group (g + k) mod S's primary:
         * another host whenever the groups' primaries are spread over hosts */
        for (int i = S; i < NP; i++)
            p->cmds[i].host = p->cmds[(i % S + i / S) % S].host;
    }
    for (int i = 0; i < NP; i++) {
        ps_launch_cmd *c = &p->cmds[i];
        ps_strbuf e = {0};
        if (hf)
            ps_strbuf_addf(&e, "tcp://%s:%d", host_addr(c->host), o->base_port + i);
        else
            ps_strbuf_addf(&e, "tcp://127.0.0.1:%d", site->ports[i]);
        c->endpoint = ps_strbuf_take(&e);
    }
    const ps_strvec *gpus = gpu_list(o, site);
    for (int r = 0; r < W; r++) {
        ps_launch_cmd *c = &p->cmds[NP + r];
        /* one worker per GPU, round-robin; each sees only its GPU, as cuda:0 */
        char gpu[64] = "";
        if (!strcmp(o->gpus, "auto") && whost[r]) {
            if (whost[r]->gpus > 0)
                snprintf(gpu, sizeof gpu, "%d", local_idx[r] % whost[r]->gpus);
        } else if (gpus->n > 0) {
            snprintf(gpu, sizeof gpu, "%s", gpus->v[local_idx[r] % gpus->n]);
        }
        if (*gpu) {
            ps_strvec_pushf(&c->env, "CUDA_VISIBLE_DEVICES=%s", gpu);
            c->device = strdup("cuda:0");
        } else {
            c->device = strdup("cpu");
        }
    }
}

/* "--flag value" onto a. */
static void push_flag(ps_strvec *a, const char *flag, const char *value)
{
    ps_strvec_push(a, flag);
    ps_strvec_push(a, value);
}

static void push_flag_int(ps_strvec *a, const char *flag, int value)
{
    ps_strvec_push(a, flag);
    ps_strvec_pushf(a, "%d", value);
}

/* --timeline DIR/<role>-<rank>.json under --timeline-dir */
static void push_timeline(const ps_launch_opts *o, const ps_launch_cmd *c, ps_strvec *a)
{
    if (!o->timeline_dir)
        return;
    ps_strvec_push(a, "--timeline");
    ps_strvec_pushf(a, "%s/%s-%d.json", o->timeline_dir, ps_launch_role_name(c->role), c->rank);
}

/* --num-workers n, or in an elastic job MIN:MAX */
static void push_workers(ps_strvec *a, const ps_launch_plan *p, int n)
{
    ps_strvec_push(a, "--num-workers");
    if (p->num_workers_min > 0 && p->num_workers_min < p->num_workers)
        ps_strvec_pushf(a, "%d:%d", p->num_workers_min, p->num_workers);
    else
        ps_strvec_pushf(a, "%d", n);
}

static void server_args(const ps_launch_opts *o, const ps_launch_plan *p, const ps_launch_cmd *c,
                        int hostfile, ps_strvec *a)
{
    if (hostfile) {
        ps_strvec_push(a, "--bind");
        ps_strvec_pushf(a, "tcp://*:%d", o->base_port + c->rank + c->member * p->num_servers);
    } else {
        push_flag(a, "--bind", c->endpoint);
    }
    push_flag_int(a, "--rank", c->rank);
    push_flag_int(a, "--num-servers", p->num_servers);
    if (p->replicas) { /* its shard group: the members' endpoints, etcd, the job */
        ps_strbuf g = {0};
        for (int k = 0; k <= p->replicas; k++)
            ps_strbuf_addf(&g, "%s%s", k ? "|" : "", p->cmds[c->rank + k * p->num_servers].endpoint);
        push_flag(a, "--group", ps_strbuf_str(&g));
        ps_strbuf_free(&g);
        push_flag_int(a, "--member", c->member);
        push_flag(a, "--coord", o->coord);
        push_flag(a, "--job", o->job);
    }
    if (o->failure_timeout_ms != 1000) {
        ps_strvec_push(a, "--failure-timeout");
        ps_strvec_pushf(a, "%g", o->failure_timeout_ms / 1000.0);
    }
    /* with aggregation per host, each host's first worker is the servers' worker */
    push_workers(a, p, p->num_workers / p->local_aggregate);
    push_flag(a, "--mode", ps_launch_mode_name(o->mode));
    push_flag_int(a, "--threads", o->server_threads);
    if (hostfile) /* stop with the connection, even if the remote wrapper dies */
        ps_strvec_push(a, "--exit-on-stdin-eof");
    push_timeline(o, c, a);
    if (c->metrics_port)
        push_flag_int(a, "--metrics-port", c->metrics_port);
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        push_flag(a, o->shared.v[k], o->shared.v[k + 1]);
    wflag w;
    for (int k = 0; k < o->nwflags; k += w.words) {
        wflag_at(o->wflags, o->nwflags, k, &w);
        if (wflag_shared(&w) && w.val)
            push_flag(a, w.name, w.val);
    }
    for (int k = 0; k < o->server_args.n; k++)
        ps_strvec_push(a, o->server_args.v[k]);
}

static void worker_args(const ps_launch_opts *o, const ps_launch_plan *p, const ps_launch_cmd *c,
                        const char *servers, ps_strvec *a)
{
    push_flag(a, "--servers", servers);
    push_flag_int(a, "--rank", c->rank);
    push_workers(a, p, p->num_workers);
    push_flag(a, "--mode", ps_launch_mode_name(o->mode));
    if (o->failure_timeout_ms != 1000) {
        ps_strvec_push(a, "--failure-timeout");
        ps_strvec_pushf(a, "%g", o->failure_timeout_ms / 1000.0);
    }
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        push_flag(a, o->shared.v[k], o->shared.v[k + 1]);
    wflag w;
    for (int k = 0; k < o->nwflags; k += w.words) {
        wflag_at(o->wflags, o->nwflags, k, &w);
        if (wflag_output(&w) && c->rank != 0 && !strstr(w.val, "{rank}"))
            continue;
        for (int j = k; j < k + w.words; j++)
            push_subst_rank(a, o->wflags[j], c->rank);
    }
    push_flag(a, "--device", c->device);
    push_timeline(o, c, a);
    if (c->metrics_port)
        push_flag_int(a, "--metrics-port", c->metrics_port);
    if (p->local_aggregate > 1 && !wflag_value(o, "--local-aggregate"))
        push_flag_int(a, "--local-aggregate", p->local_aggregate);
}

/* The staleness the servers run with: 0 in sync, else the one given
 * (to ps_launch or among the worker flags), else -1 (unbounded). */
static const char *servers_staleness(const ps_launch_opts *o)
{
    if (o->mode == PS_MODE_SYNC)
        return "0";
    const char *v = own_shared(o, "--max-staleness");
    if (!v)
        v = wflag_value(o, "--max-staleness");
    return v ? v : "-1";
}

/* What ps_launch tells an --exec worker in the variable of setting id
 * (into buf), or NULL: what ps_worker would get as that flag. */
static const char *exec_value(const ps_launch_opts *o, const ps_launch_plan *p,
                              const ps_launch_cmd *c, const char *servers, int id, char *buf,
                              size_t len)
{
    switch (id) {
    case PS_SET_servers: return servers;
    case PS_SET_num_servers: snprintf(buf, len, "%d", p->num_servers); return buf;
    case PS_SET_rank: snprintf(buf, len, "%d", c->rank); return buf;
    case PS_SET_num_workers:
        if (p->num_workers_min > 0 && p->num_workers_min < p->num_workers) /* elastic */
            snprintf(buf, len, "%d:%d", p->num_workers_min, p->num_workers);
        else
            snprintf(buf, len, "%d", p->num_workers);
        return buf;
    case PS_SET_mode: return ps_launch_mode_name(o->mode);
    case PS_SET_max_staleness: return servers_staleness(o);
    case PS_SET_device: return c->device;
    case PS_SET_metrics_port:
        if (!c->metrics_port)
            return NULL;
        snprintf(buf, len, "%d", c->metrics_port);
        return buf;
    case PS_SET_server_timeout:
        /* without replicas a lost server is restarted from its checkpoint
         * and the workers wait for it: ps.torch's clients (which give up on
         * a silent server after 5 s unless told) wait as ps_worker does,
         * --server-timeout's default, unless the user's environment says */
        if (!p->restarts || o->replicas || getenv("PS_SERVER_TIMEOUT"))
            return NULL;
        return ps_setting_at(id)->def;
    case PS_SET_wrk_timeline:
        if (!o->timeline_dir)
            return NULL;
        snprintf(buf, len, "%s/worker-%d.json", o->timeline_dir, c->rank);
        return buf;
    default: /* a shared setting, when it was given */
        return ps_setting_at(id)->props & PS_SET_SHARED ? own_shared(o, ps_setting_at(id)->flag)
                                                        : NULL;
    }
}

/* An --exec worker: the program with {rank} replaced in its arguments, and
 * what ps_worker would get as flags in its environment: each setting's
 * first variable, then the optimizer's flags given as PS_<FLAG>. */
static void exec_args(const ps_launch_opts *o, const ps_launch_plan *p, ps_launch_cmd *c,
                      const char *servers, ps_strvec *a)
{
    for (int k = 0; k < o->nexec; k++)
        push_subst_rank(a, o->exec[k], c->rank);
    ps_strvec *e = &c->env;
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        char buf[4096];
        const char *v = r->env ? exec_value(o, p, c, servers, id, buf, sizeof buf) : NULL;
        if (v)
            ps_strvec_pushf(e, "%.*s=%s", (int)strcspn(r->env, " "), r->env, v);
    }
    for (int k = 0; k + 1 < o->shared.n; k += 2) {
        char name[64];
        if (ps_settings_opt_index(o->shared.v[k]) < 0)
            continue; /* a setting's, above */
        ps_settings_opt_env(o->shared.v[k], name, sizeof name);
        ps_strvec_pushf(e, "%s=%s", name, o->shared.v[k + 1]);
    }
}

int ps_launch_plan_sizes(const ps_launch_opts *o, const ps_launch_hostfile *hf, int *S, int *W,
                         char *why, size_t len)
{
    return plan_sizes(o, hf, S, W, why, len);
}

int ps_launch_metrics_ports(const ps_launch_opts *o, int S, int W, const int *free_ports,
                            int *ports, int *off, int *need_free, char *why, size_t len)
{
    *off = *need_free = 0;
    const char *v = o->metrics_port ? o->metrics_port : "auto";
    int n = 1 + S + W;
    long base;
    if (!strcmp(v, "off")) {
        *off = 1;
        return 0;
    }
    if (!strcmp(v, "auto")) {
        if (!o->hostfile) {
            if (!free_ports) {
                *need_free = 1;
                return 0;
            }
            memcpy(ports, free_ports, (size_t)n * sizeof *ports);
            return 0;
        }
        base = PS_LAUNCH_METRICS_BASE;
    } else {
        char *end;
        errno = 0;
        base = strtol(v, &end, 10);
        if (errno || end == v || *end || base < 1 || base > 65535) {
            snprintf(why, len, P ": --metrics-port must be auto, off or a port in [1, 65535], "
                     "got '%s'", v);
            return PS_EINVAL;
        }
    }
    if (base + n - 1 > 65535) {
        snprintf(why, len, P ": --metrics-port %ld: ps_launch, %d servers and %d workers need "
                 "ports %ld..%ld, past 65535; give a lower one", base, S, W, base,
                 base + n - 1);
        return PS_EINVAL;
    }
    for (int i = 0; i < n; i++)
        ports[i] = (int)base + i;
    return 0;
}

int ps_launch_plan_build(const ps_launch_opts *o, const ps_launch_site *site,
                         ps_launch_plan *p, char *why, size_t len)
{
    memset(p, 0, sizeof *p);
    const ps_launch_hostfile *hf = site->hostfile;
    int S, W, L, rc = plan_sizes(o, hf, &S, &W, why, len);
    if (rc || (rc = plan_aggregate(o, hf, W, &L, why, len)))
        return rc;
    if (o->replicas && !o->coord) {
        snprintf(why, len, P ": --replicas needs --coord: etcd's endpoints (--coord auto: "
                 "ps_launch runs one on this host)");
        return PS_EINVAL;
    }
    int NP = S * (1 + o->replicas);
    if (NP > PS_LAUNCH_MAX_SERVERS * 3 || (hf && o->base_port + NP - 1 > 65535)) {
        snprintf(why, len, P ": %d servers x %d members is too many processes (or ports past "
                 "65535)", S, 1 + o->replicas);
        return PS_EINVAL;
    }
    /* --workers MIN:MAX: an elastic job of W = MAX workers (with a hostfile,
     * its count) that goes on while MIN are left */
    int Wmin = o->workers_min > 0 && o->workers_min < W ? o->workers_min : W;
    if (Wmin < W && L > 1) {
        snprintf(why, len, P ": --workers %d:%d (an elastic job) does not take "
                 "--local-aggregate yet; run without it", Wmin, W);
        return PS_EINVAL;
    }
    if (o->workers_min > W) {
        snprintf(why, len, P ": --workers %d:%d: the hostfile places %d workers, fewer than MIN",
                 o->workers_min, o->workers, W);
        return PS_EINVAL;
    }
    p->num_workers_min = Wmin;
    p->worker_restarts = Wmin < W ? o->restart_workers : 0;
    p->restarts = o->restart_servers >= 0 ? o->restart_servers : o->replicas ? 10 : 0;
    if (p->restarts && !o->replicas) {
        int ckpt = 0;
        for (int k = 0; k < o->server_args.n; k++)
            ckpt |= !strncmp(o->server_args.v[k], "--checkpoint-dir", 16);
        if (!ckpt) {
            snprintf(why, len, P ": --restart-servers without --replicas restarts a server from "
                     "its checkpoint: give --server-arg --checkpoint-dir=DIR");
            return PS_EINVAL;
        }
    }
    p->cmds = calloc((size_t)(NP + W), sizeof *p->cmds);
    if (!p->cmds)
        return PS_ENOMEM;
    p->num_servers = S;
    p->num_workers = W;
    p->replicas = o->replicas;
    p->server_procs = NP;
    p->n = NP + W;
    p->mode = o->mode;
    p->exec = o->exec != NULL;
    p->local_aggregate = L;
    plan_place(o, site, p);
    for (int i = 0; site->metrics_ports && i < p->n; i++)
        p->cmds[i].metrics_port = site->metrics_ports[1 + i];

    ps_strbuf list = {0};
    ps_launch_server_list(p, &list);
    int oom = list.failed;
    for (int i = 0; i < p->n && !oom; i++) {
        ps_launch_cmd *c = &p->cmds[i];
        ps_strvec a = {0};
        if (c->role == PS_LAUNCH_WORKER && o->exec) {
            exec_args(o, p, c, ps_strbuf_str(&list), &a);
        } else {
            ps_strvec_pushf(&a, "%s/ps_%s", site->bin_dir, ps_launch_role_name(c->role));
            if (c->role == PS_LAUNCH_SERVER)
                server_args(o, p, c, hf != NULL, &a);
            else
                worker_args(o, p, c, ps_strbuf_str(&list), &a);
        }
        cmd_finish(c, &a, o, site);
        if (c->role == PS_LAUNCH_SERVER && p->restarts) {
            /* a new server for it: with replicas the same command (it copies the
             * group's state), else the same from its checkpoint */
            if (!p->replicas)
                ps_strvec_push(&a, "--restore");
            cmd_finish_into(&c->restart_argv, c, &a, o, site);
        }
        oom = a.failed || c->argv.failed || c->env.failed || c->restart_argv.failed ||
              (c->role == PS_LAUNCH_SERVER ? !c->endpoint : !c->device);
        ps_strvec_free(&a);
    }
    ps_strbuf_free(&list);
    if (oom) {
        snprintf(why, len, P ": out of memory");
        return PS_ENOMEM;
    }
    return 0;
}

void ps_launch_server_list(const ps_launch_plan *p, ps_strbuf *out)
{
    for (int g = 0; g < p->num_servers; g++)
        for (int k = 0; k <= p->replicas; k++) {
            const char *ep = p->cmds[g + k * p->num_servers].endpoint;
            ps_strbuf_addf(out, "%s%s", k ? "|" : g ? "," : "", ep ? ep : "");
        }
}

void ps_launch_plan_free(ps_launch_plan *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->cmds[i].endpoint);
        free(p->cmds[i].device);
        ps_strvec_free(&p->cmds[i].env);
        ps_strvec_free(&p->cmds[i].argv);
        ps_strvec_free(&p->cmds[i].restart_argv);
    }
    free(p->cmds);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ what it says */

int ps_launch_plan_notes(const ps_launch_opts *o, const ps_launch_site *site,
                         const ps_launch_plan *p, ps_strbuf *out)
{
    wflag w;
    for (int k = 0; k < o->nwflags; k += w.words) {
        wflag_at(o->wflags, o->nwflags, k, &w);
        if (wflag_output(&w) && !strstr(w.val, "{rank}") && p->num_workers > 1 &&
            (w.id != PS_SET_wrk_timeline || !o->timeline_dir))
            ps_strbuf_addf(out,
                           P ": %s '%s' goes to worker 0 only (put {rank} in the path for one "
                             "file per worker)\n",
                           w.name, w.val);
    }
    if (site->hostfile)
        return out->failed ? PS_ENOMEM : 0;
    const ps_strvec *gpus = gpu_list(o, site);
    int W = p->num_workers;
    if (!strcmp(o->gpus, "none")) {
        ps_strbuf_addf(out, P ": --gpus none, running %d CPU workers\n", W);
    } else if (gpus->n == 0) {
        ps_strbuf_addf(out, P ": no GPU found, running %d CPU workers\n", W);
    } else {
        ps_strbuf_addf(out, P ": %d GPU%s (", gpus->n, gpus->n == 1 ? "" : "s");
        for (int k = 0; k < gpus->n; k++)
            ps_strbuf_addf(out, "%s%s", k ? "," : "", gpus->v[k]);
        ps_strbuf_addf(out, "), %d worker%s, one per GPU round-robin\n", W, W == 1 ? "" : "s");
    }
    return out->failed ? PS_ENOMEM : 0;
}

int ps_launch_plan_print(const ps_launch_plan *p, ps_strbuf *out)
{
    ps_strbuf_addf(out, "# ps_launch plan: %d server%s", p->num_servers,
                   p->num_servers == 1 ? "" : "s");
    if (p->replicas)
        ps_strbuf_addf(out, " x %d members (--replicas %d)", 1 + p->replicas, p->replicas);
    ps_strbuf_addf(out, ", %d worker%s", p->num_workers, p->num_workers == 1 ? "" : "s");
    if (p->num_workers_min > 0 && p->num_workers_min < p->num_workers)
        ps_strbuf_addf(out, " (elastic: goes on while %d are left, %d new ones for lost ones)",
                       p->num_workers_min, p->worker_restarts);
    ps_strbuf_addf(out, ", mode %s\n", ps_launch_mode_name(p->mode));
    for (int i = 0; i < p->n; i++) {
        const ps_launch_cmd *c = &p->cmds[i];
        ps_strbuf_addf(out, "# %s %d", ps_launch_role_name(c->role), c->rank);
        if (c->role == PS_LAUNCH_SERVER && p->replicas)
            ps_strbuf_addf(out, " member %d", c->member);
        ps_strbuf_addf(out, " on %s", c->host ? c->host : "this host");
        if (c->role == PS_LAUNCH_SERVER)
            ps_strbuf_addf(out, ", reached at %s\n", c->endpoint);
        else
            ps_strbuf_addf(out, ", device %s\n", c->device);
        for (int k = 0; !c->host && k < c->env.n; k++) {
            /* NAME=value with the value quoted, so it stays an assignment */
            const char *eq = strchr(c->env.v[k], '=');
            size_t n = eq ? (size_t)(eq - c->env.v[k]) + 1 : 0;
            ps_strbuf_addn(out, c->env.v[k], n);
            sh_quote(out, c->env.v[k] + n);
            ps_strbuf_add(out, " ");
        }
        for (int k = 0; k < c->argv.n; k++) {
            if (k)
                ps_strbuf_add(out, " ");
            sh_quote(out, c->argv.v[k]);
        }
        ps_strbuf_add(out, "\n");
    }
    return out->failed ? PS_ENOMEM : 0;
}

int ps_launch_plan_outputs(const ps_launch_plan *p, ps_strvec *out)
{
    for (int i = 0; i < p->n; i++) {
        const ps_launch_cmd *c = &p->cmds[i];
        if (c->host || c->role != PS_LAUNCH_WORKER || p->exec)
            continue; /* the flags of an --exec program are its own */
        /* after the program, the flags as ps_worker takes them */
        wflag w;
        for (int k = 1; k < c->argv.n; k += w.words) {
            wflag_at(c->argv.v, c->argv.n, k, &w);
            if (wflag_output(&w)) {
                ps_strvec_push(out, w.name);
                ps_strvec_push(out, w.val);
            }
        }
    }
    return out->failed ? PS_ENOMEM : 0;
}
