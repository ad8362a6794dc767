/* export_bench: the model leaving the servers (docs/OPERATIONS.md "Export
 * and serve"), on one host.
 *
 * Export and import (the "export" table): one ps_server (sync, --threads 2)
 * holds a table of --rows rows (dim 16, adagrad: one state array), made by
 * one worker's pushes; while that worker trains (a pushpull of 4096 ids a
 * step), a reader exports everything with the state (ps_client_export):
 * MB/s is the export's data files' bytes over its wall time; the pause is
 * the longest time between two of the worker's steps while the export ran,
 * against the median step time before it.  Then a server is started with
 * --import of that export and a reader waits for its hello: the time less
 * that of a server started without it is the import's, MB/s over the same
 * bytes.
 *
 * Reader lookups (the "lookups" table): one server (sync, --threads 2)
 * with 8 tables (dim 16), 2 workers training (each step a pushpull of 512
 * ids per table, 8 tables) alone for --time s, then with 4 reader threads
 * looping ps_client_lookup of 128 ids of each of the 8 tables in one
 * request, alternating --rounds times; the workers' samples/s with readers
 * against without (medians), and the readers' latency p50/p99 over every
 * lookup of the runs with readers.
 *
 *   build/bench/export_bench [--rows 4000000] [--time 3] [--rounds 3]
 *                            [--only export|lookups]
 * Prints Markdown tables and GOAL lines (bench/run.sh's format); the
 * machine may be shared: the load average is printed with the figures. */
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_table_row.h"
#include "ps_time.h"
#include "bench_proc.h"

#define DIM 16
#define NTAB 8
#define STEP_IDS 4096
#define MAXS 200000

static long nrows = 4000000;
static double run_s = 3.0;
static int rounds = 3;
static char workdir[512];


static pid_t start_server(int port, int workers, const char *log, const char *import)
{
    pid_t p = fork();
    if (p == 0) {
        const char *bin = getenv("PS_BIN_DIR") ? getenv("PS_BIN_DIR") : "bin";
        char path[512], ep[64], nw[16];
        snprintf(path, sizeof path, "%s/ps_server", bin);
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        snprintf(nw, sizeof nw, "%d", workers);
        const char *argv[20] = {path, "--bind", ep, "--num-workers", nw, "--mode", "sync",
                                "--threads", "2", "--optimizer", "sgd", "--max-memory", "16G"};
        int n = 13;
        if (import) {
            argv[n++] = "--import";
            argv[n++] = import;
        }
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

static void stop_server(pid_t p)
{
    int st;
    kill(p, SIGTERM);
    waitpid(p, &st, 0);
}

/* CPU seconds (user and system) process p has used, from /proc/p/stat */
static double cpu_of(pid_t p)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    char *at = strrchr(buf, ')'); /* then state, ppid, ...: utime and stime are the 12th, 13th */
    unsigned long long ut = 0, st = 0;
    if (!at || sscanf(at + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                      &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds this process has used */
static double cpu_self(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static ps_client *client(int port, int rank, int nw, int ntab)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.rank = rank;
    o.num_workers = nw;
    o.hello_timeout_ms = 120000;
    o.server_timeout_ms = 600000;
    o.shm = 0;
    ps_client *c;
    if (ps_client_open(&o, &c)) {
        fprintf(stderr, "export_bench: %s\n", ps_client_last_error(NULL));
        exit(1);
    }
    for (int t = 0; t < ntab; t++) {
        ps_table_options to;
        ps_table_options_default(&to);
        to.dim = DIM;
        to.opt.kind = PS_OPT_ADAGRAD;
        to.opt.lr = 0.01f;
        ps_client_register_table(c, 100 + (uint64_t)t, &to);
    }
    if (ps_client_start(c)) {
        fprintf(stderr, "export_bench: %s\n", ps_client_last_error(c));
        exit(1);
    }
    return c;
}

static int wait_ok(ps_request *r, const char *what)
{
    int st = ps_request_wait(r);
    if (st)
        fprintf(stderr, "export_bench: %s: %s\n", what, r->err);
    return st;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_d);
    size_t k = (size_t)ceil(p * (double)n) - 1;
    return v[k < n ? k : n - 1];
}

static double load_avg(void)
{
    double l = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = 0;
        fclose(f);
    }
    return l;
}

/* ---------- export and import ---------- */

typedef struct trainer {
    ps_client *c;
    int ntab, batch;
    int64_t step;
    _Atomic int64_t *stop_at; /* a step to stop at (sync: every worker the same) */
    double *stamp; /* each step's end, s */
    size_t nstamp;
} trainer;

/* one step: every table's pushpull of `batch` ids */
static int train_step(trainer *t, uint64_t *ids, float *g, float *rows, uint64_t salt)
{
    ps_request req[NTAB];
    for (int k = 0; k < t->ntab; k++) {
        for (int i = 0; i < t->batch; i++)
            ids[k * t->batch + i] = ps_table_mix(salt + (uint64_t)(t->step * 131 + i) * 7919 +
                                                 (uint64_t)k) % (uint64_t)nrows;
        if (ps_client_sparse_pushpull(t->c, 100 + (uint64_t)k, ids + k * t->batch, t->batch,
                                      g, ids + k * t->batch, t->batch,
                                      rows + (size_t)k * t->batch * DIM, t->step, &req[k]))
            return -1;
    }
    for (int k = 0; k < t->ntab; k++)
        if (wait_ok(&req[k], "a step"))
            return -1;
    t->step++;
    return 0;
}

static void *train_main(void *arg)
{
    trainer *t = arg;
    size_t n = (size_t)t->ntab * t->batch;
    uint64_t *ids = malloc(n * sizeof *ids);
    float *g = malloc((size_t)t->batch * DIM * sizeof *g), *rows = malloc(n * DIM * sizeof *rows);
    for (int i = 0; i < t->batch * DIM; i++)
        g[i] = 0.001f * (float)(i % 7);
    while (t->step < atomic_load(t->stop_at)) {
        if (train_step(t, ids, g, rows, (uint64_t)(uintptr_t)t))
            break;
        if (t->nstamp < MAXS)
            t->stamp[t->nstamp++] = (double)ps_now_ns() / 1e9;
    }
    free(ids);
    free(g);
    free(rows);
    return NULL;
}

static double start_to_hello(int port, const char *import, const char *log, double *cpu)
{
    int64_t t0 = ps_now_ns();
    pid_t p = start_server(port, 1, log, import);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = ep;
    o.rank = PS_RANK_READER;
    o.hello_timeout_ms = 600000;
    ps_client *c;
    double s = -1;
    if (!ps_client_open(&o, &c)) {
        if (!ps_client_start(c))
            s = (double)(ps_now_ns() - t0) / 1e9;
        else
            fprintf(stderr, "export_bench: %s\n", ps_client_last_error(c));
        ps_client_close(c);
    }
    *cpu = cpu_of(p);
    stop_server(p);
    return s;
}

static uint64_t dir_bytes(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "du -sb %s", dir);
    FILE *f = popen(cmd, "r");
    unsigned long long b = 0;
    if (f) {
        if (fscanf(f, "%llu", &b) != 1)
            b = 0;
        pclose(f);
    }
    return b;
}

static int bench_export(void)
{
    int port = free_port();
    char log[700], dir[700];
    snprintf(log, sizeof log, "%s/server-export.log", workdir);
    snprintf(dir, sizeof dir, "%s/export", workdir);
    pid_t p = start_server(port, 1, log, NULL);
    _Atomic int64_t stop_at = INT64_MAX;
    trainer t = {.c = client(port, 0, 1, 1), .ntab = 1, .batch = 65536, .stop_at = &stop_at};
    t.stamp = malloc(MAXS * sizeof *t.stamp);
    /* the rows: pushes of 65536 ids at a time (each makes its rows) */
    size_t fill = 65536;
    uint64_t *ids = malloc(fill * sizeof *ids);
    float *g = malloc(fill * DIM * sizeof *g), *rows = malloc(fill * DIM * sizeof *rows);
    for (size_t i = 0; i < fill * DIM; i++)
        g[i] = 0.01f * (float)(i % 13);
    fprintf(stderr, "export_bench: filling %ld rows\n", nrows);
    for (long lo = 0; lo < nrows; lo += (long)fill) {
        size_t n = (size_t)(nrows - lo) < fill ? (size_t)(nrows - lo) : fill;
        for (size_t i = 0; i < n; i++)
            ids[i] = (uint64_t)(lo + (long)i);
        ps_request r;
        if (ps_client_sparse_push(t.c, 100, ids, n, g, t.step, &r) || wait_ok(&r, "fill"))
            return 1;
        t.step++;
    }
    free(ids);
    free(g);
    free(rows);
    /* train (4096 ids a step) for a while, then export while it trains */
    t.batch = STEP_IDS;
    pthread_t th;
    pthread_create(&th, NULL, train_main, &t);
    struct timespec ts = {1, 0};
    /* the CPU the training takes a second, before, to tell the export's */
    double w0 = (double)ps_now_ns() / 1e9, sc0 = cpu_of(p), cc0 = cpu_self();
    nanosleep(&ts, NULL);
    size_t before = t.nstamp;
    ps_client *rd = client(port, PS_RANK_READER, 1, 0);
    double t0 = (double)ps_now_ns() / 1e9, sc1 = cpu_of(p), cc1 = cpu_self();
    int rc = ps_client_export(rd, dir, PS_EXPORT_STATE, -1, NULL, NULL, 0, -1);
    double t1 = (double)ps_now_ns() / 1e9, sc2 = cpu_of(p), cc2 = cpu_self();
    double s_rate = (sc1 - sc0) / (t0 - w0), c_rate = (cc1 - cc0) / (t0 - w0);
    if (rc)
        fprintf(stderr, "export_bench: export: %s\n", ps_client_last_error(rd));
    nanosleep(&ts, NULL);
    atomic_store(&stop_at, 0);
    pthread_join(th, NULL);
    ps_client_close(rd);
    ps_client_close(t.c);
    stop_server(p);
    if (rc)
        return 1;
    /* step times before the export, and the longest gap while it ran */
    double *gaps = malloc(MAXS * sizeof *gaps);
    size_t ng = 0;
    for (size_t k = 1; k < before; k++)
        gaps[ng++] = t.stamp[k] - t.stamp[k - 1];
    double med = pct(gaps, ng, 0.5), worst = 0, worst_at = 0;
    for (size_t k = 1; k < t.nstamp; k++)
        if (t.stamp[k] > t0 && t.stamp[k - 1] < t1 && t.stamp[k] - t.stamp[k - 1] > worst) {
            worst = t.stamp[k] - t.stamp[k - 1];
            worst_at = t.stamp[k - 1] - t0;
        }
    /* where in the export (libps logs its phases: snapshot, reading, writing) */
    fprintf(stderr, "export_bench: the longest step began %.2f s into the export's %.2f s\n",
            worst_at, t1 - t0);
    uint64_t bytes = dir_bytes(dir);
    double mb = (double)bytes / 1e6, exp_s = t1 - t0;
    double pause = worst - med;
    /* import: a server with --import against one without */
    char log2[700];
    snprintf(log2, sizeof log2, "%s/server-import.log", workdir);
    double base_cpu, imp_cpu;
    double base = start_to_hello(free_port(), NULL, log2, &base_cpu);
    double imp = start_to_hello(free_port(), dir, log2, &imp_cpu);
    double imp_s = imp - base;
    printf("| rows | data MB | export s | export MB/s | step (median) ms | longest step "
           "while exporting ms | pause ms | import s | import MB/s | load |\n"
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| %ld | %.0f | %.2f | %.0f | %.1f | %.1f | %.0f | %.2f | %.0f | %.2f |\n", nrows, mb,
           exp_s, mb / exp_s, med * 1e3, worst * 1e3, pause * 1e3, imp_s,
           imp_s > 0 ? mb / imp_s : 0, load_avg());
    /* on a shared machine the wall times stretch with the load; the CPU
     * the work took says what a machine to itself would give */
    printf("\nCPU time while exporting: the exporting process %.2f s, the server %.2f s "
           "(while training alone, the second before: %.2f and %.2f s a second); the "
           "import's: %.2f s (the importing server's, less one that imports nothing).\n",
           cc2 - cc1, sc2 - sc1, c_rate, s_rate, imp_cpu - base_cpu);
    printf("\nGOAL export of a %ld-row table (dim 16, adagrad state) >= 300 MB/s (%.0f MB/s): "
           "%s\n", nrows, mb / exp_s, mb / exp_s >= 300 ? "met" : "MISSED");
    printf("GOAL import of it >= 300 MB/s (%.0f MB/s): %s\n", imp_s > 0 ? mb / imp_s : 0,
           imp_s > 0 && mb / imp_s >= 300 ? "met" : "MISSED");
    printf("GOAL live export's pause in training <= 0.5 s (%.2f s): %s\n", pause,
           pause <= 0.5 ? "met" : "MISSED");
    free(gaps);
    free(t.stamp);
    return 0;
}

/* ---------- reader lookups ---------- */

typedef struct looker {
    ps_client *c;
    atomic_int *stop;
    double *lat;
    size_t nlat;
    unsigned seed;
} looker;

static void *look_main(void *arg)
{
    looker *l = arg;
    uint64_t ids[NTAB][128], keys[NTAB];
    const uint64_t *idp[NTAB];
    size_t n[NTAB];
    static __thread float rows[NTAB][128 * DIM];
    float *rp[NTAB];
    for (int k = 0; k < NTAB; k++) {
        keys[k] = 100 + (uint64_t)k;
        idp[k] = ids[k];
        n[k] = 128;
        rp[k] = rows[k];
    }
    uint64_t x = l->seed;
    while (!atomic_load(l->stop)) {
        for (int k = 0; k < NTAB; k++)
            for (int i = 0; i < 128; i++)
                ids[k][i] = ps_table_mix(++x) % 1000000;
        int64_t t0 = ps_now_ns();
        ps_request r;
        if (ps_client_lookup(l->c, NTAB, keys, idp, n, rp, &r) || wait_ok(&r, "lookup"))
            break;
        if (l->nlat < MAXS)
            l->lat[l->nlat++] = (double)(ps_now_ns() - t0) / 1e6;
    }
    return NULL;
}

/* samples/s of 2 workers for run_s, with `readers` readers looping */
static double lookups_round(ps_client **w, ps_client **r, int readers, looker *lk)
{
    static int64_t steps_done;
    trainer t[2];
    pthread_t th[2], lt[4];
    atomic_int stop = 0;
    _Atomic int64_t stop_at = INT64_MAX;
    for (int k = 0; k < 2; k++) {
        memset(&t[k], 0, sizeof t[k]);
        t[k].c = w[k];
        t[k].ntab = NTAB;
        t[k].batch = 512;
        t[k].step = steps_done;
        t[k].stop_at = &stop_at;
        t[k].stamp = malloc(MAXS * sizeof(double));
    }
    for (int k = 0; k < readers; k++) {
        lk[k].c = r[k];
        lk[k].stop = &stop;
        pthread_create(&lt[k], NULL, look_main, &lk[k]);
    }
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, train_main, &t[k]);
    struct timespec ts = {(time_t)run_s, (long)((run_s - (double)(time_t)run_s) * 1e9)};
    nanosleep(&ts, NULL);
    /* sync: both stop after the same step (a round needs both) */
    int64_t a = t[0].step, b = t[1].step;
    atomic_store(&stop_at, (a > b ? a : b) + 1);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    atomic_store(&stop, 1);
    for (int k = 0; k < readers; k++)
        pthread_join(lt[k], NULL);
    steps_done = t[0].step;
    size_t n = t[0].nstamp;
    double secs = n > 1 ? t[0].stamp[n - 1] - t[0].stamp[0] : run_s;
    double samples = (double)(n > 1 ? n - 1 : 0) * 512.0 * 2; /* both workers' */
    for (int k = 0; k < 2; k++)
        free(t[k].stamp);
    return samples / secs;
}

static int bench_lookups(void)
{
    int port = free_port();
    char log[700];
    snprintf(log, sizeof log, "%s/server-lookups.log", workdir);
    pid_t p = start_server(port, 2, log, NULL);
    ps_client *w[2], *r[4];
    /* the two workers say hello in turn (a sync server waits for both only
     * at its first round) */
    w[0] = client(port, 0, 2, NTAB);
    w[1] = client(port, 1, 2, NTAB);
    for (int k = 0; k < 4; k++)
        r[k] = client(port, PS_RANK_READER, 1, NTAB);
    looker lk[4];
    memset(lk, 0, sizeof lk);
    for (int k = 0; k < 4; k++) {
        lk[k].lat = malloc(MAXS * sizeof(double));
        lk[k].seed = 1000u * (unsigned)k;
    }
    double alone[16], with[16];
    lookups_round(w, r, 0, lk); /* warm-up: the rows made */
    for (int k = 0; k < 4; k++)
        lk[k].nlat = 0;
    for (int i = 0; i < rounds; i++) {
        alone[i] = lookups_round(w, r, 0, lk);
        with[i] = lookups_round(w, r, 4, lk);
        fprintf(stderr, "export_bench: round %d: %.0f samples/s alone, %.0f with readers\n", i,
                alone[i], with[i]);
    }
    size_t nl = 0;
    for (int k = 0; k < 4; k++)
        nl += lk[k].nlat;
    double *all = malloc((nl ? nl : 1) * sizeof *all);
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        memcpy(all + at, lk[k].lat, lk[k].nlat * sizeof *all);
        at += lk[k].nlat;
    }
    double a = pct(alone, (size_t)rounds, 0.5), b = pct(with, (size_t)rounds, 0.5);
    double p50 = pct(all, nl, 0.5), p99 = pct(all, nl, 0.99);
    printf("| workers' samples/s alone | with 4 readers | ratio | lookups | lookups/s | "
           "p50 ms | p99 ms | load |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| %.0f | %.0f | %.2f | %zu | %.0f | %.2f | %.2f | %.2f |\n", a, b, b / a, nl,
           (double)nl / (run_s * rounds), p50, p99, load_avg());
    printf("\nGOAL reader lookups of 128 ids x 8 tables from 4 threads while 2 workers train: "
           "p99 <= 2 ms (%.2f ms): %s\n", p99, p99 <= 2.0 ? "met" : "MISSED");
    printf("GOAL the workers' samples/s with the readers >= 0.9x without (%.2fx): %s\n", b / a,
           b >= 0.9 * a ? "met" : "MISSED");
    for (int k = 0; k < 4; k++) {
        ps_client_close(r[k]);
        free(lk[k].lat);
    }
    ps_client_close(w[0]);
    ps_client_close(w[1]);
    stop_server(p);
    free(all);
    return 0;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            nrows = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--time"))
            run_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = argv[i + 1];
        else {
            fprintf(stderr, "export_bench: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 16 || nrows < 1 || run_s <= 0)
        return 2;
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(workdir, sizeof workdir, "%s/ps_export_bench.%d", tmp, (int)getpid());
    mkdir(workdir, 0755);
    int rc = 0;
    if (!only || !strcmp(only, "export")) {
        printf("### Export and import\n\n");
        rc |= bench_export();
    }
    if (!only || !strcmp(only, "lookups")) {
        printf("\n### Reader lookups while workers train\n\n");
        rc |= bench_lookups();
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", workdir);
    if (system(cmd) != 0)
        fprintf(stderr, "export_bench: cannot remove %s\n", workdir);
    return rc;
}
