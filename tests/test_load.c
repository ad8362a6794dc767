/* Load: 16 bin/ps_worker processes against 2 servers in async mode for a
 * bounded time.  Every worker exits 0, no request is lost (the servers'
 * updates are exactly every worker's pushes: steps x chunks x workers), and
 * the servers' peak RSS stays bounded. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

#define WORKERS 16
#define STEPS 100
#define RUN_MS 240000

PS_TEST(sixteen_async_workers_lose_no_request_and_server_memory_stays_bounded)
{
    int port[2], srv[2];
    char words[2048], log[512];
    const char *san = getenv("SAN");
    int sanitized = san && !strcmp(san, "1");
    char *asan_old = getenv("ASAN_OPTIONS") ? strdup(getenv("ASAN_OPTIONS")) : NULL;
    if (sanitized) {
        /* AddressSanitizer keeps up to 256 MiB of freed blocks; the servers
         * free a received chunk per push, so cap that to see their own use */
        char opts[1024];
        snprintf(opts, sizeof opts, "%s%squarantine_size_mb=16", asan_old ? asan_old : "",
                 asan_old && *asan_old ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
    for (int k = 0; k < 2; k++) {
        port[k] = ps_test_free_port();
        snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --rank %d --num-servers 2 "
                 "--num-workers %d --mode async --lr 0.05 --threads 2", port[k], k, WORKERS);
        snprintf(log, sizeof log, "%s/server%d.log", ps_test_tmpdir(), k);
        srv[k] = ps_test_spawn_words("ps_server", words, log);
        CHECK(srv[k] > 0);
    }
    if (asan_old)
        setenv("ASAN_OPTIONS", asan_old, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(asan_old);
    int pid[WORKERS];
    for (int r = 0; r < WORKERS; r++) {
        /* --chunk-size 64K cuts the first layer into chunks on both servers */
        snprintf(words, sizeof words, "--servers tcp://127.0.0.1:%d,tcp://127.0.0.1:%d --rank %d "
                 "--num-workers %d --mode async --lr 0.05 --model mlp:784-32-10 --batch 8 "
                 "--steps %d --epochs 1000 --data synthetic:2048 --log-every 50 "
                 "--chunk-size 64K", port[0], port[1], r, WORKERS, STEPS);
        snprintf(log, sizeof log, "%s/worker%d.log", ps_test_tmpdir(), r);
        pid[r] = ps_test_spawn_words("ps_worker", words, log);
        CHECK(pid[r] > 0);
    }
    int failed = -1, status = 0;
    for (int r = 0; r < WORKERS; r++) {
        int rc = ps_test_wait(pid[r], RUN_MS);
        if (rc != 0 && failed < 0) {
            failed = r;
            status = rc;
        }
    }
    CHECK_MSG(failed < 0, "worker %d exited %d (see %s/worker%d.log)", failed, status,
              ps_test_tmpdir(), failed);
    uint64_t upd = 0, chunks = 0, dup = 0, err = 0;
    long rss[2];
    for (int k = 0; k < 2; k++) {
        ps_stats st;
        CHECK_OK(ps_test_stats(port[k], &st));
        rss[k] = ps_test_status_kb(srv[k], "VmHWM"); /* peak resident set */
        upd += st.updates;
        chunks += st.chunks;
        dup += st.dup_dropped;
        err += st.errors;
        CHECK(st.chunks > 0);
        CHECK_EQ_INT(st.workers_seen, WORKERS);
    }
    for (int k = 0; k < 2; k++)
        CHECK_EQ_INT(ps_test_stop(srv[k], 10000), 0);
    /* every push of every worker applied exactly once */
    CHECK_EQ_INT(upd, (uint64_t)WORKERS * STEPS * chunks);
    CHECK_EQ_INT(err, 0);
    /* the model is ~100 KB; what a server holds beyond it is ZeroMQ's queues
     * (bounded by the high-water marks) and the allocator's; sanitizer
     * builds carry their own shadow memory and quarantine */
    long limit_kb = sanitized ? 512 * 1024 : 64 * 1024;
    CHECK_MSG(rss[0] > 0 && rss[0] < limit_kb && rss[1] > 0 && rss[1] < limit_kb,
              "server peak RSS %ld kB and %ld kB (limit %ld kB)", rss[0], rss[1], limit_kb);
    printf("# %d workers x %d steps x %llu chunks = %llu updates, %llu duplicates dropped; "
           "server peak RSS %ld kB, %ld kB\n",
           WORKERS, STEPS, (unsigned long long)chunks, (unsigned long long)upd,
           (unsigned long long)dup, rss[0], rss[1]);
}
