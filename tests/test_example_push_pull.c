/* examples/push_pull against a real bin/ps_server: the values it prints are
 * exactly plain SGD's w1 = w0 - lr * g, and without a server it fails with a
 * message within its hello timeout instead of hanging or exiting 0.
 * The example is $BUILD/examples/push_pull (BUILD as tests/run.sh sets it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_time.h"

#define RUN_MS 15000 /* bound on one run of the example */

static const char *example(char *buf, size_t len)
{
    const char *b = getenv("BUILD");
    snprintf(buf, len, "%s/examples/push_pull", b && *b ? b : "build");
    return buf;
}

/* Run the example with arg (NULL: none); its output goes to log.  Returns
 * its exit status, -1 when it had not ended after RUN_MS. */
static int run_example(const char *arg, const char *log, double *secs)
{
    char path[512];
    char *argv[] = {(char *)example(path, sizeof path), (char *)arg, NULL};
    double t0 = ps_now_s();
    int pid = ps_test_spawn(argv, log);
    int st = pid > 0 ? ps_test_wait(pid, RUN_MS) : -1;
    if (secs)
        *secs = ps_now_s() - t0;
    return st;
}

/* Run the example against a bin/ps_server with plain SGD, lr 0.5 (every
 * value below is exact in float), naming the server as the argument or in
 * PS_SERVERS.  The example's exit status, -2 when the server did not start;
 * its output in log. */
static int run_with_server(int via_env, const char *name, char *log, size_t len)
{
    ps_test_server sv;
    snprintf(log, len, "%s/%s.log", ps_test_tmpdir(), name);
    if (ps_test_server_start(&sv, 1, "--mode sync --num-workers 1 --num-servers 1 --rank 0 "
                                     "--optimizer sgd --lr 0.5"))
        return -2;
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    if (via_env)
        setenv("PS_SERVERS", ep, 1);
    int st = run_example(via_env ? NULL : ep, log, NULL);
    unsetenv("PS_SERVERS");
    ps_test_stop(sv.pid, 5000);
    return st;
}

PS_TEST(push_pull_prints_w1_equal_w0_minus_lr_g)
{
    char log[512];
    int st = run_with_server(0, "example-sgd", log, sizeof log);
    char *out = ps_test_read_file(log, NULL);
    CHECK_MSG(st == 0, "exit status %d, output: %s", st, out ? out : "(none)");
    /* w0 = 1 2 3 4, g = 0.5 0.25 -1 2, lr 0.5 */
    CHECK_MSG(out && strstr(out, "w0: 1 2 3 4\ng: 0.5 0.25 -1 2\nw1: 0.75 1.875 3.5 3\n"),
              "output: %s", out ? out : "(none)");
    free(out);
}

PS_TEST(push_pull_takes_the_servers_from_PS_SERVERS)
{
    char log[512];
    CHECK_EQ_INT(run_with_server(1, "example-env", log, sizeof log), 0);
    CHECK(ps_test_file_has(log, "w1: 0.75 1.875 3.5 3\n"));
}

PS_TEST(push_pull_without_a_server_fails_within_the_hello_timeout)
{
    char ep[64], log[512];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ps_test_free_port());
    snprintf(log, sizeof log, "%s/example-none.log", ps_test_tmpdir());
    double secs;
    int st = run_example(ep, log, &secs);
    char *out = ps_test_read_file(log, NULL);
    CHECK_MSG(st == 1, "exit status %d (-1: still running after %d ms), output: %s", st, RUN_MS,
              out ? out : "(none)");
    /* the example waits 3 s for hello */
    CHECK_MSG(secs < 8.0, "took %.1f s", secs);
    CHECK_MSG(out && strstr(out, "push_pull: ps_client_start failed (error ") &&
                  !strstr(out, "w1:"),
              "output: %s", out ? out : "(none)");
    free(out);
}

PS_TEST(push_pull_without_servers_given_says_how)
{
    char log[512];
    snprintf(log, sizeof log, "%s/example-usage.log", ps_test_tmpdir());
    unsetenv("PS_SERVERS");
    int st = run_example(NULL, log, NULL);
    CHECK_EQ_INT(st, 2);
    CHECK(ps_test_file_has(log, "usage: push_pull tcp://HOST:PORT"));
}
