#include "rng.h"

#include <math.h>

uint64_t ps_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t ps_rng_mix(uint64_t x)
{
    return ps_splitmix64(&x);
}

uint64_t ps_rng_hash(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b)
{
    return ps_rng_mix(ps_rng_mix(ps_rng_mix(seed ^ tag) ^ a) ^ b);
}

double ps_rng_unit(uint64_t h)
{
    return (double)(2 * (h >> 12) + 1) * 0x1.0p-53;
}

void ps_rng_seed(ps_rng *r, uint64_t seed)
{
    /* splitmix64 spreads any seed (0 included) over the whole state, which
     * xoshiro needs to be non-zero */
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = ps_splitmix64(&st);
    r->spare = 0.0;
    r->has_spare = 0;
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t ps_rng_next(ps_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ps_rng_uniform(ps_rng *r)
{
    return (double)(ps_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t ps_rng_below(ps_rng *r, uint64_t n)
{
    /* reject the low values that would make x % n favour small results */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = ps_rng_next(r);
        if (x >= threshold)
            return x % n;
    }
}

double ps_rng_log(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    } /* now m in [sqrt(1/2), sqrt(2)) so |t| < 0.172 and t^2 < 0.0295 */
    double t = (m - 1.0) / (m + 1.0), t2 = t * t;
    /* ln m = 2 atanh t = 2 (t + t^3/3 + t^5/5 + ...); t2^14 < 1e-21 */
    double sum = 0.0;
    for (int k = 27; k >= 1; k -= 2)
        sum = sum * t2 + 1.0 / k;
    return 2.0 * t * sum + e * 0x1.62e42fefa39efp-1; /* ln 2 */
}

double ps_rng_exp(double x)
{
    /* x = n ln 2 + r with |r| <= ln(2)/2 (up to rounding), so e^x = 2^n e^r
     * and e^r's Taylor series converges fast: r^18/18! < 1e-21 */
    double n = floor(x / 0x1.62e42fefa39efp-1 + 0.5);
    n = n < -1100.0 ? -1100.0 : n > 1100.0 ? 1100.0 : n; /* beyond: 0 or inf anyway */
    double r = x - n * 0x1.62e42fefa39efp-1;
    double p = 1.0;
    for (int k = 17; k >= 1; k--)
        p = 1.0 + r * p / k;
    return ldexp(p, (int)n);
}

double ps_rng_normal(ps_rng *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    /* Marsaglia polar method: needs log and sqrt only (no sin/cos) */
    for (;;) {
        double u = 2.0 * ps_rng_uniform(r) - 1.0, v = 2.0 * ps_rng_uniform(r) - 1.0;
        double s = u * u + v * v;
        if (s >= 1.0 || s == 0.0)
            continue;
        double m = sqrt(-2.0 * ps_rng_log(s) / s);
        r->spare = v * m;
        r->has_spare = 1;
        return u * m;
    }
}
