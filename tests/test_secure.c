/* ps_server --curve-keys end to end, with keys from bin/ps_keygen and real
 * bin/ps_worker processes: a listed worker trains; a worker holding a key
 * that is not in authorized/ and a plaintext worker are refused at the
 * handshake (they give up at hello with a clear error and exit non-zero), the
 * server logs both refusals, and they never reach the protocol: the pushes the
 * server counted are exactly the listed worker's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "ps_test.h"

#define RUN_MS 120000

/* The number after `key` in the last line of path that contains `line`. */
static long long number_after(const char *path, const char *line, const char *key)
{
    char *t = ps_test_read_file(path, NULL);
    long long v = -1;
    for (char *p = t; p && (p = strstr(p, line)); p++) {
        char *q = strstr(p, key);
        if (q)
            v = strtoll(q + strlen(key), NULL, 10);
    }
    free(t);
    return v;
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
    char *t = ps_test_read_file(from, NULL);
    FILE *f = t ? fopen(to, "w") : NULL;
    int ok = f && fputs(t, f) >= 0;
    if (f)
        fclose(f);
    free(t);
    return ok && chmod(to, mode) == 0 ? 0 : -1;
}

PS_TEST(only_listed_workers_train_over_curve_and_refusals_are_logged)
{
    if (!zmq_has("curve"))
        SKIP("libzmq without CURVE");
    char keys[512], other[512], bad[512], words[2048], path[700], to[700];
    const char *tmp = ps_test_tmpdir();
    snprintf(keys, sizeof keys, "%s/keys", tmp);
    snprintf(other, sizeof other, "%s/other-keys", tmp);
    snprintf(bad, sizeof bad, "%s/unlisted", tmp);
    char log[512];
    snprintf(log, sizeof log, "%s/keygen.log", tmp);
    snprintf(words, sizeof words, "--dir %s --servers 1 --workers 1", keys);
    CHECK_EQ_INT(ps_test_wait(ps_test_spawn_words("ps_keygen", words, log), 10000), 0);
    snprintf(words, sizeof words, "--dir %s --servers 1 --workers 1", other);
    CHECK_EQ_INT(ps_test_wait(ps_test_spawn_words("ps_keygen", words, log), 10000), 0);
    /* the unlisted worker has the real server's public key but its own pair,
     * which is not in keys/authorized */
    CHECK(mkdir(bad, 0700) == 0);
    snprintf(path, sizeof path, "%s/server-0.pub", keys);
    snprintf(to, sizeof to, "%s/server-0.pub", bad);
    CHECK_OK(copy_file(path, to, 0644));
    snprintf(path, sizeof path, "%s/worker-0.pub", other);
    snprintf(to, sizeof to, "%s/worker-0.pub", bad);
    CHECK_OK(copy_file(path, to, 0644));
    snprintf(path, sizeof path, "%s/worker-0.key", other);
    snprintf(to, sizeof to, "%s/worker-0.key", bad);
    CHECK_OK(copy_file(path, to, 0600));

    int port = ps_test_free_port();
    char slog[512], glog[512], blog[512], plog[512];
    snprintf(slog, sizeof slog, "%s/server.log", tmp);
    snprintf(glog, sizeof glog, "%s/listed.log", tmp);
    snprintf(blog, sizeof blog, "%s/unlisted.log", tmp);
    snprintf(plog, sizeof plog, "%s/plaintext.log", tmp);
    snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --num-workers 1 --mode async "
             "--lr 0.1 --curve-keys %s", port, keys);
    int srv = ps_test_spawn_words("ps_server", words, slog);
    CHECK(srv > 0);
    enum { STEPS = 40 };
    char common[512];
    snprintf(common, sizeof common, "--servers tcp://127.0.0.1:%d --rank 0 --num-workers 1 "
             "--mode async --lr 0.1 --model mlp:784-32-10 --batch 16 --steps %d --epochs 1000 "
             "--data synthetic:512 --log-every 10 --hello-timeout 2000", port, STEPS);
    /* one refused worker at a time, so each refusal line is known to be its */
    int plain = ps_test_spawn_words("ps_worker", common, plog);
    snprintf(words, sizeof words, "%s --curve-keys %s", common, keys);
    int listed = ps_test_spawn_words("ps_worker", words, glog);
    CHECK(plain > 0 && listed > 0);
    int rp = ps_test_wait(plain, RUN_MS);
    CHECK_MSG(rp != 0 && ps_test_file_has(plog, "no hello reply within 2000 ms") &&
                  ps_test_file_has(plog, "give this worker --curve-keys too"),
              "the plaintext worker exited %d without a clear error (%s)", rp, plog);
    CHECK_MSG(ps_test_file_has(slog, "refused a connection on ") &&
                  ps_test_file_has(slog, "CURVE handshake failed: the peer"),
              "no refusal of the plaintext worker in %s", slog);
    snprintf(words, sizeof words, "%s --curve-keys %s", common, bad);
    int unlisted = ps_test_spawn_words("ps_worker", words, blog);
    CHECK(unlisted > 0);
    int ru = ps_test_wait(unlisted, RUN_MS);
    CHECK_MSG(ru != 0 && ps_test_file_has(blog, "no hello reply within 2000 ms") &&
                  ps_test_file_has(blog, "check --curve-keys"),
              "the unlisted worker exited %d without a clear error (%s)", ru, blog);
    CHECK_MSG(ps_test_file_has(slog, "refused CURVE client from 127.0.0.1: key ") &&
                  ps_test_file_has(slog, "/authorized"),
              "no refusal of the unlisted key in %s", slog);
    int rl = ps_test_wait(listed, RUN_MS);
    CHECK_MSG(rl == 0, "the listed worker exited %d (%s)", rl, glog);
    CHECK(ps_test_file_has(glog, "iter 40/40"));
    CHECK_EQ_INT(ps_test_stop(srv, 10000), 0);
    /* and counted only the listed worker: 4 tensors, one push each per step */
    long long pushes = number_after(slog, "stopped:", "stopped: ");
    CHECK_MSG(pushes == STEPS * 4, "the server counted %lld pushes; the listed worker made %d",
              pushes, STEPS * 4);
    CHECK(ps_test_file_has(slog, "1 of 1 workers said hello"));
    long long refused = number_after(slog, "stopped:", "workers said hello, ");
    CHECK_MSG(refused >= 2, "%lld CURVE handshakes refused", refused);
}
