#include "plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_opt_table.h"
#include "remote.h"

#define P "ps_launch"

const char *ps_launch_role_name(int role)
{
    return role == PS_LAUNCH_SERVER ? "server" : "worker";
}

/* ------------------------------------------------------------ worker flags */

/* Worker flags that the servers get too, with the same value (the worker
 * checks them against the servers at hello, so both sides must be given the
 * same): the optimizer's, from its table (include/ps_types.h, one row per
 * hyper-parameter), then these.  ps_launch_parse checks the values before
 * anything starts, ps_launch_plan_build forwards them, --help lists them. */
static const char *const other_shared_flags[] = {"--max-staleness", "--curve-keys", "--shm",
                                                 "--wire-dtype", NULL};

static int nopt_flags(void)
{
    int n = 0;
    while (ps_opt_flag_names()[n])
        n++;
    return n;
}

/* Worker flags the launcher sets itself, per worker. */
static const char *const reserved_flags[] = {"--servers", "--rank", "--num-workers", "--mode",
                                             "--device", NULL};
/* Worker flags naming an output file: without {rank} in the value, only
 * worker 0 gets them, so W workers do not write over one file. */
static const char *const per_worker_file_flags[] = {"--log-csv", "--timeline", "--save", NULL};

const char *ps_launch_shared_flag(int i)
{
    int n = nopt_flags();
    if (i < 0)
        return NULL;
    if (i < n)
        return ps_opt_flag_names()[i];
    for (int k = 0; other_shared_flags[k]; k++)
        if (i - n == k)
            return other_shared_flags[k];
    return NULL;
}

/* The shared flags as a NULL-terminated list, for ps_flag_value. */
static const char *const *shared_flag_list(void)
{
    static const char *list[64];
    if (!list[0])
        for (int i = 0; i < 63 && ps_launch_shared_flag(i); i++)
            list[i] = ps_launch_shared_flag(i);
    return list;
}

static int shared_flag(const char *s)
{
    for (int i = 0; ps_launch_shared_flag(i); i++)
        if (!strcmp(ps_launch_shared_flag(i), s))
            return 1;
    return 0;
}

void ps_launch_shared_env_name(const char *flag, char *out, size_t len)
{
    size_t n = 0;
    while (*flag == '-')
        flag++;
    for (const char *p = "PS_"; *p && n + 1 < len; p++)
        out[n++] = *p;
    for (; *flag && n + 1 < len; flag++)
        out[n++] = *flag == '-' ? '_' : (char)(*flag >= 'a' && *flag <= 'z' ? *flag - 32 : *flag);
    if (len)
        out[n < len ? n : len - 1] = 0;
}

static int in_list(const char *const *list, const char *s)
{
    for (; *list; list++)
        if (!strcmp(*list, s))
            return 1;
    return 0;
}

/* Push the words of s (split at spaces and tabs) onto a. */
static void push_words(ps_strvec *a, const char *s)
{
    for (;;) {
        s += strspn(s, " \t");
        size_t n = strcspn(s, " \t");
        if (!n)
            return;
        char *w = strndup(s, n);
        if (!w || ps_strvec_push(a, w))
            a->failed = 1;
        free(w);
        s += n;
    }
}

/* A shared flag's value, checked as ps_server and ps_worker check it; kind
 * is "worker flag " for one among the worker flags, else "". */
static int check_shared(const ps_launch_opts *o, const char *kind, const char *flag,
                        const char *val, char *why, size_t len)
{
    char what[64];
    snprintf(what, sizeof what, "%s%s", kind, flag);
    if (!strcmp(flag, "--max-staleness")) {
        long long iv;
        if (ps_parse_int(P, what, val, -1, PS_MAX_STALENESS, &iv, why, len))
            return PS_EINVAL;
        /* ps_server refuses any other staleness in sync mode */
        if (iv != 0 && !strcmp(o->mode, "sync")) {
            snprintf(why, len, P ": %s must be 0 with --mode sync, got '%s'", what, val);
            return PS_EINVAL;
        }
        return 0;
    }
    if (!strcmp(flag, "--shm")) {
        if (strcmp(val, "auto") && strcmp(val, "off")) {
            snprintf(why, len, P ": %s must be auto or off, got '%s'", what, val);
            return PS_EINVAL;
        }
        return 0;
    }
    if (!strcmp(flag, "--wire-dtype")) {
        static const char *const ok[] = {"f32", "float32", "bf16", "bfloat16", "f16", "float16",
                                         "fp16", NULL};
        if (!in_list(ok, val)) {
            snprintf(why, len, P ": %s must be f32, bf16 or f16, got '%s'", what, val);
            return PS_EINVAL;
        }
        return 0;
    }
    if (!strcmp(flag, "--curve-keys")) {
        if (!*val || strlen(val) > 900) {
            snprintf(why, len, P ": %s needs a path of 1..900 characters, got '%s'", what, val);
            return PS_EINVAL;
        }
        return 0;
    }
    /* the optimizer's: its table's ranges, its message after "worker flag" */
    ps_opt_config scratch;
    memset(&scratch, 0, sizeof scratch);
    char msg[512];
    int handled = 0;
    if (ps_opt_flag(P, flag, val, &scratch, &handled, msg, sizeof msg) == 0)
        return 0;
    const char *rest = strncmp(msg, P ": ", strlen(P ": ")) == 0 ? msg + strlen(P ": ") : msg;
    snprintf(why, len, P ": %s%s", kind, rest);
    return PS_EINVAL;
}

/* The value of shared flag `flag` given to ps_launch itself, or NULL. */
static const char *own_shared(const ps_launch_opts *o, const char *flag)
{
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        if (!strcmp(o->shared.v[k], flag))
            return o->shared.v[k + 1];
    return NULL;
}

/* Record a shared flag given to ps_launch itself (a later one replaces the
 * value of an earlier one, as the programs take the last). */
static int set_own_shared(ps_launch_opts *o, const char *flag, const char *val)
{
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        if (!strcmp(o->shared.v[k], flag)) {
            char *v = strdup(val);
            if (!v)
                return PS_ENOMEM;
            free(o->shared.v[k + 1]);
            o->shared.v[k + 1] = v;
            return 0;
        }
    if (ps_strvec_push(&o->shared, flag) || ps_strvec_push(&o->shared, val))
        return PS_ENOMEM;
    return 0;
}

/* The shared flags and the worker flags: none that the launcher sets, a
 * shared flag given once, and every value that the servers get too is one
 * they accept, so a bad one stops ps_launch before it starts a cluster that
 * would die of it. */
static int check_worker_flags(const ps_launch_opts *o, char *why, size_t len)
{
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        if (check_shared(o, "", o->shared.v[k], o->shared.v[k + 1], why, len))
            return PS_EINVAL;
    for (int i = 0; i < o->nwflags; i++) {
        const char *a = o->wflags[i];
        if (!strcmp(a, "--exec")) {
            snprintf(why, len,
                     P ": --exec goes before -- (the flags after -- are ps_worker's); "
                       "e.g. ps_launch --servers 1 --workers 2 --exec python3 train.py");
            return PS_EINVAL;
        }
        if (shared_flag(a) && own_shared(o, a)) {
            snprintf(why, len,
                     P ": %s is given to ps_launch and among the worker flags; give it once", a);
            return PS_EINVAL;
        }
        if (in_list(reserved_flags, a)) {
            snprintf(why, len,
                     P ": %s is set by ps_launch for each worker; remove it from the worker "
                       "flags%s",
                     a,
                     !strcmp(a, "--mode")     ? " (use ps_launch --mode)"
                     : !strcmp(a, "--device") ? " (use ps_launch --gpus)"
                                              : "");
            return PS_EINVAL;
        }
        if (o->timeline_dir && !strcmp(a, "--timeline")) {
            snprintf(why, len,
                     P ": --timeline in the worker flags conflicts with --timeline-dir; "
                       "give one of them");
            return PS_EINVAL;
        }
    }
    /* the values the servers get, taken as server_args forwards them */
    for (int i = 0; i < o->nwflags; i++) {
        const char *a = o->wflags[i];
        int f = shared_flag(a);
        if (!f && !in_list(per_worker_file_flags, a))
            continue;
        if (i + 1 >= o->nwflags) {
            snprintf(why, len, P ": worker flag %s needs a value", a);
            return PS_EINVAL;
        }
        if (f && check_shared(o, "worker flag ", a, o->wflags[++i], why, len))
            return PS_EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------ ps_launch flags */

static int parse_gpu_list(const char *spec, ps_strvec *ids, char *why, size_t len)
{
    const char *p = spec;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char id[32] = "", tmp[8];
        long long v;
        if (n < sizeof id)
            memcpy(id, p, n), id[n] = 0;
        if (n >= sizeof id ||
            ps_parse_int(P, "--gpus", id, 0, PS_LAUNCH_MAX_GPU_ID, &v, tmp, sizeof tmp)) {
            snprintf(why, len,
                     P ": --gpus must be auto, none or a list of GPU ids in [0, %d] like 0,1, "
                       "got '%s'",
                     PS_LAUNCH_MAX_GPU_ID, spec);
            return PS_EINVAL;
        }
        if (ps_strvec_pushf(ids, "%lld", v))
            return PS_ENOMEM;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

int ps_launch_parse(int argc, char **argv, ps_launch_opts *o, char *why, size_t len)
{
    memset(o, 0, sizeof *o);
    o->mode = "sync";
    o->gpus = "auto";
    o->server_threads = 1;
    o->base_port = 29500;
    long long v;

    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "--version")) {
            o->help_arg = a;
            return 0;
        }
        if (!strcmp(a, "--dry-run")) {
            o->dry_run = 1;
            continue;
        }
        static const char *const valued[] = {
            "--servers",  "--workers",  "--gpus",     "--mode",       "--server-threads",
            "--timeline-dir", "--bin-dir", "--hostfile", "--base-port", "--server-arg",
            "--ssh-opt", NULL};
        if (!strcmp(a, "--exec")) {
            if (i + 1 >= argc || !*argv[i + 1]) {
                snprintf(why, len,
                         P ": --exec needs a program and its arguments, e.g. --exec python3 "
                           "train.py --epochs 2");
                return PS_EINVAL;
            }
            o->exec = argv + i + 1;
            o->nexec = argc - i - 1;
            i = argc;
            break;
        }
        const char *val, *name = ps_flag_value(argc, argv, &i, valued, &val);
        int shared = 0;
        if (!name)
            shared = (name = ps_flag_value(argc, argv, &i, shared_flag_list(), &val)) != NULL;
        if (!name) {
            if (strncmp(a, "--", 2) == 0)
                snprintf(why, len, P ": unknown flag '%s' (see --help; worker flags go after --)",
                         a);
            else
                snprintf(why, len, P ": unexpected argument '%s' (worker flags go after --)", a);
            return PS_EINVAL;
        }
        if (!val) {
            snprintf(why, len, P ": %s needs a value (see --help)", name);
            return PS_EINVAL;
        }
        if (shared) {
            /* checked after the loop: --max-staleness depends on --mode */
            if (set_own_shared(o, name, val))
                return PS_ENOMEM;
        } else if (!strcmp(name, "--servers")) {
            if (ps_parse_int(P, name, val, 1, PS_LAUNCH_MAX_SERVERS, &v, why, len))
                return PS_EINVAL;
            o->servers = (int)v;
        } else if (!strcmp(name, "--workers")) {
            if (ps_parse_int(P, name, val, 1, PS_LAUNCH_MAX_WORKERS, &v, why, len))
                return PS_EINVAL;
            o->workers = (int)v;
        } else if (!strcmp(name, "--server-threads")) {
            /* ps_server --threads takes no more */
            if (ps_parse_int(P, name, val, 1, PS_SERVER_MAX_THREADS, &v, why, len))
                return PS_EINVAL;
            o->server_threads = (int)v;
        } else if (!strcmp(name, "--base-port")) {
            if (ps_parse_int(P, name, val, 1, 65535, &v, why, len))
                return PS_EINVAL;
            o->base_port = (int)v;
        } else if (!strcmp(name, "--mode")) {
            if (strcmp(val, "sync") && strcmp(val, "async")) {
                snprintf(why, len, P ": --mode must be sync or async, got '%s'", val);
                return PS_EINVAL;
            }
            o->mode = val;
        } else if (!strcmp(name, "--gpus")) {
            o->gpus = val;
        } else if (!strcmp(name, "--server-arg")) {
            if (ps_strvec_push(&o->server_args, val))
                return PS_ENOMEM;
        } else if (!strcmp(name, "--ssh-opt")) {
            int before = o->ssh_opts.n;
            push_words(&o->ssh_opts, val);
            if (o->ssh_opts.failed)
                return PS_ENOMEM;
            if (o->ssh_opts.n == before) {
                snprintf(why, len, P ": --ssh-opt needs ssh options, e.g. --ssh-opt '-p 2222'");
                return PS_EINVAL;
            }
        } else { /* --timeline-dir, --bin-dir, --hostfile */
            if (!*val) {
                snprintf(why, len, P ": %s must not be empty", name);
                return PS_EINVAL;
            }
            if (!strcmp(name, "--timeline-dir"))
                o->timeline_dir = val;
            else if (!strcmp(name, "--bin-dir"))
                o->bin_dir = val;
            else
                o->hostfile = val;
        }
    }
    o->wflags = argv + i;
    o->nwflags = argc > i ? argc - i : 0;

    if (!o->hostfile && !o->servers) {
        snprintf(why, len, P ": --servers is required (see --help)");
        return PS_EINVAL;
    }
    if (!o->hostfile && !o->workers) {
        snprintf(why, len, P ": --workers is required (see --help)");
        return PS_EINVAL;
    }
    int rc = check_worker_flags(o, why, len);
    if (rc)
        return rc;
    if (strcmp(o->gpus, "none") && strcmp(o->gpus, "auto"))
        return parse_gpu_list(o->gpus, &o->gpu_ids, why, len);
    return 0;
}

void ps_launch_opts_free(ps_launch_opts *o)
{
    ps_strvec_free(&o->gpu_ids);
    ps_strvec_free(&o->server_args);
    ps_strvec_free(&o->shared);
    ps_strvec_free(&o->ssh_opts);
}

/* ------------------------------------------------------------ this host */

int ps_launch_gpus_auto(const char *cvd, int count, ps_strvec *ids)
{
    if (!cvd) {
        for (int i = 0; i < count; i++)
            if (ps_strvec_pushf(ids, "%d", i))
                return PS_ENOMEM;
        return 0;
    }
    for (const char *t = cvd; *t;) {
        size_t n = strcspn(t, ",");
        /* "-1" or "NoDevFiles" hide every GPU */
        if ((n == 2 && !strncmp(t, "-1", 2)) || (n == 10 && !strncmp(t, "NoDevFiles", 10))) {
            ps_strvec_free(ids);
            return 0;
        }
        if (n > 0 && ps_strvec_pushf(ids, "%.*s", (int)n, t))
            return PS_ENOMEM;
        t += n + (t[n] == ',');
    }
    return 0;
}

char *ps_launch_bin_dir(const ps_launch_opts *o, const char *exe_dir, const char *cwd)
{
    size_t n = strlen(cwd);
    if (o->bin_dir)
        return strdup(o->bin_dir);
    if (o->hostfile && !strcmp(exe_dir, cwd))
        return strdup(".");
    if (o->hostfile && !strncmp(exe_dir, cwd, n) && exe_dir[n] == '/' && n > 1)
        return strdup(exe_dir + n + 1);
    return strdup(exe_dir);
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
static void cmd_finish(ps_launch_cmd *cmd, const ps_strvec *args, const ps_launch_opts *o,
                       const ps_launch_site *site)
{
    if (!cmd->host) {
        for (int i = 0; i < args->n; i++)
            ps_strvec_push(&cmd->argv, args->v[i]);
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
    push_words(&cmd->argv, site->ssh && *site->ssh ? site->ssh : "ssh");
    for (int i = 0; i < o->ssh_opts.n; i++)
        ps_strvec_push(&cmd->argv, o->ssh_opts.v[i]);
    ps_strvec_push(&cmd->argv, "-o");
    ps_strvec_push(&cmd->argv, "BatchMode=yes");
    ps_strvec_push(&cmd->argv, cmd->host);
    if (r.failed)
        cmd->argv.failed = 1;
    else
        ps_strvec_push(&cmd->argv, ps_strbuf_str(&r));
    ps_strbuf_free(&r);
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
    for (int k = 0; k + 1 < o->nwflags; k++)
        if (!strcmp(o->wflags[k], "--local-aggregate")) {
            char *end;
            long v = strtol(o->wflags[k + 1], &end, 10);
            if (*end || end == o->wflags[k + 1] || v < 1 || v > 64 || W % v) {
                snprintf(why, len,
                         P ": worker flag --local-aggregate must be 1..64 and divide the %d "
                           "workers (workers per host), got '%s'",
                         W, o->wflags[k + 1]);
                return PS_EINVAL;
            }
            *L = (int)v;
            return 0;
        }
    if (o->exec || !hf || strcmp(o->mode, "sync"))
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
    int S = p->num_servers, W = p->num_workers;
    int local_idx[PS_LAUNCH_MAX_WORKERS]; /* a worker's index among those on its host */
    const ps_launch_host *whost[PS_LAUNCH_MAX_WORKERS];
    for (int r = 0; r < S; r++)
        p->cmds[r].role = PS_LAUNCH_SERVER, p->cmds[r].rank = r;
    for (int r = 0; r < W; r++) {
        p->cmds[S + r].role = PS_LAUNCH_WORKER, p->cmds[S + r].rank = r;
        whost[r] = NULL, local_idx[r] = r;
    }
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
    }
    for (int r = 0; r < S; r++) {
        ps_launch_cmd *c = &p->cmds[r];
        ps_strbuf e = {0};
        if (hf)
            ps_strbuf_addf(&e, "tcp://%s:%d", host_addr(c->host), o->base_port + r);
        else
            ps_strbuf_addf(&e, "tcp://127.0.0.1:%d", site->ports[r]);
        c->endpoint = ps_strbuf_take(&e);
    }
    const ps_strvec *gpus = gpu_list(o, site);
    for (int r = 0; r < W; r++) {
        ps_launch_cmd *c = &p->cmds[S + r];
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

static void server_args(const ps_launch_opts *o, const ps_launch_plan *p, const ps_launch_cmd *c,
                        int hostfile, ps_strvec *a)
{
    if (hostfile) {
        ps_strvec_push(a, "--bind");
        ps_strvec_pushf(a, "tcp://*:%d", o->base_port + c->rank);
    } else {
        push_flag(a, "--bind", c->endpoint);
    }
    push_flag_int(a, "--rank", c->rank);
    push_flag_int(a, "--num-servers", p->num_servers);
    /* with aggregation per host, each host's first worker is the servers' worker */
    push_flag_int(a, "--num-workers", p->num_workers / p->local_aggregate);
    push_flag(a, "--mode", o->mode);
    push_flag_int(a, "--threads", o->server_threads);
    if (hostfile) /* stop with the connection, even if the remote wrapper dies */
        ps_strvec_push(a, "--exit-on-stdin-eof");
    push_timeline(o, c, a);
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        push_flag(a, o->shared.v[k], o->shared.v[k + 1]);
    for (int k = 0; k + 1 < o->nwflags; k++)
        if (shared_flag(o->wflags[k])) {
            push_flag(a, o->wflags[k], o->wflags[k + 1]);
            k++;
        }
    for (int k = 0; k < o->server_args.n; k++)
        ps_strvec_push(a, o->server_args.v[k]);
}

static int has_wflag(const ps_launch_opts *o, const char *flag)
{
    for (int k = 0; k < o->nwflags; k++)
        if (!strcmp(o->wflags[k], flag))
            return 1;
    return 0;
}

static void worker_args(const ps_launch_opts *o, const ps_launch_plan *p, const ps_launch_cmd *c,
                        const char *servers, ps_strvec *a)
{
    push_flag(a, "--servers", servers);
    push_flag_int(a, "--rank", c->rank);
    push_flag_int(a, "--num-workers", p->num_workers);
    push_flag(a, "--mode", o->mode);
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        push_flag(a, o->shared.v[k], o->shared.v[k + 1]);
    for (int k = 0; k < o->nwflags; k++) {
        const char *f = o->wflags[k];
        if (in_list(per_worker_file_flags, f) && k + 1 < o->nwflags) {
            const char *v = o->wflags[++k];
            if (c->rank == 0 || strstr(v, "{rank}")) {
                ps_strvec_push(a, f);
                push_subst_rank(a, v, c->rank);
            }
            continue;
        }
        push_subst_rank(a, f, c->rank);
    }
    push_flag(a, "--device", c->device);
    push_timeline(o, c, a);
    if (p->local_aggregate > 1 && !has_wflag(o, "--local-aggregate"))
        push_flag_int(a, "--local-aggregate", p->local_aggregate);
}

/* The staleness the servers run with: 0 in sync, else the one given
 * (to ps_launch or among the worker flags), else -1 (unbounded). */
static const char *servers_staleness(const ps_launch_opts *o)
{
    if (!strcmp(o->mode, "sync"))
        return "0";
    const char *v = own_shared(o, "--max-staleness");
    for (int k = 0; !v && k + 1 < o->nwflags; k++)
        if (!strcmp(o->wflags[k], "--max-staleness"))
            v = o->wflags[k + 1];
    return v ? v : "-1";
}

/* An --exec worker: the program with {rank} replaced in its arguments, and
 * what ps_worker would get as flags in its environment. */
static void exec_args(const ps_launch_opts *o, const ps_launch_plan *p, ps_launch_cmd *c,
                      const char *servers, ps_strvec *a)
{
    for (int k = 0; k < o->nexec; k++)
        push_subst_rank(a, o->exec[k], c->rank);
    ps_strvec *e = &c->env;
    ps_strvec_pushf(e, "PS_SERVERS=%s", servers);
    ps_strvec_pushf(e, "PS_NUM_SERVERS=%d", p->num_servers);
    ps_strvec_pushf(e, "PS_RANK=%d", c->rank);
    ps_strvec_pushf(e, "PS_NUM_WORKERS=%d", p->num_workers);
    ps_strvec_pushf(e, "PS_MODE=%s", o->mode);
    ps_strvec_pushf(e, "PS_MAX_STALENESS=%s", servers_staleness(o));
    ps_strvec_pushf(e, "PS_DEVICE=%s", c->device);
    if (o->timeline_dir)
        ps_strvec_pushf(e, "PS_TIMELINE=%s/worker-%d.json", o->timeline_dir, c->rank);
    for (int k = 0; k + 1 < o->shared.n; k += 2) {
        char name[64];
        if (!strcmp(o->shared.v[k], "--max-staleness"))
            continue; /* PS_MAX_STALENESS above */
        ps_launch_shared_env_name(o->shared.v[k], name, sizeof name);
        ps_strvec_pushf(e, "%s=%s", name, o->shared.v[k + 1]);
    }
}

int ps_launch_plan_build(const ps_launch_opts *o, const ps_launch_site *site,
                         ps_launch_plan *p, char *why, size_t len)
{
    memset(p, 0, sizeof *p);
    const ps_launch_hostfile *hf = site->hostfile;
    int S, W, L, rc = plan_sizes(o, hf, &S, &W, why, len);
    if (rc || (rc = plan_aggregate(o, hf, W, &L, why, len)))
        return rc;
    p->cmds = calloc((size_t)(S + W), sizeof *p->cmds);
    if (!p->cmds)
        return PS_ENOMEM;
    p->num_servers = S;
    p->num_workers = W;
    p->n = S + W;
    p->mode = o->mode;
    p->exec = o->exec != NULL;
    p->local_aggregate = L;
    plan_place(o, site, p);

    ps_strbuf list = {0};
    for (int r = 0; r < S; r++)
        ps_strbuf_addf(&list, "%s%s", r ? "," : "", p->cmds[r].endpoint ? p->cmds[r].endpoint : "");
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
        oom = a.failed || c->argv.failed || c->env.failed ||
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

void ps_launch_plan_free(ps_launch_plan *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->cmds[i].endpoint);
        free(p->cmds[i].device);
        ps_strvec_free(&p->cmds[i].env);
        ps_strvec_free(&p->cmds[i].argv);
    }
    free(p->cmds);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ what it says */

int ps_launch_plan_notes(const ps_launch_opts *o, const ps_launch_site *site,
                         const ps_launch_plan *p, ps_strbuf *out)
{
    for (int k = 0; k + 1 < o->nwflags; k++)
        if (in_list(per_worker_file_flags, o->wflags[k]) && !strstr(o->wflags[k + 1], "{rank}") &&
            p->num_workers > 1 && (strcmp(o->wflags[k], "--timeline") || !o->timeline_dir))
            ps_strbuf_addf(out,
                           P ": %s '%s' goes to worker 0 only (put {rank} in the path for one "
                             "file per worker)\n",
                           o->wflags[k], o->wflags[k + 1]);
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
    ps_strbuf_addf(out, "# ps_launch plan: %d server%s, %d worker%s, mode %s\n", p->num_servers,
                   p->num_servers == 1 ? "" : "s", p->num_workers, p->num_workers == 1 ? "" : "s",
                   p->mode);
    for (int i = 0; i < p->n; i++) {
        const ps_launch_cmd *c = &p->cmds[i];
        ps_strbuf_addf(out, "# %s %d on %s", ps_launch_role_name(c->role), c->rank,
                       c->host ? c->host : "this host");
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
        /* after the program; a file flag takes the next word, as in worker_args */
        for (int k = 1; k + 1 < c->argv.n; k++)
            if (in_list(per_worker_file_flags, c->argv.v[k])) {
                ps_strvec_push(out, c->argv.v[k]);
                ps_strvec_push(out, c->argv.v[++k]);
            }
    }
    return out->failed ? PS_ENOMEM : 0;
}
