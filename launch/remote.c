/* The remote wrapper: one child, one poll loop over our stdin and a
 * self-pipe fed by the signal handlers. */
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
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static int g_sig[2] = {-1, -1};

static void on_signal(int sig)
{
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_sig[1], &b, 1) < 0) {
    }
    errno = e;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* Start argv with stdin a pipe we keep the write end of, in its own process
 * group; on Linux it gets SIGTERM when we die. */
static pid_t start(char **argv, int *keep)
{
    int in[2];
    if (pipe(in)) {
        fprintf(stderr, "ps_launch: pipe: %s\n", strerror(errno));
        return -1;
    }
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
#else
        (void)parent;
#endif
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            signal(sigs[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(in[0], STDIN_FILENO);
        close(in[0]);
        close(in[1]);
        if (strchr(argv[0], '/'))
            execv(argv[0], argv);
        else
            execvp(argv[0], argv);
        dprintf(STDERR_FILENO, "ps_launch: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int fork_errno = errno;
    if (pid > 0)
        setpgid(pid, pid); /* also here: no race with a signal sent right away */
    sigprocmask(SIG_SETMASK, &old, NULL);
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
    if (pipe(g_sig)) {
        fprintf(stderr, "ps_launch: pipe: %s\n", strerror(errno));
        return 127;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(g_sig[i], F_SETFD, FD_CLOEXEC);
        fcntl(g_sig[i], F_SETFL, fcntl(g_sig[i], F_GETFL) | O_NONBLOCK);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* the connection may be gone when we report */

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
        int64_t now = now_ms();
        if (kill_at && now >= kill_at) {
            signal_group(pid, SIGKILL);
            kill_at = 0;
        }
        struct pollfd pf[2] = {{.fd = g_sig[0], .events = POLLIN},
                               {.fd = in_open ? STDIN_FILENO : -1, .events = POLLIN}};
        int timeout = kill_at ? (int)(kill_at - now) : -1;
        if (poll(pf, 2, timeout) < 0 && errno != EINTR)
            break;
        if (pf[0].revents) {
            unsigned char sigs[64];
            ssize_t k;
            while ((k = read(g_sig[0], sigs, sizeof sigs)) > 0)
                for (ssize_t j = 0; j < k; j++)
                    if (sigs[j] != SIGCHLD) {
                        signal_group(pid, sigs[j] == SIGHUP ? SIGTERM : sigs[j]);
                        if (!kill_at)
                            kill_at = now_ms() + PS_REMOTE_GRACE_MS;
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
                    kill_at = now_ms() + PS_REMOTE_GRACE_MS;
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
