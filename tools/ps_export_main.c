/* ps_export: an export of a job's model to a folder (docs/OPERATIONS.md
 * "Export and serve"): from its live servers, as a reader (libps's
 * ps_client_export), or from its checkpoints with no server running
 * (export_ckpt.h).  This file is flags and messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_ckpt.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_flags.h"
#include "ps_log.h"
#include "ps_time.h"

#define P "ps_export"

/* The flags, one row each: X(field, flag, arg, help).  ps_export is an
 * operator's tool, not one of the job's programs: its flags are its own
 * (common/ps_settings.h is the job's). */
#define EXPORT_FLAGS(X)                                                                    \
    X(out, "--out", "DIR", "the export's folder (must not exist, or be empty)")           \
    X(servers, "--servers", "EPS", "a live job's servers, comma-separated endpoints in "  \
      "rank order (tcp://HOST:PORT,...): ps_export reads as a reader (rank -1)")          \
    X(checkpoint_dir, "--checkpoint-dir", "DIR", "instead: the job's checkpoints "       \
      "(ps_server --checkpoint-dir), no server running; each server's newest chain")      \
    X(step, "--step", "V", "live, sync: every tensor and table at version V (default: "  \
      "the newest any server has; one a round behind it is waited for)")                  \
    X(wait, "--wait", "SECONDS", "live: how long a partition one version behind is "      \
      "waited for (default 10)")                                                          \
    X(no_state, "--no-state", "", "leave the optimizer's state out (the rows and "        \
      "weights only)")                                                                    \
    X(curve_keys, "--curve-keys", "DIR", "live: CURVE, with DIR/reader.key (a reader "    \
      "key: docs/SECURITY.md) and the servers' server-*.pub")                            \
    X(timeout, "--timeout", "SECONDS", "live: how long to wait for a server (default "    \
      "30)")                                                                              \
    X(quiet, "--quiet", "", "only errors on stderr")                                      \
    X(help, "--help", "", "this text")                                                    \
    X(version, "--version", "", "ps_export's version")

typedef struct opts {
#define FIELD_(f, flag, arg, help) const char *f;
    EXPORT_FLAGS(FIELD_)
#undef FIELD_
} opts;

/* "  --flag ARG   help", the help wrapped at 79 columns under itself */
static void help_line(FILE *o, const char *flag, const char *arg, const char *help)
{
    int col = fprintf(o, "  %s%s%s", flag, *arg ? " " : "", arg);
    fprintf(o, "%*s", col < 25 ? 25 - col : 1, "");
    col = col < 25 ? 25 : col + 1;
    const char *p = help;
    int first = 1;
    while (*p) {
        const char *sp = p;
        while (*sp && *sp != ' ')
            sp++;
        int w = (int)(sp - p);
        if (!first && col + 1 + w > 79) {
            fprintf(o, "\n%25s", "");
            col = 25;
        } else if (!first) {
            fputc(' ', o);
            col++;
        }
        fprintf(o, "%.*s", w, p);
        col += w;
        first = 0;
        p = sp;
        while (*p == ' ')
            p++;
    }
    fputc('\n', o);
}

static void usage(FILE *o)
{
    fprintf(o, "usage: ps_export --out DIR (--servers EPS | --checkpoint-dir DIR) [flags]\n\n"
               "Writes a job's model to DIR: manifest.json, dense/KEY.weights.npy, and per "
               "table\ntables/KEY.ids.npy (sorted), KEY.weights.npy and the optimizer's state "
               "(numpy\nreads them: numpy.load(path, mmap_mode=\"r\")).  ps_server --import DIR "
               "starts a new\njob's tables from it on any number of servers; ps.torch's "
               "opt.export(path) writes\nthe same and model.pt, the plain model's state_dict.\n"
               "\nflags (--flag VALUE or --flag=VALUE):\n");
#define HELP_(f, flag, arg, help) help_line(o, flag, arg, help);
    EXPORT_FLAGS(HELP_)
#undef HELP_
    fprintf(o, "\nExit status: 0 written; 1 the export failed (said why); 2 bad flags.\n\n"
               "examples:\n  ps_export --servers tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 "
               "--out model-0412\n  ps_export --checkpoint-dir /ckpt/job7 --out model-0412\n");
}

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t fl = eq ? (size_t)(eq - a) : strlen(a);
        int known = 0;
#define MATCH_(f, flag, arg, help)                                                         \
        if (!known && strlen(flag) == fl && !strncmp(a, flag, fl)) {                      \
            known = 1;                                                                     \
            if (!*arg) {                                                                   \
                o->f = "1";                                                                \
            } else if (eq) {                                                               \
                o->f = eq + 1;                                                             \
            } else if (i + 1 < argc) {                                                     \
                o->f = argv[++i];                                                          \
            } else {                                                                       \
                fprintf(stderr, P ": %s needs a value (%s)\n", flag, arg);                \
                return 2;                                                                  \
            }                                                                              \
        }
        EXPORT_FLAGS(MATCH_)
#undef MATCH_
        if (!known) {
            fprintf(stderr, P ": unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (o.version) {
        printf("ps_export " PS_VERSION "\n");
        return 0;
    }
    if (!o.out || (!o.servers == !o.checkpoint_dir)) {
        fprintf(stderr, P ": give --out DIR and one of --servers EPS (a live job) or "
                        "--checkpoint-dir DIR (its checkpoints)\n");
        return 2;
    }
    ps_log_init(P, -1);
    if (o.quiet)
        ps_log_set_level(PS_LOG_ERROR);
    char why[1024];
    long long version = -1, wait_s = 10, timeout_s = 30;
    if ((o.step && ps_parse_int(P, "--step", o.step, 0, INT64_MAX / 4, &version, why,
                                sizeof why)) ||
        (o.wait && ps_parse_int(P, "--wait", o.wait, 0, 600, &wait_s, why, sizeof why)) ||
        (o.timeout && ps_parse_int(P, "--timeout", o.timeout, 1, 86400, &timeout_s, why,
                                   sizeof why)))
        return ps_flag_error(why);
    if (o.checkpoint_dir && (o.step || o.wait || o.curve_keys || o.timeout))
        return ps_flag_error(P ": --step, --wait, --curve-keys and --timeout are for a live job "
                                "(--servers)");
    int with_state = !o.no_state;
    int64_t t0 = ps_now_ns();
    uint64_t bytes = 0;
    if (o.checkpoint_dir) {
        rc = ps_export_checkpoints(o.checkpoint_dir, o.out, with_state, &bytes, why, sizeof why);
        if (rc) {
            fprintf(stderr, P ": %s\n", why);
            return 1;
        }
        ps_info("exported the checkpoints of %s to %s: %.1f MiB in %.2f s", o.checkpoint_dir,
                o.out, (double)bytes / 1048576.0, (double)(ps_now_ns() - t0) / 1e9);
        return 0;
    }
    ps_client_options co;
    ps_client_options_default(&co);
    co.servers = o.servers;
    co.rank = PS_RANK_READER;
    co.curve_dir = o.curve_keys;
    co.hello_timeout_ms = (int)timeout_s * 1000;
    co.request_timeout_ms = 5000;
    co.server_timeout_ms = (int)timeout_s * 1000;
    ps_client *c;
    if (ps_client_open(&co, &c) != 0) {
        fprintf(stderr, P ": %s\n", ps_client_last_error(NULL));
        return 1;
    }
    if ((rc = ps_client_start(c)) == 0)
        rc = ps_client_export(c, o.out, with_state ? PS_EXPORT_STATE : 0, version, NULL, NULL, 0,
                              (int)wait_s * 1000);
    if (rc)
        fprintf(stderr, P ": %s\n", ps_client_last_error(c));
    ps_client_close(c);
    return rc ? 1 : 0;
}
