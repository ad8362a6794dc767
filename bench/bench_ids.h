/* The id batches of the table benchmarks (table_bench, sparse_bench):
 * NBATCH batches of BATCH distinct ids each, drawn from a Zipf(s)
 * distribution over `n` distinct ids, each a hashed feature id (spread over
 * all of uint64), with its place in a dense array of n rows (a permutation
 * of the ranks, so hot rows are not packed together).  Header-only (static)
 * so each bench program has it without a Makefile rule of its own. */
#ifndef BENCH_IDS_H
#define BENCH_IDS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BATCH 4096
#define NBATCH 32

/* xorshift64*: the bench's random numbers (ranks, the permutation, ids) */
static inline uint64_t bench_rnd(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545f4914f6cdd1dull;
}

/* ids[k][i] and idx[k][i] (its dense row) of batch k < NBATCH, by inverse
 * CDF of the ranks' weights r^-s.  Exits on out of memory. */
static inline void bench_make_batches(size_t n, double s, uint64_t seed,
                                      uint64_t (*ids)[BATCH], uint32_t (*idx)[BATCH])
{
    double *cdf = malloc(n * sizeof *cdf);
    uint32_t *perm = malloc(n * sizeof *perm);
    uint8_t *seen = calloc(n, 1);
    if (!cdf || !perm || !seen) {
        fprintf(stderr, "bench: out of memory for %zu ids\n", n);
        exit(1);
    }
    double acc = 0;
    for (size_t r = 0; r < n; r++)
        cdf[r] = acc += 1.0 / pow((double)(r + 1), s);
    for (size_t r = 0; r < n; r++)
        perm[r] = (uint32_t)r;
    uint64_t x = seed;
    for (size_t r = n - 1; r > 0; r--) { /* Fisher-Yates */
        size_t j = (size_t)(bench_rnd(&x) % (r + 1));
        uint32_t tmp = perm[r];
        perm[r] = perm[j];
        perm[j] = tmp;
    }
    for (int k = 0; k < NBATCH; k++) {
        size_t got = 0;
        while (got < BATCH) {
            double u = (double)(bench_rnd(&x) >> 11) * 0x1p-53 * acc;
            size_t lo = 0, hi = n - 1;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (cdf[mid] < u)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (seen[lo] == k + 1)
                continue;
            seen[lo] = (uint8_t)(k + 1);
            ids[k][got] = (lo + 1) * 0x9e3779b97f4a7c15ull; /* a hashed feature id: distinct */
            idx[k][got] = perm[lo];
            got++;
        }
    }
    free(cdf);
    free(perm);
    free(seen);
}

#endif
