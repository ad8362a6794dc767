/* ps_worker: flags and environment -> ps_train_config -> ps_train_run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_limits.h"
#include "ps_log.h"
#include "ps_malloc.h"
#include "ps_opt_table.h"
#include "train.h"

static const char *usage =
    "usage: ps_worker --servers tcp://HOST:PORT[,...] --rank R --num-workers W [flags]\n"
    "\n"
    "Trains a model on its shard of the data, pushing gradients to the parameter\n"
    "servers and pulling weights back from a background comm thread.\n"
    "\n"
    "cluster:\n"
    "  --servers LIST        server endpoints in server-rank order (env PS_SERVERS);\n"
    "                        'none' trains alone with local SGD (compute-only baseline)\n"
    "  --rank R              this worker's rank (env PS_RANK, SLURM_PROCID,\n"
    "                        OMPI_COMM_WORLD_RANK, PMI_RANK; default 0)\n"
    "  --num-workers W       number of workers (env PS_NUM_WORKERS, SLURM_NTASKS,\n"
    "                        OMPI_COMM_WORLD_SIZE, PMI_SIZE; default 1: give it for a\n"
    "                        cluster; the servers refuse a worker whose count differs)\n"
    "  --mode sync|async     consistency (default async); must match the servers\n"
    "  --max-staleness K     async: how many steps a worker may run ahead of the\n"
    "                        slowest (default -1 = unbounded); must match the servers\n"
    "  --curve-keys DIR      encrypt and authenticate with CURVE keys from ps_keygen\n"
    "  --chunk-size BYTES    tensors are cut into chunks of at most this (default 4M)\n"
    "  --shm auto|off        auto: to servers on this host, weights and gradients move\n"
    "                        through shared memory (ZeroMQ carries the headers);\n"
    "                        off: always over the network (default auto)\n"
    "  --wire-dtype f32|bf16|f16  element type of pushed gradients and pulled weights\n"
    "                        on the network (default f32; bf16 and f16 halve the bytes);\n"
    "                        must match the servers.  Through shared memory, float32\n"
    "  --local-aggregate N   N workers of this host (ranks h*N .. h*N+N-1 of host h)\n"
    "                        sum their gradients here and the first of them alone\n"
    "                        talks to the servers (whose --num-workers is then the\n"
    "                        number of hosts, --num-workers / N); 1: off (default)\n"
    "  --request-timeout MS  resend an unanswered request after MS, then after 2x, 4x..\n"
    "                        up to 30 s (default 5000; 0: never).  Servers drop the\n"
    "                        duplicates, so a restarted server gets what it lost\n"
    "  --hello-timeout MS    give up when a server does not answer hello within MS\n"
    "                        (default 10000)\n"
    "  --heartbeat MS        tell every server this often that the worker is alive,\n"
    "                        for their --worker-timeout (default 1000; 0: never)\n"
    "  --server-timeout S    exit (status 1) when a server has sent nothing, not even\n"
    "                        a heartbeat's reply, for S seconds while the worker waits\n"
    "                        on it (default 60; 0: wait and resend forever)\n"
    "model and training:\n"
    "  --model SPEC          mlp:784-256-128-10 (sizes) or cnn (default mlp:784-256-128-10)\n"
    "  --batch B             samples per step per worker (default 64)\n"
    "  --epochs E            passes over this worker's shard (default 1)\n"
    "  --steps N             stop after N iterations (default 0: run all epochs)\n"
    "  --optimizer NAME, --lr X, --momentum X, --beta1 X, --beta2 X, --eps X,\n"
    "  --weight-decay X, --lr-decay X, --lr-decay-every N\n"
    "                        the servers apply the optimizer; each of these that is\n"
    "                        given is checked against the servers' at start, the\n"
    "                        others are not (ranges as in ps_server --help).  --lr is\n"
    "                        also the local-SGD rate with --servers none (default 0.05)\n"
    "  --seed S              weight init and data shuffling (default 1)\n"
    "  --device cpu|cuda:N   compute device (default cpu)\n"
    "  --threads T           BLAS threads on the CPU (default 1)\n"
    "  --data DIR|synthetic:N  IDX files (default /usr/share/datasets/fashion-mnist)\n"
    "output:\n"
    "  --log-every N         progress line every N iterations (default 100)\n"
    "  --eval-every N        test accuracy every N iterations (default 0: each epoch)\n"
    "  --eval-all            every worker evaluates (default: rank 0 only)\n"
    "  --log-csv FILE        per-logged-iteration figures as CSV\n"
    "  --timeline FILE       Chrome trace-event JSON of forward/backward/push/pull/wait\n"
    "  --save FILE           write the final model;  --load FILE  start from one\n"
    "  --verbose | --quiet   more or fewer log lines\n"
    "  --help | --version\n"
    "\n"
    "SIGINT and SIGTERM stop the worker at once, wherever it waits.\n"
    "Exit status: 0 trained (and, on rank 0, evaluated and saved); 1 failed while\n"
    "running (a server went away, I/O error); 2 something to fix first: a bad flag,\n"
    "a setting the servers do not share (mode, worker count, server order, model,\n"
    "optimizer), unusable data, device or keys; 128+N stopped by signal N.\n";

static const char *env_first(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return v;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    ps_train_config c;
    ps_train_config_default(&c);
    ps_malloc_keep_large(); /* every reply's buffer is not faulted in anew */
    char why[512];
    long long iv;
    uint64_t sv;
    static const char *rank_env[] = {"PS_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                     "PMI_RANK", NULL};
    static const char *size_env[] = {"PS_NUM_WORKERS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
                                     "PMI_SIZE", NULL};
    static const char *servers_env[] = {"PS_SERVERS", NULL};
    const char *rank_s = env_first(rank_env), *size_s = env_first(size_env);
    c.servers = env_first(servers_env);
    int verbose = 0, quiet = 0;
    const char *P = "ps_worker";

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ps_flag_help_version(P, usage, a))
            return 0;
        if (!strcmp(a, "--verbose")) { verbose = 1; continue; }
        if (!strcmp(a, "--quiet")) { quiet = 1; continue; }
        if (!strcmp(a, "--eval-all")) { c.eval_all = 1; continue; }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(why, sizeof why, "%s: unexpected argument '%s' (see --help)", P, a);
            return ps_flag_error(why);
        }
        if (i + 1 >= argc) {
            snprintf(why, sizeof why, "%s: %s needs a value (see --help)", P, a);
            return ps_flag_error(why);
        }
        const char *v = argv[++i];
#define INT(flag, lo, hi, dst)                                                   \
    if (!strcmp(a, flag)) {                                                      \
        if (ps_parse_int(P, flag, v, lo, hi, &iv, why, sizeof why))              \
            return ps_flag_error(why);                                           \
        dst = iv;                                                                \
        continue;                                                                \
    }
#define STR(flag, dst)                                                           \
    if (!strcmp(a, flag)) {                                                      \
        dst = v;                                                                 \
        continue;                                                                \
    }
        STR("--servers", c.servers)
        STR("--rank", rank_s)
        STR("--num-workers", size_s)
        if (!strcmp(a, "--mode")) {
            if (ps_mode_parse(v, &c.mode)) {
                snprintf(why, sizeof why, "%s: --mode must be sync or async, got '%s'", P, v);
                return ps_flag_error(why);
            }
            continue;
        }
        INT("--max-staleness", -1, PS_MAX_STALENESS, c.max_staleness)
        STR("--curve-keys", c.curve_dir)
        if (!strcmp(a, "--chunk-size")) {
            if (ps_parse_size(P, a, v, PS_MIN_CHUNK_BYTES, PS_MAX_CHUNK_BYTES, &sv, why, sizeof why))
                return ps_flag_error(why);
            c.chunk_bytes = sv;
            continue;
        }
        if (!strcmp(a, "--shm")) {
            if (strcmp(v, "auto") && strcmp(v, "off")) {
                snprintf(why, sizeof why, "%s: --shm must be auto or off, got '%s'", P, v);
                return ps_flag_error(why);
            }
            c.shm = v[0] == 'a';
            continue;
        }
        if (!strcmp(a, "--wire-dtype")) {
            uint32_t dt;
            if (ps_dtype_parse(v, &dt)) {
                snprintf(why, sizeof why, "%s: --wire-dtype must be f32, bf16 or f16, got '%s'",
                         P, v);
                return ps_flag_error(why);
            }
            c.wire_dtype = (int)dt;
            continue;
        }
        INT("--local-aggregate", 1, 64, c.local_size)
        INT("--request-timeout", 0, 3600000, c.request_timeout_ms)
        INT("--hello-timeout", 1, 3600000, c.hello_timeout_ms)
        INT("--heartbeat", 0, 3600000, c.heartbeat_ms)
        if (!strcmp(a, "--server-timeout")) {
            double sec;
            if (ps_parse_float(P, a, v, 0, 86400, &sec, why, sizeof why))
                return ps_flag_error(why);
            c.server_timeout_ms = (int)(sec * 1000 + 0.5);
            if (sec > 0 && c.server_timeout_ms == 0)
                c.server_timeout_ms = 1;
            continue;
        }
        STR("--model", c.model)
        INT("--batch", 1, 65536, c.batch)
        INT("--epochs", 1, 100000, c.epochs)
        INT("--steps", 0, 1ll << 40, c.max_steps)
        /* the optimizer's flags (include/ps_types.h): each is checked against
         * the servers when given, and only then */
        int handled = 0;
        if (ps_opt_flag(P, a, v, &c.expect, &handled, why, sizeof why))
            return ps_flag_error(why);
        if (handled) {
            if (!strcmp(a, "--lr"))
                c.local_lr = c.expect.lr;
            continue;
        }
        if (!strcmp(a, "--seed")) {
            if (ps_parse_int(P, a, v, 0, (long long)1 << 62, &iv, why, sizeof why))
                return ps_flag_error(why);
            c.seed = (uint64_t)iv;
            continue;
        }
        STR("--device", c.device)
        INT("--threads", 1, 256, c.threads)
        STR("--data", c.data)
        INT("--log-every", 1, 1 << 30, c.log_every)
        INT("--eval-every", 0, 1 << 30, c.eval_every)
        STR("--log-csv", c.log_csv)
        STR("--timeline", c.timeline)
        STR("--save", c.save_path)
        STR("--load", c.load_path)
#undef INT
#undef STR
        snprintf(why, sizeof why, "%s: unknown flag '%s' (see --help)", P, a);
        return ps_flag_error(why);
    }
    if (c.servers && !strcmp(c.servers, "none"))
        c.servers = NULL;
    else if (!c.servers) {
        return ps_flag_error("ps_worker: no servers: give --servers tcp://HOST:PORT,... "
                             "(or PS_SERVERS), or --servers none to train alone");
    }
    if (size_s && ps_parse_int(P, "--num-workers", size_s, 1, PS_MAX_WORKERS, &iv, why, sizeof why) == 0)
        c.num_workers = (int)iv;
    else if (size_s)
        return ps_flag_error(why);
    if (rank_s && ps_parse_int(P, "--rank", rank_s, 0, c.num_workers - 1, &iv, why, sizeof why))
        return ps_flag_error(why);
    c.rank = rank_s ? (int)iv : 0;
    if (c.local_size > 1 && (!c.servers || c.num_workers % c.local_size != 0)) {
        snprintf(why, sizeof why, "%s: --local-aggregate %d needs servers and a --num-workers "
                 "that is a multiple of it (hosts x workers per host), got %d", P, c.local_size,
                 c.num_workers);
        return ps_flag_error(why);
    }
    if (c.mode == PS_MODE_SYNC) {
        if (c.max_staleness > 0)
            return ps_flag_error("ps_worker: --max-staleness applies to --mode async only "
                                 "(sync is staleness 0)");
        c.max_staleness = 0;
    }
    ps_log_init("ps_worker", c.rank);
    ps_log_set_level(quiet ? PS_LOG_WARN : verbose ? PS_LOG_DEBUG : PS_LOG_INFO);
    if (!rank_s && !size_s && c.servers)
        ps_info("no --rank/--num-workers (nor PS_RANK/PS_NUM_WORKERS, Slurm or MPI "
                "variables): training as worker 0 of 1");
    int rc = ps_train_run(&c);
    if (rc == PS_ECLOSED && ps_train_stop_signal())
        return 128 + ps_train_stop_signal();
    return ps_exit_status(rc);
}
