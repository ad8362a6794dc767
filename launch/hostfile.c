/* ps_launch --hostfile: reading the file (launch/plan.h).  Lines
 * "HOST [servers=N] [workers=N] [gpus=N]"; every error names the file and
 * the line. */
#include "plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"

#define P "ps_launch"

static int host_name_ok(const char *s)
{
    if (!*s || *s == '-' || *s == '@')
        return 0;
    for (; *s; s++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-@", *s))
            return 0;
    return 1;
}

/* One line of the hostfile (changed in place).  0, or an error with why. */
static int hostfile_line(const char *name, int lineno, char *line, ps_launch_hostfile *h,
                         char *why, size_t len)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save);
    if (!tok)
        return 0;
    if (!host_name_ok(tok)) {
        snprintf(why, len, P ": %s:%d: bad host name '%s'", name, lineno, tok);
        return PS_EINVAL;
    }
    ps_launch_host *hosts = realloc(h->hosts, (size_t)(h->n + 1) * sizeof *h->hosts);
    if (!hosts)
        return PS_ENOMEM;
    h->hosts = hosts;
    ps_launch_host *hh = &h->hosts[h->n];
    hh->name = strdup(tok);
    if (!hh->name)
        return PS_ENOMEM;
    h->n++;
    hh->servers = hh->workers = 0;
    hh->gpus = -1;
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
        char *eq = strchr(tok, '=');
        int *dst = NULL;
        long long hi = 0;
        if (eq) {
            *eq = 0;
            if (!strcmp(tok, "servers"))
                dst = &hh->servers, hi = PS_LAUNCH_MAX_SERVERS;
            else if (!strcmp(tok, "workers"))
                dst = &hh->workers, hi = PS_LAUNCH_MAX_WORKERS;
            else if (!strcmp(tok, "gpus"))
                dst = &hh->gpus, hi = PS_LAUNCH_MAX_GPU_ID + 1;
        }
        if (!dst) {
            snprintf(why, len,
                     P ": %s:%d: expected servers=N, workers=M or gpus=G after the host, "
                       "got '%s'",
                     name, lineno, tok);
            return PS_EINVAL;
        }
        char flag[32], tmp[256];
        long long v;
        snprintf(flag, sizeof flag, "%s=", tok);
        if (ps_parse_int(name, flag, eq + 1, 0, hi, &v, tmp, sizeof tmp)) {
            snprintf(why, len, P ": %s (line %d)", tmp, lineno);
            return PS_EINVAL;
        }
        *dst = (int)v;
    }
    return 0;
}

static int hostfile_done(const char *name, const ps_launch_hostfile *h, char *why, size_t len)
{
    if (h->n > 0)
        return 0;
    snprintf(why, len, P ": --hostfile '%s' lists no hosts", name);
    return PS_EINVAL;
}

int ps_launch_hostfile_parse(const char *name, const char *text, ps_launch_hostfile *h,
                             char *why, size_t len)
{
    memset(h, 0, sizeof *h);
    int lineno = 0, rc = 0;
    while (!rc && *text) {
        size_t n = strcspn(text, "\n");
        char *line = strndup(text, n);
        if (!line)
            return PS_ENOMEM;
        rc = hostfile_line(name, ++lineno, line, h, why, len);
        free(line);
        text += n + (text[n] == '\n');
    }
    return rc ? rc : hostfile_done(name, h, why, len);
}

int ps_launch_hostfile_read(const char *path, ps_launch_hostfile *h, char *why, size_t len)
{
    memset(h, 0, sizeof *h);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(why, len, P ": cannot read --hostfile '%s': %s", path, strerror(errno));
        return PS_EIO;
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    while (!rc && getline(&line, &cap, f) >= 0)
        rc = hostfile_line(path, ++lineno, line, h, why, len);
    if (!rc && ferror(f)) {
        snprintf(why, len, P ": error reading --hostfile '%s'", path);
        rc = PS_EIO;
    }
    free(line);
    fclose(f);
    return rc ? rc : hostfile_done(path, h, why, len);
}

void ps_launch_hostfile_free(ps_launch_hostfile *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->hosts[i].name);
    free(h->hosts);
    memset(h, 0, sizeof *h);
}

