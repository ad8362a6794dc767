/* Servers added to a running local job: the token, the new server's
 * command, and ps_servers add (grow.h). */
#include "grow.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"
#include "ps_error.h"
#include "ps_smap.h"

#define P "ps_launch"

int ps_launch_grow_setup(ps_launch_grow *g, ps_launch_opts *o)
{
    memset(g, 0, sizeof *g);
    g->fd = -1;
    g->refused = o->hostfile  ? "over a hostfile (start it there with ps_server --added, then "
                                "ps_servers add: docs/LAUNCH.md)"
                 : o->replicas ? "with --replicas (the servers refuse to move objects of "
                                 "replicated shards)"
                 : o->workers_min && o->workers_min < o->workers
                     ? "with elastic workers (--workers MIN:MAX; the servers refuse moves "
                       "there)"
                     : NULL;
    if (g->refused)
        return 0;
    const char *tmp = getenv("TMPDIR");
    snprintf(g->dir, sizeof g->dir, "%s/ps_launch.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    unsigned char rnd[32];
    int fd = -1, rc = 1;
    if (!mkdtemp(g->dir)) {
        fprintf(stderr, P ": --elastic-servers: cannot make a private dir %s: %s\n", g->dir,
                strerror(errno));
        g->dir[0] = 0;
        return 1;
    }
    snprintf(g->token, sizeof g->token, "%s/admin.token", g->dir);
    int ur = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ur >= 0 && read(ur, rnd, sizeof rnd) == (ssize_t)sizeof rnd &&
        (fd = open(g->token, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) >= 0) {
        char hex[2 * sizeof rnd + 2];
        for (size_t i = 0; i < sizeof rnd; i++)
            snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
        strcat(hex, "\n");
        rc = write(fd, hex, strlen(hex)) == (ssize_t)strlen(hex) ? 0 : 1;
    }
    if (rc)
        fprintf(stderr, P ": --elastic-servers: cannot write the admin token %s: %s\n", g->token,
                strerror(errno));
    if (ur >= 0)
        close(ur);
    if (fd >= 0)
        close(fd);
    if (!rc && (ps_strvec_push(&o->server_args, "--admin-token-file") ||
                ps_strvec_push(&o->server_args, g->token))) {
        fprintf(stderr, P ": out of memory\n");
        rc = 1;
    }
    return rc;
}

int ps_launch_grow_plan(ps_launch_grow *g, const ps_launch_plan *p, const char *bin_dir)
{
    ps_launch_server_list(p, &g->servers);
    g->next_slot = p->num_servers;
    size_t n = strlen(bin_dir) + sizeof "/ps_servers";
    g->tool = malloc(n);
    if (!g->tool || g->servers.failed)
        return PS_ENOMEM;
    snprintf(g->tool, n, "%s/ps_servers", bin_dir);
    return 0;
}

void ps_launch_grow_cmd_free(ps_launch_cmd *c)
{
    free(c->endpoint);
    free(c->device);
    ps_strvec_free(&c->env);
    ps_strvec_free(&c->argv);
    ps_strvec_free(&c->restart_argv);
    memset(c, 0, sizeof *c);
}

/* "DIR/server-0.json" -> "DIR/server-SLOT.json" onto a */
static void push_timeline(ps_strvec *a, const char *v, int slot)
{
    const char *base = strrchr(v, '/');
    base = base ? base + 1 : v;
    if (strncmp(base, "server-", 7))
        ps_strvec_push(a, v);
    else
        ps_strvec_pushf(a, "%.*sserver-%d.json", (int)(base - v), v, slot);
}

int ps_launch_grow_cmd(ps_launch_grow *g, const ps_launch_cmd *server0, ps_launch_cmd *c,
                       char *why, size_t len)
{
    memset(c, 0, sizeof *c);
    if (g->next_slot >= PS_SMAP_MAX_SLOTS) {
        snprintf(why, len, P ": this job has had %d servers, the most it may have",
                 PS_SMAP_MAX_SLOTS);
        return 1;
    }
    int ports[2];
    if (ps_launch_free_ports(server0->metrics_port ? 2 : 1, ports, why, len))
        return 1;
    c->role = PS_LAUNCH_SERVER;
    c->rank = g->next_slot;
    c->metrics_port = server0->metrics_port ? ports[1] : 0;
    c->endpoint = malloc(32);
    if (c->endpoint)
        snprintf(c->endpoint, 32, "tcp://127.0.0.1:%d", ports[0]);
    ps_strvec *a = &c->argv;
    const ps_strvec *s = &server0->argv;
    for (int k = 0; k < s->n; k++) {
        const char *f = s->v[k];
        ps_strvec_push(a, f);
        if (k + 1 >= s->n)
            break;
        if (!strcmp(f, "--bind"))
            ps_strvec_push(a, c->endpoint ? c->endpoint : "");
        else if (!strcmp(f, "--rank"))
            ps_strvec_pushf(a, "%d", c->rank);
        else if (!strcmp(f, "--metrics-port"))
            ps_strvec_pushf(a, "%d", c->metrics_port);
        else if (!strcmp(f, "--timeline"))
            push_timeline(a, s->v[k + 1], c->rank);
        else
            continue;
        k++;
    }
    ps_strvec_push(a, "--added");
    for (int k = 0; k < server0->env.n; k++)
        ps_strvec_push(&c->env, server0->env.v[k]);
    if (!c->endpoint || a->failed || c->env.failed) {
        ps_launch_grow_cmd_free(c);
        snprintf(why, len, P ": out of memory");
        return 1;
    }
    g->next_slot++;
    return 0;
}

int ps_launch_grow_start(ps_launch_grow *g, int slot, const char *endpoint, char *why,
                         size_t len)
{
    char *argv[] = {g->tool, "--servers", (char *)ps_strbuf_str(&g->servers),
                    "--admin-token-file", g->token, "add", (char *)endpoint, NULL};
    int fd[2];
    if (pipe(fd)) {
        snprintf(why, len, P ": pipe: %s", strerror(errno));
        return 1;
    }
    fcntl(fd[0], F_SETFD, FD_CLOEXEC);
    fcntl(fd[1], F_SETFD, FD_CLOEXEC);
    pid_t pid = ps_launch_spawn(argv, -1, fd[1], fd[1], NULL);
    int e = errno;
    close(fd[1]);
    if (pid < 0) {
        close(fd[0]);
        snprintf(why, len, P ": fork: %s", strerror(e));
        return 1;
    }
    fcntl(fd[0], F_SETFL, fcntl(fd[0], F_GETFL) | O_NONBLOCK);
    g->pid = pid;
    g->fd = fd[0];
    g->slot = slot;
    ps_strbuf_reset(&g->part);
    ps_strbuf_reset(&g->last);
    return 0;
}

static void grow_line(ps_launch_grow *g, const char *line, size_t n)
{
    if (!n)
        return;
    ps_strbuf_reset(&g->last);
    ps_strbuf_addn(&g->last, line, n);
    ps_strbuf b = {0};
    ps_strbuf_addf(&b, "[ps_servers] %.*s\n", (int)n, line);
    if (!b.failed && write(STDERR_FILENO, b.p, b.n) < 0) {
    }
    ps_strbuf_free(&b);
}

void ps_launch_grow_read(ps_launch_grow *g)
{
    char tmp[4096];
    for (;;) {
        if (g->fd < 0)
            return;
        ssize_t r = read(g->fd, tmp, sizeof tmp);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) { /* EOF: a last line without its newline */
            grow_line(g, g->part.p ? g->part.p : "", g->part.n);
            ps_strbuf_reset(&g->part);
            close(g->fd);
            g->fd = -1;
            return;
        }
        ps_strbuf_addn(&g->part, tmp, (size_t)r);
        char *nl;
        while (g->part.p && (nl = memchr(g->part.p, '\n', g->part.n))) {
            size_t k = (size_t)(nl - g->part.p);
            grow_line(g, g->part.p, k);
            memmove(g->part.p, nl + 1, g->part.n - k); /* with the NUL */
            g->part.n -= k + 1;
        }
    }
}

void ps_launch_grow_free(ps_launch_grow *g)
{
    if (g->fd >= 0)
        close(g->fd);
    g->fd = -1;
    if (g->token[0])
        unlink(g->token);
    if (g->dir[0])
        rmdir(g->dir);
    g->token[0] = g->dir[0] = 0;
    free(g->tool);
    g->tool = NULL;
    ps_strbuf_free(&g->servers);
    ps_strbuf_free(&g->part);
    ps_strbuf_free(&g->last);
}
