/* ps_launch: start S ps_server and W ps_worker processes on this host (or on
 * the hosts of a hostfile, over ssh), print every line they write prefixed
 * with role and rank, forward SIGINT/SIGTERM to them, and stop them all as
 * soon as one fails.
 *
 * main() only joins the parts: it asks this host what the plan needs (free
 * ports, GPUs, where the programs are), has plan.c decide what runs, checks
 * the output paths, and hands the plan to supervisor.c.  Nothing starts
 * before every flag and path has been checked (exit 2 otherwise). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coord_local.h"
#include "grow.h"
#include "proc.h"
#include "plan.h"
#include "ps_error.h"
#include "ps_flags.h"
#include "ps_fs.h"
#include "ps_strbuf.h"
#include "remote.h"
#include "launch_metrics.h"
#include "supervisor.h"

#define P "ps_launch"

static const char usage_head[] =
    "usage: ps_launch --servers S --workers W [flags] -- <worker flags>\n"
    "       ps_launch --servers S --workers W [flags] --exec PROGRAM [ARGS...]\n"
    "       ps_launch --hostfile FILE [flags] -- <worker flags>\n"
    "\n"
    "Starts S ps_server and W ps_worker processes on this host (or, with --hostfile,\n"
    "on other hosts over ssh), or W copies of any worker program with --exec,\n"
    "prints every line they write prefixed with its role\n"
    "and rank ([server 0] ..., [worker 1] ...), forwards SIGINT/SIGTERM to them, and\n"
    "stops them all when one fails.  Exit status: 0 when every worker exited 0;\n"
    "1 when a process failed (the others are stopped); 2 for something to fix: bad\n"
    "flags (nothing is started), or a process that exited 2 (a flag or setting it\n"
    "refused); 130/143 after SIGINT/SIGTERM.\n"
    "\n"
    "flags (--flag VALUE or --flag=VALUE):\n";

static const char usage_tail[] =
    "\n"
    "Worker flags (after --) go to every worker; \"{rank}\" in them becomes the worker's\n"
    "rank.  The output files without {rank} in their path go to worker 0 only; on\n"
    "this host their directories are created before anything starts.\n";

static const char usage_examples[] =
    "\n"
    "examples:\n"
    "  ps_launch --servers 2 --workers 4 --mode async -- --model mlp:784-256-128-10 \\\n"
    "      --epochs 2 --lr 0.05 --log-csv out/async-worker0.csv\n"
    "  ps_launch --servers 1 --workers 2 --gpus none --timeline-dir out/tl -- --steps 300\n"
    "  ps_launch --hostfile hosts.txt --dry-run -- --model cnn --epochs 5\n"
    "  ps_launch --servers 2 --workers 2 --mode async --lr 0.01 --optimizer adam \\\n"
    "      --exec /usr/bin/python3 examples/torch_fashion_mnist.py --epochs 2\n"
    "Over ssh each remote command runs under 'ps_launch --remote-child PROGRAM ARGS',\n"
    "which takes ps_launch's signals from the connection, stops PROGRAM when the\n"
    "connection ends, and reports how it ended.\n"
    "See docs/LAUNCH.md (ssh, Slurm and mpirun).\n";

/* The exit status for a failure before anything started: 2 for bad flags
 * and paths (the message is in why), 1 when out of memory. */
static int refuse(int rc, const char *why)
{
    if (rc == PS_ENOMEM) {
        fprintf(stderr, P ": out of memory\n");
        return 1;
    }
    return ps_flag_error(why);
}

/* ------------------------------------------------------------ this host */

/* Directory holding this program. */
static char *self_dir(const char *argv0)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0)
        buf[n] = 0;
    else
        snprintf(buf, sizeof buf, "%s", strchr(argv0, '/') ? argv0 : "./ps_launch");
    char *slash = strrchr(buf, '/');
    if (slash == buf)
        slash[1] = 0;
    else if (slash)
        *slash = 0;
    return strdup(buf);
}

/* GPUs on this host: the entries of /proc/driver/nvidia/gpus, else the
 * "GPU " lines of `nvidia-smi -L`. */
static int count_gpus(void)
{
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
    return n;
}

/* The value of a shared flag given to ps_launch itself, else among the
 * worker flags (--flag V or --flag=V), or NULL. */
static const char *own_flag(const ps_launch_opts *o, const char *flag)
{
    const char *v = NULL;
    for (int k = 0; k + 1 < o->shared.n; k += 2)
        if (!strcmp(o->shared.v[k], flag))
            v = o->shared.v[k + 1];
    size_t n = strlen(flag);
    for (int k = 0; !v && k < o->nwflags; k++) {
        if (!strcmp(o->wflags[k], flag) && k + 1 < o->nwflags)
            v = o->wflags[k + 1];
        else if (!strncmp(o->wflags[k], flag, n) && o->wflags[k][n] == '=')
            v = o->wflags[k] + n + 1;
    }
    return v;
}

/* --metrics-port: the ports of ps_launch and of every process (mports, 1 +
 * S + W of them), free ones on this host for auto; *off with off.  0, or
 * the exit status after a message. */
static int metrics_ports(const ps_launch_opts *o, const ps_launch_hostfile *hf, int **mports,
                         int *off)
{
    char why[512];
    int S, W, need_free;
    *mports = NULL;
    if (ps_launch_plan_sizes(o, hf, &S, &W, why, sizeof why))
        return refuse(PS_EINVAL, why);
    S *= 1 + o->replicas; /* every server process serves its own */
    int *p = calloc((size_t)(1 + S + W), sizeof *p), *fr = NULL;
    if (!p)
        return refuse(PS_ENOMEM, why);
    int rc = ps_launch_metrics_ports(o, S, W, NULL, p, off, &need_free, why, sizeof why);
    if (!rc && need_free) {
        fr = calloc((size_t)(1 + S + W), sizeof *fr);
        if (!fr || ps_launch_free_ports(1 + S + W, fr, why, sizeof why)) {
            fprintf(stderr, "%s\n", fr ? why : P ": out of memory");
            free(fr);
            free(p);
            return 1;
        }
        rc = ps_launch_metrics_ports(o, S, W, fr, p, off, &need_free, why, sizeof why);
        free(fr);
    }
    if (rc || *off) {
        free(p);
        return rc ? refuse(rc, why) : 0;
    }
    *mports = p;
    return 0;
}

/* Serve ps_launch's metrics, say where every process serves its own, and
 * write the job and targets files.  0, or the exit status after a message. */
static int metrics_start(const ps_launch_opts *o, const ps_launch_plan *plan, const int *mports,
                         const ps_launch_counts *counts, ps_launch_metrics **lm)
{
    char why[1024], t[300], job[320], host[256] = "localhost";
    const char *bind = own_flag(o, "--metrics-bind");
    int port = mports ? mports[0] : 0;
    if (mports) {
        if (ps_launch_metrics_open(plan, counts, bind, port, lm, why, sizeof why)) {
            fprintf(stderr, P ": %s\n", why);
            return 1;
        }
        fprintf(stderr, P ": metrics of ps_launch at %s\n", ps_launch_metrics_url(*lm));
        for (int i = 0; i < plan->n; i++)
            fprintf(stderr, P ": metrics of %s %d%s at http://%s/metrics\n",
                    ps_launch_role_name(plan->cmds[i].role), plan->cmds[i].rank,
                    plan->replicas && plan->cmds[i].role == PS_LAUNCH_SERVER
                        ? (const char *[]){" member 0", " member 1", " member 2"}[plan->cmds[i].member]
                        : "",
                    ps_launch_metrics_target(plan, i, plan->cmds[i].metrics_port, bind, t,
                                             sizeof t));
    }
    if (o->job_file && ps_launch_write_job(o->job_file, plan, own_flag(o, "--curve-keys"), port,
                                           bind, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }
    gethostname(host, sizeof host - 1);
    snprintf(job, sizeof job, "launch-%ld@%s", (long)getpid(), host);
    if (o->metrics_targets) {
        if (!mports) {
            fprintf(stderr, P ": --metrics-targets needs metrics (not --metrics-port off)\n");
            return 2;
        }
        if (ps_launch_write_targets(o->metrics_targets, plan, job, port, bind, why,
                                    sizeof why)) {
            fprintf(stderr, "%s\n", why);
            return 1;
        }
    }
    return 0;
}

/* Can PROGRAM be run as execvp would: a path with '/' that is executable,
 * or a name found executable in PATH (its file then in found). */
static int runnable(const char *prog, char *found, size_t cap)
{
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *d = path;;) {
        size_t n = strcspn(d, ":");
        snprintf(found, cap, "%.*s/%s", (int)n, n ? d : ".", prog);
        if (access(found, X_OK) == 0)
            return 1;
        if (!d[n])
            return 0;
        d += n + 1;
    }
}

/* Before a local run: the programs are there, and every directory the
 * processes write into exists (created here) and is writable.  0, or the
 * exit status after a message. */
static int check_local(const ps_launch_opts *o, const ps_launch_plan *plan, const char *bin_dir)
{
    static const char *const progs[] = {"ps_server", "ps_worker"};
    char found[PATH_MAX];
    if (o->exec && !runnable(o->exec[0], found, sizeof found)) {
        fprintf(stderr, P ": --exec: cannot run '%s': %s\n", o->exec[0],
                strchr(o->exec[0], '/') ? strerror(errno) : "not found in PATH");
        return 2;
    }
    /* a bare name is whatever comes first on PATH: often another python3
     * than the one with the modules the program needs; say which */
    if (o->exec && !strchr(o->exec[0], '/'))
        fprintf(stderr, P ": --exec %s is %s (the first on PATH; give a path, e.g. "
                "/usr/bin/%s, for another)\n", o->exec[0], found, o->exec[0]);
    for (int k = 0; k < (o->exec ? 1 : 2); k++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", bin_dir, progs[k]);
        if (access(path, X_OK)) {
            fprintf(stderr, P ": cannot run %s: %s (build it with make, or give --bin-dir)\n",
                    path, strerror(errno));
            return 2;
        }
    }
    char why[2 * PATH_MAX];
    if (o->timeline_dir &&
        ps_check_output_dir("--timeline-dir", o->timeline_dir, why, sizeof why)) {
        fprintf(stderr, P ": %s\n", why);
        return 2;
    }
    ps_strvec out = {0};
    int rc = ps_launch_plan_outputs(plan, &out) ? refuse(PS_ENOMEM, "") : 0;
    for (int k = 0; !rc && k + 1 < out.n; k += 2)
        if (ps_check_output_file(out.v[k], out.v[k + 1], why, sizeof why)) {
            fprintf(stderr, P ": %s\n", why);
            rc = 2;
        }
    ps_strvec_free(&out);
    return rc;
}

/* --replicas: the job's name in etcd (made up when not given), and with
 * --coord auto (or none, on this host) the local etcd to start: its URL
 * goes into o->coord now, the plan hands it to the servers.  0, or the
 * exit status after a message. */
static int coord_setup(ps_launch_opts *o, ps_launch_etcd *e)
{
    static char job[96];
    if (!o->job) {
        snprintf(job, sizeof job, "ps-%ld-%lld", (long)getpid(), (long long)time(NULL));
        o->job = job;
    }
    if (o->coord && strcmp(o->coord, "auto"))
        return 0;
    if (o->hostfile) {
        fprintf(stderr, P ": --replicas over a hostfile needs --coord URLS: an etcd every host "
                "reaches (docs/OPERATIONS.md \"Replicas\")\n");
        return 2;
    }
    char why[512];
    if (ps_launch_etcd_plan(e, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        return 2;
    }
    o->coord = e->url;
    return 0;
}

int main(int argc, char **argv)
{
    ps_launch_opts o;
    ps_launch_hostfile hf = {0};
    ps_launch_plan plan = {0};
    ps_strvec gpus = {0};
    ps_strbuf text = {0};
    int ports[3 * PS_LAUNCH_MAX_SERVERS], *mports = NULL, moff = 0;
    ps_launch_etcd etcd = {0};
    ps_launch_counts counts = {0};
    ps_launch_metrics *lm = NULL;
    ps_launch_grow grow = {.fd = -1};
    char *exe_dir = NULL, *bin_dir = NULL;
    char why[1024] = "", cwd[PATH_MAX];

    /* on a remote host, as the plan's ssh command runs it */
    if (argc >= 2 && !strcmp(argv[1], PS_REMOTE_FLAG))
        return ps_launch_remote_child(argc - 2, argv + 2);

    int rc = ps_launch_parse(argc, argv, &o, why, sizeof why);
    if (!rc && o.help) {
        /* which worker flags are output files, and which it sets: the table's */
        ps_strbuf_add(&text, usage_tail);
        for (int k = 0; k < 2; k++) {
            ps_strbuf_add(&text, k ? "ps_launch sets" : "Output files:");
            for (int id = 0; id < PS_SET_N; id++) {
                const ps_setting *r = ps_setting_at(id);
                if ((r->progs & PS_PROG_WORKER) &&
                    (r->props & (k ? PS_SET_BY_LAUNCH : PS_SET_OUTPUT)))
                    ps_strbuf_addf(&text, " %s", r->flag);
            }
            ps_strbuf_add(&text, k ? " itself.\n" : ".\n");
        }
        ps_strbuf_add(&text, usage_examples);
        ps_settings_print_help(P, PS_PROG_LAUNCH, o.help, usage_head, ps_strbuf_str(&text));
        goto out;
    }
    if (!rc && o.hostfile)
        rc = ps_launch_hostfile_read(o.hostfile, &hf, why, sizeof why);
    if (rc) {
        rc = refuse(rc, why);
        goto out;
    }
    if (!getcwd(cwd, sizeof cwd)) {
        fprintf(stderr, P ": getcwd: %s\n", strerror(errno));
        rc = 1;
        goto out;
    }
    exe_dir = self_dir(argv[0]);
    bin_dir = exe_dir ? ps_launch_bin_dir(&o, exe_dir, cwd) : NULL;
    if (!bin_dir) {
        rc = refuse(PS_ENOMEM, why);
        goto out;
    }
    if (!o.hostfile) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        if (!strcmp(o.gpus, "auto") && ps_launch_gpus_auto(cvd, cvd ? 0 : count_gpus(), &gpus)) {
            rc = refuse(PS_ENOMEM, why);
            goto out;
        }
        if (ps_launch_free_ports(o.servers * (1 + o.replicas), ports, why, sizeof why)) {
            fprintf(stderr, "%s\n", why);
            rc = 1;
            goto out;
        }
    }
    if ((rc = metrics_ports(&o, o.hostfile ? &hf : NULL, &mports, &moff)))
        goto out;
    if (o.replicas && (rc = coord_setup(&o, &etcd)) != 0)
        goto out;
    /* --elastic-servers: every server gets the token before the plan is made */
    if (o.elastic_servers && !o.dry_run && (rc = ps_launch_grow_setup(&grow, &o)) != 0)
        goto out;
    /* On other hosts, the programs are at the same path as here, and the
     * commands run in this working directory. */
    ps_launch_site site = {.hostfile = o.hostfile ? &hf : NULL, .ports = ports, .gpus = &gpus,
                           .bin_dir = bin_dir, .remote_dir = cwd, .ssh = getenv("PS_SSH"),
                           .metrics_ports = mports};
    rc = ps_launch_plan_build(&o, &site, &plan, why, sizeof why);
    if (!rc)
        rc = ps_launch_plan_notes(&o, &site, &plan, &text);
    if (rc) {
        rc = refuse(rc, why);
        goto out;
    }
    fputs(ps_strbuf_str(&text), stderr);
    if (o.dry_run) {
        fflush(stderr);
        ps_strbuf_reset(&text);
        if ((rc = ps_launch_plan_print(&plan, &text)))
            rc = refuse(rc, why);
        else
            fputs(ps_strbuf_str(&text), stdout);
        goto out;
    }
    if (!o.hostfile && (rc = check_local(&o, &plan, bin_dir)))
        goto out;
    if (etcd.auto_) { /* --coord auto: this job's own etcd, on this host */
        if ((rc = ps_launch_etcd_start(&etcd, why, sizeof why)) != 0) {
            rc = refuse(rc, why);
            goto out;
        }
        fprintf(stderr, P ": etcd for this job at %s (pid %ld, --coord auto)\n", etcd.url,
                (long)etcd.pid);
    }
    if ((rc = metrics_start(&o, &plan, mports, &counts, &lm)))
        goto out;
    fflush(stdout);
    if (o.elastic_servers) {
        if ((rc = ps_launch_grow_plan(&grow, &plan, bin_dir)) != 0) {
            rc = refuse(rc, why);
            goto out;
        }
        if (grow.refused)
            fprintf(stderr, P ": --elastic-servers: SIGUSR2 cannot add a server to this job: it "
                    "runs %s\n", grow.refused);
        else
            fprintf(stderr, P ": --elastic-servers: SIGUSR2 adds a server; the servers' admin "
                    "token is %s (ps_servers --admin-token-file; removed at the end)\n",
                    grow.token);
    }
    rc = ps_launch_supervise(&plan, &counts, o.elastic_servers ? &grow : NULL);
out:
    ps_launch_grow_free(&grow);
    ps_launch_etcd_stop(&etcd);
    ps_launch_metrics_close(lm);
    free(mports);
    ps_strbuf_free(&text);
    ps_launch_plan_free(&plan);
    ps_launch_hostfile_free(&hf);
    ps_launch_opts_free(&o);
    ps_strvec_free(&gpus);
    free(bin_dir);
    free(exe_dir);
    return rc;
}
