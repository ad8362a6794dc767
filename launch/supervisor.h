/* The supervisor of ps_launch: starts the processes of a plan, prints every
 * line they write prefixed with role and rank, forwards signals, stops them
 * all when one fails, and reaps them.  The plan (plan.h) decides what runs;
 * this module only runs it. */
#ifndef PS_LAUNCH_SUPERVISOR_H
#define PS_LAUNCH_SUPERVISOR_H

#include "grow.h"
#include "launch_metrics.h"
#include "plan.h"

/* Start every process of the plan, servers first, each in its own process
 * group with stdin from /dev/null and stdout/stderr on pipes (on Linux it
 * gets SIGTERM when ps_launch dies), and supervise them until all have ended:
 *  - every line a child writes goes to the same stream of ps_launch as
 *    "[server 0] line", one write per line, so lines never mix;
 *  - when every worker has exited 0, the servers get SIGTERM;
 *  - when a process fails (a worker exits non-zero or is killed, a server
 *    exits before the workers are done), the others get SIGTERM;
 *  - SIGINT/SIGTERM (SIGHUP as SIGTERM) to ps_launch go to every child; a
 *    second one kills what is left;
 *  - when stopping everything, the workers get the signal first and the
 *    servers once no worker is left (a worker ends its step only while its
 *    servers answer);
 *  - SIGKILL follows the signal after 5 s (for the servers, 5 s after theirs);
 *  - over ssh (cmd->host) a signal is a line to the remote wrapper on ssh's
 *    stdin (remote.h), which reports how the program ended; that, not ssh's
 *    status, is what ps_launch says and counts.
 * ps_launch's own lines ("ps_launch: started ...", the closing summary) go
 * to stderr.  Installs handlers for SIGCHLD, SIGINT, SIGTERM, SIGHUP and
 * ignores SIGPIPE for the rest of the process: call it once, from main.
 * Returns ps_launch's exit status: 0 when every worker exited 0, 1 when a
 * process failed or could not be started, 128 + the signal after one.
 * counts (NULL: none) gets every start and end, for ps_launch's /metrics.
 * grow (--elastic-servers; NULL: off): SIGUSR2 starts one more server on
 * this host (server 0's command, the next slot, --added) and runs
 * `ps_servers add` for it (grow.h), one at a time; the server is then
 * supervised like the others, or stopped when the add fails (the job goes
 * on).  Without grow, SIGUSR2 is not caught. */
int ps_launch_supervise(const ps_launch_plan *plan, ps_launch_counts *counts,
                        ps_launch_grow *grow);

#endif
