/* ps_server: flags, logging, signals; the work is in server.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"
#include "ps_log.h"
#include "ps_proto.h"
#include "server.h"

#ifndef PS_VERSION
#define PS_VERSION "unknown"
#endif

#define PROG "ps_server"

static ps_server *volatile g_server;
static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
    ps_server *s = g_server;
    if (s)
        ps_server_stop(s);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: ps_server --bind ENDPOINT [options]\n"
        "\n"
        "One parameter-server shard: holds its chunks of the model, applies the\n"
        "optimizer to the gradients workers push, and serves pulls (docs/PROTOCOL.md).\n"
        "\n"
        "  --bind ENDPOINT        ZeroMQ endpoint to listen on (required), e.g.\n"
        "                         tcp://*:5555 or ipc:///tmp/ps0\n"
        "  --rank R               this server's rank, 0..num-servers-1 (default 0)\n"
        "  --num-servers S        number of servers, 1..65536 (default 1)\n"
        "  --num-workers W        number of workers, 1..65536 (default 1)\n"
        "  --mode sync|async      sync: every step waits for all workers' gradients;\n"
        "                         async: each gradient is applied on arrival (default async)\n"
        "  --max-staleness K      async: a pull waits until the slowest worker is at most\n"
        "                         K steps behind; -1 = never wait (default -1 in async;\n"
        "                         must be 0 in sync, which is the default there)\n"
        "  --optimizer NAME       sgd, momentum, nesterov, adagrad or adam (default sgd)\n"
        "  --lr X                 learning rate, 0..1e6 (default 0.01)\n"
        "  --momentum M           momentum and nesterov: 0..1 (default 0.9)\n"
        "  --beta1 B1             adam: first-moment decay, [0, 1) (default 0.9)\n"
        "  --beta2 B2             adam: second-moment decay, [0, 1) (default 0.999)\n"
        "  --eps E                adagrad and adam: denominator term, (0, 1] (default 1e-8)\n"
        "  --weight-decay WD      L2 term added to every gradient, 0..1 (default 0)\n"
        "  --lr-decay F           multiply the learning rate by F in (0, 1] every\n"
        "  --lr-decay-every N     N updates of a chunk (sync: rounds; async: pushes);\n"
        "                         N = 0: constant rate (default F 1, N 0)\n"
        "  --threads T            update threads, 1..%d; chunks are split among them\n"
        "                         by hash (default 1)\n"
        "  --max-memory BYTES     cap on weights + optimizer state; inits beyond it are\n"
        "                         refused; suffixes K, M, G (default 8G)\n"
        "  --timeline FILE        Chrome trace-event JSON: an 'apply' event per update and a\n"
        "                         'pull' event per served pull, one lane per update thread\n"
        "  --curve-keys DIR       CURVE: encrypt, and serve only workers whose public keys\n"
        "                         are in DIR/authorized (keys from ps_keygen; docs/SECURITY.md)\n"
        "fault tolerance (docs/OPERATIONS.md):\n"
        "  --checkpoint-dir DIR   write checkpoints of this server's shard to DIR\n"
        "                         (DIR/shard-RANK-SEQ.ckpt, the newest 2 are kept)\n"
        "  --checkpoint-every N|Ts  sync: every N rounds; async: every N pushes received;\n"
        "                         Ts (e.g. 30s): every T seconds (default 60s with\n"
        "                         --checkpoint-dir).  Sync with N = 1: every round is on\n"
        "                         disk before any worker sees it (exact restarts)\n"
        "  --restore              start from the newest valid checkpoint in --checkpoint-dir\n"
        "                         (exit 2 when there is none or it has another config)\n"
        "  --worker-timeout S     a worker silent this many seconds (no message, no\n"
        "                         heartbeat) is lost (default 0: never)\n"
        "  --on-worker-loss wait|drop  wait: log it and keep waiting (default); drop: go on\n"
        "                         without it (rounds average the live workers, barriers\n"
        "                         count them) until it says hello again\n"
        "  --verbose              log debug lines too\n"
        "  --quiet                log warnings and errors only\n"
        "  --help                 print this and exit\n"
        "  --version              print the version and exit\n"
        "\n"
        "Exit status: 0 after a SHUTDOWN message, SIGINT or SIGTERM; 1 when the server\n"
        "cannot start or a socket fails; 2 for a bad flag, unusable CURVE keys, or a\n"
        "--restore with no valid checkpoint or one written with another configuration.\n",
        PS_SERVER_MAX_THREADS);
}

/* Parse argv into c.  Returns -1 to go on, or the exit status. */
static int parse(int argc, char **argv, ps_server_config *c, int *log_level)
{
    char why[512];
    int staleness_given = 0, every_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("%s %s\n", PROG, PS_VERSION);
            return 0;
        }
        if (strcmp(arg, "--verbose") == 0) {
            *log_level = PS_LOG_DEBUG;
            continue;
        }
        if (strcmp(arg, "--quiet") == 0) {
            *log_level = PS_LOG_WARN;
            continue;
        }
        if (strcmp(arg, "--restore") == 0) {
            c->restore = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(why, sizeof why, "%s: unexpected argument '%s' (see --help)", PROG, arg);
            return ps_flag_error(why);
        }
        /* --flag value or --flag=value */
        char name[64];
        const char *val;
        const char *eq = strchr(arg, '=');
        if (eq) {
            size_t n = (size_t)(eq - arg);
            if (n >= sizeof name)
                n = sizeof name - 1;
            memcpy(name, arg, n);
            name[n] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
            val = i + 1 < argc ? argv[i + 1] : NULL;
        }
        static const char *const known[] = {
            "--bind", "--rank", "--num-servers", "--num-workers", "--mode", "--max-staleness",
            "--optimizer", "--lr", "--momentum", "--beta1", "--beta2", "--eps",
            "--weight-decay", "--lr-decay", "--lr-decay-every", "--threads", "--max-memory", "--timeline", "--curve-keys",
            "--checkpoint-dir", "--checkpoint-every", "--worker-timeout", "--on-worker-loss"};
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (strcmp(name, known[k]) == 0)
                is_known = 1;
        if (!is_known) {
            snprintf(why, sizeof why, "%s: unknown flag '%s' (see --help)", PROG, name);
            return ps_flag_error(why);
        }
        if (!val) {
            snprintf(why, sizeof why, "%s: %s needs a value (see --help)", PROG, name);
            return ps_flag_error(why);
        }
        if (!eq)
            i++;
        long long iv;
        double fv;
        uint64_t sv;
        int rc = 0;
        if (strcmp(name, "--bind") == 0) {
            if (!*val || strlen(val) > 255 || !strstr(val, "://")) {
                snprintf(why, sizeof why,
                         "%s: --bind must be a ZeroMQ endpoint like tcp://*:5555 or "
                         "ipc:///tmp/ps0, got '%s'", PROG, val);
                return ps_flag_error(why);
            }
            c->bind = val;
        } else if (strcmp(name, "--rank") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, 0, PS_MAX_RANK, &iv, why, sizeof why)))
                c->rank = (int)iv;
        } else if (strcmp(name, "--num-servers") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_MAX_RANK + 1, &iv, why, sizeof why)))
                c->num_servers = (int)iv;
        } else if (strcmp(name, "--num-workers") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_MAX_RANK + 1, &iv, why, sizeof why)))
                c->num_workers = (int)iv;
        } else if (strcmp(name, "--mode") == 0) {
            if (ps_mode_parse(val, &c->mode) != 0) {
                snprintf(why, sizeof why, "%s: --mode must be sync or async, got '%s'", PROG, val);
                return ps_flag_error(why);
            }
        } else if (strcmp(name, "--max-staleness") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, -1, 1000000, &iv, why, sizeof why))) {
                c->max_staleness = (int)iv;
                staleness_given = 1;
            }
        } else if (strcmp(name, "--optimizer") == 0) {
            if (ps_opt_parse(val, &c->opt.kind) != 0) {
                snprintf(why, sizeof why,
                         "%s: --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, "
                         "got '%s'", PROG, val);
                return ps_flag_error(why);
            }
        } else if (strcmp(name, "--lr") == 0) {
            if (!(rc = ps_parse_float(PROG, name, val, 0, 1e6, &fv, why, sizeof why)))
                c->opt.lr = (float)fv;
        } else if (strcmp(name, "--momentum") == 0) {
            if (!(rc = ps_parse_float(PROG, name, val, 0, 1, &fv, why, sizeof why)))
                c->opt.momentum = (float)fv;
        } else if (strcmp(name, "--beta1") == 0 || strcmp(name, "--beta2") == 0) {
            rc = ps_parse_float(PROG, name, val, 0, 1, &fv, why, sizeof why);
            if (!rc && (float)fv >= 1.0f) {
                snprintf(why, sizeof why, "%s: %s must be a number in [0, 1), got '%s'", PROG,
                         name, val);
                rc = PS_EINVAL;
            }
            if (!rc && name[6] == '1')
                c->opt.beta1 = (float)fv;
            else if (!rc)
                c->opt.beta2 = (float)fv;
        } else if (strcmp(name, "--eps") == 0) {
            rc = ps_parse_float(PROG, name, val, 0, 1, &fv, why, sizeof why);
            if (!rc && !((float)fv > 0.0f)) {
                snprintf(why, sizeof why, "%s: --eps must be a number in (0, 1], got '%s'", PROG,
                         val);
                rc = PS_EINVAL;
            }
            if (!rc)
                c->opt.eps = (float)fv;
        } else if (strcmp(name, "--weight-decay") == 0) {
            if (!(rc = ps_parse_float(PROG, name, val, 0, 1, &fv, why, sizeof why)))
                c->opt.weight_decay = (float)fv;
        } else if (strcmp(name, "--lr-decay") == 0) {
            rc = ps_parse_float(PROG, name, val, 0, 1, &fv, why, sizeof why);
            if (!rc && !((float)fv > 0.0f)) {
                snprintf(why, sizeof why, "%s: --lr-decay must be a number in (0, 1], got '%s'",
                         PROG, val);
                rc = PS_EINVAL;
            }
            if (!rc)
                c->opt.lr_decay = (float)fv;
        } else if (strcmp(name, "--lr-decay-every") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, 0, UINT32_MAX, &iv, why, sizeof why)))
                c->opt.lr_decay_every = (uint32_t)iv;
        } else if (strcmp(name, "--threads") == 0) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_SERVER_MAX_THREADS, &iv, why,
                                    sizeof why)))
                c->threads = (int)iv;
        } else if (strcmp(name, "--max-memory") == 0) {
            if (!(rc = ps_parse_size(PROG, name, val, 4096, 1ull << 50, &sv, why, sizeof why)))
                c->max_memory = sv;
        } else if (strcmp(name, "--timeline") == 0 || strcmp(name, "--curve-keys") == 0 ||
                   strcmp(name, "--checkpoint-dir") == 0) {
            if (!*val || strlen(val) > 900) {
                snprintf(why, sizeof why, "%s: %s needs a path of 1..900 characters", PROG, name);
                return ps_flag_error(why);
            }
            if (name[2] == 't')
                c->timeline = val;
            else if (name[3] == 'u')
                c->curve_dir = val;
            else
                c->checkpoint_dir = val;
        } else if (strcmp(name, "--checkpoint-every") == 0) {
            size_t n = strlen(val);
            if (n > 1 && val[n - 1] == 's') {
                char num[64];
                snprintf(num, sizeof num, "%.*s", (int)(n - 1), val);
                rc = ps_parse_float(PROG, name, num, 0.001, 1e6, &fv, why, sizeof why);
                if (!rc) {
                    c->checkpoint_every_ms = (int)(fv * 1000.0 + 0.5);
                    c->checkpoint_every = 0;
                }
            } else if (!(rc = ps_parse_int(PROG, name, val, 1, 1ll << 40, &iv, why, sizeof why))) {
                c->checkpoint_every = iv;
                c->checkpoint_every_ms = 0;
            }
            if (rc)
                snprintf(why, sizeof why, "%s: --checkpoint-every must be a count N >= 1 (rounds "
                         "in sync, pushes in async) or seconds like 30s, got '%s'", PROG, val);
            every_given = 1;
        } else if (strcmp(name, "--worker-timeout") == 0) {
            if (!(rc = ps_parse_float(PROG, name, val, 0, 86400, &fv, why, sizeof why)))
                c->worker_timeout_ms = (int)(fv * 1000.0 + 0.5);
        } else if (strcmp(name, "--on-worker-loss") == 0) {
            if (strcmp(val, "wait") == 0) {
                c->on_worker_loss = PS_LOSS_WAIT;
            } else if (strcmp(val, "drop") == 0) {
                c->on_worker_loss = PS_LOSS_DROP;
            } else {
                snprintf(why, sizeof why, "%s: --on-worker-loss must be wait or drop, got '%s'",
                         PROG, val);
                return ps_flag_error(why);
            }
        }
        if (rc)
            return ps_flag_error(why);
    }
    if (!c->bind)
        return ps_flag_error(PROG ": --bind is required, e.g. --bind tcp://*:5555 (see --help)");
    if (c->rank >= c->num_servers) {
        snprintf(why, sizeof why, "%s: --rank must be an integer in [0, %d] (--num-servers %d), "
                 "got '%d'", PROG, c->num_servers - 1, c->num_servers, c->rank);
        return ps_flag_error(why);
    }
    if (!c->checkpoint_dir && (every_given || c->restore))
        return ps_flag_error(PROG ": --checkpoint-every and --restore need --checkpoint-dir "
                             "DIR (see --help)");
    if (c->checkpoint_dir && !every_given)
        c->checkpoint_every_ms = 60000;
    if (c->on_worker_loss == PS_LOSS_DROP && c->worker_timeout_ms == 0)
        return ps_flag_error(PROG ": --on-worker-loss drop needs --worker-timeout S (see --help)");
    if (c->mode == PS_MODE_SYNC) {
        if (staleness_given && c->max_staleness != 0) {
            snprintf(why, sizeof why, "%s: --max-staleness must be 0 in sync mode, got '%d'",
                     PROG, c->max_staleness);
            return ps_flag_error(why);
        }
        c->max_staleness = 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ps_server_config cfg;
    ps_server_config_default(&cfg);
    int level = PS_LOG_INFO;
    ps_log_init(PROG, -1);
    int rc = parse(argc, argv, &cfg, &level);
    if (rc >= 0)
        return rc;
    ps_log_init(PROG, cfg.rank);
    ps_log_set_level(level);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    const ps_opt_config *o = &cfg.opt;
    ps_info("%s %s starting: rank %d of %d servers, %d workers, mode %s (max-staleness %d), "
            "optimizer %s (lr %g, momentum %g, beta1 %g, beta2 %g, eps %g, weight-decay %g, "
            "lr-decay %g every %u), %d update threads, max memory %llu bytes",
            PROG, PS_VERSION, cfg.rank, cfg.num_servers, cfg.num_workers, ps_mode_name(cfg.mode),
            cfg.max_staleness, ps_opt_name(o->kind), (double)o->lr, (double)o->momentum,
            (double)o->beta1, (double)o->beta2, (double)o->eps, (double)o->weight_decay,
            (double)o->lr_decay, o->lr_decay_every, cfg.threads, (unsigned long long)cfg.max_memory);
    if (cfg.checkpoint_dir) {
        if (cfg.checkpoint_every_ms)
            ps_info("checkpoints: %s every %.1f s%s", cfg.checkpoint_dir,
                    cfg.checkpoint_every_ms / 1000.0, cfg.restore ? ", restoring the newest" : "");
        else
            ps_info("checkpoints: %s every %lld %s%s%s", cfg.checkpoint_dir,
                    (long long)cfg.checkpoint_every,
                    cfg.mode == PS_MODE_SYNC ? "round(s)" : "push(es)",
                    cfg.mode == PS_MODE_SYNC && cfg.checkpoint_every == 1
                        ? " (durable rounds: replies wait for the write)"
                        : "",
                    cfg.restore ? ", restoring the newest" : "");
    }
    if (cfg.worker_timeout_ms)
        ps_info("a worker silent for %.1f s is lost; then: %s", cfg.worker_timeout_ms / 1000.0,
                cfg.on_worker_loss == PS_LOSS_DROP ? "drop it" : "wait for it");
    char why[512];
    ps_server *s;
    rc = ps_server_open(&cfg, &s, why, sizeof why);
    if (rc) {
        ps_error("cannot start: %s", why);
        /* bad flags, keys or checkpoints: the operator's to fix (2); else 1 */
        return rc == PS_EINVAL || rc == PS_EDATA || rc == PS_EMISMATCH || rc == PS_ENOTFOUND ||
                       rc == PS_EAUTH
                   ? 2
                   : 1;
    }
    ps_info("listening on %s", ps_server_endpoint(s));
    g_server = s;
    if (g_stop) /* a signal that came while starting */
        ps_server_stop(s);
    rc = ps_server_run(s);
    g_server = NULL;
    ps_server_close(s);
    ps_info("exit %d", rc ? 1 : 0);
    return rc ? 1 : 0;
}
