/* The same-host data plane: arenas (common/ps_shm.h), a worker's payloads
 * through shared memory to live bin/ps_server processes with exactly the
 * results of the network path, fallbacks, what a server refuses to map, and
 * nothing in /dev/shm. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_shm.h"
#include "ps_test.h"

#define WAIT_MS 5000

/* ---------- arenas ---------- */

/* Entries of /dev/shm named like an arena of any version ("ps-..."): none
 * should ever be there. */
static int dev_shm_arenas(void)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "ps-", 3) == 0 && strncmp(e->d_name, "ps-agg-", 7) != 0;
    if (d)
        closedir(d);
    return n;
}

PS_TEST(arena_create_attach_alloc_and_close)
{
    ps_shm_arena a, b;
    char why[256], want[64];
    int before = dev_shm_arenas();
    CHECK_OK(ps_shm_create(1 << 20, &a, why, sizeof why));
    snprintf(want, sizeof want, "/proc/%d/fd/%d", (int)getpid(), a.fd);
    CHECK_STR(a.name, want);
    CHECK_EQ_INT(dev_shm_arenas(), before); /* nothing with a name anywhere */
    struct stat st;
    CHECK(fstat(a.fd, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_uid == geteuid());
    CHECK_EQ_INT(st.st_blocks * 512, (long long)a.size); /* allocated, not sparse */
    float *x = ps_shm_alloc(&a, 1000 * sizeof(float));
    CHECK(x && (uintptr_t)x % PS_SHM_ALIGN == 0);
    x[999] = 42.0f;
    uint64_t off;
    CHECK(ps_shm_contains(&a, x, 1000 * sizeof(float), &off));
    CHECK(!ps_shm_contains(&a, x, (a.size) , &off)); /* runs past the end */
    CHECK(!ps_shm_contains(&a, a.base, 4, &off));    /* the header is no buffer */
    /* another mapping sees the same bytes */
    CHECK_OK(ps_shm_attach(a.name, a.nonce, a.size, NULL, 0, &b, why, sizeof why));
    float *y = (float *)(b.base + off);
    CHECK(y[999] == 42.0f);
    CHECK(ps_shm_range_ok(&b, off, 1000 * sizeof(float)));
    CHECK(!ps_shm_range_ok(&b, off + 2, 4));      /* misaligned */
    CHECK(!ps_shm_range_ok(&b, 0, 4));            /* the header */
    CHECK(!ps_shm_range_ok(&b, b.size - 4, 8));   /* past the end */
    /* a wrong nonce or size is another arena */
    ps_shm_arena c;
    CHECK_EQ_INT(ps_shm_attach(a.name, a.nonce + 2, a.size, NULL, 0, &c, why, sizeof why),
                 PS_EMISMATCH);
    CHECK_EQ_INT(ps_shm_attach(a.name, a.nonce, a.size + 4096, NULL, 0, &c, why, sizeof why),
                 PS_EMISMATCH);
    /* no such descriptor here: another host */
    CHECK_EQ_INT(ps_shm_attach("/proc/1/fd/999999", 1, 8192, NULL, 0, &c, why, sizeof why),
                 PS_ENOTFOUND);
    /* only /proc/PID/fd/FD, exactly */
    const char *bad[] = {"/ps-1-0000000000000000", "/proc/self/fd/3", "/proc/01/fd/3",
                         "/proc/1/fd/3/", "/proc/1/fd/+3", "/proc/1/fd/", "/dev/shm/x",
                         "/proc/1/fd/3 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(ps_shm_attach(bad[i], 1, 8192, NULL, 0, &c, why, sizeof why) == PS_EINVAL,
                  "%s taken", bad[i]);
    ps_shm_close(&b);
    ps_shm_close(&a);
    CHECK_EQ_INT(dev_shm_arenas(), before);
}

/* The owner itself cannot change the arena's size: no mapping of it can
 * fault (SIGBUS) for a read or write past a new end. */
PS_TEST(an_arena_can_neither_shrink_nor_grow)
{
    ps_shm_arena a;
    char why[256];
    CHECK_OK(ps_shm_create(1 << 16, &a, why, sizeof why));
    CHECK(ftruncate(a.fd, 4096) != 0 && errno == EPERM);
    CHECK(ftruncate(a.fd, 0) != 0 && errno == EPERM);
    CHECK(ftruncate(a.fd, (off_t)a.size * 2) != 0 && errno == EPERM);
    CHECK(fcntl(a.fd, F_ADD_SEALS, 0) != 0); /* and the seals stay: F_SEAL_SEAL */
    a.base[a.size - 1] = 7; /* the last byte is still there */
    ps_shm_close(&a);
}

/* What a server maps is a sealed memfd of mode 0600 of its own user (or
 * one it trusts): an unsealed memfd, a wider mode, a file of /dev/shm, a
 * fifo or another user's arena are refused, and nothing is opened that
 * could block. */
PS_TEST(only_a_sealed_memfd_of_mode_0600_and_a_trusted_user_is_mapped)
{
    char why[256], name[64];
    ps_shm_arena a, c;
    CHECK_OK(ps_shm_create(4096, &a, why, sizeof why));
    /* a copy of its header in files that are not sealed arenas */
    int unsealed = memfd_create("x", MFD_CLOEXEC);
    CHECK(unsealed >= 0 && fchmod(unsealed, 0600) == 0 && ftruncate(unsealed, (off_t)a.size) == 0);
    CHECK(pwrite(unsealed, a.base, PS_SHM_HEADER_BYTES, 0) == PS_SHM_HEADER_BYTES);
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), unsealed);
    CHECK_EQ_INT(ps_shm_attach(name, a.nonce, a.size, NULL, 0, &c, why, sizeof why), PS_EAUTH);
    CHECK_MSG(strstr(why, "sealed") != NULL, "%s", why);
    close(unsealed);
    char shm_name[64];
    snprintf(shm_name, sizeof shm_name, "/ps-test-%d", (int)getpid());
    int named = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(named >= 0 && ftruncate(named, (off_t)a.size) == 0);
    shm_unlink(shm_name);
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), named);
    CHECK_EQ_INT(ps_shm_attach(name, a.nonce, a.size, NULL, 0, &c, why, sizeof why), PS_EAUTH);
    close(named);
    int fifo[2];
    CHECK(pipe(fifo) == 0);
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)getpid(), fifo[0]);
    CHECK_EQ_INT(ps_shm_attach(name, a.nonce, a.size, NULL, 0, &c, why, sizeof why), PS_EAUTH);
    close(fifo[0]);
    close(fifo[1]);
    /* the real arena with another mode */
    CHECK(fchmod(a.fd, 0644) == 0);
    CHECK_EQ_INT(ps_shm_attach(a.name, a.nonce, a.size, NULL, 0, &c, why, sizeof why), PS_EAUTH);
    CHECK_MSG(strstr(why, "0644") != NULL, "%s", why);
    CHECK(fchmod(a.fd, 0600) == 0);
    /* owned by another uid (as root we can make it so), trusted or not */
    if (geteuid() == 0) {
        uint32_t other = 4242;
        CHECK(fchown(a.fd, other, (gid_t)-1) == 0);
        CHECK_EQ_INT(ps_shm_attach(a.name, a.nonce, a.size, NULL, 0, &c, why, sizeof why),
                     PS_EAUTH);
        CHECK_MSG(strstr(why, "uid 4242") != NULL, "%s", why);
        CHECK_OK(ps_shm_attach(a.name, a.nonce, a.size, &other, 1, &c, why, sizeof why));
        ps_shm_close(&c);
        CHECK(fchown(a.fd, geteuid(), (gid_t)-1) == 0);
    }
    ps_shm_close(&a);
}

PS_TEST(shm_users_take_names_and_uids)
{
    uint32_t u[PS_SHM_MAX_USERS];
    int n = -1;
    char why[256];
    CHECK_OK(ps_shm_parse_users(NULL, u, &n, why, sizeof why));
    CHECK_EQ_INT(n, 0);
    CHECK_OK(ps_shm_parse_users("root,1234", u, &n, why, sizeof why));
    CHECK(n == 2 && u[0] == 0 && u[1] == 1234);
    CHECK_EQ_INT(ps_shm_parse_users("no-such-user-here", u, &n, why, sizeof why), PS_EINVAL);
    CHECK_MSG(strstr(why, "no-such-user-here") != NULL, "%s", why);
    CHECK_EQ_INT(ps_shm_parse_users("root,,1", u, &n, why, sizeof why), PS_EINVAL);
}

/* ---------- through live servers ---------- */

typedef struct srv {
    int pid;
    char ep[64], log[300];
} srv;

static int srv_start(srv *s, const char *flags)
{
    char words[512];
    snprintf(s->ep, sizeof s->ep, "tcp://127.0.0.1:%d", ps_test_free_port());
    snprintf(s->log, sizeof s->log, "%s/server-%s.log", ps_test_tmpdir(), strrchr(s->ep, ':') + 1);
    snprintf(words, sizeof words, "--bind %s %s", s->ep, flags);
    s->pid = ps_test_spawn_words("ps_server", words, s->log);
    return s->pid > 0 ? 0 : -1;
}

static void srv_stop(srv *s)
{
    if (s->pid > 0)
        ps_test_stop(s->pid, 3000);
    s->pid = 0;
}

static int open_client(const char *eps, int rank, int nw, int mode, int shm, size_t n,
                       size_t chunk_bytes, ps_client **out, char *why, size_t len)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = eps;
    o.rank = rank;
    o.num_workers = nw;
    o.mode = mode;
    o.hello_timeout_ms = WAIT_MS;
    o.shm = shm;
    o.chunk_bytes = chunk_bytes;
    int rc = ps_client_open(&o, out);
    if (rc) {
        snprintf(why, len, "open: %s", ps_client_last_error(NULL));
        return rc;
    }
    if ((rc = ps_client_register(*out, 1, n)) || (rc = ps_client_start(*out))) {
        snprintf(why, len, "%s", ps_client_last_error(*out));
        ps_client_close(*out);
        *out = NULL;
    }
    return rc;
}

static float gval(int rank, size_t i, int step)
{
    uint32_t x = (uint32_t)(rank * 7919 + (int)i * 104729 + step * 1299709) * 2654435761u;
    return ldexpf(1.0f + (float)(x >> 8) / 16777216.0f, (int)((x >> 3) % 16) - 8) *
           (x & 1 ? -1.0f : 1.0f);
}

/* One worker, async, sgd lr 0.5: steps of push then pull on 3 chunks over 2
 * servers; the weights after `steps` into out.  shm picks the path. */
static int run_async(int shm, int steps, float *out, size_t n, int *shm_servers, char *why,
                     size_t len)
{
    srv s[2];
    for (int k = 0; k < 2; k++) {
        char flags[200];
        snprintf(flags, sizeof flags, "--rank %d --num-servers 2 --num-workers 1 --mode async "
                 "--optimizer sgd --lr 0.5", k);
        if (srv_start(&s[k], flags))
            return -1;
    }
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    ps_client *c = NULL;
    int rc = open_client(eps, 0, 1, PS_MODE_ASYNC, shm, n, 1600, &c, why, len);
    float *w = NULL, *g = NULL;
    if (!rc) {
        *shm_servers = ps_client_shm_servers(c);
        w = shm ? ps_client_shm_alloc(c, n * sizeof(float)) : NULL;
        g = shm ? ps_client_shm_alloc(c, n * sizeof(float)) : NULL;
        if (!w)
            w = calloc(n, sizeof(float));
        if (!g)
            g = calloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++)
            w[i] = (float)i * 0.25f;
        ps_request r;
        if ((rc = ps_client_init(c, 1, w, &r)) == 0)
            rc = ps_request_wait(&r);
        for (int t = 0; t < steps && !rc; t++) {
            for (size_t i = 0; i < n; i++)
                g[i] = gval(0, i, t);
            if ((rc = ps_client_push(c, 1, g, t, &r)) == 0)
                rc = ps_request_wait(&r);
            if (!rc && (rc = ps_client_pull(c, 1, w, t + 1, &r)) == 0)
                rc = ps_request_wait(&r);
            if (rc)
                snprintf(why, len, "step %d: %s", t, r.err);
        }
        memcpy(out, w, n * sizeof(float));
        if (!shm || !ps_client_shm_servers(c)) {
            free(w);
            free(g);
        }
        ps_client_close(c);
    }
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    return rc;
}

PS_TEST(async_through_shared_memory_equals_the_network_path_bitwise)
{
    enum { N = 1000, STEPS = 25 };
    static float a[N], b[N];
    char why[512] = "";
    int on = -1, off = -1;
    CHECK_MSG(run_async(1, STEPS, a, N, &on, why, sizeof why) == 0, "shm run: %s", why);
    CHECK_MSG(run_async(0, STEPS, b, N, &off, why, sizeof why) == 0, "tcp run: %s", why);
    CHECK_EQ_INT(on, 2);
    CHECK_EQ_INT(off, 0);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* and the arithmetic: w = w0 - 0.5 * sum of the gradients, in step order */
    for (size_t i = 0; i < N; i++) {
        float w = (float)i * 0.25f;
        for (int t = 0; t < STEPS; t++)
            w -= 0.5f * gval(0, i, t);
        CHECK_MSG(a[i] == w, "w[%zu] = %.9g, expected %.9g", i, a[i], w);
    }
}

/* Two workers, sync, 2 servers, 3 chunks: each worker's thread pushes its
 * gradients of step t and pulls version t+1.  The weights worker 0 ends with. */
typedef struct sync_arg {
    const char *eps;
    int rank, shm, steps, rc;
    size_t n;
    float *out;
    char why[256];
} sync_arg;



static void *sync_worker(void *p)
{
    sync_arg *a = p;
    ps_client *c = NULL;
    a->rc = open_client(a->eps, a->rank, 2, PS_MODE_SYNC, a->shm, a->n, 1600, &c, a->why,
                        sizeof a->why);
    if (a->rc)
        return NULL;
    float *w = a->shm ? ps_client_shm_alloc(c, a->n * sizeof(float)) : NULL;
    float *g[2] = {a->shm ? ps_client_shm_alloc(c, a->n * sizeof(float)) : NULL,
                   a->shm ? ps_client_shm_alloc(c, a->n * sizeof(float)) : NULL};
    int own = !w;
    if (own) {
        w = calloc(a->n, sizeof(float));
        g[0] = calloc(a->n, sizeof(float));
        g[1] = calloc(a->n, sizeof(float));
    }
    for (size_t i = 0; i < a->n; i++)
        w[i] = (float)i * 0.25f;
    ps_request r, pr;
    if ((a->rc = ps_client_init(c, 1, w, &r)) == 0)
        a->rc = ps_request_wait(&r);
    for (int t = 0; t < a->steps && !a->rc; t++) {
        /* the gradient buffers alternate, as the exchange's do */
        float *gt = g[t & 1];
        for (size_t i = 0; i < a->n; i++)
            gt[i] = gval(a->rank, i, t);
        if ((a->rc = ps_client_push(c, 1, gt, t, &r)) == 0 &&
            (a->rc = ps_client_pull(c, 1, w, t + 1, &pr)) == 0 &&
            (a->rc = ps_request_wait(&pr)) == 0)
            a->rc = ps_request_wait(&r);
        if (a->rc)
            snprintf(a->why, sizeof a->why, "step %d: %.100s %.100s", t, r.err, pr.err);
    }
    memcpy(a->out, w, a->n * sizeof(float));
    if (own) {
        free(w);
        free(g[0]);
        free(g[1]);
    }
    ps_client_close(c);
    return NULL;
}

static int run_sync(int shm, int steps, float *out, size_t n, char *why, size_t len)
{
    srv s[2];
    for (int k = 0; k < 2; k++) {
        char flags[200];
        snprintf(flags, sizeof flags, "--rank %d --num-servers 2 --num-workers 2 --mode sync "
                 "--optimizer momentum --lr 0.125", k);
        if (srv_start(&s[k], flags))
            return -1;
    }
    char eps[160];
    snprintf(eps, sizeof eps, "%s,%s", s[0].ep, s[1].ep);
    static float other[4096];
    sync_arg a[2] = {{eps, 0, shm, steps, 0, n, out, ""}, {eps, 1, shm, steps, 0, n, other, ""}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, sync_worker, &a[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    srv_stop(&s[0]);
    srv_stop(&s[1]);
    for (int k = 0; k < 2; k++)
        if (a[k].rc) {
            snprintf(why, len, "worker %d: %s", k, a[k].why);
            return a[k].rc;
        }
    if (memcmp(out, other, n * sizeof(float)) != 0) {
        snprintf(why, len, "the two workers ended with different weights");
        return -1;
    }
    return 0;
}

PS_TEST(sync_two_workers_through_shared_memory_equal_the_network_path_bitwise)
{
    enum { N = 1000, STEPS = 20 };
    static float a[N], b[N];
    char why[512] = "";
    CHECK_MSG(run_sync(1, STEPS, a, N, why, sizeof why) == 0, "shm run: %s", why);
    CHECK_MSG(run_sync(0, STEPS, b, N, why, sizeof why) == 0, "tcp run: %s", why);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

/* A worker process (bin/ps_worker) training async against s; its pid. */
static int start_worker(const srv *s, const char *extra, const char *log)
{
    char words[600];
    snprintf(words, sizeof words, "--servers %s --rank 0 --num-workers 1 --mode async "
             "--model mlp:784-64-10 --data synthetic:2048 --batch 32 --log-every 20 %s",
             s->ep, extra);
    return ps_test_spawn_words("ps_worker", words, log);
}

PS_TEST(no_arena_is_ever_in_dev_shm_after_a_clean_stop_or_a_kill_of_either_side)
{
    srv s;
    char log[512];
    int before = dev_shm_arenas();
    /* a clean run */
    CHECK_OK(srv_start(&s, "--num-workers 1 --mode async"));
    snprintf(log, sizeof log, "%s/clean.log", ps_test_tmpdir());
    int w = start_worker(&s, "--epochs 1", log);
    CHECK_EQ_INT(ps_test_wait(w, 60000), 0);
    CHECK_MSG(ps_test_file_has(s.log, "payloads through shared memory"),
              "the worker did not use shared memory: %s", s.log);
    CHECK_EQ_INT(dev_shm_arenas(), before);
    /* SIGKILL of the worker, of the server, of both: the memory has no name
     * to leave behind */
    for (int kill_which = 0; kill_which < 3; kill_which++) {
        if (!s.pid)
            CHECK_OK(srv_start(&s, "--num-workers 1 --mode async"));
        snprintf(log, sizeof log, "%s/killed-%d.log", ps_test_tmpdir(), kill_which);
        w = start_worker(&s, "--epochs 1000", log);
        CHECK_OK(ps_test_wait_for_text(log, "iter 20/", 20000, w));
        CHECK_EQ_INT(dev_shm_arenas(), before);
        if (kill_which != 1)
            kill(w, SIGKILL);
        if (kill_which != 0) {
            kill(s.pid, SIGKILL);
            ps_test_wait(s.pid, 5000);
            s.pid = 0;
        }
        if (kill_which == 1)
            kill(w, SIGTERM);
        ps_test_wait(w, 10000);
        CHECK_EQ_INT(dev_shm_arenas(), before);
    }
    srv_stop(&s);
}

/* An arena the machine cannot hold (here: asked for 1 PiB) is said once,
 * and the worker trains over the network. */
PS_TEST(an_arena_the_machine_cannot_hold_is_said_once_and_the_network_taken)
{
    srv s;
    CHECK_OK(srv_start(&s, "--num-workers 1 --mode async --optimizer sgd --lr 1"));
    char path[512];
    snprintf(path, sizeof path, "%s/no-arena.err", ps_test_tmpdir());
    fflush(stderr);
    int keep = dup(2), f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(keep >= 0 && f >= 0 && dup2(f, 2) == 2);
    close(f);
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = s.ep;
    o.rank = 0;
    o.num_workers = 1;
    o.mode = PS_MODE_ASYNC;
    o.hello_timeout_ms = WAIT_MS;
    o.shm_bytes = (size_t)1 << 50;
    ps_client *c = NULL;
    int rc = ps_client_open(&o, &c);
    if (!rc && !(rc = ps_client_register(c, 1, 16)))
        rc = ps_client_start(c);
    fflush(stderr);
    dup2(keep, 2);
    close(keep);
    CHECK_OK(rc);
    CHECK_EQ_INT(ps_client_shm_servers(c), 0);
    CHECK(ps_client_shm_alloc(c, 64) == NULL);
    float w[16], g[16], back[16];
    for (int i = 0; i < 16; i++) {
        w[i] = (float)i;
        g[i] = 1.0f;
    }
    ps_request r;
    CHECK_OK(ps_client_init(c, 1, w, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_OK(ps_client_push(c, 1, g, 0, &r));
    CHECK_OK(ps_request_wait(&r));
    CHECK_OK(ps_client_pull(c, 1, back, 1, &r));
    CHECK_OK(ps_request_wait(&r));
    for (int i = 0; i < 16; i++)
        CHECK(back[i] == (float)i - 1.0f);
    ps_client_close(c);
    srv_stop(&s);
    size_t len = 0;
    char *text = ps_test_read_file(path, &len);
    int said = 0;
    for (char *p = text; p && (p = strstr(p, "no shared-memory arena")); p++)
        said++;
    CHECK_MSG(said == 1 && strstr(text, "of memory available") &&
                  strstr(text, "payloads go over the network"),
              "said %d times: %s", said, text ? text : "");
    free(text);
}

/* A worker killed while it writes a gradient into its arena, before the
 * push's notification: the server never applies a half-written gradient,
 * because it reads the arena only for a push it was told about. */
PS_TEST(a_worker_killed_while_writing_a_gradient_changes_nothing)
{
    enum { N = 4096 };
    srv s;
    CHECK_OK(srv_start(&s, "--num-workers 1 --mode async --lr 1"));
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        ps_client *c;
        char why[256];
        if (open_client(s.ep, 0, 1, PS_MODE_ASYNC, 1, N, 0, &c, why, sizeof why))
            _exit(2);
        float *w = ps_client_shm_alloc(c, N * sizeof(float));
        float *g = ps_client_shm_alloc(c, N * sizeof(float));
        ps_request r;
        for (size_t i = 0; i < N; i++)
            w[i] = 1.0f;
        if (!w || !g || ps_client_init(c, 1, w, &r) || ps_request_wait(&r))
            _exit(3);
        for (size_t i = 0; i < N / 2; i++) /* half a gradient ... */
            g[i] = 1000.0f;
        char ok = 1;
        if (write(fds[1], &ok, 1) != 1)
            _exit(4);
        for (;;)
            pause(); /* ... and then the parent kills us */
    }
    close(fds[1]);
    char ok = 0;
    CHECK(read(fds[0], &ok, 1) == 1 && ok == 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    /* a new worker (the same rank, as after a restart) reads the weights */
    ps_client *c;
    char why[256];
    CHECK_MSG(open_client(s.ep, 0, 1, PS_MODE_ASYNC, 1, N, 0, &c, why, sizeof why) == 0, "%s",
              why);
    float *w = ps_client_shm_alloc(c, N * sizeof(float));
    CHECK(w != NULL);
    ps_request r;
    CHECK_OK(ps_client_pull(c, 1, w, 0, &r));
    CHECK_OK(ps_request_wait(&r));
    int intact = 1;
    for (size_t i = 0; i < N; i++)
        intact &= w[i] == 1.0f;
    CHECK_EQ_INT(r.version, 0);
    ps_client_close(c);
    srv_stop(&s);
    CHECK_MSG(intact, "the weights changed without a push");
}

/* A server killed with -9 and restarted with --restore has no mapping of the
 * worker's arena: the worker says hello again (with the same arena), and the
 * payloads go through shared memory again. */
PS_TEST(a_restored_server_serves_shared_memory_again)
{
    srv s;
    char dir[512], flags[700], log[512];
    snprintf(dir, sizeof dir, "%s/restore-ck", ps_test_tmpdir());
    snprintf(flags, sizeof flags, "--num-workers 1 --mode async --checkpoint-dir %s "
             "--checkpoint-every 50", dir);
    CHECK_OK(srv_start(&s, flags));
    char first_log[300];
    snprintf(first_log, sizeof first_log, "%s", s.log);
    snprintf(log, sizeof log, "%s/restore-worker.log", ps_test_tmpdir());
    int w = start_worker(&s, "--epochs 1000 --steps 3000 --request-timeout 300", log);
    CHECK_OK(ps_test_wait_for_text(log, "iter 200/", 20000, w));
    kill(s.pid, SIGKILL);
    ps_test_wait(s.pid, 5000);
    /* the same port, restored */
    char words[900];
    snprintf(words, sizeof words, "--bind %s %s --restore", s.ep, flags);
    snprintf(s.log, sizeof s.log, "%s/restored-server.log", ps_test_tmpdir());
    s.pid = ps_test_spawn_words("ps_server", words, s.log);
    CHECK(s.pid > 0);
    int rc = ps_test_wait(w, 60000);
    srv_stop(&s);
    CHECK_MSG(rc == 0, "the worker exited %d (see %s)", rc, log);
    CHECK_MSG(ps_test_file_has(first_log, "payloads through shared memory"),
              "no shared memory before the crash: %s", first_log);
    CHECK_MSG(ps_test_file_has(s.log, "restored ") &&
                  ps_test_file_has(s.log, "payloads through shared memory"),
              "the restored server did not take the arena again: %s", s.log);
    CHECK_MSG(ps_test_file_has(log, "rejoined"), "the worker did not say hello again: %s", log);
}
