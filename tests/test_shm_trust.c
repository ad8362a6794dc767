/* Trust at the shared-memory boundary, with real users (docs/SECURITY.md
 * "Shared memory"): two users this program makes with useradd (and a
 * guardian process removes with userdel when it ends, however it ends)
 * attack a live bin/ps_server and a local aggregation group as an
 * unprivileged neighbour would.
 *
 * Checked: an arena another user offers (an old-style 0666 /dev/shm file
 * with a valid header, truncated after the hello, or a sealed memfd of its
 * own) is refused at hello, a shared-memory push into it is an error reply
 * for that connection alone, and the honest worker next to it trains on
 * through shared memory; a user the server trusts (--shm-users) cannot
 * shrink its arena under the server, nor is an unsealed one taken; a
 * squatted aggregation segment stops the group's leader and members at once,
 * naming its owner, and gets nothing from them, while a root group replaces
 * it.  Needs root and useradd; SKIP elsewhere. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "local_group.h"
#include "ps_error.h"
#include "ps_hash.h"
#include "ps_proto.h"
#include "ps_shm.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define CHILD_S 60 /* bound on every child this program forks */

/* ---------- users, and the guardian that removes them ---------- */

typedef struct tuser {
    char name[32];
    uid_t uid;
    gid_t gid;
} tuser;

static int g_guard = -1; /* write end of the guardian's pipe: one user name a line */

/* A process of its own session (the test runner's signals do not reach it)
 * that waits for this program to end (the pipe's end of file), then runs
 * userdel for every name it was sent. */
static int guardian_start(void)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setsid();
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        close(p[1]);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0])
                close(fd);
        char buf[4096];
        size_t len = 0;
        ssize_t n;
        while (len < sizeof buf - 1 && (n = read(p[0], buf + len, sizeof buf - 1 - len)) != 0)
            if (n > 0)
                len += (size_t)n;
        buf[len] = 0;
        for (char *save = NULL, *name = strtok_r(buf, "\n", &save); name;
             name = strtok_r(NULL, "\n", &save)) {
            pid_t d = fork();
            if (d == 0) {
                execl("/usr/sbin/userdel", "userdel", name, (char *)NULL);
                execlp("userdel", "userdel", name, (char *)NULL);
                _exit(127);
            }
            int st;
            if (d > 0)
                waitpid(d, &st, 0);
        }
        _exit(0);
    }
    close(p[0]);
    fcntl(p[1], F_SETFD, FD_CLOEXEC); /* programs this test runs do not keep it open */
    g_guard = p[1];
    return 0;
}

/* User `tag` of this run ('a', 'b'), made once; NULL with why when this
 * machine cannot make one. */
static const tuser *user(char tag, char *why, size_t len)
{
    static tuser users[2];
    static int made[2];
    int k = tag - 'a';
    if (made[k])
        return &users[k];
    if (geteuid() != 0) {
        snprintf(why, len, "needs root to make a second user (useradd)");
        return NULL;
    }
    const char *useradd = access("/usr/sbin/useradd", X_OK) == 0 ? "/usr/sbin/useradd" : "useradd";
    if (g_guard < 0 && guardian_start() != 0) {
        snprintf(why, len, "cannot start the process that removes the users: %s",
                 strerror(errno));
        return NULL;
    }
    tuser *u = &users[k];
    snprintf(u->name, sizeof u->name, "pstest%d%c", (int)getpid(), tag);
    /* the guardian knows the name before it exists */
    if (dprintf(g_guard, "%s\n", u->name) < 0) {
        snprintf(why, len, "cannot reach the guardian");
        return NULL;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --system --no-create-home --home-dir /nonexistent --shell "
             "/usr/sbin/nologin %s 2>&1", useradd, u->name);
    char out[256] = "";
    int rc = -1;
    /* another useradd may hold /etc/passwd's lock for a moment */
    for (int tries = 0; tries < 5 && rc != 0; tries++) {
        if (tries)
            ps_test_sleep_ms(300);
        FILE *f = popen(cmd, "r");
        size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
        out[got] = 0;
        rc = f ? pclose(f) : -1;
    }
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (rc != 0 || getpwnam_r(u->name, &pw, tmp, sizeof tmp, &res) != 0 || !res) {
        snprintf(why, len, "cannot make a user with useradd (exit %d): %.150s", rc, out);
        return NULL;
    }
    u->uid = res->pw_uid;
    u->gid = res->pw_gid;
    made[k] = 1;
    return u;
}

static int become(const tuser *u)
{
    return setgroups(0, NULL) == 0 && setgid(u->gid) == 0 && setuid(u->uid) == 0 &&
                   geteuid() == u->uid
               ? 0
               : -1;
}

/* Run fn as user u in a child (bounded by CHILD_S): its return (0 when
 * every expectation held) and what it wrote into why. */
typedef int (*as_fn)(void *arg, char *why, size_t len);

static int run_as(const tuser *u, as_fn fn, void *arg, char *why, size_t len)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        alarm(CHILD_S);
        char w[600] = "";
        int rc = become(u) ? (snprintf(w, sizeof w, "cannot become %s", u->name), 1)
                           : fn(arg, w, sizeof w);
        if (write(p[1], w, strlen(w)) < 0)
            rc = 1;
        _exit(rc ? 1 : 0);
    }
    close(p[1]);
    size_t got = 0;
    ssize_t n;
    while (got < len - 1 && (n = read(p[0], why + got, len - 1 - got)) > 0)
        got += (size_t)n;
    why[got] = 0;
    close(p[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---------- a worker that speaks the protocol itself ---------- */

/* A DEALER on a context of this process's own (forked children must not
 * share the parent's). */
static void *dealer(int port)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, ivl = 10;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    zmq_connect(s, ep);
    return s;
}

static int hello(void *s, int rank, int nw, const char *name, uint64_t nonce, uint64_t size,
                 ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_HELLO, rank, 1000 + (uint64_t)rank, 0, 0, 0);
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.max_staleness = -1;
    h.hello.num_workers = (uint32_t)nw;
    h.hello.num_servers = 1;
    h.hello.opt.kind = PS_OPT_NONE;
    if (name) {
        snprintf(h.hello.shm_name, sizeof h.hello.shm_name, "%.47s", name);
        h.hello.shm_nonce = nonce;
        h.hello.shm_size = size;
    }
    if (ps_test_rpc(s, &h, NULL, 0, r, NULL, 0, NULL) || r->type != PS_MSG_HELLO)
        return -1;
    return 0;
}

/* A request whose payload (or destination) is at off in the arena. */
static int shm_rpc(void *s, uint32_t type, int rank, uint64_t seq, uint64_t key, int64_t step,
                   uint64_t off, uint64_t count, ps_header *r)
{
    ps_header h = ps_test_header(type, rank, seq, key, 0, step);
    h.flags |= PS_FLAG_SHM;
    h.shm_off = off;
    h.count = count;
    h.dtype = PS_DTYPE_F32;
    if (type == PS_MSG_INIT)
        h.total = count;
    return ps_test_rpc(s, &h, NULL, 0, r, NULL, 0, NULL);
}

static int alive(void *s, int rank)
{
    ps_header h = ps_test_header(PS_MSG_HEARTBEAT, rank, 77, 0, 0, 0), r;
    return ps_test_rpc(s, &h, NULL, 0, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_HEARTBEAT;
}

#define EXPECT(cond, ...)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            snprintf(why, len, __VA_ARGS__);                                                    \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

/* ---------- a foreign arena ---------- */

typedef struct attack {
    int port;
} attack;

/* As the second user, rank 1 next to an honest worker 0: the issue's
 * attack (a 0666 file with a valid header, offered, a chunk inited, the file
 * truncated, a push through it) and its own sealed arena. */
static int foreign_arena(void *arg, char *why, size_t len)
{
    const attack *a = arg;
    ps_shm_arena real;
    char w[256];
    EXPECT(ps_shm_create(16384, &real, w, sizeof w) == 0, "ps_shm_create: %s", w);
    char shname[64], path[64];
    snprintf(shname, sizeof shname, "/ps-%d-0123456789abcdef", (int)getpid());
    int named = shm_open(shname, O_CREAT | O_EXCL | O_RDWR, 0666);
    EXPECT(named >= 0 && fchmod(named, 0666) == 0 && ftruncate(named, (off_t)real.size) == 0 &&
               pwrite(named, real.base, PS_SHM_HEADER_BYTES, 0) == PS_SHM_HEADER_BYTES,
           "cannot make %s: %s", shname, strerror(errno));
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), named);
    void *s = dealer(a->port);
    ps_header r;
    /* by its /dev/shm name, as the arenas of earlier versions went */
    EXPECT(hello(s, 1, 2, shname, real.nonce, real.size, &r) == 0, "no hello reply");
    EXPECT(r.hello.shm == 0, "the 0666 file %s was mapped", shname);
    /* by the path of its descriptor, as an arena goes now */
    EXPECT(hello(s, 1, 2, path, real.nonce, real.size, &r) == 0, "no hello reply");
    EXPECT(r.hello.shm == 0 && strstr(r.hello.shm_why, "owned by uid"),
           "the 0666 file was %s: '%s'", r.hello.shm ? "mapped" : "refused", r.hello.shm_why);
    float w0[4] = {1, 2, 3, 4};
    ps_header h = ps_test_header(PS_MSG_INIT, 1, 2, 999, 0, 0);
    h.total = 4;
    EXPECT(ps_test_rpc(s, &h, w0, 4, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_INIT,
           "init over the network failed: %s", r.err_text);
    EXPECT(ftruncate(named, 0) == 0, "truncate: %s", strerror(errno));
    EXPECT(shm_rpc(s, PS_MSG_PUSH, 1, 3, 999, 0, PS_SHM_HEADER_BYTES, 4, &r) == 0 &&
               r.type == PS_MSG_ERROR && r.err_code == PS_EHELLO,
           "a shared-memory push into the refused file got type %u code %d '%s'", r.type,
           r.err_code, r.err_text);
    /* its own arena, as it should be made, but of another user */
    EXPECT(hello(s, 1, 2, real.name, real.nonce, real.size, &r) == 0, "no hello reply");
    EXPECT(r.hello.shm == 0 && strstr(r.hello.shm_why, "owned by uid"),
           "another user's sealed arena was %s: '%s'", r.hello.shm ? "mapped" : "refused",
           r.hello.shm_why);
    EXPECT(alive(s, 1), "the server no longer answers");
    shm_unlink(shname);
    return 0;
}

PS_TEST(another_users_arena_is_refused_and_the_honest_worker_trains_on)
{
    char why[600] = "";
    const tuser *m = user('a', why, sizeof why);
    if (!m)
        SKIP("%s", why);
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode async"));
    char words[400], log[512];
    snprintf(words, sizeof words, "--servers tcp://127.0.0.1:%d --rank 0 --num-workers 2 "
             "--mode async --model mlp:784-64-10 --data synthetic:4096 --batch 32 --epochs 40 "
             "--log-every 64", sv.port);
    snprintf(log, sizeof log, "%s/honest.log", ps_test_tmpdir());
    int w = ps_test_spawn_words("ps_worker", words, log);
    CHECK(w > 0);
    CHECK_OK(ps_test_wait_for_text(log, "epoch 2 iter", 20000, w));
    attack a = {sv.port};
    int rc = run_as(m, foreign_arena, &a, why, sizeof why);
    /* the attack came while the worker trained */
    CHECK_MSG(!ps_test_file_has(log, "epoch 40 iter 2560/2560"), "the worker was done before the "
              "attack: give it more epochs");
    /* rank 1's final barrier, for the honest worker to finish, on a
     * connection of its own: hello first (the attacker's closed with its
     * process; the server sees that within milliseconds) */
    void *s = ps_test_dealer(sv.port);
    int held = 0;
    for (int t = 0; t < 100 && !held; t++)
        if (!(held = ps_test_hello(s, 1, PS_MODE_ASYNC, 2, -1) == 0))
            ps_test_sleep_ms(50);
    CHECK_MSG(held, "rank 1 was not freed when the attacker's connection closed");
    ps_header h = ps_test_header(PS_MSG_BARRIER, 1, 9, 0, 0, 1), r;
    CHECK(ps_test_send(s, &h, NULL, 0) == 0 && ps_test_recv(s, 50000, &r, NULL, 0, NULL) == 0 &&
          r.type == PS_MSG_BARRIER);
    zmq_close(s);
    CHECK_MSG(rc == 0, "as %s: %s (exit %d)", m->name, why, rc);
    rc = ps_test_wait(w, 60000);
    CHECK_MSG(rc == 0, "the honest worker exited %d: %s", rc, log);
    CHECK_MSG(ps_test_file_has(log, "epoch 40 iter 2560/2560") && ps_test_file_has(log, "summary:"),
              "the honest worker did not finish: %s", log);
    CHECK_MSG(kill(sv.pid, 0) == 0, "the server is gone: %s", sv.log);
    ps_test_stop(sv.pid, 3000);
    CHECK_MSG(ps_test_file_has(sv.log, "worker 0: payloads through shared memory") &&
                  ps_test_file_has(sv.log, "worker 1: payloads over the network: shared memory "
                                           "refused: arena owned by uid"),
              "%s", sv.log);
}

/* ---------- a trusted user's arena ---------- */

/* As a user the server trusts: a sealed arena is mapped; its owner cannot
 * shrink it and may close it, and the server reads and writes it still;
 * an unsealed one is not taken. */
static int trusted_arena(void *arg, char *why, size_t len)
{
    const attack *a = arg;
    ps_shm_arena ar;
    char w[256];
    EXPECT(ps_shm_create(16384, &ar, w, sizeof w) == 0, "ps_shm_create: %s", w);
    float *x = ps_shm_alloc(&ar, 4 * sizeof(float)), *g = ps_shm_alloc(&ar, 4 * sizeof(float));
    float *out = ps_shm_alloc(&ar, 4 * sizeof(float));
    uint64_t ox, og, oo;
    EXPECT(x && g && out && ps_shm_contains(&ar, x, 16, &ox) && ps_shm_contains(&ar, g, 16, &og) &&
               ps_shm_contains(&ar, out, 16, &oo),
           "ps_shm_alloc failed");
    for (int i = 0; i < 4; i++) {
        x[i] = (float)(i + 1);
        g[i] = 0.5f;
    }
    void *s = dealer(a->port);
    ps_header r;
    EXPECT(hello(s, 0, 1, ar.name, ar.nonce, ar.size, &r) == 0 && r.hello.shm == 1,
           "the trusted user's arena was refused: '%s'", r.hello.shm_why);
    EXPECT(shm_rpc(s, PS_MSG_INIT, 0, 2, 5, 0, ox, 4, &r) == 0 && r.type == PS_MSG_INIT,
           "init through shared memory: type %u '%s'", r.type, r.err_text);
    /* the owner cannot shrink it, and lets go of its descriptor */
    EXPECT(ftruncate(ar.fd, 0) != 0 && errno == EPERM, "the arena could be truncated");
    EXPECT(ftruncate(ar.fd, PS_SHM_HEADER_BYTES) != 0, "the arena could be shrunk");
    close(ar.fd);
    ar.fd = -1;
    EXPECT(shm_rpc(s, PS_MSG_PUSH, 0, 3, 5, 0, og, 4, &r) == 0 && r.type == PS_MSG_PUSH,
           "push through shared memory: type %u '%s'", r.type, r.err_text);
    EXPECT(shm_rpc(s, PS_MSG_PULL, 0, 4, 5, 1, oo, 4, &r) == 0 && r.type == PS_MSG_PULL,
           "pull through shared memory: type %u '%s'", r.type, r.err_text);
    for (int i = 0; i < 4; i++)
        EXPECT(out[i] == (float)(i + 1) - 0.5f, "pulled w[%d] = %g", i, (double)out[i]);
    /* an unsealed memfd of the same user, with a copy of the header (and
     * another nonce: its path may be the closed descriptor's, and the same
     * path and nonce are the arena the server holds) */
    int unsealed = memfd_create("x", MFD_CLOEXEC);
    char path[64];
    EXPECT(unsealed >= 0 && fchmod(unsealed, 0600) == 0 &&
               ftruncate(unsealed, (off_t)ar.size) == 0 &&
               pwrite(unsealed, ar.base, PS_SHM_HEADER_BYTES, 0) == PS_SHM_HEADER_BYTES,
           "cannot make an unsealed memfd");
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), unsealed);
    EXPECT(hello(s, 0, 1, path, ar.nonce + 2, ar.size, &r) == 0 && r.hello.shm == 0 &&
               strstr(r.hello.shm_why, "sealed"),
           "an unsealed arena was %s: '%s'", r.hello.shm ? "mapped" : "refused",
           r.hello.shm_why);
    EXPECT(ftruncate(unsealed, 0) == 0, "truncate");
    EXPECT(shm_rpc(s, PS_MSG_PUSH, 0, 5, 5, 1, og, 4, &r) == 0 && r.type == PS_MSG_ERROR &&
               r.err_code == PS_EHELLO,
           "a push after the refused hello got type %u code %d", r.type, r.err_code);
    EXPECT(alive(s, 0), "the server no longer answers");
    return 0;
}

PS_TEST(a_trusted_users_arena_cannot_shrink_under_the_server)
{
    char why[600] = "";
    const tuser *m = user('a', why, sizeof why);
    if (!m)
        SKIP("%s", why);
    ps_test_server sv;
    char flags[200];
    snprintf(flags, sizeof flags, "--num-workers 1 --mode async --optimizer sgd --lr 1 "
             "--shm-users %s", m->name);
    CHECK_OK(ps_test_server_start(&sv, 1, flags));
    attack a = {sv.port};
    int rc = run_as(m, trusted_arena, &a, why, sizeof why);
    CHECK_MSG(rc == 0, "as %s: %s (exit %d)", m->name, why, rc);
    CHECK_MSG(kill(sv.pid, 0) == 0, "the server is gone: %s", sv.log);
    ps_test_stop(sv.pid, 3000);
    /* and a user that is not there is refused at start */
    snprintf(flags, sizeof flags, "--bind tcp://127.0.0.1:%d --shm-users no-such-user-%d",
             ps_test_free_port(), (int)getpid());
    char log[512];
    snprintf(log, sizeof log, "%s/bad-users.log", ps_test_tmpdir());
    int pid = ps_test_spawn_words("ps_server", flags, log);
    CHECK_EQ_INT(ps_test_wait(pid, 10000), 2);
    CHECK_MSG(ps_test_file_has(log, "no user 'no-such-user"), "%s", log);
}

/* ---------- a squatted aggregation segment ---------- */

#define SQ_N 4

/* As the squatter: the group's segment made first (a valid one: as a
 * leader), opened to everyone; it waits for members that must never come,
 * and says how that went when told to stop. */
typedef struct squat {
    const char *name;
    int ready[2], stop[2];
} squat;

static int squatter(void *arg, char *why, size_t len)
{
    squat *q = arg;
    size_t counts[1] = {SQ_N};
    ps_lgroup *g = NULL;
    char w[400];
    int rc = ps_lgroup_open(q->name, 0, 2, counts, 1, 1500, NULL, &g, w, sizeof w);
    char path[300];
    snprintf(path, sizeof path, "/dev/shm%s", q->name);
    if (rc == 0)
        chmod(path, 0666);
    char c = rc == 0 ? 1 : 0;
    if (write(q->ready[1], &c, 1) != 1 || rc)
        EXPECT(0, "the squatter could not make %s: %s", q->name, w);
    /* nobody of the group may attach */
    int wrc = ps_lgroup_wait_members(g, w, sizeof w);
    /* told to stop, or a test that failed early: the name goes either way */
    struct pollfd pf = {q->stop[0], POLLIN, 0};
    poll(&pf, 1, 20000);
    ps_lgroup_close(g);
    EXPECT(wrc == PS_ETIMEDOUT, "a member attached to the squatted segment (wait: %d %s)", wrc,
           w);
    return 0;
}

typedef struct lg_try {
    const char *name;
    int rank, rc;
    int64_t ms;
    char why[400];
} lg_try;

/* Open the group as `rank` (the other rank runs in another child) and
 * report rc and why. */
static int try_open(void *arg, char *why, size_t len)
{
    lg_try *t = arg;
    size_t counts[1] = {SQ_N};
    ps_lgroup *g = NULL;
    int64_t t0 = ps_now_ns();
    int rc = ps_lgroup_open(t->name, t->rank, 2, counts, 1, 8000, NULL, &g, t->why,
                            sizeof t->why);
    if (rc == 0 && t->rank == 0)
        rc = ps_lgroup_wait_members(g, t->why, sizeof t->why);
    snprintf(why, len, "%d %lld %s", rc, (long long)((ps_now_ns() - t0) / 1000000), t->why);
    ps_lgroup_close(g);
    return 0;
}

/* Both ranks of a group as user u (NULL: root, this process's user) at
 * once; their results in t[0], t[1]. */
static void open_both(const tuser *u, const char *name, lg_try t[2])
{
    static const tuser root = {"root", 0, 0};
    pid_t pid[2];
    int p[2][2];
    for (int r = 0; r < 2; r++) {
        memset(&t[r], 0, sizeof t[r]);
        t[r].name = name;
        t[r].rank = r;
        t[r].rc = -1;
        if (pipe(p[r]) != 0)
            return;
        fflush(stdout);
        fflush(stderr);
        pid[r] = fork();
        if (pid[r] == 0) {
            close(p[r][0]);
            char w[600];
            run_as(u ? u : &root, try_open, &t[r], w, sizeof w);
            if (write(p[r][1], w, strlen(w)) < 0)
                _exit(1);
            _exit(0);
        }
        close(p[r][1]);
    }
    for (int r = 0; r < 2; r++) {
        char buf[600];
        ssize_t n = read(p[r][0], buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        close(p[r][0]);
        int st;
        waitpid(pid[r], &st, 0);
        int rc = -1, used = 0;
        long long ms = 0;
        if (sscanf(buf, "%d %lld %n", &rc, &ms, &used) >= 2) {
            t[r].rc = rc;
            t[r].ms = ms;
            snprintf(t[r].why, sizeof t[r].why, "%s", buf + used);
        }
    }
}

PS_TEST(a_squatted_aggregation_segment_stops_the_group_naming_its_owner)
{
    char why[600] = "";
    const tuser *a = user('a', why, sizeof why), *b = a ? user('b', why, sizeof why) : NULL;
    if (!a || !b)
        SKIP("%s", why);
    char name[64];
    snprintf(name, sizeof name, "/ps-agg-test-%d", (int)getpid());
    /* user b squats the name with a valid segment, mode 0666 */
    squat q = {name, {-1, -1}, {-1, -1}};
    CHECK(pipe(q.ready) == 0 && pipe(q.stop) == 0);
    fflush(stdout);
    fflush(stderr);
    int sp[2];
    CHECK(pipe(sp) == 0);
    pid_t sq = fork();
    if (sq == 0) {
        close(sp[0]);
        char w[600];
        int rc = run_as(b, squatter, &q, w, sizeof w);
        if (write(sp[1], w, strlen(w)) < 0)
            rc = 1;
        _exit(rc ? 1 : 0);
    }
    close(sp[1]);
    char c = 0;
    CHECK(read(q.ready[0], &c, 1) == 1 && c == 1);
    /* the group of user a: both stop at once, naming b; nothing attached */
    lg_try t[2];
    open_both(a, name, t);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(t[r].rc == PS_EAUTH, "rank %d: %d %s", r, t[r].rc, t[r].why);
        CHECK_MSG(strstr(t[r].why, b->name) && strstr(t[r].why, "another user"),
                  "rank %d: %s", r, t[r].why);
        CHECK_MSG(t[r].ms < 3000, "rank %d took %lld ms to stop", r, (long long)t[r].ms);
    }
    c = 1;
    CHECK(write(q.stop[1], &c, 1) == 1);
    char sw[600];
    ssize_t n = read(sp[0], sw, sizeof sw - 1);
    sw[n > 0 ? n : 0] = 0;
    int st;
    waitpid(sq, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "squatter: %s", sw);
    shm_unlink(name);
}

/* bin/PROG with words as user u, output to log (made here, before). */
static int spawn_as(const tuser *u, const char *prog, const char *words, const char *log)
{
    char bin[256];
    ps_test_bin(prog, bin, sizeof bin);
    char *copy = strdup(words), *save = NULL, *argv[64];
    int n = 0;
    argv[n++] = bin;
    for (char *w = strtok_r(copy, " ", &save); w && n < 63; w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        if (become(u) == 0)
            execv(bin, argv);
        fprintf(stderr, "cannot run %s as %s: %s\n", bin, u->name, strerror(errno));
        _exit(127);
    }
    free(copy);
    return (int)pid;
}

/* The programs themselves: two ps_workers of user a with --local-aggregate
 * 2, whose group name user b took first, stop at start (exit 2: something
 * to fix) saying who holds it, and hand it nothing. */
PS_TEST(ps_worker_local_aggregation_stops_at_a_squatted_segment)
{
    char why[600] = "";
    const tuser *a = user('a', why, sizeof why), *b = a ? user('b', why, sizeof why) : NULL;
    if (!a || !b)
        SKIP("%s", why);
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode sync"));
    char servers[64], name[64];
    snprintf(servers, sizeof servers, "tcp://127.0.0.1:%d", sv.port);
    snprintf(name, sizeof name, "/ps-agg-%016llx-0",
             (unsigned long long)ps_fnv1a(PS_FNV1A_BASIS, servers, strlen(servers)));
    squat q = {name, {-1, -1}, {-1, -1}};
    CHECK(pipe(q.ready) == 0 && pipe(q.stop) == 0);
    int sp[2];
    CHECK(pipe(sp) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t sq = fork();
    if (sq == 0) {
        close(sp[0]);
        char w[600];
        int rc = run_as(b, squatter, &q, w, sizeof w);
        if (write(sp[1], w, strlen(w)) < 0)
            rc = 1;
        _exit(rc ? 1 : 0);
    }
    close(sp[1]);
    char c = 0;
    CHECK(read(q.ready[0], &c, 1) == 1 && c == 1);
    int w[2];
    char log[2][512];
    int64_t t0 = ps_now_ns();
    for (int r = 0; r < 2; r++) {
        char words[400];
        snprintf(words, sizeof words, "--servers %s --rank %d --num-workers 2 --mode sync "
                 "--local-aggregate 2 --model mlp:784-16-10 --data synthetic:512 --batch 32 "
                 "--steps 5", servers, r);
        snprintf(log[r], sizeof log[r], "%s/squatted-%d.log", ps_test_tmpdir(), r);
        w[r] = spawn_as(a, "ps_worker", words, log[r]);
        CHECK(w[r] > 0);
    }
    for (int r = 0; r < 2; r++) {
        int rc = ps_test_wait(w[r], 30000);
        if (rc == 127 && ps_test_file_has(log[r], "cannot run")) {
            c = 1;
            CHECK(write(q.stop[1], &c, 1) == 1);
            ps_test_stop(sv.pid, 3000);
            SKIP("%s cannot run the programs here (%s)", a->name, log[r]);
        }
        CHECK_MSG(rc == 2, "worker %d exited %d, not 2 (something to fix): %s", r, rc, log[r]);
        CHECK_MSG(ps_test_file_has(log[r], b->name) && ps_test_file_has(log[r], "another user"),
                  "worker %d does not name the squatter: %s", r, log[r]);
    }
    CHECK_MSG((ps_now_ns() - t0) / 1000000 < 20000, "the group took %lld ms to stop",
              (long long)((ps_now_ns() - t0) / 1000000));
    c = 1;
    CHECK(write(q.stop[1], &c, 1) == 1);
    char sw[600];
    ssize_t n = read(sp[0], sw, sizeof sw - 1);
    sw[n > 0 ? n : 0] = 0;
    int st;
    waitpid(sq, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "squatter: %s", sw);
    ps_test_stop(sv.pid, 3000);
    shm_unlink(name);
}

PS_TEST(a_root_group_replaces_a_squatted_segment)
{
    char why[600] = "";
    const tuser *b = user('b', why, sizeof why);
    if (!b)
        SKIP("%s", why);
    char name[64], path[128];
    snprintf(name, sizeof name, "/ps-agg-test-root-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm%s", name);
    /* a file of b under the name, as a squatter leaves it */
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0666);
    CHECK(fd >= 0 && fchown(fd, b->uid, b->gid) == 0 && fchmod(fd, 0666) == 0 &&
          ftruncate(fd, 65536) == 0);
    close(fd);
    lg_try t[2];
    open_both(NULL, name, t);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(t[r].rc == 0, "rank %d: %d %s", r, t[r].rc, t[r].why);
    struct stat st;
    CHECK_MSG(stat(path, &st) != 0, "%s is still there", path);
}
