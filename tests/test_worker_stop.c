/* A ps_worker ends when told to, wherever it waits, and does not wait for
 * ever on servers that are gone: real bin/ps_server and bin/ps_worker
 * processes.  SIGTERM (exit 143) within 2 s: waiting for hello, in a sync
 * step whose only server was killed, in a sync step whose partner was
 * stopped, at the final barrier for workers that never came (which it names
 * while it waits).  --server-timeout: exit 1 naming the silent server; a
 * worker stopped (SIGSTOP) for longer than that is not fooled into it.
 * Every wait is bounded; every process is killed at the end (ps_test.c). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define RUN_MS 120000    /* bound on a whole training run (SAN builds are slow) */
#define STOP_MS 2000     /* what "at once" means */

static const char *common = "--model mlp:784-32-10 --batch 16 --data synthetic:512 "
                            "--log-every 10";

typedef struct proc {
    int pid;
    char log[512];
} proc;

/* ps_worker of the server on port with flags and the common ones; output to
 * name in the scratch dir. */
static int worker(proc *p, const char *name, int port, const char *flags)
{
    char words[2048];
    snprintf(words, sizeof words, "--servers tcp://127.0.0.1:%d %s %s", port, flags, common);
    snprintf(p->log, sizeof p->log, "%s/%s", ps_test_tmpdir(), name);
    p->pid = ps_test_spawn_words("ps_worker", words, p->log);
    return p->pid > 0 ? 0 : -1;
}

/* A sync server of one worker (sv) and that worker (w, more flags after
 * the sync ones), which has made 20 steps: 0, or -1. */
static int sync_worker_at_step_20(ps_test_server *sv, proc *w, const char *log, const char *more)
{
    char flags[512];
    snprintf(flags, sizeof flags, "--mode sync --num-workers 1 %s", more);
    if (ps_test_server_start(sv, 1, "--mode sync --num-workers 1") ||
        worker(w, log, sv->port, flags))
        return -1;
    return ps_test_wait_for_text(w->log, "iter 20/", RUN_MS, w->pid);
}

/* Send sig to pid: its exit status, and in *ms how long it took to end
 * (given up after 10 s: -1). */
static int stop_timed(int pid, int sig, double *ms)
{
    int64_t t0 = ps_now_ns();
    kill(pid, sig);
    int rc = ps_test_wait(pid, 10000);
    *ms = (double)(ps_now_ns() - t0) * 1e-6;
    return rc;
}

#define CHECK_STOPS(p, what)                                                              \
    do {                                                                                  \
        double ms_;                                                                       \
        int rc_ = stop_timed((p)->pid, SIGTERM, &ms_);                                    \
        CHECK_MSG(rc_ == 128 + SIGTERM, "%s: exit status %d, expected 143 (log %s)", what, \
                  rc_, (p)->log);                                                         \
        CHECK_MSG(ms_ < STOP_MS, "%s: took %.0f ms to stop (log %s)", what, ms_, (p)->log); \
        CHECK_MSG(ps_test_file_has((p)->log, "stopped by a signal"), "%s: no 'stopped' line", \
                  what);                                                                  \
        printf("# %s: exit 143 %.0f ms after SIGTERM\n", what, ms_);                      \
    } while (0)

PS_TEST(sigterm_ends_a_worker_waiting_for_hello)
{
    proc w;
    int port = ps_test_free_port(); /* no server there */
    CHECK_OK(worker(&w, "hello-w.log", port, "--hello-timeout 60000 --num-workers 1"));
    CHECK_OK(ps_test_wait_for_text(w.log, "ps_worker", 10000, w.pid));
    ps_test_sleep_ms(300); /* data made, hello on its way */
    CHECK_STOPS(&w, "waiting for hello");
}

PS_TEST(sigterm_ends_a_sync_worker_whose_only_server_was_killed)
{
    ps_test_server sv;
    proc w;
    CHECK_MSG(sync_worker_at_step_20(&sv, &w, "killed-w.log", "--epochs 100000") == 0,
              "no step 20 (%s)", w.log);
    kill(sv.pid, SIGKILL);
    CHECK_EQ_INT(ps_test_wait(sv.pid, PS_TEST_RPC_MS), 128 + SIGKILL);
    ps_test_sleep_ms(1000); /* it waits for a reply that will not come */
    CHECK_STOPS(&w, "only server killed");
}

PS_TEST(sigterm_ends_a_sync_worker_whose_partner_was_stopped)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode sync --num-workers 2"));
    proc w0, w1;
    const char *f = "--mode sync --num-workers 2 --epochs 100000";
    char f0[128], f1[128];
    snprintf(f0, sizeof f0, "%s --rank 0", f);
    snprintf(f1, sizeof f1, "%s --rank 1", f);
    CHECK_OK(worker(&w0, "partner-w0.log", sv.port, f0));
    CHECK_OK(worker(&w1, "partner-w1.log", sv.port, f1));
    CHECK_MSG(ps_test_wait_for_text(w0.log, "iter 20/", RUN_MS, w0.pid) == 0,
              "no step 20 (%s)", w0.log);
    CHECK_STOPS(&w1, "partner of a sync worker");
    ps_test_sleep_ms(1000); /* worker 0's round waits for worker 1 */
    CHECK_STOPS(&w0, "sync worker whose partner stopped");
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
}

PS_TEST(final_barrier_names_the_absent_workers_and_sigterm_ends_the_wait)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--mode async --num-workers 4"));
    proc w;
    CHECK_OK(worker(&w, "barrier-w.log", sv.port, "--mode async --num-workers 4 --steps 20"));
    const char *want = "waiting for workers 1, 2, 3 at the final barrier (every worker waits "
                       "here for all --num-workers 4)";
    CHECK_MSG(ps_test_wait_for_text(w.log, want, RUN_MS, w.pid) == 0, "no '%s' in %s", want,
              w.log);
    CHECK_STOPS(&w, "at the final barrier");
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
}

PS_TEST(server_timeout_exits_1_naming_the_silent_server)
{
    ps_test_server sv;
    proc w;
    CHECK_MSG(sync_worker_at_step_20(&sv, &w, "timeout-w.log",
                                     "--epochs 100000 --server-timeout 2") == 0,
              "no step 20 (%s)", w.log);
    kill(sv.pid, SIGKILL);
    int64_t t0 = ps_now_ns();
    int rc = ps_test_wait(w.pid, 20000);
    double s = (double)(ps_now_ns() - t0) * 1e-9;
    CHECK_MSG(rc == 1, "exit status %d, expected 1 (log %s)", rc, w.log);
    char want[160];
    snprintf(want, sizeof want, "no reply from tcp://127.0.0.1:%d for 2 s (ps_server down?); "
             "giving up", sv.port);
    CHECK_MSG(ps_test_file_has(w.log, want), "no '%s' in %s", want, w.log);
    CHECK_MSG(s < 2 + 3, "exited %.1f s after the kill", s);
    printf("# --server-timeout 2: exit 1 %.1f s after the server was killed\n", s);
}

PS_TEST(a_worker_stopped_longer_than_server_timeout_goes_on_when_continued)
{
    ps_test_server sv;
    proc w;
    CHECK_MSG(sync_worker_at_step_20(&sv, &w, "pause-w.log",
                                     "--epochs 100 --steps 400 --server-timeout 1") == 0,
              "no step 20 (%s)", w.log);
    kill(w.pid, SIGSTOP);
    ps_test_sleep_ms(2500);
    kill(w.pid, SIGCONT);
    int rc = ps_test_wait(w.pid, RUN_MS);
    CHECK_MSG(rc == 0, "exit status %d (log %s)", rc, w.log);
    CHECK(ps_test_file_has(w.log, "iter 400/400"));
    CHECK(ps_test_file_has(w.log, "the servers' silence counts from now"));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
}
