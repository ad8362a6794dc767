/* sparse_bench: an embedding table through one ps_server process on
 * loopback, against a gather/scatter of the same rows in one process.
 *
 * Rows per second (the "rows" table): one libps client (async, one worker)
 * and one server (--threads 1: one update thread owns the table) on
 * tcp://127.0.0.1.  Each request moves 4096 distinct ids (bench_ids.h:
 * Zipf 1.05 over --ids ids, hashed), two requests in flight; every row
 * exists (a warm-up pulled every batch).  Per dim (16, 64, 128):
 *   pull     ps_client_sparse_pull of a batch into the caller's buffer
 *   gather   memcpy of the same rows from a dense array into the same buffer,
 *            in this process (the memory-bandwidth bound of a pull)
 *   push     ps_client_sparse_push of one gradient row per id (adagrad on
 *            the server)
 *   scatter  memcpy of the gradient rows into the dense rows, in this process
 * Wall-clock rows/s, the variants alternating, medians of --rounds rounds of
 * about --time s each; "server CPU" is rows per second of CPU the server
 * process used meanwhile (its update thread and its I/O thread together,
 * from /proc): what one server thread sustains when it has a core.
 *
 * Memory and checkpoints (the "store" table): a server with one table (dim
 * 16, adagrad) filled with --fill rows by pulls, its STATS (table bytes
 * against the rows' values and optimizer state), then stopped: its last
 * checkpoint (a full one: the first) is written, and the "checkpoint N
 * written: ... X MiB in Y ms" line says how fast; then a server started
 * with --restore, whose "restored" line comes Z ms after its "starting"
 * line (reading, checking and rebuilding every row; the process's start is
 * in it).  The checkpoint directory is under TMPDIR.
 *
 *   build/bench/sparse_bench [--time 0.3] [--rounds 5] [--ids 1048576]
 *                            [--fill 4000000] [--only rows|store] [--dim 16|64|128]
 * Prints Markdown tables and GOAL lines (bench/run.sh's format). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_time.h"

#include "bench_ids.h"
#include "bench_proc.h"

#define MAX_ROUNDS 31
#define INFLIGHT 8

enum { V_PULL, V_GATHER, V_PUSH, V_SCATTER, NV };

static double row_s = 0.3;
static int rounds = 5;
static int only_dim; /* --dim: that dim alone (a profile's run) */
static char workdir[512];


/* A ps_server on tcp://127.0.0.1:port with `more` flags (NULL-terminated),
 * its output to log. */
static pid_t start_server(int port, const char *log, const char *const *more)
{
    pid_t p = fork();
    if (p == 0) {
        const char *bin = getenv("PS_BIN_DIR") ? getenv("PS_BIN_DIR") : "bin";
        char path[512], ep[64];
        snprintf(path, sizeof path, "%s/ps_server", bin);
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        const char *argv[32] = {path, "--bind", ep, "--num-workers", "1", "--mode", "async",
                                "--threads", "1", "--optimizer", "sgd"};
        int n = 11;
        for (int i = 0; more && more[i] && n < 31; i++)
            argv[n++] = more[i];
        argv[n] = NULL;
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(path, (char *const *)argv);
        _exit(127);
    }
    return p;
}

static int stop_server(pid_t p)
{
    int st = 0;
    kill(p, SIGTERM);
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* CPU seconds process p used so far (user + system). */
static double proc_cpu_s(pid_t p)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* fields after the command's closing parenthesis: state is field 3,
     * utime 14, stime 15 */
    const char *q = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!q || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static ps_client *open_client(int port)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.mode = PS_MODE_ASYNC;
    o.hello_timeout_ms = 20000;
    ps_client *c;
    if (ps_client_open(&o, &c)) {
        fprintf(stderr, "sparse_bench: %s\n", ps_client_last_error(NULL));
        return NULL;
    }
    return c;
}

static void table_opts(ps_table_options *t, uint32_t dim)
{
    ps_table_options_default(t);
    t->dim = dim;
    t->opt.kind = PS_OPT_ADAGRAD;
    t->opt.lr = 1e-3f;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- rows per second ---- */

typedef struct rows_bench {
    ps_client *c;
    pid_t server;
    size_t nids;
    uint64_t ids[NBATCH][BATCH];
    uint32_t idx[NBATCH][BATCH];
    float *dense;          /* nids x dim */
    float *buf[INFLIGHT];  /* BATCH x dim each */
    int64_t clock[3];      /* per table: pushes made */
} rows_bench;

/* `calls` requests of variant v on table key (dim d), INFLIGHT at a time;
 * rows per wall second, and the server's CPU seconds into *srv_cpu. */
static double run_variant(rows_bench *b, int v, uint64_t key, size_t d, int calls,
                          double *srv_cpu)
{
    ps_request req[INFLIGHT];
    int busy[INFLIGHT] = {0};
    double c0 = proc_cpu_s(b->server);
    int64_t t0 = ps_now_ns();
    for (int k = 0; k < calls; k++) {
        int s = k % INFLIGHT, batch = k % NBATCH;
        const uint64_t *ids = b->ids[batch];
        const uint32_t *idx = b->idx[batch];
        float *buf = b->buf[s];
        if (busy[s] && ps_request_wait(&req[s]) != 0) {
            fprintf(stderr, "sparse_bench: %s\n", req[s].err);
            exit(1);
        }
        busy[s] = 0;
        int rc = 0;
        switch (v) {
        case V_PULL:
            rc = ps_client_sparse_pull(b->c, key, ids, BATCH, buf, 0, &req[s]);
            busy[s] = 1;
            break;
        case V_PUSH:
            rc = ps_client_sparse_push(b->c, key, ids, BATCH, buf, b->clock[key - 1]++, &req[s]);
            busy[s] = 1;
            break;
        case V_GATHER:
            for (size_t i = 0; i < BATCH; i++)
                memcpy(buf + i * d, b->dense + (size_t)idx[i] * d, d * sizeof(float));
            break;
        case V_SCATTER:
            for (size_t i = 0; i < BATCH; i++)
                memcpy(b->dense + (size_t)idx[i] * d, buf + i * d, d * sizeof(float));
            break;
        }
        if (rc) {
            fprintf(stderr, "sparse_bench: post failed: %d\n", rc);
            exit(1);
        }
    }
    for (int s = 0; s < INFLIGHT; s++)
        if (busy[s] && ps_request_wait(&req[s]) != 0) {
            fprintf(stderr, "sparse_bench: %s\n", req[s].err);
            exit(1);
        }
    double wall = (double)(ps_now_ns() - t0) * 1e-9;
    *srv_cpu = v == V_PULL || v == V_PUSH ? proc_cpu_s(b->server) - c0 : 0;
    return (double)calls * BATCH / wall;
}

static int rows_part(size_t nids)
{
    static rows_bench b;
    b.nids = nids;
    bench_make_batches(nids, 1.05, 12345, b.ids, b.idx);
    int port = free_port();
    char log[600];
    snprintf(log, sizeof log, "%s/rows-server.log", workdir);
    const char *more[] = {"--quiet", NULL};
    b.server = start_server(port, log, more);
    if (!(b.c = open_client(port)))
        return 1;
    const uint32_t dims[3] = {16, 64, 128};
    for (int t = 0; t < 3; t++) {
        ps_table_options o;
        table_opts(&o, dims[t]);
        if (ps_client_register_table(b.c, (uint64_t)t + 1, &o))
            return 1;
    }
    if (ps_client_start(b.c)) {
        fprintf(stderr, "sparse_bench: %s (server log %s)\n", ps_client_last_error(b.c), log);
        return 1;
    }
    fprintf(stderr, "sparse_bench: %d batches of %d distinct ids, Zipf 1.05 over %zu ids, %d "
            "requests in flight; medians of %d rounds of ~%.2f s per variant\n", NBATCH, BATCH,
            nids, INFLIGHT, rounds, row_s);
    printf("| dim | pull rows/s | gather rows/s | pull / gather | push rows/s | scatter rows/s "
           "| push / scatter | pull rows per server CPU s | push rows per server CPU s |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    double ratio_min = 1e30, pull16 = 0, push16 = 0;
    for (int t = 0; t < 3; t++) {
        size_t d = dims[t];
        uint64_t key = (uint64_t)t + 1;
        if (only_dim && (int)d != only_dim)
            continue;
        b.dense = malloc(nids * d * sizeof(float));
        for (int s = 0; s < INFLIGHT; s++)
            b.buf[s] = malloc(BATCH * d * sizeof(float));
        if (!b.dense || !b.buf[0] || !b.buf[INFLIGHT - 1]) {
            fprintf(stderr, "sparse_bench: out of memory for dim %zu\n", d);
            return 1;
        }
        for (size_t i = 0; i < nids * d; i++)
            b.dense[i] = 1e-2f;
        for (int s = 0; s < INFLIGHT; s++)
            for (size_t i = 0; i < BATCH * d; i++)
                b.buf[s][i] = 1e-3f * (float)((int)(i % 13) - 6);
        double cpu, rps[NV][MAX_ROUNDS], cpu_sum[NV] = {0}, rows_sum[NV] = {0};
        int calls[NV];
        run_variant(&b, V_PULL, key, d, NBATCH, &cpu); /* every row exists from here on */
        for (int v = 0; v < NV; v++) { /* calibrate: calls for ~row_s */
            double r = run_variant(&b, v, key, d, NBATCH, &cpu);
            calls[v] = (int)(row_s * r / BATCH);
            if (calls[v] < NBATCH)
                calls[v] = NBATCH;
        }
        for (int r = 0; r < rounds; r++)
            for (int v = 0; v < NV; v++) {
                rps[v][r] = run_variant(&b, v, key, d, calls[v], &cpu);
                cpu_sum[v] += cpu;
                rows_sum[v] += (double)calls[v] * BATCH;
            }
        double m[NV];
        for (int v = 0; v < NV; v++)
            m[v] = median(rps[v], rounds);
        double pull_cpu = cpu_sum[V_PULL] > 0 ? rows_sum[V_PULL] / cpu_sum[V_PULL] : 0;
        double push_cpu = cpu_sum[V_PUSH] > 0 ? rows_sum[V_PUSH] / cpu_sum[V_PUSH] : 0;
        printf("| %zu | %.3g | %.3g | %.2f | %.3g | %.3g | %.2f | %.3g | %.3g |\n", d, m[V_PULL],
               m[V_GATHER], m[V_PULL] / m[V_GATHER], m[V_PUSH], m[V_SCATTER],
               m[V_PUSH] / m[V_SCATTER], pull_cpu, push_cpu);
        fflush(stdout);
        double lo = m[V_PULL] / m[V_GATHER] < m[V_PUSH] / m[V_SCATTER]
                        ? m[V_PULL] / m[V_GATHER] : m[V_PUSH] / m[V_SCATTER];
        if (lo < ratio_min)
            ratio_min = lo;
        if (d == 16) {
            pull16 = m[V_PULL];
            push16 = m[V_PUSH];
        }
        free(b.dense);
        for (int s = 0; s < INFLIGHT; s++)
            free(b.buf[s]);
    }
    ps_client_close(b.c);
    stop_server(b.server);
    printf("\nGOAL rows through one server >= 0.5x a gather/scatter of the same rows in one "
           "process, at dim 16, 64 and 128 (lowest: %.2fx): %s\n", ratio_min,
           ratio_min >= 0.5 ? "met" : "MISSED");
    double lo16 = pull16 < push16 ? pull16 : push16;
    printf("GOAL dim 16 through one server thread >= 5 million rows/s, pull and push (pull "
           "%.2f M, push %.2f M): %s\n", pull16 / 1e6, push16 / 1e6,
           lo16 >= 5e6 ? "met" : "MISSED");
    return 0;
}

/* ---- memory and checkpoints ---- */

/* HH:MM:SS.mmm of the first (last: last = 1) log line holding `what`, in
 * seconds of the day, the line into `line`; -1 when there is none. */
static double line_time_at(const char *log, const char *what, int last, char *line, size_t len)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return -1;
    double t = -1;
    char *cur = malloc(len);
    while (cur && fgets(cur, (int)len, f)) {
        if (!strstr(cur, what))
            continue;
        const char *p = strstr(cur, " info ");
        int h, m;
        double s;
        if (p && sscanf(p + 6, "%d:%d:%lf", &h, &m, &s) == 3) {
            t = h * 3600.0 + m * 60.0 + s;
            snprintf(line, len, "%s", cur);
        }
        if (!last)
            break;
    }
    free(cur);
    fclose(f);
    return t;
}

static double line_time(const char *log, const char *what, char *line, size_t len)
{
    return line_time_at(log, what, 0, line, len);
}

/* Wait (at most 120 s) until log holds `what`. */
static int wait_line(const char *log, const char *what, pid_t p)
{
    char line[2048];
    for (int i = 0; i < 2400; i++) {
        if (line_time(log, what, line, sizeof line) >= 0)
            return 0;
        if (waitpid(p, NULL, WNOHANG) == p)
            return -1;
        usleep(50000);
    }
    return -1;
}

static int store_part(size_t fill)
{
    char dir[600], log[600], rlog[600], line[2048];
    snprintf(dir, sizeof dir, "%s/ckpt", workdir);
    snprintf(log, sizeof log, "%s/store-server.log", workdir);
    snprintf(rlog, sizeof rlog, "%s/restore-server.log", workdir);
    int port = free_port();
    /* checkpoints only at stop: the first one, a full one */
    const char *more[] = {"--checkpoint-dir", dir, "--checkpoint-every", "86400s", NULL};
    pid_t srv = start_server(port, log, more);
    ps_client *c = open_client(port);
    if (!c)
        return 1;
    const uint32_t dim = 16;
    ps_table_options o;
    table_opts(&o, dim);
    if (ps_client_register_table(c, 1, &o) || ps_client_start(c)) {
        fprintf(stderr, "sparse_bench: %s (server log %s)\n", ps_client_last_error(c), log);
        return 1;
    }
    /* fill: pushes to distinct hashed ids, BATCH a request (pulled rows
     * alone are the initializer's, which a checkpoint need not hold) */
    static uint64_t ids[BATCH];
    float *rows = malloc(BATCH * dim * sizeof(float));
    if (!rows)
        return 1;
    for (size_t i = 0; i < BATCH * dim; i++)
        rows[i] = 1e-3f * (float)((int)(i % 13) - 6);
    int64_t t0 = ps_now_ns(), step = 0;
    for (size_t done = 0; done < fill; done += BATCH) {
        size_t n = fill - done < BATCH ? fill - done : BATCH;
        for (size_t i = 0; i < n; i++)
            ids[i] = (done + i + 1) * 0x9e3779b97f4a7c15ull;
        ps_request r;
        if (ps_client_sparse_push(c, 1, ids, n, rows, step++, &r) || ps_request_wait(&r)) {
            fprintf(stderr, "sparse_bench: fill: %s\n", r.err);
            return 1;
        }
    }
    double fill_s = (double)(ps_now_ns() - t0) * 1e-9;
    free(rows);
    ps_stats st;
    if (ps_client_stats(c, 0, &st)) {
        fprintf(stderr, "sparse_bench: stats: %s\n", ps_client_last_error(c));
        return 1;
    }
    ps_client_close(c);
    /* values and adagrad's sums: 2 x dim floats */
    double own = 2.0 * dim * sizeof(float);
    double per_row = (double)st.table_bytes / (double)st.rows, beyond = per_row - own;
    int rc = stop_server(srv);
    /* the last checkpoint, at stop: "checkpoint N written: PATH, ..., X MiB in Y ms" */
    double wmib = 0, wms = 0;
    char path[700] = "";
    const char *mib = line_time_at(log, " written: ", 1, line, sizeof line) >= 0
                          ? strstr(line, " MiB in ") : NULL;
    if (mib) {
        const char *q = mib;
        while (q > line && q[-1] != ' ')
            q--;
        wmib = strtod(q, NULL);
        wms = strtod(mib + 8, NULL);
        const char *w = strstr(line, " written: ") + 10, *e = strchr(w, ',');
        snprintf(path, sizeof path, "%.*s", e ? (int)(e - w) : 0, w);
    }
    if (rc || !mib || wms <= 0) {
        fprintf(stderr, "sparse_bench: the server (exit %d) wrote no checkpoint; see %s\n", rc,
                log);
        return 1;
    }
    /* the size on disk, for the restore's rate */
    struct stat sb;
    double bytes = stat(path, &sb) == 0 ? (double)sb.st_size : wmib * 1048576.0;
    const char *rmore[] = {"--checkpoint-dir", dir, "--checkpoint-every", "86400s", "--restore",
                           NULL};
    pid_t rs = start_server(free_port(), rlog, rmore);
    if (wait_line(rlog, "listening on", rs)) {
        fprintf(stderr, "sparse_bench: the restore failed; see %s\n", rlog);
        return 1;
    }
    double ts = line_time(rlog, "starting", line, sizeof line);
    double tr = line_time(rlog, "restored", line, sizeof line);
    stop_server(rs);
    double restore_s = tr - ts;
    double wrate = wmib * 1048576.0 / (wms * 1e-3) / 1e6, rrate = bytes / restore_s / 1e6;
    printf("| rows (dim 16, adagrad) | filled in | bytes a row | of which values and state "
           "| beyond them | checkpoint | written in | write MB/s | restored in | restore MB/s |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| %llu | %.1f s | %.1f | %.0f | %.1f | %.0f MB | %.0f ms | %.0f | %.0f ms | %.0f |\n",
           (unsigned long long)st.rows, fill_s, per_row, own, beyond, bytes / 1e6, wms, wrate,
           restore_s * 1e3, rrate);
    printf("\nGOAL server memory per row <= 16 bytes beyond the values and optimizer state "
           "(%.1f): %s\n", beyond, beyond <= 16.0 ? "met" : "MISSED");
    printf("GOAL checkpoint write and restore >= 250 MB/s (write %.0f, restore %.0f): %s\n",
           wrate, rrate, wrate >= 250 && rrate >= 250 ? "met" : "MISSED");
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: sparse_bench [--time S (0.3)] [--rounds R (5)] [--ids N (1048576)] "
                    "[--fill ROWS (4000000)] [--only rows|store] [--dim D]\n");
}

int main(int argc, char **argv)
{
    size_t nids = 1u << 20, fill = 4000000;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--time"))
            row_s = atof(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--ids"))
            nids = (size_t)atol(v);
        else if (!strcmp(a, "--fill"))
            fill = (size_t)atol(v);
        else if (!strcmp(a, "--only"))
            only = v;
        else if (!strcmp(a, "--dim"))
            only_dim = atoi(v);
        else {
            usage();
            return 2;
        }
    }
    if (nids < 2 * BATCH || nids > UINT32_MAX || rounds < 1 || rounds > MAX_ROUNDS ||
        row_s <= 0 || fill < 1 ||
        (only && strcmp(only, "rows") && strcmp(only, "store"))) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(workdir, sizeof workdir, "%s/ps_sparse_bench.XXXXXX", tmp);
    if (!mkdtemp(workdir)) {
        fprintf(stderr, "sparse_bench: cannot make a directory under %s: %s\n", tmp,
                strerror(errno));
        return 1;
    }
    int rc = 0;
    if (!only || !strcmp(only, "rows"))
        rc = rows_part(nids);
    if (!rc && (!only || !strcmp(only, "store"))) {
        printf("\n");
        rc = store_part(fill);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
    if (!getenv("BENCH_KEEP") && system(cmd) != 0)
        fprintf(stderr, "sparse_bench: could not remove %s\n", workdir);
    return rc;
}
