/* repl_bench: replicas and failover (docs/DESIGN.md "Replicas and
 * failover") on loopback, with a real etcd started here.
 *
 * Every part runs shard groups of two ps_server processes each (a primary
 * and a replica, --group/--member/--coord) and libps clients in threads of
 * this program as the workers (2 workers, each its own ps_client).  A kill
 * is SIGKILL of a group's primary; its replica takes over, the workers move
 * to it, and a new process for the killed slot is started at once, which
 * copies the group's state from the new primary and becomes its replica
 * ("caught up" in its log) before the next kill.
 *
 *  pause    sync, 2 groups, 4 dense keys of 256 Ki floats: each worker steps
 *           (a pushpull of every key, waited), its steps' completion times
 *           recorded; --kills (10) kills, groups in turn, 0.3-0.8 s apart
 *           once the previous replacement caught up.  A worker's pause for a
 *           kill: from its last step done before the kill to its first step
 *           done after it.  Goal: median <= 1 s, max <= 3 s.
 *  loss     async and sync, 2 groups, a table (dim 8, sgd, zeros) and a
 *           dense key; every step of each worker pushes a random third of
 *           64 ids and the key with gradients exact in float (sync: as a
 *           pushpull, async: a push); --loss-kills (20) kills while they
 *           train.  Then every row and element must hold exactly what the
 *           acknowledged pushes sum to, and every partition's and chunk's
 *           version exactly the pushes (async) or rounds (sync): "lost" and
 *           "twice" count what differs.  Goal: 0.
 *  catchup  one group; a table of --rows (4e6) rows of dim 16 (adagrad)
 *           made by pulls, then 2 workers train it (async pushes of random
 *           ids) while the replica is killed and a new one copies the
 *           group's state: bytes and seconds from its join to its loading
 *           the snapshot (its own log line).  Goal: >= 200 MB/s.
 *
 *   build/bench/repl_bench [--only pause|loss|catchup] [--kills 10]
 *                          [--loss-kills 20] [--rows 4000000]
 * Prints Markdown tables and GOAL lines (bench/run.sh's format). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
#include <time.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_time.h"
#include "bench_proc.h"

static char workdir[512], etcd_url[64], bindir[512] = "bin";
static pid_t etcd_pid;

/* ---------------------------------------------------------------- processes */


static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setpgid(0, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}


static int count_in(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* The last line of path that holds needle, into out; 0 or -1. */
static int last_line(const char *path, const char *needle, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int found = -1;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) {
            snprintf(out, cap, "%s", line);
            found = 0;
        }
    fclose(f);
    return found;
}

static int wait_count(const char *path, const char *needle, int n, int ms)
{
    for (int t = 0; t < ms / 20; t++) {
        if (count_in(path, needle) >= n)
            return 0;
        usleep(20000);
    }
    return -1;
}

static int start_etcd(void)
{
    int cp = free_port(), pp = free_port();
    char dir[600], curl[64], purl[64], cluster[96], log[600];
    snprintf(dir, sizeof dir, "%s/etcd", workdir);
    snprintf(log, sizeof log, "%s/etcd.log", workdir);
    snprintf(curl, sizeof curl, "http://127.0.0.1:%d", cp);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pp);
    snprintf(cluster, sizeof cluster, "default=%s", purl);
    char *argv[] = {"/usr/bin/etcd", "--data-dir", dir, "--listen-client-urls", curl,
                    "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                    "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                    "--log-level", "warn", NULL};
    if (access(argv[0], X_OK))
        return -1;
    etcd_pid = spawn(argv, log);
    for (int t = 0; t < 200; t++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cp)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) {
            snprintf(etcd_url, sizeof etcd_url, "%s", curl);
            usleep(300000);
            return 0;
        }
        usleep(50000);
    }
    return -1;
}

/* ---------------------------------------------------------------- groups */

typedef struct member {
    int port;
    pid_t pid;
    char log[600];
} member;

typedef struct group {
    int g;
    member m[2];
    int primary; /* which member is the primary now */
    int caught;  /* "caught up" lines seen on either member so far */
    char eps[256];
    const char *job, *words;
    int ns;
} group;

static int start_member(group *gr, int k)
{
    member *m = &gr->m[k];
    char bin[600], bind[64], rank[16], ns[16], mem[16];
    snprintf(bin, sizeof bin, "%s/ps_server", bindir);
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", m->port);
    snprintf(rank, sizeof rank, "%d", gr->g);
    snprintf(ns, sizeof ns, "%d", gr->ns);
    snprintf(mem, sizeof mem, "%d", k);
    char *argv[64] = {bin, "--bind", bind, "--rank", rank, "--num-servers", ns, "--group",
                      gr->eps, "--member", mem, "--coord", etcd_url, "--job", (char *)gr->job};
    int n = 15;
    char *words = strdup(gr->words), *save = NULL;
    for (char *w = strtok_r(words, " ", &save); w && n < 63; w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    m->pid = spawn(argv, m->log);
    free(words);
    return m->pid > 0 ? 0 : -1;
}

static int start_group(group *gr, int g, int ns, const char *job, const char *words)
{
    memset(gr, 0, sizeof *gr);
    gr->g = g;
    gr->ns = ns;
    gr->job = job;
    gr->words = words;
    for (int k = 0; k < 2; k++) {
        gr->m[k].port = free_port();
        snprintf(gr->m[k].log, sizeof gr->m[k].log, "%s/%s-g%d-m%d.log", workdir, job, g, k);
    }
    snprintf(gr->eps, sizeof gr->eps, "tcp://127.0.0.1:%d|tcp://127.0.0.1:%d", gr->m[0].port,
             gr->m[1].port);
    return start_member(gr, 0) || start_member(gr, 1) ? -1 : 0;
}

static void stop_group(group *gr)
{
    for (int k = 0; k < 2; k++)
        stop(gr->m[k].pid);
}

/* Kill the primary of gr (SIGKILL), start a new process for its slot at
 * once, and wait until that one caught up (a member of the group again).
 * *kill_ns: when the kill was sent.  0, or -1 (it did not catch up in 60 s). */
static int kill_primary(group *gr, int64_t *kill_ns)
{
    int k = gr->primary;
    *kill_ns = ps_now_ns();
    kill(gr->m[k].pid, SIGKILL);
    waitpid(gr->m[k].pid, NULL, 0);
    gr->primary = 1 - k;
    start_member(gr, k);
    gr->caught++;
    /* the new primary says "caught up (" once etcd has the replacement */
    for (int t = 0; t < 3000; t++) {
        if (count_in(gr->m[0].log, "caught up (") + count_in(gr->m[1].log, "caught up (") >=
            gr->caught)
            return 0;
        usleep(20000);
    }
    return -1;
}

static void rand_sleep_ms(int lo, int hi) { usleep((useconds_t)(lo + rand() % (hi - lo + 1)) * 1000); }

/* ---------------------------------------------------------------- workers */

static ps_client *open_client(const char *servers, int rank, int nw, int mode, char *why,
                              size_t why_len, const uint64_t *keys, int nkeys, size_t n,
                              const ps_table_options *table, uint64_t tkey)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = servers;
    o.rank = rank;
    o.num_workers = nw;
    o.mode = mode;
    o.hello_timeout_ms = 30000;
    o.request_timeout_ms = 2000;
    o.heartbeat_ms = 250;
    o.shm = 0;
    ps_client *c;
    if (ps_client_open(&o, &c)) {
        snprintf(why, why_len, "%s", ps_client_last_error(NULL));
        return NULL;
    }
    for (int k = 0; k < nkeys; k++)
        ps_client_register(c, keys[k], n);
    if (table)
        ps_client_register_table(c, tkey, table);
    if (ps_client_start(c)) {
        snprintf(why, why_len, "%s", ps_client_last_error(c));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

#define MAXSTEPS 200000

typedef struct wstate {
    ps_client *c;
    int rank, mode;
    const uint64_t *keys;
    int nkeys;
    size_t n;
    atomic_int *stop; /* the step to stop before (sync: both workers the same) */
    int64_t *done_ns; /* per step: when it was done */
    int steps;
    int err;
    char why[512];
    /* the loss part: a table and its exact sums */
    uint64_t tkey;
    int tdim, tids;
    float *want; /* [tids * tdim]: what this worker pushed, negated */
    unsigned seed;
} wstate;

static void *dense_worker(void *arg)
{
    wstate *w = arg;
    size_t n = w->n;
    float *g = malloc(n * sizeof(float)), *out = malloc((size_t)w->nkeys * n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        g[i] = 1.0f / 1024;
    ps_request *r = calloc((size_t)w->nkeys, sizeof *r);
    for (int step = 0; step < MAXSTEPS && step < atomic_load(w->stop); step++) {
        for (int k = 0; k < w->nkeys; k++)
            if (ps_client_pushpull(w->c, w->keys[k], g, out + (size_t)k * n, step, &r[k]))
                w->err = 1;
        for (int k = 0; k < w->nkeys; k++)
            if (ps_request_wait_for(&r[k], 60000)) {
                snprintf(w->why, sizeof w->why, "step %d key %d: %s", step, k, r[k].err);
                w->err = 1;
            }
        if (w->err)
            break;
        w->done_ns[step] = ps_now_ns();
        w->steps = step + 1;
    }
    free(g);
    free(out);
    free(r);
    return NULL;
}

/* The loss part's worker: a table and a dense key, gradients exact in float. */
static void *loss_worker(void *arg)
{
    wstate *w = arg;
    int dim = w->tdim;
    size_t n = w->n;
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    float *grads = malloc((size_t)w->tids * dim * sizeof(float));
    float *rows = malloc((size_t)w->tids * dim * sizeof(float));
    uint64_t *ids = malloc((size_t)w->tids * sizeof *ids), *pull = malloc(sizeof *pull);
    for (size_t i = 0; i < n; i++)
        g[i] = 1.0f / 64;
    pull[0] = 0;
    for (int step = 0; step < MAXSTEPS && step < atomic_load(w->stop); step++) {
        size_t m = 0;
        for (int id = 0; id < w->tids; id++)
            if (rand_r(&w->seed) % 3 == 0) {
                ids[m] = (uint64_t)id;
                for (int d = 0; d < dim; d++)
                    grads[m * dim + (size_t)d] = (float)(1 + rand_r(&w->seed) % 4) / 256;
                m++;
            }
        ps_request rt, rd;
        int rc;
        if (w->mode == PS_MODE_SYNC) {
            rc = ps_client_sparse_pushpull(w->c, w->tkey, ids, m, grads, pull, 1, rows, step,
                                           &rt) ||
                 ps_client_pushpull(w->c, w->keys[0], g, out, step, &rd);
        } else {
            rc = ps_client_sparse_push(w->c, w->tkey, ids, m, grads, step, &rt) ||
                 ps_client_push(w->c, w->keys[0], g, step, &rd);
        }
        if (rc || ps_request_wait_for(&rt, 60000) || ps_request_wait_for(&rd, 60000)) {
            snprintf(w->why, sizeof w->why, "step %d: %s %s", step, rt.err, rd.err);
            w->err = 1;
            break;
        }
        /* acknowledged: it must be in the servers' state */
        for (size_t k = 0; k < m; k++)
            for (int d = 0; d < dim; d++)
                w->want[ids[k] * (uint64_t)dim + (uint64_t)d] += grads[k * dim + (size_t)d];
        w->steps = step + 1;
    }
    free(g);
    free(out);
    free(grads);
    free(rows);
    free(ids);
    free(pull);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- pause */

static int part_pause(int kills)
{
    const uint64_t keys[4] = {11, 12, 13, 14};
    const size_t n = 256 * 1024;
    group gr[2];
    const char *words = "--mode sync --num-workers 2 --lr 0.01";
    for (int g = 0; g < 2; g++)
        if (start_group(&gr[g], g, 2, "pause", words)) {
            fprintf(stderr, "repl_bench: cannot start servers\n");
            return 1;
        }
    char servers[600], why[512];
    snprintf(servers, sizeof servers, "%s,%s", gr[0].eps, gr[1].eps);
    atomic_int stop_flag = MAXSTEPS;
    wstate w[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&w[r], 0, sizeof w[r]);
        w[r].rank = r;
        w[r].keys = keys;
        w[r].nkeys = 4;
        w[r].n = n;
        w[r].stop = &stop_flag;
        w[r].done_ns = calloc(MAXSTEPS, sizeof(int64_t));
    }
    /* both clients start together (a sync hello waits for no one, but the
     * first round waits for both) */
    for (int r = 0; r < 2; r++)
        if (!(w[r].c = open_client(servers, r, 2, PS_MODE_SYNC, why, sizeof why, keys, 4, n,
                                   NULL, 0))) {
            fprintf(stderr, "repl_bench: %s\n", why);
            return 1;
        }
    float *init = calloc(n, sizeof(float));
    for (int k = 0; k < 4; k++) {
        ps_request r;
        ps_client_init(w[0].c, keys[k], init, &r);
        ps_request_wait_for(&r, 30000);
    }
    free(init);
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, dense_worker, &w[r]);
    usleep(1500000);
    int64_t kill_at[64];
    int done = 0;
    for (; done < kills && done < 64; done++) {
        if (kill_primary(&gr[done % 2], &kill_at[done])) {
            fprintf(stderr, "repl_bench: kill %d: the replacement did not catch up\n", done + 1);
            break;
        }
        rand_sleep_ms(300, 800);
        if (w[0].err || w[1].err)
            break;
    }
    usleep(500000);
    /* both stop after the same step (sync: a round needs both) */
    atomic_store(&stop_flag, (w[0].steps > w[1].steps ? w[0].steps : w[1].steps) + 2);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    int rc = 0;
    for (int r = 0; r < 2; r++)
        if (w[r].err) {
            fprintf(stderr, "repl_bench: worker %d: %s\n", r, w[r].why);
            rc = 1;
        }
    /* each worker's pause for each kill */
    double pauses[128], worst_per_kill[64], normal = 0;
    int np = 0;
    printf("## Failover pause (sync, 2 groups x 2 members, 2 workers, 4 x 1 MiB keys)\n\n");
    printf("| kill | group | worker 0 pause (ms) | worker 1 pause (ms) |\n|---|---|---|---|\n");
    for (int k = 0; k < done; k++) {
        double p[2] = {-1, -1};
        for (int r = 0; r < 2; r++) {
            int64_t before = 0, after = 0;
            for (int s = 0; s < w[r].steps; s++) {
                if (w[r].done_ns[s] <= kill_at[k])
                    before = w[r].done_ns[s];
                else {
                    after = w[r].done_ns[s];
                    break;
                }
            }
            if (before && after) {
                p[r] = (double)(after - before) * 1e-6;
                pauses[np++] = p[r] * 1e-3;
            }
        }
        worst_per_kill[k] = p[0] > p[1] ? p[0] : p[1];
        printf("| %d | %d | %.0f | %.0f |\n", k + 1, k % 2, p[0], p[1]);
    }
    /* a step's time without kills, for scale */
    int ns = 0;
    double sum = 0;
    for (int s = 1; s < w[0].steps && s < 400; s++, ns++)
        sum += (double)(w[0].done_ns[s] - w[0].done_ns[s - 1]) * 1e-6;
    normal = ns ? sum / ns : 0;
    qsort(pauses, (size_t)np, sizeof pauses[0], cmp_d);
    double med = np ? pauses[np / 2] : -1, max = np ? pauses[np - 1] : -1;
    printf("\nA step without kills: %.1f ms (mean of the first 400 of worker 0).  %d kills, %d "
           "pauses (2 workers).\n", normal, done, np);
    printf("\nGOAL failover pause median <= 1 s, max <= 3 s over %d kills (median %.3f s, max "
           "%.3f s): %s\n", kills, med, max,
           done == kills && np == 2 * kills && med <= 1.0 && max <= 3.0 ? "MET" : "MISSED");
    (void)worst_per_kill;
    for (int r = 0; r < 2; r++) {
        ps_client_close(w[r].c);
        free(w[r].done_ns);
    }
    for (int g = 0; g < 2; g++)
        stop_group(&gr[g]);
    return rc;
}

/* ---------------------------------------------------------------- loss */

static int loss_run(int mode, int kills, const char *job, int *lost, int *twice, int *steps,
                    int *killed)
{
    const uint64_t key = 21, tkey = 1ull << 40;
    const size_t n = 4096;
    const int dim = 8, tids = 64;
    char words[128];
    snprintf(words, sizeof words, "--mode %s --num-workers 2 --lr 1",
             mode == PS_MODE_SYNC ? "sync" : "async");
    group gr[2];
    for (int g = 0; g < 2; g++)
        if (start_group(&gr[g], g, 2, job, words))
            return -1;
    char servers[600], why[512];
    snprintf(servers, sizeof servers, "%s,%s", gr[0].eps, gr[1].eps);
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = (uint32_t)dim;
    t.init = PS_TABLE_INIT_ZEROS;
    t.opt.kind = PS_OPT_SGD;
    t.opt.lr = 1;
    atomic_int stop_flag = MAXSTEPS;
    wstate w[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&w[r], 0, sizeof w[r]);
        w[r].rank = r;
        w[r].mode = mode;
        w[r].keys = &key;
        w[r].nkeys = 1;
        w[r].n = n;
        w[r].stop = &stop_flag;
        w[r].tkey = tkey;
        w[r].tdim = dim;
        w[r].tids = tids;
        w[r].want = calloc((size_t)tids * dim, sizeof(float));
        w[r].seed = 1234u + (unsigned)r;
        if (!(w[r].c = open_client(servers, r, 2, mode, why, sizeof why, &key, 1, n, &t, tkey))) {
            fprintf(stderr, "repl_bench: %s\n", why);
            return -1;
        }
    }
    float *zero = calloc(n, sizeof(float));
    ps_request r0;
    ps_client_init(w[0].c, key, zero, &r0);
    ps_request_wait_for(&r0, 30000);
    free(zero);
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, loss_worker, &w[r]);
    usleep(500000);
    int done = 0;
    for (; done < kills; done++) {
        int64_t at;
        if (kill_primary(&gr[done % 2], &at))
            break;
        rand_sleep_ms(100, 400);
        if (w[0].err || w[1].err)
            break;
    }
    atomic_store(&stop_flag, (w[0].steps > w[1].steps ? w[0].steps : w[1].steps) + 2);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    int bad = w[0].err || w[1].err;
    for (int r = 0; r < 2; r++)
        if (w[r].err)
            fprintf(stderr, "repl_bench: %s worker %d: %s\n", job, r, w[r].why);
    /* what the servers hold against what was acknowledged */
    uint64_t *ids = malloc((size_t)tids * sizeof *ids);
    float *rows = malloc((size_t)tids * dim * sizeof(float)), *out = malloc(n * sizeof(float));
    for (int i = 0; i < tids; i++)
        ids[i] = (uint64_t)i;
    int64_t want_v = mode == PS_MODE_SYNC ? (w[0].steps < w[1].steps ? w[0].steps : w[1].steps)
                                         : w[0].steps + w[1].steps;
    ps_request rr, rd;
    *lost = *twice = 0;
    if (!bad && !ps_client_sparse_pull(w[0].c, tkey, ids, (size_t)tids, rows,
                                       mode == PS_MODE_SYNC ? want_v : 0, &rr) &&
        !ps_request_wait_for(&rr, 30000) &&
        !ps_client_pull(w[0].c, key, out, mode == PS_MODE_SYNC ? want_v : 0, &rd) &&
        !ps_request_wait_for(&rd, 30000)) {
        /* sync: each round's rows are the mean of the two workers' */
        float scale = mode == PS_MODE_SYNC ? 0.5f : 1.0f;
        for (int i = 0; i < tids * dim; i++) {
            float want = -scale * (w[0].want[i] + w[1].want[i]);
            if (rows[i] != want)
                (rows[i] > want ? ++*lost : ++*twice);
        }
        /* the dense key: each push -1/64 (sync: the mean of two) */
        float dwant = -(float)want_v / 64;
        for (size_t i = 0; i < n; i++)
            if (out[i] != dwant)
                (out[i] > dwant ? ++*lost : ++*twice);
        if (rr.version != want_v || rd.version != want_v)
            fprintf(stderr, "repl_bench: %s: versions %lld and %lld, want %lld\n", job,
                    (long long)rr.version, (long long)rd.version, (long long)want_v);
    } else {
        bad = 1;
    }
    *steps = w[0].steps + w[1].steps;
    *killed = done;
    free(ids);
    free(rows);
    free(out);
    for (int r = 0; r < 2; r++) {
        ps_client_close(w[r].c);
        free(w[r].want);
    }
    for (int g = 0; g < 2; g++)
        stop_group(&gr[g]);
    return bad ? -1 : 0;
}

static int part_loss(int kills)
{
    printf("## Acknowledged updates lost over kills (2 groups x 2 members, 2 workers, a table "
           "and a dense key)\n\n");
    printf("| mode | kills | steps (both workers) | values short (lost) | values over (twice) "
           "|\n|---|---|---|---|---|\n");
    int ok = 1;
    for (int m = 0; m < 2; m++) {
        int mode = m ? PS_MODE_SYNC : PS_MODE_ASYNC, lost = -1, twice = -1, steps = 0, killed = 0;
        int rc = loss_run(mode, kills, m ? "loss-sync" : "loss-async", &lost, &twice, &steps,
                          &killed);
        printf("| %s | %d | %d | %d | %d |\n", m ? "sync" : "async", killed, steps, lost, twice);
        ok &= rc == 0 && killed == kills && lost == 0 && twice == 0;
    }
    printf("\nGOAL 0 acknowledged updates lost over %d kills, dense and tables, sync and async: "
           "%s\n", kills, ok ? "MET" : "MISSED");
    return 0;
}

/* ---------------------------------------------------------------- catch-up */

static void *table_worker(void *arg)
{
    wstate *w = arg;
    const int dim = 16, batch = 4096;
    uint64_t *ids = malloc(batch * sizeof *ids);
    float *grads = malloc((size_t)batch * dim * sizeof(float));
    for (int i = 0; i < batch * dim; i++)
        grads[i] = 0.001f;
    for (int step = 0; step < atomic_load(w->stop); step++) {
        for (int i = 0; i < batch; i++)
            ids[i] = (uint64_t)(rand_r(&w->seed) % (unsigned)w->tids);
        ps_request r;
        if (ps_client_sparse_push(w->c, w->tkey, ids, batch, grads, step, &r) ||
            ps_request_wait_for(&r, 60000)) {
            snprintf(w->why, sizeof w->why, "step %d: %s", step, r.err);
            w->err = 1;
            break;
        }
        w->steps = step + 1;
    }
    free(ids);
    free(grads);
    return NULL;
}

static int part_catchup(int nrows)
{
    const uint64_t tkey = 1ull << 41;
    group gr;
    if (start_group(&gr, 0, 1, "catchup", "--mode async --num-workers 2 --threads 2 --max-memory 16G"))
        return 1;
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = 16;
    t.opt.kind = PS_OPT_ADAGRAD;
    t.opt.lr = 0.05f;
    char why[512];
    ps_client *c[2];
    for (int r = 0; r < 2; r++)
        if (!(c[r] = open_client(gr.eps, r, 2, PS_MODE_ASYNC, why, sizeof why, NULL, 0, 0, &t,
                                 tkey))) {
            fprintf(stderr, "repl_bench: %s\n", why);
            return 1;
        }
    /* the rows, made by pulls */
    const int batch = 200000;
    uint64_t *ids = malloc(batch * sizeof *ids);
    float *rows = malloc((size_t)batch * 16 * sizeof(float));
    int64_t t0 = ps_now_ns();
    for (int at = 0; at < nrows; at += batch) {
        int m = nrows - at < batch ? nrows - at : batch;
        for (int i = 0; i < m; i++)
            ids[i] = (uint64_t)(at + i);
        ps_request r;
        if (ps_client_sparse_pull(c[0], tkey, ids, (size_t)m, rows, 0, &r) ||
            ps_request_wait_for(&r, 120000)) {
            fprintf(stderr, "repl_bench: making rows: %s\n", r.err);
            return 1;
        }
    }
    free(ids);
    free(rows);
    double fill_s = (double)(ps_now_ns() - t0) * 1e-9;
    atomic_int stop_flag = MAXSTEPS;
    wstate w[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        memset(&w[r], 0, sizeof w[r]);
        w[r].c = c[r];
        w[r].stop = &stop_flag;
        w[r].tkey = tkey;
        w[r].tids = nrows;
        w[r].seed = 99u + (unsigned)r;
        pthread_create(&th[r], NULL, table_worker, &w[r]);
    }
    usleep(1000000);
    int steps0 = w[0].steps + w[1].steps;
    /* the replica is lost; a new one joins and copies the group's state */
    kill(gr.m[1].pid, SIGKILL);
    waitpid(gr.m[1].pid, NULL, 0);
    int64_t k0 = ps_now_ns();
    start_member(&gr, 1);
    int rc = wait_count(gr.m[1].log, "loaded the primary's snapshot", 1, 300000);
    int caught = wait_count(gr.m[0].log, "caught up (", 1, 60000);
    int64_t k1 = ps_now_ns();
    int steps1 = w[0].steps + w[1].steps;
    atomic_store(&stop_flag, 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    char line[4096] = "", pline[4096] = "";
    last_line(gr.m[1].log, "loaded the primary's snapshot", line, sizeof line);
    last_line(gr.m[0].log, "caught up (", pline, sizeof pline);
    double mb = 0, secs = 0, rate = 0;
    const char *p = strstr(line, "snapshot of group");
    if (p)
        sscanf(strstr(p, ": ") + 2, "%lf MB in %lf s (%lf MB/s)", &mb, &secs, &rate);
    printf("## Catch-up of a replacement (a table of %d rows, dim 16, adagrad; 2 workers pushing "
           "meanwhile)\n\n", nrows);
    printf("| rows made by pulls | snapshot | from its join to loaded | rate | kill to member | "
           "worker steps meanwhile |\n|---|---|---|---|---|---|\n");
    printf("| %.1f s | %.0f MB | %.2f s | %.0f MB/s | %.2f s | %d |\n", fill_s, mb, secs, rate,
           (double)(k1 - k0) * 1e-9, steps1 - steps0);
    printf("\nThe primary's line: %s", pline[0] ? strstr(pline, "member") : "(none)\n");
    printf("\nGOAL catch-up of a 4e6-row dim-16 adagrad table while 2 workers train >= 200 MB/s "
           "(%.0f MB/s): %s\n", rate, !rc && !caught && rate >= 200 && nrows >= 4000000 ? "MET"
                                                                                    : "MISSED");
    for (int r = 0; r < 2; r++) {
        if (w[r].err)
            fprintf(stderr, "repl_bench: catch-up worker %d: %s\n", r, w[r].why);
        ps_client_close(c[r]);
    }
    stop_group(&gr);
    return rc || caught ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int kills = 10, loss_kills = 20, rows = 4000000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--kills") && i + 1 < argc)
            kills = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--loss-kills") && i + 1 < argc)
            loss_kills = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: repl_bench [--only pause|loss|catchup] [--kills 10] "
                            "[--loss-kills 20] [--rows 4000000]\n");
            return 2;
        }
    }
    if (kills < 1 || kills > 64 || loss_kills < 1 || rows < 1)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    srand((unsigned)time(NULL));
    const char *b = getenv("PS_BIN_DIR");
    if (b)
        snprintf(bindir, sizeof bindir, "%s", b);
    const char *tmp = getenv("TMPDIR");
    snprintf(workdir, sizeof workdir, "%s/ps_repl_bench.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(workdir) || start_etcd()) {
        printf("SKIP replicas: no etcd at /usr/bin/etcd (install etcd-server)\n");
        return 0;
    }
    int rc = 0;
    if (!only || !strcmp(only, "pause"))
        rc |= part_pause(kills);
    if (!only || !strcmp(only, "loss")) {
        printf("\n");
        rc |= part_loss(loss_kills);
    }
    if (!only || !strcmp(only, "catchup")) {
        printf("\n");
        rc |= part_catchup(rows);
    }
    stop(etcd_pid);
    if (!getenv("BENCH_KEEP")) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
        if (system(cmd)) {
        }
    }
    return rc;
}
