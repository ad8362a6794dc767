/* The run-settings table (common/ps_settings.h): its parser for each type
 * (bounds, both flag syntaxes, unknown flags, missing and bad values, the
 * environment), the rows' shape, --help and the README section listing
 * every row of a program, the same defaults in every program and libps, the
 * hello comparing every agreed row, and ps_launch forwarding exactly the
 * shared rows.  The README check itself is tests/test_readme_flags.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "plan.h"
#include "ps_client.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_settings.h"
#include "ps_test.h"
#include "server.h"
#include "train.h"

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})

static char why[1024];

static int argc_of(char **argv)
{
    int n = 0;
    while (argv[n])
        n++;
    return n;
}

/* argv parsed as ps_worker parses it (env: read the variables too) into c. */
static int worker_parse(ps_train_config *c, ps_settings_cmd *cmd, char **argv, int env)
{
    ps_train_config_default(c);
    memset(cmd, 0, sizeof *cmd);
    cmd->prog = "ps_worker";
    cmd->program = PS_PROG_WORKER;
    cmd->cfg = c;
    cmd->opt = &c->expect;
    cmd->env = env;
    cmd->fields = ps_train_config_fields(&cmd->nfields);
    why[0] = 0;
    return ps_settings_parse(cmd, argc_of(argv), argv, why, sizeof why);
}

/* ------------------------------------------------------------ the parser */

PS_TEST(parser_takes_every_type_as_flag_value_and_flag_equals_value)
{
    ps_train_config c;
    ps_settings_cmd cmd;
    CHECK_OK(worker_parse(&c, &cmd,
                          ARGV("--batch", "32", "--epochs=7", "--chunk-size", "64K",
                               "--server-timeout=2.5", "--mode", "async", "--wire-dtype=bf16",
                               "--shm", "off", "--model=cnn", "--data", "synthetic:64",
                               "--eval-all", "--quiet", "--lr=0.5", "--optimizer", "adam",
                               "--seed", "4611686018427387904"),
                          0));
    CHECK_EQ_INT(c.batch, 32);                 /* INT */
    CHECK_EQ_INT(c.epochs, 7);
    CHECK_EQ_INT(c.chunk_bytes, 64 << 10);     /* SIZE */
    CHECK_EQ_INT(c.server_timeout_ms, 2500);   /* SECS, in ms */
    CHECK_EQ_INT(c.mode, PS_MODE_ASYNC);       /* ENUM */
    CHECK_EQ_INT(c.wire_dtype, PS_DTYPE_BF16);
    CHECK_EQ_INT(c.shm, 0);
    CHECK_STR(c.model, "cnn");                 /* STR */
    CHECK_STR(c.data, "synthetic:64");
    CHECK_EQ_INT(c.eval_all, 1);               /* BOOL */
    CHECK_EQ_INT(cmd.log_level, PS_LOG_WARN);  /* LOG */
    CHECK_EQ_INT(c.seed, 1ull << 62);          /* the top of its range, in 64 bits */
    CHECK(c.expect.lr == 0.5f && (c.expect.given & PS_OPT_GIVEN(lr)));
    CHECK_EQ_INT(c.expect.kind, PS_OPT_ADAM);
    CHECK_STR(cmd.from[PS_SET_batch], "--batch");
    CHECK(cmd.from[PS_SET_steps] == NULL);     /* not given: the default */
    CHECK_EQ_INT(c.max_steps, 0);
    /* later flags win; a positive time stays at least 1 ms */
    CHECK_OK(worker_parse(&c, &cmd,
                          ARGV("--batch", "1", "--batch=65536", "--server-timeout", "0.0001"),
                          0));
    CHECK_EQ_INT(c.batch, 65536);
    CHECK_EQ_INT(c.server_timeout_ms, 1);
}

/* Each argv is refused by ps_worker's parser with exactly this message. */
static const struct {
    const char *msg;
    char *argv[8];
} refused[] = {
    {"ps_worker: unknown flag '--bogus' (see --help)", {"--batch", "2", "--bogus"}},
    {"ps_worker: unknown flag '--bogus' (see --help)", {"--bogus", "x"}},
    {"ps_worker: unknown flag '--bogus=1' (see --help)", {"--bogus=1"}},
    {"ps_worker: unexpected argument 'stray' (see --help)", {"stray"}},
    {"ps_worker: --batch needs a value (see --help)", {"--eval-all", "--batch"}},
    {"ps_worker: --eval-all takes no value, got '--eval-all=1'", {"--eval-all=1"}},
    {"ps_worker: --batch must be an integer in [1, 65536], got '0'", {"--batch", "0"}},
    {"ps_worker: --batch must be an integer in [1, 65536], got '65537'", {"--batch=65537"}},
    {"ps_worker: --batch must be an integer in [1, 65536], got '2x'", {"--batch", "2x"}},
    {"ps_worker: --chunk-size must be a size in [1024, 1073741824] bytes (suffix K, M, G "
     "allowed), got '1023'",
     {"--chunk-size", "1023"}},
    {"ps_worker: --chunk-size must be a size in [1024, 1073741824] bytes (suffix K, M, G "
     "allowed), got '2G'",
     {"--chunk-size", "2G"}},
    {"ps_worker: --server-timeout must be a number in [0, 86400], got '86401'",
     {"--server-timeout", "86401"}},
    {"ps_worker: --server-timeout must be a number in [0, 86400], got '-1'",
     {"--server-timeout=-1"}},
    {"ps_worker: --mode must be sync or async, got 'bsp'", {"--mode", "bsp"}},
    {"ps_worker: --wire-dtype must be f32, bf16 or f16, got 'f64'", {"--wire-dtype=f64"}},
    {"ps_worker: --shm must be auto or off, got 'on'", {"--shm", "on"}},
    {"ps_worker: --model needs a value of 1..900 characters, got ''", {"--model", ""}},
    {"ps_worker: --lr must be a number in [0, 1e+06], got 'x'", {"--lr=x"}},
    {"ps_worker: unknown flag '--bind' (see --help)", {"--bind", "tcp://*:1"}},
};

PS_TEST(parser_refuses_unknown_flags_missing_and_bad_values_with_a_message)
{
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char *argv[10] = {"ps_worker"};
        int n = 1;
        for (int k = 0; refused[i].argv[k]; k++)
            argv[n++] = refused[i].argv[k];
        argv[n] = NULL;
        ps_train_config c;
        ps_settings_cmd cmd;
        int rc = worker_parse(&c, &cmd, argv, 0);
        CHECK_MSG(rc == PS_EINVAL, "case %zu (%s): returned %d", i, refused[i].msg, rc);
        CHECK_STR(why, refused[i].msg);
    }
}

PS_TEST(parser_stops_at_help_version_and_dashdash)
{
    ps_train_config c;
    ps_settings_cmd cmd;
    CHECK_OK(worker_parse(&c, &cmd, ARGV("--batch", "3", "--help", "--bogus"), 0));
    CHECK_EQ_INT(cmd.help, 1);
    CHECK_EQ_INT(c.batch, 3);
    CHECK_OK(worker_parse(&c, &cmd, ARGV("-h"), 0));
    CHECK_EQ_INT(cmd.help, 1);
    CHECK_OK(worker_parse(&c, &cmd, ARGV("--version"), 0));
    CHECK_EQ_INT(cmd.help, 2);
    CHECK_OK(worker_parse(&c, &cmd, ARGV("--help-markdown"), 0));
    CHECK_EQ_INT(cmd.help, 3);
    /* a bad value before it is still refused */
    CHECK_EQ_INT(worker_parse(&c, &cmd, ARGV("--batch", "x", "--help"), 0), PS_EINVAL);
    /* "--" is a flag like any other unless the program stops there */
    CHECK_EQ_INT(worker_parse(&c, &cmd, ARGV("--", "--batch", "2"), 0), PS_EINVAL);
    CHECK_STR(why, "ps_worker: unknown flag '--' (see --help)");
}

/* Unset every variable a worker reads, so the environment of the test run
 * does not leak in. */
static void clear_worker_env(void)
{
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        for (const char *p = r->env; p && *p;) {
            char name[64];
            size_t n = strcspn(p, " ");
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            unsetenv(name);
            p += n + (p[n] == ' ');
        }
    }
    for (int i = 0; ps_opt_flag_names()[i]; i++) {
        char name[64];
        ps_settings_opt_env(ps_opt_flag_names()[i], name, sizeof name);
        unsetenv(name);
    }
}

PS_TEST(environment_fills_what_the_flags_do_not_give)
{
    ps_train_config c;
    ps_settings_cmd cmd;
    clear_worker_env();
    setenv("PS_MODE", "async", 1);
    setenv("PS_CHUNK_SIZE", "1M", 1);
    setenv("SLURM_PROCID", "3", 1);
    setenv("PMI_RANK", "5", 1);
    setenv("PS_NUM_WORKERS", "8", 1);
    setenv("PS_LR", "0.25", 1);
    CHECK_OK(worker_parse(&c, &cmd, ARGV("--chunk-size", "2M"), 1));
    CHECK_EQ_INT(c.mode, PS_MODE_ASYNC);
    CHECK_STR(cmd.from[PS_SET_mode], "PS_MODE");
    CHECK_EQ_INT(c.chunk_bytes, 2 << 20); /* the flag wins */
    CHECK_STR(cmd.from[PS_SET_chunk_size], "--chunk-size");
    CHECK_EQ_INT(c.rank, 3);              /* the first of the list that is set */
    CHECK_STR(cmd.from[PS_SET_rank], "SLURM_PROCID");
    CHECK_EQ_INT(c.num_workers, 8);
    CHECK(c.expect.lr == 0.25f && (c.expect.given & PS_OPT_GIVEN(lr)));
    /* without env (ps_server, ps_launch) nothing is read */
    CHECK_OK(worker_parse(&c, &cmd, ARGV("--batch", "2"), 0));
    CHECK_EQ_INT(c.mode, PS_MODE_SYNC);
    CHECK(cmd.from[PS_SET_mode] == NULL);
    /* a bad value names its variable */
    setenv("PS_MODE", "bsp", 1);
    CHECK_EQ_INT(worker_parse(&c, &cmd, ARGV("--batch", "2"), 1), PS_EINVAL);
    CHECK_STR(why, "ps_worker: --mode must be sync or async, got 'bsp' (from PS_MODE)");
    setenv("PS_MODE", "sync", 1);
    setenv("PS_LR", "fast", 1);
    CHECK_EQ_INT(worker_parse(&c, &cmd, ARGV("--batch", "2"), 1), PS_EINVAL);
    CHECK_STR(why, "ps_worker: --lr must be a number in [0, 1e+06], got 'fast' (from PS_LR)");
    clear_worker_env();
}

/* ------------------------------------------------------------ the rows */

/* Each program's bound fields: what its parser can write. */
static const ps_setting_field libps_fields[] = {PS_SETTING_FIELDS(LIBPS)};
static const ps_setting_field launch_fields[] = {PS_SETTING_FIELDS(LAUNCH)};

static int has_field(const ps_setting *r)
{
    return r->type <= PS_SETTING_BOOL;
}

PS_TEST(every_row_is_well_formed)
{
    const unsigned progs[] = {PS_PROG_SERVER, PS_PROG_WORKER, PS_PROG_LAUNCH, PS_PROG_LIBPS,
                              PS_PROG_KEYGEN};
    int nbound[5] = {0}, nserver, nworker;
    ps_server_config_fields(&nserver);
    ps_train_config_fields(&nworker);
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        long long v;
        /* a flag, its help; a default the row takes */
        CHECK_MSG(r->help && *r->help, "row %d has no help", id);
        CHECK_MSG(r->type == PS_SETTING_HEAD || r->type == PS_SETTING_OPT ||
                      r->type == PS_SETTING_SHARED || !strncmp(r->flag, "--", 2),
                  "row %d: flag '%s'", id, r->flag);
        CHECK_MSG(!r->def || r->type == PS_SETTING_BOOL ||
                      ps_setting_parse_value("t", r->flag, r, r->def, &v, why, sizeof why) == 0,
                  "%s: its default '%s' is refused: %s", r->flag, r->def, why);
        /* one row per flag and program */
        CHECK_MSG(r->progs, "row %d belongs to no program", id);
        for (int k = 0; k < 5 && r->flag[0]; k++)
            if (r->progs & progs[k])
                CHECK_MSG(ps_setting_find(progs[k], r->flag) == id, "%s twice for program %u",
                          r->flag, progs[k]);
        for (int k = 0; k < 5; k++)
            nbound[k] += (r->progs & progs[k]) && has_field(r);
        /* an ENUM's names in arg are choices; a hello key only on rows both sides take */
        for (const char *p = r->type == PS_SETTING_ENUM ? r->arg : ""; *p;) {
            char name[32];
            size_t n = strcspn(p, "|");
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            CHECK_MSG(ps_setting_parse_value("t", r->flag, r, name, &v, why, sizeof why) == 0,
                      "%s: '%s' of its arg is not a choice", r->flag, name);
            p += n + (p[n] == '|');
        }
        if (r->hello)
            CHECK_MSG(r->progs & PS_PROG_SERVER, "%s: a hello key on a row no server takes",
                      r->flag);
    }
    /* every row with a field is bound in each program that takes it */
    CHECK_EQ_INT(nserver, nbound[0]);
    CHECK_EQ_INT(nworker, nbound[1]);
    CHECK_EQ_INT((int)(sizeof launch_fields / sizeof launch_fields[0]), nbound[2]);
    CHECK_EQ_INT((int)(sizeof libps_fields / sizeof libps_fields[0]), nbound[3]);
}

PS_TEST(enum_rows_use_the_wire_names_and_values)
{
    const ps_setting *m = ps_setting_at(PS_SET_mode), *d = ps_setting_at(PS_SET_wire_dtype);
    for (int v = PS_MODE_SYNC; v <= PS_MODE_ASYNC; v++) {
        int parsed;
        CHECK_STR(ps_setting_choice_name(m, v), ps_mode_name(v));
        CHECK_OK(ps_mode_parse(ps_setting_choice_name(m, v), &parsed));
        CHECK_EQ_INT(parsed, v);
    }
    static const char *const names[] = {"f32", "float32", "bf16", "bfloat16", "f16", "float16",
                                        "fp16"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        uint32_t want;
        long long got;
        CHECK_OK(ps_dtype_parse(names[i], &want));
        CHECK_OK(ps_setting_parse_value("t", "--wire-dtype", d, names[i], &got, why, sizeof why));
        CHECK_EQ_INT(got, want);
        CHECK_STR(ps_setting_choice_name(d, got), ps_dtype_name(want));
    }
}

/* ------------------------------------------------------------ help */

/* What f writes for program prog, into a string the caller frees. */
static char *capture(void (*f)(FILE *, unsigned), unsigned prog)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m)
        return NULL;
    f(m, prog);
    fclose(m);
    return buf;
}

/* Does text list every row of prog: its flag with its argument (help: as
 * is; the README: with | escaped), headings, the optimizer's flags? */
static int lists_every_row(const char *text, unsigned prog, int md, char *missing, size_t len)
{
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        char want[128] = "";
        if (!(r->progs & prog))
            continue;
        if (r->type == PS_SETTING_HEAD)
            snprintf(want, sizeof want, "%s", md ? "" : r->help);
        else if (r->type == PS_SETTING_OPT || r->type == PS_SETTING_SHARED)
            snprintf(want, sizeof want, "--lr-decay-every N");
        else {
            char head[128];
            size_t o = 0;
            snprintf(head, sizeof head, "%s%s%s", r->flag, r->arg[0] ? " " : "", r->arg);
            for (const char *p = head; *p && o + 2 < sizeof want; p++) {
                if (md && *p == '|')
                    want[o++] = '\\';
                want[o++] = *p;
            }
            want[o] = 0;
        }
        if (!strstr(text, want)) {
            snprintf(missing, len, "%s", want);
            return 0;
        }
    }
    return 1;
}

PS_TEST(help_and_readme_list_every_row_of_their_program)
{
    const unsigned progs[] = {PS_PROG_SERVER, PS_PROG_WORKER, PS_PROG_LAUNCH, PS_PROG_KEYGEN};
    char missing[128];
    for (int k = 0; k < 4; k++) {
        char *help = capture(ps_settings_usage, progs[k]);
        char *md = capture(ps_settings_markdown, progs[k]);
        CHECK(help && md);
        int h = lists_every_row(help, progs[k], 0, missing, sizeof missing);
        if (h)
            h = lists_every_row(md, progs[k], 1, missing, sizeof missing) ? 1 : 2;
        /* and no flag of another program's rows alone */
        int foreign = (progs[k] == PS_PROG_SERVER && strstr(help, "--batch")) ||
                      (progs[k] == PS_PROG_WORKER && strstr(help, "--bind")) ||
                      (progs[k] == PS_PROG_LAUNCH && strstr(help, "--eval-every")) ||
                      (progs[k] == PS_PROG_KEYGEN && strstr(help, "--mode"));
        free(help);
        free(md);
        CHECK_MSG(h == 1, "program %u: %s lacks '%s'", progs[k], h ? "the README table" : "--help",
                  missing);
        CHECK_MSG(!foreign, "program %u's help lists another program's flag", progs[k]);
    }
}

/* s with every run of spaces and newlines one space (help wraps lines) */
static void unwrap(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++)
        if (!((*p == ' ' || *p == '\n') && o > s && o[-1] == ' '))
            *o++ = *p == '\n' ? ' ' : *p;
    *o = 0;
}

PS_TEST(help_names_the_variables_of_a_worker_alone)
{
    char *worker = capture(ps_settings_usage, PS_PROG_WORKER);
    char *server = capture(ps_settings_usage, PS_PROG_SERVER);
    CHECK(worker && server);
    unwrap(worker);
    unwrap(server);
    int w = strstr(worker, "env PS_RANK, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK") &&
            strstr(worker, "default sync; env PS_MODE");
    int s = strstr(server, "env PS_") == NULL && strstr(server, "(default sync)");
    free(worker);
    free(server);
    CHECK(w);
    CHECK(s);
}

/* ------------------------------------------------------------ defaults */

/* Does every field of fields hold its row's default?  server: a server's
 * config in sync holds staleness 0, the one value sync takes. */
static int holds_defaults(const ps_setting_field *fields, int n, const void *cfg, int server,
                          char *bad, size_t len)
{
    for (int i = 0; i < n; i++) {
        const ps_setting *r = ps_setting_at(fields[i].id);
        if (fields[i].id == PS_SET_lch_servers || fields[i].id == PS_SET_lch_workers)
            continue; /* ps_launch needs them given */
        long long want = r->type == PS_SETTING_STR ? r->def != NULL : ps_setting_default(r);
        if (server && fields[i].id == PS_SET_max_staleness)
            want = 0;
        if (server && fields[i].id == PS_SET_max_memory) { /* no default text: the host's */
            if (ps_setting_field_get(&fields[i], cfg) < (64ll << 20)) {
                snprintf(bad, len, "%s is %lld, below the least of its automatic value",
                         r->flag, ps_setting_field_get(&fields[i], cfg));
                return 0;
            }
            continue; /* MemAvailable moves between two reads */
        }
        if (ps_setting_field_get(&fields[i], cfg) != want) {
            snprintf(bad, len, "%s is %lld, the table says %lld", r->flag,
                     ps_setting_field_get(&fields[i], cfg), want);
            return 0;
        }
    }
    return 1;
}

PS_TEST(defaults_are_the_tables_in_every_program_and_libps)
{
    char bad[256] = "";
    int n;
    ps_server_config s;
    ps_server_config_default(&s);
    const ps_setting_field *f = ps_server_config_fields(&n);
    CHECK_MSG(holds_defaults(f, n, &s, 1, bad, sizeof bad), "ps_server: %s", bad);
    ps_train_config w;
    ps_train_config_default(&w);
    f = ps_train_config_fields(&n);
    CHECK_MSG(holds_defaults(f, n, &w, 0, bad, sizeof bad), "ps_worker: %s", bad);
    CHECK_STR(w.model, "mlp:784-256-128-10");
    ps_client_options o;
    ps_client_options_default(&o);
    n = (int)(sizeof libps_fields / sizeof libps_fields[0]);
    CHECK_MSG(holds_defaults(libps_fields, n, &o, 0, bad, sizeof bad), "libps: %s", bad);
    ps_launch_opts l;
    char *argv[] = {"ps_launch", "--servers", "1", "--workers", "1", NULL};
    CHECK_OK(ps_launch_parse(5, argv, &l, why, sizeof why));
    n = (int)(sizeof launch_fields / sizeof launch_fields[0]);
    int lok = holds_defaults(launch_fields, n, &l, 0, bad, sizeof bad);
    ps_launch_opts_free(&l);
    CHECK_MSG(lok, "ps_launch: %s", bad);
    /* one default mode everywhere */
    CHECK(s.mode == PS_MODE_SYNC && w.mode == PS_MODE_SYNC && o.mode == PS_MODE_SYNC &&
          l.mode == PS_MODE_SYNC);
    CHECK(ps_server_config_check(&(ps_server_config){0}, why, sizeof why) == PS_EINVAL);
    s.bind = "tcp://127.0.0.1:1";
    CHECK_MSG(ps_server_config_check(&s, why, sizeof why) == 0, "%s", why);
    /* what libps takes 0 for is the table's default too */
    CHECK_EQ_INT(PSC_DEFAULT_CHUNK_BYTES, ps_setting_default(ps_setting_at(PS_SET_chunk_size)));
    CHECK_EQ_INT(PSC_DEFAULT_HELLO_MS, ps_setting_default(ps_setting_at(PS_SET_hello_timeout)));
    /* and ps.Client learns them, and the variables, through libps */
    const char *env, *def;
    CHECK_OK(ps_client_setting("mode", &env, &def));
    CHECK_STR(env, "PS_MODE");
    CHECK_STR(def, "sync");
    CHECK_OK(ps_client_setting("rank", &env, NULL));
    CHECK_STR(env, "PS_RANK RANK SLURM_PROCID OMPI_COMM_WORLD_RANK PMI_RANK");
    CHECK_EQ_INT(ps_client_setting("bind", &env, &def), PS_ENOTFOUND); /* a server's */
    CHECK_EQ_INT(ps_client_setting(NULL, &env, &def), PS_ENOTFOUND);
}

/* ------------------------------------------------------------ hello */

static void hello_base(ps_hello *h)
{
    memset(h, 0, sizeof *h);
    h->mode = PS_MODE_SYNC;
    h->num_workers = 2;
    h->num_servers = 2;
    h->wire_dtype = PS_DTYPE_F32;
}

PS_TEST(hello_carries_and_compares_every_agreed_row_naming_both_values)
{
    /* the wire keys stay what they were (docs/PROTOCOL.md) */
    char keys[64] = "";
    for (int i = 0; i < ps_hello_nagreed(); i++)
        snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s", i ? " " : "",
                 ps_hello_agreed(i)->hello);
    CHECK_STR(keys, "ns nw mode stal dt");
    for (int i = 0; i < ps_hello_nagreed(); i++) {
        const ps_setting *r = ps_hello_agreed(i);
        ps_hello a, b;
        hello_base(&a);
        hello_base(&b);
        long long lo, hi;
        ps_setting_range(r, &lo, &hi);
        int64_t x = ps_hello_get(&a, i), y = x < hi ? x + 1 : lo;
        ps_hello_set(&b, i, y);
        CHECK_OK(ps_hello_compare(&a, "wA", &a, "sB", 1, why, sizeof why));
        CHECK_EQ_INT(ps_hello_compare(&a, "worker 3", &b, "server 1", 1, why, sizeof why),
                     PS_EMISMATCH);
        char xs[32], ys[32], want[128];
        if (r->type == PS_SETTING_ENUM) {
            snprintf(xs, sizeof xs, "%s", ps_setting_choice_name(r, x));
            snprintf(ys, sizeof ys, "%s", ps_setting_choice_name(r, y));
        } else {
            snprintf(xs, sizeof xs, "%lld", (long long)x);
            snprintf(ys, sizeof ys, "%lld", (long long)y);
        }
        snprintf(want, sizeof want, "%s: worker 3 has %s, server 1 has %s",
                 ps_setting_name(r), xs, ys);
        CHECK_MSG(!strncmp(why, want, strlen(want)), "'%s' does not start with '%s'", why, want);
        /* the value goes over the wire under its key */
        ps_header h, d;
        ps_header_init(&h, PS_MSG_HELLO);
        h.hello = b;
        char buf[PS_HEADER_MAX];
        size_t n;
        CHECK_OK(ps_proto_encode(&h, buf, sizeof buf, &n));
        CHECK(memmem(buf, n, r->hello, strlen(r->hello)) != NULL);
        CHECK_OK(ps_proto_decode(buf, n, &d, why, sizeof why));
        CHECK_EQ_INT(ps_hello_get(&d.hello, i), y);
    }
    /* a value out of the row's range is a protocol error naming the key */
    ps_header h, d;
    ps_header_init(&h, PS_MSG_HELLO);
    hello_base(&h.hello);
    h.hello.max_staleness = -2;
    char buf[PS_HEADER_MAX];
    size_t n;
    CHECK_OK(ps_proto_encode(&h, buf, sizeof buf, &n));
    CHECK_EQ_INT(ps_proto_decode(buf, n, &d, why, sizeof why), PS_EPROTO);
    CHECK_STR(why, "field 'h.stal' must be an integer in [-1, 1000000]");
}

/* ------------------------------------------------------------ ps_launch */

/* argv parsed by ps_launch and planned on this host (one port, no GPU). */
static int launch_plan(int argc, char **argv, ps_launch_opts *o, ps_launch_plan *p)
{
    static int port = 41001;
    memset(p, 0, sizeof *p);
    int rc = ps_launch_parse(argc, argv, o, why, sizeof why);
    ps_launch_site site = {.ports = &port, .bin_dir = "/b", .remote_dir = "/w"};
    return rc ? rc : ps_launch_plan_build(o, &site, p, why, sizeof why);
}

/* A value row r takes other than its default: an ENUM's last name, a
 * number in range, a path. */
static const char *sample(const ps_setting *r, char *buf, size_t len)
{
    if (r->type == PS_SETTING_ENUM)
        return strrchr(r->arg, '|') + 1;
    if (r->type == PS_SETTING_INT) {
        snprintf(buf, len, "%lld", r->lo + 4);
        return buf;
    }
    return "keys";
}

PS_TEST(ps_launch_forwards_exactly_the_shared_rows)
{
    static char vals[PS_SET_N][32];
    for (int among_worker_flags = 0; among_worker_flags < 2; among_worker_flags++) {
        char *argv[64] = {"ps_launch", "--servers", "1", "--workers", "1", "--gpus", "none",
                          "--mode", "async"};
        int n = 9, nshared = 0;
        char *shared[32];
        for (int id = 0; id < PS_SET_N; id++) {
            const ps_setting *r = ps_setting_at(id);
            if (!(r->props & PS_SET_SHARED))
                continue;
            shared[nshared++] = (char *)r->flag;
            shared[nshared++] = (char *)sample(r, vals[id], sizeof vals[id]);
        }
        shared[nshared++] = "--lr";
        shared[nshared++] = "0.5";
        if (among_worker_flags)
            argv[n++] = "--";
        for (int k = 0; k < nshared; k++)
            argv[n++] = shared[k];
        if (!among_worker_flags)
            argv[n++] = "--";
        argv[n++] = "--batch"; /* a worker's own: not the servers' */
        argv[n++] = "8";
        argv[n] = NULL;
        ps_launch_opts o;
        ps_launch_plan p;
        int rc = launch_plan(n, argv, &o, &p);
        CHECK_MSG(rc == 0, "%s", why);
        /* the server's argv: what ps_launch sets, then exactly the shared flags */
        char want[1024];
        size_t w = (size_t)snprintf(want, sizeof want,
                                    "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 "
                                    "--num-servers 1 --num-workers 1 --mode async --threads 1");
        for (int k = 0; k < nshared; k++)
            w += (size_t)snprintf(want + w, sizeof want - w, " %s", shared[k]);
        char got[2][1024];
        for (int c = 0; c < 2; c++) /* the server, the worker */
            for (int k = 0, g = 0; k < p.cmds[c].argv.n; k++)
                g += snprintf(got[c] + g, sizeof got[c] - (size_t)g, "%s%s", k ? " " : "",
                              p.cmds[c].argv.v[k]);
        ps_launch_plan_free(&p);
        ps_launch_opts_free(&o);
        CHECK_STR(got[0], want);
        /* and the worker gets each of them too */
        for (int k = 0; k < nshared; k += 2) {
            char pair[128];
            snprintf(pair, sizeof pair, " %s %s", shared[k], shared[k + 1]);
            CHECK_MSG(strstr(got[1], pair), "the worker lacks '%s': %s", pair, got[1]);
        }
    }
}

PS_TEST(ps_launch_exec_worker_gets_each_setting_in_its_variable)
{
    static char vals[PS_SET_N][32];
    const char *given[PS_SET_N] = {0};
    char *argv[64] = {"ps_launch", "--servers", "1", "--workers", "2", "--gpus", "none",
                      "--mode", "async", "--timeline-dir", "tl"};
    int n = 11;
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        if (r->props & PS_SET_SHARED) {
            argv[n++] = (char *)r->flag;
            argv[n++] = (char *)(given[id] = sample(r, vals[id], sizeof vals[id]));
        }
    }
    argv[n++] = "--exec";
    argv[n++] = "w";
    argv[n] = NULL;
    ps_launch_opts o;
    ps_launch_plan p;
    int rc = launch_plan(n, argv, &o, &p);
    CHECK_MSG(rc == 0, "%s", why);
    const ps_strvec *e = &p.cmds[2].env; /* worker 1 */
    /* what ps_worker would get as flags: servers, rank, sizes, mode, the
     * servers' staleness, device, timeline, and each shared row given */
    char want[PS_SET_N][96];
    int nwant = 0;
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = ps_setting_at(id);
        const char *v = id == PS_SET_servers        ? "tcp://127.0.0.1:41001"
                        : id == PS_SET_rank         ? "1"
                        : id == PS_SET_num_servers  ? "1"
                        : id == PS_SET_num_workers  ? "2"
                        : id == PS_SET_mode         ? "async"
                        : id == PS_SET_device       ? "cpu"
                        : id == PS_SET_wrk_timeline ? "tl/worker-1.json"
                        : given[id];
        if (r->env && v)
            snprintf(want[nwant++], sizeof want[0], "%.*s=%s", (int)strcspn(r->env, " "), r->env,
                     v);
    }
    int same = e->n == nwant;
    for (int k = 0; same && k < nwant; k++)
        same = !strcmp(e->v[k], want[k]);
    int shown = e->n;
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    CHECK_MSG(same, "worker 1 has %d variables, the table gives %d (first: %s)", shown, nwant,
              want[0]);
}
