#include "proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static int g_sigpipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_sigpipe[1], &b, 1) < 0) {
    }
    errno = e;
}

int64_t ps_launch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ps_launch_catch_signals(int *read_fd)
{
    if (pipe(g_sigpipe))
        return -1;
    for (int i = 0; i < 2; i++) {
        fcntl(g_sigpipe[i], F_SETFD, FD_CLOEXEC);
        fcntl(g_sigpipe[i], F_SETFL, fcntl(g_sigpipe[i], F_GETFL) | O_NONBLOCK);
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
    signal(SIGPIPE, SIG_IGN);
    *read_fd = g_sigpipe[0];
    return 0;
}

void ps_launch_catch_signal(int sig)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, NULL);
}

int ps_launch_free_ports(int n, int *ports, char *why, size_t len)
{
    int *fds = calloc((size_t)(n ? n : 1), sizeof *fds), rc = 0, i;
    if (!fds) {
        snprintf(why, len, "ps_launch: out of memory");
        return 1;
    }
    for (i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof a;
        if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof a) ||
            getsockname(fds[i], (struct sockaddr *)&a, &al)) {
            snprintf(why, len, "ps_launch: cannot find a free port on 127.0.0.1: %s",
                     strerror(errno));
            rc = 1;
            if (fds[i] >= 0)
                close(fds[i]);
            break;
        }
        ports[i] = ntohs(a.sin_port);
    }
    while (i-- > 0)
        close(fds[i]);
    free(fds);
    return rc;
}

int ps_launch_read_signals(unsigned char *sigs, int n)
{
    ssize_t r = read(g_sigpipe[0], sigs, (size_t)n);
    return r > 0 ? (int)r : 0;
}

pid_t ps_launch_spawn(char *const *argv, int in, int out, int err, char *const *env)
{
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
            _exit(127); /* the parent is already gone */
#else
        (void)parent;
#endif
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR2};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            signal(sigs[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (in < 0)
            in = open("/dev/null", O_RDONLY);
        if (in >= 0 && in != STDIN_FILENO)
            dup2(in, STDIN_FILENO);
        if (out >= 0 && out != STDOUT_FILENO)
            dup2(out, STDOUT_FILENO);
        if (err >= 0 && err != STDERR_FILENO)
            dup2(err, STDERR_FILENO);
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
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
    errno = fork_errno;
    return pid;
}
