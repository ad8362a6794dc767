/* launch/plan: ps_launch's plan built from argv arrays, without starting
 * anything: the exact command lines and environment of every process, the
 * flags and values it refuses (with their messages), hostfile parsing, GPU
 * lists, and what it prints.  tests/test_launch.sh runs the real program. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>

#include "launch_metrics.h"
#include "plan.h"
#include "ps_error.h"
#include "remote.h"
#include "ps_test.h"

#define ARGV(...) ((char *[]){"ps_launch", __VA_ARGS__, NULL})

static int argc_of(char **argv)
{
    int n = 0;
    while (argv[n])
        n++;
    return n;
}

static char why[1024];

/* Parse argv (an ARGV(...) literal, which lives only as long as the
 * statement that made it: o keeps pointers into a copy that stays until the
 * next parse). */
static int parse(ps_launch_opts *o, char **argv)
{
    static char *kept[64];
    int n = argc_of(argv);
    if (n >= 64)
        return -1;
    memcpy(kept, argv, (size_t)(n + 1) * sizeof *argv);
    why[0] = 0;
    return ps_launch_parse(n, kept, o, why, sizeof why);
}

/* argv joined with spaces (static buffer). */
static const char *joined(const ps_strvec *v)
{
    static char buf[8192];
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < v->n; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? " " : "", v->v[i]);
    return buf;
}

/* ------------------------------------------------------------ flags */

PS_TEST(parse_gives_the_defaults)
{
    ps_launch_opts o;
    CHECK_OK(parse(&o, ARGV("--servers", "2", "--workers", "3")));
    CHECK_EQ_INT(o.servers, 2);
    CHECK_EQ_INT(o.workers, 3);
    CHECK_EQ_INT(o.mode, PS_MODE_SYNC);
    CHECK_STR(o.gpus, "auto");
    CHECK_EQ_INT(o.server_threads, 1);
    CHECK_EQ_INT(o.base_port, 29500);
    CHECK_EQ_INT(o.nwflags, 0);
    CHECK(!o.dry_run && !o.help && !o.hostfile && !o.timeline_dir && !o.bin_dir);
    ps_launch_opts_free(&o);
}

PS_TEST(parse_takes_flag_equals_value_and_worker_flags_after_dashes)
{
    ps_launch_opts o;
    CHECK_OK(parse(&o, ARGV("--servers=1", "--workers", "2", "--mode=async", "--gpus", "3,1",
                            "--server-threads", "64", "--server-arg", "--verbose",
                            "--server-arg=-x", "--dry-run", "--", "--lr", "0.1", "--eval-all")));
    CHECK_EQ_INT(o.mode, PS_MODE_ASYNC);
    CHECK_EQ_INT(o.server_threads, PS_SERVER_MAX_THREADS);
    CHECK_STR(joined(&o.gpu_ids), "3 1");
    CHECK_STR(joined(&o.server_args), "--verbose -x");
    CHECK_EQ_INT(o.dry_run, 1);
    CHECK_EQ_INT(o.nwflags, 3);
    CHECK_STR(o.wflags[0], "--lr");
    CHECK_STR(o.wflags[2], "--eval-all");
    ps_launch_opts_free(&o);
}

PS_TEST(parse_stops_at_help_and_version)
{
    ps_launch_opts o;
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--help", "--bogus")));
    CHECK_EQ_INT(o.help, 1);
    ps_launch_opts_free(&o);
    CHECK_OK(parse(&o, ARGV("--version")));
    CHECK_EQ_INT(o.help, 2);
    ps_launch_opts_free(&o);
    /* a bad value before it is still refused */
    CHECK_EQ_INT(parse(&o, ARGV("--servers", "x", "-h")), PS_EINVAL);
    ps_launch_opts_free(&o);
}

/* Each argv is refused with PS_EINVAL and exactly this message. */
static const struct {
    const char *msg;
    char *argv[16];
} refused[] = {
    {"ps_launch: --workers must be an integer in [1, 1024], got '0'",
     {"--servers", "1", "--workers", "0"}},
    {"ps_launch: --servers must be an integer in [1, 256], got '257'",
     {"--servers", "257", "--workers", "1"}},
    {"ps_launch: --server-threads must be an integer in [1, 64], got '65'",
     {"--servers", "1", "--workers", "1", "--server-threads", "65"}},
    {"ps_launch: --server-threads must be an integer in [1, 64], got '256'",
     {"--servers", "1", "--workers", "1", "--server-threads", "256"}},
    {"ps_launch: --base-port must be an integer in [1, 65535], got '0'",
     {"--servers", "1", "--workers", "1", "--base-port", "0"}},
    {"ps_launch: --mode must be sync or async, got 'bsp'",
     {"--servers", "1", "--workers", "1", "--mode", "bsp"}},
    {"ps_launch: --gpus must be auto, none or a list of GPU ids in [0, 1023] like 0,1, got '0,one'",
     {"--servers", "1", "--workers", "1", "--gpus", "0,one"}},
    {"ps_launch: --gpus must be auto, none or a list of GPU ids in [0, 1023] like 0,1, got '1024'",
     {"--servers", "1", "--workers", "1", "--gpus", "1024"}},
    {"ps_launch: --gpus must be auto, none or a list of GPU ids in [0, 1023] like 0,1, got '0,,1'",
     {"--servers", "1", "--workers", "1", "--gpus", "0,,1"}},
    {"ps_launch: --timeline-dir needs a value of 1..900 characters, got ''",
     {"--servers", "1", "--workers", "1", "--timeline-dir", ""}},
    {"ps_launch: unknown flag '--model' (see --help; worker flags go after --)",
     {"--servers", "1", "--workers", "1", "--model", "cnn"}},
    {"ps_launch: unexpected argument 'extra' (see --help; worker flags go after --)",
     {"--servers", "1", "extra"}},
    {"ps_launch: --workers needs a value (see --help)", {"--servers", "1", "--workers"}},
    {"ps_launch: --servers is required (see --help)", {"--workers", "1"}},
    {"ps_launch: --workers is required (see --help)", {"--servers", "1"}},
    {"ps_launch: --rank is set by ps_launch for each worker; remove it from the worker flags",
     {"--servers", "1", "--workers", "1", "--", "--rank", "0"}},
    {"ps_launch: --mode is set by ps_launch for each worker; remove it from the worker flags "
     "(use ps_launch --mode)",
     {"--servers", "1", "--workers", "1", "--", "--mode", "sync"}},
    {"ps_launch: --timeline in the worker flags conflicts with --timeline-dir; give one of them",
     {"--servers", "1", "--workers", "1", "--timeline-dir", "t", "--", "--timeline", "a.json"}},
    /* worker flags the servers get too: refused before anything starts */
    {"ps_launch: worker flag --lr must be a number in [0, 1e+06], got 'abc'",
     {"--servers", "1", "--workers", "1", "--", "--lr", "abc"}},
    {"ps_launch: worker flag --lr must be a number in [0, 1e+06], got '-0.5'",
     {"--servers", "1", "--workers", "1", "--", "--lr", "-0.5"}},
    {"ps_launch: worker flag --momentum must be a number in [0, 1], got '1.5'",
     {"--servers", "1", "--workers", "1", "--", "--momentum", "1.5"}},
    {"ps_launch: worker flag --beta1 must be a number in [0, 1), got '1'",
     {"--servers", "1", "--workers", "1", "--", "--beta1", "1"}},
    {"ps_launch: worker flag --beta2 must be a number in [0, 1), got '0.9999999999'",
     {"--servers", "1", "--workers", "1", "--", "--beta2", "0.9999999999"}},
    {"ps_launch: worker flag --eps must be a number in (0, 1], got '0'",
     {"--servers", "1", "--workers", "1", "--", "--eps", "0"}},
    {"ps_launch: worker flag --weight-decay must be a number in [0, 1], got '-0.1'",
     {"--servers", "1", "--workers", "1", "--", "--weight-decay", "-0.1"}},
    {"ps_launch: worker flag --lr-decay must be a number in (0, 1], got '0'",
     {"--servers", "1", "--workers", "1", "--", "--lr-decay", "0"}},
    {"ps_launch: worker flag --lr-decay-every must be a whole number in [0, 4294967295], got '-1'",
     {"--servers", "1", "--workers", "1", "--", "--lr-decay-every", "-1"}},
    {"ps_launch: worker flag --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, "
     "adamw, average, add, got 'rmsprop'",
     {"--servers", "1", "--workers", "1", "--", "--optimizer", "rmsprop"}},
    {"ps_launch: worker flag --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, "
     "adamw, average, add, got 'mom'",
     {"--servers", "1", "--workers", "1", "--", "--optimizer", "mom"}},
    {"ps_launch: worker flag --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, "
     "adamw, average, add, got 'sgd, momentum'",
     {"--servers", "1", "--workers", "1", "--", "--optimizer", "sgd, momentum"}},
    {"ps_launch: worker flag --optimizer must be one of sgd, momentum, nesterov, adagrad, adam, "
     "adamw, average, add, got ''",
     {"--servers", "1", "--workers", "1", "--", "--optimizer", ""}},
    {"ps_launch: worker flag --max-staleness must be an integer in [-1, 1000000], got '-2'",
     {"--servers", "1", "--workers", "1", "--mode", "async", "--", "--max-staleness", "-2"}},
    {"ps_launch: worker flag --max-staleness must be 0 with --mode sync, got '3'",
     {"--servers", "1", "--workers", "1", "--", "--max-staleness", "3"}},
    {"ps_launch: worker flag --curve-keys needs a value of 1..900 characters, got ''",
     {"--servers", "1", "--workers", "1", "--", "--curve-keys", ""}},
    {"ps_launch: worker flag --wire-dtype must be f32, bf16 or f16, got 'f8'",
     {"--servers", "1", "--workers", "1", "--", "--wire-dtype", "f8"}},
    {"ps_launch: --wire-dtype must be f32, bf16 or f16, got ''",
     {"--servers", "1", "--workers", "1", "--wire-dtype", ""}},
    {"ps_launch: worker flag --lr needs a value",
     {"--servers", "1", "--workers", "1", "--", "--model", "cnn", "--lr"}},
    {"ps_launch: worker flag --log-csv needs a value",
     {"--servers", "1", "--workers", "1", "--", "--log-csv"}},
    /* shared flags given to ps_launch itself: the same checks, once */
    {"ps_launch: --lr must be a number in [0, 1e+06], got 'abc'",
     {"--servers", "1", "--workers", "1", "--lr", "abc"}},
    {"ps_launch: --max-staleness must be 0 with --mode sync, got '2'",
     {"--servers", "1", "--workers", "1", "--max-staleness", "2", "--exec", "prog"}},
    {"ps_launch: --lr is given to ps_launch and among the worker flags; give it once",
     {"--servers", "1", "--workers", "1", "--lr", "0.1", "--", "--lr", "0.1"}},
    {"ps_launch: --lr needs a value (see --help)", {"--servers", "1", "--workers", "1", "--lr"}},
    /* --exec */
    {"ps_launch: --exec needs a program and its arguments, e.g. --exec python3 train.py "
     "--epochs 2",
     {"--servers", "1", "--workers", "1", "--exec"}},
    {"ps_launch: --exec needs a program and its arguments, e.g. --exec python3 train.py "
     "--epochs 2",
     {"--servers", "1", "--workers", "1", "--exec", ""}},
    {"ps_launch: --exec goes before -- (the flags after -- are ps_worker's); e.g. ps_launch "
     "--servers 1 --workers 2 --exec python3 train.py",
     {"--servers", "1", "--workers", "1", "--", "--steps", "3", "--exec", "python3"}},
    {"ps_launch: --workers is required (see --help)",
     {"--servers", "1", "--exec", "python3", "--workers", "2"}},
};

PS_TEST(parse_refuses_bad_flags_and_values_with_a_message)
{
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char *argv[18] = {"ps_launch"};
        int n = 1;
        for (int k = 0; refused[i].argv[k]; k++)
            argv[n++] = refused[i].argv[k];
        argv[n] = NULL;
        ps_launch_opts o;
        int rc = parse(&o, argv);
        ps_launch_opts_free(&o);
        CHECK_MSG(rc == PS_EINVAL, "case %zu (%s): returned %d", i, refused[i].msg, rc);
        CHECK_STR(why, refused[i].msg);
    }
}

PS_TEST(parse_accepts_the_values_the_programs_accept)
{
    ps_launch_opts o;
    CHECK_OK(parse(&o, ARGV("--servers", "256", "--workers", "1024", "--mode", "async", "--",
                            "--lr", "1e6", "--optimizer", "adam", "--momentum", "0", "--beta1",
                            "0", "--beta2", "0.999", "--eps", "1", "--weight-decay", "1",
                            "--lr-decay", "1", "--lr-decay-every", "4294967295",
                            "--max-staleness", "1000000", "--curve-keys", "keys")));
    ps_launch_opts_free(&o);
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "1", "--", "--max-staleness", "0",
                            "--optimizer", "sgd")));
    ps_launch_opts_free(&o);
    /* valueless worker flags between them are fine */
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "1", "--", "--eval-all", "--lr",
                            "0.5", "--verbose")));
    ps_launch_opts_free(&o);
}

PS_TEST(parse_takes_shared_flags_and_exec)
{
    ps_launch_opts o;
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--lr=0.5", "--workers", "2", "--optimizer",
                            "adam", "--lr", "0.25", "--mode", "async", "--max-staleness", "4",
                            "--exec", "python3", "t.py", "--", "--lr", "9")));
    /* a later value replaces an earlier one; --exec takes the rest as it is */
    CHECK_STR(joined(&o.shared), "--lr 0.25 --optimizer adam --max-staleness 4");
    CHECK_EQ_INT(o.nexec, 5);
    CHECK_STR(o.exec[0], "python3");
    CHECK_STR(o.exec[4], "9");
    CHECK_EQ_INT(o.nwflags, 0);
    ps_launch_opts_free(&o);
}

PS_TEST(optimizer_env_names_follow_the_flags)
{
    char name[64];
    ps_settings_opt_env("--lr", name, sizeof name);
    CHECK_STR(name, "PS_LR");
    ps_settings_opt_env("--lr-decay-every", name, sizeof name);
    CHECK_STR(name, "PS_LR_DECAY_EVERY");
    ps_settings_opt_env("--weight-decay", name, 8);
    CHECK_STR(name, "PS_WEIG");
}

PS_TEST(shared_flags_list_every_flag_forwarded)
{
    /* the settings table's shared rows, then the optimizer table's flags */
    static const char *const want[] = {"--max-staleness", "--curve-keys", "--shm",
                                       "--wire-dtype", "--on-nonfinite", "--metrics-bind",
                                       "--optimizer", "--lr",
                                       "--momentum",
                                       "--beta1", "--beta2", "--eps", "--weight-decay",
                                       "--lr-decay", "--lr-decay-every"};
    int n = 0;
    while (ps_settings_shared_flag(n))
        n++;
    CHECK_EQ_INT(n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < n; i++)
        CHECK_STR(ps_settings_shared_flag(i), want[i]);
    CHECK(ps_settings_shared_flag(-1) == NULL);
}

/* ------------------------------------------------------------ hostfile */

PS_TEST(hostfile_parses_hosts_counts_and_comments)
{
    ps_launch_hostfile h;
    CHECK_OK(ps_launch_hostfile_parse("hosts",
                                      "# two servers on h1\n"
                                      "h1 servers=2\n"
                                      "\n"
                                      "alice@h2\tworkers=2 gpus=2   # ssh as alice\r\n"
                                      "h3 servers=1 workers=1",
                                      &h, why, sizeof why));
    CHECK_EQ_INT(h.n, 3);
    CHECK_STR(h.hosts[0].name, "h1");
    CHECK(h.hosts[0].servers == 2 && h.hosts[0].workers == 0 && h.hosts[0].gpus == -1);
    CHECK_STR(h.hosts[1].name, "alice@h2");
    CHECK(h.hosts[1].servers == 0 && h.hosts[1].workers == 2 && h.hosts[1].gpus == 2);
    CHECK(h.hosts[2].servers == 1 && h.hosts[2].workers == 1);
    ps_launch_hostfile_free(&h);
}

PS_TEST(hostfile_refuses_bad_lines_naming_the_line)
{
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"h1 servers=two\n", "ps_launch: hosts: servers= must be an integer in [0, 256], got "
                             "'two' (line 1)"},
        {"h1 servers=1\nh2 workers=1025\n", "ps_launch: hosts: workers= must be an integer in "
                                            "[0, 1024], got '1025' (line 2)"},
        {"h1 gpus=1025\n", "ps_launch: hosts: gpus= must be an integer in [0, 1024], got '1025' "
                           "(line 1)"},
        {"h1 servers=1 workers=1 slots=4\n",
         "ps_launch: hosts:1: expected servers=N, workers=M or gpus=G after the host, got 'slots'"},
        {"# c\n@bad servers=1\n", "ps_launch: hosts:2: bad host name '@bad'"},
        {"-h servers=1\n", "ps_launch: hosts:1: bad host name '-h'"},
        {"h;rm servers=1\n", "ps_launch: hosts:1: bad host name 'h;rm'"},
        {"\n# only a comment\n", "ps_launch: --hostfile 'hosts' lists no hosts"},
        {"", "ps_launch: --hostfile 'hosts' lists no hosts"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_launch_hostfile h;
        why[0] = 0;
        int rc = ps_launch_hostfile_parse("hosts", bad[i].text, &h, why, sizeof why);
        ps_launch_hostfile_free(&h);
        CHECK_MSG(rc == PS_EINVAL, "case %zu: returned %d", i, rc);
        CHECK_STR(why, bad[i].msg);
    }
}

PS_TEST(hostfile_read_reads_the_file_or_says_why_not)
{
    char path[512];
    snprintf(path, sizeof path, "%s/hosts", ps_test_tmpdir());
    ps_launch_hostfile h;
    CHECK_EQ_INT(ps_launch_hostfile_read(path, &h, why, sizeof why), PS_EIO);
    ps_launch_hostfile_free(&h);
    char want[700];
    snprintf(want, sizeof want, "ps_launch: cannot read --hostfile '%s': No such file or directory",
             path);
    CHECK_STR(why, want);
    FILE *f = fopen(path, "w");
    CHECK(f);
    fputs("cpu1 servers=2\ngpu1 workers=4 gpus=4\n", f);
    fclose(f);
    CHECK_OK(ps_launch_hostfile_read(path, &h, why, sizeof why));
    CHECK_EQ_INT(h.n, 2);
    CHECK(h.hosts[1].workers == 4 && h.hosts[1].gpus == 4);
    ps_launch_hostfile_free(&h);
}

/* ------------------------------------------------------------ this host */

PS_TEST(gpus_auto_follows_cuda_visible_devices_else_the_count)
{
    ps_strvec ids = {0};
    CHECK_OK(ps_launch_gpus_auto(NULL, 3, &ids));
    CHECK_STR(joined(&ids), "0 1 2");
    ps_strvec_free(&ids);
    CHECK_OK(ps_launch_gpus_auto("5,7", 3, &ids));
    CHECK_STR(joined(&ids), "5 7");
    ps_strvec_free(&ids);
    CHECK_OK(ps_launch_gpus_auto("3,,GPU-ab12", 0, &ids));
    CHECK_STR(joined(&ids), "3 GPU-ab12");
    ps_strvec_free(&ids);
    static const char *const none[] = {"", "-1", "0,-1", "NoDevFiles", "1,NoDevFiles,2"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        CHECK_OK(ps_launch_gpus_auto(none[i], 4, &ids));
        CHECK_MSG(ids.n == 0, "CUDA_VISIBLE_DEVICES='%s' gave %d GPUs", none[i], ids.n);
    }
    CHECK_OK(ps_launch_gpus_auto(NULL, 0, &ids));
    CHECK_EQ_INT(ids.n, 0);
}

PS_TEST(bin_dir_is_relative_to_cwd_for_remote_commands)
{
    ps_launch_opts o = {0};
    char *d;
    d = ps_launch_bin_dir(&o, "/home/a/ps/bin", "/home/a/ps");
    CHECK_STR(d, "/home/a/ps/bin"); /* this host: as it is */
    free(d);
    o.hostfile = "hosts";
    d = ps_launch_bin_dir(&o, "/home/a/ps/bin", "/home/a/ps");
    CHECK_STR(d, "bin");
    free(d);
    d = ps_launch_bin_dir(&o, "/home/a/ps", "/home/a/ps");
    CHECK_STR(d, ".");
    free(d);
    d = ps_launch_bin_dir(&o, "/home/a/psx/bin", "/home/a/ps"); /* not below it */
    CHECK_STR(d, "/home/a/psx/bin");
    free(d);
    d = ps_launch_bin_dir(&o, "/opt/bin", "/");
    CHECK_STR(d, "/opt/bin");
    free(d);
    o.bin_dir = "/opt/ps/bin";
    d = ps_launch_bin_dir(&o, "/home/a/ps/bin", "/home/a/ps");
    CHECK_STR(d, "/opt/ps/bin");
    free(d);
}

/* ------------------------------------------------------------ plans */

static int ports[] = {41001, 41002, 41003};

/* Parse argv and build the local plan with ports and GPUs found = found. */
static int local_plan(ps_launch_opts *o, ps_launch_plan *p, const ps_strvec *found, char **argv)
{
    int rc = parse(o, argv);
    if (rc)
        return rc;
    ps_launch_site site = {.ports = ports, .gpus = found, .bin_dir = "/b", .remote_dir = "/w"};
    return ps_launch_plan_build(o, &site, p, why, sizeof why);
}

PS_TEST(local_plan_has_the_exact_command_lines)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "2", "--workers", "3", "--gpus", "0,1", "--mode",
                             "async", "--server-threads", "4", "--server-arg", "--verbose", "--",
                             "--model", "cnn", "--lr", "0.1", "--eval-all", "--optimizer",
                             "momentum", "--log-csv", "w{rank}.csv", "--save", "m.bin")));
    CHECK(p.n == 5 && p.num_servers == 2 && p.num_workers == 3);
    CHECK_EQ_INT(p.mode, PS_MODE_ASYNC);
    for (int r = 0; r < 2; r++) {
        const ps_launch_cmd *c = &p.cmds[r];
        char want[512];
        snprintf(want, sizeof want,
                 "/b/ps_server --bind tcp://127.0.0.1:%d --rank %d --num-servers 2 "
                 "--num-workers 3 --mode async --threads 4 --lr 0.1 --optimizer momentum "
                 "--verbose",
                 ports[r], r);
        CHECK(c->role == PS_LAUNCH_SERVER && c->rank == r && !c->host && c->env.n == 0);
        CHECK_STR(joined(&c->argv), want);
        snprintf(want, sizeof want, "tcp://127.0.0.1:%d", ports[r]);
        CHECK_STR(c->endpoint, want);
    }
    static const char *const workers[] = {
        "/b/ps_worker --servers tcp://127.0.0.1:41001,tcp://127.0.0.1:41002 --rank 0 "
        "--num-workers 3 --mode async --model cnn --lr 0.1 --eval-all --optimizer momentum "
        "--log-csv w0.csv --save m.bin --device cuda:0",
        "/b/ps_worker --servers tcp://127.0.0.1:41001,tcp://127.0.0.1:41002 --rank 1 "
        "--num-workers 3 --mode async --model cnn --lr 0.1 --eval-all --optimizer momentum "
        "--log-csv w1.csv --device cuda:0",
        "/b/ps_worker --servers tcp://127.0.0.1:41001,tcp://127.0.0.1:41002 --rank 2 "
        "--num-workers 3 --mode async --model cnn --lr 0.1 --eval-all --optimizer momentum "
        "--log-csv w2.csv --device cuda:0",
    };
    static const char *const env[] = {"CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1",
                                      "CUDA_VISIBLE_DEVICES=0"};
    for (int r = 0; r < 3; r++) {
        const ps_launch_cmd *c = &p.cmds[2 + r];
        CHECK(c->role == PS_LAUNCH_WORKER && c->rank == r && !c->host);
        CHECK_STR(joined(&c->argv), workers[r]);
        CHECK_STR(joined(&c->env), env[r]);
        CHECK_STR(c->device, "cuda:0");
    }
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(local_plan_uses_the_gpus_found_or_the_cpu)
{
    ps_launch_opts o;
    ps_launch_plan p;
    ps_strvec found = {0};
    CHECK_OK(ps_launch_gpus_auto("5,7", 0, &found));
    CHECK_OK(local_plan(&o, &p, &found, ARGV("--servers", "1", "--workers", "3")));
    CHECK_STR(joined(&p.cmds[1].env), "CUDA_VISIBLE_DEVICES=5");
    CHECK_STR(joined(&p.cmds[2].env), "CUDA_VISIBLE_DEVICES=7");
    CHECK_STR(joined(&p.cmds[3].env), "CUDA_VISIBLE_DEVICES=5");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    /* --gpus none ignores what was found */
    CHECK_OK(local_plan(&o, &p, &found,
                        ARGV("--servers", "1", "--workers", "2", "--gpus", "none")));
    for (int i = 1; i < 3; i++) {
        CHECK(p.cmds[i].env.n == 0);
        CHECK_STR(p.cmds[i].device, "cpu");
        CHECK_STR(p.cmds[i].argv.v[p.cmds[i].argv.n - 1], "cpu");
    }
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    ps_strvec_free(&found);
    /* auto with none found */
    CHECK_OK(local_plan(&o, &p, &found, ARGV("--servers", "1", "--workers", "1")));
    CHECK(p.cmds[1].env.n == 0);
    CHECK_STR(p.cmds[1].device, "cpu");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(local_plan_with_timeline_dir_gives_each_process_its_trace)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "2", "--gpus", "none",
                             "--timeline-dir", "out/tl", "--", "--steps", "3")));
    CHECK_STR(joined(&p.cmds[0].argv),
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 "
              "--num-workers 2 --mode sync --threads 1 --timeline out/tl/server-0.json");
    CHECK_STR(joined(&p.cmds[2].argv),
              "/b/ps_worker --servers tcp://127.0.0.1:41001 --rank 1 --num-workers 2 --mode sync "
              "--steps 3 --device cpu --timeline out/tl/worker-1.json");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(shared_flags_given_to_ps_launch_go_to_servers_and_workers)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "1", "--gpus", "none", "--lr", "0.1",
                             "--", "--optimizer", "momentum", "--steps", "3")));
    CHECK_STR(joined(&p.cmds[0].argv),
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 "
              "--num-workers 1 --mode sync --threads 1 --lr 0.1 --optimizer momentum");
    CHECK_STR(joined(&p.cmds[1].argv),
              "/b/ps_worker --servers tcp://127.0.0.1:41001 --rank 0 --num-workers 1 --mode sync "
              "--lr 0.1 --optimizer momentum --steps 3 --device cpu");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    /* --wire-dtype: both sides must agree (hello refuses otherwise) */
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "1", "--gpus", "none", "--",
                             "--wire-dtype", "bf16", "--steps", "3")));
    CHECK_STR(joined(&p.cmds[0].argv),
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 "
              "--num-workers 1 --mode sync --threads 1 --wire-dtype bf16");
    CHECK_STR(joined(&p.cmds[1].argv),
              "/b/ps_worker --servers tcp://127.0.0.1:41001 --rank 0 --num-workers 1 --mode sync "
              "--wire-dtype bf16 --steps 3 --device cpu");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(exec_plan_gives_each_worker_the_program_and_its_settings_in_the_environment)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "2", "--workers", "3", "--gpus", "0,1", "--mode",
                             "async", "--lr", "0.01", "--optimizer", "adam", "--lr-decay-every",
                             "100", "--max-staleness", "3", "--timeline-dir", "tl", "--exec",
                             "python3", "train.py", "--epochs", "2", "--save", "m{rank}.pt")));
    CHECK(p.exec && p.n == 5);
    /* the servers get the shared flags as flags */
    CHECK_STR(joined(&p.cmds[1].argv),
              "/b/ps_server --bind tcp://127.0.0.1:41002 --rank 1 --num-servers 2 "
              "--num-workers 3 --mode async --threads 1 --timeline tl/server-1.json --lr 0.01 "
              "--optimizer adam --lr-decay-every 100 --max-staleness 3");
    CHECK_EQ_INT(p.cmds[1].env.n, 0);
    for (int r = 0; r < 3; r++) {
        const ps_launch_cmd *c = &p.cmds[2 + r];
        char want[1024];
        snprintf(want, sizeof want, "python3 train.py --epochs 2 --save m%d.pt", r);
        CHECK_STR(joined(&c->argv), want);
        snprintf(want, sizeof want,
                 "CUDA_VISIBLE_DEVICES=%d PS_SERVERS=tcp://127.0.0.1:41001,tcp://127.0.0.1:41002 "
                 "PS_RANK=%d PS_NUM_SERVERS=2 PS_NUM_WORKERS=3 PS_MODE=async "
                 "PS_MAX_STALENESS=3 PS_DEVICE=cuda:0 PS_TIMELINE=tl/worker-%d.json "
                 "PS_LR=0.01 PS_OPTIMIZER=adam PS_LR_DECAY_EVERY=100",
                 r % 2, r, r);
        CHECK_STR(joined(&c->env), want);
        CHECK_STR(c->device, "cuda:0");
    }
    /* an --exec program's flags are its own: no output files to check */
    ps_strvec files = {0};
    CHECK_OK(ps_launch_plan_outputs(&p, &files));
    CHECK_EQ_INT(files.n, 0);
    ps_strvec_free(&files);
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

/* ------------------------------------------------------------ metrics */

PS_TEST(metrics_ports_follow_the_flag)
{
    ps_launch_opts o;
    int got[4], off, need;
    static const int free_ports[4] = {50001, 50007, 50003, 50020};
    /* auto on this host: the free ports the caller finds, asked for first */
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2")));
    CHECK_OK(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why));
    CHECK(need && !off);
    CHECK_OK(ps_launch_metrics_ports(&o, 1, 2, free_ports, got, &off, &need, why, sizeof why));
    CHECK(!need && !off && got[0] == 50001 && got[1] == 50007 && got[3] == 50020);
    ps_launch_opts_free(&o);
    /* a port: ps_launch there, then servers, then workers */
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--metrics-port", "9000")));
    CHECK_OK(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why));
    CHECK(!need && !off && got[0] == 9000 && got[1] == 9001 && got[2] == 9002 && got[3] == 9003);
    ps_launch_opts_free(&o);
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--metrics-port", "off")));
    CHECK_OK(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why));
    CHECK(off);
    ps_launch_opts_free(&o);
    /* auto with a hostfile: from 29400 on every host */
    CHECK_OK(parse(&o, ARGV("--hostfile", "h.txt")));
    CHECK_OK(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why));
    CHECK(!need && got[0] == PS_LAUNCH_METRICS_BASE && got[3] == PS_LAUNCH_METRICS_BASE + 3);
    ps_launch_opts_free(&o);
    /* not a port, or ports past 65535: refused, saying why */
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--metrics-port", "9k")));
    CHECK_EQ_INT(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why),
                 PS_EINVAL);
    CHECK_MSG(strstr(why, "--metrics-port must be auto, off or a port") != NULL, "%s", why);
    ps_launch_opts_free(&o);
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--metrics-port", "65534")));
    CHECK_EQ_INT(ps_launch_metrics_ports(&o, 1, 2, NULL, got, &off, &need, why, sizeof why),
                 PS_EINVAL);
    CHECK_MSG(strstr(why, "past 65535") != NULL, "%s", why);
    ps_launch_opts_free(&o);
    /* each process' port is ps_launch's to give */
    CHECK_EQ_INT(parse(&o, ARGV("--servers", "1", "--workers", "1", "--", "--metrics-port",
                                "9")), PS_EINVAL);
    ps_launch_opts_free(&o);
}

PS_TEST(plan_with_metrics_gives_each_process_its_port_and_the_bind)
{
    ps_launch_opts o;
    ps_launch_plan p;
    static const int mports[] = {9000, 9001, 9002, 9003};
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--gpus", "none",
                            "--metrics-bind", "0.0.0.0", "--", "--model", "cnn")));
    ps_launch_site site = {.ports = ports, .bin_dir = "/b", .remote_dir = "/w",
                           .metrics_ports = mports};
    CHECK_OK(ps_launch_plan_build(&o, &site, &p, why, sizeof why));
    CHECK_STR(joined(&p.cmds[0].argv),
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 "
              "--num-workers 2 --mode sync --threads 1 --metrics-port 9001 --metrics-bind "
              "0.0.0.0");
    CHECK_STR(joined(&p.cmds[2].argv),
              "/b/ps_worker --servers tcp://127.0.0.1:41001 --rank 1 --num-workers 2 --mode "
              "sync --metrics-bind 0.0.0.0 --model cnn --device cpu --metrics-port 9003");
    CHECK(p.cmds[0].metrics_port == 9001 && p.cmds[1].metrics_port == 9002);
    /* the job file and the targets name every process where it serves */
    char job[512], targets[512], text[4096];
    snprintf(job, sizeof job, "%s/job.txt", ps_test_tmpdir());
    snprintf(targets, sizeof targets, "%s/targets.json", ps_test_tmpdir());
    CHECK_OK(ps_launch_write_job(job, &p, "keys", 9000, "0.0.0.0", why, sizeof why));
    FILE *f = fopen(job, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f)
        fclose(f);
    CHECK_STR(text, "# ps_launch job: role rank endpoint metrics (ps_top --job reads it)\n"
                    "servers tcp://127.0.0.1:41001\n"
                    "curve-keys keys\n"
                    "launch - - 127.0.0.1:9000\n"
                    "server 0 tcp://127.0.0.1:41001 127.0.0.1:9001\n"
                    "worker 0 - 127.0.0.1:9002\n"
                    "worker 1 - 127.0.0.1:9003\n");
    CHECK_OK(ps_launch_write_targets(targets, &p, "j1", 9000, NULL, why, sizeof why));
    f = fopen(targets, "r");
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f)
        fclose(f);
    CHECK_STR(text, "[\n"
                    "  {\"targets\": [\"127.0.0.1:9000\"], \"labels\": {\"ps_job\": \"j1\", "
                    "\"role\": \"launch\"}},\n"
                    "  {\"targets\": [\"127.0.0.1:9001\"], \"labels\": {\"ps_job\": \"j1\", "
                    "\"role\": \"server\", \"ps_rank\": \"0\"}},\n"
                    "  {\"targets\": [\"127.0.0.1:9002\"], \"labels\": {\"ps_job\": \"j1\", "
                    "\"role\": \"worker\", \"ps_rank\": \"0\"}},\n"
                    "  {\"targets\": [\"127.0.0.1:9003\"], \"labels\": {\"ps_job\": \"j1\", "
                    "\"role\": \"worker\", \"ps_rank\": \"1\"}}\n"
                    "]\n");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    /* an --exec worker finds its port in PS_METRICS_PORT */
    CHECK_OK(parse(&o, ARGV("--servers", "1", "--workers", "2", "--gpus", "none", "--exec",
                            "python3", "t.py")));
    CHECK_OK(ps_launch_plan_build(&o, &site, &p, why, sizeof why));
    CHECK_MSG(strstr(joined(&p.cmds[2].env), "PS_METRICS_PORT=9003") != NULL, "%s",
              joined(&p.cmds[2].env));
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(exec_plan_tells_the_staleness_the_servers_use)
{
    static const struct {
        const char *mode, *given, *want;
    } cases[] = {{"sync", NULL, "PS_MAX_STALENESS=0"},
                 {"sync", "0", "PS_MAX_STALENESS=0"},
                 {"async", NULL, "PS_MAX_STALENESS=-1"},
                 {"async", "7", "PS_MAX_STALENESS=7"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_launch_opts o;
        ps_launch_plan p;
        int rc = cases[i].given
                     ? local_plan(&o, &p, NULL,
                                  ARGV("--servers", "1", "--workers", "1", "--gpus", "none",
                                       "--mode", (char *)cases[i].mode, "--max-staleness",
                                       (char *)cases[i].given, "--exec", "w"))
                     : local_plan(&o, &p, NULL,
                                  ARGV("--servers", "1", "--workers", "1", "--gpus", "none",
                                       "--mode", (char *)cases[i].mode, "--exec", "w"));
        CHECK_MSG(rc == 0, "case %zu: %s", i, why);
        const ps_strvec *e = &p.cmds[1].env;
        int found = 0;
        for (int k = 0; k < e->n; k++)
            found += !strcmp(e->v[k], cases[i].want);
        int stale_vars = 0;
        for (int k = 0; k < e->n; k++)
            stale_vars += !strncmp(e->v[k], "PS_MAX_STALENESS=", 17);
        ps_launch_plan_free(&p);
        ps_launch_opts_free(&o);
        CHECK_MSG(found == 1 && stale_vars == 1, "case %zu: no %s", i, cases[i].want);
    }
}

PS_TEST(exec_plan_print_is_a_shell_line_with_the_environment)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "1", "--gpus", "none",
                             "--curve-keys", "my keys", "--exec", "./w", "a b")));
    ps_strbuf out = {0};
    CHECK_OK(ps_launch_plan_print(&p, &out));
    CHECK_STR(ps_strbuf_str(&out),
              "# ps_launch plan: 1 server, 1 worker, mode sync\n"
              "# server 0 on this host, reached at tcp://127.0.0.1:41001\n"
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 --num-workers 1 "
              "--mode sync --threads 1 --curve-keys 'my keys'\n"
              "# worker 0 on this host, device cpu\n"
              "PS_SERVERS=tcp://127.0.0.1:41001 PS_RANK=0 PS_NUM_SERVERS=1 PS_NUM_WORKERS=1 "
              "PS_MODE=sync PS_MAX_STALENESS=0 PS_CURVE_KEYS='my keys' PS_DEVICE=cpu ./w 'a b'\n");
    ps_strbuf_free(&out);
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

static const char hosts_text[] =
    "# two servers on h1, two GPU workers on h2, one of each on h3\n"
    "h1 servers=2\n"
    "alice@h2 workers=2 gpus=2\n"
    "h3 servers=1 workers=1\n";

/* Parse argv and build the plan over hosts_text. */
static int host_plan(ps_launch_opts *o, ps_launch_hostfile *h, ps_launch_plan *p, char **argv)
{
    memset(h, 0, sizeof *h);
    memset(p, 0, sizeof *p);
    int rc = parse(o, argv);
    if (!rc)
        rc = ps_launch_hostfile_parse("hosts", hosts_text, h, why, sizeof why);
    if (rc)
        return rc;
    ps_launch_site site = {.hostfile = h, .bin_dir = "/opt/ps/bin", .remote_dir = "/home/a/ps"};
    return ps_launch_plan_build(o, &site, p, why, sizeof why);
}

PS_TEST(hostfile_plan_has_the_exact_ssh_commands)
{
    ps_launch_opts o;
    ps_launch_hostfile h;
    ps_launch_plan p;
    CHECK_OK(host_plan(&o, &h, &p,
                       ARGV("--hostfile", "hosts", "--mode", "async", "--server-threads", "2",
                            "--base-port", "30000", "--timeline-dir", "tl", "--", "--model",
                            "cnn", "--lr", "0.1", "--log-csv", "w{rank}.csv", "--data",
                            "it's here")));
    CHECK(p.num_servers == 3 && p.num_workers == 3);
#define SL "tcp://h1:30000,tcp://h1:30001,tcp://h3:30002"
#define RC "exec /opt/ps/bin/ps_launch --remote-child "
    static const char *const want[] = {
        "ssh -o BatchMode=yes h1 cd /home/a/ps && mkdir -p tl && " RC "/opt/ps/bin/ps_server "
        "--bind \"tcp://*:30000\" --rank 0 --num-servers 3 --num-workers 3 --mode async "
        "--threads 2 --exit-on-stdin-eof --timeline tl/server-0.json --lr 0.1",
        "ssh -o BatchMode=yes h1 cd /home/a/ps && mkdir -p tl && " RC "/opt/ps/bin/ps_server "
        "--bind \"tcp://*:30001\" --rank 1 --num-servers 3 --num-workers 3 --mode async "
        "--threads 2 --exit-on-stdin-eof --timeline tl/server-1.json --lr 0.1",
        "ssh -o BatchMode=yes h3 cd /home/a/ps && mkdir -p tl && " RC "/opt/ps/bin/ps_server "
        "--bind \"tcp://*:30002\" --rank 2 --num-servers 3 --num-workers 3 --mode async "
        "--threads 2 --exit-on-stdin-eof --timeline tl/server-2.json --lr 0.1",
        "ssh -o BatchMode=yes alice@h2 cd /home/a/ps && mkdir -p tl && " RC "env "
        "CUDA_VISIBLE_DEVICES=0 /opt/ps/bin/ps_worker --servers " SL " --rank 0 --num-workers 3 "
        "--mode async --model cnn --lr 0.1 --log-csv w0.csv --data \"it's here\" --device cuda:0 "
        "--timeline tl/worker-0.json",
        "ssh -o BatchMode=yes alice@h2 cd /home/a/ps && mkdir -p tl && " RC "env "
        "CUDA_VISIBLE_DEVICES=1 /opt/ps/bin/ps_worker --servers " SL " --rank 1 --num-workers 3 "
        "--mode async --model cnn --lr 0.1 --log-csv w1.csv --data \"it's here\" --device cuda:0 "
        "--timeline tl/worker-1.json",
        "ssh -o BatchMode=yes h3 cd /home/a/ps && mkdir -p tl && " RC "/opt/ps/bin/ps_worker "
        "--servers " SL " --rank 2 --num-workers 3 --mode async --model cnn --lr 0.1 --log-csv "
        "w2.csv --data \"it's here\" --device cpu --timeline tl/worker-2.json",
    };
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(p.cmds[i].argv.n, 5); /* ssh -o BatchMode=yes HOST COMMAND */
        CHECK_STR(joined(&p.cmds[i].argv), want[i]);
    }
    CHECK_STR(p.cmds[0].endpoint, "tcp://h1:30000");
    CHECK_STR(p.cmds[2].endpoint, "tcp://h3:30002");
    CHECK_STR(p.cmds[3].host, "alice@h2");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
}

/* ps_launch turns on aggregation per host (ps_worker --local-aggregate L)
 * for a sync job across hosts whose worker hosts all run L > 1 workers: the
 * servers then count hosts.  Uneven hosts, async, one host, or
 * --local-aggregate 1 among the worker flags: off.  A value given is used
 * (one host too) and must divide the workers. */
static const char even_hosts[] = "s1 servers=2\nw1 workers=2\nw2 workers=2\n";

static int even_plan(ps_launch_opts *o, ps_launch_hostfile *h, ps_launch_plan *p, char **argv)
{
    memset(h, 0, sizeof *h);
    memset(p, 0, sizeof *p);
    int rc = parse(o, argv);
    if (!rc)
        rc = ps_launch_hostfile_parse("hosts", even_hosts, h, why, sizeof why);
    if (rc)
        return rc;
    ps_launch_site site = {.hostfile = h, .bin_dir = "/b", .remote_dir = "/w"};
    return ps_launch_plan_build(o, &site, p, why, sizeof why);
}

PS_TEST(launch_turns_on_local_aggregation_for_sync_hosts_with_several_workers)
{
    ps_launch_opts o;
    ps_launch_hostfile h;
    ps_launch_plan p;
    CHECK_OK(even_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--", "--steps", "3")));
    CHECK_EQ_INT(p.local_aggregate, 2);
    CHECK_MSG(strstr(joined(&p.cmds[0].argv), "--num-workers 2 --mode sync"), "server: %s",
              joined(&p.cmds[0].argv));
    for (int w = 0; w < 4; w++)
        CHECK_MSG(strstr(joined(&p.cmds[2 + w].argv), "--num-workers 4 --mode sync --steps 3 "
                         "--device cpu --local-aggregate 2"),
                  "worker %d: %s", w, joined(&p.cmds[2 + w].argv));
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    /* turned off among the worker flags: the servers count every worker */
    CHECK_OK(even_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--", "--local-aggregate", "1")));
    CHECK_EQ_INT(p.local_aggregate, 1);
    CHECK_MSG(strstr(joined(&p.cmds[0].argv), "--num-workers 4 "), "%s", joined(&p.cmds[0].argv));
    CHECK_MSG(!strstr(joined(&p.cmds[2].argv), "--local-aggregate 2"), "%s",
              joined(&p.cmds[2].argv));
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    /* async: off unless given */
    CHECK_OK(even_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--mode", "async", "--", "--steps",
                                        "3")));
    CHECK_EQ_INT(p.local_aggregate, 1);
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    /* uneven hosts (2 and 1 workers): off */
    CHECK_OK(host_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--", "--steps", "3")));
    CHECK_EQ_INT(p.local_aggregate, 1);
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    /* one host, given: the servers count 4 / 2 */
    CHECK_OK(local_plan(&o, &p, NULL, ARGV("--servers", "1", "--workers", "4", "--gpus", "none",
                                           "--", "--local-aggregate", "2")));
    CHECK_EQ_INT(p.local_aggregate, 2);
    CHECK_MSG(strstr(joined(&p.cmds[0].argv), "--num-workers 2 "), "%s", joined(&p.cmds[0].argv));
    CHECK_STR(joined(&p.cmds[1].argv), "/b/ps_worker --servers tcp://127.0.0.1:41001 --rank 0 "
              "--num-workers 4 --mode sync --local-aggregate 2 --device cpu");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    /* a value that does not divide the workers */
    CHECK_EQ_INT(local_plan(&o, &p, NULL, ARGV("--servers", "1", "--workers", "4", "--gpus",
                                               "none", "--", "--local-aggregate", "3")),
                 PS_EINVAL);
    CHECK_STR(why, "ps_launch: worker flag --local-aggregate must be 1..64 and divide the 4 "
              "workers (workers per host), got '3'");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(hostfile_exec_plan_sets_the_environment_remotely)
{
    ps_launch_opts o;
    ps_launch_hostfile h;
    ps_launch_plan p;
    CHECK_OK(host_plan(&o, &h, &p,
                       ARGV("--hostfile", "hosts", "--mode", "async", "--exec", "python3",
                            "t.py", "--out", "r{rank}")));
    CHECK_STR(joined(&p.cmds[4].argv),
              "ssh -o BatchMode=yes alice@h2 cd /home/a/ps && " RC "env CUDA_VISIBLE_DEVICES=1 "
              "PS_SERVERS=tcp://h1:29500,tcp://h1:29501,tcp://h3:29502 PS_RANK=1 "
              "PS_NUM_SERVERS=3 PS_NUM_WORKERS=3 PS_MODE=async PS_MAX_STALENESS=-1 PS_DEVICE=cuda:0 "
              "python3 t.py --out r1");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
}

PS_TEST(hostfile_plan_passes_the_ssh_command_and_options)
{
    ps_launch_opts o;
    ps_launch_hostfile h;
    ps_launch_plan p;
    CHECK_OK(parse(&o, ARGV("--hostfile", "h", "--ssh-opt", " -p  2222 ", "--ssh-opt=-J gw",
                            "--", "--steps", "3")));
    CHECK_STR(joined(&o.ssh_opts), "-p 2222 -J gw");
    CHECK_OK(ps_launch_hostfile_parse("h", "h1 servers=1 workers=1\n", &h, why, sizeof why));
    ps_launch_site site = {.hostfile = &h, .bin_dir = "bin", .remote_dir = "/w",
                           .ssh = "ssh -F /etc/ps/ssh_config"};
    CHECK_OK(ps_launch_plan_build(&o, &site, &p, why, sizeof why));
    CHECK_STR(joined(&p.cmds[1].argv),
              "ssh -F /etc/ps/ssh_config -p 2222 -J gw -o BatchMode=yes h1 cd /w && exec "
              "bin/ps_launch --remote-child bin/ps_worker --servers tcp://h1:29500 --rank 0 "
              "--num-workers 1 --mode sync --steps 3 --device cpu");
    ps_launch_plan_free(&p);
    /* PS_SSH empty: plain ssh */
    site.ssh = "";
    CHECK_OK(ps_launch_plan_build(&o, &site, &p, why, sizeof why));
    CHECK_STR(p.cmds[0].argv.v[0], "ssh");
    CHECK_STR(p.cmds[0].argv.v[1], "-p");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    CHECK_EQ_INT(parse(&o, ARGV("--hostfile", "h", "--ssh-opt", " ")), PS_EINVAL);
    CHECK_STR(why, "ps_launch: --ssh-opt needs ssh options, e.g. --ssh-opt '-p 2222'");
    ps_launch_opts_free(&o);
}

PS_TEST(hostfile_plan_refuses_counts_that_disagree)
{
    ps_launch_opts o;
    ps_launch_hostfile h;
    ps_launch_plan p;
    CHECK_EQ_INT(host_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--workers", "4")),
                 PS_EINVAL);
    CHECK_STR(why, "ps_launch: --servers 3 --workers 4 disagree with the hostfile (3 servers, 3 "
                   "workers); leave them out or make them match");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    CHECK_EQ_INT(host_plan(&o, &h, &p, ARGV("--hostfile", "hosts", "--base-port", "65534")),
                 PS_EINVAL);
    CHECK_STR(why, "ps_launch: --base-port 65534 + 3 servers goes past port 65535");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
    /* no workers anywhere */
    CHECK_OK(parse(&o, ARGV("--hostfile", "h")));
    CHECK_OK(ps_launch_hostfile_parse("h", "h1 servers=1\n", &h, why, sizeof why));
    ps_launch_site site = {.hostfile = &h, .bin_dir = "b", .remote_dir = "/"};
    CHECK_EQ_INT(ps_launch_plan_build(&o, &site, &p, why, sizeof why), PS_EINVAL);
    CHECK_STR(why, "ps_launch: the hostfile places 1 server(s) and 0 worker(s); give servers=N "
                   "and workers=M on some hosts");
    ps_launch_plan_free(&p);
    ps_launch_hostfile_free(&h);
    ps_launch_opts_free(&o);
}

/* ------------------------------------------------------------ what it says */

PS_TEST(plan_print_is_one_shell_line_per_process)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "1", "--gpus", "2", "--",
                             "--data", "a b", "--save", "it's")));
    ps_strbuf out = {0};
    CHECK_OK(ps_launch_plan_print(&p, &out));
    CHECK_STR(ps_strbuf_str(&out),
              "# ps_launch plan: 1 server, 1 worker, mode sync\n"
              "# server 0 on this host, reached at tcp://127.0.0.1:41001\n"
              "/b/ps_server --bind tcp://127.0.0.1:41001 --rank 0 --num-servers 1 --num-workers 1 "
              "--mode sync --threads 1\n"
              "# worker 0 on this host, device cuda:0\n"
              "CUDA_VISIBLE_DEVICES=2 /b/ps_worker --servers tcp://127.0.0.1:41001 --rank 0 "
              "--num-workers 1 --mode sync --data 'a b' --save 'it'\\''s' --device cuda:0\n");
    ps_strbuf_free(&out);
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

PS_TEST(plan_notes_say_which_gpus_and_what_only_worker_0_gets)
{
    ps_launch_opts o;
    ps_launch_plan p;
    ps_strvec found = {0};
    ps_strbuf out = {0};
    ps_launch_site site = {.ports = ports, .gpus = &found, .bin_dir = "/b"};
    CHECK_OK(local_plan(&o, &p, &found,
                        ARGV("--servers", "1", "--workers", "2", "--", "--log-csv", "a.csv",
                             "--timeline", "t{rank}.json")));
    CHECK_OK(ps_launch_plan_notes(&o, &site, &p, &out));
    CHECK_STR(ps_strbuf_str(&out),
              "ps_launch: --log-csv 'a.csv' goes to worker 0 only (put {rank} in the path for "
              "one file per worker)\n"
              "ps_launch: no GPU found, running 2 CPU workers\n");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    ps_strbuf_reset(&out);
    CHECK_OK(ps_launch_gpus_auto("4,6", 0, &found));
    CHECK_OK(local_plan(&o, &p, &found, ARGV("--servers", "1", "--workers", "3")));
    CHECK_OK(ps_launch_plan_notes(&o, &site, &p, &out));
    CHECK_STR(ps_strbuf_str(&out),
              "ps_launch: 2 GPUs (4,6), 3 workers, one per GPU round-robin\n");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    ps_strbuf_reset(&out);
    CHECK_OK(local_plan(&o, &p, &found,
                        ARGV("--servers", "1", "--workers", "1", "--gpus", "none")));
    CHECK_OK(ps_launch_plan_notes(&o, &site, &p, &out));
    CHECK_STR(ps_strbuf_str(&out), "ps_launch: --gpus none, running 1 CPU workers\n");
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
    ps_strbuf_free(&out);
    ps_strvec_free(&found);
}

PS_TEST(plan_outputs_are_the_files_local_workers_write)
{
    ps_launch_opts o;
    ps_launch_plan p;
    CHECK_OK(local_plan(&o, &p, NULL,
                        ARGV("--servers", "1", "--workers", "2", "--gpus", "none",
                             "--timeline-dir", "tl", "--", "--eval-all", "--log-csv",
                             "out/w{rank}.csv", "--save", "m/final.bin")));
    ps_strvec files = {0};
    CHECK_OK(ps_launch_plan_outputs(&p, &files));
    CHECK_STR(joined(&files), "--log-csv out/w0.csv --save m/final.bin --timeline "
                              "tl/worker-0.json --log-csv out/w1.csv --timeline tl/worker-1.json");
    ps_strvec_free(&files);
    ps_launch_plan_free(&p);
    ps_launch_opts_free(&o);
}

/* ------------------------------------------------------------ over ssh */

PS_TEST(remote_status_lines_become_wait_statuses)
{
    int st = -1;
    CHECK(ps_launch_remote_status("ps_launch-remote: exit 3", &st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
    CHECK(ps_launch_remote_status("ps_launch-remote: exit 0", &st));
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(ps_launch_remote_status("ps_launch-remote: signal 9", &st));
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == 9);
    static const char *const not_status[] = {
        "ps_launch-remote: exit", "ps_launch-remote: exit 256", "ps_launch-remote: signal 9x",
        "ps_launch-remote: killed 9", "[worker 0] ps_launch-remote: exit 1", "exit 1",
        "ps_launch-remote: signal 128", "ps_launch-remote: exit -1", "ps_launch-remote: exit "};
    for (size_t i = 0; i < sizeof not_status / sizeof not_status[0]; i++)
        CHECK_MSG(!ps_launch_remote_status(not_status[i], &st), "'%s' was taken", not_status[i]);
}
