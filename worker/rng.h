/* The portable RNG that weight init (model.c) and the data order and
 * synthetic data (data.c) draw from: xoshiro256** seeded through splitmix64,
 * uniform doubles from the top 53 bits, normals by the Marsaglia polar method
 * with our own log (only +,-,*,/ and sqrt, which IEEE-754 rounds exactly), so
 * a seed gives the same stream, bit for bit, on every machine and libm.
 *
 * A ps_rng is a plain value owned by its caller; no global state, so any
 * number of independent streams may run on any threads. */
#ifndef PS_RNG_H
#define PS_RNG_H

#include <stdint.h>

typedef struct ps_rng {
    uint64_t s[4];
    double spare; /* second normal of the last polar pair */
    int has_spare;
} ps_rng;

/* splitmix64 step: mixes *state and advances it; also a good 64-bit hash. */
uint64_t ps_splitmix64(uint64_t *state);
void ps_rng_seed(ps_rng *r, uint64_t seed);
uint64_t ps_rng_next(ps_rng *r);
/* uniform in [0, 1) */
double ps_rng_uniform(ps_rng *r);
/* uniform integer in [0, n), unbiased; n > 0 */
uint64_t ps_rng_below(ps_rng *r, uint64_t n);
/* standard normal */
double ps_rng_normal(ps_rng *r);

/* Natural log of x > 0 and e^x from frexp/ldexp (exact) and series in +, -,
 * *, / only, so the result is the same on every IEEE-754 machine, unlike
 * libm's, which may differ in the last bit between libraries.  (-std=c11
 * keeps gcc from contracting a*b+c into an FMA, which would change
 * rounding.)  Accurate to a few ulp, which is all init and synthetic data
 * need; python/ps/data_ctr.py repeats them operation for operation. */
double ps_rng_log(double x);
double ps_rng_exp(double x);

/* Counter-based draws, for values that must be a pure function of their
 * coordinates (a synthetic sample's fields, a table row's initial values):
 * mix(mix(mix(seed ^ tag) ^ a) ^ b), mod 2^64, where mix(x) is the output of
 * ps_splitmix64 from state x.  python/ps/data_ctr.py computes the same. */
uint64_t ps_rng_hash(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b);
/* mix(x) itself */
uint64_t ps_rng_mix(uint64_t x);
/* (2 (h >> 12) + 1) / 2^53: uniform in (0, 1) with 1 - u exact as well */
double ps_rng_unit(uint64_t h);

#endif
