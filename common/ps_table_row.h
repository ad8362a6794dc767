/* What every process computes of one row of an embedding table from its
 * (table, id) alone (DESIGN.md "Tables"): its first values, the same on
 * every server, in every run and after every restart, in libps's and the
 * local tables' hands too; and its place, which server and which of that
 * server's partitions hold it.  Pure functions, no state.
 *
 * With uint64 arithmetic modulo 2^64 (numpy: uint64 arrays; python/ps's
 * table_init.py is this file in numpy, checked bit for bit by
 * tests/test_table.c) and
 *   mix(x) = x ^= x >> 30; x *= 0xbf58476d1ce4e5b9; x ^= x >> 27;
 *            x *= 0x94d049bb133111eb; x ^= x >> 31
 *   G      = 0x9e3779b97f4a7c15
 *   sm(x)  = mix(x + G)                   (one SplitMix64 output)
 *
 * Initializer (seed, table, id, element index i):
 *   k      = sm(sm(sm(seed) ^ table) ^ id)
 *   r(j)   = sm(k + j * G)                (j = 0, 1, ...: SplitMix64 seeded with k)
 * the row's element i is
 *   zeros     0
 *   uniform   a * f, f = (float)((int64)(r(i) >> 40) - 2^23) * 2^-23 (exact
 *             in float32), the product in float32: in [-a, a); bit for bit
 *             in numpy (np.float32(a) * np.float32(f))
 *   normal    (float)((double)s * z), z = sqrt(-2 ln u1) * cos(2 pi u2) in
 *             double, u1 = ((r(2i) >> 11) + 1) * 2^-53 in (0, 1],
 *             u2 = (r(2i+1) >> 11) * 2^-53 in [0, 1), 2 pi = 6.283185307179586
 *             (Box-Muller, the cosine half): equal to numpy's up to the last
 *             bit of its log and cos (nearly always bit for bit after the
 *             rounding to float32).
 *
 * Place (docs/PROTOCOL.md "Tables"): with S servers, and P partitions on the
 * server the row is on (that server's update threads, told in its hello
 * reply),
 *   h         = sm(sm(table ^ 0x7461626c652d726f) ^ id)   ("table-ro")
 *   server    = h mod S
 *   partition = (h / S) mod P
 * Rows spread by a hash of (table, id), not by ranges, so hot ids of a
 * skewed (Zipf) distribution land anywhere; the server's own hash of an id
 * inside a partition is another function of it. */
#ifndef PS_TABLE_ROW_H
#define PS_TABLE_ROW_H

#include <stddef.h>
#include <stdint.h>

#include "ps_types.h"

/* mix(x) above */
static inline uint64_t ps_table_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The first values of row id of table `table`: dim floats into out.
 * kind: enum ps_table_init (ps_types.h; anything else gives zeros); scale:
 * uniform's a, normal's s. */
void ps_table_init_row(uint64_t seed, uint64_t table, uint64_t id, int kind, float scale,
                       uint32_t dim, float *out);

/* Row-wise adagrad (PS_TABLE_OPT_ROWWISE_ADAGRAD, ps_types.h has the
 * formula, FBGEMM's EXACT_ROWWISE_ADAGRAD) on one row of d values w with its
 * state float *m, gradient row g: the servers' tables and ps_worker's local
 * tables. */
void ps_table_rowwise_adagrad(float *restrict w, float *restrict m, const float *restrict g,
                              size_t d, float lr, float eps, float wd);
/* The same, its results checked with guard (the servers' --on-nonfinite
 * refuse and skip): when the state or any new value would not be finite,
 * the row and its state keep their old values and d is returned (the
 * values kept); else 0, the row updated exactly as without guard. */
size_t ps_table_rowwise_adagrad_checked(float *restrict w, float *restrict m,
                                        const float *restrict g, size_t d, float lr, float eps,
                                        float wd, int guard);

/* h above. */
uint64_t ps_table_row_hash(uint64_t table, uint64_t id);

/* The server (0 .. nservers-1) of a row of hash h. */
static inline int ps_table_row_server(uint64_t h, int nservers)
{
    return (int)(h % (uint64_t)nservers);
}

/* Its partition there (0 .. nparts-1). */
static inline uint32_t ps_table_row_part(uint64_t h, int nservers, uint32_t nparts)
{
    return (uint32_t)((h / (uint64_t)nservers) % nparts);
}

/* The first of ids[0..n-1] that is not a row of partition `part` of server
 * `server` (of nservers, nparts each) of table `table`: its index, or n when
 * every id is.  A server checks each id of a table request against the
 * partition it was sent to (docs/PROTOCOL.md "Tables"). */
size_t ps_table_row_misplaced(uint64_t table, const uint64_t *ids, size_t n, int server,
                              int nservers, uint32_t part, uint32_t nparts);

#endif
