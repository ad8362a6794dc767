/* servers_bench: a server added to a running job, and one removed
 * (docs/OPERATIONS.md "Servers added and removed"), on loopback.
 *
 * Two ps_server processes (async, 2 update threads each) hold a table of
 * --rows (4e6) rows of dim 16 (adagrad), made by pulls; two libps workers
 * in threads of this program train it (each step a push of 4096 random
 * ids' gradients), their steps' completion times recorded.  Then a third
 * server starts with --added and `ps_servers add` moves its share to it
 * while they train; later `ps_servers remove 1` moves server 1's share off.
 *
 * A worker's pause: the longest time between two of its steps done while
 * the move ran (from the tool's start to its answer); the move's rate: the
 * coordinator's own figure (MB moved / seconds from the first take to the
 * last load).  Goals (issue 33): adding a server, every worker's pause
 * <= 1 s and the move >= 200 MB/s.
 *
 *   build/bench/servers_bench [--rows 4000000]
 * Prints Markdown tables and GOAL lines (bench/run.sh's format). */
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_time.h"
#include "bench_proc.h"

#define TKEY (1ull << 41)
#define DIM 16
#define BATCH 4096
#define MAXSTEPS 400000

static char workdir[512], bindir[512] = "bin";


/* Run argv (argv[0] a program of bindir) with its output to log. */
static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", bindir, argv[0]);
        execv(path, argv);
        _exit(127);
    }
    return pid;
}


static pid_t start_server(int port, int rank, int added, const char *token)
{
    char bind[64], r[16], log[600];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", port);
    snprintf(r, sizeof r, "%d", rank);
    snprintf(log, sizeof log, "%s/server%d.log", workdir, rank);
    char *argv[] = {"ps_server", "--bind", bind, "--rank", r, "--num-servers", "2",
                    "--num-workers", "2", "--mode", "async", "--threads", "2",
                    "--max-memory", "16G", "--admin-token-file", (char *)token, "--shm", "off",
                    added ? "--added" : NULL, NULL};
    return spawn(argv, log);
}

/* ps_servers with these arguments, waited: its exit status, its answer in out. */
static int servers_tool(const char *list, const char *token, const char *cmd, const char *arg,
                        char *out, size_t cap, int64_t *t0, int64_t *t1)
{
    char log[600];
    snprintf(log, sizeof log, "%s/ps_servers-%s.log", workdir, cmd);
    char *argv[] = {"ps_servers", "--servers", (char *)list, "--admin-token-file",
                    (char *)token, (char *)cmd, (char *)arg, NULL};
    *t0 = ps_now_ns();
    pid_t pid = spawn(argv, log);
    int st = -1;
    waitpid(pid, &st, 0);
    *t1 = ps_now_ns();
    out[0] = 0;
    FILE *f = fopen(log, "r");
    if (f) {
        size_t n = fread(out, 1, cap - 1, f);
        out[n] = 0;
        fclose(f);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct wstate {
    ps_client *c;
    atomic_int *stop;
    int64_t *done_ns;
    int steps, err, nrows;
    unsigned seed;
    char why[512];
} wstate;

static void *worker(void *arg)
{
    wstate *w = arg;
    uint64_t *ids = malloc(BATCH * sizeof *ids);
    float *g = malloc((size_t)BATCH * DIM * sizeof(float));
    for (int i = 0; i < BATCH * DIM; i++)
        g[i] = 0.001f;
    for (int step = 0; step < MAXSTEPS && !atomic_load(w->stop); step++) {
        for (int i = 0; i < BATCH; i++)
            ids[i] = (uint64_t)(rand_r(&w->seed) % (unsigned)w->nrows);
        ps_request r;
        if (ps_client_sparse_push(w->c, TKEY, ids, BATCH, g, step, &r) ||
            ps_request_wait_for(&r, 60000)) {
            snprintf(w->why, sizeof w->why, "step %d: %s", step, r.err);
            w->err = 1;
            break;
        }
        w->done_ns[step] = ps_now_ns();
        w->steps = step + 1;
    }
    free(ids);
    free(g);
    return NULL;
}

/* The longest gap between two steps of w done in [a, b] (the step before a
 * counts as the start); the median gap before a into *median. */
static double pause_of(const wstate *w, int64_t a, int64_t b, double *median)
{
    double longest = 0;
    int n = 0;
    static double gaps[MAXSTEPS];
    for (int s = 1; s < w->steps; s++) {
        double gap = (double)(w->done_ns[s] - w->done_ns[s - 1]) * 1e-9;
        if (w->done_ns[s] < a)
            gaps[n++] = gap;
        else if (w->done_ns[s - 1] <= b && gap > longest)
            longest = gap;
    }
    double m = 0;
    if (n) { /* a median by selection: good enough for a report */
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (gaps[j] < gaps[i]) {
                    double x = gaps[i];
                    gaps[i] = gaps[j];
                    gaps[j] = x;
                }
        m = gaps[n / 2];
    }
    *median = m;
    return longest;
}

static int row_of(const char *out, double *mb, double *secs, double *rate)
{
    const char *p = strstr(out, "objects, ");
    return p && sscanf(p, "objects, %lf MB moved in %lf s (%lf MB/s)", mb, secs, rate) == 3 ? 0
                                                                                          : -1;
}

int main(int argc, char **argv)
{
    int nrows = 4000000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            nrows = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: servers_bench [--rows 4000000]\n");
            return 2;
        }
    }
    const char *bd = getenv("PS_BIN_DIR");
    if (bd)
        snprintf(bindir, sizeof bindir, "%s", bd);
    snprintf(workdir, sizeof workdir, "/tmp/servers_bench.XXXXXX");
    if (!mkdtemp(workdir))
        return 1;
    char token[600];
    snprintf(token, sizeof token, "%s/admin.token", workdir);
    FILE *tf = fopen(token, "w");
    fprintf(tf, "servers-bench-admin-token-0123456789\n");
    fclose(tf);
    chmod(token, 0600);
    int port[3] = {free_port(), free_port(), free_port()};
    pid_t pid[3] = {start_server(port[0], 0, 0, token), start_server(port[1], 1, 0, token), 0};
    char list[256], added[64];
    snprintf(list, sizeof list, "tcp://127.0.0.1:%d,tcp://127.0.0.1:%d", port[0], port[1]);
    snprintf(added, sizeof added, "tcp://127.0.0.1:%d", port[2]);
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = DIM;
    t.opt.kind = PS_OPT_ADAGRAD;
    t.opt.lr = 0.05f;
    ps_client *c[2];
    for (int r = 0; r < 2; r++) {
        ps_client_options o;
        ps_client_options_default(&o);
        o.servers = list;
        o.rank = r;
        o.num_workers = 2;
        o.mode = PS_MODE_ASYNC;
        o.hello_timeout_ms = 30000;
        o.request_timeout_ms = 2000;
        o.shm = 0;
        if (ps_client_open(&o, &c[r]) || ps_client_register_table(c[r], TKEY, &t) ||
            ps_client_start(c[r])) {
            fprintf(stderr, "servers_bench: worker %d: %s\n", r, ps_client_last_error(c[r]));
            return 1;
        }
    }
    /* the rows, made by pulls */
    const int batch = 200000;
    uint64_t *ids = malloc(batch * sizeof *ids);
    float *rows = malloc((size_t)batch * DIM * sizeof(float));
    int64_t f0 = ps_now_ns();
    for (int at = 0; at < nrows; at += batch) {
        int m = nrows - at < batch ? nrows - at : batch;
        for (int i = 0; i < m; i++)
            ids[i] = (uint64_t)(at + i);
        ps_request r;
        if (ps_client_sparse_pull(c[0], TKEY, ids, (size_t)m, rows, 0, &r) ||
            ps_request_wait_for(&r, 120000)) {
            fprintf(stderr, "servers_bench: making rows: %s\n", r.err);
            return 1;
        }
    }
    free(ids);
    free(rows);
    double fill_s = (double)(ps_now_ns() - f0) * 1e-9;
    atomic_int stop_flag = 0;
    wstate w[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&w[r], 0, sizeof w[r]);
        w[r].c = c[r];
        w[r].stop = &stop_flag;
        w[r].nrows = nrows;
        w[r].seed = 7u + (unsigned)r;
        w[r].done_ns = calloc(MAXSTEPS, sizeof(int64_t));
        pthread_create(&th[r], NULL, worker, &w[r]);
    }
    usleep(1500000);
    pid[2] = start_server(port[2], 2, 1, token);
    usleep(300000); /* it listens */
    char out_add[4096], out_rm[4096];
    int64_t a0, a1, r0, r1;
    int rc_add = servers_tool(list, token, "add", added, out_add, sizeof out_add, &a0, &a1);
    usleep(1500000);
    int rc_rm = servers_tool(list, token, "remove", "1", out_rm, sizeof out_rm, &r0, &r1);
    usleep(1500000);
    atomic_store(&stop_flag, 1);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    double amb = 0, asec = 0, arate = 0, rmb = 0, rsec = 0, rrate = 0;
    int ok_add = rc_add == 0 && row_of(out_add, &amb, &asec, &arate) == 0;
    int ok_rm = rc_rm == 0 && row_of(out_rm, &rmb, &rsec, &rrate) == 0;
    double pa = 0, pr = 0, med = 0, m;
    for (int r = 0; r < 2; r++) {
        double x = pause_of(&w[r], a0, a1, &m);
        pa = x > pa ? x : pa;
        med = m > med ? m : med;
        x = pause_of(&w[r], r0, r1, &m);
        pr = x > pr ? x : pr;
    }
    printf("## A server added to, and one removed from, a job training a %d-row table\n\n",
           nrows);
    printf("2 servers (async, 2 update threads each), a table of dim 16 (adagrad) whose rows "
           "were made by pulls in %.1f s; 2 workers push 4096 random ids' gradients a step "
           "(median step %.1f ms before the change).\n\n", fill_s, med * 1e3);
    printf("| change | moved | move time | rate | ps_servers' wall time | longest pause of a "
           "worker's steps |\n|---|---|---|---|---|---|\n");
    printf("| add slot 2 | %.1f MB | %.3f s | %.0f MB/s | %.3f s | %.3f s |\n", amb, asec, arate,
           (double)(a1 - a0) * 1e-9, pa);
    printf("| remove slot 1 | %.1f MB | %.3f s | %.0f MB/s | %.3f s | %.3f s |\n", rmb, rsec,
           rrate, (double)(r1 - r0) * 1e-9, pr);
    printf("\nThe coordinator's answers: `%.*s` and `%.*s`\n", (int)strcspn(out_add, "\n"),
           out_add, (int)strcspn(out_rm, "\n"), out_rm);
    int werr = 0;
    for (int r = 0; r < 2; r++)
        if (w[r].err) {
            fprintf(stderr, "servers_bench: worker %d: %s\n", r, w[r].why);
            werr = 1;
        }
    printf("\nGOAL adding a server to a job with a 4e6-row table, every worker's pause <= 1 s "
           "(%.3f s): %s\n", pa, ok_add && !werr && pa <= 1.0 && nrows >= 4000000 ? "MET"
                                                                                 : "MISSED");
    printf("GOAL adding a server to a job with a 4e6-row table, the move >= 200 MB/s "
           "(%.0f MB/s): %s\n", arate, ok_add && arate >= 200 && nrows >= 4000000 ? "MET"
                                                                                 : "MISSED");
    for (int r = 0; r < 2; r++)
        ps_client_close(c[r]);
    for (int k = 0; k < 3; k++)
        stop(pid[k]);
    if (!ok_add || !ok_rm || werr) {
        fprintf(stderr, "servers_bench: add: %s\nremove: %s\n(logs in %s)\n", out_add, out_rm,
                workdir);
        return 1;
    }
    char cmd[600]; /* the logs go with a run that went well */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    return system(cmd) == 0 ? 0 : 1;
}
