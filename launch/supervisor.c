/* The supervisor: children on pipes (proc.h starts them), one poll loop
 * over their output and the self-pipe fed by the signal handlers. */
#include "supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grow.h"
#include "proc.h"
#include "ps_smap.h"
#include "ps_strbuf.h"
#include "remote.h"

#define P "ps_launch"
#define STOP_GRACE_MS 5000  /* SIGTERM -> SIGKILL */
#define KILL_GRACE_MS 5000  /* SIGKILL -> give up waiting */
#define DRAIN_MS 1000       /* after the last exit, wait this long for pipe EOFs */
#define MAX_LINE 65536      /* a longer line is cut and printed in pieces */

typedef struct supervisor supervisor;

typedef struct {
    const ps_launch_cmd *cmd;
    supervisor *sv;
    pid_t pid;
    int fd[2];       /* read ends of stdout, stderr; -1 once closed */
    ps_strbuf lb[2]; /* what came after the last newline */
    int reaped, status;
    int signalled;   /* asked to stop (SIGKILL follows after the grace) */
    /* over ssh: the write end of ssh's stdin, which reaches the remote
     * wrapper (remote.h): signals go there as lines, closing it stops the
     * program; -1 for a local child or once closed */
    int in_fd;
    int remote_status; /* the wrapper's report as a wait status; -1: none yet */
    int left_job;      /* a server that said it was removed from the job (ps_servers
                          remove): its exit is the end of its part, not a failure */
    int joining;       /* a server being added (--elastic-servers) until ps_servers says it
                          was: its exit, or its stop after a failed add, is not the job's */
} child;

enum { ST_RUN, ST_STOP_SERVERS, ST_STOP_FAIL, ST_STOP_SIGNAL };

struct supervisor {
    ps_launch_counts *counts; /* NULL: not counted */
    child *ch;
    int n, cap;           /* children, room (an added server takes the next: pointers to
                             them stay good) */
    ps_launch_grow *grow; /* --elastic-servers: SIGUSR2 adds a server; NULL: off */
    ps_launch_cmd *added; /* the added servers' commands (room for PS_SMAP_MAX_SLOTS) */
    int nadded;
    child *adding;        /* the server ps_servers add is moving objects to; NULL: none */
    int state;
    int exit_code;
    int64_t deadline;     /* 0: none */
    int killed;           /* SIGKILL sent */
    int servers_sig;      /* the signal the servers get once the workers have ended; 0: none */
    int workers_ok, workers;
    int replicas;         /* the plan's: a lost server's group carries on */
    int restarts;         /* new servers that may still be started */
    int workers_min;      /* an elastic job's MIN (else workers, or 0) */
    int worker_restarts;  /* elastic: new workers that may still be started */
    int workers_gone;     /* elastic: workers that died and were not replaced */
    char failure[512];    /* what made us stop, for the last line */
    int64_t t0;
    /* worker summaries seen in the output, for the closing line */
    double sum_rate;
    int nrate;
    double acc0;          /* worker 0's test accuracy, -1 when not seen */
};

static int g_out_broken[3];

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

/* "server 2", or with replicas "server 2.1" (member 1 of group 2). */
static void child_label(const child *c, char *out, size_t n)
{
    if (c->cmd->role == PS_LAUNCH_SERVER && c->sv->replicas)
        snprintf(out, n, "server %d.%d", c->cmd->rank, c->cmd->member);
    else
        snprintf(out, n, "%s %d", ps_launch_role_name(c->cmd->role), c->cmd->rank);
}

static void child_name(const child *c, char *out, size_t n)
{
    char label[48];
    child_label(c, label, sizeof label);
    if (c->cmd->host)
        snprintf(out, n, "%s (pid %ld, ssh to %s)", label, (long)c->pid, c->cmd->host);
    else
        snprintf(out, n, "%s (pid %ld)", label, (long)c->pid);
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

/* A server removed from the running job (docs/OPERATIONS.md "Servers
 * added and removed") says so before it exits. */
#define LEFT_JOB_LINE "removed from the job and every worker told: exiting"

/* Pick up a worker's "summary: time 12.3 s, 4567 samples/s per worker, test accuracy
 * 0.88", and a server's LEFT_JOB_LINE. */
static void note_summary(child *c, const char *line)
{
    if (c->cmd->role == PS_LAUNCH_SERVER) {
        if (strstr(line, LEFT_JOB_LINE))
            c->left_job = 1;
        return;
    }
    const char *s = strstr(line, "summary:");
    if (!s)
        return;
    const char *r = strstr(s, " samples/s");
    if (r) {
        const char *b = r;
        while (b > s && (b[-1] == '.' || (b[-1] >= '0' && b[-1] <= '9')))
            b--;
        if (b < r) {
            c->sv->sum_rate += strtod(b, NULL);
            c->sv->nrate++;
        }
    }
    const char *a = strstr(s, "test accuracy ");
    if (a && c->cmd->rank == 0)
        c->sv->acc0 = strtod(a + 14, NULL);
}

static void emit_line(child *c, int stream, const char *line, size_t n)
{
    static ps_strbuf b;
    int fd = stream == 0 ? STDOUT_FILENO : STDERR_FILENO;
    while (n > 0 && line[n - 1] == '\r')
        n--;
    if (c->cmd->host && stream == 1 && n < 64) {
        /* the remote wrapper's last words: how the program ended */
        char last[64];
        int st;
        memcpy(last, line, n);
        last[n] = 0;
        if (ps_launch_remote_status(last, &st)) {
            c->remote_status = st;
            return;
        }
    }
    ps_strbuf_reset(&b);
    char label[48];
    child_label(c, label, sizeof label);
    ps_strbuf_addf(&b, "[%s] ", label);
    size_t head = b.n;
    ps_strbuf_addn(&b, line, n);
    ps_strbuf_add(&b, "\n");
    if (b.failed) { /* out of memory: the line all the same, in pieces */
        char pre[64];
        snprintf(pre, sizeof pre, "[%s] ", label);
        write_all(fd, pre, strlen(pre));
        write_all(fd, line, n);
        write_all(fd, "\n", 1);
        return;
    }
    note_summary(c, b.p + head);
    /* one write per line, so lines of different children never mix */
    write_all(fd, b.p, b.n);
}

static void feed(child *c, int s, const char *data, size_t n)
{
    ps_strbuf *lb = &c->lb[s];
    if (ps_strbuf_addn(lb, data, n)) { /* out of memory: what there is, as one line */
        emit_line(c, s, lb->p ? lb->p : "", lb->p ? lb->n : 0);
        emit_line(c, s, data, n);
        ps_strbuf_reset(lb);
        return;
    }
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
    memmove(lb->p, lb->p + start, lb->n - start + 1); /* with the NUL */
    lb->n -= start;
}

static void close_stream(child *c, int s)
{
    if (c->fd[s] < 0)
        return;
    if (c->lb[s].n > 0)
        emit_line(c, s, c->lb[s].p, c->lb[s].n); /* last line had no newline */
    ps_strbuf_reset(&c->lb[s]);
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

/* The CUDA_VISIBLE_DEVICES=... entry of a worker's environment, or NULL (the
 * PS_* entries of an --exec worker are the same for all but the rank). */
static const char *gpu_env(const ps_launch_cmd *k)
{
    for (int i = 0; i < k->env.n; i++)
        if (!strncmp(k->env.v[i], "CUDA_VISIBLE_DEVICES=", 21))
            return k->env.v[i];
    return NULL;
}

/* Start one process with stdout/stderr on pipes.  The child gets its own
 * process group (so ps_launch alone decides which signals reach it, and a
 * stop reaches anything it forked) and, on Linux, SIGTERM if ps_launch dies. */
static int spawn_argv(child *c, char *const *argv, char *why, size_t len);

static int spawn(child *c, char *why, size_t len)
{
    return spawn_argv(c, c->cmd->argv.v, why, len);
}

static int spawn_argv(child *c, char *const *argv, char *why, size_t len)
{
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe(out) || pipe(err) || (c->cmd->host && pipe(in))) {
        snprintf(why, len, P ": pipe: %s", strerror(errno));
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(out[i], F_SETFD, FD_CLOEXEC);
        fcntl(err[i], F_SETFD, FD_CLOEXEC);
        if (in[i] >= 0)
            fcntl(in[i], F_SETFD, FD_CLOEXEC);
    }
    /* ssh's stdin is our pipe to the remote wrapper; the rest read nothing */
    pid_t pid = ps_launch_spawn(argv, in[0], out[1], err[1], c->cmd->host ? NULL : c->cmd->env.v);
    int fork_errno = errno;
    close(out[1]);
    close(err[1]);
    if (in[0] >= 0)
        close(in[0]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        if (in[1] >= 0)
            close(in[1]);
        snprintf(why, len, P ": fork: %s", strerror(fork_errno));
        return 1;
    }
    if (in[1] >= 0)
        fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
    c->in_fd = in[1];
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    c->pid = pid;
    c->fd[0] = out[0];
    c->fd[1] = err[0];
    return 0;
}

static void close_input(child *c)
{
    if (c->in_fd >= 0)
        close(c->in_fd);
    c->in_fd = -1;
}

static void signal_child(child *c, int sig)
{
    if (c->reaped || c->pid <= 0)
        return;
    c->signalled = 1;
    if (c->cmd->host) {
        /* over ssh: the remote wrapper signals the program (ssh without a
         * terminal would not); the local ssh stays up to bring back the
         * program's last lines and how it ended */
        char line[16];
        snprintf(line, sizeof line, "%s\n",
                 sig == SIGINT ? "INT" : sig == SIGKILL ? "KILL" : sig == SIGHUP ? "HUP" : "TERM");
        if (c->in_fd >= 0 && write(c->in_fd, line, strlen(line)) < 0)
            close_input(c); /* ssh is gone; its end will be reaped */
        return;
    }
    kill(-c->pid, sig);
    kill(c->pid, sig);
}

static int live_workers(const supervisor *sv)
{
    int n = 0;
    for (int i = 0; i < sv->n; i++)
        n += sv->ch[i].cmd->role == PS_LAUNCH_WORKER && !sv->ch[i].reaped;
    return n;
}

/* Send sig to the workers (unless servers_only) and then to the servers.
 * Workers first: while its servers are up a worker finishes its step and
 * exits at once (without them it would wait on a reply until SIGKILL), and
 * the servers' last checkpoint comes after the last update.  The servers
 * get sig when no worker is left (supervise's loop), each group with its own
 * grace before SIGKILL. */
static void stop_all(supervisor *sv, int sig, int servers_only)
{
    int workers = servers_only ? 0 : live_workers(sv);
    for (int i = 0; i < sv->n; i++) {
        int server = sv->ch[i].cmd->role == PS_LAUNCH_SERVER;
        if (server ? !workers : !servers_only)
            signal_child(&sv->ch[i], sig);
    }
    if (sv->grow && sv->grow->pid > 0) /* an add under way ends with the job */
        kill(sv->grow->pid, SIGTERM);
    sv->servers_sig = workers ? sig : 0;
    sv->killed = 0;
    sv->deadline = ps_launch_now_ms() + STOP_GRACE_MS;
}

/* Server c died while the workers train: start a new one for it (its
 * restart_argv: with replicas it copies its group's state from the
 * primary and becomes a replica; without, it restores its checkpoint and
 * the workers wait for it).  0 started; -1 not (said why). */
static int restart_server(supervisor *sv, child *c, const char *name, const char *how)
{
    if (sv->restarts <= 0 || !c->cmd->restart_argv.n)
        return -1;
    sv->restarts--;
    close_stream(c, 0);
    close_stream(c, 1);
    c->signalled = 0;
    c->remote_status = -1;
    char why[512];
    if (spawn_argv(c, c->cmd->restart_argv.v, why, sizeof why)) {
        fprintf(stderr, P ": %s %s; a new one could not be started: %s\n", name, how, why);
        return -1;
    }
    c->reaped = 0;
    if (sv->counts)
        atomic_fetch_add_explicit(&sv->counts->started[PS_LAUNCH_SERVER], 1,
                                  memory_order_relaxed);
    char label[48];
    child_label(c, label, sizeof label);
    fprintf(stderr, P ": %s %s; started a new %s (pid %ld) at %s, %s (%d more may be "
            "started)\n", name, how, label, (long)c->pid, c->cmd->endpoint,
            sv->replicas ? "which copies its group's state from the primary while training goes "
                           "on"
                         : "from its checkpoint (--restore); the workers wait for it",
            sv->restarts);
    return 0;
}

/* Worker c of an elastic job died while training goes on: start a new one
 * with its command (it joins the running job: 1), or, with --restart-workers
 * spent, go on without it while MIN are left (0); -1: the job cannot. */
static int lost_worker(supervisor *sv, child *c, const char *name, const char *how)
{
    if (sv->workers_min <= 0 || sv->workers_min >= sv->workers) /* a fixed job */
        return -1;
    char why[512];
    if (sv->worker_restarts > 0) {
        sv->worker_restarts--;
        close_stream(c, 0);
        close_stream(c, 1);
        c->signalled = 0;
        c->remote_status = -1;
        if (spawn_argv(c, c->cmd->argv.v, why, sizeof why) == 0) {
            c->reaped = 0;
            if (sv->counts)
                atomic_fetch_add_explicit(&sv->counts->started[PS_LAUNCH_WORKER], 1,
                                          memory_order_relaxed);
            fprintf(stderr, P ": %s %s; started a new one (pid %ld), which joins the running "
                    "job (%d more may be started)\n", name, how, (long)c->pid,
                    sv->worker_restarts);
            return 1;
        }
        fprintf(stderr, P ": %s %s; a new one could not be started: %s\n", name, how, why);
    }
    int left = sv->workers - sv->workers_ok - sv->workers_gone - 1;
    if (left < sv->workers_min)
        return -1;
    sv->workers_gone++;
    fprintf(stderr, P ": %s %s; the job goes on with %d worker%s (elastic, MIN %d)\n", name,
            how, left, left == 1 ? "" : "s", sv->workers_min);
    return 0;
}

static void on_exit_child(supervisor *sv, child *c)
{
    char name[300], how[160];
    close_input(c);
    if (c->cmd->host && c->remote_status >= 0)
        c->status = c->remote_status; /* how the program itself ended, not ssh */
    child_name(c, name, sizeof name);
    describe_status(c->status, how, sizeof how);
    if (c->cmd->host && c->remote_status < 0) /* ssh failed, or the remote shell */
        snprintf(how + strlen(how), sizeof how - strlen(how),
                 " (ssh's status: the remote side did not report)");
    int ok = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
    if (sv->counts)
        atomic_fetch_add_explicit(ok ? &sv->counts->exited_ok[c->cmd->role]
                                     : &sv->counts->failed[c->cmd->role],
                                  1, memory_order_relaxed);
    if (sv->state == ST_RUN) {
        /* elastic: a lost worker is replaced (1) or the job goes on without
         * it while MIN are left (0, counted in workers_gone) */
        int lost = c->cmd->role == PS_LAUNCH_WORKER && !ok ? lost_worker(sv, c, name, how) : -1;
        if (lost == 1)
            return;
        if (c->cmd->role == PS_LAUNCH_WORKER && (ok || lost == 0)) {
            sv->workers_ok += ok;
            if (sv->workers_ok + sv->workers_gone == sv->workers) {
                fprintf(stderr, P ": %s finished; stopping the servers\n",
                        sv->workers == 1 ? "the worker" : "all workers");
                sv->state = ST_STOP_SERVERS;
                stop_all(sv, SIGTERM, 1);
            }
            return;
        }
        if (c->joining) {
            fprintf(stderr, P ": %s %s while it was being added; the job goes on without it\n",
                    name, how);
            return;
        }
        if (c->cmd->role == PS_LAUNCH_SERVER && ok && c->left_job) {
            fprintf(stderr, P ": %s left the job (removed: its objects moved to the other "
                    "servers); the job goes on\n", name);
            return;
        }
        if (c->cmd->role == PS_LAUNCH_SERVER && restart_server(sv, c, name, how) == 0)
            return;
        if (c->cmd->role == PS_LAUNCH_SERVER && sv->replicas) {
            /* its group's other members carry on */
            fprintf(stderr, P ": %s %s; its group goes on with its other members (no new "
                    "server: --restart-servers is spent)\n", name, how);
            return;
        }
        fprintf(stderr, P ": %s %s%s; stopping the others\n", name, how,
                c->cmd->role == PS_LAUNCH_SERVER ? " before the workers finished" : "");
        snprintf(sv->failure, sizeof sv->failure, "%s %s", name, how);
        sv->state = ST_STOP_FAIL;
        /* the one exit rule: a process that found something to fix (2) makes
         * the whole run one to fix; any other failure is 1 */
        sv->exit_code = WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2 ? 2 : 1;
        stop_all(sv, SIGTERM, 0);
        return;
    }
    if (sv->state == ST_STOP_SERVERS && c->cmd->role == PS_LAUNCH_SERVER && !ok &&
        !(WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGTERM))
        fprintf(stderr, P ": warning: %s %s while stopping\n", name, how);
}

/* SIGKILL to each local ssh still running; 1 when there was one. */
static int kill_local_ssh(supervisor *sv)
{
    int n = 0;
    for (int i = 0; i < sv->n; i++) {
        child *c = &sv->ch[i];
        if (c->cmd->host && !c->reaped && c->pid > 0) {
            char name[300];
            child_name(c, name, sizeof name);
            fprintf(stderr, P ": %s: no answer from its host; ending the ssh connection\n", name);
            kill(c->pid, SIGKILL);
            n++;
        }
    }
    return n > 0;
}

/* SIGUSR2 under --elastic-servers: start one more server on this host and
 * `ps_servers add` for it (add_ended says how it went).  One at a time. */
static void add_server(supervisor *sv)
{
    ps_launch_grow *g = sv->grow;
    char why[512];
    if (g->refused) {
        fprintf(stderr, P ": got SIGUSR2; no server is added: this job runs %s\n", g->refused);
        return;
    }
    if (sv->state != ST_RUN) {
        fprintf(stderr, P ": got SIGUSR2 while the job is stopping; no server is added\n");
        return;
    }
    if (g->pid > 0) {
        fprintf(stderr, P ": got SIGUSR2 while server %d is being added; ignored (one at a "
                "time)\n", g->slot);
        return;
    }
    if (sv->nadded >= PS_SMAP_MAX_SLOTS || sv->n >= sv->cap) {
        fprintf(stderr, P ": got SIGUSR2; no server is added: this job has had as many as it "
                "may\n");
        return;
    }
    ps_launch_cmd *k = &sv->added[sv->nadded];
    if (ps_launch_grow_cmd(g, sv->ch[0].cmd, k, why, sizeof why)) {
        fprintf(stderr, P ": got SIGUSR2; no server is added: %s\n", why + strlen(P ": "));
        return;
    }
    sv->nadded++;
    child *c = &sv->ch[sv->n];
    memset(c, 0, sizeof *c);
    c->cmd = k;
    c->sv = sv;
    c->fd[0] = c->fd[1] = c->in_fd = -1;
    c->remote_status = -1;
    c->reaped = 1;
    if (spawn(c, why, sizeof why)) {
        fprintf(stderr, "%s; no server is added\n", why);
        return;
    }
    sv->n++;
    c->reaped = 0;
    c->joining = 1;
    if (sv->counts)
        atomic_fetch_add_explicit(&sv->counts->started[PS_LAUNCH_SERVER], 1,
                                  memory_order_relaxed);
    fprintf(stderr, P ": started server %d (pid %ld) at %s on SIGUSR2: ps_servers add moves "
            "its share of the running job to it\n", k->rank, (long)c->pid, k->endpoint);
    if (ps_launch_grow_start(g, k->rank, k->endpoint, why, sizeof why)) {
        fprintf(stderr, "%s; stopping server %d, the job goes on\n", why, k->rank);
        signal_child(c, SIGTERM);
        return;
    }
    sv->adding = c;
}

/* ps_servers add ended with wait status st: the server is in the job, or it
 * is stopped and the job goes on without it. */
static void add_ended(supervisor *sv, int st)
{
    ps_launch_grow *g = sv->grow;
    child *c = sv->adding;
    ps_launch_grow_read(g);
    g->pid = 0;
    sv->adding = NULL;
    if (!c)
        return;
    char name[300], how[160];
    child_name(c, name, sizeof name);
    const char *last = ps_strbuf_str(&g->last);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && !c->reaped) {
        c->joining = 0; /* it holds part of the state now: a server like the others */
        fprintf(stderr, P ": %s added: %s\n", name, last);
        return;
    }
    describe_status(st, how, sizeof how);
    if (sv->state != ST_RUN) {
        fprintf(stderr, P ": adding %s ended with the job (ps_servers %s)\n", name, how);
        return;
    }
    fprintf(stderr, P ": adding %s failed: ps_servers %s%s%s%s; %s, the job goes on\n", name,
            how, *last ? " (" : "", last, *last ? ")" : "",
            c->reaped ? "it has ended" : "stopping it");
    signal_child(c, SIGTERM); /* joining: its exit is not the job's failure */
}

static void reap(supervisor *sv)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        if (sv->grow && pid == sv->grow->pid) {
            add_ended(sv, st);
            continue;
        }
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
    if (sig == SIGUSR2 && sv->grow) {
        add_server(sv);
        return;
    }
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
    sv->servers_sig = 0;
    sv->killed = 1;
    sv->deadline = ps_launch_now_ms() + KILL_GRACE_MS;
}


int ps_launch_supervise(const ps_launch_plan *plan, ps_launch_counts *counts,
                        ps_launch_grow *grow)
{
    supervisor sv = {0};
    sv.counts = counts;
    sv.n = plan->n;
    sv.workers = plan->num_workers;
    sv.replicas = plan->replicas;
    sv.restarts = plan->restarts;
    sv.workers_min = plan->num_workers_min;
    sv.worker_restarts = plan->worker_restarts;
    sv.acc0 = -1;
    sv.grow = grow;
    sv.cap = sv.n + (grow ? PS_SMAP_MAX_SLOTS : 0);
    sv.ch = calloc((size_t)sv.cap, sizeof *sv.ch);
    struct pollfd *pfd = calloc((size_t)(2 * sv.cap + 2), sizeof *pfd);
    sv.added = grow ? calloc(PS_SMAP_MAX_SLOTS, sizeof *sv.added) : NULL;
    if (!sv.ch || !pfd || (grow && !sv.added)) {
        fprintf(stderr, P ": out of memory\n");
        free(sv.ch);
        free(pfd);
        free(sv.added);
        return 1;
    }
    sv.t0 = ps_launch_now_ms();
    int sigfd;
    if (ps_launch_catch_signals(&sigfd)) {
        fprintf(stderr, P ": pipe: %s\n", strerror(errno));
        free(sv.ch);
        free(pfd);
        free(sv.added);
        return 1;
    }
    if (grow)
        ps_launch_catch_signal(SIGUSR2);
    char why[512];
    for (int i = 0; i < sv.n; i++) {
        child *c = &sv.ch[i];
        c->cmd = &plan->cmds[i];
        c->sv = &sv;
        c->fd[0] = c->fd[1] = c->in_fd = -1;
        c->remote_status = -1;
        c->reaped = 1; /* until started */
    }
    /* servers first: workers connect to them (ZeroMQ retries until they bind) */
    for (int i = 0; i < sv.n && sv.state == ST_RUN; i++) {
        child *c = &sv.ch[i];
        if (spawn(c, why, sizeof why)) {
            fprintf(stderr, "%s; stopping the others\n", why);
            snprintf(sv.failure, sizeof sv.failure, "could not start %s %d",
                     ps_launch_role_name(c->cmd->role), c->cmd->rank);
            sv.state = ST_STOP_FAIL;
            sv.exit_code = 1;
            stop_all(&sv, SIGTERM, 0);
            break;
        }
        c->reaped = 0;
        const ps_launch_cmd *k = c->cmd;
        if (sv.counts)
            atomic_fetch_add_explicit(&sv.counts->started[k->role], 1, memory_order_relaxed);
        char label[48];
        child_label(c, label, sizeof label);
        if (k->role == PS_LAUNCH_SERVER)
            fprintf(stderr, P ": started %s (pid %ld)%s%s at %s\n", label, (long)c->pid,
                    k->host ? " on " : "", k->host ? k->host : "", k->endpoint);
        else
            fprintf(stderr, P ": started worker %d (pid %ld)%s%s, device %s%s%s\n", k->rank,
                    (long)c->pid, k->host ? " on " : "", k->host ? k->host : "", k->device,
                    gpu_env(k) ? " with " : "", gpu_env(k) ? gpu_env(k) : "");
        /* a signal or an early exit during start-up is handled right away */
        unsigned char sigs[64];
        int r = ps_launch_read_signals(sigs, sizeof sigs);
        for (int j = 0; j < r; j++)
            if (sigs[j] != SIGCHLD)
                on_launcher_signal(&sv, sigs[j]);
        reap(&sv);
    }

    int64_t drain_deadline = 0;
    int ssh_killed = 0;
    for (;;) {
        reap(&sv);
        if (sv.servers_sig && !live_workers(&sv))
            stop_all(&sv, sv.servers_sig, 1); /* the workers are gone: now the servers */
        int all_reaped = !(sv.grow && sv.grow->pid > 0),
            open_fds = sv.grow && sv.grow->fd >= 0;
        for (int i = 0; i < sv.n; i++) {
            all_reaped &= sv.ch[i].reaped;
            open_fds += (sv.ch[i].fd[0] >= 0) + (sv.ch[i].fd[1] >= 0);
        }
        int64_t now = ps_launch_now_ms();
        if (all_reaped) {
            if (!open_fds)
                break;
            if (!drain_deadline)
                drain_deadline = now + DRAIN_MS;
            if (now >= drain_deadline) { /* something the child forked holds the pipe */
                for (int i = 0; i < sv.n; i++)
                    close_stream(&sv.ch[i], 0), close_stream(&sv.ch[i], 1);
                if (sv.grow)
                    ps_launch_grow_read(sv.grow);
                break;
            }
        } else if (sv.deadline && now >= sv.deadline) {
            if (!sv.killed) {
                for (int i = 0; i < sv.n; i++) {
                    child *c = &sv.ch[i];
                    if (c->reaped || !c->signalled) /* servers wait for the workers */
                        continue;
                    char name[300];
                    child_name(c, name, sizeof name);
                    fprintf(stderr, P ": %s did not stop within %d s; sending SIGKILL\n", name,
                            STOP_GRACE_MS / 1000);
                    signal_child(c, SIGKILL);
                }
                sv.killed = 1;
                sv.deadline = now + KILL_GRACE_MS;
            } else if (!ssh_killed && kill_local_ssh(&sv)) {
                /* the remote side did not answer: end its connections, which
                 * makes each remote wrapper stop its program */
                ssh_killed = 1;
                sv.deadline = now + DRAIN_MS;
            } else {
                fprintf(stderr, P ": some processes did not exit even after SIGKILL; giving up\n");
                if (!sv.exit_code)
                    sv.exit_code = 1;
                break;
            }
        }
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        if (sv.grow && sv.grow->fd >= 0)
            pfd[np++] = (struct pollfd){.fd = sv.grow->fd, .events = POLLIN};
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
            int r;
            while ((r = ps_launch_read_signals(sigs, sizeof sigs)) > 0)
                for (int j = 0; j < r; j++)
                    if (sigs[j] != SIGCHLD)
                        on_launcher_signal(&sv, sigs[j]);
        }
        for (int k = 1; k < np; k++) {
            if (!pfd[k].revents)
                continue;
            if (sv.grow && pfd[k].fd == sv.grow->fd) {
                ps_launch_grow_read(sv.grow);
                continue;
            }
            for (int i = 0; i < sv.n; i++)
                for (int s = 0; s < 2; s++)
                    if (sv.ch[i].fd[s] == pfd[k].fd)
                        read_stream(&sv.ch[i], s);
        }
    }
    free(pfd);

    double secs = (double)(ps_launch_now_ms() - sv.t0) / 1000.0;
    int servers = 0; /* with the added ones */
    for (int i = 0; i < sv.n; i++)
        servers += sv.ch[i].cmd->role == PS_LAUNCH_SERVER;
    if (sv.exit_code == 0) {
        ps_strbuf b = {0};
        ps_strbuf_addf(&b, P ": done in %.1f s: %d worker%s finished (mode %s), %d server%s "
                             "stopped",
                       secs, sv.workers, sv.workers == 1 ? "" : "s", ps_launch_mode_name(plan->mode),
                       servers, servers == 1 ? "" : "s");
        if (sv.nrate)
            ps_strbuf_addf(&b, "; %.0f samples/s over all workers", sv.sum_rate);
        if (sv.acc0 >= 0)
            ps_strbuf_addf(&b, ", test accuracy %.4f (worker 0)", sv.acc0);
        fprintf(stderr, "%s\n", ps_strbuf_str(&b));
        ps_strbuf_free(&b);
    } else {
        fprintf(stderr, P ": %s after %.1f s: %s\n", sv.exit_code > 128 ? "stopped" : "failed",
                secs, sv.failure);
    }
    for (int i = 0; i < sv.n; i++) {
        close_input(&sv.ch[i]);
        close_stream(&sv.ch[i], 0);
        close_stream(&sv.ch[i], 1);
        ps_strbuf_free(&sv.ch[i].lb[0]);
        ps_strbuf_free(&sv.ch[i].lb[1]);
    }
    for (int i = 0; i < sv.nadded; i++)
        ps_launch_grow_cmd_free(&sv.added[i]);
    free(sv.added);
    free(sv.ch);
    return sv.exit_code;
}
