/* ps_launch's command line (launch/plan.h): its own flags, read through
 * the settings table, and the worker flags after "--", checked as ps_worker
 * and ps_server would check them before anything starts; and what it
 * takes from this host (the GPUs, the directory of the programs).  The plan
 * built from them is plan.c's. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_internal.h"
#include "ps_error.h"
#include "ps_flags.h"
#include "ps_opt_table.h"

/* ------------------------------------------------------------ worker flags */

/* The worker flag at v[k] (of n arguments). */
void wflag_at(char *const *v, int n, int k, wflag *w)
{
    const char *a = v[k], *eq = strchr(a, '=');
    w->id = strncmp(a, "--", 2) == 0 ? ps_setting_find(PS_PROG_WORKER, a) : -1;
    w->opt = w->id < 0 && ps_settings_opt_index(a) >= 0;
    snprintf(w->name, sizeof w->name, "%.*s", (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
    w->val = NULL;
    w->words = 1;
    if (!w->opt && (w->id < 0 || !ps_setting_at(w->id)->arg[0]))
        return;
    if (eq)
        w->val = eq + 1;
    else if (k + 1 < n)
        w->val = v[k + 1], w->words = 2;
}

/* Does ps_launch give it to the servers too? */
int wflag_shared(const wflag *w)
{
    return w->opt || (w->id >= 0 && (ps_setting_at(w->id)->props & PS_SET_SHARED));
}

/* Is it a file the worker writes (only worker 0 gets it without {rank})? */
int wflag_output(const wflag *w)
{
    return w->id >= 0 && (ps_setting_at(w->id)->props & PS_SET_OUTPUT) && w->val;
}

/* The value given among the worker flags for `flag`, or NULL. */
const char *wflag_value(const ps_launch_opts *o, const char *flag)
{
    wflag w;
    for (int k = 0; k < o->nwflags; k += w.words) {
        wflag_at(o->wflags, o->nwflags, k, &w);
        if (!strcmp(w.name, flag) && w.val)
            return w.val;
    }
    return NULL;
}

/* Push the words of s (split at spaces and tabs) onto a. */
void push_words(ps_strvec *a, const char *s)
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
    char what[96];
    snprintf(what, sizeof what, "%s%s", kind, flag);
    int id = ps_setting_find(PS_PROG_SERVER | PS_PROG_WORKER, flag);
    if (id >= 0) {
        long long v;
        if (ps_setting_parse_value(P, what, ps_setting_at(id), val, &v, why, len))
            return PS_EINVAL;
        /* ps_server refuses any other staleness in sync mode */
        if (id == PS_SET_max_staleness && v != 0 && o->mode == PS_MODE_SYNC) {
            snprintf(why, len, P ": %s must be 0 with --mode sync, got '%s'", what, val);
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
const char *own_shared(const ps_launch_opts *o, const char *flag)
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
    wflag w;
    for (int i = 0; i < o->nwflags; i += w.words) {
        wflag_at(o->wflags, o->nwflags, i, &w);
        if (!strcmp(w.name, "--exec")) {
            snprintf(why, len,
                     P ": --exec goes before -- (the flags after -- are ps_worker's); "
                       "e.g. ps_launch --servers 1 --workers 2 --exec python3 train.py");
            return PS_EINVAL;
        }
        if (wflag_shared(&w) && own_shared(o, w.name)) {
            snprintf(why, len,
                     P ": %s is given to ps_launch and among the worker flags; give it once",
                     w.name);
            return PS_EINVAL;
        }
        if (w.id >= 0 && (ps_setting_at(w.id)->props & PS_SET_BY_LAUNCH)) {
            snprintf(why, len,
                     P ": %s is set by ps_launch for each worker; remove it from the worker "
                       "flags%s",
                     w.name,
                     w.id == PS_SET_mode     ? " (use ps_launch --mode)"
                     : w.id == PS_SET_device ? " (use ps_launch --gpus)"
                                             : "");
            return PS_EINVAL;
        }
        if (o->timeline_dir && w.id == PS_SET_wrk_timeline) {
            snprintf(why, len,
                     P ": --timeline in the worker flags conflicts with --timeline-dir; "
                       "give one of them");
            return PS_EINVAL;
        }
        /* the values the servers get, taken as server_args forwards them */
        if (!w.val && (w.opt || (w.id >= 0 && ps_setting_at(w.id)->arg[0]))) {
            snprintf(why, len, P ": worker flag %s needs a value", w.name);
            return PS_EINVAL;
        }
        if (wflag_shared(&w) && check_shared(o, "worker flag ", w.name, w.val, why, len))
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

/* Where each of ps_launch's own settings lives. */
static const ps_setting_field fields[] = {PS_SETTING_FIELDS(LAUNCH)};

/* ps_launch's flags the table leaves to it, and the shared ones (id -1: the
 * optimizer's), kept as text. */
static int own_flag(void *ctx, int id, const char *flag, const char *val, char *why, size_t len)
{
    ps_launch_opts *o = ctx;
    if (id == PS_SET_server_arg)
        return ps_strvec_push(&o->server_args, val) ? PS_ENOMEM : 0;
    if (id == PS_SET_ssh_opt) {
        int before = o->ssh_opts.n;
        push_words(&o->ssh_opts, val);
        if (o->ssh_opts.failed)
            return PS_ENOMEM;
        if (o->ssh_opts.n == before) {
            snprintf(why, len, P ": --ssh-opt needs ssh options, e.g. --ssh-opt '-p 2222'");
            return PS_EINVAL;
        }
        return 0;
    }
    /* a shared flag: checked after the loop (--max-staleness depends on --mode) */
    return set_own_shared(o, flag, val);
}

int ps_launch_parse(int argc, char **argv, ps_launch_opts *o, char *why, size_t len)
{
    memset(o, 0, sizeof *o);
    int nfields = (int)(sizeof fields / sizeof fields[0]);
    ps_settings_defaults(PS_PROG_LAUNCH, fields, nfields, o);
    ps_settings_cmd c = {.prog = P, .program = PS_PROG_LAUNCH, .cfg = o, .fields = fields,
                         .nfields = nfields, .shared = 1, .dashdash = 1,
                         .hint = "; worker flags go after --", .own = own_flag, .ctx = o};
    int rc = ps_settings_parse(&c, argc, argv, why, len);
    if (rc)
        return rc;
    o->help = c.help;
    if (o->help)
        return 0;
    if (c.rest) {
        if (c.rest >= argc || !*argv[c.rest]) {
            snprintf(why, len,
                     P ": --exec needs a program and its arguments, e.g. --exec python3 "
                       "train.py --epochs 2");
            return PS_EINVAL;
        }
        o->exec = argv + c.rest;
        o->nexec = argc - c.rest;
    } else {
        o->wflags = argv + c.next;
        o->nwflags = argc - c.next;
    }
    if (!o->hostfile && !o->servers) {
        snprintf(why, len, P ": --servers is required (see --help)");
        return PS_EINVAL;
    }
    if (!o->hostfile && !o->workers) {
        snprintf(why, len, P ": --workers is required (see --help)");
        return PS_EINVAL;
    }
    rc = check_worker_flags(o, why, len);
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
