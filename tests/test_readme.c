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

/* Run readme_client with `servers`: its exit status (-1: it did not end in
 * RUN_MS, or could not start) and, in *out (the caller frees it; NULL when
 * unreadable), what it printed on stdout and stderr. */
static int run_readme(const char *servers, char **out)
{
    static int count;
    *out = NULL;
    char exe[PATH_MAX], prog[PATH_MAX + 32], log[600];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(prog, sizeof prog, "%s/readme_client", exe);
    snprintf(log, sizeof log, "%s/readme%d.log", ps_test_tmpdir(), count++);
    char *argv[] = {prog, (char *)servers, NULL};
    int pid = ps_test_spawn(argv, log);
    int status = pid > 0 ? ps_test_wait(pid, RUN_MS) : -1;
    *out = ps_test_read_file(log, NULL);
    return status;
}

/* The same against a bin/ps_server started with `words` (and --bind);
 * -2 when the server cannot be started. */
static int run_readme_with_server(const char *words, char **out)
{
    ps_test_server sv;
    *out = NULL;
    if (ps_test_server_start(&sv, 1, words))
        return -2;
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    int status = run_readme(ep, out);
    ps_test_stop(sv.pid, 3000);
    return status;
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
    char *out;
    int status = run_readme_with_server("--num-workers 1 --mode async --lr 0.5 --quiet", &out);
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
    char *out;
    int status = run_readme_with_server("--num-workers 1 --mode sync --quiet", &out);
    int ok = status == 1 && out && strstr(out, "start: configuration mismatch between peers: ") &&
             strstr(out, "mode: server has sync, worker 0 has async");
    CHECK_MSG(ok, "exit status %d, output: %s", status, out ? out : "(none)");
    free(out);
}

PS_TEST(readme_program_prints_the_endpoint_form_when_open_fails)
{
    char *out;
    int status = run_readme("127.0.0.1:5555", &out);
    int ok = status == 1 && out &&
             strstr(out, "open: invalid argument: '127.0.0.1:5555' is not an endpoint: write "
                         "tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555\n");
    CHECK_MSG(ok, "exit status %d, output: %s", status, out ? out : "(none)");
    free(out);
}
