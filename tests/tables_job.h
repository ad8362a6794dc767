/* A job for the table tests: S bin/ps_server processes on free ports and W
 * libps clients in this process (one per worker rank), each with one table
 * registered.  Header-only (static inline) so the table tests share it
 * without a Makefile rule of its own. */
#ifndef TABLES_JOB_H
#define TABLES_JOB_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ps_client.h"
#include "ps_test.h"

#define TJ_MAX 4
#define TJ_WAIT_MS 10000

typedef struct tj_job {
    int S, W;
    int pid[TJ_MAX], port[TJ_MAX];
    char log[TJ_MAX][512];
    char flags[1024];     /* every server's flags besides --bind, --rank and the counts */
    char eps[512];
    ps_client *c[TJ_MAX];
    uint64_t table;
    ps_table_options topt;
    int mode;
    int max_staleness;    /* async: -1 (default) or k */
    int wire_dtype;       /* the clients' (0: float32) */
    int on_nonfinite;     /* the clients' (0: refuse, the default) */
    int no_shm;           /* the clients' options.shm 0: everything over the network */
} tj_job;

static inline int tj_have_server(void)
{
    char bin[256];
    return access(ps_test_bin("ps_server", bin, sizeof bin), X_OK) == 0;
}

#define TJ_NEED_SERVER()                                                                    \
    do {                                                                                    \
        if (!tj_have_server())                                                              \
            SKIP("bin/ps_server is not built");                                             \
    } while (0)

/* Wait for r at most TJ_WAIT_MS: its status, or PS_ETIMEDOUT (with a line
 * on stderr) when it is still pending. */
static inline int tj_wait(ps_request *r)
{
    int st = ps_request_wait_for(r, TJ_WAIT_MS);
    if (st < 0) {
        fprintf(stderr, "a request did not complete within %d ms\n", TJ_WAIT_MS);
        snprintf(r->err, sizeof r->err, "(still pending after %d ms)", TJ_WAIT_MS);
        return PS_ETIMEDOUT;
    }
    return st;
}

/* Start server k of j (again: on its port), with `more` flags after j's. */
static inline int tj_server(tj_job *j, int k, const char *more)
{
    static int count;
    char words[2048];
    snprintf(words, sizeof words, "--bind tcp://127.0.0.1:%d --rank %d --num-servers %d "
             "--num-workers %d %s %s", j->port[k], k, j->S, j->W, j->flags, more);
    snprintf(j->log[k], sizeof j->log[k], "%s/tserver%d-%d.log", ps_test_tmpdir(), k, count++);
    j->pid[k] = ps_test_spawn_words("ps_server", words, j->log[k]);
    return j->pid[k] > 0 ? 0 : -1;
}

/* Open worker r's client (its table registered with j->topt) and start it. */
static inline int tj_client(tj_job *j, int r)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = j->eps;
    o.rank = r;
    o.num_workers = j->W;
    o.mode = j->mode;
    o.max_staleness = j->mode == PS_MODE_ASYNC ? j->max_staleness : 0;
    o.hello_timeout_ms = TJ_WAIT_MS;
    o.request_timeout_ms = 2000;
    o.on_nonfinite = j->on_nonfinite;
    o.shm = !j->no_shm;
    int rc = ps_client_open(&o, &j->c[r]);
    if (rc) {
        fprintf(stderr, "open: %s\n", ps_client_last_error(NULL));
        return rc;
    }
    if ((j->wire_dtype && (rc = ps_client_set_wire_dtype(j->c[r], j->wire_dtype)) != 0) ||
        (rc = ps_client_register_table(j->c[r], j->table, &j->topt)) != 0 ||
        (rc = ps_client_start(j->c[r])) != 0) {
        fprintf(stderr, "worker %d: %s\n", r, ps_client_last_error(j->c[r]));
        ps_client_close(j->c[r]);
        j->c[r] = NULL;
    }
    return rc;
}

/* S servers with `flags` (which name --mode), W workers, table 7 of dim
 * `dim` with the initializer `init` (scale 0.25, seed 11) and the servers'
 * optimizer given in flags (sgd unless they say otherwise); j->topt may be
 * changed between tj_prepare and tj_connect. */
static inline int tj_prepare(tj_job *j, int S, int W, const char *flags, uint32_t dim, int init)
{
    memset(j, 0, sizeof *j);
    j->S = S;
    j->W = W;
    snprintf(j->flags, sizeof j->flags, "%s", flags);
    j->mode = strstr(flags, "--mode async") ? PS_MODE_ASYNC : PS_MODE_SYNC;
    const char *k = strstr(flags, "--max-staleness ");
    j->max_staleness = k ? atoi(k + 16) : -1;
    j->table = 7;
    ps_table_options_default(&j->topt);
    j->topt.dim = dim;
    j->topt.init = init;
    j->topt.init_scale = 0.25f;
    j->topt.seed = 11;
    j->topt.opt.kind = PS_OPT_SGD;
    j->topt.opt.lr = 0.1f;
    size_t off = 0;
    for (int k = 0; k < S; k++) {
        j->port[k] = ps_test_free_port();
        off += (size_t)snprintf(j->eps + off, sizeof j->eps - off, "%stcp://127.0.0.1:%d",
                                k ? "," : "", j->port[k]);
    }
    for (int k = 0; k < S; k++)
        if (tj_server(j, k, ""))
            return -1;
    return 0;
}

static inline int tj_connect(tj_job *j)
{
    for (int r = 0; r < j->W; r++) {
        int rc = tj_client(j, r);
        if (rc)
            return rc;
    }
    return 0;
}

static inline int tj_start(tj_job *j, int S, int W, const char *flags, uint32_t dim, int init)
{
    int rc = tj_prepare(j, S, W, flags, dim, init);
    return rc ? rc : tj_connect(j);
}

/* Close the clients, stop the servers: 0 when every server exited 0. */
static inline int tj_stop(tj_job *j)
{
    for (int r = 0; r < j->W; r++) {
        ps_client_close(j->c[r]);
        j->c[r] = NULL;
    }
    int bad = 0;
    for (int k = 0; k < j->S; k++)
        if (j->pid[k] > 0) {
            int st = ps_test_stop(j->pid[k], 5000);
            if (st != 0) {
                fprintf(stderr, "server %d exited %d (log %s)\n", k, st, j->log[k]);
                bad = 1;
            }
            j->pid[k] = 0;
        }
    return bad;
}

#endif
