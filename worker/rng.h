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

#endif
