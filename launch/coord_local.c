#include "coord_local.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "ps_error.h"

#define P "ps_launch"

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(fd, (struct sockaddr *)&a, &al))
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int find_etcd(char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *d = path;;) {
        size_t n = strcspn(d, ":");
        snprintf(out, cap, "%.*s/etcd", (int)n, n ? d : ".");
        if (access(out, X_OK) == 0)
            return 0;
        if (!d[n])
            break;
        d += n + 1;
    }
    snprintf(out, cap, "/usr/bin/etcd");
    return access(out, X_OK) == 0 ? 0 : -1;
}

int ps_launch_etcd_plan(ps_launch_etcd *e, char *why, size_t len)
{
    memset(e, 0, sizeof *e);
    if (find_etcd(e->bin, sizeof e->bin)) {
        snprintf(why, len, P ": --replicas needs etcd: none on PATH (install etcd-server, or "
                 "give --coord URLS of one that runs)");
        return PS_ENOTFOUND;
    }
    e->client_port = free_port();
    e->peer_port = free_port();
    if (e->client_port < 0 || e->peer_port < 0 || e->client_port == e->peer_port) {
        snprintf(why, len, P ": cannot find free ports on 127.0.0.1 for etcd: %s",
                 strerror(errno));
        return PS_EIO;
    }
    snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d", e->client_port);
    e->auto_ = 1;
    return 0;
}

static int answers(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int ps_launch_etcd_start(ps_launch_etcd *e, char *why, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/ps_launch-etcd.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir)) {
        snprintf(why, len, P ": cannot make a directory for etcd (%s): %s", e->dir,
                 strerror(errno));
        e->dir[0] = 0;
        return PS_EIO;
    }
    char data[PATH_MAX + 8], log[PATH_MAX + 16], purl[64], cluster[96];
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(log, sizeof log, "%s/etcd.log", e->dir);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", e->peer_port);
    snprintf(cluster, sizeof cluster, "default=%s", purl);
    char *argv[] = {e->bin, "--data-dir", data, "--listen-client-urls", e->url,
                    "--advertise-client-urls", e->url, "--listen-peer-urls", purl,
                    "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                    "--log-level", "warn", NULL};
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(why, len, P ": cannot write %s: %s", log, strerror(errno));
        return PS_EIO;
    }
    pid_t pid = ps_launch_spawn(argv, -1, fd, fd, NULL);
    close(fd);
    if (pid < 0) {
        snprintf(why, len, P ": cannot start %s: %s", e->bin, strerror(errno));
        return PS_EIO;
    }
    e->pid = pid;
    for (int t = 0; t < 200; t++) {
        if (answers(e->client_port))
            return 0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            e->pid = 0;
            break;
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    snprintf(why, len, P ": etcd did not start (its log: %s)", log);
    return PS_EIO;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void ps_launch_etcd_stop(ps_launch_etcd *e)
{
    if (e->pid > 0) {
        kill(e->pid, SIGTERM);
        int st, done = 0;
        for (int t = 0; t < 100 && !done; t++) {
            pid_t r = waitpid(e->pid, &st, WNOHANG);
            done = r == e->pid || (r < 0 && errno == ECHILD);
            if (!done) {
                struct timespec ts = {0, 50 * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
        if (!done) {
            kill(e->pid, SIGKILL);
            waitpid(e->pid, &st, 0);
        }
        e->pid = 0;
    }
    if (e->dir[0] && !getenv("PS_LAUNCH_KEEP_ETCD"))
        nftw(e->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    e->dir[0] = 0;
}
