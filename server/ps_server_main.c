/* ps_server: flags, logging, signals; the work is in server.c. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_flags.h"
#include "ps_log.h"
#include "ps_malloc.h"
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

/* --exit-on-stdin-eof: read stdin until it ends, then stop as on SIGTERM.
 * A server started over a connection (ps_launch over ssh) ends with it. */
static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER; /* main closes s under it */

static void *watch_stdin(void *arg)
{
    (void)arg;
    char buf[256];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        break;
    }
    pthread_mutex_lock(&g_watch_mu);
    if (g_server) {
        ps_info("standard input closed (--exit-on-stdin-eof): stopping");
        g_stop = 1;
        ps_server_stop(g_server);
    }
    pthread_mutex_unlock(&g_watch_mu);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: ps_server --bind ENDPOINT [--rank R --num-servers S] [--num-workers W]\n"
        "                 [--mode sync|async] [options]\n"
        "\n"
        "One parameter-server shard: holds its chunks of the model, applies the\n"
        "optimizer to the gradients workers push, and serves pulls (docs/PROTOCOL.md).\n"
        "\n"
        "  --bind ENDPOINT        ZeroMQ endpoint to listen on (required): tcp://*:PORT\n"
        "                         (every interface), tcp://ADDRESS:PORT, tcp://HOST:PORT\n"
        "                         (the name is resolved), or ipc:///PATH\n"
        "  --rank R               this server's rank, 0..num-servers-1 (default 0)\n"
        "  --num-servers S        number of servers, 1..%d (default 1)\n"
        "  --num-workers W        number of workers that will connect, 1..%d\n"
        "                         (default 1: give the real count for a cluster)\n"
        "  --mode sync|async      sync: every step waits for all workers' gradients;\n"
        "                         async: each gradient is applied on arrival (default async)\n"
        "  --max-staleness K      async: a pull waits until the slowest worker is at most\n"
        "                         K steps behind; -1 = never wait (default -1 in async;\n"
        "                         must be 0 in sync, which is the default there)\n"
        "the optimizer (workers check what they are given of these at hello):\n",
        PS_MAX_SERVERS, PS_MAX_WORKERS);
    ps_opt_usage(f, 2);
    fprintf(f,
        "  --threads T            update threads, 1..%d; chunks are split among them\n"
        "                         by hash (default 1)\n"
        "  --max-memory BYTES     cap on weights + optimizer state and on pull replies sent\n"
        "                         as copies and not yet read; inits (and copies) beyond it\n"
        "                         are refused; suffixes K, M, G (default 8G)\n"
        "  --max-peer-replies N   pull replies one connection may leave unread before its\n"
        "                         pulls are refused (default 10000)\n"
        "  --max-peer-bytes BYTES their bytes (default: 64M or twice the memory of this\n"
        "                         server's chunks, whichever is larger)\n"
        "  --timeline FILE        Chrome trace-event JSON: an 'apply' event per update and a\n"
        "                         'pull' event per served pull, one lane per update thread\n"
        "  --curve-keys DIR       CURVE: encrypt, and serve only workers whose public keys\n"
        "                         are in DIR/authorized (keys from ps_keygen; docs/SECURITY.md);\n"
        "                         a key in DIR/admin may also stop the server with a message\n"
        "  --admin-token-file FILE  a shutdown message carrying the token in FILE (mode 0600,\n"
        "                         16..128 characters) stops the server; without it (or an\n"
        "                         admin key) only SIGTERM/SIGINT do (docs/SECURITY.md)\n"
        "  --shm auto|off         auto: a worker on this host offers its shared-memory\n"
        "                         arena at hello and payloads go through it, ZeroMQ carries\n"
        "                         only headers; off: always over the network (default auto)\n"
        "  --wire-dtype f32|bf16|f16  element type of pushed gradients and pulled weights\n"
        "                         on the network (default f32); weights and optimizer state\n"
        "                         stay float32 here; workers must give the same\n"
        "fault tolerance (docs/OPERATIONS.md):\n"
        "  --checkpoint-dir DIR   write checkpoints of this server's shard to DIR\n"
        "                         (DIR/shard-RANK-SEQ.ckpt, the newest 2 are kept)\n"
        "  --checkpoint-every N|Ts  sync: every N rounds; async: every N pushes received,\n"
        "                         and no push is acknowledged more than N past the last\n"
        "                         checkpoint written (a crash loses at most N);\n"
        "                         Ts (e.g. 30s): every T seconds (default 60s with\n"
        "                         --checkpoint-dir).  Sync with N = 1: every round is on\n"
        "                         disk before any worker sees it (exact restarts)\n"
        "  --restore              start from the newest valid checkpoint in --checkpoint-dir\n"
        "                         (exit 2 when there is none or it has another config)\n"
        "  --on-checkpoint-failure stall[:S]|continue|exit[:S]  while checkpoint writes\n"
        "                         fail: stall: what waits for a checkpoint (durable rounds,\n"
        "                         new chunks' inits, async acks past N) waits, and after S s\n"
        "                         (default 30) its worker gets an error saying why (default);\n"
        "                         continue: go on without checkpoints; exit: stop (exit 1)\n"
        "                         when writes still fail S s (default 10) after the first\n"
        "                         failure\n"
        "  --worker-timeout S     a worker silent this many seconds (no message, no\n"
        "                         heartbeat) is lost (default 0: never)\n"
        "  --on-worker-loss wait|drop  wait: log it and keep waiting (default); drop: go on\n"
        "                         without it (rounds average the live workers, barriers\n"
        "                         count them) until it says hello again\n"
        "  --exit-on-stdin-eof    stop (as on SIGTERM) when standard input ends: for a\n"
        "                         server started over a connection that should end with it\n"
        "                         (ps_launch over ssh gives it)\n"
        "  --verbose              log debug lines too\n"
        "  --quiet                log warnings and errors only\n"
        "  --help                 print this and exit\n"
        "  --version              print the version and exit\n"
        "\n"
        "SIGINT, SIGTERM and SIGUSR1 stop it: last checkpoint, 'stopped:' line.  SIGUSR1\n"
        "is the signal mpirun passes on to its processes as it is (on SIGTERM it kills\n"
        "them within seconds).\n"
        "\n"
        "Exit status: 0 after SIGINT, SIGTERM, SIGUSR1 or an allowed SHUTDOWN message; 1\n"
        "when a socket or the update threads fail while running (or the port is taken);\n"
        "2 for something to fix first: a bad flag, unusable CURVE keys or admin token\n"
        "file, a --restore with no valid checkpoint or one written with another\n"
        "configuration.\n",
        PS_SERVER_MAX_THREADS);
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    char why[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return ps_flag_error(why);
}

/* Parse argv into c (bind_buf holds the checked --bind).  Returns -1 to go
 * on, or the exit status. */
static int parse(int argc, char **argv, ps_server_config *c, int *log_level, int *stdin_eof,
                 char *bind_buf, size_t bind_cap)
{
    static const char *const valued[] = {
        "--bind", "--rank", "--num-servers", "--num-workers", "--mode", "--max-staleness",
        "--threads", "--max-memory", "--timeline", "--curve-keys", "--checkpoint-dir",
        "--checkpoint-every", "--worker-timeout", "--on-worker-loss", "--admin-token-file",
        "--max-peer-replies", "--max-peer-bytes", "--on-checkpoint-failure", "--shm",
        "--wire-dtype", NULL};
    char why[512];
    int staleness_given = 0, every_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            return 0;
        }
        if (ps_flag_help_version(PROG, "", arg))
            return 0;
        if (!strcmp(arg, "--verbose") || !strcmp(arg, "--quiet")) {
            *log_level = arg[2] == 'v' ? PS_LOG_DEBUG : PS_LOG_WARN;
            continue;
        }
        if (!strcmp(arg, "--restore")) {
            c->restore = 1;
            continue;
        }
        if (!strcmp(arg, "--exit-on-stdin-eof")) {
            *stdin_eof = 1;
            continue;
        }
        const char *val, *name = ps_flag_value(argc, argv, &i, ps_opt_flag_names(), &val);
        if (!name)
            name = ps_flag_value(argc, argv, &i, valued, &val);
        if (!name)
            return bad(arg[0] == '-' ? "%s: unknown flag '%s' (see --help)"
                                     : "%s: unexpected argument '%s' (see --help)", PROG, arg);
        if (!val)
            return bad("%s: %s needs a value (see --help)", PROG, name);
        long long iv;
        double fv;
        uint64_t sv;
        int rc = 0, handled = 0;
        if ((rc = ps_opt_flag(PROG, name, val, &c->opt, &handled, why, sizeof why)) || handled) {
        } else if (!strcmp(name, "--bind")) {
            char msg[400];
            if (ps_endpoint_check(val, 1, bind_buf, bind_cap, msg, sizeof msg))
                return bad("%s: --bind: %s", PROG, msg);
            c->bind = bind_buf;
        } else if (!strcmp(name, "--rank")) {
            if (!(rc = ps_parse_int(PROG, name, val, 0, PS_MAX_RANK, &iv, why, sizeof why)))
                c->rank = (int)iv;
        } else if (!strcmp(name, "--num-servers")) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_MAX_SERVERS, &iv, why, sizeof why)))
                c->num_servers = (int)iv;
        } else if (!strcmp(name, "--num-workers")) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_MAX_WORKERS, &iv, why, sizeof why)))
                c->num_workers = (int)iv;
        } else if (!strcmp(name, "--mode")) {
            if (ps_mode_parse(val, &c->mode) != 0)
                return bad("%s: --mode must be sync or async, got '%s'", PROG, val);
        } else if (!strcmp(name, "--max-staleness")) {
            if (!(rc = ps_parse_int(PROG, name, val, -1, PS_MAX_STALENESS, &iv, why, sizeof why))) {
                c->max_staleness = (int)iv;
                staleness_given = 1;
            }
        } else if (!strcmp(name, "--threads")) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, PS_SERVER_MAX_THREADS, &iv, why,
                                    sizeof why)))
                c->threads = (int)iv;
        } else if (!strcmp(name, "--max-memory")) {
            if (!(rc = ps_parse_size(PROG, name, val, 4096, 1ull << 50, &sv, why, sizeof why)))
                c->max_memory = sv;
        } else if (!strcmp(name, "--on-checkpoint-failure")) {
            /* stall, continue, exit; stall:S and exit:S set the seconds */
            size_t k = strcspn(val, ":");
            double secs = 0;
            int ok = 1;
            if (val[k]) {
                char *end;
                secs = strtod(val + k + 1, &end);
                ok = end != val + k + 1 && !*end && secs >= 0.1 && secs <= 86400;
            }
            if (ok && k == 5 && !strncmp(val, "stall", 5))
                c->on_checkpoint_failure = PS_CKPT_FAIL_STALL;
            else if (ok && !val[k] && !strcmp(val, "continue"))
                c->on_checkpoint_failure = PS_CKPT_FAIL_CONTINUE;
            else if (ok && k == 4 && !strncmp(val, "exit", 4))
                c->on_checkpoint_failure = PS_CKPT_FAIL_EXIT;
            else
                return bad("%s: --on-checkpoint-failure must be stall[:S], continue or "
                           "exit[:S] (S: seconds, 0.1..86400), got '%s'", PROG, val);
            c->checkpoint_failure_ms = (int)(secs * 1000.0 + 0.5);
        } else if (!strcmp(name, "--max-peer-replies")) {
            if (!(rc = ps_parse_int(PROG, name, val, 1, 1000000000, &iv, why, sizeof why)))
                c->max_peer_replies = (uint64_t)iv;
        } else if (!strcmp(name, "--max-peer-bytes")) {
            if (!(rc = ps_parse_size(PROG, name, val, 4096, 1ull << 50, &sv, why, sizeof why)))
                c->max_peer_bytes = sv;
        } else if (!strcmp(name, "--admin-token-file")) {
            if (!*val || strlen(val) > 900)
                return bad("%s: %s needs a path of 1..900 characters", PROG, name);
            c->admin_token_file = val;
        } else if (!strcmp(name, "--timeline") || !strcmp(name, "--curve-keys") ||
                   !strcmp(name, "--checkpoint-dir")) {
            if (!*val || strlen(val) > 900)
                return bad("%s: %s needs a path of 1..900 characters", PROG, name);
            if (name[2] == 't')
                c->timeline = val;
            else if (name[3] == 'u')
                c->curve_dir = val;
            else
                c->checkpoint_dir = val;
        } else if (!strcmp(name, "--checkpoint-every")) {
            size_t n = strlen(val);
            if (n > 1 && val[n - 1] == 's') {
                char num[64];
                snprintf(num, sizeof num, "%.*s", (int)(n - 1), val);
                if (!(rc = ps_parse_float(PROG, name, num, 0.001, 1e6, &fv, why, sizeof why))) {
                    c->checkpoint_every_ms = (int)(fv * 1000.0 + 0.5);
                    c->checkpoint_every = 0;
                }
            } else if (!(rc = ps_parse_int(PROG, name, val, 1, 1ll << 40, &iv, why, sizeof why))) {
                c->checkpoint_every = iv;
                c->checkpoint_every_ms = 0;
            }
            if (rc)
                return bad("%s: --checkpoint-every must be a count N >= 1 (rounds in sync, "
                           "pushes in async) or seconds like 30s, got '%s'", PROG, val);
            every_given = 1;
        } else if (!strcmp(name, "--worker-timeout")) {
            if (!(rc = ps_parse_float(PROG, name, val, 0, 86400, &fv, why, sizeof why)))
                c->worker_timeout_ms = (int)(fv * 1000.0 + 0.5);
        } else if (!strcmp(name, "--shm")) {
            if (strcmp(val, "auto") && strcmp(val, "off"))
                return bad("%s: --shm must be auto or off, got '%s'", PROG, val);
            c->shm = val[0] == 'a' ? PS_SHM_AUTO : PS_SHM_OFF;
        } else if (!strcmp(name, "--wire-dtype")) {
            if (ps_dtype_parse(val, &c->wire_dtype))
                return bad("%s: --wire-dtype must be f32, bf16 or f16, got '%s'", PROG, val);
        } else if (!strcmp(name, "--on-worker-loss")) {
            if (strcmp(val, "wait") && strcmp(val, "drop"))
                return bad("%s: --on-worker-loss must be wait or drop, got '%s'", PROG, val);
            c->on_worker_loss = val[0] == 'd' ? PS_LOSS_DROP : PS_LOSS_WAIT;
        }
        if (rc)
            return ps_flag_error(why);
    }
    if (!c->bind)
        return ps_flag_error(PROG ": --bind is required, e.g. --bind tcp://*:5555 (see --help)");
    if (c->rank >= c->num_servers)
        return bad("%s: --rank must be an integer in [0, %d] (--num-servers %d), got '%d'", PROG,
                   c->num_servers - 1, c->num_servers, c->rank);
    if (!c->checkpoint_dir && (every_given || c->restore))
        return ps_flag_error(PROG ": --checkpoint-every and --restore need --checkpoint-dir "
                             "DIR (see --help)");
    if (c->checkpoint_dir && !every_given)
        c->checkpoint_every_ms = 60000;
    if (c->on_worker_loss == PS_LOSS_DROP && c->worker_timeout_ms == 0)
        return ps_flag_error(PROG ": --on-worker-loss drop needs --worker-timeout S (see --help)");
    if (c->mode == PS_MODE_SYNC) {
        if (staleness_given && c->max_staleness != 0)
            return bad("%s: --max-staleness must be 0 in sync mode, got '%d'", PROG,
                       c->max_staleness);
        c->max_staleness = 0;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ps_server_config cfg;
    ps_server_config_default(&cfg);
    int level = PS_LOG_INFO, stdin_eof = 0;
    ps_log_init(PROG, -1);
    char bind[PS_ENDPOINT_MAX];
    int rc = parse(argc, argv, &cfg, &level, &stdin_eof, bind, sizeof bind);
    if (rc >= 0)
        return rc;
    ps_log_init(PROG, cfg.rank);
    ps_log_set_level(level);
    ps_malloc_keep_large(); /* every message's buffer is not faulted in anew */

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* mpirun forwards SIGUSR1 to its processes, not SIGTERM */
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char opt[400];
    ps_opt_describe(&cfg.opt, opt, sizeof opt);
    ps_info("%s %s starting: rank %d of %d servers, %d workers, mode %s (max-staleness %d), "
            "optimizer %s, %d update threads, max memory %llu bytes, wire dtype %s",
            PROG, PS_VERSION, cfg.rank, cfg.num_servers, cfg.num_workers, ps_mode_name(cfg.mode),
            cfg.max_staleness, opt, cfg.threads, (unsigned long long)cfg.max_memory,
            ps_dtype_name(cfg.wire_dtype));
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
                    : cfg.mode == PS_MODE_ASYNC
                        ? " (no push is acknowledged more than that past the last one written)"
                        : "",
                    cfg.restore ? ", restoring the newest" : "");
        static const char *const fail[] = {"stall (what waits for a checkpoint waits)",
                                           "continue without them", "exit"};
        ps_info("if checkpoint writes fail: %s (--on-checkpoint-failure)",
                fail[cfg.on_checkpoint_failure]);
    }
    if (cfg.worker_timeout_ms)
        ps_info("a worker silent for %.1f s is lost; then: %s", cfg.worker_timeout_ms / 1000.0,
                cfg.on_worker_loss == PS_LOSS_DROP ? "drop it" : "wait for it");
    char why[512];
    ps_server *s;
    rc = ps_server_open(&cfg, &s, why, sizeof why);
    if (rc) {
        ps_error("cannot start: %s", why);
        return ps_exit_status(rc); /* flags, keys, checkpoints: 2; the port, memory: 1 */
    }
    ps_info("listening on %s", ps_server_endpoint(s));
    g_server = s;
    if (g_stop) /* a signal that came while starting */
        ps_server_stop(s);
    pthread_t watcher;
    if (stdin_eof && pthread_create(&watcher, NULL, watch_stdin, NULL) == 0)
        pthread_detach(watcher);
    else if (stdin_eof)
        ps_warn("--exit-on-stdin-eof: cannot start the thread that watches stdin");
    rc = ps_server_run(s);
    pthread_mutex_lock(&g_watch_mu);
    g_server = NULL;
    pthread_mutex_unlock(&g_watch_mu);
    ps_server_close(s);
    ps_info("exit %d", rc ? 1 : 0);
    return rc ? 1 : 0;
}
