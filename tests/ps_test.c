#include "ps_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 256
#define MAX_CHILDREN 256

static struct { const char *name; ps_test_fn fn; } g_tests[MAX_TESTS];
static int g_ntests;
static int g_failed, g_skipped;
static char g_skip_why[512];
static const char *g_current;
static int g_children[MAX_CHILDREN];
static int g_nchildren;
static char g_tmpdir[256];

void ps_test_register(const char *name, ps_test_fn fn)
{
    if (g_ntests < MAX_TESTS) {
        g_tests[g_ntests].name = name;
        g_tests[g_ntests].fn = fn;
        g_ntests++;
    }
}

void ps_test_fail(const char *file, int line, const char *fmt, ...)
{
    if (g_failed)
        return;
    g_failed = 1;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FAIL %s: %s:%d: %s\n", g_current, file, line, msg);
    fflush(stdout);
}

void ps_test_skip(const char *fmt, ...)
{
    g_skipped = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_skip_why, sizeof g_skip_why, fmt, ap);
    va_end(ap);
}

int ps_test_stopped(void) { return g_failed || g_skipped; }

int ps_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

const char *ps_test_bin(const char *prog, char *buf, size_t len)
{
    const char *dir = getenv("PS_BIN_DIR");
    snprintf(buf, len, "%s/%s", dir ? dir : "bin", prog);
    return buf;
}

int ps_test_spawn(char *const argv[], const char *log_path)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (log_path) {
            int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execv(argv[0], argv);
        fprintf(stderr, "ps_test: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (g_nchildren < MAX_CHILDREN)
        g_children[g_nchildren++] = pid;
    return pid;
}

int ps_test_spawn_args(const char *prog, const char *const *args, const char *log_path)
{
    char bin[256];
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)ps_test_bin(prog, bin, sizeof bin);
    for (; args && *args && n < 63; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    return ps_test_spawn(argv, log_path);
}

int ps_test_spawn_words(const char *prog, const char *words, const char *log_path)
{
    char *copy = strdup(words), *save = NULL;
    if (!copy)
        return -1;
    const char *args[64];
    int n = 0;
    for (char *w = strtok_r(copy, " ", &save); w && n < 63; w = strtok_r(NULL, " ", &save))
        args[n++] = w;
    args[n] = NULL;
    int pid = ps_test_spawn_args(prog, args, log_path);
    free(copy);
    return pid;
}

int ps_test_etcd_start(ps_test_etcd *e, const char *log_path)
{
    memset(e, 0, sizeof *e);
    e->pid = -1;
    if (access("/usr/bin/etcd", X_OK) != 0)
        return -1;
    static int n;
    int cp = ps_test_free_port(), pp = ps_test_free_port();
    char dir[512], curl[64], purl[64], cluster[96];
    snprintf(dir, sizeof dir, "%s/etcd-%d", ps_test_tmpdir(), n++);
    snprintf(curl, sizeof curl, "http://127.0.0.1:%d", cp);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", pp);
    snprintf(cluster, sizeof cluster, "default=%s", purl);
    char *argv[] = {"/usr/bin/etcd", "--data-dir", dir, "--listen-client-urls", curl,
                    "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                    "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                    "--log-level", "warn", NULL};
    int pid = ps_test_spawn(argv, log_path);
    if (pid < 0)
        return -1;
    /* ready once its client port accepts a connection */
    for (int t = 0; t < 200; t++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cp)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0)
            close(fd);
        if (ok) {
            e->pid = pid;
            snprintf(e->url, sizeof e->url, "%s", curl);
            return 0;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        ps_test_sleep_ms(50);
    }
    ps_test_stop(pid, 2000);
    return -1;
}

void ps_test_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

char *ps_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    /* read until EOF rather than trust the size: /proc files say 0 */
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *more = realloc(buf, 2 * cap + 1);
            if (!more)
                free(buf);
            buf = more;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

int ps_test_file_has(const char *path, const char *needle)
{
    char *text = ps_test_read_file(path, NULL);
    int found = text && strstr(text, needle);
    free(text);
    return found;
}

int ps_test_wait_for_text(const char *path, const char *needle, int timeout_ms, int pid)
{
    for (int t = 0; t < timeout_ms; t += 10) {
        if (ps_test_file_has(path, needle))
            return 0;
        if (pid > 0 && kill(pid, 0) != 0)
            return -1;
        ps_test_sleep_ms(10);
    }
    return -1;
}

long ps_test_status_kb(int pid, const char *field)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    char *text = ps_test_read_file(path, NULL);
    if (!text)
        return -1;
    size_t flen = strlen(field);
    long kb = -1;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (strncmp(line, field, flen) == 0 && line[flen] == ':')
            kb = strtol(line + flen + 1, NULL, 10);
    free(text);
    return kb;
}

static void forget_child(int pid)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] == pid)
            g_children[i] = 0;
}

static int decode_status(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

int ps_test_wait(int pid, int timeout_ms)
{
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int waited = 0;; waited += 10) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            forget_child(pid);
            return decode_status(st);
        }
        if (r < 0)
            return -1;
        if (waited >= timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            forget_child(pid);
            return -1;
        }
        nanosleep(&ts, NULL);
    }
}

int ps_test_stop(int pid, int timeout_ms)
{
    kill(pid, SIGTERM);
    int rc = ps_test_wait(pid, timeout_ms);
    return rc;
}

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    int rc = system(cmd);
    (void)rc;
}

const char *ps_test_tmpdir(void)
{
    if (!g_tmpdir[0]) {
        snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/ps_test.XXXXXX");
        if (!mkdtemp(g_tmpdir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return g_tmpdir;
}

static void cleanup(void)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0) {
            kill(g_children[i], SIGKILL);
            waitpid(g_children[i], NULL, 0);
        }
    if (g_tmpdir[0] && !getenv("PS_TEST_KEEP"))
        rm_rf(g_tmpdir);
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    atexit(cleanup);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);
    int nfail = 0;
    for (int i = 0; i < g_ntests; i++) {
        if (argc > 1) {
            int want = 0;
            for (int j = 1; j < argc; j++)
                if (strcmp(argv[j], g_tests[i].name) == 0)
                    want = 1;
            if (!want)
                continue;
        }
        g_current = g_tests[i].name;
        g_failed = g_skipped = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        g_tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (g_failed)
            nfail++;
        else if (g_skipped)
            printf("SKIP %s: %s\n", g_current, g_skip_why);
        else
            printf("PASS %s (%.2fs)\n", g_current, s);
        fflush(stdout);
        /* reap children a failed test left behind */
        for (int k = 0; k < g_nchildren; k++)
            if (g_children[k] > 0) {
                kill(g_children[k], SIGKILL);
                waitpid(g_children[k], NULL, 0);
                g_children[k] = 0;
            }
        g_nchildren = 0;
    }
    return nfail ? 1 : 0;
}
