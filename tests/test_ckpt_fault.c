/* Checkpoint disks that fail, and what a crash may lose, with real
 * bin/ps_server processes and raw DEALER workers: an unwritable
 * --checkpoint-dir is refused at start; a full or read-only one makes the
 * server follow --on-checkpoint-failure and tell the waiting worker why; a
 * deleted one is made again; an init of a chunk already on disk is never
 * held; an async server killed with -9 loses at most --checkpoint-every
 * acknowledged pushes.  Small disks are tmpfs mounts in a mount namespace of
 * the server's own (unshare -m, as root); where that is not possible those
 * cases say "skipped:".  Every wait is bounded. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

typedef struct proc {
    int pid, port;
    char log[512];
} proc;

/* Run argv (NULL-terminated, argv[0] a path) to its end: its exit status,
 * or -1. */
static int run(char *const argv[], int timeout_ms)
{
    int pid = ps_test_spawn(argv, NULL);
    return pid < 0 ? -1 : ps_test_wait(pid, timeout_ms);
}

/* Can this process make mount namespaces and mount a tmpfs in one? */
static int have_mount_ns(void)
{
    static int have = -1;
    if (have < 0) {
        char *const argv[] = {"/usr/bin/unshare", "-m", "/bin/sh", "-c",
                              "mount -t tmpfs -o size=64k tmpfs /mnt", NULL};
        have = access(argv[0], X_OK) == 0 && access("/usr/bin/nsenter", X_OK) == 0 &&
               run(argv, 5000) == 0;
    }
    return have;
}

#define NEED_MOUNT_NS()                                                                    \
    do {                                                                                   \
        if (!have_mount_ns())                                                              \
            SKIP("no mount namespace with a tmpfs here (unshare -m needs root or user "   \
                 "namespaces)");                                                           \
    } while (0)

/* bin/ps_server on a free port with flags and --checkpoint-dir dir; with
 * mnt (mount options, e.g. "size=64k"), dir is a tmpfs mounted so in a mount
 * namespace of the server's own (ro: then made read-only). */
static int server_start(proc *p, const char *dir, const char *mnt, int ro, const char *flags,
                        const char *log_name)
{
    char bin[512], cmd[4096], mount[1400] = "";
    p->port = ps_test_free_port();
    snprintf(p->log, sizeof p->log, "%s/%s", ps_test_tmpdir(), log_name);
    if (mnt)
        snprintf(mount, sizeof mount, "mkdir -p %s && mount -t tmpfs -o %s tmpfs %s && %s", dir,
                 mnt, dir, ro ? "" : "true && ");
    if (mnt && ro)
        snprintf(mount + strlen(mount), sizeof mount - strlen(mount), "mount -o remount,ro %s && ",
                 dir);
    snprintf(cmd, sizeof cmd, "%sexec %s --bind tcp://127.0.0.1:%d --checkpoint-dir %s %s", mount,
             ps_test_bin("ps_server", bin, sizeof bin), p->port, dir, flags);
    char *ns[] = {"/usr/bin/unshare", "-m", "/bin/sh", "-c", cmd, NULL};
    char *plain[] = {"/bin/sh", "-c", cmd, NULL};
    p->pid = ps_test_spawn(mnt ? ns : plain, p->log);
    return p->pid > 0 ? 0 : -1;
}

/* Change the server's tmpfs from outside (e.g. "remount,size=16m"). */
static int ns_mount(const proc *p, const char *opts, const char *dir)
{
    char pid[16], o[64];
    snprintf(pid, sizeof pid, "%d", p->pid);
    snprintf(o, sizeof o, "%s", opts);
    char *const argv[] = {"/usr/bin/nsenter", "-t", pid, "-m", "/usr/bin/mount", "-o", o,
                          (char *)dir, NULL};
    return run(argv, 5000);
}

/* The next reply that is not a heartbeat's, within ms: 0, or 1 none. */
static int next_reply(void *s, int ms, ps_header *r)
{
    int rc;
    do
        rc = ps_test_recv(s, ms, r, NULL, 0, NULL);
    while (rc == 0 && r->type == PS_MSG_HEARTBEAT);
    return rc;
}

static int send_init(void *s, int rank, uint64_t seq, uint64_t key, const float *w, size_t n)
{
    ps_header h = ps_test_header(PS_MSG_INIT, rank, seq, key, 0, 0);
    h.total = n;
    return ps_test_send(s, &h, w, n);
}

static int count_lines(const char *path, const char *needle)
{
    char *t = ps_test_read_file(path, NULL);
    int n = 0;
    for (const char *p = t; p && (p = strstr(p, needle)); p++)
        n++;
    free(t);
    return n;
}

enum { BIG = 25000 }; /* 100 KB of weights: more than a 64 KiB disk holds */

/* ---------------- at start ---------------- */

PS_TEST(an_unusable_checkpoint_dir_is_refused_at_start_naming_it_and_the_errno)
{
    /* a file where the directory should be */
    char path[600];
    snprintf(path, sizeof path, "%s/not-a-dir", ps_test_tmpdir());
    FILE *f = fopen(path, "w");
    CHECK(f);
    fclose(f);
    proc sv;
    CHECK_OK(server_start(&sv, path, NULL, 0, "--checkpoint-every 1", "ck-file.log"));
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 2);
    CHECK(ps_test_file_has(sv.log, "--checkpoint-dir"));
    CHECK(ps_test_file_has(sv.log, "Not a directory"));
    /* a read-only one: even root cannot write there */
    NEED_MOUNT_NS();
    snprintf(path, sizeof path, "%s/ro-ck", ps_test_tmpdir());
    CHECK_OK(server_start(&sv, path, "size=64k", 1, "--checkpoint-every 1", "ck-ro.log"));
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 2);
    char want[700];
    snprintf(want, sizeof want, "--checkpoint-dir %s: cannot create a file in it: Read-only "
             "file system", path);
    CHECK_MSG(ps_test_file_has(sv.log, want), "no '%s' in %s", want, sv.log);
}

/* ---------------- while running ---------------- */

PS_TEST(a_full_disk_holds_a_new_chunk_tells_the_worker_why_and_an_existing_chunk_is_not_held)
{
    NEED_MOUNT_NS();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/full-ck", ps_test_tmpdir());
    proc sv;
    CHECK_OK(server_start(&sv, dir, "size=64k", 0,
                          "--mode async --num-workers 2 --checkpoint-every 1s --on-checkpoint-failure stall:1",
                          "ck-full.log"));
    void *a = ps_test_dealer(sv.port), *b = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 2, -1));
    float *w = calloc(BIG, sizeof *w);
    CHECK(w);
    /* a new chunk: its init waits for a checkpoint that does not fit */
    CHECK_OK(send_init(a, 0, 1, 7, w, BIG));
    ps_header r;
    CHECK_OK(next_reply(a, 6000, &r));
    CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_EIO && r.seq == 1,
              "got type %u code %d q=%llu", r.type, r.err_code, (unsigned long long)r.seq);
    CHECK_MSG(strstr(r.err_text, "checkpoint writes failing") &&
                  strstr(r.err_text, "No space left on device"),
              "the worker was told '%s'", r.err_text);
    /* room again: the next try writes it, and the held acknowledgement goes */
    CHECK_EQ_INT(ns_mount(&sv, "remount,size=16m", dir), 0);
    CHECK_OK(next_reply(a, 6000, &r));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    CHECK_EQ_INT(r.seq, 1);
    CHECK_OK(ps_test_wait_for_text(sv.log, "checkpoints work again", 3000, sv.pid));
    /* the disk fails again: a worker restarted after a crash inits the
     * chunk, which is on disk already: answered at once */
    CHECK_EQ_INT(ns_mount(&sv, "remount,ro", dir), 0);
    CHECK_OK(ps_test_hello(b, 1, PS_MODE_ASYNC, 2, -1));
    CHECK_OK(send_init(b, 1, 2, 7, w, BIG));
    CHECK_OK(next_reply(b, 1000, &r));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    /* a push of it is acknowledged too (nothing async waits for the disk
     * with --checkpoint-every in seconds) */
    ps_header h = ps_test_header(PS_MSG_PUSH, 1, 3, 7, 0, 0);
    CHECK_OK(ps_test_send(b, &h, w, BIG));
    CHECK_OK(next_reply(b, 2000, &r));
    CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    ps_test_sleep_ms(2500); /* failing writes, one a second */
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    /* said loudly, but not once a second */
    int failed = count_lines(sv.log, "failed: ");
    CHECK_MSG(failed >= 2 && failed <= 4, "%d 'failed' lines in %s", failed, sv.log);
    CHECK(ps_test_file_has(sv.log, "--on-checkpoint-failure stall"));
    CHECK(ps_test_file_has(sv.log, "checkpoint writes failed"));
    free(w);
    zmq_close(a);
    zmq_close(b);
}

PS_TEST(a_deleted_checkpoint_dir_is_made_again)
{
    char dir[600], cmd[700];
    snprintf(dir, sizeof dir, "%s/gone-ck", ps_test_tmpdir());
    proc sv;
    CHECK_OK(server_start(&sv, dir, NULL, 0, "--mode async --num-workers 1 --checkpoint-every 2", "ck-gone.log"));
    void *a = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    float w[4] = {1, 2, 3, 4};
    ps_header r;
    CHECK_OK(send_init(a, 0, 1, 3, w, 4));
    CHECK_OK(next_reply(a, PS_TEST_RPC_MS, &r));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
    for (int t = 0; t < 4; t++) { /* two checkpoints' worth */
        ps_header h = ps_test_header(PS_MSG_PUSH, 0, 10 + (uint64_t)t, 3, 0, t);
        CHECK_OK(ps_test_send(a, &h, w, 4));
        CHECK_OK(next_reply(a, PS_TEST_RPC_MS, &r));
        CHECK_MSG(r.type == PS_MSG_PUSH, "push %d: %s", t, r.err_text);
    }
    CHECK_OK(ps_test_wait_for_text(sv.log, "was gone: made it again", 15000, sv.pid));
    struct stat st;
    CHECK_EQ_INT(stat(dir, &st), 0);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    CHECK(!ps_test_file_has(sv.log, "failed: "));
    zmq_close(a);
}

PS_TEST(continue_goes_on_without_checkpoints_and_exit_stops_the_server)
{
    NEED_MOUNT_NS();
    float *w = calloc(BIG, sizeof *w);
    CHECK(w);
    ps_header r;
    /* continue: the init is acknowledged once a write has failed */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/cont-ck", ps_test_tmpdir());
    proc sv;
    CHECK_OK(server_start(&sv, dir, "size=64k", 0,
                          "--mode async --num-workers 1 --checkpoint-every 1s --on-checkpoint-failure continue",
                          "ck-continue.log"));
    void *a = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    CHECK_OK(send_init(a, 0, 1, 7, w, BIG));
    CHECK_OK(next_reply(a, 3000, &r));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    CHECK(ps_test_file_has(sv.log, "go without one (--on-checkpoint-failure continue)"));
    zmq_close(a);
    /* exit: the server stops (exit 1), and tells the waiting worker why */
    snprintf(dir, sizeof dir, "%s/exit-ck", ps_test_tmpdir());
    CHECK_OK(server_start(&sv, dir, "size=64k", 0,
                          "--mode async --num-workers 1 --checkpoint-every 1s --on-checkpoint-failure exit:1",
                          "ck-exit.log"));
    a = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    CHECK_OK(send_init(a, 0, 1, 7, w, BIG));
    CHECK_EQ_INT(ps_test_wait(sv.pid, 6000), 1);
    CHECK_OK(next_reply(a, 1000, &r));
    CHECK_MSG(r.type == PS_MSG_ERROR && strstr(r.err_text, "stopping: checkpoint writes keep "
                                                           "failing"),
              "got type %u '%s'", r.type, r.err_text);
    CHECK(ps_test_file_has(sv.log, "stopping (--on-checkpoint-failure exit)"));
    free(w);
    zmq_close(a);
}

/* ---------------- what a crash loses ---------------- */

PS_TEST(an_async_server_killed_loses_at_most_checkpoint_every_acknowledged_pushes)
{
    /* one worker pipelines pushes of steps on one chunk and counts the
     * acknowledgements; the server is killed with -9 at once after some of
     * them and restarted with --restore: acknowledged pushes missing from
     * the restored chunk are lost, and there may be at most N of them */
    enum { N = 20, PUSHES = 120, CYCLES = 3 };
    char dir[600], flags[900];
    snprintf(dir, sizeof dir, "%s/loss-ck", ps_test_tmpdir());
    snprintf(flags, sizeof flags, "--mode async --num-workers 1 --lr 1 --checkpoint-every %d", N);
    proc sv;
    CHECK_OK(server_start(&sv, dir, NULL, 0, flags, "loss-0.log"));
    void *a = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
    float w[2] = {0, 0}, g[2] = {-1, -1}; /* lr 1: every push adds 1 */
    ps_header r;
    CHECK_OK(send_init(a, 0, 1, 5, w, 2));
    CHECK_OK(next_reply(a, PS_TEST_RPC_MS, &r));
    CHECK_EQ_INT(r.type, PS_MSG_INIT);
    /* each cycle: pushes of steps base_step, base_step + 1, ... applied in
     * order on top of version base_version */
    int64_t base_step = 0, base_version = 0;
    int worst = 0;
    uint64_t q = 100;
    for (int cycle = 0; cycle < CYCLES; cycle++) {
        /* kill at once after the acknowledgements: before the server wrote
         * what it acknowledged, unless it held them back.  The first N - 1
         * of a fresh process need no checkpoint (this loses up to N - 1). */
        int stop_after = cycle == 1 ? N - 1 : PUSHES - 10 * cycle;
        for (int i = 0; i < PUSHES; i++) {
            ps_header h = ps_test_header(PS_MSG_PUSH, 0, q++, 5, 0, base_step + i);
            CHECK_OK(ps_test_send(a, &h, g, 2));
        }
        int acked = 0;
        while (acked < stop_after) {
            CHECK_OK(next_reply(a, PS_TEST_RPC_MS, &r));
            CHECK_MSG(r.type == PS_MSG_PUSH, "push: %s", r.err_text);
            acked++;
        }
        kill(sv.pid, SIGKILL);
        CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 128 + SIGKILL);
        char rflags[1000], log[32];
        snprintf(rflags, sizeof rflags, "%s --restore", flags);
        snprintf(log, sizeof log, "loss-%d.log", cycle + 1);
        CHECK_OK(server_start(&sv, dir, NULL, 0, rflags, log));
        /* the bound of the loss is said at the restore */
        CHECK(ps_test_wait_for_text(sv.log, "--restore: at most 20 pushes this server "
                                    "acknowledged", PS_TEST_RPC_MS, sv.pid) == 0);
        zmq_close(a);
        a = ps_test_dealer(sv.port);
        CHECK_OK(ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1));
        ps_header h = ps_test_header(PS_MSG_PULL, 0, q++, 5, 0, 0);
        float out[2];
        CHECK_OK(ps_test_send(a, &h, NULL, 0));
        CHECK_OK(ps_test_recv(a, PS_TEST_RPC_MS, &r, out, 2, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_PULL);
        CHECK_EQ_INT((int64_t)out[0], r.chunk_version); /* every update added 1 */
        int durable = (int)(r.chunk_version - base_version); /* of this cycle's pushes */
        int lost = acked > durable ? acked - durable : 0;
        printf("# cycle %d: %d pushes acknowledged, %d on disk, %d lost (bound %d)\n", cycle,
               acked, durable, lost, N);
        worst = lost > worst ? lost : worst;
        CHECK_MSG(lost <= N, "cycle %d: %d acknowledged pushes lost, more than "
                  "--checkpoint-every %d", cycle, lost, N);
        /* the worker goes on from its own clock, or the restored one when that
         * is further (it would resend the rest, all duplicates): the restored
         * chunk takes a first push beyond its clock, and says so */
        base_step += acked > durable ? acked : durable;
        base_version = r.chunk_version;
        if (lost) {
            h = ps_test_header(PS_MSG_PUSH, 0, q++, 5, 0, base_step);
            CHECK_OK(ps_test_send(a, &h, g, 2));
            CHECK_OK(next_reply(a, PS_TEST_RPC_MS, &r));
            CHECK_MSG(r.type == PS_MSG_PUSH, "push after the restore: %s", r.err_text);
            CHECK_EQ_INT(r.chunk_version, base_version + 1);
            base_step++;
            base_version++;
            CHECK(ps_test_file_has(sv.log, "since the restore is step"));
        }
    }
    printf("# worst loss %d acknowledged pushes per crash with --checkpoint-every %d\n", worst, N);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(a);
}
