#include "ps_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char g_role[32] = "ps";
static int g_rank = -1;
static int g_level = PS_LOG_INFO;

void ps_log_init(const char *role, int rank)
{
    snprintf(g_role, sizeof g_role, "%s", role ? role : "ps");
    g_rank = rank;
}

void ps_log_set_level(int level) { g_level = level; }
int ps_log_level(void) { return g_level; }

void ps_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > g_level)
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n;
    if (g_rank >= 0)
        n = snprintf(line, sizeof line, "%s[%d] %s %02d:%02d:%02d.%03ld: ", g_role, g_rank,
                     names[level], tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    else
        n = snprintf(line, sizeof line, "%s %s %02d:%02d:%02d.%03ld: ", g_role, names[level],
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* one write per line: lines from threads and processes never interleave */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
