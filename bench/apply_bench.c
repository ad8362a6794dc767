/* apply_bench: throughput of the server's optimizer kernels (server/optimizer.h)
 * on arrays that do not fit in any cache, against memcpy and a STREAM triad
 * measured in the same run with the same threads.
 *
 * Each thread owns a disjoint slice of every array, as the server's update
 * threads own disjoint chunks.  GB/s counts every array read and every array
 * written once per element (bytes touched / time):
 *   memcpy  a = b               2 arrays
 *   triad   a = b + s*c         3 arrays
 *   sgd     w -= lr*g           3 (w read, w written, g read)
 *   momentum                    5 (w, v read and written; g read)
 *   adam                        7 (w, m, v read and written; g read)
 *   nonfinite                   1 (g read: the server's NaN/Inf check of a
 *                                 pushed gradient, ps_dtype_nonfinite, a pass
 *                                 of its own before the optimizer's)
 *   sgd+check, adam+check       3, 7: what the server does with a pushed
 *                                 chunk (4 MiB, the default chunk size): the
 *                                 check, then the optimizer with its results
 *                                 checked (ps_opt_*_checked), chunk by chunk
 * Rounds alternate the kernels; the best of each is kept (the machine is
 * shared and noisy).  The triad's destination is written without being read,
 * so the hardware also reads it (write-allocate) without our counting it;
 * memcpy in glibc may use non-temporal stores at these sizes and avoid that. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "ps_dtype.h"
#include "ps_time.h"

enum { K_MEMCPY, K_TRIAD, K_SGD, K_MOMENTUM, K_ADAM, K_NONFINITE, K_SGD_CHECKED, K_ADAM_CHECKED,
       NK };
static const char *kname[NK] = {"memcpy", "triad", "sgd", "momentum", "adam", "nonfinite",
                                "sgd+check", "adam+check"};
static const int karrays[NK] = {2, 3, 3, 5, 7, 1, 3, 7};
#define CHUNK_FLOATS ((size_t)1 << 20) /* 4 MiB */

#define MAX_THREADS 8

typedef struct shared {
    float *w, *m, *v, *g;
    size_t n;
    int nthreads;
    int kernel;
    int reps;
    int64_t step;
    int quit;
    _Atomic size_t found; /* non-finite values the check found (none) */
    pthread_barrier_t start, end;
} shared;

typedef struct worker {
    shared *s;
    int idx;
    pthread_t tid;
} worker;

__attribute__((noinline)) static void triad(float *restrict a, const float *restrict b,
                                            const float *restrict c, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

static void run_slice(shared *s, int idx)
{
    size_t per = (s->n / (size_t)s->nthreads) & ~(size_t)15;
    size_t lo = per * (size_t)idx, hi = idx == s->nthreads - 1 ? s->n : lo + per, n = hi - lo;
    float *w = s->w + lo, *m = s->m + lo, *v = s->v + lo, *g = s->g + lo;
    for (int r = 0; r < s->reps; r++) {
        switch (s->kernel) {
        case K_MEMCPY: memcpy(w, g, n * sizeof(float)); break;
        case K_TRIAD: triad(w, m, g, n, 1e-3f); break;
        case K_SGD: ps_opt_sgd(w, g, n, 1e-3f, 0.0f); break;
        case K_MOMENTUM: ps_opt_momentum(w, m, g, n, 1e-3f, 0.9f, 0.0f); break;
        case K_ADAM:
            ps_opt_adam(w, m, v, g, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, s->step + r + 1);
            break;
        case K_NONFINITE: /* g is finite: the count is 0, kept so the pass is not dropped */
            s->found += ps_dtype_nonfinite(PS_DTYPE_F32, g, n, NULL);
            break;
        case K_SGD_CHECKED:
        case K_ADAM_CHECKED:
            for (size_t at = 0; at < n; at += CHUNK_FLOATS) {
                size_t c = n - at < CHUNK_FLOATS ? n - at : CHUNK_FLOATS;
                s->found += ps_dtype_nonfinite(PS_DTYPE_F32, g + at, c, NULL);
                /* and the results checked, as the server applies them
                 * (--on-nonfinite refuse) */
                if (s->kernel == K_SGD_CHECKED)
                    s->found += ps_opt_sgd_checked(w + at, g + at, c, 1e-3f, 0.0f, 1);
                else
                    s->found += ps_opt_adam_checked(w + at, m + at, v + at, g + at, c, 1e-3f,
                                                    0.9f, 0.999f, 1e-8f, 0.0f,
                                                    s->step + r + 1, 1);
            }
            break;
        }
    }
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    shared *s = wk->s;
    for (;;) {
        pthread_barrier_wait(&s->start);
        if (s->quit)
            break;
        run_slice(s, wk->idx);
        pthread_barrier_wait(&s->end);
    }
    return NULL;
}

/* Run `reps` passes of kernel k over the whole arrays; seconds. */
static double timed(shared *s, int k, int reps)
{
    s->kernel = k;
    s->reps = reps;
    int64_t t0 = ps_now_ns();
    pthread_barrier_wait(&s->start);
    run_slice(s, 0); /* the calling thread is thread 0 */
    pthread_barrier_wait(&s->end);
    double dt = (double)(ps_now_ns() - t0) * 1e-9;
    s->step += reps;
    return dt;
}

static void usage(void)
{
    fprintf(stderr, "usage: apply_bench [--mib-per-array M (64)] [--rounds R (5)] [--time S (0.15)]\n"
                    "                   [--threads 1,2]\n");
}

int main(int argc, char **argv)
{
    size_t mib = 64;
    int rounds = 5;
    double tsec = 0.15;
    int tlist[MAX_THREADS] = {1, 2}, nt = 2;
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
        if (!strcmp(a, "--mib-per-array"))
            mib = (size_t)atol(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--time"))
            tsec = atof(v);
        else if (!strcmp(a, "--threads")) {
            nt = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && nt < MAX_THREADS;
                 t = strtok_r(NULL, ",", &save))
                tlist[nt++] = atoi(t);
            free(dup);
        } else {
            usage();
            return 2;
        }
    }
    if (mib < 1 || rounds < 1 || tsec <= 0 || nt < 1) {
        usage();
        return 2;
    }
    for (int i = 0; i < nt; i++)
        if (tlist[i] < 1 || tlist[i] > MAX_THREADS) {
            usage();
            return 2;
        }
    shared s;
    memset(&s, 0, sizeof s);
    s.n = mib * (1u << 20) / sizeof(float);
    size_t bytes = s.n * sizeof(float);
    float **arr[4] = {&s.w, &s.m, &s.v, &s.g};
    for (int a = 0; a < 4; a++) {
        if (posix_memalign((void **)arr[a], 4096, bytes)) {
            fprintf(stderr, "apply_bench: out of memory for 4 x %zu MiB\n", mib);
            return 1;
        }
        for (size_t i = 0; i < s.n; i++) /* finite, small, positive: no denormals, no NaN */
            (*arr[a])[i] = a == 2 ? 1e-4f : 1e-3f * (float)(1 + (i & 7));
    }
    fprintf(stderr, "apply_bench: %zu MiB per array, best of %d rounds of ~%.2f s\n", mib, rounds,
            tsec);
    double best[MAX_THREADS][NK];
    memset(best, 0, sizeof best);
    for (int ti = 0; ti < nt; ti++) {
        int T = tlist[ti];
        s.nthreads = T;
        s.quit = 0;
        pthread_barrier_init(&s.start, NULL, (unsigned)T);
        pthread_barrier_init(&s.end, NULL, (unsigned)T);
        worker wk[MAX_THREADS];
        for (int i = 1; i < T; i++) {
            wk[i].s = &s;
            wk[i].idx = i;
            pthread_create(&wk[i].tid, NULL, worker_main, &wk[i]);
        }
        int reps[NK];
        for (int k = 0; k < NK; k++) { /* calibrate: passes for ~tsec */
            double dt = timed(&s, k, 1);
            reps[k] = dt > 0 ? (int)(tsec / dt) : 1;
            if (reps[k] < 2)
                reps[k] = 2;
        }
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < NK; k++) {
                double dt = timed(&s, k, reps[k]);
                double gbs = (double)karrays[k] * (double)bytes * reps[k] / dt / 1e9;
                if (gbs > best[ti][k])
                    best[ti][k] = gbs;
            }
        s.quit = 1;
        pthread_barrier_wait(&s.start);
        for (int i = 1; i < T; i++)
            pthread_join(wk[i].tid, NULL);
        pthread_barrier_destroy(&s.start);
        pthread_barrier_destroy(&s.end);
    }
    printf("| kernel | threads | arrays touched | GB/s | / triad | / memcpy |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
    int goal_rows = 0, goal_met = 0;
    double worst = 1e9;
    for (int ti = 0; ti < nt; ti++)
        for (int k = 0; k < NK; k++) {
            double rt = best[ti][k] / best[ti][K_TRIAD], rm = best[ti][k] / best[ti][K_MEMCPY];
            int goal = k == K_SGD || k == K_ADAM;
            if (goal) {
                goal_rows++;
                goal_met += rt >= 0.8;
                if (rt < worst)
                    worst = rt;
            }
            printf("| %s | %d | %d | %.2f | %.2f%s | %.2f |\n", kname[k], tlist[ti], karrays[k],
                   best[ti][k], rt, goal ? (rt >= 0.8 ? " (goal met)" : " (**goal missed**)") : "",
                   rm);
        }
    printf("\nGOAL apply: sgd and adam at >= 0.8 of triad GB/s: %s (%d of %d rows; lowest %.2f)\n",
           goal_met == goal_rows ? "MET" : "MISSED", goal_met, goal_rows, worst);
    for (int a = 0; a < 4; a++)
        free(*arr[a]);
    return 0;
}
