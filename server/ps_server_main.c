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
#include "ps_settings.h"
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

static const char usage_head[] =
    "usage: ps_server --bind ENDPOINT [--rank R --num-servers S] [--num-workers W]\n"
    "                 [--mode sync|async] [options]\n"
    "\n"
    "One parameter-server shard: holds its chunks of the model, applies the\n"
    "optimizer to the gradients workers push, and serves pulls (docs/PROTOCOL.md).\n"
    "Flags take their value as --flag VALUE or --flag=VALUE.\n"
    "\n";

static const char usage_tail[] =
    "\n"
    "SIGINT, SIGTERM and SIGUSR1 stop it: last checkpoint, 'stopped:' line.  SIGUSR1\n"
    "is the signal mpirun passes on to its processes as it is (on SIGTERM it kills\n"
    "them within seconds).\n"
    "\n"
    "Exit status: 0 after SIGINT, SIGTERM, SIGUSR1 or an allowed SHUTDOWN message; 1\n"
    "when a socket or the update threads fail while running (or the port is taken);\n"
    "2 for something to fix first: a bad flag, unusable CURVE keys or admin token\n"
    "file, a --restore with no valid checkpoint or one written with another\n"
    "configuration.\n";

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

/* What main keeps of the flags the table leaves to the program. */
typedef struct own_flags {
    ps_server_config *c;
    char *bind_buf;     /* the checked --bind */
    size_t bind_cap;
    int stdin_eof;      /* --exit-on-stdin-eof */
    int every_given;    /* --checkpoint-every */
} own_flags;

/* --on-checkpoint-failure stall[:S]|continue|exit[:S] */
static int on_checkpoint_failure(ps_server_config *c, const char *val, char *why, size_t len)
{
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
    else {
        snprintf(why, len, "%s: --on-checkpoint-failure must be stall[:S], continue or "
                 "exit[:S] (S: seconds, 0.1..86400), got '%s'", PROG, val);
        return PS_EINVAL;
    }
    c->checkpoint_failure_ms = (int)(secs * 1000.0 + 0.5);
    return 0;
}

/* --checkpoint-every N|Ts */
static int checkpoint_every(ps_server_config *c, const char *val, char *why, size_t len)
{
    size_t n = strlen(val);
    long long iv;
    double fv;
    int rc;
    if (n > 1 && val[n - 1] == 's') {
        char num[64];
        snprintf(num, sizeof num, "%.*s", (int)(n - 1), val);
        if (!(rc = ps_parse_float(PROG, "--checkpoint-every", num, 0.001, 1e6, &fv, why, len))) {
            c->checkpoint_every_ms = (int)(fv * 1000.0 + 0.5);
            c->checkpoint_every = 0;
        }
    } else if (!(rc = ps_parse_int(PROG, "--checkpoint-every", val, 1, 1ll << 40, &iv, why,
                                   len))) {
        c->checkpoint_every = iv;
        c->checkpoint_every_ms = 0;
    }
    if (rc)
        snprintf(why, len, "%s: --checkpoint-every must be a count N >= 1 (rounds in sync, "
                 "pushes in async) or seconds like 30s, got '%s'", PROG, val);
    return rc;
}

static int own_flag(void *ctx, int id, const char *flag, const char *val, char *why, size_t len)
{
    own_flags *o = ctx;
    char msg[400];
    (void)flag;
    switch (id) {
    case PS_SET_bind:
        if (ps_endpoint_check(val, 1, o->bind_buf, o->bind_cap, msg, sizeof msg)) {
            snprintf(why, len, "%s: --bind: %s", PROG, msg);
            return PS_EINVAL;
        }
        o->c->bind = o->bind_buf;
        return 0;
    case PS_SET_checkpoint_every:
        o->every_given = 1;
        return checkpoint_every(o->c, val, why, len);
    case PS_SET_on_checkpoint_failure:
        return on_checkpoint_failure(o->c, val, why, len);
    case PS_SET_exit_on_stdin_eof:
        o->stdin_eof = 1;
        return 0;
    default:
        snprintf(why, len, "%s: %s is not handled here", PROG, flag);
        return PS_EINVAL;
    }
}

/* Parse argv into c (bind_buf holds the checked --bind).  Returns -1 to go
 * on, or the exit status. */
static int parse(int argc, char **argv, ps_server_config *c, int *log_level, int *stdin_eof,
                 int *memory_given, char *bind_buf, size_t bind_cap)
{
    own_flags own = {c, bind_buf, bind_cap, 0, 0};
    ps_settings_cmd cmd = {.prog = PROG, .program = PS_PROG_SERVER, .cfg = c, .opt = &c->opt,
                           .own = own_flag, .ctx = &own};
    cmd.fields = ps_server_config_fields(&cmd.nfields);
    char why[640];
    if (ps_settings_parse(&cmd, argc, argv, why, sizeof why))
        return ps_flag_error(why);
    if (cmd.help) {
        ps_settings_print_help(cmd.prog, cmd.program, cmd.help, usage_head, usage_tail);
        return 0;
    }
    *log_level = cmd.log_level;
    *stdin_eof = own.stdin_eof;
    *memory_given = cmd.from[PS_SET_max_memory] != NULL;
    if (!c->bind)
        return ps_flag_error(PROG ": --bind is required, e.g. --bind tcp://*:5555 (see --help)");
    if (c->rank >= c->num_servers && !c->added)
        return bad("%s: --rank must be an integer in [0, %d] (--num-servers %d), got '%d'", PROG,
                   c->num_servers - 1, c->num_servers, c->rank);
    if (!c->checkpoint_dir && (own.every_given || c->restore))
        return ps_flag_error(PROG ": --checkpoint-every and --restore need --checkpoint-dir "
                             "DIR (see --help)");
    if (c->checkpoint_dir && !own.every_given)
        c->checkpoint_every_ms = 60000;
    if (c->on_worker_loss == PS_LOSS_DROP && c->worker_timeout_ms == 0)
        return ps_flag_error(PROG ": --on-worker-loss drop needs --worker-timeout S (see --help)");
    /* sync is staleness 0; async without --max-staleness is unbounded */
    int staleness_given = cmd.from[PS_SET_max_staleness] != NULL;
    if (c->mode == PS_MODE_SYNC) {
        if (staleness_given && c->max_staleness != 0)
            return bad("%s: --max-staleness must be 0 in sync mode, got '%d'", PROG,
                       c->max_staleness);
        c->max_staleness = 0;
    } else if (!staleness_given) {
        c->max_staleness = -1;
    }
    return -1;
}

int main(int argc, char **argv)
{
    ps_server_config cfg;
    ps_server_config_default(&cfg);
    int level = PS_LOG_INFO, stdin_eof = 0, memory_given = 0;
    ps_log_init(PROG, -1);
    char bind[PS_ENDPOINT_MAX];
    int rc = parse(argc, argv, &cfg, &level, &stdin_eof, &memory_given, bind, sizeof bind);
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
    char mem[160];
    uint64_t avail = 0;
    if (!memory_given) /* read again: the line says what it was taken from */
        cfg.max_memory = ps_server_auto_memory(&avail);
    if (memory_given)
        snprintf(mem, sizeof mem, "--max-memory");
    else if (avail)
        snprintf(mem, sizeof mem, "half of the %llu bytes MemAvailable said at start; "
                 "--max-memory to set it", (unsigned long long)avail);
    else
        snprintf(mem, sizeof mem, "/proc/meminfo said no MemAvailable; --max-memory to set it");
    ps_info("%s %s starting: rank %d of %d servers, %d workers, mode %s (max-staleness %d), "
            "optimizer %s, %d update threads, max memory %llu bytes (%s), table rows per "
            "worker %llu bytes%s, at most %d tables, wire dtype %s",
            PROG, PS_VERSION, cfg.rank, cfg.num_servers, cfg.num_workers, ps_mode_name(cfg.mode),
            cfg.max_staleness, opt, cfg.threads, (unsigned long long)cfg.max_memory, mem,
            (unsigned long long)ps_server_worker_share(&cfg),
            cfg.table_memory_per_worker ? "" : " (--max-memory x 1.25 / workers)",
            cfg.max_tables, ps_dtype_name(cfg.wire_dtype));
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
