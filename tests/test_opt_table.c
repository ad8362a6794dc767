/* The optimizer-settings table (include/ps_types.h, common/ps_opt_table.h):
 * every row's flag takes its default and refuses what is out of its range,
 * a hello carries only what a worker gives, one comparison rule, and the two
 * defects it fixed: a worker that names no --lr is not refused for it, and a
 * restore with another --lr-decay / --lr-decay-every is refused naming both
 * values. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

PS_TEST(every_row_takes_its_default_and_refuses_its_bounds)
{
    char why[256], text[64];
    for (int p = 0; p < PS_OPT_NPARAMS; p++) {
        const ps_opt_param *r = ps_opt_param_at(p);
        ps_opt_config c;
        memset(&c, 0, sizeof c);
        int handled = 0;
        snprintf(text, sizeof text, "%.9g", r->def);
        CHECK_MSG(ps_opt_flag("t", r->flag, text, &c, &handled, why, sizeof why) == 0 && handled,
                  "%s %s refused: %s", r->flag, text, why);
        CHECK_MSG(ps_opt_get(&c, p) == (double)(float)r->def || r->is_int, "%s", r->flag);
        CHECK_MSG(c.given == 1u << p, "%s: given %x", r->flag, c.given);
        /* the bounds: an open one refused, a closed one taken */
        double edges[2] = {r->lo, r->hi};
        int open[2] = {r->lo_open, r->hi_open};
        for (int e = 0; e < 2; e++) {
            snprintf(text, sizeof text, "%.17g", edges[e]);
            int rc = ps_opt_flag("t", r->flag, text, &c, &handled, why, sizeof why);
            CHECK_MSG(open[e] ? rc == PS_EINVAL : rc == 0, "%s %s: rc %d (%s)", r->flag, text, rc,
                      why);
            if (open[e])
                CHECK_MSG(strstr(why, r->flag) && strstr(why, text), "message: %s", why);
        }
        snprintf(text, sizeof text, "%.17g", r->hi * 2 + 1);
        CHECK_EQ_INT(ps_opt_flag("t", r->flag, text, &c, &handled, why, sizeof why), PS_EINVAL);
        CHECK_EQ_INT(ps_opt_flag("t", r->flag, "x", &c, &handled, why, sizeof why), PS_EINVAL);
    }
    int handled = 1;
    ps_opt_config c;
    CHECK_OK(ps_opt_flag("t", "--batch", "3", &c, &handled, NULL, 0));
    CHECK_EQ_INT(handled, 0);
    /* the flag list starts with --optimizer and has one flag per row */
    const char *const *names = ps_opt_flag_names();
    int n = 0;
    while (names[n])
        n++;
    CHECK_EQ_INT(n, 1 + PS_OPT_NPARAMS);
    CHECK(strcmp(names[0], "--optimizer") == 0);
}

PS_TEST(a_hello_carries_only_what_the_worker_gives)
{
    ps_header a, b;
    ps_header_init(&a, PS_MSG_HELLO);
    a.hello.mode = PS_MODE_ASYNC;
    a.hello.max_staleness = -1;
    a.hello.num_workers = 2;
    a.hello.num_servers = 1;
    a.hello.opt.kind = PS_OPT_ADAM;
    a.hello.opt.beta1 = 0.5f; /* a value, but not given: left out */
    a.hello.opt.weight_decay = 0;
    a.hello.opt.given = PS_OPT_GIVEN(weight_decay);
    char buf[PS_HEADER_MAX], why[256];
    size_t len;
    CHECK_OK(ps_proto_encode(&a, buf, sizeof buf, &len));
    CHECK_OK(ps_proto_decode(buf, len, &b, why, sizeof why));
    CHECK_EQ_INT(b.hello.opt.kind, PS_OPT_ADAM);
    CHECK_EQ_INT(b.hello.opt.given, PS_OPT_GIVEN(weight_decay));
    CHECK(b.hello.opt.beta1 == 0.0f);
    /* a server's complete settings go out whole */
    ps_opt_default(&a.hello.opt);
    CHECK_OK(ps_proto_encode(&a, buf, sizeof buf, &len));
    CHECK_OK(ps_proto_decode(buf, len, &b, why, sizeof why));
    CHECK_EQ_INT(b.hello.opt.given, PS_OPT_GIVEN_ALL);
    CHECK(memcmp(&a.hello.opt, &b.hello.opt, sizeof a.hello.opt) == 0);
}

PS_TEST(one_rule_compares_what_both_give_and_the_optimizer_uses)
{
    ps_opt_config srv, wk;
    char why[256];
    ps_opt_default(&srv);
    srv.kind = PS_OPT_ADAM;
    srv.lr = 0.001f;
    srv.momentum = 0.5f; /* adam does not use it */
    memset(&wk, 0, sizeof wk);
    wk.kind = PS_OPT_ADAM;
    CHECK_OK(ps_opt_compare(&srv, "server", &wk, "worker 0", why, sizeof why));
    wk.momentum = 0.9f;
    wk.given = PS_OPT_GIVEN(momentum);
    CHECK_OK(ps_opt_compare(&srv, "server", &wk, "worker 0", why, sizeof why));
    wk.lr = 0.05f;
    wk.given |= PS_OPT_GIVEN(lr);
    CHECK_EQ_INT(ps_opt_compare(&srv, "server", &wk, "worker 0", why, sizeof why), PS_EMISMATCH);
    CHECK_MSG(strstr(why, "lr: server has 0.001, worker 0 has 0.05"), "message: %s", why);
    /* no optimizer named: what is given is checked against the server's */
    wk.kind = PS_OPT_NONE;
    CHECK_EQ_INT(ps_opt_compare(&srv, "server", &wk, "worker 0", why, sizeof why), PS_EMISMATCH);
    wk.lr = 0;
    wk.given &= ~PS_OPT_GIVEN(lr);
    wk.kind = PS_OPT_SGD;
    CHECK_EQ_INT(ps_opt_compare(&srv, "server", &wk, "worker 0", why, sizeof why), PS_EMISMATCH);
    CHECK_MSG(strstr(why, "optimizer: server has adam, worker 0 has sgd"), "message: %s", why);
}

/* Run ps_worker for a few steps of synthetic data against ep; its exit status. */
static int worker_run(const char *ep, const char *flags, const char *log)
{
    char words[1024];
    snprintf(words, sizeof words, "--servers %s --rank 0 --num-workers 1 --mode async "
             "--data synthetic:512 --batch 32 --steps 4 --log-every 2 %s", ep, flags);
    int pid = ps_test_spawn_words("ps_worker", words, log);
    return pid > 0 ? ps_test_wait(pid, 60000) : -1;
}

PS_TEST(worker_without_lr_is_accepted_by_an_adam_server_with_another_lr)
{
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --optimizer adam "
                                          "--lr 0.001"));
    char ep[64], log[512];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", sv.port);
    snprintf(log, sizeof log, "%s/nolr.log", ps_test_tmpdir());
    int rc = worker_run(ep, "--optimizer adam", log);
    char log2[512];
    snprintf(log2, sizeof log2, "%s/withlr.log", ps_test_tmpdir());
    int rc2 = worker_run(ep, "--optimizer adam --lr 0.05", log2);
    char log3[512];
    snprintf(log3, sizeof log3, "%s/beta.log", ps_test_tmpdir());
    int rc3 = worker_run(ep, "--beta1 0.8", log3);
    ps_test_stop(sv.pid, PS_TEST_RPC_MS);
    CHECK_MSG(rc == 0, "worker without --lr exited %d (see %s)", rc, log);
    CHECK_MSG(rc2 == 2, "worker with another --lr exited %d (see %s)", rc2, log2);
    CHECK_MSG(ps_test_file_has(log2, "lr: server has 0.001, worker 0 has 0.05"),
              "no clear refusal in %s", log2);
    CHECK_MSG(rc3 == 2 && ps_test_file_has(log3, "beta1: server has 0.9, worker 0 has 0.8"),
              "a given --beta1 was not checked (exit %d, %s)", rc3, log3);
}

/* A server with checkpoints: one chunk, one push, then SIGTERM (the final
 * checkpoint). */
static int make_checkpoint(const char *dir, const char *decay)
{
    ps_test_server sv;
    char words[1024];
    snprintf(words, sizeof words, "--num-workers 1 --mode async --lr 0.5 %s --checkpoint-dir %s "
             "--checkpoint-every 1", decay, dir);
    if (ps_test_server_start(&sv, 1, words))
        return -1;
    void *a = ps_test_dealer(sv.port);
    int rc = ps_test_hello(a, 0, PS_MODE_ASYNC, 1, -1);
    float w[2] = {1, 2}, g[2] = {1, 1};
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 7, 0, 0), r;
    h.total = 2;
    if (!rc)
        rc = ps_test_rpc(a, &h, w, 2, &r, NULL, 0, NULL);
    h = ps_test_header(PS_MSG_PUSH, 0, 2, 7, 0, 0);
    if (!rc)
        rc = ps_test_rpc(a, &h, g, 2, &r, NULL, 0, NULL);
    zmq_close(a);
    int st = ps_test_stop(sv.pid, PS_TEST_RPC_MS);
    return rc || st ? -1 : 0;
}

static int restore_with(const char *dir, const char *decay, ps_test_server *sv)
{
    char words[1024];
    snprintf(words, sizeof words, "--num-workers 1 --mode async --lr 0.5 %s --checkpoint-dir %s "
             "--checkpoint-every 1 --restore", decay, dir);
    if (ps_test_server_start(sv, 1, words))
        return -1;
    return ps_test_wait(sv->pid, 10000);
}

PS_TEST(restore_with_another_lr_decay_is_refused_naming_both_values)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/decay-ck", ps_test_tmpdir());
    CHECK_OK(make_checkpoint(dir, "--lr-decay 0.5 --lr-decay-every 10"));
    ps_test_server sv;
    CHECK_EQ_INT(restore_with(dir, "--lr-decay 0.3 --lr-decay-every 10", &sv), 2);
    CHECK_MSG(ps_test_file_has(sv.log, "it was written with --lr-decay 0.5, this server has "
                                       "--lr-decay 0.3"),
              "no clear refusal in %s", sv.log);
    CHECK_EQ_INT(restore_with(dir, "--lr-decay 0.5 --lr-decay-every 20", &sv), 2);
    CHECK_MSG(ps_test_file_has(sv.log, "it was written with --lr-decay-every 10, this server "
                                       "has --lr-decay-every 20"),
              "no clear refusal in %s", sv.log);
    CHECK_EQ_INT(restore_with(dir, "", &sv), 2); /* the defaults differ too */
    CHECK_MSG(ps_test_file_has(sv.log, "--lr-decay 0.5, this server has --lr-decay 1"),
              "no clear refusal in %s", sv.log);
    /* the same settings restore */
    char words[1024];
    snprintf(words, sizeof words, "--num-workers 1 --mode async --lr 0.5 --lr-decay 0.5 "
             "--lr-decay-every 10 --checkpoint-dir %s --checkpoint-every 1 --restore", dir);
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    CHECK_OK(ps_test_wait_for_text(sv.log, "listening", PS_TEST_RPC_MS, sv.pid));
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    CHECK_MSG(ps_test_file_has(sv.log, "restored "), "no restore in %s", sv.log);
}
