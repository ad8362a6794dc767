/* Servers added to a running local job (--elastic-servers): the admin token
 * every server gets, and, for each SIGUSR2, the command of the new server
 * and the `ps_servers add` that moves its share to it.  The supervisor
 * (supervisor.c) runs both as its children; this module only makes them. */
#ifndef PS_LAUNCH_GROW_H
#define PS_LAUNCH_GROW_H

#include <limits.h>
#include <sys/types.h>

#include "plan.h"
#include "ps_strbuf.h"

typedef struct ps_launch_grow {
    char dir[PATH_MAX - 32]; /* private temp dir (mode 0700); "" none */
    char token[PATH_MAX];   /* its admin.token (mode 0600); "" none */
    const char *refused;    /* why SIGUSR2 cannot add a server to this job; NULL: it can */
    char *tool;             /* BIN/ps_servers */
    ps_strbuf servers;      /* the workers' server list */
    int next_slot;          /* the next added server's slot: servers ever started */
    /* the add under way: ps_servers' pid (0: none), its output pipe, the
     * slot it adds, the last line it wrote */
    pid_t pid;
    int fd;
    int slot;
    ps_strbuf part, last;
} ps_launch_grow;

/* Before the plan: why a job of these flags cannot add servers (NULL: it
 * can), and for one that can, the private dir and its random token file,
 * whose path goes to every server (--server-arg --admin-token-file PATH).
 * 0, or 1 after a message on stderr. */
int ps_launch_grow_setup(ps_launch_grow *g, ps_launch_opts *o);

/* After the plan: the server list, the first added slot, ps_servers' path.
 * 0 or PS_ENOMEM. */
int ps_launch_grow_plan(ps_launch_grow *g, const ps_launch_plan *p, const char *bin_dir);

/* The command of the next added server into *c (zeroed, freed with
 * ps_launch_grow_cmd_free): server 0's argv with --bind a free port on
 * 127.0.0.1, --rank and its timeline the slot, --metrics-port a free port
 * when server 0 has one, and --added.  0, or 1 with why. */
int ps_launch_grow_cmd(ps_launch_grow *g, const ps_launch_cmd *server0, ps_launch_cmd *c,
                       char *why, size_t len);
void ps_launch_grow_cmd_free(ps_launch_cmd *c);

/* Start `ps_servers --servers LIST --admin-token-file TOKEN add ENDPOINT`
 * for slot, its stdout and stderr on g->fd.  0, or 1 with why. */
int ps_launch_grow_start(ps_launch_grow *g, int slot, const char *endpoint, char *why,
                         size_t len);

/* Read what ps_servers wrote: each line to stderr as "[ps_servers] line",
 * the last one kept in g->last; at EOF the pipe is closed (g->fd -1). */
void ps_launch_grow_read(ps_launch_grow *g);

/* Remove the token and its dir, free the rest. */
void ps_launch_grow_free(ps_launch_grow *g);

#endif
