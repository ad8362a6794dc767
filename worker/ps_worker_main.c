/* ps_worker: flags and environment -> ps_train_config -> ps_train_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_log.h"
#include "ps_malloc.h"
#include "train.h"

static const char usage_head[] =
    "usage: ps_worker --servers tcp://HOST:PORT[,...] --rank R --num-workers W [flags]\n"
    "\n"
    "Trains a model on its shard of the data, pushing gradients to the parameter\n"
    "servers and pulling weights back from a background comm thread.  Flags take\n"
    "their value as --flag VALUE or --flag=VALUE; a flag not given is read from its\n"
    "environment variable (env below) when that is set.\n"
    "\n";

static const char usage_tail[] =
    "\n"
    "SIGINT and SIGTERM stop the worker at once, wherever it waits; in an elastic\n"
    "job (--num-workers MIN:MAX) a training worker first ends its step and leaves\n"
    "the job (a second signal, or 5 s, stops it at once).\n"
    "Exit status: 0 trained (and, on rank 0, evaluated and saved); 1 failed while\n"
    "running (a server went away, I/O error); 2 something to fix first: a bad flag,\n"
    "a setting the servers do not share (mode, worker count, server order, model,\n"
    "optimizer), unusable data, device or keys; 128+N stopped by signal N.\n";

#define P "ps_worker"

int main(int argc, char **argv)
{
    ps_train_config c;
    ps_train_config_default(&c);
    ps_malloc_keep_large(); /* every reply's buffer is not faulted in anew */
    char why[640];
    ps_settings_cmd cmd = {.prog = P, .program = PS_PROG_WORKER, .cfg = &c, .opt = &c.expect,
                           .env = 1};
    cmd.fields = ps_train_config_fields(&cmd.nfields);
    if (ps_settings_parse(&cmd, argc, argv, why, sizeof why))
        return ps_flag_error(why);
    if (cmd.help) {
        ps_settings_print_help(cmd.prog, cmd.program, cmd.help, usage_head, usage_tail);
        return 0;
    }
    /* --lr is also the rate of local SGD without servers */
    if (c.expect.given & PS_OPT_GIVEN(lr))
        c.local_lr = c.expect.lr;
    if (c.servers && !strcmp(c.servers, "none"))
        c.servers = NULL;
    else if (!c.servers) {
        return ps_flag_error(P ": no servers: give --servers tcp://HOST:PORT,... "
                             "(or PS_SERVERS), or --servers none to train alone");
    }
    if (!c.servers && c.metrics_port > 0)
        return ps_flag_error(P ": --metrics-port needs servers: the figures it serves are the "
                             "exchange's with them (--servers none trains alone)");
    const char *rank_from = cmd.from[PS_SET_rank], *size_from = cmd.from[PS_SET_num_workers];
    if (c.rank >= c.num_workers) { /* then the rank was given: the default is 0 */
        int env = rank_from && rank_from[0] != '-';
        snprintf(why, sizeof why, P ": --rank must be an integer in [0, %d], got '%d'%s%s%s",
                 c.num_workers - 1, c.rank, env ? " (from " : "", env ? rank_from : "",
                 env ? ")" : "");
        return ps_flag_error(why);
    }
    if (c.local_size > 1 && (!c.servers || c.num_workers % c.local_size != 0)) {
        snprintf(why, sizeof why, "%s: --local-aggregate %d needs servers and a --num-workers "
                 "that is a multiple of it (hosts x workers per host), got %d", P, c.local_size,
                 c.num_workers);
        return ps_flag_error(why);
    }
    if (c.mode == PS_MODE_SYNC) {
        if (c.max_staleness > 0)
            return ps_flag_error(P ": --max-staleness applies to --mode async only "
                                 "(sync is staleness 0)");
        c.max_staleness = 0;
    }
    ps_log_init(P, c.rank);
    ps_log_set_level(cmd.log_level);
    if (!rank_from && !size_from && c.servers)
        ps_info("no --rank/--num-workers (nor PS_RANK/PS_NUM_WORKERS, Slurm or MPI "
                "variables): training as worker 0 of 1");
    int rc = ps_train_run(&c);
    if (rc == PS_ECLOSED && ps_train_stop_signal())
        return 128 + ps_train_stop_signal();
    return ps_exit_status(rc);
}
