/* The plan of ps_launch: who runs where with which argv and environment.
 *
 * Pure: it starts nothing, opens no socket, sends no signal, and reads no
 * file but the hostfile.  What it needs from this host (free ports, the GPUs
 * found, the directory of the programs) comes in as arguments, so `--dry-run`
 * prints exactly what would run and tests/test_launch_plan.c builds plans
 * from argv arrays.
 *
 * Errors: functions return 0 or a PS_E* code (ps_error.h) with a one-line
 * "ps_launch: ..." message in `why`; PS_EINVAL means bad flags (ps_launch
 * then exits 2 before starting anything).
 *
 * Ownership: every struct here owns what its *_free releases; pointers noted
 * as "into argv" or "into the hostfile" are borrowed and must outlive it. */
#ifndef PS_LAUNCH_PLAN_H
#define PS_LAUNCH_PLAN_H

#include <stddef.h>

#include "ps_limits.h"
#include "ps_settings.h"
#include "ps_strbuf.h"

/* --gpus ids are 0..PS_LAUNCH_MAX_GPU_ID; a hostfile's gpus= at most one more */
#define PS_LAUNCH_MAX_GPU_ID 1023
_Static_assert(PS_LAUNCH_MAX_SERVERS <= PS_MAX_SERVERS, "more servers than ps_server accepts");
_Static_assert(PS_LAUNCH_MAX_WORKERS <= PS_MAX_WORKERS, "more workers than ps_worker accepts");

enum { PS_LAUNCH_SERVER = 0, PS_LAUNCH_WORKER = 1 };

/* "server" or "worker". */
const char *ps_launch_role_name(int role);

/* ------------------------------------------------------------ flags */

/* Its own flags are the LAUNCH rows of the settings table
 * (common/ps_settings.h), each in the field the row names. */
typedef struct ps_launch_opts {
    int servers, workers;     /* 0: not given (then the hostfile decides) */
    int workers_min;          /* --workers MIN:MAX: MIN (an elastic job when < MAX) */
    int restart_workers;      /* elastic: new workers for lost ones, at most */
    int mode;                 /* PS_MODE_SYNC (default) or PS_MODE_ASYNC */
    const char *gpus;         /* "auto" (default), "none" or a list as given */
    ps_strvec gpu_ids;        /* --gpus LIST: its ids, in order */
    int server_threads;       /* 1..PS_SERVER_MAX_THREADS (default 1) */
    const char *timeline_dir; /* NULL: no timelines */
    const char *bin_dir;      /* NULL: found by ps_launch_bin_dir */
    const char *hostfile;     /* NULL: run on this host */
    const char *metrics_port; /* "auto" (default), "off" or a port: ps_launch_metrics_ports */
    const char *job_file;     /* NULL: none */
    const char *metrics_targets; /* NULL: none */
    int base_port;            /* hostfile: server i listens on base_port + i */
    ps_strvec ssh_opts;       /* --ssh-opt values split into words, in order */
    int dry_run;
    int elastic_servers;      /* SIGUSR2 adds a server (grow.h) */
    ps_strvec server_args;    /* --server-arg values, in order */
    ps_strvec shared;         /* shared flags given to ps_launch itself: flag, value pairs
                               * (one pair per flag; a later one replaces its value) */
    char **wflags;            /* the worker flags after "--" (into argv) */
    int nwflags;
    char **exec;              /* --exec PROGRAM ARGS...: the worker program (into argv);
                               * NULL: ps_worker */
    int nexec;
    int help;                 /* --help or -h (1), --version (2), --help-markdown (3) */
    /* replicas: R backups of each server's shard, etcd at coord, the job's name
     * there (NULL: one ps_launch makes up), the failure timeout */
    int replicas;
    const char *coord, *job;
    int failure_timeout_ms;
    int restart_servers;      /* -1: the default (10 with replicas, else 0) */
} ps_launch_opts;

/* Parse ps_launch's command line (argv[0] is the program) and check every
 * value before anything starts: ranges (the settings table), the worker
 * flags ps_launch sets itself, and the values of the shared flags (the
 * settings servers and workers must agree on: ps_settings_shared_flag),
 * given to ps_launch itself or among the worker flags.  `--exec PROGRAM
 * ARGS...` ends ps_launch's flags: the rest is the worker program's command
 * line.  When an argument is --help, -h, --version or --help-markdown,
 * parsing stops there with 0 and o->help set (main prints).  0, PS_EINVAL
 * with the message in why, or PS_ENOMEM.  o keeps pointers into argv; free
 * it with ps_launch_opts_free (also after an error). */
int ps_launch_parse(int argc, char **argv, ps_launch_opts *o, char *why, size_t len);
void ps_launch_opts_free(ps_launch_opts *o);

/* "sync" or "async" */
const char *ps_launch_mode_name(int mode);

/* ------------------------------------------------------------ hostfile */

typedef struct ps_launch_host {
    char *name;               /* as written: "host" or "user@host" */
    int servers, workers;
    int gpus;                 /* gpus=G; -1 when not given */
} ps_launch_host;

typedef struct ps_launch_hostfile {
    ps_launch_host *hosts;
    int n;
} ps_launch_hostfile;

/* Lines "host [servers=N] [workers=M] [gpus=G]"; '#' starts a comment.
 * _parse reads text (name is the file's name in messages), _read the file
 * at path.  0, PS_EINVAL (a bad line, no host) or PS_EIO (cannot read), with
 * why; PS_ENOMEM.  Free h with ps_launch_hostfile_free (also after an
 * error). */
int ps_launch_hostfile_parse(const char *name, const char *text, ps_launch_hostfile *h,
                             char *why, size_t len);
int ps_launch_hostfile_read(const char *path, ps_launch_hostfile *h, char *why, size_t len);
void ps_launch_hostfile_free(ps_launch_hostfile *h);

/* ------------------------------------------------------------ this host */

/* The GPUs --gpus auto uses on this host: the entries of
 * cuda_visible_devices when it is not NULL (a scheduler already chose them;
 * "-1" or "NoDevFiles" hide every GPU), else ids 0..count-1 (count: the GPUs
 * main found).  Appends to ids; 0 or PS_ENOMEM. */
int ps_launch_gpus_auto(const char *cuda_visible_devices, int count, ps_strvec *ids);

/* Where ps_server and ps_worker are: --bin-dir when given; else, with a
 * hostfile, exe_dir (the directory of ps_launch) relative to cwd when it is
 * below it ("." when it is cwd), so remote commands read
 * `cd DIR && exec bin/ps_server ...`; else exe_dir.  The caller frees it;
 * NULL when out of memory. */
char *ps_launch_bin_dir(const ps_launch_opts *o, const char *exe_dir, const char *cwd);

/* ------------------------------------------------------------ the plan */

/* One process to start. */
typedef struct ps_launch_cmd {
    int role, rank;
    int member;               /* servers with --replicas: which member of group `rank` */
    const char *host;         /* hostfile host name (into the hostfile); NULL: this host */
    char *endpoint;           /* servers: what workers connect to */
    char *device;             /* workers: "cpu" or "cuda:0" */
    ps_strvec env;            /* "NAME=value" entries to add to the environment */
    ps_strvec argv;           /* argv[0]: program path, or "ssh" */
    ps_strvec restart_argv;   /* servers: what a new one for it runs (--restart-servers; with
                                 --replicas 0 argv and --restore); empty: none */
    int metrics_port;         /* it serves /metrics here (--metrics-port); 0: not */
} ps_launch_cmd;

typedef struct ps_launch_plan {
    ps_launch_cmd *cmds;      /* servers (member 0 of each group in rank order, then member
                                 1 of each, ...), then workers */
    int n, num_servers, num_workers;
    int replicas;             /* --replicas R: server_procs = num_servers x (R + 1) */
    int server_procs;
    int restarts;             /* servers that may be started again in the job */
    int num_workers_min;      /* an elastic job (--workers MIN:MAX): MIN; else num_workers
                                 (0: the same) */
    int worker_restarts;      /* elastic: workers that may be started again in the job */
    int mode;                 /* o->mode */
    int exec;                 /* the workers run --exec's program, not ps_worker */
    int local_aggregate;      /* ps_worker --local-aggregate: workers per host that sum
                                 their gradients there (the servers count hosts); 1: off */
} ps_launch_plan;

/* What the plan takes from where it runs. */
typedef struct ps_launch_site {
    const ps_launch_hostfile *hostfile; /* NULL: everything on this host */
    const int *ports;         /* this host: server i binds 127.0.0.1:ports[i] */
    const ps_strvec *gpus;    /* this host, --gpus auto: ps_launch_gpus_auto's ids */
    const char *bin_dir;      /* ps_launch_bin_dir */
    const char *remote_dir;   /* hostfile: the directory remote commands cd to */
    const char *ssh;          /* hostfile: the ssh command and its options, split at
                               * spaces ($PS_SSH); NULL or "": ssh */
    const int *metrics_ports; /* ps_launch_metrics_ports' ports: [0] ps_launch's own, [1 + i]
                               * command i's (servers, then workers); NULL: no metrics */
} ps_launch_site;

/* The ports of --metrics-port (ps_launch's own first, then server i's at
 * 1 + i, then worker j's at 1 + S + j; S servers, W workers) into ports
 * (n = 1 + S + W of them): P, P+1, ... for a port P; for auto, with a
 * hostfile, the same from 29400, and on this host the `free` ports the
 * caller found (NULL: it has none yet: then *need_free is set and nothing
 * is written).  "off": *off set, nothing written.  0, or PS_EINVAL (not
 * auto, off or a port; the ports run past 65535) with why. */
#define PS_LAUNCH_METRICS_BASE 29400
int ps_launch_metrics_ports(const ps_launch_opts *o, int S, int W, const int *free_ports,
                            int *ports, int *off, int *need_free, char *why, size_t len);

/* The plan's sizes as ps_launch_plan_build finds them (flags, hostfile):
 * S servers (shard groups) and W workers.  0 or PS_EINVAL with why.  The
 * processes: S x (1 + replicas) servers and the W workers. */
int ps_launch_plan_sizes(const ps_launch_opts *o, const ps_launch_hostfile *hf, int *S, int *W,
                         char *why, size_t len);

/* Build the plan.  This host: server i binds tcp://127.0.0.1:ports[i];
 * workers take the GPUs (site->gpus under auto, else the --gpus list)
 * round-robin, each seeing only its own as cuda:0.  Hostfile: ranks follow
 * the file; server i binds port base_port+i on every interface of its host;
 * under auto a host's workers use its gpus=; every command is
 * `ssh [site->ssh's words, --ssh-opt words] -o BatchMode=yes HOST 'cd DIR &&
 * exec BIN/ps_launch --remote-child ...'` (remote.h), and servers there get
 * --exit-on-stdin-eof.  Worker flags go to every
 * worker with {rank} replaced; the output files (--log-csv, --timeline,
 * --save: PS_SET_OUTPUT rows) without {rank} go to worker 0 only; the
 * shared flags go to the servers too.  With --exec, worker i runs the
 * program with {rank} replaced in its arguments and learns the rest from
 * its environment, the variables of the settings table's rows: PS_SERVERS,
 * PS_RANK, PS_NUM_SERVERS, PS_NUM_WORKERS, PS_MODE, PS_MAX_STALENESS (the
 * servers' value), the shared rows given (PS_CURVE_KEYS, ...), PS_DEVICE,
 * PS_TIMELINE with --timeline-dir, PS_SERVER_TIMEOUT (--server-timeout's
 * default) when lost servers are restarted without replicas and the
 * environment does not set it (the workers wait for the restart, not
 * ps.torch's 5 s), and PS_<FLAG> for each optimizer flag given
 * (ps_settings_opt_env).  With site->metrics_ports every server and
 * worker gets --metrics-port (an --exec worker PS_METRICS_PORT) of its own.
 * 0, PS_EINVAL (the hostfile disagrees with the flags, ports run out) with
 * why, or PS_ENOMEM.  Free p with ps_launch_plan_free (also after an error);
 * p keeps pointers into the hostfile. */
int ps_launch_plan_build(const ps_launch_opts *o, const ps_launch_site *site,
                         ps_launch_plan *p, char *why, size_t len);
void ps_launch_plan_free(ps_launch_plan *p);

/* The servers as workers list them: "EP,EP,..." in rank order; with
 * replicas each entry is its group's members, "EP|EP[|EP]" (the primary
 * first).  Appends to out. */
void ps_launch_server_list(const ps_launch_plan *p, ps_strbuf *out);

/* What ps_launch says on stderr before it starts or prints the plan: the
 * output flags that only worker 0 gets, and for this host which GPUs the
 * workers use.  Appends lines ending in "\n" to out; 0 or PS_ENOMEM. */
int ps_launch_plan_notes(const ps_launch_opts *o, const ps_launch_site *site,
                         const ps_launch_plan *p, ps_strbuf *out);

/* What --dry-run prints: a "# role rank on HOST, ..." line and a shell
 * command line per process.  Appends to out; 0 or PS_ENOMEM. */
int ps_launch_plan_print(const ps_launch_plan *p, ps_strbuf *out);

/* The files the workers on this host will write, named by --log-csv,
 * --timeline and --save in their argv: pairs flag, path appended to out, so
 * main can check their directories before starting.  0 or PS_ENOMEM. */
int ps_launch_plan_outputs(const ps_launch_plan *p, ps_strvec *out);

#endif
