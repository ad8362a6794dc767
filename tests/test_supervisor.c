/* ps_launch's supervisor (launch/supervisor.h) on hand-made plans of small
 * /bin/sh children: no sockets, no ps_server or ps_worker.  The supervisor
 * installs signal handlers for the rest of its process and writes to
 * stdout and stderr, so each case runs it in a forked child whose two
 * streams go to files; that child also says afterwards whether any process
 * it started was left unreaped.
 *
 * Checked: every line comes out once, whole, prefixed with its role and
 * rank on the stream it was written to (partial writes, a line without a
 * newline, a line longer than the cut); environment and stdin; the closing
 * summary; a process that fails stops the others and the exit status and
 * the message name it; SIGTERM, SIGINT and SIGHUP reach every child, the
 * workers before the servers, and the status is 128 + the signal; SIGKILL
 * follows a signal that is ignored, at once after a second one; a
 * background process holding a pipe does not hold the run; every child is
 * reaped.  Every child script ends by itself within seconds. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan.h"
#include "ps_test.h"
#include "ps_time.h"
#include "supervisor.h"

#define RUN_MS 20000 /* bound on one supervised run */

/* A child loop that ends by itself (about n * 50 ms) unless a trap ends it. */
#define LOOP(n) "i=0; while [ $i -lt " #n " ]; do sleep 0.05; i=$((i+1)); done; "
/* Say that `who` has set its traps: a file in $PS_TEST_READY (start sets it
 * for every child). */
#define READY(who) ": >\"$PS_TEST_READY/" who "\"; "
/* Wait (2 s at most) until a and b said they are ready: a child that fails
 * on purpose does so only once the others would notice a signal. */
#define AFTER_READY(a, b)                                                          \
    "i=0; while { [ ! -e \"$PS_TEST_READY/" a "\" ] || [ ! -e \"$PS_TEST_READY/" b "\" ]; } && " \
    "[ $i -lt 200 ]; do sleep 0.01; i=$((i+1)); done; "
/* A child that says `ready` and waits for SIGTERM or SIGINT, saying which. */
#define WAITS_FOR_SIGNALS(who)                                                    \
    "trap 'echo \"" who " got TERM\"; exit 0' TERM; "                               \
    "trap 'echo \"" who " got INT\"; exit 0' INT; echo \"" who " ready\"; " READY(who) \
    LOOP(200) "exit 9"

typedef struct run {
    ps_launch_plan plan;
    char out[512], err[512], res[512], ready[512];
    int pid;
    int status;   /* the supervisor's exit status */
    int unreaped; /* 1 when a child was left for its caller to reap */
    int64_t ms;   /* how long it ran */
} run;

/* Add a process running `sh -c script` with env entries ("NAME=value",
 * NULL-terminated list, may be NULL). */
static void add(run *r, int role, int rank, const char *script, const char *const *env)
{
    ps_launch_plan *p = &r->plan;
    ps_launch_cmd *more = realloc(p->cmds, (size_t)(p->n + 1) * sizeof *more);
    if (!more)
        return;
    p->cmds = more;
    ps_launch_cmd *k = &p->cmds[p->n++];
    memset(k, 0, sizeof *k);
    k->role = role;
    k->rank = rank;
    k->endpoint = role == PS_LAUNCH_SERVER ? strdup("tcp://127.0.0.1:1") : NULL;
    k->device = role == PS_LAUNCH_WORKER ? strdup("cpu") : NULL;
    if (script) {
        ps_strvec_push(&k->argv, "/bin/sh");
        ps_strvec_push(&k->argv, "-c");
        ps_strvec_push(&k->argv, script);
    }
    for (; env && *env; env++)
        ps_strvec_push(&k->env, *env);
    if (role == PS_LAUNCH_SERVER)
        p->num_servers++, p->server_procs++;
    else
        p->num_workers++;
}

static void run_init(run *r, const char *name)
{
    memset(r, 0, sizeof *r);
    r->plan.mode = PS_MODE_SYNC;
    snprintf(r->out, sizeof r->out, "%s/%s.out", ps_test_tmpdir(), name);
    snprintf(r->err, sizeof r->err, "%s/%s.err", ps_test_tmpdir(), name);
    snprintf(r->res, sizeof r->res, "%s/%s.res", ps_test_tmpdir(), name);
    snprintf(r->ready, sizeof r->ready, "%s/%s.ready", ps_test_tmpdir(), name);
    mkdir(r->ready, 0700);
}

/* Start the supervisor of r's plan in a forked child: 0, or -1. */
static int start(run *r)
{
    FILE *o = fopen(r->out, "w"), *e = fopen(r->err, "w");
    if (!o || !e) {
        if (o)
            fclose(o);
        if (e)
            fclose(e);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    r->ms = ps_now_ns() / 1000000;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(o), STDOUT_FILENO);
        dup2(fileno(e), STDERR_FILENO);
        setenv("PS_TEST_READY", r->ready, 1);
        int rc = ps_launch_supervise(&r->plan, NULL, NULL);
        /* everything it started must have been waited for */
        int left = waitpid(-1, NULL, WNOHANG) != -1 || errno != ECHILD;
        FILE *f = fopen(r->res, "w");
        if (f) {
            fprintf(f, "%d\n", left);
            fclose(f);
        }
        _exit(rc);
    }
    fclose(o);
    fclose(e);
    r->pid = (int)pid;
    return pid > 0 ? 0 : -1;
}

/* Wait for the supervisor (killed after RUN_MS) and read what it left. */
static void finish(run *r)
{
    r->status = ps_test_wait(r->pid, RUN_MS);
    r->ms = ps_now_ns() / 1000000 - r->ms;
    char *res = ps_test_read_file(r->res, NULL);
    r->unreaped = res ? atoi(res) : -1;
    free(res);
    ps_launch_plan_free(&r->plan);
}

/* The pid ps_launch said it started for role and rank, or -1. */
static int started_pid(const run *r, const char *role, int rank)
{
    char *text = ps_test_read_file(r->err, NULL), want[64];
    snprintf(want, sizeof want, "ps_launch: started %s %d (pid ", role, rank);
    const char *at = text ? strstr(text, want) : NULL;
    int pid = at ? atoi(at + strlen(want)) : -1;
    free(text);
    return pid;
}

/* Where needle first is in the file (its offset), or -1. */
static long offset_of(const char *path, const char *needle)
{
    char *text = ps_test_read_file(path, NULL);
    const char *at = text ? strstr(text, needle) : NULL;
    long off = at ? (long)(at - text) : -1;
    free(text);
    return off;
}

/* How many times needle is in the file. */
static int count_of(const char *path, const char *needle)
{
    char *text = ps_test_read_file(path, NULL);
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(text);
    return n;
}

/* ---------------------------------------------------------------- output */

PS_TEST(every_line_comes_out_once_whole_and_prefixed_on_the_stream_it_was_written_to)
{
    run r;
    run_init(&r, "lines");
    static const char *env[] = {"PS_TEST_FOO=bar", NULL};
    add(&r, PS_LAUNCH_SERVER, 0,
        "trap 'echo \"server got TERM\"; exit 0' TERM; echo 'server out'; echo 'server err' >&2; "
        LOOP(200) "exit 9", NULL);
    add(&r, PS_LAUNCH_WORKER, 0,
        "printf 'par'; sleep 0.2; printf 'tial line\\n'; echo 'to stderr' >&2; "
        "i=0; while [ $i -lt 300 ]; do echo \"line $i\"; i=$((i+1)); done; "
        "head -c 70000 /dev/zero | tr '\\0' x; echo; "
        "echo 'summary: time 1.0 s, 150 samples/s per worker, test accuracy 0.875' >&2; "
        "printf 'no newline at the end'", NULL);
    add(&r, PS_LAUNCH_WORKER, 1,
        "echo \"PS_TEST_FOO is $PS_TEST_FOO\"; cat; echo 'stdin ended'; "
        "echo 'summary: time 1.0 s, 50 samples/s per worker, test accuracy 0.5' >&2", env);
    CHECK_OK(start(&r));
    finish(&r);
    CHECK_MSG(r.status == 0, "exit status %d (stderr in %s)", r.status, r.err);
    CHECK_EQ_INT(r.unreaped, 0);
    /* every stdout line carries a prefix, and each line is whole */
    char *text = ps_test_read_file(r.out, NULL);
    CHECK(text != NULL);
    int bad = 0, lines = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        lines++;
        if (strncmp(l, "[server 0] ", 11) && strncmp(l, "[worker 0] ", 11) &&
            strncmp(l, "[worker 1] ", 11))
            bad++;
    }
    free(text);
    CHECK_MSG(bad == 0, "%d of %d lines without a prefix in %s", bad, lines, r.out);
    const char *out_lines[] = {"[server 0] server out\n", "[server 0] server got TERM\n",
                               "[worker 0] partial line\n", "[worker 0] no newline at the end\n",
                               "[worker 1] PS_TEST_FOO is bar\n", "[worker 1] stdin ended\n"};
    for (size_t k = 0; k < sizeof out_lines / sizeof *out_lines; k++)
        CHECK_MSG(count_of(r.out, out_lines[k]) == 1, "stdout has %d times '%s'",
                  count_of(r.out, out_lines[k]), out_lines[k]);
    /* 300 lines in order, each once */
    long prev = -1;
    for (int i = 0; i < 300; i++) {
        char l[64];
        snprintf(l, sizeof l, "[worker 0] line %d\n", i);
        long at = offset_of(r.out, l);
        CHECK_MSG(at > prev && count_of(r.out, l) == 1, "'%s' missing, twice or out of order",
                  l);
        prev = at;
    }
    /* a line longer than the cut (64 KiB) comes out in two prefixed pieces */
    static char piece[65536 + 32];
    memcpy(piece, "\n[worker 0] ", 12);
    memset(piece + 12, 'x', 65536);
    memcpy(piece + 12 + 65536, "\n[worker 0] ", 13);
    CHECK_MSG(offset_of(r.out, piece) >= 0, "no 65536-character piece of the long line");
    memset(piece + 12, 'x', 4464);
    memcpy(piece + 12 + 4464, "\n", 2);
    CHECK_MSG(offset_of(r.out, piece) >= 0, "no 4464-character rest of the long line");
    /* stderr stays stderr */
    CHECK_EQ_INT(count_of(r.err, "[server 0] server err\n"), 1);
    CHECK_EQ_INT(count_of(r.err, "[worker 0] to stderr\n"), 1);
    CHECK_EQ_INT(count_of(r.out, "server err"), 0);
    CHECK(started_pid(&r, "server", 0) > 0 && started_pid(&r, "worker", 1) > 0);
    CHECK(offset_of(r.err, "ps_launch: all workers finished; stopping the servers\n") >= 0);
    CHECK_MSG(offset_of(r.err, " s: 2 workers finished (mode sync), 1 server stopped; 200 "
                               "samples/s over all workers, test accuracy 0.8750 (worker 0)\n") > 0,
              "no closing summary in %s", r.err);
}

/* ---------------------------------------------------------------- failures */

PS_TEST(a_failed_process_stops_the_others_and_the_exit_status_and_message_name_it)
{
    static const struct {
        int role;              /* who fails */
        const char *script;
        int status;            /* ps_launch's */
        const char *how;       /* what it says after "ps_launch: NAME (pid N) " */
        const char *end;       /* what the closing line says after it */
    } cases[] = {
        {PS_LAUNCH_WORKER, AFTER_READY("server 0", "worker 0") "exit 3", 1,
         "exited with status 3; stopping the others", "exited with status 3"},
        {PS_LAUNCH_WORKER, AFTER_READY("server 0", "worker 0") "exit 2", 2,
         "exited with status 2; stopping the others", "exited with status 2"},
        {PS_LAUNCH_WORKER, AFTER_READY("server 0", "worker 0") "kill -KILL $$", 1,
         "was killed by signal 9 (SIGKILL); stopping the others",
         "was killed by signal 9 (SIGKILL)"},
        {PS_LAUNCH_SERVER, AFTER_READY("worker 0", "worker 1") "exit 4", 1,
         "exited with status 4 before the workers finished; stopping the others",
         "exited with status 4"},
        /* a program that is not there: its child says so and exits 127, at
         * once, maybe before the others set their traps (not checked then) */
        {PS_LAUNCH_WORKER, NULL, 1, "exited with status 127; stopping the others",
         "exited with status 127"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        run r;
        char name[32];
        snprintf(name, sizeof name, "fail%zu", c);
        run_init(&r, name);
        int server_fails = cases[c].role == PS_LAUNCH_SERVER;
        add(&r, PS_LAUNCH_SERVER, 0,
            server_fails ? cases[c].script : WAITS_FOR_SIGNALS("server 0"), NULL);
        add(&r, PS_LAUNCH_WORKER, 0, WAITS_FOR_SIGNALS("worker 0"), NULL);
        add(&r, PS_LAUNCH_WORKER, 1, server_fails ? WAITS_FOR_SIGNALS("worker 1") : cases[c].script,
            NULL);
        if (!cases[c].script)
            ps_strvec_push(&r.plan.cmds[2].argv, "/nonexistent/ps_test_program");
        CHECK_OK(start(&r));
        finish(&r);
        const char *who = server_fails ? "server" : "worker";
        int who_rank = server_fails ? 0 : 1;
        int pid = started_pid(&r, who, who_rank);
        char want[300];
        snprintf(want, sizeof want, "ps_launch: %s %d (pid %d) %s\n", who, who_rank, pid,
                 cases[c].how);
        CHECK_MSG(r.status == cases[c].status, "case %zu: exit status %d, expected %d", c,
                  r.status, cases[c].status);
        CHECK_MSG(pid > 0 && offset_of(r.err, want) >= 0, "case %zu: no line '%s' in %s", c, want,
                  r.err);
        /* the closing line says it again */
        char last[300];
        snprintf(last, sizeof last, " s: %s %d (pid %d) %s\n", who, who_rank, pid, cases[c].end);
        CHECK_MSG(offset_of(r.err, last) > 0 && offset_of(r.err, "ps_launch: failed after ") > 0,
                  "case %zu: no closing line with '%s'", c, last);
        /* the others got SIGTERM: the workers before the servers */
        long w0 = offset_of(r.out, "[worker 0] worker 0 got TERM\n");
        CHECK_MSG(w0 >= 0 || !cases[c].script, "case %zu: worker 0 did not get SIGTERM", c);
        if (!cases[c].script) {
            CHECK(offset_of(r.err, "[worker 1] ps_launch: cannot run "
                                   "/nonexistent/ps_test_program: No such file or directory\n") >= 0);
        } else if (server_fails) {
            CHECK_MSG(offset_of(r.out, "[worker 1] worker 1 got TERM\n") >= 0,
                      "case %zu: worker 1 did not get SIGTERM", c);
        } else {
            long s0 = offset_of(r.out, "[server 0] server 0 got TERM\n");
            CHECK_MSG(s0 > w0, "case %zu: the server got SIGTERM %s", c,
                      s0 < 0 ? "never" : "before worker 0");
        }
        CHECK_EQ_INT(r.unreaped, 0);
        CHECK_MSG(r.ms < 4000, "case %zu: took %lld ms to stop", c, (long long)r.ms);
    }
}

/* ---------------------------------------------------------------- signals */

PS_TEST(sigterm_sigint_and_sighup_reach_every_child_workers_first_and_the_status_is_128_plus_it)
{
    static const struct {
        int sig;
        const char *fwd; /* what the children get */
        const char *said;
    } cases[] = {
        {SIGTERM, "TERM", "ps_launch: got SIGTERM; sending SIGTERM to the 3 running processes\n"},
        {SIGINT, "INT", "ps_launch: got SIGINT; sending SIGINT to the 3 running processes\n"},
        {SIGHUP, "TERM", "ps_launch: got SIGHUP; sending SIGTERM to the 3 running processes\n"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        run r;
        char name[32];
        snprintf(name, sizeof name, "sig%zu", c);
        run_init(&r, name);
        add(&r, PS_LAUNCH_SERVER, 0, WAITS_FOR_SIGNALS("server 0"), NULL);
        add(&r, PS_LAUNCH_WORKER, 0, WAITS_FOR_SIGNALS("worker 0"), NULL);
        add(&r, PS_LAUNCH_WORKER, 1, WAITS_FOR_SIGNALS("worker 1"), NULL);
        CHECK_OK(start(&r));
        int up = ps_test_wait_for_text(r.out, "server 0 ready", RUN_MS / 2, r.pid) == 0 &&
                 ps_test_wait_for_text(r.out, "worker 0 ready", RUN_MS / 2, r.pid) == 0 &&
                 ps_test_wait_for_text(r.out, "worker 1 ready", RUN_MS / 2, r.pid) == 0;
        if (up)
            kill(r.pid, cases[c].sig);
        finish(&r);
        CHECK_MSG(up, "case %zu: the children did not all start (%s)", c, r.out);
        CHECK_MSG(r.status == 128 + cases[c].sig, "case %zu: exit status %d, expected %d", c,
                  r.status, 128 + cases[c].sig);
        CHECK_MSG(offset_of(r.err, cases[c].said) >= 0, "case %zu: no line '%s'", c,
                  cases[c].said);
        char got[3][64];
        long at[3];
        const char *who[3] = {"server 0", "worker 0", "worker 1"};
        for (int k = 0; k < 3; k++) {
            snprintf(got[k], sizeof got[k], "[%s] %s got %s\n", who[k], who[k], cases[c].fwd);
            at[k] = offset_of(r.out, got[k]);
            CHECK_MSG(at[k] >= 0, "case %zu: no line '%s'", c, got[k]);
        }
        CHECK_MSG(at[0] > at[1] && at[0] > at[2], "case %zu: the server got the signal before "
                  "a worker had ended", c);
        char stopped[64];
        snprintf(stopped, sizeof stopped, " s: interrupted by SIG%s\n",
                 cases[c].sig == SIGHUP ? "HUP" : cases[c].fwd);
        CHECK_MSG(offset_of(r.err, "ps_launch: stopped after ") >= 0 &&
                      offset_of(r.err, stopped) > 0,
                  "case %zu: no closing line '...%s'", c, stopped);
        CHECK_EQ_INT(r.unreaped, 0);
        CHECK_MSG(offset_of(r.err, "SIGKILL") < 0, "case %zu: needed SIGKILL", c);
    }
}

PS_TEST(sigkill_follows_an_ignored_sigterm_after_the_grace_or_at_once_after_a_second_signal)
{
    /* a worker that ignores SIGTERM while another fails: SIGKILL after 5 s,
     * and only then does the server get its SIGTERM */
    run r;
    run_init(&r, "grace");
    add(&r, PS_LAUNCH_SERVER, 0, WAITS_FOR_SIGNALS("server 0"), NULL);
    add(&r, PS_LAUNCH_WORKER, 0, "trap '' TERM; " READY("worker 0") LOOP(300) "exit 0", NULL);
    add(&r, PS_LAUNCH_WORKER, 1, AFTER_READY("server 0", "worker 0") "exit 3", NULL);
    CHECK_OK(start(&r));
    finish(&r);
    int pid = started_pid(&r, "worker", 0);
    char want[160];
    snprintf(want, sizeof want, "ps_launch: worker 0 (pid %d) did not stop within 5 s; "
             "sending SIGKILL\n", pid);
    CHECK_MSG(r.status == 1, "exit status %d", r.status);
    CHECK_MSG(pid > 0 && offset_of(r.err, want) >= 0, "no line '%s' in %s", want, r.err);
    CHECK_MSG(r.ms >= 5000 && r.ms < 9000, "ran %lld ms: SIGKILL is due 5 s after SIGTERM",
              (long long)r.ms);
    CHECK(offset_of(r.out, "[server 0] server 0 got TERM\n") >= 0);
    CHECK_EQ_INT(r.unreaped, 0);

    /* two SIGTERMs to ps_launch: the second kills what is left at once */
    run r2;
    run_init(&r2, "twice");
    add(&r2, PS_LAUNCH_SERVER, 0, "trap '' TERM; echo 'server 0 ready'; " LOOP(300) "exit 0",
        NULL);
    add(&r2, PS_LAUNCH_WORKER, 0, "trap '' TERM; echo 'worker 0 ready'; " LOOP(300) "exit 0",
        NULL);
    CHECK_OK(start(&r2));
    int up = ps_test_wait_for_text(r2.out, "server 0 ready", RUN_MS / 2, r2.pid) == 0 &&
             ps_test_wait_for_text(r2.out, "worker 0 ready", RUN_MS / 2, r2.pid) == 0;
    int64_t t0 = 0;
    if (up) {
        kill(r2.pid, SIGTERM);
        up = ps_test_wait_for_text(r2.err, "ps_launch: got SIGTERM; sending", RUN_MS / 2,
                                   r2.pid) == 0;
        t0 = ps_now_ns();
        kill(r2.pid, SIGTERM);
    }
    finish(&r2);
    int64_t after_ms = (ps_now_ns() - t0) / 1000000;
    CHECK_MSG(up, "the children did not start, or the first SIGTERM was not taken (%s)", r2.err);
    CHECK_MSG(r2.status == 143, "exit status %d", r2.status);
    CHECK(offset_of(r2.err, "ps_launch: got SIGTERM again; killing what is left\n") >= 0);
    CHECK_MSG(after_ms < 3000, "the second SIGTERM took %lld ms to end the run",
              (long long)after_ms);
    CHECK_EQ_INT(r2.unreaped, 0);
}

/* ---------------------------------------------------------------- reaping */

PS_TEST(a_background_process_holding_a_pipe_does_not_hold_the_run)
{
    run r;
    run_init(&r, "drain");
    char script[700];
    /* the worker ends only once the server has set its traps, so the TERM
     * that follows finds them */
    snprintf(script, sizeof script,
             AFTER_READY("server 0", "server 0")
             "sleep 4 & echo $! >%s/drain.pid; echo 'worker 0 done'; exit 0",
             ps_test_tmpdir());
    add(&r, PS_LAUNCH_SERVER, 0, WAITS_FOR_SIGNALS("server 0"), NULL);
    add(&r, PS_LAUNCH_WORKER, 0, script, NULL);
    CHECK_OK(start(&r));
    finish(&r);
    char path[600];
    snprintf(path, sizeof path, "%s/drain.pid", ps_test_tmpdir());
    char *bg = ps_test_read_file(path, NULL);
    int bg_pid = bg ? atoi(bg) : 0;
    free(bg);
    if (bg_pid > 0)
        kill(bg_pid, SIGKILL); /* it outlived the run, as it may */
    CHECK_MSG(r.status == 0, "exit status %d", r.status);
    CHECK(offset_of(r.out, "[worker 0] worker 0 done\n") >= 0);
    CHECK(offset_of(r.out, "[server 0] server 0 got TERM\n") >= 0);
    CHECK_MSG(r.ms < 3500, "ran %lld ms: the 4 s background sleep held it", (long long)r.ms);
    CHECK_EQ_INT(r.unreaped, 0);
}
