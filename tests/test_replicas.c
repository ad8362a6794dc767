/* Replicas and failover (server/repl.h, client/client_route.h) with a real
 * etcd: a push is acknowledged once every live member holds it, a replica
 * takes over when its primary is killed, libps moves to it and resends,
 * and nothing acknowledged is lost or applied twice. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_curve.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define KEY 7
#define N 1000

static ps_test_etcd g_etcd;

static const char *etcd_up(void)
{
    if (g_etcd.pid <= 0 || kill(g_etcd.pid, 0) != 0) {
        char log[512];
        snprintf(log, sizeof log, "%s/etcd.log", ps_test_tmpdir());
        if (ps_test_etcd_start(&g_etcd, log) != 0)
            return NULL;
    }
    return g_etcd.url;
}

/* A group of `members` servers for server rank g of ns, each with the
 * words given; eps gets "ep0|ep1|..." (what workers list). */
typedef struct group {
    ps_test_server sv[3];
    int n;
    char eps[256];
} group;

static int group_start(group *gr, int members, int g, int ns, const char *job, const char *words)
{
    gr->n = members;
    int port[3];
    size_t w = 0;
    for (int k = 0; k < members; k++) {
        port[k] = ps_test_free_port();
        w += (size_t)snprintf(gr->eps + w, sizeof gr->eps - w, "%stcp://127.0.0.1:%d",
                              k ? "|" : "", port[k]);
    }
    for (int k = 0; k < members; k++) {
        char all[1024];
        snprintf(all, sizeof all, "--bind tcp://127.0.0.1:%d --rank %d --num-servers %d "
                 "--group %s --member %d --coord %s --job %s %s", port[k], g, ns, gr->eps, k,
                 g_etcd.url, job, words);
        if (ps_test_server_start(&gr->sv[k], 0, all) != 0)
            return -1;
        gr->sv[k].port = port[k];
    }
    return 0;
}

static ps_client *client(const char *servers, int rank, int nw, int mode, int staleness,
                         char *why, size_t why_len)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = servers;
    o.rank = rank;
    o.num_workers = nw;
    o.mode = mode;
    o.max_staleness = staleness;
    o.hello_timeout_ms = 20000;
    o.request_timeout_ms = 2000;
    o.heartbeat_ms = 200;
    o.server_timeout_ms = 30000;
    o.failure_timeout_ms = 1000; /* shm: the default, on: the payloads through the arena */
    ps_client *c;
    if (ps_client_open(&o, &c) != 0) {
        snprintf(why, why_len, "open: %s", ps_client_last_error(NULL));
        return NULL;
    }
    if (ps_client_register(c, KEY, N) != 0 || ps_client_start(c) != 0) {
        snprintf(why, why_len, "start: %s", ps_client_last_error(c));
        ps_client_close(c);
        return NULL;
    }
    return c;
}

static int wait_req(ps_request *r) { return ps_request_wait_for(r, 30000); }

/* Async, one group of two, payloads through shared memory (the primary
 * copies them out of the arena for its member): pushes acknowledged before
 * the primary is killed and after it are each applied exactly once by the
 * member that took over. */
PS_TEST(async_replica_takes_over_nothing_lost)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    group gr;
    char words[700];
    snprintf(words, sizeof words, "--mode async --num-workers 1 --lr 1 --checkpoint-dir %s/ck1 "
             "--checkpoint-every 8", ps_test_tmpdir());
    CHECK_OK(group_start(&gr, 2, 0, 1, "t1", words));
    char why[512];
    ps_client *c = client(gr.eps, 0, 1, PS_MODE_ASYNC, -1, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    static float w[N], g[N], out[N];
    for (int i = 0; i < N; i++) {
        w[i] = (float)i;
        g[i] = 1.0f / 1024; /* exact in float: sums stay exact */
    }
    ps_request r;
    CHECK_OK(ps_client_init(c, KEY, w, &r));
    CHECK_OK(wait_req(&r));
    int pushes = 0;
    for (; pushes < 20; pushes++) {
        CHECK_OK(ps_client_push(c, KEY, g, pushes, &r));
        CHECK_OK(wait_req(&r));
    }
    int64_t t0 = ps_now_ns();
    kill(gr.sv[0].pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(gr.sv[0].pid, 5000), 128 + SIGKILL);
    for (; pushes < 40; pushes++) {
        CHECK_OK(ps_client_push(c, KEY, g, pushes, &r));
        CHECK_MSG(wait_req(&r) == 0, "push %d after the kill: %s", pushes, r.err);
    }
    double took = (double)(ps_now_ns() - t0) * 1e-9;
    CHECK_OK(ps_client_pull(c, KEY, out, 0, &r));
    CHECK_OK(wait_req(&r));
    for (int i = 0; i < N; i++)
        CHECK_MSG(out[i] == w[i] - 40.0f / 1024, "element %d: %.9g, want %.9g", i,
                  (double)out[i], (double)(w[i] - 40.0f / 1024));
    CHECK(ps_test_file_has(gr.sv[1].log, "is now the primary of group 0"));
    CHECK(ps_test_file_has(gr.sv[0].log, "worker 0: payloads through shared memory"));
    printf("# 20 pushes after the kill in %.2f s\n", took);
    ps_client_close(c);
    CHECK_EQ_INT(ps_test_stop(gr.sv[1].pid, 5000), 0);
    /* each member wrote its own checkpoints, in DIR/member-M */
    for (int k = 0; k < 2; k++) {
        char ck[700];
        snprintf(ck, sizeof ck, "%s/ck1/member-%d", ps_test_tmpdir(), k);
        DIR *d = opendir(ck);
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d));)
            n += strstr(e->d_name, ".ckpt") != NULL;
        if (d)
            closedir(d);
        CHECK_MSG(n > 0, "no checkpoint in %s", ck);
    }
}

/* Bounded staleness (--max-staleness 1), two workers over one group of
 * two, TCP: the primary is killed mid-run; the member that takes over
 * holds the workers' clocks (their pulls of step s wait for the slowest
 * within 1, as before: no hang) and every acknowledged push exactly once. */
PS_TEST(bounded_staleness_failover_keeps_clocks_and_pushes)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    group gr;
    CHECK_OK(group_start(&gr, 2, 0, 1, "t7", "--mode async --max-staleness 1 --num-workers 2 "
                                             "--lr 1 --shm off"));
    char why[512];
    ps_client *c[2];
    for (int k = 0; k < 2; k++) {
        c[k] = client(gr.eps, k, 2, PS_MODE_ASYNC, 1, why, sizeof why);
        CHECK_MSG(c[k], "worker %d: %s", k, why);
    }
    static float w[N], g[N], out[N];
    for (int i = 0; i < N; i++) {
        w[i] = (float)i;
        g[i] = 1.0f / 1024;
    }
    ps_request r;
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ps_client_init(c[k], KEY, w, &r));
        CHECK_OK(wait_req(&r));
    }
    enum { STEPS_SSP = 40 };
    for (int step = 0; step < STEPS_SSP; step++) {
        if (step == 15) {
            kill(gr.sv[0].pid, SIGKILL);
            CHECK_EQ_INT(ps_test_wait(gr.sv[0].pid, 5000), 128 + SIGKILL);
        }
        for (int k = 0; k < 2; k++) {
            CHECK_OK(ps_client_push(c[k], KEY, g, step, &r));
            CHECK_MSG(wait_req(&r) == 0, "worker %d push %d: %s", k, step, r.err);
            /* the other worker is at most one push behind: within 1 */
            CHECK_OK(ps_client_pull(c[k], KEY, out, step + 1, &r));
            CHECK_MSG(wait_req(&r) == 0, "worker %d pull %d: %s", k, step + 1, r.err);
        }
    }
    CHECK_OK(ps_client_pull(c[0], KEY, out, STEPS_SSP, &r));
    CHECK_OK(wait_req(&r));
    for (int i = 0; i < N; i++)
        CHECK_MSG(out[i] == w[i] - 2.0f * STEPS_SSP / 1024, "element %d: %.9g, want %.9g", i,
                  (double)out[i], (double)(w[i] - 2.0f * STEPS_SSP / 1024));
    CHECK_EQ_INT(r.version, 2 * STEPS_SSP);
    CHECK(ps_test_file_has(gr.sv[1].log, "is now the primary of group 0"));
    for (int k = 0; k < 2; k++)
        ps_client_close(c[k]);
    CHECK_EQ_INT(ps_test_stop(gr.sv[1].pid, 5000), 0);
}

/* A replicated job restored (--restore, a new job in etcd): member 0
 * restores its checkpoint alone, and the other member, whose own
 * checkpoints may be of another point (here: none left), joins it with a
 * copy of its state instead of restoring its own.  Killed then, member 0's
 * place is taken by a member that holds every push, the restored ones
 * included. */
PS_TEST(a_restored_group_starts_every_member_from_the_primary)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    group gr;
    char words[700], rwords[760], why[512];
    snprintf(words, sizeof words, "--mode async --num-workers 1 --lr 1 --checkpoint-dir %s/ck8 "
             "--checkpoint-every 1", ps_test_tmpdir());
    CHECK_OK(group_start(&gr, 2, 0, 1, "t8", words));
    ps_client *c = client(gr.eps, 0, 1, PS_MODE_ASYNC, -1, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    static float w[N], g[N], out[N];
    for (int i = 0; i < N; i++) {
        w[i] = (float)i;
        g[i] = 1.0f / 1024;
    }
    ps_request r;
    CHECK_OK(ps_client_init(c, KEY, w, &r));
    CHECK_OK(wait_req(&r));
    int pushes = 0;
    for (; pushes < 10; pushes++) {
        CHECK_OK(ps_client_push(c, KEY, g, pushes, &r));
        CHECK_OK(wait_req(&r));
    }
    ps_client_close(c);
    for (int k = 0; k < 2; k++) {
        kill(gr.sv[k].pid, SIGKILL);
        CHECK_EQ_INT(ps_test_wait(gr.sv[k].pid, 5000), 128 + SIGKILL);
    }
    /* member 1's checkpoints are gone: its own restore would fail */
    char ck1[700];
    snprintf(ck1, sizeof ck1, "%s/ck8/member-1", ps_test_tmpdir());
    DIR *d = opendir(ck1);
    CHECK_MSG(d, "no %s", ck1);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            char f[1024];
            snprintf(f, sizeof f, "%s/%s", ck1, e->d_name);
            unlink(f);
        }
    if (d)
        closedir(d);
    snprintf(rwords, sizeof rwords, "%s --restore", words);
    CHECK_OK(group_start(&gr, 2, 0, 1, "t8r", rwords));
    CHECK_MSG(ps_test_wait_for_text(gr.sv[0].log, "member 1 caught up (", 30000, gr.sv[0].pid) == 0,
              "member 1 did not join the restored primary");
    CHECK(ps_test_file_has(gr.sv[0].log, "restored "));
    CHECK(!ps_test_file_has(gr.sv[1].log, "restored "));
    c = client(gr.eps, 0, 1, PS_MODE_ASYNC, -1, why, sizeof why);
    CHECK_MSG(c, "%s", why);
    CHECK_OK(ps_client_init(c, KEY, w, &r));
    CHECK_OK(wait_req(&r));
    /* async --checkpoint-every 1: the restore may lack the last push
     * acknowledged before the job stopped, no more */
    CHECK_OK(ps_client_pull(c, KEY, out, 0, &r));
    CHECK_OK(wait_req(&r));
    int restored = (int)r.version;
    CHECK_MSG(restored == 10 || restored == 9, "restored version %d, want 9 or 10", restored);
    for (; pushes < 15; pushes++) {
        CHECK_OK(ps_client_push(c, KEY, g, pushes, &r));
        CHECK_OK(wait_req(&r));
    }
    kill(gr.sv[0].pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(gr.sv[0].pid, 5000), 128 + SIGKILL);
    for (; pushes < 20; pushes++) {
        CHECK_OK(ps_client_push(c, KEY, g, pushes, &r));
        CHECK_MSG(wait_req(&r) == 0, "push %d after the kill: %s", pushes, r.err);
    }
    CHECK_OK(ps_client_pull(c, KEY, out, 0, &r));
    CHECK_OK(wait_req(&r));
    float want = (float)(restored + 10) / 1024; /* every push since the restore, once */
    for (int i = 0; i < N; i++)
        CHECK_MSG(out[i] == w[i] - want, "element %d: %.9g, want %.9g", i, (double)out[i],
                  (double)(w[i] - want));
    CHECK_EQ_INT(r.version, restored + 10);
    CHECK(ps_test_file_has(gr.sv[1].log, "is now the primary of group 0"));
    ps_client_close(c);
    CHECK_EQ_INT(ps_test_stop(gr.sv[1].pid, 5000), 0);
}

static int64_t max_version(int port)
{
    ps_stats st;
    return ps_test_stats(port, &st) == 0 ? st.max_version : -1;
}

static int64_t min_version(int port)
{
    ps_stats st;
    return ps_test_stats(port, &st) == 0 ? st.min_version : -1;
}

#define TKEY (1ull << 40)
#define DIM 4
#define IDS 64
#define STEPS 300

/* Async with a table and a dense key over two groups of two: the primary of
 * each is killed while pushes are on their way.  Every push acknowledged is
 * applied exactly once by the survivors (each partition's and chunk's
 * version counts its updates: all STEPS, no more), and the rows hold exactly
 * the sum of what was pushed. */
PS_TEST(async_tables_kill_each_primary_no_loss_no_double)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    unsigned seed = (unsigned)ps_now_ns();
    srand(seed);
    int k0 = 50 + rand() % 100, k1 = 160 + rand() % 100;
    printf("# seed %u: group 0's primary killed at step %d, group 1's at step %d\n", seed, k0, k1);
    group gr[2];
    for (int g = 0; g < 2; g++)
        CHECK_OK(group_start(&gr[g], 2, g, 2, "t2", "--mode async --num-workers 1 --lr 1"));
    char servers[600];
    snprintf(servers, sizeof servers, "%s,%s", gr[0].eps, gr[1].eps);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = servers;
    o.num_workers = 1;
    o.mode = PS_MODE_ASYNC;
    o.hello_timeout_ms = 20000;
    o.request_timeout_ms = 2000;
    o.heartbeat_ms = 200;
    o.shm = 0;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = DIM;
    t.init = PS_TABLE_INIT_ZEROS;
    t.opt.kind = PS_OPT_SGD;
    t.opt.lr = 1;
    CHECK_OK(ps_client_register(c, KEY, N));
    CHECK_OK(ps_client_register_table(c, TKEY, &t));
    CHECK_MSG(ps_client_start(c) == 0, "%s", ps_client_last_error(c));
    static float w[N], g[N], out[N];
    static float want[IDS * DIM], rows[IDS * DIM], grads[IDS * DIM];
    uint64_t ids[IDS];
    for (int i = 0; i < N; i++)
        g[i] = 1.0f / 64;
    ps_request r, rd;
    CHECK_OK(ps_client_init(c, KEY, w, &r));
    CHECK_OK(wait_req(&r));
    /* rows set (SASSIGN) before the kills: the members hold them too */
    for (uint64_t id = 0; id < IDS; id++) {
        ids[id] = id;
        for (int d = 0; d < DIM; d++)
            want[id * DIM + (uint64_t)d] = rows[id * DIM + (uint64_t)d] = 0.5f;
    }
    CHECK_OK(ps_client_sparse_assign(c, TKEY, ids, IDS, rows, &r));
    CHECK_MSG(wait_req(&r) == 0, "sparse assign: %s", r.err);
    for (int step = 0; step < STEPS; step++) {
        size_t n = 0;
        for (uint64_t id = 0; id < IDS; id++)
            if (rand() % 3 == 0) { /* a third of the ids, gradients exact in float */
                ids[n] = id;
                for (int d = 0; d < DIM; d++) {
                    grads[n * DIM + (size_t)d] = (float)(1 + rand() % 4) / 256;
                    want[id * DIM + (uint64_t)d] -= grads[n * DIM + (size_t)d];
                }
                n++;
            }
        CHECK_OK(ps_client_sparse_push(c, TKEY, ids, n, grads, step, &r));
        CHECK_OK(ps_client_push(c, KEY, g, step, &rd));
        if (step == k0 || step == k1) { /* while the pushes are on their way */
            int pid = gr[step == k1].sv[0].pid;
            kill(pid, SIGKILL);
            CHECK_EQ_INT(ps_test_wait(pid, 5000), 128 + SIGKILL);
        }
        CHECK_MSG(wait_req(&r) == 0, "sparse push %d: %s", step, r.err);
        CHECK_MSG(wait_req(&rd) == 0, "push %d: %s", step, rd.err);
    }
    for (uint64_t id = 0; id < IDS; id++)
        ids[id] = id;
    CHECK_OK(ps_client_sparse_pull(c, TKEY, ids, IDS, rows, 0, &r));
    CHECK_OK(wait_req(&r));
    CHECK_OK(ps_client_pull(c, KEY, out, 0, &r));
    CHECK_OK(wait_req(&r));
    for (int i = 0; i < IDS * DIM; i++)
        CHECK_MSG(rows[i] == want[i], "row value %d: %.9g, want %.9g", i, (double)rows[i],
                  (double)want[i]);
    for (int i = 0; i < N; i++)
        CHECK_MSG(out[i] == -(float)STEPS / 64, "element %d: %.9g", i, (double)out[i]);
    /* the survivors applied every push once: every version is STEPS */
    for (int k = 0; k < 2; k++) {
        int port = gr[k].sv[1].port;
        CHECK_EQ_INT(max_version(port), STEPS);
        CHECK_EQ_INT(min_version(port), STEPS);
    }
    ps_client_close(c);
    for (int k = 0; k < 2; k++)
        CHECK_EQ_INT(ps_test_stop(gr[k].sv[1].pid, 5000), 0);
}

/* A ps_worker run of `steps` steps over the servers, its model saved to
 * save (worker 0): 0, or the first worker's exit status. */
static int train(const char *servers, const char *save, int steps, const char *extra,
                 const char *tag, int *pid)
{
    char words[2048], log[512];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(words, sizeof words, "--servers %s --num-workers 2 --rank %d --mode sync "
                 "--steps %d --data synthetic:65536 --batch 32 --log-every 10 "
                 "--model mlp:784-128-10 --request-timeout 2000 --seed 3 %s%s %s", servers,
                 rank, steps, rank == 0 ? "--save " : "", rank == 0 ? save : "", extra);
        snprintf(log, sizeof log, "%s/%s-w%d.log", ps_test_tmpdir(), tag, rank);
        pid[rank] = ps_test_spawn_words("ps_worker", words, log);
        if (pid[rank] < 0)
            return -1;
    }
    return 0;
}

/* Sync, 2 servers x --replicas 1, 2 workers: the primary of each group is
 * killed in turn at a random step; the final model is bitwise the one of an
 * uninterrupted run. */
PS_TEST(sync_kill_each_primary_bitwise)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    const int steps = 600;
    unsigned seed = (unsigned)ps_now_ns();
    srand(seed);
    int k0 = 5 + rand() % 20, k1 = 30 + rand() % 20; /* in tens of steps */
    printf("# seed %u: group 0's primary killed at step %d, group 1's at step %d\n", seed,
           k0 * 10, k1 * 10);
    char ref[512], got[512];
    snprintf(ref, sizeof ref, "%s/ref.model", ps_test_tmpdir());
    snprintf(got, sizeof got, "%s/kill.model", ps_test_tmpdir());
    const char *words = "--mode sync --num-workers 2 --lr 0.05";
    for (int run = 0; run < 2; run++) {
        group gr[2];
        for (int g = 0; g < 2; g++)
            CHECK_OK(group_start(&gr[g], 2, g, 2, run ? "t3b" : "t3a", words));
        char servers[600], log[512];
        snprintf(servers, sizeof servers, "%s,%s", gr[0].eps, gr[1].eps);
        int w[2];
        CHECK_OK(train(servers, run ? got : ref, steps, "", run ? "kill" : "ref", w));
        snprintf(log, sizeof log, "%s/%s-w0.log", ps_test_tmpdir(), run ? "kill" : "ref");
        for (int k = 0; run && k < 2; k++) {
            char needle[32];
            snprintf(needle, sizeof needle, " iter %d/", (k ? k1 : k0) * 10);
            CHECK_MSG(ps_test_wait_for_text(log, needle, 60000, w[0]) == 0,
                      "worker 0 did not reach%s", needle);
            kill(gr[k].sv[0].pid, SIGKILL);
            CHECK_EQ_INT(ps_test_wait(gr[k].sv[0].pid, 5000), 128 + SIGKILL);
        }
        CHECK_EQ_INT(ps_test_wait(w[0], 120000), 0);
        CHECK_EQ_INT(ps_test_wait(w[1], 120000), 0);
        for (int g = 0; g < 2; g++)
            for (int k = run; k < 2; k++)
                CHECK_EQ_INT(ps_test_stop(gr[g].sv[k].pid, 5000), 0);
    }
    size_t na, nb;
    char *a = ps_test_read_file(ref, &na), *b = ps_test_read_file(got, &nb);
    CHECK(a && b);
    CHECK_MSG(na == nb && memcmp(a, b, na) == 0, "the model of the run with kills differs from "
              "the uninterrupted run's (%zu and %zu bytes)", na, nb);
    free(a);
    free(b);
}

/* The pid in the last line of log that holds needle ("... (pid N) ..."),
 * or -1. */
static int pid_after(const char *log, const char *needle)
{
    char *text = ps_test_read_file(log, NULL);
    int pid = -1;
    for (char *p = text; p && (p = strstr(p, needle)); p++) {
        const char *q = strstr(p, "(pid ");
        if (q)
            pid = atoi(q + 5);
    }
    free(text);
    return pid;
}

/* Occurrences of needle in the file at path. */
static int count_in(const char *path, const char *needle)
{
    char *text = ps_test_read_file(path, NULL);
    int n = 0;
    for (char *p = text; p && (p = strstr(p, needle)); p++)
        n++;
    free(text);
    return n;
}

/* Wait until path holds needle at least n times (60 s at most; -1 as soon
 * as the ps_launch writing it, pid, says it is done). */
static int wait_count(const char *path, const char *needle, int n, int pid)
{
    for (int t = 0; t < 1200; t++) {
        if (count_in(path, needle) >= n)
            return 0;
        if (pid > 0 && (kill(pid, 0) != 0 || count_in(path, "all workers finished") ||
                        count_in(path, "ps_launch: failed")))
            return -1;
        ps_test_sleep_ms(50);
    }
    return -1;
}

#define LAUNCH_WORKER_FLAGS                                                                    \
    "-- --steps %d --data synthetic:65536 --batch 32 --log-every 10 --model mlp:784-128-10 "  \
    "--seed 3 --save %s"

/* ps_launch of a sync job of `steps` steps, 2 servers and 2 workers (more
 * flags in extra), its model saved to save, its output in log; the pid, or
 * -1. */
static int launch_steps(int steps, const char *extra, const char *save, const char *log)
{
    char words[2048];
    snprintf(words, sizeof words, "--servers 2 --workers 2 --gpus none --mode sync "
             "--metrics-port off %s " LAUNCH_WORKER_FLAGS, extra, steps, save);
    return ps_test_spawn_words("ps_launch", words, log);
}

static int launch(const char *extra, const char *save, const char *log)
{
    return launch_steps(800, extra, save, log);
}

/* The model of an uninterrupted ps_launch run of `steps` steps without
 * replicas (once per program and step count): the reference every run with
 * kills must match bitwise. */
static const char *reference_model_of(int steps)
{
    static char ref[2][512];
    static int made[2];
    int k = steps != 800;
    if (made[k])
        return ref[k][0] ? ref[k] : NULL;
    made[k] = 1;
    char log[512];
    snprintf(ref[k], sizeof ref[k], "%s/launch-ref-%d.model", ps_test_tmpdir(), steps);
    snprintf(log, sizeof log, "%s/launch-ref-%d.log", ps_test_tmpdir(), steps);
    int pid = launch_steps(steps, "", ref[k], log);
    if (pid < 0 || ps_test_wait(pid, 180000) != 0)
        ref[k][0] = 0;
    return ref[k][0] ? ref[k] : NULL;
}

static const char *reference_model(void) { return reference_model_of(800); }

static int same_files(const char *a, const char *b)
{
    size_t na, nb;
    char *x = ps_test_read_file(a, &na), *y = ps_test_read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* ps_launch --replicas 1 (its own etcd): group 0's primary is killed; the
 * supervisor starts a replacement, which copies the group's state from the
 * promoted member while training goes on and becomes its replica; then the
 * promoted primary is killed too, and the replacement takes over.  The
 * model is bitwise the one of a run without replicas or kills. */
PS_TEST(replacement_catches_up_and_a_second_kill_is_survived)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    const char *ref = reference_model();
    CHECK_MSG(ref, "the reference run failed");
    unsigned seed = (unsigned)ps_now_ns();
    srand(seed);
    int k0 = 5 + rand() % 20;
    printf("# seed %u: the primary of group 0 killed at step %d\n", seed, k0 * 10);
    char log[512], got[512], needle[64];
    snprintf(log, sizeof log, "%s/launch-rr.log", ps_test_tmpdir());
    snprintf(got, sizeof got, "%s/launch-rr.model", ps_test_tmpdir());
    int pl = launch("--replicas 1 --coord auto", got, log);
    CHECK(pl > 0);
    snprintf(needle, sizeof needle, " iter %d/", k0 * 10);
    CHECK_MSG(ps_test_wait_for_text(log, needle, 120000, pl) == 0, "no%s", needle);
    int p0 = pid_after(log, "started server 0.0");
    CHECK(p0 > 0);
    kill(p0, SIGKILL);
    /* the replacement for 0.0 joins group 0, whose primary is now 0.1 */
    CHECK_MSG(wait_count(log, "caught up (", 1, pl) == 0, "no replacement caught up");
    int p1 = pid_after(log, "started server 0.1");
    CHECK(p1 > 0);
    kill(p1, SIGKILL); /* the promoted primary: the replacement takes over */
    CHECK_EQ_INT(ps_test_wait(pl, 180000), 0);
    CHECK(count_in(log, "started a new server 0.0") == 1);
    CHECK(count_in(log, "started a new server 0.1") == 1);
    CHECK_MSG(count_in(log, "is now the primary of group 0") == 2,
              "two promotions in group 0, seen %d", count_in(log, "is now the primary of group 0"));
    CHECK_MSG(same_files(ref, got), "the model differs from the uninterrupted run's");
}

/* ps_launch --replicas 0 --restart-servers 1 with a checkpoint every round:
 * a killed server is restarted from its checkpoint, the workers wait for it
 * and go on, and (durable rounds) the model is the uninterrupted run's. */
PS_TEST(restart_servers_without_replicas)
{
    const char *ref = reference_model();
    CHECK_MSG(ref, "the reference run failed");
    char log[512], got[512], extra[1024];
    snprintf(log, sizeof log, "%s/launch-rs.log", ps_test_tmpdir());
    snprintf(got, sizeof got, "%s/launch-rs.model", ps_test_tmpdir());
    snprintf(extra, sizeof extra, "--restart-servers 1 --server-arg --checkpoint-dir=%s/ck "
             "--server-arg --checkpoint-every=1", ps_test_tmpdir());
    int pl = launch(extra, got, log);
    CHECK(pl > 0);
    CHECK(ps_test_wait_for_text(log, " iter 200/", 120000, pl) == 0);
    int p1 = pid_after(log, "started server 1 ");
    CHECK(p1 > 0);
    kill(p1, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(pl, 180000), 0);
    CHECK(count_in(log, "started a new server 1 ") == 1);
    CHECK(count_in(log, "restored "));
    /* the loss the checkpoint policy allows is logged: none here */
    CHECK(count_in(log, "--restore: nothing acknowledged is lost") == 1);
    CHECK_MSG(same_files(ref, got), "the model differs from the uninterrupted run's");
}

/* With CURVE keys the members of a group stream to each other with their
 * shared server key, which each accepts as its own; a worker's key may not
 * speak for a member (a REPL_HELLO under it is refused); and a failover
 * works as without keys. */
PS_TEST(curve_members_authenticate_with_the_group_key)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    char why[512], dir[512], words[1024];
    if (ps_curve_available(why, sizeof why))
        SKIP("%s", why);
    snprintf(dir, sizeof dir, "%s/keys", ps_test_tmpdir());
    CHECK_OK(ps_curve_keygen(dir, 1, 1, 0, why, sizeof why));
    snprintf(words, sizeof words, "--mode async --num-workers 1 --lr 1 --curve-keys %s", dir);
    group gr;
    CHECK_OK(group_start(&gr, 2, 0, 1, "t6", words));
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = gr.eps;
    o.num_workers = 1;
    o.mode = PS_MODE_ASYNC;
    o.hello_timeout_ms = 20000;
    o.request_timeout_ms = 2000;
    o.heartbeat_ms = 200;
    o.curve_dir = dir;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    CHECK_OK(ps_client_register(c, KEY, N));
    CHECK_MSG(ps_client_start(c) == 0, "%s", ps_client_last_error(c));
    static float w[N], g[N], out[N];
    for (int i = 0; i < N; i++)
        g[i] = 1.0f / 8;
    ps_request r;
    CHECK_OK(ps_client_init(c, KEY, w, &r));
    CHECK_OK(wait_req(&r));
    for (int step = 0; step < 10; step++) {
        CHECK_OK(ps_client_push(c, KEY, g, step, &r));
        CHECK_OK(wait_req(&r));
    }
    CHECK(ps_test_wait_for_text(gr.sv[1].log, "taking its stream", 5000, 0) == 0);
    /* worker 0's key, as a member of group 0: refused */
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    CHECK_OK(ps_curve_client_setup(d, dir, 0, 0, why, sizeof why));
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", gr.sv[1].port);
    CHECK_OK(zmq_connect(d, ep));
    ps_header h = ps_test_header(PS_MSG_REPL_HELLO, -1, 9, 0, 0, 0), rep;
    h.epoch = 5;
    h.member = 0;
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.num_workers = 1;
    h.hello.num_servers = 1;
    h.hello.max_staleness = -1;
    CHECK_OK(ps_test_send(d, &h, NULL, 0));
    CHECK_OK(ps_test_recv(d, 5000, &rep, NULL, 0, NULL));
    CHECK_MSG(rep.type == PS_MSG_ERROR && rep.err_code == PS_EAUTH &&
                  strstr(rep.err_text, "server-0"),
              "%s", rep.err_text);
    zmq_close(d);
    zmq_ctx_term(ctx);
    kill(gr.sv[0].pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(gr.sv[0].pid, 5000), 128 + SIGKILL);
    for (int step = 10; step < 20; step++) {
        CHECK_OK(ps_client_push(c, KEY, g, step, &r));
        CHECK_MSG(wait_req(&r) == 0, "push %d: %s", step, r.err);
    }
    CHECK_OK(ps_client_pull(c, KEY, out, 0, &r));
    CHECK_OK(wait_req(&r));
    CHECK_MSG(out[0] == -20.0f / 8, "%.9g", (double)out[0]);
    ps_client_close(c);
    CHECK_EQ_INT(ps_test_stop(gr.sv[1].pid, 5000), 0);
}

/* A bounded chaos loop: ps_launch --replicas 1, sync; up to 6 times a
 * random server process (a primary or a replica, of either group) is killed
 * with SIGKILL, each once the replacement of the one before caught up.  No
 * hang (the run ends within its time), no loss: the model is bitwise the one
 * of the uninterrupted run without replicas. */
PS_TEST(chaos_random_kills_no_hang_no_loss)
{
    if (!etcd_up())
        SKIP("no etcd (install etcd-server: make deps)");
    const int steps = 2000; /* long enough for several kills on an idle machine */
    const char *ref = reference_model_of(steps);
    CHECK_MSG(ref, "the reference run failed");
    unsigned seed = (unsigned)ps_now_ns();
    srand(seed);
    char log[512], got[512];
    snprintf(log, sizeof log, "%s/launch-chaos.log", ps_test_tmpdir());
    snprintf(got, sizeof got, "%s/launch-chaos.model", ps_test_tmpdir());
    int pl = launch_steps(steps, "--replicas 1 --coord auto", got, log);
    CHECK(pl > 0);
    CHECK(ps_test_wait_for_text(log, " iter 20/", 120000, pl) == 0);
    int kills = 0;
    for (; kills < 6; kills++) {
        char label[32];
        snprintf(label, sizeof label, "server %d.%d (pid", rand() % 2, rand() % 2);
        int pid = pid_after(log, label);
        if (pid <= 0 || kill(pl, 0) != 0 || count_in(log, "all workers finished"))
            break;
        printf("# kill %d: %.*s %d\n", kills + 1, (int)strlen(label) - 5, label, pid);
        kill(pid, SIGKILL);
        /* its replacement is a member again before the next kill */
        if (wait_count(log, "caught up (", kills + 1, pl) != 0)
            break;
        ps_test_sleep_ms(50 + rand() % 150);
    }
    printf("# seed %u: %d kills\n", seed, kills);
    CHECK_EQ_INT(ps_test_wait(pl, 180000), 0);
    CHECK_MSG(kills >= 2, "only %d kills fell inside the training", kills);
    CHECK_MSG(same_files(ref, got), "the model differs from the uninterrupted run's");
}
