/* README.md's C program ("The client library") does what the README says.
 *
 * The Makefile cuts that ```c block out of README.md and builds it, as the
 * README tells a reader to, with -Iinclude and libps alone, into
 * readme_client next to this program; so a README that stops compiling
 * stops the build, and these cases run it: against a live bin/ps_server, a
 * server that refuses it, and an endpoint without its transport. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ps_test.h"
#include "ps_test_server.h"

#define RUN_MS 30000

/* Run readme_client with `servers`; its exit status (-1: did not end in
 * RUN_MS), its stdout and stderr in the file named by log. */
static int run_readme(const char *servers, char *log, size_t log_len)
{
    static int count;
    char exe[PATH_MAX], prog[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(prog, sizeof prog, "%s/readme_client", exe);
    snprintf(log, log_len, "%s/readme%d.log", ps_test_tmpdir(), count++);
    char *argv[] = {prog, (char *)servers, NULL};
    int pid = ps_test_spawn(argv, log);
    return pid > 0 ? ps_test_wait(pid, RUN_MS) : -1;
}

static int have_server(void)
{
    char bin[512];
    return access(ps_test_bin("ps_server", bin, sizeof bin), X_OK) == 0;
}

PS_TEST(readme_program_fits_w_to_one_against_a_live_server)
{
    if (!have_server())
        SKIP("bin/ps_server is not built");
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --lr 0.5 --quiet"));
    char ep[64], log[600];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    int status = run_readme(ep, log, sizeof log);
    ps_test_stop(sv.pid, 3000);
    char *out = ps_test_read_file(log, NULL);
    /* lr 0.5 from w = 0: w <- w - 0.5 (w - 1) halves the distance to 1 in
     * every step, exactly in float: 10 steps leave 2^-10 */
    int ok = status == 0 && out && strstr(out, "w[0] = 0.9990234375\n");
    CHECK_MSG(ok, "exit status %d, output: %s", status, out ? out : "(none)");
    free(out);
}

PS_TEST(readme_program_prints_why_a_server_refuses_it)
{
    if (!have_server())
        SKIP("bin/ps_server is not built");
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode sync --quiet"));
    char ep[64], log[600];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    int status = run_readme(ep, log, sizeof log);
    ps_test_stop(sv.pid, 3000);
    char *out = ps_test_read_file(log, NULL);
    int ok = status == 1 && out && strstr(out, "start: configuration mismatch between peers: ") &&
             strstr(out, "mode: server has sync, worker 0 has async");
    CHECK_MSG(ok, "exit status %d, output: %s", status, out ? out : "(none)");
    free(out);
}

PS_TEST(readme_program_prints_the_endpoint_form_when_open_fails)
{
    char log[600];
    int status = run_readme("127.0.0.1:5555", log, sizeof log);
    char *out = ps_test_read_file(log, NULL);
    int ok = status == 1 && out &&
             strstr(out, "open: invalid argument: '127.0.0.1:5555' is not an endpoint: write "
                         "tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555\n");
    CHECK_MSG(ok, "exit status %d, output: %s", status, out ? out : "(none)");
    free(out);
}
