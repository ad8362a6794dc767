/* table_bench: rows per second through the table store (server/table.h)
 * against plain copies of the same rows from a dense array, in the same
 * process, alternating.
 *
 * Each call moves 4096 unique ids drawn from a Zipf(1.05) distribution over
 * --ids distinct ids (hashed: spread over all of uint64); a dense array
 * holds one row per distinct id at a random position (a permutation of the
 * ranks, so hot rows are not packed together).  Per dim (16, 64, 128):
 *   pull     ps_table_pull of the batch (rows exist: a warm-up pulled every batch)
 *   gather   memcpy of the same rows from the dense array into the same buffer
 *   push     ps_table_push of one gradient row per id (async, adagrad)
 *   scatter  memcpy of the gradient rows into the dense rows
 *   dense    adagrad on the dense rows (values and state side by side, as the
 *            store keeps them): the same arithmetic without the hash
 * Rows/s are per second of the thread's CPU time, the best of --rounds
 * rounds of about --time seconds each (the machine is shared and noisy);
 * the ratios set the store against the copies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optimizer.h"
#include "ps_opt_table.h"
#include "table.h"

#include "bench_ids.h"

enum { K_PULL, K_GATHER, K_PUSH, K_SCATTER, K_DENSE, NK };

typedef struct bench {
    size_t nids, d;
    uint64_t ids[NBATCH][BATCH]; /* the batches' ids */
    uint32_t idx[NBATCH][BATCH]; /* their dense rows */
    float *dense;                /* nids rows of 2 * d: values, adagrad state */
    float *buf;                  /* BATCH * d: pulled rows, gradients */
    ps_table *t;
    ps_opt_config opt;
} bench;

static void run(bench *b, int kernel, int k)
{
    size_t d = b->d;
    const uint64_t *ids = b->ids[k];
    const uint32_t *idx = b->idx[k];
    float *buf = b->buf;
    switch (kernel) {
    case K_PULL:
        if (ps_table_pull(b->t, ids, BATCH, buf, BATCH * d, NULL, 0) != 0)
            exit(1);
        break;
    case K_GATHER:
        for (size_t i = 0; i < BATCH; i++)
            memcpy(buf + i * d, b->dense + (size_t)idx[i] * 2 * d, d * sizeof(float));
        break;
    case K_PUSH:
        if (ps_table_push(b->t, ids, BATCH, buf, BATCH * d, 1, NULL, 0) != 0)
            exit(1);
        break;
    case K_SCATTER:
        for (size_t i = 0; i < BATCH; i++)
            memcpy(b->dense + (size_t)idx[i] * 2 * d, buf + i * d, d * sizeof(float));
        break;
    case K_DENSE:
        for (size_t i = 0; i < BATCH; i++) {
            float *w = b->dense + (size_t)idx[i] * 2 * d;
            ps_opt_adagrad(w, w + d, buf + i * d, d, b->opt.lr, b->opt.eps, 0.0f);
        }
        break;
    }
}

/* CPU time of this thread: the figures of a single-threaded loop on a
 * machine whose cores other programs share */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* rows per CPU second of `calls` calls of kernel, cycling through the batches */
static double timed(bench *b, int kernel, int calls)
{
    double t0 = cpu_s();
    for (int c = 0; c < calls; c++)
        run(b, kernel, c % NBATCH);
    return (double)calls * BATCH / (cpu_s() - t0);
}

static void fill_grads(bench *b)
{
    for (size_t i = 0; i < BATCH * b->d; i++)
        b->buf[i] = 1e-3f * (float)((int)(i % 13) - 6);
}

static void usage(void)
{
    fprintf(stderr, "usage: table_bench [--ids N (1048576)] [--rounds R (5)] [--time S (0.1)]\n");
}

int main(int argc, char **argv)
{
    size_t nids = 1u << 20;
    int rounds = 5;
    double tsec = 0.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (!strcmp(a, "--ids"))
            nids = (size_t)atol(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--time"))
            tsec = atof(v);
        else {
            usage();
            return 2;
        }
    }
    if (nids < 2 * BATCH || nids > UINT32_MAX || rounds < 1 || tsec <= 0) {
        usage();
        return 2;
    }
    static bench b;
    b.nids = nids;
    bench_make_batches(nids, 1.05, 12345, b.ids, b.idx);
    fprintf(stderr, "table_bench: %d batches of %d unique ids, Zipf 1.05 over %zu ids; best of "
            "%d rounds of ~%.2f s\n", NBATCH, BATCH, nids, rounds, tsec);
    printf("| dim | rows in store | pull rows/s | gather rows/s | pull / gather | push rows/s "
           "| scatter rows/s | push / scatter | dense adagrad rows/s | push / dense |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const size_t dims[3] = {16, 64, 128};
    for (int di = 0; di < 3; di++) {
        size_t d = dims[di];
        b.d = d;
        b.dense = malloc(nids * 2 * d * sizeof(float));
        b.buf = malloc(BATCH * d * sizeof(float));
        if (!b.dense || !b.buf) {
            fprintf(stderr, "table_bench: out of memory for dim %zu\n", d);
            return 1;
        }
        for (size_t i = 0; i < nids * 2 * d; i++)
            b.dense[i] = (i / d) % 2 ? 0.0f : 1e-2f; /* values, then zero state */
        ps_table_config c;
        memset(&c, 0, sizeof c);
        c.table = 1;
        c.dim = (uint32_t)d;
        c.init = PS_TABLE_INIT_UNIFORM;
        c.init_scale = 0.01f;
        ps_opt_default(&c.opt);
        c.opt.kind = PS_OPT_ADAGRAD;
        c.max_memory = UINT64_MAX;
        c.guard = getenv("NOGUARD") ? 0 : 1; /* as a server checks them (--on-nonfinite refuse) */
        char why[256];
        if (ps_table_create(&c, &b.t, why, sizeof why) != 0) {
            fprintf(stderr, "table_bench: %s\n", why);
            return 1;
        }
        b.opt = c.opt;
        for (int k = 0; k < NBATCH; k++) /* every row exists from here on */
            run(&b, K_PULL, k);
        int calls[NK];
        double best[NK] = {0};
        for (int k = 0; k < NK; k++) { /* calibrate: calls for ~tsec */
            if (k == K_PUSH || k == K_DENSE || k == K_SCATTER)
                fill_grads(&b);
            double rps = timed(&b, k, NBATCH);
            calls[k] = (int)(tsec * rps / BATCH);
            if (calls[k] < NBATCH)
                calls[k] = NBATCH;
        }
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < NK; k++) {
                if (k == K_PUSH || k == K_DENSE || k == K_SCATTER)
                    fill_grads(&b);
                double rps = timed(&b, k, calls[k]);
                if (rps > best[k])
                    best[k] = rps;
            }
        ps_table_counts st;
        ps_table_stats(b.t, &st);
        printf("| %zu | %llu | %.3g | %.3g | %.2f | %.3g | %.3g | %.2f | %.3g | %.2f |\n", d,
               (unsigned long long)st.rows, best[K_PULL], best[K_GATHER],
               best[K_PULL] / best[K_GATHER], best[K_PUSH], best[K_SCATTER],
               best[K_PUSH] / best[K_SCATTER], best[K_DENSE], best[K_PUSH] / best[K_DENSE]);
        fflush(stdout);
        ps_table_destroy(b.t);
        free(b.dense);
        free(b.buf);
    }
    return 0;
}
