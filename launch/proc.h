/* Process plumbing shared by the supervisor (supervisor.c) and the remote
 * wrapper (remote.c): a clock, signals delivered through a self-pipe, and
 * starting a child in a process group of its own. */
#ifndef PS_LAUNCH_PROC_H
#define PS_LAUNCH_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Milliseconds on the monotonic clock. */
int64_t ps_launch_now_ms(void);

/* Handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP that write the signal's
 * number as one byte to a non-blocking pipe, whose read end goes to
 * *read_fd (poll it, then ps_launch_read_signals); SIGPIPE is ignored.  For
 * the rest of the process: call it once.  0, or -1 with errno. */
int ps_launch_catch_signals(int *read_fd);

/* Catch one more signal (SIGUSR2 under --elastic-servers) the same way,
 * after ps_launch_catch_signals. */
void ps_launch_catch_signal(int sig);

/* n free TCP ports on 127.0.0.1 into ports (each bound to port 0 and read
 * back, all held until every one is read, so they differ).  0, or 1 with
 * why. */
int ps_launch_free_ports(int n, int *ports, char *why, size_t len);

/* Read the signals caught since the last call into sigs (at most n); the
 * count, 0 when there are none. */
int ps_launch_read_signals(unsigned char *sigs, int n);

/* Fork and exec argv (execvp when argv[0] has no '/') with stdin, stdout and
 * stderr from in, out and err (-1 for in: /dev/null; -1 for out or err:
 * ours), the entries of env (NULL-terminated, or NULL) added to the
 * environment, in a process group of its own (so a signal to the group
 * reaches whatever it forks and the terminal's Ctrl-C does not), with the
 * signals we catch back at their defaults and, on Linux, SIGTERM when its
 * parent dies.  When exec fails the child says "ps_launch: cannot run ..."
 * on its stderr and exits 127.  The pid, or -1 with errno. */
pid_t ps_launch_spawn(char *const *argv, int in, int out, int err, char *const *env);

#endif
