/* The remote wrapper: one child (proc.h starts it), one poll loop over our
 * stdin and the self-pipe fed by the signal handlers. */
#include "remote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

/* "INT" -> SIGINT ...; 0 for anything else. */
static int sig_of(const char *name)
{
    static const struct {
        const char *name;
        int sig;
    } t[] = {{"INT", SIGINT}, {"TERM", SIGTERM}, {"HUP", SIGHUP}, {"KILL", SIGKILL}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(name, t[i].name))
            return t[i].sig;
    return 0;
}

int ps_launch_remote_status(const char *line, int *status)
{
    size_t n = strlen(PS_REMOTE_MARK);
    if (strncmp(line, PS_REMOTE_MARK, n))
        return 0;
    const char *s = line + n;
    char *end;
    int is_exit = !strncmp(s, "exit ", 5), is_sig = !strncmp(s, "signal ", 7);
    if (!is_exit && !is_sig)
        return 0;
    const char *num = s + (is_exit ? 5 : 7);
    if (*num < '0' || *num > '9')
        return 0;
    long v = strtol(num, &end, 10);
    if (*end || v > (is_exit ? 255 : 127))
        return 0;
    *status = is_exit ? (int)(v << 8) : (int)v;
    return 1;
}

/* Start argv with stdin a pipe we keep the write end of (*keep), in its own
 * process group; on Linux it gets SIGTERM when we die. */
static pid_t start(char **argv, int *keep)
{
    int in[2];
    if (pipe(in)) {
        fprintf(stderr, "ps_launch: pipe: %s\n", strerror(errno));
        return -1;
    }
    fcntl(in[0], F_SETFD, FD_CLOEXEC);
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
    pid_t pid = ps_launch_spawn(argv, in[0], -1, -1, NULL);
    int fork_errno = errno;
    close(in[0]);
    if (pid < 0) {
        close(in[1]);
        fprintf(stderr, "ps_launch: fork: %s\n", strerror(fork_errno));
        return -1;
    }
    *keep = in[1];
    return pid;
}

static void signal_group(pid_t pid, int sig)
{
    if (kill(-pid, sig) && errno == ESRCH)
        kill(pid, sig);
}

int ps_launch_remote_child(int argc, char **argv)
{
    if (argc < 1) {
        fprintf(stderr, "ps_launch: " PS_REMOTE_FLAG " needs a program to run\n");
        return 2;
    }
    int sigfd; /* SIGPIPE is ignored too: the connection may be gone when we report */
    if (ps_launch_catch_signals(&sigfd)) {
        fprintf(stderr, "ps_launch: pipe: %s\n", strerror(errno));
        return 127;
    }

    int child_in = -1;
    pid_t pid = start(argv, &child_in);
    if (pid < 0)
        return 127;

    int in_open = 1, status = 0;
    int64_t kill_at = 0; /* SIGKILL the group then; 0: not scheduled */
    char line[64];
    size_t ln = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            status = 127 << 8;
            break;
        }
        int64_t now = ps_launch_now_ms();
        if (kill_at && now >= kill_at) {
            signal_group(pid, SIGKILL);
            kill_at = 0;
        }
        struct pollfd pf[2] = {{.fd = sigfd, .events = POLLIN},
                               {.fd = in_open ? STDIN_FILENO : -1, .events = POLLIN}};
        int timeout = kill_at ? (int)(kill_at - now) : -1;
        if (poll(pf, 2, timeout) < 0 && errno != EINTR)
            break;
        if (pf[0].revents) {
            unsigned char sigs[64];
            int k;
            while ((k = ps_launch_read_signals(sigs, sizeof sigs)) > 0)
                for (int j = 0; j < k; j++)
                    if (sigs[j] != SIGCHLD) {
                        signal_group(pid, sigs[j] == SIGHUP ? SIGTERM : sigs[j]);
                        if (!kill_at)
                            kill_at = ps_launch_now_ms() + PS_REMOTE_GRACE_MS;
                    }
        }
        if (in_open && pf[1].revents) {
            char buf[256];
            ssize_t k = read(STDIN_FILENO, buf, sizeof buf);
            if (k < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (k <= 0) {
                /* the launcher or the connection is gone: stop the program */
                in_open = 0;
                signal_group(pid, SIGTERM);
                if (!kill_at)
                    kill_at = ps_launch_now_ms() + PS_REMOTE_GRACE_MS;
                continue;
            }
            for (ssize_t j = 0; j < k; j++) {
                if (buf[j] != '\n') {
                    if (ln + 1 < sizeof line)
                        line[ln++] = buf[j];
                    continue;
                }
                line[ln] = 0;
                ln = 0;
                int sig = sig_of(line);
                if (sig)
                    signal_group(pid, sig);
            }
        }
    }
    /* whatever the program started and left behind goes with it */
    kill(-pid, SIGKILL);
    if (child_in >= 0)
        close(child_in);
    if (WIFSIGNALED(status)) {
        fprintf(stderr, PS_REMOTE_MARK "signal %d\n", WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 127;
    fprintf(stderr, PS_REMOTE_MARK "exit %d\n", code);
    return code;
}
